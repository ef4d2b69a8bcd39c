/*
 * The Metal backend's compute ops (backend.h's h3_backend_ops): each fills its kernel's argument
 * block (shaders/metal/h3_metal.h) and encodes one dispatch with the grid, threadgroup size and
 * threadgroup memory the kernel expects (the same as tests/metal_emu/kernels_emu.cpp, which the
 * conformance suite checks). Every op runs on the GPU; the host takes part only where the seam
 * says the result is the host's (noise is libh3's host generator written into the shared buffer,
 * abs_diff_sum adds the blocks' partial sums in double).
 */
#include "backend/metal/metal_internal.h"

#include "../../../shaders/metal/h3_metal.h"

#include <limits.h>
#include <string.h>

/* ---- small helpers ---- */

static const char *dts(h3_dtype t) { return t == H3_DT_BF16 ? "bf16" : t == H3_DT_F16 ? "f16" : "f32"; }
static bool act_ok(h3_dtype t) { return t == H3_DT_F32 || t == H3_DT_BF16; }
static NSUInteger cdiv(int64_t a, int64_t b) { return (NSUInteger)((a + b - 1) / b); }
/* Threads for a row kernel: whole simdgroups covering n, at most 256 (kernels_emu.cpp's rule). */
static NSUInteger row_threads(int64_t n) { return n >= 256 ? 256u : 32u * (NSUInteger)cdiv(n > 0 ? n : 1, 32); }
static bool fits(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The kernels take int sizes and strides: anything past 2^31 - 1 is refused, never wrapped. */
static int need_int(mtl_be *b, const char *op, int64_t a, int64_t c, int64_t d, int64_t e)
{
    if (!fits(a) || !fits(c) || !fits(d) || !fits(e))
        return mtl_err(b, H3_E_INVALID, "metal: %s: a size or stride is past 2^31 - 1", op);
    return 0;
}
static int need_f32(mtl_be *b, const char *op, const h3_bt *t)
{
    if (t->dtype != H3_DT_F32) return mtl_err(b, H3_E_UNSUPPORTED, "metal: %s takes f32 tensors, got %s", op, dts(t->dtype));
    return 0;
}
/* A name of the literal pool: the pipeline cache keys on it. */
static const char *kname(char *buf, size_t n, const char *fmt, const char *a, const char *c, const char *d)
{
    snprintf(buf, n, fmt, a, c, d);
    return buf;
}

static int op_linear_(mtl_be *b, const char *op, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    if (!act_ok(X->dtype) || !act_ok(Y->dtype) || (W->dtype != H3_DT_F32 && W->dtype != H3_DT_BF16 && W->dtype != H3_DT_F16))
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: %s: x %s, W %s, y %s is not a combination of the kernels", op,
                       dts(X->dtype), dts(W->dtype), dts(Y->dtype));
    if (X->cols != W->cols || Y->cols != W->rows)
        return mtl_err(b, H3_E_INVALID, "metal: %s: shapes x %lld x %lld, W %lld x %lld, y %lld x %lld disagree", op,
                       (long long)X->rows, (long long)X->cols, (long long)W->rows, (long long)W->cols,
                       (long long)Y->rows, (long long)Y->cols);
    const int64_t M = Y->rows;
    int rc = need_int(b, op, M, W->rows, W->cols, X->ld);
    if (!rc) rc = need_int(b, op, Y->ld, X->rows, 0, 0);
    if (rc) return rc;
    const h3m_linear_args a = {(int)M, (int)W->rows, (int)W->cols, (int)X->ld, (int)Y->ld, bias != NULL};
    char name[48];
    kname(name, sizeof name, "h3m_linear_%s_%s_%s", dts(X->dtype), dts(W->dtype), dts(Y->dtype));
    const mtl_arg args[] = {MTL_MEM(X->data, "x"), MTL_MEM(W->data, "W"), MTL_MEM(bias, "bias"), MTL_MEM(Y->data, "y"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, op, name, args, 5, H3M_GEMM_TG_BYTES, MTLSizeMake(cdiv(a.N, H3M_BN), cdiv(M, H3M_BM), 1),
                        MTLSizeMake(H3M_GEMM_THREADS, 1, 1));
}

static int op_linear(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    if (X->rows != Y->rows) return mtl_err(mtl_of(be), H3_E_INVALID, "metal: linear: x and y rows differ");
    return op_linear_(mtl_of(be), "linear", X, W, bias, Y);
}

/* conv_gemm is linear over windows that may overlap (X->ld < cols), M = Y->rows. */
static int op_conv_gemm(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    mtl_be *b = mtl_of(be);
    int rc = need_f32(b, "conv_gemm", X);
    if (!rc) rc = need_f32(b, "conv_gemm", Y);
    return rc ? rc : op_linear_(b, "conv_gemm", X, W, bias, Y);
}

static int op_attention(h3_backend *be, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D,
                        float scale, bool causal, const h3_bt *O)
{
    mtl_be *b = mtl_of(be);
    if (be->attn_precision != H3_PRECISION_DEFAULT)
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: attention: %s", be->attn_fp8_why);
    if (Q->dtype != K->dtype || Q->dtype != V->dtype || !act_ok(Q->dtype) || !act_ok(O->dtype))
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: attention: q/k/v must share f32 or bf16 (got %s/%s/%s)",
                       dts(Q->dtype), dts(K->dtype), dts(V->dtype));
    if (D < 1 || D > H3M_ATT_MAX_D || kv_heads < 1 || heads < 1 || heads % kv_heads)
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: attention: %d heads over %d kv heads of dim %d (dims up to %d)",
                       heads, kv_heads, D, H3M_ATT_MAX_D);
    int rc = need_int(b, "attention", Q->rows, K->rows, Q->ld, K->ld);
    if (!rc) rc = need_int(b, "attention", V->ld, O->ld, 0, 0);
    if (rc) return rc;
    const h3m_attn_args a = {(int)Q->rows, (int)K->rows, heads, kv_heads, D, (int)Q->ld, (int)K->ld, (int)V->ld,
                             (int)O->ld, causal ? 1 : 0, scale};
    char name[48];
    kname(name, sizeof name, "h3m_attention_%s_%s%s", dts(Q->dtype), dts(O->dtype), "");
    const mtl_arg args[] = {MTL_MEM(Q->data, "q"), MTL_MEM(K->data, "k"), MTL_MEM(V->data, "v"), MTL_MEM(O->data, "o"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "attention", name, args, 5, H3M_ATT_ROWS * H3M_ATT_MAX_D * 4,
                        MTLSizeMake(cdiv(Q->rows, H3M_ATT_ROWS), (NSUInteger)heads, 1),
                        MTLSizeMake(H3M_ATT_ROWS * 32, 1, 1));
}

