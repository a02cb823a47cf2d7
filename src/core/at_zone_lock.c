/*
 * A zone's lock: a robust, process-shared mutex. A process that dies
 * holding it leaves the records whole; the next holder rebuilds what is
 * derived from them (zone_repair), tidies what waiters left without it, and
 * applies a definition published since. Every wait for it is bounded.
 * mem= readings are taken before it, applied once it is held, and a
 * failure is logged after letting it go.
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <apr_atomic.h>
#include <errno.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the lock -------------------------------------------------------- */

/* Queue order: higher priority first, then arrival. */
static int queue_before(const at_waiter_t *a, const at_waiter_t *b)
{
    if (a->priority != b->priority) {
        return a->priority > b->priority;
    }
    return a->ticket < b->ticket;
}

/* Sorts n records linked by next (ending in NONE) into queue order, in
 * place: repair runs when memory may be short and must not allocate. */
static apr_int32_t sort_waiting(at_waiter_t *w, apr_int32_t head, apr_uint32_t n)
{
    apr_int32_t mid = head, before = NONE, out = NONE, *tail = &out;
    apr_uint32_t i;

    if (n < 2) {
        return head;
    }
    for (i = 0; i < n / 2; i++) {
        before = mid;
        mid = w[mid].next;
    }
    w[before].next = NONE;
    head = sort_waiting(w, head, n / 2);
    mid = sort_waiting(w, mid, n - n / 2);
    while (head != NONE && mid != NONE) {
        apr_int32_t *from = queue_before(&w[mid], &w[head]) ? &mid : &head;

        *tail = *from;
        tail = &w[*from].next;
        *from = w[*from].next;
    }
    *tail = head != NONE ? head : mid;
    return out;
}

/* A hand-off to a waiter that left without the lock (W_LEFT), or was seen
 * to have left (W_GONE): the waiter was told it was refused, so a slot
 * already filled in its name goes back (the free list is rebuilt after). */
static void undo_handoff(at_zone_t *z, apr_int32_t wi)
{
    at_waiter_t *w = &waiters(z)[wi];
    at_slot_t *s;

    if (w->slot < 0 || (apr_uint32_t)w->slot >= z->nslots) {
        return;
    }
    s = &slots(z)[w->slot];
    if (s->owner.pid != 0 && s->ticket == w->ticket && at_owner_same(&s->owner, &w->owner)) {
        s->owner.pid = 0;
        s->ticket = 0;
        s->released = 0;
    }
    w->slot = NONE;
}

/* A hand-off that a dying process started: the waiter's record names the
 * slot, so the slot is written from it (whatever part of it was written
 * already) and the waiter is granted. The slot was free when the hand-off
 * took it, so this never puts the zone over its cap. */
static void complete_handoff(at_zone_t *z, apr_int32_t wi, apr_int64_t now)
{
    at_waiter_t *w = &waiters(z)[wi];
    apr_int32_t st = W_WAITING;

    if (w->slot < 0 || (apr_uint32_t)w->slot >= z->nslots) {
        w->slot = NONE; /* not a slot: the waiter queues again */
        return;
    }
    zone_slot_fill(z, w->slot, &w->owner, w->ticket, &w->client, now);
    /* its deadline may pass while the repair runs: it then leaves without
     * the lock (W_LEFT) and was told it was refused */
    if (!zone_waiter_cas(w, &st, W_GRANTED)) {
        undo_handoff(z, wi);
        return;
    }
    zone_wake_word(&w->wake);
}

/* A process died holding the lock: rebuild everything derived from the
 * records, finishing any hand-off that had got as far as naming its slot,
 * and undoing one whose waiter had left. */
