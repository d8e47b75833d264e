/* server/domain/tenants_int.h: what the files of the tenants module share (private).
 *
 * The module is four files behind tenants.h: tenants.c (the registry, housekeeping and
 * eviction), tenants_apply.c (change application and catch-up from the change log),
 * tenants_load.c (loading from snapshots or PostgreSQL, preload) and tenants_snap.c
 * (snapshot files and their tag records). Functions shared between them carry the tn_
 * prefix.
 */
#ifndef ENGRAM_SERVER_TENANTS_INT_H
#define ENGRAM_SERVER_TENANTS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "bg.h"
#include "idmap.h"
#include "tenants.h"
#include "vindex.h"

enum { T_UNLOADED, T_LOADING, T_READY };

/* A tenant in the registry that was never loaded (a store, a memory.stats, a notification
 * kept it) and that nothing used for this long is retired from it by the housekeeping. Longer
 * than TENANT_NONLIVE_MS, so that nothing a request noted on it is lost. */
#define TENANT_RETIRE_NS ((uint64_t)(TENANT_NONLIVE_MS + 5000) * 1000000u)

typedef struct waiter {
    struct waiter *next;
    server_poster where; /* the thread cb runs on */
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
    /* the highest change number this process knows was committed (its own writes, the
     * change notifications of others, whether or not the index is loaded): reads on a
     * standby must include it (tenants_read_floor; t->mu) */
    uint64_t known;
    uint64_t *above; /* applied changes > applied, sorted */
    size_t nabove, cabove;
    /* id -> change number of its delete, while above the watermark; NULL while there is
     * none (most tenants: the map is made by the first delete and freed when empty) */
    idmap *deleted;
    pending *phead, *ptail;
    waiter *waiters;
    bool catchup_queued;
    bool catchup_forced; /* a queued catch-up reads the log even when every announced change
                          * is applied (a retry, a reconnection: tn_schedule_catch_up) */
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
    uint64_t saved_seq;              /* change number of the newest snapshot written or loaded */
    uint64_t saved_mono_ns;          /* when (0: never) */
    bool dirty;                      /* changed since that snapshot (reads are not changes) */
    bool saving;                     /* a snapshot is being written */
    bool dead;                       /* the tenant was deleted: write no snapshot */
    atomic_uint_least64_t used_ns;   /* last use, for eviction */
    atomic_int_least64_t nonlive_ms; /* see tenants_nonlive_seen; 0: never */
    /* a low recall was logged: set by the monitor (housekeeping) or a bulk build's settle
     * (a bg thread), cleared by the monitor when recall is back */
    atomic_bool recall_warned;
    uint64_t probed_ns; /* the recall monitor's last probes of this index (housekeeping only) */
    /* warming the row cache after the last load (enum tenants_rows_warm; tenants_load.c) */
    atomic_int rows_warm;
    atomic_uint rows_warm_gen; /* bumped by each load: an older warming stops */
    atomic_uint_least64_t rows_warmed;
};

struct tenants {
    server *srv;
    pthread_mutex_t mu; /* guards map and refs */
    idmap *map;         /* tenant id -> tenant* */
    /* tenant id -> the change floor (tenants_floor_of) of a tenant taken out of map (evicted
     * or retired), given back to it when it returns: kept only when reads may go to a
     * standby (pg_read_dsn), NULL otherwise; 16 to 32 bytes a tenant (guarded by mu) */
    idmap *floors;
    idmap *dims;           /* tenant id -> its dimension since a re-embedding changed it (under mu):
                            * what a new entry gets, whatever its caller's copy says */
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
        n_rebuilds, n_retired;
    atomic_uint_least64_t n_rows_dropped; /* bytes of mapped rows vindex_rows_keep dropped */
    /* successful loads by source (0 snapshot, 1 database): duration histogram and sum */
    atomic_uint_least64_t load_hist[2][TENANTS_LOAD_BUCKETS];
    atomic_uint_least64_t load_us[2];
    /* the recall monitor (housekeeping only, but the counters) */
    double rm_allow_ns; /* probe time the CPU budget allows now (negative: a debt) */
    uint64_t rm_last_ns;
    size_t rm_next; /* where the next round starts among the tenants */
    atomic_uint_least64_t n_probes, probe_ns, n_probe_skips;
    atomic_uint_least64_t n_rows_warmed; /* rows read into the row cache after loads */
#ifdef ENGRAM_FAULT_INJECTION
    /* tests only: index upserts still to fail with -ENOMEM (ENGRAM_FAULT_INDEX_UPSERT) */
    atomic_long fault_upserts;
    /* tests only: row cache warming pages still to fail (ENGRAM_FAULT_ROWS_WARM) */
    atomic_long fault_warms;
#endif
};

#ifdef ENGRAM_FAULT_INJECTION
/* Fault injection for tests: takes one of the faults still due in *left (a counter of
 * struct tenants). Returns true when there was one. */
static inline bool tn_fault_take(atomic_long *left)
{
    long n = atomic_load(left);
    while (n > 0)
        if (atomic_compare_exchange_weak(left, &n, n - 1))
            return true;
    return false;
}
#endif

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

