/*
 * mod_adaptive_throttle: the httpd glue. Directives, the per-request
 * decision, the shared memory life cycle and the status page. The zone
 * logic itself is in the APR-only core (at_zone.c, at_parse.c, at_owner.c).
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_main.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_expr.h"
#include "ap_mpm.h"
#include "mpm_common.h"

#include "apr_fnmatch.h"
#include "apr_hash.h"
#include "apr_shm.h"
#include "apr_strings.h"

#include <poll.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/socket.h>

#include "mod_status.h"

#include "at_mem.h"
#include "at_memgate.h"
#include "at_parse.h"
#include "at_zone.h"
#include "mod_adaptive_throttle.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0
#endif

/* Named for the layout of retained_t: a build with another one starts
 * afresh instead of reading this one's. */
#define RETAINED_KEY "mod_adaptive_throttle-zones-2"
#define RELEASE_FILTER "THROTTLE_RELEASE"

module AP_MODULE_DECLARE_DATA adaptive_throttle_module;
APLOG_USE_MODULE(adaptive_throttle);

typedef struct {
    const char *pattern;
    int is_glob;
    zone_ref_t *ref;
} handler_map_t;

enum { ZONE_UNSET = 0, ZONE_SET, ZONE_OFF };

typedef struct {
    int zone_state;
    zone_ref_t *ref;
    apr_array_header_t *bypass; /* ap_expr_info_t * */
    int priority_set;           /* ThrottlePriority given here */
    int priority;
    apr_int64_t priority_timeout_us; /* 0: the zone's timeout */
} dir_conf_t;

/* The outcome for one initial request, kept on the initial request so an
 * internal redirect is not counted twice. */
typedef struct {
    zone_ref_t *ref;
    at_ticket_t ticket;
    const char *result;
    int priority;
    int holding;
    int refused; /* answered 503: what runs next is its ErrorDocument */
} req_state_t;

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

static apr_hash_t *zone_refs; /* name -> zone_ref_t *, for this config cycle */
static retained_t *retained;

/* ---- configuration ---------------------------------------------------- */

static apr_status_t forget_refs(void *unused)
{
    (void)unused;
    zone_refs = NULL;
    return APR_SUCCESS;
}

const char *at_cmd_where(cmd_parms *cmd)
{
    return apr_psprintf(cmd->pool, "%s:%d", cmd->directive->filename,
                        cmd->directive->line_num);
}

zone_ref_t *at_zone_ref_for(cmd_parms *cmd, const char *name)
{
    zone_ref_t *ref;

    if (!zone_refs) {
        zone_refs = apr_hash_make(cmd->pool);
        apr_pool_cleanup_register(cmd->pool, NULL, forget_refs,
                                  apr_pool_cleanup_null);
    }
    ref = apr_hash_get(zone_refs, name, APR_HASH_KEY_STRING);
    if (!ref) {
        ref = apr_pcalloc(cmd->pool, sizeof(*ref));
        ref->name = apr_pstrdup(cmd->pool, name);
        ref->first_use = at_cmd_where(cmd);
        apr_hash_set(zone_refs, ref->name, APR_HASH_KEY_STRING, ref);
    }
    return ref;
}

static const char *set_zone(cmd_parms *cmd, void *dummy, int argc,
                            char *const argv[])
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    at_zone_conf_t conf;
    zone_ref_t *ref;
    (void)dummy;

    if (err) {
        return err;
    }
    if (argc < 1) {
        return "ThrottleZone needs a name and limit=N, e.g. ThrottleZone cgi limit=4";
    }
    if ((err = at_parse_zone_name(cmd->pool, argv[0]))) {
        return apr_pstrcat(cmd->pool, "ThrottleZone: ", err, NULL);
    }
    err = at_parse_zone_args(cmd->pool, argc - 1, (const char *const *)argv + 1,
                             &conf);
    if (err) {
        return apr_psprintf(cmd->pool, "ThrottleZone %s: %s", argv[0], err);
    }
    ref = at_zone_ref_for(cmd, argv[0]);
    if (ref->defined_at) {
        return apr_psprintf(cmd->pool, "ThrottleZone %s: zone already defined at %s",
                            argv[0], ref->defined_at);
    }
    ref->defined_at = at_cmd_where(cmd);
    ref->conf = conf;
    return NULL;
}

