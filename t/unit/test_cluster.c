/*
 * Unit tests of cluster=: the fair shares, the store's grant, the members'
 * ids, and a fleet simulated on one clock: 2 to 10 servers (and a
 * hundred), demands changing at random, joins, leaves, deaths, the store
 * down or restarted empty. Every step checks that what the live servers
 * may run sums to the total at most while the store answers; a dead
 * server's share is in use within a lease and two periods; shares follow
 * demand. A deliberately broken grant (raising before the others gave
 * back) is caught by the same check.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <apr_general.h>
#include <apr_strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "at_cluster.h"
#include "at_parse.h"

#define MS APR_INT64_C(1000)
#define STEP_US (10 * MS)
#define SIM_MAX 128

typedef apr_uint32_t (*grant_fn)(apr_uint32_t total, apr_uint64_t others, apr_uint32_t hold,
                                 apr_uint32_t want);

typedef struct {
    int alive;
    at_cluster_state_t st;
    apr_uint32_t limit;   /* in force in the server's zone */
    apr_uint32_t running; /* what its zone runs */
    apr_uint32_t offered; /* requests that want to run there */
    apr_int64_t next_sync_us;
} sim_server_t;

typedef struct {
    int used;
    apr_uint32_t demand, share;
    apr_int64_t expires_us;
} sim_row_t;

/* Too big for a stack: the tests share one. */
typedef struct {
    at_cluster_conf_t conf;
    sim_server_t srv[SIM_MAX];
    sim_row_t rows[SIM_MAX]; /* the store's, one per server */
    apr_uint32_t n;
    int store_up;
    apr_uint64_t born;
    apr_int64_t now_us;
    grant_fn grant;
    /* a fallback ran during an outage: the cap is the fallback's until
     * the store has answered for a lease and a few periods */
    int fell_back;
    apr_int64_t up_since_us;
    unsigned seed;
    apr_uint64_t violations; /* steps where the cap did not hold */
} sim_t;

static sim_t fleet;

static unsigned draw(sim_t *s, unsigned n)
{
    s->seed = s->seed * 1103515245u + 12345u;
    return (s->seed >> 16) % n;
}

static void server_start(sim_t *s, apr_uint32_t i)
{
    char id[32];

    snprintf(id, sizeof(id), "host%u:%u", i, draw(s, 1000));
    memset(&s->srv[i], 0, sizeof(s->srv[i]));
    at_cluster_state_init(&s->srv[i].st, id);
    s->srv[i].alive = 1;
    s->srv[i].next_sync_us = s->now_us + draw(s, (unsigned)s->conf.period_us);
}

/* Requests start at once up to the limit; beyond it they finish a few at
 * a time, as running requests do. */
static void server_run(sim_server_t *v)
{
    apr_uint32_t room = v->offered < v->limit ? v->offered : v->limit;

    if (v->running < room) {
        v->running = room;
    }
    else if (v->running > room) {
        apr_uint32_t done = 1 + v->running / 4;

        v->running -= done < v->running - room ? done : v->running - room;
    }
}

static void store_expire(sim_t *s, apr_int64_t at_us)
{
    apr_uint32_t j;

    for (j = 0; j < s->n; j++) {
        if (s->rows[j].used && s->rows[j].expires_us <= at_us) {
            s->rows[j].used = 0;
        }
    }
}

/* The store's script, atomic: expire, sum the others, grant, write. */
static int store_sync(sim_t *s, apr_uint32_t i, apr_uint32_t hold, apr_uint32_t want,
                      at_cluster_member_t *peers, at_cluster_reply_t *r)
{
    apr_int64_t at_us = s->now_us + draw(s, 20) * MS; /* it answers a little later */
    apr_uint64_t others = 0;
    apr_uint32_t j;

    if (!s->store_up) {
        return 0;
    }
    store_expire(s, at_us);
    r->npeers = 0;
    for (j = 0; j < s->n; j++) {
        if (j != i && s->rows[j].used) {
            others += s->rows[j].share;
            memcpy(peers[r->npeers].id, s->srv[j].st.id, AT_CLUSTER_ID_MAX);
            peers[r->npeers].demand = s->rows[j].demand;
            peers[r->npeers++].share = s->rows[j].share;
        }
    }
    /* a member that knew the store before it lost its rows gets no raise */
    r->grant = s->grant(s->conf.total, others, hold, s->srv[i].st.born == s->born ? want : hold);
    r->born = s->born;
    r->peers = peers;
    s->rows[i].used = 1;
    s->rows[i].demand = s->srv[i].st.demand;
    s->rows[i].share = r->grant;
    s->rows[i].expires_us = at_us + s->conf.lease_us;
    return 1;
}

