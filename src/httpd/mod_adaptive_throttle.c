/*
 * mod_adaptive_throttle: the httpd glue's request path and its place in
 * httpd. A request whose handler or location names a zone asks the zone
 * for a slot in the handler phase, before any handler runs; it is let
 * through, waits, or is refused with the zone's status and Retry-After,
 * and its slot goes back when the response is done (a filter, or the
 * request's pool). The zone itself is the APR-only core (src/core/at_zone*.c);
 * the directives are in mod_adaptive_throttle_conf.c, the shared memory's
 * life in mod_adaptive_throttle_shm.c.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_log.h"
#include "http_main.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_expr.h"

#include "apr_fnmatch.h"
#include "apr_strings.h"

#include <poll.h>
#include <sys/socket.h>

#include "mod_status.h"

#include "at_parse.h"
#include "at_zone.h"
#include "mod_adaptive_throttle.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0
#endif

#define RELEASE_FILTER "THROTTLE_RELEASE"

module AP_MODULE_DECLARE_DATA adaptive_throttle_module;
APLOG_USE_MODULE(adaptive_throttle);

/* The outcome for one initial request, kept on the initial request so an
 * internal redirect is not counted twice. */
typedef struct req_state {
    zone_ref_t *ref;
    at_ticket_t ticket;
    const char *result;
    int priority;
    int holding;
    int refused; /* answered 503: what runs next is its ErrorDocument */
    const struct req_state *page; /* the slot its error page runs on, if any */
} req_state_t;

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
    at_forget_zone_refs();
    at_set_logger(log_from_core);
    return OK;
}

static int throttle_check_config(apr_pool_t *pconf, apr_pool_t *plog,
                                 apr_pool_t *ptemp, server_rec *s)
{
    int rv = at_check_zones_defined(s, ptemp);
    (void)pconf;
    (void)plog;

    /* here, not at post_config: so that apachectl -t says it too */
    if (rv == OK) {
        rv = at_size_zones(s, ptemp);
    }
    return rv;
}

static int throttle_post_config(apr_pool_t *pconf, apr_pool_t *plog,
                                apr_pool_t *ptemp, server_rec *s)
{
    int rv;
    (void)pconf;
    (void)plog;

    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK; /* the first, trial pass over the configuration */
    }
    if ((rv = at_lay_zones(s, ptemp)) != OK) {
        return rv;
    }
    at_warn_if_workers_short(s, ptemp);
    at_faults_arm(s);
    return OK;
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

/* Where the end of stream is, and whether a bucket before it is still being
 * produced: a pipe or socket of unknown length (a CGI's stdout, mod_cgid's
 * socket) is read downstream, while its producer runs. */
static apr_bucket *find_eos(apr_bucket_brigade *bb, int *producing)
{
    apr_bucket *b;

    *producing = 0;
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb);
         b = APR_BUCKET_NEXT(b)) {
        if (APR_BUCKET_IS_EOS(b)) {
            return b;
        }
        if (b->length == (apr_size_t)-1) {
            *producing = 1;
        }
    }
    return NULL;
}

/* Releases the slot when the response's producer is done. A handler that
 * made its whole response (heap, file, the end of a proxied stream) is done
 * when the end of stream reaches this filter: the slot goes back before the
 * brigade is passed on, so a slow client does not hold it. A CGI that sent
 * its headers first is still running when mod_cgi passes its pipe with the
 * end of stream: passing reads the pipe to its end (a filter that keeps a
 * pipe bucket must read it), so the slot goes back once that returns. The
 * pool cleanup stays as the backstop. */
static apr_status_t release_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    req_state_t *st = f->ctx;
    apr_status_t rv;
    int producing;

    if (!find_eos(bb, &producing)) {
        return ap_pass_brigade(f->next, bb);
    }
    ap_remove_output_filter(f);
    if (!producing) {
        release_slot(st);
        return ap_pass_brigade(f->next, bb);
    }
    rv = ap_pass_brigade(f->next, bb);
    release_slot(st);
    return rv;
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
    case AT_REJECTED_KEY:
    case AT_REJECTED_RATE:
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
    case AT_REJECTED_KEY: return "rejected-key";
    case AT_REJECTED_RATE: return "rejected-rate";
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
static int run_error_page(request_rec *r, dir_conf_t *d, req_state_t *refused)
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
        if (!r->main) {
            refused->page = st; /* its includes run under this slot */
        }
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

