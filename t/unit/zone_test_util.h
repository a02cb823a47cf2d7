/* Helpers shared by the zone unit tests. */
#ifndef ZONE_TEST_UTIL_H
#define ZONE_TEST_UTIL_H

#include <sys/mman.h>
#include "at_zone.h"

/* A zone in anonymous shared memory, so fork()ed children share it. It has
 * spare records, as the module's zones do, so that the limit and the queue
 * capacity, not the size of the arrays, are what is tested. */
static inline at_zone_t *zone_new(apr_uint32_t limit, apr_uint32_t queue,
                                  apr_int64_t timeout_us)
{
    at_zone_conf_t c = {limit, queue, timeout_us, AT_RETRY_AFTER_AUTO, 0};
    apr_uint32_t nslots = limit * 2 + 4, nwaiters = queue * 2 + 4;
    apr_size_t size = at_zone_size(nslots, nwaiters);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (mem == MAP_FAILED
        || at_zone_init(mem, size, "test", &c, nslots, nwaiters)) {
        return NULL;
    }
    return mem;
}

static inline void zone_free(at_zone_t *z)
{
    at_zone_stats_t s;

    at_zone_stats(z, &s);
    munmap(z, at_zone_size(s.nslots, s.nwaiters));
}

#endif
