/* AdamW with bias correction and a gradient scale (kernels/cpu/adamw.c). */
#include <math.h>
#include <string.h>

#include "cuda.cuh"

/* One parameter's update (the CPU's arithmetic). */
__device__ static inline void adamw_one(float &p, float g, float &m, float &v, float lr, float b1,
                                        float b2, float eps, float wd, float s, float c1, float c2)
{
    float grad = g * s;
    m = b1 * m + (1.0f - b1) * grad;
    v = b2 * v + (1.0f - b2) * grad * grad;
    p -= lr * ((m * c1) / (sqrtf(v * c2) + eps) + wd * p);
}

/* Four parameters from 16-byte aligned j: one 16-byte load and store per array. */
__device__ static inline void adamw_four(float *p, const float *g, float *m, float *v, size_t j,
                                         float lr, float b1, float b2, float eps, float wd,
                                         float s, float c1, float c2)
{
    float4 P = *(float4 *)(p + j), M = *(float4 *)(m + j), V = *(float4 *)(v + j);
    const float4 G = *(const float4 *)(g + j);
    adamw_one(P.x, G.x, M.x, V.x, lr, b1, b2, eps, wd, s, c1, c2);
    adamw_one(P.y, G.y, M.y, V.y, lr, b1, b2, eps, wd, s, c1, c2);
    adamw_one(P.z, G.z, M.z, V.z, lr, b1, b2, eps, wd, s, c1, c2);
    adamw_one(P.w, G.w, M.w, V.w, lr, b1, b2, eps, wd, s, c1, c2);
    *(float4 *)(p + j) = P;
    *(float4 *)(m + j) = M;
    *(float4 *)(v + j) = V;
}

__global__ static void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float b1, float b2, float eps, float wd, float s,
                                    float c1, float c2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        adamw_one(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, s, c1, c2);
}

void kn_cuda_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                          size_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, float grad_scale, int t)
{
    if (!n) return;
    /* bias corrections in double on the host, as the CPU kernel computes them */
    float c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    adamw_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(
        params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, c1, c2);
    CUDA_LAUNCHED();
}

/* ---- many tensors in one launch ------------------------------------------------
 * The spans travel in the kernel's parameters (about 3.2 KB for KN_ADAMW_SPANS,
 * within the 4 KB limit): start[s] is where span s begins in the spans laid end
 * to end, so a thread's element i of that virtual range is found by a binary
 * search over start (warps mostly stay in one span, so the constant-bank reads
 * are uniform) and updated exactly as adamw_kernel updates it. With VEC 4 (every
 * span's offset and length multiples of 4, the arrays 16-byte aligned) an element
 * of the range stands for 4 parameters: a quarter of the searches, 16-byte
 * accesses. */
struct adamw_spans {
    size_t start[KN_ADAMW_SPANS + 1]; /* start[n]: the total */
    size_t offset[KN_ADAMW_SPANS];
    float wd[KN_ADAMW_SPANS];
    int n;
};

template <int VEC>
__global__ static void adamw_spans_kernel(float *p, const float *g, float *m, float *v,
                                          const __grid_constant__ adamw_spans sp, float lr,
                                          float b1, float b2, float eps, float s, float c1,
                                          float c2)
{
    const size_t total = sp.start[sp.n];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = sp.n - 1; /* the last span with start ≤ i */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (sp.start[mid] <= i) lo = mid;
            else hi = mid - 1;
        }
        const size_t j = sp.offset[lo] + VEC * (i - sp.start[lo]);
        if (VEC == 4) adamw_four(p, g, m, v, j, lr, b1, b2, eps, sp.wd[lo], s, c1, c2);
        else adamw_one(p[j], g[j], m[j], v[j], lr, b1, b2, eps, sp.wd[lo], s, c1, c2);
    }
}

/* Can every span go 4 parameters at a time? */
static bool spans_by_four(const float *params, const float *grads, const float *m,
                          const float *v, const kn_adamw_span *spans, int nspans)
{
    if (((uintptr_t)params | (uintptr_t)grads | (uintptr_t)m | (uintptr_t)v) % 16) return false;
    for (int i = 0; i < nspans; i++)
        if (spans[i].offset % 4 || spans[i].n % 4) return false;
    return true;
}

void kn_cuda_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m,
                                float *v, const kn_adamw_span *spans, int nspans, float lr,
                                float beta1, float beta2, float eps, float weight_decay,
                                float grad_scale, int t)
{
    float c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    const int vec = spans_by_four(params, grads, m, v, spans, nspans) ? 4 : 1;
    for (int s0 = 0; s0 < nspans; s0 += KN_ADAMW_SPANS) {
        adamw_spans sp;
        memset(&sp, 0, sizeof sp);
        size_t total = 0;
        for (int i = s0; i < nspans && i < s0 + KN_ADAMW_SPANS; i++) {
            if (!spans[i].n) continue; /* an empty span would share its start with the next */
            sp.start[sp.n] = total;
            sp.offset[sp.n] = spans[i].offset;
            sp.wd[sp.n] = spans[i].decay ? weight_decay : 0.0f;
            sp.n++;
            total += spans[i].n / vec;
        }
        sp.start[sp.n] = total;
        if (!total) continue;
        if (vec == 4)
            adamw_spans_kernel<4><<<kn_blocks(total, 256), 256, 0, kn_stream(k)>>>(
                params, grads, m, v, sp, lr, beta1, beta2, eps, grad_scale, c1, c2);
        else
            adamw_spans_kernel<1><<<kn_blocks(total, 256), 256, 0, kn_stream(k)>>>(
                params, grads, m, v, sp, lr, beta1, beta2, eps, grad_scale, c1, c2);
        CUDA_LAUNCHED();
    }
}
