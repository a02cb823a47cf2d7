/*
 * limit=auto's controller beside three published ones, on the same
 * simulated workloads (no httpd): Netflix concurrency-limits' VegasLimit
 * and Gradient2Limit (concurrency-limits-core/.../limit/VegasLimit.java,
 * Gradient2Limit.java), fed once a window as its WindowedLimit feeds them,
 * and Envoy's adaptive concurrency gradient controller
 * (source/extensions/filters/http/adaptive_concurrency/controller/
 * gradient_controller.cc), each with its published defaults but the bounds
 * (min 1, max 200) and the starting point (4) of ours.
 *
 * Every controller sees the same windows: requests running (C), their mean
 * service time, whether any waited. It asserts what docs/adaptive-limit.md
 * says of ours; `test_limit_compare --table` prints the comparison there.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "at_limit.h"

#define S0_US 50000.0 /* service time of one request alone */
#define LMIN 1
#define LMAX 200
#define START 4
#define SEEDS 10

/* ---- workloads -------------------------------------------------------------- */

typedef struct {
    const char *name;
    double cores;      /* CPU-bound on this many cores; 0: waits */
    double ceiling;    /* waits, but at most this many running pay (a knee) */
    double bend;       /* how sharply the knee bends (4 sharp, 1.5 a flat top) */
    double clients;    /* closed loop; 0: open loop at `rate` */
    double rate;       /* open loop: arrivals a second */
    double queue;      /* open loop: waiters beyond which arrivals are refused */
    double noise;      /* relative, uniform +- on each window's service time */
    int windows;
    /* a change of work: from window `switch_at` on, `cores2` (0: waits) */
    int switch_at, switch_back;
    double cores2;
    /* a spike: service times `spike` x for windows [spike_at, spike_at + 10) */
    int spike_at;
    double spike;
} workload_t;

static double service_us(const workload_t *wl, int i, double conc)
{
    double cores = wl->cores, t = S0_US;

    if (wl->switch_at && i >= wl->switch_at && (!wl->switch_back || i < wl->switch_back)) {
        cores = wl->cores2;
    }
    if (cores > 0 && conc > cores) {
        t *= conc / cores;
    }
    if (wl->ceiling > 0) {
        t *= pow(1 + pow(conc / wl->ceiling, wl->bend), 1 / wl->bend);
    }
    if (wl->spike_at && i >= wl->spike_at && i < wl->spike_at + 10) {
        t *= wl->spike;
    }
    return t;
}

/* ---- the controllers ---------------------------------------------------------- */

typedef struct {
    double inflight, service_us, secs, limited;
    apr_uint32_t completed;
    double rse;
} sample_t;

typedef struct ctl ctl_t;
struct ctl {
    const char *name;
    void (*init)(ctl_t *c);
    void (*update)(ctl_t *c, const sample_t *s);
    double limit; /* what the zone runs */
    /* ours */
    at_limit_t ours;
    /* Vegas */
    double rtt_noload;
    int probe_count;
    double probe_jitter;
    /* Gradient2 */
    double long_rtt;
    int long_n;
    /* Envoy: minRTT measured at min_concurrency every interval */
    double min_rtt, deferred, next_min_rtt_s, now_s;
    int pinned, at_min_in_a_row;
    unsigned seed;
    double fixed; /* a fixed limit */
    apr_uint32_t cpus; /* the machine's CPUs, which ours is told */
};

static double rnd(unsigned *seed)
{
    return (double)rand_r(seed) / RAND_MAX;
}

static void ours_init(ctl_t *c)
{
    at_limit_init(&c->ours, START, LMIN, LMAX);
    at_limit_set_cores(&c->ours, c->cpus);
    c->limit = at_limit_value(&c->ours);
}

static void ours_update(ctl_t *c, const sample_t *s)
{
    at_window_t w = {.completed = s->completed, .service_us = s->service_us,
                     .service_rse = s->rse, .inflight = s->inflight,
                     .limited = s->limited, .secs = s->secs};

    at_limit_update(&c->ours, &w);
    c->limit = at_limit_value(&c->ours);
}

