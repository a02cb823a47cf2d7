/*
 * How the core logs: through a function the httpd glue installs, so that
 * the core needs no httpd header and unit tests can capture what it says.
 */
#ifndef AT_LOG_H
#define AT_LOG_H

/* level: syslog's LOG_ERR ... LOG_DEBUG, which httpd's APLOG_ levels
 * share, or AT_LOG_TRACE1 (httpd's APLOG_TRACE1) for a line per window of
 * limit=auto. */
#define AT_LOG_TRACE1 8
typedef void (*at_log_fn)(int level, const char *msg);
void at_set_logger(at_log_fn fn);

/* Formats and hands a line to the logger, if one is installed. */
void at_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
