/*
 * A zone's records: slots and waiting records with their free lists, the
 * queue in priority order, per-client counts, the futex word a waiter
 * sleeps on, the bodies read before a slot (read_body_total), and who runs
 * next. The lock is held throughout, except to wake and sleep. The bottom
 * of the zone: it calls no other zone file (the bodies' front, which takes
 * the lock, is at_zone.c's).
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#ifdef AT_TEST_HOOKS
void (*at_test_step_hook)(int where, int step);
#endif

/* ---- requests per client (lock held): counted while per_client is set -- */

void zone_client_add(at_zone_t *z, const at_client_key_t *k)
{
    if (z->per_client) {
        at_client_add(&z->clients, k);
    }
}

void zone_client_remove(at_zone_t *z, const at_client_key_t *k)
{
    if (z->per_client) {
        at_client_remove(&z->clients, k);
    }
}

/* The records are the truth: recount from them. */
void zone_recount_clients(at_zone_t *z)
{
    apr_uint32_t i;

    at_client_table_clear(&z->clients);
    for (i = 0; i < z->nslots; i++) {
        if (slots(z)[i].owner.pid != 0) {
            zone_client_add(z, &slots(z)[i].client);
        }
    }
    for (i = 0; i < z->nwaiters; i++) {
        if (waiters(z)[i].state == W_WAITING) {
            zone_client_add(z, &waiters(z)[i].client);
        }
    }
}

/* ---- waking one waiter ---------------------------------------------- */

static void futex_wake(apr_uint32_t *word, int n)
{
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
#else
    (void)word;
    (void)n;
#endif
}

/* A waiter's word moves under the lock; the wake-up itself is sent once
 * the lock is let go (zone_send_wakes): on a busy core the woken thread
 * can take the CPU from its waker, which would then hold the lock,
 * descheduled, while every other process of the zone waits for it. A
 * wake-up sent late to a record reused meanwhile is a spurious one, which
 * a waiter sleeps through. */
#define DEFERRED_WAKES 64
static __thread apr_uint32_t *deferred_wakes[DEFERRED_WAKES];
static __thread int ndeferred_wakes;

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_wakes;
#define COUNT_WAKE() __atomic_add_fetch(&at_test_wakes, 1, __ATOMIC_RELAXED)
#else
#define COUNT_WAKE() ((void)0)
#endif

void zone_wake_word(apr_uint32_t *word)
{
    COUNT_WAKE();
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
    if (ndeferred_wakes < DEFERRED_WAKES) {
        deferred_wakes[ndeferred_wakes++] = word;
        return;
    }
    futex_wake(word, 1);
}

void zone_send_wakes(void)
{
    AT_STEP(AT_STEP_WAKES, ndeferred_wakes);
    for (int i = 0; i < ndeferred_wakes; i++) {
        futex_wake(deferred_wakes[i], 1);
    }
    ndeferred_wakes = 0;
}

void zone_wake_all(apr_uint32_t *word)
{
    futex_wake(word, INT_MAX);
}

void zone_sleep_on_word(apr_uint32_t *word, apr_uint32_t seen,
                        apr_int64_t us)
{
    struct timespec ts;

    if (us <= 0) {
        return;
    }
#ifdef __linux__
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000;
    /* Not FUTEX_PRIVATE: the word is shared between processes. */
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
    (void)word;
    (void)seen;
    ts.tv_sec = 0;
    ts.tv_nsec = (us < 1000 ? us : 1000) * 1000;
    nanosleep(&ts, NULL);
#endif
}

/* ---- free lists and the queue (lock held) --------------------------- */

void zone_rebuild_free_slots(at_zone_t *z)
{
    at_slot_t *s = slots(z);
    apr_int32_t i;

    note_change(z);
    z->free_slot = NONE;
    z->active = 0;
    for (i = (apr_int32_t)z->nslots - 1; i >= 0; i--) {
        if (s[i].owner.pid == 0) {
            s[i].next_free = z->free_slot;
            z->free_slot = i;
        }
        else {
            z->active++;
        }
    }
}

static void queue_length_changed(at_zone_t *z)
{
    if (z->codel.target_us) {
        at_codel_queue_is(&z->codel, z->queued, at_now_us());
    }
}

/* Behind every waiter of its priority or higher, ahead of the lower ones:
 * the queue stays in priority order, FIFO within a priority. */
void zone_queue_push(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = waiters(z);
    apr_int32_t after = z->qtail;

    note_change(z);
    while (after != NONE && w[after].priority < w[i].priority) {
        after = w[after].prev;
    }
    w[i].prev = after;
    w[i].next = after != NONE ? w[after].next : z->qhead;
    if (w[i].next != NONE) {
        w[w[i].next].prev = i;
    }
    else {
        z->qtail = i;
    }
    if (after != NONE) {
        w[after].next = i;
    }
    else {
        z->qhead = i;
    }
    z->queued++;
    z->queued_at[PRIO_INDEX(w[i].priority)]++;
    if (z->watcher == NONE) {
        z->watcher = i; /* it sees so before it sleeps */
    }
    queue_length_changed(z);
}

