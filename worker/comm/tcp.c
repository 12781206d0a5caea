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
#define HELLO_VERSION 2u /* 2: the purpose byte */
#define NONCE_BYTES 32
#define PROOF_BYTES 32
/* HELLO: magic, version, rank, generation, name length, name (zero-padded), nonce, role,
 * purpose; little-endian */
#define HELLO_NAME_AT 26
#define HELLO_NONCE_AT (HELLO_NAME_AT + PL_COMM_NAME_MAX)
#define HELLO_ROLE_AT (HELLO_NONCE_AT + NONCE_BYTES)
#define HELLO_PURPOSE_AT (HELLO_ROLE_AT + 1)
#define HELLO_BYTES (HELLO_PURPOSE_AT + 1)
enum { ROLE_DIALER = 0, ROLE_LISTENER = 1 };
enum { V_OK = 0, V_AUTH = 1, V_STALE = 2, V_RANK = 3, V_PURPOSE = 4 };
static const char *const role_label[2] = {"pliant-comm-v2 dialer proof",
                                          "pliant-comm-v2 listener proof"};

typedef struct {
    int32_t rank;
    uint64_t generation;
    uint16_t name_len;
    char name[PL_COMM_NAME_MAX + 1]; /* as sent (the proof covers these bytes) */
    unsigned char nonce[NONCE_BYTES];
    int role, purpose;
} hello_msg;

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

static void hello_encode(const hello_msg *h, unsigned char out[HELLO_BYTES])
{
    memset(out, 0, HELLO_BYTES);
    memcpy(out, HELLO_MAGIC, 8);
    put32(out + 8, HELLO_VERSION);
    put32(out + 12, (uint32_t)h->rank);
    put64(out + 16, h->generation);
    put16(out + 24, h->name_len);
    memcpy(out + HELLO_NAME_AT, h->name, h->name_len);
    memcpy(out + HELLO_NONCE_AT, h->nonce, NONCE_BYTES);
    out[HELLO_ROLE_AT] = (unsigned char)h->role;
    out[HELLO_PURPOSE_AT] = (unsigned char)h->purpose;
}

/* Only a layer copy's dialer may be a worker without a plan rank (an idle one). */
static int rank_allowed(int32_t rank, int role, int purpose)
{
    return rank >= 0 ||
           (rank == PL_COMM_NO_RANK && role == ROLE_DIALER && purpose == PL_CONN_LAYER_COPY);
}

/* The peer's hello; it must come from the other role, and a dialer names one purpose. */
static int hello_decode(const unsigned char in[HELLO_BYTES], int peer_role, hello_msg *h,
                        const char *addr, char *err, size_t errlen)
{
    if (memcmp(in, HELLO_MAGIC, 8) != 0)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: not a pliant peer (bad hello)", addr);
    if (get32(in + 8) != HELLO_VERSION)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: protocol version %u, expected %u", addr,
                            get32(in + 8), HELLO_VERSION);
    h->rank = (int32_t)get32(in + 12);
    h->generation = get64(in + 16);
    h->name_len = get16(in + 24);
    h->role = in[HELLO_ROLE_AT];
    h->purpose = in[HELLO_PURPOSE_AT];
    const int first_purpose = peer_role == ROLE_DIALER ? PL_CONN_RING : PL_CONN_ANY;
    if (h->name_len > PL_COMM_NAME_MAX || h->role != peer_role || h->purpose < first_purpose ||
        h->purpose >= PL_CONN_PURPOSE_COUNT || !rank_allowed(h->rank, h->role, h->purpose))
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO, "handshake with %s: malformed hello",
                            addr);
    memcpy(h->name, in + HELLO_NAME_AT, h->name_len);
    h->name[h->name_len] = 0;
    memcpy(h->nonce, in + HELLO_NONCE_AT, NONCE_BYTES);
    return 0;
}

/* The proof of h's sender: what it claims (name, rank, generation, purpose) bound to both
 * nonces under the job token. */
