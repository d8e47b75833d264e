/* bench/test_bench_units.c: unit tests of engram-bench's histogram, data set, ground truth
 * and Prometheus reader (no server needed). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tests/unit/check.h"
#include "dataset.h"
#include "hist.h"
#include "scrape.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Percentiles read back from the histogram against the exact order statistics of a
 * heavy-tailed sample spanning 1 us .. 10 s. */
static void test_hist_accuracy(void)
{
    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof(*v));
    hist *h = hist_create();
    CHECK(v && h);
    if (!v || !h)
        return;
    uint64_t s = 7;
    for (size_t i = 0; i < N; i++) {
        double u = dataset_rng_uniform(&s);
        v[i] = (uint64_t)(1000.0 * pow(10.0, 7.0 * u * u)); /* 1 us .. 10 s, skewed low */
        hist_record(h, v[i]);
    }
    qsort(v, N, sizeof(*v), cmp_u64);
    CHECK(hist_count(h) == N);
    CHECK(hist_min(h) == v[0]);
    CHECK(hist_max(h) == v[N - 1]);
    const double qs[] = {0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999};
    for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
        size_t rank = (size_t)ceil(qs[k] * N);
        double exact = (double)v[rank - 1];
        double got = (double)hist_percentile(h, qs[k]);
        CHECK_MSG(fabs(got - exact) <= exact * 0.005, "q %g: exact %.0f, histogram %.0f", qs[k],
                  exact, got);
    }
    /* merging two halves equals recording everything in one */
    hist *a = hist_create(), *b = hist_create();
    CHECK(a && b);
    if (a && b) {
        for (size_t i = 0; i < N; i++)
            hist_record(i % 2 ? a : b, v[i]);
        hist_merge(a, b);
        CHECK(hist_count(a) == N);
        CHECK(hist_percentile(a, 0.99) == hist_percentile(h, 0.99));
        CHECK(fabs(hist_mean(a) - hist_mean(h)) < 1e-6 * hist_mean(h));
    }
    hist_destroy(a);
    hist_destroy(b);
    /* small exact values and an empty histogram */
    hist_reset(h);
    CHECK(hist_percentile(h, 0.5) == 0);
    for (uint64_t x = 1; x <= 100; x++)
        hist_record(h, x);
    CHECK(hist_percentile(h, 0.5) == 50);
    CHECK(hist_percentile(h, 0.99) == 99);
    hist_record(h, UINT64_MAX / 2); /* past the last bucket: clamped, still counted */
    CHECK(hist_count(h) == 101);
    CHECK(hist_max(h) == UINT64_MAX / 2);
    hist_destroy(h);
    free(v);
}

/* Generation is deterministic per index, normalized, and independent of blocking, for every
 * synthetic kind. */
static void test_dataset_vectors_kind(dataset_kind kind)
{
    size_t dim = 96;
    dataset *ds = dataset_create(kind, 42, dim);
    dataset *ds2 = dataset_create(kind, 42, dim);
    dataset *other = dataset_create(kind, 43, dim);
    float *blk = malloc(50 * dim * sizeof(float)), *one = malloc(dim * sizeof(float));
    float *q = malloc(dim * sizeof(float));
    CHECK(ds && ds2 && other && blk && one && q);
    if (!ds || !ds2 || !other || !blk || !one || !q)
        goto out;
    CHECK(dataset_get_kind(ds) == kind && dataset_size(ds) == SIZE_MAX);
    CHECK(dataset_vectors(ds, 3, 100, 50, blk) == 0);
    CHECK(dataset_vectors(ds2, 3, 137, 1, one) == 0);
    double diff = 0, norm = 0;
    for (size_t j = 0; j < dim; j++) {
        diff += fabs(one[j] - blk[37 * dim + j]);
        norm += (double)one[j] * one[j];
    }
    CHECK_MSG(diff < 1e-4, "%s: block and single generation differ by %g", dataset_kind_name(kind),
              diff);
    CHECK(fabs(norm - 1.0) < 1e-4);
    CHECK(dataset_vectors(other, 3, 137, 1, q) == 0);
    CHECK(fabs(dataset_dot(q, one, dim) - 1.0f) > 1e-3); /* another seed, another vector */
    CHECK(dataset_queries(ds, 3, 37, 1, q) == 0);
    CHECK(fabs(dataset_dot(q, one, dim) - 1.0f) > 1e-3); /* queries are not memories */
    /* structure: neighbours are much closer than random pairs of i.i.d. vectors would be */
    float best = -1;
    for (size_t r = 0; r < 50; r++) {
        float d = dataset_dot(q, blk + r * dim, dim);
        best = d > best ? d : best;
    }
    CHECK_MSG(best > 0.3f, "%s: best similarity %g: data has no structure", dataset_kind_name(kind),
              best);

    char content[DATASET_CONTENT_MAX];
    size_t n = dataset_content(ds, 3, 12345, content);
    uint64_t idx = 0;
    CHECK(n > 20 && strlen(content) == n);
    CHECK(dataset_parse_index(content, n, &idx) > 0 && idx == 12345);
    CHECK(dataset_parse_index("no number # here", 16, &idx) == 0);
    char text[64];
    uint64_t s = 1;
    CHECK(dataset_text_query(ds, &s, text) > 3);
out:
    free(blk);
    free(one);
    free(q);
    dataset_destroy(ds);
    dataset_destroy(ds2);
    dataset_destroy(other);
}

