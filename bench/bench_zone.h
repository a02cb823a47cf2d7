/*
 * The benchmarks' zone (bench/micro.c, bench/scale.c): laid in anonymous
 * shared memory, so that fork()ed processes share it as the module's
 * children share theirs. A benchmark without its zone has nothing to
 * measure: it exits.
 */
#ifndef BENCH_ZONE_H
#define BENCH_ZONE_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "at_zone.h"

static inline at_zone_t *bench_zone_new(const at_zone_conf_t *c, apr_uint32_t nslots,
                                        apr_uint32_t nwaiters, const char *who)
{
    apr_size_t size = at_zone_size(nslots, nwaiters, 0);
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (mem == MAP_FAILED || at_zone_init(mem, size, who, c, nslots, nwaiters)) {
        fprintf(stderr, "%s: cannot lay out a zone\n", who);
        exit(1);
    }
    return mem;
}

static inline void bench_zone_free(at_zone_t *z)
{
    at_zone_stats_t s;

    at_zone_stats(z, &s);
    munmap(z, at_zone_size(s.nslots, s.nwaiters, s.rate_keys));
}

#endif
