/*
 * The inside of a throttle zone, shared by the files that make it up
 * (at_zone*.c) and by nothing else: the records and the zone's layout in
 * shared memory, and the steps one file takes for another. Every function
 * here expects the zone's lock held unless its comment says otherwise.
 */
#ifndef AT_ZONE_IMPL_H
#define AT_ZONE_IMPL_H

#include "at_zone.h"
#include "at_limit.h"
#include "at_memgate.h"
#include "at_owner.h"
#include "at_retry.h"
#include "at_sensor.h"
#include "at_tuning.h"

#include <pthread.h>

/* A zone: "ATZ" and the layout's generation. A zone kept across a restart
 * onto a build with another layout (zone_layout(), from the structures
 * themselves) is laid anew. */
#define ZONE_MAGIC 0x41545a40u
#define NONE (-1)

/* A waiting record's states: the one table of what each means, who moves
 * it on, and to which states. Every change goes through zone_waiter_move or
 * zone_waiter_cas (at_zone_records.c), which check it against this table in
 * the builds with test hooks and in the ASan build. A change made under the
 * lock is a plain store; the waiter's own changes without the lock (it
 * could not get it by its deadline) are compare-and-swaps, counted in
 * z->left so that the next holder tidies them. */
enum { W_FREE = 0, W_WAITING, W_GRANTED, W_EVICTED, W_OVER_CAP, W_LEFT, W_GONE, W_TAKEN,
       W_DROP, W_OVER_ENDED, W_STATES };

#define W_BIT(s) (1u << (s))

static inline int zone_waiter_may_move(apr_int32_t from, apr_int32_t to)
{
    static const unsigned short next[W_STATES] = {
        /* W_FREE: on the free list, no request. A request joining the queue
         * takes it (enqueue), or a dry run's request running over the cap
         * (run_over_cap); both under the lock. */
        [W_FREE] = W_BIT(W_WAITING) | W_BIT(W_OVER_CAP),
        /* W_WAITING: in the queue, its waiter asleep on the wake word. Whoever
         * frees capacity hands it a slot (zone_dispatch), or lock repair
         * finishes that hand-off; a newcomer of higher priority evicts it
         * from a full queue (evict_for); its waiter leaves at its deadline,
         * CoDel's or when its client goes (W_FREE), or without the lock
         * (W_LEFT); reclaim frees it when its process died. */
        [W_WAITING] = W_BIT(W_GRANTED) | W_BIT(W_EVICTED) | W_BIT(W_LEFT) | W_BIT(W_FREE),
        /* W_GRANTED: out of the queue, a slot filled in its name, its waiter
         * woken. The waiter collects it (or gives the slot back if its
         * client left), or keeps it without the lock (W_TAKEN), or drops it
         * without the lock as its client left (W_DROP); reclaim frees it. */
        [W_GRANTED] = W_BIT(W_FREE) | W_BIT(W_TAKEN) | W_BIT(W_DROP),
        /* W_EVICTED: out of the queue, refused; the record is its waiter's
         * until it wakes and sees it, under the lock or without it (W_GONE);
         * reclaim frees it. */
        [W_EVICTED] = W_BIT(W_FREE) | W_BIT(W_GONE),
        /* W_OVER_CAP: a dry run's request running beyond the limit, so that
         * its count goes back when its process dies. It ends under the lock
         * (W_FREE) or without it (W_OVER_ENDED); reclaim frees it. */
        [W_OVER_CAP] = W_BIT(W_FREE) | W_BIT(W_OVER_ENDED),
        /* W_LEFT: its waiter gave up without the lock while still queued;
         * the record is still in the queue. The next holder's tidy takes it
         * out (W_FREE); a dispatch or eviction that reaches it first, or
         * lock repair, marks it out of the queue (W_GONE); reclaim frees
         * it. */
        [W_LEFT] = W_BIT(W_FREE) | W_BIT(W_GONE),
        /* W_GONE: out of the queue, its waiter gone without the lock (left
         * or evicted). The next holder's tidy frees it, or reclaim. */
        [W_GONE] = W_BIT(W_FREE),
        /* W_TAKEN: granted, and its waiter took the slot without the lock.
         * The tidy counts it admitted and frees the record; reclaim too. */
        [W_TAKEN] = W_BIT(W_FREE),
        /* W_DROP: granted, but its waiter's client had gone and it could
         * not get the lock: the tidy gives the slot back; reclaim too. */
        [W_DROP] = W_BIT(W_FREE),
        /* W_OVER_ENDED: a W_OVER_CAP request ended without the lock: the
         * tidy gives its count back and frees it; reclaim too. */
        [W_OVER_ENDED] = W_BIT(W_FREE),
    };

    return from >= 0 && from < W_STATES && to >= 0 && to < W_STATES
           && (next[from] & W_BIT(to)) != 0;
}

