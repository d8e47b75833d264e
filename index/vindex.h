/* index/vindex.h: one tenant's vector index: vectors, ids, per-vector metadata and
 * tombstones, searched exactly for small tenants and through quantized codes with exact
 * re-ranking for larger ones; persistent through atomic snapshots.
 *
 * Similarity is cosine similarity: vectors are L2-normalized on the way in and stored as
 * float rows. Each vector carries a caller-defined metadata record of fixed size
 * (vindex_opts.meta_size), so filters and ranking run next to the distances without
 * another lookup.
 *
 * Structures ("kinds"), chosen by the number of live vectors and kept current on every add
 * (a kind change encodes the existing vectors once, off the lock searches take):
 *
 *   VINDEX_KIND_FLAT  below quant_min (default 512): float rows only, scanned exactly.
 *   VINDEX_KIND_SQ8   from quant_min: plus an int8 code per vector with a rigorous bound on
 *                     its error; the search scans the codes and computes the exact float
 *                     similarity only of vectors whose upper bound can still make the top k.
 *                     Exact, with a quarter of the memory traffic of the float scan.
 *   VINDEX_KIND_ANN   from ann_min (default 4096), for dimensions below 65,535: plus a
 *                     sign-bit code per vector (dim bits): the signs of the vector minus
 *                     the index's centre, rotated (a fixed orthogonal transform), so every
 *                     bit is informative whatever the distribution (non-negative features,
 *                     a dominant shared direction, variance in a few dimensions). The search
 *                     ranks every vector by Hamming distance to the query's code (one pass
 *                     over dim/8 bytes per vector), takes the nearest candidates among
 *                     those the filter keeps, as many as the measured depth says, bounds
 *                     them with the int8 codes and re-ranks exactly; see vindex_search for
 *                     what is exact and vindex_calibrate for the depth.
 *
 * Removal leaves a tombstone; vindex_maintenance (a background thread) compacts them away
 * by building new storage without blocking searches and swapping it in under a short
 * exclusive lock. Small indexes (up to inline_compact_max slots) compact inside
 * vindex_remove.
 *
 * Thread-safety: every function may be called from any thread, concurrently with any
 * other, unless its comment says otherwise. Searches and reads share a reader lock and run
 * in parallel. Writers (add, upsert, remove, metadata updates) are serialized among
 * themselves by a writer mutex and prepare their work outside the reader lock; they hold
 * it exclusively only to publish (a few microseconds, plus one copy of at most one chunk
 * of rows, about 1 MiB, when the first chunk grows). A writer waiting for the lock blocks
 * new readers (the lock prefers writers), so a publish waits at most for the searches in
 * flight. Maintenance and snapshots block neither searches nor, except for short copies,
 * writers. No function of the index uses OpenMP or BLAS threads: one query runs on its
 * caller's thread, and queries parallelize across callers.
 *
 * Memory. From the SQ8 kind on, a search reads a float row only to re-rank a candidate that
 * the int8 bound could not rule out; an ANN search ranks its candidates by their int8
 * estimates and reads the float rows of near-ties across the k-th place only (0.5 to 1.1 a
 * query on the 768-d benchmark sets at 50,000, 1 on the text set; see vindex_opts.tie_margin).
 * Everything a search touches on every query (int8 and sign codes, metadata, ids) stays on
 * the heap. Once the
 * index has been saved (or loaded), its float rows are read from that snapshot, mapped,
 * instead of the heap: the kernel keeps the pages that searches use and may drop the rest;
 * rows added since sit on the heap until the next save. vindex_bytes counts what is
 * resident: the heap and the mapped pages in RAM at the last vindex_resident;
 * vindex_trim drops the mapped pages (the next searches read them back: page-ins, counted
 * in vindex_stats). A FLAT index keeps its rows on the heap: its search reads all of them.
 *
 * Recall at build time. The ANN kind's depth is measured (vindex_calibrate) before codes
 * answer: a rebuild measures its new codes before it swaps them in, vindex_settle finishes a
 * bulk build (a rebuild when due, then a measurement), a snapshot carries its index's
 * measurement, and codes not measured yet (the add that crossed ann_min, until the monitor
 * measures them) are scanned exactly rather than searched at a guessed depth.
 *
 * Implementation: one file per job behind the private vindex_int.h, which lists them. The
 * library (engram_index) links no FAISS: the FAISS engine reaches it through
 * vindex_opts.faiss_engine (see the engine interface below).
 */
