/* The send queue of a WebSocket connection of the control channel (libwebsockets):
 * frames with the LWS_PRE headroom lws_write wants, written one per writable
 * callback, in order; and the buffer a message is received into, fragment by
 * fragment. Shared by the coordinator's server and the worker's client.
 * Not thread-safe: the connection's service thread only. */
#ifndef PLIANT_WS_QUEUE_H
#define PLIANT_WS_QUEUE_H

#include <stddef.h>

#include <libwebsockets.h>

typedef struct pl_ws_frame {
    struct pl_ws_frame *next;
    size_t len;
    int wflags;          /* lws_write protocol flags */
    unsigned char buf[]; /* LWS_PRE bytes of headroom, then the message */
} pl_ws_frame;

typedef struct {
    pl_ws_frame *head, *tail;
    size_t bytes;        /* queued, not yet written */
} pl_ws_queue;

/* A frame holding a copy of text; NULL when out of memory. */
pl_ws_frame *pl_ws_frame_new(const char *text, size_t len, int wflags);
/* Appends f (taken). */
void pl_ws_queue_push(pl_ws_queue *q, pl_ws_frame *f);
/* Takes the oldest frame off (the caller frees it); NULL when empty. */
pl_ws_frame *pl_ws_queue_pop(pl_ws_queue *q);
/* A writable callback's share of the queue: writes the oldest frame, then asks for
 * another callback while frames remain or, closing, for the one that sends the close
 * frame once the queue drained. Returns 1 written, 0 nothing queued, -1 a short write
 * (the connection is broken). */
int pl_ws_queue_service(pl_ws_queue *q, struct lws *wsi, int closing);
void pl_ws_queue_clear(pl_ws_queue *q);

/* Appends a received fragment (n bytes at in) to the message in *buf, *len of
 * *cap bytes used; the buffer grows by doubling, never past max. 0, 1 when the
 * message would exceed max bytes, -1 when out of memory (nothing appended). */
int pl_ws_rx_append(char **buf, size_t *len, size_t *cap, const void *in, size_t n, size_t max);

#endif
