/*
 * Unit tests of queue discipline: priorities and reserve= on a real zone,
 * codel= and retry_after=auto on a simulated clock.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_codel.h"
#include "at_retry.h"
#include "at_zone.h"
#include "zone_test_util.h"

#define MS 1000

typedef struct {
    at_zone_t *z;
    int id, priority;
    apr_int64_t timeout_us, hold_us;
    at_result_t result;
    apr_int64_t wait_us;
    int *order, *next;
} req_arg_t;

static void *request_thread(void *p)
{
    req_arg_t *a = p;
    at_request_t rq = {
        .may_wait = 1, .priority = a->priority, .timeout_us = a->timeout_us};
    at_ticket_t t;

    a->result = at_zone_acquire_req(a->z, &t, &rq, NULL, NULL);
    a->wait_us = t.wait_us;
    if (a->result == AT_ADMITTED || a->result == AT_QUEUED) {
        if (a->order) {
            a->order[__atomic_fetch_add(a->next, 1, __ATOMIC_SEQ_CST)] = a->id;
        }
        usleep((useconds_t)a->hold_us);
        at_zone_release(a->z, &t);
    }
    return NULL;
}

/* Queue n requests behind a held slot, one at a time so that their arrival
 * order is known, release the slot and return the order they ran in. With
 * repair, a process dies holding the zone's lock first, so the queue is
 * rebuilt from its records before the slot is released. */
static void run_in_queue_after(at_zone_t *z, const int *prio, int n, int *order, int repair)
{
    pthread_t th[32];
    req_arg_t a[32];
    at_ticket_t hold;
    int next = 0;

    assert_true(n <= 32);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < n; i++) {
        a[i] = (req_arg_t){z, i, prio[i], 0, 1 * MS, AT_ERROR, 0, order, &next};
        pthread_create(&th[i], NULL, request_thread, &a[i]);
        wait_until_queued(z, (apr_uint32_t)i + 1);
    }
    if (repair) {
        pid_t pid = fork();

        if (pid == 0) {
            at_zone_debug_take_lock(z);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
        assert_int_equal(queued_now(z), (apr_uint32_t)n); /* rebuilt as it was */
        assert_int_equal(stats_of(z).counters.lock_repairs, 1);
    }
    at_zone_release(z, &hold);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
}

static void run_in_queue(at_zone_t *z, const int *prio, int n, int *order)
{
    run_in_queue_after(z, prio, n, order, 0);
}

enum { ORDER_N = 8 };
static const int order_prio[ORDER_N] = {0, 5, 0, -3, 5, 2, 10, -3};
static const int order_expect[ORDER_N] = {6, 1, 4, 5, 0, 2, 3, 7};

static void test_priority_then_arrival_order(void **state)
{
    at_zone_t *z = zone_new(1, ORDER_N, 5000 * MS);
    int order[ORDER_N];
    (void)state;

    run_in_queue(z, order_prio, ORDER_N, order);
    for (int i = 0; i < ORDER_N; i++) {
        assert_int_equal(order[i], order_expect[i]);
    }
    zone_free(z);
}

/* Lock repair rebuilds the queue from the waiting records, without
 * allocating, in the same order: priority, then arrival. */
static void test_repair_keeps_queue_order(void **state)
{
    at_zone_t *z = zone_new(1, ORDER_N, 5000 * MS);
    int order[ORDER_N];
    (void)state;

    run_in_queue_after(z, order_prio, ORDER_N, order, 1);
    for (int i = 0; i < ORDER_N; i++) {
        assert_int_equal(order[i], order_expect[i]);
    }
    zone_free(z);
}

static void test_high_priority_passes_ten_low(void **state)
{
    enum { N = 11 };
    int prio[N] = {0}, order[N];
    at_zone_t *z = zone_new(1, N, 5000 * MS);
    at_zone_stats_t s;
    (void)state;

    prio[N - 1] = 1;
    run_in_queue(z, prio, N, order);
    assert_int_equal(order[0], N - 1);
    for (int i = 1; i < N; i++) {
        assert_int_equal(order[i], i - 1);
    }
    s = stats_of(z);
    assert_int_equal(s.priority[1 - AT_PRIORITY_MIN].admitted, 1);
    assert_int_equal(s.priority[0 - AT_PRIORITY_MIN].admitted,
                     N - 1 + 1); /* + the holder */
    zone_free(z);
}

/* A full queue makes room for a higher priority: the newest waiter of the
 * lowest priority is refused, the others keep their places. An equal
 * priority is refused as before. */