static void test_dataset_vectors(void)
{
    for (int k = 0; k < DATASET_TEXT; k++)
        test_dataset_vectors_kind((dataset_kind)k);
    /* the data are the same bits on every CPU: these values were computed on an AVX-512
     * machine and the test passes with OpenBLAS forced to any core type (earlier versions
     * summed W z with OpenBLAS's sgemm, whose kernel, and so the data's last bits, depended
     * on the CPU) */
    dataset *ds = dataset_create(DATASET_GAUSSIAN, 42, 96);
    float v[96], q[96];
    CHECK(ds && dataset_vectors(ds, 3, 137, 1, v) == 0 && dataset_queries(ds, 3, 37, 1, q) == 0);
    CHECK(v[0] == 0x1.542e92p-8f && v[1] == -0x1.0f5d3p-3f && v[3] == 0x1.791056p-3f);
    CHECK(q[5] == 0x1.652702p-9f);
    dataset_destroy(ds);
    dataset_kind k;
    CHECK(dataset_kind_parse("relu", &k) == 0 && k == DATASET_RELU);
    CHECK(dataset_kind_parse("nope", &k) == -EINVAL);
    CHECK(strcmp(dataset_kind_name(DATASET_TEXT), "text") == 0);
    CHECK(dataset_create(DATASET_TEXT, 1, 96) == NULL); /* text comes from files */
}

/* What each kind is for: the shape the README describes, measured on 4,000 memories at 768
 * dimensions; prints each kind's mean pairwise cosine. */
