/* CPU kernel benchmark (kernels/cpu/). Every figure is measured in the same
 * run as its baseline:
 *   - the physical limit: a large square cblas_sgemm with OpenBLAS's own
 *     threads on all the context's threads (the best this BLAS does here);
 *   - matmul forward and backward for the GPT-2 124M shapes (B·T = 256 and
 *     1024 rows, C = 768, OC = 2304 / 768 / 3072 / 50304, and the 3072 → 768
 *     projection), as GFLOP/s and % of that limit, next to the same products
 *     done by single cblas_sgemm calls on OpenBLAS's own threads;
 *   - a layer-like sequence (matmul, then GELU) both ways, which shows why the
 *     kernels keep OpenBLAS on one thread and split products over OpenMP;
 *   - attention (B = 4, C = 768, NH = 12, T = 64 and 256), GFLOP/s counted on
 *     the causal triangle, against the same sgemm limit;
 *   - the elementwise kernels at GPT-2 124M sizes, as GB/s of memory traffic.
 * Usage: kernels_bench [--quick] [--threads N] */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "util.h"

static int quick;

/* best time of STMT over at least 3 runs and 0.4 s (1 run and 0.1 s with --quick) */
#define TIME_BEST(best, stmt)                                                                \
    do {                                                                                     \
        double total_ = 0;                                                                   \
        (best) = 1e30;                                                                       \
        for (int rep_ = 0; rep_ < 1000 && (rep_ < (quick ? 1 : 3) ||                         \
                                           total_ < (quick ? 0.1 : 0.4)); rep_++) {          \
            double t0_ = (pl_now_ms() / 1e3);                                                            \
            stmt;                                                                            \
            double dt_ = (pl_now_ms() / 1e3) - t0_;                                                      \
            total_ += dt_;                                                                   \
            if (dt_ < (best)) (best) = dt_;                                                  \
        }                                                                                    \
    } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *make(kn_ctx *k, size_t n, float scale)
{
    float *p = kn_alloc(k, n * sizeof *p);
    if (!p) {
        fprintf(stderr, "kernels_bench: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = scale * frand();
    return p;
}

/* ---- sections ------------------------------------------------------------------- */

/* The best of square cblas_sgemm products (n = 1024, 2048, 3072) on OpenBLAS's
 * own threads: the physical limit the matmul figures are compared with. */
static double sgemm_peak(int threads, const char *when)
{
    int sizes[] = {1024, 2048, 3072}, nsizes = quick ? 1 : 3, best_n = 0;
    double best_gf = 0;
    openblas_set_num_threads(threads);
    for (int s = 0; s < nsizes; s++) {
        int n = sizes[s];
        float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
              *c = malloc((size_t)n * n * sizeof *c);
        if (!a || !b || !c) {
            fprintf(stderr, "kernels_bench: out of memory\n");
            exit(1);
        }
        for (size_t i = 0; i < (size_t)n * n; i++) a[i] = frand(), b[i] = frand(), c[i] = 0;
        double best;
        TIME_BEST(best, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n,
                                    b, n, 0.0f, c, n));
        double gf = 2.0 * n * n * n / best / 1e9;
        if (gf > best_gf) best_gf = gf, best_n = n;
        free(a);
        free(b);
        free(c);
    }
    openblas_set_num_threads(1); /* as kn_create leaves it */
    printf("physical limit (%s): best square cblas_sgemm (n=%d) on %d OpenBLAS threads: "
           "%.1f GFLOP/s\n\n", when, best_n, threads, best_gf);
    return best_gf;
}

static void bench_matmul(kn_ctx *k, double peak)
{
    int nt = kn_threads(k);
    int shapes[][3] = {{256, 768, 2304}, {256, 768, 768},  {256, 768, 3072},  {256, 3072, 768},
                       {256, 768, 50304}, {1024, 768, 2304}, {1024, 768, 768}, {1024, 768, 3072},
                       {1024, 3072, 768}, {1024, 768, 50304}};
    printf("matmul (out = inp·Wᵀ + b; backward: dinp, dW, db), GFLOP/s and %% of the limit;\n"
           "'OpenBLAS threads' = the same sgemm calls on OpenBLAS's own %d threads\n", nt);
    printf("%6s %5s %6s | %16s %16s | %16s %16s\n", "rows", "C", "OC", "forward", "backward",
           "fwd OpenBLAS thr", "bwd OpenBLAS thr");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int BT = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        if (quick && OC == 50304 && BT == 1024) continue;
        int has_bias = OC != 50304; /* the LM head has no bias */
        float *x = make(k, (size_t)BT * C, 1), *W = make(k, (size_t)OC * C, 0.05f);
        float *bias = has_bias ? make(k, (size_t)OC, 1) : NULL;
        float *out = make(k, (size_t)BT * OC, 1), *dx = make(k, (size_t)BT * C, 0);
        float *dW = make(k, (size_t)OC * C, 0), *db = has_bias ? make(k, (size_t)OC, 0) : NULL;
        double fl = 2.0 * BT * C * OC, tf, tb, nf, nb;
        TIME_BEST(tf, kn_matmul_forward(k, out, NULL, x, NULL, W, bias, BT, C, OC));
        TIME_BEST(tb, kn_matmul_backward(k, dx, dW, db, out, NULL, x, NULL, W, BT, C, OC));
        openblas_set_num_threads(nt);
        TIME_BEST(nf, cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, x, C, W,
                                  C, 0.0f, out, OC));
        TIME_BEST(nb, {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, out, OC, W, C,
                        1.0f, dx, C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, out, OC, x, C,
                        1.0f, dW, C);
        });
        openblas_set_num_threads(1);
        printf("%6d %5d %6d | %7.1f (%3.0f%%)   %7.1f (%3.0f%%)   | %7.1f (%3.0f%%)   %7.1f (%3.0f%%)\n",
               BT, C, OC, fl / tf / 1e9, 100 * fl / tf / 1e9 / peak, 2 * fl / tb / 1e9,
               100 * 2 * fl / tb / 1e9 / peak, fl / nf / 1e9, 100 * fl / nf / 1e9 / peak,
               2 * fl / nb / 1e9, 100 * 2 * fl / nb / 1e9 / peak);
        fflush(stdout);
        kn_free(k, x), kn_free(k, W), kn_free(k, bias), kn_free(k, out), kn_free(k, dx);
        kn_free(k, dW), kn_free(k, db);
    }
    printf("\n");
}

