/* Kernels of cuda_decoders.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "decoders.h"

namespace h3cuda {

/* ---- channels_last ------------------------------------------------------------------------- */

/* box = [scale C | shift C | x C x ta x ny x nx] (packed on the host). Row r of y is (t, i, j); its
   frame t reads packed frame min(t, ta - 1): the short last window repeats its last latent. */
__global__ void channels_last_kernel(const float *__restrict__ box, int C, int ta, int ny, int nx, int64_t rows,
                                     void *y, int y_bf16, int64_t ldy)
{
    const float *scale = box, *shift = box + C, *x = box + 2 * (int64_t)C;
    const int64_t n = rows * C, plane = (int64_t)ny * nx;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / C;
        const int c = (int)(e - r * C);
        int64_t t = r / plane;
        const int64_t ij = r - t * plane;
        if (t > ta - 1) t = ta - 1;
        const float v = x[((int64_t)c * ta + t) * plane + ij];
        st_elem(y, y_bf16, r * ldy + c, __fadd_rn(__fmul_rn(v, scale[c]), shift[c])); /* x * std, then + mean */
    }
}

/* ---- unpatchify ---------------------------------------------------------------------------- */

/* Value (c, a, by, bx) of row i (token tok0 + i = (t, y, x)) to frame fmap[t * pt + a] (dropped when
   negative) at (y * ps + by, x * ps + bx). Consecutive threads take consecutive bx: the stores are
   coalesced runs of ps values. */
__global__ void unpatchify_kernel(const void *src, int s_bf16, int64_t lds, int64_t rows, int64_t tok0, int gh, int gw,
                                  int C, int pt, int ps, const int32_t *__restrict__ fmap, float *dst)
{
    const int64_t cols = (int64_t)C * pt * ps * ps, n = rows * cols, grid = (int64_t)gh * gw;
    const int64_t th = (int64_t)gh * ps, tw = (int64_t)gw * ps;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / cols;
        int64_t q = e - i * cols;
        const int bx = (int)(q % ps);
        q /= ps;
        const int by = (int)(q % ps);
        q /= ps;
        const int a = (int)(q % pt);
        const int c = (int)(q / pt);
        const int64_t tok = tok0 + i, t = tok / grid, yy = (tok / gw) % gh, xx = tok % gw;
        const int f = fmap[t * pt + a];
        if (f < 0) continue;
        dst[(((int64_t)f * C + c) * th + yy * ps + by) * tw + xx * ps + bx] =
            ld_elem(src, s_bf16, i * lds + (e - i * cols));
    }
}

/* v = a * (1 - p) + v * p, each product and the difference rounded as torch does. */
static __device__ __forceinline__ float fade(float a, float v, float p)
{
    return __fadd_rn(__fmul_rn(a, __fsub_rn(1.0f, p)), __fmul_rn(v, p));
}

/* One thread per owned pixel and channel, over the launch's frames in order. The same thread reads
   the carry frames a window blends (k < blend_t) before it overwrites them with this window's
   overlap frames (k >= keep0), and no other thread touches that pixel: the CPU's order. */
__global__ void stitch_kernel(StitchArgs s)
{
    const int64_t n = (int64_t)s.own_w * s.own_h * s.C, HW = (int64_t)s.H * s.W;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int x = (int)(e % s.own_w);
        const int ry = (int)((e / s.own_w) % s.own_h);
        const int co = (int)(e / ((int64_t)s.own_w * s.own_h));
        const int64_t pix = (int64_t)(s.y0 + ry) * s.W + s.x0 + x;
        const float p_top = s.ov_top ? __fdiv_rn((float)ry, (float)s.ov_top) : 0.0f;
        const float p_left = x < s.ov_left ? __fdiv_rn((float)x, (float)s.ov_left) : 0.0f;
        for (int k = s.k0; k < s.k1; k++) {
            float v = s.tile[(((int64_t)k * s.C + co) * s.th + ry) * s.tw + x];
            if (ry < s.ov_top)
                v = fade(s.above[((((int64_t)s.slot_above * s.K + k) * s.C + co) * s.max_ovy + ry) * s.tw + x], v,
                         p_top);
            if (x < s.ov_left)
                v = fade(s.left[((((int64_t)s.slot_left * s.K + k) * s.C + co) * s.th + ry) * s.max_ovx + x], v,
                         p_left);
            if (k < s.keep0) {
                if (s.window > 0 && k < s.blend_t) {
                    const int o = s.keep1 - s.blend_t + k; /* _blend uses the overlap's last frames */
                    v = fade(s.carry[((int64_t)o * s.C + co) * HW + pix], v, __fdiv_rn((float)k, (float)s.blend_t));
                }
            } else if (!s.last) {
                s.carry[((int64_t)(k - s.keep0) * s.C + co) * HW + pix] = v;
                continue;
            }
            if (k >= s.kemit) continue; /* frames of padded latents are cut, as `_decode` does */
            const int64_t kk = k - s.k0, at = (kk * s.own_h + ry) * s.own_w + x;
            if (s.raw) s.raw[((int64_t)co * s.nb + kk) * s.own_h * s.own_w + (int64_t)ry * s.own_w + x] = v;
            if (!s.rgb && !s.pix) continue;
            /* video * pixel_std + pixel_mean, clamp(0, 1), then the processor's (x * 255).round():
               adding and removing 2^23 rounds half to even, as numpy does (NaN -> 0). */
            float f = __fadd_rn(__fmul_rn(v, s.sd[co]), s.mean[co]);
            f = f < 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f);
            if (s.pix) s.pix[at * s.C + co] = f;
            if (s.rgb) {
                float q = __fmul_rn(f, 255.0f);
                q = __fsub_rn(__fadd_rn(q, 8388608.0f), 8388608.0f);
                s.rgb[at * s.C + co] = q >= 0.0f ? (uint8_t)q : (uint8_t)0;
            }
        }
    }
}

