/* Linear layers (kernels/cpu/matmul.c) and the MLP's fused matmul + GELU pair
 * (kernels/cpu/gelu.c), in the context's precision (cuda.cuh):
 *   bf16  the fp32 operands are converted to bf16 in the workspace (each once
 *         per call: the backward's weight and dout serve both of its GEMMs)
 *         and cuBLASLt multiplies them with fp32 accumulation into fp32
 *         output, bias and GELU done by its epilogue;
 *   tf32  the same cuBLASLt calls on the fp32 operands, TF32 products;
 *   fp32  cublasGemmEx in fp32 and separate bias / GELU kernels (the
 *         reference: nothing approximated by an epilogue).
 * A GEMM that cuBLASLt cannot take (a pointer or a leading dimension that is
 * not a multiple of 16 bytes, the GELU matrix's leading dimension not a
 * multiple of 8 elements, or no algorithm from its heuristic) runs as
 * cublasGemmEx on the same operand types plus the separate kernels.
 *
 * Layouts. A row-major [R, K] matrix is a column-major [K, R] one with
 * leading dimension K, so each product is written for cuBLAS on those views
 * (' marks the column-major view, m × n the output, k the inner size):
 *   forward  out'[OC, BT]   = (W'[C, OC])ᵀ · inp'[C, BT]     m OC, n BT, k C
 *   dinp     dinp'[C, BT]  += W'[C, OC] · dout'[OC, BT]      m C,  n BT, k OC
 *   dweight  dW'[C, OC]    += inp'[C, BT] · (dout'[OC, BT])ᵀ  m C,  n OC, k BT
 * The BIAS epilogue adds a vector of m = OC entries down every column of
 * out', i.e. to every row of out; the GELU epilogues' auxiliary matrix (pre)
 * has the layout of the output (leading dimension m).
 *
 * dbias stays a separate, deterministic column sum: the BGRADB epilogue
 * overwrites its vector, and kernels.h accumulates into dbias.
 *
 * Algorithms: at a shape's first use the heuristic's first candidates are
 * timed and the fastest kept (lt_tune); a GELU / DGELU job is also timed as a
 * plain GEMM plus a separate GELU kernel (mm_split) and runs that way where it
 * was faster. */
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.cuh"

#define BIAS_ROWS 256 /* rows of dout per block of the dbias partial sums */
/* The backward converts dout and inp to bf16 in chunks of rows so that its
 * workspace stays near this size. Each chunk re-reads and re-writes the fp32
 * dweight (beta 1) and runs smaller GEMMs, so the limit is set to take the
 * GPT-2 LM head at B·T = 16384 in one piece: W 77 MB + dout and inp 1.67 GB
 * in bf16 (at 256 MiB it ran in 10 chunks, 154 MB of dweight read and written
 * each time). The workspace grows only to what a call needs.
 * PLIANT_MATMUL_BWD_MB overrides it (test_kernels_cuda sets 256, so that its
 * largest shape still takes the chunked path). */
#define BWD_BF16_BYTES ((size_t)2 << 30)

static size_t bwd_bf16_bytes(void)
{
    static size_t bytes; /* read once; every thread computes the same value */
    if (!bytes) {
        const char *e = getenv("PLIANT_MATMUL_BWD_MB");
        long mb = e ? atol(e) : 0;
        bytes = mb > 0 ? (size_t)mb << 20 : BWD_BF16_BYTES;
    }
    return bytes;
}
#define LT_CACHE_SIZE 128 /* heuristic results remembered per context */

/* The algorithm per shape: cuBLASLt's heuristic ranks algorithms by a model,
 * and its first choice is measurably slower than others on some of our shapes
 * (the GELU epilogues above all). So at the first use of a shape the GEMM is
 * timed with each of the heuristic's first LT_TUNE_ALGOS candidates
 * (LT_TUNE_RUNS runs each after one warm-up) and the fastest is kept for the
 * process. Each algorithm is deterministic (split-K reductions included: in
 * the workspace, or in place with counters that fix the order), so a run stays
 * bit-reproducible for a fixed choice; two processes may choose differently
 * (timing noise), hence the 2 % margin an earlier-ranked candidate keeps.
 * PLIANT_MATMUL_TUNE=0 takes the heuristic's first (the old behaviour), =2
 * prints each shape's times, =3 also takes the GELU split below wherever it
 * may run (so that a parity test covers it whatever the timings say). */
#define LT_TUNE_ALGOS 16
#define LT_TUNE_RUNS 3
/* A GEMM that accumulates (beta 1) is timed on a scratch copy of D's size,
 * not on D; above this size it is not timed (the heuristic's first). */
#define LT_TUNE_SCRATCH_MAX ((size_t)512 << 20)

static int tune_mode(void)
{
    static int mode = -1; /* read once; every thread computes the same value */
    if (mode < 0) {
        const char *e = getenv("PLIANT_MATMUL_TUNE");
        mode = e && *e ? atoi(e) : 1;
    }
    return mode;
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The largest power of two (≤ 256) that divides the address. */
static unsigned align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 1;
    while (al < 256 && !(a & al)) al <<= 1;
    return al;
}

/* ---- vector loads and stores ------------------------------------------------ */

/* VEC consecutive values as floats: one value, or 8 from a 16-byte aligned
 * address (one 16-byte load of bf16, two of fp32); store_cols writes them back. */
template <int VEC>
__device__ static inline void load_cols(float *v, const float *p)
{
    if (VEC == 1) {
        v[0] = p[0];
        return;
    }
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <int VEC>
__device__ static inline void load_cols(float *v, const __nv_bfloat16 *p)
{
    if (VEC == 1) {
        v[0] = __bfloat162float(p[0]);
        return;
    }
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

template <int VEC>
__device__ static inline void store_cols(float *p, const float *v)
{
    if (VEC == 1) {
        p[0] = v[0];
        return;
    }
    ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

template <int VEC>
__device__ static inline void store_cols(__nv_bfloat16 *p, const float *v)
{
    if (VEC == 1) {
        p[0] = __float2bfloat16_rn(v[0]);
        return;
    }
    *(uint4 *)p = make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]),
                             bf16_pair(v[6], v[7]));
}

/* ---- fp32 → bf16 (round to nearest even) ------------------------------------ */

/* 4 floats in (16 bytes), 4 bf16 out (8 bytes) per step; little-endian, so
 * the lower half of each word is the earlier element. */
__global__ static void to_bf16_vec_kernel(uint2 *dst, const float4 *src, size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = src[i];
        dst[i] = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
    }
}

__global__ static void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* dst[0, n) = bf16(src[0, n)); either may be anywhere (a parameter inside the
 * parameter block; dst mostly carved from the workspace, 256-byte aligned). */
