/*
 * Child lifetimes: drawing, spreading, and the shared record of children
 * and retirements.
 */
#include "at_life.h"
#include "at_layout.h"

#include <string.h>

#include "at_clock.h"

#define GOLDEN 0.6180339887498949

#define LIFE_MAGIC 0x41544c31u /* "ATL1" */

struct at_life {
    apr_uint32_t magic;
    apr_uint32_t reserved0;
    apr_uint64_t layout;         /* life_layout() of the build that laid it */
    apr_uint64_t next_k;         /* children started so far */
    double offset;               /* where the sequence starts, in [0, 1) */
    apr_int64_t last_retire_us;
    apr_uint32_t nchildren;
    apr_uint32_t reserved;
    at_child_t child[1];         /* nchildren records */
};

apr_uint32_t at_life_draw(double offset, apr_uint64_t k, double jitter01,
                          apr_uint32_t nchildren, apr_uint32_t min,
                          apr_uint32_t max)
{
    apr_uint64_t span = (apr_uint64_t)max - min + 1;
    double u, jitter;
    apr_uint64_t v;

    if (max <= min) {
        return min;
    }
    jitter = (jitter01 - 0.5) * 0.2 / (nchildren ? nchildren : 1);
    u = offset + (double)(k % APR_UINT64_C(1000000007)) * GOLDEN + jitter;
    u -= (double)(apr_int64_t)u;
    if (u < 0) {
        u += 1.0;
    }
    v = (apr_uint64_t)(u * (double)span);
    return (apr_uint32_t)(min + (v >= span ? span - 1 : v));
}

int at_life_should_defer(apr_int64_t now_us, apr_int64_t last_retire_us,
                         apr_int64_t window_us)
{
    return last_retire_us != 0 && now_us - last_retire_us < window_us
           && now_us >= last_retire_us;
}

apr_size_t at_life_size(apr_uint32_t nchildren)
{
    return sizeof(at_life_t) + (nchildren ? nchildren - 1 : 0) * sizeof(at_child_t);
}

static const at_field_t child_fields[] = {
    AT_FIELD(at_child_t, owner),      AT_FIELD(at_child_t, lifetime),
    AT_FIELD(at_child_t, served),     AT_FIELD(at_child_t, extensions),
    AT_FIELD(at_child_t, reserved),   AT_FIELD(at_child_t, started_us)};

static const at_field_t life_fields[] = {
    AT_FIELD(at_life_t, magic),     AT_FIELD(at_life_t, reserved0),
    AT_FIELD(at_life_t, layout),    AT_FIELD(at_life_t, next_k),
    AT_FIELD(at_life_t, offset),    AT_FIELD(at_life_t, last_retire_us),
    AT_FIELD(at_life_t, nchildren), AT_FIELD(at_life_t, reserved),
    AT_FIELD(at_life_t, child)};

static const at_record_t life_records[] = {
    AT_RECORD(at_life_t, life_fields), AT_RECORD(at_child_t, child_fields)};

const at_record_t *at_life_layout_records(apr_size_t *n)
{
    *n = sizeof(life_records) / sizeof(life_records[0]);
    return life_records;
}

static apr_uint64_t life_layout(void)
{
    apr_size_t n, m;
    const at_record_t *common = at_layout_common(&n), *own = at_life_layout_records(&m);

    return at_layout_fold(at_layout_fold(0, common, n), own, m);
}

void at_life_init(at_life_t *l, apr_uint32_t nchildren, apr_uint64_t seed)
{
    at_rng_t r;

    memset(l, 0, at_life_size(nchildren));
    at_rng_seed_with(&r, seed);
    l->offset = at_rng_unit(&r);
    l->nchildren = nchildren;
    l->layout = life_layout();
    l->magic = LIFE_MAGIC;
}

int at_life_can_hold(const at_life_t *l, apr_uint32_t nchildren)
{
    return l->magic == LIFE_MAGIC && l->layout == life_layout() && l->nchildren >= nchildren;
}

/* Records are claimed with compare-and-swap on the pid, so no lock is held
 * that a dying child could leave behind. */
#ifdef AT_TEST_HOOKS
void (*at_test_life_claim_hook)(void);
#define CLAIM_STEP() (at_test_life_claim_hook ? at_test_life_claim_hook() : (void)0)
#else
#define CLAIM_STEP() ((void)0)
#endif

/* Is the record's owner, as one load of its pid saw it, still running? A
 * negative pid is a claim under way by that process: its start time is not
 * written yet, so it is judged by the pid alone. */
static int record_owner_alive(const at_child_t *c, apr_int32_t pid)
{
    at_owner_t seen;

    seen.pid = pid < 0 ? -pid : pid;
    seen.reserved = 0;
    seen.start = pid < 0 ? 0 : __atomic_load_n(&c->owner.start, __ATOMIC_ACQUIRE);
    return at_owner_alive(&seen);
}

/* A record is taken in two steps: its pid goes to minus the claimer's pid
 * (by compare-and-swap from what was judged dead or free), then the start
 * time is written, then the pid. Another claimer never pairs a new pid with
 * the start time of the record's last owner, so two children cannot both
 * judge the other dead and share a record. */
static at_child_t *claim_record(at_life_t *l)
{
    const at_owner_t *self = at_owner_self();
    apr_uint32_t i;

    for (i = 0; i < l->nchildren; i++) {
        at_child_t *c = &l->child[i];
        apr_int32_t pid = __atomic_load_n(&c->owner.pid, __ATOMIC_ACQUIRE);

        if (pid != 0 && record_owner_alive(c, pid)) {
            continue;
        }
        if (__atomic_compare_exchange_n(&c->owner.pid, &pid, -self->pid, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            CLAIM_STEP();
            __atomic_store_n(&c->owner.start, self->start, __ATOMIC_RELEASE);
            __atomic_store_n(&c->owner.pid, self->pid, __ATOMIC_RELEASE);
            return c;
        }
    }
    return NULL;
}

at_child_t *at_life_enter(at_life_t *l, apr_uint32_t min, apr_uint32_t max,
                          at_rng_t *rng, apr_uint32_t *lifetime)
{
    apr_uint64_t k = __atomic_fetch_add(&l->next_k, 1, __ATOMIC_ACQ_REL);
    at_child_t *c;

    *lifetime = at_life_draw(l->offset, k, at_rng_unit(rng), l->nchildren, min, max);
    c = claim_record(l);
    if (c) {
        c->lifetime = *lifetime;
        c->served = 0;
        c->extensions = 0;
        c->started_us = at_now_us();
    }
    return c;
}

int at_life_claim_retirement(at_life_t *l, apr_int64_t window_us)
{
    apr_int64_t now = at_now_us();
    apr_int64_t last = __atomic_load_n(&l->last_retire_us, __ATOMIC_ACQUIRE);

    do {
        if (at_life_should_defer(now, last, window_us)) {
            return 0;
        }
    } while (!__atomic_compare_exchange_n(&l->last_retire_us, &last, now, 0,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    return 1;
}

apr_uint32_t at_life_capacity(const at_life_t *l)
{
    return l->nchildren;
}

const at_child_t *at_life_child(const at_life_t *l, apr_uint32_t i)
{
    return i < l->nchildren ? &l->child[i] : NULL;
}
