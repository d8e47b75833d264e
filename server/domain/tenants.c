/* server/domain/tenants.c: tenants' vector indexes: lazy loads from snapshots or PostgreSQL,
 * change application, catch-up, snapshots, maintenance and eviction (see tenants.h). */
#include "tenants.h"

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

enum { T_UNLOADED, T_LOADING, T_READY };

typedef struct waiter {
    struct waiter *next;
    worker *w;
    void (*cb)(void *arg, int status, const char *err);
    void *arg;
    int status;
    char err[300];
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
    /* a change could not be applied (out of memory) or remembered: it is not marked applied,
     * and the housekeeping schedules a catch-up that reads it again from the change log */
    bool apply_retry;
    /* the engine (VINDEX_ENGINE_*) the loaded index was created with, set by each load from
     * the tenant's choice in PostgreSQL or the index_engine setting (t->mu) */
    int engine;
    /* the engine an admin.tenant.update asked for since (-1: none): a loaded index with
     * another engine is dropped, and the next use loads it anew (t->mu) */
    int want_engine;
    /* snapshots (t->mu) */
    uint64_t saved_seq;            /* change number of the newest snapshot written or loaded */
    uint64_t saved_mono_ns;        /* when (0: never) */
    bool dirty;                    /* changed, or access counts moved, since that snapshot */
    bool saving;                   /* a snapshot is being written */
    bool dead;                     /* the tenant was deleted: write no snapshot */
    atomic_uint_least64_t used_ns; /* last use, for eviction */
    bool recall_warned;            /* housekeeping only: a low recall was logged */
};

struct tenants {
    server *srv;
    pthread_mutex_t mu;    /* guards map and refs */
    idmap *map;            /* tenant id -> tenant* */
    atomic_bool preloaded; /* the start-up preload has finished */
    atomic_int preload_left;
    vindex_opts vo; /* index options but dim and meta_size */
    size_t budget;  /* bytes of loaded indexes before eviction */
    pthread_mutex_t dir_mu;
    char *dir;       /* <index_dir>/<database instance>; NULL until known */
    bool dir_failed; /* the directory cannot be used: no snapshots */
    int dir_lock;    /* dir/.lock, held shared while this process may write there (-1) */
    bool dir_alone;  /* no other process held that lock when we took it */
    atomic_bool housekeeping;
    unsigned hk_runs;  /* housekeeping rounds (only the running round touches it) */
    uint64_t hk_freed; /* evictions + rebuilds at the end of the last round (likewise) */
    atomic_uint_least64_t n_snap_loads, n_snap_rejected, n_db_loads, n_snapshots, n_evictions,
        n_rebuilds;
    /* successful loads by source (0 snapshot, 1 database): duration histogram and sum */
    atomic_uint_least64_t load_hist[2][TENANTS_LOAD_BUCKETS];
    atomic_uint_least64_t load_us[2];
    /* the recall monitor (housekeeping only, but the counters) */
    double rm_allow_ns; /* probe time the CPU budget allows now (negative: a debt) */
    uint64_t rm_last_ns;
    size_t rm_next; /* where the next round starts among the tenants */
    atomic_uint_least64_t n_probes, probe_ns;
#ifdef ENGRAM_FAULT_INJECTION
    /* tests only: index upserts still to fail with -ENOMEM (ENGRAM_FAULT_INDEX_UPSERT) */
    atomic_long fault_upserts;
#endif
};

const double tenants_load_bounds_s[TENANTS_LOAD_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                0.5,   1,    2.5,   5,    10};

/* Counts one successful load of source (0 snapshot, 1 database) that took us. */
static void record_load(tenants *ts, int source, uint64_t us)
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
    if (!ts->map) {
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
                           .compact_percent = (unsigned)c->index_compact_percent};
