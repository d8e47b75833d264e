/* server/methods/m_extract.c: session.extract (memory extraction from a transcript on
 * demand, extract.h) and tenant.dream (the auto-dream pass's state, and a pass on demand,
 * dream.h). Both run on a background thread and answer from the worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bg.h"
#include "chat.h"
#include "dream.h"
#include "extract.h"
#include "handlers.h"
#include "log.h"
#include "mempack.h"
#include "sq.h"
#include "sql.h"
#include "worker.h"

/* ---- session.extract ---------------------------------------------------------------------- */

enum { P_EX_SESSION, P_EX_THROUGH };
PARAMS(session_extract, ID_PARAM("session_id"), OPT_ID_PARAM("through_entry_id"));

typedef struct extract_job {
    req *r;
    worker *w;
    int64_t tenant, session, through;
    uint32_t dim;
    extract_result res;
} extract_job;

static void pack_model(msgpack_packer *pk, const extract_result *res)
{
    rpc_pack_cstr(pk, "model");
    msgpack_pack_map(pk, 5);
    rpc_pack_kv_str(pk, "status", res->model_status);
    rpc_pack_kv_int(pk, "calls", res->calls);
    rpc_pack_kv_int(pk, "tokens_in", (int64_t)res->tokens_in);
    rpc_pack_kv_int(pk, "tokens_out", (int64_t)res->tokens_out);
    rpc_pack_kv_num(pk, "cost_usd", res->cost_usd);
}

static void extract_reply(void *arg)
{
    extract_job *j = arg;
    req *r = j->r;
    const extract_result *res = &j->res;
    if (res->status == EXTRACT_BUSY) {
        req_fail(r, RPC_CONFLICT, "%s", res->error);
    } else if (res->status == EXTRACT_NOT_FOUND) {
        req_fail(r, RPC_NOT_FOUND, "%s", res->error);
    } else if (res->status == EXTRACT_FAILED) {
        req_fail(r, RPC_UNAVAILABLE, "extraction failed: %s", res->error);
    } else {
        /* completed, or a model that could not be used or failed: nothing changed then,
         * and the reason is on the session too (session.get extraction) */
        msgpack_packer *pk = req_result(r);
        msgpack_pack_map(pk, 15);
        rpc_pack_kv_int(pk, "session_id", j->session);
        rpc_pack_kv_str(pk, "status",
                        res->status == EXTRACT_OK         ? "completed"
                        : res->status == EXTRACT_NO_MODEL ? "skipped"
                                                          : "failed");
        rpc_pack_kv_str(pk, "reason", res->status == EXTRACT_OK ? NULL : res->error);
        rpc_pack_kv_int(pk, "entries", res->entries);
        rpc_pack_kv_bool(pk, "more", res->more);
        rpc_pack_kv_int(pk, "facts", res->facts);
        rpc_pack_kv_int(pk, "dropped", res->dropped);
        rpc_pack_kv_int(pk, "added", res->added);
        rpc_pack_kv_int(pk, "updated", res->updated);
        rpc_pack_kv_int(pk, "unchanged", res->unchanged);
        rpc_pack_kv_int(pk, "skipped", res->skipped);
        rpc_pack_cstr(pk, "memory_ids");
        msgpack_pack_array(pk, (uint32_t)res->nids);
        for (int i = 0; i < res->nids; i++)
            msgpack_pack_int64(pk, res->memory_ids[i]);
        rpc_pack_kv_num(pk, "cost_usd", res->cost_usd);
        rpc_pack_kv_str(pk, "trigger", "on_demand");
        pack_model(pk, res);
        req_done(r);
    }
    free(j);
}

static void extract_on_bg(bg_ctx *ctx, void *arg)
{
    extract_job *j = arg;
    if (bg_cancelled(ctx)) {
        j->res.status = EXTRACT_FAILED;
        snprintf(j->res.error, sizeof(j->res.error), "server shutting down");
    } else {
        extract_session(ctx, req_server(j->r), j->tenant, j->dim, j->session, j->through,
                        "on_demand", &j->res);
    }
    if (worker_post(j->w, extract_reply, j) < 0)
        log_error("cannot deliver an extraction result (out of memory)");
}

/* session.extract: extracts the durable facts of the session's transcript since its last
 * extraction (through through_entry_id when given) into memories, on a background thread. */
void h_session_extract(req *r)
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    extract_job *j = calloc(1, sizeof(*j));
    if (!j) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    j->r = r;
    j->w = req_worker(r);
    j->tenant = a->tenant_id;
    j->dim = a->dim;
    j->session = (int64_t)rpc_get_uint(req_arg(r, P_EX_SESSION), 0);
    j->through = (int64_t)rpc_get_uint(req_arg(r, P_EX_THROUGH), 0);
    if (bg_submit(s->bg, extract_on_bg, j) < 0) {
        free(j);
        req_fail(r, RPC_UNAVAILABLE, "server shutting down");
    }
}

/* ---- tenant.dream ------------------------------------------------------------------------- */

