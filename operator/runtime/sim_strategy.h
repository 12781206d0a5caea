/* Recovery strategies of the simulator (`pliant simulate --strategy`): what differs
 * between them, behind one interface so that another (Bamboo's redundant computation)
 * plugs in beside them. A strategy sets the coordinator's recovery path (its
 * configuration: the same state machine `pliant run` drives) and the time of a
 * pipeline's step (the planner's cost model, plus the strategy's own overhead, e.g.
 * redundant computation's). Strategies are static tables: nothing to free. */
#ifndef PLIANT_SIM_STRATEGY_H
#define PLIANT_SIM_STRATEGY_H

#include <stdint.h>

#include "coordinator.h"
#include "sim_costs.h"

typedef struct {
    const char *name;                          /* as --strategy names it */
    void (*configure)(pl_coord_config *cc);    /* the coordinator's recovery path */
    int64_t (*pipeline_ns)(const pl_sim_costs *k, int nnodes, int64_t microbatches);
} pl_sim_strategy;

/* The strategy of that name, or NULL. */
const pl_sim_strategy *pl_sim_strategy_find(const char *name);
/* Every strategy in order (i from 0; NULL past the last). */
const pl_sim_strategy *pl_sim_strategy_at(int i);

#endif
