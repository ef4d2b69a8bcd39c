/* Kernels of cuda_gemm.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "gemm.h"

namespace h3cuda {

/* One output per thread, K in tiles of 16 staged through shared memory; the sum runs over k in
   order, so the result is deterministic. Only used where cuBLASLt declines a shape. */
__global__ void gemm_fallback_kernel(const bf16_t *__restrict__ X, int64_t ldx,
                                     const bf16_t *__restrict__ W, const float *__restrict__ bias, void *Y,
                                     int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K)
{
    __shared__ float xs[FB_T][FB_T + 1], ws[FB_T][FB_T + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t m = (int64_t)blockIdx.y * FB_T + ty, n = (int64_t)blockIdx.x * FB_T + tx;
    const int64_t wn = (int64_t)blockIdx.x * FB_T + ty; /* the W row this thread stages */
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += FB_T) {
        const int64_t k = k0 + tx;
        xs[ty][tx] = m < M && k < K ? bf2f(X[m * ldx + k]) : 0.0f;
        ws[ty][tx] = wn < N && k < K ? bf2f(W[wn * K + k]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < FB_T; j++) acc = fmaf(xs[ty][j], ws[tx][j], acc);
        __syncthreads();
    }
    if (m < M && n < N) {
        if (bias) acc += bias[n];
        st_elem(Y, y_bf16, m * ldy + n, acc);
    }
}

} /* namespace h3cuda */
