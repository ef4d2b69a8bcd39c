/* Kernels of cuda_layernorm.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "layernorm.h"

namespace h3cuda {

static __device__ __forceinline__ float ln_out(float xv, float mu, float inv, const float *w, const float *b, int64_t i)
{
    float v = __fmul_rn(__fsub_rn(xv, mu), inv);
    if (w) v = __fmul_rn(v, w[i]);
    if (b) v = __fadd_rn(v, b[i]);
    return v;
}

/* One block per row, two-pass statistics in double with fixed-order block sums; up to VPT values
   per thread stay in registers (each value is read and written by the same thread, so y may
   alias x). */
template <int NT, int VPT>
__global__ void __launch_bounds__(NT) layernorm_kernel(LnArgs a)
{
    __shared__ double sh[NT / 32];
    const int64_t r = blockIdx.x, xo = r * a.ldx, yo = r * a.ldy, n = a.n;
    float v[VPT];
    const double s = row_load<NT, VPT>(a.x, a.x_bf16, xo, n, v, [](float t) { return (double)t; });
    const double mean = block_sum<NT>(s, sh) / (double)n;
    double q = 0.0;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        if (i < n) q += ((double)v[j] - mean) * ((double)v[j] - mean);
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT) {
        const double d = (double)ld_elem(a.x, a.x_bf16, xo + i) - mean;
        q += d * d;
    }
    __syncthreads(); /* sh is reused */
    const double var = block_sum<NT>(q, sh) / (double)n;
    const float inv = (float)(1.0 / sqrt(var + (double)a.eps)), mu = (float)mean;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        if (i < n) st_elem(a.y, a.y_bf16, yo + i, ln_out(v[j], mu, inv, a.w, a.b, i));
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT)
        st_elem(a.y, a.y_bf16, yo + i, ln_out(ld_elem(a.x, a.x_bf16, xo + i), mu, inv, a.w, a.b, i));
}

/* y = (y + x) / div: the sum rounded, then a true division. */
__global__ void add_div_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, float div, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            y[r * ldy + i] = __fdiv_rn(__fadd_rn(y[r * ldy + i], x[r * ldx + i]), div);
}

} /* namespace h3cuda */
