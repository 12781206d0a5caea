/* The worker step on an ORDERED transport (worker/comm/xport.h: NCCL's semantics),
 * against the simulator of tests/unit/xport_sim.h: one thread per rank, CPU engines,
 * per-rank FIFOs, rendezvous p2p, collectives that need every member at the head, and
 * deadlock detection. Checks that the simulator is a rendezvous (send-then-receive on
 * both sides deadlocks, one group does not), and that
 *  (a) one pipeline of 2–4 stages, 1..8 microbatches: losses and gradients equal the
 *      whole model's bit for bit (the tied wte too: two holders summed once, as the
 *      whole model adds its head's share once);
 *  (b) heterogeneous pipelines (3 + 2 stages, other plans, 40 random ones; tied wte,
 *      ranks not in pipeline order too): equal to one process within 1e-6 over steps
 *      with AdamW, holders of a group bitwise equal, no deadlock;
 *  (c) enqueuing the wte all-reduce with the head's layer, before the final send,
 *      deadlocks (the simulator says so), and after it does not;
 *  (d) a rank dying mid-step makes every other rank's step fail instead of hanging;
 *      and an abort from another thread ends a stuck step; bad stage ranks are refused. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rng.h"
#include "util.h"
#include "whole_model.h"
#include "worker_step.h"
#include "xport_sim.h"

enum { B = 2, T = 5, BT = B * T, SEED = 3, MAX_PIPES = 4, MAX_STAGES = 4 };
static const pl_adamw ADAMW = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f};
static const float CLIP = 1.0f;

/* A pipeline: stage k holds [ends[k−1], ends[k]) (ends[−1] = 0, ends[S−1] = L + 2). */
typedef struct {
    int nstages;
    int ends[MAX_STAGES];
    int nmb;
} pipe_spec;

typedef struct world world;

typedef struct {
    world *w;
    int rank, pipe, stage, first_mb;
    kn_ctx *k;
    pl_engine e;
    pl_schedule s;
    int stage_ranks[MAX_STAGES];
    int step;
    pl_worker_step_result res;
    int rc;
    char err[2048];
} xrank;

struct world {
    int nranks, npipes, global_mb;
    int explicit_ranks;   /* pass stage_ranks (else NULL: consecutive ranks) */
    int dead_rank;        /* a rank that does not park when its step fails (−1: none) */
    pl_syncgroups g;
    xsim *sim;
    int32_t *tok, *tgt;
    xrank r[XSIM_MAX_RANKS];
};

static void *rank_main(void *arg)
{
    xrank *r = arg;
    world *w = r->w;
    pl_worker_step_args a = {
        .engine = &r->e, .schedule = &r->s, .tokens = w->tok, .targets = w->tgt,
        .first_micro = r->first_mb, .global_micro = w->global_mb, .groups = &w->g,
        .step = (uint32_t)r->step, .timeout_ms = 60000, .xport = &w->sim->x[r->rank],
        .stage_ranks = w->explicit_ranks ? r->stage_ranks : NULL,
    };
    r->rc = pl_worker_step(&a, &r->res, r->err, sizeof r->err);
    /* a dead process announces nothing: its peers must find out by themselves */
    if (!(r->rc && r->rank == w->dead_rank)) xsim_park(w->sim, r->rank, 1);
    return NULL;
}

/* Builds the ranks of `pipes`; perm (NULL: identity) maps the flattened stage index to
 * the world rank. */
