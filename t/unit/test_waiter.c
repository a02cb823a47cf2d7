/*
 * The waiting record's state machine (the table in at_zone_impl.h), walked
 * with a process dying at each allowed transition: every transition the
 * table allows is made by a process of a small story (a hand-off, a
 * timeout, an eviction, a dry run, waiters leaving while the lock is held),
 * that process dies right after it, and the zone must come out whole: lock
 * repair and reclaim leave no slot leaked and no record in use, no waiter
 * still waiting keeps sleeping, the counts equal what the records show, the
 * cap admits exactly its limit, and every request that did not die is
 * counted once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_tuning.h"
#include "at_zone_impl.h"
#include "zone_test_util.h"

#define MS 1000
#define DIED 42    /* a child's exit code: it died at the step */
#define STOPPER 43 /* exit code of a child that ends normally */

/* What the children share with the test. */
typedef struct {
    int go, ready, abort_w;
} ctl_t;

static ctl_t *ctl;
static int target;     /* AT_STEP_WAITER step: from * W_STATES + to */
static int stop_steps; /* bit n: stop (SIGSTOP) at AT_STEP_DISPATCH n */

static void step_hook(int where, int step)
{
    if (where == AT_STEP_WAITER && step == target) {
        _exit(DIED);
    }
    if (where == AT_STEP_DISPATCH && (stop_steps & (1 << step))) {
        raise(SIGSTOP);
    }
}

