/*
 * Flash attention for libh3's CUDA backend: O = softmax(scale * Q K^T [+ causal mask]) V per head,
 * bf16 operands, f32 arithmetic, memory linear in the number of tokens, no atomics.
 *
 * Algorithm (the online-softmax formulation of attention: Milakov & Gimelshein 2018, Dao et al.
 * 2022). A thread block owns BM query rows of one head and streams that head's keys and values
 * through shared memory in tiles of BN rows. For each tile it computes the scores S = Q K^T on the
 * tensor cores, and for each query row keeps a running maximum m and a running sum l of
 * exp(s - m): when a tile raises the maximum, the partial output and l are rescaled by
 * exp(m_old - m_new) before P V of the tile is added. After the last tile O = acc / l. Nothing of
 * size Lq x Lk is ever stored. Scores are kept in the exp2 domain (scale * log2 e folded into one
 * multiply-add) so every exponential is a single ex2.approx.
 *
 * Tiling. 4 warps (128 threads); each warp owns BM/4 query rows as m16 tiles, so the softmax
 * statistics of a row live in the 4 lanes that hold it (two shuffles reduce a row) and no warp
 * ever waits for another between tiles except at the two barriers that hand over the K and V
 * buffers.
 *   - S = Q K^T: mma.sync m16n8k16 (bf16 in, f32 accumulate). Q fragments come from shared memory
 *     (ldmatrix) or, where registers allow (D = 64), are loaded once and kept in registers; K
 *     fragments are ldmatrix'd from the row-major K tile, which is already the "col" B operand.
 *   - O += P V: the f32 accumulator layout of an m16n8 score tile is, pair for pair, the A
 *     operand layout of an m16k16 mma, so P goes from registers to the next mma without touching
 *     shared memory (two adjacent n8 score tiles form one k16 slice). V fragments are loaded with
 *     ldmatrix.trans from the row-major V tile.
 *   - Shared memory rows are 16-byte chunks XOR-swizzled by row (chunk ^ (row & 7)), so the 8 rows
 *     an ldmatrix phase reads, and the chunks cp.async writes, fall in distinct banks without
 *     padding.
 *   - Pipeline: K and V each have one buffer, filled with cp.async (16 B per thread per copy).
 *     While S of tile j is computed, V of tile j is in flight; while P V of tile j runs, K of
 *     tile j + 1 is in flight. Each handover is one cp.async.wait_group + __syncthreads.
 *
 * Kernels (one template):
 *   D = 128: BM = 128, BN = 64, Q from shared memory (O 128 + S 64 registers per thread);
 *            64 KiB of shared memory, two blocks per SM.
 *   D = 64:  BM = 128, BN = 64, Q in registers.
 *   generic: any D <= 256, padded in shared memory to DP = 32, 64, 128 or 256 with zeros (padding
 *            adds nothing to a dot product and its output columns are not stored); BM = 64; loads
 *            through cp.async when rows are 16-byte aligned and D % 8 == 0, otherwise element by
 *            element. Used for odd head dims (the test models' 14, 18), misaligned views, D != 64/128.
 * All three take GQA (query head h reads kv head h / (heads / kv_heads)) and the causal mask
 * (query i sees keys j <= i + Lk - Lq, the CPU backend's convention; a row that sees no key
 * gets zeros). Blocks are ordered query tile fastest, so the blocks resident at once share one
 * head's K and V in L2.
 *
 * Rounding: P is rounded to bf16 for the P V product (the tensor cores take bf16); the row sum l
 * uses the f32 values. The result differs from an f64 reference by about the bf16 resolution of
 * O itself.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/attention.h"

#include <stdio.h>

#include <math.h>

namespace h3cuda {
/* ---- launch -------------------------------------------------------------------------------- */

/* One flash_kernel instantiation: its declaration (cuda_kernels.h), made during static
   initialisation for every instantiation the dispatch below can reach, so the module lists them
   all before it compiles. */
static std::string flash_name(int DP, int BM, int BN, int NW, bool QREG, bool CAUSAL, bool ASYNC, bool PAD, bool OBF16)
{
    char s[160];
    snprintf(s, sizeof s, "flash_kernel<%d, %d, %d, %d, %s, %s, %s, %s, %s>", DP, BM, BN, NW, QREG ? "true" : "false",
             CAUSAL ? "true" : "false", ASYNC ? "true" : "false", PAD ? "true" : "false", OBF16 ? "true" : "false");
    return s;
}

