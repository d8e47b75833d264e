/* bench/dataset.h: the benchmark's memories, queries and exact ground truth, on several
 * distributions of embeddings.
 *
 * Kinds (bench/README.md says how each is made and quotes their measured mean pairwise
 * cosine):
 *   gaussian     x = W z + 0.3 e, z ~ N(0, I_32), e ~ N(0, I_D), W a fixed D x 32 Gaussian
 *                matrix scaled by 1/sqrt(32): low intrinsic dimension, centred (i.i.d. random
 *                vectors make nearest-neighbour questions meaningless).
 *   anisotropic  the same plus a dominant shared direction (as ada-002-style embeddings):
 *                mean pairwise cosine about 0.7.
 *   spectral     the gaussian vectors with coordinate j scaled by 1 / (1 + j / 16): the
 *                variance sits in the first few dimensions, as in PCA- or SVD-reduced
 *                embeddings (a decaying spectrum; centred).
 *   relu         max(0, W z + 0.3 e + b): non-negative features, most of them non-zero, so
 *                every vector lies in one orthant (mean pairwise cosine high).
 *   clustered    a few hundred tight topics: centre + small structured noise, topic sizes
 *                skewed; a few memories are exact or near duplicates of earlier ones.
 *   text         real sentences embedded by a fastText model trained here
 *                (bench/text-dataset.sh); read from files, 384 dimensions natively.
 * Every row is L2-normalized. The synthetic kinds depend on the seed and the dimension
 * only; memory i of tenant t comes from a generator seeded by (seed, kind, t, i), so any
 * memory can be regenerated alone, in any order, and a second run with the same seed stores
 * exactly the same data, on any CPU (no BLAS in the generator). Queries come from the
 * same distribution through a separate stream: they are never stored vectors. For text,
 * memory i is row i of the file (every tenant the same, rows past the end repeating from the
 * start) and query i is held-out sentence i.
 *
 * Content is text too, so full-text search has something to match: "bench memory #<i>
 * t<t>: " followed by words drawn with a skewed distribution from a fixed vocabulary of
 * pronounceable pseudo-words (for text: the sentence itself). The "#<i>" lets a search
 * result name the memory it is.
 *
 * Nothing here is thread-safe beyond the dataset being read-only after it is created.
 */
#ifndef ENGRAM_BENCH_DATASET_H
#define ENGRAM_BENCH_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DATASET_LATENT 32
#define DATASET_NOISE 0.3
#define DATASET_CONTENT_MAX 256
/* The environment variable naming the text data set's directory. */
#define DATASET_TEXT_ENV "ENGRAM_TEXT_DATASET"
/* dataset_open and dataset_load_text: the text files are missing or malformed (err says). */
#define DATASET_E_TEXT 1

typedef enum dataset_kind {
    DATASET_GAUSSIAN,
    DATASET_ANISOTROPIC,
    DATASET_SPECTRAL,
    DATASET_RELU,
    DATASET_CLUSTERED,
    DATASET_TEXT,
    DATASET_NKINDS,
} dataset_kind;

typedef struct dataset dataset;

/* dataset_kind_name returns the kind's name ("gaussian", ...), or "?" for no kind. */
const char *dataset_kind_name(dataset_kind kind);

/* dataset_kind_parse sets *kind to the kind named name. Returns 0 or -EINVAL. */
int dataset_kind_parse(const char *name, dataset_kind *kind);

/* dataset_create returns the synthetic data set of (kind, seed, dim), or NULL when out of
 * memory, dim is 0 or kind is DATASET_TEXT (see dataset_load_text). Free with
 * dataset_destroy. */
dataset *dataset_create(dataset_kind kind, uint64_t seed, size_t dim);

/* dataset_load_text reads the text data set that bench/text-dataset.sh wrote into dir (NULL:
 * the directory named by $ENGRAM_TEXT_DATASET): dataset.json, vectors.f32, queries.f32 and,
 * when present, sentences.txt. seed only drives the full-text queries. On success sets *out
 * (free with dataset_destroy) and returns 0; returns DATASET_E_TEXT with a message in err
 * (errlen bytes) when the files are missing or malformed, or -ENOMEM. */
int dataset_load_text(const char *dir, uint64_t seed, dataset **out, char *err, size_t errlen);

/* dataset_open makes the data set named name: a synthetic kind of (seed, dim), or the text
 * data set (at its own dimension, whatever dim says; its directory from text_dir, or when
 * that is NULL from $ENGRAM_TEXT_DATASET). Returns 0 and sets *out, -EINVAL with a message
 * for an unknown name or dim 0, DATASET_E_TEXT as dataset_load_text, or -ENOMEM. */
int dataset_open(const char *name, uint64_t seed, size_t dim, const char *text_dir, dataset **out,
                 char *err, size_t errlen);

/* dataset_destroy frees ds; NULL is a no-op. */
void dataset_destroy(dataset *ds);

/* dataset_dim returns the dimension. */
size_t dataset_dim(const dataset *ds);

/* dataset_get_kind returns the kind. */
dataset_kind dataset_get_kind(const dataset *ds);

/* dataset_size returns how many distinct memories (per tenant) the data set has: the rows
 * of the text file, SIZE_MAX for a synthetic kind. dataset_query_size is the same for
 * queries. */
size_t dataset_size(const dataset *ds);
size_t dataset_query_size(const dataset *ds);

/* dataset_vectors writes memories first .. first + n - 1 of tenant t, n rows of dim floats,
 * into out (caller-owned). Returns 0 or -ENOMEM. */
int dataset_vectors(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out);

/* dataset_queries writes queries first .. first + n - 1 of tenant t into out, as
 * dataset_vectors does. Returns 0 or -ENOMEM. */
int dataset_queries(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out);

/* dataset_content writes the content of memory i of tenant t into buf (NUL-terminated, at
 * most DATASET_CONTENT_MAX bytes with the NUL) and returns its length. */
size_t dataset_content(const dataset *ds, uint64_t t, uint64_t i, char *buf);

/* dataset_text_query writes a full-text query (two words) drawn with *rng into buf (at least
 * 64 bytes) and returns its length. */
size_t dataset_text_query(const dataset *ds, uint64_t *rng, char *buf);

/* dataset_parse_index finds "#<digits>" in the n bytes at s and sets *i to the number.
 * Returns the number of bytes consumed up to the end of the digits, or 0 when there is
 * none. */
size_t dataset_parse_index(const char *s, size_t n, uint64_t *i);

/* dataset_mean_cosine returns the mean cosine similarity over all pairs of distinct rows of
 * the n x dim L2-normalized rows (only read), computed exactly in double from the sum of the
 * rows: (|sum|^2 - sum |x_i|^2) / (n (n - 1)). 0 when n < 2. */
double dataset_mean_cosine(const float *rows, size_t n, size_t dim);

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
