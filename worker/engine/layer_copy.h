/* Layer copies of a reconfiguration over an ORDERED transport (worker/comm/xport.h: NCCL's
 * model), so that GPU workers move weights and AdamW state GPU to GPU instead of through
 * host memory and TCP. It moves what change_engine (worker/agent/agent.c) receives over
 * TCP: params, m and v of every tensor of each layer in the plan's copies, and a head-only
 * range's tied wte with the head (layer L+1). Locally held tensors stay the caller's
 * (kn_copy).
 *
 * Ranks are the plan's: its pipelines flattened in order (pipeline 0 stage 0 is rank 0).
 * A worker's plan lists only ITS copies and sends, so each end of a copy derives the same
 * operations from what it knows: the destination from its copies, the source from its
 * sends and the destination's layer bounds in the pipelines. No request is exchanged.
 *
 * Idle sources. The coordinator picks a copy's source among the live holders of the
 * previous plan, and such a holder may be idle in the new plan (pl_reinstantiate dissolved
 * or shrank its pipeline and left it over): it has no rank, so the transport cannot carry
 * its copies. Those stay on TCP (the idle worker serves its sends, the destination
 * receives them), every copy between two ranks goes over the transport. Both ends of a
 * copy decide the same from the pipelines alone (pl_layer_copy_xport_pair), so no worker
 * needs to know the others' copies. Destinations are always ranks: idle workers receive
 * nothing. */
#ifndef PLIANT_LAYER_COPY_H
#define PLIANT_LAYER_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "gpt.h"
#include "protocol.h"
#include "xport.h"

/* How long the copies may take once enqueued: the TCP path's limit (agent.c's
 * COPY_TIMEOUT_MS). */
#define PL_LAYER_COPY_TIMEOUT_MS 180000

/* 1 when the plan's copies between its ranks may go over the ordered transport: its
 * transport is NCCL and its pipelines name each worker once. It reads only what every
 * worker's plan message holds alike (transport, pipelines), so every worker, idle ones
 * included, gets the same answer. 0: the runtime moves every copy over TCP. */
int pl_layer_copy_xport_possible(const pl_msg_plan *p);

/* 1 when the copy from worker `source` to worker `dest` goes over the transport (both are
 * ranks of p), 0 when it goes over TCP (one of them is idle in p). Both ends get the same
 * answer from the pipelines. */
int pl_layer_copy_xport_pair(const pl_msg_plan *p, const char *source, const char *dest);

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
