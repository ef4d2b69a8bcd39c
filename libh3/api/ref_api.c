/* Public Ref2VA entry points (h3.h "References (Ref2VA)"): thin checks around the layout of
   models/dit_layout.c, so tests can hold it against diffusers' function directly. */
#include "api/api.h"
#include "models/dit.h"
#include "models/video_vae.h"
#include "runtime/references.h"

#include <string.h>

H3_API int64_t h3_dit_ref2va_layout(h3_ctx *ctx, int64_t n_text, const uint8_t *text_tags, const int32_t *refs,
                                    int n_refs, int latent_frames, int latent_height, int latent_width,
                                    int audio_latents, double *position_ids, int64_t *token_tags,
                                    int64_t *text_indices, int64_t *video_indices, int64_t *audio_indices,
                                    uint8_t *roles, int64_t *n_condition)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (n_refs < 1 || n_refs > H3_REF_MAX || !refs)
        return h3_err(H3_E_INVALID, "layout: ref2va needs 1 to %d references, got %d", H3_REF_MAX, n_refs);
    h3_dit_cfg c;
    int rc = h3_dit_cfg_load(&ctx->model, &c);
    if (rc) return rc;
    h3_dit_ref rf[H3_REF_MAX];
    for (int i = 0; i < n_refs; i++)
        rf[i] = (h3_dit_ref){.kind = refs[i * 5], .lat_t = refs[i * 5 + 1], .lat_h = refs[i * 5 + 2],
                             .lat_w = refs[i * 5 + 3], .audio_lat = refs[i * 5 + 4]};
    h3_dit_layout l;
    rc = h3_dit_layout_ref2va(&c, n_text, text_tags, rf, n_refs, latent_frames, latent_height, latent_width,
                              audio_latents, &l);
    if (rc) return rc;
    return h3_dit_layout_export(&l, position_ids, token_tags, text_indices, video_indices, audio_indices, roles,
                                n_condition);
}

H3_API int h3_reference_size(h3_ctx *ctx, int image_width, int image_height, int *width, int *height)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (!width || !height) return h3_err(H3_E_INVALID, "reference size: NULL output");
    return h3_ref_model_image_size(&ctx->model, image_width, image_height, width, height);
}

H3_API int h3_reference_video_size(h3_ctx *ctx, int video_width, int video_height, int frames, double fps,
                                   int render_frames, int *width, int *height, int *frames_24, int *latent_frames)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (render_frames < 1) return h3_err(H3_E_INVALID, "reference video size: render of %d frames", render_frames);
    /* One synthetic request through the plan the render uses (no pixels are read). */
    static const uint8_t pixel[3];
    h3_reference f;
    memset(&f, 0, sizeof f);
    f.kind = H3_REFERENCE_VIDEO;
    f.rgb = pixel;
    f.width = video_width;
    f.height = video_height;
    f.frames = frames;
    f.fps = fps;
    h3_request q;
    memset(&q, 0, sizeof q);
    q.references = &f;
    q.n_references = 1;
    h3_model *m = &ctx->model;
    h3_vvae_cfg vc;
    int rc = h3_ref_request_check(m, &q);
    if (!rc) rc = h3_vvae_cfg_load(m, &vc);
    h3_ref_plan p;
    if (!rc) rc = h3_ref_plan_images(m, &q, render_frames, vc.latent_ch, vc.spatial, &p);
    if (rc) return rc;
    if (width) *width = p.w[0];
    if (height) *height = p.h[0];
    if (frames_24) *frames_24 = p.frames[0];
    if (latent_frames) *latent_frames = p.lt[0];
    return 0;
}
