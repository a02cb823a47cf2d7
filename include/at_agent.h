/*
 * What a load balancer is told about one zone: HAProxy's agent-check line
 * and the health endpoint's verdict. Plain C, no httpd headers.
 */
#ifndef AT_AGENT_H
#define AT_AGENT_H

#include <apr.h>

#include "at_zone.h"

typedef enum {
    AT_HOST_UP = 0,   /* serving */
    AT_HOST_DRAINING, /* finish what runs, take nothing new */
    AT_HOST_BROKEN    /* the zone is unusable: no shared memory, or a lock failed for good */
} at_host_state_t;

/* The weight, in percent of the configured one, for a zone seen as g: 100
 * while its queue is empty, falling in proportion as the queue fills, never
 * below 1 (0 would take the host out of the farm, as drain does). */
apr_uint32_t at_agent_weight(const at_zone_glance_t *g);

/* Writes the agent-check reply into buf (NUL-terminated, LF-ended): e.g.
 * "up ready 60% maxconn:8\n", "up drain 60% maxconn:8\n", or
 * "down #throttle zone unusable\n". Returns its length, or 0 if len is too
 * small (AT_AGENT_LINE_MAX always suffices). */
#define AT_AGENT_LINE_MAX 64
apr_size_t at_agent_line(char *buf, apr_size_t len, const at_zone_glance_t *g,
                         at_host_state_t state);

#endif
