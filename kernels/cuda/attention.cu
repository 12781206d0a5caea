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
 * in bf16 mode the products run on tensor cores ("bf16 tensor cores" below).
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
 *             recomputed in both. Each gradient element has exactly one owner
 *             thread and a fixed summation order: no atomics, the same bits
 *             every run.
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

/* ---- bf16 tensor cores ------------------------------------------------------------
 *
 * In bf16 mode (kn_precision, the CUDA default) the products run on the tensor
 * cores as mma.sync.m16n8k16 (bf16 operands, fp32 accumulators) with S, P, dP,
 * dS and the accumulators O, dQ, dK, dV in registers, following
 * FlashAttention-2 (Dao, 2023, Algorithms 1 and 2) in the register layout
 * FlashAttention-2's CUDA code uses: each warp owns 16 rows of the block's own
 * tile (query rows in forward and dQ, key rows in dK/dV), so its row
 * statistics never leave the warp, and the accumulator fragment of S (C layout)
 * is, packed to bf16 pairs, the A fragment of P for the next product. As
 * before, q, k, v and dO are rounded to bf16 where they are loaded, P and dS
 * just before their products; sums, the online softmax, lse, D and the final
 * scaling are fp32. Error: about 2⁻⁹ relative per rounded operand.
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", bf16): lane l has
 * g = l / 4 and t = l % 4; A (16 × 16, row) is 4 registers of 2 bf16 each,
 * rows g, g+8, g, g+8 and columns 2t..2t+1, 2t..2t+1, 2t+8..2t+9, 2t+8..2t+9;
 * B (16 × 8, col) 2 registers, rows (the summed index) 2t..2t+1 and
 * 2t+8..2t+9 of column g; C/D (16 × 8 fp32) 4 floats, (g, 2t), (g, 2t+1),
 * (g+8, 2t), (g+8, 2t+1). Fragments come from shared memory through
 * ldmatrix.x4 (four 8 × 8 matrices, lanes 8i..8i+7 address the rows of matrix
 * i; without .trans lane l receives row l/4, columns 2(l%4)..+1 of each, with
 * .trans column l/4, rows 2(l%4)..+1). frag_a, frag_b_nk and frag_b_kn below
 * name the matrices each register gets. The index math was checked on the CPU
 * against these definitions (an emulation of ldmatrix and mma by their
 * documented semantics, and of the kernels' loops on small shapes).
 *
 * Tiles: forward and dQ: 128 queries per block (8 warps × 16 rows), key
 * tiles of 64 (32 at D = 128, for registers); dK/dV: 128 keys per block (8
 * warps × 16 keys), query tiles of 64 (32 at D = 128). The streamed tile (K
 * and V, or Q and dO) is read as fp32 into registers one tile ahead (the
 * loads are in flight while the tensor cores work on the current tile),
 * converted and stored to shared memory as bf16 between two barriers. Within
 * a tile a warp works in chunks of 16 keys (or queries): a chunk entirely
 * above the diagonal is skipped, a chunk crossing it (or past T) is masked
 * element by element. Backward needs no reduction along the chunk, so it
 * keeps only one chunk of S and dP (16 × 16) in registers at a time.
 *
 * Every gradient element has one owner thread, accumulated in a fixed order
 * (no atomics): the same bits every run. */

typedef __nv_bfloat16 bf16;

#define TC_THREADS 256 /* 8 warps */
#define TC_ROWS 128    /* the block's own rows: queries (forward, dQ) or keys (dK/dV) */

/* Rows of the streamed tile: 64, or 32 at D = 128 (keeps the registers of
 * the fp32 prefetch and of the accumulators under the limit). */
template <int D>
__host__ __device__ static constexpr int tc_tile()
{
    return D <= 64 ? 64 : 32;
}

/* Row stride of the bf16 tiles in shared memory: D + 8 elements, a multiple
 * of 16 bytes (ldmatrix rows are 16-byte aligned) and ≡ 16 mod 128 bytes for
 * every D here, so the eight 16-byte rows of one ldmatrix matrix fall in
 * distinct banks. */
