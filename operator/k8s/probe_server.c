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
#define MAX_CONNS 64          /* served at once; the oldest unfinished head makes room */
#define HEAD_TIMEOUT_MS 1000  /* a request head must arrive whole within this */
#define WRITE_TIMEOUT_MS 2000 /* an answer must be taken within this */
#define LINGER_MS 250

enum { C_FREE, C_READ, C_WRITE, C_LINGER };

/* One connection: reading its head, writing its answer, or lingering before the close. */
typedef struct {
    int fd, state;
    double since, deadline; /* accepted at; dropped (or closed, lingering) at */
    size_t len;             /* bytes of the head read */
    char head[HEAD_MAX];
    char *out;              /* the answer (malloc'd) and how much of it is sent */
    size_t out_len, out_off;
} conn;

struct pl_probe_server {
    pl_probe_config cfg;
    int fd, port;
    int wake[2]; /* a byte written on wake[1] stops the thread */
    pthread_t thread;
    conn *conns; /* MAX_CONNS of them */
};

/* ---- one connection ---- */

static void conn_close(conn *c)
{
    if (c->state != C_FREE) close(c->fd);
    free(c->out);
    c->out = NULL;
    c->state = C_FREE;
}

/* Queues the answer on c; it is sent as the client takes it. */
static void respond(conn *c, int code, const char *extra_headers, const char *ctype,
                    const char *body, int head_only)
{
    const char *reason = code == 200 ? "OK" : code == 400 ? "Bad Request"
                       : code == 404 ? "Not Found" : code == 405 ? "Method Not Allowed"
                       : code == 431 ? "Request Header Fields Too Large"
                       : code == 503 ? "Service Unavailable" : "Internal Server Error";
    size_t len = strlen(body);
    char *out = NULL;
    int n = asprintf(&out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                           "%sConnection: close\r\n\r\n%s", code, reason, ctype, len,
                     extra_headers, head_only ? "" : body);
    free(c->out);
    c->out = n < 0 ? NULL : out;
    c->out_len = n < 0 ? 0 : (size_t)n;
    c->out_off = 0;
    c->state = C_WRITE;
    c->deadline = pl_now_ms() + WRITE_TIMEOUT_MS;
}

#define TEXT "text/plain; charset=utf-8"

/* Answers the complete request head in c->head. */
static void answer(pl_probe_server *s, conn *c)
{
    char *buf = c->head;
    /* the request line: METHOD SP TARGET SP HTTP/1.x */
    buf[strcspn(buf, "\r\n")] = 0;
    char *method = buf, *target = strchr(buf, ' ');
    char *version = target ? strchr(target + 1, ' ') : NULL;
    if (!version || strncmp(version + 1, "HTTP/1.", 7) != 0) {
        respond(c, 400, "", TEXT, "bad request\n", 0);
        return;
    }
    *target++ = 0;
    *version = 0;
    target[strcspn(target, "?")] = 0; /* the query does not matter */
    int head = strcmp(method, "HEAD") == 0;
    int known = strcmp(target, "/healthz") == 0 || strcmp(target, "/readyz") == 0 ||
                (strcmp(target, "/metrics") == 0 && s->cfg.metrics);
    if (!known) {
        respond(c, 404, "", TEXT, "not found\n", head);
    } else if (!head && strcmp(method, "GET") != 0) {
        respond(c, 405, "Allow: GET, HEAD\r\n", TEXT, "method not allowed\n", 0);
    } else if (strcmp(target, "/healthz") == 0) {
        respond(c, 200, "", TEXT, "ok\n", head);
    } else if (strcmp(target, "/readyz") == 0) {
        int ready = !s->cfg.ready || s->cfg.ready(s->cfg.user);
        respond(c, ready ? 200 : 503, "", TEXT, ready ? "ok\n" : "not ready\n", head);
    } else {
        char *text = s->cfg.metrics(s->cfg.user);
        if (text) respond(c, 200, "", "text/plain; version=0.0.4; charset=utf-8", text, head);
        else respond(c, 500, "", TEXT, "metrics unavailable\n", head);
        free(text);
    }
}

/* Reads what has arrived of the head; answers it once whole (431 when it outgrows
 * HEAD_MAX). EOF or an error drops the connection. */
