/* tests/unit/test_vindex_recall.c: the centred, rotated sign codes and the recall monitor.
 *
 * - vk_rotate is orthogonal: norms and inner products survive it.
 * - On distributions whose raw signs carry no information (non-negative features, a
 *   dominant shared direction, variance in a few dimensions), the ANN search reaches recall
 *   0.99 at the depth the calibration sets, and the estimate agrees with the recall of
 *   held-out queries measured against a brute force.
 * - On data no code can search cheaply (i.i.d. vectors: every neighbour about as far as any
 *   other), the calibration falls back to exact scans and recall is 1.
 * - A snapshot carries the centre: the loaded index answers exactly as the saved one.
 * - New codes are measured before they answer: a rebuild measures them before its swap,
 *   vindex_settle finishes a bulk build, a snapshot carries the measurement, and codes not
 *   measured yet are scanned exactly (so data that defeats the codes is exact from the
 *   first query).
 * - Steady: an index is steady once a whole ring of probes ran on its vectors as they are;
 *   an add, a remove or a rebuild makes it unsteady until as many probes ran again.
 * - The FAISS engine: its index is built by maintenance, answers searches (with the vectors
 *   added since searched exactly), is measured by the same monitor, and survives a
 *   snapshot; a program without the FAISS engine loads that snapshot without its FAISS
 *   section. Built with VINDEX_TEST_FAISS as test_vindex_recall_faiss (linked with
 *   engram_vfaiss); test_vindex_recall runs everything else and links no FAISS.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "vindex.h"
#ifdef VINDEX_TEST_FAISS
#include "vfaiss.h"
#endif
#include "vkernel.h"

#define DIM 128
#define N 6000
#define NQ 100
#define K 10

static uint64_t rs = 0x2545f4914f6cdd1dULL;

static double uni(void)
{
    uint64_t z = (rs += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
    return sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni());
}

enum dist { D_RELU, D_SHARED, D_SPECTRAL, D_IID };
#ifndef VINDEX_TEST_FAISS
static const char *dist_name[] = {"relu", "shared", "spectral", "iid"};
#endif
static float W[16 * DIM], MEAN[DIM];

static void gen(enum dist d, float *x)
{
    float z[16];
    for (int i = 0; i < 16; i++)
        z[i] = (float)gauss();
    for (size_t j = 0; j < DIM; j++) {
        double v = 0.0;
        for (int i = 0; i < 16; i++)
            v += W[i * DIM + j] * z[i];
        switch (d) {
        case D_RELU: /* non-negative: one orthant */
            x[j] = (float)(v > 0 ? v : 0) + 0.01f;
            break;
        case D_SHARED: /* a dominant direction: pairwise cosine about 0.7 */
            x[j] = (float)(0.35 * (v + 0.3 * gauss()) / 4.0 + MEAN[j]);
            break;
        case D_SPECTRAL: /* variance in a few coordinates, plus an offset */
            x[j] = (float)(gauss() / pow(1.0 + (double)j, 1.2) + 0.05);
            break;
        case D_IID:
            x[j] = (float)gauss();
            break;
        }
    }
}

static double dot(const float *a, const float *b)
{
    double s = 0.0;
    for (size_t j = 0; j < DIM; j++)
        s += (double)a[j] * b[j];
    return s;
}

static void normalize(float *x)
{
    double n = sqrt(dot(x, x));
    for (size_t j = 0; j < DIM; j++)
        x[j] = (float)(x[j] / n);
}

#ifndef VINDEX_TEST_FAISS

