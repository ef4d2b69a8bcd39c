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
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/knobs.h"

namespace h3cuda {

/* The kernels of kernels/knobs.cu this file launches (cuda_kernels.h). */
H3K(k_extrapolate_kernel, MOD_KNOBS, "extrapolate_kernel", float *, const float *, const float *, int64_t, float);
H3K(k_sub_kernel, MOD_KNOBS, "sub_kernel", float *, const float *, const float *, int64_t);
H3K(k_pool_pairs_kernel, MOD_KNOBS, "pool_pairs_kernel", const float *, int64_t, const int64_t *, float *, int64_t, int64_t, int64_t);
H3K(k_unpool_pairs_kernel, MOD_KNOBS, "unpool_pairs_kernel", const float *, int64_t, const float *, int64_t, const int64_t *, float *, int64_t, int64_t, int64_t);
H3K(k_abs_diff_part_kernel, MOD_KNOBS, "abs_diff_part_kernel", const float *, const float *, int64_t, double *);
H3K(k_abs_diff_final_kernel, MOD_KNOBS, "abs_diff_final_kernel", const double *, int64_t, double *);

static int need_f32(const Backend *b, const char *op, const char *name, const h3_bt *t)
{
    int rc = check_view(b, op, name, t);
    if (rc) return rc;
    if (t->dtype != H3_DT_F32) return fail(b, H3_E_UNSUPPORTED, "cuda: %s: %s must be f32, got %s", op, name, dtname(t->dtype));
    return 0;
}

int extrapolate(Backend *b, float *out, const float *a, const float *bb, int64_t n, float r)
{
    if (n <= 0) return 0;
    if (!bb) {
        if (out == a) return 0;
        CUresult e = cu_copy(out, a, (size_t)n * sizeof(float), b->stream);
        return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "extrapolate (copy)");
    }
    return check_launch(b, k_extrapolate_kernel(b, blocks_for(n, 256, 8192), 256, 0, b->stream, out, a, bb, n, r));
}

int sub(Backend *b, float *out, const float *a, const float *bb, int64_t n)
{
    if (n <= 0) return 0;
    return check_launch(b, k_sub_kernel(b, blocks_for(n, 256, 8192), 256, 0, b->stream, out, a, bb, n));
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
    return check_launch(b, k_pool_pairs_kernel(b, grid, 256, 0, b->stream, (const float *)src->data, src->ld, pairs, (float *)dst->data, dst->ld,
                                                   dst->rows, dst->cols));
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
    return check_launch(b, k_unpool_pairs_kernel(b, grid, 256, 0, b->stream, (const float *)red->data, red->ld, (const float *)base->data,
                                                     base->ld, pairs, (float *)full->data, full->ld, red->rows,
                                                     red->cols));
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
    k_abs_diff_part_kernel(b, (unsigned)blocks, SUM_NT, 0, b->stream, a, bb, n, part);
    int rc = check_launch(b, "abs_diff_part_kernel");
    if (rc) return rc;
    k_abs_diff_final_kernel(b, 1, FIN_NT, 0, b->stream, part, blocks, res);
    if ((rc = check_launch(b, "abs_diff_final_kernel"))) return rc;
    double host[2];
    CUresult e = cu_copy(host, res, sizeof host, b->stream);
    if (e == CUDA_SUCCESS) e = cuStreamSynchronize(b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "abs_diff_sum");
    *diff = host[0];
    *ref = host[1];
    return 0;
}

} /* namespace h3cuda */
