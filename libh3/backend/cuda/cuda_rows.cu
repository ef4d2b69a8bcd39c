/*
 * The row-wise ops of backend.h on the GPU: norm_mod, qk_norm_rope, gated_add, swiglu,
 * scatter_rows, euler, and the dtype conversions the GEMM path and the weight upload use.
 *
 * Arithmetic follows the CPU backend operation for operation (models/dit.c and
 * backend/cpu/kernels.inc, which follow torch): products and sums are written with __fmul_rn /
 * __fadd_rn so nvcc cannot contract them into fused multiply-adds, mean squares are summed in
 * double (exact squares, a fixed reduction tree), and the reciprocal RMS is computed in double and
 * rounded to f32 as the CPU does. With f32 outputs these kernels therefore agree with the CPU to
 * the last bit except where the double sums of a norm round differently (rare; never more than
 * one ulp of the scale). Euler is bit-identical.
 *
 * Inputs and outputs are f32 or bf16 as each view's dtype says (the dtype is a launch argument:
 * a uniform branch costs nothing in these memory-bound kernels).
 */
#include "backend/cuda/cuda_common.cuh"

#include <string.h>

namespace h3cuda {

/* ---- norm_mod ------------------------------------------------------------------------------ */

struct NormArgs {
    const void *x;
    int64_t ldx;
    const int64_t *rows;
    const float *w, *tab;
    const int32_t *entry;
    int64_t stride, slot;
    void *y;
    int64_t ldy, n;
    float eps;
    int x_bf16, y_bf16;
};

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
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        v[j] = 0.0f;
        if (i < n) {
            v[j] = ld_elem(a.x, a.x_bf16, xo + i);
            ss += (double)v[j] * (double)v[j];
        }
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT) {
        const double t = ld_elem(a.x, a.x_bf16, xo + i);
        ss += t * t;
    }
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
        const __nv_bfloat162 *q = reinterpret_cast<const __nv_bfloat162 *>(static_cast<const __nv_bfloat16 *>(p) + i);
        if (N == 2) {
            const float2 f = __bfloat1622float2(q[0]);
            v[0] = f.x, v[1] = f.y;
        } else if (N == 4) {
            const uint2 u = *reinterpret_cast<const uint2 *>(q);
            const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
            const float2 c = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
            v[0] = a.x, v[1] = a.y, v[2] = c.x, v[3] = c.y;
        } else {
#pragma unroll
            for (int k = 0; k < N; k += 8) {
                const uint4 u = *reinterpret_cast<const uint4 *>(q + k / 2);
                const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w[e]));
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
        __nv_bfloat162 h[N / 2];
#pragma unroll
        for (int e = 0; e < N / 2; e++) h[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
        __nv_bfloat162 *q = reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(p) + i);
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

/* Whether a view's rows can be read N elements at a time from element offset `off`. */
static bool vec_ok(const void *p, int bf16, int64_t ld, int64_t off, int N)
{
    const size_t es = bf16 ? 2 : 4;
    return ((uintptr_t)p % (es * (size_t)N)) == 0 && ld % N == 0 && off % N == 0;
}

/* The residual add folded into the norm (gated_add_norm): x[r] += g * y[r] first. */
struct AddArgs {
    const void *y;
    int64_t ldy;
    int y_bf16;
    const float *tab;
    const int32_t *entry;
    int64_t stride, slot;
};

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

