/*
 * The core's one random mixer and source (splitmix64): child lifetimes,
 * the spread of Retry-After, the per-client table's seed and positions.
 * Never touches rand()'s state.
 */
#ifndef AT_RNG_H
#define AT_RNG_H

#include <apr.h>

/* 2^64 divided by the golden ratio, odd: splitmix64's step, and the
 * multiplier of Fibonacci hashing. */
#define AT_GOLDEN64 APR_UINT64_C(0x9e3779b97f4a7c15)

/* splitmix64's finalizer: every bit of x moves about half the bits of the
 * result. Inline: the per-client table mixes on every lookup. */
static inline apr_uint64_t at_mix64(apr_uint64_t x)
{
    x ^= x >> 30;
    x *= APR_UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= APR_UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* A private random source. */
typedef struct {
    apr_uint64_t s;
} at_rng_t;

/* From the system's random source, mixed with the pid and the time. */
void at_rng_seed(at_rng_t *r);
void at_rng_seed_with(at_rng_t *r, apr_uint64_t seed);
apr_uint64_t at_rng_next(at_rng_t *r);
double at_rng_unit(at_rng_t *r); /* uniform in [0, 1) */

/* Uniform in [min, max], both included, without modulo bias. */
apr_uint32_t at_rng_uniform(at_rng_t *r, apr_uint32_t min, apr_uint32_t max);

#endif
