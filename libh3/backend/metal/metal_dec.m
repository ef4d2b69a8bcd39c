/*
 * The Metal backend's decoder and encoder ops (backend.h's h3_backend_decoders), dispatched as
 * tests/metal_emu/kernels_emu.cpp does. Two take host memory by the seam's contract:
 * channels_last's latents and statistics are copied into a temporary buffer when encoded (the
 * caller may reuse them once the op returns), and vae_stitch's rgb / pixels outputs are the
 * caller's host buffers, mapped for the GPU without a copy; vae_stitch waits for its work, so
 * they hold the tile when it returns.
 */
#include "backend/metal/metal_internal.h"

#include "../../../shaders/metal/h3_metal.h"

#include <limits.h>
#include <string.h>

static NSUInteger cdiv(int64_t a, int64_t b) { return (NSUInteger)((a + b - 1) / b); }
static bool fits(int64_t v) { return v >= 0 && v <= INT_MAX; }

static int need(mtl_be *b, const char *op, bool ok)
{
    return ok ? 0 : mtl_err(b, H3_E_INVALID, "metal: %s: f32 operands with sizes and strides below 2^31 expected", op);
}

static int d_channels_last(h3_backend *be, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail,
                           int ny, int nx, const float *scale, const float *shift, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    const int64_t C = y->cols;
    int rc = need(b, "channels_last", y->dtype == H3_DT_F32 && fits(C) && fits(cs) && fits(ts) && fits(rs) &&
                                          fits(y->ld) && nt >= 0 && ny >= 0 && nx >= 0 && t_avail >= 1 &&
                                          fits((int64_t)nt * ny * nx));
    if (rc || !C || !nt || !ny || !nx) return rc;
    /* the largest index the kernel reads, + 1 */
    const int64_t tl = (nt < t_avail ? nt : t_avail) - 1;
    const int64_t span = (C - 1) * cs + tl * ts + (int64_t)(ny - 1) * rs + nx;
    id<MTLBuffer> xb, sb, hb;
    if ((rc = mtl_temp_copy(b, x, (size_t)span * 4, "channels_last", &xb))) return rc;
    if ((rc = mtl_temp_copy(b, scale, (size_t)C * 4, "channels_last", &sb))) return rc;
    if ((rc = mtl_temp_copy(b, shift, (size_t)C * 4, "channels_last", &hb))) return rc;
    const h3m_cl_args a = {(int)C, (int)cs, (int)ts, (int)rs, nt, t_avail, ny, nx, (int)y->ld};
    const mtl_arg args[] = {MTL_BUF(xb, 0, "x"), MTL_BUF(sb, 0, "scale"), MTL_BUF(hb, 0, "shift"),
                            MTL_MEM(y->data, "y"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "channels_last", "h3m_channels_last", args, 5, 0,
                        MTLSizeMake(cdiv(C, 32), (NSUInteger)((int64_t)nt * ny * nx), 1), MTLSizeMake(32, 1, 1));
}

static int d_unpatchify(h3_backend *be, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps,
                        const int32_t *fmap, float *dst)
{
    mtl_be *b = mtl_of(be);
    const int64_t cols = (int64_t)C * pt * ps * ps;
    int rc = need(b, "unpatchify", src->dtype == H3_DT_F32 && fits(tok0) && fits(cols) && fits(src->ld) &&
                                       fits(src->rows) && src->cols == cols);
    if (rc) return rc;
    const h3m_unpatch_args a = {(int)tok0, gh, gw, C, pt, ps, (int)src->ld};
    const mtl_arg args[] = {MTL_MEM(src->data, "src"), MTL_MEM(fmap, "fmap"), MTL_MEM(dst, "dst"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "unpatchify", "h3m_unpatchify", args, 4, 0,
                        MTLSizeMake(cdiv(cols, 64), (NSUInteger)src->rows, 1), MTLSizeMake(64, 1, 1));
}

static int d_vae_stitch(h3_backend *be, const h3_bstitch *s)
{
    mtl_be *b = mtl_of(be);
    if (s->ov_bottom > s->max_ovy || s->ov_right > s->max_ovx || s->own_w > s->tw || s->own_h > s->th || s->C < 1 ||
        s->K < 1)
        return mtl_err(b, H3_E_INVALID, "metal: vae_stitch: overlaps or owned area larger than the tile");
    const h3m_stitch_args a = {s->C, s->K, s->keep0, s->keep1, s->blend_t, s->th, s->tw, s->max_ovy, s->max_ovx,
                               s->H, s->W, s->frames, s->window, s->windows, s->y0, s->x0, s->own_h, s->own_w,
                               s->ov_top, s->ov_left, s->ov_bottom, s->ov_right, s->slot_above, s->slot_left,
                               s->raw ? 1 : 0, s->rgb != NULL, s->pixels != NULL};
    const size_t out_n = (size_t)s->frames * (size_t)s->H * (size_t)s->W * (size_t)s->C;
    id<MTLBuffer> rgb = nil, px = nil, mb, sdb;
    NSUInteger rgb_off = 0, px_off = 0;
    int rc = 0;
    if (s->rgb) rc = mtl_temp_wrap(b, s->rgb, out_n, "vae_stitch", &rgb, &rgb_off);
    if (!rc && s->pixels) rc = mtl_temp_wrap(b, s->pixels, out_n * 4, "vae_stitch", &px, &px_off);
    if (!rc) rc = mtl_temp_copy(b, s->pix_mean, (size_t)s->C * 4, "vae_stitch", &mb);
    if (!rc) rc = mtl_temp_copy(b, s->pix_std, (size_t)s->C * 4, "vae_stitch", &sdb);
    if (rc) return rc;
    const mtl_arg args[] = {MTL_MEM(s->tile, "tile"),
                            MTL_MEM(s->above, "above strips"),
                            MTL_MEM(s->left, "left strips"),
                            MTL_MEM(s->carry, "carry"),
                            rgb ? MTL_BUF(rgb, rgb_off, "rgb") : MTL_MEM(NULL, "rgb"),
                            px ? MTL_BUF(px, px_off, "pixels") : MTL_MEM(NULL, "pixels"),
                            MTL_BUF(mb, 0, "mean"),
                            MTL_BUF(sdb, 0, "std"),
                            MTL_BYTES(&a, sizeof a)};
    rc = mtl_dispatch(b, "vae_stitch", "h3m_vae_stitch", args, 9, 0,
                      MTLSizeMake(cdiv(s->own_w, 32), (NSUInteger)s->own_h, (NSUInteger)s->C), MTLSizeMake(32, 1, 1));
    if (rc) return rc;
    const mtl_arg sargs[] = {MTL_MEM(s->tile, "tile"), MTL_MEM(s->above, "above strips"),
                             MTL_MEM(s->left, "left strips"), MTL_BYTES(&a, sizeof a)};
    rc = mtl_dispatch(b, "vae_stitch", "h3m_vae_save_strips", sargs, 4, 0,
                      MTLSizeMake(cdiv(s->tw, 32), (NSUInteger)s->th, (NSUInteger)(s->K * s->C)), MTLSizeMake(32, 1, 1));
    /* rgb and pixels are the caller's: they hold the tile when this returns */
    return rc ? rc : mtl_flush(b);
}

static int snake_(mtl_be *b, const char *op, const h3_bt *x, const float *av, const float *rb, const float *fup,
                  const float *fdown, const h3_bphased *dst, int aa)
{
    int rc = need(b, op, x->dtype == H3_DT_F32 && fits(x->rows) && fits(x->cols) && x->ld == x->cols && dst->d >= 1 &&
                             fits(dst->phase_rows) && fits(dst->margin) && fits((int64_t)dst->d * dst->phase_rows));
    if (rc) return rc;
    const h3m_phased_args p = {(int)x->rows, (int)x->cols, dst->d, (int)dst->phase_rows, (int)dst->margin, aa};
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(av, "alpha"), MTL_MEM(rb, "beta"), MTL_MEM(fup, "fup"),
                            MTL_MEM(fdown, "fdown"), MTL_MEM(dst->p, "dst"), MTL_BYTES(&p, sizeof p)};
    return mtl_dispatch(b, op, "h3m_snake", args, 7, 0,
                        MTLSizeMake(cdiv(x->cols, 32), (NSUInteger)((int64_t)dst->d * dst->phase_rows), 1),
                        MTLSizeMake(32, 1, 1));
}

static int d_snake_aa(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const float *fup,
                      const float *fdown, const h3_bphased *dst)
{
    return snake_(mtl_of(be), "snake_aa", x, a, rb, fup, fdown, dst, 1);
}

static int d_snake(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const h3_bphased *dst)
{
    return snake_(mtl_of(be), "snake", x, a, rb, NULL, NULL, dst, 0);
}

static int d_conv1_clamp(h3_backend *be, const h3_bt *X, const float *w, float *y)
{
    mtl_be *b = mtl_of(be);
    int rc = need(b, "conv1_clamp", X->dtype == H3_DT_F32 && fits(X->rows) && fits(X->cols) && fits(X->ld));
    if (rc) return rc;
    const h3m_conv1_args a = {(int)X->rows, (int)X->cols, (int)X->ld};
    const mtl_arg args[] = {MTL_MEM(X->data, "x"), MTL_MEM(w, "w"), MTL_MEM(y, "y"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "conv1_clamp", "h3m_conv1_clamp", args, 4, 0, MTLSizeMake(cdiv(X->rows, H3M_ATT_ROWS), 1, 1),
                        MTLSizeMake(H3M_ATT_ROWS * 32, 1, 1));
}

static int d_conv3d(h3_backend *be, const float *x, const h3_bconv3d *g, const h3_bw *W, const float *bias, float *y)
{
    mtl_be *b = mtl_of(be);
    int To, Ho, Wo;
    h3_bconv3d_out(g, &To, &Ho, &Wo);
    const int64_t K = (int64_t)g->kt * g->kh * g->kw * g->cin, M = (int64_t)To * Ho * Wo;
    if (W->dtype != H3_DT_F32 || W->rows != g->cout || W->cols != K)
        return mtl_err(b, H3_E_INVALID, "metal: conv3d: weight is %s [%lld, %lld], the geometry needs f32 [%d, %lld]",
                       W->dtype == H3_DT_F32 ? "f32" : "not f32", (long long)W->rows, (long long)W->cols, g->cout,
                       (long long)K);
    int rc = need(b, "conv3d", fits(M) && fits(K) && fits((int64_t)g->T * g->H * g->W * g->cin));
    if (rc) return rc;
    if (g->pad_top >= g->H || g->pad_bottom >= g->H || g->pad_left >= g->W || g->pad_right >= g->W)
        return mtl_err(b, H3_E_INVALID, "metal: conv3d: a reflect pad is not smaller than the side it pads");
    const h3m_conv3d_args a = {g->T,  g->H,      g->W,       g->cin, g->cout, g->kt, g->kh, g->kw, g->st,
                               g->sh, g->sw,     g->pad_t,   g->pad_top, g->pad_left, To, Ho,    Wo,    bias != NULL};
    const mtl_arg args[] = {MTL_MEM(x, "x"), MTL_MEM(W->data, "W"), MTL_MEM(bias, "bias"), MTL_MEM(y, "y"),
                            MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "conv3d", "h3m_conv3d", args, 5, H3M_GEMM_TG_BYTES,
                        MTLSizeMake(cdiv(g->cout, H3M_BN), cdiv(M, H3M_BM), 1), MTLSizeMake(H3M_GEMM_THREADS, 1, 1));
}

static int d_group_norm(h3_backend *be, const float *x, int frames, int64_t pixels, int C, int groups, const float *w,
                        const float *c, float eps, bool silu, float *y)
{
    mtl_be *b = mtl_of(be);
    if (groups < 1 || C % groups)
        return mtl_err(b, H3_E_INVALID, "metal: group_norm: %d channels not a multiple of %d groups", C, groups);
    int rc = need(b, "group_norm", fits(pixels) && fits(pixels * C) && frames >= 0);
    if (rc) return rc;
    const h3m_gn_args a = {(int)pixels, C, groups, silu ? 1 : 0, eps};
    const mtl_arg args[] = {MTL_MEM(x, "x"), MTL_MEM(w, "w"), MTL_MEM(c, "b"), MTL_MEM(y, "y"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "group_norm", "h3m_group_norm", args, 5, 32 * 4,
                        MTLSizeMake((NSUInteger)groups, (NSUInteger)frames, 1), MTLSizeMake(256, 1, 1));
}

static int d_head_pool(h3_backend *be, const h3_bt *x, int heads, int D, const h3_bt *y)
{
    mtl_be *b = mtl_of(be);
    if (x->rows != y->rows || (int64_t)heads * D > x->cols || heads < 1 || D < 1)
        return mtl_err(b, H3_E_INVALID, "metal: head_pool of %d heads x %d over %lld x %lld into %lld x %lld", heads, D,
                       (long long)x->rows, (long long)x->cols, (long long)y->rows, (long long)y->cols);
    int rc = need(b, "head_pool", x->dtype == H3_DT_F32 && y->dtype == H3_DT_F32 && fits(x->ld) && fits(y->ld) &&
                                      fits(y->cols) && fits(x->rows) && y->cols >= 1);
    if (rc) return rc;
    const h3m_head_pool_args a = {heads, D, (int)y->cols, (int)x->ld, (int)y->ld};
    const mtl_arg args[] = {MTL_MEM(x->data, "x"), MTL_MEM(y->data, "y"), MTL_BYTES(&a, sizeof a)};
    return mtl_dispatch(b, "head_pool", "h3m_head_pool", args, 3, 0,
                        MTLSizeMake(cdiv(y->cols, 32), (NSUInteger)x->rows, 1), MTLSizeMake(32, 1, 1));
}

const h3_backend_decoders h3_metal_dec = {
    .channels_last = d_channels_last,
    .unpatchify = d_unpatchify,
    .vae_stitch = d_vae_stitch,
    .snake_aa = d_snake_aa,
    .conv1_clamp = d_conv1_clamp,
    .conv3d = d_conv3d,
    .group_norm = d_group_norm,
    .snake = d_snake,
    .head_pool = d_head_pool,
};
