/* bench/index_micro.c: the vector index engine's share of search latency, throughput,
 * recall, add cost, memory, snapshot save/load, and embed_text throughput.
 *
 * Usage: index-micro [options]
 *   --dataset NAME  gaussian (default), anisotropic, spectral, relu, clustered or text (see
 *               bench/dataset.h; text reads $ENGRAM_TEXT_DATASET or --text-dir, made by
 *               bench/text-dataset.sh, at its own dimension)
 *   --dim D     dimension of the synthetic data sets (default 768)
 *   --seed S    data set seed (default 1)
 *   --text-dir DIR  the text data set's directory
 *   -q N        queries per measurement (default 300)
 *   -s LIST     index sizes, comma separated (default 100,5000,50000); "max" is the whole
 *               text data set, and sizes above it are cut to it
 *   -t LIST     thread counts for the throughput runs (default 1,2,8; at the largest size)
 *   -d DIR      directory for snapshot files (default /tmp)
 *   --compare   also measure each kind forced at every size (FLAT, SQ8, ANN)
 *   --hnsw      also FAISS HNSW32,Flat (efSearch 64/128/256, exact re-rank of the ef
 *               candidates) at sizes of 1,000 and more
 *   --engine E  the ANN engine: native (default) or faiss (the index's FAISS engine:
 *               HNSW32,Flat, efSearch 64, built by maintenance before measuring)
 *   --generic   use the portable kernels instead of AVX2 (and AVX-512)
 *   --avx2      use the AVX2 kernels even where the CPU has AVX-512 VPOPCNTDQ
 *   --quick     search latency and recall only: no throughput, snapshot or embed_text runs
 *   --check-truth  check the ground truth against a plain double scan (20 queries)
 *   --memory    at sizes of 5,000 and more, the resident bytes with the float rows mapped
 *               from a snapshot: saved, pages dropped, after cold and warm search passes,
 *               and loaded (its time, its first query and its first pass cold)
 *   --tie-margin Z  vindex_opts.tie_margin: ANN hits ranked from their int8 codes, float
 *               rows read for near-ties within Z standard deviations (default: the
 *               index's, 3); negative: every candidate re-ranked on its float row
 * Data and queries come from bench/dataset.c: queries follow the data's distribution but are
 * not stored vectors. Recall@10 is against the exact answer over the same filter and score:
 * candidates from an sgemm pass (float) within a margin that covers float rounding, ranked
 * again in double precision; a returned vector within 1e-6 of the 10th exact score (a
 * duplicate, or a near-tie float rounding may order either way) counts as found. Numbers are
 * wall-clock on one thread unless stated.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/index_factory_c.h>

#include "dataset.h"
#include "embed.h"
#include "vfaiss.h"
#include "vindex.h"
#include "vkernel.h"

#define K 10
/* Bound on |float sgemm inner product - exact| for unit rows (n u |a| |b| is 4.6e-5 at 768
 * dimensions, 2.4e-4 at 4,096): candidates within twice this of the 10th float score. */
#define TRUTH_MARGIN 1e-3
#define TRUTH_QBLOCK 256
/* A hit whose exact score is this close to the K-th exact score counts as found: a
 * duplicate, or a near-tie that the index's float arithmetic may order either way. */
#define TIE_EPS 1e-6

static size_t DIM = 768;
static uint64_t rng_s = 0x1234567;