#ifndef ENGRAM_INDEX_VINDEX_H
#define ENGRAM_INDEX_VINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vindex vindex;

/* Positive result codes (0 success, negative -errno). */
enum {
    VINDEX_E_NOT_FOUND = 1, /* no vector has this id; vindex_load: no snapshot file */
    VINDEX_E_EXISTS,        /* a vector with this id is already present */
    VINDEX_E_ZERO,          /* the vector has no direction: zero length, or NaN/infinite */
    VINDEX_E_DIM,           /* the dimension does not match the index */
    VINDEX_E_FAISS,         /* vindex_maintenance: the FAISS engine's index could not be built
                             * (vindex_engine_error says why; searches use the native codes) */
    VINDEX_E_CORRUPT,       /* vindex_load: short, truncated or corrupt snapshot */
    VINDEX_E_MISMATCH,      /* vindex_load: intact snapshot of another dim or meta_size */
};

enum vindex_kind {
    VINDEX_KIND_FLAT = 0,
    VINDEX_KIND_SQ8 = 1,
    VINDEX_KIND_ANN = 2,
};

/* Options. Zero in any field but dim and meta_size selects its default. */
typedef struct vindex_opts {
    size_t dim;       /* vector dimension, 1..65536 */
    size_t meta_size; /* bytes of metadata per vector, may be 0 */
    /* Bytes [meta_atomic_off, meta_atomic_off + meta_atomic_len) of the metadata are 8-byte
     * words that vindex_touch_meta changes while searches run: the index reads them with
     * relaxed atomic loads, and keep and score callbacks must too (vindex_meta_word). Both
     * multiples of 8, within meta_size, which is then a multiple of 8; len 0: none. */
    size_t meta_atomic_off;
    size_t meta_atomic_len;
    /* Kind thresholds in live vectors: SQ8 from quant_min (default 512), ANN from ann_min
     * (default 4096). A threshold of SIZE_MAX never switches. Kinds only go up on adds; a
     * rebuild goes back down once the live count falls below half a threshold. The
     * default puts a 5,000-vector tenant on ANN (0.06-0.07 ms at 768 dims, recall@10 1.0
     * measured on structured data, not guaranteed); ann_min above the count keeps it on
     * the exact SQ8 kind (0.19-0.32 ms, exact by construction). */
    size_t quant_min;
    size_t ann_min;
    /* ANN search: it gathers and bounds with the int8 codes the depth vindex_calibrate
     * measured (scaled with k / 10), at least ann_candidates (default 256) and 16 k: its
     * budget; codes not measured yet are scanned exactly. A calibration that needs more
     * than ann_max_candidates (default 16384; or half the live vectors) switches the index
     * to exact scans. */
    size_t ann_candidates;
    size_t ann_max_candidates;
    /* Compaction is due when tombstones reach compact_percent (default 25) percent of the
     * stored vectors and at least 64; indexes of at most inline_compact_max stored vectors
     * (default 4096) compact inside vindex_remove, larger ones in vindex_maintenance. */
    unsigned compact_percent;
    size_t inline_compact_max;
    /* The engine of the ANN kind's candidate stage: VINDEX_ENGINE_NATIVE (0, the default:
     * the index's own codes) or VINDEX_ENGINE_FAISS (a FAISS index built from
     * faiss_factory, default "HNSW32,Flat", searched with efSearch faiss_ef_search, default
     * 64). Either way the index's own rows, metadata and int8 codes do filters, ranking,
     * deletes and the exact re-rank. */
    int engine;
    const char *faiss_factory; /* borrowed: must outlive the index */
    int faiss_ef_search;
    /* The FAISS engine's functions (vfaiss_engine() from engram_vfaiss, index/vfaiss.h),
     * borrowed: must outlive the index. The index itself links no FAISS: engine FAISS
     * works only when a caller that links it passes it here. NULL: no FAISS engine; an
     * index with engine VINDEX_ENGINE_FAISS then searches with its native codes (its first
     * vindex_maintenance on the ANN kind returns VINDEX_E_FAISS, vindex_engine_error says
     * why), and vindex_load skips a snapshot's FAISS section. */
    const struct vindex_engine_ops *faiss_engine;
    /* heap_rows: keep every float row on the heap even where a snapshot could map them (the
     * layout before issue 34; benchmarks compare the two). */
    bool heap_rows;
    /* The recall a rebuild's own measurement aims for (vindex_maintenance; default 0.99;
     * vindex_maintenance_scored and vindex_settle take theirs). */
    double recall_target;
    /* tie_margin: an ANN search ranks its candidates by their int8 estimates and reads the
     * float rows only of near-ties across the k-th place: hits whose score intervals (the
     * estimate plus or minus tie_margin standard deviations of its error, default 2; 0 takes
     * the default) overlap there. Negative: every candidate the int8 bound cannot rule out
     * is re-ranked on its float row (exact similarities; the behaviour before issue 34). */
    double tie_margin;
} vindex_opts;

