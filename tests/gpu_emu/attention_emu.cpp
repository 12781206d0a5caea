/* CPU emulation test of the bf16 attention kernels (kernels/cuda/attention_bf16.cuh).
 *
 * What it checks: the FlashAttention-2 kernels (forward, backward dK/dV,
 * backward dQ) give out, lse and dqkv within 1e-2 (relative to the largest
 * value) of a double-precision reference, on shapes covering head sizes 15..128
 * (D = 16, 32, 64, 128), sequence lengths that are not multiples of the tiles,
 * and misaligned (scalar-load) pointers. Given bf16 copies to write (out_lp,
 * dqkv_lp), the kernels store there the bf16 of the very values they store
 * without them, bit for bit, and leave out and dqkv unwritten. The delta pass
 * given dout's or out's bf16 copy, or both, packs the same dO bits
 * (dout holds bf16 values) and the same delta with dout's copy alone, a delta
 * within 2⁻⁸·Σ|dout·out| of it with out's copy (out rounded to bf16).
 * Both operand layouts: packed (qkv and dout fp32, or their bf16 copies where
 * the direct layout does not apply) and direct (the kernels reading qkv's and
 * dout's bf16 copies in place, with the packed buffers poisoned), which gives
 * the same bits as the packed one.
 *
 * Why an emulation: those kernels map mma.sync / ldmatrix fragments by hand
 * (inline PTX), and an index error there only shows on a GPU, which the
 * default test suite does not have. This program compiles the very same
 * kernel code with g++ (PLIANT_ATTENTION_EMU selects emu_mma and
 * emu_ldmatrix below in place of the inline PTX) and runs each block's threads
 * as coroutines (ucontext, tests/gpu_emu/gpu_emu.h) so that barriers, warp shuffles, ldmatrix
 * and mma exchange values between lanes as the PTX ISA defines them ("Matrix
 * Fragments for mma.m16n8k16", "ldmatrix"). It also catches lanes of a warp
 * in different collectives and deadlocked barriers (it aborts), and reads of
 * shared memory nothing wrote (filled with NaN bf16s before each block).
 *
 * Output: one "ok NAME" / "FAIL NAME" line per shape (tests/unit/check.h's
 * protocol, counted by tests/run_tests.py). With four arguments B T C NH it
 * runs that one shape (with a fifth, any, given the bf16 copies). */
#include "gpu_emu.h"

#define PLIANT_ATTENTION_EMU 1
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

static void emu_ldmatrix(uint32_t r[4], const __nv_bfloat16 *row, bool trans)
{
    slots[cur].p = row;
    deposit_check(trans ? 3 : 2);
    assert(((uintptr_t)row & 15) == 0);
    int w0 = cur / 32 * 32, l = cur % 32;
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat16 *rows[8];
        for (int rr = 0; rr < 8; rr++) rows[rr] = (const __nv_bfloat16 *)slots[w0 + 8 * i + rr].p;
        uint16_t e0, e1;
        if (!trans) {
            e0 = rows[l / 4][2 * (l % 4)].v, e1 = rows[l / 4][2 * (l % 4) + 1].v;
        } else {
            e0 = rows[2 * (l % 4)][l / 4].v, e1 = rows[2 * (l % 4) + 1][l / 4].v;
        }
        r[i] = (uint32_t)e0 | (uint32_t)e1 << 16;
    }
    warp_bar();
}

