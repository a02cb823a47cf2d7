/*
 * A throttle zone: a cap on concurrent requests and a bounded FIFO queue,
 * living in memory shared by every process and thread of the server.
 *
 * The zone is a flat structure placed by the caller in shared memory
 * (at_zone_size() bytes); it holds no pointers, so every process may map it
 * at a different address.
 */
#ifndef AT_ZONE_H
#define AT_ZONE_H

#include <apr.h>
#include <apr_network_io.h>
#include "at_client.h"
#include "at_clock.h"
#include "at_codel.h"
#include "at_hist.h"
#include "at_log.h"
#include "at_zone_conf.h"

typedef struct at_zone at_zone_t;

typedef enum {
    AT_ADMITTED = 0,      /* slot taken at once */
    AT_QUEUED,            /* slot taken after waiting */
    AT_REJECTED_FULL,     /* queue full */
    AT_REJECTED_TIMEOUT,  /* waited for timeout_us */
    AT_ABORTED,           /* the abort callback said the client left */
    AT_ERROR,             /* the shared lock is unusable: caller fails open */
    AT_DRY_RUN_QUEUED,    /* dry run: would have waited; runs now, no slot */
    AT_DRY_RUN_REJECTED,  /* dry run: would have got 503; runs now, no slot */
    AT_REJECTED_CLIENT,   /* the client already has per_client requests in */
    AT_REJECTED_PREDICTED, /* limit=auto: its wait would outlast the timeout */
    AT_REJECTED_WORKERS,   /* would wait, but the server is short of idle workers */
    AT_REJECTED_STANDING,  /* codel=: waited TARGET while the queue stood */
    AT_REJECTED_LOCKED,    /* the zone's lock was held past the request's deadline
                              (its holder stopped, in a debugger, frozen) */
    AT_REJECTED_KEY,       /* the request's key already has per_key requests in */
    AT_REJECTED_RATE       /* beyond rate= and its burst (for the zone, or its key) */
} at_result_t;

/* ThrottlePriority: higher runs first; requests wait in priority order,
 * FIFO within a priority. */
#define AT_PRIORITY_MIN (-10)
#define AT_PRIORITY_MAX 10
#define AT_PRIORITIES (AT_PRIORITY_MAX - AT_PRIORITY_MIN + 1)

/* A request's may_wait when the caller guessed that it would run at once:
 * should it have to wait after all, wait_check() decides, under the zone's
 * lock (NULL: it may not). */
#define AT_WAIT_ASK 2

/* What a request asks of a zone. */
typedef struct {
    const at_client_key_t *client; /* for per_client or per_key; NULL: nobody */
    int may_wait;           /* 0: refused (AT_REJECTED_WORKERS) rather than queued;
                               1: it may wait; AT_WAIT_ASK: ask wait_check */
    int (*wait_check)(void); /* AT_WAIT_ASK: nonzero if it may wait */
    int priority;           /* AT_PRIORITY_MIN to AT_PRIORITY_MAX */
    apr_int64_t timeout_us; /* how long it may wait; 0: the zone's timeout */
} at_request_t;

typedef struct {
    apr_int32_t slot;
    apr_int32_t over_cap;   /* dry run: running without a slot (its record + 1; -1: none) */
    apr_int32_t untimed;    /* an error page's slot: its service time is not the zone's */
    apr_uint64_t ticket;
    apr_int64_t granted_us; /* monotonic */
    apr_int64_t wait_us;
    apr_uint32_t queue_depth; /* waiters ahead on arrival */
    apr_uint32_t retry_after; /* rate=: seconds until one would pass; 0: the zone's advice */
} at_ticket_t;

/* Every total a zone keeps, defined once: the field, and how the status
 * page shows it (?auto and HTML key, JSON member, Prometheus metric and its
 * label, help; rows of one metric family are adjacent, help on the first). */
