/* tests/unit/test_rpc.c: framing, decoding, binding and encoding of proto/rpc. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "rpc.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* A growable byte string for building frames by hand. */
typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void b_put(bytes *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (b->p == NULL)
            abort();
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void b_byte(bytes *b, uint8_t c)
{
    b_put(b, &c, 1);
}

static void b_fill(bytes *b, uint8_t c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        b_byte(b, c);
}

static void b_be(bytes *b, uint64_t v, unsigned w)
{
    for (unsigned i = w; i-- > 0;)
        b_byte(b, (uint8_t)(v >> (8 * i)));
}

static void b_free(bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* Scans buf with a fresh scanner in one call. */
static int scan_once(const rpc_limits *lim, const uint8_t *buf, size_t len, size_t *mlen, char *err,
                     size_t errlen)
{
    rpc_scanner *s = rpc_scanner_create(lim);
    int rc;
    if (s == NULL)
        abort();
    *mlen = 0;
    rc = rpc_scanner_scan(s, buf, len, mlen, err, errlen);
    rpc_scanner_destroy(s);
    return rc;
}

/* Feeds buf to a fresh scanner step bytes at a time; returns the first result that is not
 * RPC_E_INCOMPLETE (or RPC_E_INCOMPLETE at the end). */
static int scan_steps(const rpc_limits *lim, const uint8_t *buf, size_t len, size_t step,
                      size_t *mlen, char *err, size_t errlen)
{
    rpc_scanner *s = rpc_scanner_create(lim);
    int rc = RPC_E_INCOMPLETE;
    size_t have = 0;
    if (s == NULL)
        abort();
    *mlen = 0;
    while (have < len) {
        have = len - have < step ? len : have + step;
        rc = rpc_scanner_scan(s, buf, have, mlen, err, errlen);
        if (rc != RPC_E_INCOMPLETE)
            break;
    }
    rpc_scanner_destroy(s);
    return rc;
}

static rpc_limits limits(size_t max_message, unsigned max_depth, size_t max_objects)
{
    rpc_limits l = {max_message, max_depth, max_objects};
    return l;
}

/* A packer writing into a fresh sbuffer. */
typedef struct packed {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} packed;

static void pk_init(packed *p)
{
    msgpack_sbuffer_init(&p->sb);
    msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

static void pk_fini(packed *p)
{
    msgpack_sbuffer_destroy(&p->sb);
}

static bool same_bytes(const packed *p, const char *expect, size_t n)
{
    return p->sb.size == n && memcmp(p->sb.data, expect, n) == 0;
}

/* Unpacks one packed value (bypassing the RPC shape checks) for binder tests. */
typedef struct obj {
    packed p;
    msgpack_zone zone;
    msgpack_object o;
} obj;

static void obj_unpack(obj *x)
{
    size_t off = 0;
    msgpack_zone_init(&x->zone, 1024);
    if (msgpack_unpack(x->p.sb.data, x->p.sb.size, &off, &x->zone, &x->o) != MSGPACK_UNPACK_SUCCESS)
        abort();
}

static void obj_fini(obj *x)
{
    msgpack_zone_destroy(&x->zone);
    pk_fini(&x->p);
}

/* ---- basics ----------------------------------------------------------------------------- */

static void test_basics(void)
{
    static const char *const names[] = {
        "ok",
        "invalid_argument",
        "malformed_request",
        "unknown_method",
        "unauthenticated",
        "permission_denied",
        "not_found",
        "already_exists",
        "conflict",
        "quota_exceeded",
        "rate_limited",
        "cost_limit_exceeded",
        "unavailable",
        "internal",
        "result_too_large",
    };
    rpc_limits l;

    CHECK(sizeof(names) / sizeof(names[0]) == RPC_CODE_COUNT);
    for (int c = 0; c < RPC_CODE_COUNT; c++)
        CHECK_MSG(strcmp(rpc_code_name((rpc_code)c), names[c]) == 0, "code %d: %s", c,
                  rpc_code_name((rpc_code)c));
    CHECK(strcmp(rpc_code_name(RPC_CODE_COUNT), "internal") == 0);
    CHECK(strcmp(rpc_code_name((rpc_code)-1), "internal") == 0);

    rpc_limits_default(&l);
    CHECK(l.max_message == 16u * 1024 * 1024);
    CHECK(l.max_depth == 32);
    CHECK(l.max_objects == 4u * 1024 * 1024);
}

static void test_utf8(void)
{
    static const struct {
        const char *s;
        size_t n;
        bool ok;
    } cases[] = {
        {"", 0, true},
        {"plain ascii", 11, true},
        {"\x00", 1, true},
        {"\xc2\x80", 2, true},         /* U+0080 */
        {"\xdf\xbf", 2, true},         /* U+07FF */
        {"\xe0\xa0\x80", 3, true},     /* U+0800 */
        {"\xed\x9f\xbf", 3, true},     /* U+D7FF */
        {"\xee\x80\x80", 3, true},     /* U+E000 */
        {"\xef\xbf\xbf", 3, true},     /* U+FFFF */
        {"\xf0\x90\x80\x80", 4, true}, /* U+10000 */
        {"\xf0\x9f\x98\x80", 4, true}, /* emoji */
        {"\xf4\x8f\xbf\xbf", 4, true}, /* U+10FFFF */
        {"\x80", 1, false},            /* lone continuation */
        {"\xbf", 1, false},
        {"\xc0\x80", 2, false},         /* overlong NUL */
        {"\xc1\xbf", 2, false},         /* overlong */
        {"\xe0\x80\x80", 3, false},     /* overlong */
        {"\xe0\x9f\xbf", 3, false},     /* overlong */
        {"\xed\xa0\x80", 3, false},     /* U+D800 surrogate */
        {"\xed\xbf\xbf", 3, false},     /* U+DFFF surrogate */
        {"\xf0\x80\x80\x80", 4, false}, /* overlong */
        {"\xf0\x8f\xbf\xbf", 4, false}, /* overlong */
        {"\xf4\x90\x80\x80", 4, false}, /* U+110000 */
        {"\xf5\x80\x80\x80", 4, false},
        {"\xf8\x88\x80\x80\x80", 5, false},
        {"\xff", 1, false},
        {"\xe2\x82", 2, false}, /* truncated */
        {"a\xe2\x82", 3, false},
        {"\xe2\x28\xa1", 3, false}, /* bad continuation */
        {"\xf0\x9f\x98", 3, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK_MSG(rpc_utf8_valid(cases[i].s, cases[i].n) == cases[i].ok, "utf8 case %zu", i);
}

/* ---- scanner ---------------------------------------------------------------------------- */

/* A message that uses every type and every width of every length field. */
static void kitchen_sink(bytes *b)
{
    b_byte(b, 0xdc); /* array16 of 36 */
    b_be(b, 36, 2);
    b_byte(b, 0xc0); /* nil */
    b_byte(b, 0xc2); /* false */
    b_byte(b, 0xc3); /* true */
    b_byte(b, 0x7f); /* positive fixint */
    b_byte(b, 0xe0); /* negative fixint */
    for (unsigned w = 0; w < 4; w++) {
        b_byte(b, (uint8_t)(0xcc + w)); /* uint 8..64 */
        b_fill(b, 0xff, 1u << w);
        b_byte(b, (uint8_t)(0xd0 + w)); /* int 8..64 */
        b_fill(b, 0x80, 1u << w);
    }
    b_byte(b, 0xca); /* float32 1.5 */
    b_be(b, 0x3fc00000, 4);
    b_byte(b, 0xcb); /* float64 -2.0 */
    b_be(b, 0xc000000000000000ull, 8);
    b_put(b,
          "\xa3"
          "abc",
          4); /* fixstr */
    b_put(b,
          "\xd9\x02"
          "hi",
          4); /* str8 */
    b_put(b,
          "\xda\x00\x03"
          "xyz",
          6); /* str16 */
    b_put(b,
          "\xdb\x00\x00\x00\x01"
          "q",
          6);                                                 /* str32 */
    b_put(b, "\xc4\x01\x00", 3);                              /* bin8 */
    b_put(b, "\xc5\x00\x02\x01\x02", 5);                      /* bin16 */
    b_put(b, "\xc6\x00\x00\x00\x00", 5);                      /* bin32, empty */
    b_put(b, "\xd4\x01\xaa", 3);                              /* fixext1 */
    b_put(b, "\xd5\x01\xaa\xbb", 4);                          /* fixext2 */
    b_put(b, "\xd6\x01\x00\x00\x00\x00", 6);                  /* fixext4 */
    b_put(b, "\xd7\x01\x00\x00\x00\x00\x00\x00\x00\x00", 10); /* fixext8 */
    b_byte(b, 0xd8);                                          /* fixext16 */
    b_fill(b, 0x07, 17);
    b_put(b, "\xc7\x02\x05\x01\x02", 5);                   /* ext8 */
    b_put(b, "\xc8\x00\x01\x05\x01", 5);                   /* ext16 */
    b_put(b, "\xc9\x00\x00\x00\x00\x05", 6);               /* ext32, empty */
    b_put(b, "\x92\x90\x80", 3);                           /* fixarray [[], {}] */
    b_put(b, "\xdd\x00\x00\x00\x02\x01\x02", 7);           /* array32 */
    b_put(b, "\x81\xa1k\xc0", 4);                          /* fixmap */
    b_put(b, "\xde\x00\x01\x01\x02", 5);                   /* map16 */
    b_put(b, "\xdf\x00\x00\x00\x01\x91\x91\x90\xa1v", 10); /* map32 {[[[]]]: "v"} */
    b_put(b, "\xdc\x00\x00", 3);                           /* array16, empty */
}

static void test_scan_complete(void)
{
    bytes b = {0}, two = {0};
    rpc_limits lim;
    char err[256];
    size_t mlen, mlen2;
    int rc;

    rpc_limits_default(&lim);
    kitchen_sink(&b);

    rc = scan_once(&lim, b.p, b.n, &mlen, err, sizeof(err));
    CHECK_MSG(rc == 0 && mlen == b.n, "rc %d mlen %zu of %zu: %s", rc, mlen, b.n, err);

    /* every prefix is incomplete, with a fresh scanner */
    for (size_t i = 0; i < b.n; i++) {
        rc = scan_once(&lim, b.p, i, &mlen, err, sizeof(err));
        CHECK_MSG(rc == RPC_E_INCOMPLETE, "prefix %zu: rc %d", i, rc);
    }

    /* byte by byte and in odd chunks with one scanner equals one shot */
    for (size_t step = 1; step <= 13; step += 3) {
        rc = scan_steps(&lim, b.p, b.n, step, &mlen, err, sizeof(err));
        CHECK_MSG(rc == 0 && mlen == b.n, "step %zu: rc %d mlen %zu", step, rc, mlen);
    }

    /* the same scanner after incomplete calls on every prefix */
    {
        rpc_scanner *s = rpc_scanner_create(&lim);
        for (size_t i = 0; i <= b.n; i++) {
            rc = rpc_scanner_scan(s, b.p, i, &mlen, err, sizeof(err));
            if (i < b.n)
                CHECK_MSG(rc == RPC_E_INCOMPLETE, "resumed prefix %zu: rc %d", i, rc);
        }
        CHECK(rc == 0 && mlen == b.n);
        /* the scanner reset itself: the next message scans from scratch */
        rc = rpc_scanner_scan(s, (const uint8_t *)"\x91\x01", 2, &mlen, err, sizeof(err));
        CHECK(rc == 0 && mlen == 2);
        /* an explicit reset forgets a partial scan */
        rc = rpc_scanner_scan(s, (const uint8_t *)"\x92\x01", 2, &mlen, err, sizeof(err));
        CHECK(rc == RPC_E_INCOMPLETE);
        rpc_scanner_reset(s);
        rc = rpc_scanner_scan(s, (const uint8_t *)"\x01", 1, &mlen, err, sizeof(err));
        CHECK(rc == 0 && mlen == 1);
        rpc_scanner_destroy(s);
    }

    /* two messages back to back */
    b_put(&two, b.p, b.n);
    b_put(&two, "\x94\x00\x01\xa4ping\x90", 9);
    b_put(&two, "\x93", 1); /* the start of a third */
    {
        rpc_scanner *s = rpc_scanner_create(&lim);
        rc = rpc_scanner_scan(s, two.p, two.n, &mlen, err, sizeof(err));
        CHECK(rc == 0 && mlen == b.n);
        rc = rpc_scanner_scan(s, two.p + mlen, two.n - mlen, &mlen2, err, sizeof(err));
        CHECK(rc == 0 && mlen2 == 9);
        rc = rpc_scanner_scan(s, two.p + mlen + mlen2, two.n - mlen - mlen2, &mlen2, err,
                              sizeof(err));
        CHECK(rc == RPC_E_INCOMPLETE);
        rpc_scanner_destroy(s);
    }
    /* byte by byte across the boundary finds the first message only */
    rc = scan_steps(&lim, two.p, two.n, 1, &mlen, err, sizeof(err));
    CHECK(rc == 0 && mlen == b.n);

    /* NULL limits mean the defaults */
    {
        rpc_scanner *s = rpc_scanner_create(NULL);
        CHECK(s != NULL);
        rc = rpc_scanner_scan(s, b.p, b.n, &mlen, NULL, 0);
        CHECK(rc == 0 && mlen == b.n);
        rpc_scanner_destroy(s);
        rpc_scanner_destroy(NULL);
    }
    b_free(&b);
    b_free(&two);
}

/* A frame must fail with exactly its header bytes present: no waiting for the payload. */
static void expect_fail_now(const rpc_limits *lim, const char *frame, size_t n, int want,
                            const char *label)
{
    char err[256] = "";
    size_t mlen;
    int rc = scan_once(lim, (const uint8_t *)frame, n, &mlen, err, sizeof(err));
    CHECK_MSG(rc == want, "%s: rc %d, want %d (%s)", label, rc, want, err);
    CHECK_MSG(rc == RPC_E_INCOMPLETE || err[0] != '\0', "%s: no error message", label);
    /* the same verdict byte by byte */
    rc = scan_steps(lim, (const uint8_t *)frame, n, 1, &mlen, err, sizeof(err));
    CHECK_MSG(rc == want, "%s bytewise: rc %d, want %d", label, rc, want);
}

static void test_scan_hostile(void)
{
    rpc_limits def, small = limits(100, 32, 1000);
    bytes b = {0};
    char err[256];
    size_t mlen;
    int rc;

    rpc_limits_default(&def);

    /* length bombs at every width against the 16 MiB default */
    expect_fail_now(&def, "\xdb\xff\xff\xff\xff", 5, RPC_E_TOO_LARGE, "str32");
    expect_fail_now(&def, "\xc6\xff\xff\xff\xff", 5, RPC_E_TOO_LARGE, "bin32");
    expect_fail_now(&def, "\xc9\xff\xff\xff\xff\x01", 6, RPC_E_TOO_LARGE, "ext32");
    expect_fail_now(&def, "\xdd\xff\xff\xff\xff", 5, RPC_E_TOO_LARGE, "array32");
    expect_fail_now(&def, "\xdf\xff\xff\xff\xff", 5, RPC_E_TOO_LARGE, "map32");
    expect_fail_now(&def, "\xdf\x00\x80\x00\x00", 5, RPC_E_TOO_LARGE, "map32 2*8M bytes");
    expect_fail_now(&def, "\x94\x00\x01\xa1m\x91\xdd\xff\xff\xff\xff", 11, RPC_E_TOO_LARGE,
                    "nested array32");
    expect_fail_now(&def, "\x92\xc6\x00\xff\xff\xfa", 6, RPC_E_TOO_LARGE,
                    "bin32 leaving no byte for its sibling");
    /* and against a 100-byte limit, the 8- and 16-bit widths */
    expect_fail_now(&small, "\xd9\xff", 2, RPC_E_TOO_LARGE, "str8");
    expect_fail_now(&small, "\xda\xff\xff", 3, RPC_E_TOO_LARGE, "str16");
    expect_fail_now(&small, "\xc4\xff", 2, RPC_E_TOO_LARGE, "bin8");
    expect_fail_now(&small, "\xc5\x01\x00", 3, RPC_E_TOO_LARGE, "bin16");
    expect_fail_now(&small, "\xc7\xff\x01", 3, RPC_E_TOO_LARGE, "ext8");
    expect_fail_now(&small, "\xc8\x01\x00\x01", 4, RPC_E_TOO_LARGE, "ext16");
    expect_fail_now(&small, "\xdc\x00\x65", 3, RPC_E_TOO_LARGE, "array16 of 101");
    expect_fail_now(&small, "\xde\x00\x32", 3, RPC_E_TOO_LARGE, "map16 of 50 entries");
    expect_fail_now(&small, "\xdc\x00\x10\xd9\x58", 5, RPC_E_TOO_LARGE,
                    "str8 of 88 with 15 siblings owed");
    /* exactly fitting is fine: 3 + 97 = 100 */
    b_byte(&b, 0xdc);
    b_be(&b, 97, 2);
    b_fill(&b, 0xc0, 97);
    rc = scan_once(&small, b.p, b.n, &mlen, err, sizeof(err));
    CHECK_MSG(rc == 0 && mlen == 100, "exact fit: rc %d %s", rc, err);
    /* one more byte of message is too large */
    b.n = 0;
    b_byte(&b, 0xdc);
    b_be(&b, 97, 2);
    b_fill(&b, 0xc0, 96);
    b_put(&b, "\xcc\x01", 2);
    rc = scan_once(&small, b.p, b.n, &mlen, err, sizeof(err));
    CHECK_MSG(rc == RPC_E_TOO_LARGE, "over by one: rc %d", rc);
    /* a fixstr past a tiny limit */
    {
        rpc_limits tiny = limits(10, 32, 100);
        expect_fail_now(&tiny, "\xbf", 1, RPC_E_TOO_LARGE, "fixstr 31 in 10");
        expect_fail_now(&tiny, "\x91\xa9", 2, RPC_E_TOO_LARGE, "[fixstr 9] in 10");
        rc = scan_once(&tiny,
                       (const uint8_t *)"\xa9"
                                        "123456789",
                       10, &mlen, err, sizeof(err));
        CHECK(rc == 0 && mlen == 10);
    }

    /* 1000-deep nesting fails at the 33rd level without waiting for more */
    b.n = 0;
    b_fill(&b, 0x91, 1000);
    rc = scan_once(&def, b.p, 33, &mlen, err, sizeof(err));
    CHECK_MSG(rc == RPC_E_TOO_DEEP, "33 deep: rc %d", rc);
    CHECK_STR_CONTAINS(err, "deeper than 32");
    rc = scan_once(&def, b.p, b.n, &mlen, err, sizeof(err));
    CHECK(rc == RPC_E_TOO_DEEP);
    rc = scan_steps(&def, b.p, b.n, 1, &mlen, err, sizeof(err));
    CHECK(rc == RPC_E_TOO_DEEP);
    /* exactly 32 deep is fine; 32 arrays around an empty one is 33 */
    b.n = 0;
    b_fill(&b, 0x91, 32);
    b_byte(&b, 0xc0);
    rc = scan_once(&def, b.p, b.n, &mlen, err, sizeof(err));
    CHECK(rc == 0 && mlen == 33);
    b.p[32] = 0x90;
    rc = scan_once(&def, b.p, b.n, &mlen, err, sizeof(err));
    CHECK(rc == RPC_E_TOO_DEEP);
    b.p[32] = 0x80;
    rc = scan_once(&def, b.p, b.n, &mlen, err, sizeof(err));
    CHECK(rc == RPC_E_TOO_DEEP);
    {
        rpc_limits flat = limits(100, 0, 100);
        expect_fail_now(&flat, "\x90", 1, RPC_E_TOO_DEEP, "depth 0 limit");
        rc = scan_once(&flat, (const uint8_t *)"\x05", 1, &mlen, err, sizeof(err));
        CHECK(rc == 0 && mlen == 1);
    }

    /* object-count bombs */
    {
        rpc_limits few = limits(1 << 20, 32, 100);
        expect_fail_now(&few, "\xdc\x00\xc8", 3, RPC_E_TOO_MANY, "array of 200 > 100 objects");
        expect_fail_now(&few, "\xde\x00\x32", 3, RPC_E_TOO_MANY, "map of 50 entries = 101");
        /* 1 + 49 * 2 = 99 objects pass; 1 + 50 * 2 = 101 do not, found mid-way */
        for (unsigned n = 49; n <= 50; n++) {
            b.n = 0;
            b_byte(&b, 0xdc);
            b_be(&b, n, 2);
            for (unsigned i = 0; i < n; i++)
                b_put(&b, "\x91\xc0", 2);
            rc = scan_once(&few, b.p, b.n, &mlen, err, sizeof(err));
            CHECK_MSG(rc == (n == 49 ? 0 : RPC_E_TOO_MANY), "%u pairs: rc %d", n, rc);
        }
        /* a map entry counts two */
        {
            rpc_limits ten = limits(100, 32, 10);
            expect_fail_now(&ten, "\x85", 1, RPC_E_TOO_MANY, "fixmap 5 = 11 objects");
            rc = scan_once(&ten, (const uint8_t *)"\x84\x01\x02\x03\x04\x05\x06\x07\x08", 9, &mlen,
                           err, sizeof(err));
            CHECK(rc == 0 && mlen == 9);
        }
        /* the default limit: an array of 5 Mi nils fits in 16 MiB but not in 4 Mi objects */
        expect_fail_now(&def, "\xdd\x00\x50\x00\x00", 5, RPC_E_TOO_MANY, "array of 5 Mi");
        /* max_objects 0 refuses even a scalar */
        {
            rpc_limits none = limits(100, 32, 0);
            expect_fail_now(&none, "\xc0", 1, RPC_E_TOO_MANY, "no objects");
        }
    }

    /* 0xc1 anywhere */
    expect_fail_now(&def, "\xc1", 1, RPC_E_MALFORMED, "c1 top");
    expect_fail_now(&def, "\x94\x00\x01\xc1", 4, RPC_E_MALFORMED, "c1 nested");
    expect_fail_now(&def, "\x82\xa1k\xc1", 4, RPC_E_MALFORMED, "c1 as map value");
    rc = scan_once(&def, (const uint8_t *)"\x94\x00\x01\xc1", 4, &mlen, err, sizeof(err));
    CHECK_STR_CONTAINS(err, "0xc1 at offset 3");

    /* error text is truncated to errlen and NUL-terminated */
    memset(err, 'x', sizeof(err));
    rc = scan_once(&def, (const uint8_t *)"\xc1", 1, &mlen, err, 8);
    CHECK(rc == RPC_E_MALFORMED && strlen(err) == 7);
    /* and err may be NULL */
    rc = scan_once(&def, (const uint8_t *)"\xc1", 1, &mlen, NULL, 0);
    CHECK(rc == RPC_E_MALFORMED);

    /* absurd limits must not wrap the arithmetic: huge declarations are then just pending */
    {
        rpc_limits huge = limits(SIZE_MAX, 32, SIZE_MAX);
        expect_fail_now(&huge, "\xdd\xff\xff\xff\xff", 5, RPC_E_INCOMPLETE, "huge array32");
        expect_fail_now(&huge, "\xdf\xff\xff\xff\xff\xdb\xff\xff\xff\xff", 10, RPC_E_INCOMPLETE,
                        "huge map32 of str32");
        rc = scan_once(&huge, (const uint8_t *)"\x92\xc6\x00\x00\x00\x01z\xc0", 8, &mlen, err,
                       sizeof(err));
        CHECK(rc == 0 && mlen == 8);
    }

    /* truncated input is incomplete, not an error */
    expect_fail_now(&def, "\x94\x00\x01\xa4pi", 6, RPC_E_INCOMPLETE, "truncated str");
    expect_fail_now(&def, "\xdb\x00\x00", 3, RPC_E_INCOMPLETE, "truncated header");
    expect_fail_now(&def, "", 0, RPC_E_INCOMPLETE, "empty");
    b_free(&b);
}

/* Linear time: a big message fed in small pieces must not be rescanned from the start. */
static void test_scan_linear(void)
{
    rpc_limits lim;
    bytes b = {0};
    char err[256];
    size_t mlen;
    clock_t t0;
    double secs;
    int rc;
    const size_t nints = 2u << 20; /* 2 Mi fixints: 2 MiB of tiny values */

    rpc_limits_default(&lim);
    /* [0, 1, "m", [{"ints": [...], "blob": <bin of ~14 MiB>}]] */
    b_put(&b, "\x94\x00\x01\xa1m\x91\x82\xa4ints\xdd", 13);
    b_be(&b, nints, 4);
    for (size_t i = 0; i < nints; i++)
        b_byte(&b, (uint8_t)(i & 0x7f));
    b_put(&b,
          "\xa4"
          "blob\xc6",
          6);
    {
        size_t blob = lim.max_message - b.n - 4;
        b_be(&b, blob, 4);
        b_fill(&b, 0xab, blob);
    }
    CHECK(b.n == lim.max_message);

    t0 = clock();
    rc = scan_steps(&lim, b.p, b.n, 4096, &mlen, err, sizeof(err));
    secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK_MSG(rc == 0 && mlen == b.n, "4 KiB pieces: rc %d %s", rc, err);
    CHECK_MSG(secs < 5.0, "16 MiB in 4 KiB pieces took %.2f s", secs);

    /* byte by byte over the 2 Mi small values: quadratic rescanning would take hours */
    t0 = clock();
    rc = scan_steps(&lim, b.p, b.n, 1, &mlen, err, sizeof(err));
    secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK_MSG(rc == 0 && mlen == b.n, "bytewise: rc %d %s", rc, err);
    CHECK_MSG(secs < 20.0, "16 MiB byte by byte took %.2f s", secs);

    /* one byte more than the limit fails as soon as the blob's header is read */
    {
        size_t hdr = 13 + 4 + nints + 5; /* where the blob's 0xc6 sits */
        bytes big = {0};
        b_put(&big, b.p, hdr + 1);
        b_be(&big, lim.max_message - (hdr + 5) + 1, 4);
        rc = scan_once(&lim, big.p, big.n, &mlen, err, sizeof(err));
        CHECK_MSG(rc == RPC_E_TOO_LARGE, "16 MiB + 1: rc %d", rc);
        b_free(&big);
    }
    b_free(&b);
}

/* ---- decoding --------------------------------------------------------------------------- */

typedef struct dec {
    msgpack_zone zone;
    rpc_request req;
    rpc_response resp;
    bool known;
    char err[256];
    int rc;
} dec;

static int dreq(dec *d, const char *msg, size_t n)
{
    memset(d, 0, sizeof(*d));
    msgpack_zone_init(&d->zone, 1024);
    d->known = true; /* must be cleared by the decoder */
    d->rc = rpc_decode_request((const uint8_t *)msg, n, &d->zone, &d->req, &d->known, d->err,
                               sizeof(d->err));
    return d->rc;
}

static int dresp(dec *d, const char *msg, size_t n)
{
    memset(d, 0, sizeof(*d));
    msgpack_zone_init(&d->zone, 1024);
    d->rc =
        rpc_decode_response((const uint8_t *)msg, n, &d->zone, &d->resp, d->err, sizeof(d->err));
    return d->rc;
}

static void dfini(dec *d)
{
    msgpack_zone_destroy(&d->zone);
}

#define S(lit) lit, sizeof(lit) - 1

/* Expects a malformed request whose error contains what, and the msgid state. */
static void bad_req(const char *msg, size_t n, const char *what, bool known, uint32_t id)
{
    dec d;
    dreq(&d, msg, n);
    CHECK_MSG(d.rc == RPC_E_MALFORMED, "'%s': rc %d", what, d.rc);
    CHECK_STR_CONTAINS(d.err, what);
    CHECK_MSG(d.known == known, "'%s': msgid_known %d", what, d.known);
    if (known)
        CHECK_MSG(d.req.msgid == id, "'%s': msgid %u", what, d.req.msgid);
    CHECK(d.req.params == NULL);
    dfini(&d);
}

static void test_decode(void)
{
    static const char ping[] = "\x94\x00\x07\xa4ping\x90";
    dec d;

    /* a request without arguments */
    CHECK(dreq(&d, S(ping)) == 0);
    CHECK(d.req.kind == RPC_KIND_REQUEST && d.req.msgid == 7 && d.known);
    CHECK(d.req.method_len == 4 && memcmp(d.req.method, "ping", 4) == 0);
    CHECK(d.req.params == NULL);
    dfini(&d);

    /* a request with arguments and the largest msgid; strings point into the message */
    {
        static const char m[] = "\x94\x00\xce\xff\xff\xff\xff\xaamemory.add\x91\x82"
                                "\xa7"
                                "content\xa5hello\xa5top_k\x05";
        CHECK(dreq(&d, S(m)) == 0);
        CHECK(d.req.msgid == UINT32_MAX && d.known);
        CHECK(d.req.method_len == 10 && memcmp(d.req.method, "memory.add", 10) == 0);
        CHECK(d.req.method >= m && d.req.method < m + sizeof(m));
        CHECK(d.req.params != NULL && d.req.params->type == MSGPACK_OBJECT_MAP &&
              d.req.params->via.map.size == 2);
        {
            const msgpack_object *c = rpc_map_get(d.req.params, "content");
            CHECK(rpc_str_eq(c, "hello"));
            CHECK(c != NULL && c->via.str.ptr >= m && c->via.str.ptr < m + sizeof(m));
            CHECK(rpc_get_uint(rpc_map_get(d.req.params, "top_k"), 0) == 5);
        }
        dfini(&d);
    }

    /* bin bodies are referenced in the message too, not copied */
    {
        static const char m[] = "\x94\x00\x01\xa1m\x91\x81\xa1"
                                "b\xc4\x03xyz";
        const msgpack_object *bin;
        CHECK(dreq(&d, S(m)) == 0);
        bin = rpc_map_get(d.req.params, "b");
        CHECK(bin != NULL && bin->type == MSGPACK_OBJECT_BIN && bin->via.bin.size == 3);
        CHECK(bin != NULL && bin->via.bin.ptr == m + 11);
        dfini(&d);
    }

    /* msgid and kind in wider encodings decode the same */
    CHECK(dreq(&d, S("\x94\xd0\x00\xcd\x01\x00\xa1m\x90")) == 0);
    CHECK(d.req.msgid == 256 && d.known);
    dfini(&d);

    /* a notification */
    CHECK(dreq(&d, S("\x93\x02\xa3log\x91\x81\xa1"
                     "a\x01")) == 0);
    CHECK(d.req.kind == RPC_KIND_NOTIFY && d.req.msgid == 0 && !d.known);
    CHECK(d.req.method_len == 3 && d.req.params && d.req.params->via.map.size == 1);
    dfini(&d);

    /* responses */
    CHECK(dresp(&d, S("\x94\x01\x09\xc0\xa4pong")) == 0);
    CHECK(d.resp.msgid == 9 && d.resp.error == NULL && rpc_str_eq(d.resp.result, "pong"));
    dfini(&d);
    CHECK(dresp(&d, S("\x94\x01\x09\x81\xa4"
                      "code\xa8internal\xc0")) == 0);
    CHECK(d.resp.error != NULL && d.resp.result == NULL);
    CHECK(rpc_str_eq(rpc_map_get(d.resp.error, "code"), "internal"));
    dfini(&d);

    /* wrong top-level shapes */
    bad_req(S("\x80"), "must be an array, not map", false, 0);
    bad_req(S("\x05"), "must be an array, not integer", false, 0);
    bad_req(S("\xa2hi"), "must be an array, not string", false, 0);
    bad_req(S("\x90"), "kind", false, 0);
    bad_req(S("\x93\x00\x07\xa1m"), "4 elements, not 3", true, 7);
    bad_req(S("\x95\x00\x07\xa1m\x90\xc0"), "4 elements, not 5", true, 7);
    bad_req(S("\x94\x01\x07\xc0\xc0"), "kind 1 (response) is not a request", false, 0);
    bad_req(S("\x94\x03\x07\xa1m\x90"), "unknown message kind 3", false, 0);
    bad_req(S("\x94\xff\x07\xa1m\x90"), "kind", false, 0);
    bad_req(S("\x94\xa1\x30\x07\xa1m\x90"), "kind", false, 0);
    bad_req(S("\x94\x02\xa1m\x90\xc0"), "notification must be an array of 3", false, 0);

    /* msgid */
    bad_req(S("\x94\x00\xff\xa1m\x90"), "msgid must be an unsigned 32-bit integer", false, 0);
    bad_req(S("\x94\x00\xd0\x80\xa1m\x90"), "msgid", false, 0);
    bad_req(S("\x94\x00\xcf\x00\x00\x00\x01\x00\x00\x00\x00\xa1m\x90"), "msgid", false, 0);
    bad_req(S("\x94\x00\xa1"
              "1\xa1m\x90"),
            "msgid", false, 0);
    bad_req(S("\x94\x00\xca\x3f\x80\x00\x00\xa1m\x90"), "msgid", false, 0);

    /* method: msgid is still recovered */
    bad_req(S("\x94\x00\x07\x2a\x90"), "method must be a string, not integer", true, 7);
    bad_req(S("\x94\x00\x07\xa0\x90"), "1 to 255 bytes", true, 7);
    bad_req(S("\x94\x00\x07\xa2\xc3\x28\x90"), "not valid UTF-8", true, 7);
    bad_req(S("\x94\x00\x07\xc4\x01m\x90"), "method must be a string, not binary", true, 7);
    {
        char m[300];
        size_t n = 0;
        memcpy(m, "\x94\x00\x08\xd9", 4);
        n = 4;
        m[n++] = (char)255;
        memset(m + n, 'a', 255);
        n += 255;
        m[n++] = (char)0x90;
        CHECK(dreq(&d, m, n) == 0 && d.req.method_len == 255);
        dfini(&d);
        m[4] = (char)0; /* rebuilt below as 256 bytes */
        n = 0;
        memcpy(m, "\x94\x00\x08\xda\x01\x00", 6);
        n = 6;
        memset(m + n, 'a', 256);
        n += 256;
        m[n++] = (char)0x90;
        bad_req(m, n, "1 to 255 bytes", true, 8);
    }

    /* params */
    bad_req(S("\x94\x00\x07\xa1m\x80"), "params must be [] or [map], not map", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\xc0"), "params must be [] or [map], not nil", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\x92\x80\x80"), "not an array of 2 elements", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\x91\x05"), "not [integer]", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\x91\x90"), "not [array]", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\x91\x81\x01\x02"), "parameter names must be strings", true, 7);
    bad_req(S("\x94\x00\x07\xa1m\x91\x82\xa1k\x01\xc0\x02"), "parameter names must be strings",
            true, 7);
    bad_req(S("\x93\x02\xa1m\x91\x05"), "params must be [] or [map]", false, 0);

    /* not valid MessagePack at all: the msgid is still read from the bytes */
    bad_req(S("\x94\x00\x07\xc1\xc0"), "0xc1 at offset 3", true, 7);
    bad_req(S("\x94\x00\x07\xa4pi"), "truncated", true, 7);
    bad_req(S("\x94\x00\x07"), "truncated", true, 7);
    bad_req(S("\x94\x00\xcd\x01"), "truncated", false, 0);
    bad_req(S("\x94\x00\x07\xa1m\x90\x00"), "1 trailing bytes", true, 7);
    bad_req(S(""), "empty message", false, 0);
    /* a forged count that never went through a scanner: refused before msgpack-c allocates */
    bad_req(S("\x94\x00\x01\xa1m\x91\xdd\xff\xff\xff\xff"), "truncated", true, 1);
    bad_req(S("\x94\x00\x01\xa1m\x91\xdf\xff\xff\xff\xff"), "truncated", true, 1);
    bad_req(S("\x94\x00\x02\xa1m\x91\xdb\xff\xff\xff\xff"), "truncated", true, 2);
    /* 33 levels: past msgpack-c's stack */
    {
        char m[64];
        /* the top array and 32 more */
        memcpy(m, "\x94\x00\x03\xa1m", 5);
        memset(m + 5, 0x91, 32);
        m[37] = (char)0xc0;
        bad_req(m, 38, "deeper than 32", true, 3);
        /* the top array and 31 more: msgpack-c unpacks it, the shape check refuses it */
        m[36] = (char)0xc0;
        CHECK(dreq(&d, m, 37) == RPC_E_MALFORMED);
        CHECK_STR_CONTAINS(d.err, "not [array]");
        dfini(&d);
    }
    /* a NULL zone is a programming error */
    {
        rpc_request r;
        bool known;
        CHECK(rpc_decode_request((const uint8_t *)ping, sizeof(ping) - 1, NULL, &r, &known, NULL,
                                 0) == -EINVAL);
    }
    /* msgid_known may be NULL */
    {
        msgpack_zone z;
        rpc_request r;
        msgpack_zone_init(&z, 256);
        CHECK(rpc_decode_request((const uint8_t *)ping, sizeof(ping) - 1, &z, &r, NULL, NULL, 0) ==
              0);
        msgpack_zone_destroy(&z);
    }

    /* responses that are not */
    CHECK(dresp(&d, S(ping)) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "kind 1");
    dfini(&d);
    CHECK(dresp(&d, S("\x93\x01\x07\xc0")) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "4 elements, not 3");
    dfini(&d);
    CHECK(dresp(&d, S("\x94\x01\xff\xc0\xc0")) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "msgid");
    dfini(&d);
    CHECK(dresp(&d, S("\x94\x01\x01\xa3"
                      "bad\xc0")) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "error must be nil or a map");
    dfini(&d);
    CHECK(dresp(&d, S("\x81\x01\x02")) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "must be an array");
    dfini(&d);
    CHECK(dresp(&d, S("\x94\x01\x01\xc0")) == RPC_E_MALFORMED);
    CHECK_STR_CONTAINS(d.err, "truncated");
    dfini(&d);
}

/* ---- binding ---------------------------------------------------------------------------- */

enum {
    P_CONTENT,
    P_TOP_K,
    P_EMBEDDING,
    P_OFFSET,
    P_WEIGHT,
    P_FLAG,
    P_TAGS,
    P_IDS,
    P_META,
    P_BLOB,
    P_ANY,
    P_NOTE,
    P_LIST,
    P_COUNT
};

static const rpc_param schema[P_COUNT] = {
    [P_CONTENT] = {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 100},
    [P_TOP_K] = {"top_k", RPC_T_UINT, RPC_P_RANGE, 1, 1000},
    [P_EMBEDDING] = {"embedding", RPC_T_VECTOR, RPC_P_RANGE | RPC_P_NULLABLE, 1, 8},
    [P_OFFSET] = {"offset", RPC_T_INT, RPC_P_RANGE, -10, 10},
    [P_WEIGHT] = {"weight", RPC_T_NUM, RPC_P_RANGE, 0, 1},
    [P_FLAG] = {"flag", RPC_T_BOOL, 0, 0, 0},
    [P_TAGS] = {"tags", RPC_T_STR_ARRAY, RPC_P_RANGE, 0, 3},
    [P_IDS] = {"ids", RPC_T_UINT_ARRAY, 0, 0, 0},
    [P_META] = {"meta", RPC_T_MAP, 0, 0, 0},
    [P_BLOB] = {"blob", RPC_T_BIN, RPC_P_RANGE, 0, 4},
    [P_ANY] = {"any", RPC_T_ANY, 0, 0, 0},
    [P_NOTE] = {"note", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
    [P_LIST] = {"list", RPC_T_ARRAY, RPC_P_RANGE, 1, 2},
};

/* Packs {"content": "hi", key: <value packed by fn>} (key NULL: content only) and binds it. */
typedef void (*packfn)(msgpack_packer *pk);

static int bind_with(const char *key, packfn fn, const msgpack_object **out, char *err,
                     size_t errlen, obj *x)
{
    pk_init(&x->p);
    msgpack_pack_map(&x->p.pk, key ? 2 : 1);
    rpc_pack_kv_str(&x->p.pk, "content", "hi");
    if (key != NULL) {
        rpc_pack_cstr(&x->p.pk, key);
        fn(&x->p.pk);
    }
    obj_unpack(x);
    return rpc_bind_params(&x->o, schema, P_COUNT, out, err, errlen);
}

/* Binds content plus key=value and expects failure containing what (NULL: success). */
static void expect_bind(const char *key, packfn fn, const char *what, const char *label)
{
    const msgpack_object *out[P_COUNT];
    char err[256] = "";
    obj x;
    int rc = bind_with(key, fn, out, err, sizeof(err), &x);
    if (what == NULL) {
        CHECK_MSG(rc == 0, "%s: rc %d: %s", label, rc, err);
    } else {
        CHECK_MSG(rc == RPC_E_INVALID, "%s: rc %d", label, rc);
        CHECK_MSG(strstr(err, what) != NULL, "%s: '%s' lacks '%s'", label, err, what);
        for (int i = 0; i < P_COUNT; i++)
            CHECK(out[i] == NULL);
    }
    obj_fini(&x);
}

/* Binds {"content": <value packed by fn>} and expects failure containing what (NULL: ok). */
static void expect_content(packfn fn, const char *what, const char *label)
{
    const msgpack_object *out[P_COUNT];
    char err[256] = "";
    obj x;
    int rc;

    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 1);
    rpc_pack_cstr(&x.p.pk, "content");
    fn(&x.p.pk);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    if (what == NULL) {
        CHECK_MSG(rc == 0 && out[P_CONTENT] != NULL, "%s: rc %d: %s", label, rc, err);
    } else {
        CHECK_MSG(rc == RPC_E_INVALID, "%s: rc %d", label, rc);
        CHECK_MSG(strstr(err, what) != NULL, "%s: '%s' lacks '%s'", label, err, what);
    }
    obj_fini(&x);
}

static void str_pk(msgpack_packer *pk, const char *s, size_t n)
{
    rpc_pack_strn(pk, s, n);
}

/* Value packers, one per case. */
#define PK(name, ...)                                                                              \
    static void name(msgpack_packer *pk)                                                           \
    {                                                                                              \
        __VA_ARGS__;                                                                               \
    }
PK(v_nil, msgpack_pack_nil(pk))
PK(v_true, msgpack_pack_true(pk))
PK(v_u0, msgpack_pack_uint64(pk, 0))
PK(v_u1, msgpack_pack_uint64(pk, 1))
PK(v_u2, msgpack_pack_uint64(pk, 2))
PK(v_u1000, msgpack_pack_uint64(pk, 1000))
PK(v_u1001, msgpack_pack_uint64(pk, 1001))
PK(v_umax, msgpack_pack_uint64(pk, UINT64_MAX))
PK(v_m1, msgpack_pack_int64(pk, -1))
PK(v_m10, msgpack_pack_int64(pk, -10))
PK(v_m11, msgpack_pack_int64(pk, -11))
PK(v_imin, msgpack_pack_int64(pk, INT64_MIN))
PK(v_half, msgpack_pack_double(pk, 0.5))
PK(v_f32half, msgpack_pack_float(pk, 0.5f))
PK(v_1p5, msgpack_pack_double(pk, 1.5))
PK(v_neg_tiny, msgpack_pack_double(pk, -1e-9))
PK(v_nan, msgpack_pack_double(pk, NAN))
PK(v_inf, msgpack_pack_double(pk, INFINITY))
PK(v_f32inf, msgpack_pack_float(pk, -INFINITY))
PK(v_str, rpc_pack_cstr(pk, "text"))
PK(v_empty_str, rpc_pack_cstr(pk, ""))
PK(v_str100, char s[100]; memset(s, 'a', 100); str_pk(pk, s, 100))
PK(v_str101, char s[101]; memset(s, 'a', 101); str_pk(pk, s, 101))
PK(v_emoji, str_pk(pk, "\xf0\x9f\x98\x80 ok \xe2\x82\xac", 11))
PK(v_overlong, str_pk(pk, "a\xc0\xaf", 3))
PK(v_overlong3, str_pk(pk, "\xe0\x80\xaf", 3))
PK(v_surrogate, str_pk(pk, "\xed\xa0\x80", 3))
PK(v_toobig, str_pk(pk, "\xf4\x90\x80\x80", 4))
PK(v_trunc, str_pk(pk, "ab\xe2\x82", 4))
PK(v_cont, str_pk(pk, "\x80", 1))
PK(v_nul, str_pk(pk, "a\0b", 3))
PK(v_bin4, msgpack_pack_bin_with_body(pk, "abcd", 4))
PK(v_bin5, msgpack_pack_bin_with_body(pk, "abcde", 5))
PK(v_bin0, msgpack_pack_bin(pk, 0))
PK(v_bin6, msgpack_pack_bin_with_body(pk, "abcdef", 6))
PK(v_ext, msgpack_pack_ext_with_body(pk, "x", 1, 5))
PK(v_empty_arr, msgpack_pack_array(pk, 0))
PK(v_ext_nested, msgpack_pack_array(pk, 1); msgpack_pack_map(pk, 1); rpc_pack_cstr(pk, "e");
   msgpack_pack_ext_with_body(pk, "x", 1, 5))
PK(v_map_empty, msgpack_pack_map(pk, 0))
/* vectors */
PK(v_vec_bin3, float f[3] = {1.0f, -2.5f, 3.25f}; rpc_pack_vector(pk, f, 3))
PK(v_vec_bin9, float f[9] = {0}; rpc_pack_vector(pk, f, 9))
PK(v_vec_bin_nan, msgpack_pack_bin_with_body(pk, "\x00\x00\x80\x3f\x00\x00\xc0\x7f", 8))
PK(v_vec_bin_inf, msgpack_pack_bin_with_body(pk, "\x00\x00\x80\x7f", 4))
PK(v_vec_bin_ninf, msgpack_pack_bin_with_body(pk, "\x00\x00\x80\xff", 4))
PK(v_vec_arr, msgpack_pack_array(pk, 4); msgpack_pack_uint64(pk, 1); msgpack_pack_double(pk, 2.5);
   msgpack_pack_int64(pk, -3); msgpack_pack_float(pk, 0.25f))
PK(v_vec_arr_nan, msgpack_pack_array(pk, 2); msgpack_pack_uint64(pk, 1);
   msgpack_pack_double(pk, NAN))
PK(v_vec_arr_inf, msgpack_pack_array(pk, 2); msgpack_pack_double(pk, -INFINITY);
   msgpack_pack_uint64(pk, 1))
PK(v_vec_arr_huge, msgpack_pack_array(pk, 1); msgpack_pack_double(pk, 1e300))
PK(v_vec_arr_str, msgpack_pack_array(pk, 2); msgpack_pack_uint64(pk, 1); rpc_pack_cstr(pk, "x"))
PK(v_vec_arr_nil, msgpack_pack_array(pk, 1); msgpack_pack_nil(pk))
/* string and integer arrays */
PK(v_tags2, msgpack_pack_array(pk, 2); rpc_pack_cstr(pk, "a"); rpc_pack_cstr(pk, "b"))
PK(v_tags4, msgpack_pack_array(pk, 4); for (int i = 0; i < 4; i++) rpc_pack_cstr(pk, "t"))
PK(v_tags_int, msgpack_pack_array(pk, 2); rpc_pack_cstr(pk, "a"); msgpack_pack_uint64(pk, 1))
PK(v_tags_bad, msgpack_pack_array(pk, 2); rpc_pack_cstr(pk, "a"); str_pk(pk, "\xff", 1))
PK(v_ids, msgpack_pack_array(pk, 2); msgpack_pack_uint64(pk, 1); msgpack_pack_uint64(pk, 2))
PK(v_ids_neg, msgpack_pack_array(pk, 2); msgpack_pack_uint64(pk, 1); msgpack_pack_int64(pk, -2))
PK(v_ids_str, msgpack_pack_array(pk, 1); rpc_pack_cstr(pk, "1"))
/* maps and free-form values */
PK(v_meta, msgpack_pack_map(pk, 2); rpc_pack_kv_str(pk, "k", "v"); rpc_pack_cstr(pk, "n");
   msgpack_pack_array(pk, 1); msgpack_pack_map(pk, 1); rpc_pack_kv_uint(pk, "deep", 1))
PK(v_meta_intkey, msgpack_pack_map(pk, 1); msgpack_pack_uint64(pk, 1); rpc_pack_cstr(pk, "v"))
PK(v_meta_bad_deep, msgpack_pack_map(pk, 1); rpc_pack_cstr(pk, "k"); msgpack_pack_array(pk, 1);
   str_pk(pk, "\xed\xa0\x80", 3))
PK(v_meta_bad_key, msgpack_pack_map(pk, 1); str_pk(pk, "\xc0\x80", 2); msgpack_pack_nil(pk))
PK(v_any_nested_nul, msgpack_pack_array(pk, 2); msgpack_pack_nil(pk); str_pk(pk, "a\0", 2))
PK(v_list3, msgpack_pack_array(pk, 3); for (int i = 0; i < 3; i++) msgpack_pack_nil(pk))

static void test_bind_types(void)
{
    /* content alone binds; absent optionals are NULL */
    expect_bind(NULL, NULL, NULL, "content only");

    /* uint */
    expect_bind("top_k", v_u1, NULL, "top_k 1");
    expect_bind("top_k", v_u1000, NULL, "top_k 1000");
    expect_bind("top_k", v_u0, "parameter 'top_k' must be between 1 and 1000", "top_k 0");
    expect_bind("top_k", v_u1001, "parameter 'top_k' must be between 1 and 1000", "top_k 1001");
    expect_bind("top_k", v_umax, "must be between 1 and 1000", "top_k max");
    expect_bind("top_k", v_str, "parameter 'top_k' must be an unsigned integer", "top_k str");
    expect_bind("top_k", v_m1, "parameter 'top_k' must be an unsigned integer", "top_k -1");
    expect_bind("top_k", v_1p5, "parameter 'top_k' must be an unsigned integer", "top_k 1.5");
    expect_bind("top_k", v_nil, "parameter 'top_k' must be an unsigned integer", "top_k nil");

    /* int */
    expect_bind("offset", v_m10, NULL, "offset -10");
    expect_bind("offset", v_u2, NULL, "offset 2");
    expect_bind("offset", v_m11, "parameter 'offset' must be between -10 and 10", "offset -11");
    expect_bind("offset", v_imin, "must be between -10 and 10", "offset min");
    expect_bind("offset", v_umax, "parameter 'offset' must be an integer", "offset u64 max");
    expect_bind("offset", v_half, "parameter 'offset' must be an integer", "offset 0.5");

    /* num */
    expect_bind("weight", v_half, NULL, "weight 0.5");
    expect_bind("weight", v_f32half, NULL, "weight f32 0.5");
    expect_bind("weight", v_u1, NULL, "weight 1");
    expect_bind("weight", v_u0, NULL, "weight 0");
    expect_bind("weight", v_u2, "parameter 'weight' must be between 0 and 1", "weight 2");
    expect_bind("weight", v_m1, "parameter 'weight' must be between 0 and 1", "weight -1");
    expect_bind("weight", v_1p5, "parameter 'weight' must be between 0 and 1", "weight 1.5");
    expect_bind("weight", v_neg_tiny, "must be between 0 and 1", "weight -1e-9");
    expect_bind("weight", v_nan, "parameter 'weight' must be a finite number", "weight NaN");
    expect_bind("weight", v_inf, "parameter 'weight' must be a finite number", "weight inf");
    expect_bind("weight", v_f32inf, "must be a finite number", "weight f32 -inf");
    expect_bind("weight", v_true, "parameter 'weight' must be a number", "weight bool");

    /* bool */
    expect_bind("flag", v_true, NULL, "flag true");
    expect_bind("flag", v_u1, "parameter 'flag' must be a boolean", "flag 1");

    /* strings: range and UTF-8 */
    expect_bind("note", v_emoji, NULL, "emoji");
    expect_bind("note", v_empty_str, NULL, "note empty, unbounded");
    expect_bind("note", v_nil, NULL, "note nil, nullable");
    expect_bind("note", v_u1, "parameter 'note' must be a string", "note int");
    expect_bind("note", v_bin4, "parameter 'note' must be a string", "note bin");
    expect_bind("note", v_overlong, "parameter 'note' is not valid UTF-8", "overlong 2");
    expect_bind("note", v_overlong3, "parameter 'note' is not valid UTF-8", "overlong 3");
    expect_bind("note", v_surrogate, "parameter 'note' is not valid UTF-8", "surrogate");
    expect_bind("note", v_toobig, "parameter 'note' is not valid UTF-8", "> U+10FFFF");
    expect_bind("note", v_trunc, "parameter 'note' is not valid UTF-8", "truncated");
    expect_bind("note", v_cont, "parameter 'note' is not valid UTF-8", "continuation");
    expect_bind("note", v_nul, "parameter 'note' contains a NUL character", "NUL");

    /* bin */
    expect_bind("blob", v_bin4, NULL, "bin 4");
    expect_bind("blob", v_bin0, NULL, "bin 0");
    expect_bind("blob", v_bin5, "parameter 'blob' must be between 0 and 4 bytes long", "bin 5");
    expect_bind("blob", v_str, "parameter 'blob' must be a binary", "blob str");

    /* vectors */
    expect_bind("embedding", v_vec_bin3, NULL, "vector bin");
    expect_bind("embedding", v_vec_arr, NULL, "vector array");
    expect_bind("embedding", v_nil, NULL, "vector nil, nullable");
    expect_bind("embedding", v_bin6, "binary length 6 is not a multiple of 4", "bin 6");
    expect_bind("embedding", v_bin0, "parameter 'embedding' must be a vector of at least 1",
                "bin 0");
    expect_bind("embedding", v_empty_arr, "must be a vector of at least 1", "array 0");
    expect_bind("embedding", v_vec_bin_nan, "parameter 'embedding' holds a NaN or infinity",
                "bin NaN");
    expect_bind("embedding", v_vec_bin_inf, "holds a NaN or infinity at index 0", "bin inf");
    expect_bind("embedding", v_vec_bin_ninf, "holds a NaN or infinity", "bin -inf");
    expect_bind("embedding", v_vec_arr_nan, "holds a NaN, infinity or value out of float32",
                "array NaN");
    expect_bind("embedding", v_vec_arr_inf, "at index 0", "array -inf");
    expect_bind("embedding", v_vec_arr_huge, "out of float32 range", "array 1e300");
    expect_bind("embedding", v_vec_arr_str,
                "parameter 'embedding' must be a vector (bin of float32 or array of numbers)",
                "array with a string");
    expect_bind("embedding", v_vec_arr_nil, "must be a vector", "array with nil");
    expect_bind("embedding", v_str,
                "parameter 'embedding' must be a vector (bin of float32 or array of numbers)",
                "vector str");
    expect_bind("embedding", v_vec_bin9, "parameter 'embedding' must have between 1 and 8 dim",
                "dimension 9");

    /* string and integer arrays */
    expect_bind("tags", v_tags2, NULL, "tags 2");
    expect_bind("tags", v_empty_arr, NULL, "tags 0");
    expect_bind("tags", v_tags4, "parameter 'tags' must have between 0 and 3 elements", "tags 4");
    expect_bind("tags", v_tags_int, "parameter 'tags' must be an array of strings", "tags int");
    expect_bind("tags", v_tags_bad, "parameter 'tags[1]' is not valid UTF-8", "tags utf8");
    expect_bind("tags", v_str, "must be an array of strings", "tags str");
    expect_bind("ids", v_ids, NULL, "ids");
    expect_bind("ids", v_ids_neg, "parameter 'ids' must be an array of unsigned integers",
                "ids neg");
    expect_bind("ids", v_ids_str, "must be an array of unsigned integers", "ids str");

    /* maps, arrays, anything */
    expect_bind("meta", v_meta, NULL, "meta");
    expect_bind("meta", v_map_empty, NULL, "meta empty");
    expect_bind("meta", v_meta_intkey, "parameter 'meta' must be a map with string keys",
                "meta int key");
    expect_bind("meta", v_meta_bad_deep, "parameter 'meta' holds a string that is not valid",
                "meta deep utf8");
    expect_bind("meta", v_meta_bad_key, "is not valid UTF-8", "meta key utf8");
    expect_bind("meta", v_tags2, "parameter 'meta' must be a map", "meta array");
    expect_bind("any", v_ext, "parameter 'any' holds an extension value", "any ext");
    expect_bind("any", v_ext_nested, "parameter 'any' holds an extension value", "nested ext");
    expect_bind("list", v_ext_nested, "parameter 'list' holds an extension value", "list ext");
    expect_bind("top_k", v_ext, "parameter 'top_k' must be an unsigned integer, not extension",
                "top_k ext");
    expect_bind("any", v_nil, NULL, "any nil");
    expect_bind("any", v_meta_intkey, NULL, "any int key");
    expect_bind("any", v_any_nested_nul, "parameter 'any' holds a string that contains a NUL",
                "any nested NUL");
    expect_bind("any", v_surrogate, "holds a string that is not valid UTF-8", "any surrogate");
    expect_bind("list", v_tags2, NULL, "list 2");
    expect_bind("list", v_empty_arr, "parameter 'list' must have between 1 and 2 elements",
                "list 0");
    expect_bind("list", v_list3, "must have between 1 and 2 elements", "list 3");
    expect_bind("list", v_str, "parameter 'list' must be an array", "list str");

    /* content itself */
    expect_content(v_str, NULL, "content text");
    expect_content(v_str100, NULL, "content 100");
    expect_content(v_str101, "parameter 'content' must be between 1 and 100 bytes long",
                   "content 101");
    expect_content(v_empty_str, "parameter 'content' must be between 1 and 100 bytes long",
                   "content empty");
    expect_content(v_nil, "parameter 'content' must be a string", "content nil");
    expect_content(v_overlong, "parameter 'content' is not valid UTF-8", "content overlong");
    expect_bind("foo", v_u1, "unknown parameter 'foo'", "unknown");
    expect_bind("content", v_str, "duplicate parameter 'content'", "duplicate");
}

static void test_bind_map(void)
{
    const msgpack_object *out[P_COUNT];
    char err[256];
    obj x;
    int rc;

    /* a full, valid set; getters read it back */
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 7);
    rpc_pack_kv_str(&x.p.pk, "content", "hello");
    rpc_pack_kv_uint(&x.p.pk, "top_k", 10);
    rpc_pack_kv_int(&x.p.pk, "offset", -3);
    rpc_pack_kv_num(&x.p.pk, "weight", 0.25);
    rpc_pack_kv_bool(&x.p.pk, "flag", true);
    rpc_pack_kv_nil(&x.p.pk, "note");
    rpc_pack_cstr(&x.p.pk, "embedding");
    v_vec_bin3(&x.p.pk);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK_MSG(rc == 0, "full: %s", err);
    if (rc == 0) {
        float v[3];
        CHECK(rpc_get_uint(out[P_TOP_K], 0) == 10);
        CHECK(rpc_get_int(out[P_OFFSET], 0) == -3);
        CHECK(rpc_get_num(out[P_WEIGHT], 0) == 0.25);
        CHECK(rpc_get_bool(out[P_FLAG], false) == true);
        CHECK(out[P_NOTE] == NULL);
        CHECK(out[P_TAGS] == NULL);
        CHECK(rpc_get_uint(out[P_TAGS], 77) == 77);
        CHECK(rpc_get_int(NULL, -5) == -5);
        CHECK(rpc_get_num(NULL, 2.5) == 2.5);
        CHECK(rpc_get_bool(NULL, true) == true);
        CHECK(rpc_get_num(out[P_TOP_K], 0) == 10.0);
        CHECK(rpc_get_num(out[P_OFFSET], 0) == -3.0);
        CHECK(rpc_get_int(out[P_TOP_K], 0) == 10);
        CHECK(rpc_str_eq(out[P_CONTENT], "hello"));
        CHECK(!rpc_str_eq(out[P_CONTENT], "hell"));
        CHECK(!rpc_str_eq(out[P_CONTENT], "hello!"));
        CHECK(!rpc_str_eq(out[P_TOP_K], "10"));
        CHECK(!rpc_str_eq(NULL, "x"));
        CHECK(rpc_vector_dim(out[P_EMBEDDING]) == 3);
        CHECK(rpc_get_vector(out[P_EMBEDDING], "embedding", v, 3, err, sizeof(err)) == 0);
        CHECK(v[0] == 1.0f && v[1] == -2.5f && v[2] == 3.25f);
        CHECK(rpc_get_vector(out[P_EMBEDDING], "embedding", v, 2, err, sizeof(err)) ==
              RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "parameter 'embedding' has dimension 3, expected 2");
        CHECK(rpc_get_vector(NULL, "embedding", v, 3, err, sizeof(err)) == RPC_E_INVALID);
        CHECK(rpc_get_vector(out[P_CONTENT], "content", v, 3, err, sizeof(err)) == RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "parameter 'content' must be a vector");
        CHECK(rpc_map_get(&x.o, "weight") == out[P_WEIGHT]);
        CHECK(rpc_map_get(&x.o, "nope") == NULL);
        CHECK(rpc_map_get(NULL, "weight") == NULL);
        CHECK(rpc_map_get(out[P_CONTENT], "weight") == NULL);
    }
    obj_fini(&x);

    /* params NULL: only the required one is missing */
    rc = rpc_bind_params(NULL, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "missing required parameter 'content'");
    rc = rpc_bind_params(NULL, schema + 1, P_COUNT - 1, out, err, sizeof(err));
    CHECK(rc == 0);
    for (int i = 0; i < P_COUNT - 1; i++)
        CHECK(out[i] == NULL);
    rc = rpc_bind_params(NULL, NULL, 0, out, err, sizeof(err));
    CHECK(rc == 0);

    /* a required parameter given as nil is missing when nullable, wrong when not */
    {
        static const rpc_param req_null[] = {
            {"id", RPC_T_UINT, RPC_P_REQUIRED | RPC_P_NULLABLE, 0, 0},
        };
        pk_init(&x.p);
        msgpack_pack_map(&x.p.pk, 1);
        rpc_pack_kv_nil(&x.p.pk, "id");
        obj_unpack(&x);
        rc = rpc_bind_params(&x.o, req_null, 1, out, err, sizeof(err));
        CHECK(rc == RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "missing required parameter 'id'");
        rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
        CHECK_STR_CONTAINS(err, "unknown parameter 'id'");
        obj_fini(&x);
    }
    /* the content given as nil is a type error */
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 1);
    rpc_pack_kv_nil(&x.p.pk, "content");
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter 'content' must be a string, not nil");
    obj_fini(&x);

    /* params that is not a map, keys that are not strings */
    pk_init(&x.p);
    msgpack_pack_array(&x.p.pk, 0);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameters must be a map");
    obj_fini(&x);
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 2);
    rpc_pack_kv_str(&x.p.pk, "content", "x");
    msgpack_pack_uint64(&x.p.pk, 3);
    msgpack_pack_uint64(&x.p.pk, 3);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter names must be strings");
    obj_fini(&x);

    /* unknown names are quoted safely */
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 1);
    rpc_pack_strn(&x.p.pk, "a'\n\xff", 4);
    msgpack_pack_nil(&x.p.pk);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "unknown parameter 'a\\x27\\x0a\\xff'");
    obj_fini(&x);
    {
        char longname[300];
        memset(longname, 'z', sizeof(longname));
        pk_init(&x.p);
        msgpack_pack_map(&x.p.pk, 1);
        rpc_pack_strn(&x.p.pk, longname, sizeof(longname));
        msgpack_pack_nil(&x.p.pk);
        obj_unpack(&x);
        rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
        CHECK(rc == RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "zzz...'");
        CHECK(strlen(err) < 100);
        obj_fini(&x);
    }

    /* a duplicate of a nullable parameter given as nil twice is still a duplicate */
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 3);
    rpc_pack_kv_str(&x.p.pk, "content", "x");
    rpc_pack_kv_nil(&x.p.pk, "note");
    rpc_pack_kv_nil(&x.p.pk, "note");
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "duplicate parameter 'note'");
    obj_fini(&x);

    /* a duplicate of a valid value */
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 3);
    rpc_pack_kv_uint(&x.p.pk, "top_k", 3);
    rpc_pack_kv_str(&x.p.pk, "content", "x");
    rpc_pack_kv_uint(&x.p.pk, "top_k", 4);
    obj_unpack(&x);
    rc = rpc_bind_params(&x.o, schema, P_COUNT, out, err, sizeof(err));
    CHECK(rc == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "duplicate parameter 'top_k'");
    obj_fini(&x);
}

