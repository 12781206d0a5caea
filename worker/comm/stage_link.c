/* The TCP stage link: see stage_link.h. */
#include "stage_link.h"
#include "comm_io.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The connections a link may have: prev, next, wrap. */
#define NCONN 3

/* Bytes read or written in one go before the I/O thread looks at the other direction. */
#define IO_SLICE_BYTES (8u << 20)

typedef struct msg {
    struct msg *next;
    int kind, mb;
    unsigned char *data;
    size_t bytes;
} msg;

typedef struct lconn {
    struct pl_tcp_link *link;
    pl_conn *conn;
    int peer;   /* stage index */
    int32_t peer_rank;
    char peer_name[PL_COMM_NAME_MAX + 1];
    uint64_t generation;
    size_t chunk; /* payload bytes per frame */
    int fd, wakefd;
    int max_pending;
    pthread_t thread;
    int started;

    /* under link->mu */
    msg *txq_head, *txq_tail; /* queued, not yet started */
    int tx_busy;              /* the I/O thread holds a message it is writing */
    msg **stash;              /* max_pending slots, NULL = free */
    int nstash;
    int64_t last_rx_ms;       /* last time bytes arrived */
    int code;                 /* 0 or the PL_COMM_* code that broke it */
    char errmsg[320];

    /* I/O thread only */
    pl_aead *seal, *open;     /* the connection's frame protection (NULL: none) */
    size_t mac;               /* tag bytes after each payload: 0 or PL_FRAME_TAG_BYTES */
    unsigned char *sealed;    /* encrypting: the current frame's ciphertext (chunk bytes) */
    msg *tx;                  /* message being written */
    size_t tx_off;            /* payload bytes of finished frames */
    size_t tx_clen;           /* payload bytes of the current frame */
    size_t tx_done;           /* bytes of the current frame (header + payload) written */
    int tx_started;
    int tx_tagged;            /* protected: the current frame's tag is made */
    unsigned char tx_hb[PL_FRAME_HDR_BYTES], tx_mac[PL_FRAME_TAG_BYTES];
    int64_t tx_last_ms;
    unsigned char rx_hb[PL_FRAME_HDR_BYTES];
    size_t rx_hgot;
    int rx_in_body;           /* header of the current frame decoded */
    pl_frame_hdr rx_h;
    size_t rx_bgot;           /* payload bytes of the current frame read */
    unsigned char rx_mac[PL_FRAME_TAG_BYTES];
    size_t rx_mgot;           /* tag bytes of the current frame read */
    msg *rx;                  /* message being assembled */
    int hup;                  /* poll reported hang-up while we were not reading */
} lconn;

struct pl_tcp_link {
    int stage, timeout_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* messages stashed, errors, abort, queues drained */
    int stop, aborted;
    char abort_reason[200];
    lconn c[NCONN]; /* 0: prev, 1: next, 2: wrap (the ring's other end) */
    int has[NCONN];
};

static const char *kind_name(int kind)
{
    return kind == PL_LINK_ACTIVATION ? "activation"
           : kind == PL_LINK_GRADIENT ? "gradient"
           : kind == PL_LINK_SHADOW   ? "shadow"
                                      : "message";
}

static void msg_free(msg *m)
{
    if (!m) return;
    free(m->data);
    free(m);
}

static void wake(lconn *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->wakefd, &one, sizeof one);
    (void)w; /* the counter saturating still leaves it readable */
}

