/* The operator's HTTP endpoint for /metrics, /healthz and /readyz, on its own
 * thread (probe_server.h). */
#include "probe_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define HEAD_MAX 8192
#define REQUEST_TIMEOUT_MS 5000
#define LINGER_MS 250

struct pl_probe_server {
    pl_probe_config cfg;
    int fd, port;
    int wake[2]; /* a byte written on wake[1] stops the thread */
    pthread_t thread;
};

/* ---- one connection ---- */

static void send_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return; /* the client went away or stalled past SO_SNDTIMEO */
        p += n;
        len -= (size_t)n;
    }
}

static void respond(int fd, int code, const char *extra_headers, const char *ctype,
                    const char *body, int head_only)
{
    const char *reason = code == 200 ? "OK" : code == 400 ? "Bad Request"
                       : code == 404 ? "Not Found" : code == 405 ? "Method Not Allowed"
                       : code == 431 ? "Request Header Fields Too Large"
                       : code == 503 ? "Service Unavailable" : "Internal Server Error";
    size_t len = strlen(body);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "%sConnection: close\r\n\r\n", code, reason, ctype, len, extra_headers);
    send_all(fd, head, (size_t)n);
    if (!head_only) send_all(fd, body, len);
}

#define TEXT "text/plain; charset=utf-8"

/* Reads the request head into buf (NUL-terminated): 0, or the HTTP status to
 * answer (431 too large), or −1 to drop the connection (timeout, EOF, stop). */
static int read_head(pl_probe_server *s, int fd, char *buf, size_t cap)
{
    size_t len = 0;
    int64_t deadline = pl_now_ms() + REQUEST_TIMEOUT_MS;
    buf[0] = 0;
    while (!strstr(buf, "\r\n\r\n") && !strstr(buf, "\n\n")) {
        if (len == cap - 1) return 431;
        int64_t left = deadline - pl_now_ms();
        if (left <= 0) return -1;
        struct pollfd p[2] = {{fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        int r = poll(p, 2, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || p[1].revents) return -1;
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return -1;
        len += (size_t)n;
        buf[len] = 0;
    }
    return 0;
}

static void serve(pl_probe_server *s, int fd)
{
    char buf[HEAD_MAX];
    int rc = read_head(s, fd, buf, sizeof buf);
    if (rc) {
        if (rc > 0) respond(fd, rc, "", TEXT, "request head too large\n", 0);
        return;
    }
    /* the request line: METHOD SP TARGET SP HTTP/1.x */
    buf[strcspn(buf, "\r\n")] = 0;
    char *method = buf, *target = strchr(buf, ' ');
    char *version = target ? strchr(target + 1, ' ') : NULL;
    if (!version || strncmp(version + 1, "HTTP/1.", 7) != 0) {
        respond(fd, 400, "", TEXT, "bad request\n", 0);
        return;
    }
    *target++ = 0;
    *version = 0;
    target[strcspn(target, "?")] = 0; /* the query does not matter */
    int head = strcmp(method, "HEAD") == 0;
    int known = strcmp(target, "/healthz") == 0 || strcmp(target, "/readyz") == 0 ||
                (strcmp(target, "/metrics") == 0 && s->cfg.metrics);
    if (!known) {
        respond(fd, 404, "", TEXT, "not found\n", head);
    } else if (!head && strcmp(method, "GET") != 0) {
        respond(fd, 405, "Allow: GET, HEAD\r\n", TEXT, "method not allowed\n", 0);
    } else if (strcmp(target, "/healthz") == 0) {
        respond(fd, 200, "", TEXT, "ok\n", head);
    } else if (strcmp(target, "/readyz") == 0) {
        int ready = !s->cfg.ready || s->cfg.ready(s->cfg.user);
        respond(fd, ready ? 200 : 503, "", TEXT, ready ? "ok\n" : "not ready\n", head);
    } else {
        char *text = s->cfg.metrics(s->cfg.user);
        if (text) respond(fd, 200, "", "text/plain; version=0.0.4; charset=utf-8", text, head);
        else respond(fd, 500, "", TEXT, "metrics unavailable\n", head);
        free(text);
    }
}

/* Closes after the client has read the answer: a close with unread input
 * (a refused head, a pipelined request) would reset the connection and could
 * destroy the answer in flight, so read and drop input for a short while. */
static void linger_close(int fd)
{
    shutdown(fd, SHUT_WR);
    int64_t deadline = pl_now_ms() + LINGER_MS;
    char scratch[4096];
    for (int64_t left; (left = deadline - pl_now_ms()) > 0;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)left) <= 0 || recv(fd, scratch, sizeof scratch, 0) <= 0) break;
    }
    close(fd);
}

static void *serve_loop(void *arg)
{
    pl_probe_server *s = arg;
    for (;;) {
        struct pollfd p[2] = {{s->fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || p[1].revents) break;
        if (!(p[0].revents & POLLIN)) continue;
        int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            /* EMFILE and the like: back off rather than spin on a full table */
            if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) usleep(100 * 1000);
            continue;
        }
        struct timeval tv = {REQUEST_TIMEOUT_MS / 1000, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        serve(s, fd);
        linger_close(fd);
    }
    return NULL;
}

/* ---- start and stop ---- */

/* A listening socket for "HOST:PORT", ":PORT" or "[V6]:PORT"; −1 and err. */
static int listen_on(const char *addr, char *err, size_t errlen)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || !colon[1])
        return pl_errf(err, errlen, "probe address %s: want HOST:PORT or :PORT",
                       addr ? addr : "(null)");
    char host[256];
    const char *h = addr;
    size_t hlen = (size_t)(colon - addr);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') { /* "[::1]:PORT" */
        h++;
        hlen -= 2;
    }
    if (hlen >= sizeof host) return pl_errf(err, errlen, "probe address %s: host too long", addr);
    memcpy(host, h, hlen);
    host[hlen] = 0;
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(hlen ? host : NULL, colon + 1, &hints, &res);
    if (gai) return pl_errf(err, errlen, "probe address %s: %s", addr, gai_strerror(gai));
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) /* "::" serves IPv4 clients too */
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return pl_errf(err, errlen, "probe address %s: %s", addr, strerror(saved));
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

pl_probe_server *pl_probe_start(const pl_probe_config *cfg, char *err, size_t errlen)
{
    pl_probe_server *s = calloc(1, sizeof *s);
    if (!s) {
        pl_errf(err, errlen, "probe server: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->cfg.addr = NULL; /* not kept: the caller's string may go away */
    s->wake[0] = s->wake[1] = -1;
    s->fd = listen_on(cfg->addr, err, errlen);
    if (s->fd < 0) goto fail;
    s->port = bound_port(s->fd);
    if (s->port < 0 || pipe2(s->wake, O_CLOEXEC) != 0) {
        pl_errf(err, errlen, "probe server: %s", strerror(errno));
        goto fail;
    }
    int e = pthread_create(&s->thread, NULL, serve_loop, s);
    if (e) {
        pl_errf(err, errlen, "probe server: thread: %s", strerror(e));
        goto fail;
    }
    return s;
fail:
    if (s->fd >= 0) close(s->fd);
    if (s->wake[0] >= 0) close(s->wake[0]);
    if (s->wake[1] >= 0) close(s->wake[1]);
    free(s);
    return NULL;
}

int pl_probe_port(const pl_probe_server *s)
{
    return s->port;
}

void pl_probe_stop(pl_probe_server *s)
{
    if (!s) return;
    ssize_t n;
    do n = write(s->wake[1], "x", 1);
    while (n < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    close(s->fd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}
