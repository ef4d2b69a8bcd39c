/* Kernels of cuda_fp8.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "fp8.h"

namespace h3cuda {


/* ---- quantisation kernels ------------------------------------------------------------------ */

/* One row per block: scale[r] = amax / 448 (1 for an all-zero row), q = e4m3(x / scale). x f32 or
   bf16 with row stride ldx; q with row stride ldq. NaN propagates through fmaxf as the other
   operand, so a NaN value saturates rather than poisoning the scale. */
__global__ void __launch_bounds__(256) fp8_rows_kernel(const void *x, int x_bf16, int64_t ldx, int64_t cols,
                                                       e4m3 *q, int64_t ldq, float *scale)
{
    __shared__ float sh[8];
    const int64_t r = blockIdx.x;
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < cols; i += 256) m = fmaxf(m, fabsf(ld_elem(x, x_bf16, r * ldx + i)));
    const float s = e4m3_scale(block_max256(m, sh));
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t i = threadIdx.x; i < cols; i += 256)
        q[r * ldq + i] = f2e4m3(__fdiv_rn(ld_elem(x, x_bf16, r * ldx + i), s));
}

/* The scale pass: y[m][n] = (d[m][n] * ws[n]) * xs[m] in f32, rounded to y's dtype (d may be y). */
__global__ void fp8_scale_kernel(const void *d, int d_bf16, int64_t ldd, void *y, int y_bf16, int64_t ldy,
                                 const float *ws, const float *xs, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float s = xs[r];
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            st_elem(y, y_bf16, r * ldy + i, __fmul_rn(__fmul_rn(ld_elem(d, d_bf16, r * ldd + i), ws[i]), s));
    }
}

/* y[r] += bias over rows x cols (f32 or bf16 rows of stride ldy): the fp8 GEMM has no fused bias. */
__global__ void add_bias_kernel(void *y, int y_bf16, int64_t ldy, const float *bias, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            st_elem(y, y_bf16, r * ldy + i, __fadd_rn(ld_elem(y, y_bf16, r * ldy + i), bias[i]));
}

} /* namespace h3cuda */
