/* proto/rpc.c: MessagePack-RPC framing, bounded decoding, parameter binding and encoding. */
#include "rpc.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

_Static_assert(sizeof(float) == sizeof(uint32_t), "float must be 32 bits");
_Static_assert(FLT_MANT_DIG == 24 && FLT_MAX_EXP == 128, "float must be IEEE 754 binary32");

/* msgpack-c's unpacker has a fixed stack of this many containers (empty ones included). */
#define MSGPACK_C_MAX_DEPTH 32

/* Longest client-supplied name quoted in an error message. */
#define QUOTE_MAX 64

PRINTF_LIKE(3, 4)
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Writes a printable, bounded rendering of client bytes s into out (outlen >= 4 * QUOTE_MAX + 8):
 * printable ASCII as is, everything else as \xNN, cut after QUOTE_MAX bytes with "...". */
static const char *quote(const char *s, size_t n, char *out, size_t outlen)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0; i < n && i < QUOTE_MAX && o + 5 < outlen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (n > QUOTE_MAX && o + 4 < outlen) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* Formats a schema bound for a message: integral values exactly, others with %g. */
static const char *fmt_bound(double d, char *buf, size_t n)
{
    if (d == floor(d) && fabs(d) < 9007199254740992.0)
        snprintf(buf, n, "%.0f", d);
    else
        snprintf(buf, n, "%g", d);
    return buf;
}

const char *rpc_code_name(rpc_code code)
{
    static const char *const names[RPC_CODE_COUNT] = {
        [RPC_OK] = "ok",
        [RPC_INVALID_ARGUMENT] = "invalid_argument",
        [RPC_MALFORMED_REQUEST] = "malformed_request",
        [RPC_UNKNOWN_METHOD] = "unknown_method",
        [RPC_UNAUTHENTICATED] = "unauthenticated",
        [RPC_PERMISSION_DENIED] = "permission_denied",
        [RPC_NOT_FOUND] = "not_found",
        [RPC_ALREADY_EXISTS] = "already_exists",
        [RPC_CONFLICT] = "conflict",
        [RPC_QUOTA_EXCEEDED] = "quota_exceeded",
        [RPC_RATE_LIMITED] = "rate_limited",
        [RPC_COST_LIMIT_EXCEEDED] = "cost_limit_exceeded",
        [RPC_UNAVAILABLE] = "unavailable",
        [RPC_INTERNAL] = "internal",
    };

    if ((unsigned)code >= RPC_CODE_COUNT)
        return "internal";
    return names[code];
}

void rpc_limits_default(rpc_limits *lim)
{
    lim->max_message = (size_t)16 << 20;
    lim->max_depth = 32;
    lim->max_objects = (size_t)4 << 20;
}

bool rpc_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;

    while (i < n) {
        unsigned char c = s[i];
        unsigned char lo = 0x80, hi = 0xbf;
        size_t extra;

        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            extra = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            extra = 2;
            if (c == 0xe0)
                lo = 0xa0; /* overlong */
            else if (c == 0xed)
                hi = 0x9f; /* UTF-16 surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            extra = 3;
            if (c == 0xf0)
                lo = 0x90; /* overlong */
            else if (c == 0xf4)
                hi = 0x8f; /* past U+10FFFF */
        } else {
            return false; /* continuation byte, overlong lead C0/C1, or F5..FF */
        }
        if (n - i <= extra)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t k = 2; k <= extra; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xbf)
                return false;
        i += extra + 1;
    }
    return true;
}

/* ---- framing ---------------------------------------------------------------------- */

/* Where a scan stopped. The invariants between calls: every value before pos has been
 * accounted for; stack[d] is how many values container d still owes; need is the sum of
 * the stack (each owed value takes at least one byte and counts as at least one object),
 * so pos + need never passes max_message and objects + need never passes max_objects. */
struct scan_state {
    uint64_t pos;     /* next header; may pass len while a payload is still arriving */
    uint64_t objects; /* values seen so far */
    uint64_t need;    /* values still owed by the open containers */
    unsigned depth;   /* open containers */
    bool started;     /* the top-level value's header has been read */
};

struct rpc_scanner {
    rpc_limits lim;
    struct scan_state st;
    uint64_t stack[]; /* lim.max_depth entries */
};

