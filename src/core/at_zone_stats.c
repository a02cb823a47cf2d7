/*
 * What a zone counts and measures: totals per priority, wait and service
 * histograms over the last windows, the typical service time, the windows
 * limit=auto learns from, Retry-After, and the snapshot the status page
 * shows.
 */
#include "at_zone_impl.h"
#include "at_rng.h"
#include "at_tuning.h"

#include <apr_atomic.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

/* ---- totals and Retry-After --------------------------------------------- */

/* retry_after=auto never advises less than the time the queue takes to
 * drain. */
static apr_uint32_t retry_ceiling(const at_zone_t *z)
{
    return z->retry_after_max ? z->retry_after_max : AT_RETRY_AFTER_CEILING;
}

static apr_uint32_t retry_floor(const at_zone_t *z)
{
    return at_retry_after_secs(z->queued, z->typical_service_us, z->limit,
                               z->retry_after_max);
}

/* retry_after=auto: the floor is worked out only when a window closes. */
static void retry_window_turn(at_zone_t *z, apr_int64_t now)
{
    if (at_retry_due(&z->retry, now)) {
        at_retry_close(&z->retry, now, retry_floor(z), retry_ceiling(z));
    }
}

void zone_count_refusal(at_zone_t *z, int priority, apr_int64_t now, int scheduled)
{
    z->prio[PRIO_INDEX(priority)].rejected++;
    if (scheduled && z->retry_after == AT_RETRY_AFTER_AUTO) {
        retry_window_turn(z, now);
        z->retry.refused++;
    }
}

void zone_count_grant(at_zone_t *z, int priority, apr_int64_t wait_us, apr_int64_t now)
{
    at_priority_totals_t *pt = &z->prio[PRIO_INDEX(priority)];

    pt->admitted++;
    at_hist_add(&pt->wait, wait_us);
    if (z->retry_after == AT_RETRY_AFTER_AUTO) {
        retry_window_turn(z, now);
        z->retry.granted++;
    }
}

/* ---- windows, histograms, the typical service time -------------------- */

/* Two windows of AT_WINDOW_US: recent percentiles read both, so they always
 * cover between one and two windows of history. Lock held. */
static void rotate_windows(at_zone_t *z, apr_int64_t now)
{
    apr_int64_t age = now - z->win_start_us;

    if (age < AT_WINDOW_US) {
        return;
    }
    if (age >= 2 * AT_WINDOW_US) {
        memset(z->wait_win, 0, sizeof(z->wait_win));
        memset(z->service_win, 0, sizeof(z->service_win));
    }
    else {
        z->win_cur ^= 1;
        memset(&z->wait_win[z->win_cur], 0, sizeof(at_hist_t));
        memset(&z->service_win[z->win_cur], 0, sizeof(at_hist_t));
    }
    z->win_start_us = now;
}

void zone_record_wait(at_zone_t *z, apr_int64_t us, apr_int64_t now)
{
    rotate_windows(z, now);
    at_hist_add(&z->wait_all, us);
    at_hist_add(&z->wait_win[z->win_cur], us);
}

/* An average that no single request can drag: each sample counts for an
 * eighth, and for at most twice the current value. A request stuck for
 * minutes (a trickling upload, a hung backend) moves it by an eighth; work
 * that really became slower is followed within a few dozen requests. */
apr_uint64_t at_typical_service_after(apr_uint64_t typical, apr_int64_t us)
{
    apr_uint64_t x = us > 0 ? (apr_uint64_t)us : 0;

    if (!typical) {
        return x ? x : 1;
    }
    if (x > 2 * typical) {
        x = 2 * typical;
    }
    return (typical * 7 + x) / 8;
}

void zone_record_service(at_zone_t *z, apr_int64_t us, apr_int64_t now)
{
    rotate_windows(z, now);
    at_hist_add(&z->service_all, us);
    at_hist_add(&z->service_win[z->win_cur], us);
    z->service_ewma_us = z->service_ewma_us
                             ? (z->service_ewma_us * 7 + (apr_uint64_t)us) / 8
                             : (apr_uint64_t)us;
    z->typical_service_us = at_typical_service_after(z->typical_service_us, us);
}

