/* Sums in double (kernels/cpu/reduce.c) and the ordered column sums used by
 * dbias and LayerNorm's parameter gradients. Every reduction has a fixed
 * shape (grid size, tree order), so results do not vary from run to run. */
#include "cuda.cuh"

#define RED_BLOCKS 512
#define RED_THREADS 256

template <bool SQUARE> __device__ static inline double term(float x)
{
    const double v = x;
    return SQUARE ? v * v : v;
}

/* partial[block] = Σ f(x[i]) over the block's grid-stride share, f = x or x²:
 * 16-byte loads where x is aligned (a quarter of the iterations, four loads'
 * bytes in flight), then the last n % 4 one at a time. */
template <bool SQUARE>
__global__ static void sum_partial_kernel(double *partial, const float *x, size_t n)
{
    __shared__ double s[RED_THREADS];
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t n4 = (uintptr_t)x % 16 == 0 ? n / 4 : 0;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    double acc = 0.0;
    for (size_t i = first; i < n4; i += stride) {
        const float4 v = x4[i];
        acc += (term<SQUARE>(v.x) + term<SQUARE>(v.y)) + (term<SQUARE>(v.z) + term<SQUARE>(v.w));
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride) acc += term<SQUARE>(x[i]);
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = RED_THREADS / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

/* *out = Σ partial[0..n), in order (n is small). */
__global__ static void sum_final_kernel(double *out, const double *partial, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    *out = s;
}

template <bool SQUARE>
static double sum_double(kn_ctx *k, const float *x, size_t n)
{
    if (!n) return 0.0;
    double *ws = (double *)kn_cuda_workspace(k, (RED_BLOCKS + 1) * sizeof(double));
    sum_partial_kernel<SQUARE><<<RED_BLOCKS, RED_THREADS, 0, kn_stream(k)>>>(ws, x, n);
    CUDA_LAUNCHED();
    sum_final_kernel<<<1, 1, 0, kn_stream(k)>>>(ws + RED_BLOCKS, ws, RED_BLOCKS);
    CUDA_LAUNCHED();
    CUDA_CHECK(cudaMemcpyAsync(k->cuda->host_sum, ws + RED_BLOCKS, sizeof(double),
                               cudaMemcpyDeviceToHost, kn_stream(k)));
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k)));
    return *k->cuda->host_sum;
}

double kn_cuda_sum_squares(kn_ctx *k, const float *x, size_t n)
{
    return sum_double<true>(k, x, n);
}

double kn_cuda_sum(kn_ctx *k, const float *x, size_t n)
{
    return sum_double<false>(k, x, n);
}

__global__ static void sum_partials_kernel(float *dst, const float *partial, int parts, int n)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float s = 0.0f;
    for (int p = 0; p < parts; p++) s += partial[(size_t)p * n + c];
    dst[c] += s;
}

void kn_cuda_sum_partials(kn_ctx *k, float *dst, const float *partial, int parts, int n)
{
    if (n <= 0) return; /* a grid of 0 blocks is a launch error (abort), not a no-op */
    sum_partials_kernel<<<(n + 255) / 256, 256, 0, kn_stream(k)>>>(dst, partial, parts, n);
    CUDA_LAUNCHED();
}
