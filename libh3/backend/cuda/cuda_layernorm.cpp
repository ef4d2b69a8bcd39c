/*
 * The text encoder's and the decoders' element-wise ops of backend.h on the GPU: layernorm, copy,
 * add_div. The decoders' layout and convolution ops (channels_last, unpatchify, vae_stitch,
 * snake_aa, conv_gemm, conv1_clamp) are in cuda_decoders.cu. not_on_gpu is the one-line answer for
 * an op this backend does not implement.
 *
 * Rounding as on the CPU (backend/cpu/ops.c h3_layernorm): mean and variance summed in double,
 * inv = (float)(1 / sqrt(var + eps)), then (x - mean) * inv [* w] [+ b], one rounding per operation.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/layernorm.h"

namespace h3cuda {

/* The kernels of kernels/layernorm.cu this file launches (cuda_kernels.h). */
H3K(k_layernorm_kernel_128_8, MOD_LAYERNORM, "layernorm_kernel<128, 8>", LnArgs);
H3K(k_layernorm_kernel_256_24, MOD_LAYERNORM, "layernorm_kernel<256, 24>", LnArgs);
H3K(k_add_div_kernel, MOD_LAYERNORM, "add_div_kernel", float *, int64_t, const float *, int64_t, float, int64_t, int64_t);

int not_on_gpu(Backend *b, const char *op)
{
    return fail(b, H3_E_UNSUPPORTED, "cuda: %s is not implemented by the CUDA backend yet (run the decoders on the CPU)",
                op);
}

int layernorm(Backend *b, const h3_bt *x, const float *w, const float *bb, float eps, const h3_bt *y)
{
    int rc;
    if ((rc = check_view(b, "layernorm", "x", x)) || (rc = check_view(b, "layernorm", "y", y))) return rc;
    if (y->cols != x->cols || y->rows > x->rows)
        return fail(b, H3_E_INVALID, "cuda: layernorm: x %lld x %lld, y %lld x %lld", (long long)x->rows,
                    (long long)x->cols, (long long)y->rows, (long long)y->cols);
    if (y->rows == 0 || x->cols == 0) return 0;
    if (y->rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: layernorm: too many rows");
    LnArgs a = {x->data, x->ld, w, bb, y->data, y->ld, x->cols, eps, x->dtype == H3_DT_BF16, y->dtype == H3_DT_BF16};
    if (a.n <= 1024)
        k_layernorm_kernel_128_8(b, (unsigned)y->rows, 128, 0, b->stream, a);
    else
        k_layernorm_kernel_256_24(b, (unsigned)y->rows, 256, 0, b->stream, a);
    return check_launch(b, "");
}

/* ---- copy, add_div ------------------------------------------------------------------------- */

int copy_view(Backend *b, const h3_bt *src, const h3_bt *dst)
{
    int rc;
    if ((rc = check_view(b, "copy", "src", src)) || (rc = check_view(b, "copy", "dst", dst))) return rc;
    if (src->dtype != dst->dtype || src->rows != dst->rows || src->cols != dst->cols)
        return fail(b, H3_E_INVALID, "cuda: copy of %lld x %lld %s into %lld x %lld %s", (long long)src->rows,
                    (long long)src->cols, dtname(src->dtype), (long long)dst->rows, (long long)dst->cols,
                    dtname(dst->dtype));
    if (src->rows == 0 || src->cols == 0) return 0;
    const size_t es = src->dtype == H3_DT_F32 ? 4 : 2;
    const size_t spitch = (size_t)(src->rows > 1 ? src->ld : src->cols) * es;
    const size_t dpitch = (size_t)(dst->rows > 1 ? dst->ld : dst->cols) * es;
    CUresult e = cu_copy2d(dst->data, dpitch, src->data, spitch, (size_t)src->cols * es, (size_t)src->rows, b->stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "copy");
}

int add_div(Backend *b, const h3_bt *y, const h3_bt *x, float div)
{
    int rc;
    if ((rc = check_view(b, "add_div", "y", y)) || (rc = check_view(b, "add_div", "x", x))) return rc;
    if (y->dtype != H3_DT_F32 || x->dtype != H3_DT_F32)
        return fail(b, H3_E_UNSUPPORTED, "cuda: add_div takes f32 views");
    if (x->rows < y->rows || x->cols < y->cols)
        return fail(b, H3_E_INVALID, "cuda: add_div: x %lld x %lld is smaller than y %lld x %lld", (long long)x->rows,
                    (long long)x->cols, (long long)y->rows, (long long)y->cols);
    if (y->rows == 0 || y->cols == 0) return 0;
    dim3 grid(blocks_for(y->cols, 256, 64), (unsigned)(y->rows < 65535 ? y->rows : 65535));
    return check_launch(b, k_add_div_kernel(b, grid, 256, 0, b->stream, (float *)y->data, y->ld, (const float *)x->data, x->ld, div, y->rows,
                                                y->cols));
}

} /* namespace h3cuda */
