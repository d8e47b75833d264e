/* server/domain/tenants_load.c: loading a tenant's index from its snapshot or from PostgreSQL, and
 * the preload at start (see tenants.h, tenants_int.h). */
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
#include "loader.h"
#include "log.h"
#include "memfilter.h"
#include "metrics.h"
#include "pgsync.h"
#include "rowcache.h"
#include "sql_bg.h"
#include "vfaiss.h"

#include "tenants_int.h"

/* ---- loading ------------------------------------------------------------------------ */

static void post_waiter(void *arg)
{
    waiter *wt = arg;
    wt->cb(wt->arg, wt->status, wt->status ? wt->err : NULL);
    free(wt);
}

/* Hands every waiter its result on its own thread. Call without t->mu. */
void tn_release_waiters(waiter *list, int status, const char *err)
{
    while (list) {
        waiter *next = list->next;
        list->status = status;
        if (err)
            snprintf(list->err, sizeof(list->err), "%s", err);
        if (list->where.post(list->where.target, post_waiter, list) < 0) {
            /* cannot reach the worker: out of memory; the request is lost */
            log_error("cannot deliver an index load result (out of memory)");
            free(list);
        }
        list = next;
    }
}

/* Frees an index whose metadata owns its tags. */
static void index_free(vindex *vi)
{
    if (vi)
        vindex_foreach(vi, tn_free_tags, NULL);
    vindex_destroy(vi);
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
    int mrc = mem_meta_from_db(&m, &row->meta);
    if (mrc < 0) {
        if (mrc == -EINVAL)
            log_error("tenant %lld: memory %llu: unreadable metadata fields", (long long)lc->t->id,
                      (unsigned long long)row->meta.id);
        return mrc;
    }
    int rc = vindex_add(lc->vi, row->meta.id, row->vec, &m); /* the index owns m.tags now */
    if (rc != 0)
        free((void *)m.tags);
    if (rc == -ENOMEM)
        return -ENOMEM;
    if (rc != 0)
        log_warn("tenant %lld: memory %llu not indexed (%d)", (long long)lc->t->id,
                 (unsigned long long)row->meta.id, rc);
    lc->rows++;
    return 0;
}

/* Builds t's index from every memory in PostgreSQL and installs it (t is LOADING).
 * Returns 0 or a negative errno with err. */
static int load_from_db(PGconn *pg, tenant *t, size_t *rows, char *err, size_t errlen)
{
    vindex_opts vo;
    tn_index_opts(t, &vo);
    load_ctx lc = {.t = t, .vi = vindex_create(&vo)};
    uint64_t seq = 0;
    if (!lc.vi) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = loader_tenant(pg, t->id, t->dim, &seq, load_row, &lc, err, errlen);
    if (rc != 0) { /* -ENOMEM (load_row's or the loader's), -EBADMSG, -ENOENT or -EIO */
        index_free(lc.vi);
        return rc < 0 ? rc : -EIO;
    }
    pthread_mutex_lock(&t->mu);
    t->vi = lc.vi;
    t->applied = seq;
    t->nabove = 0;
    idmap_destroy(t->deleted);
    t->deleted = NULL;
    t->saved_seq = 0;
    t->saved_mono_ns = 0;
    t->dirty = true; /* snapshotted by the next housekeeping round */
    pthread_mutex_unlock(&t->mu);
    *rows = lc.rows;
    return 0;
}

typedef struct replay_ctx {
    tenant *t;
    uint64_t next; /* the change number the log must hold next */
    size_t changes;
    bool gap, oom;
} replay_ctx;

