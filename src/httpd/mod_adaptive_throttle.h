/*
 * The httpd glue's shared types and the functions its files lend each
 * other (never included by the core). Each glue file depends on this
 * header and the core only: mod_adaptive_throttle.c (the request path and
 * registration) calls into the others, none of them into it.
 */
#ifndef MOD_ADAPTIVE_THROTTLE_H
#define MOD_ADAPTIVE_THROTTLE_H

#include "httpd.h"
#include "http_config.h"
#include "ap_expr.h"

#include "apr_hash.h"

#include "at_zone.h"

/* From configure.ac's AC_INIT, through the build (Makefile.am). */
#ifndef AT_MODULE_VERSION
#define AT_MODULE_VERSION "unknown"
#endif

/* A zone name as the configuration knows it: every directive naming a zone
 * points at the same ref, and post_config attaches the shared zone to it. */
typedef struct {
    const char *name;
    const char *defined_at; /* NULL until ThrottleZone NAME is read */
    const char *first_use;
    at_zone_conf_t conf;
    ap_expr_info_t *key; /* key=: what per_key counts by; NULL: none */
    at_zone_t *zone;
    const char *cluster; /* cluster=: a ThrottleCluster's name; NULL: none */
} zone_ref_t;

/* The module's per-server configuration. */
typedef struct {
    apr_array_header_t *handlers; /* ThrottleHandler mappings */
    zone_ref_t *agent;            /* ThrottleAgent: this vhost speaks the agent */
} srv_conf_t;

/* ThrottleHandler HANDLER NAME: a name, or a wildcard pattern. */
typedef struct {
    const char *pattern;
    int is_glob;
    zone_ref_t *ref;
} handler_map_t;

enum { ZONE_UNSET = 0, ZONE_SET, ZONE_OFF };

/* The module's per-directory configuration. */
typedef struct {
    int zone_state;             /* Throttle NAME (ZONE_SET) or off, or unset */
    zone_ref_t *ref;
    apr_array_header_t *bypass; /* ap_expr_info_t * */
    int priority_set;           /* ThrottlePriority given here */
    int priority;
    apr_int64_t priority_timeout_us; /* 0: the zone's timeout */
} dir_conf_t;

/* Directives and zone refs (mod_adaptive_throttle_conf.c); the table of
 * directives is mod_adaptive_throttle.c's, beside the module's record. */
const char *at_set_zone(cmd_parms *cmd, void *dummy, int argc, char *const argv[]);
const char *at_set_throttle(cmd_parms *cmd, void *dconf, const char *name);
const char *at_set_handler_zone(cmd_parms *cmd, void *dummy, const char *handler,
                                const char *name);
const char *at_set_bypass(cmd_parms *cmd, void *dconf, const char *expr);
const char *at_set_priority(cmd_parms *cmd, void *dconf, const char *n, const char *opt);
void *at_create_srv_conf(apr_pool_t *p, server_rec *s);
void *at_merge_srv_conf(apr_pool_t *p, void *basev, void *addv);
void *at_create_dir_conf(apr_pool_t *p, char *dir);
void *at_merge_dir_conf(apr_pool_t *p, void *basev, void *addv);

/* The ref of zone NAME, made at its first mention by any directive. */
zone_ref_t *at_zone_ref_for(cmd_parms *cmd, const char *name);

/* "file:line" of the directive being read, for error messages. */
const char *at_cmd_where(cmd_parms *cmd);

/* The refs of this configuration cycle, name -> zone_ref_t * (NULL if no
 * directive named a zone); forgotten at pre_config. */
apr_hash_t *at_zone_refs(void);
void at_forget_zone_refs(void);

/* OK if every zone used is defined; else logs each and returns !OK. */
int at_check_zones_defined(server_rec *s, apr_pool_t *ptemp);

/* The zones of the running configuration, sorted by name; and, before
 * post_config has made their shared zones, the zones defined. */
apr_array_header_t *at_configured_zones(apr_pool_t *p);
apr_array_header_t *at_defined_zones(apr_pool_t *p);

/* Shared memory (mod_adaptive_throttle_shm.c): post_config attaches every
 * ref to its shared zone (OK, or an HTTP status if memory cannot be had);
 * the parent gives back what dead children held. */
