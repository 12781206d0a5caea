/* Independent check of pipeline instantiation (Oobleck §4.2, appendices A, B)
 * against a brute force written from the spec, not from shared/coverage.c:
 *
 *   for every N' from N down to (F+1)·n0: every template-count vector x with
 *   Σ x_i·n_i = N' and F+1 ≤ Σ x_i ≤ microbatches (each pipeline needs ≥ 1
 *   microbatch); the microbatches split as integers Nb_j ≥ 1 to minimise
 *   max_j T_j(Nb_j) (reference: greedy, itself checked against enumeration);
 *   the best x has the smallest time, ties to more pipelines, then to more
 *   pipelines of the largest template, then the next largest, ...
 *
 * Template sets are built by hand (plain structs) with chosen costs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "batch.h"
#include "check.h"
#include "rng.h"
#include "coverage.h"
#include "profile.h"
#include "templates.h"


/* ---- hand-built template sets --------------------------------------------- */

#define MAX_T 16

/* Templates for n_min..n_max; costs set later with set_cost. n0 is recomputed by finish_set. */
static void make_set(pl_template_set *s, int n_min, int n_max)
{
    memset(s, 0, sizeof *s);
    s->n_min = n_min;
    s->n_max = n_max;
    s->count = n_max - n_min + 1;
    s->templates = calloc((size_t)s->count, sizeof *s->templates);
    for (int i = 0; i < s->count; i++) {
        pl_template *t = &s->templates[i];
        t->nodes = n_min + i;
        t->feasible = 0;
        t->nstages = 1; /* a dummy layout, never evaluated */
        t->stages = calloc(1, sizeof *t->stages);
        t->stages[0].layer_end = 1;
        t->stages[0].gpus = 1;
    }
}

static void set_cost(pl_template_set *s, int nodes, int64_t first_ns, int64_t per_ns)
{
    pl_template *t = &s->templates[nodes - s->n_min];
    t->feasible = 1;
    t->max_stage_ns = per_ns;
    /* first = Σ W + 2·Σ C with Σ W ≥ max W (callers keep first ≥ per) */
    t->comm_ns = first_ns - per_ns >= per_ns / 2 ? per_ns / 2 : 0;
    t->sum_stage_ns = first_ns - t->comm_ns;
    t->iteration_ns = pl_template_time(t, 4 * t->nstages);
}

static void finish_set(pl_template_set *s)
{
    s->n0 = 0;
    for (int i = 0; i < s->count && !s->n0; i++)
        if (s->templates[i].feasible) s->n0 = s->templates[i].nodes;
}

static void free_set(pl_template_set *s)
{
    for (int i = 0; i < s->count; i++) free(s->templates[i].stages);
    free(s->templates);
    s->templates = NULL;
}

/* ---- reference --------------------------------------------------------------- */

/* Greedy: one microbatch each, then each further one to the pipeline that would
 * finish it first. Optimal for increasing linear costs: the result uses the
 * `mb` smallest slot times (first_j + (i−1)·per_j), each pipeline's own slots
 * taken in order. Checked against enumeration in test_reference_distribution. */
static int64_t greedy_makespan(const pl_template *const *tp, int n, int64_t mb, int64_t *nb)
{
    if (mb < n) return -1;
    int64_t worst = 0;
    for (int j = 0; j < n; j++) {
        nb[j] = 1;
        int64_t t = pl_template_time(tp[j], 1);
        if (t > worst) worst = t;
    }
    for (int64_t k = n; k < mb; k++) {
        int bj = 0;
        int64_t bt = INT64_MAX;
        for (int j = 0; j < n; j++) {
            int64_t t = pl_template_time(tp[j], nb[j] + 1);
            if (t < bt) {
                bt = t;
                bj = j;
            }
        }
        nb[bj]++;
        if (bt > worst) worst = bt;
    }
    return worst;
}

static int64_t enum_rec(const pl_template *const *tp, int n, int j, int64_t left, int64_t sofar)
{
    if (j == n - 1) {
        int64_t t = pl_template_time(tp[j], left);
        return t > sofar ? t : sofar;
    }
    int64_t best = INT64_MAX;
    for (int64_t k = 1; k <= left - (n - 1 - j); k++) {
        int64_t t = pl_template_time(tp[j], k);
        int64_t r = enum_rec(tp, n, j + 1, left - k, t > sofar ? t : sofar);
        if (r < best) best = r;
    }
    return best;
}

/* Second reference for large cases: the smallest t at which every pipeline
 * finishes its first microbatch and together they finish `mb` (capacity
 * Σ_j (1 + ⌊(t − first_j)/per_j⌋) is non-decreasing in t). */
static int64_t bs_makespan(const pl_template *const *tp, int n, int64_t mb)
{
    if (mb < n) return -1;
    int64_t lo = 0, hi = 0;
    for (int j = 0; j < n; j++) {
        int64_t t = pl_template_time(tp[j], mb);
        if (t > hi) hi = t;
    }
    while (lo < hi) {
        int64_t t = lo + (hi - lo) / 2, cap = 0;
        int all = 1;
        for (int j = 0; j < n; j++) {
            int64_t first = pl_template_time(tp[j], 1);
            if (t < first) {
                all = 0;
                break;
            }
            cap += 1 + (tp[j]->max_stage_ns ? (t - first) / tp[j]->max_stage_ns : mb);
        }
        if (all && cap >= mb) hi = t;
        else lo = t + 1;
    }
    return lo;
}

typedef struct {
    int found;
    int64_t time;
    int x[MAX_T];   /* counts per template index of the set */
    int npipes;
    int ncombos;    /* valid x for this N' */
    int nties;      /* valid x with the best time */
} ref_best;

