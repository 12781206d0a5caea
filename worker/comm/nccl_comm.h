/* The GPU worker's NCCL transport (docs/nccl.md): the plan's world communicator,
 * per-layer gradient all-reduce among the ranks holding a layer, stage-neighbour
 * and layer-transfer point-to-point, all on one dedicated CUDA stream, with
 * deadlines everywhere so that a dead peer turns into an error, never a hang.
 * Built only by `make cuda`; the CPU build uses the TCP transport (tcp.h).
 *
 * Ranks. Every rank number here is a rank of the world communicator: 0 ..
 * nranks − 1, the position of the worker in the plan's rank order (the caller
 * maps the plan's worker ids to it). Sub-communicators are an internal detail.
 *
 * Streams. Every operation is enqueued on the module's own stream (created
 * cudaStreamNonBlocking, so it overlaps the compute stream). The caller orders
 * it against compute with events: record an event on the compute stream after
 * the kernels that write a buffer, then pl_nccl_wait_event(n, ev) before the
 * collective that reads it; for the reverse direction pl_nccl_record_event(n,
 * ev) after the collective and cudaStreamWaitEvent(compute, ev) before the
 * kernels that read the result (or pl_nccl_wait on the host). Streams and events
 * are passed as void * so that this header needs no CUDA header.
 *
 * Non-blocking NCCL. Every communicator is created with config.blocking = 0:
 * no call waits for a peer. An enqueue (all-reduce, send/recv) returns once the
 * operation is on the stream, polling NCCL against the caller's deadline (the
 * first operation between two ranks also sets up their connection, which needs
 * the peer); pl_nccl_wait polls the stream and every communicator's async error
 * against a deadline. timeout_ms < 0 means no deadline (pl_nccl_abort still ends
 * the wait), 0 is refused, except where said otherwise.
 *
 * Order. The stream runs operations in issue order and NCCL's send/recv is a
 * rendezvous (a send completes only once the peer receives), so the sequence of
 * NCCL operations of every rank must be consistent with every other's: stage
 * sends and their peer's receives posted together in one pl_nccl_p2p_batch
 * (the schedule's paired mode), collectives in pl_syncgroups' global order.
 * Two ranks that issue shared operations in different orders deadlock (which the
 * deadlines turn into errors).
 *
 * Failure. Any NCCL or CUDA error, and any deadline passed, marks the module
 * failed: the call returns −1 with the reason, and every later call returns −1
 * at once ("nccl: failed earlier: <first reason>"). Then either pl_nccl_revoke (stop, keep the
 * world communicator as the parent of pl_nccl_shrink) or pl_nccl_abort /
 * pl_nccl_destroy. A failed module never recovers.
 *
 * Threads. One thread issues work and waits (the compute or comm thread);
 * pl_nccl_revoke, pl_nccl_abort and pl_nccl_failed may be called from any other
 * thread at any time (the control thread, on `abort` or a broken peer): a thread
 * blocked in pl_nccl_wait, in an enqueue or in pl_nccl_prepare_groups returns −1
 * within a poll interval (about 100 µs), as does pl_nccl_shrink when the old
 * module is aborted. pl_nccl_create has no handle to abort yet: it ends at its
 * timeout, or earlier through pl_nccl_create_cancel's test. */
#ifndef PLIANT_NCCL_COMM_H
#define PLIANT_NCCL_COMM_H

#include <stddef.h>
#include <stdint.h>

/* Text form of an ncclUniqueId: 2 hex digits per byte of the 128-byte id. */
#define PL_NCCL_ID_TEXT_LEN (2 * 128 + 1)

/* Most operations in one call (one ncclGroupStart/End; NCCL caps a group at 2048). */
#define PL_NCCL_MAX_OPS 1024

typedef struct pl_nccl pl_nccl;

/* "NCCL 2.28.9 (headers 2.28.9), CUDA runtime 13.0": the library actually loaded. */
const char *pl_nccl_version(void);

/* Number of CUDA devices, or −1 with err "no CUDA device (...)" where there is
 * none or the driver is missing (tests skip on that prefix). */
int pl_nccl_device_count(char *err, size_t errlen);

