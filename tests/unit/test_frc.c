/* Eager forward redundant computation (worker/engine/frc.h; Bamboo §5.2): Bamboo's ring
 * of 2 and of 3 stages, each stage running its successor's forward
 * in its waits, over an in-memory link with and without the ready probe. The stages'
 * losses and gradients are bitwise those of the same step without FRC; every
 * microbatch's FRC ran once; and each swapped-out result, swapped back into the shadow,
 * holds the successor's activations of that microbatch bit for bit (its output, and
 * with the head the probabilities), as one process computes them. An abort of the step
 * ends the FRC of every wait within the part running. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "frc.h"
#include "mailbox.h"
#include "rng.h"
#include "shadow.h"
#include "stage.h"
#include "whole_model.h"

enum { B = 2, T = 5, BT = B * T, SEED = 3, MAXS = 3 };

typedef struct {
    pl_engine e, shadow;
    int has_shadow, use_frc, probe;
    pl_schedule s;
    endpoint ep;
    pl_stage_batch batch;
    pl_frc frc;
    double loss;
    int rc;
    char err[256];
} stage_thread;

static void *run_stage(void *arg)
{
    stage_thread *st = arg;
    pl_stage_link link = {&st->ep, box_send, box_recv, st->probe ? box_ready : NULL};
    st->batch.frc = NULL;
    if (st->use_frc && st->has_shadow) {
        st->rc = pl_frc_begin(&st->frc, &st->shadow, &st->e, &st->s, st->batch.tokens,
                              st->batch.targets, st->err, sizeof st->err);
        if (st->rc) return NULL;
        st->batch.frc = &st->frc;
    }
    st->rc = pl_stage_step(&st->e, &st->s, &link, &st->batch, &st->loss, st->err, sizeof st->err);
    if (st->rc == 0 && st->batch.frc) pl_frc_finish(st->batch.frc); /* what the waits left */
    return NULL;
}

typedef struct {
    int S, Nb;
    const int *bounds; /* S + 1 */
    pl_rc_layout rc;
    int32_t *tok, *tgt;
    kn_ctx *k[MAXS];
    stage_thread st[MAXS];
} pipeline;

static void make(pipeline *p, int use_frc, int probe)
{
    const pl_gpt_config *c = whole_model_config();
    char err[256];
    mailbox *box = mailbox_new();
    for (int k = 0; k < p->S; k++) {
        stage_thread *st = &p->st[k];
        memset(st, 0, sizeof *st);
        p->k[k] = kn_create("cpu", 1, err, sizeof err);
        pl_schedule_1f1b(p->S, k, p->Nb, &st->s, err, sizeof err);
        pl_engine_create(&st->e, p->k[k], c, p->bounds[k], p->bounds[k + 1], B, T, st->s.nslots,
                         err, sizeof err);
        pl_engine_init_random(&st->e, SEED);
        const int u = pl_shadow_successor(p->rc, k, p->S);
        if (u >= 0 && pl_shadow_create(&st->shadow, p->k[k], c, p->bounds[u], p->bounds[u + 1],
                                       B, T, err, sizeof err) == 0) {
            pl_engine_init_random(&st->shadow, SEED);
            st->has_shadow = 1;
        }
        st->use_frc = use_frc;
        st->probe = probe;
        st->ep = (endpoint){box, k};
        st->batch = (pl_stage_batch){.tokens = p->tok, .targets = p->tgt,
                                     .dloss_scale = 1.0f / (float)(p->Nb * BT)};
    }
    pthread_t th[MAXS];
    for (int k = 0; k < p->S; k++) pthread_create(&th[k], NULL, run_stage, &p->st[k]);
    for (int k = 0; k < p->S; k++) pthread_join(th[k], NULL);
    mailbox_free(box);
}

static void destroy(pipeline *p)
{
    for (int k = 0; k < p->S; k++) {
        if (p->st[k].has_shadow) pl_engine_destroy(&p->st[k].shadow);
        pl_engine_destroy(&p->st[k].e);
        pl_schedule_free(&p->st[k].s);
        kn_destroy(p->k[k]);
    }
}