template <int D>
__host__ __device__ static constexpr int tc_ld()
{
    return D + 8;
}

/* Two floats as a bf16 pair, lo in the low half (the lower column or row
 * index of a fragment register). */
__device__ static inline uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* d += a · b, one m16n8k16 bf16 product with fp32 accumulation. */
__device__ static inline void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ldmatrix.x4 of the 16 × 16 block at p (row stride ld elements): lane l
 * addresses row (l & 7) + (l & 8), column 8·(l >> 4), so the matrices are
 * 0: rows 0-7, columns 0-7; 1: rows 8-15, columns 0-7; 2: rows 0-7, columns
 * 8-15; 3: rows 8-15, columns 8-15. volatile and "memory": it reads shared
 * memory written by other threads before a barrier, so it must stay between
 * the barriers it is written between. */
__device__ static inline void ldsm_x4(uint32_t r[4], const bf16 *p, int ld, int lane)
{
    const bf16 *row = p + ((lane & 7) + (lane & 8)) * ld + 8 * (lane >> 4);
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ static inline void ldsm_x4_trans(uint32_t r[4], const bf16 *p, int ld, int lane)
{
    const bf16 *row = p + ((lane & 7) + (lane & 8)) * ld + 8 * (lane >> 4);
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* The A fragment of the 16 × 16 block at p, stored by rows: matrices 0..3 are
 * exactly a0..a3 (rows g / g+8, columns 2t / 2t+8). */
__device__ static inline void frag_a(uint32_t a[4], const bf16 *p, int ld, int lane)
{
    ldsm_x4(a, p, ld, lane);
}

/* B fragments of two n-tiles from the 16 (n) × 16 (k) block at p stored by n
 * rows (B = Xᵀ for X by rows: K in S = Q Kᵀ): b[j] for n 8j..8j+7. Matrix 0
 * (n 0-7, k 0-7) gives lane l X[g][2t..2t+1] = B[2t..2t+1][g], b[0][0]; matrix
 * 1 (n 8-15, k 0-7) b[1][0]; 2 (n 0-7, k 8-15) b[0][1]; 3 b[1][1]. */
__device__ static inline void frag_b_nk(uint32_t b[2][2], const bf16 *p, int ld, int lane)
{
    uint32_t r[4];
    ldsm_x4(r, p, ld, lane);
    b[0][0] = r[0], b[1][0] = r[1], b[0][1] = r[2], b[1][1] = r[3];
}

/* B fragments of two n-tiles from the 16 (k) × 16 (n) block at p stored by k
 * rows (V in O += P V), transposed by ldmatrix: matrix 0 (k 0-7, n 0-7) gives
 * lane l B[2t..2t+1][g], b[0][0]; 1 (k 8-15, n 0-7) b[0][1]; 2 (k 0-7, n 8-15)
 * b[1][0]; 3 b[1][1]. */
__device__ static inline void frag_b_kn(uint32_t b[2][2], const bf16 *p, int ld, int lane)
{
    uint32_t r[4];
    ldsm_x4_trans(r, p, ld, lane);
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

/* The A fragment of a 16 × 16 block taken from two C fragments: c0 for
 * columns 0-7, c1 for 8-15 (S → P, dS). */
__device__ static inline void c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

/* A fragments of the warp's 16 rows × D (row0.., row stride ld) straight from
 * global memory (read once per block): a[kc] for channels 16kc..16kc+15;
 * zero past T and hs. */
template <int D>
__device__ static inline void frag_a_global(uint32_t a[D / 16][4], const float *src, size_t ld,
                                            int row0, int T, int hs, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = row0 + g + 8 * (i & 1), c = 16 * kc + 2 * t + 8 * (i >> 1);
            const float *p = src + (size_t)r * ld + c;
            const float x0 = r < T && c < hs ? p[0] : 0.0f;
            const float x1 = r < T && c + 1 < hs ? p[1] : 0.0f;
            a[kc][i] = pack_bf16(x0, x1);
        }
}

/* A tile of R rows × D channels in flight: thread x holds the float4s of the
 * items x + 256i, item j being row j / (D/4), channels 4(j % (D/4)) ..+3. */
template <int R, int D>
struct tile_regs {
    static constexpr int N = R * D / 4 / TC_THREADS;
    static_assert(N >= 1 && R * D / 4 % TC_THREADS == 0, "whole float4s per thread");
    float4 v[N];
};

/* Reads rows row0.. of src (row stride ld; zero at rows ≥ T and channels ≥
 * hs). vec: ld, hs and src allow aligned float4 loads (then hs is a multiple
 * of 4, so a float4 is wholly inside or outside the head). */
template <int R, int D>
__device__ static inline void tile_fetch(tile_regs<R, D> &x, const float *src, size_t ld, int row0,
                                         int T, int hs, bool vec)
{
#pragma unroll
    for (int i = 0; i < tile_regs<R, D>::N; i++) {
        const int j = threadIdx.x + TC_THREADS * i, r = j / (D / 4), c = 4 * (j % (D / 4));
        const int t = row0 + r;
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < T && c < hs) {
            const float *p = src + (size_t)t * ld + c;
            if (vec) {
                f = *reinterpret_cast<const float4 *>(p);
            } else {
                f.x = p[0];
                if (c + 1 < hs) f.y = p[1];
                if (c + 2 < hs) f.z = p[2];
                if (c + 3 < hs) f.w = p[3];
            }
        }
        x.v[i] = f;
    }
}

/* The fetched tile as bf16 into dst (R rows of stride tc_ld<D>()). */
template <int R, int D>
__device__ static inline void tile_store(bf16 *dst, const tile_regs<R, D> &x)
{
#pragma unroll
    for (int i = 0; i < tile_regs<R, D>::N; i++) {
        const int j = threadIdx.x + TC_THREADS * i, r = j / (D / 4), c = 4 * (j % (D / 4));
        uint2 u;
        u.x = pack_bf16(x.v[i].x, x.v[i].y);
        u.y = pack_bf16(x.v[i].z, x.v[i].w);
        *reinterpret_cast<uint2 *>(dst + r * tc_ld<D>() + c) = u;
    }
}

/* Block (bh, 128 queries); warp w owns queries r0 = q0 + 16w .. r0 + 15: in
 * lane (g, t) rows r0 + g and r0 + g + 8, their m (the running maximum of the
 * raw scores) and l (this lane's part of the running sum), and O columns
 * 8j + 2t, 8j + 2t + 1. */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS)