static void wait_flag(volatile int *f)
{
    for (int i = 0; i < 30000 && !__atomic_load_n(f, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
}

static void set_flag(int *f)
{
    __atomic_store_n(f, 1, __ATOMIC_SEQ_CST);
}

static int abort_w(void *ctx)
{
    (void)ctx;
    return __atomic_load_n(&ctl->abort_w, __ATOMIC_SEQ_CST);
}

typedef enum { HOLDER, WAITER, WAITER_ABORTABLE, LOCKER } role_t;

typedef struct {
    role_t role;
    int priority;
    apr_int64_t timeout_us;
    int stops; /* stop_steps for this child */
} child_t;

/* A child armed to die at the target transition: a holder takes a slot (or
 * runs over the cap), says it is ready and gives it back when told; a waiter
 * asks for a slot and gives back what it got; a locker takes the lock once
 * (tidying what was left without it). */
static pid_t spawn(at_zone_t *z, child_t c)
{
    pid_t pid = fork();

    if (pid == 0) {
        at_ticket_t t;
        at_request_t rq = {.may_wait = 1, .priority = c.priority, .timeout_us = c.timeout_us};
        at_result_t r;

        stop_steps = c.stops;
        at_test_step_hook = step_hook;
        if (c.role == LOCKER) {
            at_zone_reclaim(z);
            _exit(STOPPER);
        }
        r = at_zone_acquire_req(z, &t, &rq, c.role == WAITER_ABORTABLE ? abort_w : NULL, NULL);
        if (c.role == HOLDER) {
            set_flag(&ctl->ready);
            wait_flag(&ctl->go);
        }
        if (r == AT_ADMITTED || r == AT_QUEUED || r == AT_DRY_RUN_QUEUED
            || r == AT_DRY_RUN_REJECTED) {
            at_zone_release(z, &t);
        }
        _exit(STOPPER);
    }
    return pid;
}

/* The children of a story, and how each ended: died (at the step), and
 * of those how many with a request of their own, which may have gone
 * uncounted. */
typedef struct {
    pid_t pid[8];
    int asked[8];
    int n, died, died_asking, arrivals;
    int crashed; /* ended otherwise: a signal (an assertion's abort), an error */
} story_t;

static pid_t add(story_t *s, at_zone_t *z, child_t c)
{
    s->arrivals += s->asked[s->n] = c.role != LOCKER;
    return s->pid[s->n++] = spawn(z, c);
}

static void ended(story_t *s, pid_t pid, int st)
{
    for (int i = 0; i < s->n; i++) {
        if (s->pid[i] == pid) {
            if (WIFEXITED(st) && WEXITSTATUS(st) == DIED) {
                s->died++;
                s->died_asking += s->asked[i];
            }
            else if (!WIFEXITED(st) || WEXITSTATUS(st) != STOPPER) {
                s->crashed++;
            }
            s->pid[i] = 0;
        }
    }
}

static void reap(story_t *s, pid_t pid)
{
    int st;

    assert_int_equal(waitpid(pid, &st, 0), pid);
    ended(s, pid, st);
}

/* Every child left ends by itself within the bound: none sleeps on. */
static void reap_all_within(story_t *s, apr_int64_t bound_us)
{
    apr_int64_t until = at_now_us() + bound_us;

    for (int i = 0; i < s->n; i++) {
        int st;
        pid_t r;

        while (s->pid[i] && (r = waitpid(s->pid[i], &st, WNOHANG)) == 0) {
            if (at_now_us() > until) {
                fail_msg("transition %d -> %d: a process still waits", target / W_STATES,
                         target % W_STATES);
            }
            usleep(2 * MS);
        }
        if (s->pid[i]) {
            ended(s, s->pid[i], st);
        }
    }
}

static void wait_stopped(pid_t pid)
{
    int st;

    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
}

/* A process that may sleep in the queue stopped, not in the middle of
 * taking the lock: the lock is then free. */
static void stop_asleep(at_zone_t *z, pid_t pid)
{
    for (int i = 0; i < 50; i++) {
        kill(pid, SIGSTOP);
        wait_stopped(pid);
        if (!stats_of(z).stale) {
            return;
        }
        kill(pid, SIGCONT);
        usleep(10 * MS);
    }
    fail_msg("the waiter kept the lock");
}

/* Until n requests have joined the queue since the zone was made, or the
 * process that was to join has died (reaped later). */
static void joined_or_gone(at_zone_t *z, pid_t pid, apr_uint64_t n)
{
    for (int i = 0; i < 5000; i++) {
        siginfo_t si = {0};

        if (stats_of(z).counters.queued_total >= n
            || (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0
                && si.si_pid == pid)) {
            return;
        }
        usleep(1000);
    }
}

/* ---- stories: each lists the transitions it makes ------------------- */

#define T(a, b) ((a) * W_STATES + (b))
#define LONG (20000 * MS)

/* A holder (stopping at the dispatch steps in stops) with a waiter queued
 * behind it: the waiter's pid; the holder's is s->pid[0]. */
static pid_t holder_then_waiter(at_zone_t *z, story_t *s, int stops, apr_int64_t timeout_us)
{
    pid_t w;

    add(s, z, (child_t){HOLDER, 0, LONG, stops});
    wait_flag(&ctl->ready);
    w = add(s, z, (child_t){WAITER, 0, timeout_us, 0});
    joined_or_gone(z, w, 1);
    return w;
}

/* A holder, a waiter, the hand-off. */
static void story_handoff(at_zone_t *z, story_t *s)
{
    holder_then_waiter(z, s, 0, LONG);
    set_flag(&ctl->go);
}

/* A waiter's deadline passes under the lock. */
static void story_timeout(at_zone_t *z, story_t *s)
{
    pid_t w;

    add(s, z, (child_t){HOLDER, 0, LONG, 0});
    wait_flag(&ctl->ready);
    w = add(s, z, (child_t){WAITER, 0, 300 * MS, 0});
    reap(s, w);
    set_flag(&ctl->go);
}

/* A newcomer of higher priority evicts a waiter from a full queue. */
static void story_evict(at_zone_t *z, story_t *s)
{
    pid_t n;

    holder_then_waiter(z, s, 0, LONG);
    n = add(s, z, (child_t){WAITER, 5, LONG, 0});
    joined_or_gone(z, n, 2);
    usleep(100 * MS);
    set_flag(&ctl->go);
}

/* A dry run's request over the cap. */
static void story_dry(at_zone_t *z, story_t *s)
{
    at_zone_conf_t c = {.limit = 1, .queue = 2, .timeout_us = LONG,
                        .retry_after = AT_RETRY_AFTER_AUTO, .dry_run = 1};

    at_zone_reconfigure(z, &c);
    add(s, z, (child_t){HOLDER, 0, LONG, 0});
    wait_flag(&ctl->ready);
    reap(s, add(s, z, (child_t){WAITER, 0, LONG, 0}));
    set_flag(&ctl->go);
}

/* A locker takes the lock after a stopped holder let it go: it tidies. */
static void unstop_and_tidy(at_zone_t *z, story_t *s, pid_t stopped)
{
    kill(stopped, SIGCONT);
    usleep(50 * MS);
    kill(stopped, SIGKILL);
    waitpid(stopped, NULL, 0);
    reap(s, add(s, z, (child_t){LOCKER, 0, 0, 0}));
}

/* A dry run's request ends while a stopped process holds the lock. */
static void story_over_ended(at_zone_t *z, story_t *s)
{
    at_zone_conf_t c = {.limit = 1, .queue = 2, .timeout_us = LONG,
                        .retry_after = AT_RETRY_AFTER_AUTO, .dry_run = 1};
    pid_t o, stopped;

    at_zone_reconfigure(z, &c);
    add(s, z, (child_t){HOLDER, 0, LONG, 0});
    wait_flag(&ctl->ready);
    /* a second holder: over the cap, on a record */
    __atomic_store_n(&ctl->ready, 0, __ATOMIC_SEQ_CST);
    o = add(s, z, (child_t){HOLDER, 0, LONG, 0});
    wait_flag(&ctl->ready);
    stopped = fork_stopped_lock_holder(z);
    set_flag(&ctl->go);
    reap(s, o);
    unstop_and_tidy(z, s, stopped);
}

/* A waiter's deadline passes while a stopped process holds the lock. */
static void story_left(at_zone_t *z, story_t *s)
{
    pid_t w = holder_then_waiter(z, s, 0, 1500 * MS), stopped;

    stopped = fork_stopped_lock_holder(z);
    reap(s, w);
    unstop_and_tidy(z, s, stopped);
    set_flag(&ctl->go);
}

/* The releaser stops holding the lock as it hands the slot over; the
 * waiter's deadline passes meanwhile: the hand-off finds it left. */
static void story_left_then_dispatch(at_zone_t *z, story_t *s)
{
    pid_t w = holder_then_waiter(z, s, 1 << 1, 1500 * MS), h = s->pid[0];

    set_flag(&ctl->go);
    wait_stopped(h);
    reap(s, w);
    kill(h, SIGCONT);
    reap(s, h);
    reap(s, add(s, z, (child_t){LOCKER, 0, 0, 0}));
}

/* A waiter granted while it was stopped cannot get the lock by its
 * deadline: it keeps its slot without it. */
static void story_taken(at_zone_t *z, story_t *s)
{
    pid_t w = holder_then_waiter(z, s, 0, 3000 * MS), h = s->pid[0], stopped;

    stop_asleep(z, w);
    set_flag(&ctl->go);
    reap(s, h);
    stopped = fork_stopped_lock_holder(z);
    kill(w, SIGCONT);
    reap(s, w);
    unstop_and_tidy(z, s, stopped);
}

/* A waiter is granted while the releaser, stopped before it wakes it, still
 * holds the lock, and its client goes: it waits for the lock as long as a
 * release would, then drops the slot without it. An older waiter of lower
 * priority watches the zone, so the granted one goes for the lock because
 * its client left, not to reclaim. */
static void story_drop(at_zone_t *z, story_t *s)
{
    at_zone_conf_t c = {.limit = 1, .queue = 2, .timeout_us = LONG,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    pid_t h, w;

    at_zone_reconfigure(z, &c);
    h = add(s, z, (child_t){HOLDER, 0, LONG, 1 << 5});
    wait_flag(&ctl->ready);
    joined_or_gone(z, add(s, z, (child_t){WAITER, 0, LONG, 0}), 1);
    w = add(s, z, (child_t){WAITER_ABORTABLE, 5, 10000 * MS, 0}); /* past every step, under valgrind too */
    joined_or_gone(z, w, 2);
    usleep(500 * MS); /* asleep, not still taking the lock after joining */
    set_flag(&ctl->go);
    wait_stopped(h); /* at dispatch step 5: granted, the lock held */
    set_flag(&ctl->abort_w);
    reap(s, w); /* its process's check sees the client gone */
    kill(h, SIGCONT);
    reap(s, h);
    reap(s, add(s, z, (child_t){LOCKER, 0, 0, 0}));
}

/* A waiter evicted while it was stopped cannot get the lock by its
 * deadline: gone without it. */
static void story_evicted_gone(at_zone_t *z, story_t *s)
{
    pid_t w = holder_then_waiter(z, s, 0, 3000 * MS), stopped;

    stop_asleep(z, w);
    joined_or_gone(z, add(s, z, (child_t){WAITER, 5, LONG, 0}), 2);
    usleep(100 * MS); /* the eviction is made under the lock, before the newcomer queues */
    stopped = fork_stopped_lock_holder(z);
    kill(w, SIGCONT);
    reap(s, w);
    unstop_and_tidy(z, s, stopped);
    set_flag(&ctl->go);
}

typedef struct {
    const char *name;
    void (*run)(at_zone_t *z, story_t *s);
    int transitions[6];
} story_def_t;

static const story_def_t stories[] = {
    {"hand-off", story_handoff,
     {T(W_FREE, W_WAITING), T(W_WAITING, W_GRANTED), T(W_GRANTED, W_FREE), -1}},
    {"timeout", story_timeout, {T(W_WAITING, W_FREE), -1}},
    {"eviction", story_evict, {T(W_WAITING, W_EVICTED), T(W_EVICTED, W_FREE), -1}},
    {"dry run", story_dry, {T(W_FREE, W_OVER_CAP), T(W_OVER_CAP, W_FREE), -1}},
    {"over the cap, ended without the lock", story_over_ended,
     {T(W_OVER_CAP, W_OVER_ENDED), T(W_OVER_ENDED, W_FREE), -1}},
    {"left without the lock", story_left, {T(W_WAITING, W_LEFT), T(W_LEFT, W_FREE), -1}},
    {"hand-off to a waiter that left", story_left_then_dispatch,
     {T(W_LEFT, W_GONE), T(W_GONE, W_FREE), -1}},
    {"granted, taken without the lock", story_taken,
     {T(W_GRANTED, W_TAKEN), T(W_TAKEN, W_FREE), -1}},
    {"granted as its client left, without the lock", story_drop,
     {T(W_GRANTED, W_DROP), T(W_DROP, W_FREE), -1}},
    {"evicted, gone without the lock", story_evicted_gone, {T(W_EVICTED, W_GONE), -1}},
};

/* ---- the zone afterwards ---------------------------------------------- */

static apr_uint64_t outcomes(const at_zone_counters_t *c)
{
    return c->admitted + c->rejected_full + c->rejected_timeout + c->rejected_predicted
           + c->rejected_client + c->rejected_key + c->rejected_rate + c->rejected_workers
           + c->rejected_standing + c->rejected_locked + c->aborted + c->dry_run_queued
           + c->dry_run_rejected;
}

/* Under the lock: every count equals what the records show, and nothing is
 * held or waiting. */
static void audit(at_zone_t *z, const char *name)
{
    apr_uint32_t owned = 0, used = 0, free_slots = 0, free_records = 0;

    assert_int_equal(at_zone_debug_take_lock(z), APR_SUCCESS);
    for (apr_uint32_t i = 0; i < z->nslots; i++) {
        owned += slots(z)[i].owner.pid != 0;
    }
    for (apr_uint32_t i = 0; i < z->nwaiters; i++) {
        used += waiters(z)[i].state != W_FREE;
    }
    for (apr_int32_t i = z->free_slot; i != NONE && free_slots <= z->nslots;
         i = slots(z)[i].next_free) {
        free_slots++;
    }
    for (apr_int32_t i = z->free_waiter; i != NONE && free_records <= z->nwaiters;
         i = waiters(z)[i].next) {
        free_records++;
    }
    if (owned || z->active || used || z->queued || z->over_cap || z->qhead != NONE
        || z->watcher != NONE || free_slots != z->nslots || free_records != z->nwaiters) {
        at_zone_debug_release_lock(z);
        fail_msg("%s, death at %d -> %d: slots owned %u (active %u), records in use %u "
                 "(queued %u, over the cap %u), free %u/%u slots and %u/%u records",
                 name, target / W_STATES, target % W_STATES, owned, z->active, used,
                 z->queued, z->over_cap, free_slots, z->nslots, free_records, z->nwaiters);
    }
    at_zone_debug_release_lock(z);
}

/* Runs a story with its processes armed to die at the transition; 1 if one
 * of them did. */
static int run_story(const story_def_t *d, int transition)
{
    at_zone_t *z = zone_new(1, 1, LONG);
    story_t s = {0};
    at_ticket_t t[2];
    at_zone_stats_t st;

    assert_non_null(z);
    memset(ctl, 0, sizeof(*ctl));
    target = transition;
    d->run(z, &s);
    /* the parent's reclaim as a child exits; then every live process ends
     * by itself, far sooner than the waiters' 20 s */
    reap_all_within(&s, 10000 * MS);
    at_zone_reclaim(z);
    if (s.crashed) {
        fail_msg("%s, death at %d -> %d: %d other processes crashed", d->name,
                 transition / W_STATES, transition % W_STATES, s.crashed);
    }
    audit(z, d->name);

    st = stats_of(z);
    if (outcomes(&st.counters) > (apr_uint64_t)s.arrivals
        || outcomes(&st.counters) + (apr_uint64_t)s.died_asking < (apr_uint64_t)s.arrivals) {
        fail_msg("%s, death at %d -> %d: %d requests (%d died), %llu counted", d->name,
                 transition / W_STATES, transition % W_STATES, s.arrivals, s.died_asking,
                 (unsigned long long)outcomes(&st.counters));
    }
    /* the cap, exactly */
    if (!st.dry_run) {
        assert_int_equal(at_zone_acquire(z, &t[0], NULL, NULL), AT_ADMITTED);
        assert_int_equal(at_zone_acquire_now(z, &t[1]), AT_REJECTED_FULL);
        at_zone_release(z, &t[0]);
    }
    zone_free(z);
    return s.died > 0;
}

static void test_death_at_every_transition(void **state)
{
    int walked = 0;
    (void)state;

    ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(ctl != MAP_FAILED);
    for (int from = 0; from < W_STATES; from++) {
        for (int to = 0; to < W_STATES; to++) {
            const story_def_t *d = NULL;

            if (!zone_waiter_may_move(from, to)) {
                continue;
            }
            for (size_t i = 0; i < sizeof(stories) / sizeof(*stories) && !d; i++) {
                for (int j = 0; stories[i].transitions[j] >= 0; j++) {
                    d = stories[i].transitions[j] == T(from, to) ? &stories[i] : d;
                }
            }
            if (!d) {
                fail_msg("no story makes the transition %d -> %d", from, to);
            }
            /* a story times its steps against deadlines of seconds: a
             * very slow machine may miss a step, never the checks */
            for (int tries = 0; !run_story(d, T(from, to)); tries++) {
                if (tries == 2) {
                    fail_msg("%s: no process reached the transition %d -> %d", d->name,
                             from, to);
                }
            }
            walked++;
        }
    }
    print_message("%d transitions walked, a process dying at each\n", walked);
    munmap(ctl, sizeof(*ctl));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_death_at_every_transition),
    };

    return cmocka_run_group_tests_name("waiter", tests, NULL, NULL);
}