static void rotation_is_orthogonal(void)
{
    size_t dims[] = {1, 7, 64, 96, 128, 300, 768};
    for (size_t t = 0; t < sizeof(dims) / sizeof(dims[0]); t++) {
        size_t d = dims[t];
        float *s = malloc(VK_ROT_ROUNDS * d * sizeof(float));
        double *a = malloc(d * sizeof(double)), *b = malloc(d * sizeof(double));
        vk_rot_signs(42, d, s);
        double aa = 0, bb = 0, ab = 0;
        for (size_t j = 0; j < d; j++) {
            a[j] = gauss();
            b[j] = gauss();
            aa += a[j] * a[j];
            bb += b[j] * b[j];
            ab += a[j] * b[j];
        }
        vk_rotate(a, d, s);
        vk_rotate(b, d, s);
        double aa2 = 0, bb2 = 0, ab2 = 0;
        for (size_t j = 0; j < d; j++) {
            aa2 += a[j] * a[j];
            bb2 += b[j] * b[j];
            ab2 += a[j] * b[j];
        }
        CHECK_MSG(fabs(aa2 - aa) < 1e-12 * aa && fabs(bb2 - bb) < 1e-12 * bb, "norm at dim %zu", d);
        CHECK_MSG(fabs(ab2 - ab) < 1e-12 * sqrt(aa * bb), "inner product at dim %zu", d);
        /* a rotation spreads one coordinate over many (d >= 64: no coordinate keeps half) */
        if (d >= 64) {
            memset(a, 0, d * sizeof(double));
            a[3] = 1.0;
            vk_rotate(a, d, s);
            double mx = 0;
            for (size_t j = 0; j < d; j++)
                mx = fabs(a[j]) > mx ? fabs(a[j]) : mx;
            CHECK_MSG(mx < 0.5, "dim %zu: a unit vector stays concentrated (%.3f)", d, mx);
        }
        free(s);
        free(a);
        free(b);
    }
}

#endif

static float X[N * DIM], Q[NQ * DIM];

/* brute_topk writes the ids of the K best rows for query qv into bid: by similarity, or by
 * 0.7 similarity + 0.3 VALS[i] when blended. */
static float VALS[N];

static void brute_topk(const float *qv, bool blended, uint64_t *bid)
{
    double best[K];
    size_t nb = 0;
    for (size_t i = 0; i < N; i++) {
        double s = dot(X + i * DIM, qv);
        if (blended)
            s = 0.7 * (float)s + 0.3 * VALS[i];
        if (nb < K) {
            best[nb] = s;
            bid[nb++] = i;
            continue;
        }
        size_t w = 0;
        for (size_t k = 1; k < K; k++)
            w = best[k] < best[w] ? k : w;
        if (s > best[w]) {
            best[w] = s;
            bid[w] = i;
        }
    }
}

/* recall_with measures recall@K of vi's searches for the NQ queries against a brute force
 * (shape: NULL for similarity ranking, else its score function ranks). */
static double recall_with(vindex *vi, const vindex_query *shape)
{
    size_t hits = 0;
    for (int q = 0; q < NQ; q++) {
        const float *qv = Q + (size_t)q * DIM;
        uint64_t bid[K];
        brute_topk(qv, shape != NULL, bid);
        vindex_hit h[K];
        size_t n = 0;
        vindex_query vq = {.vec = qv, .k = K};
        if (shape) {
            vq.score = shape->score;
            vq.score_slope = shape->score_slope;
            vq.score_bound = shape->score_bound;
            vq.score_monotone = shape->score_monotone;
        }
        CHECK(vindex_search(vi, &vq, h, &n) == 0);
        CHECK(n == K);
        for (size_t a = 0; a < n; a++)
            for (size_t b = 0; b < K; b++)
                hits += h[a].id == bid[b];
    }
    return (double)hits / (double)(NQ * K);
}

static double recall_of(vindex *vi)
{
    return recall_with(vi, NULL);
}

#ifndef VINDEX_TEST_FAISS

static vindex *build(enum dist d)
{
    rs = 1000 + (uint64_t)d;
    for (size_t i = 0; i < N; i++) {
        gen(d, X + i * DIM);
        normalize(X + i * DIM);
    }
    for (size_t i = 0; i < NQ; i++) {
        gen(d, Q + i * DIM);
        normalize(Q + i * DIM);
    }
    /* ANN from 2,048 vectors; the depth may reach 1,500 (an exact scan beyond) */
    vindex_opts o = {.dim = DIM, .ann_min = 2048, .ann_candidates = 32, .ann_max_candidates = 1500};
    vindex *vi = vindex_create(&o);
    for (size_t i = 0; i < N; i++)
        CHECK(vindex_add(vi, i, X + i * DIM, NULL) == 0);
    while (vindex_maintenance(vi) > 0)
        ;
    return vi;
}