/* Netflix's Log10RootFunction: max(1, floor(log10(n))). */
static int log10_root(double n)
{
    int v = n >= 1 ? (int)log10(n) : 0;

    return v < 1 ? 1 : v;
}

static void vegas_init(ctl_t *c)
{
    c->limit = START;
    c->rtt_noload = 0;
    c->probe_count = 0;
    c->probe_jitter = 0.5 + 0.5 * rnd(&c->seed);
}

/* VegasLimit._update with its defaults: alpha 3, beta 6, threshold 1 x
 * log10(limit); probe (reset the no-load RTT) every 15 - 30 x limit samples. */
static void vegas_update(ctl_t *c, const sample_t *s)
{
    double rtt = s->service_us, queue, next = c->limit;
    int alpha = 3 * log10_root(c->limit), beta = 6 * log10_root(c->limit);
    int threshold = log10_root(c->limit);

    if (c->probe_jitter * 30 * c->limit <= ++c->probe_count) {
        c->probe_jitter = 0.5 + 0.5 * rnd(&c->seed);
        c->probe_count = 0;
        c->rtt_noload = rtt;
        return;
    }
    if (c->rtt_noload == 0 || rtt < c->rtt_noload) {
        c->rtt_noload = rtt;
        return;
    }
    queue = ceil(c->limit * (1 - c->rtt_noload / rtt));
    if (s->inflight * 2 < c->limit) {
        return;
    }
    if (queue <= threshold) {
        next = c->limit + beta;
    }
    else if (queue < alpha) {
        next = c->limit + log10_root(c->limit);
    }
    else if (queue > beta) {
        next = c->limit - log10_root(c->limit);
    }
    c->limit = fmax(LMIN, fmin(LMAX, next));
}

static void gradient2_init(ctl_t *c)
{
    c->limit = START;
    c->long_rtt = 0;
    c->long_n = 0;
}

/* Gradient2Limit._update with its defaults: long RTT an exponential average
 * over 600 samples (a plain mean for the first 10), tolerance 1.5, queue
 * size 4, smoothing 0.2. */
static void gradient2_update(ctl_t *c, const sample_t *s)
{
    double rtt = s->service_us, gradient, next;

    if (c->long_n < 10) {
        c->long_rtt = (c->long_rtt * c->long_n + rtt) / (c->long_n + 1);
        c->long_n++;
    }
    else {
        c->long_rtt += (rtt - c->long_rtt) * 2.0 / (600 + 1);
    }
    if (c->long_rtt / rtt > 2) {
        c->long_rtt *= 0.95;
    }
    if (s->inflight < c->limit / 2) {
        return;
    }
    gradient = fmax(0.5, fmin(1.0, 1.5 * c->long_rtt / rtt));
    next = c->limit * gradient + 4;
    next = c->limit * 0.8 + next * 0.2;
    c->limit = fmax(LMIN, fmin(LMAX, next));
}

static void envoy_init(ctl_t *c)
{
    c->limit = 3; /* it starts by measuring the minRTT at min_concurrency */
    c->deferred = START;
    c->pinned = 1;
    c->min_rtt = 0;
    c->now_s = 0;
    c->at_min_in_a_row = 0;
}

/* GradientController with its defaults: minRTT re-measured every 60 s
 * (+ up to 15 % jitter) at min_concurrency 3 over 50 requests; each window
 * limit = limit x clamp((minRTT x 1.25) / sampleRTT, 0.5, 2) + sqrt of that.
 * Five windows in a row at 3 re-measure at once. */