/* One server's sync, in the glue's order: lower, read what runs, ask. */
static void server_sync(sim_t *s, apr_uint32_t i)
{
    sim_server_t *v = &s->srv[i];
    at_cluster_member_t peers[SIM_MAX];
    at_cluster_reply_t r = {0};
    at_cluster_plan_t plan;
    apr_uint32_t queued = v->offered > v->running ? v->offered - v->running : 0;
    int ok;

    at_cluster_note_demand(&v->st, v->running, queued);
    at_cluster_plan(&s->conf, &v->st, v->limit, s->now_us, &plan);
    v->limit = plan.lower_to;
    ok = store_sync(s, i, at_cluster_hold(v->limit, v->running), plan.want, peers, &r);
    v->limit = at_cluster_after_sync(&s->conf, &v->st, ok, &r, v->limit, s->now_us,
                                     s->now_us);
    server_run(v);
}

/* The cap: what the live servers may run (their limit, or what still
 * runs above it) sums to the total at most, while the store answers. A
 * fallback run during an outage (its own rule, cluster_fallback=) is
 * given back within a lease and three periods of the store's return. */
static int cap_holds(sim_t *s, apr_uint64_t *sum_out)
{
    apr_uint64_t sum = 0;
    apr_uint32_t i;

    for (i = 0; i < s->n; i++) {
        s->fell_back |= s->srv[i].alive && s->srv[i].st.fallback;
    }
    if (s->fell_back && (!s->store_up
                         || s->now_us - s->up_since_us
                                < s->conf.lease_us + 3 * s->conf.period_us)) {
        return 1;
    }
    s->fell_back = 0;
    for (i = 0; i < s->n; i++) {
        const sim_server_t *v = &s->srv[i];

        if (v->alive) {
            sum += v->limit > v->running ? v->limit : v->running;
        }
    }
    *sum_out = sum;
    return sum <= s->conf.total;
}

static void sim_step(sim_t *s)
{
    apr_uint64_t sum;
    apr_uint32_t i;

    s->now_us += STEP_US;
    for (i = 0; i < s->n; i++) {
        sim_server_t *v = &s->srv[i];

        if (!v->alive) {
            continue;
        }
        server_run(v);
        if (s->now_us >= v->next_sync_us) {
            server_sync(s, i);
            /* a sync's own time makes periods a little uneven */
            v->next_sync_us = s->now_us + s->conf.period_us + draw(s, 3) * STEP_US;
        }
    }
    if (!cap_holds(s, &sum)) {
        if (getenv("SIM_DEBUG") && !s->violations) {
            fprintf(stderr, "t=%lld upfor=%lld sum=%llu total=%u up=%d\n", (long long)(s->now_us / 1000), (long long)((s->now_us - s->up_since_us)/1000),
                    (unsigned long long)sum, s->conf.total, s->store_up);
            for (i = 0; i < s->n; i++) {
                fprintf(stderr, " %u alive=%d limit=%u run=%u share=%u fb=%d row=%d:%u good=%lld tgt=%u dem=%u off=%u\n", i,
                        s->srv[i].alive, s->srv[i].limit, s->srv[i].running, s->srv[i].st.share,
                        s->srv[i].st.fallback, s->rows[i].used, s->rows[i].share,
                        (long long)(s->srv[i].st.good_since_us / 1000), s->srv[i].st.target, s->srv[i].st.demand, s->srv[i].offered);
            }
        }
        s->violations++;
    }
}

static void sim_init(sim_t *s, apr_uint32_t n, apr_uint32_t total, unsigned seed,
                     grant_fn grant)
{
    apr_uint32_t i;

    memset(s, 0, sizeof(*s));
    at_cluster_conf_init(&s->conf, total, 0);
    s->n = n;
    s->store_up = 1;
    s->born = 1;
    s->now_us = 1000000 * MS;
    s->grant = grant;
    s->seed = seed;
    for (i = 0; i < n; i++) {
        server_start(s, i);
    }
}

static void sim_run(sim_t *s, apr_int64_t us)
{
    apr_int64_t end = s->now_us + us;

    while (s->now_us < end) {
        sim_step(s);
    }
}

/* ---- the fair share ---------------------------------------------------- */

