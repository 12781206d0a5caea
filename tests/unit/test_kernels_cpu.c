/* Tests of the CPU compute kernels (kernels/kernels.h, kernels/cpu/).
 *
 * Every kernel is compared with a straightforward reference written here in
 * double precision (naive loops, the formulas of llm.c's train_gpt2.c), on
 * fresh random inputs of several shapes, odd ones included (T = 1, T = 7,
 * T past one and two attention row blocks, C not a multiple of 8, NH = 1 and 4,
 * V < Vp). Tolerances are relative to the largest magnitude of the reference.
 * Backward kernels are checked to ACCUMULATE into pre-filled gradients, and
 * against central finite differences of the double-precision reference
 * forward on tiny sizes. Further: the causal mask (outputs at t do not
 * depend on inputs after t), cross-entropy masking (target −1), AdamW over
 * several steps against its formula, the double sums, and results for 1, 2
 * and 3 threads. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "cpu/cpu.h" /* kn_expf, kn_tanhf */
#include "kernels.h"
#include "rng.h"

static kn_ctx *ctx; /* 2 threads */

/* ---- memory: everything a test allocates is freed before the next one ---- */

typedef struct {
    void *p;
    int backend; /* from kn_alloc */
} arena_item;
static arena_item arena[512];
static int narena;

static void arena_reset(void)
{
    for (int i = 0; i < narena; i++) {
        if (arena[i].backend)
            kn_free(ctx, arena[i].p);
        else
            free(arena[i].p);
    }
    narena = 0;
}

static void *arena_add(void *p, int backend)
{
    if (!p || narena == (int)(sizeof arena / sizeof arena[0])) {
        fprintf(stderr, "test_kernels_cpu: out of memory or arena full\n");
        abort();
    }
    arena[narena].p = p;
    arena[narena].backend = backend;
    narena++;
    return p;
}

static float *tf(size_t n) { return arena_add(kn_alloc(ctx, (n ? n : 1) * sizeof(float)), 1); }
static int32_t *ti(size_t n) { return arena_add(kn_alloc(ctx, (n ? n : 1) * sizeof(int32_t)), 1); }
static double *td(size_t n) { return arena_add(calloc(n ? n : 1, sizeof(double)), 0); }

/* ---- random inputs ---- */

static double urand(void) /* uniform in [-1, 1) */
{
    return (double)(rng_next() >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static float *frand(size_t n, double scale)
{
    float *x = tf(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * urand());
    return x;
}

static double *to_d(const float *x, size_t n)
{
    double *d = td(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *fcopy(const float *x, size_t n)
{
    float *y = tf(n);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* |got − ref| ≤ tol · max|ref| everywhere (tol absolute when ref is all zero). */
static int near(const char *what, const float *got, const double *ref, size_t n, double tol)
{
    double scale = 0.0, worst = -1.0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0.0) scale = 1.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i])) d = INFINITY;
        if (d > worst) {
            worst = d;
            wi = i;
        }
    }
    if (getenv("KN_TEST_VERBOSE"))
        printf("    %-34s n=%-8zu max error %.2e of max|ref| (tolerance %.0e)\n", what, n,
               n ? worst / scale : 0.0, tol);
    if (n && worst > tol * scale) {
        printf("    %s: [%zu] = %.9g, expected %.9g (error %.3g > %.3g = %.1g·max|ref|)\n", what, wi,
               (double)got[wi], ref[wi], worst, tol * scale, tol);
        return 0;
    }
    return 1;
}

/* expected = before + delta (for accumulating kernels) */
static double *plus(const float *before, const double *delta, size_t n)
{
    double *e = td(n);
    for (size_t i = 0; i < n; i++) e[i] = (double)before[i] + delta[i];
    return e;
}

/* ---- references in double ------------------------------------------------ */

static void ref_encoder(double *out, const int32_t *inp, const double *wte, const double *wpe, int B,
                        int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)inp[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

static void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int32_t *inp,
                                 int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double d = dout[((size_t)b * T + t) * C + c];
                dwte[(size_t)inp[b * T + t] * C + c] += d;
                dwpe[(size_t)t * C + c] += d;
            }
}

static void ref_layernorm(double *out, double *mean, double *rstd, const double *x, const double *w,
                          const double *bias, int N, int C)
{
    for (int r = 0; r < N; r++) {
        const double *xr = x + (size_t)r * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) out[(size_t)r * C + i] = (xr[i] - m) * s * w[i] + bias[i];
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = s;
    }
}

static void ref_layernorm_backward(double *dx, double *dw, double *db, const double *dout,
                                   const double *x, const double *w, int N, int C)
{
    for (int r = 0; r < N; r++) {
        const double *xr = x + (size_t)r * C, *dr = dout + (size_t)r * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += xr[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        double dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; i++) {
            double norm = (xr[i] - m) * s;
            dnorm_mean += w[i] * dr[i];
            dnorm_norm_mean += w[i] * dr[i] * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            double norm = (xr[i] - m) * s;
            db[i] += dr[i];
            dw[i] += norm * dr[i];
            dx[(size_t)r * C + i] += (w[i] * dr[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}

static void ref_matmul(double *out, const double *x, const double *W, const double *bias, int BT,
                       int C, int OC)
{
    for (int r = 0; r < BT; r++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < C; i++) s += x[(size_t)r * C + i] * W[(size_t)o * C + i];
            out[(size_t)r * OC + o] = s;
        }
}

static void ref_matmul_backward(double *dx, double *dW, double *db, const double *dout,
                                const double *x, const double *W, int BT, int C, int OC)
{
    for (int r = 0; r < BT; r++)
        for (int o = 0; o < OC; o++) {
            double d = dout[(size_t)r * OC + o];
            for (int i = 0; i < C; i++) {
                dx[(size_t)r * C + i] += d * W[(size_t)o * C + i];
                dW[(size_t)o * C + i] += d * x[(size_t)r * C + i];
            }
            if (db) db[o] += d;
        }
}

static void ref_attention(double *out, double *att, const double *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hs);
    double *row = malloc((size_t)T * sizeof *row);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *kk = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += q[i] * kk[i];
                    row[t2] = d * scale;
                    mx = fmax(mx, row[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    row[t2] = exp(row[t2] - mx);
                    sum += row[t2];
                }
                double *a = att ? att + (((size_t)b * NH + h) * T + t) * T : NULL;
                for (int t2 = 0; t2 < T; t2++) {
                    row[t2] = t2 <= t ? row[t2] / sum : 0.0;
                    if (a) a[t2] = row[t2];
                }
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double s = 0;
                    for (int t2 = 0; t2 <= t; t2++)
                        s += row[t2] * qkv[((size_t)b * T + t2) * C3 + 2 * C + h * hs + i];
                    o[i] = s;
                }
            }
    free(row);
}

/* llm.c attention_backward, in double */
static void ref_attention_backward(double *dqkv, const double *dout, const double *qkv,
                                   const double *att, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)hs);
    double *datt = malloc((size_t)T * sizeof *datt), *dpre = malloc((size_t)T * sizeof *dpre);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const double *a = att + (((size_t)b * NH + h) * T + t) * T;
                const double *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                double *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                const double *d = dout + ((size_t)b * T + t) * C + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    double *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
                    datt[t2] = 0;
                    for (int i = 0; i < hs; i++) {
                        datt[t2] += v[i] * d[i];
                        dv[i] += a[t2] * d[i];
                    }
                }
                for (int t3 = 0; t3 <= t; t3++) dpre[t3] = 0;
                for (int t2 = 0; t2 <= t; t2++)
                    for (int t3 = 0; t3 <= t; t3++)
                        dpre[t3] += a[t2] * ((t2 == t3 ? 1.0 : 0.0) - a[t3]) * datt[t2];
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *kk = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    double *dk = dqkv + ((size_t)b * T + t2) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += kk[i] * dpre[t2] * scale;
                        dk[i] += q[i] * dpre[t2] * scale;
                    }
                }
            }
    free(datt);
    free(dpre);
}

#define GELU_S 0.79788456080286535588 /* sqrt(2/pi) */

