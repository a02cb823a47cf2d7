/*
 * How much memory new work may take: the memory cgroup's limit minus its
 * usage when the process runs inside a limited one (cgroup v2 or v1, the
 * tightest of the cgroup and its ancestors), and never more than the
 * kernel's MemAvailable.
 */
#ifndef AT_MEM_H
#define AT_MEM_H

#include <apr.h>
#include <apr_errno.h>

typedef enum {
    AT_MEM_UNREAD = 0,
    AT_MEM_MEMINFO, /* /proc/meminfo MemAvailable */
    AT_MEM_CGROUP1, /* memory.limit_in_bytes - memory.usage_in_bytes */
    AT_MEM_CGROUP2  /* memory.max - memory.current */
} at_mem_source_t;

/* Reads the files under root ("" for the real /proc and /sys; tests point
 * it at a directory laid out the same way). Usage counts page cache the
 * kernel would drop first (inactive_file) as free, as the kernel does before
 * it kills anything. */
apr_status_t at_mem_read(const char *root, apr_uint64_t *avail, at_mem_source_t *source);

const char *at_mem_source_name(at_mem_source_t source);

/* 1 if readings would fall back on the machine's MemAvailable although the
 * process sits in a cgroup other than the root whose memory limit cannot
 * be read (a container whose cgroup files are not mounted): then the
 * cgroup's path is in path. 0 otherwise. */
int at_mem_cgroup_unreadable(const char *root, char *path, size_t len);

#endif