static void test_dataset_shapes(void)
{
    size_t dim = 768, n = 4000;
    float *x = malloc(n * dim * sizeof(float));
    CHECK(x != NULL);
    for (int k = 0; x && k < DATASET_TEXT; k++) {
        dataset *ds = dataset_create((dataset_kind)k, 1, dim);
        CHECK(ds && dataset_vectors(ds, 0, 0, n, x) == 0);
        double mc = dataset_mean_cosine(x, n, dim);
        size_t negative = 0, zero = 0, dups = 0;
        for (size_t i = 0; i < n * dim; i++)
            negative += x[i] < 0, zero += x[i] == 0;
        /* exact duplicates among the first 500 memories */
        for (size_t i = 1; i < 500; i++)
            for (size_t j = 0; j < i; j++)
                if (memcmp(x + i * dim, x + j * dim, dim * sizeof(float)) == 0) {
                    dups++;
                    break;
                }
        printf("dataset %-12s 768-d: mean pairwise cosine %.3f, components negative %.1f%%, "
               "zero %.1f%%, exact duplicates %zu of 500\n",
               dataset_kind_name((dataset_kind)k), mc, 100.0 * (double)negative / (double)(n * dim),
               100.0 * (double)zero / (double)(n * dim), dups);
        fflush(stdout);
        switch ((dataset_kind)k) {
        case DATASET_ANISOTROPIC:
            CHECK_MSG(mc > 0.6 && mc < 0.8, "anisotropic mean cosine %.3f", mc);
            break;
        case DATASET_RELU:
            CHECK_MSG(negative == 0, "relu: %zu negative components", negative);
            CHECK_MSG(mc > 0.5, "relu mean cosine %.3f", mc);
            break;
        case DATASET_CLUSTERED:
            CHECK_MSG(dups > 0, "clustered: no exact duplicate among 500");
            break;
        default:
            CHECK_MSG(fabs(mc) < 0.1, "%s mean cosine %.3f", dataset_kind_name((dataset_kind)k),
                      mc);
            break;
        }
        if (k != DATASET_CLUSTERED)
            CHECK(dups == 0);
        dataset_destroy(ds);
    }
    /* spectral: the first tenth of the dimensions holds most of the variance */
    dataset *ds = dataset_create(DATASET_SPECTRAL, 1, dim);
    if (x && ds && dataset_vectors(ds, 0, 0, n, x) == 0) {
        double head = 0, all = 0;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < dim; j++) {
                double v = (double)x[i * dim + j] * x[i * dim + j];
                all += v;
                head += j < dim / 10 ? v : 0;
            }
        printf("dataset spectral: the first 10%% of the dimensions hold %.1f%% of the variance\n",
               100 * head / all);
        fflush(stdout);
        CHECK_MSG(head / all > 0.7, "spectral: the first 10%% of dimensions hold %.2f", head / all);
    }
    dataset_destroy(ds);
    free(x);
    /* text: the loader's errors */
    dataset *t = NULL;
    char err[256];
    CHECK(dataset_load_text("/nonexistent-dir", 1, &t, err, sizeof(err)) == DATASET_E_TEXT);
    CHECK(t == NULL && strstr(err, "text-dataset.sh") != NULL);
    CHECK(dataset_open("bogus", 1, 96, NULL, &t, err, sizeof(err)) == -EINVAL);
}

