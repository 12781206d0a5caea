/* pl_xport over the NCCL module: see nccl_xport.h and docs/nccl.md ("The step on
 * NCCL"). Plain C on the CUDA runtime's C API; `make cuda` only. */
#include "nccl_xport.h"
#include "util.h"

#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <string.h>

typedef struct {
    pl_nccl *n;
    cudaStream_t compute;  /* the kernels' stream */
    cudaEvent_t ev_compute; /* recorded on the kernels' stream */
    cudaEvent_t ev_comm;    /* recorded on the module's stream */
} nccl_xport;

static int cuda_fail(char *err, size_t errlen, const char *what, cudaError_t e)
{
    return pl_errf(err, errlen, "nccl xport: %s: %s", what, cudaGetErrorString(e));
}

/* Any failure aborts the module at once (xport.h: a failed transport may hold queued
 * operations until aborted). Without it, NCCL kernels still waiting for a peer keep
 * the module's stream, and through before_compute's event the kernels' stream, busy:
 * the caller's next synchronising call (stage.c's kn_free, which synchronises the
 * kernels' stream) would then hang unless the control thread happened to abort. A
 * failed module never recovers, so nothing is lost. */
static int failed(nccl_xport *x, const char *err)
{
    pl_nccl_abort(x->n, err && *err ? err : "nccl xport: failed");
    return -1;
}

static int x_p2p(void *ctx, const pl_xport_op *ops, int nops, char *err, size_t errlen)
{
    nccl_xport *x = ctx;
    if (nops <= 0) return 0;
    if (nops > PL_NCCL_MAX_OPS) {
        pl_errf(err, errlen, "nccl xport: %d operations in one group (most %d)", nops,
                PL_NCCL_MAX_OPS);
        return failed(x, err);
    }
    pl_nccl_p2p local[4], *p = nops <= 4 ? local : malloc((size_t)nops * sizeof *p);
    if (!p) {
        pl_errf(err, errlen, "nccl xport: out of memory");
        return failed(x, err);
    }
    for (int i = 0; i < nops; i++)
        p[i] = (pl_nccl_p2p){ops[i].peer, ops[i].send, ops[i].data, ops[i].count};
    int rc = pl_nccl_p2p_batch(x->n, p, nops, PL_XPORT_NCCL_ENQUEUE_MS, err, errlen);
    if (p != local) free(p);
    return rc ? failed(x, err) : 0;
}

static int x_allreduce(void *ctx, const int32_t *group, int group_size, float *const *bufs,
                       const size_t *counts, int nbufs, char *err, size_t errlen)
{
    nccl_xport *x = ctx;
    if (pl_nccl_group_allreduce(x->n, group, group_size, bufs, counts, nbufs,
                                PL_XPORT_NCCL_ENQUEUE_MS, err, errlen))
        return failed(x, err);
    return 0;
}

/* The module's stream waits for the kernels queued so far. */
static int x_after_compute(void *ctx, char *err, size_t errlen)
{
    nccl_xport *x = ctx;
    cudaError_t e = cudaEventRecord(x->ev_compute, x->compute);
    if (e != cudaSuccess) {
        cuda_fail(err, errlen, "cudaEventRecord (compute)", e);
        return failed(x, err);
    }
    if (pl_nccl_wait_event(x->n, x->ev_compute, err, errlen)) return failed(x, err);
    return 0;
}

/* The kernels' stream waits for the NCCL operations queued so far. */
static int x_before_compute(void *ctx, char *err, size_t errlen)
{
    nccl_xport *x = ctx;
    if (pl_nccl_record_event(x->n, x->ev_comm, err, errlen)) return failed(x, err);
    cudaError_t e = cudaStreamWaitEvent(x->compute, x->ev_comm, 0);
    if (e != cudaSuccess) {
        cuda_fail(err, errlen, "cudaStreamWaitEvent (compute)", e);
        return failed(x, err);
    }
    return 0;
}

static int x_wait(void *ctx, int timeout_ms, char *err, size_t errlen)
{
    nccl_xport *x = ctx;
    return pl_nccl_wait(x->n, timeout_ms, err, errlen) ? failed(x, err) : 0;
}

int pl_xport_nccl(pl_nccl *n, kn_ctx *k, pl_xport *x, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    void *stream = kn_stream_handle(k);
    if (!stream)
        return pl_errf(err, errlen, "nccl xport: the kernels (%s) have no CUDA stream",
                       kn_backend(k));
    nccl_xport *c = calloc(1, sizeof *c);
    if (!c) return pl_errf(err, errlen, "nccl xport: out of memory");
    cudaError_t e = cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ev_comm, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        if (c->ev_compute) cudaEventDestroy(c->ev_compute);
        free(c);
        return cuda_fail(err, errlen, "cudaEventCreate", e);
    }
    c->n = n;
    c->compute = (cudaStream_t)stream;
    *x = (pl_xport){.ctx = c,
                    .self = pl_nccl_rank(n),
                    .nranks = pl_nccl_nranks(n),
                    .p2p = x_p2p,
                    .allreduce = x_allreduce,
                    .after_compute = x_after_compute,
                    .before_compute = x_before_compute,
                    .wait = x_wait};
    return 0;
}

void pl_xport_nccl_free(pl_xport *x)
{
    nccl_xport *c = x->ctx;
    if (c) {
        cudaEventDestroy(c->ev_compute);
        cudaEventDestroy(c->ev_comm);
        free(c);
    }
    memset(x, 0, sizeof *x);
}
