/*
 * Regression guards of the adaptive limit's controller: each pins a figure
 * measured on a simulated trace (most of them S4's, on a 2-core machine)
 * that one of its rules answers, so that a change which moves it is a
 * choice, not an accident. Each rule and what it buys: docs/adaptive-limit.md,
 * "What each rule buys". What the controller promises on any machine is
 * stated as properties over many seeds in test_limit.c.
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

/* Work bound on `cores` (CPUs, or anything narrower), the controller told
 * `told` cores (0: nothing): the limit's mean over 200 windows must be
 * within 25 % of `cores`. Returns how many of them ran below `cores`. */
static int check_settles_near_cores(double cores, apr_uint32_t start, apr_uint32_t told)
{
    workload_t wl = workload_of(cores, 0.03, 7);
    at_limit_t c;
    double mean;
    apr_uint32_t lo, hi;
    int below;

    at_limit_init(&c, start, 1, 200);
    at_limit_set_cores(&c, told);
    run(&c, &wl, 60);
    below = observe(&c, &wl, 200, &mean, &lo, &hi);
    print_message("cores %.0f (told %u), start %u: mean limit %.2f (%u - %u), %d of 200"
                  " windows below %.0f\n",
                  cores, told, start, mean, lo, hi, below, cores);
    assert_true(mean >= 0.75 * cores && mean <= 1.25 * cores);
    return below;
}

/* Told the cores, the controller probes below them a third as often: a
 * step there that does not pay is followed by a hold three times as long
 * (on CPU-bound work each such window loses a core's share). Work bound on
 * something narrower than the cores (one backend process) still finds its
 * level: the first step below them pays. */
static void regression_few_probes_below_the_cores(void **state)
{
    (void)state;
    for (apr_uint32_t k = 2; k <= 8; k *= 2) {
        int told = check_settles_near_cores(k, 2 * k, k);
        int blind = check_settles_near_cores(k, 2 * k, 0);

        assert_true(2 * told < blind);
    }
    check_settles_near_cores(1, 8, 4);
    check_settles_near_cores(1, 16, 8);
}

/* Coming down from three to six times the cores, the steps grow until one
 * overshoots (6 -> 1 on 2 cores): the search goes on at once at the
 * geometric middle of the last level that paid and the one that failed
 * (6 and 1 -> 2), instead of holding there and probing up. Windows spent
 * above 3 on 2 cores, from 12, over 20 seeds: at most 10 of 30 (the
 * smallest step down from the last good level instead of the middle: 13;
 * turning round after the overshoot: 23). */
static void regression_overshoot_refines_the_same_way(void **state)
{
    int worst = 0;
    (void)state;

    for (unsigned seed = 1; seed <= 20; seed++) {
        workload_t wl = workload_of(2, 0.06 * sqrt(3), seed);
        at_limit_t c;
        int above = 0;

        at_limit_init(&c, 12, 1, 64);
        c.next_probe = -1;
        for (int i = 0; i < 30; i++) {
            above += at_limit_value(&c) > 3;
            run(&c, &wl, 1);
        }
        worst = above > worst ? above : worst;
    }
    print_message("from 12 on 2 cores: at most %d of 30 windows above 3\n", worst);
    assert_true(worst <= 11);
}

/* limit=auto from `start`, max 64, settled on the work `wl` describes
 * (run `seed`: each settles for a slightly different number of windows, so
 * the work that follows finds it at different points of its probing). */
static void settle_on(at_limit_t *c, workload_t *wl, apr_uint32_t start, unsigned seed)
{
    at_limit_init(c, start, 1, 64);
    run(c, wl, 40 + seed % 4);
}

/* Over 20 runs (seeds) of `cores` cores at 50 ms from limit `start`, long
 * enough to settle, then sleep-bound work `slowdown` times as long: the
 * most windows any run took to reach 64, and the lowest limit any run ran
 * after the change (if `lowest`). `told`: whether the controller knows the
 * cores. */
