/* server/domain/tenants.c: tenants' vector indexes: the registry, housekeeping (snapshots,
 * maintenance, recall checks) and eviction (see tenants.h, tenants_int.h). */
#include "tenants.h"
#include "index_engine.h"

#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hash.h"
#include "idmap.h"
#include "log.h"
#include "memfilter.h"
#include "metrics.h"
#include "sql_bg.h"
#include "vfaiss.h"

#include "tenants_int.h"

const double tenants_load_bounds_s[TENANTS_LOAD_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                0.5,   1,    2.5,   5,    10};

/* Counts one successful load of source (0 snapshot, 1 database) that took us. */
void tn_record_load(tenants *ts, int source, uint64_t us)
{
    size_t b = 0;
    while (b < TENANTS_LOAD_BUCKETS - 1 && (double)us > tenants_load_bounds_s[b] * 1e6)
        b++;
    atomic_fetch_add(&ts->load_hist[source][b], 1);
    atomic_fetch_add(&ts->load_us[source], us);
}

tenants *tenants_create(server *s)
{
    tenants *ts = calloc(1, sizeof(*ts));
    if (!ts)
        return NULL;
    ts->srv = s;
    ts->dir_lock = -1;
    pthread_mutex_init(&ts->mu, NULL);
    pthread_mutex_init(&ts->dir_mu, NULL);
    ts->map = idmap_create(64);
    /* the change floors matter to reads on a standby only (tenants_read_floor) */
    bool standby = s->cfg.pg_read_dsn && s->cfg.pg_read_dsn[0];
    ts->floors = standby ? idmap_create(64) : NULL;
    ts->dims = idmap_create(16);
    if (!ts->map || !ts->dims || (standby && !ts->floors)) {
        idmap_destroy(ts->map);
        idmap_destroy(ts->floors);
        idmap_destroy(ts->dims);
        pthread_mutex_destroy(&ts->dir_mu);
        pthread_mutex_destroy(&ts->mu);
        free(ts);
        return NULL;
    }
    const config *c = &s->cfg;
    ts->vo = (vindex_opts){.quant_min = (size_t)c->index_quant_min,
                           .ann_min = (size_t)c->index_ann_min,
                           .ann_candidates = (size_t)c->index_ann_candidates,
                           .ann_max_candidates = (size_t)c->index_ann_max_candidates,
                           .compact_percent = (unsigned)c->index_compact_percent,
                           /* the index reads 0 as its default: the setting's 0 is exact */
                           .tie_margin = c->index_tie_margin > 0 ? c->index_tie_margin : -1};
#ifdef ENGRAM_FAULT_INJECTION
    const char *fault = getenv("ENGRAM_FAULT_INDEX_UPSERT");
    if (fault && atol(fault) > 0) {
        atomic_store(&ts->fault_upserts, atol(fault));
        log_warn("fault injection: the next %ld index upserts fail as out of memory", atol(fault));
    }
    fault = getenv("ENGRAM_FAULT_ROWS_WARM");
    if (fault && atol(fault) > 0) {
        atomic_store(&ts->fault_warms, atol(fault));
        log_warn("fault injection: the next %ld pages of row cache warming fail", atol(fault));
    }
#endif
    if (c->index_memory_mb > 0) {
        ts->budget = (size_t)c->index_memory_mb << 20;
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        ts->budget = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 2 : (size_t)1 << 32;
    }
    return ts;
}

void tn_pending_free_all(tenant *t)
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

int tn_free_tags(uint64_t id, const float *vec, const void *meta, void *ctx)
{
    free((void *)((const mem_meta *)meta)->tags);
    return 0;
}

