/* server/domain/tenants.h: the registry of tenants' vector indexes.
 *
 * A tenant's index is loaded on first use (on a background thread; the request waits
 * without blocking its worker): from its snapshot file plus the changes committed after
 * it, or, when there is no usable snapshot (missing, corrupt, from another database,
 * ahead of the database, or older than the change log), from every memory in PostgreSQL.
 * It is then kept current by applying every change: the worker that committed a change
 * applies it at once, and changes committed by other processes arrive through the change
 * log. Each change carries the tenant's change number; the registry applies each number
 * once, in any order, and keeps deletes from being undone by an older write that arrives
 * late, so an index always converges to the database's state.
 *
 * Each index is created with its tenant's engine (tenants.index_engine, or the index_engine
 * setting when the tenant chose none), read from PostgreSQL at every load.
 *
 * Snapshots live in <index_dir>/<database instance id>/<tenant id>.idx, written
 * atomically by the housekeeping (see tenants_start), at eviction and at shutdown; each
 * records the engine (and FAISS factory) it was written by, and is used only by a load
 * with the same. An index
 * stays loaded until the loaded indexes exceed the memory budget; the least recently used
 * is then snapshotted and unloaded, and comes back from its snapshot on its next use.
 */
#ifndef ENGRAM_SERVER_TENANTS_H
#define ENGRAM_SERVER_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bg.h"
#include "loader.h"
#include "memmeta.h"
#include "server.h"
#include "vindex.h"

typedef struct tenants tenants;
typedef struct tenant tenant;

/* tenants_create returns an empty registry; tenants_destroy frees it and every index. */
tenants *tenants_create(server *s);
void tenants_destroy(tenants *ts);

/* tenants_get returns the tenant's entry (created on first call, not yet loaded) with a
 * reference the caller drops with tenants_put. dim is the tenant's embedding dimension.
 * Returns NULL when out of memory. Any thread. */
tenant *tenants_get(tenants *ts, int64_t id, uint32_t dim);
void tenants_put(tenant *t);

/* tenants_dim_is tells whether t's index has dimension dim. A request that read its
 * tenant's model before a re-embedding's swap holds vectors of the old dimension while the
 * entry has the new one (tenants_dim_changed): it must neither search nor apply them. Any
 * thread. */
bool tenants_dim_is(const tenant *t, uint32_t dim);

/* tenants_when_ready calls cb(arg, 0, NULL) on where's thread once the index is loaded, or
 * cb(arg, -1, reason) when loading failed. When it is already loaded, returns 1 without
 * calling cb (the caller continues at once); otherwise returns 0 and cb runs later. The
 * reference on t must be held until cb has run. Returns -ENOMEM on failure. */
int tenants_when_ready(tenant *t, server_poster where,
                       void (*cb)(void *arg, int status, const char *err), void *arg);

/* tenants_vindex returns the loaded index (valid while the reference is held and the
 * tenant is loaded). */
vindex *tenants_vindex(tenant *t);

/* tenants_apply_upsert applies change seq: memory id now has vector vec (NULL: unchanged)
 * and metadata m. tenants_apply_delete applies change seq: id was deleted. Both are no-ops
 * for changes already applied and safe from any thread. */
void tenants_apply_upsert(tenant *t, uint64_t seq, uint64_t id, const float *vec,
                          const mem_meta *m);
void tenants_apply_delete(tenant *t, uint64_t seq, uint64_t id);

/* tenants_notify_change tells the registry that change seq of tenant id was committed
 * somewhere (listener thread); if the index is loaded and lacks it, a catch-up from the
 * change log is scheduled. */
void tenants_notify_change(tenants *ts, int64_t id, uint64_t seq);

/* tenants_floor_of returns the highest change number of t this process knows was
 * committed: what its index holds, what this process wrote and what other processes
 * announced (change notifications), whether or not the index is loaded. A read that is
 * combined with the index, or that must show this process's own writes, may run on a hot
 * standby only if the standby's copy of the tenant has replayed at least this change (see
 * req_submit_read). tenants_read_floor is the same for tenant id: for a tenant out of the
 * registry (evicted, retired) the floor it had when it left, 0 when this process has seen
 * nothing of it. Any thread. */
