/*
 * cluster=: one zone's limit shared by a fleet of servers. Every period
 * each server tells a shared store (Redis, in the glue) its demand and the
 * share it holds, on a lease, and reads the others'; its zone then runs
 * its share as its local limit. Pure arithmetic on APR: the glue does the
 * round trip, the zone applies the limits.
 *
 * The fleet's running total stays within the total while the store
 * answers because of three rules:
 *   - a server lowers its local limit before it tells the store, and tells
 *     it the most it may still be running (its limit, or what runs if more);
 *   - it raises only by what the store grants atomically: capacity nobody
 *     else's live lease holds (at_cluster_grant, which the store's script
 *     mirrors);
 *   - capacity recorded nowhere (a fallback's) is never raised into: after
 *     a run of failed syncs a server asks for no more than it holds until
 *     it has synced for a whole lease, by when every live server has
 *     written what it holds.
 * A server whose lease (judged on its own monotonic clock, a period short
 * of the store's) runs out falls back to cluster_fallback=.
 *
 * The state lives in shared memory: no pointers.
 */
#ifndef AT_CLUSTER_H
#define AT_CLUSTER_H

#include <apr.h>

/* The other members a server counts per zone: a fleet beyond it is
 * counted (members) but shares are planned over this many (logged). */
#define AT_CLUSTER_PEERS_MAX 256
#define AT_CLUSTER_ID_MAX 64
/* Defaults: a sync every 200 ms, each waiting at most 50 ms for Redis; a
 * lease of AT_CLUSTER_LEASE_PERIODS periods. */
#define AT_CLUSTER_PERIOD_US (200 * APR_INT64_C(1000))
#define AT_CLUSTER_TIMEOUT_US (50 * APR_INT64_C(1000))
#define AT_CLUSTER_LEASE_PERIODS 10
#define AT_CLUSTER_FLOOR 1

/* cluster_fallback=: what a server runs once its lease has run out */
typedef enum {
    AT_CLUSTER_FALLBACK_EVEN = 0, /* total / members last seen, at least 1 */
    AT_CLUSTER_FALLBACK_LOCAL,    /* the zone's own limit: the whole total */
    AT_CLUSTER_FALLBACK_FIXED     /* a number */
} at_cluster_fallback_t;

typedef struct {
    apr_uint32_t total;      /* the zone's limit= : the fleet's */
    apr_uint32_t floor;      /* the least share a member is aimed at */
    apr_int64_t period_us;   /* between syncs */
    apr_int64_t lease_us;    /* how long the store keeps a member's row */
    apr_uint32_t fallback;   /* an at_cluster_fallback_t */
    apr_uint32_t fallback_n; /* AT_CLUSTER_FALLBACK_FIXED: the limit */
} at_cluster_conf_t;

/* period 0: the default; the lease is AT_CLUSTER_LEASE_PERIODS of it. */
void at_cluster_conf_init(at_cluster_conf_t *c, apr_uint32_t total, apr_int64_t period_us);

/* "even", "local" or a number >= 1 (sets fallback and fallback_n). */
const char *at_cluster_parse_fallback(const char *s, apr_uint32_t *kind, apr_uint32_t *n);

/* One member as the store returned it. */
typedef struct {
    char id[AT_CLUSTER_ID_MAX];
    apr_uint32_t demand, share;
} at_cluster_member_t;

/* The last sync's outcome. */
enum { AT_CLUSTER_NEVER = 0, AT_CLUSTER_OK, AT_CLUSTER_FAILED };

typedef struct {
    char id[AT_CLUSTER_ID_MAX]; /* this server's name in the store */
    double demand_avg;          /* running + queued: up at once, down slowly */
    apr_uint32_t demand;        /* the smoothed demand last sent */
    apr_uint32_t share;         /* what the store counts this server for */
    apr_uint32_t target;        /* its max-min fair share of the total */
    apr_uint32_t want;          /* what the last plan asked for */
    apr_uint32_t limit;         /* the local limit the glue last set */
    apr_uint32_t members;       /* members last seen, this one included */
    apr_uint32_t npeers;        /* rows in peers: members - 1, at most PEERS_MAX */
    apr_int32_t fallback;       /* running the fallback now */
    apr_int32_t last_result;    /* AT_CLUSTER_NEVER, _OK, _FAILED */
    apr_int64_t lease_until_us; /* local clock; 0: no lease */
    apr_int64_t fallback_since_us; /* local clock: the fallback began */
    apr_int64_t good_since_us;  /* first of the current run of good syncs; 0: none */
    apr_int64_t last_sync_us, last_ok_us;
    apr_uint64_t syncs, failures;
    apr_uint64_t born;          /* the store's rows began then (its clock) */
    at_cluster_member_t peers[AT_CLUSTER_PEERS_MAX]; /* the others, last seen */
} at_cluster_state_t;