static const void *to_bf16(kn_ctx *k, void *dst, const float *src, size_t n)
{
    size_t n4 = (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 8 == 0 ? n / 4 : 0;
    if (n4) {
        to_bf16_vec_kernel<<<kn_blocks(n4, 256), 256, 0, kn_stream(k)>>>(
            (uint2 *)dst, (const float4 *)src, n4);
        CUDA_LAUNCHED();
    }
    if (n > 4 * n4) {
        to_bf16_kernel<<<kn_blocks(n - 4 * n4, 256), 256, 0, kn_stream(k)>>>(
            (__nv_bfloat16 *)dst + 4 * n4, src + 4 * n4, n - 4 * n4);
        CUDA_LAUNCHED();
    }
    return dst;
}

/* ---- the separate kernels (fp32 mode and the fallback) ---------------------- */

/* out = bias (per row of OC, out's type; NULL: 0) + c (a matrix of out's shape;
 * NULL: 0). */
template <typename T>
__global__ static void fill_bias_kernel(T *out, const T *bias, const float *c, int OC, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = (T)((bias ? (float)bias[i % OC] : 0.0f) + (c ? c[i] : 0.0f));
}

/* On the column-major m × cols matrices pre and out (leading dimension ld):
 * pre += bias (per row; bias may be NULL), out = gelu(pre). */
__global__ static void bias_gelu_kernel(float *out, float *pre, const float *bias, int m, int ld,
                                        size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t col = i / (size_t)m, at = col * (size_t)ld + (i - col * (size_t)m);
        float x = pre[at];
        if (bias) x += bias[i - col * (size_t)m];
        pre[at] = x;
        out[at] = kn_gelu(x);
    }
}

/* d ⊙= gelu'(pre), both column-major m × cols with leading dimension ld. */
__global__ static void gelu_scale_kernel(float *d, const float *pre, int m, int ld, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t col = i / (size_t)m, at = col * (size_t)ld + (i - col * (size_t)m);
        d[at] *= kn_gelu_grad(pre[at]);
    }
}

/* The GELU epilogue done apart, on a contiguous pre / D, 4 elements a thread
 * step: D = gelu(pre) (forward), or D ⊙= gelu'(pre) (backward), and D's bf16
 * copy where lp is given (in the same pass: D is not read again to make it).
 * The same kn_gelu / kn_gelu_grad as the fp32 path and the CPU. */
template <bool GRAD>
__global__ static void gelu_vec_kernel(float4 *d, uint2 *lp, bool lp_only, const float4 *pre,
                                       size_t n4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 p = pre[i], v;
        if (GRAD) {
            v = d[i];
            v.x *= kn_gelu_grad(p.x);
            v.y *= kn_gelu_grad(p.y);
            v.z *= kn_gelu_grad(p.z);
            v.w *= kn_gelu_grad(p.w);
        } else {
            v = make_float4(kn_gelu(p.x), kn_gelu(p.y), kn_gelu(p.z), kn_gelu(p.w));
        }
        if (!lp_only) d[i] = v;
        if (lp) lp[i] = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
    }
}

template <bool GRAD>
__global__ static void gelu_flat_kernel(float *d, const float *pre, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = GRAD ? d[i] * kn_gelu_grad(pre[i]) : kn_gelu(pre[i]);
}

/* The MLP's GELU in bf16 mode, where pre is kept in bf16 and the results are
 * bf16 too (hence the fast tanh: kn_tanh), VEC values a thread:
 * forward y = gelu(pre); GRAD: y = d ⊙ gelu'(pre), with d the product read from
 * d16 where given, else from d32. y goes to y16 where given, else to y32; either
 * may be d's own memory (each thread reads its values before writing them). */
