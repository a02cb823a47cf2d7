/*
 * What load balancers are told: HAProxy's agent-check on a virtual host of
 * its own (ThrottleAgent), a health endpoint for HTTP probes
 * (SetHandler throttle-health) and a planned drain (ThrottleDrainFile).
 * Both read the zones without their locks and never take a slot.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_listen.h"
#include "ap_mpm.h"

#include "apr_buckets.h"
#include "apr_file_info.h"
#include "apr_network_io.h"
#include "apr_strings.h"

#include "at_agent.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);
extern module AP_MODULE_DECLARE_DATA adaptive_throttle_module;

#define HEALTH_HANDLER "throttle-health"

static const char *drain_file; /* ThrottleDrainFile, NULL when not set */

const char *at_set_agent(cmd_parms *cmd, void *dummy, const char *name)
{
    srv_conf_t *sc =
        ap_get_module_config(cmd->server->module_config, &adaptive_throttle_module);
    (void)dummy;

    if (!cmd->server->is_virtual) {
        return "ThrottleAgent belongs in a <VirtualHost> whose address has a Listen "
               "of its own: every connection to that address gets the agent line";
    }
    sc->agent = at_zone_ref_for(cmd, name);
    return NULL;
}

const char *at_set_drain_file(cmd_parms *cmd, void *dummy, const char *path)
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    (void)dummy;

    if (err) {
        return err;
    }
    drain_file = ap_server_root_relative(cmd->pool, path);
    return drain_file
               ? NULL
               : apr_pstrcat(cmd->pool, "ThrottleDrainFile: bad path ", path, NULL);
}

int at_is_own_handler(const request_rec *r)
{
    return r->handler && (strcmp(r->handler, HEALTH_HANDLER) == 0 ||
                          strcmp(r->handler, "throttle-status") == 0);
}

/* Draining: the administrator's drain file exists, or this process is
 * stopping (a graceful stop or restart has begun). */
static int draining(apr_pool_t *p)
{
    apr_finfo_t fi;
    int mpm_state = AP_MPMQ_RUNNING;

    if (drain_file && apr_stat(&fi, drain_file, APR_FINFO_TYPE, p) == APR_SUCCESS) {
        return 1;
    }
    return ap_mpm_query(AP_MPMQ_MPM_STATE, &mpm_state) == APR_SUCCESS &&
           mpm_state == AP_MPMQ_STOPPING;
}

/* The zone as a balancer sees it; g is filled, zeroed without a zone. A
 * zone without shared memory, or whose lock failed for good (it then lets
 * every request through), is broken. */
static at_host_state_t zone_state(const zone_ref_t *ref, int drain, at_zone_glance_t *g)
{
    memset(g, 0, sizeof(*g));
    if (ref->zone) {
        at_zone_glance(ref->zone, g);
    }
    return !ref->zone || g->broken ? AT_HOST_BROKEN
           : drain                 ? AT_HOST_DRAINING
                                   : AT_HOST_UP;
}

static const char *zone_line(apr_pool_t *p, const zone_ref_t *ref, int drain)
{
    at_zone_glance_t g;
    char buf[AT_AGENT_LINE_MAX];
    at_host_state_t st = zone_state(ref, drain, &g);

    return at_agent_line(buf, sizeof(buf), &g, st) ? apr_pstrdup(p, buf)
                                                   : "down #throttle line too long\n";
}

/* The agent speaks first and only: one line, then the MPM closes the
 * connection (lingering, so a peer that sent something still reads the
 * line). Whatever the peer sends is never read, so it cannot hold us. */
static int agent_connection(conn_rec *c)
{
    srv_conf_t *sc =
        ap_get_module_config(c->base_server->module_config, &adaptive_throttle_module);
    apr_bucket_brigade *bb;
    const char *line;

    if (!sc || !sc->agent || c->master) {
        return DECLINED;
    }
    line = zone_line(c->pool, sc->agent, draining(c->pool));
    bb = apr_brigade_create(c->pool, c->bucket_alloc);
    APR_BRIGADE_INSERT_TAIL(
        bb, apr_bucket_immortal_create(line, strlen(line), c->bucket_alloc));
    APR_BRIGADE_INSERT_TAIL(bb, apr_bucket_flush_create(c->bucket_alloc));
    if (ap_pass_brigade(c->output_filters, bb) != APR_SUCCESS) {
        ap_log_cerror(APLOG_MARK, APLOG_DEBUG, 0, c,
                      "ThrottleAgent: peer gone "
                      "before its line was sent");
    }
    c->keepalive = AP_CONN_CLOSE;
    if (c->cs) {
        c->cs->state = CONN_STATE_LINGER;
    }
    return OK;
}

