/* GPU training benchmark: GPT-2 124M (L=12, C=768, NH=12, V=50257
 * padded to 50304, maxT=1024) on the CUDA backend, the whole model in one
 * engine, B=16, T=1024. Each step is what `pliant train` does on one worker:
 * zero the gradients, forward, backward (loss gradient 1/(B·T) per position),
 * global gradient norm (clip at 1), AdamW, then kn_sync. Prints tokens/s,
 * ms/step, achieved TFLOP/s and MFU against the dense bf16 peak MEASURED in
 * the same run (a large cublasGemmEx: bf16 inputs and output, fp32
 * accumulation) and, for H100/H200 SXM, against the datasheet figure; then
 * one profiled step with the time of every kernel (kn_profile_*), which says
 * where the step goes. Output lines are Markdown, to paste into bench/README.md.
 *
 * FLOPs per token follow llm.c (train_gpt2.cu, gpt2_estimate_mfu):
 * 6N + 6·L·C·T, N = every parameter, embeddings included: wte with its padded
 * rows (Vp×C) and wpe (maxT×C), i.e. pl_gpt_total_params = 124,475,904.
 *
 * Usage: gpu_bench_cuda [--steps M] [--warmup N] [--B B] [--T T] [--tokens GLOB]
 *                       [--precision bf16|tf32|fp32]
 * (--tokens: llm.c token shards; random tokens otherwise). The matmul
 * precision is the environment's PLIANT_PRECISION (bf16 by default), read by
 * kn_create; --precision sets it. Without a CUDA device it prints "skip: no CUDA device (...)" and
 * exits 0. Built by `make cuda`, run by `make bench-gpu`. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "kernels.h"
#include "tokens.h"
#include "util.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CK(call)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "gpu_bench: %s: %s\n", #call, cudaGetErrorString(e_));          \
            goto out;                                                                       \
        }                                                                                   \
    } while (0)

#define CKB(call)                                                                           \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "gpu_bench: %s: %s\n", #call, cublasGetStatusString(s_));       \
            goto out;                                                                       \
        }                                                                                   \
    } while (0)

/* Round-to-nearest-even fp32 → bf16 bits (inputs are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* The device's dense bf16 GEMM rate in TFLOP/s: n×n×n cublasGemmEx, bf16 A, B
 * and C, fp32 accumulation, random inputs (zeros would flatter the clocks);
 * the best of 3 rounds of 10 back-to-back GEMMs after a warm-up. 0 on failure. */
static double bf16_peak_tflops(int n)
{
    double best = 0.0;
    size_t nn = (size_t)n * n;
    uint16_t *h = malloc(nn * sizeof *h);
    void *a = NULL, *b = NULL, *c = NULL;
    cublasHandle_t blas = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (!h) return 0.0;
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < nn; i++) { /* xorshift64: uniform in [-1, 1) */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = to_bf16((float)((double)(x >> 11) * (2.0 / 9007199254740992.0) - 1.0));
    }
    CK(cudaMalloc(&a, nn * 2));
    CK(cudaMalloc(&b, nn * 2));
    CK(cudaMalloc(&c, nn * 2));
    CK(cudaMemcpy(a, h, nn * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, h, nn * 2, cudaMemcpyHostToDevice));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CKB(cublasCreate(&blas));
    const float alpha = 1.0f, beta = 0.0f;
    for (int r = 0; r < 4; r++) { /* round 0 warms up */
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < 10; i++)
            CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                             CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double tflops = 10 * 2.0 * (double)n * n * n / (ms * 1e-3) / 1e12;
        if (r && tflops > best) best = tflops;
    }
out:
    if (blas) cublasDestroy(blas);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    free(h);
    return best;
}

/* Datasheet dense bf16 TFLOP/s (no sparsity) where the device is known, else 0. */
static double datasheet_tflops(const char *name, const char **label)
{
    if (strstr(name, "H200") || (strstr(name, "H100") && !strstr(name, "PCIe") &&
                                 !strstr(name, "NVL"))) {
        *label = "H100/H200 SXM datasheet, dense bf16";
        return 989.0;
    }
    return 0.0;
}