static uint64_t be_read(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The shape of one value header: hdr bytes of header (type byte, then a big-endian length
 * or count field of lenbytes bytes, then ext's type byte), followed either by opaque bytes
 * (a number's body, a fixext's data, or the declared length of a str, bin or ext) or, for
 * a container, by its elements. */
struct header {
    unsigned hdr;      /* header bytes including the type byte */
    unsigned lenbytes; /* width of the big-endian length/count field after the type byte */
    uint64_t payload;  /* fixed payload length (numbers, fixext) */
    int kind;          /* 0 scalar or opaque, 1 array, 2 map */
    uint64_t count;    /* fixarray/fixmap count */
    const char *what;  /* name for messages */
};

/* Classifies type byte b. Returns false for the reserved byte 0xc1. */
static bool classify(uint8_t b, struct header *h)
{
    memset(h, 0, sizeof(*h));
    h->hdr = 1;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        h->what = "scalar";
        return true;
    }
    if (b <= 0x8f) {
        h->kind = 2;
        h->count = b & 0x0f;
        h->what = "map";
        return true;
    }
    if (b <= 0x9f) {
        h->kind = 1;
        h->count = b & 0x0f;
        h->what = "array";
        return true;
    }
    if (b <= 0xbf) {
        h->payload = b & 0x1f;
        h->what = "string";
        return true;
    }
    switch (b) {
    case 0xc4: /* bin 8/16/32 */
    case 0xc5:
    case 0xc6:
        h->lenbytes = 1u << (b - 0xc4);
        h->hdr = 1 + h->lenbytes;
        h->what = "binary";
        return true;
    case 0xc7: /* ext 8/16/32: length, then a type byte */
    case 0xc8:
    case 0xc9:
        h->lenbytes = 1u << (b - 0xc7);
        h->hdr = 2 + h->lenbytes;
        h->what = "extension";
        return true;
    case 0xca:
        h->payload = 4;
        h->what = "float";
        return true;
    case 0xcb:
        h->payload = 8;
        h->what = "float";
        return true;
    case 0xcc: /* uint 8..64 */
    case 0xcd:
    case 0xce:
    case 0xcf:
        h->payload = 1u << (b - 0xcc);
        h->what = "integer";
        return true;
    case 0xd0: /* int 8..64 */
    case 0xd1:
    case 0xd2:
    case 0xd3:
        h->payload = 1u << (b - 0xd0);
        h->what = "integer";
        return true;
    case 0xd4: /* fixext 1..16: type byte, then data */
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        h->hdr = 2;
        h->payload = 1u << (b - 0xd4);
        h->what = "extension";
        return true;
    case 0xd9: /* str 8/16/32 */
    case 0xda:
    case 0xdb:
        h->lenbytes = 1u << (b - 0xd9);
        h->hdr = 1 + h->lenbytes;
        h->what = "string";
        return true;
    case 0xdc: /* array 16/32 */
    case 0xdd:
        h->kind = 1;
        h->lenbytes = 2u << (b - 0xdc);
        h->hdr = 1 + h->lenbytes;
        h->what = "array";
        return true;
    case 0xde: /* map 16/32 */
    case 0xdf:
        h->kind = 2;
        h->lenbytes = 2u << (b - 0xde);
        h->hdr = 1 + h->lenbytes;
        h->what = "map";
        return true;
    default: /* 0xc1 */
        return false;
    }
}

static void scan_state_reset(struct scan_state *st)
{
    memset(st, 0, sizeof(*st));
}

/* The scanner proper, shared by rpc_scanner and rpc_decode_*'s own structural check.
 * stack has lim->max_depth entries. Work per call is proportional to the headers read in
 * that call plus one re-read of a header that was cut short (at most 9 bytes). */
static int scan(struct scan_state *st, uint64_t *stack, const rpc_limits *lim, const uint8_t *buf,
                size_t len, size_t *msg_len, char *err, size_t errlen)
{
    /* Clamped so that pos + need + a header can never wrap, whatever limits were given. */
    const uint64_t max_msg = lim->max_message < UINT64_MAX / 4 ? lim->max_message : UINT64_MAX / 4;
    const uint64_t max_obj = lim->max_objects < UINT64_MAX / 4 ? lim->max_objects : UINT64_MAX / 4;

    for (;;) {
        struct header h;
        uint64_t at = st->pos, n, end, values;

        if (st->pos > len)
            return RPC_E_INCOMPLETE; /* a payload is still arriving */
        if (st->started && st->depth == 0) {
            *msg_len = (size_t)st->pos;
            scan_state_reset(st);
            return 0;
        }
        if (st->pos == len)
            return RPC_E_INCOMPLETE;
        if (!classify(buf[at], &h)) {
            set_err(err, errlen, "reserved byte 0xc1 at offset %llu", (unsigned long long)at);
            return RPC_E_MALFORMED;
        }
        if (len - at < h.hdr)
            return RPC_E_INCOMPLETE; /* re-read the whole header next time */
        n = h.lenbytes ? be_read(buf + at + 1, h.lenbytes) : 0;

        /* This value settles one of the values its parent owes. */
        if (st->depth > 0) {
            stack[st->depth - 1]--;
            st->need--;
        }
        if (st->objects + 1 + st->need > max_obj) {
            set_err(err, errlen, "more than %llu objects in one message",
                    (unsigned long long)max_obj);
            return RPC_E_TOO_MANY;
        }
        st->objects++;

        end = at + h.hdr; /* cannot overflow: at <= len and hdr <= 9 */
        if (h.kind == 0) {
            uint64_t body = h.lenbytes ? n : h.payload;
            if (body > max_msg || end + st->need > max_msg - body) {
                set_err(err, errlen,
                        "%s of %llu bytes at offset %llu does not fit in a message of at most "
                        "%llu bytes",
                        h.what, (unsigned long long)body, (unsigned long long)at,
                        (unsigned long long)max_msg);
                return RPC_E_TOO_LARGE;
            }
            end += body;
            values = 0;
        } else {
            uint64_t count = h.lenbytes ? n : h.count;
            values = h.kind == 2 ? 2 * count : count; /* count < 2^32: no overflow */
            if (end + st->need > max_msg || values > max_msg - end - st->need) {
                set_err(err, errlen,
                        "%s of %llu %s at offset %llu does not fit in a message of at most %llu "
                        "bytes",
                        h.what, (unsigned long long)count, h.kind == 2 ? "entries" : "elements",
                        (unsigned long long)at, (unsigned long long)max_msg);
                return RPC_E_TOO_LARGE;
            }
            if (values > max_obj - st->objects - st->need) {
                set_err(err, errlen,
                        "%s of %llu %s at offset %llu passes the limit of %llu objects in one "
                        "message",
                        h.what, (unsigned long long)count, h.kind == 2 ? "entries" : "elements",
                        (unsigned long long)at, (unsigned long long)max_obj);
                return RPC_E_TOO_MANY;
            }
            if (st->depth >= lim->max_depth) {
                set_err(err, errlen, "nesting deeper than %u at offset %llu", lim->max_depth,
                        (unsigned long long)at);
                return RPC_E_TOO_DEEP;
            }
            if (values > 0) {
                stack[st->depth++] = values;
                st->need += values;
            }
        }
        st->pos = end;
        st->started = true;
        while (st->depth > 0 && stack[st->depth - 1] == 0)
            st->depth--;
    }
}

rpc_scanner *rpc_scanner_create(const rpc_limits *lim)
{
    rpc_limits l;
    rpc_scanner *s;

    if (lim != NULL)
        l = *lim;
    else
        rpc_limits_default(&l);
    /* max_depth is an unsigned int: 8 * UINT_MAX cannot overflow a 64-bit size_t */
    s = malloc(sizeof(*s) + (size_t)l.max_depth * sizeof(uint64_t));
    if (s == NULL)
        return NULL;
    s->lim = l;
    scan_state_reset(&s->st);
    return s;
}

void rpc_scanner_destroy(rpc_scanner *s)
{
    free(s);
}

void rpc_scanner_reset(rpc_scanner *s)
{
    scan_state_reset(&s->st);
}

int rpc_scanner_scan(rpc_scanner *s, const uint8_t *buf, size_t len, size_t *msg_len, char *err,
                     size_t errlen)
{
    int rc = scan(&s->st, s->stack, &s->lim, buf, len, msg_len, err, errlen);
    if (rc != 0 && rc != RPC_E_INCOMPLETE)
        scan_state_reset(&s->st);
    return rc;
}

/* ---- decoding ---------------------------------------------------------------------- */

static const char *obj_type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "string";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_BIN:
        return "binary";
    case MSGPACK_OBJECT_EXT:
        return "extension";
    }
    return "unknown value";
}

