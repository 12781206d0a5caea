/* Pipeline instantiation and the coverage table (Oobleck §4.2).
 *
 * The paper lists every template combination x (coin change, §4.2.1) and
 * solves a batch-distribution program for each (§4.2.2); that is exponential
 * in N. We search on the makespan instead. For a time t, template i can finish
 * cap_i(t) microbatches; a combination finishes the step by t iff
 * Σ x_i·cap_i(t) ≥ microbatches. So "can N' nodes finish by t?" is an exact-fill
 * unbounded knapsack over node counts maximising capacity, with the pipeline
 * count kept in a few buckets (≥ F+1, and ≤ microbatches when that can bind).
 * The knapsack answers every N' at once, so one parallel binary search over the
 * sorted completion times a_i + (k−1)·b_i (enumerated implicitly through their
 * rank) finds the exact minimum makespan of every N'.
 *
 * Ties at that makespan go to more pipelines, then larger templates first
 * (lex_build below, exact). Its tables grow with nodes × pipelines ×
 * templates; past LEX_TABLE_CELLS (clusters of many hundreds of nodes with
 * small templates) the rebuild uses the search's knapsack instead, whose ties
 * go to spare capacity, then more pipelines, then larger templates. The
 * makespan itself is exact either way. */
#include "coverage.h"

#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "util.h"

/* Largest exact tie-breaking table (int32 cells): 64 MiB. */
#define LEX_TABLE_CELLS ((size_t)1 << 24)

typedef struct {
    int n;              /* nodes of the template */
    pl_pipeline_cost c; /* first = T(1), per = max stage */
} tmpl_cost;

typedef struct {
    const pl_template_set *ts;
    tmpl_cost *tc; /* feasible templates, largest first */
    int p;
    int64_t mb;       /* microbatches per step */
    int tolerate;
    int kb;           /* pipeline-count buckets 0..kb; bucket kb holds every count ≥ kb */
    int nmin;         /* nodes of the smallest feasible template */
    int kmax;         /* most pipelines any plan can have: mmax / nmin */
    int mmax;
    /* knapsack tables, [(mmax+1)·(kb+1)] */
    int64_t *cap;   /* best capacity, saturated at mb; −1 = unreachable */
    int32_t *count; /* pipelines of that best (tie-break) */
    int32_t *from;  /* (template index << 16) | previous bucket */
    int64_t *capi;  /* [p] capacity of each template at the knapsack's time */
    int64_t *tstar; /* [mmax+1] minimum makespan found, −1 = uncovered */
} cov;

static size_t cell(const cov *c, int m, int b)
{
    return (size_t)m * (size_t)(c->kb + 1) + (size_t)b;
}

/* A plan needs F+1 pipelines and at most one pipeline per microbatch. */
static int bucket_valid(const cov *c, int b)
{
    return b >= c->tolerate + 1 && (b < c->kb ? b <= c->mb : c->kmax <= c->mb);
}

/* Exact-fill knapsack at time t for m ≤ mmax with count buckets 0..kb. Ties
 * keep more pipelines, then the larger template (visited largest first). */
static void knapsack(cov *c, int64_t t, int mmax, int kb)
{
    c->kb = kb;
    int64_t *capi = c->capi;
    for (int i = 0; i < c->p; i++) {
        int64_t k = pl_pipeline_capacity(&c->tc[i].c, t);
        capi[i] = k > c->mb ? c->mb : k;
    }
    for (int m = 0; m <= mmax; m++)
        for (int b = 0; b <= c->kb; b++) c->cap[cell(c, m, b)] = -1;
    c->cap[cell(c, 0, 0)] = 0;
    c->count[cell(c, 0, 0)] = 0;
    for (int m = 1; m <= mmax; m++)
        for (int i = 0; i < c->p; i++) {
            if (c->tc[i].n > m || capi[i] < 1) continue;
            int prev = m - c->tc[i].n;
            for (int b = 0; b <= c->kb; b++) {
                size_t s = cell(c, prev, b);
                if (c->cap[s] < 0) continue;
                int nb = b < c->kb ? b + 1 : b;
                int64_t v = c->cap[s] + capi[i];
                if (v > c->mb) v = c->mb;
                int32_t n = c->count[s] + 1;
                size_t d = cell(c, m, nb);
                if (v > c->cap[d] || (v == c->cap[d] && n > c->count[d])) {
                    c->cap[d] = v;
                    c->count[d] = n;
                    c->from[d] = (int32_t)(i << 16 | b);
                }
            }
        }
}

