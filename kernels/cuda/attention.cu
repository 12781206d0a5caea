/* Causal multi-head self-attention (kernels/cpu/attention.c), fused: flash
 * attention after FlashAttention-2 (T. Dao, "FlashAttention-2: Faster
 * Attention with Better Parallelism and Work Partitioning", 2023). No T×T
 * matrix reaches global memory: the state kept for backward (att) is one
 * log-sum-exp per row, lse[B, NH, T] (natural log, of the scaled scores).
 *
 * Layout: qkv is [B, T, 3C], q at channel 0, k at C, v at 2C; head h uses
 * channels h·hs .. h·hs+hs−1 of each, and of out [B, T, C]. Scale 1/sqrt(hs);
 * query t sees keys 0..t. In fp32 and tf32 modes everything is fp32, computed
 * on CUDA cores from shared-memory tiles (the kernels below: the reference);
 * in bf16 mode the products run on tensor cores (attention_bf16.cuh).
 * The kernels are compiled for tiles 16, 32, 64 and 128 channels wide; a head
 * size in between (or below 16) runs in the next width up with its extra
 * channels zero.
 *
 * Tiles: 64 queries × 64 keys per step, 256 threads as a 16 × 16 grid; thread
 * (ty, tx) computes the 4 × 4 scores of rows ty + 16i and columns tx + 16j
 * (i, j < 4), and owns output columns tx + 16m of the same rows. With these
 * strided patches and the row strides of FA_LD / FA_LP, the loads of the inner
 * loops (float4 along the summed dimension) are free of bank conflicts. Query
 * and key tiles have the same size and start at multiples of 64, so the
 * diagonal tile is the last one a query tile needs and every real row has at
 * least one unmasked score in each tile it visits.
 *
 *   forward:  one block per (b·h, query tile): online softmax over the key
 *             tiles 0..diagonal (running max m and sum l per row); writes out
 *             and lse = ln(Σ exp(s − m)) + m.
 *   backward: (1) D_i = dO_i · O_i from the forward's out (one warp per
 *             row) into the workspace; (2) one block per (b·h, key tile)
 *             accumulates dK and dV over the query tiles from the diagonal
 *             on; (3) one block per (b·h, query tile) accumulates dQ over
 *             the key tiles up to the diagonal. P = exp(s − lse) is
 *             recomputed in both (in bf16 mode, where the workspace has room,
 *             (2) stores dS and (3) reads it instead: attention_bf16.cuh).
 *             Each gradient element has exactly one owner thread and a fixed
 *             summation order: no atomics, the same bits every run.
 *
 * Scores are kept in base 2 (s·log2 e, then exp2f: one hardware instruction). */
#include <cuda_bf16.h>
#include <math.h>
#include <string.h>

#include "cuda.cuh"

#define FA_TILE 64     /* queries and keys per tile */
#define FA_THREADS 256 /* 16 × 16 */
/* Row strides in shared memory, in floats: D + 4 for the 64 × D tiles of q, k, v,
 * dO, and 68 for the 64 × 64 score tiles. Multiples of 4, so rows are 16-byte
 * aligned for float4 loads along the summed dimension, and 8 consecutive rows
 * start in 8 distinct groups of 4 banks (D + 4 ≡ 4 or 20 mod 32), so the eight
 * lanes of each quarter-warp phase of a float4 load hit distinct banks. */
#define FA_LD(D) ((D) + 4)
#define FA_LP (FA_TILE + 4)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Max and sum over the 16 lanes of a half-warp (the threads sharing ty); all
 * 32 lanes must call it. */