static double uniform(void)
{
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

typedef struct meta {
    uint32_t agent; /* 0..99 */
    float value;    /* 0..1 */
} meta;

static bool keep_half(uint64_t id, const void *m, void *ctx)
{
    return ((const meta *)m)->agent % 2 == 0;
}

static bool keep_1pct(uint64_t id, const void *m, void *ctx)
{
    return ((const meta *)m)->agent == 7;
}

static double blend(float sim, const void *m, void *ctx)
{
    return 0.7 * sim + 0.3 * ((const meta *)m)->value;
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *t, int n, double p)
{
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    size_t i = (size_t)ceil(p * n);
    return t[i ? i - 1 : 0];
}

/* ---- data set and ground truth ---- */

static float *X, *Q;
static meta *M;
static int NQ = 300;
static double TIE = 0; /* vindex_opts.tie_margin (0: the index's default) */

enum { MODE_PLAIN, MODE_SCORE, MODE_RARE, NMODES };
static const char *mode_name[] = {"k=10", "k=10 keep 1/2, 0.7 sim + 0.3 v", "k=10 keep 1%"};

static void set_mode(vindex_query *q, int mode)
{
    if (mode == MODE_SCORE) {
        q->keep = keep_half;
        q->score = blend;
        q->score_slope = 0.7;
        q->score_bound = 0.3;
        q->score_monotone = true;
    } else if (mode == MODE_RARE) {
        q->keep = keep_1pct;
    }
}

/* The exact answer of every query of one mode: ids (1-based, 0 where fewer than K pass the
 * filter) and the K-th exact score (-inf when fewer). */
typedef struct truth_set {
    uint64_t *ids; /* NQ x K */
    double *kth;   /* NQ */
    int mode;
} truth_set;

typedef struct sd {
    double s;
    uint64_t id;
} sd;

static int sd_cmp(const void *pa, const void *pb)
{
    const sd *a = pa, *b = pb;
    if (a->s != b->s)
        return a->s > b->s ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* The exact score of vector i (0-based) for query q under the mode's score, in double. */
static double exact_score(size_t i, const float *qv, const vindex_query *qq)
{
    double sim = vk_dot_exact(X + i * DIM, qv, DIM);
    return qq->score ? qq->score((float)sim, &M[i], NULL) : sim;
}

/* truth fills gt[mode] with the exact top K of every query over the first n vectors. An
 * sgemm pass gives every similarity in float; per query and mode, the K-th best float score
 * f_K bounds the exact K-th score from below (minus the rounding margin), so every vector of
 * the exact top K has a float score of at least f_K - 2 margin: those candidates are scored
 * again in double and sorted by (score, id). */
static void truth(size_t n, truth_set *gt)
{
    size_t qb = (size_t)NQ < TRUTH_QBLOCK ? (size_t)NQ : TRUTH_QBLOCK;
    float *c = malloc(qb * n * sizeof(float));
    sd *cand = malloc(n * sizeof(sd));
    if (!c || !cand) {
        fprintf(stderr, "index-micro: out of memory for the ground truth\n");
        exit(1);
    }
    for (size_t q0 = 0; q0 < (size_t)NQ; q0 += qb) {
        size_t nqq = (size_t)NQ - q0 < qb ? (size_t)NQ - q0 : qb;
        /* c (nqq x n) = queries (nqq x dim) * X^T (dim x n) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nqq, (int)n, (int)DIM, 1.0f,
                    Q + q0 * DIM, (int)DIM, X, (int)DIM, 0.0f, c, (int)n);
        for (int mode = 0; mode < NMODES; mode++) {
            vindex_query qq = {0};
            set_mode(&qq, mode);
            double margin = TRUTH_MARGIN * (qq.score ? qq.score_slope : 1.0);
            for (size_t a = 0; a < nqq; a++) {
                size_t q = q0 + a;
                const float *crow = c + a * n, *qv = Q + q * DIM;
                double top[K];
                size_t nt = 0;
                for (size_t i = 0; i < n; i++) { /* the K best float scores */
                    if (qq.keep && !qq.keep((uint64_t)i, &M[i], NULL))
                        continue;
                    double f = qq.score ? qq.score(crow[i], &M[i], NULL) : crow[i];
                    if (nt == K && f <= top[K - 1])
                        continue;
                    size_t p = nt < K ? nt++ : K - 1;
                    while (p > 0 && top[p - 1] < f) {
                        top[p] = top[p - 1];
                        p--;
                    }
                    top[p] = f;
                }
                double floor = nt == K ? top[K - 1] - 2 * margin : -INFINITY;
                size_t m = 0;
                for (size_t i = 0; i < n; i++) {
                    if (qq.keep && !qq.keep((uint64_t)i, &M[i], NULL))
                        continue;
                    double f = qq.score ? qq.score(crow[i], &M[i], NULL) : crow[i];
                    if (f < floor)
                        continue;
                    cand[m++] = (sd){exact_score(i, qv, &qq), i + 1};
                }
                qsort(cand, m, sizeof(sd), sd_cmp);
                for (size_t i = 0; i < K; i++)
                    gt[mode].ids[q * K + i] = i < m ? cand[i].id : 0;
                gt[mode].kth[q] = m >= K ? cand[K - 1].s : -INFINITY;
            }
        }
    }
    free(c);
    free(cand);
}

