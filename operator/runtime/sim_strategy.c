/* The simulator's strategies (sim_strategy.h): templates (Oobleck: re-instantiation with
 * layer copies from survivors, a checkpoint only on a fatal loss) and checkpoint (every
 * membership change restarts every worker from the newest checkpoint). */
#include "sim_strategy.h"

#include <string.h>

static void templates_configure(pl_coord_config *cc) { cc->strategy_checkpoint = 0; }
static void checkpoint_configure(pl_coord_config *cc) { cc->strategy_checkpoint = 1; }

static const pl_sim_strategy strategies[] = {
    {"templates", templates_configure, pl_sim_pipeline_ns},
    {"checkpoint", checkpoint_configure, pl_sim_pipeline_ns},
};
#define NSTRATEGIES ((int)(sizeof strategies / sizeof strategies[0]))

const pl_sim_strategy *pl_sim_strategy_find(const char *name)
{
    for (int i = 0; name && i < NSTRATEGIES; i++)
        if (!strcmp(strategies[i].name, name)) return &strategies[i];
    return NULL;
}

const pl_sim_strategy *pl_sim_strategy_at(int i)
{
    return i >= 0 && i < NSTRATEGIES ? &strategies[i] : NULL;
}
