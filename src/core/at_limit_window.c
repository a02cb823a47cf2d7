/*
 * The adaptive limit: what a window shows. Each test here reads the
 * controller and one window (against the reference, the held level or
 * the window before) and changes nothing; at_limit.c decides what to do.
 */
#include "at_limit_impl.h"

/* Whether the step up just judged paid so little of its change in
 * concurrency that it reached the knee: KNEE_SHARE. */
int limit_near_knee(const at_limit_t *c, double x, double conc)
{
    double rel_c = conc / c->last_c - 1;

    return c->dir > 0 && rel_c > 0 && (x / c->last_x - 1) < KNEE_SHARE * rel_c;
}

/* How much throughput a step down of rel_c may cost, judged with this
 * noise: see DOWN_MOST. */
static double limit_down_allowance(double rel_c, double noise)
{
    double most = DOWN_MOST * fabs(rel_c), least = DOWN_LEAST * fabs(rel_c);

    return noise < least ? least : noise > most ? most : noise;
}

/* Whether the step under test paid: up, throughput rose with concurrency
 * by more than WORTH_UP of it plus the noise of the comparison; down, it
 * did not fall by more than limit_down_allowance() plus that noise. The doubt
 * goes to the lower limit both ways, or noise alone makes a limit creep.
 * -1: cannot tell. */
int limit_step_paid(const at_limit_t *c, double x, double conc, double rse)
{
    double rel_c = conc / c->last_c - 1, rel_x = x / c->last_x - 1;
    double noise = NOISE_SES * rse * sqrt(1 + 1.0 / (c->ref_n ? c->ref_n : 1));

    if (fabs(rel_c) < MIN_REL_CHANGE || (rel_c > 0) != (c->dir > 0)) {
        return -1;
    }
    if (c->dir > 0) {
        return rel_x - noise >= WORTH_UP * rel_c;
    }
    return rel_x + noise > -limit_down_allowance(rel_c, noise);
}

/* At the same level, a service time half as long again or two thirds as
 * long as the level's usual one means the work itself changed. */
int limit_service_changed(double before_us, double now_us)
{
    return before_us > 0 &&
           (now_us > WORK_CHANGED * before_us || WORK_CHANGED * now_us < before_us);
}

/* Across a step, concurrency alone moves the service time between
 * unchanged (the work waits) and in proportion (it computes): outside that
 * range by half again, the work changed under the step. */
int limit_work_changed_under_step(const at_limit_t *c, double x, double conc)
{
    double ratio = conc / c->last_c;
    double before = c->last_c / c->last_x, now = conc / x;

    return now > WORK_CHANGED * before * (ratio > 1 ? ratio : 1) ||
           WORK_CHANGED * now < before * (ratio < 1 ? ratio : 1);
}

/* Each request now takes r times as long at the same level: if it is the
 * bottleneck's work that grew, about 1 / r of the level keeps it as busy,
 * so the first step down sheds 1 - 1/r of the limit (20 - 80 %) instead of
 * 20 %. r is taken at the low end of what the window can tell (two
 * standard errors), so that one huge request among few counts for little. */
double limit_share_to_shed(double before_us, double service_us, double rse)
{
    double r = service_us / before_us * (1 - SHED_DOUBT_SES * rse);
    double share = r > 1 ? 1 - 1 / r : 0;

    return share < SHED_LEAST ? SHED_LEAST : share > SHED_MOST ? SHED_MOST : share;
}

/* Across a step, work that waits keeps its service time, work that
 * computes changes it in proportion: nearer the first, throughput moves
 * with the requests running because the work waits. Below the
 * cores work that computes keeps its service time too (each request still
 * has a core to itself), so there it cannot be told. */
int limit_looks_waiting(const at_limit_t *c, double x, double conc)
{
    double before = c->last_c / c->last_x, now = conc / x,
           mid = (1 + conc / c->last_c) / 2;

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
static int limit_above_cores(const at_limit_t *c)
{
    return c->cores && rounded(c->settled) > c->cores;
}

/* Whether a probe that passed must pass more windows before the held
 * level moves to it (CONFIRMATIONS): one out of a hold once the climb has
 * found the knee, where a step's effect is within the windows' spread,
 * unless it is a step up that paid at least KNEE_SHARE (the work changed
 * under the hold); and the level between the climb's last two steps. */
int limit_needs_confirming(const at_limit_t *c, double x, double conc)
{
    return (c->mode == AT_MODE_PROBE || c->mode == AT_MODE_BETWEEN) && c->top &&
           c->passes < CONFIRMATIONS &&
           (c->dir < 0 ? limit_above_cores(c) : limit_near_knee(c, x, conc));
}

/* Whether a long step up of the climb (40 or 80 %) that did not pay
 * gained some throughput: its first window may see the slow start of the
 * many requests it let in at once (CGIs forking together), and the best
 * level is more likely between than below. */
int limit_gained_on_long_step_up(const at_limit_t *c, double x)
{
    return c->mode == AT_MODE_STEP && c->dir > 0 && step_was_long(c) && x > c->last_x;
}

/* Whether a window in which nobody waited still shows requests slowing
 * each other: each took WORK_CHANGED times as long as at the held level,
 * with more of them running than the cores. The work grew heavier, or more
 * of it came, and a limit above what runs would let all of it in: after
 * waiting work climbed past its demand and turned to computing, say. */
int limit_slowed_under_the_limit(const at_limit_t *c, const at_window_t *w, double conc)
{
    return c->baseline_us > 0 && rounded(conc) > c->cores &&
           w->service_us > WORK_CHANGED * c->baseline_us;
}
