/* index/vkernel.c: distance kernels (see vkernel.h): AVX2/FMA versions (and an AVX-512 one of
 * the Hamming pass) compiled with __attribute__((target)) so the rest of the build stays
 * generic x86-64, selected at run time, and portable C versions that produce the same
 * results (except vk_dot, whose summation order differs and whose callers bound the
 * error).
 *
 * Overflow. vk_sq8_dot multiplies int8 codes (|c| <= 127) by int16 queries (|q| <= 32767):
 * one vpmaddwd lane adds two products (at most 8,322,418) and a lane accumulates one pair
 * per 16 dimensions, so an int32 lane is safe for 256 pairs: the AVX2 loop folds its lanes
 * into an int64 every 4096 dimensions.
 */
#include "vkernel.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define VK_X86 1
#include <immintrin.h>
#endif

static atomic_int cur_level = -1;

/* vk_cpu_level returns the best level this CPU supports. */
int vk_cpu_level(void)
{
#ifdef VK_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("popcnt"))
        return VK_GENERIC;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq"))
        return VK_AVX512;
    return VK_AVX2;
#endif
    return VK_GENERIC;
}

/* vk_level returns the level in use (detected on first use). */
int vk_level(void)
{
    int l = atomic_load_explicit(&cur_level, memory_order_relaxed);
    if (l < 0) {
        l = vk_cpu_level();
        atomic_store_explicit(&cur_level, l, memory_order_relaxed);
    }
    return l;
}

/* vk_set_level selects level, clamped to [VK_GENERIC, vk_cpu_level()]. */
int vk_set_level(int level)
{
    int max = vk_cpu_level();
    if (level > max)
        level = max;
    if (level < VK_GENERIC)
        level = VK_GENERIC;
    atomic_store_explicit(&cur_level, level, memory_order_relaxed);
    return level;
}

/* ---- portable versions ---- */

static float dot_c(const float *a, const float *b, size_t dim)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= dim; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < dim; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* combine8 is the fixed final order of the eight partial sums of vk_dot_exact. */
static double combine8(const double *s)
{
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static double dot_exact_c(const float *a, const float *b, size_t dim)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        for (int j = 0; j < 8; j++)
            s[j] += (double)a[i + j] * b[i + j];
    }
    for (; i < dim; i++)
        s[i % 8] += (double)a[i] * b[i];
    return combine8(s);
}

/* sq8_scale returns the step of the int8 code of a row whose largest magnitude is m: m / 127,
 * or m itself when that underflows (denormal rows), or 1 for a zero row. */
static float sq8_scale(float m)
{
    float a = m / 127.0f;
    if (!(a > 0.0f))
        a = m > 0.0f ? m : 1.0f;
    return a;
}

/* sq8_code rounds f half away from zero and clamps it to [-127, 127]. */
static int sq8_code(float f)
{
    float r = f >= 0 ? f + 0.5f : f - 0.5f;
    /* clamped before the conversion, which is undefined out of range; NaN codes as 0 */
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    return r == r ? (int)r : 0;
}

/* sq8_finish turns the eight partial sums of squared coding errors into *rn: the error norm
 * rounded up (a relative 1e-9 covers the summation's own rounding, far larger than it). */
static void sq8_finish(const double *s, float a, float *scale, float *rn)
{
    float e = (float)(sqrt(combine8(s)) * (1.0 + 1e-9));
    *scale = a;
    *rn = nextafterf(e, INFINITY);
}

/* The residual x - a c is computed in double, where a c is exact (24 by 7 bits); its
 * squares go to eight partial sums by index mod 8, as in vk_dot_exact. The build disables
 * floating-point contraction in this library, so both versions round the same operations. */