/* Is (time, x) better than the best so far by the spec's order? */
static int better(const pl_template_set *s, int64_t time, const int *x, int npipes, const ref_best *b)
{
    if (!b->found) return 1;
    if (time != b->time) return time < b->time;
    if (npipes != b->npipes) return npipes > b->npipes;
    for (int i = s->count - 1; i >= 0; i--)
        if (x[i] != b->x[i]) return x[i] > b->x[i];
    return 0;
}

static void evaluate_x(const pl_template_set *s, const int *x, int F, int64_t mb, ref_best *b)
{
    const pl_template *tp[256];
    int n = 0;
    for (int i = s->count - 1; i >= 0; i--)
        for (int c = 0; c < x[i]; c++) tp[n++] = &s->templates[i];
    if (n < F + 1 || n > mb || n > 256) return;
    int64_t nb[256];
    int64_t t = greedy_makespan(tp, n, mb, nb);
    b->ncombos++;
    if (b->found && t == b->time) b->nties++;
    if (better(s, t, x, n, b)) {
        if (!b->found || t < b->time) b->nties = 1;
        b->found = 1;
        b->time = t;
        b->npipes = n;
        memcpy(b->x, x, sizeof b->x);
    }
}

/* Coin-change enumeration of every x with Σ x_i·n_i = left over templates i..count-1. */
static void enum_x(const pl_template_set *s, int i, int left, int *x, int F, int64_t mb, ref_best *b)
{
    if (i == s->count) {
        if (left == 0) evaluate_x(s, x, F, mb, b);
        return;
    }
    const pl_template *t = &s->templates[i];
    x[i] = 0;
    enum_x(s, i + 1, left, x, F, mb, b);
    if (t->feasible)
        for (int c = 1; c * t->nodes <= left; c++) {
            x[i] = c;
            enum_x(s, i + 1, left - c * t->nodes, x, F, mb, b);
        }
    x[i] = 0;
}

static ref_best brute_best(const pl_template_set *s, int nodes, int F, int64_t mb)
{
    ref_best b;
    memset(&b, 0, sizeof b);
    int x[MAX_T] = {0};
    enum_x(s, 0, nodes, x, F, mb, &b);
    return b;
}

/* ---- comparisons ---------------------------------------------------------------- */

static int fails;
static int n_ties_checked, n_uncovered_checked, n_covered_checked;

#define EXPECT(cond, ...) CHECK_COUNT(fails, 10, cond, __VA_ARGS__)

static void dump_set(const pl_template_set *s)
{
    printf("      set n0=%d [%d,%d]:", s->n0, s->n_min, s->n_max);
    for (int i = 0; i < s->count; i++) {
        const pl_template *t = &s->templates[i];
        if (t->feasible)
            printf(" n=%d(first %" PRId64 ", per %" PRId64 ")", t->nodes, t->sum_stage_ns + t->comm_ns,
                   t->max_stage_ns);
        else
            printf(" n=%d(infeasible)", t->nodes);
    }
    printf("\n");
}

static void dump_x(const pl_template_set *s, const ref_best *b)
{
    printf("      brute force: time %" PRId64 ", pipelines", b->time);
    for (int i = s->count - 1; i >= 0; i--)
        for (int c = 0; c < b->x[i]; c++) printf(" %d", s->templates[i].nodes);
    printf(" (%d combos, %d with the best time)\n", b->ncombos, b->nties);
}

static void dump_entry(const pl_instance_plan *e)
{
    printf("      planner: N'=%d covered=%d idle=%d time %" PRId64 ", pipelines", e->nodes, e->covered,
           e->idle_nodes, e->iteration_ns);
    for (int j = 0; j < e->npipelines; j++)
        printf(" %d[%" PRId64 " mb, %" PRId64 " ns]", e->pipelines[j].template_nodes,
               e->pipelines[j].microbatches, e->pipelines[j].iteration_ns);
    printf("\n");
}