static void steady(void)
{
    vindex *vi = build(D_RELU);
    CHECK(!vindex_recall_steady(vi)); /* not measured yet */
    CHECK(vindex_calibrate(vi, VINDEX_STEADY_PROBES - 1, 0.99, NULL) == 0);
    CHECK(!vindex_recall_steady(vi));
    CHECK(vindex_calibrate(vi, 1, 0.99, NULL) == 0);
    CHECK(vindex_recall_steady(vi));
    CHECK(vindex_calibrate(vi, 4, 0.99, NULL) == 0);
    CHECK(vindex_recall_steady(vi));
    /* an add: the samples are of other vectors now */
    CHECK(vindex_add(vi, N, X, NULL) == 0);
    CHECK(!vindex_recall_steady(vi));
    CHECK(vindex_calibrate(vi, VINDEX_STEADY_PROBES - 1, 0.99, NULL) == 0);
    CHECK(!vindex_recall_steady(vi));
    CHECK(vindex_calibrate(vi, 1, 0.99, NULL) == 0);
    CHECK(vindex_recall_steady(vi));
    /* a remove */
    CHECK(vindex_remove(vi, 3) == 0);
    CHECK(!vindex_recall_steady(vi));
    CHECK(vindex_calibrate(vi, VINDEX_STEADY_PROBES, 0.99, NULL) == 0);
    CHECK(vindex_recall_steady(vi));
    vindex_destroy(vi);
}

static void distributions(void)
{
    for (enum dist d = D_RELU; d <= D_IID; d++) {
        vindex *vi = build(d);
        vindex_stats st;
        vindex_get_stats(vi, &st);
        CHECK(st.kind == VINDEX_KIND_ANN);
        vindex_recall r;
        vindex_get_recall(vi, &r);
        /* the rebuild that took the centre of all 6,000 measured its codes before the swap */
        CHECK_MSG(!isnan(r.estimate) && r.samples == 240 && (r.depth || r.exact_fallback),
                  "%s: measured by the rebuild (%zu samples)", dist_name[d], r.samples);
        CHECK(vindex_calibrate(vi, 50, 0.99, &r) == 0);
        CHECK(r.samples == 740);
        double measured = recall_of(vi);
        fprintf(stderr, "%-8s recall@10 %.3f, estimate %.3f (ANN path %.3f), depth %zu, exact %d\n",
                dist_name[d], measured, r.estimate, r.ann_estimate, r.depth, r.exact_fallback);
        CHECK_MSG(measured >= 0.985, "%s: recall %.3f", dist_name[d], measured);
        CHECK_MSG(r.estimate >= 0.99, "%s: estimate %.3f", dist_name[d], r.estimate);
        CHECK_MSG(fabs(r.estimate - measured) <= 0.02, "%s: estimate %.3f, measured %.3f",
                  dist_name[d], r.estimate, measured);
        /* the native engine measures synthetic probes only, searches or not */
        CHECK(vindex_calibrate(vi, 10, 0.99, &r) == 0);
        CHECK(r.query_samples == 0);
        if (d == D_IID) {
            /* neighbours are no closer in code than anything else: only an exact scan works */
            CHECK(r.exact_fallback);
            CHECK(r.ann_estimate < 0.99);
            CHECK(measured == 1.0);
        } else {
            CHECK_MSG(!r.exact_fallback, "%s fell back to exact scans", dist_name[d]);
            CHECK(r.depth >= 32 && r.depth <= 1500);
        }
        if (d == D_RELU) {
            /* a snapshot keeps the centre: the same answers after a load */
            char path[] = "/tmp/engram-recall-XXXXXX";
            int fd = mkstemp(path);
            CHECK(fd >= 0);
            close(fd);
            CHECK(vindex_save(vi, path, 7) == 0);
            vindex_opts o = {.dim = DIM, .ann_min = 2048, .ann_candidates = 32};
            vindex *lv = NULL;
            uint64_t seq = 0;
            CHECK(vindex_load(path, &o, &lv, &seq) == 0 && seq == 7);
            unlink(path);
            CHECK(vindex_calibrate(lv, 60, 0.99, &r) == 0);
            double lr = lv ? recall_of(lv) : 0.0;
            CHECK_MSG(lr >= 0.985 && !r.exact_fallback, "loaded: recall %.3f", lr);
            /* a rebuild makes new codes: the old samples say nothing about them */
            for (uint64_t i = 0; i < 2000; i++)
                CHECK(vindex_remove(lv, i) == 0);
            CHECK(vindex_maintenance(lv) == 1);
            vindex_get_recall(lv, &r);
            CHECK(r.samples == 240 && !isnan(r.estimate));
            vindex_destroy(lv);
        }
        vindex_destroy(vi);
    }
}

