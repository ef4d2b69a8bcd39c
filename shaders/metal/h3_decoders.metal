/*
 * The decoders' and the audio encoder's ops, libh3's (backend.h): snake and snake_aa (BigVGAN's and
 * DAC's activations into a phased, zero-margined buffer), conv1_clamp (conv_post and the clamp),
 * layernorm and group_norm (+ SiLU), head_pool (the audio encoder's pre_block reduction), and the
 * video decoder's data moves channels_last and unpatchify, and its tile blend vae_stitch (these three
 * exact: the CPU's bits). conv_gemm and conv3d are the GEMM of h3_gemm.metal. The
 * statistics are f32 sums in a fixed order (Metal has no double): mean, then the variance around
 * it, each over the threadgroup as h3m_tg_sum adds.
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

#define H3M_AA_TAPS 12 /* H3_AA_TAPS: the 2x resampling filters' length */

/* One value of the 2x-upsampled signal of channel c at position t (a transposed convolution by
   fup with the edges replicated), through SnakeBeta: u + rb sin^2(a u). */
inline float h3m_aa_up(device const float *x, int L, int C, int c, long t, device const float *fup, float a, float rb)
{
    const int par = (int)((t + 15) & 1);
    const long s0 = (t + 15 - par) / 2 - 5;
    float acc = 0.0f;
    for (int j = 0; j < H3M_AA_TAPS / 2; j++) {
        long r = s0 - j;
        r = r < 0 ? 0 : (r > L - 1 ? L - 1 : r);
        acc += x[r * C + c] * fup[par + 2 * j];
    }
    const float u = 2.0f * acc, s = sin(a * u);
    return u + rb * (s * s);
}

/* Destination row q of phase r holds output row m = (q - margin) * d + r, or zeros. snake_aa
   (aa != 0): the upsampled, activated signal low-passed by fdown and taken every second value;
   snake: v + rb sin^2(a v) of x's row m. */
kernel void h3m_snake(device const float *x [[buffer(0)]], device const float *av [[buffer(1)]],
                      device const float *rbv [[buffer(2)]], device const float *fup [[buffer(3)]],
                      device const float *fdown [[buffer(4)]], device float *dst [[buffer(5)]],
                      constant h3m_phased_args &p [[buffer(6)]], uint3 gid [[thread_position_in_grid]])
{
    const int c = (int)gid.x;
    const long row = gid.y;
    if (c >= p.C || row >= (long)p.d * p.phase_rows) return;
    const int r = (int)(row / p.phase_rows);
    const long q = row % p.phase_rows;
    const long rows = r < p.L ? (p.L - r + p.d - 1) / p.d : 0;
    float out = 0.0f;
    if (q >= p.margin && q < p.margin + rows) {
        const long m = (q - p.margin) * p.d + r;
        const float a = av[c], rb = rbv[c];
        if (p.aa) {
            const long nz = 2 * (long)p.L;
            for (int k = 0; k < H3M_AA_TAPS; k++) {
                long t = 2 * m + k - 5;
                t = t < 0 ? 0 : (t > nz - 1 ? nz - 1 : t);
                out += h3m_aa_up(x, p.L, p.C, c, t, fup, a, rb) * fdown[k];
            }
        } else {
            const float v = x[m * p.C + c], s = sin(a * v);
            out = v + rb * (s * s);
        }
    }
    dst[row * p.C + c] = out;
}

/* y[m] = clamp(w . x_m, -1, 1), x_m the K floats at x + m * ldx; NaN passes (the comparisons
   leave it alone, as torch.clamp does). One simdgroup per row. */
