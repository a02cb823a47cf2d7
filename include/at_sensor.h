/*
 * limit=auto: what a zone measures for its controller, one window at a
 * time. The zone reports every change of what runs or waits and every
 * completed request; a window closes when it is long enough and holds
 * enough completions, and becomes an at_window_t for at_limit_update.
 */
#ifndef AT_SENSOR_H
#define AT_SENSOR_H

#include <apr.h>
#include "at_limit.h"

typedef struct {
    apr_int64_t start_us, last_us; /* before start_us: settling, not measured */
    double active_us;  /* requests running, integrated over time */
    double waited_us;  /* time during which requests waited */
    double service_us, service_max_us, service_sq_us; /* sum, slowest, sum of squares */
    apr_uint32_t completed, refused;
} at_sensor_t;

/* A new window from start_us on (later than now while a change settles). */
void at_sensor_reset(at_sensor_t *s, apr_int64_t start_us);

/* Before active or queued change: what ran and waited since the last call,
 * at the values until now. */
void at_sensor_integrate(at_sensor_t *s, apr_int64_t now, apr_uint32_t active,
                         apr_uint32_t queued);

void at_sensor_refused(at_sensor_t *s);
void at_sensor_completed(at_sensor_t *s, apr_int64_t service_us, apr_int64_t now);

/* The shortest window for a controller in ctl's state, at a service time of
 * service_us: enough service times that requests starting and ending in
 * waves average out (at_limit_window_services), within the bounds of
 * at_zone.h. */
apr_int64_t at_sensor_min_len_us(const at_limit_t *ctl, apr_uint64_t service_us);

/* How long after a change from limit to next the next window starts. */
apr_int64_t at_sensor_settling_us(apr_uint32_t limit, apr_uint32_t next,
                                  apr_uint64_t service_us);

/* 1 and the window in *w if it can be judged at now, else 0. */
int at_sensor_window(const at_sensor_t *s, const at_limit_t *ctl, apr_uint64_t service_us,
                     apr_int64_t now, at_window_t *w);

#endif
