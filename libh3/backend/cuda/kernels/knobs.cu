/* Kernels of cuda_knobs.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "knobs.h"

namespace h3cuda {

/* out = a + r * (a - b): difference, product, sum, each rounded. */
__global__ void extrapolate_kernel(float *out, const float *a, const float *b, int64_t n, float r)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float av = a[i];
        const float d = __fsub_rn(av, b[i]);
        out[i] = __fadd_rn(av, __fmul_rn(r, d));
    }
}

__global__ void sub_kernel(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fsub_rn(a[i], b[i]);
}

/* dst[j] = (src[p0] + src[p1]) * 0.5f, or src[p0] when p1 < 0. */
__global__ void pool_pairs_kernel(const float *src, int64_t lds, const int64_t *pairs, float *dst, int64_t ldd,
                                  int64_t rows, int64_t n)
{
    for (int64_t j = blockIdx.y; j < rows; j += gridDim.y) {
        const int64_t p0 = pairs[2 * j], p1 = pairs[2 * j + 1];
        const float *x0 = src + p0 * lds, *x1 = p1 >= 0 ? src + p1 * lds : nullptr;
        float *y = dst + j * ldd;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            y[i] = x1 ? __fmul_rn(__fadd_rn(x0[i], x1[i]), 0.5f) : x0[i];
    }
}

/* Pair: full[p0] += d, full[p1] += d with d = red[j] - base[j]; single: full[p0] = red[j]. Pairs
   name disjoint rows, so no two threads write one value. */
__global__ void unpool_pairs_kernel(const float *red, int64_t ldr, const float *base, int64_t ldb,
                                    const int64_t *pairs, float *full, int64_t ldf, int64_t rows, int64_t n)
{
    for (int64_t j = blockIdx.y; j < rows; j += gridDim.y) {
        const int64_t p0 = pairs[2 * j], p1 = pairs[2 * j + 1];
        const float *y = red + j * ldr, *bs = base + j * ldb;
        float *f0 = full + p0 * ldf, *f1 = p1 >= 0 ? full + p1 * ldf : nullptr;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            if (!f1) {
                f0[i] = y[i];
            } else {
                const float d = __fsub_rn(y[i], bs[i]);
                f0[i] = __fadd_rn(f0[i], d);
                f1[i] = __fadd_rn(f1[i], d);
            }
        }
    }
}

/* Partial sums of |a - b| and |b| over one block of SUM_BLOCK values. */
__global__ void __launch_bounds__(SUM_NT) abs_diff_part_kernel(const float *a, const float *b, int64_t n, double *part)
{
    __shared__ double sh[SUM_NT / 32];
    const int64_t i0 = (int64_t)blockIdx.x * SUM_BLOCK;
    double d = 0.0, r = 0.0;
#pragma unroll 4
    for (int k = threadIdx.x; k < SUM_BLOCK; k += SUM_NT) {
        const int64_t i = i0 + k;
        if (i < n) {
            const double bv = b[i];
            d += fabs((double)a[i] - bv);
            r += fabs(bv);
        }
    }
    d = block_sum<SUM_NT>(d, sh);
    __syncthreads();
    r = block_sum<SUM_NT>(r, sh);
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = d;
        part[2 * blockIdx.x + 1] = r;
    }
}

/* The partial sums in a fixed order: thread t sums blocks t, t + FIN_NT, ... in order, then the
   block tree. One block; out[0] = diff, out[1] = ref. */
__global__ void __launch_bounds__(FIN_NT) abs_diff_final_kernel(const double *part, int64_t blocks, double *out)
{
    __shared__ double sh[FIN_NT / 32];
    double d = 0.0, r = 0.0;
    for (int64_t k = threadIdx.x; k < blocks; k += FIN_NT) {
        d += part[2 * k];
        r += part[2 * k + 1];
    }
    d = block_sum<FIN_NT>(d, sh);
    __syncthreads();
    r = block_sum<FIN_NT>(r, sh);
    if (threadIdx.x == 0) {
        out[0] = d;
        out[1] = r;
    }
}

} /* namespace h3cuda */
