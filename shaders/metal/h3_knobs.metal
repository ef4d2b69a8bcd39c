/*
 * The sampler's step and the speed knobs' element-wise arithmetic (libh3's euler, extrapolate, sub,
 * pool_pairs, unpool_pairs), the row moves (scatter_rows, copy, add_div) and the step cache's
 * abs_diff_sum, backend.h. All but the last must give the CPU's bits: every operation is its own statement, in the CPU's order, so a compile
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

/* ---- abs_diff_sum: sum |a - b| and sum |b| to double precision without double (Metal has none).
   Each value is exact as an unevaluated pair hi + lo of floats (|a - b| too: the difference's
   rounding error is recovered exactly), and the pairs add with error-free transformations, about
   44 bits of precision. Blocks of H3M_ADS_BLOCK values, one threadgroup of H3M_ADS_THREADS each,
   in a fixed order; the host adds the blocks' pairs in double, in block order. Needs fast math off
   (it would simplify the error terms away). */

/* s + e = a + b exactly (Knuth's TwoSum). */
inline void h3m_two_sum(float a, float b, thread float &s, thread float &e)
{
    s = a + b;
    const float bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}
/* (hi, lo) += (bh, bl) */
inline void h3m_ff_add(thread float &hi, thread float &lo, float bh, float bl)
{
    float s, e;
    h3m_two_sum(hi, bh, s, e);
    e += lo + bl;
    hi = s + e;
    lo = e - (hi - s);
}

kernel void h3m_abs_diff_sum(device const float *x [[buffer(0)]], device const float *b [[buffer(1)]],
                             device float *part [[buffer(2)]], constant h3m_knob_args &a [[buffer(3)]],
                             threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]])
{
    const long i0 = (long)tgp.x * H3M_ADS_BLOCK;
    float dh = 0.0f, dl = 0.0f, rh = 0.0f, rl = 0.0f;
    for (long i = i0 + tid; i < i0 + H3M_ADS_BLOCK && i < a.n; i += H3M_ADS_THREADS) {
        float s, e;
        h3m_two_sum(x[i], -b[i], s, e); /* a - b = s + e exactly; |s + e| has the sign of s */
        if (s < 0.0f) s = -s, e = -e;
        h3m_ff_add(dh, dl, s, e);
        h3m_ff_add(rh, rl, fabs(b[i]), 0.0f);
    }
    for (ushort m = 16; m > 0; m >>= 1) { /* butterfly: lane 0 ends with the simdgroup's sum */
        const float odh = simd_shuffle_xor(dh, m), odl = simd_shuffle_xor(dl, m);
        const float orh = simd_shuffle_xor(rh, m), orl = simd_shuffle_xor(rl, m);
        h3m_ff_add(dh, dl, odh, odl);
        h3m_ff_add(rh, rl, orh, orl);
    }
    if (lane == 0) {
        tg[4 * sg] = dh, tg[4 * sg + 1] = dl, tg[4 * sg + 2] = rh, tg[4 * sg + 3] = rl;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float th = tg[0], tl = tg[1], uh = tg[2], ul = tg[3];
        for (uint s = 1; s < H3M_ADS_THREADS / 32; s++) {
            h3m_ff_add(th, tl, tg[4 * s], tg[4 * s + 1]);
            h3m_ff_add(uh, ul, tg[4 * s + 2], tg[4 * s + 3]);
        }
        device float *p = part + 4 * (long)tgp.x;
        p[0] = th, p[1] = tl, p[2] = uh, p[3] = ul;
    }
}
