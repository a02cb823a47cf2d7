/*
 * loadgen: a small closed-loop HTTP/1.0 load generator for the benchmarks.
 * Every request is recorded (start and end in microseconds from the start
 * of the run, and the status; 0 for a connection error), so that any
 * statistic can be computed afterwards. Bounded by time and by count, and
 * talks to the loopback network only (127.0.0.1, or -a 127.x.y.z).
 *
 *   loadgen [-a 127.x.y.z] -p PORT -c CLIENTS -d SECONDS [-n MAX_REQUESTS] [-u PATH]
 *           [-r] [-s] [-o FILE]
 *
 *   -r  honour Retry-After: after a 503 a client waits that many seconds
 *       (as polite clients and retrying proxies do)
 *   -R RATE  open loop: requests arrive at RATE per second whatever the
 *       answers, served by up to CLIENTS connections at once; a request's
 *       latency counts from its scheduled arrival, so queueing in the
 *       generator is not hidden
 *   -t SECONDS  patience: a client that has no whole answer that long after
 *       its request began (its arrival, in an open loop) closes the
 *       connection and records status -1, as impatient users and proxies do
 *   -m SECONDS  with -r, wait at most this long after a 503
 *   -z MS  think time: a closed-loop client pauses this long between requests
 *   -s  HTTPS (OpenSSL): every request a new TLS connection, the server's
 *       certificate not checked (the benchmarks' are self-signed); each
 *       client resumes its last session, as a returning browser does. The
 *       output ends with a line "# tls: N handshakes, M resumed".
 */
#define _GNU_SOURCE /* strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int64_t start_us, end_us;
    int status;
} sample_t;

typedef struct {
    sample_t *v;
    size_t n, cap;
    SSL_SESSION *session; /* -s: the last one, to resume */
} samples_t;

/* A request's connection: plain when ssl is NULL. */
typedef struct {
    int fd;
    SSL *ssl;
} conn_t;

static int port, clients, honour_retry_after;
static in_addr_t target_addr; /* network order; 127.0.0.0/8 only */
static double seconds, rate, patience, max_retry_after, think_ms;
static long arrivals;
static long max_requests;
static const char *path = "/";
static int64_t t0, deadline;
static long issued;
static pthread_mutex_t issued_lock = PTHREAD_MUTEX_INITIALIZER;
static SSL_CTX *tls; /* -s */
static long tls_handshakes, tls_resumed;

static int64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_until(int64_t t_us)
{
    struct timespec ts = {.tv_sec = t_us / 1000000, .tv_nsec = (t_us % 1000000) * 1000};

    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static int take_ticket(void)
{
    int ok;

    pthread_mutex_lock(&issued_lock);
    ok = max_requests <= 0 || issued < max_requests;
    issued += ok;
    pthread_mutex_unlock(&issued_lock);
    return ok;
}

/* Waits until fd is ready for events or give_up_us (0: never) passes: 1
 * ready, 0 given up. */
static int ready_before(int fd, short events, int64_t give_up_us)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int64_t left;

    while ((left = give_up_us > 0 ? give_up_us - now_us() : 1000000) > 0) {
        int n = poll(&pfd, 1, (int)((left + 999) / 1000));

        if (n > 0) {
            return 1;
        }
        if (n < 0 && errno != EINTR) {
            return 1; /* let the read or write report it */
        }
    }
    return 0;
}

/* After an SSL call returned ret: waits for what it wants. 1 try again,
 * 0 given up at give_up_us, -1 the connection ended or failed. The socket
 * is non-blocking, so that a patient client's wait stays bounded. */