static void sq8_encode_c(const float *x, size_t dim, int8_t *code, float *scale, float *rn)
{
    float m = 0.0f;
    for (size_t j = 0; j < dim; j++) {
        float v = fabsf(x[j]);
        if (v > m)
            m = v;
    }
    float a = sq8_scale(m);
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < dim; j++) {
        int c = sq8_code(x[j] / a);
        code[j] = (int8_t)c;
        double r = (double)x[j] - (double)a * (double)c;
        s[j % 8] += r * r;
    }
    sq8_finish(s, a, scale, rn);
}

static void sign_bits_c(const float *x, size_t dim, uint64_t *bits)
{
    memset(bits, 0, (dim + 63) / 64 * sizeof(uint64_t));
    for (size_t j = 0; j < dim; j++)
        if (x[j] > 0.0f)
            bits[j / 64] |= (uint64_t)1 << (j % 64);
}

/* Products are at most 127 * 32767 in magnitude, so an int32 holds the sum of 512: summed
 * in segments of 512, then in int64. stride is a multiple of 32. */
static int64_t sq8_dot_c(const int8_t *c, const int16_t *q, size_t stride)
{
    int64_t total = 0;
    for (size_t seg = 0; seg < stride; seg += 512) {
        size_t len = stride - seg < 512 ? stride - seg : 512;
#ifdef __SSE2__
        /* baseline x86-64: widen the codes to int16 and multiply-add pairs (pmaddwd); four
         * int32 lanes of at most 128 products each */
        __m128i acc = _mm_setzero_si128();
        for (size_t i = 0; i < len; i += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(c + seg + i));
            __m128i lo = _mm_srai_epi16(_mm_unpacklo_epi8(x, x), 8);
            __m128i hi = _mm_srai_epi16(_mm_unpackhi_epi8(x, x), 8);
            acc = _mm_add_epi32(
                acc, _mm_madd_epi16(lo, _mm_loadu_si128((const __m128i *)(q + seg + i))));
            acc = _mm_add_epi32(
                acc, _mm_madd_epi16(hi, _mm_loadu_si128((const __m128i *)(q + seg + i + 8))));
        }
        int32_t lanes[4];
        _mm_storeu_si128((__m128i *)lanes, acc);
        total += (int64_t)lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
        int32_t s = 0;
        for (size_t i = 0; i < len; i++)
            s += (int32_t)c[seg + i] * q[seg + i];
        total += s;
#endif
    }
    return total;
}

static void hamming_c(const uint64_t *codes, size_t words, size_t n, const uint64_t *q,
                      uint16_t *out)
{
    for (size_t v = 0; v < n; v++) {
        const uint64_t *c = codes + v * words;
        unsigned h = 0;
        for (size_t w = 0; w < words; w++) {
            uint64_t x = c[w] ^ q[w];
            /* SWAR popcount: __builtin_popcountll without -mpopcnt is a library call */
            x = x - ((x >> 1) & 0x5555555555555555ULL);
            x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
            x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
            h += (unsigned)((x * 0x0101010101010101ULL) >> 56);
        }
        out[v] = (uint16_t)h;
    }
}

static size_t find_range_c(const uint16_t *h, size_t n, unsigned lo, unsigned hi, uint32_t *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (h[i] >= lo && h[i] <= hi)
            out[m++] = (uint32_t)i;
    }
    return m;
}

/* ---- AVX2 versions ---- */

#ifdef VK_X86
#define AVX2 __attribute__((target("avx2,fma,popcnt")))

AVX2 static float hsum_ps(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

AVX2 static float dot_avx2(const float *a, const float *b, size_t dim)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= dim; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= dim; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < dim; i++)
        s += a[i] * b[i];
    return s;
}

/* Lane j of lo holds the partial sum of indexes = j (mod 8), of hi those = j + 4: the same
 * sums in the same order as dot_exact_c, since every product is exact in double. */
