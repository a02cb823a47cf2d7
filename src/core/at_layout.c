/*
 * The layout of the structures that every shared structure embeds, and the
 * arithmetic of layouts; the zone and the child table add their own.
 */
#include "at_layout.h"

#include <stdio.h>
#include <string.h>

#include "at_client.h"
#include "at_codel.h"
#include "at_rate.h"
#include "at_hist.h"
#include "at_limit.h"
#include "at_memgate.h"
#include "at_owner.h"
#include "at_parse.h"
#include "at_retry.h"
#include "at_sensor.h"
#include "at_zone.h"

static apr_uint64_t fold_bytes(apr_uint64_t h, const void *p, apr_size_t n)
{
    const unsigned char *b = p;

    while (n--) {
        h = (h ^ *b++) * 0x100000001b3ULL;
    }
    return h;
}

static apr_uint64_t fold_size(apr_uint64_t h, apr_size_t v)
{
    apr_uint64_t x = v;

    return fold_bytes(h, &x, sizeof(x));
}

apr_uint64_t at_layout_fold(apr_uint64_t h, const at_record_t *r, apr_size_t n)
{
    if (!h) {
        h = 0xcbf29ce484222325ULL;
    }
    for (apr_size_t i = 0; i < n; i++) {
        h = fold_bytes(h, r[i].name, strlen(r[i].name));
        h = fold_size(fold_size(h, r[i].size), r[i].align);
        for (apr_size_t k = 0; k < r[i].nfields; k++) {
            const at_field_t *f = &r[i].fields[k];

            h = fold_bytes(h, f->name, strlen(f->name));
            h = fold_size(fold_size(fold_size(h, f->offset), f->size), f->align);
        }
    }
    return h;
}

/* Shared structures carry their padding as named fields: then a field
 * left out of a list is a hole, whatever its size, where the compiler's
 * padding could have hidden it. */
const char *at_layout_gap(const at_record_t *r)
{
    static char msg[200];
    apr_size_t end = 0, i;

    /* The lists are in declaration order, which is offset order. */
    for (i = 0; i < r->nfields; i++) {
        const at_field_t *f = &r->fields[i];

        if (f->offset != end) {
            snprintf(msg, sizeof(msg), "%s: %s at %lu, expected at %lu: a field is "
                     "missing from the list before it, the list is out of order, or "
                     "the structure needs an explicit pad field there",
                     r->name, f->name, (unsigned long)f->offset, (unsigned long)end);
            return msg;
        }
        end = f->offset + f->size;
    }
    if (end != r->size) {
        snprintf(msg, sizeof(msg), "%s: the listed fields end at %lu of %lu bytes: a "
                 "field is missing from the end of the list, or a pad field", r->name,
                 (unsigned long)end, (unsigned long)r->size);
        return msg;
    }
    return NULL;
}

static const at_field_t owner_fields[] = {
    AT_FIELD(at_owner_t, pid), AT_FIELD(at_owner_t, reserved), AT_FIELD(at_owner_t, start)};

static const at_field_t limit_fields[] = {
    AT_FIELD(at_limit_t, limit),    AT_FIELD(at_limit_t, min),
    AT_FIELD(at_limit_t, max),      AT_FIELD(at_limit_t, cores),
    AT_FIELD(at_limit_t, mode),     AT_FIELD(at_limit_t, top),
    AT_FIELD(at_limit_t, dir),      AT_FIELD(at_limit_t, run),
    AT_FIELD(at_limit_t, passes),   AT_FIELD(at_limit_t, hold),
    AT_FIELD(at_limit_t, next_probe), AT_FIELD(at_limit_t, settled),
    AT_FIELD(at_limit_t, last_x),   AT_FIELD(at_limit_t, last_c),
    AT_FIELD(at_limit_t, ref_n),    AT_FIELD(at_limit_t, pad),
    AT_FIELD(at_limit_t, baseline_us),
    AT_FIELD(at_limit_t, recent_us), AT_FIELD(at_limit_t, changes),
    AT_FIELD(at_limit_t, shed_from)};

static const at_field_t sensor_fields[] = {
    AT_FIELD(at_sensor_t, start_us),      AT_FIELD(at_sensor_t, last_us),
    AT_FIELD(at_sensor_t, active_us),     AT_FIELD(at_sensor_t, waited_us),
    AT_FIELD(at_sensor_t, service_us),    AT_FIELD(at_sensor_t, service_max_us),
    AT_FIELD(at_sensor_t, service_sq_us), AT_FIELD(at_sensor_t, completed),
    AT_FIELD(at_sensor_t, refused)};

static const at_field_t memgate_fields[] = {
    AT_FIELD(at_memgate_t, bytes),   AT_FIELD(at_memgate_t, avail),
    AT_FIELD(at_memgate_t, read_us), AT_FIELD(at_memgate_t, pending),
    AT_FIELD(at_memgate_t, freed),   AT_FIELD(at_memgate_t, early_free),
    AT_FIELD(at_memgate_t, source),  AT_FIELD(at_memgate_t, pad),
    AT_FIELD(at_memgate_t, held),    AT_FIELD(at_memgate_t, read_errors),
    AT_FIELD(at_memgate_t, claim_us), AT_FIELD(at_memgate_t, land_us),
    AT_FIELD(at_memgate_t, landed),  AT_FIELD(at_memgate_t, pad2)};