static const char *set_throttle(cmd_parms *cmd, void *dconf, const char *name)
{
    dir_conf_t *d = dconf;
    const char *err;

    if (strcasecmp(name, "off") == 0) {
        d->zone_state = ZONE_OFF;
        d->ref = NULL;
        return NULL;
    }
    if ((err = at_parse_zone_name(cmd->pool, name))) {
        return apr_pstrcat(cmd->pool, "Throttle: ", err, " (give a zone name or 'off')",
                           NULL);
    }
    d->zone_state = ZONE_SET;
    d->ref = at_zone_ref_for(cmd, name);
    return NULL;
}

static const char *set_handler_zone(cmd_parms *cmd, void *dummy,
                                    const char *handler, const char *name)
{
    srv_conf_t *sc = ap_get_module_config(cmd->server->module_config,
                                          &adaptive_throttle_module);
    handler_map_t *m;
    const char *err;
    int i;
    (void)dummy;

    if (!*handler) {
        return "ThrottleHandler: the handler name must not be empty";
    }
    if ((err = at_parse_zone_name(cmd->pool, name))) {
        return apr_psprintf(cmd->pool, "ThrottleHandler %s: %s", handler, err);
    }
    for (i = 0; i < sc->handlers->nelts; i++) {
        m = &APR_ARRAY_IDX(sc->handlers, i, handler_map_t);
        if (strcmp(m->pattern, handler) == 0) {
            return apr_psprintf(cmd->pool, "ThrottleHandler %s: this handler is "
                                "already mapped to zone %s in this server",
                                handler, m->ref->name);
        }
    }
    m = apr_array_push(sc->handlers);
    m->pattern = apr_pstrdup(cmd->pool, handler);
    m->is_glob = apr_fnmatch_test(handler);
    m->ref = at_zone_ref_for(cmd, name);
    return NULL;
}

static const char *set_bypass(cmd_parms *cmd, void *dconf, const char *expr)
{
    dir_conf_t *d = dconf;
    const char *err = NULL;
    ap_expr_info_t *info = ap_expr_parse_cmd(cmd, expr, 0, &err, NULL);

    if (err) {
        return apr_psprintf(cmd->pool, "ThrottleBypass: cannot parse expression "
                            "'%s': %s", expr, err);
    }
    *(ap_expr_info_t **)apr_array_push(d->bypass) = info;
    return NULL;
}

static const char *set_priority(cmd_parms *cmd, void *dconf, const char *n,
                                const char *opt)
{
    dir_conf_t *d = dconf;
    const char *err =
        at_parse_priority(cmd->pool, n, opt, &d->priority, &d->priority_timeout_us);

    if (err) {
        return apr_psprintf(cmd->pool, "ThrottlePriority: %s", err);
    }
    d->priority_set = 1;
    return NULL;
}

static void *create_srv_conf(apr_pool_t *p, server_rec *s)
{
    srv_conf_t *sc = apr_pcalloc(p, sizeof(*sc));
    (void)s;

    sc->handlers = apr_array_make(p, 4, sizeof(handler_map_t));
    return sc;
}

/* A virtual host's mappings come first, so they win over the main server's. */
static void *merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    srv_conf_t *base = basev, *add = addv, *sc = apr_pcalloc(p, sizeof(*sc));

    sc->handlers = apr_array_append(p, add->handlers, base->handlers);
    sc->agent = add->agent; /* only where ThrottleAgent is written */
    return sc;
}

