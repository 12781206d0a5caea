/* Independent check of the template planner (Oobleck §4.1) against a brute
 * force written from the cost model of the planner issue, not from
 * shared/templates.c:
 *
 *   - every number of stages S, every set of layer cuts, every assignment of a
 *     profile key d_k to each stage; the node layout is the only one possible
 *     (stages fill nodes in order, each node exactly M GPUs);
 *   - W_k = Σ fwd + bwd at d_k; C_k = transfer of the last layer's output at
 *     intra- (same node) or inter-node bandwidth; memory
 *     4·Σparam + (S−k)·Σact ≤ mem·d_k; T(4S) = ΣW + 2ΣC + (4S−1)·max W;
 *   - the template for n nodes is the minimum T(4S) over layouts using n nodes.
 *
 * Profiles are random but seeded (deterministic). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "rng.h"
#include "profile.h"
#include "templates.h"

#define MAX_L 11
#define MAX_NODES 64 /* enough for L·M / 1 */


/* ---- reference cost model --------------------------------------------------- */

static int64_t ref_transfer_ns(int64_t bytes, double GBps)
{
    /* bytes / (GBps · 1e9 B/s) seconds = bytes / GBps ns. The generator only uses
     * bandwidths that are powers of two and byte counts that are multiples of 64,
     * so this is an exact integer: no rounding convention is involved. */
    return llround((double)bytes / GBps);
}

typedef struct {
    int ok;             /* valid layout and fits in memory */
    int64_t sum_w, comm, max_w, iter;
    int64_t peak_floor, peak_ceil; /* per-GPU bytes, either rounding */
} ref_cost;

static int is_key(const pl_profile *p, int d)
{
    for (int i = 0; i < p->nkeys; i++)
        if (p->keys[i] == d) return 1;
    return 0;
}

static int key_idx(const pl_profile *p, int d)
{
    for (int i = 0; i < p->nkeys; i++)
        if (p->keys[i] == d) return i;
    return -1;
}

/* Checks the structure of a layout against the spec and evaluates its cost.
 * `nodes` is the node count the template claims. */
static ref_cost ref_eval(const pl_profile *p, int nodes, int S, const pl_stage *st)
{
    ref_cost r = {0};
    const int L = p->nlayers, M = p->gpus_per_node;
    if (S < 1 || nodes < 1) return r;
    /* layers: contiguous, non-empty, covering [0, L) */
    if (st[0].layer_begin != 0 || st[S - 1].layer_end != L) return r;
    for (int k = 0; k < S; k++) {
        if (st[k].layer_begin >= st[k].layer_end) return r;
        if (st[k].layer_begin < 0 || st[k].layer_end > L) return r;
        if (k + 1 < S && st[k].layer_end != st[k + 1].layer_begin) return r;
        if (!is_key(p, st[k].gpus)) return r;
    }
    /* nodes: start at 0, non-decreasing by steps of 0 or 1, end at nodes-1,
     * and every node's stages use exactly M GPUs */
    if (st[0].node != 0 || st[S - 1].node != nodes - 1) return r;
    int fill = 0;
    for (int k = 0; k < S; k++) {
        if (k > 0) {
            int step = st[k].node - st[k - 1].node;
            if (step != 0 && step != 1) return r;
            if (step == 1) {
                if (fill != M) return r;
                fill = 0;
            }
        }
        fill += st[k].gpus;
    }
    if (fill != M) return r;

    /* costs */
    int64_t sum_w = 0, comm = 0, max_w = 0, peak_f = 0, peak_c = 0;
    for (int k = 0; k < S; k++) {
        int ki = key_idx(p, st[k].gpus);
        int64_t w = 0, par = 0, act = 0;
        for (int l = st[k].layer_begin; l < st[k].layer_end; l++) {
            w += p->layers[l].fwd_ns[ki] + p->layers[l].bwd_ns[ki];
            par += p->layers[l].param_bytes;
            act += p->layers[l].activation_bytes;
        }
        int64_t need = 4 * par + (int64_t)(S - k) * act;
        if (need > p->gpu_memory_bytes * (int64_t)st[k].gpus) return r;
        int64_t pf = need / st[k].gpus, pc = (need + st[k].gpus - 1) / st[k].gpus;
        if (pf > peak_f) peak_f = pf;
        if (pc > peak_c) peak_c = pc;
        sum_w += w;
        if (w > max_w) max_w = w;
        if (k + 1 < S) {
            int64_t bytes = p->layers[st[k].layer_end - 1].output_bytes;
            double bw = st[k].node == st[k + 1].node ? p->intra_node_GBps : p->inter_node_GBps;
            comm += ref_transfer_ns(bytes, bw);
        }
    }
    r.ok = 1;
    r.sum_w = sum_w;
    r.comm = 2 * comm;
    r.max_w = max_w;
    r.iter = sum_w + 2 * comm + (int64_t)(4 * S - 1) * max_w;
    r.peak_floor = peak_f;
    r.peak_ceil = peak_c;
    return r;
}

/* Brute force: best[n] = minimum T(4S) over all layouts with n nodes, or -1.
 * Enumerates every cut set (bit i of mask = cut after layer i) and every
 * assignment of keys to stages (odometer); the layout follows. */
