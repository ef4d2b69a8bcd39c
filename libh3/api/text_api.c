/* Public text-encoder and prompt-cache entry points (h3.h "Text encoder") over the runtime. */
#include "api/api.h"
#include "core/image_proc.h"
#include "models/text_encoder.h"

#include <string.h>

H3_API int h3_text_hidden_size(h3_ctx *ctx)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_text_cfg c;
    int rc = h3_text_cfg_load(&ctx->model, &c);
    return rc ? rc : c.hidden;
}

H3_API int h3_text_encode(h3_ctx *ctx, const int32_t *ids, int n, float *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_text_encode(&ctx->rt, ids, n, out);
}

H3_API int h3_text_cache_stats_get(h3_ctx *ctx, h3_text_cache_stats *out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_text_cache_stats(&ctx->rt, out);
}

H3_API int h3_text_cache_set_budget(h3_ctx *ctx, uint64_t bytes)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_text_cache_set_budget(&ctx->rt, bytes);
}

H3_API void h3_text_cache_clear(h3_ctx *ctx)
{
    if (ctx) h3_rt_text_cache_clear(&ctx->rt);
}

/* ---- keyframe conditioning (FL2VA) ---------------------------------------------------------------- */

H3_API int h3_text_image_rows(h3_ctx *ctx, const char *prompt, int n_images, const int *widths, const int *heights)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_text_image_rows(&ctx->rt, prompt, n_images, widths, heights);
}

H3_API int h3_text_encode_images(h3_ctx *ctx, const char *prompt, int n_images, const uint8_t *const *rgb,
                                 const int *widths, const int *heights, float *out, int cap_rows, int32_t *ids_out,
                                 uint8_t *tags_out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (!out) return h3_err(H3_E_INVALID, "text encoder: NULL output");
    /* The row count first (cheap), so a short buffer fails before anything is encoded. */
    int n = h3_rt_text_image_rows(&ctx->rt, prompt, n_images, widths, heights);
    if (n < 0) return n;
    if (cap_rows < n)
        return h3_err(H3_E_INVALID, "text encoder: the presentation has %d rows, the output holds %d", n, cap_rows);
    h3_text_rows r;
    int rc = h3_rt_text_encode_images(&ctx->rt, prompt, n_images, rgb, widths, heights, &r);
    if (rc) return rc;
    memcpy(out, r.rows, sizeof(float) * (size_t)r.n * (size_t)r.hidden);
    if (ids_out) memcpy(ids_out, r.ids, sizeof(int32_t) * (size_t)r.n);
    if (tags_out) memcpy(tags_out, r.tags, (size_t)r.n);
    n = r.n;
    h3_text_rows_free(&r);
    return n;
}

H3_API int64_t h3_image_preprocess(h3_ctx *ctx, const uint8_t *rgb, int width, int height, float *out, int64_t cap,
                                   int32_t *grid_thw, int32_t *patch_dim)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_image_proc_cfg c;
    int grid[3], dim;
    int rc = h3_image_proc_cfg_load(&ctx->model, &c);
    if (rc || (rc = h3_image_grid(&c, width, height, grid, &dim))) return rc;
    const int64_t total = (int64_t)grid[1] * grid[2] * dim;
    if (grid_thw) grid_thw[0] = grid[0], grid_thw[1] = grid[1], grid_thw[2] = grid[2];
    if (patch_dim) *patch_dim = dim;
    if (out && cap >= total && (rc = h3_image_pixels(&c, rgb, width, height, out))) return rc;
    return total;
}
