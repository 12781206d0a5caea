/* Token + position embedding (llm.c encoder_forward / encoder_backward), bound-checked:
 * a token id outside the vocabulary gives a NaN row and no gradient (kernels.h). */
#include <math.h>
#include <omp.h>

#include "cpu.h"

KN_SIMD static void add_rows(float *restrict out, const float *restrict a,
                             const float *restrict b, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}

KN_SIMD static void acc_row(float *restrict dst, const float *restrict src, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++) dst[i] += src[i];
}

/* Whether id has a row of wte (V rows). */
static inline int in_vocab(int32_t id, int V) { return id >= 0 && id < V; }

void kn_cpu_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                            const float *wpe, int B, int T, int C, int V)
{
    long BT = (long)B * T;
#pragma omp parallel for num_threads(k->threads) schedule(static) \
    if (BT * C >= KN_PAR_MIN)
    for (long bt = 0; bt < BT; bt++) {
        int t = (int)(bt % T);
        if (in_vocab(inp[bt], V))
            add_rows(out + bt * C, wte + (size_t)inp[bt] * C, wpe + (size_t)t * C, C);
        else /* bad data: poisons the step's loss and norm, never memory */
            for (int c = 0; c < C; c++) out[bt * C + c] = NAN;
    }
}

/* Threads own disjoint channel ranges and walk every position in order, so
 * repeated tokens never race and the sums are the same for any thread count. */
void kn_cpu_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int B, int T, int C, int V)
{
    long BT = (long)B * T;
#pragma omp parallel num_threads(k->threads) if (BT * C >= KN_PAR_MIN)
    {
        size_t c0, c1;
        kn_split((size_t)C, omp_get_num_threads(), omp_get_thread_num(), 16, &c0, &c1);
        int n = (int)(c1 - c0);
        if (n > 0) {
            for (long bt = 0; bt < BT; bt++) {
                const float *d = dout + bt * C + c0;
                if (dwte && in_vocab(inp[bt], V)) acc_row(dwte + (size_t)inp[bt] * C + c0, d, n);
                if (dwpe) acc_row(dwpe + (size_t)(bt % T) * C + c0, d, n);
            }
        }
    }
}
