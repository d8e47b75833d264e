/* fuzz/rpc_decode.c: a libFuzzer target for the MessagePack-RPC scanner, decoder and binder.
 *
 * Each input is a byte stream as a connection would deliver it. The scanner delimits the
 * messages in it (in one shot, in pieces whose sizes come from the input, and under tight
 * limits); every delimited message is decoded as a request and as a response; a request is
 * bound against the schema its method names (mirrors of a few server methods, and one that
 * covers every parameter type), its bound values read with the typed getters, and its
 * arguments converted to JSON and back. The raw input is also decoded without a scanner,
 * since the decoder promises to be safe on any bytes. ASan and UBSan catch memory and
 * arithmetic errors; the invariants below abort() with a message when broken.
 *
 * Build and run: see README.md, Testing (meson setup with CC=clang and -Dfuzz=true).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MESSAGES 64

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* ---- schemas -------------------------------------------------------------------------- */

/* Shapes of a few server methods (server/m_*.c hold the real tables; proto must not link
 * server code). The binder is what is under test, not these tables. */
static const rpc_param auth_schema[] = {
    {"api_key", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 512},
};

static const rpc_param store_schema[] = {
    {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 16777216},
    {"type", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
    {"importance", RPC_T_NUM, RPC_P_REQUIRED | RPC_P_RANGE, 0, 1},
    {"metadata", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
    {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},
    {"agent_id", RPC_T_UINT, RPC_P_NULLABLE, 0, 0},
    {"scope", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
    {"created_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},
    {"ttl_seconds", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3.2e9},
    {"pinned", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0},
};

static const rpc_param search_schema[] = {
    {"query", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 16777216},
    {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},
    {"top_k", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 100000},
    {"mode", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
    {"similarity_weight", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},
    {"tags", RPC_T_STR_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 0, 64},
    {"ids", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1000},
};

static const rpc_param append_schema[] = {
    {"session_id", RPC_T_UINT, RPC_P_REQUIRED | RPC_P_RANGE, 1, INFINITY},
    {"role", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
    {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 0, INFINITY},
    {"tokens", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e9},
    {"cost_usdc", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e9},
};

/* Every type once, for any other method name. */
static const rpc_param any_schema[] = {
    {"content", RPC_T_STR, RPC_P_RANGE, 1, 1000},
    {"top_k", RPC_T_UINT, RPC_P_RANGE, 1, 1000},
    {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 64},
    {"weight", RPC_T_NUM, RPC_P_RANGE, -1e6, 1e6},
    {"flag", RPC_T_BOOL, 0, 0, 0},
    {"offset", RPC_T_INT, RPC_P_RANGE, -INFINITY, 1e12},
    {"tags", RPC_T_STR_ARRAY, RPC_P_RANGE, 0, 16},
    {"ids", RPC_T_UINT_ARRAY, 0, 0, 0},
    {"meta", RPC_T_MAP, RPC_P_RANGE, 0, 32},
    {"list", RPC_T_ARRAY, RPC_P_RANGE, 0, 32},
    {"blob", RPC_T_BIN, RPC_P_RANGE, 0, 1024},
    {"any", RPC_T_ANY, RPC_P_NULLABLE, 0, 0},
    {"since", RPC_T_TIME, RPC_P_NULLABLE | RPC_P_RANGE, 0, 9.2e18},
};

#define SCHEMA(name, s)                                                                            \
    {                                                                                              \
        name, s, sizeof(s) / sizeof(s[0])                                                          \
    }

static const struct method {
    const char *name;
    const rpc_param *schema;
    size_t n;
} methods[] = {
    SCHEMA("auth", auth_schema),
    SCHEMA("memory.store", store_schema),
    SCHEMA("memory.search", search_schema),
    SCHEMA("session.append", append_schema),
};

#define MAX_PARAMS 16

/* ---- checks on one message ---------------------------------------------------------------- */

static void *alloc_malloc(void *ud, size_t n)
{
    (void)ud;
    return malloc(n);
}

/* Reads every bound value with the getter its type calls for. */
static void use_bound(const rpc_param *schema, size_t n, const msgpack_object **out)
{
    char err[256];

    for (size_t i = 0; i < n; i++) {
        const msgpack_object *o = out[i];
        if (o == NULL) {
            REQUIRE(!(schema[i].flags & RPC_P_REQUIRED));
            continue;
        }
        switch (schema[i].type) {
        case RPC_T_STR: {
            char *s = rpc_get_str(o, alloc_malloc, NULL);
            REQUIRE(s != NULL && strlen(s) == o->via.str.size); /* no NUL inside */
            REQUIRE(rpc_str_eq(o, s));
            free(s);
            break;
        }
        case RPC_T_VECTOR: {
            size_t dim = rpc_vector_dim(o);
            float *v;
            REQUIRE(dim >= 1);
            v = malloc(dim * sizeof(float));
            REQUIRE(v != NULL);
            REQUIRE(rpc_get_vector(o, schema[i].name, v, dim, err, sizeof(err)) == 0);
            /* a wrong dimension is refused, not read past */
            REQUIRE(rpc_get_vector(o, schema[i].name, v, dim - 1, err, sizeof(err)) ==
                    RPC_E_INVALID);
            free(v);
            break;
        }
        case RPC_T_UINT:
            REQUIRE(o->type == MSGPACK_OBJECT_POSITIVE_INTEGER);
            REQUIRE(rpc_get_uint(o, 0) == o->via.u64);
            break;
        case RPC_T_INT:
            (void)rpc_get_int(o, 0);
            break;
        case RPC_T_NUM: {
            double d = rpc_get_num(o, 0);
            if (schema[i].flags & RPC_P_RANGE)
                REQUIRE(d >= schema[i].min && d <= schema[i].max);
            break;
        }
        case RPC_T_BOOL:
            REQUIRE(rpc_get_bool(o, !o->via.boolean) == o->via.boolean);
            break;
        case RPC_T_MAP:
            if (o->via.map.size > 0 && o->via.map.ptr[0].key.type == MSGPACK_OBJECT_STR) {
                char key[64];
                size_t kn = o->via.map.ptr[0].key.via.str.size;
                if (kn < sizeof(key)) {
                    memcpy(key, o->via.map.ptr[0].key.via.str.ptr, kn);
                    key[kn] = '\0';
                    REQUIRE(rpc_map_get(o, key) != NULL);
                }
            }
            break;
        default:
            break;
        }
    }
}

/* JSON text of o, then back to MessagePack: whatever prints must parse. */
static void json_cycle(const msgpack_object *o)
{
    json_buf t = {0};
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char err[256];

    if (json_from_msgpack(o, JSON_BIN_BASE64, 64, &t) != 0) {
        json_buf_fini(&t);
        return;
    }
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (json_to_msgpack(t.data, t.len, 64, &pk, err, sizeof(err)) != 0) {
        fprintf(stderr, "our own JSON does not parse: %s: %s\n", err, t.data);
        abort();
    }
    msgpack_sbuffer_destroy(&sb);
    json_buf_fini(&t);
}

static const struct method *find_method(const rpc_request *req)
{
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (strlen(methods[i].name) == req->method_len &&
            memcmp(methods[i].name, req->method, req->method_len) == 0)
            return &methods[i];
    return NULL;
}

static void bind_request(const rpc_request *req)
{
    const struct method *m = find_method(req);
    const rpc_param *schema = m != NULL ? m->schema : any_schema;
    size_t n = m != NULL ? m->n : sizeof(any_schema) / sizeof(any_schema[0]);
    const msgpack_object *out[MAX_PARAMS];
    char err[256] = "";
    int rc;

    rc = rpc_bind_params(req->params, schema, n, out, err, sizeof(err));
    REQUIRE(rc == 0 || (rc == RPC_E_INVALID && err[0] != '\0'));
    if (rc == 0)
        use_bound(schema, n, out);
    else
        for (size_t i = 0; i < n; i++)
            REQUIRE(out[i] == NULL);
}

static void decode_one(const uint8_t *msg, size_t len)
{
    msgpack_zone z;
    rpc_request req;
    rpc_response resp;
    bool known;
    uint32_t peeked;
    char err[256] = "";
    int rc;

    msgpack_zone_init(&z, 2048);
    rc = rpc_decode_request(msg, len, &z, &req, &known, err, sizeof(err));
    REQUIRE(rc == 0 || rc == RPC_E_MALFORMED);
    REQUIRE(rc == 0 || err[0] != '\0');
    REQUIRE(known == rpc_peek_msgid(msg, len, &peeked));
    REQUIRE(!known || peeked == req.msgid);
    if (rc == 0) {
        REQUIRE(req.kind == RPC_KIND_REQUEST || req.kind == RPC_KIND_NOTIFY);
        REQUIRE(req.method_len >= 1 && req.method_len <= 255);
        REQUIRE(req.kind != RPC_KIND_REQUEST || known);
        REQUIRE(req.kind != RPC_KIND_NOTIFY || req.msgid == 0);
        /* strings reference the message */
        REQUIRE((const uint8_t *)req.method > msg &&
                (const uint8_t *)req.method + req.method_len <= msg + len);
        REQUIRE(rpc_utf8_valid(req.method, req.method_len));
        REQUIRE(req.params == NULL || req.params->type == MSGPACK_OBJECT_MAP);
        bind_request(&req);
        if (req.params != NULL)
            json_cycle(req.params);
    }
    msgpack_zone_clear(&z);
    err[0] = '\0';
    rc = rpc_decode_response(msg, len, &z, &resp, err, sizeof(err));
    REQUIRE(rc == 0 || (rc == RPC_E_MALFORMED && err[0] != '\0'));
    if (rc == 0) {
        REQUIRE(resp.error == NULL || resp.error->type == MSGPACK_OBJECT_MAP);
        if (resp.result != NULL)
            json_cycle(resp.result);
    }
    msgpack_zone_destroy(&z);
}

/* ---- the stream ---------------------------------------------------------------------------- */

struct scan_result {
    int rc;                   /* of the call that ended the scan */
    size_t n;                 /* messages delimited */
    size_t len[MAX_MESSAGES]; /* their lengths */
    char err[256];            /* the message of a failure */
};

/* Delimits messages in the stream with the scanner in one shot per message. */
static void scan_whole(const uint8_t *data, size_t size, const rpc_limits *lim,
                       struct scan_result *r)
{
    rpc_scanner *s = rpc_scanner_create(lim);
    size_t off = 0;

    REQUIRE(s != NULL);
    memset(r, 0, sizeof(*r));
    for (;;) {
        size_t m = 0;
        r->rc = rpc_scanner_scan(s, data + off, size - off, &m, r->err, sizeof(r->err));
        if (r->rc != 0)
            break;
        REQUIRE(m >= 1 && m <= size - off && m <= lim->max_message);
        r->len[r->n++] = m;
        off += m;
        if (r->n == MAX_MESSAGES || off == size)
            break;
    }
    rpc_scanner_destroy(s);
}

/* The same, with the stream arriving in pieces whose sizes are read from the stream's own
 * bytes (so the fuzzer steers them); must agree with scan_whole. */
static void scan_pieces(const uint8_t *data, size_t size, const rpc_limits *lim,
                        struct scan_result *r)
{
    rpc_scanner *s = rpc_scanner_create(lim);
    size_t off = 0, have = 0, k = 0;

    REQUIRE(s != NULL);
    memset(r, 0, sizeof(*r));
    r->rc = RPC_E_INCOMPLETE;
    while (off < size || size == 0) {
        size_t m = 0, step = size > 0 ? (size_t)(data[k++ % size] % 13) + 1 : 0;
        have = have + step > size ? size : have + step;
        r->rc = rpc_scanner_scan(s, data + off, have - off, &m, r->err, sizeof(r->err));
        if (r->rc == RPC_E_INCOMPLETE) {
            if (have == size)
                break;
            continue;
        }
        if (r->rc != 0)
            break;
        r->len[r->n++] = m;
        off += m;
        if (have < off)
            have = off;
        if (r->n == MAX_MESSAGES || off == size)
            break;
    }
    rpc_scanner_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const rpc_limits tight = {512, 8, 64};
    struct scan_result whole, pieces, small;
    rpc_limits def;
    size_t off = 0;

    rpc_limits_default(&def);
    scan_whole(data, size, &def, &whole);
    scan_pieces(data, size, &def, &pieces);
    if (whole.rc != pieces.rc || whole.n != pieces.n ||
        memcmp(whole.len, pieces.len, whole.n * sizeof(whole.len[0])) != 0 ||
        (whole.rc != 0 && whole.rc != RPC_E_INCOMPLETE && strcmp(whole.err, pieces.err) != 0)) {
        fprintf(stderr, "one shot: rc %d, %zu messages (%s); in pieces: rc %d, %zu (%s)\n",
                whole.rc, whole.n, whole.err, pieces.rc, pieces.n, pieces.err);
        abort();
    }
    REQUIRE(whole.rc == 0 || whole.rc == RPC_E_INCOMPLETE || whole.err[0] != '\0');

    /* What passes tight limits passes the defaults, and is delimited the same way. */
    scan_whole(data, size, &tight, &small);
    for (size_t i = 0; i < small.n; i++)
        REQUIRE(i < whole.n && small.len[i] == whole.len[i]);

    for (size_t i = 0; i < whole.n; i++) {
        decode_one(data + off, whole.len[i]);
        off += whole.len[i];
    }
    /* the decoder must be safe on bytes that never went through a scanner */
    if (whole.n != 1 || whole.len[0] != size)
        decode_one(data, size);
    return 0;
}
