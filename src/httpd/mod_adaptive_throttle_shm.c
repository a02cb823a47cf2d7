/*
 * The zones' shared memory over the server's life: made in post_config,
 * kept across restarts when the new definition fits (a zone that cannot be
 * kept is laid anew and the old one counts until it drains), freed once
 * idle, and what dead children held given back (child_status, monitor).
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "ap_mpm.h"
#include "mpm_common.h"

#include "apr_hash.h"
#include "apr_shm.h"
#include "apr_strings.h"

#include "at_mem.h"
#include "at_parse.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

/* Named for the layout of retained_t: a build with another one starts
 * afresh instead of reading this one's. */
#define RETAINED_KEY "mod_adaptive_throttle-zones-2"

/* A zone's shared memory, in the parent's process pool. */
typedef struct {
    at_zone_t *zone;
    apr_shm_t *shm;
} segment_t;

/* Segments kept across restarts: one per zone name, and those replaced or
 * no longer configured, freed once nothing runs or waits in them. */
typedef struct {
    apr_hash_t *zones;           /* name -> segment_t * */
    apr_array_header_t *retired; /* segment_t * */
} retained_t;

static retained_t *retained;

static apr_uint32_t with_headroom(apr_uint32_t n, apr_uint32_t floor,
                                  apr_uint32_t max)
{
    apr_uint64_t h = (apr_uint64_t)n * 2;

    if (h < floor) {
        h = floor;
    }
    return (apr_uint32_t)(h > max ? (n > max ? n : max) : h);
}

static segment_t *zone_create(server_rec *s, zone_ref_t *ref)
{
    apr_uint32_t nslots = with_headroom(at_conf_highest_limit(&ref->conf), 64, AT_LIMIT_MAX);
    apr_uint32_t nwaiters = with_headroom(ref->conf.queue, 256, AT_QUEUE_MAX);
    apr_size_t size =
        at_zone_size(nslots, nwaiters, at_rate_keys_for(&ref->conf.rate, (int)ref->conf.keyed));
    apr_shm_t *shm;
    apr_status_t rv;
    segment_t *seg;
    at_zone_conf_t conf = ref->conf;

    at_cluster_starting_conf(ref, NULL, &conf);
    /* Anonymous memory in the process pool: inherited by every child and
     * kept across graceful restarts until the server stops or the zone is
     * replaced and drained (free_retired). */
    rv = apr_shm_create(&shm, size, NULL, s->process->pool);
    if (rv == APR_SUCCESS) {
        rv = at_zone_init(apr_shm_baseaddr_get(shm), size, ref->name, &conf, nslots,
                          nwaiters);
    }
    if (rv != APR_SUCCESS) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, rv, s,
                     "mod_adaptive_throttle: cannot create shared memory of %"
                     APR_SIZE_T_FMT " bytes for zone %s", size, ref->name);
        return NULL;
    }
    seg = apr_palloc(s->process->pool, sizeof(*seg));
    seg->zone = apr_shm_baseaddr_get(shm);
    seg->shm = shm;
    return seg;
}

/* A zone replaced at this restart: if it is of this build's layout and
 * sound, the new one counts what still runs in it; it is freed once idle.
 * Another layout's (an upgrade) or a broken one is never read again. */
static void retire(server_rec *s, segment_t *old, segment_t *new_seg)
{
    if (new_seg && at_zone_compatible(old->zone)) {
        at_zone_succeed(new_seg->zone, old->zone);
        APR_ARRAY_PUSH(retained->retired, segment_t *) = old;
        return;
    }
    if (!new_seg && at_zone_compatible(old->zone)) {
        APR_ARRAY_PUSH(retained->retired, segment_t *) = old; /* removed: freed once idle */
        return;
    }
    ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "freeing the shared memory of a zone "
                 "laid by another build or with a broken lock");
    apr_shm_destroy(old->shm);
}

/* In the parent: frees retired zones that nothing runs or waits in any
 * more, once no zone counts them (children forked later never look). */
static void free_retired(server_rec *s)
{
    apr_hash_index_t *hi;
    int i, kept = 0;

    if (!retained) {
        return;
    }
    for (hi = apr_hash_first(NULL, retained->zones); hi; hi = apr_hash_next(hi)) {
        at_zone_let_go_predecessor(((segment_t *)apr_hash_this_val(hi))->zone);
    }
    for (i = 0; i < retained->retired->nelts; i++) {
        at_zone_let_go_predecessor(APR_ARRAY_IDX(retained->retired, i, segment_t *)->zone);
    }
    for (i = 0; i < retained->retired->nelts; i++) {
        segment_t *seg = APR_ARRAY_IDX(retained->retired, i, segment_t *);
        int counted = 0;

        for (hi = apr_hash_first(NULL, retained->zones); hi && !counted; hi = apr_hash_next(hi)) {
            counted = at_zone_counts(((segment_t *)apr_hash_this_val(hi))->zone, seg->zone);
        }
        for (int k = 0; k < retained->retired->nelts && !counted; k++) {
            counted = at_zone_counts(APR_ARRAY_IDX(retained->retired, k, segment_t *)->zone,
                                     seg->zone);
        }
        if (counted || !at_zone_idle(seg->zone)) {
            APR_ARRAY_IDX(retained->retired, kept++, segment_t *) = seg;
            continue;
        }
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, s, "freed the shared memory of a "
                     "replaced zone, now idle");
        apr_shm_destroy(seg->shm);
    }
    retained->retired->nelts = kept;
}

/* mem= in a container whose cgroup cannot be read would measure the host's
 * memory without a word: say so once, at startup. */
