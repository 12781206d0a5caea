/* The planner's results as JSON, the `pliant plan` output format (plan_json.h). */
#include "plan_json.h"

double pl_ns_to_ms(int64_t ns)
{
    return (double)ns / 1e6;
}

cJSON *pl_template_to_json(const pl_template *t)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "nodes", t->nodes);
    cJSON_AddNumberToObject(o, "iteration_ms", pl_ns_to_ms(t->iteration_ns));
    cJSON_AddNumberToObject(o, "sum_stage_ms", pl_ns_to_ms(t->sum_stage_ns));
    cJSON_AddNumberToObject(o, "comm_ms", pl_ns_to_ms(t->comm_ns));
    cJSON_AddNumberToObject(o, "max_stage_ms", pl_ns_to_ms(t->max_stage_ns));
    cJSON_AddNumberToObject(o, "peak_memory_bytes", (double)t->peak_memory_bytes);
    cJSON *stages = cJSON_AddArrayToObject(o, "stages");
    for (int k = 0; k < t->nstages; k++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "layer_begin", t->stages[k].layer_begin);
        cJSON_AddNumberToObject(s, "layer_end", t->stages[k].layer_end);
        cJSON_AddNumberToObject(s, "node", t->stages[k].node);
        cJSON_AddNumberToObject(s, "gpus", t->stages[k].gpus);
        cJSON_AddItemToArray(stages, s);
    }
    return o;
}

cJSON *pl_instance_plan_to_json(const pl_instance_plan *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "nodes", e->nodes);
    cJSON_AddNumberToObject(o, "iteration_ms", pl_ns_to_ms(e->iteration_ns));
    cJSON_AddNumberToObject(o, "samples_per_second", e->samples_per_second);
    cJSON *pipes = cJSON_AddArrayToObject(o, "pipelines");
    for (int k = 0; k < e->npipelines; k++) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "template_nodes", e->pipelines[k].template_nodes);
        cJSON_AddNumberToObject(p, "microbatches", (double)e->pipelines[k].microbatches);
        cJSON_AddNumberToObject(p, "iteration_ms", pl_ns_to_ms(e->pipelines[k].iteration_ns));
        cJSON_AddItemToArray(pipes, p);
    }
    return o;
}

cJSON *pl_plan_to_json(const pl_template_set *ts, const pl_coverage *cov)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "n0", ts->n0);
    cJSON_AddNumberToObject(o, "tolerate", cov->tolerate);
    cJSON_AddNumberToObject(o, "global_batch", (double)cov->global_batch);
    cJSON_AddNumberToObject(o, "microbatches", (double)cov->microbatches);
    cJSON *tmpl = cJSON_AddArrayToObject(o, "templates");
    cJSON *infeasible = cJSON_CreateArray();
    for (int i = 0; i < ts->count; i++) {
        const pl_template *t = &ts->templates[i];
        if (t->feasible)
            cJSON_AddItemToArray(tmpl, pl_template_to_json(t));
        else
            cJSON_AddItemToArray(infeasible, cJSON_CreateNumber(t->nodes));
    }
    cJSON *coverage = cJSON_AddArrayToObject(o, "coverage");
    cJSON *uncovered = cJSON_AddArrayToObject(o, "uncovered");
    for (int i = 0; i < cov->count; i++) {
        const pl_instance_plan *e = &cov->entries[i];
        if (e->covered) {
            cJSON_AddItemToArray(coverage, pl_instance_plan_to_json(e));
        } else {
            cJSON *u = cJSON_CreateObject();
            cJSON_AddNumberToObject(u, "nodes", e->nodes);
            cJSON_AddNumberToObject(u, "idle_nodes", e->idle_nodes);
            cJSON_AddItemToArray(uncovered, u);
        }
    }
    cJSON_AddItemToObject(o, "infeasible_template_nodes", infeasible);
    return o;
}