static const at_field_t codel_fields[] = {
    AT_FIELD(at_codel_t, target_us), AT_FIELD(at_codel_t, interval_us),
    AT_FIELD(at_codel_t, busy_since_us)};

static const at_field_t retry_fields[] = {
    AT_FIELD(at_retry_t, window_start_us), AT_FIELD(at_retry_t, refused),
    AT_FIELD(at_retry_t, granted), AT_FIELD(at_retry_t, advice_ms), AT_FIELD(at_retry_t, pad)};

static const at_field_t hist_fields[] = {
    AT_FIELD(at_hist_t, count), AT_FIELD(at_hist_t, n), AT_FIELD(at_hist_t, sum_us),
    AT_FIELD(at_hist_t, max_us)};

static const at_field_t client_table_fields[] = {
    AT_FIELD(at_client_table_t, entries_off), AT_FIELD(at_client_table_t, n),
    AT_FIELD(at_client_table_t, pad), AT_FIELD(at_client_table_t, seed),
    AT_FIELD(at_client_table_t, secret)};

static const at_field_t client_key_fields[] = {AT_FIELD(at_client_key_t, b)};

static const at_field_t client_entry_fields[] = {
    AT_FIELD(at_client_entry_t, key), AT_FIELD(at_client_entry_t, key_pad),
    AT_FIELD(at_client_entry_t, count),
    AT_FIELD(at_client_entry_t, pad)};

static const at_field_t zone_conf_fields[] = {
    AT_FIELD(at_zone_conf_t, limit),           AT_FIELD(at_zone_conf_t, queue),
    AT_FIELD(at_zone_conf_t, timeout_us),      AT_FIELD(at_zone_conf_t, retry_after),
    AT_FIELD(at_zone_conf_t, dry_run),         AT_FIELD(at_zone_conf_t, per_client),
    AT_FIELD(at_zone_conf_t, limit_auto),      AT_FIELD(at_zone_conf_t, limit_min),
    AT_FIELD(at_zone_conf_t, limit_max),       AT_FIELD(at_zone_conf_t, max_from),
    AT_FIELD(at_zone_conf_t, queue_default),   AT_FIELD(at_zone_conf_t, mem_bytes),
    AT_FIELD(at_zone_conf_t, cores),           AT_FIELD(at_zone_conf_t, pad),
    AT_FIELD(at_zone_conf_t, read_body),
    AT_FIELD(at_zone_conf_t, retry_after_max), AT_FIELD(at_zone_conf_t, client_v6_prefix),
    AT_FIELD(at_zone_conf_t, refuse_status),   AT_FIELD(at_zone_conf_t, reserve),
    AT_FIELD(at_zone_conf_t, codel_target_us), AT_FIELD(at_zone_conf_t, codel_interval_us),
    AT_FIELD(at_zone_conf_t, per_key),         AT_FIELD(at_zone_conf_t, order),
    AT_FIELD(at_zone_conf_t, keyed),           AT_FIELD(at_zone_conf_t, pad2),
    AT_FIELD(at_zone_conf_t, rate),            AT_FIELD(at_zone_conf_t, read_body_total),
    AT_FIELD(at_zone_conf_t, cluster),         AT_FIELD(at_zone_conf_t, cluster_fallback),
    AT_FIELD(at_zone_conf_t, cluster_fallback_n), AT_FIELD(at_zone_conf_t, pad5)};

static const at_field_t rate_conf_fields[] = {
    AT_FIELD(at_rate_conf_t, interval_ns), AT_FIELD(at_rate_conf_t, burst),
    AT_FIELD(at_rate_conf_t, delay)};

static const at_field_t rate_table_fields[] = {
    AT_FIELD(at_rate_table_t, entries_off), AT_FIELD(at_rate_table_t, n),
    AT_FIELD(at_rate_table_t, pad), AT_FIELD(at_rate_table_t, tat_ns)};

static const at_field_t rate_entry_fields[] = {
    AT_FIELD(at_rate_entry_t, key), AT_FIELD(at_rate_entry_t, key_pad),
    AT_FIELD(at_rate_entry_t, tat_ns)};

#define COUNTER_FIELD(name, ...) AT_FIELD(at_zone_counters_t, name),
static const at_field_t counters_fields[] = {AT_ZONE_COUNTERS(COUNTER_FIELD)};

static const at_record_t common[] = {
    AT_RECORD(at_owner_t, owner_fields),
    AT_RECORD(at_limit_t, limit_fields),
    AT_RECORD(at_sensor_t, sensor_fields),
    AT_RECORD(at_memgate_t, memgate_fields),
    AT_RECORD(at_codel_t, codel_fields),
    AT_RECORD(at_retry_t, retry_fields),
    AT_RECORD(at_hist_t, hist_fields),
    AT_RECORD(at_client_table_t, client_table_fields),
    AT_RECORD(at_client_key_t, client_key_fields),
    AT_RECORD(at_client_entry_t, client_entry_fields),
    AT_RECORD(at_zone_conf_t, zone_conf_fields),
    AT_RECORD(at_rate_conf_t, rate_conf_fields),
    AT_RECORD(at_rate_table_t, rate_table_fields),
    AT_RECORD(at_rate_entry_t, rate_entry_fields),
    AT_RECORD(at_zone_counters_t, counters_fields)};

const at_record_t *at_layout_common(apr_size_t *n)
{
    *n = sizeof(common) / sizeof(common[0]);
    return common;
}