/* Best valid bucket of m after knapsack(): one that finishes the batch with the
 * most pipelines, else the most capacity; −1 if none. */
static int best_bucket(const cov *c, int m)
{
    int best = -1;
    for (int b = 0; b <= c->kb; b++) {
        size_t s = cell(c, m, b);
        if (!bucket_valid(c, b) || c->cap[s] < 0) continue;
        if (best < 0) {
            best = b;
            continue;
        }
        size_t o = cell(c, m, best);
        int fin = c->cap[s] >= c->mb, ofin = c->cap[o] >= c->mb;
        if (fin != ofin ? fin
                        : fin ? c->count[s] > c->count[o]
                              : c->cap[s] > c->cap[o] ||
                                    (c->cap[s] == c->cap[o] && c->count[s] > c->count[o]))
            best = b;
    }
    return best;
}

static int finishes(const cov *c, int m)
{
    int b = best_bucket(c, m);
    return b >= 0 && c->cap[cell(c, m, b)] >= c->mb;
}

/* Buckets for the search: only "≥ F+1" matters, unless a plan could have more
 * pipelines than microbatches, which needs exact counts up to mb + 1. */
static int search_kb(const cov *c)
{
    return c->kmax > c->mb ? (int)c->mb + 1 : c->tolerate + 1;
}

/* Number of completion times a_i + (k−1)·b_i (k ≤ mb) that are ≤ t. */
static int64_t rank_of(const cov *c, int64_t t)
{
    int64_t r = 0;
    for (int i = 0; i < c->p; i++) {
        int64_t k = pl_pipeline_capacity(&c->tc[i].c, t);
        r += k > c->mb ? c->mb : k;
    }
    return r;
}

/* The r-th smallest completion time (1-based). */
static int64_t select_rank(const cov *c, int64_t r)
{
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < c->p; i++) {
        int64_t last = c->tc[i].c.first_ns + (c->mb - 1) * c->tc[i].c.per_ns;
        if (last > hi) hi = last;
    }
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rank_of(c, mid) >= r)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Parallel binary search: every m in ms[0..nm) (ascending) has its minimum
 * makespan among ranks [rlo, rhi]. */
static void search(cov *c, int64_t rlo, int64_t rhi, int *ms, int nm)
{
    if (nm == 0) return;
    if (rlo == rhi) {
        int64_t t = select_rank(c, rlo);
        for (int a = 0; a < nm; a++) c->tstar[ms[a]] = t;
        return;
    }
    int64_t rmid = rlo + (rhi - rlo) / 2;
    knapsack(c, select_rank(c, rmid), ms[nm - 1], search_kb(c));
    /* stable partition: those finishing by the mid time first */
    int *tmp = malloc((size_t)nm * sizeof *tmp);
    int nf = 0, nl = 0;
    if (!tmp) abort();
    for (int a = 0; a < nm; a++)
        if (finishes(c, ms[a])) ms[nf++] = ms[a];
        else tmp[nl++] = ms[a];
    memcpy(ms + nf, tmp, (size_t)nl * sizeof *tmp);
    free(tmp);
    search(c, rlo, rmid, ms, nf);
    search(c, rmid + 1, rhi, ms + nf, nl);
}

/* Pipelines from counts x[i] of each template (largest first, as tc is),
 * with the exact batch distribution. */
static int plan_from_counts(const cov *c, const int *x, int m, int64_t global_batch,
                            pl_instance_plan *out)
{
    int n = 0;
    for (int i = 0; i < c->p; i++) n += x[i];
    out->pipelines = pl_calloc((size_t)n, sizeof *out->pipelines);
    pl_pipeline_cost *costs = pl_calloc((size_t)n, sizeof *costs);
    int64_t *nb = pl_calloc((size_t)n, sizeof *nb);
    if (!out->pipelines || !costs || !nb) {
        free(costs);
        free(nb);
        return -1;
    }
    for (int i = 0, k = 0; i < c->p; i++)
        for (int j = 0; j < x[i]; j++, k++) {
            costs[k] = c->tc[i].c;
            out->pipelines[k].template_nodes = c->tc[i].n;
        }
    out->iteration_ns = pl_distribute_batch(costs, n, c->mb, nb);
    for (int k = 0; k < n; k++) {
        out->pipelines[k].microbatches = nb[k];
        out->pipelines[k].iteration_ns = costs[k].first_ns + (nb[k] - 1) * costs[k].per_ns;
    }
    out->npipelines = n;
    out->covered = 1;
    out->nodes = m;
    out->samples_per_second =
        out->iteration_ns > 0 ? (double)global_batch * 1e9 / (double)out->iteration_ns : 0;
    free(costs);
    free(nb);
    return 0;
}

