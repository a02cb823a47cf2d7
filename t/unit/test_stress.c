/*
 * Multi-process, multi-threaded stress of one zone: PROCS processes x THREADS
 * threads x ROUNDS acquire/release. The holders themselves count how many
 * are inside at once (a counter apart from the zone's own), and that count
 * must never exceed the limit; at the end every count is back to 0.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_zone.h"
#include "zone_test_util.h"

#define LIMIT 3

typedef struct {
    int inside;
    int max_inside;
    long admitted;
    long refused;
} witness_t;

static at_zone_t *zone;
static witness_t *witness;
static long rounds;

static void *hammer(void *unused)
{
    (void)unused;
    for (long i = 0; i < rounds; i++) {
        at_ticket_t t;
        at_result_t r = at_zone_acquire(zone, &t, NULL, NULL);

        if (r != AT_ADMITTED && r != AT_QUEUED) {
            __atomic_add_fetch(&witness->refused, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        int now = __atomic_add_fetch(&witness->inside, 1, __ATOMIC_SEQ_CST);
        int seen = __atomic_load_n(&witness->max_inside, __ATOMIC_SEQ_CST);
        while (now > seen
               && !__atomic_compare_exchange_n(&witness->max_inside, &seen, now, 0,
                                               __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        }
        if (i % 64 == 0) {
            sched_yield(); /* let others pile up in the queue */
        }
        __atomic_sub_fetch(&witness->inside, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&witness->admitted, 1, __ATOMIC_SEQ_CST);
        at_zone_release(zone, &t);
    }
    return NULL;
}

static void run_process(int threads)
{
    pthread_t th[64];

    for (int i = 0; i < threads; i++) {
        pthread_create(&th[i], NULL, hammer, NULL);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
    }
}

static void test_stress(void **state)
{
    int procs = getenv("STRESS_PROCS") ? atoi(getenv("STRESS_PROCS")) : 8;
    int threads = getenv("STRESS_THREADS") ? atoi(getenv("STRESS_THREADS")) : 4;
    apr_int64_t t0;
    double secs;
    at_zone_stats_t s;
    long total;
    (void)state;

    rounds = getenv("STRESS_ROUNDS") ? atol(getenv("STRESS_ROUNDS")) : 10000;
    total = (long)procs * threads * rounds;
    zone = zone_new(LIMIT, 64, 60 * APR_INT64_C(1000000));
    witness = mmap(NULL, sizeof(*witness), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_non_null(zone);
    assert_true(witness != MAP_FAILED);

    t0 = at_now_us();
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            run_process(threads);
            _exit(0);
        }
    }
    for (int p = 0; p < procs; p++) {
        int status;
        wait(&status);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    secs = (double)(at_now_us() - t0) / 1e6;
    at_zone_stats(zone, &s);

    fprintf(stderr, "stress: %d processes x %d threads x %ld rounds = %ld pairs "
            "in %.2f s (%.0f pairs/s); max inside %d (limit %d); queued %lu times; "
            "refused %ld\n", procs, threads, rounds, total, secs, (double)total / secs,
            witness->max_inside, LIMIT, (unsigned long)s.counters.queued_total, witness->refused);
    assert_true(witness->max_inside <= LIMIT);
    assert_int_equal(witness->max_inside, LIMIT); /* the cap was really contended */
    assert_int_equal(witness->refused, 0);
    assert_int_equal(witness->admitted, total);
    assert_int_equal(witness->inside, 0);
    assert_int_equal(s.active, 0);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.counters.admitted, (apr_uint64_t)total);
    assert_true(s.counters.queued_total > 0);
    zone_free(zone);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress),
    };

    return cmocka_run_group_tests_name("stress", tests, NULL, NULL);
}
