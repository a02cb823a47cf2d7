/*
 * Waiting: a queued request sleeps on its record's futex word without the
 * lock until it is handed a slot, evicted, its deadline passes (CoDel's or
 * its own) or its client goes; one that cannot get the lock in time leaves
 * without it. Idle waiters cost no wake-ups: one waiter of each process
 * looks at the clients of all (zone_here_*), also while it waits for a
 * lock, one waiter of each zone looks for the dead (z->watcher), and the
 * former backs up the latter.
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <errno.h>
#include <pthread.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static apr_int64_t earlier(apr_int64_t a, apr_int64_t b)
{
    return a < b ? a : b;
}

/* ---- the requests waiting in this process ---------------------------- */

/* mu guards the list, never a look at a client (a system call in the
 * glue): the checker lets it go around each look, with the entry it looks
 * at pinned, which its waiter waits for before it leaves (unpinned). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t unpinned;
    zone_here_t *first, *last;
    zone_here_t *checker; /* the one that looks at every client */
    apr_int64_t next_check_us;
    apr_uint32_t n;
} here = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, NULL, 0, 0};

/* A child forked while another thread waited has none of its waiters. */
static void here_forget_after_fork(void)
{
    pthread_mutex_init(&here.mu, NULL);
    pthread_cond_init(&here.unpinned, NULL);
    here.first = here.last = here.checker = NULL;
    here.n = 0;
}

static void here_watch_forks(void)
{
    pthread_atfork(NULL, NULL, here_forget_after_fork);
}

/* Moves its word and wakes it: it wakes for a reason it reads itself. */
static void here_wake(zone_here_t *e)
{
    __atomic_add_fetch(e->word, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    syscall(SYS_futex, e->word, FUTEX_WAKE, 1, NULL, NULL, 0);
#endif
}

void zone_here_join(zone_here_t *me, at_zone_t *z, at_abort_fn fn, void *ctx,
                    apr_uint32_t *word)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, here_watch_forks);
    me->z = z;
    me->fn = fn;
    me->ctx = ctx;
    me->word = word;
    me->gone = 0;
    me->pinned = 0;
    me->next = NULL;
    pthread_mutex_lock(&here.mu);
    here.n++;
    me->prev = here.last;
    if (here.last) {
        here.last->next = me;
    }
    else {
        here.first = me;
    }
    here.last = me;
    if (!here.checker) {
        here.checker = me;
        here.next_check_us = at_now_us() + AT_CLIENT_CHECK_US;
    }
    pthread_mutex_unlock(&here.mu);
}

/* The checker's turn passes to the newest waiter, woken to learn it. A
 * waiter whose client the checker is looking at waits for the look: the
 * checker goes on from its entry. */
void zone_here_leave(zone_here_t *me)
{
    pthread_mutex_lock(&here.mu);
    while (me->pinned) {
        pthread_cond_wait(&here.unpinned, &here.mu);
    }
    here.n--;
    if (me->prev) {
        me->prev->next = me->next;
    }
    else {
        here.first = me->next;
    }
    if (me->next) {
        me->next->prev = me->prev;
    }
    else {
        here.last = me->prev;
    }
    if (here.checker == me) {
        here.checker = here.last;
        if (here.checker) {
            here_wake(here.checker);
        }
    }
    pthread_mutex_unlock(&here.mu);
}

/* The zones of this process's waiters whose dead nobody looked for lately,
 * a few at a check: those tried longest ago by any checker. A late zone
 * whose lock a stopped process holds stays late; it waits for its turn
 * behind the others instead of keeping them waiting. */
#define LATE_ZONES 4
typedef struct {
    at_zone_t *z[LATE_ZONES];
    apr_int64_t tried[LATE_ZONES];
    int n;
} late_zones_t;

