/* server/tenants.c: tenants' vector indexes: lazy loads, change application, catch-up
 * (see tenants.h). */
#include "tenants.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idmap.h"
#include "memfilter.h"
#include "log.h"

enum { T_UNLOADED, T_LOADING, T_READY };

typedef struct waiter {
    struct waiter *next;
    worker *w;
    void (*cb)(void *arg, int status, const char *err);
    void *arg;
    int status;
    char err[200];
} waiter;

/* A change that arrived while the index was loading; applied after the load. */
typedef struct pending {
    struct pending *next;
    uint64_t seq;
    uint64_t id;
    bool del;
    mem_meta m;
    float *vec; /* owned; NULL: metadata only */
} pending;

struct tenant {
    tenants *ts;
    int64_t id;
    uint32_t dim;
    atomic_uint refs; /* the map holds one while the tenant is in it */
    pthread_mutex_t mu;
    int state;
    vindex *vi;
    uint64_t applied; /* every change <= applied is in vi */
    uint64_t *above;  /* applied changes > applied, sorted */
    size_t nabove, cabove;
    idmap *deleted; /* id -> change number of its delete, while above the watermark */
    pending *phead, *ptail;
    waiter *waiters;
    bool catchup_queued;
};

struct tenants {
    server *srv;
    pthread_mutex_t mu;    /* guards map and refs */
    idmap *map;            /* tenant id -> tenant* */
    atomic_bool preloaded; /* the start-up preload has finished */
};

tenants *tenants_create(server *s)
{
    tenants *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return NULL;
    ts->srv = s;
    pthread_mutex_init(&ts->mu, NULL);
    ts->map = idmap_create(64);
    if (!ts->map) {
        pthread_mutex_destroy(&ts->mu);
        free(ts);
        return NULL;
    }
    return ts;
}

static void pending_free_all(tenant *t)
{
    pending *p = t->phead;
    while (p) {
        pending *next = p->next;
        free(p->vec);
        free((void *)p->m.tags);
        free(p);
        p = next;
    }
    t->phead = t->ptail = NULL;
}

static int free_tags(uint64_t id, const float *vec, const void *meta, void *ctx)
{
    free((void *)((const mem_meta *)meta)->tags);
    return 0;
}