/* Launch norm4_kernel when the views allow it; 1 = launched (or failed: *rc), 0 = not eligible. */
static int norm4_launch(Backend *b, const NormArgs &a, const AddArgs &ad, int64_t rows, int *rc)
{
    if (b->rows_scalar || a.n % 4 || a.n > 4 * 8 * 256) return 0;
    if (!vec_ok(a.x, a.x_bf16, a.ldx, 0, 4) || !vec_ok(a.y, a.y_bf16, a.ldy, 0, 4)) return 0;
    if ((a.w && (uintptr_t)a.w % 16) || (a.tab && (uintptr_t)a.tab % 16)) return 0;
    if (ad.y && (!vec_ok(ad.y, ad.y_bf16, ad.ldy, 0, 4) || (ad.tab && (uintptr_t)ad.tab % 16))) return 0;
    const int64_t groups = a.n / 4;
    const unsigned grid = (unsigned)rows;
    if (groups <= 128)
        norm4_kernel<128, 1><<<grid, 128, 0, b->stream>>>(a, ad);
    else if (groups <= 256)
        norm4_kernel<128, 2><<<grid, 128, 0, b->stream>>>(a, ad);
    else if (groups <= 512)
        norm4_kernel<256, 2><<<grid, 256, 0, b->stream>>>(a, ad);
    else if (groups <= 1024)
        norm4_kernel<256, 4><<<grid, 256, 0, b->stream>>>(a, ad);
    else if (groups <= 1536)
        norm4_kernel<256, 6><<<grid, 256, 0, b->stream>>>(a, ad);
    else
        norm4_kernel<256, 8><<<grid, 256, 0, b->stream>>>(a, ad);
    *rc = check_launch(b, "norm4_kernel");
    return 1;
}