/* Breaks the connection (I/O thread): the first error stays. */
static void conn_fail(lconn *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_fail(lconn *c, int code, const char *fmt, ...)
{
    pl_tcp_link *l = c->link;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&l->mu);
    if (!c->code) {
        c->code = code;
        snprintf(c->errmsg, sizeof c->errmsg, "stage link to stage %d (rank %d, %s): %s: %s",
                 c->peer, (int)c->peer_rank, c->peer_name, pl_comm_strerror(code), what);
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pl_conn_mark_broken(c->conn, code);
}

/* ---- writing ---- */

/* The next frame of the message being written: its header and, protected, the start of
 * its authentication (encrypting: its ciphertext and tag; authenticating only, the tag is
 * made as the payload goes out: do_write). 0, or −1 after conn_fail. */
static int start_frame(lconn *c)
{
    msg *m = c->tx;
    size_t left = m->bytes - c->tx_off;
    c->tx_clen = left < c->chunk ? left : c->chunk;
    pl_frame_hdr h = {.type = PL_LINK_FRAME,
                      .flags = c->tx_off + c->tx_clen == m->bytes ? PL_LINK_FLAG_LAST : 0,
                      .tag = (uint32_t)m->kind,
                      .aux = (uint32_t)m->mb,
                      .generation = c->generation,
                      .len = c->tx_clen};
    pl_frame_encode(&h, c->tx_hb);
    c->tx_done = 0;
    c->tx_started = 1;
    c->tx_tagged = !c->seal;
    int bad = 0;
    if (c->seal && c->seal->encrypt)
        bad = pl_aead_seal(c->seal, c->tx_hb, m->data + c->tx_off, c->sealed, c->tx_clen,
                           c->tx_mac), c->tx_tagged = 1;
    else if (c->seal)
        bad = pl_aead_begin(c->seal, c->tx_hb);
    if (bad) {
        conn_fail(c, PL_COMM_ESYS, "send: sealing a frame failed");
        return -1;
    }
    return 0;
}

/* Authenticating only: the payload bytes of the current frame that went out in the last
 * write (from done bytes of the frame on); the tag once the payload is out. */
static int seal_written(lconn *c, size_t done)
{
    if (c->tx_tagged) return 0;
    int rc = pl_aead_seal_written(c->seal, c->tx->data + c->tx_off, c->tx_clen, done, c->tx_done,
                                  c->tx_mac);
    if (rc < 0) {
        conn_fail(c, PL_COMM_ESYS, "send: sealing a frame failed");
        return -1;
    }
    c->tx_tagged = rc;
    return 0;
}

/* The message is written: the next queued one, or none. */
static void next_message(lconn *c)
{
    msg_free(c->tx);
    c->tx = NULL;
    c->tx_off = 0;
    pl_tcp_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    c->tx = c->txq_head;
    if (c->tx) {
        c->txq_head = c->tx->next;
        if (!c->txq_head) c->txq_tail = NULL;
    } else {
        c->tx_busy = 0;
        pthread_cond_broadcast(&l->cv); /* flush waiters */
    }
    pthread_mutex_unlock(&l->mu);
}

/* Writes what the socket takes. 0, or −1 after conn_fail. */
static int do_write(lconn *c)
{
    size_t moved = 0;
    while (c->tx && moved < IO_SLICE_BYTES) {
        msg *m = c->tx;
        if (!c->tx_started && start_frame(c)) return -1;
        const unsigned char *payload = c->seal && c->seal->encrypt ? c->sealed
                                                                  : m->data + c->tx_off;
        const size_t end_body = PL_FRAME_HDR_BYTES + c->tx_clen, end = end_body + c->mac;
        struct iovec iov[3];
        int n = 0;
        if (c->tx_done < PL_FRAME_HDR_BYTES)
            iov[n++] = (struct iovec){c->tx_hb + c->tx_done, PL_FRAME_HDR_BYTES - c->tx_done};
        size_t pdone = c->tx_done > PL_FRAME_HDR_BYTES ? c->tx_done - PL_FRAME_HDR_BYTES : 0;
        if (pdone < c->tx_clen)
            iov[n++] = (struct iovec){(void *)(payload + pdone), c->tx_clen - pdone};
        size_t mdone = c->tx_done > end_body ? c->tx_done - end_body : 0;
        if (mdone < c->mac && c->tx_tagged)
            iov[n++] = (struct iovec){c->tx_mac + mdone, c->mac - mdone};
        ssize_t w = 0;
        if (n > 0) {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
                int e = errno;
                conn_fail(c, pl_comm_io_errno(e), "send: %s", strerror(e));
                return -1;
            }
            const size_t before = c->tx_done;
            c->tx_done += (size_t)w;
            moved += (size_t)w;
            c->tx_last_ms = pl_now_ms();
            if (seal_written(c, before)) return -1;
        }
        if (c->tx_done == end) { /* frame complete */
            c->tx_off += c->tx_clen;
            c->tx_started = 0;
            if (c->tx_off == m->bytes) next_message(c);
        }
    }
    return 0;
}

