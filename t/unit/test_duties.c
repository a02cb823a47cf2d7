/*
 * The duties of idle waiters, with processes stopped or dying at the worst
 * step: the process's checker, which looks at the clients of every request
 * waiting in its process (whatever zone they wait in), and backs up the
 * zones' watchers; the watcher, which looks for the dead; the wake-ups a
 * hand-off sends after letting the lock go; and a slot handed to a request
 * whose client has gone. Each test ends its threads and processes before
 * it asserts, so that a failure leaves nothing behind for the next.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <apr_time.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_tuning.h"
#include "at_zone.h"
#include "zone_test_util.h"

#define MS 1000
#define LONG (60000 * MS)
#define DIED 42 /* a child's exit code: it died at the step */

/* A request on a thread of this process; its client goes when gone is set. */
typedef struct {
    at_zone_t *z;
    int priority;
    apr_int64_t timeout_us;
    int gone;
    at_result_t result;
    apr_int64_t wait_us;
    pthread_t th;
} req_t;

static int client_gone(void *ctx)
{
    return __atomic_load_n(&((req_t *)ctx)->gone, __ATOMIC_SEQ_CST);
}

static void *request(void *p)
{
    req_t *a = p;
    at_ticket_t t;
    at_request_t rq = {.may_wait = 1, .priority = a->priority, .timeout_us = a->timeout_us};

    a->result = at_zone_acquire_req(a->z, &t, &rq, client_gone, a);
    a->wait_us = t.wait_us;
    if (a->result == AT_ADMITTED || a->result == AT_QUEUED) {
        at_zone_release(a->z, &t);
    }
    return NULL;
}

/* Starts a request and returns once it is the queue's n-th. */
static void start_queued(req_t *a, at_zone_t *z, int priority, apr_int64_t timeout_us,
                         apr_uint32_t n)
{
    a->z = z;
    a->priority = priority;
    a->timeout_us = timeout_us;
    a->gone = 0;
    a->result = AT_ERROR;
    assert_int_equal(pthread_create(&a->th, NULL, request, a), 0);
    wait_until_queued(z, n);
}

static void end_request(req_t *a)
{
    __atomic_store_n(&a->gone, 1, __ATOMIC_SEQ_CST);
    pthread_join(a->th, NULL);
}

/* This process's checker: a request queued first, in a zone of its own,
 * behind a slot the test holds. */
typedef struct {
    at_zone_t *z;
    at_ticket_t hold;
    req_t r;
} checker_t;

static void start_checker(checker_t *c)
{
    c->z = zone_new(1, 1, LONG);
    assert_non_null(c->z);
    assert_int_equal(at_zone_acquire(c->z, &c->hold, NULL, NULL), AT_ADMITTED);
    start_queued(&c->r, c->z, 0, LONG, 1);
    usleep(100 * MS); /* it joins the process's waiters just after queueing */
}

static void end_checker(checker_t *c)
{
    end_request(&c->r);
    at_zone_release(c->z, &c->hold);
    zone_free(c->z);
}