static void tenant_free(tenant *t)
{
    if (t->vi)
        vindex_foreach(t->vi, free_tags, NULL);
    vindex_destroy(t->vi);
    idmap_destroy(t->deleted);
    free(t->above);
    pending_free_all(t);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static int free_one(uint64_t key, uint64_t value, void *ctx)
{
    tenant_free((tenant *)(uintptr_t)value);
    return 0;
}

void tenants_destroy(tenants *ts)
{
    if (!ts)
        return;
    idmap_foreach(ts->map, free_one, NULL);
    idmap_destroy(ts->map);
    pthread_mutex_destroy(&ts->mu);
    free(ts);
}

tenant *tenants_get(tenants *ts, int64_t id, uint32_t dim)
{
    pthread_mutex_lock(&ts->mu);
    uint64_t v;
    tenant *t = NULL;
    if (idmap_get(ts->map, (uint64_t)id, &v)) {
        t = (tenant *)(uintptr_t)v;
        atomic_fetch_add(&t->refs, 1);
        pthread_mutex_unlock(&ts->mu);
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (!t)
        goto out;
    t->ts = ts;
    t->id = id;
    t->dim = dim;
    atomic_init(&t->refs, 2); /* the map's and the caller's */
    pthread_mutex_init(&t->mu, NULL);
    t->deleted = idmap_create(16);
    if (!t->deleted || idmap_put(ts->map, (uint64_t)id, (uint64_t)(uintptr_t)t) < 0) {
        idmap_destroy(t->deleted);
        pthread_mutex_destroy(&t->mu);
        free(t);
        t = NULL;
    }
out:
    pthread_mutex_unlock(&ts->mu);
    return t;
}

void tenant_put(tenant *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1)
        tenant_free(t);
}

vindex *tenant_index(tenant *t)
{
    return t->vi;
}

int mem_meta_from_row(mem_meta *m, const loader_row *row)
{
    memset(m, 0, sizeof(*m));
    m->id = row->id;
    m->agent_id = row->agent_id;
    m->clade_id = row->clade_id;
    m->seq = row->seq;
    m->created_ms = row->created_ms;
    m->last_access_ms = row->last_accessed_ms == MEMROW_NO_TIME ? 0 : row->last_accessed_ms;
    m->expires_ms = row->expires_ms == MEMROW_NO_TIME ? INT64_MAX : row->expires_ms;
    m->archived_ms = row->archived_ms == MEMROW_NO_TIME ? 0 : row->archived_ms;
    m->importance = (float)row->importance;
    m->access_count = row->access_count > UINT32_MAX ? UINT32_MAX : (uint32_t)row->access_count;
    m->type = (uint8_t)row->type;
    m->scope = (uint8_t)row->scope;
    m->pinned = row->pinned;
    uint64_t *tags;
    if (mf_tags_from_joined(row->tags, row->tags_len, &tags, &m->ntags) < 0)
        return -ENOMEM;
    m->tags = tags;
    return 0;
}

int mem_meta_from_db(mem_meta *m, const memrow_meta *row)
{
    memset(m, 0, sizeof(*m));
    m->id = row->id;
    m->agent_id = row->agent_id;
    m->clade_id = row->clade_id;
    m->seq = row->seq;
    m->created_ms = row->created_ms;
    m->last_access_ms = row->accessed_ms == MEMROW_NO_TIME ? 0 : row->accessed_ms;
    m->expires_ms = row->expires_ms == MEMROW_NO_TIME ? INT64_MAX : row->expires_ms;
    m->archived_ms = row->archived_ms == MEMROW_NO_TIME ? 0 : row->archived_ms;
    m->importance = (float)row->importance;
    m->access_count = row->access_count > UINT32_MAX ? UINT32_MAX : (uint32_t)row->access_count;
    m->type = (uint8_t)row->type;
    m->scope = (uint8_t)row->scope;
    m->pinned = row->pinned;
    uint64_t *tags;
    if (mf_tags_from_joined(row->tags, row->tags_len, &tags, &m->ntags) < 0)
        return -ENOMEM;
    m->tags = tags;
    return 0;
}

/* Returns a copy of m whose tags are a fresh allocation (for the index to own). */
static int meta_dup(const mem_meta *m, mem_meta *out)
{
    *out = *m;
    if (!m->ntags) {
        out->tags = NULL;
        return 0;
    }
    uint64_t *tags = malloc(m->ntags * sizeof(*tags));
    if (!tags)
        return -ENOMEM;
    memcpy(tags, m->tags, m->ntags * sizeof(*tags));
    out->tags = tags;
    return 0;
}

/* ---- change bookkeeping (t->mu held) ------------------------------------------------ */

static bool seq_applied(tenant *t, uint64_t seq)
{
    if (seq <= t->applied)
        return true;
    size_t lo = 0, hi = t->nabove;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->above[mid] < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->nabove && t->above[lo] == seq;
}

typedef struct prune_ctx {
    uint64_t watermark;
    uint64_t *ids;
    size_t n, cap;
} prune_ctx;

static int collect_old(uint64_t key, uint64_t value, void *arg)
{
    prune_ctx *pc = arg;
    if (value > pc->watermark)
        return 0;
    if (pc->n == pc->cap) {
        size_t cap = pc->cap ? pc->cap * 2 : 16;
        uint64_t *n = realloc(pc->ids, cap * sizeof(*n));
        if (!n)
            return 1;
        pc->ids = n;
        pc->cap = cap;
    }
    pc->ids[pc->n++] = key;
    return 0;
}

/* Records seq as applied and advances the watermark over any contiguous run. */
static void mark_applied(tenant *t, uint64_t seq)
{
    if (seq == t->applied + 1) {
        t->applied = seq;
        size_t k = 0;
        while (k < t->nabove && t->above[k] == t->applied + 1)
            t->applied = t->above[k++];
        if (k) {
            memmove(t->above, t->above + k, (t->nabove - k) * sizeof(*t->above));
            t->nabove -= k;
        }
        /* tombstones at or below the watermark can no longer be undone by a late write */
        if (idmap_count(t->deleted)) {
            prune_ctx pc = {.watermark = t->applied};
            idmap_foreach(t->deleted, collect_old, &pc);
            for (size_t i = 0; i < pc.n; i++)
                idmap_del(t->deleted, pc.ids[i]);
            free(pc.ids);
        }
        return;
    }
    if (t->nabove == t->cabove) {
        size_t cap = t->cabove ? t->cabove * 2 : 16;
        uint64_t *n = realloc(t->above, cap * sizeof(*n));
        if (!n) {
            /* cannot remember it: a catch-up will re-read it, applies are idempotent */
            return;
        }
        t->above = n;
        t->cabove = cap;
    }
    size_t pos = t->nabove;
    while (pos > 0 && t->above[pos - 1] > seq) {
        t->above[pos] = t->above[pos - 1];
        pos--;
    }
    t->above[pos] = seq;
    t->nabove++;
}

static void schedule_catch_up(tenant *t);

static void do_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m)
{
    uint64_t dseq;
    if (idmap_get(t->deleted, id, &dseq) && dseq >= seq)
        return; /* deleted by a later change */
    mem_meta cur, own;
    bool present = vindex_get_meta(t->vi, id, &cur) == 0;
    if (present && cur.seq >= seq)
        return; /* a newer write is already in */
    if (!present && !vec) {
        /* metadata for a memory we have no vector for yet: re-read from the log */
        schedule_catch_up(t);
        return;
    }
    if (meta_dup(m, &own) < 0) {
        log_error("tenant %lld: out of memory indexing memory %llu", (long long)t->id,
                  (unsigned long long)id);
        return;
    }
    own.id = id;
    /* reads (access counts) are not changes: keep the higher count the index already has */
    if (present && cur.access_count > own.access_count) {
        own.access_count = cur.access_count;
        own.last_access_ms = cur.last_access_ms;
    }
    if (present && !vec) {
        vindex_set_meta(t->vi, id, &own);
        free((void *)cur.tags);
        return;
    }
    if (present) {
        vindex_remove(t->vi, id);
        free((void *)cur.tags);
    }
    int rc = vindex_add(t->vi, id, vec, &own);
    if (rc != 0) {
        free((void *)own.tags);
        log_error("tenant %lld: cannot index memory %llu (%d)", (long long)t->id,
                  (unsigned long long)id, rc);
    }
}

