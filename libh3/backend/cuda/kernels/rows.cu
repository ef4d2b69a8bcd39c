/* Kernels of cuda_rows.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "rows.h"

namespace h3cuda {

/* y = ((x * inv) * w) * (1 + scale) + shift, torch's order (see dit.c norm_task). */
static __device__ __forceinline__ float norm_out(float xv, float inv, const float *w, const float *shift, int64_t n,
                                                 int64_t i)
{
    float t = __fmul_rn(xv, inv);
    if (w) t = __fmul_rn(t, w[i]);
    if (shift) t = __fadd_rn(__fmul_rn(t, shift[n + i]), shift[i]);
    return t;
}

/* One block per output row; up to VPT values per thread stay in registers between the sum of
   squares and the output pass (longer rows are read twice, the second time from cache). */
template <int NT, int VPT>
__global__ void __launch_bounds__(NT) norm_mod_kernel(NormArgs a)
{
    __shared__ double sh[NT / 32];
    const int64_t k = blockIdx.x;
    const int64_t r = a.rows ? a.rows[k] : k;
    const int64_t xo = r * a.ldx, n = a.n;
    float v[VPT];
    double ss = row_load<NT, VPT>(a.x, a.x_bf16, xo, n, v, [](float t) { return (double)t * (double)t; });
    ss = block_sum<NT>(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)a.eps));
    const float *shift = a.tab ? a.tab + ((int64_t)a.entry[r] * a.stride + a.slot) * n : nullptr;
    const int64_t yo = k * a.ldy;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        if (i < n) st_elem(a.y, a.y_bf16, yo + i, norm_out(v[j], inv, a.w, shift, n, i));
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT)
        st_elem(a.y, a.y_bf16, yo + i, norm_out(ld_elem(a.x, a.x_bf16, xo + i), inv, a.w, shift, n, i));
}

/* ---- vectorised paths ----------------------------------------------------------------------
   The transformer's rows are thousands of values wide and 16-byte aligned; these kernels move
   them 4 (8 for SwiGLU) values per thread per access, which the scalar kernels above cannot:
   their 2- and 4-byte accesses leave most of the bandwidth unused. Same arithmetic, operation
   for operation; only which thread sums which squares changes (the double sums of bf16 squares
   are exact; of f32 squares they may differ from the scalar kernel's in the last bit, as the
   scalar kernel's may from the CPU's). The scalar kernels remain for any view that is not
   aligned, and H3_CUDA_ROWS=scalar (read at create) keeps them for everything. */

/* v[0..N) <- N consecutive elements from p[i] (f32 or bf16), i a multiple of N, p aligned. */
template <int N>
static __device__ __forceinline__ void ld_vec(const void *p, int bf16, int64_t i, float *v)
{
    if (bf16) {
        const bf162_t *q = reinterpret_cast<const bf162_t *>(static_cast<const bf16_t *>(p) + i);
        if (N == 2) {
            const float2 f = bf22f2(q[0]);
            v[0] = f.x, v[1] = f.y;
        } else if (N == 4) {
            const uint2 u = *reinterpret_cast<const uint2 *>(q);
            const float2 a = bf22f2(*reinterpret_cast<const bf162_t *>(&u.x));
            const float2 c = bf22f2(*reinterpret_cast<const bf162_t *>(&u.y));
            v[0] = a.x, v[1] = a.y, v[2] = c.x, v[3] = c.y;
        } else {
#pragma unroll
            for (int k = 0; k < N; k += 8) {
                const uint4 u = *reinterpret_cast<const uint4 *>(q + k / 2);
                const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = bf22f2(*reinterpret_cast<const bf162_t *>(&w[e]));
                    v[k + 2 * e] = f.x, v[k + 2 * e + 1] = f.y;
                }
            }
        }
    } else {
        const float *f = static_cast<const float *>(p) + i;
        if (N == 2) {
            const float2 a = *reinterpret_cast<const float2 *>(f);
            v[0] = a.x, v[1] = a.y;
        } else {
#pragma unroll
            for (int k = 0; k < N; k += 4) {
                const float4 a = *reinterpret_cast<const float4 *>(f + k);
                v[k] = a.x, v[k + 1] = a.y, v[k + 2] = a.z, v[k + 3] = a.w;
            }
        }
    }
}

