/* Softmax over the first V of Vp logits and cross-entropy (kernels/cpu/
 * crossentropy.c). Forward: one block per row. Backward: elementwise. The
 * training path (kn_crossentropy_forward / _backward) is at the end. */
#include <math.h>

#include "cuda.cuh"

#define CE_THREADS 256

/* Block-wide reduction through shared memory; every thread gets the result. */
template <bool MAX>
__device__ static float block_reduce(float v, float *shared)
{
    v = MAX ? warp_max(v) : warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    __syncthreads(); /* shared may still be read from the previous reduction */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(v) : warp_sum(v);
}

/* probs may alias logits: the target's logit is read before the first
 * barrier, and every other element is read and written by the same thread. */
__global__ static void softmax_ce_kernel(float *losses, float *probs, const float *logits,
                                         const int32_t *targets, int V, int Vp)
{
    __shared__ float shared[CE_THREADS / 32];
    const float *l = logits + (size_t)blockIdx.x * Vp;
    float *p = probs + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    float target_logit = target >= 0 && target < V ? l[target] : 0.0f;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, l[i]);
    maxval = block_reduce<true>(maxval, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(l[i] - maxval);
        p[i] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared);
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] *= inv;
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) p[i] = 0.0f;
    if (threadIdx.x == 0) /* −log p[target] without log(0) when p[target] underflows */
        losses[blockIdx.x] = target < 0 ? 0.0f : target >= V ? NAN
                                                              : logf(sum) - (target_logit - maxval);
}

void kn_cuda_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs,
                                          const float *logits, const int32_t *targets, int BT,
                                          int V, int Vp)
{
    if (BT <= 0) return;
    softmax_ce_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(losses, probs, logits, targets, V, Vp);
    CUDA_LAUNCHED();
}

/* dlogits may alias probs: each element depends only on itself. */
__global__ static void ce_backward_kernel(float *dlogits, const float *probs,
                                          const int32_t *targets, float scale, int V, int Vp,
                                          size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int target = targets[i / Vp], c = (int)(i % Vp);
        float d = 0.0f;
        if (target >= 0 && c < V) d = (c == target ? probs[i] - 1.0f : probs[i]) * scale;
        dlogits[i] = d;
    }
}

void kn_cuda_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                           const int32_t *targets, float dloss_scale, int BT,
                                           int V, int Vp)
{
    size_t n = (size_t)(BT > 0 ? BT : 0) * Vp;
    if (!n) return;
    ce_backward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dlogits, probs, targets,
                                                                   dloss_scale, V, Vp, n);
    CUDA_LAUNCHED();
}

/* ---- the loss and gradient from per-row statistics ---------------------------
 * The training path (kernels.h: kn_crossentropy_forward / _backward): the
 * [B·T, Vp] fp32 logits (3.3 GB for GPT-2 at B·T = 16384) are read once by the
 * forward and read and written once by the backward, where the pair above reads
 * them five times and writes them three. Following llm.c's fused_classifier
 * (online max and sum in one pass, float4 loads), split at the forward/backward
 * boundary: the loss weight (dloss_scale) is only known at backward. */

/* Running (max m, Σ e^(x − m)) of a thread's elements: one expf per element
 * (the sum is rescaled only when the max grows). −inf elements add nothing
 * (and would make −inf − −inf = NaN while m is still −inf); NaN propagates
 * through the sum. */
__device__ static inline void online_add(float &m, float &s, float x)
{
    if (x > m) {
        s = s * expf(m - x) + 1.0f; /* m = −inf at first: 0 · 0 + 1 */
        m = x;
    } else if (x != -INFINITY) {
        s += expf(x - m);
    }
}

/* Merges (m2, s2) into (m, s); an empty side (m = −inf, s = 0) adds nothing. */
__device__ static inline void online_merge(float &m, float &s, float m2, float s2)
{
    const float mx = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.0f : s * expf(m - mx);
    const float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx);
    m = mx;
    s = a + b;
}

/* Reduces the block's (m, s) (of up to 1024 threads): every thread gets the
 * row's, merged in the same order (warps by shuffles, then warp 0's total with
 * the others in order). */