/* Applies one change read from the log after a snapshot (loader_changes callback). */
static int replay_change(uint64_t seq, uint64_t id, const loader_row *row, void *arg)
{
    replay_ctx *rp = arg;
    tenant *t = rp->t;
    if (seq != rp->next) {
        rp->gap = true; /* pruned: the snapshot is older than the log */
        return 1;
    }
    rp->next++;
    rp->changes++;
    mem_meta m;
    if (row && mem_meta_from_db(&m, &row->meta) < 0) {
        rp->oom = true;
        return 1;
    }
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    if (!tn_seq_applied(t, seq)) {
        rc = row ? tn_do_upsert(t, row->meta.seq, id, row->vec, &m) : tn_do_delete(t, seq, id);
        if (rc == 0)
            tn_mark_applied(t, seq);
    }
    pthread_mutex_unlock(&t->mu);
    if (row)
        free((void *)m.tags);
    if (rc != 0) {
        /* the snapshot's index would miss this change: the load fails (retried at the next
         * use) rather than install an index with a gap */
        metrics_index_apply_failed();
        rp->oom = true;
        return 1;
    }
    return 0;
}

typedef struct access_fix {
    idmap *at; /* id -> index into the arrays */
    uint64_t *ids;
    int64_t *counts, *last;
    size_t n, cap;
    bool oom;
} access_fix;

static int access_row(uint64_t id, int64_t count, int64_t last_ms, void *arg)
{
    access_fix *af = arg;
    if (af->n == af->cap) {
        size_t cap = af->cap ? af->cap * 2 : 256;
        uint64_t *i = realloc(af->ids, cap * sizeof(*i));
        if (i)
            af->ids = i;
        int64_t *c = i ? realloc(af->counts, cap * sizeof(*c)) : NULL;
        if (c)
            af->counts = c;
        int64_t *l = c ? realloc(af->last, cap * sizeof(*l)) : NULL;
        if (l)
            af->last = l;
        if (!l) {
            af->oom = true;
            return 1;
        }
        af->cap = cap;
    }
    if (idmap_put(af->at, id, af->n) < 0) {
        af->oom = true;
        return 1;
    }
    af->ids[af->n] = id;
    af->counts[af->n] = count;
    af->last[af->n] = last_ms == MEMROW_NO_TIME ? 0 : last_ms;
    af->n++;
    return 0;
}

static void access_fix_one(uint64_t id, void *meta, void *arg)
{
    const access_fix *af = arg;
    mem_meta *m = meta;
    uint64_t i;
    if (!idmap_get(af->at, id, &i))
        return;
    uint64_t c = mem_meta_access_count(m);
    uint64_t db = af->counts[i] < 0 ? 0 : (uint64_t)af->counts[i];
    int64_t last = mem_meta_last_access(m);
    mem_meta_set_access(m, af->last[i] > last ? af->last[i] : last, db > c ? db : c);
}

/* Brings the access counts of a restored index up to the database's (reads are not
 * changes, so the replay does not carry them, and other processes count reads too).
 * Returns 0 or a negative errno with err. */
static int refresh_access(PGconn *pg, tenant *t, vindex *vi, char *err, size_t errlen)
{
    access_fix af = {.at = idmap_create(256)};
    int rc = -ENOMEM;
    if (af.at)
        rc = loader_accessed(pg, t->id, 0, access_row, &af, err, errlen);
    if (!af.at || af.oom) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
    }
    if (rc == 0 && af.n)
        vindex_update_meta(vi, af.ids, af.n, access_fix_one, &af);
    idmap_destroy(af.at);
    free(af.ids);
    free(af.counts);
    free(af.last);
    return rc == 0 ? 0 : -1;
}

static const char *snap_error(int rc)
{
    switch (rc) {
    case VINDEX_E_CORRUPT:
        return "corrupt (checksum, length or format)";
    case VINDEX_E_MISMATCH:
        return "written for another dimension or format";
    case -ENOMEM:
        return "out of memory";
    default:
        return rc < 0 ? strerror(-rc) : "unreadable";
    }
}

/* Discards the index a snapshot load installed in t (t is LOADING). */
static void uninstall(tenant *t)
{
    pthread_mutex_lock(&t->mu);
    vindex *vi = t->vi;
    t->vi = NULL;
    t->applied = 0;
    t->nabove = 0;
    idmap_destroy(t->deleted);
    t->deleted = NULL;
    pthread_mutex_unlock(&t->mu);
    index_free(vi);
}