/* N consecutive elements to p[i], rounded to nearest even when bf16 (as st_elem). */
template <int N>
static __device__ __forceinline__ void st_vec(void *p, int bf16, int64_t i, const float *v)
{
    if (bf16) {
        bf162_t h[N / 2];
#pragma unroll
        for (int e = 0; e < N / 2; e++) h[e] = f2bf2(v[2 * e], v[2 * e + 1]);
        bf162_t *q = reinterpret_cast<bf162_t *>(static_cast<bf16_t *>(p) + i);
        if (N == 2)
            q[0] = h[0];
        else if (N == 4)
            *reinterpret_cast<uint2 *>(q) = *reinterpret_cast<const uint2 *>(h);
        else
#pragma unroll
            for (int k = 0; k < N / 8; k++) reinterpret_cast<uint4 *>(q)[k] = reinterpret_cast<const uint4 *>(h)[k];
    } else {
        float *f = static_cast<float *>(p) + i;
        if (N == 2)
            *reinterpret_cast<float2 *>(f) = make_float2(v[0], v[1]);
        else
#pragma unroll
            for (int k = 0; k < N; k += 4)
                *reinterpret_cast<float4 *>(f + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
    }
}

/* norm_mod (and gated_add_norm when ad.y is set) with 4 values per thread access: one block of
   NT threads per output row, the row in registers between the sum of squares and the output
   (V float4 groups per thread: n <= 4 * V * NT). */
template <int NT, int V>
__global__ void __launch_bounds__(NT) norm4_kernel(NormArgs a, AddArgs ad)
{
    __shared__ double sh[NT / 32];
    const int64_t k = blockIdx.x;
    const int64_t r = a.rows ? a.rows[k] : k;
    const int64_t xo = r * a.ldx, n = a.n;
    const float *g = ad.tab ? ad.tab + ((int64_t)ad.entry[r] * ad.stride + ad.slot) * n : nullptr;
    float v[V][4];
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int64_t i = 4 * (threadIdx.x + (int64_t)j * NT);
        if (i < n) {
            ld_vec<4>(a.x, a.x_bf16, xo + i, v[j]);
            if (ad.y) {
                float yv[4], gv[4] = {1.0f, 1.0f, 1.0f, 1.0f};
                ld_vec<4>(ad.y, ad.y_bf16, r * ad.ldy + i, yv);
                if (g) ld_vec<4>(g, 0, i, gv);
#pragma unroll
                for (int e = 0; e < 4; e++) v[j][e] = g ? __fadd_rn(v[j][e], __fmul_rn(gv[e], yv[e])) : __fadd_rn(v[j][e], yv[e]);
                st_vec<4>(const_cast<void *>(a.x), 0, xo + i, v[j]);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) ss += (double)v[j][e] * (double)v[j][e];
        }
    }
    ss = block_sum<NT>(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)a.eps));
    const float *shift = a.tab ? a.tab + ((int64_t)a.entry[r] * a.stride + a.slot) * n : nullptr;
    const int64_t yo = k * a.ldy;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int64_t i = 4 * (threadIdx.x + (int64_t)j * NT);
        if (i < n) {
            float o[4];
#pragma unroll
            for (int e = 0; e < 4; e++) o[e] = norm_out(v[j][e], inv, a.w, shift, n, i + e);
            st_vec<4>(a.y, a.y_bf16, yo + i, o);
        }
    }
}

