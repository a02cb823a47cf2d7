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

#include "apr_strings.h"

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

/* ---- read_body_total: the bodies of requests without a slot, bounded -- */

struct body_room {
    at_zone_t *z;
    apr_int32_t handle;
};

static apr_status_t give_back_room(void *data)
{
    body_room_t *room = data;

    at_zone_body_let_go(room->z, room->handle);
    return APR_SUCCESS;
}

/* The most this body can hold once read first: its length when it is
 * shorter than read_body, else read_body (a chunked body's is unknown). */
static apr_uint64_t body_bytes_wanted(request_rec *r, apr_uint64_t read_body)
{
    const char *cl = apr_table_get(r->headers_in, "Content-Length");
    char *end;
    apr_off_t len;

    if (cl && !apr_table_get(r->headers_in, "Transfer-Encoding")
        && apr_strtoff(&len, cl, &end, 10) == APR_SUCCESS && !*end && len > 0
        && (apr_uint64_t)len < read_body) {
        return (apr_uint64_t)len;
    }
    return read_body;
}

int at_body_room(request_rec *r, at_zone_t *z, apr_uint64_t read_body, body_room_t **room)
{
    apr_uint64_t want = body_bytes_wanted(r, read_body);
    apr_int32_t handle;

    *room = NULL;
    if (!read_body) {
        return 1;
    }
    if (!(handle = at_zone_body_hold(z, want))) {
        /* nothing lost: the handler reads the body, as with read_body=0 */
        ap_log_rerror(APLOG_MARK, APLOG_DEBUG, 0, r, "read_body: no room for %" APR_UINT64_T_FMT
                      " bytes (%" APR_UINT64_T_FMT " held of read_body_total, or every "
                      "body record in use, or the zone's lock busy): the body is left "
                      "to the handler", want, at_zone_body_held(z));
        return 0;
    }
    *room = apr_palloc(r->pool, sizeof(**room));
    (*room)->z = z;
    (*room)->handle = handle;
    apr_pool_cleanup_register(r->pool, *room, give_back_room, apr_pool_cleanup_null);
    return 1;
}

void at_body_give_back(request_rec *r, body_room_t *room)
{
    if (room) {
        apr_pool_cleanup_run(r->pool, room, give_back_room);
    }
}

void at_body_register(void)
{
    /* Just above HTTP_IN, below every content and resource filter. */
    body_filter_handle = ap_register_input_filter(BODY_FILTER, body_filter, NULL,
                                                  AP_FTYPE_PROTOCOL - 1);
}
