/*
 * Child lifetimes (httpd glue): ThrottleChildLifetime and
 * ThrottleChildMaxAge.
 *
 * Each child draws its connection lifetime in child_init, before any MPM
 * reads ap_max_requests_per_child (prefork on every loop, worker and event
 * once, right after child_init). Under prefork a child about to retire right
 * after another one carries on a little longer; under every MPM the draws of
 * consecutive children are spread over [MIN, MAX] (at_life_draw).
 */
#include "httpd.h"
#include "http_config.h"
#include "http_connection.h"
#include "http_core.h"
#include "http_log.h"
#include "ap_mpm.h"
#include "mpm_common.h"
#include "scoreboard.h"

#include "apr_shm.h"
#include "apr_strings.h"

#include <signal.h>

#include "at_life.h"
#include "at_parse.h"
#include "at_zone.h"
#include "mod_adaptive_throttle.h"

APLOG_USE_MODULE(adaptive_throttle);

#define LIFE_RETAINED_KEY "mod_adaptive_throttle-life"
/* Under prefork: retirements closer than this are spread apart, by at most
 * MAX_EXTENSIONS extensions of the child's lifetime. */
#define RETIRE_WINDOW_US 50000
#define MAX_EXTENSIONS 4

typedef struct {
    apr_uint32_t min, max;   /* 0: ThrottleChildLifetime not set */
    const char *lifetime_at;
    apr_int64_t max_age_us;  /* 0: ThrottleChildMaxAge not set */
    apr_uint32_t jitter_pct;
    const char *max_age_at;
} life_conf_t;

typedef struct {
    at_life_t *table;
    apr_uint32_t capacity;
} life_retained_t;

/* Parent only: birth and age limit of each child, by scoreboard slot. */
typedef struct {
    pid_t pid;
    apr_int64_t born_us, limit_us;
    int signalled;
} aged_child_t;

static life_conf_t life;
static life_retained_t *retained;
static at_child_t *my_record;      /* in a child: its own record */
static int my_mpm_rereads_limit;   /* prefork: the lifetime can still grow */
static aged_child_t *aged;
static int aged_n;
static apr_uint64_t aged_k;
static apr_int64_t last_age_retire_us;

apr_uint32_t at_life_min(void)
{
    return life.min;
}

apr_uint32_t at_life_max(void)
{
    return life.max;
}

apr_int64_t at_life_max_age_us(void)
{
    return life.max_age_us;
}

at_life_t *at_life_shared(void)
{
    return life.min && retained ? retained->table : NULL;
}

const char *at_set_child_lifetime(cmd_parms *cmd, void *dummy, const char *min,
                                  const char *max)
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    apr_uint64_t lo, hi;
    (void)dummy;

    if (err) {
        return err;
    }
    if (life.lifetime_at) {
        return apr_psprintf(cmd->pool, "ThrottleChildLifetime: already set at %s",
                            life.lifetime_at);
    }
    if ((err = at_parse_uint(cmd->pool, min, 1, APR_INT32_MAX, &lo))) {
        return apr_psprintf(cmd->pool, "ThrottleChildLifetime: MIN %s", err);
    }
    if ((err = at_parse_uint(cmd->pool, max, 1, APR_INT32_MAX, &hi))) {
        return apr_psprintf(cmd->pool, "ThrottleChildLifetime: MAX %s", err);
    }
    if (lo > hi) {
        return apr_psprintf(cmd->pool, "ThrottleChildLifetime: MIN (%s) is greater than "
                            "MAX (%s)", min, max);
    }
    life.min = (apr_uint32_t)lo;
    life.max = (apr_uint32_t)hi;
    life.lifetime_at = at_cmd_where(cmd);
    return NULL;
}

const char *at_set_child_max_age(cmd_parms *cmd, void *dummy, const char *age,
                                 const char *jitter)
{
    const char *err = ap_check_cmd_context(cmd, GLOBAL_ONLY);
    apr_uint64_t pct = 10;
    (void)dummy;

    if (err) {
        return err;
    }
    if (life.max_age_at) {
        return apr_psprintf(cmd->pool, "ThrottleChildMaxAge: already set at %s",
                            life.max_age_at);
    }
    if ((err = at_parse_duration(cmd->pool, age, &life.max_age_us))) {
        return apr_psprintf(cmd->pool, "ThrottleChildMaxAge: %s", err);
    }
    if (life.max_age_us < 1000000) {
        return apr_psprintf(cmd->pool, "ThrottleChildMaxAge: '%s' is shorter than 1s",
                            age);
    }
    if (jitter) {
        size_t n = strlen(jitter);
        char *digits = apr_pstrdup(cmd->pool, jitter);

        if (n < 2 || jitter[n - 1] != '%') {
            return apr_psprintf(cmd->pool, "ThrottleChildMaxAge: jitter '%s' must be a "
                                "percentage such as 10%%", jitter);
        }
        digits[n - 1] = '\0';
        if ((err = at_parse_uint(cmd->pool, digits, 0, 90, &pct))) {
            return apr_psprintf(cmd->pool, "ThrottleChildMaxAge: jitter '%s': %s (0%% "
                                "to 90%%)", jitter, err);
        }
    }
    life.jitter_pct = (apr_uint32_t)pct;
    life.max_age_at = at_cmd_where(cmd);
    return NULL;
}

