/* index/dedupe.h: all pairs of near-duplicate vectors, with FAISS.
 *
 * Consolidation needs every pair of a tenant's memories whose cosine similarity reaches a
 * threshold. Vectors go into a FAISS inner-product index and every vector is a range
 * query against it: for up to exact_max vectors the index is flat (FAISS computes the
 * similarities with BLAS: every pair is found), above that an IVF index probing nprobe of
 * sqrt(n) lists (the few pairs that straddle two far-apart lists may be missed; near
 * duplicates almost never do). Thread-safe; uses `threads` OpenMP threads in the caller's
 * parallel regions only.
 */
#ifndef ENGRAM_INDEX_DEDUPE_H
#define ENGRAM_INDEX_DEDUPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct dedupe_pair {
    uint32_t i, j; /* i < j, indices into the caller's vectors */
    float sim;
} dedupe_pair;

typedef struct dedupe_opts {
    size_t exact_max; /* largest set searched exactly (flat); default 8192 */
    unsigned nprobe;  /* IVF lists probed per query above exact_max; default 8 */
    unsigned threads; /* OpenMP threads for the search; default 1 */
} dedupe_opts;

/* dedupe_pairs finds every pair i < j of the n vectors (n x dim row-major floats, each
 * L2-normalized by the caller) whose inner product is at least threshold. *out receives a
 * malloc'd array (the caller frees it, NULL when *nout is 0) sorted by (i, j).
 * opts may be NULL for the defaults. Returns 0, -ENOMEM, or -EIO when FAISS fails (with its
 * message in err). */
int dedupe_pairs(const float *vecs, size_t n, size_t dim, float threshold, const dedupe_opts *opts,
                 dedupe_pair **out, size_t *nout, char *err, size_t errlen);

#endif
