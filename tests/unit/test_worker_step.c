/* Distributed training steps (worker/engine/worker_step.c) equal single-process
 * training: two heterogeneous pipelines (3 stages and 2 stages), 5 ranks as 5 threads
 * with their own kernel contexts and engines, activations over an in-memory link per
 * pipeline (or the TCP stage link), gradients all-reduced over a real TCP mesh on 127.0.0.1, the Σgrad² shares
 * summed into the global norm for clipping, then AdamW. Compared per step with ONE
 * whole-model engine over the same microbatches.
 *
 * Then the overlap of sync and backward (Oobleck §6.1) on two data-parallel ranks: the
 * all-reduces start while the stage still runs (with a step time against
 * stage-then-sync, as context), and failures of either side end the step without
 * hanging. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "check.h"
#include "mailbox.h"
#include "mesh.h"
#include "rng.h"
#include "shadow.h"
#include "stage_link.h"
#include "util.h"
#include "whole_model.h"
#include "worker_step.h"


/* ---- the setup ---- */

enum { NRANKS = 5, NPIPE = 2, B = 2, T = 5, BT = B * T, GLOBAL_MB = 8, STEPS = 5, SEED = 3 };
static const float CLIP = 1.0f;
static const pl_adamw ADAMW = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = 0.1f};

/* Pipeline 0: ranks 0, 1, 2 with layers [0,2) [2,3) [3,5); pipeline 1: ranks 3, 4 with
 * [0,3) [3,5) (L = 3: layers 0 .. 4). Microbatches 5 + 3. */
static const pl_sync_stage P0[3] = {{0, 2, 0}, {2, 3, 1}, {3, 5, 2}};
static const pl_sync_stage P1[2] = {{0, 3, 3}, {3, 5, 4}};
static const int PIPE_OF[NRANKS] = {0, 0, 0, 1, 1}, STAGE_OF[NRANKS] = {0, 1, 2, 0, 1};
static const int NSTAGES[NPIPE] = {3, 2}, FIRST_MB[NPIPE] = {0, 5}, NMB[NPIPE] = {5, 3};

static const pl_gpt_config *config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 3, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

/* The step's sample data: a pure function of the step. */
static void step_data(int step, int32_t *tok, int32_t *tgt)
{
    rng_state = 1000 + (uint64_t)step;
    for (int i = 0; i < GLOBAL_MB * BT; i++) {
        tok[i] = (int32_t)rng_range(0, config()->V - 1);
        tgt[i] = (int32_t)rng_range(0, config()->V - 1);
    }
}

typedef struct shared_state shared_state;

typedef struct {
    int rank;
    shared_state *sh;
    kn_ctx *k;
    pl_engine e;
    pl_engine shadow; /* with rc: the successor's layers (shadow.h) */
    int has_shadow;
    pl_schedule s;
    endpoint ep;
    pl_listener *l;
    pl_conn *conns[NRANKS];
    pl_tcp_link *tl; /* with tcp_links: the stage link, the ring's wrap included */
    pl_worker_step_result res;
    int rc;
    char err[512];
} rank_thread;

struct shared_state {
    pl_syncgroups g;
    mailbox *box[NPIPE];
    int ports[NRANKS];
    pthread_barrier_t bar;
    int32_t tok[GLOBAL_MB * BT], tgt[GLOBAL_MB * BT];
    float grad_scale;
    int failed; /* set by the main thread: ranks stop after the current step */
    pl_rc_layout rc; /* redundant layers: Bamboo's ring in both pipelines */
    int frc;         /* with rc: eager forward redundant computation (frc.h) */
    int tcp_links;   /* stage links over TCP (stage_link.h) instead of the mailbox */
    double losses[STEPS]; /* each step's mean loss */
    rank_thread r[NRANKS];
};

/* Rank r's connections as a worker makes them, in one mesh of its listener: a ring
 * connection with every other rank (r->conns) and the stage link over TCP (r->tl): prev,
 * next and, for the first and the last stage of ≥ 3 under rc, the ring's wrap. */
