/*
 * ThrottleCluster and cluster= zones: one limit shared by a fleet of
 * servers through Redis (at_cluster.h has the rules). One sync per server
 * and period, from mod_watchdog's singleton thread in one child: a Lua
 * script run with EVALSHA writes this server's demand and share on a lease
 * and returns the others' in one round trip. The share is written into the
 * zone as its local limit, which every child's decision reads: no network
 * call on the request path.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_core.h"
#include "http_main.h"
#include "mod_watchdog.h"
#include "mpm_common.h"

#include "apr_file_io.h"
#include "apr_hash.h"
#include "apr_shm.h"
#include "apr_strings.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "at_cluster.h"
#include "at_parse.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define CLUSTER_WATCHDOG "_adaptive_throttle_cluster_"
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

/* One cluster= zone of this configuration, as the watchdog sees it. */
typedef struct {
    zone_ref_t *ref;
    const cluster_def_t *def;
    at_cluster_conf_t conf;
    at_cluster_state_t *st; /* shared memory, kept across restarts */
    const char *keys[3];    /* the zone's rows, expiries and birth: one hash slot */
#ifdef HAVE_HIREDIS
    redisContext *redis;    /* in the child that runs the watchdog */
    char sha[41];
#endif
} cluster_zone_t;

static apr_hash_t *clusters;         /* name -> cluster_def_t *, this cycle */
static apr_array_header_t *cl_zones; /* cluster_zone_t *, after post_config */

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
                               ? "the period is from 100ms (mod_watchdog's tick) to 10s"
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
    const char *key = apr_pstrcat(s->process->pool, CLUSTER_RETAINED_PREFIX, zone, NULL);
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

/* A reply of the expected type, or a logged failure. */
static redisReply *redis_call(cluster_zone_t *cz, int type, int argc, const char **argv)
{
    redisReply *r = redisCommandArgv(cz->redis, argc, argv, NULL);

    if (!r || r->type != type) {
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, ap_server_conf, "cluster %s, zone %s: "
                     "Redis answered %s to %s", cz->def->name, cz->ref->name,
                     !r ? cz->redis->errstr : r->type == REDIS_REPLY_ERROR ? r->str
                                                                           : "another type",
                     argv[0]);
        if (r) {
            freeReplyObject(r);
        }
        else {
            redis_drop(cz); /* the connection is lost or out of step */
        }
        return NULL;
    }
    return r;
}