/* Loads t's index from its snapshot and replays the changes committed after it (t is
 * LOADING). Returns 0 when installed; 1 when there is no usable snapshot (missing, corrupt,
 * stale, or older than the change log: the caller rebuilds from PostgreSQL); a negative errno with
 * err when the database failed. */
static int load_from_snapshot(PGconn *pg, tenant *t, size_t *rows, size_t *changes, char *err,
                              size_t errlen)
{
    tenants *ts = t->ts;
    char path[PATH_MAX];
    if (!tn_snap_dir_ready(ts, pg) || !tn_snap_path(ts, t->id, path, sizeof(path)))
        return 1;
    vindex_opts vo;
    tn_index_opts(t, &vo);
    snap_id want = tn_snap_id_of(&vo), got;
    /* a snapshot of another engine is not even read (an engine change, see
     * tenants_engine_changed, or a changed index_engine or index_faiss_factory setting) */
    if (tn_snap_file_other(path, &want, &got)) {
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_info("tenant %lld: snapshot %s not used: written by %s%s; rebuilding from the "
                 "database",
                 (long long)t->id, path, tn_snap_id_name(&got),
                 got.engine == want.engine ? " with another factory" : "");
        return 1;
    }
    vindex *vi = NULL;
    uint64_t upto = 0, now_seq = 0;
    void *x = NULL;
    size_t xlen = 0, rec_len = 0;
    int rc = vindex_load_extra(path, &vo, &vi, &upto, &x, &xlen);
    if (rc == VINDEX_E_NOT_FOUND)
        return 1;
    if (rc != 0) {
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_warn("tenant %lld: snapshot %s not used: %s; rebuilding from the database",
                 (long long)t->id, path, snap_error(rc));
        return 1;
    }
    bool known = tn_snap_extra_split(x, xlen, &rec_len, &got);
    if (known && (got.engine != want.engine || got.factory != want.factory)) {
        /* no tags were restored: the pointers in the metadata are the saved ones */
        free(x);
        vindex_destroy(vi);
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_info("tenant %lld: snapshot %s not used: written by %s; rebuilding from the "
                 "database",
                 (long long)t->id, path, tn_snap_id_name(&got));
        return 1;
    }
    /* extra bytes in no known format: tags_restore refuses them (and resets the pointers) */
    rc = tn_tags_restore(vi, known ? x : NULL, known ? rec_len : 0, upto);
    free(x);
    if (rc < 0) {
        if (rc == -EBADMSG)
            index_free(vi);
        else
            vindex_destroy(vi); /* no tags were allocated */
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_warn("tenant %lld: snapshot %s not used: its metadata does not match its vectors; "
                 "rebuilding from the database",
                 (long long)t->id, path);
        return 1;
    }
    pthread_mutex_lock(&t->mu);
    t->vi = vi;
    t->applied = upto;
    t->nabove = 0;
    idmap_destroy(t->deleted);
    t->deleted = NULL;
    pthread_mutex_unlock(&t->mu);
    replay_ctx rp = {.t = t, .next = upto + 1};
    rc = loader_changes(pg, t->id, t->dim, t->ts->srv->on_citus, upto, &now_seq, replay_change, &rp,
                        err, errlen);
    if (rc < 0 || rp.oom) {
        if (rp.oom)
            snprintf(err, errlen, "out of memory");
        uninstall(t);
        return rp.oom ? -ENOMEM : rc < 0 ? rc : -EIO;
    }
    if (rp.gap || now_seq < upto || rp.next != now_seq + 1) {
        uninstall(t);
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        if (now_seq < upto)
            log_warn("tenant %lld: snapshot %s not used: it holds change %llu but the database "
                     "only reaches %llu; rebuilding from the database",
                     (long long)t->id, path, (unsigned long long)upto, (unsigned long long)now_seq);
        else
            log_warn("tenant %lld: snapshot %s not used: changes after %llu are no longer in the "
                     "change log; rebuilding from the database",
                     (long long)t->id, path, (unsigned long long)upto);
        return 1;
    }
    if (refresh_access(pg, t, vi, err, errlen) < 0) {
        uninstall(t);
        return -EIO;
    }
    pthread_mutex_lock(&t->mu);
    t->saved_seq = upto;
    t->saved_mono_ns = server_mono_ns();
    t->dirty = rp.changes > 0;
    pthread_mutex_unlock(&t->mu);
    *rows = vindex_count(vi);
    *changes = rp.changes;
    atomic_fetch_add(&ts->n_snap_loads, 1);
    tn_drop_cold_rows(vi);
    return 0;
}

