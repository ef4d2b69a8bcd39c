/*
 * The speed-knob ops of backend.h on the GPU (step reuse, core reuse, token reduction, step cache):
 * extrapolate, sub, pool_pairs, unpool_pairs, abs_diff_sum. All f32.
 *
 * The element-wise ones round exactly as backend/cpu/cpu_knobs.c does (one IEEE operation each,
 * written with __f*_rn so nothing is contracted into a fused multiply-add), so they give the CPU
 * backend's bits. abs_diff_sum accumulates in double in an order fixed for this backend: blocks of
 * 4096 values, each reduced by one thread block in a fixed tree, then the block sums in a fixed
 * tree; the same bits on every run whatever the GPU's scheduling.
 */
#include "backend/cuda/cuda_common.cuh"

namespace h3cuda {

static int need_f32(const Backend *b, const char *op, const char *name, const h3_bt *t)
{
    int rc = check_view(b, op, name, t);
    if (rc) return rc;
    if (t->dtype != H3_DT_F32) return fail(b, H3_E_UNSUPPORTED, "cuda: %s: %s must be f32, got %s", op, name, dtname(t->dtype));
    return 0;
}

/* out = a + r * (a - b): difference, product, sum, each rounded. */
__global__ void extrapolate_kernel(float *out, const float *a, const float *b, int64_t n, float r)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float av = a[i];
        const float d = __fsub_rn(av, b[i]);
        out[i] = __fadd_rn(av, __fmul_rn(r, d));
    }
}

int extrapolate(Backend *b, float *out, const float *a, const float *bb, int64_t n, float r)
{
    if (n <= 0) return 0;
    if (!bb) {
        if (out == a) return 0;
        cudaError_t e = cudaMemcpyAsync(out, a, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, b->stream);
        return e == cudaSuccess ? 0 : fail_cuda(b, e, "extrapolate (copy)");
    }
    extrapolate_kernel<<<blocks_for(n, 256, 8192), 256, 0, b->stream>>>(out, a, bb, n, r);
    return check_launch(b, "extrapolate_kernel");
}

__global__ void sub_kernel(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __fsub_rn(a[i], b[i]);
}

int sub(Backend *b, float *out, const float *a, const float *bb, int64_t n)
{
    if (n <= 0) return 0;
    sub_kernel<<<blocks_for(n, 256, 8192), 256, 0, b->stream>>>(out, a, bb, n);
    return check_launch(b, "sub_kernel");
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

int pool_pairs(Backend *b, const h3_bt *src, const int64_t *pairs, const h3_bt *dst)
{
    int rc;
    if ((rc = need_f32(b, "pool_pairs", "src", src)) || (rc = need_f32(b, "pool_pairs", "dst", dst))) return rc;
    if (src->cols != dst->cols)
        return fail(b, H3_E_INVALID, "cuda: pool_pairs of %lld-wide rows into %lld-wide rows", (long long)src->cols,
                    (long long)dst->cols);
    if (dst->rows == 0 || dst->cols == 0) return 0;
    if (!pairs) return fail(b, H3_E_INVALID, "cuda: pool_pairs: no pairs");
    dim3 grid(blocks_for(dst->cols, 256, 64), (unsigned)(dst->rows < 65535 ? dst->rows : 65535));
    pool_pairs_kernel<<<grid, 256, 0, b->stream>>>((const float *)src->data, src->ld, pairs, (float *)dst->data, dst->ld,
                                                   dst->rows, dst->cols);
    return check_launch(b, "pool_pairs_kernel");
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

int unpool_pairs(Backend *b, const h3_bt *red, const h3_bt *base, const int64_t *pairs, const h3_bt *full)
{
    int rc;
    if ((rc = need_f32(b, "unpool_pairs", "red", red)) || (rc = need_f32(b, "unpool_pairs", "base", base)) ||
        (rc = need_f32(b, "unpool_pairs", "full", full)))
        return rc;
    if (red->cols != full->cols || base->cols != red->cols || base->rows < red->rows)
        return fail(b, H3_E_INVALID, "cuda: unpool_pairs: rows of different widths");
    if (red->rows == 0 || red->cols == 0) return 0;
    if (!pairs) return fail(b, H3_E_INVALID, "cuda: unpool_pairs: no pairs");
    dim3 grid(blocks_for(red->cols, 256, 64), (unsigned)(red->rows < 65535 ? red->rows : 65535));
    unpool_pairs_kernel<<<grid, 256, 0, b->stream>>>((const float *)red->data, red->ld, (const float *)base->data,
                                                     base->ld, pairs, (float *)full->data, full->ld, red->rows,
                                                     red->cols);
    return check_launch(b, "unpool_pairs_kernel");
}

#define SUM_BLOCK 4096 /* values per partial sum, as on the CPU */
#define SUM_NT 256
#define FIN_NT 1024

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

int abs_diff_sum(Backend *b, const float *a, const float *bb, int64_t n, double *diff, double *ref)
{
    *diff = *ref = 0.0;
    if (n <= 0) return 0;
    const int64_t blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
    if (blocks > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: abs_diff_sum: too many values");
    double *part = (double *)scratch(b, SCR_PARTIAL, sizeof(double) * (size_t)(2 * blocks + 2));
    if (!part) return -H3_E_NOMEM;
    double *res = part + 2 * blocks;
    abs_diff_part_kernel<<<(unsigned)blocks, SUM_NT, 0, b->stream>>>(a, bb, n, part);
    int rc = check_launch(b, "abs_diff_part_kernel");
    if (rc) return rc;
    abs_diff_final_kernel<<<1, FIN_NT, 0, b->stream>>>(part, blocks, res);
    if ((rc = check_launch(b, "abs_diff_final_kernel"))) return rc;
    double host[2];
    cudaError_t e = cudaMemcpyAsync(host, res, sizeof host, cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) return fail_cuda(b, e, "abs_diff_sum");
    *diff = host[0];
    *ref = host[1];
    return 0;
}

} /* namespace h3cuda */
