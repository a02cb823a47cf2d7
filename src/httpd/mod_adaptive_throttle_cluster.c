/*
 * ThrottleCluster and cluster= zones: one limit shared by a fleet of
 * servers through Redis (at_cluster.h has the rules). One sync per server
 * and period, from a process of its own that the parent forks at each
 * (re)start and stops at the next: it never retires with a child, and it
 * goes on through a graceful stop while requests drain; at a stop it
 * takes the server's rows out of Redis. A Lua script run with EVALSHA
 * writes this server's demand and share on a lease and returns the
 * others' in one round trip. The share is written into the zone as its
 * local limit, which every child's decision reads: no network call on the
 * request path, and no child holds a Redis connection.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_core.h"
#include "http_main.h"
#include "ap_listen.h"
#include "ap_mpm.h"
#include "mpm_common.h"

#include "apr_file_io.h"
#include "apr_hash.h"
#include "apr_shm.h"
#include "apr_strings.h"
#include "apr_thread_proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "at_cluster.h"
#include "at_parse.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define CLUSTER_RETAINED_PREFIX "mod_adaptive_throttle-cluster-1-"

/* ThrottleCluster NAME URL [options] */
typedef struct {
    const char *name, *defined_at;
    const char *host, *socket; /* socket: unix:/path */
    int port, db;
    const char *password; /* read from password_file= */
    const char *prefix;
    apr_int64_t period_us, timeout_us;
} cluster_def_t;

/* One cluster= zone of this configuration, as the sync process sees it. */
typedef struct {
    zone_ref_t *ref;
    const cluster_def_t *def;
    at_cluster_conf_t conf;
    at_cluster_state_t *st; /* shared memory, kept across restarts */
    const char *keys[3];    /* the zone's rows, expiries and birth: one hash slot */
    apr_int64_t next_us;    /* the next sync is due */
    apr_uint64_t failed;    /* failures in a row: logged at the first and at the end */
    int told_peers_max;     /* the fleet outgrew AT_CLUSTER_PEERS_MAX: said once */
    int told_slots;         /* a share the zone could not take: said once */
    char err[256];          /* why the last sync failed */
#ifdef HAVE_HIREDIS
    redisContext *redis;    /* in the sync process only */
    char sha[41];
#endif
} cluster_zone_t;

static apr_hash_t *clusters;         /* name -> cluster_def_t *, this cycle */
static apr_array_header_t *cl_zones; /* cluster_zone_t *, after post_config */
static apr_proc_t *sync_proc;        /* this generation's sync process */
static apr_pool_t *sync_pool;        /* its own, cleared at each start (pconf is locked) */
static int sync_stopping;            /* the generation ends: not started again */
static pid_t sync_pid;               /* kept apart: sync_pool is gone before pconf's cleanups */
static pid_t sync_owner;             /* the parent that starts and stops it */
static apr_time_t sync_retry_at;     /* when the parent's monitor starts another */
static apr_interval_time_t sync_backoff; /* doubles at each early death */
static apr_time_t sync_born;         /* when the running one was forked */
static int sync_failing;             /* a failure was logged: quiet until one lives */

/* ---- configuration ----------------------------------------------------- */

static const char *parse_url(apr_pool_t *p, cluster_def_t *d, const char *url)
{
    const char *rest, *slash, *colon;
    apr_uint64_t v;

    if (strncmp(url, "unix:", 5) == 0) {
        if (url[5] != '/') {
            return "a unix socket is unix:/absolute/path";
        }
        d->socket = url + 5;
        return NULL;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        return "give redis://HOST[:PORT][/DB] or unix:/path";
    }
    rest = url + 8;
    slash = strchr(rest, '/');
    if (slash) {
        if (at_parse_uint(p, slash + 1, 0, 15, &v)) {
            return "the database after the / is a number from 0 to 15";
        }
        d->db = (int)v;
    }
    d->host = slash ? apr_pstrmemdup(p, rest, (apr_size_t)(slash - rest)) : rest;
    colon = strrchr(d->host, ':');
    d->port = 6379;
    if (colon) {
        if (at_parse_uint(p, colon + 1, 1, 65535, &v)) {
            return "the port is a number from 1 to 65535";
        }
        d->port = (int)v;
        d->host = apr_pstrmemdup(p, d->host, (apr_size_t)(colon - d->host));
    }
    if (!*d->host || strchr(d->host, '@')) {
        return "no host (a password never goes in the URL: use password_file=)";
    }
    return NULL;
}

