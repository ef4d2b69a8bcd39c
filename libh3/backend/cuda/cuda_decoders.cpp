/*
 * The decoders' layout and convolution ops of backend.h on the GPU (contracts in backend.h; the CPU
 * versions, which every result here is checked against, are in backend/cpu/cpu_vae.c and
 * avae_kern.inc):
 *
 *   channels_last  host latents -> pinned staging -> one upload -> a de-normalising transpose
 *   unpatchify     one thread per value of the proj_out rows, scattered into the tile's frames
 *   vae_stitch     the tile's blend (top, left, temporal carry) in one kernel per frame batch,
 *                  the kept frames converted on the GPU, then one download and a row copy on the
 *                  host into the caller's buffers; the neighbours' strips by two 2-D copies
 *   snake_aa       upsample x2 -> SnakeBeta -> low-pass x2 in shared memory, one kernel, plus one
 *                  kernel for the phased destination's zero rows
 *   conv_gemm      cuBLASLt. Overlapping windows (ld < cols) are first expanded by an im2col
 *                  kernel (cuBLASLt's layouts must not overlap: its MATRIX_LAYOUT_LD must be at
 *                  least the row count). A weight from weight_load (bf16) goes through `linear`,
 *                  the im2col being the f32 -> bf16 rounding every GEMM input gets here; an f32
 *                  weight in device memory (the audio decoder's, backend.h) runs an f32 GEMM
 *                  (CUBLAS_COMPUTE_32F, f32 operands: no TF32), so that decoder keeps diffusers'
 *                  f32 precision
 *   conv1_clamp    one thread per output sample, the CPU kernel's summation order
 *
 * Arithmetic follows the CPU operation for operation (__f*_rn everywhere: no contraction into
 * fused multiply-adds, which the CPU build never does either), so channels_last, unpatchify,
 * vae_stitch and conv1_clamp give the CPU's bits, and snake_aa does too except where the CPU's
 * 8-lane sine falls back to libm for a whole vector (an argument beyond 6000 in a neighbouring
 * channel; both results are then within an ulp of sin^2). conv_gemm's sums are cuBLASLt's (bf16
 * or f32 operands), in another order than the CPU's blocks. Nothing reduces with atomics: each
 * output is summed by one thread (or one cuBLASLt kernel without split-K) in a fixed order.
 *
 * Host memory. channels_last reads, and vae_stitch writes, the caller's host buffers (the
 * contract). Both go through one pinned buffer of this backend (DecState); an event recorded after
 * each upload from it says when the host may write it again.
 */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/decoders.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace h3cuda {

/* ---- staging between the caller's host memory and the device ------------------------------ */

struct DecState {
    void *dev;  /* device staging: channels_last's packed box, vae_stitch's converted frames */
    size_t dev_bytes;
    void *host; /* pinned: the same bytes on the host side */
    size_t host_bytes;
    CUevent host_free; /* recorded after the last upload that reads `host` */
    bool host_busy;
};

/* The kernels of kernels/decoders.cu this file launches (cuda_kernels.h). */
H3K(k_channels_last_kernel, MOD_DECODERS, "channels_last_kernel", const float *, int, int, int, int, int64_t, void *, int, int64_t);
H3K(k_unpatchify_kernel, MOD_DECODERS, "unpatchify_kernel", const void *, int, int64_t, int64_t, int64_t, int, int, int, int, int, const int32_t *, float *);
H3K(k_stitch_kernel, MOD_DECODERS, "stitch_kernel", StitchArgs);
H3K(k_phased_zero_kernel, MOD_DECODERS, "phased_zero_kernel", float *, int, int64_t, int64_t, int64_t, int);
H3K(k_snake_aa_kernel, MOD_DECODERS, "snake_aa_kernel", AaArgs);
H3K(k_add_bias_kernel, MOD_DECODERS, "add_bias_kernel", float *, int64_t, const float *, int64_t, int64_t);
H3K(k_gemm_f32_kernel, MOD_DECODERS, "gemm_f32_kernel", const float *, int64_t, const float *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
H3K(k_im2col_kernel_float, MOD_DECODERS, "im2col_kernel<float>", const void *, int, int64_t, int64_t, int64_t, float *, int64_t);
H3K(k_im2col_kernel_bf16_t, MOD_DECODERS, "im2col_kernel<h3cuda::bf16_t>", const void *, int, int64_t, int64_t, int64_t, bf16_t *, int64_t);
H3K(k_conv1_clamp_kernel, MOD_DECODERS, "conv1_clamp_kernel", const float *, int64_t, int, const float *, float *, int64_t);
static DecState *dec_state(Backend *b)
{
    if (b->dec) return b->dec;
    DecState *s = (DecState *)calloc(1, sizeof(DecState));
    if (!s) {
        fail(b, H3_E_NOMEM, "cuda: out of host memory for the decoders' staging");
        return NULL;
    }
    CUresult e = cuEventCreate(&s->host_free, CU_EVENT_DISABLE_TIMING);
    if (e != CUDA_SUCCESS) {
        free(s);
        fail_cuda(b, e, "creating the decoders' staging event");
        return NULL;
    }
    b->dec = s;
    return s;
}

void decoders_destroy(Backend *b)
{
    DecState *s = b->dec;
    if (!s) return;
    if (s->host_free) cuEventSynchronize(s->host_free);
    if (s->dev) cu_free(s->dev);
    if (s->host) cuMemFreeHost(s->host);
    if (s->host_free) cuEventDestroy(s->host_free);
    free(s);
    b->dec = NULL;
}

/* The device staging buffer, at least `bytes` (grown by half again; stream order makes reuse safe,
   and a buffer queued work may still read is freed only after the stream drains). */
static void *dec_dev(Backend *b, size_t bytes)
{
    DecState *s = dec_state(b);
    if (!s) return NULL;
    if (s->dev && s->dev_bytes >= bytes) return s->dev;
    if (s->dev) {
        CUresult e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) {
            fail_cuda(b, e, "waiting for queued work");
            return NULL;
        }
        cu_free(s->dev);
        s->dev = NULL;
        s->dev_bytes = 0;
    }
    size_t want = bytes + bytes / 2;
    if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
    if (!(s->dev = dev_alloc(b, want, "the decoders' staging"))) return NULL;
    s->dev_bytes = want;
    return s->dev;
}

/* The pinned host buffer, at least `bytes`, free for the host to write: waits for the last upload
   that reads it. */
static void *dec_host(Backend *b, size_t bytes)
{
    DecState *s = dec_state(b);
    if (!s) return NULL;
    if (s->host_busy) {
        CUresult e = cuEventSynchronize(s->host_free);
        if (e != CUDA_SUCCESS) {
            fail_cuda(b, e, "waiting for an upload of the decoders' staging");
            return NULL;
        }
        s->host_busy = false;
    }
    if (s->host && s->host_bytes >= bytes) return s->host;
    if (s->host) {
        /* A download into it may be queued: drain the stream before it goes. */
        CUresult e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) {
            fail_cuda(b, e, "waiting for queued work");
            return NULL;
        }
        cuMemFreeHost(s->host);
        s->host = NULL;
        s->host_bytes = 0;
    }
    size_t want = bytes + bytes / 2;
    if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
    CUresult e = cu_host_alloc((void **)&s->host, want);
    if (e != CUDA_SUCCESS) {
        s->host = NULL;
        fail(b, H3_E_NOMEM, "cuda: cannot allocate %.1f MiB of pinned host memory for the decoders' staging",
             (double)want / (1024.0 * 1024.0));
        return NULL;
    }
    s->host_bytes = want;
    return s->host;
}

