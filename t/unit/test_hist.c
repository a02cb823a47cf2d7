/*
 * Unit tests of the latency histograms: bucket boundaries, and percentiles
 * of known distributions within the resolution of their buckets.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "at_hist.h"

/* The bucket holding us: its bounds. */
static void bucket_bounds(apr_int64_t us, apr_int64_t *lo, apr_int64_t *hi)
{
    int i;

    *lo = 0;
    for (i = 0; i < AT_HIST_BUCKETS - 1; i++) {
        if (us <= at_hist_bound_us(i)) {
            *hi = at_hist_bound_us(i);
            return;
        }
        *lo = at_hist_bound_us(i);
    }
    *hi = *lo;
}

/* An estimate is right if it falls in the same bucket as the true value. */
static void assert_same_bucket(apr_int64_t estimate, apr_int64_t truth)
{
    apr_int64_t lo, hi;

    bucket_bounds(truth, &lo, &hi);
    if (estimate < lo || estimate > hi) {
        fail_msg("estimate %lld outside [%lld, %lld] around true %lld",
                 (long long)estimate, (long long)lo, (long long)hi, (long long)truth);
    }
}

static void test_boundaries(void **state)
{
    at_hist_t h;
    (void)state;

    memset(&h, 0, sizeof(h));
    at_hist_add(&h, 0);
    at_hist_add(&h, 100);     /* on the bound: first bucket */
    at_hist_add(&h, 101);     /* second */
    at_hist_add(&h, -5);      /* clock step: counted as 0 */
    at_hist_add(&h, APR_INT64_C(3600000000)); /* an hour: the +Inf bucket */
    assert_int_equal(h.count[0], 3);
    assert_int_equal(h.count[1], 1);
    assert_int_equal(h.count[AT_HIST_BUCKETS - 1], 1);
    assert_int_equal(h.n, 5);
    assert_int_equal(at_hist_bound_us(AT_HIST_BUCKETS - 1), -1);
    for (int i = 1; i < AT_HIST_BUCKETS - 1; i++) {
        assert_true(at_hist_bound_us(i) > at_hist_bound_us(i - 1));
    }
}

static void test_empty_and_single(void **state)
{
    at_hist_t h;
    (void)state;

    memset(&h, 0, sizeof(h));
    assert_int_equal(at_hist_quantile(&h, 0.5), 0);
    at_hist_add(&h, 42000);
    assert_same_bucket(at_hist_quantile(&h, 0.5), 42000);
    assert_same_bucket(at_hist_quantile(&h, 0.99), 42000);
}

static int cmp_i64(const void *a, const void *b)
{
    apr_int64_t x = *(const apr_int64_t *)a, y = *(const apr_int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Compare estimated p50/p90/p99 with the exact ones of the same samples. */
static void check_distribution(apr_int64_t (*draw)(void))
{
    enum { N = 20000 };
    static apr_int64_t v[N];
    static const double qs[] = {0.5, 0.9, 0.99};
    at_hist_t h;

    memset(&h, 0, sizeof(h));
    for (int i = 0; i < N; i++) {
        v[i] = draw();
        at_hist_add(&h, v[i]);
    }
    qsort(v, N, sizeof(v[0]), cmp_i64);
    for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
        apr_int64_t truth = v[(size_t)(qs[k] * N) - 1];
        assert_same_bucket(at_hist_quantile(&h, qs[k]), truth);
    }
}

static apr_int64_t uniform_10_to_200ms(void)
{
    return 10000 + (apr_int64_t)(drand48() * 190000);
}

static apr_int64_t exponential_mean_50ms(void)
{
    return (apr_int64_t)(-log(1.0 - drand48()) * 50000);
}

static apr_int64_t bimodal_1ms_or_2s(void)
{
    return drand48() < 0.95 ? 1000 + (apr_int64_t)(drand48() * 500)
                            : 2000000 + (apr_int64_t)(drand48() * 100000);
}

static void test_uniform(void **state)
{
    (void)state;
    srand48(1);
    check_distribution(uniform_10_to_200ms);
}

static void test_exponential(void **state)
{
    (void)state;
    srand48(2);
    check_distribution(exponential_mean_50ms);
}

static void test_bimodal_tail(void **state)
{
    at_hist_t h;
    (void)state;

    srand48(3);
    check_distribution(bimodal_1ms_or_2s);
    /* 5% slow: p90 is fast, p99 is slow. */
    memset(&h, 0, sizeof(h));
    for (int i = 0; i < 1000; i++) {
        at_hist_add(&h, i < 950 ? 1000 : 2000000);
    }
    assert_true(at_hist_quantile(&h, 0.90) <= 1000);
    assert_true(at_hist_quantile(&h, 0.99) > 1000000);
}

static void test_merge(void **state)
{
    at_hist_t a, b;
    (void)state;

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    for (int i = 0; i < 100; i++) {
        at_hist_add(&a, 1000);
        at_hist_add(&b, 100000);
    }
    at_hist_merge(&a, &b);
    assert_int_equal(a.n, 200);
    assert_int_equal(a.sum_us, 100 * 1000 + 100 * 100000);
    assert_same_bucket(at_hist_quantile(&a, 0.25), 1000);
    assert_same_bucket(at_hist_quantile(&a, 0.75), 100000);
}

/* Waits spread below 1 s: interpolating inside the 500 ms - 1 s bucket put
 * the p99 at 990 ms when the longest wait was 939 ms. No percentile may
 * exceed the largest sample, and the largest sample is kept. */
static void test_percentiles_never_exceed_the_largest_sample(void **state)
{
    at_hist_t h, m;
    (void)state;

    memset(&h, 0, sizeof(h));
    for (int i = 0; i < 100; i++) {
        at_hist_add(&h, i < 60 ? 100000 + i * 1000 : 600000 + (i - 60) * 8500);
    }
    assert_int_equal(h.max_us, 600000 + 39 * 8500);
    for (double q = 0.5; q <= 1.0; q += 0.01) {
        assert_true(at_hist_quantile(&h, q) <= h.max_us);
    }
    assert_true(at_hist_quantile(&h, 0.99) >= 600000);
    /* The unbounded last bucket reports the largest sample, not its floor. */
    memset(&h, 0, sizeof(h));
    at_hist_add(&h, 90 * APR_INT64_C(1000000));
    assert_int_equal(at_hist_quantile(&h, 0.5), 90 * APR_INT64_C(1000000));
    /* A merge keeps the larger maximum. */
    memset(&m, 0, sizeof(m));
    at_hist_add(&m, 5000);
    at_hist_merge(&m, &h);
    assert_int_equal(m.max_us, 90 * APR_INT64_C(1000000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_empty_and_single),
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_exponential),
        cmocka_unit_test(test_bimodal_tail),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_percentiles_never_exceed_the_largest_sample),
    };

    return cmocka_run_group_tests_name("hist", tests, NULL, NULL);
}