void zone_queue_unlink(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = waiters(z);

    note_change(z);
    if (w[i].prev != NONE) {
        w[w[i].prev].next = w[i].next;
    }
    else {
        z->qhead = w[i].next;
    }
    if (w[i].next != NONE) {
        w[w[i].next].prev = w[i].prev;
    }
    else {
        z->qtail = w[i].prev;
    }
    z->queued--;
    z->queued_at[PRIO_INDEX(w[i].priority)]--;
    if (z->watcher == i) {
        /* The newest waiter takes over, woken to learn it: in FIFO order it
         * is the last to leave, so the role rarely moves. */
        z->watcher = z->qtail;
        if (z->qtail != NONE) {
            zone_wake_word(&w[z->qtail].wake);
        }
    }
    queue_length_changed(z);
}

/* A waiter leaves the queue without a slot: timeout, abort or death. */
void zone_waiter_leave_queue(at_zone_t *z, apr_int32_t i)
{
    zone_queue_unlink(z, i);
    zone_client_remove(z, &waiters(z)[i].client);
}

void zone_waiter_free(at_zone_t *z, apr_int32_t i)
{
    zone_waiter_move(&waiters(z)[i], W_FREE);
    zone_waiter_link_free(z, i);
}

void zone_waiter_link_free(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = &waiters(z)[i];

    w->owner.pid = 0;
    w->slot = NONE;
    w->rewoken = 0;
    w->next = z->free_waiter;
    z->free_waiter = i;
}

/* The request's count against its client moves with it, from its waiting
 * record to its slot; it is dropped when it leaves either. */
apr_int32_t zone_slot_pop_free(at_zone_t *z)
{
    apr_int32_t i = z->free_slot;

    z->free_slot = slots(z)[i].next_free;
    return i;
}

/* The owner goes last: a slot with an owner is taken, so a process that
 * dies half way leaves either a free slot or a whole record. */
void zone_slot_fill(at_zone_t *z, apr_int32_t i, const at_owner_t *owner,
                    apr_uint64_t ticket, const at_client_key_t *client, apr_int64_t now)
{
    at_slot_t *s = &slots(z)[i];

    s->ticket = ticket;
    s->released = 0;
    AT_STEP(AT_STEP_SLOT_FILL, 1);
    s->since_us = now;
    s->client = *client;
    AT_STEP(AT_STEP_SLOT_FILL, 2);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    s->owner = *owner;
    AT_STEP(AT_STEP_SLOT_FILL, 3);
    note_change(z);
    z->active++;
}

apr_int32_t zone_slot_take(at_zone_t *z, const at_owner_t *owner,
                           apr_uint64_t ticket, const at_client_key_t *client,
                           apr_int64_t now)
{
    apr_int32_t i = zone_slot_pop_free(z);

    zone_slot_fill(z, i, owner, ticket, client, now);
    return i;
}

void zone_slot_put(at_zone_t *z, apr_int32_t i)
{
    at_slot_t *s = &slots(z)[i];

    note_change(z);
    if (z->mem.bytes) {
        at_memgate_ended(&z->mem, at_now_us() - s->since_us);
    }
    zone_client_remove(z, &s->client);
    s->owner.pid = 0;
    s->ticket = 0;
    s->released = 0;
    s->next_free = z->free_slot;
    z->free_slot = i;
    z->active--;
}

/* Lock held, the record out of the queue: moves a waiting record on,
 * unless its waiter left without the lock first (then it is W_GONE, for the
 * tidy, and 0 is returned). */
int zone_leave_waiting(at_waiter_t *w, apr_int32_t to)
{
    apr_int32_t was = W_WAITING;

    if (zone_waiter_cas(w, &was, to)) {
        return 1;
    }
    zone_waiter_move(w, W_GONE); /* it was W_LEFT: only its waiter moves it unlocked */
    return 0;
}

/* ---- read_body_total: bodies held by requests without a slot ---------- */

void zone_body_free(at_zone_t *z, apr_int32_t i)
{
    at_body_t *b = &z->body[i];

    z->body_held -= b->bytes < z->body_held ? b->bytes : z->body_held;
    b->owner.pid = 0;
    b->bytes = 0;
    __atomic_store_n(&b->released, 0, __ATOMIC_RELAXED);
    b->next = z->free_body;
    z->free_body = i;
}

void zone_body_recount(at_zone_t *z)
{
    apr_uint64_t held = 0;

    z->free_body = NONE;
    for (apr_int32_t i = AT_BODY_RECORDS - 1; i >= 0; i--) {
        at_body_t *b = &z->body[i];

        if (b->owner.pid == 0) {
            b->bytes = 0;
            b->next = z->free_body;
            z->free_body = i;
        }
        else {
            held += b->bytes;
        }
    }
    z->body_held = held;
}

