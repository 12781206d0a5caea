/* Authenticated TCP connections and framing: see tcp.h. */
#include "tcp.h"
#include "comm_io.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdarg.h>
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
    char peer_name[PL_COMM_NAME_MAX + 1];
    char peer_addr[64];
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

static void tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
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

/* ---- little-endian helpers ---- */

static void put16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define FRAME_MAGIC 0x31464c50u /* "PLF1" */

void pl_frame_encode(const pl_frame_hdr *h, unsigned char out[PL_FRAME_HDR_BYTES])
{
    put32(out, FRAME_MAGIC);
    put16(out + 4, h->type);
    put16(out + 6, h->flags);
    put32(out + 8, h->tag);
    put32(out + 12, h->aux);
    put64(out + 16, h->generation);
    put64(out + 24, h->len);
}

int pl_frame_decode(const unsigned char in[PL_FRAME_HDR_BYTES], pl_frame_hdr *h)
{
    if (get32(in) != FRAME_MAGIC)
        return PL_COMM_EPROTO;
    h->type = get16(in + 4);
    h->flags = get16(in + 6);
    h->tag = get32(in + 8);
    h->aux = get32(in + 12);
    h->generation = get64(in + 16);
    h->len = get64(in + 24);
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

/* ---- handshake ---- */

#define HELLO_MAGIC "PLNTHSK1"
#define HELLO_VERSION 1u
#define HELLO_BYTES (8 + 4 + 4 + 8 + 2 + PL_COMM_NAME_MAX + 32 + 1 + 1)
#define NONCE_BYTES 32
#define PROOF_BYTES 32
enum { ROLE_DIALER = 0, ROLE_LISTENER = 1 };
enum { V_OK = 0, V_AUTH = 1, V_STALE = 2, V_RANK = 3 };
static const char *const role_label[2] = {"pliant-comm-v1 dialer proof",
                                          "pliant-comm-v1 listener proof"};

typedef struct {
    int32_t rank;
    uint64_t generation;
    uint16_t name_len;
    char name[PL_COMM_NAME_MAX + 1];
    unsigned char nonce[NONCE_BYTES];
    int role;
} hello_msg;

static int compute_proof(const pl_comm_ident *self_key, int role, const char *name,
                         size_t name_len, int32_t rank, uint64_t gen,
                         const unsigned char own_nonce[NONCE_BYTES],
                         const unsigned char peer_nonce[NONCE_BYTES],
                         unsigned char out[PROOF_BYTES])
{
    unsigned char msg[64 + 2 + PL_COMM_NAME_MAX + 4 + 8 + 2 * NONCE_BYTES];
    size_t n = 0, ll = strlen(role_label[role]);
    memcpy(msg, role_label[role], ll);
    n += ll;
    put16(msg + n, (uint16_t)name_len);
    n += 2;
    memcpy(msg + n, name, name_len);
    n += name_len;
    put32(msg + n, (uint32_t)rank);
    n += 4;
    put64(msg + n, gen);
    n += 8;
    memcpy(msg + n, own_nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    memcpy(msg + n, peer_nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    unsigned int md_len = 0;
    if (!HMAC(EVP_sha256(), self_key->token, (int)self_key->token_len, msg, n, out, &md_len) ||
        md_len != PROOF_BYTES)
        return -1;
    return 0;
}

static const char *verdict_text(int v)
{
    switch (v) {
    case V_AUTH: return "job token mismatch (a peer of another job, or a wrong token)";
    case V_STALE: return "plan generation mismatch (stale plan)";
    case V_RANK: return "unexpected rank";
    default: return "unknown verdict";
    }
}

static int verdict_code(int v)
{
    return v == V_AUTH ? PL_COMM_EAUTH : v == V_STALE ? PL_COMM_ESTALE : PL_COMM_EPROTO;
}

static int handshake(pl_conn *c, const pl_comm_ident *self, int role, int32_t expect_rank,
                     int64_t deadline, char *err, size_t errlen)
{
    const char *what = "";
    size_t got;
    int rc;
    hello_msg mine = {0}, peer = {0};
    size_t my_name_len = strlen(self->name);
    mine.rank = self->rank;
    mine.generation = self->generation;
    mine.role = role;
    if (RAND_bytes(mine.nonce, NONCE_BYTES) != 1)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: RAND_bytes failed");

    unsigned char hb[HELLO_BYTES] = {0};
    memcpy(hb, HELLO_MAGIC, 8);
    put32(hb + 8, HELLO_VERSION);
    put32(hb + 12, (uint32_t)self->rank);
    put64(hb + 16, self->generation);
    put16(hb + 24, (uint16_t)my_name_len);
    memcpy(hb + 26, self->name, my_name_len);
    memcpy(hb + 26 + PL_COMM_NAME_MAX, mine.nonce, NONCE_BYTES);
    hb[26 + PL_COMM_NAME_MAX + NONCE_BYTES] = (unsigned char)role;

#define HS_TIMEOUT pl_comm_poll_timeout(deadline)
#define HS_IO_FAIL(stage)                                                                  \
    return pl_comm_errf(err, errlen, rc, "handshake with %s (%s): %s: %s", c->peer_addr,  \
                        stage, pl_comm_strerror(rc), what)

    struct iovec iov = {hb, sizeof hb};
    if ((rc = write_iov(c->fd, &iov, 1, HS_TIMEOUT, &what)))
        HS_IO_FAIL("sending hello");
    unsigned char pb[HELLO_BYTES];
    if ((rc = read_full(c->fd, pb, sizeof pb, HS_TIMEOUT, &got, &what)))
        HS_IO_FAIL("waiting for hello");
    if (memcmp(pb, HELLO_MAGIC, 8) != 0)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: not a pliant peer (bad hello)", c->peer_addr);
    if (get32(pb + 8) != HELLO_VERSION)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: protocol version %u, expected %u",
                            c->peer_addr, get32(pb + 8), HELLO_VERSION);
    peer.rank = (int32_t)get32(pb + 12);
    peer.generation = get64(pb + 16);
    peer.name_len = get16(pb + 24);
    peer.role = pb[26 + PL_COMM_NAME_MAX + NONCE_BYTES];
    if (peer.name_len > PL_COMM_NAME_MAX || peer.role != 1 - role)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: malformed hello", c->peer_addr);
    memcpy(peer.name, pb + 26, peer.name_len);
    peer.name[peer.name_len] = 0;
    for (size_t i = 0; i < peer.name_len; i++)
        if ((unsigned char)peer.name[i] < 0x20 || (unsigned char)peer.name[i] > 0x7e)
            peer.name[i] = '?';
    memcpy(peer.nonce, pb + 26 + PL_COMM_NAME_MAX, NONCE_BYTES);

    /* proofs */
    unsigned char proof[PROOF_BYTES], expect[PROOF_BYTES], peer_proof[PROOF_BYTES];
    if (compute_proof(self, role, self->name, my_name_len, self->rank, self->generation,
                      mine.nonce, peer.nonce, proof) ||
        compute_proof(self, 1 - role, (const char *)(pb + 26), peer.name_len, peer.rank, peer.generation,
                      peer.nonce, mine.nonce, expect))
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: HMAC failed");
    iov = (struct iovec){proof, sizeof proof};
    if ((rc = write_iov(c->fd, &iov, 1, HS_TIMEOUT, &what)))
        HS_IO_FAIL("sending proof");
    if ((rc = read_full(c->fd, peer_proof, sizeof peer_proof, HS_TIMEOUT, &got, &what)))
        HS_IO_FAIL("waiting for proof");

    int my_verdict = V_OK;
    if (CRYPTO_memcmp(expect, peer_proof, PROOF_BYTES) != 0)
        my_verdict = V_AUTH;
    else if (peer.generation != self->generation)
        my_verdict = V_STALE;
    else if (expect_rank >= 0 && peer.rank != expect_rank)
        my_verdict = V_RANK;
    OPENSSL_cleanse(expect, sizeof expect);

    unsigned char vb[4] = {'V', (unsigned char)my_verdict, 0, 0}, pvb[4];
    iov = (struct iovec){vb, sizeof vb};
    rc = write_iov(c->fd, &iov, 1, HS_TIMEOUT, &what);
    if (rc == 0)
        rc = read_full(c->fd, pvb, sizeof pvb, HS_TIMEOUT, &got, &what);
    /* our own verdict is reported first: it needs nothing from the peer */
    if (my_verdict == V_AUTH)
        return pl_comm_errf(err, errlen, PL_COMM_EAUTH,
                            "handshake with %s: peer claiming rank %d (\"%s\") failed "
                            "authentication: %s",
                            c->peer_addr, (int)peer.rank, peer.name, verdict_text(V_AUTH));
    if (my_verdict == V_STALE)
        return pl_comm_errf(err, errlen, PL_COMM_ESTALE,
                            "handshake with %s: peer rank %d (\"%s\") is at plan generation "
                            "%llu, this worker at %llu: refused (stale plan)",
                            c->peer_addr, (int)peer.rank, peer.name,
                            (unsigned long long)peer.generation,
                            (unsigned long long)self->generation);
    if (my_verdict == V_RANK)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: peer is rank %d (\"%s\"), expected rank %d",
                            c->peer_addr, (int)peer.rank, peer.name, (int)expect_rank);
    if (rc)
        HS_IO_FAIL("waiting for verdict");
    if (pvb[0] != 'V' || pvb[1] > V_RANK)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: malformed verdict", c->peer_addr);
    if (pvb[1] != V_OK)
        return pl_comm_errf(err, errlen, verdict_code(pvb[1]),
                            "handshake with %s: peer rank %d (\"%s\") refused this worker: %s",
                            c->peer_addr, (int)peer.rank, peer.name, verdict_text(pvb[1]));
#undef HS_TIMEOUT
#undef HS_IO_FAIL
    c->peer_rank = peer.rank;
    c->generation = self->generation;
    memcpy(c->peer_name, peer.name, peer.name_len + 1);
    return 0;
}

static int check_ident(const pl_comm_ident *self, char *err, size_t errlen)
{
    if (!self || !self->token || self->token_len < PL_COMM_TOKEN_MIN ||
        self->token_len > INT_MAX)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "comm: a job token is required");
    if (!self->name || strlen(self->name) > PL_COMM_NAME_MAX)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                            "comm: worker name missing or longer than %d bytes",
                            PL_COMM_NAME_MAX);
    if (self->rank < 0)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "comm: negative rank %d",
                            (int)self->rank);
    return 0;
}

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

