/*
 * Worker threads kept free. On httpd 2.4 a queued request holds its worker
 * (the event MPM cannot park a request without one), so waiters can take
 * every worker and leave static files in the listen backlog.
 * ThrottleKeepIdleWorkers N: a request that would have to wait is refused
 * at once while fewer than N workers of the server are idle.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "ap_mpm.h"
#include "scoreboard.h"

#include "apr_strings.h"
#include "apr_time.h"

#include <limits.h>
#include <stdlib.h>

#include "at_parse.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

/* The scoreboard is read only for a request that finds its zone full; a
 * refusal may rest on a count this old (per process), so that a flood of
 * refusals does not read it for each one. */
#define SCAN_EVERY_US (10 * 1000)
/* Default N: this share of MaxRequestWorkers, and at least KEEP_IDLE_MIN. */
#define KEEP_IDLE_PERCENT 5
#define KEEP_IDLE_MIN 2

static int keep_idle = -1; /* -1: the default, from MaxRequestWorkers */

static volatile apr_time_t scanned_at;
static volatile int idle_seen;

const char *at_set_keep_idle_workers(cmd_parms *cmd, void *dummy, const char *arg)
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    char *end;
    long n;
    (void)dummy;

    if (err) {
        return err;
    }
    n = strtol(arg, &end, 10);
    if (*arg == '\0' || *end != '\0' || n < 0 || n > 100000) {
        return apr_psprintf(cmd->pool,
                            "ThrottleKeepIdleWorkers: '%s' is not a number of "
                            "workers from 0 (off) to 100000",
                            arg);
    }
    keep_idle = (int)n;
    return NULL;
}

/* MaxRequestWorkers, or 0 if the MPM does not say. */
static int max_workers(void)
{
    int daemons = 0, threads = 0;

    if (ap_mpm_query(AP_MPMQ_MAX_DAEMONS, &daemons) != APR_SUCCESS ||
        ap_mpm_query(AP_MPMQ_MAX_THREADS, &threads) != APR_SUCCESS || daemons <= 0) {
        return 0;
    }
    return daemons * (threads > 0 ? threads : 1);
}

static int keep_idle_workers(void)
{
    int n;

    if (keep_idle >= 0) {
        return keep_idle;
    }
    n = max_workers() * KEEP_IDLE_PERCENT / 100;
    return n < KEEP_IDLE_MIN ? KEEP_IDLE_MIN : n;
}

/* Workers not serving a request: MaxRequestWorkers less those busy in the
 * scoreboard (a worker the MPM has not started yet is as good as idle). */
static int count_idle_workers(void)
{
    int limit_daemons = 0, limit_threads = 0, busy = 0, i, j;

    if (!ap_scoreboard_image ||
        ap_mpm_query(AP_MPMQ_HARD_LIMIT_DAEMONS, &limit_daemons) != APR_SUCCESS ||
        ap_mpm_query(AP_MPMQ_HARD_LIMIT_THREADS, &limit_threads) != APR_SUCCESS) {
        return INT_MAX;
    }
    if (limit_threads < 1) {
        limit_threads = 1;
    }
    for (i = 0; i < limit_daemons; i++) {
        for (j = 0; j < limit_threads; j++) {
            int st = ap_get_scoreboard_worker_from_indexes(i, j)->status;

            busy += st != SERVER_DEAD && st != SERVER_READY && st != SERVER_IDLE_KILL;
        }
    }
    return max_workers() - busy;
}

int at_workers_let_wait(void)
{
    int keep = keep_idle_workers(), idle;
    apr_time_t now = apr_time_now();

    if (idle_seen < keep && now - scanned_at < SCAN_EVERY_US && now >= scanned_at) {
        return 0;
    }
    /* A waiter holds its worker while it waits: it is let in only on a
     * count of its own, in which every request already accepted is busy
     * (another thread may store its count meanwhile). */
    idle = count_idle_workers();
    idle_seen = idle;
    scanned_at = now;
    return idle >= keep;
}

int at_may_wait(at_zone_t *z, int priority)
{
    if (keep_idle_workers() == 0) {
        return 1;
    }
    /* Likely to run at once: the scoreboard is read only if it must wait
     * after all, under the zone's lock (a slot taken or a waiter queued
     * meanwhile, or mem= holding it back). */
    return at_zone_looks_free(z, priority) ? AT_WAIT_ASK : at_workers_let_wait();
}

/* The workers a zone can hold at once: its running and waiting requests. */
static apr_uint64_t workers_held(const at_zone_conf_t *c)
{
    return (apr_uint64_t)at_conf_highest_limit(c) + c->queue;
}

static int sized_from_workers(const at_zone_conf_t *c)
{
    return c->limit_auto && c->max_from != AT_MAX_GIVEN;
}

/* A fixed zone's default queue (10 x its limit) is cut to what its fair
 * share of the workers leaves beside its limit: one zone's default queue
 * may not take the workers another zone needs. */