#define AT_ZONE_COUNTERS(X)                                                             \
    X(admitted, "Admitted", "admitted", "admitted_total", NULL,                        \
      "Requests that got a slot, at once or after waiting.")                            \
    X(queued_total, "QueuedTotal", "queued_total", "queued_total", NULL,               \
      "Requests that had to wait for a slot.")                                          \
    X(rejected_full, "RejectedFull", "rejected_full", "rejected_total",                \
      "reason=\"full\"", "Requests refused (503, or 429 with status=429), by reason.")                           \
    X(rejected_timeout, "RejectedTimeout", "rejected_timeout", "rejected_total",       \
      "reason=\"timeout\"", NULL)                                                       \
    X(rejected_predicted, "RejectedPredicted", "rejected_predicted", "rejected_total", \
      "reason=\"predicted\"", NULL)                                                     \
    X(rejected_client, "RejectedClient", "rejected_client", "rejected_total",          \
      "reason=\"client\"", NULL)                                                        \
    X(rejected_key, "RejectedKey", "rejected_key", "rejected_total",                   \
      "reason=\"key\"", NULL)                                                           \
    X(rejected_rate, "RejectedRate", "rejected_rate", "rejected_total",                \
      "reason=\"rate\"", NULL)                                                          \
    X(rejected_workers, "RejectedWorkers", "rejected_workers", "rejected_total",       \
      "reason=\"workers\"", NULL)                                                       \
    X(rejected_standing, "RejectedStanding", "rejected_standing", "rejected_total",    \
      "reason=\"standing\"", NULL)                                                      \
    X(rejected_locked, "RejectedLocked", "rejected_locked", "rejected_total",          \
      "reason=\"locked\"", NULL)                                                        \
    X(rate_delayed, "RateDelayed", "rate_delayed", "rate_delayed_total", NULL,         \
      "Requests held back to their turn by rate= (rate_delay=).")                       \
    X(rate_forgotten, "RateForgotten", "rate_forgotten", "rate_forgotten_total", NULL, \
      "Keys whose rate= bucket was forgotten before it emptied (the table was full).")  \
    X(aborted, "Aborted", "aborted", "aborted_total", NULL,                            \
      "Waiting requests whose client went away.")                                       \
    X(reclaimed, "Reclaimed", "reclaimed", "reclaimed_total", NULL,                    \
      "Slots and queue places given back after their process died.")                    \
    X(lock_repairs, "LockRepairs", "lock_repairs", "lock_repairs_total", NULL,         \
      "Times the zone was rebuilt after a process died holding its lock.")              \
    X(dry_run_queued, "DryRunQueued", "dry_run_queued", "dry_run_total",               \
      "would=\"queue\"", "Dry run: requests that would have waited or been rejected.")  \
    X(dry_run_rejected, "DryRunRejected", "dry_run_rejected", "dry_run_total",         \
      "would=\"reject\"", NULL)

typedef struct {
#define AT_COUNTER_FIELD(field, ...) apr_uint64_t field;
    AT_ZONE_COUNTERS(AT_COUNTER_FIELD)
#undef AT_COUNTER_FIELD
} at_zone_counters_t;

/* One priority's totals: requests admitted and refused, and how long the
 * admitted ones waited, since the zone was created. */
typedef struct {
    apr_uint64_t admitted, rejected;
    apr_uint32_t queued; /* waiting now */
    at_hist_t wait;
} at_priority_stats_t;

/* The status page lists this many of the clients (or keys) with the most
 * requests in. */
#define AT_BUSIEST 10

typedef struct {
    apr_uint32_t limit, queue_cap, nslots, nwaiters, per_client, per_key;
    apr_uint32_t reserve; /* slots that requests of priority <= 0 leave free */
    apr_int64_t codel_target_us, codel_interval_us; /* codel=; target 0: off */
    apr_int64_t standing_us; /* codel=: how long the queue has stood; 0: not */
    at_priority_stats_t priority[AT_PRIORITIES]; /* [p - AT_PRIORITY_MIN] */
    apr_uint32_t active, queued, over_cap;
    int stale; /* the lock was held throughout: only the figures readable
                  without it (limit, active, queued, queue, totals) are set */
    apr_int64_t timeout_us;
    apr_uint32_t retry_after;
    int dry_run;
    at_zone_counters_t counters;
    apr_uint64_t service_ewma_us;
    apr_uint32_t clients; /* client addresses (keys, with per_key) with a request in */
    at_client_entry_t busiest[AT_BUSIEST]; /* those with the most, most first */
    apr_uint32_t nbusiest;
    int limit_auto;
    apr_uint32_t limit_min, limit_max; /* = limit for a fixed limit */
    apr_uint32_t limit_held; /* limit=auto: the level a probe returns to */
    apr_uint32_t limit_mode; /* limit=auto: the controller's at_limit_mode_t */
    apr_uint64_t limit_changes;
    double baseline_us, recent_us; /* limit=auto: service time settled, last */
    at_hist_t wait_all, service_all;       /* since the zone was created */
    at_hist_t wait_recent, service_recent; /* the last 60 to 120 s */
    apr_int64_t oldest_us; /* age of the oldest running request, 0 if none */
    apr_int32_t oldest_pid; /* the process running it */
    /* mem=: the configured need, the last reading (an at_mem_source_t
     * says from where), memory promised to started requests that readings
     * do not show yet, and how often memory alone held a request back */
    apr_uint64_t mem_bytes, mem_avail, mem_pending;
    int mem_source;
    apr_int64_t mem_read_age_us;
    apr_uint64_t mem_held, mem_read_errors;
    /* rate=: the definition (interval 0: none), whether by key, the keys
     * the zone can remember and those whose bucket is not empty */
    at_rate_conf_t rate;
    int rate_by_key;
    apr_uint32_t rate_keys, rate_keys_in;
    /* read_body_total=: the bound, and the body bytes held under it now */
    apr_uint64_t body_cap, body_held;
} at_zone_stats_t;

