/*
 * A throttle zone in shared memory: slots, a FIFO queue with direct hand-off,
 * waiting with a deadline, reclaim of dead owners and recovery of the lock.
 *
 * Every record names its owner process, so what a dead process held can be
 * found and given back. The records are the truth; counts, free lists and
 * queue links are derived from them and rebuilt if a process dies while it
 * holds the lock (zone_repair).
 */
#include "at_zone.h"
#include "at_layout.h"
#include "at_owner.h"
#include "at_limit.h"
#include "at_retry.h"
#include "at_memgate.h"
#include "at_sensor.h"
#include "at_tuning.h"

#include <apr_atomic.h>
#include <apr_strings.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

/* A zone: "ATZ" and the layout's generation. A zone kept across a restart
 * onto a build with another layout (zone_layout(), from the structures
 * themselves) is laid anew. */
#define ZONE_MAGIC 0x41545a40u
#define NONE (-1)

/* W_EVICTED: put out of a full queue by a request of higher priority; the
 * record is the waiter's until it wakes and sees it. W_OVER_CAP: a dry
 * run's request running beyond the limit, recorded so that its count goes
 * back when its process dies. A waiter that cannot get the lock by its
 * deadline leaves without it, by compare-and-swap on its state: W_LEFT (it
 * was still in the queue), W_GONE (out of the queue: evicted, or granted
 * and its slot taken, W_TAKEN); the next holder of the lock tidies them. */
enum { W_FREE = 0, W_WAITING, W_GRANTED, W_EVICTED, W_OVER_CAP, W_LEFT, W_GONE, W_TAKEN,
       W_DROP /* granted, but its waiter's client had gone: the slot goes back */ };

typedef struct {
    at_owner_t owner;       /* pid 0: free */
    apr_uint64_t ticket;
    apr_int64_t since_us;
    apr_int32_t next_free;
    apr_int32_t released; /* let go without the lock: the next holder frees it */
    at_client_key_t client;
    unsigned char client_pad[7]; /* shared layouts name their padding */
} at_slot_t;

typedef struct {
    at_owner_t owner;
    apr_uint64_t ticket;
    apr_uint32_t wake;      /* futex word, bumped on every grant */
    apr_int32_t state;
    apr_int32_t slot;       /* slot handed over, NONE while waiting */
    apr_int32_t prev, next; /* queue links; next also links the free list */
    apr_int32_t priority;
    at_client_key_t client;
    unsigned char client_pad[7];
} at_waiter_t;

/* A priority's totals, kept in the zone. */
typedef struct {
    apr_uint64_t admitted, rejected;
    at_hist_t wait;
} at_priority_totals_t;

#define PRIO_INDEX(p) ((p)-AT_PRIORITY_MIN)

struct at_zone {
    apr_uint32_t magic;
    apr_uint32_t nslots, nwaiters;
    apr_uint32_t pad0;
    apr_uint64_t layout; /* zone_layout() of the build that laid it */
    apr_uint32_t limit, queue_cap, retry_after, retry_after_max, per_client;
    apr_int32_t dry_run;
    apr_uint32_t lock_broken; /* the lock failed for good: requests pass untouched */
    apr_uint32_t reserve;
    apr_int64_t timeout_us;
    char name[AT_ZONE_NAME_MAX + 1];
    char name_pad[7];
    pthread_mutex_t lock;

    apr_uint32_t active, queued;
    apr_int32_t free_slot, free_waiter, qhead, qtail;
    apr_uint64_t next_ticket;
    apr_int64_t last_reclaim_us;
    apr_uint64_t service_ewma_us;
    /* a moving mean of service times in which one request counts for at
     * most twice the current value (at_typical_service_after): what
     * Retry-After and predictive rejection go by */
    apr_uint64_t typical_service_us;

    at_zone_counters_t counters;
    apr_uint32_t over_cap;

    /* priorities: who waits at each, and their totals */
    apr_uint32_t queued_at[AT_PRIORITIES];
    at_priority_totals_t prio[AT_PRIORITIES];
    at_codel_t codel;
    at_retry_t retry;

    at_hist_t wait_all, service_all;
    at_hist_t wait_win[2], service_win[2];
    apr_int64_t win_start_us;
    apr_int32_t win_cur;
    apr_int32_t pad1;

    apr_size_t slots_off, waiters_off;
    /* per_client: requests in per client; every counted request holds a
     * slot or a waiting record */
    at_client_table_t clients;

    /* limit=auto: the controller, and what the current window measured */
    apr_int32_t limit_auto;
    apr_int32_t pad2;
    at_limit_t ctl;
    at_sensor_t sensor;

    /* mem=: the last reading of available memory; the memory promised to
     * started requests that no reading has shown yet; what requests that
     * ended since the reading are taken to have given back */
    at_memgate_t mem;

    /* A definition the server's parent published without the lock (a
     * child may hold it, stopped or hung): the next holder applies it.
     * conf_seq is odd while the parent writes conf_pending. */
    apr_uint32_t conf_seq, conf_applied;
    at_zone_conf_t conf_pending;
    /* records left without the lock since the last tidy (W_LEFT...) */
    apr_uint32_t left;
    apr_uint32_t pad3;
    /* The zone this one replaced at a restart (grown past its memory):
     * what still runs there counts against this zone's limit. An address
     * in the parent's memory, the same in every child; the parent clears
     * it before it frees that zone. */
    at_zone_t *predecessor;
};

/* ---- the layout, for zones kept across restarts ------------------------ */

static const at_field_t slot_fields[] = {
    AT_FIELD(at_slot_t, owner),     AT_FIELD(at_slot_t, ticket), AT_FIELD(at_slot_t, since_us),
    AT_FIELD(at_slot_t, next_free), AT_FIELD(at_slot_t, released), AT_FIELD(at_slot_t, client),
    AT_FIELD(at_slot_t, client_pad)};

static const at_field_t waiter_fields[] = {
    AT_FIELD(at_waiter_t, owner), AT_FIELD(at_waiter_t, ticket),   AT_FIELD(at_waiter_t, wake),
    AT_FIELD(at_waiter_t, state), AT_FIELD(at_waiter_t, slot),     AT_FIELD(at_waiter_t, prev),
    AT_FIELD(at_waiter_t, next),  AT_FIELD(at_waiter_t, priority), AT_FIELD(at_waiter_t, client),
    AT_FIELD(at_waiter_t, client_pad)};

static const at_field_t prio_fields[] = {
    AT_FIELD(at_priority_totals_t, admitted), AT_FIELD(at_priority_totals_t, rejected),
    AT_FIELD(at_priority_totals_t, wait)};

static const at_field_t zone_fields[] = {
    AT_FIELD(at_zone_t, magic),        AT_FIELD(at_zone_t, nslots),
    AT_FIELD(at_zone_t, nwaiters),     AT_FIELD(at_zone_t, pad0),
    AT_FIELD(at_zone_t, layout),
    AT_FIELD(at_zone_t, limit),        AT_FIELD(at_zone_t, queue_cap),
    AT_FIELD(at_zone_t, retry_after),  AT_FIELD(at_zone_t, retry_after_max),
    AT_FIELD(at_zone_t, per_client),   AT_FIELD(at_zone_t, dry_run),
    AT_FIELD(at_zone_t, lock_broken),  AT_FIELD(at_zone_t, reserve),
    AT_FIELD(at_zone_t, timeout_us),   AT_FIELD(at_zone_t, name),
    AT_FIELD(at_zone_t, name_pad),     AT_FIELD(at_zone_t, lock),         AT_FIELD(at_zone_t, active),
    AT_FIELD(at_zone_t, queued),       AT_FIELD(at_zone_t, free_slot),
    AT_FIELD(at_zone_t, free_waiter),  AT_FIELD(at_zone_t, qhead),
    AT_FIELD(at_zone_t, qtail),        AT_FIELD(at_zone_t, next_ticket),
    AT_FIELD(at_zone_t, last_reclaim_us), AT_FIELD(at_zone_t, service_ewma_us),
    AT_FIELD(at_zone_t, typical_service_us), AT_FIELD(at_zone_t, counters),
    AT_FIELD(at_zone_t, over_cap),     AT_FIELD(at_zone_t, queued_at),
    AT_FIELD(at_zone_t, prio),         AT_FIELD(at_zone_t, codel),
    AT_FIELD(at_zone_t, retry),        AT_FIELD(at_zone_t, wait_all),
    AT_FIELD(at_zone_t, service_all),  AT_FIELD(at_zone_t, wait_win),
    AT_FIELD(at_zone_t, service_win),  AT_FIELD(at_zone_t, win_start_us),
    AT_FIELD(at_zone_t, win_cur),      AT_FIELD(at_zone_t, pad1),
    AT_FIELD(at_zone_t, slots_off),
    AT_FIELD(at_zone_t, waiters_off),  AT_FIELD(at_zone_t, clients),
    AT_FIELD(at_zone_t, limit_auto),   AT_FIELD(at_zone_t, pad2),
    AT_FIELD(at_zone_t, ctl),
    AT_FIELD(at_zone_t, sensor),       AT_FIELD(at_zone_t, mem),
    AT_FIELD(at_zone_t, conf_seq),     AT_FIELD(at_zone_t, conf_applied),
    AT_FIELD(at_zone_t, conf_pending), AT_FIELD(at_zone_t, left),
    AT_FIELD(at_zone_t, pad3),         AT_FIELD(at_zone_t, predecessor)};

