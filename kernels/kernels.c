/* Backend dispatch: every kn_* function is one indirect call through the
 * context's kn_ops table (kernels/kn_backend.h). The CUDA backend is compiled in
 * only by `make cuda`, which builds this file again with PLIANT_CUDA defined
 * into build/lib/libpliant_kernels_cuda.a. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kn_backend.h"

/* ---- kernel-level timing --------------------------------------------------
 * Each timed call is wrapped by TIMED: while profiling is off that is one
 * well-predicted branch on k->prof_on; while on, the backend's prof_begin and
 * prof_end bracket the call and kernels.c counts it. */

enum {
    OP_ENCODER_FORWARD, OP_ENCODER_BACKWARD, OP_LAYERNORM_FORWARD, OP_LAYERNORM_BACKWARD,
    OP_MATMUL_FORWARD, OP_MATMUL_BACKWARD, OP_MATMUL_GELU_FORWARD, OP_MATMUL_BACKWARD_GELU,
    OP_ATTENTION_FORWARD, OP_ATTENTION_BACKWARD, OP_GELU_FORWARD, OP_GELU_BACKWARD,
    OP_RESIDUAL_FORWARD, OP_ACCUMULATE, OP_SOFTMAX_CROSSENTROPY_FORWARD,
    OP_CROSSENTROPY_SOFTMAX_BACKWARD, OP_ADAMW_UPDATE, OP_SUM_SQUARES, OP_SUM, OP_ZERO,
    OP_CROSSENTROPY_FORWARD, OP_CROSSENTROPY_BACKWARD, OP_LM_HEAD_BACKWARD, OP_TO_LOWP, OP_LM_HEAD_FORWARD,
    OP_MATMUL_RESIDUAL_FORWARD, OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "encoder_forward", "encoder_backward", "layernorm_forward", "layernorm_backward",
    "matmul_forward", "matmul_backward", "matmul_gelu_forward", "matmul_backward_gelu",
    "attention_forward", "attention_backward", "gelu_forward", "gelu_backward",
    "residual_forward", "accumulate", "softmax_crossentropy_forward",
    "crossentropy_softmax_backward", "adamw_update", "sum_squares", "sum", "zero",
    "crossentropy_forward", "crossentropy_backward", "lm_head_backward", "to_lowp", "lm_head_forward",
    "matmul_residual_forward",
};

_Static_assert(OP_COUNT <= KN_PROF_MAX_OPS, "kn_prof holds KN_PROF_MAX_OPS kernels");

#define TIMED(op, call)                                                                    \
    do {                                                                                   \
        if (__builtin_expect(k->prof_on, 0)) {                                             \
            k->ops->prof_begin(k);                                                         \
            call;                                                                          \
            k->ops->prof_end(k, (op));                                                     \
            k->prof->calls[(op)]++;                                                        \
        } else {                                                                           \
            call;                                                                          \
        }                                                                                  \
    } while (0)

int kn_profile_enable(kn_ctx *k, int on)
{
    if (on && !k->prof) {
        k->prof = calloc(1, sizeof *k->prof);
        if (!k->prof) {
            k->prof_on = 0;
            return -1;
        }
    }
    k->prof_on = on != 0;
    return 0;
}

/* Brings every recorded call into k->prof->ms (CUDA: waits for the stream). */
static void prof_collect(kn_ctx *k)
{
    if (k->prof && k->ops->prof_collect) k->ops->prof_collect(k);
}

int kn_profile_report(kn_ctx *k, kn_profile_entry *out, int max)
{
    if (!k->prof) return 0;
    prof_collect(k);
    int n = 0;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!k->prof->calls[op]) continue;
        /* insertion by descending time: at most OP_COUNT entries */
        kn_profile_entry e = {op_names[op], k->prof->calls[op], k->prof->ms[op]};
        int i = n < max ? n : max;
        while (i > 0 && out[i - 1].ms < e.ms) {
            if (i < max) out[i] = out[i - 1];
            i--;
        }
        if (i < max) out[i] = e;
        n++;
    }
    return n;
}

void kn_profile_reset(kn_ctx *k)
{
    if (!k->prof) return;
    prof_collect(k); /* pending pairs must not land after the reset */
    memset(k->prof->calls, 0, sizeof k->prof->calls);
    memset(k->prof->ms, 0, sizeof k->prof->ms);
}

