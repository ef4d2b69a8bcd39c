/*
 * The transformer's row ops, libh3's (backend.h): norm_mod (RMSNorm with AdaLN modulation, rows
 * gathered through an index), gated_add (the gated residual), gated_add_norm (the two in one pass
 * over the residual row), qk_norm_rope (per-head RMSNorm of q and k, rotate-half RoPE, head-major
 * q / k / v) and rope (the vision tower's rotation without a norm).
 *
 * Modulation (h3_bmod): entry = row_entry[r] for input row r, base = tab + (entry * stride + slot)
 * * n; a norm multiplies by base[n + i] (1 + scale) and adds base[i] (shift); a gate multiplies by
 * base[i]. The mean squares are f32 sums (Metal has no double), each thread's strided partial sum,
 * then simd_sum, then the simdgroups in order: a fixed order, the same bits on every run.
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

/* y[k] = RMSNorm(x[rows ? rows[k] : k]) * w (modulated): one threadgroup per output row k. */
template <typename TX, typename TY>
kernel void h3m_norm_mod(device const TX *x [[buffer(0)]], device const long *rows [[buffer(1)]],
                         device const float *w [[buffer(2)]], device const float *tab [[buffer(3)]],
                         device const int *ent [[buffer(4)]], device TY *y [[buffer(5)]],
                         constant h3m_norm_args &a [[buffer(6)]], threadgroup float *red [[threadgroup(0)]],
                         uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                         uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]])
{
    const long kr = tgp.x, r = a.has_rows ? rows[kr] : kr;
    const int n = a.n;
    device const TX *xr = x + r * a.ldx;
    float ss = 0.0f;
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        const float v = h3m_ld(xr, i);
        ss += v * v;
    }
    ss = h3m_tg_sum(ss, red, lane, sg, nsg);
    const float inv = 1.0f / sqrt(ss / (float)n + a.eps);
    device const float *base = tab + (a.has_mod ? ((long)ent[r] * a.stride + a.slot) * n : 0);
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        float v = h3m_ld(xr, i) * inv;
        if (a.has_w) v *= w[i];
        if (a.has_mod) v = v * base[n + i] + base[i];
        h3m_st(y, kr * a.ldy + i, v);
    }
}

/* x[r] += g[r] * y[r] (g = 1 without a table): grid (ceil(n / threads), rows). */
template <typename TY>
kernel void h3m_gated_add(device float *x [[buffer(0)]], device const TY *y [[buffer(1)]],
                          device const float *tab [[buffer(2)]], device const int *ent [[buffer(3)]],
                          constant h3m_gate_args &a [[buffer(4)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long r = gid.y;
    if (i >= a.n) return;
    const float yv = h3m_ld(y, r * a.ldy + i);
    if (a.has_gate)
        x[r * a.ldx + i] += tab[((long)ent[r] * a.gate_stride + a.gate_slot) * a.n + i] * yv;
    else
        x[r * a.ldx + i] += yv;
}

/* gated_add then norm_mod of the updated row into out: one threadgroup per row. Each thread
   normalises the values it added itself, so the row is read once from memory. */
template <typename TY, typename TO>
kernel void h3m_gated_add_norm(device float *x [[buffer(0)]], device const TY *y [[buffer(1)]],
                               device const float *gtab [[buffer(2)]], device const int *gent [[buffer(3)]],
                               device const float *w [[buffer(4)]], device const float *ntab [[buffer(5)]],
                               device const int *nent [[buffer(6)]], device TO *out [[buffer(7)]],
                               constant h3m_gate_args &a [[buffer(8)]], threadgroup float *red [[threadgroup(0)]],
                               uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                               uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]])
{
    const long r = tgp.x;
    const int n = a.n;
    device float *xr = x + r * a.ldx;
    device const float *g = gtab + (a.has_gate ? ((long)gent[r] * a.gate_stride + a.gate_slot) * n : 0);
    float ss = 0.0f;
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        const float yv = h3m_ld(y, r * a.ldy + i);
        const float v = a.has_gate ? xr[i] + g[i] * yv : xr[i] + yv;
        xr[i] = v;
        ss += v * v;
    }
    ss = h3m_tg_sum(ss, red, lane, sg, nsg);
    const float inv = 1.0f / sqrt(ss / (float)n + a.eps);
    device const float *base = ntab + ((long)nent[r] * a.norm_stride + a.norm_slot) * n;
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        float v = xr[i] * inv;
        if (a.has_w) v *= w[i];
        h3m_st(out, r * a.ldo + i, v * base[n + i] + base[i]);
    }
}

