/*
 * read_body=SIZE: a request's body, up to SIZE bytes, is read before the
 * request takes a slot or a queue place, so that a client trickling its
 * body holds neither. The handler then reads the same bytes, unchanged,
 * from an input filter that gives back what was read and passes on to the
 * connection for the rest.
 *
 * This is mod_ssl's pattern for buffering a body before renegotiation
 * (ssl_io_buffer_fill and its "SSL/TLS Buffer" filter): read from the
 * protocol filters, set the buckets aside in the request pool, and let the
 * content and resource filters above run when the handler reads. Unlike
 * mod_ssl it may stop short of the end of the body, so HTTP_IN stays below
 * to deliver the rest.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"
#include "http_protocol.h"
#include "http_request.h"
#include "util_filter.h"

#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define BODY_FILTER "THROTTLE_BODY"

static ap_filter_rec_t *body_filter_handle;

/* Moves the first len bytes of from into to (all of them if from is
 * shorter). */
static apr_status_t move_bytes(apr_bucket_brigade *to, apr_bucket_brigade *from,
                               apr_off_t len)
{
    apr_bucket *after;
    apr_status_t rv = apr_brigade_partition(from, len, &after);

    if (rv == APR_INCOMPLETE) {
        APR_BRIGADE_CONCAT(to, from);
        return APR_SUCCESS;
    }
    if (rv != APR_SUCCESS) {
        return rv;
    }
    while (APR_BRIGADE_FIRST(from) != after) {
        apr_bucket *b = APR_BRIGADE_FIRST(from);

        APR_BUCKET_REMOVE(b);
        APR_BRIGADE_INSERT_TAIL(to, b);
    }
    return APR_SUCCESS;
}

/* Copies up to len bytes of from into to, leaving from as it was. */
static apr_status_t copy_bytes(apr_bucket_brigade *to, apr_bucket_brigade *from,
                               apr_off_t len)
{
    apr_bucket *b, *copy;
    apr_status_t rv;

    for (b = APR_BRIGADE_FIRST(from); b != APR_BRIGADE_SENTINEL(from) && len > 0;
         b = APR_BUCKET_NEXT(b)) {
        if ((rv = apr_bucket_copy(b, &copy)) != APR_SUCCESS) {
            return rv;
        }
        APR_BRIGADE_INSERT_TAIL(to, copy);
        if (!APR_BUCKET_IS_METADATA(b) && (apr_off_t)b->length > len) {
            /* kept buckets were read, so their length is known */
            if ((rv = apr_bucket_split(copy, (apr_size_t)len)) != APR_SUCCESS) {
                return rv;
            }
            apr_bucket_delete(APR_BUCKET_NEXT(copy));
            break;
        }
        if (!APR_BUCKET_IS_METADATA(b)) {
            len -= (apr_off_t)b->length;
        }
    }
    return APR_SUCCESS;
}

static int ends_line_or_body(apr_bucket_brigade *bb)
{
    apr_bucket *last = APR_BRIGADE_LAST(bb);
    const char *data;
    apr_size_t len;

    if (APR_BRIGADE_EMPTY(bb) || APR_BUCKET_IS_EOS(last)) {
        return 1;
    }
    return apr_bucket_read(last, &data, &len, APR_BLOCK_READ) == APR_SUCCESS && len > 0
           && data[len - 1] == APR_ASCII_LF;
}

/* Gives back what was read first; once it is all given, the filter steps
 * aside and the connection delivers the rest of a longer body. */