flash_forward_bf16_kernel(float *out, float *lse, const float *qkv, int T, int NH, int hs, float sc,
                          int vec)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8, NS = BK / 8;
    __shared__ __align__(16) bf16 Ks[BK * LD], Vs[BK * LD];
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + 16 * w;
    const int kend = min(q0 + TC_ROWS, T); /* the block's rows see keys < kend */

    uint32_t qa[NK][4];
    frag_a_global<D>(qa, q, C3, r0, T, hs, lane);
    float o[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    tile_regs<BK, D> kr, vr;
    tile_fetch(kr, k, C3, 0, T, hs, vec);
    tile_fetch(vr, v, C3, 0, T, hs, vec);
    tile_store(Ks, kr);
    tile_store(Vs, vr);
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* Ks, Vs hold keys k0 .. k0 + BK − 1 */
        const bool more = k0 + BK < kend;
        if (more) { /* the next tile's loads fly while this one is used */
            tile_fetch(kr, k, C3, k0 + BK, T, hs, vec);
            tile_fetch(vr, v, C3, k0 + BK, T, hs, vec);
        }
        /* Chunks of 16 keys with a key ≤ the warp's last row: nc (warp-uniform).
         * Rows at or past T are not stored; a warp of only those skips. */
        if (r0 < T && r0 + 15 >= k0) {
            const int nc = min(BK / 16, (r0 + 15 - k0) / 16 + 1);
            float s[NS][4];
#pragma unroll
            for (int j = 0; j < NS; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int c = 0; c < BK / 16; c++) {
                if (c >= nc) break;
#pragma unroll
                for (int kc = 0; kc < NK; kc++) { /* S = Q Kᵀ */
                    uint32_t kb[2][2];
                    frag_b_nk(kb, Ks + 16 * c * LD + 16 * kc, LD, lane);
                    mma_bf16(s[2 * c], qa[kc], kb[0][0], kb[0][1]);
                    mma_bf16(s[2 * c + 1], qa[kc], kb[1][0], kb[1][1]);
                }
            }
            /* mask (keys > row: −inf), row maxima over the 4 lanes of a row */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < NS; j++) {
                if (j / 2 >= nc) break;
                const bool diag = k0 + 8 * j + 7 > r0; /* some key of n-tile j > some row */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + g + 8 * (e >> 1), key = k0 + 8 * j + 2 * t + (e & 1);
                    if (diag && key > row) s[j][e] = -INFINITY;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
                }
            }
            float alpha[2], msc[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                /* finite: key k0 = 0 is unmasked for every row in the first
                 * tile, and m never decreases */
                const float mn = fmaxf(m[i], mx[i]);
                alpha[i] = exp2f((m[i] - mn) * sc); /* 0 on the first tile (m = −inf) */
                m[i] = mn;
                msc[i] = mn * sc;
                l[i] *= alpha[i];
            }