/* Upload `bytes` of the pinned buffer to the device staging; the host may write the pinned buffer
   again once the copy has run (dec_host waits for it). */
static int dec_upload(Backend *b, void *dev, const void *host, size_t bytes)
{
    DecState *s = b->dec;
    CUresult e = cu_copy(dev, host, bytes, b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "uploading the decoders' staging");
    if ((e = cuEventRecord(s->host_free, b->stream)) != CUDA_SUCCESS) return fail_cuda(b, e, "recording an event");
    s->host_busy = true;
    return 0;
}

static int need_f32(const Backend *b, const char *op, const char *name, const h3_bt *t)
{
    int rc = check_view(b, op, name, t);
    if (rc) return rc;
    if (t->dtype != H3_DT_F32)
        return fail(b, H3_E_UNSUPPORTED, "cuda: %s: %s must be f32, got %s", op, name, dtname(t->dtype));
    return 0;
}

int channels_last(Backend *b, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail, int ny, int nx,
                  const float *scale, const float *shift, const h3_bt *y)
{
    int rc = check_view(b, "channels_last", "y", y);
    if (rc) return rc;
    const int64_t C = y->cols;
    if (t_avail < 1 || nt < 0 || ny < 1 || nx < 1 || C < 1 || C > (1 << 20) || y->rows != (int64_t)nt * ny * nx)
        return fail(b, H3_E_INVALID, "cuda: channels_last of %d x %d x %d (%d frames present) into %lld rows of %lld",
                    nt, ny, nx, t_avail, (long long)y->rows, (long long)C);
    if (y->rows == 0) return 0;
    if (!x || !scale || !shift) return fail(b, H3_E_INVALID, "cuda: channels_last: NULL latents or statistics");
    const int ta = nt < t_avail ? nt : t_avail;
    const int64_t plane = (int64_t)ny * nx, nbox = C * ta * plane;
    const size_t bytes = sizeof(float) * (size_t)(2 * C + nbox);
    float *h = (float *)dec_host(b, bytes);
    if (!h) return -H3_E_NOMEM;
    void *d = dec_dev(b, bytes);
    if (!d) return -H3_E_NOMEM;
    /* Gather the box on the host: rows of nx consecutive values, the only contiguous runs the
       caller's strides promise. */
    memcpy(h, scale, sizeof(float) * (size_t)C);
    memcpy(h + C, shift, sizeof(float) * (size_t)C);
    float *o = h + 2 * C;
    for (int64_t c = 0; c < C; c++)
        for (int t = 0; t < ta; t++)
            for (int i = 0; i < ny; i++, o += nx)
                memcpy(o, x + c * cs + (int64_t)t * ts + (int64_t)i * rs, sizeof(float) * (size_t)nx);
    if ((rc = dec_upload(b, d, h, bytes))) return rc;
    const int64_t n = y->rows * C;
    return check_launch(b, k_channels_last_kernel(b, blocks_for(n, 256, 4096), 256, 0, b->stream, 
        (const float *)d, (int)C, ta, ny, nx, y->rows, y->data, y->dtype == H3_DT_BF16, y->ld));
}