static void brute_force(const pl_profile *p, int64_t best[MAX_NODES + 1])
{
    const int L = p->nlayers, M = p->gpus_per_node, K = p->nkeys;
    for (int n = 0; n <= MAX_NODES; n++) best[n] = -1;
    for (unsigned mask = 0; mask < (1u << (L - 1)); mask++) {
        pl_stage st[MAX_L];
        int S = 0, begin = 0;
        for (int l = 0; l < L; l++) {
            if (l == L - 1 || (mask >> l & 1u)) {
                st[S].layer_begin = begin;
                st[S].layer_end = l + 1;
                S++;
                begin = l + 1;
            }
        }
        int digit[MAX_L] = {0};
        for (;;) {
            /* lay stages on nodes in order */
            int node = 0, fill = 0, bad = 0;
            for (int k = 0; k < S; k++) {
                st[k].gpus = p->keys[digit[k]];
                if (fill == M) {
                    node++;
                    fill = 0;
                }
                st[k].node = node;
                fill += st[k].gpus;
                if (fill > M) bad = 1;
            }
            if (!bad && fill == M) {
                int n = node + 1;
                ref_cost c = ref_eval(p, n, S, st);
                if (c.ok && n <= MAX_NODES && (best[n] < 0 || c.iter < best[n])) best[n] = c.iter;
            }
            int k = 0;
            while (k < S && ++digit[k] == K) digit[k++] = 0;
            if (k == S) break;
        }
    }
}

/* ---- random profiles --------------------------------------------------------- */

static void free_profile(pl_profile *p)
{
    free(p->layers);
    p->layers = NULL;
}

/* L layers, M GPUs per node, keys: 1 plus a random subset of 2..M. */
static void random_profile(pl_profile *p, int L, int M)
{
    memset(p, 0, sizeof *p);
    snprintf(p->model, sizeof p->model, "rand");
    p->microbatch_size = 1;
    p->gpus_per_node = M;
    p->nkeys = 0;
    p->keys[p->nkeys++] = 1;
    for (int d = 2; d <= M; d++)
        if (rng_next() % 3 != 0) p->keys[p->nkeys++] = d;
    static const double bws[] = {0.25, 0.5, 1, 2, 4, 8, 16, 32};
    p->intra_node_GBps = bws[rng_next() % 8];
    p->inter_node_GBps = bws[rng_next() % 8];
    p->nlayers = L;
    p->layers = calloc((size_t)L, sizeof *p->layers);
    int small = rng_next() % 4 == 0; /* small integer times: many ties */
    int64_t P = 0, A = 0;
    for (int l = 0; l < L; l++) {
        pl_layer_profile *ly = &p->layers[l];
        snprintf(ly->name, sizeof ly->name, "l%d", l);
        for (int ki = 0; ki < p->nkeys; ki++) {
            if (small) {
                ly->fwd_ns[ki] = rng_range(0, 4);
                ly->bwd_ns[ki] = rng_range(0, 4);
            } else if (ki == 0) {
                ly->fwd_ns[ki] = rng_range(1000, 60000);
                ly->bwd_ns[ki] = rng_range(1000, 120000);
            } else {
                /* more GPUs: usually faster, sometimes not */
                ly->fwd_ns[ki] = ly->fwd_ns[0] * rng_range(30, 120) / 100;
                ly->bwd_ns[ki] = ly->bwd_ns[0] * rng_range(30, 120) / 100;
            }
        }
        ly->param_bytes = rng_range(0, 1000);
        ly->activation_bytes = rng_range(0, 1000);
        ly->output_bytes = small ? 64 * rng_range(0, 2) : 64 * rng_range(0, 1000);
        P += ly->param_bytes;
        A += ly->activation_bytes;
    }
    int64_t whole = 4 * P + A; /* one stage on one GPU */
    switch (rng_next() % 4) {
    case 0: p->gpu_memory_bytes = (int64_t)1 << 50; break; /* never binds */
    case 1: p->gpu_memory_bytes = whole + rng_range(0, whole); break;
    default: /* often binds, sometimes nothing fits */
        p->gpu_memory_bytes = rng_range(whole / (2 * L + 1), whole);
        if (p->gpu_memory_bytes < 1) p->gpu_memory_bytes = 1;
        break;
    }
}

/* ---- comparisons ---------------------------------------------------------- */

static int case_failed;
static int n_cases, n_feasible, n_infeasible;

#define EXPECT(cond, ...) CHECK_COUNT(case_failed, 8, cond, __VA_ARGS__)

static void dump_profile(const pl_profile *p)
{
    printf("      profile: L=%d M=%d keys=", p->nlayers, p->gpus_per_node);
    for (int i = 0; i < p->nkeys; i++) printf("%s%d", i ? "," : "", p->keys[i]);
    printf(" mem=%" PRId64 " intra=%g inter=%g\n", p->gpu_memory_bytes, p->intra_node_GBps,
           p->inter_node_GBps);
    for (int l = 0; l < p->nlayers; l++) {
        const pl_layer_profile *ly = &p->layers[l];
        printf("      layer %d: fwd=", l);
        for (int i = 0; i < p->nkeys; i++) printf("%s%" PRId64, i ? "," : "", ly->fwd_ns[i]);
        printf(" bwd=");
        for (int i = 0; i < p->nkeys; i++) printf("%s%" PRId64, i ? "," : "", ly->bwd_ns[i]);
        printf(" par=%" PRId64 " act=%" PRId64 " out=%" PRId64 "\n", ly->param_bytes,
               ly->activation_bytes, ly->output_bytes);
    }
}

static void dump_template(const pl_template *t)
{
    printf("      template n=%d feasible=%d S=%d iter=%" PRId64 " sumW=%" PRId64 " comm=%" PRId64
           " maxW=%" PRId64 " peak=%" PRId64 "\n",
           t->nodes, t->feasible, t->nstages, t->iteration_ns, t->sum_stage_ns, t->comm_ns,
           t->max_stage_ns, t->peak_memory_bytes);
    for (int k = 0; k < t->nstages && t->stages; k++)
        printf("        stage %d: layers [%d,%d) node %d gpus %d\n", k, t->stages[k].layer_begin,
               t->stages[k].layer_end, t->stages[k].node, t->stages[k].gpus);
}

