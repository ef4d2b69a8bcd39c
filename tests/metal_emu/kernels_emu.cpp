/* The Metal kernels compiled as C++ against msl_emu.h, and their launchers (kernels_emu.h). Only
   this file sees the MSL model's macros (device, thread, kernel, ...): it includes nothing after
   the kernels. */
#include <stdint.h>
#include <stdlib.h>

#define H3_MSL_EMU 1
#include "../../shaders/metal/msl_emu.h"
using namespace metal;
#include "../../shaders/metal/h3_metal.h"
#include "../../shaders/metal/h3_gemm.metal"
#include "../../shaders/metal/h3_attention.metal"
#include "../../shaders/metal/h3_rows.metal"
#include "../../shaders/metal/h3_eltwise.metal"
#include "../../shaders/metal/h3_decoders.metal"
#include "../../shaders/metal/h3_knobs.metal"
#include "kernels_emu.h"

static uint cdiv(int64_t a, int64_t b) { return (uint)((a + b - 1) / b); }
/* Threads for a row kernel: whole simdgroups covering n, at most 256. */
static uint row_threads(int n) { return n >= 256 ? 256u : 32u * cdiv(n > 0 ? n : 1, 32); }

template <class TX, class TW, class TY>
static const char *linear_t(const void *x, const void *w, const float *bias, void *y, const h3m_linear_args *a)
{
    return h3emu::dispatch({cdiv(a->N, H3M_BN), cdiv(a->M, H3M_BM), 1}, {H3M_GEMM_THREADS, 1, 1}, H3M_GEMM_TG_BYTES,
                           [&](const h3emu::ids &t, void *tg) {
                               h3m_linear<TX, TW, TY>((const TX *)x, (const TW *)w, bias, (TY *)y, *a, (float *)tg,
                                                      t.threadgroup_position_in_grid, t.thread_index_in_threadgroup,
                                                      t.simdgroup_index_in_threadgroup);
                           });
}

template <class TX, class TW>
static const char *linear_y(const void *x, const void *w, const float *bias, void *y, int ydt, const h3m_linear_args *a)
{
    return ydt == EMU_BF16 ? linear_t<TX, TW, bfloat>(x, w, bias, y, a) : linear_t<TX, TW, float>(x, w, bias, y, a);
}
template <class TX>
static const char *linear_w(const void *x, const void *w, int wdt, const float *bias, void *y, int ydt,
                            const h3m_linear_args *a)
{
    return wdt == EMU_BF16  ? linear_y<TX, bfloat>(x, w, bias, y, ydt, a)
           : wdt == EMU_F16 ? linear_y<TX, half>(x, w, bias, y, ydt, a)
                            : linear_y<TX, float>(x, w, bias, y, ydt, a);
}
const char *emu_linear(const void *x, int xdt, const void *w, int wdt, const float *bias, void *y, int ydt,
                       const h3m_linear_args *a)
{
    return xdt == EMU_BF16 ? linear_w<bfloat>(x, w, wdt, bias, y, ydt, a) : linear_w<float>(x, w, wdt, bias, y, ydt, a);
}

template <class TQ, class TO>
static const char *attention_t(const void *q, const void *k, const void *v, void *o, const h3m_attn_args *a)
{
    if (a->D > H3M_ATT_MAX_D || a->D < 1 || a->kv_heads < 1 || a->heads % a->kv_heads) return "attention: bad heads";
    return h3emu::dispatch({cdiv(a->Lq, H3M_ATT_ROWS), (uint)a->heads, 1}, {H3M_ATT_ROWS * 32, 1, 1},
                           H3M_ATT_ROWS * H3M_ATT_MAX_D * 4, [&](const h3emu::ids &t, void *tg) {
                               h3m_attention<TQ, TO>((const TQ *)q, (const TQ *)k, (const TQ *)v, (TO *)o, *a,
                                                     (float *)tg, t.threadgroup_position_in_grid,
                                                     t.thread_index_in_simdgroup, t.simdgroup_index_in_threadgroup);
                           });
}
const char *emu_attention(const void *q, const void *k, const void *v, int qdt, void *o, int odt, const h3m_attn_args *a)
{
    if (qdt == EMU_BF16)
        return odt == EMU_BF16 ? attention_t<bfloat, bfloat>(q, k, v, o, a) : attention_t<bfloat, float>(q, k, v, o, a);
    return odt == EMU_BF16 ? attention_t<float, bfloat>(q, k, v, o, a) : attention_t<float, float>(q, k, v, o, a);
}