static int mesh_with_stage_link(rank_thread *r, char *err, size_t errlen)
{
    const shared_state *sh = r->sh;
    const int S = NSTAGES[PIPE_OF[r->rank]], k = STAGE_OF[r->rank], first = r->rank - k;
    const int wrap = sh->rc != PL_RC_NONE && S >= 3 && (k == 0 || k == S - 1) ? S - 1 - k : -1;
    const char *hosts[NRANKS];
    for (int i = 0; i < NRANKS; i++) hosts[i] = "127.0.0.1";
    char name[16];
    snprintf(name, sizeof name, "rank%d", r->rank);
    pl_mesh_config mc = {.listener = r->l, .token = "test", .token_len = 4, .name = name};
    pl_mesh *m;
    if (pl_mesh_create(&mc, &m, err, errlen)) return -1;
    pl_mesh_set_plan(m, 1, r->rank);
    unsigned char ring[NRANKS];
    for (int i = 0; i < NRANKS; i++) ring[i] = i != r->rank;
    const pl_mesh_peers peers = {.nranks = NRANKS, .hosts = hosts, .ports = sh->ports,
                                 .ring = ring, .link_prev = k > 0 ? r->rank - 1 : -1,
                                 .link_next = k + 1 < S ? r->rank + 1 : -1,
                                 .link_wrap = wrap >= 0 ? first + wrap : -1};
    pl_mesh_links links = {.ring = r->conns};
    int rc = pl_mesh_connect(m, &peers, 10000, &links, err, errlen);
    pl_mesh_destroy(m);
    if (rc) return -1;
    const int shadow = pl_shadow_grad_messages(config()->L);
    pl_tcp_link_config lc = {.stage = k, .prev = links.prev, .next = links.next,
                             .wrap = links.wrap, .wrap_stage = wrap, .timeout_ms = 10000,
                             .max_pending_wrap = shadow};
    pl_tcp_link_pending_limits(&r->s, &lc.max_pending_prev, &lc.max_pending_next);
    lc.max_pending_prev += shadow;
    lc.max_pending_next += shadow;
    return pl_tcp_link_create(&lc, &r->tl, err, errlen);
}

static void *run_rank(void *arg)
{
    rank_thread *r = arg;
    shared_state *sh = r->sh;
    const char *hosts[NRANKS];
    for (int i = 0; i < NRANKS; i++) hosts[i] = "127.0.0.1";
    char name[16];
    snprintf(name, sizeof name, "rank%d", r->rank);
    pl_comm_ident id = {.token = "test", .token_len = 4, .rank = r->rank, .name = name,
                        .generation = 1};
    r->rc = sh->tcp_links ? mesh_with_stage_link(r, r->err, sizeof r->err)
                          : pl_comm_mesh(r->l, &id, NRANKS, hosts, sh->ports, 10000, r->conns,
                                         r->err, sizeof r->err);
    pthread_barrier_wait(&sh->bar); /* mesh done */
    pthread_barrier_wait(&sh->bar); /* main checked the meshes */
    if (sh->failed) return NULL;
    pl_peer_table peers = {r->rank, NRANKS, r->conns};
    pl_stage_link link = sh->tcp_links ? pl_tcp_link_stage(r->tl)
                                       : (pl_stage_link){&r->ep, box_send, box_recv, NULL};
    for (int step = 0; step < STEPS; step++) {
        pl_worker_step_args a = {
            .engine = &r->e, .schedule = &r->s, .link = &link, .tokens = sh->tok,
            .targets = sh->tgt, .first_micro = FIRST_MB[PIPE_OF[r->rank]],
            .global_micro = GLOBAL_MB, .groups = &sh->g, .peers = &peers,
            .step = (uint32_t)step, .timeout_ms = 10000, .rc = sh->rc,
            .shadow = r->has_shadow ? &r->shadow : NULL, .frc = sh->frc,
        };
        r->rc = pl_worker_step(&a, &r->res, r->err, sizeof r->err);
        pthread_barrier_wait(&sh->bar); /* reduced */
        pthread_barrier_wait(&sh->bar); /* committed: grad_scale set (or failed) */
        if (sh->failed) return NULL;
        pl_worker_apply(&r->e, &ADAMW, sh->grad_scale, step + 1);
        if (r->has_shadow) pl_worker_apply(&r->shadow, &ADAMW, sh->grad_scale, step + 1);
        pthread_barrier_wait(&sh->bar); /* applied */
        pthread_barrier_wait(&sh->bar); /* checked, next step's data set */
        if (sh->failed) return NULL;
    }
    return NULL;
}

/* Every tensor of (layer, key) bitwise equal on all holders of the group. */
static int holders_identical(const shared_state *sh, const pl_sync_group *g)
{
    const pl_engine *a = &sh->r[g->ranks[0]].e;
    pl_tensor_ref ra[PL_MAX_LAYER_TENSORS];
    int n = pl_worker_group_tensors(a, g->key, ra);
    for (int i = 1; i < g->nranks; i++) {
        const pl_engine *b = &sh->r[g->ranks[i]].e;
        pl_tensor_ref rb[PL_MAX_LAYER_TENSORS];
        if (pl_worker_group_tensors(b, g->key, rb) != n) return 0;
        /* the refs point at gradients; the parameters are at the same offsets */
        for (int j = 0; j < n; j++) {
            const float *pa = a->params + (ra[j].data - a->grads);
            const float *pb = b->params + (rb[j].data - b->grads);
            if (ra[j].count != rb[j].count || memcmp(pa, pb, ra[j].count * sizeof(float)))
                return 0;
            const float *ga = ra[j].data, *gb = rb[j].data;
            if (memcmp(ga, gb, ra[j].count * sizeof(float))) return 0;
        }
    }
    return 1;
}