static double gelu_d(double x)
{
    return 0.5 * x * (1.0 + tanh(GELU_S * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_d(double x)
{
    double u = GELU_S * (x + 0.044715 * x * x * x), th = tanh(u), ch = cosh(u);
    return 0.5 * (1.0 + th) + x * 0.5 / (ch * ch) * GELU_S * (1.0 + 3.0 * 0.044715 * x * x);
}

static void ref_softmax_ce(double *losses, double *probs, const double *logits,
                           const int32_t *targets, int BT, int V, int Vp)
{
    for (int r = 0; r < BT; r++) {
        const double *l = logits + (size_t)r * Vp;
        double *p = probs + (size_t)r * Vp;
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
        for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
        for (int i = 0; i < Vp; i++) p[i] = i < V ? exp(l[i] - mx) / sum : 0.0;
        losses[r] = targets[r] < 0 ? 0.0 : -log(p[targets[r]]);
    }
}

/* ---- context and memory ---------------------------------------------------- */

static void test_context(void)
{
    arena_reset();
    char err[128] = "";
    CHECK(kn_create("cuda", 1, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "cuda");
    CHECK(kn_create(NULL, 1, err, sizeof err) == NULL);
    kn_ctx *all = kn_create("cpu", 0, err, sizeof err);
    CHECK(all != NULL);
    int n = kn_threads(all);
    kn_destroy(all);
    CHECK(n >= 1);
    CHECK(strcmp(kn_backend(ctx), "cpu") == 0);
    CHECK_EQ_INT(kn_threads(ctx), 2);
    size_t sizes[] = {0, 1, 3, 64, 1000, (size_t)5 << 20}; /* the last one zeroes in parallel */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        unsigned char *p = kn_alloc(ctx, sizes[s]);
        CHECK(p != NULL);
        int aligned = ((uintptr_t)p % 64) == 0, zero = 1;
        for (size_t i = 0; i < sizes[s]; i++) zero &= p[i] == 0;
        memset(p, 0xAB, sizes[s]);
        kn_zero(ctx, p, sizes[s]);
        for (size_t i = 0; i < sizes[s]; i++) zero &= p[i] == 0;
        kn_free(ctx, p);
        CHECK(aligned);
        CHECK(zero);
    }
    float *d = tf(100), h[100], back[100];
    for (int i = 0; i < 100; i++) h[i] = (float)i * 0.5f;
    kn_to_device(ctx, d, h, sizeof h);
    kn_sync(ctx);
    kn_to_host(ctx, back, d, sizeof back);
    CHECK(memcmp(h, back, sizeof h) == 0);
    kn_free(ctx, NULL);
    kn_destroy(NULL);
}

/* ---- encoder ---------------------------------------------------------------- */

static void test_encoder(void)
{
    arena_reset();
    rng_state = 101;
    int shapes[][4] = {{1, 1, 5, 3}, {2, 7, 13, 11}, {4, 64, 72, 50}, {3, 33, 200, 9}}; /* B T C V */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], V = shapes[s][3];
        size_t BT = (size_t)B * T;
        int32_t *inp = ti(BT);
        for (size_t i = 0; i < BT; i++) inp[i] = (int32_t)rng_range(0, V - 1); /* repeats */
        float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)T * C, 1), *out = tf(BT * C);
        double *ref = td(BT * C);
        kn_encoder_forward(ctx, out, inp, wte, wpe, B, T, C, V);
        ref_encoder(ref, inp, to_d(wte, (size_t)V * C), to_d(wpe, (size_t)T * C), B, T, C);
        CHECK(near("encoder out", out, ref, BT * C, 1e-6));

        float *dout = frand(BT * C, 1), *dwte = frand((size_t)V * C, 1),
              *dwpe = frand((size_t)T * C, 1);
        float *dwte0 = fcopy(dwte, (size_t)V * C), *dwpe0 = fcopy(dwpe, (size_t)T * C);
        double *gte = td((size_t)V * C), *gpe = td((size_t)T * C);
        kn_encoder_backward(ctx, dwte, dwpe, dout, inp, B, T, C, V);
        ref_encoder_backward(gte, gpe, to_d(dout, BT * C), inp, B, T, C);
        CHECK(near("encoder dwte (accumulated)", dwte, plus(dwte0, gte, (size_t)V * C),
                   (size_t)V * C, 1e-5));
        CHECK(near("encoder dwpe (accumulated)", dwpe, plus(dwpe0, gpe, (size_t)T * C),
                   (size_t)T * C, 1e-5));
    }
}

/* Token ids outside [0, V) (bad data the loader missed): no read or write outside wte
 * and dwte (their exact sizes, checked by the sanitized build), a NaN row forward, no
 * gradient to dwte; the good positions are untouched by the bad ones. */
static void test_encoder_out_of_vocab(void)
{
    enum { B = 2, T = 4, C = 8, V = 5 };
    const int32_t inp[B * T] = {0, 4, 5, -1, 65535, 2, 4, INT32_MAX};
    float *wte = malloc(sizeof(float) * V * C), *wpe = malloc(sizeof(float) * T * C);
    float *out = malloc(sizeof(float) * B * T * C), *dout = malloc(sizeof(float) * B * T * C);
    float *dwte = calloc(V * C, sizeof(float)), *dwpe = calloc(T * C, sizeof(float));
    float want_te[V * C] = {0}, want_pe[T * C] = {0};
    int ok = wte && wpe && out && dout && dwte && dwpe;
    for (int i = 0; ok && i < V * C; i++) wte[i] = 0.25f * (float)(i + 1);
    for (int i = 0; ok && i < T * C; i++) wpe[i] = -0.5f * (float)i;
    for (int i = 0; ok && i < B * T * C; i++) dout[i] = 0.125f * (float)(i % 11) - 0.5f;
    if (ok) {
        kn_encoder_forward(ctx, out, inp, wte, wpe, B, T, C, V);
        kn_encoder_backward(ctx, dwte, dwpe, dout, inp, B, T, C, V);
    }
    int bad_rows = 0, good_rows = 0;
    for (int bt = 0; ok && bt < B * T; bt++) {
        const int id = inp[bt], t = bt % T, good = id >= 0 && id < V;
        int nan_row = 1, exact = 1;
        for (int c = 0; c < C; c++) {
            nan_row &= isnan(out[bt * C + c]);
            if (good) exact &= out[bt * C + c] == wte[id * C + c] + wpe[t * C + c];
            if (good) want_te[id * C + c] += dout[bt * C + c];
            want_pe[t * C + c] += dout[bt * C + c];
        }
        bad_rows += !good && nan_row;
        good_rows += good && exact;
    }
    int te_same = ok && !memcmp(dwte, want_te, sizeof want_te);
    int pe_same = ok && !memcmp(dwpe, want_pe, sizeof want_pe);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe);
    CHECK(ok);
    CHECK_EQ_INT(bad_rows, 4);  /* 5, -1, 65535, INT32_MAX */
    CHECK_EQ_INT(good_rows, 4); /* 0, 4, 2, 4 */
    CHECK(te_same);             /* only the good positions, in order */
    CHECK(pe_same);             /* every position */
}

/* ---- layernorm ---------------------------------------------------------------- */

static void test_layernorm(void)
{
    arena_reset();
    rng_state = 202;
    int shapes[][3] = {{1, 1, 1}, {1, 1, 8}, {2, 7, 13}, {3, 33, 200}, {2, 64, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t N = (size_t)B * T, n = N * C;
        float *x = frand(n, 2), *w = frand((size_t)C, 1), *b = frand((size_t)C, 1);
        for (size_t i = 0; i < n; i++) x[i] += 0.5f; /* non-zero mean */
        float *out = tf(n), *mean = tf(N), *rstd = tf(N);
        double *xd = to_d(x, n), *wd = to_d(w, (size_t)C), *bd = to_d(b, (size_t)C);
        double *rout = td(n), *rmean = td(N), *rrstd = td(N);
        kn_layernorm_forward(ctx, out, NULL, mean, rstd, x, w, b, B, T, C);
        ref_layernorm(rout, rmean, rrstd, xd, wd, bd, (int)N, C);
        CHECK(near("layernorm out", out, rout, n, 2e-5));
        CHECK(near("layernorm mean", mean, rmean, N, 1e-5));
        if (C > 1) CHECK(near("layernorm rstd", rstd, rrstd, N, 1e-5));

        float *dout = frand(n, 1), *dx = frand(n, 1), *dw = frand((size_t)C, 1),
              *db = frand((size_t)C, 1);
        float *dx0 = fcopy(dx, n), *dw0 = fcopy(dw, (size_t)C), *db0 = fcopy(db, (size_t)C);
        double *gx = td(n), *gw = td((size_t)C), *gb = td((size_t)C);
        kn_layernorm_backward(ctx, dx, NULL, dw, db, dout, NULL, x, w, mean, rstd, B, T, C);
        ref_layernorm_backward(gx, gw, gb, to_d(dout, n), xd, wd, (int)N, C);
        /* C = 1: the normalized value is 0 whatever the input, dinp is rounding noise */
        if (C > 1) CHECK(near("layernorm dinp (accumulated)", dx, plus(dx0, gx, n), n, 2e-5));
        CHECK(near("layernorm dweight (accumulated)", dw, plus(dw0, gw, (size_t)C), (size_t)C,
                   2e-5));
        CHECK(near("layernorm dbias (accumulated)", db, plus(db0, gb, (size_t)C), (size_t)C,
                   1e-5));
    }
}

/* ---- matmul ------------------------------------------------------------------ */

/* BT, C, OC, with bias. The shapes take every split: columns or rows of the
 * output forward, rows or columns of dinp and dweight backward, and one thread
 * for small products. */
static const int mm_shapes[][4] = {
    {1, 5, 3, 1}, {7, 13, 9, 1}, {7, 13, 9, 0}, {37, 45, 70, 1}, {20, 200, 100, 1},
    {300, 64, 20, 1}, {130, 96, 300, 0}, {1, 768, 400, 1}, {64, 768, 768, 1},
};

static void test_matmul_forward(void)
{
    arena_reset();
    rng_state = 303;
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        int BT = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
        int has_bias = mm_shapes[s][3];
        float *x = frand((size_t)BT * C, 1), *W = frand((size_t)OC * C, 1);
        float *bias = has_bias ? frand((size_t)OC, 1) : NULL;
        float *out = frand((size_t)BT * OC, 1); /* overwritten */
        double *ref = td((size_t)BT * OC);
        kn_matmul_forward(ctx, out, NULL, x, NULL, W, bias, BT, C, OC);
        ref_matmul(ref, to_d(x, (size_t)BT * C), to_d(W, (size_t)OC * C),
                   bias ? to_d(bias, (size_t)OC) : NULL, BT, C, OC);
        CHECK(near("matmul out", out, ref, (size_t)BT * OC, 1e-5));
    }
}