static apr_uint32_t share_of(apr_uint32_t total, const apr_uint32_t *wants, apr_uint32_t n,
                             apr_uint32_t me)
{
    apr_uint32_t ranks[32], i;

    for (i = 0; i < n; i++) {
        ranks[i] = i;
    }
    return at_cluster_fair_share(total, 1, wants, ranks, n, me);
}

static void test_fair_share_is_max_min(void **state)
{
    apr_uint32_t busy_alone[] = {30, 0, 0}, small_keeps[] = {2, 20, 20};
    apr_uint32_t idle[] = {0, 0, 0}, many[] = {5, 5, 5, 5, 5}, crowd[20];
    apr_uint32_t i, sum;
    (void)state;

    /* load on one server only: it gets all but the others' floor */
    assert_int_equal(share_of(12, busy_alone, 3, 0), 10);
    assert_int_equal(share_of(12, busy_alone, 3, 1), 1);
    /* a server asking less than an even split keeps what it asks; the
     * rest is split among the others */
    assert_int_equal(share_of(12, small_keeps, 3, 0), 2);
    assert_int_equal(share_of(12, small_keeps, 3, 1), 5);
    assert_int_equal(share_of(12, small_keeps, 3, 2), 5);
    /* an idle fleet splits the total evenly, the odd unit by rank */
    assert_int_equal(share_of(13, idle, 3, 0), 5);
    assert_int_equal(share_of(13, idle, 3, 1), 4);
    /* more floors than the total: the shares still sum to it */
    for (i = 0, sum = 0; i < 5; i++) {
        sum += share_of(3, many, 5, i);
    }
    assert_int_equal(sum, 3);
    /* more servers than the total: no floor for those asking nothing, so
     * that the units go to the three asking, not to the first by name */
    for (i = 0; i < 20; i++) {
        crowd[i] = i < 17 ? 0 : 5;
    }
    assert_int_equal(share_of(6, crowd, 20, 0), 0);
    assert_int_equal(share_of(6, crowd, 20, 17), 2);
    assert_int_equal(share_of(6, crowd, 20, 19), 2);
}

static void test_grant_raises_only_into_free_capacity(void **state)
{
    (void)state;
    assert_int_equal(at_cluster_grant(12, 8, 2, 10), 4);
    assert_int_equal(at_cluster_grant(12, 12, 0, 10), 0);
    assert_int_equal(at_cluster_grant(12, 2, 4, 3), 4);  /* gives back only to hold */
    assert_int_equal(at_cluster_grant(12, 14, 3, 9), 3); /* over-committed: keeps */
}

static void test_fallback_parse_and_limit(void **state)
{
    at_cluster_conf_t c;
    at_cluster_state_t st;
    apr_uint32_t kind, n;
    (void)state;

    at_cluster_conf_init(&c, 12, 0);
    at_cluster_state_init(&st, "a");
    st.members = 5;
    assert_int_equal(at_cluster_fallback_limit(&c, &st), 2);
    st.members = 20;
    assert_int_equal(at_cluster_fallback_limit(&c, &st), 1);
    assert_null(at_cluster_parse_fallback("local", &kind, &n));
    assert_int_equal(kind, AT_CLUSTER_FALLBACK_LOCAL);
    assert_null(at_cluster_parse_fallback("7", &kind, &n));
    assert_int_equal(kind, AT_CLUSTER_FALLBACK_FIXED);
    assert_int_equal(n, 7);
    assert_non_null(at_cluster_parse_fallback("0", &kind, &n));
    assert_non_null(at_cluster_parse_fallback("half", &kind, &n));
    assert_non_null(at_cluster_parse_fallback("3x", &kind, &n));
}

/* A fleet larger than the rows a server keeps: the even fallback still
 * splits the total by every member the store counted. */
/* The floor of 1 is judged against the fleet counted, not the rows a
 * server keeps: with 10 members and a total of 5, an idle server is not
 * aimed at 1 even though it keeps only 3 others' rows. */
static void test_floor_judged_on_the_whole_fleet(void **state)
{
    at_cluster_member_t peers[3] = {{"b", 5, 1}, {"c", 5, 1}, {"d", 5, 1}};
    at_cluster_reply_t r = {0};
    at_cluster_conf_t c;
    at_cluster_state_t st;
    (void)state;

    at_cluster_conf_init(&c, 5, 0);
    at_cluster_state_init(&st, "a");
    r.grant = 1;
    r.npeers = 3;
    r.others = 9;
    r.peers = peers;
    at_cluster_after_sync(&c, &st, 1, &r, 0, 0, 1000);
    st.demand = 0;
    assert_int_equal(st.members, 10);
    assert_int_equal(at_cluster_target(&c, &st), 0);
}

