/* Public text-to-video+audio entry points (h3.h "Text to video + stereo audio") over the runtime. */
#include "api/api.h"
#include "core/keyframe.h"

H3_API int h3_request_default(h3_ctx *ctx, h3_request *r)
{
    return h3_rt_request_default(ctx ? &ctx->rt : NULL, r);
}

H3_API int h3_plan(h3_ctx *ctx, const h3_request *request, h3_render_info *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_plan(&ctx->rt, request, out);
}

H3_API int h3_prepare(h3_ctx *ctx, const h3_request *request)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_prepare(&ctx->rt, request);
}

H3_API int h3_step(h3_ctx *ctx)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_step(&ctx->rt);
}

H3_API int h3_render_info_get(h3_ctx *ctx, h3_render_info *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_render_info(&ctx->rt, out);
}

H3_API int h3_get_latents(h3_ctx *ctx, float *video, float *audio)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_get_latents(&ctx->rt, video, audio);
}

H3_API int h3_prompt_tokens(h3_ctx *ctx, int32_t *ids, int cap)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (cap < 0 || (cap > 0 && !ids)) return h3_err(H3_E_INVALID, "prompt tokens: bad buffer (%d ids)", cap);
    return h3_rt_prompt_tokens(&ctx->rt, ids, cap);
}

H3_API int h3_decode(h3_ctx *ctx, uint8_t *rgb, float *pcm)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_decode(&ctx->rt, rgb, NULL, pcm);
}

H3_API int h3_decode_video_f32(h3_ctx *ctx, float *pixels)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (!pixels) return h3_err(H3_E_INVALID, "decode: NULL pixel buffer");
    return h3_rt_decode(&ctx->rt, NULL, pixels, NULL);
}

H3_API int h3_keyframe_canvas(h3_ctx *ctx, int image_width, int image_height, int *width, int *height)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (!width || !height) return h3_err(H3_E_INVALID, "keyframe canvas: NULL output");
    return h3_rt_keyframe_canvas(&ctx->rt, image_width, image_height, width, height);
}

H3_API int h3_keyframe_resize(const uint8_t *rgb, int width, int height, int out_width, int out_height, int cover,
                              uint8_t *out)
{
    if (!rgb || !out) return h3_err(H3_E_INVALID, "keyframe resize: NULL image");
    int rc = h3_keyframe_check(width, height, "keyframe");
    if (rc) return rc;
    if (out_width < 1 || out_height < 1 || (int64_t)out_width * out_height > H3_KEYFRAME_MAX_PIXELS)
        return h3_err(H3_E_INVALID, "keyframe resize: output size %dx%d", out_width, out_height);
    /* Serial: a parity entry point, with no context to lend it workers. */
    return h3_keyframe_place(NULL, rgb, width, height, out_width, out_height, cover != 0, out);
}
