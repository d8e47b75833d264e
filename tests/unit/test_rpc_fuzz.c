/* tests/unit/test_rpc_fuzz.c: a deterministic mutation fuzzer for proto/rpc and proto/json.
 *
 * Valid frames are mutated with a fixed-seed PRNG (bit flips, interesting bytes, forged
 * length fields, truncation, duplication, splicing) and run through the scanner (one shot
 * and in random pieces, which must agree), the decoder (on the delimited message and on
 * the raw bytes), the binder, the getters and the JSON conversion. Run under ASan/UBSan it
 * checks that no input crashes, reads out of bounds or leaks; plain, it checks the
 * invariants below. FUZZ_ITERATIONS and FUZZ_SEED in the environment override the
 * iteration count and the PRNG seed (for longer runs by hand; the test itself is fixed).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "json.h"
#include "rpc.h"

#define MAX_FRAME 4096

static uint64_t rng = 0x9e3779b97f4a7c15ull;

/* splitmix64: small, fast, and the same sequence everywhere */
static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(size_t n)
{
    return n == 0 ? 0 : (size_t)(rnd() % n);
}

typedef struct frame {
    uint8_t b[MAX_FRAME];
    size_t n;
} frame;

#define MAX_SEEDS 16
static frame seeds[MAX_SEEDS];
static size_t nseeds;

static void add_seed(const msgpack_sbuffer *sb)
{
    if (nseeds == MAX_SEEDS || sb->size > MAX_FRAME)
        abort();
    memcpy(seeds[nseeds].b, sb->data, sb->size);
    seeds[nseeds].n = sb->size;
    nseeds++;
}

static void build_seeds(void)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    float vec[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1e-3f, -7.25f, 3.0f, 100.0f};

#define BEGIN()                                                                                    \
    msgpack_sbuffer_init(&sb);                                                                     \
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write)
#define END()                                                                                      \
    add_seed(&sb);                                                                                 \
    msgpack_sbuffer_destroy(&sb)

    BEGIN();
    rpc_pack_request_begin(&pk, 1, "ping", false);
    END();

    BEGIN();
    rpc_pack_request_begin(&pk, 77, "memory.add", true);
    msgpack_pack_map(&pk, 9);
    rpc_pack_kv_str(&pk, "content", "the quick brown fox \xe2\x82\xac");
    rpc_pack_kv_uint(&pk, "top_k", 10);
    rpc_pack_cstr(&pk, "embedding");
    rpc_pack_vector(&pk, vec, 8);
    rpc_pack_kv_num(&pk, "weight", 0.75);
    rpc_pack_kv_bool(&pk, "flag", true);
    rpc_pack_kv_int(&pk, "offset", -3);
    rpc_pack_cstr(&pk, "tags");
    msgpack_pack_array(&pk, 3);
    rpc_pack_cstr(&pk, "a");
    rpc_pack_cstr(&pk, "bb");
    rpc_pack_cstr(&pk, "ccc");
    rpc_pack_cstr(&pk, "ids");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_uint64(&pk, UINT64_MAX);
    rpc_pack_cstr(&pk, "meta");
    msgpack_pack_map(&pk, 3);
    rpc_pack_kv_str(&pk, "k", "v");
    rpc_pack_kv_num(&pk, "f", 1.5);
    rpc_pack_cstr(&pk, "nested");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_map(&pk, 1);
    rpc_pack_kv_nil(&pk, "z");
    msgpack_pack_float(&pk, 0.1f);
    END();

    BEGIN();
    rpc_pack_request_begin(&pk, 4000000000u, "memory.search", true);
    msgpack_pack_map(&pk, 4);
    rpc_pack_kv_str(&pk, "content", "q");
    rpc_pack_cstr(&pk, "embedding");
    msgpack_pack_array(&pk, 4);
    msgpack_pack_double(&pk, 0.25);
    msgpack_pack_int64(&pk, -2);
    msgpack_pack_uint64(&pk, 3);
    msgpack_pack_float(&pk, 1.5f);
    rpc_pack_cstr(&pk, "blob");
    msgpack_pack_bin_with_body(&pk, "\x00\x01\x02\x03\x04", 5);
    rpc_pack_cstr(&pk, "any");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_nil(&pk);
    msgpack_pack_map(&pk, 1);
    rpc_pack_kv_str(&pk, "x", "y");
    msgpack_pack_double(&pk, -0.5);
    END();

    BEGIN(); /* a notification */
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint8(&pk, 2);
    rpc_pack_cstr(&pk, "log");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 1);
    rpc_pack_kv_str(&pk, "content", "hello");
    END();

    BEGIN(); /* responses */
    rpc_pack_result_begin(&pk, 9);
    msgpack_pack_map(&pk, 3);
    rpc_pack_kv_uint(&pk, "id", 123);
    rpc_pack_kv_str(&pk, "content", "x");
    rpc_pack_cstr(&pk, "ext");
    msgpack_pack_ext_with_body(&pk, "xy", 2, 3);
    END();

    BEGIN();
    {
        const rpc_detail d[] = {{"limit", RPC_D_UINT, {.u = 5}}, {"f", RPC_D_STR, {.s = "x"}}};
        rpc_pack_error(&pk, 10, RPC_RATE_LIMITED, "slow down", d, 2);
    }
    END();

    BEGIN(); /* wide encodings: str16, bin16, array16, map16 */
    rpc_pack_request_begin(&pk, 65536, "memory.import", true);
    msgpack_pack_map(&pk, 3);
    {
        char text[300];
        memset(text, 'w', sizeof(text));
        rpc_pack_cstr(&pk, "content");
        rpc_pack_strn(&pk, text, sizeof(text));
        rpc_pack_cstr(&pk, "blob");
        msgpack_pack_bin_with_body(&pk, text, 260);
        rpc_pack_cstr(&pk, "ids");
        msgpack_pack_array(&pk, 20);
        for (int i = 0; i < 20; i++)
            msgpack_pack_uint64(&pk, (uint64_t)i << (3 * i));
    }
    END();

    BEGIN(); /* deep nesting inside a free-form value */
    rpc_pack_request_begin(&pk, 5, "deep", true);
    msgpack_pack_map(&pk, 2);
    rpc_pack_kv_str(&pk, "content", "d");
    rpc_pack_cstr(&pk, "any");
    for (int i = 0; i < 27; i++)
        msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 0);
    END();