enum vindex_engine {
    VINDEX_ENGINE_NATIVE = 0,
    VINDEX_ENGINE_FAISS = 1,
};

/* ---- the engine interface ----
 *
 * The ANN kind's candidate stage may come from an external library (FAISS) through this
 * table of functions, which that library's adapter fills (index/vfaiss.h: vfaiss_engine),
 * so the index links none of it. An engine index holds vectors (unit length; similarity
 * is the inner product) under dense labels 0, 1, ... in the order they are added; the
 * index maps labels to its slots, keeps tombstones and rebuilds instead of removing.
 * Results: 0, -errno, or a positive engine code (any positive value: the index treats it
 * as "the engine failed"). Thread-safety as vfaiss.h: search, count, bytes and serialize
 * only read and may run concurrently; add needs exclusive use; create and deserialize make
 * a new index. */
typedef struct vindex_eix vindex_eix; /* an engine's index (the engine's own type) */

typedef struct vindex_engine_ops {
    const char *name; /* for messages, e.g. "FAISS" */
    /* create: an empty index of dim from factory (a string the engine understands) with
     * search effort ef_search; *out owns it. err gets a message on failure. */
    int (*create)(size_t dim, const char *factory, int ef_search, vindex_eix **out, char *err,
                  size_t errlen);
    void (*destroy)(vindex_eix *x);                         /* NULL is a no-op */
    int (*add)(vindex_eix *x, size_t n, const float *vecs); /* n x dim row-major */
    /* search: the k best labels and similarities, best first; label -1 beyond what the index
     * finds. On the caller's thread. */
    int (*search)(const vindex_eix *x, const float *q, size_t k, int64_t *labels, float *sims);
    size_t (*count)(const vindex_eix *x); /* vectors added: the next label */
    size_t (*bytes)(const vindex_eix *x); /* memory held, for vindex_bytes */
    /* serialize: the index as bytes (malloc'd, the caller frees them); deserialize: an index
     * from them (borrowed; ef_search 0 keeps the serialized one). The caller checksums. */
    int (*serialize)(const vindex_eix *x, void **buf, size_t *len);
    int (*deserialize)(const void *buf, size_t len, int ef_search, vindex_eix **out, char *err,
                       size_t errlen);
} vindex_engine_ops;

/* vindex_create returns an empty index, or NULL when out of memory or when opts are invalid
 * (dim 0 or above 65536, meta_size above 1 MiB, compact_percent above 100).
 * Free with vindex_destroy (NULL is a no-op; no other thread may still use the index, and
 * no call on it may be in progress). */
vindex *vindex_create(const vindex_opts *opts);
void vindex_destroy(vindex *vi);

/* vindex_dim returns the dimension (no lock); vindex_count the number of live vectors
 * (shared lock). */
size_t vindex_dim(const vindex *vi);
size_t vindex_count(vindex *vi);

/* vindex_bytes returns the memory the index holds for a memory budget, resident bytes: every
 * heap array at its allocated capacity (codes, ids, metadata, tombstones, float rows on the
 * heap; the last chunk counted whole), the id map, the calibration and the handle, plus the
 * mapped float rows in RAM at the last vindex_resident; not allocator overhead. While
 * vindex_maintenance rebuilds, the new copy (up to the size of the live data) is extra and
 * not counted; a search of an ANN index allocates about 7 bytes per stored vector of
 * scratch for its duration. */
size_t vindex_bytes(vindex *vi);

/* vindex_resident measures which pages of the mapped float rows are in RAM now (mincore:
 * about 20 us per 100 MiB mapped) and returns vindex_bytes with that measurement. Shared
 * lock. Any thread; meant for the caller's periodic accounting. */
size_t vindex_resident(vindex *vi);