int unpatchify(Backend *b, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps, const int32_t *fmap,
               float *dst)
{
    int rc = check_view(b, "unpatchify", "src", src);
    if (rc) return rc;
    if (C < 1 || pt < 1 || ps < 1 || gh < 1 || gw < 1 || tok0 < 0 || src->cols != (int64_t)C * pt * ps * ps)
        return fail(b, H3_E_INVALID, "cuda: unpatchify rows of %lld values, patches of %d x %d x %d x %d",
                    (long long)src->cols, C, pt, ps, ps);
    if (src->rows == 0) return 0;
    if (!fmap || !dst) return fail(b, H3_E_INVALID, "cuda: unpatchify: NULL frame map or destination");
    const int64_t n = src->rows * src->cols;
    return check_launch(b, k_unpatchify_kernel(b, blocks_for(n, 256, 8192), 256, 0, b->stream, src->data, src->dtype == H3_DT_BF16, src->ld,
                                                                     src->rows, tok0, gh, gw, C, pt, ps, fmap, dst));
}

/* The tile's original bottom and right strips for its neighbours: two 2-D copies (the strips lie
   outside the rectangle the tile owns, which the blend only reads). */
static int save_strips(Backend *b, const h3_bstitch *s)
{
    const int64_t planes = (int64_t)s->K * s->C;
    CUresult e;
    if (s->ov_bottom) {
        const int ev = s->ov_bottom;
        e = cu_copy2d(s->above + (int64_t)s->slot_above * planes * s->max_ovy * s->tw,
                              sizeof(float) * (size_t)s->max_ovy * s->tw, s->tile + (int64_t)(s->th - ev) * s->tw,
                              sizeof(float) * (size_t)s->th * s->tw, sizeof(float) * (size_t)ev * s->tw, (size_t)planes, b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "vae_stitch: saving the bottom strip");
    }
    if (s->ov_right) {
        const int ev = s->ov_right;
        e = cu_copy2d(s->left + (int64_t)s->slot_left * planes * s->th * s->max_ovx,
                              sizeof(float) * (size_t)s->max_ovx, s->tile + (s->tw - ev), sizeof(float) * (size_t)s->tw,
                              sizeof(float) * (size_t)ev, (size_t)(planes * s->th),
                              b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "vae_stitch: saving the right strip");
    }
    return 0;
}

