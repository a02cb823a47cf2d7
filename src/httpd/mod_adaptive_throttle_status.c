/*
 * The status page: SetHandler throttle-status (HTML, ?auto, ?json,
 * ?prometheus) and a section in mod_status's server-status.
 *
 * Every format is written from one table of fields (the model,
 * mod_adaptive_throttle_status_model.c), so that a number shown in one
 * format is shown, under its documented name, in all of them.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_core.h"
#include "http_protocol.h"
#include "http_request.h"
#include "ap_mpm.h"
#include "mod_status.h"

#include "apr_strings.h"

#include <stdio.h>

#include "at_hist.h"
#include "at_life.h"
#include "at_limit.h"
#include "at_mem.h"
#include "at_owner.h"
#include "at_parse.h"
#include "at_zone.h"
#include "mod_adaptive_throttle.h"
#include "mod_adaptive_throttle_status.h"

static int field_shown(const zone_view_t *z, int f)
{
    switch (at_status_fields[f].shown) {
    case IF_AUTO: return z->s.limit_auto;
    case IF_MEM: return z->s.mem_bytes > 0;
    case IF_CODEL: return z->s.codel_target_us > 0;
    case IF_RATE: return z->s.rate.interval_ns > 0;
    case IF_CLUSTER: return z->v[F_CLUSTER] > 0;
    default: return 1;
    }
}

/* Fields shown as a word: where the memory reading and max came from,
 * what the controller is doing. */
static int is_word(int f)
{
    return f == F_MEM_SOURCE || f == F_LIMIT_MAX_FROM || f == F_LIMIT_MODE;
}

/* The clients (per_client) or keys (per_key) with the most requests in,
 * as "who=count" words joined by sep. */
static const char *busiest_text(apr_pool_t *p, const zone_view_t *z, const char *sep)
{
    const char *out = "";
    char who[AT_CLIENT_KEY_TEXT_LEN];
    apr_uint32_t i;

    for (i = 0; i < z->s.nbusiest; i++) {
        at_client_key_show(&z->s.busiest[i].key, who, sizeof(who));
        out = apr_psprintf(p, "%s%s%s=%u", out, i ? sep : "", who, z->s.busiest[i].count);
    }
    return out;
}

static int counts_clients(const zone_view_t *z)
{
    return z->s.per_client || z->s.per_key;
}

/* ---- per priority ---------------------------------------------------------- */


static const prio_field_t prio_fields[NPFIELDS] = {
    {"Admitted", "admitted"}, {"Rejected", "rejected"}, {"Queued", "queued"},
    {"WaitP50Ms", "wait_p50_ms"}, {"WaitP90Ms", "wait_p90_ms"}, {"WaitP99Ms", "wait_p99_ms"},
};

/* ---- ?auto: Key: value lines -------------------------------------------- */

static void emit_auto_children(request_rec *r)
{
    apr_array_header_t *kids;
    int i;

    if (at_life_min()) {
        ap_rprintf(r, "ThrottleChildLifetime: %u %u\n", at_life_min(), at_life_max());
    }
    if (at_life_max_age_us()) {
        ap_rprintf(r, "ThrottleChildMaxAgeS: %" APR_INT64_T_FMT "\n",
                   at_life_max_age_us() / 1000000);
    }
    kids = at_status_child_views(r->pool);
    for (i = 0; i < kids->nelts; i++) {
        at_child_t *c = &APR_ARRAY_IDX(kids, i, at_child_t);
        ap_rprintf(r, "ThrottleChild.%d.Lifetime: %u\nThrottleChild.%d.Served: %u\n"
                   "ThrottleChild.%d.Extensions: %u\n", (int)c->owner.pid, c->lifetime,
                   (int)c->owner.pid, c->served, (int)c->owner.pid, c->extensions);
    }
}

static void emit_auto_priorities(request_rec *r, const zone_view_t *z)
{
    double v[NPFIELDS];
    int p, f;

    for (p = AT_PRIORITIES - 1; p >= 0; p--) {
        if (!at_status_prio_seen(&z->s.priority[p])) {
            continue;
        }
        at_status_prio_values(&z->s.priority[p], v);
        for (f = 0; f < NPFIELDS; f++) {
            ap_rprintf(r, "Throttle.%s.Priority.%d.%s: %s\n", z->name, PRIO_OF(p),
                       prio_fields[f].key, at_status_num(r->pool, v[f]));
        }
    }
}