/* vindex_trim asks the kernel to drop the mapped float rows from RAM (MADV_PAGEOUT; the
 * pages are clean: nothing is written) and returns the resident bytes measured after it.
 * Searches go on and read the rows they need back from the file (page-ins). Pages another
 * process maps too stay. Shared lock. */
size_t vindex_trim(vindex *vi);

/* vindex_rows_keep is vindex_resident that also holds an ANN index's mapped float rows in RAM
 * to percent of them (its searches read a row for a near-tie only; the other kinds re-rank
 * on rows, and 100 leaves them to the kernel: both are measured only): past it, the pages no
 * search read since the last call are dropped (MADV_PAGEOUT and the file's
 * POSIX_FADV_DONTNEED), then, if the pages searches read are more than the cap, those past
 * the cap's worth of them. Adds the bytes it
 * dropped to *dropped and returns vindex_bytes measured after. Meant to be called about once
 * a second (the clock's period); the rows of adds since the snapshot (copy-on-write,
 * anonymous) are counted but neither capped nor dropped. Shared lock. */
size_t vindex_rows_keep(vindex *vi, double percent, size_t *dropped);

typedef struct vindex_stats {
    size_t count;          /* live vectors */
    size_t slots;          /* stored vectors, live or tombstoned */
    size_t tombstones;     /* removed vectors not yet compacted away */
    size_t compactions;    /* rebuilds (compactions and kind changes) since creation */
    size_t bytes;          /* as vindex_bytes */
    enum vindex_kind kind; /* the structure searches use now */
    bool maintenance_due;  /* vindex_maintenance has work: tombstones past the threshold,
                            * a kind change that an add could not make (memory), a centre
                            * to recompute, or the FAISS engine's index to (re)build */
    int engine;            /* the engine ANN searches use now: VINDEX_ENGINE_FAISS once its
                            * index is built, else VINDEX_ENGINE_NATIVE */
    size_t heap_bytes;     /* of bytes: what the heap holds */
    size_t rows_heap;      /* of heap_bytes: float rows a save would map (0 below SQ8) */
    size_t rows_mapped;    /* bytes of float rows mapped from the last snapshot */
    size_t rows_resident;  /* of them in RAM at the last vindex_resident (in bytes) */
    uint64_t page_ins;     /* major page faults of searches reading mapped rows */
    uint64_t rows_read;    /* float rows searches read (re-ranks and near-ties), heap or map */
    uint64_t tie_reads;    /* of rows_read: those read to order near-ties at the k-th place */
    uint64_t searches;     /* searches answered (vindex_search calls that returned hits) */
} vindex_stats;

/* vindex_get_stats fills *st with one consistent snapshot of the counters above (shared
 * lock; O(chunks)). vindex_bytes takes the shared lock too. */
void vindex_get_stats(vindex *vi, vindex_stats *st);

/* vindex_last_error returns NULL (FAISS is no longer used; kept for compatibility). */
const char *vindex_last_error(void);

/* vindex_add adds vec (dim floats, normalized here; the caller's array is not changed) with
 * id and a copy of meta (meta_size bytes; may be NULL when meta_size is 0).
 * Returns 0, VINDEX_E_EXISTS, VINDEX_E_ZERO, -EINVAL for the reserved id UINT64_MAX, or
 * -ENOMEM (the index is unchanged on every error). The add that crosses a kind threshold
 * encodes the existing vectors (about 1.5 us each at 768 dimensions) before it returns;
 * searches are not blocked meanwhile. Thread-safety: writer mutex (adds, upserts, removes
 * and metadata updates run one at a time), exclusive lock only to publish. */
int vindex_add(vindex *vi, uint64_t id, const float *vec, const void *meta);

/* vindex_upsert adds vec and meta under id, replacing the vector and metadata id had, in
 * one atomic step (no search sees the id missing or twice). Returns 0 when id was new, 1
 * when it replaced a vector, or an error as vindex_add (never VINDEX_E_EXISTS). */
int vindex_upsert(vindex *vi, uint64_t id, const float *vec, const void *meta);

/* vindex_remove removes the vector with id (a tombstone; see the compaction options).
 * Returns 0 or VINDEX_E_NOT_FOUND. Writer mutex, exclusive lock to publish; an inline
 * compaction (small indexes) rebuilds under the writer mutex and swaps under the exclusive
 * lock, and is skipped while vindex_maintenance or vindex_save runs. */
