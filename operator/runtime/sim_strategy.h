/* Recovery strategies of the simulator (`pliant simulate --strategy`): what differs
 * between them, behind one interface. A strategy names the planner its templates come
 * from, sets the coordinator's recovery path (its configuration: the same state machine
 * `pliant run` drives), the time of a pipeline's step (the planner's cost model, plus the
 * strategy's own overhead) and the shadow a worker holds beside its layers.
 * Strategies are static tables: nothing to free. */
#ifndef PLIANT_SIM_STRATEGY_H
#define PLIANT_SIM_STRATEGY_H

#include <stdint.h>

#include "coordinator.h"
#include "jobspec.h"
#include "sim_costs.h"

typedef struct {
    const char *name;                          /* as --strategy names it */
    pl_ft_strategy planner;                    /* whose templates: redundant's fit shadows
                                                  (pl_templates_plan_rc), the others' not */
    void (*configure)(pl_coord_config *cc);    /* the coordinator's recovery path */
    /* a step of the pipeline whose node j of nnodes runs [layers[j], layers[j + 1]) */
    int64_t (*pipeline_ns)(const pl_sim_costs *k, int nnodes, const int *layers, int64_t mb);
    /* the layers [*begin, *end) node `node` of that pipeline holds as its shadow (1), or
     * none (0): what a plan refills unless the worker keeps it (sim_workers.c) */
    int (*shadow)(int node, int nnodes, const int *layers, int *begin, int *end);
} pl_sim_strategy;

/* The strategy of that name, or NULL. */
const pl_sim_strategy *pl_sim_strategy_find(const char *name);
/* Every strategy in order (i from 0; NULL past the last). */
const pl_sim_strategy *pl_sim_strategy_at(int i);

#endif