static int op_norm_mod(h3_backend *be, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod,
                       float eps, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    if (!act_ok(x->dtype) || !act_ok(y->dtype))
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: norm_mod: x %s, y %s", dts(x->dtype), dts(y->dtype));
    int rc = need_int(b, "norm_mod", x->cols, x->ld, y->ld, y->rows);
    if (rc) return rc;
    const bool has_mod = mod && mod->tab;
    const h3m_norm_args a = {(int)x->cols, (int)x->ld, (int)y->ld, rows != NULL, w != NULL, has_mod,
                             has_mod ? mod->stride : 0, has_mod ? mod->slot : 0, eps};
    char name[48];
    kname(name, sizeof name, "h3m_norm_mod_%s_%s%s", dts(x->dtype), dts(y->dtype), "");
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(rows, "rows"), MTL_MEM(w, "w"),
                            MTL_MEM(has_mod ? mod->tab : NULL, "modulation table"),
                            MTL_MEM(has_mod ? mod->row_entry : NULL, "row entries"), MTL_MEM(y->data, "y"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "norm_mod", name, args, 7, 32 * 4, MTLSizeMake((NSUInteger)y->rows, 1, 1),
                        MTLSizeMake(row_threads(x->cols), 1, 1));
}

static int op_gated_add(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *mod)
{
    mtl_be *b = mtl_of(be);
    int rc = need_f32(b, "gated_add", x);
    if (!rc && !act_ok(y->dtype)) rc = mtl_err(b, H3_E_UNSUPPORTED, "metal: gated_add: y %s", dts(y->dtype));
    if (!rc) rc = need_int(b, "gated_add", x->cols, x->ld, y->ld, x->rows);
    if (rc) return rc;
    const bool g = mod && mod->tab;
    const h3m_gate_args a = {(int)x->cols, (int)x->ld, (int)y->ld, 0, g, g ? mod->stride : 0, g ? mod->slot : 0,
                             0, 0, 0, 0.0f};
    char name[48];
    kname(name, sizeof name, "h3m_gated_add_%s%s%s", dts(y->dtype), "", "");
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(y->data, "y"), MTL_MEM(g ? mod->tab : NULL, "gate table"),
                            MTL_MEM(g ? mod->row_entry : NULL, "row entries"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "gated_add", name, args, 5, 0, MTLSizeMake(cdiv(x->cols, 256), (NSUInteger)x->rows, 1),
                        MTLSizeMake(256, 1, 1));
}

