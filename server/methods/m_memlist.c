/* server/methods/m_memlist.c: reading many memories: memory.history, memory.list and
 * memory.stats. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "index_engine.h"
#include "log.h"
#include "memfilter.h"
#include "memops.h"
#include "mempack.h"
#include "memrow.h"
#include "reqfilter.h"
#include "sql.h"

/* ---- memory.history --------------------------------------------------------------------- */

enum { P_HI_ID };
PARAMS(memory_history, {"id", RPC_T_UINT, RPC_P_REQUIRED, 0, 0});

static void history_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *cur = res->res[0], *vs = res->res[1];
    memrow m;
    if (PQntuples(cur) != 1 || memrow_parse(cur, 0, 0, &m) != 0) {
        req_fail(r, RPC_NOT_FOUND, "memory %llu not found",
                 (unsigned long long)rpc_get_uint(req_arg(r, P_HI_ID), 0));
        return;
    }
    int n = PQntuples(vs);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_uint(pk, "id", m.id);
    rpc_pack_cstr(pk, "versions");
    msgpack_pack_array(pk, (uint32_t)n + 1);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(pk, 11);
        rpc_pack_kv_int(pk, "version", memrow_i64(vs, i, 0, 0));
        rpc_pack_cstr(pk, "content");
        rpc_pack_strn(pk, PQgetvalue(vs, i, 1), (size_t)PQgetlength(vs, i, 1));
        rpc_pack_kv_str(pk, "type", PQgetvalue(vs, i, 2));
        rpc_pack_kv_num(pk, "importance", memrow_f64_of(vs, i, 3, 0, ROWERR_MEMORIES));
        rpc_pack_cstr(pk, "metadata");
        mp_pack_json(pk, PQgetvalue(vs, i, 4), (size_t)PQgetlength(vs, i, 4));
        rpc_pack_kv_int(pk, "valid_from", memrow_i64(vs, i, 5, 0));
        rpc_pack_kv_int(pk, "valid_to", memrow_i64(vs, i, 6, 0));
        rpc_pack_kv_str(pk, "replaced_by", PQgetvalue(vs, i, 7));
        rpc_pack_cstr(pk, "detail");
        mp_pack_json(pk, PQgetvalue(vs, i, 8), (size_t)PQgetlength(vs, i, 8));
        mp_pack_time(pk, "expires_at", memrow_i64(vs, i, 9, MEMROW_NO_TIME));
        mp_pack_time(pk, "archived_at", memrow_i64(vs, i, 10, MEMROW_NO_TIME));
    }
    msgpack_pack_map(pk, 11);
    rpc_pack_kv_int(pk, "version", m.version);
    rpc_pack_cstr(pk, "content");
    rpc_pack_strn(pk, m.content, m.content_len);
    rpc_pack_kv_str(pk, "type", memrow_type_name(m.type));
    rpc_pack_kv_num(pk, "importance", m.importance);
    rpc_pack_cstr(pk, "metadata");
    mp_pack_json(pk, m.metadata_json, m.metadata_len);
    rpc_pack_kv_int(pk, "valid_from", m.updated_ms);
    rpc_pack_kv_nil(pk, "valid_to");
    rpc_pack_kv_nil(pk, "replaced_by");
    rpc_pack_cstr(pk, "detail");
    msgpack_pack_map(pk, 0);
    mp_pack_time(pk, "expires_at", m.expires_ms);
    mp_pack_time(pk, "archived_at", m.archived_ms);
    req_done(r);
}

void h_memory_history(req *r)
{
    uint64_t id = rpc_get_uint(req_arg(r, P_HI_ID), 0);
    const char *tid = mp_tenant_param(r);
    char *ids = mp_ids_literal(r, &id, 1), *one = req_alloc(r, 24);
    if (!tid || !ids || !one) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(one, 24, "%lld", (long long)id);
    const char *v1[] = {tid, ids};
    const char *v2[] = {tid, one};
    db_query q[2] = {{.stmt = sql_def(SQL_MEMORY_GET), DB_VALUES(v1)},
                     {.stmt = sql_def(SQL_MEMORY_HISTORY), DB_VALUES(v2)}};
    req_submit_read(r, q, 2, history_rows);
}

