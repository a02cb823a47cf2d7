/*
 * Unit tests of the zone core: accounting, FIFO hand-off, timeouts, aborts,
 * reclaim of dead processes and recovery of a lock whose holder died.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <syslog.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_retry.h"
#include "at_tuning.h"
#include "at_zone.h"
#include "zone_test_util.h"

#define MS 1000

static apr_uint32_t active_now(at_zone_t *z)
{
    at_zone_stats_t s;

    at_zone_stats(z, &s);
    return s.active;
}

static void test_slot_accounting(void **state)
{
    at_zone_t *z = zone_new(3, 0, 100 * MS);
    at_ticket_t t[4];
    at_zone_stats_t s;
    (void)state;

    for (int i = 0; i < 3; i++) {
        assert_int_equal(at_zone_acquire(z, &t[i], NULL, NULL), AT_ADMITTED);
        assert_int_equal(active_now(z), i + 1);
    }
    assert_int_equal(at_zone_acquire(z, &t[3], NULL, NULL), AT_REJECTED_FULL);
    assert_true(at_zone_release(z, &t[1]) >= 0);
    assert_int_equal(at_zone_release(z, &t[1]), -1); /* twice: no effect */
    assert_int_equal(active_now(z), 2);
    assert_int_equal(at_zone_acquire(z, &t[3], NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t[0]);
    at_zone_release(z, &t[2]);
    at_zone_release(z, &t[3]);
    at_zone_stats(z, &s);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.counters.admitted, 4);
    assert_int_equal(s.counters.rejected_full, 1);
    zone_free(z);
}

typedef struct {
    at_zone_t *z;
    int id;
    at_result_t result;
    apr_int64_t wait_us;
    apr_int64_t hold_us;
    int *order;
    int *next;
    volatile int *abort_flag;
    int *hold_until; /* non-NULL: holds its slot until *hold_until is set */
} waiter_arg_t;

static int abort_when_flag(void *ctx)
{
    return *(volatile int *)ctx;
}

static void *waiter_thread(void *p)
{
    waiter_arg_t *a = p;
    at_ticket_t t;

    a->result = at_zone_acquire(a->z, &t, a->abort_flag ? abort_when_flag : NULL,
                                (void *)a->abort_flag);
    a->wait_us = t.wait_us;
    if (a->result == AT_ADMITTED || a->result == AT_QUEUED) {
        if (a->order) {
            a->order[__atomic_fetch_add(a->next, 1, __ATOMIC_SEQ_CST)] = a->id;
        }
        if (a->hold_us) {
            usleep((useconds_t)a->hold_us);
        }
        while (a->hold_until && !__atomic_load_n(a->hold_until, __ATOMIC_SEQ_CST)) {
            usleep(1000);
        }
        at_zone_release(a->z, &t);
    }
    return NULL;
}

static void test_fifo_order(void **state)
{
    enum { N = 8 };
    at_zone_t *z = zone_new(1, N, 5000 * MS);
    pthread_t th[N];
    waiter_arg_t a[N];
    int order[N], next = 0;
    at_ticket_t hold;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < N; i++) {
        a[i] = (waiter_arg_t){z, i, AT_ERROR, 0, 1 * MS, order, &next, NULL, NULL};
        pthread_create(&th[i], NULL, waiter_thread, &a[i]);
        wait_until_queued(z, (apr_uint32_t)i + 1); /* enqueue in a known order */
    }
    at_zone_release(z, &hold);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(order[i], i);
    }
    assert_int_equal(active_now(z), 0);
    assert_int_equal(queued_now(z), 0);
    zone_free(z);
}

/* A released slot belongs to the oldest waiter: a newcomer cannot take it.
 * The waiter keeps the slot until the newcomer has its answer, and only
 * the newcomer has a short timeout, so a slow machine changes nothing. */
static void test_no_barging(void **state)
{
    at_zone_t *z = zone_new(1, 1, 30000 * MS);
    at_ticket_t hold, late;
    pthread_t th;
    int done = 0;
    waiter_arg_t a = {z, 0, AT_ERROR, 0, 0, NULL, NULL, NULL, &done};
    at_request_t rq = {.may_wait = 1, .timeout_us = 50 * MS};
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    at_zone_release(z, &hold);
    assert_int_equal(at_zone_acquire_req(z, &late, &rq, NULL, NULL), AT_REJECTED_TIMEOUT);
    __atomic_store_n(&done, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_int_equal(a.result, AT_QUEUED);
    zone_free(z);
}

/* Refused at once: well before the long timeout it would have waited out. */
static void test_queue_full_rejects_at_once(void **state)
{
    at_zone_t *z = zone_new(1, 2, 30000 * MS);
    at_ticket_t hold, t;
    pthread_t th[2];
    waiter_arg_t a[2];
    apr_int64_t t0;
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < 2; i++) {
        a[i] = (waiter_arg_t){z, i, AT_ERROR, 0, 0, NULL, NULL, NULL, NULL};
        pthread_create(&th[i], NULL, waiter_thread, &a[i]);
        wait_until_queued(z, (apr_uint32_t)i + 1);
    }
    t0 = at_now_us();
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_FULL);
    assert_true(at_now_us() - t0 < 15000 * MS);
    at_zone_release(z, &hold);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
    at_zone_stats(z, &s);
    assert_int_equal(s.counters.rejected_full, 1);
    assert_int_equal(s.counters.queued_total, 2);
    assert_int_equal(s.counters.admitted, 3);
    zone_free(z);
}

/* may_wait 0 (the server is short of idle workers): a request that finds
 * the zone full is refused at once and counted, never queued; one that
 * finds a free slot still runs. */
static void test_no_wait_refuses_instead_of_queueing(void **state)
{
    at_zone_t *z = zone_new(1, 5, 30000 * MS);
    at_ticket_t hold, t;
    apr_int64_t t0;
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire_if(z, &hold, NULL, 0, NULL, NULL), AT_ADMITTED);
    t0 = at_now_us();
    assert_int_equal(at_zone_acquire_if(z, &t, NULL, 0, NULL, NULL), AT_REJECTED_WORKERS);
    assert_true(at_now_us() - t0 < 15000 * MS); /* not the timeout */
    at_zone_stats(z, &s);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.counters.rejected_workers, 1);
    assert_int_equal(s.counters.queued_total, 0);
    at_zone_release(z, &hold);
    assert_int_equal(at_zone_acquire_if(z, &t, NULL, 0, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t);
    zone_free(z);
}

/* AT_WAIT_ASK (the module guessed a slot was free): the check of idle
 * workers is asked only when the request has to wait after all, as it does
 * when reserve= keeps the zone's last slot from priority 0. */
static int wait_check_calls, wait_check_answer;

static int count_wait_check(void)
{
    wait_check_calls++;
    return wait_check_answer;
}

static void test_wait_check_asked_only_to_wait(void **state)
{
    at_zone_conf_t c = {.limit = 3,
                        .queue = 4,
                        .timeout_us = 20 * MS,
                        .reserve = 1,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    at_request_t rq = {.may_wait = AT_WAIT_ASK, .wait_check = count_wait_check};
    at_ticket_t a, b, t;
    (void)state;

    wait_check_calls = 0;
    assert_true(at_zone_looks_free(z, 0));
    assert_int_equal(at_zone_acquire_req(z, &a, &rq, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_req(z, &b, &rq, NULL, NULL), AT_ADMITTED);
    assert_int_equal(wait_check_calls, 0); /* they ran: nothing to ask */
    assert_false(at_zone_looks_free(z, 0)); /* one slot left, kept by reserve=1 */
    assert_true(at_zone_looks_free(z, 1));
    wait_check_answer = 0;
    assert_int_equal(at_zone_acquire_req(z, &t, &rq, NULL, NULL), AT_REJECTED_WORKERS);
    assert_int_equal(wait_check_calls, 1);
    wait_check_answer = 1;
    assert_int_equal(at_zone_acquire_req(z, &t, &rq, NULL, NULL), AT_REJECTED_TIMEOUT);
    assert_int_equal(wait_check_calls, 2);
    assert_int_equal(stats_of(z).counters.rejected_workers, 1);
    assert_int_equal(stats_of(z).counters.queued_total, 1);
    at_zone_release(z, &a);
    at_zone_release(z, &b);
    zone_free(z);
}

static void test_timeout(void **state)
{
    at_zone_t *z = zone_new(1, 4, 120 * MS);
    at_ticket_t hold, t;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_TIMEOUT);
    assert_true(t.wait_us >= 120 * MS);
    assert_true(t.wait_us < 120 * MS + 10000 * MS); /* a hang guard only */
    assert_int_equal(queued_now(z), 0);
    at_zone_release(z, &hold);
    zone_free(z);
}

static void test_abort_leaves_queue(void **state)
{
    at_zone_t *z = zone_new(1, 4, 30000 * MS);
    at_ticket_t hold;
    volatile int flag = 0;
    pthread_t th;
    waiter_arg_t a = {z, 0, AT_ERROR, 0, 0, NULL, NULL, &flag, NULL};
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    flag = 1;
    pthread_join(th, NULL);
    assert_int_equal(a.result, AT_ABORTED);
    assert_true(a.wait_us < 15000 * MS); /* left on the abort, not the timeout */
    at_zone_stats(z, &s);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.counters.aborted, 1);
    at_zone_release(z, &hold);
    assert_int_equal(active_now(z), 0);
    zone_free(z);
}

