/* Fuzz target: the peer handshake (worker/comm/handshake.c: the hello parser, the proof,
 * the verdict, the frame keys) as its state machine meets peer bytes. Two modes, chosen
 * by the input's first byte:
 *
 *  - raw: one handshake (a dialer or a listener) reads the rest of the input as its peer's
 *    whole stream, which then ends. It must refuse it with a message and never hang or
 *    succeed (a proof needs the job token);
 *  - relay: a dialer and a listener of one job, configured from the input (purposes,
 *    generations, expected rank, protection, cipher), run against each other in this
 *    thread through a relay that flips the bytes or cuts the stream where the input says.
 *    Each side ends (a stream that stops is a bug); when both succeed they agree on the
 *    peer, the protection (never below what either asked) and the keys (one side's
 *    sending key is the other's receiving key); with nothing changed on the way and a
 *    matching configuration both succeed.
 *
 * Sockets: AF_UNIX socketpairs, so every byte sent is readable at once. */
#include "fuzz.h"
#include "handshake.h"
#include "util.h"

#include <errno.h>
#include <sys/socket.h>

#define TOKEN "fuzz-peer-handshake-token"
#define STREAM_BYTES 162 /* hello 126, proof 32, verdict 4 */

static pl_comm_ident ident(int rank, const char *name, uint64_t gen, int purpose, int prot,
                           int cipher)
{
    pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = rank, .name = name,
                        .generation = gen, .purpose = (pl_conn_purpose)purpose,
                        .protection = (pl_frame_protection)prot,
                        .cipher = (pl_frame_cipher)cipher};
    return id;
}