static void late_zones_add(late_zones_t *late, at_zone_t *z, apr_int64_t now)
{
    apr_int64_t tried;
    int newest = 0;

    for (int i = 0; i < late->n; i++) {
        if (late->z[i] == z) {
            return;
        }
    }
    if (!zone_reclaim_late(z, now)) {
        return;
    }
    tried = __atomic_load_n(&z->late_tried_us, __ATOMIC_RELAXED);
    if (late->n < LATE_ZONES) {
        late->z[late->n] = z;
        late->tried[late->n++] = tried;
        return;
    }
    for (int i = 1; i < late->n; i++) {
        if (late->tried[i] > late->tried[newest]) {
            newest = i;
        }
    }
    if (tried < late->tried[newest]) {
        late->z[newest] = z;
        late->tried[newest] = tried;
    }
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_client_checks;
#define COUNT_CLIENT_CHECK() __atomic_add_fetch(&at_test_client_checks, 1, __ATOMIC_RELAXED)
#else
#define COUNT_CLIENT_CHECK() ((void)0)
#endif

/* Lock held, let go for the look: 1 if e's client has gone. */
static int here_look(zone_here_t *e)
{
    int gone;

    e->pinned = 1;
    pthread_mutex_unlock(&here.mu);
    gone = e->fn(e->ctx);
    pthread_mutex_lock(&here.mu);
    e->pinned = 0;
    pthread_cond_broadcast(&here.unpinned);
    return gone;
}

/* Lock held (let go around each look): asks every waiting request whether
 * its client has gone, and wakes those whose has; notes the zones they wait
 * in that are late. Those that joined meanwhile wait for the next check. */
static void here_check_clients(zone_here_t *me, apr_int64_t now, late_zones_t *late)
{
    apr_uint32_t n = here.n;

    COUNT_CLIENT_CHECK();
    for (zone_here_t *e = here.first; e && n; e = e->next, n--) {
        if (!__atomic_load_n(&e->gone, __ATOMIC_ACQUIRE) && e->fn && here_look(e)) {
            __atomic_store_n(&e->gone, 1, __ATOMIC_RELEASE);
            if (e != me) {
                here_wake(e);
            }
        }
        if (e->z) {
            late_zones_add(late, e->z, now);
        }
    }
}

int zone_here_gone(zone_here_t *me, apr_int64_t now, apr_int64_t *until)
{
    late_zones_t late = {.n = 0};

    pthread_mutex_lock(&here.mu);
    if (!here.checker) {
        here.checker = me;
    }
    if (here.checker == me) {
        if (now >= here.next_check_us) {
            here_check_clients(me, now, &late);
            here.next_check_us = now + AT_CLIENT_CHECK_US;
        }
        if (here.next_check_us < *until) {
            *until = here.next_check_us;
        }
    }
    pthread_mutex_unlock(&here.mu);
    /* A late zone's watcher left without the lock, died, or sleeps unaware:
     * the pass's lock names another (the tidy) and wakes it. Never waiting
     * for the lock: the checker must not stall. */
    for (int i = 0; i < late.n; i++) {
        __atomic_store_n(&late.z[i]->late_tried_us, now, __ATOMIC_RELAXED);
        at_zone_reclaim_nowait(late.z[i]);
    }
    return __atomic_load_n(&me->gone, __ATOMIC_ACQUIRE);
}

/* 1 if its client has gone: the checker saw it, or it asks itself now,
 * without the process's lock (the checker may ask at the same time: both
 * only look, and neither ever clears the mark). */
static int here_client_gone(zone_here_t *me)
{
    if (!__atomic_load_n(&me->gone, __ATOMIC_ACQUIRE) && me->fn && me->fn(me->ctx)) {
        __atomic_store_n(&me->gone, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&me->gone, __ATOMIC_ACQUIRE);
}

/* Waits for the zone's lock until until_us, in turns of a check: the
 * process's checker looks at the clients between them, as a lock held by
 * a stopped process must not leave the clients of its other waiters
 * (other zones', rate_delay's) unwatched; and the duty may pass to this
 * waiter while it waits. One whose client has gone waits as long as a
 * request that is done does (AT_RELEASE_LOCK_US), then leaves without. */
static int lock_checking(at_zone_t *z, zone_here_t *me, apr_int64_t until_us)
{
    for (;;) {
        apr_int64_t now = at_now_us(), turn = earlier(until_us, now + AT_CLIENT_CHECK_US);
        int rc;

        if (zone_here_gone(me, now, &turn)) {
            until_us = earlier(until_us, now + AT_RELEASE_LOCK_US);
            turn = earlier(turn, until_us);
        }
        rc = zone_lock_until(z, turn);
        if (rc != ETIMEDOUT || turn >= until_us) {
            return rc;
        }
    }
}

/* How long a waiter may spend on a reclaim: until its next look at its
 * client, the checker's or its own; a reclaim that cannot have the lock
 * by then is skipped, and the wait goes on checking. */
static apr_int64_t reclaim_until(zone_here_t *me, apr_int64_t until_us)
{
    apr_int64_t now = at_now_us();

    until_us = earlier(until_us, now + AT_CLIENT_CHECK_US);
    zone_here_gone(me, now, &until_us);
    return until_us;
}

/* ---- a queued request ------------------------------------------------ */

/* Leave the queue without a slot, counted as refused for this reason. */
static at_result_t give_up_waiting(at_zone_t *z, apr_int32_t wi, at_result_t why,
                                   apr_int64_t now)
{
    at_waiter_t *w = &waiters(z)[wi];

    zone_waiter_leave_queue(z, wi);
    zone_count_refusal(z, w->priority, now, 1);
    zone_waiter_free(z, wi);
    if (why == AT_REJECTED_STANDING) {
        z->counters.rejected_standing++;
    }
    else {
        z->counters.rejected_timeout++;
    }
    return why;
}

/* A waiter whose deadline passed while another process held the lock
 * leaves without it, by compare-and-swap on its record's state: still
 * queued (refused), granted meanwhile (it keeps the slot: the hand-off is
 * done), or evicted (refused). The next holder of the lock tidies up. */
static at_result_t leave_without_lock(at_zone_t *z, at_waiter_t *w, at_ticket_t *t,
                                      at_result_t refused)
{
    apr_int32_t keep = refused == AT_ABORTED ? W_DROP : W_TAKEN;
    apr_int32_t st = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE), to;

    do {
        to = st == W_WAITING ? W_LEFT : st == W_GRANTED ? keep : W_GONE;
    } while (!zone_waiter_cas(w, &st, to));
    __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
    if (to == W_TAKEN) {
        t->slot = w->slot;
        t->granted_us = at_now_us();
        return AT_QUEUED;
    }
    if (refused != AT_ABORTED) {
        __atomic_add_fetch(&z->counters.rejected_locked, 1, __ATOMIC_RELAXED);
    }
    else if (to != W_DROP) { /* the tidy counts a dropped slot */
        __atomic_add_fetch(&z->counters.aborted, 1, __ATOMIC_RELAXED);
    }
    return refused;
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_gone_grants;
#define COUNT_GONE_GRANT() __atomic_add_fetch(&at_test_gone_grants, 1, __ATOMIC_RELAXED)
#else
#define COUNT_GONE_GRANT() ((void)0)
#endif

/* Lock held: a waiter whose client has gone leaves, and a slot it was
 * granted meanwhile goes on to the next: no handler runs for nobody. */
static at_result_t leave_for_gone_client(at_zone_t *z, apr_int32_t wi)
{
    at_waiter_t *w = &waiters(z)[wi];

    if (w->state == W_GRANTED) {
        COUNT_GONE_GRANT();
        zone_slot_put(z, w->slot);
        zone_dispatch(z);
    }
    else if (w->state == W_WAITING) {
        zone_waiter_leave_queue(z, wi);
    }
    zone_waiter_free(z, wi);
    __atomic_add_fetch(&z->counters.aborted, 1, __ATOMIC_RELAXED);
    return AT_ABORTED;
}

/* A waiter sleeps without the lock until something it must act on under the
 * lock may have happened: a hand-off or eviction (its wake word moves; the
 * state is published before it), its deadline (CoDel's, read here as a
 * hint: the lock decides; with codel= it looks again every TARGET, as the
 * queue may come to stand), or a duty: the zone's watcher looks for the
 * dead every interval (and with mem= or a replaced zone dispatches every
 * slice), and the process's checker looks at its clients (and for the
 * dead of their zones after four intervals with none, in case a watcher
 * died, left or never learned its turn). 1 if the checker saw its client
 * go (a slot granted meanwhile is then passed on). */
static int wait_unlocked(at_zone_t *z, at_waiter_t *w, apr_int32_t wi, apr_uint32_t seen,
                         apr_int64_t start, apr_int64_t full_deadline, zone_here_t *me)
{
    for (;;) {
        apr_int64_t now = at_now_us(), deadline, until, last;
        int watcher, polls;

        deadline = at_codel_deadline(&z->codel, start, full_deadline, now,
                                     __atomic_load_n(&z->typical_service_us, __ATOMIC_RELAXED));
        watcher = __atomic_load_n(&z->watcher, __ATOMIC_RELAXED) == wi;
        if (now >= deadline || __atomic_load_n(&w->wake, __ATOMIC_ACQUIRE) != seen
            || __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != W_WAITING) {
            return 0;
        }
        until = deadline;
        if (zone_here_gone(me, now, &until)) {
            return 1; /* before any duty: it leaves at once */
        }
        /* read after the check, which may have reclaimed this zone */
        last = __atomic_load_n(&z->last_reclaim_us, __ATOMIC_RELAXED);
        if (now - last >= AT_RECLAIM_INTERVAL_US * (watcher ? 1 : 4)) {
            return 0;
        }
        if (watcher) {
            until = earlier(until, last + AT_RECLAIM_INTERVAL_US);
        }
        polls = watcher && (z->mem.bytes || __atomic_load_n(&z->predecessor, __ATOMIC_RELAXED));
        if (polls) {
            until = earlier(until, now + AT_WAIT_SLICE_US);
        }
        if (z->codel.target_us) {
            until = earlier(until, now + (z->codel.target_us > AT_WAIT_SLICE_US
                                              ? z->codel.target_us : AT_WAIT_SLICE_US));
        }
        zone_sleep_on_word(&w->wake, seen, until - now);
        if (polls && (z->mem.bytes
                      || zone_running(z) < __atomic_load_n(&z->limit, __ATOMIC_RELAXED))) {
            return 0; /* memory, or a replaced zone, made room without a release here */
        }
    }
}

static at_result_t wait_in_queue(at_zone_t *z, at_ticket_t *t, apr_int32_t wi,
                                 apr_int64_t start, apr_int64_t timeout_us, zone_here_t *me)
{
    at_waiter_t *w = &waiters(z)[wi];
    apr_int64_t full_deadline = start + timeout_us, deadline = full_deadline;

    for (;;) {
        apr_int64_t now;
        apr_uint32_t seen;
        int gave_up = 0, do_reclaim, rc, looked;
        mem_read_t m;

        /* A slot is taken only after a look at the client made since it was
         * granted (without the lock): its handler does not run for a client
         * that went as the slot came, awake or asleep at the grant. */
        looked = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == W_GRANTED;
        if (looked) {
            here_client_gone(me);
        }
        zone_mem_read_before_lock(z, &m);
        if ((rc = lock_checking(z, me, full_deadline)) != 0) {
            zone_mem_after_unlock(z, &m);
            if (rc != ETIMEDOUT) {
                return AT_ERROR;
            }
            return leave_without_lock(z, w, t, here_client_gone(me) ? AT_ABORTED
                                                                    : AT_REJECTED_LOCKED);
        }
        zone_mem_apply_locked(z, &m);
        now = at_now_us();
        if (z->qhead == wi || z->watcher == wi) {
            zone_dispatch(z); /* memory, or a replaced zone, frees without a release here */
        }
        if (w->state == W_GRANTED && !looked) {
            zone_unlock_after_mem(z, &m); /* granted since it looked: it looks first */
            continue;
        }
        if (w->state == W_GRANTED && __atomic_load_n(&me->gone, __ATOMIC_ACQUIRE)) {
            at_result_t r = leave_for_gone_client(z, wi);

            zone_unlock_after_mem(z, &m);
            return r;
        }
        if (w->state == W_GRANTED) {
            t->slot = w->slot;
            t->granted_us = now;
            z->counters.admitted++;
            zone_record_wait(z, now - start, now);
            zone_count_grant(z, w->priority, now - start, now);
            zone_waiter_free(z, wi);
            zone_unlock_after_mem(z, &m);
            return AT_QUEUED;
        }
        if (w->state == W_EVICTED) {
            zone_count_refusal(z, w->priority, now, 1);
            at_sensor_refused(&z->sensor);
            z->counters.rejected_full++;
            zone_waiter_free(z, wi);
            zone_unlock_after_mem(z, &m);
            return AT_REJECTED_FULL;
        }
        deadline =
            at_codel_deadline(&z->codel, start, full_deadline, now, z->typical_service_us);
        if (now >= deadline) {
            at_result_t r = give_up_waiting(
                z, wi,
                deadline < full_deadline ? AT_REJECTED_STANDING : AT_REJECTED_TIMEOUT,
                now);
            zone_unlock_after_mem(z, &m);
            return r;
        }
        seen = __atomic_load_n(&w->wake, __ATOMIC_SEQ_CST);
        do_reclaim = zone_take_reclaim_if_due(z, now);
        zone_unlock_after_mem(z, &m);

        if (do_reclaim) {
            zone_reclaim(z, reclaim_until(me, full_deadline), 0);
            continue;
        }
        gave_up = wait_unlocked(z, w, wi, seen, start, full_deadline, me);
        if (gave_up) {
            at_result_t r;

            if ((rc = lock_checking(z, me, full_deadline)) != 0) {
                return rc == ETIMEDOUT ? leave_without_lock(z, w, t, AT_ABORTED) : AT_ERROR;
            }
            r = leave_for_gone_client(z, wi);
            zone_unlock(z);
            return r;
        }
    }
}

at_result_t zone_wait_for_slot(at_zone_t *z, at_ticket_t *t, apr_int32_t wi,
                               apr_int64_t start, apr_int64_t timeout_us,
                               at_abort_fn abort_fn, void *ctx)
{
    zone_here_t me;
    at_result_t r;

    zone_here_join(&me, z, abort_fn, ctx, &waiters(z)[wi].wake);
    r = wait_in_queue(z, t, wi, start, timeout_us, &me);
    zone_here_leave(&me);
    return r;
}
