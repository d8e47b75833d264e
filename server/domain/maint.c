/* server/domain/maint.c: periodic maintenance (see maint.h). */
#include "maint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "bg.h"
#include "db.h"
#include "pgsync.h"
#include "log.h"
#include "memrow.h"
#include "sql_bg.h"

#define PURGE_BATCH "10000"
#define IDEMPOTENCY_TTL_S "86400"
#define SESSION_BATCH "100" /* top-level sessions per transaction */
#define SESSION_ROUNDS 100

/* Deletes the sessions past their tier's retention, SESSION_BATCH top-level sessions (with
 * their sub-agents and branches) per transaction, until none is left or SESSION_ROUNDS
 * transactions ran. Returns 0, or -EIO after a failure (logged; the connection is given
 * up when it broke). */
static int purge_sessions(bg_ctx *ctx, PGconn *pg, server *s)
{
    char err[256], days[64];
    const tier_limits *tl = server_tiers(s); /* one snapshot (a SIGHUP may publish another) */
    snprintf(days, sizeof(days), "{%d,%d,%d}", tl[TIER_FREE].session_retention_days,
             tl[TIER_STANDARD].session_retention_days, tl[TIER_PREMIUM].session_retention_days);
    long long total = 0;
    for (int i = 0; i < SESSION_ROUNDS; i++) {
        const char *vals[] = {days, SESSION_BATCH};
        PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_SESSION_RETENTION), vals, err, sizeof(err));
        if (!r) {
            log_warn("purging sessions past their retention failed: %s", err);
            if (PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
            return -EIO;
        }
        long long n = memrow_i64(r, 0, 0, 0);
        PQclear(r);
        total += n;
        if (n == 0)
            break;
    }
    if (total > 0)
        log_info("purged %lld sessions past their tier's retention", total);
    return 0;
}

static void purge_expired(bg_ctx *ctx, void *arg)
{
    char err[256];
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg) {
        log_debug("maintenance skipped: %s", err);
        return;
    }
    const char *vals[] = {PURGE_BATCH, IDEMPOTENCY_TTL_S};
    PGresult *r = PGSYNC_EXEC(pg, sqlb_def(SQLB_PURGE_EXPIRED), vals, err, sizeof(err));
    if (!r) {
        log_warn("purging expired memories failed: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    long long n = memrow_i64(r, 0, 0, 0);
    PQclear(r);
    if (n > 0)
        log_info("purged %lld expired memories", n);
    r = pgsync_exec_stmt(pg, sqlb_def(SQLB_SESSION_PURGE), NULL, 0, err, sizeof(err));
    if (!r) {
        log_warn("purging expired checkpoints failed: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    n = memrow_i64(r, 0, 0, 0);
    PQclear(r);
    if (n > 0)
        log_info("purged %lld expired session checkpoints", n);
    if (purge_sessions(ctx, pg, arg) != 0)
        return;
    /* pending access counts into the memories' rows, a batch at a time, of the memories
     * unread for access_fold_idle_s */
    server *srv = arg;
    char idle[32];
    snprintf(idle, sizeof(idle), "%d", srv->cfg.access_fold_idle_s);
    long long folded = 0;
    for (int i = 0; i < 100; i++) {
        const char *fv[] = {PURGE_BATCH, idle};
        r = PGSYNC_EXEC(pg, sqlb_def(SQLB_ACCESS_FOLD), fv, err, sizeof(err));
        if (!r) {
            log_warn("folding access counts failed: %s", err);
            if (PQstatus(pg) != CONNECTION_OK) {
                bg_conn_failed(ctx);
                return;
            }
            break;
        }
        n = memrow_i64(r, 0, 0, 0);
        PQclear(r);
        folded += n;
        if (n < atoll(PURGE_BATCH))
            break;
    }
    if (folded > 0)
        log_debug("folded %lld pending access counts", folded);
    /* the change log: index snapshots older than the retention are rebuilt instead */
    char hours[32];
    snprintf(hours, sizeof(hours), "%d", srv->cfg.change_log_retention_hours);
    const char *pv[] = {hours, PURGE_BATCH};
    r = PGSYNC_EXEC(pg, sqlb_def(SQLB_PRUNE_CHANGES), pv, err, sizeof(err));
    if (!r) {
        log_warn("pruning the change log failed: %s", err);
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        return;
    }
    n = memrow_i64(r, 0, 0, 0);
    PQclear(r);
    if (n > 0)
        log_info("pruned %lld changes older than %s hours from the change log", n, hours);
}

int maint_start(server *s)
{
    unsigned ms = (unsigned)s->cfg.maintenance_interval_s * 1000u;
    return bg_every(s->bg, ms, purge_expired, s);
}

int maint_set_interval(server *s, int interval_s)
{
    return bg_every_set(s->bg, purge_expired, s, (unsigned)interval_s * 1000u);
}
