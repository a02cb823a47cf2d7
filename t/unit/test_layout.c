/*
 * Unit tests of the shared layout's fingerprint: every structure kept in
 * shared memory is listed whole, and a zone or child table laid by a build
 * of another layout (or whose lock is broken) is not kept.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>

#include "at_layout.h"
#include "at_life.h"
#include "at_zone.h"
#include "zone_test_util.h"

static void assert_whole(const at_record_t *r, apr_size_t n)
{
    for (apr_size_t i = 0; i < n; i++) {
        const char *gap = at_layout_gap(&r[i]);

        if (gap) {
            fail_msg("%s", gap);
        }
    }
}

/* A field added to a shared structure and not to its list fails here, so
 * the fingerprint cannot miss it. */
static void test_every_field_listed(void **state)
{
    apr_size_t n;
    const at_record_t *r;
    (void)state;

    r = at_layout_common(&n);
    assert_whole(r, n);
    assert_true(n >= 10);
    r = at_zone_layout_records(&n);
    assert_whole(r, n);
    assert_true(n >= 4);
    r = at_life_layout_records(&n);
    assert_whole(r, n);
    assert_true(n >= 2);
}

/* The check itself: a list with a field left out is caught. */
static void test_gap_is_seen(void **state)
{
    typedef struct {
        apr_uint32_t a;
        apr_uint32_t b;
        apr_uint64_t c;
    } three_t;
    static const at_field_t all[] = {AT_FIELD(three_t, a), AT_FIELD(three_t, b),
                                     AT_FIELD(three_t, c)};
    static const at_field_t no_b[] = {AT_FIELD(three_t, a), AT_FIELD(three_t, c)};
    static const at_field_t no_c[] = {AT_FIELD(three_t, a), AT_FIELD(three_t, b)};
    const at_record_t whole = AT_RECORD(three_t, all), mid = AT_RECORD(three_t, no_b),
                      end = AT_RECORD(three_t, no_c);
    (void)state;

    assert_null(at_layout_gap(&whole));
    assert_non_null(at_layout_gap(&mid));
    assert_non_null(at_layout_gap(&end));
    /* and any change of a figure changes the fingerprint */
    assert_true(at_layout_fold(0, &whole, 1) != at_layout_fold(0, &mid, 1));
}

static apr_size_t offset_of(const at_record_t *r, const char *field)
{
    for (apr_size_t i = 0; i < r->nfields; i++) {
        if (strcmp(r->fields[i].name, field) == 0) {
            return r->fields[i].offset;
        }
    }
    fail_msg("no field %s in %s", field, r->name);
    return 0;
}

/* A zone whose recorded layout is not this build's is not kept. */
static void test_zone_of_another_layout_not_kept(void **state)
{
    at_zone_conf_t c = {.limit = 2, .queue = 4, .timeout_us = 1000000,
                        .retry_after = AT_RETRY_AFTER_AUTO};
    at_zone_t *z = zone_new_conf(&c);
    apr_size_t n;
    const at_record_t *own = at_zone_layout_records(&n);
    apr_uint64_t *layout = (apr_uint64_t *)((char *)z + offset_of(&own[0], "layout"));
    at_ticket_t t;
    (void)state;

    assert_true(at_zone_can_hold(z, &c));
    *layout ^= 1;
    assert_false(at_zone_can_hold(z, &c));
    assert_int_not_equal(at_zone_reconfigure(z, &c), APR_SUCCESS);
    *layout ^= 1;
    assert_true(at_zone_can_hold(z, &c));
    /* nor is a zone whose lock is broken for good (once a request has
     * found it so) */
    assert_int_equal(at_zone_debug_break_lock(z), APR_SUCCESS);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ERROR);
    assert_false(at_zone_can_hold(z, &c));
    zone_free(z);
}

static void test_life_of_another_layout_not_kept(void **state)
{
    apr_size_t size = at_life_size(4), n;
    at_life_t *l = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    const at_record_t *own = at_life_layout_records(&n);
    apr_uint64_t *layout = (apr_uint64_t *)((char *)l + offset_of(&own[0], "layout"));
    (void)state;

    at_life_init(l, 4, 1);
    assert_true(at_life_can_hold(l, 4));
    assert_false(at_life_can_hold(l, 5)); /* too few records */
    *layout ^= 1;
    assert_false(at_life_can_hold(l, 4));
    memset(l, 0, size); /* nor one never laid */
    assert_false(at_life_can_hold(l, 4));
    munmap(l, size);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_field_listed),
        cmocka_unit_test(test_gap_is_seen),
        cmocka_unit_test(test_zone_of_another_layout_not_kept),
        cmocka_unit_test(test_life_of_another_layout_not_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
