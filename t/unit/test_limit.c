/*
 * The adaptive limit's controller against simulated workloads (no httpd):
 * a CPU-bound service on K cores, whose service time grows once more than K
 * run at once, and a sleep-bound one, flat. Each window the simulated zone
 * runs min(limit, demand) requests and reports what it measured, with
 * multiplicative noise.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "at_limit.h"

#define S0_US 50000.0 /* service time of one request alone */
#define WINDOW_S 1.0

typedef struct {
    double cores;   /* 0: sleep-bound */
    double demand;  /* requests that want to run at once */
    double noise;   /* relative, uniform +- */
    double slowdown; /* extra factor on service time (a spike); 1 normally */
    unsigned seed;
} workload_t;

static double jitter(workload_t *wl)
{
    return 1 + wl->noise * (2.0 * rand_r(&wl->seed) / RAND_MAX - 1);
}

static at_window_t simulate(workload_t *wl, apr_uint32_t limit)
{
    at_window_t w;
    double conc = limit < wl->demand ? limit : wl->demand;
    double t = S0_US * wl->slowdown;

    if (wl->cores > 0 && conc > wl->cores) {
        t *= conc / wl->cores;
    }
    t *= jitter(wl);
    w.inflight = conc;
    w.service_us = t;
    /* A window lasts until it holds enough completions to be judged. */
    w.secs = WINDOW_S;
    if (conc * w.secs * 1e6 / t < AT_LIMIT_MIN_SAMPLES) {
        w.secs = AT_LIMIT_MIN_SAMPLES * t / (conc * 1e6);
    }
    w.completed = (apr_uint32_t)ceil(conc * w.secs * 1e6 / t * jitter(wl));
    w.limited = wl->demand > limit ? 1.0 : 0.0;
    return w;
}

static void run(at_limit_t *c, workload_t *wl, int windows)
{
    for (int i = 0; i < windows; i++) {
        at_window_t w = simulate(wl, at_limit_value(c));
        at_limit_update(c, &w);
    }
}

/* The mean and the extremes of the limit over a stretch of windows. */
static void observe(at_limit_t *c, workload_t *wl, int windows, double *mean,
                    apr_uint32_t *lo, apr_uint32_t *hi)
{
    double sum = 0;

    *lo = UINT32_MAX;
    *hi = 0;
    for (int i = 0; i < windows; i++) {
        apr_uint32_t v = at_limit_value(c);
        at_window_t w = simulate(wl, v);
        sum += v;
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
        at_limit_update(c, &w);
    }
    *mean = sum / windows;
}

static void check_settles_near_cores(double cores, apr_uint32_t start)
{
    workload_t wl = {cores, 1000, 0.03, 1, 7};
    at_limit_t c;
    double mean;
    apr_uint32_t lo, hi;

    at_limit_init(&c, start, 1, 200);
    run(&c, &wl, 60);
    observe(&c, &wl, 200, &mean, &lo, &hi);
    print_message("cores %.0f, start %u: mean limit %.2f (%u - %u)\n", cores, start,
                  mean, lo, hi);
    assert_true(mean >= 0.75 * cores && mean <= 1.25 * cores);
}

static void test_cpu_bound_settles_near_cores(void **state)
{
    (void)state;
    check_settles_near_cores(2, 4);   /* 2 x the CPUs, as limit=auto starts */
    check_settles_near_cores(4, 8);
    check_settles_near_cores(8, 16);
    check_settles_near_cores(16, 32);
    check_settles_near_cores(8, 1);   /* from below */
    check_settles_near_cores(8, 200); /* from the top */
}

static void test_sleep_bound_reaches_max(void **state)
{
    workload_t wl = {0, 1000, 0.03, 1, 11};
    at_limit_t c;
    int i;
    (void)state;

    at_limit_init(&c, 4, 1, 64);
    for (i = 0; i < 60 && at_limit_value(&c) < 64; i++) {
        at_window_t w = simulate(&wl, at_limit_value(&c));
        at_limit_update(&c, &w);
    }
    print_message("sleep-bound: limit %u after %d windows\n", at_limit_value(&c), i);
    assert_int_equal(at_limit_value(&c), 64);
    assert_true(i <= 20);
}

/* Arrivals at 1.2 x what the service can take, for 10,000 windows. CPU-bound,
 * every window has requests waiting: the limit stays in its band, at the end
 * as at the start. Sleep-bound, the 24 requests the arrivals keep busy fit
 * under a limit of 24: the limit stops where nobody waits and never creeps
 * on, although latency never rises. */