kernel void h3m_conv1_clamp(device const float *x [[buffer(0)]], device const float *w [[buffer(1)]],
                            device float *y [[buffer(2)]], constant h3m_conv1_args &a [[buffer(3)]],
                            uint3 tgp [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                            uint sg [[simdgroup_index_in_threadgroup]])
{
    const long m = (long)tgp.x * H3M_ATT_ROWS + sg;
    if (m >= a.M) return;
    float s = 0.0f;
    for (int i = (int)lane; i < a.K; i += 32) s += w[i] * x[m * a.ldx + i];
    s = simd_sum(s);
    if (lane == 0) y[m] = s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

/* y = LayerNorm(x) * w + b per row (y may be x: each thread rewrites only what it read). */
kernel void h3m_layernorm(device const float *x [[buffer(0)]], device const float *w [[buffer(1)]],
                          device const float *b [[buffer(2)]], device float *y [[buffer(3)]],
                          constant h3m_ln_args &a [[buffer(4)]], threadgroup float *red [[threadgroup(0)]],
                          uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                          uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]])
{
    const long r = tgp.x;
    const int n = a.n;
    device const float *xr = x + r * a.ldx;
    float s = 0.0f;
    for (int i = (int)tid; i < n; i += (int)ntg.x) s += xr[i];
    const float mean = h3m_tg_sum(s, red, lane, sg, nsg) / (float)n;
    float v = 0.0f;
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        const float d = xr[i] - mean;
        v += d * d;
    }
    const float inv = 1.0f / sqrt(h3m_tg_sum(v, red, lane, sg, nsg) / (float)n + a.eps);
    for (int i = (int)tid; i < n; i += (int)ntg.x) {
        float o = (xr[i] - mean) * inv;
        if (a.has_w) o *= w[i];
        if (a.has_b) o += b[i];
        y[r * a.ldy + i] = o;
    }
}

/* GroupNorm of each frame (x, y [frames][pixels][C]), then SiLU when asked: threadgroup
   (group, frame) normalises the pixels x C/groups values of its group. y may be x. */
kernel void h3m_group_norm(device const float *x [[buffer(0)]], device const float *w [[buffer(1)]],
                           device const float *b [[buffer(2)]], device float *y [[buffer(3)]],
                           constant h3m_gn_args &a [[buffer(4)]], threadgroup float *red [[threadgroup(0)]],
                           uint3 tgp [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                           uint3 ntg [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                           uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]])
{
    const int g = (int)tgp.x, cg = a.C / a.groups;
    const long f = tgp.y, count = (long)a.pixels * cg;
    device const float *xf = x + f * a.pixels * a.C + (long)g * cg;
    float s = 0.0f;
    for (long e = tid; e < count; e += ntg.x) s += xf[(e / cg) * a.C + e % cg];
    const float mean = h3m_tg_sum(s, red, lane, sg, nsg) / (float)count;
    float v = 0.0f;
    for (long e = tid; e < count; e += ntg.x) {
        const float d = xf[(e / cg) * a.C + e % cg] - mean;
        v += d * d;
    }
    const float inv = 1.0f / sqrt(h3m_tg_sum(v, red, lane, sg, nsg) / (float)count + a.eps);
    device float *yf = y + f * a.pixels * a.C + (long)g * cg;
    for (long e = tid; e < count; e += ntg.x) {
        const long i = (e / cg) * a.C + e % cg;
        const int c = g * cg + (int)(e % cg);
        const float o = (xf[i] - mean) * inv * w[c] + b[c];
        yf[i] = a.silu ? h3m_silu(o) : o;
    }
}

/* head_pool: m[i] = (sum over heads of x[h D + i]) / heads, then y[j] = the mean of m over
   adaptive_avg_pool1d's window [floor(j D / n), ceil((j + 1) D / n)). */
kernel void h3m_head_pool(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                          constant h3m_head_pool_args &a [[buffer(2)]], uint3 gid [[thread_position_in_grid]])
{
    const int j = (int)gid.x;
    const long r = gid.y;
    if (j >= a.n) return;
    const int s0 = (int)(((long)j * a.D) / a.n), e0 = (int)(((long)(j + 1) * a.D + a.n - 1) / a.n);
    device const float *xr = x + r * a.ldx;
    float s = 0.0f;
    for (int i = s0; i < e0; i++) {
        float m = 0.0f;
        for (int h = 0; h < a.heads; h++) m += xr[(long)h * a.D + i];
        s += m / (float)a.heads;
    }
    y[r * a.ldy + j] = s / (float)(e0 - s0);
}