static void test_members_beyond_the_rows_kept(void **state)
{
    at_cluster_member_t peers[3] = {{"b", 1, 1}, {"c", 1, 1}, {"d", 1, 1}};
    at_cluster_reply_t r = {0};
    at_cluster_conf_t c;
    at_cluster_state_t st;
    (void)state;

    at_cluster_conf_init(&c, 600, 0);
    at_cluster_state_init(&st, "a");
    r.grant = 1;
    r.npeers = 3;
    r.peers = peers;
    at_cluster_after_sync(&c, &st, 1, &r, 0, 0, 1000);
    assert_int_equal(st.members, 4); /* no count given: the rows and itself */
    r.others = 299;
    at_cluster_after_sync(&c, &st, 1, &r, 1, 2000, 3000);
    assert_int_equal(st.members, 300);
    assert_int_equal(at_cluster_fallback_limit(&c, &st), 2);
}

/* cluster= and cluster_fallback= among a zone's words. */
static const char *parse_words(apr_pool_t *p, const char *line, at_zone_conf_t *c)
{
    const char *argv[8];
    char *last, *w, *copy = apr_pstrdup(p, line);
    int argc = 0;

    for (w = apr_strtok(copy, " ", &last); w && argc < 8; w = apr_strtok(NULL, " ", &last)) {
        argv[argc++] = w;
    }
    return at_parse_zone_args(p, argc, argv, c);
}

static void test_zone_keys(void **state)
{
    apr_pool_t *p;
    at_zone_conf_t c;
    (void)state;

    apr_pool_create(&p, NULL);
    assert_null(parse_words(p, "limit=12 cluster=fleet", &c));
    assert_int_equal(c.cluster, 1);
    assert_int_equal(c.cluster_fallback, AT_CLUSTER_FALLBACK_EVEN);
    assert_null(parse_words(p, "limit=12 cluster=fleet cluster_fallback=3", &c));
    assert_int_equal(c.cluster_fallback, AT_CLUSTER_FALLBACK_FIXED);
    assert_int_equal(c.cluster_fallback_n, 3);
    assert_null(parse_words(p, "limit=12 cluster=fleet cluster_fallback=local", &c));
    assert_int_equal(c.cluster_fallback, AT_CLUSTER_FALLBACK_LOCAL);
    assert_non_null(strstr(parse_words(p, "limit=4 cluster_fallback=2", &c), "cluster=NAME"));
    assert_non_null(strstr(parse_words(p, "limit=4 per_client=1 cluster=f", &c), "per_client"));
    assert_non_null(strstr(parse_words(p, "limit=auto cluster=f", &c), "fixed limit"));
    assert_non_null(parse_words(p, "limit=4 cluster=f cluster_fallback=most", &c));
    assert_non_null(parse_words(p, "limit=4 cluster=a/b", &c));
    apr_pool_destroy(p);
}

#define NONCE APR_UINT64_C(0x0123456789abcdef)

/* Ids: "host:nonce:pid" while it fits; a longer host cut, with a hash of
 * the whole name, so that hosts alike for as long as an id stay apart (two
 * servers counted as one would together run twice their share). */
