/* GELU, tanh approximation (kernels/cpu/gelu.c). */
#include "cuda.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + GELU_C * x * x * x)));
    }
}

__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_SCALE * (x + GELU_C * x * x * x));
        float sech2 = 1.0f - th * th;
        float local_grad = 0.5f * (1.0f + th) +
                           x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_C * x * x);
        dinp[i] += local_grad * dout[i];
    }
}

__global__ static void gelu_scale_kernel(float *d, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanhf(GELU_SCALE * (x + GELU_C * x * x * x));
        float sech2 = 1.0f - th * th;
        d[i] *= 0.5f * (1.0f + th) + x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_C * x * x);
    }
}

void kn_cuda_matmul_gelu_forward(kn_ctx *k, float *out, float *pre, const float *inp,
                                 const float *weight, const float *bias, int BT, int C, int OC)
{
    kn_cuda_matmul_forward(k, pre, inp, weight, bias, BT, C, OC);
    kn_cuda_gelu_forward(k, out, pre, (size_t)BT * (size_t)OC);
}

void kn_cuda_matmul_backward_gelu(kn_ctx *k, float *dpre, float *dweight, float *dbias,
                                  const float *dout, const float *inp, const float *weight,
                                  const float *pre, int BT, int C, int OC)
{
    const size_t n = (size_t)BT * (size_t)C;
    CUDA_CHECK(cudaMemsetAsync(dpre, 0, n * sizeof(float), kn_stream(k)));
    kn_cuda_matmul_backward(k, dpre, dweight, dbias, dout, inp, weight, BT, C, OC);
    gelu_scale_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dpre, pre, n);
    CUDA_LAUNCHED();
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
