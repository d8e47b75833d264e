/* tests/unit/test_vindex_kernels.c: the distance kernels at every level the CPU has: the
 * AVX2 versions against the portable ones (bit-identical where vkernel.h says so, within the
 * stated bound for vk_dot) on random inputs of awkward sizes, and whole searches that must
 * return identical hits at both levels.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vindex.h"
#include "vkernel.h"

static uint64_t rs = 0x2545f4914f6cdd1dULL;

static uint64_t next(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static double unit(void)
{
    return (double)(next() >> 11) / 9007199254740992.0 - 0.5;
}

static void kernels(void)
{
    enum { MAXD = 5000, N = 9 };
    float *a = malloc(MAXD * sizeof(float)), *b = malloc(MAXD * sizeof(float));
    int8_t *codes = malloc((size_t)N * 8192);
    int16_t *q = malloc(8192 * sizeof(int16_t));
    uint64_t *bits = malloc((size_t)N * 80 * sizeof(uint64_t)), qb[80];
    int64_t d0[N], d1[N];
    uint16_t h0[N], h1[N], h2[N];
    static const size_t dims[] = {1,  3,   7,   8,   9,    15,   31,   32,   33,   63,  64,
                                  65, 100, 384, 768, 1023, 1536, 4095, 4096, 4097, 5000};
    int bad_exact = 0, bad_dot = 0, bad_sq = 0, bad_ham = 0;
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        size_t d = dims[di];
        for (int rep = 0; rep < 20; rep++) {
            double na = 0, nb = 0;
            for (size_t i = 0; i < d; i++) {
                a[i] = (float)(unit() * (rep % 3 ? 1.0 : 1e-20)); /* tiny values too */
                b[i] = (float)unit();
                na += (double)a[i] * a[i];
                nb += (double)b[i] * b[i];
            }
            vk_set_level(VK_GENERIC);
            double e0 = vk_dot_exact(a, b, d);
            float f0 = vk_dot(a, b, d);
            vk_set_level(VK_AVX2);
            double e1 = vk_dot_exact(a, b, d);
            float f1 = vk_dot(a, b, d);
            if (e0 != e1 && !(isnan(e0) && isnan(e1)))
                bad_exact++;
            double bound = (double)(d + 1) * 0x1p-24 * sqrt(na) * sqrt(nb) + 1e-30;
            if (fabs((double)f0 - e0) > bound || fabs((double)f1 - e0) > bound)
                bad_dot++;

            /* int8 codes against int16 queries, with extreme values */
            size_t stride = (d + 31) / 32 * 32;
            if (stride <= 8192) {
                for (size_t i = 0; i < stride; i++)
                    q[i] = (int16_t)(rep == 0   ? 32767
                                     : rep == 1 ? -32767
                                                : (int)(next() % 65535) - 32767);
                for (size_t v = 0; v < N; v++) {
                    for (size_t i = 0; i < stride; i++)
                        codes[v * stride + i] =
                            (int8_t)(rep < 2 ? (v % 2 ? 127 : -127) : (int)(next() % 255) - 127);
                }
                vk_set_level(VK_GENERIC);
                vk_sq8_dots(codes, stride, N, q, d0);
                vk_set_level(VK_AVX2);
                vk_sq8_dots(codes, stride, N, q, d1);
                for (size_t v = 0; v < N; v++) {
                    int64_t ref = 0;
                    for (size_t i = 0; i < stride; i++)
                        ref += (int64_t)codes[v * stride + i] * q[i];
                    bad_sq += d0[v] != ref || d1[v] != ref ||
                              vk_sq8_dot(codes + v * stride, q, stride) != ref;
                }
            }
            /* Hamming distances */
            size_t words = (d + 63) / 64;
            if (words <= 80) {
                for (size_t i = 0; i < words; i++)
                    qb[i] = next();
                for (size_t i = 0; i < N * words; i++)
                    bits[i] = rep == 0 ? ~(uint64_t)0 : next();
                vk_set_level(VK_GENERIC);
                vk_hamming(bits, words, N, qb, h0);
                vk_set_level(VK_AVX2);
                vk_hamming(bits, words, N, qb, h1);
                vk_set_level(VK_AVX512);
                vk_hamming(bits, words, N, qb, h2);
                for (size_t v = 0; v < N; v++) {
                    unsigned ref = 0;
                    for (size_t i = 0; i < words; i++)
                        for (int k = 0; k < 64; k++)
                            ref += ((bits[v * words + i] ^ qb[i]) >> k) & 1;
                    bad_ham += h0[v] != ref || h1[v] != ref || h2[v] != ref;
                }
            }
        }
    }
    CHECK_MSG(bad_exact == 0, "%d exact products differ between levels", bad_exact);
    CHECK_MSG(bad_dot == 0, "%d float products outside their bound", bad_dot);
    CHECK_MSG(bad_sq == 0, "%d int8 products wrong", bad_sq);
    CHECK_MSG(bad_ham == 0, "%d Hamming distances wrong", bad_ham);

    /* find_range: every range on random values, including the extremes */
    uint16_t *hv = malloc(1000 * sizeof(uint16_t));
    uint32_t *o0 = malloc(1000 * sizeof(uint32_t)), *o1 = malloc(1000 * sizeof(uint32_t));
    int bad_find = 0;
    for (int rep = 0; rep < 200; rep++) {
        size_t n = next() % 1000;
        for (size_t i = 0; i < n; i++)
            hv[i] = (uint16_t)(rep % 4 == 0 ? next() : next() % 40);
        unsigned lo = (unsigned)(next() % 45), hi = lo + (unsigned)(next() % 10);
        if (rep % 10 == 0)
            lo = 0, hi = 0xffff;
        if (rep % 10 == 1)
            lo = 0xfffe, hi = 0xffff;
        vk_set_level(VK_GENERIC);
        size_t m0 = vk_find_range(hv, n, lo, hi, o0);
        vk_set_level(VK_AVX2);
        size_t m1 = vk_find_range(hv, n, lo, hi, o1);
        size_t ref = 0;
        for (size_t i = 0; i < n; i++)
            ref += hv[i] >= lo && hv[i] <= hi;
        bad_find += m0 != ref || m1 != ref || memcmp(o0, o1, m0 * sizeof(uint32_t)) != 0;
        for (size_t i = 1; i < m0; i++)
            bad_find += o0[i] <= o0[i - 1];
    }
    CHECK_MSG(bad_find == 0, "%d range scans wrong", bad_find);
    free(hv);
    free(o0);
    free(o1);
    free(a);
    free(b);
    free(codes);
    free(q);
    free(bits);
}