__device__ static inline float half_warp_max(float v)
{
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ static inline float half_warp_sum(float v)
{
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* dst[r][c] (row stride FA_LD(D)) = src[(row0 + r)·ld + c] for r < 64, c < D;
 * rows at or past T and channels at or past hs are zero. Consecutive threads
 * read consecutive channels. */
template <int D>
__device__ static inline void load_tile(float *dst, const float *src, size_t ld, int row0, int T,
                                        int hs)
{
    for (int idx = threadIdx.x; idx < FA_TILE * D; idx += FA_THREADS) {
        int r = idx / D, c = idx % D, t = row0 + r;
        dst[r * FA_LD(D) + c] = t < T && c < hs ? src[(size_t)t * ld + c] : 0.0f;
    }
}

/* 16 bytes of shared memory; p is a multiple of 4 floats from the 16-byte
 * aligned start (all strides and offsets here are). */
__device__ static inline float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

/* s[i][j] = Σ_c A[ra + 16i][c] · Bt[rb + 16j][c] over D channels, tiles of
 * row stride FA_LD(D), four channels per load. In a warp ra takes two values
 * (each broadcast) and rb sixteen. c runs in order, as a scalar loop would. */
template <int D>
__device__ static inline void tile_dot(float s[4][4], const float *A, const float *Bt, int ra,
                                       int rb)
{
    constexpr int LD = FA_LD(D);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < D; c += 4) {
        float4 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = ld4(A + (ra + 16 * i) * LD + c);
#pragma unroll
        for (int j = 0; j < 4; j++) b[j] = ld4(Bt + (rb + 16 * j) * LD + c);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = fmaf(a[i].x, b[j].x, s[i][j]);
                s[i][j] = fmaf(a[i].y, b[j].y, s[i][j]);
                s[i][j] = fmaf(a[i].z, b[j].z, s[i][j]);
                s[i][j] = fmaf(a[i].w, b[j].w, s[i][j]);
            }
    }
}

/* acc[i][m] += Σ_r P[ra + 16i][r] · X[r][cx + 16m] over the 64 rows of X (row
 * stride FA_LD(D)), P a 64 × 64 tile of row stride FA_LP read four columns at a
 * time. */
template <int D>
__device__ static inline void tile_acc(float acc[4][D / 16], const float *P, const float *X,
                                       int ra, int cx)
{
    constexpr int LD = FA_LD(D), M = D / 16;
#pragma unroll 1
    for (int r = 0; r < FA_TILE; r += 4) {
        float4 p4[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p4[i] = ld4(P + (ra + 16 * i) * FA_LP + r);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float x[M];
#pragma unroll
            for (int m = 0; m < M; m++) x[m] = X[(r + u) * LD + cx + 16 * m];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = u == 0 ? p4[i].x : u == 1 ? p4[i].y : u == 2 ? p4[i].z : p4[i].w;
#pragma unroll
                for (int m = 0; m < M; m++) acc[i][m] = fmaf(p, x[m], acc[i][m]);
            }
        }
    }
}

/* ---- forward ------------------------------------------------------------------ */

/* Shared memory: Q, K, V tiles (64 × FA_LD(D) each) and the probabilities P (64 × FA_LP). */
template <int D>
static constexpr size_t fwd_smem()
{
    return (size_t)(3 * FA_TILE * FA_LD(D) + FA_TILE * FA_LP) * sizeof(float);
}

/* Block (bh, query tile): thread (ty, tx) owns query rows ty + 16i, scores
 * S[query ty+16i][key tx+16j], output columns tx + 16m. */
