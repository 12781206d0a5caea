/* Ring all-reduce over pl_conn: see allreduce.h. */
#include "allreduce.h"
#include "comm_io.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* The bytes [begin, begin+len) of segment s when n floats are split into p segments. */
static void segment(size_t n, int p, int s, size_t *begin, size_t *len)
{
    size_t q = n / (size_t)p, r = n % (size_t)p, us = (size_t)s;
    *begin = us * q + (us < r ? us : r);
    *len = q + (us < r ? 1 : 0);
}

static int mod(int a, int p) { return ((a % p) + p) % p; }

typedef struct {
    pl_conn *c;
    uint32_t tag, aux;
    /* the segment being moved, in chunks of at most chunk floats */
    float *data;
    size_t count, chunk, off; /* off: floats of finished chunks */
    /* the chunk in flight: header, payload, tag (protected connections) */
    unsigned char hdr[PL_FRAME_HDR_BYTES], mac[PL_FRAME_TAG_BYTES];
    size_t hdr_done, body_done, mac_done;
    pl_aead *aead;   /* the direction's protection, NULL: none */
    float *sealed;   /* send side, encrypting: the chunk's ciphertext (chunk floats) */
    int started;     /* send side: the chunk's header is made (and its sealing begun) */
    int tagged;      /* send side: the chunk's tag is made */
    /* receive side only */
    int reduce;
    float *scratch;
} xfer;

static size_t cur_len(const xfer *x)
{
    size_t m = x->count - x->off;
    return m < x->chunk ? m : x->chunk;
}

static size_t mac_len(const xfer *x) { return x->aead ? PL_FRAME_TAG_BYTES : 0; }

/* Counts n written or read bytes against the chunk's header, payload and tag, in order. */
static void account(xfer *x, size_t n, size_t body)
{
    size_t take = PL_FRAME_HDR_BYTES - x->hdr_done < n ? PL_FRAME_HDR_BYTES - x->hdr_done : n;
    x->hdr_done += take;
    n -= take;
    take = body - x->body_done < n ? body - x->body_done : n;
    x->body_done += take;
    x->mac_done += n - take;
}

static int chunk_done(const xfer *x, size_t body)
{
    return x->hdr_done == PL_FRAME_HDR_BYTES && x->body_done == body && x->mac_done == mac_len(x);
}

/* The next chunk's header and, protected, the start of its authentication (encrypting:
 * its ciphertext and tag; authenticating only, the tag is made as the payload goes out). */
static int start_chunk(xfer *x, size_t m, char *err, size_t errlen)
{
    pl_frame_hdr h = {.type = PL_FRAME_ALLREDUCE, .tag = x->tag, .aux = x->aux,
                      .generation = pl_conn_generation(x->c), .len = m * sizeof(float)};
    pl_frame_encode(&h, x->hdr);
    x->started = 1;
    x->tagged = !x->aead || x->aead->encrypt;
    int bad = 0;
    if (x->aead && x->aead->encrypt)
        bad = pl_aead_seal(x->aead, x->hdr, x->data + x->off, x->sealed, m * sizeof(float), x->mac);
    else if (x->aead)
        bad = pl_aead_begin(x->aead, x->hdr);
    return bad ? pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: sealing a frame failed") : 0;
}

/* Moves as many bytes as the socket takes now. 1 done, 0 would block, <0 error.
 * *moved is set when any byte moved. */
static int send_progress(xfer *x, int *moved, char *err, size_t errlen)
{
    for (;;) {
        if (x->off >= x->count)
            return 1;
        const size_t m = cur_len(x), body = m * sizeof(float);
        if (!x->started && start_chunk(x, m, err, errlen))
            return PL_COMM_ESYS;
        const char *payload = (const char *)(x->aead && x->aead->encrypt ? x->sealed
                                                                         : x->data + x->off);
        struct iovec iov[3];
        int n = 0;
        if (x->hdr_done < PL_FRAME_HDR_BYTES)
            iov[n++] = (struct iovec){x->hdr + x->hdr_done, PL_FRAME_HDR_BYTES - x->hdr_done};
        if (x->body_done < body)
            iov[n++] = (struct iovec){(char *)payload + x->body_done, body - x->body_done};
        if (x->tagged)
            iov[n++] = (struct iovec){x->mac + x->mac_done, mac_len(x) - x->mac_done};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(pl_conn_fd(x->c), &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            int code = pl_comm_io_errno(errno);
            return pl_comm_errf(err, errlen, code, "all-reduce: send to rank %d: %s",
                                (int)pl_conn_peer_rank(x->c), strerror(errno));
        }
        *moved = 1;
        const size_t before = x->hdr_done + x->body_done;
        account(x, (size_t)w, body);
        int rc = x->tagged ? 0 : pl_aead_seal_written(x->aead, (const unsigned char *)(x->data + x->off),
                                                     body, before, x->hdr_done + x->body_done,
                                                     x->mac);
        if (rc < 0)
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: sealing a frame failed");
        x->tagged |= rc;
        if (chunk_done(x, body)) {
            x->off += m;
            x->hdr_done = x->body_done = x->mac_done = 0;
            x->started = 0;
        }
    }
}

