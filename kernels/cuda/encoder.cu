/* Token + position embedding (kernels/cpu/encoder.c), bound-checked: a token id outside
 * the vocabulary gives a NaN row and no gradient (kernels.h). */
#include <limits.h>
#include <math.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda.cuh"

__global__ static void encoder_forward_kernel(float *out, const int32_t *inp, const float *wte,
                                              const float *wpe, int T, int C, int V, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        const int32_t id = inp[bt];
        /* an id outside the vocabulary is bad data: NaN, never an out-of-bounds read */
        out[i] = id >= 0 && id < V ? wte[(size_t)id * C + c] + wpe[(size_t)t * C + c] : NAN;
    }
}

void kn_cuda_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                             const float *wpe, int B, int T, int C, int V)
{
    size_t n = (size_t)B * T * C;
    if (!n) return;
    encoder_forward_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(out, inp, wte, wpe, T, C,
                                                                         V, n);
    CUDA_LAUNCHED();
}

/* dwpe: one thread per (t, c) adds the B positions to dwpe in order of b,
 * as the CPU kernel does (so the bits match it and repeat run to run). */
__global__ static void wpe_backward_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = dwpe[i];
        for (int b = 0; b < B; b++) s += dout[(size_t)b * n + i];
        dwpe[i] = s;
    }
}

/* dwte without atomics, so the bits repeat run to run: the B·T positions are
 * sorted by token with a stable radix sort (CUB), which keeps each token's
 * positions in increasing order; then one block per run of equal tokens adds
 * that token's rows of dout to its row of dwte, in position order, as the CPU
 * kernel does. No two blocks touch the same row. The work is O(B·T·C) (the
 * sort over all 32 key bits, since V is not known here). */

__global__ static void iota_kernel(int32_t *x, int n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = (int32_t)i;
}

/* Block i of the sorted order works only if it starts a run of equal tokens.
 * It finds the run's end 256 positions at a time (tokens are sorted, so the end
 * is the first position holding another token), then each thread sums its
 * channels over the run in order: a frequent token's long run costs one pass
 * of independent loads, not a chain of dependent ones. */
__global__ static void wte_backward_sorted_kernel(float *dwte, const float *dout,
                                                  const int32_t *tok, const int32_t *pos, int BT,
                                                  int C, int V)
{
    __shared__ int end_s;
    const int i = blockIdx.x, t = tok[i];
    if (i > 0 && tok[i - 1] == t) return; /* the whole block leaves */
    if (t < 0 || t >= V) return;          /* an id without a row: no gradient (the block) */
    if (threadIdx.x == 0) end_s = BT;
    __syncthreads();
    int end;
    for (int base = i + 1;; base += blockDim.x) {
        int j = base + threadIdx.x;
        if (j < BT && tok[j] != t) atomicMin(&end_s, j);
        __syncthreads();
        end = end_s;
        __syncthreads(); /* everyone has read end_s before the next round writes it */
        if (end < BT || base + (int)blockDim.x >= BT) break; /* the same for every thread */
    }
    float *row = dwte + (size_t)t * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = row[c];
#pragma unroll 4
        for (int j = i; j < end; j++) s += dout[(size_t)pos[j] * C + c];
        row[c] = s;
    }
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

void kn_cuda_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                              const int32_t *inp, int B, int T, int C, int V)
{
    size_t BT = (size_t)B * T;
    if (!BT || C <= 0) return;
    cudaStream_t s = kn_stream(k);
    if (dwpe) {
        wpe_backward_kernel<<<kn_blocks((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
        CUDA_LAUNCHED();
    }
    if (!dwte) return;
    if (BT > (size_t)INT_MAX - 1024) /* int positions, with room for the run search */
        kn_cuda_fail("kn_encoder_backward", "too many positions", __FILE__, __LINE__);
    int n = (int)BT;
    /* workspace: sorted tokens, positions 0..n-1, sorted positions, CUB's scratch */
    size_t scratch = 0, part = align256(BT * sizeof(int32_t));
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, scratch, inp, (int32_t *)NULL,
                                               (const int32_t *)NULL, (int32_t *)NULL, n, 0, 32,
                                               s));
    char *ws = (char *)kn_cuda_workspace(k, 3 * part + scratch);
    int32_t *tok = (int32_t *)ws, *pos_in = (int32_t *)(ws + part),
            *pos = (int32_t *)(ws + 2 * part);
    iota_kernel<<<kn_blocks(BT, 256), 256, 0, s>>>(pos_in, n);
    CUDA_LAUNCHED();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + 3 * part, scratch, inp, tok, pos_in, pos, n,
                                               0, 32, s));
    wte_backward_sorted_kernel<<<n, 256, 0, s>>>(dwte, dout, tok, pos, n, C, V);
    CUDA_LAUNCHED();
}
