/*
 * Reading the memory available to new work.
 */
#include "at_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_LEN 1024
/* cgroup v1 writes a page-rounded LLONG_MAX for "no limit". */
#define V1_UNLIMITED (APR_UINT64_C(1) << 60)

static FILE *open_under(const char *root, const char *path)
{
    char full[PATH_LEN];

    if (snprintf(full, sizeof(full), "%s%s", root, path) >= (int)sizeof(full)) {
        return NULL;
    }
    return fopen(full, "r");
}

/* A file holding one number, or "max" (no limit). Returns 0 if read. */
static int read_number(const char *root, const char *path, apr_uint64_t *v,
                       int *unlimited)
{
    FILE *f = open_under(root, path);
    char word[32];
    char *end;
    int ok = 0;

    if (!f) {
        return -1;
    }
    *unlimited = 0;
    if (fscanf(f, "%31s", word) == 1) {
        if (strcmp(word, "max") == 0) {
            *unlimited = 1;
            ok = 1;
        }
        else {
            errno = 0;
            *v = strtoull(word, &end, 10);
            ok = errno == 0 && *end == '\0' && end != word;
        }
    }
    fclose(f);
    return ok ? 0 : -1;
}

/* "key value" lines, as in memory.stat and /proc/meminfo. */
static int read_keyed(const char *root, const char *path, const char *key,
                      apr_uint64_t *v)
{
    FILE *f = open_under(root, path);
    char line[256];
    size_t klen = strlen(key);
    int found = -1;

    if (!f) {
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, klen) == 0 && (line[klen] == ' ' || line[klen] == ':')) {
            char *p = line + klen + 1, *end;

            errno = 0;
            *v = strtoull(p, &end, 10);
            found = errno == 0 && end != p ? 0 : -1;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The cgroup path of this process: v2's "0::/path", or the v1 hierarchy
 * whose controllers include memory. */
static int own_cgroup(const char *root, int v1, char *out, size_t len)
{
    FILE *f = open_under(root, "/proc/self/cgroup");
    char line[PATH_LEN];
    int found = -1;

    if (!f) {
        return -1;
    }
    while (found && fgets(line, sizeof(line), f)) {
        char *ctl = strchr(line, ':'), *path;
        char *tok, *save;

        if (!ctl || !(path = strchr(ctl + 1, ':'))) {
            continue;
        }
        *path++ = '\0';
        *ctl++ = '\0';
        path[strcspn(path, "\n")] = '\0';
        if (!v1) {
            if (strcmp(line, "0") == 0 && *ctl == '\0') {
                found = 0;
            }
        }
        else {
            for (tok = strtok_r(ctl, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (strcmp(tok, "memory") == 0) {
                    found = 0;
                }
            }
        }
        if (!found && snprintf(out, len, "%s", path) >= (int)len) {
            found = -1;
        }
    }
    fclose(f);
    return found;
}

typedef struct {
    const char *mount; /* where the hierarchy is mounted */
    const char *limit, *usage, *stat, *inactive;
    int v1;
} cgroup_layout_t;

static const cgroup_layout_t v2_layout = {
    "/sys/fs/cgroup", "memory.max", "memory.current", "memory.stat", "inactive_file", 0};
static const cgroup_layout_t v1_layout = {
    "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
    "memory.stat",           "total_inactive_file",   1};

static int level_file(const cgroup_layout_t *l, const char *dir, const char *name,
                      char *path, size_t len)
{
    int n = snprintf(path, len, "%s%s/%s", l->mount, dir, name);

    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Headroom of one cgroup directory; 0 and *limited = 0 if it sets none. */
static int level_headroom(const char *root, const cgroup_layout_t *l, const char *dir,
                          apr_uint64_t *room, int *limited)
{
    char path[PATH_LEN];
    apr_uint64_t limit = 0, usage = 0, inactive = 0;
    int unlimited, dummy;

    *limited = 0;
    if (level_file(l, dir, l->limit, path, sizeof(path)) != 0 ||
        read_number(root, path, &limit, &unlimited) != 0) {
        return -1;
    }
    if (unlimited || (l->v1 && limit >= V1_UNLIMITED)) {
        return 0;
    }
    if (level_file(l, dir, l->usage, path, sizeof(path)) != 0 ||
        read_number(root, path, &usage, &dummy) != 0) {
        return -1;
    }
    if (level_file(l, dir, l->stat, path, sizeof(path)) == 0 &&
        read_keyed(root, path, l->inactive, &inactive) == 0 && inactive <= usage) {
        usage -= inactive;
    }
    *room = usage < limit ? limit - usage : 0;
    *limited = 1;
    return 0;
}

/* The least headroom of the cgroup and its ancestors. Levels that cannot be
 * read (not visible in this mount namespace) are skipped; returns 0 if any
 * level set a limit. */
static int cgroup_headroom(const char *root, const cgroup_layout_t *l, apr_uint64_t *room)
{
    char dir[PATH_LEN];
    int any = 0;

    if (own_cgroup(root, l->v1, dir, sizeof(dir)) != 0) {
        return -1;
    }
    for (;;) {
        apr_uint64_t r;
        int limited;
        char *slash;
        const char *level = strcmp(dir, "/") == 0 ? "" : dir;

        if (level_headroom(root, l, level, &r, &limited) == 0 && limited) {
            if (!any || r < *room) {
                *room = r;
            }
            any = 1;
        }
        if (!*level) {
            break;
        }
        slash = strrchr(dir, '/');
        if (!slash) {
            break;
        }
        if (slash == dir) {
            dir[1] = '\0';
        }
        else {
            *slash = '\0';
        }
    }
    return any ? 0 : -1;
}

apr_status_t at_mem_read(const char *root, apr_uint64_t *avail, at_mem_source_t *source)
{
    apr_uint64_t kb, room;
    int have_meminfo;

    if (!root) {
        root = "";
    }
    have_meminfo = read_keyed(root, "/proc/meminfo", "MemAvailable", &kb) == 0;
    if (cgroup_headroom(root, &v2_layout, &room) == 0) {
        *source = AT_MEM_CGROUP2;
    }
    else if (cgroup_headroom(root, &v1_layout, &room) == 0) {
        *source = AT_MEM_CGROUP1;
    }
    else if (have_meminfo) {
        *avail = kb * 1024;
        *source = AT_MEM_MEMINFO;
        return APR_SUCCESS;
    }
    else {
        return APR_ENOENT;
    }
    *avail = have_meminfo && kb * 1024 < room ? kb * 1024 : room;
    return APR_SUCCESS;
}

int at_mem_cgroup_unreadable(const char *root, char *path, size_t len)
{
    const cgroup_layout_t *layouts[2] = {&v2_layout, &v1_layout};
    char dir[PATH_LEN];
    apr_uint64_t room;
    int i, limited;

    if (!root) {
        root = "";
    }
    if (cgroup_headroom(root, &v2_layout, &room) == 0
        || cgroup_headroom(root, &v1_layout, &room) == 0) {
        return 0; /* a limit was read */
    }
    for (i = 0; i < 2; i++) {
        if (own_cgroup(root, layouts[i]->v1, dir, sizeof(dir)) == 0 && strcmp(dir, "/") != 0
            && level_headroom(root, layouts[i], dir, &room, &limited) != 0) {
            snprintf(path, len, "%s", dir);
            return 1;
        }
    }
    return 0;
}

const char *at_mem_source_name(at_mem_source_t source)
{
    switch (source) {
    case AT_MEM_MEMINFO: return "meminfo";
    case AT_MEM_CGROUP1: return "cgroup1";
    case AT_MEM_CGROUP2: return "cgroup2";
    default: return "none";
    }
}