/* One block per row; its jobs are the row's query heads, key heads and (with vin) value heads,
   one warp per job at a time. The warp reads the whole head into shared memory before writing
   anything, so an output may be its own input (q = qin, k = kin), and rotate-half can read the
   partner value i +- half. Arithmetic as cpu_backend.c's qkv_task: the mean square in double,
   (x * inv) * w, then o[i] = t[i] c[i] + (-t[i+half]) s[i], o[i+half] = t[i+half] c[i] + t[i] s[i]. */
__global__ void __launch_bounds__(QKV_WARPS * 32) qk_norm_rope_kernel(QkvArgs a)
{
    extern __shared__ float qkv_stage[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, D = a.D, half = a.half;
    const int64_t r = blockIdx.x;
    float *t = qkv_stage + (int64_t)warp * D;
    const float *cs = a.cos ? a.cos + r * half : nullptr, *sn = a.sin ? a.sin + r * half : nullptr;
    const int jobs = a.heads + a.kv_heads + (a.vin ? a.kv_heads : 0);
    for (int j = warp; j < jobs; j += QKV_WARPS) {
        const int s = j < a.heads ? 0 : j < a.heads + a.kv_heads ? 1 : 2;
        const int h = s == 0 ? j : s == 1 ? j - a.heads : j - a.heads - a.kv_heads;
        const void *in = s == 0 ? a.qin : s == 1 ? a.kin : a.vin;
        const int ibf = s == 0 ? a.qi_bf16 : s == 1 ? a.ki_bf16 : a.vi_bf16;
        const int64_t src = r * (s == 0 ? a.ldqi : s == 1 ? a.ldki : a.ldvi) + (int64_t)h * a.hs;
        void *out = s == 0 ? a.q : s == 1 ? a.k : a.v;
        const int obf = s == 0 ? a.q_bf16 : s == 1 ? a.k_bf16 : a.v_bf16;
        const int64_t dst = r * (s == 0 ? a.ldq : s == 1 ? a.ldk : a.ldv) + (int64_t)h * D;
        double ss = 0.0;
        for (int i = lane; i < D; i += 32) {
            const float xv = ld_elem(in, ibf, src + i);
            t[i] = xv;
            ss += (double)xv * (double)xv;
        }
        __syncwarp();
        if (s == 2) {
            for (int i = lane; i < D; i += 32) st_elem(out, obf, dst + i, t[i]);
            __syncwarp();
            continue;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float inv = (float)(1.0 / sqrt(ss / (double)D + (double)a.eps));
        const float *wt = s ? a.kn : a.qn;
        for (int i = lane; i < D; i += 32) {
            float yv = __fmul_rn(t[i], inv);
            if (wt) yv = __fmul_rn(yv, wt[i]);
            t[i] = yv;
        }
        __syncwarp();
        for (int i = lane; i < D; i += 32) {
            float o = t[i];
            if (cs && i < 2 * half) {
                if (i < half)
                    o = __fadd_rn(__fmul_rn(t[i], cs[i]), __fmul_rn(-t[i + half], sn[i]));
                else
                    o = __fadd_rn(__fmul_rn(t[i], cs[i - half]), __fmul_rn(t[i - half], sn[i - half]));
            }
            st_elem(out, obf, dst + i, o);
        }
        __syncwarp();
    }
}

/* qk_norm_rope with one warp per (row, head) job and the head in registers: lane l holds the VL
   = D / 32 consecutive values [l VL, (l+1) VL), read and written VL at a time; the rotate-half
   partner i +- half lives half / VL lanes away and comes over a shuffle (half a multiple of VL).
   The arithmetic is qk_norm_rope_kernel's. A warp reads its whole head before writing, so q may
   be qin and k may be kin. */
template <int VL>
__global__ void __launch_bounds__(256) qk_warp_kernel(QkvArgs a, int64_t total, int jobs)
{
    const int64_t gw = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (gw >= total) return; /* whole warps leave together */
    const int lane = threadIdx.x & 31, half = a.half;
    const int64_t r = gw / jobs;
    const int j = (int)(gw - r * jobs);
    const int s = j < a.heads ? 0 : j < a.heads + a.kv_heads ? 1 : 2;
    const int h = s == 0 ? j : s == 1 ? j - a.heads : j - a.heads - a.kv_heads;
    const void *in = s == 0 ? a.qin : s == 1 ? a.kin : a.vin;
    const int ibf = s == 0 ? a.qi_bf16 : s == 1 ? a.ki_bf16 : a.vi_bf16;
    const int64_t src = r * (s == 0 ? a.ldqi : s == 1 ? a.ldki : a.ldvi) + (int64_t)h * a.hs + lane * VL;
    void *out = s == 0 ? a.q : s == 1 ? a.k : a.v;
    const int obf = s == 0 ? a.q_bf16 : s == 1 ? a.k_bf16 : a.v_bf16;
    const int64_t dst = r * (s == 0 ? a.ldq : s == 1 ? a.ldk : a.ldv) + (int64_t)h * a.D + lane * VL;
    float t[VL];
    ld_vec<VL>(in, ibf, src, t);
    if (s == 2) {
        st_vec<VL>(out, obf, dst, t);
        return;
    }
    double ss = 0.0;
#pragma unroll
    for (int e = 0; e < VL; e++) ss += (double)t[e] * (double)t[e];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = (float)(1.0 / sqrt(ss / (double)a.D + (double)a.eps));
    const float *wt = s ? a.kn : a.qn;
#pragma unroll
    for (int e = 0; e < VL; e++) {
        float yv = __fmul_rn(t[e], inv);
        if (wt) yv = __fmul_rn(yv, wt[lane * VL + e]);
        t[e] = yv;
    }
    if (a.cos) {
        const int base = lane * VL, hl = half / VL;
        const int from = base < half ? lane + hl : base < 2 * half ? lane - hl : lane;
        float p[VL];
#pragma unroll
        for (int e = 0; e < VL; e++) p[e] = __shfl_sync(0xffffffffu, t[e], from);
        const float *cs = a.cos + r * half, *sn = a.sin + r * half;
#pragma unroll
        for (int e = 0; e < VL; e++) {
            const int i = base + e;
            if (i < half)
                t[e] = __fadd_rn(__fmul_rn(t[e], cs[i]), __fmul_rn(-p[e], sn[i]));
            else if (i < 2 * half)
                t[e] = __fadd_rn(__fmul_rn(t[e], cs[i - half]), __fmul_rn(p[e], sn[i - half]));
        }
    }
    st_vec<VL>(out, obf, dst, t);
}

/* ---- gated_add, swiglu, scatter_rows ------------------------------------------------------- */

/* x += g * y (the product rounded first, as torch does); g NULL: x += y. */
__global__ void gated_add_kernel(float *x, int64_t ldx, const void *y, int y_bf16, int64_t ldy, const float *tab,
                                 const int32_t *entry, int64_t stride, int64_t slot, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *g = tab ? tab + ((int64_t)entry[r] * stride + slot) * n : nullptr;
        float *xr = x + r * ldx;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            const float yv = ld_elem(y, y_bf16, r * ldy + i);
            xr[i] = g ? __fadd_rn(xr[i], __fmul_rn(g[i], yv)) : __fadd_rn(xr[i], yv);
        }
    }
}

