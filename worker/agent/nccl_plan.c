/* The NCCL side of a worker's plan (nccl_plan.h). */
#include "nccl_plan.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

#ifdef PLIANT_NCCL

#include <cuda_runtime_api.h>

#include "nccl_comm.h"
#include "nccl_xport.h"

struct pl_nccl_plan {
    pl_nccl *n;
    pl_xport x;
};

int pl_nccl_plan_supported(kn_ctx *k, char *why, size_t whylen)
{
    if (strcmp(kn_backend(k), "cuda")) {
        pl_errf(why, whylen, "the kernels run on the %s", kn_backend(k));
        return 0;
    }
    return 1;
}

int pl_nccl_plan_make_id(char *out, size_t outlen, char *err, size_t errlen)
{
    return pl_nccl_make_id(out, outlen, err, errlen);
}

/* The distinct member sets of g in first-use order (pl_sync_group.set), the list
 * every rank passes to pl_nccl_prepare_groups in the same order. */
static int prepare_sets(pl_nccl *n, const pl_syncgroups *g, int timeout_ms, char *err,
                        size_t errlen)
{
    const int **sets = calloc((size_t)g->nsets + 1, sizeof *sets);
    int *sizes = calloc((size_t)g->nsets + 1, sizeof *sizes);
    int rc = -1, ns = 0;
    if (!sets || !sizes) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    for (int i = 0; i < g->ngroups; i++)
        if (g->groups[i].set == ns && ns < g->nsets) {
            sets[ns] = g->groups[i].ranks;
            sizes[ns++] = g->groups[i].nranks;
        }
    rc = pl_nccl_prepare_groups(n, sets, sizes, ns, timeout_ms, err, errlen);
out:
    free(sets);
    free(sizes);
    return rc;
}

int pl_nccl_plan_open(kn_ctx *k, const char *id, int nranks, int rank, const pl_syncgroups *g,
                      int timeout_ms, int (*cancel)(void *), void *cancel_ctx,
                      pl_nccl_plan **out, char *err, size_t errlen)
{
    *out = NULL;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return pl_errf(err, errlen, "cudaGetDevice: %s", cudaGetErrorString(e));
    pl_nccl_plan *p = calloc(1, sizeof *p);
    if (!p) return pl_errf(err, errlen, "out of memory");
    if (pl_nccl_create_cancel(id, nranks, rank, dev, timeout_ms, cancel, cancel_ctx, &p->n, err,
                              errlen) ||
        prepare_sets(p->n, g, timeout_ms, err, errlen) ||
        pl_xport_nccl(p->n, k, &p->x, err, errlen)) {
        pl_nccl_plan_close(p);
        return -1;
    }
    *out = p;
    return 0;
}

const pl_xport *pl_nccl_plan_xport(pl_nccl_plan *p) { return &p->x; }

void pl_nccl_plan_abort(pl_nccl_plan *p, const char *reason)
{
    if (p && p->n) pl_nccl_abort(p->n, reason);
}

void pl_nccl_plan_close(pl_nccl_plan *p)
{
    if (!p) return;
    pl_xport_nccl_free(&p->x);
    pl_nccl_destroy(p->n);
    free(p);
}

#else /* a build without NCCL */

struct pl_nccl_plan {
    int unused;
};

int pl_nccl_plan_supported(kn_ctx *k, char *why, size_t whylen)
{
    (void)k;
    pl_errf(why, whylen, "this build has no NCCL (make cuda)");
    return 0;
}

int pl_nccl_plan_make_id(char *out, size_t outlen, char *err, size_t errlen)
{
    if (outlen) out[0] = 0;
    return pl_errf(err, errlen, "this build has no NCCL (make cuda)");
}

int pl_nccl_plan_open(kn_ctx *k, const char *id, int nranks, int rank, const pl_syncgroups *g,
                      int timeout_ms, int (*cancel)(void *), void *cancel_ctx,
                      pl_nccl_plan **out, char *err, size_t errlen)
{
    (void)k, (void)id, (void)nranks, (void)rank, (void)g, (void)timeout_ms, (void)cancel,
        (void)cancel_ctx;
    *out = NULL;
    return pl_errf(err, errlen, "this build has no NCCL (make cuda)");
}

const pl_xport *pl_nccl_plan_xport(pl_nccl_plan *p)
{
    (void)p;
    return NULL;
}

void pl_nccl_plan_abort(pl_nccl_plan *p, const char *reason)
{
    (void)p, (void)reason;
}

void pl_nccl_plan_close(pl_nccl_plan *p)
{
    (void)p;
}

#endif