/* kn_lowp_mirror on "cpu-lowp": a matmul whose weight lies inside the registered range
 * multiplies the mirror's bf16 values as they were when it was made (so after a write to
 * the weights, the old ones) until it is made again or dropped; on the CPU a no-op. */
static void test_lowp_mirror(void)
{
    char err[256];
    kn_ctx *kl = kn_create("cpu-lowp", 1, err, sizeof err);
    CHECK(kl != NULL);
    enum { BT = 3, C = 8, OC = 4, N = 64 };
    float *w = kn_alloc(kl, N * sizeof(float)), x[BT * C], a[BT * OC], b[BT * OC];
    void *lp = kn_alloc(kl, kn_lowp_bytes(kl, N));
    for (int i = 0; i < N; i++) w[i] = 1.0f + (float)i / 4096; /* not all bf16 values */
    for (int i = 0; i < BT * C; i++) x[i] = 1.0f;
    float *wt = w + 16; /* the weight: inside the mirrored range, not at its start */
    kn_matmul_forward(kl, a, NULL, x, NULL, wt, NULL, BT, C, OC);
    kn_lowp_mirror(kl, lp, w, N);
    kn_matmul_forward(kl, b, NULL, x, NULL, wt, NULL, BT, C, OC);
    CHECK(memcmp(a, b, sizeof a) != 0); /* the mirror's rounded values */
    float mirrored[BT * OC];
    memcpy(mirrored, b, sizeof b);
    for (int i = 0; i < N; i++) w[i] *= 2; /* a write the mirror does not see */
    kn_matmul_forward(kl, b, NULL, x, NULL, wt, NULL, BT, C, OC);
    CHECK(memcmp(mirrored, b, sizeof b) == 0);
    kn_lowp_mirror(kl, NULL, w, 0); /* dropped: the fp32 weights again */
    kn_matmul_forward(kl, b, NULL, x, NULL, wt, NULL, BT, C, OC);
    for (int i = 0; i < BT * OC; i++) CHECK(b[i] == 2 * a[i]);
    kn_free(kl, lp);
    kn_free(kl, w);
    kn_destroy(kl);
    float v[4] = {1.5f, 2, 3, 4}, out[1], one[4] = {1, 1, 1, 1};
    kn_lowp_mirror(ctx, NULL, v, 4); /* the CPU keeps no copies: nothing registered */
    kn_matmul_forward(ctx, out, NULL, one, NULL, v, NULL, 1, 4, 1);
    CHECK(out[0] == 10.5f);
}

static void test_matmul_backward(void)
{
    arena_reset();
    rng_state = 404;
    for (size_t s = 0; s < sizeof mm_shapes / sizeof mm_shapes[0]; s++) {
        int BT = mm_shapes[s][0], C = mm_shapes[s][1], OC = mm_shapes[s][2];
        int has_bias = mm_shapes[s][3];
        size_t nx = (size_t)BT * C, nw = (size_t)OC * C, no = (size_t)BT * OC;
        float *x = frand(nx, 1), *W = frand(nw, 1), *dout = frand(no, 1);
        float *dx = frand(nx, 1), *dW = frand(nw, 1), *db = has_bias ? frand((size_t)OC, 1) : NULL;
        float *dx0 = fcopy(dx, nx), *dW0 = fcopy(dW, nw), *db0 = db ? fcopy(db, (size_t)OC) : NULL;
        double *gx = td(nx), *gW = td(nw), *gb = td((size_t)OC);
        kn_matmul_backward(ctx, dx, dW, db, dout, NULL, x, NULL, W, BT, C, OC);
        ref_matmul_backward(gx, gW, gb, to_d(dout, no), to_d(x, nx), to_d(W, nw), BT, C, OC);
        CHECK(near("matmul dinp (accumulated)", dx, plus(dx0, gx, nx), nx, 1e-5));
        CHECK(near("matmul dweight (accumulated)", dW, plus(dW0, gW, nw), nw, 1e-5));
        if (db)
            CHECK(near("matmul dbias (accumulated)", db, plus(db0, gb, (size_t)OC), (size_t)OC,
                       1e-5));
    }
}

/* ---- attention --------------------------------------------------------------- */

/* B, T, C, NH: T = 1, 7, 64 (one row block), 65, 130 and 200 (partial blocks); NH 1, 3, 4;
 * head sizes 3, 8, 13, 16 and 64. */
static const int att_shapes[][4] = {
    {1, 1, 8, 1}, {2, 7, 12, 4}, {1, 7, 13, 1}, {2, 64, 32, 4}, {1, 65, 16, 1}, {2, 130, 64, 4},
    {1, 200, 192, 3},
};

static void test_attention_forward(void)
{
    arena_reset();
    rng_state = 505;
    for (size_t s = 0; s < sizeof att_shapes / sizeof att_shapes[0]; s++) {
        int B = att_shapes[s][0], T = att_shapes[s][1], C = att_shapes[s][2], NH = att_shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
        float *qkv = frand(nqkv, 2), *out = frand(no, 1), *att = frand(na, 1);
        double *rout = td(no), *ratt = td(na);
        kn_attention_forward(ctx, out, NULL, att, qkv, NULL, B, T, C, NH);
        ref_attention(rout, ratt, to_d(qkv, nqkv), B, T, C, NH);
        CHECK(near("attention out", out, rout, no, 1e-5));
        CHECK(near("attention att", att, ratt, na, 1e-5));
        for (size_t row = 0; row < (size_t)B * NH * T; row++) { /* zeros above the diagonal */
            int t = (int)(row % T);
            for (int t2 = t + 1; t2 < T; t2++) CHECK(att[row * T + t2] == 0.0f);
        }
    }
}

static void test_attention_backward(void)
{
    arena_reset();
    rng_state = 606;
    for (size_t s = 0; s < sizeof att_shapes / sizeof att_shapes[0]; s++) {
        int B = att_shapes[s][0], T = att_shapes[s][1], C = att_shapes[s][2], NH = att_shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
        float *qkv = frand(nqkv, 2), *out = tf(no), *att = tf(na);
        kn_attention_forward(ctx, out, NULL, att, qkv, NULL, B, T, C, NH);
        float *dout = frand(no, 1), *dqkv = frand(nqkv, 1); /* overwritten */
        kn_attention_backward(ctx, dqkv, NULL, dout, NULL, qkv, NULL, att, out, NULL, B, T, C, NH);
        double *qd = to_d(qkv, nqkv), *rout = td(no), *ratt = td(na), *g = td(nqkv);
        ref_attention(rout, ratt, qd, B, T, C, NH);
        ref_attention_backward(g, to_d(dout, no), qd, ratt, B, T, C, NH);
        CHECK(near("attention dqkv (overwritten)", dqkv, g, nqkv, 2e-5));
    }
}

/* Outputs at t ≤ t0 are bit-identical when the inputs after t0 change; the
 * gradient reaching positions after t0 is exactly zero when only outputs at
 * t ≤ t0 carry gradient. */
