/*
 * Ref2VA references: request validation, the image reference's size rule, the video reference's
 * resample / canvas / chunk plan and the audio reference's (and soundtrack's) truncation and
 * encoding, as diffusers' MiniMaxH3Ref2VASetupStep (before_encoder.py) and its reference encode
 * step apply them. Kept out of pipeline.c, which only asks whether a
 * request is valid and, later, for the normalised references.
 */
#include "runtime/references.h"

#include "core/audio_resample.h"
#include "core/geometry.h"
#include "core/keyframe.h"
#include "core/schedule.h"
#include "models/audio_vae_encoder.h"
#include "models/dit.h"
#include "models/video_vae_encoder.h"
#include "models/vision_tower.h"

#include <stdlib.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int h3_ref_image_size(int width, int height, int short_edge, int multiple, int *out_width, int *out_height)
{
    if (width < 1 || height < 1 || short_edge < 1 || multiple < 1 || !out_width || !out_height)
        return h3_err(H3_E_INVALID, "reference image: bad size %dx%d (short edge %d, multiple %d)", width, height,
                      short_edge, multiple);
    /* Python: scale = edge / min(w, h); round(h * scale / multiple) — each operation one double
       rounding, and rint() under the default mode is Python's round-half-to-even. */
    const double scale = (double)short_edge / (double)(width < height ? width : height);
    const double w = rint((double)width * scale / (double)multiple) * multiple;
    const double h = rint((double)height * scale / (double)multiple) * multiple;
    if (w > 1e6 || h > 1e6) return h3_err(H3_E_INVALID, "reference image: %dx%d scales past 1e6 pixels", width, height);
    *out_width = w < multiple ? multiple : (int)w;
    *out_height = h < multiple ? multiple : (int)h;
    return 0;
}

const float *h3_ref_noise(const h3_request *q, int i)
{
    const h3_parity *p = q->parity;
    return p && p->reference_noise && i >= 0 && i < q->n_references ? p->reference_noise[i] : NULL;
}

const float *h3_ref_posterior_noise(const h3_request *q, int i)
{
    const h3_parity *p = q->parity;
    return p && p->reference_posterior_noise && i >= 0 && i < q->n_references ? p->reference_posterior_noise[i]
                                                                                : NULL;
}