template <bool GRAD, int VEC>
__global__ static void gelu_bf16_kernel(float *y32, __nv_bfloat16 *y16, const float *d32,
                                        const __nv_bfloat16 *d16, const __nv_bfloat16 *pre,
                                        size_t n)
{
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * VEC; i < n;
         i += (size_t)gridDim.x * blockDim.x * VEC) {
        float p[VEC], v[VEC];
        load_cols<VEC>(p, pre + i);
        if (GRAD) {
            if (d16) load_cols<VEC>(v, d16 + i);
            else load_cols<VEC>(v, d32 + i);
            for (int e = 0; e < VEC; e++) v[e] *= kn_gelu_grad<true>(p[e]);
        } else {
            for (int e = 0; e < VEC; e++) v[e] = kn_gelu<true>(p[e]);
        }
        if (y16) store_cols<VEC>(y16 + i, v);
        else store_cols<VEC>(y32 + i, v);
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* gelu_bf16_kernel over n values: 8 a thread where every pointer allows. */
static void gelu_bf16(kn_ctx *k, bool grad, float *y32, void *y16, const float *d32,
                      const void *d16, const __nv_bfloat16 *pre, size_t n)
{
    __nv_bfloat16 *o16 = (__nv_bfloat16 *)y16;
    const __nv_bfloat16 *i16 = (const __nv_bfloat16 *)d16;
    const bool vec = n % 8 == 0 && aligned16(y32) && aligned16(y16) && aligned16(d32) &&
                     aligned16(d16) && aligned16(pre);
    const unsigned blocks = kn_blocks(vec ? n / 8 : n, 256);
    if (grad && vec)
        gelu_bf16_kernel<true, 8><<<blocks, 256, 0, kn_stream(k)>>>(y32, o16, d32, i16, pre, n);
    else if (grad)
        gelu_bf16_kernel<true, 1><<<blocks, 256, 0, kn_stream(k)>>>(y32, o16, d32, i16, pre, n);
    else if (vec)
        gelu_bf16_kernel<false, 8><<<blocks, 256, 0, kn_stream(k)>>>(y32, o16, d32, i16, pre, n);
    else
        gelu_bf16_kernel<false, 1><<<blocks, 256, 0, kn_stream(k)>>>(y32, o16, d32, i16, pre, n);
    CUDA_LAUNCHED();
}

/* ---- one GEMM with its epilogue ---------------------------------------------- */

enum {
    EPI_NONE,  /* D = op(A)·op(B) + beta·D, or + C */
    EPI_BIAS,  /* D = op(A)·op(B) + bias (beta 0), or + C + bias */
    EPI_GELU,  /* aux = op(A)·op(B) + bias (bias may be NULL), D = gelu(aux) (beta 0) */
    EPI_DGELU, /* D = (op(A)·op(B)) ⊙ gelu'(aux) (beta 0) */
};

/* Column-major sizes as cuBLAS sees them. A and B are bf16 in bf16 mode, fp32
 * otherwise; D, bias and aux are fp32; aux has D's leading dimension. */
typedef struct {
    bool ta, tb;
    int m, n, k;
    float alpha; /* the product's factor: 1 but for the LM head's unscaled dlogits */
    const void *A;
    int lda;
    const void *B;
    int ldb;
    float beta;
    float *D;
    int ldd;
    int epi;
    const float *bias; /* fp32; with d16 bf16 (D's type, as cuBLASLt takes it), pointer cast */
    float *aux; /* written by EPI_GELU, read by EPI_DGELU */
    void *lp;   /* EPI_GELU / EPI_DGELU, contiguous D (ldd = m): D's bf16 copy too, or NULL */
    bool lp_only; /* with lp: D's fp32 values may be left unwritten (only the copy is read) */
    bool d16;   /* D is bf16 (EPI_NONE or EPI_BIAS, beta 0; D's pointer cast) */
    const float *C; /* EPI_NONE / EPI_BIAS, contiguous D (ldd = m): added to the product
                       (cuBLAS's C with beta 1), a matrix of D's shape not overlapping D */
} mm_job;

static cudaDataType_t d_type(const mm_job *j) { return j->d16 ? CUDA_R_16BF : CUDA_R_32F; }
static size_t d_size(const mm_job *j) { return j->d16 ? 2 : 4; }

static cudaDataType_t ab_type(kn_ctx *k) { return k->cuda->bf16 ? CUDA_R_16BF : CUDA_R_32F; }

static void gemm_ex(kn_ctx *k, const mm_job *j, float beta, float *D)
{
    const float alpha = j->alpha;
    cudaDataType_t t = ab_type(k);
    CUBLAS_CHECK(cublasGemmEx(k->cuda->blas, j->ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              j->tb ? CUBLAS_OP_T : CUBLAS_OP_N, j->m, j->n, j->k, &alpha, j->A, t,
                              j->lda, j->B, t, j->ldb, &beta, D, d_type(j), j->ldd,
                              k->cuda->compute, CUBLAS_GEMM_DEFAULT));
}

/* cublasGemmEx and the separate kernels. */
static void mm_fallback(kn_ctx *k, const mm_job *j)
{
    size_t n = (size_t)j->m * (size_t)j->n;
    switch (j->epi) {
    case EPI_NONE:
    case EPI_BIAS:
        if (j->epi == EPI_NONE && !j->C) {
            gemm_ex(k, j, j->beta, j->D);
            break;
        } /* D is contiguous here (ldd = m): fill it with bias and C, add the product */
        if (j->d16)
            fill_bias_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(
                (__nv_bfloat16 *)j->D, (const __nv_bfloat16 *)j->bias, NULL, j->m, n);
        else
            fill_bias_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(
                j->D, j->epi == EPI_BIAS ? j->bias : NULL, j->C, j->m, n);
        CUDA_LAUNCHED();
        gemm_ex(k, j, 1.0f, j->D);
        break;
    case EPI_GELU:
        gemm_ex(k, j, 0.0f, j->aux);
        bias_gelu_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(j->D, j->aux, j->bias, j->m,
                                                                      j->ldd, n);
        CUDA_LAUNCHED();
        break;
    case EPI_DGELU:
        gemm_ex(k, j, 0.0f, j->D);
        gelu_scale_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(j->D, j->aux, j->m, j->ldd,
                                                                       n);
        CUDA_LAUNCHED();
        break;
    }
}

/* Heuristic results per problem: the key holds everything the choice depends
 * on, the alignments of the pointers included (the heuristic reads the bias
 * and aux pointers' values for theirs, and is told A's to D's). */
#define LT_KEY 19
typedef struct {
    int key[LT_KEY];
    bool ok;    /* false: no algorithm, take the fallback */
    bool split; /* GELU / DGELU: the plain GEMM and a separate kernel timed faster */
    cublasLtMatmulAlgo_t algo;
} lt_entry;

typedef struct {
    int used, next; /* entries filled; the one to replace when full */
    lt_entry e[LT_CACHE_SIZE];
} lt_cache;

static void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v,
                     size_t bytes)
{
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, v, bytes));
}

static const char *epi_name(int epi)
{
    return epi == EPI_BIAS ? "BIAS" : epi == EPI_GELU ? "GELU_AUX" : epi == EPI_DGELU ? "DGELU" : "none";
}

/* The bytes D spans (aux, where there is one, spans the same: D's ld). */
static size_t d_extent(const mm_job *j)
{
    return ((size_t)j->ldd * (size_t)(j->n - 1) + (size_t)j->m) * d_size(j);
}

/* Does D share memory with the aux matrix that EPI_DGELU reads (dpre written
 * over pre)? Then neither timing in place nor the split below may run. */
static bool d_over_aux(const mm_job *j)
{
    if (j->epi != EPI_GELU && j->epi != EPI_DGELU) return false;
    const size_t bytes = d_extent(j);
    const char *d0 = (const char *)j->D, *a0 = (const char *)j->aux;
    return a0 < d0 + bytes && d0 < a0 + bytes;
}

static void mm(kn_ctx *k, const mm_job *j);

/* A GELU / DGELU job as a plain GEMM (its own cuBLASLt algorithm, tuned at its
 * own first use) and then the elementwise GELU kernel above: for a
 * contiguous D (ldd = m) that does not overlap aux. The split moves more
 * bytes (the forward writes pre, then reads it back and writes out: 3 passes
 * instead of 2; the backward writes D, then reads D and pre and writes D: 4
 * instead of 2), so it is only taken where the fused epilogue timed slower
 * (lt_tune's caller compares both). */
static void mm_split(kn_ctx *k, const mm_job *j)
{
    mm_job p = *j;
    p.beta = 0.0f;
    p.aux = NULL;
    p.lp = NULL;
    if (j->epi == EPI_GELU) { /* pre = product + bias */
        p.D = j->aux;
        p.epi = j->bias ? EPI_BIAS : EPI_NONE;
    } else { /* D = product */
        p.epi = EPI_NONE;
    }
    p.bias = p.epi == EPI_BIAS ? j->bias : NULL;
    mm(k, &p);
    const size_t n = (size_t)j->m * (size_t)j->n;
    const bool grad = j->epi == EPI_DGELU;
    if (n % 4 == 0 && (uintptr_t)j->D % 16 == 0 && (uintptr_t)j->aux % 16 == 0 &&
        (uintptr_t)j->lp % 8 == 0) {
        if (grad)
            gelu_vec_kernel<true><<<kn_blocks(n / 4, 256), 256, 0, kn_stream(k)>>>(
                (float4 *)j->D, (uint2 *)j->lp, j->lp && j->lp_only, (const float4 *)j->aux,
                n / 4);
        else
            gelu_vec_kernel<false><<<kn_blocks(n / 4, 256), 256, 0, kn_stream(k)>>>(
                (float4 *)j->D, (uint2 *)j->lp, j->lp && j->lp_only, (const float4 *)j->aux,
                n / 4);
        CUDA_LAUNCHED();
        return;
    }
    if (grad)
        gelu_flat_kernel<true><<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(j->D, j->aux, n);
    else
        gelu_flat_kernel<false><<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(j->D, j->aux, n);
    CUDA_LAUNCHED();
    if (j->lp) to_bf16(k, j->lp, j->D, n);
}

/* mm_split's time per run (its first run, untimed, tunes its GEMM); waits for
 * the stream. It rewrites D and aux as the fused job would: the caller's run
 * of the chosen path writes them last. */