/* One returned template against the brute-force optimum for its n. */
static void check_template(const pl_profile *p, const pl_template *t, int n, int64_t best)
{
    EXPECT(t->nodes == n, "template nodes %d, expected %d", t->nodes, n);
    EXPECT(t->feasible == (best >= 0), "n=%d: feasible=%d but brute force %s", n, t->feasible,
           best >= 0 ? "finds a layout" : "finds no layout");
    if (!t->feasible || best < 0) return;
    EXPECT(t->iteration_ns == best, "n=%d: iteration_ns %" PRId64 ", brute-force minimum %" PRId64,
           n, t->iteration_ns, best);
    EXPECT(t->nstages >= 1 && t->stages != NULL, "n=%d: no stages", n);
    if (t->nstages < 1 || !t->stages) return;
    ref_cost c = ref_eval(p, t->nodes, t->nstages, t->stages);
    EXPECT(c.ok, "n=%d: returned layout is invalid or exceeds memory", n);
    if (!c.ok) return;
    EXPECT(c.iter == t->iteration_ns, "n=%d: reported iteration_ns %" PRId64 ", its stages give %" PRId64,
           n, t->iteration_ns, c.iter);
    EXPECT(c.sum_w == t->sum_stage_ns, "n=%d: sum_stage_ns %" PRId64 " vs %" PRId64, n,
           t->sum_stage_ns, c.sum_w);
    EXPECT(c.comm == t->comm_ns, "n=%d: comm_ns %" PRId64 " vs %" PRId64, n, t->comm_ns, c.comm);
    EXPECT(c.max_w == t->max_stage_ns, "n=%d: max_stage_ns %" PRId64 " vs %" PRId64, n,
           t->max_stage_ns, c.max_w);
    EXPECT(t->peak_memory_bytes == c.peak_floor || t->peak_memory_bytes == c.peak_ceil,
           "n=%d: peak_memory_bytes %" PRId64 " vs %" PRId64 "/%" PRId64, n, t->peak_memory_bytes,
           c.peak_floor, c.peak_ceil);
    EXPECT(pl_template_time(t, 4 * t->nstages) == t->iteration_ns,
           "n=%d: pl_template_time(4S) != iteration_ns", n);

    /* pl_template_evaluate on a copy of the layout reproduces the fields */
    pl_template u = {0};
    u.nodes = t->nodes;
    u.nstages = t->nstages;
    u.stages = malloc(sizeof(pl_stage) * (size_t)t->nstages);
    memcpy(u.stages, t->stages, sizeof(pl_stage) * (size_t)t->nstages);
    int rc = pl_template_evaluate(p, &u);
    EXPECT(rc == 0, "n=%d: pl_template_evaluate rejects the planner's own template", n);
    if (rc == 0) {
        EXPECT(u.iteration_ns == t->iteration_ns && u.sum_stage_ns == t->sum_stage_ns &&
                   u.comm_ns == t->comm_ns && u.max_stage_ns == t->max_stage_ns &&
                   u.peak_memory_bytes == t->peak_memory_bytes,
               "n=%d: pl_template_evaluate fields differ from the template's", n);
    }
    free(u.stages);
}