#endif

#ifdef VINDEX_TEST_FAISS

#define CAL_K_TEST 10 /* true neighbours a probe records (the index's CAL_K) */

/* A filter that keeps nothing (every search answered by an exact scan). */
static bool keep_none(uint64_t id, const void *meta, void *ctx)
{
    (void)meta;
    (void)ctx;
    return false;
}

/* The FAISS engine measures recent real queries before synthetic probes: searches with
 * queries of another distribution than the data (i.i.d. directions against non-negative
 * vectors), then an estimate that is the recall of those very queries. */
static void faiss_query_probes(vindex *vi)
{
    static float keep[NQ * DIM]; /* the data's queries, for the tests after this one */
    memcpy(keep, Q, sizeof(keep));
    rs = 77;
    for (size_t i = 0; i < NQ; i++) {
        gen(D_IID, Q + i * DIM);
        normalize(Q + i * DIM);
    }
    double measured = recall_of(vi);
    /* each query four times in a row: every fourth search is kept, so each once per pass;
     * three passes offer 300, the ring keeps the newest 256 */
    for (int pass = 0; pass < 3; pass++)
        for (int q = 0; q < NQ; q++)
            for (int rep = 0; rep < 4; rep++) {
                vindex_hit h[K];
                size_t n = 0;
                vindex_query vq = {.vec = Q + (size_t)q * DIM, .k = K};
                CHECK(vindex_search(vi, &vq, h, &n) == 0 && n == K);
            }
    /* 205 probes fill the ring of 2,048 positions: the newest 205 queries, each of the 100
     * about twice */
    vindex_recall r;
    CHECK(vindex_calibrate(vi, 205, 0.99, &r) == 0);
    fprintf(stderr,
            "faiss    i.i.d. queries: recall@10 %.3f, estimate from them %.3f (%zu of %zu)\n",
            measured, r.ann_estimate, r.query_samples, r.samples);
    CHECK(r.samples == 2048 && r.query_samples == r.samples);
    CHECK_MSG(fabs(r.ann_estimate - measured) <= 0.01, "estimate %.3f, measured %.3f",
              r.ann_estimate, measured);
    vindex_recall g;
    vindex_get_recall(vi, &g);
    CHECK(g.query_samples == r.query_samples);
    /* 51 queries are left, then synthetic probes take over (or, when the depth changed,
     * start a new ring: then real ones are the first 51 probes' positions at most) */
    CHECK(vindex_calibrate(vi, 100, 0.99, &r) == 0);
    CHECK(r.query_samples < r.samples && r.query_samples <= 2048 - 490);
    /* a search answered by an exact scan leaves its query too (an index that fell back to
     * exact scans must go on measuring real queries): here a filter that keeps nothing */
    CHECK(vindex_calibrate(vi, 205, 0.99, &r) == 0);
    CHECK(r.query_samples == 0);
    for (int q = 0; q < 8; q++) {
        vindex_hit h[K];
        size_t n = 1;
        vindex_query vq = {.vec = Q + (size_t)q * DIM, .k = K, .keep = keep_none};
        CHECK(vindex_search(vi, &vq, h, &n) == 0 && n == 0);
    }
    CHECK(vindex_calibrate(vi, 2, 0.99, &r) == 0);
    CHECK(r.query_samples == 2 * CAL_K_TEST);
    memcpy(Q, keep, sizeof(keep));
}