static long n_mma;
static void emu_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    Slot &s = slots[cur];
    for (int i = 0; i < 4; i++) s.u[i] = a[i], s.f[i] = d[i];
    s.u[4] = b0, s.u[5] = b1;
    deposit_check(4);
    int w0 = cur / 32 * 32, l = cur % 32;
    float A[16][16], B[16][8], Cm[16][8];
    for (int ln = 0; ln < 32; ln++) {
        const Slot &o = slots[w0 + ln];
        int g = ln / 4, t = ln % 4;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
            A[row][col] = bf2f(o.u[i] & 0xffff), A[row][col + 1] = bf2f(o.u[i] >> 16);
        }
        for (int i = 0; i < 2; i++) {
            int k = 2 * t + 8 * i;
            B[k][g] = bf2f(o.u[4 + i] & 0xffff), B[k + 1][g] = bf2f(o.u[4 + i] >> 16);
        }
        Cm[g][2 * t] = o.f[0], Cm[g][2 * t + 1] = o.f[1];
        Cm[g + 8][2 * t] = o.f[2], Cm[g + 8][2 * t + 1] = o.f[3];
    }
    int g = l / 4, t = l % 4;
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        double acc = Cm[row][col];
        for (int k = 0; k < 16; k++) acc += (double)A[row][k] * B[k][col];
        out[i] = (float)acc;
    }
    if (l == 0) n_mma++;
    warp_bar();
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

unsigned char tc_smem[1 << 18] __attribute__((aligned(128)));

#include "cuda/attention_bf16.cuh"

/* kernel<<<(gx, gy), TC_THREADS>>>, shared memory garbage (NaN bf16s) where
 * nothing was stored. */
static void run_grid(unsigned gx, unsigned gy, const std::function<void()> &kernel)
{
    emu_run_grid(gx, gy, TC_THREADS, kernel, [] { memset(tc_smem, 0xff, sizeof tc_smem); });
}

// ---- reference (double) and the test
static double urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return ((*s >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1;
}
static float bfr(float x) { return bf2f(f2bf(x)); }

static double maxabs(const std::vector<double> &v)
{
    double m = 0;
    for (double x : v) m = std::max(m, fabs(x));
    return m;
}

/* Does lp hold the bf16 of each of the n values of f (round to nearest even)? */
static int check_copy(const char *what, const __nv_bfloat16 *lp, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lp[i].v != f2bf(f[i])) {
            printf("  %s [%zu] = %#06x, bf16 of %g (%#06x) expected   FAIL\n", what, i, lp[i].v,
                   f[i], f2bf(f[i]));
            return 1;
        }
    return 0;
}

/* Does f still hold NaN everywhere (nothing stored)? */
static int check_unwritten(const char *what, const std::vector<float> &f)
{
    for (size_t i = 0; i < f.size(); i++)
        if (!isnan(f[i])) {
            printf("  %s [%zu] written (%g) beside its copy   FAIL\n", what, i, f[i]);
            return 1;
        }
    return 0;
}

static int check(const char *what, const float *got, const std::vector<double> &ref, double tol)
{
    double m = maxabs(ref), worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double e = fabs(got[i] - ref[i]);
        if (!(e <= worst)) worst = e, wi = i;
        if (isnan(got[i])) worst = INFINITY, wi = i;
    }
    printf("  %-6s max err %.2e of max %.3g%s\n", what, worst / (m ? m : 1), m,
           worst > tol * (m ? m : 1) ? "   FAIL" : "");
    if (worst > tol * (m ? m : 1)) {
        printf("    at %zu got %g ref %g\n", wi, got[wi], ref[wi]);
        return 1;
    }
    return 0;
}

/* The bf16 copies (the header): the forward with out_lp and each backward path
 * (dQ from the kept dS where the tile width keeps it, and recomputing dS) with
 * dqkv_lp, their copies misaligned by `misalign` elements (scalar stores) where
 * the test is. out, dqkv: the fp32 results of the runs without copies. */
