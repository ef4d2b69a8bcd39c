/* The runtime's shared state: worker pool, backends and the transformer, created on first use. */
#include "runtime/runtime.h"
#include "backend/comm.h"

#include "backend/cpu/ops.h"
#include "core/tokenizer.h"
#include "models/dit.h"
#include "models/dit_fp8file.h"
#include "models/audio_vae.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__APPLE__)
#define RT_MTIME(st) (st).st_mtimespec
#else
#define RT_MTIME(st) (st).st_mtim
#endif

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

int h3_rt_cpu_backend(h3_runtime *rt, h3_backend **out)
{
    if (!rt->cpu) {
        h3_pool *pool = h3_rt_pool(rt);
        if (!pool) return -H3_E_NOMEM;
        int rc = h3_backend_cpu_create(pool, &rt->cpu);
        if (rc) return rc;
    }
    *out = rt->cpu;
    return 0;
}

int h3_rt_stage_backend(h3_runtime *rt, h3_backend **out)
{
    /* The stages follow the device unless H3_OPT_STAGES_CPU keeps them on their exact f32 path. */
    if (rt->gpu && !(rt->flags & H3_OPT_STAGES_CPU)) {
        *out = rt->gpu;
        return 0;
    }
    return h3_rt_cpu_backend(rt, out);
}

int h3_rt_dit_backend(h3_runtime *rt, h3_backend **out)
{
    if (rt->gpu) {
        *out = rt->gpu;
        return 0;
    }
    return h3_rt_cpu_backend(rt, out);
}

/* The context's own settings of a transformer open, over the caller's (LoRA, lazy blocks). */
static h3_dit_open_opts dit_opts(const h3_runtime *rt, const h3_dit_open_opts *given)
{
    h3_dit_open_opts o = {0};
    if (given) o = *given;
    o.precision = rt->precision;
    o.vram_bytes = rt->vram_bytes;
    o.fp8file = rt->fp8file;
    o.no_stream_pack = !rt->tuning.stream_pack;
    return o;
}

/* Sequence parallelism the environment asks of a transformer just opened (docs/multi-gpu.md):
   H3_LOOPBACK_RANKS splits its block stack over loopback ranks on the CPU; a process started as one
   rank of several (WORLD_SIZE > 1) needs the NCCL communicator of the CUDA backend. */
static int rt_dit_sp(h3_runtime *rt, h3_dit *d, h3_pool *pool)
{
    const h3_tuning *t = &rt->tuning;
    if (t->loopback_ranks < 0)
        return h3_err(H3_E_INVALID, "H3_LOOPBACK_RANKS must be a whole number of ranks from 1 to %d", H3_COMM_MAX_WORLD);
    if (t->world_size == -2 || t->rank == -2 || t->local_rank == -2)
        return h3_err(H3_E_INVALID, "RANK, WORLD_SIZE and LOCAL_RANK must be whole numbers");
    /* a process of a multi-process group: WORLD_SIZE > 1, or WORLD_SIZE=1 with a rendezvous file (the NCCL path at
       world size 1, which the GPU script checks against the plain path) */
    if (t->world_size > 1 || (t->world_size == 1 && t->rendezvous[0])) {
        if (t->loopback_ranks > 0)
            return h3_err(H3_E_INVALID, "H3_LOOPBACK_RANKS and WORLD_SIZE=%d: a loopback group runs in one process",
                          t->world_size);
        if (t->rank < 0 || t->rank >= t->world_size)
            return h3_err(H3_E_INVALID, "RANK=%d is not a rank of WORLD_SIZE=%d", t->rank, t->world_size);
        if (!t->rendezvous[0])
            return h3_err(H3_E_INVALID, "WORLD_SIZE=%d needs H3_RENDEZVOUS, the file through which the ranks meet",
                          t->world_size);
        if (!rt->gpu)
            return h3_err(H3_E_INVALID,
                          "WORLD_SIZE=%d: ranks of several processes run on GPUs through NCCL (on the CPU, "
                          "H3_LOOPBACK_RANKS=%d splits the render over threads of one process)",
                          t->world_size, t->world_size);
        /* the NCCL communicator lives in the CUDA backend library (backend/cuda/cuda_nccl.cpp); one per
           process, made with the first transformer (every rank opens its transformer at the same point) */
        int rc = rt->comm ? 0 : h3_backend_cuda_comm(rt->gpu, t, &rt->comm, &rt->comm_scratch);
        return rc ? rc : h3_dit_sp_attach(d, rt->comm);
    }
    if (t->loopback_ranks <= 0) return 0;
    if (rt->gpu)
        return h3_err(H3_E_INVALID, "H3_LOOPBACK_RANKS=%d runs on --device cpu only (this context uses a GPU)",
                      t->loopback_ranks);
    return h3_dit_sp_loopback(d, t->loopback_ranks, h3_pool_threads(pool));
}

int h3_rt_dit(h3_runtime *rt, h3_dit **out)
{
    if (!rt->dit) {
        h3_backend *be;
        h3_pool *pool = h3_rt_pool(rt);
        if (!pool) return -H3_E_NOMEM;
        int rc = h3_rt_dit_backend(rt, &be);
        const h3_dit_open_opts o = dit_opts(rt, NULL);
        if (!rc) rc = h3_dit_open_ex(rt->model, pool, be, rt->flags, &o, &rt->dit);
        if (!rc && (rc = rt_dit_sp(rt, rt->dit, pool))) h3_rt_release_dit(rt);
        if (rc) return rc;
    }
    *out = rt->dit;
    return 0;
}

