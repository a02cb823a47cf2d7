/*
 * A large fleet of cluster= servers on one simulated clock, running the
 * core's own code (src/core/at_cluster.c) against a model of one Redis: no
 * network, no httpd. Each server syncs every period from its own phase,
 * a few ms late at random (a sync process's sleeps), in the glue's order:
 * note the demand, lower, tell Redis what it holds, apply the reply. Redis
 * runs one script at a time, first come first served, each costing
 * BASE + PER_ROW x rows of CPU (bench/cluster-sim-run measures both on a
 * real redis-server), and answers a round trip later; a reply later than
 * the timeout counts as a failed sync. Like the glue, a server keeps at
 * most AT_CLUSTER_PEERS_MAX of the rows, the first in Redis's order.
 *
 * The load: a twentieth of the servers hot (each offered twice its part
 * of the total, so that they want more than there is), a fifth warm (1 - 4
 * each), the rest idle. Every 60 periods the hot set moves to other
 * servers; 30 periods after each move a server dies (its requests with
 * it), 15 later a new one joins, offered 2.
 *
 * At every 1-ms step it checks the cap: what the live servers may run
 * (their limit, or what still runs above it) sums to the total at most
 * while no server runs its fallback. It measures, in periods:
 *   - follow: from a move of the hot set until each newly hot server's
 *     limit is within a tenth (at least 1) of its max-min fair share of the
 *     total over what the servers are offered;
 *   - reuse: from a death until the live servers' limits sum to what they
 *     did before it;
 *   - join: from a join until the new server may run its first request.
 * and the fleet's work against an ideal fleet-wide cap: the sum over steps
 * of min(offered, limit) against min(total, offered) summed over servers,
 * from the first move of the hot set on (at the start every server settles
 * for a lease).
 *
 *   cluster-sim [-n SERVERS] [-t TOTAL] [-p PERIOD_MS] [-r RTT_MS]
 *               [-o TIMEOUT_MS] [-a BASE_US] [-b PER_ROW_US] [-s SECONDS]
 *               [-S SEED]
 * prints one line of tab-separated figures (-h: their names) and exits 1
 * if the cap failed at any step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "at_cluster.h"

#define MS APR_INT64_C(1000)
#define STEP_US MS
/* a request's mean time: what runs above a limit ends at this pace */
#define SERVICE_MS 50
/* the hot set moves, 30 periods later a server dies, 15 later one joins */
#define CYCLE_PERIODS 60
#define MAX_SRV 2048
#define MAX_SAMPLES 65536

typedef struct {
    int alive, joined;
    at_cluster_state_t st;
    apr_uint32_t limit, running, offered;
    double ending; /* requests above the limit, part-way to their end */
    apr_int64_t next_sync_us;
    /* the sync under way: sent, then run by Redis, then its reply */
    int in_flight, ran;
    apr_int64_t sent_us, arrive_us, reply_us;
    apr_uint32_t hold, want, grant, npeers;
    apr_uint64_t born;
    at_cluster_member_t *peers;
    /* a wait being measured: since, and the limit that ends it */
    apr_int64_t follow_since_us, join_since_us;
    apr_uint32_t follow_goal;
} srv_t;

typedef struct {
    int used;
    apr_uint32_t demand, share;
    apr_int64_t expires_us;
} row_t;

typedef struct {
    double v[MAX_SAMPLES];
    unsigned n, missed;
} samples_t;

typedef struct {
    at_cluster_conf_t conf;
    apr_uint32_t nsrv, target_alive;
    srv_t *srv;
    row_t *rows; /* Redis's, by server slot: in the order they were first written */
    apr_int64_t now_us, rtt_us, timeout_us;
    double base_us, per_row_us;
    /* Redis: the syncs that arrived, first come first served */
    apr_uint32_t *queue, qlen;
    apr_int64_t busy_until_us;
    double busy_us;
    apr_uint64_t calls, timeouts, reply_rows;
    samples_t qwait_ms, follow, reuse, join;
    /* the cap */
    apr_uint64_t steps, checked, violations, max_sum;
    apr_int64_t fallback_until_us;
    /* a death being measured */
    apr_int64_t reuse_since_us;
    apr_uint64_t reuse_goal;
    /* work against an ideal fleet cap */
    double done, ideal;
    unsigned long long seed;
} sim_t;

