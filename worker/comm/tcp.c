/* Authenticated TCP connections and framing: see tcp.h. */
#include "tcp.h"
#include "comm_io.h"
#include "handshake.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pliant comm sends floats in host order and needs a little-endian host"
#endif

struct pl_listener {
    int fd;
    int port;
};

struct pl_conn {
    int fd;
    int32_t peer_rank;
    uint64_t generation;
    uint64_t max_frame;
    int broken; /* 0 or the error code that broke it */
    pl_conn_purpose purpose;
    char peer_name[PL_COMM_NAME_MAX + 1];
    char peer_addr[64];
    pl_handshake *hs;       /* while the handshake runs */
    pl_frame_protection protection;
    pl_frame_cipher cipher;
    pl_aead tx, rx;         /* protected: each direction's AEAD */
    unsigned char *scratch; /* ENCRYPT: ciphertext of a piece being sent */
};

const char *pl_comm_strerror(int code)
{
    switch (code) {
    case PL_COMM_OK: return "ok";
    case PL_COMM_ETIMEOUT: return "timeout";
    case PL_COMM_ECLOSED: return "closed";
    case PL_COMM_EPROTO: return "protocol error";
    case PL_COMM_EAUTH: return "authentication failed";
    case PL_COMM_ESTALE: return "stale plan generation";
    case PL_COMM_ESYS: return "system error";
    case PL_COMM_EINVAL: return "invalid argument";
    case PL_COMM_ECANCELED: return "cancelled";
    default: return "unknown error";
    }
}

int pl_comm_errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- low-level non-blocking I/O with poll deadlines ---- */

int64_t pl_comm_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : pl_now_ms() + timeout_ms;
}

int pl_comm_poll_timeout(int64_t deadline)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - pl_now_ms();
    if (left <= 0)
        return 0;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* Waits until fd is ready for events; 0, ETIMEOUT or ESYS. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int t = pl_comm_poll_timeout(deadline);
        if (t == 0 && deadline >= 0) {
            /* one last non-waiting look so a ready fd is never reported as timed out */
            int r = poll(&p, 1, 0);
            return r > 0 ? 0 : PL_COMM_ETIMEOUT;
        }
        int r = poll(&p, 1, t);
        if (r > 0)
            return 0;
        if (r == 0)
            continue; /* re-check the deadline */
        if (errno != EINTR)
            return PL_COMM_ESYS;
    }
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static atomic_int silence_ms; /* pl_conn_set_silence_ms; 0: the system's keepalive */

void pl_conn_set_silence_ms(int ms) { atomic_store(&silence_ms, ms > 0 ? ms : 0); }

/* Keepalive probes after ms/2 of silence, every ms/6, 3 unanswered: dead after ~ms. Not
 * TCP_USER_TIMEOUT: it would also end a connection whose reader is busy (a full stash
 * leaves its window closed), which is no failure. */
static void tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    const int ms = atomic_load(&silence_ms);
    if (ms > 0) {
        int idle = ms / 2000 > 0 ? ms / 2000 : 1, intvl = ms / 6000 > 0 ? ms / 6000 : 1, cnt = 3;
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    }
}

int pl_comm_io_errno(int e)
{
    if (e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ENOTCONN ||
        e == ESHUTDOWN || e == ETIMEDOUT)
        return PL_COMM_ECLOSED;
    return PL_COMM_ESYS;
}

/* Writes all of iov (modified in place). timeout_ms is an idle timeout. */
static int write_iov(int fd, struct iovec *iov, int iovcnt, int timeout_ms, const char **what)
{
    int64_t deadline = pl_comm_deadline(timeout_ms);
    while (iovcnt > 0) {
        if (iov[0].iov_len == 0) {
            iov++;
            iovcnt--;
            continue;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w > 0) {
            size_t left = (size_t)w;
            while (left > 0) {
                size_t take = left < iov[0].iov_len ? left : iov[0].iov_len;
                iov[0].iov_base = (char *)iov[0].iov_base + take;
                iov[0].iov_len -= take;
                left -= take;
                if (iov[0].iov_len == 0) {
                    iov++;
                    iovcnt--;
                }
            }
            deadline = pl_comm_deadline(timeout_ms);
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc) {
                *what = rc == PL_COMM_ETIMEOUT ? "peer stopped reading" : strerror(errno);
                return rc;
            }
            continue;
        }
        *what = strerror(errno);
        return pl_comm_io_errno(errno);
    }
    return 0;
}