static int tls_wait(conn_t *c, int ret, int64_t give_up_us)
{
    switch (SSL_get_error(c->ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        return ready_before(c->fd, POLLIN, give_up_us);
    case SSL_ERROR_WANT_WRITE:
        return ready_before(c->fd, POLLOUT, give_up_us);
    default:
        ERR_clear_error();
        return -1;
    }
}

/* -s: the TLS handshake on c->fd, resuming the client's last session.
 * 1 done, 0 given up, -1 failed. */
static int tls_connect(conn_t *c, samples_t *s, int64_t give_up_us)
{
    int r, w;

    if (!(c->ssl = SSL_new(tls)) || !SSL_set_fd(c->ssl, c->fd)) {
        return -1;
    }
    if (s->session) {
        SSL_set_session(c->ssl, s->session);
    }
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    while ((r = SSL_connect(c->ssl)) != 1) {
        if ((w = tls_wait(c, r, give_up_us)) <= 0) {
            return w;
        }
    }
    __atomic_fetch_add(&tls_handshakes, 1, __ATOMIC_RELAXED);
    if (SSL_session_reused(c->ssl)) {
        __atomic_fetch_add(&tls_resumed, 1, __ATOMIC_RELAXED);
    }
    return 1;
}

/* Writes all of buf: 1 done, 0 given up, -1 failed. */
static int conn_write(conn_t *c, const char *buf, int len, int64_t give_up_us)
{
    int r, w;

    if (!c->ssl) {
        return write(c->fd, buf, (size_t)len) == len ? 1 : -1;
    }
    while ((r = SSL_write(c->ssl, buf, len)) <= 0) {
        if ((w = tls_wait(c, r, give_up_us)) <= 0) {
            return w;
        }
    }
    return r == len ? 1 : -1;
}

/* Reads what comes before give_up_us: > 0 bytes, 0 the end (or an error),
 * -1 given up. */
static ssize_t conn_read(conn_t *c, char *buf, size_t len, int64_t give_up_us)
{
    ssize_t n;
    int w;

    if (!c->ssl) {
        if (!ready_before(c->fd, POLLIN, give_up_us)) {
            return -1;
        }
        n = read(c->fd, buf, len);
        return n > 0 ? n : 0;
    }
    while ((n = SSL_read(c->ssl, buf, (int)len)) <= 0) {
        if ((w = tls_wait(c, (int)n, give_up_us)) <= 0) {
            return w < 0 ? 0 : -1;
        }
    }
    return n;
}

/* Closes c; with TLS keeps its session (tickets come after the handshake,
 * so only now) for the client's next connection. */
static void conn_close(conn_t *c, samples_t *s)
{
    if (c->ssl) {
        SSL_SESSION *sess = SSL_get1_session(c->ssl);

        /* Closed without a close_notify of ours (httpd has closed already),
         * but as if shut down: SSL_free would mark the session unusable. */
        SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);

        if (sess && SSL_SESSION_is_resumable(sess)) {
            if (s->session) {
                SSL_SESSION_free(s->session);
            }
            s->session = sess;
        }
        else if (sess) {
            SSL_SESSION_free(sess);
        }
        SSL_free(c->ssl);
    }
    close(c->fd);
}

/* One request; returns the status (0: connection failed, -1: given up at
 * give_up_us), and the Retry-After value in *retry_after (0 if absent). */
