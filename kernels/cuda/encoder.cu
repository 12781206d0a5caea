/* Token + position embedding (kernels/cpu/encoder.c). */
#include "cuda.cuh"

__global__ static void encoder_forward_kernel(float *out, const int32_t *inp, const float *wte,
                                              const float *wpe, int T, int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
    }
}

void kn_cuda_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                             const float *wpe, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (!n) return;
    encoder_forward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(out, inp, wte, wpe, T, C,
                                                                         n);
    CUDA_LAUNCHED();
}

/* dwpe: one thread per (t, c) sums the B positions in order (deterministic). */
__global__ static void wpe_backward_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[(size_t)b * n + i];
        dwpe[i] += s;
    }
}

/* dwte: atomicAdd per element, because the same token may occur at many
 * positions. The order of the additions varies from run to run, so dwte may
 * differ in the last bits between runs (a deterministic version sorts the
 * positions by token first, as llm.c's encoder_backward does). */
__global__ static void wte_backward_kernel(float *dwte, const float *dout, const int32_t *inp,
                                           int C, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C);
        atomicAdd(dwte + (size_t)inp[bt] * C + c, dout[i]);
    }
}

void kn_cuda_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                              const int32_t *inp, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (!n) return;
    if (dwpe) {
        wpe_backward_kernel<<<kn_blocks((size_t)T * C, 256), 256, 0, kn_stream(k)>>>(dwpe, dout,
                                                                                     B, T, C);
        CUDA_LAUNCHED();
    }
    if (dwte) {
        wte_backward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dwte, dout, inp, C, n);
        CUDA_LAUNCHED();
    }
}
