/* The host helpers of core/host.h other than the pool: CPU features, the SIMD choice and the dtype
   conversions. */
#include "core/host.h"
#include "core/tuning.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/*
 * CPUID directly rather than __builtin_cpu_supports: the builtin needs compiler-rt's __cpu_model,
 * which not every toolchain links into a shared library. AVX also needs the OS to save the YMM
 * state (OSXSAVE + XGETBV), or the first AVX instruction faults.
 */
unsigned h3_cpu_x86_features(void)
{
    unsigned f = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    bool osxsave = c & (1u << 27), avx = c & (1u << 28);
    if (c & (1u << 12)) f |= H3_CPU_FMA;
    if (c & (1u << 29)) f |= H3_CPU_F16C;
    bool ymm = false;
    if (osxsave && avx) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        ymm = (lo & 6u) == 6u;
        if (ymm && (lo & 0xE0u) == 0xE0u) f |= H3_CPU_ZMM_OS;
    }
    if (!ymm) return 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (b & (1u << 5)) f |= H3_CPU_AVX2;
        if ((b & (1u << 16)) && (f & H3_CPU_ZMM_OS)) f |= H3_CPU_AVX512F;
    }
#endif
    return f;
}

static bool g_simd;
static pthread_once_t g_simd_once = PTHREAD_ONCE_INIT;

static void pick_simd(void)
{
#if defined(__x86_64__) || defined(__i386__)
    const unsigned need = H3_CPU_AVX2 | H3_CPU_FMA | H3_CPU_F16C;
    g_simd = !h3_env_no_simd() && (h3_cpu_x86_features() & need) == need;
#endif
}

bool h3_host_simd(void)
{
    pthread_once(&g_simd_once, pick_simd);
    return g_simd;
}

#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL void h3_to_f32_avx2(const void *src, h3_dtype dt, float *dst, int64_t n); /* host_avx2.c */
#endif

/* The baseline path (H3_NO_SIMD=1 and CPUs without F16C). */
#define H3_TO_F32_FN static void to_f32_generic
#include "core/host_to_f32.inc"
#undef H3_TO_F32_FN

void h3_to_f32(const void *src, h3_dtype dt, float *dst, int64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
    if (h3_host_simd()) {
        h3_to_f32_avx2(src, dt, dst, n);
        return;
    }
#endif
    to_f32_generic(src, dt, dst, n);
}

uint16_t h3_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float h3_silu(float x) { return x / (1.0f + expf(-x)); }

/* The host GEMM (core/host.h): the CPU kernel set registers it at load. */
static h3_host_gemm_fn g_host_gemm;

void h3_host_gemm_register(h3_host_gemm_fn fn) { g_host_gemm = fn; }

int h3_host_linear(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W, const float *bias, float *Y,
                   int64_t ldy)
{
    if (!g_host_gemm) return h3_err(H3_E_UNSUPPORTED, "host GEMM: no CPU kernel set was linked into libh3");
    return g_host_gemm(p, X, M, ldx, W, bias, Y, ldy);
}
