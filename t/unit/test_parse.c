/*
 * Unit tests of ThrottleZone argument parsing: accepted inputs give the
 * documented values and defaults; refused ones give a message naming the
 * offending key and value.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <apr_general.h>
#include <apr_strings.h>
#include <string.h>
#include <unistd.h>

#include "at_parse.h"

static apr_pool_t *pool;

static const char *parse_line(const char *line, at_zone_conf_t *c)
{
    char *copy = apr_pstrdup(pool, line), *last, *w;
    const char *argv[16];
    int argc = 0;

    for (w = apr_strtok(copy, " ", &last); w && argc < 16;
         w = apr_strtok(NULL, " ", &last)) {
        argv[argc++] = w;
    }
    return at_parse_zone_args(pool, argc, argv, c);
}

static void test_defaults(void **state)
{
    at_zone_conf_t c;
    (void)state;

    assert_null(parse_line("limit=4", &c));
    assert_int_equal(c.limit, 4);
    assert_int_equal(c.queue, 40);
    assert_int_equal(c.timeout_us, 4000000);
    assert_int_equal(c.retry_after, AT_RETRY_AFTER_AUTO);
    assert_int_equal(c.read_body, 64 * 1024);
    assert_int_equal(c.read_body_total, 16 * 1024 * 1024);
    assert_int_equal(c.retry_after_max, 30);
    assert_int_equal(c.client_v6_prefix, 64);

    assert_null(parse_line("limit=100000", &c));
    assert_int_equal(c.queue, AT_QUEUE_MAX); /* 10 x limit, capped */
}

static void test_accepted(void **state)
{
    at_zone_conf_t c;
    (void)state;

    assert_null(parse_line("timeout=500ms queue=0 limit=2 retry_after=7", &c));
    assert_int_equal(c.limit, 2);
    assert_int_equal(c.queue, 0);
    assert_int_equal(c.timeout_us, 500000);
    assert_int_equal(c.retry_after, 7);

    assert_null(parse_line("limit=1 timeout=1m retry_after=auto", &c));
    assert_int_equal(c.timeout_us, 60000000);
    assert_null(parse_line("limit=1 timeout=3", &c));
    assert_int_equal(c.timeout_us, 3000000);
    assert_null(parse_line("limit=1 timeout=1h", &c));
    assert_int_equal(c.timeout_us, APR_INT64_C(3600000000));
    assert_null(parse_line("limit=1 timeout=1ms", &c));
    assert_int_equal(c.timeout_us, 1000);
    assert_null(parse_line("limit=007", &c));
    assert_int_equal(c.limit, 7);
    assert_int_equal(c.dry_run, 0);
    assert_null(parse_line("limit=1 dry_run=on", &c));
    assert_int_equal(c.dry_run, 1);
    assert_null(parse_line("limit=1 dry_run=OFF", &c));
    assert_int_equal(c.dry_run, 0);
    assert_int_equal(c.limit_auto, 0);
    assert_null(parse_line("limit=3 per_client=2", &c));
    assert_int_equal(c.per_client, 2);
    assert_int_equal(c.per_key, 0);
    assert_int_equal(c.mem_bytes, 0);
    assert_int_equal(c.order, AT_ORDER_FIFO);
    assert_null(parse_line("limit=3 codel=100ms order=LIFO", &c));
    assert_int_equal(c.order, AT_ORDER_LIFO);
    assert_null(parse_line("limit=3 per_key=2", &c));
    assert_int_equal(c.per_key, 2);
    assert_int_equal(c.per_client, 0);
}

static void test_mem_sizes(void **state)
{
    static const struct {
        const char *line;
        apr_uint64_t bytes;
    } ok[] = {
        {"limit=1 mem=200M", APR_UINT64_C(200) << 20},
        {"limit=1 mem=200m", APR_UINT64_C(200) << 20},
        {"limit=1 mem=200MB", APR_UINT64_C(200) << 20},
        {"limit=1 mem=200MiB", APR_UINT64_C(200) << 20},
        {"limit=1 mem=1G", APR_UINT64_C(1) << 30},
        {"limit=1 mem=2t", APR_UINT64_C(2) << 40},
        {"limit=1 mem=512k", APR_UINT64_C(512) << 10},
        {"limit=1 mem=65536", 65536},
        {"limit=1 mem=1024T", APR_UINT64_C(1) << 50},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        at_zone_conf_t c;
        const char *err = parse_line(ok[i].line, &c);

        if (err || c.mem_bytes != ok[i].bytes) {
            fail_msg("'%s' gave %s, %llu bytes", ok[i].line, err ? err : "no error",
                     (unsigned long long)c.mem_bytes);
        }
    }
}

