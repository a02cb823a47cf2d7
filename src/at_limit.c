/*
 * The adaptive limit's controller: a hill climb on throughput that prefers
 * the lowest limit giving the most throughput. See docs/adaptive-limit.md.
 *
 * It judges each step by what it did to throughput (requests running per
 * second of service), not by latency against a remembered baseline, which
 * has to be measured at low concurrency: pinning the limit down to get one
 * is what makes other controllers refuse requests while they re-measure.
 */
#include "at_limit.h"

#include <math.h>
#include <string.h>

/*
 * Tunables, each with what it trades and, in brackets, the evidence
 * (t/unit/test_limit.c's simulations, or S4: docs/benchmarks/s4.md).
 * Window length and sample counts: at_limit.h; window bounds: at_tuning.h.
 *
 * WORTH_UP 0.15        a step up pays if throughput grows by this share of
 *                      its change in concurrency: higher stops climbs early
 *                      on bending curves [S4's sleeping CGI pays 0.2 from 32
 *                      to 64; at 0.2 the limit stopped at 31 - 38]
 * DOWN_LEAST, DOWN_MOST 0.1, 0.2  what a step down may cost and still pass,
 *                      by the noise of the comparison: more lets a limit
 *                      walk down a flat top [at 0.2 throughout: 64 -> 31 in S4]
 * NOISE_SES 1          standard errors of the comparison added to each
 *                      threshold: more costs a knee throughput [1.5: -10 %,
 *                      1: -4 %, and no creep]
 * KNEE_SHARE 0.5       a step up paying less than this share reached the knee:
 *                      the steps stop growing [S4: 17 -> 31 paid 0.75, 31 -> 57 0.19]
 * CORES_HOLD 9         windows held after a step below the cores failed: each
 *                      such window costs CPU-bound work a core's share
 * MIN_REL_CHANGE 0.02  smaller changes of concurrency cannot be judged
 * CONFIRMATIONS 2      more windows a probe at the top must pass before the
 *                      held level moves: fewer let the held level wander a
 *                      flat top [simulated switch, off after 10 s: 160 of
 *                      500 judged by one window, 73 by two]
 * REF_WINDOWS 4        windows at the settled level pooled as a reference:
 *                      one alone doubles the noise of the comparison
 * STEP_FIRST 0.2, STEP_DOUBLINGS 2  steps of a run: 20, 40, 80 % (at least 1)
 * WORK_CHANGED 1.5     a service time this many times longer or shorter than
 *                      concurrency explains: the work itself changed (with
 *                      nobody waiting, longer than the held level's: shed)
 * SHED_LEAST, SHED_MOST 0.2, 0.8  the share one shed may take off the limit
 * SHED_DOUBT_SES 2     a shed reads the growth of the service time this many
 *                      standard errors low: one huge request counts for little
 * REF_RESTART_SES 3    a window this many standard errors off the pooled
 *                      reference starts a new pool: the work is drifting
 * RSE_FLOOR 0.02       the least relative error a window is taken to have
 * BASELINE_WEIGHT 0.25 a held level's service time follows each window by this
 * TOP_WINDOWS 2        windows are this many times longer once the climb found
 *                      the knee: steps there move throughput 2 - 3 %, windows
 *                      of 2 service times differ by 4 - 6 % [S4 at 41 - 64]
 * SAMPLE_TOLERANCE 0.1 a window with few completions is judged once its mean is
 *                      known to this share of the smallest step
 */
#define WORTH_UP 0.15
#define DOWN_LEAST 0.1
#define DOWN_MOST 0.2
#define NOISE_SES 1.0
#define KNEE_SHARE 0.5
#define CORES_HOLD (3 * AT_LIMIT_HOLD)
#define MIN_REL_CHANGE 0.02
#define CONFIRMATIONS 2
#define REF_WINDOWS 4
#define STEP_FIRST 0.2
#define STEP_DOUBLINGS 2
#define WORK_CHANGED 1.5
#define SHED_LEAST 0.2
#define SHED_MOST 0.8
#define SHED_DOUBT_SES 2
#define REF_RESTART_SES 3
#define RSE_FLOOR 0.02
#define BASELINE_WEIGHT 0.25
#define TOP_WINDOWS 2
#define SAMPLE_TOLERANCE 0.1

