/* Pipeline templates (Oobleck §4.1): for each node count n, the exact
 * minimum-iteration-time pipeline under the cost model of the planner issue. */
#ifndef PLIANT_TEMPLATES_H
#define PLIANT_TEMPLATES_H

#include "profile.h"

typedef struct {
    int layer_begin, layer_end; /* layers [begin, end) */
    int node;                   /* node index within the pipeline, 0-based */
    int gpus;                   /* d_k: GPUs of that node running the stage */
} pl_stage;

typedef struct {
    int nodes;
    int feasible;               /* 0: no layout of this many nodes fits */
    int nstages;
    pl_stage *stages;
    int64_t sum_stage_ns;       /* Σ W_k */
    int64_t comm_ns;            /* 2·Σ C_k */
    int64_t max_stage_ns;       /* max W_k */
    int64_t iteration_ns;       /* T(4S) */
    int64_t peak_memory_bytes;  /* max over stages of per-GPU bytes */
} pl_template;

/* Iteration time of a pipeline with nb microbatches: Σ W + 2·Σ C + (nb−1)·max W. */
static inline int64_t pl_template_time(const pl_template *t, int64_t nb)
{
    return t->sum_stage_ns + t->comm_ns + (nb - 1) * t->max_stage_ns;
}

typedef struct {
    int n0;                     /* smallest n with a feasible template; 0 if none up to n_max */
    int n_min, n_max;           /* templates[i] is for n_min + i nodes */
    int count;
    pl_template *templates;
} pl_template_set;

/* Computes optimal templates for every n in [n_lo, n_hi]. Returns 0, or -1 with err. */
int pl_templates_compute(const pl_profile *p, int n_lo, int n_hi, pl_template_set *out,
                         char *err, size_t errlen);

/* The planning range of §4.1.1: n0 is the smallest feasible n (searched up to
 * nodes), templates for n0 .. nodes − tolerate·n0. Fails if (tolerate+1)·n0 > nodes. */
int pl_templates_plan(const pl_profile *p, int nodes, int tolerate, pl_template_set *out,
                      char *err, size_t errlen);

const pl_template *pl_template_for(const pl_template_set *s, int nodes); /* NULL if none/infeasible */
void pl_template_set_free(pl_template_set *s);

/* Evaluates the cost model for an explicit layout (used by tests and by
 * re-instantiation). Returns 0 and fills t's cost fields, or -1 if the layout
 * is invalid or does not fit in memory. t->stages/nstages/nodes must be set. */
int pl_template_evaluate(const pl_profile *p, pl_template *t);

#endif
