/* Backend dispatch: every kn_* function is one indirect call through the
 * context's kn_ops table (kernels/kn_backend.h). The CUDA backend is compiled in
 * only by `make cuda`, which builds this file again with PLIANT_CUDA defined
 * into build/lib/libpliant_kernels_cuda.a. */
#include <stdio.h>
#include <string.h>

#include "kn_backend.h"

kn_ctx *kn_create(const char *backend, int threads, char *err, size_t errlen)
{
    if (backend && strcmp(backend, "cpu") == 0) return kn_cpu_create(threads, err, errlen);
    if (backend && strcmp(backend, "cuda") == 0) {
#ifdef PLIANT_CUDA
        return kn_cuda_create(threads, err, errlen);
#else
        if (err && errlen) snprintf(err, errlen, "this build has no CUDA backend (make cuda)");
        return NULL;
#endif
    }
    if (err && errlen)
        snprintf(err, errlen, "unknown kernel backend \"%s\" (known: cpu, cuda)",
                 backend ? backend : "(null)");
    return NULL;
}

void kn_destroy(kn_ctx *k)
{
    if (k) k->ops->destroy(k);
}

const char *kn_backend(const kn_ctx *k) { return k->ops->name; }
int kn_threads(const kn_ctx *k) { return k->threads; }

void *kn_alloc(kn_ctx *k, size_t bytes) { return k->ops->alloc(k, bytes); }
void kn_free(kn_ctx *k, void *p) { k->ops->free(k, p); }
void kn_zero(kn_ctx *k, void *p, size_t bytes) { k->ops->zero(k, p, bytes); }

void kn_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    k->ops->to_device(k, dst, src, bytes);
}

void kn_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    k->ops->to_host(k, dst, src, bytes);
}

void kn_sync(kn_ctx *k) { k->ops->sync(k); }

void kn_copy(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    k->ops->copy(k, dst, src, bytes);
}

void *kn_host_alloc(kn_ctx *k, size_t bytes) { return k->ops->host_alloc(k, bytes); }
void kn_host_free(kn_ctx *k, void *p) { k->ops->host_free(k, p); }
const char *kn_precision(const kn_ctx *k) { return k->precision; }

void kn_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C)
{
    k->ops->encoder_forward(k, out, inp, wte, wpe, B, T, C);
}

void kn_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C)
{
    k->ops->encoder_backward(k, dwte, dwpe, dout, inp, B, T, C);
}

void kn_layernorm_forward(kn_ctx *k, float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int B, int T, int C)
{
    k->ops->layernorm_forward(k, out, mean, rstd, inp, weight, bias, B, T, C);
}

void kn_layernorm_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                           const float *dout, const float *inp, const float *weight,
                           const float *mean, const float *rstd, int B, int T, int C)
{
    k->ops->layernorm_backward(k, dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
}

void kn_matmul_forward(kn_ctx *k, float *out, const float *inp, const float *weight,
                       const float *bias, int BT, int C, int OC)
{
    k->ops->matmul_forward(k, out, inp, weight, bias, BT, C, OC);
}

void kn_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int BT, int C, int OC)
{
    k->ops->matmul_backward(k, dinp, dweight, dbias, dout, inp, weight, BT, C, OC);
}

size_t kn_attention_state_floats(kn_ctx *k, int B, int T, int NH)
{
    return k->ops->attention_state_floats(k, B, T, NH);
}

void kn_attention_forward(kn_ctx *k, float *out, float *att, const float *qkv, int B, int T,
                          int C, int NH)
{
    k->ops->attention_forward(k, out, att, qkv, B, T, C, NH);
}

void kn_attention_backward(kn_ctx *k, float *dqkv, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH)
{
    k->ops->attention_backward(k, dqkv, dout, qkv, att, B, T, C, NH);
}

void kn_matmul_gelu_forward(kn_ctx *k, float *out, float *pre, const float *inp,
                            const float *weight, const float *bias, int BT, int C, int OC)
{
    k->ops->matmul_gelu_forward(k, out, pre, inp, weight, bias, BT, C, OC);
}

void kn_matmul_backward_gelu(kn_ctx *k, float *dpre, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *pre, int BT, int C, int OC)
{
    k->ops->matmul_backward_gelu(k, dpre, dweight, dbias, dout, inp, weight, pre, BT, C, OC);
}

void kn_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n)
{
    k->ops->gelu_forward(k, out, inp, n);
}

void kn_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n)
{
    k->ops->gelu_backward(k, dinp, inp, dout, n);
}

void kn_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n)
{
    k->ops->residual_forward(k, out, a, b, n);
}

void kn_accumulate(kn_ctx *k, float *dst, const float *src, size_t n)
{
    k->ops->accumulate(k, dst, src, n);
}

void kn_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs, const float *logits,
                                     const int32_t *targets, int BT, int V, int Vp)
{
    k->ops->softmax_crossentropy_forward(k, losses, probs, logits, targets, BT, V, Vp);
}

void kn_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                      const int32_t *targets, float dloss_scale, int BT, int V,
                                      int Vp)
{
    k->ops->crossentropy_softmax_backward(k, dlogits, probs, targets, dloss_scale, BT, V, Vp);
}

void kn_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t)
{
    k->ops->adamw_update(k, params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay,
                         grad_scale, t);
}

double kn_sum_squares(kn_ctx *k, const float *x, size_t n) { return k->ops->sum_squares(k, x, n); }
double kn_sum(kn_ctx *k, const float *x, size_t n) { return k->ops->sum(k, x, n); }
