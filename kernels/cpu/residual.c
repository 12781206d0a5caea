/* Residual connection and gradient accumulation. */
#include <omp.h>

#include "cpu.h"

/* out may alias a or b: same index in and out, so no restrict here. */
KN_SIMD static void add_span(float *out, const float *a, const float *b, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

KN_SIMD static void acc_span(float *restrict dst, const float *restrict src, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void kn_cpu_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (hi > lo) add_span(out + lo, a + lo, b + lo, hi - lo);
    }
}

void kn_cpu_accumulate(kn_ctx *k, float *dst, const float *src, size_t n)
{
#pragma omp parallel num_threads(k->threads) if (n >= KN_PAR_MIN)
    {
        size_t lo, hi;
        kn_split(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (hi > lo) acc_span(dst + lo, src + lo, hi - lo);
    }
}
