/*
 * The status page's model, which its formats (mod_adaptive_throttle_status.c
 * and mod_adaptive_throttle_status_prometheus.c) write from: the table of
 * fields, each zone's figures as they are shown, live children, and the
 * per-priority rows. It calls neither format.
 */
#include "httpd.h"

#include "apr_strings.h"

#include "at_hist.h"
#include "at_life.h"
#include "at_limit.h"
#include "at_mem.h"
#include "at_owner.h"
#include "at_parse.h"
#include "at_zone.h"
#include "mod_adaptive_throttle.h"
#include "mod_adaptive_throttle_status.h"

const field_t at_status_fields[NFIELDS] = {
    {"Limit", "limit", "limit", NULL, GAUGE, "Requests of the zone allowed to run at once.", ALWAYS},
    {"LimitMin", "limit_min", "limit_min", NULL, GAUGE, "Lowest value the limit may take.", IF_AUTO},
    {"LimitMax", "limit_max", "limit_max", NULL, GAUGE, "Highest value the limit may take.", IF_AUTO},
    {"LimitMaxFrom", "limit_max_from", NULL, NULL, GAUGE, NULL, IF_AUTO},
    {"Active", "active", "active", NULL, GAUGE, "Requests running now, holding a slot.", ALWAYS},
    {"Queued", "queued", "queued", NULL, GAUGE, "Requests waiting for a slot now.", ALWAYS},
    {"QueueCapacity", "queue_capacity", "queue_capacity", NULL, GAUGE, "Requests allowed to wait.", ALWAYS},
    {"TimeoutMs", "timeout_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"Stale", "stale", "stale", NULL, GAUGE, "1 if the zone's lock was held throughout the read (a stopped or hung process): only limit, active, queued, queue capacity and the totals are current.", ALWAYS},
    {"DryRun", "dry_run", "dry_run", NULL, GAUGE, "1 if the zone only decides and counts (dry_run=on).", ALWAYS},
    {"OverCap", "over_cap", "over_cap", NULL, GAUGE, "Dry run: requests running beyond the limit now.", ALWAYS},
    {"OldestRunningMs", "oldest_running_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"OldestRunningPid", "oldest_running_pid", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceMeanMs", "service_mean_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"WaitP50Ms", "wait_p50_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"WaitP90Ms", "wait_p90_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"WaitP99Ms", "wait_p99_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"WaitMaxMs", "wait_max_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"WaitSamples", "wait_samples", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceP50Ms", "service_p50_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceP90Ms", "service_p90_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceP99Ms", "service_p99_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceMaxMs", "service_max_ms", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"ServiceSamples", "service_samples", NULL, NULL, GAUGE, NULL, ALWAYS},
    {"LimitAuto", "limit_auto", "limit_auto", NULL, GAUGE, "1 if the limit adapts (limit=auto).", IF_AUTO},
    {"LimitHeld", "limit_held", "limit_held", NULL, GAUGE, "limit=auto: the level the limit goes back to after a probe.", IF_AUTO},
    {"LimitMode", "limit_mode", NULL, NULL, GAUGE, NULL, IF_AUTO},
    {"LimitChanges", "limit_changes", "limit_changes_total", NULL, COUNTER, "Times limit=auto changed the limit.", IF_AUTO},
    {"BaselineMs", "baseline_ms", NULL, NULL, GAUGE, NULL, IF_AUTO},
    {"RecentServiceMs", "recent_service_ms", NULL, NULL, GAUGE, NULL, IF_AUTO},
    {"PerClient", "per_client", "per_client", NULL, GAUGE, "Requests one client address may have running or waiting; 0: no limit.", ALWAYS},
    {"PerKey", "per_key", "per_key", NULL, GAUGE, "Requests one key (key=) may have running or waiting; 0: no limit.", ALWAYS},
    {"Clients", "clients", "clients", NULL, GAUGE, "Client addresses (per_client) or keys (per_key) with requests running or waiting; 0 without either.", ALWAYS},
    {"Reserve", "reserve", "reserve", NULL, GAUGE, "Slots that requests of priority 0 and below leave free (reserve=).", ALWAYS},
    {"CodelTargetMs", "codel_target_ms", NULL, NULL, GAUGE, NULL, IF_CODEL},
    {"CodelIntervalMs", "codel_interval_ms", NULL, NULL, GAUGE, NULL, IF_CODEL},
    {"QueueStanding", "queue_standing", "queue_standing", NULL, GAUGE, "1 while the queue stands (codel=): waits are cut to the target.", IF_CODEL},
    {"QueueStandingMs", "queue_standing_ms", NULL, NULL, GAUGE, NULL, IF_CODEL},
    {"Mem", "mem_bytes", "mem_bytes", NULL, GAUGE, "Memory a request of the zone needs available to start (mem=); 0: not checked.", IF_MEM},
    {"MemAvailable", "mem_available_bytes", "mem_available_bytes", NULL, GAUGE, "Available memory at the last reading (mem= zones).", IF_MEM},
    {"MemSource", "mem_source", NULL, NULL, GAUGE, NULL, IF_MEM},
    {"MemReadingAgeMs", "mem_reading_age_ms", NULL, NULL, GAUGE, NULL, IF_MEM},
    {"HeldForMemory", "held_for_memory", "held_for_memory_total", NULL, COUNTER, "Requests that waited though a slot was free, for memory (mem=).", IF_MEM},
    {"MemReadErrors", "mem_read_errors", "mem_read_errors_total", NULL, COUNTER, "Readings of the available memory that failed (mem= is then not enforced).", IF_MEM},
    {"Rate", "rate", "rate_per_second", NULL, GAUGE, "Requests per second the zone (or each key) may start (rate=); 0: no rate.", ALWAYS},
    {"RateBurst", "rate_burst", "rate_burst", NULL, GAUGE, "Requests that may run ahead of the rate (rate=R/s:BURST).", IF_RATE},
    {"RateDelay", "rate_delay", NULL, NULL, GAUGE, NULL, IF_RATE},
    {"RateByKey", "rate_by_key", NULL, NULL, GAUGE, NULL, IF_RATE},
    {"RateKeys", "rate_keys", "rate_keys", NULL, GAUGE, "Keys whose rate= bucket is not empty (rate= with key=).", IF_RATE},
    {"ReadBodyHeld", "read_body_held_bytes", "read_body_held_bytes", NULL, GAUGE, "Body bytes read before a slot (read_body=) by the zone's waiting requests now; at most read_body_total=.", ALWAYS},
    {"Cluster", "cluster", "cluster", NULL, GAUGE, "1 if the zone's limit is a fleet's, shared through Redis (cluster=).", ALWAYS},
    {"ClusterTotal", "cluster_total", "cluster_total", NULL, GAUGE, "cluster=: the fleet's limit (the zone's limit=); the zone's Limit is this server's share.", IF_CLUSTER},
    {"ClusterShare", "cluster_share", "cluster_share", NULL, GAUGE, "cluster=: the share Redis counts this server for.", IF_CLUSTER},
    {"ClusterDemand", "cluster_demand", "cluster_demand", NULL, GAUGE, "cluster=: this server's demand (running + queued, smoothed) as last sent.", IF_CLUSTER},
    {"ClusterMembers", "cluster_members", "cluster_members", NULL, GAUGE, "cluster=: servers seen at the last good sync, this one included.", IF_CLUSTER},
    {"ClusterSyncAgeSeconds", "cluster_sync_age_seconds", "cluster_sync_age_seconds", NULL, GAUGE, "cluster=: seconds since the last good sync with Redis (-1: none yet).", IF_CLUSTER},
    {"ClusterSyncOk", "cluster_sync_ok", "cluster_sync_ok", NULL, GAUGE, "cluster=: 1 if the last sync with Redis succeeded.", IF_CLUSTER},
    {"ClusterFallback", "cluster_fallback", "cluster_fallback", NULL, GAUGE, "cluster=: 1 while the lease has run out and the zone runs cluster_fallback=.", IF_CLUSTER},
    {"ClusterSyncFailures", "cluster_sync_failures", "cluster_sync_failures_total", NULL, COUNTER, "cluster=: syncs with Redis that failed.", IF_CLUSTER},
#define F_COUNTER_ROW(field, key, json, prom, label, help) \
    {key, json, prom, label, COUNTER, help, ALWAYS},
    AT_ZONE_COUNTERS(F_COUNTER_ROW)
#undef F_COUNTER_ROW
};

static double ms(apr_int64_t us)
{
    return (double)us / 1000.0;
}

static void fill_values(zone_view_t *z)
{
    const at_zone_stats_t *s = &z->s;
    double *v = z->v;

    v[F_LIMIT] = s->limit;
    v[F_LIMIT_MIN] = s->limit_min;
    v[F_LIMIT_MAX] = s->limit_max;
    v[F_LIMIT_AUTO] = s->limit_auto;
    v[F_LIMIT_HELD] = s->limit_held;
    v[F_LIMIT_MODE] = s->limit_mode;
    v[F_LIMIT_CHANGES] = (double)s->limit_changes;
    v[F_BASELINE] = s->baseline_us / 1000.0;
    v[F_RECENT_SERVICE] = s->recent_us / 1000.0;
    v[F_ACTIVE] = s->active;
    v[F_QUEUED] = s->queued;
    v[F_QUEUE_CAP] = s->queue_cap;
    v[F_TIMEOUT] = ms(s->timeout_us);
    v[F_STALE] = s->stale;
    v[F_DRY_RUN] = s->dry_run;
    v[F_OVER_CAP] = s->over_cap;
    v[F_OLDEST] = ms(s->oldest_us);
    v[F_OLDEST_PID] = s->oldest_pid;
    v[F_SERVICE_MEAN] = ms((apr_int64_t)s->service_ewma_us);
    v[F_WAIT_P50] = ms(at_hist_quantile(&s->wait_recent, 0.50));
    v[F_WAIT_P90] = ms(at_hist_quantile(&s->wait_recent, 0.90));
    v[F_WAIT_P99] = ms(at_hist_quantile(&s->wait_recent, 0.99));
    v[F_WAIT_MAX] = ms(s->wait_recent.max_us);
    v[F_WAIT_N] = (double)s->wait_recent.n;
    v[F_SERVICE_P50] = ms(at_hist_quantile(&s->service_recent, 0.50));
    v[F_SERVICE_P90] = ms(at_hist_quantile(&s->service_recent, 0.90));
    v[F_SERVICE_P99] = ms(at_hist_quantile(&s->service_recent, 0.99));
    v[F_SERVICE_MAX] = ms(s->service_recent.max_us);
    v[F_SERVICE_N] = (double)s->service_recent.n;
    v[F_PER_CLIENT] = s->per_client;
    v[F_PER_KEY] = s->per_key;
    v[F_CLIENTS] = s->clients;
    v[F_RESERVE] = s->reserve;
    v[F_CODEL_TARGET] = ms(s->codel_target_us);
    v[F_CODEL_INTERVAL] = ms(s->codel_interval_us);
    v[F_QUEUE_STANDING] = s->standing_us > 0;
    v[F_QUEUE_STANDING_MS] = ms(s->standing_us);
    v[F_MEM] = (double)s->mem_bytes;
    v[F_MEM_AVAIL] = (double)s->mem_avail;
    v[F_MEM_SOURCE] = s->mem_source;
    v[F_MEM_AGE] = ms(s->mem_read_age_us);
    v[F_MEM_HELD] = (double)s->mem_held;
    v[F_MEM_ERRORS] = (double)s->mem_read_errors;
    v[F_RATE] = s->rate.interval_ns ? 1e9 / (double)s->rate.interval_ns : 0;
    v[F_RATE_BURST] = s->rate.burst;
    /* no rate_delay=: every request of the burst runs at once, as nginx's nodelay */
    v[F_RATE_DELAY] = s->rate.delay == AT_RATE_NODELAY ? s->rate.burst : s->rate.delay;
    v[F_RATE_BY_KEY] = s->rate_by_key;
    v[F_RATE_KEYS] = s->rate_keys_in;
    v[F_READ_BODY_HELD] = (double)s->body_held;
#define F_COUNTER_VALUE(field, ...) v[F_##field] = (double)s->counters.field;
    AT_ZONE_COUNTERS(F_COUNTER_VALUE)
#undef F_COUNTER_VALUE
}

/* cluster=: the sync's state, in the memory the sync process writes. */
static void fill_cluster_values(zone_view_t *z, const zone_ref_t *ref)
{
    apr_uint32_t total = 0;
    const at_cluster_state_t *st = at_cluster_state_of(ref, &total);
    double *v = z->v;

    if (!st) {
        return;
    }
    v[F_CLUSTER] = 1;
    v[F_CLUSTER_TOTAL] = total;
    v[F_CLUSTER_SHARE] = st->share;
    v[F_CLUSTER_DEMAND] = st->demand;
    v[F_CLUSTER_MEMBERS] = st->members;
    v[F_CLUSTER_SYNC_AGE] = st->last_ok_us ? (double)((at_now_us() - st->last_ok_us) / 1000)
                                                 / 1000.0
                                           : -1;
    v[F_CLUSTER_SYNC_OK] = st->last_result == AT_CLUSTER_OK;
    v[F_CLUSTER_FALLBACK] = st->fallback;
    v[F_CLUSTER_SYNC_FAILURES] = (double)st->failures;
}

/* Each zone configured, with its figures read now. */
apr_array_header_t *at_status_zone_views(apr_pool_t *p)
{
    apr_array_header_t *refs = at_configured_zones(p);
    apr_array_header_t *views = apr_array_make(p, refs->nelts, sizeof(zone_view_t));
    int i;

    for (i = 0; i < refs->nelts; i++) {
        zone_ref_t *ref = APR_ARRAY_IDX(refs, i, zone_ref_t *);
        zone_view_t *z = apr_array_push(views);

        z->name = ref->name;
        at_zone_stats(ref->zone, &z->s);
        fill_values(z);
        fill_cluster_values(z, ref);
        /* configuration, not the zone's: where max came from */
        z->v[F_LIMIT_MAX_FROM] = ref->conf.max_from;
    }
    return views;
}

/* Live children and their drawn lifetimes, if ThrottleChildLifetime is set. */
apr_array_header_t *at_status_child_views(apr_pool_t *p)
{
    at_life_t *l = at_life_shared();
    apr_array_header_t *v = apr_array_make(p, 16, sizeof(at_child_t));
    apr_uint32_t i;

    for (i = 0; l && i < at_life_capacity(l); i++) {
        at_child_t c = *at_life_child(l, i);
        if (c.owner.pid != 0 && at_owner_alive(&c.owner)) {
            *(at_child_t *)apr_array_push(v) = c;
        }
    }
    return v;
}

/* Integers print as integers (exact to 2^53), the rest with 3 decimals. */
const char *at_status_num(apr_pool_t *p, double v)
{
    if (v == (double)(apr_int64_t)v) {
        return apr_psprintf(p, "%" APR_INT64_T_FMT, (apr_int64_t)v);
    }
    return apr_psprintf(p, "%.3f", v);
}

/* A field's value as the text formats show it. */
const char *at_status_value_text(apr_pool_t *p, const zone_view_t *z, int f)
{
    apr_uint32_t word = (apr_uint32_t)z->v[f];

    switch (f) {
    case F_MEM_SOURCE:
        return at_mem_source_name((at_mem_source_t)word);
    case F_LIMIT_MAX_FROM:
        return at_max_from_name(word);
    case F_LIMIT_MODE:
        return at_limit_mode_name(word);
    default:
        return at_status_num(p, z->v[f]);
    }
}

int at_status_prio_seen(const at_priority_stats_t *ps)
{
    return ps->admitted || ps->rejected || ps->queued;
}

void at_status_prio_values(const at_priority_stats_t *ps, double *v)
{
    v[P_ADMITTED] = (double)ps->admitted;
    v[P_REJECTED] = (double)ps->rejected;
    v[P_QUEUED] = ps->queued;
    v[P_WAIT_P50] = ms(at_hist_quantile(&ps->wait, 0.50));
    v[P_WAIT_P90] = ms(at_hist_quantile(&ps->wait, 0.90));
    v[P_WAIT_P99] = ms(at_hist_quantile(&ps->wait, 0.99));
}
