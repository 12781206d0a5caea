/* Internals shared by the CUDA kernels (the .cu files in kernels/cuda/); not
 * part of the public interface (kernels/kernels.h).
 *
 * One context per process: it owns a device (the current one at kn_create),
 * one stream on which every kernel, cuBLAS call and copy is queued in order,
 * a cuBLAS handle bound to that stream, and a device workspace. Kernels
 * return as soon as their work is queued; kn_to_host, the sums and kn_sync
 * wait for the stream.
 *
 * Precision (kn_precision), from PLIANT_PRECISION at kn_create: bf16 (the
 * default), tf32 or fp32 (PLIANT_TF32=1 alone still means tf32; another value
 * fails kn_create). Memory stays fp32 in every mode. bf16: each linear layer
 * (matmul.cu) converts its operands to bf16 in the workspace and runs a
 * cuBLASLt GEMM with fp32 accumulation and fp32 output, bias and GELU fused
 * in its epilogue (about 4e-3 relative error per product). tf32: the same
 * cuBLASLt calls on fp32 operands with TF32 products (about 1e-3). fp32: plain
 * cublasGemmEx and separate bias/GELU kernels, the reference. The other GEMMs
 * (kn_cuda_gemm*) are fp32, TF32 only in tf32 mode.
 *
 * Errors: the kernels return void, so a failed CUDA or cuBLAS call prints
 * what failed and where, and aborts (a half-done step must not go unnoticed).
 * Only kn_create and kn_alloc report failure to the caller. */
#ifndef PLIANT_KERNELS_CUDA_CUH
#define PLIANT_KERNELS_CUDA_CUH

#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kn_backend.h"

struct kn_cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasComputeType_t compute; /* CUBLAS_COMPUTE_32F, or _32F_FAST_TF32 in tf32 mode */
    bool bf16;                   /* bf16 mode: linear layers on bf16 copies of their operands */
    cublasLtHandle_t lt;         /* bf16 and tf32 modes: the linear layers' GEMMs; NULL in fp32 */
    void *lt_ws;                 /* cuBLASLt's own workspace, lt_ws_bytes */
    size_t lt_ws_bytes;
    void *lt_cache;              /* matmul.cu's heuristic results per shape (free()d at destroy) */
    double *host_sum;            /* pinned, the result of a reduction */
    struct kn_arena *arena;      /* device memory (arena.cu); made at the first allocation */
    cudaEvent_t *prof_ev;        /* kernel timing (profile.cu): events 2i, 2i+1 bracket call i */
    int *prof_op;                /* the kernel of each recorded call */
    int prof_n, prof_cap;        /* calls recorded, calls the pool holds */
};

void kn_cuda_fail(const char *what, const char *detail, const char *file, int line);

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) kn_cuda_fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        cublasStatus_t s_ = (call);                                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                   \
            kn_cuda_fail(#call, cublasGetStatusString(s_), __FILE__, __LINE__);            \
    } while (0)

/* After a kernel launch: catches bad launch configurations at once (errors
 * inside the kernel surface at the next synchronizing call). */
#define CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

static inline cudaStream_t kn_stream(kn_ctx *k) { return k->cuda->stream; }

/* Blocks for n items at `threads` per block, capped for grid-stride loops. */
static inline unsigned kn_blocks(size_t n, int threads)
{
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    return (unsigned)(b < 1 ? 1 : b > 65535u * 32u ? 65535u * 32u : b);
}

/* Device memory from the context's arena (arena.cu): 256-byte aligned blocks,
 * zero-filled on the stream when `zero`; NULL when the device is out of memory.
 * kn_cuda_arena_free waits for the stream, then returns the block. */
void *kn_cuda_arena_alloc(kn_ctx *k, size_t bytes, int zero);
void kn_cuda_arena_free(kn_ctx *k, void *p);
void kn_cuda_arena_destroy(kn_ctx *k); /* gives every chunk back (teardown) */
int kn_cuda_memory_stats(kn_ctx *k, kn_mem_stats *out);

