/*
 * What the adaptive limit's controller promises, as properties over many
 * seeds of simulated workloads (limit_sim.h), with bounds taken from its
 * targets rather than from what one run measured:
 *
 * - work bound on K cores (2 - 64): the held level settles within +-25 %
 *   of K, and stays there;
 * - work that waits: the limit climbs to max and stays near it; on a curve
 *   that bends, it gets 0.9 x the best fixed limit's throughput in the
 *   median seed, 0.85 x in nearly all;
 * - no creep: under overload, no higher than 1.25 x the cores after 2,000
 *   windows; under demand that fits, no higher than twice the demand;
 * - after the work changes (a switch, a spike, work that turns to
 *   computing while the limit is above its demand), the same within SETTLE
 *   windows.
 *
 * Each holds in at least MOST of SEEDS runs. SETTLE is S4's target of 10 s
 * in windows of 250 ms, the shortest a window lasts. Figures measured on
 * particular traces are pinned, as regression guards, in
 * test_limit_regress.c.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "limit_sim.h"

#define SEEDS 100
#define MOST 0.95
#define SETTLE 40

/* Whether a level is within +-25 % of `target`. */
static int near(apr_uint32_t level, double target)
{
    return fabs(level - target) <= 0.25 * target;
}

/* Runs `windows` windows; returns how many passed before the held level
 * came within +-25 % of `target` for good (windows + 1: never). */
static int windows_to_settle(at_limit_t *c, workload_t *wl, int windows, double target)
{
    int off = 0;

    for (int i = 0; i < windows; i++) {
        if (!near(at_limit_held(c), target)) {
            off = i + 1;
        }
        run(c, wl, 1);
    }
    return near(at_limit_held(c), target) ? off : windows + 1;
}

/* Runs until the limit reaches `level`, at most `windows`; returns how many
 * windows that took (windows + 1: never). */
static int windows_to_reach(at_limit_t *c, workload_t *wl, int windows,
                            apr_uint32_t level)
{
    for (int i = 0; i < windows; i++) {
        if (at_limit_value(c) >= level) {
            return i;
        }
        run(c, wl, 1);
    }
    return at_limit_value(c) >= level ? windows : windows + 1;
}

/* The share of seeds for which ok[] holds, printed with what it is. */
static double share(const int *ok, const char *what)
{
    int n = 0;

    for (int s = 0; s < SEEDS; s++) {
        n += ok[s] != 0;
    }
    print_message("%s: in %d of %d seeds\n", what, n, SEEDS);
    return (double)n / SEEDS;
}

static workload_t computing(double cores, unsigned seed)
{
    return workload_of(cores, 0.05, seed);
}

static workload_t waiting(unsigned seed)
{
    return computing(0, seed);
}

/* Told the cores, as the module tells it, from 2 x them (where limit=auto
 * starts), from 1 and from max: settled within SETTLE windows, and still
 * there after 200 more. */
static void test_cpu_bound_settles_near_cores(void **state)
{
    static const double cores[] = {2, 4, 8, 16, 64};
    (void)state;

    for (size_t k = 0; k < sizeof(cores) / sizeof(cores[0]); k++) {
        double K = cores[k];
        apr_uint32_t max = K * 16 > 200 ? (apr_uint32_t)K * 16 : 200;
        apr_uint32_t starts[] = {(apr_uint32_t)(2 * K), 1, max};

        for (int st = 0; st < 3; st++) {
            int ok[SEEDS], worst = 0;
            char what[120];

            for (int s = 0; s < SEEDS; s++) {
                workload_t wl = computing(K, 100 + s);
                at_limit_t c;
                int w;

                wl.demand = 10.0 * max; /* requests wait at every level */
                at_limit_init(&c, starts[st], 1, max);
                at_limit_set_cores(&c, (apr_uint32_t)K);
                w = windows_to_settle(&c, &wl, SETTLE + 200, K);
                ok[s] = w <= SETTLE;
                worst = w > worst ? w : worst;
            }
            snprintf(
                what, sizeof(what),
                "%g cores, from %u: held within 25 %% of them from window %d at worst,"
                " by window %d",
                K, starts[st], worst, SETTLE);
            assert_true(share(ok, what) >= MOST);
        }
    }
}

/* Work bound on something narrower than the CPUs it was told of (one
 * backend process behind many cores) still finds its level. */