int kn_memory_stats(kn_ctx *k, kn_mem_stats *out)
{
    memset(out, 0, sizeof *out);
    return k->ops->memory_stats ? k->ops->memory_stats(k, out) : -1;
}

kn_ctx *kn_create(const char *backend, int threads, char *err, size_t errlen)
{
    if (backend && strcmp(backend, "cpu") == 0) return kn_cpu_create(threads, err, errlen);
    if (backend && strcmp(backend, "cpu-lowp") == 0) /* for tests: kernels/cpu/lowp.c */
        return kn_cpu_lowp_create(threads, err, errlen);
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
    if (!k) return;
    kn_prof *prof = k->prof; /* kernels.c's; the backend frees k (and its event pool) */
    k->ops->destroy(k);
    free(prof);
}

const char *kn_backend(const kn_ctx *k) { return k->ops->name; }
int kn_threads(const kn_ctx *k) { return k->threads; }

void *kn_alloc(kn_ctx *k, size_t bytes) { return k->ops->alloc(k, bytes); }
void kn_free(kn_ctx *k, void *p) { k->ops->free(k, p); }
void kn_zero(kn_ctx *k, void *p, size_t bytes) { TIMED(OP_ZERO, k->ops->zero(k, p, bytes)); }

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

int kn_share(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block, size_t src_off,
             size_t bytes)
{
    return k->ops->share ? k->ops->share(k, dst_block, dst_off, src_block, src_off, bytes) : -1;
}

int kn_populate(kn_ctx *k, void *p, size_t bytes)
{
    return k->ops->populate ? k->ops->populate(k, p, bytes) : -1;
}

void *kn_host_alloc(kn_ctx *k, size_t bytes) { return k->ops->host_alloc(k, bytes); }
void kn_host_free(kn_ctx *k, void *p) { k->ops->host_free(k, p); }
const char *kn_precision(const kn_ctx *k) { return k->precision; }
const char *kn_device_id(const kn_ctx *k) { return k->device; }

size_t kn_device_memory(const kn_ctx *k)
{
    if (k && k->device_memory) return k->device_memory;
    return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}
void *kn_stream_handle(kn_ctx *k) { return k->stream; }

void kn_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C, int V)
{
    TIMED(OP_ENCODER_FORWARD, k->ops->encoder_forward(k, out, inp, wte, wpe, B, T, C, V));
}

void kn_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C, int V)
{
    TIMED(OP_ENCODER_BACKWARD, k->ops->encoder_backward(k, dwte, dwpe, dout, inp, B, T, C, V));
}

void kn_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                          const float *inp, const float *weight, const float *bias, int B, int T,
                          int C)
{
    TIMED(OP_LAYERNORM_FORWARD,
          k->ops->layernorm_forward(k, out, out_lp, mean, rstd, inp, weight, bias, B, T, C));
}

void kn_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight, float *dbias,
                           const float *dout, const void *dout_lp, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B,
                           int T, int C)
{
    TIMED(OP_LAYERNORM_BACKWARD, k->ops->layernorm_backward(k, dinp, dinp_lp, dweight, dbias, dout,
                                                            dout_lp, inp, weight, mean, rstd, B,
                                                            T, C));
}

size_t kn_lowp_bytes(kn_ctx *k, size_t n) { return n * k->lowp_size; }

void kn_to_lowp(kn_ctx *k, void *lp, const float *src, size_t n)
{
    TIMED(OP_TO_LOWP, k->ops->to_lowp(k, lp, src, n));
}

/* The entry for src, else a free one (NULL: none left). */
static struct kn_mirror *mirror_slot(kn_ctx *k, const float *src)
{
    struct kn_mirror *free_one = NULL;
    for (int i = 0; i < KN_MIRRORS; i++) {
        if (k->mirrors[i].n && k->mirrors[i].src == src) return &k->mirrors[i];
        if (!k->mirrors[i].n && !free_one) free_one = &k->mirrors[i];
    }
    return free_one;
}

