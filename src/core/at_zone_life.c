/*
 * A zone's life: its layout (checked, so that a zone kept across a restart
 * onto another build is laid anew), its size, laying it, keeping it across
 * restarts, the zone it replaced, and a new definition published without
 * the lock for the next holder to apply.
 */
#include "at_zone_impl.h"
#include "at_layout.h"
#include "at_tuning.h"

#include <apr_atomic.h>
#include <errno.h>
#include <apr_strings.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

/* ---- the layout, for zones kept across restarts ------------------------ */

static const at_field_t slot_fields[] = {
    AT_FIELD(at_slot_t, owner),     AT_FIELD(at_slot_t, ticket), AT_FIELD(at_slot_t, since_us),
    AT_FIELD(at_slot_t, next_free), AT_FIELD(at_slot_t, released), AT_FIELD(at_slot_t, client),
    AT_FIELD(at_slot_t, client_pad)};

static const at_field_t waiter_fields[] = {
    AT_FIELD(at_waiter_t, owner), AT_FIELD(at_waiter_t, ticket),   AT_FIELD(at_waiter_t, wake),
    AT_FIELD(at_waiter_t, state), AT_FIELD(at_waiter_t, slot),     AT_FIELD(at_waiter_t, prev),
    AT_FIELD(at_waiter_t, next),  AT_FIELD(at_waiter_t, priority), AT_FIELD(at_waiter_t, client),
    AT_FIELD(at_waiter_t, client_pad), AT_FIELD(at_waiter_t, rewoken)};

static const at_field_t body_fields[] = {
    AT_FIELD(at_body_t, owner), AT_FIELD(at_body_t, bytes), AT_FIELD(at_body_t, next),
    AT_FIELD(at_body_t, released)};

static const at_field_t prio_fields[] = {
    AT_FIELD(at_priority_totals_t, admitted), AT_FIELD(at_priority_totals_t, rejected),
    AT_FIELD(at_priority_totals_t, wait)};

static const at_field_t zone_fields[] = {
    AT_FIELD(at_zone_t, magic),        AT_FIELD(at_zone_t, nslots),
    AT_FIELD(at_zone_t, nwaiters),     AT_FIELD(at_zone_t, keyed),
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
    AT_FIELD(at_zone_t, win_cur),      AT_FIELD(at_zone_t, order),
    AT_FIELD(at_zone_t, slots_off),
    AT_FIELD(at_zone_t, waiters_off),  AT_FIELD(at_zone_t, clients),
    AT_FIELD(at_zone_t, limit_auto),   AT_FIELD(at_zone_t, pad2),
    AT_FIELD(at_zone_t, ctl),
    AT_FIELD(at_zone_t, sensor),       AT_FIELD(at_zone_t, mem),
    AT_FIELD(at_zone_t, conf_seq),     AT_FIELD(at_zone_t, conf_applied),
    AT_FIELD(at_zone_t, conf_writer),
    AT_FIELD(at_zone_t, conf_pending), AT_FIELD(at_zone_t, left),
    AT_FIELD(at_zone_t, watcher),         AT_FIELD(at_zone_t, predecessor),
    AT_FIELD(at_zone_t, late_tried_us), AT_FIELD(at_zone_t, replaced),
    AT_FIELD(at_zone_t, held_at_unlock),
    AT_FIELD(at_zone_t, rate_conf),    AT_FIELD(at_zone_t, rate_by_key),
    AT_FIELD(at_zone_t, pad4),         AT_FIELD(at_zone_t, rate),
    AT_FIELD(at_zone_t, body_cap),     AT_FIELD(at_zone_t, body_held),
    AT_FIELD(at_zone_t, free_body),    AT_FIELD(at_zone_t, pad5),
    AT_FIELD(at_zone_t, body)};

static const at_record_t zone_records[] = {
    AT_RECORD(at_zone_t, zone_fields), AT_RECORD(at_slot_t, slot_fields),
    AT_RECORD(at_waiter_t, waiter_fields), AT_RECORD(at_priority_totals_t, prio_fields),
    AT_RECORD(at_body_t, body_fields)};

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

static apr_size_t size_before_rate(apr_uint32_t nslots, apr_uint32_t nwaiters)
{
    return ALIGN64(sizeof(at_zone_t)) + ALIGN64(nslots * sizeof(at_slot_t))
           + ALIGN64(waiter_records(nslots, nwaiters) * sizeof(at_waiter_t))
           + ALIGN64(client_entries(nslots, nwaiters) * sizeof(at_client_entry_t));
}