/* Called while a request waits; return non-zero when it should give up.
 * One thread of the process asks it for every request waiting there in
 * turn, so it may run on another thread than the request's, and at the
 * same time as the request's own thread asks it: it must only look. It is
 * called with no lock held, and should not block. */
typedef int (*at_abort_fn)(void *ctx);

/* rate_keys: at_rate_keys_for() the definition (buckets for rate= by key). */
apr_size_t at_zone_size(apr_uint32_t nslots, apr_uint32_t nwaiters, apr_uint32_t rate_keys);

/* Lay out a fresh zone in mem (at least at_zone_size(nslots, nwaiters)
 * bytes). nslots >= limit and nwaiters >= queue: the headroom lets a later
 * definition grow in place (at_zone_reconfigure) without losing state. */
apr_status_t at_zone_init(void *mem, apr_size_t size, const char *name,
                          const at_zone_conf_t *conf, apr_uint32_t nslots,
                          apr_uint32_t nwaiters);

/* Whether an existing zone can take conf without being laid out anew. */
int at_zone_can_hold(const at_zone_t *z, const at_zone_conf_t *conf);

/* Laid by a build of this layout, and its lock sound: safe to read. */
int at_zone_compatible(const at_zone_t *z);

/* 1 if z counts what runs in old (old is its predecessor). */
int at_zone_counts(const at_zone_t *z, const at_zone_t *old);

/* In the parent, when z replaces old at a restart (old cannot hold the new
 * definition): what runs in old, and as much of what waits there as its
 * own limit could run, counts against z's limit until it ends; old refuses
 * newcomers from then on, so old and new together never run more than
 * z's limit. */
void at_zone_succeed(at_zone_t *z, at_zone_t *old);

/* Nothing running or waiting, and no replaced zone behind it. */
int at_zone_idle(const at_zone_t *z);

/* In the parent: the zone z replaced, once it is idle, unlinked from z so
 * that the caller may free it (children forked after see no link). NULL
 * while it still has requests, or if there is none. */
at_zone_t *at_zone_let_go_predecessor(at_zone_t *z);

/* Apply a new definition in place, keeping slots, waiters and totals.
 * Writers from several processes take turns (another's copy is waited for,
 * AT_PUBLISH_WAIT_US at most). It never waits for the lock, which a
 * stopped or hung process may hold: it
 * returns APR_SUCCESS if the definition is in force, APR_EBUSY if the
 * process holding the lock (or the next to take it) will apply it,
 * APR_EAGAIN if it was not published (another writer, alive, is stopped
 * in its copy: try again later), APR_EINVAL if the zone cannot hold it. */
apr_status_t at_zone_reconfigure(at_zone_t *z, const at_zone_conf_t *conf);

/* The general form: the request's client, whether it may wait, its
 * priority and its timeout. */
at_result_t at_zone_acquire_req(at_zone_t *z, at_ticket_t *t, const at_request_t *rq,
                                at_abort_fn fn, void *ctx);

/* For an error page of a refused request whose target is itself in this
 * zone: a slot free at once (AT_ADMITTED), or AT_REJECTED_FULL. It never
 * waits and never runs over the cap (a dry run answers AT_DRY_RUN_REJECTED
 * and the page runs without a slot); it counts in no total, and its
 * service time is not the zone's. Release it with at_zone_release. */
at_result_t at_zone_acquire_now(at_zone_t *z, at_ticket_t *t);

/* Without the lock, a guess: whether a newcomer of this priority would be
 * refused at once because every slot it may take is busy and the queue is
 * full of waiters it cannot displace. Read before a request's body is: a
 * request about to be refused is not asked for its body. */
int at_zone_looks_full(const at_zone_t *z, int priority);
/* Without the lock, a guess that a request of this priority will not wait:
 * a slot below reserve= is free and no one of its priority or higher waits
 * (mem= is not looked at), or the zone never queues (a dry run, or
 * replaced by a restart). */
int at_zone_looks_free(const at_zone_t *z, int priority);

/* read_body_total: room for a body of bytes about to be read before its
 * request has a slot (the most it may hold, when its length is unknown).
 * Returns a handle for at_zone_body_let_go, or 0 when the zone's bodies
 * would pass the bound (or every record is taken, or the lock is held
 * past a short wait): the body is then left to the handler to read. A
 * dead process's bodies are given back by reclaim. */
apr_int32_t at_zone_body_hold(at_zone_t *z, apr_uint64_t bytes);
/* Once the request leaves the queue, whatever its outcome. */
void at_zone_body_let_go(at_zone_t *z, apr_int32_t handle);
/* The bytes held now, without the lock. */
apr_uint64_t at_zone_body_held(const at_zone_t *z);