/* Kernel timing (profile.cu), the kn_ops entries behind kn_profile_enable. */
void kn_cuda_prof_begin(kn_ctx *k);
void kn_cuda_prof_end(kn_ctx *k, int op);
void kn_cuda_prof_collect(kn_ctx *k);
void kn_cuda_prof_destroy(kn_ctx *k); /* teardown */

/* The device workspace, grown to at least `bytes` (contents undefined; valid
 * until the next call, which waits for queued work before freeing a buffer
 * it outgrows). */
void *kn_cuda_workspace(kn_ctx *k, size_t bytes);

/* dst[c] += Σ_p partial[p·n + c] for c < n, the parts summed in order
 * (deterministic column sums: the second pass of dbias and LayerNorm's
 * parameter gradients). */
void kn_cuda_sum_partials(kn_ctx *k, float *dst, const float *partial, int parts, int n);

/* fp32 GEMM on column-major operands (cuBLAS convention), C = α·op(A)·op(B) + β·C. */
void kn_cuda_gemm(kn_ctx *k, bool ta, bool tb, int m, int n, int kk, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The same, `batch` times, operand i at A + i·sA, B + i·sB, C + i·sC. */
void kn_cuda_gemm_batched(kn_ctx *k, bool ta, bool tb, int m, int n, int kk, float alpha,
                          const float *A, int lda, long long sA, const float *B, int ldb,
                          long long sB, float beta, float *C, int ldc, long long sC, int batch);

/* The CUDA kernels, one per kernels.h function (same arguments), in the table
 * of context.cu. */
void kn_cuda_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                             const float *wpe, int B, int T, int C, int V);
void kn_cuda_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                              const int32_t *inp, int B, int T, int C, int V);
void kn_cuda_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int B,
                               int T, int C);
void kn_cuda_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                float *dbias, const float *dout, const void *dout_lp,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int B, int T, int C);
void kn_cuda_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                            const void *inp_lp, const float *weight, const float *bias, int BT,
                            int C, int OC);
void kn_cuda_matmul_residual_forward(kn_ctx *k, float *out, const float *res, const float *inp,
                                     const void *inp_lp, const float *weight, const float *bias,
                                     int BT, int C, int OC);
void kn_cuda_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                             const float *dout, const void *dout_lp, const float *inp,
                             const void *inp_lp, const float *weight, int BT, int C, int OC);
void kn_cuda_to_lowp(kn_ctx *k, void *lp, const float *src, size_t n);
void kn_cuda_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                               const void *qkv_lp, int B, int T, int C, int NH);
void kn_cuda_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                                const void *dout_lp, const float *qkv, const void *qkv_lp,
                                const float *att, const float *out, const void *out_lp, int B,
                                int T, int C, int NH);
void kn_cuda_lm_head_backward(kn_ctx *k, float *dinp, float *dweight, float *logits,
                              const float *stats, const int32_t *targets, float dloss_scale,
                              const float *inp, const void *inp_lp, const float *weight, int BT,
                              int C, int V, int Vp);
void kn_cuda_lm_head_forward(kn_ctx *k, float *losses, float *stats, float *logits,
                             const float *inp, const void *inp_lp, const float *weight,
                             const int32_t *targets, int BT, int C, int V, int Vp);
/* Does the LM head keep bf16 logits over the first half of each fp32 row of
 * logits (row stride 2·Vp bf16)? In bf16 mode where the rows allow it (Vp % 8,
 * 16-byte alignment). kn_cuda_crossentropy_forward_bf16 is
 * kn_crossentropy_forward on such logits; _backward_bf16 turns them into the
 * bf16 dlogits in place. */
bool kn_cuda_logits_bf16(kn_ctx *k, const float *logits, int Vp);
void kn_cuda_crossentropy_forward_bf16(kn_ctx *k, float *losses, float *stats,
                                       const float *logits, const int32_t *targets, int BT, int V,
                                       int Vp);
