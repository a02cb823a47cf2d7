/*
 * A throttle zone in shared memory: who runs, who waits and who is refused.
 * A request takes a free slot at once, waits in the zone's queue (by
 * priority, FIFO within one) for a direct hand-off, or is refused; mem=
 * is a second condition on starting, read outside the lock.
 *
 * Every record names its owner process, so what a dead process held can be
 * found and given back. The records are the truth; counts, free lists and
 * queue links are derived from them and rebuilt if a process dies while it
 * holds the lock (at_zone_lock.c). Each other concern has a file of its
 * own, in layers that call only downwards (at_zone_impl.h): records, the
 * queue and who runs next (at_zone_records.c), layout and life cycle
 * (at_zone_life.c), the lock, reclaim (at_zone_reclaim.c), the figures
 * (at_zone_stats.c), waiting (at_zone_wait.c). This file is the top.
 */
#include "at_zone_impl.h"
#include "at_tuning.h"

#include <errno.h>
#include <string.h>
#include <syslog.h>

/* ---- priorities (lock held) ------------------------------------------ */

/* Waiters a request of this priority would find ahead of it. */
apr_uint32_t zone_queued_ahead(const at_zone_t *z, int priority)
{
    apr_uint32_t n = 0;
    int p;

    if (!z->queued || priority == AT_PRIORITY_MIN) {
        return z->queued;
    }
    for (p = priority; p <= AT_PRIORITY_MAX; p++) {
        n += z->queued_at[PRIO_INDEX(p)];
    }
    return n;
}

/* limit=auto: a newcomer whose turn would come after the timeout is told
 * at once. */
static int wait_predicted_too_long(const at_zone_t *z, int priority,
                                   apr_int64_t timeout_us)
{
    apr_uint64_t est;

    if (!z->limit_auto || !z->typical_service_us || !z->limit) {
        return 0;
    }
    est = ((apr_uint64_t)zone_queued_ahead(z, priority) + 1) * z->typical_service_us / z->limit;
    return est > (apr_uint64_t)timeout_us;
}

static void grant_now(at_zone_t *z, at_ticket_t *t, const at_owner_t *self,
                      const at_request_t *rq, apr_int64_t now)
{
    zone_client_add(z, rq->client);
    t->slot = zone_slot_take(z, self, t->ticket, rq->client, now);
    at_memgate_started(&z->mem);
    t->granted_us = now;
    z->counters.admitted++;
    zone_record_wait(z, 0, now);
    zone_count_grant(z, rq->priority, 0, now);
}

/* Dry run: the request runs at once, over the cap. Those running over the
 * cap stand in for the queue: with the queue's room taken, it would have
 * been refused. Each holds a record while there is one free, so that a
 * process that dies running over the cap is reclaimed like any other; the
 * count is of those records. */
static at_result_t run_over_cap(at_zone_t *z, at_ticket_t *t, int would_refuse)
{
    apr_int32_t wi = z->free_waiter;
    int room = z->over_cap < z->queue_cap;

    t->over_cap = -1; /* running over the cap, on no record */
    if (wi != NONE) {
        at_waiter_t *w = &waiters(z)[wi];

        z->free_waiter = w->next;
        w->owner = *at_owner_self();
        w->ticket = t->ticket;
        w->slot = NONE;
        zone_waiter_move(w, W_OVER_CAP);
        z->over_cap++;
        t->over_cap = wi + 1;
    }
    if (room && wi != NONE && !would_refuse) {
        z->counters.dry_run_queued++;
        return AT_DRY_RUN_QUEUED;
    }
    z->counters.dry_run_rejected++;
    return AT_DRY_RUN_REJECTED;
}

static int over_cap_record_is(const at_waiter_t *w, const at_ticket_t *t)
{
    return __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) == W_OVER_CAP
           && w->ticket == t->ticket && at_owner_same(&w->owner, at_owner_self());
}

/* Gives back what run_over_cap took, unless a reclaim has: a request with
 * no record has nothing to give back and takes no lock. One that cannot
 * get the lock in a moment marks its record ended, and the next holder
 * frees it (a reclaim cannot take it meanwhile: its owner is alive). */