static void *create_dir_conf(apr_pool_t *p, char *dir)
{
    dir_conf_t *d = apr_pcalloc(p, sizeof(*d));
    (void)dir;

    d->bypass = apr_array_make(p, 1, sizeof(ap_expr_info_t *));
    return d;
}

static void *merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
{
    dir_conf_t *base = basev, *add = addv, *d = apr_pcalloc(p, sizeof(*d));

    d->zone_state = add->zone_state != ZONE_UNSET ? add->zone_state : base->zone_state;
    d->ref = add->zone_state != ZONE_UNSET ? add->ref : base->ref;
    d->bypass = apr_array_append(p, base->bypass, add->bypass);
    d->priority_set = add->priority_set || base->priority_set;
    d->priority = add->priority_set ? add->priority : base->priority;
    d->priority_timeout_us =
        add->priority_set ? add->priority_timeout_us : base->priority_timeout_us;
    return d;
}

/* ---- life cycle --------------------------------------------------------- */

static void log_from_core(int level, const char *msg)
{
    ap_log_error(APLOG_MARK, level, 0, ap_server_conf, "%s", msg);
}

static int throttle_pre_config(apr_pool_t *pconf, apr_pool_t *plog,
                               apr_pool_t *ptemp)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    zone_refs = NULL;
    at_set_logger(log_from_core);
    return OK;
}

static int throttle_check_config(apr_pool_t *pconf, apr_pool_t *plog,
                                 apr_pool_t *ptemp, server_rec *s)
{
    apr_hash_index_t *hi;
    int rv = OK;
    (void)pconf;
    (void)plog;
    (void)ptemp;

    for (hi = zone_refs ? apr_hash_first(ptemp, zone_refs) : NULL; hi;
         hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);

        if (!ref->defined_at) {
            ap_log_error(APLOG_MARK, APLOG_STARTUP | APLOG_EMERG, 0, s,
                         "mod_adaptive_throttle: zone '%s' is used at %s but never "
                         "defined; add 'ThrottleZone %s limit=N' to the global "
                         "server configuration", ref->name, ref->first_use, ref->name);
            rv = !OK;
        }
    }
    /* here, not at post_config: so that apachectl -t says it too */
    if (rv == OK) {
        rv = at_size_zones(s, ptemp);
    }
    return rv;
}

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
    apr_size_t size = at_zone_size(nslots, nwaiters);
    apr_shm_t *shm;
    apr_status_t rv;
    segment_t *seg;

    /* Anonymous memory in the process pool: inherited by every child and
     * kept across graceful restarts until the server stops or the zone is
     * replaced and drained (free_retired). */
    rv = apr_shm_create(&shm, size, NULL, s->process->pool);
    if (rv == APR_SUCCESS) {
        rv = at_zone_init(apr_shm_baseaddr_get(shm), size, ref->name, &ref->conf,
                          nslots, nwaiters);
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

#ifdef AT_TEST_HOOKS
/* Fault injection for the test suite (built into the test module only,
 * armed from the server's own environment): the first request to reach a
 * zone takes the zone's lock and never lets go, so that a test can stop or
 * kill a process that holds it. */
#define LOCK_HOLDER_ENV "MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER"
static const char *lock_holder_file;

static void arm_lock_holder(server_rec *s)
{
    lock_holder_file = getenv(LOCK_HOLDER_ENV);
    if (lock_holder_file) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, LOCK_HOLDER_ENV " is set: "
                     "the first throttled request will hang holding a zone's lock "
                     "(a test of lock recovery)");
    }
}

/* mem= reads its /proc and /sys files under this directory instead, so a
 * test can say how much memory is available; the test's requests may also
 * take longer than AT_MEM_SETTLE_US to show their memory there. */
#define MEM_ROOT_ENV "MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT"
#define MEM_SETTLE_ENV "MOD_ADAPTIVE_THROTTLE_TEST_MEM_SETTLE_MS"