static float time_split(kn_ctx *k, const mm_job *j)
{
    mm_split(k, j);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, kn_stream(k)));
    for (int r = 0; r < LT_TUNE_RUNS; r++) mm_split(k, j);
    CUDA_CHECK(cudaEventRecord(e1, kn_stream(k)));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    return ms / LT_TUNE_RUNS;
}

/* The index in cand[0, n) of the fastest algorithm for this GEMM (0 where it
 * cannot be timed; *best_ms_out its time per run where timed in place, else
 * 0), by CUDA events on the context's stream; waits for the
 * stream. A GEMM that overwrites D from its inputs alone (beta 0 or a C
 * apart from D, D not overlapping the aux it reads) is timed in place: every run writes the same
 * D (and aux), and the caller's run with the chosen algorithm writes them
 * last. Otherwise (beta 1 reads D; dpre written over pre) the runs go to a
 * scratch buffer of D's size, so that D is never touched here. */
static int lt_tune(kn_ctx *k, const mm_job *j, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, float beta,
                   const cublasLtMatmulAlgo_t *cand, int n, float *best_ms_out)
{
    *best_ms_out = 0.0f; /* 0: not timed in place */
    struct kn_cuda *c = k->cuda;
    const float alpha = j->alpha;
    const size_t d_bytes = d_extent(j);
    const bool overlap = j->epi == EPI_DGELU && d_over_aux(j); /* runs would read their own D */
    float *D = j->D;
    void *scratch = NULL;
    if ((beta != 0.0f && !j->C) || overlap) {
        if (d_bytes > LT_TUNE_SCRATCH_MAX) return 0;
        if (cudaMalloc(&scratch, d_bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* out of memory is not sticky: clear it, don't time */
            return 0;
        }
        D = (float *)scratch;
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    int best = 0;
    float best_ms = 0.0f, ms_of[LT_TUNE_ALGOS];
    bool any = false;
    for (int i = 0; i < n; i++) {
        ms_of[i] = -1.0f;
        bool ran = true;
        CUDA_CHECK(cudaEventRecord(e0, kn_stream(k)));
        for (int r = 0; r <= LT_TUNE_RUNS && ran; r++) {
            if (r == 1) CUDA_CHECK(cudaEventRecord(e0, kn_stream(k))); /* run 0 warms up */
            const void *C = j->C ? (const void *)j->C : D;
            cublasStatus_t s = cublasLtMatmul(c->lt, op, &alpha, j->A, la, j->B, lb, &beta, C, ld,
                                              D, ld, &cand[i], c->lt_ws, c->lt_ws_bytes,
                                              kn_stream(k));
            ran = s == CUBLAS_STATUS_SUCCESS; /* a refused candidate is skipped */
        }
        CUDA_CHECK(cudaEventRecord(e1, kn_stream(k)));
        CUDA_CHECK(cudaEventSynchronize(e1));
        if (!ran) continue;
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ms_of[i] = ms / LT_TUNE_RUNS;
        /* an earlier-ranked candidate keeps its place unless beaten by 2 %:
         * the choice then changes less with timing noise */
        if (!any || ms < 0.98f * best_ms) {
            best = i;
            best_ms = ms;
            any = true;
        }
    }
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    const bool on_scratch = scratch != NULL;
    if (scratch) CUDA_CHECK(cudaFree(scratch));
    if (tune_mode() >= 2) {
        fprintf(stderr, "pliant kernels (cuda): matmul %s m %d n %d k %d beta %g: candidate %d of",
                epi_name(j->epi), j->m, j->n, j->k, beta, best);
        for (int i = 0; i < n; i++) fprintf(stderr, " %.3f", ms_of[i]);
        fprintf(stderr, " ms%s\n", on_scratch ? " (on scratch)" : "");
    }
    if (!on_scratch && any) *best_ms_out = best_ms / LT_TUNE_RUNS;
    return best;
}

/* 16-byte rows and pointers: what the tensor-core kernels load with; a C of D's
 * contiguous shape; aux's ld a multiple of 8. */
static bool lt_takes(const kn_ctx *k, const mm_job *j)
{
    const size_t es = k->cuda->bf16 ? 2 : 4;
    const bool has_aux = j->epi == EPI_GELU || j->epi == EPI_DGELU;
    const bool has_bias = (j->epi == EPI_BIAS || j->epi == EPI_GELU) && j->bias;
    if ((uintptr_t)j->A % 16 || (uintptr_t)j->B % 16 || (uintptr_t)j->D % 16) return false;
    if (((size_t)j->lda * es) % 16 || ((size_t)j->ldb * es) % 16 ||
        ((size_t)j->ldd * d_size(j)) % 16)
        return false;
    if (has_bias && (uintptr_t)j->bias % 16) return false;
    if (has_aux && ((uintptr_t)j->aux % 16 || j->ldd % 8)) return false;
    return !j->C || ((uintptr_t)j->C % 16 == 0 && j->ldd == j->m);
}

/* One GEMM as cuBLASLt describes it, and what its cache key holds. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtEpilogue_t epi;
    bool has_bias, has_aux;
    float beta;
    unsigned alA, alB, alC, alD;
} lt_desc;

static cublasLtEpilogue_t lt_epilogue(const mm_job *j, bool has_bias)
{
    if (j->epi == EPI_BIAS) return CUBLASLT_EPILOGUE_BIAS;
    if (j->epi == EPI_GELU)
        return has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (j->epi == EPI_DGELU) return CUBLASLT_EPILOGUE_DGELU;
    return CUBLASLT_EPILOGUE_DEFAULT;
}

/* Everything but the descriptors, which lt_desc_create adds. */
static void lt_desc_init(const mm_job *j, lt_desc *d)
{
    d->has_aux = j->epi == EPI_GELU || j->epi == EPI_DGELU;
    d->has_bias = (j->epi == EPI_BIAS || j->epi == EPI_GELU) && j->bias;
    d->epi = lt_epilogue(j, d->has_bias);
    d->beta = j->C ? 1.0f : j->epi == EPI_NONE ? j->beta : 0.0f;
    d->alA = align_of(j->A), d->alB = align_of(j->B), d->alD = align_of(j->D);
    d->alC = j->C ? align_of(j->C) : d->alD;
}

static void lt_key(const kn_ctx *k, const mm_job *j, const lt_desc *d, int *key)
{
    const int v[LT_KEY] = {(int)d->epi, j->ta, j->tb, j->m, j->n, j->k, j->lda, j->ldb, j->ldd,
                           d->beta != 0.0f, (int)d->alA, (int)d->alB, (int)d->alD,
                           d->has_bias ? (int)align_of(j->bias) : 0,
                           d->has_aux ? (int)align_of(j->aux) : 0, (int)k->cuda->compute,
                           d_over_aux(j), j->d16, j->C ? (int)d->alC : 0};
    memcpy(key, v, sizeof v);
}

static void lt_desc_create(kn_ctx *k, const mm_job *j, lt_desc *d)
{
    cudaDataType_t t = ab_type(k);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d->op, k->cuda->compute, CUDA_R_32F));
    cublasOperation_t ta = j->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = j->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_attr(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    set_attr(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    set_attr(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &d->epi, sizeof d->epi);
    if (d->has_bias) {
        const void *bias = j->bias; /* the bias type defaults to D's */
        set_attr(d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    if (d->has_aux) { /* fp32 as well: the aux type defaults to D's */
        void *aux = j->aux;
        int64_t aux_ld = j->ldd;
        set_attr(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        set_attr(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    }
    /* stored shapes: op(A) is m × k, op(B) is k × n */
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d->la, t, j->ta ? j->k : j->m, j->ta ? j->m : j->k, j->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d->lb, t, j->tb ? j->n : j->k, j->tb ? j->k : j->n, j->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d->ld, d_type(j), j->m, j->n, j->ldd));
}

static void lt_desc_destroy(lt_desc *d)
{
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->lb));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d->la));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(d->op));
}

