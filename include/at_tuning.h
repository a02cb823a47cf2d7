/*
 * The core's tuning constants, in microseconds: how often it looks, how
 * long limit=auto measures, how mem= trusts its readings. Internal to the
 * core; documented where the behaviour they tune is (docs/).
 */
#ifndef AT_TUNING_H
#define AT_TUNING_H

/* Intervals, in microseconds: how often one waiter of each process looks
 * at the clients of every request waiting in that process; how often a
 * zone checks its owners for dead processes; and, with mem= or a zone
 * replaced at a restart, how often the zone's watching waiter dispatches. */
#define AT_CLIENT_CHECK_US 500000
#define AT_RECLAIM_INTERVAL_US 250000
#define AT_WAIT_SLICE_US 50000
/* The longest a status read or an error page waits for a zone's lock. */
#define AT_GLANCE_LOCK_US 200000
/* The longest a request waits for the lock to count its body in
 * read_body_total, or to give it back. */
#define AT_BODY_LOCK_US 50000
/* A writer of a zone's published definition waits this long for another
 * to finish its copy (which takes nanoseconds), then takes over if that
 * writer has died, or gives up for now if it lives (stopped or slow). */
#define AT_PUBLISH_WAIT_US 100000
/* The longest a request that is done waits for its zone's lock to give its
 * slot back; then the next holder does it. */
#define AT_RELEASE_LOCK_US 200000
/* limit=auto judges windows of at least this long, and at least the
 * service times at_limit_window_services() asks for, up to
 * AT_AUTO_WINDOW_LONG_US for the AT_LIMIT_WINDOW_SERVICES of a climb (twice
 * that at the top), with enough requests (at_limit_enough_samples) or else
 * at most AT_AUTO_WINDOW_MAX_US. */
#define AT_AUTO_WINDOW_MIN_US 250000
#define AT_AUTO_WINDOW_LONG_US 1000000
#define AT_AUTO_WINDOW_MAX_US 10000000
/* mem=: how old the reading of available memory may get while there is
 * room, and while memory holds requests back. */
#define AT_MEM_READ_US 250000
#define AT_MEM_REREAD_US 20000
/* A reading older than this (its request waited long for the lock, or was
 * stopped) is not decided on: the request waits for a new one. */
#define AT_MEM_TRUST_US 500000
/* One process reads the memory files at a time; the others wait for its
 * reading four times as long as the last one took to land, within these
 * bounds, before one of them reads instead (the reader died or stalled). */
#define AT_MEM_WAIT_MIN_US 2000
#define AT_MEM_WAIT_MAX_US 10000
/* A request's memory is taken to show in the readings at the latest this
 * long after it started; one that ends sooner than AT_MEM_QUICK_US is
 * taken to have taken none. */
#define AT_MEM_SETTLE_US 1000000
#define AT_MEM_QUICK_US 50000
/* Recent percentiles cover the current and the previous window. */
#define AT_WINDOW_US (60 * APR_INT64_C(1000000))

#endif