static void tenant_free(tenant *t)
{
    if (t->vi)
        vindex_foreach(t->vi, tn_free_tags, NULL);
    vindex_destroy(t->vi);
    idmap_destroy(t->deleted);
    free(t->above);
    tn_pending_free_all(t);
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
    idmap_destroy(ts->floors);
    idmap_destroy(ts->dims);
    free(ts->dir);
    if (ts->dir_lock >= 0)
        close(ts->dir_lock);
    pthread_mutex_destroy(&ts->dir_mu);
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
        atomic_store(&t->used_ns, server_mono_ns());
        return t;
    }
    t = calloc(1, sizeof(*t));
    if (!t)
        goto out;
    atomic_init(&t->used_ns, server_mono_ns());
    t->ts = ts;
    t->id = id;
    t->dim = idmap_get(ts->dims, (uint64_t)id, &v) ? (uint32_t)v : dim;
    atomic_init(&t->refs, 2); /* the map's and the caller's */
    t->want_engine = -1;
    pthread_mutex_init(&t->mu, NULL);
    if (idmap_put(ts->map, (uint64_t)id, (uint64_t)(uintptr_t)t) < 0) {
        pthread_mutex_destroy(&t->mu);
        free(t);
        t = NULL;
        goto out;
    }
    /* back in the registry: what it knew when it left (tenants_int.h, floors) */
    if (ts->floors && idmap_get(ts->floors, (uint64_t)id, &v)) {
        t->known = v;
        idmap_del(ts->floors, (uint64_t)id);
    }
out:
    pthread_mutex_unlock(&ts->mu);
    return t;
}

bool tenants_dim_is(const tenant *t, uint32_t dim)
{
    return t->dim == dim; /* fixed at the entry's creation */
}

void tenants_put(tenant *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1)
        tenant_free(t);
}

vindex *tenants_vindex(tenant *t)
{
    return t->vi;
}

/* Returns a copy of m whose tags are a fresh allocation (for the index to own). */
int tn_meta_dup(const mem_meta *m, mem_meta *out)
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

typedef struct hk_item {
    tenant *t;
    uint64_t used_ns;
    size_t bytes;
} hk_item;

typedef struct hk_list {
    hk_item *v;
    size_t n, cap;
} hk_list;

/* Takes a reference on every tenant in the map (idmap_foreach callback, ts->mu held). */
static int hk_collect(uint64_t key, uint64_t value, void *arg)
{
    hk_list *l = arg;
    tenant *t = (tenant *)(uintptr_t)value;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        hk_item *v = realloc(l->v, cap * sizeof(*v));
        if (!v)
            return 1;
        l->v = v;
        l->cap = cap;
    }
    atomic_fetch_add(&t->refs, 1);
    l->v[l->n++] = (hk_item){.t = t, .used_ns = atomic_load(&t->used_ns)};
    return 0;
}

static void hk_release(hk_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        tenants_put(l->v[i].t);
    free(l->v);
}

/* The ranking searches use by default: similarity_weight * similarity + the rest times the
 * composite importance, as memory.search computes it. */
typedef struct blend_ctx {
    const score_params *sp;
    double w;
    int64_t now_ms;
} blend_ctx;

static double blend_score(float sim, const void *meta, void *ctx)
{
    const blend_ctx *b = ctx;
    const mem_meta *m = meta;
    double c = score_composite(b->sp, m->created_ms, mem_meta_access_count(m), m->cited,
                               m->injected, m->importance, b->now_ms);
    return score_blend(b->w, sim, c);
}

/* The default blend of the server's searches (similarity_weight with the composite), for
 * the calibration to measure the depth searches with it use: shape, with bc as its
 * context. NULL when the weight is 1 (similarity alone). */
static const vindex_query *blend_shape(const tenants *ts, blend_ctx *bc, vindex_query *shape)
{
    const config *c = &ts->srv->cfg;
    *bc = (blend_ctx){.sp = &ts->srv->score, .w = c->similarity_weight, .now_ms = server_now_ms()};
    *shape = (vindex_query){.score = blend_score,
                            .score_slope = bc->w,
                            .score_bound = 1.0 - bc->w,
                            .score_monotone = true,
                            .ctx = bc};
    return bc->w < 1.0 ? shape : NULL;
}