static void faiss_engine(void)
{
    rs = 2024;
    for (size_t i = 0; i < N; i++) {
        gen(D_RELU, X + i * DIM);
        normalize(X + i * DIM);
    }
    for (size_t i = 0; i < NQ; i++) {
        gen(D_RELU, Q + i * DIM);
        normalize(Q + i * DIM);
    }
    vindex_opts o = {.dim = DIM,
                     .ann_min = 2048,
                     .ann_candidates = 32,
                     .ann_max_candidates = 1500,
                     .engine = VINDEX_ENGINE_FAISS,
                     .faiss_factory = "HNSW32,Flat",
                     .faiss_ef_search = 32,
                     .faiss_engine = vfaiss_engine()};
    vindex *vi = vindex_create(&o);
    size_t first = N - 500; /* the last 500 arrive after the FAISS build: the tail */
    for (size_t i = 0; i < first; i++)
        CHECK(vindex_add(vi, i, X + i * DIM, NULL) == 0);
    vindex_stats st;
    vindex_get_stats(vi, &st);
    CHECK(st.kind == VINDEX_KIND_ANN && st.engine == VINDEX_ENGINE_NATIVE && st.maintenance_due);
    CHECK(vindex_maintenance(vi) == 1);
    vindex_get_stats(vi, &st);
    CHECK(st.engine == VINDEX_ENGINE_FAISS && !st.maintenance_due);
    for (size_t i = first; i < N; i++)
        CHECK(vindex_add(vi, i, X + i * DIM, NULL) == 0);
    vindex_get_stats(vi, &st);
    CHECK(!st.maintenance_due); /* 500 in the tail: under an eighth */
    vindex_recall r;
    for (int i = 0; i < 8; i++)
        CHECK(vindex_calibrate(vi, 30, 0.99, &r) == 0);
    double measured = recall_of(vi);
    fprintf(stderr, "faiss    recall@10 %.3f, estimate %.3f, depth %zu, exact %d\n", measured,
            r.estimate, r.depth, r.exact_fallback);
    CHECK_MSG(measured >= 0.985, "faiss: recall %.3f", measured);
    CHECK(!isnan(r.estimate) && r.estimate >= 0.99);
    CHECK(fabs(r.estimate - measured) <= 0.02);
    CHECK(r.query_samples == 0); /* calibrated before any search */
    faiss_query_probes(vi);
    /* deleted vectors never come back, from FAISS's candidates or the tail */
    for (uint64_t i = 0; i < N; i += 2)
        CHECK(vindex_remove(vi, i) == 0);
    for (int q = 0; q < 20; q++) {
        vindex_hit h[K];
        size_t n = 0;
        vindex_query vq = {.vec = X + (size_t)(2 * q) * DIM, .k = K};
        CHECK(vindex_search(vi, &vq, h, &n) == 0 && n == K);
        for (size_t i = 0; i < n; i++)
            CHECK(h[i].id % 2 == 1);
    }
    /* a snapshot carries the FAISS index: loaded, it is in use without a build */
    char path[] = "/tmp/engram-faiss-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK(vindex_save(vi, path, 3) == 0);
    vindex *lv = NULL;
    uint64_t seq = 0;
    CHECK(vindex_load(path, &o, &lv, &seq) == 0);
    if (lv) {
        vindex_get_stats(lv, &st);
        CHECK(st.engine == VINDEX_ENGINE_FAISS && st.count == N / 2);
        for (int q = 0; q < NQ; q++) {
            vindex_hit a[K], b[K];
            size_t na = 0, nb = 0;
            vindex_query vq = {.vec = Q + (size_t)q * DIM, .k = K};
            vindex_search(vi, &vq, a, &na);
            vindex_search(lv, &vq, b, &nb);
            CHECK(na == K && nb == K);
            size_t same = 0;
            for (size_t i = 0; i < na; i++)
                for (size_t j = 0; j < nb; j++)
                    same += a[i].id == b[j].id;
            CHECK(same >= K - 1);
        }
        vindex_destroy(lv);
    }
    /* the same file for a native index: the FAISS section is skipped (the half deleted is
     * in the file as tombstones: the compaction they call for is all that is due) */
    vindex_opts no = o;
    no.engine = VINDEX_ENGINE_NATIVE;
    CHECK(vindex_load(path, &no, &lv, &seq) == 0);
    if (lv) {
        vindex_get_stats(lv, &st);
        CHECK(st.engine == VINDEX_ENGINE_NATIVE && st.tombstones == N / 2 && st.maintenance_due);
        CHECK(vindex_maintenance(lv) == 1);
        vindex_get_stats(lv, &st);
        CHECK(st.engine == VINDEX_ENGINE_NATIVE && st.tombstones == 0 && !st.maintenance_due);
        vindex_destroy(lv);
    }
    /* and for a FAISS index in a program that has no FAISS engine to give it: the section
     * is dropped, searches run on the native codes and give the saved index's hits, and the
     * first maintenance says why there is no FAISS index */
    vindex_opts none = o;
    none.faiss_engine = NULL;
    CHECK(vindex_load(path, &none, &lv, &seq) == 0 && seq == 3);
    if (lv) {
        vindex_get_stats(lv, &st);
        CHECK(st.engine == VINDEX_ENGINE_NATIVE && st.count == N / 2 && st.maintenance_due);
        size_t same = 0;
        for (int q = 0; q < NQ; q++) {
            vindex_hit a[K], b[K];
            size_t na = 0, nb = 0;
            vindex_query vq = {.vec = Q + (size_t)q * DIM, .k = K};
            CHECK(vindex_search(vi, &vq, a, &na) == 0 && vindex_search(lv, &vq, b, &nb) == 0);
            CHECK(na == K && nb == K);
            for (size_t i = 0; i < na; i++)
                for (size_t j = 0; j < nb; j++)
                    same += a[i].id == b[j].id;
        }
        CHECK_MSG(same >= (size_t)NQ * K * 95 / 100, "%zu of %d hits agree", same, NQ * K);
        CHECK(vindex_maintenance(lv) == VINDEX_E_FAISS);
        char why[160];
        vindex_engine_error(lv, why, sizeof(why));
        CHECK_STR_CONTAINS(why, "no FAISS engine");
        vindex_get_stats(lv, &st);
        CHECK(!st.maintenance_due && st.engine == VINDEX_ENGINE_NATIVE);
        CHECK(vindex_maintenance(lv) == 0); /* not retried */
        vindex_destroy(lv);
    }
    unlink(path);
    /* a factory FAISS refuses: maintenance reports it once, searches stay native */
    vindex_opts bad = o;
    bad.faiss_factory = "NotAnIndex";
    vindex *bv = vindex_create(&bad);
    for (size_t i = 0; i < 3000; i++)
        CHECK(vindex_add(bv, i, X + i * DIM, NULL) == 0);
    CHECK(vindex_maintenance(bv) == VINDEX_E_FAISS);
    char why[160];
    vindex_engine_error(bv, why, sizeof(why));
    CHECK(why[0] != '\0');
    vindex_get_stats(bv, &st);
    CHECK(!st.maintenance_due && st.engine == VINDEX_ENGINE_NATIVE);
    vindex_hit h[K];
    size_t n = 0;
    vindex_query vq = {.vec = Q, .k = K};
    CHECK(vindex_search(bv, &vq, h, &n) == 0 && n == K);
    vindex_destroy(bv);
    vindex_destroy(vi);
}

