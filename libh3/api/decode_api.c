/* Public entry points of the two decoders (h3.h "Video decoder", "Audio decoder"). */
#include "api/api.h"
#include "models/audio_vae.h"
#include "models/video_vae.h"

#include <string.h>

H3_API void h3_video_decode_opts_default(h3_video_decode_opts *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

static int read_opts(const h3_video_decode_opts *in, h3_video_decode_opts *o)
{
    h3_video_decode_opts_default(o);
    if (!in) return 0;
    if (in->struct_size < offsetof(h3_video_decode_opts, flags) + sizeof o->flags || in->struct_size > sizeof *o)
        return h3_err(H3_E_INVALID, "h3_video_decode_opts.struct_size %u is not a size this library knows",
                      in->struct_size);
    memcpy(o, in, in->struct_size);
    if (o->flags & ~(H3_VIDEO_RAW | H3_VIDEO_UNTILED))
        return h3_err(H3_E_INVALID, "video decode: unknown flags 0x%x", o->flags);
    return 0;
}

H3_API int h3_video_decode_shape(h3_ctx *ctx, int T, int h, int w, int *frames, int *height, int *width)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_vvae_cfg cfg;
    h3_vvae_plan p;
    int rc = h3_vvae_cfg_load(&ctx->model, &cfg);
    if (rc || (rc = h3_vvae_plan_make(&cfg, T, h, w, 0, 0, H3_VVAE_UNTILED, &p))) return rc;
    if (frames) *frames = p.frames;
    if (height) *height = p.height;
    if (width) *width = p.width;
    h3_vvae_plan_free(&p);
    return 0;
}

H3_API int64_t h3_video_decode_workspace(h3_ctx *ctx, int T, int h, int w, const h3_video_decode_opts *opts)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_video_decode_opts o;
    h3_vvae_cfg cfg;
    h3_vvae_plan p;
    h3_backend *be;
    int rc;
    if ((rc = read_opts(opts, &o)) || (rc = h3_vvae_cfg_load(&ctx->model, &cfg)) ||
        (rc = h3_rt_stage_backend(&ctx->rt, &be)) ||
        (rc = h3_vvae_plan_make(&cfg, T, h, w, o.tile_px, o.overlap_px, o.flags, &p)))
        return rc;
    h3_vvae_plan_for_backend(&cfg, be, &p); /* the decode that would run on this context */
    int64_t bytes = (int64_t)p.workspace_bytes;
    h3_vvae_plan_free(&p);
    return bytes;
}

H3_API int h3_video_decode(h3_ctx *ctx, const float *latents, int C, int T, int h, int w,
                           const h3_video_decode_opts *opts, uint8_t *rgb, float *pixels)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_video_decode_opts o;
    int rc = read_opts(opts, &o);
    if (rc) return rc;
    h3_backend *be;
    if ((rc = h3_rt_stage_backend(&ctx->rt, &be))) return rc;
    /* No hook in the options: the context's (h3_set_progress), as every other stage reports. */
    h3_vvae_request rq = {latents, C, T, h, w, o.tile_px, o.overlap_px, o.flags, rgb, pixels,
                          o.progress ? o.progress : ctx->rt.progress, o.progress ? o.user : ctx->rt.progress_user,
                          &ctx->rt.vvae_keep,
                          h3_rt_video_decoder_precision(&ctx->rt)};
    rc = h3_vvae_run(&ctx->model, be, &rq);
    if (!rc) h3_err_clear();
    return rc;
}

H3_API int h3_audio_info(h3_ctx *ctx, int *latent_channels, int *sample_rate, int *hop)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_avae_cfg c;
    int rc = h3_avae_cfg_load(&ctx->model, &c);
    if (rc) return rc;
    int64_t u = 1;
    for (int i = 0; i < c.n_up; i++) u *= c.rates[i];
    if (latent_channels) *latent_channels = c.latent_ch;
    if (sample_rate) *sample_rate = c.sample_rate;
    if (hop) *hop = (int)u;
    return 0;
}

H3_API int64_t h3_audio_samples(h3_ctx *ctx, int latent_frames)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_avae_cfg c;
    int rc = h3_avae_cfg_load(&ctx->model, &c);
    if (rc) return rc;
    if ((rc = h3_avae_check_geometry(&c, ctx->model.comp[H3_COMP_AUDIO_VAE].config_path))) return rc;
    return h3_avae_samples(&c, latent_frames);
}

H3_API int h3_audio_decode(h3_ctx *ctx, const float *latents, int channels, int latent_frames, float *pcm,
                           int64_t pcm_capacity, h3_progress_fn progress, void *user)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_backend *be;
    int rc = h3_rt_stage_backend(&ctx->rt, &be);
    if (rc) return rc;
    return h3_avae_run_keep(&ctx->model, be, latents, channels, latent_frames, pcm, pcm_capacity, progress, user,
                            &ctx->rt.avae_keep);
}