static void warn_exact(const tenant *t, double estimate, double target)
{
    log_warn("tenant %lld: approximate search measured recall@10 %.3f at the deepest allowed "
             "depth, below the target %.3f: searching exactly",
             (long long)t->id, estimate, target);
}

void tn_settle(tenant *t, vindex *vi)
{
    if (!vi || !vindex_settle_due(vi))
        return;
    blend_ctx bc;
    vindex_query q;
    const vindex_query *shape = blend_shape(t->ts, &bc, &q);
    uint64_t t0 = server_mono_ns();
    int rc = vindex_settle(vi, t->ts->srv->cfg.index_recall_target, shape);
    double ms = (double)(server_mono_ns() - t0) / 1e6;
    vindex_recall r;
    vindex_get_recall(vi, &r);
    if (rc < 0)
        log_warn("tenant %lld: settling the index after a bulk build: out of memory (the "
                 "recall monitor measures it later)",
                 (long long)t->id);
    else
        log_info("tenant %lld: index settled after a bulk build in %.1f ms: depth %zu, recall@10 "
                 "estimate %.3f%s",
                 (long long)t->id, ms, r.depth, r.estimate,
                 r.exact_fallback ? ", exact scans" : "");
    /* the same warning as the monitor's, once, whichever of the two measured first */
    if (rc >= 0 && r.exact_fallback && !isnan(r.ann_estimate) &&
        !atomic_exchange(&t->recall_warned, true))
        warn_exact(t, r.ann_estimate, t->ts->srv->cfg.index_recall_target);
}

void tn_drop_cold_rows(vindex *vi)
{
    vindex_stats st;
    vindex_get_stats(vi, &st);
    if (st.kind == VINDEX_KIND_ANN && st.rows_mapped > 0)
        vindex_trim(vi);
}

typedef struct settle_job {
    tenant *t; /* a reference, released by the job */
    server_poster where;
    void (*cb)(void *arg);
    void *arg;
} settle_job;

static void settle_job_run(bg_ctx *ctx, void *arg)
{
    settle_job *j = arg;
    tenant *t = j->t;
    if (!bg_cancelled(ctx)) {
        pthread_mutex_lock(&t->mu);
        vindex *vi = t->state == T_READY ? t->vi : NULL;
        pthread_mutex_unlock(&t->mu);
        tn_settle(t, vi); /* our reference keeps vi: no eviction or drop while refs > 2 */
    }
    if (j->where.post(j->where.target, j->cb, j->arg) < 0)
        log_error("cannot deliver the end of a settle (out of memory): a request is lost");
    tenants_put(t);
    free(j);
}

int tenants_settle(tenant *t, server_poster where, void (*cb)(void *arg), void *arg)
{
    pthread_mutex_lock(&t->mu);
    vindex *vi = t->state == T_READY ? t->vi : NULL;
    pthread_mutex_unlock(&t->mu);
    if (!vi || !vindex_settle_due(vi))
        return 1;
    settle_job *j = malloc(sizeof(*j));
    if (!j)
        return -ENOMEM;
    *j = (settle_job){.t = t, .where = where, .cb = cb, .arg = arg};
    atomic_fetch_add(&t->refs, 1);
    int rc = bg_submit(t->ts->srv->bg, settle_job_run, j);
    if (rc < 0) {
        atomic_fetch_sub(&t->refs, 1); /* the caller's reference remains */
        free(j);
        return rc;
    }
    return 0;
}

/* recall_check runs the recall monitor on t's index, when it is approximate: a first
 * measurement of new codes whatever the budget, then a few probes whenever the CPU budget
 * (index_recall_budget_percent of one core, averaged) allows. Logs once when the measured
 * recall fell below index_recall_target and the index had to search deeper or exactly, and
 * once when it recovered. An index whose samples are all of its current vectors
 * (vindex_recall_steady) is probed once every RM_STEADY_PERIOD_NS only. Housekeeping thread. */