static void test_narrower_than_the_cores_is_found(void **state)
{
    int ok[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t wl = computing(2, 300 + s);
        at_limit_t c;

        at_limit_init(&c, 16, 1, 128);
        at_limit_set_cores(&c, 8);
        ok[s] = windows_to_settle(&c, &wl, SETTLE + 200, 2) <= SETTLE;
    }
    assert_true(share(ok, "2 cores' work, told 8: held within 25 % of 2 by window 40") >=
                MOST);
}

/* Waits: to max within SETTLE windows, and the limit's mean over the 200
 * after at least 0.9 x max. */
static void test_waits_climb_to_max(void **state)
{
    static const apr_uint32_t maxes[] = {16, 64, 200, 1000};
    (void)state;

    for (size_t m = 0; m < sizeof(maxes) / sizeof(maxes[0]); m++) {
        int ok[SEEDS];
        char what[120];

        for (int s = 0; s < SEEDS; s++) {
            workload_t wl = waiting(500 + s);
            at_limit_t c;
            double mean;
            apr_uint32_t lo, hi;

            at_limit_init(&c, 4, 1, maxes[m]);
            at_limit_set_cores(&c, 2);
            ok[s] = windows_to_reach(&c, &wl, SETTLE, maxes[m]) <= SETTLE;
            observe(&c, &wl, 200, &mean, &lo, &hi);
            ok[s] = ok[s] && mean >= 0.9 * maxes[m];
        }
        snprintf(what, sizeof(what),
                 "waits, max %u: there by window %d, then a mean of 0.9 x", maxes[m],
                 SETTLE);
        assert_true(share(ok, what) >= MOST);
    }
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* A curve that bends into a ceiling (a CGI that waits but costs a fork),
 * from window 30 on: in the median seed at least 0.9 x the best fixed
 * limit's throughput, in MOST of them 0.85 x. The best fixed limit there
 * is max, running several times the knee for the last few per cent at
 * several times the latency; the controller stops where a step up pays
 * less than WORTH_UP of its change, and the doubt goes to the lower limit. */
static void test_a_knee_gets_most_throughput(void **state)
{
    static const double ceilings[] = {200, 760, 3000};
    (void)state;

    for (size_t k = 0; k < sizeof(ceilings) / sizeof(ceilings[0]); k++) {
        int ok[SEEDS];
        double got[SEEDS], top = 0;
        char what[120];
        workload_t best = waiting(0);

        best.ceiling = ceilings[k];
        for (apr_uint32_t l = 1; l <= 200; l++) {
            top = fmax(top, throughput(&best, l));
        }
        for (int s = 0; s < SEEDS; s++) {
            workload_t wl = waiting(700 + s);
            at_limit_t c;

            wl.ceiling = ceilings[k];
            at_limit_init(&c, 4, 1, 200);
            at_limit_set_cores(&c, 2);
            run(&c, &wl, 30);
            got[s] = 0;
            for (int i = 0; i < 200; i++) {
                got[s] += throughput(&wl, at_limit_value(&c)) / 200 / top;
                run(&c, &wl, 1);
            }
            ok[s] = got[s] >= 0.85;
        }
        snprintf(what, sizeof(what),
                 "a knee, ceiling %.0f/s: 0.85 x the best fixed limit's", ceilings[k]);
        assert_true(share(ok, what) >= MOST);
        qsort(got, SEEDS, sizeof(got[0]), by_value);
        print_message("  median %.3f x, worst %.3f x\n", got[SEEDS / 2], got[0]);
        assert_true(got[SEEDS / 2] >= 0.9);
    }
}

/* Every window has requests waiting on CPU-bound work on 4 cores: after
 * 2,000 windows the limit's mean over 500 is at most 1.25 x the cores, as
 * over the first 500. Waiting work whose arrivals keep 24 busy: the limit
 * stops where nobody waits, between 24 and 48, for 2,000 windows. */
static void test_no_creep(void **state)
{
    int ok[SEEDS], fits[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t cpu = computing(4, 900 + s), flat = waiting(1100 + s);
        at_limit_t c;
        double first, last;
        apr_uint32_t lo, hi;

        at_limit_init(&c, 8, 1, 100);
        at_limit_set_cores(&c, 4);
        run(&c, &cpu, 50);
        observe(&c, &cpu, 500, &first, &lo, &hi);
        run(&c, &cpu, 1000);
        observe(&c, &cpu, 500, &last, &lo, &hi);
        ok[s] = first <= 1.25 * 4 && last <= 1.25 * 4;

        flat.demand = 24;
        at_limit_init(&c, 8, 1, 1000);
        run(&c, &flat, 100);
        observe(&c, &flat, 1900, &last, &lo, &hi);
        fits[s] = lo >= 24 && hi <= 48;
    }
    assert_true(
        share(
            ok,
            "4 cores overloaded: mean at most 5 over windows 50 - 550 and 1550 - 2050") >=
        MOST);
    assert_true(share(fits, "demand 24 that fits: between 24 and 48 for 1,900 windows") >=
                MOST);
}

/* From 4 on waiting work with max 64, told `cores`: at max, and run for a
 * few windows more or less by seed, so that what follows finds it at
 * different points of its probing. */
static void at_max_on_waits(at_limit_t *c, workload_t *wl, apr_uint32_t cores, int s)
{
    at_limit_init(c, 4, 1, 64);
    at_limit_set_cores(c, cores);
    run(c, wl, 40 + s % 5);
}

/* Waiting work turns to computing on 4 cores, then back: the held level
 * within 25 % of the cores by SETTLE windows, then back at max within
 * SETTLE windows. */
static void test_follows_a_switch(void **state)
{
    int down[SEEDS], up[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t wl = waiting(1300 + s);
        at_limit_t c;

        at_max_on_waits(&c, &wl, 4, s);
        wl.cores = 4;
        down[s] = windows_to_settle(&c, &wl, SETTLE + 60, 4) <= SETTLE;
        wl.cores = 0;
        up[s] = windows_to_reach(&c, &wl, SETTLE, 64) <= SETTLE;
    }
    assert_true(share(down, "waits -> 4 cores: held within 25 % of 4 by window 40") >=
                MOST);
    assert_true(share(up, "4 cores -> waits: back at 64 by window 40") >= MOST);
}

/* Waiting work that keeps up with its 80 clients climbs past them: above
 * 80 nobody waits, so no step is judged there. When the same clients turn
 * to computing on 4 cores, the held level is within 25 % of the cores by
 * SETTLE windows, not left where the climb stopped. */
static void test_sheds_after_climbing_past_demand(void **state)
{
    int past[SEEDS], down[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t wl = waiting(1700 + s);
        at_limit_t c;

        wl.demand = 80;
        at_limit_init(&c, 4, 1, 144);
        at_limit_set_cores(&c, 4);
        run(&c, &wl, 40 + s % 5);
        past[s] = at_limit_value(&c) > wl.demand;
        wl.cores = 4;
        down[s] = windows_to_settle(&c, &wl, SETTLE + 60, 4) <= SETTLE;
    }
    assert_true(share(past, "waits, 80 clients: the limit above 80") >= MOST);
    assert_true(share(down, "then 4 cores: held within 25 % of 4 by window 40") >= MOST);
}

/* For 20 windows the work is 3 x slower and contends for 2 cores (another
 * program took the machine): back at max within SETTLE windows after. */
static void test_recovers_after_a_spike(void **state)
{
    int ok[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t wl = waiting(1500 + s);
        at_limit_t c;

        at_max_on_waits(&c, &wl, 2, s);
        wl.slowdown = 3;
        wl.cores = 2;
        run(&c, &wl, 20);
        wl.slowdown = 1;
        wl.cores = 0;
        ok[s] = windows_to_reach(&c, &wl, SETTLE, 64) <= SETTLE;
    }
    assert_true(share(ok, "after a spike: back at 64 by window 40") >= MOST);
}

/* Work that waits, and slows as fewer of its clients get in: those turned
 * away ask again at once, and answering them takes the CPU the requests
 * need (compose's eager clients). Each request takes S0 x (1 + k x the
 * share of the demand turned away). */
static at_window_t turned_away_slow(workload_t *wl, apr_uint32_t limit, double k)
{
    double conc = limit < wl->demand ? limit : wl->demand;
    double t = S0_US * wl->slowdown * (1 + k * (wl->demand - conc) / wl->demand);

    return window_of(wl, limit, conc, t * jitter(wl));
}

/* That work slows by 1.6 x for good (more clients turned away): the limit
 * sheds, but the step down after the shed finds that fewer running
 * relieved nothing (each request took as long, and throughput fell with
 * them): back at max within 3 windows of the shed, not after a climb. */
static void test_undoes_a_shed_that_relieved_nothing(void **state)
{
    int shed[SEEDS], ok[SEEDS];
    (void)state;

    for (int s = 0; s < SEEDS; s++) {
        workload_t wl = waiting(2100 + s);
        at_limit_t c;
        int shed_at = -1, back = -1;

        wl.demand = 150;
        at_limit_init(&c, 61, 1, 61);
        at_limit_set_cores(&c, 2);
        for (int i = 0; i < 10; i++) {
            at_window_t w = turned_away_slow(&wl, at_limit_value(&c), 2.5);
            at_limit_update(&c, &w);
        }
        wl.slowdown = 1.6;
        for (int i = 0; i < SETTLE && back < 0; i++) {
            at_window_t w = turned_away_slow(&wl, at_limit_value(&c), 2.5);
            at_limit_update(&c, &w);
            if (shed_at < 0 && at_limit_value(&c) < 61) {
                shed_at = i;
            }
            else if (shed_at >= 0 && at_limit_value(&c) == 61) {
                back = i - shed_at;
            }
        }
        shed[s] = shed_at >= 0;
        ok[s] = shed_at < 0 || (back >= 0 && back <= 3);
    }
    /* the case exists only if the slowdown makes the limit shed */
    assert_true(share(shed, "slowed by clients turned away: the limit shed") >= MOST);
    assert_true(share(ok, "slowed by clients turned away: a shed undone within 3 windows") >=
                MOST);
}

/* LimitHeld: while a step is under test the limit runs a step away and
 * the held level is the one it left; a probe that does not pay comes back
 * to it. Over 200 CPU-bound windows on 4 cores the held level is the
 * level before every change of the limit that was a probe, and it moves
 * far less often than the limit. */
static void test_held_level_is_where_probes_return(void **state)
{
    workload_t wl = workload_of(4, 0.03, 7);
    at_limit_t c;
    int limit_moves = 0, held_moves = 0, away = 0;
    (void)state;

    at_limit_init(&c, 8, 1, 200);
    at_limit_set_cores(&c, 4);
    run(&c, &wl, 60);
    for (int i = 0; i < 200; i++) {
        apr_uint32_t v = at_limit_value(&c), h = at_limit_held(&c);

        run(&c, &wl, 1);
        limit_moves += at_limit_value(&c) != v;
        held_moves += at_limit_held(&c) != h;
        if (at_limit_value(&c) != at_limit_held(&c)) {
            away++;
            /* a probe leaves the level the limit ran at */
            assert_int_equal(at_limit_held(&c), v);
        }
    }
    print_message("held level: the limit moved %d times, the held level %d; %d of 200"
                  " windows a step away\n",
                  limit_moves, held_moves, away);
    assert_true(away > 0);
    assert_true(2 * held_moves < limit_moves);
}

/* Real CPU-bound windows know their mean service time to 4 - 7 %: t/auto.t's
 * 10 clients of a 50 ms CGI on 2 cores, 22 s, the mean of the limit over
 * the last 8 windows, 300 times with windows known to 6 %. Judged without
 * the noise, one run in six crept above 1.75 x the cores (up to 10, the
 * clients' number): a probe up looked paid by chance, and above the
 * demand nothing is judged again. */
static void test_noisy_windows_do_not_creep(void **state)
{
    int crept = 0;
    double worst = 0;
    (void)state;

    for (unsigned seed = 1; seed <= 300; seed++) {
        workload_t wl = {.cores = 2,
                         .demand = 10,
                         .noise = 0.06 * sqrt(3),
                         .slowdown = 1,
                         .seed = seed};
        at_limit_t c;
        double mean;
        apr_uint32_t lo, hi;

        at_limit_init(&c, 4, 1, 16);
        run(&c, &wl, 14);
        observe(&c, &wl, 8, &mean, &lo, &hi);
        crept += mean > 1.75 * 2;
        worst = mean > worst ? mean : worst;
    }
    print_message(
        "noisy CPU-bound windows: mean above 3.5 in %d of 300 runs (worst %.2f)\n", crept,
        worst);
    assert_int_equal(crept, 0);
}

/* One window whose mean service time is wrecked by a single huge sample
 * moves the limit by at most one step. */
static void test_one_outlier_one_step_at_most(void **state)
{
    workload_t wl = workload_of(8, 0, 9);
    at_limit_t c;
    at_window_t w;
    apr_uint32_t before, after;
    (void)state;

    at_limit_init(&c, 16, 1, 200);
    run(&c, &wl, 100);
    before = at_limit_value(&c);
    w = simulate(&wl, before);
    {
        /* All the window's requests with the slow one: the controller is
         * told the mean without it, but the spread with it. */
        double n = w.completed, t = w.service_us, slow = 100 * S0_US;
        double mean = (t * (n - 1) + slow) / n;
        double var =
            ((n - 1) * (t - mean) * (t - mean) + (slow - mean) * (slow - mean)) / (n - 1);

        w.service_us = mean;
        w.service_rse = sqrt(var / n) / mean;
    }
    w.completed -= 1; /* the slow one took a slot for a long time */
    at_limit_update(&c, &w);
    after = at_limit_value(&c);
    print_message("outlier: %u -> %u\n", before, after);
    assert_true(after >= before - (before / 10 > 1 ? before / 10 : 1) - 1 &&
                after <= before + (before / 10 > 1 ? before / 10 : 1) + 1);
}

/* Windows where demand stays below the limit never raise it. */
static void test_light_load_never_raises(void **state)
{
    workload_t wl = {.cores = 0, .demand = 3, .noise = 0.03, .slowdown = 1, .seed = 13};
    at_limit_t c;
    (void)state;

    at_limit_init(&c, 8, 1, 64);
    run(&c, &wl, 1000);
    assert_int_equal(at_limit_value(&c), 8);
    assert_int_equal(c.changes, 0);
}

static void add_samples(apr_uint32_t *n, double *sum, double *sq, double us, int times)
{
    for (int i = 0; i < times; i++) {
        *n += 1;
        *sum += us;
        *sq += us * us;
    }
}

/* Steady service times need 6 completions to judge a window, scattered ones
 * up to 20: the mean of 6 times spread 150 - 250 ms is not known to 2 %.
 * At a limit of 1, whose smallest step doubles it, 10 % is enough. */
static void test_enough_samples(void **state)
{
    apr_uint32_t n = 0;
    double sum = 0, sq = 0;
    at_limit_t c, one;
    (void)state;

    at_limit_init(&c, 8, 1, 64);
    at_limit_init(&one, 1, 1, 64);
    add_samples(&n, &sum, &sq, 200000, 5);
    assert_false(at_limit_enough_samples(&c, n, sum, sq));
    add_samples(&n, &sum, &sq, 200000, 1);
    assert_true(at_limit_enough_samples(&c, n, sum, sq));

    n = 0, sum = sq = 0;
    add_samples(&n, &sum, &sq, 201000, 3);
    add_samples(&n, &sum, &sq, 199000, 3);
    assert_true(at_limit_enough_samples(&c, n, sum, sq)); /* 0.2 % apart */

    n = 0, sum = sq = 0;
    add_samples(&n, &sum, &sq, 180000, 3);
    add_samples(&n, &sum, &sq, 220000, 3);
    assert_false(at_limit_enough_samples(&c, n, sum, sq));
    assert_true(at_limit_enough_samples(&one, n, sum, sq));

    n = 0, sum = sq = 0;
    add_samples(&n, &sum, &sq, 150000, 10);
    add_samples(&n, &sum, &sq, 250000, 9);
    assert_false(at_limit_enough_samples(&c, n, sum, sq));
    add_samples(&n, &sum, &sq, 150000, 1);
    assert_true(at_limit_enough_samples(&c, n, sum, sq));

    assert_false(at_limit_enough_samples(&one, 0, 0, 0));
}

/* The status page's LimitMode names each mode as the docs do. */
static void test_mode_names(void **state)
{
    (void)state;
    assert_string_equal(at_limit_mode_name(AT_MODE_HOLD), "hold");
    assert_string_equal(at_limit_mode_name(AT_MODE_SHED), "shed");
    assert_string_equal(at_limit_mode_name(AT_MODE_STEP), "step");
    assert_string_equal(at_limit_mode_name(AT_MODE_PROBE), "probe");
    assert_string_equal(at_limit_mode_name(AT_MODE_BETWEEN), "between");
    assert_string_equal(at_limit_mode_name(AT_MODE_BETWEEN + 1), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_bound_settles_near_cores),
        cmocka_unit_test(test_narrower_than_the_cores_is_found),
        cmocka_unit_test(test_waits_climb_to_max),
        cmocka_unit_test(test_a_knee_gets_most_throughput),
        cmocka_unit_test(test_no_creep),
        cmocka_unit_test(test_follows_a_switch),
        cmocka_unit_test(test_sheds_after_climbing_past_demand),
        cmocka_unit_test(test_recovers_after_a_spike),
        cmocka_unit_test(test_undoes_a_shed_that_relieved_nothing),
        cmocka_unit_test(test_noisy_windows_do_not_creep),
        cmocka_unit_test(test_held_level_is_where_probes_return),
        cmocka_unit_test(test_one_outlier_one_step_at_most),
        cmocka_unit_test(test_light_load_never_raises),
        cmocka_unit_test(test_enough_samples),
        cmocka_unit_test(test_mode_names),
    };

    return cmocka_run_group_tests_name("limit", tests, NULL, NULL);
}