/* matmul 1024×768 → 3072 then GELU on its output, repeated: the kernels' way
 * (one OpenMP pool, OpenBLAS on one thread) against OpenBLAS's threads for the
 * product next to OpenMP for the GELU (two pools that spin in turn). */
static void bench_mixed(kn_ctx *k)
{
    int nt = kn_threads(k), BT = 1024, C = 768, OC = 3072, reps = quick ? 5 : 20;
    float *x = make(k, (size_t)BT * C, 1), *W = make(k, (size_t)OC * C, 0.05f);
    float *h = make(k, (size_t)BT * OC, 0), *g = make(k, (size_t)BT * OC, 0);
    double best_ours, best_mixed;
    TIME_BEST(best_ours, for (int r = 0; r < reps; r++) {
        kn_matmul_forward(k, h, NULL, x, NULL, W, NULL, BT, C, OC);
        kn_gelu_forward(k, g, h, (size_t)BT * OC);
    });
    openblas_set_num_threads(nt);
    TIME_BEST(best_mixed, for (int r = 0; r < reps; r++) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, x, C, W, C, 0.0f, h,
                    OC);
        kn_gelu_forward(k, g, h, (size_t)BT * OC);
    });
    openblas_set_num_threads(1);
    printf("matmul 1024x768->3072 + GELU, per pair: one OpenMP pool (kernels) %.2f ms, "
           "OpenBLAS threads + OpenMP %.2f ms (%.2fx)\n\n",
           best_ours / reps * 1e3, best_mixed / reps * 1e3, best_mixed / best_ours);
    kn_free(k, x), kn_free(k, W), kn_free(k, h), kn_free(k, g);
}

static void bench_attention(kn_ctx *k)
{
    int B = 4, C = 768, NH = 12, hs = C / NH, Ts[] = {64, 256};
    printf("attention B=%d C=%d NH=%d (GFLOP/s on the causal triangle: forward 2·B·NH·T(T+1)·hs,"
           " backward twice that)\n", B, C, NH);
    printf("%5s | %21s %21s\n", "T", "forward", "backward");
    for (int s = 0; s < 2; s++) {
        int T = Ts[s];
        size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
        size_t na = kn_attention_state_floats(k, B, T, C, NH, 0);
        float *qkv = make(k, nqkv, 1), *out = make(k, no, 0), *att = make(k, na, 0);
        float *dout = make(k, no, 1), *dqkv = make(k, nqkv, 0);
        double fl = 2.0 * B * NH * (double)T * (T + 1) * hs, tf, tb;
        TIME_BEST(tf, kn_attention_forward(k, out, NULL, att, qkv, NULL, B, T, C, NH));
        TIME_BEST(tb, kn_attention_backward(k, dqkv, NULL, dout, NULL, qkv, NULL, att, out, NULL,
                                            B, T, C, NH));
        printf("%5d | %7.3f ms %5.1f GF/s %7.3f ms %5.1f GF/s\n", T, tf * 1e3, fl / tf / 1e9,
               tb * 1e3, 2 * fl / tb / 1e9);
        fflush(stdout);
        kn_free(k, qkv), kn_free(k, out), kn_free(k, att), kn_free(k, dout), kn_free(k, dqkv);
    }
    printf("\n");
}

static void row(const char *name, double t, double bytes)
{
    printf("%-40s %9.3f ms %7.1f GB/s\n", name, t * 1e3, bytes / t / 1e9);
}

