/*
 * fp8 (e4m3) weight quantisation on the host: the bits the CUDA backend makes at load under
 * H3_PRECISION_FP8 (backend/cuda/cuda_fp8.cu, fp8_rows_kernel), so that `h3ctl quantize` can write
 * them once, without a GPU, and a GPU that reads them computes exactly as if it had quantised.
 *
 * Per output row r of a weight W [rows, cols] as the GPU holds it (bf16: stored f32 / f16 values
 * rounded to nearest even first): amax = max |w| (NaN ignored, as fmaxf does), s = amax / 448 when
 * amax is finite and > 0 (one correctly rounded f32 division), else 1; q = e4m3(w / s) with the
 * f32 division correctly rounded and the conversion of CUDA's __nv_cvt_float_to_fp8(x,
 * __NV_SATFINITE, __NV_E4M3): round to nearest even, |x| beyond 448's rounding range (and
 * infinities) saturate to +-448, NaN gives 0x7F whatever its sign (CUDA canonicalises it).
 * The arithmetic assumes IEEE single precision evaluated in single precision (FLT_EVAL_METHOD 0:
 * every SSE, NEON and AArch64 target; not the x87).
 */
#ifndef H3_FP8_H
#define H3_FP8_H

#include "core/host.h"

/* Largest finite e4m3 value: the scale maps a row's amax onto it. */
#define H3_FP8_MAX 448.0f

/* x -> e4m3 byte as CUDA's SATFINITE conversion (see above). */
H3_INTERNAL uint8_t h3_e4m3_from_f32(float x);

/* Quantise w (F32, BF16 or F16, [rows, cols] row-major) into q [rows * cols] (e4m3 bytes) and
   scale [rows] (f32), rows in parallel on the pool. Errors: a non-float dtype, out of memory. */
H3_INTERNAL int h3_fp8_quantize(h3_pool *p, const void *w, h3_dtype dt, int64_t rows, int64_t cols, uint8_t *q,
                                float *scale);

#endif /* H3_FP8_H */
