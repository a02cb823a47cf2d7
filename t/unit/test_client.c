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

static at_zone_t *zone_per_client(apr_uint32_t limit, apr_uint32_t queue,
                                  apr_uint32_t per_client)
{
    at_zone_conf_t c = {limit, queue, 10000 * MS, AT_RETRY_AFTER_AUTO,
                        0, per_client, 0, 0, 0, 0, 0};

    return zone_new_conf(&c);
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
    assert_int_equal(stats_of(z).rejected_client, 1);
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
    assert_int_equal(stats_of(z).lock_repairs, 1);
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
    at_zone_conf_t c = {4, 0, 100 * MS, AT_RETRY_AFTER_AUTO, 0, 0, 0, 0, 0, 0, 0};
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

static at_client_key_t key_of_text(apr_pool_t *p, const char *ip)
{
    apr_sockaddr_t *sa;
    at_client_key_t k;

    assert_int_equal(apr_sockaddr_info_get(&sa, ip, APR_UNSPEC, 80, APR_IPV4_ADDR_OK, p),
                     APR_SUCCESS);
    at_client_key_from_sockaddr(sa, &k);
    return k;
}

static void test_keys_from_addresses(void **state)
{
    apr_pool_t *p;
    at_client_key_t k1, k2;
    (void)state;

    apr_pool_create(&p, NULL);
    k1 = key_of_text(p, "192.0.2.1");
    k2 = key_of_text(p, "::ffff:192.0.2.1");
    assert_memory_equal(&k1, &k2, sizeof(k1)); /* the same host either way */
    k2 = key_of_text(p, "192.0.2.2");
    assert_memory_not_equal(&k1, &k2, sizeof(k1));
    k1 = key_of_text(p, "2001:db8:1:2::1");
    k2 = key_of_text(p, "2001:db8:1:2:ffff:1:2:3");
    assert_memory_equal(&k1, &k2, sizeof(k1)); /* one /64, one client */
    k2 = key_of_text(p, "2001:db8:1:3::1");
    assert_memory_not_equal(&k1, &k2, sizeof(k1));
    at_client_key_from_sockaddr(NULL, &k1);
    memset(&k2, 0, sizeof(k2));
    assert_memory_equal(&k1, &k2, sizeof(k1));
    apr_pool_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_running_and_waiting_count),
        cmocka_unit_test(test_no_key_no_limit),
        cmocka_unit_test(test_table_against_model),
        cmocka_unit_test(test_reclaim_gives_client_back),
        cmocka_unit_test(test_lock_repair_recounts),
        cmocka_unit_test(test_enabled_by_reconfigure),
        cmocka_unit_test(test_keys_from_addresses),
    };

    apr_initialize();
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
