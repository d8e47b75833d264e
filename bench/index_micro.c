/* bench/index_micro.c: median and p99 latency of vindex_search (exact flat path) on one
 * thread, for a few index sizes at 768 dimensions, plus embed_text throughput.
 *
 * Usage: index-micro [queries per size (default 200)]. Data is structured like real
 * embeddings (x = W z + 0.3 noise, z in R^32, normalized); numbers are wall-clock.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embed.h"
#include "vindex.h"

#define DIM 768
#define LATENT 32

static uint64_t rng_s = 0x1234567;

static double uniform(void)
{
    uint64_t z = (rng_s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}

static void gen(const float *w, float *out)
{
    float z[LATENT];
    for (int j = 0; j < LATENT; j++)
        z[j] = (float)gauss();
    for (size_t i = 0; i < DIM; i++) {
        float x = (float)(0.3 * gauss());
        for (int j = 0; j < LATENT; j++)
            x += w[i * LATENT + j] * z[j];
        out[i] = x;
    }
}

typedef struct meta {
    uint32_t agent;
    float value;
} meta;

static bool keep_half(const void *m, void *ctx)
{
    (void)ctx;
    return ((const meta *)m)->agent % 2 == 0;
}

static double blend(float sim, const void *m, void *ctx)
{
    (void)ctx;
    return 0.8 * sim + 0.2 * ((const meta *)m)->value;
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

static void report(const char *what, size_t n, double *t, int nq)
{
    qsort(t, (size_t)nq, sizeof(double), cmp_double);
    size_t p99 = (size_t)ceil(0.99 * nq) - 1;
    printf("%-28s n=%-6zu median %8.1f us   p99 %8.1f us\n", what, n, t[nq / 2], t[p99]);
}

int main(int argc, char **argv)
{
    int nq = argc > 1 ? atoi(argv[1]) : 200;
    if (nq < 1)
        nq = 200;
    openblas_set_num_threads(1);

    float *w = malloc(DIM * LATENT * sizeof(float));
    float *v = malloc(DIM * sizeof(float));
    float *qs = malloc((size_t)nq * DIM * sizeof(float));
    double *t = malloc((size_t)nq * sizeof(double));
    vindex_hit hits[10];
    if (!w || !v || !qs || !t)
        return 1;
    for (size_t i = 0; i < DIM * LATENT; i++)
        w[i] = (float)(gauss() / sqrt(LATENT));
    for (int q = 0; q < nq; q++)
        gen(w, qs + (size_t)q * DIM);

    static const size_t sizes[] = {100, 5000, 50000};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        vindex *vi = vindex_create(&(vindex_opts){.dim = DIM, .meta_size = sizeof(meta)});
        if (!vi)
            return 1;
        for (size_t i = 0; i < sizes[s]; i++) {
            gen(w, v);
            meta m = {(uint32_t)i, (float)uniform()};
            if (vindex_add(vi, i + 1, v, &m))
                return 1;
        }
        for (int mode = 0; mode < 2; mode++) {
            for (int q = 0; q < nq; q++) {
                vindex_query qq = {.vec = qs + (size_t)q * DIM, .k = 10};
                if (mode == 1) {
                    qq.keep = keep_half;
                    qq.score = blend;
                    qq.score_slope = 0.8;
                    qq.score_bound = 0.2;
                }
                size_t n;
                double a = now_us();
                if (vindex_search(vi, &qq, hits, &n) || n != 10)
                    return 1;
                t[q] = now_us() - a;
            }
            report(mode ? "search k=10 keep 1/2 + score" : "search k=10", sizes[s], t, nq);
        }
        vindex_destroy(vi);
    }

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
    for (int q = 0; q < nq; q++) {
        double a = now_us();
        embed_text(text, pos, EMBED_DEFAULT_DIM, e);
        t[q] = now_us() - a;
    }
    report("embed_text 2 KB, dim 384", pos, t, nq);

    free(w);
    free(v);
    free(qs);
    free(t);
    return 0;
}
