/* The peer handshake as a non-blocking state machine: hello, proof, verdict, frame keys
 * (handshake.h; the wire format is in tcp.h and docs/runtime.md "Peer connections"). */
#include "handshake.h"
#include "comm_io.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define HELLO_MAGIC "PLNTHSK1"
#define HELLO_VERSION 3u /* 2: the purpose byte; 3: frame protection and cipher */
#define NONCE_BYTES 32
#define PROOF_BYTES 32
/* HELLO: magic, version, rank, generation, name length, name (zero-padded), nonce, role,
 * purpose, frame protection, cipher; little-endian */
#define HELLO_NAME_AT 26
#define HELLO_NONCE_AT (HELLO_NAME_AT + PL_COMM_NAME_MAX)
#define HELLO_ROLE_AT (HELLO_NONCE_AT + NONCE_BYTES)
#define HELLO_PURPOSE_AT (HELLO_ROLE_AT + 1)
#define HELLO_PROTECT_AT (HELLO_PURPOSE_AT + 1)
#define HELLO_CIPHER_AT (HELLO_PROTECT_AT + 1)
#define HELLO_BYTES (HELLO_CIPHER_AT + 1)
#define VERDICT_BYTES 4
enum { ROLE_DIALER = 0, ROLE_LISTENER = 1 };
enum { V_OK = 0, V_AUTH = 1, V_STALE = 2, V_RANK = 3, V_PURPOSE = 4 };
enum { PH_HELLO, PH_PROOF, PH_VERDICT, PH_DONE };
static const char *const role_label[2] = {"pliant-comm-v3 dialer proof",
                                          "pliant-comm-v3 listener proof"};
static const char *const phase_name[3] = {"hello", "proof", "verdict"};

typedef struct {
    int32_t rank;
    uint64_t generation;
    uint16_t name_len;
    char name[PL_COMM_NAME_MAX + 1]; /* as sent (the proof covers these bytes) */
    unsigned char nonce[NONCE_BYTES];
    int role, purpose, protect, cipher;
} hello_msg;

struct pl_handshake {
    const void *token;
    size_t token_len;
    int role;
    int32_t expect_rank;
    int64_t deadline;
    hello_msg mine, peer;
    int phase, verdict;
    unsigned char out[HELLO_BYTES], in[HELLO_BYTES];
    size_t len, sent, got;
    unsigned char proof[2][PROOF_BYTES]; /* [role]: the dialer's and the listener's */
    pl_handshake_result res;
};

/* Only a layer copy's dialer may be a worker without a plan rank (an idle one). */
static int rank_allowed(int32_t rank, int role, int purpose)
{
    return rank >= 0 ||
           (rank == PL_COMM_NO_RANK && role == ROLE_DIALER && purpose == PL_CONN_LAYER_COPY);
}

static int protection_of(const pl_comm_ident *self)
{
    return self->protection == PL_PROTECT_DEFAULT ? PL_PROTECT_DEFAULT_MODE
                                                    : (int)self->protection;
}

static int cipher_of(const pl_comm_ident *self)
{
    if (self->cipher != PL_CIPHER_AUTO) return (int)self->cipher;
    return pl_aead_cpu_has_aes() ? PL_CIPHER_AES_256_GCM : PL_CIPHER_CHACHA20_POLY1305;
}

int pl_handshake_check_ident(const pl_comm_ident *self, int dialer, char *err, size_t errlen)
{
    const int role = dialer ? ROLE_DIALER : ROLE_LISTENER;
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
    if ((int)self->protection < PL_PROTECT_DEFAULT || self->protection > PL_PROTECT_ENCRYPT ||
        (int)self->cipher < PL_CIPHER_AUTO || self->cipher > PL_CIPHER_CHACHA20_POLY1305)
        return pl_comm_errf(err, errlen, PL_COMM_EINVAL, "comm: frame protection %d, cipher %d",
                            (int)self->protection, (int)self->cipher);
    return 0;
}

/* ---- hello ---- */

