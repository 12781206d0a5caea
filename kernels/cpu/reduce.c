/* Sums in double. The input is cut into fixed chunks whose partial sums are
 * added in order, so the result does not depend on the number of threads
 * (replicas with different thread counts agree on the gradient norm). */
#include <omp.h>

#include "cpu.h"

#define RED_CHUNK 65536

KN_SIMD static double sumsq_span(const float *x, size_t n)
{
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

KN_SIMD static double sum_span(const float *x, size_t n)
{
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i];
    return s;
}

static double chunked(kn_ctx *k, const float *x, size_t n, double (*span)(const float *, size_t))
{
    size_t nchunks = (n + RED_CHUNK - 1) / RED_CHUNK;
    if (nchunks <= 1) return n ? span(x, n) : 0.0;
    double *part = kn_cpu_workspace(k, nchunks * sizeof(double));
#pragma omp parallel for num_threads(k->threads) schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = c * RED_CHUNK, len = n - lo < RED_CHUNK ? n - lo : RED_CHUNK;
        part[c] = span(x + lo, len);
    }
    double s = 0.0;
    for (size_t c = 0; c < nchunks; c++) s += part[c];
    return s;
}

double kn_cpu_sum_squares(kn_ctx *k, const float *x, size_t n)
{
    return chunked(k, x, n, sumsq_span);
}

double kn_cpu_sum(kn_ctx *k, const float *x, size_t n)
{
    return chunked(k, x, n, sum_span);
}
