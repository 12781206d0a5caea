/* Evaluation through a pipeline (worker/engine/stage.c: pl_stage_eval over a link,
 * pl_stage_eval_xport over an ordered transport): stages of 1–4, each in its own thread,
 * forward the validation microbatches in order, and the last stage's loss sum equals the
 * whole model's, microbatch after microbatch, bit for bit; the gradients stay untouched. A
 * rank that dies, or an abort from another thread, ends the evaluation everywhere instead
 * of hanging. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mailbox.h"
#include "rng.h"
#include "stage.h"
#include "whole_model.h"
#include "xport_sim.h"

enum { B = 2, T = 5, BT = B * T, SEED = 3, MAXST = 4 };

typedef struct {
    pl_engine e;
    kn_ctx *k;
    int stage, nst, n, xport, rc;
    const int32_t *tok, *tgt;
    endpoint ep;    /* the link's */
    xsim *sim;      /* the ordered transport's */
    double loss;
    char err[512];
} eval_stage;

static void *run_eval(void *arg)
{
    eval_stage *s = arg;
    if (!s->xport) {
        pl_stage_link link = {&s->ep, box_send, box_recv, NULL};
        s->rc = pl_stage_eval(&s->e, s->stage, &link, s->tok, s->tgt, s->n, &s->loss, s->err,
                              sizeof s->err);
        return NULL;
    }
    const int ranks[MAXST] = {0, 1, 2, 3};
    pl_stage_xlink x = {&s->sim->x[s->stage], ranks};
    s->rc = pl_stage_eval_xport(&s->e, s->stage, &x, s->tok, s->tgt, s->n, 20000, &s->loss,
                                s->err, sizeof s->err);
    xsim_park(s->sim, s->stage, 1);
    return NULL;
}