AVX2 static double dot_exact_avx2(const float *a, const float *b, size_t dim)
{
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    size_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        __m256d a0 = _mm256_cvtps_pd(_mm_loadu_ps(a + i));
        __m256d b0 = _mm256_cvtps_pd(_mm_loadu_ps(b + i));
        __m256d a1 = _mm256_cvtps_pd(_mm_loadu_ps(a + i + 4));
        __m256d b1 = _mm256_cvtps_pd(_mm_loadu_ps(b + i + 4));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a0, b0));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(a1, b1));
    }
    double s[8];
    _mm256_storeu_pd(s, lo);
    _mm256_storeu_pd(s + 4, hi);
    for (; i < dim; i++)
        s[i % 8] += (double)a[i] * b[i];
    return combine8(s);
}

AVX2 static int64_t hsum_epi32_64(__m256i v)
{
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v));
    __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1));
    __m256i s = _mm256_add_epi64(lo, hi);
    __m128i x = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(x) + _mm_extract_epi64(x, 1);
}

/* sq8_seg returns the eight int32 lane sums of the product over [0, len) dimensions, len a
 * multiple of 32 and at most 4096 (see the overflow note in the file comment). */
AVX2 static __m256i sq8_seg(const int8_t *c, const int16_t *q, size_t len)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    for (size_t i = 0; i < len; i += 32) {
        __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + i)));
        __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + i + 16)));
        s0 = _mm256_add_epi32(s0,
                              _mm256_madd_epi16(a, _mm256_loadu_si256((const __m256i *)(q + i))));
        s1 = _mm256_add_epi32(
            s1, _mm256_madd_epi16(b, _mm256_loadu_si256((const __m256i *)(q + i + 16))));
    }
    /* s0 and s1 each hold at most len / 32 pairs per lane: their sum is safe for len <= 4096
     * (256 pairs) */
    return _mm256_add_epi32(s0, s1);
}

AVX2 static int64_t sq8_dot_avx2(const int8_t *c, const int16_t *q, size_t stride)
{
    if (stride <= 4096)
        return hsum_epi32_64(sq8_seg(c, q, stride)); /* lanes fit int32, their sum may not */
    int64_t total = 0;
    for (size_t seg = 0; seg < stride; seg += 4096) {
        size_t len = stride - seg < 4096 ? stride - seg : 4096;
        total += hsum_epi32_64(sq8_seg(c + seg, q + seg, len));
    }
    return total;
}

AVX2 static void sq8_dots_avx2(const int8_t *codes, size_t stride, size_t n, const int16_t *q,
                               int64_t *out)
{
    for (size_t v = 0; v < n; v++)
        out[v] = sq8_dot_avx2(codes + v * stride, q, stride);
}

/* popcount of the bytes of 256 bits through a nibble table (no AVX2 popcount instruction):
 * byte counts, summed into 64-bit lanes by vpsadbw. */
AVX2 static __m256i popcnt_bytes(__m256i x)
{
    const __m256i lut = _mm256_setr_epi8(0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, 0, 1, 1, 2,
                                         1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    return _mm256_add_epi8(_mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4)),
                           _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)));
}

AVX2 static void hamming_avx2(const uint64_t *codes, size_t words, size_t n, const uint64_t *q,
                              uint16_t *out)
{
    size_t full = words / 4 * 4;
    for (size_t v = 0; v < n; v++) {
        const uint64_t *c = codes + v * words;
        __m256i acc = _mm256_setzero_si256();
        size_t w = 0;
        /* byte counts reach at most 8 per block: sum up to 31 blocks before vpsadbw */
        while (w < full) {
            size_t stop = full - w > 31 * 4 ? w + 31 * 4 : full;
            __m256i bytes = _mm256_setzero_si256();
            for (; w < stop; w += 4) {
                __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(c + w)),
                                             _mm256_loadu_si256((const __m256i *)(q + w)));
                bytes = _mm256_add_epi8(bytes, popcnt_bytes(x));
            }
            acc = _mm256_add_epi64(acc, _mm256_sad_epu8(bytes, _mm256_setzero_si256()));
        }
        __m128i x = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        uint64_t h = (uint64_t)_mm_cvtsi128_si64(x) + (uint64_t)_mm_extract_epi64(x, 1);
        for (; w < words; w++)
            h += (uint64_t)__builtin_popcountll(c[w] ^ q[w]);
        out[v] = (uint16_t)h;
    }
}