int vindex_remove(vindex *vi, uint64_t id);

/* vindex_maintenance does the work vindex_stats.maintenance_due reports: it builds compacted
 * storage (and the kind the live count calls for) from a snapshot of the index without
 * holding any lock, then briefly blocks writers to carry over the changes made meanwhile
 * and swaps the new storage in under the exclusive lock (microseconds). With the FAISS
 * engine on an ANN index it then builds the FAISS index over the live vectors (HNSW: about
 * 0.4 ms a vector at 768 dimensions), again without blocking searches or writers, when
 * there is none or the vectors added since the last build (searched exactly meanwhile)
 * passed an eighth of the index; a rebuild drops it, since it renumbers slots. Meant for a
 * background thread; concurrent calls run one after the other. Needs memory for a copy of
 * the live data while it runs. Returns 1 when it rebuilt, 0 when nothing was due,
 * VINDEX_E_FAISS (the FAISS build failed: not retried until a rebuild; see
 * vindex_engine_error), or -ENOMEM (the index is unchanged). */
int vindex_maintenance(vindex *vi);

/* vindex_engine_error copies why the FAISS engine's last build failed into buf (len bytes;
 * empty when it did not fail). */
void vindex_engine_error(vindex *vi, char *buf, size_t len);

/* vindex_contains tells whether id is live in the index. Shared lock (as are get_meta,
 * get_vector and foreach below). */
bool vindex_contains(vindex *vi, uint64_t id);

/* vindex_get_meta copies the metadata of id into meta_out (meta_size bytes). Returns 0 or
 * VINDEX_E_NOT_FOUND. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out);

/* vindex_set_meta replaces the metadata of id. Returns 0 or VINDEX_E_NOT_FOUND. Writer
 * mutex and exclusive lock (as vindex_update_meta). */
int vindex_set_meta(vindex *vi, uint64_t id, const void *meta);

/* vindex_touch_meta calls fn(id, meta, ctx) on the stored metadata of each of the n ids that
 * are present, under the writer mutex only: searches go on meanwhile. fn may change only the
 * words of the atomic range (vindex_opts.meta_atomic_off), with vindex_meta_word_store; it
 * must be quick and must not call back into the index. Counters that every search bumps
 * (access counts) use it instead of vindex_update_meta, whose exclusive lock would make the
 * searches of one tenant take turns. Returns the number of ids found. */
size_t vindex_touch_meta(vindex *vi, const uint64_t *ids, size_t n,
                         void (*fn)(uint64_t id, void *meta, void *ctx), void *ctx);

/* A word of the atomic range of a stored metadata block, read or written as
 * vindex_touch_meta's concurrency needs (relaxed atomics: each word stands alone). */
static inline uint64_t vindex_meta_word(const uint64_t *w)
{
    return __atomic_load_n(w, __ATOMIC_RELAXED);
}

static inline void vindex_meta_word_store(uint64_t *w, uint64_t v)
{
    __atomic_store_n(w, v, __ATOMIC_RELAXED);
}

/* vindex_update_meta calls fn(id, meta, ctx) on the stored metadata of each of the n ids that
 * are present, under one exclusive lock; fn must be quick and must not call back into the
 * index. Returns the number of ids found. Everywhere metadata is handed to a callback
 * (here, vindex_foreach, keep, score), the pointer is NULL when meta_size is 0. */
size_t vindex_update_meta(vindex *vi, const uint64_t *ids, size_t n,
                          void (*fn)(uint64_t id, void *meta, void *ctx), void *ctx);

/* vindex_get_vector copies the stored (normalized) vector of id into out (dim floats).
 * Returns 0 or VINDEX_E_NOT_FOUND. */
int vindex_get_vector(vindex *vi, uint64_t id, float *out);

/* vindex_foreach calls fn for every live vector under the shared lock (fn must not call
 * back into the index). Stops early and returns fn's value when it is non-zero. */
int vindex_foreach(vindex *vi,
                   int (*fn)(uint64_t id, const float *vec, const void *meta, void *ctx),
                   void *ctx);

typedef struct vindex_hit {
    uint64_t id;
    float similarity; /* cosine similarity in [-1, 1] */
    double score;     /* the ranking score (the similarity when the query has no score fn) */
} vindex_hit;

