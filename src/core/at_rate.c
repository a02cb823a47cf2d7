/*
 * rate=: GCRA buckets, one for the zone or one per key.
 */
#include "at_rate.h"
#include "at_rng.h"

#include <string.h>

at_rate_verdict_t at_rate_judge(const at_rate_conf_t *c, apr_int64_t tat, apr_int64_t now,
                                apr_int64_t *ns)
{
    /* how far the bucket runs ahead of the clock */
    apr_int64_t ahead = tat > now ? tat - now : 0;
    apr_int64_t burst = (apr_int64_t)c->burst * c->interval_ns;

    *ns = 0;
    if (ahead > burst) {
        *ns = ahead - burst;
        return AT_RATE_REFUSE;
    }
    if (c->delay != AT_RATE_NODELAY && ahead > (apr_int64_t)c->delay * c->interval_ns) {
        *ns = ahead - (apr_int64_t)c->delay * c->interval_ns;
        return AT_RATE_WAIT;
    }
    return AT_RATE_PASS;
}

void at_rate_spend(const at_rate_conf_t *c, apr_int64_t *tat, apr_int64_t now)
{
    *tat = (*tat > now ? *tat : now) + c->interval_ns;
}

apr_uint32_t at_rate_keys_for(const at_rate_conf_t *c, int keyed)
{
    return c->interval_ns && keyed ? AT_RATE_KEYS : 0;
}

static at_rate_entry_t *entries(const at_rate_table_t *t)
{
    return (at_rate_entry_t *)((char *)t + t->entries_off);
}

void at_rate_table_init(at_rate_table_t *t, at_rate_entry_t *e, apr_uint32_t n)
{
    memset(t, 0, sizeof(*t));
    t->entries_off = (apr_size_t)((char *)e - (char *)t);
    t->n = n;
    memset(e, 0, n * sizeof(*e));
}

/* Keys of texts are keyed hashes already (at_client_key_from_text):
 * nobody can choose where theirs lands. */
static apr_uint32_t home_of(const at_rate_table_t *t, const at_client_key_t *k)
{
    apr_uint64_t h = 0;

    memcpy(&h, k->b + 1, sizeof(h));
    h ^= (apr_uint64_t)k->b[0] << 56;
    h *= AT_GOLDEN64;
    return (apr_uint32_t)(h >> 32) & (t->n - 1);
}

apr_int64_t *at_rate_bucket(at_rate_table_t *t, const at_client_key_t *k, apr_int64_t now,
                            int *forgot)
{
    at_rate_entry_t *e = entries(t), *pick = NULL;
    apr_uint32_t j, home;

    *forgot = 0;
    if (!t->n || at_client_key_none(k)) {
        return NULL;
    }
    home = home_of(t, k);
    for (j = 0; j < AT_RATE_WAYS; j++) {
        at_rate_entry_t *c = &e[(home + j) & (t->n - 1)];

        if (memcmp(&c->key, k, sizeof(*k)) == 0) {
            return &c->tat_ns;
        }
        /* an empty bucket is as good as none; else the soonest empty */
        if (!pick || (pick->tat_ns > now && c->tat_ns < pick->tat_ns)) {
            pick = c;
        }
    }
    *forgot = pick->tat_ns > now;
    pick->key = *k;
    pick->tat_ns = 0;
    return &pick->tat_ns;
}

apr_uint32_t at_rate_keys_in(const at_rate_table_t *t, apr_int64_t now)
{
    const at_rate_entry_t *e = entries(t);
    apr_uint32_t i, n = 0;

    for (i = 0; i < t->n; i++) {
        /* read whole: a status read walks the table without the zone's lock */
        n += __atomic_load_n(&e[i].tat_ns, __ATOMIC_RELAXED) > now;
    }
    return n;
}