/* encodes: sign bits at both levels match their definition; int8 codes at both levels are
 * identical, in range, within half a step (and float rounding) of the row, and the stated error
 * norm bounds the true one (summed here in long double) */
static void encodes(void)
{
    enum { MAXD = 4097 };
    float *x = malloc(MAXD * sizeof(float));
    int8_t *c0 = malloc(MAXD), *c1 = malloc(MAXD);
    static const size_t dims[] = {1, 5, 8, 9, 31, 64, 100, 384, 767, 768, 1536, 4097};
    int bad_same = 0, bad_range = 0, bad_bound = 0;
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        size_t d = dims[di];
        for (int rep = 0; rep < 40; rep++) {
            for (size_t i = 0; i < d; i++) {
                double v = unit();
                if (rep % 8 == 1)
                    v *= 1e-30; /* tiny */
                else if (rep % 8 == 2)
                    v = 0.0; /* a zero row */
                else if (rep % 8 == 3)
                    v = (double)((int64_t)(next() % 255) - 127) / 254.0; /* exact half steps */
                else if (rep % 8 == 4)
                    v = (next() & 1) ? 0x1p-149 : -0x1p-149; /* denormal: the step underflows */
                else if (rep % 8 == 5 && i % 3 == 0)
                    v = -0.0;
                x[i] = (float)v;
            }
            float a0, a1, r0, r1;
            vk_set_level(VK_GENERIC);
            vk_sq8_encode(x, d, c0, &a0, &r0);
            vk_set_level(VK_AVX2);
            vk_sq8_encode(x, d, c1, &a1, &r1);
            bad_same += memcmp(c0, c1, d) != 0 || a0 != a1 || r0 != r1;
            long double err = 0;
            for (size_t i = 0; i < d; i++) {
                long double r = (long double)x[i] - (long double)a0 * c0[i];
                err += r * r;
                /* x / a is rounded to float (2^-24 relative at up to 127.5) before rounding
                 * to the code, so a residual may pass half a step by a few millionths */
                bad_range += c0[i] < -127 || fabsl(r) > (0.5L + 0x1p-16L) * a0;
            }
            bad_bound += !(a0 > 0) || !((long double)r0 >= sqrtl(err));
        }
    }
    CHECK_MSG(bad_same == 0, "%d rows coded differently at the two levels", bad_same);
    /* sign bits: both levels against the definition, over the same awkward sizes */
    int bad_bits = 0;
    for (size_t d = 1; d <= 200; d += (d < 70 ? 1 : 13)) {
        uint64_t b0[5], b1[5];
        for (size_t i = 0; i < d; i++)
            x[i] = i % 7 == 0 ? 0.0f : i % 11 == 0 ? -0.0f : (float)unit();
        vk_set_level(VK_GENERIC);
        vk_sign_bits(x, d, b0);
        vk_set_level(VK_AVX2);
        vk_sign_bits(x, d, b1);
        for (size_t w = 0; w < (d + 63) / 64; w++) {
            uint64_t want = 0;
            for (size_t i = w * 64; i < d && i < w * 64 + 64; i++)
                want |= (uint64_t)(x[i] > 0.0f) << (i % 64);
            bad_bits += b0[w] != want || b1[w] != want;
        }
    }
    CHECK_MSG(bad_bits == 0, "%d sign-bit words wrong", bad_bits);
    CHECK_MSG(bad_range == 0, "%d codes out of range or off by more than half a step", bad_range);
    CHECK_MSG(bad_bound == 0, "%d error norms under the true error", bad_bound);
    free(x);
    free(c0);
    free(c1);
}