typedef struct vindex_query {
    const float *vec; /* dim floats; need not be normalized, must not be zero */
    size_t k;         /* how many hits at most */
    /* keep: NULL keeps every vector; else called with each candidate's id and metadata, and only
     * candidates it returns true for can be hits. Must be pure and quick. */
    bool (*keep)(uint64_t id, const void *meta, void *ctx);
    /* score: NULL ranks by similarity; else the ranking score of a candidate. Scores must
     * satisfy score <= score_slope * similarity + score_bound (score_slope >= 0), which
     * lets the search skip candidates (without calling keep or score) that cannot beat the
     * k-th hit, so a bound that does not hold loses hits. score_slope and score_bound both
     * 0 (a zero-initialized query) declare no bound: nothing is skipped then. A NaN score
     * ranks as -infinity. */
    double (*score)(float similarity, const void *meta, void *ctx);
    double score_slope;
    double score_bound;
    /* score_monotone: the caller promises that score never decreases when the similarity
     * increases (for the same meta and ctx). The search may then call score with an upper
     * bound of a candidate's similarity, after keep, to skip computing its exact
     * similarity. Optional; saves work when the bound above is loose. */
    bool score_monotone;
    void *ctx;
} vindex_query;

/* vindex_search writes up to q->k hits, best score first (ties: higher similarity, then
 * lower id), into out (caller-owned, q->k entries) and their number into *n.
 *
 * Filters never under-fill: when at least k vectors pass keep, exactly k are returned.
 * Kinds FLAT and SQ8 are exact: the hits are the best k of all kept vectors. On an ANN
 * index the hits are the best k among the candidates the candidate stage (the native codes,
 * or FAISS) found among the kept vectors, ranked by their int8 estimates: a hit's similarity
 * is its estimate (the int8 code's product, within its bound of the exact value: 3e-4 to
 * 1e-3 on the benchmark sets, 0.01 at most for dense unit vectors), except where hits' score
 * intervals (vindex_opts.tie_margin) overlap across the k-th place, whose float rows decide
 * which are in and whose similarities are then exact. The order among the k follows the
 * estimates: hits closer than the codes' error may come in either order. With a negative
 * tie_margin, or a score function that is not monotone, every candidate is ranked exactly on its
 * float row. When the filter keeps at most the budget, all of them are candidates. A filter that a
 * sample of 128 vectors shows to keep under a tenth of them (or under half the budget) is answered
 * by scanning the metadata and bounding every kept vector: exact. A query with a score function
 * searches past the measured depth while candidates keep entering its top k (native), or four times
 * as deep (FAISS). An ANN index answers exactly (scanning the int8 codes) when k is large against
 * it (live at most twice the budget), until its codes are measured, and while its recall monitor
 * finds no depth that reaches the target. The reported similarity of a vector depends only on it,
 * the query and the index's centre (not on where it is stored or on the CPU) and on whether it was
 * ranked on its code or its row, so two copies of one vector tie exactly and are ordered by id.
 *
 * Returns 0, VINDEX_E_ZERO for a query vector without direction, or -ENOMEM. Runs on the
 * caller's thread under the shared lock (keep and score run under it); allocates scratch
 * only on ANN indexes and above 1024 dimensions. */
int vindex_search(vindex *vi, const vindex_query *q, vindex_hit *out, size_t *n);

/* ---- recall ----
 *
 * An ANN search is exact for the candidates it bounds; what it can miss is a true neighbour
 * the sign codes rank too deep. The index measures that itself: a probe query (a stored
 * vector plus noise, or the midpoint of two stored vectors: never a stored vector itself)
 * is answered exactly by the int8 scan, and the position of each of its 10 true
 * neighbours in the candidate order is recorded (a ring of the last 2,048). From those
 * positions follow the recall at any depth and the depth that reaches a target.
 *
 * The FAISS engine's recall depends on where queries land in its graph, which synthetic
 * probes only guess (they erred by up to 0.025 against the benchmark's queries): there,
 * every fourth search keeps a copy of its query (the last 256), and a probe is the newest
 * unused one of those when there is any, a synthetic one otherwise. With steady traffic
 * the estimate is then the recall of the tenant's own recent queries. The native engine
 * keeps synthetic probes: its depth carries a margin, and its estimate was within 0.0011
 * of the measured recall on every benchmark data set. */