static lt_cache *cache_of(kn_ctx *k)
{
    struct kn_cuda *c = k->cuda;
    if (!c->lt_cache && !(c->lt_cache = calloc(1, sizeof(lt_cache))))
        kn_cuda_fail("calloc", "out of memory", __FILE__, __LINE__);
    return (lt_cache *)c->lt_cache;
}

static lt_entry *cache_find(lt_cache *cache, const int *key)
{
    for (int i = 0; i < cache->used; i++)
        if (!memcmp(cache->e[i].key, key, sizeof cache->e[i].key)) return &cache->e[i];
    return NULL;
}

/* A free entry, or the oldest when full. */
static lt_entry *cache_slot(lt_cache *cache)
{
    if (cache->used < LT_CACHE_SIZE) return &cache->e[cache->used++];
    lt_entry *e = &cache->e[cache->next];
    cache->next = (cache->next + 1) % LT_CACHE_SIZE;
    return e;
}

/* The heuristic's usable candidates, in its order: their count (≤ LT_TUNE_ALGOS) and the
 * heuristic's status. */
static int lt_candidates(kn_ctx *k, const lt_desc *d, cublasLtMatmulAlgo_t *cand,
                         cublasStatus_t *status)
{
    struct kn_cuda *c = k->cuda;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = c->lt_ws_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t al_val[4] = {d->alA, d->alB, d->alC, d->alD};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al_val[i],
                                                          sizeof al_val[i]));
    cublasLtMatmulHeuristicResult_t res[LT_TUNE_ALGOS];
    memset(res, 0, sizeof res);
    int found = 0;
    *status = cublasLtMatmulAlgoGetHeuristic(c->lt, d->op, d->la, d->lb, d->ld, d->ld, pref,
                                             tune_mode() ? LT_TUNE_ALGOS : 1, res, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    int n = 0;
    for (int i = 0; *status == CUBLAS_STATUS_SUCCESS && i < found && i < LT_TUNE_ALGOS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= c->lt_ws_bytes)
            cand[n++] = res[i].algo;
    return n;
}

/* GELU epilogues: the fused best against the split (only where the fused one was timed
 * in place, so never with D over aux). */
static bool lt_split_faster(kn_ctx *k, const mm_job *j, float fused_ms)
{
    if ((j->epi != EPI_GELU && j->epi != EPI_DGELU) || fused_ms <= 0.0f || j->ldd != j->m ||
        d_over_aux(j))
        return false;
    const float split_ms = time_split(k, j);
    const bool split = split_ms < 0.98f * fused_ms || tune_mode() == 3; /* 3: test the split */
    if (tune_mode() >= 2)
        fprintf(stderr, "pliant kernels (cuda): matmul %s m %d n %d k %d: fused %.3f ms, "
                "GEMM + separate GELU %.3f ms: %s\n", epi_name(j->epi), j->m, j->n, j->k,
                fused_ms, split_ms, split ? "separate" : "fused");
    return split;
}

/* The cache entry for key, chosen now: the candidates timed, the split timed against the
 * fastest (before the entry is taken: the split's own GEMM may take a slot). */
static lt_entry *lt_choose(kn_ctx *k, const mm_job *j, const lt_desc *d, const int *key)
{
    cublasLtMatmulAlgo_t cand[LT_TUNE_ALGOS];
    cublasStatus_t s;
    const int ncand = lt_candidates(k, d, cand, &s);
    float fused_ms = 0.0f;
    const int pick =
        ncand > 1 ? lt_tune(k, j, d->op, d->la, d->lb, d->ld, d->beta, cand, ncand, &fused_ms) : 0;
    const bool split = ncand > 0 && lt_split_faster(k, j, fused_ms);
    lt_entry *e = cache_slot(cache_of(k));
    memcpy(e->key, key, sizeof e->key);
    e->ok = ncand > 0;
    e->split = split;
    if (e->ok) e->algo = cand[pick];
    else /* unexpected for an aligned problem: say so once per shape */
        fprintf(stderr,
                "pliant kernels (cuda): no cuBLASLt algorithm for epilogue %s, m %d n %d k %d "
                "(%s): cublasGemmEx and separate kernels instead\n",
                epi_name(j->epi), j->m, j->n, j->k,
                s != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(s) : "none found");
    return e;
}

/* Runs the entry's algorithm; false when cuBLASLt refused it (nothing queued; the entry
 * then sends the shape to the fallback from now on). */
static bool lt_run(kn_ctx *k, const mm_job *j, const lt_desc *d, lt_entry *e)
{
    struct kn_cuda *c = k->cuda;
    const float alpha = j->alpha;
    const void *C = j->C ? (const void *)j->C : j->D;
    cublasStatus_t s = cublasLtMatmul(c->lt, d->op, &alpha, j->A, d->la, j->B, d->lb, &d->beta, C,
                                      d->ld, j->D, d->ld, &e->algo, c->lt_ws, c->lt_ws_bytes,
                                      kn_stream(k));
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
        e->ok = false; /* say so once */
        fprintf(stderr,
                "pliant kernels (cuda): cublasLtMatmul refused epilogue %s, m %d n %d k %d "
                "(%s): cublasGemmEx and separate kernels instead\n",
                epi_name(j->epi), j->m, j->n, j->k, cublasGetStatusString(s));
        return false;
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        kn_cuda_fail("cublasLtMatmul", cublasGetStatusString(s), __FILE__, __LINE__);
    return true;
}

/* The GEMM through cuBLASLt; false (nothing queued) when it cannot take it.
 * *lp_done: D's bf16 copy written too (by the split's GELU kernel). */
