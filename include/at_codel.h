/*
 * codel=TARGET[:INTERVAL]: a queue that stands is cut short. A burst that
 * the slots drain is absorbed by the zone's full timeout; once the queue
 * has not been empty at any moment for INTERVAL, it stands, and no request
 * waits longer than TARGET until it empties again. The idea is CoDel's
 * (Nichols and Jacobson, "Controlling Queue Delay", 2012), applied to a
 * queue of requests rather than of packets.
 */
#ifndef AT_CODEL_H
#define AT_CODEL_H

#include <apr.h>

/* INTERVAL, when not given: this many typical service times, at least
 * AT_CODEL_INTERVAL_MIN_US (a burst a few services long is not standing). */
#define AT_CODEL_INTERVAL_SERVICES 10
#define AT_CODEL_INTERVAL_MIN_US 100000

typedef struct {
    apr_int64_t target_us;     /* 0: off */
    apr_int64_t interval_us;   /* 0: from the typical service time */
    apr_int64_t busy_since_us; /* the queue is non-empty since; 0: empty */
} at_codel_t;

/* After the queue's length changed to queued (lock held). */
void at_codel_queue_is(at_codel_t *c, apr_uint32_t queued, apr_int64_t now);

/* The interval in force for a typical service time. */
apr_int64_t at_codel_interval(const at_codel_t *c, apr_uint64_t typical_us);

/* How long the queue has stood at now (0: it does not stand). */
apr_int64_t at_codel_standing_for(const at_codel_t *c, apr_int64_t now,
                                  apr_uint64_t typical_us);

/* The deadline of a request that began waiting at start with deadline
 * deadline: earlier, start + TARGET, while the queue stands. */
apr_int64_t at_codel_deadline(const at_codel_t *c, apr_int64_t start,
                              apr_int64_t deadline, apr_int64_t now,
                              apr_uint64_t typical_us);

#endif
