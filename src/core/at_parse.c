/*
 * ThrottleZone argument parsing.
 */
#include "at_parse.h"
#include "at_cluster.h"

#include <apr_lib.h>
#include <apr_strings.h>
#include <string.h>
#include <unistd.h>

const char *at_parse_uint(apr_pool_t *p, const char *s, apr_uint64_t min,
                          apr_uint64_t max, apr_uint64_t *out)
{
    apr_uint64_t v = 0;
    const char *c;

    if (!s || !*s) {
        return "an empty value";
    }
    for (c = s; *c; c++) {
        if (!apr_isdigit(*c)) {
            return apr_psprintf(p, "'%s' is not a whole number", s);
        }
        if (v > (APR_UINT64_MAX - 9) / 10) {
            return apr_psprintf(p, "'%s' is too large (at most %" APR_UINT64_T_FMT ")", s, max);
        }
        v = v * 10 + (apr_uint64_t)(*c - '0');
    }
    if (v < min || v > max) {
        return apr_psprintf(p, "'%s' is out of range (%" APR_UINT64_T_FMT
                            " to %" APR_UINT64_T_FMT ")", s, min, max);
    }
    *out = v;
    return NULL;
}

const char *at_parse_duration(apr_pool_t *p, const char *s,
                              apr_int64_t *out_us)
{
    static const struct {
        const char *suffix;
        apr_int64_t us;
    } units[] = {
        {"ms", 1000}, {"s", 1000000}, {"m", 60000000}, {"h", 3600000000LL},
        {"", 1000000}, /* a bare number is seconds, as elsewhere in httpd */
    };
    const char *end = s;
    char *digits;
    apr_uint64_t v;
    size_t i;
    const char *err;

    if (!s || !*s) {
        return "an empty duration";
    }
    while (apr_isdigit(*end)) {
        end++;
    }
    if (end == s) {
        return apr_psprintf(p, "'%s' is not a duration (use e.g. 500ms, 4s, 1m)", s);
    }
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            break;
        }
    }
    if (i == sizeof(units) / sizeof(units[0])) {
        return apr_psprintf(p, "'%s' has an unknown unit '%s' (use ms, s, m or h)", s, end);
    }
    digits = apr_pstrmemdup(p, s, (apr_size_t)(end - s));
    err = at_parse_uint(p, digits, 1, (apr_uint64_t)(AT_TIMEOUT_MAX_US / units[i].us), &v);
    if (err) {
        return apr_psprintf(p, "'%s' is not a duration from 1ms to 1h", s);
    }
    *out_us = (apr_int64_t)v * units[i].us;
    return NULL;
}

const char *at_parse_size(apr_pool_t *p, const char *s, apr_uint64_t min,
                          apr_uint64_t max, apr_uint64_t *out)
{
    static const char units[] = "KMGT";
    const char *end = s, *u;
    apr_uint64_t v, scale = 1;
    const char *err;

    if (!s || !*s) {
        return "an empty size";
    }
    while (apr_isdigit(*end)) {
        end++;
    }
    if (end == s) {
        return apr_psprintf(p, "'%s' is not a size (use e.g. 200M, 1G, 65536)", s);
    }
    if (*end) {
        u = strchr(units, apr_toupper(*end));
        if (!u || !(end[1] == '\0' || strcasecmp(end + 1, "B") == 0
                    || strcasecmp(end + 1, "iB") == 0)) {
            return apr_psprintf(p, "'%s' has an unknown unit '%s' (use K, M, G or T)", s,
                                end);
        }
        scale = APR_UINT64_C(1) << (10 * (u - units + 1));
    }
    err = at_parse_uint(p, apr_pstrmemdup(p, s, (apr_size_t)(end - s)), 0,
                        max / scale, &v);
    if (err || v * scale < min) {
        return apr_psprintf(p, "'%s' is not a size from %" APR_UINT64_T_FMT
                            " bytes to %" APR_UINT64_T_FMT " GiB", s, min, max >> 30);
    }
    *out = v * scale;
    return NULL;
}

const char *at_parse_zone_name(apr_pool_t *p, const char *s)
{
    const char *c;

    if (!s || !*s) {
        return "a zone name must not be empty";
    }
    if (strlen(s) > AT_ZONE_NAME_MAX) {
        return apr_psprintf(p, "zone name '%s' is longer than %d characters", s,
                            AT_ZONE_NAME_MAX);
    }
    for (c = s; *c; c++) {
        if (!apr_isalnum(*c) && *c != '_' && *c != '-') {
            return apr_psprintf(p, "zone name '%s' may only hold letters, digits, "
                                "'_' and '-'", s);
        }
    }
    if (strcasecmp(s, "off") == 0) {
        return "'off' is reserved and cannot name a zone";
    }
    return NULL;
}