/* AVX-512 with VPOPCNTDQ: a popcount instruction on 64-bit lanes, eight words at a time; a
 * code's last words come in through a masked load (masked-out lanes read nothing, so never
 * past the end of the codes). */
#define AVX512 __attribute__((target("avx512f,avx512vpopcntdq")))

/* The sums of the 64-bit lanes of a, b, c and d, in that order. */
AVX512 static void hsum4_epi64(__m512i a, __m512i b, __m512i c, __m512i d, uint16_t *out)
{
    /* per 128-bit block j: {a[2j] + a[2j + 1], b[2j] + b[2j + 1]}, and the same of c, d */
    __m512i ab = _mm512_add_epi64(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    __m512i cd = _mm512_add_epi64(_mm512_unpacklo_epi64(c, d), _mm512_unpackhi_epi64(c, d));
    /* blocks {ab0 + ab2, ab1 + ab3, cd0 + cd2, cd1 + cd3} */
    __m512i w =
        _mm512_add_epi64(_mm512_shuffle_i64x2(ab, cd, 0x44), _mm512_shuffle_i64x2(ab, cd, 0xee));
    /* block 0: {a, b} in full, block 2: {c, d} */
    __m512i z = _mm512_add_epi64(w, _mm512_shuffle_i64x2(w, w, 0xb1));
    __m128i lo = _mm512_castsi512_si128(z), hi = _mm512_extracti32x4_epi32(z, 2);
    out[0] = (uint16_t)_mm_cvtsi128_si64(lo);
    out[1] = (uint16_t)_mm_extract_epi64(lo, 1);
    out[2] = (uint16_t)_mm_cvtsi128_si64(hi);
    out[3] = (uint16_t)_mm_extract_epi64(hi, 1);
}

/* The popcount of (c ^ q) over a code's words, as 64-bit lane sums. */
AVX512 static __m512i popcnt_code(const uint64_t *c, const uint64_t *q, size_t full, size_t words,
                                  __mmask8 tail)
{
    __m512i acc = _mm512_setzero_si512();
    size_t w = 0;
    for (; w < full; w += 8) {
        __m512i x = _mm512_xor_si512(_mm512_loadu_si512(c + w), _mm512_loadu_si512(q + w));
        acc = _mm512_add_epi64(acc, _mm512_popcnt_epi64(x));
    }
    if (w < words) {
        __m512i x = _mm512_xor_si512(_mm512_maskz_loadu_epi64(tail, c + w),
                                     _mm512_maskz_loadu_epi64(tail, q + w));
        acc = _mm512_add_epi64(acc, _mm512_popcnt_epi64(x));
    }
    return acc;
}

/* Four codes at a time, whose lane sums are reduced together (hsum4_epi64): the reduction
 * of one 512-bit sum costs about as much as the popcounts of a 768-bit code. */
AVX512 static void hamming_avx512(const uint64_t *codes, size_t words, size_t n, const uint64_t *q,
                                  uint16_t *out)
{
    size_t full = words / 8 * 8;
    __mmask8 tail = (__mmask8)((1u << (words - full)) - 1u);
    size_t v = 0;
    for (; v + 4 <= n; v += 4) {
        const uint64_t *c = codes + v * words;
        hsum4_epi64(popcnt_code(c, q, full, words, tail),
                    popcnt_code(c + words, q, full, words, tail),
                    popcnt_code(c + 2 * words, q, full, words, tail),
                    popcnt_code(c + 3 * words, q, full, words, tail), out + v);
    }
    for (; v < n; v++)
        out[v] =
            (uint16_t)_mm512_reduce_add_epi64(popcnt_code(codes + v * words, q, full, words, tail));
}

AVX2 static size_t find_range_avx2(const uint16_t *h, size_t n, unsigned lo, unsigned hi,
                                   uint32_t *out)
{
    if (lo > hi || lo > 0xffff)
        return 0;
    if (hi > 0xffff)
        hi = 0xffff;
    /* unsigned 16-bit range test via the sign-flip trick: x in [lo, hi] iff
     * (x - lo) <= (hi - lo) as unsigned */
    const __m256i vlo = _mm256_set1_epi16((short)lo);
    const __m256i flip = _mm256_set1_epi16((short)0x8000);
    const __m256i lim = _mm256_set1_epi16((short)((hi - lo) ^ 0x8000));
    size_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(h + i));
        __m256i d = _mm256_xor_si256(_mm256_sub_epi16(x, vlo), flip);
        __m256i out_of = _mm256_cmpgt_epi16(d, lim);
        unsigned mask = ~(unsigned)_mm256_movemask_epi8(out_of);
        mask &= 0xaaaaaaaau; /* one bit per 16-bit lane */
        while (mask) {
            unsigned b = (unsigned)__builtin_ctz(mask) / 2;
            mask &= mask - 1;
            out[m++] = (uint32_t)(i + b);
        }
    }
    for (; i < n; i++) {
        if (h[i] >= lo && h[i] <= hi)
            out[m++] = (uint32_t)i;
    }
    return m;
}

