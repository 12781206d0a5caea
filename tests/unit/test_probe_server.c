/* The probe server over real sockets: /healthz, /readyz following its
 * callback, /metrics, HEAD, 405, 404, 400, 431, Connection: close on a
 * keep-alive request, idle and trickling clients neither delaying a probe
 * nor kept past the head timeout, a silent client not delaying stop, and bad
 * addresses. */
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "loopback.h"
#include "probe_server.h"

static atomic_int ready_;
static atomic_int metrics_fail_;

static char *metrics_cb(void *user)
{
    if ((intptr_t)user != 42 || atomic_load(&metrics_fail_)) return NULL;
    return strdup("up 1\n");
}

static int ready_cb(void *user)
{
    return atomic_load(&ready_);
}

/* Sends raw, reads the whole answer until the server closes (within 5 s)
 * into out; the byte count, or −1. */
static int exchange(int port, const char *raw, size_t rawlen, char *out, size_t cap)
{
    int fd = connect_to(port);
    if (fd < 0) return -1;
    size_t len = 0;
    if (send(fd, raw, rawlen, MSG_NOSIGNAL) != (ssize_t)rawlen) {
        close(fd);
        return -1;
    }
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0) break;
        ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
        if (n <= 0) break; /* closed (or reset after a refused head): the answer is in */
        len += (size_t)n;
        if (len == cap - 1) break;
    }
    out[len] = 0;
    close(fd);
    return (int)len;
}

static int request(int port, const char *raw, char *out, size_t cap)
{
    return exchange(port, raw, strlen(raw), out, cap);
}

static pl_probe_server *start(const char *addr, char *err, size_t errlen)
{
    pl_probe_config cfg = {addr, metrics_cb, ready_cb, (void *)(intptr_t)42};
    return pl_probe_start(&cfg, err, errlen);
}

