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
 * is, packed to bf16 pairs, the A fragment of P for the next product. q, k,
 * v and dO are rounded to bf16 where they are packed, P and dS just before
 * their products; sums, the online softmax, lse, D and the final
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
 * Operands: the kernels read q, k, v and dO in bf16 as rows of D channels
 * (tc_operand: a base pointer per head and a row stride), in one of two
 * layouts. Direct (tc_direct): where the caller gives qkv's and dout's bf16
 * copies as their matmuls wrote them ([B, T, 3C] and [B, T, C]), hs = D and T
 * is a multiple of TC_ROWS, the kernels read those in place, rows 3C (or C)
 * apart: no packing pass, and no row past T or channel past hs is ever read.
 * Packed, otherwise: q, k and v are first packed into bf16, head by head
 * ([B·NH][3][Tp][D] after the lse in the forward's state, Tp = T rounded up
 * to TC_ROWS), and the backward packs dO the same way ([B·NH][Tp][D], in the
 * pass that computes D = rowsum(dO ∘ O)); rows past T and channels past hs are
 * zero. Either way every tile is whole, 16-byte aligned rows that cp.async
 * copies straight into shared memory, two stages deep (the next tile is in
 * flight while the tensor cores work on this one), with no registers held for
 * the prefetch and no bounds checks in the loops. q, k and v are the same
 * bf16 values in both layouts, so are the results.
 *
 * Tiles: a block of 4 warps owns 64 rows (TC_ROWS): queries in forward and dQ,
 * keys in dK/dV; each warp 16 of them, whose A fragments (q, or k and v) it
 * keeps in registers for the whole block. The streamed tile (K and V, or Q
 * and dO) has 64 rows (32 at D = 128, for registers). Small blocks with few
 * registers let 3 or 4 blocks share an SM (12 or 16 warps, tc_min_blocks),
 * whose barriers do not wait on each other: the kernels are latency-bound,
 * not bound by the tensor cores. Within a tile a warp works in chunks of 16 keys
 * (or queries): a chunk entirely above the diagonal is skipped, a chunk
 * crossing it (or past T) is masked element by element. Backward needs no
 * reduction along the chunk, so it keeps only one chunk of S and dP (16 × 16)
 * in registers at a time.
 *
 * Every gradient element has one owner thread, accumulated in a fixed order
 * (no atomics) and stored once (dqkv, or where the caller gives one only its
 * bf16 copy, is overwritten, every element of it: each key and each query
 * below T is some block's own row): the same bits every run. The forward
 * stores out, and out's bf16 copy where given, the same way. */

typedef __nv_bfloat16 bf16;

#define TC_THREADS 128 /* 4 warps */
#define TC_ROWS 64     /* the block's own rows: queries (forward, dQ) or keys (dK/dV) */

/* Blocks per SM the register budget must allow (launch bounds), for a kernel
 * with one 16 × D accumulator a warp (forward, dQ: 4 blocks, at most 128
 * registers a thread) or two (dK/dV: 3, at most 168; with 128 they spill); at
 * D = 128 dK and dV alone take 128 registers, so one. */
template <int D>
__host__ __device__ static constexpr int tc_min_blocks(int accumulators)
{
    return D > 64 ? 1 : accumulators == 1 ? 4 : 3;
}

/* T rounded up to whole blocks: the rows of the packed operands. */
__host__ __device__ static inline int tc_padded_rows(int T)
{
    return (T + TC_ROWS - 1) / TC_ROWS * TC_ROWS;
}

/* Where a kernel reads a bf16 operand (q, k, v or dO) of sequence b, head h:
 * p + b·batch + h·head (k part and v 2·part further on), its rows ld
 * elements apart (the layouts: the header). */
struct tc_operand {
    const bf16 *p;
    size_t batch, head, part;
    int ld;
};

__device__ static inline const bf16 *tc_head(const tc_operand &x, int b, int h)
{
    return x.p + b * x.batch + h * x.head;
}

/* Whether the direct layout is used at tile width D: not at D = 128, where
 * the dK/dV kernel's registers are full (a row stride read at run time
 * spills there). */
template <int D>
__host__ __device__ static constexpr bool tc_reads_direct()
{
    return D <= 64;
}

/* x's row stride: D, a constant, where only the packed layout is used. */
template <int D>
__device__ static inline int tc_stride(const tc_operand &x)
{
    return tc_reads_direct<D>() ? x.ld : D;
}

/* The packed layout of `parts` operands (3: q, k, v; 1: dO) at p. */
template <int D>
static inline tc_operand tc_packed(const bf16 *p, int T, int NH, int parts)
{
    const size_t rows = (size_t)tc_padded_rows(T) * D;
    return {p, (size_t)NH * parts * rows, parts * rows, rows, D};
}

/* Whether the sizes allow the direct layout: a head is a whole tile (hs = D:
 * no channel to zero) and no block has a row past T. */
template <int D>
static inline bool tc_direct_sizes(int T, int hs)
{
    return tc_reads_direct<D>() && hs == D && T % TC_ROWS == 0;
}

/* Whether a bf16 copy x ([B, T, parts·C], NULL: none) can be read in place
 * (the direct layout): the sizes allow it and cp.async gets 16-byte aligned
 * rows (x aligned; h·hs and the row stride are multiples of 8 elements since
 * hs = D ≥ 16). */
template <int D>
static inline bool tc_direct(const bf16 *x, int T, int hs)
{
    return tc_direct_sizes<D>(T, hs) && x && (uintptr_t)x % 16 == 0;
}

/* The operand the kernels read: x in place where tc_direct, else the packed
 * copy at packed (which the caller then fills). Forward and backward decide
 * from the same arguments, so they agree. */
template <int D>
static inline tc_operand tc_operand_of(const bf16 *x, const bf16 *packed, int T, int C, int NH,
                                       int parts)
{
    const int hs = C / NH;
    if (tc_direct<D>(x, T, hs))
        return {x, (size_t)T * parts * C, (size_t)hs, (size_t)C, parts * C};
    return tc_packed<D>(packed, T, NH, parts);
}

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

/* ldmatrix.x4.trans, lane l addressing row l & 7 of matrix l >> 3 at row. */
__device__ static inline void ldsm_x4_trans_at(uint32_t r[4], const bf16 *row)
{
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

__device__ static inline void ldsm_x4_trans(uint32_t r[4], const bf16 *p, int ld, int lane)
{
    ldsm_x4_trans_at(r, p + ((lane & 7) + (lane & 8)) * ld + 8 * (lane >> 4));
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

/* ---- dS from the dK/dV kernel to the dQ kernel ----------------------------------
 *
 * The dK/dV kernel computes dS = P ∘ (dP − D) for every (query, key) pair of
 * the causal part; where the workspace has room it stores it (bf16 and
 * unscaled: the operand its own dK product uses), and the dQ kernel computes
 * dQ = dS K from it, one tile product instead of three (S = Q Kᵀ and dP =
 * dO Vᵀ are not recomputed): 5 products per (query, key) tile pair instead of
 * 7. FlashAttention-2 (Dao, 2023, Algorithm 2) adds dS K into dQ in global
 * memory within the dK/dV loop (atomic adds in its code); here each dQ
 * element keeps one owner thread instead.
 *
 * Layout: 16 × 16 chunks (queries 16qi.., keys 16ki.., ki ≤ qi), per head the
 * triangle of chunks by key columns, n = Tp / 16 chunk rows: column ki starts
 * at chunk ki·n − ki(ki − 1)/2 and holds qi = ki .. n − 1, so a dK/dV warp's
 * chunks are consecutive (one pointer: the registers of that kernel are at
 * their limit). A chunk (256 elements) holds dSᵀ (keys
 * by rows, the dK/dV warp's A fragment) as four 8 × 8 matrices one after the
 * other, m = 0..3 for keys 8(m & 1).., queries 8(m >> 1).., each row (8
 * queries) 16 bytes: a warp stores one fragment register as 128 contiguous
 * bytes, and ldmatrix.trans with lane l at element 8l (conflict-free) gives
 * the dQ warp the A fragment of dS (queries by rows). */

#define TC_CHUNK 256 /* elements of one 16 × 16 chunk of dS */

/* Whether the backward keeps dS (where the workspace has room): not at D =
 * 128, where the dK/dV kernel's registers are full (storing it spills). */
template <int D>
__host__ __device__ static constexpr bool tc_keeps_ds()
{
    return D <= 64;
}

/* Chunks of dS per head: the triangle ki ≤ qi of Tp / 16 chunk rows. */
__host__ __device__ static inline size_t tc_ds_chunks(int T)
{
    const size_t n = (size_t)tc_padded_rows(T) / 16;
    return n * (n + 1) / 2;
}

/* Where chunk (ki, ki), the first of column ki, of head bh starts, in elements. */
__device__ static inline size_t ds_column(int T, int bh, int ki)
{
    const size_t n = (size_t)tc_padded_rows(T) / 16;
    return ((size_t)bh * tc_ds_chunks(T) + ki * n - (size_t)ki * (ki - 1) / 2) * TC_CHUNK;
}

/* Stores a warp's A fragment of a chunk of dSᵀ: register m is matrix m,
 * lane (g, t) its row g, columns 2t and 2t + 1. */
__device__ static inline void ds_store(bf16 *chunk, const uint32_t a[4], int lane)
{
    uint32_t *p = reinterpret_cast<uint32_t *>(chunk);
#pragma unroll
    for (int m = 0; m < 4; m++) p[32 * m + lane] = a[m];
}

/* The A fragment of dS (queries by rows) from a chunk in shared memory:
 * ldmatrix.trans gives lane (g, t) rows 2t, 2t + 1 (keys), column g (query)
 * of each matrix, so matrices 0, 2, 1, 3 are a0..a3. */
__device__ static inline void frag_a_ds(uint32_t a[4], const bf16 *chunk, int lane)
{
    uint32_t r[4];
    ldsm_x4_trans_at(r, chunk + 8 * lane);
    a[0] = r[0], a[1] = r[2], a[2] = r[1], a[3] = r[3];
}

/* ---- operands and their copies to shared memory ---------------------------------- */

/* 16 bytes from global to shared memory, asynchronously (cp.async.cg: cached
 * in L2 only; the tiles are re-read by other blocks, not by this one). */
__device__ static inline void cp_async16(void *dst, const void *src)
{
#ifdef PLIANT_ATTENTION_EMU
    assert(((uintptr_t)dst & 15) == 0 && ((uintptr_t)src & 15) == 0);
    memcpy(dst, src, 16);
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#endif
}

/* One float, or zero where !valid (the source is then not read). */
__device__ static inline void cp_async4(float *dst, const float *src, bool valid)
{
#ifdef PLIANT_ATTENTION_EMU
    *dst = valid ? *src : 0.0f;
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
#endif
}

/* Closes the group of this thread's copies issued since the last commit. */
__device__ static inline void cp_async_commit()
{
#ifndef PLIANT_ATTENTION_EMU
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Waits for every copy this thread committed (a barrier then makes all threads' visible). */
__device__ static inline void cp_async_wait_all()
{
#ifndef PLIANT_ATTENTION_EMU
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

/* Copies rows 0..R−1 of an operand (row stride ld) to dst (row stride
 * tc_ld<D>()): thread x issues the 16-byte chunks x + TC_THREADS·i. */
template <int R, int D>
__device__ static inline void tile_async(bf16 *dst, const bf16 *src, int ld)
{
    constexpr int CH = D / 8, N = R * CH / TC_THREADS;
    static_assert(N >= 1 && R * CH % TC_THREADS == 0, "whole 16-byte chunks per thread");
#pragma unroll
    for (int i = 0; i < N; i++) {
        const int j = threadIdx.x + TC_THREADS * i, r = j / CH, c = 8 * (j % CH);
        cp_async16(dst + r * tc_ld<D>() + c, src + (size_t)r * ld + c);
    }
}

/* Keys k0 .. k0 + BK − 1 of k and v (row stride ld) into stage s of Ks and Vs
 * (each two stages of BK rows), as one group of copies. */
template <int D>
__device__ static inline void kv_tile_async(bf16 *Ks, bf16 *Vs, const bf16 *k, const bf16 *v,
                                            int ld, int s, int k0)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>();
    tile_async<BK, D>(Ks + s * BK * LD, k + (size_t)k0 * ld, ld);
    tile_async<BK, D>(Vs + s * BK * LD, v + (size_t)k0 * ld, ld);
    cp_async_commit();
}

/* A fragments of the warp's 16 rows row0.. of an operand (row stride ld),
 * straight from global memory (read once per block): a[kc] for channels
 * 16kc..16kc+15. */
template <int D>
__device__ static inline void frag_a_global(uint32_t a[D / 16][4], const bf16 *src, int ld,
                                            int row0, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = row0 + g + 8 * (i & 1), c = 16 * kc + 2 * t + 8 * (i >> 1);
            a[kc][i] = *reinterpret_cast<const uint32_t *>(src + (size_t)r * ld + c);
        }
}

/* A value as fp32 (bf16 exactly: its bits are fp32's upper half). */
__device__ static inline float to_f32(float x) { return x; }
__device__ static inline float to_f32(bf16 x)
{
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(x) << 16);
}

/* Eight bf16 from the first n (≤ 0: none) of the values at src (fp32 or bf16),
 * zero after. */
template <typename Q>
__device__ static inline void pack8(bf16 *dst, const Q *src, int n)
{
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = i < n ? to_f32(src[i]) : 0.0f;
    uint4 u;
    u.x = pack_bf16(x[0], x[1]);
    u.y = pack_bf16(x[2], x[3]);
    u.z = pack_bf16(x[4], x[5]);
    u.w = pack_bf16(x[6], x[7]);
    *reinterpret_cast<uint4 *>(dst) = u;
}

/* pk[bh][part][t][c] = qkv[b, t, part·C + h·hs + c] as bf16 (zero at t ≥ T,
 * c ≥ hs); one thread per 8 channels. qkv is fp32, or bf16 where its matmul
 * wrote it so (its low-precision copy, kernels.h). */
template <int D, typename Q>
__global__ static void __launch_bounds__(TC_THREADS)
attention_pack_qkv_kernel(bf16 *pk, const Q *qkv, int B, int T, int NH, int hs)
{
    constexpr int CH = D / 8;
    const int Tp = tc_padded_rows(T);
    const size_t j = (size_t)blockIdx.x * TC_THREADS + threadIdx.x;
    if (j >= (size_t)B * NH * 3 * Tp * CH) return;
    const int c = 8 * (int)(j % CH);
    const size_t row = j / CH; /* (bh·3 + part)·Tp + t */
    const int t = (int)(row % Tp), part = (int)(row / Tp % 3), bh = (int)(row / Tp / 3);
    const int b = bh / NH, h = bh % NH, C = NH * hs;
    const Q *src =
        t < T ? qkv + ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs + c : qkv;
    pack8(pk + row * D + c, src, t < T ? hs - c : 0);
}

/* delta[bh·T + t] = Σ_c dout[b, t, h·hs + c] · out[b, t, h·hs + c] and the
 * packed dO, pdo[bh][t][c] (zero at t ≥ T, c ≥ hs; pdo NULL: not stored, the
 * kernels read dout's bf16 copy in place): one warp per (bh, t < Tp), lanes
 * over channel pairs, a fixed shuffle tree (deterministic). dout and out are
 * fp32, or bf16 where their copies are read (kernels.h); the sum is fp32. */
template <int D, typename DO, typename O>
__global__ static void __launch_bounds__(TC_THREADS)
attention_delta_pack_kernel(float *delta, bf16 *pdo, const DO *dout, const O *out, int B, int T,
                            int NH, int hs)
{
    const int Tp = tc_padded_rows(T);
    const size_t g = ((size_t)blockIdx.x * TC_THREADS + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (g >= (size_t)B * NH * Tp) return; /* whole warps: TC_THREADS is a multiple of 32 */
    const int t = (int)(g % Tp), bh = (int)(g / Tp), b = bh / NH, h = bh % NH;
    bf16 *dst = pdo ? pdo + g * D : NULL;
    if (t >= T) {
        for (int c = 2 * lane; dst && c < D; c += 64) *reinterpret_cast<uint32_t *>(dst + c) = 0u;
        return;
    }
    const size_t at = ((size_t)b * T + t) * NH * hs + (size_t)h * hs;
    float s = 0.0f;
    for (int c = 2 * lane; c < D; c += 64) {
        const float x0 = c < hs ? to_f32(dout[at + c]) : 0.0f;
        const float x1 = c + 1 < hs ? to_f32(dout[at + c + 1]) : 0.0f;
        if (c < hs) s += x0 * to_f32(out[at + c]);
        if (c + 1 < hs) s += x1 * to_f32(out[at + c + 1]);
        if (dst) *reinterpret_cast<uint32_t *>(dst + c) = pack_bf16(x0, x1);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[(size_t)bh * T + t] = s;
}

/* One value, and two adjacent ones in one store, as fp32 or as bf16 (the
 * low-precision copies of kernels.h: round to nearest even). */
__device__ static inline void put1(float *p, float x) { *p = x; }
__device__ static inline void put1(bf16 *p, float x) { *p = __float2bfloat16_rn(x); }
__device__ static inline void put2(float *p, float x0, float x1)
{
    *reinterpret_cast<float2 *>(p) = make_float2(x0, x1);
}
__device__ static inline void put2(bf16 *p, float x0, float x1)
{
    *reinterpret_cast<uint32_t *>(p) = pack_bf16(x0, x1);
}

/* p[c] = x0, p[c + 1] = x1 where c, c + 1 < hs; vec2: one store of both (p + c
 * aligned to two elements, hs even). */
template <typename E>
__device__ static inline void store_pair(E *p, int c, int hs, float x0, float x1, int vec2)
{
    if (vec2 && c + 1 < hs) {
        put2(p + c, x0, x1);
        return;
    }
    if (c < hs) put1(p + c, x0);
    if (c + 1 < hs) put1(p + c + 1, x1);
}

/* A pair of gradients at element at + c of dqkv ([B, T, 3C]): into its bf16 copy
 * where one is given, which the qkv matmul then reads instead (dqkv itself is
 * left unwritten: kernels.h), else into dqkv. vec2 as store_pair, for the one
 * written. */
__device__ static inline void store_grad(float *dqkv, bf16 *dqkv_lp, size_t at, int c, int hs,
                                         float x0, float x1, int vec2)
{
    if (dqkv_lp)
        store_pair(dqkv_lp + at, c, hs, x0, x1, vec2);
    else
        store_pair(dqkv + at, c, hs, x0, x1, vec2);
}

/* dQ += dS·K for one chunk of 16 keys: dsa, the warp's dS chunk as an A fragment;
 * Kc, the chunk's 16 key rows of K in shared memory (row stride ld). */
template <int NO>
__device__ static inline void dq_add_ds_k(float dq[NO][4], const uint32_t dsa[4], const bf16 *Kc,
                                          int ld, int lane)
{
#pragma unroll
    for (int jp = 0; jp < NO / 2; jp++) {
        uint32_t kb[2][2];
        frag_b_kn(kb, Kc + 16 * jp, ld, lane);
        mma_bf16(dq[2 * jp], dsa, kb[0][0], kb[0][1]);
        mma_bf16(dq[2 * jp + 1], dsa, kb[1][0], kb[1][1]);
    }
}

/* The lane's dQ rows (row0 and row0 + 8, those < T) of sequence b, head h, times
 * scale into dqkv ([B, T, C3]) or its copy (store_grad), columns 8j + 2t and + 1
 * of the head's hs. */
template <int NO>
__device__ static inline void store_dq(float *dqkv, bf16 *dqkv_lp, const float dq[NO][4], int b,
                                       int h, int row0, int T, int C3, int hs, int t, float scale,
                                       int vec2)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = row0 + 8 * i;
        if (row >= T) continue;
        const size_t at = (size_t)b * T * C3 + (size_t)row * C3 + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < NO; j++)
            store_grad(dqkv, dqkv_lp, at, 8 * j + 2 * t, hs, dq[j][2 * i] * scale,
                       dq[j][2 * i + 1] * scale, vec2);
    }
}

/* ---- the kernels ---------------------------------------------------------------- */

/* Shared memory of each kernel (bytes): two stages of two bf16 tiles of
 * tc_tile<D>() rows, and for dK/dV the stages' lse and D. */
template <int D>
__host__ __device__ static constexpr int tc_smem_bytes(bool dkv)
{
    return 2 * 2 * tc_tile<D>() * tc_ld<D>() * (int)sizeof(bf16) +
           (dkv ? 2 * 2 * tc_tile<D>() * (int)sizeof(float) : 0);
}

/* Shared memory of the dQ kernel reading dS: two stages of a K tile and of
 * each warp's tc_tile<D>() / 16 chunks of dS. */
template <int D>
__host__ __device__ static constexpr int tc_dq_ds_smem_bytes()
{
    return 2 * (tc_tile<D>() * tc_ld<D>() + TC_THREADS / 32 * tc_tile<D>() / 16 * TC_CHUNK) *
           (int)sizeof(bf16);
}

/* Block (bh, 64 queries); warp w owns queries r0 = q0 + 16w .. r0 + 15: in
 * lane (g, t) rows r0 + g and r0 + g + 8, their m (the running maximum of the
 * raw scores) and l (this lane's part of the running sum), and O columns
 * 8j + 2t, 8j + 2t + 1. qkv: where q, k, v are (tc_operand). out_lp (or NULL) gets out's
 * bf16 copy in place of out (out is then left unwritten: kernels.h); vec2
 * (store_pair) for the one stored. */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS, tc_min_blocks<D>(1))
flash_forward_bf16_kernel(float *out, bf16 *out_lp, float *lse, tc_operand qkv, int T, int NH,
                          int hs, float sc, int vec2)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8, NS = BK / 8;
    TC_DYNAMIC_SMEM(tc_smem);
    bf16 *Ks = reinterpret_cast<bf16 *>(tc_smem), *Vs = Ks + 2 * BK * LD; /* [2][BK·LD] each */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int C = NH * hs;
    const bf16 *q = tc_head(qkv, b, h), *k = q + qkv.part, *v = k + qkv.part;
    const int lq = tc_stride<D>(qkv);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + 16 * w;
    const int kend = min(q0 + TC_ROWS, T); /* the block's rows see keys < kend */

    uint32_t qa[NK][4];
    frag_a_global<D>(qa, q, lq, r0, lane);
    float o[NO][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    kv_tile_async<D>(Ks, Vs, k, v, lq, 0, 0);
    for (int k0 = 0, buf = 0; k0 < kend; k0 += BK, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* stage buf holds keys k0 .. k0 + BK − 1; the other stage is free */
        if (k0 + BK < kend) /* the next tile flies while this one is used */
            kv_tile_async<D>(Ks, Vs, k, v, lq, buf ^ 1, k0 + BK);
        const bf16 *Kt = Ks + buf * BK * LD, *Vt = Vs + buf * BK * LD;
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
                    frag_b_nk(kb, Kt + 16 * c * LD + 16 * kc, LD, lane);
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
                    frag_b_kn(vb, Vt + 16 * c * LD + 16 * jp, LD, lane);
                    mma_bf16(o[2 * jp], pa, vb[0][0], vb[0][1]);
                    mma_bf16(o[2 * jp + 1], pa, vb[1][0], vb[1][1]);
                }
            }
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
        const size_t at = ((size_t)b * T + row) * C + (size_t)h * hs;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int c = 8 * j + 2 * t;
            const float x0 = o[j][2 * i] * inv, x1 = o[j][2 * i + 1] * inv;
            if (out_lp)
                store_pair(out_lp + at, c, hs, x0, x1, vec2);
            else
                store_pair(out + at, c, hs, x0, x1, vec2);
        }
        if (t == 0) lse[(size_t)bh * T + row] = (m[i] * sc + log2f(l[i])) * FA_LN2;
    }
}