typedef struct {
    pl_engine *e;
    int32_t *tok; /* B·T + 1 host tokens: inputs tok[0..BT), targets tok[1..BT] */
    pl_tokens *file;
    int64_t pos;  /* next window of the file */
    float loss;
    double norm;
} bench;

static int next_batch(bench *b)
{
    const int64_t n = (int64_t)b->e->B * b->e->T + 1;
    if (!b->file) return 0; /* random tokens, drawn once */
    if (b->pos + n > pl_tokens_count(b->file)) b->pos = 0;
    if (pl_tokens_copy(b->file, b->pos, n, b->tok)) return -1;
    b->pos += n - 1;
    return 0;
}

/* One training step; returns its wall time in ms. */
static double step(bench *b, int t)
{
    pl_engine *e = b->e;
    const pl_adamw opt = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                          .weight_decay = 0.1f};
    double t0 = (pl_now_ms() / 1e3);
    pl_engine_zero_grads(e);
    b->loss = pl_engine_forward(e, 0, b->tok, NULL, b->tok + 1);
    pl_engine_backward_last(e, 0, NULL, 1.0f / (float)(e->B * e->T), NULL, NULL);
    b->norm = sqrt(pl_engine_grad_sumsq(e));
    pl_engine_adamw(e, &opt, b->norm > 1.0 ? (float)(1.0 / b->norm) : 1.0f, t);
    kn_sync(e->k);
    return ((pl_now_ms() / 1e3) - t0) * 1e3;
}

static void usage(void)
{
    fprintf(stderr, "usage: gpu_bench_cuda [--steps M] [--warmup N] [--B B] [--T T] "
                    "[--tokens GLOB] [--precision bf16|tf32|fp32 (PLIANT_PRECISION)]\n");
}

typedef struct {
    int steps, warmup, B, T;
    const char *tokens_glob; /* NULL: random tokens */
} options;

/* 0, or 2 (the reason printed). --precision sets PLIANT_PRECISION, which kn_create reads. */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.steps = 10, .warmup = 3, .B = 16, .T = 1024};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--B")) o->B = atoi(v);
        else if (!strcmp(a, "--T")) o->T = atoi(v);
        else if (!strcmp(a, "--tokens")) o->tokens_glob = v;
        else if (!strcmp(a, "--precision")) setenv("PLIANT_PRECISION", v, 1);
        else {
            usage();
            return 2;
        }
    }
    if (o->steps < 1 || o->warmup < 0 || o->B < 1 || o->T < 1 || o->T > 1024) {
        fprintf(stderr, "gpu_bench: need --steps ≥ 1, --warmup ≥ 0, --B ≥ 1, 1 ≤ --T ≤ 1024\n");
        return 2;
    }
    return 0;
}

/* The batch's tokens: from the shards of o->tokens_glob (file: opened, *have_file set),
 * else random ones drawn once. 0, or −1 with the reason printed. */
