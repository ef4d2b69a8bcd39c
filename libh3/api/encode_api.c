/* Public entry points of the video encoder (h3.h "Video encoder"). */
#include "api/api.h"
#include "models/video_vae_encoder.h"

/* The posterior noise stream of h3_video_encode_condition when no eps is given (the stream the
   FL2VA pipeline samples keyframe posteriors from). */
#define COND_STREAM 16u

H3_API int h3_video_encode_shape(h3_ctx *ctx, int T, int H, int W, int tile_px, int overlap_px, uint32_t flags,
                                 int *C, int *latent_frames, int *h, int *w)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_venc_cfg cfg;
    int rc = h3_venc_cfg_load(&ctx->model, &cfg);
    if (rc) return rc;
    return h3_venc_shape(&cfg, T, H, W, tile_px, overlap_px, flags, C, latent_frames, h, w);
}

H3_API int h3_video_encode(h3_ctx *ctx, const float *pixels, int T, int H, int W, int tile_px, int overlap_px,
                           uint32_t flags, float *mean, float *logvar)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_backend *be;
    int rc = h3_rt_cpu_backend(&ctx->rt, &be);
    if (rc) return rc;
    h3_venc_request rq = {pixels, T, H, W, tile_px, overlap_px, flags, mean, logvar, ctx->rt.progress,
                          ctx->rt.progress_user};
    rc = h3_venc_run(&ctx->model, be, &rq);
    if (!rc) h3_err_clear();
    return rc;
}

H3_API int h3_video_encode_condition(h3_ctx *ctx, const uint8_t *rgb, int T, int H, int W, const float *eps,
                                     uint64_t seed, float *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_backend *be;
    int rc = h3_rt_cpu_backend(&ctx->rt, &be);
    if (rc) return rc;
    h3_venc_cond rq = {rgb, T, H, W, eps, seed, COND_STREAM, out, ctx->rt.progress, ctx->rt.progress_user};
    rc = h3_venc_condition(&ctx->model, be, &rq);
    if (!rc) h3_err_clear();
    return rc;
}