/* The first line of the file: a password kept out of the configuration. */
static const char *read_password(apr_pool_t *p, cluster_def_t *d, const char *path)
{
    apr_file_t *f;
    char line[512];
    apr_status_t rv;
    char err[128];

    rv = apr_file_open(&f, path, APR_FOPEN_READ, APR_FPROT_OS_DEFAULT, p);
    if (rv == APR_SUCCESS) {
        rv = apr_file_gets(line, sizeof(line), f);
        apr_file_close(f);
    }
    if (rv != APR_SUCCESS) {
        return apr_psprintf(p, "cannot read password_file %s: %s", path,
                            apr_strerror(rv, err, sizeof(err)));
    }
    line[strcspn(line, "\r\n")] = '\0';
    d->password = apr_pstrdup(p, line);
    explicit_bzero(line, sizeof(line));
    return NULL;
}

static const char *cluster_option(cmd_parms *cmd, cluster_def_t *d, const char *opt)
{
    const char *eq = strchr(opt, '=');
    const char *v = eq ? eq + 1 : "";
    apr_uint64_t n;

    if (!eq || !*v) {
        return apr_psprintf(cmd->pool, "'%s' is not of the form key=value", opt);
    }
    if (strncmp(opt, "password_file=", 14) == 0) {
        return read_password(cmd->pool, d, ap_server_root_relative(cmd->pool, v));
    }
    if (strncmp(opt, "prefix=", 7) == 0) {
        d->prefix = v;
        return strpbrk(v, "{} \t") ? "a prefix has no braces or spaces" : NULL;
    }
    if (strncmp(opt, "period=", 7) == 0) {
        const char *err = at_parse_duration(cmd->pool, v, &d->period_us);

        return err ? err : d->period_us < 100000 || d->period_us > 10000000
                               ? "the period is from 100ms to 10s"
                               : NULL;
    }
    if (strncmp(opt, "timeout=", 8) == 0) {
        return at_parse_duration(cmd->pool, v, &d->timeout_us);
    }
    if (strncmp(opt, "db=", 3) == 0) {
        const char *err = at_parse_uint(cmd->pool, v, 0, 15, &n);

        d->db = (int)n;
        return err;
    }
    return apr_psprintf(cmd->pool, "unknown option '%s' (options: password_file=, "
                        "prefix=, period=, timeout=, db=)", opt);
}

const char *at_set_cluster(cmd_parms *cmd, void *dummy, int argc, char *const argv[])
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    cluster_def_t *d;
    int i;
    (void)dummy;

    if (err) {
        return err;
    }
    if (argc < 2) {
        return "ThrottleCluster needs a name and a URL, e.g. ThrottleCluster fleet "
               "redis://127.0.0.1:6379/0";
    }
    if ((err = at_parse_zone_name(cmd->pool, argv[0]))) {
        return apr_pstrcat(cmd->pool, "ThrottleCluster: ", err, NULL);
    }
    if (!clusters) {
        clusters = apr_hash_make(cmd->pool);
    }
    if ((d = apr_hash_get(clusters, argv[0], APR_HASH_KEY_STRING))) {
        return apr_psprintf(cmd->pool, "ThrottleCluster %s: already defined at %s",
                            argv[0], d->defined_at);
    }
    d = apr_pcalloc(cmd->pool, sizeof(*d));
    d->name = apr_pstrdup(cmd->pool, argv[0]);
    d->defined_at = at_cmd_where(cmd);
    d->prefix = "throttle";
    d->period_us = AT_CLUSTER_PERIOD_US;
    d->timeout_us = AT_CLUSTER_TIMEOUT_US;
    err = parse_url(cmd->pool, d, argv[1]);
    for (i = 2; !err && i < argc; i++) {
        err = cluster_option(cmd, d, argv[i]);
    }
    if (!err && d->timeout_us >= d->period_us) {
        err = "the timeout must be shorter than the period";
    }
    if (err) {
        return apr_psprintf(cmd->pool, "ThrottleCluster %s %s: %s", argv[0], argv[1], err);
    }
