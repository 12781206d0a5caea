/* Causal multi-head self-attention (llm.c attention_forward / _backward).
 *
 * The OpenMP team takes (batch, head) pairs; each thread works one pair at a
 * time with single-threaded sgemm calls on strided views of qkv (row stride
 * 3C). Rows are processed in blocks of ATT_BLOCK query positions: a block of
 * rows [r0, r1) only needs key/value positions [0, r1), so the products touch
 * the lower block-triangle only (for T = 1024 about 6 % more than the exact
 * triangle, instead of 100 %).
 *
 * Forward writes att[b, h, t, :] = softmax over columns 0..t, and zeros in
 * columns t+1..T-1 (as llm.c). Backward relies on those zeros (att as written
 * by kn_attention_forward) and needs ATT_BLOCK × T floats of scratch per
 * thread, kept in the context's workspace. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"

#define ATT_BLOCK 64 /* 32, 128 and 256 measured slower for T = 64 … 1024 */

/* In place: row[0..len) = softmax(row[0..len)), row[len..T) = 0. */
KN_SIMD static void softmax_causal_row(float *restrict row, int len, int T)
{
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int i = 0; i < len; i++) maxval = row[i] > maxval ? row[i] : maxval;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < len; i++) {
        float e = kn_expf(row[i] - maxval);
        row[i] = e;
        sum += e;
    }
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < len; i++) row[i] *= inv;
    for (int i = len; i < T; i++) row[i] = 0.0f;
}

/* Softmax backward of one row, scaled: d[i] = scale·a[i]·(d[i] − Σ_j a[j]·d[j])
 * for i < len; d[len..n) = 0 (so the block products see a causal matrix). */
KN_SIMD static void softmax_backward_row(float *restrict d, const float *restrict a, int len,
                                         int n, float scale)
{
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < len; i++) dot += a[i] * d[i];
#pragma omp simd
    for (int i = 0; i < len; i++) d[i] = scale * a[i] * (d[i] - dot);
    for (int i = len; i < n; i++) d[i] = 0.0f;
}

/* The CPU keeps no low-precision copies (kn_lowp_bytes is 0): out_lp and dqkv_lp
 * are NULL and unused (kernels/cpu/lowp.c makes them where emulated). */
void kn_cpu_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                              const void *qkv_lp, int B, int T, int C, int NH)
{
    const int C3 = 3 * C, hs = C / NH, BH = B * NH;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for num_threads(k->threads) schedule(dynamic, 1) \
    if ((long)BH * T * T * hs >= (1L << 16))
    for (int bh = 0; bh < BH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *Q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *K = Q + C, *V = Q + 2 * C;
        float *A = att + (size_t)bh * T * T;
        float *O = out + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, m = r1 - r0;
            /* preatt[r0:r1, 0:r1] = scale · Q[r0:r1] · K[0:r1]ᵀ */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, scale,
                        Q + (size_t)r0 * C3, C3, K, C3, 0.0f, A + (size_t)r0 * T, T);
            for (int t = r0; t < r1; t++) softmax_causal_row(A + (size_t)t * T, t + 1, T);
            /* out[r0:r1] = att[r0:r1, 0:r1] · V[0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f,
                        A + (size_t)r0 * T, T, V, C3, 0.0f, O + (size_t)r0 * C, C);
        }
    }
}

void kn_cpu_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                               const void *dout_lp, const float *qkv, const void *qkv_lp,
                               const float *att, const float *out, const void *out_lp, int B,
                               int T, int C, int NH)
{
    (void)out; /* the saved probabilities att are all this needs */
    (void)dout_lp, (void)out_lp; /* NULL: no copies on the CPU */
    const int C3 = 3 * C, hs = C / NH, BH = B * NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int bs = T < ATT_BLOCK ? T : ATT_BLOCK;
    const size_t per_thread = ((size_t)bs * T + 15) / 16 * 16; /* floats, 64-byte multiple */
    float *ws = kn_cpu_workspace(k, per_thread * sizeof(float) * (size_t)k->threads);
#pragma omp parallel for num_threads(k->threads) schedule(dynamic, 1) \
    if ((long)BH * T * T * hs >= (1L << 16))
    for (int bh = 0; bh < BH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *S = ws + per_thread * (size_t)omp_get_thread_num();
        size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
        const float *Q = qkv + qoff, *K = Q + C, *V = Q + 2 * C;
        float *dQ = dqkv + qoff, *dK = dQ + C, *dV = dQ + 2 * C;
        const float *A = att + (size_t)bh * T * T;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        for (int t = 0; t < T; t++) /* the head's dQ, dK, dV are overwritten (kernels.h) */
            for (int part = 0; part < 3; part++)
                memset(dQ + (size_t)t * C3 + (size_t)part * C, 0, (size_t)hs * sizeof(float));
        for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, m = r1 - r0;
            /* datt[r0:r1, 0:r1] = dO[r0:r1] · V[0:r1]ᵀ, into S (row stride r1) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, 1.0f,
                        dO + (size_t)r0 * C, C, V, C3, 0.0f, S, r1);
            /* dpreatt (times scale), zero above the diagonal */
            for (int t = r0; t < r1; t++)
                softmax_backward_row(S + (size_t)(t - r0) * r1, A + (size_t)t * T, t + 1, r1,
                                     scale);
            /* dV[0:r1] += att[r0:r1, 0:r1]ᵀ · dO[r0:r1] */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, m, 1.0f,
                        A + (size_t)r0 * T, T, dO + (size_t)r0 * C, C, 1.0f, dV, C3);
            /* dQ[r0:r1] += dpreatt[r0:r1, 0:r1] · K[0:r1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, 1.0f, S, r1, K, C3,
                        1.0f, dQ + (size_t)r0 * C3, C3);
            /* dK[0:r1] += dpreatt[r0:r1, 0:r1]ᵀ · Q[r0:r1] */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, m, 1.0f, S, r1,
                        Q + (size_t)r0 * C3, C3, 1.0f, dK, C3);
        }
    }
}

/* The CPU keeps the probabilities themselves (kernels.h). */
size_t kn_cpu_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp)
{
    (void)k, (void)qkv_lp;
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T;
}
