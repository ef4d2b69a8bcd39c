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
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/rows.h"

#include <string.h>

namespace h3cuda {

/* The kernels of kernels/rows.cu this file launches (cuda_kernels.h). */
H3K(k_norm4_kernel_128_1, MOD_ROWS, "norm4_kernel<128, 1>", NormArgs, AddArgs);
H3K(k_norm4_kernel_128_2, MOD_ROWS, "norm4_kernel<128, 2>", NormArgs, AddArgs);
H3K(k_norm4_kernel_256_2, MOD_ROWS, "norm4_kernel<256, 2>", NormArgs, AddArgs);
H3K(k_norm4_kernel_256_4, MOD_ROWS, "norm4_kernel<256, 4>", NormArgs, AddArgs);
H3K(k_norm4_kernel_256_6, MOD_ROWS, "norm4_kernel<256, 6>", NormArgs, AddArgs);
H3K(k_norm4_kernel_256_8, MOD_ROWS, "norm4_kernel<256, 8>", NormArgs, AddArgs);
H3K(k_norm_mod_kernel_128_8, MOD_ROWS, "norm_mod_kernel<128, 8>", NormArgs);
H3K(k_norm_mod_kernel_256_24, MOD_ROWS, "norm_mod_kernel<256, 24>", NormArgs);
H3K(k_qk_warp_kernel_2, MOD_ROWS, "qk_warp_kernel<2>", QkvArgs, int64_t, int);
H3K(k_qk_warp_kernel_4, MOD_ROWS, "qk_warp_kernel<4>", QkvArgs, int64_t, int);
H3K(k_qk_warp_kernel_8, MOD_ROWS, "qk_warp_kernel<8>", QkvArgs, int64_t, int);
H3K(k_qk_norm_rope_kernel, MOD_ROWS, "qk_norm_rope_kernel", QkvArgs);
H3K(k_gated_add4_kernel, MOD_ROWS, "gated_add4_kernel", float *, int64_t, const void *, int, int64_t, const float *, const int32_t *, int64_t, int64_t, int64_t, int64_t);
H3K(k_gated_add_kernel, MOD_ROWS, "gated_add_kernel", float *, int64_t, const void *, int, int64_t, const float *, const int32_t *, int64_t, int64_t, int64_t, int64_t);
H3K(k_swiglu8_kernel, MOD_ROWS, "swiglu8_kernel", const void *, const void *, void *, int, int64_t, int64_t, int64_t, int64_t, int64_t);
H3K(k_swiglu_kernel, MOD_ROWS, "swiglu_kernel", const void *, int, int64_t, const void *, int, int64_t, void *, int, int64_t, int64_t, int64_t);
H3K(k_scatter_rows_kernel, MOD_ROWS, "scatter_rows_kernel", const void *, int, int64_t, const int64_t *, void *, int, int64_t, int64_t, int64_t, int64_t);
H3K(k_euler_kernel, MOD_ROWS, "euler_kernel", float *, const float *, int64_t, float, float, float);
H3K(k_f32_bf16_2d_kernel, MOD_ROWS, "f32_bf16_2d_kernel", const float *, int64_t, bf16_t *, int64_t, int64_t, int64_t);
H3K(k_bias_store_kernel, MOD_ROWS, "bias_store_kernel", const float *, const float *, void *, int, int64_t, int64_t, int64_t);
H3K(k_to_bf16_kernel, MOD_ROWS, "to_bf16_kernel", const void *, int, bf16_t *, int64_t);
/* Whether a view's rows can be read N elements at a time from element offset `off`. */
static bool vec_ok(const void *p, int bf16, int64_t ld, int64_t off, int N)
{
    const size_t es = bf16 ? 2 : 4;
    return ((uintptr_t)p % (es * (size_t)N)) == 0 && ld % N == 0 && off % N == 0;
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
        k_norm4_kernel_128_1(b, grid, 128, 0, b->stream, a, ad);
    else if (groups <= 256)
        k_norm4_kernel_128_2(b, grid, 128, 0, b->stream, a, ad);
    else if (groups <= 512)
        k_norm4_kernel_256_2(b, grid, 256, 0, b->stream, a, ad);
    else if (groups <= 1024)
        k_norm4_kernel_256_4(b, grid, 256, 0, b->stream, a, ad);
    else if (groups <= 1536)
        k_norm4_kernel_256_6(b, grid, 256, 0, b->stream, a, ad);
    else
        k_norm4_kernel_256_8(b, grid, 256, 0, b->stream, a, ad);
    *rc = check_launch(b, "norm4_kernel");
    return 1;
}

/* norm_mod_kernel's and norm4_kernel's arguments: y[k] = norm(x[rows ? rows[k] : k]) * w, modulated. */
static NormArgs norm_args(const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod, float eps,
                          const h3_bt *y)
{
    NormArgs a;
    memset(&a, 0, sizeof a);
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
    return a;
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
    const NormArgs a = norm_args(x, rows, w, mod, eps, y);
    AddArgs none;
    memset(&none, 0, sizeof none);
    if (norm4_launch(b, a, none, y->rows, &rc)) return rc;
    if (a.n <= 1024)
        k_norm_mod_kernel_128_8(b, (unsigned)y->rows, 128, 0, b->stream, a);
    else
        k_norm_mod_kernel_256_24(b, (unsigned)y->rows, 256, 0, b->stream, a);
    return check_launch(b, "");
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
        k_qk_warp_kernel_2(b, (unsigned)blocks, 256, 0, b->stream, a, total, jobs);
    else if (VL == 4)
        k_qk_warp_kernel_4(b, (unsigned)blocks, 256, 0, b->stream, a, total, jobs);
    else
        k_qk_warp_kernel_8(b, (unsigned)blocks, 256, 0, b->stream, a, total, jobs);
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
        if ((rc = k_qk_norm_rope_kernel.max_smem(b, smem))) return rc;
    }
    return check_launch(b, k_qk_norm_rope_kernel(b, (unsigned)rows, QKV_WARPS * 32, smem, b->stream, a));
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
        return check_launch(b, k_gated_add4_kernel(b, g4, 256, 0, b->stream, (float *)x->data, x->ld, y->data, y->dtype == H3_DT_BF16, y->ld,
                                                     m ? mod->tab : nullptr, m ? mod->row_entry : nullptr,
                                                     m ? mod->stride : 0, m ? mod->slot : 0, x->rows, x->cols));
    }
    dim3 grid(blocks_for(x->cols, 256, 64), (unsigned)(x->rows < 65535 ? x->rows : 65535));
    return check_launch(b, k_gated_add_kernel(b, grid, 256, 0, b->stream, (float *)x->data, x->ld, y->data, y->dtype == H3_DT_BF16, y->ld,
                                                  m ? mod->tab : nullptr, m ? mod->row_entry : nullptr,
                                                  m ? mod->stride : 0, m ? mod->slot : 0, x->rows, x->cols));
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
    const NormArgs a = norm_args(x, nullptr, w, mod, eps, out);
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
        return check_launch(b, k_swiglu8_kernel(b, g8, 256, 0, b->stream, gate->data, up->data, out->data, bf, gate->ld, up->ld, out->ld,
                                                  out->rows, out->cols));
    }
    dim3 grid(blocks_for(out->cols, 256, 64), (unsigned)(out->rows < 65535 ? out->rows : 65535));
    return check_launch(b, k_swiglu_kernel(b, grid, 256, 0, b->stream, gate->data, gate->dtype == H3_DT_BF16, gate->ld, up->data,
                                               up->dtype == H3_DT_BF16, up->ld, out->data, out->dtype == H3_DT_BF16,
                                               out->ld, out->rows, out->cols));
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
    return check_launch(b, k_scatter_rows_kernel(b, grid, 256, 0, b->stream, src->data, src->dtype == H3_DT_BF16, src->ld, idx, dst->data,
                                                     dst->dtype == H3_DT_BF16, dst->ld, dst->rows, src->rows,
                                                     src->cols));
}