/* check_truth compares gt with a plain double-precision scan of all n vectors for the first
 * 20 queries and returns the number of differing ids (--check-truth). */
static size_t check_truth(size_t n, const truth_set *gt)
{
    sd *all = malloc(n * sizeof(sd));
    size_t bad = 0;
    for (int mode = 0; mode < NMODES; mode++) {
        vindex_query qq = {0};
        set_mode(&qq, mode);
        for (int q = 0; q < NQ && q < 20; q++) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++) {
                if (qq.keep && !qq.keep((uint64_t)i, &M[i], NULL))
                    continue;
                all[m++] = (sd){exact_score(i, Q + (size_t)q * DIM, &qq), i + 1};
            }
            qsort(all, m, sizeof(sd), sd_cmp);
            for (size_t i = 0; i < K; i++)
                bad += gt[mode].ids[(size_t)q * K + i] != (i < m ? all[i].id : 0);
        }
    }
    free(all);
    return bad;
}

/* Recall of the n hits of query q against the exact answer: a hit counts when it is one of
 * the exact top K, or when its exact score ties the K-th within TIE_EPS. */
static double recall_of(const vindex_hit *h, size_t n, const truth_set *gt, int q)
{
    const uint64_t *ids = gt->ids + (size_t)q * K;
    int want = 0, r = 0;
    for (size_t i = 0; i < K; i++)
        want += ids[i] != 0;
    vindex_query qq = {0};
    set_mode(&qq, gt->mode);
    for (size_t j = 0; j < n && j < K; j++) {
        bool hit = false;
        for (size_t i = 0; i < K && !hit; i++)
            hit = ids[i] && h[j].id == ids[i];
        if (!hit && h[j].id >= 1)
            hit = exact_score(h[j].id - 1, Q + (size_t)q * DIM, &qq) >= gt->kth[q] - TIE_EPS;
        r += hit;
    }
    if (r > want)
        r = want;
    return want ? (double)r / want : 1.0;
}

/* ---- measurements ---- */

static void measure(vindex *vi, const char *label, size_t n, const truth_set *gt)
{
    double *t = malloc((size_t)NQ * sizeof(double));
    vindex_hit hits[K];
    for (int mode = 0; mode < NMODES; mode++) {
        double rec = 0;
        for (int pass = 0; pass < 2; pass++) { /* the first pass warms caches */
            rec = 0;
            for (int q = 0; q < NQ; q++) {
                vindex_query qq = {.vec = Q + (size_t)q * DIM, .k = K};
                set_mode(&qq, mode);
                size_t nh;
                double a = now_us();
                if (vindex_search(vi, &qq, hits, &nh))
                    exit(1);
                t[q] = now_us() - a;
                rec += recall_of(hits, nh, &gt[mode], q);
            }
        }
        printf("  %-8s n=%-6zu %-32s p50 %7.1f us  p99 %7.1f us  recall@10 %.4f", label, n,
               mode_name[mode], pct(t, NQ, 0.5), pct(t, NQ, 0.99), rec / NQ);
        if (mode == 0) {
            vindex_recall r;
            vindex_get_recall(vi, &r);
            printf("  estimate %.4f depth %zu%s", r.estimate, r.depth,
                   r.exact_fallback ? " (exact fallback)" : "");
        }
        printf("\n");
    }
    free(t);
}

typedef struct thr {
    vindex *vi;
    double until;
    int id, done;
    double *lat;
    int cap;
} thr;

