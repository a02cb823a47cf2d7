/*
 * rate=: a request rate with a burst, by the generic cell rate algorithm
 * (GCRA): a bucket is one timestamp, the time at which the next request
 * would arrive on schedule. A request may run ahead of that time by at
 * most the burst's worth of intervals; it spends one interval. No timers:
 * a bucket empties by the clock alone. The decisions are those of nginx's
 * limit_req (its "excess" is how far the bucket runs ahead, less one).
 *
 * Per key (key=), buckets live in a table in the zone's shared memory;
 * like the zone it holds no pointers.
 */
#ifndef AT_RATE_H
#define AT_RATE_H

#include <apr.h>
#include "at_client.h"

/* rate_delay= not given: a request within the burst runs at once. */
#define AT_RATE_NODELAY 0xffffffffu
#define AT_RATE_PER_SEC_MAX 1000000
#define AT_RATE_BURST_MAX 100000
/* Keys a zone with rate= and key= remembers at once. */
#define AT_RATE_KEYS 16384
/* Where in the table a key may live: its home and the next few. */
#define AT_RATE_WAYS 8

typedef struct {
    apr_int64_t interval_ns; /* one request's share of time; 0: no rate */
    apr_uint32_t burst;      /* requests that may run ahead of the rate */
    apr_uint32_t delay;      /* rate_delay=: beyond this many ahead, a request waits
                                its turn; AT_RATE_NODELAY: none waits */
} at_rate_conf_t;

typedef enum {
    AT_RATE_PASS = 0, /* within the rate or the burst: runs now */
    AT_RATE_WAIT,     /* within the burst, but beyond rate_delay: waits its turn */
    AT_RATE_REFUSE    /* beyond the burst */
} at_rate_verdict_t;

/* A request at now (ns) against a bucket due at tat: the verdict, and in
 * *ns how long it waits (AT_RATE_WAIT) or how long until a request would
 * pass (AT_RATE_REFUSE). The bucket is not changed. */
at_rate_verdict_t at_rate_judge(const at_rate_conf_t *c, apr_int64_t tat, apr_int64_t now,
                                apr_int64_t *ns);

/* A request that passes, or waits its turn, spends its interval. */
void at_rate_spend(const at_rate_conf_t *c, apr_int64_t *tat, apr_int64_t now);

typedef struct {
    at_client_key_t key;
    unsigned char key_pad[7]; /* shared layouts name their padding */
    apr_int64_t tat_ns;
} at_rate_entry_t;

typedef struct {
    apr_size_t entries_off; /* from the table itself */
    apr_uint32_t n;         /* a power of two; 0: no keys, the zone's bucket only */
    apr_uint32_t pad;
    apr_int64_t tat_ns; /* the zone's own bucket (rate= without key=) */
} at_rate_table_t;

/* Entries in the table of a zone whose definition counts rate by key. */
apr_uint32_t at_rate_keys_for(const at_rate_conf_t *c, int keyed);

void at_rate_table_init(at_rate_table_t *t, at_rate_entry_t *entries, apr_uint32_t n);

/* The bucket of key k at now (ns), made if need be: in the key's few
 * places, the one already its, else one whose bucket is empty, else the
 * one that empties soonest, forgotten (*forgot set): a key forgotten
 * starts again with a full burst. NULL for nobody or a table of none. */
apr_int64_t *at_rate_bucket(at_rate_table_t *t, const at_client_key_t *k, apr_int64_t now,
                            int *forgot);

/* Keys whose bucket is not empty at now (a pass over the table, each
 * bucket read whole: it may run without the zone's lock). */
apr_uint32_t at_rate_keys_in(const at_rate_table_t *t, apr_int64_t now);

#endif