static void do_delete(tenant *t, uint64_t seq, uint64_t id)
{
    mem_meta cur;
    if (vindex_get_meta(t->vi, id, &cur) == 0 && cur.seq < seq) {
        vindex_remove(t->vi, id);
        free((void *)cur.tags);
    }
    if (seq > t->applied)
        idmap_put(t->deleted, id, seq);
}

static void apply_locked(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                         const mem_meta *m)
{
    if (seq_applied(t, seq))
        return;
    if (del)
        do_delete(t, seq, id);
    else
        do_upsert(t, seq, id, vec, m);
    mark_applied(t, seq);
}

static void queue_pending(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                          const mem_meta *m)
{
    pending *p = calloc(1, sizeof(*p));
    if (!p)
        return; /* the load's snapshot or a later catch-up covers it */
    p->seq = seq;
    p->id = id;
    p->del = del;
    if (m && meta_dup(m, &p->m) < 0) {
        free(p);
        return;
    }
    if (vec) {
        p->vec = malloc(t->dim * sizeof(float));
        if (!p->vec) {
            free((void *)p->m.tags);
            free(p);
            return;
        }
        memcpy(p->vec, vec, t->dim * sizeof(float));
    }
    if (t->ptail)
        t->ptail->next = p;
    else
        t->phead = p;
    t->ptail = p;
}

static void apply(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                  const mem_meta *m)
{
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY)
        apply_locked(t, seq, id, del, vec, m);
    else if (t->state == T_LOADING)
        queue_pending(t, seq, id, del, vec, m);
    /* unloaded: the next load reads it from the database */
    pthread_mutex_unlock(&t->mu);
}

