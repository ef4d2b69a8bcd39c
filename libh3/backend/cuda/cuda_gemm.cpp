/*
 * linear: Y[M, N] = X[M, K] W^T (+ bias) through cuBLASLt, bf16 operands, f32 accumulation.
 *
 * Row-major Y = X W^T is, read column-major, Y^T = W X^T: A = W viewed as a K x N column-major
 * matrix and transposed (op T), B = X viewed as K x M (op N), D = Y viewed as N x M. This "TN"
 * form needs no copies and is the layout cuBLASLt's Hopper kernels are tuned for.
 *
 * Plans (descriptors + the chosen algorithm) come from the backend's one plan cache
 * (cuda_lt_plans.cu), keyed by shape, strides, dtypes and pointer alignment, so a denoising step
 * pays no heuristic queries after the first and a shape gets the same kernel, hence the same bits,
 * on every run.
 *
 * Fallbacks keep every shape working: when cuBLASLt cannot fuse the f32 bias into a bf16 output
 * (or the bias pointer is not 16-byte aligned) the product goes to an f32 scratch and a small
 * kernel adds the bias and rounds once; when it has no algorithm at all (odd strides, K = 0), a
 * plain tiled kernel computes the same sum.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/gemm.h"

#include <stdlib.h>
#include <string.h>

namespace h3cuda {

/* The kernels of kernels/gemm.cu this file launches (cuda_kernels.h). */
H3K(k_gemm_fallback_kernel, MOD_GEMM, "gemm_fallback_kernel", const bf16_t *, int64_t, const bf16_t *, const float *, void *, int, int64_t, int64_t, int64_t, int64_t);
/* The plan key of Y[M, N] = X[M, K] W^T with bf16 operands (X rows ldx apart, alignment class ax)
   into D of type dt, ldd elements apart, alignment class ad; epi_bias fuses an f32 bias. Weights
   come from cudaMalloc (256-byte aligned) with row stride K elements. */
static LtKey bf16_key(int64_t M, int64_t N, int64_t K, int64_t ldx, int ax, cudaDataType dt, int64_t ldd, int ad,
                      bool epi_bias)
{
    LtKey k;
    lt_key_init(&k);
    k.M = M, k.N = N, k.K = K;
    k.lda = K, k.ldb = ldx, k.ldd = ldd;
    k.a_type = CUDA_R_16BF, k.b_type = CUDA_R_16BF, k.d_type = dt;
    k.align_a = (uint32_t)lt_align(NULL, K * 2), k.align_b = (uint32_t)ax, k.align_d = (uint32_t)ad;
    k.epi_bias = epi_bias;
    return k;
}

