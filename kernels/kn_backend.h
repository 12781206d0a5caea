/* The backend table behind kernels.h (internal to kernels/). kernels.c
 * implements every public kn_* function as one indirect call through
 * k->ops; each backend (kernels/cpu/, kernels/cuda/) fills one kn_ops with
 * its kn_cpu_* / kn_cuda_* functions, whose arguments are exactly those of
 * the public function. */
#ifndef PLIANT_KN_BACKEND_H
#define PLIANT_KN_BACKEND_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_ops {
    const char *name; /* what kn_backend returns */
    void (*destroy)(kn_ctx *k);
    void *(*alloc)(kn_ctx *k, size_t bytes);
    void (*free)(kn_ctx *k, void *p);
    void (*zero)(kn_ctx *k, void *p, size_t bytes);
    void (*to_device)(kn_ctx *k, void *dst, const void *src, size_t bytes);
    void (*to_host)(kn_ctx *k, void *dst, const void *src, size_t bytes);
    void (*sync)(kn_ctx *k);
    void (*encoder_forward)(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                            const float *wpe, int B, int T, int C, int V);
    void (*encoder_backward)(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int B, int T, int C, int V);
    void (*layernorm_forward)(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int B,
                              int T, int C);
    void (*layernorm_backward)(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                               float *dbias, const float *dout, const void *dout_lp,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C);
    void (*matmul_forward)(kn_ctx *k, float *out, void *out_lp, const float *inp,
                           const void *inp_lp, const float *weight, const float *bias, int BT,
                           int C, int OC);
    void (*matmul_backward)(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                            const void *dout_lp, const float *inp, const void *inp_lp,
                            const float *weight, int BT, int C, int OC);
    void (*attention_forward)(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                              const void *qkv_lp, int B, int T, int C, int NH);
    void (*attention_backward)(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                               const void *dout_lp, const float *qkv, const void *qkv_lp,
                               const float *att, const float *out, const void *out_lp, int B,
                               int T, int C, int NH);
    void (*gelu_forward)(kn_ctx *k, float *out, const float *inp, size_t n);
    void (*gelu_backward)(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n);
    void (*residual_forward)(kn_ctx *k, float *out, const float *a, const float *b, size_t n);
    void (*accumulate)(kn_ctx *k, float *dst, const float *src, size_t n);
    void (*softmax_crossentropy_forward)(kn_ctx *k, float *losses, float *probs,
                                         const float *logits, const int32_t *targets, int BT,
                                         int V, int Vp);
    void (*crossentropy_softmax_backward)(kn_ctx *k, float *dlogits, const float *probs,
                                          const int32_t *targets, float dloss_scale, int BT,
                                          int V, int Vp);
    void (*crossentropy_forward)(kn_ctx *k, float *losses, float *stats, const float *logits,
                                 const int32_t *targets, int BT, int V, int Vp);
    void (*crossentropy_backward)(kn_ctx *k, float *dlogits, const float *logits,
                                  const float *stats, const int32_t *targets, float dloss_scale,
                                  int BT, int V, int Vp);
    void (*adamw_update)(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int t);
    void (*adamw_update_spans)(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                               const kn_adamw_span *spans, int nspans, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t);
    void (*matmul_backward_set)(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                float *dbias, const float *dout, const void *dout_lp,
                                const float *inp, const void *inp_lp, const float *weight, int BT,
                                int C, int OC);
    double (*sum_squares)(kn_ctx *k, const float *x, size_t n);
    double (*sum)(kn_ctx *k, const float *x, size_t n);
    void (*copy)(kn_ctx *k, void *dst, const void *src, size_t bytes);
    void *(*host_alloc)(kn_ctx *k, size_t bytes);
    void (*host_free)(kn_ctx *k, void *p);
    size_t (*attention_state_floats)(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp);
    void (*matmul_gelu_forward)(kn_ctx *k, float *out, void *out_lp, float *pre,
                                const float *inp, const void *inp_lp, const float *weight,
                                const float *bias, int BT, int C, int OC);
    void (*matmul_backward_gelu)(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                 float *dbias, const float *dout, const void *dout_lp,
                                 const float *inp, const void *inp_lp, const float *weight,
                                 const float *pre, int BT, int C, int OC);
    /* Kernel-level timing (kn_profile_enable; kernels.c calls these only while
     * it is on): prof_begin before a kernel, prof_end(op) after it; the backend
     * adds the kernel's milliseconds to k->prof->ms[op], at once (CPU) or at
     * prof_collect, which waits for queued work (CUDA; NULL where there is
     * nothing to collect). */
    void (*prof_begin)(kn_ctx *k);
    void (*prof_end)(kn_ctx *k, int op);
    void (*prof_collect)(kn_ctx *k);
    /* kn_memory_stats; NULL where the backend does not track its memory. */
    int (*memory_stats)(kn_ctx *k, kn_mem_stats *out);
    /* kn_share; NULL where the backend cannot (the caller copies). */
    int (*share)(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block,
                 size_t src_off, size_t bytes);
    /* kn_lm_head_backward fused; NULL: kernels.c runs crossentropy_backward and
     * matmul_backward_set. */
    void (*lm_head_backward)(kn_ctx *k, float *dinp, float *dweight, float *logits,
                             const float *stats, const int32_t *targets, float dloss_scale,
                             const float *inp, const void *inp_lp, const float *weight, int BT,
                             int C, int V, int Vp);
    /* kn_populate; NULL where memory is always present (device memory). */
    int (*populate)(kn_ctx *k, void *p, size_t bytes);
    /* kn_to_lowp; NULL where the backend makes no low-precision copies. */
    void (*to_lowp)(kn_ctx *k, void *lp, const float *src, size_t n);
    /* kn_lm_head_forward fused; NULL: kernels.c runs matmul_forward and
     * crossentropy_forward. */
    void (*lm_head_forward)(kn_ctx *k, float *losses, float *stats, float *logits,
                            const float *inp, const void *inp_lp, const float *weight,
                            const int32_t *targets, int BT, int C, int V, int Vp);
    /* kn_matmul_residual_forward fused; NULL: kernels.c runs matmul_forward and
     * residual_forward. */
    void (*matmul_residual_forward)(kn_ctx *k, float *out, const float *res, const float *inp,
                                    const void *inp_lp, const float *weight, const float *bias,
                                    int BT, int C, int OC);
} kn_ops;

