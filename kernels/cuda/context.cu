/* CUDA backend: context, device memory, copies, the cuBLAS GEMM wrappers,
 * and its table of kernels. */
#include <stdint.h>
#include <string.h>

#include "cuda.cuh"

void kn_cuda_fail(const char *what, const char *detail, const char *file, int line)
{
    fprintf(stderr, "pliant kernels (cuda): %s failed at %s:%d: %s\n", what, file, line, detail);
    abort();
}

/* What cuda_setup made (those it got to, for a create that failed). */
static void release_setup(struct kn_cuda *c)
{
    if (c->lt_ws) cudaFree(c->lt_ws);
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->blas) cublasDestroy(c->blas);
    if (c->host_sum) cudaFreeHost(c->host_sum);
    if (c->stream) cudaStreamDestroy(c->stream);
}

static void cuda_destroy(kn_ctx *k)
{
    struct kn_cuda *c = k->cuda;
    cudaStreamSynchronize(c->stream); /* teardown: report nothing, free what exists */
    kn_cuda_arena_destroy(k);         /* every kn_alloc block and the workspace */
    kn_cuda_prof_destroy(k);
    free(c->lt_cache);
    release_setup(c);
    free(c);
    free(k);
}

static size_t round64(size_t bytes) /* 0 when bytes cannot be rounded up */
{
    return bytes ? (bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64) : 64;
}

void *kn_cuda_workspace(kn_ctx *k, size_t bytes)
{
    if (bytes <= k->ws_bytes && k->ws) return k->ws;
    kn_cuda_arena_free(k, k->ws); /* waits: queued kernels may still use the old one */
    k->ws = NULL;
    k->ws_bytes = 0;
    size_t n = round64(bytes);
    if (!n || !(k->ws = kn_cuda_arena_alloc(k, n, 0)))
        kn_cuda_fail("kn_cuda_workspace", "out of device memory", __FILE__, __LINE__);
    k->ws_bytes = n;
    return k->ws;
}

static void cuda_zero(kn_ctx *k, void *p, size_t bytes)
{
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, kn_stream(k)));
}

static void *cuda_alloc(kn_ctx *k, size_t bytes)
{
    return kn_cuda_arena_alloc(k, bytes, 1); /* arena.cu: 256-byte aligned, zero-filled */
}

static void cuda_free(kn_ctx *k, void *p)
{
    kn_cuda_arena_free(k, p); /* waits for queued work using p first */
}

/* Both copies wait for the stream: the caller may reuse or read its host
 * buffer on return (pageable memory; a pinned, asynchronous path for
 * activations between stages belongs to the comm layer). */
static void cuda_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, kn_stream(k)));
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k)));
}

static void cuda_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, kn_stream(k)));
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k)));
}

static void cuda_sync(kn_ctx *k)
{
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k)));
}

static void cuda_copy(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, kn_stream(k)));
}

static void *cuda_host_alloc(kn_ctx *k, size_t bytes)
{
    (void)k;
    size_t n = round64(bytes);
    void *p = NULL;
    if (!n || cudaMallocHost(&p, n) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

static void cuda_host_free(kn_ctx *k, void *p)
{
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k))); /* a queued copy may still read it */
    CUDA_CHECK(cudaFreeHost(p));
}

void kn_cuda_gemm(kn_ctx *k, bool ta, bool tb, int m, int n, int kk, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    CUBLAS_CHECK(cublasGemmEx(k->cuda->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, kk, &alpha, A, CUDA_R_32F,
                              lda, B, CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc,
                              k->cuda->compute, CUBLAS_GEMM_DEFAULT));
}

void kn_cuda_gemm_batched(kn_ctx *k, bool ta, bool tb, int m, int n, int kk, float alpha,
                          const float *A, int lda, long long sA, const float *B, int ldb,
                          long long sB, float beta, float *C, int ldc, long long sC, int batch)
{
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        k->cuda->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, kk,
        &alpha, A, CUDA_R_32F, lda, sA, B, CUDA_R_32F, ldb, sB, &beta, C, CUDA_R_32F, ldc, sC,
        batch, k->cuda->compute, CUBLAS_GEMM_DEFAULT));
}

static const kn_ops kn_cuda_ops = {
    /* .name = */ "cuda",
    /* .destroy = */ cuda_destroy,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .zero = */ cuda_zero,
    /* .to_device = */ cuda_to_device,
    /* .to_host = */ cuda_to_host,
    /* .sync = */ cuda_sync,
    /* .encoder_forward = */ kn_cuda_encoder_forward,
    /* .encoder_backward = */ kn_cuda_encoder_backward,
    /* .layernorm_forward = */ kn_cuda_layernorm_forward,
    /* .layernorm_backward = */ kn_cuda_layernorm_backward,
    /* .matmul_forward = */ kn_cuda_matmul_forward,
    /* .matmul_backward = */ kn_cuda_matmul_backward,
    /* .attention_forward = */ kn_cuda_attention_forward,
    /* .attention_backward = */ kn_cuda_attention_backward,
    /* .gelu_forward = */ kn_cuda_gelu_forward,
    /* .gelu_backward = */ kn_cuda_gelu_backward,
    /* .residual_forward = */ kn_cuda_residual_forward,
    /* .accumulate = */ kn_cuda_accumulate,
    /* .softmax_crossentropy_forward = */ kn_cuda_softmax_crossentropy_forward,
    /* .crossentropy_softmax_backward = */ kn_cuda_crossentropy_softmax_backward,
    /* .crossentropy_forward = */ kn_cuda_crossentropy_forward,
    /* .crossentropy_backward = */ kn_cuda_crossentropy_backward,
    /* .adamw_update = */ kn_cuda_adamw_update,
    /* .adamw_update_spans = */ kn_cuda_adamw_update_spans,
    /* .matmul_backward_set = */ kn_cuda_matmul_backward_set,
    /* .sum_squares = */ kn_cuda_sum_squares,
    /* .sum = */ kn_cuda_sum,
    /* .copy = */ cuda_copy,
    /* .host_alloc = */ cuda_host_alloc,
    /* .host_free = */ cuda_host_free,
    /* .attention_state_floats = */ kn_cuda_attention_state_floats,
    /* .matmul_gelu_forward = */ kn_cuda_matmul_gelu_forward,
    /* .matmul_backward_gelu = */ kn_cuda_matmul_backward_gelu,
    /* .prof_begin = */ kn_cuda_prof_begin,
    /* .prof_end = */ kn_cuda_prof_end,
    /* .prof_collect = */ kn_cuda_prof_collect,
    /* .memory_stats = */ kn_cuda_memory_stats,
    /* .share = */ NULL,
    /* .lm_head_backward = */ kn_cuda_lm_head_backward,
    /* .populate = */ NULL,
    /* .to_lowp = */ kn_cuda_to_lowp,
    /* .lm_head_forward = */ kn_cuda_lm_head_forward,
    /* .matmul_residual_forward = */ kn_cuda_matmul_residual_forward,
};

