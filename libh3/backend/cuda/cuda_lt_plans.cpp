/*
 * The backend's one cache of cuBLASLt plans: every GEMM that goes through cuBLASLt (linear in
 * cuda_gemm.cu, conv_gemm's f32 GEMMs in cuda_decoders.cu, the fp8 GEMMs in cuda_fp8.cu) is the
 * TN form Y^T = W X^T (A = W as K x N, op T; B = X as K x M, op N; D = Y as N x M), f32 compute and
 * scale types, and differs only in what LtKey holds: shapes, strides, dtypes, alignments, a fused
 * f32 bias and the fp8 scale mode. A plan is the descriptors for a key and the heuristic's first
 * algorithm for them; it is made on a key's first use and kept (least recently used out), so a
 * denoising step pays no heuristic queries after the first.
 *
 * Determinism: the algorithm search excludes split-K reductions and always runs with the same
 * workspace, so a key gets the same kernel, hence the same bits, on every run; a key's plan does
 * not depend on which other keys were cached or evicted before it.
 */
#include "backend/cuda/cuda_kernels.h"

#include <stdlib.h>
#include <string.h>

namespace h3cuda {

enum { LT_EMPTY = 0, LT_OK = 1, LT_NONE = 2, LT_REFUSED = 3 };

struct LtEntry {
    LtKey key;
    uint64_t hash, stamp;
    int state; /* LT_*: LT_NONE, cuBLASLt offered no algorithm; LT_REFUSED, a matmul turned it down */
    LtPlan plan;
};

/* Enough for every GEMM shape of a render (the transformer's, the text encoder's, the audio
   decoder's f32 convolutions, fp8 variants) at once. */
#define LT_PLANS 256

struct LtCache {
    LtEntry e[LT_PLANS];
    uint64_t clock;
};

int lt_align(const void *p, int64_t ld_bytes)
{
    const uintptr_t v = (uintptr_t)p | (uintptr_t)ld_bytes;
    int a = 16;
    while (a > 1 && (v & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

void lt_key_init(LtKey *k) { memset(k, 0, sizeof *k); }

static uint64_t key_hash(const LtKey &k)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the key's bytes (lt_key_init zeroes them all) */
    const unsigned char *p = (const unsigned char *)&k;
    for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void plan_clear(LtPlan *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    memset(p, 0, sizeof *p);
}

int lt_plans_init(Backend *b)
{
    b->lt_plans = (LtCache *)calloc(1, sizeof(LtCache));
    if (!b->lt_plans) return fail(b, H3_E_NOMEM, "cuda: out of host memory for the GEMM plan cache");
    return 0;
}

void lt_plans_destroy(Backend *b)
{
    if (!b->lt_plans) return;
    for (int i = 0; i < LT_PLANS; i++)
        if (b->lt_plans->e[i].state != LT_EMPTY) plan_clear(&b->lt_plans->e[i].plan);
    free(b->lt_plans);
    b->lt_plans = NULL;
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

/* The descriptors of k and the heuristic's first algorithm for them. False when cuBLASLt offers
   none (p is left empty). */
static bool plan_make(Backend *b, LtPlan *p, const LtKey &k)
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
        if (k.scale_outer) {
            int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
            if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec) ||
                cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec))
                break;
        }
        if (k.epi_bias) {
            cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
            int32_t bt = CUDA_R_32F;
            if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
                cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt))
                break;
        }
        if (cublasLtMatrixLayoutCreate(&p->la, (cudaDataType)k.a_type, (uint64_t)k.K, (uint64_t)k.N, k.lda)) {
            p->la = NULL;
            break;
        }
        if (cublasLtMatrixLayoutCreate(&p->lb, (cudaDataType)k.b_type, (uint64_t)k.K, (uint64_t)k.M, k.ldb)) {
            p->lb = NULL;
            break;
        }
        if (cublasLtMatrixLayoutCreate(&p->ld, (cudaDataType)k.d_type, (uint64_t)k.N, (uint64_t)k.M, k.ldd)) {
            p->ld = NULL;
            break;
        }
        if (!lt_pick_algo(b, p->op, p->la, p->lb, p->ld, k.align_a, k.align_b, k.align_d, &p->algo)) break;
        ok = true;
    } while (0);
    if (!ok) plan_clear(p);
    return ok;
}

LtPlan *lt_plan(Backend *b, const LtKey &k, bool *refused)
{
    LtCache *c = b->lt_plans;
    const uint64_t h = key_hash(k);
    LtEntry *victim = NULL;
    if (refused) *refused = false;
    for (int i = 0; i < LT_PLANS; i++) {
        LtEntry *e = &c->e[i];
        if (e->state != LT_EMPTY && e->hash == h && memcmp(&e->key, &k, sizeof k) == 0) {
            e->stamp = ++c->clock;
            if (refused) *refused = e->state == LT_REFUSED;
            return e->state == LT_OK ? &e->plan : NULL;
        }
        /* A free slot, else the least recently used entry. */
        if (e->state == LT_EMPTY) {
            if (!victim || victim->state != LT_EMPTY) victim = e;
        } else if (!victim || (victim->state != LT_EMPTY && e->stamp < victim->stamp)) {
            victim = e;
        }
    }
    if (victim->state != LT_EMPTY) plan_clear(&victim->plan);
    memset(victim, 0, sizeof *victim);
    victim->key = k;
    victim->hash = h;
    victim->state = plan_make(b, &victim->plan, k) ? LT_OK : LT_NONE;
    victim->stamp = ++c->clock;
    return victim->state == LT_OK ? &victim->plan : NULL;
}

void lt_plan_refuse(Backend *b, LtPlan *p)
{
    LtCache *c = b->lt_plans;
    for (int i = 0; i < LT_PLANS; i++)
        if (&c->e[i].plan == p && c->e[i].state == LT_OK) {
            plan_clear(p);
            c->e[i].state = LT_REFUSED;
            return;
        }
}

} /* namespace h3cuda */