/* Reads a msgpack integer at m[*p] (any width, signed or unsigned encoding). */
static bool peek_int(const uint8_t *m, size_t len, size_t *p, bool *neg, uint64_t *mag)
{
    size_t at = *p;
    uint8_t b;
    unsigned w;

    if (at >= len)
        return false;
    b = m[at];
    if (b <= 0x7f || b >= 0xe0) {
        *neg = b >= 0xe0;
        *mag = *neg ? (uint64_t)(0x100 - b) : b;
        *p = at + 1;
        return true;
    }
    if (b >= 0xcc && b <= 0xcf) {
        w = 1u << (b - 0xcc);
        if (len - at - 1 < w)
            return false;
        *neg = false;
        *mag = be_read(m + at + 1, w);
    } else if (b >= 0xd0 && b <= 0xd3) {
        uint64_t v, sign;
        w = 1u << (b - 0xd0);
        if (len - at - 1 < w)
            return false;
        v = be_read(m + at + 1, w);
        sign = (uint64_t)1 << (8 * w - 1);
        *neg = (v & sign) != 0;
        /* two's complement magnitude within w bytes */
        *mag = *neg ? ((~v + 1) & (sign | (sign - 1))) : v;
    } else {
        return false;
    }
    *p = at + 1 + w;
    return true;
}

bool rpc_peek_msgid(const uint8_t *m, size_t len, uint32_t *id)
{
    uint64_t count, mag;
    size_t p;
    bool neg;

    if (len < 1)
        return false;
    if ((m[0] & 0xf0) == 0x90) {
        count = m[0] & 0x0f;
        p = 1;
    } else if (m[0] == 0xdc && len >= 3) {
        count = be_read(m + 1, 2);
        p = 3;
    } else if (m[0] == 0xdd && len >= 5) {
        count = be_read(m + 1, 4);
        p = 5;
    } else {
        return false;
    }
    if (count < 2 || !peek_int(m, len, &p, &neg, &mag) || mag != 0)
        return false;
    if (!peek_int(m, len, &p, &neg, &mag) || neg || mag > UINT32_MAX)
        return false;
    *id = (uint32_t)mag;
    return true;
}

/* Checks that msg is exactly one MessagePack value that msgpack-c can unpack without
 * allocating from an implausible declared count, then unpacks it into zone. */
static int unpack_checked(const uint8_t *msg, size_t len, msgpack_zone *zone, msgpack_object *root,
                          char *err, size_t errlen)
{
    /* Bound counts by the bytes actually present and depth by msgpack-c's own stack, so
     * this is safe even on bytes that never went through a scanner. */
    rpc_limits lim = {.max_message = len, .max_depth = MSGPACK_C_MAX_DEPTH, .max_objects = len};
    uint64_t stack[MSGPACK_C_MAX_DEPTH];
    struct scan_state st;
    char why[160] = "";
    size_t mlen = 0, off = 0;
    int rc;

    if (zone == NULL)
        return -EINVAL;
    if (len == 0) {
        set_err(err, errlen, "empty message");
        return RPC_E_MALFORMED;
    }
    scan_state_reset(&st);
    rc = scan(&st, stack, &lim, msg, len, &mlen, why, sizeof(why));
    if (rc == RPC_E_INCOMPLETE) {
        set_err(err, errlen, "truncated message");
        return RPC_E_MALFORMED;
    }
    if (rc == RPC_E_TOO_LARGE || rc == RPC_E_TOO_MANY) {
        /* against these limits that means a declared length runs past the end */
        set_err(err, errlen, "truncated message: %s", why);
        return RPC_E_MALFORMED;
    }
    if (rc != 0) {
        set_err(err, errlen, "invalid MessagePack: %s", why);
        return RPC_E_MALFORMED;
    }
    if (mlen != len) {
        set_err(err, errlen, "%zu trailing bytes after the message", len - mlen);
        return RPC_E_MALFORMED;
    }
    switch (msgpack_unpack((const char *)msg, len, &off, zone, root)) {
    case MSGPACK_UNPACK_SUCCESS:
        return 0;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        return -ENOMEM; /* depth and counts were checked above: this is a real failure */
    default:            /* unreachable after the scan; kept so a msgpack-c change cannot slip by */
        set_err(err, errlen, "invalid MessagePack");
        return RPC_E_MALFORMED;
    }
}