template <class TX, class TY>
static const char *norm_t(const void *x, const int64_t *rows, const float *w, const float *tab, const int32_t *ent,
                          void *y, int64_t rows_out, const h3m_norm_args *a)
{
    return h3emu::dispatch({(uint)rows_out, 1, 1}, {row_threads(a->n), 1, 1}, 32 * 4, [&](const h3emu::ids &t, void *tg) {
        h3m_norm_mod<TX, TY>((const TX *)x, (const long *)rows, w, tab, ent, (TY *)y, *a, (float *)tg,
                             t.threadgroup_position_in_grid, t.thread_index_in_threadgroup, t.threads_per_threadgroup,
                             t.thread_index_in_simdgroup, t.simdgroup_index_in_threadgroup,
                             t.simdgroups_per_threadgroup);
    });
}
const char *emu_norm_mod(const void *x, int xdt, const int64_t *rows, const float *w, const float *tab,
                         const int32_t *ent, void *y, int ydt, int64_t rows_out, const h3m_norm_args *a)
{
    if (xdt == EMU_BF16)
        return ydt == EMU_BF16 ? norm_t<bfloat, bfloat>(x, rows, w, tab, ent, y, rows_out, a)
                               : norm_t<bfloat, float>(x, rows, w, tab, ent, y, rows_out, a);
    return ydt == EMU_BF16 ? norm_t<float, bfloat>(x, rows, w, tab, ent, y, rows_out, a)
                           : norm_t<float, float>(x, rows, w, tab, ent, y, rows_out, a);
}

template <class TY>
static const char *gate_t(float *x, const void *y, const float *tab, const int32_t *ent, int64_t rows,
                          const h3m_gate_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_gated_add<TY>(x, (const TY *)y, tab, ent, *a, t.thread_position_in_grid);
    });
}
const char *emu_gated_add(float *x, const void *y, int ydt, const float *tab, const int32_t *ent, int64_t rows,
                          const h3m_gate_args *a)
{
    return ydt == EMU_BF16 ? gate_t<bfloat>(x, y, tab, ent, rows, a) : gate_t<float>(x, y, tab, ent, rows, a);
}

template <class TY, class TO>
static const char *gate_norm_t(float *x, const void *y, const float *gtab, const int32_t *gent, const float *w,
                               const float *ntab, const int32_t *nent, void *out, int64_t rows, const h3m_gate_args *a)
{
    return h3emu::dispatch({(uint)rows, 1, 1}, {row_threads(a->n), 1, 1}, 32 * 4, [&](const h3emu::ids &t, void *tg) {
        h3m_gated_add_norm<TY, TO>(x, (const TY *)y, gtab, gent, w, ntab, nent, (TO *)out, *a, (float *)tg,
                                   t.threadgroup_position_in_grid, t.thread_index_in_threadgroup,
                                   t.threads_per_threadgroup, t.thread_index_in_simdgroup,
                                   t.simdgroup_index_in_threadgroup, t.simdgroups_per_threadgroup);
    });
}
const char *emu_gated_add_norm(float *x, const void *y, int ydt, const float *gtab, const int32_t *gent,
                               const float *w, const float *ntab, const int32_t *nent, void *out, int odt,
                               int64_t rows, const h3m_gate_args *a)
{
    if (ydt == EMU_BF16)
        return odt == EMU_BF16 ? gate_norm_t<bfloat, bfloat>(x, y, gtab, gent, w, ntab, nent, out, rows, a)
                               : gate_norm_t<bfloat, float>(x, y, gtab, gent, w, ntab, nent, out, rows, a);
    return odt == EMU_BF16 ? gate_norm_t<float, bfloat>(x, y, gtab, gent, w, ntab, nent, out, rows, a)
                           : gate_norm_t<float, float>(x, y, gtab, gent, w, ntab, nent, out, rows, a);
}