template <typename Fwd, typename Bwd>
static int copies_case(int B, int T, int C, int misalign, const std::vector<float> &out,
                       const std::vector<float> &dqkv, Fwd forward, Bwd backward, bool keeps_ds)
{
    const size_t n = (size_t)B * T * C, n3 = 3 * n;
    std::vector<float> out2(n, NAN), dqkv2(n3, NAN);
    std::vector<__nv_bfloat16> lp_buf(n3 + 1, {0x7fc0}); // poisoned: a missed store shows
    __nv_bfloat16 *lp = lp_buf.data() + misalign;
    int fails = 0;
    forward(out2.data(), lp);
    fails += check_copy("out_lp", lp, out.data(), n);
    fails += check_unwritten("out", out2);
    for (int path = keeps_ds ? 0 : 1; path < 2; path++) { // 0: dS kept, 1: dS recomputed
        std::fill(lp_buf.begin(), lp_buf.end(), __nv_bfloat16{0x7fc0});
        backward(dqkv2.data(), lp, path == 0);
        fails += check_copy(path ? "dqkv_lp-r" : "dqkv_lp", lp, dqkv.data(), n3);
        fails += check_unwritten("dqkv", dqkv2);
    }
    return fails;
}

/* The delta pass given copies (the header): dout's alone, out's alone, both (the
 * kernel's element types: it has no fp32 pointer where it reads a copy). delta,
 * pdo: the results without; pdo NULL (the direct layout): the pass packs no dO
 * here either, and delta alone is compared. */
template <int D>
static int delta_copies(int B, int T, int NH, int hs, const float *dout,
                        const std::vector<float> &out, const std::vector<float> &delta,
                        const __nv_bfloat16 *pdo)
{
    const size_t n = (size_t)B * T * NH * hs, rows = (size_t)B * NH * T;
    const int Tp = tc_padded_rows(T);
    const size_t np = (size_t)B * NH * Tp * D, warps = (size_t)B * NH * Tp;
    std::vector<__nv_bfloat16> dl(n), ol(n);
    for (size_t i = 0; i < n; i++) dl[i].v = f2bf(dout[i]), ol[i].v = f2bf(out[i]);
    int fails = 0;
    for (int which = 0; which < 3; which++) { // 0: dout_lp, 1: out_lp, 2: both
        std::vector<float> d2(rows, NAN);
        std::vector<__nv_bfloat16> p2(np, {0x7fc0});
        __nv_bfloat16 *pp = pdo ? p2.data() : nullptr;
        run_grid((unsigned)((warps * 32 + TC_THREADS - 1) / TC_THREADS), 1, [&] {
            if (which == 0)
                attention_delta_pack_kernel<D>(d2.data(), pp, dl.data(), out.data(), B, T, NH, hs);
            else if (which == 1)
                attention_delta_pack_kernel<D>(d2.data(), pp, dout, ol.data(), B, T, NH, hs);
            else
                attention_delta_pack_kernel<D>(d2.data(), pp, dl.data(), ol.data(), B, T, NH, hs);
        });
        static const char *names[] = {"dout_lp", "out_lp", "dout_lp, out_lp"};
        if (pdo && memcmp(p2.data(), pdo, np * sizeof(__nv_bfloat16))) {
            printf("  packed dO differs with %s   FAIL\n", names[which]);
            fails++;
        }
        for (size_t r = 0; r < rows; r++) {
            const size_t bh = r / T, t = r % T, b = bh / NH, h = bh % NH;
            const float *dp = dout + (b * T + t) * NH * hs + h * hs;
            const float *op = out.data() + (b * T + t) * NH * hs + h * hs;
            double bound = 0;
            for (int c = 0; c < hs; c++) bound += fabs((double)dp[c] * op[c]);
            bound *= which ? 1.0 / 256 : 0.0; // dout holds bf16 values: dout_lp alone, exact
            if (!(fabs((double)d2[r] - delta[r]) <= bound)) {
                printf("  delta [%zu] = %g with %s, %g without (bound %g)   FAIL\n", r, d2[r],
                       names[which], delta[r], bound);
                fails++;
                break;
            }
        }
    }
    return fails;
}

