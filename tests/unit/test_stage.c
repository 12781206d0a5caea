/* A pipeline of stages, each in its own thread with its own kernel context,
 * running the 1F1B schedule over an in-memory link (worker/engine/stage.c),
 * trains exactly like the whole model run one microbatch after another; and
 * each layer it reports finished (pl_stage_step_notify) already has its final
 * gradient. A step whose engine's stop flag is set ends at the next layer, and
 * redone it gives the uninterrupted step's gradients and loss bit for bit. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mailbox.h"
#include "rng.h"
#include "stage.h"
#include "whole_model.h"


typedef struct {
    pl_engine e;
    pl_schedule s;
    endpoint ep;
    pl_stage_batch batch;
    double loss;
    int rc;
    int ndone, done[8]; /* the layers reported finished, in order */
    float *snap[8];     /* all gradients when each was reported */
} stage_thread;

static void on_layer_done(void *ctx, int layer)
{
    stage_thread *st = ctx;
    const size_t bytes = st->e.nparams * sizeof(float);
    if (st->ndone == 8 || !(st->snap[st->ndone] = malloc(bytes))) abort();
    memcpy(st->snap[st->ndone], st->e.grads, bytes);
    st->done[st->ndone++] = layer;
}

static void *run_stage(void *arg)
{
    stage_thread *st = arg;
    pl_stage_link link = {&st->ep, box_send, box_recv, NULL};
    char err[256];
    st->rc = pl_stage_step_notify(&st->e, &st->s, &link, &st->batch, on_layer_done, st,
                                  &st->loss, err, sizeof err);
    return NULL;
}

/* Every layer of the stage reported once, highest first, each with the gradients it
 * covers (wte: with layer 0 on the embedding's stage, else with the head) already
 * final then. */
static int reports_final(const stage_thread *st)
{
    const pl_engine *e = &st->e;
    if (st->ndone != e->end - e->begin) return 0;
    for (int d = 0; d < st->ndone; d++) {
        const int l = st->done[d];
        if (l != e->end - 1 - d) return 0;
        for (int i = 0; i < e->ntensors; i++) {
            const pl_engine_tensor *t = &e->tensors[i];
            int wte_at = pl_engine_has_embedding(e) ? 0 : e->cfg.L + 1;
            int covered = i == e->wte_tensor ? l == wte_at : t->layer == l;
            if (covered && memcmp(st->snap[d] + t->offset, e->grads + t->offset,
                                  t->spec.numel * sizeof(float)))
                return 0;
        }
    }
    return 1;
}

/* Whole model vs stages cut at `cuts` (nst stages), Nb microbatches of B×T. */
static int compare(const int *cuts, int nst, int Nb)
{
    const pl_gpt_config *c = whole_model_config();
    const int B = 2, T = 5, BT = B * T;
    char err[256];
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(Nb * BT)), *tgt = malloc(sizeof(int32_t) * (size_t)(Nb * BT));
    rng_state = 7;
    for (int i = 0; i < Nb * BT; i++) {
        tok[i] = (int32_t)rng_range(0, c->V - 1);
        tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    const float scale = 1.0f / (float)(Nb * BT);

    kn_ctx *kw = kn_create("cpu", 1, err, sizeof err);
    pl_engine whole;
    pl_engine_create(&whole, kw, c, 0, c->L + 2, B, T, 1, err, sizeof err);
    pl_engine_init_random(&whole, 3);
    const double whole_loss = whole_model_step(&whole, tok, tgt, Nb, scale);

    mailbox *box = mailbox_new();
    stage_thread *st = calloc((size_t)nst, sizeof *st);
    kn_ctx *kc[8];
    pthread_t th[8];
    for (int k = 0; k < nst; k++) {
        int lo = k ? cuts[k - 1] : 0, hi = k < nst - 1 ? cuts[k] : c->L + 2;
        kc[k] = kn_create("cpu", 1, err, sizeof err);
        pl_schedule_1f1b(nst, k, Nb, &st[k].s, err, sizeof err);
        pl_engine_create(&st[k].e, kc[k], c, lo, hi, B, T, st[k].s.nslots, err, sizeof err);
        pl_engine_init_random(&st[k].e, 3);
        st[k].ep = (endpoint){box, k};
        st[k].batch = (pl_stage_batch){.tokens = tok, .targets = tgt, .dloss_scale = scale};
        pthread_create(&th[k], NULL, run_stage, &st[k]);
    }
    for (int k = 0; k < nst; k++) pthread_join(th[k], NULL);

    int ok = 1;
    for (int k = 0; k < nst; k++) ok &= st[k].rc == 0 && reports_final(&st[k]);
    ok &= st[nst - 1].loss == whole_loss;
    /* every tensor's gradient bitwise, except the tied wte (two holders, added below) */
    for (int k = 0; k < nst && ok; k++)
        for (int i = 0; i < st[k].e.ntensors; i++) {
            const pl_engine_tensor *t = &st[k].e.tensors[i];
            const pl_engine_tensor *w = pl_engine_find(&whole, t->layer, t->index);
            if (t->layer == 0 && t->index == 0) continue;
            ok &= !memcmp(st[k].e.grads + t->offset, whole.grads + w->offset,
                          t->spec.numel * sizeof(float));
        }
    const pl_engine_tensor *we = pl_engine_find(&st[0].e, 0, 0), *wh = &st[nst - 1].e.tensors[st[nst - 1].e.wte_tensor];
    const pl_engine_tensor *ww = pl_engine_find(&whole, 0, 0);
    for (size_t j = 0; j < we->spec.numel && ok; j++) {
        float emb = st[0].e.grads[we->offset + j], head = st[nst - 1].e.grads[wh->offset + j];
        float ref = whole.grads[ww->offset + j];
        /* the whole model, too, sums each holder's share apart and adds them once */
        ok &= emb + head == ref;
    }
    for (int k = 0; k < nst; k++) {
        for (int d = 0; d < st[k].ndone; d++) free(st[k].snap[d]);
        pl_engine_destroy(&st[k].e);
        pl_schedule_free(&st[k].s);
        kn_destroy(kc[k]);
    }
    pl_engine_destroy(&whole);
    kn_destroy(kw);
    free(st);
    mailbox_free(box);
    free(tok);
    free(tgt);
    return ok;
}