void tenant_apply_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m)
{
    apply(t, seq, id, false, vec, m);
}

void tenant_apply_delete(tenant *t, uint64_t seq, uint64_t id)
{
    apply(t, seq, id, true, NULL, NULL);
}

/* ---- loading ------------------------------------------------------------------------ */

static void post_waiter(void *arg)
{
    waiter *wt = arg;
    wt->cb(wt->arg, wt->status, wt->status ? wt->err : NULL);
    free(wt);
}

/* Hands every waiter its result on its own worker. Call without t->mu. */
static void release_waiters(waiter *list, int status, const char *err)
{
    while (list) {
        waiter *next = list->next;
        list->status = status;
        if (err)
            snprintf(list->err, sizeof(list->err), "%s", err);
        if (worker_post(list->w, post_waiter, list) < 0) {
            /* cannot reach the worker: out of memory; the request is lost */
            log_error("cannot deliver an index load result (out of memory)");
            free(list);
        }
        list = next;
    }
}

typedef struct load_ctx {
    tenant *t;
    vindex *vi;
    size_t rows;
} load_ctx;

static int load_row(const loader_row *row, void *arg)
{
    load_ctx *lc = arg;
    mem_meta m;
    if (mem_meta_from_row(&m, row) < 0)
        return -1;
    int rc = vindex_add(lc->vi, row->id, row->vec, &m); /* the index owns m.tags now */
    if (rc != 0)
        free((void *)m.tags);
    if (rc == -ENOMEM)
        return -1;
    if (rc != 0)
        log_warn("tenant %lld: memory %llu not indexed (%d)", (long long)lc->t->id,
                 (unsigned long long)row->id, rc);
    lc->rows++;
    return 0;
}

/* Loads t's index from PostgreSQL on this background thread (t is LOADING), applies the
 * changes that arrived meanwhile and wakes the waiters. Returns 0 or -1. */