/* searches: one index, every kind, the same queries at both levels */
static void searches(void)
{
    enum { D = 96, NV = 3000 };
    static const vindex_opts kinds[] = {
        {.quant_min = SIZE_MAX, .ann_min = SIZE_MAX},
        {.quant_min = 1, .ann_min = SIZE_MAX},
        {.quant_min = 1, .ann_min = 1, .ann_max_candidates = 64},
    };
    float *v = malloc(D * sizeof(float));
    for (int kind = 0; kind < 3; kind++) {
        vindex_opts o = kinds[kind];
        o.dim = D;
        vindex *vi = vindex_create(&o);
        rs = 77;
        for (uint64_t id = 0; id < NV; id++) {
            for (int j = 0; j < D; j++)
                v[j] = (float)unit() + (j < 8 ? 0.5f * (float)(id % 7) : 0.0f);
            CHECK(vindex_add(vi, id, v, NULL) == 0);
        }
        int bad = 0;
        for (int t = 0; t < 40; t++) {
            for (int j = 0; j < D; j++)
                v[j] = (float)unit();
            vindex_query q = {.vec = v, .k = 1 + (size_t)t % 25};
            vindex_hit h0[25], h1[25];
            size_t n0 = 0, n1 = 0;
            vk_set_level(VK_GENERIC);
            CHECK(vindex_search(vi, &q, h0, &n0) == 0);
            vk_set_level(VK_AVX2);
            CHECK(vindex_search(vi, &q, h1, &n1) == 0);
            bad += n0 != n1 || n0 != q.k;
            for (size_t i = 0; i < n0 && i < n1; i++)
                bad += h0[i].id != h1[i].id || h0[i].similarity != h1[i].similarity;
            vk_set_level(VK_AVX512);
            CHECK(vindex_search(vi, &q, h1, &n1) == 0);
            bad += n0 != n1;
            for (size_t i = 0; i < n0 && i < n1; i++)
                bad += h0[i].id != h1[i].id || h0[i].similarity != h1[i].similarity;
        }
        CHECK_MSG(bad == 0, "kind %d: %d hits differ between kernel levels", kind, bad);
        vindex_destroy(vi);
    }
    free(v);
}

