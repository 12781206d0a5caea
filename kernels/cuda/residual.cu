/* Residual connection and gradient accumulation (kernels/cpu/residual.c). */
#include "cuda.cuh"

/* out may alias a or b: each element is read and written by one thread. */
__global__ static void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ static void accumulate_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

void kn_cuda_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n)
{
    if (!n) return;
    residual_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(out, a, b, n);
    CUDA_LAUNCHED();
}

void kn_cuda_accumulate(kn_ctx *k, float *dst, const float *src, size_t n)
{
    if (!n) return;
    accumulate_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dst, src, n);
    CUDA_LAUNCHED();
}