/* ---- reading ---- */

static int stash_find(const lconn *c, int kind, int mb)
{
    for (int i = 0; i < c->max_pending; i++)
        if (c->stash[i] && c->stash[i]->kind == kind && c->stash[i]->mb == mb) return i;
    return -1;
}

/* A decoded header fits this connection: its generation, and a data frame no larger than a
 * chunk. */
static int rx_header_valid(lconn *c)
{
    pl_frame_hdr *h = &c->rx_h;
    if (pl_frame_decode(c->rx_hb, h)) {
        conn_fail(c, PL_COMM_EPROTO, "receive: bad frame magic");
        return -1;
    }
    if (h->generation != c->generation) {
        conn_fail(c, PL_COMM_ESTALE, "receive: frame of generation %llu on a generation %llu connection",
                  (unsigned long long)h->generation, (unsigned long long)c->generation);
        return -1;
    }
    if (h->type != PL_LINK_FRAME || h->tag > PL_LINK_SHADOW || h->aux > INT32_MAX || (h->flags & ~PL_LINK_FLAG_LAST) ||
        h->len > c->chunk) {
        conn_fail(c, PL_COMM_EPROTO,
                  "receive: unexpected frame (type %u, flags %u, tag %u, aux %u, %llu bytes; "
                  "frames of at most %zu bytes expected)",
                  h->type, h->flags, h->tag, h->aux, (unsigned long long)h->len, c->chunk);
        return -1;
    }
    return 0;
}

/* The message a frame belongs to: the one being received, which it must continue, or a new
 * one, which must not be stashed already. */
static int rx_message(lconn *c)
{
    const pl_frame_hdr *h = &c->rx_h;
    if (c->rx) {
        if ((int)h->tag != c->rx->kind || (int)h->aux != c->rx->mb) {
            conn_fail(c, PL_COMM_EPROTO,
                      "receive: frame of %s %u inside %s %d", kind_name((int)h->tag), h->aux,
                      kind_name(c->rx->kind), c->rx->mb);
            return -1;
        }
        return 0;
    }
    pl_tcp_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    int dup = stash_find(c, (int)h->tag, (int)h->aux) >= 0;
    pthread_mutex_unlock(&l->mu);
    if (dup) {
        conn_fail(c, PL_COMM_EPROTO, "receive: %s %u arrived twice", kind_name((int)h->tag),
                  h->aux);
        return -1;
    }
    c->rx = calloc(1, sizeof *c->rx);
    if (!c->rx) {
        conn_fail(c, PL_COMM_ESYS, "out of memory");
        return -1;
    }
    c->rx->kind = (int)h->tag;
    c->rx->mb = (int)h->aux;
    return 0;
}

/* A frame header arrived: validate it and make room for its payload. */
static int rx_header(lconn *c)
{
    const pl_frame_hdr *h = &c->rx_h;
    if (rx_header_valid(c) || rx_message(c))
        return -1;
    if (h->len) {
        unsigned char *p = realloc(c->rx->data, c->rx->bytes + (size_t)h->len);
        if (!p) {
            conn_fail(c, PL_COMM_ESYS, "out of memory for a %zu-byte message",
                      c->rx->bytes + (size_t)h->len);
            return -1;
        }
        c->rx->data = p;
    }
    if (c->open && pl_aead_begin(c->open, c->rx_hb)) {
        conn_fail(c, PL_COMM_ESYS, "receive: AEAD failed");
        return -1;
    }
    c->rx_in_body = 1;
    c->rx_bgot = c->rx_mgot = 0;
    return 0;
}