/* Who the request counts against: its key= text with per_key or rate= (an empty
 * one, or one that cannot be evaluated, counts against nobody), else the
 * client's address. useragent_addr is the connection's peer unless the
 * administrator has told mod_remoteip which proxies to believe. */
static void request_key(request_rec *r, const zone_ref_t *ref, at_client_key_t *out)
{
    const char *err = NULL, *text;

    if (!ref->key) {
        at_client_key_from_sockaddr(r->useragent_addr, ref->conf.client_v6_prefix, out);
        return;
    }
    text = ap_expr_str_exec(r, ref->key, &err);
    if (err) {
        ap_log_rerror(APLOG_MARK, APLOG_WARNING, 0, r, "zone %s: its key= cannot be "
                      "evaluated (%s): the request counts against no key", ref->name, err);
        text = NULL;
    }
    at_zone_key_from_text(ref->zone, text, text ? strlen(text) : 0, out);
    if (!at_client_key_none(out)) {
        char shown[AT_CLIENT_KEY_TEXT_LEN];

        /* what the status page's Busiest shows: a log can join the two */
        at_client_key_show(out, shown, sizeof(shown));
        apr_table_set(r->subprocess_env, "THROTTLE_KEY", shown);
    }
}

/* The first request of r's chain of internal redirects: where its state is
 * kept. */
static request_rec *first_of_chain(request_rec *r)
{
    while (r->prev) {
        r = r->prev;
    }
    return r;
}

/* A subrequest runs under the slot of a request above it, if one holds a
 * slot (its own, or its error page's): counting it again would count one
 * piece of work twice (and a limit=1 zone would deadlock on itself). It
 * runs under no slot, but in any zone it targets, otherwise. Sets *refused
 * to the state of a refused request above it: the subrequest is part of
 * its error page, which never waits. */
static int runs_under_a_slot(request_rec *r, req_state_t **refused)
{
    req_state_t *st;

    *refused = NULL;
    for (r = r->main; r; r = r->main) {
        st = ap_get_module_config(first_of_chain(r)->request_config,
                                  &adaptive_throttle_module);
        if (st && (st->holding || (st->page && st->page->holding))) {
            return 1;
        }
        if (st && st->refused && !*refused) {
            *refused = st;
        }
    }
    return 0;
}

