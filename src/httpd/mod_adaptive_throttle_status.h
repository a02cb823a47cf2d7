/*
 * The status page's model, shared by its formats: the table of fields
 * every format writes from, a zone's figures as they are shown, and the
 * per-priority rows. Included by mod_adaptive_throttle_status*.c only.
 */
#ifndef MOD_ADAPTIVE_THROTTLE_STATUS_H
#define MOD_ADAPTIVE_THROTTLE_STATUS_H

#include "httpd.h"

#include "at_zone.h"

typedef enum { GAUGE, COUNTER } kind_t;

/* Fields that mean something only for zones using a feature: HTML and
 * ?auto leave them out elsewhere; JSON and Prometheus keep one schema for
 * every zone (0 where the feature is off). */
typedef enum { ALWAYS = 0, IF_AUTO, IF_MEM, IF_CODEL, IF_RATE, IF_CLUSTER } shown_t;

typedef struct {
    const char *key;   /* ?auto and HTML: Throttle.<zone>.<key> */
    const char *json;  /* JSON member of the zone object */
    const char *prom;  /* Prometheus metric, without the prefix */
    const char *label; /* extra Prometheus label, "name=\"value\"", or NULL */
    kind_t kind;
    const char *help;
    shown_t shown;
} field_t;

enum {
    F_LIMIT, F_LIMIT_MIN, F_LIMIT_MAX, F_LIMIT_MAX_FROM, F_ACTIVE, F_QUEUED, F_QUEUE_CAP, F_TIMEOUT,
    F_STALE, F_DRY_RUN, F_OVER_CAP, F_OLDEST, F_OLDEST_PID, F_SERVICE_MEAN,
    F_WAIT_P50, F_WAIT_P90, F_WAIT_P99, F_WAIT_MAX, F_WAIT_N,
    F_SERVICE_P50, F_SERVICE_P90, F_SERVICE_P99, F_SERVICE_MAX, F_SERVICE_N,
    F_LIMIT_AUTO, F_LIMIT_HELD, F_LIMIT_MODE, F_LIMIT_CHANGES, F_BASELINE, F_RECENT_SERVICE,
    F_PER_CLIENT, F_PER_KEY, F_CLIENTS, F_RESERVE,
    F_CODEL_TARGET, F_CODEL_INTERVAL, F_QUEUE_STANDING, F_QUEUE_STANDING_MS,
    F_MEM, F_MEM_AVAIL, F_MEM_SOURCE, F_MEM_AGE, F_MEM_HELD, F_MEM_ERRORS,
    F_RATE, F_RATE_BURST, F_RATE_DELAY, F_RATE_BY_KEY, F_RATE_KEYS,
    F_READ_BODY_HELD,
    F_CLUSTER, F_CLUSTER_TOTAL, F_CLUSTER_SHARE, F_CLUSTER_DEMAND, F_CLUSTER_MEMBERS,
    F_CLUSTER_SYNC_AGE, F_CLUSTER_SYNC_OK, F_CLUSTER_FALLBACK, F_CLUSTER_SYNC_FAILURES,
#define F_COUNTER_ENUM(field, ...) F_##field,
    AT_ZONE_COUNTERS(F_COUNTER_ENUM)
#undef F_COUNTER_ENUM
    NFIELDS
};

/* Rows with the same Prometheus name are one metric family: keep them
 * adjacent. prom NULL: not a Prometheus metric of its own (percentiles are
 * derived from the histograms, which are exported whole). */
extern const field_t at_status_fields[NFIELDS];

typedef struct {
    const char *name;
    at_zone_stats_t s;
    double v[NFIELDS];
} zone_view_t;

/* Each priority that has seen a request: its totals, what waits now and
 * the wait percentiles of its admitted requests since the zone began. */
typedef struct {
    const char *key, *json;
} prio_field_t;

enum { P_ADMITTED, P_REJECTED, P_QUEUED, P_WAIT_P50, P_WAIT_P90, P_WAIT_P99, NPFIELDS };

#define PRIO_OF(i) ((i) + AT_PRIORITY_MIN)

/* mod_adaptive_throttle_status_model.c: each zone configured, with its
 * figures read now (an array of zone_view_t). */
apr_array_header_t *at_status_zone_views(apr_pool_t *p);
/* Integers print as integers (exact to 2^53), the rest with 3 decimals. */
const char *at_status_num(apr_pool_t *p, double v);
/* A field's value as the text formats show it. */
const char *at_status_value_text(apr_pool_t *p, const zone_view_t *z, int f);
int at_status_prio_seen(const at_priority_stats_t *ps);
void at_status_prio_values(const at_priority_stats_t *ps, double *v);
/* Live children and their drawn lifetimes, if ThrottleChildLifetime is set. */
apr_array_header_t *at_status_child_views(apr_pool_t *p);

/* ?prometheus (mod_adaptive_throttle_status_prometheus.c). */
void at_status_emit_prometheus(request_rec *r, apr_array_header_t *views);

#endif
