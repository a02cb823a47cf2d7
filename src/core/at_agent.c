/*
 * The agent-check line (HAProxy, doc/configuration.txt "agent-check"):
 * words separated by spaces, ended by LF. Every reply names the
 * operational state ("up"/"down") and the administrative one
 * ("ready"/"drain"), because HAProxy lets only the agent undo what the
 * agent set.
 */
#include "at_agent.h"

#include <stdio.h>

apr_uint32_t at_agent_weight(const at_zone_glance_t *g)
{
    apr_uint32_t queued = g->queued > g->queue_cap ? g->queue_cap : g->queued;
    apr_uint32_t w;

    if (g->queue_cap == 0) {
        return 100;
    }
    w = (apr_uint32_t)(((apr_uint64_t)(g->queue_cap - queued) * 100) / g->queue_cap);
    return w < 1 ? 1 : w;
}

apr_size_t at_agent_line(char *buf, apr_size_t len, const at_zone_glance_t *g,
                         at_host_state_t state)
{
    int n;

    if (state == AT_HOST_BROKEN) {
        n = snprintf(buf, len, "down #throttle zone unusable\n");
    }
    else {
        /* maxconn is the zone's limit: a balancer that queues at maxconn
         * sends each host what it can run, and holds the rest. */
        n = snprintf(buf, len, "up %s %u%% maxconn:%u\n",
                     state == AT_HOST_DRAINING ? "drain" : "ready", at_agent_weight(g),
                     g->limit > 0 ? g->limit : 1);
    }
    return n > 0 && (apr_size_t)n < len ? (apr_size_t)n : 0;
}