static void hello_encode(const hello_msg *h, unsigned char out[HELLO_BYTES])
{
    memset(out, 0, HELLO_BYTES);
    memcpy(out, HELLO_MAGIC, 8);
    pl_put32(out + 8, HELLO_VERSION);
    pl_put32(out + 12, (uint32_t)h->rank);
    pl_put64(out + 16, h->generation);
    pl_put16(out + 24, h->name_len);
    memcpy(out + HELLO_NAME_AT, h->name, h->name_len);
    memcpy(out + HELLO_NONCE_AT, h->nonce, NONCE_BYTES);
    out[HELLO_ROLE_AT] = (unsigned char)h->role;
    out[HELLO_PURPOSE_AT] = (unsigned char)h->purpose;
    out[HELLO_PROTECT_AT] = (unsigned char)h->protect;
    out[HELLO_CIPHER_AT] = (unsigned char)h->cipher;
}

/* The peer's hello; it must come from the other role, and a dialer names one purpose. */
static int hello_decode(const unsigned char in[HELLO_BYTES], int peer_role, hello_msg *h,
                        const char *addr, char *err, size_t errlen)
{
    if (memcmp(in, HELLO_MAGIC, 8) != 0)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: not a pliant peer (bad hello)", addr);
    if (pl_get32(in + 8) != HELLO_VERSION)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: protocol version %u, expected %u", addr,
                            pl_get32(in + 8), HELLO_VERSION);
    h->rank = (int32_t)pl_get32(in + 12);
    h->generation = pl_get64(in + 16);
    h->name_len = pl_get16(in + 24);
    h->role = in[HELLO_ROLE_AT];
    h->purpose = in[HELLO_PURPOSE_AT];
    h->protect = in[HELLO_PROTECT_AT];
    h->cipher = in[HELLO_CIPHER_AT];
    const int first_purpose = peer_role == ROLE_DIALER ? PL_CONN_RING : PL_CONN_ANY;
    if (h->name_len > PL_COMM_NAME_MAX || h->role != peer_role || h->purpose < first_purpose ||
        h->purpose >= PL_CONN_PURPOSE_COUNT || !rank_allowed(h->rank, h->role, h->purpose) ||
        h->protect < PL_PROTECT_NONE || h->protect > PL_PROTECT_ENCRYPT ||
        h->cipher < PL_CIPHER_AES_256_GCM || h->cipher > PL_CIPHER_CHACHA20_POLY1305)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO, "handshake with %s: malformed hello",
                            addr);
    memcpy(h->name, in + HELLO_NAME_AT, h->name_len);
    h->name[h->name_len] = 0;
    memcpy(h->nonce, in + HELLO_NONCE_AT, NONCE_BYTES);
    return 0;
}

/* The proof of h's sender: what it claims (name, rank, generation, purpose, frame
 * protection and cipher) bound to both nonces under the job token. */
