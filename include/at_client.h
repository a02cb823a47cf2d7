/*
 * Requests per client, for per_client: who a request counts against (a key
 * made from the client's address) and a table of counts that lives in a
 * zone's shared memory. The table holds no pointers: its entries sit at an
 * offset from the table itself, so every process may map it anywhere.
 */
#ifndef AT_CLIENT_H
#define AT_CLIENT_H

#include <apr.h>
#include <apr_network_io.h>

/* The client's family in the first byte, then its address (IPv6: the
 * prefix). All zero: nobody, never counted. */
#define AT_CLIENT_KEY_LEN 17
typedef struct {
    unsigned char b[AT_CLIENT_KEY_LEN];
} at_client_key_t;

/* IPv4 addresses count one by one, and so do IPv6 addresses that carry one
 * (::ffff:a.b.c.d, ::a.b.c.d). Other IPv6 addresses count per prefix of
 * v6_prefix bits (0: AT_CLIENT_V6_PREFIX): a host given a /64 cannot dodge
 * the limit by hopping through the addresses of its subnet. */
void at_client_key_from_sockaddr(const apr_sockaddr_t *sa, apr_uint32_t v6_prefix,
                                 at_client_key_t *out);

int at_client_key_none(const at_client_key_t *k);

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
} at_client_table_t;

/* Entries for at most `requests` counted at once. */
apr_uint32_t at_client_entries_for(apr_uint64_t requests);

/* entries: n entries of memory after the table, in the same block; seed:
 * anything that differs between servers (it is mixed). */
void at_client_table_init(at_client_table_t *t, at_client_entry_t *entries, apr_uint32_t n,
                          apr_uint64_t seed);
void at_client_table_clear(at_client_table_t *t);
apr_uint32_t at_client_count(at_client_table_t *t, const at_client_key_t *k);
void at_client_add(at_client_table_t *t, const at_client_key_t *k);
void at_client_remove(at_client_table_t *t, const at_client_key_t *k);
/* How many clients have a request counted (reads the whole table). */
apr_uint32_t at_client_in(at_client_table_t *t);

#endif
