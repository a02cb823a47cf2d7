/*
 * Unit tests of rate=: the GCRA decisions on a simulated clock (the same
 * as nginx's limit_req: a burst of B lets B + 1 through at once, a refusal
 * spends nothing, rate_delay= holds back the part of the burst beyond it),
 * the table of buckets per key, the parser, and rate= in a real zone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <apr_general.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "at_log.h"
#include "at_rate.h"
#include "at_retry.h"
#include "at_zone.h"
#include "zone_test_util.h"

#define SEC APR_INT64_C(1000000000)
#define MSEC APR_INT64_C(1000000)

static apr_pool_t *pool;

/* rate=10/s:burst, rate_delay=delay (AT_RATE_NODELAY: none) */
static at_rate_conf_t conf10(apr_uint32_t burst, apr_uint32_t delay)
{
    at_rate_conf_t c = {.interval_ns = SEC / 10, .burst = burst, .delay = delay};
    return c;
}

/* Judges and, unless refused, spends: what a zone does with a request. */
static at_rate_verdict_t arrive(const at_rate_conf_t *c, apr_int64_t *tat,
                                apr_int64_t now, apr_int64_t *ns)
{
    at_rate_verdict_t v = at_rate_judge(c, *tat, now, ns);

    if (v != AT_RATE_REFUSE) {
        at_rate_spend(c, tat, now);
    }
    return v;
}

static void test_burst_lets_burst_plus_one_through_at_once(void **state)
{
    apr_uint32_t b;
    (void)state;

    for (b = 0; b <= 5; b++) {
        at_rate_conf_t c = conf10(b, AT_RATE_NODELAY);
        apr_int64_t tat = 0, now = 1000 * SEC, ns;
        apr_uint32_t i;

        for (i = 0; i <= b; i++) {
            assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_PASS);
        }
        assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_REFUSE);
        /* the next passes one interval on, exactly */
        assert_int_equal(ns, SEC / 10);
        assert_int_equal(arrive(&c, &tat, now + ns - 1, &ns), AT_RATE_REFUSE);
        assert_int_equal(arrive(&c, &tat, now + SEC / 10, &ns), AT_RATE_PASS);
    }
}

/* A refusal spends nothing: a client hammering the zone gets in at the rate. */
static void test_refusals_spend_nothing(void **state)
{
    at_rate_conf_t c = conf10(0, AT_RATE_NODELAY);
    apr_int64_t tat = 0, now = 5 * SEC, ns;
    int passed = 0, i;
    (void)state;

    /* 1,000 requests a second for 2 s: 20 pass, one each 100 ms */
    for (i = 0; i < 2000; i++) {
        passed += arrive(&c, &tat, now + i * MSEC, &ns) == AT_RATE_PASS;
    }
    assert_int_equal(passed, 20);
}

/* At the rate exactly, nothing is refused, burst or none; at twice the
 * rate, half. */
static void test_steady_rates(void **state)
{
    at_rate_conf_t c = conf10(0, AT_RATE_NODELAY);
    apr_int64_t tat = 0, now = SEC, ns;
    int passed = 0, i;
    (void)state;

    for (i = 0; i < 100; i++) {
        assert_int_equal(arrive(&c, &tat, now + i * (SEC / 10), &ns), AT_RATE_PASS);
    }
    tat = 0;
    now = 100 * SEC;
    for (i = 0; i < 100; i++) {
        passed += arrive(&c, &tat, now + i * (SEC / 20), &ns) == AT_RATE_PASS;
    }
    assert_int_equal(passed, 50);
}

/* rate_delay=1 with a burst of 3: two run at once, the next two wait one
 * and two intervals, the fifth is refused (nginx's delay=1). */
static void test_delay_holds_the_rest_of_the_burst(void **state)
{
    at_rate_conf_t c = conf10(3, 1);
    apr_int64_t tat = 0, now = SEC, ns;
    (void)state;

    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_PASS);
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_PASS);
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_WAIT);
    assert_int_equal(ns, SEC / 10);
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_WAIT);
    assert_int_equal(ns, 2 * SEC / 10);
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_REFUSE);
    assert_int_equal(ns, SEC / 10);
    /* rate_delay=0: all but the first wait */
    c = conf10(3, 0);
    tat = 0;
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_PASS);
    assert_int_equal(arrive(&c, &tat, now, &ns), AT_RATE_WAIT);
    assert_int_equal(ns, SEC / 10);
}