int h3_ref_request_check(const h3_model *m, const h3_request *q)
{
    const h3_parity *inj = q->parity;
    if (!q->n_references && inj && (inj->reference_noise || inj->reference_posterior_noise))
        return h3_err(H3_E_INVALID, "reference noise injected into a request without references");
    if (q->n_references == 0 && !q->references) return 0;
    if (q->n_references < 1 || q->n_references > H3_REF_MAX || !q->references)
        return h3_err(H3_E_INVALID, "references: %d given (1 to %d, with their array)", q->n_references, H3_REF_MAX);
    if (q->first_frame || q->last_frame || (inj && (inj->first_latent || inj->last_latent)))
        return h3_err(H3_E_INVALID, "references cannot be combined with a first or last frame (Ref2VA or FL2VA, "
                                    "not both)");
    int count[3] = {0, 0, 0};
    static const char *const names[3] = {"image", "video", "audio"};
    static const int limits[3] = {H3_REF_MAX_IMAGES, H3_REF_MAX_VIDEOS, H3_REF_MAX_AUDIOS};
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        if (f->kind < H3_REFERENCE_IMAGE || f->kind > H3_REFERENCE_AUDIO)
            return h3_err(H3_E_INVALID, "reference %d: kind %d (0 image, 1 video, 2 audio)", i + 1, f->kind);
        if (f->kind == H3_REFERENCE_AUDIO && (h3_ref_noise(q, i) || h3_ref_posterior_noise(q, i)))
            return h3_err(H3_E_INVALID, "reference %d is audio, which is never noised (no noise to inject)", i + 1);
        if (++count[f->kind] > limits[f->kind])
            return h3_err(H3_E_INVALID, "references: at most %d %s references, got more", limits[f->kind],
                          names[f->kind]);
    }
    if (count[H3_REFERENCE_AUDIO] == q->n_references)
        return h3_err(H3_E_INVALID, "references: an audio reference needs at least one image or video reference "
                                    "beside it");
    /* Only the Ref2VA partition's transformer was trained on this layout. */
    if (!m->partition || strcmp(m->partition, "Ref2VA") != 0)
        return h3_err(H3_E_INVALID, "%s: references need the Ref2VA partition (%s)", m->root ? m->root : "model",
                      m->has_ref2va ? "open the model with the Ref2VA option" : "this model has no Ref2VA/ folder");
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        char what[48];
        snprintf(what, sizeof what, "reference %d (%s)", i + 1, names[f->kind]);
        if (f->kind == H3_REFERENCE_IMAGE) {
            if (!f->rgb) return h3_err(H3_E_INVALID, "%s: no pixels", what);
            int rc = h3_keyframe_check(f->width, f->height, what);
            if (rc) return rc;
        } else {
            if (f->kind == H3_REFERENCE_VIDEO) {
                if (!f->rgb) return h3_err(H3_E_INVALID, "%s: no frames (rgb is NULL)", what);
                if (f->frames < 1) return h3_err(H3_E_INVALID, "%s: %d frames (at least 1)", what, f->frames);
                if (!(f->fps > 0) || !isfinite(f->fps) || f->fps > 1e4)
                    return h3_err(H3_E_INVALID, "%s: frame rate %g (a positive number of frames per second)", what,
                                  f->fps);
                int rc = h3_keyframe_check(f->width, f->height, what);
                if (rc) return rc;
                if ((double)f->frames * f->width * f->height * 3 > 0x1p38)
                    return h3_err(H3_E_INVALID, "%s: %d frames of %dx%d is too much video (at most 256 GiB of RGB)",
                                  what, f->frames, f->width, f->height);
                if (!f->pcm) continue; /* a silent video */
            } else if (!f->pcm) {
                return h3_err(H3_E_INVALID, "%s: no samples (pcm is NULL)", what);
            }
            if (f->samples < 1 || f->samples > ((int64_t)1 << 40))
                return h3_err(H3_E_INVALID, "%s: %lld samples per channel (at least 1)", what, (long long)f->samples);
            if (f->channels != 1 && f->channels != 2)
                return h3_err(H3_E_INVALID, "%s: %d channels (1 mono or 2 stereo)", what, f->channels);
            if (f->sample_rate < 1)
                return h3_err(H3_E_INVALID, "%s: sample rate %d Hz (give the rate the samples are at)", what,
                              f->sample_rate);
        }
    }
    return 0;
}

int h3_ref_model_image_size(h3_model *m, int width, int height, int *out_width, int *out_height)
{
    int rc = h3_keyframe_check(width, height, "reference image");
    if (rc) return rc;
    h3_geom_cfg gc;
    h3_geom_cfg_of_model(m, &gc);
    h3_canvas_rule cr;
    h3_geom_canvas_rule(m, &gc, &cr);
    return h3_ref_image_size(width, height, h3_geom_ref_image_edge(m, &cr), cr.multiple, out_width, out_height);
}

int64_t h3_ref_video_source(int src_frames, double fps, int *map, int64_t cap)
{
    if (src_frames < 1 || !(fps > 0)) return h3_err(H3_E_INVALID, "video reference: %d frames at %g fps", src_frames, fps);
    if (fps == (double)H3_FPS) {
        for (int64_t j = 0; map && j < src_frames && j < cap; j++) map[j] = (int)j;
        return src_frames;
    }
    /* Python: slots = floor(arange(n) * scale + 0.5), each product and sum one double rounding
       (no contraction: -ffp-contract=off); frame i repeated slots[i + 1] - slots[i] times. */
    const double scale = (double)H3_FPS / fps;
    int64_t j = 0;
    for (int i = 0; map && i < src_frames && j < cap; i++) {
        const double next = floor((double)(i + 1) * scale + 0.5);
        for (; (double)j < next && j < cap; j++) map[j] = i;
    }
    /* the count is the last slot, floor(n * scale + 0.5); a very low rate is capped, not looped over */
    const double total = floor((double)src_frames * scale + 0.5);
    return total > 0x1p62 ? (int64_t)1 << 62 : (int64_t)total;
}