static int worst_climb_after_computing(double cores, apr_uint32_t start, double slowdown,
                                       int told, apr_uint32_t *lowest)
{
    int worst = 0;

    apr_uint32_t low = 64;

    for (unsigned seed = 1; seed <= 20; seed++) {
        workload_t wl = workload_of(cores, 0.03, seed);
        at_limit_t c;
        int up;

        settle_on(&c, &wl, start, seed);
        if (told) {
            at_limit_set_cores(&c, (apr_uint32_t)cores);
        }
        wl.cores = 0;
        wl.slowdown = slowdown;
        for (up = 0; up < 100 && at_limit_value(&c) < 64; up++) {
            run(&c, &wl, 1);
            low = at_limit_value(&c) < low ? at_limit_value(&c) : low;
        }
        worst = up > worst ? up : worst;
    }
    if (lowest) {
        *lowest = low;
    }
    return worst;
}

/* Settled at min on one core, the limit must not spend a hold on a probe
 * down that cannot move it: when the work turns to waiting, it climbs at
 * the first probe. */
static void regression_climbs_from_min(void **state)
{
    int worst = worst_climb_after_computing(1, 1, 1, 1, NULL);
    (void)state;

    print_message("from min: 64 after at most %d windows\n", worst);
    assert_true(worst <= 11);
}

/* From a CPU-bound service of 50 ms on 2 cores to one that sleeps 200 ms
 * (S4's switch): the service time at the settled level quadruples, which
 * ends any hold at once. Told the cores, as the module tells it, the
 * controller does not shed below them and climbs from 2 instead of 1. */
static void regression_changed_work_ends_the_hold(void **state)
{
    apr_uint32_t lowest, lowest_blind;
    int worst = worst_climb_after_computing(2, 4, 4, 1, &lowest);
    int blind = worst_climb_after_computing(2, 4, 4, 0, &lowest_blind);
    (void)state;

    print_message("CPU to sleep: 64 after at most %d windows, never below %u (not told the"
                  " cores: %d, %u)\n",
                  worst, lowest, blind, lowest_blind);
    assert_true(blind <= 10);
    assert_true(lowest >= 2);
    assert_true(worst < blind);
}

/* The work turns CPU-bound while a step down is under test: the step
 * looks as if it cost throughput, but it must not be undone. */
static void regression_switch_during_a_step_down(void **state)
{
    int worst = 0;
    (void)state;

    for (unsigned seed = 1; seed <= 20; seed++) {
        workload_t wl = workload_of(0, 0.03, seed);
        at_limit_t c;
        int down, i;

        wl.ceiling = 760;
        at_limit_init(&c, 4, 1, 64);
        run(&c, &wl, 30);
        for (i = 0; i < 200 && c.dir >= 0; i++) {
            run(&c, &wl, 1);
        }
        assert_true(c.dir < 0);
        wl.ceiling = 0;
        wl.cores = 2;
        for (down = 0; down < 100 && at_limit_value(&c) > 3; down++) {
            run(&c, &wl, 1);
        }
        worst = down > worst ? down : worst;
    }
    print_message("switch during a step down: <= 3 after at most %d windows\n", worst);
    assert_true(worst <= 4);
}


/* S4's sleep-bound CGI as the sweep of fixed limits measured it: its top
 * is flat but not level, 32 giving 0.87 x what 64 gives. */
static const measured_t s4_sweep[] = {{1, 7.5},   {2, 12.1},   {4, 21.7},  {8, 40.7},
                                      {16, 78.0}, {32, 144.2}, {64, 166.2}};
/* The same CGI as windows of limit=auto saw it during the switch (by
 * Little's law): it bends at about 40, and 42 - 64 give the same within
 * 3 %. */
static const measured_t s4_switch[] = {{1, 5},    {10, 46},  {17, 79}, {31, 135},
                                       {42, 146}, {57, 148}, {64, 150}};

