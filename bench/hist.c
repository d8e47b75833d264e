/* bench/hist.c: log-linear latency histogram (see hist.h). */
#include "hist.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SUB ((uint64_t)1 << HIST_SUB_BITS)
#define TOP_BIT 40 /* values up to 2^40 ns (about 18 minutes) get their own buckets */
#define NBUCKETS (SUB + (TOP_BIT - HIST_SUB_BITS + 1) * SUB)

struct hist {
    uint64_t count, min, max;
    double sum;
    uint64_t buckets[NBUCKETS];
};

static size_t bucket_of(uint64_t v)
{
    if (v < SUB)
        return (size_t)v;
    int msb = 63 - __builtin_clzll(v);
    if (msb > TOP_BIT)
        return NBUCKETS - 1;
    int shift = msb - HIST_SUB_BITS;
    /* v >> shift lies in [SUB, 2 * SUB): its low HIST_SUB_BITS bits pick the sub-bucket */
    return (size_t)(SUB + (uint64_t)shift * SUB + ((v >> shift) - SUB));
}

/* The lowest value of bucket b and its width. */
static void bucket_range(size_t b, uint64_t *lo, uint64_t *width)
{
    if (b < SUB) {
        *lo = b;
        *width = 1;
        return;
    }
    uint64_t shift = (b - SUB) / SUB;
    uint64_t sub = (b - SUB) % SUB;
    *lo = (SUB + sub) << shift;
    *width = (uint64_t)1 << shift;
}

hist *hist_create(void)
{
    hist *h = malloc(sizeof(*h));
    if (h)
        hist_reset(h);
    return h;
}

void hist_destroy(hist *h)
{
    free(h);
}

void hist_reset(hist *h)
{
    memset(h, 0, sizeof(*h));
}

void hist_record(hist *h, uint64_t ns)
{
    h->buckets[bucket_of(ns)]++;
    if (h->count == 0 || ns < h->min)
        h->min = ns;
    if (ns > h->max)
        h->max = ns;
    h->count++;
    h->sum += (double)ns;
}

void hist_merge(hist *dst, const hist *src)
{
    if (src->count == 0)
        return;
    for (size_t b = 0; b < NBUCKETS; b++)
        dst->buckets[b] += src->buckets[b];
    if (dst->count == 0 || src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
    dst->count += src->count;
    dst->sum += src->sum;
}

uint64_t hist_count(const hist *h)
{
    return h->count;
}

uint64_t hist_min(const hist *h)
{
    return h->min;
}

uint64_t hist_max(const hist *h)
{
    return h->max;
}

double hist_mean(const hist *h)
{
    return h->count ? h->sum / (double)h->count : 0.0;
}

uint64_t hist_percentile(const hist *h, double q)
{
    if (h->count == 0)
        return 0;
    if (q <= 0)
        return h->min;
    if (q >= 1)
        return h->max;
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (size_t b = 0; b < NBUCKETS; b++) {
        seen += h->buckets[b];
        if (seen >= rank) {
            uint64_t lo, width;
            bucket_range(b, &lo, &width);
            uint64_t v = lo + width / 2;
            if (v < h->min)
                v = h->min;
            if (v > h->max)
                v = h->max;
            return v;
        }
    }
    return h->max;
}