typedef struct {
    at_owner_t owner;       /* pid 0: free */
    apr_uint64_t ticket;
    apr_int64_t since_us;
    apr_int32_t next_free;
    apr_int32_t released; /* let go without the lock: the next holder frees it */
    at_client_key_t client;
    unsigned char client_pad[7]; /* shared layouts name their padding */
} at_slot_t;

typedef struct {
    at_owner_t owner;
    apr_uint64_t ticket;
    apr_uint32_t wake;      /* futex word, bumped on every grant */
    apr_int32_t state;
    apr_int32_t slot;       /* slot handed over, NONE while waiting */
    apr_int32_t prev, next; /* queue links; next also links the free list */
    apr_int32_t priority;
    at_client_key_t client;
    unsigned char client_pad[3];
    /* reclaim sent its wake-up again since it was granted or evicted:
     * once is enough (0 on the free list) */
    apr_uint32_t rewoken;
} at_waiter_t;

/* read_body_total=: a body read (or being read) before its request has a
 * slot, by bytes. The records of dead processes are given back by
 * reclaim, and the zone's total is counted again from the records by a
 * repair. */
#define AT_BODY_RECORDS 1024
typedef struct {
    at_owner_t owner; /* pid 0: free */
    apr_uint64_t bytes;
    apr_int32_t next;     /* the free list */
    apr_int32_t released; /* let go without the lock: the next holder frees it */
} at_body_t;

/* The builds that check every change of a waiting record's state against
 * the table: those with test hooks, and the ASan build. */
#if defined(AT_TEST_HOOKS) || defined(__SANITIZE_ADDRESS__)
#define AT_CHECK_WAITER_MOVES 1
/* Logs the change the table forbids, and aborts. */
void zone_waiter_bad_move(apr_int32_t from, apr_int32_t to);
#define WAITER_CHECK(from, to) \
    (zone_waiter_may_move(from, to) ? (void)0 : zone_waiter_bad_move(from, to))
#else
#define WAITER_CHECK(from, to) ((void)0)
#endif

/* The only ways a record's state changes (the table above): a store, by
 * the lock's holder or the record's own waiter under the lock... */
static inline void zone_waiter_move(at_waiter_t *w, apr_int32_t to)
{
#if defined(AT_CHECK_WAITER_MOVES) || defined(AT_TEST_HOOKS)
    apr_int32_t from = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE);

    WAITER_CHECK(from, to);
#endif
    __atomic_store_n(&w->state, to, __ATOMIC_RELEASE);
    AT_STEP(AT_STEP_WAITER, from * W_STATES + to);
}

/* ... and a compare-and-swap from *from, by the record's own waiter
 * without the lock, or by the holder against such a waiter; on failure
 * *from holds the state found. */
