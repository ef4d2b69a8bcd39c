/*
 * The one header of the CUDA backend's kernels (kernels/NAME.cu), compiled at run time by NVRTC.
 * NVRTC has no cuda_bf16.h / cuda_fp16.h / cuda_fp8.h built in, so the 16-bit and 8-bit types the
 * kernels use are defined here with the conversions they need, written as the same PTX
 * instructions NVIDIA's headers use on sm_80+ (cvt.rn.bf16.f32, cvt.rn.bf16x2.f32, cvt.f32.f16,
 * cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 on sm_89+), so every value rounds to the
 * same bits as before. Also the fixed-width integers (no <stdint.h> in NVRTC) and the device
 * helpers several kernel files share. Nothing here may need a header from outside this folder.
 */
#ifndef H3K_H
#define H3K_H

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t; /* LP64, as the host's int64_t: kernel signatures are checked against the host's */
typedef unsigned long uint64_t;
typedef unsigned long uintptr_t;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000) /* math.h's +inf */
#endif

namespace h3cuda {

/* bf16 and f16 as raw bits; two bf16 in one 32-bit word (the first in the low half). */
struct alignas(2) bf16_t {
    uint16_t x;
};
struct alignas(4) bf162_t {
    uint16_t x, y;
};
struct alignas(2) f16_t {
    uint16_t x;
};
typedef uint8_t e4m3; /* fp8 e4m3 bits */

/* f32 -> bf16, round to nearest even (NaN stays NaN). */
static __device__ __forceinline__ bf16_t f2bf(float f)
{
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}
/* bf16 -> f32, exact. */
static __device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float((uint32_t)h.x << 16); }
/* (lo, hi) -> two bf16, each rounded to nearest even. */
static __device__ __forceinline__ bf162_t f2bf2(float lo, float hi)
{
    uint32_t u;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(u) : "f"(lo), "f"(hi));
    bf162_t r;
    r.x = (uint16_t)(u & 0xFFFFu);
    r.y = (uint16_t)(u >> 16);
    return r;
}
static __device__ __forceinline__ float2 bf22f2(bf162_t h)
{
    return make_float2(__uint_as_float((uint32_t)h.x << 16), __uint_as_float((uint32_t)h.y << 16));
}
/* f16 -> f32, exact. */
static __device__ __forceinline__ float h2f(f16_t h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x));
    return f;
}

/* f32 -> e4m3, round to nearest even, saturating to +-448 (inf too); NaN -> 0x7F. */
static __device__ __forceinline__ e4m3 f2e4m3(float x)
{
#if __CUDA_ARCH__ >= 890
    uint16_t r;
    asm("{cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;}" : "=h"(r) : "f"(x), "f"(0.0f));
    return (e4m3)(r & 0xFFu);
#else
    /* Older GPUs have no fp8 instruction (nor do they run fp8: the backend refuses it below 8.9);
       the same rounding in integer arithmetic, so the kernels still compile and agree. */
    uint32_t u = __float_as_uint(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    u &= 0x7FFFFFFFu;
    if (u > 0x7F800000u) return (e4m3)0x7Fu;
    if (u >= 0x43E00000u) return (e4m3)(sign | 0x7Eu); /* >= 448 (and inf): the largest finite */
    const int e = (int)(u >> 23) - 127;
    uint32_t r;
    if (e >= -6) { /* normal in e4m3: 3 mantissa bits kept of 23 */
        const uint32_t m = u & 0x7FFFFFu, keep = m >> 20, rest = m & 0xFFFFFu;
        r = ((uint32_t)(e + 7) << 3) | keep;
        if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) r++;
    } else { /* subnormal: value / 2^-9, rounded to nearest even */
        if (e < -11) return (e4m3)sign; /* below half the smallest subnormal (2^-10) */
        const uint32_t m = (u & 0x7FFFFFu) | 0x800000u;
        const int sh = 23 - 9 - e; /* bits below 2^-9 */
        const uint32_t keep = m >> sh, rest = m & ((1u << sh) - 1u), halfway = 1u << (sh - 1);
        r = keep;
        if (rest > halfway || (rest == halfway && (keep & 1u))) r++;
    }
    if (r > 0x7Eu) r = 0x7Eu;
    return (e4m3)(sign | r);
#endif
}