static void emit_auto(request_rec *r, apr_array_header_t *views)
{
    int i, f;

    ap_rprintf(r, "ThrottleVersion: %s\n", AT_MODULE_VERSION);
    ap_rprintf(r, "ThrottleMPM: %s\n", ap_show_mpm());
    ap_rputs("ThrottleZones:", r);
    for (i = 0; i < views->nelts; i++) {
        ap_rprintf(r, " %s", APR_ARRAY_IDX(views, i, zone_view_t).name);
    }
    ap_rputs("\n", r);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        for (f = 0; f < NFIELDS; f++) {
            if (field_shown(z, f)) {
                ap_rprintf(r, "Throttle.%s.%s: %s\n", z->name, at_status_fields[f].key,
                           at_status_value_text(r->pool, z, f));
            }
        }
        if (counts_clients(z)) {
            ap_rprintf(r, "Throttle.%s.Busiest: %s\n", z->name, busiest_text(r->pool, z, " "));
        }
        emit_auto_priorities(r, z);
    }
    emit_auto_children(r);
}

/* ---- ?json ------------------------------------------------------------------ */

static void emit_json_priorities(request_rec *r, const zone_view_t *z)
{
    double v[NPFIELDS];
    int p, f, first = 1;

    ap_rputs(",\"priorities\":[", r);
    for (p = AT_PRIORITIES - 1; p >= 0; p--) {
        if (!at_status_prio_seen(&z->s.priority[p])) {
            continue;
        }
        at_status_prio_values(&z->s.priority[p], v);
        ap_rprintf(r, "%s{\"priority\":%d", first ? "" : ",", PRIO_OF(p));
        for (f = 0; f < NPFIELDS; f++) {
            ap_rprintf(r, ",\"%s\":%s", prio_fields[f].json, at_status_num(r->pool, v[f]));
        }
        ap_rputs("}", r);
        first = 0;
    }
    ap_rputs("]", r);
}

/* Addresses and hex: nothing to escape. */
static void emit_json_busiest(request_rec *r, const zone_view_t *z)
{
    char who[AT_CLIENT_KEY_TEXT_LEN];
    apr_uint32_t i;

    ap_rputs(",\"busiest\":[", r);
    for (i = 0; i < z->s.nbusiest; i++) {
        at_client_key_show(&z->s.busiest[i].key, who, sizeof(who));
        ap_rprintf(r, "%s{\"who\":\"%s\",\"count\":%u}", i ? "," : "", who,
                   z->s.busiest[i].count);
    }
    ap_rputs("]", r);
}

static void emit_json(request_rec *r, apr_array_header_t *views)
{
    int i, f;

    /* Names are [A-Za-z0-9_-] and the MPM name is httpd's: nothing to escape. */
    ap_rprintf(r, "{\"version\":\"%s\",\"mpm\":\"%s\",\"zones\":[", AT_MODULE_VERSION,
               ap_show_mpm());
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        ap_rprintf(r, "%s{\"name\":\"%s\"", i ? "," : "", z->name);
        for (f = 0; f < NFIELDS; f++) {
            if (f == F_DRY_RUN) {
                ap_rprintf(r, ",\"dry_run\":%s", z->v[f] ? "true" : "false");
            }
            else if (is_word(f)) {
                ap_rprintf(r, ",\"%s\":\"%s\"", at_status_fields[f].json, at_status_value_text(r->pool, z, f));
            }
            else {
                ap_rprintf(r, ",\"%s\":%s", at_status_fields[f].json, at_status_num(r->pool, z->v[f]));
            }
        }
        emit_json_busiest(r, z);
        emit_json_priorities(r, z);
        ap_rputs("}", r);
    }
    ap_rputs("]", r);
    if (at_life_min()) {
        apr_array_header_t *kids = at_status_child_views(r->pool);
        ap_rprintf(r, ",\"child_lifetime\":{\"min\":%u,\"max\":%u},\"children\":[",
                   at_life_min(), at_life_max());
        for (i = 0; i < kids->nelts; i++) {
            at_child_t *c = &APR_ARRAY_IDX(kids, i, at_child_t);
            ap_rprintf(r, "%s{\"pid\":%d,\"lifetime\":%u,\"served\":%u,"
                       "\"extensions\":%u}", i ? "," : "", (int)c->owner.pid,
                       c->lifetime, c->served, c->extensions);
        }
        ap_rputs("]", r);
    }
    if (at_life_max_age_us()) {
        ap_rprintf(r, ",\"child_max_age_s\":%" APR_INT64_T_FMT,
                   at_life_max_age_us() / 1000000);
    }
    ap_rputs("}\n", r);
}