static inline int zone_waiter_cas(at_waiter_t *w, apr_int32_t *from, apr_int32_t to)
{
    apr_int32_t was = *from;

    WAITER_CHECK(was, to);
    if (!__atomic_compare_exchange_n(&w->state, from, to, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        return 0;
    }
    AT_STEP(AT_STEP_WAITER, was * W_STATES + to);
    (void)was; /* checked and stepped on in debug builds only */
    return 1;
}

/* A priority's totals, kept in the zone. */
typedef struct {
    apr_uint64_t admitted, rejected;
    at_hist_t wait;
} at_priority_totals_t;

#define PRIO_INDEX(p) ((p)-AT_PRIORITY_MIN)

/* The most zones of a lineage looked at: a zone and the zones it replaced,
 * each at a restart that grew it past its memory (zone_running, reclaim). */
#define AT_ZONE_LINEAGE_MAX 9

struct at_zone {
    apr_uint32_t magic;
    apr_uint32_t nslots, nwaiters;
    apr_uint32_t keyed; /* per_key: per_client counts keys, not addresses */
    apr_uint64_t layout; /* zone_layout() of the build that laid it */
    apr_uint32_t limit, queue_cap, retry_after, retry_after_max, per_client;
    apr_int32_t dry_run;
    apr_uint32_t lock_broken; /* the lock failed for good: requests pass untouched */
    apr_uint32_t reserve;
    apr_int64_t timeout_us;
    char name[AT_ZONE_NAME_MAX + 1];
    char name_pad[7];
    pthread_mutex_t lock;

    apr_uint32_t active, queued;
    apr_int32_t free_slot, free_waiter, qhead, qtail;
    apr_uint64_t next_ticket;
    apr_int64_t last_reclaim_us;
    apr_uint64_t service_ewma_us;
    /* a moving mean of service times in which one request counts for at
     * most twice the current value (at_typical_service_after): what
     * Retry-After and predictive rejection go by */
    apr_uint64_t typical_service_us;

    at_zone_counters_t counters;
    apr_uint32_t over_cap;

    /* priorities: who waits at each, and their totals */
    apr_uint32_t queued_at[AT_PRIORITIES];
    at_priority_totals_t prio[AT_PRIORITIES];
    at_codel_t codel;
    at_retry_t retry;

    at_hist_t wait_all, service_all;
    at_hist_t wait_win[2], service_win[2];
    apr_int64_t win_start_us;
    apr_int32_t win_cur;
    apr_uint32_t order; /* order=: AT_ORDER_FIFO or AT_ORDER_LIFO */

    apr_size_t slots_off, waiters_off;
    /* per_client: requests in per client; every counted request holds a
     * slot or a waiting record */
    at_client_table_t clients;

    /* limit=auto: the controller, and what the current window measured */
    apr_int32_t limit_auto;
    apr_int32_t pad2;
    at_limit_t ctl;
    at_sensor_t sensor;

    /* mem=: the last reading of available memory; the memory promised to
     * started requests that no reading has shown yet; what requests that
     * ended since the reading are taken to have given back */
    at_memgate_t mem;

    /* A definition published without the lock by the parent or the
     * cluster's sync process (a child may hold it, stopped or hung): the
     * next holder applies it. conf_seq is odd while a writer writes
     * conf_pending. */
    apr_uint32_t conf_seq, conf_applied;
    /* who took the sequence last: one left odd is taken over only from a
     * writer that died, never from one stopped or slow in its copy */
    at_owner_t conf_writer;
    at_zone_conf_t conf_pending;
    /* records left without the lock since the last tidy (W_LEFT...) */
    apr_uint32_t left;
    /* The waiter that wakes for the zone while others sleep: to look for
     * the dead every AT_RECLAIM_INTERVAL_US, and with mem= or a replaced
     * zone to dispatch every AT_WAIT_SLICE_US. NONE while nobody waits. */
    apr_int32_t watcher;
    /* The zone this one replaced at a restart (grown past its memory):
     * what still runs there counts against this zone's limit. An address
     * in the parent's memory, the same in every child; the parent clears
     * it before it frees that zone. */
    at_zone_t *predecessor;
    /* When a process's checker last made a pass here because the zone was
     * late (zone_here_gone): the checkers take the zones tried longest ago
     * first, so that late zones whose lock cannot be had do not keep the
     * others waiting for ever. */
    apr_int64_t late_tried_us;
    /* Set by the parent once a zone laid anew at a restart has replaced
     * this one: what waits here still runs here, but a newcomer (a
     * connection an old child took after the restart) is refused, as this
     * zone cannot see what its successor runs. */
    apr_uint32_t replaced;
    /* When the lock was last let go: active, and of the queue what the
     * zone could still run (up to its highest limit): what a successor
     * counts. Once replaced nothing new comes in, so it is never below
     * what runs here since, and a hand-off (a slot freed, then given to
     * the next waiter under the lock) shows no dip. */
    apr_uint32_t held_at_unlock;

    /* rate=: its definition, whether it goes by key (key=), and the
     * buckets: the zone's, or one per key in a table after the others */
    at_rate_conf_t rate_conf;
    apr_uint32_t rate_by_key;
    apr_uint32_t pad4;
    at_rate_table_t rate;

    /* read_body_total=: the bound, the bytes held under it now (the sum of
     * the records' bytes), and the records */
    apr_uint64_t body_cap, body_held;
    apr_int32_t free_body;
    apr_uint32_t pad5;
    at_body_t body[AT_BODY_RECORDS];
};

static inline at_slot_t *slots(at_zone_t *z)
{
    return (at_slot_t *)((char *)z + z->slots_off);
}

static inline at_waiter_t *waiters(at_zone_t *z)
{
    return (at_waiter_t *)((char *)z + z->waiters_off);
}

#define ALIGN64(n) (((n) + 63) & ~(apr_size_t)63)

/* limit=auto: what ran and what waited, integrated over time; called
 * before every change of active or queued, all of which happen under the
 * lock. */
static inline void note_change(at_zone_t *z)
{
    if (z->limit_auto) {
        at_sensor_integrate(&z->sensor, at_now_us(), z->active, z->queued);
    }
}

/* mem=: a reading is taken before the lock (if one is due; one process
 * at a time, the others wait for it), applied right after taking the lock,
 * and those waiting for it woken and a failure logged after letting it go
 * (or when it could not be had): no file read and no log line while every
 * process of the zone may be waiting. */
typedef struct {
    int taken, warn;
    at_mem_reading_t r;
} mem_read_t;

/*
 * The files call each other in layers, each only the ones below it
 * (t/check-layers fails on a circle):
 *   at_zone.c                         acquire, release, reconfigure
 *   at_zone_wait.c                    a queued request's wait
 *   at_zone_reclaim.c, at_zone_stats.c
 *   at_zone_lock.c                    the lock, its repair, mem= around it
 *   at_zone_life.c                    layout, laying, definitions
 *   at_zone_records.c                 records, the queue, who runs next
 */

/* at_zone_records.c: records, free lists, the priority queue, waking, who
 * runs next (lock held) */
void zone_client_add(at_zone_t *z, const at_client_key_t *k);
void zone_client_remove(at_zone_t *z, const at_client_key_t *k);
void zone_recount_clients(at_zone_t *z);
void zone_wake_word(apr_uint32_t *word);
/* After the lock is let go: the wake-ups zone_wake_word held back. */
void zone_send_wakes(void);
void zone_sleep_on_word(apr_uint32_t *word, apr_uint32_t seen, apr_int64_t us);
/* Without the lock: every process sleeping on word. */
void zone_wake_all(apr_uint32_t *word);
void zone_rebuild_free_slots(at_zone_t *z);
void zone_queue_push(at_zone_t *z, apr_int32_t i);
void zone_queue_unlink(at_zone_t *z, apr_int32_t i);
void zone_waiter_leave_queue(at_zone_t *z, apr_int32_t i);
void zone_waiter_free(at_zone_t *z, apr_int32_t i);
/* A record already W_FREE put on the free list (laying or repairing). */
void zone_waiter_link_free(at_zone_t *z, apr_int32_t i);

apr_int32_t zone_slot_pop_free(at_zone_t *z);
void zone_slot_fill(at_zone_t *z, apr_int32_t i, const at_owner_t *owner,
                    apr_uint64_t ticket, const at_client_key_t *client, apr_int64_t now);
apr_int32_t zone_slot_take(at_zone_t *z, const at_owner_t *owner, apr_uint64_t ticket,
                           const at_client_key_t *client, apr_int64_t now);
void zone_slot_put(at_zone_t *z, apr_int32_t i);
int zone_leave_waiting(at_waiter_t *w, apr_int32_t to);
void zone_body_free(at_zone_t *z, apr_int32_t i);
/* After a repair: the free list and the total, from the records. */
void zone_body_recount(at_zone_t *z);
apr_uint32_t zone_running(const at_zone_t *z);
apr_uint32_t zone_slots_for(const at_zone_t *z, int priority);
/* mem= lets a request start now (the last reading, judged at this moment) */
int zone_mem_allows(at_zone_t *z);
void zone_dispatch(at_zone_t *z);

/* at_zone_life.c: a definition published without the lock (by the
 * server's parent or the cluster's sync process), applied by the next
 * holder; EAGAIN if another writer, alive, is still in its copy */
int zone_publish_conf(at_zone_t *z, const at_zone_conf_t *c);
void zone_apply_published_conf(at_zone_t *z);

/* at_zone_lock.c: the lock, its repair, and catching up on it; mem=
 * around the lock */
int zone_trylock(at_zone_t *z);
int zone_lock_until(at_zone_t *z, apr_int64_t until_us);
void zone_unlock(at_zone_t *z);
at_result_t zone_lock_refusal(at_zone_t *z, int rc);
void zone_mem_read_before_lock(at_zone_t *z, mem_read_t *m);
void zone_mem_apply_locked(at_zone_t *z, mem_read_t *m);
void zone_mem_after_unlock(at_zone_t *z, mem_read_t *m);
void zone_unlock_after_mem(at_zone_t *z, mem_read_t *m);
#ifdef AT_TEST_HOOKS
int zone_test_holding_lock(void);
#endif

/* at_zone_stats.c: what the zone counts and measures (lock held) */
void zone_count_refusal(at_zone_t *z, int priority, apr_int64_t now, int scheduled);
void zone_count_grant(at_zone_t *z, int priority, apr_int64_t wait_us, apr_int64_t now);
void zone_record_wait(at_zone_t *z, apr_int64_t us, apr_int64_t now);
void zone_record_service(at_zone_t *z, apr_int64_t us, apr_int64_t now);
/* limit=auto: what a window judged under the lock showed, logged once the
 * lock is let go (a stalled logger must not stall the zone). */
typedef struct {
    int judged, changed;
    at_window_t w;
    apr_uint32_t limit, next;
} window_note_t;
void zone_window_add_completion(at_zone_t *z, apr_int64_t service, apr_int64_t now,
                                window_note_t *note);
/* Without the lock. */
void zone_log_window(const at_zone_t *z, const window_note_t *note);

/* at_zone_reclaim.c: giving back what dead processes held */
apr_uint32_t zone_reclaim(at_zone_t *z, apr_int64_t until_us, apr_int32_t only_pid);
int zone_take_reclaim_if_due(at_zone_t *z, apr_int64_t now);
/* Without the lock: nobody looked for the dead for four intervals (the
 * watcher left without the lock, died, stalls, or never learned its turn). */
static inline int zone_reclaim_late(const at_zone_t *z, apr_int64_t now)
{
    return now - __atomic_load_n(&z->last_reclaim_us, __ATOMIC_RELAXED)
           >= 4 * AT_RECLAIM_INTERVAL_US;
}

/* at_zone_wait.c: the requests waiting in this process (queued, or held
 * back by rate_delay=), one of which at a time looks at all their clients
 * every AT_CLIENT_CHECK_US and wakes those whose client has gone, and
 * looks for the dead of their zones when a zone's watcher is late: the
 * others sleep until a reason. word: what the request sleeps on; z: the
 * zone it is queued in (NULL: held back by rate_delay=). */
typedef struct zone_here {
    struct zone_here *prev, *next;
    at_zone_t *z;
    at_abort_fn fn;
    void *ctx;
    apr_uint32_t *word;
    int gone;   /* its client has gone: set by the checker or the waiter, 0 -> 1 only */
    int pinned; /* the checker is looking at its client: it may not leave */
} zone_here_t;
void zone_here_join(zone_here_t *me, at_zone_t *z, at_abort_fn fn, void *ctx,
                    apr_uint32_t *word);
void zone_here_leave(zone_here_t *me);
/* 1 if its client has gone; else *until is lowered to when this waiter
 * must look at the process's clients, if that is its turn. */
int zone_here_gone(zone_here_t *me, apr_int64_t now, apr_int64_t *until);

/* at_zone_wait.c: a queued request waits for its slot */
at_result_t zone_wait_for_slot(at_zone_t *z, at_ticket_t *t, apr_int32_t wi,
                               apr_int64_t start, apr_int64_t timeout_us,
                               at_abort_fn abort_fn, void *ctx);

/* at_zone.c: priorities (lock held) */
apr_uint32_t zone_queued_ahead(const at_zone_t *z, int priority);

#endif