uint64_t tenants_floor_of(tenant *t);
uint64_t tenants_read_floor(tenants *ts, int64_t id);

/* tenants_loaded_ids returns in *ids (malloc'd, the caller frees it; NULL when *n is 0) the
 * ids of the *n tenants whose indexes are loaded. Returns 0 or -ENOMEM. Any thread. */
int tenants_loaded_ids(tenants *ts, int64_t **ids, size_t *n);

/* tenants_catch_up_all schedules a catch-up of every loaded tenant (after the listener
 * reconnects, notifications may have been missed). */
void tenants_catch_up_all(tenants *ts);

/* tenants_start schedules the housekeeping (every second: background rebuilds of indexes
 * with many deleted vectors, snapshots of changed indexes, eviction of the least recently
 * used indexes above the memory budget) and starts the preload: the indexes that have
 * snapshots, newest first, as far as the budget allows. Call once, before the workers
 * start. Returns 0 or a negative errno (the background threads could not take them). */
int tenants_start(tenants *ts);

/* tenants_save_all writes the snapshot of every loaded index changed since its last one
 * (at shutdown, once no worker or background job runs). */
void tenants_save_all(tenants *ts);

/* tenants_preloaded tells whether the start-up preload has finished. */
bool tenants_preloaded(tenants *ts);

/* tenants_dim_changed drops a tenant's index and snapshot as tenants_forget does, after its
 * embedding model changed (a re-embedding's swap): its next load reads the new vectors, at
 * dimension dim whatever dimension the caller of tenants_get names (a request that read the
 * old one before the swap). Any thread. */
void tenants_dim_changed(tenants *ts, int64_t id, uint32_t dim);

/* tenants_forget drops a tenant's index (tenant deleted). */
void tenants_forget(tenants *ts, int64_t id);

/* tenants_engine_changed tells the registry that tenant id now uses engine
 * (VINDEX_ENGINE_*; the caller resolves "the server's default"): an admin.tenant.update of
 * this process or a notification from another. A loaded index with another engine is
 * dropped at once when no request uses it, else by the housekeeping within a second after
 * its requests finish; its next use loads it with the engine PostgreSQL then names (a
 * snapshot written by another engine is not used: see tenants.c). Requests already holding
 * the old index finish with it. Any thread. */
void tenants_engine_changed(tenants *ts, int64_t id, int engine);

/* Where warming the row cache with a tenant's rows stands (after each load of its index, the
 * newest live rows are read into the row cache in the background). */
enum tenants_rows_warm {
    TENANTS_ROWS_PENDING,    /* queued behind other background work */
    TENANTS_ROWS_WARMING,    /* reading */
    TENANTS_ROWS_DONE,       /* every live row read */
    TENANTS_ROWS_CACHE_FULL, /* stopped: the cache holds row_cache_prewarm_percent */
    TENANTS_ROWS_OFF,        /* row_cache_prewarm_percent or row_cache_mb is 0 */
    TENANTS_ROWS_FAILED,     /* the database failed (searches read rows as they need them) */
};

/* tenants_rows_warm_name names a state for memory.stats ("pending", "warming", "done",
 * "cache_full", "off", "failed"). */
const char *tenants_rows_warm_name(int state);

/* What memory.stats reports of a loaded index. */
typedef struct tenants_index {
    int engine;            /* VINDEX_ENGINE_* the index was created with */
    enum vindex_kind kind; /* the structure searches use now */
    size_t vectors;        /* live vectors */
    size_t bytes;          /* vindex_bytes */
    vindex_recall recall;  /* what its recall monitor measured */
    int engine_in_use;     /* VINDEX_ENGINE_FAISS once the FAISS index is built */
    int rows_warm;         /* enum tenants_rows_warm, of the last load */
    uint64_t rows_warmed;  /* rows that warming put in the row cache since that load */
} tenants_index;

/* tenants_index_info fills *out and returns true when tenant id's index is loaded in this
 * process; false (and *out zeroed) when it is not. Never loads it. Any thread. */