template <int D>
__global__ static void __launch_bounds__(FA_THREADS)
flash_forward_kernel(float *out, float *lse, const float *qkv, int T, int NH, int hs, float sc)
{
    extern __shared__ float4 smem4[]; /* float4: 16-byte aligned */
    float *smem = reinterpret_cast<float *>(smem4);
    constexpr int LD = FA_LD(D), M = D / 16;
    float *Qs = smem, *Ks = Qs + FA_TILE * LD, *Vs = Ks + FA_TILE * LD, *Ps = Vs + FA_TILE * LD;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_tile<D>(Qs, q, C3, q0, T, hs);
    float o[4][M], m[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < M; c++) o[i][c] = 0.0f;
    }
    for (int k0 = 0; k0 <= q0; k0 += FA_TILE) {
        __syncthreads(); /* everyone is done with the previous Ks, Vs, Ps */
        load_tile<D>(Ks, k, C3, k0, T, hs);
        load_tile<D>(Vs, v, C3, k0, T, hs);
        __syncthreads();
        float s[4][4];
        tile_dot<D>(s, Qs, Ks, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = q0 + ty + 16 * i;
            float mt = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = k0 + tx + 16 * j <= row ? s[i][j] * sc : -INFINITY;
                mt = fmaxf(mt, s[i][j]);
            }
            const float mn = fmaxf(m[i], half_warp_max(mt));
            /* a row with nothing unmasked yet keeps m = −inf: subtract 0, not −inf */
            const float base = mn == -INFINITY ? 0.0f : mn;
            const float alpha = exp2f(m[i] - base); /* 0 while m[i] = −inf */
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p = exp2f(s[i][j] - base);
                Ps[(ty + 16 * i) * FA_LP + tx + 16 * j] = p;
                rs += p;
            }
            l[i] = l[i] * alpha + half_warp_sum(rs);
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < M; c++) o[i][c] *= alpha;
        }
        __syncthreads(); /* Ps complete */
        tile_acc<D>(o, Ps, Vs, ty, tx);
    }

    /* Every real row saw key 0 and its maximum contributes exp2(0) = 1, so l ≥ 1. */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = q0 + ty + 16 * i;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        const size_t at = ((size_t)b * T + row) * C + (size_t)h * hs + tx;
        if (row < T) {
#pragma unroll
            for (int c = 0; c < M; c++)
                if (tx + 16 * c < hs) out[at + 16 * c] = o[i][c] * inv;
            if (tx == 0) lse[(size_t)bh * T + row] = (m[i] + log2f(l[i])) * FA_LN2;
        }
    }
}

/* ---- backward: dK and dV ------------------------------------------------------ */

/* Shared memory: K, V, Q, dO tiles (64 × FA_LD(D) each), Pᵀ and dSᵀ (64 × FA_LP each),
 * and the 64 query rows' lse (base 2) and D. */
template <int D>
static constexpr size_t dkv_smem()
{
    return (size_t)(4 * FA_TILE * FA_LD(D) + 2 * FA_TILE * FA_LP + 2 * FA_TILE) * sizeof(float);
}

/* Block (bh, key tile): thread (ty, tx) owns key rows ty + 16i; its scores are
 * transposed, Sᵀ[key ty+16i][query tx+16j]. */
template <int D>
__global__ static void __launch_bounds__(FA_THREADS)
flash_backward_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                          const float *delta, int T, int NH, int hs, float scale, float sc)
{
    extern __shared__ float4 smem4[]; /* float4: 16-byte aligned */
    float *smem = reinterpret_cast<float *>(smem4);
    constexpr int LD = FA_LD(D), M = D / 16;
    float *Ks = smem, *Vs = Ks + FA_TILE * LD, *Qs = Vs + FA_TILE * LD, *dOs = Qs + FA_TILE * LD;
    float *Pt = dOs + FA_TILE * LD, *dSt = Pt + FA_TILE * FA_LP;
    float *lse2 = dSt + FA_TILE * FA_LP, *Ds = lse2 + FA_TILE;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * FA_TILE; /* the first key tiles see the most queries: first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const size_t base = (size_t)b * T * C3 + (size_t)h * hs;
    const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *L = lse + (size_t)bh * T, *Dl = delta + (size_t)bh * T;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_tile<D>(Ks, k, C3, k0, T, hs);
    load_tile<D>(Vs, v, C3, k0, T, hs);
    float dk[4][M], dv[4][M];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < M; c++) dk[i][c] = dv[i][c] = 0.0f;

    /* queries before k0 see none of these keys */
    for (int q0 = k0; q0 < T; q0 += FA_TILE) {
        __syncthreads(); /* everyone is done with the previous Qs, dOs, Pt, dSt, lse2, Ds */
        load_tile<D>(Qs, q, C3, q0, T, hs);
        load_tile<D>(dOs, dO, (size_t)C, q0, T, hs);
        if (threadIdx.x < FA_TILE) {
            int t = q0 + threadIdx.x;
            lse2[threadIdx.x] = t < T ? L[t] * FA_LOG2E : 0.0f;
            Ds[threadIdx.x] = t < T ? Dl[t] : 0.0f;
        }
        __syncthreads();
        float s[4][4], dp[4][4];
        tile_dot<D>(s, Ks, Qs, ty, tx);  /* Sᵀ = K Qᵀ */
        tile_dot<D>(dp, Vs, dOs, ty, tx); /* dPᵀ = V dOᵀ */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = k0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int qi = tx + 16 * j, query = q0 + qi;
                /* a select, not a product: exp2f of a masked score may be inf */
                const float p = key <= query && query < T ? exp2f(s[i][j] * sc - lse2[qi]) : 0.0f;
                Pt[(ty + 16 * i) * FA_LP + qi] = p;
                dSt[(ty + 16 * i) * FA_LP + qi] = p * (dp[i][j] - Ds[qi]);
            }
        }
        __syncthreads(); /* Pt, dSt complete */
        tile_acc<D>(dv, Pt, dOs, ty, tx);  /* dV += Pᵀ dO */
        tile_acc<D>(dk, dSt, Qs, ty, tx);  /* dK += dSᵀ Q (times scale below) */
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = k0 + ty + 16 * i;
        if (key >= T) continue;
        float *dK = dqkv + base + (size_t)key * C3 + C + tx, *dV = dK + C;
