/*
 * mem=: the reading of available memory and the ledger of promises.
 */
#include "at_memgate.h"
#include "at_mem.h"
#include "at_tuning.h"


static const char *mem_root = "";
static apr_int64_t mem_settle_us = AT_MEM_SETTLE_US;

void at_memgate_set_reading(const char *root, apr_int64_t settle_us)
{
    mem_root = root ? root : "";
    mem_settle_us = settle_us >= 0 ? settle_us : AT_MEM_SETTLE_US;
}

/* Outside the zone's lock: whether a reading is due (the one in the ledger
 * is AT_MEM_READ_US old, or AT_MEM_REREAD_US while memory holds requests
 * back), and if so, the reading. The files are read here, never under the
 * lock: on cgroup v2 under pressure a read can take milliseconds, and every
 * process of the zone would wait on it. Every caller that finds the ledger's
 * reading stale reads for itself: one that waited for another's reading in
 * flight would decide on a stale one meanwhile. */
int at_memgate_take_reading(at_memgate_t *g, apr_int64_t now, at_mem_reading_t *r)
{
    apr_int64_t age = now - __atomic_load_n(&g->read_us, __ATOMIC_ACQUIRE);
    at_mem_source_t source;

    if (!__atomic_load_n(&g->bytes, __ATOMIC_RELAXED)
        || !(age >= AT_MEM_READ_US
             || (age >= AT_MEM_REREAD_US && !at_memgate_estimate(g, now)))) {
        return 0;
    }
    r->at_us = now;
    r->ok = at_mem_read(mem_root, &r->avail, &source) == APR_SUCCESS;
    r->source = (apr_uint32_t)source;
    return 1;
}

/* Under the lock: a new reading into the ledger. Whatever memory it shows
 * taken since the last one, plus what ended requests gave back, is taken to
 * be pending promises coming true, so a request is counted once: in the
 * promises until the readings show it, then in the readings. A request's
 * process may give its memory back a moment before the request ends (a CGI
 * exits, then httpd finishes the response): memory that comes back
 * unannounced is remembered, and cancels the credit of the ends that
 * follow, so it is not counted twice as a promise coming true. Returns 1 if
 * this is the first reading that failed (for the caller to log, after the
 * lock). A reading begun before the one in the ledger is dropped: readings
 * taken side by side land in any order. */
int at_memgate_apply(at_memgate_t *g, const at_mem_reading_t *r, apr_int64_t now,
                     apr_uint32_t active, at_memgate_young_fn young, void *ctx)
{
    apr_uint64_t young_bytes;
    double seen;

    if (r->at_us <= g->read_us) {
        return 0;
    }
    __atomic_store_n(&g->read_us, r->at_us, __ATOMIC_RELEASE);
    if (!r->ok) {
        /* Unreadable memory must not stop the server: fail open, as for a
         * broken lock. */
        g->source = AT_MEM_UNREAD;
        return g->read_errors++ == 0;
    }
    if (g->source != AT_MEM_UNREAD) {
        seen = (double)g->avail - (double)r->avail + (double)g->freed;
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
    g->avail = r->avail;
    g->source = r->source;
    return 0;
}

/* The last reading, less what has been promised to requests the readings
 * do not show yet, must hold mem=. A reading older than AT_MEM_TRUST_US
 * (taken before a long wait for the lock, or a stop) holds nothing back
 * from the machine: the request waits for a new one. */
int at_memgate_estimate(const at_memgate_t *g, apr_int64_t now)
{
    if (!g->bytes || g->source == AT_MEM_UNREAD) {
        return 1;
    }
    return now - g->read_us <= AT_MEM_TRUST_US && g->avail > g->pending
           && g->avail - g->pending >= g->bytes;
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
