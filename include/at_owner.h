/*
 * Process identity for crash-safe accounting: a pid alone is not enough,
 * because pids are reused; the process start time tells a new process with
 * an old pid apart.
 */
#ifndef AT_OWNER_H
#define AT_OWNER_H

#include <apr.h>

typedef struct {
    apr_int32_t pid;      /* 0: no owner */
    apr_uint32_t reserved;
    apr_uint64_t start;   /* start time in clock ticks since boot; 0 = unknown */
} at_owner_t;

/* The calling process's identity. Cached; refreshed in a child after fork(). */
const at_owner_t *at_owner_self(void);

/* 1 if the process named by @o is still running (a zombie counts as dead). */
int at_owner_alive(const at_owner_t *o);

int at_owner_same(const at_owner_t *a, const at_owner_t *b);

#endif
