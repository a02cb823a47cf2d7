/*
 * Fixed-bucket latency histograms.
 */
#include "at_hist.h"

/* Roughly 1-2.5-5 steps from 100us to 60s: fine where throttled requests
 * live (ms to s), bounded in size. The same bounds are the Prometheus "le"
 * labels, so they must never change once published. */
static const apr_int64_t bounds_us[AT_HIST_BUCKETS - 1] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
    250000, 500000, 1000000, 2500000, 5000000, 10000000, 20000000, 30000000,
    60000000,
};

apr_int64_t at_hist_bound_us(int i)
{
    return i >= 0 && i < AT_HIST_BUCKETS - 1 ? bounds_us[i] : -1;
}

static int bucket_of(apr_int64_t us)
{
    int lo = 0, hi = AT_HIST_BUCKETS - 1;

    /* The first bucket whose bound is >= us; the last one takes the rest. */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (us <= bounds_us[mid]) {
            hi = mid;
        }
        else {
            lo = mid + 1;
        }
    }
    return lo;
}

void at_hist_add(at_hist_t *h, apr_int64_t us)
{
    if (us < 0) {
        us = 0;
    }
    h->count[bucket_of(us)]++;
    h->n++;
    h->sum_us += (apr_uint64_t)us;
    if (us > h->max_us) {
        h->max_us = us;
    }
}

void at_hist_merge(at_hist_t *into, const at_hist_t *from)
{
    int i;

    for (i = 0; i < AT_HIST_BUCKETS; i++) {
        into->count[i] += from->count[i];
    }
    into->n += from->n;
    into->sum_us += from->sum_us;
    if (from->max_us > into->max_us) {
        into->max_us = from->max_us;
    }
}

/* Interpolating inside a bucket can land above every sample in it: the
 * estimate is capped at the largest sample seen. */
static apr_int64_t at_most_max(const at_hist_t *h, apr_int64_t us)
{
    return us > h->max_us ? h->max_us : us;
}

apr_int64_t at_hist_quantile(const at_hist_t *h, double q)
{
    double rank, seen = 0;
    int i;

    if (h->n == 0) {
        return 0;
    }
    if (q <= 0) {
        q = 0.000001;
    }
    if (q > 1) {
        q = 1;
    }
    rank = q * (double)h->n;
    for (i = 0; i < AT_HIST_BUCKETS; i++) {
        double c = (double)h->count[i];
        if (c > 0 && seen + c >= rank) {
            apr_int64_t lo = i ? bounds_us[i - 1] : 0;
            if (i == AT_HIST_BUCKETS - 1) {
                return h->max_us; /* no upper bound to interpolate towards */
            }
            return at_most_max(h, lo + (apr_int64_t)((double)(bounds_us[i] - lo)
                                                     * (rank - seen) / c));
        }
        seen += c;
    }
    return h->max_us;
}