/* Builds t's index from a hot standby (t is LOADING), then applies from the primary pg the
 * changes the standby had not replayed yet, so the index is as current as one built from
 * the primary: the bulk of the bytes (every embedding) comes from the standby. Returns 0
 * when installed; 1 when the standby cannot serve (unreachable, failed, or so far behind
 * that the primary's change log no longer reaches back to it: the caller builds from the
 * primary); a negative errno with err when the primary failed. */
static int load_from_standby(bg_ctx *ctx, PGconn *pg, tenant *t, size_t *rows, size_t *changes,
                             char *err, size_t errlen)
{
    PGconn *rpg = bg_read_conn(ctx);
    if (!rpg)
        return 1;
    char rerr[256];
    int rc = load_from_db(rpg, t, rows, rerr, sizeof(rerr));
    if (rc < 0) {
        log_warn("tenant %lld: index load from the read replica failed, using the primary: %s",
                 (long long)t->id, rerr);
        if (PQstatus(rpg) != CONNECTION_OK)
            bg_read_conn_failed(ctx);
        return 1;
    }
    pthread_mutex_lock(&t->mu);
    uint64_t upto = t->applied;
    pthread_mutex_unlock(&t->mu);
    replay_ctx rp = {.t = t, .next = upto + 1};
    uint64_t now_seq = 0;
    rc = loader_changes(pg, t->id, t->dim, t->ts->srv->on_citus, upto, &now_seq, replay_change, &rp,
                        err, errlen);
    if (rc < 0 || rp.oom) {
        if (rp.oom)
            snprintf(err, errlen, "out of memory");
        uninstall(t);
        return rp.oom ? -ENOMEM : rc < 0 ? rc : -EIO;
    }
    if (rp.gap || now_seq < upto || rp.next != now_seq + 1) {
        uninstall(t);
        log_warn("tenant %lld: the read replica is at change %llu, which the change log no "
                 "longer reaches back to (the primary is at %llu): building from the primary",
                 (long long)t->id, (unsigned long long)upto, (unsigned long long)now_seq);
        return 1;
    }
    *changes = rp.changes;
    return 0;
}

/* Sets t->engine, the engine the load creates the index with, from the tenant's choice in
 * PostgreSQL or else the index_engine setting (t is LOADING). Returns 0 or the loader's
 * negative errno with err. */