static int compute_proof(const pl_handshake *hs, const hello_msg *h,
                         const unsigned char other_nonce[NONCE_BYTES],
                         unsigned char out[PROOF_BYTES])
{
    unsigned char msg[64 + 2 + PL_COMM_NAME_MAX + 4 + 8 + 3 + 2 * NONCE_BYTES];
    size_t n = strlen(role_label[h->role]);
    memcpy(msg, role_label[h->role], n);
    pl_put16(msg + n, h->name_len);
    n += 2;
    memcpy(msg + n, h->name, h->name_len);
    n += h->name_len;
    pl_put32(msg + n, (uint32_t)h->rank);
    n += 4;
    pl_put64(msg + n, h->generation);
    n += 8;
    msg[n++] = (unsigned char)h->purpose;
    msg[n++] = (unsigned char)h->protect;
    msg[n++] = (unsigned char)h->cipher;
    memcpy(msg + n, h->nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    memcpy(msg + n, other_nonce, NONCE_BYTES);
    n += NONCE_BYTES;
    unsigned int md_len = 0;
    if (!HMAC(EVP_sha256(), hs->token, (int)hs->token_len, msg, n, out, &md_len) ||
        md_len != PROOF_BYTES)
        return -1;
    return 0;
}

/* This side's verdict on the peer, most basic first: who it is, then its plan, then
 * what the connection is for, then its place. */
static int judge(const pl_handshake *h, const unsigned char expect[PROOF_BYTES])
{
    const hello_msg *dialer = h->role == ROLE_DIALER ? &h->mine : &h->peer;
    const hello_msg *acceptor = h->role == ROLE_DIALER ? &h->peer : &h->mine;
    if (CRYPTO_memcmp(expect, h->proof[h->peer.role], PROOF_BYTES) != 0)
        return V_AUTH;
    if (h->peer.generation != h->mine.generation)
        return V_STALE;
    if (acceptor->purpose != PL_CONN_ANY && acceptor->purpose != dialer->purpose)
        return V_PURPOSE;
    if (h->expect_rank >= 0 && h->peer.rank != h->expect_rank)
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

/* The error of a handshake that the peer's verdict ended. */
static int refused_by_peer(const pl_handshake *h, int verdict, const char *addr, char *err,
                           size_t errlen)
{
    char shown[PL_COMM_NAME_MAX + 1], ours[64], theirs[64], detail[160] = "";
    printable_name(shown, h->peer.name, h->peer.name_len);
    describe_purpose(&h->mine, ours, sizeof ours);
    describe_purpose(&h->peer, theirs, sizeof theirs);
    const int code = verdict == V_AUTH ? PL_COMM_EAUTH
                     : verdict == V_STALE ? PL_COMM_ESTALE : PL_COMM_EPROTO;
    if (verdict == V_PURPOSE)
        snprintf(detail, sizeof detail, " (the peer %s, this worker %s)", theirs, ours);
    return pl_comm_errf(err, errlen, code,
                        "handshake with %s: peer rank %d (\"%s\") refused this worker: %s%s",
                        addr, (int)h->peer.rank, shown,
                        verdict == V_AUTH    ? "job token mismatch"
                        : verdict == V_STALE ? "plan generation mismatch (stale plan)"
                        : verdict == V_RANK  ? "unexpected rank"
                                             : "wrong connection purpose",
                        detail);
}

/* The error of a handshake that this side's verdict ended. */
static int refusal(const pl_handshake *h, const char *addr, char *err, size_t errlen)
{
    char shown[PL_COMM_NAME_MAX + 1], ours[64], theirs[64];
    const hello_msg *peer = &h->peer;
    printable_name(shown, peer->name, peer->name_len);
    describe_purpose(&h->mine, ours, sizeof ours);
    describe_purpose(peer, theirs, sizeof theirs);
    switch (h->verdict) {
    case V_AUTH:
        return pl_comm_errf(err, errlen, PL_COMM_EAUTH,
                            "handshake with %s: peer claiming rank %d (\"%s\") failed "
                            "authentication: job token mismatch (a peer of another job, or a "
                            "wrong token)", addr, (int)peer->rank, shown);
    case V_STALE:
        return pl_comm_errf(err, errlen, PL_COMM_ESTALE,
                            "handshake with %s: peer rank %d (\"%s\") is at plan generation "
                            "%llu, this worker at %llu: refused (stale plan)", addr,
                            (int)peer->rank, shown, (unsigned long long)peer->generation,
                            (unsigned long long)h->mine.generation);
    case V_PURPOSE:
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: wrong connection purpose: peer rank %d (\"%s\") "
                            "%s, this worker %s", addr, (int)peer->rank, shown, theirs, ours);
    default:
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                            "handshake with %s: peer is rank %d (\"%s\"), expected rank %d",
                            addr, (int)peer->rank, shown, (int)h->expect_rank);
    }
}

/* ---- keys ---- */

/* HKDF-SHA256 of the job token, salted with both nonces (the dialer's first), for one
 * direction, bound to the agreed protection and both proofs. */
static int derive_key(const pl_handshake *h, int from_role, unsigned char key[PL_AEAD_KEY_BYTES])
{
    static const char label[] = "pliant-comm-v3 frame key";
    unsigned char salt[2 * NONCE_BYTES], info[sizeof label + 3 + 2 * PROOF_BYTES];
    const hello_msg *d = h->role == ROLE_DIALER ? &h->mine : &h->peer;
    const hello_msg *l = h->role == ROLE_DIALER ? &h->peer : &h->mine;
    memcpy(salt, d->nonce, NONCE_BYTES);
    memcpy(salt + NONCE_BYTES, l->nonce, NONCE_BYTES);
    size_t n = sizeof label;
    memcpy(info, label, n);
    info[n++] = (unsigned char)from_role;
    info[n++] = (unsigned char)h->res.protection;
    info[n++] = (unsigned char)h->res.cipher;
    memcpy(info + n, h->proof[ROLE_DIALER], PROOF_BYTES);
    memcpy(info + n + PROOF_BYTES, h->proof[ROLE_LISTENER], PROOF_BYTES);
    n += 2 * PROOF_BYTES;
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t klen = PL_AEAD_KEY_BYTES;
    const int ok = k && EVP_PKEY_derive_init(k) > 0 && EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) > 0 &&
                   EVP_PKEY_CTX_set1_hkdf_key(k, h->token, (int)h->token_len) > 0 &&
                   EVP_PKEY_CTX_set1_hkdf_salt(k, salt, (int)sizeof salt) > 0 &&
                   EVP_PKEY_CTX_add1_hkdf_info(k, info, (int)n) > 0 &&
                   EVP_PKEY_derive(k, key, &klen) > 0 && klen == PL_AEAD_KEY_BYTES;
    EVP_PKEY_CTX_free(k);
    return ok ? 0 : -1;
}

