/* Layer copies of a reconfiguration (docs/runtime.md "Recovery"). A worker whose layers
 * change gets a new engine for its range of the new plan; each tensor comes from the engine
 * of the previous plan when this worker held it (pl_layer_copy_local: the layer's pages
 * mapped, kn_share, else kn_copy on the backend), else from the copy source the plan names: params, AdamW m and v of every
 * tensor of each layer in the plan's copies, and a head-only range's tied wte with the
 * head (layer L+1). Meanwhile the worker serves the plan's sends from its previous engine.
 *
 * Two copiers move tensors between workers, behind one interface (pl_layer_copier):
 *  - TCP (pl_layer_copier_tcp, layer_copy_tcp.c): a source dials each destination over the
 *    mesh (worker/comm/mesh.h, purpose PL_CONN_LAYER_COPY) from a thread of its own; the
 *    destination asks for tensors (one PL_LAYER_COPY_FRAME_REQ frame: int32 layer, index,
 *    part, parts each), the source streams params, m and v of each (tensor frames, tags
 *    3k, 3k+1, 3k+2; of a layer copied in parts, only that part of each tensor), the
 *    destination answers PL_LAYER_COPY_FRAME_ACK. A layer in parts comes from several
 *    sources at once, each on its own connection. Off the CPU backend each tensor passes
 *    through a page-locked host buffer.
 *  - an ORDERED transport (pl_layer_copier_xport, layer_copy_xport.c; worker/comm/xport.h:
 *    NCCL's model), so that GPU workers move weights and AdamW state GPU to GPU, whole
 *    layers only (the coordinator plans no parts on an NCCL plan).
 * The plan's transport chooses (pl_layer_copy_over_xport): on an NCCL plan whose pipelines
 * name each worker once, every copy between two ranks goes over the transport; the others
 * (a source idle in the new plan has no rank) go over TCP. Both ends of a copy decide the
 * same from the pipelines alone, so no worker needs to know the others' copies.
 *
 * Ranks are the plan's: its pipelines flattened in order (pipeline 0 stage 0 is rank 0).
 * A worker's plan lists only ITS copies and sends, so each end of a copy derives the same
 * operations from what it knows: the destination from its copies, the source from its
 * sends and the destination's layer bounds in the pipelines.
 *
 * Idle sources. The coordinator picks a copy's source among the live holders of the
 * previous plan, and such a holder may be idle in the new plan (pl_reinstantiate dissolved
 * or shrank its pipeline and left it over). Destinations are always ranks: idle workers
 * receive nothing.
 *
 * Threads and ownership: a copier runs on the caller's thread (the TCP one starts and
 * joins threads of its own inside copy); the job's engines stay the caller's and must not
 * be used elsewhere while a copy runs. One timeout bounds every copy:
 * PL_LAYER_COPY_TIMEOUT_MS; another thread ends one sooner: the TCP copier's stop
 * (pl_layer_copy_stop_now), the ordered transport's abort (xport.h). */
#ifndef PLIANT_LAYER_COPY_H
#define PLIANT_LAYER_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "copy_reserve.h"
#include "engine.h"
#include "gpt.h"
#include "mesh.h"
#include "protocol.h"
#include "xport.h"

/* How long a copy may take: a TCP source's dial, a destination's wait for its sources,
 * the idle timeout of the TCP streams, the ordered transport's wait (and the NCCL join of
 * a plan, which waits for ranks receiving TCP copies from idle sources). */
#define PL_LAYER_COPY_TIMEOUT_MS 180000

/* TCP connections per (source, destination) pair, each with its threads at both ends:
 * one stream is bound by one core's copy loop and one socket's window, which leave a
 * link partly idle (bench/README.md, recovery at size). The destination splits what it
 * asks of a source into this many lists of about equal bytes, some possibly empty; the
 * source dials this many whatever it is asked. */
#define PL_LAYER_COPY_STREAMS 2

#define PL_LAYER_COPY_FRAME_REQ (PL_FRAME_USER + 64)
#define PL_LAYER_COPY_FRAME_ACK (PL_FRAME_USER + 65)

