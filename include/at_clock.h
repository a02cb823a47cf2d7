/*
 * The core's clock: monotonic microseconds, comparable between processes.
 */
#ifndef AT_CLOCK_H
#define AT_CLOCK_H

#include <apr.h>

apr_int64_t at_now_us(void);

#endif