#ifndef HAVE_HIREDIS
    return "ThrottleCluster: this mod_adaptive_throttle was built without hiredis, so "
           "it cannot share limits through Redis (rebuild it with libhiredis-dev "
           "installed)";
#endif
    apr_hash_set(clusters, d->name, APR_HASH_KEY_STRING, d);
    return NULL;
}

static int cluster_pre_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    clusters = NULL;
    cl_zones = NULL;
    return OK;
}

/* Every cluster= names a ThrottleCluster: said at configtest too. */
static int cluster_check_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp,
                                server_rec *s)
{
    apr_hash_t *refs = at_zone_refs();
    apr_hash_index_t *hi;
    int rv = OK;
    (void)pconf;
    (void)plog;

    for (hi = refs ? apr_hash_first(ptemp, refs) : NULL; hi; hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);

        if (ref->cluster
            && !(clusters && apr_hash_get(clusters, ref->cluster, APR_HASH_KEY_STRING))) {
            ap_log_error(APLOG_MARK, APLOG_STARTUP | APLOG_EMERG, 0, s,
                         "ThrottleZone %s (%s): cluster=%s names no ThrottleCluster "
                         "(define it with ThrottleCluster %s redis://HOST:PORT/DB)",
                         ref->name, ref->defined_at, ref->cluster, ref->cluster);
            rv = !OK;
        }
    }
    return rv;
}

/* ---- the shared state -------------------------------------------------- */

const at_cluster_state_t *at_cluster_state_of(const zone_ref_t *ref,
                                              apr_uint32_t *total)
{
    int i;

    for (i = 0; cl_zones && i < cl_zones->nelts; i++) {
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);

        if (cz->ref == ref) {
            *total = cz->conf.total;
            return cz->st;
        }
    }
    return NULL;
}

/* A cluster zone's starting limit at a (re)start: a zone kept from the
 * last generation keeps the share it runs; a new one runs nothing until
 * the fleet grants it a share. */
void at_cluster_starting_conf(const zone_ref_t *ref, at_zone_t *kept, at_zone_conf_t *conf)
{
    at_zone_glance_t g;

    if (!ref->cluster) {
        return;
    }
    if (!kept || !at_zone_compatible(kept)) {
        conf->limit = 0;
        return;
    }
    at_zone_glance(kept, &g);
    conf->limit = g.limit < conf->limit ? g.limit : conf->limit;
}

/* Anonymous shared memory, retained across restarts by the zone's name:
 * the next generation continues the lease and the smoothed demand. */
static at_cluster_state_t *state_for(server_rec *s, const char *zone, const char *id)
{
    /* the state's size in the key: a build of another layout, swapped in
     * at a graceful restart, starts its own */
    const char *key = apr_psprintf(s->process->pool, "%s%s-%" APR_SIZE_T_FMT,
                                   CLUSTER_RETAINED_PREFIX, zone, sizeof(at_cluster_state_t));
    at_cluster_state_t **kept = ap_retained_data_get(key);
    apr_shm_t *shm;

    if (kept) {
        return *kept;
    }
    if (apr_shm_create(&shm, sizeof(at_cluster_state_t), NULL, s->process->pool)
        != APR_SUCCESS) {
        return NULL;
    }
    kept = ap_retained_data_create(key, sizeof(*kept));
    *kept = apr_shm_baseaddr_get(shm);
    at_cluster_state_init(*kept, id);
    return *kept;
}

/* ---- the sync ---------------------------------------------------------- */

#ifdef HAVE_HIREDIS
/* KEYS: rows (id -> "demand share"), expiries (a sorted set, by Redis's
 * own clock), birth (when the rows began: a Redis restarted empty begins
 * anew). ARGV: id, demand, hold, want, total, lease ms, the birth the
 * member knows. Returns the share granted, the birth, then id, demand,
 * share of every other live member. Mirrors at_cluster_grant(). */