/* One worker's copies in a reconfiguration. */
typedef struct {
    const pl_msg_plan *plan;  /* this worker's plan message */
    const char *self;         /* this worker's name */
    const pl_gpt_config *cfg;
    const pl_engine *src;     /* the engine of the previous plan: what it sends; NULL: none */
    pl_engine *dst;           /* the new engine, the plan's range of this worker; NULL: idle */
    const pl_engine *shadow;  /* strategy redundant: the successor's layers this worker held
                                 as its shadow (shadow.h), a second local source: the
                                 failover takes them over without a copy (Bamboo §5.2);
                                 NULL: none */
    /* How dst is made, so that making it overlaps the network (NULL: dst is ready). The
     * TCP copier calls make_dst on the caller's thread once its senders run and before it
     * accepts any source: it creates dst (allocation only). Then it starts its receivers
     * and calls fill_dst while they run: it fills the tensors no copy brings
     * (pl_layer_copy_local) and must not touch the copied ones. Both return 0, or −1 with
     * err (the copier then waits for its threads and fails). */
    int (*make_dst)(void *ctx, char *err, size_t errlen);
    int (*fill_dst)(void *ctx, char *err, size_t errlen);
    void *dst_ctx;
    pl_reserve *reserve;      /* memory made present for the received layers (copy_reserve.h);
                                 NULL: none */
} pl_layer_copy_job;

typedef struct {
    int64_t bytes_in;           /* bytes received: 3 · numel · 4 per tensor */
    double make_ms, fill_ms;    /* TCP copier: time in make_dst and fill_dst */
    double net_ms;              /* TCP copier: from the first source accepted to the last
                                   tensor received (0: nothing received) */
    int64_t reserved;           /* TCP copier: bytes of dst mapped from the job's reserve */
    pl_proto_name failed_peer;  /* a copy from or to this peer failed ("": none, or a
                                   failure no peer is known for) */
} pl_layer_copy_result;

typedef struct pl_layer_copier pl_layer_copier;
struct pl_layer_copier {
    /* Moves the copier's share of job's copies and sends (pl_layer_copy_over_xport) and
     * returns when they are complete, adding to res->bytes_in. 0, or −1 with err. */
    int (*copy)(const pl_layer_copier *c, const pl_layer_copy_job *job,
                pl_layer_copy_result *res, char *err, size_t errlen);
    void *ctx;
};

/* Stopping a TCP copy from another thread (a newer plan, the worker's exit): the copy's
 * streams are shut down (shutdown(2)), each of its threads fails at once rather than at
 * the streams' idle timeout, and so does any stream it opens later; the copy then joins
 * its threads and returns −1, err "layer copies stopped: WHY", no failed peer. Its dials
 * and accepts end on the mesh's cancel test (mesh.h). One stop per copy: made before it,
 * freed after it returned. */
typedef struct pl_layer_copy_stop pl_layer_copy_stop;
pl_layer_copy_stop *pl_layer_copy_stop_new(void); /* NULL: out of memory */
void pl_layer_copy_stop_free(pl_layer_copy_stop *s);
/* Any thread, before, during or after the copy; NULL is a no-op. */
void pl_layer_copy_stop_now(pl_layer_copy_stop *s, const char *why);

/* The TCP copier's setting; it outlives the copier. */
typedef struct {
    pl_mesh *mesh;                 /* set to the plan (pl_mesh_set_plan); a destination
                                      accepts its sources there, keeping the ring and stage
                                      link connections that come early in the stash */
    void (*after_send)(void *ctx); /* after each tensor a source sent; NULL: none (the
                                      recovery tests' faults kill the worker here) */
    void *hook_ctx;
    pl_layer_copy_stop *stop;      /* NULL: the copy is not stopped from outside */
} pl_layer_copy_tcp;

/* Copies over TCP: the job's copies and sends that do not go over the transport. Before
 * anything moves, −1 when the plan asks for sends and src is NULL, or gives an idle worker
 * copies. A destination waits PL_LAYER_COPY_TIMEOUT_MS at most for its sources; a failed
 * copy names its peer in res->failed_peer, and once this side failed (a source not
 * accepted in time, dst not made) its other streams are shut down before the threads are
 * joined. */
pl_layer_copier pl_layer_copier_tcp(pl_layer_copy_tcp *t);

/* Copies over the ordered transport x: pl_layer_copy_xport. x outlives the copier. */
pl_layer_copier pl_layer_copier_xport(const pl_xport *x);

/* Fills job->dst from job->src (else job->shadow) where this worker held a tensor and the
 * plan copies its layer from nowhere else: a layer held whole by one of them is mapped
 * (kn_share: the two engines then share its params, m and v, so the caller writes neither
 * engine's copy of it until the old engine is freed), else copied. *fresh = 1 when no tensor of dst has any source (no previous engine and
 * no copies: the caller initialises dst). −1 with err when some tensors have neither a local
 * copy nor a copy source. */