static void end_over_cap(at_zone_t *z, at_ticket_t *t)
{
    apr_int32_t wi = t->over_cap - 1, st = W_OVER_CAP;
    at_waiter_t *w;
    int rc;

    t->over_cap = 0;
    if (wi < 0 || (apr_uint32_t)wi >= z->nwaiters) {
        return;
    }
    w = &waiters(z)[wi];
    if ((rc = zone_lock_until(z, at_now_us() + AT_RELEASE_LOCK_US)) == 0) {
        if (over_cap_record_is(w, t)) {
            zone_waiter_free(z, wi);
            z->over_cap--;
        }
        zone_unlock(z);
    }
    else if (rc == ETIMEDOUT && over_cap_record_is(w, t)
             && zone_waiter_cas(w, &st, W_OVER_ENDED)) {
        __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
    }
}

void at_zone_key_from_text(const at_zone_t *z, const char *text, apr_size_t n,
                           at_client_key_t *out)
{
    at_client_key_from_text(&z->clients, text, n, out);
}

static int client_at_quota(at_zone_t *z, const at_client_key_t *client)
{
    return z->per_client && at_client_count(&z->clients, client) >= z->per_client;
}

/* Nobody of this priority or higher waits (atomic reads: also a guess
 * without the lock). */
static int queue_head_below(const at_zone_t *z, int priority)
{
    apr_int32_t head = __atomic_load_n(&z->qhead, __ATOMIC_RELAXED);

    return head == NONE
           || __atomic_load_n(&waiters((at_zone_t *)z)[head].priority, __ATOMIC_RELAXED)
                  < priority;
}

/* A newcomer runs at once only if nobody of its priority or higher waits:
 * a waiter of lower priority may be held back by reserve=. */
static int slot_free_for_newcomer(const at_zone_t *z, int priority)
{
    return !__atomic_load_n(&z->replaced, __ATOMIC_ACQUIRE)
           && zone_running(z) < zone_slots_for(z, priority) && z->free_slot != NONE
           && queue_head_below(z, priority);
}

static int can_run_now(at_zone_t *z, int priority)
{
    return slot_free_for_newcomer(z, priority) && zone_mem_allows(z);
}

static void ticket_clear(at_ticket_t *t, int untimed)
{
    memset(t, 0, sizeof(*t));
    t->slot = NONE;
    t->untimed = untimed;
}

/* Refused before waiting: counted in total, for its priority, for limit=auto
 * and for retry_after=auto, unless only the share of its client or key was
 * over (per_client, per_key, rate=): one abusive client or key must not
 * make the zone look saturated, nor lengthen everyone's Retry-After. */
static at_result_t refuse_newcomer(at_zone_t *z, const at_request_t *rq, at_result_t why,
                                   apr_uint64_t *counter, apr_int64_t now)
{
    int share =
        why == AT_REJECTED_CLIENT || why == AT_REJECTED_KEY || why == AT_REJECTED_RATE;

    (*counter)++;
    zone_count_refusal(z, rq->priority, now, !share);
    if (!share) {
        at_sensor_refused(&z->sensor);
    }
    return why;
}

static apr_int32_t enqueue(at_zone_t *z, const at_ticket_t *t, const at_request_t *rq)
{
    apr_int32_t wi = z->free_waiter;
    at_waiter_t *w = &waiters(z)[wi];

    z->free_waiter = w->next;
    w->owner = *at_owner_self();
    w->ticket = t->ticket;
    w->slot = NONE;
    w->client = *rq->client;
    w->priority = rq->priority;
    zone_waiter_move(w, W_WAITING);
    zone_queue_push(z, wi);
    zone_client_add(z, rq->client);
    z->counters.queued_total++;
    return wi;
}

/* A full queue makes room for a request of higher priority than its
 * lowest: the newest waiter of the lowest priority. */
static int can_evict_for(const at_zone_t *z, int priority)
{
    apr_int32_t i = z->qtail;

    return i != NONE && waiters((at_zone_t *)z)[i].priority < priority;
}