#pragma unroll
        for (int c = 0; c < M; c++) {
            if (tx + 16 * c >= hs) continue;
            dK[16 * c] += dk[i][c] * scale;
            dV[16 * c] += dv[i][c];
        }
    }
}

/* ---- backward: dQ --------------------------------------------------------------- */

/* Shared memory: Q, dO, K, V tiles (64 × FA_LD(D) each) and dS (64 × FA_LP). */
template <int D>
static constexpr size_t dq_smem()
{
    return (size_t)(4 * FA_TILE * FA_LD(D) + FA_TILE * FA_LP) * sizeof(float);
}

/* Block (bh, query tile): thread (ty, tx) owns query rows ty + 16i, scores
 * S[query ty+16i][key tx+16j]. */
template <int D>
__global__ static void __launch_bounds__(FA_THREADS)
flash_backward_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                         const float *delta, int T, int NH, int hs, float scale, float sc)
{
    extern __shared__ float4 smem4[]; /* float4: 16-byte aligned */
    float *smem = reinterpret_cast<float *>(smem4);
    constexpr int LD = FA_LD(D), M = D / 16;
    float *Qs = smem, *dOs = Qs + FA_TILE * LD, *Ks = dOs + FA_TILE * LD, *Vs = Ks + FA_TILE * LD;
    float *dS = Vs + FA_TILE * LD;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const size_t base = (size_t)b * T * C3 + (size_t)h * hs;
    const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_tile<D>(Qs, q, C3, q0, T, hs);
    load_tile<D>(dOs, dO, (size_t)C, q0, T, hs);
    float dq[4][M], l2[4], dl[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = q0 + ty + 16 * i;
        l2[i] = row < T ? lse[(size_t)bh * T + row] * FA_LOG2E : 0.0f;
        dl[i] = row < T ? delta[(size_t)bh * T + row] : 0.0f;
#pragma unroll
        for (int c = 0; c < M; c++) dq[i][c] = 0.0f;
    }

    for (int k0 = 0; k0 <= q0; k0 += FA_TILE) {
        __syncthreads(); /* everyone is done with the previous Ks, Vs, dS */
        load_tile<D>(Ks, k, C3, k0, T, hs);
        load_tile<D>(Vs, v, C3, k0, T, hs);
        __syncthreads();
        float s[4][4], dp[4][4];
        tile_dot<D>(s, Qs, Ks, ty, tx);  /* S = Q Kᵀ */
        tile_dot<D>(dp, dOs, Vs, ty, tx); /* dP = dO Vᵀ */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = q0 + ty + 16 * i;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int key = k0 + tx + 16 * j;
                const float p = key <= row && row < T ? exp2f(s[i][j] * sc - l2[i]) : 0.0f;
                dS[(ty + 16 * i) * FA_LP + tx + 16 * j] = p * (dp[i][j] - dl[i]);
            }
        }
        __syncthreads(); /* dS complete */
        tile_acc<D>(dq, dS, Ks, ty, tx); /* dQ += dS K (times scale below) */
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = q0 + ty + 16 * i;
        if (row >= T) continue;
        float *dQ = dqkv + base + (size_t)row * C3 + tx;