static bool mm_lt(kn_ctx *k, const mm_job *j, bool *lp_done)
{
    if (!k->cuda->lt || !lt_takes(k, j)) return false;
    lt_desc d;
    lt_desc_init(j, &d);
    int key[LT_KEY];
    lt_key(k, j, &d, key);
    lt_entry *e = cache_find(cache_of(k), key);
    if (e && !e->ok) return false;
    lt_desc_create(k, j, &d);
    if (!e) e = lt_choose(k, j, &d, key);
    bool ok = e->ok;
    if (ok && e->split) { /* before e may be replaced by the split's GEMM */
        mm_split(k, j);
        *lp_done = true;
    } else if (ok) {
        ok = lt_run(k, j, &d, e);
    }
    lt_desc_destroy(&d);
    return ok;
}

static void mm(kn_ctx *k, const mm_job *j)
{
    bool lp_done = false;
    if (!mm_lt(k, j, &lp_done)) mm_fallback(k, j);
    if (j->lp && !lp_done) to_bf16(k, j->lp, j->D, (size_t)j->m * (size_t)j->n);
}

/* ---- the kernels.h functions -------------------------------------------------- */

void kn_cuda_to_lowp(kn_ctx *k, void *lp, const float *src, size_t n) { to_bf16(k, lp, src, n); }

/* The weight's bf16 mirror (kn_lowp_mirror) where registered and 16-byte aligned
 * (cuBLASLt's tensor-core kernels load 16 bytes), else NULL: convert it. */
static const void *weight_mirror(kn_ctx *k, const float *weight, size_t n)
{
    const void *w16 = kn_lowp_mirror_of(k, weight, n);
    return w16 && (uintptr_t)w16 % 16 == 0 ? w16 : NULL;
}

/* The job out'[OC, BT] = (W'[C, OC])ᵀ · inp'[C, BT] + bias (C > 0; bias may be NULL),
 * its operands bf16 in bf16 mode: the weight's mirror, or the weight converted in
 * the workspace, inp too
 * unless inp_lp holds it already. d16 (bf16 mode): out is bf16, and so the bias. */
static mm_job forward_job(kn_ctx *k, float *out, const float *inp, const void *inp_lp,
                          const float *weight, const float *bias, int BT, int C, int OC, bool d16)
{
    mm_job j = {};
    j.ta = true;
    j.alpha = 1.0f;
    j.m = OC;
    j.n = BT;
    j.k = C;
    j.A = weight;
    j.lda = C;
    j.B = inp;
    j.ldb = C;
    j.D = out;
    j.ldd = OC;
    j.epi = bias ? EPI_BIAS : EPI_NONE;
    j.bias = bias;
    j.d16 = d16;
    if (k->cuda->bf16) {
        const void *w16 = weight_mirror(k, weight, (size_t)OC * C);
        size_t nw = w16 ? 0 : (size_t)OC * C, ni = inp_lp ? 0 : (size_t)BT * C;
        size_t nb = d16 && bias ? OC : 0;
        size_t at_i = round256(nw * 2), at_b = at_i + round256(ni * 2);
        char *ws = (char *)kn_cuda_workspace(k, at_b + round256(nb * 2));
        j.A = w16 ? w16 : to_bf16(k, ws, weight, nw);
        j.B = inp_lp ? inp_lp : to_bf16(k, ws + at_i, inp, ni);
        if (nb) j.bias = (const float *)to_bf16(k, ws + at_b, bias, nb);
    }
    return j;
}

/* out = inp·Wᵀ + bias (+ res where given), or with pre: pre = inp·Wᵀ + bias and
 * out = gelu(pre); out_lp = bf16(out) where given (bf16 mode; then out is left
 * unwritten; bf16 mode keeps pre in bf16: kernels.h). inp_lp: inp in bf16, made
 * earlier (bf16 mode). */
static void forward(kn_ctx *k, float *out, void *out_lp, float *pre, const float *res,
                    const float *inp, const void *inp_lp, const float *weight, const float *bias,
                    int BT, int C, int OC)
{
    if (BT <= 0 || OC <= 0) return;
    size_t n = (size_t)BT * OC;
    const bool pre16 = pre && k->cuda->bf16;
    if (C <= 0) { /* no product: bias or 0 (into out first where pre is bf16) */
        float *dst = pre && !pre16 ? pre : out;
        if (bias || res) {
            fill_bias_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dst, bias, res, OC, n);
            CUDA_LAUNCHED();
        } else {
            CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), kn_stream(k)));
        }
        if (pre16) {
            to_bf16(k, pre, out, n);
            gelu_bf16(k, false, out, out_lp, NULL, NULL, (const __nv_bfloat16 *)pre, n);
            return;
        }
        if (pre) kn_cuda_gelu_forward(k, out, pre, n);
        if (out_lp) to_bf16(k, out_lp, out, n);
        return;
    }
    if (pre16) { /* pre in bf16 from the GEMM, then the GELU pass reads it */
        mm_job j = forward_job(k, pre, inp, inp_lp, weight, bias, BT, C, OC, true);
        mm(k, &j);
        gelu_bf16(k, false, out, out_lp, NULL, NULL, (const __nv_bfloat16 *)pre, n);
        return;
    }
    if (out_lp && !pre && k->cuda->bf16) { /* only the copy (kernels.h): the GEMM writes bf16 */
        mm_job j = forward_job(k, (float *)out_lp, inp, inp_lp, weight, bias, BT, C, OC, true);
        mm(k, &j);
        return;
    }
    mm_job j = forward_job(k, out, inp, inp_lp, weight, bias, BT, C, OC, false);
    if (pre) j.epi = EPI_GELU;
    j.aux = pre;
    j.C = res;
    j.lp = out_lp;
    j.lp_only = true; /* out is read through its copy alone (kernels.h) */
    mm(k, &j);
}

/* partial[blockIdx.y][c] = Σ of dout[r, c] (rows ld apart; fp32 or bf16) over
 * the block's BIAS_ROWS rows; a block is 32 lanes of VEC columns each × 8 row
 * lanes, the row lanes summed in order at the end (the same order for either
 * VEC). VEC 8 (wide loads: OC and ld multiples of 8, dout 16-byte aligned)
 * reads a warp's 512 or 1024 contiguous bytes of a row at once. */
template <int VEC, typename T>
__global__ static void __launch_bounds__(256)
bias_partial_kernel(float *partial, const T *dout, size_t ld, int BT, int OC)
{
    __shared__ float s[8][32 * VEC];
    int c = (blockIdx.x * 32 + threadIdx.x) * VEC;
    int r0 = blockIdx.y * BIAS_ROWS, r1 = min(r0 + BIAS_ROWS, BT);
    float acc[VEC] = {};
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float v[VEC];
            load_cols<VEC>(v, dout + (size_t)r * ld + c);
            for (int i = 0; i < VEC; i++) acc[i] += v[i];
        }
    for (int i = 0; i < VEC; i++) s[threadIdx.y][threadIdx.x * VEC + i] = acc[i];
    __syncthreads();
    for (int t = threadIdx.y * 32 + threadIdx.x; t < 32 * VEC; t += 256) {
        int col = blockIdx.x * 32 * VEC + t;
        if (col >= OC) break;
        float sum = 0.0f;
        for (int y = 0; y < 8; y++) sum += s[y][t];
        partial[(size_t)blockIdx.y * OC + col] = sum;
    }
}