__device__ static void block_stats(float &m, float &s)
{
    __shared__ float sm[32], ss[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads();
    m = sm[0], s = ss[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) online_merge(m, s, sm[w], ss[w]);
}

/* Thread 0 writes the row's stats and loss, −log p[target] without log(0) when
 * p[target] underflows, from the target's logit tl (read while it was there). */
__device__ static void write_stats(float m, float s, float tl, float *losses, float *stats,
                                   int target, int V)
{
    if (threadIdx.x != 0) return;
    stats[2 * (size_t)blockIdx.x] = m;
    stats[2 * (size_t)blockIdx.x + 1] = s;
    losses[blockIdx.x] = target < 0 ? 0.0f : target >= V ? NAN : logf(s) - (tl - m);
}

/* The reduction and the stats; target_logit is read by thread 0 only (through
 * the pointer). */
template <typename T>
__device__ static void finish_stats(float m, float s, float *losses, float *stats, const T *l,
                                    const int32_t *targets, int V)
{
    block_stats(m, s);
    const int target = targets[blockIdx.x];
    const bool in = threadIdx.x == 0 && target >= 0 && target < V;
    write_stats(m, s, in ? (float)l[target] : 0.0f, losses, stats, target, V);
}

/* One block per row: (max, sum) of logits[0..V) and the loss. vec: the row
 * start is 16-byte aligned and Vp % 4 == 0, so float4 loads may run up to the
 * next multiple of 4 past V (still < Vp); the lanes at or past V are skipped. */
__global__ static void __launch_bounds__(CE_THREADS)
ce_stats_kernel(float *losses, float *stats, const float *logits, const int32_t *targets, int V,
                int Vp, int vec)
{
    const float *l = logits + (size_t)blockIdx.x * Vp;
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        const float4 *l4 = reinterpret_cast<const float4 *>(l);
        for (int i = threadIdx.x; 4 * i < V; i += blockDim.x) {
            const float4 x = l4[i];
            online_add(m, s, x.x);
            if (4 * i + 1 < V) online_add(m, s, x.y);
            if (4 * i + 2 < V) online_add(m, s, x.z);
            if (4 * i + 3 < V) online_add(m, s, x.w);
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) online_add(m, s, l[i]);
    }
    finish_stats(m, s, losses, stats, l, targets, V);
}

/* 8 bf16 from 16 bytes, in order (little-endian: the lower half is the earlier). */
__device__ static inline void bf16x8(uint4 u, float x[8])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* ce_stats_kernel on bf16 logits over the first half of each row (row r at
 * bf16 2·Vp·r; Vp % 8 == 0, rows 16-byte aligned): 8 logits a load. */
__global__ static void __launch_bounds__(CE_THREADS)
ce_stats_bf16_kernel(float *losses, float *stats, const float *logits, const int32_t *targets,
                     int V, int Vp)
{
    const float *row = logits + (size_t)blockIdx.x * Vp;
    const __nv_bfloat16 *l = reinterpret_cast<const __nv_bfloat16 *>(row);
    float m = -INFINITY, s = 0.0f;
    for (int c = 8 * (int)threadIdx.x; c < V; c += 8 * (int)blockDim.x) {
        float x[8];
        bf16x8(*reinterpret_cast<const uint4 *>(l + c), x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (c + i < V) online_add(m, s, x[i]);
    }
    finish_stats(m, s, losses, stats, l, targets, V);
}

bool kn_cuda_logits_bf16(kn_ctx *k, const float *logits, int Vp)
{
    return k->cuda->bf16 && Vp % 8 == 0 && ((uintptr_t)logits & 15) == 0;
}

void kn_cuda_crossentropy_forward_bf16(kn_ctx *k, float *losses, float *stats,
                                       const float *logits, const int32_t *targets, int BT, int V,
                                       int Vp)
{
    if (BT <= 0) return;
    ce_stats_bf16_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(losses, stats, logits, targets, V,
                                                             Vp);
    CUDA_LAUNCHED();
}

void kn_cuda_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                                  const int32_t *targets, int BT, int V, int Vp)
{
    if (BT <= 0) return;
    const int vec = Vp % 4 == 0 && ((uintptr_t)logits & 15) == 0;
    ce_stats_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(losses, stats, logits, targets, V, Vp,
                                                        vec);
    CUDA_LAUNCHED();
}

/* dlogits at column c of a row, from its logit x: (p − [c = target]) · scale
 * with p = e^(x − max) · (1/sum) as the CPU rounds it; 0 at c ≥ V. */
__device__ static inline float ce_grad(float x, int c, int target, int V, float mx, float inv,
                                       float scale)
{
    if (c >= V) return 0.0f;
    const float p = expf(x - mx) * inv;
    return (c == target ? p - 1.0f : p) * scale;
}

/* One block per row; dlogits may alias logits (each element is read, then
 * written, by the same thread). Masked rows (target < 0) are written as zeros
 * without reading the logits. */
