/*
 * The adaptive limit's controller: a hill climb on throughput that prefers
 * the lowest limit giving the most throughput. See docs/adaptive-limit.md.
 *
 * It judges each step by what it did to throughput (requests running per
 * second of service), not by latency against a remembered baseline: one has to
 * be measured at low concurrency, and getting one under load means pinning
 * the limit down, which is what makes other controllers refuse requests
 * while they re-measure.
 */
#include "at_limit.h"

#include <math.h>
#include <string.h>

/* A step up is worth it when at least this share of the relative change
 * in concurrency shows as a relative change in throughput. S4's sleep-bound
 * CGI gives 0.87 x the throughput at 32 that it gives at 64, a share of
 * 0.2 all the way: with 0.2 here, steps up that high passed as often as
 * they failed and the limit stopped at 31 - 38 (0.87 - 0.90 x). */
#define WORTH_UP 0.15
/* A step down may cost throughput up to this share of the relative change
 * in concurrency when windows are too noisy to tell finer (CPU-bound work
 * at a few requests, known to 4 - 7 %: the doubt goes to the lower limit),
 * and down to DOWN_LEAST when they are precise; in between, the noise of
 * the comparison. With 0.2 for precise windows too, the limit walked down
 * a flat top in steps that each lost a little: 64 -> 51 -> 31 in S4. */
#define DOWN_MOST 0.2
#define DOWN_LEAST 0.1
/* Standard errors of the comparison a throughput change must exceed to
 * count: the window's own and the reference's, taken as just as noisy per
 * window. 1.5 cost the simulated knee a tenth of its throughput; 1 costs
 * it 4 % and already stops the creep (t/unit/test_limit.c). */
#define NOISE_SES 1.0
/* A step up that paid less than this share of its change in concurrency
 * as a change in throughput reached the knee: a long one (40 or 80 %) went
 * past it, and the level between is tried next; after a short one the
 * steps stop growing. In S4's switch the climb 17 -> 31 paid 0.75 of its
 * step and 31 -> 57 paid 0.19; 42 - 45 gave what 57 and 64 gave, but the
 * limit spent 8 s at 57 - 64 before a probe down found it. */
#define KNEE_SHARE 0.5
/* Windows held after a step below the cores did not pay: work that
 * computes loses a core's share of its throughput there (in S4, on 2 cores,
 * 16 of 116 CPU-bound windows ran at 1, a tenth of the time at half the
 * throughput), and work bound on something narrower shows at the first
 * such step, which pays. */
#define CORES_HOLD (3 * AT_LIMIT_HOLD)
/* Steps smaller than this change in concurrency cannot be judged. */
#define MIN_REL_CHANGE 0.02
/* Windows after its first that a probe at the top must also pass, judged
 * against the same reference, before the held level moves to it. On a flat
 * top a probe's effect is 2 - 3 %, and S4's windows there differ from one
 * another by 4 - 6 % while each reports 1 - 2 %: judged by one window,
 * probes both ways passed by chance and the held level walked 31 - 59 long
 * after the climb (a simulated switch with 4 % window spread: the held
 * level settled after more than 10 s in 160 of 500 runs; judged by two
 * windows, 73). Two windows still agreed by chance often enough that the
 * limit itself, counting the probes around a held level that moved late,
 * left the +-25 % band around where it ended after 10 s in 384 of 1,000
 * simulated switches (windows of two service times differing by 5 %);
 * judged by three, in 276, at 0.950 x the throughput of 64 from 10 s on
 * instead of 0.946 x. */
#define CONFIRMATIONS 2
/* Windows at the settled level pooled into the reference a probe is judged
 * against: one window alone is as noisy as the window under test, which
 * doubles the noise of the comparison; four cut it by a third. */
#define REF_WINDOWS 4

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

/* While climbing, a window of two service times tells a step that pays in
 * proportion from one that does not. At the top a step's effect is 2 - 3 %,
 * and windows of two service times differ from one another by 4 - 6 %
 * (S4's sleeping CGI at 41 - 64): twice as long, half the variance. */
apr_uint32_t at_limit_window_services(const at_limit_t *c)
{
    return c->at_top ? 2 * AT_LIMIT_WINDOW_SERVICES : AT_LIMIT_WINDOW_SERVICES;
}

/* What the climb found no longer holds (the work changed, or demand fell
 * under the limit): the next climb is judged with short windows and
 * unconfirmed steps. */
