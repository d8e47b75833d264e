/* server/domain/dream.c: auto-dream, a pass per tenant over its new sessions (dream.h). */
#include "dream.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "chat.h"
#include "consolidate.h"
#include "extract.h"
#include "json.h"
#include "log.h"
#include "mcall.h"
#include "memrow.h"
#include "metrics.h"
#include "pgsync.h"
#include "prompts.h"
#include "rpc.h"
#include "sql_bg.h"
#include "ubuf.h"

#define ROUNDS_MAX 20 /* extraction runs per session and pass (each reads extract_max_entries) */
#define ERRORS_MAX 10 /* failed sessions listed in the record */

/* One pass. */
typedef struct pass {
    server *s;
    bg_ctx *ctx;
    PGconn *pg;
    int64_t tenant;
    uint32_t dim;
    char tid[24], holder[96];
    dream_result *out;
    ubuf orient, errors; /* JSON fragments of the record */
    int nerrors;
    int64_t *sessions;
    size_t nsessions;
    const char *prune_status;
    int64_t prune_run;
} pass;

/* Runs st with v in a transaction of the tenant's; the result or NULL with err. A failed
 * connection is left to bg_conn to replace. */
static PGresult *tx_exec(pass *p, sqlb_stmt st, const char *const *v, size_t n, char *err,
                         size_t errlen)
{
    /* the connection again: an extraction or consolidation in between may have dropped it */
    p->pg = bg_conn(p->ctx, err, errlen);
    return p->pg ? pgsync_tenant_exec(p->pg, p->tenant, PGSYNC_TX_WRITE, sqlb_def(st), v, n, err,
                                      errlen)
                 : NULL;
}

static void set_status(pass *p, const char *name, const char *fmt, const char *a)
{
    snprintf(p->out->status_name, sizeof(p->out->status_name), "%s", name);
    if (fmt)
        snprintf(p->out->error, sizeof(p->out->error), fmt, a);
}

/* The lock, with the gates checked again under it. Returns 0 (held: p->sessions filled),
 * DREAM_LOCKED / DREAM_NOT_DUE, or -EIO. */
