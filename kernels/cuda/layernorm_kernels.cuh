/* The LayerNorm kernels of kernels/cuda/layernorm.cu, which includes this file
 * after cuda.cuh; tests/gpu_emu/layernorm_emu.cpp compiles the same code on
 * the CPU. Over channels, eps 1e-5, as kernels/cpu/layernorm.c.
 *
 * Register path (C a multiple of 4, at most 128·LN_MAX_VEC, pointers 16-byte
 * aligned; GPT-2's C = 768): one warp per row, the row in registers, V =
 * ceil(C/128) float4s per lane (lane l holds float4s l, l + 32, ...), so inp,
 * dout, dinp and out move once each in coalesced 16-byte accesses (their bf16
 * copies, out's and dinp's, and dout in bf16, in 8-byte ones). Other shapes run
 * the scalar kernels at the end. The backward kernels take dout as float or, in
 * bf16 mode where the matmul backward before wrote only its copy, __nv_bfloat16. */
#define LN_EPS 1e-5f
#define LN_WARPS 8           /* warps (rows in flight) per 256-thread block */
#define LN_THREADS (32 * LN_WARPS)
#define LN_MAX_VEC 8         /* float4s per lane: C ≤ 1024 */
#define LN_BWD_ROWS 64       /* rows per backward block: 256 blocks at B·T = 16384, one wave */
#define LN_ROWS 256          /* rows per block of the scalar parameter-gradient partial sums */

/* Lane `lane`'s values of a row: x[4j .. 4j+3] = row's float4 lane + 32·j, 0 past C/4. */
template <int V>
__device__ static inline void ln_load(float (&x)[4 * V], const float *row, int C4, int lane)
{
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = lane + 32 * j;
        const float4 t = i < C4 ? reinterpret_cast<const float4 *>(row)[i]
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        x[4 * j] = t.x, x[4 * j + 1] = t.y, x[4 * j + 2] = t.z, x[4 * j + 3] = t.w;
    }
}

/* ln_load from bf16 (dout's copy): 4 values, 8 bytes, per float4 slot. */
template <int V>
__device__ static inline void ln_load(float (&x)[4 * V], const __nv_bfloat16 *row, int C4,
                                      int lane)
{
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int i = lane + 32 * j;
        const uint2 t = i < C4 ? reinterpret_cast<const uint2 *>(row)[i] : make_uint2(0u, 0u);
        x[4 * j] = __uint_as_float(t.x << 16);
        x[4 * j + 1] = __uint_as_float(t.x & 0xffff0000u);
        x[4 * j + 2] = __uint_as_float(t.y << 16);
        x[4 * j + 3] = __uint_as_float(t.y & 0xffff0000u);
    }
}

/* One value of a float or bf16 row (the scalar kernels' dout). */
__device__ static inline float ln_value(const float *p, long i) { return p[i]; }
__device__ static inline float ln_value(const __nv_bfloat16 *p, long i)
{
    return __uint_as_float((unsigned)__bfloat16_as_ushort(p[i]) << 16);
}

/* The inverse of ln_load (what lies past C/4 is not stored). */
template <int V>
__device__ static inline void ln_store(float *row, const float (&x)[4 * V], int C4, int lane)
{
#pragma unroll
    for (int j = 0; j < V; j++)
        if (lane + 32 * j < C4)
            reinterpret_cast<float4 *>(row)[lane + 32 * j] =
                make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
}

/* The bf16 copy (round to nearest even): 4 values, 8 bytes, per float4. */
template <int V>
__device__ static inline void ln_store_bf16(__nv_bfloat16 *row, const float (&x)[4 * V], int C4,
                                            int lane)
{
#pragma unroll
    for (int j = 0; j < V; j++)
        if (lane + 32 * j < C4)
            reinterpret_cast<uint2 *>(row)[lane + 32 * j] = make_uint2(
                bf16_pair(x[4 * j], x[4 * j + 1]), bf16_pair(x[4 * j + 2], x[4 * j + 3]));
}

/* out = (x − mean)·rstd·w + b, one warp per row, LN_WARPS rows per block; the
 * variance from the registers (two passes over the row, one read of memory). With
 * out_lp only its bf16 copy is stored (kernels.h: out may be left unwritten). */
template <int V>
__global__ static void __launch_bounds__(LN_THREADS)
layernorm_forward_vec_kernel(float *out, __nv_bfloat16 *out_lp, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, long BT, int C)
{
    const long row = (long)blockIdx.x * LN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, C4 = C / 4;
    if (row >= BT) return;
    float x[4 * V];
    ln_load<V>(x, inp + row * C, C4, lane);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4 * V; k++) s += x[k]; /* zeros past C */
    const float m = warp_sum(s) / (float)C;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < 4 * V; k++)
        if (lane + 32 * (k / 4) < C4) v += (x[k] - m) * (x[k] - m);
    const float r = rsqrtf(warp_sum(v) / (float)C + LN_EPS);
    float wv[4 * V], bv[4 * V];
    ln_load<V>(wv, w, C4, lane);
    ln_load<V>(bv, b, C4, lane);