static const at_record_t zone_records[] = {
    AT_RECORD(at_zone_t, zone_fields), AT_RECORD(at_slot_t, slot_fields),
    AT_RECORD(at_waiter_t, waiter_fields), AT_RECORD(at_priority_totals_t, prio_fields)};

const at_record_t *at_zone_layout_records(apr_size_t *n)
{
    *n = sizeof(zone_records) / sizeof(zone_records[0]);
    return zone_records;
}

/* Every figure of every structure a zone holds, folded once. */
static apr_uint64_t zone_layout(void)
{
    static apr_uint64_t id;
    apr_size_t n, m;

    if (!id) {
        const at_record_t *common = at_layout_common(&n), *own = at_zone_layout_records(&m);

        id = at_layout_fold(at_layout_fold(0, common, n), own, m);
    }
    return id;
}

#ifdef AT_TEST_HOOKS
void (*at_test_step_hook)(int where, int step);
#endif

static at_slot_t *slots(at_zone_t *z)
{
    return (at_slot_t *)((char *)z + z->slots_off);
}

static at_waiter_t *waiters(at_zone_t *z)
{
    return (at_waiter_t *)((char *)z + z->waiters_off);
}

#define ALIGN64(n) (((n) + 63) & ~(apr_size_t)63)

/* A granted waiter keeps its record until it wakes, and each such record
 * holds a slot: one spare record per slot keeps the queue's full capacity. */
static apr_uint32_t waiter_records(apr_uint32_t nslots, apr_uint32_t nwaiters)
{
    return nwaiters + nslots;
}

static apr_uint32_t client_entries(apr_uint32_t nslots, apr_uint32_t nwaiters)
{
    return at_client_entries_for((apr_uint64_t)nslots + waiter_records(nslots, nwaiters));
}

apr_size_t at_zone_size(apr_uint32_t nslots, apr_uint32_t nwaiters)
{
    return ALIGN64(sizeof(at_zone_t)) + ALIGN64(nslots * sizeof(at_slot_t))
           + ALIGN64(waiter_records(nslots, nwaiters) * sizeof(at_waiter_t))
           + ALIGN64(client_entries(nslots, nwaiters) * sizeof(at_client_entry_t));
}

/* limit=auto: what ran and what waited, integrated over time; called
 * before every change of active or queued, all of which happen under the
 * lock. */
static void note_change(at_zone_t *z)
{
    if (z->limit_auto) {
        at_sensor_integrate(&z->sensor, at_now_us(), z->active, z->queued);
    }
}

/* ---- requests per client (lock held): counted while per_client is set -- */

static void client_add(at_zone_t *z, const at_client_key_t *k)
{
    if (z->per_client) {
        at_client_add(&z->clients, k);
    }
}

static void client_remove(at_zone_t *z, const at_client_key_t *k)
{
    if (z->per_client) {
        at_client_remove(&z->clients, k);
    }
}

/* The records are the truth: recount from them. */
static void rebuild_client_counts(at_zone_t *z)
{
    apr_uint32_t i;

    at_client_table_clear(&z->clients);
    for (i = 0; i < z->nslots; i++) {
        if (slots(z)[i].owner.pid != 0) {
            client_add(z, &slots(z)[i].client);
        }
    }
    for (i = 0; i < z->nwaiters; i++) {
        if (waiters(z)[i].state == W_WAITING) {
            client_add(z, &waiters(z)[i].client);
        }
    }
}

/* ---- waking one waiter ---------------------------------------------- */

static void wake_word(apr_uint32_t *word)
{
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0);
#endif
}

static void sleep_on_word(apr_uint32_t *word, apr_uint32_t seen,
                          apr_int64_t us)
{
    struct timespec ts;

    if (us <= 0) {
        return;
    }
#ifdef __linux__
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000;
    /* Not FUTEX_PRIVATE: the word is shared between processes. */
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
#else
    (void)word;
    (void)seen;
    ts.tv_sec = 0;
    ts.tv_nsec = (us < 1000 ? us : 1000) * 1000;
    nanosleep(&ts, NULL);
#endif
}

/* ---- free lists and the queue (lock held) --------------------------- */

static void rebuild_free_slots(at_zone_t *z)
{
    at_slot_t *s = slots(z);
    apr_int32_t i;

    note_change(z);
    z->free_slot = NONE;
    z->active = 0;
    for (i = (apr_int32_t)z->nslots - 1; i >= 0; i--) {
        if (s[i].owner.pid == 0) {
            s[i].next_free = z->free_slot;
            z->free_slot = i;
        }
        else {
            z->active++;
        }
    }
}

static void queue_length_changed(at_zone_t *z)
{
    if (z->codel.target_us) {
        at_codel_queue_is(&z->codel, z->queued, at_now_us());
    }
}

/* Behind every waiter of its priority or higher, ahead of the lower ones:
 * the queue stays in priority order, FIFO within a priority. */
static void queue_push(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = waiters(z);
    apr_int32_t after = z->qtail;

    note_change(z);
    while (after != NONE && w[after].priority < w[i].priority) {
        after = w[after].prev;
    }
    w[i].prev = after;
    w[i].next = after != NONE ? w[after].next : z->qhead;
    if (w[i].next != NONE) {
        w[w[i].next].prev = i;
    }
    else {
        z->qtail = i;
    }
    if (after != NONE) {
        w[after].next = i;
    }
    else {
        z->qhead = i;
    }
    z->queued++;
    z->queued_at[PRIO_INDEX(w[i].priority)]++;
    queue_length_changed(z);
}

static void queue_unlink(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = waiters(z);

    note_change(z);
    if (w[i].prev != NONE) {
        w[w[i].prev].next = w[i].next;
    }
    else {
        z->qhead = w[i].next;
    }
    if (w[i].next != NONE) {
        w[w[i].next].prev = w[i].prev;
    }
    else {
        z->qtail = w[i].prev;
    }
    z->queued--;
    z->queued_at[PRIO_INDEX(w[i].priority)]--;
    queue_length_changed(z);
}

/* A waiter leaves the queue without a slot: timeout, abort or death. */
static void waiter_leave_queue(at_zone_t *z, apr_int32_t i)
{
    queue_unlink(z, i);
    client_remove(z, &waiters(z)[i].client);
}

static void waiter_free(at_zone_t *z, apr_int32_t i)
{
    at_waiter_t *w = &waiters(z)[i];

    w->state = W_FREE;
    w->owner.pid = 0;
    w->slot = NONE;
    w->next = z->free_waiter;
    z->free_waiter = i;
}

/* The request's count against its client moves with it, from its waiting
 * record to its slot; it is dropped when it leaves either. */
static apr_int32_t slot_pop_free(at_zone_t *z)
{
    apr_int32_t i = z->free_slot;

    z->free_slot = slots(z)[i].next_free;
    return i;
}

/* The owner goes last: a slot with an owner is taken, so a process that
 * dies half way leaves either a free slot or a whole record. */
static void slot_fill(at_zone_t *z, apr_int32_t i, const at_owner_t *owner,
                      apr_uint64_t ticket, const at_client_key_t *client, apr_int64_t now)
{
    at_slot_t *s = &slots(z)[i];

    s->ticket = ticket;
    s->released = 0;
    AT_STEP(AT_STEP_SLOT_FILL, 1);
    s->since_us = now;
    s->client = *client;
    AT_STEP(AT_STEP_SLOT_FILL, 2);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    s->owner = *owner;
    AT_STEP(AT_STEP_SLOT_FILL, 3);
    note_change(z);
    z->active++;
}

static apr_int32_t slot_take(at_zone_t *z, const at_owner_t *owner,
                             apr_uint64_t ticket, const at_client_key_t *client,
                             apr_int64_t now)
{
    apr_int32_t i = slot_pop_free(z);

    slot_fill(z, i, owner, ticket, client, now);
    return i;
}

static void slot_put(at_zone_t *z, apr_int32_t i)
{
    at_slot_t *s = &slots(z)[i];

    note_change(z);
    if (z->mem.bytes) {
        at_memgate_ended(&z->mem, at_now_us() - s->since_us);
    }
    client_remove(z, &s->client);
    s->owner.pid = 0;
    s->ticket = 0;
    s->released = 0;
    s->next_free = z->free_slot;
    z->free_slot = i;
    z->active--;
}

