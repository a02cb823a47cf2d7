/*
 * Fault injection for the test suite, built into the test module only and
 * armed from the server's own environment (MOD_ADAPTIVE_THROTTLE_TEST_*).
 * In the module that is installed these do nothing; t/check-module-symbols
 * makes sure of it.
 */
#include "httpd.h"
#include "http_config.h"
#include "http_log.h"

#include "apr_file_io.h"
#include "apr_strings.h"

#include <stdlib.h>
#include <unistd.h>

#include "at_memgate.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#ifdef AT_TEST_HOOKS
/* The first request to reach a zone takes the zone's lock and never lets
 * go, so that a test can stop or kill a process that holds it. */
#define LOCK_HOLDER_ENV "MOD_ADAPTIVE_THROTTLE_TEST_LOCK_HOLDER"
static const char *lock_holder_file;

static void arm_lock_holder(server_rec *s)
{
    lock_holder_file = getenv(LOCK_HOLDER_ENV);
    if (lock_holder_file) {
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, LOCK_HOLDER_ENV " is set: "
                     "the first throttled request will hang holding a zone's lock "
                     "(a test of lock recovery)");
    }
}

/* mem= reads its /proc and /sys files under this directory instead, so a
 * test can say how much memory is available; the test's requests may also
 * take longer than AT_MEM_SETTLE_US to show their memory there. */
#define MEM_ROOT_ENV "MOD_ADAPTIVE_THROTTLE_TEST_MEM_ROOT"
#define MEM_SETTLE_ENV "MOD_ADAPTIVE_THROTTLE_TEST_MEM_SETTLE_MS"

const char *at_faults_mem_root(void)
{
    const char *root = getenv(MEM_ROOT_ENV);

    return root ? root : "";
}

static void arm_mem_root(server_rec *s)
{
    const char *settle = getenv(MEM_SETTLE_ENV);

    if (*at_faults_mem_root()) {
        at_memgate_set_reading(at_faults_mem_root(),
                               settle ? apr_atoi64(settle) * 1000 : -1);
        ap_log_error(APLOG_MARK, APLOG_WARNING, 0, s, MEM_ROOT_ENV " is set: mem= "
                     "reads the available memory under %s (a test)", at_faults_mem_root());
    }
}

void at_faults_hang_holding_lock(request_rec *r, at_zone_t *z)
{
    apr_file_t *f;

    if (!lock_holder_file
        || apr_file_open(&f, lock_holder_file, APR_FOPEN_WRITE | APR_FOPEN_CREATE
                         | APR_FOPEN_EXCL, APR_FPROT_OS_DEFAULT, r->pool) != APR_SUCCESS) {
        return;
    }
    at_zone_debug_take_lock(z); /* first, so the pid is written by a holder */
    apr_file_printf(f, "%d\n", (int)getpid());
    apr_file_close(f);
    for (;;) {
        pause();
    }
}

void at_faults_arm(server_rec *s)
{
    arm_lock_holder(s);
    arm_mem_root(s);
}
#else
void at_faults_arm(server_rec *s)
{
    (void)s;
}

const char *at_faults_mem_root(void)
{
    return "";
}

void at_faults_hang_holding_lock(request_rec *r, at_zone_t *z)
{
    (void)r;
    (void)z;
}
#endif
