/*
 * The adaptive limit's controller: a hill climb on throughput that prefers
 * the lowest limit giving the most throughput. See docs/adaptive-limit.md.
 *
 * It judges each step by what it did to throughput (requests running per
 * second of service), not by latency against a remembered baseline, which
 * has to be measured at low concurrency: pinning the limit down to get one
 * is what makes other controllers refuse requests while they re-measure.
 * What a window shows is read in at_limit_window.c; the tunables are in
 * at_limit_impl.h.
 */
#include "at_limit_impl.h"

#include <string.h>

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
        shed(c, limit_share_to_shed(before_us, w->service_us, w->service_rse), x, conc);
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
    if (!limit_work_changed_under_step(c, x, conc)) {
        return 0;
    }
    look_again(c, c->last_c / c->last_x * 1e6, w, x, conc);
    return 1;
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
    int paid, waiting, unconfirmed, overshot, was_down = c->dir < 0;
    double failed, shed_from = 0;

    if (look_again_if_changed(c, w, x, conc)) {
        /* The service time moved more than the step explains: the window
         * before the step measured other work and cannot judge it. */
        return;
    }
    paid = limit_step_paid(c, x, conc, w->service_rse);
    waiting = limit_looks_waiting(c, x, conc);
    unconfirmed = paid == 1 && limit_needs_confirming(c, x, conc);
    if (!unconfirmed) {
        shed_from = c->shed_from; /* this step judges the shed before it, if any */
        c->shed_from = 0;
    }
    if (rounded(shed_from) > rounded(c->limit) && waiting && paid == (was_down ? 0 : 1)) {
        undo_shed(c, shed_from);
        return;
    }
    if (unconfirmed) {
        /* A step paid but is not yet confirmed: same level, same
         * reference, the next window judges it again. */
        c->passes++;
        return;
    }
    if (paid == 0 && limit_gained_on_long_step_up(c, x)
        && probe_between(c, c->limit, AT_MODE_STEP)) {
        /* A long step up failed but gained: judged against the held
         * level's reference, which the failed step left as it was. */
        return;
    }
    c->passes = 0;
    if (paid == 1) {
        double below = c->last_c;
        int knee = limit_near_knee(c, x, conc), long_step = step_was_long(c);

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

    if (limit_service_changed(c->baseline_us, service_us)) {
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
    if (w->limited < 0.5 && limit_slowed_under_the_limit(c, w, conc)) {
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