static void test_attention_causal(void)
{
    arena_reset();
    rng_state = 707;
    int shapes[][5] = {{2, 7, 12, 4, 3}, {1, 130, 32, 4, 70}, {1, 130, 32, 1, 5}}; /* + t0 */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        int t0 = shapes[s][4];
        size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
        float *qkv = frand(nqkv, 2), *out = tf(no), *att = tf(na);
        float *qkv2 = fcopy(qkv, nqkv), *out2 = tf(no), *att2 = tf(na);
        for (int b = 0; b < B; b++)
            for (int t = t0 + 1; t < T; t++)
                for (int c = 0; c < 3 * C; c++)
                    qkv2[((size_t)b * T + t) * 3 * C + c] = (float)(5.0 * urand());
        kn_attention_forward(ctx, out, NULL, att, qkv, NULL, B, T, C, NH);
        kn_attention_forward(ctx, out2, NULL, att2, qkv2, NULL, B, T, C, NH);
        for (int b = 0; b < B; b++) {
            size_t rows = (size_t)(t0 + 1) * C;
            CHECK(memcmp(out + (size_t)b * T * C, out2 + (size_t)b * T * C,
                         rows * sizeof(float)) == 0);
            CHECK(memcmp(out + (size_t)b * T * C + rows, out2 + (size_t)b * T * C + rows,
                         ((size_t)T * C - rows) * sizeof(float)) != 0);
        }
        float *dout = tf(no), *dqkv = tf(nqkv);
        for (int b = 0; b < B; b++)
            for (int t = 0; t <= t0; t++)
                for (int c = 0; c < C; c++) dout[((size_t)b * T + t) * C + c] = (float)urand();
        kn_attention_backward(ctx, dqkv, NULL, dout, NULL, qkv, NULL, att, out, NULL, B, T, C, NH);
        int zero_after = 1, nonzero_before = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < 3 * C; c++) {
                    float g = dqkv[((size_t)b * T + t) * 3 * C + c];
                    if (t > t0) zero_after &= g == 0.0f;
                    else nonzero_before |= g != 0.0f;
                }
        CHECK(zero_after);
        CHECK(nonzero_before);
    }
}

/* ---- gelu, residual ------------------------------------------------------------- */

static void test_gelu(void)
{
    arena_reset();
    rng_state = 808;
    size_t sizes[] = {1, 37, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = frand(n, 6), *out = frand(n, 1);
        if (n > 4) { x[0] = 0.0f; x[1] = -20.0f; x[2] = 20.0f; x[3] = 1e-4f; }
        double *ref = td(n), *g = td(n);
        kn_gelu_forward(ctx, out, x, n);
        for (size_t i = 0; i < n; i++) ref[i] = gelu_d(x[i]);
        CHECK(near("gelu out", out, ref, n, 1e-6));
        float *dout = frand(n, 1), *dx = frand(n, 1), *dx0 = fcopy(dx, n);
        kn_gelu_backward(ctx, dx, x, dout, n);
        for (size_t i = 0; i < n; i++) g[i] = gelu_grad_d(x[i]) * dout[i];
        CHECK(near("gelu dinp (accumulated)", dx, plus(dx0, g, n), n, 5e-6));
    }
}

static void test_residual_accumulate(void)
{
    arena_reset();
    rng_state = 909;
    size_t sizes[] = {1, 13, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *a = frand(n, 1), *b = frand(n, 1), *out = frand(n, 1);
        double *ref = td(n);
        for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
        kn_residual_forward(ctx, out, a, b, n);
        CHECK(near("residual out", out, ref, n, 1e-7));
        float *a2 = fcopy(a, n), *b2 = fcopy(b, n);
        kn_residual_forward(ctx, a2, a2, b, n); /* out aliases a */
        CHECK(near("residual out=a", a2, ref, n, 1e-7));
        kn_residual_forward(ctx, b2, a, b2, n); /* out aliases b */
        CHECK(near("residual out=b", b2, ref, n, 1e-7));
        float *dst = frand(n, 1), *dst0 = fcopy(dst, n);
        kn_accumulate(ctx, dst, a, n);
        for (size_t i = 0; i < n; i++) ref[i] = (double)dst0[i] + a[i];
        CHECK(near("accumulate", dst, ref, n, 1e-7));
    }
}

/* ---- softmax + cross-entropy --------------------------------------------------- */

static void test_crossentropy(void)
{
    arena_reset();
    rng_state = 1010;
    int shapes[][3] = {{1, 1, 1}, {5, 7, 8}, {6, 50, 64}, {33, 1000, 1024}, {4, 500, 500},
                       {3, 50257, 50304}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int BT = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
        size_t n = (size_t)BT * Vp;
        float *logits = frand(n, 4), *probs = frand(n, 1), *losses = frand((size_t)BT, 1);
        int32_t *tg = ti((size_t)BT);
        for (int r = 0; r < BT; r++) tg[r] = (int32_t)rng_range(0, V - 1);
        if (BT > 2) tg[1] = -1; /* masked */
        if (BT > 3) logits[(size_t)3 * Vp + tg[3]] = -60.0f; /* p[target] ≈ 1e-27 */
        double *rl = td((size_t)BT), *rp = td(n);
        kn_softmax_crossentropy_forward(ctx, losses, probs, logits, tg, BT, V, Vp);
        ref_softmax_ce(rl, rp, to_d(logits, n), tg, BT, V, Vp);
        CHECK(near("crossentropy losses", losses, rl, (size_t)BT, 1e-5));
        CHECK(near("softmax probs", probs, rp, n, 1e-5));
        for (int r = 0; r < BT; r++) {
            for (int i = V; i < Vp; i++) CHECK(probs[(size_t)r * Vp + i] == 0.0f);
            if (tg[r] < 0) CHECK(losses[r] == 0.0f);
        }

        float scale = 1.0f / (float)BT;
        float *dl = frand(n, 1); /* overwritten */
        double *g = td(n);
        kn_crossentropy_softmax_backward(ctx, dl, probs, tg, scale, BT, V, Vp);
        for (int r = 0; r < BT; r++)
            for (int i = 0; i < V; i++)
                g[(size_t)r * Vp + i] =
                    tg[r] < 0 ? 0.0 : (rp[(size_t)r * Vp + i] - (i == tg[r])) * scale;
        CHECK(near("crossentropy dlogits", dl, g, n, 1e-5));
        for (int r = 0; r < BT; r++)
            for (int i = 0; i < Vp; i++)
                if (i >= V || tg[r] < 0) CHECK(dl[(size_t)r * Vp + i] == 0.0f);
    }
}

/* The training path (kn_crossentropy_forward / _backward, per-row statistics in
 * place of the probabilities) gives the pair's losses and dlogits bit for bit,
 * in place as the engine calls it, with masked rows, a target ≥ V (NaN loss)
 * and an underflowing target probability. */
static void test_crossentropy_stats(void)
{
    arena_reset();
    rng_state = 1020;
    int shapes[][3] = {{1, 1, 1}, {5, 7, 8}, {6, 50, 64}, {33, 1000, 1024}, {4, 500, 500},
                       {3, 50257, 50304}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int BT = shapes[s][0], V = shapes[s][1], Vp = shapes[s][2];
        size_t n = (size_t)BT * Vp;
        float *logits = frand(n, 4), *probs = tf(n), *losses = tf((size_t)BT);
        float *losses2 = tf((size_t)BT), *stats = tf(2 * (size_t)BT), *dl = tf(n), *dl2 = tf(n);
        int32_t *tg = ti((size_t)BT);
        for (int r = 0; r < BT; r++) tg[r] = (int32_t)rng_range(0, V - 1);
        if (BT > 2) tg[1] = -1; /* masked */
        if (BT > 3) logits[(size_t)3 * Vp + tg[3]] = -60.0f; /* p[target] ≈ 1e-27 */
        if (BT > 4) tg[4] = V; /* bad data: NaN loss */
        memcpy(dl2, logits, n * sizeof(float));
        float scale = 1.0f / (float)BT;
        kn_softmax_crossentropy_forward(ctx, losses, probs, logits, tg, BT, V, Vp);
        kn_crossentropy_softmax_backward(ctx, dl, probs, tg, scale, BT, V, Vp);
        kn_crossentropy_forward(ctx, losses2, stats, dl2, tg, BT, V, Vp);
        CHECK(memcmp(dl2, logits, n * sizeof(float)) == 0); /* logits unchanged */
        kn_crossentropy_backward(ctx, dl2, dl2, stats, tg, scale, BT, V, Vp); /* in place */
        CHECK(memcmp(losses2, losses, (size_t)BT * sizeof(float)) == 0);
        CHECK(memcmp(dl2, dl, n * sizeof(float)) == 0);
        if (BT > 4) CHECK(isnan(losses2[4]));
    }
}

/* A NaN anywhere in a row must show in its outputs (divergence is detected
 * from the loss), not vanish in a max or a clamp. */
static void test_nan_propagates(void)
{
    arena_reset();
    rng_state = 1050;
    int V = 10, Vp = 16;
    float *logits = frand(2 * (size_t)Vp, 2), *probs = tf(2 * (size_t)Vp), *losses = tf(2);
    int32_t *tg = ti(2);
    tg[0] = 3, tg[1] = 4;
    logits[7] = NAN;
    kn_softmax_crossentropy_forward(ctx, losses, probs, logits, tg, 2, V, Vp);
    CHECK(isnan(losses[0]));
    CHECK(isfinite(losses[1]));
    float x[3] = {1.0f, NAN, -2.0f}, y[3];
    kn_gelu_forward(ctx, y, x, 3);
    CHECK(isfinite(y[0]) && isnan(y[1]) && isfinite(y[2]));
    float *qkv = frand(3 * 4 * 8, 1), *out = tf(4 * 8), *att = tf(2 * 4 * 4);
    qkv[1 * 24 + 9] = NAN; /* key of position 1, head 0 */
    kn_attention_forward(ctx, out, NULL, att, qkv, NULL, 1, 4, 8, 2);
    CHECK(isfinite(out[0]));     /* position 0 does not see position 1 */
    CHECK(isnan(out[2 * 8 + 0])); /* position 2, head 0 does */
    CHECK(isfinite(out[2 * 8 + 4])); /* head 1 does not */
}