/* ---- the state machine ---- */

pl_handshake *pl_handshake_new(const pl_comm_ident *self, int dialer, int32_t expect_rank,
                               int64_t deadline, char *err, size_t errlen)
{
    pl_handshake *h = calloc(1, sizeof *h);
    if (!h) {
        pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: out of memory");
        return NULL;
    }
    h->token = self->token;
    h->token_len = self->token_len;
    h->role = dialer ? ROLE_DIALER : ROLE_LISTENER;
    h->expect_rank = expect_rank;
    h->deadline = deadline;
    h->mine = (hello_msg){.rank = self->rank, .generation = self->generation,
                          .name_len = (uint16_t)strlen(self->name), .role = h->role,
                          .purpose = self->purpose, .protect = protection_of(self),
                          .cipher = cipher_of(self)};
    memcpy(h->mine.name, self->name, h->mine.name_len);
    if (RAND_bytes(h->mine.nonce, NONCE_BYTES) != 1) {
        free(h);
        pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: RAND_bytes failed");
        return NULL;
    }
    hello_encode(&h->mine, h->out);
    h->len = HELLO_BYTES;
    return h;
}

void pl_handshake_free(pl_handshake *h)
{
    if (!h) return;
    OPENSSL_cleanse(h, sizeof *h);
    free(h);
}

/* The dialer sends its verdict only once the listener's is in: the listener's side then
 * completes only after the dialer's did, so a dialer that gives up on a handshake (its
 * deadline: a redial's slice, mesh.c) never leaves a connection complete on the
 * listener's side that it no longer holds. */
static int may_send(const pl_handshake *h)
{
    const int verdict_due = h->role != ROLE_DIALER || h->phase != PH_VERDICT || h->got == h->len;
    return h->sent < h->len && verdict_due;
}

short pl_handshake_events(const pl_handshake *h)
{
    return (short)((may_send(h) ? POLLOUT : 0) | (h->got < h->len ? POLLIN : 0));
}

int64_t pl_handshake_deadline(const pl_handshake *h) { return h->deadline; }

const pl_handshake_result *pl_handshake_result_of(const pl_handshake *h) { return &h->res; }

/* The next exchange: out (n bytes) to send, as many to receive. */
static void next_exchange(pl_handshake *h, int phase, const void *out, size_t n)
{
    h->phase = phase;
    memcpy(h->out, out, n);
    h->len = n;
    h->sent = h->got = 0;
}

/* Both sides' verdicts are in: the agreement, or why not. */
static int finish(pl_handshake *h, const char *addr, char *err, size_t errlen)
{
    if (h->verdict != V_OK) return refusal(h, addr, err, errlen);
    if (h->in[0] != 'V' || h->in[1] > V_PURPOSE)
        return pl_comm_errf(err, errlen, PL_COMM_EPROTO, "handshake with %s: malformed verdict",
                            addr);
    if (h->in[1] != V_OK) return refused_by_peer(h, h->in[1], addr, err, errlen);
    pl_handshake_result *r = &h->res;
    r->peer_rank = h->peer.rank;
    r->purpose = h->role == ROLE_DIALER ? h->mine.purpose : h->peer.purpose;
    printable_name(r->peer_name, h->peer.name, h->peer.name_len);
    r->protection = h->mine.protect > h->peer.protect ? h->mine.protect : h->peer.protect;
    r->cipher = h->mine.cipher == PL_CIPHER_AES_256_GCM && h->peer.cipher == PL_CIPHER_AES_256_GCM
                    ? PL_CIPHER_AES_256_GCM : PL_CIPHER_CHACHA20_POLY1305;
    if (derive_key(h, h->role, r->key_tx) || derive_key(h, 1 - h->role, r->key_rx))
        return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake with %s: HKDF failed", addr);
    h->phase = PH_DONE;
    return 1;
}

