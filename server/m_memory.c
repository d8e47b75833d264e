/* server/m_memory.c: memory.store, memory.search, memory.get, memory.delete. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "handlers.h"
#include "json.h"
#include "log.h"
#include "memrow.h"
#include "score.h"
#include "sql.h"
#include "tenants.h"

#define METADATA_MAX_DEPTH 16

/* ---- shared helpers ---------------------------------------------------------------------- */

/* Packs raw, already-encoded MessagePack bytes as the next object. */
static void pack_raw(msgpack_packer *pk, const char *data, size_t n)
{
    pk->callback(pk->data, data, n);
}

/* Packs the jsonb text of a metadata column as a MessagePack map (nil if unparsable). */
static void pack_json(msgpack_packer *pk, const char *json, size_t n)
{
    msgpack_sbuffer sb;
    msgpack_packer tmp;
    char err[128];
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&tmp, &sb, msgpack_sbuffer_write);
    if (json_to_msgpack(json, n, METADATA_MAX_DEPTH + 4, &tmp, err, sizeof(err)) == 0)
        pack_raw(pk, sb.data, sb.size);
    else
        msgpack_pack_nil(pk);
    msgpack_sbuffer_destroy(&sb);
}

static void pack_time(msgpack_packer *pk, const char *key, int64_t ms)
{
    if (ms == MEMROW_NO_TIME)
        rpc_pack_kv_nil(pk, key);
    else
        rpc_pack_kv_int(pk, key, ms);
}

/* Packs a memory row as a map of nextra + 14 fields; the caller packs the extra pairs
 * right after. */
static void pack_memory(msgpack_packer *pk, const memrow *m, uint32_t nextra)
{
    msgpack_pack_map(pk, 14 + nextra);
    rpc_pack_kv_uint(pk, "id", m->id);
    rpc_pack_kv_uint(pk, "agent_id", m->agent_id);
    rpc_pack_kv_uint(pk, "clade_id", m->clade_id);
    rpc_pack_kv_str(pk, "scope", memrow_scope_name(m->scope));
    rpc_pack_kv_str(pk, "type", memrow_type_name(m->type));
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, m->content, m->content_len);
    rpc_pack_kv_num(pk, "importance", m->importance);
    rpc_pack_cstr(pk, "metadata");
    pack_json(pk, m->metadata_json, m->metadata_len);
    pack_time(pk, "created_at", m->created_ms);
    pack_time(pk, "updated_at", m->updated_ms);
    pack_time(pk, "last_accessed_at", m->last_accessed_ms);
    rpc_pack_kv_int(pk, "access_count", m->access_count);
    pack_time(pk, "expires_at", m->expires_ms);
    rpc_pack_kv_int(pk, "version", m->version);
}

/* Builds the text form of a bigint[] from ids, in the request's arena. */
static char *ids_array(req *r, const uint64_t *ids, size_t n)
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

/* Reads a uint[] parameter into an arena array. */
static uint64_t *uint_array(req *r, const msgpack_object *o, size_t *n)
{
    *n = o->via.array.size;
    uint64_t *ids = req_alloc(r, (*n ? *n : 1) * sizeof(*ids));
    if (!ids)
        return NULL;
    for (size_t i = 0; i < *n; i++)
        ids[i] = o->via.array.ptr[i].via.u64;
    return ids;
}

/* Produces the embedding for a request: the given vector (checked against the tenant's
 * dimension) or the built-in embedder's for text. Returns an arena vector, or NULL after
 * failing the request. */
