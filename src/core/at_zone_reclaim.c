/*
 * Reclaim: what processes that died (killed, crashed) held in a zone is
 * given back. Liveness is read from /proc outside the lock.
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <stdlib.h>
#include <syslog.h>

/* ---- reclaim ---------------------------------------------------------- */

/* The owners of a zone's records, copied under the lock in one pass (no
 * search there), then sorted and made unique outside it, so that a reclaim
 * costs the lock O(records log owners) however many records there are. */
typedef struct {
    at_owner_t *v;
    apr_uint32_t n, cap;
} owner_set_t;

static int cmp_owner(const void *a, const void *b)
{
    const at_owner_t *x = a, *y = b;

    if (x->pid != y->pid) {
        return x->pid < y->pid ? -1 : 1;
    }
    return x->start < y->start ? -1 : x->start > y->start;
}

static void owner_set_add(owner_set_t *set, const at_owner_t *o, apr_int32_t only_pid)
{
    if (o->pid != 0 && (!only_pid || o->pid == only_pid) && set->n < set->cap) {
        set->v[set->n++] = *o;
    }
}

static void owner_set_sort_unique(owner_set_t *set)
{
    apr_uint32_t i, n = 0;

    qsort(set->v, set->n, sizeof(*set->v), cmp_owner);
    for (i = 0; i < set->n; i++) {
        if (n == 0 || !at_owner_same(&set->v[n - 1], &set->v[i])) {
            set->v[n++] = set->v[i];
        }
    }
    set->n = n;
}

static int owner_set_has(const owner_set_t *set, const at_owner_t *o)
{
    return o->pid != 0 && set->n
           && bsearch(o, set->v, set->n, sizeof(*set->v), cmp_owner) != NULL;
}