/* limit=auto: the first release after a window is long enough hands the
 * window to the controller; one place, under the lock, for every process.
 * What it saw goes into note, for zone_log_window. */
static void maybe_close_window(at_zone_t *z, apr_int64_t now, window_note_t *note)
{
    at_window_t w;
    apr_uint32_t next;

    note_change(z); /* up to now */
    if (!at_sensor_window(&z->sensor, &z->ctl, z->service_ewma_us, now, &w)) {
        return;
    }
    note->judged = 1;
    note->w = w;
    note->limit = z->limit;
    if (!at_limit_update(&z->ctl, &w)) {
        at_sensor_reset(&z->sensor, now);
        return;
    }
    next = at_limit_value(&z->ctl);
    note->changed = 1;
    note->next = next;
    at_sensor_reset(&z->sensor, now + at_sensor_settling_us(z->limit, next, z->service_ewma_us));
    z->limit = next;
}

/* limit=auto: a completed request counts in the current window. */
void zone_window_add_completion(at_zone_t *z, apr_int64_t service, apr_int64_t now,
                                window_note_t *note)
{
    if (z->limit_auto) {
        at_sensor_completed(&z->sensor, service, now);
        maybe_close_window(z, now, note);
    }
}

/* What the controller was given, for LogLevel adaptive_throttle:trace1:
 * with it, a limit that wanders can be told from one that follows noise;
 * and at debug, a change of the limit. */
void zone_log_window(const at_zone_t *z, const window_note_t *note)
{
    const at_window_t *w = &note->w;

    if (!note->judged) {
        return;
    }
    at_log(AT_LOG_TRACE1, "zone %s: window of %.2f s at limit %u: %u done, %.1f running, "
           "service %.1f ms (+-%.1f%%), %.0f%% waiting", z->name, w->secs, note->limit,
           w->completed, w->inflight, w->service_us / 1000, 100 * w->service_rse,
           100 * w->limited);
    if (note->changed) {
        at_log(LOG_DEBUG, "zone %s: limit %u -> %u (%.1f running, %.0f/s, %.0f%% of the "
               "window with requests waiting)", z->name, note->limit, note->next,
               w->inflight, w->completed / w->secs, 100 * w->limited);
    }
}

/* ---- what the status page reads ------------------------------------------ */

void at_zone_glance(at_zone_t *z, at_zone_glance_t *g)
{
    g->limit = apr_atomic_read32(&z->limit);
    g->active = apr_atomic_read32(&z->active);
    g->running = zone_running(z);
    g->queued = apr_atomic_read32(&z->queued);
    g->queue_cap = apr_atomic_read32(&z->queue_cap);
    g->broken = apr_atomic_read32(&z->lock_broken) != 0;
}

/* The lock is held by a process that does not let go (stopped, in a
 * debugger): the figures a reader can take whole without it, marked stale. */
static void stats_without_lock(at_zone_t *z, at_zone_stats_t *o)
{
    at_zone_glance_t g;

    at_zone_glance(z, &g);
    o->stale = 1;
    o->limit = g.limit;
    o->active = g.active;
    o->queued = g.queued;
    o->queue_cap = g.queue_cap;
    o->nslots = z->nslots;
    o->nwaiters = z->nwaiters - z->nslots;
    o->rate_keys = z->rate.n;
    o->body_cap = z->body_cap;
    o->body_held = at_zone_body_held(z);
#define AT_COUNTER_COPY(field, ...) o->counters.field = __atomic_load_n(&z->counters.field, __ATOMIC_RELAXED);
    AT_ZONE_COUNTERS(AT_COUNTER_COPY)
#undef AT_COUNTER_COPY
}

/* ---- a scrape: copied under the lock, walked outside it --------------- */

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_scrape_walked, at_test_scrape_walked_locked;
/* Every entry a scrape walks, and those walked holding the zone's lock. */
static void note_walk(apr_uint32_t n)
{
    __atomic_add_fetch(&at_test_scrape_walked, n, __ATOMIC_RELAXED);
    if (zone_test_holding_lock()) {
        __atomic_add_fetch(&at_test_scrape_walked_locked, n, __ATOMIC_RELAXED);
    }
}
#define NOTE_WALK(n) note_walk(n)
#else
#define NOTE_WALK(n) ((void)0)
#endif