#ifdef ENGRAM_FAULT_INJECTION
    const char *fault = getenv("ENGRAM_FAULT_INDEX_UPSERT");
    if (fault && atol(fault) > 0) {
        atomic_store(&ts->fault_upserts, atol(fault));
        log_warn("fault injection: the next %ld index upserts fail as out of memory", atol(fault));
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
    t->dim = dim;
    atomic_init(&t->refs, 2); /* the map's and the caller's */
    t->want_engine = -1;
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
    int rc = mf_tags_from_json(row->tag_json, row->tag_json_len, &tags, &m->ntags);
    if (rc < 0)
        return rc;
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
    /* tags: the typed metadata fields as a JSON array, derived here by the one rule (see
     * memfilter.h); none (NULL) from a store, whose tags come from the request */
    uint64_t *tags = NULL;
    m->ntags = 0;
    if (row->tags_len > 0) {
        int rc = mf_tags_from_json(row->tags, row->tags_len, &tags, &m->ntags);
        if (rc < 0)
            return rc;
    }
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
            /* cannot remember it: a catch-up re-reads it (applies are idempotent) */
            t->apply_retry = true;
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

/* Fault injection for tests: true when this index upsert is to fail as out of memory. */
static bool fault_upsert(tenants *ts)
{
#ifdef ENGRAM_FAULT_INJECTION
    long left = atomic_load(&ts->fault_upserts);
    while (left > 0)
        if (atomic_compare_exchange_weak(&ts->fault_upserts, &left, left - 1))
            return true;
#endif
    return false;
}

/* Writes memory id as of change seq (vector vec, NULL: metadata only) into the index.
 * Returns 0 when the index holds that version or a newer one (or a later delete) now; 1
 * when the change could not be applied yet (metadata of a memory the index has no vector
 * for: a catch-up is scheduled to read the whole row); -ENOMEM when the index could not
 * take it. Only 0 lets the caller mark the change applied. */
static int do_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m)
{
    uint64_t dseq;
    if (idmap_get(t->deleted, id, &dseq) && dseq >= seq)
        return 0; /* deleted by a later change */
    mem_meta cur, own;
    bool present = vindex_get_meta(t->vi, id, &cur) == 0;
    if (present && cur.seq >= seq)
        return 0; /* a newer write is already in */
    if (!present && !vec) {
        /* metadata for a memory we have no vector for yet: re-read from the log */
        schedule_catch_up(t);
        return 1;
    }
    if (meta_dup(m, &own) < 0) {
        log_error("tenant %lld: out of memory indexing memory %llu", (long long)t->id,
                  (unsigned long long)id);
        return -ENOMEM;
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
        return 0;
    }
    /* one atomic replacement: no search sees the memory missing or twice */
    int rc = fault_upsert(t->ts) ? -ENOMEM : vindex_upsert(t->vi, id, vec, &own);
    if (rc != 0 && rc != 1) {
        free((void *)own.tags); /* the index keeps cur (and its tags) */
        log_error("tenant %lld: cannot index memory %llu (%d); retried from the change log",
                  (long long)t->id, (unsigned long long)id, rc);
        return rc < 0 ? rc : -ENOMEM;
    }
    if (present)
        free((void *)cur.tags); /* no search can still see them: upsert published under the
                                 * index's exclusive lock */
    return 0;
}

/* Removes memory id as of change seq. Returns 0, or -ENOMEM when its tombstone (which keeps
 * an older write arriving late out) could not be recorded. */
static int do_delete(tenant *t, uint64_t seq, uint64_t id)
{
    mem_meta cur;
    if (vindex_get_meta(t->vi, id, &cur) == 0 && cur.seq < seq) {
        vindex_remove(t->vi, id);
        free((void *)cur.tags); /* the index's, unreachable now */
    }
    if (seq > t->applied && idmap_put(t->deleted, id, seq) < 0)
        return -ENOMEM;
    return 0;
}

/* A change that could not be applied (do_upsert or do_delete did not return 0) stays
 * unapplied: the watermark, and with it every snapshot, stops below it until a catch-up
 * reads it again. Out of memory is counted and retried from the housekeeping, once a second,
 * rather than at once. */
static void apply_failed(tenant *t, int rc)
{
    if (rc < 0) {
        t->apply_retry = true;
        metrics_index_apply_failed();
    }
}

static void apply_locked(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                         const mem_meta *m)
{
    if (seq_applied(t, seq))
        return;
    int rc = del ? do_delete(t, seq, id) : do_upsert(t, seq, id, vec, m);
    if (rc != 0) {
        apply_failed(t, rc);
        return;
    }
    mark_applied(t, seq);
    t->dirty = true;
}