static void envoy_update(ctl_t *c, const sample_t *s)
{
    double gradient, next;

    c->now_s += s->secs;
    if (c->pinned) {
        c->min_rtt = s->service_us;
        c->pinned = 0;
        c->limit = c->deferred;
        c->next_min_rtt_s = c->now_s + 60 * (1 + 0.15 * rnd(&c->seed));
        return;
    }
    gradient = fmax(0.5, fmin(2.0, c->min_rtt * 1.25 / s->service_us));
    next = c->limit * gradient;
    next = floor(next + sqrt(next));
    next = fmax(3, fmin(LMAX, next));
    c->at_min_in_a_row = c->limit == 3 && next == 3 ? c->at_min_in_a_row + 1 : 0;
    c->limit = next;
    if (c->now_s >= c->next_min_rtt_s || c->at_min_in_a_row >= 5) {
        c->deferred = c->limit;
        c->limit = 3;
        c->pinned = 1;
        c->at_min_in_a_row = 0;
    }
}

static void fixed_init(ctl_t *c)
{
    c->limit = c->fixed;
}

static void fixed_update(ctl_t *c, const sample_t *s)
{
    (void)c;
    (void)s;
}

static const ctl_t kinds[] = {
    {.name = "ours", .init = ours_init, .update = ours_update},
    {.name = "Vegas", .init = vegas_init, .update = vegas_update},
    {.name = "Gradient2", .init = gradient2_init, .update = gradient2_update},
    {.name = "Envoy gradient", .init = envoy_init, .update = envoy_update},
};
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

/* ---- one run ------------------------------------------------------------------ */

typedef struct {
    double done, secs;        /* completions and time, from `from` on */
    double refused;           /* open loop: arrivals refused, from `from` on */
    double x[4096];           /* each window's throughput (closed loop) */
    double lat_w[4096];       /* and its length */
    int nlat;
    double limits[4096];      /* the limit each window ran */
    double wsecs[4096];       /* and how long it lasted */
    int n;
} run_t;

/* The limit a window runs is what the controller said after the last one;
 * the window lasts as the zone's would (at_zone.h, at_limit.h): at least
 * 250 ms and 2 service times (4 once ours found its top), until 20
 * requests completed, at most 10 s. */
static void run_one(const workload_t *wl, ctl_t *c, unsigned seed, int from, run_t *r)
{
    double backlog = 0;

    memset(r, 0, sizeof(*r));
    c->seed = seed;
    /* the machine: the cores CPU-bound work runs on, or 2 */
    c->cpus = wl->cores > 0 ? (apr_uint32_t)wl->cores : 2;
    c->init(c);
    for (int i = 0; i < wl->windows && i < 4096; i++) {
        double limit = floor(c->limit + 0.5), conc, t, x, secs, waited;
        apr_uint32_t services = c->init == ours_init
                                    ? at_limit_window_services(&c->ours)
                                    : AT_LIMIT_WINDOW_SERVICES;
        sample_t s;

        if (wl->clients > 0) {
            conc = fmin(limit, wl->clients);
            waited = wl->clients > limit;
        }
        else {
            /* open loop: what runs is what arrives, up to the limit */
            double want = wl->rate * service_us(wl, i, fmin(limit, 1)) / 1e6 + backlog;

            conc = fmin(limit, fmax(want, 1));
            waited = backlog > 0 || want > limit;
        }
        t = service_us(wl, i, conc) * (1 + wl->noise * (2 * rnd(&seed) - 1));
        x = conc * 1e6 / t;
        secs = fmax(0.25, services * t / 1e6);
        if (x * secs < AT_LIMIT_MIN_SAMPLES) {
            secs = fmin(10, AT_LIMIT_MIN_SAMPLES / x);
        }
        if (wl->clients <= 0) {
            double arrived = wl->rate * secs, served = fmin(x * secs, arrived + backlog);

            backlog += arrived - served;
            if (backlog > wl->queue) {
                if (i >= from) {
                    r->refused += backlog - wl->queue;
                }
                backlog = wl->queue;
            }
            x = served / secs;
        }
        r->wsecs[r->n] = secs;
        r->limits[r->n++] = limit;
        if (i >= from) {
            r->done += x * secs;
            r->secs += secs;
            if (wl->clients > 0) {
                r->x[r->nlat] = x;
                r->lat_w[r->nlat++] = secs;
            }
        }
        s.inflight = conc;
        s.service_us = t;
        s.secs = secs;
        s.limited = waited;
        s.completed = (apr_uint32_t)(x * secs);
        s.rse = wl->noise / sqrt(3);
        c->update(c, &s);
    }
}

