/*
 * fp8 GEMMs (h3_options.precision = H3_PRECISION_FP8): e4m3 weights with one f32 scale per output
 * channel, e4m3 activations with one f32 scale per token, through cuBLASLt's fp8 matmul (f32
 * accumulation). The scales are applied where cuBLASLt can: as outer-vector scales in its
 * epilogue (each product element (n, m) times the weight scale of n and the activation scale of
 * m) where it offers that for the shape and GPU; otherwise (Hopper's cuBLASLt has no outer-vector
 * mode) the GEMM runs unscaled into Y and one pass over Y multiplies each element by its two
 * scales, in f32, rounding once more when Y is bf16 (2^-9 relative, against e4m3's 2^-4).
 *
 * Why these granularities: a transformer weight row (one output channel) and an activation row
 * (one token) are what vary most in range, and outer-vector scales are exactly those, applied in
 * the GEMM's epilogue at no cost. Scales are amax / 448 (e4m3's largest finite value); values are
 * divided by the scale and rounded to nearest with saturation. Every reduction is a max (order
 * free) and every kernel has fixed work per thread, so the fp8 path is deterministic like the
 * rest of the backend. It is not exact: the bf16 path stays the default.
 *
 * Only the weights the caller loads under H3_PRECISION_FP8 take this path (models/dit.c: the main
 * blocks' qkv, out, fc1, fc2); a weight whose width cuBLASLt's fp8 kernels cannot take (K not a
 * multiple of 16) stays bf16.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/fp8.h"

#include <stdlib.h>
#include <string.h>

namespace h3cuda {

/* The kernels of kernels/fp8.cu this file launches (cuda_kernels.h). */
H3K(k_fp8_rows_kernel, MOD_FP8, "fp8_rows_kernel", const void *, int, int64_t, int64_t, e4m3 *, int64_t, float *);
H3K(k_fp8_scale_kernel, MOD_FP8, "fp8_scale_kernel", const void *, int, int64_t, void *, int, int64_t, const float *, const float *, int64_t, int64_t);
H3K(k_add_bias_kernel, MOD_FP8, "add_bias_kernel", void *, int, int64_t, const float *, int64_t, int64_t);
static int quantize_rows(Backend *b, const void *x, int x_bf16, int64_t ldx, int64_t rows, int64_t cols, void *q,
                         int64_t ldq, float *scale)
{
    if (rows <= 0) return 0;
    if (rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: fp8: too many rows");
    return check_launch(b, k_fp8_rows_kernel(b, (unsigned)rows, 256, 0, b->stream, x, x_bf16, ldx, cols, (e4m3 *)q, ldq, scale));
}

int fp8_weight_alloc(Backend *b, int64_t rows, int64_t cols, h3_bw *out)
{
    memset(out, 0, sizeof *out);
    void *d = dev_alloc(b, (size_t)(rows * cols), "fp8 weights");
    if (!d) return -H3_E_NOMEM;
    float *s = (float *)dev_alloc(b, sizeof(float) * (size_t)rows, "fp8 weight scales");
    if (!s) {
        cu_free(d);
        return -H3_E_NOMEM;
    }
    out->data = d;
    out->dtype = H3_DT_F8_E4M3;
    out->rows = rows;
    out->cols = cols;
    out->priv = s;
    return 0;
}

void fp8_weight_release(h3_bw *w)
{
    /* cudaFree waits for work queued on the device that still reads them. */
    if (w->data) cu_free((void *)w->data);
    if (w->priv) cu_free(w->priv);
    memset(w, 0, sizeof *w);
}

int fp8_weight_from_bf16(Backend *b, const void *w_bf16, int64_t rows, int64_t cols, h3_bw *out)
{
    int rc = fp8_weight_alloc(b, rows, cols, out);
    if (!rc) rc = quantize_rows(b, w_bf16, 1, cols, rows, cols, (void *)out->data, cols, (float *)out->priv);
    if (rc) fp8_weight_release(out);
    return rc;
}

bool fp8_weight_ok(const Backend *b, int64_t rows, int64_t cols)
{
    return b->cc_major * 10 + b->cc_minor >= 89 && h3_fp8_weight_shape_ok(rows, cols);
}

/* The plan key of an fp8 GEMM: e4m3 W (K x N) and quantised X (K x M, row stride K), both 16-byte
   aligned, into D of type d_bf16 ? bf16 : f32, ldd elements apart; ay is Y's alignment class (the
   one the heuristic is given for D in every mode); `outer` puts the scale vectors in the GEMM. */
static LtKey fp8_key(int64_t M, int64_t N, int64_t K, bool d_bf16, int64_t ldd, int ay, bool outer)
{
    LtKey k;
    lt_key_init(&k);
    k.M = M, k.N = N, k.K = K;
    k.lda = K, k.ldb = K, k.ldd = ldd;
    k.a_type = CUDA_R_8F_E4M3, k.b_type = CUDA_R_8F_E4M3, k.d_type = d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    k.align_a = 16, k.align_b = 16, k.align_d = (uint32_t)ay;
    k.scale_outer = outer;
    return k;
}

int linear_fp8(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    const int64_t M = X->rows, N = W->rows, K = W->cols;
    if (M == 0 || N == 0) return 0;
    const float *wscale = (const float *)W->priv;
    if (!wscale) return fail(b, H3_E_INVALID, "cuda: linear: an fp8 weight without its scales");
    const int y_bf16 = Y->dtype == H3_DT_BF16;
    /* The scales in the GEMM, else after it by the scale pass; for an f32 Y without an f32-output
       kernel, through a bf16 scratch of N-value rows. */
    const bool yb = y_bf16 != 0;
    const int ay = lt_align(Y->data, Y->ld * (y_bf16 ? 2 : 4));
    int mode = FP8_OUTER;
    int64_t Mg = M; /* the rows the GEMM runs */
    LtPlan *p = lt_plan(b, fp8_key(M, N, K, yb, Y->ld, ay, true));
    if (!p) {
        mode = FP8_POST;
        p = lt_plan(b, fp8_key(M, N, K, yb, Y->ld, ay, false));
    }
    if (!p && !yb) {
        mode = FP8_POST_BF16;
        p = lt_plan(b, fp8_key(M, N, K, true, N, ay, false));
    }
    if (!p && M % 16) {
        /* A row count cuBLASLt's heuristic offers no fp8 kernel for (some odd ones, as small video-decoder
           tiles have): the GEMM runs over the rows rounded up to 16, the extra rows zero (codes and scales), into
           the bf16 scratch, and the scale pass writes the real rows only. Rows are independent in a GEMM. */
        mode = FP8_POST_BF16;
        Mg = (M + 15) / 16 * 16;
        p = lt_plan(b, fp8_key(Mg, N, K, true, N, ay, false));
    }
    if (!p)
        return fail(b, H3_E_UNSUPPORTED, "cuda: cuBLASLt has no fp8 GEMM for %lld x %lld x %lld (row stride %lld)",
                    (long long)M, (long long)N, (long long)K, (long long)Y->ld);
    void *xq = scratch(b, SCR_XF8, (size_t)(Mg * K));
    float *xs = xq ? (float *)scratch(b, SCR_XSCALE, sizeof(float) * (size_t)Mg) : NULL;
    if (!xs) return -H3_E_NOMEM;
    int rc = quantize_rows(b, X->data, X->dtype == H3_DT_BF16, X->ld, M, K, xq, K, xs);
    if (rc) return rc;
    if (Mg > M) {
        CUresult e = cu_memset((uint8_t *)xq + (size_t)(M * K), 0, (size_t)((Mg - M) * K), b->stream);
        if (e == CUDA_SUCCESS) e = cu_memset(xs + M, 0, sizeof(float) * (size_t)(Mg - M), b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "linear (fp8): zeroing the padding rows");
    }
    cublasStatus_t st;
    if (mode == FP8_OUTER &&
        ((st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wscale, sizeof wscale)) ||
         (st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs))))
        return fail_cublas(b, st, "linear (fp8): setting the scales");
    const float one = 1.0f, zero = 0.0f;
    void *D = Y->data;
    if (mode == FP8_POST_BF16 && !(D = scratch(b, SCR_YF32, (size_t)(Mg * N) * 2))) return -H3_E_NOMEM;
    st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, xq, p->lb, &zero, D, p->ld, D, p->ld, &p->algo, b->lt_ws,
                        b->lt_ws_bytes, b->stream);
    if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(b, st, "linear (fp8)");
    dim3 grid(blocks_for(N, 256, 64), (unsigned)(M < 65535 ? M : 65535));
    if (mode != FP8_OUTER) {
        const bool sep = mode == FP8_POST_BF16;
        k_fp8_scale_kernel(b, grid, 256, 0, b->stream, D, sep ? 1 : y_bf16, sep ? N : Y->ld, Y->data, y_bf16, Y->ld,
                                                      wscale, xs, M, N);
        if ((rc = check_launch(b, "fp8_scale_kernel"))) return rc;
    }
    if (!bias) return 0;
    return check_launch(b, k_add_bias_kernel(b, grid, 256, 0, b->stream, Y->data, y_bf16, Y->ld, bias, M, N));
}

} /* namespace h3cuda */
