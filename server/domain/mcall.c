/* server/domain/mcall.c: a tenant's chat model calls from background work (mcall.h). */
#include "mcall.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <event2/event.h>

#include "memrow.h"
#include "pgsync.h"
#include "sql_bg.h"
#include "tiers.h"

int mcall_open(mcall *m, server *s, PGconn *c, int64_t tenant, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    m->tenant = tenant;
    if (!chat_available()) {
        m->status = "unconfigured";
        snprintf(m->reason, sizeof(m->reason), "no chat model is configured (llm_provider)");
        return 0;
    }
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant);
    const char *v[] = {tid};
    int rc = pgsync_tenant_begin(c, tenant, PGSYNC_TX_READ, err, errlen);
    PGresult *res = rc == 0 ? PGSYNC_EXEC(c, sqlb_def(SQLB_MODEL_STATE), v, err, errlen) : NULL;
    if (rc == 0) {
        rc = pgsync_tx_end(c, res != NULL, err, errlen);
        if (rc == 0 && res && PQntuples(res) != 1) {
            snprintf(err, errlen, "no tenant %lld", (long long)tenant);
            rc = -EIO;
        }
    }
    if (rc < 0 || !res) {
        PQclear(res);
        return -EIO;
    }
    const char *tier = PQgetvalue(res, 0, 0);
    int ti = tier_parse(tier, strlen(tier));
    const char *cm = PQgetisnull(res, 0, 1) ? NULL : PQgetvalue(res, 0, 1);
    m->tokens_today = memrow_i64(res, 0, 2, 0);
    m->cap = server_tiers(s)[ti < 0 ? 0 : ti].model_tokens_per_day;
    snprintf(m->model, sizeof(m->model), "%s", cm ? cm : chat_default_model());
    bool none = cm && strcmp(cm, "none") == 0;
    PQclear(res);
    if (none) {
        m->status = "off";
        snprintf(m->reason, sizeof(m->reason), "the tenant's chat_model is none");
    } else if (m->cap > 0 && m->tokens_today >= m->cap) {
        m->status = "cap_reached";
        snprintf(m->reason, sizeof(m->reason),
                 "the %s tier's daily model token cap is reached (%lld of %lld tokens used "
                 "today, UTC)",
                 tier_name(ti), (long long)m->tokens_today, (long long)m->cap);
        chat_count_fallback(CHAT_FB_CAP);
    }
    return 0;
}

bool mcall_allowed(mcall *m)
{
    if (m->status)
        return false;
    int64_t used = m->tokens_today + (int64_t)(m->tokens_in + m->tokens_out);
    if (m->cap > 0 && used >= m->cap) {
        m->status = "cap_reached";
        snprintf(m->reason, sizeof(m->reason),
                 "the tier's daily model token cap (%lld) was reached (%lld tokens used today, "
                 "UTC)",
                 (long long)m->cap, (long long)used);
        chat_count_fallback(CHAT_FB_CAP);
        return false;
    }
    return true;
}

/* The provider of m's model, or NULL after saying why in m (status "failed"). */
static llm_provider *provider(mcall *m)
{
    char err[200];
    llm_provider *p = chat_provider(m->model, err, sizeof(err));
    if (!p) {
        m->status = "failed";
        snprintf(m->reason, sizeof(m->reason), "%s", err);
    }
    return p;
}

static void count(mcall *m, const llm_result *out);

int mcall_ask(mcall *m, const llm_request *req, llm_result *out)
{
    if (!mcall_allowed(m))
        return -EAGAIN;
    llm_provider *p = provider(m);
    if (!p)
        return -EAGAIN;
    int rc = llm_call_sync(p, req, out);
    if (rc < 0)
        return rc;
    count(m, out);
    return 0;
}

/* mcall_ask_bg's call: its result and whether it is done. */
typedef struct bg_wait {
    struct event_base *base;
    llm_provider *p;
    bg_ctx *ctx;
    bool done;
    llm_result res;
} bg_wait;

static void bg_done(llm_result *res, void *arg)
{
    bg_wait *w = arg;
    llm_result_move(&w->res, res);
    w->done = true;
}

/* Every 200 ms: a server stopping ends the call (its callback runs, cancelled). */
static void bg_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    bg_wait *w = arg;
    if (bg_cancelled(w->ctx))
        llm_detach(w->p, w->base);
}

int mcall_ask_bg(mcall *m, bg_ctx *ctx, const llm_request *req, llm_result *out)
{
    if (!mcall_allowed(m))
        return -EAGAIN;
    llm_provider *p = provider(m);
    if (!p)
        return -EAGAIN;
    bg_wait w = {.base = event_base_new(), .p = p, .ctx = ctx};
    struct event *tick = w.base ? event_new(w.base, -1, EV_PERSIST, bg_tick, &w) : NULL;
    struct timeval tv = {0, 200000};
    int rc = tick && event_add(tick, &tv) == 0 ? llm_call(p, w.base, req, bg_done, &w) : -ENOMEM;
    while (rc == 0 && !w.done)
        if (event_base_loop(w.base, EVLOOP_ONCE) < 0)
            break;
    if (tick)
        event_free(tick);
    if (w.base) {
        llm_detach(p, w.base); /* a call still running ends here, cancelled */
        event_base_free(w.base);
    }
    if (rc < 0)
        return rc;
    llm_result_move(out, &w.res);
    count(m, out);
    return 0;
}

static void count(mcall *m, const llm_result *out)
{
    m->calls++;
    m->pending_calls++;
    m->tokens_in += out->tokens_in;
    m->tokens_out += out->tokens_out;
    m->pending_in += out->tokens_in;
    m->pending_out += out->tokens_out;
    m->cost_usd += out->cost_usd;
    m->pending_cost += out->cost_usd;
}

int mcall_record(mcall *m, PGconn *c, bool own_tx, char *err, size_t errlen)
{
    if (m->pending_calls == 0)
        return 0;
    char tid[24], ncalls[16], tin[24], tout[24], cost[40];
    snprintf(tid, sizeof(tid), "%lld", (long long)m->tenant);
    snprintf(ncalls, sizeof(ncalls), "%d", m->pending_calls);
    snprintf(tin, sizeof(tin), "%llu", (unsigned long long)m->pending_in);
    snprintf(tout, sizeof(tout), "%llu", (unsigned long long)m->pending_out);
    snprintf(cost, sizeof(cost), "%.17g", m->pending_cost);
    const char *v[] = {tid, ncalls, tin, tout, cost};
    if (own_tx && pgsync_tenant_begin(c, m->tenant, PGSYNC_TX_WRITE, err, errlen) < 0)
        return -EIO;
    PGresult *res = PGSYNC_EXEC(c, sqlb_def(SQLB_MODEL_USAGE_ADD), v, err, errlen);
    bool ok = res != NULL;
    PQclear(res);
    if (own_tx && pgsync_tx_end(c, ok, err, errlen) < 0)
        ok = false;
    if (!ok)
        return -EIO;
    m->pending_calls = 0;
    m->pending_in = m->pending_out = 0;
    m->pending_cost = 0;
    return 0;
}
