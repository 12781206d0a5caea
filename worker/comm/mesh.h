/* The connections between the workers of a plan (docs/runtime.md "Peer connections"):
 * a worker's listener and its dials, for the purposes of tcp.h's handshake: all-reduce
 * rings, stage links and layer copies. The higher plan rank dials the lower one; a layer
 * copy's source dials its destination.
 *
 * Waiting. Every wait polls the caller's cancel test (a newer plan ends the one being
 * installed) and then gives up with PL_COMM_ECANCELED. With redial (the worker's plans),
 * dials go in slices of PL_MESH_DIAL_SLICE_MS: a peer that is not ready (not listening
 * yet, at an older plan generation, a handshake that closed) is dialed again until the
 * timeout. A dialer that gives up on a handshake has not sent its verdict (it goes after
 * the listener's, handshake.h), so the accept never completes the connection given up:
 * it fails as soon as the dialer's close arrives, and only the redial's completes.
 * Without redial a dial is one try for the whole timeout (with pl_conn_connect's retries
 * of a refused connection).
 *
 * Accepting. pl_mesh_accept runs the handshakes of every connection accepted meanwhile at
 * once, under one poll with the listener: a stranger that connects and stays silent or
 * trickles bytes holds up nobody. Each handshake has a TOTAL deadline of handshake_ms
 * from its accept (PL_MESH_HANDSHAKE_MS by default); at most PL_MESH_PENDING_MAX run at
 * once, and over that the oldest is dropped. A handshake that fails (another job's
 * token, a stale generation, a wrong purpose, garbage, its deadline) is logged with the
 * peer's address and dropped (one the dialer closed, once a plan: a dialer whose slice
 * ended closes its try, which may wait in the listen backlog until this worker is free);
 * the handshakes still running stay with the mesh for the next accept, until a new plan.
 *
 * The stash. Peers dial when they are ready, not when this worker wants them: a stage
 * neighbour may dial while this worker still receives its layer copies. pl_mesh_accept
 * takes the purposes wanted now and those wanted later: a connection for a later purpose
 * waits in the stash (at most PL_MESH_STASH_MAX, more are closed), and an accept that
 * wants it takes it from there before the listener; a connection for neither is closed.
 * A new plan (pl_mesh_set_plan) closes the stash and the handshakes still running.
 *
 * Threads: pl_mesh_dial may run on several threads at once (a layer copy source dials
 * each destination on a thread of its own), alongside one thread's accepts (the worker's
 * compute thread: pl_mesh_accept, pl_mesh_connect); pl_mesh_set_plan, pl_mesh_drop_stash
 * and pl_mesh_destroy run while nothing else does. Ownership: the mesh borrows the listener,
 * the token and the name (they outlive it) and owns the stash and the handshakes running;
 * a connection returned
 * belongs to the caller. Errors: tcp.h's codes with "what: reason" in err. */
#ifndef PLIANT_MESH_H
#define PLIANT_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "tcp.h"

#define PL_MESH_STASH_MAX 64
#define PL_MESH_PENDING_MAX 16   /* handshakes running at once on accept */
#define PL_MESH_DIAL_SLICE_MS 500
#define PL_MESH_POLL_MS 50       /* the longest wait between two cancel tests */
#define PL_MESH_HANDSHAKE_MS 5000

/* A set of purposes for pl_mesh_accept: PL_MESH_PURPOSE(PL_CONN_RING) | ... */
#define PL_MESH_PURPOSE(p) (1u << (p))

typedef struct pl_mesh pl_mesh;

typedef struct {
    pl_listener *listener;  /* where peers reach this worker; NULL: it only dials */
    const void *token;      /* the job token (raw bytes) */
    size_t token_len;
    const char *name;       /* this worker's name */
    /* Nonzero: every wait gives up (a newer plan). NULL: never. Called from the dialing
     * threads too. */
    int (*cancelled)(void *ctx);
    /* A peer refused or a connection dropped (one line, no newline), and at create the
     * port listened on. NULL: silent. Called from the thread of the accept. */
    void (*log)(void *ctx, const char *line);
    void *ctx;
    int redial;             /* 1: dial a peer that is not ready again (see "Waiting") */
    int handshake_ms;       /* an accepted handshake's total deadline; ≤ 0: the default */
    pl_frame_protection protection; /* asked for on every connection (tcp.h); 0: default */
    pl_frame_cipher cipher;         /* 0: by the CPU */
} pl_mesh_config;