#pragma unroll
        for (int c = 0; c < M; c++)
            if (tx + 16 * c < hs) dQ[16 * c] += dq[i][c] * scale;
    }
}

#include "attention_bf16.cuh" /* the bf16 tensor-core kernels */

/* ---- D = rowsum(dO ∘ O) ------------------------------------------------------------ */

/* delta[bh·T + t] = Σ_c dout[b, t, h·hs + c] · out[b, t, h·hs + c]: one warp
 * per (b, h, t), lanes over channels, a fixed shuffle tree (deterministic). */
__global__ static void attention_delta_kernel(float *delta, const float *dout, const float *out,
                                              int B, int T, int NH, int hs)
{
    const size_t g = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (g >= (size_t)B * NH * T) return; /* whole warps: blockDim is a multiple of 32 */
    const int t = (int)(g % T), bh = (int)(g / T), b = bh / NH, h = bh % NH;
    const size_t at = ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
    float s = 0.0f;
    for (int c = lane; c < hs; c += 32) s += dout[at + c] * out[at + c];
    s = warp_sum(s);
    if (lane == 0) delta[g] = s;
}

/* ---- host side ------------------------------------------------------------------ */

/* The tile width for head size hs = C / NH: the kernels are compiled for 16, 32,
 * 64 and 128 channels; a smaller head runs in the next one up, its channels
 * past hs zero (they add nothing to q·k, and the outputs there are not
 * stored). Aborts, naming the head size, where there is none. */
static int tile_width(const char *what, int T, int C, int NH)
{
    const int hs = NH > 0 && C % NH == 0 ? C / NH : 0;
    if (hs <= 0 || hs > 128) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "head size %d (C = %d, NH = %d): the flash attention kernels support head "
                 "sizes 1 to 128 (fastest 16, 32, 64, 128)",
                 hs, C, NH);
        kn_cuda_fail(what, msg, __FILE__, __LINE__);
    }
    if ((T + FA_TILE - 1) / FA_TILE > 65535) {
        char msg[96];
        snprintf(msg, sizeof msg, "T = %d: more than 65535 tiles of %d", T, FA_TILE);
        kn_cuda_fail(what, msg, __FILE__, __LINE__);
    }
    return hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : 128;
}

/* scale·log2 e, the factor from q·k to base-2 scores: the same float in forward and backward. */
static float log2_scale(int hs) { return (1.0f / sqrtf((float)hs)) * FA_LOG2E; }

/* Kernels using over 48 KiB of dynamic shared memory must say so first. */
template <typename F>
static void allow_smem(F *kernel, size_t bytes)
{
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* Whether pairs of a head's channels (hs values of `size` bytes at offset h·hs,
 * row stride a multiple of C) allow aligned stores of two values: the bf16
 * kernels' stores into p (NULL: nothing stored there, no constraint). */
static int pair_rows(const void *p, size_t size, int hs)
{
    return hs % 2 == 0 && (uintptr_t)p % (2 * size) == 0;
}

/* The bf16 kernels' packed q, k, v in the forward's state: after the lse
 * [B, NH, T], at the next 16-byte boundary (room unused where they read qkv's
 * bf16 copy in place: tc_direct). */
static bf16 *packed_qkv(const float *att, int B, int T, int NH)
{
    const uintptr_t p = (uintptr_t)(att + (size_t)B * NH * T);
    return (bf16 *)((p + 15) & ~(uintptr_t)15);
}

/* Elements of the packed q, k, v (or, / 3, of the packed dO) at tile width D. */
static size_t packed_elems(int B, int T, int NH, int D)
{
    return (size_t)B * NH * 3 * tc_padded_rows(T) * D;
}

/* Launches a bf16 kernel with its dynamic shared memory. */
template <typename F, typename... A>
static void launch_tc(F *kernel, dim3 grid, size_t smem, kn_ctx *k, A... args)
{
    allow_smem(kernel, smem);
    kernel<<<grid, TC_THREADS, smem, kn_stream(k)>>>(args...);
    CUDA_LAUNCHED();
}

