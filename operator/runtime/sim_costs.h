/* The simulator's cost model (`pliant simulate`, docs/simulate.md): how long what a
 * simulated worker does takes, from the job's planner profile and a few stated rates.
 * Pure functions over a borrowed profile and template set (they outlive the costs). */
#ifndef PLIANT_SIM_COSTS_H
#define PLIANT_SIM_COSTS_H

#include <stdint.h>

#include "profile.h"
#include "templates.h"

#define PL_SIM_DEFAULT_STORAGE_GBPS 1.0  /* checkpoint writes and reads, per node */
#define PL_SIM_DEFAULT_STARTUP_S 60.0    /* a new node until its worker registers */
#define PL_SIM_DEFAULT_NOTICE_S 30.0     /* preemption notice (GCP spot; EC2 gives 120 s) */

typedef struct {
    const pl_profile *profile;
    const pl_template_set *templates;
    double storage_GBps;   /* > 0 */
    int64_t startup_ns;    /* ≥ 0 */
    int64_t notice_ns;     /* ≥ 0; 0: preemptions come without notice */
    int cores;             /* > 0: every worker shares this many cores (one machine, as
                              `pliant run` runs them); 0: each node computes on its own */
    int64_t latency_ns;    /* one message between two workers or a worker and the
                              coordinator (≥ 0); 0: none */
    int64_t install_ns;    /* a worker installing a plan beyond copies and loads (engine,
                              connections; ≥ 0); 0: nothing */
    int frc_eager;         /* redundant computation: eager FRC (the job's redundantForward) */
} pl_sim_costs;

/* One pipeline's step with mb microbatches, node j of its nnodes running layers
 * [layers[j], layers[j + 1]), under the planner's cost model: the template for nnodes when
 * the layout is that template's (pl_template_time), else the layout itself with one stage
 * per node on all its GPUs (a redundant failover's merged stage), without the memory
 * check (the merged stage's memory held its shadow). rc: with redundant computation's
 * overhead (pl_rc_evaluate: the FRC the bubbles do not hide when frc_eager, the shadow's
 * gradient). -1: no such layout, or out of memory. */
int64_t pl_sim_pipeline_ns(const pl_sim_costs *k, int nnodes, const int *layers, int64_t mb,
                           int rc);
/* The compute of layers [b, e) for mb microbatches (forward + backward, one GPU). */
int64_t pl_sim_work_ns(const pl_sim_costs *k, int b, int e, int64_t mb);
/* What a step adds to its slowest pipeline in message latency: the gradient all-reduce
 * of each layer over its `replicas` pipelines (a ring: 2 (r − 1) messages one after the
 * other; its bytes are taken as overlapped with the backward) and the step's four control
 * messages (start_step, report, commit, committed). */
int64_t pl_sim_sync_ns(const pl_sim_costs *k, int replicas);
/* The training state of layers [b, e): weights and AdamW m and v (3 × param bytes). */
int64_t pl_sim_state_bytes(const pl_sim_costs *k, int b, int e);
/* Receiving bytes of layers from survivors over the profile's inter-node link. */
int64_t pl_sim_copy_ns(const pl_sim_costs *k, int64_t bytes);
/* Writing or reading bytes of a checkpoint at the storage bandwidth. */
int64_t pl_sim_storage_ns(const pl_sim_costs *k, int64_t bytes);

#endif