static int load_now(bg_ctx *ctx, tenant *t)
{
    char err[256] = "";
    uint64_t seq = 0;
    uint64_t t0 = server_mono_ns();
    vindex_opts vo = {.dim = t->dim, .meta_size = sizeof(mem_meta)};
    load_ctx lc = {.t = t, .vi = vindex_create(&vo)};
    int rc = -1;
    if (bg_cancelled(ctx)) {
        snprintf(err, sizeof(err), "server shutting down");
    } else if (!lc.vi) {
        snprintf(err, sizeof(err), "out of memory");
    } else {
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        if (pg) {
            rc = loader_tenant(pg, t->id, t->dim, &seq, load_row, &lc, err, sizeof(err));
            if (rc < 0 && PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
        }
    }
    pthread_mutex_lock(&t->mu);
    waiter *ws = t->waiters;
    t->waiters = NULL;
    if (rc == 0) {
        t->vi = lc.vi;
        t->applied = seq;
        t->nabove = 0;
        t->state = T_READY;
        pending *p = t->phead;
        t->phead = t->ptail = NULL;
        while (p) {
            pending *next = p->next;
            apply_locked(t, p->seq, p->id, p->del, p->vec, p->del ? NULL : &p->m);
            free(p->vec);
            free((void *)p->m.tags);
            free(p);
            p = next;
        }
    } else {
        if (lc.vi)
            vindex_foreach(lc.vi, free_tags, NULL);
        vindex_destroy(lc.vi);
        pending_free_all(t);
        t->state = T_UNLOADED;
    }
    pthread_mutex_unlock(&t->mu);
    if (rc == 0)
        log_info("tenant %lld: index loaded, %zu memories, change %llu, %.1f ms", (long long)t->id,
                 lc.rows, (unsigned long long)seq, (double)(server_mono_ns() - t0) / 1e6);
    else
        log_warn("tenant %lld: index load failed: %s", (long long)t->id, err);
    char reason[300];
    snprintf(reason, sizeof(reason), "index unavailable: %s", err);
    release_waiters(ws, rc == 0 ? 0 : -1, rc == 0 ? NULL : reason);
    return rc;
}

static void load_job(bg_ctx *ctx, void *arg)
{
    tenant *t = arg;
    load_now(ctx, t);
    tenant_put(t);
}

/* Loads every tenant's index once at start, in id order; retries while the database is
 * unreachable. Requests for a tenant not loaded yet wait for (or trigger) its load. */
static void preload_job(bg_ctx *ctx, void *arg)
{
    tenants *ts = arg;
    unsigned delay_ms = 200;
    while (!bg_cancelled(ctx)) {
        char err[256];
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        PGresult *r = pg ? db_exec_blocking(pg, "SELECT * FROM engram_tenant_dims()", 0, NULL, err,
                                            sizeof(err))
                         : NULL;
        if (!r) {
            log_warn("index preload: %s; retrying", err);
            if (pg && PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
            struct timespec ts_sleep = {.tv_sec = 0, .tv_nsec = (long)delay_ms * 1000000L};
            nanosleep(&ts_sleep, NULL);
            delay_ms = delay_ms < 1000 ? delay_ms * 2 : 1000;
            continue;
        }
        uint64_t t0 = server_mono_ns();
        int n = PQntuples(r), loaded = 0;
        for (int i = 0; i < n && !bg_cancelled(ctx); i++) {
            tenant *t =
                tenants_get(ts, atoll(PQgetvalue(r, i, 0)), (uint32_t)atoi(PQgetvalue(r, i, 1)));
            if (!t)
                continue;
            pthread_mutex_lock(&t->mu);
            bool start = t->state == T_UNLOADED;
            if (start)
                t->state = T_LOADING;
            pthread_mutex_unlock(&t->mu);
            if (start && load_now(ctx, t) == 0)
                loaded++;
            tenant_put(t);
        }
        PQclear(r);
        log_info("index preload: %d of %d tenants loaded in %.1f ms", loaded, n,
                 (double)(server_mono_ns() - t0) / 1e6);
        atomic_store(&ts->preloaded, true);
        return;
    }
}

int tenants_preload(tenants *ts)
{
    return bg_submit(ts->srv->bg, preload_job, ts);
}

bool tenants_preloaded(tenants *ts)
{
    return atomic_load(&ts->preloaded);
}

int tenant_when_ready(tenant *t, worker *w, void (*cb)(void *arg, int status, const char *err),
                      void *arg)
{
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY) {
        pthread_mutex_unlock(&t->mu);
        return 1;
    }
    waiter *wt = calloc(1, sizeof(*wt));
    if (!wt) {
        pthread_mutex_unlock(&t->mu);
        return -ENOMEM;
    }
    wt->w = w;
    wt->cb = cb;
    wt->arg = arg;
    wt->next = t->waiters;
    t->waiters = wt;
    bool start = t->state == T_UNLOADED;
    if (start)
        t->state = T_LOADING;
    pthread_mutex_unlock(&t->mu);
    if (start) {
        atomic_fetch_add(&t->refs, 1);
        if (bg_submit(t->ts->srv->bg, load_job, t) < 0) {
            pthread_mutex_lock(&t->mu);
            waiter *ws = t->waiters;
            t->waiters = NULL;
            t->state = T_UNLOADED;
            pthread_mutex_unlock(&t->mu);
            release_waiters(ws, -1, "index unavailable: server shutting down");
            tenant_put(t);
        }
    }
    return 0;
}

/* ---- catch-up from the change log ----------------------------------------------------- */

static int catch_up_change(uint64_t seq, uint64_t id, const loader_row *row, void *arg)
{
    tenant *t = arg;
    if (!row) {
        tenant_apply_delete(t, seq, id);
        return 0;
    }
    mem_meta m;
    if (mem_meta_from_row(&m, row) < 0)
        return -1;
    /* the row is the memory's current state, written by change row->seq >= seq */
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY && !seq_applied(t, seq)) {
        do_upsert(t, row->seq, id, row->vec, &m);
        mark_applied(t, seq);
    }
    pthread_mutex_unlock(&t->mu);
    free((void *)m.tags);
    return 0;
}