/* pl_templates_compute for n = 1..nmax against the brute force. */
static void compare_profile(const pl_profile *p, int nmax)
{
    int64_t best[MAX_NODES + 1];
    brute_force(p, best);
    pl_template_set set = {0};
    char err[256] = "";
    int rc = pl_templates_compute(p, 1, nmax, &set, err, sizeof err);
    EXPECT(rc == 0, "pl_templates_compute failed: %s", err);
    if (rc != 0) return;
    EXPECT(set.n_min == 1 && set.n_max == nmax && set.count == nmax,
           "set range [%d,%d] count %d, expected [1,%d]", set.n_min, set.n_max, set.count, nmax);
    int n0 = 0;
    for (int n = 1; n <= nmax && !n0; n++)
        if (best[n] >= 0) n0 = n;
    EXPECT(set.n0 == n0, "n0 %d, brute force %d", set.n0, n0);
    int before = case_failed;
    for (int n = 1; n <= nmax && n <= set.count; n++) {
        const pl_template *t = &set.templates[n - 1];
        check_template(p, t, n, best[n]);
        const pl_template *f = pl_template_for(&set, n);
        EXPECT((f != NULL) == (best[n] >= 0), "pl_template_for(%d) %s", n,
               f ? "non-NULL for an infeasible n" : "NULL for a feasible n");
        if (best[n] >= 0) n_feasible++;
        else n_infeasible++;
    }
    if (case_failed != before && case_failed - before <= 8) {
        dump_profile(p);
        for (int n = 1; n <= nmax && n <= set.count; n++) {
            printf("      brute force n=%d: %" PRId64 "\n", n, best[n]);
            dump_template(&set.templates[n - 1]);
        }
    }
    EXPECT(pl_template_for(&set, 0) == NULL && pl_template_for(&set, nmax + 1) == NULL,
           "pl_template_for outside the set must be NULL");
    pl_template_set_free(&set);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_transfer_ns(void)
{
    CHECK_EQ_INT(pl_transfer_ns(0, 1.0), 0);
    CHECK_EQ_INT(pl_transfer_ns(1000, 1.0), 1000);        /* 1000 B at 1 GB/s = 1 µs */
    CHECK_EQ_INT(pl_transfer_ns(1000000000, 10.0), 100000000);
    CHECK_EQ_INT(pl_transfer_ns(1, 3.0), 0);              /* 0.33 ns */
    CHECK_EQ_INT(pl_transfer_ns(2, 3.0), 1);              /* 0.67 ns */
    CHECK_EQ_INT(pl_transfer_ns(64 * 999, 0.25), 64 * 999 * 4);
    CHECK_EQ_INT(pl_transfer_ns(4000000000LL, 12.5), 320000000);
}

/* A hand-checked profile: 2 layers, M = 1, keys {1}. */
static void test_tiny_by_hand(void)
{
    pl_profile p;
    memset(&p, 0, sizeof p);
    p.microbatch_size = 1;
    p.gpus_per_node = 1;
    p.nkeys = 1;
    p.keys[0] = 1;
    p.gpu_memory_bytes = 1000000;
    p.intra_node_GBps = 1;
    p.inter_node_GBps = 1;
    p.nlayers = 2;
    p.layers = calloc(2, sizeof *p.layers);
    p.layers[0].fwd_ns[0] = 10;
    p.layers[0].bwd_ns[0] = 20; /* W = 30 */
    p.layers[1].fwd_ns[0] = 5;
    p.layers[1].bwd_ns[0] = 5; /* W = 10 */
    p.layers[0].output_bytes = 7; /* 7 ns at 1 GB/s */
    pl_template_set s = {0};
    char err[256] = "";
    int rc = pl_templates_compute(&p, 1, 3, &s, err, sizeof err);
    CHECK(rc == 0);
    /* n=1: one stage: 40 + 3·40 = 160 */
    CHECK_EQ_INT(s.templates[0].feasible, 1);
    CHECK_EQ_INT(s.templates[0].nstages, 1);
    CHECK_EQ_INT(s.templates[0].iteration_ns, 160);
    /* n=2: two stages on two nodes: ΣW 40 + 2·7 + 7·30 = 264 */
    CHECK_EQ_INT(s.templates[1].feasible, 1);
    CHECK_EQ_INT(s.templates[1].nstages, 2);
    CHECK_EQ_INT(s.templates[1].iteration_ns, 264);
    CHECK_EQ_INT(s.templates[1].comm_ns, 14);
    CHECK_EQ_INT(s.templates[1].max_stage_ns, 30);
    CHECK_EQ_INT(s.templates[1].stages[1].node, 1);
    /* n=3: more nodes than layers */
    CHECK_EQ_INT(s.templates[2].feasible, 0);
    CHECK_EQ_INT(s.n0, 1);
    pl_template_set_free(&s);

    /* memory: 1 stage needs 4·0 + 1·(a0+a1); 2 stages need (2·a0, 1·a1) */
    p.layers[0].activation_bytes = 60;
    p.layers[1].activation_bytes = 50;
    p.gpu_memory_bytes = 100; /* one stage: 110 > 100; two: 120 > 100 */
    rc = pl_templates_compute(&p, 1, 2, &s, err, sizeof err);
    CHECK(rc == 0);
    CHECK_EQ_INT(s.templates[0].feasible, 0);
    CHECK_EQ_INT(s.templates[1].feasible, 0);
    CHECK_EQ_INT(s.n0, 0);
    pl_template_set_free(&s);
    p.gpu_memory_bytes = 120; /* two stages fit exactly, one stage fits too */
    rc = pl_templates_compute(&p, 1, 2, &s, err, sizeof err);
    CHECK(rc == 0);
    CHECK_EQ_INT(s.templates[0].feasible, 1);
    CHECK_EQ_INT(s.templates[1].feasible, 1);
    CHECK_EQ_INT(s.templates[1].peak_memory_bytes, 120);
    pl_template_set_free(&s);
    p.gpu_memory_bytes = 119; /* only the one-stage template fits */
    rc = pl_templates_compute(&p, 1, 2, &s, err, sizeof err);
    CHECK(rc == 0);
    CHECK_EQ_INT(s.templates[0].feasible, 1);
    CHECK_EQ_INT(s.templates[0].peak_memory_bytes, 110);
    CHECK_EQ_INT(s.templates[1].feasible, 0);
    pl_template_set_free(&s);
    free_profile(&p);
}

/* Intra- versus inter-node bandwidth: M = 2, keys {1}, 2 layers, 1 node:
 * both stages on node 0, so the transfer uses intra_node_GBps. */
static void test_intra_inter_bandwidth(void)
{
    pl_profile p;
    memset(&p, 0, sizeof p);
    p.microbatch_size = 1;
    p.gpus_per_node = 2;
    p.nkeys = 1;
    p.keys[0] = 1;
    p.gpu_memory_bytes = 1 << 20;
    p.intra_node_GBps = 4;
    p.inter_node_GBps = 0.5;
    p.nlayers = 4;
    p.layers = calloc(4, sizeof *p.layers);
    for (int l = 0; l < 4; l++) {
        p.layers[l].fwd_ns[0] = 100;
        p.layers[l].bwd_ns[0] = 100;
        p.layers[l].output_bytes = 400; /* 100 ns intra, 800 ns inter */
    }
    pl_template_set s = {0};
    char err[256] = "";
    CHECK(pl_templates_compute(&p, 1, 2, &s, err, sizeof err) == 0);
    /* n=1: two stages of 2 layers: ΣW 800 + 2·100 + 7·400 = 3800 */
    CHECK_EQ_INT(s.templates[0].iteration_ns, 3800);
    CHECK_EQ_INT(s.templates[0].comm_ns, 200);
    /* n=2: four stages, links intra, inter, intra: 800 + 2·(100+800+100) + 15·200 = 5800 */
    CHECK_EQ_INT(s.templates[1].iteration_ns, 5800);
    CHECK_EQ_INT(s.templates[1].comm_ns, 2000);
    pl_template_set_free(&s);
    free_profile(&p);
}

static void run_random(uint64_t seed, int ncases, int maxL, int maxM)
{
    rng_state = seed;
    for (int c = 0; c < ncases; c++) {
        int L = (int)rng_range(1, maxL);
        int M = (int)rng_range(1, maxM);
        if (M >= 3 && L > 6) L = 6; /* keep 3^S enumeration small */
        pl_profile p;
        random_profile(&p, L, M);
        int nmax = (int)rng_range(1, maxL > 8 ? 6 : 4);
        if (M == 1 && rng_next() % 2) nmax = L + 1; /* up to one beyond the last feasible */
        int before = case_failed;
        compare_profile(&p, nmax);
        if (case_failed != before && before == 0) printf("      (seed %" PRIu64 ", case %d)\n", seed, c);
        n_cases++;
        free_profile(&p);
        if (case_failed > 20) break;
    }
}

/* pl_templates_compute on a sub-range [n_lo, n_hi]: same templates as the
 * brute force; n0 is the smallest feasible n of the range (or 0). */
static void test_compute_subrange(void)
{
    rng_state = 8080;
    case_failed = 0;
    for (int c = 0; c < 400 && case_failed <= 20; c++) {
        int L = (int)rng_range(1, 8);
        pl_profile p;
        random_profile(&p, L, (int)rng_range(1, 2));
        int64_t best[MAX_NODES + 1];
        brute_force(&p, best);
        int lo = (int)rng_range(1, 5), hi = lo + (int)rng_range(0, 4);
        pl_template_set s = {0};
        char err[256] = "";
        int rc = pl_templates_compute(&p, lo, hi, &s, err, sizeof err);
        EXPECT(rc == 0, "compute [%d,%d] failed: %s", lo, hi, err);
        if (rc == 0) {
            EXPECT(s.n_min == lo && s.n_max == hi && s.count == hi - lo + 1, "range [%d,%d] count %d",
                   s.n_min, s.n_max, s.count);
            int n0 = 0;
            for (int n = lo; n <= hi && !n0; n++)
                if (best[n] >= 0) n0 = n;
            EXPECT(s.n0 == n0, "[%d,%d]: n0 %d, smallest feasible in range %d", lo, hi, s.n0, n0);
            for (int i = 0; i < s.count && i <= hi - lo; i++) check_template(&p, &s.templates[i], lo + i, best[lo + i]);
            pl_template_set_free(&s);
        }
        free_profile(&p);
    }
    CHECK_EQ_INT(case_failed, 0);
}

/* M ≤ 2: keys {1} or {1,2}, as in the brief. */
static void test_random_small(void)
{
    case_failed = 0;
    n_cases = n_feasible = n_infeasible = 0;
    run_random(12345, 6000, 8, 2);
    printf("    %d profiles, %d feasible and %d infeasible node counts compared\n", n_cases,
           n_feasible, n_infeasible);
    CHECK(n_feasible > 1000 && n_infeasible > 300);
    CHECK_EQ_INT(case_failed, 0);
}

/* M up to 4 with keys like {1,2,4} or {1,3}: layouts that mix stage widths in one node. */
static void test_random_wider_nodes(void)
{
    case_failed = 0;
    n_cases = n_feasible = n_infeasible = 0;
    run_random(777, 2000, 6, 4);
    printf("    %d profiles, %d feasible and %d infeasible node counts compared\n", n_cases,
           n_feasible, n_infeasible);
    CHECK_EQ_INT(case_failed, 0);
}

/* Longer models (9 to 11 layers) on up to 6 nodes. */
static void test_random_longer(void)
{
    case_failed = 0;
    n_cases = n_feasible = n_infeasible = 0;
    run_random(31, 400, MAX_L, 2);
    printf("    %d profiles, %d feasible and %d infeasible node counts compared\n", n_cases,
           n_feasible, n_infeasible);
    CHECK_EQ_INT(case_failed, 0);
}

/* Memory binding: the same profile with unlimited and with tight memory. */
static void test_memory_binds(void)
{
    rng_state = 4242;
    int changed = 0;
    case_failed = 0;
    for (int c = 0; c < 500; c++) {
        int L = (int)rng_range(2, 8);
        pl_profile p;
        random_profile(&p, L, (int)rng_range(1, 2));
        int64_t loose[MAX_NODES + 1], tight[MAX_NODES + 1];
        p.gpu_memory_bytes = (int64_t)1 << 50;
        brute_force(&p, loose);
        /* tight: somewhere between the smallest stage and the whole model */
        int64_t P = 0, A = 0;
        for (int l = 0; l < L; l++) {
            P += p.layers[l].param_bytes;
            A += p.layers[l].activation_bytes;
        }
        p.gpu_memory_bytes = rng_range((4 * P + A) / L, 4 * P + A);
        if (p.gpu_memory_bytes < 1) p.gpu_memory_bytes = 1;
        brute_force(&p, tight);
        for (int n = 1; n <= 3; n++)
            if (loose[n] != tight[n]) changed++;
        compare_profile(&p, 3);
        free_profile(&p);
        if (case_failed > 20) break;
    }
    printf("    memory changed the optimum (or feasibility) in %d node counts\n", changed);
    CHECK(changed > 100);
    CHECK_EQ_INT(case_failed, 0);
}

/* pl_template_evaluate on random layouts, valid and invalid. */
static void test_evaluate_random_layouts(void)
{
    rng_state = 99;
    int valid = 0, invalid = 0;
    case_failed = 0;
    for (int c = 0; c < 10000; c++) {
        int L = (int)rng_range(1, MAX_L);
        int M = (int)rng_range(1, 4);
        pl_profile p;
        random_profile(&p, L, M);
        pl_stage st[MAX_L];
        int S = 0, begin = 0;
        for (int l = 0; l < L; l++)
            if (l == L - 1 || rng_next() % 2) {
                st[S].layer_begin = begin;
                st[S].layer_end = l + 1;
                st[S].gpus = p.keys[rng_next() % (uint64_t)p.nkeys];
                S++;
                begin = l + 1;
            }
        /* greedy node fill; a node that overflows just takes the stage anyway
         * (invalid), a last node that is not full is invalid too */
        int node = 0, fill = 0;
        for (int k = 0; k < S; k++) {
            if (fill >= M) {
                node++;
                fill = 0;
            }
            st[k].node = node;
            fill += st[k].gpus;
        }
        int nodes = node + 1;
        switch (rng_next() % 8) { /* mutations that are invalid by the spec */
        case 0: nodes += rng_next() % 2 ? 1 : -1; break;
        case 1: st[rng_next() % (uint64_t)S].gpus = M + 1; break; /* not a key (keys ≤ M) */
        case 2:
            if (S > 1) st[S - 1].node += 1; /* skips a node index */
            break;
        case 3: /* gap between stage 0 and stage 1 */
            if (S > 1 && st[0].layer_end - st[0].layer_begin > 1) st[0].layer_end--;
            break;
        case 4: /* overlap of stage 0 and stage 1 */
            if (S > 1 && st[0].layer_end - st[0].layer_begin > 1) st[1].layer_begin--;
            break;
        default: break;
        }
        pl_template t = {0};
        t.nodes = nodes;
        t.nstages = S;
        t.stages = st;
        ref_cost r = ref_eval(&p, nodes, S, st);
        int rc = pl_template_evaluate(&p, &t);
        EXPECT((rc == 0) == (r.ok != 0), "case %d: pl_template_evaluate returns %d, reference %s", c,
               rc, r.ok ? "valid" : "invalid");
        if (rc == 0 && r.ok) {
            EXPECT(t.iteration_ns == r.iter && t.sum_stage_ns == r.sum_w && t.comm_ns == r.comm &&
                       t.max_stage_ns == r.max_w,
                   "case %d: evaluate fields (%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
                   ") vs reference (%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ")",
                   c, t.iteration_ns, t.sum_stage_ns, t.comm_ns, t.max_stage_ns, r.iter, r.sum_w,
                   r.comm, r.max_w);
            EXPECT(t.peak_memory_bytes == r.peak_floor || t.peak_memory_bytes == r.peak_ceil,
                   "case %d: peak %" PRId64, c, t.peak_memory_bytes);
        }
        if (case_failed && (rc == 0) != (r.ok != 0) && case_failed <= 2) {
            dump_profile(&p);
            t.stages = st;
            dump_template(&t);
        }
        if (r.ok) valid++;
        else invalid++;
        free_profile(&p);
        if (case_failed > 20) break;
    }
    printf("    %d valid and %d invalid layouts\n", valid, invalid);
    CHECK(valid > 1000 && invalid > 1000);
    CHECK_EQ_INT(case_failed, 0);
}

