/*
 * The simulated workloads the adaptive limit's tests run the controller
 * on (no httpd): a CPU-bound service on K cores, whose service time grows
 * once more than K run at once; a sleep-bound one, flat, or bending into a
 * ceiling; a curve as measured. Each window the simulated zone runs
 * min(limit, demand) requests and reports what it measured, with
 * multiplicative noise.
 */
#ifndef LIMIT_SIM_H
#define LIMIT_SIM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "at_limit.h"

#define S0_US 50000.0 /* service time of one request alone */
#define WINDOW_S 1.0

typedef struct {
    double cores;    /* 0: sleep-bound */
    double demand;   /* requests that want to run at once */
    double noise;    /* relative, uniform +- */
    double slowdown; /* extra factor on service time (a spike); 1 normally */
    unsigned seed;
    double ceiling; /* sleep-bound with a CPU share: the most completions a
                       second the machine can give (0: none) */
} workload_t;

/* A throughput curve as measured: requests a second at a few levels of
 * concurrency, between them a power law. */
typedef struct {
    double conc, x;
} measured_t;
#define POINTS(curve) ((int)(sizeof(curve) / sizeof(curve[0])))

/* Work with `demand` far above any limit and no slowdown: on `cores`
 * cores (0: it waits), each window's measurements off by up to `noise`. */
static inline workload_t workload_of(double cores, double noise, unsigned seed)
{
    workload_t wl = {
        .cores = cores, .demand = 1000, .noise = noise, .slowdown = 1, .seed = seed};

    return wl;
}

static inline double jitter(workload_t *wl)
{
    return 1 + wl->noise * (2.0 * rand_r(&wl->seed) / RAND_MAX - 1);
}

/* Sleep-bound with a CPU share (a CGI that waits but costs a fork): the
 * throughput C / S0 bends smoothly into the ceiling instead of stopping
 * dead, so each step up pays a little less than the one before. */
static inline double knee(const workload_t *wl, double conc)
{
    if (wl->ceiling <= 0) {
        return 1;
    }
    return pow(1 + pow(conc * 1e6 / (S0_US * wl->ceiling), 4), 0.25);
}

static inline double throughput(const workload_t *wl, double conc)
{
    return conc * 1e6 / (S0_US * knee(wl, conc));
}

/* What the zone reports for a window at `limit` with `conc` running, each
 * request served in t microseconds. */
static inline at_window_t window_of(workload_t *wl, apr_uint32_t limit, double conc,
                                    double t)
{
    at_window_t w;

    w.inflight = conc;
    w.service_us = t;
    /* A window lasts until it holds enough completions to be judged. */
    w.secs = WINDOW_S;
    if (conc * w.secs * 1e6 / t < AT_LIMIT_MIN_SAMPLES) {
        w.secs = AT_LIMIT_MIN_SAMPLES * t / (conc * 1e6);
    }
    w.completed = (apr_uint32_t)ceil(conc * w.secs * 1e6 / t * jitter(wl));
    w.limited = wl->demand > limit ? 1.0 : 0.0;
    /* The sim's noise is the window mean's own: uniform, so its standard
     * deviation is noise / sqrt(3). */
    w.service_rse = wl->noise / sqrt(3);
    return w;
}

static inline at_window_t simulate(workload_t *wl, apr_uint32_t limit)
{
    double conc = limit < wl->demand ? limit : wl->demand;
    double t = S0_US * wl->slowdown;

    if (wl->cores > 0 && conc > wl->cores) {
        t *= conc / wl->cores;
    }
    t *= knee(wl, conc);
    return window_of(wl, limit, conc, t * jitter(wl));
}

static inline void run(at_limit_t *c, workload_t *wl, int windows)
{
    for (int i = 0; i < windows; i++) {
        at_window_t w = simulate(wl, at_limit_value(c));
        at_limit_update(c, &w);
    }
}

/* The mean and the extremes of the limit over a stretch of windows;
 * returns how many of them ran below the workload's cores. */
static inline int observe(at_limit_t *c, workload_t *wl, int windows, double *mean,
                          apr_uint32_t *lo, apr_uint32_t *hi)
{
    double sum = 0;
    int below = 0;

    *lo = UINT32_MAX;
    *hi = 0;
    for (int i = 0; i < windows; i++) {
        apr_uint32_t v = at_limit_value(c);
        at_window_t w = simulate(wl, v);
        sum += v;
        below += v < wl->cores;
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
        at_limit_update(c, &w);
    }
    *mean = sum / windows;
    return below;
}

static inline double on_curve(const measured_t *at, int n, double conc)
{
    int i = 0;

    while (i < n - 1 && conc > at[i + 1].conc) {
        i++;
    }
    if (i == n - 1) {
        return at[n - 1].x;
    }
    return at[i].x * pow(at[i + 1].x / at[i].x,
                         log(conc / at[i].conc) / log(at[i + 1].conc / at[i].conc));
}

/* A window of a CGI on such a curve, every client's request waiting to
 * run. */
static inline at_window_t simulate_on(workload_t *wl, apr_uint32_t limit,
                                      const measured_t *at, int n)
{
    return window_of(wl, limit, limit, limit * 1e6 / on_curve(at, n, limit) * jitter(wl));
}

#endif