static void test_no_creep_under_mild_overload(void **state)
{
    workload_t cpu = {4, 1000, 0.05, 1, 3};
    workload_t flat = {0, 24, 0.05, 1, 4};
    at_limit_t c;
    double mean_first, mean_last;
    apr_uint32_t lo, hi, lo2, hi2;
    (void)state;

    at_limit_init(&c, 8, 1, 100);
    run(&c, &cpu, 50);
    observe(&c, &cpu, 500, &mean_first, &lo, &hi);
    run(&c, &cpu, 9000);
    observe(&c, &cpu, 500, &mean_last, &lo2, &hi2);
    print_message("CPU-bound, 1.2x: mean %.2f (%u - %u), after 10,000 windows %.2f (%u - %u)\n",
                  mean_first, lo, hi, mean_last, lo2, hi2);
    assert_true(mean_last >= 3 && mean_last <= 5);
    assert_true(fabs(mean_last - mean_first) < 0.5);

    at_limit_init(&c, 8, 1, 1000);
    run(&c, &flat, 10000);
    observe(&c, &flat, 100, &mean_last, &lo2, &hi2);
    print_message("sleep-bound, demand 24: after 10,000 windows %.2f (%u - %u)\n",
                  mean_last, lo2, hi2);
    assert_true(lo2 >= 24 && hi2 <= 48);
}

/* A spike (for 20 windows the service is three times slower and contends
 * for 2 cores, say another program took the machine) brings the limit down;
 * it must not leave it stuck low. */
static void test_recovers_after_spike(void **state)
{
    workload_t wl = {0, 1000, 0.03, 1, 5};
    at_limit_t c;
    apr_uint32_t during;
    int i;
    (void)state;

    at_limit_init(&c, 4, 1, 64);
    run(&c, &wl, 40);
    assert_int_equal(at_limit_value(&c), 64);
    wl.slowdown = 3;
    wl.cores = 2; /* contention: more running only makes each slower */
    run(&c, &wl, 20);
    during = at_limit_value(&c);
    assert_true(during <= 16);
    wl.slowdown = 1;
    wl.cores = 0;
    for (i = 0; i < 60 && at_limit_value(&c) < 64; i++) {
        run(&c, &wl, 1);
    }
    print_message("spike: limit %u during, back to %u after %d windows\n", during,
                  at_limit_value(&c), i);
    assert_int_equal(at_limit_value(&c), 64);
    assert_true(i <= 30);
}

/* One window whose mean service time is wrecked by a single huge sample
 * moves the limit by at most one step. */
static void test_one_outlier_one_step_at_most(void **state)
{
    workload_t wl = {8, 1000, 0.0, 1, 9};
    at_limit_t c;
    at_window_t w;
    apr_uint32_t before, after;
    (void)state;

    at_limit_init(&c, 16, 1, 200);
    run(&c, &wl, 100);
    before = at_limit_value(&c);
    w = simulate(&wl, before);
    w.service_us = (w.service_us * (w.completed - 1) + 100 * S0_US) / w.completed;
    w.completed -= 1; /* the slow one took a slot for a long time */
    at_limit_update(&c, &w);
    after = at_limit_value(&c);
    print_message("outlier: %u -> %u\n", before, after);
    assert_true(after >= before - (before / 10 > 1 ? before / 10 : 1) - 1
                && after <= before + (before / 10 > 1 ? before / 10 : 1) + 1);
}

/* Windows where demand stays below the limit never raise it. */
static void test_light_load_never_raises(void **state)
{
    workload_t wl = {0, 3, 0.03, 1, 13};
    at_limit_t c;
    (void)state;

    at_limit_init(&c, 8, 1, 64);
    run(&c, &wl, 1000);
    assert_int_equal(at_limit_value(&c), 8);
    assert_int_equal(c.changes, 0);
}

/* A switch from a sleep-bound to a CPU-bound service and back: the limit
 * follows within 12 windows down and 8 up (6 and 4 s with half-second
 * windows). */
static void test_follows_a_switch(void **state)
{
    workload_t wl = {0, 1000, 0.03, 1, 17};
    at_limit_t c;
    int down, up;
    (void)state;

    at_limit_init(&c, 4, 1, 64);
    run(&c, &wl, 40);
    assert_int_equal(at_limit_value(&c), 64);
    wl.cores = 4;
    for (down = 0; down < 100 && at_limit_value(&c) > 5; down++) {
        run(&c, &wl, 1);
    }
    wl.cores = 0;
    for (up = 0; up < 100 && at_limit_value(&c) < 64; up++) {
        run(&c, &wl, 1);
    }
    print_message("switch: down to <= 5 in %d windows, back to 64 in %d\n", down, up);
    assert_true(down <= 12);
    /* 10 windows when a failed step down was followed by the usual hold;
     * the climb starts at once when throughput fell with concurrency. */
    assert_true(up <= 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_bound_settles_near_cores),
        cmocka_unit_test(test_sleep_bound_reaches_max),
        cmocka_unit_test(test_no_creep_under_mild_overload),
        cmocka_unit_test(test_recovers_after_spike),
        cmocka_unit_test(test_one_outlier_one_step_at_most),
        cmocka_unit_test(test_light_load_never_raises),
        cmocka_unit_test(test_follows_a_switch),
    };

    return cmocka_run_group_tests_name("limit", tests, NULL, NULL);
}