/* pl_templates_plan: n0 by brute force, range n0 .. N − F·n0, error when
 * (F+1)·n0 > N or nothing fits; Appendix B on the planned range. */
static void test_plan_range(void)
{
    rng_state = 2024;
    int ok_plans = 0, errors = 0, appendix_b = 0;
    case_failed = 0;
    for (int c = 0; c < 1000; c++) {
        int L = (int)rng_range(1, 8);
        int M = (int)rng_range(1, 2);
        pl_profile p;
        random_profile(&p, L, M);
        int N = (int)rng_range(1, 9), F = (int)rng_range(0, 3);
        int64_t best[MAX_NODES + 1];
        brute_force(&p, best);
        int n0 = 0;
        for (int n = 1; n <= N && !n0; n++)
            if (best[n] >= 0) n0 = n;
        pl_template_set s = {0};
        char err[256] = "";
        int rc = pl_templates_plan(&p, N, F, &s, err, sizeof err);
        if (n0 == 0 || (F + 1) * n0 > N) {
            EXPECT(rc == -1, "case %d: N=%d F=%d n0=%d: plan must fail", c, N, F, n0);
            EXPECT(err[0] != '\0', "case %d: no error message", c);
            errors++;
        } else {
            EXPECT(rc == 0, "case %d: N=%d F=%d n0=%d: plan failed: %s", c, N, F, n0, err);
            if (rc == 0) {
                ok_plans++;
                EXPECT(s.n0 == n0, "case %d: n0 %d, brute force %d", c, s.n0, n0);
                EXPECT(s.n_min == n0 && s.n_max == N - F * n0 && s.count == s.n_max - s.n_min + 1,
                       "case %d: N=%d F=%d n0=%d: range [%d,%d] count %d", c, N, F, n0, s.n_min,
                       s.n_max, s.count);
                for (int i = 0; i < s.count && s.n_min == n0; i++)
                    check_template(&p, &s.templates[i], n0 + i, best[n0 + i]);
                /* Appendix B: with N ≥ (F+2)·n0, every 2·n0 − k ≥ n0 (k ≥ 1) is in range */
                if (N >= (F + 2) * n0) {
                    for (int k = 1; 2 * n0 - k >= n0; k++) {
                        int m = 2 * n0 - k;
                        EXPECT(m >= s.n_min && m <= s.n_max,
                               "Appendix B: template %d not in [%d,%d] (N=%d F=%d n0=%d)", m,
                               s.n_min, s.n_max, N, F, n0);
                        if (m >= s.n_min && m <= s.n_max)
                            EXPECT(s.templates[m - s.n_min].nodes == m, "template index");
                        appendix_b++;
                    }
                }
            }
        }
        if (rc == 0) pl_template_set_free(&s);
        free_profile(&p);
        if (case_failed > 20) break;
    }
    printf("    %d plans, %d expected errors, %d Appendix B checks\n", ok_plans, errors, appendix_b);
    CHECK(ok_plans > 200 && errors > 100 && appendix_b > 100);
    CHECK_EQ_INT(case_failed, 0);
}

