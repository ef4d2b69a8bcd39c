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

#define H3_TO_F32_FN void h3_to_f32_avx2
#include "core/host_to_f32.inc"
#undef H3_TO_F32_FN
#endif