int euler(Backend *b, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    if (n <= 0) return 0;
    /* The three scalars as schedule.c computes them (single f32 operations, nothing to contract). */
    const float sft = 1.0f - t;
    const float ratio = sigma_next / sigma;
    const float keep = 1.0f - ratio;
    return check_launch(b, k_euler_kernel(b, blocks_for(n, 256, 4096), 256, 0, b->stream, x, v, n, sft, ratio, keep));
}

int convert_f32_bf16_2d(Backend *b, const float *src, int64_t lds, bf16_t *dst, int64_t ldd, int64_t rows,
                        int64_t cols)
{
    if (rows <= 0 || cols <= 0) return 0;
    dim3 grid(blocks_for(cols, 256, 64), (unsigned)(rows < 65535 ? rows : 65535));
    return check_launch(b, k_f32_bf16_2d_kernel(b, grid, 256, 0, b->stream, src, lds, dst, ldd, rows, cols));
}

int bias_store(Backend *b, const float *src, const float *bias, void *dst, int dst_bf16, int64_t ldd, int64_t rows,
               int64_t cols)
{
    if (rows <= 0 || cols <= 0) return 0;
    dim3 grid(blocks_for(cols, 256, 64), (unsigned)(rows < 65535 ? rows : 65535));
    return check_launch(b, k_bias_store_kernel(b, grid, 256, 0, b->stream, src, bias, dst, dst_bf16, ldd, rows, cols));
}

int convert_to_bf16(Backend *b, const void *src, h3_dtype dt, bf16_t *dst, int64_t n)
{
    if (n <= 0) return 0;
    return check_launch(b, k_to_bf16_kernel(b, blocks_for(n, 256, 8192), 256, 0, b->stream, src, dt == H3_DT_F16, dst, n));
}

} /* namespace h3cuda */