/* A fixed plan: n0 = 2 (memory rules out one node), N = 8, F = 2: templates 2..4. */
static void test_plan_fixed(void)
{
    pl_profile p;
    memset(&p, 0, sizeof p);
    p.microbatch_size = 1;
    p.gpus_per_node = 1;
    p.nkeys = 1;
    p.keys[0] = 1;
    p.intra_node_GBps = 8;
    p.inter_node_GBps = 1;
    p.nlayers = 6;
    p.layers = calloc(6, sizeof *p.layers);
    for (int l = 0; l < 6; l++) {
        p.layers[l].fwd_ns[0] = 1000;
        p.layers[l].bwd_ns[0] = 2000;
        p.layers[l].param_bytes = 100;
        p.layers[l].output_bytes = 64;
    }
    p.gpu_memory_bytes = 4 * 600 - 1; /* the whole model does not fit on one GPU */
    pl_template_set s = {0};
    char err[256] = "";
    CHECK(pl_templates_plan(&p, 8, 2, &s, err, sizeof err) == 0);
    CHECK_EQ_INT(s.n0, 2);
    CHECK_EQ_INT(s.n_min, 2);
    CHECK_EQ_INT(s.n_max, 4);
    CHECK_EQ_INT(s.count, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(s.templates[i].nodes, 2 + i);
        CHECK_EQ_INT(s.templates[i].feasible, 1);
    }
    CHECK(pl_template_for(&s, 1) == NULL);
    CHECK(pl_template_for(&s, 5) == NULL);
    CHECK(pl_template_for(&s, 3) == &s.templates[1]);
    pl_template_set_free(&s);

    /* (F+1)·n0 > N: 3·2 > 5 */
    err[0] = '\0';
    CHECK(pl_templates_plan(&p, 5, 2, &s, err, sizeof err) == -1);
    CHECK(err[0] != '\0');
    /* nothing fits at all */
    p.gpu_memory_bytes = 10;
    err[0] = '\0';
    CHECK(pl_templates_plan(&p, 8, 0, &s, err, sizeof err) == -1);
    CHECK(err[0] != '\0');
    free_profile(&p);
}