static const char SCRIPT[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local lease = tonumber(ARGV[6])\n"
    "for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do\n"
    "  redis.call('HDEL', KEYS[1], m)\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)\n"
    "local born = redis.call('GET', KEYS[3])\n"
    "if not born then born = tostring(now); redis.call('SET', KEYS[3], born) end\n"
    "local hold, want, total = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "if ARGV[7] ~= born then want = hold end\n"
    "local rows = redis.call('HGETALL', KEYS[1])\n"
    "local out, others = {0, born}, 0\n"
    "for i = 1, #rows, 2 do\n"
    "  if rows[i] ~= ARGV[1] then\n"
    "    local d, s = string.match(rows[i + 1], '^(%d+) (%d+)$')\n"
    "    if d then\n"
    "      others = others + tonumber(s)\n"
    "      out[#out + 1] = rows[i]; out[#out + 1] = tonumber(d); out[#out + 1] = tonumber(s)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local free, grant = total - others, hold\n"
    "if want > hold and free > hold then grant = math.min(want, free) end\n"
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. grant)\n"
    "redis.call('ZADD', KEYS[2], now + lease, ARGV[1])\n"
    "for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], lease * 10) end\n"
    "out[1] = grant\n"
    "return out\n";

static struct timeval tv_of(apr_int64_t us)
{
    struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
    return tv;
}

static void redis_drop(cluster_zone_t *cz)
{
    if (cz->redis) {
        redisFree(cz->redis);
        cz->redis = NULL;
    }
}

/* timeout= bounds the whole sync: each step waits only for what is left
 * of it. 0 (with cz->err said) once it is spent. */
static int time_left(cluster_zone_t *cz, apr_int64_t deadline, struct timeval *tv)
{
    apr_int64_t left = deadline - at_now_us();

    if (left <= 0) {
        apr_snprintf(cz->err, sizeof(cz->err), "no answer within timeout= (%" APR_INT64_T_FMT
                     " ms)", cz->def->timeout_us / 1000);
        return 0;
    }
    *tv = tv_of(left);
    return 1;
}

/* What hiredis says of a lost connection; one lost when the sync's time
 * has run out timed out (the socket waited only for what was left). */
static void note_io_error(cluster_zone_t *cz, const char *step, apr_int64_t deadline)
{
    if (at_now_us() >= deadline) {
        apr_snprintf(cz->err, sizeof(cz->err), "%s: no answer within timeout= (%"
                     APR_INT64_T_FMT " ms)", step, cz->def->timeout_us / 1000);
    }
    else {
        apr_snprintf(cz->err, sizeof(cz->err), "%s: %s", step,
                     cz->redis->errstr[0] ? cz->redis->errstr : "connection lost");
    }
}

/* A command within the sync's time: its reply, NULL when there is none
 * (a connection that lost one is dropped: lost or out of step). */
static redisReply *redis_command(cluster_zone_t *cz, apr_int64_t deadline, int argc,
                                 const char **argv)
{
    struct timeval tv;
    redisReply *r;

    if (!time_left(cz, deadline, &tv)) {
        return NULL; /* nothing sent: the connection stays */
    }
    redisSetTimeout(cz->redis, tv);
    if (!(r = redisCommandArgv(cz->redis, argc, argv, NULL))) {
        note_io_error(cz, argv[0], deadline);
        redis_drop(cz);
    }
    return r;
}