/* A covered entry against the brute force's best x. */
static void check_entry(const pl_template_set *s, const pl_instance_plan *e, int nodes, int F, int64_t mb,
                        int64_t global_batch)
{
    ref_best b = brute_best(s, nodes, F, mb);
    int before = fails;
    EXPECT(e->nodes == nodes, "entry nodes %d, expected %d", e->nodes, nodes);
    EXPECT(e->covered == b.found, "N'=%d: covered=%d, brute force %s", nodes, e->covered,
           b.found ? "finds a combination" : "finds none");
    if (b.found && e->covered) {
        n_covered_checked++;
        if (b.nties > 1) n_ties_checked++;
        EXPECT(e->iteration_ns == b.time, "N'=%d: iteration_ns %" PRId64 ", brute-force best %" PRId64,
               nodes, e->iteration_ns, b.time);
        EXPECT(e->npipelines == b.npipes, "N'=%d: %d pipelines, brute force %d", nodes, e->npipelines,
               b.npipes);
        /* the chosen combination, pipelines largest template first */
        int x[MAX_T] = {0}, sum_nodes = 0, ordered = 1, valid = 1;
        int64_t sum_mb = 0, worst = 0;
        for (int j = 0; j < e->npipelines; j++) {
            const pl_pipeline_plan *pp = &e->pipelines[j];
            const pl_template *t = pl_template_for(s, pp->template_nodes);
            if (!t) {
                valid = 0;
                break;
            }
            x[pp->template_nodes - s->n_min]++;
            sum_nodes += pp->template_nodes;
            if (j > 0 && pp->template_nodes > e->pipelines[j - 1].template_nodes) ordered = 0;
            EXPECT(pp->microbatches >= 1, "N'=%d: pipeline %d has %" PRId64 " microbatches", nodes, j,
                   pp->microbatches);
            EXPECT(pp->iteration_ns == pl_template_time(t, pp->microbatches),
                   "N'=%d: pipeline %d time %" PRId64 " != T(%" PRId64 ") = %" PRId64, nodes, j,
                   pp->iteration_ns, pp->microbatches, pl_template_time(t, pp->microbatches));
            sum_mb += pp->microbatches;
            if (pp->iteration_ns > worst) worst = pp->iteration_ns;
        }
        EXPECT(valid, "N'=%d: a pipeline uses no feasible template", nodes);
        if (valid) {
            EXPECT(sum_nodes == nodes, "N'=%d: pipelines use %d nodes", nodes, sum_nodes);
            EXPECT(ordered, "N'=%d: pipelines not ordered largest template first", nodes);
            EXPECT(sum_mb == mb, "N'=%d: %" PRId64 " microbatches distributed, expected %" PRId64,
                   nodes, sum_mb, mb);
            EXPECT(worst == e->iteration_ns, "N'=%d: slowest pipeline %" PRId64 " != makespan %" PRId64,
                   nodes, worst, e->iteration_ns);
            EXPECT(memcmp(x, b.x, sizeof x) == 0,
                   "N'=%d: planner picked another combination than the brute force's best "
                   "(ties: more pipelines, then larger templates)",
                   nodes);
        }
        double sps = (double)global_batch / ((double)e->iteration_ns * 1e-9);
        EXPECT(fabs(e->samples_per_second - sps) <= 1e-9 * sps, "N'=%d: samples_per_second %g, expected %g",
               nodes, e->samples_per_second, sps);
    }
    if (fails != before && before < 10) {
        dump_set(s);
        if (b.found) dump_x(s, &b);
        dump_entry(e);
    }
}

/* An uncovered entry: idle_nodes, when given, points at a covered smaller N''. */
static int idle_reported;
static void check_uncovered(const pl_template_set *s, const pl_instance_plan *e, int F, int64_t mb)
{
    n_uncovered_checked++;
    /* (F+1)·n0 is always covered, so some smaller N'' is */
    EXPECT(e->idle_nodes > 0, "N'=%d uncovered: idle_nodes %d", e->nodes, e->idle_nodes);
    if (e->idle_nodes > 0) {
        int smaller = e->nodes - e->idle_nodes;
        ref_best b = brute_best(s, smaller, F, mb);
        EXPECT(b.found, "N'=%d uncovered: idle_nodes %d, but %d nodes are not covered either",
               e->nodes, e->idle_nodes, smaller);
        /* the largest covered N'' below N' leaves the fewest nodes idle */
        int largest = 0;
        for (int m = e->nodes - 1; m >= 1 && !largest; m--)
            if (brute_best(s, m, F, mb).found) largest = m;
        EXPECT(smaller == largest, "N'=%d uncovered: idle_nodes %d, but %d nodes are covered", e->nodes,
               e->idle_nodes, largest);
        if (!idle_reported) {
            printf("    note: uncovered N'=%d reports idle_nodes=%d (largest covered below: %d), "
                   "time %" PRId64 ", %d pipelines\n",
                   e->nodes, e->idle_nodes, largest, e->iteration_ns, e->npipelines);
            idle_reported = 1;
        }
    }
}

static void check_coverage(const pl_template_set *s, int nodes, int F, int64_t mb, int mbs)
{
    pl_coverage cov;
    memset(&cov, 0, sizeof cov);
    char err[256] = "";
    int64_t gb = mb * mbs;
    int rc = pl_coverage_compute(s, nodes, F, gb, mbs, &cov, err, sizeof err);
    EXPECT(rc == 0, "pl_coverage_compute(nodes %d, F %d, batch %" PRId64 "/%d) failed: %s", nodes, F,
           gb, mbs, err);
    if (rc != 0) {
        dump_set(s);
        return;
    }
    int lo = (F + 1) * s->n0;
    EXPECT(cov.nodes_hi == nodes && cov.nodes_lo == lo && cov.count == nodes - lo + 1,
           "coverage range [%d,%d] count %d, expected [%d,%d]", cov.nodes_lo, cov.nodes_hi, cov.count,
           lo, nodes);
    EXPECT(cov.microbatches == mb && cov.global_batch == gb && cov.tolerate == F,
           "coverage header: mb %" PRId64 " batch %" PRId64 " F %d", cov.microbatches, cov.global_batch,
           cov.tolerate);
    for (int i = 0; i < cov.count && i < nodes - lo + 1; i++) {
        const pl_instance_plan *e = &cov.entries[i];
        int np = nodes - i;
        check_entry(s, e, np, F, mb, gb);
        if (!e->covered) check_uncovered(s, e, F, mb);
        /* pl_instantiate agrees with the table */
        pl_instance_plan one;
        memset(&one, 0, sizeof one);
        rc = pl_instantiate(s, np, F, gb, mbs, &one, err, sizeof err);
        EXPECT(rc == 0, "pl_instantiate(%d) failed: %s", np, err);
        if (rc == 0) {
            int same = one.covered == e->covered && one.iteration_ns == e->iteration_ns &&
                       one.npipelines == e->npipelines;
            EXPECT(same, "pl_instantiate(%d) differs from the coverage entry", np);
            if (!same && fails <= 10) {
                printf("      coverage entry:\n");
                dump_entry(e);
                printf("      pl_instantiate:\n");
                dump_entry(&one);
            }
            if (one.covered && one.npipelines == e->npipelines)
                for (int j = 0; j < one.npipelines; j++)
                    EXPECT(one.pipelines[j].template_nodes == e->pipelines[j].template_nodes &&
                               one.pipelines[j].microbatches == e->pipelines[j].microbatches,
                           "pl_instantiate(%d) pipeline %d differs", np, j);
            pl_instance_plan_free(&one);
        }
    }
    pl_coverage_free(&cov);
}