static void *test_alloc(void *ud, size_t n)
{
    (*(int *)ud)++;
    return malloc(n);
}

static void *fail_alloc(void *ud, size_t n)
{
    (void)ud;
    (void)n;
    return NULL;
}

static void test_getters(void)
{
    char err[256];
    obj x;
    int calls = 0;

    /* rpc_get_str copies and terminates */
    pk_init(&x.p);
    rpc_pack_strn(&x.p.pk, "abc", 3);
    obj_unpack(&x);
    {
        char *s = rpc_get_str(&x.o, test_alloc, &calls);
        CHECK(s != NULL && strcmp(s, "abc") == 0 && calls == 1);
        CHECK(s != x.o.via.str.ptr);
        free(s);
        CHECK(rpc_get_str(&x.o, fail_alloc, NULL) == NULL);
        CHECK(rpc_get_str(NULL, test_alloc, &calls) == NULL && calls == 1);
    }
    obj_fini(&x);
    pk_init(&x.p);
    rpc_pack_strn(&x.p.pk, "", 0);
    obj_unpack(&x);
    {
        char *s = rpc_get_str(&x.o, test_alloc, &calls);
        CHECK(s != NULL && s[0] == '\0');
        free(s);
    }
    obj_fini(&x);

    /* vector in both forms, little-endian bytes decoded whatever the host */
    pk_init(&x.p);
    msgpack_pack_bin_with_body(&x.p.pk, "\x00\x00\x80\x3f\x00\x00\x20\xc1\x01\x00\x00\x00", 12);
    obj_unpack(&x);
    {
        float v[3];
        CHECK(rpc_check_value(&x.o, RPC_T_VECTOR, 0, 0, 0, "v", err, sizeof(err)) == 0);
        CHECK(rpc_vector_dim(&x.o) == 3);
        CHECK(rpc_get_vector(&x.o, "v", v, 3, err, sizeof(err)) == 0);
        CHECK(v[0] == 1.0f && v[1] == -10.0f);
        CHECK(v[2] > 0 && v[2] < 1e-44f); /* the smallest subnormal */
    }
    obj_fini(&x);
    pk_init(&x.p);
    v_vec_arr(&x.p.pk);
    obj_unpack(&x);
    {
        float v[4];
        CHECK(rpc_vector_dim(&x.o) == 4);
        CHECK(rpc_get_vector(&x.o, "v", v, 4, err, sizeof(err)) == 0);
        CHECK(v[0] == 1.0f && v[1] == 2.5f && v[2] == -3.0f && v[3] == 0.25f);
    }
    obj_fini(&x);
    pk_init(&x.p);
    v_vec_arr_nan(&x.p.pk);
    obj_unpack(&x);
    {
        float v[2];
        CHECK(rpc_get_vector(&x.o, "q", v, 2, err, sizeof(err)) == RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "parameter 'q' holds a NaN");
    }
    obj_fini(&x);
    pk_init(&x.p);
    v_vec_bin_inf(&x.p.pk);
    obj_unpack(&x);
    {
        float v[1];
        CHECK(rpc_get_vector(&x.o, "q", v, 1, err, sizeof(err)) == RPC_E_INVALID);
        CHECK_STR_CONTAINS(err, "index 0");
    }
    obj_fini(&x);
    CHECK(rpc_vector_dim(NULL) == 0);
}