static float *request_vector(req *r, const msgpack_object *embedding, const char *text,
                             size_t text_len, const char *param)
{
    const conn_auth *a = req_auth(r);
    float *vec = req_alloc(r, a->dim * sizeof(float));
    char err[256];
    if (!vec) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return NULL;
    }
    if (embedding) {
        if (rpc_get_vector(embedding, "embedding", vec, a->dim, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s (this tenant's dimension is %u)", err, a->dim);
            return NULL;
        }
        double norm = 0;
        for (size_t i = 0; i < a->dim; i++)
            norm += (double)vec[i] * vec[i];
        if (norm == 0.0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'embedding' is a zero vector");
            return NULL;
        }
        return vec;
    }
    if (strcmp(a->provider, "builtin") != 0) {
        req_fail(r, RPC_UNAVAILABLE, "embedding provider '%s' is not available", a->provider);
        return NULL;
    }
    int rc = embed_text(text, text_len, a->dim, vec);
    if (rc == EMBED_E_EMPTY) {
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter '%s' has no text to embed", param);
        return NULL;
    }
    if (rc != 0) {
        req_fail(r, RPC_INTERNAL, "embedder failed (%d)", rc);
        return NULL;
    }
    return vec;
}

/* ---- memory.store -------------------------------------------------------------------- */

enum { P_ST_CONTENT, P_ST_TYPE, P_ST_IMPORTANCE, P_ST_METADATA, P_ST_EMBEDDING };
PARAMS(memory_store, {"content", RPC_T_STR, RPC_P_REQUIRED | RPC_P_RANGE, 1, 16777216},
       {"type", RPC_T_STR, RPC_P_REQUIRED, 0, 0},
       {"importance", RPC_T_NUM, RPC_P_REQUIRED | RPC_P_RANGE, 0, 1},
       {"metadata", RPC_T_MAP, RPC_P_NULLABLE, 0, 0},
       {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096});

typedef struct store_state {
    float *vec;
    mem_meta meta;
} store_state;

static void store_done(req *r, const db_result *res)
{
    store_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    if (PQntuples(pr) != 1) {
        req_fail(r, RPC_INTERNAL, "store returned no row");
        return;
    }
    uint64_t id = (uint64_t)memrow_i64(pr, 0, 0, 0);
    int64_t created = memrow_i64(pr, 0, 1, 0);
    uint64_t seq = (uint64_t)memrow_i64(pr, 0, 2, 0);
    st->meta.seq = seq;
    st->meta.created_ms = created;
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (t) {
        tenant_apply_upsert(t, seq, id, st->vec, &st->meta);
        tenant_put(t);
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_uint(pk, "id", id);
    rpc_pack_kv_int(pk, "created_at", created);
    req_done(r);
}

void h_memory_store(req *r)
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    const msgpack_object *content = req_arg(r, P_ST_CONTENT);
    const msgpack_object *type = req_arg(r, P_ST_TYPE);
    if (content->via.str.size > (size_t)s->cfg.max_content_bytes) {
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'content' is longer than %ld bytes",
                 s->cfg.max_content_bytes);
        return;
    }
    int ty = memrow_type_parse(type->via.str.ptr, type->via.str.size);
    if (ty < 0) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "parameter 'type' must be one of fact, preference, episode, strategy_outcome, "
                 "constraint");
        return;
    }
    double importance = rpc_get_num(req_arg(r, P_ST_IMPORTANCE), 0.5);
    char *metadata = "{}";
    const msgpack_object *md = req_arg(r, P_ST_METADATA);
    if (md) {
        json_buf jb = {0};
        int rc = json_from_msgpack(md, 0, METADATA_MAX_DEPTH, &jb);
        if (rc != 0) {
            json_buf_fini(&jb);
            req_fail(r, rc == -ENOMEM ? RPC_INTERNAL : RPC_INVALID_ARGUMENT,
                     "parameter 'metadata' %s",
                     rc == JSON_E_TOO_DEEP ? "is nested too deeply"
                                           : "must hold only strings, numbers, booleans, nil, "
                                             "arrays and maps with string keys");
            return;
        }
        metadata = req_alloc(r, jb.len + 1);
        if (metadata)
            memcpy(metadata, jb.len ? jb.data : "{}", jb.len ? jb.len + 1 : 3);
        json_buf_fini(&jb);
        if (!metadata) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    store_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    /* on failure request_vector has ended the request: st is gone with it */
    float *vec = request_vector(r, req_arg(r, P_ST_EMBEDDING), content->via.str.ptr,
                                content->via.str.size, "content");
    if (!vec)
        return;
    st->vec = vec;
    st->meta.type = (uint8_t)ty;
    st->meta.scope = SCOPE_TENANT;
    st->meta.importance = (float)importance;
    st->meta.expires_ms = INT64_MAX;
    req_set_state(r, st);

    char tid[24], imp[32];
    snprintf(tid, sizeof(tid), "%lld", (long long)a->tenant_id);
    snprintf(imp, sizeof(imp), "%.17g", importance);
    char *text = req_strdup(r, content);
    if (!text) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[12] = {tid,
                            "0",
                            "0",
                            "tenant",
                            memrow_type_name((mem_type)ty),
                            text,
                            imp,
                            metadata,
                            (const char *)st->vec,
                            NULL,
                            NULL,
                            NULL};
    int lens[12] = {0};
    int fmts[12] = {0};
    lens[8] = (int)(a->dim * sizeof(float));
    fmts[8] = 1;
    db_query q = {.stmt = sql_name(SQL_MEMORY_STORE),
                  .nparams = 12,
                  .values = vals,
                  .lengths = lens,
                  .formats = fmts};
    req_submit(r, a->tenant_id, &q, 1, store_done);
}

