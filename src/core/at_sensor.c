/*
 * limit=auto: the zone's windows of measurement.
 */
#include "at_sensor.h"
#include "at_tuning.h"

#include <math.h>

void at_sensor_reset(at_sensor_t *s, apr_int64_t start_us)
{
    s->start_us = s->last_us = start_us;
    s->active_us = s->waited_us = 0;
    s->service_us = s->service_max_us = s->service_sq_us = 0;
    s->completed = s->refused = 0;
}

void at_sensor_integrate(at_sensor_t *s, apr_int64_t now, apr_uint32_t active,
                         apr_uint32_t queued)
{
    apr_int64_t dt = now - s->last_us; /* last_us >= start_us */

    if (now < s->start_us || dt <= 0) {
        return; /* settling after a change: not measured */
    }
    s->active_us += (double)active * (double)dt;
    if (queued > 0) {
        s->waited_us += (double)dt;
    }
    s->last_us = now;
}

void at_sensor_refused(at_sensor_t *s)
{
    s->refused++;
}

void at_sensor_completed(at_sensor_t *s, apr_int64_t service_us, apr_int64_t now)
{
    if (now < s->start_us) {
        return;
    }
    s->completed++;
    s->service_us += (double)service_us;
    s->service_sq_us += (double)service_us * (double)service_us;
    if ((double)service_us > s->service_max_us) {
        s->service_max_us = (double)service_us;
    }
}

/* Requests that run side by side start and end in waves, and share the
 * machine's slow and fast moments: windows shorter than a service time or
 * two differ by several times the error their own counts suggest. */
apr_int64_t at_sensor_min_len_us(const at_limit_t *ctl, apr_uint64_t service_us)
{
    apr_int64_t services = at_limit_window_services(ctl);
    apr_int64_t us = services * (apr_int64_t)service_us;
    apr_int64_t longest = services * AT_AUTO_WINDOW_LONG_US / AT_LIMIT_WINDOW_SERVICES;

    return us < AT_AUTO_WINDOW_MIN_US ? AT_AUTO_WINDOW_MIN_US
           : us > longest            ? longest
                                     : us;
}

/* A request that ends after a change ran partly before it, unless it
 * started after: the next window waits a quarter more than a service time
 * at the new level, which for work that computes grows with the limit, and
 * never less than one service time now. Less, and a step up looks better
 * than it is and one down worse. */
apr_int64_t at_sensor_settling_us(apr_uint32_t limit, apr_uint32_t next,
                                  apr_uint64_t service_us)
{
    double scale = limit ? (double)next / limit : 1;

    return (apr_int64_t)(1.25 * (scale > 1 ? scale : scale < 0.8 ? 0.8 : scale)
                         * (double)service_us);
}

/* The relative standard error of the window's mean service time: how far
 * one slow request can have moved it. */
static double service_rse(const at_sensor_t *s)
{
    double n = s->completed, mean = n > 0 ? s->service_us / n : 0;
    double var = n > 1 ? (s->service_sq_us - s->service_us * mean) / (n - 1) : 0;

    return var > 0 && mean > 0 ? sqrt(var / n) / mean : 0;
}

int at_sensor_window(const at_sensor_t *s, const at_limit_t *ctl, apr_uint64_t service_us,
                     apr_int64_t now, at_window_t *w)
{
    apr_int64_t len = now - s->start_us;

    if (len < at_sensor_min_len_us(ctl, service_us)
        || (!at_limit_enough_samples(ctl, s->completed, s->service_us, s->service_sq_us)
            && len < AT_AUTO_WINDOW_MAX_US)) {
        return 0;
    }
    w->completed = s->completed;
    w->secs = (double)len / 1e6;
    w->inflight = s->active_us / (double)len;
    w->limited = s->refused ? 1.0 : s->waited_us / (double)len;
    /* One request stuck far longer than the rest says nothing about the
     * limit: the slowest is left out. */
    w->service_us = s->completed > 2 ? (s->service_us - s->service_max_us)
                                           / (s->completed - 1)
                                     : 0;
    w->service_rse = service_rse(s);
    return 1;
}
