/* tests/unit/test_vfaiss.c: the FAISS wrapper: recall@10 of HNSW32 against brute force on
 * structured data (x = W z + 0.3 noise, z in R^32, normalized), consecutive labels, a flat
 * index that equals brute force, efSearch changes, serialization round trips that search
 * identically, concurrent searches, the caller's OpenMP setting left
 * alone, and the errors: bad factory strings, indexes that need training, damaged bytes.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vfaiss.h"

enum { N = 10000, D = 128, NQ = 200, LATENT = 32, K = 10 };

static uint64_t rs = 0x853c49e6748fea9bULL;

static double uni(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return ((double)(rs >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
    return sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni());
}

static float W[D * LATENT];
static float *X, *Q;
static int64_t truth[NQ][K];

static void gen(float *out)
{
    double z[LATENT], s = 0;
    for (int j = 0; j < LATENT; j++)
        z[j] = gauss();
    for (int i = 0; i < D; i++) {
        double x = 0.3 * gauss();
        for (int j = 0; j < LATENT; j++)
            x += W[i * LATENT + j] * z[j];
        out[i] = (float)x;
        s += x * x;
    }
    for (int i = 0; i < D; i++)
        out[i] = (float)(out[i] / sqrt(s));
}

static float dot(const float *a, const float *b)
{
    float s = 0;
    for (int i = 0; i < D; i++)
        s += a[i] * b[i];
    return s;
}

/* The exact top K of every query by inner product (ties to the lower label). */
static void brute_force(void)
{
    for (int q = 0; q < NQ; q++) {
        float best[K];
        for (int k = 0; k < K; k++) {
            best[k] = -INFINITY;
            truth[q][k] = -1;
        }
        for (int i = 0; i < N; i++) {
            float s = dot(Q + (size_t)q * D, X + (size_t)i * D);
            if (s <= best[K - 1])
                continue;
            int k = K - 1;
            while (k > 0 && best[k - 1] < s) {
                best[k] = best[k - 1];
                truth[q][k] = truth[q][k - 1];
                k--;
            }
            best[k] = s;
            truth[q][k] = i;
        }
    }
}

/* recall@K of f over the queries; the labels and similarities of every query go to
 * labels/sims when not NULL (NQ x K). */
static double recall(const vfaiss *f, int64_t *labels, float *sims)
{
    size_t hit = 0;
    for (int q = 0; q < NQ; q++) {
        int64_t l[K];
        float s[K];
        int rc = vfaiss_search(f, Q + (size_t)q * D, K, l, s);
        CHECK_MSG(rc == 0, "search %d", rc);
        for (int a = 0; a < K; a++)
            for (int b = 0; b < K; b++)
                hit += l[a] == truth[q][b];
        for (int a = 1; a < K; a++)
            CHECK(s[a - 1] >= s[a]); /* best first */
        if (labels)
            memcpy(labels + (size_t)q * K, l, sizeof(l));
        if (sims)
            memcpy(sims + (size_t)q * K, s, sizeof(s));
    }
    return (double)hit / (NQ * K);
}

static void test_errors(void)
{
    char err[256] = "";
    vfaiss *f = (vfaiss *)1;
    int rc = vfaiss_create(D, "HNSW32,NoSuchStorage", 64, &f, err, sizeof(err));
    CHECK_MSG(rc == VFAISS_E_FAISS, "rc %d", rc);
    CHECK(f == NULL);
    CHECK_STR_CONTAINS(err, "HNSW32,NoSuchStorage");
    CHECK_MSG(strlen(err) > strlen("FAISS factory 'HNSW32,NoSuchStorage': "), "err '%s'", err);
    CHECK(vfaiss_last_error()[0] != '\0');

    err[0] = '\0';
    CHECK(vfaiss_create(D, "IVF16,Flat", 64, &f, err, sizeof(err)) == VFAISS_E_TRAIN);
    CHECK_STR_CONTAINS(err, "training");
    CHECK(vfaiss_create(D, "IDMap,Flat", 64, &f, err, sizeof(err)) == VFAISS_E_TRAIN);
    CHECK(vfaiss_create(0, "Flat", 64, &f, err, sizeof(err)) == -EINVAL);
    CHECK(vfaiss_create(D, "", 64, &f, err, sizeof(err)) == -EINVAL);
    CHECK(vfaiss_create(D, NULL, 64, &f, NULL, 0) == -EINVAL);
    CHECK(vfaiss_create(D, "Flat", -1, &f, err, sizeof(err)) == -EINVAL);

    /* bytes that are not a serialized index */
    static const char junk[64] = "not an index at all";
    CHECK(vfaiss_deserialize(junk, sizeof(junk), 0, &f, err, sizeof(err)) == VFAISS_E_CORRUPT);
    CHECK(f == NULL);
    CHECK(vfaiss_deserialize(junk, 3, 0, &f, err, sizeof(err)) == VFAISS_E_CORRUPT);
    CHECK(vfaiss_deserialize(NULL, 0, 0, &f, err, sizeof(err)) == VFAISS_E_CORRUPT);
    vfaiss_destroy(NULL);
}