#define RM_STEADY_PERIOD_NS 60000000000ull
static void recall_check(tenants *ts, tenant *t)
{
    const config *c = &ts->srv->cfg;
    vindex_stats st;
    vindex_get_stats(t->vi, &st);
    if (st.kind != VINDEX_KIND_ANN)
        return;
    vindex_recall r;
    vindex_get_recall(t->vi, &r);
    size_t probes;
    if (isnan(r.estimate))
        probes = 24; /* new codes: 240 true neighbours, the least the estimate is made of */
    else if (c->index_recall_budget_percent > 0 && ts->rm_allow_ns > 0)
        probes = 4;
    else
        return;
    /* an index whose samples are all of its vectors as they are: probed once a minute (a
     * blended score moves with time), not every round: an idle tenant costs no CPU, and no
     * page-ins of the random rows probes read */
    uint64_t now = server_mono_ns();
    if (!isnan(r.estimate) && vindex_recall_steady(t->vi) &&
        now - t->probed_ns < RM_STEADY_PERIOD_NS) {
        atomic_fetch_add(&ts->n_probe_skips, 1);
        return;
    }
    t->probed_ns = now;
    /* the default blend is measured too, so that default searches get their own depth */
    blend_ctx bc;
    vindex_query q;
    const vindex_query *shape = blend_shape(ts, &bc, &q);
    uint64_t t0 = server_mono_ns();
    int rc = vindex_calibrate_scored(t->vi, probes, c->index_recall_target, shape, &r);
    uint64_t dt = server_mono_ns() - t0;
    ts->rm_allow_ns -= (double)dt;
    atomic_fetch_add(&ts->n_probes, probes);
    atomic_fetch_add(&ts->probe_ns, dt);
    if (rc < 0) {
        log_warn("tenant %lld: recall monitor: out of memory", (long long)t->id);
        return;
    }
    if ((r.was_below || r.exact_fallback) && !isnan(r.ann_estimate) &&
        !atomic_exchange(&t->recall_warned, true)) {
        if (r.exact_fallback)
            warn_exact(t, r.ann_estimate, c->index_recall_target);
        else
            log_warn("tenant %lld: approximate search measured below the recall target %.3f: "
                     "now %zu candidates deep (recall@10 %.3f)",
                     (long long)t->id, c->index_recall_target, r.depth, r.ann_estimate);
    } else if (!r.was_below && !r.exact_fallback && atomic_exchange(&t->recall_warned, false)) {
        log_info("tenant %lld: approximate search back at recall@10 %.3f, %zu candidates deep",
                 (long long)t->id, r.ann_estimate, r.depth);
    }
}

static int by_use(const void *a, const void *b)
{
    const hk_item *x = a, *y = b;
    return x->used_ns < y->used_ns ? -1 : x->used_ns > y->used_ns ? 1 : 0;
}

/* Takes t out of the registry when nobody but the map and the caller holds it and it is in
 * state (T_READY: an eviction, and not while a snapshot is written; T_UNLOADED: a tenant
 * that was written to or looked up but never loaded, retired). Its change floor stays in
 * ts->floors; a retirement fails rather than lose it. Returns true when taken out (the
 * map's reference is dropped; the caller's last put frees the tenant and its index). */
static bool unmap(tenants *ts, tenant *t, int state)
{
    bool ok = false;
    uint64_t v;
    pthread_mutex_lock(&ts->mu);
    if (atomic_load(&t->refs) == 2 && idmap_get(ts->map, (uint64_t)t->id, &v) &&
        (tenant *)(uintptr_t)v == t) {
        pthread_mutex_lock(&t->mu);
        ok = t->state == state && !t->saving && !t->waiters;
        uint64_t floor = tn_floor_locked(t);
        pthread_mutex_unlock(&t->mu);
        /* out of memory for the floor: an eviction goes ahead without it (as every eviction
         * did before floors were kept), a retirement waits */
        if (ok && ts->floors && floor && idmap_put(ts->floors, (uint64_t)t->id, floor) < 0)
            ok = state == T_READY;
        if (ok)
            idmap_del(ts->map, (uint64_t)t->id);
    }
    pthread_mutex_unlock(&ts->mu);
    if (ok)
        tenants_put(t);
    return ok;
}