typedef const char *(*key_parser)(apr_pool_t *p, const char *value,
                                  at_zone_conf_t *c);

static const char *parse_limit(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err;

    if (strcasecmp(v, "auto") == 0) {
        c->limit_auto = 1;
        return NULL;
    }
    err = at_parse_uint(p, v, 1, AT_LIMIT_MAX, &n);
    c->limit = (apr_uint32_t)n;
    return err;
}

static const char *parse_queue(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 0, AT_QUEUE_MAX, &n);

    c->queue = (apr_uint32_t)n;
    return err;
}

static const char *parse_timeout(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    return at_parse_duration(p, v, &c->timeout_us);
}

static const char *parse_retry_after(apr_pool_t *p, const char *v,
                                     at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err;

    if (strcasecmp(v, "auto") == 0) {
        c->retry_after = AT_RETRY_AFTER_AUTO;
        return NULL;
    }
    err = at_parse_uint(p, v, 1, AT_RETRY_AFTER_MAX, &n);
    c->retry_after = (apr_uint32_t)n;
    return err;
}

static const char *parse_dry_run(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    if (strcasecmp(v, "on") == 0) {
        c->dry_run = 1;
    }
    else if (strcasecmp(v, "off") == 0) {
        c->dry_run = 0;
    }
    else {
        return apr_psprintf(p, "'%s' is neither on nor off", v);
    }
    return NULL;
}

static const char *parse_bound(apr_pool_t *p, const char *v, apr_uint32_t *out)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 1, AT_LIMIT_MAX, &n);

    *out = (apr_uint32_t)n;
    return err;
}

static const char *parse_min(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    return parse_bound(p, v, &c->limit_min);
}

static const char *parse_max(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    return parse_bound(p, v, &c->limit_max);
}

static const char *parse_per_client(apr_pool_t *p, const char *v,
                                    at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 1, AT_LIMIT_MAX + AT_QUEUE_MAX, &n);

    c->per_client = (apr_uint32_t)n;
    return err;
}

static const char *parse_order(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    if (strcasecmp(v, "fifo") == 0) {
        c->order = AT_ORDER_FIFO;
    }
    else if (strcasecmp(v, "lifo") == 0) {
        c->order = AT_ORDER_LIFO;
    }
    else {
        return apr_psprintf(p, "'%s' is neither fifo nor lifo", v);
    }
    return NULL;
}

static const char *parse_per_key(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 1, AT_LIMIT_MAX + AT_QUEUE_MAX, &n);

    c->per_key = (apr_uint32_t)n;
    return err;
}

/* "R/s" or "R/m" (nginx's "Rr/s" too), then ":BURST" if any. */
static const char *parse_rate(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    const char *slash = strchr(v, '/'), *colon = strchr(v, ':'), *unit;
    apr_uint64_t n, burst = 0;
    apr_size_t len;

    if (!slash || (colon && colon < slash)) {
        return apr_psprintf(p, "'%s' is not a rate: R/s or R/m, with :BURST if any "
                            "(e.g. rate=10/s or rate=600/m:20)", v);
    }
    len = (apr_size_t)(slash - v);
    if (len > 1 && v[len - 1] == 'r') {
        len--;
    }
    if (at_parse_uint(p, apr_pstrmemdup(p, v, len), 1, AT_RATE_PER_SEC_MAX, &n)) {
        return apr_psprintf(p, "'%s': the number of requests must be a whole number from "
                            "1 to %d", v, AT_RATE_PER_SEC_MAX);
    }
    unit = apr_pstrmemdup(p, slash + 1, colon ? (apr_size_t)(colon - slash - 1)
                                              : strlen(slash + 1));
    if (strcmp(unit, "s") != 0 && strcmp(unit, "m") != 0) {
        return apr_psprintf(p, "'%s': per '%s'? Rates are per second (/s) or per "
                            "minute (/m)", v, unit);
    }
    if (colon && at_parse_uint(p, colon + 1, 0, AT_RATE_BURST_MAX, &burst)) {
        return apr_psprintf(p, "'%s': the burst must be a whole number from 0 to %d", v,
                            AT_RATE_BURST_MAX);
    }
    c->rate.interval_ns = (*unit == 's' ? APR_INT64_C(1000000000) : APR_INT64_C(60000000000))
                          / (apr_int64_t)n;
    c->rate.burst = (apr_uint32_t)burst;
    return NULL;
}

