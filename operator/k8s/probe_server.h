/* The operator's small HTTP/1.1 endpoint, on a thread of its own:
 *   GET /metrics  200, Prometheus text from the metrics callback
 *   GET /healthz  200 "ok" while the process serves at all (liveness)
 *   GET /readyz   200 "ok" when the ready callback says so, else 503
 * HEAD is answered like GET without a body; other methods get 405, other
 * paths 404, a request head over 8 KiB 431, a malformed one 400. One request
 * per connection, answered with Connection: close. Up to 64 connections are
 * served at once, so an idle or slow client never delays a probe: a request
 * head must arrive whole within 1 s and an answer be taken within 2 s, and
 * when all 64 are taken the oldest one still sending its head is dropped.
 * Plain sockets and poll on the one thread, no TLS (the endpoints are for
 * kubelet probes and in-cluster scrapes). */
#ifndef PLIANT_PROBE_SERVER_H
#define PLIANT_PROBE_SERVER_H

#include <stddef.h>

typedef struct {
    const char *addr; /* "HOST:PORT", ":PORT" (all interfaces), "[::1]:PORT"; port 0 picks one */
    /* A heap string the server frees, or NULL (500). NULL callback: 404. */
    char *(*metrics)(void *user);
    /* Nonzero when ready. NULL callback: always ready. */
    int (*ready)(void *user);
    void *user; /* passed to both; the callbacks run on the server's thread */
} pl_probe_config;

typedef struct pl_probe_server pl_probe_server;

/* Binds, listens and starts serving; NULL and err on failure. */
pl_probe_server *pl_probe_start(const pl_probe_config *cfg, char *err, size_t errlen);
/* The port bound (useful after port 0). */
int pl_probe_port(const pl_probe_server *s);
/* Stops the thread (a request being answered is finished) and frees s. */
void pl_probe_stop(pl_probe_server *s);

#endif