static const char *mem_root(void)
{
    const char *root = getenv(MEM_ROOT_ENV);

    return root ? root : "";
}

static void arm_mem_root(server_rec *s)
{
    const char *settle = getenv(MEM_SETTLE_ENV);

    if (*mem_root()) {
        at_memgate_set_reading(mem_root(), settle ? apr_atoi64(settle) * 1000 : -1);
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, MEM_ROOT_ENV " is set: mem= "
                     "reads the available memory under %s (a test)", mem_root());
    }
}

static void maybe_hang_holding_lock(request_rec *r, at_zone_t *z)
{
    apr_file_t *f;

    if (!lock_holder_file
        || apr_file_open(&f, lock_holder_file, APR_FOPEN_WRITE | APR_FOPEN_CREATE
                         | APR_FOPEN_EXCL, APR_FPROT_OS_DEFAULT, r->pool) != APR_SUCCESS) {
        return;
    }
    at_zone_debug_take_lock(z); /* first, so the pid is written by a holder */
    apr_file_printf(f, "%d\n", (int)getpid());
    apr_file_close(f);
    for (;;) {
        pause();
    }
}
#else
#define arm_lock_holder(s) ((void)0)
#define arm_mem_root(s) ((void)0)
#define maybe_hang_holding_lock(r, z) ((void)0)
static const char *mem_root(void)
{
    return "";
}
#endif

/* mem= in a container whose cgroup cannot be read would measure the host's
 * memory without a word: say so once, at startup. */
static void warn_if_mem_blind(server_rec *s, apr_pool_t *ptemp)
{
    const char *zones = NULL;
    char path[512];
    apr_hash_index_t *hi;

    for (hi = zone_refs ? apr_hash_first(ptemp, zone_refs) : NULL; hi;
         hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);

        if (ref->conf.mem_bytes) {
            zones = zones ? apr_pstrcat(ptemp, zones, " ", ref->name, NULL) : ref->name;
        }
    }
    if (zones && at_mem_cgroup_unreadable(mem_root(), path, sizeof(path))) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, "mem= (zones: %s): this server "
                     "runs in cgroup %s, whose memory limit cannot be read (is the "
                     "cgroup filesystem mounted?); mem= measures the machine's "
                     "MemAvailable instead, which may be far more than the cgroup "
                     "allows", zones, path);
    }
}

static int throttle_post_config(apr_pool_t *pconf, apr_pool_t *plog,
                                apr_pool_t *ptemp, server_rec *s)
{
    apr_hash_index_t *hi;
    (void)pconf;
    (void)plog;

    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK; /* the first, trial pass over the configuration */
    }
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
        apr_status_t rv = seg ? at_zone_reconfigure(seg->zone, &ref->conf) : APR_EINVAL;
        segment_t *fresh;

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
    at_warn_if_workers_short(s, ptemp);
    arm_lock_holder(s);
    arm_mem_root(s);
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

/* ---- the request ---------------------------------------------------------- */

static zone_ref_t *zone_for_request(request_rec *r, dir_conf_t *d)
{
    srv_conf_t *sc;
    int i;

    if (d->zone_state == ZONE_SET) {
        return d->ref;
    }
    if (d->zone_state == ZONE_OFF || !r->handler) {
        return NULL;
    }
    sc = ap_get_module_config(r->server->module_config, &adaptive_throttle_module);
    for (i = 0; i < sc->handlers->nelts; i++) {
        handler_map_t *m = &APR_ARRAY_IDX(sc->handlers, i, handler_map_t);

        if (m->is_glob ? apr_fnmatch(m->pattern, r->handler, 0) == APR_SUCCESS
                       : strcmp(m->pattern, r->handler) == 0) {
            return m->ref;
        }
    }
    return NULL;
}

