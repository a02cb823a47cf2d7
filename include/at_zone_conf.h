/*
 * A zone's definition, as ThrottleZone's arguments give it (at_parse.h
 * parses them) and as a zone keeps it (at_zone.h).
 */
#ifndef AT_ZONE_CONF_H
#define AT_ZONE_CONF_H

#include <apr.h>
#include "at_rate.h"

#define AT_LIMIT_MAX 100000
#define AT_QUEUE_MAX 100000
#define AT_TIMEOUT_MAX_US (3600 * APR_INT64_C(1000000))
#define AT_RETRY_AFTER_MAX 86400
/* A zone's name is kept in its shared memory: a build with another
 * AT_ZONE_NAME_MAX (the suite's t/upgrade.t builds one) has another
 * layout. */
#ifndef AT_ZONE_NAME_MAX
#define AT_ZONE_NAME_MAX 48
#endif
#define AT_RETRY_AFTER_AUTO 0

/* order=: who waits least once the queue stands (codel=): the oldest of
 * the highest priority waiting (FIFO), or the newest (LIFO: the oldest
 * waiters' clients have most likely gone, and codel= cuts their wait). */
#define AT_ORDER_FIFO 0
#define AT_ORDER_LIFO 1

typedef struct {
    apr_uint32_t limit;
    apr_uint32_t queue;
    apr_int64_t timeout_us;
    apr_uint32_t retry_after; /* seconds; AT_RETRY_AFTER_AUTO = estimate */
    int dry_run;              /* decide and count, never delay or refuse */
    apr_uint32_t per_client;  /* running + waiting per client; 0: no limit */
    int limit_auto;           /* limit=auto: limit is only where it starts */
    apr_uint32_t limit_min, limit_max; /* bounds of an automatic limit */
    apr_uint32_t max_from;    /* where limit_max came from: an at_max_from_t */
    int queue_default;        /* queue= not given: 10 x the (starting) limit */
    apr_uint64_t mem_bytes;   /* memory each request needs free; 0: none */
    apr_uint32_t cores;       /* online CPUs, for an automatic limit */
    apr_uint32_t pad;
    apr_uint64_t read_body;   /* body bytes read before a slot is taken; 0: off */
    apr_uint32_t retry_after_max;  /* ceiling of retry_after=auto; 0: the default */
    apr_uint32_t client_v6_prefix; /* per_client: IPv6 prefix length; 0: the default */
    apr_uint32_t refuse_status;    /* status=: 503 (the default) or 429 */
    apr_uint32_t reserve;          /* slots kept for priorities above 0 */
    apr_int64_t codel_target_us;   /* codel=: 0 off */
    apr_int64_t codel_interval_us; /* codel=TARGET:INTERVAL; 0: from service time */
    apr_uint32_t per_key;     /* running + waiting per key (key= in the glue); 0: none */
    apr_uint32_t order;       /* order=: AT_ORDER_FIFO, or AT_ORDER_LIFO (with codel=) */
    apr_uint32_t keyed;       /* key= given (in the glue): per_key and rate= go by it */
    apr_uint32_t pad2;
    at_rate_conf_t rate;      /* rate=, rate_delay= */
    apr_uint64_t read_body_total; /* bodies read before a slot, together; 0: none */
} at_zone_conf_t;

/* retry_after=auto never advises more than this many seconds unless
 * retry_after_max says otherwise: a client told to stay away for minutes
 * is a client lost. */
#define AT_RETRY_AFTER_CEILING 30

/* The most slots a definition can ever use: its limit, or for limit=auto
 * its max. */
apr_uint32_t at_conf_highest_limit(const at_zone_conf_t *c);

#endif
