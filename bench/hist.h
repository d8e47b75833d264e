/* bench/hist.h: a latency histogram with log-linear buckets (HdrHistogram's layout).
 *
 * Values are nanoseconds. Below 2^HIST_SUB_BITS ns every value has its own bucket; above,
 * each power of two is split into 2^HIST_SUB_BITS equal buckets, so a bucket is never
 * wider than 1/128 of the values it holds: a percentile read back is within 0.4% of the
 * recorded value (the bucket's midpoint is reported). Values above about 18 minutes land in
 * the last bucket; the exact minimum, maximum and sum are kept beside the buckets.
 *
 * A hist is a plain counter array: not thread-safe, one per thread (merge them after).
 */
#ifndef ENGRAM_BENCH_HIST_H
#define ENGRAM_BENCH_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 7

typedef struct hist hist;

/* hist_create returns an empty histogram, or NULL when out of memory. Free with
 * hist_destroy. */
hist *hist_create(void);

/* hist_destroy frees h; NULL is a no-op. */
void hist_destroy(hist *h);

/* hist_reset empties h. */
void hist_reset(hist *h);

/* hist_record adds one value of ns nanoseconds. */
void hist_record(hist *h, uint64_t ns);

/* hist_merge adds every value of src to dst. */
void hist_merge(hist *dst, const hist *src);

/* hist_count returns how many values were recorded. */
uint64_t hist_count(const hist *h);

/* hist_min, hist_max and hist_mean return the exact smallest, largest and mean value in
 * nanoseconds; 0 when h is empty. */
uint64_t hist_min(const hist *h);
uint64_t hist_max(const hist *h);
double hist_mean(const hist *h);

/* hist_percentile returns the value at quantile q in [0, 1] (q = 0.99 for p99) in
 * nanoseconds: the midpoint of the bucket holding the ceil(q * count)-th smallest value,
 * clamped to the exact minimum and maximum. 0 when h is empty. */
uint64_t hist_percentile(const hist *h, double q);

#endif
