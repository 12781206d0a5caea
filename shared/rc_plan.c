/* The planner for strategy redundant (rc_plan.h). */
#include "rc_plan.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_rc_successor(int stage, int nstages)
{
    if (nstages < 2 || stage < 0 || stage >= nstages) return -1;
    return (stage + 1) % nstages;
}

int pl_rc_holder(int stage, int nstages)
{
    if (nstages < 2 || stage < 0 || stage >= nstages) return -1;
    return (stage + nstages - 1) % nstages;
}

/* Stage 0 of n ≥ 3 lost: its holder, the last stage, runs [0, b1) first, and stage n − 2,
 * which holds the last stage's layers, runs them after its own (rc_plan.h). */
static int wrap_failover(int n, const int *layers, const int *lost, int *keep, int *nkeep,
                         int *out)
{
    if (lost[n - 2]) return 0; /* nobody else holds the last stage's layers */
    out[0] = 0;
    keep[(*nkeep)++] = n - 1;
    for (int j = 1; j < n - 1; j++)
        if (!lost[j]) {
            out[*nkeep] = layers[j];
            keep[(*nkeep)++] = j;
        }
    out[*nkeep] = layers[n];
    return 1;
}

int pl_rc_failover(int n, const int *layers, const int *lost, int *keep, int *nkeep, int *out)
{
    *nkeep = 0;
    for (int j = 0; j < n; j++) {
        const int h = pl_rc_holder(j, n);
        if (lost[j] && (h < 0 || lost[h])) return 0;
    }
    if (n >= 3 && lost[0]) return wrap_failover(n, layers, lost, keep, nkeep, out);
    for (int j = 0; j < n; j++) {
        if (lost[j]) continue;
        /* the first survivor starts at layer 0: stage 0 lost in the 2-stage ring */
        out[*nkeep] = *nkeep ? layers[j] : layers[0];
        keep[(*nkeep)++] = j;
    }
    out[*nkeep] = layers[n];
    return *nkeep > 0;
}

/* Σ over layers [b, e) of one field. */
typedef enum { SUM_PARAMS, SUM_ACTS, SUM_FWD, SUM_BWD, SUM_WORK } sum_kind;

static int64_t range_sum(const pl_profile *p, int b, int e, sum_kind what, int key)
{
    int64_t s = 0;
    for (int i = b; i < e; i++) {
        const pl_layer_profile *l = &p->layers[i];
        s += what == SUM_PARAMS ? l->param_bytes
             : what == SUM_ACTS ? l->activation_bytes
             : what == SUM_FWD  ? l->fwd_ns[key]
             : what == SUM_BWD  ? l->bwd_ns[key]
                                : l->fwd_ns[key] + l->bwd_ns[key];
    }
    return s;
}

/* Stage k's figures: per-GPU memory with its shadow, its FRC and the part exposed. */
static void stage_rc(const pl_profile *p, const pl_template *t, int k, int eager, int64_t nb,
                     int64_t T, pl_rc_cost *c)
{
    const pl_stage *s = &t->stages[k];
    const int key = pl_profile_key_index(p, s->gpus), S = t->nstages;
    int64_t mem = 4 * range_sum(p, s->layer_begin, s->layer_end, SUM_PARAMS, 0) +
                  (int64_t)(S - k) * range_sum(p, s->layer_begin, s->layer_end, SUM_ACTS, 0);
    const int n = pl_rc_successor(k, S);
    if (n >= 0) {
        const pl_stage *u = &t->stages[n];
        mem += 4 * range_sum(p, u->layer_begin, u->layer_end, SUM_PARAMS, 0) +
               range_sum(p, u->layer_begin, u->layer_end, SUM_ACTS, 0);
        if (eager && key >= 0) {
            const int64_t frc = nb * range_sum(p, u->layer_begin, u->layer_end, SUM_FWD, key);
            const int64_t idle = T - nb * range_sum(p, s->layer_begin, s->layer_end, SUM_WORK, key);
            const int64_t exposed = frc > idle ? frc - (idle > 0 ? idle : 0) : 0;
            if (frc > c->frc_ns) c->frc_ns = frc;
            if (exposed > c->exposed_frc_ns) c->exposed_frc_ns = exposed;
        }
    }
    mem = (mem + s->gpus - 1) / s->gpus;
    if (mem > c->memory_bytes) c->memory_bytes = mem;
}

/* The part of stage k's shadow-gradient transfer the step does not hide. Stage k sends
 * once its schedule is over; 1F1B's cool-down then runs the last microbatch's backward on
 * stages k − 1 .. 0 (`cooldown_ns`, Σ of their backwards of one microbatch) before the step
 * ends, and the message travels meanwhile. Stage 0 ends the step: its transfer to the last
 * stage, the ring's wrap, is hidden by nothing. */
static int64_t shadow_sync_exposed(const pl_profile *p, const pl_stage *s, int64_t cooldown_ns)
{
    const int64_t ns = pl_transfer_ns(range_sum(p, s->layer_begin, s->layer_end, SUM_PARAMS, 0),
                                      p->inter_node_GBps);
    return ns > cooldown_ns ? ns - cooldown_ns : 0;
}