/* Random template set n_min..n_max, first template feasible, others mostly. */
static void random_set(pl_template_set *s, int n_min, int n_max, int tiny, double p_feasible)
{
    make_set(s, n_min, n_max);
    for (int n = n_min; n <= n_max; n++) {
        if (n != n_min && (double)(rng_next() % 1000) / 1000.0 >= p_feasible) continue;
        int64_t per, first;
        if (tiny) { /* many ties */
            per = rng_range(1, 3);
            first = per + rng_range(0, 4);
        } else { /* more nodes: usually faster per microbatch, with a longer fill */
            per = 1000000 / n * rng_range(70, 130) / 100;
            first = per * rng_range(2, 4 * n + 2) + rng_range(0, 50000);
        }
        set_cost(s, n, first, per);
    }
    finish_set(s);
}

/* ---- tests --------------------------------------------------------------------------- */

static void test_reference_distribution(void)
{
    rng_state = 3;
    pl_template_set s;
    make_set(&s, 1, 4);
    for (int c = 0; c < 2000; c++) {
        for (int n = 1; n <= 4; n++) {
            int64_t per = rng_range(1, 20);
            set_cost(&s, n, per + rng_range(0, 30), per);
        }
        const pl_template *tp[4];
        int np = (int)rng_range(1, 4);
        for (int j = 0; j < np; j++) tp[j] = &s.templates[rng_next() % 4];
        int64_t mb = rng_range(np, 10), nb[4];
        int64_t g = greedy_makespan(tp, np, mb, nb);
        int64_t e = enum_rec(tp, np, 0, mb, INT64_MIN);
        CHECK_EQ_INT(g, e);
        CHECK_EQ_INT(bs_makespan(tp, np, mb), e);
        /* and the library's distribution agrees */
        pl_pipeline_cost pc[4];
        for (int j = 0; j < np; j++) {
            pc[j].first_ns = tp[j]->sum_stage_ns + tp[j]->comm_ns;
            pc[j].per_ns = tp[j]->max_stage_ns;
        }
        CHECK_EQ_INT(pl_distribute_batch(pc, np, mb, NULL), e);
    }
    free_set(&s);
}

static void run_random(uint64_t seed, int ncases, int tiny, double p_feasible, int small_mb, int maxN)
{
    rng_state = seed;
    for (int c = 0; c < ncases && fails < 10000; c++) {
        int n0 = (int)rng_range(1, maxN > 16 ? 4 : 3);
        int F = (int)rng_range(0, maxN > 16 ? 3 : 2);
        int n_max = n0 + (int)rng_range(0, 4);
        int N = (F + 1) * n0 + (int)rng_range(0, maxN > 16 ? maxN : 10);
        if (N > maxN) N = maxN;
        if ((F + 1) * n0 > N) N = (F + 1) * n0;
        pl_template_set s;
        random_set(&s, n0, n_max, tiny, p_feasible);
        int64_t mb;
        if (small_mb) mb = rng_range(F + 1, F + 4); /* fewer microbatches than some x's pipelines */
        else mb = N / n0 + rng_range(0, 12);        /* always enough for every x */
        if (mb < F + 1) mb = F + 1;
        int mbs = (int)rng_range(1, 4);
        int before = fails;
        check_coverage(&s, N, F, mb, mbs);
        if (fails != before && before < 10)
            printf("      (seed %" PRIu64 " case %d: N=%d F=%d mb=%" PRId64 ")\n", seed, c, N, F, mb);
        free_set(&s);
    }
}

static void test_random_vs_brute_force(void)
{
    fails = 0;
    n_ties_checked = n_uncovered_checked = n_covered_checked = 0;
    run_random(101, 1000, 0, 0.8, 0, 16);
    run_random(202, 1000, 1, 0.8, 0, 16);
    printf("    %d covered N' compared (%d with tied best times), %d uncovered\n", n_covered_checked,
           n_ties_checked, n_uncovered_checked);
    CHECK(n_covered_checked > 1000 && n_ties_checked > 100 && n_uncovered_checked > 10);
    CHECK_EQ_INT(fails, 0);
}

/* Fewer microbatches than some combinations' pipelines: those combinations are
 * out (Nb_j ≥ 1), the rest still compete exactly. */
static void test_random_few_microbatches(void)
{
    fails = 0;
    n_ties_checked = n_uncovered_checked = n_covered_checked = 0;
    run_random(303, 1000, 0, 0.8, 1, 16);
    run_random(404, 1000, 1, 0.8, 1, 16);
    printf("    %d covered N' compared (%d with tied best times), %d uncovered\n", n_covered_checked,
           n_ties_checked, n_uncovered_checked);
    CHECK_EQ_INT(fails, 0);
}

/* Larger clusters (up to 28 nodes, F up to 3). */
static void test_random_larger_clusters(void)
{
    fails = 0;
    n_ties_checked = n_uncovered_checked = n_covered_checked = 0;
    run_random(505, 400, 0, 0.7, 0, 28);
    run_random(606, 400, 1, 0.7, 0, 28);
    run_random(707, 400, 1, 0.7, 1, 28);
    printf("    %d covered N' compared (%d with tied best times), %d uncovered\n", n_covered_checked,
           n_ties_checked, n_uncovered_checked);
    CHECK_EQ_INT(fails, 0);
}