static bool get_msgid(const msgpack_object *o, uint32_t *id)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
        return false;
    *id = (uint32_t)o->via.u64;
    return true;
}

static int check_method(const msgpack_object *o, char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_STR) {
        set_err(err, errlen, "method must be a string, not %s", obj_type_name(o));
        return RPC_E_MALFORMED;
    }
    if (o->via.str.size < 1 || o->via.str.size > 255) {
        set_err(err, errlen, "method name must be 1 to 255 bytes long, not %u", o->via.str.size);
        return RPC_E_MALFORMED;
    }
    if (!rpc_utf8_valid(o->via.str.ptr, o->via.str.size)) {
        set_err(err, errlen, "method name is not valid UTF-8");
        return RPC_E_MALFORMED;
    }
    return 0;
}

static int check_params(const msgpack_object *o, const msgpack_object **params, char *err,
                        size_t errlen)
{
    const msgpack_object *m;

    if (o->type != MSGPACK_OBJECT_ARRAY) {
        set_err(err, errlen, "params must be [] or [map], not %s", obj_type_name(o));
        return RPC_E_MALFORMED;
    }
    if (o->via.array.size == 0) {
        *params = NULL;
        return 0;
    }
    if (o->via.array.size != 1) {
        set_err(err, errlen, "params must be [] or [map], not an array of %u elements",
                o->via.array.size);
        return RPC_E_MALFORMED;
    }
    m = &o->via.array.ptr[0];
    if (m->type != MSGPACK_OBJECT_MAP) {
        set_err(err, errlen, "params must be [] or [map], not [%s]", obj_type_name(m));
        return RPC_E_MALFORMED;
    }
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) {
            set_err(err, errlen, "parameter names must be strings, not %s", obj_type_name(k));
            return RPC_E_MALFORMED;
        }
    }
    *params = m;
    return 0;
}

int rpc_decode_request(const uint8_t *msg, size_t len, msgpack_zone *zone, rpc_request *out,
                       bool *msgid_known, char *err, size_t errlen)
{
    msgpack_object root;
    const msgpack_object *a;
    uint32_t n, id;
    uint64_t kind;
    int rc;

    memset(out, 0, sizeof(*out));
    if (msgid_known != NULL)
        *msgid_known = false;
    if (rpc_peek_msgid(msg, len, &id)) {
        out->msgid = id;
        if (msgid_known != NULL)
            *msgid_known = true;
    }
    rc = unpack_checked(msg, len, zone, &root, err, errlen);
    if (rc != 0)
        return rc;
    if (root.type != MSGPACK_OBJECT_ARRAY) {
        set_err(err, errlen, "message must be an array, not %s", obj_type_name(&root));
        return RPC_E_MALFORMED;
    }
    n = root.via.array.size;
    a = root.via.array.ptr;
    if (n == 0 || a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        set_err(err, errlen, "message must start with its kind, 0 (request) or 2 (notification)");
        return RPC_E_MALFORMED;
    }
    kind = a[0].via.u64;
    if (kind == RPC_KIND_RESPONSE) {
        set_err(err, errlen, "message kind 1 (response) is not a request");
        return RPC_E_MALFORMED;
    }
    if (kind == RPC_KIND_REQUEST) {
        if (n != 4) {
            set_err(err, errlen, "request must be an array of 4 elements, not %u", n);
            return RPC_E_MALFORMED;
        }
        if (!get_msgid(&a[1], &out->msgid)) {
            set_err(err, errlen, "msgid must be an unsigned 32-bit integer");
            return RPC_E_MALFORMED;
        }
        a++;
    } else if (kind == RPC_KIND_NOTIFY) {
        if (n != 3) {
            set_err(err, errlen, "notification must be an array of 3 elements, not %u", n);
            return RPC_E_MALFORMED;
        }
        out->msgid = 0;
    } else {
        set_err(err, errlen, "unknown message kind %llu", (unsigned long long)kind);
        return RPC_E_MALFORMED;
    }
    out->kind = (int)kind;
    rc = check_method(&a[1], err, errlen);
    if (rc == 0)
        rc = check_params(&a[2], &out->params, err, errlen);
    if (rc != 0) {
        out->params = NULL;
        return rc;
    }
    out->method = a[1].via.str.ptr;
    out->method_len = a[1].via.str.size;
    return 0;
}

int rpc_decode_response(const uint8_t *msg, size_t len, msgpack_zone *zone, rpc_response *out,
                        char *err, size_t errlen)
{
    msgpack_object root;
    const msgpack_object *a;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = unpack_checked(msg, len, zone, &root, err, errlen);
    if (rc != 0)
        return rc;
    if (root.type != MSGPACK_OBJECT_ARRAY) {
        set_err(err, errlen, "message must be an array, not %s", obj_type_name(&root));
        return RPC_E_MALFORMED;
    }
    a = root.via.array.ptr;
    if (root.via.array.size == 0 || a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        a[0].via.u64 != RPC_KIND_RESPONSE) {
        set_err(err, errlen, "message must start with kind 1 (response)");
        return RPC_E_MALFORMED;
    }
    if (root.via.array.size != 4) {
        set_err(err, errlen, "response must be an array of 4 elements, not %u",
                root.via.array.size);
        return RPC_E_MALFORMED;
    }
    if (!get_msgid(&a[1], &out->msgid)) {
        set_err(err, errlen, "msgid must be an unsigned 32-bit integer");
        return RPC_E_MALFORMED;
    }
    if (a[2].type != MSGPACK_OBJECT_NIL && a[2].type != MSGPACK_OBJECT_MAP) {
        set_err(err, errlen, "error must be nil or a map, not %s", obj_type_name(&a[2]));
        return RPC_E_MALFORMED;
    }
    out->error = a[2].type == MSGPACK_OBJECT_NIL ? NULL : &a[2];
    out->result = a[3].type == MSGPACK_OBJECT_NIL ? NULL : &a[3];
    return 0;
}