static double s4_sleeping_throughput(double conc)
{
    return on_curve(s4_sweep, POINTS(s4_sweep), conc);
}

/* S4's switch from CPU-bound work on 2 cores to its sleeping CGI: the
 * limit climbs and stays near the top, over 20 seeds and 40 windows from
 * the 10th on at least 0.95 x the throughput of 64 on average. Judging
 * steps up by 0.2 of the change in concurrency and steps down within that
 * much whatever the noise walks it down the top: 0.90 x. */
static void regression_flat_top_keeps_the_climb(void **state)
{
    double sum = 0, worst = 1;
    (void)state;

    for (unsigned seed = 1; seed <= 20; seed++) {
        workload_t wl = workload_of(2, 0.06 * sqrt(3), seed);
        at_limit_t c;
        double got = 0;

        settle_on(&c, &wl, 4, seed);
        wl.noise = 0.008 * sqrt(3); /* S4's windows at the top */
        for (int i = 0; i < 50; i++) {
            at_window_t w =
                simulate_on(&wl, at_limit_value(&c), s4_sweep, POINTS(s4_sweep));

            if (i >= 10) {
                got += s4_sleeping_throughput(at_limit_value(&c)) / 40;
            }
            at_limit_update(&c, &w);
        }
        got /= s4_sleeping_throughput(64);
        sum += got / 20;
        worst = got < worst ? got : worst;
    }
    print_message("S4's sleeping CGI after CPU-bound work: %.3f x the throughput of 64 "
                  "(worst seed %.3f)\n",
                  sum, worst);
    assert_true(sum >= 0.95);
}

/* A long step up that paid less than half its change in concurrency went
 * past the knee: the level between is tried next instead of a step
 * further up. Climbing that curve from 10 (10 -> 12 -> 17 -> 30 -> 54),
 * the limit is within +-25 % of where it ends (S4's criterion for
 * settled) from the window after the overshoot on: 54 -> 40. Without the
 * middle it goes on 54 -> 64 and later 44 -> 26 (within 25 % of its end,
 * 44, from window 12 on); without the rule at all, from window 8. */
static void regression_climb_stops_near_the_knee(void **state)
{
    workload_t wl = workload_of(0, 0, 1);
    at_limit_t c;
    apr_uint32_t seen[30], last;
    int i, settled = 0;
    (void)state;

    at_limit_init(&c, 10, 1, 64);
    for (i = 0; i < 30; i++) {
        at_window_t w;

        seen[i] = at_limit_value(&c);
        w = simulate_on(&wl, seen[i], s4_switch, POINTS(s4_switch));
        at_limit_update(&c, &w);
    }
    last = at_limit_value(&c);
    for (i = 0; i < 30; i++) {
        if (fabs((double)seen[i] - last) > 0.25 * last) {
            settled = i + 1;
        }
    }
    print_message(
        "S4's switch curve from 10: ends at %u, within 25 %% of it from window %d\n",
        last, settled);
    assert_true(last >= 36 && last <= 50);
    assert_true(settled <= 5);
}

/* S4's sleeping CGI as one run of its switch saw it, window by window:
 * each level from 23 to 47 gives a little more than the one below, and
 * above that a little less. */
static const measured_t s4_gentle[] = {{1, 5},    {10, 46},  {16, 76},
                                       {23, 104}, {31, 118}, {41, 126},
                                       {47, 127}, {57, 125}, {64, 122}};

/* The held level after a climb from 13 on that curve, no noise, 6
 * windows (13 -> 16 -> 22 -> 39 and three more): the first window after a
 * step up of 10 or more requests `slow` slower (the CGIs let in at once
 * fork together), and the first window at the level between the last two
 * steps of the climb `fast` faster. */
