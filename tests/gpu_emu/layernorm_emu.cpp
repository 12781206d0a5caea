/* CPU emulation test of the LayerNorm kernels (kernels/cuda/layernorm_kernels.cuh).
 *
 * What it checks: forward (out, mean, rstd; and again with out_lp: the bf16
 * copy exactly out rounded to nearest even, mean and rstd as before, and out
 * itself left unwritten) and backward (dinp accumulated onto what was
 * there and its bf16 copy, exactly the accumulated dinp rounded, dweight and
 * dbias through the per-block partial sums, added in order as
 * kn_cuda_sum_partials does) against a double-precision reference, on the
 * register path for C = 768, 1024, 64 (half the lanes idle) and 132 (one
 * float4 past a multiple of 128), and on the scalar path (C = 37, and C = 768
 * with misaligned pointers); row counts not a multiple of the rows per block.
 * The backward runs again with dout in bf16 (the kernels' __nv_bfloat16
 * instantiation, the bf16 mode's dout_lp) on every shape, both paths, against
 * the reference of the bf16 values.
 * Nothing is written past the end of any buffer, and every partial-sum entry
 * is written (the buffers start as NaN).
 *
 * The kernels run as layernorm.cu launches them, each block's threads as
 * coroutines (tests/gpu_emu/gpu_emu.h) so that the warp shuffles and barriers
 * exchange values as on the GPU.
 *
 * Output: one "ok NAME" / "FAIL NAME" line per shape and direction
 * (tests/unit/check.h's protocol, counted by tests/run_tests.py). */
#include "gpu_emu.h"

#include "cuda/layernorm_kernels.cuh"

static const int PAD = 16; /* floats after each buffer, which must stay untouched */
static const float GUARD = -12345.0f;

/* n values (uniform in [lo, hi)) and PAD guard floats after them; `mis` floats
 * before them (a misaligned start). */
struct Buf {
    std::vector<float> v;
    int mis;
    Buf(size_t n, int mis_) : v(n + PAD + mis_, GUARD), mis(mis_) {}
    float *p() { return v.data() + mis; }
    size_t n() const { return v.size() - PAD - mis; }
    bool guard_ok() const
    {
        for (size_t i = n() + mis; i < v.size(); i++)
            if (v[i] != GUARD) return false;
        return true;
    }
};

static uint64_t seed = 88172645463325252ull;
static double urand()
{
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    return (seed >> 11) * (1.0 / 9007199254740992.0);
}
static Buf rand_buf(size_t n, double lo, double hi, int mis)
{
    Buf b(n, mis);
    for (size_t i = 0; i < n; i++) b.p()[i] = (float)(lo + (hi - lo) * urand());
    return b;
}

/* Largest |got − ref| relative to the largest |ref|; prints and returns whether within tol. */
static bool within(const char *what, const float *got, const std::vector<double> &ref, double tol)
{
    double m = 0, worst = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        m = std::max(m, fabs(ref[i]));
        const double e = fabs(got[i] - ref[i]);
        worst = e == e ? std::max(worst, e) : INFINITY; /* NaN: fails */
    }
    const bool ok = worst <= tol * (m ? m : 1);
    printf("  %-8s max err %.2e of max %.3g%s\n", what, worst / (m ? m : 1), m,
           ok ? "" : "   FAIL");
    return ok;
}

/* n bf16 (NaN before the kernel ran) and PAD more after them: how many are not vals
 * rounded to nearest even, or were written past the end. */
static long bf16_copy_bad(const std::vector<__nv_bfloat16> &lp, const float *vals, long n)
{
    long bad = 0;
    for (long i = 0; i < n; i++) bad += lp[i].v != f2bf(vals[i]);
    for (long i = n; i < n + PAD; i++) bad += lp[i].v != 0x7fc0;
    return bad;
}

static bool report(const char *dir, long BT, int C, int mis, bool ok)
{
    printf("%s layernorm_emu/%s/%ld.%d%s\n", ok ? "ok" : "FAIL", dir, BT, C,
           mis ? "/misaligned" : "");
    fflush(stdout);
    return ok;
}

/* Inputs of one shape: x with a non-zero mean, the parameters, and mean/rstd
 * of x in double. */
