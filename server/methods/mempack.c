/* server/methods/mempack.c: shared packing and parameter helpers (see mempack.h). */
#include "mempack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define METADATA_MAX_DEPTH 20

void mp_pack_json(msgpack_packer *pk, const char *json, size_t n)
{
    msgpack_sbuffer sb;
    msgpack_packer tmp;
    char err[128];
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    if (json_to_msgpack(json, n, METADATA_MAX_DEPTH, &tmp, err, sizeof(err)) == 0)
        pk->callback(pk->data, sb.data, sb.size); /* already encoded: append as is */
    else
        msgpack_pack_nil(pk);
    msgpack_sbuffer_destroy(&sb);
}

void mp_pack_time(msgpack_packer *pk, const char *key, int64_t ms)
{
    if (ms == MEMROW_NO_TIME)
        rpc_pack_kv_nil(pk, key);
    else
        rpc_pack_kv_int(pk, key, ms);
}

static void pack_opt_id(msgpack_packer *pk, const char *key, uint64_t id)
{
    if (id)
        rpc_pack_kv_uint(pk, key, id);
    else
        rpc_pack_kv_nil(pk, key);
}

void mp_pack_memory(msgpack_packer *pk, const memrow *m, const mp_fresh *fresh, uint32_t nextra)
{
    msgpack_pack_map(pk, 21 + nextra);
    rpc_pack_kv_uint(pk, "id", m->id);
    rpc_pack_kv_uint(pk, "agent_id", m->agent_id);
    rpc_pack_kv_uint(pk, "clade_id", m->clade_id);
    rpc_pack_kv_str(pk, "scope", memrow_scope_name(m->scope));
    rpc_pack_kv_str(pk, "type", memrow_type_name(m->type));
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, m->content, m->content_len);
    rpc_pack_kv_num(pk, "importance", m->importance);
    rpc_pack_cstr(pk, "metadata");
    mp_pack_json(pk, m->metadata_json, m->metadata_len);
    mp_pack_time(pk, "created_at", m->created_ms);
    mp_pack_time(pk, "updated_at", m->updated_ms);
    if (fresh && fresh->set) {
        mp_pack_time(pk, "last_accessed_at",
                     fresh->last_access_ms ? fresh->last_access_ms : MEMROW_NO_TIME);
        rpc_pack_kv_uint(pk, "access_count", fresh->access_count);
    } else {
        mp_pack_time(pk, "last_accessed_at", m->last_accessed_ms);
        rpc_pack_kv_int(pk, "access_count", m->access_count);
    }
    mp_pack_time(pk, "expires_at", m->expires_ms);
    mp_pack_time(pk, "archived_at", m->archived_ms);
    rpc_pack_kv_str(pk, "archived_reason", m->archived_reason);
    pack_opt_id(pk, "superseded_by", m->superseded_by);
    pack_opt_id(pk, "merged_into", m->merged_into);
    rpc_pack_kv_bool(pk, "pinned", m->pinned);
    rpc_pack_kv_int(pk, "version", m->version);
    rpc_pack_kv_int(pk, "cited_count", m->cited_count);
    rpc_pack_kv_int(pk, "injected_count", m->injected_count);
}

char *mp_ids_literal(req *r, const uint64_t *ids, size_t n)
{
    char *s = req_alloc(r, n * 21 + 3);
    if (!s)
        return NULL;
    char *w = s;
    *w++ = '{';
    for (size_t i = 0; i < n; i++)
        w += sprintf(w, "%s%lld", i ? "," : "", (long long)ids[i]);
    *w++ = '}';
    *w = '\0';
    return s;
}

uint64_t *mp_uint_array(req *r, const msgpack_object *o, size_t *n)
{
    *n = o->via.array.size;
    uint64_t *ids = req_alloc(r, (*n ? *n : 1) * sizeof(*ids));
    if (!ids)
        return NULL;
    for (size_t i = 0; i < *n; i++)
        ids[i] = o->via.array.ptr[i].via.u64;
    return ids;
}

