/*
 * cluster=: shares of a fleet's total by demand, on leases (at_cluster.h).
 */
#include "at_cluster.h"
#include "at_client.h"

#include <apr_strings.h>
#include <string.h>

void at_cluster_conf_init(at_cluster_conf_t *c, apr_uint32_t total, apr_int64_t period_us)
{
    memset(c, 0, sizeof(*c));
    c->total = total;
    c->floor = AT_CLUSTER_FLOOR;
    c->period_us = period_us > 0 ? period_us : AT_CLUSTER_PERIOD_US;
    c->lease_us = c->period_us * AT_CLUSTER_LEASE_PERIODS;
    c->fallback = AT_CLUSTER_FALLBACK_EVEN;
}

const char *at_cluster_parse_fallback(const char *s, apr_uint32_t *kind, apr_uint32_t *n)
{
    apr_uint64_t v = 0;
    const char *c;

    if (strcmp(s, "even") == 0 || strcmp(s, "local") == 0) {
        *kind = s[0] == 'e' ? AT_CLUSTER_FALLBACK_EVEN : AT_CLUSTER_FALLBACK_LOCAL;
        *n = 0;
        return NULL;
    }
    for (c = s; *c >= '0' && *c <= '9' && v <= 100000; c++) {
        v = v * 10 + (apr_uint64_t)(*c - '0');
    }
    if (c == s || *c || v < 1 || v > 100000) {
        return "use even (the total over the members last seen), local (the zone's "
               "own limit) or a number from 1 to 100000";
    }
    *kind = AT_CLUSTER_FALLBACK_FIXED;
    *n = (apr_uint32_t)v;
    return NULL;
}

void at_cluster_make_id(char *id, const char *host, long pid, apr_uint64_t nonce)
{
    apr_size_t n = strlen(host), room;
    char tail[64];

    apr_snprintf(tail, sizeof(tail), ":%016" APR_UINT64_T_HEX_FMT ":%ld", nonce, pid);
    if (n + strlen(tail) >= AT_CLUSTER_ID_MAX) {
        /* "~" is in no host name: a short name never reads as a cut one */
        apr_snprintf(tail, sizeof(tail),
                     "~%016" APR_UINT64_T_HEX_FMT ":%016" APR_UINT64_T_HEX_FMT ":%ld",
                     at_siphash24(0, 0, host, n), nonce, pid);
    }
    room = AT_CLUSTER_ID_MAX - 1 - strlen(tail);
    n = n < room ? n : room;
    memcpy(id, host, n);
    apr_cpystrn(id + n, tail, AT_CLUSTER_ID_MAX - n);
}

void at_cluster_state_init(at_cluster_state_t *st, const char *id)
{
    memset(st, 0, sizeof(*st));
    apr_cpystrn(st->id, id, sizeof(st->id));
    st->members = 1;
}

apr_uint32_t at_cluster_note_demand(at_cluster_state_t *st, apr_uint32_t running,
                                    apr_uint32_t queued)
{
    double sample = (double)running + (double)queued;

    /* a burst is asked for at once; a lull gives back over a few periods */
    if (sample >= st->demand_avg) {
        st->demand_avg = sample;
    }
    else {
        st->demand_avg += (sample - st->demand_avg) / 4;
    }
    st->demand = (apr_uint32_t)(st->demand_avg + 0.5);
    return st->demand;
}

/* Members in order of want, ties by rank. */
static int before(const apr_uint32_t *wants, const apr_uint32_t *ranks, apr_uint32_t a,
                  apr_uint32_t b)
{
    return wants[a] != wants[b] ? wants[a] < wants[b] : ranks[a] < ranks[b];
}

/* Served members are those up to last in that order (n: none yet). */
static int unserved(const apr_uint32_t *wants, const apr_uint32_t *ranks, apr_uint32_t n,
                    apr_uint32_t last, apr_uint32_t i)
{
    return last == n || before(wants, ranks, last, i);
}

apr_uint32_t at_cluster_fair_share(apr_uint32_t total, apr_uint32_t floor,
                                   const apr_uint32_t *wants, const apr_uint32_t *ranks,
                                   apr_uint32_t n, apr_uint32_t me)
{
    apr_uint64_t remaining = total;
    apr_uint32_t k = n, mine = 0, i, step, last = n, r = 0;

    if (n == 0 || me >= n) {
        return 0;
    }
    if ((apr_uint64_t)floor * n > total) {
        /* not a floor each: the units go where the demand is, not to the
         * first servers by name whether they ask or not */
        floor = 0;
    }
    /* water-filling: the smallest wants are served whole while they fit
     * under an even split of what remains */
    for (step = 0; step < n; step++) {
        apr_uint32_t low = n, w;

        for (i = 0; i < n; i++) {
            if (unserved(wants, ranks, n, last, i)
                && (low == n || before(wants, ranks, i, low))) {
                low = i;
            }
        }
        w = wants[low] > floor ? wants[low] : floor;
        if ((apr_uint64_t)w * k > remaining) {
            break;
        }
        last = low;
        remaining -= w;
        k--;
        if (low == me) {
            mine = w;
        }
    }
    if (k == 0) {
        /* every want served: what is left is split evenly, so that a
         * burst anywhere starts at once */
        return mine + (apr_uint32_t)(remaining / n + (ranks[me] < remaining % n));
    }
    if (!unserved(wants, ranks, n, last, me)) {
        return mine;
    }
    /* the rest ask more than an even split: they get one each, the odd
     * units to the first in rank order */
    for (i = 0; i < n; i++) {
        r += unserved(wants, ranks, n, last, i) && ranks[i] < ranks[me];
    }
    return (apr_uint32_t)(remaining / k + (r < remaining % k));
}