/* A frame's payload is complete. Returns 1 when the stash became full. */
static int rx_frame_done(lconn *c)
{
    int full = 0;
    c->rx->bytes += (size_t)c->rx_h.len;
    c->rx_in_body = 0;
    c->rx_hgot = 0;
    if (c->rx_h.flags & PL_LINK_FLAG_LAST) {
        pl_tcp_link *l = c->link;
        pthread_mutex_lock(&l->mu);
        for (int i = 0; i < c->max_pending; i++)
            if (!c->stash[i]) {
                c->stash[i] = c->rx;
                break;
            }
        c->nstash++;
        full = c->nstash >= c->max_pending;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        c->rx = NULL;
    }
    return full;
}

/* The bytes just read (r at dst) in the current frame: 1 when the frame is complete (and,
 * protected, its tag verified), 0 when more is to come, −1 after conn_fail. */
static int rx_account(lconn *c, unsigned char *dst, size_t r)
{
    if (!c->rx_in_body) {
        c->rx_hgot += r;
        if (c->rx_hgot < PL_FRAME_HDR_BYTES) return 0;
        if (rx_header(c)) return -1;
        return c->rx_h.len || c->mac ? 0 : 1;
    }
    if (c->rx_bgot < c->rx_h.len) {
        if (c->open && pl_aead_update(c->open, dst, dst, r)) {
            conn_fail(c, PL_COMM_ESYS, "receive: AEAD failed");
            return -1;
        }
        c->rx_bgot += r;
        return c->rx_bgot == c->rx_h.len && !c->mac;
    }
    c->rx_mgot += r;
    if (c->rx_mgot < c->mac) return 0;
    if (pl_aead_open_final(c->open, c->rx_mac)) {
        char why[300];
        pl_conn_auth_failed(c->conn, "receive", why, sizeof why);
        conn_fail(c, PL_COMM_EAUTH, "%s", why);
        return -1;
    }
    return 1;
}

/* Where the next bytes of the current frame go, and how many are still missing there:
 * header, payload, then tag. */
static size_t rx_target(lconn *c, unsigned char **dst)
{
    if (!c->rx_in_body) {
        *dst = c->rx_hb + c->rx_hgot;
        return PL_FRAME_HDR_BYTES - c->rx_hgot;
    }
    if (c->rx_bgot < c->rx_h.len) {
        *dst = c->rx->data + c->rx->bytes + c->rx_bgot;
        return (size_t)c->rx_h.len - c->rx_bgot;
    }
    *dst = c->rx_mac + c->rx_mgot;
    return c->mac - c->rx_mgot;
}

/* Reads what the socket has. 0, or −1 after conn_fail. */
static int do_read(lconn *c)
{
    size_t moved = 0;
    int rc = 0;
    while (moved < IO_SLICE_BYTES) {
        unsigned char *dst;
        size_t want = rx_target(c, &dst);
        ssize_t r = want ? recv(c->fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && r == 0) {
            conn_fail(c, PL_COMM_ECLOSED, "receive: peer closed the connection%s",
                      c->rx_hgot || c->rx_in_body || c->rx ? " in the middle of a message" : "");
            rc = -1;
            break;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            int e = errno;
            conn_fail(c, pl_comm_io_errno(e), "receive: %s", strerror(e));
            rc = -1;
            break;
        }
        moved += (size_t)r;
        const int done = rx_account(c, dst, (size_t)r);
        if (done < 0) {
            rc = -1;
            break;
        }
        if (done && rx_frame_done(c)) break; /* stash full: stop reading */
    }
    if (moved) {
        pl_tcp_link *l = c->link;
        pthread_mutex_lock(&l->mu);
        c->last_rx_ms = pl_now_ms();
        pthread_mutex_unlock(&l->mu);
    }
    return rc;
}

/* ---- the I/O thread ---- */