enum { P_DR_RUN };
PARAMS(tenant_dream, {"run", RPC_T_BOOL, RPC_P_NULLABLE, 0, 0});

typedef struct dream_job {
    req *r;
    worker *w;
    int64_t tenant;
    uint32_t dim;
    dream_result res;
} dream_job;

static const char *const dream_status_names[] = {"completed", "locked", "not_due"};

/* The answer: {enabled, hours, min_sessions, lock_stale_s, state, pass}. */
static void dream_state_done(req *r, const db_result *res)
{
    if (res->status != DB_OK) {
        req_fail_db(r, res);
        return;
    }
    const PGresult *pr = res->res[0];
    const dream_job *j = req_state(r);
    const config *c = &req_server(r)->cfg;
    msgpack_packer *pk = req_result(r);
    msgpack_pack_map(pk, 6);
    rpc_pack_kv_bool(pk, "enabled", chat_available() && c->dream_hours > 0);
    rpc_pack_kv_num(pk, "hours", c->dream_hours);
    rpc_pack_kv_int(pk, "min_sessions", c->dream_min_sessions);
    rpc_pack_kv_int(pk, "lock_stale_s", c->dream_lock_stale_s);
    rpc_pack_cstr(pk, "state");
    mp_pack_json(pk, PQgetvalue(pr, 0, 0), (size_t)PQgetlength(pr, 0, 0));
    rpc_pack_cstr(pk, "pass");
    if (!j) {
        msgpack_pack_nil(pk);
    } else {
        const dream_result *d = &j->res;
        msgpack_pack_map(pk, 16);
        rpc_pack_kv_str(pk, "status", dream_status_names[d->status]);
        rpc_pack_kv_str(pk, "outcome", d->status == DREAM_OK ? d->status_name : NULL);
        rpc_pack_kv_str(pk, "error", d->error[0] ? d->error : NULL);
        rpc_pack_kv_bool(pk, "takeover", d->takeover);
        rpc_pack_kv_int(pk, "sessions", d->sessions);
        rpc_pack_kv_int(pk, "extracted", d->extracted);
        rpc_pack_kv_int(pk, "failed", d->failed);
        rpc_pack_kv_int(pk, "facts", d->facts);
        rpc_pack_kv_int(pk, "added", d->added);
        rpc_pack_kv_int(pk, "updated", d->updated);
        rpc_pack_kv_int(pk, "unchanged", d->unchanged);
        rpc_pack_kv_int(pk, "merged", d->merged);
        rpc_pack_kv_int(pk, "superseded", d->superseded);
        rpc_pack_kv_int(pk, "archived", d->archived);
        rpc_pack_kv_int(pk, "tokens", (int64_t)(d->tokens_in + d->tokens_out));
        rpc_pack_kv_num(pk, "cost_usd", d->cost_usd);
    }
    req_done(r);
}

static void dream_state_read(req *r)
{
    const char *tid = mp_tenant_param(r);
    if (!tid) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    const char *vals[] = {tid};
    db_query q = {.stmt = sql_def(SQL_DREAM_STATE), DB_VALUES(vals)};
    req_submit(r, req_auth(r)->tenant_id, &q, 1, dream_state_done);
}

static void dream_reply(void *arg)
{
    dream_job *j = arg;
    req *r = j->r;
    if (j->res.status == DREAM_FAILED) {
        req_fail(r, RPC_UNAVAILABLE, "the dream pass failed: %s", j->res.error);
        free(j);
        return;
    }
    dream_job *keep = req_alloc(r, sizeof(*keep));
    if (!keep) {
        free(j);
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    *keep = *j;
    free(j);
    req_set_state(r, keep);
    dream_state_read(r);
}

static void dream_on_bg(bg_ctx *ctx, void *arg)
{
    dream_job *j = arg;
    if (bg_cancelled(ctx)) {
        j->res.status = DREAM_FAILED;
        snprintf(j->res.error, sizeof(j->res.error), "server shutting down");
    } else {
        dream_tenant(ctx, req_server(j->r), j->tenant, j->dim, true, &j->res);
    }
    if (worker_post(j->w, dream_reply, j) < 0)
        log_error("cannot deliver a dream pass's result (out of memory)");
}

/* tenant.dream: the tenant's auto-dream state; with run, a pass now (the time and sessions
 * gates open, never the lock). */
void h_tenant_dream(req *r)
{
    if (!rpc_get_bool(req_arg(r, P_DR_RUN), false)) {
        req_set_state(r, NULL);
        dream_state_read(r);
        return;
    }
    dream_job *j = calloc(1, sizeof(*j));
    if (!j) {
        req_fail(r, RPC_INTERNAL, "out of memory");
        return;
    }
    j->r = r;
    j->w = req_worker(r);
    j->tenant = req_auth(r)->tenant_id;
    j->dim = req_auth(r)->dim;
    if (bg_submit(req_server(r)->bg, dream_on_bg, j) < 0) {
        free(j);
        req_fail(r, RPC_UNAVAILABLE, "server shutting down");
    }
}
