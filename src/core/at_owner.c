/*
 * Process identity and liveness, for reclaiming what a dead process held.
 */
#include "at_owner.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static at_owner_t self;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

/* Only async-signal-safe calls: this also runs in a child right after fork. */
static int owner_read(apr_int32_t pid, at_owner_t *out, char *state)
{
    char path[64], buf[1024];
    char *p;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: skip to the last ')'. */
    p = strrchr(buf, ')');
    if (!p || p[1] != ' ') {
        return -1;
    }
    p += 2;
    if (state) {
        *state = *p;
    }
    /* p is at field 3 (state); the start time is field 22. */
    for (field = 3; field < 22 && *p; p++) {
        if (*p == ' ') {
            field++;
        }
    }
    out->pid = pid;
    out->reserved = 0;
    out->start = strtoull(p, NULL, 10);
    return 0;
}

static void self_refresh(void)
{
    at_owner_t o;
    pid_t pid = getpid();

    if (owner_read(pid, &o, NULL) != 0) {
        o.pid = pid;
        o.reserved = 0;
        o.start = 0;
    }
    self = o;
}

static void self_init(void)
{
    self_refresh();
    pthread_atfork(NULL, NULL, self_refresh);
}

const at_owner_t *at_owner_self(void)
{
    pthread_once(&self_once, self_init);
    return &self;
}

int at_owner_same(const at_owner_t *a, const at_owner_t *b)
{
    return a->pid == b->pid && a->start == b->start;
}

int at_owner_alive(const at_owner_t *o)
{
    at_owner_t now;
    char state = '?';

    if (o->pid <= 0) {
        return 0;
    }
    if (owner_read(o->pid, &now, &state) != 0) {
        /* No /proc entry: either gone, or no procfs at all. */
        return !(kill(o->pid, 0) != 0 && errno == ESRCH);
    }
    if (state == 'Z' || state == 'X' || state == 'x') {
        return 0;
    }
    if (o->start != 0 && now.start != o->start) {
        return 0; /* the pid was reused */
    }
    return 1;
}
