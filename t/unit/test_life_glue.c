/*
 * The child-lifetime glue across a restart, as a module built into httpd
 * lives it: its statics are not reset by unloading the module (a DSO is
 * unloaded and loaded again; a static module is not), and the configuration
 * pool is cleared between generations. The glue file is compiled in here
 * with stand-ins for the few httpd functions it calls.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/wait.h>

#include "../../src/httpd/mod_adaptive_throttle_life.c"

/* ---- stand-ins for httpd ------------------------------------------------ */

module AP_MODULE_DECLARE_DATA adaptive_throttle_module;
int ap_max_requests_per_child;
static int hard_limit_daemons = 4;

const char *ap_check_cmd_context(cmd_parms *cmd, unsigned forbidden)
{
    (void)cmd;
    (void)forbidden;
    return NULL;
}

const char *at_cmd_where(cmd_parms *cmd)
{
    (void)cmd;
    return "test.conf:1";
}

apr_status_t ap_mpm_query(int query, int *result)
{
    switch (query) {
    case AP_MPMQ_HARD_LIMIT_DAEMONS:
        *result = hard_limit_daemons;
        return APR_SUCCESS;
    case AP_MPMQ_IS_THREADED:
        *result = AP_MPMQ_NOT_SUPPORTED;
        return APR_SUCCESS;
    default:
        return APR_ENOTIMPL;
    }
}

const char *ap_show_mpm(void)
{
    return "prefork";
}

int ap_state_query(int query)
{
    return query == AP_SQ_MAIN_STATE ? AP_SQ_MS_RUN_MPM : 0;
}

static void *retained_block;

void *ap_retained_data_get(const char *key)
{
    (void)key;
    return retained_block;
}

void *ap_retained_data_create(const char *key, apr_size_t size)
{
    (void)key;
    retained_block = calloc(1, size);
    return retained_block;
}

void ap_log_error_(const char *file, int line, int module_index, int level,
                   apr_status_t status, const server_rec *s, const char *fmt, ...)
{
    (void)file, (void)line, (void)module_index, (void)level, (void)status, (void)s;
    (void)fmt;
}

void ap_log_cerror_(const char *file, int line, int module_index, int level,
                    apr_status_t status, const conn_rec *c, const char *fmt, ...)
{
    (void)file, (void)line, (void)module_index, (void)level, (void)status, (void)c;
    (void)fmt;
}

#define NO_HOOK(name, type)                                                              \
    void ap_hook_##name(type *pf, const char *const *pre, const char *const *succ,     \
                        int order)                                                       \
    {                                                                                    \
        (void)pf, (void)pre, (void)succ, (void)order;                                    \
    }
NO_HOOK(pre_config, ap_HOOK_pre_config_t)
NO_HOOK(check_config, ap_HOOK_check_config_t)
NO_HOOK(post_config, ap_HOOK_post_config_t)
NO_HOOK(child_init, ap_HOOK_child_init_t)
NO_HOOK(pre_connection, ap_HOOK_pre_connection_t)
NO_HOOK(child_status, ap_HOOK_child_status_t)
NO_HOOK(monitor, ap_HOOK_monitor_t)

/* ---- the test ---------------------------------------------------------- */

static void read_config(apr_pool_t *pconf, const char *max_age)
{
    cmd_parms cmd;

    memset(&cmd, 0, sizeof(cmd));
    cmd.pool = pconf;
    assert_int_equal(life_pre_config(pconf, pconf, pconf), OK);
    if (max_age) {
        assert_null(at_set_child_max_age(&cmd, NULL, max_age, NULL));
    }
    assert_int_equal(life_check_config(pconf, pconf, pconf, NULL), OK);
    assert_int_equal(life_post_config(pconf, pconf, pconf, NULL), OK);
}

/* ThrottleChildMaxAge, a child retired by age, then a restart whose
 * configuration drops the directive: the parent's monitor must find nothing
 * to do, not the last generation's age table (freed with its pool), the
 * time of its last retirement and a max age of 0 to divide by. */
static void test_restart_dropping_max_age(void **state)
{
    apr_pool_t *pconf;
    pid_t child;
    int status;
    (void)state;

    apr_pool_create(&pconf, NULL);
    read_config(pconf, "1s");
    child = fork();
    if (child == 0) {
        for (;;) {
            pause();
        }
    }
    life_child_status(NULL, child, 0, 0, MPM_CHILD_STARTED);
    usleep(1200 * 1000); /* past 1 s + 10 % jitter */
    assert_int_equal(life_monitor(pconf, NULL), DECLINED);
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == AP_SIG_GRACEFUL); /* retired */
    assert_int_not_equal(last_age_retire_us, 0);

    apr_pool_clear(pconf); /* a restart */
    read_config(pconf, NULL);
    assert_null(aged);
    assert_int_equal(aged_n, 0);
    assert_int_equal(last_age_retire_us, 0);
    assert_int_equal(life_monitor(pconf, NULL), DECLINED);

    /* And back: a new table for the new generation. */
    apr_pool_clear(pconf);
    read_config(pconf, "20s");
    assert_non_null(aged);
    assert_int_equal(aged_n, hard_limit_daemons);
    assert_int_equal(life_monitor(pconf, NULL), DECLINED);
    apr_pool_destroy(pconf);
    free(retained_block);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_dropping_max_age),
    };

    apr_initialize();
    return cmocka_run_group_tests_name("life_glue", tests, NULL, NULL);
}
