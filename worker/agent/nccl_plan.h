/* The NCCL side of a worker's plan (docs/nccl.md "What the runtime calls, and when"):
 * for a plan whose transport is "nccl", the world communicator of its ranks made
 * from the id that rank 0 creates (nccl_root) and the coordinator hands to every
 * rank (nccl_init), one communicator per distinct sync-group member set, and the
 * ordered transport (worker/comm/xport.h) the worker step runs on.
 *
 * Built twice, like kernels/kernels.c: in the CPU build (and everywhere without
 * PLIANT_NCCL) every function says NCCL is not there, so the agent needs no #ifdef;
 * `make cuda` builds it with PLIANT_NCCL into the engine library of pliant-cuda. */
#ifndef PLIANT_NCCL_PLAN_H
#define PLIANT_NCCL_PLAN_H

#include <stddef.h>

#include "kernels.h"
#include "syncgroups.h"
#include "xport.h"

typedef struct pl_nccl_plan pl_nccl_plan;

/* 1 when this worker can run the NCCL transport: a build with NCCL and kernels on a
 * GPU. Else 0, with the reason in why. */
int pl_nccl_plan_supported(kn_ctx *k, char *why, size_t whylen);

/* Rank 0's id for the plan (hex, PL_PROTO_NCCL_ID_HEX digits + NUL in out). */
int pl_nccl_plan_make_id(char *out, size_t outlen, char *err, size_t errlen);

/* Joins the plan's world as `rank` of `nranks` on the kernels' device and splits
 * the communicators of g's member sets (the same on every rank: g comes from the
 * plan). Waits at most timeout_ms for every rank, and gives up as soon as
 * cancel(cancel_ctx) returns nonzero (polled by the calling thread while it waits
 * for other ranks, also later during the plan's steps; NULL: never; ctx must
 * outlive the plan): a newer plan must not wait for a rank that died before
 * joining. 0, or −1 with err. */
int pl_nccl_plan_open(kn_ctx *k, const char *id, int nranks, int rank, const pl_syncgroups *g,
                      int timeout_ms, int (*cancel)(void *), void *cancel_ctx,
                      pl_nccl_plan **out, char *err, size_t errlen);

/* The ordered transport of the plan for pl_worker_step. */
const pl_xport *pl_nccl_plan_xport(pl_nccl_plan *p);

/* Stops everything in flight (a peer died, the step is aborted): a step blocked in
 * NCCL returns an error. Thread-safe (the control thread calls it). */
void pl_nccl_plan_abort(pl_nccl_plan *p, const char *reason);

/* Frees the plan's communicators. NULL is a no-op. */
void pl_nccl_plan_close(pl_nccl_plan *p);

#endif