/* 200 while the server can serve, busy or not (a surge across the fleet
 * must not take every host out at once); 503 while draining or when a
 * zone's shared state is missing. The body: each zone's agent line. */
static int health_handler(request_rec *r)
{
    apr_array_header_t *zones;
    int drain, broken = 0, i;

    if (!r->handler || strcmp(r->handler, HEALTH_HANDLER) != 0) {
        return DECLINED;
    }
    if (r->method_number != M_GET) {
        r->allowed = AP_METHOD_BIT << M_GET;
        return HTTP_METHOD_NOT_ALLOWED;
    }
    drain = draining(r->pool);
    zones = at_configured_zones(r->pool);
    for (i = 0; i < zones->nelts; i++) {
        at_zone_glance_t g;

        broken |=
            zone_state(APR_ARRAY_IDX(zones, i, zone_ref_t *), 0, &g) == AT_HOST_BROKEN;
    }
    ap_set_content_type(r, "text/plain; charset=us-ascii");
    apr_table_setn(r->headers_out, "Cache-Control", "no-store");
    r->status = broken || drain ? HTTP_SERVICE_UNAVAILABLE : HTTP_OK;
    if (r->header_only) {
        return OK;
    }
    if (zones->nelts == 0) {
        ap_rputs(drain ? "drain\n" : "up\n", r);
    }
    for (i = 0; i < zones->nelts; i++) {
        const zone_ref_t *ref = APR_ARRAY_IDX(zones, i, zone_ref_t *);

        ap_rprintf(r, "%s: %s", ref->name, zone_line(r->pool, ref, drain));
    }
    return OK;
}

static int serves_address(const server_rec *s, const ap_listen_rec *lr)
{
    const server_addr_rec *a;

    for (a = s->addrs; a; a = a->next) {
        if (a->host_port == lr->bind_addr->port &&
            (apr_sockaddr_is_wildcard(a->host_addr) ||
             apr_sockaddr_equal(a->host_addr, lr->bind_addr))) {
            return 1;
        }
    }
    return 0;
}

static int same_address(const server_rec *a, const server_rec *b)
{
    const server_addr_rec *x, *y;

    for (x = a->addrs; x; x = x->next) {
        for (y = b->addrs; y; y = y->next) {
            if (x->host_port == y->host_port &&
                apr_sockaddr_equal(x->host_addr, y->host_addr)) {
                return 1;
            }
        }
    }
    return 0;
}

/* Another virtual host on the agent's address would lose its HTTP clients
 * to the agent (or the agent to it): say so at startup. */
static void warn_if_address_shared(server_rec *main_server, server_rec *agent)
{
    server_rec *s;

    for (s = main_server->next; s; s = s->next) {
        if (s != agent && same_address(s, agent)) {
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, agent,
                         "ThrottleAgent: the "
                         "virtual host at %s:%d shares its address with the one at "
                         "%s:%d; give the agent a Listen of its own",
                         agent->defn_name ? agent->defn_name : "?",
                         agent->defn_line_number, s->defn_name ? s->defn_name : "?",
                         s->defn_line_number);
        }
    }
}

/* httpd defers accepting an HTTP connection until the client sends
 * something (TCP_DEFER_ACCEPT on Linux), and an agent-check client sends
 * nothing: the agent's listeners accept at once. */
static int lb_post_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp,
                          server_rec *main_server)
{
    server_rec *s;
    (void)pconf;
    (void)plog;
    (void)ptemp;

    /* The first pass only checks the configuration: no listeners yet. */
    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK;
    }
    for (s = main_server; s; s = s->next) {
        srv_conf_t *sc =
            ap_get_module_config(s->module_config, &adaptive_throttle_module);
        const ap_listen_rec *lr;
        int found = 0;

        if (!sc->agent) {
            continue;
        }
        warn_if_address_shared(main_server, s);
        for (lr = ap_listeners; lr; lr = lr->next) {
            if (serves_address(s, lr)) {
                found = 1;
                (void)apr_socket_opt_set(lr->sd, APR_TCP_DEFER_ACCEPT, 0);
            }
        }
        if (!found) {
            ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s,
                         "ThrottleAgent %s in the "
                         "virtual host at %s:%d: no Listen serves its address, so no "
                         "agent will be answered",
                         sc->agent->name, s->defn_name ? s->defn_name : "?",
                         s->defn_line_number);
        }
    }
    return OK;
}

static int lb_pre_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    drain_file = NULL;
    return OK;
}

void at_lb_register_hooks(void)
{
    ap_hook_pre_config(lb_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(lb_post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_process_connection(agent_connection, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_handler(health_handler, NULL, NULL, APR_HOOK_MIDDLE);
}