int at_lay_zones(server_rec *s, apr_pool_t *ptemp);
void at_shm_register_hooks(void);

/* Fault injection (mod_adaptive_throttle_faults.c; no-ops outside the
 * test module): armed at post_config from the environment; the directory
 * mem= reads under ("" for /); a request that hangs holding a zone's lock. */
void at_faults_arm(server_rec *s);
const char *at_faults_mem_root(void);
void at_faults_hang_holding_lock(request_rec *r, at_zone_t *z);

/* Child lifetimes (mod_adaptive_throttle_life.c). */
#include "at_life.h"
const char *at_set_child_lifetime(cmd_parms *cmd, void *dummy, const char *min,
                                  const char *max);
const char *at_set_child_max_age(cmd_parms *cmd, void *dummy, const char *age,
                                 const char *jitter);
void at_life_register_hooks(void);
at_life_t *at_life_shared(void); /* NULL unless ThrottleChildLifetime is set */
apr_uint32_t at_life_min(void);
apr_uint32_t at_life_max(void);
apr_int64_t at_life_max_age_us(void);

/* read_body=SIZE (mod_adaptive_throttle_body.c): read up to limit bytes of
 * the body before the request takes a slot, and hand them to the handler
 * unchanged. OK, or the HTTP status to answer with. */
int at_read_body_first(request_rec *r, apr_off_t limit);
void at_body_register(void);
/* read_body_total=SIZE: whether the body may be read first within the
 * zone's bound (1 when read_body is off: nothing to count). Its bytes
 * count until at_body_give_back (*room), or the end of the request. */
typedef struct body_room body_room_t;
int at_body_room(request_rec *r, at_zone_t *z, apr_uint64_t read_body, body_room_t **room);
void at_body_give_back(request_rec *r, body_room_t *room);

/* A refusal keeps its keep-alive connection where HTTP allows
 * (mod_adaptive_throttle_refuse.c): call before answering the refusal. */
void at_keep_connection_after_refusal(request_rec *r);
void at_refuse_register(void);

/* Status page: the throttle-status handler and the mod_status section. */
int at_status_handler(request_rec *r);
int at_status_section(request_rec *r, int flags);

/* Load balancers (mod_adaptive_throttle_lb.c): ThrottleAgent, the
 * throttle-health handler and ThrottleDrainFile. */
const char *at_set_agent(cmd_parms *cmd, void *dummy, const char *name);
const char *at_set_drain_file(cmd_parms *cmd, void *dummy, const char *path);
void at_lb_register_hooks(void);

/* Workers kept free (mod_adaptive_throttle_workers.c): may a request of
 * this priority wait in zone z, holding its worker (AT_WAIT_ASK: it looks
 * free; at_workers_let_wait decides if it must wait)? And the warning when
 * the zones' waiters could take the workers kept for everything else. */
const char *at_set_keep_idle_workers(cmd_parms *cmd, void *dummy, const char *arg);
int at_may_wait(at_zone_t *z, int priority);
int at_workers_let_wait(void);
/* limit=auto zones without max=: max from the workers left (post_config,
 * before the zones are made). */
int at_size_zones(server_rec *s, apr_pool_t *p);
void at_warn_if_workers_short(server_rec *s, apr_pool_t *p);
void at_workers_register_hooks(void);

/* ThrottleCluster and cluster= zones (mod_adaptive_throttle_cluster*.c):
 * the directive, the value of cluster= among a zone's words, the limit a
 * cluster zone starts a generation with (kept: the share it runs; new:
 * none until granted), and its shared state for the status page (NULL
 * unless ref is a cluster zone; *total: the fleet's). */
#include "at_cluster.h"
const char *at_set_cluster(cmd_parms *cmd, void *dummy, int argc, char *const argv[]);
void at_cluster_starting_conf(const zone_ref_t *ref, at_zone_t *kept, at_zone_conf_t *conf);
const at_cluster_state_t *at_cluster_state_of(const zone_ref_t *ref, apr_uint32_t *total);
void at_cluster_register_hooks(void);

/* The module's own handlers (status, health) are never throttled. */
int at_is_own_handler(const request_rec *r);

#endif
