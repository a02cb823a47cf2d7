/*
 * A CPU-bound CGI for the benchmarks: burns BENCH_CPU_MS (default 50) ms of
 * CPU time, then answers with the throttle's outcome. With BENCH_SLEEP_MS
 * it sleeps that long instead, as a handler waiting on a database does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double cpu_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(void)
{
    const char *env = getenv("BENCH_CPU_MS"), *nap = getenv("BENCH_SLEEP_MS");
    double target = env ? atof(env) : 50, start = cpu_ms();
    volatile unsigned long x = 0;

    if (nap) {
        long ms = atol(nap);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

        nanosleep(&ts, NULL);
        target = 0;
    }

    while (cpu_ms() - start < target) {
        for (int i = 0; i < 10000; i++) {
            x += (unsigned long)i * 2654435761u;
        }
    }
    printf("Content-Type: text/plain\r\n\r\nresult=%s\n",
           getenv("THROTTLE_RESULT") ? getenv("THROTTLE_RESULT") : "-");
    return 0;
}