static int bypassed(request_rec *r, dir_conf_t *d)
{
    int i;

    for (i = 0; i < d->bypass->nelts; i++) {
        const char *err = NULL;
        int rc = ap_expr_exec(r, APR_ARRAY_IDX(d->bypass, i, ap_expr_info_t *), &err);

        if (err) {
            ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r,
                          "ThrottleBypass: cannot evaluate expression: %s", err);
        }
        else if (rc > 0) {
            return 1;
        }
    }
    return 0;
}

/* Polled while a request waits: has the client gone away? */
static int client_gone(void *ctx)
{
    request_rec *r = ctx;
    conn_rec *c = r->connection;
    apr_socket_t *sock;
    apr_os_sock_t fd;
    struct pollfd pfd;
    char byte;

    if (c->aborted) {
        return 1;
    }
    if (c->master) {
        return 0; /* an HTTP/2 stream: the socket is the session's */
    }
    sock = ap_get_conn_socket(c);
    if (!sock || apr_os_sock_get(&fd, sock) != APR_SUCCESS) {
        return 0;
    }
    pfd.fd = fd;
    pfd.events = POLLIN | POLLRDHUP;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) <= 0) {
        return 0;
    }
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        return 1;
    }
    /* Readable with nothing to read is an orderly close. */
    return (pfd.revents & POLLIN) && recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void release_slot(req_state_t *st)
{
    if (st->holding) {
        st->holding = 0;
        at_zone_release(st->ref->zone, &st->ticket);
    }
}

static apr_status_t release_on_cleanup(void *data)
{
    release_slot(data);
    return APR_SUCCESS;
}

/* Releases the slot once the handler has produced its whole response (the
 * end of stream reaches this filter), before it is passed on: passing may
 * wait for a slow client to read it, and the handler's work is done. The
 * pool cleanup stays as the backstop. */
static apr_status_t release_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    req_state_t *st = f->ctx;
    apr_bucket *b;

    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb);
         b = APR_BUCKET_NEXT(b)) {
        if (APR_BUCKET_IS_EOS(b)) {
            release_slot(st);
            ap_remove_output_filter(f);
            break;
        }
    }
    return ap_pass_brigade(f->next, bb);
}

static void export_outcome(request_rec *r, const req_state_t *st)
{
    apr_table_setn(r->subprocess_env, "THROTTLE_ZONE", st->ref->name);
    apr_table_setn(r->subprocess_env, "THROTTLE_PRIORITY",
                   apr_itoa(r->pool, st->priority));
    apr_table_setn(r->subprocess_env, "THROTTLE_RESULT", st->result);
    apr_table_setn(r->subprocess_env, "THROTTLE_WAIT_US",
                   apr_psprintf(r->pool, "%" APR_INT64_T_FMT, st->ticket.wait_us));
}

static int is_refusal(at_result_t res)
{
    switch (res) {
    case AT_REJECTED_FULL:
    case AT_REJECTED_TIMEOUT:
    case AT_REJECTED_CLIENT:
    case AT_REJECTED_PREDICTED:
    case AT_REJECTED_WORKERS:
    case AT_REJECTED_STANDING:
    case AT_REJECTED_LOCKED:
        return 1;
    default:
        return 0;
    }
}

static const char *result_name(at_result_t res)
{
    switch (res) {
    case AT_ADMITTED: return "admitted";
    case AT_QUEUED: return "queued";
    case AT_REJECTED_FULL: return "rejected-full";
    case AT_REJECTED_TIMEOUT: return "rejected-timeout";
    case AT_REJECTED_CLIENT: return "rejected-client";
    case AT_REJECTED_PREDICTED: return "rejected-predicted";
    case AT_REJECTED_WORKERS: return "rejected-workers";
    case AT_REJECTED_STANDING: return "rejected-standing";
    case AT_REJECTED_LOCKED: return "rejected-locked";
    case AT_ABORTED: return "aborted";
    case AT_DRY_RUN_QUEUED:
    case AT_DRY_RUN_REJECTED: return "dry-run";
    default: return "error";
    }
}

