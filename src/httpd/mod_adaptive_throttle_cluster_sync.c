/*
 * The cluster sync process: httpd's parent forks it after each
 * configuration (as mod_cgid starts its daemon) and stops it before the
 * next; it drops to User, syncs every cluster= zone each period through
 * Redis and writes each zone's share as its local limit. At a stop it
 * takes the server's rows out of Redis. The parent starts another when it
 * dies, and lowers a zone whose lease ran out without a sync. Should the
 * parent die first, it closes the zones and holds in Redis what the
 * orphaned children still run, then leaves.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_main.h"
#include "ap_listen.h"
#include "ap_mpm.h"
#include "mpm_common.h"

#include "apr_thread_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mod_adaptive_throttle_cluster.h"

APLOG_USE_MODULE(adaptive_throttle);

static apr_array_header_t *cl_zones; /* cluster_zone_t *, this generation's */
static apr_proc_t *sync_proc;        /* this generation's sync process */
static apr_pool_t *sync_pool;        /* its own, cleared at each start (pconf is locked) */
static int sync_stopping;            /* the generation ends: not started again */
static pid_t sync_pid;               /* kept apart: sync_pool is gone before pconf's cleanups */
static pid_t sync_owner;             /* the parent that starts and stops it */
static apr_time_t sync_retry_at;     /* when the parent's monitor starts another */
static apr_interval_time_t sync_backoff; /* doubles at each early death */
static apr_time_t sync_born;         /* when the running one was forked */
static int sync_failing;             /* a failure was logged: quiet until one lives */
static volatile sig_atomic_t sync_stop; /* in the sync process: 1, stop; 2, stop and leave */

/* The zone runs n from now: published for the next holder of its lock. A
 * zone that cannot take n (its slots) keeps its limit, said once. */
static void set_local_limit(cluster_zone_t *cz, apr_uint32_t n)
{
    at_zone_conf_t c = cz->ref->conf;

    c.limit = n;
    if (APR_STATUS_IS_EINVAL(at_zone_reconfigure(cz->ref->zone, &c)) && !cz->told_slots) {
        cz->told_slots = 1;
        ap_log_error(APLOG_MARK, APLOG_ERR, 0, ap_server_conf, "zone %s: cannot run "
                     "the share %u cluster %s gave it: more than its shared memory holds; "
                     "it keeps its limit until httpd restarts", cz->ref->name, n,
                     cz->def->name);
    }
}

/* Redis's failures and recoveries: the first of a run, and its end. */
static void log_sync_result(cluster_zone_t *cz, int ok)
{
    if (!ok && cz->failed++ == 0) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, ap_server_conf, "cluster %s, zone %s: "
                     "the sync with Redis failed: %s (the share is kept while the lease "
                     "lasts; further failures are not logged until a sync succeeds)",
                     cz->def->name, cz->ref->name, cz->err);
    }
    else if (ok && cz->failed) {
        ap_log_error(APLOG_MARK, APLOG_NOTICE, 0, ap_server_conf, "cluster %s, zone %s: "
                     "the sync with Redis works again, after %" APR_UINT64_T_FMT
                     " failed", cz->def->name, cz->ref->name, cz->failed);
        cz->failed = 0;
    }
}

static void log_peers_max(cluster_zone_t *cz, const at_cluster_reply_t *reply)
{
    if (reply->others > AT_CLUSTER_PEERS_MAX && !cz->told_peers_max) {
        cz->told_peers_max = 1;
        ap_log_error(APLOG_MARK, APLOG_ERR, 0, ap_server_conf, "cluster %s, zone %s: %u "
                     "servers share it, more than the %d others a server plans over; "
                     "they are counted, but this server's share is planned from %d of "
                     "their demands", cz->def->name, cz->ref->name, reply->others + 1,
                     AT_CLUSTER_PEERS_MAX, AT_CLUSTER_PEERS_MAX);
    }
}

