/*
 * Child lifetimes: each child process draws how many connections it serves
 * before it retires, so that children started together do not all retire
 * together (the synchronized recycling stall).
 */
#ifndef AT_LIFE_H
#define AT_LIFE_H

#include <apr.h>
#include "at_owner.h"
#include "at_rng.h"

/*
 * The k-th child's lifetime in [min, max]. Independent uniform draws
 * cluster (32 children drawing from 100 values share values more often than
 * not); here child k takes the k-th point of the golden-ratio sequence from
 * a random offset, jittered by at most 0.1 of the mean gap between nchildren
 * points. Over many children every value is equally likely; among any
 * nchildren consecutive children the draws are spread over the range.
 */
apr_uint32_t at_life_draw(double offset, apr_uint64_t k, double jitter01,
                          apr_uint32_t nchildren, apr_uint32_t min,
                          apr_uint32_t max);

/* Whether a child about to retire at now_us should carry on a little, since
 * another child retired less than window_us before. */
int at_life_should_defer(apr_int64_t now_us, apr_int64_t last_retire_us,
                         apr_int64_t window_us);

/* ---- the shared record -------------------------------------------------- */

typedef struct {
    at_owner_t owner;         /* pid 0: free */
    apr_uint32_t lifetime;    /* connections, as drawn (plus extensions) */
    apr_uint32_t served;
    apr_uint32_t extensions;
    apr_uint32_t reserved;
    apr_int64_t started_us;
} at_child_t;

typedef struct at_life at_life_t;

apr_size_t at_life_size(apr_uint32_t nchildren);
void at_life_init(at_life_t *l, apr_uint32_t nchildren, apr_uint64_t seed);

/* 1 if a table kept across a restart serves nchildren and was laid by a
 * build of this layout; else the caller lays a new one. */
int at_life_can_hold(const at_life_t *l, apr_uint32_t nchildren);

/* In a new child: take a record and draw this child's lifetime. Returns the
 * record (NULL if the table is full; the lifetime is drawn all the same). */
at_child_t *at_life_enter(at_life_t *l, apr_uint32_t min, apr_uint32_t max,
                          at_rng_t *rng, apr_uint32_t *lifetime);

/* Claim the right to retire now: 1 if no other child retired within
 * window_us (and records this retirement), 0 if this one should defer. */
int at_life_claim_retirement(at_life_t *l, apr_int64_t window_us);

apr_uint32_t at_life_capacity(const at_life_t *l);
const at_child_t *at_life_child(const at_life_t *l, apr_uint32_t i);

#ifdef AT_TEST_HOOKS
/* Test builds only: called while a record is half claimed (its pid taken,
 * its start time not yet written), so that a test can widen that moment. */
extern void (*at_test_life_claim_hook)(void);
#endif

#endif