static void test_full_queue_makes_room_for_higher(void **state)
{
    at_zone_t *z = zone_new(1, 2, 5000 * MS);
    int order[4], next = 0;
    req_arg_t a[4];
    pthread_t th[4];
    at_ticket_t hold, t;
    at_request_t same = {.may_wait = 1};
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < 2; i++) {
        a[i] = (req_arg_t){z, i, 0, 0, 1 * MS, AT_ERROR, 0, order, &next};
        pthread_create(&th[i], NULL, request_thread, &a[i]);
        wait_until_queued(z, (apr_uint32_t)i + 1);
    }
    assert_int_equal(at_zone_acquire_req(z, &t, &same, NULL, NULL), AT_REJECTED_FULL);
    a[2] = (req_arg_t){z, 2, 3, 0, 1 * MS, AT_ERROR, 0, order, &next};
    pthread_create(&th[2], NULL, request_thread, &a[2]);
    pthread_join(th[1], NULL);
    assert_int_equal(a[1].result, AT_REJECTED_FULL); /* the newest low one */
    wait_until_queued(z, 2);
    at_zone_release(z, &hold);
    pthread_join(th[0], NULL);
    pthread_join(th[2], NULL);
    assert_int_equal(a[0].result, AT_QUEUED);
    assert_int_equal(a[2].result, AT_QUEUED);
    assert_int_equal(order[0], 2);
    assert_int_equal(order[1], 0);
    assert_int_equal(stats_of(z).counters.rejected_full, 2);
    assert_int_equal(stats_of(z).priority[0 - AT_PRIORITY_MIN].rejected, 2);
    zone_free(z);
}

static int refuse_wait(void)
{
    return 0;
}

/* A newcomer of higher priority that is refused all the same (it may not
 * wait: no idle worker to spare) leaves the full queue as it was: one
 * refusal, not two. */
static void test_refused_newcomer_displaces_no_one(void **state)
{
    at_zone_t *z = zone_new(1, 1, 5000 * MS);
    req_arg_t low = {z, 0, 0, 0, 1 * MS, AT_ERROR, 0, NULL, NULL};
    pthread_t th;
    at_ticket_t hold, t;
    at_request_t no = {.may_wait = 0, .priority = 5};
    at_request_t ask = {.may_wait = AT_WAIT_ASK, .wait_check = refuse_wait, .priority = 5};
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, request_thread, &low);
    wait_until_queued(z, 1);
    assert_int_equal(at_zone_acquire_req(z, &t, &no, NULL, NULL), AT_REJECTED_WORKERS);
    assert_int_equal(at_zone_acquire_req(z, &t, &ask, NULL, NULL), AT_REJECTED_WORKERS);
    assert_int_equal(queued_now(z), 1); /* the waiter stays */
    assert_int_equal(stats_of(z).counters.rejected_full, 0);
    assert_int_equal(stats_of(z).counters.rejected_workers, 2);
    at_zone_release(z, &hold);
    pthread_join(th, NULL);
    assert_int_equal(low.result, AT_QUEUED);
    zone_free(z);
}

/* AT_WAIT_ASK with no check to ask is refused rather than let wait. */
static void test_ask_without_a_check_is_refused(void **state)
{
    at_zone_t *z = zone_new(1, 4, 5000 * MS);
    at_ticket_t hold, t;
    at_request_t ask = {.may_wait = AT_WAIT_ASK, .timeout_us = 50 * MS};
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_req(z, &t, &ask, NULL, NULL), AT_REJECTED_WORKERS);
    assert_int_equal(queued_now(z), 0);
    at_zone_release(z, &hold);
    zone_free(z);
}

/* The guess made without the lock agrees with the zone's rule: a request
 * runs at once past waiters of lower priority only. */
