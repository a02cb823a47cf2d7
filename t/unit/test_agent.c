/*
 * Unit tests of what a load balancer is told: every agent line parses
 * under HAProxy's agent-check grammar (doc/configuration.txt), says what
 * the zone's numbers say, and the zone's glance needs no lock.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <apr_general.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "at_agent.h"
#include "zone_test_util.h"

/* What HAProxy would set from a line, -1 where the line says nothing. */
typedef struct {
    int weight, maxconn, up, ready; /* up: 1 up, 0 down; ready: 1 ready, 0 drain */
} agent_reply_t;

/* HAProxy's grammar: a string ended by the first CR or LF, of words
 * delimited by spaces, tabs or commas, each a percentage, "maxconn:N",
 * ready, drain, maint, up, or down/fail/stopped optionally followed by a
 * '#' description (the rest of the line). Returns 0, or fails the test. */
static agent_reply_t parse_agent(const char *line)
{
    agent_reply_t r = {-1, -1, -1, -1};
    const char *end = strpbrk(line, "\r\n");
    char buf[512], *w, *last;

    assert_non_null(end);
    assert_int_equal(end[0], '\n'); /* LF-ended, as HAProxy reads to the first */
    assert_int_equal(end[1], '\0'); /* one line, nothing after it */
    assert_true((size_t)(end - line) < sizeof(buf));
    memcpy(buf, line, (size_t)(end - line));
    buf[end - line] = '\0';
    for (w = strtok_r(buf, " \t,", &last); w; w = strtok_r(NULL, " \t,", &last)) {
        size_t n = strlen(w);
        char *stop;

        if (n > 1 && w[n - 1] == '%') {
            long v = strtol(w, &stop, 10);
            assert_true(stop == w + n - 1 && v >= 0 && v <= 256);
            r.weight = (int)v;
        }
        else if (strncmp(w, "maxconn:", 8) == 0) {
            long v = strtol(w + 8, &stop, 10);
            assert_true(*stop == '\0' && stop > w + 8 && v >= 0);
            r.maxconn = (int)v;
        }
        else if (strcmp(w, "ready") == 0 || strcmp(w, "drain") == 0) {
            r.ready = w[0] == 'r';
        }
        else if (strcmp(w, "up") == 0) {
            r.up = 1;
        }
        else if (strcmp(w, "down") == 0 || strcmp(w, "fail") == 0 ||
                 strcmp(w, "stopped") == 0) {
            r.up = 0;
            w = strtok_r(NULL, "", &last); /* the description, if any */
            assert_true(!w || w[0] == '#');
            break;
        }
        else {
            fail_msg("'%s' is not an agent-check word (line '%s')", w, line);
        }
    }
    return r;
}

static agent_reply_t reply_for(apr_uint32_t limit, apr_uint32_t queued,
                               apr_uint32_t queue_cap, at_host_state_t st)
{
    at_zone_glance_t g = {
        .limit = limit, .active = limit, .queued = queued, .queue_cap = queue_cap};
    char buf[AT_AGENT_LINE_MAX];

    assert_true(at_agent_line(buf, sizeof(buf), &g, st) > 0);
    return parse_agent(buf);
}

static void test_lines_parse_and_say_the_numbers(void **state)
{
    agent_reply_t r;
    (void)state;

    r = reply_for(8, 0, 40, AT_HOST_UP);
    assert_int_equal(r.up, 1);
    assert_int_equal(r.ready, 1);
    assert_int_equal(r.weight, 100);
    assert_int_equal(r.maxconn, 8);

    r = reply_for(3, 30, 40, AT_HOST_UP);
    assert_int_equal(r.weight, 25);
    assert_int_equal(r.maxconn, 3);

    r = reply_for(8, 0, 40, AT_HOST_DRAINING);
    assert_int_equal(r.up, 1);
    assert_int_equal(r.ready, 0); /* drain */
    assert_int_equal(r.maxconn, 8);

    r = reply_for(8, 0, 40, AT_HOST_BROKEN);
    assert_int_equal(r.up, 0);
}

/* The weight falls as the queue fills, never to 0 (which is drain), and a
 * zone with no queue keeps its full weight. */
static void test_weight_falls_with_the_queue(void **state)
{
    at_zone_glance_t g = {.limit = 4, .queue_cap = 64};
    apr_uint32_t last = 101;
    (void)state;

    for (g.queued = 0; g.queued <= 70; g.queued++) {
        apr_uint32_t w = at_agent_weight(&g);
        assert_true(w >= 1 && w <= 100 && w <= last);
        last = w;
    }
    assert_int_equal(last, 1);
    g.queue_cap = 0;
    g.queued = 0;
    assert_int_equal(at_agent_weight(&g), 100);
}

static void test_line_fits_the_largest_numbers(void **state)
{
    at_zone_glance_t g = {
        .limit = 0xffffffffu, .queued = 0xffffffffu, .queue_cap = 0xffffffffu};
    char buf[AT_AGENT_LINE_MAX], tiny[8];
    (void)state;

    assert_true(at_agent_line(buf, sizeof(buf), &g, AT_HOST_DRAINING) > 0);
    parse_agent(buf);
    assert_int_equal(at_agent_line(tiny, sizeof(tiny), &g, AT_HOST_UP), 0);
}

/* The glance reads the zone while another process holds its lock: the
 * agent is never delayed by a stopped or busy holder. */
static void test_glance_needs_no_lock(void **state)
{
    at_zone_t *z = zone_new(5, 7, APR_INT64_C(1000000));
    at_zone_glance_t g;
    pid_t pid;
    int fd[2], status;
    char c;
    (void)state;

    assert_non_null(z);
    assert_int_equal(pipe(fd), 0);
    pid = fork();
    if (pid == 0) {
        if (at_zone_debug_take_lock(z) != APR_SUCCESS) {
            _exit(1);
        }
        (void)!write(fd[1], "x", 1);
        pause();
        _exit(0);
    }
    assert_int_equal(read(fd[0], &c, 1), 1);
    at_zone_glance(z, &g); /* would hang here if it took the lock */
    assert_int_equal(g.limit, 5);
    assert_int_equal(g.queue_cap, 7);
    assert_int_equal(g.active, 0);
    assert_int_equal(g.queued, 0);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    zone_free(z);
    close(fd[0]);
    close(fd[1]);
}

/* A zone whose lock failed for good lets every request through: the
 * balancer is told so (down), where a healthy zone says up. */
static void test_broken_lock_is_told(void **state)
{
    at_zone_t *z = zone_new(2, 2, APR_INT64_C(1000000));
    at_zone_glance_t g;
    at_ticket_t t;
    char buf[AT_AGENT_LINE_MAX];
    (void)state;

    assert_non_null(z);
    at_zone_glance(z, &g);
    assert_int_equal(g.broken, 0);
    assert_int_equal(at_zone_debug_break_lock(z), APR_SUCCESS);
    assert_int_equal(at_zone_acquire(z, &t, NULL, NULL), AT_ERROR);
    at_zone_glance(z, &g);
    assert_int_equal(g.broken, 1);
    assert_true(at_agent_line(buf, sizeof(buf), &g, AT_HOST_BROKEN) > 0);
    assert_int_equal(parse_agent(buf).up, 0);
    zone_free(z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines_parse_and_say_the_numbers),
        cmocka_unit_test(test_weight_falls_with_the_queue),
        cmocka_unit_test(test_line_fits_the_largest_numbers),
        cmocka_unit_test(test_glance_needs_no_lock),
        cmocka_unit_test(test_broken_lock_is_told),
    };

    apr_initialize();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