/* ‖x − ref‖ ≤ tol · ‖ref‖ over one tensor, and the largest element difference. */
static int close_rel(const float *x, const float *ref, size_t n, double tol, double *rel)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    *rel = r > 0 ? sqrt(d / r) : sqrt(d);
    return *rel <= tol;
}

/* The first failed expectation of a test, with its line. */
typedef struct {
    int ok, line;
    char detail[600];
} verdict;

#define EXPECT(v, cond, ...)                                                                 \
    do {                                                                                     \
        if ((v)->ok && !(cond)) {                                                            \
            (v)->ok = 0, (v)->line = __LINE__;                                               \
            snprintf((v)->detail, sizeof (v)->detail, __VA_ARGS__);                          \
        }                                                                                    \
    } while (0)

/* Every rank's kernels, schedule, engine (the reference's initial state), mailbox endpoint
 * and listener. */
static int make_ranks(shared_state *sh, const pl_gpt_config *c, char *err, size_t errlen)
{
    for (int i = 0; i < NRANKS; i++) {
        rank_thread *r = &sh->r[i];
        const pl_sync_stage *st = PIPE_OF[i] ? &P1[STAGE_OF[i]] : &P0[STAGE_OF[i]];
        r->rank = i, r->sh = sh;
        if (!(r->k = kn_create("cpu", 1, err, errlen)) ||
            pl_schedule_1f1b(NSTAGES[PIPE_OF[i]], STAGE_OF[i], NMB[PIPE_OF[i]], &r->s, err,
                             errlen) ||
            pl_engine_create(&r->e, r->k, c, st->layer_begin, st->layer_end, B, T, r->s.nslots,
                             err, errlen))
            return -1;
        pl_engine_init_random(&r->e, SEED);
        const int succ = pl_shadow_successor(sh->rc, STAGE_OF[i], NSTAGES[PIPE_OF[i]]);
        if (succ >= 0) {
            const pl_sync_stage *ss = PIPE_OF[i] ? &P1[succ] : &P0[succ];
            if (pl_shadow_create(&r->shadow, r->k, c, ss->layer_begin, ss->layer_end, B, T, err,
                                 errlen))
                return -1;
            r->has_shadow = 1;
            pl_engine_init_random(&r->shadow, SEED); /* a layer's values in any range */
        }
        r->ep = (endpoint){sh->box[PIPE_OF[i]], STAGE_OF[i]};
        if (pl_listener_open("127.0.0.1", 0, &r->l, err, errlen)) return -1;
        sh->ports[i] = pl_listener_port(r->l);
    }
    return 0;
}

static void free_ranks(shared_state *sh)
{
    for (int i = 0; i < NRANKS; i++) {
        rank_thread *r = &sh->r[i];
        for (int j = 0; j < NRANKS; j++)
            if (r->conns[j]) pl_conn_close(r->conns[j]);
        pl_tcp_link_destroy(r->tl);
        pl_listener_close(r->l);
        pl_engine_destroy(&r->e);
        if (r->has_shadow) pl_engine_destroy(&r->shadow);
        pl_schedule_free(&r->s);
        if (r->k) kn_destroy(r->k);
    }
}

/* The main thread's side of the ranks' barriers: each step of the reference over the same
 * microbatches, compared with what the ranks reduced; after each step every group's holders
 * must be bitwise equal. */
