/* Linear layers through cblas_sgemm (row-major), llm.c matmul_forward /
 * matmul_backward. The OpenMP team splits each product along an output
 * dimension and every thread calls a single-threaded sgemm on its slice
 * (see cpu.h for why OpenBLAS's own threads are not used). */
#include <cblas.h>
#include <omp.h>

#include <string.h>

#include "cpu.h"

/* Products below this many multiply-adds run on one thread. */
#define MM_PAR_MIN (1L << 18)

KN_SIMD static void fill_bias(float *restrict row, const float *restrict bias, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) row[i] = bias[i];
}

/* The CPU multiplies fp32 values: no low-precision copies (kn_lowp_bytes is 0), so
 * the _lp arguments are NULL and unused. */
void kn_cpu_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                           const void *inp_lp, const float *weight, const float *bias, int BT,
                           int C, int OC)
{
    if (BT <= 0 || OC <= 0) return;
    long work = (long)BT * C * OC;
#pragma omp parallel num_threads(k->threads) if (work >= MM_PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t r0 = 0, r1 = (size_t)BT, o0 = 0, o1 = (size_t)OC;
        if (OC >= 64 * nt)
            kn_split((size_t)OC, nt, id, 16, &o0, &o1); /* columns of out = rows of W */
        else
            kn_split((size_t)BT, nt, id, 4, &r0, &r1);
        int m = (int)(r1 - r0), n = (int)(o1 - o0);
        if (m > 0 && n > 0) {
            float beta = 0.0f;
            if (bias) {
                for (size_t r = r0; r < r1; r++) fill_bias(out + r * OC + o0, bias + o0, n);
                beta = 1.0f;
            }
            if (C > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, C, 1.0f,
                            inp + r0 * C, C, weight + o0 * C, C, beta, out + r0 * OC + o0, OC);
            else if (!bias)
                for (size_t r = r0; r < r1; r++)
                    for (int j = 0; j < n; j++) out[r * OC + o0 + j] = 0.0f;
        }
    }
}

/* dbias[0, n) += Σ_r dout[r, 0, n) (row stride OC), summed in double per
 * 256-column block. */
KN_SIMD static void column_sums(float *restrict dbias, const float *restrict dout, int BT,
                                int OC, int n)
{
    double acc[256];
    for (int j0 = 0; j0 < n; j0 += 256) {
        int w = n - j0 < 256 ? n - j0 : 256;
        for (int j = 0; j < w; j++) acc[j] = 0.0;
        for (int r = 0; r < BT; r++) {
            const float *d = dout + (size_t)r * OC + j0;
#pragma omp simd
            for (int j = 0; j < w; j++) acc[j] += (double)d[j];
        }
        for (int j = 0; j < w; j++) dbias[j0 + j] += (float)acc[j];
    }
}

void kn_cpu_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                            const void *dout_lp, const float *inp, const void *inp_lp,
                            const float *weight, int BT, int C, int OC)
{
    if (BT <= 0 || OC <= 0 || C < 0) return;
    long work = (long)BT * C * OC;
#pragma omp parallel num_threads(k->threads) if (work >= MM_PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        size_t lo, hi;
        /* dinp[BT, C] += dout[BT, OC] · W[OC, C]: split rows (or columns when few rows). */
        if (dinp && C > 0) {
            if (BT >= 16 * nt) {
                kn_split((size_t)BT, nt, id, 4, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(hi - lo), C, OC,
                                1.0f, dout + lo * OC, OC, weight, C, 1.0f, dinp + lo * C, C);
            } else {
                kn_split((size_t)C, nt, id, 16, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, (int)(hi - lo), OC,
                                1.0f, dout, OC, weight + lo, C, 1.0f, dinp + lo, C);
            }
        }
        /* dweight[OC, C] += dout[BT, OC]ᵀ · inp[BT, C]: split rows of dweight (or columns). */
        if (dweight && C > 0) {
            if (OC >= 16 * nt) {
                kn_split((size_t)OC, nt, id, 16, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(hi - lo), C, BT,
                                1.0f, dout + lo, OC, inp, C, 1.0f, dweight + lo * C, C);
            } else {
                kn_split((size_t)C, nt, id, 16, &lo, &hi);
                if (hi > lo)
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, (int)(hi - lo), BT,
                                1.0f, dout, OC, inp + lo, C, 1.0f, dweight + lo, C);
            }
        }
        /* dbias[OC] += column sums of dout. */
        if (dbias) {
            kn_split((size_t)OC, nt, id, 16, &lo, &hi);
            if (hi > lo) column_sums(dbias + lo, dout + lo, BT, OC, (int)(hi - lo));
        }
    }
}

/* The same products onto a zeroed dinp: bit for bit what zeroing and then
 * accumulating gives (dinp_lp is NULL: the CPU keeps no low-precision copies). */
void kn_cpu_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                float *dbias, const float *dout, const void *dout_lp,
                                const float *inp, const void *inp_lp, const float *weight, int BT,
                                int C, int OC)
{
    if (dinp && BT > 0 && C > 0) memset(dinp, 0, (size_t)BT * C * sizeof(float));
    kn_cpu_matmul_backward(k, dinp, dweight, dbias, dout, dout_lp, inp, inp_lp, weight, BT, C,
                           OC);
}