/* The vectorizable exp and tanh of kernels/cpu/cpu.h against libm in double. */
static void test_expf_tanhf(void)
{
    double worst_exp = 0, worst_tanh = 0;
    for (int i = 0; i <= 1000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 1e6f;
        double e = exp((double)x), got = kn_expf(x);
        worst_exp = fmax(worst_exp, fabs(got - e) / e);
        float u = -10.0f + 20.0f * (float)i / 1e6f;
        worst_tanh = fmax(worst_tanh, fabs((double)kn_tanhf(u) - tanh((double)u)));
    }
    if (getenv("KN_TEST_VERBOSE"))
        printf("    kn_expf max relative error %.3g, kn_tanhf max absolute error %.3g\n", worst_exp,
               worst_tanh);
    CHECK(worst_exp < 2.5e-7);  /* about 2 ulp */
    CHECK(worst_tanh < 2.5e-7);
    CHECK(kn_expf(0.0f) == 1.0f);
    CHECK(kn_expf(-1000.0f) <= 1.7e-38f && kn_expf(-1000.0f) >= 0.0f);
    CHECK(kn_expf(-INFINITY) <= 1.7e-38f);
    CHECK(isnan(kn_expf(NAN)) && isnan(kn_expf(-NAN)));
    CHECK(kn_tanhf(30.0f) == 1.0f && kn_tanhf(-30.0f) == -1.0f && kn_tanhf(0.0f) == 0.0f);
    CHECK(isnan(kn_tanhf(NAN)));
}

/* ---- AdamW, sums ---------------------------------------------------------------- */

static void test_adamw(void)
{
    arena_reset();
    rng_state = 1111;
    size_t sizes[] = {1, 1000, 50001};
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *p = frand(n, 1), *m = tf(n), *v = tf(n);
        double *pd = to_d(p, n), *md = td(n), *vd = td(n);
        for (int t = 1; t <= 4; t++) {
            float *g = frand(n, 2);
            kn_adamw_update(ctx, p, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps,
                            (float)wd, (float)gs, t);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)g[i] * gs;
                md[i] = b1 * md[i] + (1 - b1) * gi;
                vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
                double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
                pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
            }
            CHECK(near("adamw m", m, md, n, 1e-6));
            CHECK(near("adamw v", v, vd, n, 1e-6));
            CHECK(near("adamw params", p, pd, n, 1e-6));
        }
    }
}

/* kn_adamw_update_spans equals one kn_adamw_update per span, bit for bit: spans
 * out of order, with and without decay, an empty one, gaps left untouched. */
/* kn_matmul_backward_set equals zeroing dinp and kn_matmul_backward, bit for bit. */
static void test_matmul_backward_set(void)
{
    arena_reset();
    rng_state = 505;
    const int shapes[][3] = {{7, 13, 9}, {64, 32, 96}, {3, 0, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int BT = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        size_t ni = (size_t)BT * C, nw = (size_t)OC * C, no = (size_t)BT * OC;
        float *x = frand(ni, 1), *W = frand(nw, 1), *dout = frand(no, 1);
        float *dx = frand(ni, 1), *dx2 = frand(ni, 1), *dW = frand(nw, 1), *dW2 = tf(nw);
        float *db = frand((size_t)OC, 1), *db2 = tf((size_t)OC);
        memcpy(dW2, dW, nw * 4), memcpy(db2, db, (size_t)OC * 4);
        memset(dx, 0, ni * 4);
        kn_matmul_backward(ctx, dx, dW, db, dout, NULL, x, NULL, W, BT, C, OC);
        kn_matmul_backward_set(ctx, dx2, NULL, dW2, db2, dout, NULL, x, NULL, W, BT, C, OC);
        CHECK(memcmp(dx, dx2, ni * 4) == 0);
        CHECK(memcmp(dW, dW2, nw * 4) == 0);
        CHECK(memcmp(db, db2, (size_t)OC * 4) == 0);
    }
}

static void test_adamw_spans(void)
{
    arena_reset();
    rng_state = 1113;
    const size_t n = 3000;
    const kn_adamw_span sp[] = {{1000, 700, 1}, {0, 10, 0}, {10, 0, 1}, {2000, 1000, 0},
                                {1700, 250, 1}, {20, 1, 1}};
    const int ns = (int)(sizeof sp / sizeof sp[0]);
    float *p = frand(n, 1), *m = frand(n, 1), *v = frand(n, 1), *g = frand(n, 2);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *p2 = tf(n), *m2 = tf(n), *v2 = tf(n);
    memcpy(p2, p, n * 4), memcpy(m2, m, n * 4), memcpy(v2, v, n * 4);
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < ns; i++) {
            size_t o = sp[i].offset;
            kn_adamw_update(ctx, p + o, g + o, m + o, v + o, sp[i].n, 3e-3f, 0.9f, 0.95f, 1e-8f,
                            sp[i].decay ? 0.1f : 0.0f, 0.5f, t);
        }
        kn_adamw_update_spans(ctx, p2, g, m2, v2, sp, ns, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        CHECK(memcmp(p, p2, n * 4) == 0);
        CHECK(memcmp(m, m2, n * 4) == 0);
        CHECK(memcmp(v, v2, n * 4) == 0);
    }
}

static void test_reductions(void)
{
    arena_reset();
    rng_state = 1212;
    size_t sizes[] = {0, 1, 1000, 65536, 200001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        float *x = frand(n, 3);
        for (size_t i = 0; i < n; i++) x[i] += 0.25f;
        long double sq = 0, sum = 0;
        for (size_t i = 0; i < n; i++) {
            sq += (long double)x[i] * x[i];
            sum += x[i];
        }
        double a = kn_sum_squares(ctx, x, n), b = kn_sum(ctx, x, n);
        CHECK(fabs(a - (double)sq) <= 1e-12 * fabs((double)sq));
        CHECK(fabs(b - (double)sum) <= 1e-12 * (double)n * 3.25);
        /* no float rounding: squares of floats are exact in double */
        float big = 16777216.0f, one = 1.0f; /* 2^24 + 1 is not a float, 2^48 + 1 is a double */
        float pair[2] = {big, one};
        CHECK(kn_sum_squares(ctx, pair, 2) == 281474976710657.0);
        CHECK(kn_sum(ctx, pair, 2) == 16777217.0);
    }
}

/* ---- finite differences of the double reference forward ------------------------- */

/* Central differences of loss() with respect to x[0, n) against the kernel's
 * gradient. The reference forward runs in double, so the differences are
 * accurate to ~1e-9; the tolerance covers the kernel's fp32 rounding. */
static int fd_check(const char *what, double (*loss)(void), double *x, size_t n, const float *grad,
                    double tol)
{
    double *fd = malloc((n ? n : 1) * sizeof *fd);
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double lp = loss();
        x[i] = save - h;
        double lm = loss();
        x[i] = save;
        fd[i] = (lp - lm) / (2 * h);
    }
    int ok = near(what, grad, fd, n, tol);
    free(fd);
    return ok;
}

/* State of the loss being differentiated: L = Σ w · forward(inputs). */
static struct {
    int B, T, C, NH, OC, V, Vp;
    double *x, *w, *b, *W, *wsum, *out, *att, *probs, *losses;
    const int32_t *targets;
} fd;

static double weighted(const double *out, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fd.wsum[i] * out[i];
    return s;
}

static double loss_layernorm(void)
{
    size_t n = (size_t)fd.B * fd.T * fd.C;
    ref_layernorm(fd.out, NULL, NULL, fd.x, fd.w, fd.b, fd.B * fd.T, fd.C);
    return weighted(fd.out, n);
}

static void test_fd_layernorm(void)
{
    arena_reset();
    rng_state = 1313;
    int B = 2, T = 3, C = 5;
    size_t n = (size_t)B * T * C;
    float *x = frand(n, 1), *w = frand((size_t)C, 1), *b = frand((size_t)C, 1);
    float *out = tf(n), *mean = tf((size_t)B * T), *rstd = tf((size_t)B * T);
    float *dout = frand(n, 1), *dx = tf(n), *dw = tf((size_t)C), *db = tf((size_t)C);
    kn_layernorm_forward(ctx, out, NULL, mean, rstd, x, w, b, B, T, C);
    kn_layernorm_backward(ctx, dx, NULL, dw, db, dout, NULL, x, w, mean, rstd, B, T, C);
    fd.B = B, fd.T = T, fd.C = C;
    fd.x = to_d(x, n), fd.w = to_d(w, (size_t)C), fd.b = to_d(b, (size_t)C);
    fd.wsum = to_d(dout, n), fd.out = td(n);
    CHECK(fd_check("fd layernorm dinp", loss_layernorm, fd.x, n, dx, 1e-5));
    CHECK(fd_check("fd layernorm dweight", loss_layernorm, fd.w, (size_t)C, dw, 1e-5));
    CHECK(fd_check("fd layernorm dbias", loss_layernorm, fd.b, (size_t)C, db, 1e-5));
}

