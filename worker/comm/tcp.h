/* Worker-to-worker transport over plain TCP (no TLS): connections authenticated by
 * the job token, length-prefixed frames protected by an AEAD keyed from the handshake,
 * float tensors.
 *
 * Authentication (docs/runtime.md "Peer connections"): after TCP connect both sides
 * send a HELLO (rank, name, plan generation, purpose, frame protection, cipher, a fresh
 * 32-byte nonce from RAND_bytes), then a PROOF = HMAC-SHA256(token, direction label ||
 * own name || own rank || generation || own purpose || own protection || own cipher ||
 * own nonce || peer nonce), then a one-byte VERDICT on the peer's proof (the dialer's
 * once the listener's came: a connection complete on the listener's side is one its
 * dialer holds, handshake.c). Proofs are
 * checked with CRYPTO_memcmp. The direction labels differ for the dialing and the
 * accepting side, so a proof cannot be reflected back. A wrong token (another job), a
 * different plan generation (a stale plan), a purpose the other side does not take or an
 * unexpected rank makes both sides close the connection and return PL_COMM_EAUTH /
 * PL_COMM_ESTALE / PL_COMM_EPROTO with a message that says which; the listener stays
 * usable. The handshake's deadline is TOTAL, from the connection's start: a peer that
 * trickles bytes gains nothing.
 *
 * Purpose: every connection is for one thing (pl_conn_purpose), named by the dialer in
 * its hello and covered by its proof. The accepting side states what it takes (one
 * purpose, or PL_CONN_ANY) in its own hello; each side refuses a mismatch, naming both
 * purposes. The rank is then the plan rank whatever the purpose.
 *
 * Frame protection (pl_frame_protection): each side states the protection it wants and
 * the cipher it runs fast; the connection uses the stronger protection of the two, and
 * AES-256-GCM when both have AES instructions, else ChaCha20-Poly1305. Both are covered
 * by the proofs, so an on-path attacker cannot lower them. With INTEGRITY or ENCRYPT each
 * direction has its own key, HKDF-SHA256(token; salt: both nonces; info: the direction,
 * the protection, the cipher and both proofs), and every frame carries a 16-byte tag
 * over its header and payload (ENCRYPT: the payload is encrypted too) under a nonce that
 * counts the frames of that direction (aead.h). A frame whose tag fails (altered,
 * replayed, reordered, dropped) ends the connection with PL_COMM_EAUTH naming the peer.
 *
 * Frames: a 32-byte little-endian header (magic, type, tag, aux, generation, length)
 * then `length` payload bytes, then the tag when protected; length ≤ the connection's
 * maximum frame size. Sockets are non-blocking; every blocking call takes timeout_ms and
 * waits with poll(), so a dead peer never blocks a caller forever. For data transfers
 * timeout_ms is an IDLE timeout (the longest wait without any byte moving), so large
 * transfers on slow links do not need a guessed total; connect, accept and the handshake
 * use it as a total deadline. timeout_ms < 0 waits forever (not recommended). Sends use
 * MSG_NOSIGNAL.
 *
 * The maximum frame size (pl_conn_set_max_frame) bounds caller frames; tensor chunks
 * and all-reduce chunks have fixed protocol sizes (PL_COMM_TENSOR_CHUNK_BYTES,
 * PL_ALLREDUCE_CHUNK_FLOATS) so both ends always agree on them.
 *
 * A connection is not thread-safe: one thread (or one collective) uses it at a time.
 * Ownership: a connection returned belongs to the caller (pl_conn_close); it borrows
 * nothing once its handshake is done (a handshake in progress borrows the token).
 *
 * Errors are negative codes (below) plus a message in err. Any error other than a
 * timeout before the first byte of a received frame leaves the byte stream out of
 * step, so the connection is marked broken and every later call on it returns the
 * same code at once ("broken transport": the worker reports it to the coordinator
 * and the connection is rebuilt by the next plan). */
#ifndef PLIANT_COMM_TCP_H
#define PLIANT_COMM_TCP_H

#include <stddef.h>
#include <stdint.h>

enum {
    PL_COMM_OK = 0,
    PL_COMM_ETIMEOUT = -2, /* the peer made no progress within the timeout */
    PL_COMM_ECLOSED = -3,  /* the peer closed or reset the connection */
    PL_COMM_EPROTO = -4,   /* malformed or unexpected data (bad header, tag, size, rank) */
    PL_COMM_EAUTH = -5,    /* handshake: job token mismatch (either side) */
    PL_COMM_ESTALE = -6,   /* handshake or frame: plan generation differs */
    PL_COMM_ESYS = -7,     /* a system call failed (socket, bind, resolve, memory) */
    PL_COMM_EINVAL = -8,   /* bad arguments from the caller */
    PL_COMM_ECANCELED = -9,/* a wait given up on its caller's request (mesh.h: a newer plan) */
};

/* A short name for a code ("timeout", "closed", ...). */
const char *pl_comm_strerror(int code);