/* The exchange of the current phase is complete: the next one, or the end. */
static int advance(pl_handshake *h, const char *addr, char *err, size_t errlen)
{
    if (h->phase == PH_HELLO) {
        int rc = hello_decode(h->in, 1 - h->role, &h->peer, addr, err, errlen);
        if (rc) return rc;
        if (compute_proof(h, &h->mine, h->peer.nonce, h->proof[h->role]))
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: HMAC failed");
        next_exchange(h, PH_PROOF, h->proof[h->role], PROOF_BYTES);
        return 0;
    }
    if (h->phase == PH_PROOF) {
        unsigned char expect[PROOF_BYTES];
        memcpy(h->proof[h->peer.role], h->in, PROOF_BYTES);
        if (compute_proof(h, &h->peer, h->mine.nonce, expect))
            return pl_comm_errf(err, errlen, PL_COMM_ESYS, "handshake: HMAC failed");
        h->verdict = judge(h, expect);
        OPENSSL_cleanse(expect, sizeof expect);
        const unsigned char vb[VERDICT_BYTES] = {'V', (unsigned char)h->verdict, 0, 0};
        next_exchange(h, PH_VERDICT, vb, sizeof vb);
        return 0;
    }
    return finish(h, addr, err, errlen);
}

/* Sends what may go (may_send) while the socket takes it: 1 progress, 0 none, <0 an
 * error. */
static int send_bytes(pl_handshake *h, int fd, const char **what)
{
    int moved = 0;
    while (may_send(h)) {
        ssize_t w = send(fd, h->out + h->sent, h->len - h->sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            h->sent += (size_t)w;
            moved = 1;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            *what = "sending";
            return pl_comm_io_errno(errno);
        }
    }
    return moved;
}

/* Moves bytes both ways while the socket takes them (a dialer's verdict after the
 * listener's): 1 progress, 0 none, <0 an error (*what says which). */
static int move_bytes(pl_handshake *h, int fd, const char **what)
{
    int moved = send_bytes(h, fd, what);
    if (moved < 0) return moved;
    while (h->got < h->len) {
        ssize_t r = recv(fd, h->in + h->got, h->len - h->got, MSG_DONTWAIT);
        if (r > 0) {
            h->got += (size_t)r;
            moved = 1;
        } else if (r == 0) {
            *what = "waiting for";
            errno = 0;
            return PL_COMM_ECLOSED;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else {
            *what = "waiting for";
            return pl_comm_io_errno(errno);
        }
    }
    if (!may_send(h)) return moved;
    const int sent = send_bytes(h, fd, what);
    return sent < 0 ? sent : moved | sent;
}

int pl_handshake_step(pl_handshake *h, int fd, const char *addr, char *err, size_t errlen)
{
    for (;;) {
        if (h->phase == PH_DONE) return 1;
        const char *what = may_send(h) ? "sending" : "waiting for";
        int rc = move_bytes(h, fd, &what);
        const int sys = errno;
        if (rc == 0 && h->deadline >= 0 && pl_now_ms() >= (double)h->deadline &&
            (h->sent < h->len || h->got < h->len))
            rc = PL_COMM_ETIMEOUT;
        if (rc < 0) {
            /* this side's refusal first: it needs nothing more from the peer */
            if (h->phase == PH_VERDICT && h->verdict != V_OK) return refusal(h, addr, err, errlen);
            return pl_comm_errf(err, errlen, rc, "handshake with %s (%s %s): %s: %s", addr, what,
                                phase_name[h->phase], pl_comm_strerror(rc),
                                rc == PL_COMM_ETIMEOUT ? "the handshake's deadline passed"
                                : rc == PL_COMM_ECLOSED ? "peer closed the connection"
                                                        : strerror(sys));
        }
        if (h->phase == PH_HELLO && h->got >= 8 && memcmp(h->in, HELLO_MAGIC, 8) != 0)
            return pl_comm_errf(err, errlen, PL_COMM_EPROTO,
                                "handshake with %s: not a pliant peer (bad hello)", addr);
        if (h->sent < h->len || h->got < h->len) return 0;
        if ((rc = advance(h, addr, err, errlen)) != 0) return rc;
    }
}