__global__ static void __launch_bounds__(CE_THREADS)
ce_backward_stats_kernel(float *dlogits, const float *logits, const float *stats,
                         const int32_t *targets, float scale, int V, int Vp, int vec)
{
    const size_t row = (size_t)blockIdx.x * Vp;
    const float *l = logits + row;
    float *d = dlogits + row;
    const int target = targets[blockIdx.x];
    const float mx = stats[2 * (size_t)blockIdx.x], inv = 1.0f / stats[2 * (size_t)blockIdx.x + 1];
    if (vec) {
        const float4 *l4 = reinterpret_cast<const float4 *>(l);
        float4 *d4 = reinterpret_cast<float4 *>(d);
        for (int i = threadIdx.x; i < Vp / 4; i += blockDim.x) {
            if (target < 0) {
                d4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                continue;
            }
            const float4 x = l4[i];
            const int c = 4 * i;
            d4[i] = make_float4(ce_grad(x.x, c, target, V, mx, inv, scale),
                                ce_grad(x.y, c + 1, target, V, mx, inv, scale),
                                ce_grad(x.z, c + 2, target, V, mx, inv, scale),
                                ce_grad(x.w, c + 3, target, V, mx, inv, scale));
        }
    } else {
        for (int c = threadIdx.x; c < Vp; c += blockDim.x)
            d[c] = target < 0 ? 0.0f : ce_grad(l[c], c, target, V, mx, inv, scale);
    }
}

void kn_cuda_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits,
                                   const float *stats, const int32_t *targets, float dloss_scale,
                                   int BT, int V, int Vp)
{
    if (BT <= 0) return;
    const int vec = Vp % 4 == 0 && ((uintptr_t)logits & 15) == 0 && ((uintptr_t)dlogits & 15) == 0;
    ce_backward_stats_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(dlogits, logits, stats, targets,
                                                                 dloss_scale, V, Vp, vec);
    CUDA_LAUNCHED();
}

/* The same gradient as bf16 for the LM head's matmul (kn_lm_head_backward),
 * from the bf16 logits kn_lm_head_forward left over the first half of each
 * row, written over them in place: each thread reads 8 logits and writes their
 * 8 gradients to the same 16 bytes. Vp % 8 == 0, rows 16-byte aligned. */
__global__ static void __launch_bounds__(CE_THREADS)
ce_backward_bf16_kernel(float *logits, const float *stats, const int32_t *targets, float scale,
                        int V, int Vp)
{
    __nv_bfloat16 *d = reinterpret_cast<__nv_bfloat16 *>(logits + (size_t)blockIdx.x * Vp);
    const int target = targets[blockIdx.x];
    const float mx = stats[2 * (size_t)blockIdx.x], inv = 1.0f / stats[2 * (size_t)blockIdx.x + 1];
    for (int c = 8 * (int)threadIdx.x; c < Vp; c += 8 * (int)blockDim.x) {
        float g[8] = {};
        if (target >= 0) {
            float x[8];
            bf16x8(*reinterpret_cast<const uint4 *>(d + c), x);
#pragma unroll
            for (int i = 0; i < 8; i++) g[i] = ce_grad(x[i], c + i, target, V, mx, inv, scale);
        }
        uint4 u;
        u.x = bf16_pair(g[0], g[1]);
        u.y = bf16_pair(g[2], g[3]);
        u.z = bf16_pair(g[4], g[5]);
        u.w = bf16_pair(g[6], g[7]);
        *reinterpret_cast<uint4 *>(d + c) = u;
    }
}

void kn_cuda_crossentropy_backward_bf16(kn_ctx *k, float *logits, const float *stats,
                                        const int32_t *targets, float dloss_scale, int BT, int V,
                                        int Vp)
{
    if (BT <= 0) return;
    ce_backward_bf16_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(logits, stats, targets,
                                                                dloss_scale, V, Vp);
    CUDA_LAUNCHED();
}

/* ---- the LM head's loss and unscaled gradient in one pass (bf16 mode) ----------
 * kn_lm_head_forward on the bf16 logits: one block per row keeps the row in
 * shared memory as it reads it for the max, then sums the exponentials and
 * writes the gradient in place from there, softmax − onehot without the loss
 * weight, which kn_lm_head_backward applies as its GEMMs' alpha: one read and
 * one write of the logits where the stats-then-gradient pair above reads them
 * twice. Two blocks an SM (a row of GPT-2's 50304 is 98 KiB), so one block's
 * loads overlap the other's exps.
 *
 * The max comes first, on its own (one fmaxf a logit), so each logit's
 * exponential is one FFMA and one MUFU.EX2 on the scores in base 2: the
 * online (max, sum) of the two-pass kernels takes a branch and an expf (a
 * range reduction around the EX2) a logit, and bounded this pass by its
 * arithmetic, not by memory. */
#define CE_ROW_THREADS 512
#define CE_ROW_MAX_VP 57344 /* 112 KiB of row: two blocks fit an SM's 228 KiB */
#define CE_ROW_UNROLL 4     /* 16-byte loads in flight a thread */
#define CE_LOG2E 1.4426950408889634f

