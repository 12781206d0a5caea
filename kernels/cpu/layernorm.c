/* LayerNorm over channels, eps 1e-5 (llm.c layernorm_forward / _backward). */
#include <math.h>
#include <omp.h>

#include "cpu.h"

#define LN_EPS 1e-5f

KN_SIMD static void ln_forward_row(float *restrict out, float *restrict mean, float *restrict rstd,
                                   const float *restrict x, const float *restrict w,
                                   const float *restrict b, int C)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++) s += x[i];
    float m = s / (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    v = v / (float)C;
    float r = 1.0f / sqrtf(v + LN_EPS);
#pragma omp simd
    for (int i = 0; i < C; i++) out[i] = (r * (x[i] - m)) * w[i] + b[i];
    *mean = m;
    *rstd = r;
}

void kn_cpu_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int B,
                              int T, int C)
{
    long BT = (long)B * T;
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if (BT * C >= KN_PAR_MIN)
    for (long r = 0; r < BT; r++)
        ln_forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C);
}

/* dinp of one row: dinp += rstd·(w·dout − mean(w·dout) − norm·mean(w·dout·norm)). */
KN_SIMD static void ln_backward_row(float *restrict dinp, const float *restrict dout,
                                    const float *restrict x, const float *restrict w, float m,
                                    float r, int C)
{
    float a = 0.0f, bsum = 0.0f;
#pragma omp simd reduction(+ : a, bsum)
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * r;
        float dnorm = w[i] * dout[i];
        a += dnorm;
        bsum += dnorm * norm;
    }
    float dnorm_mean = a / (float)C, dnorm_norm_mean = bsum / (float)C;
#pragma omp simd
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * r;
        float dval = w[i] * dout[i] - dnorm_mean - norm * dnorm_norm_mean;
        dinp[i] += dval * r;
    }
}

/* dweight += dout·norm and dbias += dout on channels [0, n) of one row. */
KN_SIMD static void ln_backward_params(float *restrict dw, float *restrict db,
                                       const float *restrict dout, const float *restrict x,
                                       float m, float r, int n)
{
    if (dw) {
#pragma omp simd
        for (int i = 0; i < n; i++) dw[i] += dout[i] * ((x[i] - m) * r);
    }
    if (db) {
#pragma omp simd
        for (int i = 0; i < n; i++) db[i] += dout[i];
    }
}

/* dinp_lp and dout_lp are NULL: the CPU keeps no low-precision copies (kn_lowp_bytes
 * is 0). */
void kn_cpu_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                               float *dbias, const float *dout, const void *dout_lp,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C)
{
    long BT = (long)B * T;
#pragma omp parallel num_threads(k->threads) if (BT * C >= KN_PAR_MIN)
    {
        if (dinp) {
#pragma omp for schedule(static) nowait
            for (long r = 0; r < BT; r++)
                ln_backward_row(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r], rstd[r],
                                C);
        }
        /* Parameter gradients: each thread owns a channel range and walks the
         * rows in order (no reduction buffers; same sums for any thread count). */
        if (dweight || dbias) {
            size_t c0, c1;
            kn_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
            int n = (int)(c1 - c0);
            if (n > 0)
                for (long r = 0; r < BT; r++)
                    ln_backward_params(dweight ? dweight + c0 : NULL, dbias ? dbias + c0 : NULL,
                                       dout + r * C + c0, inp + r * C + c0, mean[r], rstd[r], n);
        }
    }
}