#pragma unroll
            for (int j = 0; j < NO; j++) {
                o[j][0] *= alpha[0], o[j][1] *= alpha[0];
                o[j][2] *= alpha[1], o[j][3] *= alpha[1];
            }
            /* P = exp2(s·sc − m·sc), in place of S; l sums the fp32 p (FlashAttention-2) */
#pragma unroll
            for (int j = 0; j < NS; j++) {
                if (j / 2 >= nc) break;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[j][e] = exp2f(fmaf(s[j][e], sc, -msc[e >> 1]));
                    l[e >> 1] += s[j][e];
                }
            }
#pragma unroll
            for (int c = 0; c < BK / 16; c++) { /* O += P V */
                if (c >= nc) break;
                uint32_t pa[4];
                c_to_a(pa, s[2 * c], s[2 * c + 1]);
#pragma unroll
                for (int jp = 0; jp < NO / 2; jp++) {
                    uint32_t vb[2][2];
                    frag_b_kn(vb, Vs + 16 * c * LD + 16 * jp, LD, lane);
                    mma_bf16(o[2 * jp], pa, vb[0][0], vb[0][1]);
                    mma_bf16(o[2 * jp + 1], pa, vb[1][0], vb[1][1]);
                }
            }
        }
        __syncthreads(); /* every warp is done with Ks, Vs */
        if (more) {
            tile_store(Ks, kr);
            tile_store(Vs, vr);
        }
    }

    if (r0 >= T) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        /* the row's sum over its 4 lanes; the same bits in each (+ commutes) */
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int row = r0 + g + 8 * i;
        if (row >= T) continue;
        const float inv = 1.0f / l[i]; /* l ≥ 1: the row's maximum contributes exp2(0) */
        float *po = out + ((size_t)b * T + row) * C + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int c = 8 * j + 2 * t;
            if (c < hs) po[c] = o[j][2 * i] * inv;
            if (c + 1 < hs) po[c + 1] = o[j][2 * i + 1] * inv;
        }
        if (t == 0) lse[(size_t)bh * T + row] = (m[i] * sc + log2f(l[i])) * FA_LN2;
    }
}

/* Block (bh, 128 keys); warp w owns keys kw = k0 + 16w .. kw + 15 (lane (g,
 * t): keys kw + g, kw + g + 8) and their dK, dV (columns 8j + 2t, +1). Per
 * chunk of 16 queries it computes the transposed Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
 * (16 keys × 16 queries), then dV += Pᵀ dO and dK += dSᵀ Q. */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS)