/* out and lse (or, for out, only its bf16 copy, out_lp, where given): bf16 tensor
 * cores in bf16 mode, fp32 otherwise (out_lp is NULL there: kn_lowp_bytes is 0).
 * The bf16 kernels read q, k, v from qkv_lp in place where tc_direct allows,
 * else from the packed copy the pack kernel writes first. */
template <int D>
static void forward_tiles(kn_ctx *k, float *out, bf16 *out_lp, float *lse, const float *qkv,
                          const bf16 *qkv_lp, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const float sc = log2_scale(hs);
    if (k->cuda->bf16) {
        bf16 *pk = packed_qkv(lse, B, T, NH);
        const tc_operand ops = tc_operand_of<D>(qkv_lp, pk, T, C, NH, 3);
        if (qkv_lp && !tc_direct<D>(qkv_lp, T, hs) && tc_direct_sizes<D>(T, hs))
            kn_cuda_fail("kn_attention_forward", /* its state may have no packing room */
                         "qkv_lp is not 16-byte aligned", __FILE__, __LINE__);
        if (!tc_direct<D>(qkv_lp, T, hs)) { /* else read in place: nothing to pack */
            const unsigned blocks = kn_blocks(packed_elems(B, T, NH, D) / 8, TC_THREADS);
            if (qkv_lp) /* qkv's bf16 copy, which its matmul wrote in place of qkv */
                attention_pack_qkv_kernel<D><<<blocks, TC_THREADS, 0, kn_stream(k)>>>(
                    pk, qkv_lp, B, T, NH, hs);
            else
                attention_pack_qkv_kernel<D><<<blocks, TC_THREADS, 0, kn_stream(k)>>>(pk, qkv, B,
                                                                                     T, NH, hs);
            CUDA_LAUNCHED();
        }
        const dim3 grid((unsigned)(B * NH), (unsigned)(tc_padded_rows(T) / TC_ROWS));
        /* pairs for the one the kernel stores into */
        const int v2 = out_lp ? pair_rows(out_lp, sizeof *out_lp, hs)
                              : pair_rows(out, sizeof *out, hs);
        launch_tc(flash_forward_bf16_kernel<D>, grid, tc_smem_bytes<D>(false), k, out, out_lp,
                  lse, ops, T, NH, hs, sc, v2);
        return;
    }
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + FA_TILE - 1) / FA_TILE));
    const size_t sm = fwd_smem<D>();
    allow_smem(flash_forward_kernel<D>, sm);
    flash_forward_kernel<D><<<grid, FA_THREADS, sm, kn_stream(k)>>>(out, lse, qkv, T, NH, hs, sc);
    CUDA_LAUNCHED();
}

/* Whether the workspace can grow to `bytes`. kn_cuda_workspace aborts where
 * the device is out of memory, so a larger one is first taken from the
 * arena and given back (it stays there, free, for kn_cuda_workspace). */
static bool workspace_fits(kn_ctx *k, size_t bytes)
{
    if (k->ws && bytes <= k->ws_bytes) return true;
    void *p = kn_cuda_arena_alloc(k, bytes, 0);
    kn_cuda_arena_free(k, p);
    return p != NULL;
}

/* delta = rowsum(dout ∘ out) and the packed dO (pdo NULL: not stored), dout and out
 * read from their bf16 copies (dout_lp, out_lp) where given. */
template <int D>
static void delta_pack(kn_ctx *k, float *delta, bf16 *pdo, const float *dout, const bf16 *dout_lp,
                       const float *out, const bf16 *out_lp, int B, int T, int NH, int hs)
{
    const size_t warps = (size_t)B * NH * tc_padded_rows(T);
    const unsigned blocks = kn_blocks(warps * 32, TC_THREADS);
    cudaStream_t s = kn_stream(k);
    if (dout_lp && out_lp)
        attention_delta_pack_kernel<D><<<blocks, TC_THREADS, 0, s>>>(delta, pdo, dout_lp, out_lp,
                                                                     B, T, NH, hs);
    else if (dout_lp)
        attention_delta_pack_kernel<D><<<blocks, TC_THREADS, 0, s>>>(delta, pdo, dout_lp, out, B,
                                                                     T, NH, hs);
    else if (out_lp)
        attention_delta_pack_kernel<D><<<blocks, TC_THREADS, 0, s>>>(delta, pdo, dout, out_lp, B,
                                                                     T, NH, hs);
    else
        attention_delta_pack_kernel<D><<<blocks, TC_THREADS, 0, s>>>(delta, pdo, dout, out, B, T,
                                                                     NH, hs);
    CUDA_LAUNCHED();
}

