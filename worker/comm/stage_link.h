/* The TCP link of one pipeline stage (the pl_stage_link of worker/engine/stage.h):
 * activations and gradients exchanged with stage k − 1 and k + 1 over the
 * authenticated connections of worker/comm/tcp.h, and optionally a third connection
 * that closes the pipeline into a ring (the first and the last stage of ≥ 3 stages:
 * the redundant layers' messages, worker/engine/shadow.h; Bamboo §5.1).
 *
 * Threads: one I/O thread per connection drives its socket in both directions
 * at once (non-blocking, poll), so a send never waits for the peer's recv
 * (pl_stage_link's contract: rendezvous sends deadlock 1F1B) and two stages
 * pushing messages larger than the socket buffers at each other cannot block
 * each other. The link is the only user of its connections (tcp.h: a
 * connection is not thread-safe): give it connections of their own.
 *
 * Wire format: a message (kind, mb) of n floats is one or more frames of type
 * PL_LINK_FRAME with tag = kind, aux = mb, the connection's generation, payloads
 * of at most PL_LINK_CHUNK_BYTES (and the connection's maximum frame size),
 * flags = PL_LINK_FLAG_LAST on the final frame (an empty message is one empty
 * frame). Frames of another generation are refused (stale), as is anything
 * malformed (protocol error).
 *
 * send copies the buffer into the connection's queue and returns. Messages
 * may arrive before they are asked for (the next stage's gradient 0 behind
 * activation 1, ...): complete messages wait in a per-connection stash keyed by
 * (kind, mb). The stash holds at most max_pending messages per connection
 * (see pl_tcp_link_pending_limits: the 1F1B bound); while it is full the
 * connection is not read (TCP back-pressure), and a recv for a message that is
 * not in a full stash fails at once instead of waiting forever.
 *
 * Errors: any transport error (peer closed, reset, protocol, stale frame, a
 * send queue that makes no progress for timeout_ms) breaks that connection for
 * good: the pl_conn is marked broken, and every later send to / recv from that
 * peer returns −1 with the transport's text. recv waits at most timeout_ms
 * without a byte arriving on that connection (an idle timeout: a big message
 * still moving never times out) and returns −1 "timeout"; a timeout does not
 * break the connection. pl_tcp_link_abort wakes every blocked recv, and every
 * later send/recv returns −1 "aborted": the runtime then destroys the link
 * (messages of the aborted step may still be queued or stashed). */
#ifndef PLIANT_STAGE_LINK_H
#define PLIANT_STAGE_LINK_H

#include <stddef.h>

#include "schedule.h"
#include "stage.h"
#include "tcp.h"

#define PL_LINK_FRAME (PL_FRAME_USER + 16)
#define PL_LINK_FLAG_LAST 1u
#define PL_LINK_CHUNK_BYTES PL_COMM_TENSOR_CHUNK_BYTES

typedef struct pl_tcp_link pl_tcp_link;

typedef struct {
    int stage;            /* this stage's index k: peers are k − 1 (prev), k + 1 (next) and
                             wrap_stage (wrap) */
    pl_conn *prev, *next; /* connections to stage k − 1 / k + 1, or NULL (first / last stage);
                             the link owns them from create on (also when create fails) and
                             closes them in destroy */
    int timeout_ms;       /* > 0: recv's idle timeout, and the longest a queued send may go
                             without a byte written */
    int max_pending_prev; /* ≥ 1: complete messages stashed from prev (and from next) */
    int max_pending_next;
    pl_conn *wrap;        /* or NULL: a connection to stage wrap_stage, not a neighbour (the
                             ring's other end); owned like prev and next */
    int wrap_stage;
    int max_pending_wrap; /* ≥ 1 with wrap */
} pl_tcp_link_config;

/* The stash bounds a 1F1B schedule needs: from prev at most min(S − k + 1, Nb)
 * activations are ever sent and not yet asked for, from next at most
 * min(S − k, Nb) gradients (= s->nslots). */
void pl_tcp_link_pending_limits(const pl_schedule *s, int *from_prev, int *from_next);

/* Starts the I/O threads. 0, or −1 with err (bad config, a connection already
 * broken, out of memory, thread creation); on failure the connections are
 * closed. */
int pl_tcp_link_create(const pl_tcp_link_config *cfg, pl_tcp_link **out, char *err,
                       size_t errlen);

/* The callbacks for pl_stage_step (ctx = the link). */
pl_stage_link pl_tcp_link_stage(pl_tcp_link *l);

/* pl_stage_link's send and recv: peer is a stage index (k − 1, k + 1 or wrap_stage); n
 * floats. 0, or −1 with err. recv's n must be the sent message's size. */
int pl_tcp_link_send(pl_tcp_link *l, int peer, pl_link_kind kind, int mb, const float *buf,
                     size_t n, char *err, size_t errlen);
int pl_tcp_link_recv(pl_tcp_link *l, int peer, pl_link_kind kind, int mb, float *buf,
                     size_t n, char *err, size_t errlen);
/* pl_stage_link's ready: 1 when that message has arrived (a recv returns at once),
 * 0 when not, or no connection to peer. Thread-safe. */
int pl_tcp_link_ready(pl_tcp_link *l, int peer, pl_link_kind kind, int mb);

/* Waits until every queued message has been handed to the kernel (not
 * necessarily read by the peer). 0, or −1 with err (broken connection, abort,
 * timeout_ms passed; timeout_ms < 0 waits forever). */
int pl_tcp_link_flush(pl_tcp_link *l, int timeout_ms, char *err, size_t errlen);

/* 0 while the connection to stage `peer` is sound, else the PL_COMM_* code that
 * broke it (its message in err). For the runtime's peer_broken report. */
int pl_tcp_link_status(pl_tcp_link *l, int peer, char *err, size_t errlen);

/* Makes blocked and later sends/recvs fail with "aborted: reason". Thread-safe;
 * idempotent (the first reason stays). */
void pl_tcp_link_abort(pl_tcp_link *l, const char *reason);

/* Stops and joins the I/O threads, frees queued and stashed messages, closes the
 * connections. No send/recv may be running. NULL is a no-op. */
void pl_tcp_link_destroy(pl_tcp_link *l);

#endif
