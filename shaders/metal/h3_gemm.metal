/*
 * linear: y[M, N] = x[M, K] W^T (+ bias f32 [N]), libh3's `linear` (backend.h). x f32 or bf16,
 * W f32, bf16 or f16 as stored, y f32 or bf16; the products and sums in f32. The same kernel is
 * `conv_gemm` (rows of x closer than K apart: overlapping windows) and, gathering its x tiles from
 * the padded video, `conv3d`; over int8 weights with per-row scales, `h3m_linear_q8`.
 *
 * A threadgroup of 4 simdgroups computes a 32 x 32 tile of y; each simdgroup a 16 x 16 quarter as
 * 2 x 2 simdgroup_float8x8 accumulators. K advances in steps of 16: the threadgroup stages the
 * 32 x 16 blocks of x and W in threadgroup memory as f32 (zeros past the edges, so odd M, N, K need
 * no other case), and each simdgroup multiplies 8 x 8 blocks, W's loaded transposed. The tile goes
 * through threadgroup memory once more to add the bias, convert and write only the rows and
 * columns inside y. The order of the sums is fixed by the tiling: the same bits on every run.
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

/* The tile loop, shared by linear (x read as rows) and conv3d (x gathered from the video as its
   im2col rows would hold it): XL::at(m, k) gives x[m][k] as f32, for m < M and k < K only; WL::at(n,
   k) gives W[n][k] as f32 (a stored value, or an int8 one times its row's scale). */
template <typename XL, typename WL, typename TY>
inline void h3m_gemm_tile(thread const XL &xl, thread const WL &wl, device const float *bias, device TY *y, int M,
                          int N, int K, int ldy, int has_bias, threadgroup float *tg, uint3 tgp, uint tid, uint sg)
{
    threadgroup float *xs = tg;                   /* [H3M_BM][H3M_BK] */
    threadgroup float *ws = tg + H3M_BM * H3M_BK; /* [H3M_BN][H3M_BK] */
    threadgroup float *cs = tg;                   /* [H3M_BM][H3M_BN], after the K loop */
    const long m0 = (long)tgp.y * H3M_BM, n0 = (long)tgp.x * H3M_BN;
    const uint sr = sg / 2, sc = sg % 2;
    simdgroup_float8x8 acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (int k0 = 0; k0 < K; k0 += H3M_BK) {
        for (uint e = tid; e < H3M_BM * H3M_BK; e += H3M_GEMM_THREADS) {
            const uint r = e / H3M_BK, c = e % H3M_BK;
            const long m = m0 + r, n = n0 + r;
            const int k = k0 + (int)c;
            xs[e] = m < M && k < K ? xl.at(m, k) : 0.0f;
            ws[e] = n < N && k < K ? wl.at(n, k) : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (int kk = 0; kk < H3M_BK; kk += 8) {
            simdgroup_float8x8 af[2], bf[2];
            for (int i = 0; i < 2; i++) simdgroup_load(af[i], xs + (sr * 16 + i * 8) * H3M_BK + kk, H3M_BK);
            /* the block of W holds [n][k]; B[k][n] of the product is its transpose */
            for (int j = 0; j < 2; j++) simdgroup_load(bf[j], ws + (sc * 16 + j * 8) * H3M_BK + kk, H3M_BK, 0, true);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) simdgroup_multiply_accumulate(acc[i][j], af[i], bf[j], acc[i][j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) simdgroup_store(acc[i][j], cs + (sr * 16 + i * 8) * H3M_BN + sc * 16 + j * 8, H3M_BN);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < H3M_BM * H3M_BN; e += H3M_GEMM_THREADS) {
        const long m = m0 + e / H3M_BN, n = n0 + e % H3M_BN;
        if (m < M && n < N) {
            float v = cs[e];
            if (has_bias) v += bias[n];
            h3m_st(y, m * ldy + n, v);
        }
    }
}

/* Rows of x, `ldx` apart; ldx < K gives overlapping windows (conv_gemm's 1-D convolutions). */
template <typename TX> struct h3m_rows_x {
    device const TX *x;
    long ldx;
    float at(long m, int k) const { return h3m_ld(x, m * ldx + k); }
};

/* W [N, K] row-major in its stored type. */
template <typename TW> struct h3m_rows_w {
    device const TW *w;
    long K;
    float at(long n, int k) const { return h3m_ld(w, n * K + k); }
};
/* int8 W with one f32 scale per row: the dequantised value (float)q * scale, rounded once, so the
   sums are those of linear over the dequantised f32 weights (libh3's int8 contract). */
struct h3m_q8_w {
    device const char *q;
    device const float *scale;
    long K;
    float at(long n, int k) const { return (float)q[n * K + k] * scale[n]; }
};

template <typename TX, typename TW, typename TY>
kernel void h3m_linear(device const TX *x [[buffer(0)]], device const TW *w [[buffer(1)]],
                       device const float *bias [[buffer(2)]], device TY *y [[buffer(3)]],
                       constant h3m_linear_args &a [[buffer(4)]], threadgroup float *tg [[threadgroup(0)]],
                       uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]])
{
    const h3m_rows_x<TX> xl = {x, a.ldx};
    const h3m_rows_w<TW> wl = {w, a.K};
    h3m_gemm_tile(xl, wl, bias, y, a.M, a.N, a.K, a.ldy, a.has_bias, tg, tgp, tid, sg);
}

