/* Helpers shared by the zone unit tests. */
#ifndef ZONE_TEST_UTIL_H
#define ZONE_TEST_UTIL_H

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "at_parse.h"
#include "at_zone.h"

/* The shorter forms the tests use; the module calls at_zone_acquire_req. */
static inline at_result_t at_zone_acquire_if(at_zone_t *z, at_ticket_t *t,
                                             const at_client_key_t *client, int may_wait,
                                             at_abort_fn fn, void *ctx)
{
    at_request_t rq = {.client = client, .may_wait = may_wait};

    return at_zone_acquire_req(z, t, &rq, fn, ctx);
}

/* Counted against client (NULL: nobody) for the zone's per_client. */
static inline at_result_t at_zone_acquire_for(at_zone_t *z, at_ticket_t *t,
                                              const at_client_key_t *client,
                                              at_abort_fn fn, void *ctx)
{
    return at_zone_acquire_if(z, t, client, 1, fn, ctx);
}

static inline at_result_t at_zone_acquire(at_zone_t *z, at_ticket_t *t, at_abort_fn fn,
                                          void *ctx)
{
    return at_zone_acquire_for(z, t, NULL, fn, ctx);
}

/* A zone in anonymous shared memory, so fork()ed children share it. It has
 * spare records, as the module's zones do, so that the limit and the queue
 * capacity, not the size of the arrays, are what is tested. */
static inline at_zone_t *zone_new_conf(const at_zone_conf_t *c)
{
    apr_uint32_t nslots = at_conf_highest_limit(c) * 2 + 4, nwaiters = c->queue * 2 + 4;
    apr_size_t size = at_zone_size(nslots, nwaiters, at_rate_keys_for(&c->rate, (int)c->keyed));
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (mem == MAP_FAILED
        || at_zone_init(mem, size, "test", c, nslots, nwaiters)) {
        return NULL;
    }
    return mem;
}

static inline at_zone_t *zone_new(apr_uint32_t limit, apr_uint32_t queue,
                                  apr_int64_t timeout_us)
{
    at_zone_conf_t c = {.limit = limit, .queue = queue, .timeout_us = timeout_us,
                        .retry_after = AT_RETRY_AFTER_AUTO};

    return zone_new_conf(&c);
}

static inline void zone_free(at_zone_t *z)
{
    at_zone_stats_t s;

    at_zone_stats(z, &s);
    munmap(z, at_zone_size(s.nslots, s.nwaiters, s.rate_keys));
}

static inline at_zone_stats_t stats_of(at_zone_t *z)
{
    at_zone_stats_t s;

    at_zone_stats(z, &s);
    return s;
}

static inline apr_uint32_t queued_now(at_zone_t *z)
{
    return stats_of(z).queued;
}

#ifdef cmocka_unit_test
/* Up to 5 s for n requests to be waiting in the queue. */
static inline void wait_until_queued(at_zone_t *z, apr_uint32_t n)
{
    for (int i = 0; i < 5000 && queued_now(z) != n; i++) {
        usleep(1000);
    }
    assert_int_equal(queued_now(z), n);
}

/* Fork a child that takes a slot for client (NULL: nobody), says so, and
 * then does what then says with it (NULL: keeps it and exits at once). */
static inline pid_t fork_holder_then(at_zone_t *z, const at_client_key_t *client,
                                     void (*then)(at_zone_t *, at_ticket_t *, void *),
                                     void *arg)
{
    int fd[2];
    char c;
    pid_t pid;

    assert_int_equal(pipe(fd), 0);
    pid = fork();
    if (pid == 0) {
        at_ticket_t t;
        c = at_zone_acquire_for(z, &t, client, NULL, NULL) == AT_ADMITTED ? 'y' : 'n';
        if (write(fd[1], &c, 1) != 1) {
            _exit(2);
        }
        if (then) {
            then(z, &t, arg);
        }
        _exit(0);
    }
    assert_int_equal(read(fd[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    close(fd[0]);
    close(fd[1]);
    return pid;
}

static inline void pause_for_ever(at_zone_t *z, at_ticket_t *t, void *arg)
{
    (void)z;
    (void)t;
    (void)arg;
    for (;;) {
        pause();
    }
}

/* Fork a child that takes a slot for client (NULL: nobody) and never gives
 * it back: it exits at once (stay 0) or waits to be killed (stay 1). */
static inline pid_t fork_holder(at_zone_t *z, const at_client_key_t *client, int stay)
{
    return fork_holder_then(z, client, stay ? pause_for_ever : NULL, NULL);
}

/* Sends sig to a lock holder after 20 s, or lets it be as soon as told: a
 * build that waits for the lock for ever fails the test, not hangs it, and
 * `fired` says whether the wait ended only because the holder went on. */
typedef struct {
    pid_t holder;
    int sig;
    int go;
    int fired;
} cont_arg_t;

static inline void *cont_later(void *arg)
{
    cont_arg_t *c = arg;

    for (int i = 0; i < 20000 && !__atomic_load_n(&c->go, __ATOMIC_SEQ_CST); i++) {
        usleep(1000);
    }
    if (!__atomic_load_n(&c->go, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&c->fired, 1, __ATOMIC_SEQ_CST);
    }
    if (c->sig) {
        kill(c->holder, c->sig);
    }
    return NULL;
}

/* A child that takes the zone's lock and is stopped holding it (SIGSTOP,
 * a debugger); SIGCONT lets it go on and release the lock. */
static inline pid_t fork_stopped_lock_holder(at_zone_t *z)
{
    pid_t pid = fork();
    int st;

    if (pid == 0) {
        at_zone_debug_take_lock(z);
        raise(SIGSTOP);
        at_zone_debug_release_lock(z);
        pause();
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
    return pid;
}
#endif

#endif