static void *thr_run(void *arg)
{
    thr *th = arg;
    vindex_hit hits[K];
    int q = th->id * 37;
    while (now_us() < th->until && th->done < th->cap) {
        vindex_query qq = {.vec = Q + (size_t)(q++ % NQ) * DIM, .k = K};
        size_t nh;
        double a = now_us();
        vindex_search(th->vi, &qq, hits, &nh);
        th->lat[th->done++] = now_us() - a;
    }
    return NULL;
}

static void throughput(vindex *vi, size_t n, int threads)
{
    thr th[64];
    pthread_t tid[64];
    double start = now_us(), secs = 2.0;
    for (int i = 0; i < threads; i++) {
        th[i] = (thr){.vi = vi, .until = start + secs * 1e6, .id = i, .cap = 200000};
        th[i].lat = malloc(200000 * sizeof(double));
        pthread_create(&tid[i], NULL, thr_run, &th[i]);
    }
    size_t total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        total += (size_t)th[i].done;
    }
    double el = (now_us() - start) / 1e6;
    double *all = malloc(total * sizeof(double));
    size_t j = 0;
    for (int i = 0; i < threads; i++) {
        memcpy(all + j, th[i].lat, (size_t)th[i].done * sizeof(double));
        j += (size_t)th[i].done;
        free(th[i].lat);
    }
    printf("  threads %-2d n=%-6zu %8.0f queries/s   p50 %7.1f us  p99 %7.1f us\n", threads, n,
           (double)total / el, pct(all, (int)total, 0.5), pct(all, (int)total, 0.99));
    free(all);
}

static vindex *build(size_t n, const vindex_opts *o, double *us_per_add)
{
    vindex *vi = vindex_create(o);
    if (!vi)
        exit(1);
    double a = now_us();
    for (size_t i = 0; i < n; i++) {
        if (vindex_add(vi, i + 1, X + i * DIM, &M[i]))
            exit(1);
    }
    *us_per_add = (now_us() - a) / (double)n;
    /* as engramd's housekeeping does: rebuild when due, then let the recall monitor
     * measure the codes, a few probes at a time (300 probes: the ring of 2,048 true-neighbour
     * positions is full; a FAISS depth can double several times) */
    while (vindex_maintenance(vi) > 0)
        ;
    vindex_query shape = {
        .score = blend, .score_slope = 0.7, .score_bound = 0.3, .score_monotone = true};
    for (int i = 0; i < 12; i++)
        vindex_calibrate_scored(vi, 25, 0.99, &shape, NULL); /* as engramd: its default blend */
    return vi;
}

static void hnsw(size_t n, const truth_set *gt)
{
    FaissIndex *ix = NULL;
    if (faiss_index_factory(&ix, (int)DIM, "HNSW32,Flat", METRIC_INNER_PRODUCT))
        return;
    omp_set_num_threads(2);
    double a = now_us();
    faiss_Index_add(ix, (idx_t)n, X);
    printf("  hnsw     n=%-6zu HNSW32,Flat build %.1f s on 2 threads\n", n, (now_us() - a) / 1e6);
    omp_set_num_threads(1);
    FaissParameterSpace *ps;
    faiss_ParameterSpace_new(&ps);
    static const int efs[] = {64, 128, 256};
    double *t = malloc((size_t)NQ * sizeof(double));
    for (int e = 0; e < 3; e++) {
        faiss_ParameterSpace_set_index_parameter(ps, ix, "efSearch", efs[e]);
        idx_t *ids = malloc((size_t)efs[e] * sizeof(idx_t));
        float *d = malloc((size_t)efs[e] * sizeof(float));
        double rec = 0;
        for (int q = 0; q < NQ; q++) {
            const float *qv = Q + (size_t)q * DIM;
            double b = now_us();
            faiss_Index_search(ix, 1, qv, efs[e], d, ids);
            /* exact re-rank of the ef candidates, top 10 */
            vindex_hit top[K];
            size_t nt = 0;
            for (int c = 0; c < efs[e]; c++) {
                if (ids[c] < 0)
                    continue;
                float s = (float)vk_dot_exact(X + (size_t)ids[c] * DIM, qv, DIM);
                if (nt == K && s <= top[K - 1].similarity)
                    continue;
                size_t p = nt < K ? nt++ : K - 1;
                while (p > 0 && top[p - 1].similarity < s) {
                    top[p] = top[p - 1];
                    p--;
                }
                top[p] = (vindex_hit){.id = (uint64_t)ids[c] + 1, .similarity = s};
            }
            t[q] = now_us() - b;
            rec += recall_of(top, nt, gt, q);
        }
        printf("  hnsw     n=%-6zu efSearch %-3d + exact re-rank      p50 %7.1f us  p99 %7.1f "
               "us  recall@10 %.4f\n",
               n, efs[e], pct(t, NQ, 0.5), pct(t, NQ, 0.99), rec / NQ);
        free(ids);
        free(d);
    }
    free(t);
    faiss_ParameterSpace_free(ps);
    faiss_Index_free(ix);
}