/* linear over int8 weights (q [N, K], scale [N]). */
template <typename TX, typename TY>
kernel void h3m_linear_q8(device const TX *x [[buffer(0)]], device const char *q [[buffer(1)]],
                          device const float *scale [[buffer(2)]], device const float *bias [[buffer(3)]],
                          device TY *y [[buffer(4)]], constant h3m_linear_args &a [[buffer(5)]],
                          threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],
                          uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]])
{
    const h3m_rows_x<TX> xl = {x, a.ldx};
    const h3m_q8_w wl = {q, scale, a.K};
    h3m_gemm_tile(xl, wl, bias, y, a.M, a.N, a.K, a.ldy, a.has_bias, tg, tgp, tid, sg);
}

/* x~ of conv3d (backend.h): pad_t zero frames before the video, rows and columns reflect-padded;
   row m of the implicit im2col matrix is output position (t, i, j), column k is (dt, dy, dx, c). */
struct h3m_conv3d_x {
    device const float *x;
    constant h3m_conv3d_args *gp;
    float at(long m, int k) const
    {
        constant h3m_conv3d_args &g = *gp;
        const int j = (int)(m % g.Wo), i = (int)(m / g.Wo % g.Ho), t = (int)(m / ((long)g.Wo * g.Ho));
        const int c = k % g.cin, dx = k / g.cin % g.kw, dy = k / (g.cin * g.kw) % g.kh, dt = k / (g.cin * g.kw * g.kh);
        const int tt = t * g.st + dt - g.pad_t;
        if (tt < 0) return 0.0f;
        int yy = i * g.sh + dy - g.pad_top, xx = j * g.sw + dx - g.pad_left;
        yy = yy < 0 ? -yy : (yy >= g.H ? 2 * (g.H - 1) - yy : yy);
        xx = xx < 0 ? -xx : (xx >= g.W ? 2 * (g.W - 1) - xx : xx);
        return x[(((long)tt * g.H + yy) * g.W + xx) * g.cin + c];
    }
};

/* conv3d: y [To][Ho][Wo][cout] = bias + W x~ windows, W [cout, kt*kh*kw*cin] f32 (the GEMM of
   linear over the gathered windows, so its sums are conv_gemm's at every size). */
kernel void h3m_conv3d(device const float *x [[buffer(0)]], device const float *w [[buffer(1)]],
                       device const float *bias [[buffer(2)]], device float *y [[buffer(3)]],
                       constant h3m_conv3d_args &g [[buffer(4)]], threadgroup float *tg [[threadgroup(0)]],
                       uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint sg [[simdgroup_index_in_threadgroup]])
{
    const h3m_conv3d_x xl = {x, &g};
    const int M = g.To * g.Ho * g.Wo, K = g.kt * g.kh * g.kw * g.cin;
    const h3m_rows_w<float> wl = {w, K};
    h3m_gemm_tile(xl, wl, bias, y, M, g.cout, K, g.cout, g.has_bias, tg, tgp, tid, sg);
}

#define H3M_LINEAR(name, TX, TW, TY)                                                                              \
    template [[host_name(name)]] kernel void h3m_linear<TX, TW, TY>(                                              \
        device const TX *x [[buffer(0)]], device const TW *w [[buffer(1)]], device const float *bias [[buffer(2)]], \
        device TY *y [[buffer(3)]], constant h3m_linear_args &a [[buffer(4)]],                                     \
        threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],                      \
        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]);
/* h3m_linear_<x>_<W>_<y> */
H3M_LINEAR("h3m_linear_f32_f32_f32", float, float, float)
H3M_LINEAR("h3m_linear_f32_bf16_f32", float, bfloat, float)
H3M_LINEAR("h3m_linear_f32_f16_f32", float, half, float)
H3M_LINEAR("h3m_linear_f32_f32_bf16", float, float, bfloat)
H3M_LINEAR("h3m_linear_f32_bf16_bf16", float, bfloat, bfloat)
H3M_LINEAR("h3m_linear_f32_f16_bf16", float, half, bfloat)
H3M_LINEAR("h3m_linear_bf16_f32_f32", bfloat, float, float)
H3M_LINEAR("h3m_linear_bf16_bf16_f32", bfloat, bfloat, float)
H3M_LINEAR("h3m_linear_bf16_f16_f32", bfloat, half, float)
H3M_LINEAR("h3m_linear_bf16_f32_bf16", bfloat, float, bfloat)
H3M_LINEAR("h3m_linear_bf16_bf16_bf16", bfloat, bfloat, bfloat)
H3M_LINEAR("h3m_linear_bf16_f16_bf16", bfloat, half, bfloat)

#define H3M_LINEAR_Q8(name, TX, TY)                                                                               \
    template [[host_name(name)]] kernel void h3m_linear_q8<TX, TY>(                                              \
        device const TX *x [[buffer(0)]], device const char *q [[buffer(1)]], device const float *scale [[buffer(2)]], \
        device const float *bias [[buffer(3)]], device TY *y [[buffer(4)]], constant h3m_linear_args &a [[buffer(5)]], \
        threadgroup float *tg [[threadgroup(0)]], uint3 tgp [[threadgroup_position_in_grid]],                      \
        uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]]);
H3M_LINEAR_Q8("h3m_linear_q8_f32_f32", float, float)
H3M_LINEAR_Q8("h3m_linear_q8_f32_bf16", float, bfloat)
H3M_LINEAR_Q8("h3m_linear_q8_bf16_f32", bfloat, float)
H3M_LINEAR_Q8("h3m_linear_q8_bf16_bf16", bfloat, bfloat)