/* rotations: vk_rotate is orthogonal to within its slack (norms and inner products kept to
 * 1e-12, VK_ROT_SLACK);
 * vk_sq8_encode_d codes every coordinate within half a step (the clamp aside) and leaves the
 * exact error y - a c, and a vector rotated and coded that way has its products with a
 * rotated query within |q| |r| of the exact ones. */
static void rotations(void)
{
    static const size_t dims[] = {1, 7, 64, 96, 384, 385, 768};
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
        size_t d = dims[di];
        float *signs = malloc(VK_ROT_ROUNDS * d * sizeof(float));
        double *x = malloc(d * sizeof(double)), *q = malloc(d * sizeof(double));
        double *x0 = malloc(d * sizeof(double)), *q0 = malloc(d * sizeof(double));
        int8_t *code = malloc(d);
        vk_rot_signs(0x656e6772616d5254ULL, d, signs);
        int bad = 0;
        for (int t = 0; t < 20; t++) {
            double xn = 0, qn = 0, xq = 0;
            for (size_t j = 0; j < d; j++) {
                x0[j] = x[j] = unit() + (t % 2 ? 0.7 : 0.0); /* a common component */
                q0[j] = q[j] = unit();
                xn += x[j] * x[j], qn += q[j] * q[j], xq += x[j] * q[j];
            }
            vk_rotate(x, d, signs);
            vk_rotate(q, d, signs);
            double rxn = 0, rqn = 0, rxq = 0;
            for (size_t j = 0; j < d; j++)
                rxn += x[j] * x[j], rqn += q[j] * q[j], rxq += x[j] * q[j];
            bad += fabs(rxn - xn) > 1e-12 * xn || fabs(rqn - qn) > 1e-12 * qn ||
                   fabs(rxq - xq) > VK_ROT_SLACK * sqrt(xn * qn);
            float a;
            double *y = x0; /* code the rotated x */
            memcpy(y, x, d * sizeof(double));
            vk_sq8_encode_d(y, d, code, &a);
            double rn = 0, est = 0;
            for (size_t j = 0; j < d; j++) {
                bad += fabs(x[j] - (double)a * code[j] - y[j]) > 0 || code[j] == -128 ||
                       fabs(y[j]) > 0.5001 * a;
                rn += y[j] * y[j];
                est += q[j] * (double)a * code[j];
            }
            bad += fabs(xq - est) > sqrt(qn * rn) + VK_ROT_SLACK;
        }
        CHECK_MSG(bad == 0, "dim %zu: %d", d, bad);
        free(signs);
        free(x);
        free(q);
        free(x0);
        free(q0);
        free(code);
    }
}

int main(void)
{
    int cpu = vk_cpu_level();
    fprintf(stderr, "cpu level %d (%s)\n", cpu,
            cpu == VK_AVX512 ? "AVX-512 VPOPCNTDQ"
            : cpu == VK_AVX2 ? "AVX2"
                             : "generic only");
    CHECK(vk_set_level(VK_GENERIC) == VK_GENERIC && vk_level() == VK_GENERIC);
    CHECK(vk_set_level(99) == cpu && vk_level() == cpu);
    /* on a CPU without AVX2 (AVX-512) the higher "levels" run the best code it has: the
     * comparisons still hold */
    kernels();
    encodes();
    searches();
    rotations();
    vk_set_level(cpu);
    CHECK_RETURN();
}
