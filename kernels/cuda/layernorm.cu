/* LayerNorm over channels, eps 1e-5 (kernels/cpu/layernorm.c). One warp per
 * row of C channels; the parameter gradients go through per-block partial
 * sums added in order (no atomics: the same result every run). */
#include "cuda.cuh"

#define LN_EPS 1e-5f
#define LN_ROWS 256 /* rows per block of the parameter-gradient partial sums */

__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *w, const float *b,
                                                long BT, int C)
{
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= BT) return;
    const float *x = inp + row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += x[i];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / (float)C + LN_EPS);
    float *o = out + row * C;
    for (int i = lane; i < C; i += 32) o[i] = (r * (x[i] - m)) * w[i] + b[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

void kn_cuda_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int B,
                               int T, int C)
{
    long BT = (long)B * T;
    if (BT <= 0) return;
    unsigned blocks = (unsigned)((BT * 32 + 255) / 256);
    layernorm_forward_kernel<<<blocks, 256, 0, kn_stream(k)>>>(out, mean, rstd, inp, weight, bias,
                                                               BT, C);
    CUDA_LAUNCHED();
    if (out_lp) kn_cuda_to_lowp(k, out_lp, out, (size_t)BT * C);
}

/* dinp += rstd·(w·dout − mean(w·dout) − norm·mean(w·dout·norm)), one warp per row. */
__global__ static void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                             const float *w, const float *mean, const float *rstd,
                                             long BT, int C)
{
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= BT) return;
    const float *x = inp + row * C, *d = dout + row * C;
    float m = mean[row], r = rstd[row], a = 0.0f, bsum = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float dnorm = w[i] * d[i];
        a += dnorm;
        bsum += dnorm * ((x[i] - m) * r);
    }
    float dnorm_mean = warp_sum(a) / (float)C, dnorm_norm_mean = warp_sum(bsum) / (float)C;
    float *di = dinp + row * C;
    for (int i = lane; i < C; i += 32) {
        float norm = (x[i] - m) * r;
        di[i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
}

/* partial[blockIdx.y][c] = Σ dout·norm and partial[parts + blockIdx.y][c] = Σ dout
 * over the block's LN_ROWS rows; 32 channels × 8 row lanes, lanes summed in order. */
__global__ static void layernorm_params_kernel(float *partial, const float *dout, const float *inp,
                                               const float *mean, const float *rstd, long BT,
                                               int C)
{
    __shared__ float sw[8][32], sb[8][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    long r0 = (long)blockIdx.y * LN_ROWS, r1 = min(r0 + LN_ROWS, BT);
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (long r = r0 + threadIdx.y; r < r1; r += 8) {
            float d = dout[r * C + c];
            aw += d * ((inp[r * C + c] - mean[r]) * rstd[r]);
            ab += d;
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 8; y++) {
            tw += sw[y][threadIdx.x];
            tb += sb[y][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * C + c] = tw;
        partial[(size_t)(gridDim.y + blockIdx.y) * C + c] = tb;
    }
}

/* dinp and the parameter-gradient partial sums in one pass over dout and inp
 * (the two kernels above read both twice), after llm.c's layernorm_backward:
 * one warp per row as layernorm_dinp_kernel, and each warp adds its rows'
 * dout·norm and dout into its own shared-memory row of C channels (lane l owns
 * channels l, l+32, ...: no races, a fixed order). The block's LN_FUSED_ROWS
 * rows go to warps round-robin; at the end the 8 warp rows are summed in order
 * into partial[blockIdx.x] (dweight) and partial[gridDim.x + blockIdx.x]
 * (dbias), which kn_cuda_sum_partials adds in order: deterministic. Shared
 * memory 2 · 8 · C floats: taken for C ≤ 768 (48 KB, no opt-in needed). */
#define LN_FUSED_ROWS 32 /* 512 blocks at B·T = 16384: about one wave of 4 blocks per SM */
#define LN_FUSED_MAX_C 768

__global__ static void __launch_bounds__(256)
layernorm_backward_fused_kernel(float *dinp, float *partial, const float *dout, const float *inp,
                                const float *w, const float *mean, const float *rstd, long BT,
                                int C)
{
    extern __shared__ float ln_sh[]; /* [2][8][C]: Σ dout·norm, Σ dout per warp */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = threadIdx.x; i < 16 * C; i += blockDim.x) ln_sh[i] = 0.0f;
    __syncthreads();
    float *sw = ln_sh + (size_t)warp * C, *sb = ln_sh + (size_t)(8 + warp) * C;
    const long r0 = (long)blockIdx.x * LN_FUSED_ROWS, r1 = min(r0 + LN_FUSED_ROWS, BT);
    for (long row = r0 + warp; row < r1; row += 8) {
        const float *x = inp + row * C, *d = dout + row * C;
        const float m = mean[row], r = rstd[row];
        float a = 0.0f, bsum = 0.0f;
        for (int i = lane; i < C; i += 32) {
            const float di = d[i], norm = (x[i] - m) * r, dnorm = w[i] * di;
            a += dnorm;
            bsum += dnorm * norm;
            sw[i] += di * norm;
            sb[i] += di;
        }
        const float dnorm_mean = warp_sum(a) / (float)C;
        const float dnorm_norm_mean = warp_sum(bsum) / (float)C;
        float *dx = dinp + row * C;
        for (int i = lane; i < C; i += 32) {
            const float norm = (x[i] - m) * r;
            dx[i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * r;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 8; y++) {
            tw += ln_sh[(size_t)y * C + c];
            tb += ln_sh[(size_t)(8 + y) * C + c];
        }
        partial[(size_t)blockIdx.x * C + c] = tw;
        partial[(size_t)(gridDim.x + blockIdx.x) * C + c] = tb;
    }
}

void kn_cuda_layernorm_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int B, int T, int C)
{
    long BT = (long)B * T;
    if (BT <= 0 || C <= 0) return; /* C = 0: nothing to do (and a 0-block grid would abort) */
    if (dinp && dweight && dbias && C <= LN_FUSED_MAX_C) { /* the engine's case */
        unsigned parts = (unsigned)((BT + LN_FUSED_ROWS - 1) / LN_FUSED_ROWS);
        float *partial = (float *)kn_cuda_workspace(k, 2 * (size_t)parts * C * sizeof(float));
        layernorm_backward_fused_kernel<<<parts, 256, 16 * (size_t)C * sizeof(float),
                                          kn_stream(k)>>>(dinp, partial, dout, inp, weight, mean,
                                                          rstd, BT, C);
        CUDA_LAUNCHED();
        kn_cuda_sum_partials(k, dweight, partial, (int)parts, C);
        kn_cuda_sum_partials(k, dbias, partial + (size_t)parts * C, (int)parts, C);
        return;
    }
    if (dinp) {
        unsigned blocks = (unsigned)((BT * 32 + 255) / 256);
        layernorm_dinp_kernel<<<blocks, 256, 0, kn_stream(k)>>>(dinp, dout, inp, weight, mean,
                                                                rstd, BT, C);
        CUDA_LAUNCHED();
    }
    if (dweight || dbias) {
        int parts = (int)((BT + LN_ROWS - 1) / LN_ROWS);
        float *partial = (float *)kn_cuda_workspace(k, 2 * (size_t)parts * C * sizeof(float));
        dim3 grid((C + 31) / 32, parts), block(32, 8);
        layernorm_params_kernel<<<grid, block, 0, kn_stream(k)>>>(partial, dout, inp, mean, rstd,
                                                                  BT, C);
        CUDA_LAUNCHED();
        if (dweight) kn_cuda_sum_partials(k, dweight, partial, parts, C);
        if (dbias) kn_cuda_sum_partials(k, dbias, partial + (size_t)parts * C, parts, C);
    }
}
