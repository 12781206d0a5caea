/* pl_xport (xport.h) over the NCCL module (nccl_comm.h): the GPU worker's ordered
 * transport for the step (docs/nccl.md, "The step on NCCL"). Built only by `make cuda`
 * (libpliant_nccl.a).
 *
 *   p2p             → pl_nccl_p2p_batch (one ncclGroupStart/End)
 *   allreduce       → pl_nccl_group_allreduce
 *   after_compute   → cudaEventRecord on the kernels' stream, pl_nccl_wait_event
 *   before_compute  → pl_nccl_record_event, cudaStreamWaitEvent on the kernels' stream
 *   wait            → pl_nccl_wait
 *
 * The kernels' stream is kn_stream_handle(k); both streams are on the module's device,
 * and the thread issuing the step has that device current (the kernels' thread). Every
 * enqueue waits at most PL_XPORT_NCCL_ENQUEUE_MS (the first operation between two
 * ranks also connects them); wait takes the step's own timeout. Any failure also
 * aborts the module (pl_nccl_abort) before returning −1: the caller may free or reuse
 * the buffers of queued operations, and synchronise the kernels' stream, right away. */
#ifndef PLIANT_NCCL_XPORT_H
#define PLIANT_NCCL_XPORT_H

#include <stddef.h>

#include "kernels.h"
#include "nccl_comm.h"
#include "xport.h"

#define PL_XPORT_NCCL_ENQUEUE_MS 60000

/* Fills *x with the transport of n (not owned: it must outlive x) for the kernels of k:
 * self and nranks are n's world rank and size. 0, or −1 with err (k has no CUDA
 * stream, out of memory, event creation failed). */
int pl_xport_nccl(pl_nccl *n, kn_ctx *k, pl_xport *x, char *err, size_t errlen);
/* Frees what pl_xport_nccl made (nothing queued may still wait on its events: after
 * pl_nccl_wait, or once n is aborted). A zeroed x is a no-op. */
void pl_xport_nccl_free(pl_xport *x);

#endif
