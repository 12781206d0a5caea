/* Node time of a job's worker Pods and its price (job_cost.h). */
#include "job_cost.h"

void pl_pod_clock_set(pl_pod_clock *pc, int running, int64_t now_ms, int64_t *closed_ms)
{
    if (running && pc->since_ms <= 0) {
        pc->since_ms = now_ms > 0 ? now_ms : 1;
    } else if (!running && pc->since_ms > 0) {
        *closed_ms += pl_pod_clock_open_ms(pc, now_ms);
        pc->since_ms = 0;
    }
}

int64_t pl_pod_clock_open_ms(const pl_pod_clock *pc, int64_t now_ms)
{
    return pc->since_ms > 0 && now_ms > pc->since_ms ? now_ms - pc->since_ms : 0;
}

int pl_job_cost_enabled(const pl_cost_spec *spec)
{
    return spec->spot > 0 || spec->on_demand > 0;
}

pl_job_cost pl_job_cost_of(const pl_cost_spec *spec, int64_t node_ms, double samples)
{
    pl_job_cost c = {.node_hours = (double)node_ms / 3.6e6};
    c.dollars = c.node_hours * spec->spot;
    c.on_demand_dollars = c.node_hours * spec->on_demand;
    c.samples_per_dollar = c.dollars > 0 ? samples / c.dollars : 0;
    return c;
}
