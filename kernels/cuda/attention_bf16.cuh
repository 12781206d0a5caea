/* The bf16 tensor-core kernels of kernels/cuda/attention.cu, which includes
 * this file after defining FA_LOG2E and FA_LN2 (and including cuda_bf16.h).
 * A file of its own so that a CPU emulation can compile the same kernel code
 * with PLIANT_ATTENTION_EMU defined: it then supplies emu_mma and
 * emu_ldmatrix (the instructions by their documented semantics), the
 * shuffles, barriers and thread indices, and runs the threads of a block as
 * coroutines: tests/gpu_emu/attention_emu.cpp, part of `make test`. */
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

/* The block's dynamic shared memory. The emulation (tests/gpu_emu/) maps
 * __shared__ to static and supplies tc_smem as a plain array, where
 * "extern static" would not compile. */
#ifdef PLIANT_ATTENTION_EMU
#define TC_DYNAMIC_SMEM(name) extern unsigned char name[]
#else
#define TC_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

/* d += a · b, one m16n8k16 bf16 product with fp32 accumulation. */
__device__ static inline void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
#ifdef PLIANT_ATTENTION_EMU
    emu_mma(d, a, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
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
#ifdef PLIANT_ATTENTION_EMU
    emu_ldmatrix(r, row, false);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#endif
}

__device__ static inline void ldsm_x4_trans(uint32_t r[4], const bf16 *p, int ld, int lane)
{
    const bf16 *row = p + ((lane & 7) + (lane & 8)) * ld + 8 * (lane >> 4);
#ifdef PLIANT_ATTENTION_EMU
    emu_ldmatrix(r, row, true);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
#endif
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
    TC_DYNAMIC_SMEM(tc_smem);
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