static void sync_zone(cluster_zone_t *cz, apr_pool_t *p)
{
    at_cluster_state_t *st = cz->st;
    at_cluster_member_t *peers = apr_palloc(p, AT_CLUSTER_PEERS_MAX * sizeof(*peers));
    at_cluster_reply_t reply = {0};
    at_cluster_plan_t plan;
    at_zone_glance_t g;
    apr_int64_t sent;
    apr_uint32_t next;
    int ok, was_fallback;

    at_zone_glance(cz->ref->zone, &g);
    at_cluster_note_demand(st, g.running, g.queued);
    at_cluster_plan(&cz->conf, st, g.limit, at_now_us(), &plan);
    if (plan.lower_to < g.limit) {
        set_local_limit(cz, plan.lower_to);
        at_zone_glance(cz->ref->zone, &g); /* the lock may be held: then not yet */
    }
    sent = at_now_us();
    ok = at_cluster_redis_sync(cz, sent + cz->def->timeout_us,
                               at_cluster_hold(g.limit, g.running), plan.want, &reply, peers, p);
    log_sync_result(cz, ok);
    if (ok) {
        log_peers_max(cz, &reply);
    }
    was_fallback = st->fallback;
    next = at_cluster_after_sync(&cz->conf, st, ok, &reply, g.limit, sent, at_now_us());
    if (st->fallback != was_fallback) {
        ap_log_error(APLOG_MARK, st->fallback ? APLOG_WARNING : APLOG_NOTICE, 0,
                     ap_server_conf, "zone %s: %s (limit %u)", cz->ref->name,
                     st->fallback ? "the lease ran out without Redis: running the fallback"
                                  : "Redis answers again: sharing the total",
                     next);
    }
    if (next != g.limit) {
        set_local_limit(cz, next);
    }
}

/* ---- the orphans: the parent gone, its children still serving ---------- */

/* No new admission: limit 0 and no queue, so a request is refused at once;
 * those queued already wait out their timeout=. Published again until the
 * zone runs it (another writer may be stopped in its copy, or the lock
 * held). Returns whether the zone runs it, g what it ran last. */
static int close_zone(cluster_zone_t *cz, at_zone_glance_t *g)
{
    at_zone_conf_t c = cz->ref->conf;

    at_zone_glance(cz->ref->zone, g);
    if (g->limit != 0 || g->queue_cap != 0) {
        c.limit = 0;
        c.queue = 0;
        at_zone_reconfigure(cz->ref->zone, &c);
        at_zone_glance(cz->ref->zone, g);
    }
    return g->limit == 0 && g->queue_cap == 0;
}

/* Periods a zone's close may take before an idle zone counts as idle all
 * the same: its lock broken, or held by a stopped process. */
#define AT_ORPHAN_CLOSE_TRIES 10

/* One period of a closing zone: what still runs is its hold, so that Redis
 * keeps that capacity from the other servers, and it asks for no more.
 * Returns whether it may still run or wait anything: idle once closed, as
 * a request may have been let in before the close took. */
static int hold_closed_zone(cluster_zone_t *cz, int round, apr_pool_t *p)
{
    at_cluster_member_t *peers = apr_palloc(p, AT_CLUSTER_PEERS_MAX * sizeof(*peers));
    at_cluster_reply_t reply = {0};
    at_zone_glance_t g;
    int closed;

    /* the parent's job, dead children's records given back, is this
     * process's now: in the zones replaced at restarts too, whose
     * requests this one counts as its own */
    at_zone_reclaim_lineage_nowait(cz->ref->zone);
    closed = close_zone(cz, &g);
    if (g.running == 0 && g.queued == 0
        && (closed || g.broken || round >= AT_ORPHAN_CLOSE_TRIES)) {
        return 0;
    }
    at_cluster_note_demand(cz->st, g.running, 0);
    log_sync_result(cz, at_cluster_redis_sync(cz, at_now_us() + cz->def->timeout_us,
                                              g.running, g.running, &reply, peers, p));
    return 1;
}