apr_uint32_t at_cluster_target(const at_cluster_conf_t *c, at_cluster_state_t *st)
{
    apr_uint32_t wants[AT_CLUSTER_PEERS_MAX + 1], ranks[AT_CLUSTER_PEERS_MAX + 1];
    apr_uint32_t n = st->npeers + 1, i, j, floor;

    for (i = 0; i < n; i++) {
        const char *id = i < st->npeers ? st->peers[i].id : st->id;

        wants[i] = i < st->npeers ? st->peers[i].demand : st->demand;
        ranks[i] = 0;
        for (j = 0; j < n; j++) {
            ranks[i] += strcmp(j < st->npeers ? st->peers[j].id : st->id, id) < 0;
        }
    }
    /* the floor is judged against the whole fleet, not the rows kept */
    floor = (apr_uint64_t)c->floor * (st->members > n ? st->members : n) > c->total
                ? 0 : c->floor;
    st->target = at_cluster_fair_share(c->total, floor, wants, ranks, n, st->npeers);
    return st->target;
}

static int lease_valid(const at_cluster_state_t *st, apr_int64_t now_us)
{
    return st->lease_until_us && now_us < st->lease_until_us;
}

void at_cluster_plan(const at_cluster_conf_t *c, at_cluster_state_t *st, apr_uint32_t limit,
                     apr_int64_t now_us, at_cluster_plan_t *out)
{
    apr_uint32_t target = at_cluster_target(c, st);
    int settled = st->good_since_us && now_us - st->good_since_us >= c->lease_us;

    out->lower_to = limit;
    out->want = target;
    if (!lease_valid(st, now_us)) {
        /* the peers known are stale: hold on to the fallback until a
         * sync succeeds */
        out->want = limit;
    }
    else if (target < limit) {
        out->lower_to = target;
    }
    if (!settled && out->want > limit) {
        out->want = limit; /* someone may still run capacity the store does not know */
    }
    st->want = out->want;
}

apr_uint32_t at_cluster_hold(apr_uint32_t limit_in_force, apr_uint32_t running)
{
    return limit_in_force > running ? limit_in_force : running;
}

apr_uint32_t at_cluster_grant(apr_uint32_t total, apr_uint64_t others, apr_uint32_t hold,
                              apr_uint32_t want)
{
    apr_uint64_t free_now = others < total ? total - others : 0;

    if (want <= hold || free_now <= hold) {
        return hold;
    }
    return (apr_uint32_t)(want < free_now ? want : free_now);
}

apr_uint32_t at_cluster_fallback_limit(const at_cluster_conf_t *c,
                                       const at_cluster_state_t *st)
{
    apr_uint32_t even;

    switch (c->fallback) {
    case AT_CLUSTER_FALLBACK_LOCAL: return c->total;
    case AT_CLUSTER_FALLBACK_FIXED: return c->fallback_n;
    default:
        even = c->total / (st->members ? st->members : 1);
        return even ? even : 1;
    }
}

apr_uint32_t at_cluster_run_fallback(const at_cluster_conf_t *c, at_cluster_state_t *st,
                                     apr_uint32_t limit, apr_int64_t now_us)
{
    apr_uint32_t fallback = at_cluster_fallback_limit(c, st);

    if (!st->fallback) {
        st->fallback = 1;
        st->fallback_since_us = now_us;
    }
    st->lease_until_us = 0;
    if (fallback > limit && now_us - st->fallback_since_us < c->lease_us) {
        return limit;
    }
    return fallback;
}

apr_uint32_t at_cluster_after_sync(const at_cluster_conf_t *c, at_cluster_state_t *st, int ok,
                                   const at_cluster_reply_t *r, apr_uint32_t limit,
                                   apr_int64_t sent_us, apr_int64_t now_us)
{
    apr_uint32_t grant = ok ? r->grant : 0, npeers = ok ? r->npeers : 0;

    st->syncs++;
    st->last_sync_us = now_us;
    if (!ok) {
        st->failures++;
        st->last_result = AT_CLUSTER_FAILED;
        st->good_since_us = 0;
        if (!lease_valid(st, now_us)) {
            limit = at_cluster_run_fallback(c, st, limit, now_us);
        }
        st->limit = limit;
        return limit;
    }
    if (npeers > AT_CLUSTER_PEERS_MAX) {
        npeers = AT_CLUSTER_PEERS_MAX;
    }
    memcpy(st->peers, r->peers, npeers * sizeof(*r->peers));
    st->npeers = npeers;
    st->members = (r->others > npeers ? r->others : npeers) + 1;
    st->share = grant;
    st->last_result = AT_CLUSTER_OK;
    st->last_ok_us = now_us;
    st->fallback = 0;
    if (!st->good_since_us || r->born != st->born) {
        /* a store that lost its rows (restarted empty) knows nothing of
         * what the others run: start the settling lease again */
        st->good_since_us = now_us;
        st->born = r->born;
    }
    /* the store keeps the row for a lease from when it wrote it, later
     * than sent_us: ending a period early leaves room for clocks that run
     * at slightly different rates */
    st->lease_until_us = sent_us + c->lease_us - c->period_us;
    /* up only by what was asked for: a grant that merely counts requests
     * still running above a lowered limit must not undo the lowering */
    if (grant > limit && st->want > limit) {
        limit = grant < st->want ? grant : st->want;
    }
    else if (grant < limit) {
        limit = grant;
    }
    st->limit = limit;
    return limit;
}

apr_int64_t at_cluster_retry_backoff(apr_int64_t last_us)
{
    apr_int64_t next = last_us > 0 ? last_us * 2 : AT_CLUSTER_RETRY_FIRST_US;

    return next < AT_CLUSTER_RETRY_MAX_US ? next : AT_CLUSTER_RETRY_MAX_US;
}