static int op_gated_add_norm(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                             const h3_bmod *mod, float eps, const h3_bt *out)
{
    mtl_be *b = mtl_of(be);
    if (!mod || !mod->tab) { /* the fused kernel always modulates: the two ops, the same bits */
        int rc = op_gated_add(be, x, y, gate);
        return rc ? rc : op_norm_mod(be, x, NULL, w, mod, eps, out);
    }
    int rc = need_f32(b, "gated_add_norm", x);
    if (!rc && (!act_ok(y->dtype) || !act_ok(out->dtype)))
        rc = mtl_err(b, H3_E_UNSUPPORTED, "metal: gated_add_norm: y %s, out %s", dts(y->dtype), dts(out->dtype));
    if (!rc) rc = need_int(b, "gated_add_norm", x->cols, x->ld, y->ld, out->ld);
    if (!rc) rc = need_int(b, "gated_add_norm", x->rows, 0, 0, 0);
    if (rc) return rc;
    const bool g = gate && gate->tab;
    const h3m_gate_args a = {(int)x->cols, (int)x->ld, (int)y->ld, (int)out->ld, g, g ? gate->stride : 0,
                             g ? gate->slot : 0, w != NULL, mod->stride, mod->slot, eps};
    char name[48];
    kname(name, sizeof name, "h3m_gated_add_norm_%s_%s%s", dts(y->dtype), dts(out->dtype), "");
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(y->data, "y"), MTL_MEM(g ? gate->tab : NULL, "gate table"),
                            MTL_MEM(g ? gate->row_entry : NULL, "gate row entries"), MTL_MEM(w, "w"),
                            MTL_MEM(mod->tab, "modulation table"), MTL_MEM(mod->row_entry, "row entries"),
                            MTL_MEM(out->data, "out"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "gated_add_norm", name, args, 9, 32 * 4, MTLSizeMake((NSUInteger)x->rows, 1, 1),
                        MTLSizeMake(row_threads(x->cols), 1, 1));
}