int pl_listener_accept(pl_listener *l, const pl_comm_ident *self, int timeout_ms,
                       pl_conn **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_ident(self, err, errlen);
    if (rc)
        return rc;
    int64_t deadline = pl_comm_deadline(timeout_ms);
    int fd;
    struct sockaddr_storage ss;
    for (;;) {
        socklen_t sl = sizeof ss;
        fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0)
            break;
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            rc = wait_fd(l->fd, POLLIN, deadline);
            if (rc == PL_COMM_ETIMEOUT)
                return pl_comm_errf(err, errlen, rc, "accept on port %d: no peer within %d ms",
                                    l->port, timeout_ms);
            if (rc)
                return pl_comm_errf(err, errlen, rc, "accept: poll: %s", strerror(errno));
            continue;
        }
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "accept: %s", strerror(errno));
    }
    tune_socket(fd);
    pl_conn *c = conn_new(fd, (struct sockaddr *)&ss);
    if (!c) {
        close(fd);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory");
    }
    rc = handshake(c, self, ROLE_LISTENER, -1, deadline, err, errlen);
    if (rc) {
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

int pl_conn_connect(const char *host, int port, const pl_comm_ident *self,
                    int32_t expect_rank, int timeout_ms, pl_conn **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    int rc = check_ident(self, err, errlen);
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
            for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
                fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            a->ai_protocol);
                if (fd < 0) {
                    last_errno = errno;
                    continue;
                }
                memcpy(&peer_sa, a->ai_addr, a->ai_addrlen);
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
                    last_errno = errno;
                    close(fd);
                    fd = -1;
                }
            }
            freeaddrinfo(res);
        }
        attempts++;
        if (fd >= 0) {
            tune_socket(fd);
            pl_conn *c = conn_new(fd, (struct sockaddr *)&peer_sa);
            if (!c) {
                close(fd);
                return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory");
            }
            rc = handshake(c, self, ROLE_DIALER, expect_rank, deadline, err, errlen);
            if (rc) {
                pl_conn_close(c);
                return rc;
            }
            *out = c;
            return 0;
        }
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
    free(c);
}

