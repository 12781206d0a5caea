/* The simulator's cost model (sim_costs.h). */
#include "sim_costs.h"

int64_t pl_sim_pipeline_ns(const pl_sim_costs *k, int nnodes, int64_t mb)
{
    const pl_template *t = pl_template_for(k->templates, nnodes);
    return t && mb > 0 ? pl_template_time(t, mb) : -1;
}

int64_t pl_sim_state_bytes(const pl_sim_costs *k, int b, int e)
{
    int64_t bytes = 0;
    for (int l = b < 0 ? 0 : b; l < e && l < k->profile->nlayers; l++)
        bytes += 3 * k->profile->layers[l].param_bytes;
    return bytes;
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