/* Fork a child that takes a slot and exits without giving it back. */
static pid_t child_holding_slot(at_zone_t *z)
{
    return fork_holder(z, NULL, 0);
}

static void test_reclaim_zombie_holder(void **state)
{
    at_zone_t *z = zone_new(2, 0, 100 * MS);
    pid_t pid = child_holding_slot(z);
    at_zone_stats_t s;
    siginfo_t info;
    (void)state;

    /* Exited, not yet reaped: a zombie that answers kill(pid, 0). Waited
     * for, not slept on: under valgrind a child's exit takes its leak
     * check, far longer than any fixed pause. */
    assert_int_equal(waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT), 0);
    assert_int_equal(kill(pid, 0), 0);
    assert_int_equal(active_now(z), 1);
    assert_int_equal(at_zone_reclaim(z), 1);
    at_zone_stats(z, &s);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.counters.reclaimed, 1);
    waitpid(pid, NULL, 0);
    zone_free(z);
}

static void test_reclaim_reaped_holder_on_full_acquire(void **state)
{
    at_zone_t *z = zone_new(1, 0, 100 * MS);
    pid_t pid = child_holding_slot(z);
    at_ticket_t t;
    (void)state;

    waitpid(pid, NULL, 0);
    /* The zone looks full, but its only holder is dead: acquire reclaims. */
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t);
    zone_free(z);
}

static void *kill_later(void *p)
{
    usleep(50 * MS);
    kill(*(pid_t *)p, SIGKILL);
    return NULL;
}

/* A waiter notices a dead holder and takes its slot, well before its long
 * timeout: nothing else (no parent here) reclaims. */
static void test_waiter_reclaims(void **state)
{
    at_zone_t *z = zone_new(1, 1, 30000 * MS);
    at_ticket_t t;
    pthread_t th;
    pid_t pid = fork();
    (void)state;

    if (pid == 0) {
        at_ticket_t mine;
        at_zone_acquire(z, &mine, NULL, NULL);
        pause();
        _exit(0);
    }
    while (active_now(z) != 1) {
        usleep(1000);
    }
    at_zone_reclaim(z); /* the child is alive; this makes the next reclaim not due */
    assert_int_equal(active_now(z), 1);
    pthread_create(&th, NULL, kill_later, &pid);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_QUEUED);
    assert_true(t.wait_us < 15000 * MS);
    assert_int_equal(stats_of(z).counters.reclaimed, 1);
    pthread_join(th, NULL);
    at_zone_release(z, &t);
    waitpid(pid, NULL, 0);
    assert_int_equal(active_now(z), 0);
    zone_free(z);
}

/* Many waiters behind a live holder: one reclaim pass an interval, not one
 * per waiter that finds it due; and no lock taken just to look. Counted
 * from before the first waiter arrives, over the time it all took, so that
 * a waiter started late on a slow machine changes nothing. */
static void test_one_reclaim_at_a_time(void **state)
{
    enum { N = 24, WAIT_MS = 1000 };
    at_zone_t *z = zone_new(1, N, WAIT_MS * MS);
    pthread_t th[N];
    waiter_arg_t a[N];
    pid_t holder = fork_holder(z, NULL, 1);
    apr_uint32_t passes, locks;
    apr_int64_t t0, took;
    (void)state;

    __atomic_store_n(&at_test_reclaim_passes, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&at_test_lock_count, 0, __ATOMIC_SEQ_CST);
    t0 = at_now_us();
    for (int i = 0; i < N; i++) {
        a[i] = (waiter_arg_t){.z = z, .result = AT_ERROR};
        pthread_create(&th[i], NULL, waiter_thread, &a[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
    }
    took = at_now_us() - t0;
    /* Each gives up at its deadline: refused for the timeout, or for the
     * lock if another held it then (a busy machine descheduled it). */
    for (int i = 0; i < N; i++) {
        assert_true(a[i].result == AT_REJECTED_TIMEOUT
                    || a[i].result == AT_REJECTED_LOCKED);
    }
    passes = __atomic_load_n(&at_test_reclaim_passes, __ATOMIC_SEQ_CST);
    locks = __atomic_load_n(&at_test_lock_count, __ATOMIC_SEQ_CST);
    print_message("%d waiters for %.2f s: %u reclaim passes, %u lock waits\n", N,
                  took / 1e6, passes, locks);
    /* one pass per interval in the time the waiters waited, and one more
     * for the edges */
    assert_true(passes <= took / AT_RECLAIM_INTERVAL_US + 2);
    /* Waiting reads a waiter's state without the lock: each takes it to
     * join the queue and to give up, and now and then to look for the
     * dead; not every 50 ms (that was 20 a second each, 480 here). */
    assert_true(locks <= 4 * N + 4 * passes);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    zone_free(z);
}

static void test_reclaim_dead_waiter(void **state)
{
    at_zone_t *z = zone_new(1, 2, 10000 * MS);
    at_ticket_t hold;
    at_zone_stats_t s;
    pid_t pid;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pid = fork();
    if (pid == 0) {
        at_ticket_t t;
        at_zone_acquire(z, &t, NULL, NULL);
        _exit(0);
    }
    wait_until_queued(z, 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(at_zone_reclaim(z), 1);
    assert_int_equal(queued_now(z), 0);
    at_zone_release(z, &hold);
    at_zone_stats(z, &s);
    assert_int_equal(s.active, 0); /* the slot was not handed to the dead */
    zone_free(z);
}

static void test_lock_holder_dies(void **state)
{
    at_zone_t *z = zone_new(2, 2, 100 * MS);
    at_ticket_t t;
    at_zone_stats_t s;
    pid_t pid = child_holding_slot(z);
    (void)state;

    waitpid(pid, NULL, 0);
    pid = fork();
    if (pid == 0) {
        at_zone_debug_take_lock(z);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    at_zone_stats(z, &s);
    assert_int_equal(s.counters.lock_repairs, 1);
    assert_int_equal(s.active, 2); /* recount from records: dead holder + us */
    at_zone_release(z, &t);
    assert_int_equal(at_zone_reclaim(z), 1);
    assert_int_equal(active_now(z), 0);
    zone_free(z);
}

/* A stopped lock holder holds no request past its deadline: newcomers are
 * refused when their time is up, the status reads what it can, marked
 * stale; when the holder goes on, all is as before. */
static void test_stopped_lock_holder_bounds_waits(void **state)
{
    at_zone_t *z = zone_new(2, 2, 300 * MS);
    at_ticket_t t;
    at_zone_stats_t s;
    pid_t holder = fork_stopped_lock_holder(z);
    (void)state;

    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_LOCKED);
    assert_true(t.wait_us >= 300 * MS); /* it waited its time, */
    assert_true(t.wait_us < 300 * MS + 5000 * MS); /* not for ever */
    at_zone_stats(z, &s);
    assert_int_equal(s.stale, 1);
    assert_int_equal(s.limit, 2);
    assert_int_equal(s.counters.rejected_locked, 1);

    kill(holder, SIGCONT);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    at_zone_stats(z, &s);
    assert_int_equal(s.stale, 0);
    assert_int_equal(s.active, 1);
    at_zone_release(z, &t);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    zone_free(z);
}

/* A request that is done gives its slot back though a stopped process
 * holds the lock: it waits AT_RELEASE_LOCK_US at most (its worker and its
 * client's connection with it), and the next holder frees the slot. */
static void test_release_while_lock_held(void **state)
{
    at_zone_t *z = zone_new(1, 2, 300 * MS);
    at_ticket_t t;
    cont_arg_t c = {0, SIGCONT, 0, 0};
    pthread_t th;
    apr_int64_t t0, took;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    c.holder = fork_stopped_lock_holder(z);
    pthread_create(&th, NULL, cont_later, &c);
    t0 = at_now_us();
    at_zone_release(z, &t);
    took = at_now_us() - t0;
    __atomic_store_n(&c.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_true(took >= AT_RELEASE_LOCK_US);
    assert_false(c.fired); /* it gave up on the lock; the holder never went on */

    /* the holder let go: the slot is free again, and counted so */
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    assert_int_equal(stats_of(z).active, 1);
    at_zone_release(z, &t);
    assert_int_equal(stats_of(z).active, 0);
    kill(c.holder, SIGKILL);
    waitpid(c.holder, NULL, 0);
    zone_free(z);
}

/* A waiter whose deadline passes while the lock is held leaves the queue
 * without the lock; the next holder tidies its record, and the slot it
 * would have had goes to nobody who has left. */
static void test_waiter_leaves_without_the_lock(void **state)
{
    at_zone_t *z = zone_new(1, 2, 300 * MS);
    at_ticket_t hold;
    waiter_arg_t a = {.z = z, .result = AT_ERROR};
    pthread_t th;
    pid_t holder;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    holder = fork_stopped_lock_holder(z);
    pthread_join(th, NULL);
    assert_int_equal(a.result, AT_REJECTED_LOCKED);

    kill(holder, SIGCONT);
    at_zone_release(z, &hold); /* waits for the holder, then tidies */
    assert_int_equal(queued_now(z), 0);
    assert_int_equal(stats_of(z).active, 0);
    assert_int_equal(stats_of(z).counters.rejected_locked, 1);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &hold);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    zone_free(z);
}

/* A zone that replaced another at a restart (grown past its memory)
 * counts what still runs in the old one against its limit: together they
 * never run more than the new limit. A waiter of the new zone gets the
 * room an old request leaves; the old zone is let go once idle. */
static void test_successor_counts_what_runs_in_the_old_zone(void **state)
{
    at_zone_t *old = zone_new(3, 0, 100 * MS), *z = zone_new(4, 2, 3000 * MS);
    at_ticket_t o[3], t[2];
    waiter_arg_t a = {.z = z, .result = AT_ERROR};
    at_zone_glance_t g;
    pthread_t th;
    (void)state;

    for (int i = 0; i < 3; i++) {
        assert_int_equal(at_zone_acquire(old, &o[i], NULL, NULL), AT_ADMITTED);
    }
    at_zone_succeed(z, old);
    assert_null(at_zone_let_go_predecessor(z)); /* busy: kept */
    assert_int_equal(at_zone_acquire(z, &t[0], NULL, NULL), AT_ADMITTED); /* 3 + 1 = 4 */
    at_zone_glance(z, &g); /* what a fleet's share must cover */
    assert_int_equal(g.active, 1);
    assert_int_equal(g.running, 4);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    at_zone_release(old, &o[0]); /* room for the new zone's waiter */
    pthread_join(th, NULL);
    assert_int_equal(a.result, AT_QUEUED); /* it ran, and gave its slot back */
    assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_ADMITTED); /* 2 + 2 = 4 */
    assert_int_equal(at_zone_acquire_now(z, &o[0]), AT_REJECTED_FULL);
    at_zone_release(old, &o[1]);
    at_zone_release(old, &o[2]);
    assert_ptr_equal(at_zone_let_go_predecessor(z), old);
    assert_false(at_zone_counts(z, old));
    at_zone_release(z, &t[0]);
    at_zone_release(z, &t[1]);
    assert_true(at_zone_idle(z));
    zone_free(old);
    zone_free(z);
}

/* A replaced zone cannot see what its successor runs: it refuses
 * newcomers (a connection an old child took after the restart) at once,
 * even with room under its own limit, and still runs what waited there. */
static int replaced_go; /* static: a waiter may outlive a failed test's frame */

static void test_replaced_zone_refuses_newcomers_runs_its_queue(void **state)
{
    at_zone_t *old = zone_new(2, 4, 30000 * MS), *z = zone_new(2, 4, 30000 * MS);
    waiter_arg_t a = {.z = old, .result = AT_ERROR, .hold_until = &replaced_go};
    at_request_t quick = {.client = NULL, .may_wait = 1, .timeout_us = 200 * MS};
    at_ticket_t o[2], x, t[2];
    at_zone_glance_t g;
    pthread_t th;
    (void)state;

    replaced_go = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(at_zone_acquire(old, &o[i], NULL, NULL), AT_ADMITTED);
    }
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(old, 1);
    at_zone_succeed(z, old);
    /* refused at once, not queued (it would wait out its 200 ms) */
    assert_int_equal(at_zone_acquire_req(old, &x, &quick, NULL, NULL), AT_REJECTED_FULL);
    at_zone_glance(old, &g);
    assert_int_equal(g.queued, 1);
    assert_int_equal(at_zone_acquire_now(z, &t[0]), AT_REJECTED_FULL); /* the old 2 run */
    at_zone_release(old, &o[0]);
    for (int i = 0; i < 30000 && __atomic_load_n(&a.result, __ATOMIC_SEQ_CST) == AT_ERROR; i++) {
        usleep(1000); /* what waited in the old zone runs there */
    }
    assert_int_equal(a.result, AT_QUEUED);
    assert_int_equal(at_zone_acquire_now(z, &t[0]), AT_REJECTED_FULL);
    at_zone_release(old, &o[1]);
    assert_int_equal(at_zone_acquire_now(old, &x), AT_REJECTED_FULL); /* room, but replaced */
    assert_int_equal(at_zone_acquire_now(z, &t[0]), AT_ADMITTED); /* 1 old + 1 new */
    assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_REJECTED_FULL);
    __atomic_store_n(&replaced_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_ADMITTED);
    at_zone_release(z, &t[0]);
    at_zone_release(z, &t[1]);
    assert_ptr_equal(at_zone_let_go_predecessor(z), old);
    zone_free(old);
    zone_free(z);
}