/* per_client, per_key: a copy of the table of counts, taken under the lock
 * in one memcpy (at most twice the zone's records), so that finding the
 * busiest (a pass with a sort of the top) is done after letting it go. */
typedef struct {
    at_client_table_t *t;
    apr_size_t bytes;
} client_copy_t;

/* Before the lock: the table's size never changes after the zone is laid. */
static void client_copy_alloc(const at_zone_t *z, client_copy_t *cc)
{
    apr_size_t head = ALIGN64(sizeof(at_client_table_t));

    cc->t = NULL;
    cc->bytes = (apr_size_t)z->clients.n * sizeof(at_client_entry_t);
    if (z->per_client && z->clients.n && (cc->t = malloc(head + cc->bytes))) {
        /* its pages are faulted in here, not while the lock is held */
        memset(cc->t, 0, head + cc->bytes);
    }
}

/* Lock held. Without memory for a copy, the table is walked here, as
 * before: the page still shows the busiest. */
static void client_copy_take(at_zone_t *z, client_copy_t *cc, at_zone_stats_t *o)
{
    apr_size_t head = ALIGN64(sizeof(at_client_table_t));

    if (!z->per_client) {
        return;
    }
    if (!cc->t) {
        NOTE_WALK(z->clients.n);
        o->nbusiest = at_client_busiest(&z->clients, o->busiest, AT_BUSIEST, &o->clients);
        return;
    }
    *cc->t = z->clients;
    cc->t->entries_off = head;
    memcpy((char *)cc->t + head, (char *)&z->clients + z->clients.entries_off, cc->bytes);
}

/* After the lock. */
static void client_copy_walk(client_copy_t *cc, at_zone_stats_t *o)
{
    if (cc->t) {
        NOTE_WALK(cc->t->n);
        o->nbusiest = at_client_busiest(cc->t, o->busiest, AT_BUSIEST, &o->clients);
        free(cc->t);
    }
}

/* After the lock: the oldest running request. A slot's owner is written
 * after its start (a release fence between), so an owner read here comes
 * with its own start or a later one's: the age shown is one a request
 * reached. */
static void oldest_running(at_zone_t *z, apr_int64_t now, at_zone_stats_t *o)
{
    apr_int64_t oldest = 0;
    apr_uint32_t i;

    NOTE_WALK(z->nslots);
    for (i = 0; i < z->nslots; i++) {
        at_slot_t *s = &slots(z)[i];
        apr_int32_t pid = __atomic_load_n(&s->owner.pid, __ATOMIC_ACQUIRE);
        apr_int64_t since = __atomic_load_n(&s->since_us, __ATOMIC_RELAXED);

        if (pid != 0 && now - since >= oldest) {
            oldest = now - since;
            o->oldest_pid = pid;
        }
    }
    o->oldest_us = oldest;
}

/* The figures of the zone, under the lock: a copy of fixed size (the
 * per-client table aside, copied whole). */