/* That waiter is refused (it wakes to AT_REJECTED_FULL); can_evict_for()
 * said there is one. Only once the newcomer is sure to take its place:
 * else two requests would be refused. */
static void evict_for(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    apr_int32_t i = z->qtail;

    zone_waiter_leave_queue(z, i);
    if (zone_leave_waiting(&w[i], W_EVICTED)) {
        zone_wake_word(&w[i].wake);
    }
}

/* Priorities outside the range are taken as its nearest end. */
static void fill_request_defaults(at_request_t *rq, const at_zone_t *z)
{
    if (!rq->client) {
        rq->client = &at_client_nobody;
    }
    rq->priority = rq->priority < AT_PRIORITY_MIN   ? AT_PRIORITY_MIN
                   : rq->priority > AT_PRIORITY_MAX ? AT_PRIORITY_MAX
                                                    : rq->priority;
    if (rq->timeout_us <= 0) {
        rq->timeout_us = z->timeout_us;
    }
}

/* rate=: the bucket a request spends from (the zone's, or its key's;
 * NULL: no rate, or by key and the request has none) and the verdict. */
typedef struct {
    apr_int64_t *bucket;
    at_rate_verdict_t verdict;
    apr_int64_t ns, now;
} rate_turn_t;

static void judge_rate(at_zone_t *z, const at_request_t *rq, rate_turn_t *rt)
{
    int forgot = 0;

    rt->bucket = NULL;
    rt->verdict = AT_RATE_PASS;
    rt->ns = rt->now = 0;
    if (!z->rate_conf.interval_ns) {
        return; /* no rate: no clock read on the way in */
    }
    rt->now = at_now_us() * 1000;
    rt->bucket = z->rate_by_key ? at_rate_bucket(&z->rate, rq->client, rt->now, &forgot)
                                : &z->rate.tat_ns;
    z->counters.rate_forgotten += (apr_uint64_t)forgot;
    if (rt->bucket) {
        rt->verdict = at_rate_judge(&z->rate_conf, *rt->bucket, rt->now, &rt->ns);
    }
}

/* A request that runs or waits spends its share of the rate; one refused
 * spends nothing. */
static void spend_rate(at_zone_t *z, rate_turn_t *rt)
{
    if (rt->bucket) {
        at_rate_spend(&z->rate_conf, rt->bucket, rt->now);
        rt->bucket = NULL;
    }
}

/* Lock held: may a request that has to wait do so? An ask with no one to
 * ask is a caller's mistake: it is refused, where it shows, not let wait. */
static int may_wait_now(const at_request_t *rq)
{
    if (rq->may_wait == AT_WAIT_ASK) {
        return rq->wait_check && rq->wait_check();
    }
    return rq->may_wait;
}

/* Lock held; lets it go. Past rate=: the share of the request's client or
 * key, a slot now, a place in the queue, or a refusal. */