static double clamp(const at_limit_t *c, double v)
{
    return v < c->min ? c->min : v > c->max ? c->max : v;
}

/* The number of requests a level runs. */
static double rounded(double v)
{
    return floor(v + 0.5);
}

void at_limit_init(at_limit_t *c, apr_uint32_t start, apr_uint32_t min,
                   apr_uint32_t max)
{
    memset(c, 0, sizeof(*c));
    c->min = min ? min : 1;
    c->max = max < c->min ? c->min : max;
    c->limit = clamp(c, start);
    c->settled = c->limit;
    c->mode = AT_MODE_HOLD;
    c->next_probe = +1;
}

void at_limit_set_cores(at_limit_t *c, apr_uint32_t cores)
{
    c->cores = cores;
}

apr_uint32_t at_limit_value(const at_limit_t *c)
{
    return (apr_uint32_t)rounded(clamp(c, c->limit));
}

apr_uint32_t at_limit_held(const at_limit_t *c)
{
    return (apr_uint32_t)rounded(clamp(c, c->settled));
}

const char *at_limit_mode_name(apr_uint32_t mode)
{
    static const char *const names[] = {"hold", "shed", "step", "probe", "between"};

    return mode < sizeof(names) / sizeof(names[0]) ? names[mode] : "unknown";
}

/* Short windows tell a climb's steps apart; at the top, longer ones halve
 * the variance that would hide a step's few per cent (TOP_WINDOWS). */
apr_uint32_t at_limit_window_services(const at_limit_t *c)
{
    return c->top ? TOP_WINDOWS * AT_LIMIT_WINDOW_SERVICES : AT_LIMIT_WINDOW_SERVICES;
}

/* What the climb found no longer holds (the work changed, or demand fell
 * under the limit): the next climb is judged with short windows and
 * unconfirmed steps. */
static void forget_the_top(at_limit_t *c)
{
    c->top = 0;
    c->passes = 0;
}

static void step_by(at_limit_t *c, int dir, double frac)
{
    double delta = c->limit * frac;

    if (delta < 1) {
        delta = 1;
    }
    c->limit = clamp(c, c->limit + dir * delta);
    c->dir = dir;
    c->run++;
}

/* 20 %, then doubling with each step in a row up to 80 %, and at least 1,
 * so that the number of requests running really changes. */
static void take_step(at_limit_t *c, int dir)
{
    apr_uint32_t doublings = c->run < STEP_DOUBLINGS ? c->run : STEP_DOUBLINGS;

    step_by(c, dir, STEP_FIRST * (double)(1u << doublings));
}

/* Whether a level runs fewer requests than the cores the work can use. */
static int under_cores(const at_limit_t *c, double level)
{
    return rounded(level) < c->cores;
}

/* Whether the step under test was one of 40 or 80 %: steps grew to it
 * because the ones before paid. */
static int step_was_long(const at_limit_t *c)
{
    return c->run > 1;
}

/* The step under test did not pay: back to the held level, stay there a
 * while, then try the other way. A long step (40 or 80 %) that failed
 * after steps that paid overshot: the best level lies between, so the
 * search goes on the same way at once (probe_between). Returns whether it
 * overshot. */
static int return_to_held(at_limit_t *c)
{
    int overshot = step_was_long(c);
    int below_cores = c->dir < 0 && under_cores(c, c->limit);

    c->next_probe = overshot ? c->dir : -c->dir;
    c->limit = c->settled;
    c->mode = AT_MODE_HOLD;
    c->dir = 0;
    c->run = 0;
    c->hold = overshot ? 0 : below_cores ? CORES_HOLD : AT_LIMIT_HOLD;
    return overshot;
}

/* The geometric middle of the held level and `other`, tried at once
 * against the held level's reference: one step instead of a walk of small
 * ones. Below a step down that overshot, or a long step up that reached
 * the knee (mode BETWEEN); above, after a long step up that gained too
 * little. Returns whether there is a level
 * between. */