/* qk_norm_rope: simdgroup u of the row handles q head u, k head u - heads, or copies v head
   u - heads - kv_heads. The normalised head is staged in threadgroup memory so the rotation can
   read the partner dim d +- half; every read of the input happens before simd_sum, every write
   after it, so q may be qin (and k kin) in place. */
template <typename TI, typename TO>
kernel void h3m_qk_norm_rope(device const TI *qin [[buffer(0)]], device const TI *kin [[buffer(1)]],
                             device const TI *vin [[buffer(2)]], device const float *qn [[buffer(3)]],
                             device const float *kn [[buffer(4)]], device const float *cs [[buffer(5)]],
                             device const float *sn [[buffer(6)]], device TO *q [[buffer(7)]],
                             device TO *k [[buffer(8)]], device TO *v [[buffer(9)]],
                             constant h3m_qkv_args &a [[buffer(10)]], threadgroup float *tg [[threadgroup(0)]],
                             uint3 tgp [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]])
{
    const int units = a.heads + a.kv_heads + (a.has_v ? a.kv_heads : 0);
    const int u = (int)tgp.x * H3M_QKV_HEADS + (int)sg;
    if (u >= units) return; /* the whole simdgroup */
    const long r = tgp.y;
    const int D = a.D, half_ = a.half_;
    if (u >= a.heads + a.kv_heads) {
        const int hv = u - a.heads - a.kv_heads;
        for (int d = (int)lane; d < D; d += 32)
            h3m_st(v, r * a.ldv + (long)hv * D + d, h3m_ld(vin, r * a.ldvin + (long)hv * a.hs + d));
        return;
    }
    const bool isq = u < a.heads;
    const int h = isq ? u : u - a.heads;
    device const TI *x = isq ? qin + r * a.ldqin + (long)h * a.hs : kin + r * a.ldkin + (long)h * a.hs;
    device TO *o = isq ? q + r * a.ldq + (long)h * D : k + r * a.ldk + (long)h * D;
    device const float *wn = isq ? qn : kn;
    const bool hw = isq ? a.has_qn != 0 : a.has_kn != 0;
    threadgroup float *t = tg + sg * D;
    float ss = 0.0f;
    for (int d = (int)lane; d < D; d += 32) {
        const float xv = h3m_ld(x, d);
        t[d] = xv;
        ss += xv * xv;
    }
    ss = simd_sum(ss);
    const float inv = 1.0f / sqrt(ss / (float)D + a.eps);
    for (int d = (int)lane; d < D; d += 32) {
        float val = t[d] * inv;
        if (hw) val *= wn[d];
        t[d] = val;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (int d = (int)lane; d < D; d += 32) {
        float val = t[d];
        if (a.has_rope && d < 2 * half_) {
            const int p = d < half_ ? d : d - half_;
            const float c = cs[r * half_ + p], s = sn[r * half_ + p];
            val = d < half_ ? t[d] * c - t[d + half_] * s : t[d] * c + t[d - half_] * s;
        }
        h3m_st(o, d, val);
    }
}

/* rope in place: for d < half, (x[d], x[d + half]) <- (x[d] c - x[d + half] s, x[d + half] c + x[d] s);
   one thread per (row, head, d): grid (ceil(heads * half / threads), rows). */
kernel void h3m_rope(device float *x [[buffer(0)]], device const float *cs [[buffer(1)]],
                     device const float *sn [[buffer(2)]], constant h3m_rope_args &a [[buffer(3)]],
                     uint3 gid [[thread_position_in_grid]])
{
    const int e = (int)gid.x;
    if (e >= a.heads * a.half_) return;
    const long r = gid.y;
    const int h = e / a.half_, d = e % a.half_;
    device float *p = x + r * a.ld + (long)h * a.D;
    const float c = cs[r * a.half_ + d], s = sn[r * a.half_ + d];
    const float x0 = p[d], x1 = p[d + a.half_];
    const float a0 = x0 * c, b0 = x1 * s, a1 = x1 * c, b1 = x0 * s; /* each product rounded before the sum */
    p[d] = a0 - b0;
    p[d + a.half_] = a1 + b1;
}

#define H3M_NORM(name, TX, TY)                                                                                     \
    template [[host_name(name)]] kernel void h3m_norm_mod<TX, TY>(                                                 \
        device const TX *x [[buffer(0)]], device const long *rows [[buffer(1)]], device const float *w [[buffer(2)]], \
        device const float *tab [[buffer(3)]], device const int *ent [[buffer(4)]], device TY *y [[buffer(5)]],     \
        constant h3m_norm_args &a [[buffer(6)]], threadgroup float *red [[threadgroup(0)]],                         \
        uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],                       \
        uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],                             \
        uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]);