template <int DP, int BM, int BN, bool QREG, bool CAUSAL, bool ASYNC, bool PAD, bool OBF16> struct Flash {
    static constexpr int NW = 4;
    static const Kernel<AttnArgs> k;
};
template <int DP, int BM, int BN, bool QREG, bool CAUSAL, bool ASYNC, bool PAD, bool OBF16>
const Kernel<AttnArgs> Flash<DP, BM, BN, QREG, CAUSAL, ASYNC, PAD, OBF16>::k(
    MOD_ATTENTION, flash_name(DP, BM, BN, Flash::NW, QREG, CAUSAL, ASYNC, PAD, OBF16), "AttnArgs");

template <int DP, int BM, int BN, bool QREG, bool CAUSAL, bool ASYNC, bool PAD, bool OBF16>
static int launch(Backend *b, const AttnArgs &a, int heads)
{
    typedef Flash<DP, BM, BN, QREG, CAUSAL, ASYNC, PAD, OBF16> F;
    constexpr int NW = F::NW;
    const size_t smem = (size_t)(BM + 2 * BN) * DP * sizeof(bf16_t);
    if (smem > b->smem_optin)
        return fail(b, H3_E_UNSUPPORTED, "cuda: attention: needs %zu bytes of shared memory per block, the GPU has %zu",
                    smem, b->smem_optin);
    if (smem > 48 * 1024) {
        int rc = F::k.max_smem(b, smem);
        if (rc) return rc;
    }
    dim3 grid((unsigned)((a.Lq + BM - 1) / BM), (unsigned)heads);
    return check_launch(b, F::k(b, grid, NW * 32, smem, b->stream, a));
}

/* Every (causal, output dtype) pair of one tile configuration. */
template <int DP, int BM, int BN, bool QREG, bool ASYNC, bool PAD>
static int launch_any(Backend *b, const AttnArgs &a, int heads, bool causal, bool obf16)
{
    if (causal)
        return obf16 ? launch<DP, BM, BN, QREG, true, ASYNC, PAD, true>(b, a, heads)
                     : launch<DP, BM, BN, QREG, true, ASYNC, PAD, false>(b, a, heads);
    return obf16 ? launch<DP, BM, BN, QREG, false, ASYNC, PAD, true>(b, a, heads)
                 : launch<DP, BM, BN, QREG, false, ASYNC, PAD, false>(b, a, heads);
}

template <bool ASYNC>
static int launch_generic(Backend *b, const AttnArgs &a, int heads, bool causal, bool obf16)
{
    if (a.D <= 32) return launch_any<32, 64, 64, false, ASYNC, true>(b, a, heads, causal, obf16);
    if (a.D <= 64) return launch_any<64, 64, 64, false, ASYNC, true>(b, a, heads, causal, obf16);
    if (a.D <= 128) return launch_any<128, 64, 64, false, ASYNC, true>(b, a, heads, causal, obf16);
    return launch_any<256, 64, 32, false, ASYNC, true>(b, a, heads, causal, obf16);
}

