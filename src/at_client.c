/*
 * Requests per client: keys from addresses, and the table of counts.
 */
#include "at_client.h"
#include "at_parse.h" /* AT_CLIENT_V6_PREFIX */

#include <string.h>

static void key_v4(const unsigned char *a, at_client_key_t *out)
{
    out->b[0] = 4;
    memcpy(out->b + 1, a, 4);
}

#if APR_HAVE_IPV6
/* ::ffff:a.b.c.d, or the old ::a.b.c.d (but not :: or ::1). */
static int embeds_v4(const unsigned char *a)
{
    static const unsigned char zero[10];

    if (memcmp(a, zero, 10) != 0) {
        return 0;
    }
    if (a[10] == 0xff && a[11] == 0xff) {
        return 1;
    }
    return a[10] == 0 && a[11] == 0 && (a[12] | a[13] | a[14]) != 0;
}
#endif

void at_client_key_from_sockaddr(const apr_sockaddr_t *sa, apr_uint32_t v6_prefix,
                                 at_client_key_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!sa || !sa->ipaddr_ptr) {
        return;
    }
#if APR_HAVE_IPV6
    if (sa->family == APR_INET6) {
        const unsigned char *a = sa->ipaddr_ptr;
        apr_uint32_t bits = v6_prefix ? v6_prefix : AT_CLIENT_V6_PREFIX, i;

        if (embeds_v4(a)) {
            key_v4(a + 12, out);
            return;
        }
        out->b[0] = 6;
        for (i = 0; i < 16 && bits > 0; i++, bits = bits > 8 ? bits - 8 : 0) {
            out->b[1 + i] = bits >= 8 ? a[i] : (unsigned char)(a[i] & (0xff << (8 - bits)));
        }
        return;
    }
#endif
    if (sa->family == APR_INET && sa->ipaddr_len == 4) {
        key_v4(sa->ipaddr_ptr, out);
    }
}

int at_client_key_none(const at_client_key_t *k)
{
    static const at_client_key_t zero;
    return memcmp(k, &zero, sizeof(zero)) == 0;
}

static apr_uint64_t mix64(apr_uint64_t x)
{
    x ^= x >> 30;
    x *= APR_UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= APR_UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

apr_uint32_t at_client_entries_for(apr_uint64_t requests)
{
    apr_uint32_t n = 16;

    while (n < 2 * requests) {
        n <<= 1;
    }
    return n;
}

static at_client_entry_t *entries(at_client_table_t *t)
{
    return (at_client_entry_t *)((char *)t + t->entries_off);
}

void at_client_table_init(at_client_table_t *t, at_client_entry_t *e, apr_uint32_t n,
                          apr_uint64_t seed)
{
    t->entries_off = (apr_size_t)((char *)e - (char *)t);
    t->n = n;
    t->seed = mix64(seed);
    at_client_table_clear(t);
}

void at_client_table_clear(at_client_table_t *t)
{
    memset(entries(t), 0, t->n * sizeof(at_client_entry_t));
}

static apr_uint32_t home_of(const at_client_table_t *t, const at_client_key_t *k)
{
    apr_uint64_t lo = 0, hi = 0;

    memcpy(&lo, k->b, 8);
    memcpy(&hi, k->b + 8, 8);
    return (apr_uint32_t)(mix64(mix64(mix64(lo ^ t->seed) ^ hi) ^ k->b[16]) & (t->n - 1));
}

/* The entry for k, or the empty one where it would go. */
static apr_uint32_t find(at_client_table_t *t, const at_client_key_t *k)
{
    at_client_entry_t *c = entries(t);
    apr_uint32_t i = home_of(t, k), mask = t->n - 1;

    while (c[i].count && memcmp(&c[i].key, k, sizeof(*k)) != 0) {
        i = (i + 1) & mask;
    }
    return i;
}

apr_uint32_t at_client_count(at_client_table_t *t, const at_client_key_t *k)
{
    return at_client_key_none(k) ? 0 : entries(t)[find(t, k)].count;
}

void at_client_add(at_client_table_t *t, const at_client_key_t *k)
{
    at_client_entry_t *c;

    if (at_client_key_none(k)) {
        return;
    }
    c = &entries(t)[find(t, k)];
    if (c->count++ == 0) {
        c->key = *k;
    }
}

/* Emptying an entry shifts later ones of the same run back, so lookups
 * never need tombstones and the table never fills with them. */
void at_client_remove(at_client_table_t *t, const at_client_key_t *k)
{
    at_client_entry_t *c = entries(t);
    apr_uint32_t i, j, mask = t->n - 1;

    if (at_client_key_none(k)) {
        return;
    }
    i = find(t, k);
    if (c[i].count == 0 || --c[i].count > 0) {
        return;
    }
    for (j = (i + 1) & mask; c[j].count; j = (j + 1) & mask) {
        apr_uint32_t home = home_of(t, &c[j].key);
        /* Move j into the hole at i unless its home lies in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            c[i] = c[j];
            c[j].count = 0;
            i = j;
        }
    }
}

apr_uint32_t at_client_in(at_client_table_t *t)
{
    apr_uint32_t i, n = 0;

    for (i = 0; i < t->n; i++) {
        n += entries(t)[i].count > 0;
    }
    return n;
}
