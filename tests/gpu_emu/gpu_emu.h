/* A CPU emulation of the CUDA execution model, enough to run kernel code
 * compiled by g++ (the tests beside this file): the CUDA keywords as macros,
 * the vector and bf16 types, and each block's threads as coroutines (ucontext)
 * run round-robin, so that __syncthreads and warp shuffles exchange values
 * between threads as on a GPU. Blocks run one after another; the block size is
 * an argument of emu_run_grid. It aborts on lanes of a warp in different
 * collectives and on deadlocked barriers.
 *
 * Collectives between lanes go through per-thread slots (deposit_check then
 * warp_bar): a test adds its own (mma, ldmatrix) the same way. */
#ifndef PLIANT_GPU_EMU_H
#define PLIANT_GPU_EMU_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <vector>
using std::min;

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3v { unsigned x, y, z; };
struct __nv_bfloat16 { uint16_t v; };
struct __nv_bfloat162 { uint16_t x, y; };
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// ---- bf16, round to nearest even (NaN stays NaN)
static inline uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u = u + 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return {f2bf(lo), f2bf(hi)};
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {f2bf(f)}; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.v; }
static inline float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- fibers: the threads of one block
enum { EMU_MAX_THREADS = 1024 };
static ucontext_t sched_ctx;
struct Fiber {
    ucontext_t ctx;
    char *stack;
    bool done;
    int tid;
};
static Fiber fibers[EMU_MAX_THREADS];
static int cur, emu_nt; // the running thread, the block size
static bool progress;
static dim3v blockIdx, gridDim, blockDim;
struct TI { unsigned x; };
#define threadIdx (tix_())
static inline TI tix_() { return TI{(unsigned)fibers[cur].tid}; }

static inline void yield_() { swapcontext(&fibers[cur].ctx, &sched_ctx); }

// generation barriers: block and per warp
static long bgen, bcount;
static long wgen[EMU_MAX_THREADS / 32], wcount[EMU_MAX_THREADS / 32];
static inline void __syncthreads()
{
    long g = bgen;
    if (++bcount == emu_nt) {
        bcount = 0;
        bgen++;
        progress = true;
        return;
    }
    while (bgen == g) yield_();
    progress = true;
}
static inline void warp_bar()
{
    int w = cur / 32;
    long g = wgen[w];
    if (++wcount[w] == 32) {
        wcount[w] = 0;
        wgen[w]++;
        progress = true;
        return;
    }
    while (wgen[w] == g) yield_();
    progress = true;
}

// per-warp exchange slots
struct Slot {
    int op;
    uint32_t u[8];
    float f[4];
    const void *p;
};
static Slot slots[EMU_MAX_THREADS];
static inline void deposit_check(int op)
{
    slots[cur].op = op;
    warp_bar();
    int w0 = cur / 32 * 32;
    for (int l = 0; l < 32; l++)
        if (slots[w0 + l].op != op) {
            fprintf(stderr, "warp %d: lanes in different collectives (%d vs %d)\n", cur / 32,
                    slots[w0 + l].op, op);
            abort();
        }
}

static inline float __shfl_xor_sync(unsigned mask, float v, int o)
{
    assert(mask == 0xffffffffu);
    slots[cur].f[0] = v;
    deposit_check(1);
    float r = slots[cur / 32 * 32 + ((cur % 32) ^ o)].f[0];
    warp_bar();
    return r;
}

// kernels/cuda/cuda.cuh's device helpers, for kernel code that uses them
static inline float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static inline unsigned bf16_pair(float lo, float hi) { return f2bf(lo) | (unsigned)f2bf(hi) << 16; }

// ---- block runner
static std::function<void()> entry; // the kernel call every thread of a block makes
static inline void fiber_main(void) { entry(); fibers[cur].done = true; progress = true; }

/* Thread i at the kernel's entry. A function of its own (not inlined): getcontext
 * returns twice, which would make the block loop's counters "clobbered". */
__attribute__((noinline)) static void start_fiber(int i)
{
    Fiber &f = fibers[i];
    f.tid = i, f.done = false;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = 1 << 17;
    f.ctx.uc_link = &sched_ctx;
    makecontext(&f.ctx, fiber_main, 0);
}

/* Runs the threads of one block until all return; aborts on a deadlock. */
static inline void run_block()
{
    bcount = 0;
    for (int w = 0; w < emu_nt / 32; w++) wcount[w] = 0;
    for (int i = 0; i < emu_nt; i++) start_fiber(i);
    for (;;) {
        bool any = false;
        progress = false;
        for (cur = 0; cur < emu_nt; cur++) {
            if (fibers[cur].done) continue;
            any = true;
            swapcontext(&sched_ctx, &fibers[cur].ctx);
        }
        if (!any) return;
        if (!progress) {
            int live = 0;
            for (int i = 0; i < emu_nt; i++) live += !fibers[i].done;
            fprintf(stderr, "deadlock in block (%u, %u): %d threads waiting\n", blockIdx.x,
                    blockIdx.y, live);
            abort();
        }
    }
}

/* kernel<<<(gx, gy), threads>>>: `block_init` (if any) runs before each block. */
static inline void emu_run_grid(unsigned gx, unsigned gy, int threads,
                         const std::function<void()> &kernel,
                         const std::function<void()> &block_init = nullptr)
{
    assert(threads > 0 && threads % 32 == 0 && threads <= EMU_MAX_THREADS);
    entry = kernel;
    emu_nt = threads;
    gridDim = {gx, gy, 1};
    blockDim = {(unsigned)threads, 1, 1};
    for (int i = 0; i < threads; i++)
        if (!fibers[i].stack) fibers[i].stack = (char *)malloc(1 << 17);
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            blockIdx = {bx, by, 0};
            if (block_init) block_init();
            run_block();
        }
}

#endif
