/* Simulated workers (`pliant simulate`, docs/simulate.md): what the workers of a job
 * answer the coordinator, at the simulated times the cost model gives, instead of
 * doing it. Worker i runs on trace node i and is named "node<i>". Each message the
 * coordinator sends (pl_coord_next) is delivered here; the answers become timed events
 * in the queue, which the simulator turns back into coordinator events
 * (pl_sim_workers_fire) when their time comes:
 *   plan        → copy_done after its checkpoint load + layer copies + the refill of its
 *                 shadow where it cannot keep it (redundant) (idle: at once)
 *   start_step  → report + reduced at the end of the step, for every worker of the step at
 *                 once when the slowest pipeline is done (the step in flight:
 *                 pl_sim_workers_schedule, pl_sim_workers_step_done)
 *   commit      → committed at once; with save, saved after writing its layers
 *   save        → saved after writing its layers
 *   complete_checkpoint → checkpoint_done at once
 *   stop        → the worker is gone
 * Single-threaded; the caller owns the queue and the coordinator. */
#ifndef PLIANT_SIM_WORKERS_H
#define PLIANT_SIM_WORKERS_H

#include <stdint.h>

#include "coordinator.h"
#include "sim_costs.h"
#include "sim_queue.h"
#include "sim_strategy.h"

typedef enum { PL_SIM_W_NONE = 0, PL_SIM_W_STARTING, PL_SIM_W_LIVE, PL_SIM_W_GONE } pl_sim_w_state;

/* A shadow (strategy redundant): layers [begin, end) after `step` committed steps (−1:
 * unknown); end 0: none. */
typedef struct {
    int begin, end;
    int64_t step;
} pl_sim_shadow;

typedef struct {
    pl_sim_w_state state;
    int64_t step_ns;          /* its pipeline's step under its plan; 0: idle */
    int layer_begin, layer_end;
    int stage;                /* its stage in its pipeline */
    int64_t work_ns;          /* its layers' compute for its pipeline's microbatches */
    int started;              /* start_step came since the last pl_sim_workers_schedule */
    pl_sim_shadow shadow;     /* its plan's shadow, and the stable plan's until start_step, */
    pl_sim_shadow shadow_src; /* as the worker keeps them (docs/redundant.md) */
} pl_sim_worker;

/* The step the workers run now: started at start_ns, its reports due at end_ns (the
 * slowest pipeline), placed among the queue's events of that time by seq. */
typedef struct {
    int active;
    int64_t gen, step, start_ns, step_ns, end_ns;
    uint64_t seq;
    int *nodes;               /* its workers, in the order start_step reached them */
    int n;
} pl_sim_flight;

typedef struct {
    const pl_sim_costs *costs;
    const pl_sim_strategy *strategy;
    pl_sim_queue *queue;
    pl_sim_worker *w;
    int n;                    /* nodes 0..n−1 */
    int *started;             /* nodes with started set */
    int nstarted;
    int64_t start_gen, start_step; /* of the newest start_step */
    pl_sim_flight flight;
    /* the newest plan generation delivered: its longest checkpoint load, layer copy and
     * pipeline step over its workers */
    int64_t plan_gen, plan_load_ns, plan_copy_ns, plan_step_ns;
    int plan_workers;         /* its workers in a pipeline */
} pl_sim_workers;

/* n nodes, all NONE. 0, or -1 when memory ran out. */
int pl_sim_workers_init(pl_sim_workers *s, int n, const pl_sim_costs *k,
                        const pl_sim_strategy *st, pl_sim_queue *q);
void pl_sim_workers_free(pl_sim_workers *s);

void pl_sim_worker_name(int node, char *buf, int len);
/* The node of a worker name, or -1. */
int pl_sim_worker_node(const pl_sim_workers *s, const char *name);

/* A message of the coordinator to worker `to`, at now_ns: 0, or -1 (out of memory). */
int pl_sim_workers_deliver(pl_sim_workers *s, const char *to, const pl_msg *m, int64_t now_ns);
/* The workers that started a step since the last call make it the step in flight
 * (replacing the one before, whose reports the coordinator would ignore): 0. */
int pl_sim_workers_schedule(pl_sim_workers *s, int64_t now_ns);
/* The step in flight went on by `done` steps the coordinator committed without messages
 * (pl_coord_skip_steps, quiet): the next one starts at now_ns. */
void pl_sim_workers_skipped(pl_sim_workers *s, int64_t done, int64_t now_ns);
/* The step in flight ended: every live worker of it reports (report + reduced). */
void pl_sim_workers_step_done(pl_sim_workers *s, pl_coord *c);
/* A worker's answer whose time came (COPY_DONE, COMMITTED, SAVED, CKPT_DONE), given to
 * the coordinator when the worker still lives. */
void pl_sim_workers_fire(pl_sim_workers *s, pl_coord *c, const pl_sim_event *e);

#endif
