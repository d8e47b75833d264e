/* bench/dataset.c: synthetic structured vectors, content and exact ground truth (see
 * dataset.h). */
#include "dataset.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 1024
#define WORD_MAX 16
#define CONTENT_WORDS 10
#define TRUTH_BASE_BLOCK 4096
#define TRUTH_QUERY_BLOCK 1024

/* Distinct streams of the per-row generators. */
enum { STREAM_W = 1, STREAM_MEMORY, STREAM_QUERY, STREAM_CONTENT, STREAM_VOCAB };

struct dataset {
    uint64_t seed;
    size_t dim;
    float *w; /* dim x DATASET_LATENT, row-major */
    char vocab[VOCAB][WORD_MAX];
};

uint64_t dataset_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double dataset_rng_uniform(uint64_t *s)
{
    return ((double)(dataset_rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

uint64_t dataset_seed_mix(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a;
    uint64_t h = dataset_rng_next(&s);
    s = h ^ (b * 0xd1b54a32d192ed03ULL);
    h = dataset_rng_next(&s);
    s = h ^ (c * 0x8cb92ba72f3d8dd7ULL);
    return dataset_rng_next(&s);
}

/* Fills out[0..n) with standard normal values (Box-Muller, two per pair of uniforms). */
static void gauss_fill(uint64_t *s, float *out, size_t n)
{
    size_t i = 0;
    while (i < n) {
        double u1 = dataset_rng_uniform(s), u2 = dataset_rng_uniform(s);
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        out[i++] = (float)(r * cos(a));
        if (i < n)
            out[i++] = (float)(r * sin(a));
    }
}

static uint64_t stream_seed(const dataset *ds, int stream, uint64_t t, uint64_t i)
{
    return dataset_seed_mix(ds->seed ^ ((uint64_t)stream << 56) ^ ((uint64_t)ds->dim << 40), t, i);
}

dataset *dataset_create(uint64_t seed, size_t dim)
{
    if (dim == 0)
        return NULL;
    dataset *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return NULL;
    ds->seed = seed;
    ds->dim = dim;
    ds->w = malloc(dim * DATASET_LATENT * sizeof(float));
    if (!ds->w) {
        free(ds);
        return NULL;
    }
    uint64_t s = stream_seed(ds, STREAM_W, 0, 0);
    gauss_fill(&s, ds->w, dim * DATASET_LATENT);
    float scale = 1.0f / sqrtf((float)DATASET_LATENT);
    for (size_t j = 0; j < dim * DATASET_LATENT; j++)
        ds->w[j] *= scale;

    /* pronounceable pseudo-words: 2 to 4 consonant-vowel syllables, made distinct by a
     * suffix letter pair so the vocabulary has exactly VOCAB words */
    static const char cons[] = "bdfgklmnprstvz";
    static const char vow[] = "aeiou";
    s = dataset_seed_mix(seed, STREAM_VOCAB, 0);
    for (size_t v = 0; v < VOCAB; v++) {
        char *wd = ds->vocab[v];
        size_t len = 0;
        int syl = 2 + (int)(dataset_rng_next(&s) % 3);
        for (int k = 0; k < syl; k++) {
            wd[len++] = cons[dataset_rng_next(&s) % (sizeof(cons) - 1)];
            wd[len++] = vow[dataset_rng_next(&s) % (sizeof(vow) - 1)];
        }
        wd[len++] = (char)('a' + v % 26);
        wd[len++] = (char)('a' + v / 26 % 26);
        wd[len] = '\0';
    }
    return ds;
}

void dataset_destroy(dataset *ds)
{
    if (!ds)
        return;
    free(ds->w);
    free(ds);
}

size_t dataset_dim(const dataset *ds)
{
    return ds->dim;
}

/* Rows first.. of a stream: noise and latent from each row's own generator, then the
 * W z part for all rows at once with sgemm, then normalization. */
static int gen_rows(const dataset *ds, int stream, uint64_t t, uint64_t first, size_t n, float *out)
{
    size_t dim = ds->dim;
    if (n == 0)
        return 0;
    float *z = calloc(n * DATASET_LATENT, sizeof(float));
    if (!z)
        return -ENOMEM;
    for (size_t r = 0; r < n; r++) {
        uint64_t s = stream_seed(ds, stream, t, first + r);
        gauss_fill(&s, z + r * DATASET_LATENT, DATASET_LATENT);
        float *row = out + r * dim;
        gauss_fill(&s, row, dim);
        for (size_t j = 0; j < dim; j++)
            row[j] *= (float)DATASET_NOISE;
    }
    /* out (n x dim) += z (n x 32) * W^T (32 x dim) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)dim, DATASET_LATENT, 1.0f, z,
                DATASET_LATENT, ds->w, DATASET_LATENT, 1.0f, out, (int)dim);
    free(z);
    for (size_t r = 0; r < n; r++) {
        float *row = out + r * dim;
        double ss = 0;
        for (size_t j = 0; j < dim; j++)
            ss += (double)row[j] * row[j];
        float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (size_t j = 0; j < dim; j++)
            row[j] *= inv;
    }
    return 0;
}

int dataset_vectors(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out)
{
    return gen_rows(ds, STREAM_MEMORY, t, first, n, out);
}

int dataset_queries(const dataset *ds, uint64_t t, uint64_t first, size_t n, float *out)
{
    return gen_rows(ds, STREAM_QUERY, t, first, n, out);
}

/* A vocabulary index skewed towards the first words (density 1 / (2 sqrt(x))), so some
 * words are common and two-word queries find matches. */
static size_t skewed_word(uint64_t *s)
{
    double u = dataset_rng_uniform(s);
    size_t v = (size_t)(u * u * VOCAB);
    return v < VOCAB ? v : VOCAB - 1;
}

size_t dataset_content(const dataset *ds, uint64_t t, uint64_t i, char *buf)
{
    uint64_t s = stream_seed(ds, STREAM_CONTENT, t, i);
    int len = snprintf(buf, DATASET_CONTENT_MAX, "bench memory #%llu t%llu:", (unsigned long long)i,
                       (unsigned long long)t);
    size_t n = len > 0 ? (size_t)len : 0;
    for (int k = 0; k < CONTENT_WORDS; k++) {
        const char *wd = ds->vocab[skewed_word(&s)];
        size_t wl = strlen(wd);
        if (n + 1 + wl + 1 > DATASET_CONTENT_MAX)
            break;
        buf[n++] = ' ';
        memcpy(buf + n, wd, wl);
        n += wl;
    }
    buf[n] = '\0';
    return n;
}

size_t dataset_text_query(const dataset *ds, uint64_t *rng, char *buf)
{
    const char *a = ds->vocab[skewed_word(rng)];
    const char *b = ds->vocab[skewed_word(rng)];
    int len = snprintf(buf, 64, "%s %s", a, b);
    return len > 0 ? (size_t)len : 0;
}

size_t dataset_parse_index(const char *s, size_t n, uint64_t *i)
{
    for (size_t p = 0; p + 1 < n; p++) {
        if (s[p] != '#' || s[p + 1] < '0' || s[p + 1] > '9')
            continue;
        uint64_t v = 0;
        size_t q = p + 1;
        while (q < n && s[q] >= '0' && s[q] <= '9')
            v = v * 10 + (uint64_t)(s[q++] - '0');
        *i = v;
        return q;
    }
    return 0;
}

float dataset_dot(const float *a, const float *b, size_t dim)
{
    float s = 0;
    for (size_t j = 0; j < dim; j++)
        s += a[j] * b[j];
    return s;
}

/* Inserts (sim, idx) into the sorted (descending) top-k list of one query if it belongs. */
static void topk_offer(float *sims, uint32_t *idx, size_t k, float sim, uint32_t id)
{
    if (sim <= sims[k - 1])
        return;
    size_t p = k - 1;
    while (p > 0 && sims[p - 1] < sim) {
        sims[p] = sims[p - 1];
        idx[p] = idx[p - 1];
        p--;
    }
    sims[p] = sim;
    idx[p] = id;
}

int dataset_truth_init(dataset_truth *tr, const dataset *ds, uint64_t t, size_t n, const float *q,
                       size_t nq, size_t k, const float *base)
{
    memset(tr, 0, sizeof(*tr));
    if (k == 0 || k > n)
        return -EINVAL;
    size_t dim = ds->dim;
    float *block = NULL, *c = NULL;
    tr->idx = malloc(nq * k * sizeof(uint32_t));
    tr->sim = malloc(nq * k * sizeof(float));
    size_t qb = nq < TRUTH_QUERY_BLOCK ? nq : TRUTH_QUERY_BLOCK;
    c = malloc((qb ? qb : 1) * TRUTH_BASE_BLOCK * sizeof(float));
    if (!base)
        block = malloc(TRUTH_BASE_BLOCK * dim * sizeof(float));
    if (!tr->idx || !tr->sim || !c || (!base && !block))
        goto fail;
    for (size_t j = 0; j < nq * k; j++) {
        tr->sim[j] = -INFINITY;
        tr->idx[j] = UINT32_MAX;
    }
    for (size_t b0 = 0; b0 < n; b0 += TRUTH_BASE_BLOCK) {
        size_t nb = n - b0 < TRUTH_BASE_BLOCK ? n - b0 : TRUTH_BASE_BLOCK;
        const float *rows = base ? base + b0 * dim : block;
        if (!base && dataset_vectors(ds, t, b0, nb, block) != 0)
            goto fail;
        for (size_t q0 = 0; q0 < nq; q0 += qb) {
            size_t nqq = nq - q0 < qb ? nq - q0 : qb;
            /* c (nqq x nb) = queries (nqq x dim) * rows^T (dim x nb) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nqq, (int)nb, (int)dim, 1.0f,
                        q + q0 * dim, (int)dim, rows, (int)dim, 0.0f, c, (int)nb);
            for (size_t a = 0; a < nqq; a++) {
                float *sims = tr->sim + (q0 + a) * k;
                uint32_t *ids = tr->idx + (q0 + a) * k;
                const float *crow = c + a * nb;
                for (size_t r = 0; r < nb; r++)
                    topk_offer(sims, ids, k, crow[r], (uint32_t)(b0 + r));
            }
        }
    }
    tr->nq = nq;
    tr->k = k;
    free(block);
    free(c);
    return 0;
fail:
    free(block);
    free(c);
    dataset_truth_fini(tr);
    return -ENOMEM;
}

void dataset_truth_fini(dataset_truth *tr)
{
    free(tr->idx);
    free(tr->sim);
    memset(tr, 0, sizeof(*tr));
}
