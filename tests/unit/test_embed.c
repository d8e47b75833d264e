/* tests/unit/test_embed.c: the built-in embedder: determinism, normalization, similarity
 * structure, input edge cases, speed on a large text, and a regression pin. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "embed.h"

#define DIM EMBED_DEFAULT_DIM

static int embed_str(const char *s, size_t dim, float *out)
{
    return embed_text(s, strlen(s), dim, out);
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static double norm(const float *a, size_t n)
{
    return sqrt(dot(a, a, n));
}

static double cosine_of(const char *x, const char *y)
{
    float a[DIM], b[DIM];
    if (embed_str(x, DIM, a) || embed_str(y, DIM, b))
        return NAN;
    return dot(a, b, DIM);
}

static bool all_zero(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i] != 0.0f)
            return false;
    }
    return true;
}

static void test_deterministic_and_normalized(void)
{
    const char *texts[] = {
        "the cat sat on the mat",
        "x",
        "A much longer sentence, with punctuation; numbers 12345 and MiXeD case words.",
        "repeat repeat repeat repeat repeat repeat repeat repeat repeat repeat repeat",
    };
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
        for (size_t dim = EMBED_MIN_DIM; dim <= EMBED_MAX_DIM; dim *= 4) {
            float *a = malloc(dim * sizeof(float)), *b = malloc(dim * sizeof(float));
            CHECK(a && b);
            if (!a || !b) {
                free(a);
                free(b);
                return;
            }
            memset(b, 0x55, dim * sizeof(float)); /* garbage the embedder must overwrite */
            CHECK(embed_str(texts[t], dim, a) == 0);
            CHECK(embed_str(texts[t], dim, b) == 0);
            CHECK_MSG(memcmp(a, b, dim * sizeof(float)) == 0, "text %zu dim %zu", t, dim);
            CHECK_MSG(fabs(norm(a, dim) - 1.0) < 1e-5, "norm %f", norm(a, dim));
            free(a);
            free(b);
        }
    }
    /* The text need not be NUL-terminated: only len bytes count. */
    float a[DIM], b[DIM];
    CHECK(embed_text("hello worldXXXX", 11, DIM, a) == 0);
    CHECK(embed_str("hello world", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
}

static void test_similarity(void)
{
    double near = cosine_of("the cat sat on the mat", "a cat sat on a mat");
    double far1 = cosine_of("the cat sat on the mat", "quarterly revenue exceeded forecasts");
    double far2 = cosine_of("the cat sat on the mat", "kubernetes pod eviction thresholds");
    fprintf(stderr, "cos near %.3f, unrelated %.3f %.3f\n", near, far1, far2);
    CHECK(near > 0.5);
    CHECK(fabs(far1) < 0.25);
    CHECK(fabs(far2) < 0.25);
    CHECK(near > far1 + 0.3 && near > far2 + 0.3);

    /* Trigrams carry spelling: an inflected form is closer than an unrelated word. */
    double infl = cosine_of("running", "runner");
    double other = cosine_of("running", "table");
    fprintf(stderr, "cos running/runner %.3f, running/table %.3f\n", infl, other);
    CHECK(infl > other + 0.08);

    /* Word order matters a little through bigrams, not a lot. */
    double swapped = cosine_of("dog bites man", "man bites dog");
    CHECK(swapped > 0.6 && swapped < 0.999);

    /* Sublinear weighting: repeating a word many times does not make it a different text. */
    double rep = cosine_of("alpha beta", "alpha alpha alpha alpha alpha alpha alpha alpha beta");
    CHECK(rep > 0.5);
}

static void test_case_and_separators(void)
{
    float a[DIM], b[DIM];
    CHECK(embed_str("Hello World", DIM, a) == 0);
    CHECK(embed_str("hello world", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
    CHECK(embed_str("HELLO   WORLD!!", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
    CHECK(embed_str("\thello,\nworld.", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
    CHECK(embed_str("helloworld", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
}

static void test_bad_input(void)
{
    float v[EMBED_MAX_DIM + 1];
    CHECK(embed_str("text", 0, v) == -EINVAL);
    CHECK(embed_str("text", EMBED_MIN_DIM - 1, v) == -EINVAL);
    CHECK(embed_str("text", EMBED_MAX_DIM + 1, v) == -EINVAL);
    CHECK(embed_str("text", EMBED_MIN_DIM, v) == 0);
    CHECK(embed_str("text", EMBED_MAX_DIM, v) == 0);
    CHECK(embed_text(NULL, 3, DIM, v) == -EINVAL);

    memset(v, 0x55, sizeof(v));
    CHECK(embed_text(NULL, 0, DIM, v) == EMBED_E_EMPTY);
    CHECK(all_zero(v, DIM));
    memset(v, 0x55, sizeof(v));
    CHECK(embed_str("", DIM, v) == EMBED_E_EMPTY);
    CHECK(all_zero(v, DIM));
    memset(v, 0x55, sizeof(v));
    CHECK(embed_str(" \t\r\n\v\f  ", DIM, v) == EMBED_E_EMPTY);
    CHECK(all_zero(v, DIM));

    /* Punctuation only still embeds (fallback to byte trigrams), and differently. */
    float a[DIM], b[DIM];
    CHECK(embed_str("!!!", DIM, a) == 0);
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    CHECK(embed_str("???", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    CHECK(embed_str(" -- ", DIM, a) == 0);
    CHECK(embed_str("\x01", DIM, a) == 0);
    /* A NUL byte inside the text is just a byte. */
    CHECK(embed_text("a\0b", 3, DIM, a) == 0);
}

static void test_utf8(void)
{
    float a[DIM], b[DIM], c[DIM];
    /* UTF-8 words stay whole and are kept as-is (no case folding outside ASCII). */
    CHECK(embed_str("café crème", DIM, a) == 0);
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    CHECK(embed_str("café crème", DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);
    CHECK(embed_str("CAFÉ crème", DIM, c) == 0);
    CHECK(dot(a, c, DIM) < 0.999); /* É is not folded to é */
    CHECK(embed_str("Café Crème", DIM, c) == 0);
    CHECK(memcmp(a, c, sizeof(a)) == 0); /* the ASCII letters are */
    CHECK(embed_str("日本語のテキスト", DIM, a) == 0);
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    CHECK(embed_str("Привет мир", DIM, a) == 0);
    CHECK(embed_str("привет мир, как дела", DIM, b) == 0);
    CHECK(dot(a, b, DIM) > 0.3);
    /* Truncated or invalid UTF-8 is bytes like any other: no crash, a direction. */
    CHECK(embed_text("caf\xc3", 4, DIM, a) == 0);
    CHECK(embed_str("\xff\xfe\xfd", DIM, a) == 0);
    CHECK(embed_str("\xc3", DIM, a) == 0);
}

static void test_large(void)
{
    size_t len = 1 << 20;
    char *text = malloc(len);
    CHECK(text != NULL);
    if (!text)
        return;
    const char *words[] = {"memory", "vector",  "index",  "tenant", "query", "the",     "a",
                           "server", "latency", "Recall", "42",     "naïve", "deadline"};
    size_t nw = sizeof(words) / sizeof(words[0]), pos = 0;
    uint64_t x = 88172645463325252ULL;
    while (pos < len) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const char *w = words[x % nw];
        for (size_t i = 0; w[i] && pos < len; i++)
            text[pos++] = w[i];
        if (pos < len)
            text[pos++] = (x >> 20) % 7 == 0 ? '.' : ' ';
    }
    float a[DIM], b[DIM];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(embed_text(text, len, DIM, a) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    fprintf(stderr, "1 MiB text embedded in %.1f ms\n", ms);
    CHECK(ms < 2000); /* generous: sanitizer builds are slow; about 10 ms optimized */
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    CHECK(embed_text(text, len, DIM, b) == 0);
    CHECK(memcmp(a, b, sizeof(a)) == 0);

    /* One 1 MiB token (no separator at all) is linear too. */
    memset(text, 'z', len);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(embed_text(text, len, DIM, a) == 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    CHECK(ms < 2000);
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    /* And 1 MiB of punctuation goes through the fallback. */
    memset(text, '#', len);
    CHECK(embed_text(text, len, DIM, a) == 0);
    CHECK(fabs(norm(a, DIM) - 1.0) < 1e-5);
    free(text);
}

/* Regression pin: these coordinates were computed once from the algorithm as written
 * (FNV-1a + splitmix64, unigram 1.0, bigram 0.5, trigram block 0.6 / sqrt(L), per-bucket
 * 1 + ln|v| above 1). A change here means every stored embedding changes: only update the
 * numbers together with a deliberate algorithm change (and a re-embedding plan). The
 * comparison is bit-exact: the embedder is meant to give the same floats on every machine. */
static void test_golden(void)
{
    static const char text[] = "Engram remembers: the quick brown fox jumps over the lazy dog "
                               "twice, the quick brown fox!";
    float v[DIM];
    CHECK(embed_str(text, DIM, v) == 0);
    static const struct {
        size_t i;
        uint32_t bits;
    } pin[] = {
        {0, 0x00000000u},   /* 0 */
        {28, 0x3e935d4cu},  /* 0.287821174 */
        {60, 0xbe2e1256u},  /* -0.169991821 */
        {99, 0xbe0b41deu},  /* -0.135993451 */
        {124, 0xbb823a97u}, /* -0.00397426961 */
        {144, 0x3dae1256u}, /* 0.0849959105 */
        {224, 0xbd0b41deu}, /* -0.0339983627 */
        {317, 0x3d2a8dfeu}, /* 0.0416393206 */
        {347, 0xbd3196adu}, /* -0.0433565862 */
        {374, 0xbd50e2cdu}, /* -0.0509975441 */
    };
    for (size_t k = 0; k < sizeof(pin) / sizeof(pin[0]); k++) {
        uint32_t bits;
        memcpy(&bits, &v[pin[k].i], sizeof(bits));
        CHECK_MSG(bits == pin[k].bits, "v[%zu] = %.9g (0x%08x), pinned 0x%08x", pin[k].i,
                  (double)v[pin[k].i], bits, pin[k].bits);
    }
    /* And every coordinate at once: FNV-1a over the little-endian bytes of the float bits
     * (computed arithmetically, so the pin holds on any byte order). */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < DIM; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof(bits));
        for (int b = 0; b < 4; b++)
            h = (h ^ ((bits >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
    }
    CHECK_MSG(h == 0x41e89e9760d15d4cULL, "vector hash %016llx", (unsigned long long)h);
}

int main(void)
{
    test_deterministic_and_normalized();
    test_similarity();
    test_case_and_separators();
    test_bad_input();
    test_utf8();
    test_large();
    test_golden();
    CHECK_RETURN();
}