/* Block (bh, 64 keys); warp w owns keys kw = k0 + 16w .. kw + 15 (lane (g,
 * t): keys kw + g, kw + g + 8), their k and v fragments, and their dK, dV
 * (columns 8j + 2t, +1). Per chunk of 16 queries it computes the transposed
 * Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys × 16 queries), then dV += Pᵀ dO and
 * dK += dSᵀ Q, and stores the chunk of dSᵀ into ds (tc_keeps_ds, ds not NULL). qkv,
 * dout: where q, k, v and dO are (tc_operand). dK and dV go to dqkv or its copy
 * (store_grad). */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS, tc_min_blocks<D>(2))
flash_backward_dkv_bf16_kernel(float *dqkv, bf16 *dqkv_lp, bf16 *ds, tc_operand qkv,
                               tc_operand dout, const float *lse, const float *delta, int T,
                               int NH, int hs, float scale, float sc, int vec2)
{
    constexpr int BQ = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8;
    TC_DYNAMIC_SMEM(tc_smem);
    bf16 *Qs = reinterpret_cast<bf16 *>(tc_smem), *dOs = Qs + 2 * BQ * LD; /* [2][BQ·LD] */
    float *lse_s = reinterpret_cast<float *>(dOs + 2 * BQ * LD), *D_s = lse_s + 2 * BQ;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * TC_ROWS; /* the first key tiles see the most queries: first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *q = tc_head(qkv, b, h), *kp = q + qkv.part, *vp = kp + qkv.part;
    const bf16 *dO = tc_head(dout, b, h);
    const int lq = tc_stride<D>(qkv), ldo = tc_stride<D>(dout);
    const float *L = lse + (size_t)bh * T, *Dl = delta + (size_t)bh * T;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kw = k0 + 16 * w;
    bf16 *dsw = tc_keeps_ds<D>() && ds ? ds + ds_column(T, bh, kw / 16) : NULL; /* its dS */

    uint32_t ka[NK][4], va[NK][4];
    frag_a_global<D>(ka, kp, lq, kw, lane);
    frag_a_global<D>(va, vp, lq, kw, lane);
    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int j = 0; j < NO; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[j][e] = dv[j][e] = 0.0f;

    /* stage s gets queries qt..qt + BQ − 1: Q, dO, lse, D (zero past T) */
    auto fetch = [&](int qt, int s) {
        tile_async<BQ, D>(Qs + s * BQ * LD, q + (size_t)qt * lq, lq);
        tile_async<BQ, D>(dOs + s * BQ * LD, dO + (size_t)qt * ldo, ldo);
        if (threadIdx.x < BQ) {
            const int x = qt + (int)threadIdx.x;
            cp_async4(lse_s + s * BQ + threadIdx.x, x < T ? L + x : L, x < T);
            cp_async4(D_s + s * BQ + threadIdx.x, x < T ? Dl + x : Dl, x < T);
        }
        cp_async_commit();
    };
    /* queries before k0 see none of these keys; q tiles start at k0 (a multiple of BQ) */
    fetch(k0, 0);
    for (int q0 = k0, buf = 0; q0 < T; q0 += BQ, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* stage buf holds queries q0 .. q0 + BQ − 1; the other is free */
        if (q0 + BQ < T) fetch(q0 + BQ, buf ^ 1);
        const bf16 *Qt = Qs + buf * BQ * LD, *dOt = dOs + buf * BQ * LD;
        const float *Lt = lse_s + buf * BQ, *Dt = D_s + buf * BQ;
#pragma unroll
        for (int c = 0; c < BQ / 16; c++) {
            const int qc = q0 + 16 * c; /* the chunk's first query */
            /* skipped: every query before every key, or no real query; also a warp
             * of keys past T (nothing of it is stored) */
            if (kw >= T || qc + 15 < kw || qc >= T) continue;
            float st[2][4] = {}, dpt[2][4] = {};
#pragma unroll
            for (int kc = 0; kc < NK; kc++) {
                uint32_t bq[2][2];
                frag_b_nk(bq, Qt + 16 * c * LD + 16 * kc, LD, lane);
                mma_bf16(st[0], ka[kc], bq[0][0], bq[0][1]); /* Sᵀ = K Qᵀ */
                mma_bf16(st[1], ka[kc], bq[1][0], bq[1][1]);
                frag_b_nk(bq, dOt + 16 * c * LD + 16 * kc, LD, lane);
                mma_bf16(dpt[0], va[kc], bq[0][0], bq[0][1]); /* dPᵀ = V dOᵀ */
                mma_bf16(dpt[1], va[kc], bq[1][0], bq[1][1]);
            }
            /* masked where key > query or query ≥ T: a select, since a masked
             * score's exp2 may overflow */
            const bool edge = qc < kw + 15 || qc + 15 >= T;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int qi = 16 * c + 8 * j + 2 * t + u; /* the query, in the tile */
                    const float l2 = Lt[qi] * FA_LOG2E, dq = Dt[qi];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int e = 2 * i + u, key = kw + g + 8 * i;
                        const bool live = !edge || (key <= q0 + qi && q0 + qi < T);
                        const float p = live ? exp2f(fmaf(st[j][e], sc, -l2)) : 0.0f;
                        st[j][e] = p;
                        dpt[j][e] = p * (dpt[j][e] - dq); /* dSᵀ, without the scale */
                    }
                }
            uint32_t pa[4], dsa[4];
            c_to_a(pa, st[0], st[1]);
            c_to_a(dsa, dpt[0], dpt[1]);
            if (dsw) ds_store(dsw + (size_t)(qc - kw) / 16 * TC_CHUNK, dsa, lane);
#pragma unroll
            for (int jp = 0; jp < NO / 2; jp++) {
                uint32_t xb[2][2];
                frag_b_kn(xb, dOt + 16 * c * LD + 16 * jp, LD, lane); /* dV += Pᵀ dO */
                mma_bf16(dv[2 * jp], pa, xb[0][0], xb[0][1]);
                mma_bf16(dv[2 * jp + 1], pa, xb[1][0], xb[1][1]);
                frag_b_kn(xb, Qt + 16 * c * LD + 16 * jp, LD, lane); /* dK += dSᵀ Q */
                mma_bf16(dk[2 * jp], dsa, xb[0][0], xb[0][1]);
                mma_bf16(dk[2 * jp + 1], dsa, xb[1][0], xb[1][1]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int key = kw + g + 8 * i;
        if (key >= T) continue;
        const size_t dK = (size_t)b * T * C3 + (size_t)key * C3 + C + (size_t)h * hs, dV = dK + C;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int c = 8 * j + 2 * t;
            store_grad(dqkv, dqkv_lp, dK, c, hs, dk[j][2 * i] * scale, dk[j][2 * i + 1] * scale,
                       vec2);
            store_grad(dqkv, dqkv_lp, dV, c, hs, dv[j][2 * i], dv[j][2 * i + 1], vec2);
        }
    }
}

