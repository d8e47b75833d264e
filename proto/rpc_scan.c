/* proto/rpc_scan.c: framing: finding where one MessagePack message ends in a byte stream,
 * within the limits, without allocating anything sized by the input. */
#include "rpc.h"
#include "rpc_internal.h"

#include <stdlib.h>
#include <string.h>

struct rpc_scanner {
    rpc_limits lim;
    struct rpc_scan_state st;
    uint64_t stack[]; /* lim.max_depth entries */
};

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

void rpc_scan_state_reset(struct rpc_scan_state *st)
{
    memset(st, 0, sizeof(*st));
}

int rpc_scan_run(struct rpc_scan_state *st, uint64_t *stack, const rpc_limits *lim,
                 const uint8_t *buf, size_t len, size_t *msg_len, char *err, size_t errlen)
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
            uint64_t objects = st->objects;
            *msg_len = (size_t)st->pos;
            rpc_scan_state_reset(st);
            st->last = objects;
            return 0;
        }
        if (st->pos == len)
            return RPC_E_INCOMPLETE;
        if (!classify(buf[at], &h)) {
            rpc_set_err(err, errlen, "reserved byte 0xc1 at offset %llu", (unsigned long long)at);
            return RPC_E_MALFORMED;
        }
        if (len - at < h.hdr)
            return RPC_E_INCOMPLETE; /* re-read the whole header next time */
        n = h.lenbytes ? rpc_be_read(buf + at + 1, h.lenbytes) : 0;

        /* This value settles one of the values its parent owes. */
        if (st->depth > 0) {
            stack[st->depth - 1]--;
            st->need--;
        }
        if (st->objects + 1 + st->need > max_obj) {
            rpc_set_err(err, errlen, "more than %llu objects in one message",
                        (unsigned long long)max_obj);
            return RPC_E_TOO_MANY;
        }
        st->objects++;

        end = at + h.hdr; /* cannot overflow: at <= len and hdr <= 9 */
        if (h.kind == 0) {
            uint64_t body = h.lenbytes ? n : h.payload;
            if (body > max_msg || end + st->need > max_msg - body) {
                rpc_set_err(err, errlen,
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
                rpc_set_err(
                    err, errlen,
                    "%s of %llu %s at offset %llu does not fit in a message of at most %llu "
                    "bytes",
                    h.what, (unsigned long long)count, h.kind == 2 ? "entries" : "elements",
                    (unsigned long long)at, (unsigned long long)max_msg);
                return RPC_E_TOO_LARGE;
            }
            if (values > max_obj - st->objects - st->need) {
                rpc_set_err(err, errlen,
                            "%s of %llu %s at offset %llu passes the limit of %llu objects in one "
                            "message",
                            h.what, (unsigned long long)count, h.kind == 2 ? "entries" : "elements",
                            (unsigned long long)at, (unsigned long long)max_obj);
                return RPC_E_TOO_MANY;
            }
            if (st->depth >= lim->max_depth) {
                rpc_set_err(err, errlen, "nesting deeper than %u at offset %llu", lim->max_depth,
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
    rpc_scan_state_reset(&s->st);
    return s;
}

void rpc_scanner_destroy(rpc_scanner *s)
{
    free(s);
}

size_t rpc_scanner_last_objects(const rpc_scanner *s)
{
    return (size_t)s->st.last;
}

void rpc_scanner_reset(rpc_scanner *s)
{
    rpc_scan_state_reset(&s->st);
}

int rpc_scanner_scan(rpc_scanner *s, const uint8_t *buf, size_t len, size_t *msg_len, char *err,
                     size_t errlen)
{
    int rc = rpc_scan_run(&s->st, s->stack, &s->lim, buf, len, msg_len, err, errlen);
    if (rc != 0 && rc != RPC_E_INCOMPLETE)
        rpc_scan_state_reset(&s->st);
    return rc;
}