/* The slot goes back when the response has passed (release_filter), or
 * with the request at the latest. */
static void hold_slot(request_rec *r, req_state_t *st)
{
    st->holding = 1;
    apr_pool_cleanup_register(r->pool, st, release_on_cleanup, apr_pool_cleanup_null);
    ap_add_output_filter(RELEASE_FILTER, st, r, r->connection);
}

/* The ErrorDocument of a refused request. A page outside every zone runs as
 * always; one whose target is in a zone runs only on a slot free at once,
 * never queued and never over the cap. Otherwise the client gets httpd's own
 * 503 page: answering 503 here makes httpd send the refused request's error
 * response, Retry-After and all. */
static int run_error_page(request_rec *r, dir_conf_t *d, const req_state_t *refused)
{
    zone_ref_t *ref = zone_for_request(r, d);
    req_state_t *st;

    if (!ref || !ref->zone || bypassed(r, d)) {
        return DECLINED;
    }
    st = apr_pcalloc(r->pool, sizeof(*st));
    st->ref = ref;
    switch (at_zone_acquire_now(ref->zone, &st->ticket)) {
    case AT_ADMITTED:
        hold_slot(r, st);
        return DECLINED;
    case AT_REJECTED_FULL:
    case AT_REJECTED_LOCKED:
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, "zone %s: error page %s not run "
                      "for a request refused by zone %s: no slot free at once; httpd's "
                      "own 503 page is sent instead", ref->name, r->uri, refused->ref->name);
        return HTTP_SERVICE_UNAVAILABLE;
    default:
        return DECLINED; /* a dry run, or a broken lock: fail open as always */
    }
}

/* A request already decided: an internal redirect of one that holds a slot
 * (which the new response must release), or the error page of a refused
 * one. */
static int handle_redirect(request_rec *r, dir_conf_t *d, req_state_t *st)
{
    export_outcome(r, st);
    if (st->holding) {
        /* httpd rebuilt the output filters for the new request */
        ap_add_output_filter(RELEASE_FILTER, st, r, r->connection);
        return DECLINED;
    }
    if (st->refused && r->connection->aborted) {
        return HTTP_SERVICE_UNAVAILABLE; /* nobody to show a page to */
    }
    if (st->refused && r->prev) {
        return run_error_page(r, d, st);
    }
    return DECLINED;
}