/* n microbatches through stages cut at cuts (nst stages) vs the whole model. */
static int compare(const int *cuts, int nst, int n, int xport)
{
    const pl_gpt_config *c = whole_model_config();
    char err[256];
    int32_t *tok = malloc(sizeof *tok * (size_t)(n * BT)), *tgt = malloc(sizeof *tgt * (size_t)(n * BT));
    rng_state = 11;
    for (int i = 0; i < n * BT; i++) {
        tok[i] = (int32_t)rng_range(0, c->V - 1);
        tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    kn_ctx *kw = kn_create("cpu", 1, err, sizeof err);
    pl_engine whole;
    pl_engine_create(&whole, kw, c, 0, c->L + 2, B, T, 1, err, sizeof err);
    pl_engine_init_random(&whole, SEED);
    const double want = whole_model_forward(&whole, tok, tgt, n);
    mailbox *box = mailbox_new();
    xsim *sim = xport ? xsim_new(nst, 20000) : NULL;
    eval_stage st[MAXST];
    pthread_t th[MAXST];
    memset(st, 0, sizeof st);
    for (int k = 0; k < nst; k++) {
        int lo = k ? cuts[k - 1] : 0, hi = k < nst - 1 ? cuts[k] : c->L + 2;
        st[k] = (eval_stage){.stage = k, .nst = nst, .n = n, .xport = xport, .tok = tok,
                             .tgt = tgt, .ep = {box, k}, .sim = sim};
        st[k].k = kn_create("cpu", 1, err, sizeof err);
        pl_engine_create(&st[k].e, st[k].k, c, lo, hi, B, T, 2, err, sizeof err);
        pl_engine_init_random(&st[k].e, SEED);
        pl_engine_zero_grads(&st[k].e);
        pthread_create(&th[k], NULL, run_eval, &st[k]);
    }
    for (int k = 0; k < nst; k++) pthread_join(th[k], NULL);
    int ok = 1;
    for (int k = 0; k < nst; k++) {
        if (st[k].rc) printf("    stage %d: %s\n", k, st[k].err);
        ok &= st[k].rc == 0;
        for (size_t j = 0; j < st[k].e.nparams; j++) ok &= st[k].e.grads[j] == 0.0f;
    }
    if (ok && st[nst - 1].loss != want)
        printf("    %d stages, %d microbatches: loss sum %.9g, whole model %.9g\n", nst, n,
               st[nst - 1].loss, want), ok = 0;
    for (int k = 0; k < nst; k++) {
        pl_engine_destroy(&st[k].e);
        kn_destroy(st[k].k);
    }
    if (sim) xsim_free(sim);
    mailbox_free(box);
    pl_engine_destroy(&whole);
    kn_destroy(kw);
    free(tok);
    free(tgt);
    return ok;
}

static void test_eval_over_a_link(void)
{
    static const int cuts[][3] = {{0}, {1}, {3}, {1, 4}, {2, 3}, {1, 2, 3}};
    static const int nst[] = {1, 2, 2, 3, 3, 4};
    for (size_t i = 0; i < sizeof nst / sizeof nst[0]; i++)
        for (int n = 1; n <= 5; n += 2) CHECK(compare(cuts[i], nst[i], n, 0));
    CHECK(compare(cuts[0], 1, 0, 0)); /* no batch: nothing to do, a loss of 0 */
}

static void test_eval_over_an_ordered_transport(void)
{
    static const int cuts[][3] = {{1}, {4}, {1, 4}, {1, 2, 3}};
    static const int nst[] = {2, 2, 3, 4};
    for (size_t i = 0; i < sizeof nst / sizeof nst[0]; i++)
        for (int n = 1; n <= 4; n += 3) CHECK(compare(cuts[i], nst[i], n, 1));
}

/* Three stages on the ordered transport: stage 1's second operation fails (its rank
 * dies), or stage 0 never runs and the others are aborted from another thread; every
 * stage that runs fails instead of waiting forever. */
static int fault_run(int abort_mode)
{
    const pl_gpt_config *c = whole_model_config();
    static const int cuts[2] = {1, 4};
    const int n = 4;
    char err[256];
    int32_t tok[4 * BT], tgt[4 * BT];
    for (int i = 0; i < n * BT; i++) tok[i] = tgt[i] = (int32_t)(i % c->V);
    xsim *sim = xsim_new(3, 2000);
    eval_stage st[3];
    pthread_t th[3];
    memset(st, 0, sizeof st);
    if (!abort_mode) xsim_fail_at(sim, 1, 2);
    for (int k = 0; k < 3; k++) {
        int lo = k ? cuts[k - 1] : 0, hi = k < 2 ? cuts[k] : c->L + 2;
        st[k] = (eval_stage){.stage = k, .nst = 3, .n = n, .xport = 1, .tok = tok, .tgt = tgt,
                             .sim = sim};
        st[k].k = kn_create("cpu", 1, err, sizeof err);
        pl_engine_create(&st[k].e, st[k].k, c, lo, hi, B, T, 2, err, sizeof err);
        pl_engine_init_random(&st[k].e, SEED);
    }
    xsim_aborter ab = {sim, 100};
    pthread_t at;
    if (abort_mode) pthread_create(&at, NULL, xsim_abort_later, &ab);
    for (int k = abort_mode ? 1 : 0; k < 3; k++) pthread_create(&th[k], NULL, run_eval, &st[k]);
    for (int k = abort_mode ? 1 : 0; k < 3; k++) pthread_join(th[k], NULL);
    if (abort_mode) pthread_join(at, NULL);
    int failed = 0;
    for (int k = abort_mode ? 1 : 0; k < 3; k++) failed += st[k].rc != 0;
    for (int k = 0; k < 3; k++) {
        pl_engine_destroy(&st[k].e);
        kn_destroy(st[k].k);
    }
    xsim_free(sim);
    return failed == (abort_mode ? 2 : 3);
}

static void test_a_lost_rank_or_an_abort_ends_the_eval(void)
{
    CHECK(fault_run(0));
    CHECK(fault_run(1));
}

TEST_MAIN_BEGIN
RUN(test_eval_over_a_link);
RUN(test_eval_over_an_ordered_transport);
RUN(test_a_lost_rank_or_an_abort_ends_the_eval);
TEST_MAIN_END
