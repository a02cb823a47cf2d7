/*
 * A backend for the benchmarks that only waits: each request is answered
 * after -m milliseconds, one thread per connection,
 * keep-alive kept, so httpd proxies to it the way it would to an
 * application server waiting on a database. Unlike the sleeping CGI, it
 * costs no fork per request: on two cores its throughput keeps rising with
 * concurrency, which makes it the truly sleep-bound case of S4.
 *
 * With -M CAP it is a backend of limited capacity (a database, an API
 * that takes CAP requests at once): a request that starts while more than
 * CAP are in progress waits MS x (in progress / CAP)^2, as contention makes
 * every request slower. With -s FILE it counts itself: every 100 ms it
 * appends "MS_SINCE_START PEAK" to FILE, PEAK being the most requests it
 * had in progress at once in those 100 ms, so that a cap in front of it is
 * judged by the backend, not by the module.
 *
 * Usage: sleep-backend -p PORT [-m MS=200] [-d SECONDS=600] [-M CAP] [-s FILE]
 * Listens on 127.0.0.1 only and exits after SECONDS whatever happens.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long wait_ms = 200;
static long capacity; /* 0: no limit, the wait is always wait_ms */
static long in_progress, peak;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The length of the head at the start of buf (through its blank line), or 0
 * while it is incomplete. */
static size_t head_length(const char *buf, size_t n)
{
    for (size_t i = 3; i < n; i++) {
        if (buf[i - 3] == '\r' && buf[i - 2] == '\n' && buf[i - 1] == '\r' &&
            buf[i] == '\n') {
            return i + 1;
        }
    }
    return 0;
}

/* A header's value in the head (after its colon and blanks), or NULL. */
static const char *header_value(const char *head, const char *name)
{
    size_t len = strlen(name);

    for (const char *p = strchr(head, '\n'); p; p = strchr(p, '\n')) {
        p++;
        if (strncasecmp(p, name, len) == 0 && p[len] == ':') {
            for (p += len + 1; *p == ' ' || *p == '\t'; p++) {
            }
            return p;
        }
    }
    return NULL;
}

/* Whether the client closes after this request: it says so, or speaks
 * HTTP/1.0 without asking to keep the connection. */
static int wants_close(const char *head)
{
    const char *v = header_value(head, "Connection");
    const char *eol = strstr(head, "\r\n");

    if (v) {
        return strncasecmp(v, "close", 5) == 0;
    }
    return eol && eol - head >= 8 && strncmp(eol - 8, "HTTP/1.0", 8) == 0;
}

/* One more request in progress; returns how long it waits. */
static long begin_request(void)
{
    long n, ms = wait_ms;

    pthread_mutex_lock(&count_lock);
    n = ++in_progress;
    if (n > peak) {
        peak = n;
    }
    pthread_mutex_unlock(&count_lock);
    if (capacity > 0 && n > capacity) {
        ms = (long)((double)wait_ms * (double)n * (double)n /
                    ((double)capacity * (double)capacity));
    }
    return ms;
}

static void end_request(void)
{
    pthread_mutex_lock(&count_lock);
    in_progress--;
    pthread_mutex_unlock(&count_lock);
}

/* Every 100 ms, the peak of requests in progress since the last line. */
static void *record_peaks(void *arg)
{
    FILE *f = arg;
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        long p;

        nap(100);
        pthread_mutex_lock(&count_lock);
        p = peak;
        peak = in_progress;
        pthread_mutex_unlock(&count_lock);
        clock_gettime(CLOCK_MONOTONIC, &t);
        fprintf(f, "%ld %ld\n",
                (long)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000), p);
        fflush(f);
    }
    return NULL;
}

/* Serves one connection: each request read whole (a body by its
 * Content-Length), then the wait, then the answer. */
static void *serve(void *arg)
{
    int fd = (int)(long)arg;
    char buf[16384];
    size_t have = 0;
    static const char answer[] = "HTTP/1.1 200 OK\r\n"
                                 "Content-Type: text/plain\r\n"
                                 "Content-Length: 6\r\n"
                                 "\r\n"
                                 "slept\n";

    for (;;) {
        size_t head;
        ssize_t r;

        while ((head = head_length(buf, have)) == 0) {
            if (have == sizeof(buf) - 1) {
                goto done; /* a head this long is not a benchmark's */
            }
            r = read(fd, buf + have, sizeof(buf) - 1 - have);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                goto done;
            }
            have += (size_t)r;
        }
        buf[have] = '\0';
        char saved = buf[head];
        buf[head] = '\0';
        const char *length = header_value(buf, "Content-Length");
        long body = length ? atol(length) : 0;
        int close_after = wants_close(buf);
        buf[head] = saved;

        /* Drop this request's head and body, keep what follows. */
        size_t used = head + (body > 0 ? (size_t)body : 0);
        while (used > have) {
            used -= have;
            have = 0;
            r = read(fd, buf, sizeof(buf) - 1);
            if (r < 0 && errno == EINTR) {
                continue;
            }
            if (r <= 0) {
                goto done;
            }
            have = (size_t)r;
        }
        memmove(buf, buf + used, have - used);
        have -= used;

        nap(begin_request());
        end_request();
        if (write_all(fd, answer, sizeof(answer) - 1) < 0 || close_after) {
            goto done;
        }
    }
done:
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    int port = 0, opt, one = 1, lfd;
    unsigned seconds = 600;
    const char *peaks = NULL;
    struct sockaddr_in sa;
    pthread_attr_t attr;
    static const char usage[] = "usage: %s -p PORT [-m MS] [-d SECONDS] [-M CAP] [-s FILE]\n";

    while ((opt = getopt(argc, argv, "p:m:d:M:s:")) != -1) {
        switch (opt) {
        case 'p': port = atoi(optarg); break;
        case 'm': wait_ms = atol(optarg); break;
        case 'd': seconds = (unsigned)atoi(optarg); break;
        case 'M': capacity = atol(optarg); break;
        case 's': peaks = optarg; break;
        default:
            fprintf(stderr, usage, argv[0]);
            return 2;
        }
    }
    if (port <= 0 || port > 65535 || wait_ms < 0 || seconds == 0 || capacity < 0) {
        fprintf(stderr, usage, argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    alarm(seconds); /* bounded whatever its caller does */

    lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 1024) < 0) {
        perror("sleep-backend: bind/listen");
        return 1;
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (peaks) {
        FILE *f = fopen(peaks, "a");
        pthread_t t;

        if (!f || pthread_create(&t, &attr, record_peaks, f) != 0) {
            perror("sleep-backend: -s");
            return 1;
        }
    }
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        pthread_t t;

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno == EMFILE || errno == ENFILE) {
                nap(10); /* until a connection closes, without spinning */
                continue;
            }
            perror("sleep-backend: accept");
            return 1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (pthread_create(&t, &attr, serve, (void *)(long)fd) != 0) {
            close(fd);
        }
    }
}
