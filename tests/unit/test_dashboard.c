/* The dashboard's server over real sockets with several jobs: each page and feed at its
 * own path, the list of them at "/", 404 elsewhere, 503 while unavailable, a job's
 * history then its live events and none of another job's, a removed job's feed closed
 * and its page gone, a bounded log thinned of step events, the server stopped with feeds
 * open, bad addresses. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "loopback.h"
#include "dashboard.h"

/* n bytes within 5 s: 0, or -1 when the connection closed first or nothing came. */
static int read_full(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0) return -1;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* GET path over HTTP/1.0: the whole answer (the server closes it) into out; its status
 * code, or 0. */
static int get(int port, const char *path, char *out, size_t cap)
{
    out[0] = 0;
    int fd = connect_to(port);
    if (fd < 0) return 0;
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    size_t len = 0;
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n)
        while (len < cap - 1 && read_full(fd, out + len, 1) == 0) len++;
    out[len] = 0;
    close(fd);
    int code = 0;
    return sscanf(out, "HTTP/1.%*d %d", &code) == 1 ? code : 0;
}

/* A feed's WebSocket at path: the socket, or -1 when the upgrade is refused. */
static int ws_open(int port, const char *path)
{
    int fd = connect_to(port);
    if (fd < 0) return -1;
    char req[512], head[1024];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n",
                     path, PL_DASHBOARD_SUBPROTOCOL);
    size_t len = 0;
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n)
        while (len < sizeof head - 1 && read_full(fd, head + len, 1) == 0) {
            head[++len] = 0;
            if (len >= 4 && !memcmp(head + len - 4, "\r\n\r\n", 4)) break;
        }
    head[len] = 0;
    if (strncmp(head, "HTTP/1.1 101", 12)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The next message (one unfragmented text frame: the tests' are small) into out; its
 * length, or -1 once closed. */
static int ws_recv(int fd, char *out, size_t cap)
{
    unsigned char h[2], ext[8];
    if (read_full(fd, h, 2)) return -1;
    size_t n = h[1] & 0x7f;
    if (n == 126) {
        if (read_full(fd, ext, 2)) return -1;
        n = (size_t)ext[0] << 8 | ext[1];
    } else if (n == 127) {
        return -1;
    }
    if (n >= cap || read_full(fd, out, n)) return -1;
    out[n] = 0;
    return (h[0] & 0x0f) == 8 ? -1 : (int)n;
}

static void pages_at_their_paths(void)
{
    char err[256] = "", body[1 << 16];
    pl_dashboard *d = pl_dashboard_start("--dashboard-addr", "127.0.0.1:0", err, sizeof err);
    CHECK(d);
    int port = pl_dashboard_port(d);
    CHECK(pl_dashboard_add(d, "/jobs/ns/a/", 100));
    CHECK(pl_dashboard_add(d, "/jobs/ns/b/", 100));
    CHECK(!pl_dashboard_add(d, "/jobs/ns/a/", 100)); /* taken */
    CHECK(!pl_dashboard_add(d, "jobs/ns/c/", 100));
    CHECK(!pl_dashboard_add(d, "/jobs/ns/c", 100));
    static const char *const ok[] = {"/jobs/ns/a/", "/jobs/ns/a", "/jobs/ns/a/index.html",
                                     "/jobs/ns/b/"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        CHECK_EQ_INT(get(port, ok[i], body, sizeof body), 200);
        CHECK(strstr(body, "PliantDashboard"));
    }
    /* "/" (no job there): the list of the jobs' pages */
    CHECK_EQ_INT(get(port, "/", body, sizeof body), 200);
    CHECK_STR_CONTAINS(body, "<a href=\"/jobs/ns/a/\">");
    CHECK_STR_CONTAINS(body, "<a href=\"/jobs/ns/b/\">");
    static const char *const missing[] = {"/index", "/jobs/ns/ab/", "/jobs/ns/a/feed",
                                          "/jobs/ns/", "/feed"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        CHECK_EQ_INT(get(port, missing[i], body, sizeof body), 404);
    }
    CHECK(ws_open(port, "/feed") < 0);
    pl_dashboard_set_unavailable(d, "replica x does not lead");
    CHECK_EQ_INT(get(port, "/jobs/ns/a/", body, sizeof body), 503);
    CHECK_STR_CONTAINS(body, "replica x does not lead");
    CHECK_EQ_INT(get(port, "/", body, sizeof body), 503);
    CHECK(ws_open(port, "/jobs/ns/a/feed") < 0);
    pl_dashboard_set_unavailable(d, NULL);
    CHECK_EQ_INT(get(port, "/jobs/ns/a/", body, sizeof body), 200);
    pl_dashboard_stop(d); /* frees the jobs still added */
}

static void feeds_per_job_and_removal(void)
{
    char err[256] = "", msg[4096];
    pl_dashboard *d = pl_dashboard_start("--dashboard", ":0", err, sizeof err);
    CHECK(d);
    CHECK(!strcmp(pl_dashboard_host(d), "127.0.0.1"));
    int port = pl_dashboard_port(d);
    pl_dashboard_job *a = pl_dashboard_add(d, "/jobs/ns/a/", 100);
    pl_dashboard_job *b = pl_dashboard_add(d, "/jobs/ns/b/", 100);
    CHECK(a && b);
    pl_dashboard_publish(a, "{\"type\": \"hello\", \"job\": \"a\"}", 0);
    pl_dashboard_publish(b, "{\"type\": \"hello\", \"job\": \"b\"}", 0);
    int fa = ws_open(port, "/jobs/ns/a/feed"), fb = ws_open(port, "/jobs/ns/b/feed");
    CHECK(fa >= 0 && fb >= 0);
    CHECK(ws_recv(fa, msg, sizeof msg) > 0);
    CHECK(!strcmp(msg, "{\"type\": \"history\", \"events\": [{\"type\": \"hello\", \"job\": \"a\"}]}"));
    CHECK(ws_recv(fb, msg, sizeof msg) > 0);
    CHECK_STR_CONTAINS(msg, "\"job\": \"b\"");
    pl_dashboard_publish(a, "{\"type\": \"step\", \"step\": 0}", 1);
    CHECK(ws_recv(fa, msg, sizeof msg) > 0);
    CHECK(!strcmp(msg, "{\"type\": \"step\", \"step\": 0}"));
    int total = 0;
    CHECK_EQ_INT(pl_dashboard_pages(a, &total), 1);
    CHECK_EQ_INT(total, 1);
    pl_dashboard_remove(a); /* its feed closes, its page goes; b's stay */
    CHECK(ws_recv(fa, msg, sizeof msg) < 0);
    close(fa);
    char body[1 << 16];
    CHECK_EQ_INT(get(port, "/jobs/ns/a/", body, sizeof body), 404);
    pl_dashboard_publish(b, "{\"type\": \"step\", \"step\": 0}", 1);
    CHECK(ws_recv(fb, msg, sizeof msg) > 0);
    CHECK_STR_CONTAINS(msg, "\"step\": 0");
    pl_dashboard_stop(d); /* with b's feed open */
    close(fb);
}

static void log_bound_thins_steps(void)
{
    char err[256] = "", msg[8192];
    pl_dashboard *d = pl_dashboard_start("--dashboard", "127.0.0.1:0", err, sizeof err);
    CHECK(d);
    pl_dashboard_job *j = pl_dashboard_add(d, "/", 16);
    CHECK(j);
    pl_dashboard_publish(j, "{\"type\": \"hello\"}", 0);
    char ev[64];
    for (int i = 0; i < 40; i++) {
        snprintf(ev, sizeof ev, "{\"type\": \"step\", \"step\": %d}", i);
        pl_dashboard_publish(j, ev, 1);
    }
    int fd = ws_open(pl_dashboard_port(d), "/feed");
    CHECK(fd >= 0);
    int n = ws_recv(fd, msg, sizeof msg);
    close(fd);
    CHECK(n > 0);
    CHECK_STR_CONTAINS(msg, "{\"type\": \"hello\"}");
    CHECK_STR_CONTAINS(msg, "\"step\": 39}");
    int steps = 0;
    for (const char *p = msg; (p = strstr(p, "\"type\": \"step\"")); p++) steps++;
    CHECK(steps > 0 && steps <= 16);
    pl_dashboard_stop(d);
}

static void bad_addresses(void)
{
    char err[256] = "";
    CHECK(!pl_dashboard_start("--dashboard-addr", "8090", err, sizeof err));
    CHECK_STR_CONTAINS(err, "--dashboard-addr 8090: expected HOST:PORT");
    CHECK(!pl_dashboard_start("--dashboard", "127.0.0.1:99999", err, sizeof err));
    CHECK_STR_CONTAINS(err, "--dashboard 127.0.0.1:99999: bad port");
}

TEST_MAIN_BEGIN
RUN(pages_at_their_paths);
RUN(feeds_per_job_and_removal);
RUN(log_bound_thins_steps);
RUN(bad_addresses);
TEST_MAIN_END