/* tenants.c */
/* Returns a copy of m whose tags are a fresh allocation (for the index to own). */
int tn_meta_dup(const mem_meta *m, mem_meta *out);
/* Counts one successful load of source (0 snapshot, 1 database) that took us. */
void tn_record_load(tenants *ts, int source, uint64_t us);
/* Frees the changes queued for t while its index loads (t->mu held). */
void tn_pending_free_all(tenant *t);
/* vindex_foreach callback: frees one memory's tag array (the index owns them). */
int tn_free_tags(uint64_t id, const float *vec, const void *meta, void *ctx);
/* tn_settle finishes vi, t's index after a bulk build (a load from PostgreSQL, a
 * store_batch): vindex_settle for index_recall_target and the default blend, in the
 * caller's time, when vindex_settle_due. Job thread (it takes up to a rebuild and 24
 * probes: about 0.1 to 1 s at 50,000 x 768). */
void tn_settle(tenant *t, vindex *vi);
/* tn_drop_cold_rows asks the kernel to drop from RAM the float rows an approximate index
 * maps from its snapshot (vindex_trim), which a save (the file just written) or a load (its
 * checksum read every page) left there: its searches read a row only for a near-tie (1 to 7
 * a query, bench/README), so the budget, which counts resident bytes, then sees the codes
 * and the rows in use, not the whole file. Below the ANN kind (an exact re-rank reads a row
 * per candidate it cannot rule out) the rows stay. Any thread. */
void tn_drop_cold_rows(vindex *vi);

/* tenants_apply.c */
/* metadata for a memory we have no vector for yet: re-read from the log */
void tn_schedule_catch_up(tenant *t);
/* tn_schedule_announced_catch_up queues a catch-up for an announced change (t->known): it
 * reads the log only if the change is still not applied when it runs (the process's own
 * write, announced by a Citus worker, is usually applied by then). t->mu held. */
void tn_schedule_announced_catch_up(tenant *t);

/* tn_lookup returns tenant id with a reference taken (tenants_put it), or NULL when the
 * registry does not hold it. */
tenant *tn_lookup(tenants *ts, int64_t id);
/* The options of t's index: the server's, with t's dimension and engine (set by the load
 * before it creates or reads the index). */
void tn_index_opts(const tenant *t, vindex_opts *vo);
/* Applies change seq (an upsert of id with vec and m, or its delete) to t's loaded index
 * and marks it applied when the index took it (t->mu held). */
void tn_apply_locked(tenant *t, uint64_t seq, uint64_t id, bool del, const float *vec,
                     const mem_meta *m);
/* Removes memory id as of change seq. Returns 0, or -ENOMEM when its tombstone (which keeps
 * an older write arriving late out) could not be recorded. */
int tn_do_delete(tenant *t, uint64_t seq, uint64_t id);
/* Writes memory id as of change seq (vector vec, NULL: metadata only) into the index.
 * Returns 0 when the index holds that version or a newer one (or a later delete) now; 1
 * when the change could not be applied yet (metadata of a memory the index has no vector
 * for: a catch-up is scheduled to read the whole row); -ENOMEM when the index could not
 * take it. Only 0 lets the caller mark the change applied. */
int tn_do_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec, const mem_meta *m);
/* Records seq as applied and advances the watermark over any contiguous run. */
void tn_mark_applied(tenant *t, uint64_t seq);
/* The highest change number of t this process knows was committed (tenants_floor_of;
 * t->mu held). */
uint64_t tn_floor_locked(const tenant *t);
/* Tells whether change seq is already in t's index (t->mu held). */
bool tn_seq_applied(tenant *t, uint64_t seq);

/* tenants_load.c */
/* Hands every waiter its result on its own thread. Call without t->mu. */
void tn_release_waiters(waiter *list, int status, const char *err);
/* Background job: loads the index of tenant arg (a reference the job releases). */
void tn_load_job(bg_ctx *ctx, void *arg);
/* At start: loads, newest first, the indexes that have snapshots, as far as the memory
 * budget allows (estimated by file size); every other index loads on first use. Retries
 * while the database is unreachable. */
void tn_preload_job(bg_ctx *ctx, void *arg);

/* tenants_snap.c */
/* Writes t's snapshot when it is loaded and changed since the last one. Call without
 * t->mu, holding a reference. Returns 1 when written, 0 when there was nothing to do, -EIO
 * on failure (logged; retried later). */
int tn_save_snapshot(tenant *t);
/* Writes the snapshot path of tenant id into buf. Returns false while the directory is
 * not known (or not usable). */
bool tn_snap_path(tenants *ts, int64_t id, char *buf, size_t len);
/* Finds (once) the directory for this database's snapshots: <index_dir>/<instance id>.
 * Returns true when snapshots can be used. Any thread with a connection. */
bool tn_snap_dir_ready(tenants *ts, PGconn *pg);
/* Splits a snapshot's extra bytes into the tag records' part (*rec_len bytes from the
 * start) and the identity. Returns false when they are not in a known format. */
bool tn_snap_extra_split(const unsigned char *x, size_t xlen, size_t *rec_len, snap_id *id);
/* a snapshot of another engine is not even read (an engine change, see
 * tenants_engine_changed, or a changed index_engine or index_faiss_factory setting) */
bool tn_snap_file_other(const char *path, const snap_id *want, snap_id *got);
/* A snapshot identity as text, for log lines. */
const char *tn_snap_id_name(const snap_id *id);
/* The identity of an index created with vo. */
snap_id tn_snap_id_of(const vindex_opts *vo);
/* Restores a loaded snapshot's tags from its tag records and drops memories written after
 * change upto. Returns 0; -EBADMSG when the records do not describe the snapshot (free the
 * tags with the index); -ENOMEM before any entry was touched (destroy the index without
 * freeing them). */
int tn_tags_restore(vindex *vi, const unsigned char *x, size_t xlen, uint64_t upto);

#endif