static void snapshots(vindex *vi, size_t n, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/index-micro-%d.snap", dir, (int)getpid());
    double a = now_us();
    int rc = vindex_save(vi, path, 42);
    double ts = now_us() - a;
    vindex *lv = NULL;
    uint64_t seq = 0;
    double best = 1e30;
    for (int i = 0; i < 3 && rc == 0; i++) { /* warm page cache: the best of three */
        a = now_us();
        rc = vindex_load(path,
                         &(vindex_opts){.dim = DIM, .meta_size = sizeof(meta), .tie_margin = TIE},
                         &lv, &seq);
        double tl = now_us() - a;
        if (tl < best)
            best = tl;
        if (rc == 0 && i < 2)
            vindex_destroy(lv);
    }
    FILE *f = fopen(path, "rb");
    long sz = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        sz = ftell(f);
        fclose(f);
    }
    if (rc == 0)
        printf("  snapshot n=%-6zu %.1f MB: save (with fsync) %.1f ms, load %.1f ms (page "
               "cache), seq %llu\n",
               n, sz / 1e6, ts / 1e3, best / 1e3, (unsigned long long)seq);
    else
        printf("  snapshot n=%-6zu failed (%d)\n", n, rc);
    vindex_destroy(lv);
    unlink(path);
}

/* mode 0 searches once over the queries: p50, p99 and recall into the caller's variables */
static void one_pass(vindex *vi, const truth_set *gt, double *p50, double *p99, double *rec)
{
    double *t = malloc((size_t)NQ * sizeof(double));
    vindex_hit hits[K];
    vindex_stats st0, st1;
    vindex_get_stats(vi, &st0);
    double sim_err = 0.0;
    vindex_query plain = {0};
    *rec = 0;
    for (int q = 0; q < NQ; q++) {
        vindex_query qq = {.vec = Q + (size_t)q * DIM, .k = K};
        size_t nh;
        double a = now_us();
        if (vindex_search(vi, &qq, hits, &nh))
            exit(1);
        t[q] = now_us() - a;
        *rec += recall_of(hits, nh, gt, q);
        for (size_t j = 0; j < nh; j++) {
            double e = fabs((double)hits[j].similarity -
                            exact_score(hits[j].id - 1, Q + (size_t)q * DIM, &plain));
            sim_err = e > sim_err ? e : sim_err;
        }
    }
    *rec /= NQ;
    vindex_get_stats(vi, &st1);
    printf("  memory   %d queries: float rows read %llu (%.1f a query), largest similarity "
           "error %.2e\n",
           NQ, (unsigned long long)(st1.rows_read - st0.rows_read),
           (double)(st1.rows_read - st0.rows_read) / NQ, sim_err);
    *p50 = pct(t, NQ, 0.5);
    *p99 = pct(t, NQ, 0.99);
    free(t);
}

static void rows_line(vindex *vi, size_t n, const char *what)
{
    vindex_stats st;
    size_t b = vindex_resident(vi);
    vindex_get_stats(vi, &st);
    printf("  memory   n=%-6zu %-30s resident %7.1f MB (%.2f B per dim and vector): heap "
           "%.1f MB, rows mapped %.1f MB, in RAM %.1f MB; page-ins %llu\n",
           n, what, b / 1e6, (double)b / ((double)n * DIM), st.heap_bytes / 1e6,
           st.rows_mapped / 1e6, st.rows_resident / 1e6, (unsigned long long)st.page_ins);
}