static bool try_evict(tenants *ts, tenant *t)
{
    return unmap(ts, t, T_READY);
}

/* Drops t's index, loaded with another engine than the tenant now has, when nobody but the
 * caller uses it (as an eviction, but without a snapshot: one of this engine would not be
 * used). The changes it holds are in PostgreSQL; the next use builds the index with the
 * new engine. Returns true when dropped. */
static bool drop_stale(tenants *ts, tenant *t)
{
    pthread_mutex_lock(&t->mu);
    int from = t->engine, to = t->want_engine;
    pthread_mutex_unlock(&t->mu);
    if (!try_evict(ts, t))
        return false; /* in use: the housekeeping tries again every second */
    log_info("tenant %lld: index dropped: its engine changed from %s to %s; the next use "
             "builds it anew",
             (long long)t->id, index_engine_name(from), index_engine_name(to));
    return true;
}

/* Every second on a background thread: rebuilds indexes whose tombstones are due,
 * snapshots changed indexes (at most once per index_snapshot_interval_s), and evicts the
 * least recently used indexes while the loaded ones exceed the memory budget. */
static void housekeeping(bg_ctx *ctx, void *arg)
{
    tenants *ts = arg;
    if (atomic_exchange(&ts->housekeeping, true))
        return;
    hk_list l = {0};
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, hk_collect, &l);
    pthread_mutex_unlock(&ts->mu);
    uint64_t interval = (uint64_t)ts->srv->cfg.index_snapshot_interval_s * 1000000000ull;
    size_t total = 0;
    uint64_t now = server_mono_ns();
    if (ts->rm_last_ns)
        ts->rm_allow_ns +=
            (double)(now - ts->rm_last_ns) * ts->srv->cfg.index_recall_budget_percent / 100.0;
    if (ts->rm_allow_ns > 2e8)
        ts->rm_allow_ns = 2e8; /* at most 200 ms of probing banked */
    ts->rm_last_ns = now;
    size_t rm_first = l.n ? ts->rm_next++ % l.n : 0;
    for (size_t i = 0; i < l.n && !bg_cancelled(ctx); i++) {
        tenant *t = l.v[i].t;
        pthread_mutex_lock(&t->mu);
        bool ready = t->state == T_READY;
        bool due = ready && t->dirty && !t->saving &&
                   (t->saved_mono_ns == 0 || server_mono_ns() - t->saved_mono_ns >= interval);
        bool stale = ready && t->want_engine >= 0 && t->want_engine != t->engine;
        if (ready && t->apply_retry && !stale) {
            /* a change failed to apply: read it again from the change log */
            t->apply_retry = false;
            tn_schedule_catch_up(t);
        }
        pthread_mutex_unlock(&t->mu);
        if (!ready) {
            /* a tenant stored to or looked up, never loaded: after TENANT_RETIRE_NS it leaves
             * the registry (unmap keeps what a read on a standby needs), so that an idle
             * tenant costs this process nothing (bench/README, many tenants) */
            uint64_t used = atomic_load(&t->used_ns);
            if (used < now && now - used >= TENANT_RETIRE_NS && unmap(ts, t, T_UNLOADED))
                atomic_fetch_add(&ts->n_retired, 1);
            continue;
        }
        if (stale) {
            /* its engine changed while requests used it: dropped once idle, no snapshot */
            drop_stale(ts, t);
            continue;
        }
        vindex_stats st;
        vindex_get_stats(t->vi, &st);
        if (st.maintenance_due) {
            uint64_t t0 = server_mono_ns();
            int rc = vindex_maintenance(t->vi);
            if (rc == 1) {
                atomic_fetch_add(&ts->n_rebuilds, 1);
                log_info("tenant %lld: index maintained (%zu deleted vectors dropped, engine "
                         "index built when due) in %.1f ms",
                         (long long)t->id, st.tombstones, (double)(server_mono_ns() - t0) / 1e6);
                vindex_get_stats(t->vi, &st);
            } else if (rc == VINDEX_E_FAISS) {
                char why[160];
                vindex_engine_error(t->vi, why, sizeof(why));
                log_warn("tenant %lld: the FAISS engine's index could not be built (%s); "
                         "searching with the native codes",
                         (long long)t->id, why);
            } else if (rc < 0) {
                log_warn("tenant %lld: index maintenance failed: out of memory", (long long)t->id);
            }
        }
        if (due)
            tn_save_snapshot(t);
        /* resident bytes: the heap and the float rows mapped from the snapshot that are in RAM
         * now (vindex_resident measures them; the file's length is not memory). An
         * approximate index reads a row only for a near-tie: its rows in RAM are held to
         * index_rows_ram_percent of those mapped (the pages searches read last stay) */
        size_t dropped = 0;
        l.v[i].bytes = vindex_rows_keep(t->vi, ts->srv->cfg.index_rows_ram_percent, &dropped);
        if (dropped)
            atomic_fetch_add(&ts->n_rows_dropped, dropped);
        total += l.v[i].bytes;
    }
    /* the recall monitor, starting at a different tenant each round so that a small budget
     * reaches every index in turn */
    for (size_t j = 0; j < l.n && !bg_cancelled(ctx); j++) {
        tenant *t = l.v[(rm_first + j) % l.n].t;
        pthread_mutex_lock(&t->mu);
        bool ready = t->state == T_READY;
        pthread_mutex_unlock(&t->mu);
        if (ready)
            recall_check(ts, t);
    }
    if (total > ts->budget && !bg_cancelled(ctx)) {
        qsort(l.v, l.n, sizeof(*l.v), by_use);
        for (size_t i = 0; i < l.n && total > ts->budget; i++) {
            hk_item *it = &l.v[i];
            if (!it->bytes)
                continue;
            tn_save_snapshot(it->t); /* evicted indexes come back from their snapshot */
            if (try_evict(ts, it->t)) {
                total -= it->bytes;
                atomic_fetch_add(&ts->n_evictions, 1);
                log_info("tenant %lld: index evicted (%.1f MiB; loaded indexes over the "
                         "%.0f MiB budget)",
                         (long long)it->t->id, (double)it->bytes / 1048576.0,
                         (double)ts->budget / 1048576.0);
            }
        }
    }
    hk_release(&l);
    /* Freed request buffers (a batch of 1,000 vectors is megabytes) and the memory of evicted
     * or rebuilt indexes go back to the system rather than staying in the allocator's free
     * lists: after a round that freed an index, and otherwise once a minute. Not every
     * round: malloc_trim walks the arenas' free lists holding their locks, a pause for the
     * workers' allocations. */
    uint64_t freed = atomic_load(&ts->n_evictions) + atomic_load(&ts->n_rebuilds);
    if (freed != ts->hk_freed || ++ts->hk_runs % 60 == 0)
        malloc_trim(0);
    ts->hk_freed = freed;
    atomic_store(&ts->housekeeping, false);
}