/* A request sent at the start of window i, in a closed loop of N clients,
 * takes about N over the throughput while it waits and runs (Little's
 * law): the throughput is averaged over the windows its latency spans,
 * since one window at a low limit delays a request by a share of itself. */
static double request_latency(const run_t *r, int i, double clients)
{
    double done = 0, secs = 0, lat = clients / r->x[i];

    for (int j = i; j < r->nlat && secs < lat; j++) {
        double part = fmin(r->lat_w[j], lat - secs);

        done += r->x[j] * part;
        secs += part;
        lat = clients * secs / done;
    }
    return lat;
}

typedef struct {
    double lat, weight;
} weighted_t;

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* The time-weighted 99th percentile of the requests' latencies. */
static double p99(const run_t *r, double clients)
{
    static weighted_t v[4096];
    double total = 0, acc = 0;

    for (int i = 0; i < r->nlat; i++) {
        v[i].lat = request_latency(r, i, clients);
        v[i].weight = r->lat_w[i];
        total += r->lat_w[i];
    }
    /* lat leads the struct: sorted by it */
    qsort(v, (size_t)r->nlat, sizeof(v[0]), by_value);
    for (int i = 0; i < r->nlat; i++) {
        acc += v[i].weight;
        if (acc >= 0.99 * total) {
            return v[i].lat;
        }
    }
    return 0;
}

/* The best fixed limit's goodput and latency p99 on the workload, of
 * 1 - LMAX: the most goodput, and of the limits within 1 % of it the
 * lowest. */