/* Under the lock: whether to stop, and otherwise what to wait for. Takes the next queued
 * message when none is being written. */
static int io_plan(lconn *c, int *want_r, int *want_w)
{
    pl_tcp_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    const int stop = l->stop || c->code;
    if (!stop && !c->tx && c->txq_head) {
        c->tx = c->txq_head;
        c->txq_head = c->tx->next;
        if (!c->txq_head) c->txq_tail = NULL;
        c->tx_busy = 1;
        c->tx_last_ms = pl_now_ms();
    }
    *want_w = c->tx != NULL;
    *want_r = c->rx_hgot > 0 || c->rx_in_body || c->rx || c->nstash < c->max_pending;
    pthread_mutex_unlock(&l->mu);
    return stop;
}

/* Polls the socket and the wake fd, the wait bounded by the send timeout while writing.
 * 1 with the socket's events in *revents, 0 when interrupted, or −1 after conn_fail. */
static int io_wait(lconn *c, int want_r, int want_w, short *revents)
{
    short ev = (short)((want_r ? POLLIN : 0) | (want_w ? POLLOUT : 0));
    struct pollfd p[2] = {{.fd = (ev || !c->hup) ? c->fd : -1, .events = ev},
                          {.fd = c->wakefd, .events = POLLIN}};
    int timeout = -1;
    if (want_w) {
        int64_t left = c->tx_last_ms + c->link->timeout_ms - pl_now_ms();
        timeout = left < 0 ? 0 : (int)left;
    }
    if (poll(p, 2, timeout) < 0) {
        if (errno == EINTR) return 0;
        int e = errno;
        conn_fail(c, PL_COMM_ESYS, "poll: %s", strerror(e));
        return -1;
    }
    if (p[1].revents) {
        uint64_t v;
        ssize_t rd = read(c->wakefd, &v, sizeof v);
        (void)rd;
    }
    *revents = p[0].revents;
    return 1;
}

static void *io_main(void *arg)
{
    lconn *c = arg;
    pl_tcp_link *l = c->link;
    for (;;) {
        int want_r, want_w;
        short re;
        if (io_plan(c, &want_r, &want_w)) break;
        const int waited = io_wait(c, want_r, want_w, &re);
        if (waited < 0) break;
        if (!waited) continue;
        if (want_r && (re & (POLLIN | POLLHUP | POLLERR)) && do_read(c)) break;
        if (want_w && (re & (POLLOUT | POLLHUP | POLLERR)) && do_write(c)) break;
        if (!want_r && !want_w && (re & (POLLHUP | POLLERR))) c->hup = 1; /* seen when read */
        if (want_w && c->tx && pl_now_ms() - c->tx_last_ms >= l->timeout_ms) {
            conn_fail(c, PL_COMM_ETIMEOUT,
                      "send: peer stopped reading (no byte written for %d ms, %s %d queued)",
                      l->timeout_ms, kind_name(c->tx->kind), c->tx->mb);
            break;
        }
    }
    return NULL;
}

/* ---- API ---- */

void pl_tcp_link_pending_limits(const pl_schedule *s, int *from_prev, int *from_next)
{
    int a = s->nstages - s->stage + 1, b = s->nstages - s->stage;
    *from_prev = a < s->nmicro ? a : s->nmicro;
    *from_next = b < s->nmicro ? b : s->nmicro;
    if (*from_prev < 1) *from_prev = 1;
    if (*from_next < 1) *from_next = 1;
}