static void check_steps(shared_state *sh, pl_engine *whole, verdict *v)
{
    int32_t *tok = malloc(sizeof tok[0] * GLOBAL_MB * BT), *tgt = malloc(sizeof tgt[0] * GLOBAL_MB * BT);
    for (int step = 0; step < STEPS && v->ok; step++) {
        step_data(step, tok, tgt);
        pl_engine_zero_grads(whole);
        double ref_loss =
            whole_model_step(whole, tok, tgt, GLOBAL_MB, 1.0f / (float)(GLOBAL_MB * BT));
        ref_loss /= GLOBAL_MB;
        const double ref_norm = sqrt(pl_engine_grad_sumsq(whole));
        const float ref_scale = ref_norm > CLIP ? CLIP / (float)ref_norm : 1.0f;

        pthread_barrier_wait(&sh->bar); /* reduced */
        double sumsq = 0, loss = 0;
        int nloss = 0;
        for (int i = 0; i < NRANKS; i++) {
            EXPECT(v, sh->r[i].rc == 0, "step %d rank %d: %s", step, i, sh->r[i].err);
            sumsq += sh->r[i].res.grad_sumsq;
            if (sh->r[i].res.has_loss) loss += sh->r[i].res.loss_sum, nloss++;
        }
        loss /= GLOBAL_MB;
        const double norm = sqrt(sumsq);
        EXPECT(v, nloss == NPIPE, "step %d: %d ranks with the head", step, nloss);
        if (sh->rc != PL_RC_NONE) /* the same sums as without redundant layers */
            EXPECT(v, loss == sh->losses[step], "step %d: loss %.9g with shadows, %.9g without",
                   step, loss, sh->losses[step]);
        sh->losses[step] = loss;
        EXPECT(v, fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss), "step %d: loss %.9g vs %.9g",
               step, loss, ref_loss);
        EXPECT(v, fabs(norm - ref_norm) <= 1e-5 * ref_norm, "step %d: norm %.9g vs %.9g", step,
               norm, ref_norm);
        printf("    step %d: loss %.7f (ref %.7f), norm %.7f (ref %.7f)\n", step, loss, ref_loss,
               norm, ref_norm);
        sh->grad_scale = norm > CLIP ? CLIP / (float)norm : 1.0f;
        sh->failed = !v->ok;
        pthread_barrier_wait(&sh->bar); /* committed */
        if (!v->ok) break;
        pl_engine_adamw(whole, &ADAMW, ref_scale, step + 1);
        pthread_barrier_wait(&sh->bar); /* applied */
        for (int gi = 0; gi < sh->g.ngroups; gi++) {
            char name[32];
            pl_sync_key_name(sh->g.groups[gi].key, name, sizeof name);
            EXPECT(v, holders_identical(sh, &sh->g.groups[gi]),
                   "step %d: holders of %s differ after the step", step, name);
        }
        for (int i = 0; i < NRANKS && sh->rc != PL_RC_NONE; i++) {
            const int succ = pl_shadow_successor(sh->rc, STAGE_OF[i], NSTAGES[PIPE_OF[i]]);
            const int owner = i - STAGE_OF[i] + succ; /* ranks are consecutive per pipeline */
            EXPECT(v, sh->r[i].has_shadow, "rank %d has no shadow", i);
            EXPECT(v, pl_shadow_identical(&sh->r[i].shadow, &sh->r[owner].e),
                   "step %d: rank %d's shadow of stage %d differs from rank %d's layers", step,
                   i, succ, owner);
            const pl_frc_stats *f = &sh->r[i].res.frc;
            EXPECT(v, f->bubble + f->forced == (sh->frc ? NMB[PIPE_OF[i]] : 0),
                   "step %d: rank %d ran %d + %d FRCs", step, i, f->bubble, f->forced);
        }
        if (step + 1 < STEPS) step_data(step + 1, sh->tok, sh->tgt);
        sh->failed = !v->ok;
        pthread_barrier_wait(&sh->bar); /* checked */
    }
    free(tok);
    free(tgt);
}

/* Every rank's parameters equal the reference's; the worst relative difference. */
static double compare_with_whole(const shared_state *sh, const pl_engine *whole,
                                 const pl_gpt_config *c, verdict *v)
{
    double worst = 0;
    for (int i = 0; i < NRANKS && v->ok; i++) {
        const pl_engine *e = &sh->r[i].e;
        for (int j = 0; j < e->ntensors; j++) {
            const pl_engine_tensor *t = &e->tensors[j];
            const pl_engine_tensor *w = pl_engine_find(whole, t->layer, t->index);
            const size_t n = t->spec.numel;
            float *x = malloc(n * sizeof *x), *ref = malloc(n * sizeof *ref);
            memcpy(x, e->params + t->offset, n * sizeof *x);
            memcpy(ref, whole->params + w->offset, n * sizeof *ref);
            if (strstr(t->name, ".qkvb")) {
                /* The key bias has no gradient in exact arithmetic (it shifts every score
                 * of a query alike: softmax ignores it), so its gradient is rounding noise
                 * in both runs, summed in another order, and AdamW's m/√v turns that noise
                 * into updates: it starts at 0 and must stay noise-sized, nothing more. */
                for (size_t q = (size_t)c->C; q < 2 * (size_t)c->C; q++) {
                    EXPECT(v, fabsf(x[q]) < 1e-4f && fabsf(ref[q]) < 1e-4f,
                           "rank %d %s: key bias %g (reference %g) is not noise", i, t->name,
                           x[q], ref[q]);
                    x[q] = ref[q] = 0;
                }
            }
            double rel = 0;
            EXPECT(v, close_rel(x, ref, n, 1e-5, &rel),
                   "rank %d %s: parameters %.3g relative from the reference", i, t->name, rel);
            free(x);
            free(ref);
            if (rel > worst) worst = rel;
        }
    }
    return worst;
}

/* The losses of the run without redundant layers, for the run with them. */
static double plain_losses[STEPS];