int vae_stitch(Backend *b, const h3_bstitch *s)
{
    if (!s) return fail(b, H3_E_INVALID, "cuda: vae_stitch: no tile");
    const bool raw_out = s->raw && s->pixels, pix_out = !s->raw && s->pixels, rgb_out = s->rgb != NULL;
    if (s->C < 1 || s->K < 1 || s->keep0 < 0 || s->keep1 < 0 || s->keep0 + s->keep1 != s->K || s->blend_t < 0 ||
        s->blend_t > s->keep0 || s->blend_t > s->keep1 || s->th < 1 || s->tw < 1 || s->own_h < 0 || s->own_w < 0 ||
        s->own_h > s->th || s->own_w > s->tw || s->ov_top < 0 || s->ov_left < 0 || s->ov_top > s->max_ovy ||
        s->ov_left > s->max_ovx || s->ov_bottom < 0 || s->ov_right < 0 || s->ov_bottom > s->max_ovy ||
        s->ov_right > s->max_ovx ||
        s->y0 < 0 || s->x0 < 0 || s->y0 + s->own_h > s->H || s->x0 + s->own_w > s->W || s->window < 0 ||
        s->window >= s->windows || s->frames < 0 || ((rgb_out || pix_out) && s->C != 3) ||
        ((rgb_out || pix_out) && (!s->pix_mean || !s->pix_std)))
        return fail(b, H3_E_INVALID, "cuda: vae_stitch of a %dx%d tile owning %dx%d, overlaps %d/%d", s->th, s->tw,
                    s->own_h, s->own_w, s->ov_bottom, s->ov_right);
    if (!s->tile || (s->ov_top && !s->above) || (s->ov_left && !s->left) || (s->ov_bottom && !s->above) ||
        (s->ov_right && !s->left) || (s->windows > 1 && s->keep1 > 0 && !s->carry))
        return fail(b, H3_E_INVALID, "cuda: vae_stitch: a tile, strip or carry buffer is missing");
    const bool last = s->window == s->windows - 1;
    /* Frame g = window * keep0 + k for every kept k (the last window keeps its overlap too). */
    const int64_t g0 = (int64_t)s->window * s->keep0;
    int kemit = last ? s->K : s->keep0;
    if (g0 + kemit > s->frames) kemit = g0 >= s->frames ? 0 : (int)(s->frames - g0);
    const int64_t area = (int64_t)s->own_h * s->own_w;
    const size_t per_frame = (size_t)area * s->C * ((raw_out ? 4 : 0) + (pix_out ? 4 : 0) + (rgb_out ? 1 : 0));
    /* Frames per launch: all of them unless their converted bytes pass the batch size. */
    int kb = s->K;
    if (per_frame && (size_t)kb * per_frame > STITCH_BATCH_BYTES) {
        kb = (int)(STITCH_BATCH_BYTES / per_frame);
        if (kb < 1) kb = 1;
    }
    int rc;
    for (int k0 = 0; k0 < s->K; k0 += kb) {
        const int k1 = k0 + kb < s->K ? k0 + kb : s->K;
        const int nb = k0 < kemit ? (k1 < kemit ? k1 : kemit) - k0 : 0; /* frames of this batch that are kept */
        const size_t bytes = (size_t)nb * per_frame;
        StitchArgs a;
        memset(&a, 0, sizeof a);
        char *d = NULL;
        if (bytes) {
            if (!(d = (char *)dec_dev(b, bytes))) return -H3_E_NOMEM;
            size_t off = 0;
            const size_t nf = (size_t)nb * area * s->C;
            if (raw_out) a.raw = (float *)(d + off), off += nf * 4;
            if (pix_out) a.pix = (float *)(d + off), off += nf * 4;
            if (rgb_out) a.rgb = (uint8_t *)(d + off);
        }
        a.tile = s->tile, a.above = s->above, a.left = s->left, a.carry = s->carry;
        a.C = s->C, a.K = s->K, a.keep0 = s->keep0, a.keep1 = s->keep1, a.blend_t = s->blend_t;
        a.th = s->th, a.tw = s->tw, a.max_ovy = s->max_ovy, a.max_ovx = s->max_ovx, a.H = s->H, a.W = s->W;
        a.window = s->window, a.last = last, a.y0 = s->y0, a.x0 = s->x0, a.own_h = s->own_h, a.own_w = s->own_w;
        a.ov_top = s->ov_top, a.ov_left = s->ov_left, a.slot_above = s->slot_above, a.slot_left = s->slot_left;
        a.k0 = k0, a.k1 = k1, a.kemit = kemit, a.nb = nb;
        if (rgb_out || pix_out)
            for (int c = 0; c < 3; c++) a.mean[c] = s->pix_mean[c], a.sd[c] = s->pix_std[c];
        const int64_t n = area * s->C;
        if (n > 0) {
            k_stitch_kernel(b, blocks_for(n, 256, 8192), 256, 0, b->stream, a);
            if ((rc = check_launch(b, "stitch_kernel"))) return rc;
        }
        /* After the last blend has read the neighbours' strips, this tile's replace them. */
        if (k1 == s->K && (rc = save_strips(b, s))) return rc;
        if (!bytes) continue;
        char *h = (char *)dec_host(b, bytes);
        if (!h) return -H3_E_NOMEM;
        CUresult e = cu_copy(h, d, bytes, b->stream);
        if (e == CUDA_SUCCESS) e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "vae_stitch: downloading the frames");
        /* Rows of the owned rectangle into the caller's frames (host copies of own_w values). */
        const int64_t H = s->H, W = s->W, C = s->C, nf = (int64_t)nb * area * C;
        const float *hraw = raw_out ? (const float *)h : NULL;
        const float *hpix = pix_out ? (const float *)h + (raw_out ? nf : 0) : NULL;
        const uint8_t *hrgb = rgb_out ? (const uint8_t *)(h + (size_t)nf * 4 * ((raw_out ? 1 : 0) + (pix_out ? 1 : 0)))
                                      : NULL;
        for (int kk = 0; kk < nb; kk++) {
            const int64_t g = g0 + k0 + kk;
            for (int ry = 0; ry < s->own_h; ry++) {
                const int64_t y = s->y0 + ry, src = ((int64_t)kk * s->own_h + ry) * s->own_w;
                if (hraw)
                    for (int64_t c = 0; c < C; c++)
                        memcpy(s->pixels + ((c * s->frames + g) * H + y) * W + s->x0,
                               hraw + (c * nb + kk) * area + (int64_t)ry * s->own_w, sizeof(float) * (size_t)s->own_w);
                if (hpix)
                    memcpy(s->pixels + ((g * H + y) * W + s->x0) * C, hpix + src * C,
                           sizeof(float) * (size_t)(s->own_w * C));
                if (hrgb) memcpy(s->rgb + ((g * H + y) * W + s->x0) * C, hrgb + src * C, (size_t)(s->own_w * C));
            }
        }
    }
    return 0;
}