int attention(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D, float scale,
              bool causal, const h3_bt *O)
{
    int rc;
    if ((rc = check_view(b, "attention", "Q", Q)) || (rc = check_view(b, "attention", "K", K)) ||
        (rc = check_view(b, "attention", "V", V)) || (rc = check_view(b, "attention", "O", O)))
        return rc;
    /* The kernels take bf16 operands; f32 ones (the text encoder's, the video decoder's) are rounded
       once into scratch first (cuda_decoders.cu), as linear rounds an f32 X. */
    if (Q->dtype != H3_DT_BF16 || K->dtype != H3_DT_BF16 || V->dtype != H3_DT_BF16)
        return attention_round_operands(b, Q, K, V, heads, kv_heads, D, scale, causal, O);
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads)
        return fail(b, H3_E_INVALID, "cuda: attention: %d heads, %d kv heads", heads, kv_heads);
    if (D <= 0 || D > 256)
        return fail(b, H3_E_UNSUPPORTED, "cuda: attention: head dim %d (the kernels take 1 to 256)", D);
    if (heads > 65535) return fail(b, H3_E_UNSUPPORTED, "cuda: attention: %d heads (at most 65535)", heads);
    if (!(scale > 0.0f) || !isfinite(scale))
        return fail(b, H3_E_INVALID, "cuda: attention: scale must be positive and finite, got %g", (double)scale);
    const int64_t A = (int64_t)heads * D, AK = (int64_t)kv_heads * D;
    if (Q->cols < A || O->cols < A || K->cols < AK || V->cols < AK || K->rows != V->rows || O->rows < Q->rows)
        return fail(b, H3_E_INVALID,
                    "cuda: attention: Q %lld x %lld, K %lld x %lld, V %lld x %lld, O %lld x %lld do not fit %d heads "
                    "(%d kv) of %d",
                    (long long)Q->rows, (long long)Q->cols, (long long)K->rows, (long long)K->cols, (long long)V->rows,
                    (long long)V->cols, (long long)O->rows, (long long)O->cols, heads, kv_heads, D);
    const int64_t Lq = Q->rows, Lk = K->rows;
    if (Lq == 0) return 0;
    if (Lq > (1 << 30) || Lk > (1 << 30))
        return fail(b, H3_E_UNSUPPORTED, "cuda: attention: %lld x %lld tokens is too many", (long long)Lq, (long long)Lk);
    const bool obf16 = O->dtype == H3_DT_BF16;
    const size_t oes = obf16 ? 2 : 4;
    if (Lk == 0) {
        /* No keys: every output row is zero, as on the CPU. */
        CUresult e = cu_memset2d(O->data, (size_t)O->ld * oes, 0, (size_t)A * oes, (size_t)Lq, b->stream);
        return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "attention: clearing the output");
    }
    /* fp8 attention (the DiT's main blocks under H3_OPT_FP8_ATTENTION): cuDNN or an error, never a
       silent bf16 fallback, so what was asked for is what ran. */
    if (b->base.attn_precision == H3_PRECISION_FP8)
        return attention_fp8(b, Q, K, V, heads, kv_heads, D, scale, causal, O);
    if (b->base.attn_precision != H3_PRECISION_DEFAULT)
        return fail(b, H3_E_UNSUPPORTED, "cuda: attention precision %d", b->base.attn_precision);
    if (b->attn_impl != ATTN_OWN) {
        char why[400];
        int crc = -H3_E_UNSUPPORTED;
        if (obf16)
            crc = h3_cudnn_sdpa(&b->cudnn, b->stream, Q->data, K->data, V->data, O->data, Lq, Lk, heads, kv_heads, D, Q->ld, K->ld,
                                V->ld, O->ld, scale, causal ? 1 : 0, why, sizeof why);
        else
            snprintf(why, sizeof why, "cudnn: the output must be bf16, not %s", dtname(O->dtype));
        if (crc == 0) return 0;
        if (b->attn_impl == ATTN_CUDNN)
            return fail(b, -crc, "cuda: attention (H3_CUDA_ATTENTION=cudnn): %s", why);
        /* auto: cuDNN cannot take this call (no cuDNN, f32 output, a shape it refuses): the own
           kernel runs it. */
    }
    AttnArgs a;
    a.q = (const bf16_t *)Q->data;
    a.k = (const bf16_t *)K->data;
    a.v = (const bf16_t *)V->data;
    a.o = O->data;
    a.ldq = Q->ld;
    a.ldk = K->ld;
    a.ldv = V->ld;
    a.ldo = O->ld;
    a.Lq = (int)Lq;
    a.Lk = (int)Lk;
    a.group = heads / kv_heads;
    a.D = D;
    a.off = (int)(Lk - Lq);
    a.sl2 = scale * 1.4426950408889634f;
    a.o_pairs = D % 2 == 0 && O->ld % 2 == 0 && ((uintptr_t)O->data % (2 * oes)) == 0;
    /* cp.async moves 16-byte chunks: rows and head offsets must be 16-byte aligned. */
    const bool vec = D % 8 == 0 && aligned16(Q->data) && aligned16(K->data) && aligned16(V->data) &&
                     Q->ld % 8 == 0 && K->ld % 8 == 0 && V->ld % 8 == 0;
    if (vec && D == 128) return launch_any<128, 128, 64, false, true, false>(b, a, heads, causal, obf16);
    if (vec && D == 64) return launch_any<64, 128, 64, true, true, false>(b, a, heads, causal, obf16);
    return vec ? launch_generic<true>(b, a, heads, causal, obf16) : launch_generic<false>(b, a, heads, causal, obf16);
}

} /* namespace h3cuda */