static void test_small(void)
{
    char err[256];
    vfaiss *f = NULL;
    CHECK(vfaiss_create(D, "HNSW16", 0, &f, err, sizeof(err)) == 0);
    CHECK(vfaiss_ef(f) == 16); /* 0 selects FAISS's default */
    CHECK(vfaiss_count(f) == 0 && vfaiss_dim(f) == D);
    CHECK(strcmp(vfaiss_factory(f), "HNSW16") == 0);
    int64_t l[20];
    float s[20];
    /* an empty index finds nothing */
    CHECK(vfaiss_search(f, X, 20, l, s) == 0);
    CHECK(l[0] == -1 && isinf(s[0]) && s[0] < 0);
    CHECK(vfaiss_add(f, 5, X) == 0);
    CHECK(vfaiss_add(f, 0, X) == 0);
    CHECK(vfaiss_search(f, X + 2 * D, 20, l, s) == 0);
    CHECK(l[0] == 2 && fabsf(s[0] - 1.0f) < 1e-5f);
    for (int i = 0; i < 20; i++)
        CHECK(i < 5 ? l[i] >= 0 && l[i] < 5 : l[i] == -1 && isinf(s[i]) && s[i] < 0);
    CHECK(vfaiss_search(f, X, 0, l, s) == 0);
    CHECK(vfaiss_set_ef(f, 0) == -EINVAL);
    vfaiss_destroy(f);
}

/* A flat index is brute force, labels are consecutive over several adds, efSearch does not
 * apply. */
static void test_flat(void)
{
    char err[256];
    vfaiss *f = NULL;
    CHECK(vfaiss_create(D, "Flat", 64, &f, err, sizeof(err)) == 0);
    CHECK(vfaiss_ef(f) == 0);
    CHECK(vfaiss_set_ef(f, 100) == 0 && vfaiss_ef(f) == 0);
    CHECK(vfaiss_add(f, 1000, X) == 0 && vfaiss_count(f) == 1000);
    CHECK(vfaiss_add(f, 1, X + (size_t)1000 * D) == 0 && vfaiss_count(f) == 1001);
    CHECK(vfaiss_add(f, N - 1001, X + (size_t)1001 * D) == 0 && vfaiss_count(f) == N);
    CHECK(vfaiss_bytes(f) >= (size_t)N * D * 4);
    /* every stored vector finds itself first under its label */
    for (int i = 0; i < N; i += 97) {
        int64_t l[1];
        float s[1];
        CHECK(vfaiss_search(f, X + (size_t)i * D, 1, l, s) == 0);
        CHECK_MSG(l[0] == i, "vector %d found as %lld", i, (long long)l[0]);
    }
    double r = recall(f, NULL, NULL);
    CHECK_MSG(r >= 0.999, "flat recall %.4f", r);
    vfaiss_destroy(f);
}

typedef struct par {
    const vfaiss *f;
    int q0;
    int64_t labels[NQ / 2][K];
    float sims[NQ / 2][K];
    int rc;
} par;

static void *search_half(void *arg)
{
    par *p = arg;
    for (int rep = 0; rep < 5; rep++)
        for (int q = 0; q < NQ / 2; q++) {
            int rc = vfaiss_search(p->f, Q + (size_t)(p->q0 + q) * D, K, p->labels[q], p->sims[q]);
            if (rc)
                p->rc = rc;
        }
    return NULL;
}