static void test_two_stages_every_cut(void)
{
    for (int cut = 1; cut <= whole_model_config()->L + 1; cut++)
        for (int Nb = 1; Nb <= 5; Nb++) {
            int cuts[1] = {cut};
            CHECK(compare(cuts, 2, Nb));
        }
}

static void test_three_and_four_stages(void)
{
    static const int three[][2] = {{1, 2}, {1, 4}, {2, 3}, {3, 4}};
    for (size_t i = 0; i < sizeof three / sizeof three[0]; i++) CHECK(compare(three[i], 3, 6));
    static const int four[3] = {1, 2, 3};
    CHECK(compare(four, 4, 7));
}

/* The stop flag, set from the hooks: before op `stop_op`, or (stop_op < 0) as the last
 * backward reports its first layer, the head. */
typedef struct {
    atomic_int stop;
    int stop_op, ops, layers;
} stopper;

static void stop_before_op(void *ctx, int backward, int mb)
{
    stopper *x = ctx;
    (void)backward, (void)mb;
    if (x->ops++ == x->stop_op) atomic_store(&x->stop, 1);
}

static void stop_at_layer(void *ctx, int layer)
{
    stopper *x = ctx;
    (void)layer;
    if (x->layers++ == 0 && x->stop_op < 0) atomic_store(&x->stop, 1);
}

static void test_a_stopped_step_ends_at_the_next_layer_and_is_redone_exactly(void)
{
    const pl_gpt_config *c = whole_model_config();
    enum { B = 2, T = 5, BT = B * T, Nb = 3 };
    char err[256];
    int32_t tok[Nb * BT], tgt[Nb * BT];
    rng_state = 11;
    for (int i = 0; i < Nb * BT; i++) {
        tok[i] = (int32_t)rng_range(0, c->V - 1);
        tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    kn_ctx *k = kn_create("cpu", 1, err, sizeof err);
    pl_schedule s;
    CHECK_EQ_INT(pl_schedule_1f1b(1, 0, Nb, &s, err, sizeof err), 0);
    pl_engine ref, e;
    CHECK_EQ_INT(pl_engine_create(&ref, k, c, 0, c->L + 2, B, T, s.nslots, err, sizeof err), 0);
    CHECK_EQ_INT(pl_engine_create(&e, k, c, 0, c->L + 2, B, T, s.nslots, err, sizeof err), 0);
    pl_engine_init_random(&ref, 5);
    pl_engine_init_random(&e, 5);
    const pl_stage_link none = {0};
    double ref_loss = 0, loss = 0;
    pl_stage_batch batch = {.tokens = tok, .targets = tgt, .dloss_scale = 1.0f / (Nb * BT)};
    pl_engine_zero_grads(&ref);
    CHECK_EQ_INT(pl_stage_step(&ref, &s, &none, &batch, &ref_loss, err, sizeof err), 0);

    /* stopped before op 2 (of 2·Nb): op 2 computes nothing and no op follows it */
    stopper x = {.stop_op = 2};
    e.stop = &x.stop;
    batch.before_op = stop_before_op;
    batch.op_ctx = &x;
    pl_engine_zero_grads(&e);
    CHECK_EQ_INT(pl_stage_step(&e, &s, &none, &batch, &loss, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "step aborted");
    CHECK_EQ_INT(x.ops, 3);
    /* stopped as the last backward finishes the head: no block after it */
    x = (stopper){.stop_op = -1};
    pl_engine_zero_grads(&e);
    CHECK_EQ_INT(pl_stage_step_notify(&e, &s, &none, &batch, stop_at_layer, &x, &loss, err,
                                      sizeof err), -1);
    CHECK_EQ_INT(x.layers, 1);
    /* redone: the uninterrupted step, bit for bit */
    atomic_store(&x.stop, 0);
    x.stop_op = 1000;
    pl_engine_zero_grads(&e);
    CHECK_EQ_INT(pl_stage_step(&e, &s, &none, &batch, &loss, err, sizeof err), 0);
    CHECK(loss == ref_loss);
    CHECK(!memcmp(e.grads, ref.grads, e.nparams * sizeof(float)));
    pl_engine_destroy(&e);
    pl_engine_destroy(&ref);
    pl_schedule_free(&s);
    kn_destroy(k);
}

TEST_MAIN_BEGIN
RUN(test_two_stages_every_cut);
RUN(test_three_and_four_stages);
RUN(test_a_stopped_step_ends_at_the_next_layer_and_is_redone_exactly);
TEST_MAIN_END