static at_result_t admit_or_queue(at_zone_t *z, at_ticket_t *t, const at_request_t *rq,
                                  rate_turn_t *rt, mem_read_t *m, at_abort_fn abort_fn,
                                  void *ctx, apr_int64_t start)
{
    apr_int32_t wi;
    at_result_t r;

    if (client_at_quota(z, rq->client)) {
        r = z->dry_run ? run_over_cap(z, t, 1) /* the client was over its share */
                       : z->keyed ? refuse_newcomer(z, rq, AT_REJECTED_KEY,
                                                    &z->counters.rejected_key, start)
                                  : refuse_newcomer(z, rq, AT_REJECTED_CLIENT,
                                                    &z->counters.rejected_client, start);
        if (z->dry_run) {
            spend_rate(z, rt);
        }
        zone_unlock_after_mem(z, m);
        return r;
    }
    if (can_run_now(z, rq->priority)) {
        spend_rate(z, rt);
        grant_now(z, t, at_owner_self(), rq, start);
        zone_unlock_after_mem(z, m);
        return AT_ADMITTED;
    }
    if (slot_free_for_newcomer(z, rq->priority)) {
        z->mem.held++; /* only memory stood in the way */
    }
    if (z->dry_run) {
        spend_rate(z, rt);
        r = run_over_cap(z, t, (int)__atomic_load_n(&z->replaced, __ATOMIC_ACQUIRE));
    }
    else if (__atomic_load_n(&z->replaced, __ATOMIC_ACQUIRE) || z->free_waiter == NONE
             || (z->queued >= z->queue_cap && !can_evict_for(z, rq->priority))) {
        r = refuse_newcomer(z, rq, AT_REJECTED_FULL, &z->counters.rejected_full, start);
    }
    else if (!may_wait_now(rq)) {
        r = refuse_newcomer(z, rq, AT_REJECTED_WORKERS, &z->counters.rejected_workers,
                            start);
    }
    else if (wait_predicted_too_long(z, rq->priority, rq->timeout_us)) {
        r = refuse_newcomer(z, rq, AT_REJECTED_PREDICTED,
                            &z->counters.rejected_predicted, start);
    }
    else {
        if (z->queued >= z->queue_cap) {
            evict_for(z);
        }
        spend_rate(z, rt);
        wi = enqueue(z, t, rq);
        zone_unlock_after_mem(z, m);
        return zone_wait_for_slot(z, t, wi, start, rq->timeout_us, abort_fn, ctx);
    }
    zone_unlock_after_mem(z, m);
    return r;
}

/* Whole seconds, rounded up, at least 1: what Retry-After says. */
static apr_uint32_t secs_from_ns(apr_int64_t ns)
{
    apr_int64_t s = (ns + APR_INT64_C(999999999)) / APR_INT64_C(1000000000);

    return s < 1 ? 1 : s > AT_RETRY_AFTER_MAX ? AT_RETRY_AFTER_MAX : (apr_uint32_t)s;
}

/* rate_delay=: the request waits its turn without the lock, holding no
 * slot and no place in the queue; 0 when its turn has come, or
 * AT_ABORTED if its client left meanwhile. */
static at_result_t wait_rate_turn(at_zone_t *z, apr_int64_t until_us, at_abort_fn abort_fn,
                                  void *ctx)
{
    apr_uint32_t word = 0; /* this process's checker moves it if the client goes */
    zone_here_t me;
    apr_int64_t now;

    zone_here_join(&me, NULL, abort_fn, ctx, &word);
    while ((now = at_now_us()) < until_us) {
        apr_uint32_t seen = __atomic_load_n(&word, __ATOMIC_SEQ_CST);
        apr_int64_t wake = until_us;

        if (zone_here_gone(&me, now, &wake)) {
            zone_here_leave(&me);
            __atomic_add_fetch(&z->counters.aborted, 1, __ATOMIC_RELAXED);
            return AT_ABORTED;
        }
        zone_sleep_on_word(&word, seen, wake - now);
    }
    zone_here_leave(&me);
    return 0;
}

