/*
 * The packed sequence of one request: row order, modality tags, timestep roles and the fp64
 * (t, h, w) RoPE grid, reproduced from diffusers' modular pipeline (before_denoise.py:
 * build_packed_sequence, _spatial_position_grid, _temporal_position_grid) down to the last bit of
 * every coordinate; plus the patchify / unpatchify of latents into rows.
 */
#include "models/dit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rotary-time constants of the pipeline: a latent frame spans 5/3 * {1,4,4,4,4}[k % 5] units
   (audio latents tick at 40 Hz = 24 fps * 5/3), and the spatial axes are scaled by 32. */
#define ROPE_FRAME_RESCALE (5.0 / 3.0)
#define ROPE_SPATIAL_SCALE 32.0
static const int k_frames_per_latent[5] = {1, 4, 4, 4, 4};

void h3_dit_layout_free(h3_dit_layout *l)
{
    if (!l) return;
    free(l->text_idx);
    free(l->video_idx);
    free(l->audio_idx);
    free(l->tags);
    free(l->role);
    free(l->pos);
    memset(l, 0, sizeof *l);
}

int64_t h3_dit_layout_export(h3_dit_layout *l, double *position_ids, int64_t *token_tags, int64_t *text_indices,
                             int64_t *video_indices, int64_t *audio_indices, uint8_t *roles, int64_t *n_condition)
{
    if (position_ids) memcpy(position_ids, l->pos, sizeof(double) * 3 * (size_t)l->seq);
    if (token_tags)
        for (int64_t r = 0; r < l->seq; r++) token_tags[r] = l->tags[r];
    if (text_indices) memcpy(text_indices, l->text_idx, sizeof(int64_t) * (size_t)l->n_text);
    if (video_indices) memcpy(video_indices, l->video_idx, sizeof(int64_t) * (size_t)l->n_video);
    if (audio_indices) memcpy(audio_indices, l->audio_idx, sizeof(int64_t) * (size_t)l->n_audio);
    if (roles) memcpy(roles, l->role, (size_t)l->seq);
    if (n_condition) {
        n_condition[0] = l->n_cond_video;
        n_condition[1] = l->n_cond_audio;
    }
    const int64_t seq = l->seq;
    h3_dit_layout_free(l);
    return seq;
}

static int layout_alloc(h3_dit_layout *l, int64_t seq, int64_t nt, int64_t nv, int64_t na)
{
    memset(l, 0, sizeof *l);
    l->seq = seq;
    l->n_text = nt;
    l->n_video = nv;
    l->n_audio = na;
    l->text_idx = h3_malloc(sizeof(int64_t) * (size_t)(nt ? nt : 1));
    l->video_idx = h3_malloc(sizeof(int64_t) * (size_t)(nv ? nv : 1));
    l->audio_idx = h3_malloc(sizeof(int64_t) * (size_t)(na ? na : 1));
    l->tags = h3_calloc((size_t)seq, 1);
    l->role = h3_calloc((size_t)seq, 1);
    l->pos = h3_calloc((size_t)seq * 3, sizeof(double));
    if (!l->text_idx || !l->video_idx || !l->audio_idx || !l->tags || !l->role || !l->pos) {
        h3_dit_layout_free(l);
        return -H3_E_NOMEM;
    }
    return 0;
}

int h3_dit_layout_copy(h3_dit_layout *dst, const h3_dit_layout *src)
{
    int rc = layout_alloc(dst, src->seq, src->n_text, src->n_video, src->n_audio);
    if (rc) return rc;
    memcpy(dst->text_idx, src->text_idx, sizeof(int64_t) * (size_t)src->n_text);
    memcpy(dst->video_idx, src->video_idx, sizeof(int64_t) * (size_t)src->n_video);
    memcpy(dst->audio_idx, src->audio_idx, sizeof(int64_t) * (size_t)src->n_audio);
    memcpy(dst->tags, src->tags, (size_t)src->seq);
    memcpy(dst->role, src->role, (size_t)src->seq);
    memcpy(dst->pos, src->pos, sizeof(double) * 3 * (size_t)src->seq);
    dst->n_cond_video = src->n_cond_video;
    dst->n_cond_audio = src->n_cond_audio;
    dst->lat_t = src->lat_t;
    dst->lat_h = src->lat_h;
    dst->lat_w = src->lat_w;
    dst->audio_lat = src->audio_lat;
    return 0;
}