/* The parent is gone and its children serve on: were this process to stop
 * syncing, the row's lease would lapse and the others would take the share
 * the orphans still run. Every zone is closed, and held in Redis until
 * nothing runs or waits in it; then the server leaves, as at a stop. */
static void sync_orphans(apr_pool_t *p)
{
    apr_pool_t *tick;
    apr_int64_t period = 0;
    int i, round, busy = 1;

    ap_log_error(APLOG_MARK, APLOG_WARNING, 0, ap_server_conf, "the server's parent is "
                 "gone: its children refuse every request of a cluster zone; the cluster "
                 "sync holds in Redis what they still run, then leaves the fleet");
    for (i = 0; i < cl_zones->nelts; i++) {
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);

        if (!period || cz->def->period_us < period) {
            period = cz->def->period_us;
        }
    }
    apr_pool_create(&tick, p);
    for (round = 0; busy; round++) {
        apr_int64_t next = at_now_us() + period, now;

        busy = 0;
        for (i = 0; i < cl_zones->nelts; i++) {
            busy |= hold_closed_zone(APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *), round, tick);
            apr_pool_clear(tick);
        }
        /* a signal (obeyed or not) ends a sleep early: sleep to the end */
        while (busy && (now = at_now_us()) < next) {
            apr_sleep(next - now);
        }
    }
    sync_stop = 2;
}

/* ---- the sync process -------------------------------------------------- */

/* The parent's word to a sync process at a stop (SIGTERM at a restart):
 * the server leaves the fleet. */
#define SYNC_SIG_LEAVE SIGUSR2

static pid_t sync_parent; /* the only sender obeyed */

/* A signal counts only if the parent sent it: a CGI of the same User must
 * not make the server leave the fleet, and an outside SIGTERM (pkill)
 * leaves it to follow its server's life. The kernel's own are ignored too:
 * the parent's death is seen by the loop's poll. */
static void sync_on_signal(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    if (si->si_code > 0 || si->si_pid != sync_parent) {
        return;
    }
    if (sig == SYNC_SIG_LEAVE) {
        sync_stop = 2;
    }
    else if (!sync_stop) {
        sync_stop = 1; /* a later word undoes no leave */
    }
}

/* SIGTERM (a restart), SIGHUP, SIGINT and SYNC_SIG_LEAVE from the parent
 * end this process; httpd's graceful signals are not for it. Handlers
 * block every signal: they do not nest. */
static void sync_signals(pid_t parent)
{
    struct sigaction sa;
    sigset_t none;

    sync_parent = parent;
    memset(&sa, 0, sizeof(sa));
    sigfillset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    sa.sa_sigaction = sync_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SYNC_SIG_LEAVE, &sa, NULL);
    sa.sa_flags = 0;
    sa.sa_handler = SIG_IGN;
    sigaction(AP_SIG_GRACEFUL, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Every zone synced when due, until the parent stops this process or is
 * gone. */
static void sync_loop(apr_pool_t *p, pid_t parent)
{
    apr_pool_t *tick;
    int i;

    apr_pool_create(&tick, p);
    while (!sync_stop && getppid() == parent) {
        apr_int64_t now = at_now_us(), wake = now + 100 * APR_INT64_C(1000);

        for (i = 0; i < cl_zones->nelts && !sync_stop; i++) {
            cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);

            if (cz->next_us <= now) {
                sync_zone(cz, tick);
                apr_pool_clear(tick);
                /* the next one a period after this one began: the cadence
                 * does not drift with Redis's latency */
                cz->next_us = now + cz->def->period_us;
            }
            if (cz->next_us < wake) {
                wake = cz->next_us;
            }
        }
        now = at_now_us();
        if (wake > now && !sync_stop) {
            apr_sleep(wake - now); /* a signal ends it early */
        }
    }
}

/* Of what the parent had open, this process keeps the standard
 * descriptors, the error log, and Unix datagram sockets (syslog's or
 * journald's, which the C library would write to blindly were the number
 * reused): no pipe, lock or log of the parent's is held open by it. */