static void link_free(pl_tcp_link *l)
{
    for (int i = 0; i < NCONN; i++) {
        lconn *c = &l->c[i];
        if (!l->has[i]) continue;
        for (msg *m = c->txq_head, *nx; m; m = nx) {
            nx = m->next;
            msg_free(m);
        }
        msg_free(c->tx);
        msg_free(c->rx);
        if (c->stash)
            for (int j = 0; j < c->max_pending; j++) msg_free(c->stash[j]);
        free(c->stash);
        free(c->sealed);
        if (c->wakefd >= 0) close(c->wakefd);
        pl_conn_close(c->conn);
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

int pl_tcp_link_create(const pl_tcp_link_config *cfg, pl_tcp_link **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    const char *bad = NULL;
    if (cfg->timeout_ms <= 0) bad = "timeout_ms must be > 0";
    else if ((cfg->prev && cfg->max_pending_prev < 1) || (cfg->next && cfg->max_pending_next < 1))
        bad = "max_pending must be ≥ 1";
    else if (cfg->wrap && cfg->max_pending_wrap < 1) bad = "max_pending_wrap must be ≥ 1";
    else if (cfg->prev && cfg->stage < 1) bad = "stage 0 has no previous stage";
    else if (cfg->stage < 0) bad = "negative stage";
    else if (cfg->wrap && (cfg->wrap_stage < 0 || abs(cfg->wrap_stage - cfg->stage) < 2))
        bad = "wrap_stage must be a stage other than this one and its neighbours";
    else if ((cfg->prev && pl_conn_status(cfg->prev)) || (cfg->next && pl_conn_status(cfg->next)) ||
             (cfg->wrap && pl_conn_status(cfg->wrap)))
        bad = "a connection is already broken";
    pl_tcp_link *l = bad ? NULL : calloc(1, sizeof *l);
    if (!l) {
        pl_conn_close(cfg->prev);
        pl_conn_close(cfg->next);
        pl_conn_close(cfg->wrap);
        return pl_comm_errf(err, errlen, -1, "stage link: %s", bad ? bad : "out of memory");
    }
    l->stage = cfg->stage;
    l->timeout_ms = cfg->timeout_ms;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    pl_conn *conns[NCONN] = {cfg->prev, cfg->next, cfg->wrap};
    const int maxp[NCONN] = {cfg->max_pending_prev, cfg->max_pending_next, cfg->max_pending_wrap};
    const int peers[NCONN] = {cfg->stage - 1, cfg->stage + 1, cfg->wrap_stage};
    int rc = 0;
    for (int i = 0; i < NCONN; i++) {
        lconn *c = &l->c[i];
        c->wakefd = -1;
        if (!conns[i]) continue;
        l->has[i] = 1;
        c->link = l;
        c->conn = conns[i];
        c->peer = peers[i];
        c->peer_rank = pl_conn_peer_rank(c->conn);
        snprintf(c->peer_name, sizeof c->peer_name, "%s", pl_conn_peer_name(c->conn));
        c->generation = pl_conn_generation(c->conn);
        uint64_t mf = pl_conn_max_frame(c->conn);
        c->chunk = mf < PL_LINK_CHUNK_BYTES ? (size_t)mf : PL_LINK_CHUNK_BYTES;
        if (c->chunk < 4) c->chunk = 4;
        c->fd = pl_conn_fd(c->conn);
        c->seal = pl_conn_tx_aead(c->conn);
        c->open = pl_conn_rx_aead(c->conn);
        c->mac = c->seal ? PL_FRAME_TAG_BYTES : 0;
        if (c->seal && c->seal->encrypt && !(c->sealed = malloc(c->chunk)))
            rc = pl_comm_errf(err, errlen, -1, "stage link: out of memory");
        c->max_pending = maxp[i];
        c->last_rx_ms = pl_now_ms();
        c->stash = calloc((size_t)c->max_pending, sizeof *c->stash);
        c->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!c->stash || c->wakefd < 0) {
            rc = pl_comm_errf(err, errlen, -1, "stage link: %s",
                              c->stash ? strerror(errno) : "out of memory");
        }
    }
    for (int i = 0; i < NCONN && rc == 0; i++) {
        lconn *c = &l->c[i];
        if (!l->has[i]) continue;
        int e = pthread_create(&c->thread, NULL, io_main, c);
        if (e) {
            rc = pl_comm_errf(err, errlen, -1, "stage link: pthread_create: %s", strerror(e));
            break;
        }
        c->started = 1;
    }
    if (rc) {
        pl_tcp_link_destroy(l);
        return -1;
    }
    *out = l;
    return 0;
}

static lconn *peer_conn(pl_tcp_link *l, int peer)
{
    for (int i = 0; i < NCONN; i++)
        if (l->has[i] && l->c[i].peer == peer) return &l->c[i];
    return NULL;
}

/* Under l->mu: −1 with err when the link is aborted or c is broken. */
static int link_check(pl_tcp_link *l, lconn *c, char *err, size_t errlen)
{
    if (l->aborted)
        return pl_comm_errf(err, errlen, -1, "stage link of stage %d: aborted: %s", l->stage,
                            l->abort_reason);
    if (c && c->code) return pl_comm_errf(err, errlen, -1, "%s", c->errmsg);
    return 0;
}

int pl_tcp_link_send(pl_tcp_link *l, int peer, pl_link_kind kind, int mb, const float *buf,
                     size_t n, char *err, size_t errlen)
{
    lconn *c = peer_conn(l, peer);
    if (!c)
        return pl_comm_errf(err, errlen, -1, "stage link of stage %d: no connection to stage %d",
                            l->stage, peer);
    if (mb < 0 || n > SIZE_MAX / sizeof(float) / 2)
        return pl_comm_errf(err, errlen, -1, "stage link: bad send (mb %d, %zu floats)", mb, n);
    pthread_mutex_lock(&l->mu);
    int rc = link_check(l, c, err, errlen);
    pthread_mutex_unlock(&l->mu);
    if (rc) return rc;
    msg *m = calloc(1, sizeof *m);
    size_t bytes = n * sizeof(float);
    if (m && bytes) m->data = malloc(bytes);
    if (!m || (bytes && !m->data)) {
        msg_free(m);
        return pl_comm_errf(err, errlen, -1, "stage link: out of memory for a %zu-byte %s",
                            bytes, kind_name(kind));
    }
    if (bytes) memcpy(m->data, buf, bytes);
    m->kind = (int)kind;
    m->mb = mb;
    m->bytes = bytes;
    pthread_mutex_lock(&l->mu);
    rc = link_check(l, c, err, errlen);
    if (rc == 0) {
        if (c->txq_tail) c->txq_tail->next = m;
        else c->txq_head = m;
        c->txq_tail = m;
        c->tx_busy = 1;
    }
    pthread_mutex_unlock(&l->mu);
    if (rc) {
        msg_free(m);
        return rc;
    }
    wake(c);
    return 0;
}

static void abs_deadline(struct timespec *ts, int64_t ms)
{
    ts->tv_sec = (time_t)(ms / 1000);
    ts->tv_nsec = (long)(ms % 1000) * 1000000L;
}

int pl_tcp_link_recv(pl_tcp_link *l, int peer, pl_link_kind kind, int mb, float *buf,
                     size_t n, char *err, size_t errlen)
{
    lconn *c = peer_conn(l, peer);
    if (!c)
        return pl_comm_errf(err, errlen, -1, "stage link of stage %d: no connection to stage %d",
                            l->stage, peer);
    const int64_t start = pl_now_ms();
    msg *m = NULL;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        if ((rc = link_check(l, c, err, errlen))) break;
        int i = stash_find(c, (int)kind, mb);
        if (i >= 0) {
            m = c->stash[i];
            c->stash[i] = NULL;
            c->nstash--;
            break;
        }
        if (c->nstash >= c->max_pending) {
            rc = pl_comm_errf(err, errlen, -1,
                              "stage link: %s %d from stage %d is not among the %d messages "
                              "already received (the most kept); the peers' schedules disagree",
                              kind_name((int)kind), mb, peer, c->nstash);
            break;
        }
        int64_t since = c->last_rx_ms > start ? c->last_rx_ms : start;
        int64_t deadline = since + l->timeout_ms;
        if (pl_now_ms() >= deadline) {
            rc = pl_comm_errf(err, errlen, -1,
                              "stage link: timeout: no %s %d from stage %d (rank %d, %s): "
                              "nothing arrived for %d ms",
                              kind_name((int)kind), mb, peer, (int)c->peer_rank, c->peer_name,
                              l->timeout_ms);
            break;
        }
        struct timespec ts;
        abs_deadline(&ts, deadline);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    pthread_mutex_unlock(&l->mu);
    if (rc) return rc;
    wake(c); /* a stash slot is free: the I/O thread may read again */
    if (m->bytes != n * sizeof(float)) {
        rc = pl_comm_errf(err, errlen, -1,
                          "stage link: %s %d from stage %d has %zu bytes, expected %zu floats",
                          kind_name((int)kind), mb, peer, m->bytes, n);
    } else if (n) {
        memcpy(buf, m->data, m->bytes);
    }
    msg_free(m);
    return rc;
}

int pl_tcp_link_ready(pl_tcp_link *l, int peer, pl_link_kind kind, int mb)
{
    lconn *c = peer_conn(l, peer);
    if (!c) return 0;
    pthread_mutex_lock(&l->mu);
    const int there = stash_find(c, (int)kind, mb) >= 0;
    pthread_mutex_unlock(&l->mu);
    return there;
}

int pl_tcp_link_flush(pl_tcp_link *l, int timeout_ms, char *err, size_t errlen)
{
    const int64_t deadline = timeout_ms < 0 ? -1 : pl_now_ms() + timeout_ms;
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < NCONN && rc == 0; i++) {
            if (!l->has[i]) continue;
            if ((rc = link_check(l, &l->c[i], err, errlen))) break;
            busy |= l->c[i].tx_busy;
        }
        if (rc || !busy) break;
        if (deadline >= 0 && pl_now_ms() >= deadline) {
            rc = pl_comm_errf(err, errlen, -1, "stage link: flush: queued sends not written "
                                               "within %d ms", timeout_ms);
            break;
        }
        if (deadline < 0) {
            pthread_cond_wait(&l->cv, &l->mu);
        } else {
            struct timespec ts;
            abs_deadline(&ts, deadline);
            pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        }
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

int pl_tcp_link_status(pl_tcp_link *l, int peer, char *err, size_t errlen)
{
    lconn *c = peer_conn(l, peer);
    if (!c) return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "no connection to stage %d", peer);
    pthread_mutex_lock(&l->mu);
    int code = c->code;
    if (code && err && errlen) snprintf(err, errlen, "%s", c->errmsg);
    pthread_mutex_unlock(&l->mu);
    return code;
}