/* ---- mem= (lock held) ------------------------------------------------ */

/* Running requests younger than settle_us, which a reading may not show. */
static apr_uint32_t young_requests(void *ctx, apr_int64_t now, apr_int64_t settle_us)
{
    at_zone_t *z = ctx;
    apr_uint32_t i, n = 0;

    for (i = 0; i < z->nslots; i++) {
        const at_slot_t *s = &slots(z)[i];

        n += s->owner.pid != 0 && now - s->since_us < settle_us;
    }
    return n;
}

/* Judged at this moment: a reading that was fresh before a long wait for
 * the lock is not any more. */
static int mem_allows(at_zone_t *z)
{
    return at_memgate_estimate(&z->mem, at_now_us());
}

/* mem=: a reading is taken before the lock (if one is due), applied right
 * after taking it, and a failure logged after letting it go: no file read
 * and no log line while every process of the zone may be waiting. */
typedef struct {
    int taken, warn;
    at_mem_reading_t r;
} mem_read_t;

static void mem_read_before_lock(at_zone_t *z, mem_read_t *m)
{
    m->warn = 0;
    m->taken = at_memgate_take_reading(&z->mem, at_now_us(), &m->r);
}

static void mem_apply_locked(at_zone_t *z, mem_read_t *m)
{
    if (m->taken) {
        m->warn = at_memgate_apply(&z->mem, &m->r, at_now_us(), z->active, young_requests, z);
        m->taken = 0;
    }
}

static void mem_warn_after_unlock(const at_zone_t *z, mem_read_t *m)
{
    if (m->warn) {
        m->warn = 0;
        at_log(LOG_WARNING, "zone %s: cannot read the available memory (/proc/meminfo, "
               "memory cgroup); mem= is not enforced", z->name);
    }
}

static void zone_unlock(at_zone_t *z);

static void unlock_after_mem(at_zone_t *z, mem_read_t *m)
{
    zone_unlock(z);
    mem_warn_after_unlock(z, m);
}

/* ---- what runs (lock held) ------------------------------------------- */

/* Requests running against this zone's limit: its own, and those still
 * running in the zones it replaced at restarts, until they end. */
static apr_uint32_t running(const at_zone_t *z)
{
    apr_uint32_t n = __atomic_load_n(&z->active, __ATOMIC_RELAXED);
    int depth = 0;

    for (z = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE); z && depth < 8;
         z = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE), depth++) {
        n += __atomic_load_n(&z->active, __ATOMIC_RELAXED);
    }
    return n;
}

/* ---- priorities (lock held) ------------------------------------------ */

/* The slots a request of this priority may fill: reserve= keeps the last
 * ones for priorities above 0, and always leaves one for the rest. */
static apr_uint32_t slots_for(const at_zone_t *z, int priority)
{
    apr_uint32_t keep = z->reserve;

    if (priority > 0 || !keep) {
        return z->limit;
    }
    if (keep >= z->limit) {
        keep = z->limit ? z->limit - 1 : 0;
    }
    return z->limit - keep;
}

/* Waiters a request of this priority would find ahead of it. */
static apr_uint32_t queued_ahead(const at_zone_t *z, int priority)
{
    apr_uint32_t n = 0;
    int p;

    if (!z->queued || priority == AT_PRIORITY_MIN) {
        return z->queued;
    }
    for (p = priority; p <= AT_PRIORITY_MAX; p++) {
        n += z->queued_at[PRIO_INDEX(p)];
    }
    return n;
}

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

static void count_refusal(at_zone_t *z, int priority, apr_int64_t now, int scheduled)
{
    z->prio[PRIO_INDEX(priority)].rejected++;
    if (scheduled && z->retry_after == AT_RETRY_AFTER_AUTO) {
        retry_window_turn(z, now);
        z->retry.refused++;
    }
}

static void count_grant(at_zone_t *z, int priority, apr_int64_t wait_us, apr_int64_t now)
{
    at_priority_totals_t *pt = &z->prio[PRIO_INDEX(priority)];

    pt->admitted++;
    at_hist_add(&pt->wait, wait_us);
    if (z->retry_after == AT_RETRY_AFTER_AUTO) {
        retry_window_turn(z, now);
        z->retry.granted++;
    }
}

/* Hand free capacity to the oldest waiters, one wake-up each. The waiter's
 * record names its slot before the slot names its owner, and the grant
 * comes last: a process that dies anywhere in between leaves a hand-off
 * that zone_repair completes from the waiter's record. */
/* Lock held, the record out of the queue: moves a waiting record on,
 * unless its waiter left without the lock first (then it is W_GONE, for the
 * tidy, and 0 is returned). */