static void two_pipelines(pl_rc_layout rc, int frc, int tcp_links)
{
    const pl_gpt_config *c = config();
    char err[512];
    shared_state *sh = calloc(1, sizeof *sh);
    CHECK(sh);
    sh->rc = rc;
    sh->frc = frc;
    sh->tcp_links = tcp_links;
    memcpy(sh->losses, plain_losses, sizeof plain_losses);
    pl_sync_pipeline pipes[NPIPE] = {{3, P0}, {2, P1}};
    CHECK_EQ_INT(pl_syncgroups_compute(pipes, NPIPE, c->L, &sh->g, err, sizeof err), 0);
    for (int p = 0; p < NPIPE; p++) sh->box[p] = mailbox_new();
    pthread_barrier_init(&sh->bar, NULL, NRANKS + 1);

    /* the reference: one whole-model engine */
    kn_ctx *kw = kn_create("cpu", 1, err, sizeof err);
    CHECK(kw);
    pl_engine whole;
    CHECK_EQ_INT(pl_engine_create(&whole, kw, c, 0, c->L + 2, B, T, 1, err, sizeof err), 0);
    pl_engine_init_random(&whole, SEED);
    const int made = make_ranks(sh, c, err, sizeof err) == 0;
    if (!made) printf("    %s\n", err);
    CHECK(made);
    step_data(0, sh->tok, sh->tgt);
    pthread_t th[NRANKS];
    for (int i = 0; i < NRANKS; i++) pthread_create(&th[i], NULL, run_rank, &sh->r[i]);

    verdict v = {.ok = 1};
    pthread_barrier_wait(&sh->bar); /* mesh done */
    for (int i = 0; i < NRANKS; i++)
        EXPECT(&v, sh->r[i].rc == 0, "rank %d mesh: %s", i, sh->r[i].err);
    sh->failed = !v.ok;
    pthread_barrier_wait(&sh->bar);
    check_steps(sh, &whole, &v);
    for (int i = 0; i < NRANKS; i++) pthread_join(th[i], NULL);
    const double worst = compare_with_whole(sh, &whole, c, &v);
    printf("    worst parameter relative difference after %d steps: %.3g\n", STEPS, worst);
    if (!v.ok) printf("    %s:%d: %s\n", __FILE__, v.line, v.detail);

    if (rc == PL_RC_NONE) memcpy(plain_losses, sh->losses, sizeof plain_losses);
    if (rc != PL_RC_NONE && v.ok) { /* the check sees one bit of AdamW state */
        const pl_engine *owner = &sh->r[1].e;
        uint32_t bits;
        memcpy(&bits, &sh->r[0].shadow.v[0], sizeof bits);
        bits ^= 1u;
        memcpy(&sh->r[0].shadow.v[0], &bits, sizeof bits);
        CHECK(!pl_shadow_identical(&sh->r[0].shadow, owner));
    }
    free_ranks(sh);
    pl_engine_destroy(&whole);
    kn_destroy(kw);
    for (int p = 0; p < NPIPE; p++) mailbox_free(sh->box[p]);
    pthread_barrier_destroy(&sh->bar);
    pl_syncgroups_free(&sh->g);
    free(sh);
    CHECK(v.ok);
}

static void test_two_heterogeneous_pipelines_equal_one_process(void)
{
    two_pipelines(PL_RC_NONE, 0, 0);
}

/* Strategy redundant (shadow.h): every stage of both pipelines (3 and 2 stages, Bamboo's
 * ring: the last stage shadows the first) also holds its successor's layers, updated from
 * the owner's reduced gradients. After every step each shadow's parameters and AdamW m, v
 * are byte-identical to the owner's, and the losses equal the run without shadows exactly. */
static void test_redundant_shadows_equal_their_owners(void)
{
    two_pipelines(PL_RC_RING, 0, 0);
}

/* The same with eager forward redundant computation (frc.h; Bamboo §5.2): every stage
 * also runs its successor's forward on each of its microbatches, in its waits, and the
 * losses, the gradients' norms and the shadows are still exactly those of the run
 * without it. */
static void test_redundant_eager_frc_changes_nothing(void)
{
    two_pipelines(PL_RC_RING, 1, 0);
}

/* The same over the TCP stage link a worker uses (stage_link.h): the 3-stage pipeline's
 * last stage receives stage 0's gradients over the ring's wrap, eager FRC probes the
 * link for its waits; the shadows are still byte-identical to their owners every step. */
static void test_redundant_ring_over_the_tcp_stage_link(void)
{
    two_pipelines(PL_RC_RING, 1, 1);
}

#undef EXPECT

/* ---- two data-parallel ranks, each the whole model ---- */

enum { DP_L = 4, DP_C = 256, DP_B = 2, DP_T = 16, DP_BT = DP_B * DP_T, DP_MB = 2,
       DP_STEPS = 14 };