/* A release that hands its slot to the next waiter frees the slot, then
 * fills it, under the old zone's lock: the successor and the parent, which
 * read the old zone without that lock, must not take the moment between
 * for room, or for an idle zone. */
static int handoff_paused, handoff_go, handoff_armed;

static void pause_in_handoff(int where, int n)
{
    if (where == AT_STEP_DISPATCH && n == 1
        && __atomic_exchange_n(&handoff_armed, 0, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&handoff_paused, 1, __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&handoff_go, __ATOMIC_SEQ_CST)) {
            usleep(1000);
        }
    }
}

static void *release_in_thread(void *p)
{
    void **arg = p;

    at_zone_release(arg[0], arg[1]);
    return NULL;
}

static void test_successor_sees_no_room_in_a_handoff(void **state)
{
    at_zone_t *old = zone_new(1, 4, 30000 * MS), *z = zone_new(1, 4, 30000 * MS);
    waiter_arg_t a = {.z = old, .result = AT_ERROR, .hold_until = &replaced_go};
    at_ticket_t o, t;
    pthread_t th, rel;
    void *arg[2] = {old, &o};
    at_result_t seen;
    at_zone_t *let_go;
    (void)state;

    replaced_go = handoff_paused = handoff_go = 0;
    assert_int_equal(at_zone_acquire(old, &o, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(old, 1);
    at_zone_succeed(z, old);
    handoff_armed = 1;
    at_test_step_hook = pause_in_handoff;
    pthread_create(&rel, NULL, release_in_thread, arg);
    for (int i = 0; i < 30000 && !__atomic_load_n(&handoff_paused, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
    assert_true(__atomic_load_n(&handoff_paused, __ATOMIC_SEQ_CST)); /* the hand-off was reached */
    seen = at_zone_acquire_now(z, &t); /* the old slot between its two owners */
    let_go = at_zone_let_go_predecessor(z);
    __atomic_store_n(&handoff_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(rel, NULL);
    at_test_step_hook = NULL;
    if (seen == AT_ADMITTED) {
        at_zone_release(z, &t);
    }
    __atomic_store_n(&replaced_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_int_equal(seen, AT_REJECTED_FULL);
    assert_null(let_go);
    assert_int_equal(a.result, AT_QUEUED);
    zone_free(old);
    zone_free(z);
}

/* Of what waits in the old zone, the successor counts only what the old
 * zone could still run under its own limit: a long old queue behind a
 * small old limit does not starve the new zone. */
static void test_successor_counts_only_what_the_old_zone_can_run(void **state)
{
    at_zone_t *old = zone_new(1, 4, 30000 * MS), *z = zone_new(3, 4, 30000 * MS);
    waiter_arg_t a[2] = {{.z = old, .result = AT_ERROR, .hold_until = &replaced_go},
                         {.z = old, .result = AT_ERROR, .hold_until = &replaced_go}};
    at_ticket_t o, t[3];
    pthread_t th[2];
    (void)state;

    replaced_go = 0;
    assert_int_equal(at_zone_acquire(old, &o, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < 2; i++) {
        pthread_create(&th[i], NULL, waiter_thread, &a[i]);
        wait_until_queued(old, (apr_uint32_t)i + 1);
    }
    at_zone_succeed(z, old);
    assert_int_equal(at_zone_acquire_now(z, &t[0]), AT_ADMITTED); /* the old zone runs 1 at most */
    assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_now(z, &t[2]), AT_REJECTED_FULL);
    __atomic_store_n(&replaced_go, 1, __ATOMIC_SEQ_CST);
    at_zone_release(old, &o);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
    at_zone_release(z, &t[0]);
    at_zone_release(z, &t[1]);
    zone_free(old);
    zone_free(z);
}

/* The parent marks the old zone without waiting for its lock: a holder
 * that passed the mark may still let one in, so while the lock is held the
 * successor counts one more, till the holder's unlock says exactly. */
static void test_successor_counts_one_more_while_the_old_lock_is_held(void **state)
{
    at_zone_t *old = zone_new(2, 4, 30000 * MS), *z = zone_new(2, 4, 30000 * MS);
    at_ticket_t o, t;
    (void)state;

    assert_int_equal(at_zone_acquire(old, &o, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_debug_take_lock(old), APR_SUCCESS);
    at_zone_succeed(z, old);
    assert_int_equal(at_zone_acquire_now(z, &t), AT_REJECTED_FULL); /* 1 + the one unseen */
    at_zone_debug_release_lock(old);
    assert_int_equal(at_zone_acquire_now(z, &t), AT_ADMITTED); /* 1 + 1 */
    at_zone_release(z, &t);
    at_zone_release(old, &o);
    zone_free(old);
    zone_free(z);
}

static void test_reconfigure_keeps_state(void **state)
{
    at_zone_conf_t c = {.limit = 1, .queue = 4, .timeout_us = 5000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    apr_size_t size = at_zone_size(4, 8, 0);
    at_zone_t *z = mmap(NULL, size, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    at_ticket_t hold;
    pthread_t th;
    waiter_arg_t a = {NULL, 0, AT_ERROR, 0, 0, NULL, NULL, NULL, NULL};
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_init(z, size, "grow", &c, 4, 8), APR_SUCCESS);
    a.z = z;
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    c.limit = 2; /* raising the limit admits the waiter at once */
    assert_int_equal(at_zone_reconfigure(z, &c), APR_SUCCESS);
    pthread_join(th, NULL);
    assert_int_equal(a.result, AT_QUEUED);
    c.limit = 5; /* beyond the headroom: refused, the caller lays out anew */
    assert_false(at_zone_can_hold(z, &c));
    assert_int_equal(at_zone_reconfigure(z, &c), APR_EINVAL);
    at_zone_stats(z, &s);
    assert_int_equal(s.limit, 2);
    assert_int_equal(s.active, 1);
    at_zone_release(z, &hold);
    munmap(z, size);
}

static void test_retry_after(void **state)
{
    at_zone_conf_t c = {.limit = 2, .queue = 4, .timeout_us = 1000 * MS, .retry_after = 7};
    at_zone_t *z = zone_new(2, 4, 1000 * MS);
    (void)state;

    assert_int_equal(at_zone_retry_after(z), 1); /* auto, nothing measured yet */
    at_zone_reconfigure(z, &c);
    assert_int_equal(at_zone_retry_after(z), 7);
    zone_free(z);
}

/* retry_after=auto: one request stuck for minutes moves the typical
 * service time by an eighth, not in proportion (an average of 20 ms
 * requests that met one of 10 minutes would advise 10 waiting clients to
 * stay away 13 minutes); and the advice never exceeds the ceiling. */
static void test_retry_after_resists_one_slow_request(void **state)
{
    apr_uint64_t typical = 0, before;
    int i;
    (void)state;

    for (i = 0; i < 50; i++) {
        typical = at_typical_service_after(typical, 20 * MS);
    }
    assert_int_equal(typical, 20 * MS);
    before = typical;
    typical = at_typical_service_after(typical, 600 * APR_INT64_C(1000000));
    assert_true(typical <= before + before / 8);
    assert_int_equal(at_retry_after_secs(10, typical, 1, 0), 1);
    /* Work that really slows down 100-fold is followed within 60 requests. */
    for (i = 0; i < 60; i++) {
        typical = at_typical_service_after(typical, 2000 * MS);
    }
    assert_true(typical > 1800 * MS && typical <= 2000 * MS);
    /* The ceiling: 30 s unless the zone says otherwise. */
    assert_int_equal(at_retry_after_secs(100, 2000 * MS, 1, 0), 30);
    assert_int_equal(at_retry_after_secs(100, 2000 * MS, 1, 120), 120);
    assert_int_equal(at_retry_after_secs(100, 2000 * MS, 1, 5), 5);
    assert_int_equal(at_retry_after_secs(3, 2000 * MS, 2, 0), 4);
    assert_int_equal(at_retry_after_secs(0, 0, 1, 0), 1);
}

/* retry_after=auto: the refused are told times spread around the advice R
 * (over [R/2, 3R/2]), so that they do not all come back at once, and each
 * thread draws its own. Here the floor is 4 s or more (8 waiters behind one
 * slot whose request took 400 ms or more: 9 x 0.4 s), and a window of
 * refusals with no room freed doubles the advice above it. */
enum { RETRY_DRAWS = 40 };

static void *draw_retry_afters(void *p)
{
    waiter_arg_t *a = p;

    for (int i = 0; i < RETRY_DRAWS; i++) {
        a->order[i] = (int)at_zone_retry_after(a->z);
    }
    return NULL;
}

static void test_retry_after_is_spread(void **state)
{
    enum { N = 8 };
    at_zone_t *z = zone_new(1, N, 5000 * MS);
    pthread_t th[N], one, other;
    waiter_arg_t a[N], mine = {0}, theirs = {0};
    int here[RETRY_DRAWS], there[RETRY_DRAWS], seen[32] = {0}, distinct = 0;
    at_ticket_t hold, refused;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    usleep(400 * 1000); /* sleeps run long, never short */
    at_zone_release(z, &hold);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    for (int i = 0; i < N; i++) {
        a[i] = (waiter_arg_t){z, i, AT_ERROR, 0, 0, NULL, NULL, NULL, NULL};
        pthread_create(&th[i], NULL, waiter_thread, &a[i]);
    }
    wait_until_queued(z, N);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(at_zone_acquire(z, &refused, NULL, NULL), AT_REJECTED_FULL);
    }
    usleep(AT_RETRY_WINDOW_MIN_US + 100 * 1000);
    /* closes the window: the advice doubles */
    assert_int_equal(at_zone_acquire(z, &refused, NULL, NULL), AT_REJECTED_FULL);
    mine = (waiter_arg_t){.z = z, .order = here};
    theirs = (waiter_arg_t){.z = z, .order = there};
    pthread_create(&one, NULL, draw_retry_afters, &mine); /* two new threads */
    pthread_create(&other, NULL, draw_retry_afters, &theirs);
    pthread_join(one, NULL);
    pthread_join(other, NULL);
    for (int i = 0; i < RETRY_DRAWS; i++) {
        assert_in_range(here[i], 4, 30);
        assert_in_range(there[i], 4, 30);
        distinct += !seen[here[i]]++;
    }
    assert_true(distinct >= 4);
    assert_memory_not_equal(here, there, sizeof(here));
    at_zone_release(z, &hold);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].result, AT_QUEUED);
    }
    zone_free(z);
}

/* An ErrorDocument whose target is in the zone: a free slot at once or
 * nothing; it never waits, counts in no total and adds no service time. */
static void test_error_page_takes_only_a_free_slot(void **state)
{
    at_zone_t *z = zone_new(1, 4, 30000 * MS);
    at_ticket_t hold, page;
    at_zone_stats_t before, after;
    apr_int64_t t0;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    before = stats_of(z);
    t0 = at_now_us();
    assert_int_equal(at_zone_acquire_now(z, &page), AT_REJECTED_FULL);
    assert_true(at_now_us() - t0 < 15000 * MS); /* it did not wait out the timeout */
    after = stats_of(z);
    assert_int_equal(after.active, 1);
    assert_int_equal(after.queued, 0);
    assert_int_equal(after.counters.rejected_full, before.counters.rejected_full);
    at_zone_release(z, &hold);
    before = stats_of(z);
    assert_int_equal(at_zone_acquire_now(z, &page), AT_ADMITTED);
    assert_int_equal(active_now(z), 1);
    assert_int_equal(at_zone_acquire_now(z, &hold), AT_REJECTED_FULL);
    usleep(20 * MS);
    at_zone_release(z, &page);
    after = stats_of(z);
    assert_int_equal(after.active, 0);
    assert_int_equal(after.counters.admitted, before.counters.admitted);
    assert_int_equal(after.service_all.n, before.service_all.n);
    zone_free(z);
}

/* The parent never waits for the lock: with the lock held by a stopped
 * process, a new definition is published at once and applied by the next
 * process to take the lock. */
static void test_reconfigure_does_not_wait_for_the_lock(void **state)
{
    at_zone_conf_t c = {.limit = 1, .queue = 4, .timeout_us = 1000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    at_ticket_t t[3];
    apr_uint32_t waits;
    cont_arg_t guard = {0, SIGKILL, 0, 0};
    pthread_t th;
    int fd[2];
    char ch;
    pid_t holder;
    (void)state;

    assert_int_equal(pipe(fd), 0);
    holder = fork();
    if (holder == 0) {
        at_zone_debug_take_lock(z);
        if (write(fd[1], "y", 1) != 1) {
            _exit(2);
        }
        for (;;) {
            pause();
        }
    }
    assert_int_equal(read(fd[0], &ch, 1), 1);
    kill(holder, SIGSTOP);
    c.limit = 3;
    /* Counted, not timed: a wait for the lock of any length is one. */
    guard.holder = holder;
    pthread_create(&th, NULL, cont_later, &guard);
    waits = __atomic_load_n(&at_test_lock_count, __ATOMIC_SEQ_CST);
    assert_int_equal(at_zone_reconfigure(z, &c), APR_EBUSY);
    assert_int_equal(__atomic_load_n(&at_test_lock_count, __ATOMIC_SEQ_CST), waits);
    __atomic_store_n(&guard.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    assert_false(guard.fired);
    /* The holder dies; the next to take the lock applies the definition. */
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(at_zone_acquire(z, &t[i], NULL, NULL), AT_ADMITTED);
    }
    assert_int_equal(stats_of(z).limit, 3);
    assert_int_equal(stats_of(z).counters.lock_repairs, 1);
    for (int i = 0; i < 3; i++) {
        at_zone_release(z, &t[i]);
    }
    /* With the lock free, it applies at once. */
    c.limit = 2;
    assert_int_equal(at_zone_reconfigure(z, &c), APR_SUCCESS);
    assert_int_equal(stats_of(z).limit, 2);
    close(fd[0]);
    close(fd[1]);
    zone_free(z);
}

/* A process that dies at any store of a hand-off (the releaser giving its
 * slot to the oldest waiter) leaves the zone whole: the waiter gets the
 * slot, the zone is never over its cap, and every count is exact after. */
static int die_where, die_step;

static void die_here(int where, int step)
{
    if (where == die_where && step == die_step) {
        _exit(0);
    }
}

static void handoff_interrupted_at(int where, int step)
{
    at_zone_t *z = zone_new(1, 4, 10000 * MS);
    int go[2], res[2], status;
    char ch;
    pid_t releaser, waiter;
    at_ticket_t t[2];
    apr_uint32_t peak = 0;
    apr_int64_t t0;

    assert_non_null(z);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(res), 0);
    releaser = fork();
    if (releaser == 0) {
        at_ticket_t mine;
        if (at_zone_acquire(z, &mine, NULL, NULL) != AT_ADMITTED
            || write(res[1], "r", 1) != 1 || read(go[0], &ch, 1) != 1) {
            _exit(2);
        }
        die_where = where;
        die_step = step;
        at_test_step_hook = die_here;
        at_zone_release(z, &mine);
        _exit(1); /* the step was never reached */
    }
    assert_int_equal(read(res[0], &ch, 1), 1);
    waiter = fork();
    if (waiter == 0) {
        at_ticket_t mine;
        char r = at_zone_acquire(z, &mine, NULL, NULL) == AT_QUEUED ? 'q' : 'x';
        if (write(res[1], &r, 1) != 1) {
            _exit(2);
        }
        usleep(20 * MS);
        at_zone_release(z, &mine);
        _exit(0);
    }
    wait_until_queued(z, 1);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(waitpid(releaser, &status, 0), releaser);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0) {
        fail_msg("step %d.%d was never reached", where, step);
    }
    /* The waiter is admitted; meanwhile the cap holds. */
    t0 = at_now_us();
    for (;;) {
        at_zone_stats_t s = stats_of(z);
        struct timeval tv = {0, 1000};
        fd_set rd;

        if (s.active > peak) {
            peak = s.active;
        }
        FD_ZERO(&rd);
        FD_SET(res[0], &rd);
        if (select(res[0] + 1, &rd, NULL, NULL, &tv) > 0) {
            break;
        }
        if (at_now_us() - t0 > 30000 * MS) { /* past the waiter's timeout: a hang guard */
            fail_msg("step %d.%d: the waiter never got the slot", where, step);
        }
    }
    assert_int_equal(read(res[0], &ch, 1), 1);
    if (ch != 'q') {
        fail_msg("step %d.%d: the waiter was not admitted", where, step);
    }
    waitpid(waiter, NULL, 0);
    assert_true(peak <= 1);
    assert_int_equal(stats_of(z).active, 0);
    assert_int_equal(stats_of(z).queued, 0);
    assert_int_equal(at_zone_acquire(z, &t[0], NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_REJECTED_FULL); /* the cap, exactly */
    assert_int_equal(stats_of(z).active, 1);
    at_zone_release(z, &t[0]);
    close(go[0]);
    close(go[1]);
    close(res[0]);
    close(res[1]);
    zone_free(z);
}

static void test_death_at_every_step_of_a_handoff(void **state)
{
    (void)state;
    for (int step = 1; step <= 5; step++) {
        handoff_interrupted_at(AT_STEP_DISPATCH, step);
    }
    for (int step = 1; step <= 3; step++) {
        handoff_interrupted_at(AT_STEP_SLOT_FILL, step);
    }
}

static void test_dry_run_never_refuses(void **state)
{
    at_zone_conf_t c = {.limit = 1, .queue = 2, .timeout_us = 30000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .dry_run = 1};
    at_zone_t *z = zone_new(1, 2, 30000 * MS);
    at_ticket_t t[5];
    at_zone_stats_t s;
    (void)state;

    at_zone_reconfigure(z, &c);
    assert_int_equal(at_zone_acquire(z, &t[0], NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t[1], NULL, NULL), AT_DRY_RUN_QUEUED);
    assert_int_equal(at_zone_acquire(z, &t[2], NULL, NULL), AT_DRY_RUN_QUEUED);
    assert_int_equal(at_zone_acquire(z, &t[3], NULL, NULL), AT_DRY_RUN_REJECTED);
    /* nobody waits in a dry run: not to the timeout */
    assert_true(t[3].wait_us < 15000 * MS);
    at_zone_stats(z, &s);
    assert_int_equal(s.active, 1);
    assert_int_equal(s.over_cap, 3);
    assert_int_equal(s.queued, 0);
    for (int i = 0; i < 4; i++) {
        at_zone_release(z, &t[i]);
    }
    at_zone_stats(z, &s);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.over_cap, 0);
    assert_int_equal(s.counters.dry_run_queued, 2);
    assert_int_equal(s.counters.dry_run_rejected, 1);
    assert_int_equal(s.counters.rejected_full, 0);
    zone_free(z);
}

/* A process that dies running over the cap in a dry run gives its count
 * back like any other: by reclaim, and by lock repair's recount. Before,
 * the count stayed raised and later requests read "would reject". */
static void test_dry_run_over_cap_reclaimed(void **state)
{
    at_zone_conf_t c = {.limit = 1, .queue = 1, .timeout_us = 100 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .dry_run = 1};
    at_zone_t *z = zone_new(1, 1, 100 * MS);
    at_ticket_t hold, t;
    pid_t over, locker;
    int fd[2];
    char byte;
    (void)state;

    at_zone_reconfigure(z, &c);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(pipe(fd), 0);
    if ((over = fork()) == 0) { /* runs over the cap, then waits to be killed */
        at_ticket_t mine;
        byte = at_zone_acquire(z, &mine, NULL, NULL) == AT_DRY_RUN_QUEUED ? 'y' : 'n';
        if (write(fd[1], &byte, 1) != 1) {
            _exit(2);
        }
        pause();
        _exit(0);
    }
    assert_int_equal(read(fd[0], &byte, 1), 1);
    assert_int_equal(byte, 'y');
    assert_int_equal(stats_of(z).over_cap, 1);

    /* A process dies holding the lock: repair recounts from the records. */
    if ((locker = fork()) == 0) {
        at_zone_debug_take_lock(z);
        _exit(0);
    }
    waitpid(locker, NULL, 0);
    assert_int_equal(stats_of(z).over_cap, 1);
    assert_int_equal(stats_of(z).counters.lock_repairs, 1);

    kill(over, SIGKILL);
    waitpid(over, NULL, 0);
    assert_int_equal(at_zone_reclaim(z), 1);
    assert_int_equal(stats_of(z).over_cap, 0);
    /* The queue's room is free again: a dry run says "would queue". */
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_DRY_RUN_QUEUED);
    at_zone_release(z, &t);
    at_zone_release(z, &hold);
    assert_int_equal(stats_of(z).over_cap, 0);
    assert_int_equal(stats_of(z).active, 0);
    close(fd[0]);
    close(fd[1]);
    zone_free(z);
}

static void test_latency_histograms(void **state)
{
    at_zone_t *z = zone_new(1, 4, 5000 * MS);
    at_ticket_t hold;
    pthread_t th;
    waiter_arg_t a = {z, 0, AT_ERROR, 0, 0, NULL, NULL, NULL, NULL};
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, waiter_thread, &a);
    wait_until_queued(z, 1);
    usleep(30 * MS);
    at_zone_release(z, &hold);
    pthread_join(th, NULL);
    at_zone_stats(z, &s);
    assert_int_equal(s.wait_all.n, 2);      /* one at once, one after waiting */
    assert_int_equal(s.service_all.n, 2);
    assert_int_equal(s.wait_recent.n, 2);
    assert_true(at_hist_quantile(&s.wait_all, 1.0) >= 25 * MS);
    assert_true(at_hist_quantile(&s.service_all, 1.0) >= 25 * MS);
    zone_free(z);
}

static at_zone_t *zone_auto(apr_uint32_t min, apr_uint32_t max, apr_uint32_t start,
                             apr_int64_t timeout_us)
{
    at_zone_conf_t c = {.limit = start, .queue = 64, .timeout_us = timeout_us,
                        .retry_after = AT_RETRY_AFTER_AUTO, .limit_auto = 1,
                        .limit_min = min, .limit_max = max};

    return zone_new_conf(&c);
}

typedef struct {
    at_zone_t *z;
    apr_int64_t until_us;
    int hold_us;
    apr_uint32_t running, most;  /* counted by the requests themselves */
    apr_int64_t most_since_us;   /* most running from here on */
    apr_uint32_t most_late;
    apr_uint32_t cores;          /* above this many running, each request takes
                                  * longer in proportion, as if computing (0: never) */
} hammer_t;

static void note_running(hammer_t *h, apr_uint32_t n)
{
    apr_uint32_t m;

    while ((m = __atomic_load_n(&h->most, __ATOMIC_SEQ_CST)) < n
           && !__atomic_compare_exchange_n(&h->most, &m, n, 0, __ATOMIC_SEQ_CST,
                                           __ATOMIC_SEQ_CST)) {
    }
    if (at_now_us() >= __atomic_load_n(&h->most_since_us, __ATOMIC_SEQ_CST)) {
        while ((m = __atomic_load_n(&h->most_late, __ATOMIC_SEQ_CST)) < n
               && !__atomic_compare_exchange_n(&h->most_late, &m, n, 0,
                                               __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        }
    }
}

static int hold_for(const hammer_t *h, apr_uint32_t running)
{
    return h->cores && running > h->cores ? (int)(h->hold_us * running / h->cores)
                                          : h->hold_us;
}

/* Requests that wait on something else (a sleep) for hold_us each, longer
 * when more than `cores` run. */
static void *hammer(void *arg)
{
    hammer_t *h = arg;

    while (at_now_us() < __atomic_load_n(&h->until_us, __ATOMIC_SEQ_CST)) {
        at_ticket_t t;
        at_result_t r = at_zone_acquire(h->z, &t, NULL, NULL);
        if (r == AT_ADMITTED || r == AT_QUEUED) {
            apr_uint32_t n = __atomic_add_fetch(&h->running, 1, __ATOMIC_SEQ_CST);

            note_running(h, n);
            usleep(hold_for(h, n));
            __atomic_sub_fetch(&h->running, 1, __ATOMIC_SEQ_CST);
            at_zone_release(h->z, &t);
        }
        else {
            usleep(1000);
        }
    }
    return NULL;
}

/* `threads` of hammer() on one zone until h->until_us, or until done(h)
 * says what the test waits for has happened: a slow machine takes longer to
 * get there, and h->until_us is only a hang guard. */
static void hammer_until(hammer_t *h, int threads, int (*done)(hammer_t *h))
{
    enum { MOST = 32 };
    pthread_t th[MOST];

    assert_true(threads <= MOST);
    for (int i = 0; i < threads; i++) {
        pthread_create(&th[i], NULL, hammer, h);
    }
    while (at_now_us() < h->until_us && !done(h)) {
        usleep(10 * MS);
    }
    __atomic_store_n(&h->until_us, 0, __ATOMIC_SEQ_CST);
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
    }
}

/* The held level has reached 8; from then on, the requests see 8 running. */
static int climbed_to_8(hammer_t *h)
{
    if (__atomic_load_n(&h->most_since_us, __ATOMIC_SEQ_CST) == APR_INT64_MAX) {
        if (stats_of(h->z).limit_held >= 8) {
            __atomic_store_n(&h->most_since_us, at_now_us(), __ATOMIC_SEQ_CST);
        }
        return 0;
    }
    return __atomic_load_n(&h->most_late, __ATOMIC_SEQ_CST) >= 8;
}

/* limit=auto in a real zone: requests that only wait gain from running
 * together, so the held limit climbs from its start to 8 or more, and the
 * requests themselves then see 8 or more running at once, never more than
 * max. Run until both are seen, not for a fixed time: a slow machine (CI
 * under ASan: a 10 ms sleep took 11 - 14 ms) climbs later, not lower. The
 * level checked is the held one: the limit itself may be a probe's. */
static void test_auto_limit_climbs_for_waiting_work(void **state)
{
    enum { THREADS = 16 };
    at_zone_t *z = zone_auto(1, 12, 3, 10000 * MS);
    apr_int64_t now = at_now_us();
    hammer_t h = {z, now + 60000 * MS, 10 * MS, 0, 0, APR_INT64_MAX, 0, 0};
    at_zone_stats_t s;
    (void)state;

    at_zone_stats(z, &s);
    assert_int_equal(s.limit, 3);
    assert_int_equal(s.limit_auto, 1);
    hammer_until(&h, THREADS, climbed_to_8);
    at_zone_stats(z, &s);
    print_message("limit=auto: 3 -> held 8 after %.2f s (-1: never), then %u (held %u) "
                  "after %.2f s, %lu changes, service %.1f ms; the requests saw at most "
                  "%u running, %u since\n",
                  h.most_since_us == APR_INT64_MAX ? -1 : (h.most_since_us - now) / 1e6,
                  s.limit, s.limit_held, (at_now_us() - now) / 1e6,
                  (unsigned long)s.limit_changes, s.recent_us / 1000, h.most,
                  h.most_late);
    assert_true(h.most_since_us != APR_INT64_MAX); /* the held level reached 8 */
    assert_true(h.most <= 12);
    assert_true(h.most_late >= 8);
    assert_true(s.limit_held <= 12);
    assert_true(s.limit_changes >= 2);
    assert_int_equal(s.active, 0);
    zone_free(z);
}

/* The trace1 lines of the windows limit=auto judged: their length and
 * mean service time. */
enum { MAX_WINDOWS = 64 };
static double window_secs[MAX_WINDOWS], window_service_ms[MAX_WINDOWS];
static int windows_seen; /* written under the zone's lock, read atomically */

static void capture_windows(int level, const char *msg)
{
    const char *p = strstr(msg, "window of ");
    const char *svc = strstr(msg, "service ");

    if (level == AT_LOG_TRACE1 && p && svc && windows_seen < MAX_WINDOWS) {
        window_secs[windows_seen] = atof(p + strlen("window of "));
        window_service_ms[windows_seen] = atof(svc + strlen("service "));
        __atomic_store_n(&windows_seen, windows_seen + 1, __ATOMIC_SEQ_CST);
    }
}

/* hammer_until(), keeping the windows the zone judged meanwhile. */
static void hammer_judging_windows(hammer_t *h, int threads, int (*done)(hammer_t *h))
{
    windows_seen = 0;
    at_set_logger(capture_windows);
    hammer_until(h, threads, done);
    at_set_logger(NULL);
    print_message("windows judged: %d\n", windows_seen);
}

static int four_windows(hammer_t *h)
{
    (void)h;
    return __atomic_load_n(&windows_seen, __ATOMIC_SEQ_CST) >= 4;
}

/* A window's length in its own mean service times: the machine's slowness
 * is in both. */
static double window_services(int i)
{
    return window_secs[i] / (window_service_ms[i] / 1000);
}

/* Twelve requests of 300 ms side by side, held at 12: six completions of
 * the same length would be enough to judge, and the first wave brings
 * twelve, but each window lasts at least two service times, so that it
 * does not catch one wave of them (held against the 300 ms the requests
 * sleep: sleeps run long, never short); and, but for one, under three and
 * a half of its own service times while no climb has found a top (min =
 * max: there is none to find), where one at the top lasts four. A window
 * closes at the first end after its length, a wave later at most. */
static void test_auto_windows_span_two_services(void **state)
{
    enum { THREADS = 16 };
    at_zone_t *z = zone_auto(12, 12, 12, 10000 * MS);
    apr_int64_t now = at_now_us();
    hammer_t h = {z, now + 60000 * MS, 300 * MS, 0, 0, now, 0, 0};
    int short_ones = 0;
    (void)state;

    hammer_judging_windows(&h, THREADS, four_windows);
    assert_true(windows_seen >= 4);
    for (int i = 0; i < windows_seen; i++) {
        print_message("  %.2f s, service %.1f ms: %.1f service times\n", window_secs[i],
                      window_service_ms[i], window_services(i));
        assert_true(window_secs[i] >= 1.5 * h.hold_us / 1e6);
        short_ones += window_services(i) < 3.5;
    }
    /* Under valgrind threads take turns, and a window ends late whenever the
     * thread that ends it waits for its turn: the plain and ASan runs judge
     * how long windows are; valgrind runs the code for what it checks. */
    assert_true(short_ones >= windows_seen - 1 || getenv("AT_UNDER_VALGRIND"));
    zone_free(z);
}

/* The last LAST windows each span three and a half of their own service
 * times or more: longer than any before a top is found. */
enum { LAST = 2 };
static int last_windows_long(hammer_t *h)
{
    int n = __atomic_load_n(&windows_seen, __ATOMIC_SEQ_CST);
    (void)h;

    if (n < LAST + 2) {
        return 0;
    }
    for (int i = n - LAST; i < n; i++) {
        if (window_services(i) < 3.5) {
            return 0;
        }
    }
    return 1;
}

/* Requests of 150 ms that share 4 cores, so that beyond 4 running each one
 * takes longer in proportion: the step up from 4 gains nothing, the climb
 * has found its top, and from then on each window lasts four service
 * times instead of two (at_limit_window_services): on a flat top a probe's
 * effect is a few per cent, and twice as long a window halves the
 * variance it is judged with. Run until two long windows follow each
 * other: a slow machine finds the top later, not never. */
static void test_auto_windows_lengthen_at_the_top(void **state)
{
    enum { THREADS = 12 };
    at_zone_t *z = zone_auto(1, 8, 4, 10000 * MS);
    apr_int64_t now = at_now_us();
    hammer_t h = {z, now + 60000 * MS, 150 * MS, 0, 0, now, 0, 4};
    (void)state;

    hammer_judging_windows(&h, THREADS, last_windows_long);
    for (int i = 0; i < windows_seen; i++) {
        print_message("  %.2f s, service %.1f ms: %.1f service times\n", window_secs[i],
                      window_service_ms[i], window_services(i));
    }
    print_message("found the top after %.2f s\n", (at_now_us() - now) / 1e6);
    assert_true(last_windows_long(&h));
    zone_free(z);
}

/* limit=auto: a newcomer whose estimated wait (place in the queue x recent
 * service time / limit) passes the timeout is refused at once: the reason
 * says so, where a newcomer that waited would say AT_REJECTED_TIMEOUT. */
static void test_predicted_wait_refused_at_once(void **state)
{
    at_zone_t *z = zone_auto(1, 1, 1, 100 * MS);
    at_ticket_t hold, t;
    at_zone_stats_t s;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    usleep(250 * MS); /* one request took 250 ms */
    at_zone_release(z, &hold);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_PREDICTED);
    at_zone_stats(z, &s);
    assert_int_equal(s.counters.rejected_predicted, 1);
    assert_int_equal(s.queued, 0);
    assert_true(at_zone_retry_after(z) >= 1);
    at_zone_release(z, &hold);
    zone_free(z);
}