/* Large clusters, beyond enumeration: every entry is a valid plan (nodes,
 * microbatches, times consistent) and no random valid combination is faster. */
static void test_large_cluster_sanity(void)
{
    rng_state = 909;
    fails = 0;
    int competitors = 0;
    for (int c = 0; c < 12 && fails < 10; c++) {
        int n0 = (int)rng_range(2, 8), F = (int)rng_range(0, 3);
        int N = (int)rng_range(100, 300);
        int n_max = n0 + (int)rng_range(2, 6);
        pl_template_set s;
        random_set(&s, n0, n_max, c % 2, 0.8);
        int64_t mb = N / n0 + rng_range(0, 200);
        pl_coverage cov;
        memset(&cov, 0, sizeof cov);
        char err[256] = "";
        int rc = pl_coverage_compute(&s, N, F, mb, 1, &cov, err, sizeof err);
        EXPECT(rc == 0, "N=%d: %s", N, err);
        if (rc != 0) {
            free_set(&s);
            continue;
        }
        for (int i = 0; i < cov.count; i += 7) {
            const pl_instance_plan *e = &cov.entries[i];
            if (!e->covered) continue;
            const pl_template *tp[1024];
            int np = 0, sum = 0;
            int64_t smb = 0;
            for (int j = 0; j < e->npipelines && np < 1024; j++) {
                tp[np] = pl_template_for(&s, e->pipelines[j].template_nodes);
                EXPECT(tp[np] != NULL, "N'=%d: unknown template %d", e->nodes, e->pipelines[j].template_nodes);
                if (!tp[np]) break;
                EXPECT(e->pipelines[j].microbatches >= 1 &&
                           e->pipelines[j].iteration_ns == pl_template_time(tp[np], e->pipelines[j].microbatches),
                       "N'=%d: pipeline %d inconsistent", e->nodes, j);
                sum += e->pipelines[j].template_nodes;
                smb += e->pipelines[j].microbatches;
                np++;
            }
            EXPECT(sum == e->nodes && smb == mb && np >= F + 1, "N'=%d: plan uses %d nodes, %" PRId64 " microbatches, %d pipelines",
                   e->nodes, sum, smb, np);
            if (np == e->npipelines)
                EXPECT(bs_makespan(tp, np, mb) == e->iteration_ns, "N'=%d: makespan %" PRId64 " not optimal for its own combination (%" PRId64 ")",
                       e->nodes, e->iteration_ns, bs_makespan(tp, np, mb));
            /* random competitors */
            for (int k = 0; k < 30; k++) {
                int left = e->nodes, n = 0;
                for (int tries = 0; left > 0 && tries < 10000 && n < 1024; tries++) {
                    const pl_template *t = &s.templates[rng_next() % (uint64_t)s.count];
                    if (!t->feasible || t->nodes > left) continue;
                    /* avoid stranding a remainder smaller than n0 */
                    if (left - t->nodes != 0 && left - t->nodes < s.n0) continue;
                    tp[n++] = t;
                    left -= t->nodes;
                }
                if (left != 0 || n < F + 1 || n > mb) continue;
                int64_t t = bs_makespan(tp, n, mb);
                competitors++;
                EXPECT(t >= e->iteration_ns, "N'=%d: a random combination of %d pipelines takes %" PRId64
                       " < planner's %" PRId64, e->nodes, n, t, e->iteration_ns);
            }
        }
        pl_coverage_free(&cov);
        free_set(&s);
    }
    printf("    %d random competing combinations\n", competitors);
    CHECK(competitors > 500);
    CHECK_EQ_INT(fails, 0);
}

/* Hand-made ties. Templates 1..4 all (first 100, per 100), 3 microbatches,
 * N' = 6: three 1-microbatch pipelines take 100 ns whatever the sizes
 * ({4,1,1}, {3,2,1}, {2,2,2}); two pipelines take 200. Larger templates first:
 * {4,1,1}. */