static int probe_between(at_limit_t *c, double other, at_limit_mode_t mode)
{
    double mid = sqrt(c->settled * other);
    double m = rounded(mid);

    if (m == rounded(c->settled) || m == rounded(other)) {
        return 0;
    }
    c->mode = mode;
    c->dir = other > c->settled ? +1 : -1;
    c->limit = mid;
    c->run = 0;
    return 1;
}

/* Whether the step up just judged paid so little of its change in
 * concurrency that it reached the knee: KNEE_SHARE. */
static int near_knee(const at_limit_t *c, double x, double conc)
{
    double rel_c = conc / c->last_c - 1;

    return c->dir > 0 && rel_c > 0 && (x / c->last_x - 1) < KNEE_SHARE * rel_c;
}

/* How much throughput a step down of rel_c may cost, judged with this
 * noise: see DOWN_MOST. */
static double down_allowance(double rel_c, double noise)
{
    double most = DOWN_MOST * fabs(rel_c), least = DOWN_LEAST * fabs(rel_c);

    return noise < least ? least : noise > most ? most : noise;
}

/* Whether the step under test paid: up, throughput rose with concurrency
 * by more than WORTH_UP of it plus the noise of the comparison; down, it
 * did not fall by more than down_allowance() plus that noise. The doubt
 * goes to the lower limit both ways, or noise alone makes a limit creep.
 * -1: cannot tell. */
static int step_paid(const at_limit_t *c, double x, double conc, double rse)
{
    double rel_c = conc / c->last_c - 1, rel_x = x / c->last_x - 1;
    double noise = NOISE_SES * rse * sqrt(1 + 1.0 / (c->ref_n ? c->ref_n : 1));

    if (fabs(rel_c) < MIN_REL_CHANGE || (rel_c > 0) != (c->dir > 0)) {
        return -1;
    }
    if (c->dir > 0) {
        return rel_x - noise >= WORTH_UP * rel_c;
    }
    return rel_x + noise > -down_allowance(rel_c, noise);
}

/* At the same level, a service time half as long again or two thirds as
 * long as the level's usual one means the work itself changed. */
static int service_changed(double before_us, double now_us)
{
    return before_us > 0
           && (now_us > WORK_CHANGED * before_us || WORK_CHANGED * now_us < before_us);
}

/* Across a step, concurrency alone moves the service time between
 * unchanged (the work waits) and in proportion (it computes): outside that
 * range by half again, the work changed under the step. */
static int work_changed_under_step(const at_limit_t *c, double x, double conc)
{
    double ratio = conc / c->last_c;
    double before = c->last_c / c->last_x, now = conc / x;

    return now > WORK_CHANGED * before * (ratio > 1 ? ratio : 1)
           || WORK_CHANGED * now < before * (ratio < 1 ? ratio : 1);
}

/* The reference for the next step: this window alone. */
static void reference_is(at_limit_t *c, double x, double conc)
{
    c->last_x = x;
    c->last_c = conc;
    c->ref_n = 1;
}

/* Another window at the settled level: pooled with the ones before, the
 * oldest weighing less once REF_WINDOWS are in; or, if it differs from
 * them by more than three of its own standard errors (2 % at least), the
 * start of a new pool: the work is drifting (while it turns from waiting
 * to computing, say), and the old windows would make a step down look as
 * if it cost throughput for many windows. Returns whether it started a
 * new pool. */
static int pool_reference(at_limit_t *c, double x, double conc, double rse)
{
    double n = c->last_x > 0 ? c->ref_n : 0;
    int restarted = 0;

    if (n > 0 && fabs(x / c->last_x - 1) > REF_RESTART_SES * (rse > RSE_FLOOR ? rse : RSE_FLOOR)) {
        n = 0;
        restarted = 1;
    }

    c->last_x = (c->last_x * n + x) / (n + 1);
    c->last_c = (c->last_c * n + conc) / (n + 1);
    c->ref_n = n + 1 < REF_WINDOWS ? (apr_uint32_t)n + 1 : REF_WINDOWS;
    return restarted;
}