static void zone_repair(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    apr_int64_t now = at_now_us();
    apr_int32_t waiting = NONE, next;
    apr_uint32_t i, n = 0;

    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (i = 0; i < z->nwaiters; i++) {
        if (w[i].state == W_WAITING && w[i].slot != NONE) {
            complete_handoff(z, (apr_int32_t)i, now);
        }
        else if ((w[i].state == W_LEFT || w[i].state == W_GONE) && w[i].slot != NONE) {
            undo_handoff(z, (apr_int32_t)i);
        }
    }
    zone_rebuild_free_slots(z);
    z->free_waiter = NONE;
    z->qhead = z->qtail = z->watcher = NONE;
    note_change(z);
    z->queued = 0;
    memset(z->queued_at, 0, sizeof(z->queued_at));
    z->over_cap = 0;
    for (i = z->nwaiters; i-- > 0;) {
        if (w[i].state == W_WAITING) {
            w[i].next = waiting;
            waiting = (apr_int32_t)i;
            n++;
        }
        else if (w[i].state == W_FREE) {
            zone_waiter_link_free(z, (apr_int32_t)i);
        }
        else if (w[i].state == W_OVER_CAP || w[i].state == W_OVER_ENDED) {
            z->over_cap++; /* an ended one's count goes back at the tidy */
        }
        else if (w[i].state == W_LEFT) {
            zone_waiter_move(&w[i], W_GONE); /* the queue is rebuilt without it */
        }
        else if (w[i].state == W_GRANTED || w[i].state == W_EVICTED) {
            zone_wake_word(&w[i].wake); /* the dead holder's wake-up may not have gone */
        }
    }
    for (waiting = sort_waiting(w, waiting, n); waiting != NONE; waiting = next) {
        next = w[waiting].next;
        zone_queue_push(z, waiting);
    }
    if (z->watcher != NONE) {
        zone_wake_word(&w[z->watcher].wake); /* to learn it watches */
    }
    zone_recount_clients(z);
    zone_body_recount(z);
    /* the tidy that follows frees what was left without the lock, though
     * the dead holder may have cleared the mark in the middle of its own */
    __atomic_store_n(&z->left, 1, __ATOMIC_RELEASE);
    z->counters.lock_repairs++;
    zone_dispatch(z);
}

#ifdef AT_TEST_HOOKS
/* bench/scale times how long the lock is held, from taking it (a repair
 * included) to letting it go. */
void (*at_test_lock_held_hook)(apr_int64_t ns);
static __thread apr_int64_t lock_taken_ns;

