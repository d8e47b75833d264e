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

int dedupe_pairs(const float *vecs, size_t n, size_t dim, float threshold, const dedupe_opts *opts,
                 dedupe_pair **out, size_t *nout, char *err, size_t errlen)
{
    dedupe_opts o = {.exact_max = 8192, .nprobe = 8, .threads = 1};
    if (opts) {
        if (opts->exact_max)
            o.exact_max = opts->exact_max;
        if (opts->nprobe)
            o.nprobe = opts->nprobe;
        if (opts->threads)
            o.threads = opts->threads;
    }
    *out = NULL;
    *nout = 0;
    if (n < 2)
        return 0;
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads((int)o.threads);
    FaissIndex *idx = NULL;
    FaissRangeSearchResult *res = NULL;
    pair_buf b = {0};
    int rc = 0;
    char desc[64];
    bool ivf = n > o.exact_max;
    size_t nlist = (size_t)sqrt((double)n);
    if (ivf)
        snprintf(desc, sizeof(desc), "IVF%zu,Flat", nlist);
    else
        snprintf(desc, sizeof(desc), "Flat");
    if (faiss_index_factory(&idx, (int)dim, desc, METRIC_INNER_PRODUCT)) {
        rc = faiss_fail(err, errlen, "index_factory");
        goto out;
    }
    if (ivf) {
        if (faiss_Index_train(idx, (idx_t)n, vecs)) {
            rc = faiss_fail(err, errlen, "IVF training");
            goto out;
        }
        FaissIndexIVF *iv = faiss_IndexIVF_cast(idx);
        if (iv)
            faiss_IndexIVF_set_nprobe(iv, o.nprobe < nlist ? o.nprobe : nlist);
    }
    if (faiss_Index_add(idx, (idx_t)n, vecs)) {
        rc = faiss_fail(err, errlen, "add");
        goto out;
    }
    /* FAISS keeps results with inner product strictly above the radius */
    float radius = nextafterf(threshold, -INFINITY);
    for (size_t q0 = 0; q0 < n; q0 += QUERY_CHUNK) {
        size_t nq = n - q0 < QUERY_CHUNK ? n - q0 : QUERY_CHUNK;
        if (faiss_RangeSearchResult_new(&res, (idx_t)nq)) {
            rc = -ENOMEM;
            goto out;
        }
        if (faiss_Index_range_search(idx, (idx_t)nq, vecs + q0 * dim, radius, res)) {
            rc = faiss_fail(err, errlen, "range search");
            goto out;
        }
        size_t *lims;
        idx_t *labels;
        float *dist;
        faiss_RangeSearchResult_lims(res, &lims);
        faiss_RangeSearchResult_labels(res, &labels, &dist);
        for (size_t q = 0; q < nq; q++) {
            uint32_t i = (uint32_t)(q0 + q);
            for (size_t k = lims[q]; k < lims[q + 1]; k++) {
                uint32_t j = (uint32_t)labels[k];
                if (labels[k] < 0 || j == i || dist[k] < threshold)
                    continue;
                /* an exact search finds each pair from both ends: keep (i, j) with i < j. An
                 * IVF search may find it from one end only: keep both, deduplicated below */
                if (!ivf && j < i)
                    continue;
                if (push(&b, i < j ? i : j, i < j ? j : i, dist[k]) < 0) {
                    rc = -ENOMEM;
                    goto out;
                }
            }
        }
        faiss_RangeSearchResult_free(res);
        res = NULL;
    }
    qsort(b.p, b.n, sizeof(*b.p), cmp_pair);
    size_t w = 0;
    for (size_t k = 0; k < b.n; k++)
        if (w == 0 || b.p[w - 1].i != b.p[k].i || b.p[w - 1].j != b.p[k].j)
            b.p[w++] = b.p[k];
    b.n = w;
    *out = b.p;
    *nout = b.n;
    b.p = NULL;
out:
    if (res)
        faiss_RangeSearchResult_free(res);
    if (idx)
        faiss_Index_free(idx);
    free(b.p);
    omp_set_num_threads(saved_threads);
    return rc;
}