/* The same operations as sq8_encode_c, eight dimensions at a time: max is exact, division
 * and the +-0.5 addition are the same IEEE operations, truncation is vcvttps2dq, and lane j
 * of lo (hi) accumulates the squares of indexes = j (j + 4) mod 8 in index order. */
AVX2 static void sq8_encode_avx2(const float *x, size_t dim, int8_t *code, float *scale, float *rn)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 mx = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= dim; i += 8)
        mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
    float lanes[8];
    _mm256_storeu_ps(lanes, mx);
    float m = 0.0f;
    for (int k = 0; k < 8; k++)
        if (lanes[k] > m)
            m = lanes[k];
    for (size_t j = i; j < dim; j++) {
        float v = fabsf(x[j]);
        if (v > m)
            m = v;
    }
    float a = sq8_scale(m);
    const __m256 va = _mm256_set1_ps(a), half = _mm256_set1_ps(0.5f);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256d ad = _mm256_set1_pd((double)a);
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    for (i = 0; i + 8 <= dim; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        __m256 f = _mm256_div_ps(xv, va);
        /* f >= 0 ? f + 0.5 : f - 0.5 (for -0 both truncate to 0) */
        __m256 t = _mm256_add_ps(f, _mm256_or_ps(half, _mm256_and_ps(f, signmask)));
        __m256i c = _mm256_cvttps_epi32(t);
        c = _mm256_max_epi32(_mm256_min_epi32(c, lim), nlim);
        int32_t ci[8];
        _mm256_storeu_si256((__m256i *)ci, c);
        for (int k = 0; k < 8; k++)
            code[i + k] = (int8_t)ci[k];
        __m256 cf = _mm256_cvtepi32_ps(c);
        __m256d r0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xv)),
                                   _mm256_mul_pd(ad, _mm256_cvtps_pd(_mm256_castps256_ps128(cf))));
        __m256d r1 =
            _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)),
                          _mm256_mul_pd(ad, _mm256_cvtps_pd(_mm256_extractf128_ps(cf, 1))));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(r0, r0));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(r1, r1));
    }
    double s[8];
    _mm256_storeu_pd(s, lo);
    _mm256_storeu_pd(s + 4, hi);
    for (; i < dim; i++) {
        int c = sq8_code(x[i] / a);
        code[i] = (int8_t)c;
        double r = (double)x[i] - (double)a * (double)c;
        s[i % 8] += r * r;
    }
    sq8_finish(s, a, scale, rn);
}