static int compute_proof(const pl_comm_ident *key, const hello_msg *h,
                         const unsigned char other_nonce[NONCE_BYTES],
                         unsigned char out[PROOF_BYTES])
{
    unsigned char msg[64 + 2 + PL_COMM_NAME_MAX + 4 + 8 + 1 + 2 * NONCE_BYTES];
    size_t n = strlen(role_label[h->role]);
    memcpy(msg, role_label[h->role], n);
    put16(msg + n, h->name_len);
    n += 2;
    memcpy(msg + n, h->name, h->name_len);
    n += h->name_len;
    put32(msg + n, (uint32_t)h->rank);
    n += 4;
    put64(msg + n, h->generation);
    n += 8;
    msg[n++] = (unsigned char)h->purpose;
    memcpy(msg + n, h->nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    memcpy(msg + n, other_nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    unsigned int md_len = 0;
    if (!HMAC(EVP_sha256(), key->token, (int)key->token_len, msg, n, out, &md_len) ||
        md_len != PROOF_BYTES)
        return -1;
    return 0;
}

/* This side's verdict on the peer, most basic first: who it is, then its plan, then
 * what the connection is for, then its place. */
static int judge(const hello_msg *mine, const hello_msg *peer, int32_t expect_rank,
                 const unsigned char expect[PROOF_BYTES],
                 const unsigned char got[PROOF_BYTES])
{
    const hello_msg *dialer = mine->role == ROLE_DIALER ? mine : peer;
    const hello_msg *acceptor = mine->role == ROLE_DIALER ? peer : mine;
    if (CRYPTO_memcmp(expect, got, PROOF_BYTES) != 0)
        return V_AUTH;
    if (peer->generation != mine->generation)
        return V_STALE;
    if (acceptor->purpose != PL_CONN_ANY && acceptor->purpose != dialer->purpose)
        return V_PURPOSE;
    if (expect_rank >= 0 && peer->rank != expect_rank)
        return V_RANK;
    return V_OK;
}

/* "dials a ring connection" / "accepts stage link connections". */
static void describe_purpose(const hello_msg *h, char *out, size_t outlen)
{
    if (h->role == ROLE_DIALER)
        snprintf(out, outlen, "dials a %s connection", pl_conn_purpose_name(h->purpose));
    else if (h->purpose == PL_CONN_ANY)
        snprintf(out, outlen, "accepts any connection");
    else
        snprintf(out, outlen, "accepts %s connections", pl_conn_purpose_name(h->purpose));
}

/* The peer's name as sent, made printable for messages (n bytes, then a NUL). */
static void printable_name(char *out, const char *name, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e ? '?' : name[i];
    out[n] = 0;
}

/* The error of a handshake that a verdict ended; by_peer: the peer's verdict. */
static int refusal(const pl_conn *c, int verdict, int by_peer, const hello_msg *mine,
                   const hello_msg *peer, int32_t expect_rank, char *err, size_t errlen)
{
    char shown[PL_COMM_NAME_MAX + 1], ours[64], theirs[64];
    printable_name(shown, peer->name, peer->name_len);
    describe_purpose(mine, ours, sizeof ours);
    describe_purpose(peer, theirs, sizeof theirs);
    const int code = verdict == V_AUTH ? PL_COMM_EAUTH
                     : verdict == V_STALE ? PL_COMM_ESTALE : PL_COMM_EPROTO;
    if (by_peer) {
        char detail[160] = "";
        if (verdict == V_PURPOSE)
            snprintf(detail, sizeof detail, " (the peer %s, this worker %s)", theirs, ours);
        return pl_comm_errf(err, errlen, code,
                            "handshake with %s: peer rank %d (\"%s\") refused this worker: %s%s",
                            c->peer_addr, (int)peer->rank, shown,
                            verdict == V_AUTH    ? "job token mismatch"
                            : verdict == V_STALE ? "plan generation mismatch (stale plan)"
                            : verdict == V_RANK  ? "unexpected rank"
                                                 : "wrong connection purpose",
                            detail);
    }
    switch (verdict) {
    case V_AUTH:
        return pl_comm_errf(err, errlen, code,
                            "handshake with %s: peer claiming rank %d (\"%s\") failed "
                            "authentication: job token mismatch (a peer of another job, or a "
                            "wrong token)", c->peer_addr, (int)peer->rank, shown);
    case V_STALE:
        return pl_comm_errf(err, errlen, code,
                            "handshake with %s: peer rank %d (\"%s\") is at plan generation "
                            "%llu, this worker at %llu: refused (stale plan)", c->peer_addr,
                            (int)peer->rank, shown, (unsigned long long)peer->generation,
                            (unsigned long long)mine->generation);
    case V_PURPOSE:
        return pl_comm_errf(err, errlen, code,
                            "handshake with %s: wrong connection purpose: peer rank %d (\"%s\") "
                            "%s, this worker %s", c->peer_addr, (int)peer->rank, shown, theirs,
                            ours);
    default:
        return pl_comm_errf(err, errlen, code,
                            "handshake with %s: peer is rank %d (\"%s\"), expected rank %d",
                            c->peer_addr, (int)peer->rank, shown, (int)expect_rank);
    }
}

/* Sends n bytes and receives n from the peer before the deadline. */
static int exchange(pl_conn *c, const void *out, void *in, size_t n, int64_t deadline,
                    const char *what_msg, char *err, size_t errlen)
{
    const char *what = "";
    size_t got;
    struct iovec iov = {(void *)out, n};
    int rc = write_iov(c->fd, &iov, 1, pl_comm_poll_timeout(deadline), &what);
    const char *stage = "sending";
    if (rc == 0) {
        rc = read_full(c->fd, in, n, pl_comm_poll_timeout(deadline), &got, &what);
        stage = "waiting for";
    }
    if (rc)
        return pl_comm_errf(err, errlen, rc, "handshake with %s (%s %s): %s: %s", c->peer_addr,
                            stage, what_msg, pl_comm_strerror(rc), what);
    return 0;
}

static int handshake(pl_conn *c, const pl_comm_ident *self, int role, int32_t expect_rank,
                     int64_t deadline, char *err, size_t errlen)
{
    hello_msg mine = {.rank = self->rank, .generation = self->generation,
                      .name_len = (uint16_t)strlen(self->name), .role = role,
                      .purpose = self->purpose},
              peer;
    memcpy(mine.name, self->name, mine.name_len);
    if (RAND_bytes(mine.nonce, NONCE_BYTES) != 1)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: RAND_bytes failed");
    unsigned char hb[HELLO_BYTES], pb[HELLO_BYTES];
    hello_encode(&mine, hb);
    int rc = exchange(c, hb, pb, HELLO_BYTES, deadline, "hello", err, errlen);
    if (rc || (rc = hello_decode(pb, 1 - role, &peer, c->peer_addr, err, errlen)))
        return rc;
    unsigned char proof[PROOF_BYTES], expect[PROOF_BYTES], peer_proof[PROOF_BYTES];
    if (compute_proof(self, &mine, peer.nonce, proof) ||
        compute_proof(self, &peer, mine.nonce, expect))
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: HMAC failed");
    if ((rc = exchange(c, proof, peer_proof, PROOF_BYTES, deadline, "proof", err, errlen)))
        return rc;
    const int verdict = judge(&mine, &peer, expect_rank, expect, peer_proof);
    OPENSSL_cleanse(expect, sizeof expect);
    unsigned char vb[4] = {'V', (unsigned char)verdict, 0, 0}, pvb[4];
    rc = exchange(c, vb, pvb, sizeof vb, deadline, "verdict", err, errlen);
    /* our own verdict is reported first: it needs nothing from the peer */
    if (verdict != V_OK)
        return refusal(c, verdict, 0, &mine, &peer, expect_rank, err, errlen);
    if (rc)
        return rc;
    if (pvb[0] != 'V' || pvb[1] > V_PURPOSE)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: malformed verdict", c->peer_addr);
    if (pvb[1] != V_OK)
        return refusal(c, pvb[1], 1, &mine, &peer, expect_rank, err, errlen);
    c->peer_rank = peer.rank;
    c->generation = self->generation;
    c->purpose = role == ROLE_DIALER ? mine.purpose : peer.purpose;
    printable_name(c->peer_name, peer.name, peer.name_len);
    return 0;
}

static int check_ident(const pl_comm_ident *self, int role, char *err, size_t errlen)
{
    if (!self || !self->token || self->token_len < PL_COMM_TOKEN_MIN ||
        self->token_len > INT_MAX)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "comm: a job token is required");
    if (!self->name || strlen(self->name) > PL_COMM_NAME_MAX)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                            "comm: worker name missing or longer than %d bytes",
                            PL_COMM_NAME_MAX);
    const int first_purpose = role == ROLE_DIALER ? PL_CONN_RING : PL_CONN_ANY;
    if ((int)self->purpose < first_purpose || self->purpose >= PL_CONN_PURPOSE_COUNT)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "comm: purpose %d: a %s %s",
                            (int)self->purpose, role == ROLE_DIALER ? "dialer" : "listener",
                            role == ROLE_DIALER ? "names what the connection is for"
                                                : "accepts one purpose or any");
    if (!rank_allowed(self->rank, role, self->purpose))
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                            "comm: rank %d (only a layer copy's dialer may have no rank)",
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
    int rc = check_ident(self, ROLE_LISTENER, err, errlen);
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
    int rc = check_ident(self, ROLE_DIALER, err, errlen);
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
pl_conn_purpose pl_conn_purpose_of(const pl_conn *c) { return c->purpose; }
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