int snake_aa(Backend *b, const h3_bt *x, const float *a, const float *rb, const float *fup, const float *fdown,
             const h3_bphased *dst)
{
    int rc = need_f32(b, "snake_aa", "x", x);
    if (rc) return rc;
    if (!dst || !dst->p || !a || !rb || !fup || !fdown)
        return fail(b, H3_E_INVALID, "cuda: snake_aa: a parameter or the destination is missing");
    const int64_t L = x->rows;
    if (x->cols < 1 || x->cols > 65535 || x->ld != x->cols || dst->d < 1 || dst->d > 65535 || dst->margin < 0 ||
        dst->phase_rows < (L + dst->d - 1) / dst->d + dst->margin)
        return fail(b, H3_E_INVALID, "cuda: snake_aa of %lld x %lld (row stride %lld) into %d phases of %lld rows",
                    (long long)L, (long long)x->cols, (long long)x->ld, dst ? dst->d : 0,
                    (long long)(dst ? dst->phase_rows : 0));
    const int C = (int)x->cols;
    const int64_t zrows = (int64_t)dst->d * dst->phase_rows - L; /* rows of zeros over all phases */
    if (zrows > 0) {
        const int64_t per_phase = (dst->phase_rows - (L + dst->d - 1) / dst->d + 1) * C;
        dim3 grid(blocks_for(per_phase, 256, 1024), (unsigned)dst->d);
        k_phased_zero_kernel(b, grid, 256, 0, b->stream, dst->p, dst->d, dst->phase_rows, dst->margin, L, C);
        if ((rc = check_launch(b, "phased_zero_kernel"))) return rc;
    }
    if (L == 0) return 0;
    AaArgs A;
    A.x = (const float *)x->data;
    A.L = L;
    A.C = C;
    A.TC = C < 32 ? C : 32; /* a warp of channels: coalesced rows; narrow signals take all of theirs */
    A.a = a, A.rb = rb, A.fup = fup, A.fdown = fdown;
    A.p = dst->p;
    A.d = dst->d;
    A.phase_rows = dst->phase_rows;
    A.margin = dst->margin;
    const int64_t mblocks = (L + AA_TM - 1) / AA_TM;
    if (mblocks > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: snake_aa: %lld rows is too many", (long long)L);
    dim3 grid((unsigned)mblocks, (unsigned)((C + A.TC - 1) / A.TC));
    const size_t smem = sizeof(float) * (size_t)(2 * AA_TM + H3_AA_TAPS) * (size_t)A.TC;
    return check_launch(b, k_snake_aa_kernel(b, grid, AA_THREADS, smem, b->stream, A));
}

/* The plan key of Y = X W^T in f32 (the TN form of cuda_lt_plans.cu), compute type
   CUBLAS_COMPUTE_32F: true f32 products and sums, no TF32. */
static LtKey f32_key(int64_t M, int64_t N, int64_t K, int64_t ldx, int ax, int64_t ldy, int ay, bool epi_bias)
{
    LtKey k;
    lt_key_init(&k);
    k.M = M, k.N = N, k.K = K;
    k.lda = K, k.ldb = ldx, k.ldd = ldy;
    k.a_type = CUDA_R_32F, k.b_type = CUDA_R_32F, k.d_type = CUDA_R_32F;
    k.align_a = (uint32_t)lt_align(NULL, K * 4), k.align_b = (uint32_t)ax, k.align_d = (uint32_t)ay;
    k.epi_bias = epi_bias;
    return k;
}

/* Y = X W^T + bias with f32 operands (W an f32 matrix in device memory). */
static int gemm_f32(Backend *b, const float *X, int64_t ldx, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    const int64_t M = Y->rows, N = W->rows, K = W->cols;
    const bool epi_bias = bias && ((uintptr_t)bias & 15) == 0;
    LtPlan *p = K > 0 && ldx >= K && Y->ld >= N
                    ? lt_plan(b, f32_key(M, N, K, ldx, lt_align(X, ldx * 4), Y->ld, lt_align(Y->data, Y->ld * 4),
                                         epi_bias))
                    : NULL;
    if (p) {
        cublasStatus_t st;
        if (epi_bias &&
            (st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)))
            return fail_cublas(b, st, "conv_gemm: setting the bias");
        const float one = 1.0f, zero = 0.0f;
        st = cublasLtMatmul(b->lt, p->op, &one, W->data, p->la, X, p->lb, &zero, Y->data, p->ld, Y->data, p->ld,
                            &p->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
        if (st == CUBLAS_STATUS_SUCCESS) {
            if (!bias || epi_bias) return 0;
            /* A bias the epilogue cannot read (not 16-byte aligned): added after, one rounding. */
            dim3 grid(blocks_for(N, 256, 64), (unsigned)(M < 65535 ? M : 65535));
            return check_launch(b, k_add_bias_kernel(b, grid, 256, 0, b->stream, (float *)Y->data, Y->ld, bias, M, N));
        }
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) return fail_cublas(b, st, "conv_gemm");
        lt_plan_refuse(b, p); /* refused after all: this shape takes the own kernel from now on */
    }
    dim3 block(F32_T, F32_T), grid((unsigned)((N + F32_T - 1) / F32_T), (unsigned)((M + F32_T - 1) / F32_T));
    if (grid.y > 65535)
        return fail(b, H3_E_UNSUPPORTED, "cuda: conv_gemm: %lld rows is too many for the fallback GEMM", (long long)M);
    return check_launch(b, k_gemm_f32_kernel(b, grid, block, 0, b->stream, X, ldx, (const float *)W->data, bias, (float *)Y->data, Y->ld, M, N,
                                                   K));
}