/* A probe from the settled level; one into a bound would change nothing
 * and waste the hold after it. Steps in a row so far (c->run): none after
 * a hold, one after a shed. */
static void probe(at_limit_t *c, int dir)
{
    if (dir < 0 ? c->limit <= c->min : c->limit >= c->max) {
        dir = -dir;
        c->run = 0;
    }
    take_step(c, dir);
}

/* Each request now takes r times as long at the same level: if it is the
 * bottleneck's work that grew, about 1 / r of the level keeps it as busy,
 * so the first step down sheds 1 - 1/r of the limit (20 - 80 %) instead of
 * 20 %. r is taken at the low end of what the window can tell (two
 * standard errors), so that one huge request among few counts for little. */
static double share_to_shed(double before_us, double service_us, double rse)
{
    double r = service_us / before_us * (1 - SHED_DOUBT_SES * rse);
    double share = r > 1 ? 1 - 1 / r : 0;

    return share < SHED_LEAST ? SHED_LEAST : share > SHED_MOST ? SHED_MOST : share;
}

/* How far a shed may go at once: the cores. Work that computes keeps
 * them all busy there however heavy each request grew; work bound on
 * something narrower is found by a probe down. */
static double shed_floor(const at_limit_t *c)
{
    return clamp(c, c->cores);
}

/* Whether the level runs more requests than a shed may leave: from there
 * the search goes on down as the second step of a run (40 %). */
static int above_shed_floor(const at_limit_t *c)
{
    return rounded(c->limit) > shed_floor(c);
}

/* The step down after the work grew is kept without being judged: the
 * window before caught the change half done and shows more throughput
 * than the old level gives, so against it any step down would look
 * costly. The next window at the new level is the reference for a probe,
 * at once: up from the floor, or on down as the second step of a run
 * (40 %, which noise fails half as often as 20 %: the shed does not know
 * how far above the knee the old level was). If that window shows the work
 * still changing, the limit looks again from it (shed_window). */
static void shed(at_limit_t *c, double share, double x, double conc)
{
    double floor = shed_floor(c);
    int above;

    if (c->limit > floor) {
        /* a shed after a shed not yet judged is judged from the first */
        c->shed_from = c->shed_from > c->limit ? c->shed_from : c->limit;
        step_by(c, -1, share);
        c->limit = c->limit < floor ? floor : c->limit;
    }
    above = above_shed_floor(c);
    c->settled = c->limit;
    c->mode = AT_MODE_SHED;
    c->dir = 0;
    /* at the floor the probe goes up, and the shed was no step of its run */
    c->run = above ? 1 : 0;
    /* The window that showed the change, kept only to be compared with the
     * next one (shed_window): no reference. */
    c->last_x = x;
    c->last_c = conc;
    c->ref_n = 0;
    c->baseline_us = 0;
    c->next_probe = above ? -1 : +1;
}

/* The work changed (a handler turned from waiting to computing, or
 * another program took the cores): what the level was judged by no longer
 * holds, so look again at once rather than after a hold, which at a long
 * service time is seconds. Down first if each request now takes longer: if
 * the work now waits instead, a step down that costs throughput turns the
 * search up in the next window. */
static void look_again(at_limit_t *c, double before_us, const at_window_t *w, double x,
                       double conc)
{
    int stepped_down = c->dir < 0 || c->mode == AT_MODE_SHED;

    c->hold = 0;
    c->run = 0;
    forget_the_top(c);
    if (w->service_us > before_us && c->limit > c->min) {
        /* the work grew heavier: shed */
        shed(c, share_to_shed(before_us, w->service_us, w->service_rse), x, conc);
        return;
    }
    /* the work grew lighter: step, from this window as the reference */
    reference_is(c, x, conc);
    c->settled = c->limit;
    c->baseline_us = w->service_us;
    if (stepped_down && above_shed_floor(c)) {
        /* The window may have measured the level before the step still
         * draining (requests let in at the old level run on), so lighter
         * work is not yet proven: on down, as after a shed. Work that turned
         * to waiting loses throughput on this step and turns the search up
         * at once (judge_step). At the cores, work that computes keeps its
         * service time, so a shorter one means lighter work: up. */
        c->run = 1;
        probe(c, -1);
    }
    else {
        probe(c, +1);
    }
    c->mode = AT_MODE_STEP;
}