#define PL_COMM_NAME_MAX 64                         /* bytes of a peer name, without NUL */
#define PL_COMM_TOKEN_MIN 1                         /* the job token may be any bytes */
#define PL_COMM_MAX_FRAME_DEFAULT (64u << 20)       /* default per-connection frame cap */
#define PL_COMM_TENSOR_CHUNK_BYTES (4u << 20)       /* frame size of streamed tensors */

/* What a connection is for: the handshake carries it (see above). */
typedef enum {
    PL_CONN_ANY = 0,        /* accepting only: take a connection of any purpose */
    PL_CONN_RING,           /* an all-reduce ring neighbour (allreduce.h) */
    PL_CONN_STAGE_LINK,     /* a pipeline stage neighbour (stage_link.h) */
    PL_CONN_LAYER_COPY,     /* a layer copy: the source dials the destination */
    PL_CONN_PURPOSE_COUNT
} pl_conn_purpose;

/* "any", "ring", "stage link", "layer copy"; "?" otherwise. */
const char *pl_conn_purpose_name(int purpose);

/* The rank of a worker that has none in the plan (an idle worker): it only dials
 * layer copies. */
#define PL_COMM_NO_RANK (-1)

/* How the frames of a connection are protected after its handshake (see above). */
typedef enum {
    PL_PROTECT_DEFAULT = 0, /* PL_PROTECT_DEFAULT_MODE */
    PL_PROTECT_NONE,        /* plain frames: the handshake alone is authenticated */
    PL_PROTECT_INTEGRITY,   /* a tag over header and plaintext payload (GMAC / Poly1305) */
    PL_PROTECT_ENCRYPT,     /* the payload encrypted too */
} pl_frame_protection;

/* What PL_PROTECT_DEFAULT means (bench/README.md "Worker transport": what each costs). */
#define PL_PROTECT_DEFAULT_MODE PL_PROTECT_INTEGRITY

/* "none", "integrity", "encrypt" ("default" for PL_PROTECT_DEFAULT); "?" otherwise. */
const char *pl_frame_protection_name(int protection);
/* Parses "none", "integrity" or "encrypt" (PL_PROTECT_DEFAULT for NULL or ""). 0, or
 * PL_COMM_EINVAL with err. */
int pl_frame_protection_parse(const char *s, pl_frame_protection *out, char *err,
                              size_t errlen);

/* The AEAD of protected frames. */
typedef enum {
    PL_CIPHER_AUTO = 0,              /* AES-256-GCM where the CPU has AES instructions */
    PL_CIPHER_AES_256_GCM,
    PL_CIPHER_CHACHA20_POLY1305,
} pl_frame_cipher;

/* "AES-256-GCM", "ChaCha20-Poly1305"; "?" otherwise. */
const char *pl_frame_cipher_name(int cipher);

/* Who this process is, for the handshake. token: the job token (raw bytes);
 * name: printable, at most PL_COMM_NAME_MAX bytes; rank: its plan rank (≥ 0, or
 * PL_COMM_NO_RANK for a layer copy's dialer); generation: the plan generation the
 * connection belongs to; purpose: for pl_conn_connect the connection's purpose (not
 * PL_CONN_ANY), for pl_listener_accept the purpose accepted (PL_CONN_ANY: any);
 * protection and cipher: what this side asks for (0: the defaults). */
typedef struct {
    const void *token;
    size_t token_len;
    int32_t rank;
    const char *name;
    uint64_t generation;
    pl_conn_purpose purpose;
    pl_frame_protection protection;
    pl_frame_cipher cipher;
} pl_comm_ident;

typedef struct pl_listener pl_listener;
typedef struct pl_conn pl_conn;

/* Listens on bind_addr (NULL or "" = all IPv4 interfaces; a numeric address or host
 * name) and port (0 = an ephemeral port; pl_listener_port says which). */
int pl_listener_open(const char *bind_addr, int port, pl_listener **out, char *err,
                     size_t errlen);
int pl_listener_port(const pl_listener *l);
int pl_listener_fd(const pl_listener *l);
void pl_listener_close(pl_listener *l);

/* Accepts one connection and runs the handshake, all within timeout_ms. On a failed
 * handshake the new connection is closed, the listener is untouched, and the code
 * says why (EAUTH, ESTALE, EPROTO, ECLOSED, ETIMEOUT). pl_conn_purpose says what the
 * accepted connection is for. */
int pl_listener_accept(pl_listener *l, const pl_comm_ident *self, int timeout_ms,
                       pl_conn **out, char *err, size_t errlen);

/* ---- accepting several connections at once (mesh.c) ---- */

/* Takes one connection waiting on the listener, without blocking, and starts its
 * handshake (sends this side's hello) with a total deadline of handshake_ms from now.
 * 0 with *out NULL when none waits; 0 with *out, a connection whose handshake runs
 * (pl_conn_handshake_step); else ESYS / EINVAL. self (its token) must outlive the
 * handshake. */
int pl_listener_accept_begin(pl_listener *l, const pl_comm_ident *self, int handshake_ms,
                             pl_conn **out, char *err, size_t errlen);
/* Moves a handshake on without blocking: 1 done (c is a connection like
 * pl_listener_accept's), 0 waiting (poll pl_conn_fd for pl_conn_handshake_events), or a
 * negative code with err (refused, closed, its deadline passed: close c). */