static int load_tokens(bench *b, const options *o, const pl_gpt_config *cfg, pl_tokens *file,
                       int *have_file)
{
    char err[256];
    if (!o->tokens_glob) {
        uint64_t x = 1337;
        for (int i = 0; i <= o->B * o->T; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b->tok[i] = (int32_t)(x % (uint64_t)cfg->V);
        }
        return 0;
    }
    if (pl_tokens_open(o->tokens_glob, file, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return -1;
    }
    *have_file = 1;
    if (pl_tokens_check_vocab(file, cfg->V, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return -1;
    }
    if (pl_tokens_count(file) < (int64_t)o->B * o->T + 1) {
        fprintf(stderr, "gpu_bench: %s holds fewer than B·T + 1 tokens\n", o->tokens_glob);
        return -1;
    }
    b->file = file;
    return 0;
}

/* warmup + steps training steps from step t = 1, the timed ones' ms into ms[steps]. */
static int run_steps(bench *b, const options *o, double *ms)
{
    for (int s = 0, t = 1; s < o->warmup + o->steps; s++, t++) {
        if (next_batch(b)) {
            fprintf(stderr, "gpu_bench: reading tokens failed\n");
            return -1;
        }
        const double dt = step(b, t);
        if (!isfinite(b->loss)) {
            fprintf(stderr, "gpu_bench: step %d: loss %g\n", t, (double)b->loss);
            return -1;
        }
        if (s >= o->warmup) ms[s - o->warmup] = dt;
    }
    return 0;
}

/* The result's Markdown row from the timed steps (ms, sorted here), with MFU against the
 * peak measured and the datasheet's (ds > 0). The median step. */
static double print_result(kn_ctx *k, const struct cudaDeviceProp *prop, const pl_gpt_config *cfg,
                           const options *o, const bench *b, double *ms, double peak, double ds)
{
    const int steps = o->steps;
    double mean = 0.0;
    for (int s = 0; s < steps; s++) mean += ms[s] / steps;
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    const double med = ms[steps / 2];
    const double N = (double)pl_gpt_total_params(cfg);
    const double flops_tok = 6.0 * N + 6.0 * cfg->L * cfg->C * (double)o->T;
    const double tok_s = (double)o->B * o->T / (med * 1e-3), tflops = tok_s * flops_tok / 1e12;
    printf("N = %.0f parameters (embeddings included, wte with its padded rows); FLOPs per "
           "token 6N + 6·L·C·T = %.4g; last loss %.4f, gradient norm %.3g\n",
           N, flops_tok, (double)b->loss, b->norm);
    printf("\n| device | precision | B×T | ms/step (median; mean, min–max) | tokens/s | TFLOP/s "
           "| MFU (measured %.0f) |%s\n|---|---|---|---|---|---|---|%s\n",
           peak, ds > 0 ? " MFU (datasheet) |" : "", ds > 0 ? "---|" : "");
    printf("| %s | %s | %d×%d | %.1f (%.1f, %.1f–%.1f) | %.0f | %.1f | %.1f %% |", prop->name,
           kn_precision(k), o->B, o->T, med, mean, ms[0], ms[steps - 1], tok_s, tflops,
           100.0 * tflops / peak);
    if (ds > 0) printf(" %.1f %% of %.0f |", 100.0 * tflops / ds, ds);
    printf("\n");
    return med;
}

static void print_memory(kn_ctx *k, const pl_engine *e)
{
    kn_mem_stats mem;
    if (kn_memory_stats(k, &mem) == 0)
        printf("\nmemory (arena): %.2f GiB reserved in %d chunks, %.2f GiB in use, peak %.2f GiB "
               "(activations %.2f GiB)\n",
               (double)mem.reserved / (1 << 30), mem.chunks, (double)mem.in_use / (1 << 30),
               (double)mem.peak / (1 << 30), (double)e->act_bytes / (1 << 30));
}

/* One profiled step (step t): where the time goes, kernel by kernel. */
static int print_profile(kn_ctx *k, bench *b, int t, double med)
{
    kn_profile_entry prof[32];
    if (kn_profile_enable(k, 1)) {
        fprintf(stderr, "gpu_bench: kn_profile_enable: out of memory\n");
        return -1;
    }
    kn_profile_reset(k);
    if (next_batch(b)) return -1;
    const double pstep = step(b, t);
    int np = kn_profile_report(k, prof, 32);
    kn_profile_enable(k, 0);
    if (np > 32) np = 32;
    double in_kernels = 0.0;
    for (int i = 0; i < np; i++) in_kernels += prof[i].ms;
    printf("\nOne profiled step: %.1f ms wall (device time of each kernel call, CUDA events; "
           "the unprofiled median is %.1f ms)\n\n| kernel | calls | ms | %% of step |\n"
           "|---|---|---|---|\n",
           pstep, med);
    for (int i = 0; i < np; i++)
        printf("| %s | %lld | %.2f | %.1f %% |\n", prof[i].name, prof[i].calls, prof[i].ms,
               100.0 * prof[i].ms / pstep);
    printf("| (all kernels) | | %.2f | %.1f %% |\n", in_kernels, 100.0 * in_kernels / pstep);
    printf("| (outside kernels: launch gaps, host-device copies, syncs) | | %.2f | %.1f %% |\n",
           pstep - in_kernels, 100.0 * (pstep - in_kernels) / pstep);
    return 0;
}

/* The device's own limit, measured first on an otherwise idle GPU, and its datasheet
 * figure (0 where unknown). Peak 0: the measurement failed. */
static double print_peak(const struct cudaDeviceProp *prop, double *ds)
{
    const int gemm_n = 8192;
    const double peak = bf16_peak_tflops(gemm_n);
    if (peak <= 0.0) {
        fprintf(stderr, "gpu_bench: the bf16 GEMM measurement failed\n");
        return 0.0;
    }
    const char *ds_label = NULL;
    *ds = datasheet_tflops(prop->name, &ds_label);
    printf("peak: %.0f TFLOP/s measured (cublasGemmEx %d×%d×%d, bf16 in and out, fp32 "
           "accumulate, best of 3×10)",
           peak, gemm_n, gemm_n, gemm_n);
    if (*ds > 0) printf("; %.0f TFLOP/s %s", *ds, ds_label);
    printf("\n");
    return peak;
}

/* The benchmark on a context: 0, or 1 with the reason printed. */
static int bench_on(kn_ctx *k, const struct cudaDeviceProp *prop, const options *o)
{
    char err[256];
    pl_gpt_config cfg;
    if (pl_gpt_config_init(&cfg, 12, 768, 12, 50257, 1024, err, sizeof err)) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return 1;
    }
    printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop->name, prop->major, prop->minor,
           prop->multiProcessorCount, (double)prop->totalGlobalMem / (1 << 30));
    printf("config: GPT-2 124M (L=%d C=%d NH=%d V=%d Vp=%d maxT=%d), B=%d T=%d, one engine "
           "with every layer, precision %s (kn_precision), %d warm-up + %d timed steps, "
           "tokens %s\n",
           cfg.L, cfg.C, cfg.NH, cfg.V, cfg.Vp, cfg.maxT, o->B, o->T, kn_precision(k), o->warmup,
           o->steps, o->tokens_glob ? o->tokens_glob : "random (seed 1337)");
    double ds = 0.0;
    const double peak = print_peak(prop, &ds);
    pl_engine e;
    if (peak <= 0.0 || pl_engine_create(&e, k, &cfg, 0, cfg.L + 2, o->B, o->T, 1, err, sizeof err)) {
        if (peak > 0.0) fprintf(stderr, "gpu_bench: pl_engine_create: %s\n", err);
        return 1;
    }
    pl_engine_init_random(&e, 1337);
    bench b = {.e = &e, .tok = malloc(sizeof(int32_t) * ((size_t)o->B * o->T + 1))};
    double *ms = malloc(sizeof(double) * (size_t)o->steps);
    pl_tokens file;
    int have_file = 0, rc = 1;
    if (!b.tok || !ms) fprintf(stderr, "gpu_bench: out of memory\n");
    else if (!load_tokens(&b, o, &cfg, &file, &have_file) && !run_steps(&b, o, ms)) {
        const double med = print_result(k, prop, &cfg, o, &b, ms, peak, ds);
        print_memory(k, &e);
        rc = print_profile(k, &b, o->warmup + o->steps + 1, med) ? 1 : 0;
    }
    if (have_file) pl_tokens_close(&file);
    pl_engine_destroy(&e);
    free(b.tok);
    free(ms);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines printed before a failure reach a pipe */
    if (parse_args(argc, argv, &o)) return 2;
    char err[256] = "";
    kn_ctx *k = kn_create("cuda", 1, err, sizeof err);
    if (!k) {
        if (!strncmp(err, "no CUDA device", 14) || strstr(err, "no CUDA backend")) {
            printf("skip: %s\n", err);
            return 0;
        }
        fprintf(stderr, "gpu_bench: kn_create(cuda): %s\n", err);
        return 1;
    }
    int rc = 1, dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        fprintf(stderr, "gpu_bench: cannot read the device's properties\n");
    else
        rc = bench_on(k, &prop, &o);
    kn_destroy(k);
    return rc;
}