/* e4m3 -> f32, exact (through f16 as NVIDIA's headers do; NaN -> NaN). */
static __device__ __forceinline__ float e4m3_to_f(e4m3 v)
{
    f16_t h;
#if __CUDA_ARCH__ >= 890
    uint32_t r;
    asm("{cvt.rn.f16x2.e4m3x2 %0, %1;}" : "=r"(r) : "h"((uint16_t)v));
    h.x = (uint16_t)(r & 0xFFFFu);
#else
    const uint32_t s = ((uint32_t)v & 0x80u) << 8, a = (uint32_t)v & 0x7Fu;
    uint32_t ex = a >> 3, m = a & 7u;
    if (a == 0x7Fu) {
        h.x = 0x7FFFu;
    } else if (ex == 0) {
        if (m == 0) {
            h.x = (uint16_t)s;
        } else { /* subnormal m * 2^-9: normalise */
            int e = -6;
            while (!(m & 8u)) m <<= 1, e--;
            h.x = (uint16_t)(s | ((uint32_t)(e + 15) << 10) | ((m & 7u) << 7));
        }
    } else {
        h.x = (uint16_t)(s | ((ex - 7 + 15) << 10) | (m << 7));
    }
#endif
    return h2f(h);
}

/* ---- helpers shared by several kernel files ------------------------------------------------- */

#define E4M3_MAX 448.0f /* e4m3's largest finite value */

/* The scale that maps [-amax, amax] onto e4m3: amax / 448 correctly rounded, or 1 when amax is 0 or
   not finite (x / 1 then saturates). The host copy of the rule is core/fp8.c's. */
static __device__ __forceinline__ float e4m3_scale(float amax)
{
    return amax > 0.0f && isfinite(amax) ? __fdiv_rn(amax, E4M3_MAX) : 1.0f;
}

/* The largest v over a block of 256 threads, in every thread (sh: 8 floats of shared memory). Max
   gives the same value in any order, and fmaxf skips NaN. */
static __device__ __forceinline__ float block_max256(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) t = fmaxf(t, sh[i]);
    return t;
}

static __device__ __forceinline__ float ld_elem(const void *p, int is_bf16, int64_t i)
{
    return is_bf16 ? bf2f(static_cast<const bf16_t *>(p)[i]) : static_cast<const float *>(p)[i];
}

static __device__ __forceinline__ void st_elem(void *p, int is_bf16, int64_t i, float v)
{
    if (is_bf16)
        static_cast<bf16_t *>(p)[i] = f2bf(v);
    else
        static_cast<float *>(p)[i] = v;
}

/* Sum over a block of NT threads in a fixed order: a butterfly inside each warp, then the warps'
   partial sums in warp order; every thread gets the same total, the same bits on every run. sh
   holds NT / 32 doubles; a second call in the same kernel needs a __syncthreads() first. */
template <int NT>
static __device__ __forceinline__ double block_sum(double v, double *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
#pragma unroll
    for (int i = 0; i < NT / 32; i++) t += sh[i];
    return t;
}

/* The row load of the one-block-per-row kernels (NT threads, up to VPT values each in registers):
   thread t keeps x[xo + t + j NT] in v[j] for j < VPT (0 past n), and returns the sum, in double
   and in index order, of f(value) over all its elements, those past VPT * NT (read, not kept)
   included. f: the statistic's term (the value, or its square). */
template <int NT, int VPT, class F>
static __device__ __forceinline__ double row_load(const void *x, int x_bf16, int64_t xo, int64_t n, float (&v)[VPT],
                                                  F f)
{
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        v[j] = 0.0f;
        if (i < n) {
            v[j] = ld_elem(x, x_bf16, xo + i);
            s += f(v[j]);
        }
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT) s += f(ld_elem(x, x_bf16, xo + i));
    return s;
}

} /* namespace h3cuda */

#endif /* H3K_H */
