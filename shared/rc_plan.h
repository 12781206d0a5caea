/* The planner for strategy redundant (Bamboo, NSDI '23 §4–§5; docs/redundant.md).
 *
 * With redundant computation each stage k also holds its successor's layers, the
 * shadow (§5.1, the ring: stage (k + 1) mod S's, the last stage holding the first's;
 * what the worker does, worker/engine/shadow.h).
 *
 * Memory of stage k on its d GPUs, per GPU: its own 4·P + (S − k)·A (the templates'
 * model) plus the shadow's 4·P_succ (parameters, gradient, AdamW m and v) and one
 * microbatch of the successor's activations A_succ, the slot a forward redundant
 * computation (FRC) runs in before its results go to host memory (§5: "Bamboo swaps
 * out the intermediate results of each node's FRC into the node's CPU memory").
 *
 * Time of a step of nb microbatches: the pipeline's T(nb) (templates.h), plus
 *  - eager FRC (§5.2): stage k runs the successor's forward on each of its nb outputs,
 *    nb·F_succ, in its bubbles first: 1F1B leaves it idle for T(nb) − nb·W_k; what
 *    does not fit is exposed (Bamboo overlaps it with normal work, the planner counts
 *    it as added time: an upper bound). The step grows by the largest exposed part.
 *    Lazy FRC: nothing in failure-free steps (§5.2: lazy-FRC-lazy-BRC);
 *  - the shadow's gradient: each stage sends its reduced gradients (its own P bytes, at
 *    the inter-node bandwidth) to the stage that shadows it once its schedule is over;
 *    what 1F1B's cool-down after that stage (the last microbatch's backward on every
 *    stage before it) does not hide adds to the step, the largest such part. Stage 0's,
 *    to the last stage over the ring's wrap, ends the step: nothing hides it.
 *
 * Choosing pipelines: the template DP's memory term is per stage, and a stage's need
 * with RC depends on the next stage's range, so the exact DP does not apply as is.
 * pl_templates_plan_rc runs it under smaller memory budgets (fractions of the GPU's)
 * and keeps, for each node count, the layout with the smallest RC step time that
 * fits with RC: always feasible, not proven optimal. Deeper pipelines than the
 * templates' are the expected outcome (§4: Bamboo's pipelines are about 1.5× deeper).
 *
 * Pure functions; no state. */
#ifndef PLIANT_RC_PLAN_H
#define PLIANT_RC_PLAN_H

#include <stdint.h>

#include "profile.h"
#include "templates.h"

typedef struct {
    int64_t memory_bytes;    /* max over stages of per-GPU bytes with the shadow */
    int64_t frc_ns;          /* max over stages of the step's FRC, nb·F_succ (eager) */
    int64_t exposed_frc_ns;  /* the FRC the bubbles do not hide (max over stages) */
    int64_t shadow_sync_ns;  /* the largest shadow-gradient transfer's exposed part */
    int64_t iteration_ns;    /* T(nb) + exposed_frc_ns + shadow_sync_ns */
    int fits;                /* memory_bytes within the GPU's memory on every stage */
} pl_rc_cost;

/* The stage whose layers stage k of S shadows, (k + 1) mod S, or −1 (one stage). */
int pl_rc_successor(int stage, int nstages);

/* The stage that holds stage k's layers as its shadow, (k − 1) mod S, or −1 (one
 * stage): the inverse of pl_rc_successor, as the worker lays it out. */
int pl_rc_holder(int stage, int nstages);

/* Failover without copies (Bamboo §4 "redundant computation", §5.2 failover): the
 * pipeline of n stages with bounds layers[0..n] (stage j runs [layers[j],
 * layers[j+1])) after the stages with lost[j] set are gone. keep[0..*nkeep) receives
 * the surviving stages' indices in their new order, out[0..*nkeep] their bounds.
 *  - A lost stage j > 0: its holder j − 1 runs the union [b_{j−1}, b_{j+1}) (with 2
 *    stages and stage 0 lost, stage 1 runs [0, L)).
 *  - Stage 0 lost with n ≥ 3: its holder is the last stage, whose own range is not
 *    next to [0, b1), and a worker runs one contiguous range. Bamboo's shadow node runs
 *    the victim's schedule beside its own (§5.2 "Lazy BRC and Recovery"); here the
 *    same layers move one stage along the ring instead: the last stage becomes the
 *    first and runs [0, b1) from its shadow, stage n − 2 runs its own layers and the
 *    last stage's [b_{n−1}, L) from its shadow, the stages between keep theirs. Every
 *    layer still comes from a local copy and runs in order; the merged stage is n − 2,
 *    not the last one. Stage n − 2 must survive too.
 * Returns 1 when that covers every lost stage (0 lost: the pipeline as it is), 0 when
 * not (two stages consecutive on the ring; stage 0 with stage n − 2): then only copies
 * or a checkpoint can help. */
int pl_rc_failover(int n, const int *layers, const int *lost, int *keep, int *nkeep, int *out);

/* The RC cost of template t (its cost fields filled: pl_template_evaluate) with nb
 * microbatches; eager: FRC every step. 0, or −1 if t has no stages. */
int pl_rc_evaluate(const pl_profile *p, const pl_template *t, int eager, int64_t nb,
                   pl_rc_cost *out);

/* pl_templates_plan for strategy redundant: templates that fit with RC, for n0 (the
 * smallest n with one) .. nodes − tolerate·n0, each the fastest RC layout found
 * (nb = 4S, the templates' objective). Fails like pl_templates_plan. */
int pl_templates_plan_rc(const pl_profile *p, int nodes, int tolerate, int eager,
                         pl_template_set *out, char *err, size_t errlen);

#endif