/* ---- parameter binding --------------------------------------------------------------- */

/* Nesting beyond which a value is refused by the deep checks (msgpack-c stops at 32). */
#define CHECK_MAX_DEPTH 64

static const char *type_desc(rpc_type t)
{
    switch (t) {
    case RPC_T_ANY:
        return "a value";
    case RPC_T_BOOL:
        return "a boolean";
    case RPC_T_UINT:
        return "an unsigned integer";
    case RPC_T_INT:
        return "an integer";
    case RPC_T_NUM:
        return "a number";
    case RPC_T_STR:
        return "a string";
    case RPC_T_BIN:
        return "a binary";
    case RPC_T_ARRAY:
        return "an array";
    case RPC_T_MAP:
        return "a map";
    case RPC_T_VECTOR:
        return "a vector (bin of float32 or array of numbers)";
    case RPC_T_STR_ARRAY:
        return "an array of strings";
    case RPC_T_UINT_ARRAY:
        return "an array of unsigned integers";
    }
    return "a value of a known type";
}

/* Reports a range failure: "parameter 'x' <verb> between A and B<unit>", or "at least A" /
 * "at most B" when one side is infinite. */
static int range_err(const char *what, const char *verb, double min, double max, const char *unit,
                     char *err, size_t errlen)
{
    char a[40], b[40];

    if (isinf(max) && max > 0)
        set_err(err, errlen, "parameter '%s' %s at least %s%s", what, verb,
                fmt_bound(min, a, sizeof(a)), unit);
    else if (isinf(min) && min < 0)
        set_err(err, errlen, "parameter '%s' %s at most %s%s", what, verb,
                fmt_bound(max, b, sizeof(b)), unit);
    else
        set_err(err, errlen, "parameter '%s' %s between %s and %s%s", what, verb,
                fmt_bound(min, a, sizeof(a)), fmt_bound(max, b, sizeof(b)), unit);
    return RPC_E_INVALID;
}

/* Exact range tests for integers: comparing through double would misjudge values past 2^53. */
static bool u64_in_range(uint64_t u, double min, double max)
{
    if (min > 0) {
        if (min >= 0x1p64)
            return false;
        if (u < (uint64_t)ceil(min))
            return false;
    }
    if (max < 0)
        return false;
    if (max < 0x1p64 && u > (uint64_t)floor(max))
        return false;
    return true;
}

static bool i64_in_range(int64_t v, double min, double max)
{
    if (min > -0x1p63) {
        if (min >= 0x1p63)
            return false;
        if (v < (int64_t)ceil(min))
            return false;
    }
    if (max < 0x1p63) {
        if (max < -0x1p63)
            return false;
        if (v > (int64_t)floor(max))
            return false;
    }
    return true;
}

static bool count_in_range(size_t n, double min, double max)
{
    return (double)n >= min && (double)n <= max;
}

/* Checks a string's bytes: valid UTF-8 without U+0000 (C strings and PostgreSQL text and
 * jsonb cannot hold it). Returns NULL or what is wrong. */
static const char *str_problem(const char *s, size_t n)
{
    if (!rpc_utf8_valid(s, n))
        return "is not valid UTF-8";
    if (n > 0 && memchr(s, '\0', n) != NULL)
        return "contains a NUL character";
    return NULL;
}

/* Walks a free-form value and checks every string in it (keys too); refuses ext values. */
static int deep_check(const msgpack_object *o, unsigned depth, const char *what, char *err,
                      size_t errlen)
{
    const char *bad;

    if (depth > CHECK_MAX_DEPTH) {
        set_err(err, errlen, "parameter '%s' is nested too deeply", what);
        return RPC_E_INVALID;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        bad = str_problem(o->via.str.ptr, o->via.str.size);
        if (bad != NULL) {
            set_err(err, errlen, "parameter '%s' holds a string that %s", what, bad);
            return RPC_E_INVALID;
        }
        return 0;
    case MSGPACK_OBJECT_ARRAY:
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            int rc = deep_check(&o->via.array.ptr[i], depth + 1, what, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    case MSGPACK_OBJECT_MAP:
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            int rc = deep_check(&o->via.map.ptr[i].key, depth + 1, what, err, errlen);
            if (rc == 0)
                rc = deep_check(&o->via.map.ptr[i].val, depth + 1, what, err, errlen);
            if (rc != 0)
                return rc;
        }
        return 0;
    case MSGPACK_OBJECT_EXT:
        /* The scanner lets ext through as valid MessagePack; no Engram parameter uses it. */
        set_err(err, errlen, "parameter '%s' holds an extension value, which is not supported",
                what);
        return RPC_E_INVALID;
    default:
        return 0;
    }
}