static double loss_matmul(void)
{
    ref_matmul(fd.out, fd.x, fd.W, fd.b, fd.B, fd.C, fd.OC);
    return weighted(fd.out, (size_t)fd.B * fd.OC);
}

static void test_fd_matmul(void)
{
    arena_reset();
    rng_state = 1414;
    int BT = 3, C = 5, OC = 7;
    float *x = frand((size_t)BT * C, 1), *W = frand((size_t)OC * C, 1), *bias = frand((size_t)OC, 1);
    float *dout = frand((size_t)BT * OC, 1);
    float *dx = tf((size_t)BT * C), *dW = tf((size_t)OC * C), *db = tf((size_t)OC);
    kn_matmul_backward(ctx, dx, dW, db, dout, NULL, x, NULL, W, BT, C, OC);
    fd.B = BT, fd.C = C, fd.OC = OC;
    fd.x = to_d(x, (size_t)BT * C), fd.W = to_d(W, (size_t)OC * C), fd.b = to_d(bias, (size_t)OC);
    fd.wsum = to_d(dout, (size_t)BT * OC), fd.out = td((size_t)BT * OC);
    CHECK(fd_check("fd matmul dinp", loss_matmul, fd.x, (size_t)BT * C, dx, 1e-5));
    CHECK(fd_check("fd matmul dweight", loss_matmul, fd.W, (size_t)OC * C, dW, 1e-5));
    CHECK(fd_check("fd matmul dbias", loss_matmul, fd.b, (size_t)OC, db, 1e-5));
}

static double loss_attention(void)
{
    ref_attention(fd.out, NULL, fd.x, fd.B, fd.T, fd.C, fd.NH);
    return weighted(fd.out, (size_t)fd.B * fd.T * fd.C);
}

static void test_fd_attention(void)
{
    arena_reset();
    rng_state = 1515;
    int shapes[][4] = {{1, 1, 4, 1}, {2, 5, 8, 2}, {1, 4, 6, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
        size_t nqkv = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
        float *qkv = frand(nqkv, 1.5), *out = tf(no), *att = tf(na);
        float *dout = frand(no, 1), *dqkv = tf(nqkv);
        kn_attention_forward(ctx, out, NULL, att, qkv, NULL, B, T, C, NH);
        kn_attention_backward(ctx, dqkv, NULL, dout, NULL, qkv, NULL, att, out, NULL, B, T, C, NH);
        fd.B = B, fd.T = T, fd.C = C, fd.NH = NH;
        fd.x = to_d(qkv, nqkv), fd.wsum = to_d(dout, no), fd.out = td(no);
        CHECK(fd_check("fd attention dqkv", loss_attention, fd.x, nqkv, dqkv, 1e-5));
    }
}

static double loss_gelu(void)
{
    size_t n = (size_t)fd.C;
    for (size_t i = 0; i < n; i++) fd.out[i] = gelu_d(fd.x[i]);
    return weighted(fd.out, n);
}

static void test_fd_gelu(void)
{
    arena_reset();
    rng_state = 1616;
    int n = 64;
    float *x = frand((size_t)n, 4), *dout = frand((size_t)n, 1), *dx = tf((size_t)n);
    kn_gelu_backward(ctx, dx, x, dout, (size_t)n);
    fd.C = n, fd.x = to_d(x, (size_t)n), fd.wsum = to_d(dout, (size_t)n), fd.out = td((size_t)n);
    CHECK(fd_check("fd gelu dinp", loss_gelu, fd.x, (size_t)n, dx, 1e-5));
}

static double loss_crossentropy(void)
{
    ref_softmax_ce(fd.losses, fd.probs, fd.x, fd.targets, fd.B, fd.V, fd.Vp);
    return weighted(fd.losses, (size_t)fd.B);
}

static void test_fd_crossentropy(void)
{
    arena_reset();
    rng_state = 1717;
    int BT = 4, V = 6, Vp = 8;
    size_t n = (size_t)BT * Vp;
    float *logits = frand(n, 2), *probs = tf(n), *losses = tf((size_t)BT), *dl = tf(n);
    int32_t *tg = ti((size_t)BT);
    tg[0] = 2, tg[1] = -1, tg[2] = 0, tg[3] = 5;
    float scale = 0.25f;
    kn_softmax_crossentropy_forward(ctx, losses, probs, logits, tg, BT, V, Vp);
    kn_crossentropy_softmax_backward(ctx, dl, probs, tg, scale, BT, V, Vp);
    fd.B = BT, fd.V = V, fd.Vp = Vp, fd.targets = tg;
    fd.x = to_d(logits, n), fd.probs = td(n), fd.losses = td((size_t)BT);
    fd.wsum = td((size_t)BT);
    for (int r = 0; r < BT; r++) fd.wsum[r] = scale;
    CHECK(fd_check("fd crossentropy dlogits", loss_crossentropy, fd.x, n, dl, 1e-5));
}

static double loss_encoder(void)
{
    size_t n = (size_t)fd.B * fd.T * fd.C;
    ref_encoder(fd.out, fd.targets, fd.W, fd.b, fd.B, fd.T, fd.C);
    return weighted(fd.out, n);
}

static void test_fd_encoder(void)
{
    arena_reset();
    rng_state = 1818;
    int B = 2, T = 3, C = 4, V = 5;
    size_t n = (size_t)B * T * C;
    int32_t *inp = ti((size_t)B * T);
    int32_t toks[] = {1, 3, 1, 4, 1, 0};
    memcpy(inp, toks, sizeof toks);
    float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)T * C, 1), *dout = frand(n, 1);
    float *dwte = tf((size_t)V * C), *dwpe = tf((size_t)T * C);
    kn_encoder_backward(ctx, dwte, dwpe, dout, inp, B, T, C, V);
    fd.B = B, fd.T = T, fd.C = C, fd.targets = inp;
    fd.W = to_d(wte, (size_t)V * C), fd.b = to_d(wpe, (size_t)T * C);
    fd.wsum = to_d(dout, n), fd.out = td(n);
    CHECK(fd_check("fd encoder dwte", loss_encoder, fd.W, (size_t)V * C, dwte, 1e-5));
    CHECK(fd_check("fd encoder dwpe", loss_encoder, fd.b, (size_t)T * C, dwpe, 1e-5));
}

/* ---- thread counts ---------------------------------------------------------------- */

/* The same inputs on 1, 2 and 3 threads: the elementwise, row, channel and
 * chunked kernels and attention give bit-identical results; matmul agrees to
 * rounding (sgemm's blocking differs per slice). */
