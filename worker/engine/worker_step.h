/* The worker's share of one distributed training step (docs/runtime.md, "One step";
 * ARCHITECTURE.md, "Steps are atomic"):
 *
 *   pl_worker_step   run this rank's stage over its pipeline's microbatches and
 *                    all-reduce (SUM) the gradients of every sync group the rank belongs
 *                    to, in the rank's order from pl_syncgroups, each as soon as the
 *                    stage's last backward has finished its layer (Oobleck §6.1), and
 *                    return the rank's share of the global Σgrad² and (last stages) the
 *                    loss sum;
 *   (coordinator)    sums the shares of all ranks into the global norm², answers
 *                    commit {grad_scale = min(1, clip / norm), lr};
 *   pl_worker_apply  AdamW with that scale.
 *
 * Nothing changes parameters before pl_worker_apply, so a step aborted after
 * pl_worker_step is simply dropped (the next pl_worker_step zeroes the gradients). */
#ifndef PLIANT_WORKER_STEP_H
#define PLIANT_WORKER_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "allreduce.h"
#include "engine.h"
#include "frc.h"
#include "schedule.h"
#include "shadow.h"
#include "stage.h"
#include "syncgroups.h"

typedef struct {
    pl_engine *engine;               /* this rank's stage */
    const pl_schedule *schedule;     /* its 1F1B schedule for the pipeline's microbatch count */
    const pl_stage_link *link;       /* to the neighbouring stages of the pipeline */
    /* The whole step's microbatches, global_micro · B · T tokens each: the pipeline runs
     * microbatches [first_micro, first_micro + schedule->nmicro). Only the stage with the
     * embedding reads tokens and only the stage with the head reads targets (the other
     * may be NULL). */
    const int32_t *tokens, *targets;
    int first_micro;
    int global_micro;                /* microbatches of the step, all pipelines */
    const pl_syncgroups *groups;     /* of the current plan */
    const pl_peer_table *peers;      /* peers->self is this rank; conn[r] for every group peer */
    uint32_t step;                   /* mixed into the all-reduce tags */
    int timeout_ms;                  /* all-reduce idle timeout (with xport: the deadline
                                        of the wait at the end) */
    pl_ar_pack *pack;                /* the comm thread's pack buffer, kept between steps
                                        (allreduce.h); NULL: one a group */
    /* Fault injection for recovery tests: called on the comm thread before the
     * all-reduce of each group shared with other ranks. NULL: none. */
    void (*before_reduce)(void *ctx, int key);
    /* The same, before each op of the stage's schedule (pl_stage_batch.before_op). */
    void (*before_op)(void *ctx, int backward, int mb);
    void *hook_ctx;
    /* The ordered transport (xport.h: NCCL on GPU workers, docs/nccl.md "The step on
     * NCCL"), or NULL for the TCP path above (link, peers, a comm thread). With it, link
     * and peers are not used, the rank is xport->self, the sync groups' ranks are world
     * ranks, and before_reduce runs on the calling thread before each shared group's
     * all-reduce is enqueued. */
    const pl_xport *xport;
    /* With xport: the world rank of each stage of this pipeline (schedule->nstages);
     * NULL: consecutive ranks, stage k at self − stage + k (the plan's rank order,
     * pipelines flattened). */
    const int *stage_ranks;
    /* Redundant layers (shadow.h; Bamboo §5.1), TCP path only. With rc ≠ PL_RC_NONE and a
     * pipeline of ≥ 2 stages: the comm thread sends each sync group's reduced gradients
     * to the stage that shadows this one (pl_shadow_holder) over link as soon as the
     * group is reduced, and, when the stage shadows one (pl_shadow_successor), the step
     * ends by receiving that stage's into shadow (its engine, not NULL then). The caller
     * applies the commit to shadow too (pl_worker_apply). Nothing else of the step
     * changes: its sums are those of rc = PL_RC_NONE, bit for bit. */
    pl_rc_layout rc;
    pl_engine *shadow;
    /* With a shadow: eager forward redundant computation (frc.h; Bamboo §5.2), the
     * shadow's forward on this stage's outputs in the schedule's waits, its results
     * swapped to host memory; it needs tokens (targets) when the shadow has the
     * embedding (head). 0: lazy, none. The step's sums do not change. */
    int frc;
} pl_worker_step_args;

typedef struct {
    double grad_sumsq;  /* Σgrad² (after the all-reduce) of the groups whose lowest rank is
                           this one: every tensor counted by exactly one rank */
    double loss_sum;    /* with the head: Σ of the pipeline's microbatch mean losses; else 0 */
    int has_loss;       /* the stage holds the head */
    int overlapped;     /* groups of ≥ 2 ranks whose all-reduce started while the stage
                           was still running: the sync hidden behind the backward */
    pl_frc_stats frc;   /* with args.frc: the FRCs run in waits and exposed */
    double shadow_recv_ms; /* with a shadow: receiving its gradients after the stage (the
                              part of their transfer the step did not hide; without the
                              FRC that filled that wait) */
} pl_worker_step_result;

/* Zeroes the gradients and runs the stage with dloss_scale = 1 / (global_micro · B · T)
 * while a communication thread runs the sync groups' all-reduces, each group once the
 * stage's last backward has finished its layer (wte: layer 0 with the embedding, else
 * the head). That thread is the only user of the peers' connections during the call
 * and uses neither OpenMP nor the kernels; the compute thread copies gradients to and
 * from host memory on backends other than the CPU's. The sums are the same as
 * reducing after the stage, bit for bit. Group key l (0 .. L+1) covers every tensor of
 * layer l the engine holds except wte; PL_SYNC_WTE covers the wte tensor (the
 * embedding's, or the head-only stage's copy). Returns 0, or −1 with err (stage link or
 * transport failure: the step must be aborted; a link failure stops the sync at the
 * next group, a transport failure is reported once the stage is over). */
int pl_worker_step(const pl_worker_step_args *a, pl_worker_step_result *out, char *err,
                   size_t errlen);
/* With a->xport, the same step on ONE ordered queue of transport operations, no thread:
 * the stage in paired mode (pl_stage_step_xport); during its last backward, as each
 * layer finishes, after_compute and the all-reduce of the layer's groups, in the rank's
 * pl_syncgroups order; the tied-wte group only AFTER the stage's final send (enqueued
 * with the head's layer, a head-only stage's wte all-reduce would sit before the
 * gradient that stage 0 needs to ever reach its own: a deadlock); then wait
 * (a->timeout_ms) and Σgrad². Sums are in the transport's order (NCCL's, not the TCP
 * ring's). On −1 the transport may still hold operations on the engine's buffers: abort
 * it (xport.h). */

/* The tensors (in engine order) a sync group key covers on this engine; returns their
 * number (0 when the engine holds none). refs needs room for PL_MAX_LAYER_TENSORS. */
int pl_worker_group_tensors(const pl_engine *e, int key, pl_tensor_ref *refs);

/* After the coordinator's commit: one AdamW step t (1-based) with the gradients scaled by
 * grad_scale (clipping) and o->lr the committed learning rate. */
void pl_worker_apply(pl_engine *e, const pl_adamw *o, float grad_scale, int t);

#endif
