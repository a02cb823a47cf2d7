/*
 * mem=: the reading of available memory and the ledger of promises.
 */
#include "at_memgate.h"
#include "at_clock.h"
#include "at_mem.h"
#include "at_tuning.h"


static const char *mem_root = "";
static apr_int64_t mem_settle_us = AT_MEM_SETTLE_US;
static apr_int64_t mem_wait_us = -1;

void at_memgate_set_reading(const char *root, apr_int64_t settle_us)
{
    mem_root = root ? root : "";
    mem_settle_us = settle_us >= 0 ? settle_us : AT_MEM_SETTLE_US;
}

void at_memgate_set_wait(apr_int64_t wait_us)
{
    mem_wait_us = wait_us;
}

/* How long to wait for another's reading in flight: a few times what the
 * last took to land, so a dead or stalled reader is soon replaced. */
static apr_int64_t wait_bound(const at_memgate_t *g)
{
    apr_int64_t us = 4 * __atomic_load_n(&g->land_us, __ATOMIC_RELAXED);

    if (mem_wait_us >= 0) {
        return mem_wait_us;
    }
    return us < AT_MEM_WAIT_MIN_US ? AT_MEM_WAIT_MIN_US
           : us > AT_MEM_WAIT_MAX_US ? AT_MEM_WAIT_MAX_US : us;
}

/* The moment the ledger's reading went stale, as seen at now: when it was
 * AT_MEM_READ_US old, or AT_MEM_REREAD_US while memory holds requests
 * back; 0 if it is not stale. */
static apr_int64_t stale_since(const at_memgate_t *g, apr_int64_t now)
{
    apr_int64_t read_us = __atomic_load_n(&g->read_us, __ATOMIC_ACQUIRE);

    if (now - read_us >= AT_MEM_READ_US) {
        return read_us + AT_MEM_READ_US;
    }
    if (now - read_us >= AT_MEM_REREAD_US && !at_memgate_estimate(g, now)) {
        return read_us + AT_MEM_REREAD_US;
    }
    return 0;
}

/* Outside the zone's lock: whether a reading is due, and if so, a reading
 * begun since the ledger's went stale. The files are read here, never
 * under the lock: on cgroup v2 under pressure a read can take
 * milliseconds, and every process of the zone would wait on it. One
 * process reads at a time: the others sleep until its reading lands and
 * are decided on it, never on the stale one. Past wait_bound (the reader
 * died or stalled), or if the reading in flight began before this caller's
 * went stale, a caller claims the next reading itself. */
int at_memgate_take_reading(at_memgate_t *g, apr_int64_t now, at_mem_reading_t *r,
                            at_memgate_sleep_fn sleep)
{
    apr_int64_t since, claim, bound;
    at_mem_source_t source;
    apr_uint32_t seen;

    r->claimed = 0;
    if (!__atomic_load_n(&g->bytes, __ATOMIC_RELAXED) || !(since = stale_since(g, now))) {
        return 0;
    }
    for (;;) {
        seen = __atomic_load_n(&g->landed, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&g->read_us, __ATOMIC_SEQ_CST) >= since) {
            return 0; /* a reading begun since has landed: the ledger has it */
        }
        claim = __atomic_load_n(&g->claim_us, __ATOMIC_SEQ_CST);
        bound = wait_bound(g);
        if (claim >= since && now - claim < bound) {
            sleep(&g->landed, seen, claim + bound - now);
            now = at_now_us();
            continue;
        }
        if (__atomic_compare_exchange_n(&g->claim_us, &claim, now, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            break;
        }
        now = at_now_us(); /* another claimed it first: wait for that one */
    }
    r->claimed = 1;
    r->at_us = now;
    r->ok = at_mem_read(mem_root, &r->avail, &source) == APR_SUCCESS;
    r->source = (apr_uint32_t)source;
    return 1;
}

/* The claim is let go whether or not the reading was applied (the lock
 * may not have been had): a waiter then finds the ledger still stale and
 * claims the next reading itself. */
int at_memgate_landed(at_memgate_t *g, at_mem_reading_t *r)
{
    apr_int64_t mine = r->at_us;

    if (!r->claimed) {
        return 0;
    }
    r->claimed = 0;
    if (__atomic_compare_exchange_n(&g->claim_us, &mine, 0, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&g->land_us, at_now_us() - r->at_us, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&g->landed, 1, __ATOMIC_SEQ_CST);
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
 * lock). A reading begun before the one in the ledger is dropped: a
 * reader replaced after a stall may land after a newer reading. */
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