void kn_lowp_mirror(kn_ctx *k, void *lp, const float *src, size_t n)
{
    if (!k->lowp_size) return;
    struct kn_mirror *m = mirror_slot(k, src);
    if (!m) return; /* table full: not registered, the matmuls convert (still correct) */
    *m = (struct kn_mirror){0};
    if (!n || !lp) return;
    kn_to_lowp(k, lp, src, n);
    *m = (struct kn_mirror){src, n, lp};
}

const void *kn_lowp_mirror_of(const kn_ctx *k, const float *weight, size_t n)
{
    for (int i = 0; i < KN_MIRRORS; i++) {
        const struct kn_mirror *m = &k->mirrors[i];
        if (m->n && weight >= m->src && n <= m->n && (size_t)(weight - m->src) <= m->n - n)
            return (const char *)m->lp + (size_t)(weight - m->src) * k->lowp_size;
    }
    return NULL;
}

void kn_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                       const void *inp_lp, const float *weight, const float *bias, int BT,
                       int C, int OC)
{
    TIMED(OP_MATMUL_FORWARD,
          k->ops->matmul_forward(k, out, out_lp, inp, inp_lp, weight, bias, BT, C, OC));
}

void kn_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                        const void *dout_lp, const float *inp, const void *inp_lp,
                        const float *weight, int BT, int C, int OC)
{
    TIMED(OP_MATMUL_BACKWARD, k->ops->matmul_backward(k, dinp, dweight, dbias, dout, dout_lp, inp,
                                                      inp_lp, weight, BT, C, OC));
}

void kn_matmul_residual_forward(kn_ctx *k, float *out, const float *res, const float *inp,
                                const void *inp_lp, const float *weight, const float *bias, int BT,
                                int C, int OC)
{
    if (!k->ops->matmul_residual_forward) {
        kn_matmul_forward(k, out, NULL, inp, inp_lp, weight, bias, BT, C, OC);
        kn_residual_forward(k, out, res, out, (size_t)BT * OC);
        return;
    }
    TIMED(OP_MATMUL_RESIDUAL_FORWARD, k->ops->matmul_residual_forward(k, out, res, inp, inp_lp,
                                                                      weight, bias, BT, C, OC));
}

size_t kn_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp)
{
    return k->ops->attention_state_floats(k, B, T, C, NH, qkv_lp);
}

void kn_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                          const void *qkv_lp, int B, int T, int C, int NH)
{
    TIMED(OP_ATTENTION_FORWARD,
          k->ops->attention_forward(k, out, out_lp, att, qkv, qkv_lp, B, T, C, NH));
}

void kn_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                           const void *dout_lp, const float *qkv, const void *qkv_lp,
                           const float *att, const float *out, const void *out_lp, int B, int T,
                           int C, int NH)
{
    TIMED(OP_ATTENTION_BACKWARD,
          k->ops->attention_backward(k, dqkv, dqkv_lp, dout, dout_lp, qkv, qkv_lp, att, out,
                                     out_lp, B, T, C, NH));
}

void kn_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre, const float *inp,
                            const void *inp_lp, const float *weight, const float *bias, int BT,
                            int C, int OC)
{
    TIMED(OP_MATMUL_GELU_FORWARD, k->ops->matmul_gelu_forward(k, out, out_lp, pre, inp, inp_lp,
                                                              weight, bias, BT, C, OC));
}

void kn_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight, float *dbias,
                            const float *dout, const void *dout_lp, const float *inp,
                            const void *inp_lp, const float *weight, int BT, int C, int OC)
{
    TIMED(OP_MATMUL_BACKWARD,
          k->ops->matmul_backward_set(k, dinp, dinp_lp, dweight, dbias, dout, dout_lp, inp,
                                      inp_lp, weight, BT, C, OC));
}

void kn_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight, float *dbias,
                             const float *dout, const void *dout_lp, const float *inp,
                             const void *inp_lp, const float *weight, const float *pre, int BT,
                             int C, int OC)
{
    TIMED(OP_MATMUL_BACKWARD_GELU,
          k->ops->matmul_backward_gelu(k, dpre, dpre_lp, dweight, dbias, dout, dout_lp, inp, inp_lp,
                                       weight, pre, BT, C, OC));
}

void kn_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n)
{
    TIMED(OP_GELU_FORWARD, k->ops->gelu_forward(k, out, inp, n));
}