/* Template counts of the knapsack's best bucket for m (the over-budget rebuild). */
static void counts_from_knapsack(const cov *c, int m, int *x)
{
    int b = best_bucket(c, m);
    memset(x, 0, (size_t)c->p * sizeof *x);
    for (int k = c->count[cell(c, m, b)]; k > 0; k--) {
        int32_t f = c->from[cell(c, m, b)];
        x[f >> 16]++;
        m -= c->tc[f >> 16].n;
        b = f & 0xffff;
    }
}

/* Exact tie-breaking at makespan t. H_i[m][k] is the most capacity (saturated
 * at mb) that templates i..p−1 reach filling exactly m nodes with exactly k
 * pipelines. The plan for m takes the most pipelines k with H_0[m][k] ≥ mb,
 * then, template by template from the largest, as many copies as still let
 * the smaller templates complete it: lexicographically largest. */
typedef struct {
    int mtop, kmax;
    int32_t *h; /* [(p+1)·(mtop+1)·(kmax+1)] */
} lex_tables;

static int32_t *lex_at(const cov *c, const lex_tables *lt, int i, int m, int k)
{
    return &lt->h[((size_t)i * (size_t)(lt->mtop + 1) + (size_t)m) * (size_t)(lt->kmax + 1) +
                  (size_t)k];
}

static void lex_build(const cov *c, lex_tables *lt, int64_t t)
{
    for (int m = 0; m <= lt->mtop; m++)
        for (int k = 0; k <= lt->kmax; k++) *lex_at(c, lt, c->p, m, k) = m || k ? -1 : 0;
    for (int i = c->p - 1; i >= 0; i--) {
        int64_t cap = pl_pipeline_capacity(&c->tc[i].c, t);
        int32_t ci = (int32_t)(cap > c->mb ? c->mb : cap);
        int n = c->tc[i].n;
        for (int m = 0; m <= lt->mtop; m++)
            for (int k = 0; k <= lt->kmax; k++) {
                int32_t v = *lex_at(c, lt, i + 1, m, k);
                if (ci >= 1 && m >= n && k >= 1) {
                    int32_t w = *lex_at(c, lt, i, m - n, k - 1);
                    if (w >= 0) {
                        w = (int32_t)(w + ci > c->mb ? c->mb : w + ci);
                        if (w > v) v = w;
                    }
                }
                *lex_at(c, lt, i, m, k) = v;
            }
    }
}

static int lex_counts(const cov *c, const lex_tables *lt, int64_t t, int m, int *x)
{
    int k = -1;
    int klim = lt->kmax < c->mb ? lt->kmax : (int)c->mb;
    for (int kk = klim; kk >= c->tolerate + 1 && k < 0; kk--)
        if (*lex_at(c, lt, 0, m, kk) >= c->mb) k = kk;
    if (k < 0) return -1;
    int64_t need = c->mb;
    for (int i = 0; i < c->p; i++) {
        int64_t cap = pl_pipeline_capacity(&c->tc[i].c, t);
        if (cap > c->mb) cap = c->mb;
        int n = c->tc[i].n, xi = cap >= 1 ? (m / n < k ? m / n : k) : 0;
        for (; xi > 0; xi--) {
            int32_t rest = *lex_at(c, lt, i + 1, m - xi * n, k - xi);
            if (rest >= 0 && rest >= need - xi * cap) break;
        }
        x[i] = xi;
        m -= xi * n;
        k -= xi;
        need -= xi * cap;
    }
    return 0;
}

/* Valid global batches are multiples of the microbatch size with F+1 to
 * MAX_MICROBATCHES microbatches; names the nearest ones on error. */
#define MAX_MICROBATCHES 100000

