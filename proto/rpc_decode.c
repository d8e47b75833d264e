/* proto/rpc_decode.c: decoding delimited messages into requests and responses, with a
 * structural check before msgpack-c allocates anything. */
#include "rpc.h"
#include "rpc_internal.h"

#include <errno.h>
#include <string.h>

/* msgpack-c's unpacker has a fixed stack of this many containers (empty ones included). */
#define MSGPACK_C_MAX_DEPTH 32

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
        *mag = rpc_be_read(m + at + 1, w);
    } else if (b >= 0xd0 && b <= 0xd3) {
        uint64_t v, sign;
        w = 1u << (b - 0xd0);
        if (len - at - 1 < w)
            return false;
        v = rpc_be_read(m + at + 1, w);
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
        count = rpc_be_read(m + 1, 2);
        p = 3;
    } else if (m[0] == 0xdd && len >= 5) {
        count = rpc_be_read(m + 1, 4);
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
    struct rpc_scan_state st;
    char why[160] = "";
    size_t mlen = 0, off = 0;
    int rc;

    if (zone == NULL)
        return -EINVAL;
    if (len == 0) {
        rpc_set_err(err, errlen, "empty message");
        return RPC_E_MALFORMED;
    }
    rpc_scan_state_reset(&st);
    rc = rpc_scan_run(&st, stack, &lim, msg, len, &mlen, why, sizeof(why));
    if (rc == RPC_E_INCOMPLETE) {
        rpc_set_err(err, errlen, "truncated message");
        return RPC_E_MALFORMED;
    }
    if (rc == RPC_E_TOO_LARGE || rc == RPC_E_TOO_MANY) {
        /* against these limits that means a declared length runs past the end */
        rpc_set_err(err, errlen, "truncated message: %s", why);
        return RPC_E_MALFORMED;
    }
    if (rc != 0) {
        rpc_set_err(err, errlen, "invalid MessagePack: %s", why);
        return RPC_E_MALFORMED;
    }
    if (mlen != len) {
        rpc_set_err(err, errlen, "%zu trailing bytes after the message", len - mlen);
        return RPC_E_MALFORMED;
    }
    switch (msgpack_unpack((const char *)msg, len, &off, zone, root)) {
    case MSGPACK_UNPACK_SUCCESS:
        return 0;
    case MSGPACK_UNPACK_NOMEM_ERROR:
        return -ENOMEM; /* depth and counts were checked above: this is a real failure */
    default:            /* unreachable after the scan; kept so a msgpack-c change cannot slip by */
        rpc_set_err(err, errlen, "invalid MessagePack");
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
        rpc_set_err(err, errlen, "method must be a string, not %s", rpc_obj_type_name(o));
        return RPC_E_MALFORMED;
    }
    if (o->via.str.size < 1 || o->via.str.size > 255) {
        rpc_set_err(err, errlen, "method name must be 1 to 255 bytes long, not %u",
                    o->via.str.size);
        return RPC_E_MALFORMED;
    }
    if (!rpc_utf8_valid(o->via.str.ptr, o->via.str.size)) {
        rpc_set_err(err, errlen, "method name is not valid UTF-8");
        return RPC_E_MALFORMED;
    }
    return 0;
}

static int check_params(const msgpack_object *o, const msgpack_object **params, char *err,
                        size_t errlen)
{
    const msgpack_object *m;

    if (o->type != MSGPACK_OBJECT_ARRAY) {
        rpc_set_err(err, errlen, "params must be [] or [map], not %s", rpc_obj_type_name(o));
        return RPC_E_MALFORMED;
    }
    if (o->via.array.size == 0) {
        *params = NULL;
        return 0;
    }
    if (o->via.array.size != 1) {
        rpc_set_err(err, errlen, "params must be [] or [map], not an array of %u elements",
                    o->via.array.size);
        return RPC_E_MALFORMED;
    }
    m = &o->via.array.ptr[0];
    if (m->type != MSGPACK_OBJECT_MAP) {
        rpc_set_err(err, errlen, "params must be [] or [map], not [%s]", rpc_obj_type_name(m));
        return RPC_E_MALFORMED;
    }
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) {
            rpc_set_err(err, errlen, "parameter names must be strings, not %s",
                        rpc_obj_type_name(k));
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
        rpc_set_err(err, errlen, "message must be an array, not %s", rpc_obj_type_name(&root));
        return RPC_E_MALFORMED;
    }
    n = root.via.array.size;
    a = root.via.array.ptr;
    if (n == 0 || a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        rpc_set_err(err, errlen,
                    "message must start with its kind, 0 (request) or 2 (notification)");
        return RPC_E_MALFORMED;
    }
    kind = a[0].via.u64;
    if (kind == RPC_KIND_RESPONSE) {
        rpc_set_err(err, errlen, "message kind 1 (response) is not a request");
        return RPC_E_MALFORMED;
    }
    if (kind == RPC_KIND_REQUEST) {
        if (n != 4) {
            rpc_set_err(err, errlen, "request must be an array of 4 elements, not %u", n);
            return RPC_E_MALFORMED;
        }
        if (!get_msgid(&a[1], &out->msgid)) {
            rpc_set_err(err, errlen, "msgid must be an unsigned 32-bit integer");
            return RPC_E_MALFORMED;
        }
        a++;
    } else if (kind == RPC_KIND_NOTIFY) {
        if (n != 3) {
            rpc_set_err(err, errlen, "notification must be an array of 3 elements, not %u", n);
            return RPC_E_MALFORMED;
        }
        out->msgid = 0;
    } else {
        rpc_set_err(err, errlen, "unknown message kind %llu", (unsigned long long)kind);
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
        rpc_set_err(err, errlen, "message must be an array, not %s", rpc_obj_type_name(&root));
        return RPC_E_MALFORMED;
    }
    a = root.via.array.ptr;
    if (root.via.array.size == 0 || a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        a[0].via.u64 != RPC_KIND_RESPONSE) {
        rpc_set_err(err, errlen, "message must start with kind 1 (response)");
        return RPC_E_MALFORMED;
    }
    if (root.via.array.size != 4) {
        rpc_set_err(err, errlen, "response must be an array of 4 elements, not %u",
                    root.via.array.size);
        return RPC_E_MALFORMED;
    }
    if (!get_msgid(&a[1], &out->msgid)) {
        rpc_set_err(err, errlen, "msgid must be an unsigned 32-bit integer");
        return RPC_E_MALFORMED;
    }
    if (a[2].type != MSGPACK_OBJECT_NIL && a[2].type != MSGPACK_OBJECT_MAP) {
        rpc_set_err(err, errlen, "error must be nil or a map, not %s", rpc_obj_type_name(&a[2]));
        return RPC_E_MALFORMED;
    }
    out->error = a[2].type == MSGPACK_OBJECT_NIL ? NULL : &a[2];
    out->result = a[3].type == MSGPACK_OBJECT_NIL ? NULL : &a[3];
    return 0;
}