static int lock(pass *p, bool force)
{
    const config *c = &p->s->cfg;
    char err[300], hours[32], mins[16], stale[16], maxs[16];
    snprintf(hours, sizeof(hours), "%.17g", c->dream_hours);
    snprintf(mins, sizeof(mins), "%d", c->dream_min_sessions);
    snprintf(stale, sizeof(stale), "%d", c->dream_lock_stale_s);
    snprintf(maxs, sizeof(maxs), "%d", c->dream_max_sessions);
    const char *v[] = {p->tid, p->holder, hours, mins, stale, force ? "true" : "false", maxs};
    PGresult *res = tx_exec(p, SQLB_DREAM_LOCK, v, 7, err, sizeof(err));
    if (!res) {
        snprintf(p->out->error, sizeof(p->out->error), "taking the dream lock: %s", err);
        return -EIO;
    }
    const char *json = PQgetvalue(res, 0, 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    int rc = -EIO;
    if (json_to_msgpack(json, strlen(json), 8, &pk, NULL, 0) == 0 &&
        msgpack_unpack_next(&up, sb.data, sb.size, &off) == MSGPACK_UNPACK_SUCCESS) {
        const msgpack_object *o = &up.data, *ss = rpc_map_get(o, "sessions");
        if (!rpc_get_bool(rpc_map_get(o, "locked"), false)) {
            const msgpack_object *why = rpc_map_get(o, "why");
            rc = why && why->type == MSGPACK_OBJECT_STR && why->via.str.size == 7
                     ? DREAM_NOT_DUE /* "not_due" */
                     : DREAM_LOCKED;
            snprintf(p->out->error, sizeof(p->out->error), "%s",
                     rc == DREAM_LOCKED ? "another pass holds the tenant's dream lock"
                                        : "the time or sessions gate is closed");
        } else if (ss && ss->type == MSGPACK_OBJECT_ARRAY) {
            p->out->takeover = rpc_get_bool(rpc_map_get(o, "takeover"), false);
            p->sessions = malloc((ss->via.array.size + 1) * sizeof(int64_t));
            rc = p->sessions ? 0 : -ENOMEM;
            for (uint32_t i = 0; rc == 0 && i < ss->via.array.size; i++)
                p->sessions[p->nsessions++] = rpc_get_int(&ss->via.array.ptr[i], 0);
        }
    }
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    PQclear(res);
    if (rc < 0 && !p->out->error[0])
        snprintf(p->out->error, sizeof(p->out->error), "the dream lock's answer is not JSON");
    return rc;
}

/* Refreshes the lock's time; false when another pass took it over. */
static bool touch(pass *p)
{
    char err[300];
    const char *v[] = {p->tid, p->holder};
    PGresult *res = tx_exec(p, SQLB_DREAM_TOUCH, v, 2, err, sizeof(err));
    bool held = res && PQntuples(res) == 1;
    PQclear(res);
    return held;
}

/* Phase 1: the memories by type, and whether the model may be used. Returns 0, 1 (no model:
 * the pass stops, recorded) or -EIO. */
static int orient(pass *p)
{
    char err[300];
    const char *v[] = {p->tid};
    PGresult *res = tx_exec(p, SQLB_DREAM_ORIENT, v, 1, err, sizeof(err));
    if (!res) {
        snprintf(p->out->error, sizeof(p->out->error), "orient: %s", err);
        return -EIO;
    }
    int rc = ubuf_puts(&p->orient, "{\"memories\": {");
    for (int i = 0; i < PQntuples(res) && rc == 0; i++)
        rc = ubuf_printf(&p->orient, "%s\"%s\": %lld", i ? ", " : "", PQgetvalue(res, i, 0),
                         (long long)memrow_i64(res, i, 1, 0));
    PQclear(res);
    mcall m;
    if (mcall_open(&m, p->s, p->pg, p->tenant, err, sizeof(err)) < 0) {
        snprintf(p->out->error, sizeof(p->out->error), "orient: %s", err);
        return -EIO;
    }
    rc = rc < 0 ? rc : ubuf_puts(&p->orient, "}, \"model\": ");
    rc = rc < 0 ? rc : prompts_json_cstr(&p->orient, m.model);
    rc = rc < 0 ? rc
                : ubuf_printf(&p->orient, ", \"tokens_today\": %lld}", (long long)m.tokens_today);
    if (rc < 0) {
        snprintf(p->out->error, sizeof(p->out->error), "out of memory");
        return -EIO;
    }
    if (m.status) {
        set_status(p, "no_model", "%s", m.reason);
        return 1;
    }
    return 0;
}

static void add_error(pass *p, int64_t session, const extract_result *er)
{
    if (p->nerrors++ >= ERRORS_MAX)
        return;
    ubuf_printf(&p->errors, "%s{\"session_id\": %lld, \"status\": ", p->nerrors > 1 ? ", " : "",
                (long long)session);
    prompts_json_cstr(&p->errors, er->model_status ? er->model_status : "failed");
    ubuf_puts(&p->errors, ", \"error\": ");
    prompts_json_cstr(&p->errors, er->error);
    ubuf_putc(&p->errors, '}');
}

/* Phases 2 and 3: each new session's messages through extraction, oldest session first.
 * Returns 0 when every session was covered, 1 when the pass stopped (status set). */
static int gather_and_extract(pass *p)
{
    dream_result *o = p->out;
    o->sessions = (int)p->nsessions;
    for (size_t i = 0; i < p->nsessions && !bg_cancelled(p->ctx); i++) {
        if (!touch(p)) {
            set_status(p, "taken_over", "%s", "another pass took the lock over");
            return 1;
        }
        extract_result er;
        int round = 0;
        do {
            extract_session(p->ctx, p->s, p->tenant, p->dim, p->sessions[i], 0, "dream", &er);
            o->facts += er.facts;
            o->added += er.added;
            o->updated += er.updated;
            o->unchanged += er.unchanged;
            o->tokens_in += er.tokens_in;
            o->tokens_out += er.tokens_out;
            o->cost_usd += er.cost_usd;
        } while (er.status == EXTRACT_OK && er.more && ++round < ROUNDS_MAX);
        /* not found: deleted since. Busy (another run holds the session's claim, perhaps a
         * dead process's until it is stale) stops the pass like a failure: the session is
         * dreamt again by the next pass rather than passed over */
        if (er.status == EXTRACT_OK || er.status == EXTRACT_NOT_FOUND) {
            o->extracted += er.status == EXTRACT_OK;
            o->last_session = p->sessions[i];
            continue;
        }
        o->failed++;
        add_error(p, p->sessions[i], &er);
        set_status(p, er.status == EXTRACT_NO_MODEL ? "no_model" : "partial", NULL, NULL);
        snprintf(o->error, sizeof(o->error), "session %lld: %.400s", (long long)p->sessions[i],
                 er.error);
        return 1;
    }
    if (bg_cancelled(p->ctx)) {
        set_status(p, "partial", "%s", "the server stopped");
        return 1;
    }
    return 0;
}

/* Phase 4: a consolidation run of the tenant. */
static void prune(pass *p)
{
    consolidate_result cr;
    consolidate_tenant(p->ctx, p->s, p->tenant, p->dim, "dream", &cr);
    p->prune_status = cr.status == 0 ? "completed" : cr.status == 1 ? "busy" : "failed";
    p->prune_run = cr.run_id;
    p->out->merged = cr.merged;
    p->out->superseded = cr.superseded;
    p->out->archived = cr.archived;
    p->out->tokens_in += cr.tokens_in;
    p->out->tokens_out += cr.tokens_out;
    p->out->cost_usd += cr.cost_usd;
}

/* The pass's record (dream_state.last_result). */
static int record_json(const pass *p, ubuf *b)
{
    const dream_result *o = p->out;
    int rc = ubuf_puts(b, "{\"holder\": ");
    rc = rc < 0 ? rc : prompts_json_cstr(b, p->holder);
    rc = rc < 0
             ? rc
             : ubuf_printf(b, ", \"takeover\": %s, \"orient\": %s, \"gather\": {\"sessions\": [",
                           o->takeover ? "true" : "false", p->orient.len ? p->orient.data : "null");
    for (size_t i = 0; i < p->nsessions && rc == 0; i++)
        rc = ubuf_printf(b, "%s%lld", i ? ", " : "", (long long)p->sessions[i]);
    rc = rc < 0 ? rc
                : ubuf_printf(b,
                              "]}, \"consolidate\": {\"extracted\": %d, \"failed\": %d, \"facts\": "
                              "%d, \"added\": %d, \"updated\": %d, \"unchanged\": %d, "
                              "\"errors\": [%s]}, \"prune\": ",
                              o->extracted, o->failed, o->facts, o->added, o->updated, o->unchanged,
                              p->errors.len ? p->errors.data : "");
    if (rc == 0 && p->prune_status)
        rc = ubuf_printf(b,
                         "{\"status\": \"%s\", \"run_id\": %lld, \"merged\": %d, "
                         "\"superseded\": %d, \"archived\": %d}",
                         p->prune_status, (long long)p->prune_run, o->merged, o->superseded,
                         o->archived);
    else if (rc == 0)
        rc = ubuf_puts(b, "null");
    rc = rc < 0
             ? rc
             : ubuf_printf(b, ", \"tokens_in\": %llu, \"tokens_out\": %llu, \"cost_usd\": %.17g}",
                           (unsigned long long)o->tokens_in, (unsigned long long)o->tokens_out,
                           o->cost_usd);
    return rc < 0 ? -ENOMEM : 0;
}

/* Records the outcome and releases the lock. */
static void unlock(pass *p)
{
    char err[300], last[24];
    ubuf rec = {0};
    snprintf(last, sizeof(last), "%lld", (long long)p->out->last_session);
    if (record_json(p, &rec) < 0) {
        ubuf_fini(&rec);
        ubuf_puts(&rec, "{}");
    }
    const char *v[] = {
        p->tid, p->holder, p->out->status_name, p->out->error[0] ? p->out->error : NULL,
        last,   rec.data};
    PGresult *res = tx_exec(p, SQLB_DREAM_UNLOCK, v, 6, err, sizeof(err));
    if (!res)
        log_warn("tenant %lld: recording the dream pass: %s", (long long)p->tenant, err);
    else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
        log_warn("tenant %lld: the dream lock was taken over: this pass is not recorded",
                 (long long)p->tenant);
    PQclear(res);
    ubuf_fini(&rec);
}

void dream_tenant(bg_ctx *ctx, server *s, int64_t tenant_id, uint32_t dim, bool force,
                  dream_result *out)
{
    static atomic_ulong passes;
    memset(out, 0, sizeof(*out));
    pass p = {.s = s, .ctx = ctx, .tenant = tenant_id, .dim = dim, .out = out};
    snprintf(p.tid, sizeof(p.tid), "%lld", (long long)tenant_id);
    char host[64] = "";
    gethostname(host, sizeof(host) - 1);
    snprintf(p.holder, sizeof(p.holder), "%s:%ld:dream%lu", host, (long)getpid(),
             (unsigned long)atomic_fetch_add(&passes, 1));
    int rc = lock(&p, force);
    if (rc != 0) {
        out->status = rc < 0 ? DREAM_FAILED : rc;
        if (rc == DREAM_LOCKED)
            metrics_dream(5);
        goto out;
    }
    set_status(&p, "ok", NULL, NULL);
    rc = orient(&p);
    if (rc == 0 && gather_and_extract(&p) == 0)
        prune(&p);
    if (rc < 0)
        set_status(&p, "failed", NULL, NULL);
    unlock(&p);
    out->status = DREAM_OK;
    static const char *const outcomes[] = {"ok", "partial", "no_model", "taken_over", "failed"};
    int oi = 0;
    while (oi < 4 && strcmp(outcomes[oi], out->status_name) != 0)
        oi++;
    metrics_dream(oi);
    log_info("tenant %lld dream (%s): %d sessions, %d extracted, %d facts, %d added, %d updated, "
             "prune %s%s%s",
             (long long)tenant_id, out->status_name, out->sessions, out->extracted, out->facts,
             out->added, out->updated, p.prune_status ? p.prune_status : "skipped",
             out->error[0] ? ": " : "", out->error);
out:
    free(p.sessions);
    ubuf_fini(&p.orient);
    ubuf_fini(&p.errors);
}

/* ---- the scheduler --------------------------------------------------------------------------- */

static void scheduled(bg_ctx *ctx, void *arg)
{
    server *s = arg;
    const config *c = &s->cfg;
    if (!chat_available() || c->dream_hours <= 0)
        return;
    char err[256], hours[32], mins[16], stale[16];
    snprintf(hours, sizeof(hours), "%.17g", c->dream_hours);
    snprintf(mins, sizeof(mins), "%d", c->dream_min_sessions);
    snprintf(stale, sizeof(stale), "%d", c->dream_lock_stale_s);
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg)
        return;
    const char *v[] = {hours, mins, stale, "20"};
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_DREAM_DUE), v, err, sizeof(err));
    if (!r) {
        log_warn("dream scheduler: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    int n = PQntuples(r);
    int64_t *ids = malloc(((size_t)n + 1) * sizeof(*ids));
    uint32_t *dims = malloc(((size_t)n + 1) * sizeof(*dims));
    int k = 0;
    for (int i = 0; ids && dims && i < n; i++) {
        int64_t id = memrow_i64(r, i, 0, 0), dim = memrow_i64(r, i, 1, 0);
        if (id > 0 && dim > 0 && dim <= UINT32_MAX) {
            ids[k] = id;
            dims[k++] = (uint32_t)dim;
        }
    }
    PQclear(r);
    for (int i = 0; i < k && !bg_cancelled(ctx); i++) {
        dream_result res;
        dream_tenant(ctx, s, ids[i], dims[i], false, &res);
    }
    free(ids);
    free(dims);
}

int dream_start(server *s)
{
    return bg_every(s->bg, (unsigned)s->cfg.dream_check_interval_s * 1000u, scheduled, s);
}
