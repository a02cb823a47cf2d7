/*
 * The inside of the adaptive limit's controller, shared by its two files
 * and by nothing else: the tunables, a few small helpers, and what a
 * window shows (at_limit_window.c), which the controller (at_limit.c)
 * acts on. The controller calls the window's tests, never the reverse.
 */
#ifndef AT_LIMIT_IMPL_H
#define AT_LIMIT_IMPL_H

#include "at_limit.h"

#include <math.h>

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

static inline double clamp(const at_limit_t *c, double v)
{
    return v < c->min ? c->min : v > c->max ? c->max : v;
}

/* The number of requests a level runs. */
static inline double rounded(double v)
{
    return floor(v + 0.5);
}

/* Whether a level runs fewer requests than the cores the work can use. */
static inline int under_cores(const at_limit_t *c, double level)
{
    return rounded(level) < c->cores;
}

/* Whether the step under test was one of 40 or 80 %: steps grew to it
 * because the ones before paid. */
static inline int step_was_long(const at_limit_t *c)
{
    return c->run > 1;
}

/* at_limit_window.c: what a window shows, against the reference or the
 * held level; none of these changes the controller. */
int limit_near_knee(const at_limit_t *c, double x, double conc);
int limit_step_paid(const at_limit_t *c, double x, double conc, double rse);
int limit_service_changed(double before_us, double now_us);
int limit_work_changed_under_step(const at_limit_t *c, double x, double conc);
double limit_share_to_shed(double before_us, double service_us, double rse);
int limit_looks_waiting(const at_limit_t *c, double x, double conc);
int limit_needs_confirming(const at_limit_t *c, double x, double conc);
int limit_gained_on_long_step_up(const at_limit_t *c, double x);
int limit_slowed_under_the_limit(const at_limit_t *c, const at_window_t *w, double conc);

#endif