int tenants_start(tenants *ts)
{
    int rc = bg_every(ts->srv->bg, 1000, housekeeping, ts);
    if (rc < 0)
        return rc;
    return bg_submit(ts->srv->bg, tn_preload_job, ts);
}

void tenants_save_all(tenants *ts)
{
    hk_list l = {0};
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, hk_collect, &l);
    pthread_mutex_unlock(&ts->mu);
    uint64_t t0 = server_mono_ns();
    size_t saved = 0, failed = 0;
    for (size_t i = 0; i < l.n; i++) {
        int rc = tn_save_snapshot(l.v[i].t);
        saved += rc == 1;
        failed += rc < 0;
    }
    hk_release(&l);
    if (saved || failed)
        log_info("index snapshots at shutdown: %zu written, %zu failed, %.1f ms", saved, failed,
                 (double)(server_mono_ns() - t0) / 1e6);
}

bool tenants_preloaded(tenants *ts)
{
    return atomic_load(&ts->preloaded);
}

int tenants_when_ready(tenant *t, server_poster where,
                       void (*cb)(void *arg, int status, const char *err), void *arg)
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
    wt->where = where;
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
        if (bg_submit(t->ts->srv->bg, tn_load_job, t) < 0) {
            pthread_mutex_lock(&t->mu);
            waiter *ws = t->waiters;
            t->waiters = NULL;
            t->state = T_UNLOADED;
            pthread_mutex_unlock(&t->mu);
            tn_release_waiters(ws, -1, "index unavailable: server shutting down");
            tenants_put(t);
        }
    }
    return 0;
}