static apr_int64_t clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (apr_int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
/* Whether this thread holds a zone's lock: a scrape's walks are counted
 * against it. */
static __thread int holding;

int zone_test_holding_lock(void)
{
    return holding;
}
#define NOTE_LOCK_TAKEN() \
    (holding = 1, at_test_lock_held_hook ? (void)(lock_taken_ns = clock_ns()) : (void)0)
#define NOTE_LOCK_LET_GO() \
    (holding = 0,   \
     at_test_lock_held_hook ? at_test_lock_held_hook(clock_ns() - lock_taken_ns) : (void)0)
#else
#define NOTE_LOCK_TAKEN() ((void)0)
#define NOTE_LOCK_LET_GO() ((void)0)
#endif

/* A repair made by this thread, logged once the lock is let go: a stalled
 * logger must not stall the zone. */
static __thread struct {
    const at_zone_t *z;
    apr_uint32_t active, queued;
} repaired;

static void log_repair_after_unlock(void)
{
    if (repaired.z) {
        at_log(LOG_WARNING, "zone %s: a process died holding the lock; zone state "
               "rebuilt (active %u, queued %u)", repaired.z->name, repaired.active,
               repaired.queued);
        repaired.z = NULL;
    }
}

static int zone_lock_result(at_zone_t *z, int rc)
{
    if (rc == 0 || rc == EOWNERDEAD) {
        NOTE_LOCK_TAKEN();
    }
    if (rc == EOWNERDEAD) {
        zone_repair(z);
        pthread_mutex_consistent(&z->lock);
        repaired.z = z;
        repaired.active = z->active;
        repaired.queued = z->queued;
        return 0;
    }
    if (rc != 0 && rc != EBUSY && rc != ETIMEDOUT) {
        at_log(LOG_ERR, "zone %s: cannot take the lock: %s", z->name, strerror(rc));
        apr_atomic_set32(&z->lock_broken, 1);
    }
    return rc;
}

/* Lock held: frees the records whose waiters left without the lock, and
 * the slots and bodies let go without it. */
static void tidy_left(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    at_slot_t *s = slots(z);

    for (apr_uint32_t i = 0; i < z->nslots; i++) {
        if (s[i].owner.pid != 0 && __atomic_load_n(&s[i].released, __ATOMIC_ACQUIRE)) {
            zone_slot_put(z, (apr_int32_t)i);
        }
    }

    for (apr_int32_t i = 0; i < AT_BODY_RECORDS; i++) {
        if (z->body[i].owner.pid != 0
            && __atomic_load_n(&z->body[i].released, __ATOMIC_ACQUIRE)) {
            zone_body_free(z, i);
        }
    }

    for (apr_uint32_t i = 0; i < z->nwaiters; i++) {
        apr_int32_t st = __atomic_load_n(&w[i].state, __ATOMIC_ACQUIRE);

        if (st == W_LEFT) {
            zone_waiter_leave_queue(z, (apr_int32_t)i);
        }
        else if (st == W_TAKEN) {
            z->counters.admitted++; /* the slot is its waiter's */
        }
        else if (st == W_DROP) {
            zone_slot_put(z, w[i].slot);
            /* atomic: a waiter may count one without the lock */
            __atomic_add_fetch(&z->counters.aborted, 1, __ATOMIC_RELAXED);
        }
        else if (st == W_OVER_ENDED) {
            z->over_cap--;
        }
        else if (st != W_GONE) {
            continue;
        }
        zone_waiter_free(z, (apr_int32_t)i);
    }
    zone_dispatch(z);
}

/* The new holder catches up: it tidies the records that waiters left
 * without the lock, and applies a configuration published since. */
static int catch_up_on_lock(at_zone_t *z, int rc)
{
    if (rc == 0) {
        /* a load first: the common case writes nothing */
        if (__atomic_load_n(&z->left, __ATOMIC_RELAXED)
            && __atomic_exchange_n(&z->left, 0, __ATOMIC_ACQ_REL)) {
            tidy_left(z);
        }
        zone_apply_published_conf(z);
    }
    return rc;
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_lock_count;
#define COUNT_LOCK() __atomic_add_fetch(&at_test_lock_count, 1, __ATOMIC_RELAXED)
#else
#define COUNT_LOCK() ((void)0)
#endif

/* For the server's parent, which must never wait on a child: EBUSY if the
 * lock is held (by a process that may be stopped or hung). */
int zone_trylock(at_zone_t *z)
{
    return catch_up_on_lock(z, zone_lock_result(z, pthread_mutex_trylock(&z->lock)));
}

/* Waits for the lock until the monotonic time until_us (at_now_us's clock):
 * ETIMEDOUT past it. A request never waits for the lock longer than it may
 * wait at all, whatever the holder is doing (stopped, in a debugger, frozen
 * with its cgroup). */
int zone_lock_until(at_zone_t *z, apr_int64_t until_us)
{
    struct timespec ts;
    int rc;

    COUNT_LOCK();
    ts.tv_sec = (time_t)(until_us / 1000000);
    ts.tv_nsec = (long)(until_us % 1000000) * 1000;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    rc = pthread_mutex_clocklock(&z->lock, CLOCK_MONOTONIC, &ts);
#else
    {
        struct timespec real;
        apr_int64_t left = until_us - at_now_us();

        clock_gettime(CLOCK_REALTIME, &real);
        left = left > 0 ? left : 0;
        ts.tv_sec = real.tv_sec + (time_t)(left / 1000000);
        ts.tv_nsec = real.tv_nsec + (long)(left % 1000000) * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        rc = pthread_mutex_timedlock(&z->lock, &ts);
    }
#endif
    return catch_up_on_lock(z, zone_lock_result(z, rc));
}

/* Lock held: what this zone runs, and of what waits the part it could
 * still run (up to the highest its limit can reach), for a successor. */
static apr_uint32_t zone_held(const at_zone_t *z)
{
    apr_uint32_t ceiling = z->limit_auto ? z->ctl.max : z->limit;
    apr_uint32_t room = ceiling > z->active ? ceiling - z->active : 0;

    return z->active + (z->queued < room ? z->queued : room);
}

void zone_unlock(at_zone_t *z)
{
    __atomic_store_n(&z->held_at_unlock, zone_held(z), __ATOMIC_RELEASE);
    NOTE_LOCK_LET_GO();
    pthread_mutex_unlock(&z->lock);
    zone_send_wakes();
    log_repair_after_unlock();
}

/* The lock could not be had in time (ETIMEDOUT), or not at all. Counted
 * without the lock, by atomic increments only. */
at_result_t zone_lock_refusal(at_zone_t *z, int rc)
{
    if (rc != ETIMEDOUT) {
        return AT_ERROR;
    }
    __atomic_add_fetch(&z->counters.rejected_locked, 1, __ATOMIC_RELAXED);
    return AT_REJECTED_LOCKED;
}

/* ---- mem= (lock held) ------------------------------------------------ */

/* Running requests younger than settle_us, which a reading may not show. */
static apr_uint32_t young_requests(void *ctx, apr_int64_t now, apr_int64_t settle_us)
{
    at_zone_t *z = ctx;
    apr_uint32_t i, n = 0;

    for (i = 0; i < z->nslots; i++) {
        const at_slot_t *s = &slots(z)[i];

        n += s->owner.pid != 0 && now - s->since_us < settle_us;
    }
    return n;
}

void zone_mem_read_before_lock(at_zone_t *z, mem_read_t *m)
{
    m->warn = 0;
    m->taken = at_memgate_take_reading(&z->mem, at_now_us(), &m->r, zone_sleep_on_word);
}

void zone_mem_apply_locked(at_zone_t *z, mem_read_t *m)
{
    if (m->taken) {
        m->warn = at_memgate_apply(&z->mem, &m->r, at_now_us(), z->active, young_requests, z);
        m->taken = 0;
    }
}

void zone_mem_after_unlock(at_zone_t *z, mem_read_t *m)
{
    if (at_memgate_landed(&z->mem, &m->r)) {
        zone_wake_all(&z->mem.landed); /* those waiting for this reading */
    }
    if (m->warn) {
        m->warn = 0;
        at_log(LOG_WARNING, "zone %s: cannot read the available memory (/proc/meminfo, "
               "memory cgroup); mem= is not enforced", z->name);
    }
}

void zone_unlock_after_mem(at_zone_t *z, mem_read_t *m)
{
    zone_unlock(z);
    zone_mem_after_unlock(z, m);
}

#ifdef AT_TEST_HOOKS
/* The one wait for the lock with no bound: tests only. */
apr_status_t at_zone_debug_take_lock(at_zone_t *z)
{
    int rc = catch_up_on_lock(z, zone_lock_result(z, pthread_mutex_lock(&z->lock)));

    return rc == 0 ? APR_SUCCESS : APR_EGENERAL;
}

void at_zone_debug_release_lock(at_zone_t *z)
{
    zone_unlock(z);
}

apr_status_t at_zone_debug_break_lock(at_zone_t *z)
{
    pid_t pid = fork();
    int status;

    if (pid < 0) {
        return APR_EGENERAL;
    }
    if (pid == 0) {
        pthread_mutex_lock(&z->lock); /* and die holding it */
        _exit(0);
    }
    waitpid(pid, &status, 0);
    if (pthread_mutex_lock(&z->lock) != EOWNERDEAD) {
        return APR_EGENERAL;
    }
    /* Unlocked without being made consistent: unusable for good. */
    pthread_mutex_unlock(&z->lock);
    return APR_SUCCESS;
}
#endif
