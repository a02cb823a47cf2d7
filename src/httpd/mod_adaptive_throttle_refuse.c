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
 * whose status drops connections (after a local ErrorDocument, for one):
 * the first log_transaction hook takes that back too.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "http_protocol.h"
#include "ap_mpm.h"
#include "util_filter.h"

#include <apr_strings.h>
#include <string.h>

#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define KEEPALIVE_FILTER "THROTTLE_KEEPALIVE"
#define CLOSE_LINE "\r\nConnection: close\r\n"
#define KEPT_NOTE "adaptive-throttle-kept-alive"

static ap_filter_rec_t *keepalive_filter_handle;

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

/* First the header block (HTTP_HEADER passes it alone, first); then it
 * stays to the end of the answer: an error on the way (a proxied error
 * page that broke off) leaves the connection to close, as httpd wants. */
static apr_status_t keepalive_filter(ap_filter_t *f, apr_bucket_brigade *bb)
{
    request_rec *r = f->r;
    conn_rec *c = r->connection;
    apr_bucket *b;

    if (!f->ctx) {
        f->ctx = f; /* the header block is seen */
        if (c->keepalive != AP_CONN_CLOSE || !ap_status_drops_connection(r->status)
            || !drop_close(r, bb)) {
            ap_remove_output_filter(f);
            return ap_pass_brigade(f->next, bb);
        }
        c->keepalive = AP_CONN_KEEPALIVE;
        c->keepalives++;
        apr_table_setn(c->notes, KEPT_NOTE, "1");
    }
    for (b = APR_BRIGADE_FIRST(bb); b != APR_BRIGADE_SENTINEL(bb); b = APR_BUCKET_NEXT(b)) {
        if (AP_BUCKET_IS_ERROR(b)) {
            apr_table_unset(c->notes, KEPT_NOTE);
            c->keepalive = AP_CONN_CLOSE;
        }
        if (APR_BUCKET_IS_EOS(b)) {
            ap_remove_output_filter(f);
        }
    }
    return ap_pass_brigade(f->next, bb);
}

/* Before the request is logged (%X) and the MPM reads the connection's
 * state. */
static int keep_after_finish(request_rec *r)
{
    conn_rec *c = r->connection;

    if (apr_table_get(c->notes, KEPT_NOTE)) {
        apr_table_unset(c->notes, KEPT_NOTE);
        if (!c->aborted && c->keepalive == AP_CONN_CLOSE) {
            c->keepalive = AP_CONN_KEEPALIVE;
        }
    }
    return DECLINED;
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
    ap_hook_log_transaction(keep_after_finish, NULL, NULL, APR_HOOK_REALLY_FIRST);
}