/* A received chunk's header is complete: it must be the one expected. */
static int check_header(xfer *x, size_t m, char *err, size_t errlen)
{
    pl_frame_hdr h;
    if (pl_frame_decode(x->hdr, &h))
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO, "all-reduce: bad frame magic from rank %d",
                            (int)pl_conn_peer_rank(x->c));
    if (h.generation != pl_conn_generation(x->c))
        return pl_comm_errf(err, errlen, PL_COMM_ESTALE,
                            "all-reduce: frame of generation %llu from rank %d, expected %llu",
                            (unsigned long long)h.generation, (int)pl_conn_peer_rank(x->c),
                            (unsigned long long)pl_conn_generation(x->c));
    if (h.type != PL_FRAME_ALLREDUCE || h.tag != x->tag || h.aux != x->aux ||
        h.len != m * sizeof(float))
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "all-reduce: from rank %d got frame type %u tag %u step %u "
                            "of %llu bytes, expected type %u tag %u step %u of %zu "
                            "bytes (members disagree on the collective)",
                            (int)pl_conn_peer_rank(x->c), h.type, h.tag, h.aux,
                            (unsigned long long)h.len, PL_FRAME_ALLREDUCE, x->tag, x->aux,
                            m * sizeof(float));
    if (x->aead && pl_aead_begin(x->aead, x->hdr))
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: AEAD failed");
    return 0;
}

/* A received chunk is complete: its tag verified, it is summed into (or copied to) data. */
static int finish_chunk(xfer *x, size_t m, char *err, size_t errlen)
{
    if (x->aead && pl_aead_open_final(x->aead, x->mac))
        return pl_conn_auth_failed(x->c, "all-reduce", err, errlen);
    if (x->reduce) {
        float *d = x->data + x->off;
        const float *s = x->scratch;
        for (size_t i = 0; i < m; i++)
            d[i] += s[i];
    }
    x->off += m;
    x->hdr_done = x->body_done = x->mac_done = 0;
    return 0;
}

static int recv_progress(xfer *x, int *moved, char *err, size_t errlen)
{
    int fd = pl_conn_fd(x->c);
    for (;;) {
        if (x->off >= x->count)
            return 1;
        const size_t m = cur_len(x), body = m * sizeof(float);
        unsigned char *dst;
        size_t want;
        if (x->hdr_done < PL_FRAME_HDR_BYTES) {
            dst = x->hdr + x->hdr_done;
            want = PL_FRAME_HDR_BYTES - x->hdr_done;
        } else if (x->body_done < body) {
            dst = (unsigned char *)(x->reduce ? x->scratch : x->data + x->off) + x->body_done;
            want = body - x->body_done;
        } else {
            dst = x->mac + x->mac_done;
            want = mac_len(x) - x->mac_done;
        }
        ssize_t r = want ? recv(fd, dst, want, 0) : 0;
        if (want && r == 0)
            return pl_comm_errf(err, errlen, PL_COMM_ECLOSED,
                                "all-reduce: rank %d closed the connection",
                                (int)pl_conn_peer_rank(x->c));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            int code = pl_comm_io_errno(errno);
            return pl_comm_errf(err, errlen, code, "all-reduce: receive from rank %d: %s",
                                (int)pl_conn_peer_rank(x->c), strerror(errno));
        }
        if (r > 0)
            *moved = 1;
        const int in_hdr = x->hdr_done < PL_FRAME_HDR_BYTES, in_body = !in_hdr && x->body_done < body;
        account(x, (size_t)r, body);
        if (in_hdr && x->hdr_done == PL_FRAME_HDR_BYTES) {
            int rc = check_header(x, m, err, errlen);
            if (rc) return rc;
        }
        if (in_body && x->aead && pl_aead_update(x->aead, dst, dst, (size_t)r))
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: AEAD failed");
        if (chunk_done(x, body)) {
            int rc = finish_chunk(x, m, err, errlen);
            if (rc) return rc;
        }
    }
}