static __device__ __forceinline__ int64_t clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* sin(x)^2 exactly as avae_kern.inc's sin2_8 computes a lane (the same reduction by a three-part
   pi/2, the same Taylor polynomials, every operation rounded on its own); beyond |x| = 6000 (and
   for NaN) through sin in double, as there. */
static __device__ __forceinline__ float sin2_dev(float x)
{
    if (!(fabsf(x) <= 6000.0f)) {
        const float s = (float)sin((double)x);
        return __fmul_rn(s, s);
    }
    const float P1 = 1.57080078125f, P2 = -4.453584551811218e-06f, P3 = -8.705516307827565e-10f;
    float t = __fmul_rn(x, 0.6366197466850281f);
    t = __fadd_rn(t, t >= 0.0f ? 0.5f : -0.5f);
    const int q = (int)t; /* truncation of t +- 0.5: the nearest integer */
    const float qf = (float)q;
    const float r = __fsub_rn(__fsub_rn(__fsub_rn(x, __fmul_rn(qf, P1)), __fmul_rn(qf, P2)), __fmul_rn(qf, P3));
    const float r2 = __fmul_rn(r, r);
    float ps = __fadd_rn(-1.0f / 5040.0f, __fmul_rn(r2, 1.0f / 362880.0f));
    ps = __fadd_rn(1.0f / 120.0f, __fmul_rn(r2, ps));
    ps = __fadd_rn(-1.0f / 6.0f, __fmul_rn(r2, ps));
    const float s = __fadd_rn(r, __fmul_rn(__fmul_rn(r, r2), ps));
    float pc = __fadd_rn(1.0f / 40320.0f, __fmul_rn(r2, -1.0f / 3628800.0f));
    pc = __fadd_rn(-1.0f / 720.0f, __fmul_rn(r2, pc));
    pc = __fadd_rn(1.0f / 24.0f, __fmul_rn(r2, pc));
    const float c = __fadd_rn(__fsub_rn(1.0f, __fmul_rn(0.5f, r2)), __fmul_rn(__fmul_rn(r2, r2), pc));
    const float v = (q & 1) ? c : s;
    return __fmul_rn(v, v);
}

/* Block (output rows [m0, m0 + AA_TM), channels [c0, c0 + TC)): the upsampled, activated samples
   those rows read go to shared memory (one thread per sample and channel), then each output is
   the 12-tap low-pass of them. Every sum runs from zero in tap order, as the CPU's. */
__global__ void __launch_bounds__(AA_THREADS) snake_aa_kernel(AaArgs A)
{
    extern __shared__ float aa_z[];
    __shared__ float wup[H3_AA_TAPS], wdn[H3_AA_TAPS];
    if (threadIdx.x < H3_AA_TAPS) {
        wup[threadIdx.x] = A.fup[threadIdx.x];
        wdn[threadIdx.x] = A.fdown[threadIdx.x];
    }
    __syncthreads();
    const int TC = A.TC, c0 = blockIdx.y * TC;
    const int64_t L = A.L, NZ = 2 * L, m0 = (int64_t)blockIdx.x * AA_TM;
    const int64_t m1 = m0 + AA_TM < L ? m0 + AA_TM : L;
    const int64_t n0 = clamp64(2 * m0 - AA_DN_LEFT, 0, NZ - 1);
    const int64_t n1 = clamp64(2 * (m1 - 1) + (H3_AA_TAPS - 1 - AA_DN_LEFT), 0, NZ - 1);
    const int64_t nz = n1 - n0 + 1;
    for (int64_t idx = threadIdx.x; idx < nz * TC; idx += AA_THREADS) {
        const int64_t zi = idx / TC;
        const int cc = (int)(idx - zi * TC), c = c0 + cc;
        if (c >= A.C) continue;
        const int64_t n = n0 + zi;
        const int par = (int)((n + AA_UP_CROP) & 1);
        const int64_t s0 = (n + AA_UP_CROP - par) / H3_AA_RATIO - AA_UP_PAD;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < AA_UP_NTAP; j++)
            acc = __fadd_rn(acc, __fmul_rn(A.x[clamp64(s0 - j, 0, L - 1) * A.C + c], wup[par + H3_AA_RATIO * j]));
        const float u = __fmul_rn((float)H3_AA_RATIO, acc);
        aa_z[zi * TC + cc] = __fadd_rn(u, __fmul_rn(A.rb[c], sin2_dev(__fmul_rn(A.a[c], u))));
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < (m1 - m0) * TC; idx += AA_THREADS) {
        const int64_t mi = idx / TC;
        const int cc = (int)(idx - mi * TC), c = c0 + cc;
        if (c >= A.C) continue;
        const int64_t m = m0 + mi, first = 2 * m - AA_DN_LEFT;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < H3_AA_TAPS; k++)
            acc = __fadd_rn(acc, __fmul_rn(aa_z[(clamp64(first + k, 0, NZ - 1) - n0) * TC + cc], wdn[k]));
        A.p[((m % A.d) * A.phase_rows + A.margin + m / A.d) * A.C + c] = acc;
    }
}

