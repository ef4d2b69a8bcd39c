/*
 * The sampler's step and the speed knobs' element-wise arithmetic (libh3's euler, extrapolate, sub,
 * pool_pairs, unpool_pairs) and the row moves (scatter_rows, copy, add_div), backend.h. These must
 * give the CPU's bits: every operation is its own statement, in the CPU's order, so a compile
 * without fast math (which contracts only within one expression) rounds each one to f32 as the
 * CPU does; no multiply-add is fused.
 */
#ifndef H3_METAL_H
#ifdef H3_MSL_EMU
#include "msl_emu.h"
#else
#include <metal_stdlib>
#endif
using namespace metal;
#include "h3_metal.h"
#endif

/* x <- ratio x + (1 - ratio) (x + (1 - t) v), ratio = sigma_next / sigma (h3_sched_euler). */
kernel void h3m_euler(device float *x [[buffer(0)]], device const float *v [[buffer(1)]],
                      constant h3m_knob_args &a [[buffer(2)]], uint3 gid [[thread_position_in_grid]])
{
    const long i = gid.x;
    if (i >= a.n) return;
    const float sft = 1.0f - a.t;
    const float ratio = a.sigma_next / a.sigma;
    const float keep = 1.0f - ratio;
    const float prod = sft * v[i];
    const float denoised = x[i] + prod;
    const float p = ratio * x[i];
    const float q = keep * denoised;
    x[i] = p + q;
}

/* out = a + r (a - b) (difference, product, sum); without b a copy. out may be a or b. */
kernel void h3m_extrapolate(device float *out [[buffer(0)]], device const float *x [[buffer(1)]],
                            device const float *b [[buffer(2)]], constant h3m_knob_args &a [[buffer(3)]],
                            uint3 gid [[thread_position_in_grid]])
{
    const long i = gid.x;
    if (i >= a.n) return;
    const float av = x[i];
    if (!a.has_b) {
        out[i] = av;
        return;
    }
    const float d = av - b[i];
    const float p = a.r * d;
    out[i] = av + p;
}

kernel void h3m_sub(device float *out [[buffer(0)]], device const float *x [[buffer(1)]],
                    device const float *b [[buffer(2)]], constant h3m_knob_args &a [[buffer(3)]],
                    uint3 gid [[thread_position_in_grid]])
{
    const long i = gid.x;
    if (i >= a.n) return;
    out[i] = x[i] - b[i];
}

/* dst row j = (src[p0] + src[p1]) * 0.5 (sum rounded, then halved), or src[p0] when p1 < 0. */
kernel void h3m_pool_pairs(device const float *src [[buffer(0)]], device const long *pairs [[buffer(1)]],
                           device float *dst [[buffer(2)]], constant h3m_rowop_args &a [[buffer(3)]],
                           uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long j = gid.y;
    if (i >= a.n) return;
    const long p0 = pairs[2 * j], p1 = pairs[2 * j + 1];
    const float x0 = src[p0 * a.lda + i];
    if (p1 < 0) {
        dst[j * a.ldy + i] = x0;
        return;
    }
    const float s = x0 + src[p1 * a.lda + i];
    dst[j * a.ldy + i] = s * 0.5f;
}

/* A pair: full[p0] += d, full[p1] += d with d = red[j] - base[j]; a single row: full[p0] = red[j]. */
kernel void h3m_unpool_pairs(device const float *red [[buffer(0)]], device const float *base [[buffer(1)]],
                             device const long *pairs [[buffer(2)]], device float *full [[buffer(3)]],
                             constant h3m_rowop_args &a [[buffer(4)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long j = gid.y;
    if (i >= a.n) return;
    const long p0 = pairs[2 * j], p1 = pairs[2 * j + 1];
    const float y = red[j * a.lda + i];
    if (p1 < 0) {
        full[p0 * a.ldy + i] = y;
        return;
    }
    const float d = y - base[j * a.ldb + i];
    full[p0 * a.ldy + i] = full[p0 * a.ldy + i] + d;
    full[p1 * a.ldy + i] = full[p1 * a.ldy + i] + d;
}

/* dst[idx[j]] = src[j] (scatter_rows); with idx NULL (has no rows) dst[j] = src[j] (copy). */
kernel void h3m_scatter_rows(device const float *src [[buffer(0)]], device const long *idx [[buffer(1)]],
                             device float *dst [[buffer(2)]], constant h3m_rowop_args &a [[buffer(3)]],
                             constant int &has_idx [[buffer(4)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long j = gid.y;
    if (i >= a.n) return;
    const long r = has_idx ? idx[j] : j;
    dst[r * a.ldy + i] = src[j * a.lda + i];
}

/* y = (y + x) / div: the sum rounded, then a true division (not a product with 1 / div). */
kernel void h3m_add_div(device float *y [[buffer(0)]], device const float *x [[buffer(1)]],
                        constant h3m_rowop_args &a [[buffer(2)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long r = gid.y;
    if (i >= a.n) return;
    const float s = y[r * a.ldy + i] + x[r * a.lda + i];
    y[r * a.ldy + i] = s / a.div;
}