static void sync_close_inherited(void)
{
    apr_os_file_t log = -1;
    struct dirent *e;
    DIR *d;

    if (ap_server_conf->error_log) {
        apr_os_file_get(&log, ap_server_conf->error_log);
    }
    if (!(d = opendir("/proc/self/fd"))) {
        return;
    }
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name), type = 0;
        struct sockaddr_storage sa;
        socklen_t len = sizeof(type);

        if (fd <= 2 || fd == log || fd == dirfd(d)) {
            continue;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_DGRAM) {
            len = sizeof(sa);
            if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0
                && sa.ss_family == AF_UNIX) {
                continue;
            }
        }
        close(fd);
    }
    closedir(d);
}

static void sync_main(apr_pool_t *pconf, pid_t parent)
{
    int i;

    sync_signals(parent);
    /* httpd's signals to its process group (prefork's SIGTERM at a stop,
     * before the children are gone) reach it through the parent only */
    setpgid(0, 0);
    ap_close_listeners();
    sync_close_inherited();
    if (ap_run_drop_privileges(pconf, ap_server_conf) != 0) {
        if (!sync_failing) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, ap_server_conf, "the cluster sync "
                         "process cannot drop its privileges: it stops");
        }
        _exit(1);
    }
    /* the loop looks for the parent every 100 ms (it may be gone already) */
    sync_loop(pconf, parent);
    if (!sync_stop) {
        sync_orphans(pconf);
    }
    for (i = 0; i < cl_zones->nelts; i++) {
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);

        if (sync_stop == 2) {
            at_cluster_redis_leave(cz);
        }
        at_cluster_redis_drop(cz);
    }
    _exit(0); /* never the parent's cleanups */
}

static void sync_maint(int reason, void *data, apr_wait_t status);

/* a sync process that lived this long was not failing at its start */
#define AT_SYNC_LIVED_LONG_US (60 * APR_INT64_C(1000000))

/* Another try after a failure at the start (a fork that failed, or a
 * process that died soon), from the parent's monitor, backing off. */
static void sync_retry_later(void)
{
    sync_backoff = at_cluster_retry_backoff(sync_backoff);
    sync_retry_at = at_now_us() + sync_backoff;
    sync_born = 0;
}

static void sync_start(void)
{
    pid_t parent = getpid();
    apr_status_t rv;

    apr_pool_clear(sync_pool);
    sync_proc = apr_pcalloc(sync_pool, sizeof(*sync_proc));
    sync_born = at_now_us();
    rv = apr_proc_fork(sync_proc, sync_pool);
    if (rv == APR_INCHILD) {
        sync_main(sync_pool, parent);
    }
    if (rv != APR_INPARENT) {
        if (!sync_failing) {
            ap_log_error(APLOG_MARK, APLOG_ERR, rv, ap_server_conf, "cannot start the "
                         "cluster sync process (tried again, backing off to 30 s): the "
                         "cluster zones keep their limits until their lease ends, then "
                         "run their fallback");
        }
        sync_failing = 1;
        sync_proc = NULL;
        sync_retry_later();
        return;
    }
    sync_pid = sync_proc->pid;
    setpgid(sync_pid, sync_pid); /* as it does itself: whichever runs first */
    apr_proc_other_child_register(sync_proc, sync_maint, sync_proc, NULL, sync_pool);
}

/* The parent reaped the sync process: it died on its own. Another starts at
 * once, or from the monitor, backing off, when one died soon after the
 * last; none when httpd stops or restarts. */