/* A reply of the expected type, or a failure said in cz->err. */
static redisReply *redis_call(cluster_zone_t *cz, apr_int64_t deadline, int type, int argc,
                              const char **argv)
{
    redisReply *r = redis_command(cz, deadline, argc, argv);

    if (r && r->type != type) {
        apr_snprintf(cz->err, sizeof(cz->err), "Redis answered %s to %s",
                     r->type == REDIS_REPLY_ERROR ? r->str : "another type", argv[0]);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

static int redis_connect(cluster_zone_t *cz, apr_int64_t deadline)
{
    const cluster_def_t *d = cz->def;
    const char *script_load[] = {"SCRIPT", "LOAD", SCRIPT};
    struct timeval tv;
    redisReply *r;

    if (!time_left(cz, deadline, &tv)) {
        return 0;
    }
    cz->redis = d->socket ? redisConnectUnixWithTimeout(d->socket, tv)
                          : redisConnectWithTimeout(d->host, d->port, tv);
    if (!cz->redis || cz->redis->err) {
        apr_snprintf(cz->err, sizeof(cz->err), "cannot connect to Redis: %s",
                     cz->redis ? cz->redis->errstr : "out of memory");
        redis_drop(cz);
        return 0;
    }
    /* nothing this process starts may inherit the connection */
    fcntl(cz->redis->fd, F_SETFD, fcntl(cz->redis->fd, F_GETFD) | FD_CLOEXEC);
    if (d->password) {
        const char *auth[] = {"AUTH", d->password};

        if (!(r = redis_call(cz, deadline, REDIS_REPLY_STATUS, 2, auth))) {
            redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (d->db) {
        char db[16];
        const char *select[] = {"SELECT", db};

        apr_snprintf(db, sizeof(db), "%d", d->db);
        if (!(r = redis_call(cz, deadline, REDIS_REPLY_STATUS, 2, select))) {
            redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (!(r = redis_call(cz, deadline, REDIS_REPLY_STRING, 3, script_load))) {
        redis_drop(cz);
        return 0;
    }
    apr_cpystrn(cz->sha, r->str, sizeof(cz->sha));
    freeReplyObject(r);
    return 1;
}

/* The script's reply read into reply and peers (up to PEERS_MAX of the
 * others; reply->others counts them all). */
static int read_reply(cluster_zone_t *cz, const redisReply *r, at_cluster_reply_t *reply,
                      at_cluster_member_t *peers)
{
    size_t i;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2
        || r->element[0]->type != REDIS_REPLY_INTEGER
        || r->element[1]->type != REDIS_REPLY_STRING) {
        apr_snprintf(cz->err, sizeof(cz->err), "the script answered %s",
                     r->type == REDIS_REPLY_ERROR ? r->str : "something unexpected");
        return 0;
    }
    reply->grant = (apr_uint32_t)r->element[0]->integer;
    reply->born = apr_strtoi64(r->element[1]->str, NULL, 10);
    reply->npeers = 0;
    reply->others = (apr_uint32_t)((r->elements - 2) / 3);
    reply->peers = peers;
    for (i = 2; i + 2 < r->elements && reply->npeers < AT_CLUSTER_PEERS_MAX; i += 3) {
        at_cluster_member_t *m = &peers[reply->npeers];

        if (r->element[i]->type != REDIS_REPLY_STRING) {
            break;
        }
        apr_cpystrn(m->id, r->element[i]->str, sizeof(m->id));
        m->demand = (apr_uint32_t)r->element[i + 1]->integer;
        m->share = (apr_uint32_t)r->element[i + 2]->integer;
        reply->npeers++;
    }
    return 1;
}

/* One round trip (more if it must connect first, or Redis lost the
 * script), all within deadline; fills reply and peers. */
static int redis_sync(cluster_zone_t *cz, apr_int64_t deadline, apr_uint32_t hold,
                      apr_uint32_t want, at_cluster_reply_t *reply,
                      at_cluster_member_t *peers, apr_pool_t *p)
{
    const at_cluster_state_t *st = cz->st;
    const char *argv[] = {"EVALSHA", cz->sha, "3", cz->keys[0], cz->keys[1], cz->keys[2],
                          st->id, apr_itoa(p, (int)st->demand), apr_itoa(p, (int)hold),
                          apr_itoa(p, (int)want), apr_itoa(p, (int)cz->conf.total),
                          apr_ltoa(p, (long)(cz->conf.lease_us / 1000)),
                          apr_psprintf(p, "%" APR_UINT64_T_FMT, st->born)};
    redisReply *r;
    int ok;

    if (!cz->redis && !redis_connect(cz, deadline)) {
        return 0;
    }
    r = redis_command(cz, deadline, 13, argv);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(r);
        redis_drop(cz); /* Redis restarted: load the script again */
        if (!redis_connect(cz, deadline)) {
            return 0;
        }
        argv[1] = cz->sha;
        r = redis_command(cz, deadline, 13, argv);
    }
    if (!r) {
        return 0;
    }
    ok = read_reply(cz, r, reply, peers);
    freeReplyObject(r);
    if (ok && at_now_us() > deadline) {
        /* counted failed: the lease is judged from a sync within its time */
        apr_snprintf(cz->err, sizeof(cz->err), "the answer came after timeout= (%"
                     APR_INT64_T_FMT " ms)", cz->def->timeout_us / 1000);
        ok = 0;
    }
    return ok;
}

/* KEYS: rows, expiries; ARGV: id. The row and its expiry go together: a
 * row left without its expiry would outlive every lease. */
static const char LEAVE_SCRIPT[] = "redis.call('HDEL', KEYS[1], ARGV[1])\n"
                                   "return redis.call('ZREM', KEYS[2], ARGV[1])\n";

/* httpd stops and its children are gone: this server's rows go, so that
 * the others run its share now, not a lease later. Within timeout=. */
static void redis_leave(cluster_zone_t *cz)
{
    const char *argv[] = {"EVAL", LEAVE_SCRIPT, "2", cz->keys[0], cz->keys[1], cz->st->id};
    apr_int64_t deadline = at_now_us() + cz->def->timeout_us;
    redisReply *r = NULL;

    if (cz->redis || redis_connect(cz, deadline)) {
        r = redis_call(cz, deadline, REDIS_REPLY_INTEGER, 6, argv);
    }
    if (!r) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, ap_server_conf, "cluster %s, zone %s: "
                     "httpd stops but could not take its share out of Redis (the others "
                     "get it when its lease ends): %s", cz->def->name, cz->ref->name,
                     cz->err);
        return;
    }
    freeReplyObject(r);
}
#endif

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
    int ok = 0, was_fallback;

    at_zone_glance(cz->ref->zone, &g);
    at_cluster_note_demand(st, g.running, g.queued);
    at_cluster_plan(&cz->conf, st, g.limit, at_now_us(), &plan);
    if (plan.lower_to < g.limit) {
        set_local_limit(cz, plan.lower_to);
        at_zone_glance(cz->ref->zone, &g); /* the lock may be held: then not yet */
    }
    sent = at_now_us();
#ifdef HAVE_HIREDIS
    ok = redis_sync(cz, sent + cz->def->timeout_us, at_cluster_hold(g.limit, g.running),
                    plan.want, &reply, peers, p);
#else
    apr_cpystrn(cz->err, "built without hiredis", sizeof(cz->err));
    (void)p;
    (void)peers;
#endif
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

/* ---- the sync process -------------------------------------------------- */

/* The parent's word to a sync process at a stop (SIGTERM at a restart):
 * the server leaves the fleet. */
#define SYNC_SIG_LEAVE SIGUSR2

static volatile sig_atomic_t sync_stop; /* 1: stop; 2: stop and leave */

static void sync_on_signal(int sig)
{
    if (sig == SYNC_SIG_LEAVE) {
        sync_stop = 2;
    }
    else if (!sync_stop) {
        sync_stop = 1; /* the parent's death after its word undoes nothing */
    }
}

/* SIGTERM (a restart, the parent's death), SIGHUP, SIGINT and
 * SYNC_SIG_LEAVE end this process; httpd's graceful signals are not for
 * it. */
static void sync_signals(void)
{
    struct sigaction sa;
    sigset_t none;

    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = sync_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SYNC_SIG_LEAVE, &sa, NULL);
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

    sync_signals();
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
    /* after the drop: changing credentials clears the death signal; and the
     * parent may have died before it was set */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(0);
    }
    sync_loop(pconf, parent);
    for (i = 0; i < cl_zones->nelts; i++) {
#ifdef HAVE_HIREDIS
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);

        if (sync_stop == 2) {
            redis_leave(cz);
        }
        redis_drop(cz);
#endif
    }
    _exit(0); /* never the parent's cleanups */
}

