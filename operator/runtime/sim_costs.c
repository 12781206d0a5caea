/* The simulator's cost model (sim_costs.h). */
#include "sim_costs.h"

#include <stdlib.h>

#include "rc_plan.h"

/* 1 when the node bounds layers[0..nnodes] are template t's (node j's first stage begins at
 * layers[j], its last stage ends at layers[nnodes]). */
static int is_template_layout(const pl_template *t, int nnodes, const int *layers)
{
    for (int s = 0, j = 0; s < t->nstages; s++) {
        if (s > 0 && t->stages[s].node == t->stages[s - 1].node) continue;
        if (j >= nnodes || t->stages[s].layer_begin != layers[j++]) return 0;
    }
    return layers[nnodes] == t->stages[t->nstages - 1].layer_end;
}

/* The step of template t with mb microbatches, with RC's overhead when rc. */
static int64_t step_ns(const pl_sim_costs *k, const pl_template *t, int64_t mb, int rc)
{
    pl_rc_cost c;
    if (!rc) return pl_template_time(t, mb);
    return pl_rc_evaluate(k->profile, t, k->frc_eager, mb, &c) ? -1 : c.iteration_ns;
}

int64_t pl_sim_pipeline_ns(const pl_sim_costs *k, int nnodes, const int *layers, int64_t mb,
                           int rc)
{
    if (nnodes < 1 || mb < 1) return -1;
    const pl_template *t = pl_template_for(k->templates, nnodes);
    if (t && is_template_layout(t, nnodes, layers)) return step_ns(k, t, mb, rc);
    pl_profile p = *k->profile; /* shares the layers: never freed */
    p.gpu_memory_bytes = INT64_MAX / 2;
    pl_template own = {.nodes = nnodes, .feasible = 1, .nstages = nnodes,
                       .stages = calloc((size_t)nnodes, sizeof(pl_stage))};
    if (!own.stages) return -1;
    for (int j = 0; j < nnodes; j++)
        own.stages[j] = (pl_stage){.layer_begin = layers[j], .layer_end = layers[j + 1],
                                   .node = j, .gpus = p.gpus_per_node};
    int64_t ns = pl_template_evaluate(&p, &own) ? -1 : step_ns(k, &own, mb, rc);
    free(own.stages);
    return ns;
}

int64_t pl_sim_state_bytes(const pl_sim_costs *k, int b, int e)
{
    return pl_profile_state_bytes(k->profile, b, e);
}

int64_t pl_sim_copy_ns(const pl_sim_costs *k, int64_t bytes)
{
    return bytes > 0 ? pl_transfer_ns(bytes, k->profile->inter_node_GBps) : 0;
}

int64_t pl_sim_storage_ns(const pl_sim_costs *k, int64_t bytes)
{
    return bytes > 0 ? pl_transfer_ns(bytes, k->storage_GBps) : 0;
}

int64_t pl_sim_work_ns(const pl_sim_costs *k, int b, int e, int64_t mb)
{
    int64_t ns = 0;
    for (int l = b < 0 ? 0 : b; l < e && l < k->profile->nlayers; l++)
        ns += k->profile->layers[l].fwd_ns[0] + k->profile->layers[l].bwd_ns[0];
    return ns * mb;
}

int64_t pl_sim_sync_ns(const pl_sim_costs *k, int replicas)
{
    int64_t hops = replicas > 1 ? 2 * (int64_t)(replicas - 1) : 0;
    return (hops + 4) * k->latency_ns;
}