static int is_threaded(void)
{
    int threaded = 0;

    return ap_mpm_query(AP_MPMQ_IS_THREADED, &threaded) == APR_SUCCESS
           && threaded != AP_MPMQ_NOT_SUPPORTED;
}

/* Every static of the module starts over with each configuration: a module
 * built into httpd keeps its statics across restarts, and the age table of
 * the last generation lived in its configuration pool. */
static int life_pre_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    memset(&life, 0, sizeof(life));
    aged = NULL;
    aged_n = 0;
    aged_k = 0;
    last_age_retire_us = 0;
    return OK;
}

/* A worker or event child stops only when the parent says so, through a pipe
 * any child may read: there is no way to retire one chosen child by age. */
static int life_check_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp,
                             server_rec *s)
{
    (void)pconf;
    (void)plog;
    (void)ptemp;
    if (life.max_age_us && is_threaded()) {
        ap_log_error(APLOG_MARK, APLOG_STARTUP | APLOG_EMERG, 0, s,
                     "ThrottleChildMaxAge (%s) needs the prefork MPM; under %s use "
                     "ThrottleChildLifetime", life.max_age_at, ap_show_mpm());
        return !OK;
    }
    return OK;
}

static int life_post_config(apr_pool_t *pconf, apr_pool_t *plog, apr_pool_t *ptemp,
                            server_rec *s)
{
    int limit = 0;
    apr_uint32_t cap;
    apr_shm_t *shm;
    at_rng_t rng;
    (void)plog;
    (void)ptemp;

    if (ap_state_query(AP_SQ_MAIN_STATE) == AP_SQ_MS_CREATE_PRE_CONFIG) {
        return OK;
    }
    if (life.max_age_us) {
        ap_mpm_query(AP_MPMQ_HARD_LIMIT_DAEMONS, &aged_n);
        aged = apr_pcalloc(pconf, sizeof(*aged) * (apr_size_t)(aged_n > 0 ? aged_n : 1));
    }
    if (!life.min) {
        return OK;
    }
    ap_mpm_query(AP_MPMQ_HARD_LIMIT_DAEMONS, &limit);
    cap = limit > 0 ? (apr_uint32_t)limit : 256;
    retained = ap_retained_data_get(LIFE_RETAINED_KEY);
    if (!retained) {
        retained = ap_retained_data_create(LIFE_RETAINED_KEY, sizeof(*retained));
    }
    if (retained->table && retained->capacity >= cap && at_life_can_hold(retained->table, cap)) {
        return OK; /* the sequence of draws goes on across restarts */
    }
    if (apr_shm_create(&shm, at_life_size(cap), NULL, s->process->pool) != APR_SUCCESS) {
        ap_log_error(APLOG_MARK, APLOG_EMERG, 0, s,
                     "ThrottleChildLifetime: cannot create shared memory");
        return HTTP_INTERNAL_SERVER_ERROR;
    }
    at_rng_seed(&rng);
    at_life_init(apr_shm_baseaddr_get(shm), cap, at_rng_next(&rng));
    retained->table = apr_shm_baseaddr_get(shm);
    retained->capacity = cap;
    return OK;
}

static void life_child_init(apr_pool_t *p, server_rec *s)
{
    apr_uint32_t lifetime;
    at_rng_t rng;
    (void)p;

    if (!life.min || !retained) {
        return;
    }
    at_rng_seed(&rng);
    my_record = at_life_enter(retained->table, life.min, life.max, &rng, &lifetime);
    my_mpm_rereads_limit = !is_threaded();
    ap_max_requests_per_child = (int)lifetime;
    ap_log_error(APLOG_MARK, APLOG_DEBUG, 0, s, "child %d: lifetime %u connections "
                 "(ThrottleChildLifetime %u %u)", (int)getpid(), lifetime, life.min,
                 life.max);
}