typedef struct vindex_recall {
    double estimate;      /* recall@10 searches get now: 1 below the ANN kind and when they
                           * scan exactly; NaN before enough samples of the current codes */
    double ann_estimate;  /* recall@10 of the ANN path at its depth (NaN: not measured) */
    size_t depth;         /* candidates bounded per query of k <= 10 (0: not measured yet) */
    size_t samples;       /* true-neighbour positions behind the estimate */
    size_t query_samples; /* of them, from real search queries (the FAISS engine; see below) */
    bool exact_fallback;  /* no depth within the limits reaches the target: exact scans */
    bool was_below;       /* vindex_calibrate: the depth in use before the call measured below
                           * the target (the call deepened or fell back) */
    size_t scored_depth;  /* the depth searches with a score use (0: none measured) */
} vindex_recall;

/* vindex_calibrate runs probes probe queries (each an exact int8 scan plus a Hamming pass:
 * about 1-4 ms at 50,000 x 768), then, once 200 positions are known, sets the depth to the
 * one whose recall on them reaches target + (1 - target) / 2, plus a quarter; when that
 * exceeds ann_max_candidates or half the live vectors, searches scan exactly until a later
 * calibration finds a depth again. New codes (a kind change, a rebuild) discard the samples
 * (a rebuild brings its own, measured before the swap). Fills *out (may be NULL). Returns 0
 * or -ENOMEM. Holds the shared lock per probe only; meant for a background thread. */
int vindex_calibrate(vindex *vi, size_t probes, double target, vindex_recall *out);

/* vindex_calibrate_scored is vindex_calibrate that also measures, with the same probes, a
 * blended ranking: shape gives the score function (score, score_slope, score_bound,
 * score_monotone, ctx; its vec, k and keep are ignored), typically the caller's default
 * blend of similarity and metadata. Each probe then also finds its exact top 10 by that
 * score, and the positions of those in the candidate order set the depth of searches that
 * pass a score function (at least the similarity depth, at most the ANN limit). shape NULL:
 * vindex_calibrate. The native engine only (a FAISS index measures similarity ranking). */
int vindex_calibrate_scored(vindex *vi, size_t probes, double target, const vindex_query *shape,
                            vindex_recall *out);

/* vindex_recall_steady tells whether the calibration's samples are all of the index as it is:
 * a measured estimate, and a whole ring of probes (VINDEX_STEADY_PROBES) run since the
 * stored vectors last changed (an add, a remove, a rebuild). More probes of a steady index
 * add nothing but what time changes in a blended score (recency, access counts): a monitor
 * may probe it far less often. Any thread. */
#define VINDEX_STEADY_PROBES 205 /* CAL_RING / CAL_K, rounded up */
bool vindex_recall_steady(vindex *vi);

/* vindex_maintenance_scored is vindex_maintenance whose rebuild measures its new codes for
 * target with shape (a blended ranking, as vindex_calibrate_scored; NULL: similarity only)
 * before they answer. */
int vindex_maintenance_scored(vindex *vi, double target, const vindex_query *shape);

/* vindex_settle finishes a bulk build (an index filled by many adds, before its first
 * search): it rebuilds when due (the sign codes' centre of the first ann_min vectors is stale
 * after many more; tombstones; a kind change) and, on the ANN kind, measures codes not yet
 * measured (vindex_calibrate_scored with CAL_BUILD_PROBES probes), in the caller's time, so
 * that searches start at the measured depth. No FAISS build. Returns 1 when it rebuilt or
 * measured, 0 when nothing was due, -ENOMEM. Any thread; blocks maintenance meanwhile. */
int vindex_settle(vindex *vi, double target, const vindex_query *shape);

/* vindex_settle_due tells whether vindex_settle has work that searches would otherwise
 * pay for: ANN codes no measurement covers (searches scan exactly until one does), or a
 * centre gone stale (the index doubled since its sign codes' centre was taken). Compaction
 * alone is not counted: vindex_maintenance does it in the background. Any thread. */
bool vindex_settle_due(vindex *vi);

/* vindex_get_recall fills *out with what the last completed calibration found (no probe
 * runs; it never waits for a calibration in progress). */
void vindex_get_recall(vindex *vi, vindex_recall *out);

