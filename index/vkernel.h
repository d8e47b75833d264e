/* index/vkernel.h: the distance kernels of the vector index, with AVX2/FMA versions (and an
 * AVX-512 VPOPCNTDQ Hamming pass) chosen at run time (__builtin_cpu_supports) and portable C
 * fallbacks.
 *
 * Every kernel except vk_dot gives bit-identical results at every level: integer kernels are
 * exact, and vk_dot_exact sums exact double products in one fixed order. vk_dot is the
 * fast approximate float product; callers bound its error (see vk_dot).
 *
 * Thread-safety: every function may be called from any thread at any time. vk_set_level
 * changes the level for all threads (meant for tests and benchmarks).
 */
#ifndef ENGRAM_INDEX_VKERNEL_H
#define ENGRAM_INDEX_VKERNEL_H

#include <stddef.h>
#include <stdint.h>

enum {
    VK_GENERIC = 0, /* portable C */
    VK_AVX2 = 1,    /* AVX2 + FMA + POPCNT */
    VK_AVX512 = 2,  /* VK_AVX2, and AVX-512F + VPOPCNTDQ for vk_hamming */
};

/* vk_level returns the level in use: the best the CPU supports unless vk_set_level lowered
 * it. */
int vk_level(void);

/* vk_cpu_level returns the best level this CPU supports. */
int vk_cpu_level(void);

/* vk_set_level selects a level (clamped to what the CPU supports) and returns the level in
 * effect. */
int vk_set_level(int level);

/* vk_dot returns the float inner product of a and b (dim floats each), summed in a
 * level-dependent order: its error is at most (dim + 1) * 2^-24 * |a| * |b|. */
float vk_dot(const float *a, const float *b, size_t dim);

/* vk_dot_exact returns the inner product in double: each product of two floats is exact in
 * double, and the sum runs in one fixed order (eight partial sums by index mod 8, combined
 * pairwise), so the result is the same at every level and on every CPU. */
double vk_dot_exact(const float *a, const float *b, size_t dim);

/* vk_sq8_dot returns the exact integer inner product of an int8 code and an int16 query of
 * stride entries each (stride a multiple of 32; pad both with zeros). */
int64_t vk_sq8_dot(const int8_t *code, const int16_t *q, size_t stride);

/* vk_sq8_dots writes the products of n consecutive codes (stride bytes apart) with q into
 * out. */
void vk_sq8_dots(const int8_t *codes, size_t stride, size_t n, const int16_t *q, int64_t *out);

/* vk_sq8_encode codes a row x of dim finite floats as int8: *scale = a (the largest
 * magnitude over 127), code[j] = x[j] / a rounded half away from zero and clamped to
 * [-127, 127] (the caller pads code to its stride), and *rn an upper bound of the norm of
 * the coding error x - a code, computed in double. */
void vk_sq8_encode(const float *x, size_t dim, int8_t *code, float *scale, float *rn);

/* vk_sign_bits writes the binary code of x: bit j (of word j / 64) set when x[j] > 0, the
 * rest of the (dim + 63) / 64 words zero. */
void vk_sign_bits(const float *x, size_t dim, uint64_t *bits);

/* VK_ROT_ROUNDS: rounds of the structured rotation below. */
#define VK_ROT_ROUNDS 3

/* vk_rot_signs fills signs (VK_ROT_ROUNDS * dim floats, each +1 or -1) from seed: the
 * random part of a rotation. The same seed and dim always give the same signs. */
void vk_rot_signs(uint64_t seed, size_t dim, float *signs);

/* vk_rotate applies an orthogonal transform to x (dim doubles) in place: VK_ROT_ROUNDS rounds
 * of a sign flip by signs (from vk_rot_signs) followed by normalized Walsh-Hadamard
 * transforms of the first and the last P coordinates (P the largest power of two <= dim;
 * one transform when P == dim). It spreads the variance of any direction over all
 * coordinates (as a random rotation does) in O(dim log dim). In double, the computed
 * transform is orthogonal to within about 1e-14 of |x| at any dim the index takes (the int8
 * codes' bound relies on it: VK_ROT_SLACK). One portable implementation for every kernel
 * level, so results are the same on every CPU the build runs on. */
void vk_rotate(double *x, size_t dim, const float *signs);

/* vk_sq8_encode_d codes a rotated row y of dim finite doubles as int8: *scale = a (the
 * largest magnitude over 127, rounded to float), code[j] = y[j] / a rounded half away from
 * zero and clamped to [-127, 127] (the caller pads code to its stride); y is overwritten
 * with the coding error y - a code (a code is exact in double: one rounding a coordinate).
 * One portable implementation: the same codes on every CPU. */
void vk_sq8_encode_d(double *y, size_t dim, int8_t *code, float *scale);

/* VK_ROT_SLACK: what vk_rotate's rounding may add to a vector of norm at most 2, and to a
 * product with one, with a wide margin (the bound is about 1e-14). */
#define VK_ROT_SLACK 1e-12

/* vk_hamming writes the Hamming distances between q and n consecutive binary codes of words
 * 64-bit words each into out: bits set at most 65,535 (the index uses it only for dimensions
 * below that), so a distance fits in 16 bits. */
void vk_hamming(const uint64_t *codes, size_t words, size_t n, const uint64_t *q, uint16_t *out);

/* vk_find_range writes, in increasing order, the indexes i < n with lo <= h[i] <= hi into out
 * (room for n) and returns their number. */
size_t vk_find_range(const uint16_t *h, size_t n, unsigned lo, unsigned hi, uint32_t *out);

#endif