int h3_ref_plan_images(h3_model *m, const h3_request *q, int frames, int C, int spatial, h3_ref_plan *p)
{
    memset(p, 0, sizeof *p);
    int rc = 0;
    bool video_cfgs = false;
    h3_venc_cfg vc;
    h3_vision_cfg vis;
    h3_canvas_rule cr;
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        if (f->kind == H3_REFERENCE_AUDIO) continue;
        const int k = p->n++;
        p->index[k] = i;
        p->lt[k] = 1;
        if (f->kind == H3_REFERENCE_IMAGE) {
            rc = h3_ref_model_image_size(m, f->width, f->height, &p->w[k], &p->h[k]);
        } else {
            if (!video_cfgs) {
                h3_geom_cfg gc;
                h3_geom_cfg_of_model(m, &gc);
                h3_geom_canvas_rule(m, &gc, &cr);
                if ((rc = h3_model_require(m, H3_COMP_VIDEO_VAE, "encoding video references")) ||
                    (rc = h3_model_headers(m, H3_COMP_VIDEO_VAE)) || (rc = h3_venc_cfg_load(m, &vc)) ||
                    (rc = h3_model_headers(m, H3_COMP_TEXT_ENCODER)) || (rc = h3_vision_cfg_load(m, &vis)))
                    return rc;
                video_cfgs = true;
            }
            /* diffusers' setup step: onto 24 fps, truncated to the render's frames, on the canvas of
               its own aspect. */
            const int64_t n24 = h3_ref_video_source(f->frames, f->fps, NULL, 0);
            if (n24 < 0) return (int)n24;
            p->frames[k] = (int)(n24 < frames ? n24 : frames);
            if ((rc = h3_canvas_resolve(&cr, f->width, f->height, &p->w[k], &p->h[k]))) {
                h3_err_prefix("reference %d (video)", i + 1);
                return rc;
            }
            /* The text encoder reads it at 2 fps in groups of the temporal patch: too short a video
               is refused there (diffusers raises the same before anything is encoded). */
            int idx[H3_VL_MAX_SAMPLED];
            const int ns = h3_vl_video_sample(p->frames[k], idx, H3_VL_MAX_SAMPLED);
            if (ns < 0) return ns;
            if (ns < vis.temporal_patch) {
                const int need = (int)nearbyint((vis.temporal_patch - 1) * (H3_FPS / H3_VL_VIDEO_SAMPLE_FPS)) + 1;
                return h3_err(H3_E_INVALID, "reference %d (video): %d frames at %d fps (%d frames at %g fps); the "
                              "text encoder reads a video at %g fps in groups of %d, so it needs at least %d frames "
                              "at %d fps", i + 1, p->frames[k], H3_FPS, f->frames, f->fps, H3_VL_VIDEO_SAMPLE_FPS,
                              vis.temporal_patch, need, H3_FPS);
            }
            /* The reference encoder snaps the count down to clip * n + tokens_chunk_size (17n + 5),
               so the VAE runs on whole chunks; a shorter video keeps all its frames. */
            const int per_clip = (vc.clip_length + vc.temporal - 1) / vc.temporal;
            int n = (p->frames[k] - per_clip) / vc.clip_length;
            n = (n < 1 ? 1 : n) * vc.clip_length + per_clip;
            p->enc_frames[k] = p->frames[k] < n ? p->frames[k] : n;
            int ec, eh, ew;
            if ((rc = h3_venc_shape(&vc, p->enc_frames[k], p->h[k], p->w[k], 0, 0, 0, &ec, &p->lt[k], &eh, &ew))) {
                h3_err_prefix("reference %d (video)", i + 1);
                return rc;
            }
            if (ec != C || eh * spatial != p->h[k] || ew * spatial != p->w[k])
                return h3_err(H3_E_FORMAT, "reference %d (video): the video VAE encodes %dx%d into %dx%dx%d latents, "
                              "the transformer expects %d channels per %d pixels", i + 1, p->w[k], p->h[k], ec, eh,
                              ew, C, spatial);
        }
        if (rc) {
            h3_err_prefix("reference %d", i + 1);
            return rc;
        }
        if (p->w[k] % spatial || p->h[k] % spatial)
            return h3_err(H3_E_FORMAT, "reference %d: size %dx%d is not a multiple of the VAE's %d pixels", i + 1,
                          p->w[k], p->h[k], spatial);
        p->lh[k] = p->h[k] / spatial;
        p->lw[k] = p->w[k] / spatial;
        const int64_t n = (int64_t)C * p->lt[k] * p->lh[k] * p->lw[k];
        p->off[k] = p->floats;
        p->floats += n;
        if (n > p->max_floats) p->max_floats = n;
    }
    return 0;
}