/* What identifies a transformer's merged weights: each LoRA file's path, scale, size and mtime (a
   file rewritten in place must be merged again). */
static char *dit_key(const h3_dit_open_opts *o)
{
    h3_buf b = {0};
    h3_buf_printf(&b, "%s", "");
    for (int i = 0; o && i < o->n_lora; i++) {
        struct stat st;
        const char *p = o->lora_paths && o->lora_paths[i] ? o->lora_paths[i] : "";
        bool ok = stat(p, &st) == 0;
        h3_buf_printf(&b, "%s\t%.9g\t%lld\t%lld.%09ld\n", p, o->lora_scales ? (double)o->lora_scales[i] : 1.0,
                      ok ? (long long)st.st_size : -1LL, ok ? (long long)RT_MTIME(st).tv_sec : 0LL,
                      ok ? (long)RT_MTIME(st).tv_nsec : 0L);
    }
    if (b.oom) {
        h3_buf_free(&b);
        h3_err(H3_E_NOMEM, "out of memory");
        return NULL;
    }
    return b.p;
}

int h3_rt_dit_for(h3_runtime *rt, const h3_dit_open_opts *opts, h3_dit **out)
{
    char *key = dit_key(opts);
    if (!key) return -H3_E_NOMEM;
    if (rt->dit && strcmp(rt->dit_key ? rt->dit_key : "", key) == 0) {
        free(key);
        *out = rt->dit;
        return 0;
    }
    if (rt->dit) h3_rt_release_dit(rt);
    h3_backend *be;
    h3_pool *pool = h3_rt_pool(rt);
    int rc = pool ? h3_rt_dit_backend(rt, &be) : -H3_E_NOMEM;
    const h3_dit_open_opts o = dit_opts(rt, opts);
    if (!rc) rc = h3_dit_open_ex(rt->model, pool, be, rt->flags, &o, &rt->dit);
    /* The weights kept for the other stages give way to the transformer: free them and try once more. */
    if (rc == -H3_E_NOMEM && h3_rt_release_kept(rt))
        rc = h3_dit_open_ex(rt->model, pool, be, rt->flags, &o, &rt->dit);
    if (!rc && (rc = rt_dit_sp(rt, rt->dit, pool))) h3_rt_release_dit(rt);
    if (rc) {
        free(key);
        return rc;
    }
    free(rt->dit_key);
    rt->dit_key = key;
    *out = rt->dit;
    return 0;
}

void h3_rt_release_dit(h3_runtime *rt)
{
    h3_dit_close(rt->dit);
    rt->dit = NULL;
    free(rt->dit_key);
    rt->dit_key = NULL;
    h3_store_release(&rt->model->comp[H3_COMP_TRANSFORMER].store);
}

bool h3_rt_release_kept(h3_runtime *rt)
{
    const bool held = rt->vvae_keep || rt->avae_keep || rt->text_keep;
    h3_vvae_keep_free(rt->vvae_keep);
    h3_avae_keep_free(rt->avae_keep);
    h3_text_keep_free(rt->text_keep);
    rt->vvae_keep = NULL;
    rt->avae_keep = NULL;
    rt->text_keep = NULL;
    return held;
}

/* What keeping the text encoder's layers must leave: beyond the transformer (its stored bytes, an
   upper bound on its device form), activations at the largest shapes (~6.3 GiB of the
   transformer's at 37,838 tokens), the decoders' weights (~5 GiB) and their work. */
#define TEXT_KEEP_MARGIN ((uint64_t)16 << 30)

uint64_t h3_rt_text_keep_reserve(h3_runtime *rt)
{
    uint64_t need = TEXT_KEEP_MARGIN;
    if (rt->dit) return need;
    h3_model *m = rt->model;
    if (!m->comp[H3_COMP_TRANSFORMER].present) return need;
    if (h3_model_headers(m, H3_COMP_TRANSFORMER)) {
        h3_err_clear();
        return UINT64_MAX; /* unknown: keep nothing */
    }
    const h3_store *s = &m->comp[H3_COMP_TRANSFORMER].store;
    for (size_t i = 0; i < s->ntensors; i++) need += s->tensors[i].end - s->tensors[i].begin;
    return need;
}

void h3_rt_free(h3_runtime *rt)
{
    h3_rt_render_free(rt); /* its latents live on the transformer's backend */
    h3_rt_release_kept(rt); /* before the backends they live on */
    h3_tokenizer_free(rt->tokenizer);
    h3_text_cache_free(rt->text_cache);
    h3_dit_close(rt->dit); /* before the model and the backends: it holds views and copies of both */
    h3_comm_destroy(rt->comm); /* after the transformer that used it, before its backend */
    if (rt->comm_scratch) rt->gpu->mem->release(rt->gpu, rt->comm_scratch);
    rt->comm = NULL;
    rt->comm_scratch = NULL;
    free(rt->dit_key);
    rt->dit_key = NULL;
    h3_fp8file_close(rt->fp8file); /* after the transformer, which read its weights from it */
    rt->fp8file = NULL;
    h3_backend_destroy(rt->gpu);
    h3_backend_destroy(rt->cpu);
    h3_pool_destroy(rt->pool);
    rt->tokenizer = NULL;
    rt->text_cache = NULL;
    rt->dit = NULL;
    rt->gpu = rt->cpu = NULL;
    rt->pool = NULL;
}
