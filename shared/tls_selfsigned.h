/* TLS helpers for the control channel (docs/protocol.md "Registration and the token"):
 * a self-signed certificate + key generated at start (OpenSSL, EC P-256) into a
 * private temporary directory when the coordinator is given none, the
 * certificate's SHA-256 fingerprint, and the token proof a worker answers the
 * coordinator's challenge with. No global state. */
#ifndef PLIANT_TLS_SELFSIGNED_H
#define PLIANT_TLS_SELFSIGNED_H

#include <stddef.h>

#define PL_TLS_PATH_MAX 512

typedef struct {
    char dir[PL_TLS_PATH_MAX];       /* private directory (mode 0700) holding both files */
    char cert_path[PL_TLS_PATH_MAX]; /* PEM certificate (0644) */
    char key_path[PL_TLS_PATH_MAX];  /* PEM private key (0600) */
    char fingerprint[65];            /* lowercase hex SHA-256 of the certificate's DER */
} pl_tls_selfsigned;

/* Generates a key and a self-signed certificate valid for `days` days (≤ 0: 365)
 * with subjectAltName localhost, 127.0.0.1, ::1 and, when non-NULL and
 * non-empty, `host` (a DNS name or an IP literal). Writes them into a fresh
 * directory made with mkdtemp under tmpdir (NULL: $TMPDIR or /tmp). Returns 0,
 * or -1 with a message in err (nothing left on disk). */
int pl_tls_selfsigned_create(pl_tls_selfsigned *out, const char *host, int days,
                             const char *tmpdir, char *err, size_t errlen);

/* Removes the two files and the directory; safe on a zeroed struct. */
void pl_tls_selfsigned_remove(pl_tls_selfsigned *t);

/* The lowercase hex SHA-256 of the first certificate in a PEM file. */
int pl_tls_cert_fingerprint(const char *cert_path, char out[65], char *err, size_t errlen);

/* token_proof = lowercase hex HMAC-SHA256(key = token bytes, message = the
 * nonce's hex text as received). out gets 64 digits and a NUL. 0 or -1. */
int pl_token_proof(const void *token, size_t token_len, const char *nonce_hex, char out[65]);

/* Fills out with 2*nbytes lowercase hex digits of fresh random bytes (RAND_bytes)
 * and a NUL (out holds 2*nbytes+1). 0 or -1. */
int pl_random_hex(char *out, size_t nbytes);

#endif