/* Block (bh, 64 queries); warp w owns queries r0 = q0 + 16w .. r0 + 15 (lane
 * (g, t): rows r0 + g, r0 + g + 8), their q and dO fragments, and their dQ
 * (columns 8j + 2t, +1). Per chunk of 16 keys: S = Q Kᵀ, dP = dO Vᵀ,
 * dS = P ∘ (dP − D), dQ += dS K. Runs where dS is not kept (tc_keeps_ds, or
 * no room in the workspace); else flash_backward_dq_ds_bf16_kernel. qkv, dout:
 * where q, k, v and dO are (tc_operand). dQ goes to dqkv or its copy
 * (store_grad). */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS, tc_min_blocks<D>(1))
flash_backward_dq_bf16_kernel(float *dqkv, bf16 *dqkv_lp, tc_operand qkv, tc_operand dout,
                              const float *lse, const float *delta, int T, int NH, int hs,
                              float scale, float sc, int vec2)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>(), NK = D / 16, NO = D / 8;
    TC_DYNAMIC_SMEM(tc_smem);
    bf16 *Ks = reinterpret_cast<bf16 *>(tc_smem), *Vs = Ks + 2 * BK * LD; /* [2][BK·LD] each */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *q = tc_head(qkv, b, h), *k = q + qkv.part, *v = k + qkv.part;
    const int lq = tc_stride<D>(qkv);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + 16 * w;
    const int kend = min(q0 + TC_ROWS, T);

    uint32_t qa[NK][4], da[NK][4];
    frag_a_global<D>(qa, q, lq, r0, lane);
    frag_a_global<D>(da, tc_head(dout, b, h), tc_stride<D>(dout), r0, lane);
    float l2[2], dl[2], dq[NO][4];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = r0 + g + 8 * i;
        l2[i] = row < T ? lse[(size_t)bh * T + row] * FA_LOG2E : 0.0f;
        dl[i] = row < T ? delta[(size_t)bh * T + row] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < NO; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

    kv_tile_async<D>(Ks, Vs, k, v, lq, 0, 0);
    for (int k0 = 0, buf = 0; k0 < kend; k0 += BK, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* stage buf holds keys k0 .. k0 + BK − 1; the other stage is free */
        if (k0 + BK < kend)
            kv_tile_async<D>(Ks, Vs, k, v, lq, buf ^ 1, k0 + BK);
        const bf16 *Kt = Ks + buf * BK * LD, *Vt = Vs + buf * BK * LD;
        if (r0 >= T) continue;
#pragma unroll
        for (int c = 0; c < BK / 16; c++) {
            const int kc0 = k0 + 16 * c; /* the chunk's first key */
            if (kc0 > r0 + 15) break;    /* every key after every row of the warp */
            float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
            for (int kc = 0; kc < NK; kc++) {
                uint32_t kb[2][2];
                frag_b_nk(kb, Kt + 16 * c * LD + 16 * kc, LD, lane); /* S = Q Kᵀ */
                mma_bf16(s[0], qa[kc], kb[0][0], kb[0][1]);
                mma_bf16(s[1], qa[kc], kb[1][0], kb[1][1]);
                frag_b_nk(kb, Vt + 16 * c * LD + 16 * kc, LD, lane); /* dP = dO Vᵀ */
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
            dq_add_ds_k<NO>(dq, dsa, Kt + 16 * c * LD, LD, lane);
        }
    }

    store_dq<NO>(dqkv, dqkv_lp, dq, b, h, r0 + g, T, C3, hs, t, scale, vec2);
}

