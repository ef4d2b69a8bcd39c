/* Public text-to-video+audio entry points (h3.h "Text to video + stereo audio") over the runtime. */
#include "api/api.h"
#include "core/keyframe.h"

#include <math.h>
#include <stddef.h>

/* The ranges of a request's numbers, checked at the API whatever the caller (a binding that stores a
   64-bit value into an int32 field has already wrapped it; these bounds keep what arrives within what
   the runtime's arithmetic was written for). Each message names the value and the allowed range. The
   model's own limits (max pixels, max frames, multiples, prompt tokens) are the runtime's checks. */
#define REQ_HAS(q, f) ((q)->struct_size >= offsetof(h3_request, f) + sizeof(q)->f)
#define H3_API_MAX_SIDE 16384
#define H3_API_MAX_FRAMES 100000

static int int_range(const char *name, int32_t v, int32_t lo, int32_t hi, const char *unit)
{
    if (v < lo || v > hi)
        return h3_err(H3_E_INVALID, "%s must be between %d and %d%s, got %d", name, lo, hi, unit, v);
    return 0;
}

static int request_ranges(const h3_request *q)
{
    if (!q) return h3_err(H3_E_INVALID, "NULL request");
    if (q->struct_size < offsetof(h3_request, seed) + sizeof q->seed || q->struct_size > sizeof *q)
        return h3_err(H3_E_INVALID, "h3_request.struct_size %u is not a size this library knows", q->struct_size);
    int rc;
    if ((rc = int_range("width", q->width, 0, H3_API_MAX_SIDE, " pixels (0 with a keyframe)")) ||
        (rc = int_range("height", q->height, 0, H3_API_MAX_SIDE, " pixels (0 with a keyframe)")) ||
        (rc = int_range("frames", q->frames, 1, H3_API_MAX_FRAMES, "")) ||
        (rc = int_range("steps", q->steps, 2, 1000, "")))
        return rc;
    if (REQ_HAS(q, vae_tile_px) && (rc = int_range("VAE tile", q->vae_tile_px, 0, 65536, " pixels (0 = the model's)")))
        return rc;
    if (REQ_HAS(q, reuse) && (rc = int_range("reuse", q->reuse, 0, 1000, " (0 = off)"))) return rc;
    if (REQ_HAS(q, core_reuse) && (rc = int_range("core reuse", q->core_reuse, 0, 1000, " (0 = off)"))) return rc;
    if (REQ_HAS(q, layers) && (rc = int_range("layers", q->layers, 0, 65536, " (0 = all)"))) return rc;
    if (REQ_HAS(q, layer_policy) && (rc = int_range("layer policy", q->layer_policy, 0, 1, ""))) return rc;
    if (REQ_HAS(q, token_reduction) && (rc = int_range("token reduction", q->token_reduction, 0, 1, "")))
        return rc;
    if (REQ_HAS(q, render_height) &&
        ((rc = int_range("render width", q->render_width, 0, H3_API_MAX_SIDE, " pixels (0 = the output's)")) ||
         (rc = int_range("render height", q->render_height, 0, H3_API_MAX_SIDE, " pixels (0 = the output's)"))))
        return rc;
    if (REQ_HAS(q, cache_threshold) && !(q->cache_threshold >= 0.0f && q->cache_threshold <= 100.0f))
        return h3_err(H3_E_INVALID, "cache threshold must be between 0 (off) and 100, got %g",
                      (double)q->cache_threshold);
    if (REQ_HAS(q, n_lora)) {
        if ((rc = int_range("LoRA file count", q->n_lora, 0, 64, ""))) return rc;
        for (int i = 0; q->lora_scales && i < q->n_lora; i++)
            if (!isfinite(q->lora_scales[i]) || fabsf(q->lora_scales[i]) > 1e6f)
                return h3_err(H3_E_INVALID, "LoRA %d: scale must be a finite number between -1e6 and 1e6, got %g",
                              i + 1, (double)q->lora_scales[i]);
    }
    if (REQ_HAS(q, last_height) &&
        ((q->first_frame && ((rc = int_range("first frame width", q->first_width, 1, 65536, " pixels")) ||
                             (rc = int_range("first frame height", q->first_height, 1, 65536, " pixels")))) ||
         (q->last_frame && ((rc = int_range("last frame width", q->last_width, 1, 65536, " pixels")) ||
                            (rc = int_range("last frame height", q->last_height, 1, 65536, " pixels"))))))
        return rc;
    if (REQ_HAS(q, n_references) && (rc = int_range("reference count", q->n_references, 0, 64, ""))) return rc;
    return 0;
}

H3_API int h3_request_default(h3_ctx *ctx, h3_request *r)
{
    return h3_rt_request_default(ctx ? &ctx->rt : NULL, r);
}

H3_API int h3_plan(h3_ctx *ctx, const h3_request *request, h3_render_info *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    int rc = request_ranges(request);
    if (rc) return rc;
    return h3_rt_plan(&ctx->rt, request, out);
}

H3_API int h3_schedule_declared(h3_ctx *ctx, const h3_request *request, char *name, int cap)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_schedule_declared(&ctx->rt, request, name, cap);
}

H3_API int h3_prepare(h3_ctx *ctx, const h3_request *request)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    int rc = request_ranges(request);
    if (rc) return rc;
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