static apr_uint32_t held_after_gentle_climb(double slow, double fast)
{
    workload_t wl = workload_of(0, 0, 1);
    apr_uint32_t before = 13;
    at_limit_t c;

    at_limit_init(&c, 13, 1, 64);
    at_limit_set_cores(&c, 2);
    for (int i = 0; i < 6; i++) {
        apr_uint32_t now = at_limit_value(&c);
        at_window_t w = simulate_on(&wl, now, s4_gentle, POINTS(s4_gentle));

        if (now >= before + 10) {
            w.service_us *= 1 + slow;
        }
        if (now < before && before > 30) {
            w.service_us /= 1 + fast;
        }
        before = now;
        at_limit_update(&c, &w);
    }
    return at_limit_held(&c);
}

/* The climb's long step 22 -> 39 gains 24 %, but its first window, slowed
 * by the fork burst of the 17 CGIs let in at once, shows 8 %, where 12 %
 * and the noise are needed. A long step of the climb that gained anything
 * is followed at once by the level between (29), judged against 22: it
 * pays, and the climb goes on by 20 % (35) in six windows. Ending the
 * climb at 22 instead, the held level walks up by confirmed steps, at 26
 * after six windows and 38 after twelve (on a server 10 - 20 s). A first
 * window that shows no gain (30 % slow) ends the climb. */
static void regression_a_slow_first_window_does_not_end_the_climb(void **state)
{
    apr_uint32_t held = held_after_gentle_climb(0.15, 0);
    (void)state;

    print_message("gentle top, the long step's first window 15 %% slow: held at %u\n",
                  held);
    assert_true(held >= 30 && held <= 44);
    /* a first window that lost throughput ends the climb at once */
    held = held_after_gentle_climb(0.30, 0);
    print_message("30 %% slow: held at %u\n", held);
    assert_true(held < 30);
}

/* After the long step past the knee, the level between (39 -> 29) is a
 * step down at the top like any probe there: it loses 7 % for 26 % fewer
 * running, but a first window 8 % fast makes it look free. Judged by that
 * window alone the held level is 29 after six windows; judged by two more
 * windows, it stays at 39. */
static void regression_the_level_between_is_confirmed(void **state)
{
    apr_uint32_t held = held_after_gentle_climb(0, 0.08);
    (void)state;

    print_message("gentle top, the level between 8 %% fast at first: held at %u\n",
                  held);
    assert_true(held >= 36 && held <= 44);
}

/* The median of the last 20 of 60 values. */
static apr_uint32_t median_of_last_20(const apr_uint32_t *v)
{
    apr_uint32_t sorted[20];
    int i, j;

    for (i = 0; i < 20; i++) {
        for (j = i; j > 0 && sorted[j - 1] > v[40 + i]; j--) {
            sorted[j] = sorted[j - 1];
        }
        sorted[j] = v[40 + i];
    }
    return sorted[10];
}

/* Whether any of the 60 values from the 20th on is more than 25 % from the
 * median of the last 20: S4's criterion for settled, about 10 s after its
 * switch. */
static int off_band_after_20(const apr_uint32_t *v)
{
    apr_uint32_t median = median_of_last_20(v);

    for (int i = 20; i < 60; i++) {
        if (fabs((double)v[i] - median) > 0.25 * median) {
            return 1;
        }
    }
    return 0;
}

/* S4's switch curve, reached from 2 cores of CPU-bound work, with windows
 * that differ from one another by 4 % (uniform) while each reports 1.5 %,
 * as S4's do at the top: 60 windows after the switch, `runs` runs. Counts
 * the runs where the held level (LimitHeld) and the limit itself were off
 * their final band after window 20. */