flash_backward_dkv_bf16_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                               const float *delta, int T, int NH, int hs, float scale, float sc,
                               int vec_qkv, int vec_dout)
{
    constexpr int BQ = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(tc_smem), *Vs = Ks + TC_ROWS * LD;
    bf16 *Qs = Vs + TC_ROWS * LD, *dOs = Qs + BQ * LD;
    float *lse2 = reinterpret_cast<float *>(dOs + BQ * LD), *Ds = lse2 + BQ;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * TC_ROWS; /* the first key tiles see the most queries: first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const size_t base = (size_t)b * T * C3 + (size_t)h * hs;
    const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *L = lse + (size_t)bh * T, *Dl = delta + (size_t)bh * T;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = k0 + 16 * w;

    {
        tile_regs<TC_ROWS / 2, D> x; /* the block's K and V, in halves (registers) */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int at = half * (TC_ROWS / 2);
            tile_fetch(x, k, C3, k0 + at, T, hs, vec_qkv);
            tile_store(Ks + at * LD, x);
            tile_fetch(x, v, C3, k0 + at, T, hs, vec_qkv);
            tile_store(Vs + at * LD, x);
        }
    }
    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int j = 0; j < NO; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[j][e] = dv[j][e] = 0.0f;

    /* queries before k0 see none of these keys; q tiles start at k0 (a multiple of BQ) */
    tile_regs<BQ, D> qr, dr;
    float nl = 0.0f, nd = 0.0f; /* thread x < BQ: lse (base 2) and D of query q0 + x */
    tile_fetch(qr, q, C3, k0, T, hs, vec_qkv);
    tile_fetch(dr, dO, (size_t)C, k0, T, hs, vec_dout);
    if (threadIdx.x < BQ && k0 + (int)threadIdx.x < T)
        nl = L[k0 + threadIdx.x] * FA_LOG2E, nd = Dl[k0 + threadIdx.x];
    tile_store(Qs, qr);
    tile_store(dOs, dr);
    if (threadIdx.x < BQ) lse2[threadIdx.x] = nl, Ds[threadIdx.x] = nd;
    for (int q0 = k0; q0 < T; q0 += BQ) {
        __syncthreads(); /* Qs, dOs, lse2, Ds hold queries q0 .. q0 + BQ − 1 (and Ks, Vs) */
        const bool more = q0 + BQ < T;
        if (more) {
            tile_fetch(qr, q, C3, q0 + BQ, T, hs, vec_qkv);
            tile_fetch(dr, dO, (size_t)C, q0 + BQ, T, hs, vec_dout);
            const int x = q0 + BQ + (int)threadIdx.x;
            nl = nd = 0.0f;
            if (threadIdx.x < BQ && x < T) nl = L[x] * FA_LOG2E, nd = Dl[x];
        }
#pragma unroll
        for (int c = 0; c < BQ / 16; c++) {
            const int qc = q0 + 16 * c; /* the chunk's first query */
            /* skipped: every query before every key, or no real query; also a warp
             * of keys past T (nothing of it is stored) */
            if (kw >= T || qc + 15 < kw || qc >= T) continue;
            float st[2][4] = {}, dpt[2][4] = {};
#pragma unroll
            for (int kc = 0; kc < NK; kc++) {
                uint32_t a[4], bq[2][2];
                frag_a(a, Ks + 16 * w * LD + 16 * kc, LD, lane);
                frag_b_nk(bq, Qs + 16 * c * LD + 16 * kc, LD, lane);
                mma_bf16(st[0], a, bq[0][0], bq[0][1]); /* Sᵀ = K Qᵀ */
                mma_bf16(st[1], a, bq[1][0], bq[1][1]);
                frag_a(a, Vs + 16 * w * LD + 16 * kc, LD, lane);
                frag_b_nk(bq, dOs + 16 * c * LD + 16 * kc, LD, lane);
                mma_bf16(dpt[0], a, bq[0][0], bq[0][1]); /* dPᵀ = V dOᵀ */
                mma_bf16(dpt[1], a, bq[1][0], bq[1][1]);
            }
            /* masked where key > query or query ≥ T: a select, since a masked
             * score's exp2 may overflow */
            const bool edge = qc < kw + 15 || qc + 15 >= T;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kw + g + 8 * (e >> 1), qi = 16 * c + 8 * j + 2 * t + (e & 1);
                    const bool live = !edge || (key <= q0 + qi && q0 + qi < T);
                    const float p = live ? exp2f(fmaf(st[j][e], sc, -lse2[qi])) : 0.0f;
                    st[j][e] = p;
                    dpt[j][e] = p * (dpt[j][e] - Ds[qi]); /* dSᵀ, without the scale */
                }
            uint32_t pa[4], dsa[4];
            c_to_a(pa, st[0], st[1]);
            c_to_a(dsa, dpt[0], dpt[1]);
#pragma unroll
            for (int jp = 0; jp < NO / 2; jp++) {
                uint32_t xb[2][2];
                frag_b_kn(xb, dOs + 16 * c * LD + 16 * jp, LD, lane); /* dV += Pᵀ dO */
                mma_bf16(dv[2 * jp], pa, xb[0][0], xb[0][1]);
                mma_bf16(dv[2 * jp + 1], pa, xb[1][0], xb[1][1]);
                frag_b_kn(xb, Qs + 16 * c * LD + 16 * jp, LD, lane); /* dK += dSᵀ Q */
                mma_bf16(dk[2 * jp], dsa, xb[0][0], xb[0][1]);
                mma_bf16(dk[2 * jp + 1], dsa, xb[1][0], xb[1][1]);
            }
        }
        __syncthreads(); /* every warp is done with Qs, dOs, lse2, Ds */
        if (more) {
            tile_store(Qs, qr);
            tile_store(dOs, dr);
            if (threadIdx.x < BQ) lse2[threadIdx.x] = nl, Ds[threadIdx.x] = nd;
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int key = kw + g + 8 * i;
        if (key >= T) continue;
        float *dK = dqkv + base + (size_t)key * C3 + C, *dV = dK + C;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int c = 8 * j + 2 * t;
            if (c < hs) dK[c] += dk[j][2 * i] * scale, dV[c] += dv[j][2 * i];
            if (c + 1 < hs) dK[c + 1] += dk[j][2 * i + 1] * scale, dV[c + 1] += dv[j][2 * i + 1];
        }
    }
}