/* A fresh unique id as text (out needs PL_NCCL_ID_TEXT_LEN bytes). Called by the
 * plan's world rank 0, which becomes the bootstrap root: the id carries its
 * address, so it must be made in the process that will be rank 0, and that
 * process must stay alive until every rank has joined. 0, or −1 with err. */
int pl_nccl_make_id(char *out, size_t outlen, char *err, size_t errlen);

/* Joins the world communicator named by id_text as `rank` of `nranks` on CUDA
 * device cuda_device, and creates the module's stream. Every rank of the plan
 * calls it with the same id and nranks. Waits at most timeout_ms (> 0) for all
 * ranks to arrive; past it the communicator is aborted and −1 returned
 * ("timeout: ..."): a rank that never comes does not hang the others. */
int pl_nccl_create(const char *id_text, int nranks, int rank, int cuda_device,
                   int timeout_ms, pl_nccl **out, char *err, size_t errlen);

/* A test the module polls, from the thread that waits, while it waits for other
 * ranks to connect (init, split, the first operation with a peer): nonzero gives
 * up at once (−1, "cancelled", the module failed). It is what the caller has
 * before it holds the module to pl_nccl_abort: a newer plan arriving while this
 * rank waits in pl_nccl_create for a rank that died (up to timeout_ms otherwise).
 * ctx must outlive the module. */
typedef int (*pl_nccl_cancel_fn)(void *ctx);
/* pl_nccl_create with a cancel test (NULL: none), kept for the module's life. */
int pl_nccl_create_cancel(const char *id_text, int nranks, int rank, int cuda_device,
                          int timeout_ms, pl_nccl_cancel_fn cancel, void *cancel_ctx,
                          pl_nccl **out, char *err, size_t errlen);

int pl_nccl_rank(const pl_nccl *n);
int pl_nccl_nranks(const pl_nccl *n);
int pl_nccl_device(const pl_nccl *n);
/* The module's cudaStream_t. */
void *pl_nccl_stream(pl_nccl *n);

/* Makes later work on the module's stream wait for a cudaEvent_t recorded on
 * another stream (cudaStreamWaitEvent). 0, or −1 with err. */
int pl_nccl_wait_event(pl_nccl *n, void *event, char *err, size_t errlen);
/* Records a cudaEvent_t on the module's stream after the work enqueued so far. */
int pl_nccl_record_event(pl_nccl *n, void *event, char *err, size_t errlen);

/* Splits the world into one communicator per member set, for this plan.
 * sets[i] holds sizes[i] distinct world ranks in ascending order; the sets
 * should be distinct (pl_syncgroups' distinct member sets, mapped to world ranks).
 * COLLECTIVE OVER THE WHOLE WORLD: every rank calls it with the same list in the
 * same order, also ranks in none of the sets (ncclCommSplit is collective over
 * its parent). Sets of one rank need no communicator, the set of all ranks uses
 * the world's; the others are split in rounds of pairwise-disjoint sets (one
 * ncclCommSplit per round). A later call replaces the previous sets, keeping the
 * communicators of sets that are in both lists. 0, or −1 with err. */
int pl_nccl_prepare_groups(pl_nccl *n, const int *const *sets, const int *sizes,
                           int nsets, int timeout_ms, char *err, size_t errlen);

/* The ncclCommSplit rounds of pl_nccl_prepare_groups, pure (no CUDA): round[i]
 * for sets[i], −1 where no communicator of its own is needed (1 rank, or all
 * nranks); each round holds, in list order, the sets that share no rank with a
 * set placed earlier in that round. Returns the number of rounds, or −1 (out of
 * memory). The sets must be valid (ranks in 0 .. nranks − 1, ascending). */
int pl_nccl_split_rounds(const int *const *sets, const int *sizes, int nsets, int nranks,
                         int *round);

/* Sums nbufs device buffers (bufs[i]: counts[i] floats) in place across the
 * ranks of group (ascending world ranks, one of the prepared sets, containing
 * this rank), in one ncclGroupStart/End. Every member calls it with the same
 * group and counts, and all ranks issue their collectives in one global order
 * (pl_syncgroups' run order): the module's stream runs them in issue order, so
 * two ranks issuing shared collectives in different orders deadlock. A group
 * of one rank returns 0 at once. Returns when enqueued (timeout_ms bounds that,
 * see above); pl_nccl_wait for completion. 0, or −1 with err. */