static apr_status_t body_filter(ap_filter_t *f, apr_bucket_brigade *bb,
                                ap_input_mode_t mode, apr_read_type_e block,
                                apr_off_t readbytes)
{
    apr_bucket_brigade *kept = f->ctx;
    apr_status_t rv;

    if (APR_BRIGADE_EMPTY(kept)) {
        ap_remove_input_filter(f);
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
    switch (mode) {
    case AP_MODE_READBYTES:
        return move_bytes(bb, kept, readbytes);
    case AP_MODE_SPECULATIVE:
        return copy_bytes(bb, kept, readbytes);
    case AP_MODE_GETLINE:
        rv = apr_brigade_split_line(bb, kept, block, readbytes);
        if (rv == APR_SUCCESS && APR_BRIGADE_EMPTY(kept) && !ends_line_or_body(bb)) {
            apr_off_t got = 0;

            /* The line goes on past what was read first. */
            apr_brigade_length(bb, 1, &got);
            rv = ap_get_brigade(f->next, kept, AP_MODE_GETLINE, block,
                                readbytes > got ? readbytes - got : 1);
            APR_BRIGADE_CONCAT(bb, kept);
        }
        return rv;
    case AP_MODE_EXHAUSTIVE:
        APR_BRIGADE_CONCAT(bb, kept);
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    default:
        return ap_get_brigade(f->next, bb, mode, block, readbytes);
    }
}

/* Sets the buckets aside in the request pool and counts their bytes;
 * *eos when the body's end came with them. */
static apr_status_t keep_buckets(request_rec *r, apr_bucket_brigade *from,
                                 apr_bucket_brigade *kept, apr_off_t *got, int *eos)
{
    apr_bucket *b;
    apr_status_t rv;

    while (!APR_BRIGADE_EMPTY(from)) {
        b = APR_BRIGADE_FIRST(from);
        if (APR_BUCKET_IS_EOS(b)) {
            *eos = 1;
        }
        else if (!APR_BUCKET_IS_METADATA(b)) {
            const char *data;
            apr_size_t len;

            if ((rv = apr_bucket_read(b, &data, &len, APR_BLOCK_READ)) != APR_SUCCESS) {
                return rv;
            }
            *got += (apr_off_t)len;
        }
        if ((rv = apr_bucket_setaside(b, r->pool)) != APR_SUCCESS) {
            return rv;
        }
        APR_BUCKET_REMOVE(b);
        APR_BRIGADE_INSERT_TAIL(kept, b);
    }
    return APR_SUCCESS;
}

int at_read_body_first(request_rec *r, apr_off_t limit)
{
    conn_rec *c = r->connection;
    apr_bucket_brigade *kept, *tmp;
    apr_off_t got = 0;
    int eos = 0;
    apr_status_t rv;

    if (limit <= 0 || !ap_request_has_body(r)) {
        return OK;
    }
    kept = apr_brigade_create(r->pool, c->bucket_alloc);
    tmp = apr_brigade_create(r->pool, c->bucket_alloc);
    while (!eos && got < limit) {
        rv = ap_get_brigade(r->proto_input_filters, tmp, AP_MODE_READBYTES, APR_BLOCK_READ,
                            limit - got);
        if (rv == APR_SUCCESS) {
            rv = keep_buckets(r, tmp, kept, &got, &eos);
        }
        if (rv != APR_SUCCESS) {
            ap_log_rerror(APLOG_MARK, APLOG_INFO, rv, r, "read_body: the request body "
                          "could not be read before taking a slot (%" APR_OFF_T_FMT
                          " bytes read)", got);
            return ap_map_http_request_error(rv, HTTP_BAD_REQUEST);
        }
    }
    apr_brigade_destroy(tmp);
    ap_log_rerror(APLOG_MARK, APLOG_TRACE1, 0, r, "read_body: %" APR_OFF_T_FMT " bytes "
                  "read before taking a slot%s", got, eos ? " (the whole body)" : "");
    ap_add_input_filter_handle(body_filter_handle, kept, r, c);
    return OK;
}

void at_body_register(void)
{
    /* Just above HTTP_IN, below every content and resource filter. */
    body_filter_handle = ap_register_input_filter(BODY_FILTER, body_filter, NULL,
                                                  AP_FTYPE_PROTOCOL - 1);
}
