/* Planner benchmark. Times the full plan for
 * the target sizes on synthetic transformer profiles, and compares the
 * coverage search with the paper's method (§4.2.1: list every template
 * combination by coin change, distribute the batch for each) in the same run.
 * Usage: planner_bench [--quick] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "coverage.h"
#include "profile.h"
#include "reinstantiate.h"
#include "templates.h"
#include "util.h"

static uint64_t rng = 88172645463325252ull;
static double jitter(void) /* deterministic ±3% measurement noise */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return 0.97 + 0.06 * (double)(rng % 1000000) / 1e6;
}

/* L layers: embedding, L−2 blocks, head; tensor parallelism at 90% efficiency per doubling. */
static void make_profile(pl_profile *p, int L, int M, int64_t block_param_bytes, int64_t mem)
{
    memset(p, 0, sizeof *p);
    snprintf(p->model, sizeof p->model, "synthetic-%d", L);
    p->microbatch_size = 4;
    p->gpus_per_node = M;
    p->gpu_memory_bytes = mem;
    p->intra_node_GBps = 150;
    p->inter_node_GBps = 25;
    for (int d = 1; d <= M; d *= 2) p->keys[p->nkeys++] = d;
    p->nlayers = L;
    p->layers = calloc((size_t)L, sizeof *p->layers);
    for (int i = 0; i < L; i++) {
        pl_layer_profile *l = &p->layers[i];
        double fwd_ms = i == 0 ? 0.4 : i == L - 1 ? 3.0 : 1.6;
        int64_t params = i == 0 || i == L - 1 ? block_param_bytes * 3 / 2 : block_param_bytes;
        double eff = 1.0;
        for (int k = 0; k < p->nkeys; k++, eff *= 0.9) {
            double t = fwd_ms / p->keys[k] / eff * jitter();
            l->fwd_ns[k] = (int64_t)(t * 1e6);
            l->bwd_ns[k] = (int64_t)(2 * t * 1e6);
        }
        l->param_bytes = params;
        l->activation_bytes = 200 << 20;
        l->output_bytes = 4 * 2048 * 4096 * 2;
    }
}