/* Reads one little-endian float32 from p. */
static float le_float(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Reads a vector element of array form as a double: 0, 1 when it is not a number, 2 when
 * it is not finite or has no float32 value. */
static int vec_elem(const msgpack_object *e, double *d)
{
    switch (e->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *d = (double)e->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *d = (double)e->via.i64;
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *d = e->via.f64;
        break;
    default:
        return 1;
    }
    if (!isfinite(*d) || fabs(*d) > FLT_MAX)
        return 2;
    return 0;
}

static int check_vector(const msgpack_object *o, unsigned flags, double min, double max,
                        const char *what, char *err, size_t errlen)
{
    size_t dim;

    if (o->type == MSGPACK_OBJECT_BIN) {
        const uint8_t *p = (const uint8_t *)o->via.bin.ptr;
        if (o->via.bin.size % 4 != 0) {
            set_err(err, errlen,
                    "parameter '%s' must be a vector: binary length %u is not a multiple of 4",
                    what, o->via.bin.size);
            return RPC_E_INVALID;
        }
        dim = o->via.bin.size / 4;
        for (size_t i = 0; i < dim; i++) {
            if (!isfinite(le_float(p + 4 * i))) {
                set_err(err, errlen, "parameter '%s' holds a NaN or infinity at index %zu", what,
                        i);
                return RPC_E_INVALID;
            }
        }
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        dim = o->via.array.size;
        for (size_t i = 0; i < dim; i++) {
            double d;
            int rc = vec_elem(&o->via.array.ptr[i], &d);
            if (rc == 1) {
                set_err(err, errlen, "parameter '%s' must be %s: element %zu is %s", what,
                        type_desc(RPC_T_VECTOR), i, obj_type_name(&o->via.array.ptr[i]));
                return RPC_E_INVALID;
            }
            if (rc == 2) {
                set_err(err, errlen,
                        "parameter '%s' holds a NaN, infinity or value out of float32 range at "
                        "index %zu",
                        what, i);
                return RPC_E_INVALID;
            }
        }
    } else {
        set_err(err, errlen, "parameter '%s' must be %s", what, type_desc(RPC_T_VECTOR));
        return RPC_E_INVALID;
    }
    if (dim == 0) {
        set_err(err, errlen, "parameter '%s' must be a vector of at least 1 dimension", what);
        return RPC_E_INVALID;
    }
    if ((flags & RPC_P_RANGE) && !count_in_range(dim, min, max))
        return range_err(what, "must have", min, max, " dimensions", err, errlen);
    return 0;
}

int rpc_check_value(const msgpack_object *o, rpc_type type, unsigned flags, double min, double max,
                    const char *what, char *err, size_t errlen)
{
    const bool ranged = (flags & RPC_P_RANGE) != 0;
    const char *bad;
    double d;

    if (what == NULL)
        what = "?";
    if (o == NULL) {
        set_err(err, errlen, "missing parameter '%s'", what);
        return RPC_E_INVALID;
    }
    if (o->type == MSGPACK_OBJECT_NIL && (flags & RPC_P_NULLABLE))
        return 0;

    switch (type) {
    case RPC_T_ANY:
        return deep_check(o, 0, what, err, errlen);
    case RPC_T_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            goto wrong_type;
        return 0;
    case RPC_T_UINT:
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            goto wrong_type;
        if (ranged && !u64_in_range(o->via.u64, min, max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    case RPC_T_INT:
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            if (o->via.u64 > INT64_MAX) {
                set_err(err, errlen, "parameter '%s' must be an integer that fits 64 bits", what);
                return RPC_E_INVALID;
            }
        } else if (o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            goto wrong_type;
        }
        if (ranged && !i64_in_range(o->via.i64, min, max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    case RPC_T_NUM:
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            if (ranged && !u64_in_range(o->via.u64, min, max))
                return range_err(what, "must be", min, max, "", err, errlen);
            return 0;
        }
        if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            if (ranged && !i64_in_range(o->via.i64, min, max))
                return range_err(what, "must be", min, max, "", err, errlen);
            return 0;
        }
        if (o->type != MSGPACK_OBJECT_FLOAT32 && o->type != MSGPACK_OBJECT_FLOAT64)
            goto wrong_type;
        d = o->via.f64;
        if (!isfinite(d)) {
            set_err(err, errlen, "parameter '%s' must be a finite number", what);
            return RPC_E_INVALID;
        }
        if (ranged && !(d >= min && d <= max))
            return range_err(what, "must be", min, max, "", err, errlen);
        return 0;
    case RPC_T_STR:
        if (o->type != MSGPACK_OBJECT_STR)
            goto wrong_type;
        bad = str_problem(o->via.str.ptr, o->via.str.size);
        if (bad != NULL) {
            set_err(err, errlen, "parameter '%s' %s", what, bad);
            return RPC_E_INVALID;
        }
        if (ranged && !count_in_range(o->via.str.size, min, max))
            return range_err(what, "must be", min, max, " bytes long", err, errlen);
        return 0;
    case RPC_T_BIN:
        if (o->type != MSGPACK_OBJECT_BIN)
            goto wrong_type;
        if (ranged && !count_in_range(o->via.bin.size, min, max))
            return range_err(what, "must be", min, max, " bytes long", err, errlen);
        return 0;
    case RPC_T_ARRAY:
        if (o->type != MSGPACK_OBJECT_ARRAY)
            goto wrong_type;
        if (ranged && !count_in_range(o->via.array.size, min, max))
            return range_err(what, "must have", min, max, " elements", err, errlen);
        return deep_check(o, 0, what, err, errlen);
    case RPC_T_MAP:
        if (o->type != MSGPACK_OBJECT_MAP)
            goto wrong_type;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            if (o->via.map.ptr[i].key.type != MSGPACK_OBJECT_STR) {
                set_err(err, errlen, "parameter '%s' must be a map with string keys, not %s keys",
                        what, obj_type_name(&o->via.map.ptr[i].key));
                return RPC_E_INVALID;
            }
        }
        if (ranged && !count_in_range(o->via.map.size, min, max))
            return range_err(what, "must have", min, max, " entries", err, errlen);
        return deep_check(o, 0, what, err, errlen);
    case RPC_T_VECTOR:
        return check_vector(o, flags, min, max, what, err, errlen);
    case RPC_T_STR_ARRAY:
    case RPC_T_UINT_ARRAY:
        if (o->type != MSGPACK_OBJECT_ARRAY)
            goto wrong_type;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            const msgpack_object *e = &o->via.array.ptr[i];
            if (type == RPC_T_UINT_ARRAY) {
                if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                    set_err(err, errlen, "parameter '%s' must be %s: element %u is %s", what,
                            type_desc(type), i,
                            e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? "negative"
                                                                       : obj_type_name(e));
                    return RPC_E_INVALID;
                }
                continue;
            }
            if (e->type != MSGPACK_OBJECT_STR) {
                set_err(err, errlen, "parameter '%s' must be %s: element %u is %s", what,
                        type_desc(type), i, obj_type_name(e));
                return RPC_E_INVALID;
            }
            bad = str_problem(e->via.str.ptr, e->via.str.size);
            if (bad != NULL) {
                set_err(err, errlen, "parameter '%s[%u]' %s", what, i, bad);
                return RPC_E_INVALID;
            }
        }
        if (ranged && !count_in_range(o->via.array.size, min, max))
            return range_err(what, "must have", min, max, " elements", err, errlen);
        return 0;
    }
    set_err(err, errlen, "parameter '%s' has an unknown schema type %d", what, (int)type);
    return RPC_E_INVALID;