static void on_read(pl_probe_server *s, conn *c)
{
    ssize_t n = recv(c->fd, c->head + c->len, sizeof c->head - 1 - c->len, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)n;
    c->head[c->len] = 0;
    if (strstr(c->head, "\r\n\r\n") || strstr(c->head, "\n\n")) answer(s, c);
    else if (c->len == sizeof c->head - 1) respond(c, 431, "", TEXT, "request head too large\n", 0);
}

/* Sends what the client takes of the answer; when all is sent, half-closes and
 * lingers: a close with unread input (a refused head, a pipelined request) would
 * reset the connection and could destroy the answer in flight. */
static void on_write(conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            conn_close(c);
            return;
        }
        c->out_off += (size_t)n;
    }
    shutdown(c->fd, SHUT_WR);
    c->state = C_LINGER;
    c->deadline = pl_now_ms() + LINGER_MS;
}

/* Reads and drops input until the client closes or the linger time is over. */
static void on_linger(conn *c)
{
    char scratch[4096];
    ssize_t n = recv(c->fd, scratch, sizeof scratch, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
        conn_close(c);
}

/* A free slot for a new connection: when every one is taken, the oldest still
 * reading its head is dropped (a client that stalls must not lock others out). */
static conn *free_slot(pl_probe_server *s)
{
    conn *oldest = NULL;
    for (int i = 0; i < MAX_CONNS; i++) {
        conn *c = &s->conns[i];
        if (c->state == C_FREE) return c;
        if (c->state == C_READ && (!oldest || c->since < oldest->since)) oldest = c;
    }
    if (oldest) conn_close(oldest);
    return oldest;
}

static void on_accept(pl_probe_server *s)
{
    int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        /* EMFILE and the like: back off rather than spin on a full table */
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) usleep(100 * 1000);
        return;
    }
    conn *c = free_slot(s);
    if (!c) { /* every slot is answering or lingering: they end soon */
        close(fd);
        return;
    }
    c->fd = fd;
    c->state = C_READ;
    c->since = pl_now_ms();
    c->deadline = c->since + HEAD_TIMEOUT_MS;
    c->len = 0;
    c->head[0] = 0;
}

/* The poll set: the listener, the wake pipe, then the live connections (their
 * slots in idx). The poll timeout until the nearest deadline. */
static int poll_set(pl_probe_server *s, struct pollfd *p, int *idx, int *nfds)
{
    static const short EVENTS[] = {[C_READ] = POLLIN, [C_WRITE] = POLLOUT, [C_LINGER] = POLLIN};
    p[0] = (struct pollfd){s->fd, POLLIN, 0};
    p[1] = (struct pollfd){s->wake[0], POLLIN, 0};
    int n = 2;
    double now = pl_now_ms(), next = -1;
    for (int i = 0; i < MAX_CONNS; i++) {
        conn *c = &s->conns[i];
        if (c->state == C_FREE) continue;
        p[n] = (struct pollfd){c->fd, EVENTS[c->state], 0};
        idx[n++] = i;
        double left = c->deadline - now;
        if (next < 0 || left < next) next = left < 0 ? 0 : left;
    }
    *nfds = n;
    return next < 0 ? -1 : (int)next + 1;
}

static void *serve_loop(void *arg)
{
    pl_probe_server *s = arg;
    struct pollfd p[MAX_CONNS + 2];
    int idx[MAX_CONNS + 2], n;
    for (;;) {
        int timeout = poll_set(s, p, idx, &n);
        int r = poll(p, (nfds_t)n, timeout);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || p[1].revents) break;
        for (int k = 2; k < n; k++) {
            conn *c = &s->conns[idx[k]];
            int was = c->state;
            if (!p[k].revents) continue;
            if (was == C_READ) on_read(s, c);
            else if (was == C_WRITE) on_write(c);
            else on_linger(c);
            if (was == C_READ && c->state == C_WRITE) on_write(c); /* a new answer: send it */
        }
        double now = pl_now_ms();
        for (int i = 0; i < MAX_CONNS; i++)
            if (s->conns[i].state != C_FREE && now >= s->conns[i].deadline) conn_close(&s->conns[i]);
        if (p[0].revents & POLLIN) on_accept(s);
    }
    for (int i = 0; i < MAX_CONNS; i++) conn_close(&s->conns[i]);
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
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
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
    if (!(s->conns = calloc(MAX_CONNS, sizeof *s->conns))) {
        free(s);
        pl_errf(err, errlen, "probe server: out of memory");
        return NULL;
    }
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
    free(s->conns);
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
    free(s->conns);
    free(s);
}