/* ---- snapshots ----
 *
 * File format (version 5), little-endian, fields at fixed offsets:
 *   0  magic "ENGVIDX\0"         8 bytes
 *   8  u32 format version (5)    12 u32 header size (128)
 *   16 u64 dim                   24 u64 meta_size
 *   32 u64 slots (stored: live and tombstoned)   40 u64 seq (the caller's change number)
 *   48 u32 kind (which code sections follow)     52 u32 byte-order mark 0x01020304
 *   56 u64 checksum: XXH64 (seed 0) of the whole file with these 8 bytes zero
 *   64 u64 sq8 code stride       72 u64 sign-code words per vector
 *   80 u64 length of the caller's extra bytes     88 u64 live vectors
 *   96 u64 offset of the rows    104 u64 length of the rows (bytes)
 *   112 u64 length of the calibration section     120 u64 length of the FAISS section
 * then, in order: ids (slots u64), tombstones ((slots + 63) / 64 u64, bit s of word s / 64),
 * metadata (slots * meta_size bytes), if kind >= SQ8: steps (slots f32), errors along the
 * centre (slots f32), error norms (slots f32), codes (slots * stride int8), all of the row
 * rotated around the centre (vindex_store.c), if kind == ANN: sign codes (slots * words u64),
 * the centre they are taken around (dim f32) and the live count it was computed from (u64);
 * the calibration (the recall monitor's samples of these codes and the depth they set; see
 * vindex_cal.c), the FAISS engine's section (u64 bytes, u64 labels, the bytes, u32 slot per
 * label, u64 where the tail starts; zeros without an engine index), zeros up to the rows'
 * offset, the float rows (slots * dim f32 in slot order; when kind >= SQ8 the offset is a
 * multiple of 4096 and the rows are padded with zeros to whole chunks, so that a load can map
 * them), then the extra bytes. The file is exactly that long. Every slot is stored, so a
 * mapped row and its codes keep their slot. Format 4 (the same without the errors along the
 * centre, its int8 codes of the unrotated row, its sign codes of 257 to 448 dimensions
 * widened to 8 words) loads: its rows, ids, metadata, centre and tombstones are kept, every
 * code is taken anew and an ANN index measured again (24 probes) in the load's time. Files
 * of earlier versions are refused (VINDEX_E_MISMATCH): the caller rebuilds from its own data
 * once.
 */

/* vindex_save writes the live vectors, metadata and codes to path atomically: a temporary
 * file in the same directory, fsync, rename over path, fsync of the directory. seq is
 * stored in the header: it must be a number such that every change up to seq was applied
 * to the index before the call (changes applied concurrently with the call may or may not
 * be in the snapshot, so replaying changes after seq on load must be idempotent, as
 * upserts and deletes by seq are). Neither searches nor writers wait for the file I/O
 * (writers wait for one copy of the metadata). From the SQ8 kind on (and unless heap_rows),
 * the index then reads its float rows from the new file, mapped, and frees their heap
 * copies (a short exclusive lock). Returns 0 or -errno (the previous file at path, if any,
 * is untouched on error). */
int vindex_save(vindex *vi, const char *path, uint64_t seq);

/* vindex_save_extra is vindex_save that also stores extra_len bytes of the caller's (under
 * the same checksum), e.g. data the metadata refers to. extra may be NULL when extra_len
 * is 0. */
int vindex_save_extra(vindex *vi, const char *path, uint64_t seq, const void *extra,
                      size_t extra_len);

/* vindex_load reads a snapshot written by vindex_save into a new index created with opts
 * (dim and meta_size must match the file) and stores it in *out and its seq in *seq.
 * Verifies the magic, version, sizes, length and checksum (the rows included, read
 * through their mapping) before trusting anything. Returns 0, VINDEX_E_NOT_FOUND (no file),
 * VINDEX_E_CORRUPT (short, truncated, corrupt or not a snapshot), VINDEX_E_MISMATCH (another
 * dim, meta_size or format version), -ENOMEM, -EINVAL (invalid opts) or another -errno from
 * reading. The codes in the file are used when the kind opts call for matches or is below
 * it; missing ones are computed (and measured again). From the SQ8 kind on the float rows
 * stay in the file, mapped (see Memory); the file may be replaced or removed meanwhile (the
 * mapping keeps its data), but must not be written to or truncated in place. */
int vindex_load(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq);

/* vindex_load_extra is vindex_load that also returns the extra bytes saved with the
 * snapshot: *extra (malloc'd, the caller frees it; NULL when there are none) and
 * *extra_len. extra may be NULL to discard them. */
int vindex_load_extra(const char *path, const vindex_opts *opts, vindex **out, uint64_t *seq,
                      void **extra, size_t *extra_len);

#endif
