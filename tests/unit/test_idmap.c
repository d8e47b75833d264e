/* tests/unit/test_idmap.c: idmap against a reference model under random operation mixes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "idmap.h"

/* The reference: a direct-mapped table over a small key universe, so random operations
 * hit present keys often and deletions exercise backward shifting inside long clusters. */
#define UNIVERSE 4096

typedef struct ref {
    bool present[UNIVERSE];
    uint64_t value[UNIVERSE];
    size_t count;
} ref;

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

/* key_of spreads universe index i over the 64-bit range; some keys share low bits, some are
 * small sequential numbers, like real ids. */
static uint64_t key_of(size_t i)
{
    if (i % 3 == 0)
        return i; /* sequential */
    if (i % 3 == 1)
        return (uint64_t)i << 32;               /* identical low bits */
    return (uint64_t)i * 0x9e3779b97f4a7c15ULL; /* scattered */
}

/* index_of inverts key_of (UNIVERSE or more when key is not of that form). */
static size_t index_of(uint64_t key)
{
    if (key < UNIVERSE)
        return (size_t)key;
    if ((key & 0xffffffffu) == 0)
        return (size_t)(key >> 32);
    uint64_t g = 0x9e3779b97f4a7c15ULL, inv = g; /* Newton: inverse of g modulo 2^64 */
    for (int k = 0; k < 6; k++)
        inv *= 2 - g * inv;
    uint64_t i = key * inv;
    return i < UNIVERSE ? (size_t)i : UNIVERSE;
}

typedef struct walk {
    const ref *r;
    size_t seen;
    int bad;
} walk;

static int walk_fn(uint64_t key, uint64_t value, void *ctx)
{
    walk *w = ctx;
    w->seen++;
    size_t i = index_of(key);
    if (i >= UNIVERSE || key_of(i) != key || !w->r->present[i] || w->r->value[i] != value)
        w->bad++;
    return 0;
}

static int stop_fn(uint64_t key, uint64_t value, void *ctx)
{
    (void)key;
    (void)value;
    int *calls = ctx;
    return ++*calls == 3 ? 42 : 0;
}

static void compare_all(const idmap *m, const ref *r)
{
    int bad = 0;
    for (size_t i = 0; i < UNIVERSE; i++) {
        uint64_t v = 0;
        bool got = idmap_get(m, key_of(i), &v);
        if (got != r->present[i] || (got && v != r->value[i]))
            bad++;
    }
    CHECK_MSG(bad == 0, "%d keys disagree with the reference", bad);
    CHECK(idmap_count(m) == r->count);
    walk w = {r, 0, 0};
    CHECK(idmap_foreach(m, walk_fn, &w) == 0);
    CHECK(w.bad == 0);
    CHECK(w.seen == r->count);
}

static void test_random_ops(size_t hint, int rounds, int put_pct)
{
    static ref r;
    memset(&r, 0, sizeof(r));
    idmap *m = idmap_create(hint);
    CHECK(m != NULL);
    if (!m)
        return;
    for (int round = 0; round < rounds; round++) {
        for (int op = 0; op < 20000; op++) {
            size_t i = rnd() % UNIVERSE;
            uint64_t key = key_of(i);
            int what = (int)(rnd() % 100);
            if (what < put_pct) {
                uint64_t v = rnd();
                CHECK(idmap_put(m, key, v) == 0);
                if (!r.present[i])
                    r.count++;
                r.present[i] = true;
                r.value[i] = v;
            } else if (what < put_pct + 25) {
                bool was = idmap_del(m, key);
                CHECK(was == r.present[i]);
                if (r.present[i])
                    r.count--;
                r.present[i] = false;
            } else {
                uint64_t v = 0;
                bool got = idmap_get(m, key, &v);
                CHECK(got == r.present[i]);
                if (got && r.present[i])
                    CHECK(v == r.value[i]);
            }
        }
        compare_all(m, &r);
    }
    idmap_destroy(m);
}