int norm_mod(Backend *b, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod, float eps,
             const h3_bt *y)
{
    int rc;
    if ((rc = check_view(b, "norm_mod", "x", x)) || (rc = check_view(b, "norm_mod", "y", y))) return rc;
    if (y->cols != x->cols)
        return fail(b, H3_E_INVALID, "cuda: norm_mod: x has %lld columns, y %lld", (long long)x->cols,
                    (long long)y->cols);
    if (!rows && y->rows > x->rows)
        return fail(b, H3_E_INVALID, "cuda: norm_mod: %lld output rows from %lld input rows", (long long)y->rows,
                    (long long)x->rows);
    if (mod && mod->tab && !mod->row_entry)
        return fail(b, H3_E_INVALID, "cuda: norm_mod: a modulation table without row entries");
    if (y->rows == 0 || x->cols == 0) return 0;
    if (y->rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: norm_mod: too many rows");
    NormArgs a;
    a.x = x->data;
    a.ldx = x->ld;
    a.rows = rows;
    a.w = w;
    a.tab = mod ? mod->tab : nullptr;
    a.entry = mod ? mod->row_entry : nullptr;
    a.stride = mod ? mod->stride : 0;
    a.slot = mod ? mod->slot : 0;
    a.y = y->data;
    a.ldy = y->ld;
    a.n = x->cols;
    a.eps = eps;
    a.x_bf16 = x->dtype == H3_DT_BF16;
    a.y_bf16 = y->dtype == H3_DT_BF16;
    AddArgs none;
    memset(&none, 0, sizeof none);
    if (norm4_launch(b, a, none, y->rows, &rc)) return rc;
    if (a.n <= 1024)
        norm_mod_kernel<128, 8><<<(unsigned)y->rows, 128, 0, b->stream>>>(a);
    else
        norm_mod_kernel<256, 24><<<(unsigned)y->rows, 256, 0, b->stream>>>(a);
    return check_launch(b, "norm_mod_kernel");
}

/* ---- qk_norm_rope -------------------------------------------------------------------------- */

struct QkvArgs {
    const void *qin, *kin, *vin;
    int64_t ldqi, ldki, ldvi;
    void *q, *k, *v;
    int64_t ldq, ldk, ldv;
    const float *qn, *kn, *cos, *sin;
    int heads, kv_heads, hs, D, half;
    float eps;
    int qi_bf16, ki_bf16, vi_bf16, q_bf16, k_bf16, v_bf16;
};

#define QKV_WARPS 4

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

/* Launch qk_warp_kernel when D = 32 VL (VL 2, 4 or 8), the rotation splits on lane boundaries and
   every view is aligned for VL-wide access; 1 = launched (or failed: *rc), 0 = not eligible. */
static int qk_warp_launch(Backend *b, const QkvArgs &a, int64_t rows, int *rc)
{
    const int VL = a.D / 32;
    if (b->rows_scalar || a.D % 32 || (VL != 2 && VL != 4 && VL != 8) || a.half % VL || a.hs % VL) return 0;
    if (!vec_ok(a.qin, a.qi_bf16, a.ldqi, 0, VL) || !vec_ok(a.kin, a.ki_bf16, a.ldki, 0, VL) ||
        !vec_ok(a.q, a.q_bf16, a.ldq, 0, VL) || !vec_ok(a.k, a.k_bf16, a.ldk, 0, VL) ||
        (a.vin && (!vec_ok(a.vin, a.vi_bf16, a.ldvi, 0, VL) || !vec_ok(a.v, a.v_bf16, a.ldv, 0, VL))))
        return 0;
    const int jobs = a.heads + a.kv_heads + (a.vin ? a.kv_heads : 0);
    const int64_t total = rows * jobs, blocks = (total + 7) / 8;
    if (blocks > 0x7fffffffLL) return 0;
    if (VL == 2)
        qk_warp_kernel<2><<<(unsigned)blocks, 256, 0, b->stream>>>(a, total, jobs);
    else if (VL == 4)
        qk_warp_kernel<4><<<(unsigned)blocks, 256, 0, b->stream>>>(a, total, jobs);
    else
        qk_warp_kernel<8><<<(unsigned)blocks, 256, 0, b->stream>>>(a, total, jobs);
    *rc = check_launch(b, "qk_warp_kernel");
    return 1;
}

int qk_norm_rope(Backend *b, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs, const float *qn,
                 const float *kn, const float *cos, const float *sin, int heads, int kv_heads, int D, int half,
                 float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v)
{
    int rc;
    if ((rc = check_view(b, "qk_norm_rope", "qin", qin)) || (rc = check_view(b, "qk_norm_rope", "kin", kin)) ||
        (rc = check_view(b, "qk_norm_rope", "q", q)) || (rc = check_view(b, "qk_norm_rope", "k", k)) ||
        (vin && ((rc = check_view(b, "qk_norm_rope", "vin", vin)) || (rc = check_view(b, "qk_norm_rope", "v", v)))))
        return rc;
    if (heads <= 0 || kv_heads <= 0 || D <= 0 || half < 0 || 2 * half > D || D > 4096 || hs < D)
        return fail(b, H3_E_INVALID, "cuda: qk_norm_rope: %d heads (%d kv) of %d dims, %d apart, rope over %d", heads,
                    kv_heads, D, hs, 2 * half);
    if ((cos == nullptr) != (sin == nullptr))
        return fail(b, H3_E_INVALID, "cuda: qk_norm_rope: cos and sin must both be given or both be NULL");
    const int64_t rows = q->rows;
    const int64_t in_q = (int64_t)(heads - 1) * hs + D, in_k = (int64_t)(kv_heads - 1) * hs + D;
    if (qin->cols < in_q || kin->cols < in_k || (vin && vin->cols < in_k) || q->cols < (int64_t)heads * D ||
        k->cols < (int64_t)kv_heads * D || (vin && v->cols < (int64_t)kv_heads * D) || qin->rows < rows ||
        kin->rows < rows || k->rows < rows || (vin && (vin->rows < rows || v->rows < rows)))
        return fail(b, H3_E_INVALID, "cuda: qk_norm_rope: the views do not hold %lld rows of %d heads (%d kv) of %d",
                    (long long)rows, heads, kv_heads, D);
    if (rows == 0) return 0;
    if (rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: qk_norm_rope: too many rows");
    QkvArgs a;
    memset(&a, 0, sizeof a);
    a.qin = qin->data;
    a.kin = kin->data;
    a.vin = vin ? vin->data : nullptr;
    a.ldqi = qin->ld;
    a.ldki = kin->ld;
    a.ldvi = vin ? vin->ld : 0;
    a.q = q->data;
    a.k = k->data;
    a.v = vin ? v->data : nullptr;
    a.ldq = q->ld;
    a.ldk = k->ld;
    a.ldv = vin ? v->ld : 0;
    a.qn = qn;
    a.kn = kn;
    a.cos = cos;
    a.sin = sin;
    a.heads = heads;
    a.kv_heads = kv_heads;
    a.hs = hs;
    a.D = D;
    a.half = half;
    a.eps = eps;
    a.qi_bf16 = qin->dtype == H3_DT_BF16;
    a.ki_bf16 = kin->dtype == H3_DT_BF16;
    a.vi_bf16 = vin && vin->dtype == H3_DT_BF16;
    a.q_bf16 = q->dtype == H3_DT_BF16;
    a.k_bf16 = k->dtype == H3_DT_BF16;
    a.v_bf16 = vin && v->dtype == H3_DT_BF16;
    if (qk_warp_launch(b, a, rows, &rc)) return rc;
    const size_t smem = sizeof(float) * QKV_WARPS * (size_t)D;
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(qk_norm_rope_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return fail_cuda(b, e, "qk_norm_rope: shared memory");
    }
    qk_norm_rope_kernel<<<(unsigned)rows, QKV_WARPS * 32, smem, b->stream>>>(a);
    return check_launch(b, "qk_norm_rope_kernel");
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

int gated_add(Backend *b, const h3_bt *x, const h3_bt *y, const h3_bmod *mod)
{
    int rc;
    if ((rc = check_view(b, "gated_add", "x", x)) || (rc = check_view(b, "gated_add", "y", y))) return rc;
    if (x->dtype != H3_DT_F32) return fail(b, H3_E_UNSUPPORTED, "cuda: gated_add: the residual x must be f32");
    if (y->rows < x->rows || y->cols < x->cols)
        return fail(b, H3_E_INVALID, "cuda: gated_add: y is %lld x %lld, x %lld x %lld", (long long)y->rows,
                    (long long)y->cols, (long long)x->rows, (long long)x->cols);
    if (mod && mod->tab && !mod->row_entry)
        return fail(b, H3_E_INVALID, "cuda: gated_add: a modulation table without row entries");
    if (x->rows == 0 || x->cols == 0) return 0;
    const bool m = mod && mod->tab;
    if (!b->rows_scalar && x->cols % 4 == 0 && vec_ok(x->data, 0, x->ld, 0, 4) &&
        vec_ok(y->data, y->dtype == H3_DT_BF16, y->ld, 0, 4) && (!m || (uintptr_t)mod->tab % 16 == 0)) {
        dim3 g4(blocks_for(x->cols / 4, 256, 64), (unsigned)(x->rows < 65535 ? x->rows : 65535));
        gated_add4_kernel<<<g4, 256, 0, b->stream>>>((float *)x->data, x->ld, y->data, y->dtype == H3_DT_BF16, y->ld,
                                                     m ? mod->tab : nullptr, m ? mod->row_entry : nullptr,
                                                     m ? mod->stride : 0, m ? mod->slot : 0, x->rows, x->cols);
        return check_launch(b, "gated_add4_kernel");
    }
    dim3 grid(blocks_for(x->cols, 256, 64), (unsigned)(x->rows < 65535 ? x->rows : 65535));
    gated_add_kernel<<<grid, 256, 0, b->stream>>>((float *)x->data, x->ld, y->data, y->dtype == H3_DT_BF16, y->ld,
                                                  m ? mod->tab : nullptr, m ? mod->row_entry : nullptr,
                                                  m ? mod->stride : 0, m ? mod->slot : 0, x->rows, x->cols);
    return check_launch(b, "gated_add_kernel");
}

/* The residual add and the next norm in one pass where norm4_kernel takes the views (x is read
   once, the sum stays in registers); otherwise the two kernels in turn. */
int gated_add_norm(Backend *b, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                   const h3_bmod *mod, float eps, const h3_bt *out)
{
    int rc;
    if ((rc = check_view(b, "gated_add_norm", "x", x)) || (rc = check_view(b, "gated_add_norm", "y", y)) ||
        (rc = check_view(b, "gated_add_norm", "out", out)))
        return rc;
    if (x->dtype != H3_DT_F32) return fail(b, H3_E_UNSUPPORTED, "cuda: gated_add_norm: the residual x must be f32");
    if (y->rows < x->rows || y->cols < x->cols || out->rows != x->rows || out->cols != x->cols)
        return fail(b, H3_E_INVALID, "cuda: gated_add_norm: x %lld x %lld, y %lld x %lld, out %lld x %lld",
                    (long long)x->rows, (long long)x->cols, (long long)y->rows, (long long)y->cols,
                    (long long)out->rows, (long long)out->cols);
    if (((gate && gate->tab) && !gate->row_entry) || ((mod && mod->tab) && !mod->row_entry))
        return fail(b, H3_E_INVALID, "cuda: gated_add_norm: a modulation table without row entries");
    if (x->rows == 0 || x->cols == 0) return 0;
    if (x->rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: gated_add_norm: too many rows");
    NormArgs a;
    memset(&a, 0, sizeof a);
    a.x = x->data;
    a.ldx = x->ld;
    a.w = w;
    a.tab = mod ? mod->tab : nullptr;
    a.entry = mod ? mod->row_entry : nullptr;
    a.stride = mod ? mod->stride : 0;
    a.slot = mod ? mod->slot : 0;
    a.y = out->data;
    a.ldy = out->ld;
    a.n = x->cols;
    a.eps = eps;
    a.y_bf16 = out->dtype == H3_DT_BF16;
    AddArgs ad;
    memset(&ad, 0, sizeof ad);
    ad.y = y->data;
    ad.ldy = y->ld;
    ad.y_bf16 = y->dtype == H3_DT_BF16;
    const bool g = gate && gate->tab;
    ad.tab = g ? gate->tab : nullptr;
    ad.entry = g ? gate->row_entry : nullptr;
    ad.stride = g ? gate->stride : 0;
    ad.slot = g ? gate->slot : 0;
    if (norm4_launch(b, a, ad, x->rows, &rc)) return rc;
    if ((rc = gated_add(b, x, y, gate))) return rc;
    return norm_mod(b, x, nullptr, w, mod, eps, out);
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

int swiglu(Backend *b, const h3_bt *gate, const h3_bt *up, const h3_bt *out)
{
    int rc;
    if ((rc = check_view(b, "swiglu", "gate", gate)) || (rc = check_view(b, "swiglu", "up", up)) ||
        (rc = check_view(b, "swiglu", "out", out)))
        return rc;
    if (gate->rows < out->rows || up->rows < out->rows || gate->cols < out->cols || up->cols < out->cols)
        return fail(b, H3_E_INVALID, "cuda: swiglu: gate/up smaller than out (%lld x %lld)", (long long)out->rows,
                    (long long)out->cols);
    if (out->rows == 0 || out->cols == 0) return 0;
    const int bf = out->dtype == H3_DT_BF16;
    if (!b->rows_scalar && out->cols % 8 == 0 && gate->dtype == out->dtype && up->dtype == out->dtype &&
        vec_ok(gate->data, bf, gate->ld, 0, 8) && vec_ok(up->data, bf, up->ld, 0, 8) && vec_ok(out->data, bf, out->ld, 0, 8)) {
        dim3 g8(blocks_for(out->cols / 8, 256, 64), (unsigned)(out->rows < 65535 ? out->rows : 65535));
        swiglu8_kernel<<<g8, 256, 0, b->stream>>>(gate->data, up->data, out->data, bf, gate->ld, up->ld, out->ld,
                                                  out->rows, out->cols);
        return check_launch(b, "swiglu8_kernel");
    }
    dim3 grid(blocks_for(out->cols, 256, 64), (unsigned)(out->rows < 65535 ? out->rows : 65535));
    swiglu_kernel<<<grid, 256, 0, b->stream>>>(gate->data, gate->dtype == H3_DT_BF16, gate->ld, up->data,
                                               up->dtype == H3_DT_BF16, up->ld, out->data, out->dtype == H3_DT_BF16,
                                               out->ld, out->rows, out->cols);
    return check_launch(b, "swiglu_kernel");
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

int scatter_rows(Backend *b, const h3_bt *src, const int64_t *idx, const h3_bt *dst)
{
    int rc;
    if ((rc = check_view(b, "scatter_rows", "src", src)) || (rc = check_view(b, "scatter_rows", "dst", dst))) return rc;
    if (src->cols != dst->cols)
        return fail(b, H3_E_INVALID, "cuda: scatter_rows: rows of %lld and %lld values", (long long)src->cols,
                    (long long)dst->cols);
    if (src->rows == 0 || src->cols == 0) return 0;
    if (!idx) return fail(b, H3_E_INVALID, "cuda: scatter_rows: no index");
    dim3 grid(blocks_for(src->cols, 256, 64), (unsigned)(src->rows < 65535 ? src->rows : 65535));
    scatter_rows_kernel<<<grid, 256, 0, b->stream>>>(src->data, src->dtype == H3_DT_BF16, src->ld, idx, dst->data,
                                                     dst->dtype == H3_DT_BF16, dst->ld, dst->rows, src->rows,
                                                     src->cols);
    return check_launch(b, "scatter_rows_kernel");
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

int euler(Backend *b, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    if (n <= 0) return 0;
    /* The three scalars as schedule.c computes them (single f32 operations, nothing to contract). */
    const float sft = 1.0f - t;
    const float ratio = sigma_next / sigma;
    const float keep = 1.0f - ratio;
    euler_kernel<<<blocks_for(n, 256, 4096), 256, 0, b->stream>>>(x, v, n, sft, ratio, keep);
    return check_launch(b, "euler_kernel");
}

/* ---- conversions --------------------------------------------------------------------------- */

__global__ void f32_bf16_2d_kernel(const float *s, int64_t lds, __nv_bfloat16 *d, int64_t ldd, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            d[r * ldd + i] = __float2bfloat16_rn(s[r * lds + i]);
}

int convert_f32_bf16_2d(Backend *b, const float *src, int64_t lds, __nv_bfloat16 *dst, int64_t ldd, int64_t rows,
                        int64_t cols)
{
    if (rows <= 0 || cols <= 0) return 0;
    dim3 grid(blocks_for(cols, 256, 64), (unsigned)(rows < 65535 ? rows : 65535));
    f32_bf16_2d_kernel<<<grid, 256, 0, b->stream>>>(src, lds, dst, ldd, rows, cols);
    return check_launch(b, "f32_bf16_2d_kernel");
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

int bias_store(Backend *b, const float *src, const float *bias, void *dst, int dst_bf16, int64_t ldd, int64_t rows,
               int64_t cols)
{
    if (rows <= 0 || cols <= 0) return 0;
    dim3 grid(blocks_for(cols, 256, 64), (unsigned)(rows < 65535 ? rows : 65535));
    bias_store_kernel<<<grid, 256, 0, b->stream>>>(src, bias, dst, dst_bf16, ldd, rows, cols);
    return check_launch(b, "bias_store_kernel");
}

/* Weights: f32 or f16 to bf16, round to nearest even (f16 widens to f32 exactly first). The
   source is a 64 MiB staging chunk fresh from PCIe, so a plain grid-stride loop keeps up. */
__global__ void to_bf16_kernel(const void *s, int f16, __nv_bfloat16 *d, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = f16 ? __half2float(static_cast<const __half *>(s)[i]) : static_cast<const float *>(s)[i];
        d[i] = __float2bfloat16_rn(v);
    }
}

int convert_to_bf16(Backend *b, const void *src, h3_dtype dt, __nv_bfloat16 *dst, int64_t n)
{
    if (n <= 0) return 0;
    to_bf16_kernel<<<blocks_for(n, 256, 8192), 256, 0, b->stream>>>(src, dt == H3_DT_F16, dst, n);
    return check_launch(b, "to_bf16_kernel");
}

} /* namespace h3cuda */