static void flat_top_walks(int runs, int *held_off, int *limit_off)
{
    *held_off = *limit_off = 0;
    for (int seed = 1; seed <= runs; seed++) {
        workload_t wl = workload_of(2, 0.03, (unsigned)seed);
        apr_uint32_t held[60], limit[60];
        at_limit_t c;

        settle_on(&c, &wl, 4, (unsigned)seed);
        at_limit_set_cores(&c, 2);
        wl.noise = 0.04 * sqrt(3);
        for (int i = 0; i < 60; i++) {
            at_window_t w;

            limit[i] = at_limit_value(&c);
            w = simulate_on(&wl, limit[i], s4_switch, POINTS(s4_switch));
            w.service_rse = 0.015;
            at_limit_update(&c, &w);
            held[i] = at_limit_held(&c);
        }
        *held_off += off_band_after_20(held);
        *limit_off += off_band_after_20(limit);
    }
}

/* On that flat top a probe's effect (2 - 3 %) is within the windows'
 * spread, and judged by one window probes both ways pass by chance: the
 * held level walks 31 - 59 long after the climb (off its final band in
 * 64 of 200 runs, the limit itself in 191). Once the climb has found the
 * knee, a probe out of a hold that passes is judged by two more windows
 * before the held level moves. The limit itself stays off more often than
 * the held level: a probe from a held level one step off the final one
 * leaves the band. */
static void regression_flat_top_probes_are_confirmed(void **state)
{
    int held_off, limit_off;
    (void)state;

    flat_top_walks(200, &held_off, &limit_off);
    print_message("flat top, windows spread 4 %%, report 1.5 %%: off the final band after "
                  "window 20 in %d (held level) and %d (the limit itself) of 200 runs\n",
                  held_off, limit_off);
    assert_true(held_off <= 50);
    assert_true(limit_off <= 135);
}

/* Windows last two service times while the limit climbs and four once the
 * climb has found the knee, where a step's effect is a few per cent; a
 * change of work, or a window where nobody waited, starts a climb again at
 * the short length. S4's switch curve from 10, no noise: two service times
 * up to the first step that paid less than half its change, four from the
 * end of that climb on. */
static void regression_windows_lengthen_at_the_top(void **state)
{
    workload_t wl = workload_of(0, 0, 1);
    at_limit_t c;
    at_window_t w;
    int i, short_windows = 0;
    (void)state;

    at_limit_init(&c, 10, 1, 64);
    at_limit_set_cores(&c, 2);
    assert_int_equal(at_limit_window_services(&c), 2);
    for (i = 0; i < 30; i++) {
        short_windows += at_limit_window_services(&c) == 2;
        w = simulate_on(&wl, at_limit_value(&c), s4_switch, POINTS(s4_switch));
        at_limit_update(&c, &w);
    }
    print_message("S4's switch curve from 10: %d windows of two service times, then four\n",
                  short_windows);
    assert_true(short_windows >= 3 && short_windows <= 6);
    assert_int_equal(at_limit_window_services(&c), 4);

    /* each request now takes three times as long: the work changed */
    w = simulate_on(&wl, at_limit_value(&c), s4_switch, POINTS(s4_switch));
    w.service_us *= 3;
    at_limit_update(&c, &w);
    assert_int_equal(at_limit_window_services(&c), 2);

    for (i = 0; i < 30; i++) {
        w = simulate_on(&wl, at_limit_value(&c), s4_switch, POINTS(s4_switch));
        at_limit_update(&c, &w);
    }
    assert_int_equal(at_limit_window_services(&c), 4);
    w.limited = 0;
    at_limit_update(&c, &w);
    assert_int_equal(at_limit_window_services(&c), 2);
}

/* The limit after a probe up from 10 and the step that follows it, on a
 * curve where 10 -> 12 raises throughput by `gain`. */
static apr_uint32_t after_probe_from_10(double gain)
{
    const measured_t curve[] = {{1, 10}, {10, 100}, {12, 100 * (1 + gain)}, {64, 110}};
    workload_t wl = workload_of(0, 0, 1);
    at_limit_t c;
    at_window_t w;

    at_limit_init(&c, 10, 1, 64);
    for (int i = 0; i < 2; i++) {
        w = simulate_on(&wl, at_limit_value(&c), curve, POINTS(curve));
        at_limit_update(&c, &w);
    }
    return at_limit_value(&c);
}