static void test_looks_free_agrees_with_the_lock(void **state)
{
    at_zone_conf_t c = {.limit = 2,
                        .queue = 4,
                        .timeout_us = 5000 * MS,
                        .reserve = 1,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    req_arg_t low = {z, 0, 0, 0, 1 * MS, AT_ERROR, 0, NULL, NULL};
    at_request_t hi = {.may_wait = 0, .priority = 1};
    at_request_t same = {.may_wait = 0};
    pthread_t th;
    at_ticket_t hold, t;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, request_thread, &low); /* priority 0: reserve=1 holds it */
    wait_until_queued(z, 1);
    assert_false(at_zone_looks_free(z, 0));
    assert_int_equal(at_zone_acquire_req(z, &t, &same, NULL, NULL), AT_REJECTED_WORKERS);
    assert_true(at_zone_looks_free(z, 1));
    assert_int_equal(at_zone_acquire_req(z, &t, &hi, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t);
    at_zone_release(z, &hold);
    pthread_join(th, NULL);
    assert_int_equal(low.result, AT_QUEUED);
    zone_free(z);
}

/* Out of range is taken as the nearest end, not refused. */
static void test_priority_clamped(void **state)
{
    int prio[3] = {-50, 0, 50}, order[3];
    at_zone_t *z = zone_new(1, 3, 5000 * MS);
    (void)state;

    run_in_queue(z, prio, 3, order);
    assert_int_equal(order[0], 2);
    assert_int_equal(order[2], 0);
    assert_int_equal(stats_of(z).priority[AT_PRIORITIES - 1].admitted, 1);
    assert_int_equal(stats_of(z).priority[0].admitted, 1);
    zone_free(z);
}

/* 8 clients of priority 0 loop on a zone of limit 4 with reserve=2: never
 * more than 2 of them run at once, and a priority 1 request finds a slot
 * at once all along. */
typedef struct {
    at_zone_t *z;
    volatile int *stop;
    int *running, *most;
    unsigned served;
} low_arg_t;

static void *low_client(void *p)
{
    low_arg_t *a = p;
    at_request_t rq = {.may_wait = 1};

    while (!*a->stop) {
        at_ticket_t t;
        if (at_zone_acquire_req(a->z, &t, &rq, NULL, NULL) == AT_QUEUED || t.slot >= 0) {
            int now = __atomic_add_fetch(a->running, 1, __ATOMIC_SEQ_CST), m;
            while ((m = __atomic_load_n(a->most, __ATOMIC_SEQ_CST)) < now &&
                   !__atomic_compare_exchange_n(a->most, &m, now, 0, __ATOMIC_SEQ_CST,
                                                __ATOMIC_SEQ_CST)) {
            }
            usleep(2 * MS);
            __atomic_sub_fetch(a->running, 1, __ATOMIC_SEQ_CST);
            at_zone_release(a->z, &t);
            a->served++;
        }
    }
    return NULL;
}

static void test_reserve_holds(void **state)
{
    enum { N = 8 };
    at_zone_conf_t c = {.limit = 4,
                        .queue = 16,
                        .timeout_us = 2000 * MS,
                        .reserve = 2,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    volatile int stop = 0;
    int running = 0, most = 0;
    low_arg_t a[N];
    pthread_t th[N];
    (void)state;

    for (int i = 0; i < N; i++) {
        a[i] = (low_arg_t){z, &stop, &running, &most, 0};
        pthread_create(&th[i], NULL, low_client, &a[i]);
    }
    for (int k = 0; k < 20; k++) {
        at_request_t hi = {.may_wait = 1, .priority = 1};
        at_ticket_t t;
        usleep(10 * MS);
        assert_int_equal(at_zone_acquire_req(z, &t, &hi, NULL, NULL), AT_ADMITTED);
        at_zone_release(z, &t);
    }
    stop = 1;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_true(a[i].served > 0);
    }
    assert_true(most >= 1);
    assert_true(most <= 2);
    zone_free(z);
}

static void test_priority_timeout(void **state)
{
    at_zone_t *z = zone_new(1, 4, 20000 * MS);
    at_request_t quick = {.may_wait = 1, .priority = 3, .timeout_us = 100 * MS};
    at_ticket_t hold, t;
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_req(z, &t, &quick, NULL, NULL), AT_REJECTED_TIMEOUT);
    assert_true(t.wait_us >= 100 * MS);
    assert_true(t.wait_us < 10000 * MS); /* its own timeout, not the zone's 20 s */
    s = stats_of(z);
    assert_int_equal(s.priority[3 - AT_PRIORITY_MIN].rejected, 1);
    assert_int_equal(s.counters.rejected_timeout, 1);
    at_zone_release(z, &hold);
    zone_free(z);
}

/* ---- codel=, on a simulated clock --------------------------------------- */