static int throttle_handler(request_rec *r)
{
    request_rec *top = r;
    dir_conf_t *d;
    zone_ref_t *ref;
    req_state_t *st;
    at_client_key_t client;
    at_request_t rq;
    at_result_t res;
    int rc;

    if (r->main || at_is_own_handler(r)) {
        return DECLINED;
    }
    while (top->prev) {
        top = top->prev;
    }
    d = ap_get_module_config(r->per_dir_config, &adaptive_throttle_module);
    st = ap_get_module_config(top->request_config, &adaptive_throttle_module);
    if (st) {
        return handle_redirect(r, d, st);
    }
    if (!(ref = zone_for_request(r, d)) || !ref->zone) {
        return DECLINED;
    }
    st = apr_pcalloc(r->pool, sizeof(*st));
    st->ref = ref;
    st->priority = d->priority;
    ap_set_module_config(top->request_config, &adaptive_throttle_module, st);
    if (bypassed(r, d)) {
        st->result = "bypass";
        export_outcome(r, st);
        return DECLINED;
    }
    /* A client trickling its body must not hold a slot or a place in the
     * queue while it does. */
    if ((rc = at_read_body_first(r, (apr_off_t)ref->conf.read_body)) != OK) {
        return rc;
    }

    /* useragent_addr is the connection's peer unless the administrator has
     * told mod_remoteip which proxies to believe. */
    at_client_key_from_sockaddr(r->useragent_addr, ref->conf.client_v6_prefix, &client);
    maybe_hang_holding_lock(r, ref->zone);
    rq.client = &client;
    rq.may_wait = at_may_wait(ref->zone);
    rq.priority = d->priority;
    rq.timeout_us = d->priority_timeout_us;
    res = at_zone_acquire_req(ref->zone, &st->ticket, &rq, client_gone, r);
    st->result = result_name(res);
    export_outcome(r, st);
    /* Refusals at info, so that "LogLevel adaptive_throttle:info" shows them
     * alone (nginx's limit_req_log_level); every decision at debug. */
    ap_log_rerror(APLOG_MARK, is_refusal(res) ? APLOG_INFO : APLOG_DEBUG, 0, r,
                  "zone %s: %s%s, priority %d, waited %" APR_INT64_T_FMT
                  " us, %u waiting ahead on arrival",
                  ref->name, st->result,
                  res == AT_DRY_RUN_QUEUED     ? " (would have queued)"
                  : res == AT_DRY_RUN_REJECTED ? " (would have been rejected: queue full)"
                                               : "",
                  st->priority, st->ticket.wait_us, st->ticket.queue_depth);

    if (is_refusal(res)) {
        st->refused = 1;
        apr_table_setn(r->err_headers_out, "Retry-After",
                       apr_psprintf(r->pool, "%u", at_zone_retry_after(ref->zone)));
        return (int)ref->conf.refuse_status;
    }
    switch (res) {
    case AT_ADMITTED:
    case AT_QUEUED:
    case AT_DRY_RUN_QUEUED:
    case AT_DRY_RUN_REJECTED:
        hold_slot(r, st);
        return DECLINED;
    case AT_ABORTED:
        st->refused = 1;
        r->connection->keepalive = AP_CONN_CLOSE;
        r->connection->aborted = 1; /* nobody to answer: the handler never runs */
        return HTTP_SERVICE_UNAVAILABLE;
    default:
        ap_log_rerror(APLOG_MARK, APLOG_ERR, 0, r, "zone %s: shared state unusable; "
                      "letting the request through", ref->name);
        return DECLINED;
    }
}

/* ---- the zones, for the status page ----------------------------------- */

static int sort_by_name(const void *a, const void *b)
{
    return strcmp((*(zone_ref_t *const *)a)->name, (*(zone_ref_t *const *)b)->name);
}

/* The refs that `keep` says yes to, sorted by name. */
static apr_array_header_t *zones_where(apr_pool_t *p, int (*keep)(const zone_ref_t *))
{
    apr_array_header_t *refs = apr_array_make(p, 8, sizeof(zone_ref_t *));
    apr_hash_index_t *hi;

    for (hi = zone_refs ? apr_hash_first(p, zone_refs) : NULL; hi; hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);
        if (keep(ref)) {
            *(zone_ref_t **)apr_array_push(refs) = ref;
        }
    }
    qsort(refs->elts, (size_t)refs->nelts, sizeof(zone_ref_t *), sort_by_name);
    return refs;
}

static int has_zone(const zone_ref_t *ref)
{
    return ref->zone != NULL;
}

static int is_defined(const zone_ref_t *ref)
{
    return ref->defined_at != NULL;
}

apr_array_header_t *at_configured_zones(apr_pool_t *p)
{
    return zones_where(p, has_zone);
}

apr_array_header_t *at_defined_zones(apr_pool_t *p)
{
    return zones_where(p, is_defined);
}

/* ---- registration ----------------------------------------------------------- */