/* Reads exactly len bytes; *got counts bytes read. Idle timeout. */
static int read_full(int fd, void *buf, size_t len, int timeout_ms, size_t *got,
                     const char **what)
{
    int64_t deadline = pl_comm_deadline(timeout_ms);
    char *p = buf;
    size_t have = 0;
    *got = 0;
    while (have < len) {
        ssize_t r = recv(fd, p + have, len - have, 0);
        if (r > 0) {
            have += (size_t)r;
            *got = have;
            deadline = pl_comm_deadline(timeout_ms);
            continue;
        }
        if (r == 0) {
            *what = "peer closed the connection";
            return PL_COMM_ECLOSED;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc) {
                *what = rc == PL_COMM_ETIMEOUT ? "no data from peer" : strerror(errno);
                return rc;
            }
            continue;
        }
        *what = strerror(errno);
        return pl_comm_io_errno(errno);
    }
    return 0;
}

#define FRAME_MAGIC 0x31464c50u /* "PLF1" */

void pl_frame_encode(const pl_frame_hdr *h, unsigned char out[PL_FRAME_HDR_BYTES])
{
    pl_put32(out, FRAME_MAGIC);
    pl_put16(out + 4, h->type);
    pl_put16(out + 6, h->flags);
    pl_put32(out + 8, h->tag);
    pl_put32(out + 12, h->aux);
    pl_put64(out + 16, h->generation);
    pl_put64(out + 24, h->len);
}

int pl_frame_decode(const unsigned char in[PL_FRAME_HDR_BYTES], pl_frame_hdr *h)
{
    if (pl_get32(in) != FRAME_MAGIC)
        return PL_COMM_EPROTO;
    h->type = pl_get16(in + 4);
    h->flags = pl_get16(in + 6);
    h->tag = pl_get32(in + 8);
    h->aux = pl_get32(in + 12);
    h->generation = pl_get64(in + 16);
    h->len = pl_get64(in + 24);
    return 0;
}

/* ---- listener ---- */

static int resolve(const char *host, int port, int passive, struct addrinfo **res, char *err,
                   size_t errlen)
{
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    const char *h = host && *host ? host : NULL;
    if (!h && passive)
        hints.ai_family = AF_INET;
    int rc = getaddrinfo(h, portstr, &hints, res);
    if (rc)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "resolve %s:%d: %s", h ? h : "*", port,
                            gai_strerror(rc));
    return 0;
}

int pl_listener_open(const char *bind_addr, int port, pl_listener **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    if (port < 0 || port > 65535)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "listen: bad port %d", port);
    struct addrinfo *res;
    int rc = resolve(bind_addr, port, 1, &res, err, errlen);
    if (rc)
        return rc;
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0 &&
            set_nonblock(fd) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "listen on %s:%d: %s",
                            bind_addr && *bind_addr ? bind_addr : "*", port, strerror(saved));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        saved = errno;
        close(fd);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "getsockname: %s", strerror(saved));
    }
    pl_listener *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory");
    }
    l->fd = fd;
    l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = l;
    return 0;
}

int pl_listener_port(const pl_listener *l) { return l->port; }
int pl_listener_fd(const pl_listener *l) { return l->fd; }

void pl_listener_close(pl_listener *l)
{
    if (!l)
        return;
    close(l->fd);
    free(l);
}

/* ---- names ---- */

const char *pl_conn_purpose_name(int purpose)
{
    switch (purpose) {
    case PL_CONN_ANY: return "any";
    case PL_CONN_RING: return "ring";
    case PL_CONN_STAGE_LINK: return "stage link";
    case PL_CONN_LAYER_COPY: return "layer copy";
    default: return "?";
    }
}

