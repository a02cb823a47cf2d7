/*
 * The status page as Prometheus scrapes it (?prometheus, text exposition
 * format 0.0.4): every field with a metric name, the wait and service
 * histograms whole, the priorities, and the children's lifetimes.
 */
#include "httpd.h"
#include "http_protocol.h"
#include "ap_mpm.h"

#include "apr_strings.h"

#include <stdio.h>
#include <string.h>

#include "at_hist.h"
#include "at_life.h"
#include "mod_adaptive_throttle.h"
#include "mod_adaptive_throttle_status.h"

static void emit_histogram(request_rec *r, apr_array_header_t *views, const char *name,
                           const char *help, int wait)
{
    int i, b;

    ap_rprintf(r, "# HELP apache_throttle_%s %s\n# TYPE apache_throttle_%s histogram\n",
               name, help, name);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        const at_hist_t *h = wait ? &z->s.wait_all : &z->s.service_all;
        apr_uint64_t cum = 0;

        for (b = 0; b < AT_HIST_BUCKETS; b++) {
            apr_int64_t bound = at_hist_bound_us(b);
            cum += h->count[b];
            if (bound < 0) {
                ap_rprintf(r, "apache_throttle_%s_bucket{zone=\"%s\",le=\"+Inf\"} %"
                           APR_UINT64_T_FMT "\n", name, z->name, cum);
            }
            else {
                /* The C library's %g: APR's drops the leading zero ("0.1"
                 * would become ".1"), and le labels are matched as strings. */
                char le[32];
                snprintf(le, sizeof(le), "%g", (double)bound / 1e6);
                ap_rprintf(r, "apache_throttle_%s_bucket{zone=\"%s\",le=\"%s\"} %"
                           APR_UINT64_T_FMT "\n", name, z->name, le, cum);
            }
        }
        ap_rprintf(r, "apache_throttle_%s_sum{zone=\"%s\"} %.6f\n", name, z->name,
                   (double)h->sum_us / 1e6);
        ap_rprintf(r, "apache_throttle_%s_count{zone=\"%s\"} %" APR_UINT64_T_FMT "\n",
                   name, z->name, h->n);
    }
}

/* One family per priority figure, labelled zone and priority; the wait
 * percentiles as a summary's quantiles. */
static void emit_prometheus_priorities(request_rec *r, apr_array_header_t *views)
{
    static const struct {
        const char *name, *type, *help;
        int field;
    } fam[] = {
        {"priority_admitted_total", "counter", "Requests admitted, by priority.", P_ADMITTED},
        {"priority_rejected_total", "counter", "Requests refused, by priority.", P_REJECTED},
        {"priority_queued", "gauge", "Requests waiting now, by priority.", P_QUEUED},
        {"priority_wait_seconds", "summary", "Wait of admitted requests, by priority.", -1},
    };
    static const double q[] = {0.5, 0.9, 0.99};
    static const char *const q_label[] = {"0.5", "0.9", "0.99"}; /* APR's %g drops the 0 */
    double v[NPFIELDS];
    size_t k, j;
    int i, p;

    for (k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
        ap_rprintf(r, "# HELP apache_throttle_%s %s\n# TYPE apache_throttle_%s %s\n",
                   fam[k].name, fam[k].help, fam[k].name, fam[k].type);
        for (i = 0; i < views->nelts; i++) {
            zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
            for (p = AT_PRIORITIES - 1; p >= 0; p--) {
                const at_priority_stats_t *ps = &z->s.priority[p];
                if (!at_status_prio_seen(ps)) {
                    continue;
                }
                at_status_prio_values(ps, v);
                if (fam[k].field >= 0) {
                    ap_rprintf(r, "apache_throttle_%s{zone=\"%s\",priority=\"%d\"} %s\n",
                               fam[k].name, z->name, PRIO_OF(p),
                               at_status_num(r->pool, v[fam[k].field]));
                    continue;
                }
                for (j = 0; j < sizeof(q) / sizeof(q[0]); j++) {
                    ap_rprintf(r, "apache_throttle_%s{zone=\"%s\",priority=\"%d\","
                               "quantile=\"%s\"} %.6f\n", fam[k].name, z->name, PRIO_OF(p),
                               q_label[j], (double)at_hist_quantile(&ps->wait, q[j]) / 1e6);
                }
                ap_rprintf(r, "apache_throttle_%s_sum{zone=\"%s\",priority=\"%d\"} %.6f\n"
                           "apache_throttle_%s_count{zone=\"%s\",priority=\"%d\"} %"
                           APR_UINT64_T_FMT "\n", fam[k].name, z->name, PRIO_OF(p),
                           (double)ps->wait.sum_us / 1e6, fam[k].name, z->name,
                           PRIO_OF(p), ps->wait.n);
            }
        }
    }
}