/* Planning from parsed JSON: times in ms become ns; the planner result
 * matches the brute force on the parsed profile. */
static void test_parse_then_plan(void)
{
    const char *json =
        "{\"model\":\"toy\",\"microbatch_size\":2,\"gpus_per_node\":2,"
        "\"gpu_memory_bytes\":5000,\"intra_node_GBps\":2,\"inter_node_GBps\":0.5,"
        "\"layers\":["
        "{\"name\":\"emb\",\"forward_ms\":{\"1\":0.004,\"2\":0.003},\"backward_ms\":{\"1\":0.008,\"2\":0.005},"
        "\"param_bytes\":400,\"activation_bytes\":100,\"output_bytes\":640},"
        "{\"name\":\"b0\",\"forward_ms\":{\"2\":0.006,\"1\":0.010},\"backward_ms\":{\"1\":0.020,\"2\":0.012},"
        "\"param_bytes\":300,\"activation_bytes\":200,\"output_bytes\":640},"
        "{\"name\":\"b1\",\"forward_ms\":{\"1\":0.010,\"2\":0.006},\"backward_ms\":{\"1\":0.020,\"2\":0.012},"
        "\"param_bytes\":300,\"activation_bytes\":200,\"output_bytes\":640},"
        "{\"name\":\"head\",\"forward_ms\":{\"1\":0.003,\"2\":0.002},\"backward_ms\":{\"1\":0.006,\"2\":0.004},"
        "\"param_bytes\":400,\"activation_bytes\":50,\"output_bytes\":0}]}";
    pl_profile p;
    char err[256] = "";
    int rc = pl_profile_parse(json, &p, err, sizeof err);
    if (rc != 0) printf("    parse error: %s\n", err);
    CHECK(rc == 0);
    CHECK_EQ_INT(p.nlayers, 4);
    CHECK_EQ_INT(p.gpus_per_node, 2);
    CHECK_EQ_INT(p.nkeys, 2);
    CHECK_EQ_INT(p.keys[0], 1);
    CHECK_EQ_INT(p.keys[1], 2);
    CHECK_EQ_INT(p.layers[1].fwd_ns[0], 10000);
    CHECK_EQ_INT(p.layers[1].fwd_ns[1], 6000);
    CHECK_EQ_INT(p.layers[3].bwd_ns[1], 4000);
    CHECK_EQ_INT(p.gpu_memory_bytes, 5000);
    case_failed = 0;
    compare_profile(&p, 3);
    pl_profile_free(&p);
    CHECK_EQ_INT(case_failed, 0);
}