/*
 * One aspect-normalised spatial axis: numpy.linspace(left, left + ratio, n, endpoint=False) * 32
 * with ratio = dim / sqrt(H*W), left = (1 - ratio) / 2. numpy evaluates it as
 * i * ((stop - start) / n) + start, each operation rounded in double.
 */
static void spatial_grid(int dim, int patch, double sqrt_area, double *out)
{
    const double ratio = (double)dim / sqrt_area;
    const double left = (1.0 - ratio) / 2.0;
    const double start = left, stop = left + ratio;
    const int n = dim / patch;
    const double delta = stop - start;
    const double step = delta / (double)n;
    for (int i = 0; i < n; i++) {
        double y = step == 0 ? (double)i / (double)n * delta : (double)i * step;
        out[i] = (y + start) * ROPE_SPATIAL_SCALE;
    }
}

/*
 * numpy's pairwise summation of a float64 array (what `ndarray.sum()` computes for contiguous
 * input): plain loop below 8 items, 8 interleaved partial sums up to 128, halves above.
 */
static double pairwise_sum(const double *a, int64_t n)
{
    if (n < 8) {
        double r = -0.0;
        for (int64_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

int h3_dit_layout_t2va(const h3_dit_cfg *c, int64_t n_text, const uint8_t *text_tags, int lat_t, int lat_h,
                       int lat_w, int audio_lat, const int *anchors, int n_anchors, h3_dit_layout *out)
{
    memset(out, 0, sizeof *out);
    const int ph = c->patch[1], pw = c->patch[2];
    if (n_text < 1 || n_text > (1 << 24))
        return h3_err(H3_E_INVALID, "layout: the prompt must have 1 to %d tokens, got %lld", 1 << 24,
                      (long long)n_text);
    if (lat_t < 1 || lat_h < ph || lat_w < pw || lat_h % ph || lat_w % pw || lat_t > 100000 ||
        lat_h > 100000 || lat_w > 100000)
        return h3_err(H3_E_INVALID,
                      "layout: video latents %dx%dx%d (frames x height x width) must be positive with "
                      "height/width multiples of the patch %dx%d",
                      lat_t, lat_h, lat_w, ph, pw);
    if (audio_lat < 1 || audio_lat > 10000000)
        return h3_err(H3_E_INVALID, "layout: audio latents per side must be positive, got %d", audio_lat);
    if (n_anchors < 0 || n_anchors > 64 || (n_anchors && !anchors))
        return h3_err(H3_E_INVALID, "layout: %d keyframe anchors", n_anchors);
    const int64_t nh = lat_h / ph, nw = lat_w / pw, per_frame = nh * nw;
    const int64_t n_cond = (int64_t)n_anchors * per_frame, n_arows = (int64_t)audio_lat * H3_STEREO;
    const int64_t n_vgen = (int64_t)lat_t * per_frame;
    const int64_t seq = n_text + n_cond + n_arows + n_vgen;
    if (seq > ((int64_t)1 << 31))
        return h3_err(H3_E_INVALID, "layout: %lld rows is more than this engine supports", (long long)seq);
    int rc = layout_alloc(out, seq, n_text, n_cond + n_vgen, n_arows);
    if (rc) return rc;
    out->n_cond_video = n_cond;
    out->lat_t = lat_t;
    out->lat_h = lat_h;
    out->lat_w = lat_w;
    out->audio_lat = audio_lat;
    const int64_t cond_start = n_text, audio_start = cond_start + n_cond, video_start = audio_start + n_arows;

    double *hg = h3_malloc(sizeof(double) * (size_t)(nh + nw + lat_t));
    if (!hg) {
        h3_dit_layout_free(out);
        return -H3_E_NOMEM;
    }
    double *wg = hg + nh, *frame_t = wg + nw;
    const double sqrt_area = sqrt((double)lat_h * (double)lat_w);
    spatial_grid(lat_h, ph, sqrt_area, hg);
    spatial_grid(lat_w, pw, sqrt_area, wg);
    /* Frame times: origin + cumulative sum (sequential, float64) of the spans of earlier frames. */
    const double origin = (double)n_text;
    double cum = 0;
    for (int k = 0; k < lat_t; k++) {
        frame_t[k] = origin + cum;
        cum += ROPE_FRAME_RESCALE * k_frames_per_latent[k % 5];
    }

    double *pos = out->pos;
    for (int64_t i = 0; i < n_text; i++) {
        pos[i * 3] = (double)i;
        uint8_t tag = text_tags ? text_tags[i] : H3_TAG_TEXT;
        if (tag != H3_TAG_TEXT && tag != H3_TAG_VIDEO) {
            free(hg);
            h3_dit_layout_free(out);
            return h3_err(H3_E_INVALID, "layout: text row %lld has tag %d (text rows are 1, vision spans 0)",
                          (long long)i, tag);
        }
        out->tags[i] = tag;
        out->role[i] = H3_ROLE_VIDEO; /* text rows run at the video timestep */
        out->text_idx[i] = i;
    }
    for (int a = 0; a < n_anchors; a++) {
        double t;
        if (anchors[a] == H3_ANCHOR_FIRST) {
            t = (double)n_text;
        } else if (anchors[a] == H3_ANCHOR_LAST) {
            /* The pipeline sums the frame spans with numpy's pairwise sum for this anchor. */
            double *spans = h3_malloc(sizeof(double) * (size_t)lat_t);
            if (!spans) {
                free(hg);
                h3_dit_layout_free(out);
                return -H3_E_NOMEM;
            }
            for (int k = 0; k < lat_t; k++) spans[k] = ROPE_FRAME_RESCALE * k_frames_per_latent[k % 5];
            t = (double)n_text + pairwise_sum(spans, lat_t) - ROPE_FRAME_RESCALE;
            free(spans);
        } else {
            free(hg);
            h3_dit_layout_free(out);
            return h3_err(H3_E_INVALID, "layout: keyframe anchor %d must be first (0) or last (1), got %d", a,
                          anchors[a]);
        }
        for (int64_t r = 0; r < per_frame; r++) {
            int64_t row = cond_start + a * per_frame + r;
            pos[row * 3] = t;
            pos[row * 3 + 1] = hg[r / nw];
            pos[row * 3 + 2] = wg[r % nw];
        }
    }
    for (int64_t r = 0; r < n_arows; r++) {
        int64_t row = audio_start + r;
        int side = (int)(r / audio_lat);
        pos[row * 3] = origin + (double)(r % audio_lat);
        pos[row * 3 + 1] = 0.0;
        pos[row * 3 + 2] = side == 0 ? wg[0] : wg[nw - 1];
        out->tags[row] = H3_TAG_AUDIO;
        out->role[row] = H3_ROLE_AUDIO;
        out->audio_idx[r] = row;
    }
    for (int64_t r = 0; r < n_vgen; r++) {
        int64_t row = video_start + r, f = r / per_frame, q = r % per_frame;
        pos[row * 3] = frame_t[f];
        pos[row * 3 + 1] = hg[q / nw];
        pos[row * 3 + 2] = wg[q % nw];
    }
    for (int64_t r = 0; r < n_cond + n_vgen; r++) {
        int64_t row = r < n_cond ? cond_start + r : video_start + (r - n_cond);
        out->video_idx[r] = row;
        out->tags[row] = H3_TAG_VIDEO;
        out->role[row] = r < n_cond ? H3_ROLE_COND_VIDEO : H3_ROLE_VIDEO;
    }
    free(hg);
    return 0;
}

/* ---- latents <-> rows ------------------------------------------------------------------ */

void h3_dit_patchify_video(const h3_dit_cfg *c, const float *lat, int T, int H, int W, float *rows)
{
    const int C = c->video_ch, ph = c->patch[1], pw = c->patch[2];
    const int nh = H / ph, nw = W / pw, P = C * ph * pw;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < nh; i++)
            for (int j = 0; j < nw; j++) {
                float *row = rows + (((int64_t)t * nh + i) * nw + j) * P;
                for (int ch = 0; ch < C; ch++)
                    for (int di = 0; di < ph; di++)
                        for (int dj = 0; dj < pw; dj++)
                            row[(ch * ph + di) * pw + dj] =
                                lat[(((int64_t)ch * T + t) * H + i * ph + di) * W + j * pw + dj];
            }
}

void h3_dit_unpatchify_video(const h3_dit_cfg *c, const float *rows, int T, int H, int W, float *lat)
{
    const int C = c->video_ch, ph = c->patch[1], pw = c->patch[2];
    const int nh = H / ph, nw = W / pw, P = C * ph * pw;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < nh; i++)
            for (int j = 0; j < nw; j++) {
                const float *row = rows + (((int64_t)t * nh + i) * nw + j) * P;
                for (int ch = 0; ch < C; ch++)
                    for (int di = 0; di < ph; di++)
                        for (int dj = 0; dj < pw; dj++)
                            lat[(((int64_t)ch * T + t) * H + i * ph + di) * W + j * pw + dj] =
                                row[(ch * ph + di) * pw + dj];
            }
}

void h3_dit_pack_audio(int C, int Ta, const float *lat, float *rows)
{
    for (int s = 0; s < H3_STEREO; s++)
        for (int t = 0; t < Ta; t++)
            for (int ch = 0; ch < C; ch++)
                rows[((int64_t)s * Ta + t) * C + ch] = lat[((int64_t)s * C + ch) * Ta + t];
}

void h3_dit_unpack_audio(int C, int Ta, const float *rows, float *lat)
{
    for (int s = 0; s < H3_STEREO; s++)
        for (int t = 0; t < Ta; t++)
            for (int ch = 0; ch < C; ch++)
                lat[((int64_t)s * C + ch) * Ta + t] = rows[((int64_t)s * Ta + t) * C + ch];
}

/* ---- a layout given row by row (the parity forward) ------------------------------------- */

int h3_dit_layout_from_rows(int64_t seq, int64_t n_text, int64_t n_video, int64_t n_audio,
                            const int64_t *text_idx, const int64_t *video_idx, const int64_t *audio_idx,
                            const int64_t *tags, const double *pos, h3_dit_layout *out)
{
    memset(out, 0, sizeof *out);
    if (seq < 1 || seq > ((int64_t)1 << 31) || n_text < 0 || n_video < 0 || n_audio < 0 ||
        n_text + n_video + n_audio > seq)
        return h3_err(H3_E_INVALID,
                      "forward: %lld text + %lld video + %lld audio rows do not fit a sequence of %lld rows",
                      (long long)n_text, (long long)n_video, (long long)n_audio, (long long)seq);
    if (n_text < 1) return h3_err(H3_E_INVALID, "forward: encoder_hidden_states has no rows");
    int rc = layout_alloc(out, seq, n_text, n_video, n_audio);
    if (rc) return rc;
    /* Every sequence row is written by at most one input row (diffusers' index_copy with a
       repeated index has no defined winner); rows nobody writes stay zero, as in diffusers. */
    uint8_t *seen = h3_calloc((size_t)seq, 1);
    if (!seen) {
        h3_dit_layout_free(out);
        return -H3_E_NOMEM;
    }
    const struct {
        const char *name;
        const int64_t *idx;
        int64_t n;
        int64_t *dst;
    } lists[3] = {{"text_indices", text_idx, n_text, out->text_idx},
                  {"video_indices", video_idx, n_video, out->video_idx},
                  {"audio_indices", audio_idx, n_audio, out->audio_idx}};
    for (int l = 0; l < 3 && !rc; l++)
        for (int64_t i = 0; i < lists[l].n; i++) {
            int64_t r = lists[l].idx[i];
            if (r < 0 || r >= seq) {
                rc = h3_err(H3_E_INVALID, "forward: %s[%lld] = %lld is outside the sequence of %lld rows",
                            lists[l].name, (long long)i, (long long)r, (long long)seq);
                break;
            }
            if (seen[r]) {
                rc = h3_err(H3_E_INVALID, "forward: sequence row %lld is addressed twice (%s[%lld])",
                            (long long)r, lists[l].name, (long long)i);
                break;
            }
            seen[r] = 1;
            lists[l].dst[i] = r;
        }
    free(seen);
    for (int64_t r = 0; r < seq && !rc; r++) {
        if (tags[r] < 0 || tags[r] >= H3_TAGS) {
            rc = h3_err(H3_E_INVALID, "forward: token_tags[%lld] = %lld (0 video, 1 text, 2 audio)", (long long)r,
                        (long long)tags[r]);
            break;
        }
        out->tags[r] = (uint8_t)tags[r];
        for (int a = 0; a < 3; a++) {
            double v = pos[r * 3 + a];
            if (!isfinite(v)) {
                rc = h3_err(H3_E_INVALID, "forward: position_ids[%lld][%d] is not finite", (long long)r, a);
                break;
            }
            out->pos[r * 3 + a] = v;
        }
    }
    if (rc) h3_dit_layout_free(out);
    return rc;
}

/* ---- the ref2va layout ------------------------------------------------------------------ */

/* One channel-major audio block of `ta` latents per side from rotary time `clock`: no height
   coordinate, w pinned to the extremes of the width grid of the block it belongs to (diffusers'
   _fill_audio_positions). */
static void fill_audio(h3_dit_layout *l, int64_t start, int ta, double clock, double w_left, double w_right,
                       int64_t *aidx, uint8_t role)
{
    for (int64_t r = 0; r < (int64_t)ta * H3_STEREO; r++) {
        int64_t row = start + r;
        l->pos[row * 3] = clock + (double)(r % ta);
        l->pos[row * 3 + 1] = 0.0;
        l->pos[row * 3 + 2] = r < ta ? w_left : w_right;
        l->tags[row] = H3_TAG_AUDIO;
        l->role[row] = role;
        aidx[r] = row;
    }
}

/* `lat_t` frames of one visual grid from `clock`, frames spaced 5/3 * {1,4,4,4,4} summed
   sequentially (diffusers' _temporal_position_grid). An image passes lat_t = 1. */
static void fill_video(h3_dit_layout *l, int64_t start, int lat_t, int64_t nh, int64_t nw, const double *hg,
                       const double *wg, double clock, int64_t *vidx, uint8_t role)
{
    const int64_t per_frame = nh * nw;
    double cum = 0;
    for (int f = 0; f < lat_t; f++) {
        const double t = clock + cum;
        cum += ROPE_FRAME_RESCALE * k_frames_per_latent[f % 5];
        for (int64_t q = 0; q < per_frame; q++) {
            int64_t row = start + f * per_frame + q;
            l->pos[row * 3] = t;
            l->pos[row * 3 + 1] = hg[q / nw];
            l->pos[row * 3 + 2] = wg[q % nw];
            l->tags[row] = H3_TAG_VIDEO;
            l->role[row] = role;
            vidx[f * per_frame + q] = row;
        }
    }
}

static int ref_check(const h3_dit_cfg *c, const h3_dit_ref *f, int i)
{
    const int ph = c->patch[1], pw = c->patch[2];
    if (f->kind != H3_REF_IMAGE && f->kind != H3_REF_VIDEO && f->kind != H3_REF_AUDIO)
        return h3_err(H3_E_INVALID, "layout: reference %d has kind %d (0 image, 1 video, 2 audio)", i, f->kind);
    if (f->kind != H3_REF_AUDIO) {
        if (f->lat_t < 1 || (f->kind == H3_REF_IMAGE && f->lat_t != 1) || f->lat_t > 100000 || f->lat_h < ph ||
            f->lat_w < pw || f->lat_h % ph || f->lat_w % pw || f->lat_h > 100000 || f->lat_w > 100000)
            return h3_err(H3_E_INVALID,
                          "layout: reference %d latents %dx%dx%d must be positive (1 frame for an image) with "
                          "height/width multiples of the patch %dx%d",
                          i, f->lat_t, f->lat_h, f->lat_w, ph, pw);
    }
    if (f->audio_lat < 0 || f->audio_lat > 10000000 || (f->kind == H3_REF_AUDIO && f->audio_lat < 1) ||
        (f->kind == H3_REF_IMAGE && f->audio_lat))
        return h3_err(H3_E_INVALID, "layout: reference %d has %d audio latents (audio: >= 1, image: 0)", i,
                      f->audio_lat);
    return 0;
}

int h3_dit_layout_ref2va(const h3_dit_cfg *c, int64_t n_text, const uint8_t *text_tags, const h3_dit_ref *refs,
                         int n_refs, int lat_t, int lat_h, int lat_w, int audio_lat, h3_dit_layout *out)
{
    memset(out, 0, sizeof *out);
    if (n_refs < 1 || n_refs > H3_REF_MAX || !refs)
        return h3_err(H3_E_INVALID, "layout: ref2va needs 1 to %d references, got %d", H3_REF_MAX, n_refs);
    /* The target alone, as the t2va layout builds it (same checks, text rows, tags). Its
       generated rows are then moved behind the reference rows. */
    h3_dit_layout base;
    int rc = h3_dit_layout_t2va(c, n_text, text_tags, lat_t, lat_h, lat_w, audio_lat, NULL, 0, &base);
    if (rc) return rc;
    const int ph = c->patch[1], pw = c->patch[2];
    int64_t ref_v = 0, ref_a = 0;
    int max_side = lat_h > lat_w ? lat_h : lat_w;
    for (int i = 0; i < n_refs; i++) {
        if ((rc = ref_check(c, &refs[i], i))) {
            h3_dit_layout_free(&base);
            return rc;
        }
        if (refs[i].kind != H3_REF_AUDIO) {
            ref_v += (int64_t)refs[i].lat_t * (refs[i].lat_h / ph) * (refs[i].lat_w / pw);
            if (refs[i].lat_h > max_side) max_side = refs[i].lat_h;
            if (refs[i].lat_w > max_side) max_side = refs[i].lat_w;
        }
        ref_a += (int64_t)refs[i].audio_lat * H3_STEREO;
    }
    const int64_t seq = base.seq + ref_v + ref_a;
    if (seq > ((int64_t)1 << 31)) {
        h3_dit_layout_free(&base);
        return h3_err(H3_E_INVALID, "layout: %lld rows is more than this engine supports", (long long)seq);
    }
    rc = layout_alloc(out, seq, n_text, base.n_video + ref_v, base.n_audio + ref_a);
    double *grid = rc ? NULL : h3_malloc(sizeof(double) * (size_t)(4 * (max_side + 1)));
    if (!rc && !grid) {
        h3_dit_layout_free(out);
        rc = -H3_E_NOMEM;
    }
    if (rc) {
        h3_dit_layout_free(&base);
        return rc;
    }
    out->n_cond_video = ref_v;
    out->n_cond_audio = ref_a;
    out->lat_t = lat_t;
    out->lat_h = lat_h;
    out->lat_w = lat_w;
    out->audio_lat = audio_lat;
    for (int64_t i = 0; i < n_text; i++) {
        out->text_idx[i] = i;
        out->tags[i] = base.tags[i];
        out->role[i] = H3_ROLE_VIDEO;
        out->pos[i * 3] = (double)i;
    }
    h3_dit_layout_free(&base);

    /* The target's grid: a standalone audio reference is pinned to its width extremes. */
    double *thg = grid, *twg = thg + max_side, *hg = twg + max_side, *wg = hg + max_side;
    const int64_t tnh = lat_h / ph, tnw = lat_w / pw;
    const double tsq = sqrt((double)lat_h * (double)lat_w);
    spatial_grid(lat_h, ph, tsq, thg);
    spatial_grid(lat_w, pw, tsq, twg);

    /* References in request order on one rotary clock that starts where the text ends; every
       block advances it by the time it occupies. */
    int64_t cursor = n_text, nv = 0, na = 0;
    double clock = (double)n_text;
    for (int i = 0; i < n_refs; i++) {
        const h3_dit_ref *f = &refs[i];
        if (f->kind == H3_REF_AUDIO) {
            fill_audio(out, cursor, f->audio_lat, clock, twg[0], twg[tnw - 1], out->audio_idx + na,
                       H3_ROLE_COND_AUDIO);
            cursor += (int64_t)f->audio_lat * H3_STEREO;
            na += (int64_t)f->audio_lat * H3_STEREO;
            clock += (double)f->audio_lat;
            continue;
        }
        const int64_t nh = f->lat_h / ph, nw = f->lat_w / pw;
        const double sq = sqrt((double)f->lat_h * (double)f->lat_w);
        spatial_grid(f->lat_h, ph, sq, hg);
        spatial_grid(f->lat_w, pw, sq, wg);
        /* A video's soundtrack is packed right before its frames, from the same origin, on the
           video's own width extremes, as the generated audio and video are aligned. */
        if (f->audio_lat) {
            fill_audio(out, cursor, f->audio_lat, clock, wg[0], wg[nw - 1], out->audio_idx + na,
                       H3_ROLE_COND_AUDIO);
            cursor += (int64_t)f->audio_lat * H3_STEREO;
            na += (int64_t)f->audio_lat * H3_STEREO;
        }
        fill_video(out, cursor, f->lat_t, nh, nw, hg, wg, clock, out->video_idx + nv, H3_ROLE_COND_VIDEO);
        cursor += (int64_t)f->lat_t * nh * nw;
        nv += (int64_t)f->lat_t * nh * nw;
        if (f->kind == H3_REF_IMAGE) {
            clock += 1.0; /* an image takes one integer slot, not a latent frame's 5/3 */
        } else {
            /* Summed sequentially like diffusers' `sum(...)` here (not numpy's pairwise sum
               of the FL2VA last-frame anchor: the two differ in the last ulp from 16 frames). */
            double span = 0;
            for (int k = 0; k < f->lat_t; k++) span += ROPE_FRAME_RESCALE * k_frames_per_latent[k % 5];
            clock += (double)f->audio_lat > span ? (double)f->audio_lat : span;
        }
    }
    /* The generated rows: target audio, then target video, both from the final clock. */
    fill_audio(out, cursor, audio_lat, clock, twg[0], twg[tnw - 1], out->audio_idx + na, H3_ROLE_AUDIO);
    cursor += (int64_t)audio_lat * H3_STEREO;
    fill_video(out, cursor, lat_t, tnh, tnw, thg, twg, clock, out->video_idx + nv, H3_ROLE_VIDEO);
    free(grid);
    return 0;
}