/* dqkv (or only its bf16 copy, dqkv_lp, where given: bf16 mode alone has one);
 * dout_lp, out_lp: dout's and out's bf16 copies, read instead where given. The bf16
 * kernels read q, k, v where the forward's did (qkv_lp in place, or the packed copy
 * in the state: tc_operand_of decides the same from the same arguments), and dO
 * from dout_lp in place where tc_direct allows, else packed by the delta pass. */
template <int D>
static void backward_tiles(kn_ctx *k, float *dqkv, bf16 *dqkv_lp, const float *dout,
                           const bf16 *dout_lp, const float *qkv, const bf16 *qkv_lp,
                           const float *lse, const float *out, const bf16 *out_lp, int B, int T,
                           int C, int NH)
{
    const int hs = C / NH;
    const size_t rows = (size_t)B * NH * T;
    const float scale = 1.0f / sqrtf((float)hs), sc = log2_scale(hs);
    if (k->cuda->bf16) {
        /* the workspace: delta, then (16-byte aligned) the packed dO unless dout_lp
         * is read in place, then (256-byte aligned) dS where there is room for it
         * (~201 MB for GPT-2 124M at B = 16, T = 1024; reused by every layer) */
        const bool do_direct = tc_direct<D>(dout_lp, T, hs);
        const size_t dbytes = (rows * sizeof(float) + 15) / 16 * 16;
        const size_t pbytes =
            dbytes + (do_direct ? 0 : packed_elems(B, T, NH, D) / 3 * sizeof(bf16));
        const size_t sbytes = (pbytes + 255) / 256 * 256;
        const size_t all = sbytes + (size_t)B * NH * tc_ds_chunks(T) * TC_CHUNK * sizeof(bf16);
        const bool keep_ds = tc_keeps_ds<D>() && workspace_fits(k, all);
        char *ws = (char *)kn_cuda_workspace(k, keep_ds ? all : pbytes);
        float *delta = (float *)ws;
        bf16 *pdo = do_direct ? NULL : (bf16 *)(ws + dbytes);
        bf16 *ds = keep_ds ? (bf16 *)(ws + sbytes) : NULL;
        delta_pack<D>(k, delta, pdo, dout, dout_lp, out, out_lp, B, T, NH, hs);
        const tc_operand ops = tc_operand_of<D>(qkv_lp, packed_qkv(lse, B, T, NH), T, C, NH, 3);
        const tc_operand dops = tc_operand_of<D>(dout_lp, pdo, T, C, NH, 1);
        const dim3 grid((unsigned)(B * NH), (unsigned)(tc_padded_rows(T) / TC_ROWS));
        /* pairs for the one the kernels store into */
        const int v2 = dqkv_lp ? pair_rows(dqkv_lp, sizeof *dqkv_lp, hs)
                               : pair_rows(dqkv, sizeof *dqkv, hs);
        launch_tc(flash_backward_dkv_bf16_kernel<D>, grid, tc_smem_bytes<D>(true), k, dqkv,
                  dqkv_lp, ds, ops, dops, lse, (const float *)delta, T, NH, hs, scale, sc, v2);
        if constexpr (tc_keeps_ds<D>()) {
            if (ds) {
                launch_tc(flash_backward_dq_ds_bf16_kernel<D>, grid, tc_dq_ds_smem_bytes<D>(), k,
                          dqkv, dqkv_lp, (const bf16 *)ds, ops, T, NH, hs, scale, v2);
                return;
            }
        }
        launch_tc(flash_backward_dq_bf16_kernel<D>, grid, tc_smem_bytes<D>(false), k, dqkv,
                  dqkv_lp, ops, dops, lse, (const float *)delta, T, NH, hs, scale, sc, v2);
        return;
    }
    /* the fp32 kernels accumulate into dqkv: zero first (kernels.h: overwritten) */
    CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * T * 3 * C * sizeof(float), kn_stream(k)));
    float *delta = (float *)kn_cuda_workspace(k, rows * sizeof(float));
    attention_delta_kernel<<<kn_blocks(rows * 32, 256), 256, 0, kn_stream(k)>>>(delta, dout, out,
                                                                               B, T, NH, hs);
    CUDA_LAUNCHED();
    const dim3 grid((unsigned)(B * NH), (unsigned)((T + FA_TILE - 1) / FA_TILE));
    allow_smem(flash_backward_dkv_kernel<D>, dkv_smem<D>());
    flash_backward_dkv_kernel<D><<<grid, FA_THREADS, dkv_smem<D>(), kn_stream(k)>>>(
        dqkv, dout, qkv, lse, delta, T, NH, hs, scale, sc);
    CUDA_LAUNCHED();
    allow_smem(flash_backward_dq_kernel<D>, dq_smem<D>());
    flash_backward_dq_kernel<D><<<grid, FA_THREADS, dq_smem<D>(), kn_stream(k)>>>(
        dqkv, dout, qkv, lse, delta, T, NH, hs, scale, sc);
    CUDA_LAUNCHED();
}

