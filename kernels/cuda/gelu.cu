/* GELU, tanh approximation (kernels/cpu/gelu.c; kn_gelu and kn_gelu_grad in
 * cuda.cuh). The fused matmul + GELU pair lives in matmul.cu. */
#include "cuda.cuh"

__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = kn_gelu(inp[i]);
}

__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dinp[i] += kn_gelu_grad(inp[i]) * dout[i];
}

void kn_cuda_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n)
{
    if (!n) return;
    gelu_forward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(out, inp, n);
    CUDA_LAUNCHED();
}

void kn_cuda_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n)
{
    if (!n) return;
    gelu_backward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dinp, inp, dout, n);
    CUDA_LAUNCHED();
}
