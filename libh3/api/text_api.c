/* Public text-encoder and prompt-cache entry points (h3.h "Text encoder") over the runtime. */
#include "api/api.h"
#include "models/text_encoder.h"

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