/* Steps up grow while they pay in proportion (20 % then 40 %: 10 -> 12 ->
 * 17); one that paid less than half its change reached the knee, and the
 * next is the smallest again (12 -> 14). */
static void regression_steps_stop_growing_at_the_knee(void **state)
{
    apr_uint32_t full = after_probe_from_10(0.2), little = after_probe_from_10(0.05);
    (void)state;

    print_message("after 10 -> 12 paying 20 %%: %u; paying 5 %%: %u\n", full, little);
    assert_int_equal(full, 17);
    assert_int_equal(little, 14);
}

/* At a settled level whose hold is over, one window 12 % below the pooled
 * ones (a dip, not a change of work: the service time moved by less than
 * half again) puts off the probe: judged against the dip alone, a step
 * down would look free. The usual window after it differs from the dip as
 * much and puts it off once more; the one after that probes. */
static void regression_a_dip_puts_off_the_probe(void **state)
{
    workload_t wl = workload_of(4, 0, 21);
    at_limit_t c;
    at_window_t w;
    apr_uint32_t level;
    int i;
    (void)state;

    at_limit_init(&c, 4, 1, 64);
    run(&c, &wl, 40);
    for (i = 0; i < 40 && !(c.dir == 0 && c.hold == 0 && c.ref_n >= 2); i++) {
        run(&c, &wl, 1);
    }
    assert_true(i < 40);
    level = at_limit_value(&c);
    w = simulate(&wl, level);
    w.service_us /= 0.88;
    at_limit_update(&c, &w);
    assert_int_equal(at_limit_value(&c), level);
    run(&c, &wl, 1);
    assert_int_equal(at_limit_value(&c), level);
    run(&c, &wl, 1);
    print_message("a dip at %u: no probe in it or the window after, then %u\n", level,
                  at_limit_value(&c));
    assert_int_not_equal(at_limit_value(&c), level);
}

/* A window of a load turning from waiting to computing on wl->ceiling
 * cores: a share `mix` of the requests running compute, the rest wait
 * S0_US. The requests that end in the window ran while the window before
 * it held the level `before`: while the work changes, service times grow
 * longer than a window and the settling after a step (a service time as
 * it was before) falls short. */
static at_window_t simulate_mix(workload_t *wl, apr_uint32_t limit, apr_uint32_t before,
                                double mix)
{
    at_window_t w = simulate(wl, limit); /* sleep-bound: wl->cores is 0 */
    double computing = mix * before;
    double t_cpu = S0_US * (computing > wl->ceiling ? computing / wl->ceiling : 1);

    w.service_us = (mix * t_cpu + (1 - mix) * S0_US) * jitter(wl);
    w.completed = (apr_uint32_t)ceil(w.inflight * w.secs * 1e6 / w.service_us);
    if (w.completed < AT_LIMIT_MIN_SAMPLES) {
        w.secs *= (double)AT_LIMIT_MIN_SAMPLES / w.completed;
        w.completed = AT_LIMIT_MIN_SAMPLES;
    }
    return w;
}

/* S4's switch back to computing: at 64, the requests of the new work
 * replace the waiting ones over 4 windows, and for 6 windows each shows
 * the level before it, so any step down seems to cost throughput. The
 * limit must still come down to the 2 cores and stay there, not climb
 * back because a step down looked bad (judged against a window of the
 * change, the first step down fails and the limit stays at 44 - 64). The
 * first window of the change sheds 64 -> 24; the next one, against which
 * a probe would be judged, shows the service time tripled since: the limit
 * sheds again from it (at most 4 windows to 4 or less; judging the probe
 * 24 -> 15 against it, which fails, takes up to 15). */