static int sep(mp_array *a)
{
    if (a->n++ == 0)
        return ubuf_append(&a->b, "{", 1);
    return ubuf_append(&a->b, ",", 1);
}

int mp_array_str(mp_array *a, const char *s, size_t n)
{
    if (sep(a) < 0)
        return -ENOMEM;
    if (!s)
        return ubuf_append(&a->b, "NULL", 4);
    if (ubuf_append(&a->b, "\"", 1) < 0)
        return -ENOMEM;
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\') {
            if (ubuf_append(&a->b, s + start, i - start) < 0 || ubuf_append(&a->b, "\\", 1) < 0)
                return -ENOMEM;
            start = i;
        }
    }
    if (ubuf_append(&a->b, s + start, n - start) < 0)
        return -ENOMEM;
    return ubuf_append(&a->b, "\"", 1);
}

int mp_array_i64(mp_array *a, int64_t v, bool null)
{
    char num[24];
    if (sep(a) < 0)
        return -ENOMEM;
    if (null)
        return ubuf_append(&a->b, "NULL", 4);
    int n = snprintf(num, sizeof(num), "%lld", (long long)v);
    return ubuf_append(&a->b, num, (size_t)n);
}

int mp_array_f64(mp_array *a, double v)
{
    char num[32];
    if (sep(a) < 0)
        return -ENOMEM;
    int n = snprintf(num, sizeof(num), "%.17g", v);
    return ubuf_append(&a->b, num, (size_t)n);
}

int mp_array_bool(mp_array *a, bool v)
{
    if (sep(a) < 0)
        return -ENOMEM;
    return ubuf_append(&a->b, v ? "t" : "f", 1);
}

char *mp_array_finish(req *r, mp_array *a)
{
    char *s = NULL;
    if ((a->n == 0 ? ubuf_append(&a->b, "{", 1) : 0) == 0 && ubuf_append(&a->b, "}", 1) == 0) {
        s = req_alloc(r, a->b.len + 1);
        if (s) {
            memcpy(s, a->b.data, a->b.len);
            s[a->b.len] = '\0';
        }
    }
    mp_array_fini(a);
    return s;
}

void mp_array_fini(mp_array *a)
{
    ubuf_fini(&a->b);
    a->n = 0;
}

const char *mp_tenant_param(req *r)
{
    char *s = req_alloc(r, 24);
    if (s)
        snprintf(s, 24, "%lld", (long long)req_auth(r)->tenant_id);
    return s;
}

void mp_pack_rows(msgpack_packer *pk, const PGresult *pr, int col, int emb_col, uint64_t *ids,
                  size_t *nids)
{
    int n = PQntuples(pr);
    size_t found = 0;
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        memrow m;
        if (memrow_parse(pr, i, col, &m) != 0) {
            msgpack_pack_nil(pk);
            continue;
        }
        mp_pack_memory(pk, &m, NULL, emb_col >= 0 ? 1 : 0);
        if (ids)
            ids[found++] = m.id;
        if (emb_col < 0)
            continue;
        /* base64 from PostgreSQL, back to bytes: a bin of little-endian float32 */
        const char *b64 = PQgetvalue(pr, i, emb_col);
        size_t blen = (size_t)PQgetlength(pr, i, emb_col);
        unsigned char *bin = malloc(blen ? blen : 1);
        size_t got = 0;
        rpc_pack_cstr(pk, "embedding");
        if (bin && sodium_base642bin(bin, blen, b64, blen, "\n", &got, NULL,
                                     sodium_base64_VARIANT_ORIGINAL) == 0) {
            msgpack_pack_bin(pk, got);
            msgpack_pack_bin_body(pk, bin, got);
        } else {
            msgpack_pack_nil(pk);
        }
        free(bin);
    }
    if (nids)
        *nids = found;
}
