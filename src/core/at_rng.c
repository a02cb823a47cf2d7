/*
 * The core's random source: splitmix64 (at_rng.h).
 */
#include "at_rng.h"
#include "at_clock.h"

#include <apr_general.h>
#include <unistd.h>

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
    return at_mix64(r->s += AT_GOLDEN64);
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