const char *pl_frame_protection_name(int protection)
{
    switch (protection) {
    case PL_PROTECT_DEFAULT: return "default";
    case PL_PROTECT_NONE: return "none";
    case PL_PROTECT_INTEGRITY: return "integrity";
    case PL_PROTECT_ENCRYPT: return "encrypt";
    default: return "?";
    }
}

int pl_frame_protection_parse(const char *s, pl_frame_protection *out, char *err, size_t errlen)
{
    *out = PL_PROTECT_DEFAULT;
    if (!s || !*s) return 0;
    for (int p = PL_PROTECT_NONE; p <= PL_PROTECT_ENCRYPT; p++)
        if (!strcmp(s, pl_frame_protection_name(p))) {
            *out = (pl_frame_protection)p;
            return 0;
        }
    return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                        "peer frame protection: \"%.40s\" is not none, integrity or encrypt", s);
}

const char *pl_frame_cipher_name(int cipher)
{
    return cipher == PL_CIPHER_AES_256_GCM          ? "AES-256-GCM"
           : cipher == PL_CIPHER_CHACHA20_POLY1305 ? "ChaCha20-Poly1305"
                                                     : "?";
}
/* ---- connections and their handshakes ---- */

static pl_conn *conn_new(int fd, const struct sockaddr *sa)
{
    pl_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->peer_rank = -1;
    c->max_frame = PL_COMM_MAX_FRAME_DEFAULT;
    char host[48] = "?", serv[16] = "?";
    if (sa)
        getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                  : sizeof(struct sockaddr_in),
                    host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(c->peer_addr, sizeof c->peer_addr, "%s:%s", host, serv);
    return c;
}

/* The handshake is done: c takes what it agreed on and keys its frame protection. */
static int conn_established(pl_conn *c, char *err, size_t errlen)
{
    const pl_handshake_result *r = pl_handshake_result_of(c->hs);
    c->peer_rank = r->peer_rank;
    c->purpose = r->purpose;
    snprintf(c->peer_name, sizeof c->peer_name, "%s", r->peer_name);
    c->protection = r->protection;
    c->cipher = r->cipher;
    int rc = 0;
    if (c->protection != PL_PROTECT_NONE) {
        const int enc = c->protection == PL_PROTECT_ENCRYPT;
        if (pl_aead_init(&c->tx, c->cipher, enc, 1, r->key_tx) ||
            pl_aead_init(&c->rx, c->cipher, enc, 0, r->key_rx))
            rc = pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake with %s: %s unavailable",
                              c->peer_addr, pl_frame_cipher_name(c->cipher));
    }
    pl_handshake_free(c->hs);
    c->hs = NULL;
    return rc;
}

/* Starts c's handshake for self as the dialer or the listener. */
static int conn_begin(pl_conn *c, const pl_comm_ident *self, int dialer, int32_t expect_rank,
                      int64_t deadline, char *err, size_t errlen)
{
    c->generation = self->generation;
    c->hs = pl_handshake_new(self, dialer, expect_rank, deadline, err, errlen);
    return c->hs ? 0 : PL_COMM_ESYS;
}

int pl_conn_handshake_step(pl_conn *c, char *err, size_t errlen)
{
    if (!c->hs)
        return 1;
    int rc = pl_handshake_step(c->hs, c->fd, c->peer_addr, err, errlen);
    if (rc == 1 && (rc = conn_established(c, err, errlen)) == 0)
        return 1;
    return rc;
}

short pl_conn_handshake_events(const pl_conn *c) { return c->hs ? pl_handshake_events(c->hs) : 0; }

int64_t pl_conn_handshake_deadline(const pl_conn *c)
{
    return c->hs ? pl_handshake_deadline(c->hs) : -1;
}