static void bench_elementwise(kn_ctx *k)
{
    const int BT = 1024, C = 768, V = 50257, Vp = 50304;
    const size_t n = (size_t)BT * C, n4 = 4 * n, nl = (size_t)BT * Vp;
    const size_t np = quick ? ((size_t)8 << 20) : 124475904; /* GPT-2 124M parameters (padded) */
    printf("elementwise kernels at GPT-2 124M sizes (B·T = %d), GB/s = bytes read + written\n", BT);
    float *x = make(k, n, 1), *y = make(k, n, 1), *o = make(k, n, 0), *w = make(k, C, 1),
          *b = make(k, C, 1), *mean = make(k, BT, 0), *rstd = make(k, BT, 0);
    float *dw = make(k, C, 0), *db = make(k, C, 0), *dx = make(k, n, 0);
    float *h = make(k, n4, 2), *g = make(k, n4, 0), *dh = make(k, n4, 0), *dg = make(k, n4, 1);
    float *logits = make(k, nl, 4), *probs = make(k, nl, 0), *losses = make(k, BT, 0);
    int32_t *tg = kn_alloc(k, BT * sizeof *tg), *tok = kn_alloc(k, BT * sizeof *tok);
    for (int i = 0; i < BT; i++) tg[i] = tok[i] = (int32_t)((frand() + 1.0f) * 0.5f * (float)(V - 1));
    float *wte = make(k, (size_t)Vp * C, 1), *wpe = make(k, (size_t)BT * C, 1);
    double t;

    TIME_BEST(t, kn_encoder_forward(k, o, tok, wte, wpe, 1, BT, C, V));
    row("encoder forward", t, 4.0 * 3 * n);
    TIME_BEST(t, kn_encoder_backward(k, wte, wpe, x, tok, 1, BT, C, V));
    row("encoder backward", t, 4.0 * 5 * n);
    TIME_BEST(t, kn_layernorm_forward(k, o, NULL, mean, rstd, x, w, b, 1, BT, C));
    row("layernorm forward 1024x768", t, 4.0 * 2 * n);
    TIME_BEST(t, kn_layernorm_backward(k, dx, NULL, dw, db, y, NULL, x, w, mean, rstd, 1, BT, C));
    row("layernorm backward 1024x768", t, 4.0 * 4 * n);
    TIME_BEST(t, kn_residual_forward(k, o, x, y, n));
    row("residual 1024x768", t, 4.0 * 3 * n);
    TIME_BEST(t, kn_gelu_forward(k, g, h, n4));
    row("gelu forward 1024x3072", t, 4.0 * 2 * n4);
    TIME_BEST(t, kn_gelu_backward(k, dh, h, dg, n4));
    row("gelu backward 1024x3072", t, 4.0 * 4 * n4);
    TIME_BEST(t, kn_softmax_crossentropy_forward(k, losses, probs, logits, tg, BT, V, Vp));
    row("softmax+crossentropy forward 1024x50304", t, 4.0 * 2 * nl);
    TIME_BEST(t, kn_crossentropy_softmax_backward(k, logits, probs, tg, 1.0f / BT, BT, V, Vp));
    row("crossentropy backward 1024x50304", t, 4.0 * 2 * nl);
    kn_free(k, x), kn_free(k, y), kn_free(k, o), kn_free(k, w), kn_free(k, b), kn_free(k, mean);
    kn_free(k, rstd), kn_free(k, dw), kn_free(k, db), kn_free(k, dx), kn_free(k, h), kn_free(k, g);
    kn_free(k, dh), kn_free(k, dg), kn_free(k, logits), kn_free(k, probs), kn_free(k, losses);
    kn_free(k, tg), kn_free(k, tok), kn_free(k, wte), kn_free(k, wpe);

    float *p = make(k, np, 1), *gr = make(k, np, 1), *m = make(k, np, 0), *v = make(k, np, 0);
    int step = 1;
    char name[64];
    TIME_BEST(t, kn_adamw_update(k, p, gr, m, v, np, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
                                 step++));
    snprintf(name, sizeof name, "adamw %.1fM params", np / 1e6);
    row(name, t, 4.0 * 7 * np);
    volatile double sink;
    TIME_BEST(t, sink = kn_sum_squares(k, gr, np));
    (void)sink;
    snprintf(name, sizeof name, "sum of squares %.1fM (double)", np / 1e6);
    row(name, t, 4.0 * np);
    kn_free(k, p), kn_free(k, gr), kn_free(k, m), kn_free(k, v);
}

int main(int argc, char **argv)
{
    kn_cpu_use_fast_blas(argv); /* the kernels pliant itself runs (kernels.h) */
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    char err[128];
    kn_ctx *k = kn_create("cpu", threads, err, sizeof err);
    if (!k) {
        fprintf(stderr, "kernels_bench: %s\n", err);
        return 1;
    }
    printf("CPU kernels, %d threads, OpenBLAS %s (core %s)\n", kn_threads(k), openblas_get_config(),
           openblas_get_corename());
    double peak = sgemm_peak(kn_threads(k), "start of run");
    bench_matmul(k, peak);
    bench_mixed(k);
    bench_attention(k);
    bench_elementwise(k);
    printf("\n");
    sgemm_peak(kn_threads(k), "again at the end, to show drift");
    kn_destroy(k);
    return 0;
}
