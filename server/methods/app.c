/* server/methods/app.c: the hooks of engramd for the network layer (see app.h). */
#include "app.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "bg.h"
#include "embedder.h"
#include "gcommit.h"
#include "methods.h"
#include "openapi.h"
#include "qadmit.h"
#include "tenancy.h"
#include "tenants.h"
#include "tiers.h"

/* What the methods keep per worker (worker_app). */
typedef struct app_worker {
    unsigned idx;
    access_log *access;
    access_writer *writer;
    qadmit *qadmit;
    idmap *store_groups; /* see app_store_groups */
} app_worker;

static int worker_init(worker *w)
{
    app_worker *aw = calloc(1, sizeof(*aw));
    if (!aw)
        return -ENOMEM;
    worker_set_app(w, aw);
    aw->idx = worker_index(w);
    aw->access = access_log_create();
    aw->store_groups = idmap_create(16);
    if (!aw->access || !aw->store_groups)
        return -ENOMEM;
    aw->writer = access_writer_create(aw->access, worker_db(w), aw->idx);
    /* the holder of query blocks: this worker of this process, unique among the processes
     * sharing the database (host, pid and start time) */
    char host[64] = "", holder[160];
    gethostname(host, sizeof(host) - 1);
    snprintf(holder, sizeof(holder), "%s/%ld/%llu/%u", host, (long)getpid(),
             (unsigned long long)server_mono_ns(), aw->idx);
    aw->qadmit = qadmit_create(worker_db(w), holder);
    if (!aw->writer || !aw->qadmit)
        return -ENOMEM;
    return 0;
}

static void worker_tick(worker *w, uint64_t now_ms, bool draining)
{
    app_worker *aw = worker_app(w);
    access_writer_tick(aw->writer, now_ms, (unsigned)worker_server(w)->cfg.access_flush_ms,
                       draining);
    qadmit_tick(aw->qadmit, draining);
}

/* The store group leaves once its stores ended and its changes were announced. */
static bool worker_idle(worker *w)
{
    app_worker *aw = worker_app(w);
    return access_writer_idle(aw->writer) && idmap_count(aw->store_groups) == 0;
}

static void worker_fini(worker *w)
{
    app_worker *aw = worker_app(w);
    if (!aw)
        return;
    qadmit_destroy(aw->qadmit);
    if (aw->store_groups)
        gc_worker_fini(aw->store_groups); /* a drain that timed out can leave announcements */
    embedder_worker_fini(aw->idx);
    access_writer_destroy(aw->writer);
    access_log_destroy(aw->access);
    idmap_destroy(aw->store_groups);
    free(aw);
    worker_set_app(w, NULL);
}

access_log *app_access(worker *w)
{
    return ((app_worker *)worker_app(w))->access;
}

idmap *app_store_groups(worker *w)
{
    return ((app_worker *)worker_app(w))->store_groups;
}

static void key_in_use(server *s, int64_t key_id, int64_t tenant_id, int tier)
{
    tenancy_key_in_use(s->tenancy, key_id, tenant_id, tier);
}

static void key_released(server *s, int64_t key_id)
{
    tenancy_key_released(s->tenancy, key_id);
}

static hook_admit tenant_admit(server *s, int64_t key_id, int64_t tenant_id, int *tier,
                               uint64_t *retry_ms)
{
    if (!tenancy_key_ok(s->tenancy, key_id, tenant_id))
        return HOOK_ADMIT_REVOKED;
    *tier = tenancy_tier(s->tenancy, tenant_id, *tier);
    if (!tenancy_rate_take(s->tenancy, tenant_id, *tier, retry_ms))
        return HOOK_ADMIT_RATE_LIMITED;
    return HOOK_ADMIT_OK;
}

static void tenant_embedding(server *s, int64_t tenant_id, int64_t *gen, uint32_t *dim,
                             char *provider)
{
    tenancy_embedding(s->tenancy, tenant_id, gen, dim, provider);
}

static uint64_t read_floor(server *s, int64_t tenant_id)
{
    return tenants_read_floor(s->tenants, tenant_id);
}

static void health(server *s, hook_health *h)
{
    h->listener = s->bg && bg_listener_ok(s->bg);
    h->indexes = s->tenants && tenants_preloaded(s->tenants);
}

static int openapi(server *s, struct evbuffer *b)
{
    return openapi_render(s, b);
}

static void on_admit(void *arg, const qa_verdict *v)
{
    req *r = arg;
    if (v->err) {
        req_fail_db(r, v->err);
        return;
    }
    if (v->admitted) {
        req_continue(r);
        return;
    }
    rpc_detail d[3] = {{"limit", RPC_D_INT, {.i = v->limit}},
                       {"usage", RPC_D_INT, {.i = v->used}},
                       {"resets_at", RPC_D_INT, {.i = v->resets_ms}}};
    req_fail_details(r, RPC_QUOTA_EXCEEDED, d, 3,
                     "daily query limit of the %s tier reached (%lld of %lld); it resets at "
                     "00:00 UTC",
                     tier_name(req_auth(r)->tier), (long long)v->used, (long long)v->limit);
}

void app_admit_query(req *r, void (*next)(req *r))
{
    server *s = req_server(r);
    const conn_auth *a = req_auth(r);
    const tier_limits *tl = &server_tiers(s)[a->tier];
    if (req_is_again(r)) {
        next(r); /* admitted and counted the first time */
        return;
    }
    if (tl->queries_per_day <= 0) {
        tenancy_count_query(s->tenancy, a->tenant_id);
        next(r);
        return;
    }
    req_set_next(r, next);
    /* from this worker's block of the day's quota: no round trip in the common case */
    app_worker *aw = worker_app(req_worker(r));
    qadmit_admit(aw->qadmit, a->tenant_id, server_query_limits(s), on_admit, r);
}

const net_hooks *app_hooks(void)
{
    static net_hooks h;
    h = (net_hooks){
        .methods = methods_table,
        .nmethods = methods_count,
        .worker_init = worker_init,
        .worker_tick = worker_tick,
        .worker_idle = worker_idle,
        .worker_fini = worker_fini,
        .key_in_use = key_in_use,
        .key_released = key_released,
        .tenant_admit = tenant_admit,
        .tenant_embedding = tenant_embedding,
        .read_floor = read_floor,
        .health = health,
        .metrics = app_metrics,
        .openapi = openapi,
    };
    return &h;
}