int linear(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    int rc;
    if ((rc = check_view(b, "linear", "X", X)) || (rc = check_view(b, "linear", "Y", Y))) return rc;
    if (W && W->dtype == H3_DT_F8_E4M3 && W->data) {
        if (X->cols != W->cols || Y->cols != W->rows || Y->rows != X->rows)
            return fail(b, H3_E_INVALID, "cuda: linear: X %lld x %lld, W %lld x %lld, Y %lld x %lld do not match",
                        (long long)X->rows, (long long)X->cols, (long long)W->rows, (long long)W->cols,
                        (long long)Y->rows, (long long)Y->cols);
        return linear_fp8(b, X, W, bias, Y);
    }
    if (!W || W->dtype != H3_DT_BF16 || (!W->data && W->rows * W->cols > 0))
        return fail(b, H3_E_INVALID, "cuda: linear: the weight was not loaded by this backend");
    if (X->cols != W->cols || Y->cols != W->rows || Y->rows != X->rows)
        return fail(b, H3_E_INVALID, "cuda: linear: X %lld x %lld, W %lld x %lld, Y %lld x %lld do not match",
                    (long long)X->rows, (long long)X->cols, (long long)W->rows, (long long)W->cols, (long long)Y->rows,
                    (long long)Y->cols);
    const int64_t M = X->rows, N = W->rows, K = W->cols;
    if (M == 0 || N == 0) return 0;
    const int y_bf16 = Y->dtype == H3_DT_BF16;
    const int64_t ldy = M == 1 && Y->ld < N ? N : Y->ld;

    /* GEMM inputs are bf16: an f32 X is rounded once into scratch (ld = K). */
    const bf16_t *Xb;
    int64_t ldx;
    if (X->dtype == H3_DT_F32) {
        bf16_t *s = (bf16_t *)scratch(b, SCR_XBF16, (size_t)(M * (K > 0 ? K : 1)) * 2);
        if (!s) return -H3_E_NOMEM;
        if (K > 0 && (rc = convert_f32_bf16_2d(b, (const float *)X->data, X->ld, s, K, M, K))) return rc;
        Xb = s;
        ldx = K;
    } else {
        Xb = (const bf16_t *)X->data;
        ldx = M == 1 && X->ld < K ? K : X->ld;
    }
    if (K == 0)
        return gemm_fallback(b, Xb, ldx, (const bf16_t *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);

    /* The plan: straight into Y (the bias fused when it is 16-byte aligned), else into an f32
       scratch that bias_store rounds into Y, else the fallback kernel. A direct plan a matmul once
       refused sends its shape to the fallback for good. */
    const int bclass = !bias ? BIAS_NONE : ((uintptr_t)bias & 15) ? BIAS_KERNEL : BIAS_EPILOGUE;
    const int ax = lt_align(Xb, ldx * 2);
    const cudaDataType ydt = y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    bool refused = false;
    LtPlan *p = NULL;
    if (bclass != BIAS_KERNEL)
        p = lt_plan(b, bf16_key(M, N, K, ldx, ax, ydt, ldy, lt_align(Y->data, ldy * (y_bf16 ? 2 : 4)),
                                bclass == BIAS_EPILOGUE),
                    &refused);
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st;
    if (p) {
        if (bias && (st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)))
            return fail_cublas(b, st, "linear: setting the bias");
        st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, Xb, p->lb, &zero, Y->data, p->ld, Y->data, p->ld,
                            &p->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
            /* The heuristic's algorithm refused these operands after all: this shape takes the
               fallback from now on (nothing was launched, so nothing is half done). */
            lt_plan_refuse(b, p);
            return gemm_fallback(b, Xb, ldx, (const bf16_t *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);
        }
        return st == CUBLAS_STATUS_SUCCESS ? 0 : fail_cublas(b, st, "linear");
    }
    if (bclass != BIAS_NONE && !refused &&
        (p = lt_plan(b, bf16_key(M, N, K, ldx, ax, CUDA_R_32F, N, lt_align(NULL, N * 4), false)))) {
        float *t = (float *)scratch(b, SCR_YF32, (size_t)(M * N) * 4);
        if (!t) return -H3_E_NOMEM;
        st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, Xb, p->lb, &zero, t, p->ld, t, p->ld, &p->algo,
                            b->lt_ws, b->lt_ws_bytes, b->stream);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(b, st, "linear");
        return bias_store(b, t, bias, Y->data, y_bf16, ldy, M, N);
    }
    return gemm_fallback(b, Xb, ldx, (const bf16_t *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);
}

int gemm_fallback(Backend *b, const bf16_t *X, int64_t ldx, const bf16_t *W, const float *bias, void *Y,
                  int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K)
{
    dim3 block(FB_T, FB_T), grid((unsigned)((N + FB_T - 1) / FB_T), (unsigned)((M + FB_T - 1) / FB_T));
    if (grid.y > 65535) return fail(b, H3_E_UNSUPPORTED, "cuda: linear: %lld rows is too many for the fallback GEMM", (long long)M);
    return check_launch(b, k_gemm_fallback_kernel(b, grid, block, 0, b->stream, X, ldx, W, bias, Y, y_bf16, ldy, M, N, K));
}

} /* namespace h3cuda */
