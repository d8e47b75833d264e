/* index/dedupe.h: all pairs of near-duplicate vectors, with FAISS.
 *
 * Consolidation needs every pair of a tenant's memories whose cosine similarity reaches a
 * threshold. Up to exact_max vectors, every vector is a range query against a flat FAISS
 * inner-product index of them all (BLAS: every pair is found). Above that, FAISS k-means
 * splits them into cells of about 512, each vector joins its 2 nearest cells, and the
 * pairs of every cell are found the same way (recursively): a pair is missed only when the
 * two vectors share neither of their 2 nearest cells, which near duplicates practically
 * never do. Deterministic for the same input. Thread-safe; uses `threads` OpenMP threads
 * in the caller's parallel regions only.
 *
 * Library: engram_dedupe (dedupe_dep), apart from the vector index so that only its users
 * (the server's consolidation) link FAISS, OpenBLAS and libstdc++ for it.
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