static int read_engine(PGconn *pg, tenant *t, char *err, size_t errlen)
{
    const config *c = &t->ts->srv->cfg;
    char name[16];
    int rc = loader_index_engine(pg, t->id, name, sizeof(name), err, errlen);
    if (rc < 0)
        return rc; /* -ENOENT, -EBADMSG or -EIO */
    int e = index_engine_parse(name, strlen(name));
    if (e < 0)
        e = index_engine_parse(c->index_engine, strlen(c->index_engine));
    pthread_mutex_lock(&t->mu);
    t->engine = e < 0 ? VINDEX_ENGINE_NATIVE : e;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

/* ---- warming the row cache ------------------------------------------------------------
 *
 * A search packs its results from the row cache, or reads the missing rows from PostgreSQL:
 * after a start or an eviction every first read of a row is a round trip, often to a page
 * the database has to read from disk (1 to 5 ms for ten rows measured here), and those
 * make the latency tail of a tenant's first minutes. So after each load of its index a
 * tenant's newest live rows are read into the cache, a page at a time on a background
 * thread, while the cache holds less than row_cache_prewarm_percent of its budget: rows of
 * other tenants are not pushed out to make room. Entries carry their change numbers as any
 * other (rowcache.h): a row changed meanwhile is simply not served at the old version. */

enum { ROWS_WARM_PAGE = 2000, ROWS_WARM_CHECK = 64 };

/* One tenant's warming: a job reads one page and queues itself again for the next, so that
 * index loads and catch-ups queued meanwhile run between pages. Owns a reference to t. */
typedef struct warm_job {
    tenant *t;
    unsigned gen;    /* t->rows_warm_gen when queued: a newer load starts its own */
    uint64_t before; /* the next page holds ids below it (0: from the newest) */
    uint64_t limit;  /* bytes of the cache above which warming stops */
    uint64_t t0;     /* when it was queued */
    size_t n;        /* rows cached so far */
    rowcache *rc;
} warm_job;

/* Whether the cache holds its warming share already. */
static bool warm_full(const warm_job *w)
{
    uint64_t entries, bytes, hits, misses;
    rc_stats(w->rc, &entries, &bytes, &hits, &misses);
    return bytes >= w->limit;
}

/* loader_rows callback: caches one row; 1 (stop) once the cache holds its share. */
static int warm_row(const memrow *m, void *arg)
{
    warm_job *w = arg;
    if (w->n % ROWS_WARM_CHECK == 0 && warm_full(w))
        return 1;
    rc_put(w->rc, w->t->id, m);
    w->n++;
    return 0;
}

/* Drops w and its reference to the tenant. */
static void warm_free(warm_job *w)
{
    tenants_put(w->t);
    free(w);
}

/* Ends w's warming in state (err: why it failed), and frees it. */
static void warm_finish(warm_job *w, int state, const char *err)
{
    tenant *t = w->t;
    if (atomic_load(&t->rows_warm_gen) == w->gen)
        atomic_store(&t->rows_warm, state);
    if (state == TENANTS_ROWS_FAILED)
        log_warn("tenant %lld: reading its rows into the row cache failed after %zu rows: %s",
                 (long long)t->id, w->n, err);
    else
        log_debug("tenant %lld: %zu rows read into the row cache in %.1f ms (%s)", (long long)t->id,
                  w->n, (double)(server_mono_ns() - w->t0) / 1e6, tenants_rows_warm_name(state));
    warm_free(w);
}

/* Reads the next page of w's tenant's newest live rows into the row cache (see above), then
 * queues itself for the next. Background thread. */
static void rows_warm_job(bg_ctx *ctx, void *arg)
{
    warm_job *w = arg;
    tenant *t = w->t;
    char err[256] = "";
    pthread_mutex_lock(&t->mu);
    bool go = t->state == T_READY && !t->dead && atomic_load(&t->rows_warm_gen) == w->gen;
    pthread_mutex_unlock(&t->mu);
    if (!go || bg_cancelled(ctx)) {
        /* unloaded, deleted or loaded again since (that load warms anew), or shutting down */
        warm_free(w);
        return;
    }
    atomic_store(&t->rows_warm, TENANTS_ROWS_WARMING);
#ifdef ENGRAM_FAULT_INJECTION
    if (tn_fault_take(&t->ts->fault_warms)) {
        warm_finish(w, TENANTS_ROWS_FAILED, "fault injection");
        return;
    }
#endif
    PGconn *pg = bg_conn(ctx, err, sizeof(err));
    if (!pg) {
        warm_finish(w, TENANTS_ROWS_FAILED, err);
        return;
    }
    size_t n = 0, was = w->n;
    uint64_t last = 0;
    int rc =
        loader_rows(pg, t->id, w->before, ROWS_WARM_PAGE, warm_row, w, &last, &n, err, sizeof(err));
    atomic_fetch_add(&t->rows_warmed, w->n - was);
    atomic_fetch_add(&t->ts->n_rows_warmed, w->n - was);
    if (rc < 0) {
        if (PQstatus(pg) != CONNECTION_OK)
            bg_conn_failed(ctx);
        warm_finish(w, TENANTS_ROWS_FAILED, err);
    } else if (rc > 0) {
        warm_finish(w, TENANTS_ROWS_CACHE_FULL, NULL);
    } else if (n < ROWS_WARM_PAGE) {
        warm_finish(w, TENANTS_ROWS_DONE, NULL);
    } else {
        w->before = last;
        if (bg_submit(t->ts->srv->bg, rows_warm_job, w) < 0)
            warm_free(w); /* shutting down */
    }
}

/* Queues the warming of t's rows, just loaded (or marks warming off). t->mu not held. */
static void schedule_rows_warm(tenant *t)
{
    const config *c = &t->ts->srv->cfg;
    unsigned gen = atomic_fetch_add(&t->rows_warm_gen, 1) + 1;
    atomic_store(&t->rows_warmed, 0);
    if (c->row_cache_mb == 0 || c->row_cache_prewarm_percent == 0) {
        atomic_store(&t->rows_warm, TENANTS_ROWS_OFF);
        return;
    }
    warm_job *w = calloc(1, sizeof(*w));
    if (!w) {
        atomic_store(&t->rows_warm, TENANTS_ROWS_FAILED);
        return;
    }
    *w = (warm_job){.t = t,
                    .gen = gen,
                    .limit = ((uint64_t)c->row_cache_mb << 20) / 100 *
                             (uint64_t)c->row_cache_prewarm_percent,
                    .t0 = server_mono_ns(),
                    .rc = t->ts->srv->rows};
    atomic_store(&t->rows_warm, TENANTS_ROWS_PENDING);
    atomic_fetch_add(&t->refs, 1);
    if (bg_submit(t->ts->srv->bg, rows_warm_job, w) < 0) {
        atomic_store(&t->rows_warm, TENANTS_ROWS_FAILED);
        atomic_fetch_sub(&t->refs, 1); /* the caller still holds one */
        free(w);
    }
}

const char *tenants_rows_warm_name(int state)
{
    static const char *const names[] = {"pending",    "warming", "done",
                                        "cache_full", "off",     "failed"};
    return state >= 0 && state <= TENANTS_ROWS_FAILED ? names[state] : "unknown";
}

/* Loads t's index on this background thread (t is LOADING): from its snapshot plus the
 * changes after it, else from PostgreSQL; then applies the changes that arrived meanwhile
 * and wakes the waiters, and queues the warming of its rows. Returns 0 or a negative errno. */
static int load_now(bg_ctx *ctx, tenant *t)
{
    char err[256] = "";
    uint64_t t0 = server_mono_ns();
    size_t rows = 0, changes = 0;
    int rc = -EIO, from = -1;
    if (bg_cancelled(ctx)) {
        snprintf(err, sizeof(err), "server shutting down");
    } else {
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        if (pg && read_engine(pg, t, err, sizeof(err)) < 0) {
            if (PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
        } else if (pg) {
            from = load_from_snapshot(pg, t, &rows, &changes, err, sizeof(err));
            if (from == 1) {
                rc = load_from_standby(ctx, pg, t, &rows, &changes, err, sizeof(err));
                if (rc == 0)
                    from = 2;
                else if (rc == 1)
                    rc = load_from_db(pg, t, &rows, err, sizeof(err));
                if (rc == 0)
                    atomic_fetch_add(&t->ts->n_db_loads, 1);
            } else {
                rc = from;
            }
            if (rc < 0 && PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
        }
    }
    if (rc == 0) {
        /* an index built from rows (or grown past a threshold by the changes replayed) is
         * measured before the first search waiting for it runs, not scanned exactly until
         * the recall monitor gets to it; a snapshot carries its measurement */
        pthread_mutex_lock(&t->mu);
        vindex *vi = t->vi;
        pthread_mutex_unlock(&t->mu);
        tn_settle(t, vi);
    }
    pthread_mutex_lock(&t->mu);
    waiter *ws = t->waiters;
    t->waiters = NULL;
    if (rc == 0) {
        t->state = T_READY;
        pending *p = t->phead;
        t->phead = t->ptail = NULL;
        while (p) {
            pending *next = p->next;
            tn_apply_locked(t, p->seq, p->id, p->del, p->vec, p->del ? NULL : &p->m);
            free(p->vec);
            free((void *)p->m.tags);
            free(p);
            p = next;
        }
    } else {
        tn_pending_free_all(t);
        t->state = T_UNLOADED;
    }
    uint64_t applied = t->applied;
    pthread_mutex_unlock(&t->mu);
    uint64_t took_ns = server_mono_ns() - t0;
    double ms = (double)took_ns / 1e6;
    if (rc == 0)
        tn_record_load(t->ts, from == 0 ? 0 : 1, took_ns / 1000);
    const char *engine = index_engine_name(t->engine); /* written before the load, by it */
    if (rc == 0 && from == 0)
        log_info("tenant %lld: index loaded from its snapshot, %zu memories, %zu changes "
                 "replayed, change %llu, %s engine, %.1f ms",
                 (long long)t->id, rows, changes, (unsigned long long)applied, engine, ms);
    else if (rc == 0 && from == 2)
        log_info("tenant %lld: index built from the read replica, %zu memories, %zu changes "
                 "then from the primary, change %llu, %s engine, %.1f ms",
                 (long long)t->id, rows, changes, (unsigned long long)applied, engine, ms);
    else if (rc == 0)
        log_info("tenant %lld: index built from the database, %zu memories, change %llu, %s "
                 "engine, %.1f ms",
                 (long long)t->id, rows, (unsigned long long)applied, engine, ms);
    else
        log_warn("tenant %lld: index load failed: %s", (long long)t->id, err);
    char reason[300];
    snprintf(reason, sizeof(reason), "index unavailable: %s", err);
    tn_release_waiters(ws, rc == 0 ? 0 : -1, rc == 0 ? NULL : reason);
    if (rc == 0)
        schedule_rows_warm(t);
    return rc;
}

void tn_load_job(bg_ctx *ctx, void *arg)
{
    tenant *t = arg;
    load_now(ctx, t);
    tenants_put(t);
}

static void preload_one_job(bg_ctx *ctx, void *arg)
{
    tenant *t = arg;
    tenants *ts = t->ts;
    load_now(ctx, t);
    tenants_put(t);
    if (atomic_fetch_sub(&ts->preload_left, 1) == 1) {
        atomic_store(&ts->preloaded, true);
        log_info("index preload finished");
    }
}

typedef struct snap_file {
    int64_t id;
    uint32_t dim;
    time_t mtime;
    off_t size;
} snap_file;

static int by_mtime_desc(const void *a, const void *b)
{
    const snap_file *x = a, *y = b;
    return x->mtime < y->mtime ? 1 : x->mtime > y->mtime ? -1 : 0;
}

/* Removes snapshots of tenants that no longer exist and temporary files a crash left: all
 * of them when no other engramd writes in the directory (see snap_dir), else those older
 * than an hour (another process may be writing a fresh one). */
static void remove_strays(tenants *ts, const idmap *known)
{
    pthread_mutex_lock(&ts->dir_mu);
    char *dir = ts->dir ? strdup(ts->dir) : NULL;
    bool alone = ts->dir_alone;
    pthread_mutex_unlock(&ts->dir_mu);
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        free(dir);
        return;
    }
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        const char *name = e->d_name;
        size_t digits = strspn(name, "0123456789");
        bool snap = digits > 0 && strcmp(name + digits, ".idx") == 0;
        bool tmp = digits > 0 && strncmp(name + digits, ".idx.tmp.", 9) == 0;
        if (!snap && !tmp)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        struct stat sb;
        if (stat(path, &sb) != 0)
            continue;
        if ((snap && !idmap_get(known, strtoull(name, NULL, 10), NULL)) ||
            (tmp && (alone || now - sb.st_mtime > 3600))) {
            if (unlink(path) == 0)
                log_info("removed stray index file %s", path);
        }
    }
    closedir(d);
    free(dir);
}

/* At start: loads, newest first, the indexes that have snapshots, as far as the memory
 * budget allows (estimated by file size); every other index loads on first use. Retries
 * while the database is unreachable. */
void tn_preload_job(bg_ctx *ctx, void *arg)
{
    tenants *ts = arg;
    unsigned delay_ms = 200;
    while (!bg_cancelled(ctx)) {
        char err[256];
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        PGresult *r =
            pg ? pgsync_exec_stmt(pg, sqlb_def(SQLB_TENANT_DIMS), NULL, 0, err, sizeof(err)) : NULL;
        if (!r) {
            log_warn("index preload: %s; retrying", err);
            if (pg && PQstatus(pg) != CONNECTION_OK)
                bg_conn_failed(ctx);
            struct timespec ts_sleep = {.tv_sec = 0, .tv_nsec = (long)delay_ms * 1000000L};
            nanosleep(&ts_sleep, NULL);
            delay_ms = delay_ms < 1000 ? delay_ms * 2 : 1000;
            continue;
        }
        int n = PQntuples(r);
        snap_file *files = calloc((size_t)n + 1, sizeof(*files));
        idmap *known = idmap_create((size_t)n + 16);
        size_t nfiles = 0;
        bool dir = tn_snap_dir_ready(ts, pg);
        for (int i = 0; files && known && i < n; i++) {
            /* unparsable ids or dimensions are reported (rowerr) and skipped */
            int64_t id = memrow_i64_of(r, i, 0, 0, ROWERR_TENANTS);
            int64_t dim = memrow_i64_of(r, i, 1, 0, ROWERR_TENANTS);
            if (id <= 0)
                continue;
            idmap_put(known, (uint64_t)id, 1);
            char path[PATH_MAX];
            struct stat sb;
            if (dir && dim > 0 && dim <= UINT32_MAX && tn_snap_path(ts, id, path, sizeof(path)) &&
                stat(path, &sb) == 0)
                files[nfiles++] = (snap_file){
                    .id = id, .dim = (uint32_t)dim, .mtime = sb.st_mtime, .size = sb.st_size};
        }
        PQclear(r);
        if (dir && known && files)
            remove_strays(ts, known);
        idmap_destroy(known);
        qsort(files, nfiles, sizeof(*files), by_mtime_desc);
        size_t bytes = 0, take = 0;
        while (take < nfiles && bytes + (size_t)files[take].size <= ts->budget / 10 * 9)
            bytes += (size_t)files[take++].size;
        log_info("index preload: %zu of %d tenants have snapshots; loading %zu (%.1f MiB)", nfiles,
                 n, take, (double)bytes / 1048576.0);
        atomic_store(&ts->preload_left, (int)take + 1);
        for (size_t i = 0; i < take; i++) {
            tenant *t = tenants_get(ts, files[i].id, files[i].dim);
            if (!t) {
                atomic_fetch_sub(&ts->preload_left, 1);
                continue;
            }
            pthread_mutex_lock(&t->mu);
            bool start = t->state == T_UNLOADED;
            if (start)
                t->state = T_LOADING;
            pthread_mutex_unlock(&t->mu);
            if (start && bg_submit(ts->srv->bg, preload_one_job, t) == 0)
                continue;
            if (start) {
                pthread_mutex_lock(&t->mu);
                waiter *ws = t->waiters;
                t->waiters = NULL;
                t->state = T_UNLOADED;
                pthread_mutex_unlock(&t->mu);
                tn_release_waiters(ws, -1, "index unavailable: server shutting down");
            }
            tenants_put(t);
            atomic_fetch_sub(&ts->preload_left, 1);
        }
        free(files);
        if (atomic_fetch_sub(&ts->preload_left, 1) == 1) {
            atomic_store(&ts->preloaded, true);
            log_info("index preload finished");
        }
        return;
    }
}