static const char *parse_rate_delay(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 0, AT_RATE_BURST_MAX, &n);

    c->rate.delay = (apr_uint32_t)n;
    return err;
}

static const char *parse_mem(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    return at_parse_size(p, v, 1, AT_MEM_MAX, &c->mem_bytes);
}

static const char *parse_read_body(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    if (strcmp(v, "0") == 0) {
        c->read_body = 0;
        return NULL;
    }
    return at_parse_size(p, v, 1, AT_READ_BODY_MAX, &c->read_body);
}

static const char *parse_read_body_total(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    return at_parse_size(p, v, 1, AT_MEM_MAX, &c->read_body_total);
}

static const char *parse_retry_after_max(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 1, AT_RETRY_AFTER_MAX, &n);

    c->retry_after_max = (apr_uint32_t)n;
    return err;
}

/* "/64" or "64". */
static const char *parse_per_client_v6(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, *v == '/' ? v + 1 : v, AT_CLIENT_V6_PREFIX_MIN, 128, &n);

    c->client_v6_prefix = (apr_uint32_t)n;
    return err ? apr_psprintf(p, "'%s' is not an IPv6 prefix length from /%d to /128", v,
                              AT_CLIENT_V6_PREFIX_MIN)
               : NULL;
}

static const char *parse_status(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    if (strcmp(v, "503") == 0 || strcmp(v, "429") == 0) {
        c->refuse_status = v[0] == '5' ? 503 : 429;
        return NULL;
    }
    return apr_psprintf(p, "'%s' is not a refusal status: 503 or 429", v);
}

const char *at_parse_priority(apr_pool_t *p, const char *n, const char *opt,
                              int *priority, apr_int64_t *timeout_us)
{
    const char *digits = (*n == '-' || *n == '+') ? n + 1 : n;
    apr_uint64_t v;
    const char *err;

    *timeout_us = 0;
    if (at_parse_uint(p, digits, 0,
                      -AT_PARSE_PRIORITY_MIN > AT_PARSE_PRIORITY_MAX
                          ? -AT_PARSE_PRIORITY_MIN
                          : AT_PARSE_PRIORITY_MAX,
                      &v) ||
        (*n == '-' ? -(int)v < AT_PARSE_PRIORITY_MIN : (int)v > AT_PARSE_PRIORITY_MAX)) {
        return apr_psprintf(p,
                            "'%s' is not a priority: an integer from %d to %d, "
                            "higher runs first",
                            n, AT_PARSE_PRIORITY_MIN, AT_PARSE_PRIORITY_MAX);
    }
    *priority = *n == '-' ? -(int)v : (int)v;
    if (!opt) {
        return NULL;
    }
    if (strncmp(opt, "timeout=", 8) != 0) {
        return apr_psprintf(p, "'%s' is not timeout=DURATION", opt);
    }
    if ((err = at_parse_duration(p, opt + 8, timeout_us))) {
        return apr_psprintf(p, "timeout: %s", err);
    }
    if (*timeout_us <= 0) {
        return "timeout: must be longer than 0";
    }
    return NULL;
}

static const char *parse_reserve(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    apr_uint64_t n;
    const char *err = at_parse_uint(p, v, 0, AT_LIMIT_MAX, &n);

    c->reserve = (apr_uint32_t)n;
    return err;
}

/* "TARGET" or "TARGET:INTERVAL". */
static const char *parse_codel(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    const char *colon = strchr(v, ':');
    const char *err;

    err = at_parse_duration(p, colon ? apr_pstrmemdup(p, v, (apr_size_t)(colon - v)) : v,
                            &c->codel_target_us);
    if (!err && c->codel_target_us <= 0) {
        err = "the target must be longer than 0";
    }
    if (!err && colon) {
        err = at_parse_duration(p, colon + 1, &c->codel_interval_us);
        if (!err && c->codel_interval_us <= 0) {
            err = "the interval must be longer than 0";
        }
    }
    return err ? apr_psprintf(p,
                              "%s (codel=TARGET or codel=TARGET:INTERVAL, e.g. "
                              "codel=200ms or codel=200ms:2s)",
                              err)
               : NULL;
}

/* cluster=NAME: a ThrottleCluster's name, which the glue looks up. */
static const char *parse_cluster(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    const char *err = at_parse_zone_name(p, v);

    c->cluster = err == NULL;
    return err;
}

