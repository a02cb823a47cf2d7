/*
 * Latency histograms with fixed buckets, for shared memory: no pointers,
 * no allocation when a sample is added. Percentiles are estimated by linear
 * interpolation inside the bucket that holds them, and never exceed the
 * largest sample seen.
 */
#ifndef AT_HIST_H
#define AT_HIST_H

#include <apr.h>

#define AT_HIST_BUCKETS 20

typedef struct {
    apr_uint64_t count[AT_HIST_BUCKETS]; /* per bucket, not cumulative */
    apr_uint64_t n;
    apr_uint64_t sum_us;
    apr_int64_t max_us; /* the largest sample */
} at_hist_t;

/* Upper bound of bucket i in microseconds; the last bucket has no bound
 * (returns -1, "+Inf"). */
apr_int64_t at_hist_bound_us(int i);

void at_hist_add(at_hist_t *h, apr_int64_t us);
void at_hist_merge(at_hist_t *into, const at_hist_t *from);

/* The q-quantile (0 < q <= 1) in microseconds, at most max_us; 0 for an
 * empty histogram. */
apr_int64_t at_hist_quantile(const at_hist_t *h, double q);

#endif