/* Whether the work changed since the window in last_x (the one before a
 * step, or the one that made the limit shed) by more than the change of
 * level explains; if it did, the limit looks again from this window. */
static int look_again_if_changed(at_limit_t *c, const at_window_t *w, double x,
                                 double conc)
{
    if (!work_changed_under_step(c, x, conc)) {
        return 0;
    }
    look_again(c, c->last_c / c->last_x * 1e6, w, x, conc);
    return 1;
}

/* Across a step, work that waits keeps its service time, work that
 * computes changes it in proportion: nearer the first, throughput moves
 * with the requests running because the work waits. Below the
 * cores work that computes keeps its service time too (each request still
 * has a core to itself), so there it cannot be told. */
static int looks_waiting(const at_limit_t *c, double x, double conc)
{
    double before = c->last_c / c->last_x, now = conc / x, mid = (1 + conc / c->last_c) / 2;

    if (under_cores(c, conc)) {
        return 0;
    }
    return conc < c->last_c ? now > before * mid : now < before * mid;
}

/* Whether the held level is above the cores the controller was told of.
 * At or below them, and when they are not known, the doubt goes to the
 * lower limit and a step down passes at its first window: there it may be
 * work that computes finding its cores, and unconfirmed steps down are
 * what keeps noisy CPU-bound windows from creeping up. */
static int above_cores(const at_limit_t *c)
{
    return c->cores && rounded(c->settled) > c->cores;
}

/* Whether a probe that passed must pass more windows before the held
 * level moves to it (CONFIRMATIONS): one out of a hold once the climb has
 * found the knee, where a step's effect is within the windows' spread,
 * unless it is a step up that paid at least KNEE_SHARE (the work changed
 * under the hold); and the level between the climb's last two steps. */
static int needs_confirming(const at_limit_t *c, double x, double conc)
{
    return (c->mode == AT_MODE_PROBE || c->mode == AT_MODE_BETWEEN) && c->top
           && c->passes < CONFIRMATIONS
           && (c->dir < 0 ? above_cores(c) : near_knee(c, x, conc));
}

/* Whether a long step up of the climb (40 or 80 %) that did not pay
 * gained some throughput: its first window may see the slow start of the
 * many requests it let in at once (CGIs forking together), and the best
 * level is more likely between than below. */
static int gained_on_long_step_up(const at_limit_t *c, double x)
{
    return c->mode == AT_MODE_STEP && c->dir > 0 && step_was_long(c) && x > c->last_x;
}

/* The step after a shed moved throughput with the requests running, each
 * taking about as long (the work waits): down, it lost throughput; up
 * (from the cores, where a shed stops), it gained. Fewer running relieved
 * nothing, so what made the limit shed was not heavier work that more
 * requests at once slow further, but a service time grown by something
 * else: the CPU taken by refusals to clients that ask again at once,
 * another program. Back to the level before the shed; its service time
 * and reference are measured anew, and it is held. */
static void undo_shed(at_limit_t *c, double from)
{
    c->limit = c->settled = clamp(c, from);
    c->mode = AT_MODE_HOLD;
    c->dir = 0;
    c->run = 0;
    c->hold = AT_LIMIT_HOLD;
    c->next_probe = +1; /* the work waits: more may pay */
    c->last_x = 0;
    c->ref_n = 0;
    c->baseline_us = 0;
}

/* STEP, PROBE, BETWEEN: the window judges the step under test.
 * The rules are those of docs/adaptive-limit.md's table, in its order. */
