/* Softmax over the first V of Vp logits and cross-entropy (llm.c
 * softmax_forward, crossentropy_forward, crossentropy_softmax_backward fused
 * per row). Targets must be < V; a target < 0 masks the position (loss 0,
 * gradient 0); a target ≥ V is bad data and gives a NaN loss (never an
 * out-of-bounds read). */
#include <math.h>
#include <omp.h>

#include "cpu.h"

/* probs[0..V) = softmax(logits[0..V)), probs[V..Vp) = 0; returns the loss.
 * probs may alias logits (the engine computes in place), hence no restrict
 * and the target's logit read before the row is overwritten. */
KN_SIMD static float softmax_ce_row(float *probs, const float *logits, int target, int V, int Vp)
{
    float target_logit = target >= 0 && target < V ? logits[target] : 0.0f;
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int i = 0; i < V; i++) maxval = logits[i] > maxval ? logits[i] : maxval;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; i++) {
        float e = kn_expf(logits[i] - maxval);
        probs[i] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < V; i++) probs[i] *= inv;
    for (int i = V; i < Vp; i++) probs[i] = 0.0f;
    if (target < 0) return 0.0f;
    if (target >= V) return NAN;
    /* −log p[target] = log Σ e^(l − max) − (l[target] − max): no log(0) when
     * p[target] underflows. */
    return logf(sum) - (target_logit - maxval);
}

void kn_cpu_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs,
                                         const float *logits, const int32_t *targets, int BT, int V,
                                         int Vp)
{
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if ((long)BT * Vp >= KN_PAR_MIN)
    for (int r = 0; r < BT; r++)
        losses[r] = softmax_ce_row(probs + (size_t)r * Vp, logits + (size_t)r * Vp, targets[r], V,
                                   Vp);
}

/* dlogits may alias probs: the target's probability is read first. */
KN_SIMD static void ce_backward_row(float *dlogits, const float *probs, int target, float scale,
                                    int V, int Vp)
{
    if (target < 0) {
        for (int i = 0; i < Vp; i++) dlogits[i] = 0.0f;
        return;
    }
    float p_target = target < V ? probs[target] : 0.0f;
#pragma omp simd
    for (int i = 0; i < V; i++) dlogits[i] = probs[i] * scale;
    for (int i = V; i < Vp; i++) dlogits[i] = 0.0f;
    if (target < V) dlogits[target] = (p_target - 1.0f) * scale;
}

void kn_cpu_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                          const int32_t *targets, float dloss_scale, int BT, int V,
                                          int Vp)
{
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if ((long)BT * Vp >= KN_PAR_MIN)
    for (int r = 0; r < BT; r++)
        ce_backward_row(dlogits + (size_t)r * Vp, probs + (size_t)r * Vp, targets[r], dloss_scale,
                        V, Vp);
}

/* ---- the loss and gradient from per-row statistics ---------------------------
 * The training path (kernels.h): forward keeps (max, sum) per row instead of the
 * probabilities, backward recomputes each probability as the pair above does,
 * e^(l − max) rounded to float, times 1/sum: the same operations in the same
 * order, so losses and dlogits equal softmax_ce_row + ce_backward_row's bit for
 * bit (test_kernels_cpu checks). */

KN_SIMD static float ce_stats_row(float *stats, const float *logits, int target, int V)
{
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int i = 0; i < V; i++) maxval = logits[i] > maxval ? logits[i] : maxval;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; i++) sum += kn_expf(logits[i] - maxval);
    stats[0] = maxval;
    stats[1] = sum;
    if (target < 0) return 0.0f;
    if (target >= V) return NAN;
    return logf(sum) - (logits[target] - maxval);
}

void kn_cpu_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                                 const int32_t *targets, int BT, int V, int Vp)
{
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if ((long)BT * Vp >= KN_PAR_MIN)
    for (int r = 0; r < BT; r++)
        losses[r] = ce_stats_row(stats + 2 * (size_t)r, logits + (size_t)r * Vp, targets[r], V);
}

/* dlogits may alias logits: every element depends on its own logit only. */
KN_SIMD static void ce_backward_stats_row(float *dlogits, const float *logits, const float *stats,
                                          int target, float scale, int V, int Vp)
{
    if (target < 0) {
        for (int i = 0; i < Vp; i++) dlogits[i] = 0.0f;
        return;
    }
    const float maxval = stats[0], inv = 1.0f / stats[1];
    float p_target = target < V ? kn_expf(logits[target] - maxval) * inv : 0.0f;
#pragma omp simd
    for (int i = 0; i < V; i++) {
        float e = kn_expf(logits[i] - maxval);
        dlogits[i] = e * inv * scale;
    }
    for (int i = V; i < Vp; i++) dlogits[i] = 0.0f;
    if (target < V) dlogits[target] = (p_target - 1.0f) * scale;
}

void kn_cpu_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits,
                                  const float *stats, const int32_t *targets, float dloss_scale,
                                  int BT, int V, int Vp)
{
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if ((long)BT * Vp >= KN_PAR_MIN)
    for (int r = 0; r < BT; r++)
        ce_backward_stats_row(dlogits + (size_t)r * Vp, logits + (size_t)r * Vp,
                              stats + 2 * (size_t)r, targets[r], dloss_scale, V, Vp);
}
