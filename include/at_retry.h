/*
 * retry_after=auto: advice that schedules the return of refused clients.
 *
 * A refused client that honours Retry-After sleeps for the advice and comes
 * back. If the zone refused r requests a second and told each to wait R
 * seconds, about r * R clients are away (Little's law) and come back at
 * r a second. The zone frees room for g requests a second (its grants), so
 * the advice that brings them back at about that rate is R * r / g. Each
 * window the advice moves by that factor, at most doubling or halving, and
 * stays between the time the queue takes to drain (the floor) and the
 * zone's ceiling. A window lasts at least as long as the advice, so each
 * step sees the effect of the one before. Each answer is spread over
 * [R/2, 3R/2] so that returns do not arrive together.
 */
#ifndef AT_RETRY_H
#define AT_RETRY_H

#include <apr.h>

/* A window lasts at least this long (and at least the advice). */
#define AT_RETRY_WINDOW_MIN_US 1000000
/* A window this many times longer than needed saw no traffic worth
 * judging: the advice starts again from the floor. */
#define AT_RETRY_STALE_WINDOWS 4

typedef struct {
    apr_int64_t window_start_us;
    apr_uint32_t refused, granted; /* in the current window */
    apr_uint32_t advice_ms;        /* the mean advice; 0: the floor */
    apr_uint32_t pad;
} at_retry_t;

/* Before counting a refusal or a grant at now (lock held): whether the
 * window is over and must be judged with at_retry_close. Cheap: the floor
 * is needed only when it is. */
int at_retry_due(const at_retry_t *r, apr_int64_t now);
void at_retry_close(at_retry_t *r, apr_int64_t now, apr_uint32_t floor_s,
                    apr_uint32_t ceiling_s);

/* The seconds to tell one refused client: the mean advice (at least
 * floor_s) spread by u, uniform in [0, 1), within [1, ceiling_s]. Reads one
 * word: callable without the lock. */
apr_uint32_t at_retry_advice(const at_retry_t *r, apr_uint32_t floor_s,
                             apr_uint32_t ceiling_s, double u);

#endif
