/* The simulator's strategies (sim_strategy.h): templates (Oobleck: re-instantiation with
 * layer copies from survivors, a checkpoint only on a fatal loss), checkpoint (every
 * membership change restarts every worker from the newest checkpoint) and redundant
 * (Bamboo: each node also holds its successor's layers; docs/redundant.md). */
#include "sim_strategy.h"

#include <string.h>

#include "rc_plan.h"

static void templates_configure(pl_coord_config *cc)
{
    cc->strategy_checkpoint = 0;
    cc->strategy_redundant = 0;
}

static void checkpoint_configure(pl_coord_config *cc)
{
    cc->strategy_checkpoint = 1;
    cc->strategy_redundant = 0;
}

/* The coordinator's rc_failover: a loss whose stages' shadow holders survive keeps the
 * stable plan's pipelines with merged ranges and copies nothing (Bamboo §4, §5.2); two
 * losses consecutive on the ring, the first stage with the last but one, or a join with
 * them re-instantiate as templates do. */
static void redundant_configure(pl_coord_config *cc)
{
    cc->strategy_checkpoint = 0;
    cc->strategy_redundant = 1;
}

static int64_t plain_ns(const pl_sim_costs *k, int nnodes, const int *layers, int64_t mb)
{
    return pl_sim_pipeline_ns(k, nnodes, layers, mb, 0);
}

/* The step with RC's overhead: eager FRC not hidden by bubbles, the shadow's gradient. */
static int64_t redundant_ns(const pl_sim_costs *k, int nnodes, const int *layers, int64_t mb)
{
    return pl_sim_pipeline_ns(k, nnodes, layers, mb, 1);
}

static int no_shadow(int node, int nnodes, const int *layers, int *begin, int *end)
{
    return 0;
}

/* Each node holds its successor's layers, with their AdamW m, v (docs/redundant.md "The
 * shadow layers"). */
static int successor_shadow(int node, int nnodes, const int *layers, int *begin, int *end)
{
    const int succ = pl_rc_successor(node, nnodes);
    if (succ < 0) return 0;
    *begin = layers[succ];
    *end = layers[succ + 1];
    return 1;
}

static const pl_sim_strategy strategies[] = {
    {"templates", PL_STRATEGY_TEMPLATES, templates_configure, plain_ns, no_shadow},
    {"redundant", PL_STRATEGY_REDUNDANT, redundant_configure, redundant_ns, successor_shadow},
    {"checkpoint", PL_STRATEGY_TEMPLATES, checkpoint_configure, plain_ns, no_shadow},
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
