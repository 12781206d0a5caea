/* The GPT engine (worker/engine/) against a double-precision reference GPT-2
 * (gpt_reference.h): loss and gradients by finite differences, stage outputs;
 * exact equivalence of every partitioning of the layers and of 1F1B-style
 * slot interleavings with running the whole model; AdamW, the gradient
 * norm, the learning-rate schedule, and llm.c model files. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "copy_reserve.h"
#include "engine.h"
#include "training_schedule.h"
#include "gpt_reference.h"
#include "kernels.h"
#include "rng.h"

#define MAX_LAYERS 8 /* L + 2 of the largest model here */
#define MAX_STAGES 4

static char err_[512];

/* The tiny model of the tests: C=16, NH=2, V=37 (Vp=128 pads), maxT=8. */
static pl_gpt_config tiny(int L) {
    pl_gpt_config c;
    if (pl_gpt_config_init(&c, L, 16, 2, 37, 8, err_, sizeof err_)) abort();
    return c;
}

static kn_ctx *new_ctx(void) {
    kn_ctx *k = kn_create("cpu", 2, err_, sizeof err_);
    if (!k) printf("    kn_create: %s\n", err_);
    return k;
}

/* A host copy of n floats of backend memory. */
static float *host_copy(const pl_engine *e, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) abort();
    kn_to_host(e->k, h, dev, n * sizeof(float));
    return h;
}

/* Deterministic value in [−1, 1) keyed by (a, b, c, d). */
static double hash_unit(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
    z ^= (c + 0x8CB92BA72F3D8DD7ull) * 0x94D049BB133111EBull;
    z ^= d * 0xD6E8FEB86659FD93ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Moves every parameter away from GPT-2's init (LayerNorm weights no longer
 * all 1, biases not 0, weights larger so attention and GELU are not nearly
 * linear), identically in any engine that holds the tensor. The padded rows
 * of wte change too: the model must ignore them. */
static void perturb(pl_engine *e) {
    float *p = host_copy(e, e->params, e->nparams);
    for (int i = 0; i < e->ntensors; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        double amp = t->spec.ndim == 2 ? 0.3 : 0.25;
        for (size_t j = 0; j < t->spec.numel; j++)
            p[t->offset + j] +=
                (float)(amp * hash_unit(1, (uint64_t)t->layer, (uint64_t)t->index, j));
    }
    kn_to_device(e->k, e->params, p, e->nparams * sizeof(float));
    free(p);
}

/* Random microbatches: tokens in [0, V), targets in [0, V) with one masked. */
static void make_batch(const pl_gpt_config *c, int BT, int32_t *tokens, int32_t *targets) {
    for (int i = 0; i < BT; i++) {
        tokens[i] = (int32_t)rng_range(0, c->V - 1);
        targets[i] = (int32_t)rng_range(0, c->V - 1);
    }
    targets[rng_range(0, BT - 1)] = -1;
}

/* The reference model over double copies of a whole-model engine's params. */
typedef struct {
    gref_model m;
    const double *ptr[MAX_LAYERS * GREF_MAX_TENSORS];
} ref_binding;

static void ref_bind(ref_binding *r, const pl_engine *e, const double *pd) {
    const pl_gpt_config *c = &e->cfg;
    memset(r, 0, sizeof *r);
    r->m = (gref_model){c->L, c->C, c->NH, c->V, c->Vp, c->maxT, r->ptr};
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    for (int l = 0; l < pl_gpt_nlayers(c); l++)
        for (int i = 0, n = pl_gpt_layer_tensors(c, l, s); i < n; i++)
            r->ptr[l * GREF_MAX_TENSORS + i] = pd + pl_engine_find(e, l, i)->offset;
}

/* ---- 1. against the double-precision reference -------------------------- */

static void test_loss_and_gradients_match_double_reference(void) {
    const pl_gpt_config cfg = tiny(2);
    const int B = 2, T = 5, BT = B * T, NL = pl_gpt_nlayers(&cfg);
    CHECK_EQ_INT(cfg.Vp, 128);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine e;
    CHECK(pl_engine_create(&e, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    size_t held = 0;
    for (int t = 0; t < e.ntensors; t++) held += e.tensors[t].spec.numel;
    CHECK_EQ_INT(held, pl_gpt_total_params(&cfg));
    CHECK(e.nparams >= held && e.nparams % PL_ENGINE_LAYER_ALIGN == 0);
    CHECK_EQ_INT(e.ntensors, 2 + 12 * cfg.L + 2);
    pl_engine_init_random(&e, 1234);
    perturb(&e);
    int32_t tokens[10], targets[10];
    rng_state = 42;
    make_batch(&cfg, BT, tokens, targets);

    float loss = pl_engine_forward(&e, 0, tokens, NULL, targets);
    pl_engine_zero_grads(&e);
    pl_engine_backward_last(&e, 0, NULL, 1.0f / (float)BT, NULL, NULL);
    float *p = host_copy(&e, e.params, e.nparams), *g = host_copy(&e, e.grads, e.nparams);
    double *pd = malloc(e.nparams * sizeof(double));
    CHECK(pd);
    for (size_t i = 0; i < e.nparams; i++) pd[i] = p[i];
    ref_binding r;
    ref_bind(&r, &e, pd);
    double ref = gref_loss(&r.m, tokens, targets, B, T);
    printf("    loss: engine %.9g, double reference %.12g\n", (double)loss, ref);
    CHECK(isfinite(loss) && ref > 1.0);
    CHECK(fabs((double)loss - ref) <= 1e-5 * fabs(ref));

    /* padded vocabulary rows of wte get exactly zero gradient */
    const pl_engine_tensor *wte = pl_engine_find(&e, 0, 0);
    CHECK(wte && wte->spec.dims[0] == cfg.Vp);
    for (size_t j = (size_t)cfg.V * cfg.C; j < wte->spec.numel; j++)
        CHECK(g[wte->offset + j] == 0.0f);

    /* central differences of the double reference at a sample of every tensor */
    const double h = 1e-5;
    double worst = 0;
    int samples = 0, absent = -1;
    for (int v = 0; v < cfg.V && absent < 0; v++) {
        absent = v;
        for (int i = 0; i < BT; i++)
            if (tokens[i] == v) absent = -1;
    }
    CHECK(absent >= 0);
    rng_state = 7;
    for (int ti = 0; ti < e.ntensors; ti++) {
        const pl_engine_tensor *t = &e.tensors[ti];
        double ss = 0;
        for (size_t j = 0; j < t->spec.numel; j++)
            ss += (double)g[t->offset + j] * g[t->offset + j];
        const double scale = sqrt(ss / (double)t->spec.numel);
        CHECK(scale > 0);
        size_t idx[16];
        int n = 0;
        while (n < 12) idx[n++] = (size_t)rng_range(0, (int64_t)t->spec.numel - 1);
        if (t == wte) {
            idx[n++] = (size_t)tokens[0] * cfg.C + 3;    /* an input token's row */
            idx[n++] = (size_t)absent * cfg.C + 5;       /* a row only the head uses */
            idx[n++] = (size_t)(cfg.V + 40) * cfg.C + 7; /* a padded row */
        }
        for (int s = 0; s < n; s++) {
            const size_t at = t->offset + idx[s];
            const double keep = pd[at];
            pd[at] = keep + h;
            double up = gref_loss(&r.m, tokens, targets, B, T);
            pd[at] = keep - h;
            double down = gref_loss(&r.m, tokens, targets, B, T);
            pd[at] = keep;
            const double num = (up - down) / (2 * h), an = g[at];
            const double bound = fabs(num) > scale ? fabs(num) : scale;
            const double ratio = fabs(an - num) / bound;
            if (ratio > worst) worst = ratio;
            samples++;
            if (ratio > 1e-4) {
                printf("    %s[%zu]: engine %.9g, finite difference %.9g (scale %.3g)\n", t->name,
                       idx[s], an, num, scale);
                CHECK(ratio <= 1e-4);
            }
            if (t == wte && idx[s] >= (size_t)cfg.V * cfg.C) CHECK(an == 0.0 && num == 0.0);
        }
    }
    printf("    %d gradients checked, worst |engine - numeric| / max(|numeric|, tensor rms) = "
           "%.3g\n",
           samples, worst);
    CHECK(samples >= 300);

    /* each stage [0, k)'s output is the reference residual stream after k−1 blocks */
    double *x = malloc((size_t)BT * cfg.C * sizeof(double));
    CHECK(x);
    for (int kk = 1; kk <= cfg.L + 1; kk++) {
        pl_engine s;
        CHECK(pl_engine_create(&s, k, &cfg, 0, kk, B, T, 1, err_, sizeof err_) == 0);
        pl_engine_init_random(&s, 1234);
        perturb(&s);
        CHECK(pl_engine_forward(&s, 0, tokens, NULL, NULL) == 0.0f);
        float *out = host_copy(&s, pl_engine_output(&s, 0), (size_t)BT * cfg.C);
        gref_hidden(&r.m, tokens, B, T, kk - 1, x);
        double num = 0, den = 0;
        for (int i = 0; i < BT * cfg.C; i++) {
            num += (out[i] - x[i]) * (out[i] - x[i]);
            den += x[i] * x[i];
        }
        free(out);
        pl_engine_destroy(&s);
        CHECK(sqrt(num / den) < 1e-5);
    }
    free(x);
    free(pd);
    free(p);
    free(g);
    pl_engine_destroy(&e);
    kn_destroy(k);
}

/* ---- 2. partitions and slots --------------------------------------------- */

/* Stages [cuts[i], cuts[i+1]) of a pipeline, with the whole model to compare. */
typedef struct {
    int n;
    pl_engine st[MAX_STAGES];
} pipeline;

static void pipeline_destroy(pipeline *p) {
    for (int i = 0; i < p->n; i++) pl_engine_destroy(&p->st[i]);
    p->n = 0;
}

/* Creates the stages, initialises them with `seed` and checks that every
 * tensor's initial values equal the whole model's `init` (host, unperturbed);
 * then perturbs. 0 on success. */
static int pipeline_create(pipeline *p, kn_ctx *k, const pl_gpt_config *cfg, const int *cuts,
                           int nstages, int B, int T, const int *slots, const pl_engine *whole,
                           const float *init, uint64_t seed) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < nstages; i++) {
        if (pl_engine_create(&p->st[i], k, cfg, cuts[i], cuts[i + 1], B, T, slots[i], err_,
                             sizeof err_)) {
            printf("    stage [%d, %d): %s\n", cuts[i], cuts[i + 1], err_);
            pipeline_destroy(p);
            return -1;
        }
        p->n++;
        pl_engine *s = &p->st[i];
        pl_engine_init_random(s, seed);
        float *v = host_copy(s, s->params, s->nparams);
        for (int t = 0; t < s->ntensors; t++) {
            const pl_engine_tensor *x = &s->tensors[t];
            const pl_engine_tensor *w = pl_engine_find(whole, x->layer, x->index);
            if (!w || w->spec.numel != x->spec.numel ||
                memcmp(v + x->offset, init + w->offset, x->spec.numel * sizeof(float))) {
                printf("    stage [%d, %d): initial %s differs from the whole model's\n", s->begin,
                       s->end, x->name);
                free(v);
                pipeline_destroy(p);
                return -1;
            }
        }
        free(v);
        perturb(s);
    }
    /* each tensor held exactly once, wte twice when the head is apart from the embedding */
    int held = 0;
    for (int i = 0; i < nstages; i++) held += p->st[i].ntensors;
    if (held != whole->ntensors + (nstages > 1 ? 1 : 0)) {
        printf("    %d tensors over the stages, whole model %d\n", held, whole->ntensors);
        pipeline_destroy(p);
        return -1;
    }
    return 0;
}