static int leave_waiting(at_waiter_t *w, apr_int32_t to)
{
    apr_int32_t was = W_WAITING;

    if (__atomic_compare_exchange_n(&w->state, &was, to, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        return 1;
    }
    w->state = W_GONE;
    return 0;
}

static void dispatch(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    apr_int64_t now = at_now_us();

    while (z->qhead != NONE && running(z) < slots_for(z, w[z->qhead].priority) &&
           z->free_slot != NONE && mem_allows(z)) {
        apr_int32_t i = z->qhead, slot;

        queue_unlink(z, i);
        AT_STEP(AT_STEP_DISPATCH, 1);
        slot = slot_pop_free(z);
        AT_STEP(AT_STEP_DISPATCH, 2);
        w[i].slot = slot;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        AT_STEP(AT_STEP_DISPATCH, 3);
        slot_fill(z, slot, &w[i].owner, w[i].ticket, &w[i].client, now);
        at_memgate_started(&z->mem);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        AT_STEP(AT_STEP_DISPATCH, 4);
        if (!leave_waiting(&w[i], W_GRANTED)) {
            slot_put(z, slot); /* its waiter left meanwhile: the slot goes on */
            continue;
        }
        AT_STEP(AT_STEP_DISPATCH, 5);
        wake_word(&w[i].wake);
    }
}

/* ---- the lock -------------------------------------------------------- */

/* Queue order: higher priority first, then arrival. */
static int queue_before(const at_waiter_t *a, const at_waiter_t *b)
{
    if (a->priority != b->priority) {
        return a->priority > b->priority;
    }
    return a->ticket < b->ticket;
}

/* Sorts n records linked by next (ending in NONE) into queue order, in
 * place: repair runs when memory may be short and must not allocate. */
static apr_int32_t sort_waiting(at_waiter_t *w, apr_int32_t head, apr_uint32_t n)
{
    apr_int32_t mid = head, before = NONE, out = NONE, *tail = &out;
    apr_uint32_t i;

    if (n < 2) {
        return head;
    }
    for (i = 0; i < n / 2; i++) {
        before = mid;
        mid = w[mid].next;
    }
    w[before].next = NONE;
    head = sort_waiting(w, head, n / 2);
    mid = sort_waiting(w, mid, n - n / 2);
    while (head != NONE && mid != NONE) {
        apr_int32_t *from = queue_before(&w[mid], &w[head]) ? &mid : &head;

        *tail = *from;
        tail = &w[*from].next;
        *from = w[*from].next;
    }
    *tail = head != NONE ? head : mid;
    return out;
}

/* A hand-off that a dying process started: the waiter's record names the
 * slot, so the slot is written from it (whatever part of it was written
 * already) and the waiter is granted. The slot was free when the hand-off
 * took it, so this never puts the zone over its cap. */
static void complete_handoff(at_zone_t *z, apr_int32_t wi, apr_int64_t now)
{
    at_waiter_t *w = &waiters(z)[wi];

    if (w->slot < 0 || (apr_uint32_t)w->slot >= z->nslots) {
        w->slot = NONE; /* not a slot: the waiter queues again */
        return;
    }
    slot_fill(z, w->slot, &w->owner, w->ticket, &w->client, now);
    w->state = W_GRANTED;
    wake_word(&w->wake);
}

/* A process died holding the lock: rebuild everything derived from the
 * records, finishing any hand-off that had got as far as naming its slot. */
static void zone_repair(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    apr_int64_t now = at_now_us();
    apr_int32_t waiting = NONE, next;
    apr_uint32_t i, n = 0;

    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    for (i = 0; i < z->nwaiters; i++) {
        if (w[i].state == W_WAITING && w[i].slot != NONE) {
            complete_handoff(z, (apr_int32_t)i, now);
        }
    }
    rebuild_free_slots(z);
    z->free_waiter = NONE;
    z->qhead = z->qtail = NONE;
    note_change(z);
    z->queued = 0;
    memset(z->queued_at, 0, sizeof(z->queued_at));
    z->over_cap = 0;
    for (i = z->nwaiters; i-- > 0;) {
        if (w[i].state == W_WAITING) {
            w[i].next = waiting;
            waiting = (apr_int32_t)i;
            n++;
        }
        else if (w[i].state == W_FREE) {
            waiter_free(z, (apr_int32_t)i);
        }
        else if (w[i].state == W_OVER_CAP) {
            z->over_cap++;
        }
        else if (w[i].state == W_LEFT) {
            w[i].state = W_GONE; /* the queue is rebuilt without it */
        }
    }
    for (waiting = sort_waiting(w, waiting, n); waiting != NONE; waiting = next) {
        next = w[waiting].next;
        queue_push(z, waiting);
    }
    rebuild_client_counts(z);
    z->counters.lock_repairs++;
    dispatch(z);
}

static int zone_lock_result(at_zone_t *z, int rc)
{
    if (rc == EOWNERDEAD) {
        zone_repair(z);
        pthread_mutex_consistent(&z->lock);
        at_log(LOG_WARNING, "zone %s: a process died holding the lock; zone state "
             "rebuilt (active %u, queued %u)", z->name, z->active, z->queued);
        return 0;
    }
    if (rc != 0 && rc != EBUSY && rc != ETIMEDOUT) {
        at_log(LOG_ERR, "zone %s: cannot take the lock: %s", z->name, strerror(rc));
        apr_atomic_set32(&z->lock_broken, 1);
    }
    return rc;
}

static void apply_published_conf(at_zone_t *z);

/* Lock held: frees the records whose waiters left without the lock, and
 * the slots let go without it. */
static void tidy_left(at_zone_t *z)
{
    at_waiter_t *w = waiters(z);
    at_slot_t *s = slots(z);

    for (apr_uint32_t i = 0; i < z->nslots; i++) {
        if (s[i].owner.pid != 0 && __atomic_load_n(&s[i].released, __ATOMIC_ACQUIRE)) {
            slot_put(z, (apr_int32_t)i);
        }
    }

    for (apr_uint32_t i = 0; i < z->nwaiters; i++) {
        apr_int32_t st = __atomic_load_n(&w[i].state, __ATOMIC_ACQUIRE);

        if (st == W_LEFT) {
            waiter_leave_queue(z, (apr_int32_t)i);
        }
        else if (st == W_TAKEN) {
            z->counters.admitted++; /* the slot is its waiter's */
        }
        else if (st == W_DROP) {
            slot_put(z, w[i].slot);
            z->counters.aborted++;
        }
        else if (st != W_GONE) {
            continue;
        }
        waiter_free(z, (apr_int32_t)i);
    }
    dispatch(z);
}

/* The new holder catches up: it tidies the records that waiters left
 * without the lock, and applies a configuration published since. */
static int catch_up_on_lock(at_zone_t *z, int rc)
{
    if (rc == 0) {
        /* a load first: the common case writes nothing */
        if (__atomic_load_n(&z->left, __ATOMIC_RELAXED)
            && __atomic_exchange_n(&z->left, 0, __ATOMIC_ACQ_REL)) {
            tidy_left(z);
        }
        apply_published_conf(z);
    }
    return rc;
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_lock_count;
#define COUNT_LOCK() __atomic_add_fetch(&at_test_lock_count, 1, __ATOMIC_RELAXED)
#else
#define COUNT_LOCK() ((void)0)
#endif

static int zone_lock(at_zone_t *z)
{
    COUNT_LOCK();
    return catch_up_on_lock(z, zone_lock_result(z, pthread_mutex_lock(&z->lock)));
}

/* For the server's parent, which must never wait on a child: EBUSY if the
 * lock is held (by a process that may be stopped or hung). */
static int zone_trylock(at_zone_t *z)
{
    return catch_up_on_lock(z, zone_lock_result(z, pthread_mutex_trylock(&z->lock)));
}

/* Waits for the lock until the monotonic time until_us (at_now_us's clock):
 * ETIMEDOUT past it. A request never waits for the lock longer than it may
 * wait at all, whatever the holder is doing (stopped, in a debugger, frozen
 * with its cgroup). */
static int zone_lock_until(at_zone_t *z, apr_int64_t until_us)
{
    struct timespec ts;
    int rc;

    COUNT_LOCK();
    ts.tv_sec = (time_t)(until_us / 1000000);
    ts.tv_nsec = (long)(until_us % 1000000) * 1000;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    rc = pthread_mutex_clocklock(&z->lock, CLOCK_MONOTONIC, &ts);
#else
    {
        struct timespec real;
        apr_int64_t left = until_us - at_now_us();

        clock_gettime(CLOCK_REALTIME, &real);
        left = left > 0 ? left : 0;
        ts.tv_sec = real.tv_sec + (time_t)(left / 1000000);
        ts.tv_nsec = real.tv_nsec + (long)(left % 1000000) * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        rc = pthread_mutex_timedlock(&z->lock, &ts);
    }
#endif
    return catch_up_on_lock(z, zone_lock_result(z, rc));
}

static void zone_unlock(at_zone_t *z)
{
    pthread_mutex_unlock(&z->lock);
}

/* ---- life cycle ------------------------------------------------------- */

/* A new automatic limit starts where the old one was, if any. Unchanged
 * bounds keep the controller's state across a restart. */
static void apply_limit(at_zone_t *z, const at_zone_conf_t *c)
{
    if (!c->limit_auto) {
        z->limit_auto = 0;
        z->limit = c->limit;
        return;
    }
    if (!z->limit_auto || z->ctl.min != c->limit_min || z->ctl.max != c->limit_max) {
        at_limit_init(&z->ctl, z->limit_auto ? at_limit_value(&z->ctl) : c->limit,
                      c->limit_min, c->limit_max);
        at_sensor_reset(&z->sensor, at_now_us());
    }
    at_limit_set_cores(&z->ctl, c->cores);
    z->limit_auto = 1;
    z->limit = at_limit_value(&z->ctl);
}

static void apply_conf(at_zone_t *z, const at_zone_conf_t *c)
{
    int recount = c->per_client && !z->per_client;

    z->per_client = c->per_client;
    if (recount) {
        rebuild_client_counts(z); /* counts lapse while the limit is off */
    }
    apply_limit(z, c);
    z->queue_cap = c->queue;
    z->timeout_us = c->timeout_us;
    z->retry_after = c->retry_after;
    z->retry_after_max = c->retry_after_max;
    z->dry_run = c->dry_run;
    z->mem.bytes = c->mem_bytes;
    z->reserve = c->reserve;
    if (c->codel_target_us && !z->codel.target_us) {
        z->codel.busy_since_us = 0; /* not tracked while off: from now on */
        at_codel_queue_is(&z->codel, z->queued, at_now_us());
    }
    z->codel.target_us = c->codel_target_us;
    z->codel.interval_us = c->codel_interval_us;
}

apr_status_t at_zone_init(void *mem, apr_size_t size, const char *name,
                          const at_zone_conf_t *c, apr_uint32_t nslots,
                          apr_uint32_t nwaiters)
{
    at_zone_t *z = mem;
    pthread_mutexattr_t attr;
    int rc;

    if (nslots < at_conf_highest_limit(c) || nwaiters < c->queue
        || size < at_zone_size(nslots, nwaiters)) {
        return APR_EINVAL;
    }
    memset(mem, 0, size);
    z->nslots = nslots;
    z->nwaiters = waiter_records(nslots, nwaiters);
    z->slots_off = ALIGN64(sizeof(at_zone_t));
    z->waiters_off = z->slots_off + ALIGN64(z->nslots * sizeof(at_slot_t));
    at_client_table_init(&z->clients,
                         (at_client_entry_t *)((char *)z + z->waiters_off
                                               + ALIGN64(z->nwaiters * sizeof(at_waiter_t))),
                         client_entries(nslots, nwaiters),
                         (apr_uint64_t)at_now_us() ^ ((apr_uint64_t)getpid() << 32)
                             ^ (apr_uint64_t)(apr_uintptr_t)mem);
    apply_conf(z, c);
    apr_cpystrn(z->name, name, sizeof(z->name));

    if ((rc = pthread_mutexattr_init(&attr)) != 0
        || (rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)) != 0
        || (rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)) != 0
        || (rc = pthread_mutex_init(&z->lock, &attr)) != 0) {
        return rc;
    }
    pthread_mutexattr_destroy(&attr);

    rebuild_free_slots(z);
    z->free_waiter = NONE;
    z->qhead = z->qtail = NONE;
    for (apr_int32_t i = (apr_int32_t)z->nwaiters - 1; i >= 0; i--) {
        waiter_free(z, i);
    }
    z->layout = zone_layout();
    z->magic = ZONE_MAGIC;
    at_owner_self(); /* so children forked from here refresh their identity */
    return APR_SUCCESS;
}

