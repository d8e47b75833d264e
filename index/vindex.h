/* index/vindex.h: one tenant's vector index: FAISS for vectors and search, plus ids,
 * per-vector metadata and tombstones.
 *
 * Similarity is cosine similarity: vectors are L2-normalized on the way in, and the FAISS
 * index is an inner-product index over them. Each vector carries a caller-defined
 * metadata record of fixed size (vindex_opts.meta_size), so filters and ranking run next
 * to the distances without another lookup. The index is exact with respect to filters:
 * vindex_search returns the best k vectors among those the filter keeps, never fewer when
 * at least k are kept.
 *
 * Thread-safety: every function may be called from any thread. Searches and reads share a
 * lock; adds, removes and metadata updates take it exclusively for a short critical
 * section (no search runs a filter or score callback while a writer holds it).
 */
#ifndef ENGRAM_INDEX_VINDEX_H
#define ENGRAM_INDEX_VINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vindex vindex;

/* Positive result codes (0 success, negative -errno). */
enum {
    VINDEX_E_NOT_FOUND = 1, /* no vector has this id */
    VINDEX_E_EXISTS,        /* a vector with this id is already present */
    VINDEX_E_ZERO,          /* the vector has no direction: zero length, or NaN/infinite */
    VINDEX_E_DIM,           /* the dimension does not match the index */
    VINDEX_E_FAISS,         /* FAISS reported an error (message in err where offered) */
};

typedef struct vindex_opts {
    size_t dim;       /* vector dimension, 1..65536 */
    size_t meta_size; /* bytes of metadata per vector, may be 0 */
} vindex_opts;

/* vindex_create returns an empty index, or NULL when out of memory, when FAISS fails, or
 * when opts are invalid (dim 0 or above 65536, meta_size above 1 MiB).
 * Free with vindex_destroy (NULL is a no-op; no other thread may still use the index). */
vindex *vindex_create(const vindex_opts *opts);
void vindex_destroy(vindex *vi);

/* vindex_dim returns the dimension; vindex_count the number of live vectors. */
size_t vindex_dim(const vindex *vi);
size_t vindex_count(vindex *vi);

/* vindex_bytes returns the memory held (vectors, metadata, maps), for memory budgets. The
 * FAISS storage counts as its estimated capacity: it keeps its capacity after compaction. */
size_t vindex_bytes(vindex *vi);

typedef struct vindex_stats {
    size_t count;       /* live vectors */
    size_t slots;       /* stored vectors, live or tombstoned */
    size_t tombstones;  /* removed vectors not yet compacted away */
    size_t compactions; /* compactions since creation */
    size_t bytes;       /* as vindex_bytes */
} vindex_stats;

/* vindex_get_stats fills *st with one consistent snapshot of the counters above. */
void vindex_get_stats(vindex *vi, vindex_stats *st);

/* vindex_last_error returns the text of the last FAISS error raised on the calling thread
 * (after VINDEX_E_FAISS; valid until the thread's next index call), or NULL. */
const char *vindex_last_error(void);

/* vindex_add adds vec (dim floats, normalized here; the caller's array is not changed) with
 * id and a copy of meta (meta_size bytes; may be NULL when meta_size is 0).
 * Returns 0, VINDEX_E_EXISTS, VINDEX_E_ZERO, -EINVAL for the reserved id UINT64_MAX,
 * -ENOMEM or VINDEX_E_FAISS (the index is unchanged on every error). */
int vindex_add(vindex *vi, uint64_t id, const float *vec, const void *meta);

/* vindex_remove removes the vector with id (a tombstone; space is reclaimed by compaction
 * inside the index, in place, once tombstones pass a quarter of the stored vectors).
 * Returns 0 or VINDEX_E_NOT_FOUND. */
int vindex_remove(vindex *vi, uint64_t id);

/* vindex_contains tells whether id is live in the index. */
bool vindex_contains(vindex *vi, uint64_t id);

/* vindex_get_meta copies the metadata of id into meta_out (meta_size bytes). Returns 0 or
 * VINDEX_E_NOT_FOUND. */
int vindex_get_meta(vindex *vi, uint64_t id, void *meta_out);

/* vindex_set_meta replaces the metadata of id. Returns 0 or VINDEX_E_NOT_FOUND. */
int vindex_set_meta(vindex *vi, uint64_t id, const void *meta);

/* vindex_update_meta calls fn(meta, ctx) on the stored metadata of each of the n ids that
 * are present, under one exclusive lock; fn must be quick and must not call back into the
 * index. Returns the number of ids found. Everywhere metadata is handed to a callback
 * (here, vindex_foreach, keep, score), the pointer is NULL when meta_size is 0. */
size_t vindex_update_meta(vindex *vi, const uint64_t *ids, size_t n,
                          void (*fn)(void *meta, void *ctx), void *ctx);

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
    /* keep: NULL keeps every vector; else called with each candidate's metadata, and only
     * candidates it returns true for can be hits. Must be pure and quick. */
    bool (*keep)(const void *meta, void *ctx);
    /* score: NULL ranks by similarity; else the ranking score of a candidate. Scores must
     * satisfy score <= score_slope * similarity + score_bound (score_slope >= 0), which
     * lets approximate structures stop early without losing exactness of the ranking; the
     * exact scan uses it too, to skip candidates (without calling keep or score) that
     * cannot beat the k-th hit, so a bound that does not hold loses hits. score_slope and
     * score_bound both 0 (a zero-initialized query) declare no bound: nothing is skipped
     * then. A NaN score ranks as -infinity. */
    double (*score)(float similarity, const void *meta, void *ctx);
    double score_slope;
    double score_bound;
    void *ctx;
} vindex_query;

/* vindex_search writes up to q->k hits, best score first (ties: higher similarity, then
 * lower id), into out (caller-owned, q->k entries) and their number into *n.
 * When at least k vectors pass keep, exactly k are returned. Returns 0, VINDEX_E_ZERO for a
 * query vector without direction, or -ENOMEM. The reported similarity of a vector depends
 * only on it and the query (not on where it is stored), so two copies of one vector tie
 * exactly and are ordered by id. Up to 1024 dimensions a search allocates nothing and uses
 * about 8 KiB of stack. */
int vindex_search(vindex *vi, const vindex_query *q, vindex_hit *out, size_t *n);

#endif