tenant *tn_lookup(tenants *ts, int64_t id)
{
    pthread_mutex_lock(&ts->mu);
    uint64_t v;
    tenant *t = NULL;
    if (idmap_get(ts->map, (uint64_t)id, &v)) {
        t = (tenant *)(uintptr_t)v;
        atomic_fetch_add(&t->refs, 1);
    }
    pthread_mutex_unlock(&ts->mu);
    return t;
}

void tenants_engine_changed(tenants *ts, int64_t id, int engine)
{
    if (engine != VINDEX_ENGINE_NATIVE && engine != VINDEX_ENGINE_FAISS)
        return;
    tenant *t = tn_lookup(ts, id);
    if (!t)
        return; /* not loaded here: its next load reads the new engine */
    pthread_mutex_lock(&t->mu);
    /* a load in progress may have read the old engine: compared once it is ready */
    t->want_engine = engine;
    bool stale = t->state == T_READY && t->engine != engine;
    pthread_mutex_unlock(&t->mu);
    if (stale)
        drop_stale(ts, t);
    tenants_put(t);
}

bool tenants_index_info(tenants *ts, int64_t id, tenants_index *out)
{
    memset(out, 0, sizeof(*out));
    tenant *t = tn_lookup(ts, id);
    if (!t)
        return false;
    pthread_mutex_lock(&t->mu);
    bool ready = t->state == T_READY;
    if (ready) {
        vindex_stats st;
        vindex_get_stats(t->vi, &st);
        out->engine = t->engine;
        out->kind = st.kind;
        out->vectors = st.count;
        out->bytes = st.bytes;
        vindex_get_recall(t->vi, &out->recall);
        out->engine_in_use = st.engine;
        out->rows_warm = atomic_load(&t->rows_warm);
        out->rows_warmed = atomic_load(&t->rows_warmed);
    }
    pthread_mutex_unlock(&t->mu);
    tenants_put(t);
    return ready;
}

void tenants_dim_changed(tenants *ts, int64_t id, uint32_t dim)
{
    pthread_mutex_lock(&ts->mu);
    /* out of memory: a request still holding the old dimension may load at it (and fail) */
    idmap_put(ts->dims, (uint64_t)id, dim);
    pthread_mutex_unlock(&ts->mu);
    tenants_forget(ts, id);
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
    if (ts->floors)
        idmap_del(ts->floors, (uint64_t)id);
    pthread_mutex_unlock(&ts->mu);
    if (t) {
        pthread_mutex_lock(&t->mu);
        t->dead = true; /* a snapshot being written is removed when it finishes */
        pthread_mutex_unlock(&t->mu);
    }
    char path[PATH_MAX];
    if (tn_snap_path(ts, id, path, sizeof(path)))
        unlink(path);
    tenants_put(t);
}