int conv_gemm(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    int rc;
    if ((rc = check_view(b, "conv_gemm", "Y", Y))) return rc;
    if (!X || !is_act(X->dtype) || X->cols < 0 || X->ld < 0 || (!X->data && Y->rows > 0))
        return fail(b, H3_E_INVALID, "cuda: conv_gemm: X must be an f32 or bf16 view");
    if (!W || X->cols != W->cols || Y->cols != W->rows || (!W->data && W->rows * W->cols > 0) ||
        (W->dtype != H3_DT_BF16 && W->dtype != H3_DT_F32))
        return fail(b, H3_E_INVALID,
                    "cuda: conv_gemm: windows of %lld values into %lld outputs for a weight of %lld x %lld",
                    (long long)X->cols, (long long)Y->cols, W ? (long long)W->rows : -1LL,
                    W ? (long long)W->cols : -1LL);
    const int64_t M = Y->rows, K = X->cols;
    if (M == 0 || W->rows == 0) return 0;
    const bool f32 = W->dtype == H3_DT_F32;
    if (f32 && Y->dtype != H3_DT_F32) return fail(b, H3_E_UNSUPPORTED, "cuda: conv_gemm: an f32 weight needs an f32 Y");
    /* Windows that do not overlap are a plain GEMM input (bf16 weights: `linear`, which rounds an
       f32 X itself; f32 weights: used in place). Overlapping ones are expanded first. */
    if (X->ld >= K || M == 1) {
        const int64_t ld = X->ld >= K ? X->ld : K;
        if (!f32) {
            const h3_bt xv = h3_bt_make(X->data, X->dtype, M, K, ld);
            return linear(b, &xv, W, bias, Y);
        }
        if (X->dtype == H3_DT_F32) return gemm_f32(b, (const float *)X->data, ld, W, bias, Y);
    }
    const size_t es = f32 ? 4 : 2;
    const int64_t ldd = (K + 7) / 8 * 8;
    /* The GEMM-input scratch: linear reads SCR_XBF16 only for f32 inputs, and this X is bf16 or
       goes to gemm_f32, so the buffer is ours until the GEMM has read it (stream order). */
    void *d = scratch(b, SCR_XBF16, (size_t)(M * ldd) * es);
    if (!d) return -H3_E_NOMEM;
    dim3 grid(blocks_for(K > 0 ? K : 1, 256, 64), (unsigned)(M < 65535 ? M : 65535));
    if (f32)
        k_im2col_kernel_float(b, grid, 256, 0, b->stream, X->data, X->dtype == H3_DT_BF16, X->ld, M, K, (float *)d, ldd);
    else
        k_im2col_kernel_bf16_t(b, grid, 256, 0, b->stream, X->data, X->dtype == H3_DT_BF16, X->ld, M, K, (bf16_t *)d, ldd);
    if ((rc = check_launch(b, "im2col_kernel"))) return rc;
    if (f32) return gemm_f32(b, (const float *)d, ldd, W, bias, Y);
    const h3_bt xv = h3_bt_make(d, H3_DT_BF16, M, K, ldd);
    return linear(b, &xv, W, bias, Y);
}