/* Steps h until it ends; the peer's stream is already complete (then closed). */
static int run_alone(pl_handshake *h, int fd, int drain)
{
    char err[512] = "", sink[512];
    for (int i = 0; i < 16; i++) {
        int rc = pl_handshake_step(h, fd, "fuzz", err, sizeof err);
        while (recv(drain, sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
        if (rc != 0) {
            FUZZ_CHECK(rc < 0 && err[0]); /* nothing but the token makes a proof */
            return rc;
        }
    }
    FUZZ_CHECK(!"a handshake waits for bytes of a stream that ended");
    return 0;
}

static void raw_mode(const uint8_t *data, size_t size, int dialer)
{
    int sp[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0);
    for (size_t done = 0; done < size;) { /* at most a few KB: the pair's buffer takes it */
        ssize_t w = send(sp[1], data + done, size - done, MSG_DONTWAIT);
        if (w <= 0) break;
        done += (size_t)w;
    }
    shutdown(sp[1], SHUT_WR);
    pl_comm_ident id = ident(dialer ? 1 : 0, dialer ? "b" : "a", 4,
                             dialer ? PL_CONN_RING : PL_CONN_ANY, 0, 0);
    char err[256];
    pl_handshake *h = pl_handshake_new(&id, dialer, dialer ? 0 : -1, pl_now_ms() + 5000, err,
                                       sizeof err);
    FUZZ_CHECK(h);
    run_alone(h, sp[0], sp[1]);
    pl_handshake_free(h);
    close(sp[0]);
    close(sp[1]);
}

/* ---- relay mode ---- */

typedef struct {
    int from, to;        /* the relay's ends: read from one side, write to the other */
    size_t pos;          /* bytes passed so far */
    size_t cut;          /* the stream ends here (SIZE_MAX: never) */
    int ended;
    const uint8_t *muts; /* (position, xor) pairs for this direction */
    size_t nmuts;
} relay_dir;

/* Passes what is readable, changed as the input says. 1 when a byte moved. */
static int pass(relay_dir *d)
{
    unsigned char buf[512];
    if (d->ended) return 0;
    ssize_t n = recv(d->from, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        shutdown(d->to, SHUT_WR); /* the side closed: so does the relay */
        d->ended = 1;
        return 1;
    }
    if (n < 0) return 0;
    size_t k = (size_t)n;
    for (size_t m = 0; m < d->nmuts; m++) {
        const size_t at = d->muts[2 * m] % STREAM_BYTES;
        if (at >= d->pos && at < d->pos + k) buf[at - d->pos] ^= d->muts[2 * m + 1];
    }
    if (d->pos + k >= d->cut) {
        k = d->cut - d->pos;
        d->ended = 1;
    }
    if (k && send(d->to, buf, k, MSG_NOSIGNAL) != (ssize_t)k) d->ended = 1; /* the side ended */
    d->pos += k;
    if (d->ended) shutdown(d->to, SHUT_WR);
    return 1;
}

typedef struct {
    pl_handshake *h;
    int fd, rc;
    char err[512];
} side;

static int step(side *s)
{
    if (s->rc) return 0;
    s->rc = pl_handshake_step(s->h, s->fd, "fuzz", s->err, sizeof s->err);
    if (s->rc < 0) {
        FUZZ_CHECK(s->err[0]);
        shutdown(s->fd, SHUT_RDWR); /* tcp.c closes a refused connection */
    }
    return s->rc != 0;
}

static void check_agreement(const side *d, const side *l, int pd, int pl)
{
    const pl_handshake_result *rd = pl_handshake_result_of(d->h), *rl = pl_handshake_result_of(l->h);
    FUZZ_CHECK(strcmp(rd->peer_name, "a") == 0 && strcmp(rl->peer_name, "b") == 0);
    FUZZ_CHECK(rd->peer_rank == 0 && rl->peer_rank == 1);
    FUZZ_CHECK(rd->protection == rl->protection && rd->cipher == rl->cipher);
    FUZZ_CHECK((int)rd->protection >= pd && (int)rd->protection >= pl);
    FUZZ_CHECK(memcmp(rd->key_tx, rl->key_rx, PL_AEAD_KEY_BYTES) == 0);
    FUZZ_CHECK(memcmp(rd->key_rx, rl->key_tx, PL_AEAD_KEY_BYTES) == 0);
    FUZZ_CHECK(memcmp(rd->key_tx, rd->key_rx, PL_AEAD_KEY_BYTES) != 0);
}

/* cfg[0]: purposes, generations, expected rank; cfg[1]: protections and ciphers; cfg[2]:
 * where the dialer's stream (low nibble) and the listener's (high) end, 15: never. */
static void relay_mode(const uint8_t cfg[3], const uint8_t *muts, size_t nmuts)
{
    const int lpurpose = cfg[0] & 3, dpurpose = 1 + (cfg[0] >> 2 & 3) % 3;
    const uint64_t dgen = cfg[0] & 0x10 ? 5 : 4;
    const int32_t expect = cfg[0] & 0x20 ? 7 : 0;
    const int pd = cfg[1] & 3, pl = cfg[1] >> 2 & 3, cd = cfg[1] >> 4 & 3, cl = cfg[1] >> 6;
    if (cd > 2 || cl > 2) return;
    int sd[2], sl[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sd) == 0);
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sl) == 0);
    pl_comm_ident idd = ident(1, "b", dgen, dpurpose, pd, cd), idl = ident(0, "a", 4, lpurpose, pl, cl);
    const int64_t deadline = pl_now_ms() + 5000;
    char err[256];
    side d = {.h = pl_handshake_new(&idd, 1, expect, deadline, err, sizeof err), .fd = sd[0]};
    side l = {.h = pl_handshake_new(&idl, 0, -1, deadline, err, sizeof err), .fd = sl[0]};
    FUZZ_CHECK(d.h && l.h);
    /* mutations: 3 bytes each, the first's top bit the direction (dialer → listener: 0) */
    uint8_t *m[2] = {malloc(2 * nmuts + 1), malloc(2 * nmuts + 1)};
    size_t nm[2] = {0, 0};
    for (size_t i = 0; i < nmuts; i++) {
        const int dir = muts[3 * i] >> 7;
        m[dir][2 * nm[dir]] = muts[3 * i + 1];
        m[dir][2 * nm[dir] + 1] = muts[3 * i + 2];
        nm[dir]++;
    }
    const size_t cut_d = (cfg[2] & 15) == 15 ? SIZE_MAX : (size_t)(cfg[2] & 15) * 11;
    const size_t cut_l = (cfg[2] >> 4) == 15 ? SIZE_MAX : (size_t)(cfg[2] >> 4) * 11;
    relay_dir to_l = {.from = sd[1], .to = sl[1], .cut = cut_d, .muts = m[0], .nmuts = nm[0]};
    relay_dir to_d = {.from = sl[1], .to = sd[1], .cut = cut_l, .muts = m[1], .nmuts = nm[1]};
    for (int i = 0, idle = 0; !(d.rc && l.rc); i++) {
        int moved = step(&d) | step(&l);
        moved |= pass(&to_l) | pass(&to_d);
        idle = moved ? 0 : idle + 1;
        FUZZ_CHECK(idle < 3); /* a stall: both wait for bytes that will never come */
        FUZZ_CHECK(i < 1000);
    }
    int changed = 0;
    for (int dir = 0; dir < 2; dir++)
        for (size_t k = 0; k < nm[dir]; k++) changed |= m[dir][2 * k + 1] != 0;
    const int matching = dgen == 4 && (lpurpose == 0 || lpurpose == dpurpose) && expect == 0;
    if (d.rc == 1 && l.rc == 1) check_agreement(&d, &l, pd ? pd : PL_PROTECT_DEFAULT_MODE,
                                                pl ? pl : PL_PROTECT_DEFAULT_MODE);
    if (!changed && cut_d == SIZE_MAX && cut_l == SIZE_MAX)
        FUZZ_CHECK((d.rc == 1 && l.rc == 1) == matching);
    pl_handshake_free(d.h);
    pl_handshake_free(l.h);
    free(m[0]);
    free(m[1]);
    for (int k = 0; k < 2; k++) {
        close(sd[k]);
        close(sl[k]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] < 0x80) {
        raw_mode(data + 1, size - 1 < 4096 ? size - 1 : 4096, data[0] & 1);
        return 0;
    }
    if (size < 4) return 0;
    const size_t nmuts = (size - 4) / 3 < 64 ? (size - 4) / 3 : 64;
    relay_mode(data + 1, data + 4, nmuts);
    return 0;
}
