/* `pliant simulate`'s engine (docs/simulate.md): replays a spot trace in simulated time
 * against the real coordinator state machine (coordinator.h) and planner, with
 * simulated workers (sim_workers.h) answering its messages at times from the cost model
 * (sim_costs.h), under one recovery strategy (sim_strategy.h). No clock, no thread, no
 * file: the same inputs give the same result.
 *
 * The coordinator is configured as `pliant run` configures it for the job
 * (pl_job_coord_config), except: the job never ends before the trace (steps = 2^31 − 1),
 * no evaluation, no resume, workers are never silent (losses come from the trace), and a
 * checkpoint directory is assumed when the job names none (checkpoints every
 * spec.checkpoint.every steps). Steps between disruptions are committed in one go
 * (pl_coord_skip_steps) so a long trace costs the events, not the steps. */
#ifndef PLIANT_SIMULATOR_H
#define PLIANT_SIMULATOR_H

#include <stddef.h>
#include <stdint.h>

#include "chaos.h"
#include "job_plan.h"
#include "jobspec.h"
#include "sim_account.h"
#include "sim_costs.h"
#include "sim_strategy.h"

typedef struct {
    const pl_job *job;
    const pl_job_plan *plan;          /* profile, templates, coverage for the trace's peak */
    const pl_sim_strategy *strategy;
    pl_sim_costs costs;               /* profile and templates: the plan's */
    const pl_trace_event *trace;      /* times from 0, sorted */
    int ntrace;
    int nbins;                        /* plot bins over the trace (0: 200) */
    /* zones the coordinator is told: node N registers in zone "zK", K =
     * pl_spot_trace_zone(N, zones); 0: no zone known (placement by rank) */
    int zones;
    /* one JSON object per line of the timeline (NUL-terminated, no newline); may be NULL */
    void (*timeline)(void *user, const char *json);
    void *user;
} pl_sim_config;

typedef struct {
    const char *strategy;
    int64_t duration_ns;              /* the trace's: its last event */
    int64_t steps;                    /* steps trained (each once) */
    int64_t samples;                  /* steps × global batch */
    pl_sim_account acct;              /* time split, node time, bins (owned) */
    int reconfigs, from_checkpoint;   /* plans after the first; of them, from a checkpoint */
    int64_t bytes_copied;
    char end_phase[32];               /* the coordinator's phase at the end */
    char reason[512];                 /* why it failed or waits, "" otherwise */
    int64_t step_ns;                  /* the step in flight at the end; 0: none */
} pl_sim_outcome;

/* Runs the simulation: 0, or -1 with err (a configuration the coordinator refuses, out of
 * memory). The result is filled on success; free it with pl_sim_outcome_free. */
int pl_sim_run(const pl_sim_config *cfg, pl_sim_outcome *res, char *err, size_t errlen);
void pl_sim_outcome_free(pl_sim_outcome *res);

/* The message latency (pl_sim_costs.latency_ns) at which cfg's job, failure-free on
 * `nodes` nodes from the start, steps in step_ns (a real step measured there: the
 * profile's pipeline_step): 0 when the step without latency is already that long. cfg's
 * trace is not used; its costs' latency is replaced. 0, or -1 with err (no step ran). */
int pl_sim_latency_for_step(const pl_sim_config *cfg, int nodes, int64_t step_ns,
                            int64_t *latency_ns, char *err, size_t errlen);

/* The highest node number of a trace + 1, and the most nodes live at once. */
void pl_sim_trace_nodes(const pl_trace_event *tr, int n, int *nodes, int *peak);

#endif