static void sync_maint(int reason, void *data, apr_wait_t status);

/* a sync process that lived this long was not failing at start */
#define AT_SYNC_LIVED_LONG apr_time_from_sec(60)

/* Another try after a failure: 1 s, doubling to 30 s while they keep
 * failing at once. */
static void sync_retry_later(void)
{
    apr_time_t now = at_now_us();

    if (sync_born && now - sync_born > AT_SYNC_LIVED_LONG) {
        sync_backoff = 0;
        sync_failing = 0;
    }
    sync_backoff = sync_backoff ? sync_backoff * 2 : apr_time_from_sec(1);
    if (sync_backoff > apr_time_from_sec(30)) {
        sync_backoff = apr_time_from_sec(30);
    }
    sync_retry_at = now + sync_backoff;
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
    if (!sync_failing || (sync_born && at_now_us() - sync_born > AT_SYNC_LIVED_LONG)) {
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
static int cluster_monitor(apr_pool_t *p, server_rec *s)
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

/* ---- start ------------------------------------------------------------- */

static cluster_zone_t *cluster_zone_make(server_rec *s, apr_pool_t *p, zone_ref_t *ref,
                                         const cluster_def_t *d, const char *id)
{
    cluster_zone_t *cz = apr_pcalloc(p, sizeof(*cz));
    const char *tag = apr_psprintf(p, "{%s:%s}", d->prefix, ref->name);

    cz->ref = ref;
    cz->def = d;
    at_cluster_conf_init(&cz->conf, ref->conf.limit, d->period_us);
    cz->conf.fallback = ref->conf.cluster_fallback;
    cz->conf.fallback_n = ref->conf.cluster_fallback_n;
    cz->keys[0] = apr_pstrcat(p, tag, ":rows", NULL);
    cz->keys[1] = apr_pstrcat(p, tag, ":leases", NULL);
    cz->keys[2] = apr_pstrcat(p, tag, ":born", NULL);
    cz->st = state_for(s, ref->name, id);
    return cz;
}

static int cluster_post_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp,
                               server_rec *s)
{
    apr_hash_t *refs = at_zone_refs();
    apr_hash_index_t *hi;
    char host[256] = "localhost", id[AT_CLUSTER_ID_MAX];
    (void)plog;

    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG || !clusters) {
        return OK;
    }
    gethostname(host, sizeof(host) - 1);
    /* the parent's pid: the same across graceful restarts */
    at_cluster_make_id(id, host, (long)getpid());
    cl_zones = apr_array_make(pconf, 2, sizeof(cluster_zone_t *));
    for (hi = refs ? apr_hash_first(ptemp, refs) : NULL; hi; hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);
        cluster_zone_t *cz;

        if (!ref->cluster || !ref->zone) {
            continue;
        }
        cz = cluster_zone_make(s, pconf, ref,
                               apr_hash_get(clusters, ref->cluster, APR_HASH_KEY_STRING), id);
        if (!cz->st) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, s, "zone %s: no shared memory for "
                         "its cluster state", ref->name);
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        APR_ARRAY_PUSH(cl_zones, cluster_zone_t *) = cz;
        ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: the fleet's limit %u shared "
                     "through cluster %s as %s, every %" APR_INT64_T_FMT " ms", ref->name,
                     cz->conf.total, cz->def->name, cz->st->id, cz->def->period_us / 1000);
    }
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
    return OK;
}

/* Only the sync process talks to Redis: no other child keeps its password. */
static void cluster_child_init(apr_pool_t *p, server_rec *s)
{
    apr_hash_index_t *hi;
    (void)s;

    for (hi = clusters ? apr_hash_first(p, clusters) : NULL; hi; hi = apr_hash_next(hi)) {
        cluster_def_t *d = apr_hash_this_val(hi);

        if (d->password) {
            volatile char *c = (volatile char *)d->password;

            while (*c) {
                *c++ = 0;
            }
        }
    }
}

void at_cluster_register_hooks(void)
{
    ap_hook_pre_config(cluster_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(cluster_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    /* last: the zones are laid, and other modules' processes forked */
    ap_hook_post_config(cluster_post_config, NULL, NULL, APR_HOOK_REALLY_LAST);
    ap_hook_monitor(cluster_monitor, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(cluster_child_init, NULL, NULL, APR_HOOK_MIDDLE);
}