/* p rounded up to 16 bytes, then `misalign` elements on. */
template <typename E>
static E *aligned16(E *p, int misalign)
{
    return (E *)(((uintptr_t)p + 15) & ~(uintptr_t)15) + misalign;
}

/* One shape; lp: qkv's and dout's bf16 copies given (as the engine gives them in
 * bf16 mode), which the kernels read in place where tc_direct allows (T a multiple
 * of TC_ROWS, hs = D, the copies 16-byte aligned: the direct layout), else pack. */
template <int D>
static int run_case(int B, int T, int C, int NH, int misalign, bool lp)
{
    const int hs = C / NH;
    const size_t n = (size_t)B * T * C, n3 = 3 * n;
    uint64_t seed = 1234 + T * 7 + C;
    std::vector<float> qkv_buf(n3 + 4), dout_buf(n + 4), out(n, 7.0f), lse((size_t)B * NH * T, 7.0f);
    float *qkv = qkv_buf.data() + misalign, *dout = dout_buf.data() + misalign;
    for (size_t i = 0; i < n3; i++) qkv[i] = bfr((float)(3 * urand(&seed)));
    for (size_t i = 0; i < n; i++) dout[i] = bfr((float)urand(&seed));
    std::vector<float> dqkv(n3, NAN); // overwritten, every element
    std::vector<double> dqkv_ref(n3, 0.0), out_ref(n), lse_ref(lse.size());

    // reference
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto Q = [&](int t, int c) { return (double)qkv[((size_t)b * T + t) * 3 * C + h * hs + c]; };
            auto K = [&](int t, int c) { return (double)qkv[((size_t)b * T + t) * 3 * C + C + h * hs + c]; };
            auto V = [&](int t, int c) { return (double)qkv[((size_t)b * T + t) * 3 * C + 2 * C + h * hs + c]; };
            auto dO = [&](int t, int c) { return (double)dout[((size_t)b * T + t) * C + h * hs + c]; };
            std::vector<double> P((size_t)T * T, 0.0), dP((size_t)T * T, 0.0);
            for (int i = 0; i < T; i++) {
                double mx = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int c = 0; c < hs; c++) s += Q(i, c) * K(j, c);
                    P[(size_t)i * T + j] = s * scale;
                    mx = std::max(mx, s * scale);
                }
                double sum = 0;
                for (int j = 0; j <= i; j++) sum += exp(P[(size_t)i * T + j] - mx);
                for (int j = 0; j <= i; j++) P[(size_t)i * T + j] = exp(P[(size_t)i * T + j] - mx) / sum;
                lse_ref[((size_t)b * NH + h) * T + i] = mx + log(sum);
                for (int c = 0; c < hs; c++) {
                    double o = 0;
                    for (int j = 0; j <= i; j++) o += P[(size_t)i * T + j] * V(j, c);
                    out_ref[((size_t)b * T + i) * C + h * hs + c] = o;
                }
            }
            for (int i = 0; i < T; i++) {
                double Di = 0;
                for (int j = 0; j <= i; j++) {
                    double d = 0;
                    for (int c = 0; c < hs; c++) d += dO(i, c) * V(j, c);
                    dP[(size_t)i * T + j] = d;
                    Di += P[(size_t)i * T + j] * d;
                }
                for (int j = 0; j <= i; j++) {
                    double p = P[(size_t)i * T + j], ds = p * (dP[(size_t)i * T + j] - Di);
                    for (int c = 0; c < hs; c++) {
                        dqkv_ref[((size_t)b * T + i) * 3 * C + h * hs + c] += ds * K(j, c) * scale;
                        dqkv_ref[((size_t)b * T + j) * 3 * C + C + h * hs + c] += ds * Q(i, c) * scale;
                        dqkv_ref[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + c] += p * dO(i, c);
                    }
                }
            }
        }

    const float sc = (1.0f / sqrtf((float)hs)) * FA_LOG2E, scl = 1.0f / sqrtf((float)hs);
    const int Tp = tc_padded_rows(T), gy = Tp / TC_ROWS;
    // the packed operands, poisoned (NaN bf16s) so that a missing zero shows (and, in
    // the direct layout, any read of them)
    std::vector<__nv_bfloat16> pk((size_t)B * NH * 3 * Tp * D + 8, {0x7fc0}), pdo((size_t)B * NH * Tp * D + 8, {0x7fc0});
    __nv_bfloat16 *pkq = aligned16(pk.data(), 0), *pdq = aligned16(pdo.data(), 0);
    // the bf16 copies (misaligned by `misalign` elements: packed then)
    std::vector<__nv_bfloat16> qkv_lb(lp ? n3 + 16 : 0), dout_lb(lp ? n + 16 : 0);
    __nv_bfloat16 *qkv_lp = lp ? aligned16(qkv_lb.data(), misalign) : nullptr;
    __nv_bfloat16 *dout_lp = lp ? aligned16(dout_lb.data(), misalign) : nullptr;
    for (size_t i = 0; lp && i < n3; i++) qkv_lp[i].v = f2bf(qkv[i]);
    for (size_t i = 0; lp && i < n; i++) dout_lp[i].v = f2bf(dout[i]);
    // as attention.cu's forward_tiles and backward_tiles decide
    tc_operand ops = tc_operand_of<D>(qkv_lp, pkq, T, C, NH, 3);
    tc_operand dops = tc_operand_of<D>(dout_lp, pdq, T, C, NH, 1);
    const bool qdirect = ops.p != pkq, odirect = dops.p != pdq;
    const size_t n8 = (size_t)B * NH * 3 * Tp * D / 8;
    auto pack_qkv = [&](bool from_lp) {
        run_grid((unsigned)((n8 + TC_THREADS - 1) / TC_THREADS), 1, [&] {
            if (from_lp)
                attention_pack_qkv_kernel<D>(pkq, qkv_lp, B, T, NH, hs);
            else
                attention_pack_qkv_kernel<D>(pkq, qkv, B, T, NH, hs);
        });
    };
    if (!qdirect) pack_qkv(lp);
    // as attention.cu's pair_rows: pairs where hs is even and the pointer aligned to two
    auto v2 = [&](const void *p, size_t size) {
        return hs % 2 == 0 && (uintptr_t)p % (2 * size) == 0;
    };
    const int vo = v2(out.data(), 4), vq = v2(dqkv.data(), 4);
    auto forward = [&](float *o, __nv_bfloat16 *o_lp, int vec2) {
        run_grid(B * NH, gy, [&] {
            flash_forward_bf16_kernel<D>(o, o_lp, lse.data(), ops, T, NH, hs, sc, vec2);
        });
    };
    forward(out.data(), nullptr, vo);
    std::vector<float> delta((size_t)B * NH * T, NAN);
    const size_t warps = (size_t)B * NH * Tp;
    auto delta_pack = [&](bool from_lp, __nv_bfloat16 *p) {
        run_grid((unsigned)((warps * 32 + TC_THREADS - 1) / TC_THREADS), 1, [&] {
            if (from_lp)
                attention_delta_pack_kernel<D>(delta.data(), p, dout_lp, out.data(), B, T, NH, hs);
            else
                attention_delta_pack_kernel<D>(delta.data(), p, dout, out.data(), B, T, NH, hs);
        });
    };
    delta_pack(lp, odirect ? nullptr : pdq);
    // as attention.cu launches them: dK/dV storing dS (where tc_keeps_ds and the workspace
    // has room) and dQ from it, or dK/dV alone and dQ recomputing dS
    // (dqkv_lp: dqkv's bf16 copy to store instead, or null; vec2 for the one stored)
    auto backward = [&](float *dqkv_out, __nv_bfloat16 *dqkv_lp, __nv_bfloat16 *ds, int vec2) {
        run_grid(B * NH, gy, [&] {
            flash_backward_dkv_bf16_kernel<D>(dqkv_out, dqkv_lp, ds, ops, dops, lse.data(),
                                              delta.data(), T, NH, hs, scl, sc, vec2);
        });
        run_grid(B * NH, gy, [&] {
            if (ds)
                flash_backward_dq_ds_bf16_kernel<D>(dqkv_out, dqkv_lp, ds, ops, T, NH, hs, scl,
                                                    vec2);
            else
                flash_backward_dq_bf16_kernel<D>(dqkv_out, dqkv_lp, ops, dops, lse.data(),
                                                 delta.data(), T, NH, hs, scl, sc, vec2);
        });
    };
    // dS poisoned: a chunk the dQ kernel reads but nothing wrote shows as NaN
    std::vector<__nv_bfloat16> ds((size_t)B * NH * tc_ds_chunks(T) * TC_CHUNK, {0x7fc0});
    std::vector<float> dqkv_re(n3, NAN);
    backward(dqkv.data(), nullptr, tc_keeps_ds<D>() ? ds.data() : nullptr, vq);
    if (tc_keeps_ds<D>()) backward(dqkv_re.data(), nullptr, nullptr, vq);
    printf("B %d T %d C %d NH %d (hs %d, D %d, vec %d/%d, q k v %s, dO %s)\n", B, T, C, NH, hs,
           D, vo, vq, qdirect ? "direct" : lp ? "packed from bf16" : "packed",
           odirect ? "direct" : lp ? "packed from bf16" : "packed");
    int fails = copies_case(B, T, C, misalign, out, dqkv,
                            [&](float *o, __nv_bfloat16 *o_lp) {
                                forward(o, o_lp, v2(o_lp, 2)); // only o_lp stored
                            },
                            [&](float *d, __nv_bfloat16 *d_lp, bool keep_ds) {
                                backward(d, d_lp, keep_ds ? ds.data() : nullptr, v2(d_lp, 2));
                            },
                            tc_keeps_ds<D>());
    fails += delta_copies<D>(B, T, NH, hs, dout, out, delta, odirect ? nullptr : pdq);
    fails += check("out", out.data(), out_ref, 1e-2);
    fails += check("lse", lse.data(), lse_ref, 1e-2);
    fails += check("dqkv", dqkv.data(), dqkv_ref, 1e-2);
    if (qdirect || odirect) {
        // the direct layout reads the very bf16 values the packed one holds, in the same
        // order: the same bits as with q, k, v and dO packed (from the fp32 tensors)
        const std::vector<float> out_d = out, lse_d = lse;
        std::vector<float> dqkv_p(n3, NAN);
        pack_qkv(false);
        ops = tc_packed<D>(pkq, T, NH, 3), dops = tc_packed<D>(pdq, T, NH, 1);
        forward(out.data(), nullptr, vo);
        delta_pack(false, pdq);
        backward(dqkv_p.data(), nullptr, tc_keeps_ds<D>() ? ds.data() : nullptr, vq);
        if (memcmp(out.data(), out_d.data(), n * sizeof(float)) ||
            memcmp(lse.data(), lse_d.data(), lse.size() * sizeof(float)) ||
            memcmp(dqkv_p.data(), dqkv.data(), n3 * sizeof(float))) {
            printf("  the direct layout differs from the packed one   FAIL\n");
            fails++;
        }
    }
    if (!tc_keeps_ds<D>()) return fails;
    // dS: every chunk of real queries written, the others (queries past T) untouched
    const int nch = Tp / 16;
    for (int bh = 0; bh < B * NH; bh++)
        for (int ki = 0; ki < nch; ki++)
            for (int qi = ki; qi < nch; qi++) {
                const __nv_bfloat16 *c =
                    ds.data() + ds_column(T, bh, ki) + (size_t)(qi - ki) * TC_CHUNK;
                int poisoned = 0;
                for (int e = 0; e < TC_CHUNK; e++) poisoned += c[e].v == 0x7fc0;
                if (poisoned != (16 * qi < T ? 0 : TC_CHUNK)) {
                    printf("  dS chunk (%d, %d) of head %d: %d poisoned   FAIL\n", qi, ki, bh,
                           poisoned);
                    return fails + 1;
                }
            }
    fails += check("dqkv-r", dqkv_re.data(), dqkv_ref, 1e-2); // dS recomputed
    // the same bits on both paths: emu_mma sums exactly, so S and dP come out the same
    // either way round, and dQ sums the same bf16 dS in the same order
    for (size_t i = 0; i < n3; i++)
        if (memcmp(&dqkv[i], &dqkv_re[i], sizeof(float))) {
            printf("  dqkv differs between the paths at %zu: %g vs %g   FAIL\n", i, dqkv[i],
                   dqkv_re[i]);
            return fails + 1;
        }
    return fails;
}

