/*
 * The core's logging and clock.
 */
#include "at_clock.h"
#include "at_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static at_log_fn logger;

void at_set_logger(at_log_fn fn)
{
    logger = fn;
}

void at_log(int level, const char *fmt, ...)
{
    char buf[256];
    va_list ap;

    if (!logger) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    logger(level, buf);
}

apr_int64_t at_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (apr_int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
