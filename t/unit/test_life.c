/*
 * Unit tests of child lifetimes: bounds, MIN == MAX, uniformity, the
 * spreading of consecutive children, and the retirement window.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "at_life.h"
#include "at_zone.h"

static void test_uniform_bounds(void **state)
{
    at_rng_t r;
    (void)state;

    at_rng_seed_with(&r, 42);
    for (int i = 0; i < 100000; i++) {
        apr_uint32_t v = at_rng_uniform(&r, 5, 9);
        assert_true(v >= 5 && v <= 9);
    }
    assert_int_equal(at_rng_uniform(&r, 7, 7), 7);
    for (int i = 0; i < 1000; i++) {
        apr_uint32_t v = at_rng_uniform(&r, 1, APR_UINT32_MAX);
        assert_true(v >= 1);
    }
}

/* Pearson's chi-square over 10 equally likely values: 27.88 is the 0.1%
 * critical value for 9 degrees of freedom. */
static double chi_square(const long *counts, int bins, long n)
{
    double expected = (double)n / bins, chi = 0;

    for (int i = 0; i < bins; i++) {
        chi += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    return chi;
}

static void test_rng_uniformity(void **state)
{
    long counts[10] = {0};
    at_rng_t r;
    (void)state;

    at_rng_seed_with(&r, 7);
    for (long i = 0; i < 200000; i++) {
        counts[at_rng_uniform(&r, 0, 9)]++;
    }
    assert_true(chi_square(counts, 10, 200000) < 27.88);
}

static void test_draw_bounds_and_fixed(void **state)
{
    at_rng_t r;
    (void)state;

    at_rng_seed_with(&r, 3);
    for (apr_uint64_t k = 0; k < 100000; k++) {
        apr_uint32_t v = at_life_draw(at_rng_unit(&r), k, at_rng_unit(&r), 32, 5, 9);
        assert_true(v >= 5 && v <= 9);
        assert_int_equal(at_life_draw(at_rng_unit(&r), k, at_rng_unit(&r), 32, 500, 500),
                         500); /* MIN == MAX: a fixed lifetime, no division by zero */
    }
    assert_int_equal(at_life_draw(0.999999, 3, 0.999, 1, 1, APR_UINT32_MAX) >= 1, 1);
}

static void test_draw_uniform_over_children(void **state)
{
    long counts[10] = {0};
    at_rng_t r;
    (void)state;

    at_rng_seed_with(&r, 11);
    for (apr_uint64_t k = 0; k < 100000; k++) {
        counts[at_life_draw(0.3, k, at_rng_unit(&r), 32, 100, 109) - 100]++;
    }
    assert_true(chi_square(counts, 10, 100000) < 27.88);
}

static int cmp_u32(const void *a, const void *b)
{
    apr_uint32_t x = *(const apr_uint32_t *)a, y = *(const apr_uint32_t *)b;
    return x < y ? -1 : x > y;
}

static apr_uint32_t min_gap(apr_uint32_t *v, int n)
{
    apr_uint32_t g = APR_UINT32_MAX;

    qsort(v, (size_t)n, sizeof(*v), cmp_u32);
    for (int i = 1; i < n; i++) {
        if (v[i] - v[i - 1] < g) {
            g = v[i] - v[i - 1];
        }
    }
    return g;
}

/* 32 children started together, lifetimes in [300, 700]: spread draws keep
 * every pair apart, where independent uniform draws almost always collide. */
static void test_consecutive_children_spread(void **state)
{
    enum { N = 32, TRIALS = 200 };
    apr_uint32_t v[N];
    int spread_ok = 0, random_ok = 0;
    at_rng_t r;
    (void)state;

    at_rng_seed_with(&r, 5);
    for (int t = 0; t < TRIALS; t++) {
        double offset = at_rng_unit(&r);
        apr_uint64_t k0 = at_rng_next(&r) % 100000;

        for (int i = 0; i < N; i++) {
            v[i] = at_life_draw(offset, k0 + (apr_uint64_t)i, at_rng_unit(&r), N, 300, 700);
        }
        spread_ok += min_gap(v, N) * N >= 0.3 * 400; /* >= 0.3 x the mean gap */
        for (int i = 0; i < N; i++) {
            v[i] = at_rng_uniform(&r, 300, 700);
        }
        random_ok += min_gap(v, N) * N >= 0.3 * 400;
    }
    print_message("min gap >= 0.3 x mean gap: spread %d/%d, independent %d/%d\n",
                  spread_ok, TRIALS, random_ok, TRIALS);
    assert_int_equal(spread_ok, TRIALS);
    assert_true(random_ok < TRIALS / 4);
}

static void test_should_defer(void **state)
{
    (void)state;
    assert_false(at_life_should_defer(1000000, 0, 50000));       /* nobody yet */
    assert_true(at_life_should_defer(1000000, 990000, 50000));   /* 10 ms ago */
    assert_false(at_life_should_defer(1000000, 900000, 50000));  /* 100 ms ago */
    assert_false(at_life_should_defer(1000000, 1100000, 50000)); /* clock oddity */
}

static void test_claim_retirement(void **state)
{
    apr_size_t size = at_life_size(4);
    at_life_t *l = malloc(size);
    (void)state;

    at_life_init(l, 4, 1);
    assert_true(at_life_claim_retirement(l, 50000));
    /* right after another: within an hour, however slow the machine */
    assert_false(at_life_claim_retirement(l, 3600 * APR_INT64_C(1000000)));
    usleep(60000); /* sleeps run long, never short: past the 50 ms window */
    assert_true(at_life_claim_retirement(l, 50000));
    assert_false(at_life_claim_retirement(l, 3600 * APR_INT64_C(1000000)));
    free(l);
}

/* Children take records; a dead child's record is taken over. */
static void test_records(void **state)
{
    apr_size_t size = at_life_size(2);
    at_life_t *l = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    at_rng_t r;
    apr_uint32_t life;
    pid_t pid;
    (void)state;

    at_life_init(l, 2, 9);
    at_rng_seed(&r);
    for (int i = 0; i < 2; i++) {
        pid = fork();
        if (pid == 0) {
            at_rng_t cr;
            at_rng_seed(&cr);
            _exit(at_life_enter(l, 5, 9, &cr, &life) ? 0 : 1);
        }
        waitpid(pid, NULL, 0);
    }
    /* Both records belong to dead children now: a third child reuses one. */
    assert_non_null(at_life_enter(l, 5, 9, &r, &life));
    assert_true(life >= 5 && life <= 9);
    assert_int_equal(at_life_child(l, 0)->owner.pid == getpid()
                     || at_life_child(l, 1)->owner.pid == getpid(), 1);
    munmap(l, size);
}

/* The first claimer tells the test it is inside its claim, then waits
 * until the test lets it go on. */
static int claim_inside[2], claim_go[2];
static void pause_claim(void)
{
    char byte = 1;

    if (write(claim_inside[1], &byte, 1) != 1 || read(claim_go[0], &byte, 1) != 1) {
        _exit(3);
    }
}

/* A child half way through taking a dead child's record (its pid written,
 * its start time not yet) holds it: another child that looks then must not
 * pair the new pid with the old start time, judge the record dead and take
 * it too. The first claimer is held in that moment while the second looks. */
static void test_claim_race(void **state)
{
    apr_size_t size = at_life_size(1);
    at_life_t *l = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
    apr_uint32_t life;
    pid_t first, second;
    int st1, st2;
    char byte = 0;
    (void)state;

    assert_int_equal(pipe(claim_inside), 0);
    assert_int_equal(pipe(claim_go), 0);
    at_life_init(l, 1, 9);
    if ((first = fork()) == 0) { /* takes the record and dies */
        at_rng_t r;
        at_rng_seed(&r);
        _exit(at_life_enter(l, 5, 9, &r, &life) ? 0 : 1);
    }
    waitpid(first, NULL, 0);
    assert_int_equal(at_life_child(l, 0)->owner.pid, first);

    at_test_life_claim_hook = pause_claim;
    if ((first = fork()) == 0) {
        at_rng_t r;
        at_rng_seed(&r);
        _exit(at_life_enter(l, 5, 9, &r, &life) ? 0 : 1);
    }
    at_test_life_claim_hook = NULL;
    assert_int_equal(read(claim_inside[0], &byte, 1), 1); /* the first is inside */
    if ((second = fork()) == 0) {
        at_rng_t r;
        at_rng_seed(&r);
        _exit(at_life_enter(l, 5, 9, &r, &life) ? 0 : 1);
    }
    waitpid(second, &st2, 0);
    assert_int_equal(write(claim_go[1], &byte, 1), 1);
    waitpid(first, &st1, 0);
    assert_int_equal(WEXITSTATUS(st1), 0); /* the first has the record */
    assert_int_equal(WEXITSTATUS(st2), 1); /* the second found none free */
    assert_int_equal(at_life_child(l, 0)->owner.pid, first);
    close(claim_inside[0]);
    close(claim_inside[1]);
    close(claim_go[0]);
    close(claim_go[1]);
    munmap(l, size);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_bounds),
        cmocka_unit_test(test_rng_uniformity),
        cmocka_unit_test(test_draw_bounds_and_fixed),
        cmocka_unit_test(test_draw_uniform_over_children),
        cmocka_unit_test(test_consecutive_children_spread),
        cmocka_unit_test(test_should_defer),
        cmocka_unit_test(test_claim_race),
        cmocka_unit_test(test_claim_retirement),
        cmocka_unit_test(test_records),
    };
    int rc;

    apr_initialize();
    rc = cmocka_run_group_tests_name("life", tests, NULL, NULL);
    apr_terminate();
    return rc;
}