static const pl_gpt_config *dp_config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, DP_L, DP_C, 4, 512, DP_T, err, sizeof err);
    return &c;
}

typedef struct {
    int rank;
    int compare;    /* odd steps run stage-then-sync instead, for the timing line */
    int steps;
    int shut;       /* shut the connection to the peer down before the first step */
    int timeout_ms;
    const int *ports;
    const pl_syncgroups *g;
    const int32_t *tok, *tgt;
    kn_ctx *k;
    pl_engine e;
    pl_schedule s;
    pl_listener *l;
    pl_conn *conns[2];
    pl_worker_step_result res;
    int overlapped;       /* over all steps */
    float *overlap_grads; /* with compare: the gradients after the last overlapped step */
    double ms[2];         /* wall time of the overlapped / serial steps after the first two */
    int nms[2];
    int rc;
    char err[512];
} dp_rank;

/* The step as it was before the overlap, for the timing context line: the whole stage,
 * then every group in the rank's order, on the calling thread. */
static int serial_step(const pl_worker_step_args *a, char *err, size_t errlen)
{
    pl_engine *e = a->engine;
    pl_engine_zero_grads(e);
    const size_t off = (size_t)a->first_micro * DP_BT;
    pl_stage_batch batch = {.tokens = a->tokens + off, .targets = a->targets + off,
                            .dloss_scale = 1.0f / (float)(a->global_micro * DP_BT)};
    double loss;
    if (pl_stage_step(e, a->schedule, a->link, &batch, &loss, err, errlen)) return -1;
    const pl_sync_rank *me = pl_syncgroups_rank(a->groups, (int)a->peers->self);
    const int L = a->groups->L;
    for (int i = 0; i < me->ngroups; i++) {
        const pl_sync_group *g = pl_syncgroups_group(a->groups, me->keys[i]);
        pl_tensor_ref refs[PL_MAX_LAYER_TENSORS];
        int n = pl_worker_group_tensors(e, g->key, refs);
        int32_t group[2] = {g->ranks[0], g->ranks[1]};
        uint32_t tag = a->step * (uint32_t)(L + 3) + (uint32_t)pl_sync_key_order(L, g->key);
        if (pl_ring_allreduce_many(a->peers, group, 2, refs, n, tag, NULL, a->timeout_ms, err,
                                   errlen))
            return -1;
    }
    return 0;
}

static void *dp_run(void *arg)
{
    dp_rank *r = arg;
    const char *hosts[2] = {"127.0.0.1", "127.0.0.1"};
    char name[16];
    snprintf(name, sizeof name, "rank%d", r->rank);
    pl_comm_ident id = {.token = "test", .token_len = 4, .rank = r->rank, .name = name,
                        .generation = 1};
    r->rc = pl_comm_mesh(r->l, &id, 2, hosts, r->ports, 10000, r->conns, r->err, sizeof r->err);
    if (r->rc) return NULL;
    if (r->shut) shutdown(pl_conn_fd(r->conns[1 - r->rank]), SHUT_RDWR);
    pl_peer_table peers = {r->rank, 2, r->conns};
    pl_stage_link none = {NULL, NULL, NULL, NULL}; /* one stage: no neighbours */
    for (int step = 0; step < r->steps && r->rc == 0; step++) {
        const int serial = r->compare && step % 2;
        const double t0 = pl_now_ms();
        pl_worker_step_args a = {
            .engine = &r->e, .schedule = &r->s, .link = &none, .tokens = r->tok,
            .targets = r->tgt, .first_micro = r->rank * DP_MB, .global_micro = 2 * DP_MB,
            .groups = r->g, .peers = &peers, .step = (uint32_t)step,
            .timeout_ms = r->timeout_ms,
        };
        if (serial) {
            r->rc = serial_step(&a, r->err, sizeof r->err);
        } else {
            r->rc = pl_worker_step(&a, &r->res, r->err, sizeof r->err);
            r->overlapped += r->res.overlapped;
        }
        if (step >= 2) { /* the first two warm the caches up */
            r->ms[serial] += pl_now_ms() - t0;
            r->nms[serial]++;
        }
        if (r->compare && !serial && r->rc == 0) {
            const size_t bytes = r->e.nparams * sizeof(float);
            if (!r->overlap_grads && !(r->overlap_grads = malloc(bytes))) abort();
            memcpy(r->overlap_grads, r->e.grads, bytes);
        }
    }
    return NULL;
}

typedef struct {
    pl_syncgroups g;
    int ports[2];
    int32_t tok[2 * DP_MB * DP_BT], tgt[2 * DP_MB * DP_BT];
    dp_rank r[2];
} dp_pair;