/* A zone laid by a build of another layout, or whose lock is broken for
 * good, is never kept: the caller lays a new one. */
int at_zone_can_hold(const at_zone_t *z, const at_zone_conf_t *c)
{
    return at_zone_compatible(z) && at_conf_highest_limit(c) <= z->nslots
           && waiter_records(z->nslots, c->queue) <= z->nwaiters;
}

int at_zone_compatible(const at_zone_t *z)
{
    return z->magic == ZONE_MAGIC && z->layout == zone_layout()
           && !apr_atomic_read32((volatile apr_uint32_t *)&z->lock_broken);
}

int at_zone_counts(const at_zone_t *z, const at_zone_t *old)
{
    return __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE) == old;
}

void at_zone_succeed(at_zone_t *z, at_zone_t *old)
{
    __atomic_store_n(&z->predecessor, old, __ATOMIC_RELEASE);
}

int at_zone_idle(const at_zone_t *z)
{
    return !__atomic_load_n(&z->active, __ATOMIC_ACQUIRE)
           && !__atomic_load_n(&z->queued, __ATOMIC_ACQUIRE)
           && !__atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE);
}

at_zone_t *at_zone_let_go_predecessor(at_zone_t *z)
{
    at_zone_t *old = __atomic_load_n(&z->predecessor, __ATOMIC_ACQUIRE);

    if (!old || !at_zone_idle(old)) {
        return NULL;
    }
    __atomic_store_n(&z->predecessor, NULL, __ATOMIC_RELEASE);
    return old;
}

/* Only the server's parent writes a definition, one restart at a time;
 * readers check the sequence around their copy (a seqlock). */
static void publish_conf(at_zone_t *z, const at_zone_conf_t *c)
{
    apr_uint32_t seq = __atomic_load_n(&z->conf_seq, __ATOMIC_RELAXED);

    __atomic_store_n(&z->conf_seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(&z->conf_pending, c, sizeof(*c));
    __atomic_store_n(&z->conf_seq, seq + 2, __ATOMIC_RELEASE);
}

/* Lock held: a definition published since the last one applied takes
 * effect now. One caught being written is taken by a later holder. */
static void apply_published_conf(at_zone_t *z)
{
    apr_uint32_t seq = __atomic_load_n(&z->conf_seq, __ATOMIC_ACQUIRE);
    at_zone_conf_t c;

    if (seq == z->conf_applied || (seq & 1)) {
        return;
    }
    memcpy(&c, &z->conf_pending, sizeof(c));
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&z->conf_seq, __ATOMIC_RELAXED) != seq) {
        return;
    }
    z->conf_applied = seq;
    apply_conf(z, &c);
    dispatch(z); /* a raised limit frees waiters at once */
}

apr_status_t at_zone_reconfigure(at_zone_t *z, const at_zone_conf_t *c)
{
    if (!at_zone_can_hold(z, c)) {
        return APR_EINVAL;
    }
    publish_conf(z, c);
    if (zone_trylock(z) != 0) {
        return APR_EBUSY; /* the holder, or the next one, applies it */
    }
    zone_unlock(z); /* taking the lock applied it */
    return APR_SUCCESS;
}

/* ---- reclaim ---------------------------------------------------------- */

/* The owners of a zone's records, copied under the lock in one pass (no
 * search there), then sorted and made unique outside it, so that a reclaim
 * costs the lock O(records log owners) however many records there are. */
typedef struct {
    at_owner_t *v;
    apr_uint32_t n, cap;
} owner_set_t;

static int cmp_owner(const void *a, const void *b)
{
    const at_owner_t *x = a, *y = b;

    if (x->pid != y->pid) {
        return x->pid < y->pid ? -1 : 1;
    }
    return x->start < y->start ? -1 : x->start > y->start;
}

static void owner_set_add(owner_set_t *set, const at_owner_t *o, apr_int32_t only_pid)
{
    if (o->pid != 0 && (!only_pid || o->pid == only_pid) && set->n < set->cap) {
        set->v[set->n++] = *o;
    }
}

static void owner_set_sort_unique(owner_set_t *set)
{
    apr_uint32_t i, n = 0;

    qsort(set->v, set->n, sizeof(*set->v), cmp_owner);
    for (i = 0; i < set->n; i++) {
        if (n == 0 || !at_owner_same(&set->v[n - 1], &set->v[i])) {
            set->v[n++] = set->v[i];
        }
    }
    set->n = n;
}

static int owner_set_has(const owner_set_t *set, const at_owner_t *o)
{
    return o->pid != 0 && set->n
           && bsearch(o, set->v, set->n, sizeof(*set->v), cmp_owner) != NULL;
}

static apr_uint32_t drop_dead_owners(at_zone_t *z, const owner_set_t *dead)
{
    at_slot_t *s = slots(z);
    at_waiter_t *w = waiters(z);
    apr_uint32_t i, n = 0;

    for (i = 0; i < z->nwaiters; i++) {
        if (w[i].state == W_FREE || !owner_set_has(dead, &w[i].owner)) {
            continue;
        }
        if (w[i].state == W_WAITING || w[i].state == W_LEFT) {
            waiter_leave_queue(z, (apr_int32_t)i);
        }
        else if (w[i].state == W_OVER_CAP) {
            z->over_cap--;
        }
        /* A granted place's slot has the same dead owner: freed below. */
        waiter_free(z, (apr_int32_t)i);
        n++;
    }
    for (i = 0; i < z->nslots; i++) {
        if (owner_set_has(dead, &s[i].owner)) {
            slot_put(z, (apr_int32_t)i);
            n++;
        }
    }
    z->counters.reclaimed += n;
    dispatch(z);
    return n;
}

#ifdef AT_TEST_HOOKS
apr_uint32_t at_test_reclaim_passes;
#define COUNT_RECLAIM_PASS() __atomic_add_fetch(&at_test_reclaim_passes, 1, __ATOMIC_RELAXED)
#else
#define COUNT_RECLAIM_PASS() ((void)0)
#endif

/* Liveness is read from /proc outside the lock: collect the owners under the
 * lock, test them without it, then drop the dead ones' records. only_pid:
 * the records of that process alone (its parent saw it exit), or 0. */
/* until_us: RECLAIM_TRY (the parent: only if the lock is free), or how
 * long a request may wait for the lock. */
#define RECLAIM_TRY (-1)

static int reclaim_lock(at_zone_t *z, apr_int64_t until_us)
{
    return until_us == RECLAIM_TRY ? zone_trylock(z) : zone_lock_until(z, until_us);
}

static apr_uint32_t zone_reclaim(at_zone_t *z, apr_int64_t until_us, apr_int32_t only_pid)
{
    owner_set_t all, dead;
    apr_uint32_t i, n = 0;

    all.cap = z->nslots + z->nwaiters;
    all.n = dead.n = 0;
    all.v = malloc(sizeof(at_owner_t) * (all.cap + 1));
    if (!all.v || reclaim_lock(z, until_us) != 0) {
        free(all.v);
        return 0;
    }
    COUNT_RECLAIM_PASS();
    if (!only_pid) {
        z->last_reclaim_us = at_now_us();
    }
    for (i = 0; i < z->nslots; i++) {
        owner_set_add(&all, &slots(z)[i].owner, only_pid);
    }
    for (i = 0; i < z->nwaiters; i++) {
        if (waiters(z)[i].state != W_FREE) {
            owner_set_add(&all, &waiters(z)[i].owner, only_pid);
        }
    }
    zone_unlock(z);

    owner_set_sort_unique(&all);
    /* the dead, in place at the front: still sorted */
    dead.v = all.v;
    dead.cap = all.n;
    for (i = 0; i < all.n; i++) {
        if (!at_owner_alive(&all.v[i])) {
            dead.v[dead.n++] = all.v[i];
        }
    }
    if (dead.n && reclaim_lock(z, until_us) == 0) {
        n = drop_dead_owners(z, &dead);
        zone_unlock(z);
        for (i = 0; i < dead.n; i++) {
            at_log(LOG_INFO, "zone %s: reclaimed what dead process %d held",
                 z->name, (int)dead.v[i].pid);
        }
    }
    free(all.v);
    return n;
}

/* A day: as long as it takes. */
#define NO_DEADLINE_US (86400LL * 1000000)

apr_uint32_t at_zone_reclaim(at_zone_t *z)
{
    return zone_reclaim(z, at_now_us() + NO_DEADLINE_US, 0);
}

apr_uint32_t at_zone_reclaim_nowait(at_zone_t *z)
{
    return zone_reclaim(z, RECLAIM_TRY, 0);
}

apr_uint32_t at_zone_reclaim_pid_nowait(at_zone_t *z, apr_int32_t pid)
{
    return pid > 0 ? zone_reclaim(z, RECLAIM_TRY, pid) : 0;
}