int32_t pl_conn_peer_rank(const pl_conn *c) { return c->peer_rank; }
const char *pl_conn_peer_name(const pl_conn *c) { return c->peer_name; }
uint64_t pl_conn_generation(const pl_conn *c) { return c->generation; }
int pl_conn_fd(const pl_conn *c) { return c->fd; }
int pl_conn_status(const pl_conn *c) { return c->broken; }
void pl_conn_set_max_frame(pl_conn *c, uint64_t max_bytes) { c->max_frame = max_bytes; }
uint64_t pl_conn_max_frame(const pl_conn *c) { return c->max_frame; }

void pl_conn_mark_broken(pl_conn *c, int code)
{
    if (!c->broken && code)
        c->broken = code;
}

static int broken_err(pl_conn *c, char *err, size_t errlen)
{
    return pl_comm_errf(err, errlen, c->broken,
                        "connection to rank %d (%s) is broken (%s); it must be re-established",
                        (int)c->peer_rank, c->peer_addr, pl_comm_strerror(c->broken));
}

/* ---- frames ---- */

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
    int rc = write_iov(c->fd, iov, len ? 2 : 1, timeout_ms, &what);
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
 * protocol's fixed chunk size for tensor chunks). */
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
    return 0;
}

static int recv_body(pl_conn *c, void *buf, size_t len, int timeout_ms, char *err,
                     size_t errlen)
{
    size_t got;
    const char *what = "";
    int rc = read_full(c->fd, buf, len, timeout_ms, &got, &what);
    if (rc) {
        c->broken = rc;
        return pl_comm_errf(err, errlen, rc,
                            "receive from rank %d (%s): %s in a frame body (%zu of %zu bytes): %s",
                            (int)c->peer_rank, c->peer_addr, pl_comm_strerror(rc), got, len,
                            what);
    }
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
    return recv_body(c, buf, (size_t)hdr->len, timeout_ms, err, errlen);
}