int pl_nccl_group_allreduce(pl_nccl *n, const int32_t *group, int group_size,
                            float *const *bufs, const size_t *counts, int nbufs,
                            int timeout_ms, char *err, size_t errlen);

/* One point-to-point operation of a batch: send or receive count floats of a
 * device buffer to / from world rank peer (this rank itself is allowed when the
 * matching operation is in the same batch). */
typedef struct {
    int peer;
    int send;       /* 1: send data to peer; 0: receive into data from peer */
    float *data;    /* device memory */
    size_t count;
} pl_nccl_p2p;

/* Enqueues ops in one ncclGroupStart/End: the stage neighbours' activation and
 * gradient exchange, or a layer transfer (each tensor's parameters, AdamW m and
 * v, to or from one or several peers). The peer posts the matching operations
 * in the same order. Zero-count operations are skipped. Returns when enqueued;
 * pl_nccl_wait for completion. 0, or −1 with err. */
int pl_nccl_p2p_batch(pl_nccl *n, const pl_nccl_p2p *ops, int nops, int timeout_ms,
                      char *err, size_t errlen);
/* One send / one receive (a batch of one). */
int pl_nccl_send(pl_nccl *n, int peer, const float *dev, size_t count, int timeout_ms,
                 char *err, size_t errlen);
int pl_nccl_recv(pl_nccl *n, int peer, float *dev, size_t count, int timeout_ms,
                 char *err, size_t errlen);

/* Waits until everything enqueued on the module's stream is done, watching the
 * async error of every communicator. timeout_ms < 0 waits without deadline
 * (pl_nccl_abort still ends it). 0, or −1 with err ("timeout: ...", the NCCL
 * or CUDA error, or "aborted: <reason>"); −1 marks the module failed. */
int pl_nccl_wait(pl_nccl *n, int timeout_ms, char *err, size_t errlen);

/* Without waiting: 1 when the stream is idle, 0 while work is running, −1 (and
 * failed) on an error. */
int pl_nccl_query(pl_nccl *n, char *err, size_t errlen);

/* 0 while sound; else 1 with the reason of the failure in err. Thread-safe. */
int pl_nccl_failed(pl_nccl *n, char *err, size_t errlen);

/* Marks the module failed (reason kept when it is the first), stops in-flight
 * operations of the world communicator (ncclCommRevoke), keeping it as a parent
 * for pl_nccl_shrink, and aborts the sub-communicators. Thread-safe, idempotent. */
void pl_nccl_revoke(pl_nccl *n, const char *reason);

/* Marks the module failed, revokes and aborts every communicator
 * (ncclCommRevoke, ncclCommAbort): nothing of this module can block after it.
 * Thread-safe, idempotent. The module must still be destroyed. */
void pl_nccl_abort(pl_nccl *n, const char *reason);

/* A new world without the excluded world ranks and without a new unique id
 * (ncclCommShrink). Called by every remaining rank with the same list, never by
 * the excluded ones. On a failed module the world is revoked first (if
 * pl_nccl_revoke has not done it) and shrunk with NCCL_SHRINK_ABORT; on a sound
 * one (a planned leave at a step boundary) with NCCL_SHRINK_DEFAULT. Ranks are
 * renumbered in order: the new rank of old rank r is r minus the number of
 * excluded ranks below r. The new module has no prepared groups and a stream of
 * its own; the old one must still be destroyed. Waits at most timeout_ms. 0, or
 * −1 with err: then the old module is failed (aborted if the shrink had
 * started) and the caller creates a new world from a fresh id instead. */
int pl_nccl_shrink(pl_nccl *n, const int *excluded_ranks, int nexcluded, int timeout_ms,
                   pl_nccl **out, char *err, size_t errlen);

/* Frees the module: a sound one finalizes its communicators (ncclCommFinalize,
 * then ncclCommDestroy, at most a few seconds, then abort), a failed one aborts
 * them. No other call may be running on n, except a pl_nccl_abort /
 * pl_nccl_revoke still finishing on another thread (waited for). NULL is a no-op. */
void pl_nccl_destroy(pl_nccl *n);

#endif