/* Lock held. A reclaim is due every AT_RECLAIM_INTERVAL_US; the caller
 * that finds it due takes it, so that waiters do not reclaim side by side. */
static int take_reclaim_if_due(at_zone_t *z, apr_int64_t now)
{
    if (now - z->last_reclaim_us < AT_RECLAIM_INTERVAL_US) {
        return 0;
    }
    z->last_reclaim_us = now;
    return 1;
}

/* ---- acquire and release --------------------------------------------- */

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

static void record_wait(at_zone_t *z, apr_int64_t us, apr_int64_t now)
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

static void record_service(at_zone_t *z, apr_int64_t us, apr_int64_t now)
{
    rotate_windows(z, now);
    at_hist_add(&z->service_all, us);
    at_hist_add(&z->service_win[z->win_cur], us);
    z->service_ewma_us = z->service_ewma_us
                             ? (z->service_ewma_us * 7 + (apr_uint64_t)us) / 8
                             : (apr_uint64_t)us;
    z->typical_service_us = at_typical_service_after(z->typical_service_us, us);
}

/* What the controller is given, for LogLevel adaptive_throttle:trace1:
 * with it, a limit that wanders can be told from one that follows noise. */
static void log_window(const at_zone_t *z, const at_window_t *w)
{
    at_log(AT_LOG_TRACE1, "zone %s: window of %.2f s at limit %u: %u done, %.1f running, "
           "service %.1f ms (+-%.1f%%), %.0f%% waiting", z->name, w->secs, z->limit,
           w->completed, w->inflight, w->service_us / 1000, 100 * w->service_rse,
           100 * w->limited);
}

/* limit=auto: the first release after a window is long enough hands the
 * window to the controller; one place, under the lock, for every process. */
static void maybe_close_window(at_zone_t *z, apr_int64_t now)
{
    at_window_t w;
    apr_uint32_t next;

    note_change(z); /* up to now */
    if (!at_sensor_window(&z->sensor, &z->ctl, z->service_ewma_us, now, &w)) {
        return;
    }
    log_window(z, &w);
    if (!at_limit_update(&z->ctl, &w)) {
        at_sensor_reset(&z->sensor, now);
        return;
    }
    next = at_limit_value(&z->ctl);
    at_log(LOG_DEBUG, "zone %s: limit %u -> %u (%.1f running, %.0f/s, %.0f%% of the "
           "window with requests waiting)", z->name, z->limit, next, w.inflight,
           w.completed / w.secs, 100 * w.limited);
    at_sensor_reset(&z->sensor, now + at_sensor_settling_us(z->limit, next, z->service_ewma_us));
    z->limit = next;
}

/* limit=auto: a newcomer whose turn would come after the timeout is told
 * at once. */
static int wait_predicted_too_long(const at_zone_t *z, int priority,
                                   apr_int64_t timeout_us)
{
    apr_uint64_t est;

    if (!z->limit_auto || !z->typical_service_us || !z->limit) {
        return 0;
    }
    est = ((apr_uint64_t)queued_ahead(z, priority) + 1) * z->typical_service_us / z->limit;
    return est > (apr_uint64_t)timeout_us;
}

static void grant_now(at_zone_t *z, at_ticket_t *t, const at_owner_t *self,
                      const at_request_t *rq, apr_int64_t now)
{
    client_add(z, rq->client);
    t->slot = slot_take(z, self, t->ticket, rq->client, now);
    at_memgate_started(&z->mem);
    t->granted_us = now;
    z->counters.admitted++;
    record_wait(z, 0, now);
    count_grant(z, rq->priority, 0, now);
}

/* Dry run: the request runs at once, over the cap. Those running over the
 * cap stand in for the queue: with the queue's room taken, it would have
 * been refused. Each holds a record while there is one free, so that a
 * process that dies running over the cap is reclaimed like any other; the
 * count is of those records. */
static at_result_t run_over_cap(at_zone_t *z, at_ticket_t *t, int would_refuse)
{
    apr_int32_t wi = z->free_waiter;
    int room = z->over_cap < z->queue_cap;

    t->over_cap = -1; /* running over the cap, on no record */
    if (wi != NONE) {
        at_waiter_t *w = &waiters(z)[wi];

        z->free_waiter = w->next;
        w->owner = *at_owner_self();
        w->ticket = t->ticket;
        w->slot = NONE;
        w->state = W_OVER_CAP;
        z->over_cap++;
        t->over_cap = wi + 1;
    }
    if (room && wi != NONE && !would_refuse) {
        z->counters.dry_run_queued++;
        return AT_DRY_RUN_QUEUED;
    }
    z->counters.dry_run_rejected++;
    return AT_DRY_RUN_REJECTED;
}

/* Lock held: gives back what run_over_cap took, unless a reclaim has. */
static void end_over_cap(at_zone_t *z, at_ticket_t *t)
{
    at_waiter_t *w;

    if (t->over_cap > 0 && (apr_uint32_t)t->over_cap <= z->nwaiters) {
        w = &waiters(z)[t->over_cap - 1];
        if (w->state == W_OVER_CAP && w->ticket == t->ticket
            && at_owner_same(&w->owner, at_owner_self())) {
            waiter_free(z, t->over_cap - 1);
            z->over_cap--;
        }
    }
    t->over_cap = 0;
}

static int client_at_quota(at_zone_t *z, const at_client_key_t *client)
{
    return z->per_client && at_client_count(&z->clients, client) >= z->per_client;
}

/* A newcomer runs at once only if nobody of its priority or higher waits:
 * a waiter of lower priority may be held back by reserve=. */
static int slot_free_for_newcomer(const at_zone_t *z, int priority)
{
    return running(z) < slots_for(z, priority) && z->free_slot != NONE &&
           (z->qhead == NONE || waiters((at_zone_t *)z)[z->qhead].priority < priority);
}

static int can_run_now(at_zone_t *z, int priority)
{
    return slot_free_for_newcomer(z, priority) && mem_allows(z);
}

/* Leave the queue without a slot, counted as refused for this reason. */
static at_result_t give_up_waiting(at_zone_t *z, apr_int32_t wi, at_result_t why,
                                   apr_int64_t now)
{
    at_waiter_t *w = &waiters(z)[wi];

    waiter_leave_queue(z, wi);
    count_refusal(z, w->priority, now, 1);
    waiter_free(z, wi);
    if (why == AT_REJECTED_STANDING) {
        z->counters.rejected_standing++;
    }
    else {
        z->counters.rejected_timeout++;
    }
    return why;
}

/* The lock could not be had in time (ETIMEDOUT), or not at all. Counted
 * without the lock, by atomic increments only. */
static at_result_t lock_refusal(at_zone_t *z, int rc)
{
    if (rc != ETIMEDOUT) {
        return AT_ERROR;
    }
    __atomic_add_fetch(&z->counters.rejected_locked, 1, __ATOMIC_RELAXED);
    return AT_REJECTED_LOCKED;
}

/* A waiter whose deadline passed while another process held the lock
 * leaves without it, by compare-and-swap on its record's state: still
 * queued (refused), granted meanwhile (it keeps the slot: the hand-off is
 * done), or evicted (refused). The next holder of the lock tidies up. */