static const command_rec throttle_cmds[] = {
    AP_INIT_TAKE_ARGV("ThrottleZone", set_zone, NULL, RSRC_CONF,
                      "ThrottleZone NAME limit=N|auto [min=N] [max=N] [queue=N] "
                      "[timeout=DURATION] [retry_after=SECONDS|auto] [dry_run=on|off] "
                      "[per_client=N [per_client_v6=/64]] [mem=SIZE] [read_body=SIZE] "
                      "[retry_after_max=SECONDS] [status=503|429] [reserve=N] "
                      "[codel=TARGET[:INTERVAL]]: a shared cap and queue"),
    AP_INIT_TAKE1("Throttle", set_throttle, NULL, RSRC_CONF | ACCESS_CONF,
                  "Throttle NAME|off: requests here use zone NAME, or none"),
    AP_INIT_TAKE2("ThrottleHandler", set_handler_zone, NULL, RSRC_CONF,
                  "ThrottleHandler HANDLER NAME: requests whose final handler is "
                  "HANDLER (a name or a wildcard pattern) use zone NAME"),
    AP_INIT_TAKE1("ThrottleBypass", set_bypass, NULL, RSRC_CONF | ACCESS_CONF,
                  "ThrottleBypass EXPR: requests for which EXPR is true are not "
                  "throttled"),
    AP_INIT_TAKE12("ThrottlePriority", set_priority, NULL, RSRC_CONF | ACCESS_CONF,
                   "ThrottlePriority N [timeout=DURATION]: requests here wait in "
                   "priority order, higher first (-10 to 10, default 0); the timeout "
                   "replaces the zone's"),
    AP_INIT_TAKE1("ThrottleAgent", at_set_agent, NULL, RSRC_CONF,
                  "ThrottleAgent NAME: connections to this virtual host's address "
                  "get HAProxy's agent-check line for zone NAME instead of HTTP"),
    AP_INIT_TAKE1("ThrottleDrainFile", at_set_drain_file, NULL, RSRC_CONF,
                  "ThrottleDrainFile PATH: while PATH exists, the agent says drain "
                  "and throttle-health answers 503"),
    AP_INIT_TAKE1("ThrottleKeepIdleWorkers", at_set_keep_idle_workers, NULL, RSRC_CONF,
                  "ThrottleKeepIdleWorkers N: a request that would wait is refused "
                  "while fewer than N workers are idle (0: off; default 5% of "
                  "MaxRequestWorkers, at least 2)"),
    AP_INIT_TAKE2("ThrottleChildLifetime", at_set_child_lifetime, NULL, RSRC_CONF,
                  "ThrottleChildLifetime MIN MAX: each child serves a number of "
                  "connections drawn from [MIN, MAX], then retires"),
    AP_INIT_TAKE12("ThrottleChildMaxAge", at_set_child_max_age, NULL, RSRC_CONF,
                   "ThrottleChildMaxAge DURATION [JITTER%]: prefork children retire "
                   "after about DURATION, even when idle"),
    {NULL}};

static void throttle_register_hooks(apr_pool_t *p)
{
    (void)p;
    ap_hook_pre_config(throttle_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(throttle_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(throttle_post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_status(throttle_child_status, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_monitor(throttle_monitor, NULL, NULL, APR_HOOK_MIDDLE);
    /* First among handlers: by now the final handler is known. */
    ap_hook_handler(throttle_handler, NULL, NULL, APR_HOOK_REALLY_FIRST);
    ap_hook_handler(at_status_handler, NULL, NULL, APR_HOOK_MIDDLE);
    at_lb_register_hooks();
    at_workers_register_hooks();
    APR_OPTIONAL_HOOK(ap, status_hook, at_status_section, NULL, NULL, APR_HOOK_MIDDLE);
    ap_register_output_filter(RELEASE_FILTER, release_filter, NULL,
                              AP_FTYPE_RESOURCE);
    at_body_register();
    at_life_register_hooks();
}

module AP_MODULE_DECLARE_DATA adaptive_throttle_module = {
    STANDARD20_MODULE_STUFF,
    create_dir_conf,
    merge_dir_conf,
    create_srv_conf,
    merge_srv_conf,
    throttle_cmds,
    throttle_register_hooks,
    AP_MODULE_FLAG_NONE
};
