/*
 * Element-wise ops over rows x n (libh3's, backend.h): swiglu (out = SiLU(gate) * up, SiLU as
 * h3_silu: x / (1 + e^-x); out may alias gate), gelu (tanh form or erf form; y may alias x) and
 * mul (y = a * b). One thread per element: grid (ceil(n / threads), rows).
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

template <typename T>
kernel void h3m_swiglu(device const T *gate [[buffer(0)]], device const T *up [[buffer(1)]], device T *out [[buffer(2)]],
                       constant h3m_ew_args &a [[buffer(3)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long r = gid.y;
    if (i >= a.n) return;
    const float g = h3m_ld(gate, r * a.lda + i), u = h3m_ld(up, r * a.ldb + i);
    h3m_st(out, r * a.ldy + i, h3m_silu(g) * u);
}

kernel void h3m_gelu(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     constant h3m_ew_args &a [[buffer(2)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long r = gid.y;
    if (i >= a.n) return;
    const float v = x[r * a.lda + i];
    y[r * a.ldy + i] = a.tanh_approx ? h3m_gelu_tanh(v) : h3m_gelu_erf(v);
}

kernel void h3m_mul(device const float *x [[buffer(0)]], device const float *b [[buffer(1)]], device float *y [[buffer(2)]],
                    constant h3m_ew_args &a [[buffer(3)]], uint3 gid [[thread_position_in_grid]])
{
    const int i = (int)gid.x;
    const long r = gid.y;
    if (i >= a.n) return;
    y[r * a.ldy + i] = x[r * a.lda + i] * b[r * a.ldb + i];
}

#define H3M_SWIGLU(name, T)                                                                                      \
    template [[host_name(name)]] kernel void h3m_swiglu<T>(                                                      \
        device const T *gate [[buffer(0)]], device const T *up [[buffer(1)]], device T *out [[buffer(2)]],        \
        constant h3m_ew_args &a [[buffer(3)]], uint3 gid [[thread_position_in_grid]]);
H3M_SWIGLU("h3m_swiglu_f32", float)
H3M_SWIGLU("h3m_swiglu_bf16", bfloat)