#pragma unroll
    for (int k = 0; k < 4 * V; k++) x[k] = (r * (x[k] - m)) * wv[k] + bv[k];
    if (out_lp) /* the matmuls read out through its copy: out is left unwritten */
        ln_store_bf16<V>(out_lp + row * C, x, C4, lane);
    else
        ln_store<V>(out + row * C, x, C4, lane);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* dst[c] = Σ over the block's warps, in warp order, of each warp's acc (one
 * float4 write per lane into shared memory, then one column per thread). */
template <int V>
__device__ static void ln_block_sum(float4 (*sh)[32 * V], const float (&acc)[4 * V], float *dst,
                                    int C4)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* sh free: an earlier call's readers are done */
#pragma unroll
    for (int j = 0; j < V; j++)
        sh[warp][lane + 32 * j] =
            make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    __syncthreads();
    for (int i = threadIdx.x; i < C4; i += LN_THREADS) {
        float4 t = sh[0][i];
        for (int y = 1; y < LN_WARPS; y++) {
            const float4 u = sh[y][i];
            t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
        }
        reinterpret_cast<float4 *>(dst)[i] = t;
    }
}

/* dinp += rstd·(w·dout − mean(w·dout) − norm·mean(w·dout·norm)), one warp per
 * row, with dinp_lp (where given) = the bf16 of the sum, from the registers that
 * store it (no second pass over dinp for the matmuls that read it next); and
 * the parameter gradients: each lane sums dout·norm and dout of its
 * channels over its warp's rows (r0 + warp, + LN_WARPS, ...) in registers;
 * the block adds its warps in order into partial[blockIdx.x] (dweight) and
 * partial[gridDim.x + blockIdx.x] (dbias), which kn_cuda_sum_partials adds in
 * order: no atomics, the same result every run. 16·V values live a lane
 * (norm, dnorm, dweight, dbias): up to V = 6 that fits 2 blocks an SM. D: dout's
 * type, float or __nv_bfloat16. */
template <int V, typename D>
__global__ static void __launch_bounds__(LN_THREADS, V <= 6 ? 2 : 1)
layernorm_backward_vec_kernel(float *dinp, __nv_bfloat16 *dinp_lp, float *partial,
                              const D *dout, const float *inp, const float *w,
                              const float *mean, const float *rstd, long BT, int C)
{
    __shared__ float4 sh[LN_WARPS][32 * V];
    const int lane = threadIdx.x % 32, C4 = C / 4;
    const long r0 = (long)blockIdx.x * LN_BWD_ROWS, r1 = min(r0 + LN_BWD_ROWS, BT);
    float dw[4 * V] = {}, db[4 * V] = {};
    for (long row = r0 + threadIdx.x / 32; row < r1; row += LN_WARPS) {
        float n[4 * V], g[4 * V];
        ln_load<V>(n, inp + row * C, C4, lane);
        ln_load<V>(g, dout + row * C, C4, lane);
        const float m = mean[row], r = rstd[row];
        float a = 0.0f, bsum = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            float wj[4]; /* the weights a float4 at a time: fewer registers live */
            ln_load<1>(wj, w + 128 * j, C4 - 32 * j, lane);
#pragma unroll
            for (int k = 4 * j; k < 4 * j + 4; k++) { /* g = 0 past C: nothing added there */
                n[k] = (n[k] - m) * r;
                dw[k] += g[k] * n[k];
                db[k] += g[k];
                g[k] *= wj[k - 4 * j]; /* dnorm */
                a += g[k];
                bsum += g[k] * n[k];
            }
        }
        const float dnorm_mean = warp_sum(a) / (float)C;
        const float dnorm_norm_mean = warp_sum(bsum) / (float)C;
        float4 *dx = reinterpret_cast<float4 *>(dinp + row * C);
#pragma unroll
        for (int j = 0; j < V; j++) /* a float4 at a time: fewer registers live */
            if (lane + 32 * j < C4) {
                float4 t = dx[lane + 32 * j];
                const float *gj = g + 4 * j, *nj = n + 4 * j;
                t.x += (gj[0] - dnorm_mean - nj[0] * dnorm_norm_mean) * r;
                t.y += (gj[1] - dnorm_mean - nj[1] * dnorm_norm_mean) * r;
                t.z += (gj[2] - dnorm_mean - nj[2] * dnorm_norm_mean) * r;
                t.w += (gj[3] - dnorm_mean - nj[3] * dnorm_norm_mean) * r;
                dx[lane + 32 * j] = t;
                if (dinp_lp)
                    reinterpret_cast<uint2 *>(dinp_lp + row * C)[lane + 32 * j] =
                        make_uint2(bf16_pair(t.x, t.y), bf16_pair(t.z, t.w));
            }
    }
    ln_block_sum<V>(sh, dw, partial + (size_t)blockIdx.x * C, C4);
    ln_block_sum<V>(sh, db, partial + (size_t)(gridDim.x + blockIdx.x) * C, C4);
}

