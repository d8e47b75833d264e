/* server/methods/m_consolidate.c: memory.consolidate (on demand) and memory.consolidation.runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bg.h"
#include "consolidate.h"
#include "handlers.h"
#include "log.h"
#include "mempack.h"
#include "memrow.h"
#include "sql.h"
#include "worker.h"

/* ---- memory.consolidate -------------------------------------------------------------- */

NO_PARAMS(memory_consolidate);

typedef struct run_job {
    req *r;
    worker *w;
    int64_t tenant;
    uint32_t dim;
    consolidate_result res;
} run_job;

static void run_reply(void *arg)
{
    run_job *j = arg;
    req *r = j->r;
    const consolidate_result *res = &j->res;
    if (res->status == 1) {
        req_fail(r, RPC_CONFLICT, "%s", res->error);
    } else if (res->status < 0) {
        req_fail(r, RPC_UNAVAILABLE, "consolidation failed: %s", res->error);
    } else {
        msgpack_packer *pk = req_result(r);
        msgpack_pack_map(pk, 10);
        rpc_pack_kv_int(pk, "run_id", res->run_id);
        rpc_pack_kv_str(pk, "status", "completed");
        rpc_pack_kv_int(pk, "merged", res->merged);
        rpc_pack_kv_int(pk, "superseded", res->superseded);
        rpc_pack_kv_int(pk, "rescored", res->rescored);
        rpc_pack_kv_int(pk, "archived", res->archived);
        rpc_pack_kv_int(pk, "skipped", res->skipped);
        rpc_pack_kv_int(pk, "flagged", res->flagged);
        rpc_pack_kv_int(pk, "duration_ms", res->duration_ms);
        /* the chat model's part (the run record's settings.model has the details) */
        rpc_pack_cstr(pk, "model");
        if (!res->model_status) {
            msgpack_pack_nil(pk);
        } else {
            msgpack_pack_map(pk, 6);
            rpc_pack_kv_str(pk, "status", res->model_status);
            rpc_pack_kv_str(pk, "reason", res->model_reason[0] ? res->model_reason : NULL);
            rpc_pack_kv_int(pk, "calls", res->model_calls);
            rpc_pack_kv_int(pk, "tokens_in", (int64_t)res->tokens_in);
            rpc_pack_kv_int(pk, "tokens_out", (int64_t)res->tokens_out);
            rpc_pack_kv_num(pk, "cost_usd", res->cost_usd);
        }
        req_done(r);
    }
    free(j);
}

static void run_on_bg(bg_ctx *ctx, void *arg)
{
    run_job *j = arg;
    if (bg_cancelled(ctx)) {
        j->res.status = -1;
        snprintf(j->res.error, sizeof(j->res.error), "server shutting down");
    } else {
        consolidate_tenant(ctx, req_server(j->r), j->tenant, j->dim, "on_demand", &j->res);
    }
    if (worker_post(j->w, run_reply, j) < 0)
        log_error("cannot deliver a consolidation result (out of memory)");
}

void h_memory_consolidate(req *r)
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    const tier_limits *tl = &server_tiers(s)[a->tier];
    if (!tl->consolidation_on_demand) {
        req_fail(r, RPC_PERMISSION_DENIED,
                 "on-demand consolidation is for the premium tier; this tenant is on the %s tier, "
                 "consolidated on schedule every %d hours",
                 tier_name(a->tier), tl->consolidation_hours);
        return;
    }
    run_job *j = calloc(1, sizeof(*j));
    if (!j) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    j->r = r;
    j->w = req_worker(r);
    j->tenant = a->tenant_id;
    j->dim = a->dim;
    if (bg_submit(s->bg, run_on_bg, j) < 0) {
        free(j);
        req_fail(r, RPC_UNAVAILABLE, "server shutting down");
    }
}

/* ---- memory.consolidation.runs ------------------------------------------------------------ */

enum { P_CR_LIMIT, P_CR_CURSOR };
PARAMS(memory_consolidation_runs, {"limit", RPC_T_UINT, RPC_P_NULLABLE | RPC_P_RANGE, 1, 1000},
       {"cursor", RPC_T_UINT, RPC_P_NULLABLE, 0, 0});

static void runs_rows(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    int n = PQntuples(pr);
    uint64_t limit = rpc_get_uint(req_arg(r, P_CR_LIMIT), 20);
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 2);
    rpc_pack_cstr(pk, "runs");
    msgpack_pack_array(pk, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(pk, 13);
        rpc_pack_kv_int(pk, "run_id", memrow_i64(pr, i, 0, 0));
        rpc_pack_kv_str(pk, "trigger", PQgetvalue(pr, i, 1));
        rpc_pack_kv_str(pk, "status", PQgetvalue(pr, i, 2));
        rpc_pack_kv_int(pk, "started_at", memrow_i64(pr, i, 3, 0));
        rpc_pack_kv_int(pk, "finished_at", memrow_i64(pr, i, 4, 0));
        rpc_pack_kv_int(pk, "duration_ms", memrow_i64(pr, i, 4, 0) - memrow_i64(pr, i, 3, 0));
        rpc_pack_kv_int(pk, "merged", memrow_i64(pr, i, 5, 0));
        rpc_pack_kv_int(pk, "superseded", memrow_i64(pr, i, 6, 0));
        rpc_pack_kv_int(pk, "rescored", memrow_i64(pr, i, 7, 0));
        rpc_pack_kv_int(pk, "archived", memrow_i64(pr, i, 8, 0));
        rpc_pack_kv_int(pk, "skipped", memrow_i64(pr, i, 9, 0));
        rpc_pack_kv_str(pk, "error", PQgetisnull(pr, i, 10) ? NULL : PQgetvalue(pr, i, 10));
        rpc_pack_cstr(pk, "settings");
        mp_pack_json(pk, PQgetvalue(pr, i, 11), (size_t)PQgetlength(pr, i, 11));
    }
    rpc_pack_cstr(pk, "next_cursor");
    if (n > 0 && (uint64_t)n == limit)
        msgpack_pack_int64(pk, memrow_i64(pr, n - 1, 0, 0));
    else
        msgpack_pack_nil(pk);
    req_done(r);
}

void h_memory_consolidation_runs(req *r)
{
    const char *tid = mp_tenant_param(r);
    char *limit = req_alloc(r, 16), *before = req_alloc(r, 24);
    if (!tid || !limit || !before) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    snprintf(limit, 16, "%llu", (unsigned long long)rpc_get_uint(req_arg(r, P_CR_LIMIT), 20));
    const msgpack_object *cur = req_arg(r, P_CR_CURSOR);
    snprintf(before, 24, "%lld", (long long)rpc_get_uint(cur, 0));
    const char *vals[] = {tid, limit, cur ? before : NULL};
    db_query q = {.stmt = sql_def(SQL_CONSOLIDATION_RUNS), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, runs_rows);
}