static void best_fixed(const workload_t *wl, int from, double *good, double *lat)
{
    static run_t r;
    double best = 0;
    workload_t w = *wl;

    w.noise = 0;
    for (int l = 1; l <= LMAX; l++) {
        ctl_t c = {.name = "fixed", .init = fixed_init, .update = fixed_update, .fixed = l};

        run_one(&w, &c, 1, from, &r);
        if (r.done / r.secs > best * 1.01) {
            best = r.done / r.secs;
            *good = best;
            *lat = p99(&r, w.clients);
        }
    }
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(v[0]), by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds from the start of windows [a, b) until the limit stays within
 * +-25 % (at least +-1) of the median of the phase's last 20 windows. */
static double settling_s(const run_t *r, int a, int b)
{
    double last[20], med, band, secs = 0;
    int k = 0, settled = b;

    for (int i = b - 20; i < b; i++) {
        last[k++] = r->limits[i];
    }
    med = median(last, 20);
    band = fmax(1, 0.25 * med);
    for (int i = b - 1; i >= a && fabs(r->limits[i] - med) <= band; i--) {
        settled = i;
    }
    for (int i = a; i < settled; i++) {
        secs += r->wsecs[i];
    }
    return secs;
}


/* ---- the workloads compared ------------------------------------------------------- */

#define WARM 30 /* windows left out of goodput and latency: the search */

static const workload_t closed[] = {
    {.name = "CPU-bound, 2 cores", .cores = 2, .clients = 40, .noise = 0.05, .windows = 400},
    {.name = "CPU-bound, 8 cores", .cores = 8, .clients = 40, .noise = 0.05, .windows = 400},
    {.name = "CPU-bound, 64 cores", .cores = 64, .clients = 160, .noise = 0.05, .windows = 400},
    {.name = "waits (sleep-bound), 80 clients", .clients = 80, .noise = 0.05, .windows = 400},
    {.name = "a knee at 30", .ceiling = 30, .bend = 4, .clients = 80, .noise = 0.05,
     .windows = 400},
    {.name = "a flat top (bends from 30)", .ceiling = 30, .bend = 1.5, .clients = 80,
     .noise = 0.05, .windows = 400},
    {.name = "noisy windows (+-15 %), CPU-bound, 4 cores", .cores = 4, .clients = 40,
     .noise = 0.15, .windows = 400},
    {.name = "spikes (10 windows 3 x slower), waits", .clients = 80, .noise = 0.05,
     .windows = 400, .spike_at = 150, .spike = 3},
};
#define NCLOSED (sizeof(closed) / sizeof(closed[0]))

/* S4's switch: 80 clients, CPU-bound on 2 cores, then waiting, then CPU-bound. */
static const workload_t switching = {.name = "switch", .cores = 2, .clients = 80,
                                     .noise = 0.05, .windows = 450, .switch_at = 150,
                                     .switch_back = 300, .cores2 = 0};
/* 1.2 x the capacity of 4 cores arriving, for 2,000 windows. */
static const workload_t overload = {.name = "overload", .cores = 4, .rate = 1.2 * 4 * 1e6 / S0_US,
                                    .queue = 100, .noise = 0.05, .windows = 2000};
/* Waiting work at 0.9 x what 64 running give, a queue of 16. */
static const workload_t steady = {.name = "steady", .rate = 0.9 * 64 * 1e6 / S0_US,
                                  .queue = 16, .noise = 0.05, .windows = 600};

typedef struct {
    double good[NCLOSED], lat[NCLOSED]; /* x the best fixed's, medians of seeds */
    double settle[3];                   /* the switch's phases, s, worst of seeds' medians */
    double settle_worst;                /* worst phase in any seed */
    double creep;                       /* mean limit of the last 500 windows / cores */
    double refused;                     /* per 1,000 arrivals, after the start */
} result_t;

static void evaluate(const ctl_t *kind, result_t *res)
{
    static run_t r;
    double v[SEEDS], w[SEEDS], ph[3][SEEDS];
    ctl_t c;

    memset(res, 0, sizeof(*res));
    for (size_t k = 0; k < NCLOSED; k++) {
        double bg = 1, bl = 1;

        best_fixed(&closed[k], WARM, &bg, &bl);
        for (int s = 0; s < SEEDS; s++) {
            c = *kind;
            run_one(&closed[k], &c, 1000 + s, WARM, &r);
            v[s] = r.done / r.secs / bg;
            w[s] = p99(&r, closed[k].clients) / bl;
        }
        res->good[k] = median(v, SEEDS);
        res->lat[k] = median(w, SEEDS);
    }
    for (int s = 0; s < SEEDS; s++) {
        c = *kind;
        run_one(&switching, &c, 2000 + s, 0, &r);
        for (int p = 0; p < 3; p++) {
            ph[p][s] = settling_s(&r, 150 * p, 150 * (p + 1));
            res->settle_worst = fmax(res->settle_worst, ph[p][s]);
        }
    }
    for (int p = 0; p < 3; p++) {
        res->settle[p] = median(ph[p], SEEDS);
    }
    for (int s = 0; s < SEEDS; s++) {
        double sum = 0;

        c = *kind;
        run_one(&overload, &c, 3000 + s, 0, &r);
        for (int i = r.n - 500; i < r.n; i++) {
            sum += r.limits[i];
        }
        v[s] = sum / 500 / overload.cores;
        c = *kind;
        run_one(&steady, &c, 4000 + s, 100, &r);
        w[s] = 1000 * r.refused / (steady.rate * r.secs);
    }
    res->creep = median(v, SEEDS);
    res->refused = median(w, SEEDS);
}

static void print_table(void)
{
    result_t res[NKINDS];

    for (size_t k = 0; k < NKINDS; k++) {
        evaluate(&kinds[k], &res[k]);
    }
    printf("| workload (goodput × best fixed; latency p99 × best fixed's) |");
    for (size_t k = 0; k < NKINDS; k++) {
        printf(" %s |", kinds[k].name);
    }
    printf("\n|---|");
    for (size_t k = 0; k < NKINDS; k++) {
        printf("---:|");
    }
    printf("\n");
    for (size_t w = 0; w < NCLOSED; w++) {
        printf("| %s |", closed[w].name);
        for (size_t k = 0; k < NKINDS; k++) {
            printf(" %.2f; %.2f |", res[k].good[w], res[k].lat[w]);
        }
        printf("\n");
    }
    printf("| switch CPU → waits → CPU: settled after (s), median of each phase; worst |");
    for (size_t k = 0; k < NKINDS; k++) {
        printf(" %.1f, %.1f, %.1f; %.1f |", res[k].settle[0], res[k].settle[1], res[k].settle[2],
               res[k].settle_worst);
    }
    printf("\n| 1.2 × overload on 4 cores: limit ÷ cores after 2,000 windows |");
    for (size_t k = 0; k < NKINDS; k++) {
        printf(" %.2f |", res[k].creep);
    }
    printf("\n| waits, open loop at 0.9 × of 64, queue 16: 503s per 1,000 after 100 windows |");
    for (size_t k = 0; k < NKINDS; k++) {
        printf(" %.1f |", res[k].refused);
    }
    printf("\n");
}

/* ---- what docs/adaptive-limit.md says of them ------------------------------------ */

/* Whether a controller meets the targets this comparison holds them to:
 * goodput at least 0.9 x the best fixed limit's everywhere, latency p99 at
 * most `p99_most` x, each phase of the switch settled within 10 s (median
 * of seeds), no creep beyond 1.25 x the cores under overload, and under 1
 * refusal in 1,000 of steady waiting work. */
static int meets_targets(const ctl_t *kind, double p99_most)
{
    result_t r;
    int ok = 1;

    evaluate(kind, &r);
    for (size_t w = 0; w < NCLOSED; w++) {
        if (r.good[w] < 0.9 || r.lat[w] > p99_most) {
            print_message("%s, %s: goodput %.2f x, p99 %.2f x\n", kind->name, closed[w].name,
                          r.good[w], r.lat[w]);
            ok = 0;
        }
    }
    for (int p = 0; p < 3; p++) {
        ok &= r.settle[p] <= 10;
    }
    print_message("%s: switch settled after %.1f %.1f %.1f s; creep %.2f x the cores; "
                  "%.1f refused per 1,000\n", kind->name, r.settle[0], r.settle[1],
                  r.settle[2], r.creep, r.refused);
    return ok && r.creep <= 1.25 && r.refused < 1;
}

/* The latency p99 allowed beside the best fixed limit's. Ours pays it on
 * CPU-bound work on 2 - 4 cores, where its probes below the cores cost one
 * window in six or so half the throughput (up to 1.7 x in this model, 1.16 x
 * in S4 on a real server), and on a spike of waiting work that runs under
 * its limit: the slower service looks like heavier work, and the limit
 * sheds from what ran, then climbs back (2.2 x). */
#define P99_MOST 2.5

/* Ours meets them. */
static void test_ours_meets_the_targets(void **state)
{
    (void)state;
    assert_true(meets_targets(&kinds[0], P99_MOST));
}

/* Each published controller misses at least one: they judge latency
 * against a remembered baseline, which drifts (Vegas, Gradient2: the limit
 * creeps under overload and follows a switch slowly) or must be measured
 * with the limit pinned (Envoy: refusals, and a stale baseline between). */
static void test_each_published_one_misses_one(void **state)
{
    (void)state;
    for (size_t k = 1; k < NKINDS; k++) {
        assert_false(meets_targets(&kinds[k], P99_MOST));
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ours_meets_the_targets),
        cmocka_unit_test(test_each_published_one_misses_one),
    };

    if (argc > 1 && strcmp(argv[1], "--table") == 0) {
        print_table();
        return 0;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
