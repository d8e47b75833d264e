/* util/heap.h: a binary heap over a caller's array of fixed-size elements, header only.
 *
 * The order is the caller's "before" relation: before(a, b) is true when a must leave the
 * heap before b, so the element at index 0 is the one no other comes before (a max-heap of
 * bounds: before = "larger"; the worst of a top k kept at the root: before = "worse").
 * before must be a strict weak order. The functions are static inline so that a constant
 * before is inlined at each use (the vector index's re-rank calls them per candidate);
 * elements are moved with memcpy and may be at most HEAP_MAX_ELEM bytes.
 *
 * Thread-safety: none of its own; the array is the caller's. No allocation, no failure.
 */
#ifndef ENGRAM_UTIL_HEAP_H
#define ENGRAM_UTIL_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define HEAP_MAX_ELEM 64

typedef bool (*heap_before_fn)(const void *a, const void *b);

static inline void *heap_at_(void *base, size_t size, size_t i)
{
    return (char *)base + i * size;
}

static inline void heap_swap_(void *base, size_t size, size_t i, size_t j)
{
    unsigned char t[HEAP_MAX_ELEM];
    memcpy(t, heap_at_(base, size, i), size);
    memcpy(heap_at_(base, size, i), heap_at_(base, size, j), size);
    memcpy(heap_at_(base, size, j), t, size);
}

/* heap_sift_down restores the order below element i of the n elements at base. */
static inline void heap_sift_down(void *base, size_t n, size_t size, size_t i,
                                  heap_before_fn before)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && before(heap_at_(base, size, l), heap_at_(base, size, m)))
            m = l;
        if (r < n && before(heap_at_(base, size, r), heap_at_(base, size, m)))
            m = r;
        if (m == i)
            return;
        heap_swap_(base, size, i, m);
        i = m;
    }
}

/* heap_sift_up moves element i up until no parent comes after it. */
static inline void heap_sift_up(void *base, size_t size, size_t i, heap_before_fn before)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(heap_at_(base, size, i), heap_at_(base, size, p)))
            return;
        heap_swap_(base, size, i, p);
        i = p;
    }
}

/* heap_make orders the n elements at base as a heap. */
static inline void heap_make(void *base, size_t n, size_t size, heap_before_fn before)
{
    for (size_t i = n / 2; i-- > 0;)
        heap_sift_down(base, n, size, i, before);
}

/* heap_push adds the element at index n (already written there) to the heap of n. */
static inline void heap_push(void *base, size_t n, size_t size, heap_before_fn before)
{
    heap_sift_up(base, size, n, before);
}

/* heap_pop moves the root to index n - 1 and restores the heap over the first n - 1
 * elements (n >= 1). */
static inline void heap_pop(void *base, size_t n, size_t size, heap_before_fn before)
{
    heap_swap_(base, size, 0, n - 1);
    heap_sift_down(base, n - 1, size, 0, before);
}

/* heap_replace_root puts the element at *elem in place of the root and restores the heap. */
static inline void heap_replace_root(void *base, size_t n, size_t size, const void *elem,
                                     heap_before_fn before)
{
    memcpy(base, elem, size);
    heap_sift_down(base, n, size, 0, before);
}

/* heap_sort sorts a heap in place so that the element that leaves first ends up last (a
 * heap whose root is the worst comes out best first). */
static inline void heap_sort(void *base, size_t n, size_t size, heap_before_fn before)
{
    for (size_t end = n; end > 1; end--)
        heap_pop(base, end, size, before);
}

#endif