/* Block (bh, 128 queries); warp w owns queries r0 = q0 + 16w .. r0 + 15 (lane
 * (g, t): rows r0 + g, r0 + g + 8) and their dQ (columns 8j + 2t, +1). Per
 * chunk of 16 keys: S = Q Kᵀ, dP = dO Vᵀ, dS = P ∘ (dP − D), dQ += dS K. */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS)
flash_backward_dq_bf16_kernel(float *dqkv, const float *dout, const float *qkv, const float *lse,
                              const float *delta, int T, int NH, int hs, float scale, float sc,
                              int vec)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8;
    __shared__ __align__(16) bf16 Ks[BK * LD], Vs[BK * LD];
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const size_t base = (size_t)b * T * C3 + (size_t)h * hs;
    const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
    const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + 16 * w;
    const int kend = min(q0 + TC_ROWS, T);

    uint32_t qa[NK][4], da[NK][4];
    frag_a_global<D>(qa, q, C3, r0, T, hs, lane);
    frag_a_global<D>(da, dO, (size_t)C, r0, T, hs, lane);
    float l2[2], dl[2], dq[NO][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = r0 + g + 8 * i;
        l2[i] = row < T ? lse[(size_t)bh * T + row] * FA_LOG2E : 0.0f;
        dl[i] = row < T ? delta[(size_t)bh * T + row] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NO; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

    tile_regs<BK, D> kr, vr;
    tile_fetch(kr, k, C3, 0, T, hs, vec);
    tile_fetch(vr, v, C3, 0, T, hs, vec);
    tile_store(Ks, kr);
    tile_store(Vs, vr);
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* Ks, Vs hold keys k0 .. k0 + BK − 1 */
        const bool more = k0 + BK < kend;
        if (more) {
            tile_fetch(kr, k, C3, k0 + BK, T, hs, vec);
            tile_fetch(vr, v, C3, k0 + BK, T, hs, vec);
        }
        if (r0 < T) {
#pragma unroll
            for (int c = 0; c < BK / 16; c++) {
                const int kc0 = k0 + 16 * c; /* the chunk's first key */
                if (kc0 > r0 + 15) break;    /* every key after every row of the warp */
                float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
                for (int kc = 0; kc < NK; kc++) {
                    uint32_t kb[2][2];
                    frag_b_nk(kb, Ks + 16 * c * LD + 16 * kc, LD, lane); /* S = Q Kᵀ */
                    mma_bf16(s[0], qa[kc], kb[0][0], kb[0][1]);
                    mma_bf16(s[1], qa[kc], kb[1][0], kb[1][1]);
                    frag_b_nk(kb, Vs + 16 * c * LD + 16 * kc, LD, lane); /* dP = dO Vᵀ */
                    mma_bf16(dp[0], da[kc], kb[0][0], kb[0][1]);
                    mma_bf16(dp[1], da[kc], kb[1][0], kb[1][1]);
                }
                /* keys ≥ T are after every real row, so the diagonal mask covers them */
                const bool diag = kc0 + 15 > r0;
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int row = r0 + g + 8 * (e >> 1), key = kc0 + 8 * j + 2 * t + (e & 1);
                        const bool live = !diag || key <= row;
                        const float p = live ? exp2f(fmaf(s[j][e], sc, -l2[e >> 1])) : 0.0f;
                        dp[j][e] = p * (dp[j][e] - dl[e >> 1]); /* dS, without the scale */
                    }
                uint32_t dsa[4];
                c_to_a(dsa, dp[0], dp[1]);
#pragma unroll
                for (int jp = 0; jp < NO / 2; jp++) { /* dQ += dS K */
                    uint32_t kb[2][2];
                    frag_b_kn(kb, Ks + 16 * c * LD + 16 * jp, LD, lane);
                    mma_bf16(dq[2 * jp], dsa, kb[0][0], kb[0][1]);
                    mma_bf16(dq[2 * jp + 1], dsa, kb[1][0], kb[1][1]);
                }
            }
        }
        __syncthreads(); /* every warp is done with Ks, Vs */
        if (more) {
            tile_store(Ks, kr);
            tile_store(Vs, vr);
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = r0 + g + 8 * i;
        if (row >= T) continue;
        float *dQ = dqkv + base + (size_t)row * C3;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int c = 8 * j + 2 * t;
            if (c < hs) dQ[c] += dq[j][2 * i] * scale;
            if (c + 1 < hs) dQ[c + 1] += dq[j][2 * i + 1] * scale;
        }
    }
}

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