/* rows_memory: the resident bytes of an index whose float rows are mapped from its snapshot
 * (issue 34): after the save, after dropping the mapped pages, after cold and warm passes of
 * searches, and for a load (mapped) with its time and its first, cold pass. */
static void rows_memory(vindex **vip, size_t n, const truth_set *gt, const char *dir)
{
    vindex *vi = *vip;
    char path[4096];
    snprintf(path, sizeof(path), "%s/index-micro-rows-%d.snap", dir, (int)getpid());
    rows_line(vi, n, "built, rows on the heap");
    if (vindex_save(vi, path, 7)) {
        printf("  memory   n=%-6zu save failed\n", n);
        unlink(path);
        return;
    }
    rows_line(vi, n, "saved: rows mapped");
    vindex_trim(vi);
    rows_line(vi, n, "mapped pages dropped");
    double p50, p99, rec;
    one_pass(vi, gt, &p50, &p99, &rec);
    rows_line(vi, n, "after a cold pass");
    printf("  memory   n=%-6zu cold pass (rows read from the file) p50 %7.1f us  p99 %7.1f us  "
           "recall@10 %.4f\n",
           n, p50, p99, rec);
    one_pass(vi, gt, &p50, &p99, &rec);
    printf("  memory   n=%-6zu warm pass                            p50 %7.1f us  p99 %7.1f us  "
           "recall@10 %.4f\n",
           n, p50, p99, rec);
    rows_line(vi, n, "after a warm pass");
    /* the index goes before the load: pages two mappings share stay in RAM when one drops
     * them */
    vindex_destroy(vi);
    *vip = NULL;
    vindex *lv = NULL;
    uint64_t seq = 0;
    double a = now_us();
    int rc = vindex_load(
        path, &(vindex_opts){.dim = DIM, .meta_size = sizeof(meta), .tie_margin = TIE}, &lv, &seq);
    double tl = now_us() - a;
    if (rc == 0) {
        printf("  memory   n=%-6zu load (mapped, page cache warm) %.1f ms\n", n, tl / 1e3);
        rows_line(lv, n, "loaded");
        vindex_trim(lv);
        vindex_hit hits[K];
        vindex_query qq = {.vec = Q, .k = K};
        size_t nh;
        a = now_us();
        vindex_search(lv, &qq, hits, &nh);
        printf("  memory   n=%-6zu loaded, pages dropped: first query %.1f us\n", n, now_us() - a);
        one_pass(lv, gt, &p50, &p99, &rec);
        printf("  memory   n=%-6zu loaded, cold pass                    p50 %7.1f us  p99 %7.1f "
               "us  recall@10 %.4f\n",
               n, p50, p99, rec);
        rows_line(lv, n, "loaded, after a cold pass");
        vindex_destroy(lv);
    }
    unlink(path);
}