/* gated_add with 4 values per access (rows aligned as vec_ok checks). */
__global__ void gated_add4_kernel(float *x, int64_t ldx, const void *y, int y_bf16, int64_t ldy, const float *tab,
                                  const int32_t *entry, int64_t stride, int64_t slot, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *g = tab ? tab + ((int64_t)entry[r] * stride + slot) * n : nullptr;
        for (int64_t i = 4 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n;
             i += 4 * (int64_t)gridDim.x * blockDim.x) {
            float xv[4], yv[4], gv[4];
            ld_vec<4>(x, 0, r * ldx + i, xv);
            ld_vec<4>(y, y_bf16, r * ldy + i, yv);
            if (g) ld_vec<4>(g, 0, i, gv);
#pragma unroll
            for (int e = 0; e < 4; e++) xv[e] = g ? __fadd_rn(xv[e], __fmul_rn(gv[e], yv[e])) : __fadd_rn(xv[e], yv[e]);
            st_vec<4>(x, 0, r * ldx + i, xv);
        }
    }
}

/* out = up * (gate / (1 + exp(-gate))), the CPU's expression (out may alias gate: each element
   is read before it is written, by the same thread). */
__global__ void swiglu_kernel(const void *g, int g_bf16, int64_t ldg, const void *u, int u_bf16, int64_t ldu, void *o,
                              int o_bf16, int64_t ldo, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            const float gv = ld_elem(g, g_bf16, r * ldg + i), uv = ld_elem(u, u_bf16, r * ldu + i);
            st_elem(o, o_bf16, r * ldo + i, __fmul_rn(uv, __fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv)))));
        }
}