apr_uint64_t at_zone_body_held(const at_zone_t *z)
{
    return __atomic_load_n(&z->body_held, __ATOMIC_RELAXED);
}

/* ---- who runs next (lock held) ------------------------------------- */

/* Requests running against this zone's limit: its own, and those still
 * running or waiting in the zones it replaced at restarts, until they end
 * (a replaced zone runs what waits there under its own limit). */
apr_uint32_t zone_running(const at_zone_t *z)
{
    apr_uint32_t n = __atomic_load_n(&z->active, __ATOMIC_RELAXED);
    int depth = 0;

    for (z = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE); z && depth < AT_ZONE_LINEAGE_MAX - 1;
         z = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE), depth++) {
        n += __atomic_load_n(&z->held_at_unlock, __ATOMIC_ACQUIRE);
    }
    return n;
}

/* Judged at this moment: a reading that was fresh before a long wait for
 * the lock is not any more. A zone without mem= reads no clock for it:
 * this is on every request's path. */
int zone_mem_allows(at_zone_t *z)
{
    return !z->mem.bytes || at_memgate_estimate(&z->mem, at_now_us());
}

/* The slots a request of this priority may fill: reserve= keeps the last
 * ones for priorities above 0, and always leaves one for the rest. */
apr_uint32_t zone_slots_for(const at_zone_t *z, int priority)
{
    apr_uint32_t keep = z->reserve;

    if (priority > 0 || !keep) {
        return z->limit;
    }
    if (keep >= z->limit) {
        keep = z->limit ? z->limit - 1 : 0;
    }
    return z->limit - keep;
}

/* Who runs next: the head of the queue (the oldest of the highest
 * priority waiting), or with order=lifo while the queue stands the newest
 * of that priority, the last before the queue's priority drops. */
static apr_int32_t next_to_run(const at_zone_t *z, apr_int64_t now)
{
    const at_waiter_t *w = waiters((at_zone_t *)z);
    apr_int32_t i = z->qhead;

    if (z->order != AT_ORDER_LIFO || i == NONE
        || at_codel_standing_for(&z->codel, now, z->typical_service_us) == 0) {
        return i;
    }
    while (w[i].next != NONE && w[w[i].next].priority == w[z->qhead].priority) {
        i = w[i].next;
    }
    return i;
}

/* Hand free capacity to the oldest waiters, one wake-up each. The waiter's
 * record names its slot before the slot names its owner, and the grant
 * comes last: a process that dies anywhere in between leaves a hand-off
 * that zone_repair completes from the waiter's record. */
void zone_dispatch(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    apr_int64_t now = at_now_us();

    while (z->qhead != NONE && zone_running(z) < zone_slots_for(z, w[z->qhead].priority) &&
           z->free_slot != NONE && zone_mem_allows(z)) {
        apr_int32_t i = next_to_run(z, now), slot;

        zone_queue_unlink(z, i);
        AT_STEP(AT_STEP_DISPATCH, 1);
        slot = zone_slot_pop_free(z);
        AT_STEP(AT_STEP_DISPATCH, 2);
        w[i].slot = slot;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        AT_STEP(AT_STEP_DISPATCH, 3);
        zone_slot_fill(z, slot, &w[i].owner, w[i].ticket, &w[i].client, now);
        at_memgate_started(&z->mem);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        AT_STEP(AT_STEP_DISPATCH, 4);
        if (!zone_leave_waiting(&w[i], W_GRANTED)) {
            AT_STEP(AT_STEP_DISPATCH, 6);
            zone_slot_put(z, slot); /* its waiter left meanwhile: the slot goes on */
            continue;
        }
        AT_STEP(AT_STEP_DISPATCH, 5);
        zone_wake_word(&w[i].wake);
    }
}

#ifdef AT_CHECK_WAITER_MOVES
static const char *waiter_state_name(apr_int32_t s)
{
    static const char *const names[W_STATES] = {
        "W_FREE", "W_WAITING", "W_GRANTED", "W_EVICTED", "W_OVER_CAP",
        "W_LEFT", "W_GONE", "W_TAKEN", "W_DROP", "W_OVER_ENDED"};

    return s >= 0 && s < W_STATES ? names[s] : "(not a state)";
}

/* Also on stderr (httpd's error log): with no logger installed, as in the
 * unit tests, the line would be lost with the process. */
void zone_waiter_bad_move(apr_int32_t from, apr_int32_t to)
{
    static const char fmt[] = "zone: a waiting record moved from %s to %s, which its "
                              "table of states forbids";

    at_log(LOG_CRIT, fmt, waiter_state_name(from), waiter_state_name(to));
    fprintf(stderr, fmt, waiter_state_name(from), waiter_state_name(to));
    fputc('\n', stderr);
    abort();
}
#endif
