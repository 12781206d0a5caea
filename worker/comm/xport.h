/* An ORDERED transport: the model of NCCL (docs/nccl.md, "The step on NCCL") that the
 * worker step runs on when every worker has a GPU of its own. A table of callbacks, so
 * that the step is written once and tested on the CPU (tests/unit/xport_sim.h: one
 * thread per rank, the same semantics, deadlock detection) while the GPU worker plugs
 * in NCCL (worker/comm/nccl_xport.h, `make cuda` only).
 *
 * Semantics.
 *  - Every operation is ENQUEUED: the call returns once the operation is queued (or
 *    −1: the transport failed), and the operations of a rank complete one after
 *    another in issue order (NCCL: one CUDA stream per module).
 *  - Point-to-point is a RENDEZVOUS: a send completes only when the peer's matching
 *    receive runs, and vice versa. The k-th send of a rank to a peer matches the
 *    peer's k-th receive from that rank; both name the same count. The operations of
 *    one p2p call are one group: they progress together (a group is at the head of
 *    the queue as a whole), so a send and a receive posted in one group cannot block
 *    each other (the schedule's PAIRED mode, shared/schedule.h).
 *  - A collective completes when every member has reached it: members must issue
 *    their collectives in one global order (pl_syncgroups').
 *  - Buffers are backend memory (device memory on CUDA) and must stay untouched from
 *    the enqueue until the operation is known complete: by before_compute for later
 *    compute, by wait for the host.
 *  - Compute (the kernels) and the transport are two queues: after_compute makes the
 *    transport's later operations wait for the compute queued so far (what they read
 *    or overwrite was written or read by it); before_compute makes later compute wait
 *    for the transport operations queued so far (it reads what they receive, or
 *    overwrites what they send). On the CPU compute is synchronous: after_compute is
 *    a no-op and before_compute waits on the host.
 *
 * Ranks are world ranks 0 .. nranks − 1 (the plan's ranks, pipelines flattened in
 * order: the same numbers as pl_syncgroups' ranks). One thread issues a rank's
 * operations. Any failure (a peer lost, a deadline) is −1 with err; a failed
 * transport may still hold queued operations on the caller's buffers until it is
 * aborted (NCCL: pl_nccl_abort / pl_nccl_revoke), so after −1 the caller aborts it
 * before freeing or reusing them. */
#ifndef PLIANT_XPORT_H
#define PLIANT_XPORT_H

#include <stddef.h>
#include <stdint.h>

/* One point-to-point operation of a group. */
typedef struct {
    int peer;       /* world rank */
    int send;       /* 1: send data to peer; 0: receive into data from peer */
    float *data;    /* backend memory, count floats */
    size_t count;
} pl_xport_op;

typedef struct pl_xport {
    void *ctx;
    int self, nranks;
    /* Enqueues ops[0 .. nops) as one group. */
    int (*p2p)(void *ctx, const pl_xport_op *ops, int nops, char *err, size_t errlen);
    /* Enqueues the in-place SUM of bufs[i] (counts[i] floats each) among the world ranks
     * group[0 .. group_size) (ascending, containing self; every member passes the same
     * group and counts). A group of one rank is a no-op. */
    int (*allreduce)(void *ctx, const int32_t *group, int group_size, float *const *bufs,
                     const size_t *counts, int nbufs, char *err, size_t errlen);
    /* Later transport operations wait for the compute queued so far. */
    int (*after_compute)(void *ctx, char *err, size_t errlen);
    /* Later compute waits for the transport operations queued so far. */
    int (*before_compute)(void *ctx, char *err, size_t errlen);
    /* The host waits until every queued operation is complete; timeout_ms < 0: no
     * deadline of its own (the transport's own deadlines and aborts still end it). */
    int (*wait)(void *ctx, int timeout_ms, char *err, size_t errlen);
} pl_xport;

#endif
