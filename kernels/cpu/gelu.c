/* GELU, tanh approximation (llm.c gelu_forward / gelu_backward):
 *   gelu(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
 * tanh is kn_tanhf (vectorizable, absolute error ≈ 1e-7); sech² = 1 − tanh². */
#include <omp.h>

#include "cpu.h"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

KN_SIMD static void gelu_fwd_span(float *restrict out, const float *restrict inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cube = GELU_C * x * x * x;
        out[i] = 0.5f * x * (1.0f + kn_tanhf(GELU_SCALE * (x + cube)));
    }
}

static inline float gelu_grad(float x)
{
    float cube = GELU_C * x * x * x;
    float th = kn_tanhf(GELU_SCALE * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_C * x * x);
}

KN_SIMD static void gelu_bwd_span(float *restrict dinp, const float *restrict inp,
                                  const float *restrict dout, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) dinp[i] += gelu_grad(inp[i]) * dout[i];
}

/* d ⊙= gelu'(inp), in place */
KN_SIMD static void gelu_scale_span(float *restrict d, const float *restrict inp, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) d[i] = gelu_grad(inp[i]) * d[i];
}

void kn_cpu_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n)
{
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (hi > lo) gelu_fwd_span(out + lo, inp + lo, hi - lo);
    }
}

void kn_cpu_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (hi > lo) gelu_bwd_span(dinp + lo, inp + lo, dout + lo, hi - lo);
    }
}

/* The fused pair of kernels.h is two passes here: the sums are those of matmul
 * then GELU, bit for bit. */
void kn_cpu_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre,
                                const float *inp, const void *inp_lp, const float *weight,
                                const float *bias, int BT, int C, int OC)
{
    kn_cpu_matmul_forward(k, pre, NULL, inp, inp_lp, weight, bias, BT, C, OC);
    kn_cpu_gelu_forward(k, out, pre, (size_t)BT * (size_t)OC);
}

void kn_cpu_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                 float *dbias, const float *dout, const void *dout_lp,
                                 const float *inp, const void *inp_lp, const float *weight,
                                 const float *pre, int BT, int C, int OC)
{
    const size_t n = (size_t)BT * (size_t)C;
    memset(dpre, 0, n * sizeof *dpre);
    kn_cpu_matmul_backward(k, dpre, dweight, dbias, dout, dout_lp, inp, inp_lp, weight, BT, C,
                           OC);
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (hi > lo) gelu_scale_span(dpre + lo, pre + lo, hi - lo);
    }
}
