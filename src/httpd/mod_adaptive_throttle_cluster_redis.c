/*
 * The cluster sync's Redis client (hiredis), in the sync process only: one
 * EVALSHA a zone and period, within timeout= in all (connecting, AUTH,
 * loading the script), and the rows deleted at a stop.
 */
#include "httpd.h"
#include "http_log.h"
#include "http_main.h"

#include "apr_strings.h"

#include <fcntl.h>
#include <string.h>

#include "mod_adaptive_throttle_cluster.h"

APLOG_USE_MODULE(adaptive_throttle);

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

void at_cluster_redis_drop(cluster_zone_t *cz)
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
        at_cluster_redis_drop(cz);
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
        at_cluster_redis_drop(cz);
        return 0;
    }
    /* nothing this process starts may inherit the connection */
    fcntl(cz->redis->fd, F_SETFD, fcntl(cz->redis->fd, F_GETFD) | FD_CLOEXEC);
    if (d->password) {
        const char *auth[] = {"AUTH", d->password};

        if (!(r = redis_call(cz, deadline, REDIS_REPLY_STATUS, 2, auth))) {
            at_cluster_redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (d->db) {
        char db[16];
        const char *select[] = {"SELECT", db};

        apr_snprintf(db, sizeof(db), "%d", d->db);
        if (!(r = redis_call(cz, deadline, REDIS_REPLY_STATUS, 2, select))) {
            at_cluster_redis_drop(cz);
            return 0;
        }
        freeReplyObject(r);
    }
    if (!(r = redis_call(cz, deadline, REDIS_REPLY_STRING, 3, script_load))) {
        at_cluster_redis_drop(cz);
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
int at_cluster_redis_sync(cluster_zone_t *cz, apr_int64_t deadline, apr_uint32_t hold,
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
        at_cluster_redis_drop(cz); /* Redis restarted: load the script again */
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
void at_cluster_redis_leave(cluster_zone_t *cz)
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
#else
int at_cluster_redis_sync(cluster_zone_t *cz, apr_int64_t deadline, apr_uint32_t hold,
                          apr_uint32_t want, at_cluster_reply_t *reply,
                          at_cluster_member_t *peers, apr_pool_t *p)
{
    (void)deadline, (void)hold, (void)want, (void)reply, (void)peers, (void)p;
    apr_cpystrn(cz->err, "built without hiredis", sizeof(cz->err));
    return 0;
}

void at_cluster_redis_leave(cluster_zone_t *cz)
{
    (void)cz;
}

void at_cluster_redis_drop(cluster_zone_t *cz)
{
    (void)cz;
}
#endif
