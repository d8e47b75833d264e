/* index/embed.c: the built-in hashed n-gram text embedder (see embed.h for the contract).
 *
 * Tokens are maximal runs of ASCII letters and digits and of bytes >= 0x80, so UTF-8 words
 * stay whole; ASCII letters are lower-cased, other bytes kept. Each token contributes:
 *   - its word unigram, weight UNIGRAM_W;
 *   - the bigram with the token before it, weight BIGRAM_W;
 *   - the byte trigrams of "^token$" (a token of L bytes has L of them), each weighted
 *     TRIGRAM_NORM / sqrt(L) (0.3 for a 4-byte word), so the trigrams of a word add up to the
 *     same L2 mass whatever its length and long words do not drown the unigrams.
 * Text without a single token byte but with some non-space bytes ("!!!", "--") falls back to
 * the trigrams of its runs of non-space bytes, so it still gets a direction.
 *
 * Feature hashing: FNV-1a 64 over the feature's bytes, seeded per feature kind so that the
 * unigram "cat" and the trigram "cat" differ, then the splitmix64 finalizer. The top 32 bits
 * choose the bucket (multiply-shift, which works for any dim), bit 0 the sign.
 *
 * Term weighting is sublinear per bucket, after accumulation: a bucket value v becomes
 * sign(v) * (1 + ln|v|) when |v| > 1 and stays v otherwise (continuous, with slope 1 at 1).
 * Counting each distinct feature would need memory proportional to the text, so this
 * approximates 1 + ln(tf) on buckets instead: exact when a bucket holds one feature, a
 * dampening of the bucket mass when features collide. Short texts (all |v| <= 1) are
 * weighted linearly.
 *
 * Determinism: one pass in text order, accumulated in double in a fixed order, no threads,
 * no SIMD reductions, and no libm call whose result may vary with the CPU or C library
 * (sqrt is correctly rounded by IEEE 754; the logarithm below uses only + - * / and
 * frexp/ldexp, which are exact). Build with fp-contraction off (GCC's -std=c11 does so;
 * clang only contracts when FMA is enabled for the target) so that FMA never changes a
 * rounding. The result is rounded to float at the end.
 *
 * Cost: linear in len (each byte is read a bounded number of times), no allocation; a
 * dim-sized double accumulator (at most 32 KiB) lives on the stack.
 */
#include "embed.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "hash.h"

#define UNIGRAM_W 1.0
#define BIGRAM_W 0.5
#define TRIGRAM_NORM 0.6

/* Per-kind seeds xor-ed into the FNV offset basis. */
#define SEED_UNIGRAM 0x0000000000000000ULL
#define SEED_BIGRAM 0x9e3779b97f4a7c15ULL
#define SEED_TRIGRAM 0x243f6a8885a308d3ULL

#define MARK_BEGIN '^' /* cannot occur inside a token: not alphanumeric and < 0x80 */
#define MARK_END '$'

static bool is_token_byte(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

static bool is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c - 'A' + 'a') : c;
}

typedef struct acc {
    double *v;
    size_t dim;
} acc;

/* add_feature adds weight * sign(h) to bucket(h); h is an already mixed hash. */
static void add_feature(acc *a, uint64_t h, double w)
{
    size_t bucket = (size_t)(((h >> 32) * (uint64_t)a->dim) >> 32);
    a->v[bucket] += (h & 1) ? -w : w;
}

/* word_hash returns the FNV-1a hash (not yet mixed) of the lower-cased bytes [s, s+n). */
static uint64_t word_hash(const unsigned char *s, size_t n)
{
    uint64_t h = HASH_FNV1A_OFFSET ^ SEED_UNIGRAM;
    for (size_t i = 0; i < n; i++)
        h = hash_fnv1a_byte(h, lower(s[i]));
    return h;
}

