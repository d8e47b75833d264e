/* server/methods/m_memory.c: one memory by id: memory.get, memory.delete (by ids or by
 * filter), memory.update, memory.archive and memory.restore. Stores live in m_store.c,
 * history, lists and statistics in m_memlist.c, searches in m_search.c. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "log.h"
#include "memfilter.h"
#include "memops.h"
#include "mempack.h"
#include "memrow.h"
#include "plimits.h"
#include "reqembed.h"
#include "reqfilter.h"
#include "sql.h"
#include "tenants.h"

/* ---- memory.get ------------------------------------------------------------------------ */

enum { P_GET_IDS };
PARAMS(memory_get, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void get_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    size_t nask;
    uint64_t *ask = mp_uint_array(r, req_arg(r, P_GET_IDS), &nask);
    uint64_t *found = req_alloc(r, ((size_t)n + 1) * sizeof(*found));
    if (!ask || !found) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "memories");
    size_t nfound = 0;
    mp_pack_rows(pk, pr, 0, -1, found, &nfound);
    /* the ids asked for that are not there (deleted, expired, another tenant's, never
     * stored), in the order asked, once each */
    qsort(found, nfound, sizeof(*found), cmp_u64);
    size_t nmissing = 0;
    for (size_t i = 0; i < nask; i++) {
        bool seen = bsearch(&ask[i], found, nfound, sizeof(*found), cmp_u64) != NULL;
        for (size_t j = 0; !seen && j < i; j++)
            seen = ask[j] == ask[i];
        if (!seen)
            ask[nmissing++] = ask[i];
    }
    rpc_pack_cstr(pk, "missing");
    msgpack_pack_array(pk, (uint32_t)nmissing);
    for (size_t i = 0; i < nmissing; i++)
        msgpack_pack_uint64(pk, ask[i]);
    req_done(r);
}

void h_memory_get(req *r)
{
    mo_submit_ids(r, P_GET_IDS, SQL_MEMORY_GET, true, get_rows);
}

/* ---- memory.delete ------------------------------------------------------------------- */

#define DELETE_BATCH 1000 /* memories per transaction of a delete by filter */