int pl_batch_check(int64_t global_batch, int microbatch_size, int tolerate, char *err,
                   size_t errlen)
{
    if (microbatch_size < 1) return pl_errf(err, errlen, "microbatch_size: must be at least 1");
    if (global_batch < 1)
        return pl_errf(err, errlen, "--global-batch: must be positive (got %lld)",
                       (long long)global_batch);
    int64_t lo = (int64_t)(tolerate + 1) * microbatch_size;
    int64_t hi = (int64_t)MAX_MICROBATCHES * microbatch_size;
    if (lo > hi)
        return pl_errf(err, errlen, "--tolerate: %d needs more than %d microbatches per step",
                       tolerate, MAX_MICROBATCHES);
    int64_t mb = global_batch / microbatch_size;
    const char *why = global_batch % microbatch_size ? "is not a multiple of the microbatch size"
                      : mb < tolerate + 1            ? "has too few microbatches for F+1 pipelines of"
                      : mb > MAX_MICROBATCHES        ? "has too many microbatches (over 100000) of"
                                                     : NULL;
    if (!why) return 0;
    int64_t below = mb * microbatch_size, above = below + microbatch_size;
    if (below > hi) below = hi;
    if (above < lo) above = lo;
    if (below < lo || below == global_batch)
        return pl_errf(err, errlen,
                       "--global-batch: %lld %s %d; the nearest valid global batch size is %lld",
                       (long long)global_batch, why, microbatch_size,
                       (long long)(global_batch < lo ? above : below));
    if (above > hi)
        return pl_errf(err, errlen,
                       "--global-batch: %lld %s %d; the nearest valid global batch size is %lld",
                       (long long)global_batch, why, microbatch_size, (long long)below);
    return pl_errf(err, errlen,
                   "--global-batch: %lld %s %d; the nearest valid global batch sizes are %lld "
                   "and %lld",
                   (long long)global_batch, why, microbatch_size, (long long)below,
                   (long long)above);
}

static void cov_free(cov *c)
{
    free(c->tc);
    free(c->capi);
    free(c->cap);
    free(c->count);
    free(c->from);
    free(c->tstar);
}

static int cov_init(cov *c, const pl_template_set *ts, int mmax, int tolerate, int64_t mb)
{
    memset(c, 0, sizeof *c);
    c->ts = ts;
    c->mb = mb;
    c->tolerate = tolerate;
    c->mmax = mmax;
    c->tc = pl_calloc((size_t)ts->count, sizeof *c->tc);
    c->capi = pl_calloc((size_t)ts->count, sizeof *c->capi);
    if (!c->tc || !c->capi) {
        cov_free(c);
        return -1;
    }
    int nmin = 0;
    for (int k = ts->count - 1; k >= 0; k--) {
        const pl_template *t = &ts->templates[k];
        if (!t->feasible) continue;
        c->tc[c->p++] = (tmpl_cost){t->nodes, {pl_template_time(t, 1), t->max_stage_ns}};
        nmin = t->nodes;
    }
    c->nmin = nmin;
    c->kmax = nmin > 0 ? mmax / nmin : 0;
    size_t cells = (size_t)(mmax + 1) * (size_t)(search_kb(c) + 1);
    c->cap = pl_calloc(cells, sizeof *c->cap);
    c->count = pl_calloc(cells, sizeof *c->count);
    c->from = pl_calloc(cells, sizeof *c->from);
    c->tstar = pl_calloc((size_t)mmax + 1, sizeof *c->tstar);
    if (!c->cap || !c->count || !c->from || !c->tstar) {
        cov_free(c);
        return -1;
    }
    return 0;
}

/* Rebuilds each plan at its own makespan into plans[m − lo]; m values with
 * equal makespans are adjacent in ms and share one table. */
static int rebuild_plans(cov *c, const int *ms, int nm, int lo, int64_t global_batch,
                         pl_instance_plan *plans)
{
    int *x = pl_calloc((size_t)c->p, sizeof *x);
    if (!x) return -1;
    int rc = 0;
    for (int a = 0, z; a < nm && rc == 0; a = z) {
        int64_t t = c->tstar[ms[a]];
        int top = ms[a];
        for (z = a; z < nm && c->tstar[ms[z]] == t; z++)
            if (ms[z] > top) top = ms[z];
        /* more pipelines than microbatches never make a valid plan */
        lex_tables lt = {.mtop = top, .kmax = (int)(top / c->nmin < c->mb ? top / c->nmin : c->mb)};
        size_t cells = (size_t)(c->p + 1) * (size_t)(top + 1) * (size_t)(lt.kmax + 1);
        if (cells <= LEX_TABLE_CELLS) lt.h = malloc(cells * sizeof *lt.h);
        if (lt.h)
            lex_build(c, &lt, t);
        else
            knapsack(c, t, top, search_kb(c));
        for (int b = a; b < z && rc == 0; b++) {
            if (lt.h)
                rc = lex_counts(c, &lt, t, ms[b], x);
            else
                counts_from_knapsack(c, ms[b], x);
            if (rc == 0) rc = plan_from_counts(c, x, ms[b], global_batch, &plans[ms[b] - lo]);
        }
        free(lt.h);
    }
    free(x);
    return rc;
}