static int run(int B, int T, int C, int NH, int mis, bool lp)
{
    int hs = C / NH;
    int D = hs <= 16 ? 16 : hs <= 32 ? 32 : hs <= 64 ? 64 : 128;
    switch (D) {
    case 16: return run_case<16>(B, T, C, NH, mis, lp);
    case 32: return run_case<32>(B, T, C, NH, mis, lp);
    case 64: return run_case<64>(B, T, C, NH, mis, lp);
    default: return run_case<128>(B, T, C, NH, mis, lp);
    }
}

/* One shape: its result line is "ok attention_emu/B.T.C.NH" (plus "/misaligned",
 * and "/lp" where the bf16 copies are given). */
static int run_named(int B, int T, int C, int NH, int mis, bool lp = false)
{
    const int fails = run(B, T, C, NH, mis, lp);
    printf("%s attention_emu/%d.%d.%d.%d%s%s\n", fails ? "FAIL" : "ok", B, T, C, NH,
           mis ? "/misaligned" : "", lp ? "/lp" : "");
    fflush(stdout);
    return fails;
}

int main(int argc, char **argv)
{
    if (argc == 5 || argc == 6) /* a fifth argument: the bf16 copies given */
        return run_named(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), 0,
                         argc == 6) != 0;
    /* head sizes 32, 32, 64, 32, 128, 128, 16, 48, 64, 15, 60 (every D), T
     * below, across and not a multiple of the 128-row blocks and 64/32-row tiles */
    static const int shapes[][4] = {{1, 1, 32, 1},    {2, 37, 64, 2},  {2, 37, 128, 2},
                                    {1, 130, 96, 3},  {3, 65, 256, 2}, {1, 200, 384, 3},
                                    {2, 70, 64, 4},   {2, 90, 144, 3}, {1, 300, 128, 2},
                                    {1, 257, 45, 3},  {1, 140, 60, 1}};
    int fails = 0;
    for (const auto &sh : shapes) fails += run_named(sh[0], sh[1], sh[2], sh[3], 0);
    fails += run_named(1, 150, 128, 2, 1); /* misaligned pointers: the scalar loads */
    /* the bf16 copies given: the direct layout (T a multiple of 64, hs = D = 16,
     * 32, 64), and packed from the copies where it does not apply (T not a
     * multiple of 64, hs < D, D = 128, a misaligned copy) */
    static const int lp_shapes[][5] = {{1, 64, 16, 1, 0},  {2, 64, 64, 2, 0}, {1, 128, 128, 2, 0},
                                       {2, 70, 64, 2, 0},  {1, 128, 96, 2, 0}, {1, 64, 256, 2, 0},
                                       {1, 64, 64, 1, 1}};
    for (const auto &sh : lp_shapes) fails += run_named(sh[0], sh[1], sh[2], sh[3], sh[4], true);
    printf("%ld mma emulated\n", n_mma);
    return fails != 0;
}