int pl_rc_evaluate(const pl_profile *p, const pl_template *t, int eager, int64_t nb,
                   pl_rc_cost *out)
{
    memset(out, 0, sizeof *out);
    if (t->nstages < 1 || !t->stages) return -1;
    const int64_t T = pl_template_time(t, nb);
    int64_t cooldown = 0; /* Σ over the stages before k of one microbatch's backward */
    for (int k = 0; k < t->nstages; k++) {
        const pl_stage *s = &t->stages[k];
        const int key = pl_profile_key_index(p, s->gpus);
        stage_rc(p, t, k, eager, nb, T, out);
        if (pl_rc_holder(k, t->nstages) >= 0) {
            const int64_t ns = shadow_sync_exposed(p, s, cooldown);
            if (ns > out->shadow_sync_ns) out->shadow_sync_ns = ns;
        }
        if (key >= 0) cooldown += range_sum(p, s->layer_begin, s->layer_end, SUM_BWD, key);
    }
    out->iteration_ns = T + out->exposed_frc_ns + out->shadow_sync_ns;
    out->fits = out->memory_bytes <= p->gpu_memory_bytes;
    return 0;
}

/* The memory budgets the template DP is run under, as fractions of the GPU's. */
static const double BUDGETS[] = {1.0, 0.8, 0.65, 0.5, 0.4, 0.3, 0.2};

/* Keeps candidate c for its node count in best when it fits with RC and is faster. */
static void consider(const pl_profile *p, pl_template *c, int eager, pl_template *best,
                     int64_t *best_ns)
{
    pl_rc_cost rc;
    if (!c->feasible || pl_template_evaluate(p, c) ||
        pl_rc_evaluate(p, c, eager, 4 * (int64_t)c->nstages, &rc) || !rc.fits)
        return;
    if (best->feasible && rc.iteration_ns >= *best_ns) return;
    free(best->stages);
    *best = *c;
    *best_ns = rc.iteration_ns;
    c->stages = NULL;
    c->feasible = 0;
}

/* For every n in [1, nodes], the fastest RC layout over the budgets (best[n − 1]). */
static int search(const pl_profile *p, int nodes, int eager, pl_template *best,
                  char *err, size_t errlen)
{
    int64_t *best_ns = pl_calloc((size_t)nodes, sizeof *best_ns);
    if (!best_ns) return pl_errf(err, errlen, "planner: out of memory");
    pl_profile q = *p; /* shares p's layers: never freed */
    for (size_t b = 0; b < sizeof BUDGETS / sizeof BUDGETS[0]; b++) {
        q.gpu_memory_bytes = (int64_t)((double)p->gpu_memory_bytes * BUDGETS[b]);
        pl_template_set ts;
        if (pl_templates_compute(&q, 1, nodes, &ts, err, errlen)) {
            free(best_ns);
            return -1;
        }
        for (int n = 1; n <= nodes; n++)
            consider(p, &ts.templates[n - 1], eager, &best[n - 1], &best_ns[n - 1]);
        pl_template_set_free(&ts);
    }
    free(best_ns);
    return 0;
}

int pl_templates_plan_rc(const pl_profile *p, int nodes, int tolerate, int eager,
                         pl_template_set *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (nodes < 1) return pl_errf(err, errlen, "--nodes: must be at least 1 (got %d)", nodes);
    if (tolerate < 0) return pl_errf(err, errlen, "--tolerate: must not be negative");
    pl_template *best = pl_calloc((size_t)nodes, sizeof *best);
    if (!best) return pl_errf(err, errlen, "planner: out of memory");
    for (int n = 0; n < nodes; n++) best[n].nodes = n + 1;
    int rc = search(p, nodes, eager, best, err, errlen), n0 = 0;
    for (int n = 1; rc == 0 && n <= nodes && !n0; n++)
        if (best[n - 1].feasible) n0 = n;
    if (rc == 0 && !n0)
        rc = pl_errf(err, errlen, "profile: the model with redundant layers fits on no pipeline "
                                  "of up to %d nodes (gpu_memory_bytes too small?)", nodes);
    else if (rc == 0 && (int64_t)(tolerate + 1) * n0 > nodes)
        rc = pl_errf(err, errlen, "--tolerate: %d failures need at least (F+1)·n0 = %d nodes "
                                  "(n0 = %d with redundant layers), but --nodes is %d",
                     tolerate, (tolerate + 1) * n0, n0, nodes);
    if (rc == 0) {
        out->n0 = n0;
        out->n_min = n0;
        out->n_max = nodes - tolerate * n0;
        out->count = out->n_max - n0 + 1;
        out->templates = best; /* slid down below: templates[i] is for n0 + i nodes */
        for (int n = 1; n < n0; n++) free(best[n - 1].stages);
        memmove(best, best + n0 - 1, (size_t)out->count * sizeof *best);
        for (int n = out->n_max + 1; n <= nodes; n++) free(best[n - 1].stages);
        return 0;
    }
    for (int n = 0; n < nodes; n++) free(best[n].stages);
    free(best);
    return -1;
}