int pl_conn_recv_frame_alloc(pl_conn *c, pl_frame_hdr *hdr, void **data, int timeout_ms,
                             char *err, size_t errlen)
{
    *data = NULL;
    int rc = recv_header(c, hdr, c->max_frame, timeout_ms, err, errlen);
    if (rc)
        return rc;
    if (hdr->len == 0)
        return 0;
    void *p = malloc((size_t)hdr->len);
    if (!p) {
        c->broken = PL_COMM_ESYS;
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "out of memory for a %llu-byte frame",
                            (unsigned long long)hdr->len);
    }
    rc = recv_body(c, p, (size_t)hdr->len, timeout_ms, err, errlen);
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
        rc = recv_body(c, x + off, m * sizeof(float), timeout_ms, err, errlen);
        if (rc)
            return rc;
        off += m;
        idx++;
    } while (off < n);
    return 0;
}

/* ---- mesh ---- */

int pl_comm_mesh(pl_listener *l, const pl_comm_ident *self, int nranks,
                 const char *const *hosts, const int *ports, int timeout_ms, pl_conn **conns,
                 char *err, size_t errlen)
{
    int me = self ? self->rank : -1;
    if (nranks < 1 || me < 0 || me >= nranks)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "mesh: rank %d of %d", me, nranks);
    for (int r = 0; r < nranks; r++)
        conns[r] = NULL;
    int64_t deadline = pl_comm_deadline(timeout_ms);
    int rc = 0;
    for (int r = 0; r < me && rc == 0; r++)
        rc = pl_conn_connect(hosts[r], ports[r], self, r, pl_comm_poll_timeout(deadline),
                             &conns[r], err, errlen);
    int missing = nranks - 1 - me;
    char last[256] = "";
    while (rc == 0 && missing > 0) {
        int left = pl_comm_poll_timeout(deadline);
        if (left == 0 && deadline >= 0) {
            rc = pl_comm_errf(err, errlen, PL_COMM_ETIMEOUT,
                              "mesh: rank %d still waits for %d higher rank(s)%s%s", me,
                              missing, last[0] ? "; last refused: " : "", last);
            break;
        }
        /* a silent or slow stranger holds up the mesh at most PL_COMM_MESH_HANDSHAKE_MS */
        if (left < 0 || left > PL_COMM_MESH_HANDSHAKE_MS)
            left = PL_COMM_MESH_HANDSHAKE_MS;
        pl_conn *c = NULL;
        int arc = pl_listener_accept(l, self, left, &c, last, sizeof last);
        if (arc == PL_COMM_ETIMEOUT && strstr(last, "no peer within"))
            last[0] = 0; /* nobody came in this slice: not a refusal */
        if (arc)
            continue; /* a failed handshake affects nobody else; keep waiting */
        int pr = pl_conn_peer_rank(c);
        if (pr <= me || pr >= nranks || conns[pr]) {
            snprintf(last, sizeof last, "unexpected or duplicate rank %d", pr);
            pl_conn_close(c);
            continue;
        }
        conns[pr] = c;
        missing--;
    }
    if (rc) {
        for (int r = 0; r < nranks; r++) {
            pl_conn_close(conns[r]);
            conns[r] = NULL;
        }
    }
    return rc;
}
