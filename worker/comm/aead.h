/* The protection of one direction of a peer connection after its handshake (internal
 * to worker/comm; docs/runtime.md "Peer connections"): an AEAD keyed from the handshake
 * (AES-256-GCM, or ChaCha20-Poly1305 where the CPU lacks AES instructions) with a
 * per-direction counter nonce. Every frame is authenticated: its 32-byte header is
 * associated data, its payload too (integrity: GMAC or Poly1305 over the plaintext) or
 * encrypted (encrypt), and a 16-byte tag follows the payload. The nonce is the count of
 * frames sealed (or opened) before in that direction, never sent: a frame replayed,
 * dropped or reordered fails its tag like one altered.
 *
 * A frame goes begin, update (any number of pieces, in order), then seal_final (the
 * sender) or open_final (the receiver). Threads: one pl_aead is used by one thread at a
 * time (the connection's owner). Ownership: pl_aead_init allocates its cipher context,
 * pl_aead_free releases it and wipes the key. */
#ifndef PLIANT_COMM_AEAD_H
#define PLIANT_COMM_AEAD_H

#include <stddef.h>
#include <stdint.h>

#define PL_AEAD_KEY_BYTES 32
#define PL_AEAD_TAG_BYTES 16
#define PL_AEAD_AAD_BYTES 32 /* the frame header */

typedef struct {
    void *ctx;        /* EVP_CIPHER_CTX */
    uint64_t counter; /* frames begun so far in this direction */
    int encrypt;      /* 1: the payload is encrypted, 0: authenticated only */
    int sealing;      /* 1: the sender's side, 0: the receiver's */
} pl_aead;

/* cipher: PL_CIPHER_AES_256_GCM or PL_CIPHER_CHACHA20_POLY1305 (tcp.h); sealing: 1 for the
 * sending direction. 0, or −1 when OpenSSL refuses. */
int pl_aead_init(pl_aead *a, int cipher, int encrypt, int sealing,
                 const unsigned char key[PL_AEAD_KEY_BYTES]);
void pl_aead_free(pl_aead *a);

/* Starts the next frame with its header as associated data. 0 or −1. */
int pl_aead_begin(pl_aead *a, const unsigned char hdr[PL_AEAD_AAD_BYTES]);
/* The next len payload bytes: authenticated only (out unused, may be NULL), or encrypted
 * or decrypted from in to out (out may equal in). 0 or −1. */
int pl_aead_update(pl_aead *a, const void *in, void *out, size_t len);
/* The sender's tag of the frame. 0 or −1. */
int pl_aead_seal_final(pl_aead *a, unsigned char tag[PL_AEAD_TAG_BYTES]);
/* 0 when tag is the frame's, −1 when it is not (or OpenSSL failed). */
int pl_aead_open_final(pl_aead *a, const unsigned char tag[PL_AEAD_TAG_BYTES]);

/* A whole frame at once: begin, the payload (in → out when encrypting), the tag. */
int pl_aead_seal(pl_aead *a, const unsigned char hdr[PL_AEAD_AAD_BYTES], const void *in,
                 void *out, size_t len, unsigned char tag[PL_AEAD_TAG_BYTES]);

/* Authentication-only sending, as the bytes go out (the transports that write frames
 * piece by piece): the frame's header and payload (len bytes) are written in order and
 * `before` / `after` count how many of them were written before and after a write; the
 * payload bytes that went out in it are authenticated, and once the payload is complete
 * the tag is made. After pl_aead_begin, after each write until it returns 1 (the tag is
 * ready); 0: not yet, −1: OpenSSL failed. */
int pl_aead_seal_written(pl_aead *a, const unsigned char *payload, size_t len, size_t before,
                         size_t after, unsigned char tag[PL_AEAD_TAG_BYTES]);

/* 1 when this CPU has AES and carry-less multiply instructions (AES-GCM runs fast). */
int pl_aead_cpu_has_aes(void);

#endif