int h3_ref_video_pixels(h3_pool *pool, const h3_request *q, const h3_ref_plan *p, int k, int n, bool sampled,
                        uint8_t *out)
{
    const h3_reference *f = &q->references[p->index[k]];
    if (sampled) n = p->frames[k];
    if (n < 1 || n > p->frames[k])
        return h3_err(H3_E_INVALID, "reference %d (video): %d frames asked of %d", p->index[k] + 1, n, p->frames[k]);
    int *map = h3_malloc(sizeof(int) * (size_t)n);
    int *want = h3_calloc((size_t)n, sizeof(int)); /* the frames to fill */
    int rc = map && want ? 0 : -H3_E_NOMEM;
    if (!rc) {
        const int64_t got = h3_ref_video_source(f->frames, f->fps, map, n);
        if (got < 0) rc = (int)got;
    }
    if (!rc && sampled) {
        int idx[H3_VL_MAX_SAMPLED];
        const int ns = h3_vl_video_sample(n, idx, H3_VL_MAX_SAMPLED);
        if (ns < 0) rc = ns;
        for (int i = 0; i < ns; i++) want[idx[i]] = 1;
    } else if (!rc) {
        for (int j = 0; j < n; j++) want[j] = 1;
    }
    const size_t src = (size_t)f->width * (size_t)f->height * 3, dst = (size_t)p->w[k] * (size_t)p->h[k] * 3;
    int last = -1; /* the output frame holding the last resize, and its source frame */
    for (int j = 0; j < n && !rc; j++) {
        if (!want[j]) continue;
        /* a duplicated frame is the same resize: copied */
        if (last >= 0 && map[j] == map[last])
            memcpy(out + (size_t)j * dst, out + (size_t)last * dst, dst);
        else
            rc = h3_keyframe_place(pool, f->rgb + (size_t)map[j] * src, f->width, f->height, p->w[k], p->h[k], 0,
                                   out + (size_t)j * dst);
        last = j;
    }
    free(map);
    free(want);
    if (rc) h3_err_prefix("reference %d (video)", p->index[k] + 1);
    return rc;
}

void h3_ref_pack(const h3_dit_cfg *dc, const h3_request *q, const h3_ref_plan *p, uint64_t seed, const float *cond,
                 float *scratch, float *rows)
{
    /* The same f32 arithmetic as the keyframes' (t z + (1 - t) eps, each product rounded): diffusers
       noises every visual condition with one scale_noise call, in packed order. */
    const float t = (float)H3_KEYFRAME_NOISE_AUG, u = 1.0f - t;
    int64_t at = 0;
    for (int k = 0; k < p->n; k++) {
        const int64_t n = (int64_t)dc->video_ch * p->lt[k] * p->lh[k] * p->lw[k];
        const float *eps = h3_ref_noise(q, p->index[k]);
        if (eps)
            memcpy(scratch, eps, sizeof(float) * (size_t)n);
        else
            h3_noise(seed, H3_STREAM_COND + (uint32_t)k, 0, scratch, n);
        const float *z = cond + p->off[k];
        for (int64_t j = 0; j < n; j++) {
            const float a = t * z[j], b = u * scratch[j];
            scratch[j] = a + b;
        }
        h3_dit_patchify_video(dc, scratch, p->lt[k], p->lh[k], p->lw[k], rows + at);
        at += n; /* patchify permutes: a condition's rows hold exactly its latent's floats */
    }
}

