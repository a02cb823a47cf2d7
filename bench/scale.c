/*
 * The zone at scale, built from the same code as the module with its test
 * hooks: a zone of limit 150 (reserve=10) whose queue is kept full by
 * sleeping workers of priority 0, shaped as prefork (many processes of few
 * threads) or as event (two processes of many threads). While the queue is
 * full it measures
 *   - how long the zone's lock is held (every hold, in every process);
 *   - the admission overhead of a request that finds a free slot: a probe
 *     of priority 1 takes a reserved slot and gives it back, timed whole;
 *   - one reclaim of dead owners (every owner alive: each one's /proc is
 *     read) and one repair after a process died holding the lock, with the
 *     workers stopped so that neither waits for the lock.
 * One line of figures per run, tab-separated, for bench/scale-report.
 *
 * With SHAPE scrape, a status read instead: a zone of the same limit with
 * per_key and rate= by key, every one of its 16,384 rate buckets filled and
 * its per-key table holding the slots' keys, read SCRAPES times by
 * at_zone_stats; how long each read held the lock, and took in all.
 *
 *   scale SHAPE QUEUE SECONDS      SHAPE: prefork or event
 *   scale scrape QUEUE SCRAPES
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "at_zone.h"
#include "bench_zone.h"

#define LIMIT 150
#define RESERVE 10
#define WORK_US 50000 /* each worker's request holds its slot this long */
#define MAX_HOLDS (4 * 1024 * 1024)

/* Shared by every process of the run. */
typedef struct {
    int recording, stop;
    unsigned long holds;
    apr_uint32_t hold_ns[MAX_HOLDS];
} shared_t;

static shared_t *sh;
static at_zone_t *zone;

static void note_hold(apr_int64_t ns)
{
    if (__atomic_load_n(&sh->recording, __ATOMIC_RELAXED)) {
        unsigned long i = __atomic_fetch_add(&sh->holds, 1, __ATOMIC_RELAXED);

        if (i < MAX_HOLDS) {
            sh->hold_ns[i] = (apr_uint32_t)(ns > 0xffffffffLL ? 0xffffffffLL : ns);
        }
    }
}

static void *map_shared(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        perror("scale: mmap");
        exit(1);
    }
    return p;
}

static at_zone_t *zone_new(apr_uint32_t queue)
{
    at_zone_conf_t c = {.limit = LIMIT, .queue = queue, .reserve = RESERVE,
                        .timeout_us = 60 * APR_INT64_C(1000000),
                        .retry_after = AT_RETRY_AFTER_AUTO};

    return bench_zone_new(&c, LIMIT * 2, queue * 2, "scale");
}

static int stopping(void *unused)
{
    (void)unused;
    return __atomic_load_n(&sh->stop, __ATOMIC_RELAXED);
}

/* A worker: requests of priority 0, each holding its slot WORK_US, until
 * told to stop; refused ones (the queue full) try again a little later. */
static void *worker(void *unused)
{
    (void)unused;
    while (!stopping(NULL)) {
        at_request_t rq = {.may_wait = 1};
        at_ticket_t t;
        at_result_t r = at_zone_acquire_req(zone, &t, &rq, stopping, NULL);

        if (r == AT_ADMITTED || r == AT_QUEUED) {
            usleep(WORK_US);
            at_zone_release(zone, &t);
        }
        else if (r != AT_ABORTED) {
            usleep(10000);
        }
    }
    return NULL;
}

static void run_workers(int threads)
{
    pthread_attr_t attr;
    pthread_t *th = calloc((size_t)threads, sizeof(*th));

    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&th[i], &attr, worker, NULL)) {
            fprintf(stderr, "scale: cannot start thread %d\n", i);
            _exit(1);
        }
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
    }
    _exit(0);
}