static int throttle_handler(request_rec *r)
{
    request_rec *top;
    dir_conf_t *d;
    zone_ref_t *ref;
    req_state_t *st;
    at_client_key_t client;
    at_request_t rq;
    at_result_t res;
    req_state_t *refused = NULL;
    body_room_t *room = NULL;
    int rc, body_unread;

    if (at_is_own_handler(r) || (r->main && runs_under_a_slot(r, &refused))) {
        return DECLINED;
    }
    top = first_of_chain(r);
    d = ap_get_module_config(r->per_dir_config, &adaptive_throttle_module);
    if (refused) {
        return run_error_page(r, d, refused); /* a slot free at once, or 503 */
    }
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
     * queue while it does; one about to be refused is not asked for it
     * (no 100 Continue, no upload). A subrequest's body is its request's.
     * A body that cannot be read is answered by httpd (400, 408, 413), its
     * error page run from inside the read for a bad chunk: both, and the
     * log line, see this result. */
    st->result = "body-failed";
    body_unread = !r->main && ap_request_has_body(r);
    if (body_unread && !at_zone_looks_full(ref->zone, d->priority)
        && at_body_room(r, ref->zone, ref->conf.read_body, &room)) {
        if ((rc = at_read_body_first(r, (apr_off_t)ref->conf.read_body)) != OK) {
            export_outcome(r, st);
            return rc;
        }
        body_unread = 0;
    }

    request_key(r, ref, &client);
    at_faults_hang_holding_lock(r, ref->zone);
    rq.client = &client;
    rq.may_wait = at_may_wait(ref->zone, d->priority);
    rq.wait_check = at_workers_let_wait;
    rq.priority = d->priority;
    rq.timeout_us = d->priority_timeout_us;
    res = at_zone_acquire_req(ref->zone, &st->ticket, &rq, client_gone, r);
    at_body_give_back(r, room); /* out of the queue, whatever the outcome */
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
        if (body_unread) {
            /* its body is still on the wire: no 100 Continue asks for it,
             * from an error page either */
            r->connection->keepalive = AP_CONN_CLOSE;
            r->expecting_100 = 0;
        }
        else if (!r->main) {
            at_keep_connection_after_refusal(r);
        }
        /* rate=: when the bucket lets one through, exactly */
        apr_table_setn(r->err_headers_out, "Retry-After",
                       apr_psprintf(r->pool, "%u", st->ticket.retry_after
                                                       ? st->ticket.retry_after
                                                       : at_zone_retry_after(ref->zone)));
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

/* ---- the table ------------------------------------------------------------- */

static const command_rec throttle_cmds[] = {
    AP_INIT_TAKE_ARGV("ThrottleZone", at_set_zone, NULL, RSRC_CONF,
                      "ThrottleZone NAME" AT_ZONE_USAGE ": a shared cap and queue"),
    AP_INIT_TAKE1("Throttle", at_set_throttle, NULL, RSRC_CONF | ACCESS_CONF,
                  "Throttle NAME|off: requests here use zone NAME, or none"),
    AP_INIT_TAKE2("ThrottleHandler", at_set_handler_zone, NULL, RSRC_CONF,
                  "ThrottleHandler HANDLER NAME: requests whose final handler is "
                  "HANDLER (a name or a wildcard pattern) use zone NAME"),
    AP_INIT_TAKE1("ThrottleBypass", at_set_bypass, NULL, RSRC_CONF | ACCESS_CONF,
                  "ThrottleBypass EXPR: requests for which EXPR is true are not "
                  "throttled"),
    AP_INIT_TAKE12("ThrottlePriority", at_set_priority, NULL, RSRC_CONF | ACCESS_CONF,
                   "ThrottlePriority N [timeout=DURATION]: requests here wait in "
                   "priority order, higher first (-10 to 10, default 0); the timeout "
                   "replaces the zone's"),
    AP_INIT_TAKE_ARGV("ThrottleCluster", at_set_cluster, NULL, RSRC_CONF,
                      "ThrottleCluster NAME redis://HOST[:PORT][/DB]|unix:/PATH "
                      "[password_file=PATH] [prefix=STR] [period=DURATION] "
                      "[timeout=DURATION] [db=N]: a Redis through which servers share "
                      "the limits of their cluster=NAME zones"),
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

/* ---- registration ----------------------------------------------------------- */

static void throttle_register_hooks(apr_pool_t *p)
{
    (void)p;
    ap_hook_pre_config(throttle_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(throttle_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(throttle_post_config, NULL, NULL, APR_HOOK_MIDDLE);
    /* First among handlers: by now the final handler is known. */
    ap_hook_handler(throttle_handler, NULL, NULL, APR_HOOK_REALLY_FIRST);
    ap_hook_handler(at_status_handler, NULL, NULL, APR_HOOK_MIDDLE);
    at_lb_register_hooks();
    at_workers_register_hooks();
    APR_OPTIONAL_HOOK(ap, status_hook, at_status_section, NULL, NULL, APR_HOOK_MIDDLE);
    ap_register_output_filter(RELEASE_FILTER, release_filter, NULL,
                              AP_FTYPE_RESOURCE);
    at_body_register();
    at_refuse_register();
    at_life_register_hooks();
    at_shm_register_hooks();
    at_cluster_register_hooks();
}

module AP_MODULE_DECLARE_DATA adaptive_throttle_module = {
    STANDARD20_MODULE_STUFF,
    at_create_dir_conf,
    at_merge_dir_conf,
    at_create_srv_conf,
    at_merge_srv_conf,
    throttle_cmds,
    throttle_register_hooks,
    AP_MODULE_FLAG_NONE
};