static void test_tie_larger_templates_first(void)
{
    pl_template_set s;
    make_set(&s, 1, 4);
    for (int n = 1; n <= 4; n++) set_cost(&s, n, 100, 100);
    finish_set(&s);
    pl_instance_plan e;
    memset(&e, 0, sizeof e);
    char err[256] = "";
    CHECK(pl_instantiate(&s, 6, 0, 3, 1, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(e.covered, 1);
    CHECK_EQ_INT(e.iteration_ns, 100);
    CHECK_EQ_INT(e.npipelines, 3);
    CHECK_EQ_INT(e.pipelines[0].template_nodes, 4);
    CHECK_EQ_INT(e.pipelines[1].template_nodes, 1);
    CHECK_EQ_INT(e.pipelines[2].template_nodes, 1);
    pl_instance_plan_free(&e);
    free_set(&s);
}

/* Equal times, different pipeline counts: templates 2 (first 100, per 1000)
 * and 4 (first 50, per 50); 2 microbatches on 4 nodes: {2,2} one each = 100,
 * {4} both = 100. More pipelines wins: {2,2}. */
static void test_tie_more_pipelines(void)
{
    pl_template_set s;
    make_set(&s, 2, 4);
    set_cost(&s, 2, 100, 1000);
    set_cost(&s, 3, 5000, 5000);
    set_cost(&s, 4, 50, 50);
    finish_set(&s);
    pl_instance_plan e;
    memset(&e, 0, sizeof e);
    char err[256] = "";
    CHECK(pl_instantiate(&s, 4, 0, 2, 1, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(e.covered, 1);
    CHECK_EQ_INT(e.iteration_ns, 100);
    CHECK_EQ_INT(e.npipelines, 2);
    CHECK_EQ_INT(e.pipelines[0].template_nodes, 2);
    CHECK_EQ_INT(e.pipelines[1].template_nodes, 2);
    pl_instance_plan_free(&e);
    /* make {4} strictly faster: it wins despite fewer pipelines */
    set_cost(&s, 4, 50, 49);
    memset(&e, 0, sizeof e);
    CHECK(pl_instantiate(&s, 4, 0, 2, 1, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(e.iteration_ns, 99);
    CHECK_EQ_INT(e.npipelines, 1);
    CHECK_EQ_INT(e.pipelines[0].template_nodes, 4);
    CHECK_EQ_INT(e.pipelines[0].microbatches, 2);
    pl_instance_plan_free(&e);
    /* F = 1 forbids the single pipeline */
    memset(&e, 0, sizeof e);
    CHECK(pl_instantiate(&s, 4, 1, 2, 1, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(e.npipelines, 2);
    CHECK_EQ_INT(e.iteration_ns, 100);
    pl_instance_plan_free(&e);
    free_set(&s);
}

static int pipes_are(const pl_instance_plan *e, int n, const int *sizes)
{
    if (!e->covered || e->npipelines != n) return 0;
    for (int j = 0; j < n; j++)
        if (e->pipelines[j].template_nodes != sizes[j]) return 0;
    return 1;
}

/* Minimal tie cases found by the random comparison.
 * (a) templates 1 (first 100, per 100), 2 (first 10, per 10); N' = 3, F = 0,
 *     3 microbatches: {1,1,1} (1 each) and {2,1} (2 + 1) both take 100 ns;
 *     more pipelines wins: {1,1,1}.
 * (b) templates 1 (6, 3), 2 (4, 1), 3 (3, 3); N' = 3, 3 microbatches:
 *     {1,1,1} = 6 and {2,1} = max(6, 4+1) = 6: {1,1,1}; the coverage table for
 *     N = 6 and pl_instantiate(3) must both say so.
 * (c) templates 1 (5, 2), 2 (2, 2), 3 (6, 3); N' = 7, 3 microbatches: the
 *     only combinations of at most 3 pipelines are {3,3,1} and {3,2,2}, both
 *     6 ns: larger templates first: {3,3,1}. */
static void test_tie_minimal_cases(void)
{
    char err[256] = "";
    pl_instance_plan e;
    pl_template_set s;

    make_set(&s, 1, 2);
    set_cost(&s, 1, 100, 100);
    set_cost(&s, 2, 10, 10);
    finish_set(&s);
    memset(&e, 0, sizeof e);
    CHECK(pl_instantiate(&s, 3, 0, 3, 1, &e, err, sizeof err) == 0);
    static const int a[3] = {1, 1, 1};
    if (!pipes_are(&e, 3, a)) dump_entry(&e);
    CHECK_EQ_INT(e.iteration_ns, 100);
    CHECK(pipes_are(&e, 3, a));
    pl_instance_plan_free(&e);
    free_set(&s);

    make_set(&s, 1, 3);
    set_cost(&s, 1, 6, 3);
    set_cost(&s, 2, 4, 1);
    set_cost(&s, 3, 3, 3);
    finish_set(&s);
    pl_coverage cov;
    memset(&cov, 0, sizeof cov);
    CHECK(pl_coverage_compute(&s, 6, 0, 3, 1, &cov, err, sizeof err) == 0);
    const pl_instance_plan *c3 = &cov.entries[6 - 3];
    CHECK_EQ_INT(c3->nodes, 3);
    if (!pipes_are(c3, 3, a)) dump_entry(c3);
    memset(&e, 0, sizeof e);
    int rc = pl_instantiate(&s, 3, 0, 3, 1, &e, err, sizeof err);
    if (rc == 0 && !pipes_are(&e, 3, a)) dump_entry(&e);
    int ok_cov = pipes_are(c3, 3, a), ok_inst = rc == 0 && pipes_are(&e, 3, a);
    if (rc == 0) pl_instance_plan_free(&e);
    pl_coverage_free(&cov);
    free_set(&s);
    CHECK(ok_cov);
    CHECK(ok_inst);

    make_set(&s, 1, 3);
    set_cost(&s, 1, 5, 2);
    set_cost(&s, 2, 2, 2);
    set_cost(&s, 3, 6, 3);
    finish_set(&s);
    memset(&e, 0, sizeof e);
    CHECK(pl_instantiate(&s, 7, 0, 3, 1, &e, err, sizeof err) == 0);
    static const int c[3] = {3, 3, 1};
    int ok_c = pipes_are(&e, 3, c);
    if (!ok_c) dump_entry(&e);
    int64_t t = e.iteration_ns;
    pl_instance_plan_free(&e);
    free_set(&s);
    CHECK_EQ_INT(t, 6);
    CHECK(ok_c);
}

/* Appendix A: templates n0 .. N − F·n0 all feasible ⇒ every N' in
 * [(F+1)·n0, N] is covered. */
static void test_appendix_a(void)
{
    rng_state = 555;
    int checked = 0;
    fails = 0;
    for (int c = 0; c < 400 && fails < 10; c++) {
        int n0 = (int)rng_range(1, 5), F = (int)rng_range(0, 3);
        int N = (F + 1) * n0 + (int)rng_range(0, 12);
        pl_template_set s;
        random_set(&s, n0, N - F * n0, (int)(rng_next() % 2), 1.0);
        int64_t mb = F + 1 + rng_range(0, 20);
        pl_coverage cov;
        memset(&cov, 0, sizeof cov);
        char err[256] = "";
        int rc = pl_coverage_compute(&s, N, F, mb, 1, &cov, err, sizeof err);
        EXPECT(rc == 0, "N=%d F=%d n0=%d: %s", N, F, n0, err);
        if (rc == 0) {
            for (int i = 0; i < cov.count; i++) {
                EXPECT(cov.entries[i].covered, "Appendix A: N=%d F=%d n0=%d mb=%" PRId64 ": N'=%d uncovered",
                       N, F, n0, mb, cov.entries[i].nodes);
                checked++;
            }
            EXPECT(cov.count == N - (F + 1) * n0 + 1, "count %d", cov.count);
            pl_coverage_free(&cov);
        }
        free_set(&s);
    }
    printf("    %d node counts covered\n", checked);
    CHECK(checked > 1000);
    CHECK_EQ_INT(fails, 0);
}

/* Appendix B as arithmetic on the planning range: for N ≥ (F+2)·n0 and every
 * k ≥ 1 with 2n0 − k ≥ n0, n0 ≤ 2n0 − k ≤ N − F·n0. And on a set built for that
 * range, a template with 2n0 − k nodes is present. */
static void test_appendix_b(void)
{
    int checked = 0;
    for (int n0 = 1; n0 <= 8; n0++)
        for (int F = 0; F <= 4; F++)
            for (int N = (F + 2) * n0; N <= (F + 2) * n0 + 5; N++) {
                pl_template_set s;
                make_set(&s, n0, N - F * n0);
                for (int n = n0; n <= N - F * n0; n++) set_cost(&s, n, 1000, 100);
                finish_set(&s);
                for (int k = 1; 2 * n0 - k >= n0; k++) {
                    const pl_template *t = pl_template_for(&s, 2 * n0 - k);
                    CHECK(t != NULL);
                    CHECK_EQ_INT(t->nodes, 2 * n0 - k);
                    checked++;
                }
                free_set(&s);
            }
    CHECK(checked > 100);
}

/* The paper's example (Figure 4, Figure 7): templates with 2, 3 and 4 nodes.
 * 13 nodes: (1,1,2) and (0,3,1) are both valid combinations; the planner picks
 * a valid combination with the minimum time. */
static void test_paper_example(void)
{
    pl_template_set s;
    make_set(&s, 2, 4);
    set_cost(&s, 2, 9000, 1000);
    set_cost(&s, 3, 8000, 700);
    set_cost(&s, 4, 8000, 520);
    finish_set(&s);
    /* enumerate all x for 13 nodes: the paper's two plans are among them */
    int seen_112 = 0, seen_031 = 0, combos = 0;
    for (int a = 0; 2 * a <= 13; a++)
        for (int b = 0; 2 * a + 3 * b <= 13; b++)
            for (int c = 0; 2 * a + 3 * b + 4 * c <= 13; c++)
                if (2 * a + 3 * b + 4 * c == 13) {
                    combos++;
                    if (a == 1 && b == 1 && c == 2) seen_112 = 1;
                    if (a == 0 && b == 3 && c == 1) seen_031 = 1;
                }
    CHECK(seen_112 && seen_031);
    CHECK_EQ_INT(combos, 5); /* (5,1,0) (2,3,0) (3,1,1) (0,3,1) (1,1,2) */
    ref_best b = brute_best(&s, 13, 1, 64);
    CHECK(b.found);
    CHECK_EQ_INT(b.ncombos, combos);

    fails = 0;
    check_coverage(&s, 13, 1, 64, 4); /* N' = 13 .. 4 */
    CHECK_EQ_INT(fails, 0);
    pl_instance_plan e;
    memset(&e, 0, sizeof e);
    char err[256] = "";
    CHECK(pl_instantiate(&s, 13, 1, 256, 4, &e, err, sizeof err) == 0);
    CHECK_EQ_INT(e.covered, 1);
    int used = 0;
    for (int j = 0; j < e.npipelines; j++) used += e.pipelines[j].template_nodes;
    CHECK_EQ_INT(used, 13);
    CHECK_EQ_INT(e.iteration_ns, b.time);
    pl_instance_plan_free(&e);

    /* Figure 7: X(3, 7) with templates 2, 3, 4 is {(2,1,0), (0,1,1)}: both
     * valid; with F = 1 both qualify */
    b = brute_best(&s, 7, 1, 64);
    CHECK_EQ_INT(b.ncombos, 2);
    free_set(&s);
}

/* The same example from a profile: 6 equal layers on 1-GPU nodes whose memory
 * rules out a single node, N = 8, F = 2: templates 2, 3, 4. */
static void test_paper_example_from_profile(void)
{
    pl_profile p;
    memset(&p, 0, sizeof p);
    p.microbatch_size = 2;
    p.gpus_per_node = 1;
    p.nkeys = 1;
    p.keys[0] = 1;
    p.intra_node_GBps = 8;
    p.inter_node_GBps = 1;
    p.nlayers = 6;
    p.layers = calloc(6, sizeof *p.layers);
    for (int l = 0; l < 6; l++) {
        p.layers[l].fwd_ns[0] = 1000 + 100 * l;
        p.layers[l].bwd_ns[0] = 2000 + 150 * l;
        p.layers[l].param_bytes = 100;
        p.layers[l].activation_bytes = 10;
        p.layers[l].output_bytes = 640;
    }
    p.gpu_memory_bytes = 2000; /* whole model: 2400 + 60 > 2000 */
    pl_template_set s;
    memset(&s, 0, sizeof s);
    char err[256] = "";
    CHECK(pl_templates_plan(&p, 8, 2, &s, err, sizeof err) == 0);
    CHECK_EQ_INT(s.n0, 2);
    CHECK_EQ_INT(s.n_min, 2);
    CHECK_EQ_INT(s.n_max, 4);
    for (int i = 0; i < s.count; i++) CHECK_EQ_INT(s.templates[i].feasible, 1);
    fails = 0;
    check_coverage(&s, 8, 2, 48, 2); /* N' = 8, 7, 6: all covered (Appendix A) */
    CHECK_EQ_INT(fails, 0);
    /* 13 nodes from the same templates */
    pl_instance_plan e;
    memset(&e, 0, sizeof e);
    CHECK(pl_instantiate(&s, 13, 2, 96, 2, &e, err, sizeof err) == 0);
    ref_best b = brute_best(&s, 13, 2, 48);
    CHECK(b.found);
    CHECK_EQ_INT(e.covered, 1);
    CHECK_EQ_INT(e.iteration_ns, b.time);
    CHECK_EQ_INT(e.npipelines, b.npipes);
    pl_instance_plan_free(&e);
    pl_template_set_free(&s);
    free(p.layers);
}

/* Templates 3 and 5 only (4 infeasible), F = 0: N' = 7 cannot be covered
 * (3·a + 5·b = 7 has no solution) and is listed as uncovered. */
static void test_uncovered_listed(void)
{
    pl_template_set s;
    make_set(&s, 3, 5);
    set_cost(&s, 3, 3000, 500);
    set_cost(&s, 5, 4000, 300);
    finish_set(&s);
    pl_coverage cov;
    memset(&cov, 0, sizeof cov);
    char err[256] = "";
    CHECK(pl_coverage_compute(&s, 11, 0, 16, 1, &cov, err, sizeof err) == 0);
    CHECK_EQ_INT(cov.nodes_hi, 11);
    CHECK_EQ_INT(cov.nodes_lo, 3);
    CHECK_EQ_INT(cov.count, 9);
    /* 11 = 3+3+5 yes, 10 = 5+5, 9 = 3·3, 8 = 3+5, 7 no, 6 = 3+3, 5, 4 no, 3 */
    static const int covered[9] = {1, 1, 1, 1, 0, 1, 1, 0, 1};
    for (int i = 0; i < 9; i++) {
        CHECK_EQ_INT(cov.entries[i].nodes, 11 - i);
        CHECK_EQ_INT(cov.entries[i].covered, covered[i]);
    }
    fails = 0;
    check_uncovered(&s, &cov.entries[4], 0, 16);
    check_uncovered(&s, &cov.entries[7], 0, 16);
    CHECK_EQ_INT(fails, 0);
    pl_coverage_free(&cov);
    free_set(&s);
}

static void test_batch_check(void)
{
    char err[256];
    CHECK_EQ_INT(pl_batch_check(96, 8, 1, err, sizeof err), 0);
    CHECK_EQ_INT(pl_batch_check(16, 8, 1, err, sizeof err), 0);
    CHECK_EQ_INT(pl_batch_check(1, 1, 0, err, sizeof err), 0);

    err[0] = '\0';
    CHECK_EQ_INT(pl_batch_check(100, 8, 1, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "96");
    CHECK_STR_CONTAINS(err, "104");

    err[0] = '\0';
    CHECK_EQ_INT(pl_batch_check(8, 8, 1, err, sizeof err), -1); /* 1 microbatch < F+1 = 2 */
    CHECK_STR_CONTAINS(err, "16");

    err[0] = '\0';
    CHECK_EQ_INT(pl_batch_check(100, 8, 20, err, sizeof err), -1); /* 96 has too few: 168 */
    CHECK_STR_CONTAINS(err, "168");

    err[0] = '\0';
    CHECK_EQ_INT(pl_batch_check(0, 8, 0, err, sizeof err), -1);
    CHECK(err[0] != '\0');
    err[0] = '\0';
    CHECK_EQ_INT(pl_batch_check(-16, 8, 0, err, sizeof err), -1);
    CHECK(err[0] != '\0');

    /* the coverage refuses invalid batches too */
    pl_template_set s;
    make_set(&s, 1, 2);
    set_cost(&s, 1, 100, 10);
    set_cost(&s, 2, 80, 6);
    finish_set(&s);
    pl_coverage cov;
    memset(&cov, 0, sizeof cov);
    err[0] = '\0';
    CHECK_EQ_INT(pl_coverage_compute(&s, 4, 1, 100, 8, &cov, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "96");
    err[0] = '\0';
    CHECK_EQ_INT(pl_coverage_compute(&s, 4, 1, 8, 8, &cov, err, sizeof err), -1);
    CHECK(err[0] != '\0');
    /* (F+1)·n0 > N */
    err[0] = '\0';
    CHECK_EQ_INT(pl_coverage_compute(&s, 4, 4, 80, 8, &cov, err, sizeof err), -1);
    CHECK(err[0] != '\0');
    free_set(&s);
}

TEST_MAIN_BEGIN
RUN(test_reference_distribution);
RUN(test_random_vs_brute_force);
RUN(test_random_few_microbatches);
RUN(test_random_larger_clusters);
RUN(test_large_cluster_sanity);
RUN(test_tie_larger_templates_first);
RUN(test_tie_more_pipelines);
RUN(test_tie_minimal_cases);
RUN(test_appendix_a);
RUN(test_appendix_b);
RUN(test_paper_example);
RUN(test_paper_example_from_profile);
RUN(test_uncovered_listed);
RUN(test_batch_check);
TEST_MAIN_END