int pl_conn_handshake_step(pl_conn *c, char *err, size_t errlen);
short pl_conn_handshake_events(const pl_conn *c);
/* When c's handshake fails for its deadline (pl_now_ms's clock). */
int64_t pl_conn_handshake_deadline(const pl_conn *c);

/* Peers that go silent: connections made from now on have the kernel probe an idle
 * peer (TCP keepalive) and give up on it after about ms without an answer, so that a
 * peer cut off by the network fails its connections like one that died (PL_COMM_ECLOSED)
 * while a peer busy computing, whose kernel answers, never does. ms ≤ 0: the system's
 * defaults (hours). Process-wide; the worker sets the job's heartbeat × misses. */
void pl_conn_set_silence_ms(int ms);

/* Connects to host:port, retrying refused/unreachable attempts with backoff until
 * timeout_ms has passed, then runs the handshake. expect_rank ≥ 0 refuses a peer
 * with another rank (EPROTO); −1 accepts any. */
int pl_conn_connect(const char *host, int port, const pl_comm_ident *self,
                    int32_t expect_rank, int timeout_ms, pl_conn **out, char *err,
                    size_t errlen);

void pl_conn_close(pl_conn *c);
/* Wakes a thread blocked on c: its send/recv fail as on a closed connection, and
 * so do later ones. Thread-safe (the one call that is); the owner still closes c. */
void pl_conn_shutdown(pl_conn *c);
int32_t pl_conn_peer_rank(const pl_conn *c);
/* The purpose the dialer named (never PL_CONN_ANY). */
pl_conn_purpose pl_conn_purpose_of(const pl_conn *c);
const char *pl_conn_peer_name(const pl_conn *c);
/* "HOST:PORT" of the peer, known from the start (also while its handshake runs). */
const char *pl_conn_peer_addr(const pl_conn *c);
/* The protection and cipher the handshake agreed on (never PL_PROTECT_DEFAULT). */
pl_frame_protection pl_conn_protection(const pl_conn *c);
pl_frame_cipher pl_conn_cipher(const pl_conn *c);
uint64_t pl_conn_generation(const pl_conn *c);
int pl_conn_fd(const pl_conn *c);
/* 0, or the code that broke the connection. */
int pl_conn_status(const pl_conn *c);
/* Marks the connection broken with code (used by collectives driving the fd). */
void pl_conn_mark_broken(pl_conn *c, int code);
void pl_conn_set_max_frame(pl_conn *c, uint64_t max_bytes);
uint64_t pl_conn_max_frame(const pl_conn *c);

/* ---- frames ---- */

#define PL_FRAME_HDR_BYTES 32
#define PL_FRAME_TAG_BYTES 16 /* after the payload of a protected frame */
/* Frame types below 256 are reserved for this library. */
enum {
    PL_FRAME_TENSOR = 1,    /* a chunk of a streamed float tensor; aux = chunk index */
    PL_FRAME_ALLREDUCE = 2, /* a chunk of a ring all-reduce; aux = step */
    PL_FRAME_USER = 256,    /* first type free for callers */
};

typedef struct {
    uint16_t type;
    uint16_t flags;
    uint32_t tag;
    uint32_t aux;
    uint64_t generation;
    uint64_t len;
} pl_frame_hdr;

void pl_frame_encode(const pl_frame_hdr *h, unsigned char out[PL_FRAME_HDR_BYTES]);
/* 0, or EPROTO when the magic is wrong. */
int pl_frame_decode(const unsigned char in[PL_FRAME_HDR_BYTES], pl_frame_hdr *h);

/* Sends one frame (the connection's generation is filled in). */
int pl_conn_send_frame(pl_conn *c, uint16_t type, uint32_t tag, uint32_t aux,
                       const void *data, size_t len, int timeout_ms, char *err,
                       size_t errlen);
/* Receives one frame into buf (cap bytes). A frame longer than cap or than the
 * maximum frame size, or from another generation, is a protocol error (ESTALE for
 * the generation). A timeout before any byte of the frame arrived leaves the
 * connection usable. */
int pl_conn_recv_frame(pl_conn *c, pl_frame_hdr *hdr, void *buf, size_t cap,
                       int timeout_ms, char *err, size_t errlen);
/* Same, allocating the payload (free() it; NULL for an empty frame). */
int pl_conn_recv_frame_alloc(pl_conn *c, pl_frame_hdr *hdr, void **data, int timeout_ms,
                             char *err, size_t errlen);

/* ---- tensors: n fp32 values in host order (little-endian hosts only) ---- */

/* Streams x as ceil(n·4 / PL_COMM_TENSOR_CHUNK_BYTES) frames (one empty frame when
 * n = 0), written straight from x. The receiver must ask for the same tag and n. */
int pl_conn_send_floats(pl_conn *c, uint32_t tag, const float *x, size_t n,
                        int timeout_ms, char *err, size_t errlen);
int pl_conn_recv_floats(pl_conn *c, uint32_t tag, float *x, size_t n, int timeout_ms,
                        char *err, size_t errlen);

#endif
