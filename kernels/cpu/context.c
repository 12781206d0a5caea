/* CPU backend: context, memory, copies. */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

kn_ctx *kn_create(const char *backend, int threads, char *err, size_t errlen)
{
    if (!backend || strcmp(backend, "cpu") != 0) {
        if (err && errlen)
            snprintf(err, errlen, "kernel backend \"%s\" is not built in (this build has: cpu)",
                     backend ? backend : "(null)");
        return NULL;
    }
    kn_ctx *k = calloc(1, sizeof *k);
    if (!k) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->threads = threads > 0 ? threads : omp_get_num_procs();
    if (k->threads < 1) k->threads = 1;
    /* One pool of threads: OpenMP's. Matrix products are split across it and
     * each thread calls a single-threaded sgemm (see cpu.h). */
    openblas_set_num_threads(1);
    return k;
}

void kn_destroy(kn_ctx *k)
{
    if (!k) return;
    free(k->ws);
    free(k);
}

const char *kn_backend(const kn_ctx *k)
{
    (void)k;
    return "cpu";
}

int kn_threads(const kn_ctx *k)
{
    return k->threads;
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

void kn_zero(kn_ctx *k, void *p, size_t bytes)
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

void *kn_alloc(kn_ctx *k, size_t bytes)
{
    size_t n = round64(bytes);
    void *p = n ? aligned_alloc(64, n) : NULL;
    if (p) kn_zero(k, p, n);
    return p;
}

void kn_free(kn_ctx *k, void *p)
{
    (void)k;
    free(p);
}

void kn_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

void kn_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

void kn_sync(kn_ctx *k)
{
    (void)k;
}
