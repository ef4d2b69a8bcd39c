/*
 * Ref2VA references: request validation and the image reference's size rule, as diffusers'
 * MiniMaxH3Ref2VASetupStep (before_encoder.py) applies them. Kept out of pipeline.c, which only
 * asks whether a request is valid and, later, for the normalised references.
 */
#include "runtime/references.h"

#include "core/geometry.h"
#include "core/keyframe.h"
#include "core/schedule.h"
#include "models/dit.h"

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

int h3_ref_request_check(const h3_model *m, const h3_request *q)
{
    if (q->n_references == 0 && !q->references) return 0;
    if (q->n_references < 1 || q->n_references > H3_REF_MAX || !q->references)
        return h3_err(H3_E_INVALID, "references: %d given (1 to %d, with their array)", q->n_references, H3_REF_MAX);
    if (q->first_frame || q->last_frame || q->first_latent || q->last_latent)
        return h3_err(H3_E_INVALID, "references cannot be combined with a first or last frame (Ref2VA or FL2VA, "
                                    "not both)");
    int count[3] = {0, 0, 0};
    static const char *const names[3] = {"image", "video", "audio"};
    static const int limits[3] = {H3_REF_MAX_IMAGES, H3_REF_MAX_VIDEOS, H3_REF_MAX_AUDIOS};
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        if (f->kind < H3_REFERENCE_IMAGE || f->kind > H3_REFERENCE_AUDIO)
            return h3_err(H3_E_INVALID, "reference %d: kind %d (0 image, 1 video, 2 audio)", i + 1, f->kind);
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
            /* Hook: the audio VAE encoder (h3_aenc_*) and the video reference path plug in here. */
            return h3_err(H3_E_UNSUPPORTED, "%s: %s references are not supported by this build yet (image "
                                            "references are)", what, names[f->kind]);
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

int h3_ref_plan_images(h3_model *m, const h3_request *q, int C, int spatial, h3_ref_plan *p)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < q->n_references; i++) {
        const h3_reference *f = &q->references[i];
        if (f->kind != H3_REFERENCE_IMAGE) continue;
        const int k = p->n++;
        p->index[k] = i;
        int rc = h3_ref_model_image_size(m, f->width, f->height, &p->w[k], &p->h[k]);
        if (rc) {
            h3_err_prefix("reference %d", i + 1);
            return rc;
        }
        if (p->w[k] % spatial || p->h[k] % spatial)
            return h3_err(H3_E_FORMAT, "reference %d: size %dx%d is not a multiple of the VAE's %d pixels", i + 1,
                          p->w[k], p->h[k], spatial);
        p->lh[k] = p->h[k] / spatial;
        p->lw[k] = p->w[k] / spatial;
        const int64_t n = (int64_t)C * p->lh[k] * p->lw[k];
        p->off[k] = p->floats;
        p->floats += n;
        if (n > p->max_floats) p->max_floats = n;
    }
    return 0;
}

void h3_ref_pack(const h3_dit_cfg *dc, const h3_request *q, const h3_ref_plan *p, uint64_t seed, const float *cond,
                 float *scratch, float *rows)
{
    /* The same f32 arithmetic as the keyframes' (t z + (1 - t) eps, each product rounded): diffusers
       noises every visual condition with one scale_noise call, in packed order. */
    const float t = (float)H3_KEYFRAME_NOISE_AUG, u = 1.0f - t;
    int64_t at = 0;
    for (int k = 0; k < p->n; k++) {
        const h3_reference *f = &q->references[p->index[k]];
        const int64_t n = (int64_t)dc->video_ch * p->lh[k] * p->lw[k];
        if (f->noise)
            memcpy(scratch, f->noise, sizeof(float) * (size_t)n);
        else
            h3_noise(seed, H3_STREAM_COND + (uint32_t)k, 0, scratch, n);
        const float *z = cond + p->off[k];
        for (int64_t j = 0; j < n; j++) {
            const float a = t * z[j], b = u * scratch[j];
            scratch[j] = a + b;
        }
        h3_dit_patchify_video(dc, scratch, 1, p->lh[k], p->lw[k], rows + at);
        at += n; /* patchify permutes: a condition's rows hold exactly its latent's floats */
    }
}
