/*
 * A refusal keeps its keep-alive connection. httpd closes the connection
 * after every 503 (ap_status_drops_connection, applied by ap_set_keepalive
 * in the HTTP_HEADER filter), so each retry of a refused client pays a new
 * TCP, and TLS, handshake: refusing then costs more than serving a file.
 * The module's own refusals are complete answers (a delimited body, no
 * request body left unread), so for them the connection can stay open.
 *
 * The answer is made by httpd as always (ErrorDocument, Retry-After, the
 * headers other modules add); a filter just below HTTP_HEADER then takes
 * back the close that the status alone asked for: it drops the
 * "Connection: close" line httpd wrote and marks the connection keep-alive.
 * Every other reason to close (the client's Connection: close, KeepAlive
 * Off, MaxKeepAliveRequests, a server stopping, a body not read, HTTP/1.0)
 * is judged before the filter is added, and it then does nothing. httpd
 * marks the connection for closing once more when it finishes a request
 * whose status drops connections (after a local ErrorDocument, for one): a
 * connection filter takes that back when the request's end passes. It is
 * added by the connection's first kept refusal only, so a request that is
 * not refused pays nothing for it.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_mpm.h"
#include "util_filter.h"

#include <apr_strings.h>
#include <string.h>

#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define KEEPALIVE_FILTER "THROTTLE_KEEPALIVE"
#define KEPT_FILTER "THROTTLE_KEPT"
#define CLOSE_LINE "\r\nConnection: close\r\n"

static ap_filter_rec_t *keepalive_filter_handle, *kept_filter_handle;

/* httpd's own conditions for keep-alive (ap_set_keepalive), less the
 * status: what would keep this connection open after a 200. */
static int could_keep_alive(request_rec *r)
{
    conn_rec *c = r->connection;
    server_rec *s = r->server;
    int state = AP_MPMQ_STOPPING;
    int left = s->keep_alive_max - c->keepalives;

    ap_mpm_query(AP_MPMQ_MPM_STATE, &state);
    return !c->master && c->keepalive != AP_CONN_CLOSE && !c->aborted
           && r->proto_num >= HTTP_VERSION(1, 1) && !r->expecting_100
           && !ap_request_has_body(r) && s->keep_alive && s->keep_alive_timeout > 0
           && (s->keep_alive_max == 0 || left > 0)
           && !ap_find_token(r->pool, apr_table_get(r->headers_in, "Connection"), "close")
           && !apr_table_get(r->subprocess_env, "nokeepalive")
           && state != AP_MPMQ_STOPPING;
}

/* The header block, if it is whole and delimits its body (or there is
 * none: HEAD): the connection can go on after the answer. */
static int delimited_head(request_rec *r, const char *head, apr_size_t len)
{
    const char *end = len >= 4 ? head + len - 4 : NULL;

    if (!end || memcmp(end, "\r\n\r\n", 4) != 0 || memchr(head, '\0', len)) {
        return 0;
    }
    return r->header_only || strstr(head, "\r\nContent-Length: ") != NULL
           || strstr(head, "\r\nTransfer-Encoding: chunked\r\n") != NULL;
}

/* The header block without its "Connection: close" line, in place of the
 * data buckets of bb (HTTP_HEADER may have put the end of stream of a
 * HEAD answer after them: metadata stays). 0 if there is nothing to undo. */
static int drop_close(request_rec *r, apr_bucket_brigade *bb)
{
    apr_bucket *b, *next;
    char *head, *close;
    apr_size_t len;

    if (apr_brigade_pflatten(bb, &head, &len, r->pool) != APR_SUCCESS) {
        return 0;
    }
    head = apr_pstrmemdup(r->pool, head, len);
    if (!delimited_head(r, head, len) || !(close = strstr(head, CLOSE_LINE))) {
        return 0;
    }
    /* keep the line's leading CRLF, drop "Connection: close\r\n" */
    memmove(close + 2, close + sizeof(CLOSE_LINE) - 1,
            len - (apr_size_t)(close - head) - (sizeof(CLOSE_LINE) - 1) + 1);
    len -= sizeof(CLOSE_LINE) - 3;
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb); b = next) {
        next = APR_BUCKET_NEXT(b);
        if (!APR_BUCKET_IS_METADATA(b)) {
            apr_bucket_delete(b);
        }
    }
    APR_BRIGADE_INSERT_HEAD(bb, apr_bucket_pool_create(head, len, r->pool,
                                                       r->connection->bucket_alloc));
    return 1;
}