static int world_init(world *w, const pipe_spec *pipes, int npipes, const int *perm,
                      int idle_ms, char *err, size_t errlen)
{
    const pl_gpt_config *c = whole_model_config();
    memset(w, 0, sizeof *w);
    w->npipes = npipes;
    w->dead_rank = -1;
    w->explicit_ranks = perm != NULL;
    pl_sync_stage st[MAX_PIPES][MAX_STAGES];
    pl_sync_pipeline sp[MAX_PIPES];
    int flat = 0;
    for (int p = 0; p < npipes; p++) {
        sp[p] = (pl_sync_pipeline){pipes[p].nstages, st[p]};
        for (int k = 0; k < pipes[p].nstages; k++, flat++) {
            const int rank = perm ? perm[flat] : flat;
            st[p][k] = (pl_sync_stage){k ? pipes[p].ends[k - 1] : 0, pipes[p].ends[k], rank};
        }
    }
    w->nranks = flat;
    if (pl_syncgroups_compute(sp, npipes, c->L, &w->g, err, errlen)) return -1;
    w->sim = xsim_new(w->nranks, idle_ms);
    int first = 0;
    for (int p = 0; p < npipes; p++) {
        for (int k = 0; k < pipes[p].nstages; k++) {
            xrank *r = &w->r[st[p][k].rank];
            r->w = w, r->rank = st[p][k].rank, r->pipe = p, r->stage = k, r->first_mb = first;
            for (int j = 0; j < pipes[p].nstages; j++) r->stage_ranks[j] = st[p][j].rank;
            if (!(r->k = kn_create("cpu", 1, err, errlen)) ||
                pl_schedule_1f1b(pipes[p].nstages, k, pipes[p].nmb, &r->s, err, errlen) ||
                pl_engine_create(&r->e, r->k, c, st[p][k].layer_begin, st[p][k].layer_end, B, T,
                                 r->s.nslots, err, errlen))
                return -1;
            pl_engine_init_random(&r->e, SEED);
        }
        first += pipes[p].nmb;
    }
    w->global_mb = first;
    w->tok = malloc(sizeof *w->tok * (size_t)(first * BT));
    w->tgt = malloc(sizeof *w->tgt * (size_t)(first * BT));
    if (!w->tok || !w->tgt) return pl_errf(err, errlen, "out of memory");
    return 0;
}

static void world_free(world *w)
{
    for (int i = 0; i < w->nranks; i++) {
        xrank *r = &w->r[i];
        if (r->k) {
            pl_engine_destroy(&r->e);
            pl_schedule_free(&r->s);
            kn_destroy(r->k);
        }
    }
    if (w->sim) xsim_free(w->sim);
    pl_syncgroups_free(&w->g);
    free(w->tok);
    free(w->tgt);
}

static void step_data(world *w, int step)
{
    rng_state = 1000 + (uint64_t)step;
    for (int i = 0; i < w->global_mb * BT; i++) {
        w->tok[i] = (int32_t)rng_range(0, whole_model_config()->V - 1);
        w->tgt[i] = (int32_t)rng_range(0, whole_model_config()->V - 1);
    }
}

/* Runs one step on every rank (each in its own thread). */
static void world_step(world *w, int step)
{
    pthread_t th[XSIM_MAX_RANKS];
    for (int i = 0; i < w->nranks; i++) xsim_park(w->sim, i, 0);
    for (int i = 0; i < w->nranks; i++) {
        w->r[i].step = step;
        pthread_create(&th[i], NULL, rank_main, &w->r[i]);
    }
    for (int i = 0; i < w->nranks; i++) pthread_join(th[i], NULL);
}