static void judge_step(at_limit_t *c, double x, double conc, const at_window_t *w)
{
    int paid, waiting, overshot, was_down = c->dir < 0;
    double failed, shed_from = 0;

    if (look_again_if_changed(c, w, x, conc)) {
        /* The service time moved more than the step explains: the window
         * before the step measured other work and cannot judge it. */
        return;
    }
    paid = step_paid(c, x, conc, w->service_rse);
    waiting = looks_waiting(c, x, conc);
    if (paid != 1 || !needs_confirming(c, x, conc)) {
        shed_from = c->shed_from; /* this step judges the shed before it, if any */
        c->shed_from = 0;
    }
    if (rounded(shed_from) > rounded(c->limit) && waiting && paid == (was_down ? 0 : 1)) {
        undo_shed(c, shed_from);
        return;
    }
    if (paid == 1 && needs_confirming(c, x, conc)) {
        /* A step paid but is not yet confirmed: same level, same
         * reference, the next window judges it again. */
        c->passes++;
        return;
    }
    if (paid == 0 && gained_on_long_step_up(c, x)
        && probe_between(c, c->limit, AT_MODE_STEP)) {
        /* A long step up failed but gained: judged against the held
         * level's reference, which the failed step left as it was. */
        return;
    }
    c->passes = 0;
    if (paid == 1) {
        double below = c->last_c;
        int knee = near_knee(c, x, conc), long_step = step_was_long(c);

        /* The new level's own service time: a climb from 3 to 64 takes
         * the service time of a CGI that waits from 200 to 400 ms, which
         * against the old level's would look like changed work. */
        c->settled = c->limit;
        c->baseline_us = w->service_us;
        reference_is(c, x, conc);
        c->top |= knee;
        if (knee && long_step && probe_between(c, below, AT_MODE_BETWEEN)) {
            /* The knee, after a long step: a step down at the top,
             * confirmed like a probe there. */
            return;
        }
        if (knee) {
            /* Diminishing returns: the next step is the smallest. */
            c->run = 0;
        }
        take_step(c, c->dir); /* the step paid: go on the same way */
        c->mode = AT_MODE_STEP;
        return;
    }
    /* Rows 12 - 14: back to the held level, whose reference still holds. */
    failed = c->limit;
    c->top |= paid == 0 && c->dir > 0;
    overshot = return_to_held(c);
    if (paid == 0 && was_down && c->settled < c->max && waiting) {
        /* A step down failed and the work waits: throughput fell with
         * concurrency and the work waits rather than computes, so more of
         * it may pay. Look above at once, instead of
         * holding: after the load turns from computing to waiting, this is
         * what gets the limit climbing within seconds. While work turns
         * to computing, throughput also seems to fall with a step down
         * (each window's requests are heavier than the last's), but the
         * service time shortens with the step: no reason to climb. */
        c->hold = 0;
        c->next_probe = +1;
    }
    else if (overshot && failed < c->settled) {
        /* A long step failed: it overshot. Not up: a second probe up is a
         * second chance for noise to look like a gain. */
        probe_between(c, failed, AT_MODE_STEP);
    }
}

/* HOLD: a window at the held level joins its reference; once the hold
 * has run out, a probe. */
static void hold_window(at_limit_t *c, double x, double conc, const at_window_t *w)
{
    double service_us = w->service_us;
    int new_pool;

    if (service_changed(c->baseline_us, service_us)) {
        look_again(c, c->baseline_us, w, x, conc); /* the work changed while held */
        return;
    }
    new_pool = pool_reference(c, x, conc, w->service_rse);
    c->baseline_us = c->baseline_us > 0 ? (1 - BASELINE_WEIGHT) * c->baseline_us
                                              + BASELINE_WEIGHT * service_us
                                         : service_us;
    if (c->hold > 0) {
        c->hold--; /* still holding, or a new reference pool */
        return;
    }
    if (new_pool) {
        /* Still holding. One window off the pool may be a dip, not a drift: a step
         * down judged against a dip alone looks free. */
        return;
    }
    probe(c, c->next_probe); /* the hold ran out: probe the way due */
    c->mode = AT_MODE_PROBE;
}

/* SHED: the window after a shed. If the work went on changing since the
 * window that made the limit shed, which caught it early, a reference
 * taken now, while it still grows heavier, would make every step down look
 * as if it cost throughput: the limit sheds by what the growth since calls
 * for; if the work turned lighter, the window that made it shed may have
 * measured the level before still draining, and the search goes on down
 * unless at the cores (above_shed_floor). Otherwise this window is the
 * reference for a probe at once (shed() chose its way). */
