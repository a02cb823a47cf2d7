/*
 * codel=: how long a standing queue may hold a request.
 */
#include "at_codel.h"

void at_codel_queue_is(at_codel_t *c, apr_uint32_t queued, apr_int64_t now)
{
    if (!queued) {
        c->busy_since_us = 0;
    }
    else if (!c->busy_since_us) {
        c->busy_since_us = now > 0 ? now : 1;
    }
}

apr_int64_t at_codel_interval(const at_codel_t *c, apr_uint64_t typical_us)
{
    apr_int64_t i;

    if (c->interval_us) {
        return c->interval_us;
    }
    i = (apr_int64_t)typical_us * AT_CODEL_INTERVAL_SERVICES;
    return i < AT_CODEL_INTERVAL_MIN_US ? AT_CODEL_INTERVAL_MIN_US : i;
}

apr_int64_t at_codel_standing_for(const at_codel_t *c, apr_int64_t now,
                                  apr_uint64_t typical_us)
{
    apr_int64_t stands_at;

    if (!c->target_us || !c->busy_since_us) {
        return 0;
    }
    stands_at = c->busy_since_us + at_codel_interval(c, typical_us);
    return now >= stands_at ? now - stands_at + 1 : 0;
}

apr_int64_t at_codel_deadline(const at_codel_t *c, apr_int64_t start,
                              apr_int64_t deadline, apr_int64_t now,
                              apr_uint64_t typical_us)
{
    apr_int64_t cut = start + c->target_us;

    if (at_codel_standing_for(c, now, typical_us) && cut < deadline) {
        return cut;
    }
    return deadline;
}