/* The rows of a phased destination the activation does not write: each phase's leading margin and
   everything after its data. grid.y = phase. */
__global__ void phased_zero_kernel(float *p, int d, int64_t phase_rows, int64_t margin, int64_t L, int C)
{
    const int r = blockIdx.y;
    const int64_t rows = r < L ? (L - r + d - 1) / d : 0, tail0 = margin + rows;
    const int64_t nzero = (margin + phase_rows - tail0) * C;
    float *ph = p + (int64_t)r * phase_rows * C;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nzero; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = e / C < margin ? e / C : tail0 + (e / C - margin);
        ph[row * C + e % C] = 0.0f;
    }
}

/* ---- conv_gemm ----------------------------------------------------------------------------- */

/* Row m of the im2col matrix = the K values from X + m * ldx (windows that overlap), in the GEMM's
   operand type: bf16 (rounded to nearest even once, as every GEMM input of this backend) or f32;
   rows are ldd apart (a multiple of 16 bytes, for cuBLASLt's vectorised loads). */
template <typename T>
__global__ void im2col_kernel(const void *X, int x_bf16, int64_t ldx, int64_t M, int64_t K, T *d, int64_t ldd)
{
    for (int64_t r = blockIdx.y; r < M; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < K; i += (int64_t)gridDim.x * blockDim.x) {
            const float v = ld_elem(X, x_bf16, r * ldx + i);
            if constexpr (sizeof(T) == 2)
                d[r * ldd + i] = f2bf(v);
            else
                d[r * ldd + i] = v;
        }
}

__global__ void add_bias_kernel(float *y, int64_t ldy, const float *bias, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            y[r * ldy + i] = __fadd_rn(y[r * ldy + i], bias[i]);
}

/* Where cuBLASLt has no algorithm: one output per thread, K staged through shared memory in tiles,
   summed in k order (deterministic), bias added last as the epilogue does. */
__global__ void gemm_f32_kernel(const float *__restrict__ X, int64_t ldx, const float *__restrict__ W,
                                const float *__restrict__ bias, float *Y, int64_t ldy, int64_t M, int64_t N, int64_t K)
{
    __shared__ float xs[F32_T][F32_T + 1], ws[F32_T][F32_T + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t m = (int64_t)blockIdx.y * F32_T + ty, n = (int64_t)blockIdx.x * F32_T + tx;
    const int64_t wn = (int64_t)blockIdx.x * F32_T + ty;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += F32_T) {
        const int64_t k = k0 + tx;
        xs[ty][tx] = m < M && k < K ? X[m * ldx + k] : 0.0f;
        ws[ty][tx] = wn < N && k < K ? W[wn * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < F32_T; j++) acc = fmaf(xs[ty][j], ws[tx][j], acc);
        __syncthreads();
    }
    if (m < M && n < N) Y[m * ldy + n] = bias ? __fadd_rn(acc, bias[n]) : acc;
}

/* ---- conv1_clamp --------------------------------------------------------------------------- */

/* y[m] = clamp(w . x_m, -1, 1): eight running sums over lanes j % 8 (the CPU's vector lanes), added
   in lane order, then the tail; torch.clamp keeps NaN (both comparisons are false). */
__global__ void conv1_clamp_kernel(const float *__restrict__ X, int64_t ldx, int n, const float *__restrict__ w,
                                   float *y, int64_t M)
{
    for (int64_t m = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; m < M; m += (int64_t)gridDim.x * blockDim.x) {
        const float *x = X + m * ldx;
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        int j = 0;
        for (; j + 8 <= n; j += 8)
#pragma unroll
            for (int l = 0; l < 8; l++) acc[l] = __fadd_rn(acc[l], __fmul_rn(x[j + l], w[j + l]));
        float s = 0.0f;
#pragma unroll
        for (int l = 0; l < 8; l++) s = __fadd_rn(s, acc[l]);
        for (; j < n; j++) s = __fadd_rn(s, __fmul_rn(x[j], w[j]));
        y[m] = s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
    }
}

} /* namespace h3cuda */
