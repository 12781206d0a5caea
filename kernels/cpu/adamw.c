/* AdamW with bias correction (llm.c gpt2_update), with a gradient scale
 * (e.g. 1/global-norm clipping or 1/microbatches) folded in. */
#include <math.h>
#include <omp.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "cpu.h"

#define ADAM_BLOCK 256

typedef struct {
    float lr, beta1, beta2, eps, wd, scale, c1, c2; /* c1 = 1/(1−β1^t), c2 = 1/(1−β2^t) */
} adam_args;

/* Square roots of x[0, n) in place. sqrtf in a loop does not vectorize while
 * it may set errno (the build keeps -fmath-errno), so x86 uses sqrtps. */
KN_SIMD static void sqrt_span(float *x, int n)
{
    int i = 0;
#if defined(__SSE__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

KN_SIMD static void adam_span(float *restrict p, const float *restrict g, float *restrict m,
                              float *restrict v, size_t n, const adam_args *a)
{
    float den[ADAM_BLOCK];
    const float b1 = a->beta1, b2 = a->beta2, s = a->scale, c1 = a->c1, c2 = a->c2;
    const float lr = a->lr, eps = a->eps, wd = a->wd;
    for (size_t i0 = 0; i0 < n; i0 += ADAM_BLOCK) {
        int w = n - i0 < ADAM_BLOCK ? (int)(n - i0) : ADAM_BLOCK;
        float *restrict pp = p + i0, *restrict mm = m + i0, *restrict vv = v + i0;
        const float *restrict gg = g + i0;
#pragma omp simd
        for (int i = 0; i < w; i++) {
            float grad = gg[i] * s;
            float mi = b1 * mm[i] + (1.0f - b1) * grad;
            float vi = b2 * vv[i] + (1.0f - b2) * grad * grad;
            mm[i] = mi;
            vv[i] = vi;
            den[i] = vi * c2; /* v̂ */
        }
        sqrt_span(den, w);
#pragma omp simd
        for (int i = 0; i < w; i++) {
            float m_hat = mm[i] * c1;
            pp[i] -= lr * (m_hat / (den[i] + eps) + wd * pp[i]);
        }
    }
}

void kn_cpu_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int t)
{
    adam_args a = {
        .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .wd = weight_decay,
        .scale = grad_scale,
        .c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t))),
        .c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t))),
    };
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 64, &lo, &hi);
        if (hi > lo) adam_span(params + lo, grads + lo, m + lo, v + lo, hi - lo, &a);
    }
}

/* A call per span: the CPU has no launch cost to save. */
void kn_cpu_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                               const kn_adamw_span *spans, int nspans, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t)
{
    for (int i = 0; i < nspans; i++) {
        const size_t o = spans[i].offset;
        kn_cpu_adamw_update(k, params + o, grads + o, m + o, v + o, spans[i].n, lr, beta1, beta2,
                            eps, spans[i].decay ? weight_decay : 0.0f, grad_scale, t);
    }
}
