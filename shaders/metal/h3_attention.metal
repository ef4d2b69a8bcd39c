/*
 * attention: O = softmax(scale Q K^T) V per head, no mask unless causal, libh3's `attention`
 * (backend.h): Q [Lq, heads * D], K and V [Lk, kv_heads * D] (query head h reads kv head
 * h / (heads / kv_heads)), O [Lq, heads * D]; Q, K, V f32 or bf16, O f32 or bf16, all sums in f32.
 * Causal: query row i sees keys j < i + (Lk - Lq) + 1; a row that sees none is written as zeros.
 *
 * Flash-style, in memory linear in tokens: the grid splits the queries into blocks of H3M_ATT_ROWS
 * rows (one simdgroup each) for every head, so no dimension of a dispatch grows with Lq * Lk and
 * long sequences are just more threadgroups. A simdgroup walks the keys 32 at a time: lane j scores
 * key j0 + j against the scaled query row (held in threadgroup memory), the block maximum and the
 * running maximum rescale the running sum and the output (online softmax), and the block's
 * probabilities are broadcast lane by lane (simd_shuffle) to accumulate P V, each lane holding the
 * output dims lane, lane + 32, ... . The block order is fixed: the same bits on every run.
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

template <typename TQ, typename TO>
kernel void h3m_attention(device const TQ *q [[buffer(0)]], device const TQ *k [[buffer(1)]],
                          device const TQ *v [[buffer(2)]], device TO *o [[buffer(3)]],
                          constant h3m_attn_args &a [[buffer(4)]], threadgroup float *tg [[threadgroup(0)]],
                          uint3 tgp [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]])
{
    const long i = (long)tgp.x * H3M_ATT_ROWS + sg;
    if (i >= a.Lq) return; /* the whole simdgroup: nothing below waits for the others */
    const int h = (int)tgp.y, kvh = h / (a.heads / a.kv_heads), D = a.D;
    threadgroup float *qs = tg + sg * H3M_ATT_MAX_D;
    for (int d = (int)lane; d < D; d += 32) qs[d] = h3m_ld(q, i * a.ldq + (long)h * D + d) * a.scale;
    simdgroup_barrier(mem_flags::mem_threadgroup);
    long lim = a.causal ? i + (a.Lk - a.Lq) + 1 : (long)a.Lk;
    if (lim > a.Lk) lim = a.Lk;
    if (lim < 0) lim = 0;
    const int nd = (D + 31) / 32;
    float acc[H3M_ATT_MAX_D / 32];
    for (int t = 0; t < H3M_ATT_MAX_D / 32; t++) acc[t] = 0.0f;
    float m = 0.0f, l = 0.0f;
    bool started = false;
    for (long j0 = 0; j0 < lim; j0 += 32) {
        const long j = j0 + lane;
        const bool ok = j < lim;
        float s = -MAXFLOAT;
        if (ok) {
            device const TQ *kr = k + j * a.ldk + (long)kvh * D;
            float t = 0.0f;
            for (int d = 0; d < D; d++) t += qs[d] * h3m_ld(kr, d);
            s = t;
        }
        const float mb = simd_max(s);
        const float mn = started ? max(m, mb) : mb;
        const float alpha = started ? exp(m - mn) : 0.0f;
        const float p = ok ? exp(s - mn) : 0.0f;
        l = l * alpha + simd_sum(p);
        for (int t = 0; t < nd; t++) acc[t] *= alpha;
        const int cnt = lim - j0 < 32 ? (int)(lim - j0) : 32;
        for (int jj = 0; jj < cnt; jj++) {
            const float pj = simd_shuffle(p, (ushort)jj);
            device const TQ *vr = v + (j0 + jj) * a.ldv + (long)kvh * D;
            for (int t = 0; t < nd; t++) {
                const int d = (int)lane + 32 * t;
                if (d < D) acc[t] += pj * h3m_ld(vr, d);
            }
        }
        m = mn;
        started = true;
    }
    const float inv = lim > 0 ? 1.0f / l : 0.0f;
    for (int t = 0; t < nd; t++) {
        const int d = (int)lane + 32 * t;
        if (d < D) h3m_st(o, i * a.ldo + (long)h * D + d, acc[t] * inv);
    }
}

#define H3M_ATTENTION(name, TQ, TO)                                                                             \
    template [[host_name(name)]] kernel void h3m_attention<TQ, TO>(                                             \
        device const TQ *q [[buffer(0)]], device const TQ *k [[buffer(1)]], device const TQ *v [[buffer(2)]],    \
        device TO *o [[buffer(3)]], constant h3m_attn_args &a [[buffer(4)]],                                     \
        threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],                    \
        uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]);
H3M_ATTENTION("h3m_attention_f32_f32", float, float)
H3M_ATTENTION("h3m_attention_f32_bf16", float, bfloat)
H3M_ATTENTION("h3m_attention_bf16_f32", bfloat, float)
H3M_ATTENTION("h3m_attention_bf16_bf16", bfloat, bfloat)
