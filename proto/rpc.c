/* proto/rpc.c: what the MessagePack-RPC files share: error code names, limits, UTF-8
 * validation and the small helpers declared in rpc_internal.h. The jobs live beside it:
 * rpc_scan.c (framing), rpc_decode.c (decoding), rpc_bind.c (parameter binding),
 * rpc_pack.c (encoding). */
#include "rpc.h"
#include "rpc_internal.h"

#include <stdarg.h>
#include <stdio.h>

void rpc_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

uint64_t rpc_be_read(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

const char *rpc_obj_type_name(const msgpack_object *o)
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
        [RPC_RESULT_TOO_LARGE] = "result_too_large",
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
