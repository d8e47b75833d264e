/* server/domain/tenants_apply.c: change application to a tenant's index, in change order, and
 * catch-up from the change log (see tenants.h, tenants_int.h). */
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
#include "rowcache.h"
#include "sql_bg.h"
#include "vfaiss.h"

#include "tenants_int.h"

/* ---- change bookkeeping (t->mu held) ------------------------------------------------ */

bool tn_seq_applied(tenant *t, uint64_t seq)
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
void tn_mark_applied(tenant *t, uint64_t seq)
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
        if (t->deleted) {
            prune_ctx pc = {.watermark = t->applied};
            idmap_foreach(t->deleted, collect_old, &pc);
            for (size_t i = 0; i < pc.n; i++)
                idmap_del(t->deleted, pc.ids[i]);
            free(pc.ids);
            if (idmap_count(t->deleted) == 0) {
                /* most tenants have no delete in flight: no map (tenants_int.h) */
                idmap_destroy(t->deleted);
                t->deleted = NULL;
            }
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

/* Fault injection for tests: true when this index upsert is to fail as out of memory. */
static bool fault_upsert(tenants *ts)
{
#ifdef ENGRAM_FAULT_INJECTION
    return tn_fault_take(&ts->fault_upserts);
#else
    (void)ts;
    return false;
#endif
}

/* Writes memory id as of change seq (vector vec, NULL: metadata only) into the index.
 * Returns 0 when the index holds that version or a newer one (or a later delete) now; 1
 * when the change could not be applied yet (metadata of a memory the index has no vector
 * for: a catch-up is scheduled to read the whole row); -ENOMEM when the index could not
 * take it. Only 0 lets the caller mark the change applied. */
int tn_do_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m)
{
    uint64_t dseq;
    if (t->deleted && idmap_get(t->deleted, id, &dseq) && dseq >= seq)
        return 0; /* deleted by a later change */
    mem_meta cur, own;
    bool present = vindex_get_meta(t->vi, id, &cur) == 0;
    if (present && cur.seq >= seq)
        return 0; /* a newer write is already in */
    if (!present && !vec) {
        /* metadata for a memory we have no vector for yet: re-read from the log */
        tn_schedule_catch_up(t);
        return 1;
    }
    if (tn_meta_dup(m, &own) < 0) {
        log_error("tenant %lld: out of memory indexing memory %llu", (long long)t->id,
                  (unsigned long long)id);
        return -ENOMEM;
    }
    own.seq = seq; /* the version is the change's, whatever the caller's copy says */
    /* reads (access counts) are not changes: keep the higher count the index already has */
    if (present && mem_meta_access_count(&cur) > mem_meta_access_count(&own))
        own.access = cur.access;
    /* feedback counts only grow, and the meta a change function returns carries none (0):
     * the higher of the two is the newest whatever order changes arrive in */
    if (present && cur.cited > own.cited)
        own.cited = cur.cited;
    if (present && cur.injected > own.injected)
        own.injected = cur.injected;
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
int tn_do_delete(tenant *t, uint64_t seq, uint64_t id)
{
    mem_meta cur;
    if (vindex_get_meta(t->vi, id, &cur) == 0 && cur.seq < seq) {
        vindex_remove(t->vi, id);
        free((void *)cur.tags); /* the index's, unreachable now */
    }
    if (seq <= t->applied)
        return 0;
    if (!t->deleted && !(t->deleted = idmap_create(16)))
        return -ENOMEM;
    return idmap_put(t->deleted, id, seq) < 0 ? -ENOMEM : 0;
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

void tn_apply_locked(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                     const mem_meta *m)
{
    if (tn_seq_applied(t, seq))
        return;
    int rc = del ? tn_do_delete(t, seq, id) : tn_do_upsert(t, seq, id, vec, m);
    if (rc != 0) {
        apply_failed(t, rc);
        return;
    }
    tn_mark_applied(t, seq);
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
    if (m && tn_meta_dup(m, &p->m) < 0) {
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
    if (seq > t->known)
        t->known = seq;
    if (t->state == T_READY)
        tn_apply_locked(t, seq, id, del, vec, m);
    else if (t->state == T_LOADING)
        queue_pending(t, seq, id, del, vec, m);
    /* unloaded: the next load reads it from the database */
    pthread_mutex_unlock(&t->mu);
}

void tenants_apply_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m)
{
    apply(t, seq, id, false, vec, m);
}

void tenants_apply_delete(tenant *t, uint64_t seq, uint64_t id)
{
    apply(t, seq, id, true, NULL, NULL);
}

/* The options of t's index: the server's, with t's dimension and engine (set by the load
 * before it creates or reads the index). */
void tn_index_opts(const tenant *t, vindex_opts *vo)
{
    const config *c = &t->ts->srv->cfg;
    *vo = t->ts->vo;
    vo->dim = t->dim;
    vo->meta_size = sizeof(mem_meta);
    vo->meta_atomic_off = MEM_META_ATOMIC_OFF;
    vo->meta_atomic_len = MEM_META_ATOMIC_LEN;
    vo->engine = t->engine;
    vo->faiss_factory = c->index_faiss_factory; /* lives as long as the server */
    vo->faiss_ef_search = c->index_faiss_ef_search;
    vo->faiss_engine = vfaiss_engine(); /* the server links FAISS (engram_vfaiss) */
}

/* ---- catch-up from the change log ----------------------------------------------------- */

static int catch_up_change(uint64_t seq, uint64_t id, const loader_row *row, void *arg)
{
    tenant *t = arg;
    if (!row) {
        tenants_apply_delete(t, seq, id);
        return 0;
    }
    mem_meta m;
    int mrc = mem_meta_from_db(&m, &row->meta);
    if (mrc < 0)
        return mrc;
    /* the row is the memory's current state, written by change row->meta.seq >= seq */
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY && !tn_seq_applied(t, seq)) {
        int rc = tn_do_upsert(t, row->meta.seq, id, row->vec, &m);
        if (rc == 0) {
            tn_mark_applied(t, seq);
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
    /* announced changes all applied since (no gap below the last one announced) and no
     * other reason to read the log: nothing to read */
    bool needed = t->catchup_forced || t->known > t->applied;
    t->catchup_forced = false;
    bool ready = t->state == T_READY && needed;
    uint64_t after = t->applied;
    /* the highest change the index holds, read before the catch-up's snapshot: every one of
     * them had committed, so the database's change number cannot be lower (see below) */
    uint64_t top = t->nabove ? t->above[t->nabove - 1] : t->applied;
    pthread_mutex_unlock(&t->mu);
    /* a connection lost under the catch-up (the database failed over since this thread last
     * used it) is replaced and the catch-up tried once more: the listener schedules catch-ups
     * right after it reconnected, when this thread's connection may still be the old one */
    for (int attempt = 0; ready && !bg_cancelled(ctx) && attempt < 2; attempt++) {
        char err[256];
        uint64_t upto = 0;
        PGconn *pg = bg_conn(ctx, err, sizeof(err));
        if (!pg) {
            log_warn("tenant %lld: catch-up failed: %s", (long long)t->id, err);
            break;
        }
        if (loader_changes(pg, t->id, t->dim, t->ts->srv->on_citus, after, &upto, catch_up_change,
                           t, err, sizeof(err)) >= 0) {
            if (upto < top) {
                /* the database is behind the index: changes this index applied are gone (a
                 * failover to a standby that had not received them: asynchronous
                 * replication, or a forced promotion). Their numbers will be reused for
                 * other changes, which this index would take for applied: drop it and its
                 * snapshot; the next use loads what the database has. */
                log_warn("tenant %lld: the database's change number %llu is behind the "
                         "index's %llu (changes lost in a failover?); dropping the index to "
                         "load it again",
                         (long long)t->id, (unsigned long long)upto, (unsigned long long)top);
                tenants_forget(t->ts, t->id);
                rc_forget_tenant(t->ts->srv->rows, t->id); /* rows tagged with lost numbers */
            }
            break;
        }
        bool lost = PQstatus(pg) != CONNECTION_OK;
        if (lost)
            bg_conn_failed(ctx);
        if (!lost || attempt == 1)
            log_warn("tenant %lld: catch-up failed: %s", (long long)t->id, err);
        if (!lost)
            break;
        pthread_mutex_lock(&t->mu);
        ready = t->state == T_READY;
        after = t->applied;
        pthread_mutex_unlock(&t->mu);
    }
    tenants_put(t);
}

/* Queues one catch-up for t unless one is queued already. Call with t->mu held. */
void tn_schedule_catch_up(tenant *t)
{
    t->catchup_forced = true;
    tn_schedule_announced_catch_up(t);
}

void tn_schedule_announced_catch_up(tenant *t)
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

/* Raises the kept floor of tenant id (out of the registry), if one is kept, to seq. A tenant
 * this process has seen nothing of gets none: its reads need no floor. */
static void raise_floor(tenants *ts, int64_t id, uint64_t seq)
{
    uint64_t f;
    pthread_mutex_lock(&ts->mu);
    if (ts->floors && idmap_get(ts->floors, (uint64_t)id, &f) && seq > f)
        idmap_put(ts->floors, (uint64_t)id, seq); /* replaces: never allocates */
    pthread_mutex_unlock(&ts->mu);
}

void tenants_notify_change(tenants *ts, int64_t id, uint64_t seq)
{
    tenant *t = tn_lookup(ts, id);
    if (!t) {
        raise_floor(ts, id, seq);
        return;
    }
    pthread_mutex_lock(&t->mu);
    if (seq > t->known)
        t->known = seq;
    if (t->state == T_READY && !tn_seq_applied(t, seq))
        tn_schedule_announced_catch_up(t);
    pthread_mutex_unlock(&t->mu);
    tenants_put(t);
}

uint64_t tn_floor_locked(const tenant *t)
{
    uint64_t f = t->known;
    if (t->applied > f)
        f = t->applied;
    if (t->nabove && t->above[t->nabove - 1] > f)
        f = t->above[t->nabove - 1];
    return f;
}

uint64_t tenants_floor_of(tenant *t)
{
    pthread_mutex_lock(&t->mu);
    uint64_t f = tn_floor_locked(t);
    pthread_mutex_unlock(&t->mu);
    return f;
}

uint64_t tenants_read_floor(tenants *ts, int64_t id)
{
    tenant *t = tn_lookup(ts, id);
    if (!t) {
        uint64_t f = 0;
        pthread_mutex_lock(&ts->mu);
        if (ts->floors)
            idmap_get(ts->floors, (uint64_t)id, &f);
        pthread_mutex_unlock(&ts->mu);
        return f;
    }
    uint64_t f = tenants_floor_of(t);
    tenants_put(t);
    return f;
}

static int catch_up_one(uint64_t key, uint64_t value, void *ctx)
{
    tenant *t = (tenant *)(uintptr_t)value;
    pthread_mutex_lock(&t->mu);
    if (t->state == T_READY)
        tn_schedule_catch_up(t);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

typedef struct id_list {
    int64_t *v;
    size_t n, cap;
    int rc;
} id_list;

static int collect_loaded(uint64_t key, uint64_t value, void *ctx)
{
    tenant *t = (tenant *)(uintptr_t)value;
    id_list *l = ctx;
    pthread_mutex_lock(&t->mu);
    bool ready = t->state == T_READY;
    pthread_mutex_unlock(&t->mu);
    if (!ready)
        return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int64_t *v = realloc(l->v, cap * sizeof(*v));
        if (!v) {
            l->rc = -ENOMEM;
            return 1; /* stop */
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (int64_t)key;
    return 0;
}

int tenants_loaded_ids(tenants *ts, int64_t **ids, size_t *n)
{
    id_list l = {0};
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, collect_loaded, &l);
    pthread_mutex_unlock(&ts->mu);
    if (l.rc < 0) {
        free(l.v);
        *ids = NULL;
        *n = 0;
        return l.rc;
    }
    *ids = l.v;
    *n = l.n;
    return 0;
}

void tenants_catch_up_all(tenants *ts)
{
    pthread_mutex_lock(&ts->mu);
    idmap_foreach(ts->map, catch_up_one, NULL);
    pthread_mutex_unlock(&ts->mu);
}

/* Returns t with a reference when the registry holds tenant id, else NULL. */