/* Runs c's handshake to its end, waiting for the socket in between. */
static int conn_handshake(pl_conn *c, char *err, size_t errlen)
{
    for (;;) {
        int rc = pl_conn_handshake_step(c, err, errlen);
        if (rc)
            return rc == 1 ? 0 : rc;
        struct pollfd p = {.fd = c->fd, .events = pl_conn_handshake_events(c)};
        int t = pl_comm_poll_timeout(pl_conn_handshake_deadline(c));
        if (poll(&p, 1, t) < 0 && errno != EINTR)
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake with %s: poll: %s",
                                c->peer_addr, strerror(errno));
    }
}

/* One connection waiting on l, without blocking: 0 with *fd (−1: none) or a code. */
static int take_waiting(pl_listener *l, int *fd, struct sockaddr_storage *ss, char *err,
                        size_t errlen)
{
    for (;;) {
        socklen_t sl = sizeof *ss;
        *fd = accept4(l->fd, (struct sockaddr *)ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (*fd >= 0)
            return 0;
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        /* out of descriptors and the like: the listener itself is sound */
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "accept on port %d: %s", l->port,
                            strerror(errno));
    }
}

/* pl_listener_accept_begin with the handshake's deadline. */
static int accept_begin(pl_listener *l, const pl_comm_ident *self, int64_t deadline,
                        pl_conn **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = pl_handshake_check_ident(self, 0, err, errlen);
    struct sockaddr_storage ss;
    int fd = -1;
    if (rc || (rc = take_waiting(l, &fd, &ss, err, errlen)) || fd < 0)
        return rc;
    tune_socket(fd);
    pl_conn *c = conn_new(fd, (struct sockaddr *)&ss);
    if (!c) {
        close(fd);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory");
    }
    rc = conn_begin(c, self, 0, -1, deadline, err, errlen);
    if (rc == 0)
        rc = pl_conn_handshake_step(c, err, errlen);
    if (rc < 0) {
        pl_conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int pl_listener_accept_begin(pl_listener *l, const pl_comm_ident *self, int handshake_ms,
                             pl_conn **out, char *err, size_t errlen)
{
    return accept_begin(l, self, pl_comm_deadline(handshake_ms), out, err, errlen);
}

int pl_listener_accept(pl_listener *l, const pl_comm_ident *self, int timeout_ms,
                       pl_conn **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = pl_handshake_check_ident(self, 0, err, errlen);
    if (rc)
        return rc;
    int64_t deadline = pl_comm_deadline(timeout_ms);
    pl_conn *c = NULL;
    for (;;) {
        /* the handshake ends with the accept's deadline, whatever trickles in */
        rc = accept_begin(l, self, deadline, &c, err, errlen);
        if (rc || c)
            break;
        rc = wait_fd(l->fd, POLLIN, deadline);
        if (rc == PL_COMM_ETIMEOUT)
            return pl_comm_errf(err, errlen, rc, "accept on port %d: no peer within %d ms",
                                l->port, timeout_ms);
        if (rc)
            return pl_comm_errf(err, errlen, rc, "accept: poll: %s", strerror(errno));
    }
    if (rc)
        return rc;
    if ((rc = conn_handshake(c, err, errlen))) {
        pl_conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int retryable_connect_errno(int e)
{
    return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
           e == ECONNRESET || e == EAGAIN || e == EADDRNOTAVAIL;
}

/* One round of TCP connects to the addresses of res before deadline: the socket, or −1
 * with *last_errno. */
static int dial_once(const struct addrinfo *res, int64_t deadline, struct sockaddr_storage *sa,
                     int *last_errno)
{
    int fd = -1;
    for (const struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            *last_errno = errno;
            continue;
        }
        memcpy(sa, a->ai_addr, a->ai_addrlen);
        int r;
        do
            r = connect(fd, a->ai_addr, a->ai_addrlen);
        while (r < 0 && errno == EINTR);
        if (r < 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w == PL_COMM_ETIMEOUT)
                soerr = ETIMEDOUT;
            else if (w || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
                soerr = errno ? errno : EIO;
            r = soerr ? -1 : 0;
            errno = soerr;
        }
        if (r < 0) {
            *last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    return fd;
}

/* The handshake of a dialed socket. */
static int dialed(int fd, const struct sockaddr_storage *sa, const pl_comm_ident *self,
                  int32_t expect_rank, int64_t deadline, pl_conn **out, char *err,
                  size_t errlen)
{
    tune_socket(fd);
    pl_conn *c = conn_new(fd, (const struct sockaddr *)sa);
    if (!c) {
        close(fd);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory");
    }
    int rc = conn_begin(c, self, 1, expect_rank, deadline, err, errlen);
    if (rc == 0)
        rc = conn_handshake(c, err, errlen);
    if (rc) {
        pl_conn_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

int pl_conn_connect(const char *host, int port, const pl_comm_ident *self,
                    int32_t expect_rank, int timeout_ms, pl_conn **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    int rc = pl_handshake_check_ident(self, 1, err, errlen);
    if (rc)
        return rc;
    if (port <= 0 || port > 65535)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "connect: bad port %d", port);
    int64_t deadline = pl_comm_deadline(timeout_ms);
    int backoff = 10, last_errno = 0, attempts = 0;
    for (;;) {
        struct addrinfo *res = NULL;
        rc = resolve(host, port, 0, &res, err, errlen);
        int fd = -1;
        struct sockaddr_storage peer_sa;
        if (rc == 0) {
            fd = dial_once(res, deadline, &peer_sa, &last_errno);
            freeaddrinfo(res);
        }
        attempts++;
        if (fd >= 0)
            return dialed(fd, &peer_sa, self, expect_rank, deadline, out, err, errlen);
        if (rc == 0 && !retryable_connect_errno(last_errno))
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "connect to %s:%d: %s", host, port,
                                strerror(last_errno));
        int left = pl_comm_poll_timeout(deadline);
        if (left == 0)
            return rc ? rc
                      : pl_comm_errf(err, errlen, PL_COMM_ETIMEOUT,
                                     "connect to %s:%d: %s (%d attempts in %d ms)", host, port,
                                     strerror(last_errno), attempts, timeout_ms);
        int nap = left >= 0 && left < backoff ? left : backoff;
        struct timespec ts = {nap / 1000, (long)(nap % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        backoff = backoff * 2 > 250 ? 250 : backoff * 2;
    }
}

void pl_conn_shutdown(pl_conn *c)
{
    if (c)
        shutdown(c->fd, SHUT_RDWR);
}

void pl_conn_close(pl_conn *c)
{
    if (!c)
        return;
    close(c->fd);
    pl_handshake_free(c->hs);
    pl_aead_free(&c->tx);
    pl_aead_free(&c->rx);
    free(c->scratch);
    free(c);
}

int32_t pl_conn_peer_rank(const pl_conn *c) { return c->peer_rank; }
pl_conn_purpose pl_conn_purpose_of(const pl_conn *c) { return c->purpose; }
const char *pl_conn_peer_name(const pl_conn *c) { return c->peer_name; }
const char *pl_conn_peer_addr(const pl_conn *c) { return c->peer_addr; }
uint64_t pl_conn_generation(const pl_conn *c) { return c->generation; }
int pl_conn_fd(const pl_conn *c) { return c->fd; }
int pl_conn_status(const pl_conn *c) { return c->broken; }
void pl_conn_set_max_frame(pl_conn *c, uint64_t max_bytes) { c->max_frame = max_bytes; }
uint64_t pl_conn_max_frame(const pl_conn *c) { return c->max_frame; }
pl_frame_protection pl_conn_protection(const pl_conn *c) { return c->protection; }
pl_frame_cipher pl_conn_cipher(const pl_conn *c) { return c->cipher; }

pl_aead *pl_conn_tx_aead(pl_conn *c) { return c->protection == PL_PROTECT_NONE ? NULL : &c->tx; }
pl_aead *pl_conn_rx_aead(pl_conn *c) { return c->protection == PL_PROTECT_NONE ? NULL : &c->rx; }

void pl_conn_mark_broken(pl_conn *c, int code)
{
    if (!c->broken && code)
        c->broken = code;
}

int pl_conn_auth_failed(pl_conn *c, const char *where, char *err, size_t errlen)
{
    pl_conn_mark_broken(c, PL_COMM_EAUTH);
    shutdown(c->fd, SHUT_RDWR);
    return pl_comm_errf(err, errlen, PL_COMM_EAUTH,
                        "%s: frame %llu from rank %d (\"%s\", %s) failed authentication: "
                        "altered, replayed or reordered on the way (%s); connection closed",
                        where, (unsigned long long)c->rx.counter - 1, (int)c->peer_rank,
                        c->peer_name, c->peer_addr, pl_frame_cipher_name(c->cipher));
}

static int broken_err(pl_conn *c, char *err, size_t errlen)
{
    return pl_comm_errf(err, errlen, c->broken,
                        "connection to rank %d (%s) is broken (%s); it must be re-established",
                        (int)c->peer_rank, c->peer_addr, pl_comm_strerror(c->broken));
}

/* ---- frames ---- */

/* Payload bytes sealed and written at a time: the piece stays in cache between the two. */
#define SEAL_PIECE ((size_t)256 << 10)

/* A protected frame: its header, its payload piece by piece (authenticated, or encrypted
 * into c->scratch), its tag. Idle timeout. */
static int write_sealed(pl_conn *c, unsigned char hb[PL_FRAME_HDR_BYTES], const void *data,
                        size_t len, int timeout_ms, const char **what)
{
    if (c->tx.encrypt && !c->scratch && !(c->scratch = malloc(SEAL_PIECE))) {
        *what = "out of memory";
        return PL_COMM_ESYS;
    }
    if (pl_aead_begin(&c->tx, hb)) {
        *what = "sealing failed";
        return PL_COMM_ESYS;
    }
    const unsigned char *p = data;
    size_t off = 0;
    int rc = 0;
    do {
        const size_t n = len - off < SEAL_PIECE ? len - off : SEAL_PIECE;
        const void *piece = c->tx.encrypt ? c->scratch : p + off;
        if (n && pl_aead_update(&c->tx, p + off, c->scratch, n)) {
            *what = "sealing failed";
            return PL_COMM_ESYS;
        }
        struct iovec iov[2] = {{hb, off ? 0 : PL_FRAME_HDR_BYTES}, {(void *)piece, n}};
        rc = write_iov(c->fd, iov, 2, timeout_ms, what);
        off += n;
    } while (rc == 0 && off < len);
    unsigned char tag[PL_FRAME_TAG_BYTES];
    if (rc == 0 && pl_aead_seal_final(&c->tx, tag)) {
        *what = "sealing failed";
        return PL_COMM_ESYS;
    }
    struct iovec t = {tag, sizeof tag};
    return rc ? rc : write_iov(c->fd, &t, 1, timeout_ms, what);
}

static int send_frame_raw(pl_conn *c, uint16_t type, uint32_t tag, uint32_t aux,
                          const void *data, size_t len, int timeout_ms, char *err, size_t errlen)
{
    if (c->broken)
        return broken_err(c, err, errlen);
    pl_frame_hdr h = {.type = type, .tag = tag, .aux = aux, .generation = c->generation,
                      .len = len};
    unsigned char hb[PL_FRAME_HDR_BYTES];
    pl_frame_encode(&h, hb);
    struct iovec iov[2] = {{hb, sizeof hb}, {(void *)data, len}};
    const char *what = "";
    int rc = c->protection == PL_PROTECT_NONE
                 ? write_iov(c->fd, iov, len ? 2 : 1, timeout_ms, &what)
                 : write_sealed(c, hb, data, len, timeout_ms, &what);
    if (rc) {
        c->broken = rc;
        return pl_comm_errf(err, errlen, rc, "send to rank %d (%s): %s: %s", (int)c->peer_rank,
                            c->peer_addr, pl_comm_strerror(rc), what);
    }
    return 0;
}

int pl_conn_send_frame(pl_conn *c, uint16_t type, uint32_t tag, uint32_t aux,
                       const void *data, size_t len, int timeout_ms, char *err,
                       size_t errlen)
{
    if (c->broken)
        return broken_err(c, err, errlen);
    if (len > c->max_frame)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                            "send to rank %d: frame of %zu bytes exceeds the maximum %llu",
                            (int)c->peer_rank, len, (unsigned long long)c->max_frame);
    return send_frame_raw(c, type, tag, aux, data, len, timeout_ms, err, errlen);
}

/* limit: the largest payload accepted (the maximum frame size for caller frames, the
 * protocol's fixed chunk size for tensor chunks). On a protected connection the header
 * starts the frame's authentication (recv_payload ends it). */
static int recv_header(pl_conn *c, pl_frame_hdr *hdr, uint64_t limit, int timeout_ms, char *err,
                       size_t errlen)
{
    if (c->broken)
        return broken_err(c, err, errlen);
    unsigned char hb[PL_FRAME_HDR_BYTES];
    size_t got = 0;
    const char *what = "";
    int rc = read_full(c->fd, hb, sizeof hb, timeout_ms, &got, &what);
    if (rc) {
        if (!(rc == PL_COMM_ETIMEOUT && got == 0))
            c->broken = rc;
        return pl_comm_errf(err, errlen, rc, "receive from rank %d (%s): %s: %s",
                            (int)c->peer_rank, c->peer_addr, pl_comm_strerror(rc), what);
    }
    if (pl_frame_decode(hb, hdr)) {
        c->broken = PL_COMM_EPROTO;
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "receive from rank %d (%s): bad frame magic", (int)c->peer_rank,
                            c->peer_addr);
    }
    if (hdr->generation != c->generation) {
        c->broken = PL_COMM_ESTALE;
        return pl_comm_errf(err, errlen, PL_COMM_ESTALE,
                            "receive from rank %d: frame of generation %llu on a generation "
                            "%llu connection",
                            (int)c->peer_rank, (unsigned long long)hdr->generation,
                            (unsigned long long)c->generation);
    }
    if (hdr->len > limit) {
        c->broken = PL_COMM_EPROTO;
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "receive from rank %d: frame of %llu bytes exceeds the maximum %llu",
                            (int)c->peer_rank, (unsigned long long)hdr->len,
                            (unsigned long long)limit);
    }
    if (c->protection != PL_PROTECT_NONE && pl_aead_begin(&c->rx, hb)) {
        c->broken = PL_COMM_ESYS;
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "receive from rank %d: AEAD failed",
                            (int)c->peer_rank);
    }
    return 0;
}

/* The payload of the frame whose header came last (len bytes into buf), then, when
 * protected, its tag: the payload is checked (and decrypted in place) piece by piece as
 * it arrives, and nothing is accepted before the tag verifies. */
static int recv_payload(pl_conn *c, void *buf, size_t len, int timeout_ms, char *err,
                        size_t errlen)
{
    const int prot = c->protection != PL_PROTECT_NONE;
    unsigned char *p = buf, tag[PL_FRAME_TAG_BYTES];
    size_t off = 0, got = 0;
    const char *what = "";
    int rc = 0;
    while (rc == 0 && off < len) {
        const size_t n = !prot || len - off < SEAL_PIECE ? len - off : SEAL_PIECE;
        rc = read_full(c->fd, p + off, n, timeout_ms, &got, &what);
        if (rc == 0 && prot && pl_aead_update(&c->rx, p + off, p + off, n))
            rc = PL_COMM_ESYS, what = "AEAD failed";
        off += rc ? got : n;
    }
    if (rc == 0 && prot)
        rc = read_full(c->fd, tag, sizeof tag, timeout_ms, &got, &what);
    if (rc) {
        c->broken = rc;
        return pl_comm_errf(err, errlen, rc,
                            "receive from rank %d (%s): %s in a frame body (%zu of %zu bytes): %s",
                            (int)c->peer_rank, c->peer_addr, pl_comm_strerror(rc), off, len,
                            what);
    }
    if (prot && pl_aead_open_final(&c->rx, tag))
        return pl_conn_auth_failed(c, "receive", err, errlen);
    return 0;
}

int pl_conn_recv_frame(pl_conn *c, pl_frame_hdr *hdr, void *buf, size_t cap, int timeout_ms,
                       char *err, size_t errlen)
{
    int rc = recv_header(c, hdr, c->max_frame, timeout_ms, err, errlen);
    if (rc)
        return rc;
    if (hdr->len > cap) {
        c->broken = PL_COMM_EPROTO;
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "receive from rank %d: frame of %llu bytes, buffer holds %zu",
                            (int)c->peer_rank, (unsigned long long)hdr->len, cap);
    }
    return recv_payload(c, buf, (size_t)hdr->len, timeout_ms, err, errlen);
}

int pl_conn_recv_frame_alloc(pl_conn *c, pl_frame_hdr *hdr, void **data, int timeout_ms,
                             char *err, size_t errlen)
{
    *data = NULL;
    int rc = recv_header(c, hdr, c->max_frame, timeout_ms, err, errlen);
    if (rc)
        return rc;
    void *p = hdr->len ? malloc((size_t)hdr->len) : NULL;
    if (hdr->len && !p) {
        c->broken = PL_COMM_ESYS;
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory for a %llu-byte frame",
                            (unsigned long long)hdr->len);
    }
    rc = recv_payload(c, p, (size_t)hdr->len, timeout_ms, err, errlen);
    if (rc) {
        free(p);
        return rc;
    }
    *data = p;
    return 0;
}

/* ---- tensors ---- */

/* A protocol constant, the same on both ends whatever their maximum frame size. */
#define TENSOR_CHUNK_FLOATS ((size_t)PL_COMM_TENSOR_CHUNK_BYTES / sizeof(float))

int pl_conn_send_floats(pl_conn *c, uint32_t tag, const float *x, size_t n, int timeout_ms,
                        char *err, size_t errlen)
{
    size_t chunk = TENSOR_CHUNK_FLOATS;
    size_t off = 0;
    uint32_t idx = 0;
    do {
        size_t m = n - off < chunk ? n - off : chunk;
        int rc = send_frame_raw(c, PL_FRAME_TENSOR, tag, idx, x + off, m * sizeof(float),
                                timeout_ms, err, errlen);
        if (rc)
            return rc;
        off += m;
        idx++;
    } while (off < n);
    return 0;
}

int pl_conn_recv_floats(pl_conn *c, uint32_t tag, float *x, size_t n, int timeout_ms,
                        char *err, size_t errlen)
{
    size_t chunk = TENSOR_CHUNK_FLOATS;
    size_t off = 0;
    uint32_t idx = 0;
    do {
        size_t m = n - off < chunk ? n - off : chunk;
        pl_frame_hdr h;
        int rc = recv_header(c, &h, PL_COMM_TENSOR_CHUNK_BYTES, timeout_ms, err, errlen);
        if (rc) {
            if (idx > 0) /* a tensor half received leaves the stream out of step */
                pl_conn_mark_broken(c, rc);
            return rc;
        }
        if (h.type != PL_FRAME_TENSOR || h.tag != tag || h.aux != idx ||
            h.len != m * sizeof(float)) {
            c->broken = PL_COMM_EPROTO;
            return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                                "receive tensor (tag %u, %zu floats) from rank %d: got frame "
                                "type %u tag %u chunk %u of %llu bytes, expected chunk %u of "
                                "%zu bytes",
                                tag, n, (int)c->peer_rank, h.type, h.tag, h.aux,
                                (unsigned long long)h.len, idx, m * sizeof(float));
        }
        rc = recv_payload(c, x + off, m * sizeof(float), timeout_ms, err, errlen);
        if (rc)
            return rc;
        off += m;
        idx++;
    } while (off < n);
    return 0;
}
