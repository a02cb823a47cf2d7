/*
 * The adaptive limit's controller (limit=auto): from what a zone measured
 * over a window of time, decide the limit for the next one. Pure
 * arithmetic on a small state kept in the zone; no clocks, no locks, so it
 * can be driven by a simulated workload in the unit tests.
 *
 * The algorithm and why: docs/adaptive-limit.md.
 */
#ifndef AT_LIMIT_H
#define AT_LIMIT_H

#include <apr.h>

/* A window is judged once this many requests completed in it, or once
 * AT_LIMIT_FEW_SAMPLES did and their mean service time is known to a tenth
 * of the smallest step (20 % of the limit, or 1): the relative standard
 * error of the mean within max(0.02, 0.1 / limit). A handler that sleeps
 * 200 ms at a limit of 1 is then judged every 1.2 s instead of every 4 s. */
#define AT_LIMIT_MIN_SAMPLES 20
#define AT_LIMIT_FEW_SAMPLES 6
/* Informative windows spent at the best level between two probes. */
#define AT_LIMIT_HOLD 3
/* service times a window lasts while the limit climbs */
#define AT_LIMIT_WINDOW_SERVICES 2

/* What a zone saw during one window. */
typedef struct {
    apr_uint32_t completed; /* requests that gave their slot back */
    double service_us;      /* their mean service time (slot held), without
                               the slowest one */
    double service_rse;     /* the relative standard error of that mean, from
                               all of them (0: unknown) */
    double inflight;        /* time-weighted mean of requests running */
    double limited;         /* share of the window (0 - 1) with requests waiting */
    double secs;            /* length of the window */
} at_window_t;

/* What the controller is doing. Each window moves it from one mode to
 * the next by a row of the table in docs/adaptive-limit.md ("The modes");
 * at_limit_update()'s switch follows that table. */
typedef enum {
    AT_MODE_HOLD,    /* at the held level, pooling its reference; a probe
                         once `hold` windows have passed */
    AT_MODE_SHED,    /* just shed for heavier work: the next window is
                         compared with the one that showed it */
    AT_MODE_STEP,    /* a step of a run (a climb, or a walk down) under test */
    AT_MODE_PROBE,   /* a probe out of a hold under test */
    AT_MODE_BETWEEN  /* the level between the climb's last two under test */
} at_limit_mode_t;

typedef struct {
    double limit;          /* the current value; the zone runs round(limit) */
    apr_uint32_t min, max;
    apr_uint32_t cores;    /* CPUs the work can use; 0: not known */
    at_limit_mode_t mode;
    int top;               /* the climb found the knee: steps up stopped
                              paying (longer windows, probes confirmed) */
    int dir;               /* direction of the step under test: +1, -1;
                              0 in HOLD and SHED */
    apr_uint32_t run;      /* steps taken in that direction in a row */
    apr_uint32_t passes;   /* PROBE, BETWEEN: windows passed beyond the first */
    apr_uint32_t hold;     /* HOLD: windows left before the probe */
    int next_probe;        /* HOLD: the probe's direction */
    double settled;        /* the held level: where a step that fails returns */
    double last_x, last_c; /* throughput and concurrency a step is judged
                              against: the windows pooled at the held level,
                              or the window before in a run of steps; in
                              SHED, the window that showed the change */
    apr_uint32_t ref_n;    /* windows in last_x, last_c (0: none yet) */
    apr_uint32_t pad;
    double baseline_us;    /* service time at the held level */
    double recent_us;      /* service time of the last judged window */
    apr_uint64_t changes;  /* times round(limit) changed */
    double shed_from;      /* the level before the last shed, until the
                              step after it is judged; 0: none */
} at_limit_t;

void at_limit_init(at_limit_t *c, apr_uint32_t start, apr_uint32_t min,
                   apr_uint32_t max);

/* The CPUs the zone's work can use: when the work grows heavier, the
 * limit sheds no further than that at once (0, as after init: no floor). */
void at_limit_set_cores(at_limit_t *c, apr_uint32_t cores);

/* Whether n completions whose service times add up to sum_us, and their
 * squares to sumsq_us, are enough to judge a window at the current limit. */
int at_limit_enough_samples(const at_limit_t *c, apr_uint32_t n, double sum_us,
                            double sumsq_us);

/* Feed one window; returns 1 if the limit the zone runs changed. */
int at_limit_update(at_limit_t *c, const at_window_t *w);

/* The limit the zone runs: round(limit), within [min, max]. */
apr_uint32_t at_limit_value(const at_limit_t *c);

/* The level the limit goes back to if the step under test does not pay:
 * round(settled), within [min, max]. Between probes, the limit itself. */
apr_uint32_t at_limit_held(const at_limit_t *c);

/* The mode's name as the status page shows it: hold, shed, step, probe,
 * between. */
const char *at_limit_mode_name(apr_uint32_t mode);

/* How many service times a window should last: more once the climb has
 * found the knee, where steps change throughput by a few per cent. */
apr_uint32_t at_limit_window_services(const at_limit_t *c);

#endif