/* A server's id in the store, "host:nonce:pid" (the parent's pid, and a
 * random nonce drawn once in the parent's life, in 16 hex digits: two
 * containers of one host name, each its parent PID 1, still differ), into
 * id of AT_CLUSTER_ID_MAX bytes. A host too long for it keeps its first
 * bytes, then "~" and a hash of the whole name: two names alike for as
 * long as the id still differ. */
void at_cluster_make_id(char *id, const char *host, long pid, apr_uint64_t nonce);

/* A member that has never synced runs nothing (limit 0): it raises only
 * into capacity the store grants. */
void at_cluster_state_init(at_cluster_state_t *st, const char *id);

/* A sample of what runs and waits; returns the smoothed demand. */
apr_uint32_t at_cluster_note_demand(at_cluster_state_t *st, apr_uint32_t running,
                                    apr_uint32_t queued);

/* Max-min fair shares of total over wants (each at least floor, where the
 * total has a floor for every member), what is left split evenly, the odd
 * units to the members first in rank order: member me's share. Every
 * member computes the same from the same rows. */
apr_uint32_t at_cluster_fair_share(apr_uint32_t total, apr_uint32_t floor,
                                   const apr_uint32_t *wants, const apr_uint32_t *ranks,
                                   apr_uint32_t n, apr_uint32_t me);

/* This server's target from its demand and the peers last seen (alone:
 * the total). */
apr_uint32_t at_cluster_target(const at_cluster_conf_t *c, at_cluster_state_t *st);

/* Before a sync: the limit to lower the zone to now (the current limit:
 * none), and the share to ask the store for. */
typedef struct {
    apr_uint32_t lower_to;
    apr_uint32_t want;
} at_cluster_plan_t;
void at_cluster_plan(const at_cluster_conf_t *c, at_cluster_state_t *st, apr_uint32_t limit,
                     apr_int64_t now_us, at_cluster_plan_t *out);

/* What the store must count this server for: read after lowering, the
 * limit in force or what still runs, whichever is more. */
apr_uint32_t at_cluster_hold(apr_uint32_t limit_in_force, apr_uint32_t running);

/* The store's atomic step (its script mirrors it): the share granted to a
 * member that holds hold and wants want while the others' live rows hold
 * others. It only raises into capacity nobody else holds. A member that
 * sends another born than the store's (it knew the store before it lost
 * its rows) is granted what it holds: the store learns what everyone runs
 * before anyone raises. */
apr_uint32_t at_cluster_grant(apr_uint32_t total, apr_uint64_t others, apr_uint32_t hold,
                              apr_uint32_t want);

/* What the store answers: the share granted, when its rows began (a
 * store restarted empty begins anew), and the other members' rows: npeers
 * of them in peers, of others in all (more than peers can hold). */
typedef struct {
    apr_uint32_t grant;
    apr_uint32_t npeers;
    apr_uint32_t others;
    apr_uint64_t born;
    const at_cluster_member_t *peers;
} at_cluster_reply_t;

/* After a sync sent at sent_us: ok with the store's reply, or failed (r
 * unused). Returns the zone's local limit from now on. */
apr_uint32_t at_cluster_after_sync(const at_cluster_conf_t *c, at_cluster_state_t *st, int ok,
                                   const at_cluster_reply_t *r, apr_uint32_t limit,
                                   apr_int64_t sent_us, apr_int64_t now_us);

/* The limit cluster_fallback= gives. */
apr_uint32_t at_cluster_fallback_limit(const at_cluster_conf_t *c,
                                       const at_cluster_state_t *st);

/* The lease has run out at now_us with the local limit at limit: the
 * limit the fallback allows now. Down at once; up only a lease after the
 * fallback began, when every other server's lease has run out too and it
 * has lowered to its own fallback, so that servers raising to an even
 * split do not run beside others still running their larger shares. */
apr_uint32_t at_cluster_run_fallback(const at_cluster_conf_t *c, at_cluster_state_t *st,
                                     apr_uint32_t limit, apr_int64_t now_us);

/* The sync process's restarts after it died soon after its start: the
 * wait before the next, from the last wait (0: none yet). 1 s, doubling
 * to 30 s. */
#define AT_CLUSTER_RETRY_FIRST_US APR_INT64_C(1000000)
#define AT_CLUSTER_RETRY_MAX_US (30 * APR_INT64_C(1000000))
apr_int64_t at_cluster_retry_backoff(apr_int64_t last_us);

#endif
