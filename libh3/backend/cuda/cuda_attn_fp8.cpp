/*
 * fp8 attention (H3_OPT_FP8_ATTENTION; backend.h's attn_precision = H3_PRECISION_FP8): the main
 * transformer blocks' self-attention through cuDNN's fp8 SDPA (cuda_sdpa_cudnn.cu), which on
 * Hopper runs both products on e4m3 tensor cores at about twice the bf16 rate. At 37.8k tokens
 * attention is 61 % of a block's FLOPs, so this, not the fp8 GEMMs, is what shortens a block.
 *
 * Scaling. cuDNN's Hopper kernel takes one scale per tensor (no per-head or per-token scales):
 *  - Q, K, V: s = max|x| / 448 over the whole tensor (448 is e4m3's largest finite value), x8 =
 *    e4m3(x / s) with saturation; cuDNN multiplies the products back by the descales.
 *  - the softmax probabilities P lie in [0, 1]: they enter the second product as e4m3(P * 448)
 *    (scale_s = 448, descale_s = 1/448), no measurement needed.
 *  - the output: every row of O is a convex combination of V's rows, so |O| <= max|V|; the
 *    rounded e4m3 probabilities can push a row's weights a little past a sum of 1, so the output
 *    scale keeps a factor of 2 of headroom (a power of two: it only shifts exponents): s_o =
 *    2 s_v, O8 = e4m3(O / s_o), and a last pass widens O8 * s_o to bf16 for the out projection.
 *    (Hopper's fp8 SDPA has no bf16 output.)
 * The maxima are reduced on the device and every scale is computed there, so nothing waits for
 * the host. Max is exact in any order, so the atomic reduction is deterministic, and every other
 * kernel does fixed work per thread: fp8 attention gives the same bytes run after run.
 *
 * Memory: e4m3 copies of Q, K, V and O (4 bytes per row element) in one scratch buffer, plus a
 * few scalars.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/attn_fp8.h"


namespace h3cuda {

/* The kernels of kernels/attn_fp8.cu this file launches (cuda_kernels.h). */
H3K(k_amax3_kernel, MOD_ATTN_FP8, "amax3_kernel", const bf16_t *, const bf16_t *, const bf16_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int, unsigned *);
H3K(k_quant3_kernel, MOD_ATTN_FP8, "quant3_kernel", const bf16_t *, const bf16_t *, const bf16_t *, int64_t, int64_t, int64_t, int64_t, int64_t, float *, uint8_t *);
H3K(k_widen_kernel, MOD_ATTN_FP8, "widen_kernel", const uint8_t *, int64_t, const float *, bf16_t *, int64_t);


/* attention() under attn_precision FP8 (the checks of attention() have passed: bf16 Q, K, V,
   shapes that fit, Lq > 0, Lk > 0). */
int attention_fp8(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D,
                  float scale, bool causal, const h3_bt *O)
{
    if (causal) return fail(b, H3_E_UNSUPPORTED, "cuda: fp8 attention has no causal mask");
    if (O->dtype != H3_DT_BF16) return fail(b, H3_E_UNSUPPORTED, "cuda: fp8 attention writes bf16, not %s", dtname(O->dtype));
    if (heads != kv_heads || Q->rows != K->rows)
        return fail(b, H3_E_UNSUPPORTED, "cuda: fp8 attention is self-attention over equal heads (%d, %d kv; %lld x %lld)",
                    heads, kv_heads, (long long)Q->rows, (long long)K->rows);
    const int64_t L = Q->rows, A = (int64_t)heads * D;
    if (D % 16 || A % 16 || Q->ld % 8 || K->ld % 8 || V->ld % 8 || O->ld % 8 || !aligned16(Q->data) ||
        !aligned16(K->data) || !aligned16(V->data) || !aligned16(O->data))
        return fail(b, H3_E_UNSUPPORTED,
                    "cuda: fp8 attention needs head dim and width in multiples of 16 and 16-byte aligned rows (head "
                    "dim %d, %d heads)",
                    D, heads);
    if (L > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: fp8 attention: %lld tokens is too many", (long long)L);
    /* [scalars | Q8 | K8 | V8 | O8], packed e4m3 rows (A % 16 == 0 keeps each part 16-byte
       aligned; quant3_kernel writes part t at t * L * A). */
    const size_t head = 1024, part = (size_t)(L * A);
    uint8_t *buf = (uint8_t *)scratch(b, SCR_ATTN8, head + 4 * part);
    if (!buf) return -H3_E_NOMEM;
    float *sc = (float *)buf;
    uint8_t *q8 = buf + head, *k8 = q8 + part, *v8 = k8 + part, *o8 = v8 + part;
    static_assert(SCALARS * sizeof(float) <= 1024, "scalars fit the head");
    CUresult e = cu_memset(sc + AMAX_IN, 0, 3 * sizeof(unsigned), b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "fp8 attention: clearing the maxima");
    const int rpb = 16;
    const dim3 ga((unsigned)((L + rpb - 1) / rpb), 3);
    k_amax3_kernel(b, ga, 256, 0, b->stream, (const bf16_t *)Q->data, (const bf16_t *)K->data,
                                            (const bf16_t *)V->data, Q->ld, K->ld, V->ld, L, A, rpb,
                                            (unsigned *)(sc + AMAX_IN));
    int rc = check_launch(b, "amax3_kernel");
    if (rc) return rc;
    const dim3 gq((unsigned)L, 3);
    k_quant3_kernel(b, gq, 256, 0, b->stream, (const bf16_t *)Q->data, (const bf16_t *)K->data,
                                             (const bf16_t *)V->data, Q->ld, K->ld, V->ld, L, A, sc, q8);
    if ((rc = check_launch(b, "quant3_kernel"))) return rc;
    char why[400];
    const int crc = h3_cudnn_sdpa_fp8(&b->cudnn, b->stream, q8, k8, v8, o8, sc, sc + AMAX_OUT, L, L, heads, kv_heads, D, A, A, A,
                                      A, scale, why, sizeof why);
    if (crc) return fail(b, -crc, "cuda: fp8 attention: %s", why);
    return check_launch(b, k_widen_kernel(b, (unsigned)L, 256, 0, b->stream, o8, A, sc, (bf16_t *)O->data, O->ld));
}

} /* namespace h3cuda */
