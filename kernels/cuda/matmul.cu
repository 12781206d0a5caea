/* Linear layers through cuBLAS (kernels/cpu/matmul.c). Row-major [R, C]
 * matrices are column-major [C, R] to cuBLAS, so out = inp · Wᵀ becomes
 * outᵀ = W'ᵀ · inp' with the primes the column-major views.
 *
 * Bias is added by filling out with it and accumulating the product (β = 1);
 * the fused alternative is a cuBLASLt matmul with the BIAS (or GELU_BIAS)
 * epilogue, which also saves the GELU pass after the fc layer. */
#include "cuda.cuh"

#define BIAS_ROWS 256 /* rows of dout per block of the dbias partial sums */

__global__ static void fill_bias_kernel(float *out, const float *bias, int OC, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias[i % OC];
}

void kn_cuda_matmul_forward(kn_ctx *k, float *out, const float *inp, const float *weight,
                            const float *bias, int BT, int C, int OC)
{
    if (BT <= 0 || OC <= 0) return;
    size_t n = (size_t)BT * OC;
    if (bias) {
        fill_bias_kernel<<<kn_blocks(n, 256), 256, 0, kn_stream(k)>>>(out, bias, OC, n);
        CUDA_LAUNCHED();
    } else if (C <= 0) {
        CUDA_CHECK(cudaMemsetAsync(out, 0, n * sizeof(float), kn_stream(k)));
    }
    if (C > 0) /* outᵀ[OC, BT] = Wᵀ' · inp' */
        kn_cuda_gemm(k, true, false, OC, BT, C, 1.0f, weight, C, inp, C, bias ? 1.0f : 0.0f,
                     out, OC);
}

/* partial[blockIdx.y][c] = Σ of dout[r, c] over the block's BIAS_ROWS rows;
 * a block is 32 columns × 8 row lanes, the lanes summed in order at the end. */
__global__ static void bias_partial_kernel(float *partial, const float *dout, int BT, int OC)
{
    __shared__ float s[8][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * BIAS_ROWS, r1 = min(r0 + BIAS_ROWS, BT);
    float acc = 0.0f;
    if (c < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += dout[(size_t)r * OC + c];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float sum = 0.0f;
        for (int y = 0; y < 8; y++) sum += s[y][threadIdx.x];
        partial[(size_t)blockIdx.y * OC + c] = sum;
    }
}

void kn_cuda_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int BT,
                             int C, int OC)
{
    if (BT <= 0 || OC <= 0 || C < 0) return;
    if (dinp && C > 0) /* dinpᵀ[C, BT] += W' · dout' */
        kn_cuda_gemm(k, false, false, C, BT, OC, 1.0f, weight, C, dout, OC, 1.0f, dinp, C);
    if (dweight && C > 0) /* dWᵀ[C, OC] += inp' · dout'ᵀ */
        kn_cuda_gemm(k, false, true, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dweight, C);
    if (dbias) {
        int parts = (BT + BIAS_ROWS - 1) / BIAS_ROWS;
        float *partial = (float *)kn_cuda_workspace(k, (size_t)parts * OC * sizeof(float));
        dim3 grid((OC + 31) / 32, parts), block(32, 8);
        bias_partial_kernel<<<grid, block, 0, kn_stream(k)>>>(partial, dout, BT, OC);
        CUDA_LAUNCHED();
        kn_cuda_sum_partials(k, dbias, partial, parts, OC);
    }
}