static void stats_locked(at_zone_t *z, apr_int64_t now, at_zone_stats_t *o)
{
    apr_uint32_t i;

    o->limit = z->limit;
    o->queue_cap = z->queue_cap;
    o->reserve = z->reserve;
    o->codel_target_us = z->codel.target_us;
    o->codel_interval_us =
        z->codel.target_us ? at_codel_interval(&z->codel, z->typical_service_us) : 0;
    o->standing_us = at_codel_standing_for(&z->codel, now, z->typical_service_us);
    for (i = 0; i < AT_PRIORITIES; i++) {
        o->priority[i].admitted = z->prio[i].admitted;
        o->priority[i].rejected = z->prio[i].rejected;
        o->priority[i].queued = z->queued_at[i];
        o->priority[i].wait = z->prio[i].wait;
    }
    o->nslots = z->nslots;
    o->nwaiters = z->nwaiters - z->nslots;
    o->active = z->active;
    o->queued = z->queued;
    o->over_cap = z->over_cap;
    o->timeout_us = z->timeout_us;
    o->retry_after = z->retry_after;
    o->dry_run = z->dry_run;
    o->counters = z->counters;
    o->limit_auto = z->limit_auto;
    o->limit_min = z->limit_auto ? z->ctl.min : z->limit;
    o->limit_max = z->limit_auto ? z->ctl.max : z->limit;
    o->limit_held = z->limit_auto ? at_limit_held(&z->ctl) : z->limit;
    o->limit_mode = z->ctl.mode;
    o->limit_changes = z->ctl.changes;
    o->baseline_us = z->ctl.baseline_us;
    o->recent_us = z->ctl.recent_us;
    o->per_client = z->keyed ? 0 : z->per_client;
    o->per_key = z->keyed ? z->per_client : 0;
    o->service_ewma_us = z->service_ewma_us;
    o->wait_all = z->wait_all;
    o->service_all = z->service_all;
    rotate_windows(z, now);
    o->wait_recent = z->wait_win[0];
    at_hist_merge(&o->wait_recent, &z->wait_win[1]);
    o->service_recent = z->service_win[0];
    at_hist_merge(&o->service_recent, &z->service_win[1]);
    if (z->mem.bytes) {
        o->mem_bytes = z->mem.bytes;
        o->mem_avail = z->mem.avail;
        o->mem_source = (int)z->mem.source;
        o->mem_pending = z->mem.pending;
        o->mem_read_age_us = now - z->mem.read_us;
    }
    o->mem_held = z->mem.held;
    o->mem_read_errors = z->mem.read_errors;
    o->rate = z->rate_conf;
    o->rate_by_key = (int)z->rate_by_key;
    o->rate_keys = z->rate.n;
    o->body_cap = z->body_cap;
    o->body_held = z->body_held;
}

/* The lock is held for a copy of fixed size and of the per-client table:
 * the walks of the slots, of that copy and of the rate= keys (16,384
 * buckets) come after, so that a scrape never holds up requests for long. */
void at_zone_stats(at_zone_t *z, at_zone_stats_t *o)
{
    apr_int64_t now = at_now_us();
    client_copy_t cc;
    mem_read_t m;

    memset(o, 0, sizeof(*o));
    client_copy_alloc(z, &cc);
    zone_mem_read_before_lock(z, &m); /* a reading no older than a request would use */
    if (zone_lock_until(z, now + AT_GLANCE_LOCK_US) != 0) {
        zone_mem_after_unlock(z, &m);
        free(cc.t);
        stats_without_lock(z, o);
        return;
    }
    zone_mem_apply_locked(z, &m);
    stats_locked(z, now, o);
    client_copy_take(z, &cc, o);
    zone_unlock(z);
    zone_mem_after_unlock(z, &m);

    client_copy_walk(&cc, o);
    oldest_running(z, now, o);
    if (o->rate_by_key) {
        /* each bucket read whole: a count as of the walk */
        NOTE_WALK(z->rate.n);
        o->rate_keys_in = at_rate_keys_in(&z->rate, now * 1000);
    }
}

apr_uint32_t at_retry_after_secs(apr_uint32_t queued, apr_uint64_t typical_us,
                                 apr_uint32_t limit, apr_uint32_t ceiling)
{
    /* Time for the queue ahead, and this request, to drain. */
    apr_uint64_t us = ((apr_uint64_t)queued + 1) * typical_us / (limit ? limit : 1);
    apr_uint64_t secs = (us + 999999) / 1000000;

    if (!ceiling) {
        ceiling = AT_RETRY_AFTER_CEILING;
    }
    return (apr_uint32_t)(secs < 1 ? 1 : secs > ceiling ? ceiling : secs);
}

/* Uniform in [0, 1), per thread: the spread of one Retry-After. */
static double spread(void)
{
    static __thread at_rng_t r;
    static __thread int seeded;

    if (!seeded) {
        at_rng_seed(&r);
        seeded = 1;
    }
    return at_rng_unit(&r);
}

apr_uint32_t at_zone_retry_after(at_zone_t *z)
{
    if (z->retry_after != AT_RETRY_AFTER_AUTO) {
        return z->retry_after;
    }
    /* Read without the lock: an estimate either way. */
    return at_retry_advice(&z->retry, retry_floor(z), retry_ceiling(z), spread());
}