/* channels_last: column c of row (t ny + i) nx + j is x[c cs + min(t, t_avail - 1) ts + i rs + j]
   * scale[c] + shift[c], the product rounded before the sum. */
kernel void h3m_channels_last(device const float *x [[buffer(0)]], device const float *scale [[buffer(1)]],
                              device const float *shift [[buffer(2)]], device float *y [[buffer(3)]],
                              constant h3m_cl_args &a [[buffer(4)]], uint3 gid [[thread_position_in_grid]])
{
    const int c = (int)gid.x;
    const long r = gid.y;
    if (c >= a.C || r >= (long)a.nt * a.ny * a.nx) return;
    long t = r / ((long)a.ny * a.nx);
    const long i = (r / a.nx) % a.ny, j = r % a.nx;
    if (t > a.t_avail - 1) t = a.t_avail - 1;
    const float v = x[(long)c * a.cs + t * a.ts + i * a.rs + j];
    const float p = v * scale[c];
    y[r * a.ldy + c] = p + shift[c];
}

/* unpatchify: value (c, a, by, bx) of token tok0 + i goes to frame fmap[t pt + a] (dropped when
   negative) of dst [frames][C][gh ps][gw ps]. */
kernel void h3m_unpatchify(device const float *src [[buffer(0)]], device const int *fmap [[buffer(1)]],
                           device float *dst [[buffer(2)]], constant h3m_unpatch_args &a [[buffer(3)]],
                           uint3 gid [[thread_position_in_grid]])
{
    const int e = (int)gid.x;
    const long i = gid.y;
    const int cols = a.C * a.pt * a.ps * a.ps;
    if (e >= cols) return;
    const int bx = e % a.ps, by = e / a.ps % a.ps, pa = e / (a.ps * a.ps) % a.pt, c = e / (a.ps * a.ps * a.pt);
    const long tok = a.tok0 + i, t = tok / ((long)a.gh * a.gw), yy = (tok / a.gw) % a.gh, xx = tok % a.gw;
    const int f = fmap[t * a.pt + pa];
    if (f < 0) return;
    const long th = (long)a.gh * a.ps, tw = (long)a.gw * a.ps;
    dst[(((long)f * a.C + c) * th + yy * a.ps + by) * tw + xx * a.ps + bx] = src[i * a.lds + e];
}

/* ---- vae_stitch: diffusers' _stitch_tiles / _decode blend of one decoded tile (h3_bstitch). Every
   weight and product is rounded as the CPU backend rounds it (libh3/backend/cpu/cpu_models.c), so
   the pixels and the uint8 rgb are its bytes. A thread owns one canvas pixel of one channel and
   walks the window's frames in order: the carry frames it reads (the previous window's overlap)
   are read before the same thread overwrites them with this window's. */

/* a (1 - p) + v p, each weight and product rounded */
inline float h3m_fade(float a, float v, float p)
{
    const float wa = 1.0f - p;
    const float s = a * wa;
    const float t = v * p;
    return s + t;
}

/* One finished value of frame g, channel co, canvas (y, x) to the outputs. */
inline void h3m_stitch_emit(constant h3m_stitch_args &s, device uchar *rgb, device float *pixels,
                            device const float *mean, device const float *sd, int g, int y, int x, int co, float v)
{
    if (g >= s.frames) return; /* frames of padded latents are cut */
    if (s.raw && s.has_pixels) pixels[(((long)co * s.frames + g) * s.H + y) * s.W + x] = v;
    if (s.raw && !s.has_rgb) return;
    float f = v * sd[co];
    f = f + mean[co];
    f = f < 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f);
    const long o = (((long)g * s.H + y) * s.W + x) * s.C + co;
    if (s.has_pixels && !s.raw) pixels[o] = f;
    if (s.has_rgb) {
        /* round half to even as numpy does: adding and removing 2^23 rounds 0 <= q < 2^23 */
        float q = f * 255.0f;
        q = q + 8388608.0f;
        q = q - 8388608.0f;
        rgb[o] = q >= 0.0f ? (uchar)q : (uchar)0; /* NaN -> 0 */
    }
}