static at_result_t decide(at_zone_t *z, at_ticket_t *t, const at_request_t *req,
                          at_abort_fn abort_fn, void *ctx, apr_int64_t start)
{
    at_request_t rq = *req;
    rate_turn_t rt;
    at_result_t r;
    mem_read_t m;
    int rc;

    ticket_clear(t, 0);
    fill_request_defaults(&rq, z); /* reads the zone's timeout without the lock */
    zone_mem_read_before_lock(z, &m);
    if ((rc = zone_lock_until(z, start + rq.timeout_us)) != 0) {
        zone_mem_after_unlock(z, &m);
        return zone_lock_refusal(z, rc);
    }
    zone_mem_apply_locked(z, &m);
    t->ticket = ++z->next_ticket;
    t->queue_depth = zone_queued_ahead(z, rq.priority);
    if (!slot_free_for_newcomer(z, rq.priority) && z->active >= z->limit &&
        zone_take_reclaim_if_due(z, start)) {
        zone_unlock_after_mem(z, &m);
        zone_reclaim(z, start + rq.timeout_us, 0); /* a full zone may be full of the dead */
        if ((rc = zone_lock_until(z, start + rq.timeout_us)) != 0) {
            return zone_lock_refusal(z, rc);
        }
    }
    judge_rate(z, &rq, &rt);
    if (z->dry_run && rt.verdict != AT_RATE_PASS) {
        /* a dry run never refuses nor delays: it runs now, and is counted */
        spend_rate(z, &rt);
        r = run_over_cap(z, t, rt.verdict == AT_RATE_REFUSE);
        zone_unlock_after_mem(z, &m);
        return r;
    }
    if (rt.verdict == AT_RATE_REFUSE
        || (rt.verdict == AT_RATE_WAIT && rt.ns / 1000 >= rq.timeout_us)) {
        t->retry_after = secs_from_ns(rt.ns);
        r = refuse_newcomer(z, &rq, AT_REJECTED_RATE, &z->counters.rejected_rate, start);
        zone_unlock_after_mem(z, &m);
        return r;
    }
    if (rt.verdict == AT_RATE_WAIT) {
        spend_rate(z, &rt); /* its turn is taken now */
        z->counters.rate_delayed++;
        zone_unlock_after_mem(z, &m);
        if ((r = wait_rate_turn(z, at_now_us() + rt.ns / 1000, abort_fn, ctx)) != 0) {
            return r;
        }
        if ((rc = zone_lock_until(z, start + rq.timeout_us)) != 0) {
            return zone_lock_refusal(z, rc);
        }
    }
    return admit_or_queue(z, t, &rq, &rt, &m, abort_fn, ctx, start);
}

int at_zone_looks_full(const at_zone_t *z, int priority)
{
    apr_int32_t tail;

    if (__atomic_load_n(&z->dry_run, __ATOMIC_RELAXED)
        || zone_running(z) < zone_slots_for(z, priority)
        || __atomic_load_n(&z->queued, __ATOMIC_RELAXED)
               < __atomic_load_n(&z->queue_cap, __ATOMIC_RELAXED)) {
        return 0;
    }
    tail = __atomic_load_n(&z->qtail, __ATOMIC_RELAXED);
    return tail == NONE
           || __atomic_load_n(&waiters((at_zone_t *)z)[tail].priority, __ATOMIC_RELAXED)
                  >= priority;
}

/* slot_free_for_newcomer() read without the lock (mem= aside) */
int at_zone_looks_free(const at_zone_t *z, int priority)
{
    /* a dry run never queues, and a replaced zone refuses: nothing to ask */
    return __atomic_load_n(&z->dry_run, __ATOMIC_RELAXED)
           || __atomic_load_n(&z->replaced, __ATOMIC_ACQUIRE)
           || (zone_running(z) < zone_slots_for(z, priority) && queue_head_below(z, priority));
}

/* The ticket's wait is all the time the request spent here: for the zone's
 * lock (a stopped holder can make it long) and in the queue. */
at_result_t at_zone_acquire_req(at_zone_t *z, at_ticket_t *t, const at_request_t *req,
                                at_abort_fn abort_fn, void *ctx)
{
    apr_int64_t start = at_now_us();
    at_result_t r = decide(z, t, req, abort_fn, ctx, start);

    t->wait_us = at_now_us() - start;
    return r;
}

at_result_t at_zone_acquire_now(at_zone_t *z, at_ticket_t *t)
{
    apr_int64_t now = at_now_us();
    at_result_t r = AT_REJECTED_FULL;
    int rc;

    ticket_clear(t, 1);
    if ((rc = zone_lock_until(z, now + AT_GLANCE_LOCK_US)) != 0) {
        return zone_lock_refusal(z, rc);
    }
    t->ticket = ++z->next_ticket;
    if (can_run_now(z, 0)) {
        t->slot = zone_slot_take(z, at_owner_self(), t->ticket, &at_client_nobody, now);
        at_memgate_started(&z->mem);
        t->granted_us = now;
        r = AT_ADMITTED;
    }
    else if (z->dry_run) {
        r = AT_DRY_RUN_REJECTED; /* a dry run never refuses */
    }
    zone_unlock(z);
    return r;
}