template <class TI, class TO>
static const char *qkv_t(const void *qin, const void *kin, const void *vin, const float *qn, const float *kn,
                         const float *cs, const float *sn, void *q, void *k, void *v, int64_t rows,
                         const h3m_qkv_args *a)
{
    if (a->D > H3M_QKV_MAX_D || 2 * a->half_ > a->D) return "qk_norm_rope: head dim or rotation out of range";
    const int units = a->heads + a->kv_heads + (a->has_v ? a->kv_heads : 0);
    return h3emu::dispatch({cdiv(units, H3M_QKV_HEADS), (uint)rows, 1}, {H3M_QKV_HEADS * 32, 1, 1},
                           (size_t)H3M_QKV_HEADS * (size_t)a->D * 4, [&](const h3emu::ids &t, void *tg) {
                               h3m_qk_norm_rope<TI, TO>((const TI *)qin, (const TI *)kin, (const TI *)vin, qn, kn, cs,
                                                        sn, (TO *)q, (TO *)k, (TO *)v, *a, (float *)tg,
                                                        t.threadgroup_position_in_grid, t.thread_index_in_simdgroup,
                                                        t.simdgroup_index_in_threadgroup);
                           });
}
const char *emu_qk_norm_rope(const void *qin, const void *kin, const void *vin, int idt, const float *qn,
                             const float *kn, const float *cs, const float *sn, void *q, void *k, void *v, int odt,
                             int64_t rows, const h3m_qkv_args *a)
{
    if (idt == EMU_BF16)
        return odt == EMU_BF16 ? qkv_t<bfloat, bfloat>(qin, kin, vin, qn, kn, cs, sn, q, k, v, rows, a)
                               : qkv_t<bfloat, float>(qin, kin, vin, qn, kn, cs, sn, q, k, v, rows, a);
    return odt == EMU_BF16 ? qkv_t<float, bfloat>(qin, kin, vin, qn, kn, cs, sn, q, k, v, rows, a)
                           : qkv_t<float, float>(qin, kin, vin, qn, kn, cs, sn, q, k, v, rows, a);
}

const char *emu_rope(float *x, const float *cs, const float *sn, int64_t rows, const h3m_rope_args *a)
{
    return h3emu::dispatch({cdiv((int64_t)a->heads * a->half_, 256), (uint)rows, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_rope(x, cs, sn, *a, t.thread_position_in_grid); });
}

const char *emu_swiglu(const void *gate, const void *up, void *out, int dt, int64_t rows, const h3m_ew_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        if (dt == EMU_BF16)
            h3m_swiglu<bfloat>((const bfloat *)gate, (const bfloat *)up, (bfloat *)out, *a, t.thread_position_in_grid);
        else
            h3m_swiglu<float>((const float *)gate, (const float *)up, (float *)out, *a, t.thread_position_in_grid);
    });
}

const char *emu_gelu(const float *x, float *y, int64_t rows, const h3m_ew_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_gelu(x, y, *a, t.thread_position_in_grid); });
}

const char *emu_mul(const float *x, const float *b, float *y, int64_t rows, const h3m_ew_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_mul(x, b, y, *a, t.thread_position_in_grid); });
}

const char *emu_conv3d(const float *x, const float *w, const float *bias, float *y, const h3m_conv3d_args *g)
{
    const int64_t M = (int64_t)g->To * g->Ho * g->Wo;
    return h3emu::dispatch({cdiv(g->cout, H3M_BN), cdiv(M, H3M_BM), 1}, {H3M_GEMM_THREADS, 1, 1}, H3M_GEMM_TG_BYTES,
                           [&](const h3emu::ids &t, void *tg) {
                               h3m_conv3d(x, w, bias, y, *g, (float *)tg, t.threadgroup_position_in_grid,
                                          t.thread_index_in_threadgroup, t.simdgroup_index_in_threadgroup);
                           });
}

const char *emu_snake(const float *x, const float *a, const float *rb, const float *fup, const float *fdown, float *dst,
                      const h3m_phased_args *p)
{
    return h3emu::dispatch({cdiv(p->C, 32), (uint)((int64_t)p->d * p->phase_rows), 1}, {32, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) {
                               h3m_snake(x, a, rb, fup, fdown, dst, *p, t.thread_position_in_grid);
                           });
}