static int redis_connect(cluster_zone_t *cz)
{
    const cluster_def_t *d = cz->def;
    struct timeval tv = tv_of(d->timeout_us);
    const char *script_load[] = {"SCRIPT", "LOAD", SCRIPT};
    redisReply *r;

    cz->redis = d->socket ? redisConnectUnixWithTimeout(d->socket, tv)
                          : redisConnectWithTimeout(d->host, d->port, tv);
    if (!cz->redis || cz->redis->err) {
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, ap_server_conf, "cluster %s: cannot "
                     "connect to Redis: %s", d->name,
                     cz->redis ? cz->redis->errstr : "out of memory");
        redis_drop(cz);
        return 0;
    }
    redisSetTimeout(cz->redis, tv);
    if (d->password) {
        const char *auth[] = {"AUTH", d->password};

        if (!(r = redis_call(cz, REDIS_REPLY_STATUS, 2, auth))) {
            redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (d->db) {
        char db[16];
        const char *select[] = {"SELECT", db};

        apr_snprintf(db, sizeof(db), "%d", d->db);

        if (!(r = redis_call(cz, REDIS_REPLY_STATUS, 2, select))) {
            redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (!(r = redis_call(cz, REDIS_REPLY_STRING, 3, script_load))) {
        redis_drop(cz);
        return 0;
    }
    apr_cpystrn(cz->sha, r->str, sizeof(cz->sha));
    freeReplyObject(r);
    return 1;
}

/* One round trip (two if Redis lost the script); fills reply and peers. */
static int redis_sync(cluster_zone_t *cz, apr_uint32_t hold, apr_uint32_t want,
                      at_cluster_reply_t *reply, at_cluster_member_t *peers, apr_pool_t *p)
{
    const at_cluster_state_t *st = cz->st;
    const char *argv[] = {"EVALSHA", cz->sha, "3", cz->keys[0], cz->keys[1], cz->keys[2],
                          st->id, apr_itoa(p, (int)st->demand), apr_itoa(p, (int)hold),
                          apr_itoa(p, (int)want), apr_itoa(p, (int)cz->conf.total),
                          apr_ltoa(p, (long)(cz->conf.lease_us / 1000)),
                          apr_psprintf(p, "%" APR_UINT64_T_FMT, st->born)};
    redisReply *r;
    size_t i;

    if (!cz->redis && !redis_connect(cz)) {
        return 0;
    }
    r = redisCommandArgv(cz->redis, 13, argv, NULL);
    if (r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(r);
        redis_drop(cz); /* Redis restarted: load the script again */
        if (!redis_connect(cz)) {
            return 0;
        }
        argv[1] = cz->sha;
        r = redisCommandArgv(cz->redis, 13, argv, NULL);
    }
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2
        || r->element[0]->type != REDIS_REPLY_INTEGER
        || r->element[1]->type != REDIS_REPLY_STRING) {
        ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, ap_server_conf, "cluster %s, zone %s: "
                     "the sync failed: %s", cz->def->name, cz->ref->name,
                     !r ? cz->redis->errstr
                        : r->type == REDIS_REPLY_ERROR ? r->str : "an unexpected reply");
        if (r) {
            freeReplyObject(r);
        }
        redis_drop(cz);
        return 0;
    }
    reply->grant = (apr_uint32_t)r->element[0]->integer;
    reply->born = apr_strtoi64(r->element[1]->str, NULL, 10);
    reply->npeers = 0;
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
    freeReplyObject(r);
    return 1;
}
#endif

/* The zone runs n from now: published for the next holder of its lock. */
static void set_local_limit(cluster_zone_t *cz, apr_uint32_t n)
{
    at_zone_conf_t c = cz->ref->conf;

    c.limit = n;
    at_zone_reconfigure(cz->ref->zone, &c);
}

static void sync_zone(cluster_zone_t *cz, apr_pool_t *p)
{
    at_cluster_state_t *st = cz->st;
    at_cluster_member_t peers[AT_CLUSTER_PEERS_MAX];
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
    ok = redis_sync(cz, at_cluster_hold(g.limit, g.running), plan.want, &reply, peers, p);
#else
    (void)p;
    (void)peers;
#endif
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

static apr_status_t cluster_tick(int state, void *data, apr_pool_t *pool)
{
    cluster_zone_t *cz = data;

    if (state == AP_WATCHDOG_STATE_RUNNING && cz->st && cz->ref->zone) {
        sync_zone(cz, pool);
    }
#ifdef HAVE_HIREDIS
    if (state == AP_WATCHDOG_STATE_STOPPING) {
        redis_drop(cz);
    }
#endif
    return APR_SUCCESS;
}

/* In the parent, about once a second: a zone whose lease ran out a period
 * ago without its sync noticing (the child running the watchdog hung or
 * died) lowers to its fallback, so that no share outlives its lease. */
static int cluster_monitor(apr_pool_t *p, server_rec *s)
{
    apr_int64_t now = at_now_us();
    int i;
    (void)p;

    for (i = 0; cl_zones && i < cl_zones->nelts; i++) {
        cluster_zone_t *cz = APR_ARRAY_IDX(cl_zones, i, cluster_zone_t *);
        at_cluster_state_t *st = cz->st;
        apr_uint32_t fallback;

        if (!cz->ref->zone || !st->lease_until_us || st->fallback
            || now < st->lease_until_us + cz->conf.period_us) {
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
    APR_OPTIONAL_FN_TYPE(ap_watchdog_get_instance) *get_instance;
    APR_OPTIONAL_FN_TYPE(ap_watchdog_register_callback) *register_callback;
    apr_hash_t *refs = at_zone_refs();
    apr_hash_index_t *hi;
    ap_watchdog_t *wd = NULL;
    char host[256] = "localhost";
    const char *id;
    (void)plog;

    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG || !clusters) {
        return OK;
    }
    gethostname(host, sizeof(host) - 1);
    /* the parent's pid: the same across graceful restarts */
    id = apr_psprintf(pconf, "%s:%ld", host, (long)getpid());
    get_instance = APR_RETRIEVE_OPTIONAL_FN(ap_watchdog_get_instance);
    register_callback = APR_RETRIEVE_OPTIONAL_FN(ap_watchdog_register_callback);
    cl_zones = apr_array_make(pconf, 2, sizeof(cluster_zone_t *));
    for (hi = refs ? apr_hash_first(ptemp, refs) : NULL; hi; hi = apr_hash_next(hi)) {
        zone_ref_t *ref = apr_hash_this_val(hi);
        const cluster_def_t *d;
        cluster_zone_t *cz;

        if (!ref->cluster) {
            continue;
        }
        d = apr_hash_get(clusters, ref->cluster, APR_HASH_KEY_STRING);
        if (!get_instance || !register_callback) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, s, "ThrottleZone %s: cluster= needs "
                         "mod_watchdog (built into Debian's apache2; else LoadModule "
                         "watchdog_module)", ref->name);
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        if (!wd && get_instance(&wd, CLUSTER_WATCHDOG, 0, 1, pconf) != APR_SUCCESS) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, s, "cannot get a watchdog for "
                         "cluster= zones");
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        cz = cluster_zone_make(s, pconf, ref, d, id);
        if (!cz->st) {
            ap_log_error(APLOG_MARK, APLOG_EMERG, 0, s, "zone %s: no shared memory for "
                         "its cluster state", ref->name);
            return HTTP_INTERNAL_SERVER_ERROR;
        }
        APR_ARRAY_PUSH(cl_zones, cluster_zone_t *) = cz;
        register_callback(wd, d->period_us, cz, cluster_tick);
        ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "zone %s: the fleet's limit %u shared "
                     "through cluster %s as %s, every %" APR_INT64_T_FMT " ms", ref->name,
                     cz->conf.total, d->name, cz->st->id, d->period_us / 1000);
    }
    return OK;
}

void at_cluster_register_hooks(void)
{
    /* callbacks are registered before mod_watchdog counts them (the zones
     * are attached later: a tick reads ref->zone) */
    static const char *const before_watchdog[] = {"mod_watchdog.c", NULL};

    ap_hook_pre_config(cluster_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(cluster_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(cluster_post_config, NULL, before_watchdog, APR_HOOK_FIRST);
    ap_hook_monitor(cluster_monitor, NULL, NULL, APR_HOOK_MIDDLE);
}