static void end_process(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* 1. The checker, a waiter of zone A, waits for A's lock, which a stopped
 * process holds: the client of a request waiting in zone B, in the same
 * process, is still seen to go within a few checks, not at the checker's
 * deadline nor its own. Then the checker's own client goes: it leaves
 * without the lock, as a release would, not at its deadline, and counts
 * as aborted. */
static void test_checker_checks_while_another_zones_lock_is_stuck(void **state)
{
    at_zone_t *a = zone_new(1, 1, LONG), *b = zone_new(1, 1, LONG);
    at_ticket_t ha, hb;
    req_t ra, rb;
    cont_arg_t c = {0, SIGCONT, 0, 0};
    pthread_t th;
    (void)state;

    assert_int_equal(at_zone_acquire(a, &ha, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(b, &hb, NULL, NULL), AT_ADMITTED);
    start_queued(&ra, a, 0, 30000 * MS, 1); /* the checker, and A's watcher */
    usleep(100 * MS);
    start_queued(&rb, b, 0, 10000 * MS, 1);
    c.holder = fork_stopped_lock_holder(a);
    usleep(4 * AT_RECLAIM_INTERVAL_US); /* A's watcher has gone for the lock */
    __atomic_store_n(&rb.gone, 1, __ATOMIC_SEQ_CST);
    pthread_join(rb.th, NULL);
    assert_int_equal(pthread_create(&th, NULL, cont_later, &c), 0);
    end_request(&ra);
    __atomic_store_n(&c.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);

    assert_int_equal(at_zone_debug_take_lock(a), APR_SUCCESS); /* once the holder let go */
    at_zone_debug_release_lock(a);
    at_zone_release(a, &ha);
    end_process(c.holder);
    at_zone_release(b, &hb);
    assert_int_equal(rb.result, AT_ABORTED); /* not its 10 s timeout */
    assert_int_equal(stats_of(b).counters.aborted, 1);
    assert_int_equal(ra.result, AT_ABORTED);
    assert_false(c.fired); /* it left while the holder was stopped */
    assert_int_equal(stats_of(a).counters.aborted, 1);
    assert_int_equal(stats_of(a).queued, 0);
    assert_int_equal(stats_of(a).active, 0);
    assert_int_equal(stats_of(b).active, 0);
    zone_free(a);
    zone_free(b);
}

/* Ends the process as it lets the lock go, with wake-ups still to send. */
static void die_with_wakes_unsent(int where, int step)
{
    if (where == AT_STEP_WAKES && step > 0) {
        _exit(DIED);
    }
}

/* Once told, gives the slot back and dies between letting the lock go and
 * waking the waiter it handed the slot to. */
static void release_and_die(at_zone_t *z, at_ticket_t *t, void *go)
{
    while (!__atomic_load_n((int *)go, __ATOMIC_SEQ_CST)) {
        usleep(1000);
    }
    at_test_step_hook = die_with_wakes_unsent;
    at_zone_release(z, t);
}

/* 2. The releaser dies after letting the lock go, before it wakes the
 * waiter it granted the slot to; that waiter is neither its process's
 * checker nor the zone's watcher. The watcher's next pass wakes it: it
 * runs well before its deadline instead of holding the slot idle. */
static void test_grant_woken_after_its_waker_died(void **state)
{
    at_zone_t *z = zone_new(1, 4, LONG);
    int *go = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    checker_t c;
    req_t watcher, granted;
    pid_t releaser;
    int st;
    (void)state;

    assert_true(go != MAP_FAILED);
    *go = 0;
    releaser = fork_holder_then(z, NULL, release_and_die, go);
    start_checker(&c);
    start_queued(&watcher, z, 0, LONG, 1);
    start_queued(&granted, z, 5, 10000 * MS, 2); /* the queue's head */
    usleep(300 * MS); /* asleep */
    __atomic_store_n(go, 1, __ATOMIC_SEQ_CST);
    assert_int_equal(waitpid(releaser, &st, 0), releaser);
    pthread_join(granted.th, NULL);

    end_request(&watcher);
    end_checker(&c);
    munmap(go, sizeof(int));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == DIED);
    assert_int_equal(granted.result, AT_QUEUED);
    if (granted.wait_us >= 5000 * MS) {
        fail_msg("the granted waiter slept %lld ms, to its deadline",
                 (long long)(granted.wait_us / MS));
    }
    assert_int_equal(stats_of(z).active, 0);
    zone_free(z);
}

/* 3. The zone's watcher leaves without the lock (its deadline passed while
 * a stopped process held it); the stopped process goes on and lets the
 * lock go, and nobody else takes it. A holder then dies: the checker of a
 * process with a waiter in the zone, itself waiting in another zone, sees
 * the zone's reclaim late and makes the pass, so that the slot reaches the
 * waiter left, long before its deadline. */
static void test_watcher_that_left_without_the_lock_is_replaced(void **state)
{
    at_zone_t *z = zone_new(2, 4, LONG);
    at_ticket_t hold;
    checker_t c;
    req_t left, patient;
    pid_t holder, stopped;
    (void)state;

    holder = fork_holder(z, NULL, 1);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    start_checker(&c);
    start_queued(&left, z, 0, 1500 * MS, 1); /* the watcher */
    start_queued(&patient, z, 0, 20000 * MS, 2);
    stopped = fork_stopped_lock_holder(z);
    pthread_join(left.th, NULL);
    kill(stopped, SIGCONT); /* lets the lock go, and pauses */
    end_process(holder);
    pthread_join(patient.th, NULL);

    end_checker(&c);
    end_process(stopped);
    at_zone_release(z, &hold);
    assert_int_equal(left.result, AT_REJECTED_LOCKED);
    assert_int_equal(patient.result, AT_QUEUED); /* not its 20 s timeout */
    assert_int_equal(stats_of(z).counters.reclaimed, 1);
    assert_int_equal(stats_of(z).active, 0);
    assert_int_equal(stats_of(z).queued, 0);
    zone_free(z);
}

/* The request whose client goes as the next slot is handed over: under the
 * lock, once the slot is filled in its name, before its record says so. */
static req_t *going;

static void client_goes_at_hand_off(int where, int step)
{
    if (where == AT_STEP_DISPATCH && step == 4) {
        req_t *r = __atomic_exchange_n(&going, NULL, __ATOMIC_SEQ_CST);

        if (r) {
            __atomic_store_n(&r->gone, 1, __ATOMIC_SEQ_CST);
        }
    }
}

/* 4. A slot is handed to a waiter whose client goes at that moment, too
 * late for any check of the waiting request to see it: its handler does
 * not run for nobody; the slot goes on to the next waiter. The slot given
 * back is counted: a client seen to go while still queued (a check come
 * early on a loaded machine) would leave the same results but no count. */
static void test_grant_to_a_gone_client_goes_on(void **state)
{
    at_zone_t *z = zone_new(1, 4, LONG);
    at_ticket_t hold;
    req_t gone, next;
    at_zone_stats_t s;
    apr_uint32_t passed_on;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    start_queued(&gone, z, 0, 20000 * MS, 1);
    start_queued(&next, z, 0, 20000 * MS, 2);
    usleep(100 * MS); /* asleep, or not: either way */
    passed_on = __atomic_load_n(&at_test_gone_grants, __ATOMIC_SEQ_CST);
    __atomic_store_n(&going, &gone, __ATOMIC_SEQ_CST);
    at_test_step_hook = client_goes_at_hand_off;
    at_zone_release(z, &hold);
    pthread_join(gone.th, NULL);
    pthread_join(next.th, NULL);
    at_test_step_hook = NULL;
    passed_on = __atomic_load_n(&at_test_gone_grants, __ATOMIC_SEQ_CST) - passed_on;

    s = stats_of(z);
    assert_null(going); /* its client went at the hand-off */
    assert_int_equal(gone.result, AT_ABORTED);
    assert_int_equal(next.result, AT_QUEUED);
    assert_int_equal(passed_on, 1);
    assert_int_equal(s.counters.aborted, 1);
    assert_int_equal(s.counters.admitted, 2); /* the holder and the next */
    assert_int_equal(s.active, 0);
    zone_free(z);
}

/* What a waiter in a child process shares with the test. */
typedef struct {
    int gone;
} shared_client_t;

static int shared_client_gone(void *ctx)
{
    return __atomic_load_n(&((shared_client_t *)ctx)->gone, __ATOMIC_SEQ_CST);
}

/* A child that waits in the queue and exits with its result. */
static pid_t fork_waiter(at_zone_t *z, apr_int64_t timeout_us, shared_client_t *client)
{
    pid_t pid = fork();

    if (pid == 0) {
        at_ticket_t t;
        at_request_t rq = {.may_wait = 1, .timeout_us = timeout_us};
        at_result_t r = at_zone_acquire_req(z, &t, &rq, shared_client_gone, client);

        _exit((int)r);
    }
    return pid;
}

/* A process asleep in the queue stopped, not while it takes the lock. */
static void stop_asleep(at_zone_t *z, pid_t pid)
{
    for (int i = 0; i < 50; i++) {
        int st;

        kill(pid, SIGSTOP);
        assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
        if (!stats_of(z).stale) {
            return;
        }
        kill(pid, SIGCONT);
        usleep(10 * MS);
    }
    fail_msg("the waiter kept the lock");
}

/* 4, without the lock: a waiter granted while it was stopped finds the
 * lock held by a stopped process, and its client goes while it waits for
 * it. At its deadline it leaves without the lock: it drops the slot for
 * the next holder to give back, rather than keep it for nobody. */
static void test_gone_client_drops_a_grant_without_the_lock(void **state)
{
    at_zone_t *z = zone_new(1, 4, LONG);
    shared_client_t *client = mmap(NULL, sizeof(*client), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    at_ticket_t hold;
    pid_t waiter, stopped;
    int st;
    (void)state;

    assert_true(client != MAP_FAILED);
    client->gone = 0;
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    waiter = fork_waiter(z, 4000 * MS, client);
    wait_until_queued(z, 1);
    usleep(100 * MS);
    stop_asleep(z, waiter);
    at_zone_release(z, &hold); /* granted, asleep */
    stopped = fork_stopped_lock_holder(z);
    kill(waiter, SIGCONT); /* wakes, its client still there, waits for the lock */
    usleep(500 * MS);
    __atomic_store_n(&client->gone, 1, __ATOMIC_SEQ_CST);
    assert_int_equal(waitpid(waiter, &st, 0), waiter);

    kill(stopped, SIGCONT);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED); /* tidies */
    at_zone_release(z, &hold);
    end_process(stopped);
    munmap(client, sizeof(*client));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), AT_ABORTED);
    assert_int_equal(stats_of(z).counters.aborted, 1);
    assert_int_equal(stats_of(z).active, 0);
    zone_free(z);
}

