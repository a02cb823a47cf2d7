/*
 * Unit tests of per_client: the count of requests each client address has
 * running or waiting, kept in a table in the zone, and what comes back when
 * a process dies.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <apr_pools.h>

#include "at_zone.h"
#include "zone_test_util.h"

#define MS 1000

/* A zone whose requests are limited per client, or per key (the other 0). */
static at_zone_t *zone_shared_by(apr_uint32_t limit, apr_uint32_t queue,
                                 apr_uint32_t per_client, apr_uint32_t per_key)
{
    at_zone_conf_t c = {.limit = limit, .queue = queue, .timeout_us = 10000 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO, .per_client = per_client,
                        .per_key = per_key};

    return zone_new_conf(&c);
}

static at_zone_t *zone_per_client(apr_uint32_t limit, apr_uint32_t queue,
                                  apr_uint32_t per_client)
{
    return zone_shared_by(limit, queue, per_client, 0);
}

static at_zone_t *zone_per_key(apr_uint32_t limit, apr_uint32_t queue, apr_uint32_t per_key)
{
    return zone_shared_by(limit, queue, 0, per_key);
}

static at_client_key_t key_of(unsigned n)
{
    at_client_key_t k;

    memset(&k, 0, sizeof(k));
    k.b[10] = k.b[11] = 0xff;
    k.b[12] = 10;
    k.b[13] = (unsigned char)(n >> 16);
    k.b[14] = (unsigned char)(n >> 8);
    k.b[15] = (unsigned char)n;
    return k;
}

static at_client_key_t text_key(at_zone_t *z, const char *text)
{
    at_client_key_t k;

    at_zone_key_from_text(z, text, strlen(text), &k);
    return k;
}

typedef struct {
    at_zone_t *z;
    at_client_key_t key;
    at_result_t result;
    at_ticket_t t;
} waiter_t;

static void *wait_then_release(void *arg)
{
    waiter_t *w = arg;

    w->result = at_zone_acquire_for(w->z, &w->t, &w->key, NULL, NULL);
    if (w->result == AT_QUEUED || w->result == AT_ADMITTED) {
        at_zone_release(w->z, &w->t);
    }
    return NULL;
}

