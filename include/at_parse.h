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

/* status=: what a refused request is answered with. 429 tells a load
 * balancer the request may be replayed on another host and is not a
 * server error. */
#define AT_REFUSE_STATUS_DEFAULT 503

/* per_client counts IPv6 clients per /64 (one site's subnet) by default;
 * per_client_v6 takes /32 to /128. */
#define AT_CLIENT_V6_PREFIX 64
#define AT_CLIENT_V6_PREFIX_MIN 32

/* limit=auto starts at this many times the online CPUs; its default bounds
 * are 1 and the workers the server can give the zone (at_conf_max_from_workers),
 * or AT_AUTO_MAX_PER_CPU times the online CPUs where the MPM does not say. */
#define AT_AUTO_START_PER_CPU 2
#define AT_AUTO_MAX_PER_CPU 16

/* Where an automatic limit's max came from. */
typedef enum {
    AT_MAX_GIVEN = 0,   /* max= */
    AT_MAX_FROM_CPUS,   /* AT_AUTO_MAX_PER_CPU x the CPUs (until told the workers) */
    AT_MAX_FROM_WORKERS /* MaxRequestWorkers less what the rest needs */
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

/* argv holds the key=value words after the zone name. */
const char *at_parse_zone_args(apr_pool_t *p, int argc,
                               const char *const *argv, at_zone_conf_t *out);

#endif
