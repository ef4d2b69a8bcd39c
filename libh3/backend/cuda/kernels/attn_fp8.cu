/* Kernels of cuda_attn_fp8.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "attn_fp8.h"

namespace h3cuda {

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
__global__ void __launch_bounds__(256) amax3_kernel(const bf16_t *q, const bf16_t *k,
                                                    const bf16_t *v, int64_t ldq, int64_t ldk, int64_t ldv,
                                                    int64_t rows, int64_t cols, int rows_per_block, unsigned *amax)
{
    const bf16_t *x = blockIdx.y == 0 ? q : blockIdx.y == 1 ? k : v;
    const int64_t ld = blockIdx.y == 0 ? ldq : blockIdx.y == 1 ? ldk : ldv;
    const int64_t r0 = (int64_t)blockIdx.x * rows_per_block;
    const int64_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    const int64_t vecs = cols / 8;
    float m = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const uint4 *row = reinterpret_cast<const uint4 *>(x + r * ld);
        for (int64_t i = threadIdx.x; i < vecs; i += 256) {
            const uint4 u = row[i];
            const bf162_t *h = reinterpret_cast<const bf162_t *>(&u);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = bf22f2(h[j]);
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
__global__ void __launch_bounds__(256) quant3_kernel(const bf16_t *q, const bf16_t *k,
                                                     const bf16_t *v, int64_t ldq, int64_t ldk, int64_t ldv,
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
    const bf16_t *x = t == 0 ? q : t == 1 ? k : v;
    const int64_t ld = t == 0 ? ldq : t == 1 ? ldk : ldv;
    const int64_t r = blockIdx.x;
    const uint4 *row = reinterpret_cast<const uint4 *>(x + r * ld);
    uint2 *dst = reinterpret_cast<uint2 *>(out + ((int64_t)t * rows + r) * cols);
    for (int64_t i = threadIdx.x; i < cols / 8; i += 256) {
        const uint4 u = row[i];
        const bf162_t *h = reinterpret_cast<const bf162_t *>(&u);
        uint8_t b[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = bf22f2(h[j]);
            b[2 * j] = f2e4m3(__fdiv_rn(f.x, s));
            b[2 * j + 1] = f2e4m3(__fdiv_rn(f.y, s));
        }
        uint2 w;
        memcpy(&w, b, 8);
        dst[i] = w;
    }
}

/* O (bf16, row stride ldo) = O8 * s_o, 8 values per thread and step. */
__global__ void __launch_bounds__(256) widen_kernel(const uint8_t *o8, int64_t cols, const float *sc,
                                                    bf16_t *o, int64_t ldo)
{
    const float s = out_scale(sc);
    const int64_t r = blockIdx.x;
    const uint2 *src = reinterpret_cast<const uint2 *>(o8 + r * cols);
    uint4 *dst = reinterpret_cast<uint4 *>(o + r * ldo);
    for (int64_t i = threadIdx.x; i < cols / 8; i += 256) {
        const uint2 w = src[i];
        const uint8_t *b = reinterpret_cast<const uint8_t *>(&w);
        bf162_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float lo = e4m3_to_f(b[2 * j]);
            const float hi = e4m3_to_f(b[2 * j + 1]);
            h[j] = f2bf2(__fmul_rn(lo, s), __fmul_rn(hi, s));
        }
        uint4 u;
        memcpy(&u, h, 16);
        dst[i] = u;
    }
}

} /* namespace h3cuda */