static void test_check_value(void)
{
    char err[256];
    obj x;

    pk_init(&x.p);
    msgpack_pack_double(&x.p.pk, 7.5);
    obj_unpack(&x);
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, 0, 1, "memories[3].importance", err,
                          sizeof(err)) == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter 'memories[3].importance' must be between 0 and 1");
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, 0, INFINITY, "w", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, 8, INFINITY, "w", err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter 'w' must be at least 8");
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, -INFINITY, 7, "w", err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter 'w' must be at most 7");
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, 0, 0.5, "w", err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "between 0 and 0.5");
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, 0, 0, 1, "w", err, sizeof(err)) == 0); /* no range */
    CHECK(rpc_check_value(NULL, RPC_T_NUM, 0, 0, 1, "w", err, sizeof(err)) == RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "missing parameter 'w'");
    obj_fini(&x);

    /* exact integer ranges past 2^53 */
    pk_init(&x.p);
    msgpack_pack_uint64(&x.p.pk, 9007199254740993ull); /* 2^53 + 1 */
    obj_unpack(&x);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, RPC_P_RANGE, 0, 9007199254740992.0, "u", err,
                          sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, RPC_P_RANGE, 9007199254740993.0 + 2, INFINITY, "u", err,
                          sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_INT, RPC_P_RANGE, -INFINITY, 9007199254740992.0, "u", err,
                          sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, RPC_P_RANGE, 0, 18446744073709551616.0, "u", err,
                          sizeof(err)) == 0);
    obj_fini(&x);
    pk_init(&x.p);
    msgpack_pack_uint64(&x.p.pk, UINT64_MAX);
    obj_unpack(&x);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, RPC_P_RANGE, 1, INFINITY, "u", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, RPC_P_RANGE, 0, 1e19, "u", err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_NUM, RPC_P_RANGE, 0, 1e19, "u", err, sizeof(err)) ==
          RPC_E_INVALID);
    obj_fini(&x);
    pk_init(&x.p);
    msgpack_pack_int64(&x.p.pk, INT64_MIN);
    obj_unpack(&x);
    CHECK(rpc_check_value(&x.o, RPC_T_INT, 0, 0, 0, "i", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_INT, RPC_P_RANGE, -0x1p63, 0, "i", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_INT, RPC_P_RANGE, -0x1p62, 0, "i", err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_UINT, 0, 0, 0, "i", err, sizeof(err)) == RPC_E_INVALID);
    obj_fini(&x);

    /* nil: accepted when nullable, else a type error except for ANY */
    pk_init(&x.p);
    msgpack_pack_nil(&x.p.pk);
    obj_unpack(&x);
    CHECK(rpc_check_value(&x.o, RPC_T_STR, RPC_P_NULLABLE, 0, 0, "s", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_STR, 0, 0, 0, "s", err, sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_check_value(&x.o, RPC_T_ANY, 0, 0, 0, "s", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&x.o, RPC_T_VECTOR, 0, 0, 0, "s", err, sizeof(err)) == RPC_E_INVALID);
    obj_fini(&x);

    /* err truncation and NULL err */
    pk_init(&x.p);
    msgpack_pack_true(&x.p.pk);
    obj_unpack(&x);
    memset(err, 'x', sizeof(err));
    CHECK(rpc_check_value(&x.o, RPC_T_STR, 0, 0, 0, "s", err, 10) == RPC_E_INVALID);
    CHECK(strlen(err) == 9);
    CHECK(rpc_check_value(&x.o, RPC_T_STR, 0, 0, 0, "s", NULL, 0) == RPC_E_INVALID);
    obj_fini(&x);
}

