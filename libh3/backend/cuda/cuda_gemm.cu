/*
 * linear: Y[M, N] = X[M, K] W^T (+ bias) through cuBLASLt, bf16 operands, f32 accumulation.
 *
 * Row-major Y = X W^T is, read column-major, Y^T = W X^T: A = W viewed as a K x N column-major
 * matrix and transposed (op T), B = X viewed as K x M (op N), D = Y viewed as N x M. This "TN"
 * form needs no copies and is the layout cuBLASLt's Hopper kernels are tuned for.
 *
 * Plans (descriptors + the chosen algorithm) are cached per shape, strides, dtypes and pointer
 * alignment, so a denoising step pays no heuristic queries after the first. The algorithm search
 * excludes split-K reductions and always runs with the same workspace, so a shape gets the same
 * kernel, hence the same bits, on every run.
 *
 * Fallbacks keep every shape working: when cuBLASLt cannot fuse the f32 bias into a bf16 output
 * (or the bias pointer is not 16-byte aligned) the product goes to an f32 scratch and a small
 * kernel adds the bias and rounds once; when it has no algorithm at all (odd strides, K = 0), a
 * plain tiled kernel computes the same sum.
 */
#include "backend/cuda/cuda_common.cuh"

#include <stdlib.h>
#include <string.h>

namespace h3cuda {

enum { MODE_DIRECT = 0, MODE_F32_SCRATCH = 1, MODE_FALLBACK = 2 };
/* Bias classes of a key: none, fused in the epilogue, added by bias_store. */
enum { BIAS_NONE = 0, BIAS_EPILOGUE = 1, BIAS_KERNEL = 2 };

struct GemmKey {
    int64_t M, N, K, ldx, ldy;
    int y_bf16, bias, ax, ay;
};

struct GemmPlan {
    GemmKey key;
    bool used;
    uint64_t stamp;
    int mode;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};

#define GEMM_PLANS 128

struct GemmCache {
    GemmPlan p[GEMM_PLANS];
    uint64_t clock;
};

static bool key_eq(const GemmKey &a, const GemmKey &b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Alignment class of a pointer plus row stride in bytes, capped at 16 (what the kernels care about). */
static int align_of(const void *p, int64_t ld_bytes)
{
    uintptr_t v = (uintptr_t)p | (uintptr_t)ld_bytes;
    int a = 16;
    while (a > 1 && (v & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

static void plan_clear(GemmPlan *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    memset(p, 0, sizeof *p);
}

int gemm_init(Backend *b)
{
    b->gemm = (GemmCache *)calloc(1, sizeof(GemmCache));
    if (!b->gemm) return fail(b, H3_E_NOMEM, "cuda: out of host memory for the GEMM plan cache");
    return 0;
}

void gemm_destroy(Backend *b)
{
    if (!b->gemm) return;
    for (int i = 0; i < GEMM_PLANS; i++)
        if (b->gemm->p[i].used) plan_clear(&b->gemm->p[i]);
    free(b->gemm);
    b->gemm = NULL;
}

bool lt_pick_algo(Backend *b, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                  cublasLtMatrixLayout_t ld, uint32_t align_a, uint32_t align_b, uint32_t align_cd,
                  cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulPreference_t pref = NULL;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
    uint64_t ws = b->lt_ws_bytes;
    /* No split-K: a reduction over K partitions is not part of the determinism contract. */
    uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    bool ok = false;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    memset(&res, 0, sizeof res);
    if (!cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                              sizeof align_a) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                              sizeof align_b) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_cd,
                                              sizeof align_cd) &&
        !cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_cd,
                                              sizeof align_cd) &&
        cublasLtMatmulAlgoGetHeuristic(b->lt, op, la, lb, ld, ld, pref, 1, &res, &found) == CUBLAS_STATUS_SUCCESS &&
        found >= 1 && res.state == CUBLAS_STATUS_SUCCESS) {
        *algo = res.algo;
        ok = true;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return ok;
}

/* Descriptors and the heuristic's first algorithm for D of type `dt` with row stride ldd (in D's
   elements) and alignment class ad; `epi_bias` fuses an f32 bias. False when cuBLASLt offers no
   algorithm (the plan is left empty). */
static bool try_plan(Backend *b, GemmPlan *p, const GemmKey &k, cudaDataType dt, int64_t ldd, int ad, bool epi_bias)
{
    bool ok = false;
    do {
        if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
            p->op = NULL;
            break;
        }
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))
            break;
        if (epi_bias) {
            cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            int32_t bt = CUDA_R_32F;
            if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
                cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt))
                break;
        }
        if (cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, (uint64_t)k.K, (uint64_t)k.N, k.K)) {
            p->la = NULL;
            break;
        }
        if (cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, (uint64_t)k.K, (uint64_t)k.M, k.ldx)) {
            p->lb = NULL;
            break;
        }
        if (cublasLtMatrixLayoutCreate(&p->ld, dt, (uint64_t)k.N, (uint64_t)k.M, ldd)) {
            p->ld = NULL;
            break;
        }
        /* Weights come from cudaMalloc (256-byte aligned) with row stride K elements. */
        uint32_t aa = (uint32_t)align_of(NULL, k.K * 2), abx = (uint32_t)k.ax, ayd = (uint32_t)ad;
        if (!lt_pick_algo(b, p->op, p->la, p->lb, p->ld, aa, abx, ayd, &p->algo)) break;
        ok = true;
    } while (0);
    if (!ok) {
        GemmKey keep = p->key;
        plan_clear(p);
        p->key = keep;
    }
    return ok;
}