int pl_layer_copy_local(const pl_layer_copy_job *job, int *fresh, char *err, size_t errlen);
/* Maps the job's reserve (copy_reserve.h) over the params, m and v of every layer dst
 * receives, then over as many of those layers' gradients as it still covers, a layer at a
 * time, before anything is received: those pages are then present. 0 when it covered the
 * params, m and v (what the stream writes); −1 when there is no reserve or it ran short
 * there (the rest fault in, or a helper makes them present). */
int pl_layer_copy_take_reserve(const pl_layer_copy_job *job);

/* The layer under which the plan copies tensor j of e: its own, but L + 1 (the head) for
 * the tied wte of a range without the embedding. */
int pl_layer_copy_layer_of(const pl_engine *e, int j);

/* The copy source of a layer in the plan's copies (of its first part), or NULL. */
const char *pl_layer_copy_source(const pl_msg_plan *p, int layer);

/* Checks the parts of the plan's copies: each layer comes whole (one entry, parts 0 or
 * 1) or as parts 0 .. n − 1 of one n, each once (shared/reinstantiate.h: part k of n is
 * elements [numel·k/n, numel·(k+1)/n) of each of the layer's tensors). 0, or −1 with err
 * naming the entry. */
int pl_layer_copy_check_parts(const pl_msg_plan *p, char *err, size_t errlen);

/* The layers the plan's copies bring (a layer in parts counts once). */
int pl_layer_copy_layers(const pl_msg_plan *p);

/* Elements [*off, *off + *n) of a tensor of numel elements: part `part` of `parts` of it
 * (parts ≤ 1: all of it). */
void pl_layer_copy_part_span(size_t numel, int part, int parts, size_t *off, size_t *n);

/* 1 when the plan's copies between its ranks may go over the ordered transport: its
 * transport is NCCL and its pipelines name each worker once. It reads only what every
 * worker's plan message holds alike (transport, pipelines), so every worker, idle ones
 * included, gets the same answer. 0: every copy goes over TCP. */
int pl_layer_copy_xport_possible(const pl_msg_plan *p);

/* 1 when the copy from worker `source` to worker `dest` goes over the transport (both are
 * ranks of p), 0 when it goes over TCP (one of them is idle in p). Both ends get the same
 * answer from the pipelines. */
int pl_layer_copy_xport_pair(const pl_msg_plan *p, const char *source, const char *dest);

/* The rule the two copiers share: pl_layer_copy_xport_possible and _pair. */
int pl_layer_copy_over_xport(const pl_msg_plan *p, const char *source, const char *dest);

/* Moves this worker's copies between ranks over x (x->self: this worker's rank in p): it
 * receives into dst every copy whose source is a rank, and sends from src every one of its
 * sends, all in ONE p2p group (a group cannot deadlock against itself, whatever the other
 * ranks send and receive), then waits until they are complete (at most
 * PL_LAYER_COPY_TIMEOUT_MS; later compute is ordered after them). Per pair (source,
 * destination), both ends list the same operations: the destination's layers from that
 * source, ascending; each run of consecutive layers is one segment (its tensors are
 * contiguous in every engine: pl_engine_create's layout), and a head-only destination's
 * tied wte (layer 0, index 0) is a segment of its own after the head's; each segment moves
 * as three operations, params, m, v (rather than three per tensor: NCCL groups are bounded,
 * PL_NCCL_MAX_OPS, and small messages are slow).
 *
 * src: the engine of the previous plan (NULL: none); dst: the new engine, with the plan's
 * range of this worker (NULL for an idle worker, which has no rank: its sends go over TCP
 * and this returns 0 at once, x unused). *bytes_in: bytes received (3 · numel · 4 per
 * tensor). Copies whose source is idle are left to TCP (dst untouched there).
 *
 * Before anything is enqueued, −1 with err (naming the layer and the peer) when this
 * worker's part of the plan is wrong: a send of a layer src does not hold or that the
 * destination's range lacks, a destination or copy layer outside the plan or the range,
 * a layer listed with two sources, engines of another model. A peer of such a rank then
 * fails in the transport (its deadline, or an abort) rather than hanging; after −1 from
 * the transport the caller aborts it before freeing src or dst (xport.h). */
int pl_layer_copy_xport(const pl_xport *x, const pl_msg_plan *p, const pl_gpt_config *cfg,
                        const pl_engine *src, pl_engine *dst, int64_t *bytes_in, char *err,
                        size_t errlen);

#endif