/* ---- encoding --------------------------------------------------------------------------- */

static void test_encode(void)
{
    packed p;
    dec d;

    /* the known example */
    pk_init(&p);
    rpc_pack_result_begin(&p.pk, 1);
    rpc_pack_cstr(&p.pk, "pong");
    CHECK(same_bytes(&p, S("\x94\x01\x01\xc0\xa4pong")));
    CHECK(dresp(&d, p.sb.data, p.sb.size) == 0);
    CHECK(d.resp.msgid == 1 && d.resp.error == NULL && rpc_str_eq(d.resp.result, "pong"));
    dfini(&d);
    pk_fini(&p);

    /* large msgids use the smallest encoding msgpack-c picks, and survive */
    pk_init(&p);
    rpc_pack_result_begin(&p.pk, UINT32_MAX);
    msgpack_pack_nil(&p.pk);
    CHECK(same_bytes(&p, S("\x94\x01\xce\xff\xff\xff\xff\xc0\xc0")));
    pk_fini(&p);

    /* an error without details, byte for byte */
    pk_init(&p);
    rpc_pack_error(&p.pk, 5, RPC_INTERNAL, "x", NULL, 0);
    CHECK(same_bytes(&p, S("\x94\x01\x05\x82\xa4"
                           "code\xa8internal\xa7message\xa1x\xc0")));
    pk_fini(&p);

    /* an error with details decodes as a response */
    {
        const rpc_detail details[] = {
            {"limit", RPC_D_UINT, {.u = 1000}}, {"delta", RPC_D_INT, {.i = -4}},
            {"ratio", RPC_D_NUM, {.d = 0.5}},   {"field", RPC_D_STR, {.s = "top_k"}},
            {"none", RPC_D_STR, {.s = NULL}},
        };
        const msgpack_object *e;
        pk_init(&p);
        rpc_pack_error(&p.pk, 42, RPC_QUOTA_EXCEEDED, "too many", details, 5);
        CHECK(dresp(&d, p.sb.data, p.sb.size) == 0);
        CHECK(d.resp.msgid == 42 && d.resp.result == NULL && d.resp.error != NULL);
        e = d.resp.error;
        CHECK(e && e->via.map.size == 7);
        CHECK(rpc_str_eq(rpc_map_get(e, "code"), "quota_exceeded"));
        CHECK(rpc_str_eq(rpc_map_get(e, "message"), "too many"));
        CHECK(rpc_get_uint(rpc_map_get(e, "limit"), 0) == 1000);
        CHECK(rpc_get_int(rpc_map_get(e, "delta"), 0) == -4);
        CHECK(rpc_get_num(rpc_map_get(e, "ratio"), 0) == 0.5);
        CHECK(rpc_str_eq(rpc_map_get(e, "field"), "top_k"));
        CHECK(rpc_map_get(e, "none") != NULL && rpc_map_get(e, "none")->type == MSGPACK_OBJECT_NIL);
        dfini(&d);
        pk_fini(&p);
    }
    /* a NULL message packs "" */
    pk_init(&p);
    rpc_pack_error(&p.pk, 1, RPC_NOT_FOUND, NULL, NULL, 0);
    CHECK(dresp(&d, p.sb.data, p.sb.size) == 0);
    CHECK(rpc_str_eq(rpc_map_get(d.resp.error, "message"), ""));
    CHECK(rpc_str_eq(rpc_map_get(d.resp.error, "code"), "not_found"));
    dfini(&d);
    pk_fini(&p);

    /* requests */
    pk_init(&p);
    rpc_pack_request_begin(&p.pk, 7, "ping", false);
    CHECK(same_bytes(&p, S("\x94\x00\x07\xa4ping\x90")));
    CHECK(dreq(&d, p.sb.data, p.sb.size) == 0);
    CHECK(d.req.msgid == 7 && d.req.params == NULL);
    dfini(&d);
    pk_fini(&p);

    pk_init(&p);
    rpc_pack_request_begin(&p.pk, 8, "memory.search", true);
    msgpack_pack_map(&p.pk, 4);
    rpc_pack_kv_str(&p.pk, "content", "query");
    rpc_pack_kv_uint(&p.pk, "top_k", 5);
    rpc_pack_kv_num(&p.pk, "weight", 0.75);
    rpc_pack_cstr(&p.pk, "embedding");
    {
        float v[100];
        for (int i = 0; i < 100; i++)
            v[i] = (float)i / 3.0f - 7.0f;
        rpc_pack_vector(&p.pk, v, 100);
    }
    CHECK(dreq(&d, p.sb.data, p.sb.size) == 0);
    CHECK(d.req.method_len == 13 && memcmp(d.req.method, "memory.search", 13) == 0);
    {
        static const rpc_param sch[] = {
            {"content", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
            {"top_k", RPC_T_UINT, RPC_P_RANGE, 1, 100},
            {"weight", RPC_T_NUM, 0, 0, 0},
            {"embedding", RPC_T_VECTOR, RPC_P_RANGE, 100, 100},
        };
        const msgpack_object *out[4];
        char err[256];
        float v[100];
        bool same = true;
        CHECK(rpc_bind_params(d.req.params, sch, 4, out, err, sizeof(err)) == 0);
        CHECK(rpc_get_vector(out[3], "embedding", v, 100, err, sizeof(err)) == 0);
        for (int i = 0; i < 100; i++)
            same = same && v[i] == (float)i / 3.0f - 7.0f;
        CHECK(same);
        CHECK(rpc_get_num(out[2], 0) == 0.75);
    }
    dfini(&d);
    pk_fini(&p);

    /* vector bytes are little-endian float32 */
    pk_init(&p);
    {
        float v[2] = {1.0f, -2.0f};
        rpc_pack_vector(&p.pk, v, 2);
    }
    CHECK(same_bytes(&p, S("\xc4\x08\x00\x00\x80\x3f\x00\x00\x00\xc0")));
    pk_fini(&p);
    pk_init(&p);
    rpc_pack_vector(&p.pk, NULL, 0);
    CHECK(same_bytes(&p, S("\xc4\x00")));
    pk_fini(&p);

    /* kv helpers and nil strings */
    pk_init(&p);
    msgpack_pack_map(&p.pk, 3);
    rpc_pack_kv_bool(&p.pk, "b", false);
    rpc_pack_kv_str(&p.pk, "s", NULL);
    rpc_pack_kv_int(&p.pk, "i", 5);
    rpc_pack_cstr(&p.pk, NULL);
    CHECK(same_bytes(&p, S("\x83\xa1"
                           "b\xc2\xa1s\xc0\xa1i\x05\xc0")));
    pk_fini(&p);
}

/* RPC_P_ALIAS: another name of the parameter before it (seed 003's memory_type for type) */
static void test_bind_alias(void)
{
    static const rpc_param sch[] = {
        {"content", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
        {"type", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
        {"memory_type", RPC_T_STR, RPC_P_NULLABLE | RPC_P_ALIAS, 0, 0},
        {"kind", RPC_T_STR, RPC_P_NULLABLE | RPC_P_ALIAS, 0, 0},
        {"top_k", RPC_T_UINT, 0, 0, 0},
    };
    const msgpack_object *out[5];
    char err[256];
    struct {
        const char *keys[3], *vals[3];
        int rc;
        const char *type, *msg;
    } cases[] = {
        {{"content", "type"}, {"c", "fact"}, 0, "fact", NULL},
        {{"content", "memory_type"}, {"c", "fact"}, 0, "fact", NULL},
        {{"memory_type", "content"}, {"episode", "c"}, 0, "episode", NULL},
        {{"content", "kind"}, {"c", "fact"}, 0, "fact", NULL},
        {{"type", "memory_type", "content"}, {"fact", "fact", "c"}, 0, "fact", NULL},
        {{"content", "memory_type", "kind"}, {"c", "fact", "fact"}, 0, "fact", NULL},
        {{"type", "memory_type", "content"},
         {"fact", "episode", "c"},
         RPC_E_INVALID,
         NULL,
         "parameters 'type' and 'memory_type' name the same parameter and differ"},
        {{"memory_type", "type", "content"},
         {"fact", "episode", "c"},
         RPC_E_INVALID,
         NULL,
         "parameters 'memory_type' and 'type' name the same parameter and differ"},
        {{"content", "kind", "memory_type"},
         {"c", "fact", "episode"},
         RPC_E_INVALID,
         NULL,
         "parameters 'kind' and 'memory_type' name the same parameter and differ"},
        {{"content"}, {"c"}, RPC_E_INVALID, NULL, "missing required parameter 'type'"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        obj x;
        int n = 0;
        while (n < 3 && cases[k].keys[n])
            n++;
        pk_init(&x.p);
        msgpack_pack_map(&x.p.pk, (uint32_t)n);
        for (int i = 0; i < n; i++)
            rpc_pack_kv_str(&x.p.pk, cases[k].keys[i], cases[k].vals[i]);
        obj_unpack(&x);
        int rc = rpc_bind_params(&x.o, sch, 5, out, err, sizeof(err));
        CHECK_MSG(rc == cases[k].rc, "case %zu: %d %s", k, rc, rc ? err : "");
        if (rc == 0) {
            CHECK(rpc_str_eq(out[1], cases[k].type));
            CHECK(out[2] == NULL && out[3] == NULL); /* aliases bind to type */
        } else {
            CHECK_STR_CONTAINS(err, cases[k].msg);
        }
        obj_fini(&x);
    }
    /* a nil alias is absent, not a second value */
    obj x;
    pk_init(&x.p);
    msgpack_pack_map(&x.p.pk, 3);
    rpc_pack_kv_str(&x.p.pk, "content", "c");
    rpc_pack_kv_str(&x.p.pk, "type", "fact");
    rpc_pack_kv_nil(&x.p.pk, "memory_type");
    obj_unpack(&x);
    CHECK(rpc_bind_params(&x.o, sch, 5, out, err, sizeof(err)) == 0 && rpc_str_eq(out[1], "fact"));
    obj_fini(&x);
}

/* Unpacks the n bytes of b (one value) into u: the caller destroys u. */
static const msgpack_object *unpack_value(msgpack_unpacked *u, const char *b, size_t n)
{
    msgpack_unpacked_init(u);
    CHECK(msgpack_unpack_next(u, b, n, NULL) == MSGPACK_UNPACK_SUCCESS);
    return &u->data;
}

/* Limits set at start (settings) bound strings, containers and numbers; without one, plain
 * strings and containers have defaults; rpc_value_bytes is the value's encoded size. */
static void test_limits(void)
{
    double lim[4] = {0, 10, 40, 7};
    rpc_limits_set(lim, 4);
    CHECK(rpc_limit_value(1) == 10 && rpc_limit_value(3) == 7);
    CHECK(isinf(rpc_limit_value(0)) && isinf(rpc_limit_value(4)));
    const rpc_param s_lim = {"s", RPC_T_STR, RPC_P_RANGE | RPC_P_LIMIT(1), 1, 1e9};
    const rpc_param s_plain = {"e", RPC_T_STR, 0, 0, 0};
    const rpc_param m_lim = {"m", RPC_T_MAP, RPC_P_LIMIT(2), 0, 0};
    const rpc_param m_plain = {"m", RPC_T_MAP, 0, 0, 0};
    const rpc_param n_lim = {"n", RPC_T_UINT, RPC_P_RANGE | RPC_P_LIMIT(3), 1, 1e9};
    const rpc_param a_lim = {"a", RPC_T_STR_ARRAY, RPC_P_RANGE | RPC_P_LIMIT(3), 0, 5};
    CHECK(rpc_param_max(&s_lim) == 10 && rpc_param_max(&s_plain) == RPC_STR_MAX_DEFAULT);
    CHECK(rpc_param_max(&m_plain) == RPC_VALUE_MAX_DEFAULT && rpc_param_max(&m_lim) == 40);

    char err[256], buf[512];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
    /* strings: the limit replaces max; min stays */
    for (size_t n = 0; n <= 11; n++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        memset(buf, 'x', n);
        msgpack_pack_str_with_body(&pk, buf, n);
        int rc =
            rpc_check_param(unpack_value(&u, sb.data, sb.size), &s_lim, NULL, err, sizeof(err));
        CHECK_MSG(rc == (n >= 1 && n <= 10 ? 0 : RPC_E_INVALID), "length %zu", n);
        if (n == 11)
            CHECK_STR_CONTAINS(err, "parameter 's' must be between 1 and 10 bytes long");
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    /* a plain string: 256 bytes at most */
    for (size_t n = 256; n <= 257; n++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        memset(buf, 'e', n);
        msgpack_pack_str_with_body(&pk, buf, n);
        CHECK(rpc_check_param(unpack_value(&u, sb.data, sb.size), &s_plain, NULL, err,
                              sizeof(err)) == (n == 256 ? 0 : RPC_E_INVALID));
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    /* maps: bytes of the encoded value, which rpc_value_bytes counts exactly */
    for (size_t n = 20; n <= 40; n++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 1);
        msgpack_pack_str_with_body(&pk, "k", 1);
        memset(buf, 'v', n);
        msgpack_pack_str_with_body(&pk, buf, n); /* 1 + 2 + 1 + n bytes in all (n < 32) */
        const msgpack_object *o = unpack_value(&u, sb.data, sb.size);
        CHECK(rpc_value_bytes(o) == sb.size);
        CHECK(rpc_check_param(o, &m_lim, NULL, err, sizeof(err)) ==
              (sb.size <= 40 ? 0 : RPC_E_INVALID));
        if (sb.size > 40)
            CHECK_STR_CONTAINS(err, "must be at most 40 bytes");
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    /* numbers: the limit is the maximum */
    for (uint64_t v = 6; v <= 8; v++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_uint64(&pk, v);
        CHECK(rpc_check_param(unpack_value(&u, sb.data, sb.size), &n_lim, NULL, err, sizeof(err)) ==
              (v <= 7 ? 0 : RPC_E_INVALID));
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    /* arrays of strings: the limit bounds each string, the range the count */
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_str_with_body(&pk, "1234567", 7);
    msgpack_pack_str_with_body(&pk, "12345678", 8);
    CHECK(rpc_check_param(unpack_value(&u, sb.data, sb.size), &a_lim, NULL, err, sizeof(err)) ==
          RPC_E_INVALID);
    CHECK_STR_CONTAINS(err, "parameter 'a[1]' must be at most 7 bytes long");
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    /* rpc_value_bytes against the packer, over every header width */
    const size_t lens[] = {0, 15, 16, 31, 32, 255, 256, 65535, 65536};
    char *big = malloc(65536);
    CHECK(big != NULL);
    memset(big, 'b', 65536);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, (uint32_t)(lens[i] % 20 + 1));
        msgpack_pack_str_with_body(&pk, big, lens[i]);
        msgpack_pack_bin_with_body(&pk, big, lens[i]);
        msgpack_pack_int64(&pk, -(int64_t)lens[i] * 1000003);
        msgpack_pack_uint64(&pk, (uint64_t)lens[i] * 100000007u);
        msgpack_pack_double(&pk, 0.5);
        msgpack_pack_float(&pk, 0.5f);
        msgpack_pack_nil(&pk);
        for (size_t k = 7; k < lens[i] % 20 + 1; k++)
            msgpack_pack_true(&pk);
        if (lens[i] % 20 + 1 < 7) { /* keep the array's declared count right */
            msgpack_sbuffer_destroy(&sb);
            continue;
        }
        CHECK_MSG(rpc_value_bytes(unpack_value(&u, sb.data, sb.size)) == sb.size, "length %zu",
                  lens[i]);
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    free(big);
    rpc_limits_set(NULL, 0);
}

/* RPC_T_TIME: ms or RFC 3339, parsed to ms since the epoch. */
static void test_time(void)
{
    int64_t ms = -1;
    CHECK(rpc_time_parse("1970-01-01T00:00:00Z", 20, &ms) == 0 && ms == 0);
    CHECK(rpc_time_parse("2026-02-24T10:00:00Z", 20, &ms) == 0 && ms == 1771927200000LL);
    const char *frac = "2026-02-24T10:00:00.1239z";
    CHECK(rpc_time_parse(frac, strlen(frac), &ms) == 0 && ms == 1771927200123LL);
    const char *off = "2026-02-24T12:30:00+02:30";
    CHECK(rpc_time_parse(off, strlen(off), &ms) == 0 && ms == 1771927200000LL);
    const char *neg = "2026-02-24 09:00:00-01:00";
    CHECK(rpc_time_parse(neg, strlen(neg), &ms) == 0 && ms == 1771927200000LL);
    const char *leap = "2024-02-29T00:00:00Z";
    CHECK(rpc_time_parse(leap, strlen(leap), &ms) == 0 && ms == 1709164800000LL);
    static const char *const bad[] = {"2026-02-24",
                                      "2026-02-24T10:00:00",
                                      "2026-02-30T10:00:00Z",
                                      "2025-02-29T00:00:00Z",
                                      "2026-13-01T00:00:00Z",
                                      "2026-02-24T24:00:00Z",
                                      "2026-02-24T10:00:60Z",
                                      "2026-02-24T10:00:00.Z",
                                      "2026-02-24T10:00:00+0200",
                                      "2026-02-24T10:00:00Zx",
                                      "yesterday",
                                      "2026/02/24T10:00:00Z"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(rpc_time_parse(bad[i], strlen(bad[i]), &ms) == -EINVAL);
    /* the binder: a number, a string, and what it refuses */
    char err[256];
    msgpack_object num = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = 5};
    msgpack_object str = {.type = MSGPACK_OBJECT_STR, .via.str = {20, "2026-02-24T10:00:00Z"}};
    msgpack_object pre = {.type = MSGPACK_OBJECT_STR, .via.str = {20, "1969-12-31T23:59:59Z"}};
    msgpack_object junk = {.type = MSGPACK_OBJECT_STR, .via.str = {3, "now"}};
    msgpack_object flt = {.type = MSGPACK_OBJECT_FLOAT64, .via.f64 = 1.5};
    CHECK(rpc_check_value(&num, RPC_T_TIME, 0, 0, 0, "since", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&str, RPC_T_TIME, 0, 0, 0, "since", err, sizeof(err)) == 0);
    CHECK(rpc_check_value(&pre, RPC_T_TIME, 0, 0, 0, "since", err, sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_check_value(&junk, RPC_T_TIME, 0, 0, 0, "since", err, sizeof(err)) == RPC_E_INVALID &&
          strstr(err, "RFC 3339") && strstr(err, "'since'"));
    CHECK(rpc_check_value(&flt, RPC_T_TIME, 0, 0, 0, "since", err, sizeof(err)) == RPC_E_INVALID);
    CHECK(rpc_get_time(&str, -1) == 1771927200000LL && rpc_get_time(&num, -1) == 5 &&
          rpc_get_time(NULL, -1) == -1);
}

int main(void)
{
    test_basics();
    test_utf8();
    test_scan_complete();
    test_scan_hostile();
    test_scan_linear();
    test_decode();
    test_bind_types();
    test_bind_map();
    test_bind_alias();
    test_limits();
    test_getters();
    test_check_value();
    test_time();
    test_encode();
    CHECK_RETURN();
}