static int op_qk_norm_rope(h3_backend *be, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs,
                           const float *qn, const float *kn, const float *cos, const float *sin, int heads,
                           int kv_heads, int D, int half, float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v)
{
    mtl_be *b = mtl_of(be);
    if (qin->dtype != kin->dtype || (vin && vin->dtype != qin->dtype) || q->dtype != k->dtype ||
        (vin && v->dtype != q->dtype) || !act_ok(qin->dtype) || !act_ok(q->dtype))
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: qk_norm_rope: inputs %s, outputs %s (each side one dtype)",
                       dts(qin->dtype), dts(q->dtype));
    if (D < 1 || D > H3M_QKV_MAX_D || half < 0 || 2 * half > D)
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: qk_norm_rope: head dim %d, rotation %d (dims up to %d)", D, half,
                       H3M_QKV_MAX_D);
    int rc = need_int(b, "qk_norm_rope", qin->ld, kin->ld, q->ld, k->ld);
    if (!rc) rc = need_int(b, "qk_norm_rope", q->rows, vin ? vin->ld : 0, vin ? v->ld : 0, 0);
    if (rc) return rc;
    const h3m_qkv_args a = {heads, kv_heads, D, half, hs, (int)qin->ld, (int)kin->ld, vin ? (int)vin->ld : 0,
                            (int)q->ld, (int)k->ld, vin ? (int)v->ld : 0, qn != NULL, kn != NULL,
                            cos != NULL && sin != NULL, vin != NULL, eps};
    const int units = heads + kv_heads + (vin ? kv_heads : 0);
    char name[48];
    kname(name, sizeof name, "h3m_qk_norm_rope_%s_%s%s", dts(qin->dtype), dts(q->dtype), "");
    const mtl_arg args[] = {MTL_MEM(qin->data, "qin"), MTL_MEM(kin->data, "kin"), MTL_MEM(vin ? vin->data : NULL, "vin"),
                            MTL_MEM(qn, "qn"), MTL_MEM(kn, "kn"), MTL_MEM(cos, "cos"), MTL_MEM(sin, "sin"),
                            MTL_MEM(q->data, "q"), MTL_MEM(k->data, "k"), MTL_MEM(vin ? v->data : NULL, "v"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "qk_norm_rope", name, args, 11, (size_t)H3M_QKV_HEADS * (size_t)D * 4,
                        MTLSizeMake(cdiv(units, H3M_QKV_HEADS), (NSUInteger)q->rows, 1),
                        MTLSizeMake(H3M_QKV_HEADS * 32, 1, 1));
}

/* The element-wise kernels over rows x cols with three strides (h3m_ew_args). */
static int ew(mtl_be *b, const char *op, const char *kernel, const h3_bt *x, const h3_bt *x2, const h3_bt *y,
              int tanh_approx)
{
    int rc = need_int(b, op, x->cols, x->ld, x2 ? x2->ld : 0, y->ld);
    if (!rc) rc = need_int(b, op, x->rows, 0, 0, 0);
    if (rc) return rc;
    const h3m_ew_args a = {(int)x->cols, (int)x->ld, x2 ? (int)x2->ld : 0, (int)y->ld, tanh_approx};
    mtl_arg args[4];
    int n = 0;
    args[n++] = MTL_MEM(x->data, "x");
    if (x2) args[n++] = MTL_MEM(x2->data, "second operand");
    args[n++] = MTL_MEM(y->data, "y");
    args[n++] = MTL_BYTES(&a, sizeof a);
    return mtl_dispatch(b, op, kernel, args, n, 0, MTLSizeMake(cdiv(x->cols, 256), (NSUInteger)x->rows, 1),
                        MTLSizeMake(256, 1, 1));
}

static int op_swiglu(h3_backend *be, const h3_bt *gate, const h3_bt *up, const h3_bt *out)
{
    mtl_be *b = mtl_of(be);
    if (gate->dtype != up->dtype || gate->dtype != out->dtype || !act_ok(gate->dtype))
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: swiglu: gate, up and out must share f32 or bf16");
    return ew(b, "swiglu", gate->dtype == H3_DT_BF16 ? "h3m_swiglu_bf16" : "h3m_swiglu_f32", gate, up, out, 0);
}

