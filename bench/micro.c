/*
 * Micro-benchmark of the zone core, built from the same code as the module:
 * acquire + release pairs per second and nanoseconds per pair,
 *   - uncontended: one thread, a zone that never fills;
 *   - contended: 2 processes x 4 threads on one zone; with limit 8 they
 *     contend for the lock only, with limit 2 they also queue and hand off.
 * Each figure is the median of REPEAT runs of a fixed number of pairs.
 *
 *   micro [PAIRS=2000000] [REPEAT=5]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_zone.h"
#include "bench_zone.h"

/* A fixed zone, with the spare records the module's zones have. */
static at_zone_t *zone_new(apr_uint32_t limit, apr_uint32_t queue, apr_int64_t timeout_us)
{
    at_zone_conf_t c = {.limit = limit, .queue = queue, .timeout_us = timeout_us,
                        .retry_after = AT_RETRY_AFTER_AUTO};

    return bench_zone_new(&c, limit * 2 + 4, queue * 2 + 4, "micro");
}

static at_zone_t *zone;
static long pairs_per_thread;

static void *hammer(void *unused)
{
    (void)unused;
    for (long i = 0; i < pairs_per_thread; i++) {
        at_request_t rq = {.may_wait = 1};
        at_ticket_t t;
        at_result_t r = at_zone_acquire_req(zone, &t, &rq, NULL, NULL);
        if (r != AT_ADMITTED && r != AT_QUEUED) {
            fprintf(stderr, "unexpected result %d\n", r);
            exit(1);
        }
        at_zone_release(zone, &t);
    }
    return NULL;
}

static double run_threads(int procs, int threads, long total)
{
    apr_int64_t t0 = at_now_us();

    pairs_per_thread = total / (procs * threads);
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            pthread_t th[64];
            for (int i = 0; i < threads; i++) {
                pthread_create(&th[i], NULL, hammer, NULL);
            }
            for (int i = 0; i < threads; i++) {
                pthread_join(th[i], NULL);
            }
            _exit(0);
        }
    }
    for (int p = 0; p < procs; p++) {
        wait(NULL);
    }
    return (double)(at_now_us() - t0) * 1000.0 / (double)(pairs_per_thread * procs * threads);
}

static double run_uncontended(long total)
{
    apr_int64_t t0;

    pairs_per_thread = total;
    t0 = at_now_us();
    hammer(NULL);
    return (double)(at_now_us() - t0) * 1000.0 / (double)total;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 2000000;
    int repeat = argc > 2 ? atoi(argv[2]) : 5;
    double u[32], c8[32], c2[32];

    if (pairs <= 0 || repeat <= 0 || repeat > 32) {
        fprintf(stderr, "usage: micro [PAIRS] [REPEAT<=32]\n");
        return 2;
    }
    for (int i = 0; i < repeat; i++) {
        zone = zone_new(1000, 0, 60 * APR_INT64_C(1000000));
        u[i] = run_uncontended(pairs);
        bench_zone_free(zone);
        zone = zone_new(8, 64, 60 * APR_INT64_C(1000000));
        c8[i] = run_threads(2, 4, pairs);
        bench_zone_free(zone);
        zone = zone_new(2, 64, 60 * APR_INT64_C(1000000));
        c2[i] = run_threads(2, 4, pairs / 10);
        bench_zone_free(zone);
    }
    printf("| case | ns per acquire+release (median of %d) | pairs per second |\n", repeat);
    printf("|---|---|---|\n");
    double m = median(u, repeat);
    printf("| uncontended, 1 thread | %.0f | %.0f |\n", m, 1e9 / m);
    m = median(c8, repeat);
    printf("| 2 processes x 4 threads, limit 8 (lock contention) | %.0f | %.0f |\n", m, 1e9 / m);
    m = median(c2, repeat);
    printf("| 2 processes x 4 threads, limit 2 (queueing, hand-off) | %.0f | %.0f |\n", m, 1e9 / m);
    return 0;
}
