/* Pipeline instantiation (Oobleck §4.2): for every node count N' the set of
 * pipelines (template counts x) and batch distribution with the smallest
 * iteration time. Exact, without enumerating the combinations. */
#ifndef PLIANT_COVERAGE_H
#define PLIANT_COVERAGE_H

#include "templates.h"

typedef struct {
    int template_nodes;
    int64_t microbatches;
    int64_t iteration_ns;       /* this pipeline's time for its microbatches */
} pl_pipeline_plan;

typedef struct {
    int nodes;                  /* N' */
    int covered;                /* 0: no template combination uses exactly N' nodes */
    int idle_nodes;             /* when uncovered: nodes left idle by the best plan for fewer nodes */
    int64_t iteration_ns;       /* makespan of the step */
    double samples_per_second;
    int npipelines;             /* pipelines ordered by template size, largest first */
    pl_pipeline_plan *pipelines;
} pl_instance_plan;

typedef struct {
    int64_t microbatches;
    int64_t global_batch;
    int tolerate;
    int count;                  /* entries for N' = nodes_hi down to nodes_lo */
    int nodes_hi, nodes_lo;
    pl_instance_plan *entries;
} pl_coverage;

/* Validates the batch: global_batch must be a positive multiple of
 * microbatch_size giving at least tolerate+1 microbatches. On error writes a
 * message naming the nearest valid global batch sizes. */
int pl_batch_check(int64_t global_batch, int microbatch_size, int tolerate, char *err,
                   size_t errlen);

/* The coverage table for N' from nodes down to (tolerate+1)·n0. */
int pl_coverage_compute(const pl_template_set *ts, int nodes, int tolerate, int64_t global_batch,
                        int microbatch_size, pl_coverage *out, char *err, size_t errlen);

/* The best plan for exactly `nodes` nodes (covered = 0 if none). */
int pl_instantiate(const pl_template_set *ts, int nodes, int tolerate, int64_t global_batch,
                   int microbatch_size, pl_instance_plan *out, char *err, size_t errlen);

void pl_instance_plan_free(pl_instance_plan *e);
void pl_coverage_free(pl_coverage *c);

#endif
