/*
 * Child lifetimes: drawing, spreading, and the shared record of children
 * and retirements.
 */
#include "at_life.h"

#include <apr_general.h>
#include <string.h>
#include <unistd.h>

#include "at_clock.h"

#define GOLDEN 0.6180339887498949

struct at_life {
    apr_uint64_t next_k;         /* children started so far */
    double offset;               /* where the sequence starts, in [0, 1) */
    apr_int64_t last_retire_us;
    apr_uint32_t nchildren;
    apr_uint32_t reserved;
    at_child_t child[1];         /* nchildren records */
};

void at_rng_seed_with(at_rng_t *r, apr_uint64_t seed)
{
    r->s = seed;
}

void at_rng_seed(at_rng_t *r)
{
    apr_uint64_t seed = 0;

    if (apr_generate_random_bytes((unsigned char *)&seed, sizeof(seed)) != APR_SUCCESS) {
        seed = 0;
    }
    /* Mixed with pid and time so that forked children never share a seed
     * even where the system random source fails. */
    seed ^= (apr_uint64_t)getpid() << 32;
    seed ^= (apr_uint64_t)at_now_us();
    r->s = seed;
}

apr_uint64_t at_rng_next(at_rng_t *r)
{
    apr_uint64_t z = (r->s += APR_UINT64_C(0x9e3779b97f4a7c15));

    z = (z ^ (z >> 30)) * APR_UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * APR_UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

double at_rng_unit(at_rng_t *r)
{
    return (double)(at_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

apr_uint32_t at_rng_uniform(at_rng_t *r, apr_uint32_t min, apr_uint32_t max)
{
    apr_uint64_t span = (apr_uint64_t)max - min + 1;
    apr_uint64_t limit = APR_UINT64_MAX - (APR_UINT64_MAX % span);
    apr_uint64_t x;

    if (max <= min) {
        return min;
    }
    do {
        x = at_rng_next(r); /* reject the uneven tail: no modulo bias */
    } while (x >= limit);
    return (apr_uint32_t)(min + x % span);
}

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

void at_life_init(at_life_t *l, apr_uint32_t nchildren, apr_uint64_t seed)
{
    at_rng_t r;

    memset(l, 0, at_life_size(nchildren));
    at_rng_seed_with(&r, seed);
    l->offset = at_rng_unit(&r);
    l->nchildren = nchildren;
}

/* Records are claimed with compare-and-swap on the pid, so no lock is held
 * that a dying child could leave behind. */
static at_child_t *claim_record(at_life_t *l)
{
    const at_owner_t *self = at_owner_self();
    apr_uint32_t i;

    for (i = 0; i < l->nchildren; i++) {
        at_child_t *c = &l->child[i];
        apr_int32_t pid = __atomic_load_n(&c->owner.pid, __ATOMIC_ACQUIRE);
        at_owner_t seen;

        if (pid != 0) {
            seen.pid = pid;
            seen.reserved = 0;
            seen.start = c->owner.start;
            if (at_owner_alive(&seen)) {
                continue;
            }
        }
        if (__atomic_compare_exchange_n(&c->owner.pid, &pid, self->pid, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            c->owner.start = self->start;
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