static at_result_t leave_without_lock(at_zone_t *z, at_waiter_t *w, at_ticket_t *t,
                                      at_result_t refused)
{
    apr_int32_t keep = refused == AT_ABORTED ? W_DROP : W_TAKEN;
    apr_int32_t st = __atomic_load_n(&w->state, __ATOMIC_ACQUIRE);
    apr_int32_t to = st == W_WAITING ? W_LEFT : st == W_GRANTED ? keep : W_GONE;

    while (!__atomic_compare_exchange_n(&w->state, &st, to, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
        to = st == W_WAITING ? W_LEFT : st == W_GRANTED ? keep : W_GONE;
    }
    __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
    if (to == W_TAKEN) {
        t->slot = w->slot;
        t->granted_us = at_now_us();
        return AT_QUEUED;
    }
    if (refused != AT_ABORTED) {
        __atomic_add_fetch(&z->counters.rejected_locked, 1, __ATOMIC_RELAXED);
    }
    return refused;
}

/* A waiter sleeps without the lock until something it must act on under the
 * lock may have happened: a hand-off or eviction (its wake word moves; the
 * state is published before it), its deadline (CoDel's, read here as a
 * hint: the lock decides), a reclaim falling due, or, at the head of a queue
 * held back by memory, a slice gone by. 1 if its client has gone. */
static int wait_unlocked(at_zone_t *z, at_waiter_t *w, apr_int32_t wi, apr_uint32_t seen,
                         apr_int64_t start, apr_int64_t full_deadline,
                         at_abort_fn abort_fn, void *ctx)
{
    for (;;) {
        apr_int64_t now, deadline, slice;
        int head;

        if (abort_fn && abort_fn(ctx)) {
            return 1;
        }
        now = at_now_us();
        deadline = at_codel_deadline(&z->codel, start, full_deadline, now,
                                     __atomic_load_n(&z->typical_service_us, __ATOMIC_RELAXED));
        /* The head of the queue looks for the dead every interval, the
         * others every fourth, in case the head is the one that died. */
        head = __atomic_load_n(&z->qhead, __ATOMIC_RELAXED) == wi;
        if (now >= deadline || __atomic_load_n(&w->wake, __ATOMIC_ACQUIRE) != seen
            || __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != W_WAITING
            || now - __atomic_load_n(&z->last_reclaim_us, __ATOMIC_RELAXED)
                   >= AT_RECLAIM_INTERVAL_US * (head ? 1 : 4)) {
            return 0;
        }
        slice = deadline - now < AT_WAIT_SLICE_US ? deadline - now : AT_WAIT_SLICE_US;
        sleep_on_word(&w->wake, seen, slice);
        if (head && (z->mem.bytes || running(z) < __atomic_load_n(&z->limit, __ATOMIC_RELAXED))) {
            return 0; /* memory, or a replaced zone, made room without a release here */
        }
    }
}

static at_result_t wait_for_slot(at_zone_t *z, at_ticket_t *t, apr_int32_t wi,
                                 apr_int64_t start, apr_int64_t timeout_us,
                                 at_abort_fn abort_fn, void *ctx)
{
    at_waiter_t *w = &waiters(z)[wi];
    apr_int64_t full_deadline = start + timeout_us, deadline = full_deadline;

    for (;;) {
        apr_int64_t now;
        apr_uint32_t seen;
        int gave_up = 0, do_reclaim, rc;
        mem_read_t m;

        mem_read_before_lock(z, &m);
        if ((rc = zone_lock_until(z, full_deadline)) != 0) {
            return rc == ETIMEDOUT ? leave_without_lock(z, w, t, AT_REJECTED_LOCKED)
                                   : AT_ERROR;
        }
        mem_apply_locked(z, &m);
        now = at_now_us();
        if (z->qhead == wi) {
            dispatch(z); /* memory, or a replaced zone, frees without a release here */
        }
        if (w->state == W_GRANTED) {
            t->slot = w->slot;
            t->granted_us = now;
            z->counters.admitted++;
            record_wait(z, now - start, now);
            count_grant(z, w->priority, now - start, now);
            waiter_free(z, wi);
            unlock_after_mem(z, &m);
            return AT_QUEUED;
        }
        if (w->state == W_EVICTED) {
            count_refusal(z, w->priority, now, 1);
            at_sensor_refused(&z->sensor);
            z->counters.rejected_full++;
            waiter_free(z, wi);
            unlock_after_mem(z, &m);
            return AT_REJECTED_FULL;
        }
        deadline =
            at_codel_deadline(&z->codel, start, full_deadline, now, z->typical_service_us);
        if (now >= deadline) {
            at_result_t r = give_up_waiting(
                z, wi,
                deadline < full_deadline ? AT_REJECTED_STANDING : AT_REJECTED_TIMEOUT,
                now);
            unlock_after_mem(z, &m);
            return r;
        }
        seen = __atomic_load_n(&w->wake, __ATOMIC_SEQ_CST);
        do_reclaim = take_reclaim_if_due(z, now);
        unlock_after_mem(z, &m);

        if (do_reclaim) {
            zone_reclaim(z, full_deadline, 0);
            continue;
        }
        gave_up = wait_unlocked(z, w, wi, seen, start, full_deadline, abort_fn, ctx);
        if (gave_up) {
            if ((rc = zone_lock_until(z, full_deadline)) != 0) {
                return rc == ETIMEDOUT ? leave_without_lock(z, w, t, AT_ABORTED) : AT_ERROR;
            }
            if (w->state == W_GRANTED) {
                slot_put(z, w->slot); /* granted as the client left */
                dispatch(z);
            }
            else if (w->state == W_WAITING) {
                waiter_leave_queue(z, wi);
            }
            waiter_free(z, wi);
            z->counters.aborted++;
            zone_unlock(z);
            return AT_ABORTED;
        }
    }
}

static void ticket_clear(at_ticket_t *t, int untimed)
{
    memset(t, 0, sizeof(*t));
    t->slot = NONE;
    t->untimed = untimed;
}

at_result_t at_zone_acquire(at_zone_t *z, at_ticket_t *t, at_abort_fn abort_fn,
                            void *ctx)
{
    return at_zone_acquire_for(z, t, NULL, abort_fn, ctx);
}

at_result_t at_zone_acquire_for(at_zone_t *z, at_ticket_t *t,
                                const at_client_key_t *client,
                                at_abort_fn abort_fn, void *ctx)
{
    return at_zone_acquire_if(z, t, client, 1, abort_fn, ctx);
}

at_result_t at_zone_acquire_if(at_zone_t *z, at_ticket_t *t,
                               const at_client_key_t *client, int may_wait,
                               at_abort_fn abort_fn, void *ctx)
{
    at_request_t rq = {.client = client, .may_wait = may_wait};

    return at_zone_acquire_req(z, t, &rq, abort_fn, ctx);
}

/* Refused before waiting: counted in total, for its priority, for limit=auto
 * and for retry_after=auto (unless only the client's share was over). */
static at_result_t refuse_newcomer(at_zone_t *z, const at_request_t *rq, at_result_t why,
                                   apr_uint64_t *counter, apr_int64_t now)
{
    (*counter)++;
    count_refusal(z, rq->priority, now, why != AT_REJECTED_CLIENT);
    if (why != AT_REJECTED_CLIENT) {
        at_sensor_refused(&z->sensor);
    }
    return why;
}

static apr_int32_t enqueue(at_zone_t *z, const at_ticket_t *t, const at_request_t *rq)
{
    apr_int32_t wi = z->free_waiter;
    at_waiter_t *w = &waiters(z)[wi];

    z->free_waiter = w->next;
    w->owner = *at_owner_self();
    w->ticket = t->ticket;
    w->slot = NONE;
    w->client = *rq->client;
    w->priority = rq->priority;
    w->state = W_WAITING;
    queue_push(z, wi);
    client_add(z, rq->client);
    z->counters.queued_total++;
    return wi;
}

/* A full queue makes room for a request of higher priority than its
 * lowest: the newest waiter of the lowest priority is refused (it wakes to
 * AT_REJECTED_FULL). A spare record must be there for the newcomer. */
static int evict_for(at_zone_t *z, int priority)
{
    at_waiter_t *w = waiters(z);
    apr_int32_t i = z->qtail;

    if (i == NONE || w[i].priority >= priority || z->free_waiter == NONE) {
        return 0;
    }
    waiter_leave_queue(z, i);
    if (leave_waiting(&w[i], W_EVICTED)) {
        wake_word(&w[i].wake);
    }
    return 1;
}

/* Priorities outside the range are taken as its nearest end. */
static void fill_request_defaults(at_request_t *rq, const at_zone_t *z)
{
    static const at_client_key_t nobody;

    if (!rq->client) {
        rq->client = &nobody;
    }
    rq->priority = rq->priority < AT_PRIORITY_MIN   ? AT_PRIORITY_MIN
                   : rq->priority > AT_PRIORITY_MAX ? AT_PRIORITY_MAX
                                                    : rq->priority;
    if (rq->timeout_us <= 0) {
        rq->timeout_us = z->timeout_us;
    }
}

at_result_t at_zone_acquire_req(at_zone_t *z, at_ticket_t *t, const at_request_t *req,
                                at_abort_fn abort_fn, void *ctx)
{
    apr_int64_t start = at_now_us();
    at_request_t rq = *req;
    apr_int32_t wi;
    at_result_t r;
    mem_read_t m;
    int rc;

    ticket_clear(t, 0);
    fill_request_defaults(&rq, z); /* reads the zone's timeout without the lock */
    mem_read_before_lock(z, &m);
    if ((rc = zone_lock_until(z, start + rq.timeout_us)) != 0) {
        t->wait_us = at_now_us() - start;
        return lock_refusal(z, rc);
    }
    mem_apply_locked(z, &m);
    t->ticket = ++z->next_ticket;
    t->queue_depth = queued_ahead(z, rq.priority);
    if (!slot_free_for_newcomer(z, rq.priority) && z->active >= z->limit &&
        take_reclaim_if_due(z, start)) {
        unlock_after_mem(z, &m);
        zone_reclaim(z, start + rq.timeout_us, 0); /* a full zone may be full of the dead */
        if ((rc = zone_lock_until(z, start + rq.timeout_us)) != 0) {
            t->wait_us = at_now_us() - start;
            return lock_refusal(z, rc);
        }
    }
    if (client_at_quota(z, rq.client)) {
        r = z->dry_run ? run_over_cap(z, t, 1) /* the client was over its share */
                       : refuse_newcomer(z, &rq, AT_REJECTED_CLIENT,
                                         &z->counters.rejected_client, start);
        unlock_after_mem(z, &m);
        return r;
    }
    if (can_run_now(z, rq.priority)) {
        grant_now(z, t, at_owner_self(), &rq, start);
        unlock_after_mem(z, &m);
        return AT_ADMITTED;
    }
    if (slot_free_for_newcomer(z, rq.priority)) {
        z->mem.held++; /* only memory stood in the way */
    }
    if (z->dry_run) {
        r = run_over_cap(z, t, 0);
    }
    else if ((z->queued >= z->queue_cap && !evict_for(z, rq.priority)) ||
             z->free_waiter == NONE) {
        r = refuse_newcomer(z, &rq, AT_REJECTED_FULL, &z->counters.rejected_full, start);
    }
    else if (!rq.may_wait) {
        r = refuse_newcomer(z, &rq, AT_REJECTED_WORKERS, &z->counters.rejected_workers,
                            start);
    }
    else if (wait_predicted_too_long(z, rq.priority, rq.timeout_us)) {
        r = refuse_newcomer(z, &rq, AT_REJECTED_PREDICTED,
                            &z->counters.rejected_predicted, start);
    }
    else {
        wi = enqueue(z, t, &rq);
        unlock_after_mem(z, &m);
        r = wait_for_slot(z, t, wi, start, rq.timeout_us, abort_fn, ctx);
        t->wait_us = at_now_us() - start;
        return r;
    }
    unlock_after_mem(z, &m);
    return r;
}

/* limit=auto: a completed request counts in the current window. */
static void window_add_completion(at_zone_t *z, apr_int64_t service, apr_int64_t now)
{
    if (z->limit_auto) {
        at_sensor_completed(&z->sensor, service, now);
        maybe_close_window(z, now);
    }
}

at_result_t at_zone_acquire_now(at_zone_t *z, at_ticket_t *t)
{
    static const at_client_key_t nobody;
    apr_int64_t now = at_now_us();
    at_result_t r = AT_REJECTED_FULL;
    int rc;

    ticket_clear(t, 1);
    if ((rc = zone_lock_until(z, now + AT_GLANCE_LOCK_US)) != 0) {
        return lock_refusal(z, rc);
    }
    t->ticket = ++z->next_ticket;
    if (can_run_now(z, 0)) {
        t->slot = slot_take(z, at_owner_self(), t->ticket, &nobody, now);
        at_memgate_started(&z->mem);
        t->granted_us = now;
        r = AT_ADMITTED;
    }
    else if (z->dry_run) {
        r = AT_DRY_RUN_REJECTED; /* a dry run never refuses */
    }
    zone_unlock(z);
    return r;
}

/* A request that is done waits for the lock a moment at most: a holder
 * stopped or hung must not keep it, its worker and its client's
 * connection. Past that its slot is marked let go, and the next holder
 * frees it (its service time is not counted). 0 if the lock is held. */
static int release_lock(at_zone_t *z, at_ticket_t *t)
{
    int rc = zone_lock_until(z, at_now_us() + AT_RELEASE_LOCK_US);

    if (rc == ETIMEDOUT) {
        at_slot_t *s = &slots(z)[t->slot];

        if (__atomic_load_n(&s->ticket, __ATOMIC_ACQUIRE) == t->ticket) {
            __atomic_store_n(&s->released, 1, __ATOMIC_RELEASE);
            __atomic_add_fetch(&z->left, 1, __ATOMIC_RELEASE);
        }
        t->slot = NONE;
    }
    return rc;
}

apr_int64_t at_zone_release(at_zone_t *z, at_ticket_t *t)
{
    apr_int64_t service = -1, now;
    at_slot_t *s;
    mem_read_t m;

    if (t->slot == NONE && !t->over_cap) {
        return -1;
    }
    mem_read_before_lock(z, &m);
    if (t->over_cap ? zone_lock(z) != 0 : release_lock(z, t) != 0) {
        return -1;
    }
    mem_apply_locked(z, &m);
    if (t->over_cap) {
        end_over_cap(z, t);
        unlock_after_mem(z, &m);
        return -1;
    }
    s = &slots(z)[t->slot];
    /* The ticket tells our grant from a later one after a reclaim. */
    if (s->owner.pid != 0 && s->ticket == t->ticket) {
        now = at_now_us();
        service = now - t->granted_us;
        if (service < 0) {
            service = 0;
        }
        slot_put(z, t->slot);
        if (!t->untimed) { /* an error page's time is not the zone's work */
            record_service(z, service, now);
            window_add_completion(z, service, now);
        }
        dispatch(z);
    }
    unlock_after_mem(z, &m);
    t->slot = NONE;
    return service;
}

/* ---- reading ------------------------------------------------------------ */

void at_zone_glance(at_zone_t *z, at_zone_glance_t *g)
{
    g->limit = apr_atomic_read32(&z->limit);
    g->active = apr_atomic_read32(&z->active);
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
#define AT_COUNTER_COPY(field, ...) o->counters.field = __atomic_load_n(&z->counters.field, __ATOMIC_RELAXED);
    AT_ZONE_COUNTERS(AT_COUNTER_COPY)
#undef AT_COUNTER_COPY
}

void at_zone_stats(at_zone_t *z, at_zone_stats_t *o)
{
    apr_int64_t now = at_now_us(), oldest = 0;
    apr_uint32_t i;
    mem_read_t m;

    memset(o, 0, sizeof(*o));
    mem_read_before_lock(z, &m); /* a reading no older than a request would use */
    if (zone_lock_until(z, now + AT_GLANCE_LOCK_US) != 0) {
        stats_without_lock(z, o);
        return;
    }
    mem_apply_locked(z, &m);
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
    o->per_client = z->per_client;
    o->clients = z->per_client ? at_client_in(&z->clients) : 0;
    o->service_ewma_us = z->service_ewma_us;
    o->wait_all = z->wait_all;
    o->service_all = z->service_all;
    rotate_windows(z, now);
    o->wait_recent = z->wait_win[0];
    at_hist_merge(&o->wait_recent, &z->wait_win[1]);
    o->service_recent = z->service_win[0];
    at_hist_merge(&o->service_recent, &z->service_win[1]);
    for (i = 0; i < z->nslots; i++) {
        at_slot_t *s = &slots(z)[i];
        if (s->owner.pid != 0 && now - s->since_us >= oldest) {
            oldest = now - s->since_us;
            o->oldest_pid = s->owner.pid;
        }
    }
    o->oldest_us = oldest;
    if (z->mem.bytes) {
        o->mem_bytes = z->mem.bytes;
        o->mem_avail = z->mem.avail;
        o->mem_source = (int)z->mem.source;
        o->mem_pending = z->mem.pending;
        o->mem_read_age_us = now - z->mem.read_us;
    }
    o->mem_held = z->mem.held;
    o->mem_read_errors = z->mem.read_errors;
    zone_unlock(z);
    mem_warn_after_unlock(z, &m);
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
    static __thread apr_uint64_t x;

    if (!x) {
        x = ((apr_uint64_t)getpid() << 32) ^ (apr_uint64_t)at_now_us() ^
            (apr_uint64_t)(apr_uintptr_t)&x;
        x |= 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (double)(x >> 11) / (double)(APR_UINT64_C(1) << 53);
}

apr_uint32_t at_zone_retry_after(at_zone_t *z)
{
    if (z->retry_after != AT_RETRY_AFTER_AUTO) {
        return z->retry_after;
    }
    /* Read without the lock: an estimate either way. */
    return at_retry_advice(&z->retry, retry_floor(z), retry_ceiling(z), spread());
}

#ifdef AT_TEST_HOOKS
apr_status_t at_zone_debug_take_lock(at_zone_t *z)
{
    return zone_lock(z) == 0 ? APR_SUCCESS : APR_EGENERAL;
}

void at_zone_debug_release_lock(at_zone_t *z)
{
    zone_unlock(z);
}

apr_status_t at_zone_debug_break_lock(at_zone_t *z)
{
    pid_t pid = fork();
    int status;

    if (pid < 0) {
        return APR_EGENERAL;
    }
    if (pid == 0) {
        pthread_mutex_lock(&z->lock); /* and die holding it */
        _exit(0);
    }
    waitpid(pid, &status, 0);
    if (pthread_mutex_lock(&z->lock) != EOWNERDEAD) {
        return APR_EGENERAL;
    }
    /* Unlocked without being made consistent: unusable for good. */
    pthread_mutex_unlock(&z->lock);
    return APR_SUCCESS;
}
#endif