static void test_codel_burst_that_drains_keeps_the_timeout(void **state)
{
    at_codel_t c = {.target_us = 50 * MS, .interval_us = 100 * MS};
    apr_int64_t t;
    (void)state;

    /* Non-empty from 1 s for 90 ms: every waiter keeps its 4 s. */
    for (t = 1000 * MS; t < 1090 * MS; t += MS) {
        at_codel_queue_is(&c, 5, t);
        assert_int_equal(at_codel_deadline(&c, 1000 * MS, 5000 * MS, t, 0), 5000 * MS);
    }
    at_codel_queue_is(&c, 0, t);
    at_codel_queue_is(&c, 3, t + MS);
    assert_int_equal(at_codel_standing_for(&c, t + 99 * MS, 0), 0);
    assert_int_equal(at_codel_deadline(&c, t, t + 4000 * MS, t + 99 * MS, 0),
                     t + 4000 * MS);
}

static void test_codel_standing_queue_caps_waits(void **state)
{
    at_codel_t c = {.target_us = 50 * MS, .interval_us = 100 * MS};
    apr_int64_t t;
    (void)state;

    at_codel_queue_is(&c, 1, 1000 * MS);
    for (t = 1000 * MS; t < 3000 * MS; t += MS) {
        at_codel_queue_is(&c, 1 + (apr_uint32_t)(t / MS % 7), t);
        if (t >= 1100 * MS) {
            assert_true(at_codel_standing_for(&c, t, 0) > 0);
            /* a waiter from 60 ms ago is due now; one from 10 ms ago in 40 ms */
            assert_int_equal(at_codel_deadline(&c, t - 60 * MS, t + 4000 * MS, t, 0),
                             t - 10 * MS);
            assert_int_equal(at_codel_deadline(&c, t - 10 * MS, t + 4000 * MS, t, 0),
                             t + 40 * MS);
        }
    }
}

static void test_codel_empty_queue_restores_the_timeout(void **state)
{
    at_codel_t c = {.target_us = 50 * MS, .interval_us = 100 * MS};
    (void)state;

    at_codel_queue_is(&c, 4, 1000 * MS);
    assert_true(at_codel_standing_for(&c, 1500 * MS, 0) > 0);
    at_codel_queue_is(&c, 0, 1500 * MS);
    assert_int_equal(at_codel_standing_for(&c, 1500 * MS, 0), 0);
    assert_int_equal(at_codel_deadline(&c, 1400 * MS, 5400 * MS, 1500 * MS, 0),
                     5400 * MS);
    at_codel_queue_is(&c, 1, 1501 * MS);
    assert_int_equal(at_codel_standing_for(&c, 1600 * MS, 0), 0);
    assert_true(at_codel_standing_for(&c, 1601 * MS, 0) > 0);
}

static void test_codel_default_interval(void **state)
{
    at_codel_t c = {.target_us = 50 * MS};
    (void)state;

    assert_int_equal(at_codel_interval(&c, 0), AT_CODEL_INTERVAL_MIN_US);
    assert_int_equal(at_codel_interval(&c, 5 * MS), AT_CODEL_INTERVAL_MIN_US);
    assert_int_equal(at_codel_interval(&c, 80 * MS), 800 * MS);
    c.interval_us = 300 * MS;
    assert_int_equal(at_codel_interval(&c, 80 * MS), 300 * MS);
}

/* A real zone whose queue stands: the waiter is cut at the target, long
 * before its 20 s timeout, and counted as rejected-standing. */
static void test_codel_in_a_zone(void **state)
{
    at_zone_conf_t c = {.limit = 1,
                        .queue = 4,
                        .timeout_us = 20000 * MS,
                        .codel_target_us = 100 * MS,
                        .codel_interval_us = 200 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    at_ticket_t hold, t;
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_STANDING);
    assert_true(t.wait_us >= 200 * MS);
    assert_true(t.wait_us < 10000 * MS);
    s = stats_of(z);
    assert_int_equal(s.counters.rejected_standing, 1);
    assert_int_equal(s.counters.rejected_timeout, 0);
    assert_int_equal(s.standing_us, 0); /* it left: the queue is empty again */
    at_zone_release(z, &hold);
    zone_free(z);
}

/* order=lifo: once the queue stands, the newest of the highest priority
 * waiting runs next; before it stands, and with order=fifo, the oldest. */
