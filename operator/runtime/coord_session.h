/* A coordinator (coordinator.h) behind its control server (control_server.h):
 * the table of workers and their connections, registrations (refused with a
 * reason, or given to the coordinator with their zone), messages in, the
 * coordinator's messages out, a closed connection as the loss of its worker.
 * The job driver's (job_driver.h), for `pliant run` and the operator alike.
 * Single-threaded, as the server. */
#ifndef PLIANT_COORD_SESSION_H
#define PLIANT_COORD_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "control_server.h"
#include "coordinator.h"

typedef struct pl_coord_session pl_coord_session;

typedef struct {
    pl_coord *coord;              /* borrowed; outlives the session */
    const char *job;              /* a register of another job is refused; NULL: any */
    /* NULL to admit a worker name, else why not (pliant run: its own workers only) */
    const char *(*admit)(void *user, const char *name);
    void *user;
    pl_ctl_server_config server;  /* everything but the callbacks (the session's) */
    int ports;                    /* server.port > 0: try ports port .. port + ports − 1 */
    int (*port_taken)(void *ctx, int port); /* of those, skip where nonzero (NULL: none) */
    void *port_ctx;
} pl_coord_session_config;

pl_coord_session *pl_coord_session_new(const pl_coord_session_config *cfg, char *err,
                                       size_t errlen);
/* Closes every connection (losses the coordinator records) and frees. NULL is fine. */
void pl_coord_session_free(pl_coord_session *s);

/* Serves the server for up to timeout_ms, sends the coordinator's messages, ticks
 * it. 0, or -1 when the server failed. */
int pl_coord_session_poll(pl_coord_session *s, int timeout_ms);
/* Worker `name` is gone (its process or Pod ended): 1 when the coordinator
 * learned it now, 0 when it knew. */
int pl_coord_session_lost(pl_coord_session *s, const char *name, const char *cause);
/* The zone of worker `name`, given to the coordinator now or when it registers. */
void pl_coord_session_set_zone(pl_coord_session *s, const char *name, const char *zone);
/* When the first loss since the last call was learned (pl_ctl_now_ms), or -1. */
int64_t pl_coord_session_take_disruption(pl_coord_session *s);

int pl_coord_session_connected(const pl_coord_session *s);
pl_ctl_server *pl_coord_session_server(pl_coord_session *s);

#endif
