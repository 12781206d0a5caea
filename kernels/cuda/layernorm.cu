/* LayerNorm over channels, eps 1e-5 (kernels/cpu/layernorm.c); the kernels
 * are in layernorm_kernels.cuh. The parameter gradients go through per-block
 * partial sums added in order (no atomics: the same result every run). */
#include "cuda.cuh"
#include "layernorm_kernels.cuh"

void kn_cuda_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int B,
                               int T, int C)
{
    const long BT = (long)B * T;
    if (BT <= 0) return;
    const unsigned blocks = (unsigned)((BT + LN_WARPS - 1) / LN_WARPS);
    const int v = ln_vec(C, ln_aligned16(out) && ln_aligned16(out_lp) && ln_aligned16(inp) &&
                                ln_aligned16(weight) && ln_aligned16(bias));
    const ln_forward_fn kernel = v ? ln_forward_vec[v - 1] : layernorm_forward_kernel;
    kernel<<<blocks, LN_THREADS, 0, kn_stream(k)>>>(out, (__nv_bfloat16 *)out_lp, mean, rstd, inp,
                                                     weight, bias, BT, C);
    CUDA_LAUNCHED();
}

/* Scalar path: dinp (and its bf16 copy) and the parameter gradients in separate kernels;
 * dout of type D. */
template <typename D>
static void layernorm_backward_scalar(kn_ctx *k, float *dinp, __nv_bfloat16 *dinp_lp,
                                      float *dweight, float *dbias, const D *dout,
                                      const float *inp, const float *weight, const float *mean,
                                      const float *rstd, long BT, int C)
{
    if (dinp) {
        unsigned blocks = (unsigned)((BT + LN_WARPS - 1) / LN_WARPS);
        layernorm_dinp_kernel<D><<<blocks, LN_THREADS, 0, kn_stream(k)>>>(
            dinp, dinp_lp, dout, inp, weight, mean, rstd, BT, C);
        CUDA_LAUNCHED();
    }
    if (dweight || dbias) {
        int parts = (int)((BT + LN_ROWS - 1) / LN_ROWS);
        float *partial = (float *)kn_cuda_workspace(k, 2 * (size_t)parts * C * sizeof(float));
        dim3 grid((C + 31) / 32, parts);
        layernorm_params_kernel<D><<<grid, LN_THREADS, 0, kn_stream(k)>>>(partial, dout, inp,
                                                                          mean, rstd, BT, C);
        CUDA_LAUNCHED();
        if (dweight) kn_cuda_sum_partials(k, dweight, partial, parts, C);
        if (dbias) kn_cuda_sum_partials(k, dbias, partial + (size_t)parts * C, parts, C);
    }
}

/* The register path where v (float4s a lane) is not 0, else the scalar kernels. */
template <typename D>
static void layernorm_backward_of(kn_ctx *k, int v, float *dinp, __nv_bfloat16 *dinp_lp,
                                  float *dweight, float *dbias, const D *dout, const float *inp,
                                  const float *weight, const float *mean, const float *rstd,
                                  long BT, int C)
{
    if (!(dinp && dweight && dbias && v)) { /* the engine's case has all three, C = 768 */
        layernorm_backward_scalar<D>(k, dinp, dinp_lp, dweight, dbias, dout, inp, weight, mean,
                                     rstd, BT, C);
        return;
    }
    const unsigned parts = (unsigned)((BT + LN_BWD_ROWS - 1) / LN_BWD_ROWS);
    float *partial = (float *)kn_cuda_workspace(k, 2 * (size_t)parts * C * sizeof(float));
    ln_backward_vec<D>[v - 1]<<<parts, LN_THREADS, 0, kn_stream(k)>>>(
        dinp, dinp_lp, partial, dout, inp, weight, mean, rstd, BT, C);
    CUDA_LAUNCHED();
    kn_cuda_sum_partials(k, dweight, partial, (int)parts, C);
    kn_cuda_sum_partials(k, dbias, partial + (size_t)parts * C, (int)parts, C);
}

/* dout from its bf16 copy where given (bf16 mode; 8-byte rows suffice for its loads). */
void kn_cuda_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                float *dbias, const float *dout, const void *dout_lp,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int B, int T, int C)
{
    const long BT = (long)B * T;
    if (BT <= 0 || C <= 0) return; /* C = 0: nothing to do (and a 0-block grid would abort) */
    __nv_bfloat16 *lp = (__nv_bfloat16 *)dinp_lp;
    const __nv_bfloat16 *d16 = (const __nv_bfloat16 *)dout_lp;
    const bool dout_ok = d16 ? ln_aligned8(d16) : ln_aligned16(dout);
    const int v = ln_vec(C, ln_aligned16(dinp) && ln_aligned16(lp) && dout_ok &&
                                ln_aligned16(inp) && ln_aligned16(weight));
    if (d16)
        layernorm_backward_of(k, v, dinp, lp, dweight, dbias, d16, inp, weight, mean, rstd, BT,
                              C);
    else
        layernorm_backward_of(k, v, dinp, lp, dweight, dbias, dout, inp, weight, mean, rstd, BT,
                              C);
}
