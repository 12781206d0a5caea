/* Kernel-level timing on CUDA (kn_profile_enable): kernels.c brackets each
 * kernel call with kn_cuda_prof_begin / kn_cuda_prof_end, which record a pair
 * of events on the stream, so the pair times what the device spent on the call
 * (host gaps between calls belong to no kernel). Pairs wait in a pool, grown
 * as needed up to PROF_MAX_PAIRS, until kn_profile_report (or a full pool)
 * waits for the stream and turns them into milliseconds. */
#include "cuda.cuh"

#define PROF_FIRST_PAIRS 256
#define PROF_MAX_PAIRS 8192 /* a step of GPT-2 124M makes well under 1,000 calls */

/* Doubles the pool; −1 when the host is out of memory (the pool is unchanged). */
static int prof_grow(struct kn_cuda *c)
{
    int cap = c->prof_cap ? 2 * c->prof_cap : PROF_FIRST_PAIRS;
    cudaEvent_t *ev = (cudaEvent_t *)realloc(c->prof_ev, sizeof *ev * 2 * (size_t)cap);
    if (!ev) return -1;
    c->prof_ev = ev;
    int *op = (int *)realloc(c->prof_op, sizeof *op * (size_t)cap);
    if (!op) return -1;
    c->prof_op = op;
    for (int i = 2 * c->prof_cap; i < 2 * cap; i++) CUDA_CHECK(cudaEventCreate(&ev[i]));
    c->prof_cap = cap;
    return 0;
}

void kn_cuda_prof_collect(kn_ctx *k)
{
    struct kn_cuda *c = k->cuda;
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < c->prof_n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, c->prof_ev[2 * i], c->prof_ev[2 * i + 1]));
        k->prof->ms[c->prof_op[i]] += ms;
    }
    c->prof_n = 0;
}

void kn_cuda_prof_begin(kn_ctx *k)
{
    struct kn_cuda *c = k->cuda;
    if (c->prof_n == c->prof_cap && (c->prof_cap >= PROF_MAX_PAIRS || prof_grow(c) != 0)) {
        if (!c->prof_cap)
            kn_cuda_fail("kn_profile_enable", "out of host memory for the event pool", __FILE__,
                         __LINE__);
        kn_cuda_prof_collect(k); /* full: resolve what is there (waits for the stream) */
    }
    CUDA_CHECK(cudaEventRecord(c->prof_ev[2 * c->prof_n], c->stream));
}

void kn_cuda_prof_end(kn_ctx *k, int op)
{
    struct kn_cuda *c = k->cuda;
    CUDA_CHECK(cudaEventRecord(c->prof_ev[2 * c->prof_n + 1], c->stream));
    c->prof_op[c->prof_n++] = op;
}

void kn_cuda_prof_destroy(kn_ctx *k)
{
    struct kn_cuda *c = k->cuda;
    for (int i = 0; i < 2 * c->prof_cap; i++) cudaEventDestroy(c->prof_ev[i]);
    free(c->prof_ev);
    free(c->prof_op);
    c->prof_ev = NULL;
    c->prof_op = NULL;
    c->prof_n = c->prof_cap = 0;
}