int main(int argc, char **argv)
{
    size_t sizes[8] = {100, 5000, 50000}, nsizes = 3;
    int threads[8] = {1, 2, 8}, nthreads = 3;
    bool compare = false, with_hnsw = false, quick = false, check = false, rows_mem = false;
    int engine = VINDEX_ENGINE_NATIVE;
    bool size_max[8] = {false};
    const char *dir = "/tmp", *dsname = "gaussian", *text_dir = NULL;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-q") && i + 1 < argc) {
            NQ = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            nsizes = 0;
            for (char *p = strtok(argv[++i], ","); p && nsizes < 8; p = strtok(NULL, ",")) {
                size_max[nsizes] = !strcmp(p, "max");
                sizes[nsizes] = size_max[nsizes] ? SIZE_MAX : strtoul(p, NULL, 10);
                nsizes++;
            }
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            nthreads = 0;
            for (char *p = strtok(argv[++i], ","); p && nthreads < 8; p = strtok(NULL, ","))
                threads[nthreads++] = atoi(p);
        } else if (!strcmp(argv[i], "--tie-margin") && i + 1 < argc) {
            TIE = strtod(argv[++i], NULL);
        } else if (!strcmp(argv[i], "--memory")) {
            rows_mem = true;
        } else if (!strcmp(argv[i], "-d") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--dataset") && i + 1 < argc) {
            dsname = argv[++i];
        } else if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            DIM = strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--text-dir") && i + 1 < argc) {
            text_dir = argv[++i];
        } else if (!strcmp(argv[i], "--compare")) {
            compare = true;
        } else if (!strcmp(argv[i], "--hnsw")) {
            with_hnsw = true;
        } else if (!strcmp(argv[i], "--engine") && i + 1 < argc) {
            i++;
            engine = !strcmp(argv[i], "faiss") ? VINDEX_ENGINE_FAISS : VINDEX_ENGINE_NATIVE;
        } else if (!strcmp(argv[i], "--generic")) {
            vk_set_level(VK_GENERIC);
        } else if (!strcmp(argv[i], "--avx2")) {
            vk_set_level(VK_AVX2);
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--check-truth")) {
            check = true;
        } else {
            fprintf(stderr,
                    "usage: %s [--dataset gaussian|anisotropic|spectral|relu|clustered|text] "
                    "[--dim D] [--seed S] [--text-dir DIR] [-q N] [-s sizes|max] [-t threads] "
                    "[-d dir] [--compare] [--hnsw] [--engine native|faiss] [--generic] [--avx2] "
                    "[--quick] "
                    "[--check-truth] [--memory] [--tie-margin Z]\n",
                    argv[0]);
            return 2;
        }
    }
    if (NQ < 10)
        NQ = 10;
    dataset *ds = NULL;
    char err[512];
    if (DIM == 0 || dataset_open(dsname, seed, DIM, text_dir, &ds, err, sizeof(err)) != 0) {
        fprintf(stderr, "index-micro: %s\n", DIM ? err : "bad --dim");
        return 2;
    }
    DIM = dataset_dim(ds);
    size_t avail = dataset_size(ds);
    for (size_t s = 0; s < nsizes; s++) {
        if (size_max[s] && avail == SIZE_MAX) {
            fprintf(stderr, "index-micro: -s max needs a data set of fixed size (text)\n");
            return 2;
        }
        if (sizes[s] > avail) {
            if (!size_max[s])
                printf("note: size %zu cut to the %zu vectors of the data set\n", sizes[s], avail);
            sizes[s] = avail;
        }
        if (sizes[s] < K) {
            fprintf(stderr, "index-micro: sizes must be at least %d\n", K);
            return 2;
        }
    }
    if ((size_t)NQ > dataset_query_size(ds)) {
        printf("note: %d queries cut to the %zu of the data set\n", NQ, dataset_query_size(ds));
        NQ = (int)dataset_query_size(ds);
    }
    printf("kernels: %s\n", vk_level() == VK_AVX512 ? "AVX-512 (Hamming), AVX2"
                            : vk_level() == VK_AVX2 ? "AVX2"
                                                    : "generic");

    size_t maxn = 0;
    for (size_t s = 0; s < nsizes; s++)
        maxn = sizes[s] > maxn ? sizes[s] : maxn;
    X = malloc(maxn * DIM * sizeof(float));
    M = malloc(maxn * sizeof(meta));
    Q = malloc((size_t)NQ * DIM * sizeof(float));
    if (!X || !M || !Q || dataset_vectors(ds, 0, 0, maxn, X) != 0 ||
        dataset_queries(ds, 0, 0, (size_t)NQ, Q) != 0) {
        fprintf(stderr, "index-micro: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < maxn; i++)
        M[i] = (meta){(uint32_t)(uniform() * 100), (float)uniform()};
    printf("dataset %s: %zu x %zu, mean pairwise cosine %.3f, %d queries (not stored vectors)\n",
           dsname, maxn, DIM, dataset_mean_cosine(X, maxn, DIM), NQ);
    fflush(stdout);

    for (size_t s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        truth_set gt[NMODES];
        double a = now_us();
        for (int m = 0; m < NMODES; m++) {
            gt[m] = (truth_set){.mode = m};
            gt[m].ids = malloc((size_t)NQ * K * sizeof(uint64_t));
            gt[m].kth = malloc((size_t)NQ * sizeof(double));
            if (!gt[m].ids || !gt[m].kth)
                exit(1);
        }
        truth(n, gt);
        double truth_s = (now_us() - a) / 1e6;
        if (check) {
            size_t bad = check_truth(n, gt);
            printf("n=%zu: ground truth against a plain double scan (20 queries x 3 modes): %zu "
                   "ids differ\n",
                   n, bad);
            if (bad)
                return 1;
        }
        double per_add;
        vindex_opts o = {.dim = DIM,
                         .meta_size = sizeof(meta),
                         .tie_margin = TIE,
                         .engine = engine,
                         .faiss_factory = "HNSW32,Flat",
                         .faiss_ef_search = 64,
                         .faiss_engine = vfaiss_engine()};
        vindex *vi = build(n, &o, &per_add);
        vindex_stats st;
        vindex_get_stats(vi, &st);
        static const char *kinds[] = {"FLAT", "SQ8", "ANN"};
        if (st.engine == VINDEX_ENGINE_FAISS)
            kinds[2] = "FAISS";
        printf("n=%zu: kind %s, %.1f us per add (incl. kind changes), %.1f MB (%.0f B per "
               "vector); exact truth in %.1f s\n",
               n, kinds[st.kind], per_add, st.bytes / 1e6, (double)st.bytes / n, truth_s);
        measure(vi, kinds[st.kind], n, gt);
        fflush(stdout);
        if (s + 1 == nsizes && !quick) {
            for (int i = 0; i < nthreads; i++)
                throughput(vi, n, threads[i]);
        }
        if (n >= 5000 && !quick)
            snapshots(vi, n, dir);
        if (n >= 5000 && rows_mem)
            rows_memory(&vi, n, &gt[0], dir); /* destroys vi */
        vindex_destroy(vi);

        if (compare) {
            int auto_kind = (int)st.kind;
            for (int kind = 0; kind < 3; kind++) {
                if (kind == auto_kind)
                    continue;
                vindex_opts fo = o;
                fo.quant_min = kind >= 1 ? 1 : SIZE_MAX;
                fo.ann_min = kind == 2 ? 1 : SIZE_MAX;
                vindex *fv = build(n, &fo, &per_add);
                vindex_get_stats(fv, &st);
                measure(fv, kinds[kind], n, gt);
                vindex_destroy(fv);
            }
        }
        if (with_hnsw && n >= 1000)
            hnsw(n, &gt[MODE_PLAIN]);
        for (int m = 0; m < NMODES; m++) {
            free(gt[m].ids);
            free(gt[m].kth);
        }
    }
    if (quick)
        goto out;

    /* embed_text on a 2 KB text, a typical memory. */
    static char text[2048];
    static const char *words[] = {"the",     "agent",    "remembered", "that", "deploy", "failed",
                                  "because", "postgres", "was",        "down", "on",     "tuesday"};
    size_t pos = 0;
    while (pos + 16 < sizeof(text)) {
        const char *wd = words[(size_t)(uniform() * 12) % 12];
        size_t l = strlen(wd);
        memcpy(text + pos, wd, l);
        pos += l;
        text[pos++] = ' ';
    }
    float e[EMBED_DEFAULT_DIM];
    double *t = malloc((size_t)NQ * sizeof(double));
    for (int q = 0; q < NQ; q++) {
        double a = now_us();
        embed_text(text, pos, EMBED_DEFAULT_DIM, e);
        t[q] = now_us() - a;
    }
    printf("embed_text 2 KB, dim 384: p50 %.1f us  p99 %.1f us\n", pct(t, NQ, 0.5),
           pct(t, NQ, 0.99));
    free(t);
out:
    free(X);
    free(M);
    free(Q);
    dataset_destroy(ds);
    return 0;
}