/* ‖x − ref‖ / ‖ref‖ (or ‖x − ref‖ when ref is 0). */
static double rel_diff(const float *x, const float *ref, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* Runs `steps` steps of the world and of one whole-model engine over the same
 * microbatches; after each, every rank's every gradient equals the whole model's (bit
 * for bit where `bitwise`, else within tol relative to the tensor's norm), the losses and the norm too; then AdamW with clipping on the
 * whole model, whose state every rank takes for the next step. Returns 1 when all held
 * (else prints why). */
static int run_and_compare(world *w, int steps, int bitwise, double tol, const char *label)
{
    const pl_gpt_config *c = whole_model_config();
    char err[256];
    kn_ctx *kw = kn_create("cpu", 1, err, sizeof err);
    pl_engine whole;
    if (!kw || pl_engine_create(&whole, kw, c, 0, c->L + 2, B, T, 1, err, sizeof err)) {
        printf("    %s: %s\n", label, err);
        return 0;
    }
    pl_engine_init_random(&whole, SEED);
    int ok = 1;
    double worst = 0;
    for (int step = 0; step < steps && ok; step++) {
        step_data(w, step);
        pl_engine_zero_grads(&whole);
        const double ref_loss = whole_model_step(&whole, w->tok, w->tgt, w->global_mb,
                                                 1.0f / (float)(w->global_mb * BT));
        const double ref_sumsq = pl_engine_grad_sumsq(&whole);
        world_step(w, step);
        double loss = 0, sumsq = 0;
        for (int i = 0; i < w->nranks && ok; i++) {
            const xrank *r = &w->r[i];
            if (r->rc) {
                printf("    %s step %d rank %d: %s\n", label, step, i, r->err);
                ok = 0;
                break;
            }
            loss += r->res.loss_sum;
            sumsq += r->res.grad_sumsq;
            for (int j = 0; j < r->e.ntensors; j++) {
                const pl_engine_tensor *t = &r->e.tensors[j];
                const pl_engine_tensor *wt = pl_engine_find(&whole, t->layer, t->index);
                const float *x = r->e.grads + t->offset, *ref = whole.grads + wt->offset;
                const int exact = bitwise;
                const double d = rel_diff(x, ref, t->spec.numel);
                if (d > worst) worst = d;
                if (exact ? memcmp(x, ref, t->spec.numel * sizeof *x) != 0 : d > tol) {
                    printf("    %s step %d rank %d %s: gradient %.3g from the whole model's\n",
                           label, step, i, t->name, d);
                    ok = 0;
                }
            }
        }
        /* the holders of a group have the very same sum (they stay in step) */
        for (int gi = 0; gi < w->g.ngroups && ok; gi++) {
            const pl_sync_group *g = &w->g.groups[gi];
            pl_tensor_ref a[PL_MAX_LAYER_TENSORS], b[PL_MAX_LAYER_TENSORS];
            const int n = pl_worker_group_tensors(&w->r[g->ranks[0]].e, g->key, a);
            for (int m = 1; m < g->nranks && ok; m++) {
                if (pl_worker_group_tensors(&w->r[g->ranks[m]].e, g->key, b) != n) ok = 0;
                for (int t = 0; t < n && ok; t++)
                    ok = memcmp(a[t].data, b[t].data, a[t].count * sizeof(float)) == 0;
                if (!ok)
                    printf("    %s step %d: ranks %d and %d differ in group key %d\n", label,
                           step, g->ranks[0], g->ranks[m], g->key);
            }
        }
        if (!ok) break;
        if (fabs(loss - ref_loss) > 1e-12 * fabs(ref_loss) ||
            (bitwise && w->npipes == 1 && loss != ref_loss)) {
            printf("    %s step %d: loss %.17g vs %.17g\n", label, step, loss, ref_loss);
            ok = 0;
        }
        if (fabs(sumsq - ref_sumsq) > 1e-5 * ref_sumsq) {
            printf("    %s step %d: Σgrad² %.9g vs %.9g\n", label, step, sumsq, ref_sumsq);
            ok = 0;
        }
        if (step + 1 < steps) {
            /* the next step starts from the reference's state again: AdamW's first steps
             * turn rounding noise in near-zero gradients (the key bias) into full-size
             * updates, which would blur the comparison of the steps themselves */
            const double ref_norm = sqrt(ref_sumsq);
            pl_engine_adamw(&whole, &ADAMW, ref_norm > CLIP ? CLIP / (float)ref_norm : 1.0f,
                            step + 1);
            for (int i = 0; i < w->nranks; i++) {
                pl_engine *e = &w->r[i].e;
                for (int j = 0; j < e->ntensors; j++) {
                    const pl_engine_tensor *t = &e->tensors[j];
                    const size_t off = pl_engine_find(&whole, t->layer, t->index)->offset;
                    const size_t bytes = t->spec.numel * sizeof(float);
                    memcpy(e->params + t->offset, whole.params + off, bytes);
                    memcpy(e->m + t->offset, whole.m + off, bytes);
                    memcpy(e->v + t->offset, whole.v + off, bytes);
                }
            }
        }
    }
    if (steps > 1) printf("    %s: worst gradient difference %.3g\n", label, worst);
    pl_engine_destroy(&whole);
    kn_destroy(kw);
    return ok;
}

/* ---- the simulator itself ---- */

typedef struct {
    xsim *sim;
    int rank, paired, rc;
    float out[4], in[4];
    char err[2048];
} swap_rank;

/* Both ranks send to each other then receive: as two groups (rendezvous one at a time)
 * or as one group (paired). */
static void *swap_main(void *arg)
{
    swap_rank *r = arg;
    const pl_xport *x = &r->sim->x[r->rank];
    const pl_xport_op ops[2] = {{1 - r->rank, 1, r->out, 4}, {1 - r->rank, 0, r->in, 4}};
    r->rc = r->paired ? x->p2p(x->ctx, ops, 2, r->err, sizeof r->err)
                      : x->p2p(x->ctx, &ops[0], 1, r->err, sizeof r->err) ||
                            x->p2p(x->ctx, &ops[1], 1, r->err, sizeof r->err);
    if (r->rc == 0) r->rc = x->wait(x->ctx, 10000, r->err, sizeof r->err);
    xsim_park(r->sim, r->rank, 1);
    return NULL;
}

/* The simulator is a rendezvous, like NCCL: two ranks that each send before receiving
 * deadlock (buffered sends would not), and the same operations in one group complete. */
static void test_simulator_sends_are_rendezvous(void)
{
    for (int paired = 0; paired < 2; paired++) {
        xsim *sim = xsim_new(2, 20000);
        swap_rank r[2];
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            r[i] = (swap_rank){.sim = sim, .rank = i, .paired = paired};
            for (int j = 0; j < 4; j++) r[i].out[j] = (float)(10 * i + j);
            pthread_create(&th[i], NULL, swap_main, &r[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        xsim_free(sim);
        for (int i = 0; i < 2; i++) {
            if (!paired) {
                CHECK_EQ_INT(r[i].rc, -1);
                CHECK_STR_CONTAINS(r[i].err, "deadlock");
            } else {
                CHECK_EQ_INT(r[i].rc, 0);
                CHECK(memcmp(r[i].in, r[1 - i].out, sizeof r[i].in) == 0);
            }
        }
        if (!paired) printf("    %s\n", r[0].err);
    }
}

/* ---- (a) one pipeline ---- */

static int one_pipeline(int nstages, const int *ends, int nmb)
{
    pipe_spec p = {nstages, {0}, nmb};
    memcpy(p.ends, ends, (size_t)nstages * sizeof *ends);
    world *w = calloc(1, sizeof *w);
    char err[256], label[64];
    int ok = world_init(w, &p, 1, NULL, 20000, err, sizeof err) == 0;
    if (!ok) printf("    setup: %s\n", err);
    snprintf(label, sizeof label, "S=%d cut at %d Nb=%d", nstages, ends[0], nmb);
    ok = ok && run_and_compare(w, 1, 1, 1e-6, label);
    world_free(w);
    free(w);
    return ok;
}

static void test_one_pipeline_equals_whole_model(void)
{
    const int L2 = whole_model_config()->L + 2;
    int runs = 0;
    for (int Nb = 1; Nb <= 8; Nb++) {
        for (int cut = 1; cut < L2; cut++) {
            const int two[2] = {cut, L2};
            CHECK(one_pipeline(2, two, Nb));
            runs++;
        }
        static const int three[][3] = {{1, 2, 5}, {2, 4, 5}, {1, 4, 5}};
        for (int i = 0; i < 3; i++, runs++) CHECK(one_pipeline(3, three[i], Nb));
        static const int four[][4] = {{1, 2, 3, 5}, {1, 3, 4, 5}};
        for (int i = 0; i < 2; i++, runs++) CHECK(one_pipeline(4, four[i], Nb));
    }
    printf("    %d pipelines of 2-4 stages, 1-8 microbatches: gradients bit for bit\n", runs);
}

/* ---- (b) heterogeneous pipelines ---- */

static void test_heterogeneous_pipelines_equal_one_process(void)
{
    /* test_worker_step's plan: [0,2) [2,3) [3,5) with 5 microbatches, [0,3) [3,5) with 3 */
    const pipe_spec p32[2] = {{3, {2, 3, 5}, 5}, {2, {3, 5}, 3}};
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(world_init(w, p32, 2, NULL, 20000, err, sizeof err) == 0);
    int ok = run_and_compare(w, 4, 0, 1e-6, "3 + 2 stages");
    world_free(w);
    free(w);
    CHECK(ok);
}

/* More plans: layer l held by stages at different depths of different pipelines, data
 * parallel whole-model ranks, pipelines of very different lengths, and world ranks
 * that are not in pipeline order (explicit stage_ranks). */
static void test_more_heterogeneous_plans(void)
{
    static const struct {
        int npipes;
        pipe_spec p[MAX_PIPES];
        int perm[XSIM_MAX_RANKS];
        int use_perm;
    } plans[] = {
        {2, {{1, {5}, 2}, {1, {5}, 3}}, {0}, 0},
        {3, {{2, {2, 5}, 3}, {3, {1, 4, 5}, 4}, {1, {5}, 1}}, {0}, 0},
        {2, {{4, {1, 2, 3, 5}, 6}, {1, {5}, 2}}, {0}, 0},
        {2, {{2, {4, 5}, 2}, {2, {1, 5}, 5}}, {0}, 0},
        {2, {{3, {2, 3, 5}, 4}, {2, {3, 5}, 4}}, {4, 0, 2, 1, 3}, 1},
        {3, {{2, {3, 5}, 2}, {2, {2, 5}, 3}, {2, {1, 5}, 1}}, {5, 1, 0, 3, 2, 4}, 1},
    };
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        world *w = calloc(1, sizeof *w);
        char err[256], label[32];
        snprintf(label, sizeof label, "plan %zu", i);
        CHECK(world_init(w, plans[i].p, plans[i].npipes, plans[i].use_perm ? plans[i].perm : NULL,
                         20000, err, sizeof err) == 0);
        int ok = run_and_compare(w, 2, 0, 1e-6, label);
        world_free(w);
        free(w);
        CHECK(ok);
    }
}

/* Random plans: 1-3 pipelines of 1-4 stages cut anywhere, 1-6 microbatches each, world
 * ranks shuffled half of the time. None may deadlock, all must equal one process. */
static void test_random_plans(void)
{
    const int NL = whole_model_config()->L + 2;
    int nplans = 0, maxranks = 0;
    for (int c = 0; c < 40; c++) {
        rng_state = 9000 + (uint64_t)c;
        pipe_spec p[MAX_PIPES];
        int np = (int)rng_range(1, 3), nr = 0;
        for (int q = 0; q < np; q++) {
            int ns = (int)rng_range(1, 4);
            if (nr + ns > XSIM_MAX_RANKS) ns = XSIM_MAX_RANKS - nr;
            if (ns < 1) {
                np = q;
                break;
            }
            /* ns − 1 distinct cuts in 1 .. NL−1, ascending */
            int used[16] = {0}, k = 0;
            for (int m = 0; m < ns - 1;) {
                int cut = (int)rng_range(1, NL - 1);
                if (!used[cut]) used[cut] = 1, m++;
            }
            for (int cut = 1; cut < NL; cut++)
                if (used[cut]) p[q].ends[k++] = cut;
            p[q].ends[k] = NL;
            p[q].nstages = ns;
            p[q].nmb = (int)rng_range(1, 6);
            nr += ns;
        }
        int perm[XSIM_MAX_RANKS];
        for (int i = 0; i < nr; i++) perm[i] = i;
        const int shuffle = (int)rng_range(0, 1);
        for (int i = nr - 1; shuffle && i > 0; i--) {
            int j = (int)rng_range(0, i), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        world *w = calloc(1, sizeof *w);
        char err[256], label[32];
        snprintf(label, sizeof label, "random plan %d", c);
        CHECK(world_init(w, p, np, shuffle ? perm : NULL, 20000, err, sizeof err) == 0);
        int ok = run_and_compare(w, 1, 0, 1e-6, label);
        if (!ok)
            for (int q = 0; q < np; q++)
                printf("    pipeline %d: %d stages ending at layers %d %d %d %d, %d microbatches\n",
                       q, p[q].nstages, p[q].ends[0], p[q].ends[1], p[q].ends[2], p[q].ends[3],
                       p[q].nmb);
        world_free(w);
        free(w);
        CHECK(ok);
        nplans++;
        if (nr > maxranks) maxranks = nr;
    }
    printf("    %d random plans (up to %d ranks): equal to one process, no deadlock\n", nplans,
           maxranks);
}

/* ---- (c) wte before the final send deadlocks ---- */

typedef struct {
    xsim *sim;
    int rank, early;
    kn_ctx *k;
    pl_engine e;
    pl_schedule s;
    const int32_t *tok, *tgt;
    int rc;
    char err[2048];
} mini_rank;

/* The head's wte all-reduce enqueued as the head's layer finishes (early) */
static void wte_early(void *ctx, int layer)
{
    mini_rank *m = ctx;
    if (layer != whole_model_config()->L + 1 || m->rc) return;
    const pl_xport *x = &m->sim->x[m->rank];
    const int32_t group[2] = {0, 1};
    float *buf = m->e.grads + m->e.tensors[m->e.wte_tensor].offset;
    const size_t n = m->e.tensors[m->e.wte_tensor].spec.numel;
    m->rc = x->allreduce(x->ctx, group, 2, &buf, &n, 1, m->err, sizeof m->err);
}

static void *mini_main(void *arg)
{
    mini_rank *m = arg;
    const pl_xport *x = &m->sim->x[m->rank];
    const int ranks[2] = {0, 1};
    pl_stage_xlink link = {x, ranks};
    pl_stage_batch batch = {.tokens = m->tok, .targets = m->tgt,
                            .dloss_scale = 1.0f / (float)(m->s.nmicro * BT)};
    pl_engine_zero_grads(&m->e);
    const int head = pl_engine_has_head(&m->e);
    int rc = pl_stage_step_xport(&m->e, &m->s, &link, &batch, head && m->early ? wte_early : NULL,
                                 m, NULL, m->err, sizeof m->err);
    if (rc == 0) rc = m->rc;
    if (rc == 0 && !(head && m->early)) {
        const int32_t group[2] = {0, 1};
        float *buf = m->e.grads + m->e.tensors[m->e.wte_tensor].offset;
        const size_t n = m->e.tensors[m->e.wte_tensor].spec.numel;
        rc = x->allreduce(x->ctx, group, 2, &buf, &n, 1, m->err, sizeof m->err);
    }
    if (rc == 0) rc = x->wait(x->ctx, 60000, m->err, sizeof m->err);
    m->rc = rc;
    xsim_park(m->sim, m->rank, 1);
    return NULL;
}

/* Two stages ([0,2) and [2,5): the head holds its wte copy), Nb microbatches; 0 or −1. */
static int mini_run(int early, int Nb, char *why, size_t whylen)
{
    const pl_gpt_config *c = whole_model_config();
    char err[256];
    mini_rank m[2];
    memset(m, 0, sizeof m);
    xsim *sim = xsim_new(2, 20000);
    int32_t *tok = malloc(sizeof *tok * (size_t)(Nb * BT));
    int32_t *tgt = malloc(sizeof *tgt * (size_t)(Nb * BT));
    rng_state = 5;
    for (int i = 0; i < Nb * BT; i++)
        tok[i] = (int32_t)rng_range(0, c->V - 1), tgt[i] = (int32_t)rng_range(0, c->V - 1);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        m[r] = (mini_rank){.sim = sim, .rank = r, .early = early, .tok = tok, .tgt = tgt};
        m[r].k = kn_create("cpu", 1, err, sizeof err);
        pl_schedule_1f1b(2, r, Nb, &m[r].s, err, sizeof err);
        pl_engine_create(&m[r].e, m[r].k, c, r ? 2 : 0, r ? c->L + 2 : 2, B, T, m[r].s.nslots,
                         err, sizeof err);
        pl_engine_init_random(&m[r].e, SEED);
    }
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, mini_main, &m[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    int rc = m[0].rc || m[1].rc ? -1 : 0;
    snprintf(why, whylen, "%s", m[0].rc ? m[0].err : m[1].err);
    if (rc == 0) { /* both wte copies hold the sum */
        const pl_engine_tensor *a = &m[0].e.tensors[m[0].e.wte_tensor];
        const pl_engine_tensor *b = &m[1].e.tensors[m[1].e.wte_tensor];
        if (memcmp(m[0].e.grads + a->offset, m[1].e.grads + b->offset,
                   a->spec.numel * sizeof(float)))
            rc = -1, snprintf(why, whylen, "wte copies differ");
    }
    for (int r = 0; r < 2; r++) {
        pl_engine_destroy(&m[r].e);
        pl_schedule_free(&m[r].s);
        kn_destroy(m[r].k);
    }
    xsim_free(sim);
    free(tok);
    free(tgt);
    return rc;
}

static void test_wte_before_the_final_send_deadlocks(void)
{
    char why[2048];
    for (int Nb = 1; Nb <= 4; Nb++) {
        CHECK_EQ_INT(mini_run(0, Nb, why, sizeof why), 0);
        CHECK_EQ_INT(mini_run(1, Nb, why, sizeof why), -1);
        CHECK_STR_CONTAINS(why, "deadlock");
        /* stage 0 waits for the last gradient, the head for stage 0 in the all-reduce */
        CHECK_STR_CONTAINS(why, "rank 0: p2p{");
        CHECK_STR_CONTAINS(why, "recv←1 n=");
        CHECK_STR_CONTAINS(why, "rank 1: allreduce{0,1}");
    }
    printf("    %s\n", why);
}

/* ---- (d) failures ---- */

/* Rank 1 (stage 1 of the 3-stage pipeline) dies at its 4th enqueue: its step fails, and
 * every other rank's fails too once nothing has moved for idle_ms (they all need it,
 * directly or through shared groups), naming the dead rank. */
static void test_a_dead_rank_fails_every_step(void)
{
    const pipe_spec p32[2] = {{3, {2, 3, 5}, 5}, {2, {3, 5}, 3}};
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(world_init(w, p32, 2, NULL, 1000, err, sizeof err) == 0);
    step_data(w, 0);
    xsim_fail_at(w->sim, 1, 4);
    w->dead_rank = 1;
    const double t0 = pl_now_ms();
    world_step(w, 0);
    const double ms = pl_now_ms() - t0;
    int ok = 1;
    for (int i = 0; i < w->nranks; i++) {
        const xrank *r = &w->r[i];
        if (r->rc != -1) ok = 0, printf("    rank %d: step returned %d\n", i, r->rc);
        const char *want = i == 1 ? "injected failure" : "no progress for 1000 ms";
        if (!strstr(r->err, want)) ok = 0, printf("    rank %d: \"%s\"\n", i, r->err);
        if (i != 1 && !strstr(r->err, "rank 1: dead")) ok = 0;
    }
    printf("    after %.0f ms: rank 0: %.160s...\n", ms, w->r[0].err);
    world_free(w);
    free(w);
    CHECK(ok);
    CHECK(ms < 10000);
}

static void test_abort_ends_a_stuck_step(void)
{
    const pipe_spec p[1] = {{2, {2, 5}, 3}};
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(world_init(w, p, 1, NULL, 60000, err, sizeof err) == 0);
    step_data(w, 0);
    /* rank 1 never runs (its process hangs before the step): rank 0 alone */
    xsim_park(w->sim, 0, 0);
    xsim_aborter ab = {w->sim, 200};
    pthread_t th, ta;
    pthread_create(&ta, NULL, xsim_abort_later, &ab);
    const double t0 = pl_now_ms();
    w->r[0].step = 0;
    pthread_create(&th, NULL, rank_main, &w->r[0]);
    pthread_join(th, NULL);
    pthread_join(ta, NULL);
    const double ms = pl_now_ms() - t0;
    const int rc = w->r[0].rc;
    char msg[sizeof w->r[0].err];
    snprintf(msg, sizeof msg, "%s", w->r[0].err);
    world_free(w);
    free(w);
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(msg, "aborted by the control thread");
    CHECK(ms < 5000);
}

/* Stage ranks that do not name this rank, or name it as its own neighbour, are refused
 * before anything is enqueued. */
static void test_bad_stage_ranks_are_refused(void)
{
    const pipe_spec p[1] = {{2, {2, 5}, 2}};
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(world_init(w, p, 1, NULL, 20000, err, sizeof err) == 0);
    step_data(w, 0);
    static const int not_me[2] = {1, 0}, self_twice[2] = {0, 0};
    const int *cases[2] = {not_me, self_twice};
    const char *want[2] = {"is not this rank", "has world rank 0"};
    for (int i = 0; i < 2; i++) {
        pl_worker_step_args a = {
            .engine = &w->r[0].e, .schedule = &w->r[0].s, .tokens = w->tok,
            .targets = w->tgt, .global_micro = w->global_mb, .groups = &w->g,
            .timeout_ms = 1000, .xport = &w->sim->x[0], .stage_ranks = cases[i],
        };
        pl_worker_step_result res;
        const int rc = pl_worker_step(&a, &res, err, sizeof err);
        if (rc != -1 || !strstr(err, want[i])) {
            printf("    case %d: %d \"%s\"\n", i, rc, err);
            world_free(w);
            free(w);
            CHECK(0);
        }
    }
    world_free(w);
    free(w);
}

TEST_MAIN_BEGIN
alarm(240); /* a hang is a failure too */
RUN(test_simulator_sends_are_rendezvous);
RUN(test_one_pipeline_equals_whole_model);
RUN(test_heterogeneous_pipelines_equal_one_process);
RUN(test_more_heterogeneous_plans);
RUN(test_random_plans);
RUN(test_wte_before_the_final_send_deadlocks);
RUN(test_a_dead_rank_fails_every_step);
RUN(test_abort_ends_a_stuck_step);
RUN(test_bad_stage_ranks_are_refused);
TEST_MAIN_END