/* ---- memory.list ------------------------------------------------------------------------ */

enum {
    P_LI_ORDER_BY = MF__COUNT,
    P_LI_ORDER,
    P_LI_CURSOR,
    P_LI_LIMIT,
    P_LI_INCLUDE_EMBEDDING,
};
static const char *const order_bys[] = {"created_at", "importance", "composite", NULL};
static const char *const orders[] = {"desc", "asc", NULL};
ENUMS(memory_list, {"type_filter", enum_memory_types}, {"scopes", enum_scopes},
      {"order_by", order_bys}, {"order", orders});
PARAMS(memory_list, MF_PARAMS, {"order_by", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"order", RPC_T_STR, RPC_P_NULLABLE, 0, 0},
       {"cursor", RPC_T_STR, RPC_P_NULLABLE | RPC_P_RANGE, 1, 200},
       {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
       {"include_embedding", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct list_state {
    const char *order_by;
    int sign;
    int64_t as_of;
    size_t limit;
    bool embedding;
} list_state;

static void list_rows(req *r, const db_result *res)
{
    list_state *st = req_state(r);
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "memories");
    mp_pack_rows(pk, pr, 2, st->embedding ? 2 + SQL_MEMROW_NCOLS : -1, NULL, NULL);
    rpc_pack_cstr(pk, "next_cursor");
    if ((size_t)n == st->limit && n > 0) {
        char cur[200];
        snprintf(cur, sizeof(cur), "v1:%s:%d:%lld:%s:%s", st->order_by, st->sign,
                 (long long)st->as_of, PQgetvalue(pr, n - 1, 0), PQgetvalue(pr, n - 1, 1));
        rpc_pack_cstr(pk, cur);
    } else {
        msgpack_pack_nil(pk);
    }
    req_done(r);
}

void h_memory_list(req *r)
{
    mem_filter f;
    if (rf_parse(r, 0, &f) < 0)
        return;
    list_state *st = req_alloc(r, sizeof(*st));
    if (!st) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    memset(st, 0, sizeof(*st));
    st->order_by = "created_at";
    const msgpack_object *o;
    /* order_by and order are among the table's words (ENUMS above): the dispatcher checked */
    if ((o = req_arg(r, P_LI_ORDER_BY))) {
        if (rpc_str_eq(o, "importance"))
            st->order_by = "importance";
        else if (rpc_str_eq(o, "composite"))
            st->order_by = "composite";
    }
    st->sign = 1;
    if ((o = req_arg(r, P_LI_ORDER)) && rpc_str_eq(o, "asc"))
        st->sign = -1;
    st->limit = (size_t)rpc_get_uint(req_arg(r, P_LI_LIMIT), 100);
    st->embedding = rpc_get_bool(req_arg(r, P_LI_INCLUDE_EMBEDDING), false);
    st->as_of = f.now_ms;
    char *ckey = NULL, *cid = NULL;
    if ((o = req_arg(r, P_LI_CURSOR))) {
        /* v1:<order_by>:<sign>:<as_of>:<key>:<signed id> */
        char buf[201], order[16];
        int sign;
        long long asof, id;
        double key;
        memcpy(buf, o->via.str.ptr, o->via.str.size);
        buf[o->via.str.size] = '\0';
        if (sscanf(buf, "v1:%15[a-z_]:%d:%lld:%lf:%lld", order, &sign, &asof, &key, &id) != 5 ||
            strcmp(order, st->order_by) != 0 || sign != st->sign || !isfinite(key)) {
            req_fail(r, RPC_INVALID_ARGUMENT,
                     "parameter 'cursor' is not a cursor of this listing (same order_by and "
                     "order)");
            return;
        }
        st->as_of = asof; /* composite ranks stay as they were on the first page */
        f.now_ms = asof;
        ckey = req_alloc(r, 40);
        cid = req_alloc(r, 24);
        if (!ckey || !cid) {
            req_fail(r, RPC_INTERNAL, "out of memory");
            return;
        }
        snprintf(ckey, 40, "%.17g", key);
        snprintf(cid, 24, "%lld", id);
    }
    req_set_state(r, st);
    const char *vals[1 + SQL_FILTER_NPARAMS + 5];
    char *sign = req_alloc(r, 4), *limit = req_alloc(r, 16);
    vals[0] = mp_tenant_param(r);
    if (!vals[0] || !sign || !limit || mf_sql_params(req_arena(r), &f, vals + 1) < 0) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(sign, 4, "%d", st->sign);
    snprintf(limit, 16, "%zu", st->limit);
    const char **tail = vals + 1 + SQL_FILTER_NPARAMS;
    tail[0] = st->order_by;
    tail[1] = sign;
    tail[2] = ckey;
    tail[3] = cid;
    tail[4] = limit;
    db_query q = {.stmt = sql_def(st->embedding ? SQL_MEMORY_LIST_EMB : SQL_MEMORY_LIST),
                  DB_VALUES(vals)};
    req_submit_read(r, &q, 1, list_rows);
}

/* ---- memory.stats ----------------------------------------------------------------------- */

NO_PARAMS(memory_stats);

static void stats_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int64_t by_type[MEM_TYPE_COUNT] = {0}, by_scope[SCOPE_COUNT] = {0};
    int64_t total = 0, archived = 0, bytes = 0;
    int64_t oldest = MEMROW_NO_TIME, newest = MEMROW_NO_TIME;
    for (int i = 0; i < PQntuples(pr); i++) {
        const char *type = PQgetvalue(pr, i, 0), *scope = PQgetvalue(pr, i, 1);
        int t = memrow_type_parse(type, strlen(type)),
            sc = memrow_scope_parse(scope, strlen(scope));
        int64_t n = memrow_i64(pr, i, 2, 0);
        if (t >= 0)
            by_type[t] += n;
        else
            rowerr_report(ROWERR_MEMORIES, PQfname(pr, 0), "not a memory type");
        if (sc >= 0)
            by_scope[sc] += n;
        else
            rowerr_report(ROWERR_MEMORIES, PQfname(pr, 1), "not a memory scope");
        total += n;
        archived += memrow_i64(pr, i, 3, 0);
        int64_t lo = memrow_i64(pr, i, 4, MEMROW_NO_TIME),
                hi = memrow_i64(pr, i, 5, MEMROW_NO_TIME);
        if (lo != MEMROW_NO_TIME && (oldest == MEMROW_NO_TIME || lo < oldest))
            oldest = lo;
        if (hi != MEMROW_NO_TIME && (newest == MEMROW_NO_TIME || hi > newest))
            newest = hi;
        bytes += memrow_i64(pr, i, 6, 0);
    }
    /* the index: as loaded in this process, or the engine its next load will use */
    server *s = req_server(r);
    tenants_index ti;
    bool loaded = tenants_index_info(s->tenants, req_auth(r)->tenant_id, &ti);
    const char *engine;
    if (loaded) {
        engine = index_engine_name(ti.engine);
    } else {
        const PGresult *er = res->nres > 1 ? res->res[1] : NULL;
        engine = er && PQntuples(er) == 1 && !PQgetisnull(er, 0, 0) ? PQgetvalue(er, 0, 0)
                                                                    : s->cfg.index_engine;
    }
    static const char *const kinds[] = {"flat", "sq8", "ann"};
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 9);
    rpc_pack_kv_int(pk, "total", total);
    rpc_pack_kv_int(pk, "archived", archived);
    rpc_pack_cstr(pk, "by_type");
    msgpack_pack_map(pk, MEM_TYPE_COUNT);
    for (int i = 0; i < MEM_TYPE_COUNT; i++)
        rpc_pack_kv_int(pk, memrow_type_name((mem_type)i), by_type[i]);
    rpc_pack_cstr(pk, "by_scope");
    msgpack_pack_map(pk, SCOPE_COUNT);
    for (int i = 0; i < SCOPE_COUNT; i++)
        rpc_pack_kv_int(pk, memrow_scope_name((mem_scope)i), by_scope[i]);
    mp_pack_time(pk, "oldest_at", oldest);
    mp_pack_time(pk, "newest_at", newest);
    rpc_pack_kv_int(pk, "storage_bytes", bytes);
    rpc_pack_cstr(pk, "index");
    msgpack_pack_map(pk, 13);
    rpc_pack_kv_str(pk, "engine", engine);
    rpc_pack_kv_bool(pk, "loaded", loaded);
    if (loaded) {
        const vindex_recall *rc = &ti.recall;
        rpc_pack_kv_str(pk, "engine_in_use", index_engine_name(ti.engine_in_use));
        rpc_pack_kv_str(pk, "kind", kinds[ti.kind <= VINDEX_KIND_ANN ? ti.kind : VINDEX_KIND_ANN]);
        rpc_pack_kv_int(pk, "vectors", (int64_t)ti.vectors);
        rpc_pack_cstr(pk, "recall_estimate");
        if (isnan(rc->estimate))
            msgpack_pack_nil(pk);
        else
            msgpack_pack_double(pk, rc->estimate);
        rpc_pack_kv_int(pk, "candidate_depth", (int64_t)rc->depth);
        rpc_pack_kv_int(pk, "blended_depth", (int64_t)rc->scored_depth);
        rpc_pack_kv_bool(pk, "exact_fallback", rc->exact_fallback);
        rpc_pack_kv_int(pk, "recall_samples", (int64_t)rc->samples);
        rpc_pack_kv_int(pk, "recall_query_samples", (int64_t)rc->query_samples);
        rpc_pack_kv_str(pk, "row_cache_warm", tenants_rows_warm_name(ti.rows_warm));
        rpc_pack_kv_int(pk, "rows_warmed", (int64_t)ti.rows_warmed);
    } else {
        rpc_pack_kv_nil(pk, "engine_in_use");
        rpc_pack_kv_nil(pk, "kind");
        rpc_pack_kv_nil(pk, "vectors");
        rpc_pack_kv_nil(pk, "recall_estimate");
        rpc_pack_kv_nil(pk, "candidate_depth");
        rpc_pack_kv_nil(pk, "blended_depth");
        rpc_pack_kv_nil(pk, "exact_fallback");
        rpc_pack_kv_nil(pk, "recall_samples");
        rpc_pack_kv_nil(pk, "recall_query_samples");
        rpc_pack_kv_nil(pk, "row_cache_warm");
        rpc_pack_kv_nil(pk, "rows_warmed");
    }
    /* a re-embedding in progress (engram_reembed_state): null when none runs */
    const PGresult *rr = res->nres > 2 ? res->res[2] : NULL;
    if (rr && PQntuples(rr) == 1 && !PQgetisnull(rr, 0, 0)) {
        rpc_pack_cstr(pk, "reembed");
        mp_pack_json(pk, PQgetvalue(rr, 0, 0), (size_t)PQgetlength(rr, 0, 0));
    } else {
        rpc_pack_kv_nil(pk, "reembed");
    }
    req_done(r);
}

void h_memory_stats(req *r)
{
    const char *tid = mp_tenant_param(r);
    if (!tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid};
    db_query q[3] = {{.stmt = sql_def(SQL_MEMORY_STATS), DB_VALUES(vals)},
                     {.stmt = sql_def(SQL_TENANT_INDEX_ENGINE), DB_VALUES(vals)},
                     {.stmt = sql_def(SQL_REEMBED_STATE), DB_VALUES(vals)}};
    req_submit_read(r, q, 3, stats_rows);
}