static void cut_default_queue(server_rec *s, zone_ref_t *ref, apr_int64_t fair)
{
    at_zone_conf_t *c = &ref->conf;
    apr_int64_t room = fair - (apr_int64_t)c->limit;

    if (c->limit_auto || !c->queue_default || (apr_int64_t)c->queue <= room) {
        return;
    }
    c->queue = room > 0 ? (apr_uint32_t)room : 0;
    ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: default queue cut to %u, "
                 "its share of the workers (%" APR_INT64_T_FMT ") less its limit; give "
                 "queue= to choose", ref->name, c->queue, fair);
}

/* The workers the zones may hold (MaxRequestWorkers less those kept idle)
 * go first to what the configuration sets: fixed zones' limit and queue,
 * auto zones' max= and queue=. Defaults then share the rest: a fixed
 * zone's default queue is cut to its fair share (the workers over the
 * zones), and limit=auto without max= gets what is left, shared equally,
 * and never less than a fair share. A configuration whose defaults cannot
 * fit at all (a fair share below 2) fails the configuration check, with
 * what to set. Where the MPM does not say, max stays 16 x the CPUs. */
int at_size_zones(server_rec *s, apr_pool_t *p)
{
    apr_array_header_t *zones = at_defined_zones(p);
    apr_int64_t usable = max_workers() - keep_idle_workers(), left, share, fair;
    apr_uint32_t n = 0, defaults = 0;
    int i;

    if (max_workers() <= 0 || !zones->nelts) {
        return OK;
    }
    fair = usable / zones->nelts;
    for (i = 0; i < zones->nelts; i++) {
        const at_zone_conf_t *c = &APR_ARRAY_IDX(zones, i, zone_ref_t *)->conf;

        defaults += sized_from_workers(c) || (!c->limit_auto && c->queue_default);
    }
    if (defaults && fair < 2) {
        ap_log_error(APLOG_MARK, APLOG_STARTUP | APLOG_EMERG, 0, s,
                     "mod_adaptive_throttle: %d zones share %" APR_INT64_T_FMT " workers "
                     "(MaxRequestWorkers %d less ThrottleKeepIdleWorkers %d): too few for "
                     "their default queue= and limit=auto's max=; raise MaxRequestWorkers, "
                     "or give each zone queue= (and max= with limit=auto)",
                     zones->nelts, usable > 0 ? usable : 0, max_workers(), keep_idle_workers());
        return !OK;
    }
    left = usable;
    for (i = 0; i < zones->nelts; i++) {
        zone_ref_t *ref = APR_ARRAY_IDX(zones, i, zone_ref_t *);

        cut_default_queue(s, ref, fair);
        n += sized_from_workers(&ref->conf);
        left -= sized_from_workers(&ref->conf) ? 0 : (apr_int64_t)workers_held(&ref->conf);
    }
    if (!n) {
        return OK;
    }
    share = left / n > fair ? left / n : fair;
    for (i = 0; i < zones->nelts; i++) {
        zone_ref_t *ref = APR_ARRAY_IDX(zones, i, zone_ref_t *);

        if (!sized_from_workers(&ref->conf)) {
            continue;
        }
        at_conf_max_from_workers(&ref->conf, (apr_uint32_t)share);
        ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: limit=auto may run up to %u, "
                     "waiting up to %u: the workers left by MaxRequestWorkers, "
                     "ThrottleKeepIdleWorkers and the other zones (%" APR_INT64_T_FMT "), "
                     "shared by %u zone(s) without max=, and never less than a fair share "
                     "(%" APR_INT64_T_FMT ")", ref->name, ref->conf.limit_max,
                     ref->conf.queue, left > 0 ? left : 0, n, fair);
    }
    return OK;
}

/* At startup: the zones' running and waiting requests together against the
 * workers left once N are kept idle. */
void at_warn_if_workers_short(server_rec *s, apr_pool_t *p)
{
    apr_array_header_t *zones = at_configured_zones(p);
    const char *list = "";
    apr_uint64_t need = 0;
    int workers = max_workers(), keep = keep_idle_workers(), i;

    if (workers <= 0) {
        return;
    }
    for (i = 0; i < zones->nelts; i++) {
        const zone_ref_t *ref = APR_ARRAY_IDX(zones, i, zone_ref_t *);
        apr_uint32_t n = at_conf_highest_limit(&ref->conf);

        need += workers_held(&ref->conf);
        list = apr_psprintf(p, "%s%s%s %u+%u", list, *list ? ", " : "", ref->name, n,
                            ref->conf.queue);
    }
    if (need + (apr_uint64_t)keep > (apr_uint64_t)workers) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s,
                     "zones' running + waiting requests "
                     "(%s: %" APR_UINT64_T_FMT ") can take more than the %d of "
                     "MaxRequestWorkers (%d) left once ThrottleKeepIdleWorkers (%d) are "
                     "kept idle: a request that would wait is then refused at once "
                     "(rejected-workers); lower queue= or raise MaxRequestWorkers",
                     list, need, workers - keep, workers, keep);
    }
}

static int workers_pre_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    keep_idle = -1;
    scanned_at = 0;
    return OK;
}

void at_workers_register_hooks(void)
{
    ap_hook_pre_config(workers_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
}