static void regression_follows_work_turning_heavier_gradually(void **state)
{
    int worst_down = 0;
    double worst_mean = 0;
    (void)state;

    for (unsigned seed = 1; seed <= 20; seed++) {
        workload_t wl = workload_of(0, 0.03, seed);
        at_limit_t c;
        int down = -1;
        double sum = 0;

        at_limit_init(&c, 4, 1, 64);
        run(&c, &wl, 40);
        assert_int_equal(at_limit_value(&c), 64);
        wl.ceiling = 2; /* cores, for simulate_mix */
        for (apr_uint32_t i = 0, before = 64; i < 40; i++) {
            double mix = i < 4 ? (i + 1) / 4.0 : 1;
            at_window_t w = simulate_mix(&wl, at_limit_value(&c),
                                         i < 6 ? before : at_limit_value(&c), mix);

            before = at_limit_value(&c);
            at_limit_update(&c, &w);
            if (down < 0 && at_limit_value(&c) <= 4) {
                down = i + 1;
            }
            if (i >= 20) {
                sum += at_limit_value(&c);
            }
        }
        worst_down = down < 0 ? 99 : down > worst_down ? down : worst_down;
        worst_mean = sum / 20 > worst_mean ? sum / 20 : worst_mean;
    }
    print_message("work turning heavier over 4 windows: <= 4 after at most %d windows, "
                  "then a mean of at most %.2f\n", worst_down, worst_mean);
    assert_true(worst_down <= 8);
    assert_true(worst_mean <= 3);
}

/* S4's switch back to computing, from the sleeping CGI's flat top: the
 * service time at 41 grows from 0.3 s to 1 s, and the shed (70 %) leaves
 * the limit at 12, six times the 2 cores. A 20 % step down from there
 * that fails by chance (windows of CPU-bound work known to 5 %) turns the
 * search up, the step up fails too and marks a top, and the walk down goes
 * on with probes confirmed and holds between them: with a 20 % probe after
 * the shed, the held level is at the cores after 10 s in only 930 of
 * 1,000 simulated switches (windows of 0.5 - 1.2 s). Taken as the second
 * step of a run down, the probe after the shed is 40 %, which fails by
 * chance a third as often, and its failure tries the level between: 984
 * of 1,000. Here: the windows until the held level is at most 3, over 200
 * seeds. */
static void regression_shed_from_a_flat_top_goes_on_down(void **state)
{
    int worst = 0, late = 0;
    (void)state;

    for (unsigned seed = 1; seed <= 200; seed++) {
        workload_t wl = workload_of(0, 0.05 * sqrt(3), seed);
        at_limit_t c;
        int down;

        at_limit_init(&c, 4, 1, 64);
        at_limit_set_cores(&c, 2);
        for (int i = 0; i < 40 + (int)(seed % 4); i++) {
            apr_uint32_t v = at_limit_value(&c);
            at_window_t w = simulate_on(&wl, v, s4_switch, POINTS(s4_switch));
            at_limit_update(&c, &w);
        }
        wl.cores = 2;
        for (down = 0; down < 100 && at_limit_held(&c) > 3; down++) {
            run(&c, &wl, 1);
        }
        worst = down > worst ? down : worst;
        late += down > 12;
    }
    print_message("computing after a flat top: held level <= 3 after at most %d windows, "
                  "more than 12 in %d of 200\n", worst, late);
    assert_true(late <= 4);
}

/* The windows until the limit is at most 3 for good, after it sat at the
 * top of sleep-bound work and the work turned CPU-bound on 2 cores. The
 * window at a new level measures the level before it while that one still
 * drains: when the requests it had beyond the new level take longer to
 * finish on the cores than the settling after the change (about the
 * service time of the window before). With `partial`, the first window of
 * the change caught it half done, as on the server: service time 2.25 x,
 * known to 15 %, so the first shed is small (64 -> 40). */
