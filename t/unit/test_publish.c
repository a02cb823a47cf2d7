/*
 * A zone's definition published without its lock (zone_publish_conf) by
 * several writers at once, as the parent and the cluster's sync process
 * do: a reader that follows the seqlock's protocol never takes a copy
 * mixed from two definitions; a writer that died in its copy does not
 * stop the next one for longer than AT_PUBLISH_WAIT_US, and one alive but
 * stopped in its copy is never taken over.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_tuning.h"
#include "at_zone_impl.h"
#include "zone_test_util.h"

#define WRITERS 2
#define RUN_US (400 * APR_INT64_C(1000))
/* Copies to read before the test judges, however long they take (under
 * valgrind, which runs one thread at a time, the reader may not run at
 * all in RUN_US), up to READ_DEADLINE_US. */
#define MIN_READS 1000
#define READ_DEADLINE_US (30 * APR_INT64_C(1000000))

static at_zone_t *zone;
static int stop;

/* Each definition carries its number at its first and at its last field. */
static void *writer(void *arg)
{
    at_zone_conf_t c;
    apr_uint32_t n = (apr_uint32_t)(uintptr_t)arg;

    memcpy(&c, &zone->conf_pending, sizeof(c));
    while (!__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
        c.limit = c.cluster_fallback_n = n;
        zone_publish_conf(zone, &c);
        n += WRITERS;
    }
    return NULL;
}

/* The copy a holder of the lock would apply, or 0 if it would wait. */
static int read_published(at_zone_conf_t *c)
{
    apr_uint32_t seq = __atomic_load_n(&zone->conf_seq, __ATOMIC_ACQUIRE);

    if (seq & 1) {
        return 0;
    }
    memcpy(c, &zone->conf_pending, sizeof(*c));
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&zone->conf_seq, __ATOMIC_RELAXED) == seq;
}

static void test_writers_at_once_never_mix(void **state)
{
    pthread_t w[WRITERS];
    apr_uint64_t reads = 0, mixed = 0;
    apr_int64_t start, now;
    int i;
    (void)state;

    zone = zone_new(4, 10, 1000000);
    stop = 0;
    for (i = 0; i < WRITERS; i++) {
        assert_int_equal(pthread_create(&w[i], NULL, writer, (void *)(uintptr_t)(i + 1)), 0);
    }
    start = now = at_now_us();
    while (now - start < RUN_US || (reads < MIN_READS && now - start < READ_DEADLINE_US)) {
        at_zone_conf_t c;

        now = at_now_us();
        if (read_published(&c)) {
            reads++;
            mixed += c.limit != c.cluster_fallback_n;
        }
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (i = 0; i < WRITERS; i++) {
        pthread_join(w[i], NULL);
    }
    print_message("%" APR_UINT64_T_FMT " copies read, %" APR_UINT64_T_FMT " mixed\n", reads,
                  mixed);
    assert_true(reads >= MIN_READS);
    assert_int_equal(mixed, 0);
    assert_int_equal(zone->conf_seq & 1, 0);
    zone_free(zone);
}

static void test_writer_dead_in_its_copy_is_taken_over(void **state)
{
    at_zone_conf_t c;
    apr_int64_t t0;
    (void)state;

    zone = zone_new(4, 10, 1000000);
    memcpy(&c, &zone->conf_pending, sizeof(c));
    zone->conf_seq |= 1; /* a writer died between its two stores */
    c.limit = 7;
    t0 = at_now_us();
    zone_publish_conf(zone, &c);
    assert_true(at_now_us() - t0 >= AT_PUBLISH_WAIT_US);
    assert_int_equal(zone->conf_seq & 1, 0);
    assert_int_equal(zone->conf_pending.limit, 7);
    zone_free(zone);
}

/* A writer alive but stopped in its copy keeps the sequence: another
 * gives up (EAGAIN) after AT_PUBLISH_WAIT_US and touches nothing, where
 * taking over would let the stopped one, resumed, write into its copy and
 * end its turn; once that writer has died, the next takes over. */
static void test_live_writer_stopped_in_its_copy_keeps_it(void **state)
{
    at_zone_conf_t c;
    apr_uint32_t seq;
    pid_t pid;
    (void)state;

    zone = zone_new(4, 10, 1000000);
    memcpy(&c, &zone->conf_pending, sizeof(c));
    if ((pid = fork()) == 0) {
        alarm(30); /* gone in time if the test fails before it kills it */
        pause();
        _exit(0);
    }
    zone->conf_writer.pid = pid;
    zone->conf_writer.start = 0; /* alive while its pid is */
    zone->conf_seq |= 1;
    seq = zone->conf_seq;
    c.limit = 7;
    assert_int_equal(zone_publish_conf(zone, &c), EAGAIN);
    assert_int_equal(zone->conf_seq, seq);
    assert_int_not_equal(zone->conf_pending.limit, 7);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(zone_publish_conf(zone, &c), 0);
    assert_int_equal(zone->conf_seq & 1, 0);
    assert_int_equal(zone->conf_pending.limit, 7);
    zone_free(zone);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writers_at_once_never_mix),
        cmocka_unit_test(test_writer_dead_in_its_copy_is_taken_over),
        cmocka_unit_test(test_live_writer_stopped_in_its_copy_keeps_it),
    };

    return cmocka_run_group_tests_name("publish", tests, NULL, NULL);
}