/* Sends SIGCONT to a stopped lock holder when told, or after 3 s as a hang
 * guard; notes whether it did so before it was told. */
typedef struct {
    pid_t holder;
    int go, early;
} guard_arg_t;

static void *cont_when_told(void *arg)
{
    guard_arg_t *g = arg;
    int i;

    for (i = 0; i < 3000 && !__atomic_load_n(&g->go, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
    __atomic_store_n(&g->early, i == 3000, __ATOMIC_SEQ_CST);
    kill(g->holder, SIGCONT);
    return NULL;
}

/* The figures read under the lock, tried for up to 10 s (25 glances). */
static at_zone_stats_t fresh_stats_of(at_zone_t *z)
{
    at_zone_stats_t s = stats_of(z);

    for (int i = 0; i < 25 && s.stale; i++) {
        s = stats_of(z);
    }
    return s;
}

/* A dry run's request over the cap is done while a stopped process holds
 * the lock: one without a record takes no lock at all, one with a record
 * returns without the lock (while the holder is still stopped) and the
 * next holder frees its record. */
static void test_dry_run_release_while_lock_held(void **state)
{
    at_zone_conf_t c = {.limit = 1, .queue = 1, .timeout_us = 300 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .dry_run = 1};
    at_zone_t *z = zone_new_conf(&c);
    at_ticket_t t[64];
    int n, rec = -1, norec = -1;
    apr_uint32_t over, locks;
    at_zone_stats_t after;
    guard_arg_t g = {0, 0, 0};
    pthread_t th;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &t[0], NULL, NULL), AT_ADMITTED);
    for (n = 1; n < 64 && norec < 0; n++) {
        at_result_t r = at_zone_acquire(z, &t[n], NULL, NULL);

        assert_true(r == AT_DRY_RUN_QUEUED || r == AT_DRY_RUN_REJECTED);
        rec = rec < 0 && t[n].over_cap > 0 ? n : rec;
        norec = t[n].over_cap < 0 ? n : norec;
    }
    assert_true(rec > 0 && norec > 0);
    over = stats_of(z).over_cap;

    g.holder = fork_stopped_lock_holder(z);
    pthread_create(&th, NULL, cont_when_told, &g);
    locks = __atomic_load_n(&at_test_lock_count, __ATOMIC_SEQ_CST);
    at_zone_release(z, &t[norec]);
    locks = __atomic_load_n(&at_test_lock_count, __ATOMIC_SEQ_CST) - locks;
    at_zone_release(z, &t[rec]);
    __atomic_store_n(&g.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    /* the holder let go: the next holder frees the record */
    after = fresh_stats_of(z);
    kill(g.holder, SIGKILL);
    waitpid(g.holder, NULL, 0);
    assert_int_equal(locks, 0);
    assert_false(g.early); /* both returned while the holder was stopped */
    assert_int_equal(after.stale, 0);
    assert_int_equal(after.over_cap, over - 1);

    for (int i = 0; i < n; i++) {
        at_zone_release(z, &t[i]);
    }
    assert_int_equal(stats_of(z).over_cap, 0);
    assert_int_equal(stats_of(z).active, 0);
    zone_free(z);
}

/* The releaser's step hook for a hand-off to a waiter that left: at its
 * first step it waits (holding the lock) until told that the waiter gave
 * up without the lock, then dies at the step under test. */
static int left_fd = -1;

static void wait_for_leaver_then_die(int where, int step)
{
    static int told;
    char ch;

    if (!told) {
        told = 1;
        if (read(left_fd, &ch, 1) != 1) {
            _exit(2);
        }
    }
    die_here(where, step);
}

/* A hand-off whose waiter gave up without the lock (its deadline passed
 * while the releaser held it) and whose releaser then died at a step of
 * it: the slot goes back, though the waiter's process lives on. */
static void handoff_to_leaver_interrupted_at(int where, int step)
{
    at_zone_t *z = zone_new(1, 4, 2000 * MS);
    int go[2], res[2], left[2], status, reached, admitted, full;
    char ch, got;
    pid_t releaser, waiter;
    at_ticket_t t[2];
    at_zone_stats_t s;

    assert_non_null(z);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(res), 0);
    assert_int_equal(pipe(left), 0);
    releaser = fork();
    if (releaser == 0) {
        at_ticket_t mine;
        if (at_zone_acquire(z, &mine, NULL, NULL) != AT_ADMITTED
            || write(res[1], "r", 1) != 1 || read(go[0], &ch, 1) != 1) {
            _exit(2);
        }
        die_where = where;
        die_step = step;
        left_fd = left[0];
        at_test_step_hook = wait_for_leaver_then_die;
        at_zone_release(z, &mine);
        _exit(1); /* the step was never reached */
    }
    assert_int_equal(read(res[0], &ch, 1), 1);
    waiter = fork();
    if (waiter == 0) {
        at_ticket_t mine;
        char r = at_zone_acquire(z, &mine, NULL, NULL) == AT_REJECTED_LOCKED ? 'l' : 'x';
        if (write(res[1], &r, 1) != 1) {
            _exit(2);
        }
        pause(); /* alive: nothing of its can be reclaimed */
        _exit(0);
    }
    wait_until_queued(z, 1);
    assert_int_equal(write(go[1], "g", 1), 1);
    assert_int_equal(read(res[0], &got, 1), 1);
    assert_int_equal(write(left[1], "l", 1), 1);
    assert_int_equal(waitpid(releaser, &status, 0), releaser);
    reached = WIFEXITED(status) && WEXITSTATUS(status) == 0;

    s = stats_of(z);
    admitted = at_zone_acquire_now(z, &t[0]) == AT_ADMITTED;
    full = at_zone_acquire_now(z, &t[1]) == AT_REJECTED_FULL; /* the cap, exactly */
    at_zone_release(z, &t[0]);
    kill(waiter, SIGKILL);
    waitpid(waiter, NULL, 0);
    for (int i = 0; i < 2; i++) {
        close(go[i]);
        close(res[i]);
        close(left[i]);
    }
    zone_free(z);

    if (!reached) {
        fail_msg("step %d.%d was never reached", where, step);
    }
    if (got != 'l') {
        fail_msg("step %d.%d: the waiter did not leave without the lock", where, step);
    }
    if (s.active != 0 || s.queued != 0 || !admitted || !full) {
        fail_msg("step %d.%d: the slot leaked (active %u, queued %u, next admitted %d)",
                 where, step, s.active, s.queued, admitted);
    }
    assert_int_equal(s.counters.lock_repairs, 1);
}