/* Whether the rows of a head (hs floats at channel offset h·hs, row stride a
 * multiple of C) allow aligned float4 loads: the bf16 kernels' tile loads. */
static int float4_rows(const float *p, int C, int hs)
{
    return C % 4 == 0 && hs % 4 == 0 && ((uintptr_t)p & 15) == 0;
}

/* out and lse: bf16 tensor cores in bf16 mode, fp32 otherwise. */
template <int D>
static void forward_tiles(kn_ctx *k, float *out, float *lse, const float *qkv, int B, int T,
                          int C, int NH)
{
    const int hs = C / NH;
    const float sc = log2_scale(hs);
    if (k->cuda->bf16) {
        const dim3 grid((unsigned)(B * NH), (unsigned)((T + TC_ROWS - 1) / TC_ROWS));
        flash_forward_bf16_kernel<D><<<grid, TC_THREADS, 0, kn_stream(k)>>>(
            out, lse, qkv, T, NH, hs, sc, float4_rows(qkv, C, hs));
    } else {
        const dim3 grid((unsigned)(B * NH), (unsigned)((T + FA_TILE - 1) / FA_TILE));
        const size_t sm = fwd_smem<D>();
        allow_smem(flash_forward_kernel<D>, sm);
        flash_forward_kernel<D><<<grid, FA_THREADS, sm, kn_stream(k)>>>(out, lse, qkv, T, NH, hs,
                                                                        sc);
    }
    CUDA_LAUNCHED();
}