/* Sends one segment to next while receiving one from prev; on an error *failed is the
 * connection that failed (the one waited for on a timeout). */
static int exchange(xfer *tx, xfer *rx, int timeout_ms, pl_conn **failed, char *err,
                    size_t errlen)
{
    int64_t deadline = pl_comm_deadline(timeout_ms);
    int sfd = pl_conn_fd(tx->c), rfd = pl_conn_fd(rx->c);
    for (;;) {
        int moved = 0;
        int s = send_progress(tx, &moved, err, errlen);
        *failed = tx->c;
        if (s < 0)
            return s;
        int r = recv_progress(rx, &moved, err, errlen);
        *failed = rx->c;
        if (r < 0)
            return r;
        if (s == 1 && r == 1)
            return 0;
        if (moved)
            deadline = pl_comm_deadline(timeout_ms);
        struct pollfd pf[2];
        int np = 0;
        if (sfd == rfd) {
            pf[np++] = (struct pollfd){.fd = sfd,
                                       .events = (short)((s ? 0 : POLLOUT) | (r ? 0 : POLLIN))};
        } else {
            if (!s)
                pf[np++] = (struct pollfd){.fd = sfd, .events = POLLOUT};
            if (!r)
                pf[np++] = (struct pollfd){.fd = rfd, .events = POLLIN};
        }
        int t = pl_comm_poll_timeout(deadline);
        if (t == 0 && deadline >= 0) {
            if (poll(pf, (nfds_t)np, 0) > 0)
                continue;
            *failed = r ? tx->c : rx->c;
            return pl_comm_errf(err, errlen, PL_COMM_ETIMEOUT,
                                "all-reduce: no progress for %d ms (%s rank %d)", timeout_ms,
                                r ? "sending to" : "waiting for",
                                (int)pl_conn_peer_rank(r ? tx->c : rx->c));
        }
        if (poll(pf, (nfds_t)np, t) < 0 && errno != EINTR)
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: poll: %s",
                                strerror(errno));
    }
}

int pl_ring_allreduce(const pl_peer_table *peers, const int32_t *group, int group_size,
                      float *buf, size_t n, uint32_t tag, int timeout_ms, char *err,
                      size_t errlen)
{
    if (!peers || !group || group_size < 1 || (n && !buf))
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "all-reduce: bad arguments");
    int p = group_size, me = -1;
    for (int i = 0; i < p; i++) {
        if (group[i] < 0 || group[i] >= peers->nranks)
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                                "all-reduce: group member %d is not a rank of 0..%d",
                                (int)group[i], peers->nranks - 1);
        for (int j = 0; j < i; j++)
            if (group[j] == group[i])
                return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                                    "all-reduce: rank %d twice in the group", (int)group[i]);
        if (group[i] == peers->self)
            me = i;
    }
    if (me < 0)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                            "all-reduce: rank %d is not in the group", (int)peers->self);
    if (p == 1 || n == 0)
        return 0;
    int32_t next_rank = group[mod(me + 1, p)], prev_rank = group[mod(me - 1, p)];
    pl_conn *next = peers->conn[next_rank], *prev = peers->conn[prev_rank];
    const int32_t nb[2] = {next_rank, prev_rank};
    pl_conn *const nc[2] = {next, prev};
    for (int k = 0; k < 2; k++) {
        if (!nc[k])
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                                "all-reduce: no connection to ring neighbour rank %d",
                                (int)nb[k]);
        if (pl_conn_peer_rank(nc[k]) != nb[k])
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL,
                                "all-reduce: connection for rank %d leads to rank %d",
                                (int)nb[k], (int)pl_conn_peer_rank(nc[k]));
        if (pl_conn_status(nc[k]))
            return pl_comm_errf(err, errlen, pl_conn_status(nc[k]),
                                "all-reduce: connection to rank %d is broken (%s)",
                                (int)nb[k], pl_comm_strerror(pl_conn_status(nc[k])));
    }
    size_t maxseg = n / (size_t)p + 1;
    size_t chunk = PL_ALLREDUCE_CHUNK_FLOATS; /* a protocol constant, as for tensors */
    const size_t most = maxseg < chunk ? maxseg : chunk;
    pl_aead *seal = pl_conn_tx_aead(next), *open = pl_conn_rx_aead(prev);
    float *scratch = malloc(most * sizeof(float));
    float *sealed = seal && seal->encrypt ? malloc(most * sizeof(float)) : NULL;
    if (!scratch || (seal && seal->encrypt && !sealed)) {
        free(scratch);
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: out of memory");
    }
    int rc = 0;
    pl_conn *failed = NULL;
    for (int step = 0; step < 2 * (p - 1) && rc == 0; step++) {
        int rs = step < p - 1, k = rs ? step : step - (p - 1);
        int sseg = rs ? mod(me - k, p) : mod(me + 1 - k, p);
        int rseg = rs ? mod(me - k - 1, p) : mod(me - k, p);
        size_t sb, sl, rb, rl;
        segment(n, p, sseg, &sb, &sl);
        segment(n, p, rseg, &rb, &rl);
        xfer tx = {.c = next, .tag = tag, .aux = (uint32_t)step, .data = buf + sb,
                   .count = sl, .chunk = chunk, .aead = seal, .sealed = sealed};
        xfer rx = {.c = prev, .tag = tag, .aux = (uint32_t)step, .data = buf + rb,
                   .count = rl, .chunk = chunk, .aead = open, .reduce = rs, .scratch = scratch};
        rc = exchange(&tx, &rx, timeout_ms, &failed, err, errlen);
    }
    free(scratch);
    free(sealed);
    if (rc) { /* the other neighbour's stream is out of step too, through no fault of its own */
        pl_conn_mark_broken(failed, rc);
        pl_conn_mark_broken(failed == next ? prev : next, PL_COMM_ECANCELED);
    }
    return rc;
}

