/* AdamW with bias correction and a gradient scale (kernels/cpu/adamw.c). */
#include <math.h>

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
