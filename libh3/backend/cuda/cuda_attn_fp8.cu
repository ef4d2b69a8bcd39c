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
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sdpa.h"

#include <cuda_fp8.h>

namespace h3cuda {

namespace {

/* The scalars block (64-byte slots, see h3_cudnn_sdpa_fp8): [0..6) cuDNN's scales at 16-float
   spacing, then the amax outputs, then the three input maxima as unsigned bit patterns. */
constexpr int SC_FLOATS = 6 * 16;      /* descale q, k, v, descale s, scale s, scale o */
constexpr int AMAX_OUT = SC_FLOATS;    /* cuDNN's amax_s, amax_o (at +0 and +4) */
constexpr int AMAX_IN = SC_FLOATS + 8; /* max|Q|, max|K|, max|V| as uint bits */
constexpr int SCALARS = SC_FLOATS + 16;

/* e4m3_scale of a maximum held as its bit pattern (the atomicMax of amax3_kernel). */
__device__ __forceinline__ float scale_of(unsigned amax_bits) { return e4m3_scale(__uint_as_float(amax_bits)); }

/* The output's scale: V's with the headroom of the file comment. */
__device__ __forceinline__ float out_scale(const float *sc)
{
    return 2.0f * scale_of(reinterpret_cast<const unsigned *>(sc + AMAX_IN)[2]);
}

/* max|x| over rows x cols of Q, K and V (blockIdx.y picks which), 8 bf16 (16 bytes) per load.
   Non-negative floats order like their bit patterns, so atomicMax on the bits is a float max;
   NaN is skipped (fmaxf) as the fp8 weight scales skip it. */
__global__ void __launch_bounds__(256) amax3_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                    const __nv_bfloat16 *v, int64_t ldq, int64_t ldk, int64_t ldv,
                                                    int64_t rows, int64_t cols, int rows_per_block, unsigned *amax)
{
    const __nv_bfloat16 *x = blockIdx.y == 0 ? q : blockIdx.y == 1 ? k : v;
    const int64_t ld = blockIdx.y == 0 ? ldq : blockIdx.y == 1 ? ldk : ldv;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    const int64_t vecs = cols / 8;
    float m = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const uint4 *row = reinterpret_cast<const uint4 *>(x + r * ld);
        for (int64_t i = threadIdx.x; i < vecs; i += 256) {
            const uint4 u = row[i];
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = __bfloat1622float2(h[j]);
                m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
    }
    __shared__ float sh[8];
    const float t = block_max256(m, sh);
    if (threadIdx.x == 0) atomicMax(&amax[blockIdx.y], __float_as_uint(t));
}

/* One row of one tensor per block (blockIdx.y: Q, K, V): x8 = e4m3(x / s), 8 values per thread
   and step, packed rows (ld = cols). Block (0, 0) also writes cuDNN's scalars. */
__global__ void __launch_bounds__(256) quant3_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                     const __nv_bfloat16 *v, int64_t ldq, int64_t ldk, int64_t ldv,
                                                     int64_t rows, int64_t cols, float *sc, uint8_t *out)
{
    const unsigned *amax = reinterpret_cast<const unsigned *>(sc + AMAX_IN);
    const int t = blockIdx.y;
    const float s = scale_of(amax[t]);
    if (blockIdx.x == 0 && t == 0 && threadIdx.x < 6) {
        const float val[6] = {scale_of(amax[0]), scale_of(amax[1]), scale_of(amax[2]), 1.0f / E4M3_MAX, E4M3_MAX,
                              __fdiv_rn(1.0f, out_scale(sc))};
        sc[16 * threadIdx.x] = val[threadIdx.x];
    }
    const __nv_bfloat16 *x = t == 0 ? q : t == 1 ? k : v;
    const int64_t ld = t == 0 ? ldq : t == 1 ? ldk : ldv;
    const int64_t r = blockIdx.x;
    const uint4 *row = reinterpret_cast<const uint4 *>(x + r * ld);
    uint2 *dst = reinterpret_cast<uint2 *>(out + ((int64_t)t * rows + r) * cols);
    for (int64_t i = threadIdx.x; i < cols / 8; i += 256) {
        const uint4 u = row[i];
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
        uint8_t b[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = __bfloat1622float2(h[j]);
            b[2 * j] = __nv_cvt_float_to_fp8(__fdiv_rn(f.x, s), __NV_SATFINITE, __NV_E4M3);
            b[2 * j + 1] = __nv_cvt_float_to_fp8(__fdiv_rn(f.y, s), __NV_SATFINITE, __NV_E4M3);
        }
        uint2 w;
        memcpy(&w, b, 8);
        dst[i] = w;
    }
}

/* O (bf16, row stride ldo) = O8 * s_o, 8 values per thread and step. */
__global__ void __launch_bounds__(256) widen_kernel(const uint8_t *o8, int64_t cols, const float *sc,
                                                    __nv_bfloat16 *o, int64_t ldo)
{
    const float s = out_scale(sc);
    const int64_t r = blockIdx.x;
    const uint2 *src = reinterpret_cast<const uint2 *>(o8 + r * cols);
    uint4 *dst = reinterpret_cast<uint4 *>(o + r * ldo);
    for (int64_t i = threadIdx.x; i < cols / 8; i += 256) {
        const uint2 w = src[i];
        const uint8_t *b = reinterpret_cast<const uint8_t *>(&w);
        __nv_bfloat162 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float lo = __half2float(__nv_cvt_fp8_to_halfraw(b[2 * j], __NV_E4M3));
            const float hi = __half2float(__nv_cvt_fp8_to_halfraw(b[2 * j + 1], __NV_E4M3));
            h[j] = __floats2bfloat162_rn(__fmul_rn(lo, s), __fmul_rn(hi, s));
        }
        uint4 u;
        memcpy(&u, h, 16);
        dst[i] = u;
    }
}

} /* namespace */

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
    cudaError_t e = cudaMemsetAsync(sc + AMAX_IN, 0, 3 * sizeof(unsigned), b->stream);
    if (e != cudaSuccess) return fail_cuda(b, e, "fp8 attention: clearing the maxima");
    const int rpb = 16;
    const dim3 ga((unsigned)((L + rpb - 1) / rpb), 3);
    amax3_kernel<<<ga, 256, 0, b->stream>>>((const __nv_bfloat16 *)Q->data, (const __nv_bfloat16 *)K->data,
                                            (const __nv_bfloat16 *)V->data, Q->ld, K->ld, V->ld, L, A, rpb,
                                            (unsigned *)(sc + AMAX_IN));
    int rc = check_launch(b, "amax3_kernel");
    if (rc) return rc;
    const dim3 gq((unsigned)L, 3);
    quant3_kernel<<<gq, 256, 0, b->stream>>>((const __nv_bfloat16 *)Q->data, (const __nv_bfloat16 *)K->data,
                                             (const __nv_bfloat16 *)V->data, Q->ld, K->ld, V->ld, L, A, sc, q8);
    if ((rc = check_launch(b, "quant3_kernel"))) return rc;
    char why[400];
    const int crc = h3_cudnn_sdpa_fp8(b->stream, q8, k8, v8, o8, sc, sc + AMAX_OUT, L, L, heads, kv_heads, D, A, A, A,
                                      A, scale, why, sizeof why);
    if (crc) return fail(b, -crc, "cuda: fp8 attention: %s", why);
    widen_kernel<<<(unsigned)L, 256, 0, b->stream>>>(o8, A, sc, (__nv_bfloat16 *)O->data, O->ld);
    return check_launch(b, "widen_kernel");
}

} /* namespace h3cuda */
