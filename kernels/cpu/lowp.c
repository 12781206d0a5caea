/* The CPU backend with CUDA's bf16 copies of the matmul inputs emulated (kn_create
 * "cpu-lowp"): for tests of the code that hands the copies around (kernels.h "Low-
 * precision copies"), which otherwise runs only on a GPU. kn_lowp_bytes is 2 per value;
 * a copy is the bf16 of its fp32 values (round to nearest even); a matmul given inp_lp or
 * dout_lp multiplies the copy's values, not the fp32 ones, so a copy that is missing or
 * stale changes the result; and where kernels.h lets the fp32 output go unwritten beside
 * its copy (the GELU output, dpre, dqkv, a set backward's dinp), it is filled with NaN, so
 * that a reader of it shows; the layernorm backward given dout_lp reads the copy's values.
 * The layernorm backward's dinp stays valid beside its copy: it goes on accumulating.
 * Weights stay fp32 (CUDA rounds them too: these tests check the plumbing, not the
 * rounding), but for those inside a registered mirror (kn_lowp_mirror): a matmul reads
 * the mirror's bf16 values, as CUDA does, so a mirror not made again after a write to
 * its weights gives the old weights' results. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu.h"

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void bf16_copy(void *lp, const float *src, size_t n)
{
    uint16_t *d = lp;
    for (size_t i = 0; i < n; i++) d[i] = bf16_of(src[i]);
}

static void lowp_to_lowp(kn_ctx *k, void *lp, const float *src, size_t n) { bf16_copy(lp, src, n); }

/* The fp32 values of n bf16 (malloc'ed; aborts when memory runs out, as the workspace). */
static void *alloc_or_abort(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "pliant kernels (cpu-lowp): cannot allocate %zu bytes\n", bytes);
        abort();
    }
    return p;
}

static float *values_of(const void *lp, size_t n)
{
    float *f = alloc_or_abort(n * sizeof *f);
    const uint16_t *h = lp;
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&f[i], &u, sizeof f[i]);
    }
    return f;
}

/* Where a copy is given, its values (to be freed); else the fp32 ones. */
static const float *operand(const float *f, const void *lp, size_t n, float **owned)
{
    *owned = lp ? values_of(lp, n) : NULL;
    return lp ? *owned : f;
}

/* The weight's values: its mirror's where one is registered (to be freed), else fp32. */
static const float *weight_of(kn_ctx *k, const float *w, size_t n, float **owned)
{
    return operand(w, kn_lowp_mirror_of(k, w, n), n, owned);
}

/* out's copy, then out itself NaN: only the copy may be read (kernels.h). */
static void keep_copy_only(float *out, void *lp, size_t n)
{
    if (!lp) return;
    bf16_copy(lp, out, n);
    for (size_t i = 0; i < n; i++) out[i] = NAN;
}

static void lowp_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias, int B,
                                   int T, int C)
{
    kn_cpu_layernorm_forward(k, out, NULL, mean, rstd, inp, weight, bias, B, T, C);
    keep_copy_only(out, out_lp, (size_t)B * T * C);
}

static void lowp_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                    float *dbias, const float *dout, const void *dout_lp,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int B, int T, int C)
{
    float *tmp;
    const float *d = operand(dout, dout_lp, (size_t)B * T * C, &tmp);
    kn_cpu_layernorm_backward(k, dinp, NULL, dweight, dbias, d, NULL, inp, weight, mean, rstd, B,
                              T, C);
    free(tmp);
    if (dinp_lp) bf16_copy(dinp_lp, dinp, (size_t)B * T * C);
}

static void lowp_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                                const void *inp_lp, const float *weight, const float *bias, int BT,
                                int C, int OC)
{
    float *tmp, *tmp_w;
    const float *x = operand(inp, inp_lp, (size_t)BT * C, &tmp);
    const float *w = weight_of(k, weight, (size_t)OC * C, &tmp_w);
    kn_cpu_matmul_forward(k, out, NULL, x, NULL, w, bias, BT, C, OC);
    free(tmp);
    free(tmp_w);
    keep_copy_only(out, out_lp, (size_t)BT * OC);
}

/* kn_cpu_matmul_backward or _set on the copies' values where given; _set with dinp_lp
 * leaves only dinp's copy. */
static void backward_of(kn_ctx *k, int set, float *dinp, void *dinp_lp, float *dweight,
                        float *dbias, const float *dout, const void *dout_lp, const float *inp,
                        const void *inp_lp, const float *weight, int BT, int C, int OC)
{
    float *tmp_d, *tmp_x, *tmp_w;
    const float *d = operand(dout, dout_lp, (size_t)BT * OC, &tmp_d);
    const float *x = operand(inp, inp_lp, (size_t)BT * C, &tmp_x);
    const float *w = weight_of(k, weight, (size_t)OC * C, &tmp_w);
    if (set)
        kn_cpu_matmul_backward_set(k, dinp, NULL, dweight, dbias, d, NULL, x, NULL, w, BT, C, OC);
    else
        kn_cpu_matmul_backward(k, dinp, dweight, dbias, d, NULL, x, NULL, w, BT, C, OC);
    free(tmp_d);
    free(tmp_x);
    free(tmp_w);
    if (dinp) keep_copy_only(dinp, dinp_lp, (size_t)BT * C);
}

