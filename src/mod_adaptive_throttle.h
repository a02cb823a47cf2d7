/*
 * Declarations shared by the httpd glue files (not by the core).
 */
#ifndef MOD_ADAPTIVE_THROTTLE_H
#define MOD_ADAPTIVE_THROTTLE_H

#include "httpd.h"
#include "http_config.h"

#include "at_zone.h"

#define AT_MODULE_VERSION "0.2.0"

/* A zone name as the configuration knows it: every directive naming a zone
 * points at the same ref, and post_config attaches the shared zone to it. */
typedef struct {
    const char *name;
    const char *defined_at; /* NULL until ThrottleZone NAME is read */
    const char *first_use;
    at_zone_conf_t conf;
    at_zone_t *zone;
} zone_ref_t;

/* The zones of the running configuration, sorted by name. */
apr_array_header_t *at_configured_zones(apr_pool_t *p);

/* Status page: the throttle-status handler and the mod_status section. */
int at_status_handler(request_rec *r);
int at_status_section(request_rec *r, int flags);

#endif