#undef BEGIN
#undef END
}

static const uint8_t interesting[] = {
    0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3,
    0xc4, 0xc6, 0xc7, 0xc9, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3, 0xd4, 0xd8, 0xd9,
    0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff, 0xed, 0xf4, 0xf5, 0x3f, 0x7f,
};

static uint32_t interesting_len(void)
{
    static const uint32_t v[] = {0,          1,          2,          3,          4,
                                 7,          0x7f,       0x80,       0xff,       0x100,
                                 0xffff,     0x10000,    0x7fffffff, 0x80000000, 0xfffffffe,
                                 0xffffffff, 0x00ffffff, 0x01000000, 0x00400000};
    if (below(4) == 0)
        return (uint32_t)rnd();
    return v[below(sizeof(v) / sizeof(v[0]))];
}

static void insert(frame *f, size_t at, const uint8_t *p, size_t n)
{
    if (f->n + n > MAX_FRAME)
        n = MAX_FRAME - f->n;
    memmove(f->b + at + n, f->b + at, f->n - at);
    memcpy(f->b + at, p, n);
    f->n += n;
}

static void mutate(frame *f)
{
    size_t at = below(f->n + 1);

    switch (below(10)) {
    case 0: /* bit flip */
        if (f->n > 0)
            f->b[below(f->n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* interesting byte */
        if (f->n > 0)
            f->b[below(f->n)] = interesting[below(sizeof(interesting))];
        break;
    case 2: /* random byte */
        if (f->n > 0)
            f->b[below(f->n)] = (uint8_t)rnd();
        break;
    case 3: /* truncate */
        f->n = below(f->n + 1);
        break;
    case 4: { /* insert a byte */
        uint8_t c = below(2) ? interesting[below(sizeof(interesting))] : (uint8_t)rnd();
        insert(f, at, &c, 1);
        break;
    }
    case 5: /* delete a range */
        if (at < f->n) {
            size_t n = below(f->n - at) + 1;
            memmove(f->b + at, f->b + at + n, f->n - at - n);
            f->n -= n;
        }
        break;
    case 6: { /* duplicate a range */
        uint8_t tmp[MAX_FRAME];
        size_t from = below(f->n + 1), n = below(f->n - from + 1);
        if (n > 64)
            n = below(64) + 1;
        if (n > f->n - from)
            n = f->n - from;
        memcpy(tmp, f->b + from, n);
        insert(f, at, tmp, n);
        break;
    }
    case 7: { /* overwrite with a forged length or count header */
        static const uint8_t wide[] = {0xdb, 0xc6, 0xc9, 0xdd, 0xdf};
        static const uint8_t mid[] = {0xda, 0xc5, 0xc8, 0xdc, 0xde};
        static const uint8_t small[] = {0xd9, 0xc4, 0xc7};
        uint8_t h[5];
        uint32_t v = interesting_len();
        size_t hn;
        switch (below(3)) {
        case 0:
            h[0] = wide[below(sizeof(wide))];
            h[1] = (uint8_t)(v >> 24);
            h[2] = (uint8_t)(v >> 16);
            h[3] = (uint8_t)(v >> 8);
            h[4] = (uint8_t)v;
            hn = 5;
            break;
        case 1:
            h[0] = mid[below(sizeof(mid))];
            h[1] = (uint8_t)(v >> 8);
            h[2] = (uint8_t)v;
            hn = 3;
            break;
        default:
            h[0] = small[below(sizeof(small))];
            h[1] = (uint8_t)v;
            hn = 2;
            break;
        }
        if (below(2) && at + hn <= f->n)
            memcpy(f->b + at, h, hn);
        else
            insert(f, at, h, hn);
        break;
    }
    case 8: { /* splice in a piece of another seed */
        const frame *o = &seeds[below(nseeds)];
        size_t from = below(o->n), n = below(o->n - from) + 1;
        insert(f, at, o->b + from, n);
        break;
    }
    default: /* a run of one byte: deep nesting, long fixarrays */
    {
        uint8_t run[64];
        size_t n = below(sizeof(run)) + 1;
        memset(run, below(2) ? 0x91 : interesting[below(sizeof(interesting))], n);
        insert(f, at, run, n);
        break;
    }
    }
}

/* ---- the checks run on each input ------------------------------------------------------- */

enum {
    S_CONTENT,
    S_TOP_K,
    S_EMBEDDING,
    S_WEIGHT,
    S_FLAG,
    S_OFFSET,
    S_TAGS,
    S_IDS,
    S_META,
    S_BLOB,
    S_ANY,
    S_COUNT
};

static const rpc_param schema[S_COUNT] = {
    [S_CONTENT] = {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000},
    [S_TOP_K] = {"top_k", RPC_T_UINT, RPC_P_RANGE, 1, 1000},
    [S_EMBEDDING] = {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 64},
    [S_WEIGHT] = {"weight", RPC_T_NUM, RPC_P_RANGE, -1e6, 1e6},
    [S_FLAG] = {"flag", RPC_T_BOOL, 0, 0, 0},
    [S_OFFSET] = {"offset", RPC_T_INT, 0, 0, 0},
    [S_TAGS] = {"tags", RPC_T_STR_ARRAY, RPC_P_RANGE, 0, 16},
    [S_IDS] = {"ids", RPC_T_UINT_ARRAY, 0, 0, 0},
    [S_META] = {"meta", RPC_T_MAP, 0, 0, 0},
    [S_BLOB] = {"blob", RPC_T_BIN, RPC_P_RANGE, 0, 1024},
    [S_ANY] = {"any", RPC_T_ANY, RPC_P_NULLABLE, 0, 0},
};

static void *alloc_malloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

static unsigned long stat_complete, stat_request, stat_bound, stat_json;

/* JSON text of o, then text -> msgpack -> text twice: the second and third must agree. */
static void json_cycle(const msgpack_object *o)
{
    json_buf t1 = {0}, t2 = {0}, t3 = {0};
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_zone z;
    msgpack_object back;
    char err[256];
    size_t off = 0;
    int rc;

    if (json_from_msgpack(o, JSON_BIN_BASE64, 64, &t1) != 0) {
        json_buf_fini(&t1);
        return;
    }
    stat_json++;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_zone_init(&z, 1024);
    rc = json_to_msgpack(t1.data, t1.len, 64, &pk, err, sizeof(err));
    CHECK_MSG(rc == 0, "our own JSON does not parse: %s: %s", err, t1.data);
    if (rc == 0 && msgpack_unpack(sb.data, sb.size, &off, &z, &back) == MSGPACK_UNPACK_SUCCESS) {
        CHECK(json_from_msgpack(&back, 0, 64, &t2) == 0);
        msgpack_sbuffer_clear(&sb);
        CHECK(json_to_msgpack(t2.data, t2.len, 64, &pk, err, sizeof(err)) == 0);
        off = 0;
        msgpack_zone_clear(&z);
        if (msgpack_unpack(sb.data, sb.size, &off, &z, &back) == MSGPACK_UNPACK_SUCCESS) {
            CHECK(json_from_msgpack(&back, 0, 64, &t3) == 0);
            CHECK_MSG(t2.len == t3.len && memcmp(t2.data, t3.data, t2.len) == 0,
                      "JSON not stable:\n%s\n%s", t2.data, t3.data);
        } else {
            CHECK(!"second unpack failed");
        }
    } else if (rc == 0) {
        CHECK(!"unpack of json_to_msgpack output failed");
    }
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&sb);
    json_buf_fini(&t1);
    json_buf_fini(&t2);
    json_buf_fini(&t3);
}

static void use_bound(const msgpack_object **out)
{
    char err[256];
    char *s = rpc_get_str(out[S_CONTENT], alloc_malloc, NULL);

    CHECK(s != NULL && strlen(s) == out[S_CONTENT]->via.str.size); /* no NUL inside */
    free(s);
    if (out[S_EMBEDDING] != NULL) {
        float v[64];
        size_t dim = rpc_vector_dim(out[S_EMBEDDING]);
        CHECK(dim >= 1 && dim <= 64);
        CHECK_MSG(rpc_get_vector(out[S_EMBEDDING], "embedding", v, dim, err, sizeof(err)) == 0,
                  "%s", err);
    }
    (void)rpc_get_uint(out[S_TOP_K], 5);
    (void)rpc_get_num(out[S_WEIGHT], 0);
    (void)rpc_get_int(out[S_OFFSET], 0);
    (void)rpc_get_bool(out[S_FLAG], false);
}

static void decode_and_bind(const uint8_t *msg, size_t len)
{
    msgpack_zone z;
    rpc_request req;
    rpc_response resp;
    bool known;
    char err[256] = "";
    int rc;

    msgpack_zone_init(&z, 2048);
    rc = rpc_decode_request(msg, len, &z, &req, &known, err, sizeof(err));
    CHECK_MSG(rc == 0 || rc == RPC_E_MALFORMED, "decode rc %d", rc);
    CHECK(rc == 0 || err[0] != '\0');
    if (rc == 0) {
        const msgpack_object *out[S_COUNT];
        stat_request++;
        CHECK(req.kind == RPC_KIND_REQUEST || req.kind == RPC_KIND_NOTIFY);
        CHECK(req.method_len >= 1 && req.method_len <= 255);
        CHECK(req.kind != RPC_KIND_REQUEST || known);
        /* strings reference the message */
        CHECK((const uint8_t *)req.method > msg && (const uint8_t *)req.method < msg + len);
        err[0] = '\0';
        rc = rpc_bind_params(req.params, schema, S_COUNT, out, err, sizeof(err));
        CHECK(rc == 0 || (rc == RPC_E_INVALID && err[0] != '\0'));
        if (rc == 0) {
            stat_bound++;
            use_bound(out);
        }
        if (req.params != NULL)
            json_cycle(req.params);
    }
    msgpack_zone_clear(&z);
    rc = rpc_decode_response(msg, len, &z, &resp, err, sizeof(err));
    CHECK(rc == 0 || rc == RPC_E_MALFORMED);
    if (rc == 0 && resp.result != NULL)
        json_cycle(resp.result);
    msgpack_zone_destroy(&z);
}

static void run_one(const frame *f, const rpc_limits *lim)
{
    char err1[256] = "", err2[256] = "";
    size_t m1 = 0, m2 = 0, have = 0;
    rpc_scanner *s;
    int rc1, rc2 = RPC_E_INCOMPLETE;

    s = rpc_scanner_create(lim);
    rc1 = rpc_scanner_scan(s, f->b, f->n, &m1, err1, sizeof(err1));
    rpc_scanner_reset(s);
    while (have < f->n) {
        size_t step = below(4) == 0 ? 1 : below(64) + 1;
        have = f->n - have < step ? f->n : have + step;
        rc2 = rpc_scanner_scan(s, f->b, have, &m2, err2, sizeof(err2));
        if (rc2 != RPC_E_INCOMPLETE)
            break;
    }
    if (f->n == 0)
        rc2 = rpc_scanner_scan(s, f->b, 0, &m2, err2, sizeof(err2));
    rpc_scanner_destroy(s);

    CHECK_MSG(rc1 == rc2, "one shot %d, in pieces %d (%s | %s)", rc1, rc2, err1, err2);
    if (rc1 == 0 && rc2 == 0) {
        CHECK(m1 == m2 && m1 >= 1 && m1 <= f->n && m1 <= lim->max_message);
        stat_complete++;
        decode_and_bind(f->b, m1);
    } else if (rc1 == rc2 && rc1 != RPC_E_INCOMPLETE) {
        CHECK_MSG(strcmp(err1, err2) == 0, "'%s' vs '%s'", err1, err2);
        CHECK(err1[0] != '\0');
    }
    /* the decoder must be safe on bytes that never went through a scanner */
    decode_and_bind(f->b, f->n);
}

/* A few JSON texts mutated and parsed; whatever parses must print and parse stably. */
static void json_fuzz(unsigned long iterations)
{
    static const char *const texts[] = {
        "{\"a\":[1,2.5,-3e10,true,false,null],\"b\":{\"c\":\"x\\ny\\u00e9\\ud83d\\ude00\"}}",
        "[18446744073709551615,-9223372036854775808,0.1,1e-300,\"\\\\\\\"\\/\"]",
        "  {\"k\" : [ [ ], { } , \"\" ] }  ",
        "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
    };
    for (unsigned long it = 0; it < iterations; it++) {
        frame f;
        const char *t = texts[below(sizeof(texts) / sizeof(texts[0]))];
        msgpack_sbuffer sb;
        msgpack_packer pk;
        char err[256];
        int rc;

        f.n = strlen(t);
        memcpy(f.b, t, f.n);
        for (size_t k = below(3) + 1; k > 0; k--) {
            size_t at = below(f.n + 1);
            static const char tok[] = "[]{},:\"\\u0d8e-+.0123456789eEtrufalsn \x80\xc3\xed\xff";
            switch (below(4)) {
            case 0:
                if (f.n > 0)
                    f.b[below(f.n)] = (uint8_t)tok[below(sizeof(tok) - 1)];
                break;
            case 1: {
                uint8_t c = (uint8_t)tok[below(sizeof(tok) - 1)];
                insert(&f, at, &c, 1);
                break;
            }
            case 2:
                f.n = below(f.n + 1);
                break;
            default:
                if (f.n > 0)
                    f.b[below(f.n)] ^= (uint8_t)(1u << below(8));
                break;
            }
        }
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        err[0] = '\0';
        rc = json_to_msgpack((const char *)f.b, f.n, 8, &pk, err, sizeof(err));
        CHECK_MSG(rc == 0 || ((rc == JSON_E_SYNTAX || rc == JSON_E_TOO_DEEP) &&
                              strstr(err, "at offset") != NULL),
                  "json rc %d '%s'", rc, err);
        if (rc == 0) {
            msgpack_zone z;
            msgpack_object o;
            size_t off = 0;
            msgpack_zone_init(&z, 1024);
            if (msgpack_unpack(sb.data, sb.size, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS &&
                off == sb.size)
                json_cycle(&o);
            else
                CHECK(!"json_to_msgpack packed something msgpack-c cannot read");
            msgpack_zone_destroy(&z);
        }
        msgpack_sbuffer_destroy(&sb);
    }
}

int main(void)
{
    unsigned long iterations = 200000;
    const char *env = getenv("FUZZ_ITERATIONS");
    rpc_limits def, tight = {512, 8, 64};
    clock_t t0 = clock();

    if (env != NULL && atol(env) > 0)
        iterations = (unsigned long)atol(env);
    env = getenv("FUZZ_SEED");
    if (env != NULL)
        rng = strtoull(env, NULL, 0);
    rpc_limits_default(&def);
    build_seeds();

    /* the seeds themselves are valid */
    for (size_t i = 0; i < nseeds; i++) {
        size_t m;
        rpc_scanner *s = rpc_scanner_create(&def);
        CHECK(rpc_scanner_scan(s, seeds[i].b, seeds[i].n, &m, NULL, 0) == 0 && m == seeds[i].n);
        rpc_scanner_destroy(s);
    }

    for (unsigned long it = 0; it < iterations; it++) {
        frame f = seeds[below(nseeds)];
        for (size_t k = below(4) + 1; k > 0; k--)
            mutate(&f);
        run_one(&f, it % 4 == 3 ? &tight : &def);
        if (check_failures > 20)
            break; /* enough to go on */
    }
    json_fuzz(iterations / 4);

    fprintf(stderr,
            "%lu iterations in %.1f s: %lu delimited, %lu decoded as requests, %lu bound, %lu "
            "JSON cycles\n",
            iterations, (double)(clock() - t0) / CLOCKS_PER_SEC, stat_complete, stat_request,
            stat_bound, stat_json);
    /* the mutations must leave enough inputs valid to reach the deep layers */
    CHECK(stat_complete > iterations / 10);
    CHECK(stat_request > iterations / 50);
    CHECK(stat_bound > iterations / 500);
    CHECK(stat_json > iterations / 500);
    CHECK_RETURN();
}