static void test_auto_limit(void **state)
{
    apr_uint32_t cpus = (apr_uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    at_zone_conf_t c;
    (void)state;

    assert_null(parse_line("limit=auto", &c));
    assert_int_equal(c.limit_auto, 1);
    assert_int_equal(c.limit_min, 1);
    assert_int_equal(c.limit_max, AT_AUTO_MAX_PER_CPU * cpus);
    assert_int_equal(c.limit, AT_AUTO_START_PER_CPU * cpus); /* where it starts */
    assert_int_equal(c.cores, cpus); /* where a shed stops */
    assert_int_equal(c.queue, 10 * c.limit);
    assert_null(parse_line("limit=AUTO min=50 max=60", &c));
    assert_int_equal(c.limit, 50); /* the start is kept within the bounds */
    assert_null(parse_line("limit=auto min=1 max=1", &c));
    assert_int_equal(c.limit, 1);
}

/* limit=auto without max=: the workers the server leaves the zone, told at
 * post_config, split between its queue and its max. */
static void test_auto_max_from_workers(void **state)
{
    at_zone_conf_t c;
    apr_uint32_t start;
    (void)state;

    assert_null(parse_line("limit=auto", &c));
    assert_int_equal(c.max_from, AT_MAX_FROM_CPUS);
    start = c.limit;
    at_conf_max_from_workers(&c, 400);
    assert_int_equal(c.max_from, AT_MAX_FROM_WORKERS);
    /* a default queue: 10 x the start, at most a quarter; max the rest */
    assert_int_equal(c.queue, 10 * start < 100 ? 10 * start : 100);
    assert_int_equal(c.limit_max + c.queue, 400);
    assert_true(c.limit <= c.limit_max);
    assert_string_equal(at_max_from_name(c.max_from), "workers");

    assert_null(parse_line("limit=auto queue=300", &c)); /* a queue given is kept */
    at_conf_max_from_workers(&c, 400);
    assert_int_equal(c.queue, 300);
    assert_int_equal(c.limit_max, 100);

    assert_null(parse_line("limit=auto min=2 reserve=10", &c)); /* never below */
    at_conf_max_from_workers(&c, 8);
    assert_int_equal(c.limit_max, 11);
    assert_int_equal(c.queue, 2);
    assert_true(c.limit <= c.limit_max && c.limit >= c.limit_min);

    /* a reserve beyond 16 x the CPUs is not refused before the share is known */
    assert_null(parse_line("limit=auto reserve=5000", &c));
    at_conf_max_from_workers(&c, 400);
    assert_int_equal(c.limit_max, 5001);
    /* one at the top of what a limit may be leaves no slot: refused, and the
     * stand-in max never passes the top (the fuzzer's find) */
    assert_non_null(parse_line("limit=auto min=44 reserve=100000", &c));
    assert_null(parse_line("limit=auto reserve=99999", &c));
    assert_true(c.limit_max <= AT_LIMIT_MAX && c.limit <= c.limit_max);

    assert_null(parse_line("limit=auto max=64", &c)); /* given: untouched */
    at_conf_max_from_workers(&c, 400);
    assert_int_equal(c.limit_max, 64);
    assert_int_equal(c.max_from, AT_MAX_GIVEN);
    assert_string_equal(at_max_from_name(c.max_from), "max=");

    assert_null(parse_line("limit=8", &c)); /* fixed: untouched */
    at_conf_max_from_workers(&c, 400);
    assert_int_equal(c.limit, 8);
    assert_int_equal(c.queue, 80);
}

static void test_refused(void **state)
{
    static const struct {
        const char *line;
        const char *must_mention;
    } bad[] = {
        {"", "limit"},
        {"queue=4", "limit"},
        {"limit=0", "0"},
        {"limit=-1", "-1"},
        {"limit=abc", "abc"},
        {"limit=1.5", "1.5"},
        {"limit=2 min=1", "min"},
        {"limit=2 max=9", "max"},
        {"limit=auto min=0", "0"},
        {"limit=auto max=100001", "100001"},
        {"limit=auto min=9 max=3", "greater than max"},
        {"limit=auto min=two", "two"},
        {"limit=1 per_client=0", "0"},
        {"limit=100001", "100001"},
        {"limit=99999999999999999999999", "99999999999999999999999"},
        {"limit=4x", "4x"},
        {"limit= ", "limit"},
        {"limit=", "limit"},
        {"limit", "limit"},
        {"=3", "=3"},
        {"limit=1 limit=2", "twice"},
        {"limit=1 queue=-1", "-1"},
        {"limit=1 queue=100001", "100001"},
        {"limit=1 queue=ten", "ten"},
        {"limit=1 timeout=0", "0"},
        {"limit=1 timeout=0ms", "0ms"},
        {"limit=1 timeout=5x", "5x"},
        {"limit=1 timeout=ms", "ms"},
        {"limit=1 timeout=2h", "2h"},
        {"limit=1 timeout=-1s", "-1s"},
        {"limit=1 timeout=1.5s", "1.5s"},
        {"limit=1 timeout=99999999999999999999s", "99999999999999999999s"},
        {"limit=1 retry_after=0", "0"},
        {"limit=1 retry_after=abc", "abc"},
        {"limit=1 retry_after=86401", "86401"},
        {"limit=1 foo=1", "foo"},
        {"limit=1 Limit=2", "Limit"},
        {"limit=1 dry_run=yes", "yes"},
        {"limit=1 dry_run=1", "1"},
        {"limit=1 mem=0", "0"},
        {"limit=1 mem=0M", "0M"},
        {"limit=1 mem=200X", "unknown unit 'X'"},
        {"limit=1 mem=200MX", "200MX"},
        {"limit=1 mem=1.5G", "1.5G"},
        {"limit=1 mem=-1M", "-1M"},
        {"limit=1 mem=M", "M"},
        {"limit=1 mem=1025T", "1025T"},
        {"limit=1 mem=99999999999999999999999", "99999999999999999999999"},
        {"limit=1 read_body=-1", "-1"},
        {"limit=1 read_body=17M", "17M"},
        {"limit=1 read_body=lots", "lots"},
        {"limit=1 read_body_total=0", "0"},
        {"limit=1 read_body_total=1k read_body=4k", "would never be read first"},
        {"limit=1 read_body_total=32k", "less than read_body=65536"},
        {"limit=1 retry_after_max=0", "0"},
        {"limit=1 retry_after_max=86401", "86401"},
        {"limit=1 retry_after=5 retry_after_max=10", "retry_after=5"},
        {"limit=1 per_client=1 per_client_v6=/31", "/31"},
        {"limit=1 per_client=1 per_client_v6=/129", "/129"},
        {"limit=1 per_client=1 per_client_v6=//64", "//64"},
        {"limit=1 per_client_v6=/64", "per_client=N"},
        {"limit=1 per_key=0", "0"},
        {"limit=1 per_key=many", "many"},
        {"limit=2 per_client=1 per_key=1", "give one of them"},
        {"limit=2 order=lifo", "codel="},
        {"limit=2 codel=100ms order=random", "neither fifo nor lifo"},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        at_zone_conf_t c;
        const char *err = parse_line(bad[i].line, &c);

        if (!err || !strstr(err, bad[i].must_mention)) {
            fail_msg("'%s' gave %s", bad[i].line, err ? err : "no error");
        }
    }
}

static void test_hardening_keys(void **state)
{
    at_zone_conf_t c;
    (void)state;

    assert_null(parse_line("limit=2 read_body=0", &c));
    assert_int_equal(c.read_body, 0);
    assert_null(parse_line("limit=2 read_body=1M retry_after_max=120", &c));
    assert_int_equal(c.read_body, 1024 * 1024);
    assert_int_equal(c.retry_after_max, 120);
    assert_null(parse_line("limit=2 read_body=1M read_body_total=1M", &c));
    assert_int_equal(c.read_body_total, 1024 * 1024);
    assert_null(parse_line("limit=2 read_body_total=2G", &c));
    assert_int_equal(c.read_body_total, APR_UINT64_C(2) << 30);
    assert_null(parse_line("limit=2 per_client=1 per_client_v6=/128", &c));
    assert_int_equal(c.client_v6_prefix, 128);
    assert_null(parse_line("limit=2 per_client=1 per_client_v6=48", &c));
    assert_int_equal(c.client_v6_prefix, 48);
}

static void test_refusal_status(void **state)
{
    static const char *const bad[] = {"status=500", "status=200", "status=4290",
                                      "status=", "status=too_many"};
    at_zone_conf_t c;
    size_t i;
    (void)state;

    assert_null(parse_line("limit=2", &c));
    assert_int_equal(c.refuse_status, 503);
    assert_null(parse_line("limit=2 status=429", &c));
    assert_int_equal(c.refuse_status, 429);
    assert_null(parse_line("limit=2 status=503", &c));
    assert_int_equal(c.refuse_status, 503);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *err = parse_line(apr_pstrcat(pool, "limit=2 ", bad[i], NULL), &c);

        if (!err || !strstr(err, "status")) {
            fail_msg("'%s' gave %s", bad[i], err ? err : "no error");
        }
    }
}