static const char *parse_cluster_fallback(apr_pool_t *p, const char *v, at_zone_conf_t *c)
{
    (void)p;
    return at_cluster_parse_fallback(v, &c->cluster_fallback, &c->cluster_fallback_n);
}

/* The table, in the order of the directive's usage string (AT_ZONE_KEYS). */
#define AT_ZONE_KEY_ENTRY(name, syntax) {#name, parse_##name},
static const struct {
    const char *name;
    key_parser parse;
} zone_keys[] = {AT_ZONE_KEYS(AT_ZONE_KEY_ENTRY)};

/* "limit, min, …, key": every key, for the messages below */
#define AT_ZONE_KEY_NAME(name, syntax) #name ", "
#define KEY_LIST AT_ZONE_KEYS(AT_ZONE_KEY_NAME) "key"

#define NKEYS (sizeof(zone_keys) / sizeof(zone_keys[0]))

static size_t key_index(const char *name)
{
    size_t k;

    for (k = 0; k < NKEYS && strcmp(zone_keys[k].name, name) != 0; k++) {
    }
    return k;
}

static apr_uint32_t online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    return n > 0 ? (apr_uint32_t)n : 1;
}

apr_uint32_t at_conf_highest_limit(const at_zone_conf_t *c)
{
    return c->limit_auto ? c->limit_max : c->limit;
}

/* min and max (0 until given: both are at least 1) bound an automatic
 * limit, which starts at twice the CPUs. */
static const char *bound_auto_limit(apr_pool_t *p, at_zone_conf_t *c)
{
    apr_uint64_t start, top;

    if (!c->limit_auto) {
        c->max_from = AT_MAX_FIXED;
        return c->limit_min || c->limit_max ? "the keys 'min' and 'max' go with limit=auto"
                                            : NULL;
    }
    if (!c->limit_min) {
        c->limit_min = 1;
    }
    if (!c->limit_max) {
        top = (apr_uint64_t)online_cpus() * AT_AUTO_MAX_PER_CPU;
        c->limit_max = (apr_uint32_t)(top > AT_LIMIT_MAX ? AT_LIMIT_MAX : top);
        if (c->limit_max < c->limit_min) {
            c->limit_max = c->limit_min;
        }
        /* only a stand-in until post_config: it must not refuse a reserve
         * that the workers' share will hold */
        if (c->limit_max <= c->reserve) {
            c->limit_max = c->reserve < AT_LIMIT_MAX ? c->reserve + 1 : AT_LIMIT_MAX;
        }
        c->max_from = AT_MAX_FROM_CPUS;
    }
    if (c->limit_min > c->limit_max) {
        return apr_psprintf(p, "min (%u) is greater than max (%u)", c->limit_min,
                            c->limit_max);
    }
    c->cores = online_cpus();
    start = (apr_uint64_t)c->cores * AT_AUTO_START_PER_CPU;
    c->limit = (apr_uint32_t)(start < c->limit_min ? c->limit_min
                              : start > c->limit_max ? c->limit_max : start);
    return NULL;
}

const char *at_max_from_name(apr_uint32_t from)
{
    switch (from) {
    case AT_MAX_GIVEN: return "max=";
    case AT_MAX_FROM_CPUS: return "cpus";
    case AT_MAX_FIXED: return "limit=";
    default: return "workers";
    }
}

void at_conf_max_from_workers(at_zone_conf_t *c, apr_uint32_t workers)
{
    apr_uint32_t least = c->reserve + 1 > c->limit_min ? c->reserve + 1 : c->limit_min;

    if (!c->limit_auto || c->max_from == AT_MAX_GIVEN) {
        return;
    }
    if (c->queue_default && c->queue > workers / AT_AUTO_QUEUE_SHARE) {
        c->queue = workers / AT_AUTO_QUEUE_SHARE;
    }
    workers -= workers > c->queue ? c->queue : workers;
    c->limit_max = workers < least ? least : workers > AT_LIMIT_MAX ? AT_LIMIT_MAX : workers;
    c->max_from = AT_MAX_FROM_WORKERS;
    if (c->limit > c->limit_max) {
        c->limit = c->limit_max;
    }
}