apr_size_t at_zone_size(apr_uint32_t nslots, apr_uint32_t nwaiters, apr_uint32_t rate_keys)
{
    return size_before_rate(nslots, nwaiters) + rate_keys * sizeof(at_rate_entry_t);
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
    apr_uint32_t per = c->per_client ? c->per_client : c->per_key;
    int recount = per && !z->per_client;

    z->per_client = per;
    z->keyed = c->per_key != 0;
    if (recount) {
        zone_recount_clients(z); /* counts lapse while the limit is off */
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
    z->order = c->order;
    z->codel.interval_us = c->codel_interval_us;
    z->rate_conf = c->rate;
    z->rate_by_key = c->keyed && c->rate.interval_ns;
    z->body_cap = c->read_body_total;
}

apr_status_t at_zone_init(void *mem, apr_size_t size, const char *name,
                          const at_zone_conf_t *c, apr_uint32_t nslots,
                          apr_uint32_t nwaiters)
{
    at_zone_t *z = mem;
    apr_uint32_t rate_keys = at_rate_keys_for(&c->rate, (int)c->keyed);
    pthread_mutexattr_t attr;
    int rc;

    if (nslots < at_conf_highest_limit(c) || nwaiters < c->queue
        || size < at_zone_size(nslots, nwaiters, rate_keys)) {
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
    at_rate_table_init(&z->rate,
                       (at_rate_entry_t *)((char *)z + size_before_rate(nslots, nwaiters)),
                       rate_keys);
    apply_conf(z, c);
    apr_cpystrn(z->name, name, sizeof(z->name));

    if ((rc = pthread_mutexattr_init(&attr)) != 0
        || (rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)) != 0
        || (rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)) != 0
        || (rc = pthread_mutex_init(&z->lock, &attr)) != 0) {
        return rc;
    }
    pthread_mutexattr_destroy(&attr);

    zone_rebuild_free_slots(z);
    z->free_waiter = NONE;
    z->qhead = z->qtail = z->watcher = NONE;
    for (apr_int32_t i = (apr_int32_t)z->nwaiters - 1; i >= 0; i--) {
        zone_waiter_link_free(z, i); /* zeroed: W_FREE */
    }
    zone_body_recount(z);
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
           && waiter_records(z->nslots, c->queue) <= z->nwaiters
           && at_rate_keys_for(&c->rate, (int)c->keyed) <= z->rate.n;
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

int at_zone_idle(const at_zone_t *z)
{
    /* held_at_unlock too: a hand-off shows active and queued at 0 for a
     * moment under the lock */
    return !__atomic_load_n(&z->active, __ATOMIC_ACQUIRE)
           && !__atomic_load_n(&z->queued, __ATOMIC_ACQUIRE)
           && !__atomic_load_n(&z->held_at_unlock, __ATOMIC_ACQUIRE)
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

/* Readers check the sequence around their copy (a seqlock). Writers are
 * several (the parent at a restart and at its checks, the cluster's sync
 * process): one owns the sequence while it is odd, taken by compare and
 * swap, and the others wait for its copy. One left odd for
 * AT_PUBLISH_WAIT_US is taken over only if its writer died in the copy;
 * a writer alive but stopped or slow keeps it, and the others give up
 * (EAGAIN) and publish at their next turn. */
static int publish_begin(at_zone_t *z, apr_uint32_t *mine)
{
    apr_int64_t give_up = 0;

    for (;;) {
        apr_uint32_t seq = __atomic_load_n(&z->conf_seq, __ATOMIC_ACQUIRE);

        if (seq & 1) {
            apr_int64_t now = at_now_us();
            at_owner_t writer;

            if (!give_up) {
                give_up = now + AT_PUBLISH_WAIT_US;
            }
            if (now < give_up) {
                sched_yield();
                continue;
            }
            writer = z->conf_writer;
            if (writer.pid != 0 && at_owner_alive(&writer)) {
                return EAGAIN;
            }
        }
        *mine = seq & 1 ? seq + 2 : seq + 1;
        if (__atomic_compare_exchange_n(&z->conf_seq, &seq, *mine, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            z->conf_writer = *at_owner_self();
            return 0;
        }
    }
}

int zone_publish_conf(at_zone_t *z, const at_zone_conf_t *c)
{
    apr_uint32_t mine;

    if (publish_begin(z, &mine) != 0) {
        return EAGAIN;
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(&z->conf_pending, c, sizeof(*c));
    /* only the owner ends its turn: a writer taken over (thought dead)
     * leaves the sequence to the one that took it */
    if (!__atomic_compare_exchange_n(&z->conf_seq, &mine, mine + 1, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED)) {
        return EAGAIN;
    }
    return 0;
}

/* Lock held: a definition published since the last one applied takes
 * effect now. One caught being written is taken by a later holder. */
void zone_apply_published_conf(at_zone_t *z)
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
    zone_dispatch(z); /* a raised limit frees waiters at once */
}
