/*
 * libFuzzer target for the argument parsers: whatever bytes arrive, the
 * parsers return a message or a value within its documented range, and
 * never read or write out of bounds (ASan, UBSan).
 *
 * The input is split at spaces into words, as httpd splits a directive's
 * arguments; its first byte picks the parser.
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <apr_general.h>
#include <apr_pools.h>
#include <apr_strings.h>

#include "at_parse.h"

#define MAX_WORDS 32

static apr_pool_t *root;

static int split_words(apr_pool_t *p, const char *s, const char **argv)
{
    char *copy = apr_pstrdup(p, s), *last, *w;
    int n = 0;

    for (w = apr_strtok(copy, " ", &last); w && n < MAX_WORDS;
         w = apr_strtok(NULL, " ", &last)) {
        argv[n++] = w;
    }
    return n;
}

static void check_zone_args(apr_pool_t *p, const char *s)
{
    const char *argv[MAX_WORDS];
    int argc = split_words(p, s, argv);
    at_zone_conf_t c;
    const char *err = at_parse_zone_args(p, argc, argv, &c);

    if (!err) {
        assert(c.limit >= 1 && c.limit <= AT_LIMIT_MAX);
        assert(c.queue <= AT_QUEUE_MAX);
        assert(c.timeout_us > 0 && c.timeout_us <= AT_TIMEOUT_MAX_US);
        assert(c.retry_after <= AT_RETRY_AFTER_MAX);
        assert(c.per_client <= AT_LIMIT_MAX + AT_QUEUE_MAX);
        assert(c.mem_bytes <= AT_MEM_MAX);
        assert(!c.limit_auto
               || (c.limit_min >= 1 && c.limit_min <= c.limit && c.limit <= c.limit_max
                   && c.limit_max <= AT_LIMIT_MAX));
        assert(c.reserve < at_conf_highest_limit(&c));
        assert(c.codel_target_us >= 0 && c.codel_target_us < c.timeout_us);
        assert(c.codel_interval_us >= 0 && c.codel_interval_us <= AT_TIMEOUT_MAX_US);
    }
    else {
        assert(*err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    apr_pool_t *p;
    const char *s, *err;
    apr_uint64_t n;
    apr_int64_t us;
    int prio;

    if (!root) {
        apr_initialize();
        apr_pool_create(&root, NULL);
    }
    if (size < 1) {
        return 0;
    }
    apr_pool_create(&p, root);
    s = apr_pstrmemdup(p, (const char *)data + 1, size - 1); /* stops at a NUL */
    switch (data[0] % 6) {
    case 0:
        check_zone_args(p, s);
        break;
    case 1:
        err = at_parse_duration(p, s, &us);
        assert(err || (us > 0 && us <= AT_TIMEOUT_MAX_US));
        break;
    case 2:
        err = at_parse_uint(p, s, 1, 1000, &n);
        assert(err || (n >= 1 && n <= 1000));
        break;
    case 3:
        err = at_parse_size(p, s, 1, AT_MEM_MAX, &n);
        assert(err || (n >= 1 && n <= AT_MEM_MAX));
        break;
    case 4: {
        /* ThrottlePriority N [timeout=D]: two words at most */
        const char *argv[MAX_WORDS];
        int argc = split_words(p, s, argv);
        if (argc >= 1 && argc <= 2) {
            err = at_parse_priority(p, argv[0], argc == 2 ? argv[1] : NULL, &prio, &us);
            assert(err ||
                   (prio >= AT_PARSE_PRIORITY_MIN && prio <= AT_PARSE_PRIORITY_MAX &&
                    us >= 0 && us <= AT_TIMEOUT_MAX_US));
        }
        break;
    }
    default:
        err = at_parse_zone_name(p, s);
        assert(err || (strlen(s) >= 1 && strlen(s) <= AT_ZONE_NAME_MAX));
        break;
    }
    apr_pool_destroy(p);
    return 0;
}