static void forget_the_top(at_limit_t *c)
{
    c->at_top = 0;
    c->from_hold = 0;
    c->confirming = 0;
    c->middle = 0;
    c->second_look = 0;
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
    step_by(c, dir, 0.2 * (double)(1u << (c->run < 2 ? c->run : 2)));
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

/* The step did not pay: back to the last good level, stay there a while,
 * then try the other way. After steps that paid, the one that did not was
 * a larger one (40 or 80 % of the limit, the steps growing while they
 * pay): the best level lies between, so the search goes on the same way
 * at once (probe_between). Turning round instead left a CPU-bound limit
 * that came down 12 -> 9 -> 6 -> 1 at 6, three times the cores, for 7 s of
 * holds and a probe up. Returns whether the step overshot. */
static int settle(at_limit_t *c)
{
    int overshot = c->dir && step_was_long(c);
    int below_cores = c->dir < 0 && under_cores(c, c->limit);

    c->next_probe = overshot ? c->dir : c->dir ? -c->dir : -c->next_probe;
    c->limit = c->settled;
    c->dir = 0;
    c->run = 0;
    c->hold = overshot ? 0 : below_cores ? CORES_HOLD : AT_LIMIT_HOLD;
    return overshot;
}

/* Down, the level between is their geometric middle, tried at once and
 * judged against the last good level's reference; a middle that pays is
 * followed by the smallest step. S4's CPU-bound limit that came down
 * 12 -> 7 -> 1 on 2 cores then spent 3 s at 7 -> 6 -> 4 -> 1 -> 4 before
 * 3; now 7 -> 3. Up, and when rounding leaves no level between, the last
 * good level runs a window and the smallest step follows: a second probe
 * up is a second chance for noise to look like a gain (on 2 cores, 1 run
 * in 300 then crept to 5). The same middle, below a long step up that
 * reached the knee (KNEE_SHARE). Returns whether there is a level between
 * the settled one and `other` to try. */
static int probe_between(at_limit_t *c, double other)
{
    double mid = sqrt(c->settled * other);
    double m = rounded(mid);

    if (other > c->settled || m == rounded(c->settled) || m == rounded(other)) {
        return 0;
    }
    c->dir = -1;
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
 * goes to the lower limit both ways: a window of CPU-bound work is known
 * to 4 - 7 %, and judged without that, chance let the limit of a
 * CPU-bound zone creep to several times the cores in one simulated run in
 * six.
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
    return before_us > 0 && (now_us > 1.5 * before_us || 1.5 * now_us < before_us);
}

/* Across a step, concurrency alone moves the service time between
 * unchanged (the work waits) and in proportion (it computes): outside that
 * range by half again, the work changed under the step. */
static int work_changed_under_step(const at_limit_t *c, double x, double conc)
{
    double ratio = conc / c->last_c;
    double before = c->last_c / c->last_x, now = conc / x;

    return now > 1.5 * before * (ratio > 1 ? ratio : 1)
           || 1.5 * now < before * (ratio < 1 ? ratio : 1);
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

    if (n > 0 && fabs(x / c->last_x - 1) > 3 * (rse > 0.02 ? rse : 0.02)) {
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
    double r = service_us / before_us * (1 - 2 * rse);
    double share = r > 1 ? 1 - 1 / r : 0;

    return share < 0.2 ? 0.2 : share > 0.8 ? 0.8 : share;
}

/* How far a shed may go at once: the cores. Work that computes keeps
 * them all busy there however heavy each request grew; below them a shed
 * could only suit work bound on something narrower, which a probe down
 * still finds. In S4's switch from a CPU-burning CGI to a sleeping one the
 * service time at 2 on 2 cores tripled, the limit shed to 1, and the
 * windows at 1 and back at 2 took 2.4 s of the climb. */
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
 * window it would be judged against caught the change half done (its
 * requests started while lighter ones ran, so by Little's law it shows
 * more throughput than the level gives), and against it any step down
 * looks as if it cost throughput. The next window at the new level is the
 * reference for a probe, at once: up from the floor, or further down as
 * the second step of a run, 40 %. Unless that window shows the work still
 * changing since the one that made the limit shed, beyond what the shed
 * itself explains (work_changed_under_step): then the shed came early in
 * the change, and the limit looks again from the new window (after_shed).
 * Work turning heavier over four windows took a limit of 64 to 4 or less
 * in at most 15 windows without that, 4 with it. The shed only knows how
 * much heavier each request grew, not how far above the knee the old
 * level was: in S4's switch back to computing it left 8 - 18 on 2 cores.
 * With windows known to 5 %, a 20 % probe from there fails by chance when
 * the two differ by 10 % (1.5 standard errors: 7 % of the time); the
 * search then turned up, the failed step up after it marked a top, and
 * there probes down wait for holds and confirmation: in 70 of 1,000
 * simulated switches the held level reached the cores after 10 s. A 40 %
 * step fails by chance at 14 % (2 standard errors), and then the level
 * between is tried at once: 16 of 1,000. */
static void shed(at_limit_t *c, double share, double x, double conc)
{
    double floor = shed_floor(c);
    int above;

    if (c->limit > floor) {
        step_by(c, -1, share);
        c->limit = c->limit < floor ? floor : c->limit;
    }
    above = above_shed_floor(c);
    c->settled = c->limit;
    c->dir = 0;
    /* at the floor the probe goes up, and the shed was no step of its run */
    c->run = above ? 1 : 0;
    /* The window that showed the change, kept only to be compared with the
     * next one (after_shed): no reference. */
    c->last_x = x;
    c->last_c = conc;
    c->ref_n = 0;
    c->baseline_us = 0;
    c->next_probe = above ? -1 : +1;
}

/* Whether the last window was the one that showed the work changing and
 * made the limit shed: shed() keeps it without making it a reference. */
static int after_shed(const at_limit_t *c)
{
    return c->ref_n == 0 && c->last_x > 0;
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
    int stepped_down = c->dir < 0 || after_shed(c);

    c->hold = 0;
    c->run = 0;
    forget_the_top(c);
    if (w->service_us > before_us && c->limit > c->min) {
        shed(c, share_to_shed(before_us, w->service_us, w->service_rse), x, conc);
        return;
    }
    reference_is(c, x, conc);
    c->settled = c->limit;
    c->baseline_us = w->service_us;
    if (stepped_down && above_shed_floor(c)) {
        /* The window may have measured the level before the step still
         * draining: a shed from 51 to 13 on 2 cores leaves 51 CGIs burning
         * for over a second, and the window at 13 after the settling
         * measured them (1.1 s a request; at 8 next, 0.28 s). Work that
         * computes runs such a level down to its cores, so the search goes
         * on down, as after a shed; turning up (8 -> 10 in S4's proxied
         * switch) failed and held the limit 5 s above the cores. Work that
         * turned to waiting loses throughput on this step and turns the
         * search up at once (judge_step). At the cores work that computes
         * keeps its service time, so a shorter one means lighter work: up. */
        c->run = 1;
        probe(c, -1);
        return;
    }
    probe(c, +1);
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

/* Across a step down, work that waits keeps its service time, work that
 * computes shortens it in proportion: nearer the first, fewer running
 * lose throughput because the work waits, and more may pay. Below the
 * cores work that computes keeps its service time too (each request still
 * has a core to itself), so there it cannot be told. */
static int looks_waiting(const at_limit_t *c, double x, double conc)
{
    double before = c->last_c / c->last_x, now = conc / x;

    return !under_cores(c, conc) && now > before * (1 + conc / c->last_c) / 2;
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
 * level moves to it (CONFIRMATIONS): one out of a hold, once the climb has
 * found the knee, unless it is a step up that paid at least KNEE_SHARE (the
 * work changed under the hold, and the climb should not wait); and the
 * level between the climb's last two steps, a step down at the top like
 * any other there. Judged by one window, that level (41 -> 31 on S4's
 * gentle top) passed now and then, and the held level then took 10 - 20 s
 * to walk back up by confirmed steps. */
static int needs_confirming(const at_limit_t *c, double x, double conc)
{
    return (c->from_hold || c->middle) && c->at_top && c->confirming < CONFIRMATIONS
           && (c->dir < 0 ? above_cores(c) : near_knee(c, x, conc));
}

/* Whether a long step up of the climb (40 or 80 %) that did not pay but
 * gained some throughput is to be judged again by its next window, alone,
 * before it ends the climb: its first window may see the slow start of the
 * requests it let in at once. On S4's server (2026-11-25) the first window
 * at 41 after 23 failed in 2 of 24 runs, gaining 6 % and -1 %, and in a
 * traced run before them 9.6 % (11.7 % and the noise were needed), where
 * it gained 16 - 44 % in the 22 runs it passed; the traced one measured a
 * service time of 392 ms where the windows at 38 a few seconds later
 * measured 326 - 336 ms (18 CGIs forking together on 2 cores). The climb
 * then ended at 23 and the held level reached 38 - 47 by confirmed 20 %
 * steps 10 - 20 s later. Work that computes gains nothing from a long step
 * above its cores, so about half its such steps get a second window, which
 * must pass alone. */
static int worth_a_second_look(const at_limit_t *c, double x)
{
    return c->dir > 0 && step_was_long(c) && !c->from_hold && !c->second_look
           && x > c->last_x;
}

static void judge_step(at_limit_t *c, double x, double conc, const at_window_t *w)
{
    int paid, waiting, overshot, was_down = c->dir < 0;
    double failed;

    if (look_again_if_changed(c, w, x, conc)) {
        /* The window before the step measured other work: it cannot judge
         * the step. */
        return;
    }
    paid = step_paid(c, x, conc, w->service_rse);
    waiting = looks_waiting(c, x, conc);
    if (paid == 1 && needs_confirming(c, x, conc)) {
        /* Same level, same reference: the next window judges it again. */
        c->confirming++;
        return;
    }
    if (paid == 0 && worth_a_second_look(c, x)) {
        /* Same level, same reference: the next window judges it alone. */
        c->second_look = 1;
        return;
    }
    c->second_look = 0;
    c->confirming = 0;
    c->from_hold = 0;
    c->middle = 0;
    if (paid == 1) {
        double below = c->last_c;
        int knee = near_knee(c, x, conc), long_step = step_was_long(c);

        /* The new level's own service time: a climb from 3 to 64 takes
         * the service time of a CGI that waits from 200 to 400 ms, which
         * against the old level's would look like changed work. */
        c->settled = c->limit;
        c->baseline_us = w->service_us;
        reference_is(c, x, conc);
        c->at_top |= knee;
        if (knee && long_step && probe_between(c, below)) {
            /* a step down at the top like a probe out of a hold there */
            c->middle = 1;
            return;
        }
        if (knee) {
            /* Diminishing returns: the next step is the smallest. */
            c->run = 0;
        }
        take_step(c, c->dir);
        return;
    }
    /* Back to the settled level, whose reference still holds. */
    failed = c->limit;
    c->at_top |= paid == 0 && c->dir > 0;
    overshot = settle(c);
    if (paid == 0 && was_down && c->settled < c->max && waiting) {
        /* Throughput fell with concurrency and the work waits rather than
         * computes: more of it may pay. Look above at once, instead of
         * holding: after the load turns from computing to waiting, this is
         * what gets the limit climbing within seconds. While work turns
         * to computing, throughput also seems to fall with a step down
         * (each window's requests are heavier than the last's), but the
         * service time shortens with the step: no reason to climb. */
        c->hold = 0;
        c->next_probe = +1;
    }
    else if (overshot) {
        probe_between(c, failed);
    }
}

static void hold_or_probe(at_limit_t *c, double x, double conc, const at_window_t *w)
{
    double service_us = w->service_us;
    int new_pool;

    if (after_shed(c) && look_again_if_changed(c, w, x, conc)) {
        /* The window that showed the change caught it early, and the work
         * went on changing after it: a reference taken now, while it still
         * grows heavier, would make every step down look as if it cost
         * throughput. So the limit sheds by what the growth since calls
         * for; if the work turned lighter, the window that made it shed
         * may have measured the level before still draining, and the
         * search goes on down unless at the cores (above_shed_floor). */
        return;
    }
    if (service_changed(c->baseline_us, service_us)) {
        look_again(c, c->baseline_us, w, x, conc);
        return;
    }
    new_pool = pool_reference(c, x, conc, w->service_rse);
    c->baseline_us = c->baseline_us > 0 ? 0.75 * c->baseline_us + 0.25 * service_us
                                         : service_us;
    if (c->hold > 0) {
        c->hold--;
        return;
    }
    if (new_pool) {
        /* One window off the pool may be a dip, not a drift: a step down
         * judged against a dip alone looks free. */
        return;
    }
    probe(c, c->next_probe);
    c->from_hold = 1;
}

int at_limit_enough_samples(const at_limit_t *c, apr_uint32_t n, double sum_us,
                            double sumsq_us)
{
    /* a tenth of the smallest step: 20 % of the limit, or 1 */
    double tolerance = 0.1 / at_limit_value(c);
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
    if (tolerance < 0.02) {
        tolerance = 0.02;
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
    if (w->limited < 0.5) {
        /* Demand stayed under the limit: nobody waited, so the level is
         * good enough, and the window says nothing about another one. The
         * limit never grows here, however fast requests are served. */
        c->settled = c->limit;
        c->dir = 0;
        c->run = 0;
        c->last_x = 0;
        forget_the_top(c);
    }
    else if (c->dir && c->last_x > 0) {
        judge_step(c, x, conc, w);
    }
    else {
        hold_or_probe(c, x, conc, w);
    }
    if (at_limit_value(c) != before) {
        c->changes++;
        return 1;
    }
    return 0;
}
