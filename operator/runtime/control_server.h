/* The coordinator's side of the control channel (docs/protocol.md "Transport",
 * "Registration and the token", "Liveness"): a libwebsockets server over TLS on
 * HOST:PORT, path /control, subprotocol pliant.v1, one JSON message per text
 * frame (fragmented frames are reassembled; more than PL_PROTO_MAX_BYTES closes
 * the connection unparsed).
 *
 * Single-threaded: every function, and every callback, runs on the thread that
 * calls pl_ctl_server_service (the coordinator's loop). On a new connection the
 * server sends `challenge {nonce}` (32 fresh random bytes); the first message
 * must be `register` with token_proof = hex HMAC-SHA256(token, nonce text),
 * compared in constant time. A bad proof → `refuse` and close; anything but
 * `register` before it, a second `register`, a message that fails
 * pl_msg_decode, or no `register` within PL_PROTO_REGISTER_TIMEOUT_MS → close
 * (after `refuse` while unregistered). Only that connection is affected.
 * `welcome` (or `refuse`) after a good proof is the coordinator's to send. */
#ifndef PLIANT_CONTROL_SERVER_H
#define PLIANT_CONTROL_SERVER_H

#include "protocol.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pl_ctl_server pl_ctl_server;
typedef struct pl_ctl_conn pl_ctl_conn; /* valid from on_register until on_close returns */

typedef struct {
    /* A worker's register passed the token check (m->type == PL_MSG_REGISTER). */
    void (*on_register)(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m, void *user);
    /* Any later valid message from a registered worker. */
    void (*on_message)(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m, void *user);
    /* A registered connection closed (peer, error, pl_ctl_server_close, destroy).
     * c is freed after this returns. */
    void (*on_close)(pl_ctl_server *s, pl_ctl_conn *c, const char *reason, void *user);
    void *user;
} pl_ctl_server_callbacks;

typedef struct {
    const char *host;        /* bind address; NULL: "127.0.0.1" */
    int port;                /* 0: ephemeral (see pl_ctl_server_port) */
    const char *cert_path;   /* PEM certificate and key; both NULL: a self-signed pair */
    const char *key_path;    /*   is generated into a private temp dir, removed on destroy */
    const char *cert_host;   /* extra subjectAltName of a generated certificate, or NULL */
    const void *token;       /* job token bytes; NULL: no authentication (local, insecure) */
    size_t token_len;
    pl_ctl_server_callbacks cb;
} pl_ctl_server_config;

/* Creates the server and starts listening. NULL and err on failure. */
pl_ctl_server *pl_ctl_server_create(const pl_ctl_server_config *cfg, char *err, size_t errlen);
/* Closes every connection (on_close for registered ones), frees everything and
 * removes a generated certificate. NULL is fine. */
void pl_ctl_server_destroy(pl_ctl_server *s);

/* 1 when a socket of this network namespace already listens on host:port (numeric host;
 * another process, e.g. an operator leader still exiting), else 0 (free, or unknown). */
int pl_ctl_port_in_use(const char *host, int port);

/* Serves network events for up to timeout_ms (0: do not wait), then closes
 * connections that did not register in time. Returns 0, -1 on a fatal error. */
int pl_ctl_server_service(pl_ctl_server *s, int timeout_ms);

/* The bound port. */
int pl_ctl_server_port(const pl_ctl_server *s);
/* The certificate in use (given or generated) and its SHA-256 fingerprint
 * (lowercase hex): what workers are told to trust. */
const char *pl_ctl_server_cert_path(const pl_ctl_server *s);
const char *pl_ctl_server_fingerprint(const pl_ctl_server *s);
/* Open connections, registered or not. */
int pl_ctl_server_nconns(const pl_ctl_server *s);
/* 1 when the server checks token proofs (a token was configured). */
int pl_ctl_server_authenticates(const pl_ctl_server *s);

/* Queues m (encoded now) on c; written when the socket is writable, in order.
 * 0, or -1 (bad message, closing connection, out of memory). */
int pl_ctl_server_send(pl_ctl_server *s, pl_ctl_conn *c, const pl_msg *m);
/* Refuses a registration the coordinator does not accept: `refuse {reason}`
 * (envelope gen), then closes c. */
void pl_ctl_server_refuse(pl_ctl_server *s, pl_ctl_conn *c, int64_t gen, const char *reason);
/* Closes c after its queued messages are written; on_close follows. reason
 * (may be NULL) is logged and given to on_close. */
void pl_ctl_server_close(pl_ctl_server *s, pl_ctl_conn *c, const char *reason);

/* Per-connection facts. */
uint64_t pl_ctl_conn_id(const pl_ctl_conn *c);          /* unique per server, from 1 */
const char *pl_ctl_conn_name(const pl_ctl_conn *c);     /* the registered worker name */
int64_t pl_ctl_conn_last_heard_ms(const pl_ctl_conn *c); /* pl_now_ms() of the last message */
void pl_ctl_conn_set_user(pl_ctl_conn *c, void *user);
void *pl_ctl_conn_user(const pl_ctl_conn *c);

/* CLOCK_MONOTONIC in milliseconds: the clock of last_heard. */

#endif