bool tenants_index_info(tenants *ts, int64_t id, tenants_index *out);

/* tenants_settle finishes t's index after a bulk write (memory.store_batch) when
 * vindex_settle_due: on a job thread, a rebuild when the sign codes' centre is stale and a
 * measurement of codes no calibration covers (vindex_settle), then cb(arg) on where's
 * thread; returns 0 then, and the reference on t must be held until cb has run. Returns 1
 * when there is nothing to settle (or the index is not loaded: its load settles it), cb not
 * called; a negative errno (-ENOMEM, -ESHUTDOWN) when the job cannot be queued, cb not
 * called. So the first searches after a bulk load run at the measured depth instead of
 * scanning exactly until the recall monitor gets to the index. Any thread. */
int tenants_settle(tenant *t, server_poster where, void (*cb)(void *arg), void *arg);

/* tenants_touch counts one access to each of the n memories at now_ms in the index (the
 * database is updated in batches elsewhere). */
void tenants_touch(tenant *t, const uint64_t *ids, size_t n, int64_t now_ms);

/* A search whose filter only excludes archived and expired memories may skip the index's
 * filter when the tenant's best matches are live (see m_search.c). tenants_nonlive_seen
 * notes at now_ms that one of them was not; tenants_nonlive_recent tells whether that was
 * noted within the last TENANT_NONLIVE_MS. Thread-safe. */
#define TENANT_NONLIVE_MS 10000
void tenants_nonlive_seen(tenant *t, int64_t now_ms);
bool tenants_nonlive_recent(tenant *t, int64_t now_ms);

/* Buckets of the load-duration histogram: upper bounds in seconds, then +Inf. */
#define TENANTS_LOAD_BUCKETS 12
extern const double tenants_load_bounds_s[TENANTS_LOAD_BUCKETS - 1];

typedef struct tenants_metrics {
    uint64_t known;   /* tenants the registry holds (loaded, loading or not yet) */
    uint64_t loaded;  /* indexes loaded */
    uint64_t vectors; /* vectors in them */
    uint64_t bytes;   /* memory they hold (vindex_bytes: resident as last measured) */
    /* float rows mapped from snapshots, of them in RAM at the last measurement, and the
     * page-ins of searches reading them, over the loaded indexes */
    uint64_t rows_mapped, rows_resident, page_ins;
    /* float rows searches read (re-ranks and near-ties), of them near-ties, and the searches,
     * over the loaded indexes */
    uint64_t rows_read, tie_reads, searches;
    uint64_t budget;     /* the memory budget in bytes */
    uint64_t by_kind[3]; /* loaded indexes by structure (flat, sq8, ann) */
    uint64_t snapshot_loads, snapshots_rejected, database_loads, snapshots_written, evictions,
        rebuilds; /* counters since start */
    /* successful loads by source (0 from a snapshot, 1 from the database): how many took at
     * most tenants_load_bounds_s[b] (and more than the bound before; the last bucket has no
     * bound), and their total duration in microseconds */
    uint64_t load_hist[2][TENANTS_LOAD_BUCKETS];
    uint64_t load_us[2];
    /* the recall monitor: loaded ANN indexes with an estimate, the lowest and the sum of
     * their estimates, those searching exactly for recall, probes run and their time */
    uint64_t recall_measured;
    double recall_min, recall_sum;
    uint64_t exact_fallbacks, recall_probes, recall_probe_ns;
    uint64_t recall_steady_skips; /* rounds the monitor passed over a steady index */
    uint64_t rows_warmed;         /* rows read into the row cache after loads, since start */
    uint64_t rows_dropped; /* bytes of mapped float rows dropped from RAM at the cap, since start */
    /* never-loaded tenants retired from the registry since start (idle TENANT_RETIRE_NS),
     * and the change floors kept for tenants out of it (with pg_read_dsn only) */
    uint64_t retired, floors;
} tenants_metrics;

/* tenants_stats fills m. Any thread. */
void tenants_stats(tenants *ts, tenants_metrics *m);

#endif