static void catch_up_job(bg_ctx *ctx, void *arg)
{
    tenant *t = arg;
    pthread_mutex_lock(&t->mu);
    t->catchup_queued = false;
    bool ready = t->state == T_READY;
    uint64_t after = t->applied;
    pthread_mutex_unlock(&t->mu);
    if (ready && !bg_cancelled(ctx)) {
        char err[256];
        uint64_t upto = 0;
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        if (pg && loader_changes(pg, t->id, t->dim, after, &upto, catch_up_change, t, err,
                                 sizeof(err)) < 0) {
            log_warn("tenant %lld: catch-up failed: %s", (long long)t->id, err);
            if (PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
        } else if (!pg) {
            log_warn("tenant %lld: catch-up failed: %s", (long long)t->id, err);
        }
    }
    tenant_put(t);
}

/* Queues one catch-up for t unless one is queued already. Call with t->mu held. */
static void schedule_catch_up(tenant *t)
{
    if (t->catchup_queued)
        return;
    t->catchup_queued = true;
    atomic_fetch_add(&t->refs, 1);
    if (bg_submit(t->ts->srv->bg, catch_up_job, t) < 0) {
        t->catchup_queued = false;
        atomic_fetch_sub(&t->refs, 1); /* the caller still holds one */
    }
}

void tenants_notify_change(tenants *ts, int64_t id, uint64_t seq)
{
    pthread_mutex_lock(&ts->mu);
    uint64_t v;
    tenant *t = NULL;
    if (idmap_get(ts->map, (uint64_t)id, &v)) {
        t = (tenant *)(uintptr_t)v;
        atomic_fetch_add(&t->refs, 1);
    }
    pthread_mutex_unlock(&ts->mu);
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY && !seq_applied(t, seq))
        schedule_catch_up(t);
    pthread_mutex_unlock(&t->mu);
    tenant_put(t);
}

static int catch_up_one(uint64_t key, uint64_t value, void *ctx)
{
    tenant *t = (tenant *)(uintptr_t)value;
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY)
        schedule_catch_up(t);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void tenants_catch_up_all(tenants *ts)
{
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, catch_up_one, NULL);
    pthread_mutex_unlock(&ts->mu);
}

void tenants_forget(tenants *ts, int64_t id)
{
    pthread_mutex_lock(&ts->mu);
    uint64_t v;
    tenant *t = NULL;
    if (idmap_get(ts->map, (uint64_t)id, &v)) {
        t = (tenant *)(uintptr_t)v;
        idmap_del(ts->map, (uint64_t)id);
    }
    pthread_mutex_unlock(&ts->mu);
    tenant_put(t);
}

typedef struct stats_ctx {
    uint64_t loaded, vectors, bytes;
} stats_ctx;

static int stats_one(uint64_t key, uint64_t value, void *arg)
{
    stats_ctx *sc = arg;
    tenant *t = (tenant *)(uintptr_t)value;
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY) {
        sc->loaded++;
        sc->vectors += vindex_count(t->vi);
        sc->bytes += vindex_bytes(t->vi);
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void tenants_stats(tenants *ts, uint64_t *loaded, uint64_t *vectors, uint64_t *bytes)
{
    stats_ctx sc = {0};
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, stats_one, &sc);
    pthread_mutex_unlock(&ts->mu);
    *loaded = sc.loaded;
    *vectors = sc.vectors;
    *bytes = sc.bytes;
}

typedef struct touch_ctx {
    int64_t now_ms;
} touch_ctx;

static void touch_one(void *meta, void *arg)
{
    mem_meta *m = meta;
    const touch_ctx *tc = arg;
    if (m->access_count < UINT32_MAX)
        m->access_count++;
    if (tc->now_ms > m->last_access_ms)
        m->last_access_ms = tc->now_ms;
}

void tenant_touch(tenant *t, const uint64_t *ids, size_t n, int64_t now_ms)
{
    touch_ctx tc = {.now_ms = now_ms};
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY)
        vindex_update_meta(t->vi, ids, n, touch_one, &tc);
    pthread_mutex_unlock(&t->mu);
}
