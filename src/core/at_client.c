/*
 * Requests per client: keys from addresses, and the table of counts.
 */
#include "at_client.h"
#include "at_rng.h"

#include <apr_general.h>
#include <arpa/inet.h>
#include <stdio.h>
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

const at_client_key_t at_client_nobody = {{0}};

int at_client_key_none(const at_client_key_t *k)
{
    return memcmp(k, &at_client_nobody, sizeof(*k)) == 0;
}

static apr_uint64_t rotl(apr_uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static void sip_round(apr_uint64_t v[4])
{
    v[0] += v[1];
    v[1] = rotl(v[1], 13) ^ v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16) ^ v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21) ^ v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17) ^ v[2];
    v[2] = rotl(v[2], 32);
}

static apr_uint64_t load_le64(const unsigned char *p, apr_size_t n)
{
    apr_uint64_t v = 0;

    while (n-- > 0) {
        v = (v << 8) | p[n];
    }
    return v;
}

apr_uint64_t at_siphash24(apr_uint64_t k0, apr_uint64_t k1, const void *data, apr_size_t n)
{
    const unsigned char *p = data;
    apr_uint64_t v[4] = {k0 ^ APR_UINT64_C(0x736f6d6570736575),
                         k1 ^ APR_UINT64_C(0x646f72616e646f6d),
                         k0 ^ APR_UINT64_C(0x6c7967656e657261),
                         k1 ^ APR_UINT64_C(0x7465646279746573)};
    apr_uint64_t m;
    apr_size_t i;
    int r;

    for (i = 0; i + 8 <= n; i += 8) {
        m = load_le64(p + i, 8);
        v[3] ^= m;
        sip_round(v);
        sip_round(v);
        v[0] ^= m;
    }
    /* the last word: what is left, and the length's low byte on top */
    m = load_le64(p + i, n - i) | (apr_uint64_t)(n & 0xff) << 56;
    v[3] ^= m;
    sip_round(v);
    sip_round(v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for (r = 0; r < 4; r++) {
        sip_round(v);
    }
    return v[0] ^ v[1] ^ v[2] ^ v[3];
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
    t->seed = at_mix64(seed);
    if (apr_generate_random_bytes((unsigned char *)t->secret, sizeof(t->secret))
        != APR_SUCCESS) {
        /* no random source: as hard to guess as the seed, no harder */
        t->secret[0] = at_mix64(t->seed ^ AT_GOLDEN64);
        t->secret[1] = at_mix64(t->secret[0]);
    }
    at_client_table_clear(t);
}

void at_client_table_clear(at_client_table_t *t)
{
    memset(entries(t), 0, t->n * sizeof(at_client_entry_t));
}

void at_client_key_from_text(const at_client_table_t *t, const char *text, apr_size_t n,
                             at_client_key_t *out)
{
    apr_uint64_t h[2];

    memset(out, 0, sizeof(*out));
    if (!text || n == 0) {
        return;
    }
    /* two hashes under two keys: 128 bits, so that texts never meet by chance */
    h[0] = at_siphash24(t->secret[0], t->secret[1], text, n);
    h[1] = at_siphash24(t->secret[1], t->secret[0] ^ APR_UINT64_C(0xa5a5a5a5a5a5a5a5), text, n);
    out->b[0] = AT_CLIENT_KEY_TEXT;
    memcpy(out->b + 1, h, sizeof(h));
}

static apr_uint32_t home_of(const at_client_table_t *t, const at_client_key_t *k)
{
    apr_uint64_t lo = 0, hi = 0;

    memcpy(&lo, k->b, 8);
    memcpy(&hi, k->b + 8, 8);
    return (apr_uint32_t)(at_mix64(at_mix64(at_mix64(lo ^ t->seed) ^ hi) ^ k->b[16])
                          & (t->n - 1));
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

/* Whether a goes before b among the busiest: more requests, then the key,
 * so that ties come out the same on every read. */
static int busier(const at_client_entry_t *a, const at_client_entry_t *b)
{
    return a->count != b->count ? a->count > b->count
                                : memcmp(&a->key, &b->key, sizeof(a->key)) < 0;
}

apr_uint32_t at_client_busiest(at_client_table_t *t, at_client_entry_t *out, apr_uint32_t k,
                               apr_uint32_t *in)
{
    apr_uint32_t i, j, n = 0;

    *in = 0;
    for (i = 0; i < t->n; i++) {
        const at_client_entry_t *e = &entries(t)[i];

        if (e->count == 0) {
            continue;
        }
        ++*in;
        if (k == 0 || (n == k && !busier(e, &out[n - 1]))) {
            continue;
        }
        /* insertion into the k kept so far, most first */
        j = n < k ? n++ : n - 1;
        for (; j > 0 && busier(e, &out[j - 1]); j--) {
            out[j] = out[j - 1];
        }
        out[j] = *e;
    }
    return n;
}

void at_client_key_show(const at_client_key_t *k, char *buf, apr_size_t n)
{
    apr_uint64_t h;

    if (k->b[0] == AT_CLIENT_KEY_TEXT) {
        memcpy(&h, k->b + 1, sizeof(h));
        snprintf(buf, n, "%016" APR_UINT64_T_HEX_FMT, h);
    }
    else if (k->b[0] == 4) {
        snprintf(buf, n, "%u.%u.%u.%u", k->b[1], k->b[2], k->b[3], k->b[4]);
    }
    else if (k->b[0] == 6 && inet_ntop(AF_INET6, k->b + 1, buf, (socklen_t)n)) {
        return;
    }
    else {
        snprintf(buf, n, "-");
    }
}