int h3_ref_plan_audio(h3_model *m, const h3_request *q, int frames, h3_ref_plan *p)
{
    p->n_audio = 0;
    p->a_floats = 0;
    memset(p->audio_before, 0, sizeof p->audio_before);
    int images = 0, rc;
    h3_aenc_cfg cfg;
    bool loaded = false;
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        /* A video's soundtrack is planned as an audio reference, its label before the video's. */
        const bool visual = f->kind != H3_REFERENCE_AUDIO;
        if (!f->pcm) {
            images += visual;
            continue;
        }
        if (!loaded) {
            if ((rc = h3_model_require(m, H3_COMP_AUDIO_VAE, "encoding audio references")) ||
                (rc = h3_aenc_cfg_load(m, &cfg)))
                return rc;
            loaded = true;
        }
        const int rate = cfg.av.sample_rate;
        /* Python: waveform[:, : int(num_frames / fps * sample_rate)], both divisions in doubles, at the
           clip's own rate; diffusers resamples the kept head afterwards, once (torchaudio). */
        const int64_t keep = (int64_t)((double)frames / (double)H3_FPS * (double)f->sample_rate);
        const int k = p->n_audio++;
        p->aindex[k] = i;
        p->a_source[k] = f->samples < keep ? f->samples : keep;
        if (p->a_source[k] < 1)
            return h3_err(H3_E_INVALID, "reference %d (audio): no samples left after the truncation to %d frames",
                          i + 1, frames);
        p->a_samples[k] = h3_audio_resample_length(f->sample_rate, rate, p->a_source[k]);
        if (p->a_samples[k] < 0) {
            h3_err_prefix("reference %d (audio)", i + 1);
            return (int)p->a_samples[k];
        }
        const int64_t lat = h3_aenc_frames(&cfg, p->a_samples[k]);
        if (lat < 0) return (int)lat;
        if (lat < 1 || lat > 10000000)
            return h3_err(H3_E_INVALID, "reference %d (audio): %lld samples give %lld latents", i + 1,
                          (long long)p->a_samples[k], (long long)lat);
        p->a_lat[k] = (int)lat;
        p->a_off[k] = p->a_floats;
        p->a_floats += (int64_t)H3_STEREO * lat * cfg.av.latent_ch;
        p->audio_before[images]++;
        images += visual;
    }
    return 0;
}

int h3_ref_encode_audio(h3_model *m, h3_backend *be, const h3_request *q, const h3_ref_plan *p, float *rows,
                        h3_progress_fn progress, void *user)
{
    if (!p->n_audio) return 0;
    h3_aenc_cfg cfg;
    int rc = h3_aenc_cfg_load(m, &cfg);
    if (rc) return rc;
    for (int k = 0; k < p->n_audio && !rc; k++) {
        const h3_reference *f = &q->references[p->aindex[k]];
        const int64_t src = p->a_source[k], n = p->a_samples[k], lat = p->a_lat[k];
        const int64_t nmean = (int64_t)H3_STEREO * cfg.av.latent_ch * lat;
        /* pcm is planar [channels][samples]; the kept head of each channel, a mono one twice
           (diffusers' expand(2, -1)), then resampled to the VAE's rate (a copy at that rate). */
        float *head = h3_malloc(sizeof(float) * (size_t)(H3_STEREO * src));
        float *pcm = h3_malloc(sizeof(float) * (size_t)(H3_STEREO * n));
        float *mean = h3_malloc(sizeof(float) * (size_t)nmean);
        if (!head || !pcm || !mean) {
            rc = -H3_E_NOMEM;
        } else {
            for (int ch = 0; ch < H3_STEREO; ch++)
                memcpy(head + ch * src, f->pcm + (f->channels == 2 ? ch : 0) * f->samples,
                       sizeof(float) * (size_t)src);
            rc = h3_audio_resample_planar(head, H3_STEREO, src, f->sample_rate, cfg.av.sample_rate, pcm);
            if (!rc) rc = h3_aenc_run(m, be, pcm, H3_STEREO, n, mean, nmean, progress, user);
            if (!rc) rc = h3_aenc_rows(&cfg, mean, H3_STEREO, lat, rows + p->a_off[k], nmean);
        }
        free(head);
        free(pcm);
        free(mean);
        if (rc) h3_err_prefix("reference %d (audio)", p->aindex[k] + 1);
    }
    return rc;
}
