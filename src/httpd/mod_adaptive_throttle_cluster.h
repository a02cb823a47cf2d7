/*
 * The cluster glue's parts, shared by the configuration and start
 * (mod_adaptive_throttle_cluster.c), the sync process
 * (mod_adaptive_throttle_cluster_sync.c) and its Redis client
 * (mod_adaptive_throttle_cluster_redis.c). Each calls only the next.
 */
#ifndef MOD_ADAPTIVE_THROTTLE_CLUSTER_H
#define MOD_ADAPTIVE_THROTTLE_CLUSTER_H

#include "httpd.h"
#include "apr_tables.h"

#ifdef HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "at_cluster.h"
#include "mod_adaptive_throttle.h"

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

/* The sync process: forked by the parent after configuration, stopped
 * before the next (pconf's cleanup); the parent's monitor hook starts
 * another after a failure and lowers a zone whose lease ran out. */
void at_cluster_sync_begin(apr_pool_t *pconf, apr_array_header_t *zones);
int at_cluster_sync_monitor(apr_pool_t *p, server_rec *s);

/* Redis, from the sync process: one sync of a zone within deadline (1:
 * reply filled; 0: cz->err says why), the server's rows deleted at a stop,
 * the connection closed. Without hiredis a sync fails, saying so. */
int at_cluster_redis_sync(cluster_zone_t *cz, apr_int64_t deadline, apr_uint32_t hold,
                          apr_uint32_t want, at_cluster_reply_t *reply,
                          at_cluster_member_t *peers, apr_pool_t *p);
void at_cluster_redis_leave(cluster_zone_t *cz);
void at_cluster_redis_drop(cluster_zone_t *cz);

#endif
