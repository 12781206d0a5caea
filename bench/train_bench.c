/* Training-step benchmark (issue 3): the GPT-2 124M shape (L=12, C=768,
 * NH=12, V=50257, maxT=1024), fp32, whole model in one process, B=4 at T=64
 * and T=256, as `pliant train` runs it (forward, backward, global norm,
 * AdamW). Prints tokens/s, achieved GFLOP/s (6N + 6·L·C·T FLOPs per token)
 * next to the machine's measured sgemm peak (the physical limit), and peak
 * resident memory. Each size runs in a child process so that its peak memory
 * is its own.
 *
 * Baseline in the same run: --llmc-t64 CMD / --llmc-t256 CMD run llm.c's CPU
 * trainer (train_gpt2, built by the user from karpathy/llm.c with T set to 64
 * or 256; nothing of llm.c is in this repository) through /usr/bin/time -v and
 * parse its "took X ms" lines and its maximum resident set size; the ratio is
 * printed next to Pliant's figures.
 * Usage: train_bench [--steps N] [--threads N] [--llmc-t64 CMD] [--llmc-t256 CMD] */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "util.h"

/* Best of a few large square sgemm products on all threads: the machine's limit. */
static double sgemm_peak_gflops(void)
{
    const int n = 2048;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) a[i] = b[i] = (float)(i % 7) * 1e-3f;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = (pl_now_ms() / 1e3);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = (pl_now_ms() / 1e3) - t0;
        if (r && dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best / 1e9;
}

typedef struct {
    double ms, tokens_per_s, gflops;
    long rss_kb;
} result;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One size in this process: median step time over `steps` after a warm-up. */
static int run_pliant(int B, int T, int steps, int threads, result *res)
{
    char err[256];
    pl_gpt_config cfg;
    if (pl_gpt_config_init(&cfg, 12, 768, 12, 50257, 1024, err, sizeof err)) return -1;
    kn_ctx *k = kn_create("cpu", threads, err, sizeof err);
    pl_engine e;
    if (!k || pl_engine_create(&e, k, &cfg, 0, cfg.L + 2, B, T, 1, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    pl_engine_init_random(&e, 1337);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T + 1));
    for (int i = 0; i <= B * T; i++) tok[i] = (int32_t)((i * 2654435761u) % 50257u);
    pl_adamw o = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f};
    double *ms = malloc(sizeof(double) * (size_t)steps);
    for (int s = 0; s <= steps; s++) {
        double t0 = (pl_now_ms() / 1e3);
        pl_engine_zero_grads(&e);
        pl_engine_forward(&e, 0, tok, NULL, tok + 1);
        pl_engine_backward_last(&e, 0, NULL, 1.0f / (float)(B * T), NULL, NULL);
        (void)pl_engine_grad_sumsq(&e);
        pl_engine_adamw(&e, &o, 1.0f, s + 1);
        if (s) ms[s - 1] = ((pl_now_ms() / 1e3) - t0) * 1e3; /* step 0 warms up */
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    res->ms = ms[steps / 2];
    res->tokens_per_s = B * T / (res->ms / 1e3);
    double flops_per_token = 6.0 * (double)pl_gpt_total_params(&cfg) + 6.0 * cfg.L * cfg.C * T;
    res->gflops = res->tokens_per_s * flops_per_token / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->rss_kb = ru.ru_maxrss;
    free(ms);
    free(tok);
    pl_engine_destroy(&e);
    kn_destroy(k);
    return 0;
}

/* llm.c's trainer through /usr/bin/time -v: median of its "took X ms" after step 0. */
static int run_llmc(const char *cmd, int B, int T, result *res)
{
    char line[4096];
    snprintf(line, sizeof line, "/usr/bin/time -v %s 2>&1", cmd);
    FILE *p = popen(line, "r");
    if (!p) return -1;
    double ms[1000];
    int n = 0;
    res->rss_kb = 0;
    while (fgets(line, sizeof line, p)) {
        const char *took = strstr(line, "(took ");
        int step;
        if (took && sscanf(line, "step %d:", &step) == 1 && step > 0 && n < 1000)
            ms[n++] = atof(took + 6);
        const char *rss = strstr(line, "Maximum resident set size (kbytes):");
        if (rss) res->rss_kb = atol(rss + 35);
    }
    if (pclose(p) != 0 || n == 0) return -1;
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    res->ms = ms[n / 2];
    res->tokens_per_s = B * T / (res->ms / 1e3);
    res->gflops = 0;
    return 0;
}

static int in_child(int B, int T, int steps, int threads, result *res)
{
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        result r;
        int rc = run_pliant(B, T, steps, threads, &r);
        if (rc == 0 && write(fd[1], &r, sizeof r) != (ssize_t)sizeof r) rc = -1;
        _exit(rc ? 1 : 0);
    }
    close(fd[1]);
    ssize_t got = read(fd[0], res, sizeof *res);
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    return got == (ssize_t)sizeof *res && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    kn_cpu_use_fast_blas(argv); /* the kernels pliant itself runs (kernels.h) */
    int steps = 4, threads = 0;
    const char *llmc[2] = {NULL, NULL};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--llmc-t64")) llmc[0] = argv[i + 1];
        else if (!strcmp(argv[i], "--llmc-t256")) llmc[1] = argv[i + 1];
    }
    if (steps < 1) steps = 1;
    double peak = sgemm_peak_gflops();
    printf("physical limit: square sgemm %.1f GFLOP/s on this machine\n", peak);
    const int Ts[2] = {64, 256};
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        result p, l;
        if (in_child(4, Ts[i], steps, threads, &p)) {
            fprintf(stderr, "pliant run at T=%d failed\n", Ts[i]);
            rc = 1;
            continue;
        }
        printf("GPT-2 124M fp32 B=4 T=%-3d pliant: %8.1f ms/step %7.1f tok/s %6.1f GFLOP/s "
               "(%4.1f%% of sgemm peak), peak RSS %6.0f MiB\n",
               Ts[i], p.ms, p.tokens_per_s, p.gflops, 100 * p.gflops / peak, p.rss_kb / 1024.0);
        if (llmc[i]) {
            if (run_llmc(llmc[i], 4, Ts[i], &l)) {
                fprintf(stderr, "llm.c run at T=%d failed: %s\n", Ts[i], llmc[i]);
                rc = 1;
                continue;
            }
            printf("GPT-2 124M fp32 B=4 T=%-3d llm.c : %8.1f ms/step %7.1f tok/s, peak RSS %6.0f "
                   "MiB -> pliant/llm.c speed %.2fx, memory %.2fx\n",
                   Ts[i], l.ms, l.tokens_per_s, l.rss_kb / 1024.0, p.tokens_per_s / l.tokens_per_s,
                   (double)p.rss_kb / (double)l.rss_kb);
        }
    }
    return rc;
}