void kn_cuda_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                               const void *qkv_lp, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    bf16 *lp = (bf16 *)out_lp;
    const bf16 *qlp = (const bf16 *)qkv_lp;
    switch (tile_width("kn_attention_forward", T, C, NH)) {
    case 16: forward_tiles<16>(k, out, lp, att, qkv, qlp, B, T, C, NH); break;
    case 32: forward_tiles<32>(k, out, lp, att, qkv, qlp, B, T, C, NH); break;
    case 64: forward_tiles<64>(k, out, lp, att, qkv, qlp, B, T, C, NH); break;
    default: forward_tiles<128>(k, out, lp, att, qkv, qlp, B, T, C, NH); break;
    }
}

void kn_cuda_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                                const void *dout_lp, const float *qkv, const void *qkv_lp,
                                const float *att, const float *out, const void *out_lp, int B,
                                int T, int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    bf16 *lp = (bf16 *)dqkv_lp;
    const bf16 *dl = (const bf16 *)dout_lp, *ol = (const bf16 *)out_lp;
    const bf16 *ql = (const bf16 *)qkv_lp;
    switch (tile_width("kn_attention_backward", T, C, NH)) {
    case 16: backward_tiles<16>(k, dqkv, lp, dout, dl, qkv, ql, att, out, ol, B, T, C, NH); break;
    case 32: backward_tiles<32>(k, dqkv, lp, dout, dl, qkv, ql, att, out, ol, B, T, C, NH); break;
    case 64: backward_tiles<64>(k, dqkv, lp, dout, dl, qkv, ql, att, out, ol, B, T, C, NH); break;
    default: backward_tiles<128>(k, dqkv, lp, dout, dl, qkv, ql, att, out, ol, B, T, C, NH); break;
    }
}

/* Whether the bf16 kernels read an aligned copy of qkv in place at these sizes. */
static bool direct_sizes(int D, int T, int hs)
{
    switch (D) {
    case 16: return tc_direct_sizes<16>(T, hs);
    case 32: return tc_direct_sizes<32>(T, hs);
    case 64: return tc_direct_sizes<64>(T, hs);
    default: return tc_direct_sizes<128>(T, hs);
    }
}

/* att is the log-sum-exp of each row's scaled scores, [B, NH, T]; in bf16 mode
 * followed (16-byte aligned) by the packed bf16 q, k, v of the forward's qkv,
 * unless every call gives qkv_lp and the kernels read it in place (GPT-2 124M
 * at B 16, T 1024: 906 MB of 12 layers' activations). */
size_t kn_cuda_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp)
{
    const size_t lse = (size_t)B * (size_t)NH * (size_t)T;
    if (!k->cuda->bf16 || B <= 0 || T <= 0) return lse;
    const int D = tile_width("kn_attention_state_floats", T, C, NH);
    if (qkv_lp && direct_sizes(D, T, C / NH)) return lse;
    return lse + 4 + (packed_elems(B, T, NH, D) + 1) / 2; /* 4: the alignment */
}