static void run_standing(apr_uint32_t order, apr_int64_t interval_us, const int *prio, int n,
                         int *ran)
{
    at_zone_conf_t c = {.limit = 1,
                        .queue = 8,
                        .timeout_us = 20000 * MS,
                        .codel_target_us = 10000 * MS, /* nobody cut: only the order shows */
                        .codel_interval_us = interval_us,
                        .order = order,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    pthread_t th[8];
    req_arg_t a[8];
    at_ticket_t hold;
    int next = 0;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < n; i++) {
        a[i] = (req_arg_t){z, i, prio[i], 0, 1 * MS, AT_ERROR, 0, ran, &next};
        pthread_create(&th[i], NULL, request_thread, &a[i]);
        wait_until_queued(z, (apr_uint32_t)i + 1);
    }
    if (interval_us < 1000 * MS) {
        while (stats_of(z).standing_us == 0) {
            usleep(10 * MS);
        }
    }
    else {
        assert_int_equal(stats_of(z).standing_us, 0); /* a burst, as yet */
    }
    at_zone_release(z, &hold);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
    zone_free(z);
}

static void test_lifo_serves_the_newest_once_the_queue_stands(void **state)
{
    static const int prio[4] = {0, 5, 0, 5};
    static const int lifo[4] = {3, 1, 2, 0}, fifo[4] = {1, 3, 0, 2};
    int ran[4];
    (void)state;

    run_standing(AT_ORDER_LIFO, 50 * MS, prio, 4, ran);
    assert_memory_equal(ran, lifo, sizeof(ran));
    run_standing(AT_ORDER_FIFO, 50 * MS, prio, 4, ran);
    assert_memory_equal(ran, fifo, sizeof(ran));
}

/* A queue that has not stood yet (a burst: an interval of 60 s) runs in
 * arrival order. */
static void test_lifo_burst_runs_in_arrival_order(void **state)
{
    static const int prio[3] = {0, 0, 0}, fifo[3] = {0, 1, 2};
    int ran[3];
    (void)state;

    run_standing(AT_ORDER_LIFO, 60000 * MS, prio, 3, ran);
    assert_memory_equal(ran, fifo, sizeof(ran));
}

/* ---- retry_after=auto, simulated clients ---------------------------------- */

/* What the zone does for each refusal (refused 1) or grant (0). */
static void retry_count(at_retry_t *r, int refused, apr_int64_t now, apr_uint32_t floor_s,
                        apr_uint32_t ceiling_s)
{
    if (at_retry_due(r, now)) {
        at_retry_close(r, now, floor_s, ceiling_s);
    }
    if (refused) {
        r->refused++;
    }
    else {
        r->granted++;
    }
}

/* A closed loop on a simulated clock, 1 ms a step: CLIENTS clients, a zone
 * of SLOTS slots of SERVICE ms and a queue of QUEUE. A client sends its
 * next request as soon as one is served; a refused one waits the advice
 * (an impolite one IMPOLITE_MS instead). scheduled 0: the floor alone, as
 * retry_after=auto advised before it followed its refusals. */
enum { SLOTS = 2, SERVICE = 100, QUEUE = 20, CEILING = 30 };

typedef struct {
    unsigned admitted, refused;
    apr_uint32_t most_advice, last_advice;
} sim_result_t;

static sim_result_t simulate(int clients, int impolite, int impolite_ms, int seconds,
                             int scheduled)
{
    static apr_int64_t next_at[400];
    apr_int64_t run_end[SLOTS] = {0};
    int running[SLOTS], queue[QUEUE], qn = 0;
    at_retry_t r = {0};
    sim_result_t out = {0};
    unsigned seed = 7;

    for (int i = 0; i < clients; i++) {
        next_at[i] = i; /* all arrive within the first steps */
    }
    for (int s = 0; s < SLOTS; s++) {
        running[s] = -1;
    }
    for (apr_int64_t ms = 0; ms < (apr_int64_t)seconds * 1000; ms++) {
        apr_int64_t now = ms * MS;
        apr_uint32_t floor_s =
            at_retry_after_secs((apr_uint32_t)qn, SERVICE * MS, SLOTS, CEILING);

        for (int s = 0; s < SLOTS; s++) {
            if (running[s] >= 0 && run_end[s] <= ms) {
                next_at[running[s]] = ms; /* served: straight back */
                running[s] = -1;
                out.admitted++;
            }
            if (running[s] < 0 && qn) {
                running[s] = queue[0];
                memmove(queue, queue + 1, sizeof(int) * (size_t)--qn);
                run_end[s] = ms + SERVICE;
                retry_count(&r, 0, now, floor_s, CEILING);
            }
        }
        for (int i = 0; i < clients; i++) {
            int s;
            if (next_at[i] != ms) {
                continue;
            }
            for (s = 0; s < SLOTS && running[s] >= 0; s++) {
            }
            if (s < SLOTS && !qn) {
                running[s] = i;
                run_end[s] = ms + SERVICE;
                retry_count(&r, 0, now, floor_s, CEILING);
            }
            else if (qn < QUEUE) {
                queue[qn++] = i;
            }
            else {
                apr_uint32_t adv;
                if (scheduled) {
                    retry_count(&r, 1, now, floor_s, CEILING);
                }
                adv = at_retry_advice(&r, floor_s, CEILING,
                                      rand_r(&seed) / (RAND_MAX + 1.0));
                out.refused++;
                out.last_advice = adv;
                if (adv > out.most_advice) {
                    out.most_advice = adv;
                }
                next_at[i] = ms + (i < impolite ? impolite_ms : (apr_int64_t)adv * 1000);
            }
        }
    }
    return out;
}