/* Returns the service time in us, or -1 if the slot had been reclaimed. */
apr_int64_t at_zone_release(at_zone_t *z, at_ticket_t *t);

/* Give back slots and queue places of dead processes; returns how many. */
apr_uint32_t at_zone_reclaim(at_zone_t *z);

/* The same, but gives up at once if the zone's lock is taken: for the
 * server's parent, which must not hang on a stopped or hung child. */
apr_uint32_t at_zone_reclaim_nowait(at_zone_t *z);

/* at_zone_reclaim_nowait over the zone and those it replaced at restarts,
 * whose running requests it counts as its own: for a process that does
 * the parent's reclaim once the parent is gone. */
apr_uint32_t at_zone_reclaim_lineage_nowait(at_zone_t *z);

/* The same for the records of one process, which its parent has seen exit:
 * only that pid's liveness is read. */
apr_uint32_t at_zone_reclaim_pid_nowait(at_zone_t *z, apr_int32_t pid);

void at_zone_stats(at_zone_t *z, at_zone_stats_t *out);

/* per_key: the key a request's text (key=) counts against in this zone. */
void at_zone_key_from_text(const at_zone_t *z, const char *text, apr_size_t n,
                           at_client_key_t *out);

/* The few numbers a load balancer is told, read without the zone's lock:
 * a stopped or busy lock holder never delays them. Each is read whole;
 * together they may be a moment apart. */
typedef struct {
    apr_uint32_t limit, active, queued, queue_cap;
    apr_uint32_t running; /* active, and what the zones it replaced run or could run of their queues */
    int broken; /* the zone's lock failed for good: it lets everything through */
} at_zone_glance_t;
void at_zone_glance(at_zone_t *z, at_zone_glance_t *out);

/* Seconds a rejected client should wait before retrying (>= 1): the fixed
 * retry_after, or for retry_after=auto the zone's at_retry advice, whose
 * floor is at_retry_after_secs() of the zone. */
apr_uint32_t at_zone_retry_after(at_zone_t *z);

/* retry_after=auto: the time for the queue and one more request to drain,
 * at the typical service time, in whole seconds from 1 to ceiling (0:
 * AT_RETRY_AFTER_CEILING). */
apr_uint32_t at_retry_after_secs(apr_uint32_t queued, apr_uint64_t typical_us,
                                 apr_uint32_t limit, apr_uint32_t ceiling);

/* The typical service time after a request of us: an average that one
 * request moves by an eighth at most (each sample counts for at most
 * twice the current value), and that follows work 100 times slower within
 * 60 requests. 0: nothing measured yet. */
apr_uint64_t at_typical_service_after(apr_uint64_t typical, apr_int64_t us);


#ifdef AT_TEST_HOOKS
/* Fault injection for tests: take the zone lock and never release it. */
apr_status_t at_zone_debug_take_lock(at_zone_t *z);
void at_zone_debug_release_lock(at_zone_t *z);
/* Make the zone's lock unusable for good (ENOTRECOVERABLE). */
apr_status_t at_zone_debug_break_lock(at_zone_t *z);
#endif


#ifdef AT_TEST_HOOKS
/* Test builds only: called at each step of a hand-off of a slot, after
 * each change of a waiting record's state (step: from * W_STATES + to), and
 * once the lock is let go, before the wake-ups held back under it are sent
 * (step: how many), so that a test can end the process there and see what
 * lock repair and reclaim make of it. */
enum { AT_STEP_DISPATCH = 1, AT_STEP_SLOT_FILL, AT_STEP_WAITER, AT_STEP_WAKES };
/* Test builds only: how many reclaim passes have looked at the records, how
 * many times a request has waited for the zone's lock, and how many times a
 * waiter's word was moved to wake it (zone_wake_word). */
extern apr_uint32_t at_test_reclaim_passes, at_test_lock_count, at_test_wakes;
/* Test builds only: how many times a process's checker has looked at the
 * clients of its waiters (and for the late zones among theirs). */
extern apr_uint32_t at_test_client_checks;
/* Test builds only: slots granted to a waiter whose client had gone, given
 * back and passed on under the lock. */
extern apr_uint32_t at_test_gone_grants;
extern void (*at_test_step_hook)(int where, int step);
/* Test builds only: called as the zone's lock is let go, with how long it
 * was held (ns). */
extern void (*at_test_lock_held_hook)(apr_int64_t ns);
/* Test builds only: entries a status read (at_zone_stats) walked, and how
 * many of them while it held the zone's lock. */
extern apr_uint32_t at_test_scrape_walked, at_test_scrape_walked_locked;
#define AT_STEP(where, n) (at_test_step_hook ? at_test_step_hook(where, n) : (void)0)
#else
#define AT_STEP(where, n) ((void)0)
#endif

#endif
