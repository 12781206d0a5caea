/* Internals shared by the CPU kernels (the .c files in kernels/cpu/); not part of the
 * public interface (kernels/kernels.h).
 *
 * Threading: every kernel parallelizes with OpenMP on k->threads threads
 * (num_threads clause on each region; the process-wide OpenMP setting is left
 * alone). OpenBLAS is set to ONE thread at kn_create and matrix products are
 * split across the OpenMP team by the kernels themselves, each thread calling
 * a single-threaded cblas_sgemm on its slice. So there is only ever one pool
 * of threads: OpenBLAS's own pthreads never run next to OpenMP's. On the
 * 2-core machine the two spinning pools slow each other: a matmul + GELU pair
 * takes 1.2-1.4x longer that way (bench/kernels_bench.c), a small product
 * followed by an elementwise kernel about 2x. Splits are along output rows or
 * columns, never along the reduction dimension; with the sgemm kernels here
 * the results came out bit-identical for 1, 2 and 3 threads.
 *
 * Several busy processes on the same cores (e.g. many workers of `pliant run`
 * on one machine) hurt every parallel region: a barrier waits for a thread
 * the scheduler has parked. Give each context threads = cores / processes.
 *
 * SIMD: the build is -march independent; the hot loops live in small
 * functions marked KN_SIMD, which GCC compiles twice (x86-64-v3 = AVX2+FMA,
 * and the baseline) and picks at load time (ifunc). Parallel regions stay in
 * plain functions and call the KN_SIMD workers on their share (an OpenMP
 * region outlined from a cloned function would not itself be cloned).
 *
 * A context's kernels are called by one thread at a time (the engine's compute thread);
 * its memory (alloc, free, share, populate) by any thread. */
#ifndef PLIANT_KERNELS_CPU_H
#define PLIANT_KERNELS_CPU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kn_backend.h" /* struct kn_ctx: threads = OpenMP team size, ws = workspace */

/* The CPU context: the backend-neutral part first (a kn_ctx * points at it), then the
 * registry of live mapped blocks (memory.c): freeing a block releases what no other one
 * maps. */
typedef struct {
    kn_ctx k;
    pthread_mutex_t lock; /* the registry and the blocks' tables of shared ranges */
    void *live;           /* the newest live mapped block; each header links the next */
    kn_ops lowp_ops;      /* "cpu-lowp": kn_cpu_ops with lowp.c's kernels (k.ops points here) */
} kn_cpu_ctx;

/* lowp.c: the kernels of "cpu-lowp" (CUDA's bf16 copies emulated, for tests) put into ops,
 * a copy of the CPU's table. */
void kn_cpu_lowp_ops(kn_ops *ops);

/* Memory (memory.c), in the table kn_cpu_ops of context.c: kn_alloc, kn_free, kn_share,
 * kn_populate, kn_host_alloc and kn_host_free. */
void *kn_cpu_alloc(kn_ctx *k, size_t bytes);
void kn_cpu_free(kn_ctx *k, void *p);
int kn_cpu_share(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block,
                 size_t src_off, size_t bytes);
int kn_cpu_populate(kn_ctx *k, void *p, size_t bytes);

/* The CPU kernels, one per kernels.h function (same arguments), in the
 * table kn_cpu_ops of context.c. */
void kn_cpu_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                            const float *wpe, int B, int T, int C, int V);
void kn_cpu_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                             const int32_t *inp, int B, int T, int C, int V);
void kn_cpu_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int B,
                              int T, int C);
void kn_cpu_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                               float *dbias, const float *dout, const void *dout_lp,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int B, int T, int C);
void kn_cpu_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                           const void *inp_lp, const float *weight, const float *bias, int BT,
                           int C, int OC);
void kn_cpu_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                            const void *dout_lp, const float *inp, const void *inp_lp,
                            const float *weight, int BT, int C, int OC);
void kn_cpu_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                              const void *qkv_lp, int B, int T, int C, int NH);
void kn_cpu_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                               const void *dout_lp, const float *qkv, const void *qkv_lp,
                               const float *att, const float *out, const void *out_lp, int B,
                               int T, int C, int NH);
size_t kn_cpu_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp);
void kn_cpu_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre,
                                const float *inp, const void *inp_lp, const float *weight,
                                const float *bias, int BT, int C, int OC);
void kn_cpu_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight,
                                 float *dbias, const float *dout, const void *dout_lp,
                                 const float *inp, const void *inp_lp, const float *weight,
                                 const float *pre, int BT, int C, int OC);