static void test_retry_schedules_polite_clients(void **state)
{
    sim_result_t before = simulate(200, 0, 0, 120, 0);
    sim_result_t after = simulate(200, 0, 0, 120, 1);
    double rb = (double)before.refused / before.admitted;
    double ra = (double)after.refused / after.admitted;
    (void)state;

    print_message("retry sim: floor only %u admitted, %.2f refusals each; scheduled %u "
                  "admitted, %.2f refusals each, advice up to %u s\n",
                  before.admitted, rb, after.admitted, ra, after.most_advice);
    assert_true(after.admitted >= before.admitted * 95 / 100);
    assert_true(ra * 3 <= rb);
    assert_true(after.most_advice <= CEILING);
}

/* Clients that come back every 10 ms whatever they are told push the
 * advice up to the ceiling and no further; once they are gone it falls
 * back to the floor. */
static void test_retry_impolite_clients_are_bounded(void **state)
{
    at_retry_t r = {0};
    apr_int64_t ms;
    apr_uint32_t adv = 0;
    (void)state;

    for (ms = 0; ms < 600000; ms += 10) {
        retry_count(&r, 1, ms * MS, 1, CEILING);
        if (ms % 100 == 0) {
            retry_count(&r, 0, ms * MS, 1, CEILING);
        }
        adv = at_retry_advice(&r, 1, CEILING, 0.999);
        assert_true(adv <= CEILING);
    }
    assert_true(adv >= CEILING / 2);
    /* gone: only grants from now on */
    for (; ms < 1200000; ms += 100) {
        retry_count(&r, 0, ms * MS, 1, CEILING);
    }
    assert_int_equal(at_retry_advice(&r, 1, CEILING, 0.5), 1);
}

/* Each answer is spread over [R/2, 3R/2]. */
static void test_retry_spreads_answers(void **state)
{
    at_retry_t r = {.advice_ms = 8000};
    (void)state;

    assert_int_equal(at_retry_advice(&r, 1, CEILING, 0.0), 4);
    assert_int_equal(at_retry_advice(&r, 1, CEILING, 0.5), 8);
    assert_int_equal(at_retry_advice(&r, 1, CEILING, 0.999), 12);
    assert_int_equal(at_retry_advice(&r, 1, 10, 0.999), 10);
    r.advice_ms = 0;
    assert_int_equal(at_retry_advice(&r, 3, CEILING, 0.9), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priority_then_arrival_order),
        cmocka_unit_test(test_repair_keeps_queue_order),
        cmocka_unit_test(test_high_priority_passes_ten_low),
        cmocka_unit_test(test_priority_clamped),
        cmocka_unit_test(test_full_queue_makes_room_for_higher),
        cmocka_unit_test(test_refused_newcomer_displaces_no_one),
        cmocka_unit_test(test_ask_without_a_check_is_refused),
        cmocka_unit_test(test_looks_free_agrees_with_the_lock),
        cmocka_unit_test(test_reserve_holds),
        cmocka_unit_test(test_priority_timeout),
        cmocka_unit_test(test_codel_burst_that_drains_keeps_the_timeout),
        cmocka_unit_test(test_codel_standing_queue_caps_waits),
        cmocka_unit_test(test_codel_empty_queue_restores_the_timeout),
        cmocka_unit_test(test_codel_default_interval),
        cmocka_unit_test(test_codel_in_a_zone),
        cmocka_unit_test(test_lifo_serves_the_newest_once_the_queue_stands),
        cmocka_unit_test(test_lifo_burst_runs_in_arrival_order),
        cmocka_unit_test(test_retry_schedules_polite_clients),
        cmocka_unit_test(test_retry_impolite_clients_are_bounded),
        cmocka_unit_test(test_retry_spreads_answers),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