struct Case {
    long BT;
    int C, mis;
    Buf x, w, b;
    std::vector<double> m, r;
    Case(long BT_, int C_, int mis_)
        : BT(BT_), C(C_), mis(mis_), x(rand_buf(BT_ * C_, -1.5, 2.5, mis_)),
          w(rand_buf(C_, -1, 1, mis_)), b(rand_buf(C_, -1, 1, mis_)), m(BT_), r(BT_)
    {
        for (long t = 0; t < BT; t++) {
            double s = 0, v = 0;
            for (int c = 0; c < C; c++) s += x.p()[t * C + c];
            m[t] = s / C;
            for (int c = 0; c < C; c++) v += (x.p()[t * C + c] - m[t]) * (x.p()[t * C + c] - m[t]);
            r[t] = 1 / sqrt(v / C + LN_EPS);
        }
    }
    double norm(long t, int c) { return (x.p()[t * C + c] - m[t]) * r[t]; }
};

static bool forward(Case &k)
{
    const long BT = k.BT, n = BT * k.C;
    Buf out(n, k.mis), mean(BT, 0), rstd(BT, 0);
    std::vector<__nv_bfloat16> lp(n + PAD, {0x7fc0}); /* NaN; malloc: 16-byte aligned */
    __nv_bfloat16 *lpp = lp.data();
    const int v = ln_vec(k.C, ln_aligned16(out.p()) && ln_aligned16(lpp) &&
                                  ln_aligned16(k.x.p()) && ln_aligned16(k.w.p()) &&
                                  ln_aligned16(k.b.p()));
    const ln_forward_fn kernel = v ? ln_forward_vec[v - 1] : layernorm_forward_kernel;
    const unsigned blocks = (unsigned)((BT + LN_WARPS - 1) / LN_WARPS);
    emu_run_grid(blocks, 1, LN_THREADS, [&] {
        kernel(out.p(), nullptr, mean.p(), rstd.p(), k.x.p(), k.w.p(), k.b.p(), BT, k.C);
    });
    std::vector<double> ref(n);
    for (long t = 0; t < BT; t++)
        for (int c = 0; c < k.C; c++) ref[t * k.C + c] = k.norm(t, c) * k.w.p()[c] + k.b.p()[c];
    printf("BT %ld C %d (%s)\n", BT, k.C, v ? "register path" : "scalar path");
    bool ok = within("out", out.p(), ref, 1e-5);
    ok &= within("mean", mean.p(), k.m, 1e-5);
    ok &= within("rstd", rstd.p(), k.r, 1e-5);
    ok &= out.guard_ok() && mean.guard_ok() && rstd.guard_ok();
    /* with out_lp: the copy alone, out2 left as it was (all guard values) */
    Buf out2(n, k.mis), mean2(BT, 0), rstd2(BT, 0);
    emu_run_grid(blocks, 1, LN_THREADS, [&] {
        kernel(out2.p(), lpp, mean2.p(), rstd2.p(), k.x.p(), k.w.p(), k.b.p(), BT, k.C);
    });
    const long bad = bf16_copy_bad(lp, out.p(), n);
    printf("  bf16     %ld values not out rounded to nearest even (or written past the end)\n",
           bad);
    long written = 0;
    for (long i = 0; i < n; i++) written += out2.p()[i] != GUARD;
    printf("  out      %ld values written with out_lp given\n", written);
    ok &= bad == 0 && written == 0 && out2.guard_ok();
    ok &= within("mean/lp", mean2.p(), k.m, 1e-5) && within("rstd/lp", rstd2.p(), k.r, 1e-5);
    ok &= mean2.guard_ok() && rstd2.guard_ok();
    return report("forward", BT, k.C, k.mis, ok);
}

/* The backward as kn_cuda_layernorm_backward runs it, dweight and dbias added
 * onto their contents as kn_cuda_sum_partials does; dout of type D. */
