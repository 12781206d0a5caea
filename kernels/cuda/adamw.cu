/* AdamW with bias correction and a gradient scale (kernels/cpu/adamw.c). */
#include <math.h>
#include <string.h>

#include "cuda.cuh"

__global__ static void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    float lr, float b1, float b2, float eps, float wd, float s,
                                    float c1, float c2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float grad = g[i] * s;
        float mi = b1 * m[i] + (1.0f - b1) * grad;
        float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
        m[i] = mi;
        v[i] = vi;
        p[i] -= lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + wd * p[i]);
    }
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
 * are uniform) and updated exactly as adamw_kernel updates it. */
struct adamw_spans {
    size_t start[KN_ADAMW_SPANS + 1]; /* start[n]: the total */
    size_t offset[KN_ADAMW_SPANS];
    float wd[KN_ADAMW_SPANS];
    int n;
};

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
        const size_t j = sp.offset[lo] + (i - sp.start[lo]);
        const float wd = sp.wd[lo];
        float grad = g[j] * s;
        float mi = b1 * m[j] + (1.0f - b1) * grad;
        float vi = b2 * v[j] + (1.0f - b2) * grad * grad;
        m[j] = mi;
        v[j] = vi;
        p[j] -= lr * ((mi * c1) / (sqrtf(vi * c2) + eps) + wd * p[j]);
    }
}

void kn_cuda_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m,
                                float *v, const kn_adamw_span *spans, int nspans, float lr,
                                float beta1, float beta2, float eps, float weight_decay,
                                float grad_scale, int t)
{
    float c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
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
            total += spans[i].n;
        }
        sp.start[sp.n] = total;
        if (!total) continue;
        adamw_spans_kernel<<<kn_blocks(total, 256), 256, 0, kn_stream(k)>>>(
            params, grads, m, v, sp, lr, beta1, beta2, eps, grad_scale, c1, c2);
        CUDA_LAUNCHED();
    }
}