void kn_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n)
{
    TIMED(OP_GELU_BACKWARD, k->ops->gelu_backward(k, dinp, inp, dout, n));
}

void kn_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n)
{
    TIMED(OP_RESIDUAL_FORWARD, k->ops->residual_forward(k, out, a, b, n));
}

void kn_accumulate(kn_ctx *k, float *dst, const float *src, size_t n)
{
    TIMED(OP_ACCUMULATE, k->ops->accumulate(k, dst, src, n));
}

void kn_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs, const float *logits,
                                     const int32_t *targets, int BT, int V, int Vp)
{
    TIMED(OP_SOFTMAX_CROSSENTROPY_FORWARD,
          k->ops->softmax_crossentropy_forward(k, losses, probs, logits, targets, BT, V, Vp));
}

void kn_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                      const int32_t *targets, float dloss_scale, int BT, int V,
                                      int Vp)
{
    TIMED(OP_CROSSENTROPY_SOFTMAX_BACKWARD,
          k->ops->crossentropy_softmax_backward(k, dlogits, probs, targets, dloss_scale, BT, V,
                                                Vp));
}

void kn_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                             const int32_t *targets, int BT, int V, int Vp)
{
    TIMED(OP_CROSSENTROPY_FORWARD,
          k->ops->crossentropy_forward(k, losses, stats, logits, targets, BT, V, Vp));
}

void kn_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits, const float *stats,
                              const int32_t *targets, float dloss_scale, int BT, int V, int Vp)
{
    TIMED(OP_CROSSENTROPY_BACKWARD, k->ops->crossentropy_backward(k, dlogits, logits, stats,
                                                                  targets, dloss_scale, BT, V, Vp));
}

void kn_lm_head_forward(kn_ctx *k, float *losses, float *stats, float *logits, const float *inp,
                        const void *inp_lp, const float *weight, const int32_t *targets, int BT,
                        int C, int V, int Vp)
{
    if (!k->ops->lm_head_forward) {
        kn_matmul_forward(k, logits, NULL, inp, inp_lp, weight, NULL, BT, C, Vp);
        kn_crossentropy_forward(k, losses, stats, logits, targets, BT, V, Vp);
        return;
    }
    TIMED(OP_LM_HEAD_FORWARD, k->ops->lm_head_forward(k, losses, stats, logits, inp, inp_lp,
                                                      weight, targets, BT, C, V, Vp));
}

void kn_lm_head_backward(kn_ctx *k, float *dinp, float *dweight, float *logits,
                         const float *stats, const int32_t *targets, float dloss_scale,
                         const float *inp, const void *inp_lp, const float *weight, int BT, int C,
                         int V, int Vp)
{
    if (!k->ops->lm_head_backward) {
        kn_crossentropy_backward(k, logits, logits, stats, targets, dloss_scale, BT, V, Vp);
        kn_matmul_backward_set(k, dinp, NULL, dweight, NULL, logits, NULL, inp, inp_lp, weight,
                               BT, C, Vp);
        return;
    }
    TIMED(OP_LM_HEAD_BACKWARD,
          k->ops->lm_head_backward(k, dinp, dweight, logits, stats, targets, dloss_scale, inp,
                                   inp_lp, weight, BT, C, V, Vp));
}

void kn_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t)
{
    TIMED(OP_ADAMW_UPDATE, k->ops->adamw_update(k, params, grads, m, v, n, lr, beta1, beta2, eps,
                                                weight_decay, grad_scale, t));
}

void kn_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                           const kn_adamw_span *spans, int nspans, float lr, float beta1,
                           float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    TIMED(OP_ADAMW_UPDATE, k->ops->adamw_update_spans(k, params, grads, m, v, spans, nspans, lr,
                                                      beta1, beta2, eps, weight_decay, grad_scale,
                                                      t));
}

double kn_sum_squares(kn_ctx *k, const float *x, size_t n)
{
    double s;
    TIMED(OP_SUM_SQUARES, s = k->ops->sum_squares(k, x, n));
    return s;
}

double kn_sum(kn_ctx *k, const float *x, size_t n)
{
    double s;
    TIMED(OP_SUM, s = k->ops->sum(k, x, n));
    return s;
}