static void shed_window(at_limit_t *c, double x, double conc, const at_window_t *w)
{
    if (look_again_if_changed(c, w, x, conc)) {
        return; /* the work changed again since the shed */
    }
    c->mode = AT_MODE_HOLD; /* after a shed, probe as from a hold */
    hold_window(c, x, conc, w);
}

/* Whether a window in which nobody waited still shows requests slowing
 * each other: each took WORK_CHANGED times as long as at the held level,
 * with more of them running than the cores. The work grew heavier, or more
 * of it came, and a limit above what runs would let all of it in: after
 * waiting work climbed past its demand and turned to computing, say. */
static int slowed_under_the_limit(const at_limit_t *c, const at_window_t *w,
                                  double conc)
{
    return c->baseline_us > 0 && rounded(conc) > c->cores
           && w->service_us > WORK_CHANGED * c->baseline_us;
}

/* Nobody waited. Demand stayed under the limit: nobody waited, so the level is
 * good enough, and the window says nothing about another one. The limit
 * never grows here, however fast requests are served. The service time
 * is kept as the level's only if it has none yet (the check for a service
 * time grown while nobody waited compares with it):
 * with fewer running it is shorter than at the limit. */
static void under_demand(at_limit_t *c, const at_window_t *w)
{
    c->settled = c->limit;
    c->mode = AT_MODE_HOLD;
    c->dir = 0;
    c->run = 0;
    c->last_x = 0;
    c->ref_n = 0;
    c->shed_from = 0;
    if (c->baseline_us <= 0) {
        c->baseline_us = w->service_us;
    }
    forget_the_top(c);
}

int at_limit_enough_samples(const at_limit_t *c, apr_uint32_t n, double sum_us,
                            double sumsq_us)
{
    /* a share of the smallest step: 20 % of the limit, or 1 */
    double tolerance = SAMPLE_TOLERANCE / at_limit_value(c);
    double mean, var;

    if (n >= AT_LIMIT_MIN_SAMPLES) {
        return 1;
    }
    if (n < AT_LIMIT_FEW_SAMPLES || sum_us <= 0) {
        return 0;
    }
    mean = sum_us / n;
    var = (sumsq_us - sum_us * mean) / (n - 1);
    /* var < 0 only by rounding, when all took the same time */
    if (tolerance < RSE_FLOOR) {
        tolerance = RSE_FLOOR;
    }
    return var <= 0 || sqrt(var / n) <= tolerance * mean;
}

int at_limit_update(at_limit_t *c, const at_window_t *w)
{
    apr_uint32_t before = at_limit_value(c);
    double x, conc;

    if (w->completed < AT_LIMIT_FEW_SAMPLES || w->secs <= 0 || w->inflight <= 0
        || w->service_us <= 0) {
        return 0;
    }
    /* Little's law: throughput = running / service time. Counting
     * completions would be noisier: 20 of them in a window come in waves. */
    x = w->inflight * 1e6 / w->service_us;
    conc = w->inflight;
    c->recent_us = w->service_us;
    if (w->limited < 0.5 && slowed_under_the_limit(c, w, conc)) {
        /* Nobody waited, yet the service time grew with more running than
         * the cores: the level that ran is the one to shed from. */
        c->limit = clamp(c, ceil(conc));
        look_again(c, c->baseline_us, w, x, conc);
    }
    else if (w->limited < 0.5) {
        under_demand(c, w);
    }
    else {
        switch (c->mode) {
        case AT_MODE_HOLD:
            hold_window(c, x, conc, w);
            break;
        case AT_MODE_SHED:
            shed_window(c, x, conc, w);
            break;
        case AT_MODE_STEP:
        case AT_MODE_PROBE:
        case AT_MODE_BETWEEN:
            judge_step(c, x, conc, w);
            break;
        }
    }
    if (at_limit_value(c) != before) {
        c->changes++;
        return 1;
    }
    return 0;
}