/* On a connection, above the network and TLS: when the end of a request
 * whose refusal was kept (armed) passes, before the request is logged (%X)
 * and the MPM reads the connection's state, the close httpd marked again
 * as it finished the request is taken back. It stays on the connection,
 * disarmed, for the next refusal: a connection's pool does not grow with
 * each one. */
static apr_status_t kept_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    int *armed = f->ctx;
    apr_bucket *b;

    for (b = bb ? APR_BRIGADE_FIRST(bb) : NULL; b && *armed && b != APR_BRIGADE_SENTINEL(bb);
         b = APR_BUCKET_NEXT(b)) {
        if (AP_BUCKET_IS_EOR(b)) {
            *armed = 0;
            if (!f->c->aborted && f->c->keepalive == AP_CONN_CLOSE) {
                f->c->keepalive = AP_CONN_KEEPALIVE;
            }
        }
    }
    return ap_pass_brigade(f->next, bb);
}

/* The connection's kept filter, added by its first kept refusal; its flag,
 * armed. */
static int *arm_kept_filter(request_rec *r)
{
    conn_rec *c = r->connection;
    ap_filter_t *k;

    for (k = c->output_filters; k && k->frec != kept_filter_handle; k = k->next) {
    }
    if (!k) {
        k = ap_add_output_filter_handle(kept_filter_handle, apr_pcalloc(c->pool, sizeof(int)),
                                        r, c);
    }
    *(int *)k->ctx = 1;
    return k->ctx;
}

/* First the header block (HTTP_HEADER passes it alone, first); then it
 * stays to the end of the answer: an error on the way (a proxied error
 * page that broke off) leaves the connection to close, as httpd wants. */
static apr_status_t keepalive_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    request_rec *r = f->r;
    conn_rec *c = r->connection;
    apr_bucket *b;

    if (!f->ctx) {
        if (c->keepalive != AP_CONN_CLOSE || !ap_status_drops_connection(r->status)
            || !drop_close(r, bb)) {
            ap_remove_output_filter(f);
            return ap_pass_brigade(f->next, bb);
        }
        c->keepalive = AP_CONN_KEEPALIVE;
        c->keepalives++;
        f->ctx = arm_kept_filter(r); /* and the header block is seen */
    }
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb); b = APR_BUCKET_NEXT(b)) {
        if (AP_BUCKET_IS_ERROR(b)) {
            *(int *)f->ctx = 0;
            c->keepalive = AP_CONN_CLOSE;
        }
        if (APR_BUCKET_IS_EOS(b)) {
            ap_remove_output_filter(f);
        }
    }
    return ap_pass_brigade(f->next, bb);
}

void at_keep_connection_after_refusal(request_rec *r)
{
    if (!r->main && could_keep_alive(r)) {
        ap_add_output_filter_handle(keepalive_filter_handle, NULL, r, r->connection);
    }
}

void at_refuse_register(void)
{
    /* Just below HTTP_HEADER (AP_FTYPE_PROTOCOL), which it follows. */
    keepalive_filter_handle = ap_register_output_filter(KEEPALIVE_FILTER, keepalive_filter,
                                                        NULL, AP_FTYPE_PROTOCOL + 1);
    kept_filter_handle = ap_register_output_filter(KEPT_FILTER, kept_filter, NULL,
                                                   AP_FTYPE_CONNECTION);
}
