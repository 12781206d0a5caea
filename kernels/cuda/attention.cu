/* Causal multi-head self-attention (kernels/cpu/attention.c), the
 * straightforward version: per sequence b, cuBLAS strided-batched GEMMs over
 * the NH heads straight on the strided q, k, v views of qkv (head h starts
 * h·hs channels into a row of 3C), and a warp-per-row causal softmax. It
 * computes full T×T products (the upper triangle is masked afterwards) and
 * keeps att[B, NH, T, T] in global memory, as kernels.h requires for
 * backward.
 *
 * The fast path goes here: a fused flash-attention kernel (online softmax,
 * tiles of K/V in shared memory, no T×T matrix in global memory, backward
 * recomputing the probabilities from a saved logsumexp per row). It needs
 * kernels.h to let att be that [B, NH, T] logsumexp instead. */
#include <math.h>

#include "cuda.cuh"

/* In place on each row t of att (rows of T floats, row index r, t = r % T):
 * softmax over columns 0..t, zeros after. One warp per row. */
__global__ static void softmax_causal_kernel(float *att, long rows, int T)
{
    long r = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    float *row = att + r * T;
    int len = (int)(r % T) + 1;
    float maxval = -INFINITY;
    for (int i = lane; i < len; i += 32) maxval = fmaxf(maxval, row[i]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int i = lane; i < len; i += 32) {
        float e = expf(row[i] - maxval);
        row[i] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int i = lane; i < len; i += 32) row[i] *= inv;
    for (int i = len + lane; i < T; i += 32) row[i] = 0.0f;
}

/* In place on rows of d: d[i] = scale·a[i]·(d[i] − Σ_j a[j]·d[j]) for i ≤ t,
 * 0 after (so the products that follow see a causal matrix). */
__global__ static void softmax_causal_backward_kernel(float *d, const float *att, long rows, int T,
                                                      float scale)
{
    long r = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    float *dr = d + r * T;
    const float *a = att + r * T;
    int len = (int)(r % T) + 1;
    float dot = 0.0f;
    for (int i = lane; i < len; i += 32) dot += a[i] * dr[i];
    dot = warp_sum(dot);
    for (int i = lane; i < len; i += 32) dr[i] = scale * a[i] * (dr[i] - dot);
    for (int i = len + lane; i < T; i += 32) dr[i] = 0.0f;
}

static unsigned warp_rows_blocks(long rows) { return (unsigned)((rows * 32 + 255) / 256); }

void kn_cuda_attention_forward(kn_ctx *k, float *out, float *att, const float *qkv, int B, int T,
                               int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    const int C3 = 3 * C, hs = C / NH;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) { /* preatt[h] = scale · Q_h · K_hᵀ (column-major: K'ᵀ · Q') */
        const float *Q = qkv + (size_t)b * T * C3, *K = Q + C;
        kn_cuda_gemm_batched(k, true, false, T, T, hs, scale, K, C3, hs, Q, C3, hs, 0.0f,
                             att + (size_t)b * NH * TT, T, TT, NH);
    }
    long rows = (long)B * NH * T;
    softmax_causal_kernel<<<warp_rows_blocks(rows), 256, 0, kn_stream(k)>>>(att, rows, T);
    CUDA_LAUNCHED();
    for (int b = 0; b < B; b++) { /* out_h = att_h · V_h (column-major: V' · att') */
        const float *V = qkv + (size_t)b * T * C3 + 2 * C;
        kn_cuda_gemm_batched(k, false, false, hs, T, T, 1.0f, V, C3, hs,
                             att + (size_t)b * NH * TT, T, TT, 0.0f, out + (size_t)b * T * C, C,
                             hs, NH);
    }
}

/* One sequence at a time, so the scratch dpreatt is NH·T·T floats, not B times that. */
void kn_cuda_attention_backward(kn_ctx *k, float *dqkv, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    const int C3 = 3 * C, hs = C / NH;
    const long long TT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    float *S = (float *)kn_cuda_workspace(k, (size_t)NH * TT * sizeof(float));
    for (int b = 0; b < B; b++) {
        const float *Q = qkv + (size_t)b * T * C3, *K = Q + C, *V = Q + 2 * C;
        float *dQ = dqkv + (size_t)b * T * C3, *dK = dQ + C, *dV = dQ + 2 * C;
        const float *A = att + (size_t)b * NH * TT, *dO = dout + (size_t)b * T * C;
        /* datt = dO · Vᵀ (column-major: V'ᵀ · dO') */
        kn_cuda_gemm_batched(k, true, false, T, T, hs, 1.0f, V, C3, hs, dO, C, hs, 0.0f, S, T,
                             TT, NH);
        /* dV += attᵀ · dO (column-major: dO' · att'ᵀ) */
        kn_cuda_gemm_batched(k, false, true, hs, T, T, 1.0f, dO, C, hs, A, T, TT, 1.0f, dV, C3,
                             hs, NH);
        long rows = (long)NH * T;
        softmax_causal_backward_kernel<<<warp_rows_blocks(rows), 256, 0, kn_stream(k)>>>(
            S, A, rows, T, scale);
        CUDA_LAUNCHED();
        /* dQ += dpreatt · K (column-major: K' · S') */
        kn_cuda_gemm_batched(k, false, false, hs, T, T, 1.0f, K, C3, hs, S, T, TT, 1.0f, dQ, C3,
                             hs, NH);
        /* dK += dpreattᵀ · Q (column-major: Q' · S'ᵀ) */
        kn_cuda_gemm_batched(k, false, true, hs, T, T, 1.0f, Q, C3, hs, S, T, TT, 1.0f, dK, C3,
                             hs, NH);
    }
}

/* This kernel keeps the probabilities, like the CPU. */
size_t kn_cuda_attention_state_floats(kn_ctx *k, int B, int T, int NH)
{
    (void)k;
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T;
}