static int op_gelu(h3_backend *be, const h3_bt *x, bool tanh_approx, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    int rc = need_f32(b, "gelu", x);
    if (!rc) rc = need_f32(b, "gelu", y);
    return rc ? rc : ew(b, "gelu", "h3m_gelu", x, NULL, y, tanh_approx ? 1 : 0);
}

static int op_mul(h3_backend *be, const h3_bt *a, const h3_bt *c, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    int rc = need_f32(b, "mul", a);
    if (!rc) rc = need_f32(b, "mul", c);
    if (!rc) rc = need_f32(b, "mul", y);
    return rc ? rc : ew(b, "mul", "h3m_mul", a, c, y, 0);
}

static int op_rope(h3_backend *be, const h3_bt *x, int heads, int D, int half, const float *cos, const float *sin)
{
    mtl_be *b = mtl_of(be);
    int rc = need_f32(b, "rope", x);
    if (!rc) rc = need_int(b, "rope", x->ld, x->rows, (int64_t)heads * half, 0);
    if (rc) return rc;
    const h3m_rope_args a = {heads, D, half, (int)x->ld};
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(cos, "cos"), MTL_MEM(sin, "sin"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "rope", "h3m_rope", args, 4, 0,
                        MTLSizeMake(cdiv((int64_t)heads * half, 256), (NSUInteger)x->rows, 1), MTLSizeMake(256, 1, 1));
}

/* ---- row copies (h3m_rowop_args) ---- */

static int rowop_check(mtl_be *b, const char *op, const h3_bt *s, const h3_bt *d)
{
    int rc = need_f32(b, op, s);
    if (!rc) rc = need_f32(b, op, d);
    if (!rc) rc = need_int(b, op, s->cols, s->ld, d->ld, s->rows);
    if (!rc) rc = need_int(b, op, d->rows, 0, 0, 0);
    return rc;
}

static int scatter(mtl_be *b, const char *op, const h3_bt *src, const int64_t *idx, const h3_bt *dst)
{
    int rc = rowop_check(b, op, src, dst);
    if (rc) return rc;
    const h3m_rowop_args a = {(int)src->cols, (int)src->ld, 0, (int)dst->ld, 0.0f};
    const int has_idx = idx != NULL;
    const mtl_arg args[] = {MTL_MEM(src->data, "src"), MTL_MEM(idx, "idx"), MTL_MEM(dst->data, "dst"),
                            MTL_BYTES(&a, sizeof a), MTL_BYTES(&has_idx, sizeof has_idx)};
    return mtl_dispatch(b, op, "h3m_scatter_rows", args, 5, 0,
                        MTLSizeMake(cdiv(src->cols, 256), (NSUInteger)src->rows, 1), MTLSizeMake(256, 1, 1));
}

static int op_scatter_rows(h3_backend *be, const h3_bt *src, const int64_t *idx, const h3_bt *dst)
{
    return scatter(mtl_of(be), "scatter_rows", src, idx, dst);
}

static int op_copy(h3_backend *be, const h3_bt *src, const h3_bt *dst)
{
    mtl_be *b = mtl_of(be);
    if (src->rows != dst->rows || src->cols != dst->cols)
        return mtl_err(b, H3_E_INVALID, "metal: copy: shapes differ");
    return scatter(b, "copy", src, NULL, dst);
}