static void test_threads_agree(void)
{
    arena_reset();
    rng_state = 1919;
    char err[64];
    kn_ctx *c[3] = {kn_create("cpu", 1, err, sizeof err), ctx, kn_create("cpu", 3, err, sizeof err)};
    if (!c[0] || !c[2]) {
        kn_destroy(c[0]);
        kn_destroy(c[2]);
        CHECK(!"kn_create");
    }
    enum { B = 2, T = 70, C = 96, NH = 4, OC = 200, V = 300, Vp = 320 };
    const size_t BT = (size_t)B * T, n = BT * C;
    float *x = frand(n, 1), *w = frand(C, 1), *bb = frand(C, 1), *W = frand((size_t)OC * C, 1);
    float *qkv = frand(3 * n, 2), *dout = frand(n, 1), *mmbias = frand(OC, 1);
    float *logits = frand(BT * Vp, 3), *p0 = frand(n, 1), *g0 = frand(n, 1);
    int32_t *inp = ti(BT), *tg = ti(BT);
    for (size_t i = 0; i < BT; i++) inp[i] = (int32_t)rng_range(0, V - 1), tg[i] = inp[i];
    tg[5] = -1;
    float *r[3][16];
    double sums[3][2];
    for (int k = 0; k < 3; k++) {
        kn_ctx *K = c[k];
        float **o = r[k];
        for (int j = 0; j < 16; j++) o[j] = NULL;
        o[0] = tf(n), o[1] = tf(BT), o[2] = tf(BT);
        kn_layernorm_forward(K, o[0], NULL, o[1], o[2], x, w, bb, B, T, C);
        o[3] = fcopy(g0, n), o[4] = tf(C), o[5] = tf(C);
        kn_layernorm_backward(K, o[3], NULL, o[4], o[5], dout, NULL, x, w, o[1], o[2], B, T, C);
        o[6] = tf(n), o[7] = tf((size_t)B * NH * T * T);
        kn_attention_forward(K, o[6], NULL, o[7], qkv, NULL, B, T, C, NH);
        o[8] = tf(3 * n);
        kn_attention_backward(K, o[8], NULL, dout, NULL, qkv, NULL, o[7], o[6], NULL, B, T, C, NH);
        o[9] = tf(n), o[10] = fcopy(g0, n);
        kn_gelu_forward(K, o[9], x, n);
        kn_gelu_backward(K, o[10], x, dout, n);
        o[11] = tf(BT), o[12] = tf(BT * Vp);
        kn_softmax_crossentropy_forward(K, o[11], o[12], logits, tg, (int)BT, V, Vp);
        o[13] = fcopy(p0, n);
        float *m = tf(n), *v = tf(n);
        for (int t = 1; t <= 2; t++)
            kn_adamw_update(K, o[13], g0, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f, t);
        o[14] = tf((size_t)V * C);
        kn_encoder_backward(K, o[14], NULL, dout, inp, B, T, C, V);
        o[15] = tf(BT * OC);
        kn_matmul_forward(K, o[15], NULL, x, NULL, W, mmbias, (int)BT, C, OC);
        sums[k][0] = kn_sum_squares(K, x, n);
        sums[k][1] = kn_sum(K, logits, BT * Vp);
    }
    size_t len[16] = {n, BT, BT, n, C, C, n, (size_t)B * NH * T * T, 3 * n, n, n, BT, BT * Vp, n,
                      (size_t)V * C, BT * OC};
    int same = 1, mm_close = 1, sums_same = 1;
    for (int k = 0; k < 3; k += 2) {
        for (int j = 0; j < 15; j++)
            if (memcmp(r[k][j], r[1][j], len[j] * sizeof(float)) != 0) {
                printf("    result %d differs between %d and 2 threads\n", j, kn_threads(c[k]));
                same = 0;
            }
        mm_close &= near("matmul across thread counts", r[k][15], to_d(r[1][15], len[15]),
                         len[15], 1e-6);
        sums_same &= sums[k][0] == sums[1][0] && sums[k][1] == sums[1][1];
    }
    kn_destroy(c[0]);
    kn_destroy(c[2]);
    CHECK(same);
    CHECK(mm_close);
    CHECK(sums_same);
}

/* ---- kernel timing (kn_profile_*) ------------------------------------------ */

static const kn_profile_entry *prof_find(const kn_profile_entry *e, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

/* Off: nothing is recorded. On: each kernel called is listed once with its
 * calls and a non-negative time, longest first; reset and a short out[] work. */
static void test_profile(void)
{
    char err[128];
    kn_ctx *k = kn_create("cpu", 1, err, sizeof err);
    CHECK(k != NULL);
    enum { N = 2 * 8 * 16 };
    float *a = kn_alloc(k, N * 4), *b = kn_alloc(k, N * 4), *w = kn_alloc(k, 16 * 16 * 4),
          *out = kn_alloc(k, N * 4);
    CHECK(a && b && w && out);
    for (int i = 0; i < N; i++) a[i] = b[i] = 1.0f;
    kn_profile_entry e[32], top[2];
    kn_mem_stats ms;
    int ok = kn_memory_stats(k, &ms) == -1; /* the CPU does not track its memory */

    kn_residual_forward(k, out, a, b, N);
    ok &= kn_profile_report(k, e, 32) == 0;
    ok &= kn_profile_enable(k, 1) == 0;
    for (int i = 0; i < 3; i++) kn_residual_forward(k, out, a, b, N);
    kn_gelu_forward(k, out, a, N);
    kn_gelu_forward(k, out, a, N);
    kn_matmul_forward(k, out, NULL, a, NULL, w, NULL, 16, 16, 16);
    ok &= kn_sum(k, b, N) == (double)N; /* the timed call still returns its value */
    kn_zero(k, out, N * 4);
    int n = kn_profile_report(k, e, 32);
    ok &= n == 5;
    const char *names[] = {"residual_forward", "gelu_forward", "matmul_forward", "sum", "zero"};
    const long long calls[] = {3, 2, 1, 1, 1};
    for (int i = 0; i < 5 && ok; i++) {
        const kn_profile_entry *p = prof_find(e, n, names[i]);
        ok &= p && p->calls == calls[i] && p->ms >= 0.0;
    }
    for (int i = 1; i < n && ok; i++) ok &= e[i - 1].ms >= e[i].ms;
    ok &= kn_profile_report(k, top, 2) == 5 && !strcmp(top[0].name, e[0].name) &&
          !strcmp(top[1].name, e[1].name);

    ok &= kn_profile_enable(k, 0) == 0; /* off again: totals stay, nothing added */
    kn_gelu_forward(k, out, a, N);
    ok &= kn_profile_report(k, e, 32) == 5 && prof_find(e, 5, "gelu_forward")->calls == 2;
    kn_profile_reset(k);
    ok &= kn_profile_report(k, e, 32) == 0;
    kn_free(k, a);
    kn_free(k, b);
    kn_free(k, w);
    kn_free(k, out);
    kn_destroy(k);
    CHECK(ok);
}

/* kn_share: a page range of one block mapped over another's; writes seen through both;
 * either freed first leaves the other whole; misaligned, out-of-block and heap blocks
 * refused. */
static void test_share(void)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float), n = 64 * pg;
    for (int free_src_first = 0; free_src_first < 2; free_src_first++) {
        float *a = kn_alloc(ctx, n * sizeof(float)), *b = kn_alloc(ctx, n * sizeof(float));
        CHECK(a && b);
        for (size_t i = 0; i < n; i++) a[i] = (float)i, b[i] = -1.0f;
        CHECK_EQ_INT(kn_share(ctx, b, 2 * KN_SHARE_ALIGN, a, KN_SHARE_ALIGN, 4 * KN_SHARE_ALIGN), 0);
        CHECK(b[2 * pg] == (float)pg && b[6 * pg - 1] == (float)(5 * pg - 1));
        CHECK(b[2 * pg - 1] == -1.0f && b[6 * pg] == -1.0f); /* only the range */
        b[3 * pg] = 42.0f;
        CHECK(a[2 * pg] == 42.0f);
        CHECK(kn_share(ctx, b, 100, a, 0, KN_SHARE_ALIGN) != 0);       /* misaligned */
        CHECK(kn_share(ctx, b, 0, a, 0, 2 * n * sizeof(float)) != 0);  /* beyond the block */
        if (free_src_first) {
            kn_free(ctx, a);
            CHECK(b[3 * pg] == 42.0f && b[6 * pg - 1] == (float)(5 * pg - 1) && b[0] == -1.0f);
            kn_free(ctx, b);
        } else {
            kn_free(ctx, b);
            CHECK(a[2 * pg] == 42.0f && a[5 * pg - 1] == (float)(5 * pg - 1));
            kn_free(ctx, a);
        }
    }
    /* a range shared again: the memory behind it, not the middle block's own */
    float *a = kn_alloc(ctx, n * sizeof(float)), *b = kn_alloc(ctx, n * sizeof(float));
    float *c = kn_alloc(ctx, n * sizeof(float));
    CHECK(a && b && c);
    for (size_t i = 0; i < n; i++) a[i] = (float)i;
    CHECK_EQ_INT(kn_share(ctx, b, 0, a, KN_SHARE_ALIGN, 2 * KN_SHARE_ALIGN), 0);
    CHECK_EQ_INT(kn_share(ctx, c, KN_SHARE_ALIGN, b, KN_SHARE_ALIGN, KN_SHARE_ALIGN), 0);
    CHECK(kn_share(ctx, c, 0, b, 0, 3 * KN_SHARE_ALIGN) != 0); /* half shared, half own */
    kn_free(ctx, a);
    kn_free(ctx, b);
    CHECK(c[pg] == (float)(2 * pg) && c[2 * pg - 1] == (float)(3 * pg - 1) && c[0] == 0.0f);
    kn_free(ctx, c);
    float *small = kn_alloc(ctx, 256), *big = kn_alloc(ctx, n * sizeof(float));
    CHECK(small && big && kn_share(ctx, big, 0, small, 0, KN_SHARE_ALIGN) != 0); /* heap: copy */
    kn_free(ctx, small);
    kn_free(ctx, big);
}

/* kn_populate: a block's pages made present keep what they hold, zero or written, shared
 * ranges included (the same memory seen through both blocks), unaligned ranges too. */