static void key_of(const char *text, at_client_key_t *k)
{
    at_client_table_t t = {0};

    at_client_key_from_text(&t, text, strlen(text), k);
}

static void test_keys_have_buckets_of_their_own(void **state)
{
    static at_rate_entry_t e[64];
    at_rate_table_t t;
    at_rate_conf_t c = conf10(0, AT_RATE_NODELAY);
    at_client_key_t a, b, none = {{0}};
    apr_int64_t now = SEC, ns, *ba, *bb;
    int forgot;
    (void)state;

    at_rate_table_init(&t, e, 64);
    key_of("alice", &a);
    key_of("bob", &b);
    ba = at_rate_bucket(&t, &a, now, &forgot);
    assert_non_null(ba);
    assert_int_equal(arrive(&c, ba, now, &ns), AT_RATE_PASS);
    assert_ptr_equal(at_rate_bucket(&t, &a, now, &forgot), ba);
    assert_int_equal(arrive(&c, ba, now, &ns), AT_RATE_REFUSE);
    bb = at_rate_bucket(&t, &b, now, &forgot);
    assert_ptr_not_equal(bb, ba);
    assert_int_equal(arrive(&c, bb, now, &ns), AT_RATE_PASS);
    assert_null(at_rate_bucket(&t, &none, now, &forgot)); /* nobody: not limited */
    assert_int_equal(at_rate_keys_in(&t, now), 2);
    assert_int_equal(at_rate_keys_in(&t, now + SEC), 0); /* emptied by the clock alone */
}

/* A full table forgets the key whose bucket empties soonest, and says so;
 * an empty bucket is taken without forgetting anyone. */
static void test_full_table_forgets_the_soonest_empty(void **state)
{
    static at_rate_entry_t e[AT_RATE_WAYS];
    at_rate_table_t t;
    at_rate_conf_t c = conf10(0, AT_RATE_NODELAY);
    at_client_key_t k[AT_RATE_WAYS + 1];
    apr_int64_t now = SEC, ns, *bk;
    char name[16];
    int forgot, i;
    (void)state;

    at_rate_table_init(&t, e, AT_RATE_WAYS); /* one set of places: all keys meet */
    for (i = 0; i <= AT_RATE_WAYS; i++) {
        snprintf(name, sizeof(name), "key%d", i);
        key_of(name, &k[i]);
    }
    for (i = 0; i < AT_RATE_WAYS; i++) {
        bk = at_rate_bucket(&t, &k[i], now + i * MSEC, &forgot);
        assert_false(forgot);
        arrive(&c, bk, now + i * MSEC, &ns);
    }
    /* key0 spent first: its bucket empties first, and it is the one forgotten */
    bk = at_rate_bucket(&t, &k[AT_RATE_WAYS], now + 50 * MSEC, &forgot);
    assert_true(forgot);
    assert_int_equal(arrive(&c, bk, now + 50 * MSEC, &ns), AT_RATE_PASS);
    for (i = 1; i < AT_RATE_WAYS; i++) {
        bk = at_rate_bucket(&t, &k[i], now + 50 * MSEC, &forgot);
        assert_false(forgot);
        assert_int_equal(at_rate_judge(&c, *bk, now + 50 * MSEC, &ns), AT_RATE_REFUSE);
    }
    /* once buckets empty, a new key takes one without forgetting */
    bk = at_rate_bucket(&t, &k[0], now + SEC, &forgot);
    assert_false(forgot);
}

static const char *parse(at_zone_conf_t *c, const char *a, const char *b)
{
    const char *argv[3] = {"limit=4", a, b};

    return at_parse_zone_args(pool, b ? 3 : 2, argv, c);
}