/* The matmuls' arithmetic (cuda.cuh) from PLIANT_PRECISION (PLIANT_TF32=1 is the older
 * way to ask for tf32): "bf16" (the default), "tf32", "fp32", or NULL with err. */
static const char *precision_from_env(char *err, size_t errlen)
{
    const char *prec = getenv("PLIANT_PRECISION");
    if (!prec || !*prec) {
        const char *tf32 = getenv("PLIANT_TF32");
        prec = tf32 && !strcmp(tf32, "1") ? "tf32" : "bf16";
    }
    const char *known[] = {"bf16", "tf32", "fp32"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(prec, known[i])) return known[i];
    if (err && errlen) snprintf(err, errlen, "PLIANT_PRECISION=%s: expected bf16, fp32 or tf32", prec);
    return NULL;
}

/* The device's memory and its UUID, as nvidia-smi writes it (GPU-...). */
static cudaError_t device_identity(kn_ctx *k, int device)
{
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return e;
    k->device_memory = prop.totalGlobalMem;
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(k->device, sizeof k->device,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
    return cudaSuccess;
}

static int blas_failed(const char *what, cublasStatus_t s, char *err, size_t errlen)
{
    if (err && errlen) snprintf(err, errlen, "%s: %s", what, cublasGetStatusString(s));
    return -1;
}

static int cuda_failed(const char *what, cudaError_t e, char *err, size_t errlen)
{
    if (err && errlen) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

/* The stream, the host cell sums come back in, cuBLAS, and for bf16 and tf32 (the linear
 * layers on cuBLASLt) cuBLASLt with its workspace: 0, or −1 with err (release_setup
 * frees what was made). */
static int cuda_setup(kn_ctx *k, struct kn_cuda *c, const char *precision, char *err,
                      size_t errlen)
{
    cudaError_t e;
    if ((e = cudaGetDevice(&c->device)) != cudaSuccess)
        return cuda_failed("cudaGetDevice", e, err, errlen);
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_failed("cudaStreamCreateWithFlags", e, err, errlen);
    k->stream = c->stream;
    if ((e = device_identity(k, c->device)) != cudaSuccess)
        return cuda_failed("cudaGetDeviceProperties", e, err, errlen);
    if ((e = cudaMallocHost((void **)&c->host_sum, sizeof(double))) != cudaSuccess)
        return cuda_failed("cudaMallocHost", e, err, errlen);
    cublasStatus_t s;
    if ((s = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS)
        return blas_failed("cublasCreate", s, err, errlen);
    if ((s = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS)
        return blas_failed("cublasSetStream", s, err, errlen);
    if (!strcmp(precision, "fp32")) return 0;
    if ((s = cublasLtCreate(&c->lt)) != CUBLAS_STATUS_SUCCESS)
        return blas_failed("cublasLtCreate", s, err, errlen);
    c->lt_ws_bytes = (size_t)32 << 20; /* what NVIDIA suggests for Hopper */
    if ((e = cudaMalloc(&c->lt_ws, c->lt_ws_bytes)) != cudaSuccess) {
        c->lt_ws = NULL;
        return cuda_failed("cudaMalloc (cuBLASLt workspace)", e, err, errlen);
    }
    return 0;
}

/* Fails (NULL, message in err) when there is no usable device. */
kn_ctx *kn_cuda_create(int threads, char *err, size_t errlen)
{
    (void)threads;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (err && errlen)
            snprintf(err, errlen, "no CUDA device (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount gave 0");
        cudaGetLastError();
        return NULL;
    }
    const char *precision = precision_from_env(err, errlen);
    if (!precision) return NULL;
    kn_ctx *k = (kn_ctx *)calloc(1, sizeof *k);
    struct kn_cuda *c = (struct kn_cuda *)calloc(1, sizeof *c);
    if (!k || !c) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        free(c);
        free(k);
        return NULL;
    }
    k->ops = &kn_cuda_ops;
    k->threads = 1;
    k->cuda = c;
    if (cuda_setup(k, c, precision, err, errlen)) {
        release_setup(c);
        free(c);
        free(k);
        return NULL;
    }
    k->precision = precision;
    c->bf16 = !strcmp(precision, "bf16");
    c->compute = !strcmp(precision, "tf32") ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    k->lowp_size = c->bf16 ? 2 : 0;
    return k;
}
