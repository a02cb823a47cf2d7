/*
 * mod_adaptive_throttle's directives: ThrottleZone, Throttle,
 * ThrottleHandler, ThrottleBypass and ThrottlePriority, the per-server and
 * per-directory configuration, and the zones the configuration names (a
 * ref per name, which post_config attaches to its shared zone).
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "ap_expr.h"

#include "apr_fnmatch.h"
#include "apr_hash.h"
#include "apr_strings.h"

#include <stdlib.h>

#include "at_parse.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

static apr_hash_t *zone_refs; /* name -> zone_ref_t *, for this config cycle */

/* ---- directives --------------------------------------------------------- */

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

/* key=EXPR is httpd's (an ap_expr string), the rest the core's: takes
 * key= out of argv into *key, leaving the other words in *rest. */
static const char *take_key(cmd_parms *cmd, int argc, char *const argv[],
                            apr_array_header_t *rest, ap_expr_info_t **key)
{
    const char *err = NULL;
    int i;

    *key = NULL;
    for (i = 0; i < argc; i++) {
        if (strncmp(argv[i], "key=", 4) != 0) {
            APR_ARRAY_PUSH(rest, const char *) = argv[i];
            continue;
        }
        if (*key) {
            return "key 'key' is given twice";
        }
        if (!argv[i][4]) {
            return "key 'key' has an empty value";
        }
        *key = ap_expr_parse_cmd(cmd, argv[i] + 4, AP_EXPR_FLAG_STRING_RESULT, &err,
                                 NULL);
        if (err) {
            return apr_psprintf(cmd->pool,
                                "key 'key' has a bad value: %s (an expression such as "
                                "%%{HTTP:X-Api-Key} or %%{REMOTE_USER})",
                                err);
        }
    }
    return NULL;
}

static const char *check_key(at_zone_conf_t *conf, const ap_expr_info_t *key)
{
    if (conf->per_key && !key) {
        return "per_key=N counts requests per key: name the key with key=EXPR, "
               "e.g. key=%{HTTP:X-Api-Key}";
    }
    if (key && !conf->per_key && !conf->rate.interval_ns) {
        return "key= names what per_key and rate= count by: give per_key=N or "
               "rate=R/s too";
    }
    if (key && conf->per_client) {
        return "per_client counts addresses, and with key= requests count by key: "
               "for a share per key give per_key=N";
    }
    conf->keyed = key != NULL;
    return NULL;
}

/* The cluster= a zone names, if any: the zone is then one of its
 * ThrottleCluster's (the parser has checked the option's form). */
static const char *cluster_named(apr_pool_t *p, int argc, char *const argv[])
{
    int i;

    for (i = 0; i < argc; i++) {
        if (strncmp(argv[i], "cluster=", 8) == 0) {
            return apr_pstrdup(p, argv[i] + 8);
        }
    }
    return NULL;
}

const char *at_set_zone(cmd_parms *cmd, void *dummy, int argc,
                        char *const argv[])
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    apr_array_header_t *rest;
    ap_expr_info_t *key;
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
    rest = apr_array_make(cmd->temp_pool, argc, sizeof(const char *));
    if (!(err = take_key(cmd, argc - 1, argv + 1, rest, &key))) {
        err = at_parse_zone_args(cmd->pool, rest->nelts, (const char *const *)rest->elts,
                                 &conf);
    }
    if (!err) {
        err = check_key(&conf, key);
    }
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
    ref->key = key;
    ref->cluster = cluster_named(cmd->pool, argc - 1, argv + 1);
    return NULL;
}

const char *at_set_throttle(cmd_parms *cmd, void *dconf, const char *name)
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

const char *at_set_handler_zone(cmd_parms *cmd, void *dummy,
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

const char *at_set_bypass(cmd_parms *cmd, void *dconf, const char *expr)
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

const char *at_set_priority(cmd_parms *cmd, void *dconf, const char *n,
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

void *at_create_srv_conf(apr_pool_t *p, server_rec *s)
{
    srv_conf_t *sc = apr_pcalloc(p, sizeof(*sc));
    (void)s;

    sc->handlers = apr_array_make(p, 4, sizeof(handler_map_t));
    return sc;
}

/* A virtual host's mappings come first, so they win over the main server's. */
void *at_merge_srv_conf(apr_pool_t *p, void *basev, void *addv)
{
    srv_conf_t *base = basev, *add = addv, *sc = apr_pcalloc(p, sizeof(*sc));

    sc->handlers = apr_array_append(p, add->handlers, base->handlers);
    sc->agent = add->agent; /* only where ThrottleAgent is written */
    return sc;
}

void *at_create_dir_conf(apr_pool_t *p, char *dir)
{
    dir_conf_t *d = apr_pcalloc(p, sizeof(*d));
    (void)dir;

    d->bypass = apr_array_make(p, 1, sizeof(ap_expr_info_t *));
    return d;
}

void *at_merge_dir_conf(apr_pool_t *p, void *basev, void *addv)
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

/* ---- the zones named, for the other glue files ---------------------------- */

apr_hash_t *at_zone_refs(void)
{
    return zone_refs;
}

void at_forget_zone_refs(void)
{
    zone_refs = NULL;
}

/* Every zone used must be defined: said at apachectl -t too. */
int at_check_zones_defined(server_rec *s, apr_pool_t *ptemp)
{
    apr_hash_index_t *hi;
    int rv = OK;

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
    return rv;
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