wrong_type:
    set_err(err, errlen, "parameter '%s' must be %s, not %s", what, type_desc(type),
            obj_type_name(o));
    return RPC_E_INVALID;
}

static bool key_is(const msgpack_object *k, const char *s, size_t n)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           (n == 0 || memcmp(k->via.str.ptr, s, n) == 0);
}

int rpc_bind_params(const msgpack_object *params, const rpc_param *schema, size_t n,
                    const msgpack_object **out, char *err, size_t errlen)
{
    char q[4 * QUOTE_MAX + 8];
    int rc;

    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    if (params == NULL)
        goto required;
    if (params->type != MSGPACK_OBJECT_MAP) {
        set_err(err, errlen, "parameters must be a map, not %s", obj_type_name(params));
        rc = RPC_E_INVALID;
        goto fail;
    }
    for (uint32_t j = 0; j < params->via.map.size; j++) {
        const msgpack_object *k = &params->via.map.ptr[j].key;
        const msgpack_object *v = &params->via.map.ptr[j].val;
        size_t i;

        if (k->type != MSGPACK_OBJECT_STR) {
            set_err(err, errlen, "parameter names must be strings, not %s", obj_type_name(k));
            rc = RPC_E_INVALID;
            goto fail;
        }
        for (i = 0; i < n; i++)
            if (key_is(k, schema[i].name, strlen(schema[i].name)))
                break;
        if (i == n) {
            set_err(err, errlen, "unknown parameter '%s'",
                    quote(k->via.str.ptr, k->via.str.size, q, sizeof(q)));
            rc = RPC_E_INVALID;
            goto fail;
        }
        /* Every earlier key is a distinct schema name, so this loop runs at most n times. */
        for (uint32_t e = 0; e < j; e++) {
            if (key_is(&params->via.map.ptr[e].key, k->via.str.ptr, k->via.str.size)) {
                set_err(err, errlen, "duplicate parameter '%s'", schema[i].name);
                rc = RPC_E_INVALID;
                goto fail;
            }
        }
        if (v->type == MSGPACK_OBJECT_NIL && (schema[i].flags & RPC_P_NULLABLE))
            continue;
        rc = rpc_check_value(v, schema[i].type, schema[i].flags, schema[i].min, schema[i].max,
                             schema[i].name, err, errlen);
        if (rc != 0)
            goto fail;
        out[i] = v;
    }

required:
    for (size_t i = 0; i < n; i++) {
        if ((schema[i].flags & RPC_P_REQUIRED) && out[i] == NULL) {
            set_err(err, errlen, "missing required parameter '%s'", schema[i].name);
            rc = RPC_E_INVALID;
            goto fail;
        }
    }
    return 0;

fail:
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    return rc;
}

uint64_t rpc_get_uint(const msgpack_object *o, uint64_t def)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return def;
    return o->via.u64;
}

int64_t rpc_get_int(const msgpack_object *o, int64_t def)
{
    if (o == NULL)
        return def;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return o->via.i64;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
        return (int64_t)o->via.u64;
    return def;
}

double rpc_get_num(const msgpack_object *o, double def)
{
    if (o == NULL)
        return def;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return def;
    }
}

bool rpc_get_bool(const msgpack_object *o, bool def)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_BOOLEAN)
        return def;
    return o->via.boolean;
}

char *rpc_get_str(const msgpack_object *o, void *(*alloc)(void *ud, size_t n), void *ud)
{
    char *s;

    if (o == NULL || o->type != MSGPACK_OBJECT_STR)
        return NULL;
    s = alloc(ud, (size_t)o->via.str.size + 1);
    if (s == NULL)
        return NULL;
    if (o->via.str.size > 0)
        memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    return s;
}

bool rpc_str_eq(const msgpack_object *o, const char *s)
{
    return o != NULL && s != NULL && key_is(o, s, strlen(s));
}

const msgpack_object *rpc_map_get(const msgpack_object *m, const char *key)
{
    size_t n;

    if (m == NULL || m->type != MSGPACK_OBJECT_MAP || key == NULL)
        return NULL;
    n = strlen(key);
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key, n))
            return &m->via.map.ptr[i].val;
    return NULL;
}

size_t rpc_vector_dim(const msgpack_object *o)
{
    if (o == NULL)
        return 0;
    if (o->type == MSGPACK_OBJECT_BIN)
        return o->via.bin.size / 4;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        return o->via.array.size;
    return 0;
}