static void test_parse_rates(void **state)
{
    at_zone_conf_t c;
    (void)state;

    assert_null(parse(&c, "rate=10/s", NULL));
    assert_int_equal(c.rate.interval_ns, SEC / 10);
    assert_int_equal(c.rate.burst, 0);
    assert_int_equal(c.rate.delay, AT_RATE_NODELAY);
    assert_null(parse(&c, "rate=600/m:20", NULL));
    assert_int_equal(c.rate.interval_ns, SEC / 10);
    assert_int_equal(c.rate.burst, 20);
    assert_null(parse(&c, "rate=5r/s:3", "rate_delay=2")); /* nginx's spelling too */
    assert_int_equal(c.rate.interval_ns, SEC / 5);
    assert_int_equal(c.rate.delay, 2);
    assert_null(parse(&c, "queue=1", NULL));
    assert_int_equal(c.rate.interval_ns, 0); /* no rate by default */

    assert_non_null(strstr(parse(&c, "rate=10", NULL), "R/s or R/m"));
    assert_non_null(strstr(parse(&c, "rate=0/s", NULL), "from 1 to"));
    assert_non_null(
        strstr(parse(&c, "rate=10/h", NULL), "per second (/s) or per minute"));
    assert_non_null(strstr(parse(&c, "rate=10/s:x", NULL), "burst must be"));
    assert_non_null(strstr(parse(&c, "rate_delay=1", NULL), "give rate=R/s:BURST"));
    assert_non_null(
        strstr(parse(&c, "rate=10/s:2", "rate_delay=3"), "more than the burst"));
}

static at_zone_t *rate_zone(const char *rate, const char *delay, int keyed)
{
    at_zone_conf_t c;
    const char *argv[4] = {"limit=8", "queue=8", rate, delay};

    assert_null(at_parse_zone_args(pool, delay ? 4 : 3, argv, &c));
    c.keyed = (apr_uint32_t)keyed;
    return zone_new_conf(&c);
}

static at_result_t take(at_zone_t *z, const at_client_key_t *k, at_ticket_t *t)
{
    at_result_t r = at_zone_acquire_for(z, t, k, NULL, NULL);

    if (r == AT_ADMITTED || r == AT_QUEUED) {
        at_zone_release(z, t);
    }
    return r;
}

/* rate=1/m:1: two at once, the third refused with Retry-After of the
 * minute less what has passed, counted. */
static void test_zone_refuses_beyond_the_burst(void **state)
{
    at_zone_t *z = rate_zone("rate=1/m:1", NULL, 0);
    at_ticket_t t;
    (void)state;

    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_REJECTED_RATE);
    assert_int_equal(t.retry_after, 60);
    assert_int_equal(stats_of(z).counters.rejected_rate, 1);
    assert_int_equal(stats_of(z).counters.admitted, 2);
    zone_free(z);
}

/* Per key: one key's bucket empty does not stop another, nor requests with
 * no key. */
