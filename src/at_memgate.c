/*
 * mem=: the reading of available memory and the ledger of promises.
 */
#include "at_memgate.h"
#include "at_log.h"
#include "at_mem.h"
#include "at_tuning.h"

#include <syslog.h>

static const char *mem_root = "";
static apr_int64_t mem_settle_us = AT_MEM_SETTLE_US;

void at_memgate_set_reading(const char *root, apr_int64_t settle_us)
{
    mem_root = root ? root : "";
    mem_settle_us = settle_us >= 0 ? settle_us : AT_MEM_SETTLE_US;
}

/* A new reading. Whatever memory it shows taken since the last one, plus
 * what ended requests gave back, is taken to be pending promises coming
 * true, so a request is counted once: in the promises until the readings
 * show it, then in the readings. A request's process may give its memory
 * back a moment before the request ends (a CGI exits, then httpd finishes
 * the response): memory that comes back unannounced is remembered, and
 * cancels the credit of the ends that follow, so it is not counted twice
 * as a promise coming true. */
static void refresh(at_memgate_t *g, apr_int64_t now, apr_uint32_t active,
                    at_memgate_young_fn young, void *ctx, const char *name)
{
    apr_uint64_t avail, young_bytes;
    at_mem_source_t source;
    double seen;

    g->read_us = now;
    if (at_mem_read(mem_root, &avail, &source) != APR_SUCCESS) {
        /* Unreadable memory must not stop the server: fail open, as for a
         * broken lock, and say so once. */
        if (g->read_errors++ == 0) {
            at_log(LOG_WARNING, "zone %s: cannot read the available memory "
                   "(/proc/meminfo, memory cgroup); mem= is not enforced", name);
        }
        g->source = AT_MEM_UNREAD;
        return;
    }
    if (g->source != AT_MEM_UNREAD) {
        seen = (double)g->avail - (double)avail + (double)g->freed;
        if (seen < 0) {
            g->early_free += (apr_uint64_t)-seen;
        }
        else {
            double cancel = (double)g->early_free < seen ? (double)g->early_free : seen;

            g->early_free -= (apr_uint64_t)cancel;
            seen -= cancel;
            g->pending -= seen < (double)g->pending ? (apr_uint64_t)seen : g->pending;
        }
    }
    if (g->early_free > (apr_uint64_t)active * g->bytes) {
        /* only running requests can still announce an end */
        g->early_free = (apr_uint64_t)active * g->bytes;
    }
    young_bytes = (apr_uint64_t)young(ctx, now, mem_settle_us) * g->bytes;
    if (g->pending > young_bytes) {
        g->pending = young_bytes; /* older requests are in the reading by now */
    }
    g->freed = 0;
    g->avail = avail;
    g->source = source;
}

static int estimate_allows(const at_memgate_t *g)
{
    return g->source == AT_MEM_UNREAD
           || (g->avail > g->pending && g->avail - g->pending >= g->bytes);
}

/* The reading, less what has been promised to requests the readings do not
 * show yet, must hold mem=. The reading is taken at most every
 * AT_MEM_READ_US while there is room, and every AT_MEM_REREAD_US while
 * memory holds requests back. */
int at_memgate_allows(at_memgate_t *g, apr_int64_t now, apr_uint32_t active,
                      at_memgate_young_fn young, void *ctx, const char *name)
{
    apr_int64_t age;

    if (!g->bytes) {
        return 1;
    }
    age = now - g->read_us;
    if (age >= AT_MEM_READ_US || (age >= AT_MEM_REREAD_US && !estimate_allows(g))) {
        refresh(g, now, active, young, ctx, name);
    }
    return estimate_allows(g);
}

void at_memgate_started(at_memgate_t *g)
{
    if (g->bytes) {
        g->pending += g->bytes;
    }
}

/* A request that ended at once is taken to have taken nothing: its promise
 * is withdrawn. One that ran longer is taken to give back its full mem=,
 * which the next reading should show. */
void at_memgate_ended(at_memgate_t *g, apr_int64_t ran_us)
{
    if (!g->bytes) {
        return;
    }
    if (ran_us < AT_MEM_QUICK_US) {
        g->pending -= g->pending < g->bytes ? g->pending : g->bytes;
    }
    else {
        g->freed += g->bytes;
    }
}
