/* proto/rpc_pack.c: encoding: responses, errors, requests and the field helpers. */
#include "rpc.h"
#include "rpc_internal.h"

#include <string.h>

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