int rpc_get_vector(const msgpack_object *o, const char *param, float *out, size_t dim, char *err,
                   size_t errlen)
{
    size_t have;

    if (param == NULL)
        param = "?";
    if (o == NULL || (o->type != MSGPACK_OBJECT_BIN && o->type != MSGPACK_OBJECT_ARRAY) ||
        (o->type == MSGPACK_OBJECT_BIN && o->via.bin.size % 4 != 0)) {
        set_err(err, errlen, "parameter '%s' must be %s", param, type_desc(RPC_T_VECTOR));
        return RPC_E_INVALID;
    }
    have = rpc_vector_dim(o);
    if (have != dim) {
        set_err(err, errlen, "parameter '%s' has dimension %zu, expected %zu", param, have, dim);
        return RPC_E_INVALID;
    }
    for (size_t i = 0; i < dim; i++) {
        bool ok;
        float f = 0;

        if (o->type == MSGPACK_OBJECT_BIN) {
            f = le_float((const uint8_t *)o->via.bin.ptr + 4 * i);
            ok = isfinite(f);
        } else {
            double d;
            int rc = vec_elem(&o->via.array.ptr[i], &d);
            if (rc == 1) {
                set_err(err, errlen, "parameter '%s' must be %s: element %zu is %s", param,
                        type_desc(RPC_T_VECTOR), i, obj_type_name(&o->via.array.ptr[i]));
                return RPC_E_INVALID;
            }
            ok = rc == 0;
            if (ok)
                f = (float)d; /* in float range: checked by vec_elem */
        }
        if (!ok) {
            set_err(err, errlen,
                    "parameter '%s' holds a NaN, infinity or value out of float32 range at "
                    "index %zu",
                    param, i);
            return RPC_E_INVALID;
        }
        out[i] = f;
    }
    return 0;
}

/* ---- encoding ------------------------------------------------------------------------ */

/* The msgpack_pack_* calls return the write callback's status; these helpers return void
 * (see rpc.h), so a callback that can fail must remember the failure itself. */

void rpc_pack_cstr(msgpack_packer *pk, const char *s)
{
    if (s == NULL)
        msgpack_pack_nil(pk);
    else
        rpc_pack_strn(pk, s, strlen(s));
}

void rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    if (n > 0)
        msgpack_pack_str_body(pk, s, n);
}

void rpc_pack_result_begin(msgpack_packer *pk, uint32_t msgid)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_KIND_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_nil(pk);
}

void rpc_pack_error(msgpack_packer *pk, uint32_t msgid, rpc_code code, const char *message,
                    const rpc_detail *details, size_t ndetails)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_KIND_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_map(pk, 2 + ndetails);
    rpc_pack_kv_str(pk, "code", rpc_code_name(code));
    rpc_pack_kv_str(pk, "message", message != NULL ? message : "");
    for (size_t i = 0; i < ndetails; i++) {
        const rpc_detail *d = &details[i];
        rpc_pack_cstr(pk, d->key != NULL ? d->key : "");
        switch (d->type) {
        case RPC_D_INT:
            msgpack_pack_int64(pk, d->v.i);
            break;
        case RPC_D_UINT:
            msgpack_pack_uint64(pk, d->v.u);
            break;
        case RPC_D_NUM:
            msgpack_pack_double(pk, d->v.d);
            break;
        case RPC_D_STR:
            rpc_pack_cstr(pk, d->v.s);
            break;
        default:
            msgpack_pack_nil(pk);
            break;
        }
    }
    msgpack_pack_nil(pk);
}

void rpc_pack_request_begin(msgpack_packer *pk, uint32_t msgid, const char *method, bool has_args)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, RPC_KIND_REQUEST);
    msgpack_pack_uint32(pk, msgid);
    rpc_pack_cstr(pk, method);
    msgpack_pack_array(pk, has_args ? 1 : 0);
}

void rpc_pack_kv_str(msgpack_packer *pk, const char *key, const char *s)
{
    rpc_pack_cstr(pk, key);
    rpc_pack_cstr(pk, s);
}

void rpc_pack_kv_uint(msgpack_packer *pk, const char *key, uint64_t v)
{
    rpc_pack_cstr(pk, key);
    msgpack_pack_uint64(pk, v);
}

void rpc_pack_kv_int(msgpack_packer *pk, const char *key, int64_t v)
{
    rpc_pack_cstr(pk, key);
    msgpack_pack_int64(pk, v);
}

void rpc_pack_kv_num(msgpack_packer *pk, const char *key, double v)
{
    rpc_pack_cstr(pk, key);
    msgpack_pack_double(pk, v);
}

void rpc_pack_kv_bool(msgpack_packer *pk, const char *key, bool v)
{
    rpc_pack_cstr(pk, key);
    if (v)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
}

void rpc_pack_kv_nil(msgpack_packer *pk, const char *key)
{
    rpc_pack_cstr(pk, key);
    msgpack_pack_nil(pk);
}

void rpc_pack_vector(msgpack_packer *pk, const float *v, size_t dim)
{
    uint8_t chunk[256];
    size_t used = 0;

    if (dim > UINT32_MAX / 4) {
        msgpack_pack_nil(pk); /* no bin can hold it; documented in rpc.h */
        return;
    }
    msgpack_pack_bin(pk, dim * 4);
    for (size_t i = 0; i < dim; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof(u));
        chunk[used++] = (uint8_t)u;
        chunk[used++] = (uint8_t)(u >> 8);
        chunk[used++] = (uint8_t)(u >> 16);
        chunk[used++] = (uint8_t)(u >> 24);
        if (used == sizeof(chunk)) {
            msgpack_pack_bin_body(pk, chunk, used);
            used = 0;
        }
    }
    if (used > 0)
        msgpack_pack_bin_body(pk, chunk, used);
}