/* Forward of a microbatch through every stage (slot per stage), returns the loss. */
static float pipeline_forward(pipeline *p, const int *slot, const int32_t *tokens,
                              const int32_t *targets) {
    float loss = 0;
    for (int i = 0; i < p->n; i++) {
        const float *in = i ? pl_engine_output(&p->st[i - 1], slot[i - 1]) : NULL;
        loss = pl_engine_forward(&p->st[i], slot[i], i ? NULL : tokens, in,
                                 i == p->n - 1 ? targets : NULL);
    }
    return loss;
}

/* Backward of a step's last microbatch through every stage. */
static void pipeline_backward_last(pipeline *p, const int *slot, float dloss_scale) {
    for (int i = p->n - 1; i >= 0; i--)
        pl_engine_backward_last(&p->st[i], slot[i],
                                i == p->n - 1 ? NULL : pl_engine_input_grad(&p->st[i + 1]),
                                dloss_scale, NULL, NULL);
}

/* Compares every stage's parameters and gradients with the whole model's, bit
 * for bit; the wte gradient, split between the embedding and the head's copy,
 * must add up to the whole model's exactly (it, too, adds the head's share once). */
static int compare_with_whole(const pipeline *p, const pl_engine *whole) {
    float *wp = host_copy(whole, whole->params, whole->nparams);
    float *wg = host_copy(whole, whole->grads, whole->nparams);
    const pl_engine_tensor *wwte = pl_engine_find(whole, 0, 0);
    const size_t nwte = wwte->spec.numel;
    float *wte_sum = calloc(nwte, sizeof(float));
    int wte_holders = 0, bad = 0;
    for (int i = 0; i < p->n && !bad; i++) {
        const pl_engine *s = &p->st[i];
        float *sp = host_copy(s, s->params, s->nparams), *sg = host_copy(s, s->grads, s->nparams);
        for (int t = 0; t < s->ntensors && !bad; t++) {
            const pl_engine_tensor *x = &s->tensors[t];
            const pl_engine_tensor *w = pl_engine_find(whole, x->layer, x->index);
            const size_t bytes = x->spec.numel * sizeof(float);
            if (memcmp(sp + x->offset, wp + w->offset, bytes)) {
                printf("    stage [%d, %d): parameters of %s differ\n", s->begin, s->end, x->name);
                bad = 1;
            } else if (x->layer == 0 && x->index == 0) {
                for (size_t j = 0; j < nwte; j++) wte_sum[j] += sg[x->offset + j];
                wte_holders++;
            } else if (memcmp(sg + x->offset, wg + w->offset, bytes)) {
                printf("    stage [%d, %d): gradients of %s differ\n", s->begin, s->end, x->name);
                bad = 1;
            }
        }
        free(sp);
        free(sg);
    }
    if (!bad && wte_holders != (p->n > 1 ? 2 : 1)) {
        printf("    wte held by %d stages\n", wte_holders);
        bad = 1;
    }
    for (size_t j = 0; j < nwte && !bad; j++) {
        const float a = wg[wwte->offset + j], b = wte_sum[j];
        if (a != b) {
            printf("    wte gradient [%zu]: whole %.9g, sum over stages %.9g\n", j, a, b);
            bad = 1;
        }
    }
    free(wte_sum);
    free(wp);
    free(wg);
    return bad ? -1 : 0;
}

/* Whole model (one engine, one slot) over `nmb` microbatches in sequence. */
static void whole_run(pl_engine *w, int nmb, int32_t (*tok)[10], int32_t (*tgt)[10], float *losses,
                      float dloss_scale) {
    pl_engine_zero_grads(w);
    for (int m = 0; m < nmb; m++) {
        losses[m] = pl_engine_forward(w, 0, tok[m], NULL, tgt[m]);
        if (m + 1 < nmb) pl_engine_backward(w, 0, NULL, dloss_scale);
        else pl_engine_backward_last(w, 0, NULL, dloss_scale, NULL, NULL);
    }
}

