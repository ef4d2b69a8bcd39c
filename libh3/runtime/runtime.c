/* The runtime's shared state: worker pool, backends and the transformer, created on first use. */
#include "runtime/runtime.h"

#include "backend/cpu/ops.h"
#include "core/tokenizer.h"
#include "models/dit.h"
#include "models/text_encoder.h"

#include <stdlib.h>

int h3_progress_check(h3_progress_fn fn, void *user, const char *phase, int done, int total)
{
    if (!fn || fn(user, phase, done, total) == 0) return 0;
    return h3_err(H3_E_CANCELLED, "%s: cancelled by the progress callback after %d of %d steps", phase, done,
                  total);
}

int h3_rt_progress(h3_runtime *rt, const char *phase, int done, int total)
{
    return h3_progress_check(rt->progress, rt->progress_user, phase, done, total);
}

h3_pool *h3_rt_pool(h3_runtime *rt)
{
    if (!rt->pool && !(rt->pool = h3_pool_create(rt->threads)))
        h3_err(H3_E_NOMEM, "cannot start %d worker threads", rt->threads);
    return rt->pool;
}

int h3_rt_dit_backend(h3_runtime *rt, h3_backend **out)
{
    if (rt->gpu) {
        *out = rt->gpu;
        return 0;
    }
    if (!rt->cpu) {
        h3_pool *pool = h3_rt_pool(rt);
        if (!pool) return -H3_E_NOMEM;
        int rc = h3_backend_cpu_create(pool, &rt->cpu);
        if (rc) return rc;
    }
    *out = rt->cpu;
    return 0;
}

int h3_rt_dit(h3_runtime *rt, h3_dit **out)
{
    if (!rt->dit) {
        h3_backend *be;
        h3_pool *pool = h3_rt_pool(rt);
        if (!pool) return -H3_E_NOMEM;
        int rc = h3_rt_dit_backend(rt, &be);
        if (!rc) rc = h3_dit_open(rt->model, pool, be, rt->flags, &rt->dit);
        if (rc) return rc;
    }
    *out = rt->dit;
    return 0;
}

void h3_rt_release_dit(h3_runtime *rt)
{
    h3_dit_close(rt->dit);
    rt->dit = NULL;
    h3_store_release(&rt->model->comp[H3_COMP_TRANSFORMER].store);
}

void h3_rt_free(h3_runtime *rt)
{
    h3_rt_render_free(rt); /* its latents live on the transformer's backend */
    h3_tokenizer_free(rt->tokenizer);
    h3_text_cache_free(rt->text_cache);
    h3_dit_close(rt->dit); /* before the model and the backends: it holds views and copies of both */
    h3_backend_destroy(rt->gpu);
    h3_backend_destroy(rt->cpu);
    h3_pool_destroy(rt->pool);
    rt->tokenizer = NULL;
    rt->text_cache = NULL;
    rt->dit = NULL;
    rt->gpu = rt->cpu = NULL;
    rt->pool = NULL;
}
