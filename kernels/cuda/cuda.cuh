/* Internals shared by the CUDA kernels (the .cu files in kernels/cuda/); not
 * part of the public interface (kernels/kernels.h).
 *
 * One context per process: it owns a device (the current one at kn_create),
 * one stream on which every kernel, cuBLAS call and copy is queued in order,
 * a cuBLAS handle bound to that stream, and a device workspace. Kernels
 * return as soon as their work is queued; kn_to_host, the sums and kn_sync
 * wait for the stream.
 *
 * Precision: fp32 everywhere. Matmuls use cuBLAS in plain fp32 unless the
 * environment has PLIANT_TF32=1 at kn_create (TF32 tensor cores: about
 * 1e-3 relative error per product, several times faster).
 *
 * Errors: the kernels return void, so a failed CUDA or cuBLAS call prints
 * what failed and where, and aborts (a half-done step must not go unnoticed).
 * Only kn_create and kn_alloc report failure to the caller. */
#ifndef PLIANT_KERNELS_CUDA_CUH
#define PLIANT_KERNELS_CUDA_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "kn_backend.h"

struct kn_cuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasComputeType_t compute; /* CUBLAS_COMPUTE_32F, or _32F_FAST_TF32 with PLIANT_TF32=1 */
    double *host_sum;            /* pinned, the result of a reduction */
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
                             const float *wpe, int B, int T, int C);
void kn_cuda_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                              const int32_t *inp, int B, int T, int C);
void kn_cuda_layernorm_forward(kn_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int B, int T, int C);
void kn_cuda_layernorm_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int B, int T, int C);
void kn_cuda_matmul_forward(kn_ctx *k, float *out, const float *inp, const float *weight,
                            const float *bias, int BT, int C, int OC);
void kn_cuda_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int BT,
                             int C, int OC);
void kn_cuda_attention_forward(kn_ctx *k, float *out, float *att, const float *qkv, int B, int T,
                               int C, int NH);
void kn_cuda_attention_backward(kn_ctx *k, float *dqkv, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH);
size_t kn_cuda_attention_state_floats(kn_ctx *k, int B, int T, int NH);
void kn_cuda_matmul_gelu_forward(kn_ctx *k, float *out, float *pre, const float *inp,
                                 const float *weight, const float *bias, int BT, int C, int OC);
void kn_cuda_matmul_backward_gelu(kn_ctx *k, float *dpre, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
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
void kn_cuda_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, float grad_scale, int t);
double kn_cuda_sum_squares(kn_ctx *k, const float *x, size_t n);
double kn_cuda_sum(kn_ctx *k, const float *x, size_t n);

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