/* Eight comparisons per vcmpps, their signs gathered by vmovmskps (NaN compares false). */
AVX2 static void sign_bits_avx2(const float *x, size_t dim, uint64_t *bits)
{
    memset(bits, 0, (dim + 63) / 64 * sizeof(uint64_t));
    const __m256 zero = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= dim; i += 8) {
        unsigned m =
            (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_GT_OQ));
        bits[i / 64] |= (uint64_t)m << (i % 64);
    }
    for (; i < dim; i++)
        if (x[i] > 0.0f)
            bits[i / 64] |= (uint64_t)1 << (i % 64);
}
#endif

/* ---- dispatch ---- */

static bool use_avx2(void)
{
#ifdef VK_X86
    return vk_level() >= VK_AVX2;
#else
    return false;
#endif
}

/* vk_dot returns the approximate float inner product (error bound in vkernel.h). */
float vk_dot(const float *a, const float *b, size_t dim)
{
#ifdef VK_X86
    if (use_avx2())
        return dot_avx2(a, b, dim);
#endif
    return dot_c(a, b, dim);
}

/* vk_dot_exact returns the level-independent double inner product. */
double vk_dot_exact(const float *a, const float *b, size_t dim)
{
#ifdef VK_X86
    if (use_avx2())
        return dot_exact_avx2(a, b, dim);
#endif
    return dot_exact_c(a, b, dim);
}

/* vk_sq8_dot returns the exact product of one code with q. */
int64_t vk_sq8_dot(const int8_t *code, const int16_t *q, size_t stride)
{
#ifdef VK_X86
    if (use_avx2())
        return sq8_dot_avx2(code, q, stride);
#endif
    return sq8_dot_c(code, q, stride);
}

/* vk_sq8_dots computes n consecutive products. */
void vk_sq8_dots(const int8_t *codes, size_t stride, size_t n, const int16_t *q, int64_t *out)
{
#ifdef VK_X86
    if (use_avx2()) {
        sq8_dots_avx2(codes, stride, n, q, out);
        return;
    }
#endif
    for (size_t v = 0; v < n; v++)
        out[v] = sq8_dot_c(codes + v * stride, q, stride);
}

/* vk_hamming computes n consecutive Hamming distances. */
void vk_hamming(const uint64_t *codes, size_t words, size_t n, const uint64_t *q, uint16_t *out)
{
#ifdef VK_X86
    if (vk_level() >= VK_AVX512) {
        hamming_avx512(codes, words, n, q, out);
        return;
    }
    if (use_avx2()) {
        hamming_avx2(codes, words, n, q, out);
        return;
    }
#endif
    hamming_c(codes, words, n, q, out);
}

/* vk_find_range lists the indexes whose value lies in [lo, hi]. */
size_t vk_find_range(const uint16_t *h, size_t n, unsigned lo, unsigned hi, uint32_t *out)
{
#ifdef VK_X86
    if (use_avx2())
        return find_range_avx2(h, n, lo, hi, out);
#endif
    return find_range_c(h, n, lo, hi, out);
}

/* vk_sq8_encode codes one row (see vkernel.h). */
void vk_sq8_encode(const float *x, size_t dim, int8_t *code, float *scale, float *rn)
{
#ifdef VK_X86
    if (use_avx2()) {
        sq8_encode_avx2(x, dim, code, scale, rn);
        return;
    }
#endif
    sq8_encode_c(x, dim, code, scale, rn);
}

/* vk_rot_signs draws the signs with splitmix64 (see vkernel.h). */
void vk_rot_signs(uint64_t seed, size_t dim, float *signs)
{
    uint64_t z = seed;
    for (size_t i = 0; i < VK_ROT_ROUNDS * dim; i++) {
        uint64_t v = (z += 0x9e3779b97f4a7c15ULL);
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
        v ^= v >> 31;
        signs[i] = (v >> 63) ? -1.0f : 1.0f;
    }
}

/* fwht transforms the n (a power of two) doubles at x: unnormalized Walsh-Hadamard, then a
 * scale by 1/sqrt(n). The butterflies of one stage are independent, so the inner loop
 * vectorizes; the order of operations per element is fixed, so the result does not depend
 * on whether it did. */