/* add_trigrams adds the n trigrams of "^" s[0..n) "$" (lower-cased), n >= 1. */
static void add_trigrams(acc *a, const unsigned char *s, size_t n)
{
    double w = TRIGRAM_NORM / sqrt((double)n);
    unsigned char c0 = MARK_BEGIN, c1 = lower(s[0]);
    for (size_t i = 1; i <= n; i++) {
        unsigned char c2 = i < n ? lower(s[i]) : MARK_END;
        uint64_t h = HASH_FNV1A_OFFSET ^ SEED_TRIGRAM;
        h = hash_fnv1a_byte(hash_fnv1a_byte(hash_fnv1a_byte(h, c0), c1), c2);
        add_feature(a, hash_mix64(h), w);
        c0 = c1;
        c1 = c2;
    }
}

/* embed_tokens adds the features of every token; returns the number of tokens. */
static size_t embed_tokens(acc *a, const unsigned char *s, size_t len)
{
    size_t ntok = 0, i = 0;
    uint64_t prev = 0;
    while (i < len) {
        if (!is_token_byte(s[i])) {
            i++;
            continue;
        }
        size_t start = i;
        while (i < len && is_token_byte(s[i]))
            i++;
        size_t n = i - start;
        uint64_t h = word_hash(s + start, n);
        add_feature(a, hash_mix64(h), UNIGRAM_W);
        if (ntok > 0)
            add_feature(a, hash_mix64((prev * 0x9fb21c651e98df25ULL + h) ^ SEED_BIGRAM), BIGRAM_W);
        add_trigrams(a, s + start, n);
        prev = h;
        ntok++;
    }
    return ntok;
}

/* embed_fallback adds the trigrams of every run of non-space bytes; returns the run count. */
static size_t embed_fallback(acc *a, const unsigned char *s, size_t len)
{
    size_t nrun = 0, i = 0;
    while (i < len) {
        if (is_space(s[i])) {
            i++;
            continue;
        }
        size_t start = i;
        while (i < len && !is_space(s[i]))
            i++;
        add_trigrams(a, s + start, i - start);
        nrun++;
    }
    return nrun;
}

/* ln_gt1 returns the natural logarithm of x > 1 from + - * / and exact frexp only, so that it
 * gives the same bits everywhere: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(t), t = (m-1)/(m+1), |t| < 0.172, by its series to well below double
 * precision. */
static double ln_gt1(double x)
{
    int e;
    double m = frexp(x, &e); /* m in [0.5, 1) */
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e--;
    }
    double t = (m - 1.0) / (m + 1.0), t2 = t * t, term = t, sum = 0.0;
    for (int k = 1; k <= 39; k += 2) {
        sum += term / k;
        term *= t2;
    }
    return 2.0 * sum + e * 0.69314718055994530942;
}

/* embed_text writes the L2-normalized embedding of text into out; see embed.h. Returns 0,
 * EMBED_E_EMPTY (out all zeros; also in the practically impossible case that every feature
 * cancels out) or -EINVAL for dim outside [EMBED_MIN_DIM, EMBED_MAX_DIM] or a NULL pointer
 * with len > 0. Thread-safe, allocates nothing. */
int embed_text(const char *text, size_t len, size_t dim, float *out)
{
    if (dim < EMBED_MIN_DIM || dim > EMBED_MAX_DIM || !out || (!text && len > 0))
        return -EINVAL;

    double v[EMBED_MAX_DIM];
    memset(v, 0, dim * sizeof(v[0]));
    acc a = {v, dim};
    const unsigned char *s = (const unsigned char *)text;

    if (embed_tokens(&a, s, len) == 0 && embed_fallback(&a, s, len) == 0) {
        memset(out, 0, dim * sizeof(out[0]));
        return EMBED_E_EMPTY;
    }

    double sq = 0.0;
    for (size_t i = 0; i < dim; i++) {
        double x = v[i], ax = fabs(x);
        if (ax > 1.0)
            x = x > 0 ? 1.0 + ln_gt1(ax) : -(1.0 + ln_gt1(ax));
        v[i] = x;
        sq += x * x;
    }
    if (!(sq > 0.0)) {
        memset(out, 0, dim * sizeof(out[0]));
        return EMBED_E_EMPTY;
    }
    double inv = 1.0 / sqrt(sq);
    for (size_t i = 0; i < dim; i++)
        out[i] = (float)(v[i] * inv);
    return 0;
}