/* 5. Waiters granted their slots while stopped (SIGSTOP) do not take them
 * for a while, and reclaim passes go on meanwhile: each pass finds them
 * granted, but only the first sends their wake-ups again (in case their
 * waker died before it sent them); the others send none. */
static void test_reclaim_wakes_a_granted_waiter_once(void **state)
{
    enum { N = 3, PASSES = 5 };
    at_zone_t *z = zone_new(N, N, LONG);
    shared_client_t *client = mmap(NULL, sizeof(*client), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    at_ticket_t hold[N];
    pid_t waiter[N];
    apr_uint32_t wakes;
    int st[N];
    (void)state;

    assert_true(client != MAP_FAILED);
    client->gone = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(at_zone_acquire(z, &hold[i], NULL, NULL), AT_ADMITTED);
    }
    for (int i = 0; i < N; i++) {
        waiter[i] = fork_waiter(z, LONG, client);
        wait_until_queued(z, (apr_uint32_t)i + 1);
    }
    usleep(100 * MS);
    for (int i = 0; i < N; i++) {
        stop_asleep(z, waiter[i]);
    }
    for (int i = 0; i < N; i++) {
        at_zone_release(z, &hold[i]); /* granted, stopped */
    }
    wakes = __atomic_load_n(&at_test_wakes, __ATOMIC_SEQ_CST);
    for (int i = 0; i < PASSES; i++) {
        at_zone_reclaim(z);
    }
    wakes = __atomic_load_n(&at_test_wakes, __ATOMIC_SEQ_CST) - wakes;
    for (int i = 0; i < N; i++) {
        kill(waiter[i], SIGCONT);
        assert_int_equal(waitpid(waiter[i], &st[i], 0), waiter[i]);
    }

    at_zone_reclaim(z); /* the slots the exited waiters took */
    munmap(client, sizeof(*client));
    if (wakes != N) {
        fail_msg("%d reclaim passes over %d granted waiters sent %u wake-ups, not %d",
                 PASSES, N, wakes, N);
    }
    for (int i = 0; i < N; i++) {
        assert_true(WIFEXITED(st[i]));
        assert_int_equal(WEXITSTATUS(st[i]), AT_QUEUED);
    }
    assert_int_equal(stats_of(z).counters.reclaimed, N);
    assert_int_equal(stats_of(z).active, 0);
    zone_free(z);
}