void pl_ar_pack_free(pl_ar_pack *p)
{
    free(p->buf);
    *p = (pl_ar_pack){0};
}

/* pack's buffer of at least n floats (grown, its contents dropped), or NULL. */
static float *pack_reserve(pl_ar_pack *pack, size_t n)
{
    if (pack->cap < n) {
        free(pack->buf);
        pack->buf = malloc(n * sizeof(float));
        pack->cap = pack->buf ? n : 0;
    }
    return pack->buf;
}

int pl_ring_allreduce_many(const pl_peer_table *peers, const int32_t *group, int group_size,
                           const pl_tensor_ref *tensors, int ntensors, uint32_t tag,
                           pl_ar_pack *keep, int timeout_ms, char *err, size_t errlen)
{
    if (ntensors < 0 || (ntensors && !tensors))
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "all-reduce: bad tensor list");
    if (ntensors == 1)
        return pl_ring_allreduce(peers, group, group_size, tensors[0].data, tensors[0].count,
                                 tag, timeout_ms, err, errlen);
    size_t total = 0;
    for (int i = 0; i < ntensors; i++) {
        if (tensors[i].count && !tensors[i].data)
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "all-reduce: tensor %d is NULL",
                                i);
        if (tensors[i].count > SIZE_MAX / sizeof(float) - total)
            return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "all-reduce: tensors too large");
        total += tensors[i].count;
    }
    if (group_size == 1 || total == 0)
        return pl_ring_allreduce(peers, group, group_size, NULL, 0, tag, timeout_ms, err,
                                 errlen);
    float *pack = keep ? pack_reserve(keep, total) : malloc(total * sizeof(float));
    if (!pack)
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "all-reduce: out of memory (%zu floats)",
                            total);
    size_t off = 0;
    for (int i = 0; i < ntensors; i++) {
        if (tensors[i].count)
            memcpy(pack + off, tensors[i].data, tensors[i].count * sizeof(float));
        off += tensors[i].count;
    }
    int rc = pl_ring_allreduce(peers, group, group_size, pack, total, tag, timeout_ms, err,
                               errlen);
    if (rc == 0) {
        off = 0;
        for (int i = 0; i < ntensors; i++) {
            if (tensors[i].count)
                memcpy(tensors[i].data, pack + off, tensors[i].count * sizeof(float));
            off += tensors[i].count;
        }
    }
    if (!keep)
        free(pack);
    return rc;
}