H3M_NORM("h3m_norm_mod_f32_f32", float, float)
H3M_NORM("h3m_norm_mod_f32_bf16", float, bfloat)
H3M_NORM("h3m_norm_mod_bf16_f32", bfloat, float)
H3M_NORM("h3m_norm_mod_bf16_bf16", bfloat, bfloat)

#define H3M_GATE(name, TY)                                                                                        \
    template [[host_name(name)]] kernel void h3m_gated_add<TY>(                                                   \
        device float *x [[buffer(0)]], device const TY *y [[buffer(1)]], device const float *tab [[buffer(2)]],    \
        device const int *ent [[buffer(3)]], constant h3m_gate_args &a [[buffer(4)]],                              \
        uint3 gid [[thread_position_in_grid]]);
H3M_GATE("h3m_gated_add_f32", float)
H3M_GATE("h3m_gated_add_bf16", bfloat)

#define H3M_GATE_NORM(name, TY, TO)                                                                                \
    template [[host_name(name)]] kernel void h3m_gated_add_norm<TY, TO>(                                           \
        device float *x [[buffer(0)]], device const TY *y [[buffer(1)]], device const float *gtab [[buffer(2)]],    \
        device const int *gent [[buffer(3)]], device const float *w [[buffer(4)]],                                 \
        device const float *ntab [[buffer(5)]], device const int *nent [[buffer(6)]], device TO *out [[buffer(7)]], \
        constant h3m_gate_args &a [[buffer(8)]], threadgroup float *red [[threadgroup(0)]],                         \
        uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],                       \
        uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],                             \
        uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]);
H3M_GATE_NORM("h3m_gated_add_norm_f32_f32", float, float)
H3M_GATE_NORM("h3m_gated_add_norm_f32_bf16", float, bfloat)
H3M_GATE_NORM("h3m_gated_add_norm_bf16_f32", bfloat, float)
H3M_GATE_NORM("h3m_gated_add_norm_bf16_bf16", bfloat, bfloat)

#define H3M_QKV(name, TI, TO)                                                                                      \
    template [[host_name(name)]] kernel void h3m_qk_norm_rope<TI, TO>(                                             \
        device const TI *qin [[buffer(0)]], device const TI *kin [[buffer(1)]], device const TI *vin [[buffer(2)]], \
        device const float *qn [[buffer(3)]], device const float *kn [[buffer(4)]],                                \
        device const float *cs [[buffer(5)]], device const float *sn [[buffer(6)]], device TO *q [[buffer(7)]],     \
        device TO *k [[buffer(8)]], device TO *v [[buffer(9)]], constant h3m_qkv_args &a [[buffer(10)]],            \
        threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],                      \
        uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]]);
H3M_QKV("h3m_qk_norm_rope_f32_f32", float, float)
H3M_QKV("h3m_qk_norm_rope_f32_bf16", float, bfloat)
H3M_QKV("h3m_qk_norm_rope_bf16_f32", bfloat, float)
H3M_QKV("h3m_qk_norm_rope_bf16_bf16", bfloat, bfloat)
