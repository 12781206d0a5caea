/* Softmax over the first V of Vp logits and cross-entropy (kernels/cpu/
 * crossentropy.c). Forward: one block per row. Backward: elementwise. */
#include <math.h>

#include "cuda.cuh"

#define CE_THREADS 256

/* Block-wide reduction through shared memory; every thread gets the result. */
template <bool MAX>
__device__ static float block_reduce(float v, float *shared)
{
    v = MAX ? warp_max(v) : warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    __syncthreads(); /* shared may still be read from the previous reduction */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : (MAX ? -INFINITY : 0.0f);
    return MAX ? warp_max(v) : warp_sum(v);
}

/* probs may alias logits: the target's logit is read before the first
 * barrier, and every other element is read and written by the same thread. */
__global__ static void softmax_ce_kernel(float *losses, float *probs, const float *logits,
                                         const int32_t *targets, int V, int Vp)
{
    __shared__ float shared[CE_THREADS / 32];
    const float *l = logits + (size_t)blockIdx.x * Vp;
    float *p = probs + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    float target_logit = target >= 0 && target < V ? l[target] : 0.0f;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, l[i]);
    maxval = block_reduce<true>(maxval, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(l[i] - maxval);
        p[i] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, shared);
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] *= inv;
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) p[i] = 0.0f;
    if (threadIdx.x == 0) /* −log p[target] without log(0) when p[target] underflows */
        losses[blockIdx.x] = target < 0 ? 0.0f : target >= V ? NAN
                                                              : logf(sum) - (target_logit - maxval);
}

void kn_cuda_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs,
                                          const float *logits, const int32_t *targets, int BT,
                                          int V, int Vp)
{
    if (BT <= 0) return;
    softmax_ce_kernel<<<BT, CE_THREADS, 0, kn_stream(k)>>>(losses, probs, logits, targets, V, Vp);
    CUDA_LAUNCHED();
}

/* dlogits may alias probs: each element depends only on itself. */
__global__ static void ce_backward_kernel(float *dlogits, const float *probs,
                                          const int32_t *targets, float scale, int V, int Vp,
                                          size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int target = targets[i / Vp], c = (int)(i % Vp);
        float d = 0.0f;
        if (target >= 0 && c < V) d = (c == target ? probs[i] - 1.0f : probs[i]) * scale;
        dlogits[i] = d;
    }
}

void kn_cuda_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                           const int32_t *targets, float dloss_scale, int BT,
                                           int V, int Vp)
{
    size_t n = (size_t)(BT > 0 ? BT : 0) * Vp;
    if (!n) return;
    ce_backward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(dlogits, probs, targets,
                                                                   dloss_scale, V, Vp, n);
    CUDA_LAUNCHED();
}
