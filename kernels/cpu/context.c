/* CPU backend: context, memory, copies, and its table of kernels. */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu.h"

static void cpu_destroy(kn_ctx *k)
{
    free(k->ws);
    free(k);
}

static size_t round64(size_t bytes) /* 0 when bytes cannot be rounded up */
{
    return bytes ? (bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64) : 64;
}

void *kn_cpu_workspace(kn_ctx *k, size_t bytes)
{
    if (bytes <= k->ws_bytes && k->ws) return k->ws;
    free(k->ws);
    size_t n = round64(bytes);
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

/* Allocations: a 64-byte header before the block says how it was made. Large blocks are
 * anonymous mappings, zero by the kernel's guarantee and faulted in page by page where
 * they are first written (a new engine's tensors are filled while layer copies arrive,
 * never swept with zeros first); small ones come from the heap and are zeroed here. */
#define ALLOC_HDR 64
#define ALLOC_MAP_MIN ((size_t)1 << 20)
#define ALLOC_MAGIC_HEAP 0x706c6865u
#define ALLOC_MAGIC_MAP 0x706c6d61u

typedef struct {
    uint32_t magic;
    size_t len; /* of the whole block, header included */
} alloc_hdr;

static void *cpu_alloc(kn_ctx *k, size_t bytes)
{
    size_t n = round64(bytes);
    if (!n || n > SIZE_MAX - 2 * ALLOC_HDR) return NULL;
    const size_t len = n + ALLOC_HDR;
    char *base;
    uint32_t magic = ALLOC_MAGIC_HEAP;
    if (n >= ALLOC_MAP_MIN) {
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        magic = ALLOC_MAGIC_MAP;
    } else {
        if (!(base = aligned_alloc(64, len))) return NULL;
        cpu_zero(k, base + ALLOC_HDR, n);
    }
    *(alloc_hdr *)base = (alloc_hdr){.magic = magic, .len = len};
    return base + ALLOC_HDR;
}

static void cpu_free(kn_ctx *k, void *p)
{
    (void)k;
    if (!p) return;
    char *base = (char *)p - ALLOC_HDR;
    const alloc_hdr h = *(alloc_hdr *)base;
    if (h.magic == ALLOC_MAGIC_MAP) {
        munmap(base, h.len);
    } else if (h.magic == ALLOC_MAGIC_HEAP) {
        free(base);
    } else {
        fprintf(stderr, "pliant kernels: freeing memory the CPU backend did not allocate\n");
        abort();
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

static void *cpu_host_alloc(kn_ctx *k, size_t bytes)
{
    return cpu_alloc(k, bytes);
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
    .alloc = cpu_alloc,
    .free = cpu_free,
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
    .adamw_update = kn_cpu_adamw_update,
    .sum_squares = kn_cpu_sum_squares,
    .sum = kn_cpu_sum,
    .copy = cpu_copy,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .attention_state_floats = kn_cpu_attention_state_floats,
    .matmul_gelu_forward = kn_cpu_matmul_gelu_forward,
    .matmul_backward_gelu = kn_cpu_matmul_backward_gelu,
    .prof_begin = cpu_prof_begin,
    .prof_end = cpu_prof_end,
};

kn_ctx *kn_cpu_create(int threads, char *err, size_t errlen)
{
    kn_ctx *k = calloc(1, sizeof *k);
    if (!k) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->ops = &kn_cpu_ops;
    k->precision = "fp32";
    k->threads = threads > 0 ? threads : omp_get_num_procs();
    if (k->threads < 1) k->threads = 1;
    /* One pool of threads: OpenMP's. Matrix products are split across it and
     * each thread calls a single-threaded sgemm (see cpu.h). */
    openblas_set_num_threads(1);
    return k;
}