/* ---- HTML ---------------------------------------------------------------------- */

static void emit_html_busiest(request_rec *r, apr_array_header_t *views)
{
    int i, any = 0;

    for (i = 0; i < views->nelts; i++) {
        any |= counts_clients(&APR_ARRAY_IDX(views, i, zone_view_t));
    }
    if (!any) {
        return;
    }
    ap_rputs("<tr><td>Busiest</td>", r);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        ap_rprintf(r, "<td align=\"right\">%s</td>",
                   counts_clients(z) ? busiest_text(r->pool, z, "<br>") : "&ndash;");
    }
    ap_rputs("</tr>\n", r);
}

static void emit_html_table(request_rec *r, apr_array_header_t *views)
{
    int i, f;

    if (!views->nelts) {
        ap_rputs("<p>No throttle zones are configured.</p>\n", r);
        return;
    }
    ap_rputs("<table border=\"1\" cellpadding=\"3\">\n<tr><th>zone</th>", r);
    for (i = 0; i < views->nelts; i++) {
        ap_rprintf(r, "<th>%s</th>", ap_escape_html(r->pool,
                                                     APR_ARRAY_IDX(views, i, zone_view_t).name));
    }
    ap_rputs("</tr>\n", r);
    for (f = 0; f < NFIELDS; f++) {
        int any = 0;

        for (i = 0; i < views->nelts; i++) {
            any |= field_shown(&APR_ARRAY_IDX(views, i, zone_view_t), f);
        }
        if (!any) {
            continue;
        }
        ap_rprintf(r, "<tr><td>%s</td>", at_status_fields[f].key);
        for (i = 0; i < views->nelts; i++) {
            zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
            ap_rprintf(r, "<td align=\"right\">%s</td>",
                       field_shown(z, f) ? at_status_value_text(r->pool, z, f) : "&ndash;");
        }
        ap_rputs("</tr>\n", r);
    }
    emit_html_busiest(r, views);
    ap_rputs("</table>\n", r);
}

static void emit_html_priorities(request_rec *r, apr_array_header_t *views)
{
    double v[NPFIELDS];
    int i, p, f, any = 0;

    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        for (p = AT_PRIORITIES - 1; p >= 0; p--) {
            if (!at_status_prio_seen(&z->s.priority[p])) {
                continue;
            }
            if (!any++) {
                ap_rputs("<h2>By priority</h2>\n<table border=\"1\" cellpadding=\"3\">\n"
                         "<tr><th>zone</th><th>priority</th>", r);
                for (f = 0; f < NPFIELDS; f++) {
                    ap_rprintf(r, "<th>%s</th>", prio_fields[f].key);
                }
                ap_rputs("</tr>\n", r);
            }
            at_status_prio_values(&z->s.priority[p], v);
            ap_rprintf(r, "<tr><td>%s</td><td align=\"right\">%d</td>",
                       ap_escape_html(r->pool, z->name), PRIO_OF(p));
            for (f = 0; f < NPFIELDS; f++) {
                ap_rprintf(r, "<td align=\"right\">%s</td>", at_status_num(r->pool, v[f]));
            }
            ap_rputs("</tr>\n", r);
        }
    }
    if (any) {
        ap_rputs("</table>\n", r);
    }
}