static void test_ids_unique_whatever_the_host(void **state)
{
    char a[AT_CLUSTER_ID_MAX], b[AT_CLUSTER_ID_MAX], host[300];
    const char *common = "node-0123456789.rack-0123456789.zone-0123456789.example-0123";
    const char *tail = ":0123456789abcdef:4194304";
    apr_size_t n;
    (void)state;

    at_cluster_make_id(a, "web1.example.com", 4321, NONCE);
    assert_string_equal(a, "web1.example.com:0123456789abcdef:4321");
    /* the longest host kept whole, and one byte more */
    memset(host, 'h', sizeof(host));
    n = AT_CLUSTER_ID_MAX - 1 - strlen(tail);
    host[n] = '\0';
    at_cluster_make_id(a, host, 4194304, NONCE);
    assert_int_equal(strlen(a), AT_CLUSTER_ID_MAX - 1);
    assert_memory_equal(a, host, n);
    assert_string_equal(a + n, tail);
    host[n] = 'h';
    host[n + 1] = '\0';
    at_cluster_make_id(b, host, 4194304, NONCE);
    assert_string_not_equal(a, b);
    assert_non_null(strchr(b, '~'));
    assert_string_equal(b + strlen(b) - strlen(tail), tail);
    assert_true(strlen(b) < AT_CLUSTER_ID_MAX);
    /* two hosts alike for 60 bytes, then different: two ids, each ending
     * in the pid, and the same id again for the same host and pid */
    assert_int_equal(strlen(common), 60);
    apr_snprintf(host, sizeof(host), "%s-a.example", common);
    at_cluster_make_id(a, host, 77, NONCE);
    apr_snprintf(host, sizeof(host), "%s-b.example", common);
    at_cluster_make_id(b, host, 77, NONCE);
    assert_string_not_equal(a, b);
    assert_string_equal(strrchr(a, ':'), ":77");
    assert_string_equal(strrchr(b, ':'), ":77");
    assert_memory_equal(a, common, 20);
    at_cluster_make_id(a, host, 77, NONCE);
    assert_string_equal(a, b);
    /* a host of 255 bytes, the most a name has */
    memset(host, 'x', 255);
    host[255] = '\0';
    at_cluster_make_id(a, host, 1, NONCE);
    assert_true(strlen(a) < AT_CLUSTER_ID_MAX);
    assert_string_equal(strrchr(a, ':'), ":1");
}

/* Two containers of one host name, the parent PID 1 in each: their
 * nonces keep them apart, short host or cut; one server's inputs, the
 * same at each restart, give the same id. */
static void test_ids_apart_by_nonce(void **state)
{
    char a[AT_CLUSTER_ID_MAX], b[AT_CLUSTER_ID_MAX], host[300];
    int i;
    (void)state;

    for (i = 0; i < 2; i++) {
        memset(host, 'c', sizeof(host));
        host[i ? 200 : 12] = '\0';
        at_cluster_make_id(a, host, 1, NONCE);
        at_cluster_make_id(b, host, 1, NONCE + 1);
        assert_string_not_equal(a, b);
        at_cluster_make_id(b, host, 1, NONCE);
        assert_string_equal(a, b);
        assert_true(strlen(a) < AT_CLUSTER_ID_MAX);
    }
}

/* The sync process's restarts while each dies soon: 1 s, doubling to
 * 30 s. */
static void test_retry_backoff(void **state)
{
    const apr_int64_t s1 = APR_INT64_C(1000000);
    apr_int64_t b = 0, seen[7];
    int i;
    (void)state;

    for (i = 0; i < 7; i++) {
        seen[i] = b = at_cluster_retry_backoff(b);
    }
    assert_int_equal(seen[0], 1 * s1);
    assert_int_equal(seen[1], 2 * s1);
    assert_int_equal(seen[2], 4 * s1);
    assert_int_equal(seen[3], 8 * s1);
    assert_int_equal(seen[4], 16 * s1);
    assert_int_equal(seen[5], 30 * s1);
    assert_int_equal(seen[6], 30 * s1);
}

/* ---- the fleet --------------------------------------------------------- */

static void test_shares_follow_demand(void **state)
{
    sim_t *s = &fleet;
    (void)state;

    sim_init(s, 3, 12, 7, at_cluster_grant);
    s->srv[0].offered = 40;
    sim_run(s, 5000 * MS);
    assert_int_equal(s->violations, 0);
    assert_int_equal(s->srv[0].limit, 10);
    assert_int_equal(s->srv[1].limit, 1);
    assert_int_equal(s->srv[2].limit, 1);
    /* the load moves to another server: the shares follow */
    s->srv[0].offered = 0;
    s->srv[2].offered = 40;
    sim_run(s, 5000 * MS);
    assert_int_equal(s->violations, 0);
    assert_int_equal(s->srv[2].limit, 10);
    assert_int_equal(s->srv[0].limit, 1);
    /* even load: even shares */
    s->srv[0].offered = s->srv[1].offered = s->srv[2].offered = 40;
    sim_run(s, 5000 * MS);
    assert_int_equal(s->violations, 0);
    assert_int_equal(s->srv[0].limit + s->srv[1].limit + s->srv[2].limit, 12);
    assert_in_range(s->srv[0].limit, 4, 4);
    assert_in_range(s->srv[1].limit, 4, 4);
}

