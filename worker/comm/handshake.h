/* The handshake of a peer connection (tcp.h "Authentication") as a non-blocking state
 * machine, internal to worker/comm: three exchanges, each side sending before it reads
 * (HELLO, PROOF, VERDICT; but the dialer's verdict after the listener's), then the frame
 * keys of both directions. pl_handshake_step moves
 * what the socket takes now and never waits, so one thread can run many handshakes under
 * one poll (mesh.c accepts concurrently); tcp.c's blocking calls wait between steps.
 *
 * Deadlines are total: the handshake fails at its deadline whatever has trickled in.
 *
 * Threads: a handshake is used by one thread at a time. Ownership: the handshake borrows
 * the token (it must outlive it) and copies the rest of the identity; pl_handshake_free
 * wipes the proofs and keys. */
#ifndef PLIANT_COMM_HANDSHAKE_H
#define PLIANT_COMM_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "aead.h"
#include "tcp.h"

typedef struct pl_handshake pl_handshake;

/* What a finished handshake agreed on. */
typedef struct {
    int32_t peer_rank;
    pl_conn_purpose purpose; /* the dialer's */
    char peer_name[PL_COMM_NAME_MAX + 1];
    pl_frame_protection protection; /* the stronger of the two sides' */
    pl_frame_cipher cipher;         /* AES-256-GCM when both run it fast, else ChaCha20-Poly1305 */
    unsigned char key_tx[PL_AEAD_KEY_BYTES], key_rx[PL_AEAD_KEY_BYTES];
} pl_handshake_result;

/* PL_COMM_EINVAL with err when self cannot take part as a dialer (dialer = 1: a purpose
 * named, a rank or a layer copy's PL_COMM_NO_RANK) or a listener. */
int pl_handshake_check_ident(const pl_comm_ident *self, int dialer, char *err, size_t errlen);

/* A handshake for self (checked) as the dialer or the listener that ends at deadline
 * (pl_now_ms's clock; < 0: never); expect_rank ≥ 0 (a dialer's) refuses a peer of another
 * rank. NULL with err when RAND_bytes or memory fail. */
pl_handshake *pl_handshake_new(const pl_comm_ident *self, int dialer, int32_t expect_rank,
                               int64_t deadline, char *err, size_t errlen);
void pl_handshake_free(pl_handshake *h);

/* Moves the handshake on over fd (non-blocking); addr names the peer in messages. 1: done
 * (pl_handshake_result), 0: waiting for the socket (pl_handshake_events), or a negative
 * PL_COMM_* code with err: refused (EAUTH, ESTALE, EPROTO), the peer gone (ECLOSED),
 * the deadline passed (ETIMEOUT), a system error. */
int pl_handshake_step(pl_handshake *h, int fd, const char *addr, char *err, size_t errlen);
/* The poll events the handshake waits for. */
short pl_handshake_events(const pl_handshake *h);
int64_t pl_handshake_deadline(const pl_handshake *h);
/* After step returned 1. */
const pl_handshake_result *pl_handshake_result_of(const pl_handshake *h);

#endif
