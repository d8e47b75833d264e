/* bench/test_bench_units.c: unit tests of engram-bench's histogram, data set, ground truth
 * and Prometheus reader (no server needed). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Generation is deterministic per index, normalized, and independent of blocking. */
static void test_dataset_vectors(void)
{
    size_t dim = 96;
    dataset *ds = dataset_create(42, dim);
    dataset *ds2 = dataset_create(42, dim);
    dataset *other = dataset_create(43, dim);
    float *blk = malloc(50 * dim * sizeof(float)), *one = malloc(dim * sizeof(float));
    float *q = malloc(dim * sizeof(float));
    CHECK(ds && ds2 && other && blk && one && q);
    if (!ds || !ds2 || !other || !blk || !one || !q)
        goto out;
    CHECK(dataset_vectors(ds, 3, 100, 50, blk) == 0);
    CHECK(dataset_vectors(ds2, 3, 137, 1, one) == 0);
    double diff = 0, norm = 0;
    for (size_t j = 0; j < dim; j++) {
        diff += fabs(one[j] - blk[37 * dim + j]);
        norm += (double)one[j] * one[j];
    }
    CHECK_MSG(diff < 1e-4, "block and single generation differ by %g", diff);
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
    CHECK_MSG(best > 0.3f, "best similarity %g: data has no structure", best);

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

/* The blocked sgemm ground truth against a naive scan, with generated and given bases. */
static void test_truth(void)
{
    size_t dim = 64, n = 5000, nq = 20, k = 10;
    dataset *ds = dataset_create(5, dim);
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
    test_truth();
    test_scrape_value();
    CHECK_RETURN();
}