int conv1_clamp(Backend *b, const h3_bt *X, const float *w, float *y)
{
    if (!X || X->dtype != H3_DT_F32 || X->rows < 0 || X->cols < 0 || X->ld < 0 || X->cols > 0x7fffffffLL)
        return fail(b, H3_E_INVALID, "cuda: conv1_clamp: X must be an f32 view");
    if (X->rows == 0) return 0;
    if (!X->data || !w || !y) return fail(b, H3_E_INVALID, "cuda: conv1_clamp: NULL input, weight or output");
    return check_launch(b, k_conv1_clamp_kernel(b, blocks_for(X->rows, 256, 8192), 256, 0, b->stream, (const float *)X->data, X->ld,
                                                                            (int)X->cols, w, y, X->rows));
}

/* ---- attention with f32 operands ------------------------------------------------------------ */

/* The text encoder and the video decoder keep q, k and v in f32 views; the attention kernels take
   bf16. Each f32 operand is rounded once to bf16 into scratch (rows padded to 8 values, so the
   vectorised kernels and cuDNN can take them), as `linear` rounds an f32 X, and the call goes on. */
int attention_round_operands(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads,
                             int D, float scale, bool causal, const h3_bt *O)
{
    const h3_bt *in[3] = {Q, K, V};
    h3_bt out[3];
    int64_t off[3], total = 0;
    for (int i = 0; i < 3; i++) {
        out[i] = *in[i];
        off[i] = total;
        if (in[i]->dtype == H3_DT_F32) {
            const int64_t ld = (in[i]->cols + 7) / 8 * 8;
            out[i] = h3_bt_make(NULL, H3_DT_BF16, in[i]->rows, in[i]->cols, ld);
            total += in[i]->rows * ld;
        }
    }
    bf16_t *s = (bf16_t *)scratch(b, SCR_XBF16, (size_t)(total > 0 ? total : 1) * 2);
    if (!s) return -H3_E_NOMEM;
    int rc;
    for (int i = 0; i < 3; i++) {
        if (in[i]->dtype != H3_DT_F32) continue;
        out[i].data = s + off[i];
        if ((rc = convert_f32_bf16_2d(b, (const float *)in[i]->data, in[i]->ld, s + off[i], out[i].ld, in[i]->rows,
                                      in[i]->cols)))
            return rc;
    }
    return attention(b, &out[0], &out[1], &out[2], heads, kv_heads, D, scale, causal, O);
}

} /* namespace h3cuda */