static void test_reserve_and_codel(void **state)
{
    static const char *const bad[] = {
        "limit=4 reserve=4",          "limit=4 reserve=-1",
        "limit=auto max=3 reserve=3", "limit=4 codel=0ms",
        "limit=4 codel=soon",         "limit=4 codel=100ms:",
        "limit=4 codel=100ms:0",      "limit=4 timeout=1s codel=1s",
        "limit=4 codel=200ms:2s:3s"};
    at_zone_conf_t c;
    size_t i;
    (void)state;

    assert_null(parse_line("limit=4", &c));
    assert_int_equal(c.reserve, 0);
    assert_int_equal(c.codel_target_us, 0);
    assert_null(parse_line("limit=4 reserve=3 codel=200ms", &c));
    assert_int_equal(c.reserve, 3);
    assert_int_equal(c.codel_target_us, 200000);
    assert_int_equal(c.codel_interval_us, 0);
    assert_null(parse_line("limit=auto max=8 reserve=2 codel=50ms:2s", &c));
    assert_int_equal(c.reserve, 2);
    assert_int_equal(c.codel_target_us, 50000);
    assert_int_equal(c.codel_interval_us, 2000000);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *err = parse_line(bad[i], &c);

        if (!err || !(strstr(err, "reserve") || strstr(err, "codel"))) {
            fail_msg("'%s' gave %s", bad[i], err ? err : "no error");
        }
    }
}