static void sync_maint(int reason, void *data, apr_wait_t status)
{
    int mpm_state = AP_MPMQ_STOPPING;

    if (reason != APR_OC_REASON_DEATH && reason != APR_OC_REASON_LOST) {
        return;
    }
    apr_proc_other_child_unregister(data);
    sync_proc = NULL;
    sync_pid = 0;
    ap_mpm_query(AP_MPMQ_MPM_STATE, &mpm_state);
    if (sync_stopping || mpm_state == AP_MPMQ_STOPPING) {
        return;
    }
    if (!sync_failing || (sync_born && at_now_us() - sync_born > AT_SYNC_LIVED_LONG_US)) {
        /* at once, as its lease still runs: the monitor, seconds away, would
         * let Redis hand this server's share to others while it still runs
         * it; only deaths that follow quickly wait for the monitor */
        ap_log_error(APLOG_MARK, APLOG_ERR, 0, ap_server_conf, "the cluster sync process "
                     "ended (status %d): starting another", (int)status);
        sync_failing = 1;
        sync_backoff = 0;
        sync_start();
        return;
    }
    sync_retry_later();
}

/* Before the next generation reads its configuration, or at the exit:
 * this generation's sync process ends (within its timeout=, since it
 * finishes the sync under way), waited for a bounded time, then killed.
 * At the exit (a stop, graceful or not: pconf goes with the process only
 * then, after the MPM has reaped its children or, prefork's graceful stop
 * past its timeout, sent them SIGTERM) it first takes this server out of
 * the fleet. */
static apr_status_t sync_stop_process(void *data)
{
    apr_interval_time_t waited = 0;
    int leave = ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_EXITING;
    (void)data;

    if (getpid() != sync_owner) {
        return APR_SUCCESS; /* a child's copy of pconf: not its process */
    }
    sync_stopping = 1;
    if (!sync_pid) {
        return APR_SUCCESS;
    }
    kill(sync_pid, leave ? SYNC_SIG_LEAVE : SIGTERM);
    while (waitpid(sync_pid, NULL, WNOHANG) == 0) {
        if (waited >= apr_time_from_sec(3)) {
            break; /* the parent's main loop reaps it later */
        }
        if (waited == apr_time_from_sec(2)) {
            kill(sync_pid, SIGKILL);
        }
        apr_sleep(5000);
        waited += 5000;
    }
    sync_proc = NULL;
    sync_pid = 0;
    return APR_SUCCESS;
}

/* In the parent, at its checks (about every 10 s): a zone whose lease ran
 * out a period ago without its sync noticing (the sync process hung, or
 * died and could not be started again) lowers to its fallback, so that no
 * share outlives its lease by more than that. */
int at_cluster_sync_monitor(apr_pool_t *p, server_rec *s)
{
    apr_int64_t now = at_now_us();
    int i;
    (void)p;

    if (cl_zones && cl_zones->nelts && !sync_proc && !sync_stopping
        && getpid() == sync_owner && at_now_us() >= sync_retry_at) {
        sync_start();
    }
    for (i = 0; cl_zones && i < cl_zones->nelts; i++) {
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);
        at_cluster_state_t *st = cz->st;
        apr_uint32_t fallback;

        /* a sync process that runs (failing or not) judges its lease
         * itself: the parent writes only for one that stopped */
        if (!cz->ref->zone || !st->lease_until_us || st->fallback
            || now < st->lease_until_us + cz->conf.period_us
            || now - st->last_sync_us < cz->conf.lease_us) {
            continue;
        }
        /* never up from here: the parent looks once; a sync that runs
         * again raises to the fallback after its lease */
        fallback = at_cluster_run_fallback(&cz->conf, st, st->limit, now);
        st->good_since_us = 0;
        st->limit = fallback;
        set_local_limit(cz, fallback);
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, "zone %s: no sync with cluster %s "
                     "ran within the lease; running the fallback (%u)", cz->ref->name,
                     cz->def->name, fallback);
    }
    return DECLINED;
}

void at_cluster_sync_begin(apr_pool_t *pconf, apr_array_header_t *zones)
{
    cl_zones = zones;
    sync_stopping = 0;
    sync_proc = NULL;
    sync_pid = 0;
    sync_owner = getpid();
    sync_backoff = 0;
    sync_failing = 0;
    sync_born = 0;
    if (cl_zones->nelts) {
        apr_pool_create(&sync_pool, pconf);
        apr_pool_cleanup_register(pconf, NULL, sync_stop_process, apr_pool_cleanup_null);
        sync_start();
    }
}