const char *at_parse_zone_args(apr_pool_t *p, int argc,
                               const char *const *argv, at_zone_conf_t *out)
{
    at_zone_conf_t c = {.timeout_us = 4 * APR_INT64_C(1000000),
                        .retry_after = AT_RETRY_AFTER_AUTO,
                        .read_body = AT_READ_BODY_DEFAULT,
                        .read_body_total = AT_READ_BODY_TOTAL_DEFAULT,
                        .retry_after_max = AT_RETRY_AFTER_CEILING,
                        .refuse_status = AT_REFUSE_STATUS_DEFAULT,
                        .client_v6_prefix = AT_CLIENT_V6_PREFIX,
                        .rate = {.delay = AT_RATE_NODELAY}};
    int seen[NKEYS] = {0};
    const char *auto_err;
    int i;
    size_t k;

    for (i = 0; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        const char *key, *err;

        if (!eq || eq == argv[i]) {
            return apr_psprintf(p, "'%s' is not of the form key=value (keys: "
                                KEY_LIST ")", argv[i]);
        }
        key = apr_pstrmemdup(p, argv[i], (apr_size_t)(eq - argv[i]));
        for (k = 0; k < NKEYS; k++) {
            if (strcmp(key, zone_keys[k].name) == 0) {
                break;
            }
        }
        if (k == NKEYS) {
            return apr_psprintf(p, "unknown key '%s' in '%s' (keys: " KEY_LIST ")",
                                key, argv[i]);
        }
        if (seen[k]++) {
            return apr_psprintf(p, "key '%s' is given twice", key);
        }
        if (!eq[1]) {
            return apr_psprintf(p, "key '%s' has an empty value", key);
        }
        err = zone_keys[k].parse(p, eq + 1, &c);
        if (err) {
            return apr_psprintf(p, "key '%s' has a bad value: %s", key, err);
        }
    }
    if (!seen[key_index("limit")]) {
        return "the key 'limit' is required (e.g. limit=4 or limit=auto)";
    }
    if (seen[key_index("retry_after_max")] && c.retry_after != AT_RETRY_AFTER_AUTO) {
        return apr_psprintf(p, "retry_after_max bounds retry_after=auto; with "
                            "retry_after=%u it has nothing to bound", c.retry_after);
    }
    if (seen[key_index("per_client_v6")] && !c.per_client) {
        return "per_client_v6 goes with per_client=N";
    }
    if (seen[key_index("rate_delay")] && !c.rate.interval_ns) {
        return "rate_delay=N holds back requests beyond a rate: give rate=R/s:BURST too";
    }
    if (c.rate.delay != AT_RATE_NODELAY && c.rate.delay > c.rate.burst) {
        return apr_psprintf(p, "rate_delay=%u is more than the burst (%u): only requests "
                            "within the burst can wait their turn", c.rate.delay,
                            c.rate.burst);
    }
    if (seen[key_index("read_body_total")] && c.read_body_total < c.read_body) {
        return apr_psprintf(p, "read_body_total=%" APR_UINT64_T_FMT " is less than "
                            "read_body=%" APR_UINT64_T_FMT ": a body of read_body bytes "
                            "would never be read first", c.read_body_total, c.read_body);
    }
    if (c.per_client && c.per_key) {
        return "per_client and per_key count in the same table: give one of them "
               "(per_key=N key=%{REMOTE_ADDR} counts addresses too, but whole)";
    }
    if (seen[key_index("cluster_fallback")] && !c.cluster) {
        return "cluster_fallback= says what a cluster= zone runs without Redis: give "
               "cluster=NAME too";
    }
    if (c.cluster && c.per_client) {
        return "cluster= shares the zone's limit across servers, per_client counts on "
               "this server only: give one of them";
    }
    if (c.cluster && c.limit_auto) {
        return "cluster= takes a fixed limit (the fleet's total), not limit=auto";
    }
    if ((auto_err = bound_auto_limit(p, &c))) {
        return auto_err;
    }
    if (c.reserve && c.reserve >= at_conf_highest_limit(&c)) {
        return apr_psprintf(p,
                            "reserve=%u leaves no slot for requests of priority 0 "
                            "and below: it must be less than %s (%u)",
                            c.reserve, c.limit_auto ? "max" : "limit",
                            at_conf_highest_limit(&c));
    }
    if (c.order == AT_ORDER_LIFO && !c.codel_target_us) {
        return "order=lifo serves the newest first while the queue stands, which codel= "
               "tells: give codel=TARGET too";
    }
    if (c.codel_target_us && c.codel_target_us >= c.timeout_us) {
        return "codel's target must be shorter than the timeout: it cuts waits "
               "short of the timeout while the queue stands";
    }
    if (!seen[key_index("queue")]) {
        apr_uint64_t q = (apr_uint64_t)c.limit * 10;
        c.queue = (apr_uint32_t)(q > AT_QUEUE_MAX ? AT_QUEUE_MAX : q);
        c.queue_default = 1;
    }
    *out = c;
    return NULL;
}