/* ---- memory.search ------------------------------------------------------------------- */

enum { P_SE_QUERY, P_SE_EMBEDDING, P_SE_TOP_K };
PARAMS(memory_search, {"query", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 16777216},
       {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},
       {"top_k", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 100000});

typedef struct search_state {
    tenant *t;
    float *vec;
    size_t k;
    double w;
    int64_t now_ms;
    const score_params *sp;
    vindex_hit *hits;
    size_t nhits;
} search_state;

static bool search_keep(const void *meta, void *ctx)
{
    const mem_meta *m = meta;
    const search_state *st = ctx;
    return m->archived_ms == 0 && m->expires_ms > st->now_ms;
}

static double search_score(float sim, const void *meta, void *ctx)
{
    const mem_meta *m = meta;
    const search_state *st = ctx;
    double c = score_composite(st->sp, m->created_ms, m->access_count, m->importance, st->now_ms);
    return st->w * sim + (1.0 - st->w) * c;
}

static void search_rows(req *r, const db_result *res)
{
    search_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int nrows = PQntuples(pr);
    /* rows come back in the order of the ids we asked for, which is the hits' order;
     * a memory deleted since the index search is simply missing */
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "results");
    msgpack_pack_array(pk, (uint32_t)nrows);
    int row = 0;
    for (size_t i = 0; i < st->nhits && row < nrows; i++) {
        memrow m;
        if (memrow_parse(pr, row, &m) != 0) {
            msgpack_pack_nil(pk);
            row++;
            continue;
        }
        if (m.id != st->hits[i].id)
            continue;
        row++;
        double composite = score_composite(st->sp, m.created_ms, (uint32_t)m.access_count,
                                           m.importance, st->now_ms);
        pack_memory(pk, &m, 3);
        rpc_pack_kv_num(pk, "similarity", st->hits[i].similarity);
        rpc_pack_kv_num(pk, "composite", composite);
        rpc_pack_kv_num(pk, "score", st->hits[i].score);
    }
    /* rows that matched no hit (cannot happen: ids come from the hits) pad as nil */
    for (; row < nrows; row++)
        msgpack_pack_nil(pk);
    req_done(r);
}

static void search_run(req *r)
{
    search_state *st = req_state(r);
    vindex_query q = {.vec = st->vec,
                      .k = st->k,
                      .keep = search_keep,
                      .score = search_score,
                      .score_slope = st->w,
                      .score_bound = 1.0 - st->w,
                      .ctx = st};
    int rc = vindex_search(tenant_index(st->t), &q, st->hits, &st->nhits);
    tenant_put(st->t);
    st->t = NULL;
    if (rc != 0) {
        req_fail(r, rc == -ENOMEM ? RPC_INTERNAL : RPC_INVALID_ARGUMENT, "search failed (%d)", rc);
        return;
    }
    if (st->nhits == 0) {
        msgpack_packer *pk = req_result(r);
        msgpack_pack_map(pk, 1);
        rpc_pack_cstr(pk, "results");
        msgpack_pack_array(pk, 0);
        req_done(r);
        return;
    }
    uint64_t *ids = req_alloc(r, st->nhits * sizeof(*ids));
    for (size_t i = 0; ids && i < st->nhits; i++)
        ids[i] = st->hits[i].id;
    char *arr = ids ? ids_array(r, ids, st->nhits) : NULL;
    if (!arr) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)req_auth(r)->tenant_id);
    const char *vals[] = {tid, arr};
    db_query dq = {.stmt = sql_name(SQL_MEMORY_GET), .nparams = 2, .values = vals};
    req_submit(r, req_auth(r)->tenant_id, &dq, 1, search_rows);
}