const char *emu_conv1_clamp(const float *x, const float *w, float *y, const h3m_conv1_args *a)
{
    return h3emu::dispatch({cdiv(a->M, H3M_ATT_ROWS), 1, 1}, {H3M_ATT_ROWS * 32, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) {
                               h3m_conv1_clamp(x, w, y, *a, t.threadgroup_position_in_grid,
                                               t.thread_index_in_simdgroup, t.simdgroup_index_in_threadgroup);
                           });
}

const char *emu_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, const h3m_ln_args *a)
{
    return h3emu::dispatch({(uint)rows, 1, 1}, {row_threads(a->n), 1, 1}, 32 * 4, [&](const h3emu::ids &t, void *tg) {
        h3m_layernorm(x, w, b, y, *a, (float *)tg, t.threadgroup_position_in_grid, t.thread_index_in_threadgroup,
                      t.threads_per_threadgroup, t.thread_index_in_simdgroup, t.simdgroup_index_in_threadgroup,
                      t.simdgroups_per_threadgroup);
    });
}

const char *emu_group_norm(const float *x, const float *w, const float *b, float *y, int frames, const h3m_gn_args *a)
{
    if (a->groups < 1 || a->C % a->groups) return "group_norm: channels not a multiple of groups";
    return h3emu::dispatch({(uint)a->groups, (uint)frames, 1}, {256, 1, 1}, 32 * 4, [&](const h3emu::ids &t, void *tg) {
        h3m_group_norm(x, w, b, y, *a, (float *)tg, t.threadgroup_position_in_grid, t.thread_index_in_threadgroup,
                       t.threads_per_threadgroup, t.thread_index_in_simdgroup, t.simdgroup_index_in_threadgroup,
                       t.simdgroups_per_threadgroup);
    });
}

void h3emu_reverse(bool on) { h3emu::set_reverse_order(on); }

const char *emu_euler(float *x, const float *v, const h3m_knob_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), 1, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_euler(x, v, *a, t.thread_position_in_grid); });
}
const char *emu_extrapolate(float *out, const float *x, const float *b, const h3m_knob_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), 1, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_extrapolate(out, x, b, *a, t.thread_position_in_grid);
    });
}
const char *emu_sub(float *out, const float *x, const float *b, const h3m_knob_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), 1, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_sub(out, x, b, *a, t.thread_position_in_grid); });
}
const char *emu_pool_pairs(const float *src, const int64_t *pairs, float *dst, int64_t rows, const h3m_rowop_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_pool_pairs(src, (const long *)pairs, dst, *a, t.thread_position_in_grid);
    });
}
const char *emu_unpool_pairs(const float *red, const float *base, const int64_t *pairs, float *full, int64_t rows,
                             const h3m_rowop_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_unpool_pairs(red, base, (const long *)pairs, full, *a, t.thread_position_in_grid);
    });
}
const char *emu_scatter_rows(const float *src, const int64_t *idx, float *dst, int64_t rows, const h3m_rowop_args *a)
{
    const int has_idx = idx != nullptr;
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_scatter_rows(src, (const long *)idx, dst, *a, has_idx, t.thread_position_in_grid);
    });
}
const char *emu_add_div(float *y, const float *x, int64_t rows, const h3m_rowop_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 256), (uint)rows, 1}, {256, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_add_div(y, x, *a, t.thread_position_in_grid); });
}

const char *emu_head_pool(const float *x, float *y, int64_t rows, const h3m_head_pool_args *a)
{
    return h3emu::dispatch({cdiv(a->n, 32), (uint)rows, 1}, {32, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) { h3m_head_pool(x, y, *a, t.thread_position_in_grid); });
}
const char *emu_channels_last(const float *x, const float *scale, const float *shift, float *y, const h3m_cl_args *a)
{
    const int64_t rows = (int64_t)a->nt * a->ny * a->nx;
    return h3emu::dispatch({cdiv(a->C, 32), (uint)rows, 1}, {32, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_channels_last(x, scale, shift, y, *a, t.thread_position_in_grid);
    });
}
const char *emu_unpatchify(const float *src, const int32_t *fmap, float *dst, int64_t rows, const h3m_unpatch_args *a)
{
    const int cols = a->C * a->pt * a->ps * a->ps;
    return h3emu::dispatch({cdiv(cols, 64), (uint)rows, 1}, {64, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        h3m_unpatchify(src, fmap, dst, *a, t.thread_position_in_grid);
    });
}