/* Three servers, 12 in all, each offered more than it: settled for us. */
static void sim_three_busy(sim_t *s, unsigned seed, apr_int64_t us)
{
    apr_uint32_t i;

    sim_init(s, 3, 12, seed, at_cluster_grant);
    for (i = 0; i < 3; i++) {
        s->srv[i].offered = 40;
    }
    sim_run(s, us);
}

static void test_dead_share_reused_within_lease_and_two_periods(void **state)
{
    sim_t *s = &fleet;
    apr_int64_t deadline;
    (void)state;

    sim_three_busy(s, 11, 5000 * MS);
    assert_int_equal(s->srv[0].limit, 4);
    s->srv[0].alive = 0; /* killed: it never syncs again */
    deadline = s->now_us + s->conf.lease_us + 2 * s->conf.period_us;
    while (s->now_us < deadline && s->srv[1].limit + s->srv[2].limit < 12) {
        sim_step(s);
    }
    assert_int_equal(s->srv[1].limit + s->srv[2].limit, 12);
    assert_int_equal(s->violations, 0);
}

/* The store gone for everyone, no server joining: the even fallback keeps
 * the cap at every step, also while the busy server's share drains and
 * the idle ones would raise to an even split. */
static void test_even_fallback_keeps_the_cap(void **state)
{
    sim_t *s = &fleet;
    apr_int64_t end;
    apr_uint64_t worst = 0;
    apr_uint32_t i;
    (void)state;

    sim_init(s, 3, 12, 5, at_cluster_grant);
    s->srv[0].offered = 40;
    sim_run(s, 3000 * MS);
    assert_int_equal(s->srv[0].limit, 10);
    s->srv[1].offered = 40; /* every server busy when the store goes */
    s->srv[2].offered = 40;
    s->store_up = 0;
    for (end = s->now_us + 6000 * MS; s->now_us < end;) {
        apr_uint64_t sum = 0;

        sim_step(s);
        for (i = 0; i < 3; i++) {
            sum += s->srv[i].limit > s->srv[i].running ? s->srv[i].limit : s->srv[i].running;
        }
        worst = sum > worst ? sum : worst;
    }
    for (i = 0; i < 3; i++) {
        assert_true(s->srv[i].st.fallback);
        assert_int_equal(s->srv[i].limit, 4); /* even: 12 / 3, in the end */
    }
    assert_true(worst <= 12);
}

static void test_store_down_falls_back_then_shares_again(void **state)
{
    sim_t *s = &fleet;
    apr_uint32_t i;
    (void)state;

    sim_init(s, 3, 12, 5, at_cluster_grant);
    s->srv[0].offered = 40;
    sim_run(s, 3000 * MS);
    assert_int_equal(s->srv[0].limit, 10);
    s->store_up = 0;
    sim_run(s, 5000 * MS); /* a lease to fall back, a lease before raising */
    for (i = 0; i < 3; i++) {
        assert_true(s->srv[i].st.fallback);
        assert_int_equal(s->srv[i].limit, 4); /* even: 12 / 3 */
    }
    s->store_up = 1;
    s->up_since_us = s->now_us;
    s->born = 2; /* and it lost its rows */
    memset(s->rows, 0, sizeof(s->rows));
    sim_run(s, 3000 * MS);
    assert_int_equal(s->violations, 0);
    assert_false(s->srv[0].st.fallback);
    assert_int_equal(s->srv[0].limit, 10);
}

/* A store restarted empty while everyone still holds a lease: nobody may
 * raise into the capacity the others still run. */
static void test_store_restarted_empty_keeps_the_cap(void **state)
{
    sim_t *s = &fleet;
    (void)state;

    sim_three_busy(s, 9, 3000 * MS);
    s->born = 2;
    memset(s->rows, 0, sizeof(s->rows));
    s->srv[0].offered = 100; /* and a burst that would take it all */
    sim_run(s, 3000 * MS);
    assert_int_equal(s->violations, 0);
    assert_int_equal(s->srv[0].limit + s->srv[1].limit + s->srv[2].limit, 12);
}

/* A hundred servers: each counts every other the store lists, so that
 * the shares are max-min fair over the whole fleet (the busy servers are
 * the last the store lists) and the even fallback splits the total by a
 * hundred. */