static int stats_one(uint64_t key, uint64_t value, void *arg)
{
    tenants_metrics *m = arg;
    tenant *t = (tenant *)(uintptr_t)value;
    m->known++;
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY) {
        vindex_stats st;
        vindex_get_stats(t->vi, &st);
        m->loaded++;
        m->vectors += st.count;
        m->bytes += st.bytes;
        m->rows_mapped += st.rows_mapped;
        m->rows_resident += st.rows_resident;
        m->page_ins += st.page_ins;
        m->rows_read += st.rows_read;
        m->tie_reads += st.tie_reads;
        m->searches += st.searches;
        m->by_kind[st.kind < 3 ? st.kind : 2]++;
        if (st.kind == VINDEX_KIND_ANN) {
            vindex_recall r;
            vindex_get_recall(t->vi, &r);
            if (!isnan(r.estimate)) {
                m->recall_measured++;
                m->recall_sum += r.estimate;
                if (m->recall_measured == 1 || r.estimate < m->recall_min)
                    m->recall_min = r.estimate;
            }
            m->exact_fallbacks += r.exact_fallback;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void tenants_stats(tenants *ts, tenants_metrics *m)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, stats_one, m);
    m->floors = ts->floors ? idmap_count(ts->floors) : 0;
    pthread_mutex_unlock(&ts->mu);
    m->budget = ts->budget;
    m->snapshot_loads = atomic_load(&ts->n_snap_loads);
    m->snapshots_rejected = atomic_load(&ts->n_snap_rejected);
    m->database_loads = atomic_load(&ts->n_db_loads);
    m->snapshots_written = atomic_load(&ts->n_snapshots);
    m->evictions = atomic_load(&ts->n_evictions);
    m->retired = atomic_load(&ts->n_retired);
    m->rebuilds = atomic_load(&ts->n_rebuilds);
    m->recall_probes = atomic_load(&ts->n_probes);
    m->recall_steady_skips = atomic_load(&ts->n_probe_skips);
    m->recall_probe_ns = atomic_load(&ts->probe_ns);
    m->rows_warmed = atomic_load(&ts->n_rows_warmed);
    m->rows_dropped = atomic_load(&ts->n_rows_dropped);
    for (int src = 0; src < 2; src++) {
        for (size_t b = 0; b < TENANTS_LOAD_BUCKETS; b++)
            m->load_hist[src][b] = atomic_load(&ts->load_hist[src][b]);
        m->load_us[src] = atomic_load(&ts->load_us[src]);
    }
}

typedef struct touch_ctx {
    int64_t now_ms;
} touch_ctx;

/* Under the index's writer mutex (vindex_touch_meta), searches reading meanwhile: the
 * writers of these words take turns, the readers load them atomically. */
static void touch_one(uint64_t id, void *meta, void *arg)
{
    mem_meta *m = meta;
    const touch_ctx *tc = arg;
    uint64_t w = vindex_meta_word(&m->access);
    int64_t last = mem_access_word_last(w);
    mem_meta_set_access(m, tc->now_ms > last ? tc->now_ms : last,
                        (uint64_t)mem_access_word_count(w) + 1);
}

void tenants_nonlive_seen(tenant *t, int64_t now_ms)
{
    atomic_store_explicit(&t->nonlive_ms, now_ms, memory_order_relaxed);
}

bool tenants_nonlive_recent(tenant *t, int64_t now_ms)
{
    int64_t seen = atomic_load_explicit(&t->nonlive_ms, memory_order_relaxed);
    return seen != 0 && now_ms - seen < TENANT_NONLIVE_MS;
}

/* Access counts do not make the index dirty: PostgreSQL has them (the worker's access log,
 * within access_flush_ms), and an index restored from a snapshot reads them back from it
 * (refresh_access, tenants_load.c). Otherwise every searched tenant's whole snapshot,
 * hundreds of megabytes at 50,000 x 768, was written again each index_snapshot_interval_s
 * for its access counts alone. */
void tenants_touch(tenant *t, const uint64_t *ids, size_t n, int64_t now_ms)
{
    touch_ctx tc = {.now_ms = now_ms};
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY)
        vindex_touch_meta(t->vi, ids, n, touch_one, &tc);
    pthread_mutex_unlock(&t->mu);
}