const char *emu_abs_diff_sum(const float *x, const float *b, int64_t n, double *diff, double *ref)
{
    const uint blocks = cdiv(n, H3M_ADS_BLOCK);
    float *part = (float *)malloc(sizeof(float) * 4 * (blocks ? blocks : 1));
    if (!part) return "out of memory";
    const h3m_knob_args a = {(int)n, 1, 0, 0, 0, 0};
    const char *e = blocks ? h3emu::dispatch({blocks, 1, 1}, {H3M_ADS_THREADS, 1, 1}, 4 * (H3M_ADS_THREADS / 32) * 4,
                                             [&](const h3emu::ids &t, void *tg) {
                                                 h3m_abs_diff_sum(x, b, part, a, (float *)tg,
                                                                  t.threadgroup_position_in_grid,
                                                                  t.thread_index_in_threadgroup,
                                                                  t.thread_index_in_simdgroup,
                                                                  t.simdgroup_index_in_threadgroup);
                                             })
                           : nullptr;
    double d = 0, r = 0;
    for (uint k = 0; k < blocks; k++) {
        d += (double)part[4 * k] + (double)part[4 * k + 1];
        r += (double)part[4 * k + 2] + (double)part[4 * k + 3];
    }
    free(part);
    *diff = d, *ref = r;
    return e;
}

const char *emu_vae_stitch(const float *tile, float *above, float *left, float *carry, uint8_t *rgb, float *pixels,
                           const float *mean, const float *sd, const h3m_stitch_args *s)
{
    if (s->ov_bottom > s->max_ovy || s->ov_right > s->max_ovx || s->own_w > s->tw || s->own_h > s->th)
        return "vae_stitch: overlaps or owned area larger than the tile";
    const char *e = h3emu::dispatch({cdiv(s->own_w, 32), (uint)s->own_h, (uint)s->C}, {32, 1, 1}, 0,
                                    [&](const h3emu::ids &t, void *) {
                                        h3m_vae_stitch(tile, above, left, carry, rgb, pixels, mean, sd, *s,
                                                       t.thread_position_in_grid);
                                    });
    if (e) return e;
    return h3emu::dispatch({cdiv(s->tw, 32), (uint)s->th, (uint)(s->K * s->C)}, {32, 1, 1}, 0,
                           [&](const h3emu::ids &t, void *) {
                               h3m_vae_save_strips(tile, above, left, *s, t.thread_position_in_grid);
                           });
}

template <class TX, class TY>
static const char *linear_q8_t(const void *x, const int8_t *q, const float *scale, const float *bias, void *y,
                               const h3m_linear_args *a)
{
    return h3emu::dispatch({cdiv(a->N, H3M_BN), cdiv(a->M, H3M_BM), 1}, {H3M_GEMM_THREADS, 1, 1}, H3M_GEMM_TG_BYTES,
                           [&](const h3emu::ids &t, void *tg) {
                               h3m_linear_q8<TX, TY>((const TX *)x, (const char *)q, scale, bias, (TY *)y, *a,
                                                     (float *)tg, t.threadgroup_position_in_grid,
                                                     t.thread_index_in_threadgroup, t.simdgroup_index_in_threadgroup);
                           });
}
const char *emu_linear_q8(const void *x, int xdt, const int8_t *q, const float *scale, const float *bias, void *y,
                          int ydt, const h3m_linear_args *a)
{
    if (xdt == EMU_BF16)
        return ydt == EMU_BF16 ? linear_q8_t<bfloat, bfloat>(x, q, scale, bias, y, a)
                               : linear_q8_t<bfloat, float>(x, q, scale, bias, y, a);
    return ydt == EMU_BF16 ? linear_q8_t<float, bfloat>(x, q, scale, bias, y, a)
                           : linear_q8_t<float, float>(x, q, scale, bias, y, a);
}