/* Block (bh, 64 queries); warp w owns queries r0 = q0 + 16w .. r0 + 15 (lane
 * (g, t): rows r0 + g, r0 + g + 8) and their dQ (columns 8j + 2t, +1): dQ +=
 * dS K per chunk of 16 keys, dS from the dK/dV kernel (ds). Each stage holds a
 * K tile and the chunks of dS of each warp's rows and the tile's keys. It
 * waits on memory more than on the tensor cores: 5 blocks an SM (≤ 96
 * registers; at 6, 80 registers spill). qkv: where k is (tc_operand). dQ goes to
 * dqkv or its copy (store_grad). */
template <int D>
__global__ static void __launch_bounds__(TC_THREADS, 5)
flash_backward_dq_ds_bf16_kernel(float *dqkv, bf16 *dqkv_lp, const bf16 *ds, tc_operand qkv,
                                 int T, int NH, int hs, float scale, int vec2)
{
    constexpr int BK = tc_tile<D>(), LD = tc_ld<D>(), NO = D / 8, NC = BK / 16;
    constexpr int WS = NC * TC_CHUNK; /* a warp's chunks of one stage */
    TC_DYNAMIC_SMEM(tc_smem);
    bf16 *Ks = reinterpret_cast<bf16 *>(tc_smem), *dSs = Ks + 2 * BK * LD; /* [2][BK·LD] */
    /* dSs: [2][TC_THREADS / 32 warps][WS] */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int C = NH * hs;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *k = tc_head(qkv, b, h) + qkv.part;
    const int lq = tc_stride<D>(qkv);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + 16 * w, qi = r0 / 16;
    const int kend = min(q0 + TC_ROWS, T);

    /* stage s gets keys k0 .. k0 + BK − 1: K, and this warp's chunks ki ≤ qi
     * of them (a warp of rows past T copies none) */
    auto fetch = [&](int k0, int s) {
        tile_async<BK, D>(Ks + s * BK * LD, k + (size_t)k0 * lq, lq);
        const int n = r0 < T ? min(NC, qi - k0 / 16 + 1) : 0;
        bf16 *dst = dSs + (s * (TC_THREADS / 32) + w) * WS;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int ki = k0 / 16 + c; /* chunk (qi, ki) */
            if (c < n)
                cp_async16(dst + c * TC_CHUNK + 8 * lane,
                           ds + ds_column(T, bh, ki) + (size_t)(qi - ki) * TC_CHUNK + 8 * lane);
        }
        cp_async_commit();
    };
    float dq[NO][4];
#pragma unroll
    for (int j = 0; j < NO; j++) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

    fetch(0, 0);
    for (int k0 = 0, buf = 0; k0 < kend; k0 += BK, buf ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* stage buf holds keys k0 .. k0 + BK − 1; the other stage is free */
        if (k0 + BK < kend) fetch(k0 + BK, buf ^ 1);
        if (r0 >= T) continue;
        const bf16 *Kt = Ks + buf * BK * LD, *dSt = dSs + (buf * (TC_THREADS / 32) + w) * WS;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            if (k0 + 16 * c > r0) break; /* every key after every row of the warp */
            uint32_t dsa[4];
            frag_a_ds(dsa, dSt + c * TC_CHUNK, lane);
            dq_add_ds_k<NO>(dq, dsa, Kt + 16 * c * LD, LD, lane);
        }
    }

    store_dq<NO>(dqkv, dqkv_lp, dq, b, h, r0 + g, T, C3, hs, t, scale, vec2);
}