#endif

#ifndef VINDEX_TEST_FAISS

static double blend_fn(float sim, const void *meta, void *ctx)
{
    return 0.7 * sim + 0.3 * *(const float *)meta;
}

/* A blended ranking reaches deeper into the similarity order: calibrated with the blend, the
 * index gives such searches their own depth and their recall. */
static void blended(void)
{
    rs = 77;
    for (size_t i = 0; i < N; i++) {
        gen(D_SHARED, X + i * DIM);
        normalize(X + i * DIM);
        VALS[i] = (float)uni();
    }
    for (size_t i = 0; i < NQ; i++) {
        gen(D_SHARED, Q + i * DIM);
        normalize(Q + i * DIM);
    }
    vindex_opts o = {.dim = DIM,
                     .meta_size = sizeof(float),
                     .ann_min = 2048,
                     .ann_candidates = 32,
                     .ann_max_candidates = 3000};
    vindex *vi = vindex_create(&o);
    for (size_t i = 0; i < N; i++)
        CHECK(vindex_add(vi, i, X + i * DIM, &VALS[i]) == 0);
    while (vindex_maintenance(vi) > 0)
        ;
    vindex_recall r;
    for (int i = 0; i < 6; i++)
        CHECK(vindex_calibrate(vi, 10, 0.99, &r) == 0);
    vindex_query shape = {
        .score = blend_fn, .score_slope = 0.7, .score_bound = 0.3, .score_monotone = true};
    double plain = recall_with(vi, &shape);
    for (int i = 0; i < 6; i++)
        CHECK(vindex_calibrate_scored(vi, 10, 0.99, &shape, &r) == 0);
    double tuned = recall_with(vi, &shape);
    fprintf(stderr,
            "blended  recall@10 %.3f with the similarity depth %zu, %.3f with its own %zu\n", plain,
            r.depth, tuned, r.scored_depth);
    CHECK(r.scored_depth > r.depth);
    CHECK_MSG(tuned >= 0.98, "blended recall %.3f", tuned);
    CHECK(tuned >= plain);
    vindex_destroy(vi);
}