kernel void h3m_vae_stitch(device const float *tile [[buffer(0)]], device const float *above [[buffer(1)]],
                           device const float *left [[buffer(2)]], device float *carry [[buffer(3)]],
                           device uchar *rgb [[buffer(4)]], device float *pixels [[buffer(5)]],
                           device const float *mean [[buffer(6)]], device const float *sd [[buffer(7)]],
                           constant h3m_stitch_args &s [[buffer(8)]], uint3 gid [[thread_position_in_grid]])
{
    const int x = (int)gid.x, ry = (int)gid.y, co = (int)gid.z;
    if (x >= s.own_w || ry >= s.own_h || co >= s.C) return;
    const int y = s.y0 + ry, gx = s.x0 + x, K = s.K, C = s.C;
    const long HW = (long)s.H * s.W, pix = (long)y * s.W + gx;
    const bool last = s.window == s.windows - 1;
    const float p_top = s.ov_top ? (float)ry / (float)s.ov_top : 0.0f;
    for (int k = 0; k < K; k++) {
        float v = tile[(((long)k * C + co) * s.th + ry) * s.tw + x];
        if (ry < s.ov_top)
            v = h3m_fade(above[((((long)s.slot_above * K + k) * C + co) * s.max_ovy + ry) * s.tw + x], v, p_top);
        if (x < s.ov_left)
            v = h3m_fade(left[((((long)s.slot_left * K + k) * C + co) * s.th + ry) * s.max_ovx + x], v,
                         (float)x / (float)s.ov_left);
        if (k < s.keep0) {
            if (s.window > 0 && k < s.blend_t) {
                const int o = s.keep1 - s.blend_t + k; /* the overlap's last frames */
                v = h3m_fade(carry[((long)o * C + co) * HW + pix], v, (float)k / (float)s.blend_t);
            }
            h3m_stitch_emit(s, rgb, pixels, mean, sd, s.window * s.keep0 + k, y, gx, co, v);
        } else if (last) {
            h3m_stitch_emit(s, rgb, pixels, mean, sd, s.windows * s.keep0 + (k - s.keep0), y, gx, co, v);
        } else {
            carry[((long)(k - s.keep0) * C + co) * HW + pix] = v;
        }
    }
}

/* After h3m_vae_stitch: the tile's original bottom rows and right columns, kept for the tiles below
   and to the right (the slots the blend read are this tile's to overwrite now). */
kernel void h3m_vae_save_strips(device const float *tile [[buffer(0)]], device float *above [[buffer(1)]],
                                device float *left [[buffer(2)]], constant h3m_stitch_args &s [[buffer(3)]],
                                uint3 gid [[thread_position_in_grid]])
{
    const int x = (int)gid.x, y = (int)gid.y, kc = (int)gid.z;
    if (x >= s.tw || y >= s.th || kc >= s.K * s.C) return;
    const int k = kc / s.C, co = kc % s.C;
    const float v = tile[(((long)k * s.C + co) * s.th + y) * s.tw + x];
    if (s.ov_bottom && y >= s.th - s.ov_bottom)
        above[((((long)s.slot_above * s.K + k) * s.C + co) * s.max_ovy + (y - (s.th - s.ov_bottom))) * s.tw + x] = v;
    if (s.ov_right && x >= s.tw - s.ov_right)
        left[((((long)s.slot_left * s.K + k) * s.C + co) * s.th + y) * s.max_ovx + (x - (s.tw - s.ov_right))] = v;
}