static void test_hnsw(void)
{
    char err[256];
    vfaiss *f = NULL;
    int rc = vfaiss_create(D, "HNSW32,Flat", 64, &f, err, sizeof(err));
    CHECK_MSG(rc == 0, "%s", err);
    if (rc)
        return;
    CHECK(vfaiss_ef(f) == 64);
    CHECK(vfaiss_add(f, N / 2, X) == 0 && vfaiss_count(f) == N / 2);
    CHECK(vfaiss_add(f, N - N / 2, X + (size_t)(N / 2) * D) == 0 && vfaiss_count(f) == N);
    size_t bytes = vfaiss_bytes(f);
    CHECK_MSG(bytes >= (size_t)N * (D * 4 + 32 * 2 * 4) && bytes < (size_t)N * (D * 4 + 1024),
              "bytes %zu", bytes);

    /* the caller's OpenMP setting survives a search */
    omp_set_num_threads(3);
    static int64_t l64[NQ * K], l64b[NQ * K], l1[NQ * K];
    static float s64[NQ * K], s64b[NQ * K];
    double r64 = recall(f, l64, s64);
    CHECK(omp_get_max_threads() == 3);
    omp_set_num_threads(1);
    fprintf(stderr, "HNSW32,Flat %d x %d: recall@%d %.4f at efSearch 64\n", N, D, K, r64);
    CHECK_MSG(r64 >= 0.95, "recall %.4f", r64);
    for (int i = 0; i < NQ * K; i++)
        CHECK(l64[i] >= 0 && l64[i] < N);

    /* efSearch: 1 (k bounds it to 10) loses neighbours; back at 64 the answers return */
    CHECK(vfaiss_set_ef(f, 1) == 0 && vfaiss_ef(f) == 1);
    double r1 = recall(f, l1, NULL);
    CHECK(vfaiss_set_ef(f, 256) == 0 && vfaiss_ef(f) == 256);
    double r256 = recall(f, NULL, NULL);
    fprintf(stderr, "efSearch 1: %.4f, 256: %.4f\n", r1, r256);
    CHECK_MSG(r1 < r64 && r256 >= r64, "recall %.4f / %.4f / %.4f", r1, r64, r256);
    CHECK(memcmp(l1, l64, sizeof(l1)) != 0);
    CHECK(vfaiss_set_ef(f, 64) == 0);
    recall(f, l64b, s64b);
    CHECK(memcmp(l64, l64b, sizeof(l64)) == 0 && memcmp(s64, s64b, sizeof(s64)) == 0);

    /* concurrent searches give the serial answers */
    par *p = calloc(2, sizeof(*p));
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        p[t].f = f;
        p[t].q0 = t * (NQ / 2);
        pthread_create(&th[t], NULL, search_half, &p[t]);
    }
    for (int t = 0; t < 2; t++) {
        pthread_join(th[t], NULL);
        CHECK(p[t].rc == 0);
        CHECK(memcmp(p[t].labels, l64 + (size_t)t * (NQ / 2) * K, sizeof(p[t].labels)) == 0);
        CHECK(memcmp(p[t].sims, s64 + (size_t)t * (NQ / 2) * K, sizeof(p[t].sims)) == 0);
    }
    free(p);

    /* round trip through a buffer: the same answers, factory and efSearch */
    void *buf = NULL;
    size_t len = 0;
    CHECK(vfaiss_serialize(f, &buf, &len) == 0);
    CHECK(buf && len > (size_t)N * D * 4);
    vfaiss *g = NULL;
    rc = vfaiss_deserialize(buf, len, 0, &g, err, sizeof(err));
    CHECK_MSG(rc == 0, "%d %s", rc, err);
    if (g) {
        CHECK(vfaiss_count(g) == N && vfaiss_dim(g) == D && vfaiss_ef(g) == 64);
        CHECK(strcmp(vfaiss_factory(g), "HNSW32,Flat") == 0);
        CHECK(vfaiss_bytes(g) == vfaiss_bytes(f));
        recall(g, l64b, s64b);
        CHECK(memcmp(l64, l64b, sizeof(l64)) == 0 && memcmp(s64, s64b, sizeof(s64)) == 0);
        /* a deserialized index takes more vectors under the next labels */
        int64_t l[1];
        float s[1];
        CHECK(vfaiss_add(g, 1, Q) == 0 && vfaiss_count(g) == N + 1);
        CHECK(vfaiss_search(g, Q, 1, l, s) == 0 && l[0] == N);
        vfaiss_destroy(g);
        g = NULL;
    }
    /* an explicit efSearch overrides the saved one */
    CHECK(vfaiss_deserialize(buf, len, 1, &g, err, sizeof(err)) == 0);
    if (g) {
        CHECK(vfaiss_ef(g) == 1);
        recall(g, l64b, NULL);
        CHECK(memcmp(l1, l64b, sizeof(l1)) == 0);
        vfaiss_destroy(g);
        g = NULL;
    }
    /* cut short: refused, never half read */
    rc = vfaiss_deserialize(buf, len / 2, 0, &g, err, sizeof(err));
    CHECK_MSG(rc == VFAISS_E_CORRUPT && g == NULL, "truncated: %d", rc);
    rc = vfaiss_deserialize(buf, 40, 0, &g, err, sizeof(err));
    CHECK_MSG(rc == VFAISS_E_CORRUPT && g == NULL, "header only: %d", rc);
    /* FAISS's bytes damaged where it notices: its index type tag */
    unsigned char *raw = buf;
    size_t at = 24 + strlen("HNSW32,Flat");
    raw[at] ^= 0x55;
    rc = vfaiss_deserialize(buf, len, 0, &g, err, sizeof(err));
    CHECK_MSG(rc == VFAISS_E_CORRUPT && g == NULL, "damaged: %d", rc);
    CHECK_STR_CONTAINS(err, "FAISS cannot read");
    free(buf);

    vfaiss_destroy(f);
}

int main(void)
{
    for (int i = 0; i < D * LATENT; i++)
        W[i] = (float)(gauss() / sqrt((double)LATENT));
    X = malloc((size_t)N * D * sizeof(float));
    Q = malloc((size_t)NQ * D * sizeof(float));
    if (!X || !Q)
        return 2;
    for (int i = 0; i < N; i++)
        gen(X + (size_t)i * D);
    for (int q = 0; q < NQ; q++)
        gen(Q + (size_t)q * D);
    brute_force();
    test_errors();
    test_small();
    test_flat();
    test_hnsw();
    free(X);
    free(Q);
    CHECK_RETURN();
}