/* The text loader on a tiny data set written here in the script's format. */
static void test_dataset_text(void)
{
    char dir[] = "/tmp/bench-text-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    size_t dim = 4, nv = 3, nq = 2;
    char path[256];
    snprintf(path, sizeof(path), "%s/dataset.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"dim\": %zu, \"vectors\": %zu, \"queries\": %zu}\n", dim, nv, nq);
    fclose(f);
    float v[12] = {1, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0, 1}, qv[8] = {0, 1, 0, 0, 0.6f, 0.8f, 0, 0};
    snprintf(path, sizeof(path), "%s/vectors.f32", dir);
    f = fopen(path, "wb");
    fwrite(v, sizeof(float), 12, f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/queries.f32", dir);
    f = fopen(path, "wb");
    fwrite(qv, sizeof(float), 8, f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/sentences.txt", dir);
    f = fopen(path, "w");
    fputs("The first sentence.\nA second sentence here.\nThird one, longer words.\n", f);
    fclose(f);

    dataset *ds = NULL;
    char err[256] = "";
    int rc = dataset_open("text", 1, 768, dir, &ds, err, sizeof(err));
    CHECK_MSG(rc == 0, "text: %d %s", rc, err);
    if (rc == 0) {
        CHECK(dataset_dim(ds) == dim && dataset_size(ds) == nv && dataset_query_size(ds) == nq);
        float out[16];
        CHECK(dataset_vectors(ds, 0, 1, 4, out) == 0);                       /* rows 1, 2, 0, 1 */
        CHECK(fabsf(out[1] - 0.6f) < 1e-6f && fabsf(out[2] - 0.8f) < 1e-6f); /* normalized */
        CHECK(out[7] == 1 && out[8] == 1 && out[13] == out[1]);
        CHECK(dataset_queries(ds, 0, 1, 1, out) == 0 && out[0] == 0.6f);
        char content[DATASET_CONTENT_MAX];
        dataset_content(ds, 0, 4, content);
        CHECK_MSG(strcmp(content, "bench memory #4 t0: A second sentence here.") == 0, "%s",
                  content);
        char tq[64];
        uint64_t s = 3;
        CHECK(dataset_text_query(ds, &s, tq) > 0 && strchr(tq, ' '));
        dataset_truth tr = {0};
        float q2[4] = {0, 0.6f, 0.8f, 0};
        CHECK(dataset_truth_init(&tr, ds, 0, 3, q2, 1, 2, NULL) == 0);
        CHECK(tr.idx[0] == 1 && fabsf(tr.sim[0] - 1.0f) < 1e-6f);
        dataset_truth_fini(&tr);
        CHECK(fabs(dataset_mean_cosine(v, 3, 4)) < 1e-12); /* orthogonal rows */
        float same[8] = {0.6f, 0.8f, 0, 0, 0.6f, 0.8f, 0, 0};
        CHECK(fabs(dataset_mean_cosine(same, 2, 4) - 1.0) < 1e-6);
    }
    dataset_destroy(ds);
    /* a vectors file of the wrong size */
    snprintf(path, sizeof(path), "%s/vectors.f32", dir);
    f = fopen(path, "wb");
    fwrite(v, sizeof(float), 11, f);
    fclose(f);
    CHECK(dataset_load_text(dir, 1, &ds, err, sizeof(err)) == DATASET_E_TEXT && !ds);
    CHECK(strstr(err, "expected 3 rows") != NULL);
    const char *names[] = {"dataset.json", "vectors.f32", "queries.f32", "sentences.txt"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* The blocked sgemm ground truth against a naive scan, with generated and given bases. */
static void test_truth(void)
{
    size_t dim = 64, n = 5000, nq = 20, k = 10;
    dataset *ds = dataset_create(DATASET_GAUSSIAN, 5, dim);
    float *base = malloc(n * dim * sizeof(float)), *q = malloc(nq * dim * sizeof(float));
    dataset_truth a = {0}, b = {0};
    CHECK(ds && base && q);
    if (!ds || !base || !q)
        goto out;
    CHECK(dataset_vectors(ds, 0, 0, n, base) == 0);
    CHECK(dataset_queries(ds, 0, 0, nq, q) == 0);
    CHECK(dataset_truth_init(&a, ds, 0, n, q, nq, k, NULL) == 0);
    CHECK(dataset_truth_init(&b, ds, 0, n, q, nq, k, base) == 0);
    CHECK(dataset_truth_init(&(dataset_truth){0}, ds, 0, 5, q, nq, k, base) == -EINVAL);
    for (size_t i = 0; i < nq; i++) {
        /* naive: the k best by repeated maximum */
        char *taken = calloc(n, 1);
        for (size_t j = 0; j < k && taken; j++) {
            float bs = -INFINITY;
            size_t bi = 0;
            for (size_t r = 0; r < n; r++) {
                float d = dataset_dot(q + i * dim, base + r * dim, dim);
                if (!taken[r] && d > bs) {
                    bs = d;
                    bi = r;
                }
            }
            taken[bi] = 1;
            CHECK_MSG(a.idx[i * k + j] == bi, "query %zu rank %zu: %u, naive %zu", i, j,
                      a.idx[i * k + j], bi);
            CHECK(fabsf(a.sim[i * k + j] - bs) < 1e-4f);
            CHECK(b.idx[i * k + j] == a.idx[i * k + j]);
        }
        free(taken);
    }
out:
    dataset_truth_fini(&a);
    dataset_truth_fini(&b);
    free(base);
    free(q);
    dataset_destroy(ds);
}

static void test_scrape_value(void)
{
    const char *body = "# HELP x\n# TYPE engram_process_resident_bytes gauge\n"
                       "engram_process_resident_bytes 123456789\n"
                       "engram_request_duration_seconds_sum{method=\"memory.search\"} 1.5\n"
                       "engram_request_duration_seconds_sum{method=\"memory.store\"} 2.5\n"
                       "engram_index_vectors_total 9\n";
    double v = 0;
    CHECK(scrape_value(body, "engram_process_resident_bytes", NULL, &v) && v == 123456789.0);
    CHECK(
        scrape_value(body, "engram_request_duration_seconds_sum", "method=\"memory.store\"", &v) &&
        v == 2.5);
    CHECK(!scrape_value(body, "engram_index_vectors", NULL, &v));
    CHECK(!scrape_value(body, "engram_request_duration_seconds_sum", "method=\"memory.get\"", &v));
}

int main(void)
{
    test_hist_accuracy();
    test_dataset_vectors();
    test_dataset_shapes();
    test_dataset_text();
    test_truth();
    test_scrape_value();
    CHECK_RETURN();
}