/* The partial sums of dbias (above) over BT rows of dout, rows ld apart. */
template <typename T>
static void bias_partials(kn_ctx *k, float *partial, const T *dout, size_t ld, int BT, int OC)
{
    const int parts = (BT + BIAS_ROWS - 1) / BIAS_ROWS;
    const dim3 block(32, 8);
    if (OC % 8 == 0 && ld % 8 == 0 && (uintptr_t)dout % 16 == 0)
        bias_partial_kernel<8><<<dim3((OC + 255) / 256, parts), block, 0, kn_stream(k)>>>(
            partial, dout, ld, BT, OC);
    else
        bias_partial_kernel<1><<<dim3((OC + 31) / 32, parts), block, 0, kn_stream(k)>>>(
            partial, dout, ld, BT, OC);
    CUDA_LAUNCHED();
}

/* The bf16 operands a backward may be handed in bf16 mode (NULL where absent):
 * dout in bf16 with rows ldo apart (then dout is read only for dbias), inp in
 * bf16 kept from the forward, and where dinp's bf16 copy goes (with pre, or with
 * set: then the GEMM writes only the copy). */
typedef struct {
    const __nv_bfloat16 *dout;
    size_t ldo;
    const __nv_bfloat16 *inp;
    void *dinp;
} bwd_lp;

/* dinp += dout·W (dinp = dout·W with set), or with pre: dinp = (dout·W) ⊙
 * gelu'(pre) (overwritten); dweight += doutᵀ·inp; dbias += column sums of dout;
 * dout read times alpha in the GEMMs (dbias: 1 only). */
static void backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                     const float *inp, const float *weight, const float *pre, int BT, int C,
                     int OC, bool set, bwd_lp lp, float alpha)
{
    if (!k->cuda->bf16) lp = (bwd_lp){}; /* copies are made in bf16 mode only */
    const bool pre16 = pre && k->cuda->bf16; /* pre kept in bf16 (kernels.h) */
    const __nv_bfloat16 *dout16 = lp.dout, *inp16 = lp.inp;
    if (set && dinp && BT > 0 && C > 0 && OC <= 0) /* an empty product: dinp = 0 */
        CUDA_CHECK(cudaMemsetAsync(lp.dinp ? lp.dinp : (void *)dinp, 0,
                                   (size_t)BT * C * (lp.dinp ? 2 : sizeof(float)), kn_stream(k)));
    if (BT <= 0 || OC <= 0 || C < 0) return;
    const bool gemms = C > 0 && (dinp || dweight);
    const bool conv = k->cuda->bf16 && gemms;
    /* bf16 copies: W (for dinp; its mirror where registered) once, then dout and inp a
     * chunk of rows at a time */
    const void *w16 = conv && dinp ? weight_mirror(k, weight, (size_t)OC * C) : NULL;
    size_t w_bytes = conv && dinp && !w16 ? round256((size_t)OC * C * 2) : 0;
    size_t row_bytes = 2 * ((dout16 ? 0 : (size_t)OC) + (dweight && !inp16 ? (size_t)C : 0));
    int rows = BT;
    const size_t limit = bwd_bf16_bytes();
    if (conv && row_bytes && w_bytes + (size_t)BT * row_bytes > limit) {
        size_t room = limit > 2 * w_bytes ? limit - w_bytes : limit / 2;
        size_t r = room / row_bytes / 64 * 64; /* chunks start at multiples of 64 rows: aligned */
        if (r < 64) r = 64;
        if (r < (size_t)BT) rows = (int)r;
    }
    size_t dout_bytes = dout16 ? 0 : round256((size_t)rows * OC * 2);
    const size_t ldo = dout16 ? lp.ldo : (size_t)OC; /* dout's row stride in the GEMMs */
    size_t inp_bytes = dweight && !inp16 ? round256((size_t)rows * C * 2) : 0;
    size_t conv_bytes = conv ? w_bytes + dout_bytes + inp_bytes : 0;
    int parts = (BT + BIAS_ROWS - 1) / BIAS_ROWS;
    size_t partial_bytes = dbias ? (size_t)parts * OC * sizeof(float) : 0;
    if (!conv_bytes && !partial_bytes && !gemms) return;
    char *ws = NULL;
    if (conv_bytes || partial_bytes)
        ws = (char *)kn_cuda_workspace(k, conv_bytes > partial_bytes ? conv_bytes : partial_bytes);

    /* dbias first (from dout's bf16 copy where given, else dout): the stream runs
     * it before the bf16 copies below overwrite its partial sums in the workspace */
    if (dbias) {
        float *partial = (float *)ws;
        if (dout16) bias_partials(k, partial, dout16, ldo, BT, OC);
        else bias_partials(k, partial, dout, (size_t)OC, BT, OC);
        kn_cuda_sum_partials(k, dbias, partial, parts, OC);
    }
    if (!gemms) return;
    const void *W = weight;
    if (conv && dinp) W = w16 ? w16 : to_bf16(k, ws, weight, (size_t)OC * C);
    for (int r0 = 0; r0 < BT; r0 += rows) {
        int R = BT - r0 < rows ? BT - r0 : rows;
        const float *dout_r = dout16 ? NULL : dout + (size_t)r0 * OC;
        const float *inp_r = inp + (size_t)r0 * C;
        const void *Dr = dout_r, *Ir = inp_r;
        if (dout16) Dr = dout16 + (size_t)r0 * ldo;
        else if (conv) Dr = to_bf16(k, ws + w_bytes, dout_r, (size_t)R * OC);
        if (inp16) Ir = inp16 + (size_t)r0 * C;
        else if (conv && dweight) Ir = to_bf16(k, ws + w_bytes + dout_bytes, inp_r, (size_t)R * C);
        if (dinp) { /* dinp'[C, R] (+)= W'[C, OC] · dout'[OC, R] */
            mm_job j = {};
            j.alpha = alpha;
            j.ta = false;
            j.tb = false;
            j.m = C;
            j.n = R;
            j.k = OC;
            j.A = W;
            j.lda = C;
            j.B = Dr;
            j.ldb = (int)ldo;
            j.D = dinp + (size_t)r0 * C;
            j.ldd = C;
            if (pre16) { /* the product (bf16 into dpre's copy where given), DGELU after */
                j.d16 = lp.dinp != NULL;
                if (j.d16) j.D = (float *)((__nv_bfloat16 *)lp.dinp + (size_t)r0 * C);
                j.epi = EPI_NONE;
                j.beta = 0.0f;
            } else if (pre) {
                j.epi = EPI_DGELU;
                j.beta = 0.0f;
                j.aux = (float *)(pre + (size_t)r0 * C); /* only read */
                j.lp = lp.dinp ? (__nv_bfloat16 *)lp.dinp + (size_t)r0 * C : NULL;
                j.lp_only = true; /* dpre is read through its copy alone (kernels.h) */
            } else { /* every chunk writes its own rows: beta 0 overwrites them all */
                j.epi = EPI_NONE;
                j.beta = set ? 0.0f : 1.0f;
                j.d16 = set && lp.dinp; /* set with a copy: the bf16 product alone */
                if (j.d16) j.D = (float *)((__nv_bfloat16 *)lp.dinp + (size_t)r0 * C);
            }
            mm(k, &j);
            if (pre16) { /* in place: dpre = product ⊙ gelu'(pre) */
                float *y32 = j.d16 ? NULL : j.D;
                void *y16 = j.d16 ? (void *)j.D : NULL;
                gelu_bf16(k, true, y32, y16, y32, y16,
                          (const __nv_bfloat16 *)pre + (size_t)r0 * C, (size_t)R * C);
            }
        }
        if (dweight) { /* dW'[C, OC] += inp'[C, R] · (dout'[OC, R])ᵀ */
            mm_job j = {};
            j.alpha = alpha;
            j.ta = false;
            j.tb = true;
            j.m = C;
            j.n = OC;
            j.k = R;
            j.A = Ir;
            j.lda = C;
            j.B = Dr;
            j.ldb = (int)ldo;
            j.beta = 1.0f;
            j.D = dweight;
            j.ldd = C;
            j.epi = EPI_NONE;
            mm(k, &j);
        }
    }
}