static int windows_to_cores_draining(unsigned seed, int partial)
{
    workload_t wl = workload_of(0, 0.03 * sqrt(3), seed);
    at_limit_t c;
    apr_uint32_t before;
    double t_before;
    int settled = -1;

    at_limit_init(&c, 4, 1, 64);
    at_limit_set_cores(&c, 2);
    run(&c, &wl, 40);
    assert_true(at_limit_value(&c) >= 51); /* at max, or probing below it */
    wl.cores = 2;
    before = at_limit_value(&c);
    t_before = S0_US;
    for (int i = 0; i < 40; i++) {
        apr_uint32_t v = at_limit_value(&c);
        int draining = v < before && (before - v) * S0_US / wl.cores > t_before;
        at_window_t w = simulate(&wl, draining ? before : v);

        if (partial && i == 0) {
            w = window_of(&wl, v, v, 2.25 * S0_US);
            w.service_rse = 0.15;
        }
        w.inflight = v;
        w.limited = 1;
        before = v;
        t_before = w.service_us;
        at_limit_update(&c, &w);
        if (at_limit_value(&c) > 3) {
            settled = -1;
        }
        else if (settled < 0) {
            settled = i + 1;
        }
    }
    return settled < 0 || settled > 30 ? 99 : settled;
}

/* S4's switch back to computing from a backend that only waits (no fork
 * a request, so the limit sits at max 64). On the server a shed 51 -> 13
 * was followed by a window at 13 of 1.1 s a request (51 CGIs still
 * burning), the probe 13 -> 8 by one of 0.28 s; in another run a shed
 * 64 -> 41, a window at 41 of 2.2 s and a shed to 9, then 0.30 s at 9.
 * Faster than the step explains, that turned the search up (8 -> 10,
 * 9 -> 10) and held the level for 5 s after the probe failed. A step down
 * or a shed of work that computes, judged against a level still draining,
 * now goes on down from the new window. Over 20 seeds each, the windows
 * until the limit is at most 3 for good (the cores' +-25 % band, at least
 * +-1): abrupt switch at most 6 (before: 6), first window half done at
 * most 4 (before: 12; with a 20 % step down from the new window instead
 * of 40 %, 14: a 12 % step of work that computes failed by chance). */
static void regression_a_draining_level_does_not_turn_the_search_up(void **state)
{
    int worst[2] = {0, 0};
    (void)state;

    for (int partial = 0; partial <= 1; partial++) {
        for (unsigned seed = 1; seed <= 20; seed++) {
            int n = windows_to_cores_draining(seed, partial);

            worst[partial] = n > worst[partial] ? n : worst[partial];
        }
    }
    print_message(
        "computing after a flat waiting top, levels draining: the limit at most 3 "
        "for good after at most %d windows (first window half done: %d)\n",
        worst[0], worst[1]);
    assert_true(worst[0] <= 8);
    assert_true(worst[1] <= 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(regression_few_probes_below_the_cores),
        cmocka_unit_test(regression_overshoot_refines_the_same_way),
        cmocka_unit_test(regression_climbs_from_min),
        cmocka_unit_test(regression_changed_work_ends_the_hold),
        cmocka_unit_test(regression_switch_during_a_step_down),
        cmocka_unit_test(regression_follows_work_turning_heavier_gradually),
        cmocka_unit_test(regression_shed_from_a_flat_top_goes_on_down),
        cmocka_unit_test(regression_a_draining_level_does_not_turn_the_search_up),
        cmocka_unit_test(regression_flat_top_keeps_the_climb),
        cmocka_unit_test(regression_a_dip_puts_off_the_probe),
        cmocka_unit_test(regression_climb_stops_near_the_knee),
        cmocka_unit_test(regression_a_slow_first_window_does_not_end_the_climb),
        cmocka_unit_test(regression_the_level_between_is_confirmed),
        cmocka_unit_test(regression_flat_top_probes_are_confirmed),
        cmocka_unit_test(regression_windows_lengthen_at_the_top),
        cmocka_unit_test(regression_steps_stop_growing_at_the_knee),
    };

    return cmocka_run_group_tests_name("limit regressions", tests, NULL, NULL);
}
