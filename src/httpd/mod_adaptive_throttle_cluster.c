/*
 * ThrottleCluster and cluster= zones: one limit shared by a fleet of
 * servers through Redis (at_cluster.h has the rules). This file reads the
 * configuration, keeps each zone's cluster state in shared memory across
 * restarts and hands the zones to the sync process
 * (mod_adaptive_throttle_cluster_sync.c), which writes each zone's share
 * as its local limit: every child's decision reads it, no network call on
 * the request path, and no child holds a Redis connection.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_core.h"
#include "http_main.h"
#include "mpm_common.h"

#include "apr_file_io.h"
#include "apr_hash.h"
#include "apr_shm.h"
#include "apr_strings.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "at_parse.h"
#include "at_rng.h"
#include "mod_adaptive_throttle_cluster.h"

APLOG_USE_MODULE(adaptive_throttle);

#define CLUSTER_RETAINED_PREFIX "mod_adaptive_throttle-cluster-1-"

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

static apr_status_t wipe_secret(void *secret)
{
    explicit_bzero(secret, strlen(secret));
    return APR_SUCCESS;
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
    /* a configuration read and dropped (the first pass, the generation
     * before a restart) leaves no copy for the next children to inherit */
    apr_pool_cleanup_register(p, d->password, wipe_secret, apr_pool_cleanup_null);
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

/* This server's nonce, drawn once in the parent's life and retained
 * across restarts (which reload this module): the id stays the same, and
 * the share and lease with it. */
static apr_uint64_t server_nonce(void)
{
    const char *key = CLUSTER_RETAINED_PREFIX "nonce";
    apr_uint64_t *nonce = ap_retained_data_get(key);

    if (!nonce) {
        at_rng_t rng;

        at_rng_seed(&rng);
        nonce = ap_retained_data_create(key, sizeof(*nonce));
        *nonce = at_rng_next(&rng);
    }
    return *nonce;
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
    /* the parent's pid and the nonce: the same across restarts */
    at_cluster_make_id(id, host, (long)getpid(), server_nonce());
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
    at_cluster_sync_begin(pconf, cl_zones);
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
            wipe_secret((char *)d->password);
        }
    }
}

void at_cluster_register_hooks(void)
{
    ap_hook_pre_config(cluster_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(cluster_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    /* last: the zones are laid, and other modules' processes forked */
    ap_hook_post_config(cluster_post_config, NULL, NULL, APR_HOOK_REALLY_LAST);
    ap_hook_monitor(at_cluster_sync_monitor, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(cluster_child_init, NULL, NULL, APR_HOOK_MIDDLE);
}