/* Shared memory of the bf16 dK/dV kernel: K, V (128 rows), Q, dO (tc_tile rows),
 * bf16, and the tile's lse (base 2) and D. */
template <int D>
static constexpr size_t tc_dkv_smem()
{
    return (size_t)(2 * TC_ROWS + 2 * tc_tile<D>()) * tc_ld<D>() * sizeof(bf16) +
           (size_t)2 * tc_tile<D>() * sizeof(float);
}

template <int D>
static void backward_tiles(kn_ctx *k, float *dqkv, const float *dout, const float *qkv,
                           const float *lse, const float *out, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const size_t rows = (size_t)B * NH * T;
    float *delta = (float *)kn_cuda_workspace(k, rows * sizeof(float));
    attention_delta_kernel<<<kn_blocks(rows * 32, 256), 256, 0, kn_stream(k)>>>(delta, dout, out,
                                                                               B, T, NH, hs);
    CUDA_LAUNCHED();
    const float scale = 1.0f / sqrtf((float)hs), sc = log2_scale(hs);
    if (k->cuda->bf16) {
        const dim3 grid((unsigned)(B * NH), (unsigned)((T + TC_ROWS - 1) / TC_ROWS));
        const int vq = float4_rows(qkv, C, hs), vd = float4_rows(dout, C, hs);
        allow_smem(flash_backward_dkv_bf16_kernel<D>, tc_dkv_smem<D>());
        flash_backward_dkv_bf16_kernel<D><<<grid, TC_THREADS, tc_dkv_smem<D>(), kn_stream(k)>>>(
            dqkv, dout, qkv, lse, delta, T, NH, hs, scale, sc, vq, vd);
        CUDA_LAUNCHED();
        flash_backward_dq_bf16_kernel<D><<<grid, TC_THREADS, 0, kn_stream(k)>>>(
            dqkv, dout, qkv, lse, delta, T, NH, hs, scale, sc, vq);
        CUDA_LAUNCHED();
        return;
    }
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

void kn_cuda_attention_forward(kn_ctx *k, float *out, float *att, const float *qkv, int B, int T,
                               int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    switch (tile_width("kn_attention_forward", T, C, NH)) {
    case 16: forward_tiles<16>(k, out, att, qkv, B, T, C, NH); break;
    case 32: forward_tiles<32>(k, out, att, qkv, B, T, C, NH); break;
    case 64: forward_tiles<64>(k, out, att, qkv, B, T, C, NH); break;
    default: forward_tiles<128>(k, out, att, qkv, B, T, C, NH); break;
    }
}

void kn_cuda_attention_backward(kn_ctx *k, float *dqkv, const float *dout, const float *qkv,
                                const float *att, const float *out, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0) return;
    switch (tile_width("kn_attention_backward", T, C, NH)) {
    case 16: backward_tiles<16>(k, dqkv, dout, qkv, att, out, B, T, C, NH); break;
    case 32: backward_tiles<32>(k, dqkv, dout, qkv, att, out, B, T, C, NH); break;
    case 64: backward_tiles<64>(k, dqkv, dout, qkv, att, out, B, T, C, NH); break;
    default: backward_tiles<128>(k, dqkv, dout, qkv, att, out, B, T, C, NH); break;
    }
}

/* att is the log-sum-exp of each row's scaled scores, [B, NH, T]. */
size_t kn_cuda_attention_state_floats(kn_ctx *k, int B, int T, int NH)
{
    (void)k;
    return (size_t)B * (size_t)NH * (size_t)T;
}