static void test_basics(void)
{
    idmap *m = idmap_create(0);
    CHECK(m != NULL);
    CHECK(idmap_count(m) == 0);
    uint64_t v = 7;
    CHECK(!idmap_get(m, 1, &v));
    CHECK(v == 7);
    CHECK(!idmap_del(m, 1));
    CHECK(idmap_put(m, UINT64_MAX, 1) == -EINVAL);
    CHECK(!idmap_get(m, UINT64_MAX, &v));
    CHECK(!idmap_del(m, UINT64_MAX));
    CHECK(idmap_put(m, 0, 10) == 0);
    CHECK(idmap_put(m, UINT64_MAX - 1, 11) == 0);
    CHECK(idmap_get(m, 0, &v) && v == 10);
    CHECK(idmap_get(m, UINT64_MAX - 1, &v) && v == 11);
    CHECK(idmap_get(m, 0, NULL));
    CHECK(idmap_put(m, 0, 12) == 0); /* replace */
    CHECK(idmap_get(m, 0, &v) && v == 12);
    CHECK(idmap_count(m) == 2);

    /* Growth from the minimum capacity; bytes follow. */
    size_t b0 = idmap_bytes(m);
    for (uint64_t k = 100; k < 100100; k++)
        CHECK(idmap_put(m, k, k * 3) == 0);
    CHECK(idmap_count(m) == 100002);
    CHECK(idmap_bytes(m) > b0);
    CHECK(idmap_bytes(m) >= 100002 * 16);
    CHECK(idmap_bytes(m) <= 100002 * 16 * 3); /* load kept between 0.35 and 0.7 */
    int bad = 0;
    for (uint64_t k = 100; k < 100100; k++)
        bad += !(idmap_get(m, k, &v) && v == k * 3);
    CHECK(bad == 0);

    int calls = 0;
    CHECK(idmap_foreach(m, stop_fn, &calls) == 42);
    CHECK(calls == 3);

    size_t b1 = idmap_bytes(m);
    idmap_clear(m);
    CHECK(idmap_count(m) == 0);
    CHECK(idmap_bytes(m) == b1); /* keeps its memory */
    CHECK(!idmap_get(m, 500, &v));
    CHECK(idmap_put(m, 500, 1) == 0 && idmap_count(m) == 1);
    idmap_destroy(m);
    idmap_destroy(NULL);

    /* A hint sizes the table so that many puts do not grow it. */
    m = idmap_create(1000);
    CHECK(m != NULL);
    size_t bh = idmap_bytes(m);
    for (uint64_t k = 0; k < 1000; k++)
        CHECK(idmap_put(m, k, k) == 0);
    CHECK(idmap_bytes(m) == bh);
    idmap_destroy(m);
}

/* Deleting everything in a scrambled order must leave an empty, working map. */
static void test_delete_all(void)
{
    enum { N = 50000 };
    idmap *m = idmap_create(16);
    CHECK(m != NULL);
    static uint64_t keys[N];
    for (size_t i = 0; i < N; i++) {
        keys[i] = (rnd() & 0xffffff) | ((uint64_t)i << 24);
        CHECK(idmap_put(m, keys[i], i) == 0);
    }
    for (size_t i = N - 1; i > 0; i--) {
        size_t j = rnd() % (i + 1);
        uint64_t t = keys[i];
        keys[i] = keys[j];
        keys[j] = t;
    }
    int bad = 0;
    for (size_t i = 0; i < N; i++) {
        bad += !idmap_del(m, keys[i]);
        if (i % 997 == 0 && i + 1 < N)
            bad += !idmap_get(m, keys[i + 1], NULL);
    }
    CHECK(bad == 0);
    CHECK(idmap_count(m) == 0);
    idmap_destroy(m);
}

int main(void)
{
    test_basics();
    test_delete_all();
    test_random_ops(0, 10, 50);    /* grows from the minimum */
    test_random_ops(4096, 10, 30); /* more deletions than puts: sparse */
    test_random_ops(16, 10, 70);   /* dense: long probe clusters */
    CHECK_RETURN();
}