static void emit_html_children(request_rec *r)
{
    apr_array_header_t *kids;
    int i;

    if (!at_life_min()) {
        return;
    }
    kids = at_status_child_views(r->pool);
    ap_rprintf(r, "<h2>Child lifetimes</h2>\n<p>ThrottleChildLifetime %u %u", at_life_min(),
               at_life_max());
    if (at_life_max_age_us()) {
        ap_rprintf(r, "; ThrottleChildMaxAge %" APR_INT64_T_FMT " s",
                   at_life_max_age_us() / 1000000);
    }
    ap_rputs("</p>\n<table border=\"1\" cellpadding=\"3\">\n<tr><th>pid</th>"
             "<th>lifetime</th><th>served</th><th>extensions</th></tr>\n", r);
    for (i = 0; i < kids->nelts; i++) {
        at_child_t *c = &APR_ARRAY_IDX(kids, i, at_child_t);
        ap_rprintf(r, "<tr><td>%d</td><td align=\"right\">%u</td><td align=\"right\">%u"
                   "</td><td align=\"right\">%u</td></tr>\n", (int)c->owner.pid,
                   c->lifetime, c->served, c->extensions);
    }
    ap_rputs("</table>\n", r);
}

static void emit_html(request_rec *r, apr_array_header_t *views)
{
    ap_rputs(DOCTYPE_HTML_4_01 "<html><head><title>Throttle status</title></head><body>\n"
             "<h1>mod_adaptive_throttle</h1>\n", r);
    ap_rprintf(r, "<p>Version %s, %s MPM. Percentiles cover the last 60 to 120 s; "
               "totals count since the zone was created. Also as "
               "<a href=\"?auto\">?auto</a>, <a href=\"?json\">?json</a>, "
               "<a href=\"?prometheus\">?prometheus</a>.</p>\n",
               AT_MODULE_VERSION, ap_show_mpm());
    emit_html_table(r, views);
    emit_html_priorities(r, views);
    emit_html_children(r);
    ap_rputs("</body></html>\n", r);
}

enum { FMT_HTML, FMT_JSON, FMT_PROM, FMT_AUTO };

/* ?json, ?prometheus, ?auto; also with an empty value (?prometheus=),
 * which is what a Prometheus scrape's params give. */
static int status_format(const char *q)
{
    static const struct {
        const char *name;
        int format;
    } formats[] = {{"json", FMT_JSON}, {"prometheus", FMT_PROM}, {"auto", FMT_AUTO}};
    size_t i, n;

    for (i = 0; q && i < sizeof(formats) / sizeof(formats[0]); i++) {
        n = strlen(formats[i].name);
        if (strncmp(q, formats[i].name, n) == 0 && (!q[n] || (q[n] == '=' && !q[n + 1]))) {
            return formats[i].format;
        }
    }
    return FMT_HTML;
}

int at_status_handler(request_rec *r)
{
    apr_array_header_t *views;
    int format;

    if (strcmp(r->handler, "throttle-status") != 0) {
        return DECLINED;
    }
    if (r->method_number != M_GET) {
        r->allowed = AP_METHOD_BIT << M_GET;
        return HTTP_METHOD_NOT_ALLOWED;
    }
    apr_table_setn(r->headers_out, "Cache-Control", "no-store");
    format = status_format(r->args);
    ap_set_content_type(r, format == FMT_JSON   ? "application/json"
                           : format == FMT_PROM ? "text/plain; version=0.0.4; charset=utf-8"
                           : format == FMT_AUTO ? "text/plain; charset=utf-8"
                                                : "text/html; charset=utf-8");
    if (r->header_only) {
        return OK;
    }
    views = at_status_zone_views(r->pool);
    switch (format) {
    case FMT_JSON: emit_json(r, views); break;
    case FMT_PROM: at_status_emit_prometheus(r, views); break;
    case FMT_AUTO: emit_auto(r, views); break;
    default: emit_html(r, views); break;
    }
    return OK;
}

/* mod_status's server-status: a section of its page, or its ?auto lines. */
int at_status_section(request_rec *r, int flags)
{
    apr_array_header_t *views = at_status_zone_views(r->pool);

    if (flags & AP_STATUS_SHORT) {
        emit_auto(r, views);
    }
    else {
        ap_rputs("<hr /><h2>Throttle zones (mod_adaptive_throttle)</h2>\n", r);
        emit_html_table(r, views);
    }
    return OK;
}
