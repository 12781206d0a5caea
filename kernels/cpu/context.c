/* CPU backend: context, copies, and its table of kernels (memory: memory.c). */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"

static void cpu_destroy(kn_ctx *k)
{
    kn_cpu_ctx *c = (kn_cpu_ctx *)k;
    pthread_mutex_destroy(&c->lock);
    free(k->ws);
    free(c);
}

void *kn_cpu_workspace(kn_ctx *k, size_t bytes)
{
    if (bytes <= k->ws_bytes && k->ws) return k->ws;
    free(k->ws);
    size_t n = kn_round64(bytes);
    k->ws = n ? aligned_alloc(64, n) : NULL;
    if (!k->ws) {
        fprintf(stderr, "pliant kernels: cannot allocate %zu bytes of workspace\n", n);
        abort();
    }
    k->ws_bytes = n;
    return k->ws;
}

static void cpu_zero(kn_ctx *k, void *p, size_t bytes)
{
    if (bytes < ((size_t)4 << 20)) {
        memset(p, 0, bytes);
        return;
    }
#pragma omp parallel num_threads(k->threads)
    {
        size_t lo, hi;
        kn_split(bytes, omp_get_num_threads(), omp_get_thread_num(), 4096, &lo, &hi);
        if (hi > lo) memset((char *)p + lo, 0, hi - lo);
    }
}

static void cpu_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(kn_ctx *k)
{
    (void)k;
}

static void cpu_copy(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

/* Kernel timing (kn_profile_enable): the CPU kernels are synchronous, so the
 * clock around the call is the kernel's time. */
static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu_prof_begin(kn_ctx *k) { k->prof->t0 = cpu_now_s(); }

static void cpu_prof_end(kn_ctx *k, int op)
{
    k->prof->ms[op] += (cpu_now_s() - k->prof->t0) * 1e3;
}

static const kn_ops kn_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = kn_cpu_alloc,
    .free = kn_cpu_free,
    .zero = cpu_zero,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .sync = cpu_sync,
    .encoder_forward = kn_cpu_encoder_forward,
    .encoder_backward = kn_cpu_encoder_backward,
    .layernorm_forward = kn_cpu_layernorm_forward,
    .layernorm_backward = kn_cpu_layernorm_backward,
    .matmul_forward = kn_cpu_matmul_forward,
    .matmul_backward = kn_cpu_matmul_backward,
    .attention_forward = kn_cpu_attention_forward,
    .attention_backward = kn_cpu_attention_backward,
    .gelu_forward = kn_cpu_gelu_forward,
    .gelu_backward = kn_cpu_gelu_backward,
    .residual_forward = kn_cpu_residual_forward,
    .accumulate = kn_cpu_accumulate,
    .softmax_crossentropy_forward = kn_cpu_softmax_crossentropy_forward,
    .crossentropy_softmax_backward = kn_cpu_crossentropy_softmax_backward,
    .crossentropy_forward = kn_cpu_crossentropy_forward,
    .crossentropy_backward = kn_cpu_crossentropy_backward,
    .adamw_update = kn_cpu_adamw_update,
    .adamw_update_spans = kn_cpu_adamw_update_spans,
    .matmul_backward_set = kn_cpu_matmul_backward_set,
    .sum_squares = kn_cpu_sum_squares,
    .sum = kn_cpu_sum,
    .copy = cpu_copy,
    .host_alloc = kn_cpu_alloc,
    .host_free = kn_cpu_free,
    .share = kn_cpu_share,
    .populate = kn_cpu_populate,
    .attention_state_floats = kn_cpu_attention_state_floats,
    .matmul_gelu_forward = kn_cpu_matmul_gelu_forward,
    .matmul_backward_gelu = kn_cpu_matmul_backward_gelu,
    .prof_begin = cpu_prof_begin,
    .prof_end = cpu_prof_end,
};

kn_ctx *kn_cpu_create(int threads, char *err, size_t errlen)
{
    kn_cpu_ctx *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kn_ctx *k = &c->k;
    k->ops = &kn_cpu_ops;
    k->precision = "fp32";
    k->threads = threads > 0 ? threads : omp_get_num_procs();
    if (k->threads < 1) k->threads = 1;
    /* One pool of threads: OpenMP's. Matrix products are split across it and
     * each thread calls a single-threaded sgemm (see cpu.h). */
    openblas_set_num_threads(1);
    return k;
}

kn_ctx *kn_cpu_lowp_create(int threads, char *err, size_t errlen)
{
    kn_ctx *k = kn_cpu_create(threads, err, errlen);
    if (!k) return NULL;
    kn_cpu_ctx *c = (kn_cpu_ctx *)k;
    c->lowp_ops = kn_cpu_ops;
    kn_cpu_lowp_ops(&c->lowp_ops);
    k->ops = &c->lowp_ops;
    k->lowp_size = 2;
    return k;
}