static int one_request(samples_t *s, int *retry_after, int64_t give_up_us)
{
    struct sockaddr_in sa;
    char req[512], buf[16384];
    size_t got = 0;
    ssize_t n;
    int status = 0, r = 0;
    conn_t c = {.fd = -1, .ssl = NULL};
    char *p;

    *retry_after = 0;
    c.fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c.fd < 0) {
        return 0;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = target_addr;
    if (connect(c.fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        conn_close(&c, s);
        return 0;
    }
    n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if ((tls && (r = tls_connect(&c, s, give_up_us)) <= 0)
        || (r = conn_write(&c, req, (int)n, give_up_us)) <= 0) {
        conn_close(&c, s);
        return r < 0 ? 0 : -1;
    }
    /* Keep the head for parsing; drain the rest. */
    while ((n = conn_read(&c, got < sizeof(buf) - 1 ? buf + got : req,
                          got < sizeof(buf) - 1 ? sizeof(buf) - 1 - got : sizeof(req),
                          give_up_us)) > 0) {
        if (got < sizeof(buf) - 1) {
            got += (size_t)n;
        }
    }
    conn_close(&c, s);
    if (n < 0) {
        return -1;
    }
    buf[got] = '\0';
    if (got > 12 && strncmp(buf, "HTTP/1.", 7) == 0) {
        status = atoi(buf + 9);
    }
    if ((p = strcasestr(buf, "\r\nRetry-After:")) != NULL) {
        *retry_after = atoi(p + 14);
    }
    return status;
}

/* Open loop: the time of the next arrival, or -1 past the deadline. */
static int64_t next_arrival(void)
{
    int64_t at;

    pthread_mutex_lock(&issued_lock);
    at = t0 + (int64_t)((double)arrivals * 1e6 / rate);
    arrivals++;
    pthread_mutex_unlock(&issued_lock);
    return at < deadline ? at : -1;
}

/* -s: the clients' TLS context. */
static SSL_CTX *tls_client(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (!ctx) {
        fprintf(stderr, "loadgen: SSL_CTX_new failed\n");
        exit(1);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    /* httpd may close without close_notify after its answer */
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    return ctx;
}

static void *client(void *arg)
{
    samples_t *s = arg;

    while (now_us() < deadline && take_ticket()) {
        int retry_after;
        sample_t x;
        int64_t at = 0;

        if (rate > 0) {
            if ((at = next_arrival()) < 0) {
                break;
            }
            while (now_us() < at) {
                int64_t d = at - now_us();
                usleep((useconds_t)(d > 1000000 ? 1000000 : d));
            }
        }
        x.start_us = (rate > 0 ? at : now_us()) - t0;
        x.status = one_request(s, &retry_after,
                               patience > 0 ? t0 + x.start_us + (int64_t)(patience * 1e6)
                                            : 0);
        x.end_us = now_us() - t0;
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 4096;
            s->v = realloc(s->v, s->cap * sizeof(*s->v));
            if (!s->v) {
                perror("realloc");
                exit(1);
            }
        }
        s->v[s->n++] = x;
        if (honour_retry_after && x.status == 503 && retry_after > 0) {
            /* One sleep, to the advice or the end of the run: a client that
             * woke every few ms to look would cost 200 sleeping clients a
             * share of the CPU that the server under test needs. */
            double wait = max_retry_after > 0 && retry_after > max_retry_after
                              ? max_retry_after : retry_after;
            int64_t until = now_us() + (int64_t)(wait * 1e6);
            sleep_until(until < deadline ? until : deadline);
        } else if (think_ms > 0 && rate <= 0) {
            int64_t until = now_us() + (int64_t)(think_ms * 1000);
            sleep_until(until < deadline ? until : deadline);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *out = NULL;
    pthread_t *th;
    samples_t *per;
    FILE *f = stdout;
    int opt, i;

    target_addr = htonl(INADDR_LOOPBACK);
    while ((opt = getopt(argc, argv, "a:p:c:d:n:u:o:rR:t:m:z:s")) != -1) {
        switch (opt) {
        case 'a':
            if (inet_pton(AF_INET, optarg, &target_addr) != 1
                || (ntohl(target_addr) >> 24) != 127) {
                fprintf(stderr, "loadgen: -a takes a loopback address (127.x.y.z)\n");
                return 2;
            }
            break;
        case 'p': port = atoi(optarg); break;
        case 'c': clients = atoi(optarg); break;
        case 'd': seconds = atof(optarg); break;
        case 'n': max_requests = atol(optarg); break;
        case 'u': path = optarg; break;
        case 'o': out = optarg; break;
        case 'r': honour_retry_after = 1; break;
        case 'R': rate = atof(optarg); break;
        case 't': patience = atof(optarg); break;
        case 'm': max_retry_after = atof(optarg); break;
        case 'z': think_ms = atof(optarg); break;
        case 's': tls = tls_client(); break;
        default:
            fprintf(stderr, "usage: loadgen [-a 127.x.y.z] -p PORT -c CLIENTS -d SECONDS [-n MAX] "
                            "[-u PATH] [-r [-m MAX]] [-R RATE] [-t PATIENCE] [-z THINK_MS] [-s] "
                            "[-o FILE]\n");
            return 2;
        }
    }
    if (port <= 0 || clients <= 0 || clients > 2000 || seconds <= 0 || seconds > 3600
        || rate < 0 || rate > 100000 || patience < 0 || max_retry_after < 0 || think_ms < 0) {
        fprintf(stderr, "loadgen: need -p PORT, -c 1..2000 clients, -d 0..3600 seconds\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a server that closed first is an error, not our end */
    th = calloc((size_t)clients, sizeof(*th));
    per = calloc((size_t)clients, sizeof(*per));
    t0 = now_us();
    deadline = t0 + (int64_t)(seconds * 1e6);
    for (i = 0; i < clients; i++) {
        pthread_create(&th[i], NULL, client, &per[i]);
    }
    for (i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
    }
    if (out && !(f = fopen(out, "w"))) {
        perror(out);
        return 1;
    }
    fprintf(f, "# start_us end_us status\n");
    for (i = 0; i < clients; i++) {
        for (size_t k = 0; k < per[i].n; k++) {
            fprintf(f, "%lld %lld %d\n", (long long)per[i].v[k].start_us,
                    (long long)per[i].v[k].end_us, per[i].v[k].status);
        }
    }
    if (tls) {
        fprintf(f, "# tls: %ld handshakes, %ld resumed\n", tls_handshakes, tls_resumed);
    }
    if (f != stdout) {
        fclose(f);
    }
    return 0;
}