static GemmPlan *get_plan(Backend *b, const GemmKey &k)
{
    GemmCache *c = b->gemm;
    GemmPlan *victim = NULL;
    for (int i = 0; i < GEMM_PLANS; i++) {
        GemmPlan *p = &c->p[i];
        if (p->used && key_eq(p->key, k)) {
            p->stamp = ++c->clock;
            return p;
        }
        /* A free slot, else the least recently used plan. */
        if (!p->used) {
            if (!victim || victim->used) victim = p;
        } else if (!victim || (victim->used && p->stamp < victim->stamp)) {
            victim = p;
        }
    }
    if (victim->used) plan_clear(victim);
    GemmPlan *p = victim;
    memset(p, 0, sizeof *p);
    p->key = k;
    const cudaDataType ydt = k.y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    if (k.bias != BIAS_KERNEL && try_plan(b, p, k, ydt, k.ldy, k.ay, k.bias == BIAS_EPILOGUE))
        p->mode = MODE_DIRECT;
    else if (k.bias != BIAS_NONE && try_plan(b, p, k, CUDA_R_32F, k.N, align_of(NULL, k.N * 4), false))
        p->mode = MODE_F32_SCRATCH;
    else
        p->mode = MODE_FALLBACK;
    p->used = true;
    p->stamp = ++c->clock;
    return p;
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
    const __nv_bfloat16 *Xb;
    int64_t ldx;
    if (X->dtype == H3_DT_F32) {
        __nv_bfloat16 *s = (__nv_bfloat16 *)scratch(b, SCR_XBF16, (size_t)(M * (K > 0 ? K : 1)) * 2);
        if (!s) return -H3_E_NOMEM;
        if (K > 0 && (rc = convert_f32_bf16_2d(b, (const float *)X->data, X->ld, s, K, M, K))) return rc;
        Xb = s;
        ldx = K;
    } else {
        Xb = (const __nv_bfloat16 *)X->data;
        ldx = M == 1 && X->ld < K ? K : X->ld;
    }
    if (K == 0)
        return gemm_fallback(b, Xb, ldx, (const __nv_bfloat16 *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);

    GemmKey key;
    memset(&key, 0, sizeof key);
    key.M = M;
    key.N = N;
    key.K = K;
    key.ldx = ldx;
    key.ldy = ldy;
    key.y_bf16 = y_bf16;
    key.bias = !bias ? BIAS_NONE : ((uintptr_t)bias & 15) ? BIAS_KERNEL : BIAS_EPILOGUE;
    key.ax = align_of(Xb, ldx * 2);
    key.ay = align_of(Y->data, ldy * (y_bf16 ? 2 : 4));
    GemmPlan *p = get_plan(b, key);

    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st;
    switch (p->mode) {
    case MODE_DIRECT:
        if (bias && (st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)))
            return fail_cublas(b, st, "linear: setting the bias");
        st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, Xb, p->lb, &zero, Y->data, p->ld, Y->data, p->ld,
                            &p->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
            /* The heuristic's algorithm refused these operands after all: this shape takes the
               fallback from now on (nothing was launched, so nothing is half done). */
            GemmKey keep = p->key;
            plan_clear(p);
            p->key = keep;
            p->used = true;
            p->stamp = ++b->gemm->clock;
            p->mode = MODE_FALLBACK;
            return gemm_fallback(b, Xb, ldx, (const __nv_bfloat16 *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);
        }
        return st == CUBLAS_STATUS_SUCCESS ? 0 : fail_cublas(b, st, "linear");
    case MODE_F32_SCRATCH: {
        float *t = (float *)scratch(b, SCR_YF32, (size_t)(M * N) * 4);
        if (!t) return -H3_E_NOMEM;
        st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, Xb, p->lb, &zero, t, p->ld, t, p->ld, &p->algo,
                            b->lt_ws, b->lt_ws_bytes, b->stream);
        if (st != CUBLAS_STATUS_SUCCESS) return fail_cublas(b, st, "linear");
        return bias_store(b, t, bias, Y->data, y_bf16, ldy, M, N);
    }
    default:
        return gemm_fallback(b, Xb, ldx, (const __nv_bfloat16 *)W->data, bias, Y->data, y_bf16, ldy, M, N, K);
    }
}