/* A request that is done waits for the lock a moment at most: a holder
 * stopped or hung must not keep it, its worker and its client's
 * connection. Past that its slot is marked let go, and the next holder
 * frees it (its service time is not counted). 0 if the lock is held. */
static int release_lock(at_zone_t *z, at_ticket_t *t)
{
    int rc = zone_lock_until(z, at_now_us() + AT_RELEASE_LOCK_US);

    if (rc == ETIMEDOUT) {
        at_slot_t *s = &slots(z)[t->slot];

        if (__atomic_load_n(&s->ticket, __ATOMIC_ACQUIRE) == t->ticket) {
            __atomic_store_n(&s->released, 1, __ATOMIC_RELEASE);
            __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
        }
        t->slot = NONE;
    }
    return rc;
}

apr_int64_t at_zone_release(at_zone_t *z, at_ticket_t *t)
{
    apr_int64_t service = -1, now;
    window_note_t note = {0};
    at_slot_t *s;
    mem_read_t m;

    if (t->over_cap) {
        end_over_cap(z, t);
        return -1;
    }
    if (t->slot == NONE) {
        return -1;
    }
    zone_mem_read_before_lock(z, &m);
    if (release_lock(z, t) != 0) {
        zone_mem_after_unlock(z, &m);
        return -1;
    }
    zone_mem_apply_locked(z, &m);
    s = &slots(z)[t->slot];
    /* The ticket tells our grant from a later one after a reclaim. */
    if (s->owner.pid != 0 && s->ticket == t->ticket) {
        now = at_now_us();
        service = now - t->granted_us;
        if (service < 0) {
            service = 0;
        }
        zone_slot_put(z, t->slot);
        if (!t->untimed) { /* an error page's time is not the zone's work */
            zone_record_service(z, service, now);
            zone_window_add_completion(z, service, now, &note);
        }
        zone_dispatch(z);
    }
    zone_unlock_after_mem(z, &m);
    zone_log_window(z, &note);
    t->slot = NONE;
    return service;
}

apr_status_t at_zone_reconfigure(at_zone_t *z, const at_zone_conf_t *c)
{
    if (!at_zone_can_hold(z, c)) {
        return APR_EINVAL;
    }
    if (zone_publish_conf(z, c) != 0) {
        return APR_EAGAIN; /* another writer is stopped in its copy: not published */
    }
    if (zone_trylock(z) != 0) {
        return APR_EBUSY; /* the holder, or the next one, applies it */
    }
    zone_unlock(z); /* taking the lock applied it */
    return APR_SUCCESS;
}

/* ---- read_body_total: the bodies' front, which takes the lock ---- */

/* Bytes for a body about to be read before its request has a slot. The
 * lock is waited for AT_BODY_LOCK_US at most: a request that cannot have
 * it in time simply does not read its body first. */
apr_int32_t at_zone_body_hold(at_zone_t *z, apr_uint64_t bytes)
{
    apr_int32_t i = NONE;

    if (!bytes || zone_lock_until(z, at_now_us() + AT_BODY_LOCK_US) != 0) {
        return 0;
    }
    if (z->free_body != NONE && bytes <= z->body_cap && z->body_held <= z->body_cap - bytes) {
        at_body_t *b;

        i = z->free_body;
        b = &z->body[i];
        z->free_body = b->next;
        b->bytes = bytes;
        b->next = NONE;
        b->owner = *at_owner_self(); /* last: a record with an owner counts */
        z->body_held += bytes;
    }
    zone_unlock(z);
    return i + 1;
}

void at_zone_body_let_go(at_zone_t *z, apr_int32_t handle)
{
    apr_int32_t i = handle - 1;

    if (i < 0 || i >= AT_BODY_RECORDS) {
        return;
    }
    if (zone_lock_until(z, at_now_us() + AT_BODY_LOCK_US) != 0) {
        /* the holder of the lock, or the next one, frees it */
        __atomic_store_n(&z->body[i].released, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&z->left, 1, __ATOMIC_RELEASE);
        return;
    }
    zone_body_free(z, i);
    zone_unlock(z);
}