static void test_hundred_servers_share_by_demand(void **state)
{
    sim_t *s = &fleet;
    apr_uint32_t i;
    (void)state;

    sim_init(s, 100, 1000, 3, at_cluster_grant);
    for (i = 97; i < 100; i++) {
        s->srv[i].offered = 400;
    }
    sim_run(s, 8000 * MS);
    assert_int_equal(s->violations, 0);
    for (i = 0; i < 97; i++) {
        assert_int_equal(s->srv[i].limit, 1);
    }
    for (i = 97; i < 100; i++) {
        assert_int_equal(s->srv[i].limit, 301); /* (1000 - 97 floors) / 3 */
    }
    assert_int_equal(s->srv[0].st.members, 100);
    assert_int_equal(at_cluster_fallback_limit(&s->conf, &s->srv[0].st), 10);
}

/* Fewer units than servers, 12 for 100: not every server gets its floor.
 * The cap holds at every step while demand moves, and the units go where
 * the demand is. */
static void test_more_servers_than_the_total_keep_the_cap(void **state)
{
    sim_t *s = &fleet;
    apr_uint32_t i, round, sum;
    /* Under valgrind (make check-valgrind) a tenth of the churn, the same
     * code on the same rows: 40 rounds cost 24 s of CPU there */
    const apr_uint32_t rounds = getenv("AT_UNDER_VALGRIND") ? 4 : 40;
    (void)state;

    sim_init(s, 100, 12, 4, at_cluster_grant);
    for (round = 0; round < rounds; round++) {
        for (i = 0; i < 100; i++) {
            s->srv[i].offered = draw(s, 10) == 0 ? 1 + draw(s, 5) : 0;
        }
        sim_run(s, (20 + draw(s, 200)) * STEP_US);
    }
    /* ten servers asking 3 each, the rest nothing: the units go to the ten */
    for (i = 0; i < 100; i++) {
        s->srv[i].offered = i % 10 == 9 ? 3 : 0;
    }
    sim_run(s, 4000 * MS);
    assert_int_equal(s->violations, 0);
    for (i = 0, sum = 0; i < 100; i++) {
        if (i % 10 == 9) {
            assert_in_range(s->srv[i].limit, 1, 2);
        }
        else {
            assert_int_equal(s->srv[i].limit, 0);
        }
        sum += s->srv[i].limit;
    }
    assert_int_equal(sum, 12);
}

/* Random fleets: the cap holds at every step while the store answers, and
 * shares settle on max-min fairness once things are quiet. */
static apr_uint64_t random_fleet(unsigned seed, grant_fn grant, int check_fair)
{
    sim_t *s = &fleet;
    apr_uint32_t n = 2 + seed % 9, total = n + (seed * 7) % 40, i, round;

    sim_init(s, n, total, seed, grant);
    for (round = 0; round < 60; round++) {
        unsigned ev = draw(s, 20);

        for (i = 0; i < n; i++) {
            if (draw(s, 3) == 0) {
                s->srv[i].offered = draw(s, 3) ? draw(s, total + 1) : draw(s, 3 * total);
            }
        }
        if (ev == 0) {
            i = draw(s, n);
            if (s->srv[i].alive) {
                s->srv[i].alive = 0; /* dies */
                s->srv[i].running = 0;
            }
            else {
                server_start(s, i); /* (re)joins */
            }
        }
        else if (ev == 1) {
            s->store_up = 0;
        }
        else if ((ev == 2 || ev == 3) && !s->store_up) {
            s->store_up = 1;
            s->up_since_us = s->now_us;
        }
        else if (ev == 4 && s->store_up) {
            s->born++; /* restarted empty */
            memset(s->rows, 0, sizeof(s->rows));
        }
        sim_run(s, (50 + draw(s, 100)) * STEP_US);
    }
    if (!s->store_up) {
        s->store_up = 1;
        s->up_since_us = s->now_us;
    }
    sim_run(s, 5000 * MS); /* quiet: the fleet settles */
    if (check_fair) {
        apr_uint32_t wants[SIM_MAX], ranks[SIM_MAX], alive[SIM_MAX], m = 0, k, j;

        for (i = 0; i < n; i++) {
            if (s->srv[i].alive) {
                alive[m] = i;
                wants[m++] = s->srv[i].offered;
            }
        }
        for (k = 0; k < m; k++) {
            for (j = 0, ranks[k] = 0; j < m; j++) {
                ranks[k] += strcmp(s->srv[alive[j]].st.id, s->srv[alive[k]].st.id) < 0;
            }
        }
        for (k = 0; k < m; k++) {
            apr_uint32_t fair = at_cluster_fair_share(total, 1, wants, ranks, m, k);
            apr_uint32_t got = s->srv[alive[k]].limit;

            if (got + 1 < fair || got > fair + 1) {
                print_message("seed %u: server %u has %u, its fair share is %u\n", seed,
                              alive[k], got, fair);
                for (i = 0; i < n; i++) {
                    print_message(" %u alive=%d limit=%u run=%u share=%u tgt=%u dem=%u off=%u id=%s peers=%u\n", i, s->srv[i].alive, s->srv[i].limit, s->srv[i].running, s->srv[i].st.share, s->srv[i].st.target, s->srv[i].st.demand, s->srv[i].offered, s->srv[i].st.id, s->srv[i].st.npeers);
                }
                fail();
            }
        }
    }
    return s->violations;
}

