/*
 * retry_after=auto: the advice follows the refusals it causes.
 */
#include "at_retry.h"

static apr_uint64_t clamp_u64(apr_uint64_t v, apr_uint64_t lo, apr_uint64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The next mean advice from one window's refusals and grants. */
static apr_uint64_t next_advice_ms(apr_uint64_t mean, apr_uint32_t refused,
                                   apr_uint32_t granted)
{
    if (!refused) {
        return mean / 2;
    }
    if (!granted) {
        return mean * 2; /* refusing, and no room freed at all */
    }
    return clamp_u64(mean * refused / granted, mean / 2, mean * 2);
}

/* A window lasts as long as the advice in force, at least
 * AT_RETRY_WINDOW_MIN_US. */
static apr_int64_t window_us(const at_retry_t *r)
{
    apr_int64_t us = (apr_int64_t)r->advice_ms * 1000;

    return us < AT_RETRY_WINDOW_MIN_US ? AT_RETRY_WINDOW_MIN_US : us;
}

int at_retry_due(const at_retry_t *r, apr_int64_t now)
{
    return now - r->window_start_us >= window_us(r);
}

void at_retry_close(at_retry_t *r, apr_int64_t now, apr_uint32_t floor_s,
                    apr_uint32_t ceiling_s)
{
    apr_uint64_t floor_ms = (apr_uint64_t)floor_s * 1000, ceiling_ms = (apr_uint64_t)ceiling_s * 1000;
    apr_uint64_t mean = r->advice_ms > floor_ms ? r->advice_ms : floor_ms, next;
    apr_int64_t age = now - r->window_start_us;

    next = age >= AT_RETRY_STALE_WINDOWS * window_us(r)
               ? 0
               : next_advice_ms(mean, r->refused, r->granted);
    next = clamp_u64(next, floor_ms, ceiling_ms > floor_ms ? ceiling_ms : floor_ms);
    r->advice_ms = next > floor_ms ? (apr_uint32_t)next : 0;
    r->refused = r->granted = 0;
    r->window_start_us = now;
}

apr_uint32_t at_retry_advice(const at_retry_t *r, apr_uint32_t floor_s,
                             apr_uint32_t ceiling_s, double u)
{
    apr_uint32_t mean_ms = __atomic_load_n(&r->advice_ms, __ATOMIC_RELAXED);
    double secs;

    if (mean_ms <= (apr_uint64_t)floor_s * 1000) {
        return floor_s < 1 ? 1 : floor_s > ceiling_s ? ceiling_s : floor_s;
    }
    secs = mean_ms * (0.5 + u) / 1000.0 + 0.5;
    return secs < 1 ? 1 : secs > ceiling_s ? ceiling_s : (apr_uint32_t)secs;
}
