/* A double-precision reference GPT-2 for tests, written as plain loops with
 * exactly the math of llm.c's train_gpt2.c: encoder (wte + wpe), LayerNorm
 * (eps 1e-5, biased variance), qkv projection, causal attention scaled by
 * 1/sqrt(hs), GELU (tanh approximation), residuals, final LayerNorm, the LM
 * head tied to wte over the first V logits, and the mean cross-entropy over
 * the B·T positions (a target < 0 adds 0 but still counts in the mean).
 *
 * Parameters come as one pointer per (layer, tensor index) of
 * pl_gpt_layer_tensors: t[layer * GREF_MAX_TENSORS + index]; layer 0 holds
 * wte [Vp, C] and wpe [maxT, C], layers 1..L the blocks (ln1w, ln1b, qkvw,
 * qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb), layer L+1
 * lnfw, lnfb. Only tests use it (forward only: tests take gradients by finite
 * differences of it). */
#ifndef PLIANT_GPT_REFERENCE_H
#define PLIANT_GPT_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GREF_MAX_TENSORS 12

typedef struct {
    int L, C, NH, V, Vp, maxT;
    const double *const *t; /* (L + 2) · GREF_MAX_TENSORS pointers */
} gref_model;

static inline const double *gref_t(const gref_model *m, int layer, int index) {
    return m->t[layer * GREF_MAX_TENSORS + index];
}

/* out[C] = LayerNorm(x[C]) · w + b */
static inline void gref_layernorm(double *out, const double *x, const double *w, const double *b,
                                  int C) {
    double mean = 0, var = 0;
    for (int i = 0; i < C; i++) mean += x[i];
    mean /= C;
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= C;
    double rstd = 1.0 / sqrt(var + 1e-5);
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
}

/* out[OC] = W[OC, C] · x[C] + bias[OC] (bias may be NULL) */
static inline void gref_linear(double *out, const double *x, const double *W, const double *bias,
                               int C, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = bias ? bias[o] : 0.0;
        for (int i = 0; i < C; i++) s += W[(size_t)o * C + i] * x[i];
        out[o] = s;
    }
}

static inline double gref_gelu(double x) {
    const double s = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(s * (x + 0.044715 * x * x * x)));
}

/* The residual stream x[B, T, C] after the embedding and the first `nblocks`
 * transformer blocks (0 ≤ nblocks ≤ L). */
static inline void gref_hidden(const gref_model *m, const int32_t *tokens, int B, int T,
                               int nblocks, double *x) {
    const int C = m->C, NH = m->NH, hs = C / NH;
    const size_t BT = (size_t)B * T;
    const double *wte = gref_t(m, 0, 0), *wpe = gref_t(m, 0, 1);
    for (size_t r = 0; r < BT; r++)
        for (int i = 0; i < C; i++)
            x[r * C + i] = wte[(size_t)tokens[r] * C + i] + wpe[(r % T) * C + i];
    double *ln = malloc(BT * C * sizeof(double));
    double *qkv = malloc(BT * 3 * C * sizeof(double));
    double *y = malloc(BT * C * sizeof(double));
    double *h = malloc(BT * 4 * C * sizeof(double));
    double *proj = malloc((size_t)C * sizeof(double));
    double *att = malloc((size_t)T * sizeof(double));
    if (!ln || !qkv || !y || !h || !proj || !att) abort();
    for (int l = 1; l <= nblocks; l++) {
        const double *ln1w = gref_t(m, l, 0), *ln1b = gref_t(m, l, 1);
        const double *qkvw = gref_t(m, l, 2), *qkvb = gref_t(m, l, 3);
        const double *apw = gref_t(m, l, 4), *apb = gref_t(m, l, 5);
        const double *ln2w = gref_t(m, l, 6), *ln2b = gref_t(m, l, 7);
        const double *fcw = gref_t(m, l, 8), *fcb = gref_t(m, l, 9);
        const double *fpw = gref_t(m, l, 10), *fpb = gref_t(m, l, 11);
        /* attention */
        for (size_t r = 0; r < BT; r++) {
            gref_layernorm(ln + r * C, x + r * C, ln1w, ln1b, C);
            gref_linear(qkv + r * 3 * C, ln + r * C, qkvw, qkvb, C, 3 * C);
        }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int hd = 0; hd < NH; hd++) {
                    const double *q = qkv + ((size_t)b * T + t) * 3 * C + hd * hs;
                    double mx = -INFINITY, sum = 0;
                    for (int u = 0; u <= t; u++) {
                        const double *k = qkv + ((size_t)b * T + u) * 3 * C + C + hd * hs;
                        double s = 0;
                        for (int i = 0; i < hs; i++) s += q[i] * k[i];
                        att[u] = s / sqrt((double)hs);
                        if (att[u] > mx) mx = att[u];
                    }
                    for (int u = 0; u <= t; u++) sum += (att[u] = exp(att[u] - mx));
                    double *o = y + ((size_t)b * T + t) * C + hd * hs;
                    for (int i = 0; i < hs; i++) o[i] = 0;
                    for (int u = 0; u <= t; u++) {
                        const double *v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + hd * hs;
                        for (int i = 0; i < hs; i++) o[i] += att[u] / sum * v[i];
                    }
                }
        for (size_t r = 0; r < BT; r++) {
            gref_linear(proj, y + r * C, apw, apb, C, C);
            for (int i = 0; i < C; i++) x[r * C + i] += proj[i];
        }
        /* MLP */
        for (size_t r = 0; r < BT; r++) {
            gref_layernorm(ln + r * C, x + r * C, ln2w, ln2b, C);
            gref_linear(h + r * 4 * C, ln + r * C, fcw, fcb, C, 4 * C);
            for (int i = 0; i < 4 * C; i++) h[r * 4 * C + i] = gref_gelu(h[r * 4 * C + i]);
            gref_linear(proj, h + r * 4 * C, fpw, fpb, 4 * C, C);
            for (int i = 0; i < C; i++) x[r * C + i] += proj[i];
        }
    }
    free(ln);
    free(qkv);
    free(y);
    free(h);
    free(proj);
    free(att);
}

/* Mean cross-entropy over the B·T positions given the residual stream after
 * the last block: final LayerNorm, logits against the first V rows of wte. */
static inline double gref_head_loss(const gref_model *m, const double *x, const int32_t *targets,
                                    int B, int T) {
    const int C = m->C, V = m->V;
    const size_t BT = (size_t)B * T;
    const double *wte = gref_t(m, 0, 0);
    const double *lnfw = gref_t(m, m->L + 1, 0), *lnfb = gref_t(m, m->L + 1, 1);
    double *ln = malloc((size_t)C * sizeof(double)), *logits = malloc((size_t)V * sizeof(double));
    if (!ln || !logits) abort();
    double total = 0;
    for (size_t r = 0; r < BT; r++) {
        if (targets[r] < 0) continue;
        gref_layernorm(ln, x + r * C, lnfw, lnfb, C);
        gref_linear(logits, ln, wte, NULL, C, V);
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            if (logits[v] > mx) mx = logits[v];
        for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
        total += log(sum) + mx - logits[targets[r]];
    }
    free(ln);
    free(logits);
    return total / (double)BT;
}

/* The whole model's mean loss. */
static inline double gref_loss(const gref_model *m, const int32_t *tokens, const int32_t *targets,
                               int B, int T) {
    double *x = malloc((size_t)B * T * m->C * sizeof(double));
    if (!x) abort();
    gref_hidden(m, tokens, B, T, m->L, x);
    double loss = gref_head_loss(m, x, targets, B, T);
    free(x);
    return loss;
}

#endif