static void test_priority(void **state)
{
    static const char *const bad[][2] = {
        {"11", NULL},  {"-11", NULL},      {"high", NULL},        {"", NULL},
        {"1.5", NULL}, {"3", "timeout=0"}, {"3", "timeout=soon"}, {"3", "wait=2s"}};
    apr_int64_t tmo;
    int prio;
    size_t i;
    (void)state;

    assert_null(at_parse_priority(pool, "10", NULL, &prio, &tmo));
    assert_int_equal(prio, 10);
    assert_int_equal(tmo, 0);
    assert_null(at_parse_priority(pool, "-10", "timeout=250ms", &prio, &tmo));
    assert_int_equal(prio, -10);
    assert_int_equal(tmo, 250000);
    assert_null(at_parse_priority(pool, "+2", NULL, &prio, &tmo));
    assert_int_equal(prio, 2);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (!at_parse_priority(pool, bad[i][0], bad[i][1], &prio, &tmo)) {
            fail_msg("'%s %s' was accepted", bad[i][0], bad[i][1] ? bad[i][1] : "");
        }
    }
}

static void test_zone_names(void **state)
{
    (void)state;
    assert_null(at_parse_zone_name(pool, "web_1-x"));
    assert_null(at_parse_zone_name(pool, "A"));
    assert_non_null(at_parse_zone_name(pool, ""));
    assert_non_null(at_parse_zone_name(pool, "off"));
    assert_non_null(at_parse_zone_name(pool, "OFF"));
    assert_non_null(at_parse_zone_name(pool, "a b"));
    assert_non_null(at_parse_zone_name(pool, "a/b"));
    assert_non_null(at_parse_zone_name(pool, "caf\xc3\xa9"));
    assert_non_null(at_parse_zone_name(
        pool, "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghi")); /* 49 */
    assert_null(at_parse_zone_name(
        pool, "abcdefghijabcdefghijabcdefghijabcdefghijabcdefgh")); /* 48 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_accepted),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_auto_limit),
        cmocka_unit_test(test_auto_max_from_workers),
        cmocka_unit_test(test_mem_sizes),
        cmocka_unit_test(test_zone_names),
        cmocka_unit_test(test_hardening_keys),
        cmocka_unit_test(test_refusal_status),
        cmocka_unit_test(test_reserve_and_codel),
        cmocka_unit_test(test_priority),
    };
    int rc;

    apr_initialize();
    apr_pool_create(&pool, NULL);
    rc = cmocka_run_group_tests_name("parse", tests, NULL, NULL);
    apr_terminate();
    return rc;
}