static int cmp_u32(const void *a, const void *b)
{
    apr_uint32_t x = *(const apr_uint32_t *)a, y = *(const apr_uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
    apr_int64_t x = *(const apr_int64_t *)a, y = *(const apr_int64_t *)b;
    return x < y ? -1 : x > y;
}

static apr_int64_t clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (apr_int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static apr_uint32_t queued_now(void)
{
    at_zone_glance_t g;

    at_zone_glance(zone, &g);
    return g.queued;
}

/* A process that takes the lock and dies holding it: the next taker
 * repairs the zone from its records. */
static void die_holding_lock(void)
{
    pid_t pid = fork();

    if (pid == 0) {
        at_zone_debug_take_lock(zone);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
}

/* SIGSTOP every worker process; until none is caught holding the lock
 * (the zone's figures come back stale), let them go on a moment and try
 * again. */
static void stop_workers(const pid_t *kids, int procs)
{
    at_zone_stats_t st;

    for (int tries = 0; tries < 100; tries++) {
        for (int p = 0; p < procs; p++) {
            kill(kids[p], SIGSTOP);
        }
        for (int p = 0; p < procs; p++) {
            int status;

            waitpid(kids[p], &status, WUNTRACED);
        }
        at_zone_stats(zone, &st);
        if (!st.stale) {
            return;
        }
        for (int p = 0; p < procs; p++) {
            kill(kids[p], SIGCONT);
        }
        usleep(10000);
    }
    fprintf(stderr, "scale: a worker held the lock at every stop\n");
    exit(1);
}

static apr_int64_t median_i64(apr_int64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_i64);
    return v[n / 2];
}

/* ---- scrape: a status read of a zone with a full rate table ------------- */

static apr_int64_t scrape_hold_ns;

static void note_scrape_hold(apr_int64_t ns)
{
    scrape_hold_ns = ns;
}

static at_zone_t *scrape_zone_new(apr_uint32_t queue)
{
    at_zone_conf_t c = {.limit = LIMIT, .queue = queue, .per_key = 4, .keyed = 1,
                        .timeout_us = 60 * APR_INT64_C(1000000),
                        .retry_after = AT_RETRY_AFTER_AUTO,
                        .rate = {.interval_ns = APR_INT64_C(60000000000), .burst = 1,
                                 .delay = AT_RATE_NODELAY}};
    apr_uint32_t nslots = LIMIT * 2, nwaiters = queue * 2;
    apr_size_t size = at_zone_size(nslots, nwaiters, at_rate_keys_for(&c.rate, 1));
    void *mem = map_shared(size);

    if (at_zone_init(mem, size, "scrape", &c, nslots, nwaiters)) {
        fprintf(stderr, "scale: cannot lay out a zone\n");
        exit(1);
    }
    return mem;
}

/* A request of key "k<i>": it spends the key's bucket (a minute long, so
 * that every bucket stays full) and, if held, counts in the per-key table. */
static at_result_t acquire_key(at_zone_t *z, int i, at_ticket_t *t)
{
    char text[32];
    at_client_key_t k;
    at_request_t rq = {.client = &k, .may_wait = 0};

    snprintf(text, sizeof(text), "k%d", i);
    at_zone_key_from_text(z, text, strlen(text), &k);
    return at_zone_acquire_req(z, t, &rq, NULL, NULL);
}

/* shape queue records rate_keys keys_in clients scrapes hold_p50 p99 max
 * read_p50 (ns) */
static int run_scrape(apr_uint32_t queue, int scrapes)
{
    at_zone_t *z = scrape_zone_new(queue);
    at_ticket_t held[LIMIT];
    apr_int64_t *hold = calloc((size_t)scrapes, sizeof(*hold));
    apr_int64_t *read = calloc((size_t)scrapes, sizeof(*read));
    at_zone_stats_t st;
    int n = 0;

    for (int i = LIMIT; i < 4 * AT_RATE_KEYS; i++) {
        at_ticket_t t;

        if (acquire_key(z, i, &t) == AT_ADMITTED) {
            at_zone_release(z, &t);
        }
    }
    for (int i = 0; i < LIMIT; i++) {
        if (acquire_key(z, i, &held[i]) != AT_ADMITTED) {
            fprintf(stderr, "scale: key %d not admitted\n", i);
            return 1;
        }
    }
    for (int i = 0; i < 10; i++) {
        at_zone_stats(z, &st); /* the first reads fault in the copy's pages */
    }
    at_test_lock_held_hook = note_scrape_hold;
    for (int i = 0; i < scrapes; i++) {
        apr_int64_t t0 = clock_ns();

        at_zone_stats(z, &st);
        read[i] = clock_ns() - t0;
        hold[i] = scrape_hold_ns;
        n++;
    }
    at_test_lock_held_hook = NULL;
    qsort(hold, (size_t)n, sizeof(*hold), cmp_i64);
    qsort(read, (size_t)n, sizeof(*read), cmp_i64);
    printf("scrape\t%u\t%u\t%u\t%u\t%u\t%d\t%lld\t%lld\t%lld\t%lld\n", queue,
           2 * st.nslots + st.nwaiters, st.rate_keys, st.rate_keys_in, st.clients, n,
           (long long)hold[n / 2], (long long)hold[(int)(n * 0.99)], (long long)hold[n - 1],
           (long long)read[n / 2]);
    for (int i = 0; i < LIMIT; i++) {
        at_zone_release(z, &held[i]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int procs, threads, npairs = 0, nsamples = 0;
    apr_uint32_t queue = argc > 2 ? (apr_uint32_t)atoi(argv[2]) : 1500;
    int seconds = argc > 3 ? atoi(argv[3]) : 5;
    apr_int64_t *pair_ns, reclaim_ns[5], repair_ns[5], base_ns[5], end;
    double queued_sum = 0;
    pid_t *kids;
    at_zone_stats_t st;

    if (argc < 2
        || (strcmp(argv[1], "prefork") && strcmp(argv[1], "event") && strcmp(argv[1], "scrape"))
        || queue < 1 || seconds < 1) {
        fprintf(stderr, "usage: scale prefork|event QUEUE SECONDS, or scale scrape QUEUE "
                "SCRAPES\n");
        return 2;
    }
    if (strcmp(argv[1], "scrape") == 0) {
        return run_scrape(queue, seconds);
    }
    /* as many workers as the zone's slots of priority 0 and its queue,
     * and a few more, so that the queue stays full */
    threads = (int)(LIMIT - RESERVE + queue) + 60;
    procs = strcmp(argv[1], "prefork") == 0 ? (threads + 3) / 4 : 2;
    threads = (threads + procs - 1) / procs;
    sh = map_shared(sizeof(*sh));
    zone = zone_new(queue);
    at_test_lock_held_hook = note_hold;
    kids = calloc((size_t)procs, sizeof(*kids));
    for (int p = 0; p < procs; p++) {
        if ((kids[p] = fork()) == 0) {
            run_workers(threads);
        }
    }
    for (int i = 0; i < 600 && queued_now() < queue * 95 / 100; i++) {
        usleep(50000);
    }

    /* the probe, one pair every millisecond, while every hold is noted */
    pair_ns = calloc((size_t)seconds * 1000 + 1, sizeof(*pair_ns));
    __atomic_store_n(&sh->recording, 1, __ATOMIC_RELAXED);
    end = clock_ns() + (apr_int64_t)seconds * 1000000000;
    while (clock_ns() < end && npairs < seconds * 1000) {
        at_request_t rq = {.may_wait = 0, .priority = 1};
        at_ticket_t t;
        apr_int64_t t0 = clock_ns();

        if (at_zone_acquire_req(zone, &t, &rq, NULL, NULL) == AT_ADMITTED) {
            at_zone_release(zone, &t);
            pair_ns[npairs++] = clock_ns() - t0;
        }
        if (npairs % 100 == 0) {
            queued_sum += queued_now();
            nsamples++;
        }
        usleep(1000);
    }
    __atomic_store_n(&sh->recording, 0, __ATOMIC_RELAXED);

    /* reclaim with every owner alive, and repair, while the queue is full:
     * the workers stopped (none holding the lock), so that the repair is
     * this process's to time */
    at_test_lock_held_hook = NULL;
    stop_workers(kids, procs);
    for (int i = 0; i < 5; i++) {
        apr_int64_t t0 = clock_ns();

        at_zone_reclaim(zone);
        reclaim_ns[i] = clock_ns() - t0;
        t0 = clock_ns();
        at_zone_stats(zone, &st);
        base_ns[i] = clock_ns() - t0;
        die_holding_lock();
        t0 = clock_ns();
        at_zone_stats(zone, &st); /* takes the lock: repairs first */
        repair_ns[i] = clock_ns() - t0 - base_ns[i];
    }
    for (int p = 0; p < procs; p++) {
        kill(kids[p], SIGCONT);
    }

    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
    for (int p = 0; p < procs; p++) {
        waitpid(kids[p], NULL, 0);
    }
    {
        unsigned long n = sh->holds < MAX_HOLDS ? sh->holds : MAX_HOLDS;

        qsort(sh->hold_ns, n, sizeof(apr_uint32_t), cmp_u32);
        qsort(pair_ns, (size_t)npairs, sizeof(*pair_ns), cmp_i64);
        if (!n || !npairs) {
            fprintf(stderr, "scale: nothing measured\n");
            return 1;
        }
        /* shape procs threads queue records queued_mean holds hold_p50 p99 max
         * pairs pair_p50 p99 max reclaim_ns repair_ns repairs (ns) */
        printf("%s\t%d\t%d\t%u\t%u\t%.0f\t%lu\t%u\t%u\t%u\t%d\t%lld\t%lld\t%lld\t%lld\t%lld\t%llu\n",
               argv[1], procs, threads, queue, 2 * st.nslots + st.nwaiters,
               nsamples ? queued_sum / nsamples : 0.0, n, sh->hold_ns[n / 2],
               sh->hold_ns[(size_t)(n * 0.99)], sh->hold_ns[n - 1], npairs,
               (long long)pair_ns[npairs / 2], (long long)pair_ns[(int)(npairs * 0.99)],
               (long long)pair_ns[npairs - 1], (long long)median_i64(reclaim_ns, 5),
               (long long)median_i64(repair_ns, 5),
               (unsigned long long)st.counters.lock_repairs);
    }
    return 0;
}