static void search_ready(void *arg, int status, const char *err)
{
    req *r = arg;
    search_state *st = req_state(r);
    if (status != 0) {
        tenant_put(st->t);
        st->t = NULL;
        req_fail(r, RPC_UNAVAILABLE, "%s", err ? err : "index unavailable");
        return;
    }
    search_run(r);
}

void h_memory_search(req *r)
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    const msgpack_object *query = req_arg(r, P_SE_QUERY);
    const msgpack_object *embedding = req_arg(r, P_SE_EMBEDDING);
    if (!query && !embedding) {
        req_fail(r, RPC_INVALID_ARGUMENT, "memory.search needs 'query' or 'embedding'");
        return;
    }
    uint64_t k = rpc_get_uint(req_arg(r, P_SE_TOP_K), 10);
    if (k > (uint64_t)s->cfg.max_top_k) {
        req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'top_k' must be between 1 and %d",
                 s->cfg.max_top_k);
        return;
    }
    search_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    st->k = (size_t)k;
    st->w = s->cfg.similarity_weight;
    st->sp = &s->score;
    st->now_ms = server_now_ms();
    st->hits = req_alloc(r, st->k * sizeof(*st->hits));
    if (!st->hits) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    req_set_state(r, st);
    /* on failure request_vector has ended the request: st is gone with it */
    float *vec = request_vector(r, embedding, query ? query->via.str.ptr : NULL,
                                query ? query->via.str.size : 0, "query");
    if (!vec)
        return;
    st->vec = vec;
    st->t = tenants_get(s->tenants, a->tenant_id, a->dim);
    if (!st->t) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    int rc = tenant_when_ready(st->t, req_worker(r), search_ready, r);
    if (rc == 1) {
        search_run(r);
    } else if (rc < 0) {
        tenant_put(st->t);
        req_fail(r, RPC_INTERNAL, "out of memory");
    }
}

/* ---- memory.get ---------------------------------------------------------------------- */

enum { P_GET_IDS };
PARAMS(memory_get, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static void get_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "memories");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        memrow m;
        if (memrow_parse(pr, i, &m) != 0) {
            msgpack_pack_nil(pk);
            continue;
        }
        pack_memory(pk, &m, 0);
    }
    req_done(r);
}

void h_memory_get(req *r)
{
    size_t n;
    uint64_t *ids = uint_array(r, req_arg(r, P_GET_IDS), &n);
    char *arr = ids ? ids_array(r, ids, n) : NULL;
    if (!arr) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)req_auth(r)->tenant_id);
    const char *vals[] = {tid, arr};
    db_query q = {.stmt = sql_name(SQL_MEMORY_GET), .nparams = 2, .values = vals};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, get_rows);
}

/* ---- memory.delete --------------------------------------------------------------------- */

enum { P_DEL_IDS };
PARAMS(memory_delete, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static void delete_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "deleted");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        uint64_t id = (uint64_t)memrow_i64(pr, i, 0, 0);
        uint64_t seq = (uint64_t)memrow_i64(pr, i, 1, 0);
        if (t)
            tenant_apply_delete(t, seq, id);
        msgpack_pack_uint64(pk, id);
    }
    tenant_put(t);
    req_done(r);
}

void h_memory_delete(req *r)
{
    size_t n;
    uint64_t *ids = uint_array(r, req_arg(r, P_DEL_IDS), &n);
    char *arr = ids ? ids_array(r, ids, n) : NULL;
    if (!arr) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)req_auth(r)->tenant_id);
    const char *vals[] = {tid, arr};
    db_query q = {.stmt = sql_name(SQL_MEMORY_DELETE), .nparams = 2, .values = vals};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, delete_done);
}