/* ---- the fallback: a plain tiled GEMM ------------------------------------------------------ */

#define FB_T 16

/* One output per thread, K in tiles of 16 staged through shared memory; the sum runs over k in
   order, so the result is deterministic. Only used where cuBLASLt declines a shape. */
__global__ void gemm_fallback_kernel(const __nv_bfloat16 *__restrict__ X, int64_t ldx,
                                     const __nv_bfloat16 *__restrict__ W, const float *__restrict__ bias, void *Y,
                                     int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K)
{
    __shared__ float xs[FB_T][FB_T + 1], ws[FB_T][FB_T + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t m = (int64_t)blockIdx.y * FB_T + ty, n = (int64_t)blockIdx.x * FB_T + tx;
    const int64_t wn = (int64_t)blockIdx.x * FB_T + ty; /* the W row this thread stages */
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += FB_T) {
        const int64_t k = k0 + tx;
        xs[ty][tx] = m < M && k < K ? __bfloat162float(X[m * ldx + k]) : 0.0f;
        ws[ty][tx] = wn < N && k < K ? __bfloat162float(W[wn * K + k]) : 0.0f;
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

int gemm_fallback(Backend *b, const __nv_bfloat16 *X, int64_t ldx, const __nv_bfloat16 *W, const float *bias, void *Y,
                  int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K)
{
    dim3 block(FB_T, FB_T), grid((unsigned)((N + FB_T - 1) / FB_T), (unsigned)((M + FB_T - 1) / FB_T));
    if (grid.y > 65535) return fail(b, H3_E_UNSUPPORTED, "cuda: linear: %lld rows is too many for the fallback GEMM", (long long)M);
    gemm_fallback_kernel<<<grid, block, 0, b->stream>>>(X, ldx, W, bias, Y, y_bf16, ldy, M, N, K);
    return check_launch(b, "gemm_fallback_kernel");
}

} /* namespace h3cuda */