template <typename D>
static void run_backward(Case &k, float *dinp, __nv_bfloat16 *dinp_lp, float *dw, float *db,
                         const D *dout, const float *mean, const float *rstd)
{
    const long BT = k.BT;
    const int C = k.C;
    const bool dout_ok = sizeof(D) == 2 ? ln_aligned8(dout) : ln_aligned16(dout);
    const int v = ln_vec(C, ln_aligned16(dinp) && ln_aligned16(dinp_lp) && dout_ok &&
                                ln_aligned16(k.x.p()) && ln_aligned16(k.w.p()));
    const long rows = v ? LN_BWD_ROWS : LN_ROWS, parts = (BT + rows - 1) / rows;
    std::vector<float> partial(2 * parts * C + PAD, NAN);
    if (v) {
        emu_run_grid((unsigned)parts, 1, LN_THREADS, [&] {
            ln_backward_vec<D>[v - 1](dinp, dinp_lp, partial.data(), dout, k.x.p(), k.w.p(),
                                      mean, rstd, BT, C);
        });
    } else {
        emu_run_grid((unsigned)((BT + LN_WARPS - 1) / LN_WARPS), 1, LN_THREADS, [&] {
            layernorm_dinp_kernel(dinp, dinp_lp, dout, k.x.p(), k.w.p(), mean, rstd, BT, C);
        });
        emu_run_grid((unsigned)((C + 31) / 32), (unsigned)parts, LN_THREADS, [&] {
            layernorm_params_kernel(partial.data(), dout, k.x.p(), mean, rstd, BT, C);
        });
    }
    for (long p = 0; p < parts; p++)
        for (int c = 0; c < C; c++) {
            dw[c] += partial[p * C + c];
            db[c] += partial[(parts + p) * C + c];
        }
    printf("BT %ld C %d (%s, %ld partial sums%s)\n", BT, C, v ? "register path" : "scalar path",
           parts, sizeof(D) == 2 ? ", bf16 dout" : "");
}

/* d16: dout given in bf16 (its values rounded first, so the reference is of them). */
static bool backward(Case &k, bool d16)
{
    const long BT = k.BT, n = BT * k.C;
    const int C = k.C;
    Buf dout = rand_buf(n, -1, 1, k.mis), dinp = rand_buf(n, -1, 1, k.mis);
    std::vector<__nv_bfloat16> dout16(d16 ? n : 0); /* malloc: 16-byte aligned */
    for (long i = 0; i < (long)dout16.size(); i++) {
        dout16[i].v = f2bf(dout.p()[i]);
        dout.p()[i] = bf2f(dout16[i].v);
    }
    Buf dw = rand_buf(C, -1, 1, k.mis), db = rand_buf(C, -1, 1, k.mis), mean(BT, 0), rstd(BT, 0);
    std::vector<double> rdx(dinp.p(), dinp.p() + n), rdw(dw.p(), dw.p() + C),
        rdb(db.p(), db.p() + C);
    for (long t = 0; t < BT; t++) {
        mean.p()[t] = (float)k.m[t], rstd.p()[t] = (float)k.r[t];
        const float *g = dout.p() + t * C;
        double a = 0, bs = 0;
        for (int c = 0; c < C; c++) {
            a += k.w.p()[c] * g[c], bs += k.w.p()[c] * g[c] * k.norm(t, c);
            rdw[c] += g[c] * k.norm(t, c), rdb[c] += g[c];
        }
        for (int c = 0; c < C; c++)
            rdx[t * C + c] += (k.w.p()[c] * g[c] - a / C - k.norm(t, c) * bs / C) * k.r[t];
    }
    std::vector<__nv_bfloat16> lp(n + PAD, {0x7fc0}); /* NaN; malloc: 16-byte aligned */
    if (d16)
        run_backward(k, dinp.p(), lp.data(), dw.p(), db.p(), dout16.data(), mean.p(), rstd.p());
    else
        run_backward(k, dinp.p(), lp.data(), dw.p(), db.p(), dout.p(), mean.p(), rstd.p());
    bool ok = within("dinp", dinp.p(), rdx, 2e-5);
    const long bad = bf16_copy_bad(lp, dinp.p(), n);
    printf("  bf16     %ld values not dinp rounded to nearest even (or written past the end)\n",
           bad);
    ok &= bad == 0;
    ok &= within("dweight", dw.p(), rdw, 2e-5);
    ok &= within("dbias", db.p(), rdb, 2e-5);
    ok &= dinp.guard_ok() && dw.guard_ok() && db.guard_ok();
    return report(d16 ? "backward-bf16" : "backward", BT, C, k.mis, ok);
}

int main()
{
    /* {BT, C, misaligned}: register path V = 6, 8, 1, 2; scalar path */
    static const int shapes[][3] = {{150, 768, 0}, {9, 1024, 0}, {130, 64, 0}, {67, 132, 0},
                                    {45, 37, 0},  {33, 768, 1}};
    int fails = 0;
    for (const auto &s : shapes) {
        Case k(s[0], s[1], s[2]);
        fails += !forward(k);
        fails += !backward(k, false);
        fails += !backward(k, true);
    }
    return fails != 0;
}
