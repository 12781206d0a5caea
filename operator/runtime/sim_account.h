/* Where a simulated job's time went, and what it trained (`pliant simulate`,
 * docs/simulate.md "Time split"). The simulator calls pl_sim_account_advance before each
 * event (the interval since the last one is charged to the coordinator's phase during
 * it) and pl_sim_account_after after it (commits, aborts and the end of a copy phase
 * are classified). Wall time of the job, not node time:
 *   computing      steps that trained new samples
 *   reconfiguring  settling a burst of losses, and what a plan's install takes beyond
 *                  its copies and checkpoint load
 *   copying        layer copies from survivors (the longest of a plan's workers)
 *   redoing        steps computed again (after a rollback to a checkpoint) and the part
 *                  of a step lost to an abort
 *   waiting        too few workers for a plan (before the first one, or after losses)
 *   checkpointing  loading a checkpoint (saves run in the background, Pliant's writer)
 *   ended          the job failed or finished before the trace's end
 * Plus node time (billed: every node of the trace from its add to its removal), the time
 * below the minimum ((F+1)·n0 workers, spec.faultTolerance.belowMinimum): waiting for
 * nodes after a loss, and on a plan whose tolerance is below F (degraded), and per-bin
 * series for plots. Single-threaded; owns its bins. */
#ifndef PLIANT_SIM_ACCOUNT_H
#define PLIANT_SIM_ACCOUNT_H

#include <stdint.h>

#include "coordinator.h"

typedef enum {
    PL_SIM_T_COMPUTE = 0,
    PL_SIM_T_RECONFIG,
    PL_SIM_T_COPY,
    PL_SIM_T_REDO,
    PL_SIM_T_WAIT,
    PL_SIM_T_CKPT,
    PL_SIM_T_ENDED,
    PL_SIM_T_COUNT
} pl_sim_time_kind;

/* "computing", "reconfiguring", ... */
const char *pl_sim_time_kind_name(int k);

typedef struct {
    int64_t split_ns[PL_SIM_T_COUNT];
    int64_t node_ns;            /* Σ over nodes of their time in the cluster */
    int64_t new_steps;          /* steps that trained new samples (the high water mark) */
    int64_t below_wait_ns;      /* WAITING_FOR_NODES: too few workers after a loss (of waiting) */
    int64_t degraded_ns;        /* on a plan of a tolerance below F, neither waiting nor ended */
    /* internal */
    int64_t last_ns, step_ns, copy_phase_ns, high_water, last_step;
    pl_coord_phase_t phase;
    int nodes, workers, degraded;
    /* bins of bin_ns: new samples, node time, training-worker time */
    int nbins;
    int64_t bin_ns, global_batch;
    double *bin_samples, *bin_node_ns, *bin_worker_ns;
} pl_sim_account;

/* nbins bins over duration_ns; 0 or -1 (memory). */
int pl_sim_account_init(pl_sim_account *a, int64_t duration_ns, int nbins, int64_t global_batch);
void pl_sim_account_free(pl_sim_account *a);
/* Charges [last, now) to the phase the job was in; nodes, workers: counts during it. */
void pl_sim_account_advance(pl_sim_account *a, int64_t now_ns);
/* After an event: the coordinator's phase and step now, the live trace nodes and the
 * workers of the plan, and the newest plan's longest checkpoint load and layer copy. */
void pl_sim_account_after(pl_sim_account *a, pl_coord_phase_t phase, int64_t step, int nodes,
                          int workers, int64_t load_ns, int64_t copy_ns);

/* Whether the plan in place has a tolerance below F, from now until told otherwise. */
void pl_sim_account_degraded(pl_sim_account *a, int degraded);

/* The end of the trace: a step in flight counts as computing, a copy phase is split. */
void pl_sim_account_close(pl_sim_account *a, int64_t load_ns, int64_t copy_ns);

#endif
