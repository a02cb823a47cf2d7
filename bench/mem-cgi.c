/*
 * The heavy request of benchmark S5: a CGI that takes MEM_MIB (200) MiB of
 * memory, all of it touched, holds it for HOLD_MS (70) ms, and answers.
 * MAP_POPULATE touches the pages in the kernel, which is fast here (33 ms
 * for 200 MiB, where touching them one by one from user space takes 0.5 s),
 * so the request lasts about 100 ms as S5 asks.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static long env_or(const char *name, long dflt)
{
    const char *v = getenv(name);

    return v && *v ? atol(v) : dflt;
}

int main(void)
{
    size_t len = (size_t)env_or("MEM_MIB", 200) << 20;
    long hold = env_or("HOLD_MS", 70);
    struct timespec ts = {hold / 1000, (hold % 1000) * 1000000L};
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

    if (p == MAP_FAILED) {
        fputs("Status: 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n"
              "no memory\n",
              stdout);
        return 0;
    }
    nanosleep(&ts, NULL);
    fputs("Content-Type: text/plain\r\n\r\nok\n", stdout);
    return 0;
}
