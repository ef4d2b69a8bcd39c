/* h3_to_f32 compiled with AVX2+FMA+F16C (the Makefile's *_avx2.c flags); called only where
   h3_host_simd() says the CPU has them. Built without those flags (a cross build), the same code
   runs at the baseline ISA. */
#include "core/host.h"

#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* static vector helpers only */

#if defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL void h3_to_f32_avx2(const void *src, h3_dtype dt, float *dst, int64_t n);

void h3_to_f32_avx2(const void *src, h3_dtype dt, float *dst, int64_t n)
{
    typedef uint16_t v8h __attribute__((vector_size(16), aligned(2), may_alias));
    typedef uint32_t v8u __attribute__((vector_size(32), aligned(32)));
    typedef uint32_t v8uu __attribute__((vector_size(32), aligned(4), may_alias));
    if (dt == H3_DT_F32) {
        memmove(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    int64_t i = 0;
    if (dt == H3_DT_BF16) {
        for (; i + 8 <= n; i += 8) *(v8uu *)(dst + i) = __builtin_convertvector(*(const v8h *)(h + i), v8u) << 16;
        for (; i < n; i++) dst[i] = h3_bf16_to_f32(h[i]);
        return;
    }
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) dst[i] = h3_f16_to_f32(h[i]);
}
#endif