static void fwht(double *x, size_t n)
{
    for (size_t h = 1; h < n; h *= 2) {
        for (size_t i = 0; i < n; i += 2 * h) {
            double *a = x + i, *b = x + i + h;
            for (size_t j = 0; j < h; j++) {
                double u = a[j], v = b[j];
                a[j] = u + v;
                b[j] = u - v;
            }
        }
    }
    double s = 1.0 / sqrt((double)n);
    for (size_t j = 0; j < n; j++)
        x[j] *= s;
}

#ifdef VK_X86
/* fwht_avx2 is fwht with the stages of 4 and more butterflies a block four at a time: the
 * same additions, subtractions and products, each rounded as in fwht (no fusion), so the
 * same result. */
AVX2 static void fwht_avx2(double *x, size_t n)
{
    for (size_t h = 1; h < n; h *= 2) {
        for (size_t i = 0; i < n; i += 2 * h) {
            double *a = x + i, *b = x + i + h;
            size_t j = 0;
            for (; h >= 4 && j < h; j += 4) {
                __m256d u = _mm256_loadu_pd(a + j), v = _mm256_loadu_pd(b + j);
                _mm256_storeu_pd(a + j, _mm256_add_pd(u, v));
                _mm256_storeu_pd(b + j, _mm256_sub_pd(u, v));
            }
            for (; j < h; j++) {
                double u = a[j], v = b[j];
                a[j] = u + v;
                b[j] = u - v;
            }
        }
    }
    __m256d s = _mm256_set1_pd(1.0 / sqrt((double)n));
    size_t j = 0;
    for (; j + 4 <= n; j += 4)
        _mm256_storeu_pd(x + j, _mm256_mul_pd(_mm256_loadu_pd(x + j), s));
    for (; j < n; j++)
        x[j] *= 1.0 / sqrt((double)n);
}
#endif

/* vk_rotate: sign flips and two overlapping Hadamard blocks per round (see vkernel.h). */
void vk_rotate(double *x, size_t dim, const float *signs)
{
    size_t p = 1;
    while (p * 2 <= dim)
        p *= 2;
    void (*wht)(double *, size_t) = fwht;
#ifdef VK_X86
    if (use_avx2())
        wht = fwht_avx2;
#endif
    for (int r = 0; r < VK_ROT_ROUNDS; r++) {
        const float *sg = signs + (size_t)r * dim;
        for (size_t j = 0; j < dim; j++)
            x[j] *= (double)sg[j];
        wht(x, p);
        if (p < dim)
            wht(x + dim - p, p);
    }
}

/* vk_sq8_encode_d codes a rotated row (see vkernel.h): the scale is the float m / 127 (as
 * sq8_scale), the codes y / a rounded in double. */
void vk_sq8_encode_d(double *y, size_t dim, int8_t *code, float *scale)
{
    double m = 0.0;
    for (size_t j = 0; j < dim; j++) {
        double v = fabs(y[j]);
        if (v > m)
            m = v;
    }
    float a = sq8_scale((float)m);
    for (size_t j = 0; j < dim; j++) {
        double f = y[j] / (double)a;
        double r = f + copysign(0.5, f); /* half away from zero, without a branch */
        /* clamped before the conversion, which is undefined out of range; NaN codes as 0 */
        r = r > 127.0 ? 127.0 : r < -127.0 ? -127.0 : r;
        long c = r == r ? (long)r : 0;
        code[j] = (int8_t)c;
        y[j] -= (double)a * (double)c;
    }
    *scale = a;
}

/* vk_sign_bits sets one bit per positive coordinate (see vkernel.h). */
void vk_sign_bits(const float *x, size_t dim, uint64_t *bits)
{
#ifdef VK_X86
    if (use_avx2()) {
        sign_bits_avx2(x, dim, bits);
        return;
    }
#endif
    sign_bits_c(x, dim, bits);
}