/* 6. Six zones of this process's waiters are late at once. The locks of
 * four are held by stopped processes, so their late passes never get done
 * and they stay late; in the other two the holder of the slot dies and the
 * watcher is stopped. The process's checker makes the passes of those two
 * within a few of its checks, not never: the four stuck ones, though they
 * are older, do not take every turn. */
static void test_every_late_zone_has_its_turn(void **state)
{
    enum { STUCK = 4, FREE = 2, ZONES = STUCK + FREE, MAX_CHECKS = 16 };
    shared_client_t *client = mmap(NULL, sizeof(*client), PROT_READ | PROT_WRITE,
                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    at_zone_t *z[ZONES];
    at_ticket_t hold[STUCK];
    req_t r[ZONES];
    pid_t locker[STUCK], holder[FREE], watcher[FREE];
    apr_uint32_t checks = 0, first;
    int done = 0;
    (void)state;

    assert_true(client != MAP_FAILED);
    client->gone = 0;
    for (int i = 0; i < STUCK; i++) { /* this process's first waiters */
        z[i] = zone_new(1, 1, LONG);
        assert_int_equal(at_zone_acquire(z[i], &hold[i], NULL, NULL), AT_ADMITTED);
        start_queued(&r[i], z[i], 0, LONG, 1);
        usleep(100 * MS);
        locker[i] = fork_stopped_lock_holder(z[i]);
    }
    for (int j = 0; j < FREE; j++) {
        at_zone_t *f = z[STUCK + j] = zone_new(1, 2, LONG);

        holder[j] = fork_holder(f, NULL, 1);
        watcher[j] = fork_waiter(f, LONG, client);
        wait_until_queued(f, 1);
        usleep(100 * MS);
        stop_asleep(f, watcher[j]);
        start_queued(&r[STUCK + j], f, 0, LONG, 2);
    }
    usleep(100 * MS);
    for (int j = 0; j < FREE; j++) {
        end_process(holder[j]);
    }
    first = __atomic_load_n(&at_test_client_checks, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 600 && checks <= MAX_CHECKS && done < FREE; i++) { /* 60 s */
        usleep(100 * MS);
        checks = __atomic_load_n(&at_test_client_checks, __ATOMIC_SEQ_CST) - first;
        done = 0;
        for (int j = 0; j < FREE; j++) {
            done += stats_of(z[STUCK + j]).counters.reclaimed == 1;
        }
    }

    for (int i = 0; i < STUCK; i++) {
        kill(locker[i], SIGCONT); /* lets the lock go */
    }
    for (int i = 0; i < ZONES; i++) {
        __atomic_store_n(&r[i].gone, 1, __ATOMIC_SEQ_CST);
    }
    for (int i = 0; i < ZONES; i++) {
        pthread_join(r[i].th, NULL);
    }
    for (int i = 0; i < STUCK; i++) {
        end_process(locker[i]);
        at_zone_release(z[i], &hold[i]);
    }
    for (int j = 0; j < FREE; j++) {
        end_process(watcher[j]);
        at_zone_reclaim(z[STUCK + j]); /* the slot granted to the watcher */
    }
    munmap(client, sizeof(*client));
    if (done < FREE) {
        fail_msg("after %u checks, %d of %d late zones whose lock was free had their "
                 "pass", checks, done, FREE);
    }
    print_message("the late passes came within %u checks\n", checks);
    for (int i = 0; i < ZONES; i++) {
        assert_int_equal(r[i].result, AT_ABORTED);
        assert_int_equal(stats_of(z[i]).active, 0);
        assert_int_equal(stats_of(z[i]).queued, 0);
        zone_free(z[i]);
    }
}

/* A client whose look stalls once armed: until told, or 15 s. */
typedef struct {
    req_t r;
    int armed, stalled, told, told_in_time;
} slow_t;

static int slow_client_gone(void *ctx)
{
    slow_t *s = ctx;

    if (__atomic_exchange_n(&s->armed, 0, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&s->stalled, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < 15000 && !__atomic_load_n(&s->told, __ATOMIC_SEQ_CST); i++) {
            usleep(1000);
        }
        __atomic_store_n(&s->told_in_time, __atomic_load_n(&s->told, __ATOMIC_SEQ_CST),
                         __ATOMIC_SEQ_CST);
    }
    return __atomic_load_n(&s->r.gone, __ATOMIC_SEQ_CST);
}

static void *slow_request(void *p)
{
    slow_t *s = p;
    at_ticket_t t;
    at_request_t rq = {.may_wait = 1, .timeout_us = LONG};

    s->r.result = at_zone_acquire_req(s->r.z, &t, &rq, slow_client_gone, s);
    if (s->r.result == AT_ADMITTED || s->r.result == AT_QUEUED) {
        at_zone_release(s->r.z, &t);
    }
    return NULL;
}

/* 7. The process's checker is stuck in a look at a client (a system call
 * that stalls): meanwhile a slot handed to another waiter of the process is
 * taken and given back. A look holds up no waiter of the process but the
 * one that looks. */
static void test_a_stalled_look_holds_no_hand_off_up(void **state)
{
    at_zone_t *z = zone_new(1, 4, LONG);
    at_ticket_t hold;
    slow_t slow = {.armed = 0};
    req_t granted;
    (void)state;

    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    slow.r.z = z;
    slow.r.gone = 0;
    assert_int_equal(pthread_create(&slow.r.th, NULL, slow_request, &slow), 0);
    wait_until_queued(z, 1);
    usleep(100 * MS); /* the process's checker */
    start_queued(&granted, z, 5, LONG, 2); /* the queue's head */
    usleep(100 * MS); /* asleep */
    __atomic_store_n(&slow.armed, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 20000 && !__atomic_load_n(&slow.stalled, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
    assert_true(__atomic_load_n(&slow.stalled, __ATOMIC_SEQ_CST));
    at_zone_release(z, &hold);
    pthread_join(granted.th, NULL); /* the slot went on to the checker */
    __atomic_store_n(&slow.r.gone, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&slow.told, 1, __ATOMIC_SEQ_CST);
    pthread_join(slow.r.th, NULL);

    assert_int_equal(granted.result, AT_QUEUED);
    assert_int_equal(slow.r.result, AT_ABORTED);
    if (!slow.told_in_time) {
        fail_msg("the hand-off waited for the checker's stalled look");
    }
    assert_int_equal(stats_of(z).active, 0);
    assert_int_equal(stats_of(z).queued, 0);
    zone_free(z);
}

/* Many requests on threads of this process, through a zone of 2 slots,
 * whose clients go at random moments: while queued, as a slot is handed
 * to them, while they run. The requests themselves count how many run at
 * once. */
enum { CHURN_THREADS = 8, CHURN_ROUNDS = 150, CHURN_LIMIT = 2 };

typedef struct {
    at_zone_t *z;
    int inside, max_inside;
    long done[AT_REJECTED_RATE + 1];
} churn_t;

static churn_t churn;

typedef struct {
    apr_int64_t gone_at;
} churn_client_t;

static int churn_client_gone(void *ctx)
{
    churn_client_t *c = ctx;

    return c->gone_at && apr_time_now() >= c->gone_at;
}

static void *churn_thread(void *p)
{
    unsigned seed = (unsigned)(apr_uintptr_t)p;

    for (int i = 0; i < CHURN_ROUNDS; i++) {
        churn_client_t c = {0};
        at_request_t rq = {.may_wait = 1, .timeout_us = 20000 * MS};
        at_ticket_t t;
        at_result_t r;

        if (rand_r(&seed) % 3 == 0) {
            c.gone_at = apr_time_now() + rand_r(&seed) % 3000;
        }
        r = at_zone_acquire_req(churn.z, &t, &rq, churn_client_gone, &c);
        if (r == AT_ADMITTED || r == AT_QUEUED) {
            int now = __atomic_add_fetch(&churn.inside, 1, __ATOMIC_SEQ_CST);
            int seen = __atomic_load_n(&churn.max_inside, __ATOMIC_SEQ_CST);

            while (now > seen
                   && !__atomic_compare_exchange_n(&churn.max_inside, &seen, now, 0,
                                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            }
            usleep(rand_r(&seed) % 500);
            __atomic_sub_fetch(&churn.inside, 1, __ATOMIC_SEQ_CST);
            at_zone_release(churn.z, &t);
        }
        __atomic_add_fetch(&churn.done[r], 1, __ATOMIC_SEQ_CST);
        if (r != AT_ADMITTED && r != AT_QUEUED && r != AT_ABORTED) {
            break; /* behind a lost slot the rest would wait as long */
        }
    }
    return NULL;
}

/* 8. No slot is lost nor given twice with clients going at every moment:
 * never more than the limit run at once, every request ends admitted or
 * aborted (none waits 20 s until its deadline, as it would behind a lost
 * hand-off), and the zone's counts agree with the requests' own. */
static void test_clients_going_at_random_lose_no_slot(void **state)
{
    pthread_t th[CHURN_THREADS];
    at_zone_stats_t s;
    long admitted, aborted, total = 0;
    (void)state;

    memset(&churn, 0, sizeof(churn));
    churn.z = zone_new(CHURN_LIMIT, CHURN_THREADS, LONG);
    assert_non_null(churn.z);
    for (int i = 0; i < CHURN_THREADS; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, churn_thread,
                                         (void *)(apr_uintptr_t)(i * 7919 + 1)),
                         0);
    }
    for (int i = 0; i < CHURN_THREADS; i++) {
        pthread_join(th[i], NULL);
    }

    s = stats_of(churn.z);
    admitted = churn.done[AT_ADMITTED] + churn.done[AT_QUEUED];
    aborted = churn.done[AT_ABORTED];
    for (int i = 0; i <= AT_REJECTED_RATE; i++) {
        total += churn.done[i];
    }
    print_message("%ld admitted, %ld aborted, %ld else, at most %d at once\n", admitted,
                  aborted, total - admitted - aborted, churn.max_inside);
    assert_int_equal(admitted + aborted, total);
    assert_int_equal(total, CHURN_THREADS * CHURN_ROUNDS);
    assert_true(churn.max_inside <= CHURN_LIMIT);
    assert_int_equal(s.counters.admitted, admitted);
    assert_int_equal(s.counters.aborted, aborted);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.queued, 0);
    zone_free(churn.z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_checks_while_another_zones_lock_is_stuck),
        cmocka_unit_test(test_grant_woken_after_its_waker_died),
        cmocka_unit_test(test_watcher_that_left_without_the_lock_is_replaced),
        cmocka_unit_test(test_grant_to_a_gone_client_goes_on),
        cmocka_unit_test(test_gone_client_drops_a_grant_without_the_lock),
        cmocka_unit_test(test_reclaim_wakes_a_granted_waiter_once),
        cmocka_unit_test(test_every_late_zone_has_its_turn),
        cmocka_unit_test(test_a_stalled_look_holds_no_hand_off_up),
        cmocka_unit_test(test_clients_going_at_random_lose_no_slot),
    };

    return cmocka_run_group_tests_name("duties", tests, NULL, NULL);
}
