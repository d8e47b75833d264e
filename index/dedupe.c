/* index/dedupe.c: near-duplicate pairs with a FAISS range search (see dedupe.h). */
#include "dedupe.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Clustering_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/impl/AuxIndexStructures_c.h>
#include <faiss/c_api/index_factory_c.h>

#define QUERY_CHUNK 4096

typedef struct pair_buf {
    dedupe_pair *p;
    size_t n, cap;
} pair_buf;

static int push(pair_buf *b, uint32_t i, uint32_t j, float sim)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        dedupe_pair *p = realloc(b->p, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = (dedupe_pair){.i = i, .j = j, .sim = sim};
    return 0;
}

static int cmp_pair(const void *a, const void *b)
{
    const dedupe_pair *x = a, *y = b;
    if (x->i != y->i)
        return x->i < y->i ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

static int faiss_fail(char *err, size_t errlen, const char *what)
{
    const char *m = faiss_get_last_error();
    snprintf(err, errlen, "%s: %s", what, m ? m : "FAISS error");
    return -EIO;
}

/* Every pair of the m vectors listed in idx (indices into vecs) with inner product at least
 * threshold, found by an exact FAISS range search (BLAS); pairs are pushed as original
 * indices (smaller first). */
static int pairs_exact(const float *vecs, size_t dim, const uint32_t *idx, size_t m,
                       float threshold, pair_buf *b, char *err, size_t errlen)
{
    if (m < 2)
        return 0;
    float *g = malloc(m * dim * sizeof(float));
    FaissIndex *fi = NULL;
    FaissRangeSearchResult *res = NULL;
    int rc = 0;
    if (!g)
        return -ENOMEM;
    for (size_t k = 0; k < m; k++)
        memcpy(g + k * dim, vecs + (size_t)idx[k] * dim, dim * sizeof(float));
    if (faiss_index_factory(&fi, (int)dim, "Flat", METRIC_INNER_PRODUCT) ||
        faiss_Index_add(fi, (idx_t)m, g)) {
        rc = faiss_fail(err, errlen, "flat index");
        goto out;
    }
    /* FAISS keeps results with inner product strictly above the radius */
    float radius = nextafterf(threshold, -INFINITY);
    for (size_t q0 = 0; q0 < m; q0 += QUERY_CHUNK) {
        size_t nq = m - q0 < QUERY_CHUNK ? m - q0 : QUERY_CHUNK;
        if (faiss_RangeSearchResult_new(&res, (idx_t)nq)) {
            rc = -ENOMEM;
            goto out;
        }
        if (faiss_Index_range_search(fi, (idx_t)nq, g + q0 * dim, radius, res)) {
            rc = faiss_fail(err, errlen, "range search");
            goto out;
        }
        size_t *lims;
        idx_t *labels;
        float *dist;
        faiss_RangeSearchResult_lims(res, &lims);
        faiss_RangeSearchResult_labels(res, &labels, &dist);
        for (size_t q = 0; q < nq; q++) {
            size_t a = q0 + q;
            for (size_t k = lims[q]; k < lims[q + 1]; k++) {
                /* each pair is found from both ends: keep it from the smaller one */
                if (labels[k] < 0 || (size_t)labels[k] <= a || dist[k] < threshold)
                    continue;
                uint32_t i = idx[a], j = idx[labels[k]];
                if (push(b, i < j ? i : j, i < j ? j : i, dist[k]) < 0) {
                    rc = -ENOMEM;
                    goto out;
                }
            }
        }
        faiss_RangeSearchResult_free(res);
        res = NULL;
    }
out:
    if (res)
        faiss_RangeSearchResult_free(res);
    if (fi)
        faiss_Index_free(fi);
    free(g);
    return rc;
}

#define BUCKET_TARGET 512 /* vectors per k-means cell */
#define ASSIGN 2          /* cells each vector joins: its nearest ones */
#define TRAIN_PER_CELL 40 /* k-means sample per cell (FAISS asks for 39 or more) */

/* Pairs among the m vectors of idx: exact when m <= exact_max; otherwise k-means cells of
 * about BUCKET_TARGET vectors, each vector in its ASSIGN nearest cells, and the pairs of
 * every cell (recursively). */
static int pairs_of(const float *vecs, size_t dim, const uint32_t *idx, size_t m, float threshold,
                    const dedupe_opts *o, int depth, pair_buf *b, char *err, size_t errlen)
{
    if (m <= o->exact_max || depth > 3)
        return pairs_exact(vecs, dim, idx, m, threshold, b, err, errlen);
    size_t cells = (m + BUCKET_TARGET - 1) / BUCKET_TARGET;
    size_t ntrain = cells * TRAIN_PER_CELL < m ? cells * TRAIN_PER_CELL : m;
    float *train = malloc(ntrain * dim * sizeof(float));
    float *cent = malloc(cells * dim * sizeof(float));
    idx_t *lab = malloc(m * ASSIGN * sizeof(idx_t));
    float *dis = malloc(m * ASSIGN * sizeof(float));
    float *g = malloc(m * dim * sizeof(float));
    size_t *count = calloc(cells + 1, sizeof(size_t));
    uint32_t *members = malloc(m * ASSIGN * sizeof(uint32_t));
    FaissIndex *q = NULL;
    int rc = 0;
    if (!train || !cent || !lab || !dis || !g || !count || !members) {
        rc = -ENOMEM;
        goto out;
    }
    /* an evenly spaced sample trains the cells: deterministic for the same input */
    for (size_t k = 0; k < ntrain; k++)
        memcpy(train + k * dim, vecs + (size_t)idx[k * m / ntrain] * dim, dim * sizeof(float));
    for (size_t k = 0; k < m; k++)
        memcpy(g + k * dim, vecs + (size_t)idx[k] * dim, dim * sizeof(float));
    float qerr;
    if (faiss_kmeans_clustering(dim, ntrain, cells, train, cent, &qerr)) {
        rc = faiss_fail(err, errlen, "k-means");
        goto out;
    }
    if (faiss_index_factory(&q, (int)dim, "Flat", METRIC_L2) ||
        faiss_Index_add(q, (idx_t)cells, cent) ||
        faiss_Index_search(q, (idx_t)m, g, ASSIGN, dis, lab)) {
        rc = faiss_fail(err, errlen, "cell assignment");
        goto out;
    }
    /* counting sort of the memberships into cells */
    for (size_t k = 0; k < m * ASSIGN; k++)
        if (lab[k] >= 0)
            count[lab[k] + 1]++;
    for (size_t c = 0; c < cells; c++)
        count[c + 1] += count[c];
    {
        size_t *at = malloc((cells + 1) * sizeof(size_t));
        if (!at) {
            rc = -ENOMEM;
            goto out;
        }
        memcpy(at, count, (cells + 1) * sizeof(size_t));
        for (size_t k = 0; k < m * ASSIGN; k++)
            if (lab[k] >= 0)
                members[at[lab[k]]++] = idx[k / ASSIGN];
        free(at);
    }
    for (size_t c = 0; c < cells && rc == 0; c++) {
        size_t cn = count[c + 1] - count[c];
        /* a cell that took (nearly) everything would not shrink: compare it exactly */
        if (cn >= m)
            rc = pairs_exact(vecs, dim, members + count[c], cn, threshold, b, err, errlen);
        else
            rc = pairs_of(vecs, dim, members + count[c], cn, threshold, o, depth + 1, b, err,
                          errlen);
    }
out:
    if (q)
        faiss_Index_free(q);
    free(train);
    free(cent);
    free(lab);
    free(dis);
    free(g);
    free(count);
    free(members);
    return rc;
}

int dedupe_pairs(const float *vecs, size_t n, size_t dim, float threshold, const dedupe_opts *opts,
                 dedupe_pair **out, size_t *nout, char *err, size_t errlen)
{
    dedupe_opts o = {.exact_max = 8192, .threads = 1};
    if (opts) {
        if (opts->exact_max)
            o.exact_max = opts->exact_max;
        if (opts->threads)
            o.threads = opts->threads;
    }
    *out = NULL;
    *nout = 0;
    if (n < 2)
        return 0;
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads((int)o.threads);
    pair_buf b = {0};
    uint32_t *idx = malloc(n * sizeof(*idx));
    int rc = idx ? 0 : -ENOMEM;
    for (size_t i = 0; idx && i < n; i++)
        idx[i] = (uint32_t)i;
    if (rc == 0)
        rc = pairs_of(vecs, dim, idx, n, threshold, &o, 0, &b, err, errlen);
    free(idx);
    omp_set_num_threads(saved_threads);
    if (rc < 0) {
        free(b.p);
        return rc;
    }
    /* a pair that shares two cells is found twice */
    if (b.n > 1)
        qsort(b.p, b.n, sizeof(*b.p), cmp_pair);
    size_t w = 0;
    for (size_t k = 0; k < b.n; k++)
        if (w == 0 || b.p[w - 1].i != b.p[k].i || b.p[w - 1].j != b.p[k].j)
            b.p[w++] = b.p[k];
    *out = b.p;
    *nout = w;
    return 0;
}