static void warn_if_mem_blind(server_rec *s, apr_pool_t *ptemp)
{
    const char *zones = NULL;
    char path[512];
    apr_hash_t *zone_refs = at_zone_refs();
    apr_hash_index_t *hi;

    for (hi = zone_refs ? apr_hash_first(ptemp, zone_refs) : NULL; hi;
         hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);

        if (ref->conf.mem_bytes) {
            zones = zones ? apr_pstrcat(ptemp, zones, " ", ref->name, NULL) : ref->name;
        }
    }
    if (zones && at_mem_cgroup_unreadable(at_faults_mem_root(), path, sizeof(path))) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, "mem= (zones: %s): this server "
                     "runs in cgroup %s, whose memory limit cannot be read (is the "
                     "cgroup filesystem mounted?); mem= measures the machine's "
                     "MemAvailable instead, which may be far more than the cgroup "
                     "allows", zones, path);
    }
}

/* post_config: every zone named gets its shared zone, kept from the last
 * generation where it can be; those no longer named are retired. */
int at_lay_zones(server_rec *s, apr_pool_t *ptemp)
{
    apr_hash_t *zone_refs = at_zone_refs();
    apr_hash_index_t *hi;

    retained = ap_retained_data_get(RETAINED_KEY);
    if (!retained) {
        retained = ap_retained_data_create(RETAINED_KEY, sizeof(*retained));
        retained->zones = apr_hash_make(s->process->pool);
        retained->retired = apr_array_make(s->process->pool, 4, sizeof(segment_t *));
    }
    for (hi = zone_refs ? apr_hash_first(ptemp, zone_refs) : NULL; hi;
         hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);
        segment_t *seg = apr_hash_get(retained->zones, ref->name, APR_HASH_KEY_STRING);
        at_zone_conf_t conf = ref->conf;
        apr_status_t rv;
        segment_t *fresh;

        at_cluster_starting_conf(ref, seg ? seg->zone : NULL, &conf);
        /* a cluster zone starts below its total: kept only if the whole
         * total fits, or a share above its slots could not be run */
        rv = APR_EINVAL;
        if (seg && at_zone_can_hold(seg->zone, &ref->conf)) {
            rv = at_zone_reconfigure(seg->zone, &conf);
        }

        if (rv == APR_SUCCESS) {
            ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: kept across restart "
                         "(limit %u, queue %u)", ref->name, ref->conf.limit,
                         ref->conf.queue);
        }
        else if (APR_STATUS_IS_EBUSY(rv)) {
            /* The parent never waits on a child: the holder applies it. */
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, "zone %s: kept across restart; "
                         "its lock is held (by a stopped or hung process?), so the new "
                         "definition applies when the lock is next taken", ref->name);
        }
        else {
            if (!(fresh = zone_create(s, ref))) {
                return HTTP_INTERNAL_SERVER_ERROR;
            }
            if (seg) {
                ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: its shared memory "
                             "cannot be kept (the zone grew beyond it, a build of "
                             "another layout laid it, or its lock is broken); starting "
                             "it anew: until the requests running in the old one end, "
                             "they count against the new limit", ref->name);
                retire(s, seg, fresh);
            }
            apr_hash_set(retained->zones, apr_pstrdup(s->process->pool, ref->name),
                         APR_HASH_KEY_STRING, fresh);
            seg = fresh;
        }
        ref->zone = seg->zone;
    }
    /* zones no longer configured: freed once nothing runs or waits in them */
    for (hi = apr_hash_first(ptemp, retained->zones); hi; hi = apr_hash_next(hi)) {
        const char *name = apr_hash_this_key(hi);

        if (!zone_refs || !apr_hash_get(zone_refs, name, APR_HASH_KEY_STRING)) {
            retire(s, apr_hash_this_val(hi), NULL);
            apr_hash_set(retained->zones, name, APR_HASH_KEY_STRING, NULL);
        }
    }
    free_retired(s);
    warn_if_mem_blind(s, ptemp);
    return OK;
}

static void reclaim_zone(at_zone_t *z, pid_t pid)
{
    if (pid > 0) {
        at_zone_reclaim_pid_nowait(z, (apr_int32_t)pid);
    }
    else {
        at_zone_reclaim_nowait(z);
    }
}

/* pid 0: every dead owner; else the records of that process alone. Retired
 * zones too: their dead must not hold the new zone's limit. */
static void reclaim_dead(pid_t pid)
{
    apr_hash_index_t *hi;
    int i;

    if (!retained) {
        return;
    }
    for (hi = apr_hash_first(NULL, retained->zones); hi; hi = apr_hash_next(hi)) {
        reclaim_zone(((segment_t *)apr_hash_this_val(hi))->zone, pid);
    }
    for (i = 0; i < retained->retired->nelts; i++) {
        reclaim_zone(APR_ARRAY_IDX(retained->retired, i, segment_t *)->zone, pid);
    }
}

/* In the parent: a child has exited, so what it held can go back now. */
static void throttle_child_status(server_rec *s, pid_t pid, ap_generation_t gen,
                                  int slot, mpm_child_status status)
{
    (void)s;
    (void)gen;
    (void)slot;
    if (status == MPM_CHILD_EXITED) {
        reclaim_dead(pid);
    }
}

static int throttle_monitor(apr_pool_t *p, server_rec *s)
{
    (void)p;
    reclaim_dead(0);
    free_retired(s);
    return DECLINED;
}

void at_shm_register_hooks(void)
{
    ap_hook_child_status(throttle_child_status, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_monitor(throttle_monitor, NULL, NULL, APR_HOOK_MIDDLE);
}
