/* h3_to_f32 compiled with AVX2+F16C; called only where h3_host_simd() says the CPU has them. */
#include "core/host.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

H3_INTERNAL void h3_to_f32_avx2(const void *src, h3_dtype dt, float *dst, int64_t n);

void h3_to_f32_avx2(const void *src, h3_dtype dt, float *dst, int64_t n)
{
    if (dt == H3_DT_F32) {
        memmove(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    int64_t i = 0;
    if (dt == H3_DT_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
            _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
        }
        for (; i < n; i++) dst[i] = h3_bf16_to_f32(h[i]);
        return;
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) dst[i] = h3_f16_to_f32(h[i]);
}
#endif