static void test_every_partition_matches_whole_model(void) {
    const pl_gpt_config cfg = tiny(3);
    const int B = 2, T = 5, NL = pl_gpt_nlayers(&cfg);
    const uint64_t seed = 99;
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine w;
    CHECK(pl_engine_create(&w, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&w, seed);
    float *init = host_copy(&w, w.params, w.nparams);
    perturb(&w);
    int32_t tok[1][10], tgt[1][10];
    rng_state = 5;
    make_batch(&cfg, B * T, tok[0], tgt[0]);
    float wloss;
    whole_run(&w, 1, tok, tgt, &wloss, 1.0f / (float)(B * T));

    /* every 2-stage split and every 3-stage split */
    int splits[64][4], nsplit = 0, sizes[64];
    for (int a = 1; a < NL; a++) {
        splits[nsplit][0] = 0, splits[nsplit][1] = a, splits[nsplit][2] = NL;
        sizes[nsplit++] = 2;
    }
    for (int a = 1; a < NL; a++)
        for (int b = a + 1; b < NL; b++) {
            splits[nsplit][0] = 0, splits[nsplit][1] = a, splits[nsplit][2] = b;
            splits[nsplit][3] = NL;
            sizes[nsplit++] = 3;
        }
    const int one[MAX_STAGES] = {1, 1, 1, 1}, zero[MAX_STAGES] = {0};
    for (int s = 0; s < nsplit; s++) {
        pipeline p;
        CHECK(pipeline_create(&p, k, &cfg, splits[s], sizes[s], B, T, one, &w, init, seed) == 0);
        for (int i = 0; i < p.n; i++) pl_engine_zero_grads(&p.st[i]);
        float loss = pipeline_forward(&p, zero, tok[0], tgt[0]);
        pipeline_backward_last(&p, zero, 1.0f / (float)(B * T));
        int ok = memcmp(&loss, &wloss, sizeof loss) == 0 && compare_with_whole(&p, &w) == 0;
        if (!ok)
            printf("    split at %d, %d (%d stages): loss %.9g, whole %.9g\n", splits[s][1],
                   splits[s][2], sizes[s], (double)loss, (double)wloss);
        /* the last stage holds its own copy of wte (its values were compared above) */
        const pl_engine *head = &p.st[p.n - 1];
        CHECK(pl_engine_find(head, 0, 0) != NULL && head->wte_tensor >= 0);
        pipeline_destroy(&p);
        CHECK(ok);
    }
    free(init);
    pl_engine_destroy(&w);
    kn_destroy(k);
}

/* Several microbatches in flight through several slots, in 1F1B order, add up
 * to the same gradients as the whole model doing them one after the other;
 * then one AdamW step keeps every copy of every tensor identical. */
static void test_slots_interleaved_match_sequential(void) {
    const pl_gpt_config cfg = tiny(3);
    const int B = 2, T = 5, NL = pl_gpt_nlayers(&cfg), M = 4;
    const uint64_t seed = 3;
    const float scale = 1.0f / (float)(M * B * T);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine w;
    CHECK(pl_engine_create(&w, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&w, seed);
    float *init = host_copy(&w, w.params, w.nparams);
    perturb(&w);
    int32_t tok[4][10], tgt[4][10];
    rng_state = 11;
    for (int m = 0; m < M; m++) make_batch(&cfg, B * T, tok[m], tgt[m]);
    float wl[4];
    whole_run(&w, M, tok, tgt, wl, scale);

    /* the whole model with 2 slots: F0 F1 B0 B1 F2 F3 B2 B3 */
    {
        const int cuts[2] = {0, NL}, slots[1] = {2};
        pipeline p;
        CHECK(pipeline_create(&p, k, &cfg, cuts, 1, B, T, slots, &w, init, seed) == 0);
        pl_engine *e = &p.st[0];
        pl_engine_zero_grads(e);
        float l[4];
        for (int m = 0; m < M; m += 2) {
            l[m] = pl_engine_forward(e, 0, tok[m], NULL, tgt[m]);
            l[m + 1] = pl_engine_forward(e, 1, tok[m + 1], NULL, tgt[m + 1]);
            pl_engine_backward(e, 0, NULL, scale);
            if (m + 2 < M) pl_engine_backward(e, 1, NULL, scale);
            else pl_engine_backward_last(e, 1, NULL, scale, NULL, NULL);
        }
        int ok = memcmp(l, wl, sizeof l) == 0;
        if (ok) {
            float *a = host_copy(e, e->grads, e->nparams), *b = host_copy(&w, w.grads, w.nparams);
            ok = memcmp(a, b, w.nparams * sizeof(float)) == 0;
            free(a);
            free(b);
        }
        pipeline_destroy(&p);
        CHECK(ok);
    }

    /* two stages, the first with 2 slots, the second with 1:
     *   A.F0 A.F1 B.F0 B.B0 B.F1 A.B0 A.F2 B.B1 A.B1 B.F2 A.F3 B.B2 A.B2 B.F3 B.B3 A.B3
     * (B.F1 runs between B's backward and A's use of B's input gradient). */
    for (int cut = 1; cut < NL; cut++) {
        const int cuts[3] = {0, cut, NL}, slots[2] = {2, 1};
        pipeline p;
        CHECK(pipeline_create(&p, k, &cfg, cuts, 2, B, T, slots, &w, init, seed) == 0);
        pl_engine *A = &p.st[0], *Bs = &p.st[1];
        pl_engine_zero_grads(A);
        pl_engine_zero_grads(Bs);
        float l[4];
#define AF(m, s) pl_engine_forward(A, s, tok[m], NULL, NULL)
#define BF(m, s) (l[m] = pl_engine_forward(Bs, 0, NULL, pl_engine_output(A, s), tgt[m]))
#define BB() pl_engine_backward(Bs, 0, NULL, scale)
#define AB(s) pl_engine_backward(A, s, pl_engine_input_grad(Bs), scale)
        AF(0, 0);
        AF(1, 1);
        BF(0, 0);
        BB();
        BF(1, 1);
        AB(0);
        AF(2, 0);
        BB();
        AB(1);
        BF(2, 0);
        AF(3, 1);
        BB();
        AB(0);
        BF(3, 1);
        BB();
        AB(1);
#undef AF
#undef BF
#undef BB
#undef AB
        int ok = memcmp(l, wl, sizeof l) == 0 && compare_with_whole(&p, &w) == 0;
        if (!ok) printf("    1F1B over the split at %d\n", cut);

        /* combine the tied gradient as the runtime would, step, compare again */
        if (ok) {
            const pl_engine_tensor *ea = pl_engine_find(A, 0, 0), *hb = pl_engine_find(Bs, 0, 0);
            const size_t n = ea->spec.numel;
            float *ga = host_copy(A, A->grads + ea->offset, n),
                  *gb = host_copy(Bs, Bs->grads + hb->offset, n);
            for (size_t j = 0; j < n; j++) ga[j] += gb[j];
            kn_to_device(k, A->grads + ea->offset, ga, n * sizeof(float));
            kn_to_device(k, Bs->grads + hb->offset, ga, n * sizeof(float));
            const pl_adamw o = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
            pl_engine we; /* a copy of the whole model, given the same combined wte gradient */
            ok = pl_engine_create(&we, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0;
            if (ok) {
                float *wp = host_copy(&w, w.params, w.nparams),
                      *wg = host_copy(&w, w.grads, w.nparams);
                kn_to_device(k, we.params, wp, w.nparams * sizeof(float));
                kn_to_device(k, we.grads, wg, w.nparams * sizeof(float));
                kn_to_device(k, we.grads + pl_engine_find(&we, 0, 0)->offset, ga,
                             n * sizeof(float));
                free(wp);
                free(wg);
                pl_engine_adamw(&we, &o, 0.5f, 1);
                pl_engine_adamw(A, &o, 0.5f, 1);
                pl_engine_adamw(Bs, &o, 0.5f, 1);
                float *pw = host_copy(&we, we.params, we.nparams);
                for (int i = 0; i < 2 && ok; i++) {
                    const pl_engine *s = &p.st[i];
                    float *ps = host_copy(s, s->params, s->nparams);
                    for (int t = 0; t < s->ntensors && ok; t++) {
                        const pl_engine_tensor *x = &s->tensors[t];
                        ok = memcmp(ps + x->offset,
                                    pw + pl_engine_find(&we, x->layer, x->index)->offset,
                                    x->spec.numel * sizeof(float)) == 0;
                        if (!ok) printf("    after AdamW, %s of stage %d differs\n", x->name, i);
                    }
                    free(ps);
                }
                free(pw);
                pl_engine_destroy(&we);
            }
            free(ga);
            free(gb);
        }
        pipeline_destroy(&p);
        CHECK(ok);
    }
    free(init);
    pl_engine_destroy(&w);
    kn_destroy(k);
}

/* ---- 3. AdamW ------------------------------------------------------------ */

static void test_adamw_formula_and_decay(void) {
    const pl_gpt_config cfg = tiny(2);
    const int NL = pl_gpt_nlayers(&cfg);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine e;
    CHECK(pl_engine_create(&e, k, &cfg, 0, NL, 1, 4, 1, err_, sizeof err_) == 0);
    /* weight decay exactly on the 2-D weights */
    for (int i = 0; i < e.ntensors; i++) {
        const char *n = e.tensors[i].spec.name;
        int want = !strcmp(n, "wte") || !strcmp(n, "wpe") || !strcmp(n, "qkvw") ||
                   !strcmp(n, "attprojw") || !strcmp(n, "fcw") || !strcmp(n, "fcprojw");
        CHECK_EQ_INT(e.tensors[i].spec.decay, want);
        CHECK_EQ_INT(e.tensors[i].spec.ndim, want ? 2 : 1);
    }
    pl_engine_init_random(&e, 17);
    perturb(&e);
    const size_t n = e.nparams;
    const pl_adamw o = {1e-2f, 0.9f, 0.95f, 1e-3f, 0.1f};

    /* zero gradients: only decay moves parameters, and only 2-D ones */
    {
        float *p0 = host_copy(&e, e.params, n);
        pl_engine_adamw(&e, &o, 1.0f, 1);
        float *p1 = host_copy(&e, e.params, n);
        for (int i = 0; i < e.ntensors; i++) {
            const pl_engine_tensor *t = &e.tensors[i];
            for (size_t j = 0; j < t->spec.numel; j++) {
                const double a = p0[t->offset + j], b = p1[t->offset + j];
                if (!t->spec.decay) {
                    CHECK(a == b);
                } else {
                    double want = a - (double)o.lr * o.weight_decay * a;
                    CHECK(fabs(b - want) <= 3e-7 * fabs(a) + 1e-12);
                }
            }
        }
        free(p0);
        free(p1);
    }

    /* two steps on known gradients with different grad scales, against the
     * formula in double (m, v start at 0: a fresh engine) */
    pl_engine f;
    CHECK(pl_engine_create(&f, k, &cfg, 0, NL, 1, 4, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&f, 17);
    perturb(&f);
    double *m = calloc(n, sizeof(double)), *v = calloc(n, sizeof(double));
    float *g = malloc(n * sizeof(float));
    CHECK(m && v && g);
    const float gscale[2] = {0.5f, 0.25f};
    for (int step = 1; step <= 2; step++) {
        for (size_t j = 0; j < n; j++) g[j] = (float)(4e-3 * hash_unit(2, (uint64_t)step, j, 0));
        kn_to_device(k, f.grads, g, n * sizeof(float));
        float *p0 = host_copy(&f, f.params, n);
        pl_engine_adamw(&f, &o, gscale[step - 1], step);
        float *p1 = host_copy(&f, f.params, n);
        double worst = 0;
        for (int i = 0; i < f.ntensors; i++) {
            const pl_engine_tensor *t = &f.tensors[i];
            const double wd = t->spec.decay ? o.weight_decay : 0.0;
            for (size_t j = t->offset; j < t->offset + t->spec.numel; j++) {
                const double gg = (double)g[j] * gscale[step - 1];
                m[j] = o.beta1 * m[j] + (1 - (double)o.beta1) * gg;
                v[j] = o.beta2 * v[j] + (1 - (double)o.beta2) * gg * gg;
                const double mh = m[j] / (1 - pow(o.beta1, step)),
                             vh = v[j] / (1 - pow(o.beta2, step));
                const double want = p0[j] - (double)o.lr * (mh / (sqrt(vh) + o.eps) + wd * p0[j]);
                const double d = fabs(p1[j] - want) / (fabs(want) * FLT_EPSILON + 1e-4 * o.lr);
                if (d > worst) worst = d;
            }
        }
        free(p0);
        free(p1);
        if (worst > 4)
            printf("    step %d: worst error %.3g (units of ulp + 1e-4 lr)\n", step, worst);
        CHECK(worst <= 4);
    }
    /* the gradients are left as they were (AdamW does not consume them) */
    float *gg = host_copy(&f, f.grads, n);
    int same = memcmp(gg, g, n * sizeof(float)) == 0;
    free(gg);
    free(m);
    free(v);
    free(g);
    pl_engine_destroy(&f);
    pl_engine_destroy(&e);
    kn_destroy(k);
    CHECK(same);
}

/* ---- 4. gradient norm ---------------------------------------------------- */

static double sumsq_host(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void test_grad_sumsq(void) {
    const pl_gpt_config cfg = tiny(3);
    const int B = 2, T = 5, NL = pl_gpt_nlayers(&cfg);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine w;
    CHECK(pl_engine_create(&w, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&w, 8);
    float *init = host_copy(&w, w.params, w.nparams);
    perturb(&w);
    CHECK(pl_engine_grad_sumsq(&w) == 0.0);
    int32_t tok[1][10], tgt[1][10];
    rng_state = 21;
    make_batch(&cfg, B * T, tok[0], tgt[0]);
    float loss;
    whole_run(&w, 1, tok, tgt, &loss, 1.0f / (float)(B * T));
    float *wg = host_copy(&w, w.grads, w.nparams);
    const double whole = sumsq_host(wg, w.nparams);
    free(wg);
    const double got = pl_engine_grad_sumsq(&w);
    CHECK(whole > 0);
    CHECK(fabs(got - whole) <= 1e-12 * whole);

    const int cutsets[3][4] = {{0, 1, NL, 0}, {0, NL - 1, NL, 0}, {0, 2, 3, NL}};
    const int nst[3] = {2, 2, 3}, one[MAX_STAGES] = {1, 1, 1, 1}, zero[MAX_STAGES] = {0};
    for (int c = 0; c < 3; c++) {
        pipeline p;
        CHECK(pipeline_create(&p, k, &cfg, cutsets[c], nst[c], B, T, one, &w, init, 8) == 0);
        for (int i = 0; i < p.n; i++) pl_engine_zero_grads(&p.st[i]);
        pipeline_forward(&p, zero, tok[0], tgt[0]);
        pipeline_backward_last(&p, zero, 1.0f / (float)(B * T));
        /* the head stage's sum leaves its wte copy out */
        pl_engine *head = &p.st[p.n - 1];
        float *hg = host_copy(head, head->grads, head->nparams);
        const pl_engine_tensor *hw = pl_engine_find(head, 0, 0);
        double own = sumsq_host(hg, head->nparams) - sumsq_host(hg + hw->offset, hw->spec.numel);
        int ok = fabs(pl_engine_grad_sumsq(head) - own) <= 1e-12 * own;
        /* combine the tied gradient (the runtime's all-reduce), then the stages add up */
        pl_engine *emb = &p.st[0];
        const pl_engine_tensor *ew = pl_engine_find(emb, 0, 0);
        float *eg = host_copy(emb, emb->grads + ew->offset, ew->spec.numel);
        for (size_t j = 0; j < ew->spec.numel; j++) eg[j] += hg[hw->offset + j];
        kn_to_device(k, emb->grads + ew->offset, eg, ew->spec.numel * sizeof(float));
        kn_to_device(k, head->grads + hw->offset, eg, ew->spec.numel * sizeof(float));
        double sum = 0;
        for (int i = 0; i < p.n; i++) sum += pl_engine_grad_sumsq(&p.st[i]);
        if (fabs(sum - whole) > 1e-6 * whole) {
            printf("    stages %d: sum over stages %.12g, whole %.12g\n", c, sum, whole);
            ok = 0;
        }
        free(eg);
        free(hg);
        pipeline_destroy(&p);
        CHECK(ok);
    }
    pl_engine_zero_grads(&w);
    CHECK(pl_engine_grad_sumsq(&w) == 0.0);
    free(init);
    pl_engine_destroy(&w);
    kn_destroy(k);
}

/* ---- 5. learning-rate schedule ------------------------------------------- */

static int close_rel(double a, double b, double rel) {
    return fabs(a - b) <= rel * fmax(fabs(a), fabs(b)) + 1e-12;
}

static void test_lr_schedule(void) {
    const float lr = 6e-4f;
    /* warmup: lr·(s+1)/warmup, in both schedules */
    for (int cos = 0; cos <= 1; cos++)
        for (int s = 0; s < 10; s++)
            CHECK(close_rel(pl_lr_at(lr, cos, 10, 0.1f, s, 100), lr * (s + 1) / 10.0, 1e-6));
    /* constant after warmup, and with no warmup */
    for (int s = 10; s < 100; s++) CHECK(pl_lr_at(lr, 0, 10, 0.1f, s, 100) == lr);
    for (int s = 0; s < 100; s++) CHECK(pl_lr_at(lr, 0, 0, 0.1f, s, 100) == lr);
    /* cosine: lr at the end of warmup, then never rising, never below lr·min_ratio */
    const int steps = 111, warmup = 10;
    CHECK(close_rel(pl_lr_at(lr, 1, warmup, 0.1f, warmup, steps), lr, 1e-6));
    float prev = lr;
    for (int s = warmup; s < steps; s++) {
        float x = pl_lr_at(lr, 1, warmup, 0.1f, s, steps);
        CHECK(x <= prev * (1 + 1e-6f) && x >= lr * 0.1f * (1 - 1e-6f));
        prev = x;
    }
}

/* The cosine ends exactly at lr·min_ratio on the last step (steps − 1 of a
 * 0-based count), half way between lr and that in the middle of the decay. */
static void test_lr_cosine_ends_at_min_ratio(void) {
    const float lr = 6e-4f;
    const int steps = 111, warmup = 10;
    const float last = pl_lr_at(lr, 1, warmup, 0.1f, steps - 1, steps);
    if (!close_rel(last, lr * 0.1, 1e-5))
        printf("    cosine at the last step (%d of %d): %.9g, expected lr*min_ratio = %.9g\n",
               steps - 1, steps, (double)last, lr * 0.1);
    CHECK(close_rel(last, lr * 0.1, 1e-5));
    /* half way through the decay: the mean of lr and lr·min_ratio */
    CHECK(close_rel(pl_lr_at(lr, 1, warmup, 0.1f, warmup + (steps - 1 - warmup) / 2, steps),
                    (lr + lr * 0.1) / 2, 1e-4));
    CHECK(fabs(pl_lr_at(lr, 1, 0, 0.0f, 49, 50)) <= 1e-6 * lr);
    CHECK(close_rel(pl_lr_at(lr, 1, 0, 0.0f, 0, 50), lr, 1e-6));
}

/* ---- 6. llm.c model files ------------------------------------------------ */

typedef struct {
    const pl_engine *e;
    const float *host;
} getter_ctx;

static const float *engine_getter(void *ctx, int layer, int index) {
    getter_ctx *g = ctx;
    return g->host + pl_engine_find(g->e, layer, index)->offset;
}

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(len > 0 ? (size_t)len : 1);
    *n = p && fread(p, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return p;
}

/* pl_llmc_read of a modified copy of the file must fail with `why`. */
static int read_fails(const char *path, const void *bytes, size_t n, const char *why) {
    pl_llmc_model m;
    char e[512] = "";
    if (write_bytes(path, bytes, n)) return -1;
    int rc = pl_llmc_read(path, &m, e, sizeof e);
    remove(path);
    if (rc == 0) {
        pl_llmc_free(&m);
        printf("    read succeeded, expected an error about \"%s\"\n", why);
        return -1;
    }
    if (!strstr(e, why)) {
        printf("    error \"%s\" does not mention \"%s\"\n", e, why);
        return -1;
    }
    return m.params == NULL ? 0 : -1;
}

static void test_llmc_files(void) {
    const pl_gpt_config cfg = tiny(2);
    const int NL = pl_gpt_nlayers(&cfg), C = cfg.C;
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine e;
    CHECK(pl_engine_create(&e, k, &cfg, 0, NL, 1, 4, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&e, 5);
    perturb(&e);
    float *host = host_copy(&e, e.params, e.nparams);
    char dir[] = "/tmp/pliant_test_engine_XXXXXX", path[128], bad[160];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.bin", dir);
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);
    getter_ctx gc = {&e, host};
    CHECK(pl_llmc_write(path, &cfg, engine_getter, &gc, err_, sizeof err_) == 0);

    /* header and llm.c's tensor-major order */
    size_t n = 0;
    unsigned char *file = read_bytes(path, &n);
    CHECK(file);
    const size_t total = pl_gpt_total_params(&cfg);
    CHECK_EQ_INT(n, 1024 + total * sizeof(float));
    int32_t h[256];
    memcpy(h, file, sizeof h);
    const int32_t want[8] = {20240326, 3, cfg.maxT, cfg.V, cfg.L, cfg.NH, cfg.C, cfg.Vp};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(h[i], want[i]);
    for (int i = 8; i < 256; i++) CHECK_EQ_INT(h[i], 0);
    const float *data = (const float *)(file + 1024);
    const size_t emb = (size_t)(cfg.Vp + cfg.maxT) * C;
#define SAME(at, layer, index, count)                                                              \
    CHECK(memcmp(data + (at), host + pl_engine_find(&e, layer, index)->offset,                     \
                 (count) * sizeof(float)) == 0)
    SAME(0, 0, 0, (size_t)cfg.Vp * C);
    SAME((size_t)cfg.Vp * C, 0, 1, (size_t)cfg.maxT * C);
    SAME(emb, 1, 0, C);                 /* ln1w of block 1 ... */
    SAME(emb + C, 2, 0, C);             /* ... then of block 2 */
    SAME(emb + 2 * C, 1, 1, C);         /* then every ln1b */
    SAME(emb + 4 * C, 1, 2, 3 * C * C); /* then every qkvw */
    SAME(total - 2 * C, NL - 1, 0, C);  /* lnfw */
    SAME(total - C, NL - 1, 1, C);      /* lnfb */
#undef SAME

    /* read back, load into a fresh whole model and into split stages */
    pl_llmc_model m;
    CHECK(pl_llmc_read(path, &m, err_, sizeof err_) == 0);
    int ok = m.cfg.L == cfg.L && m.cfg.C == cfg.C && m.cfg.NH == cfg.NH && m.cfg.V == cfg.V &&
             m.cfg.Vp == cfg.Vp && m.cfg.maxT == cfg.maxT;
    for (int s = 0; ok && s < 3; s++) {
        const int ranges[3][2] = {{0, NL}, {0, 2}, {2, NL}};
        pl_engine f;
        ok = pl_engine_create(&f, k, &cfg, ranges[s][0], ranges[s][1], 1, 4, 1, err_,
                              sizeof err_) == 0;
        if (!ok) break;
        ok = pl_engine_load_llmc(&f, &m, err_, sizeof err_) == 0;
        float *fp = host_copy(&f, f.params, f.nparams);
        for (int t = 0; ok && t < f.ntensors; t++) {
            const pl_engine_tensor *x = &f.tensors[t];
            ok = memcmp(fp + x->offset, host + pl_engine_find(&e, x->layer, x->index)->offset,
                        x->spec.numel * sizeof(float)) == 0 &&
                 memcmp(pl_llmc_tensor(&m, x->layer, x->index), fp + x->offset,
                        x->spec.numel * sizeof(float)) == 0;
            if (!ok) printf("    [%d, %d): %s differs after loading\n", f.begin, f.end, x->name);
        }
        free(fp);
        pl_engine_destroy(&f);
    }
    /* a model of another configuration is refused */
    if (ok) {
        const pl_gpt_config other[2] = {tiny(3), tiny(1)};
        for (int s = 0; ok && s < 2; s++) {
            pl_engine f;
            ok = pl_engine_create(&f, k, &other[s], 0, 2, 1, 4, 1, err_, sizeof err_) == 0;
            if (!ok) break;
            err_[0] = 0;
            ok = pl_engine_load_llmc(&f, &m, err_, sizeof err_) != 0 && strlen(err_) > 0;
            pl_engine_destroy(&f);
        }
        pl_gpt_config wide;
        if (ok) ok = pl_gpt_config_init(&wide, 2, 32, 2, 37, 8, err_, sizeof err_) == 0;
        pl_engine f;
        if (ok) ok = pl_engine_create(&f, k, &wide, 0, NL, 1, 4, 1, err_, sizeof err_) == 0;
        if (ok) {
            ok = pl_engine_load_llmc(&f, &m, err_, sizeof err_) != 0;
            pl_engine_destroy(&f);
        }
        if (!ok) printf("    a model of another configuration was loaded\n");
    }
    pl_llmc_free(&m);
    CHECK(ok);

    /* broken files */
    unsigned char *copy = malloc(n + 8);
    CHECK(copy);
    memcpy(copy, file, n);
    int32_t v;
    ok = 1;
    v = 20240520, memcpy(copy, &v, 4);
    ok &= read_fails(bad, copy, n, "magic") == 0;
    memcpy(copy, file, n);
    v = 1, memcpy(copy + 4, &v, 4);
    ok &= read_fails(bad, copy, n, "version") == 0;
    v = 5, memcpy(copy + 4, &v, 4);
    ok &= read_fails(bad, copy, n, "version") == 0;
    memcpy(copy, file, n);
    ok &= read_fails(bad, copy, n - 4, "truncated") == 0;
    ok &= read_fails(bad, copy, 1024, "truncated") == 0;
    ok &= read_fails(bad, copy, 100, "header") == 0;
    memset(copy + n, 0, 8);
    ok &= read_fails(bad, copy, n + 8, "trailing") == 0;
    v = 256, memcpy(copy + 28, &v, 4); /* padded vocabulary inconsistent with V */
    ok &= read_fails(bad, copy, n, "padded") == 0;
    memcpy(copy, file, n);
    v = 3, memcpy(copy + 20, &v, 4); /* NH = 3 does not divide C = 16 */
    ok &= read_fails(bad, copy, n, "divisible") == 0;
    memcpy(copy, file, n);
    v = 0, memcpy(copy + 16, &v, 4); /* L = 0 */
    ok &= read_fails(bad, copy, n, "positive") == 0;
    pl_llmc_model none;
    ok &= pl_llmc_read("/nonexistent/pliant/model.bin", &none, err_, sizeof err_) != 0;
    free(copy);
    free(file);
    free(host);
    remove(path);
    rmdir(dir);
    pl_engine_destroy(&e);
    kn_destroy(k);
    CHECK(ok);
}

/* An llm.c header with absurd sizes (a corrupt or hostile file) is refused
 * with an error, without integer overflow in the size computations. */
static void test_llmc_rejects_absurd_sizes(void) {
    char dir[] = "/tmp/pliant_test_engine_XXXXXX", path[128];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/huge.bin", dir);
    const int32_t cases[4][8] = {
        {20240326, 3, 1024, 50257, 12, 1, 1 << 30, 50304},         /* C: 4·C overflows int */
        {20240326, 3, 1024, 0x7fffffff - 5, 12, 12, 768, 0},       /* V: padding overflows */
        {20240326, 3, 1 << 20, 50257, 1 << 20, 1, 1 << 20, 50304}, /* parameters overflow size_t */
        {20240326, 3, 1024, 50257, 12, 12, 768, 50304},            /* GPT-2 124M, no data */
    };
    int ok = 1;
    for (int c = 0; c < 4; c++) {
        int32_t h[256] = {0};
        memcpy(h, cases[c], sizeof cases[c]);
        float tail[4] = {0};
        FILE *f = fopen(path, "wb");
        CHECK(f);
        ok &= fwrite(h, sizeof h, 1, f) == 1 && fwrite(tail, sizeof tail, 1, f) == 1;
        fclose(f);
        pl_llmc_model m;
        err_[0] = 0;
        if (pl_llmc_read(path, &m, err_, sizeof err_) == 0) {
            pl_llmc_free(&m);
            printf("    case %d: read succeeded\n", c);
            ok = 0;
        } else if (!err_[0]) {
            ok = 0;
        }
    }
    remove(path);
    rmdir(dir);
    CHECK(ok);
}

/* Ranges and shapes pl_engine_create refuses; names and offsets of tensors. */
static void test_create_and_tensor_table(void) {
    const pl_gpt_config cfg = tiny(2);
    const int NL = pl_gpt_nlayers(&cfg);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine e;
    const int bad[][5] = {/* begin, end, B, T, slots */
                          {0, 0, 1, 4, 1},      {2, 1, 1, 4, 1},  {-1, 2, 1, 4, 1},
                          {0, NL + 1, 1, 4, 1}, {0, NL, 0, 4, 1}, {0, NL, 1, 0, 1},
                          {0, NL, 1, 9, 1},     {0, NL, 1, 4, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_[0] = 0;
        CHECK(pl_engine_create(&e, k, &cfg, bad[i][0], bad[i][1], bad[i][2], bad[i][3], bad[i][4],
                               err_, sizeof err_) != 0);
        CHECK_STR_CONTAINS(err_, "engine");
    }
    /* every range: each layer's tensors contiguous from a page-aligned start (engine.h),
     * named layer.<i>.<name>, the head's wte copy first */
    for (int b = 0; b < NL; b++)
        for (int en = b + 1; en <= NL; en++) {
            CHECK(pl_engine_create(&e, k, &cfg, b, en, 1, 8, 2, err_, sizeof err_) == 0);
            size_t off = 0, want = 0;
            for (int l = b; l < en; l++) want += pl_gpt_layer_params(&cfg, l);
            if (en == NL && b > 0) want += pl_gpt_layer_params(&cfg, 0) - (size_t)cfg.maxT * cfg.C;
            size_t held = 0;
            int ok = (e.wte_tensor >= 0) == (b == 0 || en == NL);
            for (int t = 0; ok && t < e.ntensors; t++) {
                const pl_engine_tensor *x = &e.tensors[t];
                char name[64];
                snprintf(name, sizeof name, "layer.%d.%s", x->layer, x->spec.name);
                if (x->index == 0) off = pl_engine_align_layer(off);
                ok = x->offset == off && !strcmp(name, x->name) &&
                     pl_engine_find(&e, x->layer, x->index) == x;
                off += x->spec.numel;
                held += x->spec.numel;
            }
            ok = ok && held == want && e.nparams == pl_engine_align_layer(off);
            if (ok && b > 0 && en == NL)
                ok = e.wte_tensor == 0 && !strcmp(e.tensors[0].name, "layer.0.wte");
            for (int l = 0; ok && l < NL; l++) /* nothing outside the range but the wte copy */
                if (l < b || l >= en)
                    ok = pl_engine_find(&e, l, l == 0 ? 0 : 1) == NULL || (l == 0 && en == NL);
            if (ok && b > 0)
                ok = pl_engine_find(&e, 0, 1) == NULL; /* wpe stays with the embedding */
            pl_engine_destroy(&e);
            if (!ok) printf("    range [%d, %d)\n", b, en);
            CHECK(ok);
        }
    kn_destroy(k);
}

/* A new engine working in an old one's activation and scratch pages (pl_engine_share_work,
 * as a plan change does): pages are mapped, the old engine's leftovers in them change
 * nothing (losses and gradients equal, bit for bit, a fresh engine's), and the old engine's
 * memory sees the new one's writes (the pages are the same); likewise with a copy reserve's
 * pages where there is no old engine. */
static void test_shared_work_memory_changes_nothing(void) {
    pl_gpt_config cfg;
    CHECK(pl_gpt_config_init(&cfg, 4, 64, 4, 37, 32, err_, sizeof err_) == 0);
    enum { B = 4, T = 32 };
    const int NL = pl_gpt_nlayers(&cfg);
    kn_ctx *k = new_ctx();
    CHECK(k);
    pl_engine fresh, old, shared;
    CHECK(pl_engine_create(&fresh, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    CHECK(pl_engine_create(&old, k, &cfg, 1, NL - 1, B, T, 3, err_, sizeof err_) == 0);
    CHECK(pl_engine_create(&shared, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    /* the old engine's work memory full of leftovers (the CPU backend's is host memory) */
    memset(old.bw, 0x7f, 4096);
    unsigned char *leftovers = malloc(pl_engine_slot_bytes(&old));
    CHECK(leftovers);
    memset(leftovers, 0x7f, pl_engine_slot_bytes(&old));
    for (int i = 0; i < old.nslots; i++) pl_engine_slot_from_host(&old, i, leftovers);
    free(leftovers);
    const size_t mapped = pl_engine_share_work(&shared, &old, NULL, NULL);
    CHECK(mapped >= 4 * 4096 && mapped % KN_SHARE_ALIGN == 0);
    CHECK(shared.bw[0] != 0); /* the leftovers are there */
    int32_t tok[2][T * B], tgt[2][T * B];
    float lf[2], ls[2];
    for (int m = 0; m < 2; m++) make_batch(&cfg, B * T, tok[m], tgt[m]);
    /* a third from a copy reserve's present pages alone: half its work memory, taken in
     * part */
    pl_engine fromres;
    CHECK(pl_engine_create(&fromres, k, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    pl_reserve r = {0};
    const size_t half = fromres.act_bytes / 2 / KN_SHARE_ALIGN * KN_SHARE_ALIGN;
    CHECK_EQ_INT(pl_reserve_renew(&r, k, half), 1);
    for (int i = 0; i < 2000 && atomic_load(&r.ready) < r.bytes; i++) usleep(1000);
    const size_t taken = pl_engine_share_work(&fromres, NULL, pl_reserve_work_source, &r);
    CHECK(taken == r.bytes && taken == r.used);
    float lr[2];
    pl_engine *e[3] = {&fresh, &shared, &fromres};
    float *out[3] = {lf, ls, lr};
    for (int i = 0; i < 3; i++) {
        pl_engine_init_random(e[i], 5);
        pl_engine_zero_grads(e[i]);
        float *l = out[i];
        for (int m = 0; m < 2; m++) {
            l[m] = pl_engine_forward(e[i], 0, tok[m], NULL, tgt[m]);
            if (m) pl_engine_backward_last(e[i], 0, NULL, 0.5f, NULL, NULL);
            else pl_engine_backward(e[i], 0, NULL, 0.5f);
        }
    }
    CHECK(memcmp(lf, ls, sizeof lf) == 0 && memcmp(lf, lr, sizeof lf) == 0);
    CHECK(memcmp(fresh.grads, shared.grads, fresh.nparams * sizeof(float)) == 0);
    CHECK(memcmp(fresh.grads, fromres.grads, fresh.nparams * sizeof(float)) == 0);
    pl_engine_destroy(&fromres);
    pl_reserve_free(&r);
    unsigned char junk[4096];
    memset(junk, 0x7f, sizeof junk);
    CHECK(memcmp(old.bw, junk, sizeof junk) != 0); /* the new engine's scratch writes */
    pl_engine_destroy(&shared);
    pl_engine_destroy(&old);
    pl_engine_destroy(&fresh);
    kn_destroy(k);
}

/* Are lowp's gradients (on "cpu-lowp") within bf16 rounding of ref's (the CPU's, the same
 * layers)? bf16 inputs: about 2⁻⁹ of each, a few % of the largest gradient. */
static int grads_agree(const pl_engine *ref, const pl_engine *lowp, const char *what) {
    float *g = host_copy(ref, ref->grads, ref->nparams);
    float *gl = host_copy(lowp, lowp->grads, lowp->nparams);
    double gmax = 0, worst = 0;
    for (size_t j = 0; j < ref->nparams; j++) gmax = fmax(gmax, fabs(g[j]));
    for (size_t j = 0; j < ref->nparams; j++)
        worst = isfinite(gl[j]) ? fmax(worst, fabs((double)gl[j] - g[j])) : INFINITY;
    const int ok = worst <= 0.03 * gmax;
    if (!ok) printf("    %s: gradients %.3g apart (largest %.3g)\n", what, worst, gmax);
    free(g);
    free(gl);
    return ok;
}

/* test_bf16_copies_feed_every_matmul's gradients through 2 stages, [0, 2) and [2, L + 2),
 * on k (the CPU) and kl ("cpu-lowp"): the first stage has a block but no head, so its
 * residual gradient comes from the second stage (host memory for one microbatch, backend
 * memory for the other), not from a layernorm backward that writes its copy as it goes;
 * the engine must make that copy, or the block's projections read a stale one. */
static void check_stage_without_head(const pl_gpt_config *cfg, kn_ctx *k, kn_ctx *kl) {
    const int B = 2, T = 5, NL = pl_gpt_nlayers(cfg), cuts[3] = {0, 2, NL};
    kn_ctx *ks[2] = {k, kl};
    pl_engine st[2][2]; /* [backend][stage] */
    int32_t tok[2][10], tgt[2][10];
    rng_state = 23;
    for (int m = 0; m < 2; m++) make_batch(cfg, B * T, tok[m], tgt[m]);
    for (int i = 0; i < 2; i++) {
        pl_engine *s = st[i];
        for (int j = 0; j < 2; j++) {
            CHECK(pl_engine_create(&s[j], ks[i], cfg, cuts[j], cuts[j + 1], B, T, 2, err_,
                                   sizeof err_) == 0);
            pl_engine_init_random(&s[j], 31);
            perturb(&s[j]);
            pl_engine_zero_grads(&s[j]);
        }
        for (int m = 0; m < 2; m++) {
            pl_engine_forward(&s[0], m, tok[m], NULL, NULL);
            pl_engine_forward(&s[1], m, NULL, pl_engine_output(&s[0], m), tgt[m]);
        }
        pl_engine_backward(&s[1], 1, NULL, 0.05f);
        pl_engine_backward_dev(&s[0], 1, pl_engine_input_grad(&s[1]), 0.05f);
        pl_engine_backward_last(&s[1], 0, NULL, 0.05f, NULL, NULL);
        pl_engine_backward_last(&s[0], 0, pl_engine_input_grad(&s[1]), 0.05f, NULL, NULL);
    }
    CHECK(grads_agree(&st[0][0], &st[1][0], "stage [0, 2)"));
    CHECK(grads_agree(&st[0][1], &st[1][1], "stage [2, L + 2)"));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) pl_engine_destroy(&st[i][j]);
}

/* The engine hands every matmul the bf16 copies of its inputs where the backend keeps
 * them (kernels.h "Low-precision copies"), as CUDA's bf16 mode does: on "cpu-lowp" the
 * matmuls multiply the copies' values (the layernorms', the attention's and the GELU's
 * outputs and the gradients dpre and dqkv, each written by the kernel that makes the
 * value), the blocks' layernorm backwards read dln's copy, and the fp32 outputs that only
 * their copies are read through (the layernorms', qkv's, the attention's and the GELU's,
 * dpre, dqkv, the blocks' dln) are NaN; the blocks' outputs share one buffer, so the engine's
 * activations take less memory than the CPU's. So a matmul or layernorm backward given no
 * copy, a stale one, or a reader of those fp32 outputs shows as a loss or gradient far
 * from the CPU's or not finite. Two microbatches, an AdamW step and a third, over 2 slots; then keep_probs; then
 * a pipeline stage without the head. */
static void test_bf16_copies_feed_every_matmul(void) {
    const pl_gpt_config cfg = tiny(2);
    const int B = 2, T = 5, NL = pl_gpt_nlayers(&cfg);
    kn_ctx *k = new_ctx(), *kl = kn_create("cpu-lowp", 2, err_, sizeof err_);
    CHECK(k && kl);
    CHECK(kn_lowp_bytes(k, 8) == 0 && kn_lowp_bytes(kl, 8) == 16);
    pl_engine e[2];
    kn_ctx *ks[2] = {k, kl};
    const pl_adamw o = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    int32_t tok[3][10], tgt[3][10];
    rng_state = 17;
    for (int m = 0; m < 3; m++) make_batch(&cfg, B * T, tok[m], tgt[m]);
    float loss[2][3];
    for (int i = 0; i < 2; i++) {
        CHECK(pl_engine_create(&e[i], ks[i], &cfg, 0, NL, B, T, 2, err_, sizeof err_) == 0);
        pl_engine_init_random(&e[i], 31);
        perturb(&e[i]);
        pl_engine_zero_grads(&e[i]);
        loss[i][0] = pl_engine_forward(&e[i], 0, tok[0], NULL, tgt[0]);
        loss[i][1] = pl_engine_forward(&e[i], 1, tok[1], NULL, tgt[1]);
        pl_engine_backward(&e[i], 1, NULL, 0.05f);
        pl_engine_backward_last(&e[i], 0, NULL, 0.05f, NULL, NULL);
    }
    CHECK(grads_agree(&e[0], &e[1], "whole model"));
    CHECK(e[1].act_bytes < e[0].act_bytes);
    for (int i = 0; i < 2; i++) {
        pl_engine_adamw(&e[i], &o, 1.0f, 1);
        loss[i][2] = pl_engine_forward(&e[i], 0, tok[2], NULL, tgt[2]);
    }
    for (int m = 0; m < 3; m++) {
        if (!(fabsf(loss[1][m] - loss[0][m]) <= 0.01f * fabsf(loss[0][m])))
            printf("    microbatch %d: loss %.6g, with the copies %.6g\n", m, (double)loss[0][m],
                   (double)loss[1][m]);
        CHECK(fabsf(loss[1][m] - loss[0][m]) <= 0.01f * fabsf(loss[0][m]));
    }
    pl_engine_keep_probs(&e[1], 1); /* the sampling path: fp32 probabilities from the copies */
    CHECK(isfinite(pl_engine_forward(&e[1], 0, tok[0], NULL, tgt[0])));
    for (int i = 0; i < 2; i++) pl_engine_destroy(&e[i]);
    check_stage_without_head(&cfg, k, kl);
    kn_destroy(kl);
    kn_destroy(k);
}

/* Writes params from the host, as loads, restores, layer copies and shadow refreshes do
 * (no engine call): every parameter moved by a small step. */
static void nudge_params(pl_engine *e, double amp) {
    float *p = host_copy(e, e->params, e->nparams);
    for (size_t j = 0; j < e->nparams; j++) p[j] += (float)(amp * hash_unit(7, j, 0, 0));
    kn_to_device(e->k, e->params, p, e->nparams * sizeof(float));
    free(p);
}

/* The loss of a fresh engine on k whose parameters are e's now. */
static float fresh_loss(const pl_engine *e, const int32_t *tok, const int32_t *tgt) {
    pl_engine f;
    if (pl_engine_create(&f, e->k, &e->cfg, e->begin, e->end, e->B, e->T, 1, err_, sizeof err_))
        abort();
    kn_copy(e->k, f.params, e->params, e->nparams * sizeof(float));
    const float loss = pl_engine_forward(&f, 0, tok, NULL, tgt);
    pl_engine_destroy(&f);
    return loss;
}

/* Are a's and b's losses and gradients the same floats? */
static int same_run(const pl_engine *a, const pl_engine *b, float la, float lb) {
    float *ga = host_copy(a, a->grads, a->nparams), *gb = host_copy(b, b->grads, b->nparams);
    const int same = la == lb && memcmp(ga, gb, a->nparams * sizeof(float)) == 0;
    if (!same) printf("    loss %.9g against a fresh engine's %.9g\n", (double)la, (double)lb);
    free(ga);
    free(gb);
    return same;
}

/* The weights' bf16 mirror (kn_lowp_mirror; on "cpu-lowp" the matmuls multiply its
 * values) follows every write to the parameters: AdamW over two steps, then a write from
 * the host between forwards with no engine call in between (a shadow refresh before an
 * eager FRC forward), then one after a forward without zero_grads. Each time the engine
 * computes what a fresh engine given the same parameters computes, bit for bit; a stale
 * mirror gives the old weights' products. */
static void test_lowp_mirror_follows_param_writes(void) {
    const pl_gpt_config cfg = tiny(2);
    const int B = 2, T = 5, NL = pl_gpt_nlayers(&cfg);
    kn_ctx *kl = kn_create("cpu-lowp", 2, err_, sizeof err_);
    CHECK(kl != NULL);
    const pl_adamw o = {3e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
    int32_t tok[3][10], tgt[3][10];
    rng_state = 29;
    for (int m = 0; m < 3; m++) make_batch(&cfg, B * T, tok[m], tgt[m]);
    pl_engine e, f;
    CHECK(pl_engine_create(&e, kl, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    pl_engine_init_random(&e, 31);
    perturb(&e);
    for (int step = 1; step <= 2; step++) {
        pl_engine_zero_grads(&e);
        pl_engine_forward(&e, 0, tok[step - 1], NULL, tgt[step - 1]);
        pl_engine_backward_last(&e, 0, NULL, 0.05f, NULL, NULL);
        pl_engine_adamw(&e, &o, 1.0f, step);
    }
    pl_engine_forward(&e, 0, tok[0], NULL, tgt[0]); /* an evaluation: the mirror is made */
    nudge_params(&e, 0.05);
    CHECK(pl_engine_forward(&e, 0, tok[1], NULL, tgt[1]) == fresh_loss(&e, tok[1], tgt[1]));
    nudge_params(&e, 0.05);
    pl_engine_zero_grads(&e);
    const float loss = pl_engine_forward(&e, 0, tok[2], NULL, tgt[2]);
    pl_engine_backward_last(&e, 0, NULL, 0.05f, NULL, NULL);

    CHECK(pl_engine_create(&f, kl, &cfg, 0, NL, B, T, 1, err_, sizeof err_) == 0);
    kn_copy(kl, f.params, e.params, e.nparams * sizeof(float));
    pl_engine_zero_grads(&f);
    const float loss_f = pl_engine_forward(&f, 0, tok[2], NULL, tgt[2]);
    pl_engine_backward_last(&f, 0, NULL, 0.05f, NULL, NULL);
    CHECK(same_run(&e, &f, loss, loss_f));
    pl_engine_destroy(&f);
    pl_engine_destroy(&e);
    kn_destroy(kl);
}

TEST_MAIN_BEGIN
RUN(test_loss_and_gradients_match_double_reference);
RUN(test_every_partition_matches_whole_model);
RUN(test_slots_interleaved_match_sequential);
RUN(test_adamw_formula_and_decay);
RUN(test_grad_sumsq);
RUN(test_lr_schedule);
RUN(test_lr_cosine_ends_at_min_ratio);
RUN(test_llmc_files);
RUN(test_create_and_tensor_table);
RUN(test_llmc_rejects_absurd_sizes);
RUN(test_shared_work_memory_changes_nothing);
RUN(test_bf16_copies_feed_every_matmul);
RUN(test_lowp_mirror_follows_param_writes);
TEST_MAIN_END