void kn_cuda_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                            const void *inp_lp, const float *weight, const float *bias, int BT,
                            int C, int OC)
{
    forward(k, out, out_lp, NULL, NULL, inp, inp_lp, weight, bias, BT, C, OC);
}

void kn_cuda_matmul_residual_forward(kn_ctx *k, float *out, const float *res, const float *inp,
                                     const void *inp_lp, const float *weight, const float *bias,
                                     int BT, int C, int OC)
{
    forward(k, out, NULL, NULL, res, inp, inp_lp, weight, bias, BT, C, OC);
}

static bwd_lp lp_args(const void *dout_lp, int OC, const void *inp_lp)
{
    return (bwd_lp){(const __nv_bfloat16 *)dout_lp, (size_t)OC, (const __nv_bfloat16 *)inp_lp,
                    NULL};
}

void kn_cuda_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                             const float *dout, const void *dout_lp, const float *inp,
                             const void *inp_lp, const float *weight, int BT, int C, int OC)
{
    backward(k, dinp, dweight, dbias, dout, inp, weight, NULL, BT, C, OC, false,
             lp_args(dout_lp, OC, inp_lp), 1.0f);
}

void kn_cuda_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                 float *dbias, const float *dout, const void *dout_lp,
                                 const float *inp, const void *inp_lp, const float *weight, int BT,
                                 int C, int OC)
{
    bwd_lp lp = lp_args(dout_lp, OC, inp_lp);
    lp.dinp = dinp_lp; /* the dinp GEMM writes only the copy (kernels.h) */
    backward(k, dinp, dweight, dbias, dout, inp, weight, NULL, BT, C, OC, true, lp, 1.0f);
}

void kn_cuda_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre,
                                 const float *inp, const void *inp_lp, const float *weight,
                                 const float *bias, int BT, int C, int OC)
{
    forward(k, out, out_lp, pre, NULL, inp, inp_lp, weight, bias, BT, C, OC);
}

void kn_cuda_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                  float *dbias, const float *dout, const void *dout_lp,
                                  const float *inp, const void *inp_lp, const float *weight,
                                  const float *pre, int BT, int C, int OC)
{
    bwd_lp lp = lp_args(dout_lp, OC, inp_lp); /* dpre's and dweight's GEMMs, dbias read it */
    lp.dinp = dpre_lp;
    backward(k, dpre, dweight, dbias, dout, inp, weight, pre, BT, C, OC, false, lp, 1.0f);
}

/* The LM head's logits'[Vp, BT] = (W'[C, Vp])ᵀ · inp'[C, BT] as bf16 over the
 * first half of each fp32 row of logits (row stride 2·Vp bf16), bf16 mode. */
static void head_logits_bf16(kn_ctx *k, float *logits, const float *inp, const void *inp_lp,
                             const float *weight, int BT, int C, int Vp)
{
    mm_job j = forward_job(k, logits, inp, inp_lp, weight, NULL, BT, C, Vp, true);
    j.ldd = 2 * Vp;
    mm(k, &j);
}

void kn_cuda_lm_head_forward(kn_ctx *k, float *losses, float *stats, float *logits,
                             const float *inp, const void *inp_lp, const float *weight,
                             const int32_t *targets, int BT, int C, int V, int Vp)
{
    if (BT <= 0) return;
    if (kn_cuda_logits_bf16(k, logits, Vp) && C > 0) {
        head_logits_bf16(k, logits, inp, inp_lp, weight, BT, C, Vp);
        if (kn_cuda_logits_dlogits(k, logits, Vp)) /* the unscaled dlogits too, in place */
            kn_cuda_crossentropy_row_bf16(k, losses, stats, logits, targets, BT, V, Vp);
        else
            kn_cuda_crossentropy_forward_bf16(k, losses, stats, logits, targets, BT, V, Vp);
        return;
    }
    forward(k, logits, NULL, NULL, NULL, inp, inp_lp, weight, NULL, BT, C, Vp);
    kn_cuda_crossentropy_forward(k, losses, stats, logits, targets, BT, V, Vp);
}

void kn_cuda_lm_head_backward(kn_ctx *k, float *dinp, float *dweight, float *logits,
                              const float *stats, const int32_t *targets, float dloss_scale,
                              const float *inp, const void *inp_lp, const float *weight, int BT,
                              int C, int V, int Vp)
{
    if (kn_cuda_logits_bf16(k, logits, Vp) && C > 0) {
        /* the forward left them unscaled where a row fit its registers */
        const bool scaled = !kn_cuda_logits_dlogits(k, logits, Vp);
        if (scaled)
            kn_cuda_crossentropy_backward_bf16(k, logits, stats, targets, dloss_scale, BT, V, Vp);
        /* the dlogits are bf16 over the first half of each row: rows 2·Vp apart */
        bwd_lp lp = lp_args(logits, 2 * Vp, inp_lp);
        backward(k, dinp, dweight, NULL, NULL, inp, weight, NULL, BT, C, Vp, true, lp,
                 scaled ? 1.0f : dloss_scale);
        return;
    }
    kn_cuda_crossentropy_backward(k, logits, logits, stats, targets, dloss_scale, BT, V, Vp);
    backward(k, dinp, dweight, NULL, logits, inp, weight, NULL, BT, C, Vp, true,
             lp_args(NULL, Vp, inp_lp), 1.0f);
}