static unsigned draw(sim_t *s, unsigned n)
{
    s->seed = s->seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((s->seed >> 33) % n);
}

static void note(samples_t *x, double v)
{
    if (x->n < MAX_SAMPLES) {
        x->v[x->n++] = v;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static double pct(samples_t *x, double p)
{
    if (!x->n) {
        return -1;
    }
    qsort(x->v, x->n, sizeof(double), cmp_double);
    return x->v[(unsigned)(p * (x->n - 1) + 0.5)];
}

static apr_uint32_t nalive(const sim_t *s)
{
    apr_uint32_t i, n = 0;

    for (i = 0; i < s->nsrv; i++) {
        n += s->srv[i].alive;
    }
    return n;
}

static void server_join(sim_t *s)
{
    srv_t *v;
    char id[AT_CLUSTER_ID_MAX];

    if (s->nsrv == MAX_SRV) {
        return;
    }
    v = &s->srv[s->nsrv];
    /* a host name, a nonce and the parent's pid, as the glue names a server */
    snprintf(id, sizeof(id), "web%03u.example.net:5eed%012x:%u", s->nsrv, s->nsrv * 2654435761u,
             1000 + draw(s, 60000));
    at_cluster_state_init(&v->st, id);
    v->alive = 1;
    v->next_sync_us = s->now_us + draw(s, (unsigned)s->conf.period_us);
    v->join_since_us = s->now_us;
    s->nsrv++;
}

/* Requests start at once up to the limit; above it they end at their pace. */
static void server_run(srv_t *v)
{
    apr_uint32_t room = v->offered < v->limit ? v->offered : v->limit;

    if (v->running <= room) {
        v->running = room;
        v->ending = 0;
        return;
    }
    v->ending += (double)v->running * STEP_US / (SERVICE_MS * MS);
    while (v->ending >= 1 && v->running > room) {
        v->running--;
        v->ending -= 1;
    }
}

/* The glue's first half: note the demand, lower, send what it holds. */
static void sync_send(sim_t *s, apr_uint32_t i)
{
    srv_t *v = &s->srv[i];
    apr_uint32_t queued = v->offered > v->running ? v->offered - v->running : 0, j;
    at_cluster_plan_t plan;

    at_cluster_note_demand(&v->st, v->running, queued);
    at_cluster_plan(&s->conf, &v->st, v->limit, s->now_us, &plan);
    v->limit = plan.lower_to;
    v->hold = at_cluster_hold(v->limit, v->running);
    v->want = plan.want;
    v->in_flight = 1;
    v->ran = 0;
    v->sent_us = s->now_us;
    v->arrive_us = s->now_us + s->rtt_us / 2;
    /* Redis reads the requests in the order they arrive */
    for (j = s->qlen; j > 0 && s->srv[s->queue[j - 1]].arrive_us > v->arrive_us; j--) {
        s->queue[j] = s->queue[j - 1];
    }
    s->queue[j] = i;
    s->qlen++;
}

/* The script, atomic at at_us: expire, sum the others, grant, write. */
static void redis_run(sim_t *s, apr_uint32_t i, apr_int64_t at_us)
{
    srv_t *v = &s->srv[i];
    apr_uint64_t others = 0;
    apr_uint32_t j, rows = 0;

    v->npeers = 0;
    for (j = 0; j < s->nsrv; j++) {
        row_t *r = &s->rows[j];

        if (r->used && r->expires_us <= at_us) {
            r->used = 0;
        }
        if (!r->used || j == i) {
            continue;
        }
        rows++;
        others += r->share;
        if (v->npeers < AT_CLUSTER_PEERS_MAX) { /* the glue keeps no more */
            memcpy(v->peers[v->npeers].id, s->srv[j].st.id, AT_CLUSTER_ID_MAX);
            v->peers[v->npeers].demand = r->demand;
            v->peers[v->npeers++].share = r->share;
        }
    }
    v->grant = at_cluster_grant(s->conf.total, others, v->hold,
                                v->st.born == 1 ? v->want : v->hold);
    v->born = 1;
    s->rows[i].used = 1;
    s->rows[i].demand = v->st.demand;
    s->rows[i].share = v->grant;
    s->rows[i].expires_us = at_us + s->conf.lease_us;
    v->ran = 1;
    s->calls++;
    s->reply_rows += rows;
    s->busy_us += s->base_us + s->per_row_us * (rows + 1);
    s->busy_until_us = at_us + (apr_int64_t)(s->base_us + s->per_row_us * (rows + 1));
    v->reply_us = s->busy_until_us + s->rtt_us / 2;
    note(&s->qwait_ms, (double)(at_us - v->arrive_us) / MS);
}

static void redis_step(sim_t *s)
{
    while (s->qlen && s->srv[s->queue[0]].arrive_us <= s->now_us) {
        srv_t *v = &s->srv[s->queue[0]];
        apr_int64_t at =
            v->arrive_us > s->busy_until_us ? v->arrive_us : s->busy_until_us;

        if (at > s->now_us) {
            break;
        }
        redis_run(s, s->queue[0], at);
        memmove(s->queue, s->queue + 1, --s->qlen * sizeof(*s->queue));
    }
}

static void queue_drop(sim_t *s, apr_uint32_t i)
{
    apr_uint32_t j;

    for (j = 0; j < s->qlen; j++) {
        if (s->queue[j] == i) {
            memmove(s->queue + j, s->queue + j + 1,
                    (s->qlen - j - 1) * sizeof(*s->queue));
            s->qlen--;
            return;
        }
    }
}

/* The glue's second half: the reply, or a timeout. A script Redis ran
 * too late leaves a row holding what the server did not take; one it had
 * not reached is dropped with the connection. */
static void sync_finish(sim_t *s, apr_uint32_t i)
{
    srv_t *v = &s->srv[i];
    at_cluster_reply_t r = {0};
    int ok = v->ran && v->reply_us - v->sent_us <= s->timeout_us;

    if (!ok && s->now_us - v->sent_us < s->timeout_us) {
        return;
    }
    if (ok && v->reply_us > s->now_us) {
        return;
    }
    if (ok) {
        r.grant = v->grant;
        r.npeers = v->npeers;
        r.born = v->born;
        r.peers = v->peers;
    }
    else {
        s->timeouts++;
        queue_drop(s, i);
    }
    v->limit =
        at_cluster_after_sync(&s->conf, &v->st, ok, &r, v->limit, v->sent_us, s->now_us);
    v->in_flight = 0;
    /* the sync process's next round: a period on, a few ms late at random */
    v->next_sync_us = v->sent_us + s->conf.period_us + draw(s, 10) * MS;
    if (v->next_sync_us < s->now_us) {
        v->next_sync_us = s->now_us;
    }
}

/* The reference: what each live server would run under an ideal
 * fleet-wide cap, its max-min fair share of the total over what it is
 * offered (at_cluster_fair_share's rule, written out again here without
 * its bound on members): each at least the floor where the total has one
 * for every server, what is left split evenly, the odd units to the first
 * by name. */
static const sim_t *sorting;
static apr_uint32_t sorting_floor;

static apr_uint32_t want_of(apr_uint32_t i)
{
    apr_uint32_t o = sorting->srv[i].offered;

    return o > sorting_floor ? o : sorting_floor;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(sorting->srv[*(const apr_uint32_t *)a].st.id,
                  sorting->srv[*(const apr_uint32_t *)b].st.id);
}

static int by_want(const void *a, const void *b)
{
    apr_uint32_t x = want_of(*(const apr_uint32_t *)a),
                 y = want_of(*(const apr_uint32_t *)b);

    return x != y ? (x < y ? -1 : 1) : by_name(a, b);
}

static void ideal_shares(const sim_t *s, apr_uint32_t *out)
{
    static apr_uint32_t order[MAX_SRV];
    static char served[MAX_SRV];
    apr_uint64_t remaining = s->conf.total;
    apr_uint32_t i, n = 0, k, done = 0, rank = 0;

    for (i = 0; i < s->nsrv; i++) {
        out[i] = 0;
        served[i] = 0;
        if (s->srv[i].alive) {
            order[n++] = i;
        }
    }
    sorting = s;
    sorting_floor = (apr_uint64_t)s->conf.floor * n > s->conf.total ? 0 : s->conf.floor;
    qsort(order, n, sizeof(*order), by_want);
    for (k = n; done < n; done++, k--) {
        apr_uint32_t w = want_of(order[done]);

        if ((apr_uint64_t)w * k > remaining) {
            break;
        }
        out[order[done]] = w;
        served[order[done]] = 1;
        remaining -= w;
    }
    /* the rest split evenly, the odd units by name among them */
    k = n - done;
    qsort(order, n, sizeof(*order), by_name);
    for (i = 0; i < n; i++) {
        apr_uint32_t j = order[i], among = k ? k : n;

        if (k && served[j]) {
            continue;
        }
        out[j] += (apr_uint32_t)(remaining / among + (rank++ < remaining % among));
    }
}

static apr_uint64_t live_limits(const sim_t *s)
{
    apr_uint64_t sum = 0;
    apr_uint32_t i;

    for (i = 0; i < s->nsrv; i++) {
        sum += s->srv[i].alive ? s->srv[i].limit : 0;
    }
    return sum;
}

static double periods_since(const sim_t *s, apr_int64_t since_us)
{
    return (double)(s->now_us - since_us) / (double)s->conf.period_us;
}

/* A wait still open when the next event comes is counted as missed. */
static void close_waits(sim_t *s)
{
    apr_uint32_t i;

    for (i = 0; i < s->nsrv; i++) {
        if (s->srv[i].follow_since_us) {
            s->follow.missed++;
            s->srv[i].follow_since_us = 0;
        }
    }
    if (s->reuse_since_us) {
        s->reuse.missed++;
        s->reuse_since_us = 0;
    }
}

static void move_hot_set(sim_t *s, int timed)
{
    static apr_uint32_t fair[MAX_SRV];
    apr_uint32_t n = nalive(s), hot = n / 20 ? n / 20 : 1, i, made = 0;
    apr_uint32_t heat = 2 * s->conf.total / hot ? 2 * s->conf.total / hot : 2;

    close_waits(s);
    for (i = 0; i < s->nsrv; i++) {
        srv_t *v = &s->srv[i];

        v->offered = v->alive && draw(s, 5) == 0 ? 1 + draw(s, 4) : 0;
    }
    while (made < hot) {
        srv_t *v = &s->srv[draw(s, s->nsrv)];

        if (v->alive && v->offered < heat) {
            v->offered = heat;
            v->follow_since_us = timed ? s->now_us : 0;
            made++;
        }
    }
    ideal_shares(s, fair);
    for (i = 0; i < s->nsrv; i++) {
        srv_t *v = &s->srv[i];

        if (v->follow_since_us) {
            apr_uint32_t slack = fair[i] / 10 ? fair[i] / 10 : 1;

            v->follow_goal = fair[i] > slack ? fair[i] - slack : 0;
        }
    }
}

static void kill_one(sim_t *s)
{
    srv_t *v;

    close_waits(s);
    do {
        v = &s->srv[draw(s, s->nsrv)];
    } while (!v->alive);
    s->reuse_goal = live_limits(s);
    v->alive = 0;
    v->running = 0;
    v->offered = 0;
    v->in_flight = 0;
    queue_drop(s, (apr_uint32_t)(v - s->srv)); /* its sync dies with it */
    s->reuse_since_us = s->now_us;
}

static void measure(sim_t *s)
{
    apr_uint32_t i;

    for (i = 0; i < s->nsrv; i++) {
        srv_t *v = &s->srv[i];

        if (!v->alive) {
            continue;
        }
        if (v->follow_since_us && v->limit >= v->follow_goal) {
            note(&s->follow, periods_since(s, v->follow_since_us));
            v->follow_since_us = 0;
        }
        if (v->join_since_us && v->joined && v->limit >= 1) {
            note(&s->join, periods_since(s, v->join_since_us));
            v->join_since_us = 0;
        }
    }
    if (s->reuse_since_us && live_limits(s) >= s->reuse_goal) {
        note(&s->reuse, periods_since(s, s->reuse_since_us));
        s->reuse_since_us = 0;
    }
}

/* The cap, while no server runs its fallback (nor ran it within a lease
 * and three periods: cluster_fallback= has its own rule). */
static void check_cap(sim_t *s)
{
    apr_uint64_t sum = 0, offered = 0;
    double ideal_sum = 0;
    apr_uint32_t i;

    for (i = 0; i < s->nsrv; i++) {
        const srv_t *v = &s->srv[i];

        if (!v->alive) {
            continue;
        }
        if (v->st.fallback) {
            s->fallback_until_us = s->now_us + s->conf.lease_us + 3 * s->conf.period_us;
        }
        sum += v->limit > v->running ? v->limit : v->running;
        offered += v->offered;
        s->done += v->offered < v->limit ? v->offered : v->limit;
    }
    ideal_sum = (double)(offered < s->conf.total ? offered : s->conf.total);
    s->steps++;
    if (s->now_us < CYCLE_PERIODS * s->conf.period_us) {
        s->done = 0; /* the start, every server settling for a lease, is not counted */
    }
    else {
        s->ideal += ideal_sum;
    }
    if (s->now_us < s->fallback_until_us) {
        return;
    }
    s->checked++;
    s->max_sum = sum > s->max_sum ? sum : s->max_sum;
    if (sum > s->conf.total && !s->violations++) {
        fprintf(stderr,
                "cluster-sim: at %.3f s the live servers may run %llu, over the "
                "total %u\n",
                (double)s->now_us / 1e6, (unsigned long long)sum, s->conf.total);
    }
}

static void step(sim_t *s)
{
    apr_int64_t cycle = CYCLE_PERIODS * s->conf.period_us, t = s->now_us % cycle;
    apr_uint32_t i;

    if (t == 0) {
        move_hot_set(s, s->now_us >= cycle); /* the first, at start, is not timed */
    }
    else if (t == cycle / 2) {
        kill_one(s);
    }
    else if (t == 3 * cycle / 4 && nalive(s) < s->target_alive) {
        server_join(s);
        s->srv[s->nsrv - 1].joined = 1;
        s->srv[s->nsrv - 1].offered = 2;
    }
    for (i = 0; i < s->nsrv; i++) {
        srv_t *v = &s->srv[i];

        if (v->alive) {
            server_run(v);
            if (!v->in_flight && s->now_us >= v->next_sync_us) {
                sync_send(s, i);
            }
        }
    }
    redis_step(s);
    for (i = 0; i < s->nsrv; i++) {
        if (s->srv[i].alive && s->srv[i].in_flight) {
            sync_finish(s, i);
        }
    }
    measure(s);
    check_cap(s);
    s->now_us += STEP_US;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cluster-sim [-n SERVERS] [-t TOTAL] [-p PERIOD_MS] [-r RTT_MS] "
            "[-o TIMEOUT_MS] [-a BASE_US] [-b PER_ROW_US] [-s SECONDS] [-S SEED] | -h\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static sim_t s;
    unsigned servers = 100, total = 1000, period_ms = 100, seconds = 120;
    double rtt_ms = 0.5, timeout_ms = 50;
    apr_uint32_t i;
    int c;

    s.base_us = 20;
    s.per_row_us = 1;
    s.seed = 1;
    while ((c = getopt(argc, argv, "n:t:p:r:o:a:b:s:S:h")) != -1) {
        switch (c) {
        case 'n': servers = (unsigned)atoi(optarg); break;
        case 't': total = (unsigned)atoi(optarg); break;
        case 'p': period_ms = (unsigned)atoi(optarg); break;
        case 'r': rtt_ms = atof(optarg); break;
        case 'o': timeout_ms = atof(optarg); break;
        case 'a': s.base_us = atof(optarg); break;
        case 'b': s.per_row_us = atof(optarg); break;
        case 's': seconds = (unsigned)atoi(optarg); break;
        case 'S': s.seed = strtoull(optarg, NULL, 10); break;
        case 'h':
            printf("servers\ttotal\tperiod_ms\trtt_ms\tcalls_s\tredis_cpu\tqwait_p99_ms\t"
                   "timeouts\tchecked\tmax_sum\tviolations\tfollow_p50\tfollow_p99\t"
                   "follow_missed\treuse_p50\treuse_p99\treuse_missed\tjoin_p50\t"
                   "work_vs_ideal\treply_rows\n");
            return 0;
        default: usage();
        }
    }
    if (servers < 2 || servers > MAX_SRV / 2 || !total || period_ms < 10 || !seconds) {
        usage();
    }
    at_cluster_conf_init(&s.conf, total, period_ms * MS);
    s.rtt_us = (apr_int64_t)(rtt_ms * MS);
    s.timeout_us = (apr_int64_t)(timeout_ms * MS);
    s.srv = calloc(MAX_SRV, sizeof(*s.srv));
    s.rows = calloc(MAX_SRV, sizeof(*s.rows));
    s.queue = calloc(MAX_SRV, sizeof(*s.queue));
    if (!s.srv || !s.rows || !s.queue) {
        return 2;
    }
    for (i = 0; i < MAX_SRV; i++) {
        s.srv[i].peers = calloc(AT_CLUSTER_PEERS_MAX, sizeof(at_cluster_member_t));
        if (!s.srv[i].peers) {
            return 2;
        }
    }
    s.now_us = 1;
    s.target_alive = servers;
    for (i = 0; i < servers; i++) {
        server_join(&s);
    }
    s.now_us = 0;
    while (s.now_us < (apr_int64_t)seconds * 1000000) {
        step(&s);
    }
    close_waits(&s);
    printf("%u\t%u\t%u\t%.1f\t%.0f\t%.3f\t%.2f\t%llu\t%llu\t%llu\t%llu\t%.1f\t%.1f\t%u\t"
           "%.1f\t%.1f\t%u\t%.1f\t%.3f\t%.0f\n",
           servers, total, period_ms, rtt_ms, (double)s.calls / seconds,
           s.busy_us / (seconds * 1e6), pct(&s.qwait_ms, 0.99),
           (unsigned long long)s.timeouts, (unsigned long long)s.checked,
           (unsigned long long)s.max_sum, (unsigned long long)s.violations,
           pct(&s.follow, 0.5), pct(&s.follow, 0.99), s.follow.missed, pct(&s.reuse, 0.5),
           pct(&s.reuse, 0.99), s.reuse.missed, pct(&s.join, 0.5),
           s.ideal ? s.done / s.ideal : 0, s.calls ? (double)s.reply_rows / s.calls : 0);
    return s.violations ? 1 : 0;
}