static void test_populate(void)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float), n = 64 * pg;
    float *a = kn_alloc(ctx, n * sizeof(float)), *b = kn_alloc(ctx, n * sizeof(float));
    CHECK(a && b);
    for (size_t i = 0; i < 8 * pg; i++) a[i] = (float)i;
    CHECK_EQ_INT(kn_share(ctx, b, 0, a, 0, 4 * KN_SHARE_ALIGN), 0);
    CHECK_EQ_INT(kn_populate(ctx, b, n * sizeof(float)), 0);
    CHECK_EQ_INT(kn_populate(ctx, a + 3, 5 * pg * sizeof(float) + 7), 0);
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        same &= a[i] == (i < 8 * pg ? (float)i : 0.0f);
        same &= b[i] == (i < 4 * pg ? (float)i : 0.0f);
    }
    CHECK(same);
    b[pg] = 7.0f; /* still one memory */
    CHECK(a[pg] == 7.0f);
    kn_free(ctx, a);
    kn_free(ctx, b);
}

static long thread_faults(void)
{
    struct rusage u;
    return getrusage(RUSAGE_THREAD, &u) ? 0 : u.ru_minflt;
}

/* kn_populate over a block whose pages are present in alternate runs (written; a shared
 * range): it keeps them and makes the others present, so that writing every page after it
 * faults none in (the sanitizers' shadow memory may: at most an eighth of the pages). */
static void test_populate_absent_runs(void)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float), pages = 512, n = pages * pg;
    float *a = kn_alloc(ctx, n * sizeof(float)), *src = kn_alloc(ctx, 32 * KN_SHARE_ALIGN);
    CHECK(a && src);
    for (size_t p = 0; p < pages; p += 16)
        for (size_t i = p * pg; i < (p + 5) * pg; i++) a[i] = 1.0f;
    src[0] = 2.0f;
    CHECK_EQ_INT(kn_share(ctx, a, 100 * KN_SHARE_ALIGN, src, 0, 8 * KN_SHARE_ALIGN), 0);
    CHECK_EQ_INT(kn_populate(ctx, a, n * sizeof(float)), 0);
    const long f0 = thread_faults();
    int kept = 1;
    for (size_t p = 0; p < pages; p++) {
        const float want = p == 100 ? 2.0f : p % 16 < 5 && (p < 100 || p >= 108) ? 1.0f : 0.0f;
        kept &= a[p * pg] == want;
        a[p * pg + 1] = 3.0f;
    }
    const long faults = thread_faults() - f0;
    CHECK(kept);
    CHECK(faults <= (long)pages / 8);
    kn_free(ctx, a);
    kn_free(ctx, src);
}

/* Bytes the process's memory files of the CPU backend hold (each file once, however many
 * fds it has). */
static long long memfd_held(void)
{
    struct stat seen[256];
    int nseen = 0;
    long long held = 0;
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[300], target[64] = "";
        struct stat st;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        if (readlink(path, target, sizeof target - 1) < 0 ||
            strncmp(target, "/memfd:pliant", 13) || stat(path, &st))
            continue;
        int dup = 0;
        for (int i = 0; i < nseen; i++)
            dup |= seen[i].st_dev == st.st_dev && seen[i].st_ino == st.st_ino;
        if (dup || nseen == 256) continue;
        seen[nseen++] = st;
        held += (long long)st.st_blocks * 512;
    }
    if (d) closedir(d);
    return held;
}

#define PAGES(n) ((long long)(n) * KN_SHARE_ALIGN)
#define SLACK 4 /* pages: a header page a block, and the measure's own rounding */

/* A block of 64 pages, each float its index plus `from`. */
static float *filled(float from)
{
    const size_t n = 64 * KN_SHARE_ALIGN / sizeof(float);
    float *p = kn_alloc(ctx, n * sizeof(float));
    for (size_t i = 0; p && i < n; i++) p[i] = from + (float)i;
    return p;
}

/* Whether the first `pages` pages at p hold what filled(from) wrote from its page `at` on. */
static int holds(const float *p, size_t pages, size_t at, float from)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float);
    int same = 1;
    for (size_t i = 0; i < pages * pg; i++) same &= p[i] == from + (float)(at * pg + i);
    return same;
}

#define SHARE(dst, dst_pg, src, src_pg, pages)                                                 \
    kn_share(ctx, dst, (dst_pg) * KN_SHARE_ALIGN, src, (src_pg) * KN_SHARE_ALIGN,             \
             (pages) * KN_SHARE_ALIGN)

/* kn_free of a source shared from: all of it released but the shared range, which the
 * destination still reads. */
static void test_release_source_first(void)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float);
    const long long base = memfd_held();
    float *a = filled(0.0f), *b = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    CHECK(a && b);
    for (size_t i = 0; i < 4 * pg; i++) b[i] = -1.0f;
    CHECK_EQ_INT(SHARE(b, 8, a, 10, 2), 0);
    CHECK(memfd_held() - base >= PAGES(64 + 4));
    kn_free(ctx, a);
    const long long held = memfd_held() - base; /* b's 4 pages written, the range's 2 */
    CHECK(held >= PAGES(4 + 2) && held <= PAGES(4 + 2 + SLACK));
    CHECK(holds(b + 8 * pg, 2, 10, 0.0f) && b[0] == -1.0f && b[10 * pg] == 0.0f);
    kn_free(ctx, b);
    CHECK(memfd_held() == base);
}

/* kn_free of a destination while its source lives: nothing of the source released. */
static void test_release_destination_first(void)
{
    float *a = filled(1.0f);
    const long long with_a = memfd_held();
    float *b = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    CHECK(a && b && SHARE(b, 0, a, 10, 2) == 0);
    kn_free(ctx, b);
    CHECK(memfd_held() == with_a && holds(a, 64, 0, 1.0f));
    kn_free(ctx, a);
}

/* A range shared on (a to b to c): it outlives a and b, the rest of a does not. */
static void test_release_chain(void)
{
    const size_t pg = KN_SHARE_ALIGN / sizeof(float);
    const long long base = memfd_held();
    float *a = filled(2.0f), *b = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    float *c = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    CHECK(a && b && c);
    for (size_t i = 0; i < 2 * pg; i++) c[i] = -2.0f;
    CHECK_EQ_INT(SHARE(b, 0, a, 10, 2), 0);
    CHECK_EQ_INT(SHARE(c, 4, b, 0, 2), 0);
    kn_free(ctx, a);
    kn_free(ctx, b);
    const long long held = memfd_held() - base; /* c's 2 pages written, the range's 2 */
    CHECK(held >= PAGES(2 + 2) && held <= PAGES(2 + 2 + SLACK));
    CHECK(holds(c + 4 * pg, 2, 10, 2.0f) && c[0] == -2.0f);
    kn_free(ctx, c);
}

/* Two ranges of a in b, one of them shared on into c: once a and b are freed, the range c
 * maps stays and the other is released. */
static void test_release_two_ranges(void)
{
    const long long base = memfd_held();
    float *a = filled(3.0f), *b = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    float *c = kn_alloc(ctx, 64 * KN_SHARE_ALIGN);
    CHECK(a && b && c);
    CHECK_EQ_INT(SHARE(b, 0, a, 10, 2), 0);
    CHECK_EQ_INT(SHARE(b, 4, a, 20, 4), 0);
    CHECK_EQ_INT(SHARE(c, 0, b, 0, 2), 0);
    kn_free(ctx, a);
    const long long both = memfd_held();
    kn_free(ctx, b);
    CHECK(both - memfd_held() >= PAGES(4) && memfd_held() - base <= PAGES(2 + SLACK));
    CHECK(holds(c, 2, 10, 3.0f));
    kn_free(ctx, c);
    CHECK(memfd_held() == base);
}

TEST_MAIN_BEGIN
    char err[128];
    ctx = kn_create("cpu", 2, err, sizeof err);
    if (!ctx) {
        printf("FAIL kn_create: %s\n", err);
        return 1;
    }
    RUN(test_context);
    RUN(test_encoder);
    RUN(test_encoder_out_of_vocab);
    RUN(test_layernorm);
    RUN(test_matmul_forward);
    RUN(test_matmul_backward);
    RUN(test_attention_forward);
    RUN(test_attention_backward);
    RUN(test_attention_causal);
    RUN(test_gelu);
    RUN(test_residual_accumulate);
    RUN(test_crossentropy);
    RUN(test_crossentropy_stats);
    RUN(test_nan_propagates);
    RUN(test_expf_tanhf);
    RUN(test_adamw);
    RUN(test_adamw_spans);
    RUN(test_matmul_backward_set);
    RUN(test_reductions);
    RUN(test_fd_layernorm);
    RUN(test_fd_matmul);
    RUN(test_fd_attention);
    RUN(test_fd_gelu);
    RUN(test_fd_crossentropy);
    RUN(test_fd_encoder);
    RUN(test_threads_agree);
    RUN(test_profile);
    RUN(test_share);
    RUN(test_populate);
    RUN(test_populate_absent_runs);
    RUN(test_release_source_first);
    RUN(test_release_destination_first);
    RUN(test_release_chain);
    RUN(test_release_two_ranges);
    RUN(test_lowp_mirror);
    arena_reset();
    kn_destroy(ctx);
TEST_MAIN_END