/* float4s per lane of the register path for C, 0 where the scalar kernels run. */
static inline int ln_vec(int C, bool aligned16)
{
    return aligned16 && C % 4 == 0 && C <= 128 * LN_MAX_VEC ? (C + 127) / 128 : 0;
}

static inline bool ln_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static inline bool ln_aligned8(const void *p) { return ((uintptr_t)p & 7) == 0; }

typedef void (*ln_forward_fn)(float *, __nv_bfloat16 *, float *, float *, const float *,
                              const float *, const float *, long, int);
template <typename D>
using ln_backward_fn = void (*)(float *, __nv_bfloat16 *, float *, const D *, const float *,
                                const float *, const float *, const float *, long, int);
#define LN_EACH_VEC(k) {k<1>, k<2>, k<3>, k<4>, k<5>, k<6>, k<7>, k<8>}
#define LN_EACH_VEC_D(k, D) {k<1, D>, k<2, D>, k<3, D>, k<4, D>, k<5, D>, k<6, D>, k<7, D>, k<8, D>}
/* The register-path kernels by V − 1 (the backward's by dout's type too). */
static const ln_forward_fn ln_forward_vec[LN_MAX_VEC] = LN_EACH_VEC(layernorm_forward_vec_kernel);
template <typename D>
static const ln_backward_fn<D> ln_backward_vec[LN_MAX_VEC] =
    LN_EACH_VEC_D(layernorm_backward_vec_kernel, D);

/* Scalar forward for any C and alignment: one warp per row. */
__global__ static void __launch_bounds__(LN_THREADS)
layernorm_forward_kernel(float *out, __nv_bfloat16 *out_lp, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, long BT, int C)
{
    long row = (long)blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= BT) return;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / (float)C + LN_EPS);
    float *o = out + row * C;
    for (int i = lane; i < C; i += 32) {
        const float y = (r * (x[i] - m)) * w[i] + b[i];
        if (out_lp) /* as the vector kernel: out left unwritten */
            out_lp[row * C + i] = __float2bfloat16_rn(y);
        else
            o[i] = y;
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* Scalar dinp and its bf16 copy (as layernorm_backward_vec_kernel, dout of type D),
 * one warp per row. */
template <typename D>
__global__ static void __launch_bounds__(LN_THREADS)
layernorm_dinp_kernel(float *dinp, __nv_bfloat16 *dinp_lp, const D *dout, const float *inp,
                      const float *w, const float *mean, const float *rstd, long BT, int C)
{
    long row = (long)blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= BT) return;
    const float *x = inp + row * C;
    const D *d = dout + row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bsum = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float dnorm = w[i] * ln_value(d, i);
        a += dnorm;
        bsum += dnorm * ((x[i] - m) * r);
    }
    float dnorm_mean = warp_sum(a) / (float)C, dnorm_norm_mean = warp_sum(bsum) / (float)C;
    float *di = dinp + row * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * r;
        const float v = di[i] + (w[i] * ln_value(d, i) - dnorm_mean - norm * dnorm_norm_mean) * r;
        di[i] = v;
        if (dinp_lp) dinp_lp[row * C + i] = __float2bfloat16_rn(v);
    }
}

/* Scalar parameter gradients: partial[blockIdx.y][c] = Σ dout·norm and
 * partial[gridDim.y + blockIdx.y][c] = Σ dout over the block's LN_ROWS rows;
 * 32 channels × LN_WARPS row lanes, the row lanes summed in order; dout of type D. */
template <typename D>
__global__ static void __launch_bounds__(LN_THREADS)
layernorm_params_kernel(float *partial, const D *dout, const float *inp, const float *mean,
                        const float *rstd, long BT, int C)
{
    __shared__ float sw[LN_WARPS][32], sb[LN_WARPS][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, c = blockIdx.x * 32 + tx;
    long r0 = (long)blockIdx.y * LN_ROWS, r1 = min(r0 + LN_ROWS, BT);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (long r = r0 + ty; r < r1; r += LN_WARPS) {
            float d = ln_value(dout, r * C + c);
            aw += d * ((inp[r * C + c] - mean[r]) * rstd[r]);
            ab += d;
        }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < LN_WARPS; y++) {
            tw += sw[y][tx];
            tb += sb[y][tx];
        }
        partial[(size_t)blockIdx.y * C + c] = tw;
        partial[(size_t)(gridDim.y + blockIdx.y) * C + c] = tb;
    }
}