/* Two pipelines of one stage each: every group (layers and wte) is {0, 1}. */
static int dp_setup(dp_pair *p, int compare, int steps, int timeout_ms)
{
    const pl_gpt_config *c = dp_config();
    char err[256];
    static const pl_sync_stage S0[1] = {{0, DP_L + 2, 0}}, S1[1] = {{0, DP_L + 2, 1}};
    pl_sync_pipeline pipes[2] = {{1, S0}, {1, S1}};
    if (pl_syncgroups_compute(pipes, 2, c->L, &p->g, err, sizeof err)) return -1;
    rng_state = 77;
    for (int i = 0; i < 2 * DP_MB * DP_BT; i++) {
        p->tok[i] = (int32_t)rng_range(0, c->V - 1);
        p->tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    for (int i = 0; i < 2; i++) {
        dp_rank *r = &p->r[i];
        *r = (dp_rank){.rank = i, .compare = compare, .steps = steps, .timeout_ms = timeout_ms,
                       .ports = p->ports, .g = &p->g, .tok = p->tok, .tgt = p->tgt};
        r->k = kn_create("cpu", 1, err, sizeof err);
        if (!r->k || pl_schedule_1f1b(1, 0, DP_MB, &r->s, err, sizeof err) ||
            pl_engine_create(&r->e, r->k, c, 0, c->L + 2, DP_B, DP_T, r->s.nslots, err,
                             sizeof err) ||
            pl_listener_open("127.0.0.1", 0, &r->l, err, sizeof err))
            return -1;
        pl_engine_init_random(&r->e, SEED);
        p->ports[i] = pl_listener_port(r->l);
    }
    return 0;
}

static void dp_run_both(dp_pair *p)
{
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, dp_run, &p->r[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

static void dp_teardown(dp_pair *p)
{
    for (int i = 0; i < 2; i++) {
        dp_rank *r = &p->r[i];
        for (int j = 0; j < 2; j++)
            if (r->conns[j]) pl_conn_close(r->conns[j]);
        if (r->l) pl_listener_close(r->l);
        pl_engine_destroy(&r->e);
        pl_schedule_free(&r->s);
        if (r->k) kn_destroy(r->k);
        free(r->overlap_grads);
    }
    pl_syncgroups_free(&p->g);
}

static void test_sync_overlaps_the_backward(void)
{
    dp_pair *p = calloc(1, sizeof *p);
    CHECK(p);
    CHECK_EQ_INT(dp_setup(p, 1, DP_STEPS, 10000), 0);
    dp_run_both(p);
    for (int i = 0; i < 2; i++) {
        if (p->r[i].rc) printf("    rank %d: %s\n", i, p->r[i].err);
        CHECK_EQ_INT(p->r[i].rc, 0);
    }
    /* the same sums in the same order: both ranks, both ways, bit for bit (the data and
     * the parameters are the same every step) */
    const size_t bytes = p->r[0].e.nparams * sizeof(float);
    CHECK(memcmp(p->r[0].e.grads, p->r[1].e.grads, bytes) == 0);
    CHECK(memcmp(p->r[0].e.grads, p->r[0].overlap_grads, bytes) == 0);
    CHECK(memcmp(p->r[1].e.grads, p->r[1].overlap_grads, bytes) == 0);
    const int ngroups = pl_syncgroups_rank(&p->g, 0)->ngroups, nover = (DP_STEPS + 1) / 2;
    double ms[2];
    for (int m = 0; m < 2; m++)
        ms[m] = (p->r[0].ms[m] + p->r[1].ms[m]) / (p->r[0].nms[m] + p->r[1].nms[m]);
    printf("    2 ranks, L=%d C=%d, %d×%d tokens × %d microbatches each: step %.1f ms "
           "overlapped, %.1f ms stage then sync; groups started during the stage: %d and "
           "%d of %d\n",
           DP_L, DP_C, DP_B, DP_T, DP_MB, ms[0], ms[1], p->r[0].overlapped,
           p->r[1].overlapped, ngroups * nover);
    /* layer L+1's all-reduce is ready while L blocks and the embedding still run
     * backward: the comm thread starts it long before the stage ends */
    CHECK(p->r[0].overlapped > 0 && p->r[1].overlapped > 0);
    dp_teardown(p);
    free(p);
}

/* A peer whose connection dies: the first all-reduce (layer L+1, started while the
 * blocks still run backward) fails on both ranks, and both steps return −1 long before
 * the idle timeout. */
static void test_transport_failure_during_backward_fails_the_step(void)
{
    dp_pair *p = calloc(1, sizeof *p);
    CHECK(p);
    const int timeout_ms = 20000;
    CHECK_EQ_INT(dp_setup(p, 0, 1, timeout_ms), 0);
    p->r[1].shut = 1;
    double t0 = pl_now_ms();
    dp_run_both(p);
    double ms = pl_now_ms() - t0;
    char first[32];
    snprintf(first, sizeof first, "all-reduce of layer.%d", DP_L + 1);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(p->r[i].rc, -1);
        CHECK_STR_CONTAINS(p->r[i].err, first);
    }
    CHECK(ms < timeout_ms / 2);
    printf("    rank 0: %s (after %.0f ms)\n", p->r[0].err, ms);
    dp_teardown(p);
    free(p);
}

/* ---- the compute side failing: a head stage behind a link that breaks ---- */

typedef struct {
    int fail_recv_mb, fail_send_mb; /* −1: never */
} fake_link;

static int fake_send(void *ctx, int peer, pl_link_kind kind, int mb, const float *buf, size_t n,
                     char *err, size_t errlen)
{
    const fake_link *f = ctx;
    if (mb == f->fail_send_mb) return pl_errf(err, errlen, "link: send of %d broke", mb);
    return 0;
}

static int fake_recv(void *ctx, int peer, pl_link_kind kind, int mb, float *buf, size_t n,
                     char *err, size_t errlen)
{
    const fake_link *f = ctx;
    if (mb == f->fail_recv_mb) return pl_errf(err, errlen, "link: recv of %d broke", mb);
    for (size_t i = 0; i < n; i++) buf[i] = 0.01f * (float)(i % 7);
    return 0;
}

/* Stage 1 of a two-stage pipeline (rank 1: layers 2 .. L+1, the head with its wte copy)
 * whose link fails before any layer is finished (the sync thread must be woken and
 * stopped) or on the send after the last backward (every group but wte is then reduced
 * (groups of one rank) and wte has no connection): the link's error is the step's. */
static void test_link_failure_stops_the_sync(void)
{
    const pl_gpt_config *c = config();
    char err[512];
    static const pl_sync_stage S[2] = {{0, 2, 0}, {2, 5, 1}};
    pl_sync_pipeline pipe = {2, S};
    pl_syncgroups g;
    CHECK_EQ_INT(pl_syncgroups_compute(&pipe, 1, c->L, &g, err, sizeof err), 0);
    kn_ctx *k = kn_create("cpu", 1, err, sizeof err);
    CHECK(k);
    pl_schedule s;
    CHECK_EQ_INT(pl_schedule_1f1b(2, 1, 3, &s, err, sizeof err), 0);
    pl_engine e;
    CHECK_EQ_INT(pl_engine_create(&e, k, c, 2, 5, B, T, s.nslots, err, sizeof err), 0);
    pl_engine_init_random(&e, SEED);
    int32_t tgt[3 * BT];
    for (int i = 0; i < 3 * BT; i++) tgt[i] = i % c->V;
    pl_conn *conns[2] = {NULL, NULL};
    pl_peer_table peers = {1, 2, conns};
    const fake_link cases[2] = {{0, -1}, {-1, 2}};
    const char *want[2] = {"recv of 0 broke", "send of 2 broke"};
    for (int i = 0; i < 2; i++) {
        fake_link f = cases[i];
        pl_stage_link link = {&f, fake_send, fake_recv, NULL};
        pl_worker_step_args a = {.engine = &e, .schedule = &s, .link = &link,
                                 .targets = tgt, .first_micro = 0, .global_micro = 3,
                                 .groups = &g, .peers = &peers, .step = 0,
                                 .timeout_ms = 1000};
        pl_worker_step_result res;
        CHECK_EQ_INT(pl_worker_step(&a, &res, err, sizeof err), -1);
        CHECK_STR_CONTAINS(err, want[i]);
    }
    /* and with a link that works, the missing wte connection is the step's error */
    fake_link ok = {-1, -1};
    pl_stage_link link = {&ok, fake_send, fake_recv, NULL};
    pl_worker_step_args a = {.engine = &e, .schedule = &s, .link = &link, .targets = tgt,
                             .first_micro = 0, .global_micro = 3, .groups = &g,
                             .peers = &peers, .step = 0, .timeout_ms = 1000};
    pl_worker_step_result res;
    CHECK_EQ_INT(pl_worker_step(&a, &res, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "all-reduce of wte");
    pl_engine_destroy(&e);
    pl_schedule_free(&s);
    kn_destroy(k);
    pl_syncgroups_free(&g);
}

TEST_MAIN_BEGIN
RUN(test_two_heterogeneous_pipelines_equal_one_process);
RUN(test_redundant_shadows_equal_their_owners);
RUN(test_redundant_eager_frc_changes_nothing);
RUN(test_redundant_ring_over_the_tcp_stage_link);
RUN(test_sync_overlaps_the_backward);
RUN(test_transport_failure_during_backward_fails_the_step);
RUN(test_link_failure_stops_the_sync);
TEST_MAIN_END