static void test_zone_rate_per_key(void **state)
{
    at_zone_t *z = rate_zone("rate=1/m", NULL, 1);
    at_client_key_t a, b;
    at_ticket_t t;
    (void)state;

    at_zone_key_from_text(z, "alice", 5, &a);
    at_zone_key_from_text(z, "bob", 3, &b);
    assert_int_equal(take(z, &a, &t), AT_ADMITTED);
    assert_int_equal(take(z, &a, &t), AT_REJECTED_RATE);
    assert_int_equal(take(z, &b, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(stats_of(z).rate_keys_in, 2);
    zone_free(z);
}

/* A request refused for want of a slot spends none of the rate. */
static void test_zone_full_refusal_spends_no_rate(void **state)
{
    at_zone_conf_t c;
    const char *argv[3] = {"limit=1", "queue=0", "rate=1/m:1"};
    at_zone_t *z;
    at_ticket_t hold, t;
    (void)state;

    assert_null(at_parse_zone_args(pool, 3, argv, &c));
    z = zone_new_conf(&c);
    assert_int_equal(at_zone_acquire(z, &hold, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_FULL);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_REJECTED_FULL);
    at_zone_release(z, &hold);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED); /* the burst's second */
    assert_int_equal(take(z, NULL, &t), AT_REJECTED_RATE);
    zone_free(z);
}

/* rate_delay=0 at 2/s with a burst of 2: the second and third wait their
 * turns, one and two intervals after the first arrived. Held from before
 * the first arrives to each one's return, so that a request slow to
 * arrive (and so owed a shorter wait) changes nothing. */
static void test_zone_delay_waits_its_turn(void **state)
{
    at_zone_t *z = rate_zone("rate=2/s:2", "rate_delay=0", 0);
    at_ticket_t t;
    apr_int64_t t0 = at_now_us();
    (void)state;

    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_true(at_now_us() - t0 >= 500000);
    assert_true(t.wait_us > 0);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_true(at_now_us() - t0 >= 1000000);
    assert_true(t.wait_us > 0);
    assert_int_equal(stats_of(z).counters.rate_delayed, 2);
    zone_free(z);
}

/* A wait longer than the request's timeout is refused at once: well
 * before the timeout it would otherwise have waited out. */
static void test_zone_delay_beyond_timeout_refused(void **state)
{
    at_zone_conf_t c;
    const char *argv[5] = {"limit=8", "queue=8", "timeout=30s", "rate=1/m:5",
                           "rate_delay=0"};
    at_zone_t *z;
    at_ticket_t t;
    (void)state;

    assert_null(at_parse_zone_args(pool, 5, argv, &c));
    z = zone_new_conf(&c);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(take(z, NULL, &t), AT_REJECTED_RATE);
    assert_true(t.wait_us < 15000000);
    assert_int_equal(t.retry_after, 60);
    zone_free(z);
}

/* A dry run never refuses for the rate: it runs, and counts what it would
 * have done. */
static void test_zone_dry_run_counts_rate_refusals(void **state)
{
    at_zone_conf_t c;
    const char *argv[4] = {"limit=8", "queue=8", "rate=1/m", "dry_run=on"};
    at_zone_t *z;
    at_ticket_t t;
    at_zone_stats_t s;
    (void)state;

    assert_null(at_parse_zone_args(pool, 4, argv, &c));
    z = zone_new_conf(&c);
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_DRY_RUN_REJECTED);
    at_zone_release(z, &t);
    s = stats_of(z);
    assert_int_equal(s.counters.dry_run_rejected, 1);
    assert_int_equal(s.counters.rejected_rate, 0);
    assert_int_equal(s.over_cap, 0);
    zone_free(z);
}

/* ---- rate= refusals are the key's own share, not the zone's saturation -- */

/* A zone with rate=1/m per key and retry_after=auto (limit=auto too if
 * asked), in which only the abusive key is ever refused. */
static at_zone_t *shared_zone(int limit_auto)
{
    at_zone_conf_t c;
    const char *argv[5] = {"queue=8", "rate=1/m", "timeout=10s",
                           limit_auto ? "limit=auto" : "limit=4", "max=8"};

    assert_null(at_parse_zone_args(pool, limit_auto ? 5 : 4, argv, &c));
    c.keyed = 1;
    return zone_new_conf(&c);
}

/* Refuses one key's requests, n of them, for the rate. */
static void abuse(at_zone_t *z, const at_client_key_t *k, int n)
{
    at_ticket_t t;

    for (int i = 0; i < n; i++) {
        assert_int_equal(take(z, k, &t), AT_REJECTED_RATE);
    }
}

/* One key refused 50 times for the rate in a window of retry_after=auto,
 * one grant to others: the advice stays at its floor (1 s: no queue), for
 * every draw of its spread. Counted as the zone's refusals, 50 against 1
 * doubled it, and a draw of 0.5 - 1.5 x 2 s says 2 or 3 most of the time. */
static void test_rate_refusals_leave_retry_after_alone(void **state)
{
    at_zone_t *z = shared_zone(0);
    at_client_key_t k;
    at_ticket_t t;
    apr_uint32_t most = 0;
    (void)state;

    at_zone_key_from_text(z, "abuser", 6, &k);
    assert_int_equal(take(z, &k, &t), AT_ADMITTED); /* opens the window */
    abuse(z, &k, 50);
    usleep(AT_RETRY_WINDOW_MIN_US + 100000); /* sleeps run long, never short */
    assert_int_equal(take(z, NULL, &t), AT_ADMITTED); /* closes it */
    for (int i = 0; i < 50; i++) {
        apr_uint32_t r = at_zone_retry_after(z);

        most = r > most ? r : most;
    }
    assert_int_equal(stats_of(z).counters.rejected_rate, 50);
    assert_int_equal(most, 1);
    zone_free(z);
}