/* swiglu with 8 values per access (all three views bf16 or all f32, rows aligned). */
__global__ void swiglu8_kernel(const void *g, const void *u, void *o, int bf16, int64_t ldg, int64_t ldu, int64_t ldo,
                               int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = 8 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n;
             i += 8 * (int64_t)gridDim.x * blockDim.x) {
            float gv[8], uv[8];
            ld_vec<8>(g, bf16, r * ldg + i, gv);
            ld_vec<8>(u, bf16, r * ldu + i, uv);
#pragma unroll
            for (int e = 0; e < 8; e++) gv[e] = __fmul_rn(uv[e], __fdiv_rn(gv[e], __fadd_rn(1.0f, expf(-gv[e]))));
            st_vec<8>(o, bf16, r * ldo + i, gv);
        }
}

/* dst[idx[i]] = src[i]; an index outside dst is skipped rather than written out of bounds. */
__global__ void scatter_rows_kernel(const void *s, int s_bf16, int64_t lds, const int64_t *idx, void *d, int d_bf16,
                                    int64_t ldd, int64_t drows, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const int64_t t = idx[r];
        if (t < 0 || t >= drows) continue;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            st_elem(d, d_bf16, t * ldd + i, ld_elem(s, s_bf16, r * lds + i));
    }
}

/* ---- euler --------------------------------------------------------------------------------- */

/* h3_sched_euler's arithmetic, one rounding per operation in the same order (bit-identical). */
__global__ void euler_kernel(float *x, const float *v, int64_t n, float sft, float ratio, float keep)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float xv = x[i];
        const float prod = __fmul_rn(sft, v[i]);
        const float denoised = __fadd_rn(xv, prod);
        const float a = __fmul_rn(ratio, xv);
        const float bb = __fmul_rn(keep, denoised);
        x[i] = __fadd_rn(a, bb);
    }
}

/* ---- conversions --------------------------------------------------------------------------- */

__global__ void f32_bf16_2d_kernel(const float *s, int64_t lds, bf16_t *d, int64_t ldd, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            d[r * ldd + i] = f2bf(s[r * lds + i]);
}

__global__ void bias_store_kernel(const float *s, const float *bias, void *d, int d_bf16, int64_t ldd, int64_t rows,
                                  int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
            float v = s[r * n + i];
            if (bias) v = __fadd_rn(v, bias[i]);
            st_elem(d, d_bf16, r * ldd + i, v);
        }
}

/* Weights: f32 or f16 to bf16, round to nearest even (f16 widens to f32 exactly first). The
   source is a 64 MiB staging chunk fresh from PCIe, so a plain grid-stride loop keeps up. */
__global__ void to_bf16_kernel(const void *s, int f16, bf16_t *d, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = f16 ? h2f(static_cast<const f16_t *>(s)[i]) : static_cast<const float *>(s)[i];
        d[i] = f2bf(v);
    }
}

} /* namespace h3cuda */