void pl_tcp_link_abort(pl_tcp_link *l, const char *reason)
{
    pthread_mutex_lock(&l->mu);
    if (!l->aborted) {
        l->aborted = 1;
        snprintf(l->abort_reason, sizeof l->abort_reason, "%s", reason ? reason : "step aborted");
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void pl_tcp_link_destroy(pl_tcp_link *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < NCONN; i++)
        if (l->has[i] && l->c[i].started) {
            wake(&l->c[i]);
            pthread_join(l->c[i].thread, NULL);
        }
    link_free(l);
}

static int cb_send(void *ctx, int peer, pl_link_kind kind, int mb, const float *buf, size_t n,
                   char *err, size_t errlen)
{
    return pl_tcp_link_send(ctx, peer, kind, mb, buf, n, err, errlen);
}

static int cb_recv(void *ctx, int peer, pl_link_kind kind, int mb, float *buf, size_t n,
                   char *err, size_t errlen)
{
    return pl_tcp_link_recv(ctx, peer, kind, mb, buf, n, err, errlen);
}

static int cb_ready(void *ctx, int peer, pl_link_kind kind, int mb)
{
    return pl_tcp_link_ready(ctx, peer, kind, mb);
}

pl_stage_link pl_tcp_link_stage(pl_tcp_link *l)
{
    pl_stage_link s = {l, cb_send, cb_recv, cb_ready};
    return s;
}