/* Microbatch mb's activations of stage u in one process: ref[0..u] run in order. */
static void reference(const pipeline *p, pl_engine *ref, int u, int mb)
{
    const size_t off = (size_t)mb * BT;
    for (int j = 0; j <= u; j++)
        pl_engine_forward(&ref[j], 0, j == 0 ? p->tok + off : NULL,
                          j == 0 ? NULL : pl_engine_output(&ref[j - 1], 0),
                          pl_engine_has_head(&ref[j]) ? p->tgt + off : NULL);
}

/* Every FRC of stage k ran, and its results equal the reference's bit for bit. */
static int results_exact(pipeline *p, int k, pl_engine *ref)
{
    stage_thread *st = &p->st[k];
    const int u = pl_shadow_successor(p->rc, k, p->S);
    const size_t C = (size_t)st->shadow.cfg.C, Vp = (size_t)st->shadow.cfg.Vp;
    if (st->frc.stats.bubble + st->frc.stats.forced != p->Nb) return 0;
    for (int mb = 0; mb < p->Nb; mb++) {
        const void *r = pl_frc_result(&st->frc, mb);
        if (!r) return 0;
        reference(p, ref, u, mb);
        pl_engine_slot_from_host(&st->shadow, 0, r);
        if (memcmp(pl_engine_output(&st->shadow, 0), pl_engine_output(&ref[u], 0),
                   BT * C * sizeof(float)))
            return 0;
        if (pl_engine_has_head(&ref[u]) &&
            memcmp(pl_engine_probs(&st->shadow, 0), pl_engine_probs(&ref[u], 0),
                   BT * Vp * sizeof(float)))
            return 0;
    }
    return pl_frc_result(&st->frc, p->Nb) == NULL;
}

