/* Public entry points of the audio encoder (h3.h "Audio encoder"). */
#include "api/api.h"
#include "models/audio_vae_encoder.h"

H3_API int h3_audio_encode_shape(h3_ctx *ctx, int64_t samples, int *C, int64_t *frames)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_aenc_cfg cfg;
    int rc = h3_aenc_cfg_load(&ctx->model, &cfg);
    if (rc) return rc;
    const int64_t T = h3_aenc_frames(&cfg, samples);
    if (T < 0) return (int)T;
    if (C) *C = cfg.av.latent_ch;
    if (frames) *frames = T;
    h3_err_clear();
    return 0;
}

H3_API int h3_audio_encode(h3_ctx *ctx, const float *pcm, int channels, int64_t samples, float *mean, int64_t cap)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    /* The encoder's Snake / head_pool ops exist on the CPU backend only (backend.h). */
    h3_backend *be;
    int rc = h3_rt_cpu_backend(&ctx->rt, &be);
    if (rc) return rc;
    rc = h3_aenc_run(&ctx->model, be, pcm, channels, samples, mean, cap, ctx->rt.progress, ctx->rt.progress_user);
    if (!rc) h3_err_clear();
    return rc;
}

H3_API int h3_audio_latent_rows(h3_ctx *ctx, const float *mean, int channels, int64_t frames, float *rows,
                                int64_t cap)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_aenc_cfg cfg;
    int rc = h3_aenc_cfg_load(&ctx->model, &cfg);
    if (rc) return rc;
    rc = h3_aenc_rows(&cfg, mean, channels, frames, rows, cap);
    if (!rc) h3_err_clear();
    return rc;
}