/* Fills plans[m − lo] for every m in [lo, hi]. */
static int plan_range(const pl_template_set *ts, int lo, int hi, int tolerate,
                      int64_t global_batch, int microbatch_size, pl_instance_plan *plans,
                      char *err, size_t errlen)
{
    if (pl_batch_check(global_batch, microbatch_size, tolerate, err, errlen)) return -1;
    cov c;
    if (cov_init(&c, ts, hi, tolerate, global_batch / microbatch_size))
        return pl_errf(err, errlen, "planner: out of memory");
    for (int m = lo; m <= hi; m++) plans[m - lo].nodes = m;
    int rc = 0;
    if (c.p > 0) {
        /* which m are coverable at all: every pipeline could take every microbatch */
        int64_t rmax = (int64_t)c.p * c.mb;
        knapsack(&c, select_rank(&c, rmax), hi, search_kb(&c));
        int *ms = pl_calloc((size_t)(hi - lo + 1), sizeof *ms);
        if (!ms) {
            cov_free(&c);
            return pl_errf(err, errlen, "planner: out of memory");
        }
        int nm = 0;
        for (int m = lo; m <= hi; m++) {
            c.tstar[m] = -1;
            if (finishes(&c, m)) ms[nm++] = m;
        }
        search(&c, 1, rmax, ms, nm);
        rc = rebuild_plans(&c, ms, nm, lo, global_batch, plans);
        free(ms);
    }
    cov_free(&c);
    if (rc) return pl_errf(err, errlen, "planner: out of memory");
    /* uncovered node counts idle what the largest covered smaller count leaves */
    for (int m = lo, last = 0; m <= hi; m++) {
        if (plans[m - lo].covered)
            last = m;
        else
            plans[m - lo].idle_nodes = last ? m - last : m;
    }
    return 0;
}

int pl_coverage_compute(const pl_template_set *ts, int nodes, int tolerate, int64_t global_batch,
                        int microbatch_size, pl_coverage *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (ts->n0 < 1) return pl_errf(err, errlen, "templates: no feasible template");
    int lo = (tolerate + 1) * ts->n0;
    if (lo > nodes)
        return pl_errf(err, errlen, "--tolerate: %d failures need at least %d nodes, have %d",
                       tolerate, lo, nodes);
    pl_instance_plan *plans = pl_calloc((size_t)(nodes - lo + 1), sizeof *plans);
    if (!plans) return pl_errf(err, errlen, "planner: out of memory");
    if (plan_range(ts, lo, nodes, tolerate, global_batch, microbatch_size, plans, err, errlen)) {
        for (int m = lo; m <= nodes; m++) pl_instance_plan_free(&plans[m - lo]);
        free(plans);
        return -1;
    }
    /* entries descend from N to (F+1)·n0 */
    for (int a = 0, b = nodes - lo; a < b; a++, b--) {
        pl_instance_plan tmp = plans[a];
        plans[a] = plans[b];
        plans[b] = tmp;
    }
    out->entries = plans;
    out->count = nodes - lo + 1;
    out->nodes_hi = nodes;
    out->nodes_lo = lo;
    out->tolerate = tolerate;
    out->global_batch = global_batch;
    out->microbatches = global_batch / microbatch_size;
    return 0;
}

int pl_instantiate(const pl_template_set *ts, int nodes, int tolerate, int64_t global_batch,
                   int microbatch_size, pl_instance_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (nodes < 1) return pl_errf(err, errlen, "nodes: must be at least 1");
    return plan_range(ts, nodes, nodes, tolerate, global_batch, microbatch_size, out, err,
                      errlen);
}

void pl_instance_plan_free(pl_instance_plan *e)
{
    free(e->pipelines);
    e->pipelines = NULL;
    e->npipelines = 0;
}

void pl_coverage_free(pl_coverage *c)
{
    for (int i = 0; i < c->count; i++) pl_instance_plan_free(&c->entries[i]);
    free(c->entries);
    memset(c, 0, sizeof *c);
}
