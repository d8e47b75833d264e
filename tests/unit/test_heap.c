/* tests/unit/test_heap.c: util/heap.h against sorting: a max-heap of ints built by pushes
 * and by heap_make pops in order, a bounded top k kept with heap_replace_root (its root the
 * worst) matches the best k of a sort, heap_sort leaves a heap best first, and elements of
 * several sizes (a struct of 24 bytes) move whole.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "heap.h"

static bool int_larger(const void *a, const void *b)
{
    return *(const int *)a > *(const int *)b;
}

static bool int_smaller(const void *a, const void *b)
{
    return *(const int *)a < *(const int *)b;
}

static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static int next_int(int mod)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)mod);
}

/* pushes and pops: the pops come out largest first, duplicates included */
static void test_push_pop(void)
{
    for (int n = 0; n <= 200; n += 7) {
        int *h = malloc(sizeof(int) * (size_t)(n + 1));
        int *ref = malloc(sizeof(int) * (size_t)(n + 1));
        for (int i = 0; i < n; i++) {
            h[i] = ref[i] = next_int(50);
            heap_push(h, (size_t)i, sizeof(int), int_larger);
        }
        qsort(ref, (size_t)n, sizeof(int), cmp_desc);
        bool ok = true;
        for (int i = 0; i < n; i++) {
            heap_pop(h, (size_t)(n - i), sizeof(int), int_larger);
            ok = ok && h[n - i - 1] == ref[i];
        }
        CHECK_MSG(ok, "pops of %d pushes out of order", n);
        free(h);
        free(ref);
    }
}

/* heap_make then heap_sort: a heap whose root is the smallest sorts largest first */
static void test_make_sort(void)
{
    for (int n = 1; n <= 300; n += 13) {
        int *h = malloc(sizeof(int) * (size_t)n);
        int *ref = malloc(sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++)
            h[i] = ref[i] = next_int(1000) - 500;
        heap_make(h, (size_t)n, sizeof(int), int_smaller);
        bool root_ok = true;
        for (int i = 1; i < n; i++)
            root_ok = root_ok && h[0] <= h[i];
        CHECK_MSG(root_ok, "heap_make of %d: root is not the smallest", n);
        heap_sort(h, (size_t)n, sizeof(int), int_smaller);
        qsort(ref, (size_t)n, sizeof(int), cmp_desc);
        CHECK_MSG(memcmp(h, ref, sizeof(int) * (size_t)n) == 0, "heap_sort of %d differs", n);
        free(h);
        free(ref);
    }
}

typedef struct item {
    double score;
    uint64_t id;
    uint32_t tag;
} item;

/* worse: lower score, then higher id (the ordering a top k of hits uses) */
static bool item_worse(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score;
    return x->id > y->id;
}

static int item_best_first(const void *a, const void *b)
{
    return item_worse(a, b) ? 1 : item_worse(b, a) ? -1 : 0;
}

/* a bounded top k: the root is the worst kept; a better one replaces it */
static void test_top_k(void)
{
    enum { N = 5000, K = 10 };
    item *all = malloc(sizeof(item) * N);
    item top[K];
    size_t n = 0;
    for (uint32_t i = 0; i < N; i++) {
        all[i] = (item){.score = next_int(300) / 7.0, .id = i, .tag = i * 3u};
        if (n < K) {
            top[n] = all[i];
            heap_push(top, n++, sizeof(item), item_worse);
        } else if (item_worse(top, &all[i])) {
            heap_replace_root(top, n, sizeof(item), &all[i], item_worse);
        }
    }
    heap_sort(top, n, sizeof(item), item_worse);
    qsort(all, N, sizeof(item), item_best_first);
    bool ok = n == K;
    for (size_t i = 0; i < n; i++)
        ok = ok && top[i].id == all[i].id && top[i].tag == all[i].tag &&
             top[i].score == all[i].score;
    CHECK_MSG(ok, "top %d differs from the sorted best", K);
    free(all);
}

int main(void)
{
    test_push_pop();
    test_make_sort();
    test_top_k();
    CHECK_RETURN();
}