static void test_endpoints(void)
{
    char err[256], out[4096];
    atomic_store(&ready_, 0);
    pl_probe_server *s = start("127.0.0.1:0", err, sizeof err);
    CHECK(s);
    int port = pl_probe_port(s);
    CHECK(port > 0);
    CHECK(request(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 200 OK\r\n");
    CHECK_STR_CONTAINS(out, "Connection: close\r\n");
    CHECK_STR_CONTAINS(out, "Content-Length: 3\r\n");
    CHECK_STR_CONTAINS(out, "\r\n\r\nok\n");
    CHECK(request(port, "GET /readyz HTTP/1.1\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 503 ");
    atomic_store(&ready_, 1);
    CHECK(request(port, "GET /readyz?verbose HTTP/1.1\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 200 OK\r\n");
    CHECK(request(port, "GET /metrics HTTP/1.0\n\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 200 OK\r\n");
    CHECK_STR_CONTAINS(out, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n");
    CHECK_STR_CONTAINS(out, "\r\n\r\nup 1\n");
    CHECK(request(port, "HEAD /metrics HTTP/1.1\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "Content-Length: 5\r\n");
    CHECK(strstr(out, "\r\n\r\n")[4] == 0); /* no body */
    atomic_store(&metrics_fail_, 1);
    CHECK(request(port, "GET /metrics HTTP/1.1\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 500 ");
    atomic_store(&metrics_fail_, 0);
    CHECK(request(port, "POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", out,
                  sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 405 ");
    CHECK_STR_CONTAINS(out, "Allow: GET, HEAD\r\n");
    CHECK(request(port, "GET /nope HTTP/1.1\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 404 ");
    CHECK(request(port, "hello\r\n\r\n", out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 400 ");
    /* a keep-alive client is answered and the connection closed */
    CHECK(request(port, "GET /healthz HTTP/1.1\r\nConnection: keep-alive\r\n\r\n", out,
                  sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "Connection: close\r\n");
    /* a head that never ends within 8 KiB */
    char big[10000];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /healthz HTTP/1.1\r\nX: ", 26);
    CHECK(exchange(port, big, sizeof big, out, sizeof out) > 0);
    CHECK_STR_CONTAINS(out, "HTTP/1.1 431 ");
    pl_probe_stop(s);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A client that sends a request head one byte every 100 ms; how long the server
 * kept the connection (ms), or −1 if it was never closed within 3 s. */
static void *trickle(void *arg)
{
    int fd = *(int *)arg;
    static const char head[] = "GET /healthz HTTP/1.1\r\nHost: a-long-host-name\r\n\r\n";
    double t0 = now_ms(), kept = -1;
    for (size_t i = 0; i < sizeof head - 1 && now_ms() - t0 < 3000; i++) {
        if (send(fd, head + i, 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd p = {fd, POLLIN, 0};
        char c;
        if (poll(&p, 1, 100) == 1 && recv(fd, &c, 1, 0) <= 0) break; /* closed */
    }
    if (now_ms() - t0 < 3000) kept = now_ms() - t0;
    *(int *)arg = (int)kept;
    return NULL;
}

/* One idle connection and one trickling its head do not delay /healthz (each
 * answered within 100 ms) and are dropped once the 1 s head timeout passes. */
static void test_idle_and_trickling_clients(void)
{
    char err[256], out[4096];
    pl_probe_server *s = start("127.0.0.1:0", err, sizeof err);
    CHECK(s);
    int port = pl_probe_port(s);
    int idle = connect_to(port), slow = connect_to(port), slow_arg = slow;
    CHECK(idle >= 0 && slow >= 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, trickle, &slow_arg) == 0);
    double worst = 0, t0 = now_ms();
    for (int i = 0; i < 8; i++) {
        double t = now_ms();
        int n = request(port, "GET /healthz HTTP/1.1\r\n\r\n", out, sizeof out);
        double ms = now_ms() - t;
        if (ms > worst) worst = ms;
        if (n <= 0 || !strstr(out, "200 OK")) worst = 1e9;
        usleep(50 * 1000);
    }
    /* the idle connection is closed by the server after about 1 s */
    struct pollfd p = {idle, POLLIN, 0};
    char c;
    int closed = poll(&p, 1, 2500) == 1 && recv(idle, &c, 1, 0) == 0;
    double idle_ms = now_ms() - t0;
    pthread_join(th, NULL);
    close(idle);
    close(slow);
    pl_probe_stop(s);
    printf("    slowest /healthz %.1f ms; idle dropped after %.0f ms, trickler after %d ms\n",
           worst, idle_ms, slow_arg);
    CHECK(worst < 100);
    CHECK(closed && idle_ms < 2000);
    CHECK(slow_arg >= 900 && slow_arg < 2000);
}

static void test_stop_with_silent_client(void)
{
    char err[256];
    pl_probe_server *s = start(":0", err, sizeof err);
    CHECK(s);
    int fd = connect_to(pl_probe_port(s)); /* all interfaces include loopback */
    CHECK(fd >= 0);
    usleep(50 * 1000); /* the server is now waiting for this client's request */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pl_probe_stop(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    CHECK(t1.tv_sec - t0.tv_sec < 2);
}

static void test_bad_addresses(void)
{
    char err[256];
    CHECK(!start("8080", err, sizeof err));
    CHECK_STR_CONTAINS(err, "HOST:PORT");
    CHECK(!start("127.0.0.1:", err, sizeof err));
    CHECK(!start("127.0.0.1:http", err, sizeof err));
    pl_probe_server *s = start("[::1]:0", err, sizeof err);
    if (s) pl_probe_stop(s); /* IPv6 may be off here: either way no crash */
    s = start("127.0.0.1:0", err, sizeof err);
    CHECK(s);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pl_probe_port(s));
    CHECK(!start(addr, err, sizeof err)); /* in use */
    CHECK_STR_CONTAINS(err, addr);
    pl_probe_stop(s);
}

TEST_MAIN_BEGIN
RUN(test_endpoints);
RUN(test_idle_and_trickling_clients);
RUN(test_stop_with_silent_client);
RUN(test_bad_addresses);
TEST_MAIN_END