/* Running and waiting both count; another client is not affected. */
static void test_running_and_waiting_count(void **state)
{
    at_zone_t *z = zone_per_client(1, 10, 2);
    at_client_key_t a = key_of(1), b = key_of(2);
    at_ticket_t hold, t;
    waiter_t w = {z, a, AT_ERROR, {0}};
    waiter_t wb = {z, b, AT_ERROR, {0}};
    pthread_t th, thb;
    (void)state;

    assert_int_equal(at_zone_acquire_for(z, &hold, &a, NULL, NULL), AT_ADMITTED);
    pthread_create(&th, NULL, wait_then_release, &w);
    wait_until_queued(z, 1);
    /* a: one running, one waiting = 2: the third is refused at once... */
    assert_int_equal(at_zone_acquire_for(z, &t, &a, NULL, NULL), AT_REJECTED_CLIENT);
    /* ...while b may still queue behind them. */
    pthread_create(&thb, NULL, wait_then_release, &wb);
    wait_until_queued(z, 2);
    assert_int_equal(stats_of(z).counters.rejected_client, 1);
    assert_int_equal(stats_of(z).clients, 2);
    at_zone_release(z, &hold);
    pthread_join(th, NULL);
    pthread_join(thb, NULL);
    assert_int_equal(w.result, AT_QUEUED);
    assert_int_equal(wb.result, AT_QUEUED);
    assert_int_equal(stats_of(z).clients, 0);
    /* Everything given back: a may have 2 again. */
    assert_int_equal(at_zone_acquire_for(z, &t, &a, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t);
    zone_free(z);
}

/* Requests without a client key, and zones without per_client, are never
 * limited by it. */
static void test_no_key_no_limit(void **state)
{
    at_zone_t *z = zone_per_client(4, 0, 1);
    at_zone_t *plain = zone_new(4, 0, 100 * MS);
    at_client_key_t a = key_of(1);
    at_ticket_t t[4];
    (void)state;

    for (int i = 0; i < 4; i++) {
        assert_int_equal(at_zone_acquire_for(z, &t[i], NULL, NULL, NULL), AT_ADMITTED);
    }
    for (int i = 0; i < 4; i++) {
        at_zone_release(z, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(at_zone_acquire_for(plain, &t[i], &a, NULL, NULL), AT_ADMITTED);
    }
    assert_int_equal(stats_of(plain).clients, 0);
    for (int i = 0; i < 4; i++) {
        at_zone_release(plain, &t[i]);
    }
    zone_free(z);
    zone_free(plain);
}

/* Many addresses, random arrivals and departures, checked against a plain
 * model: a lost or doubled count in the table (a wrong deletion from its
 * probe runs) shows as a wrong admit or refusal. */
static void test_table_against_model(void **state)
{
    enum { LIMIT = 60, PER = 3, NKEYS = 200, OPS = 200000 };
    at_zone_t *z = zone_per_client(LIMIT, 0, PER);
    at_ticket_t held[LIMIT];
    unsigned held_key[LIMIT], nheld = 0, model[NKEYS] = {0};
    unsigned seed = 12345;
    (void)state;

    for (int op = 0; op < OPS; op++) {
        unsigned r = (unsigned)rand_r(&seed);
        if (r % 2 == 0 && nheld > 0) {
            unsigned i = (r / 2) % nheld;
            assert_true(at_zone_release(z, &held[i]) >= 0);
            model[held_key[i]]--;
            held[i] = held[--nheld];
            held_key[i] = held_key[nheld];
        }
        else {
            unsigned k = (r / 2) % NKEYS;
            at_client_key_t key = key_of(k);
            at_ticket_t t;
            at_result_t want = model[k] >= PER    ? AT_REJECTED_CLIENT
                               : nheld >= LIMIT ? AT_REJECTED_FULL
                                                  : AT_ADMITTED;
            assert_int_equal(at_zone_acquire_for(z, &t, &key, NULL, NULL), want);
            if (want == AT_ADMITTED) {
                held[nheld] = t;
                held_key[nheld++] = k;
                model[k]++;
            }
        }
    }
    while (nheld > 0) {
        at_zone_release(z, &held[--nheld]);
    }
    assert_int_equal(stats_of(z).clients, 0);
    assert_int_equal(stats_of(z).active, 0);
    zone_free(z);
}

/* What a killed process held no longer counts against its client. */
static void test_reclaim_gives_client_back(void **state)
{
    at_zone_t *z = zone_per_client(4, 0, 1);
    at_client_key_t a = key_of(7);
    at_ticket_t t;
    pid_t pid = fork_holder(z, &a, 1);
    (void)state;

    assert_int_equal(at_zone_acquire_for(z, &t, &a, NULL, NULL), AT_REJECTED_CLIENT);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(at_zone_reclaim(z), 1);
    assert_int_equal(stats_of(z).clients, 0);
    assert_int_equal(at_zone_acquire_for(z, &t, &a, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t);
    zone_free(z);
}

/* A process dies holding the lock: the counts are rebuilt from the slots. */
static void test_lock_repair_recounts(void **state)
{
    at_zone_t *z = zone_per_client(4, 0, 1);
    at_client_key_t a = key_of(7), b = key_of(8);
    at_ticket_t ta, t;
    pid_t pid;
    (void)state;

    assert_int_equal(at_zone_acquire_for(z, &ta, &a, NULL, NULL), AT_ADMITTED);
    pid = fork();
    if (pid == 0) {
        at_zone_debug_take_lock(z);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    assert_int_equal(at_zone_acquire_for(z, &t, &a, NULL, NULL), AT_REJECTED_CLIENT);
    assert_int_equal(stats_of(z).counters.lock_repairs, 1);
    assert_int_equal(at_zone_acquire_for(z, &t, &b, NULL, NULL), AT_ADMITTED);
    assert_int_equal(stats_of(z).clients, 2);
    at_zone_release(z, &t);
    at_zone_release(z, &ta);
    assert_int_equal(stats_of(z).clients, 0);
    zone_free(z);
}

/* Turning per_client on in place counts the requests already in. */
static void test_enabled_by_reconfigure(void **state)
{
    at_zone_conf_t c = {.limit = 4, .timeout_us = 100 * MS,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    at_client_key_t a = key_of(3);
    at_ticket_t t1, t2;
    (void)state;

    assert_int_equal(at_zone_acquire_for(z, &t1, &a, NULL, NULL), AT_ADMITTED);
    c.per_client = 1;
    assert_int_equal(at_zone_reconfigure(z, &c), APR_SUCCESS);
    assert_int_equal(at_zone_acquire_for(z, &t2, &a, NULL, NULL), AT_REJECTED_CLIENT);
    at_zone_release(z, &t1);
    assert_int_equal(at_zone_acquire_for(z, &t2, &a, NULL, NULL), AT_ADMITTED);
    at_zone_release(z, &t2);
    zone_free(z);
}

static at_client_key_t key_at(apr_pool_t *p, const char *ip, apr_uint32_t v6_prefix)
{
    apr_sockaddr_t *sa;
    at_client_key_t k;

    assert_int_equal(apr_sockaddr_info_get(&sa, ip, APR_UNSPEC, 80, APR_IPV4_ADDR_OK, p),
                     APR_SUCCESS);
    at_client_key_from_sockaddr(sa, v6_prefix, &k);
    return k;
}

static at_client_key_t key_of_text(apr_pool_t *p, const char *ip)
{
    return key_at(p, ip, 0);
}

static int same_client(apr_pool_t *p, const char *a, const char *b, apr_uint32_t prefix)
{
    at_client_key_t ka = key_at(p, a, prefix), kb = key_at(p, b, prefix);

    return memcmp(&ka, &kb, sizeof(ka)) == 0;
}

static void test_keys_from_addresses(void **state)
{
    static const at_client_key_t nobody;
    apr_pool_t *p;
    at_client_key_t k1, k2;
    (void)state;

    apr_pool_create(&p, NULL);
    k1 = key_of_text(p, "192.0.2.1");
    k2 = key_of_text(p, "::ffff:192.0.2.1");
    assert_memory_equal(&k1, &k2, sizeof(k1)); /* the same host either way */
    k2 = key_of_text(p, "::192.0.2.1"); /* IPv4-compatible */
    assert_memory_equal(&k1, &k2, sizeof(k1));
    k2 = key_of_text(p, "192.0.2.2");
    assert_memory_not_equal(&k1, &k2, sizeof(k1));
    k1 = key_of_text(p, "2001:db8:1:2::1");
    k2 = key_of_text(p, "2001:db8:1:2:ffff:1:2:3");
    assert_memory_equal(&k1, &k2, sizeof(k1)); /* one /64, one client */
    k2 = key_of_text(p, "2001:db8:1:3::1");
    assert_memory_not_equal(&k1, &k2, sizeof(k1));
    at_client_key_from_sockaddr(NULL, 0, &k1);
    assert_memory_equal(&k1, &nobody, sizeof(k1));
    apr_pool_destroy(p);
}

/* Keys as the status page shows them. */
static void test_keys_shown(void **state)
{
    apr_pool_t *p;
    at_client_key_t k;
    at_zone_t *z = zone_per_key(2, 2, 1);
    char buf[AT_CLIENT_KEY_TEXT_LEN];
    (void)state;

    apr_pool_create(&p, NULL);
    k = key_of_text(p, "::ffff:192.0.2.1");
    at_client_key_show(&k, buf, sizeof(buf));
    assert_string_equal(buf, "192.0.2.1");
    k = key_of_text(p, "2001:db8:1:2:ffff:1:2:3");
    at_client_key_show(&k, buf, sizeof(buf));
    assert_string_equal(buf, "2001:db8:1:2::"); /* the /64 it counts by */
    k = text_key(z, "alice");
    at_client_key_show(&k, buf, sizeof(buf));
    assert_int_equal(strlen(buf), 16);
    assert_int_equal(strspn(buf, "0123456789abcdef"), 16);
    memset(&k, 0, sizeof(k));
    at_client_key_show(&k, buf, sizeof(buf));
    assert_string_equal(buf, "-");
    zone_free(z);
    apr_pool_destroy(p);
}

/* The busiest: against a sort of every count, for tables of random
 * counts, with ties, with fewer clients than asked for and with more. */
static void test_busiest_against_sort(void **state)
{
    enum { CLIENTS = 40, K = AT_BUSIEST };
    at_zone_t *z = zone_per_client(200, 200, 1000);
    at_zone_stats_t st;
    at_ticket_t *t = calloc(400, sizeof(*t));
    unsigned count[CLIENTS], round, c, i, n, held;
    (void)state;

    srandom(7);
    for (round = 0; round < 20; round++) {
        unsigned clients = round % 2 ? CLIENTS : 1 + (unsigned)random() % K;
        unsigned sorted[CLIENTS];

        held = 0;
        for (c = 0; c < clients; c++) {
            at_client_key_t k = key_of(c);

            count[c] = 1 + (unsigned)random() % 6;
            for (i = 0; i < count[c]; i++) {
                assert_int_equal(at_zone_acquire_for(z, &t[held++], &k, NULL, NULL),
                                 AT_ADMITTED);
            }
        }
        at_zone_stats(z, &st);
        memcpy(sorted, count, sizeof(sorted));
        for (c = 1; c < clients; c++) { /* most first */
            for (i = c; i > 0 && sorted[i] > sorted[i - 1]; i--) {
                unsigned x = sorted[i];
                sorted[i] = sorted[i - 1];
                sorted[i - 1] = x;
            }
        }
        n = clients < K ? clients : K;
        assert_int_equal(st.nbusiest, n);
        assert_int_equal(st.clients, clients);
        for (i = 0; i < n; i++) {
            unsigned who = (unsigned)st.busiest[i].key.b[15]; /* key_of(c) ends in c */
            assert_int_equal(st.busiest[i].count, sorted[i]);
            assert_int_equal(st.busiest[i].count, count[who]);
        }
        for (i = 0; i < held; i++) {
            at_zone_release(z, &t[i]);
        }
    }
    free(t);
    zone_free(z);
}

/* ::1 and the addresses that carry IPv4 have all-zero first 64 bits: keyed
 * by the /64 alone they were "nobody", never limited. The key carries the
 * family, and the prefix is the zone's. */
static void test_ipv6_keys_are_somebody(void **state)
{
    static const at_client_key_t nobody;
    apr_pool_t *p;
    at_client_key_t k;
    (void)state;

    apr_pool_create(&p, NULL);
    k = key_of_text(p, "::1");
    assert_memory_not_equal(&k, &nobody, sizeof(k));
    k = key_of_text(p, "::ffff:127.0.0.1");
    assert_memory_not_equal(&k, &nobody, sizeof(k));
    assert_false(same_client(p, "::1", "::ffff:0.0.0.1", 64));
    assert_false(same_client(p, "::1", "0.0.0.1", 64)); /* families differ */
    /* Two addresses of one /64: one client at /64, two at /128. */
    assert_true(same_client(p, "2001:db8:a:b::10", "2001:db8:a:b::20", 64));
    assert_false(same_client(p, "2001:db8:a:b::10", "2001:db8:a:b::20", 128));
    /* A /48 is one client at /48, 65,536 at /64. */
    assert_true(same_client(p, "2001:db8:a:1::1", "2001:db8:a:ffff::1", 48));
    assert_false(same_client(p, "2001:db8:a:1::1", "2001:db8:a:ffff::1", 64));
    /* A prefix that ends inside a byte masks only the bits past it. */
    assert_true(same_client(p, "2001:db8:a:b1::1", "2001:db8:a:b0::1", 60));
    assert_false(same_client(p, "2001:db8:a:c0::1", "2001:db8:a:b0::1", 60));
    apr_pool_destroy(p);
}

/* per_client=1 holds for ::1 (it never did: its key was "nobody"). */
static void test_loopback_v6_is_limited(void **state)
{
    apr_pool_t *p;
    at_zone_conf_t c = {.limit = 4, .queue = 4, .timeout_us = 1000000, .per_client = 1};
    at_zone_t *z = zone_new_conf(&c);
    at_client_key_t k;
    at_ticket_t t1, t2;
    (void)state;

    apr_pool_create(&p, NULL);
    k = key_of_text(p, "::1");
    assert_int_equal(at_zone_acquire_for(z, &t1, &k, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_for(z, &t2, &k, NULL, NULL), AT_REJECTED_CLIENT);
    at_zone_release(z, &t1);
    zone_free(z);
    apr_pool_destroy(p);
}

/* SipHash-2-4 as its authors publish it: key 00 01 .. 0f; the empty
 * message, and the message 00 01 .. 0e (one word and a tail). */
static void test_siphash_reference_vectors(void **state)
{
    apr_uint64_t k0 = APR_UINT64_C(0x0706050403020100), k1 = APR_UINT64_C(0x0f0e0d0c0b0a0908);
    unsigned char m[15];
    unsigned i;
    (void)state;

    for (i = 0; i < sizeof(m); i++) {
        m[i] = (unsigned char)i;
    }
    assert_true(at_siphash24(k0, k1, m, 0) == APR_UINT64_C(0x726fdb47dd0e0e31));
    assert_true(at_siphash24(k0, k1, m, 15) == APR_UINT64_C(0xa129ca6149be45e5));
}

/* per_key: a key's requests count together, whatever address they come
 * from; another key is not affected; an empty key is nobody's; the
 * refusal is the key's, counted apart from per_client's. */
static void test_per_key_counts_by_text(void **state)
{
    at_zone_t *z = zone_per_key(8, 8, 2);
    at_client_key_t alice = text_key(z, "alice"), again = text_key(z, "alice");
    at_client_key_t bob = text_key(z, "bob"), none = text_key(z, "");
    at_ticket_t t[8];
    int i;
    (void)state;

    assert_memory_equal(&alice, &again, sizeof(alice));
    assert_memory_not_equal(&alice, &bob, sizeof(alice));
    assert_true(at_client_key_none(&none));
    assert_int_equal(at_zone_acquire_for(z, &t[0], &alice, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_for(z, &t[1], &alice, NULL, NULL), AT_ADMITTED);
    assert_int_equal(at_zone_acquire_for(z, &t[2], &alice, NULL, NULL), AT_REJECTED_KEY);
    assert_int_equal(at_zone_acquire_for(z, &t[2], &bob, NULL, NULL), AT_ADMITTED);
    for (i = 3; i < 6; i++) {
        assert_int_equal(at_zone_acquire_for(z, &t[i], &none, NULL, NULL), AT_ADMITTED);
    }
    assert_int_equal(stats_of(z).counters.rejected_key, 1);
    assert_int_equal(stats_of(z).counters.rejected_client, 0);
    assert_int_equal(stats_of(z).per_key, 2);
    assert_int_equal(stats_of(z).per_client, 0);
    assert_int_equal(stats_of(z).clients, 2);
    at_zone_release(z, &t[0]);
    assert_int_equal(at_zone_acquire_for(z, &t[0], &alice, NULL, NULL), AT_ADMITTED);
    for (i = 0; i < 6; i++) {
        at_zone_release(z, &t[i]);
    }
    assert_int_equal(stats_of(z).clients, 0);
    zone_free(z);
}

/* A text's key depends on the zone's random secret: nobody who knows the
 * code can make up a text that counts as another's. */
static void test_text_keys_are_secret_per_zone(void **state)
{
    at_zone_t *a = zone_per_key(4, 4, 1), *b = zone_per_key(4, 4, 1);
    at_client_key_t ka = text_key(a, "alice"), kb = text_key(b, "alice");
    (void)state;

    assert_int_equal(ka.b[0], AT_CLIENT_KEY_TEXT);
    assert_memory_not_equal(&ka, &kb, sizeof(ka));
    zone_free(a);
    zone_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_running_and_waiting_count),
        cmocka_unit_test(test_siphash_reference_vectors),
        cmocka_unit_test(test_per_key_counts_by_text),
        cmocka_unit_test(test_text_keys_are_secret_per_zone),
        cmocka_unit_test(test_no_key_no_limit),
        cmocka_unit_test(test_table_against_model),
        cmocka_unit_test(test_reclaim_gives_client_back),
        cmocka_unit_test(test_lock_repair_recounts),
        cmocka_unit_test(test_enabled_by_reconfigure),
        cmocka_unit_test(test_keys_from_addresses),
        cmocka_unit_test(test_keys_shown),
        cmocka_unit_test(test_busiest_against_sort),
        cmocka_unit_test(test_ipv6_keys_are_somebody),
        cmocka_unit_test(test_loopback_v6_is_limited),
    };

    apr_initialize();
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