void kn_cuda_crossentropy_backward_bf16(kn_ctx *k, float *logits, const float *stats,
                                        const int32_t *targets, float dloss_scale, int BT, int V,
                                        int Vp);
/* Where a row fits a block's shared memory (Vp ≤ 57344) the LM head goes further:
 * kn_cuda_crossentropy_row_bf16 is kn_crossentropy_forward on such logits that
 * also turns them, in the same pass, into bf16 dlogits WITHOUT the loss weight
 * (softmax − onehot; masked rows 0), which the backward's GEMMs then scale. */
bool kn_cuda_logits_dlogits(kn_ctx *k, const float *logits, int Vp);
void kn_cuda_crossentropy_row_bf16(kn_ctx *k, float *losses, float *stats, float *logits,
                                   const int32_t *targets, int BT, int V, int Vp);
size_t kn_cuda_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp);
void kn_cuda_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre,
                                 const float *inp, const void *inp_lp, const float *weight,
                                 const float *bias, int BT, int C, int OC);
void kn_cuda_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                  float *dbias, const float *dout, const void *dout_lp,
                                  const float *inp, const void *inp_lp, const float *weight,
                                  const float *pre, int BT, int C, int OC);
void kn_cuda_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n);
void kn_cuda_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n);
void kn_cuda_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n);
void kn_cuda_accumulate(kn_ctx *k, float *dst, const float *src, size_t n);
void kn_cuda_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs,
                                          const float *logits, const int32_t *targets, int BT,
                                          int V, int Vp);
void kn_cuda_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                           const int32_t *targets, float dloss_scale, int BT,
                                           int V, int Vp);
void kn_cuda_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                                  const int32_t *targets, int BT, int V, int Vp);
void kn_cuda_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits,
                                   const float *stats, const int32_t *targets, float dloss_scale,
                                   int BT, int V, int Vp);
void kn_cuda_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, float grad_scale, int t);
void kn_cuda_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m,
                                float *v, const kn_adamw_span *spans, int nspans, float lr,
                                float beta1, float beta2, float eps, float weight_decay,
                                float grad_scale, int t);
void kn_cuda_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                 float *dbias, const float *dout, const void *dout_lp,
                                 const float *inp, const void *inp_lp, const float *weight, int BT,
                                 int C, int OC);
double kn_cuda_sum_squares(kn_ctx *k, const float *x, size_t n);
double kn_cuda_sum(kn_ctx *k, const float *x, size_t n);

/* Two floats as a bf16 pair (round to nearest even), the earlier in the low
 * half: little-endian, so the pair's bytes are those of two bf16 in order. */
__device__ static inline unsigned bf16_pair(float lo, float hi)
{
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

/* GELU, tanh approximation, and its derivative (kernels/cpu/gelu.c). */
#define KN_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define KN_GELU_C 0.044715f

/* FAST: the hardware's tanh.approx.f32 (relative error under 2⁻¹⁰·⁹⁹, PTX ISA)
 * instead of tanhf, for results stored as bf16 (2⁻⁹), which hide it: the
 * elementwise GELU passes of bf16 mode are then bound by memory, not by tanhf. */
template <bool FAST = false>
__device__ static inline float kn_tanh(float x)
{
    if (!FAST) return tanhf(x);
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <bool FAST = false>
__device__ static inline float kn_gelu(float x)
{
    return 0.5f * x * (1.0f + kn_tanh<FAST>(KN_GELU_SCALE * (x + KN_GELU_C * x * x * x)));
}

template <bool FAST = false>
__device__ static inline float kn_gelu_grad(float x)
{
    float th = kn_tanh<FAST>(KN_GELU_SCALE * (x + KN_GELU_C * x * x * x));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + x * 0.5f * sech2 * KN_GELU_SCALE * (1.0f + 3.0f * KN_GELU_C * x * x);
}

/* Warp-level sum and max (all 32 lanes get the result). */
__device__ static inline float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