bool kn_cuda_logits_dlogits(kn_ctx *k, const float *logits, int Vp)
{
    return kn_cuda_logits_bf16(k, logits, Vp) && Vp <= CE_ROW_MAX_VP;
}

/* 2^x, the hardware's approximation (relative error about 2⁻²², far below
 * bf16's; subnormal results flush to 0, e^−87 and below, which a probability
 * next to the row's max of 1 does not miss). */
__device__ static inline float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* e^(x − m) as 2^(x·log2 e − mb), mb = m·log2 e: one FFMA and one EX2. */
__device__ static inline float ce_exp(float x, float mb) { return ex2(fmaf(x, CE_LOG2E, -mb)); }

/* The row's chunks (16 bytes, 8 logits) from global into shared memory, this
 * thread's chunks j = threadIdx.x + k·blockDim.x (each read back by this thread
 * alone), CE_ROW_UNROLL loads in flight; returns the max of its logits below V. */
__device__ static float ce_row_load(uint4 *srow, const uint4 *l, int chunks, int V)
{
    const int step = (int)blockDim.x;
    float m = -INFINITY;
    for (int j0 = threadIdx.x; j0 < chunks; j0 += CE_ROW_UNROLL * step) {
        uint4 u[CE_ROW_UNROLL];
#pragma unroll
        for (int r = 0; r < CE_ROW_UNROLL; r++)
            if (j0 + r * step < chunks) u[r] = l[j0 + r * step];
#pragma unroll
        for (int r = 0; r < CE_ROW_UNROLL; r++) {
            const int j = j0 + r * step, c = 8 * j;
            if (j >= chunks) break;
            srow[j] = u[r];
            float x[8];
            bf16x8(u[r], x);
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (c + i < V) m = fmaxf(m, x[i]);
        }
    }
    return m;
}

/* Σ e^(x − m) over this thread's chunks of the row in shared memory (logits
 * below V; ce_exp, mb = m·log2 e). NaN logits make it NaN (fmaxf skipped them
 * for the max). */
__device__ static float ce_row_sum(const uint4 *srow, int chunks, int V, float mb)
{
    float s = 0.0f;
    for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
        const int c = 8 * j;
        float x[8];
        bf16x8(srow[j], x);
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (c + i < V) s += ce_exp(x[i], mb);
    }
    return s;
}

__global__ static void __launch_bounds__(CE_ROW_THREADS, 2)
ce_row_bf16_kernel(float *losses, float *stats, float *logits, const int32_t *targets, int V,
                   int Vp)
{
    extern __shared__ uint4 srow[]; /* the row's Vp / 8 chunks of 8 bf16 */
    __shared__ float red[CE_ROW_THREADS / 32];
    uint4 *l = reinterpret_cast<uint4 *>(logits + (size_t)blockIdx.x * Vp);
    const int target = targets[blockIdx.x], chunks = Vp / 8;
    const float tl = threadIdx.x == 0 && target >= 0 && target < V
                         ? (float)reinterpret_cast<const __nv_bfloat16 *>(l)[target]
                         : 0.0f;
    /* its barriers: every read of the row (tl too) is done before the writes below */
    const float m = block_reduce<true>(ce_row_load(srow, l, chunks, V), red);
    const float mb = m == -INFINITY ? 0.0f : m * CE_LOG2E; /* a row of −inf: sum 0 */
    const float s = block_reduce<false>(ce_row_sum(srow, chunks, V, mb), red);
    write_stats(m, s, tl, losses, stats, target, V);
    const float inv = 1.0f / s;
    for (int j = threadIdx.x; j < chunks; j += blockDim.x) {
        const int c = 8 * j;
        float x[8], g[8] = {};
        bf16x8(srow[j], x);
        if (target >= 0)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float p = c + i < V ? ce_exp(x[i], mb) * inv : 0.0f;
                g[i] = c + i == target ? p - 1.0f : p;
            }
        l[j] = make_uint4(bf16_pair(g[0], g[1]), bf16_pair(g[2], g[3]), bf16_pair(g[4], g[5]),
                          bf16_pair(g[6], g[7]));
    }
}

void kn_cuda_crossentropy_row_bf16(kn_ctx *k, float *losses, float *stats, float *logits,
                                   const int32_t *targets, int BT, int V, int Vp)
{
    if (BT <= 0) return;
    const size_t smem = (size_t)Vp * sizeof(__nv_bfloat16);
    CUDA_CHECK(cudaFuncSetAttribute(ce_row_bf16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    ce_row_bf16_kernel<<<BT, CE_ROW_THREADS, smem, kn_stream(k)>>>(losses, stats, logits, targets,
                                                                  V, Vp);
    CUDA_LAUNCHED();
}