static apr_uint32_t drop_dead_owners(at_zone_t *z, const owner_set_t *dead)
{
    at_slot_t *s = slots(z);
    at_waiter_t *w = waiters(z);
    apr_uint32_t i, n = 0;

    for (i = 0; i < z->nwaiters; i++) {
        if (w[i].state == W_FREE || !owner_set_has(dead, &w[i].owner)) {
            continue;
        }
        if (w[i].state == W_WAITING || w[i].state == W_LEFT) {
            zone_waiter_leave_queue(z, (apr_int32_t)i);
        }
        else if (w[i].state == W_OVER_CAP || w[i].state == W_OVER_ENDED) {
            z->over_cap--;
        }
        /* A granted place's slot has the same dead owner: freed below. */
        zone_waiter_free(z, (apr_int32_t)i);
        n++;
    }
    for (i = 0; i < z->nslots; i++) {
        if (owner_set_has(dead, &s[i].owner)) {
            zone_slot_put(z, (apr_int32_t)i);
            n++;
        }
    }
    for (i = 0; i < AT_BODY_RECORDS; i++) {
        if (owner_set_has(dead, &z->body[i].owner)) {
            zone_body_free(z, (apr_int32_t)i); /* bytes, not a place: not counted */
        }
    }
    z->counters.reclaimed += n;
    zone_dispatch(z);
    return n;
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_reclaim_passes;
#define COUNT_RECLAIM_PASS() __atomic_add_fetch(&at_test_reclaim_passes, 1, __ATOMIC_RELAXED)
#else
#define COUNT_RECLAIM_PASS() ((void)0)
#endif

/* Liveness is read from /proc outside the lock: collect the owners under the
 * lock, test them without it, then drop the dead ones' records. only_pid:
 * the records of that process alone (its parent saw it exit), or 0. */
/* until_us: RECLAIM_TRY (the parent: only if the lock is free), or how
 * long a request may wait for the lock. */
#define RECLAIM_TRY (-1)

/* Lock held: a pass made because the watcher's were late (its hand-over
 * wake-up may have been lost with its waker) wakes the watcher. */
static void wake_late_watcher(at_zone_t *z)
{
    if (z->watcher != NONE && zone_reclaim_late(z, at_now_us())) {
        zone_wake_word(&waiters(z)[z->watcher].wake);
    }
}

static int reclaim_lock(at_zone_t *z, apr_int64_t until_us)
{
    return until_us == RECLAIM_TRY ? zone_trylock(z) : zone_lock_until(z, until_us);
}

apr_uint32_t zone_reclaim(at_zone_t *z, apr_int64_t until_us, apr_int32_t only_pid)
{
    owner_set_t all, dead;
    apr_uint32_t i, n = 0;

    all.cap = z->nslots + z->nwaiters + AT_BODY_RECORDS;
    all.n = dead.n = 0;
    all.v = malloc(sizeof(at_owner_t) * (all.cap + 1));
    if (!all.v || reclaim_lock(z, until_us) != 0) {
        free(all.v);
        return 0;
    }
    COUNT_RECLAIM_PASS();
    if (!only_pid) {
        wake_late_watcher(z);
        z->last_reclaim_us = at_now_us();
    }
    for (i = 0; i < z->nslots; i++) {
        owner_set_add(&all, &slots(z)[i].owner, only_pid);
    }
    for (i = 0; i < z->nwaiters; i++) {
        at_waiter_t *w = &waiters(z)[i];

        if ((w->state == W_GRANTED || w->state == W_EVICTED) && !w->rewoken) {
            /* its waker lets the lock go before it wakes it, and may have
             * died in between: a wake-up again, once, as one waiter slow
             * to take its slot would else cost a wake-up every pass */
            w->rewoken = 1;
            zone_wake_word(&w->wake);
        }
        if (w->state != W_FREE) {
            owner_set_add(&all, &w->owner, only_pid);
        }
    }
    for (i = 0; i < AT_BODY_RECORDS; i++) {
        owner_set_add(&all, &z->body[i].owner, only_pid);
    }
    zone_unlock(z);

    owner_set_sort_unique(&all);
    /* the dead, in place at the front: still sorted */
    dead.v = all.v;
    dead.cap = all.n;
    for (i = 0; i < all.n; i++) {
        if (!at_owner_alive(&all.v[i])) {
            dead.v[dead.n++] = all.v[i];
        }
    }
    if (dead.n && reclaim_lock(z, until_us) == 0) {
        n = drop_dead_owners(z, &dead);
        zone_unlock(z);
        for (i = 0; i < dead.n; i++) {
            at_log(LOG_INFO, "zone %s: reclaimed what dead process %d held",
                 z->name, (int)dead.v[i].pid);
        }
    }
    free(all.v);
    return n;
}

/* A day: as long as it takes. */
#define NO_DEADLINE_US (86400LL * 1000000)

apr_uint32_t at_zone_reclaim(at_zone_t *z)
{
    return zone_reclaim(z, at_now_us() + NO_DEADLINE_US, 0);
}

apr_uint32_t at_zone_reclaim_nowait(at_zone_t *z)
{
    return zone_reclaim(z, RECLAIM_TRY, 0);
}

apr_uint32_t at_zone_reclaim_lineage_nowait(at_zone_t *z)
{
    apr_uint32_t n = 0;
    int depth = 0;

    /* the zones zone_running counts, no further */
    for (; z && depth < AT_ZONE_LINEAGE_MAX; z = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE), depth++) {
        n += zone_reclaim(z, RECLAIM_TRY, 0);
    }
    return n;
}

apr_uint32_t at_zone_reclaim_pid_nowait(at_zone_t *z, apr_int32_t pid)
{
    return pid > 0 ? zone_reclaim(z, RECLAIM_TRY, pid) : 0;
}

/* Lock held. A reclaim is due every AT_RECLAIM_INTERVAL_US; the caller
 * that finds it due takes it, so that waiters do not reclaim side by side. */
int zone_take_reclaim_if_due(at_zone_t *z, apr_int64_t now)
{
    if (now - z->last_reclaim_us < AT_RECLAIM_INTERVAL_US) {
        return 0;
    }
    z->last_reclaim_us = now;
    return 1;
}

/* ---- a zone replaced at a restart ---------------------------------------- */

/* The parent marks the old zone without waiting for its lock, and has its
 * count published by taking the lock only if it is free. */
void at_zone_succeed(at_zone_t *z, at_zone_t *old)
{
    __atomic_store_n(&old->replaced, 1, __ATOMIC_SEQ_CST); /* before the trylock's read */
    if (zone_trylock(old) == 0) {
        zone_unlock(old); /* its count published, the mark seen by every later holder */
    }
    else {
        /* a holder (stopped, or mid-admission) may let one more in before
         * it sees the mark; the next unlock after this one publishes the
         * exact count (till then the successor counts one too many) */
        __atomic_add_fetch(&old->held_at_unlock, 1, __ATOMIC_ACQ_REL);
    }
    __atomic_store_n(&z->predecessor, old, __ATOMIC_RELEASE);
}