/* 0, or PL_COMM_EINVAL / PL_COMM_ESYS with err. */
int pl_mesh_create(const pl_mesh_config *cfg, pl_mesh **out, char *err, size_t errlen);
/* Closes the stash (not the listener). NULL is a no-op. */
void pl_mesh_destroy(pl_mesh *m);

/* The plan the next connections belong to: its generation (the handshake's) and this
 * worker's rank in it (PL_COMM_NO_RANK: idle, it only dials layer copies). Closes the
 * stash: what peers dialed for an older plan is of no use. */
void pl_mesh_set_plan(pl_mesh *m, uint64_t generation, int32_t rank);
/* Closes the stashed connections. */
void pl_mesh_drop_stash(pl_mesh *m);
/* How many connections wait in the stash. */
int pl_mesh_stashed(const pl_mesh *m);

/* Dials host:port for purpose, as this worker's rank in the plan, until timeout_ms (> 0)
 * has passed (see "Waiting"). expect_rank ≥ 0 refuses a peer of another rank, −1 takes
 * any. */
int pl_mesh_dial(pl_mesh *m, const char *host, int port, pl_conn_purpose purpose,
                 int32_t expect_rank, int timeout_ms, pl_conn **out, char *err,
                 size_t errlen);

/* One connection for a purpose in `want` (a set), from the stash or the listener, before
 * deadline (on pl_now_ms's clock). Connections for a purpose in `later` accepted meanwhile
 * wait in the stash; others are closed. PL_COMM_ETIMEOUT names the last peer refused. */
int pl_mesh_accept(pl_mesh *m, unsigned want, unsigned later, double deadline, pl_conn **out,
                   char *err, size_t errlen);

/* The connections of this worker's rank in a plan. */
typedef struct {
    int nranks;
    const char *const *names;  /* each rank's worker name, for messages; NULL: "rank r" */
    const char *const *hosts;  /* each rank's address: needed for the ranks this one dials */
    const int *ports;
    const unsigned char *ring; /* ring[r] ≠ 0: a ring connection with rank r; NULL: none */
    int link_prev, link_next;  /* the stage neighbours' ranks; −1: none */
    int link_wrap;             /* the rank at the ring's other end (stage_link.h); −1: none */
} pl_mesh_peers;

typedef struct {
    pl_conn **ring;        /* the caller's nranks entries: ring[r], the connection with r */
    pl_conn *prev, *next, *wrap; /* the stage links (NULL: none) */
    int failed_rank;       /* after a dial failed: the rank it dialed; else −1 */
} pl_mesh_links;

/* Makes the connections of peers: dials every wanted rank below this one (each dial may
 * take timeout_ms), then accepts every wanted rank above it, the stash first, for at most
 * timeout_ms more. A connection accepted that is not wanted (a stranger, a rank twice) is
 * closed. On failure every connection made is closed and out's are NULL. */
int pl_mesh_connect(pl_mesh *m, const pl_mesh_peers *peers, int timeout_ms, pl_mesh_links *out,
                    char *err, size_t errlen);

/* A full mesh of ring connections between ranks 0 .. nranks − 1 (self->rank among them;
 * self->purpose is not read; its protection and cipher are asked for): pl_mesh_connect with every other rank wanted, no cancel
 * test and no redial. l may be NULL for the highest rank (it accepts nobody). conns[r] receives the
 * connection with rank r (conns[self->rank] = NULL); on failure all are NULL. */
int pl_comm_mesh(pl_listener *l, const pl_comm_ident *self, int nranks,
                 const char *const *hosts, const int *ports, int timeout_ms,
                 pl_conn **conns, char *err, size_t errlen);

#endif