/* The share of each window limit=auto judged that it saw requests
 * waiting (1 if one was refused): its trace1 line ends "N% waiting". */
enum { MAX_WINDOWS = 64 };
static double window_waiting[MAX_WINDOWS];
static int windows_seen;

static void capture_waiting(int level, const char *msg)
{
    const char *end = strstr(msg, "% waiting"), *p = end;

    if (level != AT_LOG_TRACE1 || !end || windows_seen >= MAX_WINDOWS) {
        return;
    }
    while (p > msg && p[-1] != ' ') {
        p--;
    }
    window_waiting[windows_seen++] = atof(p) / 100;
}

typedef struct {
    at_zone_t *z;
    const at_client_key_t *key;
    apr_int64_t until_us;
    int hold_us;
} load_t;

/* Requests one after another until until_us, each holding its slot
 * hold_us (0: refused ones, retried after 1 ms). */
static void *load(void *arg)
{
    load_t *l = arg;

    while (at_now_us() < l->until_us) {
        at_ticket_t t;
        at_result_t r = at_zone_acquire_for(l->z, &t, l->key, NULL, NULL);

        if (r == AT_ADMITTED || r == AT_QUEUED) {
            usleep(l->hold_us);
            at_zone_release(l->z, &t);
        }
        else {
            usleep(1000);
        }
    }
    return NULL;
}

/* limit=auto with one request at a time of requests without a key, far
 * below the limit, beside one key refused for the rate every millisecond:
 * the zone is not saturated, and no window it judges says it was. */
static void test_rate_refusals_are_not_saturation(void **state)
{
    at_zone_t *z = shared_zone(1);
    at_client_key_t k;
    apr_int64_t until = at_now_us() + 2500000;
    load_t good = {z, NULL, until, 10000}, bad = {z, &k, until, 0};
    pthread_t th[2];
    int saturated = 0;
    (void)state;

    at_zone_key_from_text(z, "abuser", 6, &k);
    windows_seen = 0;
    at_set_logger(capture_waiting);
    pthread_create(&th[0], NULL, load, &good);
    pthread_create(&th[1], NULL, load, &bad);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    at_set_logger(NULL);
    for (int i = 0; i < windows_seen; i++) {
        print_message("  window %d: %.0f%% waiting\n", i, 100 * window_waiting[i]);
        saturated += window_waiting[i] >= 0.5;
    }
    assert_true(stats_of(z).counters.rejected_rate > 100);
    assert_true(windows_seen >= 1);
    assert_int_equal(saturated, 0);
    zone_free(z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_lets_burst_plus_one_through_at_once),
        cmocka_unit_test(test_refusals_spend_nothing),
        cmocka_unit_test(test_steady_rates),
        cmocka_unit_test(test_delay_holds_the_rest_of_the_burst),
        cmocka_unit_test(test_keys_have_buckets_of_their_own),
        cmocka_unit_test(test_full_table_forgets_the_soonest_empty),
        cmocka_unit_test(test_parse_rates),
        cmocka_unit_test(test_zone_refuses_beyond_the_burst),
        cmocka_unit_test(test_zone_rate_per_key),
        cmocka_unit_test(test_zone_full_refusal_spends_no_rate),
        cmocka_unit_test(test_zone_delay_waits_its_turn),
        cmocka_unit_test(test_zone_delay_beyond_timeout_refused),
        cmocka_unit_test(test_zone_dry_run_counts_rate_refusals),
        cmocka_unit_test(test_rate_refusals_leave_retry_after_alone),
        cmocka_unit_test(test_rate_refusals_are_not_saturation),
    };
    int rc;

    apr_initialize();
    apr_pool_create(&pool, NULL);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    apr_pool_destroy(pool);
    apr_terminate();
    return rc;
}