enum { P_DEL_IDS, P_DEL_FILTER, P_DEL_DRY_RUN, P_DEL_ALL };
PARAMS(memory_delete, {"ids", RPC_T_UINT_ARRAY, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
       {"filter", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0},
       {"dry_run", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0}, {"all", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

static const rpc_param delete_filter_schema[] = {MF_PARAMS};

/* Applies the deleted (id, seq) rows of pr to the tenant's index; returns how many. */
static int apply_deletes(req *r, const PGresult *pr)
{
    const conn_auth *a = req_auth(r);
    tenant *t = tenants_get(req_server(r)->tenants, a->tenant_id, a->dim);
    if (t && !tenants_dim_is(t, a->dim)) {
        tenants_put(t); /* another model since: its load reads the database */
        t = NULL;
    }
    int n = PQntuples(pr);
    for (int i = 0; t && i < n; i++)
        tenants_apply_delete(t, (uint64_t)memrow_i64(pr, i, 1, 0),
                             (uint64_t)memrow_i64(pr, i, 0, 0));
    tenants_put(t);
    return n;
}

static void delete_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = apply_deletes(r, pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, "deleted");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_uint64(pk, (uint64_t)memrow_i64(pr, i, 0, 0));
    req_done(r);
}

/* A delete by filter: the statement parameters (see SQL_MEMORY_DELETE_FILTER) and the count
 * so far. Batches of DELETE_BATCH memories in id order, each its own transaction under the
 * tenant row's lock, up to the tenant's last memory id when the first batch ran. */
typedef struct delete_state {
    const char *vals[1 + SQL_FILTER_NPARAMS + 5];
    char last[24], after[24], limit[16];
    int64_t count;
} delete_state;

enum { DV_OWNER_AGENT = 1 + SQL_FILTER_NPARAMS, DV_OWNER_CLADE, DV_LAST, DV_LIMIT, DV_AFTER };

static void delete_filter_batch(req *r);

static void delete_filter_rows(req *r, const db_result *res)
{
    delete_state *st = req_state(r);
    if (res->status != DB_OK) {
        /* earlier batches stay deleted; a repeated call deletes the rest */
        req_fail_db(r, res);
        return;
    }
    if (!st->vals[DV_LAST]) {
        snprintf(st->last, sizeof(st->last), "%lld", (long long)memrow_i64(res->res[0], 0, 0, 0));
        st->vals[DV_LAST] = st->last;
    }
    const PGresult *pr = res->res[1];
    int n = apply_deletes(r, pr);
    st->count += n;
    if (n == DELETE_BATCH) {
        /* rows come back in id order: the next batch starts after the last */
        snprintf(st->after, sizeof(st->after), "%lld", (long long)memrow_i64(pr, n - 1, 0, 0));
        st->vals[DV_AFTER] = st->after;
        delete_filter_batch(r);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "count", st->count);
    rpc_pack_kv_bool(pk, "dry_run", false);
    req_done(r);
}

static void delete_filter_batch(req *r)
{
    delete_state *st = req_state(r);
    db_query q[2] = {{.stmt = sql_def(SQL_MEMORY_DELETE_LOCK), .values = st->vals, .nvalues = 1},
                     {.stmt = sql_def(SQL_MEMORY_DELETE_FILTER), DB_VALUES(st->vals)}};
    req_submit(r, req_auth(r)->tenant_id, q, 2, delete_filter_rows);
}

static void delete_count_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_int(pk, "count", memrow_i64(res->res[0], 0, 0, 0));
    rpc_pack_kv_bool(pk, "dry_run", true);
    req_done(r);
}

/* memory.delete {filter, dry_run, all}: the search filters, except that agent_id and
 * clade_id select the memories stored with them (ownership, not what that agent may see:
 * that includes the tenant's shared memories) and archived memories match unless
 * include_archived is false. An empty filter needs all: true. */
static void delete_by_filter(req *r, const msgpack_object *filter)
{
    char err[300];
    const msgpack_object *args[MF__COUNT];
    if (rpc_bind_params(filter, delete_filter_schema, MF__COUNT, args, err, sizeof(err)) != 0) {
        req_fail(r, RPC_INVALID_ARGUMENT, "filter: %s", err);
        return;
    }
    bool constrains = false;
    for (size_t i = 0; i < MF__COUNT; i++)
        constrains = constrains || (i != MF_INCLUDE_ARCHIVED && args[i]);
    bool all = rpc_get_bool(req_arg(r, P_DEL_ALL), false);
    if (!constrains && !all) {
        req_fail(r, RPC_INVALID_ARGUMENT,
                 "an empty 'filter' matches every memory of the tenant: give 'all': true to "
                 "delete them all");
        return;
    }
    if (constrains && all) {
        req_fail(r, RPC_INVALID_ARGUMENT, "'all': true goes with an empty 'filter' only");
        return;
    }
    const msgpack_object *agent = args[MF_AGENT_ID], *clade = args[MF_CLADE_ID];
    args[MF_AGENT_ID] = args[MF_CLADE_ID] = NULL;
    mem_filter f;
    if (rf_parse_args(r, args, "filter.", &f) < 0)
        return;
    f.include_archived = rpc_get_bool(args[MF_INCLUDE_ARCHIVED], true);
    delete_state *st = req_alloc(r, sizeof(*st));
    char *owner = req_alloc(r, 64);
    if (!st || !owner) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    st->vals[0] = mp_tenant_param(r);
    if (!st->vals[0] || mf_sql_params(req_arena(r), &f, st->vals + 1) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    st->vals[DV_OWNER_AGENT] = agent ? memrow_u64_sql(rpc_get_uint(agent, 0), owner) : NULL;
    st->vals[DV_OWNER_CLADE] = clade ? memrow_u64_sql(rpc_get_uint(clade, 0), owner + 32) : NULL;
    req_set_state(r, st);
    if (rpc_get_bool(req_arg(r, P_DEL_DRY_RUN), false)) {
        db_query q = {.stmt = sql_def(SQL_MEMORY_DELETE_COUNT),
                      .values = st->vals,
                      .nvalues = DV_OWNER_CLADE + 1};
        req_submit(r, req_auth(r)->tenant_id, &q, 1, delete_count_rows);
        return;
    }
    snprintf(st->limit, sizeof(st->limit), "%d", DELETE_BATCH);
    st->vals[DV_LIMIT] = st->limit;
    delete_filter_batch(r);
}

void h_memory_delete(req *r)
{
    const msgpack_object *filter = req_arg(r, P_DEL_FILTER);
    if (!req_arg(r, P_DEL_IDS) == !filter) {
        req_fail(r, RPC_INVALID_ARGUMENT, "give 'ids' or 'filter'%s",
                 filter ? ", not both" : " (memories by id, or those that pass a filter)");
        return;
    }
    if (filter) {
        delete_by_filter(r, filter);
        return;
    }
    if (req_arg(r, P_DEL_DRY_RUN) || req_arg(r, P_DEL_ALL)) {
        req_fail(r, RPC_INVALID_ARGUMENT, "'dry_run' and 'all' go with 'filter', not 'ids'");
        return;
    }
    mo_submit_ids(r, P_DEL_IDS, SQL_MEMORY_DELETE, false, delete_done);
}

/* ---- memory.update --------------------------------------------------------------------- */

enum {
    P_UP_ID,
    P_UP_CONTENT,
    P_UP_IMPORTANCE,
    P_UP_TYPE,
    P_UP_METADATA,
    P_UP_EMBEDDING,
    P_UP_EXPIRES_AT,
    P_UP_TTL_SECONDS,
    P_UP_PINNED
};
ENUMS(memory_update, {"type", enum_memory_types});
PARAMS(memory_update, {"id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0},
       {"content", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE | RPC_P_LIMIT(PLIM_CONTENT), 1, 0},
       {"importance", RPC_T_NUM, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1},
       {"type", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"metadata", RPC_T_MAP, RPC_P_NULLABLE | RPC_P_LIMIT(PLIM_METADATA), 0, 0},
       {"embedding", RPC_T_VECTOR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 4096},
       {"expires_at", RPC_T_INT, RPC_P_NULLABLE | RPC_P_RANGE, 0, 1e15},
       {"ttl_seconds", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 3.2e9},
       {"pinned", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct update_state {
    float *vec; /* the new vector, or NULL when the content stays */
    char *content;
    char *metadata;
    const char *type;
    char importance[32];
    char expires[24];
    bool clear_expiry;
} update_state;

static void update_done(req *r, const db_result *res)
{
    update_state *st = req_state(r);
    if (res->status != DB_OK) {
        mo_write_fail(r, res, 0);
        return;
    }
    const PGresult *pr = res->res[0];
    mo_apply_meta_rows(r, pr, 2, st->vec);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_uint(pk, "id", (uint64_t)memrow_i64(pr, 0, 2, 0));
    rpc_pack_kv_int(pk, "version", memrow_i64(pr, 0, 0, 0));
    rpc_pack_kv_int(pk, "updated_at", memrow_i64(pr, 0, 1, 0));
    req_done(r);
}

static void update_submit(req *r, rpc_code code, const char *message)
{
    update_state *st = req_state(r);
    if (code != RPC_OK) {
        req_fail(r, code, "%s", message ? message : "embedding failed");
        return;
    }
    const conn_auth *a = req_auth(r);
    const char *tid = mp_tenant_param(r);
    char *id = req_alloc(r, 24), *gen = req_alloc(r, 24);
    if (!tid || !id || !gen) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(id, 24, "%lld", (long long)rpc_get_uint(req_arg(r, P_UP_ID), 0));
    /* the generation the new vector was computed under (EG412 when the tenant left it) */
    snprintf(gen, 24, "%lld", (long long)a->embed_gen);
    const msgpack_object *pinned = req_arg(r, P_UP_PINNED);
    const char *vals[12] = {tid,
                            id,
                            st->content,
                            st->type,
                            st->importance[0] ? st->importance : NULL,
                            st->metadata,
                            (const char *)st->vec,
                            st->expires[0] ? st->expires : NULL,
                            st->clear_expiry ? "true" : "false",
                            pinned ? (rpc_get_bool(pinned, false) ? "true" : "false") : NULL,
                            server_memory_limits(req_server(r)),
                            gen};
    int lens[12] = {0}, fmts[12] = {0};
    lens[6] = (int)(a->dim * sizeof(float));
    fmts[6] = 1;
    db_query q = {
        .stmt = sql_def(SQL_MEMORY_UPDATE), DB_VALUES(vals), .lengths = lens, .formats = fmts};
    req_submit(r, a->tenant_id, &q, 1, update_done);
}

void h_memory_update(req *r)
{
    const conn_auth *a = req_auth(r);
    update_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    char err[300];
    const msgpack_object *o;
    bool any = false;
    for (size_t i = P_UP_CONTENT; i <= P_UP_PINNED; i++)
        any = any || req_arg(r, i);
    if (!any) {
        req_fail(r, RPC_INVALID_ARGUMENT, "memory.update needs at least one field to change");
        return;
    }
    if ((o = req_arg(r, P_UP_CONTENT))) {
        if (!(st->content = req_strdup(r, o))) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    if ((o = req_arg(r, P_UP_TYPE))) {
        /* one of enum_memory_types: the dispatcher checked it */
        st->type = memrow_type_name((mem_type)memrow_type_parse(o->via.str.ptr, o->via.str.size));
    }
    if ((o = req_arg(r, P_UP_IMPORTANCE)))
        snprintf(st->importance, sizeof(st->importance), "%.17g", rpc_get_num(o, 0));
    if ((o = req_arg(r, P_UP_METADATA))) {
        rpc_code code = mo_metadata_json(r, o, "", &st->metadata, err, sizeof(err));
        if (code != RPC_OK) {
            req_fail(r, code, "%s", err);
            return;
        }
    }
    const msgpack_object *ex = req_arg(r, P_UP_EXPIRES_AT), *ttl = req_arg(r, P_UP_TTL_SECONDS);
    if (ex && ttl) {
        req_fail(r, RPC_INVALID_ARGUMENT, "give 'expires_at' or 'ttl_seconds', not both");
        return;
    }
    int64_t now = server_now_ms();
    if (ex) {
        int64_t v = rpc_get_int(ex, 0);
        if (v == 0) {
            st->clear_expiry = true; /* expires_at 0 removes the expiry */
        } else if (v <= now) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'expires_at' must lie in the future");
            return;
        } else {
            snprintf(st->expires, sizeof(st->expires), "%lld", (long long)v);
        }
    } else if (ttl) {
        snprintf(st->expires, sizeof(st->expires), "%lld",
                 (long long)(now + (int64_t)rpc_get_uint(ttl, 0) * 1000));
    }
    req_set_state(r, st);
    const msgpack_object *emb = req_arg(r, P_UP_EMBEDDING);
    if (emb || st->content) {
        st->vec = req_alloc(r, a->dim * sizeof(float));
        if (!st->vec) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
    }
    if (emb) {
        if (rpc_get_vector(emb, "embedding", st->vec, a->dim, err, sizeof(err)) != 0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "%s (this tenant's dimension is %u)", err, a->dim);
            return;
        }
        double norm = 0;
        for (size_t k = 0; k < a->dim; k++)
            norm += (double)st->vec[k] * st->vec[k];
        if (norm == 0.0) {
            req_fail(r, RPC_INVALID_ARGUMENT, "parameter 'embedding' is a zero vector");
            return;
        }
        update_submit(r, RPC_OK, NULL);
        return;
    }
    if (st->content) {
        const char *texts[1] = {st->content};
        size_t lens[1] = {strlen(st->content)};
        float *outs[1] = {st->vec};
        const char *whats[1] = {"content"};
        re_embed(r, texts, lens, outs, whats, 1, update_submit);
        return;
    }
    update_submit(r, RPC_OK, NULL);
}

/* ---- memory.archive and memory.restore --------------------------------------------------- */

enum { P_AR_IDS, P_AR_REASON };
PARAMS(memory_archive, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000},
       {"reason", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 200});
enum { P_RS_IDS };
PARAMS(memory_restore, {"ids", RPC_T_UINT_ARRAY, RPC_P_REQUIRED | RPC_P_RANGE, 1, 1000});

static void archive_done(req *r, const db_result *res)
{
    const char *key = req_state(r);
    if (res->status != DB_OK) {
        mo_write_fail(r, res, 0); /* the detail says how many were asked */
        return;
    }
    const PGresult *pr = res->res[0];
    mo_apply_meta_rows(r, pr, 2, NULL);
    int n = PQntuples(pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 1);
    rpc_pack_cstr(pk, key);
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++)
        msgpack_pack_uint64(pk, (uint64_t)memrow_i64(pr, i, 2, 0));
    req_done(r);
}

static void set_archived(req *r, bool archive, const char *reason)
{
    size_t n;
    uint64_t *ids = mp_uint_array(r, req_arg(r, 0), &n);
    char *arr = ids ? mp_ids_literal(r, ids, n) : NULL;
    const char *tid = mp_tenant_param(r);
    if (!arr || !tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    req_set_state(r, archive ? "archived" : "restored");
    /* a restore is checked against the tier's memory limit (archived ones do not count) */
    const char *vals[] = {tid, arr, archive ? "true" : "false", reason,
                          server_memory_limits(req_server(r))};
    db_query q = {.stmt = sql_def(SQL_MEMORY_ARCHIVE), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, archive_done);
}

void h_memory_archive(req *r)
{
    const char *reason = req_strdup(r, req_arg(r, P_AR_REASON));
    set_archived(r, true, reason ? reason : "manual");
}

void h_memory_restore(req *r)
{
    set_archived(r, false, NULL);
}