static void test_random_fleets_keep_the_cap(void **state)
{
    /* Under valgrind a tenth of the fleets: 1,000 cost 12 s of CPU there */
    const unsigned seeds = getenv("AT_UNDER_VALGRIND") ? 100 : 1000;
    unsigned seed;
    (void)state;

    for (seed = 1; seed <= seeds; seed++) {
        apr_uint64_t v = random_fleet(seed, at_cluster_grant, 1);

        if (v) {
            print_message("seed %u: the cap failed at %" APR_UINT64_T_FMT " steps\n", seed, v);
            fail();
        }
    }
}

/* The check is not idle: a grant that raises before the others have given
 * back (whatever the member wants, up to the total) breaks the cap. */
static apr_uint32_t grant_without_waiting(apr_uint32_t total, apr_uint64_t others,
                                          apr_uint32_t hold, apr_uint32_t want)
{
    (void)others;
    return want > hold ? (want < total ? want : total) : hold;
}

static void test_broken_grant_is_caught(void **state)
{
    apr_uint64_t caught = 0;
    unsigned seed;
    (void)state;

    for (seed = 1; seed <= 50; seed++) {
        caught += random_fleet(seed, grant_without_waiting, 0) > 0;
    }
    assert_true(caught > 0);
}

/* A fleet of more than 64 servers: every member is counted (the even
 * fallback divides by them all) and the share is planned over every
 * demand, not the first 64 rows the store returned. */
static void test_large_fleet_counted_whole(void **state)
{
    static at_cluster_state_t st;
    static at_cluster_member_t peers[100];
    at_cluster_conf_t c;
    at_cluster_reply_t r = {0};
    apr_uint32_t i;
    (void)state;

    at_cluster_conf_init(&c, 200, 0);
    at_cluster_state_init(&st, "me");
    for (i = 0; i < 100; i++) {
        apr_snprintf(peers[i].id, sizeof(peers[i].id), "p%03u", i);
        peers[i].demand = peers[i].share = 1;
    }
    r.grant = 100;
    r.npeers = r.others = 100;
    r.peers = peers;
    at_cluster_note_demand(&st, 150, 0);
    at_cluster_after_sync(&c, &st, 1, &r, 100, 0, 1);
    assert_int_equal(st.members, 101);
    /* 100 ask 1 each: the busy one runs what is left, 100 */
    assert_int_equal(at_cluster_target(&c, &st), 100);
    assert_int_equal(at_cluster_fallback_limit(&c, &st), 200 / 101);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fair_share_is_max_min),
        cmocka_unit_test(test_grant_raises_only_into_free_capacity),
        cmocka_unit_test(test_fallback_parse_and_limit),
        cmocka_unit_test(test_members_beyond_the_rows_kept),
        cmocka_unit_test(test_floor_judged_on_the_whole_fleet),
        cmocka_unit_test(test_even_fallback_keeps_the_cap),
        cmocka_unit_test(test_zone_keys),
        cmocka_unit_test(test_ids_unique_whatever_the_host),
        cmocka_unit_test(test_ids_apart_by_nonce),
        cmocka_unit_test(test_retry_backoff),
        cmocka_unit_test(test_shares_follow_demand),
        cmocka_unit_test(test_dead_share_reused_within_lease_and_two_periods),
        cmocka_unit_test(test_store_down_falls_back_then_shares_again),
        cmocka_unit_test(test_store_restarted_empty_keeps_the_cap),
        cmocka_unit_test(test_hundred_servers_share_by_demand),
        cmocka_unit_test(test_more_servers_than_the_total_keep_the_cap),
        cmocka_unit_test(test_random_fleets_keep_the_cap),
        cmocka_unit_test(test_broken_grant_is_caught),
        cmocka_unit_test(test_large_fleet_counted_whole),
    };

    apr_initialize();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