/* Once per connection (not per keep-alive request, not per HTTP/2 stream). */
static int life_pre_connection(conn_rec *c, void *csd)
{
    apr_uint32_t served;
    apr_uint32_t ext;
    (void)csd;

    if (!my_record || c->master) {
        return OK;
    }
    served = __atomic_add_fetch(&my_record->served, 1, __ATOMIC_RELAXED);
    /* Prefork rereads ap_max_requests_per_child before each accept: this is
     * the last connection, and the lifetime can still grow. */
    ext = (life.max - life.min) / 16 + 1;
    /* Never beyond MAX: the lifetime stays in [MIN, MAX] as configured. */
    if (!my_mpm_rereads_limit || served != (apr_uint32_t)ap_max_requests_per_child
        || my_record->extensions >= MAX_EXTENSIONS || my_record->lifetime + ext > life.max
        || at_life_claim_retirement(retained->table, RETIRE_WINDOW_US)) {
        return OK;
    }
    ap_max_requests_per_child += (int)ext;
    my_record->lifetime += ext;
    my_record->extensions++;
    ap_log_cerror(APLOG_MARK, APLOG_DEBUG, 0, c, "child %d: another child retired "
                  "moments ago; serving %u more connections", (int)getpid(), ext);
    return OK;
}

/* ---- ThrottleChildMaxAge (prefork, in the parent) ------------------------ */

static void life_child_status(server_rec *s, pid_t pid, ap_generation_t gen, int slot,
                              mpm_child_status status)
{
    aged_child_t *a;
    at_rng_t rng;
    double u;
    (void)s;
    (void)gen;

    if (!aged || slot < 0 || slot >= aged_n) {
        return;
    }
    a = &aged[slot];
    if (status == MPM_CHILD_STARTED) {
        at_rng_seed(&rng);
        /* Spread like the connection lifetimes: child k of the sequence. */
        u = at_life_draw(0.5, aged_k++, at_rng_unit(&rng), (apr_uint32_t)aged_n, 0,
                         10000) / 10000.0;
        a->pid = pid;
        a->born_us = at_now_us();
        a->limit_us = (apr_int64_t)((double)life.max_age_us
                                    * (1.0 + (double)life.jitter_pct / 100.0 * (2 * u - 1)));
        a->signalled = 0;
    }
    else if (status == MPM_CHILD_EXITED && a->pid == pid) {
        a->pid = 0;
    }
}

/* The oldest child past its age limit, not yet told to retire; -1 if none. */
static int oldest_due(apr_int64_t now)
{
    int i, best = -1;

    for (i = 0; i < aged_n; i++) {
        aged_child_t *a = &aged[i];
        if (a->pid && !a->signalled && now - a->born_us >= a->limit_us
            && (best < 0 || a->born_us < aged[best].born_us)) {
            best = i;
        }
    }
    return best;
}

/* Runs about every 10 s when idle (more often when children come and go).
 * Children past their age are asked to finish their connection and exit
 * (prefork's graceful signal), oldest first. Retirements are kept apart by
 * an even share of the age among the children, and one pass retires at most
 * a quarter of them, however late the monitor runs. */
static int life_monitor(apr_pool_t *p, server_rec *s)
{
    apr_int64_t now = at_now_us(), spacing;
    int i, alive = 0, allowed, due;
    (void)p;

    if (!aged || !life.max_age_us) {
        return DECLINED;
    }
    for (i = 0; i < aged_n; i++) {
        alive += aged[i].pid != 0;
    }
    spacing = alive ? life.max_age_us / (2 * alive) : life.max_age_us;
    allowed = last_age_retire_us ? (int)((now - last_age_retire_us) / spacing) : alive;
    if (allowed > alive / 4) {
        allowed = alive / 4;
    }
    if (allowed < 1 && (!last_age_retire_us || now - last_age_retire_us >= spacing)) {
        allowed = 1;
    }
    while (allowed-- > 0 && (due = oldest_due(now)) >= 0) {
        aged_child_t *a = &aged[due];

        a->signalled = 1;
        if (kill(a->pid, AP_SIG_GRACEFUL) == 0) {
            last_age_retire_us = now;
            ap_log_error(APLOG_MARK, APLOG_INFO, 0, s, "child %d retires at age %"
                         APR_INT64_T_FMT " s (ThrottleChildMaxAge)", (int)a->pid,
                         (now - a->born_us) / 1000000);
        }
    }
    return DECLINED;
}

void at_life_register_hooks(void)
{
    ap_hook_pre_config(life_pre_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_check_config(life_check_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_post_config(life_post_config, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_child_init(life_child_init, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_pre_connection(life_pre_connection, NULL, NULL, APR_HOOK_REALLY_FIRST);
    ap_hook_child_status(life_child_status, NULL, NULL, APR_HOOK_MIDDLE);
    ap_hook_monitor(life_monitor, NULL, NULL, APR_HOOK_MIDDLE);
}