static int bench_full_plan(const char *name, pl_profile *p, int nodes, int tolerate, int64_t batch,
                           double target_ms)
{
    char err[256];
    pl_template_set ts;
    pl_coverage cov;
    double t0 = pl_now_ms();
    if (pl_templates_plan(p, nodes, tolerate, &ts, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", name, err);
        return 1;
    }
    double t1 = pl_now_ms();
    if (pl_coverage_compute(&ts, nodes, tolerate, batch, p->microbatch_size, &cov, err,
                            sizeof err)) {
        fprintf(stderr, "%s: %s\n", name, err);
        return 1;
    }
    double t2 = pl_now_ms();
    int feasible = 0;
    for (int i = 0; i < ts.count; i++) feasible += ts.templates[i].feasible;
    printf("%-44s templates %3d (n0=%d) %9.1f ms  coverage %7.1f ms  total %9.1f ms  "
           "target %6.0f ms  %s\n",
           name, feasible, ts.n0, t1 - t0, t2 - t1, t2 - t0, target_ms,
           t2 - t0 <= target_ms ? "ok" : "SLOW");
    pl_coverage_free(&cov);
    pl_template_set_free(&ts);
    return 0;
}

/* The paper's instantiation: enumerate every x with Σ x_i n_i = m, distribute. */
typedef struct {
    const pl_template_set *ts;
    int tolerate;
    int64_t mb;
    pl_pipeline_cost pipes[4096];
    int64_t nb[4096];
    int npipes;
    int64_t best;
    long combos;
} enum_state;

static void enumerate(enum_state *s, int idx, int left)
{
    if (left == 0) {
        s->combos++;
        if (s->npipes < s->tolerate + 1 || s->npipes > s->mb) return;
        int64_t t = pl_distribute_batch(s->pipes, s->npipes, s->mb, s->nb);
        if (t >= 0 && (s->best < 0 || t < s->best)) s->best = t;
        return;
    }
    if (idx < 0) return;
    const pl_template *t = &s->ts->templates[idx];
    enumerate(s, idx - 1, left);
    if (!t->feasible) return;
    int pushed = 0;
    while (left >= t->nodes && s->npipes < 4096) {
        s->pipes[s->npipes++] = (pl_pipeline_cost){pl_template_time(t, 1), t->max_stage_ns};
        left -= t->nodes;
        pushed++;
        enumerate(s, idx - 1, left);
    }
    s->npipes -= pushed;
}

static int bench_coverage_vs_enumeration(pl_profile *p, int nodes, int tolerate, int64_t batch)
{
    char err[256];
    pl_template_set ts;
    pl_coverage cov;
    if (pl_templates_plan(p, nodes, tolerate, &ts, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t0 = pl_now_ms();
    if (pl_coverage_compute(&ts, nodes, tolerate, batch, p->microbatch_size, &cov, err,
                            sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t1 = pl_now_ms();
    enum_state *s = calloc(1, sizeof *s);
    s->ts = &ts;
    s->tolerate = tolerate;
    s->mb = batch / p->microbatch_size;
    int mismatches = 0;
    for (int i = 0; i < cov.count; i++) {
        s->best = -1;
        enumerate(s, ts.count - 1, cov.entries[i].nodes);
        if (cov.entries[i].covered ? s->best != cov.entries[i].iteration_ns : s->best >= 0)
            mismatches++;
    }
    double t2 = pl_now_ms();
    printf("coverage N=%d (%d node counts): knapsack search %.2f ms, paper's enumeration "
           "(%ld combinations) %.1f ms, ratio %.0fx, optimum mismatches %d\n",
           nodes, cov.count, t1 - t0, s->combos, t2 - t1, (t2 - t1) / (t1 - t0 > 1e-3 ? t1 - t0 : 1e-3),
           mismatches);
    free(s);
    pl_coverage_free(&cov);
    pl_template_set_free(&ts);
    return mismatches != 0;
}

/* Re-instantiation from the best plan for nodes − 16 (so that joins stay within
 * the planned maximum, as the operator's spec.nodes.max guarantees): failures
 * and joins of several sizes, against instantiating the new count from scratch. */
static int bench_reinstantiate(pl_profile *p, int nodes, int tolerate, int64_t batch)
{
    char err[256];
    pl_template_set ts;
    pl_coverage cov;
    if (pl_templates_plan(p, nodes, tolerate, &ts, err, sizeof err) ||
        pl_coverage_compute(&ts, nodes, tolerate, batch, p->microbatch_size, &cov, err,
                            sizeof err)) {
        fprintf(stderr, "reinstantiate: %s\n", err);
        return 1;
    }
    const pl_instance_plan *best = &cov.entries[16];
    nodes -= 16;
    static char names[4096][16], added_names[64][16];
    pl_current_plan cur = {.npipelines = best->npipelines,
                           .pipelines = calloc((size_t)best->npipelines, sizeof *cur.pipelines)};
    int id = 0;
    for (int q = 0; q < best->npipelines; q++) {
        int k = best->pipelines[q].template_nodes;
        cur.pipelines[q].nnodes = k;
        cur.pipelines[q].nodes = calloc((size_t)k, sizeof(char *));
        for (int j = 0; j < k; j++, id++) {
            snprintf(names[id], sizeof names[id], "node-%d", id);
            cur.pipelines[q].nodes[j] = names[id];
        }
    }
    const char *removed[64], *added[64];
    for (int i = 0; i < 64; i++) {
        removed[i] = names[(i * 37 + 11) % id];
        snprintf(added_names[i], sizeof added_names[i], "new-%d", i);
        added[i] = added_names[i];
    }
    static const int cases[][2] = {{1, 0}, {2, 0}, {8, 0}, {0, 1}, {0, 8}, {4, 4}, {8, 2}};
    int rc = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int nr = cases[c][0], na = cases[c][1], reps = 20;
        pl_reinstantiation r;
        double t0 = pl_now_ms();
        for (int k = 0; k < reps; k++) {
            if (pl_reinstantiate(p, &ts, &cov, tolerate, batch, &cur, removed, nr, added, na, &r,
                                 err, sizeof err)) {
                fprintf(stderr, "reinstantiate: %s\n", err);
                return 1;
            }
            if (k < reps - 1) pl_reinstantiation_free(&r);
        }
        double t1 = pl_now_ms();
        pl_instance_plan scratch;
        if (pl_instantiate(&ts, nodes - nr + na, tolerate, batch, p->microbatch_size, &scratch,
                           err, sizeof err)) {
            fprintf(stderr, "instantiate: %s\n", err);
            return 1;
        }
        double t2 = pl_now_ms(), per = (t1 - t0) / reps;
        printf("reinstantiate N=%d remove %d add %d: %7.3f ms (target 10 ms) %s; "
               "instantiating from scratch %7.2f ms (%.0fx); %d pipelines, %.1f GB to copy\n",
               nodes, nr, na, per, per <= 10 ? "ok" : "SLOW", t2 - t1, (t2 - t1) / per,
               r.npipelines, r.bytes_to_copy / 1e9);
        rc |= per > 10;
        pl_instance_plan_free(&scratch);
        pl_reinstantiation_free(&r);
    }
    for (int q = 0; q < cur.npipelines; q++) free(cur.pipelines[q].nodes);
    free(cur.pipelines);
    pl_coverage_free(&cov);
    pl_template_set_free(&ts);
    return rc;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int rc = 0;
    pl_profile p;
    const int64_t GB = 1000000000;

    /* 96 layers, 8 GPUs/node, memory binding so that n0 = 2 */
    make_profile(&p, 96, 8, 1 * GB, 40 * GB);
    rc |= bench_full_plan("96 layers x 24 nodes x 8 GPUs, F=2", &p, 24, 2, 1024, 5000);
    pl_profile_free(&p);

    make_profile(&p, 32, 4, 1 * GB, 40 * GB);
    rc |= bench_full_plan("32 layers x 16 nodes x 4 GPUs, F=2", &p, 16, 2, 512, 500);
    rc |= bench_full_plan("32 layers x 1000 nodes x 4 GPUs, F=2", &p, 1000, 2, 8192, 1000);
    if (!quick) rc |= bench_coverage_vs_enumeration(&p, 40, 2, 512);
    pl_profile_free(&p);

    /* 4 GB per block: n0 = 4, pipelines of several nodes */
    make_profile(&p, 32, 4, 4 * GB, 40 * GB);
    rc |= bench_full_plan("32 layers (4 GB each) x 1000 nodes x 4 GPUs", &p, 1000, 2, 8192, 1000);
    rc |= bench_reinstantiate(&p, 1000, 2, 8192);
    pl_profile_free(&p);
    return rc;
}