/* pl_profile_parse errors name the field path. */
static void test_parse_errors(void)
{
    static const char *head =
        "{\"model\":\"toy\",\"microbatch_size\":1,\"gpus_per_node\":2,"
        "\"gpu_memory_bytes\":5000,\"intra_node_GBps\":2,\"inter_node_GBps\":0.5,\"layers\":[";
    static const char *good =
        "{\"forward_ms\":{\"1\":1,\"2\":0.5},\"backward_ms\":{\"1\":2,\"2\":1},"
        "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}";
    static const struct {
        const char *layer1; /* the second layer */
        const char *needle;
    } cases[] = {
        {"{\"forward_ms\":{\"1\":1},\"backward_ms\":{\"1\":2,\"2\":1},"
         "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}",
         "layers[1].forward_ms"},
        {"{\"forward_ms\":{\"1\":1,\"2\":0.5},\"backward_ms\":{\"1\":-2,\"2\":1},"
         "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}",
         "layers[1].backward_ms"},
        {"{\"forward_ms\":{\"1\":1,\"2\":0.5},\"backward_ms\":{\"1\":2,\"2\":1},"
         "\"param_bytes\":-1,\"activation_bytes\":1,\"output_bytes\":1}",
         "layers[1].param_bytes"},
        {"{\"forward_ms\":{\"1\":1,\"2\":0.5},\"backward_ms\":{\"1\":2,\"2\":1},"
         "\"param_bytes\":1,\"output_bytes\":1}",
         "layers[1].activation_bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[2048], err[256] = "";
        snprintf(json, sizeof json, "%s%s,%s]}", head, good, cases[i].layer1);
        pl_profile p;
        CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), -1);
        CHECK_STR_CONTAINS(err, cases[i].needle);
    }
    /* the two layers parse when both are good */
    char json[2048], err[256] = "";
    snprintf(json, sizeof json, "%s%s,%s]}", head, good, good);
    pl_profile p;
    CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), 0);
    CHECK_EQ_INT(p.nlayers, 2);
    CHECK_EQ_INT(p.layers[1].fwd_ns[1], 500000);
    pl_profile_free(&p);
    /* a key above gpus_per_node, and no key "1" */
    snprintf(json, sizeof json,
             "%s{\"forward_ms\":{\"1\":1,\"4\":0.5},\"backward_ms\":{\"1\":2,\"4\":1},"
             "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}]}",
             head);
    CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "forward_ms");
    snprintf(json, sizeof json,
             "%s{\"forward_ms\":{\"2\":1},\"backward_ms\":{\"2\":2},"
             "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}]}",
             head);
    CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "forward_ms");
    CHECK_EQ_INT(pl_profile_parse("{not json", &p, err, sizeof err), -1);
    CHECK(err[0] != '\0');
}

/* The optional pipeline_step: parsed into ns; each bad value's error names
 * pipeline_step.FIELD and the reason. */
static void test_pipeline_step(void)
{
    static const char *head =
        "{\"model\":\"toy\",\"microbatch_size\":1,\"gpus_per_node\":1,"
        "\"gpu_memory_bytes\":5000,\"intra_node_GBps\":2,\"inter_node_GBps\":0.5,\"layers\":["
        "{\"forward_ms\":{\"1\":1},\"backward_ms\":{\"1\":2},"
        "\"param_bytes\":1,\"activation_bytes\":1,\"output_bytes\":1}]";
    static const struct {
        const char *step, *needle;
    } cases[] = {
        {"3", "pipeline_step: must be an object"},
        {"{\"workers\":9,\"threads\":1,\"steps\":39,\"ms\":42}",
         "pipeline_step.strategy: must be templates, checkpoint or redundant"},
        {"{\"strategy\":\"mirror\",\"workers\":9,\"threads\":1,\"steps\":39,\"ms\":42}",
         "pipeline_step.strategy: must be templates, checkpoint or redundant"},
        {"{\"strategy\":\"templates\",\"threads\":1,\"steps\":39,\"ms\":42}",
         "pipeline_step.workers: missing"},
        {"{\"strategy\":\"templates\",\"workers\":0,\"threads\":1,\"steps\":39,\"ms\":42}",
         "pipeline_step.workers: must be an integer in [1, 4096] (got 0)"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1.5,\"steps\":39,\"ms\":42}",
         "pipeline_step.threads: must be an integer in [1, 1024] (got 1.5)"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1,\"steps\":\"39\",\"ms\":42}",
         "pipeline_step.steps: must be an integer in [1, 1000000] (got not a number)"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1,\"steps\":39}",
         "pipeline_step.ms: missing"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1,\"steps\":39,\"ms\":0}",
         "pipeline_step.ms: must be positive (got 0)"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1,\"steps\":39,\"ms\":\"42\"}",
         "pipeline_step.ms: must be a number"},
        {"{\"strategy\":\"templates\",\"workers\":9,\"threads\":1,\"steps\":39,\"ms\":2e7}",
         "pipeline_step.ms: above 1e7 ms (got 2e+07)"},
    };
    char json[2048], err[256] = "";
    pl_profile p;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "%s,\"pipeline_step\":%s}", head, cases[i].step);
        CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), -1);
        CHECK_STR_CONTAINS(err, cases[i].needle);
    }
    snprintf(json, sizeof json, "%s,\"pipeline_step\":{\"strategy\":\"redundant\",\"workers\":9,"
             "\"threads\":1,\"steps\":39,\"ms\":42.5}}", head);
    CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), 0);
    CHECK_STR_CONTAINS(p.pipeline_step.strategy, "redundant");
    CHECK_EQ_INT(p.pipeline_step.workers, 9);
    CHECK_EQ_INT(p.pipeline_step.threads, 1);
    CHECK_EQ_INT(p.pipeline_step.steps, 39);
    CHECK_EQ_INT(p.pipeline_step.ns, 42500000);
    pl_profile_free(&p);
    snprintf(json, sizeof json, "%s}", head); /* none: not measured */
    CHECK_EQ_INT(pl_profile_parse(json, &p, err, sizeof err), 0);
    CHECK_EQ_INT(p.pipeline_step.workers, 0);
    pl_profile_free(&p);
}

TEST_MAIN_BEGIN
RUN(test_transfer_ns);
RUN(test_tiny_by_hand);
RUN(test_intra_inter_bandwidth);
RUN(test_random_small);
RUN(test_random_wider_nodes);
RUN(test_random_longer);
RUN(test_compute_subrange);
RUN(test_memory_binds);
RUN(test_evaluate_random_layouts);
RUN(test_plan_range);
RUN(test_plan_fixed);
RUN(test_parse_then_plan);
RUN(test_parse_errors);
RUN(test_pipeline_step);
TEST_MAIN_END
