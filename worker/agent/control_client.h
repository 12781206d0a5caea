/* The worker's side of the control channel (docs/protocol.md): a libwebsockets
 * client over TLS to wss://HOST:PORT/control (subprotocol pliant.v1). It
 * answers the coordinator's `challenge` with `register` (token_proof = hex
 * HMAC-SHA256(token, nonce)), sends `heartbeat` every heartbeat interval once
 * welcomed, and hands every message from the coordinator (welcome and refuse
 * included) to on_message. An invalid message from the coordinator closes the
 * connection (a lost connection). No reconnection here: the caller destroys
 * and creates again.
 *
 * Single-threaded: call every function from the worker's control thread, the
 * one that calls pl_ctl_client_service, except pl_ctl_client_post and
 * pl_ctl_client_set_step / _set_gen, which any thread may call (the compute
 * thread's report, reduced, committed...). */
#ifndef PLIANT_CONTROL_CLIENT_H
#define PLIANT_CONTROL_CLIENT_H

#include "protocol.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pl_ctl_client pl_ctl_client;

typedef enum {
    PL_CTL_CONNECTING = 0, /* TCP + TLS + WebSocket handshake */
    PL_CTL_CHALLENGED,     /* register sent, waiting for welcome */
    PL_CTL_WELCOMED,       /* registered: heartbeats flowing */
    PL_CTL_REFUSED,        /* the coordinator sent refuse (do not retry) */
    PL_CTL_CLOSED          /* connection failed or lost */
} pl_ctl_client_state;

typedef struct {
    const char *host;          /* coordinator address (DNS name or IP) */
    int port;
    const char *ca_path;       /* PEM certificate(s) to trust: the coordinator's (self-signed)
                                * certificate or its CA. NULL only with insecure. */
    const char *fingerprint;   /* optional: lowercase hex SHA-256 the coordinator's certificate
                                * must have (checked against ca_path's first certificate) */
    int insecure;              /* 1: no certificate check at all (local testing only) */
    const void *token;         /* job token bytes (NULL, 0: empty token) */
    size_t token_len;
    pl_msg_register reg;       /* job, name, node, zone, gpus, pid; token_proof is computed */
    int heartbeat_ms;          /* 0: the welcome's heartbeat_ms */
    /* Every valid message from the coordinator, in order. */
    void (*on_message)(pl_ctl_client *c, const pl_msg *m, void *user);
    /* The connection ended (state CLOSED or REFUSED); reason for logs. */
    void (*on_close)(pl_ctl_client *c, const char *reason, void *user);
    void *user;
} pl_ctl_client_config;

/* Creates the client and starts connecting. NULL and err on failure. */
pl_ctl_client *pl_ctl_client_create(const pl_ctl_client_config *cfg, char *err, size_t errlen);
/* Closes the connection (no on_close) and frees everything. NULL is fine.
 * Other threads must have stopped calling pl_ctl_client_post. */
void pl_ctl_client_destroy(pl_ctl_client *c);

/* Serves network events for up to timeout_ms (0: do not wait; shorter when a
 * heartbeat is due) and queues heartbeats when due. 0, or -1 once the
 * connection is closed or refused. */
int pl_ctl_client_service(pl_ctl_client *c, int timeout_ms);

pl_ctl_client_state pl_ctl_client_get_state(const pl_ctl_client *c);
/* The rank and heartbeat interval from welcome (-1, 0 before). */
int pl_ctl_client_rank(const pl_ctl_client *c);
int pl_ctl_client_heartbeat_ms(const pl_ctl_client *c);
/* The last close reason ("" while open). */
const char *pl_ctl_client_close_reason(const pl_ctl_client *c);

/* The step heartbeats carry and the envelope gen of heartbeats (atomics). */
void pl_ctl_client_set_step(pl_ctl_client *c, int64_t step);
void pl_ctl_client_set_gen(pl_ctl_client *c, int64_t gen);

/* Queues m (encoded now); written in order. 0, or -1 (bad message, closed). */
int pl_ctl_client_send(pl_ctl_client *c, const pl_msg *m);
/* Thread-safe send: encodes m now and wakes the control thread, which queues
 * it (in posting order) during pl_ctl_client_service. 0, or -1 (bad message,
 * out of memory); a message posted after the connection closed is dropped. */
int pl_ctl_client_post(pl_ctl_client *c, const pl_msg *m);
/* Queues raw bytes as one text frame, unchecked: for tests and diagnostics. */
int pl_ctl_client_send_raw(pl_ctl_client *c, const char *text, size_t len);
/* The same, split into nfrags WebSocket fragments (1 ≤ nfrags ≤ len): tests. */
int pl_ctl_client_send_fragmented(pl_ctl_client *c, const char *text, size_t len, int nfrags);
/* Closes after the queue drains (e.g. after `leaving`). */
void pl_ctl_client_close(pl_ctl_client *c);

#endif