/* Build-time calibration (issue 34): an index filled by adds and finished with
 * vindex_settle answers its first search at its measured depth, and data that defeats the
 * codes is answered exactly from the first query. Until a measurement, new codes are
 * scanned exactly (recall 1) rather than searched at a guess. */
static void build_time(void)
{
    for (enum dist d = D_RELU; d <= D_IID; d += D_IID - D_RELU) {
        rs = 500 + (uint64_t)d;
        for (size_t i = 0; i < N; i++) {
            gen(d, X + i * DIM);
            normalize(X + i * DIM);
        }
        for (size_t i = 0; i < NQ; i++) {
            gen(d, Q + i * DIM);
            normalize(Q + i * DIM);
        }
        vindex_opts o = {
            .dim = DIM, .ann_min = 2048, .ann_candidates = 32, .ann_max_candidates = 1500};
        vindex *vi = vindex_create(&o);
        for (size_t i = 0; i < N; i++)
            CHECK(vindex_add(vi, i, X + i * DIM, NULL) == 0);
        /* ANN since the 2,048th add, never measured: exact */
        vindex_recall r;
        vindex_get_recall(vi, &r);
        vindex_stats st;
        vindex_get_stats(vi, &st);
        CHECK(st.kind == VINDEX_KIND_ANN && isnan(r.estimate) && r.depth == 0);
        CHECK_MSG(recall_of(vi) == 1.0, "%s: unmeasured codes are scanned exactly", dist_name[d]);
        CHECK(vindex_settle_due(vi));              /* what engramd asks after a store_batch */
        CHECK(vindex_settle(vi, 0.99, NULL) == 1); /* a new centre, measured before the swap */
        CHECK(!vindex_settle_due(vi));
        vindex_get_recall(vi, &r);
        vindex_get_stats(vi, &st);
        CHECK(!st.maintenance_due && r.samples >= 200 && !isnan(r.estimate));
        CHECK(vindex_settle(vi, 0.99, NULL) == 0); /* nothing left to do */
        double first = recall_of(vi);              /* no vindex_calibrate call in between */
        fprintf(stderr, "settled %-8s recall@10 %.3f from the first query, depth %zu, exact %d\n",
                dist_name[d], first, r.depth, r.exact_fallback);
        if (d == D_IID) {
            CHECK(r.exact_fallback && first == 1.0);
        } else {
            CHECK(!r.exact_fallback && r.depth > 0 && first >= 0.985);
        }
        /* a snapshot carries the measurement: the loaded index needs none */
        char path[] = "/tmp/engram-settle-XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        close(fd);
        CHECK(vindex_save(vi, path, 1) == 0);
        vindex *lv = NULL;
        uint64_t seq;
        CHECK(vindex_load(path, &o, &lv, &seq) == 0);
        unlink(path);
        if (lv) {
            vindex_recall lr;
            vindex_get_recall(lv, &lr);
            CHECK(lr.depth == r.depth && lr.exact_fallback == r.exact_fallback &&
                  lr.samples == r.samples && lr.estimate == r.estimate);
            CHECK(vindex_settle(lv, 0.99, NULL) == 0);
            CHECK(recall_of(lv) == first);
            vindex_destroy(lv);
        }
        vindex_destroy(vi);
    }
}

#endif

int main(void)
{
    rs = 99;
    for (size_t i = 0; i < 16 * DIM; i++)
        W[i] = (float)gauss();
    for (size_t j = 0; j < DIM; j++)
        MEAN[j] = (float)gauss();
    normalize(MEAN);
    for (size_t j = 0; j < DIM; j++)
        MEAN[j] *= 0.84f;
#ifndef VINDEX_TEST_FAISS
    rotation_is_orthogonal();
    steady();
    distributions();
    blended();
    build_time();
#else
    faiss_engine();
#endif
    CHECK_RETURN();
}
