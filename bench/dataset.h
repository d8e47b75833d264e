/* bench/dataset.h: the benchmark's synthetic memories, queries and exact ground truth.
 *
 * Vectors have the low intrinsic dimension of real embeddings (i.i.d. random vectors make
 * nearest-neighbour questions meaningless): x = W z + 0.3 e, z ~ N(0, I_32), e ~ N(0, I_D),
 * W a fixed D x 32 Gaussian matrix scaled by 1/sqrt(32), each row then L2-normalized. W
 * depends on the seed and the dimension only; z and e of memory i of tenant t come from a
 * generator seeded by (seed, t, i), so any memory can be regenerated alone, in any order,
 * and a second run with the same seed stores exactly the same data. Queries come from the
 * same distribution through a separate stream: they are not copies of stored vectors.
 *
 * Content is text too, so full-text search has something to match: "bench memory #<i>
 * t<t>: " followed by words drawn with a skewed distribution from a fixed vocabulary of
 * pronounceable pseudo-words. The "#<i>" lets a search result name the memory it is.
 *
 * Nothing here is thread-safe beyond the dataset being read-only after dataset_create.
 */
#ifndef ENGRAM_BENCH_DATASET_H
#define ENGRAM_BENCH_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DATASET_LATENT 32
#define DATASET_NOISE 0.3
#define DATASET_CONTENT_MAX 256

typedef struct dataset dataset;

/* dataset_create returns the data set of (seed, dim), or NULL when out of memory or dim is
 * 0. Free with dataset_destroy. */
dataset *dataset_create(uint64_t seed, size_t dim);

/* dataset_destroy frees ds; NULL is a no-op. */
void dataset_destroy(dataset *ds);

/* dataset_dim returns the dimension. */
size_t dataset_dim(const dataset *ds);

/* dataset_vectors writes memories first .. first + n - 1 of tenant t, n rows of dim floats,
 * into out (caller-owned). Returns 0 or -ENOMEM. */
int dataset_vectors(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out);

/* dataset_queries writes queries first .. first + n - 1 of tenant t into out, as
 * dataset_vectors does. Returns 0 or -ENOMEM. */
int dataset_queries(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out);

/* dataset_content writes the content of memory i of tenant t into buf (NUL-terminated, at
 * most DATASET_CONTENT_MAX bytes with the NUL) and returns its length. */
size_t dataset_content(const dataset *ds, uint64_t t, uint64_t i, char *buf);

/* dataset_text_query writes a full-text query (two vocabulary words) drawn with *rng into
 * buf (at least 64 bytes) and returns its length. */
size_t dataset_text_query(const dataset *ds, uint64_t *rng, char *buf);

/* dataset_parse_index finds "#<digits>" in the n bytes at s and sets *i to the number.
 * Returns the number of bytes consumed up to the end of the digits, or 0 when there is
 * none. */
size_t dataset_parse_index(const char *s, size_t n, uint64_t *i);

/* Exact top-k ground truth of nq queries over a tenant's memories. */
typedef struct dataset_truth {
    size_t nq, k;
    uint32_t *idx; /* nq x k memory indexes, best first */
    float *sim;    /* nq x k inner products (cosine similarities), best first */
} dataset_truth;

/* dataset_truth_init computes, by brute force with cblas_sgemm, the k nearest of memories
 * 0 .. n - 1 of tenant t (by inner product: every row is normalized, so cosine) to each of
 * the nq query rows at q (nq x dim, caller-owned, only read). When base is not NULL the
 * memories are read from it (n x dim) instead of being generated. tr is caller-owned;
 * release with dataset_truth_fini. Returns 0, -EINVAL (k 0 or larger than n) or -ENOMEM. */
int dataset_truth_init(dataset_truth *tr, const dataset *ds, uint64_t t, size_t n, const float *q,
                       size_t nq, size_t k, const float *base);

/* dataset_truth_fini frees what tr holds; a zeroed tr is fine. */
void dataset_truth_fini(dataset_truth *tr);

/* dataset_dot returns the inner product of two dim-float vectors. */
float dataset_dot(const float *a, const float *b, size_t dim);

/* dataset_rng_next advances the splitmix64 generator *s and returns 64 random bits. */
uint64_t dataset_rng_next(uint64_t *s);

/* dataset_rng_uniform returns a uniform double in (0, 1) from *s. */
double dataset_rng_uniform(uint64_t *s);

/* dataset_seed_mix hashes a, b and c into one 64-bit generator seed. */
uint64_t dataset_seed_mix(uint64_t a, uint64_t b, uint64_t c);

#endif