static void lowp_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const void *dout_lp, const float *inp,
                                 const void *inp_lp, const float *weight, int BT, int C, int OC)
{
    backward_of(k, 0, dinp, NULL, dweight, dbias, dout, dout_lp, inp, inp_lp, weight, BT, C, OC);
}

static void lowp_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                     float *dbias, const float *dout, const void *dout_lp,
                                     const float *inp, const void *inp_lp, const float *weight,
                                     int BT, int C, int OC)
{
    backward_of(k, 1, dinp, dinp_lp, dweight, dbias, dout, dout_lp, inp, inp_lp, weight, BT, C,
                OC);
}

/* pre in CUDA's bf16 format (kernels.h: n bf16, all the buffer holds), out the GELU of
 * those values. */
static void lowp_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre,
                                     const float *inp, const void *inp_lp, const float *weight,
                                     const float *bias, int BT, int C, int OC)
{
    const size_t n = (size_t)BT * OC;
    float *tmp, *tmp_w;
    const float *x = operand(inp, inp_lp, (size_t)BT * C, &tmp);
    const float *w = weight_of(k, weight, (size_t)OC * C, &tmp_w);
    float *full = alloc_or_abort(n * sizeof *full);
    kn_cpu_matmul_forward(k, full, NULL, x, NULL, w, bias, BT, C, OC);
    free(tmp);
    free(tmp_w);
    bf16_copy(pre, full, n);
    free(full);
    float *p = values_of(pre, n);
    kn_cpu_gelu_forward(k, out, p, n);
    free(p);
    keep_copy_only(out, out_lp, n);
}

static void lowp_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                      float *dbias, const float *dout, const void *dout_lp,
                                      const float *inp, const void *inp_lp, const float *weight,
                                      const float *pre, int BT, int C, int OC)
{
    float *tmp_d, *tmp_x, *tmp_w, *p = values_of(pre, (size_t)BT * C);
    const float *d = operand(dout, dout_lp, (size_t)BT * OC, &tmp_d);
    const float *x = operand(inp, inp_lp, (size_t)BT * C, &tmp_x);
    const float *w = weight_of(k, weight, (size_t)OC * C, &tmp_w);
    kn_cpu_matmul_backward_gelu(k, dpre, NULL, dweight, dbias, d, NULL, x, NULL, w, p, BT, C, OC);
    free(tmp_d);
    free(tmp_x);
    free(tmp_w);
    free(p);
    keep_copy_only(dpre, dpre_lp, (size_t)BT * C);
}

/* The attention on qkv's copy where given (the backward too: CUDA's reads the
 * operands the forward packed from it); out, with out_lp, only as its copy. The
 * backward reads dout and out through their copies where given; the CPU kernel
 * ignores out, but CUDA's sums dout ∘ out, so a NaN in the out it is given (an
 * fp32 out left unwritten whose copy was not passed) makes dqkv NaN here too. */
static void lowp_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att,
                                   const float *qkv, const void *qkv_lp, int B, int T, int C,
                                   int NH)
{
    float *tmp;
    const float *x = operand(qkv, qkv_lp, (size_t)B * T * 3 * C, &tmp);
    kn_cpu_attention_forward(k, out, NULL, att, x, NULL, B, T, C, NH);
    free(tmp);
    keep_copy_only(out, out_lp, (size_t)B * T * C);
}

static void lowp_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                                    const void *dout_lp, const float *qkv, const void *qkv_lp,
                                    const float *att, const float *out, const void *out_lp, int B,
                                    int T, int C, int NH)
{
    float *tmp, *tmp_d, *tmp_o;
    const size_t n = (size_t)B * T * C;
    const float *x = operand(qkv, qkv_lp, 3 * n, &tmp);
    const float *d = operand(dout, dout_lp, n, &tmp_d);
    const float *o = operand(out, out_lp, n, &tmp_o);
    kn_cpu_attention_backward(k, dqkv, NULL, d, NULL, x, NULL, att, o, NULL, B, T, C, NH);
    for (size_t i = 0; i < n; i++)
        if (isnan(o[i])) {
            for (size_t j = 0; j < 3 * n; j++) dqkv[j] = NAN;
            break;
        }
    free(tmp);
    free(tmp_d);
    free(tmp_o);
    keep_copy_only(dqkv, dqkv_lp, (size_t)B * T * 3 * C);
}

void kn_cpu_lowp_ops(kn_ops *ops)
{
    ops->name = "cpu-lowp";
    ops->to_lowp = lowp_to_lowp;
    ops->layernorm_forward = lowp_layernorm_forward;
    ops->layernorm_backward = lowp_layernorm_backward;
    ops->matmul_forward = lowp_matmul_forward;
    ops->matmul_backward = lowp_matmul_backward;
    ops->matmul_backward_set = lowp_matmul_backward_set;
    ops->matmul_gelu_forward = lowp_matmul_gelu_forward;
    ops->matmul_backward_gelu = lowp_matmul_backward_gelu;
    ops->attention_forward = lowp_attention_forward;
    ops->attention_backward = lowp_attention_backward;
}
