/*
 * Requests per client, for per_client and per_key: who a request counts
 * against (a key made from the client's address, or from any text) and a
 * table of counts that lives in a zone's shared memory. The table holds no pointers: its entries sit at an
 * offset from the table itself, so every process may map it anywhere.
 */
#ifndef AT_CLIENT_H
#define AT_CLIENT_H

#include <apr.h>
#include <apr_network_io.h>

/* per_client counts IPv6 clients per /64 (one site's subnet) by default;
 * per_client_v6 takes /32 to /128. */
#define AT_CLIENT_V6_PREFIX 64
#define AT_CLIENT_V6_PREFIX_MIN 32

/* The client's family in the first byte, then its address (IPv6: the
 * prefix); or AT_CLIENT_KEY_TEXT, then a 128-bit keyed hash of a text.
 * All zero: nobody, never counted. */
#define AT_CLIENT_KEY_LEN 17
#define AT_CLIENT_KEY_TEXT 0xff
typedef struct {
    unsigned char b[AT_CLIENT_KEY_LEN];
} at_client_key_t;

/* IPv4 addresses count one by one, and so do IPv6 addresses that carry one
 * (::ffff:a.b.c.d, ::a.b.c.d). Other IPv6 addresses count per prefix of
 * v6_prefix bits (0: AT_CLIENT_V6_PREFIX): a host given a /64 cannot dodge
 * the limit by hopping through the addresses of its subnet. */
void at_client_key_from_sockaddr(const apr_sockaddr_t *sa, apr_uint32_t v6_prefix,
                                 at_client_key_t *out);

/* Nobody: the key of a request with no client, all zero. */
extern const at_client_key_t at_client_nobody;
int at_client_key_none(const at_client_key_t *k);

/* SipHash-2-4 of data under the 128-bit key k0, k1. */
apr_uint64_t at_siphash24(apr_uint64_t k0, apr_uint64_t k1, const void *data, apr_size_t n);

typedef struct {
    at_client_key_t key;
    unsigned char key_pad[3]; /* to count's alignment: shared layouts name their padding */
    apr_uint32_t count;
    apr_uint32_t pad;
} at_client_entry_t;

/* An open-addressed table with linear probing; an entry is empty when its
 * count is 0. Sized for twice the requests that can be counted at once, so
 * it is never more than half full. */
typedef struct {
    apr_size_t entries_off; /* from the table itself */
    apr_uint32_t n;         /* a power of two */
    apr_uint32_t pad;
    apr_uint64_t seed;      /* so that nobody can choose colliding addresses */
    apr_uint64_t secret[2]; /* random: the key of texts' hashes (per_key) */
} at_client_table_t;

/* Entries for at most `requests` counted at once. */
apr_uint32_t at_client_entries_for(apr_uint64_t requests);

/* entries: n entries of memory after the table, in the same block; seed:
 * anything that differs between servers (it is mixed). The secret comes
 * from the system's random source. */
void at_client_table_init(at_client_table_t *t, at_client_entry_t *entries, apr_uint32_t n,
                          apr_uint64_t seed);
void at_client_table_clear(at_client_table_t *t);
/* The key of a text (per_key: an API key, a user): a hash under the
 * table's secret, so that nobody can make up a text that counts as
 * another's. An empty text is nobody. */
void at_client_key_from_text(const at_client_table_t *t, const char *text, apr_size_t n,
                             at_client_key_t *out);
apr_uint32_t at_client_count(at_client_table_t *t, const at_client_key_t *k);
void at_client_add(at_client_table_t *t, const at_client_key_t *k);
void at_client_remove(at_client_table_t *t, const at_client_key_t *k);
/* The k clients with the most requests counted, most first, and in *in
 * how many clients have one (one pass over the whole table); returns how
 * many it put in out, at most k. */
apr_uint32_t at_client_busiest(at_client_table_t *t, at_client_entry_t *out, apr_uint32_t k,
                               apr_uint32_t *in);

/* A key as the status page shows it: an IPv4 address, an IPv6 prefix, or
 * for a text the first 64 bits of its hash in hex (THROTTLE_KEY). */
#define AT_CLIENT_KEY_TEXT_LEN 48
void at_client_key_show(const at_client_key_t *k, char *buf, apr_size_t n);

#endif
