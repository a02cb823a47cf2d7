/*
 * mem=: memory as a second condition for a request to start. The gate
 * keeps the last reading of available memory (at_mem_read) and a ledger of
 * the memory promised to started requests that no reading shows yet, so
 * that a burst cannot overshoot and nothing is counted twice. It lives in
 * the zone's shared memory; the zone updates it under its lock, and reads
 * the files outside it.
 */
#ifndef AT_MEMGATE_H
#define AT_MEMGATE_H

#include <apr.h>

typedef struct {
    apr_uint64_t bytes;      /* mem=; 0: the gate is open */
    apr_uint64_t avail;      /* the last reading */
    apr_int64_t read_us;     /* when the last reading began */
    apr_uint64_t pending;    /* promised to started requests, not yet in a reading */
    apr_uint64_t freed;      /* given back by requests that ended since the reading */
    apr_uint64_t early_free; /* came back before its request ended */
    apr_uint32_t source;     /* an at_mem_source_t */
    apr_uint32_t pad;
    apr_uint64_t held;        /* requests held back by memory alone */
    apr_uint64_t read_errors; /* readings that failed */
    apr_int64_t claim_us;     /* when the reading in flight began; 0: none */
    apr_int64_t land_us;      /* how long the last reading took to land */
    apr_uint32_t landed;      /* futex word: moves when a reading in flight lands */
    apr_uint32_t pad2;
} at_memgate_t;

/* How many running requests started less than settle_us before now: the
 * most whose memory a reading may not show yet. */
typedef apr_uint32_t (*at_memgate_young_fn)(void *ctx, apr_int64_t now,
                                            apr_int64_t settle_us);

/* Where readings come from: "" (the default) for the real /proc and /sys;
 * tests point it at a directory laid out the same way. settle_us replaces
 * AT_MEM_SETTLE_US (negative: the default). Process-wide. */
void at_memgate_set_reading(const char *root, apr_int64_t settle_us);

/* Tests: how long a caller waits for another's reading in flight, fixed
 * (negative: the default, from how long readings take to land). */
void at_memgate_set_wait(apr_int64_t wait_us);

/* A reading of available memory, taken outside the zone's lock. */
typedef struct {
    int ok;
    apr_uint32_t source; /* an at_mem_source_t */
    apr_uint64_t avail;
    apr_int64_t at_us; /* when it began */
    int claimed;       /* the zone's reading in flight was this one */
} at_mem_reading_t;

/* Sleeps on word while it holds seen, us at most (a futex wait). */
typedef void (*at_memgate_sleep_fn)(apr_uint32_t *word, apr_uint32_t seen, apr_int64_t us);

/* Without the lock: 1 if a reading was due and this caller took it into r;
 * then at_memgate_apply it under the lock, and at_memgate_landed after.
 * 0 if none was due, or another's reading, begun since the last went
 * stale, landed while this caller waited for it (the ledger has it). */
int at_memgate_take_reading(at_memgate_t *g, apr_int64_t now, at_mem_reading_t *r,
                            at_memgate_sleep_fn sleep);

/* After the lock, or without it if it could not be had: r is no longer in
 * flight. 1 if callers may be waiting for it: wake every sleeper on
 * g->landed. */
int at_memgate_landed(at_memgate_t *g, at_mem_reading_t *r);

/* Under the lock: the reading into the ledger. 1 if it is the first that
 * failed: the caller logs that mem= is not enforced, after the lock. */
int at_memgate_apply(at_memgate_t *g, const at_mem_reading_t *r, apr_int64_t now,
                     apr_uint32_t active, at_memgate_young_fn young, void *ctx);

/* Whether one more request may start now, by the last reading and the
 * promises since (1 when the gate is open or no reading could be had; 0
 * when the last reading is too old to decide on). */
int at_memgate_estimate(const at_memgate_t *g, apr_int64_t now);

void at_memgate_started(at_memgate_t *g);
/* A request that ran ran_us ended. */
void at_memgate_ended(at_memgate_t *g, apr_int64_t ran_us);

#endif