void kn_cpu_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n);
void kn_cpu_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n);
void kn_cpu_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n);
void kn_cpu_accumulate(kn_ctx *k, float *dst, const float *src, size_t n);
void kn_cpu_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs,
                                         const float *logits, const int32_t *targets, int BT,
                                         int V, int Vp);
void kn_cpu_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                          const int32_t *targets, float dloss_scale, int BT,
                                          int V, int Vp);
void kn_cpu_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                                 const int32_t *targets, int BT, int V, int Vp);
void kn_cpu_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits,
                                  const float *stats, const int32_t *targets, float dloss_scale,
                                  int BT, int V, int Vp);
void kn_cpu_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, float grad_scale, int t);
void kn_cpu_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                               const kn_adamw_span *spans, int nspans, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale,
                               int t);
void kn_cpu_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight,
                                float *dbias, const float *dout, const void *dout_lp,
                                const float *inp, const void *inp_lp, const float *weight, int BT,
                                int C, int OC);
double kn_cpu_sum_squares(kn_ctx *k, const float *x, size_t n);
double kn_cpu_sum(kn_ctx *k, const float *x, size_t n);

/* The workspace, grown to at least `bytes` (64-byte aligned, contents
 * undefined). Aborts with a message when memory runs out: the kernels return
 * void and a half-done step must not go unnoticed. */
void *kn_cpu_workspace(kn_ctx *k, size_t bytes);

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(KN_NO_CLONES)
#define KN_SIMD __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KN_SIMD
#endif

/* bytes rounded up to a multiple of 64; 0 when they cannot be, 64 for none. */
static inline size_t kn_round64(size_t bytes)
{
    return bytes ? (bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64) : 64;
}

/* Below this many elements of elementwise work a kernel runs on one thread
 * (waking the team costs a few microseconds). */
#define KN_PAR_MIN 16384

/* Part i of n split into `parts` contiguous ranges; boundaries are multiples
 * of `grain` (the last range ends at n). Ranges may be empty. */
static inline void kn_split(size_t n, int parts, int i, size_t grain, size_t *lo, size_t *hi)
{
    size_t units = (n + grain - 1) / grain;
    size_t u0 = units * (size_t)i / (size_t)parts, u1 = units * (size_t)(i + 1) / (size_t)parts;
    *lo = u0 * grain < n ? u0 * grain : n;
    *hi = u1 * grain < n ? u1 * grain : n;
}

/* e^x for float, written so that loops calling it vectorize (no branches,
 * no libm call): Cody-Waite reduction x = n·ln2 + r and a degree-6
 * polynomial (Cephes expf); max error about 1.5 ulp. Inputs are clamped to
 * [-87, 88] (exp(-87) ≈ 1.6e-38 stands for underflow); the clamp compares
 * the bit patterns as integers, because a float comparison could trap and
 * stops GCC from if-converting the loop. NaN gives NaN, −inf ≈ 0. */
static inline float kn_expf(float x)
{
    uint32_t b, xb;
    memcpy(&b, &x, sizeof b);
    xb = b;
    b = b > 0xC2AE0000u ? 0xC2AE0000u : b;                       /* x < -87 → -87 */
    b = (int32_t)b > (int32_t)0x42B00000 ? 0x42B00000u : b;      /* x > 88 → 88 */
    float xc;
    memcpy(&xc, &b, sizeof xc);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    float y = p * s;
    uint32_t yb;
    memcpy(&yb, &y, sizeof yb);
    uint32_t nan = (uint32_t)0 - (uint32_t)((xb & 0x7FFFFFFFu) > 0x7F800000u);
    yb = (yb & ~nan) | (xb & nan); /* NaN in, NaN out (a mask: a select here would not vectorize) */
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* tanh(x) = sign(x)·(1 − t)/(1 + t), t = e^(−2|x|); absolute error ≈ 1e-7. */
static inline float kn_tanhf(float x)
{
    uint32_t b, sign;
    memcpy(&b, &x, sizeof b);
    sign = b & 0x80000000u;
    b &= 0x7FFFFFFFu;
    float a;
    memcpy(&a, &b, sizeof a);
    float t = kn_expf(-2.0f * a);
    float th = (1.0f - t) / (1.0f + t);
    memcpy(&b, &th, sizeof b);
    b |= sign;
    memcpy(&th, &b, sizeof th);
    return th;
}

#endif