static void test_death_in_a_handoff_to_a_waiter_that_left(void **state)
{
    (void)state;
    for (int step = 1; step <= 6; step++) {
        if (step != 5) { /* the grant: not made to a waiter that left */
            handoff_to_leaver_interrupted_at(AT_STEP_DISPATCH, step);
        }
    }
    for (int step = 1; step <= 3; step++) {
        handoff_to_leaver_interrupted_at(AT_STEP_SLOT_FILL, step);
    }
}

/* A logger that stalls (a piped logger that stopped reading) on its first
 * line of a level at least as verbose as stall_level, until a check made
 * meanwhile from another thread is done (or 5 s, a hang guard): the
 * check reads the zone's status, which is stale if the stalled line was
 * written with the zone's lock held. */
typedef struct {
    at_zone_t *z;
    int stall_level;
    int entered, checked, stale;
} stall_t;

static stall_t stall;

static void stalling_logger(int level, const char *msg)
{
    (void)msg;
    if (level < stall.stall_level
        || __atomic_exchange_n(&stall.entered, 1, __ATOMIC_SEQ_CST)) {
        return;
    }
    for (int i = 0; i < 5000 && !__atomic_load_n(&stall.checked, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
}

static void *check_while_stalled(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stall.entered, __ATOMIC_SEQ_CST)) {
        usleep(1000);
    }
    __atomic_store_n(&stall.stale, stats_of(stall.z).stale, __ATOMIC_SEQ_CST);
    __atomic_store_n(&stall.checked, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void stall_start(at_zone_t *z, int level, pthread_t *th)
{
    stall = (stall_t){.z = z, .stall_level = level};
    at_set_logger(stalling_logger);
    pthread_create(th, NULL, check_while_stalled, NULL);
}

/* Lets the checker go if nothing was logged, and says whether the zone's
 * lock was free while the logger stalled. */
static int stall_end_lock_was_free(pthread_t th)
{
    int logged = __atomic_load_n(&stall.entered, __ATOMIC_SEQ_CST);

    __atomic_store_n(&stall.entered, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    at_set_logger(NULL);
    assert_true(logged);
    return !stall.stale;
}

/* limit=auto logs each window it judges (trace1) and each change of its
 * limit (debug): a stalled logger must not stall the zone. */
static void test_windows_are_logged_without_the_lock(void **state)
{
    at_zone_t *z = zone_auto(1, 4, 2, 10000 * MS);
    pthread_t th;
    (void)state;

    stall_start(z, AT_LOG_TRACE1, &th);
    for (int i = 0; i < 2000 && !__atomic_load_n(&stall.entered, __ATOMIC_SEQ_CST); i++) {
        at_ticket_t t;

        assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
        usleep(2 * MS);
        at_zone_release(z, &t);
    }
    assert_true(stall_end_lock_was_free(th));
    zone_free(z);
}

/* The warning that a process died holding the lock, and what repair
 * rebuilt, is written once the lock is let go. */
static void test_repair_is_logged_without_the_lock(void **state)
{
    at_zone_t *z = zone_new(2, 2, 1000 * MS);
    at_ticket_t t;
    pthread_t th;
    pid_t pid;
    (void)state;

    if ((pid = fork()) == 0) {
        at_zone_debug_take_lock(z);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    stall_start(z, LOG_WARNING, &th);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ADMITTED);
    assert_true(stall_end_lock_was_free(th));
    at_zone_release(z, &t);
    assert_int_equal(stats_of(z).counters.lock_repairs, 1);
    zone_free(z);
}

/* A zone of one slot whose waiting requests may hold total body bytes. */
static at_zone_t *zone_bodies(apr_uint64_t read_body, apr_uint64_t total)
{
    at_zone_conf_t c = {.limit = 1, .queue = 4, .timeout_us = 1000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .read_body = read_body,
                        .read_body_total = total};

    return zone_new_conf(&c);
}

/* read_body_total: bodies count against the zone's bound until let go;
 * one that would pass it is not held (its handler reads it), and a
 * process that dies holding some gives them back at reclaim. */
static void test_bodies_bounded(void **state)
{
    at_zone_t *z = zone_bodies(600, 1000);
    apr_int32_t a, b, d;
    pid_t pid;
    (void)state;

    assert_true((a = at_zone_body_hold(z, 600)) > 0);
    assert_int_equal(at_zone_body_hold(z, 600), 0);
    assert_true((b = at_zone_body_hold(z, 400)) > 0);
    assert_int_equal(at_zone_body_hold(z, 1), 0);
    assert_int_equal(stats_of(z).body_held, 1000);
    assert_int_equal(stats_of(z).body_cap, 1000);
    at_zone_body_let_go(z, a);
    assert_int_equal(at_zone_body_held(z), 400);

    /* a child holds 500 and dies: reclaim gives them back */
    if ((pid = fork()) == 0) {
        _exit(at_zone_body_hold(z, 500) > 0 ? 0 : 1);
    }
    {
        int status;

        waitpid(pid, &status, 0);
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(at_zone_body_held(z), 900);
    assert_int_equal(at_zone_body_hold(z, 200), 0);
    at_zone_reclaim(z);
    assert_int_equal(at_zone_body_held(z), 400);
    assert_true((d = at_zone_body_hold(z, 600)) > 0);
    at_zone_body_let_go(z, d);
    at_zone_body_let_go(z, b);
    assert_int_equal(stats_of(z).body_held, 0);
    zone_free(z);
}

/* Let go while another process holds the lock: the next holder frees it;
 * and a repair counts the total again from the records. */
static void test_bodies_let_go_without_the_lock(void **state)
{
    at_zone_t *z = zone_bodies(100, 1000);
    apr_int32_t a = at_zone_body_hold(z, 100), n = 0;
    int fds[2], back[2];
    pid_t pid;
    char ch;
    (void)state;

    assert_true(a > 0);
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(pipe(back), 0);
    if ((pid = fork()) == 0) {
        at_zone_debug_take_lock(z);
        assert_int_equal(write(fds[1], "x", 1), 1);
        assert_int_equal(read(back[0], &ch, 1), 1); /* held until told, however slow */
        at_zone_debug_release_lock(z);
        _exit(0);
    }
    assert_int_equal(read(fds[0], &ch, 1), 1);
    at_zone_body_let_go(z, a); /* cannot have the lock in time */
    assert_int_equal(at_zone_body_held(z), 100);
    assert_int_equal(write(back[1], "x", 1), 1);
    waitpid(pid, NULL, 0);
    assert_int_equal(stats_of(z).body_held, 0); /* taking the lock tidied it */

    /* every record taken, then a process dies holding the lock */
    while (at_zone_body_hold(z, 1) > 0) {
        n++;
    }
    assert_int_equal(n, 1000);
    assert_int_equal(at_zone_body_held(z), 1000);
    if ((pid = fork()) == 0) {
        at_zone_debug_take_lock(z);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    assert_int_equal(stats_of(z).body_held, 1000); /* counted again, unchanged */
    assert_int_equal(stats_of(z).counters.lock_repairs, 1);
    close(fds[0]);
    close(fds[1]);
    close(back[0]);
    close(back[1]);
    zone_free(z);
}

/* A status read holds the lock for a copy: the per-key table, the slots
 * and the 16,384 rate= buckets are walked after it is let go. */
static void test_scrape_walks_outside_the_lock(void **state)
{
    at_zone_conf_t c = {.limit = 8, .queue = 8, .timeout_us = 1000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .per_key = 4, .keyed = 1,
                        .rate = {.interval_ns = APR_INT64_C(1000000000), .burst = 2,
                                 .delay = AT_RATE_NODELAY}};
    at_zone_t *z = zone_new_conf(&c);
    at_ticket_t held[3];
    at_zone_stats_t s;
    char text[32];
    (void)state;

    /* a bucket for each of many keys */
    for (int i = 0; i < 4000; i++) {
        at_client_key_t k;
        at_ticket_t t;
        at_request_t rq = {.client = &k, .may_wait = 1};

        snprintf(text, sizeof(text), "key-%d", i);
        at_zone_key_from_text(z, text, strlen(text), &k);
        assert_int_equal(at_zone_acquire_req(z, &t, &rq, NULL, NULL), AT_ADMITTED);
        at_zone_release(z, &t);
    }
    for (int i = 0; i < 3; i++) {
        at_client_key_t k;
        at_request_t rq = {.client = &k, .may_wait = 1};

        at_zone_key_from_text(z, "busy", 4, &k);
        assert_int_equal(at_zone_acquire_req(z, &held[i], &rq, NULL, NULL), AT_ADMITTED);
    }
    __atomic_store_n(&at_test_scrape_walked, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&at_test_scrape_walked_locked, 0, __ATOMIC_SEQ_CST);
    at_zone_stats(z, &s);
    assert_false(s.stale);
    assert_true(s.rate_keys >= 16384);
    assert_true(s.rate_keys_in >= 3000); /* the buckets walked are the zone's */
    assert_int_equal(s.nbusiest, 1);
    assert_int_equal(s.busiest[0].count, 3);
    assert_true(s.oldest_pid == getpid());
    assert_true(at_test_scrape_walked >= s.rate_keys + s.nslots);
    assert_int_equal(at_test_scrape_walked_locked, 0);
    for (int i = 0; i < 3; i++) {
        at_zone_release(z, &held[i]);
    }
    zone_free(z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_accounting),
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_no_barging),
        cmocka_unit_test(test_queue_full_rejects_at_once),
        cmocka_unit_test(test_no_wait_refuses_instead_of_queueing),
        cmocka_unit_test(test_wait_check_asked_only_to_wait),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_abort_leaves_queue),
        cmocka_unit_test(test_reclaim_zombie_holder),
        cmocka_unit_test(test_reclaim_reaped_holder_on_full_acquire),
        cmocka_unit_test(test_waiter_reclaims),
        cmocka_unit_test(test_reclaim_dead_waiter),
        cmocka_unit_test(test_one_reclaim_at_a_time),
        cmocka_unit_test(test_lock_holder_dies),
        cmocka_unit_test(test_stopped_lock_holder_bounds_waits),
        cmocka_unit_test(test_release_while_lock_held),
        cmocka_unit_test(test_waiter_leaves_without_the_lock),
        cmocka_unit_test(test_reconfigure_keeps_state),
        cmocka_unit_test(test_successor_counts_what_runs_in_the_old_zone),
        cmocka_unit_test(test_replaced_zone_refuses_newcomers_runs_its_queue),
        cmocka_unit_test(test_successor_sees_no_room_in_a_handoff),
        cmocka_unit_test(test_successor_counts_one_more_while_the_old_lock_is_held),
        cmocka_unit_test(test_successor_counts_only_what_the_old_zone_can_run),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_retry_after_resists_one_slow_request),
        cmocka_unit_test(test_retry_after_is_spread),
        cmocka_unit_test(test_error_page_takes_only_a_free_slot),
        cmocka_unit_test(test_reconfigure_does_not_wait_for_the_lock),
        cmocka_unit_test(test_death_at_every_step_of_a_handoff),
        cmocka_unit_test(test_dry_run_never_refuses),
        cmocka_unit_test(test_dry_run_over_cap_reclaimed),
        cmocka_unit_test(test_latency_histograms),
        cmocka_unit_test(test_auto_limit_climbs_for_waiting_work),
        cmocka_unit_test(test_auto_windows_span_two_services),
        cmocka_unit_test(test_auto_windows_lengthen_at_the_top),
        cmocka_unit_test(test_predicted_wait_refused_at_once),
        cmocka_unit_test(test_dry_run_release_while_lock_held),
        cmocka_unit_test(test_death_in_a_handoff_to_a_waiter_that_left),
        cmocka_unit_test(test_windows_are_logged_without_the_lock),
        cmocka_unit_test(test_repair_is_logged_without_the_lock),
        cmocka_unit_test(test_bodies_bounded),
        cmocka_unit_test(test_bodies_let_go_without_the_lock),
        cmocka_unit_test(test_scrape_walks_outside_the_lock),
    };

    return cmocka_run_group_tests_name("zone", tests, NULL, NULL);
}