/* Registered kn_lowp_mirror copies a context holds at once (one per engine: a
 * worker's engine, its successor during layer copies, a shadow). */
#define KN_MIRRORS 8

/* The registered low-precision copy of weight[0, n) (kn_lowp_mirror): the mirror
 * at weight's offset where [weight, weight + n) lies within a registered range,
 * else NULL (the backend converts the weight itself). */
const void *kn_lowp_mirror_of(const kn_ctx *k, const float *weight, size_t n);

/* Kernel-level timing state (kernels.c), one per context once enabled. */
#define KN_PROF_MAX_OPS 32
typedef struct kn_prof {
    long long calls[KN_PROF_MAX_OPS];
    double ms[KN_PROF_MAX_OPS]; /* filled by the backend */
    double t0;                  /* CPU: when the running kernel started (seconds) */
} kn_prof;

struct kn_ctx {
    const kn_ops *ops;
    int threads;          /* CPU: OpenMP team size of every kernel; CUDA: 1 */
    void *ws;             /* backend scratch (host memory on the CPU, device memory on CUDA) */
    size_t ws_bytes;
    struct kn_cuda *cuda; /* CUDA state (device, stream, cuBLAS handle); NULL on the CPU */
    const char *precision;/* what kn_precision returns */
    size_t lowp_size;     /* kn_lowp_bytes per value: 2 in CUDA's bf16 mode, else 0 */
    void *stream;         /* kn_stream_handle: the cudaStream_t every kernel runs on; NULL on the CPU */
    char device[64];      /* kn_device_id: the GPU's UUID ("GPU-…"); "" on the CPU */
    size_t device_memory; /* kn_device_memory: the GPU's global memory; 0 on the CPU */
    int prof_on;          /* kn_profile_enable: the one branch each kernel call pays */
    struct kn_mirror {    /* kn_lowp_mirror's registered copies (n 0: a free entry) */
        const float *src;
        size_t n;
        const void *lp;
    } mirrors[KN_MIRRORS];
    kn_prof *prof;        /* NULL until profiling is first enabled */
};

/* Backend constructors, called by kn_create. */
kn_ctx *kn_cpu_create(int threads, char *err, size_t errlen);
kn_ctx *kn_cpu_lowp_create(int threads, char *err, size_t errlen);
kn_ctx *kn_cuda_create(int threads, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
