/*
 * Waiting: a queued request sleeps on its record's futex word without the
 * lock until it is handed a slot, evicted, its deadline passes (CoDel's or
 * its own) or its client goes; one that cannot get the lock in time leaves
 * without it.
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <errno.h>

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
    apr_int32_t st = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE);
    apr_int32_t to = st == W_WAITING ? W_LEFT : st == W_GRANTED ? keep : W_GONE;

    while (!__atomic_compare_exchange_n(&w->state, &st, to, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
        to = st == W_WAITING ? W_LEFT : st == W_GRANTED ? keep : W_GONE;
    }
    __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
    if (to == W_TAKEN) {
        t->slot = w->slot;
        t->granted_us = at_now_us();
        return AT_QUEUED;
    }
    if (refused != AT_ABORTED) {
        __atomic_add_fetch(&z->counters.rejected_locked, 1, __ATOMIC_RELAXED);
    }
    return refused;
}

/* A waiter sleeps without the lock until something it must act on under the
 * lock may have happened: a hand-off or eviction (its wake word moves; the
 * state is published before it), its deadline (CoDel's, read here as a
 * hint: the lock decides), a reclaim falling due, or, at the head of a queue
 * held back by memory, a slice gone by. 1 if its client has gone. */
static int wait_unlocked(at_zone_t *z, at_waiter_t *w, apr_int32_t wi, apr_uint32_t seen,
                         apr_int64_t start, apr_int64_t full_deadline,
                         at_abort_fn abort_fn, void *ctx)
{
    for (;;) {
        apr_int64_t now, deadline, slice;
        int head;

        if (abort_fn && abort_fn(ctx)) {
            return 1;
        }
        now = at_now_us();
        deadline = at_codel_deadline(&z->codel, start, full_deadline, now,
                                     __atomic_load_n(&z->typical_service_us, __ATOMIC_RELAXED));
        /* The head of the queue looks for the dead every interval, the
         * others every fourth, in case the head is the one that died. */
        head = __atomic_load_n(&z->qhead, __ATOMIC_RELAXED) == wi;
        if (now >= deadline || __atomic_load_n(&w->wake, __ATOMIC_ACQUIRE) != seen
            || __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != W_WAITING
            || now - __atomic_load_n(&z->last_reclaim_us, __ATOMIC_RELAXED)
                   >= AT_RECLAIM_INTERVAL_US * (head ? 1 : 4)) {
            return 0;
        }
        slice = deadline - now < AT_WAIT_SLICE_US ? deadline - now : AT_WAIT_SLICE_US;
        zone_sleep_on_word(&w->wake, seen, slice);
        if (head && (z->mem.bytes
                     || zone_running(z) < __atomic_load_n(&z->limit, __ATOMIC_RELAXED))) {
            return 0; /* memory, or a replaced zone, made room without a release here */
        }
    }
}

at_result_t zone_wait_for_slot(at_zone_t *z, at_ticket_t *t, apr_int32_t wi,
                               apr_int64_t start, apr_int64_t timeout_us,
                               at_abort_fn abort_fn, void *ctx)
{
    at_waiter_t *w = &waiters(z)[wi];
    apr_int64_t full_deadline = start + timeout_us, deadline = full_deadline;

    for (;;) {
        apr_int64_t now;
        apr_uint32_t seen;
        int gave_up = 0, do_reclaim, rc;
        mem_read_t m;

        zone_mem_read_before_lock(z, &m);
        if ((rc = zone_lock_until(z, full_deadline)) != 0) {
            return rc == ETIMEDOUT ? leave_without_lock(z, w, t, AT_REJECTED_LOCKED)
                                   : AT_ERROR;
        }
        zone_mem_apply_locked(z, &m);
        now = at_now_us();
        if (z->qhead == wi) {
            zone_dispatch(z); /* memory, or a replaced zone, frees without a release here */
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
            zone_reclaim(z, full_deadline, 0);
            continue;
        }
        gave_up = wait_unlocked(z, w, wi, seen, start, full_deadline, abort_fn, ctx);
        if (gave_up) {
            if ((rc = zone_lock_until(z, full_deadline)) != 0) {
                return rc == ETIMEDOUT ? leave_without_lock(z, w, t, AT_ABORTED) : AT_ERROR;
            }
            if (w->state == W_GRANTED) {
                zone_slot_put(z, w->slot); /* granted as the client left */
                zone_dispatch(z);
            }
            else if (w->state == W_WAITING) {
                zone_waiter_leave_queue(z, wi);
            }
            zone_waiter_free(z, wi);
            z->counters.aborted++;
            zone_unlock(z);
            return AT_ABORTED;
        }
    }
}