void at_status_emit_prometheus(request_rec *r, apr_array_header_t *views)
{
    const char *family = NULL;
    int i, f;

    ap_rprintf(r, "# HELP apache_throttle_info mod_adaptive_throttle build and MPM.\n"
               "# TYPE apache_throttle_info gauge\n"
               "apache_throttle_info{version=\"%s\",mpm=\"%s\"} 1\n",
               AT_MODULE_VERSION, ap_show_mpm());
    for (f = 0; f < NFIELDS; f++) {
        if (!at_status_fields[f].prom) {
            continue;
        }
        if (!family || strcmp(family, at_status_fields[f].prom) != 0) {
            family = at_status_fields[f].prom;
            ap_rprintf(r, "# HELP apache_throttle_%s %s\n# TYPE apache_throttle_%s %s\n",
                       family, at_status_fields[f].help, family,
                       at_status_fields[f].kind == COUNTER ? "counter" : "gauge");
        }
        for (i = 0; i < views->nelts; i++) {
            zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
            ap_rprintf(r, "apache_throttle_%s{zone=\"%s\"%s%s} %s\n", family, z->name,
                       at_status_fields[f].label ? "," : "", at_status_fields[f].label ? at_status_fields[f].label : "",
                       at_status_num(r->pool, z->v[f]));
        }
    }
    ap_rputs("# HELP apache_throttle_mem_source Where mem= read the available memory "
             "(source: none, meminfo, cgroup1, cgroup2).\n"
             "# TYPE apache_throttle_mem_source gauge\n", r);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        ap_rprintf(r, "apache_throttle_mem_source{zone=\"%s\",source=\"%s\"} 1\n", z->name,
                   at_status_value_text(r->pool, z, F_MEM_SOURCE));
    }
    ap_rputs("# HELP apache_throttle_timeout_seconds Longest wait in the queue.\n"
             "# TYPE apache_throttle_timeout_seconds gauge\n", r);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        ap_rprintf(r, "apache_throttle_timeout_seconds{zone=\"%s\"} %.3f\n", z->name,
                   z->v[F_TIMEOUT] / 1000.0);
    }
    ap_rputs("# HELP apache_throttle_oldest_running_seconds Age of the oldest running "
             "request.\n# TYPE apache_throttle_oldest_running_seconds gauge\n", r);
    for (i = 0; i < views->nelts; i++) {
        zone_view_t *z = &APR_ARRAY_IDX(views, i, zone_view_t);
        ap_rprintf(r, "apache_throttle_oldest_running_seconds{zone=\"%s\"} %.3f\n",
                   z->name, z->v[F_OLDEST] / 1000.0);
    }
    if (at_life_min()) {
        apr_array_header_t *kids = at_status_child_views(r->pool);
        ap_rputs("# HELP apache_throttle_child_lifetime_connections Connections this child "
                 "serves before it retires (ThrottleChildLifetime).\n"
                 "# TYPE apache_throttle_child_lifetime_connections gauge\n", r);
        for (i = 0; i < kids->nelts; i++) {
            at_child_t *c = &APR_ARRAY_IDX(kids, i, at_child_t);
            ap_rprintf(r, "apache_throttle_child_lifetime_connections{pid=\"%d\"} %u\n",
                       (int)c->owner.pid, c->lifetime);
        }
        ap_rputs("# HELP apache_throttle_child_served_connections Connections this child "
                 "has served.\n# TYPE apache_throttle_child_served_connections gauge\n", r);
        for (i = 0; i < kids->nelts; i++) {
            at_child_t *c = &APR_ARRAY_IDX(kids, i, at_child_t);
            ap_rprintf(r, "apache_throttle_child_served_connections{pid=\"%d\"} %u\n",
                       (int)c->owner.pid, c->served);
        }
    }
    emit_histogram(r, views, "wait_seconds",
                   "Time admitted requests waited for a slot (0 if none).", 1);
    emit_histogram(r, views, "service_seconds",
                   "Time from getting a slot to releasing it.", 0);
    emit_prometheus_priorities(r, views);
}
