/*
 * Parsing of ThrottleZone arguments and their value types. Pure functions:
 * they return NULL on success or an error message allocated from the pool,
 * phrased for an administrator reading a configuration error.
 */
#ifndef AT_PARSE_H
#define AT_PARSE_H

#include <apr_pools.h>

#include "at_zone_conf.h"

#define AT_MEM_MAX (APR_UINT64_C(1) << 50) /* 1 PiB */

/* read_body: 64 KiB by default (a form or a JSON document), at most 16 MiB
 * held in memory per request. */
#define AT_READ_BODY_DEFAULT (64 * 1024)
#define AT_READ_BODY_MAX (16 * 1024 * 1024)
/* read_body_total: what the requests of one zone that have no slot yet
 * hold of bodies read first, together: 16 MiB, a queue of 256 at 64 KiB. */
#define AT_READ_BODY_TOTAL_DEFAULT (16 * 1024 * 1024)

/* status=: what a refused request is answered with. 429 tells a load
 * balancer the request may be replayed on another host and is not a
 * server error. */
#define AT_REFUSE_STATUS_DEFAULT 503

/* limit=auto starts at this many times the online CPUs; its default bounds
 * are 1 and the workers the server can give the zone (at_conf_max_from_workers),
 * or AT_AUTO_MAX_PER_CPU times the online CPUs where the MPM does not say. */
#define AT_AUTO_START_PER_CPU 2
#define AT_AUTO_MAX_PER_CPU 16

/* Where a limit's max came from. */
typedef enum {
    AT_MAX_GIVEN = 0,    /* max= */
    AT_MAX_FROM_CPUS,    /* AT_AUTO_MAX_PER_CPU x the CPUs (until told the workers) */
    AT_MAX_FROM_WORKERS, /* MaxRequestWorkers less what the rest needs */
    AT_MAX_FIXED         /* a fixed limit= is its own max */
} at_max_from_t;

const char *at_max_from_name(apr_uint32_t from);

/* limit=auto without max=: share `workers`, the workers this zone may
 * have, between its waiters and its max. A default queue keeps at most a
 * quarter of them (each waiter holds a worker too); max takes the rest,
 * never below min or reserve + 1, and the limit starts no higher. Leaves a
 * zone whose max was given alone. */
#define AT_AUTO_QUEUE_SHARE 4
void at_conf_max_from_workers(at_zone_conf_t *c, apr_uint32_t workers);

const char *at_parse_uint(apr_pool_t *p, const char *s, apr_uint64_t min,
                          apr_uint64_t max, apr_uint64_t *out);
const char *at_parse_duration(apr_pool_t *p, const char *s,
                              apr_int64_t *out_us);
/* A byte count: digits with an optional K, M, G or T (powers of 1024),
 * which may be followed by B or iB, in either case. */
const char *at_parse_size(apr_pool_t *p, const char *s, apr_uint64_t min,
                          apr_uint64_t max, apr_uint64_t *out);
const char *at_parse_zone_name(apr_pool_t *p, const char *s);

/* ThrottlePriority's arguments: an integer from AT_PARSE_PRIORITY_MIN to
 * AT_PARSE_PRIORITY_MAX, and an optional "timeout=DURATION" (NULL: none;
 * *timeout_us is then 0). */
#define AT_PARSE_PRIORITY_MIN (-10)
#define AT_PARSE_PRIORITY_MAX 10
const char *at_parse_priority(apr_pool_t *p, const char *n, const char *opt,
                              int *priority, apr_int64_t *timeout_us);

/* Every ThrottleZone key that at_parse_zone_args() takes, with its syntax,
 * in the order the usage string gives them: the parsers' table, the usage
 * string and the list of keys in error messages are all made from this
 * one list. key=EXPR is the module's (an ap_expr), taken out before. */
#define AT_ZONE_KEYS(X)                                                  \
    X(limit, " limit=N|auto")                                            \
    X(min, " [min=N]")                                                   \
    X(max, " [max=N]")                                                   \
    X(queue, " [queue=N]")                                               \
    X(timeout, " [timeout=DURATION]")                                    \
    X(per_client, " [per_client=N")                                      \
    X(per_client_v6, " [per_client_v6=/N]]")                             \
    X(per_key, " [per_key=N key=EXPR]")                                  \
    X(rate, " [rate=R/s|R/m[:BURST]")                                    \
    X(rate_delay, " [rate_delay=N] [key=EXPR]]")                         \
    X(mem, " [mem=SIZE]")                                                \
    X(read_body, " [read_body=SIZE]")                                    \
    X(read_body_total, " [read_body_total=SIZE]")                        \
    X(reserve, " [reserve=N]")                                           \
    X(codel, " [codel=TARGET[:INTERVAL]")                                \
    X(order, " [order=fifo|lifo]]")                                      \
    X(retry_after, " [retry_after=SECONDS|auto]")                        \
    X(retry_after_max, " [retry_after_max=SECONDS]")                     \
    X(status, " [status=503|429]")                                       \
    X(dry_run, " [dry_run=on|off]")                                      \
    X(cluster, " [cluster=NAME")                                         \
    X(cluster_fallback, " [cluster_fallback=even|local|N]]")

#define AT_ZONE_KEY_SYNTAX(name, syntax) syntax
/* " limit=N|auto [min=N] …": what follows ThrottleZone NAME */
#define AT_ZONE_USAGE AT_ZONE_KEYS(AT_ZONE_KEY_SYNTAX)

/* argv holds the key=value words after the zone name. */
const char *at_parse_zone_args(apr_pool_t *p, int argc,
                               const char *const *argv, at_zone_conf_t *out);

#endif