static int op_pool_pairs(h3_backend *be, const h3_bt *src, const int64_t *pairs, const h3_bt *dst)
{
    mtl_be *b = mtl_of(be);
    int rc = rowop_check(b, "pool_pairs", src, dst);
    if (rc) return rc;
    const h3m_rowop_args a = {(int)src->cols, (int)src->ld, 0, (int)dst->ld, 0.0f};
    const mtl_arg args[] = {MTL_MEM(src->data, "src"), MTL_MEM(pairs, "pairs"), MTL_MEM(dst->data, "dst"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "pool_pairs", "h3m_pool_pairs", args, 4, 0,
                        MTLSizeMake(cdiv(src->cols, 256), (NSUInteger)dst->rows, 1), MTLSizeMake(256, 1, 1));
}

static int op_unpool_pairs(h3_backend *be, const h3_bt *red, const h3_bt *base, const int64_t *pairs, const h3_bt *full)
{
    mtl_be *b = mtl_of(be);
    int rc = rowop_check(b, "unpool_pairs", red, full);
    if (!rc) rc = need_f32(b, "unpool_pairs", base);
    if (!rc) rc = need_int(b, "unpool_pairs", base->ld, 0, 0, 0);
    if (rc) return rc;
    const h3m_rowop_args a = {(int)red->cols, (int)red->ld, (int)base->ld, (int)full->ld, 0.0f};
    const mtl_arg args[] = {MTL_MEM(red->data, "red"), MTL_MEM(base->data, "base"), MTL_MEM(pairs, "pairs"),
                            MTL_MEM(full->data, "full"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "unpool_pairs", "h3m_unpool_pairs", args, 5, 0,
                        MTLSizeMake(cdiv(red->cols, 256), (NSUInteger)red->rows, 1), MTLSizeMake(256, 1, 1));
}

static int op_add_div(h3_backend *be, const h3_bt *y, const h3_bt *x, float div)
{
    mtl_be *b = mtl_of(be);
    int rc = rowop_check(b, "add_div", x, y);
    if (rc) return rc;
    const h3m_rowop_args a = {(int)y->cols, (int)x->ld, 0, (int)y->ld, div};
    const mtl_arg args[] = {MTL_MEM(y->data, "y"), MTL_MEM(x->data, "x"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "add_div", "h3m_add_div", args, 3, 0,
                        MTLSizeMake(cdiv(y->cols, 256), (NSUInteger)y->rows, 1), MTLSizeMake(256, 1, 1));
}

/* ---- the step and the knobs' element-wise ops (h3m_knob_args) ---- */

static int knob(mtl_be *b, const char *op, const char *kernel, float *out, const float *x, const float *c, int64_t n,
                h3m_knob_args a, int nbuf)
{
    if (!fits(n)) return mtl_err(b, H3_E_INVALID, "metal: %s: %lld values (at most 2^31 - 1)", op, (long long)n);
    a.n = (int)n;
    mtl_arg args[4];
    int k = 0;
    args[k++] = MTL_MEM(out, "out");
    args[k++] = MTL_MEM(x, "x");
    if (nbuf == 3) args[k++] = MTL_MEM(c, "b");
    args[k++] = MTL_BYTES(&a, sizeof a);
    return mtl_dispatch(b, op, kernel, args, k, 0, MTLSizeMake(cdiv(n, 256), 1, 1), MTLSizeMake(256, 1, 1));
}

static int op_euler(h3_backend *be, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    const h3m_knob_args a = {0, 0, 0.0f, t, sigma, sigma_next};
    return knob(mtl_of(be), "euler", "h3m_euler", x, v, NULL, n, a, 2);
}

static int op_extrapolate(h3_backend *be, float *out, const float *a_, const float *b_, int64_t n, float r)
{
    const h3m_knob_args a = {0, b_ != NULL, r, 0.0f, 0.0f, 0.0f};
    return knob(mtl_of(be), "extrapolate", "h3m_extrapolate", out, a_, b_, n, a, 3);
}

static int op_sub(h3_backend *be, float *out, const float *a_, const float *b_, int64_t n)
{
    const h3m_knob_args a = {0, 1, 0.0f, 0.0f, 0.0f, 0.0f};
    return knob(mtl_of(be), "sub", "h3m_sub", out, a_, b_, n, a, 3);
}

/* libh3's generator on the host, straight into the shared buffer (the same bits as h3_noise):
   after the queued work, which may still read or write `out`. */
static int op_noise(h3_backend *be, uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n)
{
    mtl_be *b = mtl_of(be);
    if (n <= 0) return 0;
    id<MTLBuffer> buf;
    NSUInteger off;
    int rc = mtl_lookup(b, out, "noise", "out", &buf, &off);
    if (!rc && off + (uint64_t)n * 4 > [buf length]) rc = mtl_err(b, H3_E_INVALID, "metal: noise: past the buffer");
    if (!rc) rc = mtl_flush(b);
    if (!rc) b->host.noise(seed, stream, offset, out, n);
    return rc;
}

static int op_abs_diff_sum(h3_backend *be, const float *x, const float *c, int64_t n, double *diff, double *ref)
{
    mtl_be *b = mtl_of(be);
    *diff = *ref = 0;
    if (n <= 0) return 0;
    if (!fits(n)) return mtl_err(b, H3_E_INVALID, "metal: abs_diff_sum: %lld values", (long long)n);
    const NSUInteger blocks = cdiv(n, H3M_ADS_BLOCK);
    id<MTLBuffer> part = [b->dev newBufferWithLength:blocks * 16 options:MTLResourceStorageModeShared];
    if (!part) return mtl_err(b, H3_E_NOMEM, "metal: abs_diff_sum: out of memory");
    [b->temps addObject:part];
    [part release];
    const h3m_knob_args a = {(int)n, 1, 0.0f, 0.0f, 0.0f, 0.0f};
    const mtl_arg args[] = {MTL_MEM(x, "a"), MTL_MEM(c, "b"), MTL_BUF(part, 0, "partial sums"), MTL_BYTES(&a, sizeof a)};
    int rc = mtl_dispatch(b, "abs_diff_sum", "h3m_abs_diff_sum", args, 4, 4 * (H3M_ADS_THREADS / 32) * 4,
                          MTLSizeMake(blocks, 1, 1), MTLSizeMake(H3M_ADS_THREADS, 1, 1));
    const float *p = (const float *)[part contents];
    [part retain]; /* the flush empties temps */
    if (!rc) rc = mtl_flush(b);
    double d = 0, r = 0;
    for (NSUInteger k = 0; !rc && k < blocks; k++) { /* the blocks in order, in double */
        d += (double)p[4 * k] + (double)p[4 * k + 1];
        r += (double)p[4 * k + 2] + (double)p[4 * k + 3];
    }
    [part release];
    if (!rc) *diff = d, *ref = r;
    return rc;
}

static int op_layernorm(h3_backend *be, const h3_bt *x, const float *w, const float *c, float eps, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    int rc = rowop_check(b, "layernorm", x, y);
    if (rc) return rc;
    const h3m_ln_args a = {(int)x->cols, (int)x->ld, (int)y->ld, w != NULL, c != NULL, eps};
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(w, "w"), MTL_MEM(c, "b"), MTL_MEM(y->data, "y"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "layernorm", "h3m_layernorm", args, 5, 32 * 4, MTLSizeMake((NSUInteger)x->rows, 1, 1),
                        MTLSizeMake(row_threads(x->cols), 1, 1));
}

const h3_backend_ops h3_metal_ops = {
    .linear = op_linear,
    .attention = op_attention,
    .norm_mod = op_norm_mod,
    .qk_norm_rope = op_qk_norm_rope,
    .gated_add = op_gated_add,
    .gated_add_norm = op_gated_add_norm,
    .swiglu = op_swiglu,
    .scatter_rows = op_scatter_rows,
    .euler = op_euler,
    .noise = op_noise,
    .extrapolate = op_extrapolate,
    .sub = op_sub,
    .pool_pairs = op_pool_pairs,
    .unpool_pairs = op_unpool_pairs,
    .abs_diff_sum = op_abs_diff_sum,
    .layernorm = op_layernorm,
    .copy = op_copy,
    .add_div = op_add_div,
    .conv_gemm = op_conv_gemm,
    .gelu = op_gelu,
    .rope = op_rope,
    .mul = op_mul,
};