/* The pipeline with FRC against the same pipeline without it, and the FRC's results. */
static int check(const int *bounds, int S, pl_rc_layout rc, int Nb, int probe)
{
    const pl_gpt_config *c = whole_model_config();
    pipeline with = {.S = S, .Nb = Nb, .bounds = bounds, .rc = rc}, without = with;
    with.tok = without.tok = malloc(sizeof(int32_t) * (size_t)(Nb * BT));
    with.tgt = without.tgt = malloc(sizeof(int32_t) * (size_t)(Nb * BT));
    rng_state = 11;
    for (int i = 0; i < Nb * BT; i++) {
        with.tok[i] = (int32_t)rng_range(0, c->V - 1);
        with.tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    make(&with, 1, probe);
    make(&without, 0, probe);
    int ok = 1;
    for (int k = 0; k < S; k++) {
        const pl_engine *a = &with.st[k].e, *b = &without.st[k].e;
        ok &= with.st[k].rc == 0 && without.st[k].rc == 0 && with.st[k].loss == without.st[k].loss;
        ok &= !memcmp(a->grads, b->grads, a->nparams * sizeof(float));
        ok &= with.st[k].has_shadow == (pl_shadow_successor(rc, k, S) >= 0);
    }
    kn_ctx *kr = kn_create("cpu", 1, NULL, 0);
    pl_engine ref[MAXS];
    for (int j = 0; j < S; j++) {
        pl_engine_create(&ref[j], kr, c, bounds[j], bounds[j + 1], B, T, 1, NULL, 0);
        pl_engine_init_random(&ref[j], SEED);
    }
    for (int k = 0; k < S && ok; k++)
        if (with.st[k].has_shadow) ok &= results_exact(&with, k, ref);
    for (int j = 0; j < S; j++) pl_engine_destroy(&ref[j]);
    kn_destroy(kr);
    destroy(&with);
    destroy(&without);
    free(with.tok);
    free(with.tgt);
    return ok;
}

/* Bamboo's ring: stage 0 shadows stage 1 (the head), stage 1 shadows stage 0 (its FRC
 * runs on the tokens); every cut, 1 to 5 microbatches, with and without the probe. */
static void test_two_stage_ring_exact(void)
{
    const int L2 = whole_model_config()->L + 2;
    for (int cut = 1; cut < L2; cut++)
        for (int Nb = 1; Nb <= 5; Nb++)
            for (int probe = 0; probe <= 1; probe++) {
                const int bounds[3] = {0, cut, L2};
                CHECK(check(bounds, 2, PL_RC_RING, Nb, probe));
            }
}

/* The ring of 3 stages: stage 0 shadows 1, stage 1 shadows 2 (the head), stage 2 shadows
 * stage 0 (its FRC runs on the tokens, §5.1). */
static void test_three_stage_ring_exact(void)
{
    const int L2 = whole_model_config()->L + 2;
    const int bounds[2][4] = {{0, 1, 3, L2}, {0, 2, 3, L2}};
    for (int b = 0; b < 2; b++)
        for (int probe = 0; probe <= 1; probe++) CHECK(check(bounds[b], 3, PL_RC_RING, 6, probe));
}

/* The shadow's inputs are checked: a shadow with the embedding needs tokens. */
static void test_shadow_with_the_embedding_needs_tokens(void)
{
    const pl_gpt_config *c = whole_model_config();
    char err[256] = "";
    kn_ctx *k = kn_create("cpu", 1, err, sizeof err);
    pl_engine e, sh;
    pl_schedule s;
    CHECK_EQ_INT(pl_schedule_1f1b(2, 1, 2, &s, err, sizeof err), 0);
    CHECK_EQ_INT(pl_engine_create(&e, k, c, 2, c->L + 2, B, T, 1, err, sizeof err), 0);
    CHECK_EQ_INT(pl_shadow_create(&sh, k, c, 0, 2, B, T, err, sizeof err), 0);
    pl_frc f;
    const int rc = pl_frc_begin(&f, &sh, &e, &s, NULL, NULL, err, sizeof err);
    pl_engine_destroy(&sh);
    pl_engine_destroy(&e);
    pl_schedule_free(&s);
    kn_destroy(k);
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(err, "needs tokens");
}

/* ---- an abort during a fill: the stage engine's stop flag ends it within one part ---- */

/* A wait that an abort interrupts: the first test sets the stop flag, and the message or
 * the all-reduces never come. */
static int abort_comes(void *ctx)
{
    atomic_store((atomic_int *)ctx, 1);
    return 1;
}

static int never_ready(void *ctx, int peer, pl_link_kind kind, int mb)
{
    (void)peer, (void)kind, (void)mb;
    return !abort_comes(ctx);
}

/* FRC parts run so far. */
static int parts_run(const pl_frc *f)
{
    return f->next * pl_engine_forward_parts(f->shadow) + f->part;
}

/* Stage 1 of 2 shadows stage 0 (its FRC on the tokens: every input exists at once), with 6
 * microbatches to fill with; fill = 0 the receive's wait, 1 the step end's, 2 the finish. */
static int parts_after_abort(int fill)
{
    const pl_gpt_config *c = whole_model_config();
    enum { NB = 6 };
    char err[256] = "";
    kn_ctx *k = kn_create("cpu", 1, err, sizeof err);
    pl_engine e, sh;
    pl_schedule s;
    int32_t tok[NB * BT] = {0};
    atomic_int stop = 0;
    pl_schedule_1f1b(2, 1, NB, &s, err, sizeof err);
    pl_engine_create(&e, k, c, 2, c->L + 2, B, T, s.nslots, err, sizeof err);
    pl_shadow_create(&sh, k, c, 0, 2, B, T, err, sizeof err);
    pl_engine_init_random(&sh, SEED);
    e.stop = &stop;
    pl_frc f;
    int parts = -1;
    if (pl_frc_begin(&f, &sh, &e, &s, tok, NULL, err, sizeof err) == 0) {
        const pl_stage_link link = {.ctx = &stop, .ready = never_ready};
        if (fill == 0) pl_frc_fill_wait(&f, &link, 0, PL_LINK_ACTIVATION, 0);
        if (fill == 1) pl_frc_fill_while(&f, abort_comes, &stop);
        if (fill == 2) {
            pl_frc_fill_while(&f, abort_comes, &stop);
            pl_frc_finish(&f);
        }
        parts = parts_run(&f);
    }
    pl_engine_destroy(&sh);
    pl_engine_destroy(&e);
    pl_schedule_free(&s);
    kn_destroy(k);
    return parts;
}

/* The abort comes with the first wait test: the part that test let start is the last
 * (without the stop flag the fills would run all 6 microbatches' FRC). */
static void test_an_abort_ends_the_fill(void)
{
    for (int fill = 0; fill < 3; fill++) CHECK_EQ_INT(parts_after_abort(fill), 1);
}

TEST_MAIN_BEGIN
RUN(test_two_stage_ring_exact);
RUN(test_three_stage_ring_exact);
RUN(test_shadow_with_the_embedding_needs_tokens);
RUN(test_an_abort_ends_the_fill);
TEST_MAIN_END