static void queue_pending(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                          const mem_meta *m)
{
    pending *p = calloc(1, sizeof(*p));
    if (!p) {
        t->apply_retry = true; /* a catch-up after the load reads it */
        return;
    }
    p->seq = seq;
    p->id = id;
    p->del = del;
    if (m && meta_dup(m, &p->m) < 0) {
        free(p);
        t->apply_retry = true;
        return;
    }
    if (vec) {
        p->vec = malloc(t->dim * sizeof(float));
        if (!p->vec) {
            free((void *)p->m.tags);
            free(p);
            t->apply_retry = true;
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

/* The options of t's index: the server's, with t's dimension and engine (set by the load
 * before it creates or reads the index). */
static void index_opts(const tenant *t, vindex_opts *vo)
{
    const config *c = &t->ts->srv->cfg;
    *vo = t->ts->vo;
    vo->dim = t->dim;
    vo->meta_size = sizeof(mem_meta);
    vo->engine = t->engine;
    vo->faiss_factory = c->index_faiss_factory; /* lives as long as the server */
    vo->faiss_ef_search = c->index_faiss_ef_search;
    vo->faiss_engine = vfaiss_engine(); /* the server links FAISS (engram_vfaiss) */
}

/* ---- snapshot files ------------------------------------------------------------------- */

/* Finds (once) the directory for this database's snapshots: <index_dir>/<instance id>.
 * Returns true when snapshots can be used. Any thread with a connection. */
static bool snap_dir_ready(tenants *ts, PGconn *pg)
{
    pthread_mutex_lock(&ts->dir_mu);
    bool ok = ts->dir != NULL;
    if (ok || ts->dir_failed || !pg) {
        pthread_mutex_unlock(&ts->dir_mu);
        return ok;
    }
    char inst[64], err[256];
    if (loader_instance(pg, inst, sizeof(inst), err, sizeof(err)) < 0) {
        pthread_mutex_unlock(&ts->dir_mu);
        log_warn("index snapshots: cannot read the database's instance id: %s", err);
        return false; /* tried again on the next load */
    }
    if (strspn(inst, "0123456789abcdef-") != strlen(inst)) {
        ts->dir_failed = true;
        pthread_mutex_unlock(&ts->dir_mu);
        log_error("index snapshots disabled: unexpected instance id in engram_instance");
        return false;
    }
    const config *c = &ts->srv->cfg;
    char base[PATH_MAX], path[PATH_MAX];
    if (c->index_dir[0])
        snprintf(base, sizeof(base), "%s", c->index_dir);
    else
        snprintf(base, sizeof(base), "%s/index", c->data_dir);
    int n = snprintf(path, sizeof(path), "%s/%s", base, inst);
    if (n < 0 || (size_t)n >= sizeof(path) - 32 || (mkdir(base, 0700) && errno != EEXIST) ||
        (mkdir(path, 0700) && errno != EEXIST) || !(ts->dir = strdup(path))) {
        ts->dir_failed = true;
        pthread_mutex_unlock(&ts->dir_mu);
        log_error("index snapshots disabled: cannot create %s: %s", path, strerror(errno));
        return false;
    }
    /* Every engramd writing here holds .lock shared. Whoever gets it exclusively first is
     * alone: temporary files then are a crash's leftovers, removed at once (see
     * remove_strays); the lock is then held shared like everyone else's. */
    char lpath[PATH_MAX + 8];
    snprintf(lpath, sizeof(lpath), "%s/.lock", path);
    ts->dir_lock = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (ts->dir_lock >= 0) {
        ts->dir_alone = flock(ts->dir_lock, LOCK_EX | LOCK_NB) == 0;
        if (flock(ts->dir_lock, LOCK_SH) != 0) {
            close(ts->dir_lock);
            ts->dir_lock = -1;
            ts->dir_alone = false;
        }
    }
    pthread_mutex_unlock(&ts->dir_mu);
    log_info("index snapshots in %s%s", path,
             ts->dir_alone ? "" : " (shared with another engramd)");
    return true;
}

/* Writes the snapshot path of tenant id into buf. Returns false while the directory is
 * not known (or not usable). */
static bool snap_path(tenants *ts, int64_t id, char *buf, size_t len)
{
    pthread_mutex_lock(&ts->dir_mu);
    bool ok = ts->dir != NULL;
    if (ok)
        snprintf(buf, len, "%s/%lld.idx", ts->dir, (long long)id);
    pthread_mutex_unlock(&ts->dir_mu);
    return ok;
}

/* The tags a snapshot's metadata points to travel in its extra bytes (host byte order, as
 * the snapshot itself), followed by what the index was built as:
 *   "ENGTAGS2", i64 wall-clock ms of the save, u64 record count, then per memory
 *   u64 id, u64 seq (the change that last wrote it), u32 ntags, u32 0, ntags u64 hashes;
 *   then the identity: u32 engine (VINDEX_ENGINE_*), u32 0, u64 FNV-1a hash of the FAISS
 *   factory string (0 for the native engine), "ENGSNID1".
 * A snapshot is only used for an index of the same identity: one written by another
 * engine, or by FAISS from another factory, may hold structures that do not fit the index
 * asked for, and is rebuilt from the database instead. The identity ends the file (vindex
 * stores the extra bytes last), so a load can tell from its last bytes, before reading the
 * snapshot, that it will not fit; the check after the checksummed load is the one that
 * counts. Snapshots of earlier versions ("ENGTAGS1", no identity) were all native. */
#define TAGS_MAGIC "ENGTAGS2"
#define TAGS_MAGIC_V1 "ENGTAGS1"
#define TAGS_HEADER 24
#define TAGS_RECORD 24
#define SNAPID_MAGIC "ENGSNID1"
#define SNAPID_LEN 24

typedef struct snap_id {
    uint32_t engine;
    uint64_t factory; /* FNV-1a of the factory string; 0 for the native engine */
} snap_id;

/* The identity of an index created with vo. */
static snap_id snap_id_of(const vindex_opts *vo)
{
    snap_id id = {.engine = (uint32_t)vo->engine};
    if (vo->engine == VINDEX_ENGINE_FAISS) {
        const char *f = vo->faiss_factory ? vo->faiss_factory : "";
        id.factory = hash_fnv1a(f, strlen(f));
    }
    return id;
}

static void snap_id_put(unsigned char out[SNAPID_LEN], const snap_id *id)
{
    uint32_t zero = 0;
    memcpy(out, &id->engine, 4);
    memcpy(out + 4, &zero, 4);
    memcpy(out + 8, &id->factory, 8);
    memcpy(out + 16, SNAPID_MAGIC, 8);
}

/* Reads an identity from the last SNAPID_LEN bytes p. Returns false when they are none. */
static bool snap_id_get(const unsigned char *p, snap_id *id)
{
    if (memcmp(p + 16, SNAPID_MAGIC, 8) != 0)
        return false;
    memcpy(&id->engine, p, 4);
    memcpy(&id->factory, p + 8, 8);
    return true;
}

/* Splits a snapshot's extra bytes into the tag records' part (*rec_len bytes from the
 * start) and the identity. Returns false when they are not in a known format. */
static bool snap_extra_split(const unsigned char *x, size_t xlen, size_t *rec_len, snap_id *id)
{
    if (!x || xlen < TAGS_HEADER)
        return false;
    if (memcmp(x, TAGS_MAGIC_V1, 8) == 0) {
        *id = (snap_id){.engine = VINDEX_ENGINE_NATIVE};
        *rec_len = xlen;
        return true;
    }
    if (memcmp(x, TAGS_MAGIC, 8) != 0 || xlen < TAGS_HEADER + SNAPID_LEN ||
        !snap_id_get(x + xlen - SNAPID_LEN, id))
        return false;
    *rec_len = xlen - SNAPID_LEN;
    return true;
}

static const char *snap_id_name(const snap_id *id)
{
    return id->engine == VINDEX_ENGINE_FAISS    ? "the faiss engine"
           : id->engine == VINDEX_ENGINE_NATIVE ? "the native engine"
                                                : "an unknown engine";
}

/* Tells, from the last bytes of the file at path and without reading the rest, whether it
 * was written for another identity than want (a hint: false when it cannot tell). */
static bool snap_file_other(const char *path, const snap_id *want, snap_id *got)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat sb;
    unsigned char tail[SNAPID_LEN];
    bool other = fstat(fd, &sb) == 0 && sb.st_size >= SNAPID_LEN &&
                 pread(fd, tail, SNAPID_LEN, sb.st_size - SNAPID_LEN) == SNAPID_LEN &&
                 snap_id_get(tail, got) &&
                 (got->engine != want->engine || got->factory != want->factory);
    close(fd);
    return other;
}

typedef struct tagbuf {
    unsigned char *p;
    size_t n, cap;
    uint64_t count;
} tagbuf;

static int tagbuf_put(tagbuf *b, const void *data, size_t len)
{
    if (b->n + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
    return 0;
}

static int tags_record(uint64_t id, const float *vec, const void *meta, void *arg)
{
    tagbuf *b = arg;
    const mem_meta *m = meta;
    uint32_t rec[2] = {m->ntags, 0};
    b->count++;
    if (tagbuf_put(b, &id, 8) || tagbuf_put(b, &m->seq, 8) || tagbuf_put(b, rec, 8) ||
        (m->ntags && tagbuf_put(b, m->tags, m->ntags * sizeof(uint64_t))))
        return 1;
    return 0;
}

/* Serializes every memory's tags and the index's identity. Call with t->mu held (no change
 * can move them). On success the caller owns *out (free). Returns 0 or -ENOMEM. */
static int tags_build(tenant *t, unsigned char **out, size_t *len)
{
    tagbuf b = {0};
    int64_t now = server_now_ms();
    uint64_t zero = 0;
    vindex_opts vo;
    index_opts(t, &vo);
    snap_id sid = snap_id_of(&vo);
    unsigned char idb[SNAPID_LEN];
    snap_id_put(idb, &sid);
    if (tagbuf_put(&b, TAGS_MAGIC, 8) || tagbuf_put(&b, &now, 8) || tagbuf_put(&b, &zero, 8) ||
        vindex_foreach(t->vi, tags_record, &b) != 0 || tagbuf_put(&b, idb, SNAPID_LEN)) {
        free(b.p);
        return -ENOMEM;
    }
    memcpy(b.p + 16, &b.count, 8);
    *out = b.p;
    *len = b.n;
    return 0;
}

typedef struct tagfix {
    idmap *at; /* id -> offset of its record */
    const unsigned char *x;
    uint64_t upto; /* the snapshot's change number */
    uint64_t *drop;
    size_t ndrop, cdrop;
    bool bad;
} tagfix;

/* Points one loaded memory's metadata at a fresh copy of its tags (vindex_update_meta
 * callback). Memories written after the snapshot's change number are set aside: their
 * tags may be newer than the record, and the replay brings them back. */
static void tags_fix_one(void *meta, void *arg)
{
    tagfix *tf = arg;
    mem_meta *m = meta;
    uint32_t want = m->ntags;
    m->tags = NULL; /* the saved pointer means nothing in this process */
    m->ntags = 0;
    if (m->seq > tf->upto) {
        if (tf->ndrop == tf->cdrop) {
            size_t cap = tf->cdrop ? tf->cdrop * 2 : 16;
            uint64_t *d = realloc(tf->drop, cap * sizeof(*d));
            if (!d) {
                tf->bad = true;
                return;
            }
            tf->drop = d;
            tf->cdrop = cap;
        }
        tf->drop[tf->ndrop++] = m->id;
        return;
    }
    uint64_t off, seq;
    uint32_t ntags;
    if (!tf->at || !idmap_get(tf->at, m->id, &off)) {
        tf->bad = true;
        return;
    }
    memcpy(&seq, tf->x + off + 8, 8);
    memcpy(&ntags, tf->x + off + 16, 4);
    if (seq != m->seq || ntags != want) {
        tf->bad = true;
        return;
    }
    if (!ntags)
        return;
    uint64_t *tags = malloc(ntags * sizeof(*tags));
    if (!tags) {
        tf->bad = true;
        return;
    }
    memcpy(tags, tf->x + off + TAGS_RECORD, ntags * sizeof(*tags));
    m->tags = tags;
    m->ntags = ntags;
}

static int collect_id(uint64_t id, const float *vec, const void *meta, void *arg)
{
    tagbuf *b = arg;
    return tagbuf_put(b, &id, sizeof(id)) ? 1 : 0;
}

/* Restores the tags of a loaded snapshot from the tag records x (xlen bytes: the extra bytes
 * without the identity) and removes the memories written after its change number upto. Returns 0;
 * -1 when the extra bytes do not describe the snapshot's memories (every entry's tags are valid or
 * NULL: free them with the index); or -2 when memory ran out before any entry was touched (the tags
 * pointers are the saved ones: destroy the index without freeing them). */
static int tags_restore(vindex *vi, const unsigned char *x, size_t xlen, uint64_t upto)
{
    tagfix tf = {.x = x, .upto = upto};
    tagbuf ids = {0};
    int rc = -1;
    uint64_t count;
    if (!x || xlen < TAGS_HEADER ||
        (memcmp(x, TAGS_MAGIC, 8) != 0 && memcmp(x, TAGS_MAGIC_V1, 8) != 0))
        goto fail;
    memcpy(&count, x + 16, 8);
    if (count > (xlen - TAGS_HEADER) / TAGS_RECORD)
        goto fail;
    tf.at = idmap_create((size_t)count + 16);
    if (!tf.at)
        goto fail;
    size_t off = TAGS_HEADER;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t id;
        uint32_t ntags;
        if (xlen - off < TAGS_RECORD)
            goto fail;
        memcpy(&id, x + off, 8);
        memcpy(&ntags, x + off + 16, 4);
        if ((xlen - off - TAGS_RECORD) / sizeof(uint64_t) < ntags || idmap_get(tf.at, id, NULL) ||
            idmap_put(tf.at, id, off) < 0)
            goto fail;
        off += TAGS_RECORD + (size_t)ntags * sizeof(uint64_t);
    }
    if (off != xlen)
        goto fail;
    rc = 0;
fail:
    /* every entry's tags pointer is reset, even when the records are unusable */
    if (vindex_foreach(vi, collect_id, &ids) != 0) {
        idmap_destroy(tf.at);
        free(ids.p);
        return -2;
    }
    if (rc < 0)
        tf.bad = true;
    vindex_update_meta(vi, (const uint64_t *)(const void *)ids.p, ids.n / sizeof(uint64_t),
                       tags_fix_one, &tf);
    for (size_t i = 0; i < tf.ndrop; i++)
        vindex_remove(vi, tf.drop[i]); /* their tags are NULL already */
    idmap_destroy(tf.at);
    free(tf.drop);
    free(ids.p);
    return tf.bad ? -1 : 0;
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

/* Frees an index whose metadata owns its tags. */
static void index_free(vindex *vi)
{
    if (vi)
        vindex_foreach(vi, free_tags, NULL);
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
    int mrc = mem_meta_from_row(&m, row);
    if (mrc < 0) {
        if (mrc == -EINVAL)
            log_error("tenant %lld: memory %llu: unreadable metadata fields", (long long)lc->t->id,
                      (unsigned long long)row->id);
        return -1;
    }
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

/* Builds t's index from every memory in PostgreSQL and installs it (t is LOADING).
 * Returns 0 or -1 with err. */
static int load_from_db(PGconn *pg, tenant *t, size_t *rows, char *err, size_t errlen)
{
    vindex_opts vo;
    index_opts(t, &vo);
    load_ctx lc = {.t = t, .vi = vindex_create(&vo)};
    uint64_t seq = 0;
    if (!lc.vi) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (loader_tenant(pg, t->id, t->dim, &seq, load_row, &lc, err, errlen) != 0) {
        index_free(lc.vi);
        return -1;
    }
    pthread_mutex_lock(&t->mu);
    t->vi = lc.vi;
    t->applied = seq;
    t->nabove = 0;
    idmap_clear(t->deleted);
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
    if (row && mem_meta_from_row(&m, row) < 0) {
        rp->oom = true;
        return 1;
    }
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    if (!seq_applied(t, seq)) {
        rc = row ? do_upsert(t, row->seq, id, row->vec, &m) : do_delete(t, seq, id);
        if (rc == 0)
            mark_applied(t, seq);
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

static void access_fix_one(void *meta, void *arg)
{
    const access_fix *af = arg;
    mem_meta *m = meta;
    uint64_t i;
    if (!idmap_get(af->at, m->id, &i))
        return;
    uint32_t c = af->counts[i] > UINT32_MAX ? UINT32_MAX : (uint32_t)af->counts[i];
    if (c > m->access_count)
        m->access_count = c;
    if (af->last[i] > m->last_access_ms)
        m->last_access_ms = af->last[i];
}

/* Brings the access counts of a restored index up to the database's (reads are not
 * changes, so the replay does not carry them, and other processes count reads too).
 * Returns 0 or -1 with err. */
static int refresh_access(PGconn *pg, tenant *t, vindex *vi, char *err, size_t errlen)
{
    access_fix af = {.at = idmap_create(256)};
    int rc = -1;
    if (af.at)
        rc = loader_accessed(pg, t->id, 0, access_row, &af, err, errlen);
    if (!af.at || af.oom) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
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
    idmap_clear(t->deleted);
    pthread_mutex_unlock(&t->mu);
    index_free(vi);
}

/* Loads t's index from its snapshot and replays the changes committed after it (t is
 * LOADING). Returns 0 when installed; 1 when there is no usable snapshot (missing, corrupt,
 * stale, or older than the change log: the caller rebuilds from PostgreSQL); -1 with err
 * when the database failed. */
static int load_from_snapshot(PGconn *pg, tenant *t, size_t *rows, size_t *changes, char *err,
                              size_t errlen)
{
    tenants *ts = t->ts;
    char path[PATH_MAX];
    if (!snap_dir_ready(ts, pg) || !snap_path(ts, t->id, path, sizeof(path)))
        return 1;
    vindex_opts vo;
    index_opts(t, &vo);
    snap_id want = snap_id_of(&vo), got;
    /* a snapshot of another engine is not even read (an engine change, see
     * tenants_engine_changed, or a changed index_engine or index_faiss_factory setting) */
    if (snap_file_other(path, &want, &got)) {
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_info("tenant %lld: snapshot %s not used: written by %s%s; rebuilding from the "
                 "database",
                 (long long)t->id, path, snap_id_name(&got),
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
    bool known = snap_extra_split(x, xlen, &rec_len, &got);
    if (known && (got.engine != want.engine || got.factory != want.factory)) {
        /* no tags were restored: the pointers in the metadata are the saved ones */
        free(x);
        vindex_destroy(vi);
        atomic_fetch_add(&ts->n_snap_rejected, 1);
        log_info("tenant %lld: snapshot %s not used: written by %s; rebuilding from the "
                 "database",
                 (long long)t->id, path, snap_id_name(&got));
        return 1;
    }
    /* extra bytes in no known format: tags_restore refuses them (and resets the pointers) */
    rc = tags_restore(vi, known ? x : NULL, known ? rec_len : 0, upto);
    free(x);
    if (rc < 0) {
        if (rc == -1)
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
    idmap_clear(t->deleted);
    pthread_mutex_unlock(&t->mu);
    replay_ctx rp = {.t = t, .next = upto + 1};
    rc = loader_changes(pg, t->id, t->dim, upto, &now_seq, replay_change, &rp, err, errlen);
    if (rc < 0 || rp.oom) {
        if (rp.oom)
            snprintf(err, errlen, "out of memory");
        uninstall(t);
        return -1;
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
        return -1;
    }
    pthread_mutex_lock(&t->mu);
    t->saved_seq = upto;
    t->saved_mono_ns = server_mono_ns();
    t->dirty = rp.changes > 0;
    pthread_mutex_unlock(&t->mu);
    *rows = vindex_count(vi);
    *changes = rp.changes;
    atomic_fetch_add(&ts->n_snap_loads, 1);
    return 0;
}

/* Sets t->engine, the engine the load creates the index with, from the tenant's choice in
 * PostgreSQL or else the index_engine setting (t is LOADING). Returns 0 or -1 with err. */
static int read_engine(PGconn *pg, tenant *t, char *err, size_t errlen)
{
    const config *c = &t->ts->srv->cfg;
    char name[16];
    if (loader_index_engine(pg, t->id, name, sizeof(name), err, errlen) < 0)
        return -1;
    int e = index_engine_parse(name, strlen(name));
    if (e < 0)
        e = index_engine_parse(c->index_engine, strlen(c->index_engine));
    pthread_mutex_lock(&t->mu);
    t->engine = e < 0 ? VINDEX_ENGINE_NATIVE : e;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

/* Loads t's index on this background thread (t is LOADING): from its snapshot plus the
 * changes after it, else from PostgreSQL; then applies the changes that arrived meanwhile
 * and wakes the waiters. Returns 0 or -1. */
static int load_now(bg_ctx *ctx, tenant *t)
{
    char err[256] = "";
    uint64_t t0 = server_mono_ns();
    size_t rows = 0, changes = 0;
    int rc = -1, from = -1;
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
    pthread_mutex_lock(&t->mu);
    waiter *ws = t->waiters;
    t->waiters = NULL;
    if (rc == 0) {
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
        pending_free_all(t);
        t->state = T_UNLOADED;
    }
    uint64_t applied = t->applied;
    pthread_mutex_unlock(&t->mu);
    uint64_t took_ns = server_mono_ns() - t0;
    double ms = (double)took_ns / 1e6;
    if (rc == 0)
        record_load(t->ts, from == 0 ? 0 : 1, took_ns / 1000);
    const char *engine = index_engine_name(t->engine); /* written before the load, by it */
    if (rc == 0 && from == 0)
        log_info("tenant %lld: index loaded from its snapshot, %zu memories, %zu changes "
                 "replayed, change %llu, %s engine, %.1f ms",
                 (long long)t->id, rows, changes, (unsigned long long)applied, engine, ms);
    else if (rc == 0)
        log_info("tenant %lld: index built from the database, %zu memories, change %llu, %s "
                 "engine, %.1f ms",
                 (long long)t->id, rows, (unsigned long long)applied, engine, ms);
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

static void preload_one_job(bg_ctx *ctx, void *arg)
{
    tenant *t = arg;
    tenants *ts = t->ts;
    load_now(ctx, t);
    tenant_put(t);
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
static void preload_job(bg_ctx *ctx, void *arg)
{
    tenants *ts = arg;
    unsigned delay_ms = 200;
    while (!bg_cancelled(ctx)) {
        char err[256];
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        PGresult *r =
            pg ? db_exec_stmt(pg, sqlb_def(SQLB_TENANT_DIMS), NULL, 0, err, sizeof(err)) : NULL;
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
        bool dir = snap_dir_ready(ts, pg);
        for (int i = 0; files && known && i < n; i++) {
            /* unparsable ids or dimensions are reported (rowerr) and skipped */
            int64_t id = memrow_i64_of(r, i, 0, 0, ROWERR_TENANTS);
            int64_t dim = memrow_i64_of(r, i, 1, 0, ROWERR_TENANTS);
            if (id <= 0)
                continue;
            idmap_put(known, (uint64_t)id, 1);
            char path[PATH_MAX];
            struct stat sb;
            if (dir && dim > 0 && dim <= UINT32_MAX && snap_path(ts, id, path, sizeof(path)) &&
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
                release_waiters(ws, -1, "index unavailable: server shutting down");
            }
            tenant_put(t);
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

/* ---- snapshots, maintenance and eviction ---------------------------------------------- */

/* Writes t's snapshot when it is loaded and changed since the last one. Call without
 * t->mu, holding a reference. Returns 1 when written, 0 when there was nothing to do, -1
 * on failure (logged; retried later). */
static int save_snapshot(tenant *t)
{
    tenants *ts = t->ts;
    char path[PATH_MAX];
    if (!snap_path(ts, t->id, path, sizeof(path)))
        return 0;
    pthread_mutex_lock(&t->mu);
    if (t->state != T_READY || t->saving || t->dead || !t->dirty) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    /* the tags are copied with the change number every change up to which is in the
     * index; vindex_save may catch later changes too, which the load sets aside */
    uint64_t upto = t->applied;
    unsigned char *x = NULL;
    size_t xlen = 0;
    if (tags_build(t, &x, &xlen) < 0) {
        pthread_mutex_unlock(&t->mu);
        log_warn("tenant %lld: snapshot skipped: out of memory", (long long)t->id);
        return -1;
    }
    t->saving = true;
    t->dirty = false;
    vindex *vi = t->vi; /* stays: eviction needs saving false */
    pthread_mutex_unlock(&t->mu);
    uint64_t t0 = server_mono_ns();
    int rc = vindex_save_extra(vi, path, upto, x, xlen);
    free(x);
    pthread_mutex_lock(&t->mu);
    t->saving = false;
    if (rc == 0) {
        t->saved_seq = upto;
        t->saved_mono_ns = server_mono_ns();
    } else {
        t->dirty = true;
    }
    bool dead = t->dead;
    pthread_mutex_unlock(&t->mu);
    if (dead) {
        unlink(path);
        return 0;
    }
    if (rc != 0) {
        log_warn("tenant %lld: cannot write snapshot %s: %s", (long long)t->id, path,
                 strerror(-rc));
        return -1;
    }
    atomic_fetch_add(&ts->n_snapshots, 1);
    log_debug("tenant %lld: snapshot at change %llu written in %.1f ms", (long long)t->id,
              (unsigned long long)upto, (double)(server_mono_ns() - t0) / 1e6);
    return 1;
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
        tenant_put(l->v[i].t);
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
    double c = score_composite(b->sp, m->created_ms, m->access_count, m->importance, b->now_ms);
    return score_blend(b->w, sim, c);
}

/* recall_check runs the recall monitor on t's index, when it is approximate: a first
 * measurement of new codes whatever the budget, then a few probes whenever the CPU budget
 * (index_recall_budget_percent of one core, averaged) allows. Logs once when the measured
 * recall fell below index_recall_target and the index had to search deeper or exactly, and
 * once when it recovered. Housekeeping thread. */
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
    /* the default blend is measured too, so that default searches get their own depth */
    blend_ctx bc = {.sp = &ts->srv->score, .w = c->similarity_weight, .now_ms = server_now_ms()};
    vindex_query shape = {.score = blend_score,
                          .score_slope = bc.w,
                          .score_bound = 1.0 - bc.w,
                          .score_monotone = true,
                          .ctx = &bc};
    uint64_t t0 = server_mono_ns();
    int rc = vindex_calibrate_scored(t->vi, probes, c->index_recall_target,
                                     bc.w < 1.0 ? &shape : NULL, &r);
    uint64_t dt = server_mono_ns() - t0;
    ts->rm_allow_ns -= (double)dt;
    atomic_fetch_add(&ts->n_probes, probes);
    atomic_fetch_add(&ts->probe_ns, dt);
    if (rc < 0) {
        log_warn("tenant %lld: recall monitor: out of memory", (long long)t->id);
        return;
    }
    if ((r.was_below || r.exact_fallback) && !t->recall_warned && !isnan(r.ann_estimate)) {
        t->recall_warned = true;
        if (r.exact_fallback)
            log_warn("tenant %lld: approximate search measured recall@10 %.3f at the deepest "
                     "allowed depth, below the target %.3f: searching exactly",
                     (long long)t->id, r.ann_estimate, c->index_recall_target);
        else
            log_warn("tenant %lld: approximate search measured below the recall target %.3f: "
                     "now %zu candidates deep (recall@10 %.3f)",
                     (long long)t->id, c->index_recall_target, r.depth, r.ann_estimate);
    } else if (t->recall_warned && !r.was_below && !r.exact_fallback) {
        t->recall_warned = false;
        log_info("tenant %lld: approximate search back at recall@10 %.3f, %zu candidates deep",
                 (long long)t->id, r.ann_estimate, r.depth);
    }
}

static int by_use(const void *a, const void *b)
{
    const hk_item *x = a, *y = b;
    return x->used_ns < y->used_ns ? -1 : x->used_ns > y->used_ns ? 1 : 0;
}

/* Unloads t when nobody but the map and the caller holds it. Returns true when evicted
 * (the map's reference is dropped; the caller's last put frees the index). */
static bool try_evict(tenants *ts, tenant *t)
{
    bool ok = false;
    uint64_t v;
    pthread_mutex_lock(&ts->mu);
    if (atomic_load(&t->refs) == 2 && idmap_get(ts->map, (uint64_t)t->id, &v) &&
        (tenant *)(uintptr_t)v == t) {
        pthread_mutex_lock(&t->mu);
        ok = t->state == T_READY && !t->saving;
        pthread_mutex_unlock(&t->mu);
        if (ok)
            idmap_del(ts->map, (uint64_t)t->id);
    }
    pthread_mutex_unlock(&ts->mu);
    if (ok)
        tenant_put(t);
    return ok;
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
            schedule_catch_up(t);
        }
        pthread_mutex_unlock(&t->mu);
        if (!ready)
            continue;
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
            save_snapshot(t);
        l.v[i].bytes = st.bytes;
        total += st.bytes;
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
            save_snapshot(it->t); /* evicted indexes come back from their snapshot */
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
    if (bg_every(ts->srv->bg, 1000, housekeeping, ts) < 0)
        return -1;
    return bg_submit(ts->srv->bg, preload_job, ts);
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
        int rc = save_snapshot(l.v[i].t);
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
        int rc = do_upsert(t, row->seq, id, row->vec, &m);
        if (rc == 0) {
            mark_applied(t, seq);
            t->dirty = true;
        } else {
            apply_failed(t, rc); /* the later changes still apply */
        }
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

/* Returns t with a reference when the registry holds tenant id, else NULL. */
static tenant *lookup(tenants *ts, int64_t id)
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
    tenant *t = lookup(ts, id);
    if (!t)
        return; /* not loaded here: its next load reads the new engine */
    pthread_mutex_lock(&t->mu);
    /* a load in progress may have read the old engine: compared once it is ready */
    t->want_engine = engine;
    bool stale = t->state == T_READY && t->engine != engine;
    pthread_mutex_unlock(&t->mu);
    if (stale)
        drop_stale(ts, t);
    tenant_put(t);
}

bool tenants_index_info(tenants *ts, int64_t id, tenants_index *out)
{
    memset(out, 0, sizeof(*out));
    tenant *t = lookup(ts, id);
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
    }
    pthread_mutex_unlock(&t->mu);
    tenant_put(t);
    return ready;
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
    if (t) {
        pthread_mutex_lock(&t->mu);
        t->dead = true; /* a snapshot being written is removed when it finishes */
        pthread_mutex_unlock(&t->mu);
    }
    char path[PATH_MAX];
    if (snap_path(ts, id, path, sizeof(path)))
        unlink(path);
    tenant_put(t);
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
    pthread_mutex_unlock(&ts->mu);
    m->budget = ts->budget;
    m->snapshot_loads = atomic_load(&ts->n_snap_loads);
    m->snapshots_rejected = atomic_load(&ts->n_snap_rejected);
    m->database_loads = atomic_load(&ts->n_db_loads);
    m->snapshots_written = atomic_load(&ts->n_snapshots);
    m->evictions = atomic_load(&ts->n_evictions);
    m->rebuilds = atomic_load(&ts->n_rebuilds);
    m->recall_probes = atomic_load(&ts->n_probes);
    m->recall_probe_ns = atomic_load(&ts->probe_ns);
    for (int src = 0; src < 2; src++) {
        for (size_t b = 0; b < TENANTS_LOAD_BUCKETS; b++)
            m->load_hist[src][b] = atomic_load(&ts->load_hist[src][b]);
        m->load_us[src] = atomic_load(&ts->load_us[src]);
    }
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
    if (t->state == T_READY && vindex_update_meta(t->vi, ids, n, touch_one, &tc) > 0)
        t->dirty = true;
    pthread_mutex_unlock(&t->mu);
}
