/*
 * The runtime: what a render needs between calls (worker pool, backends, tokenizer, prompt cache,
 * transformer, the prepared request) and the pipeline that drives the stages. The API layer
 * (api/) owns one h3_runtime inside each context and hands it down; nothing here knows the
 * context, and the stages (models/) receive only the model, a pool or backend and a progress
 * hook.
 */
#ifndef H3_RUNTIME_H
#define H3_RUNTIME_H

#include "backend/backend.h"
#include "core/internal.h"
#include "core/tuning.h"

struct h3_pool;
struct h3_dit;
struct h3_fp8file;
struct h3_render;
struct h3_text_cache;
struct h3_tokenizer;

typedef struct h3_runtime {
    h3_model *model;
    int threads;
    unsigned flags;            /* H3_OPT_* (environment overrides already applied) */
    int precision;             /* H3_PRECISION_* of the transformer's block weights (h3_options) */
    int64_t vram_bytes;        /* h3_options.vram_bytes: the transformer's weight budget (0: auto) */
    struct h3_fp8file *fp8file; /* h3_options.quantized_path, opened and checked at h3_init (owned) */
    h3_progress_fn progress;   /* h3_set_progress */
    void *progress_user;
    struct h3_pool *pool;      /* host workers, created on first use */
    h3_backend *cpu;           /* the CPU backend over `pool`, created on first use */
    h3_backend *gpu;           /* a GPU backend when the device asks for one (owned here) */
    struct h3_tokenizer *tokenizer;   /* loaded on first prepare */
    struct h3_text_cache *text_cache; /* prompt embeddings, created on first use */
    struct h3_dit *dit;        /* the transformer, opened on first use */
    char *dit_key;             /* the LoRA files merged into it ("" or NULL: none); see h3_rt_dit_for */
    struct h3_render *render;  /* the prepared request */
    /* The decoders' weights on the stage backend when it is a GPU, loaded at first use and kept
       until h3_rt_free or until the transformer needs the memory (h3_rt_release_kept). */
    struct h3_vvae_keep *vvae_keep;
    struct h3_avae_keep *avae_keep;
    /* The text encoder's layers on the stage backend when it is a GPU with room for them next to
       the transformer (models/text_encoder.h: h3_text_keep), made by the first encode, given up
       like the decoders' weights. */
    struct h3_text_keep *text_keep;
    /* The environment's knobs, read once by h3_init (core/tuning.h); the stages get their part. */
    h3_tuning tuning;
    /* This process's NCCL communicator when it is one rank of several (RANK / WORLD_SIZE,
       docs/multi-gpu.md): made with the first transformer, kept until h3_rt_free; comm_scratch is
       its barrier's device memory on the GPU backend. */
    struct h3_comm *comm;
    void *comm_scratch;
} h3_runtime;

/* The host worker pool (NULL + error when it cannot be created). */
H3_INTERNAL struct h3_pool *h3_rt_pool(h3_runtime *rt);
/* The CPU backend over the pool, created on first use. */
H3_INTERNAL int h3_rt_cpu_backend(h3_runtime *rt, h3_backend **out);
/* The backend the text encoder and the decoders run on: the GPU backend if one is set and
   H3_OPT_STAGES_CPU is not, else the CPU. */
H3_INTERNAL int h3_rt_stage_backend(h3_runtime *rt, h3_backend **out);
/* The video decoder's weight precision (h3_vvae_request.precision): fp8 under H3_OPT_FP8_DECODER (h3_init
   checked the context can run it), else the exact decoder. */
static inline int h3_rt_video_decoder_precision(const h3_runtime *rt)
{
    return rt->flags & H3_OPT_FP8_DECODER ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
}
/* The backend the transformer and sampler run on: the GPU backend if one is set, else the CPU. */
H3_INTERNAL int h3_rt_dit_backend(h3_runtime *rt, h3_backend **out);
/* The transformer, opened on first use on the transformer's backend. */
H3_INTERNAL int h3_rt_dit(h3_runtime *rt, struct h3_dit **out);
/* The transformer opened with these options (NULL: the plain model): the open one when its LoRA
   files (paths, scales, sizes and modification times) are the same, else it is closed and
   reopened. Layer dropping's lazy loading is honoured only by a fresh open. */
struct h3_dit_open_opts;
H3_INTERNAL int h3_rt_dit_for(h3_runtime *rt, const struct h3_dit_open_opts *opts, struct h3_dit **out);
/* Close the transformer and let its pages go (a render's decode does this first). */
H3_INTERNAL void h3_rt_release_dit(h3_runtime *rt);
/* Free the weights kept on the stage backend, the decoders' and the text encoder's layers (true when
   there were any). */
H3_INTERNAL bool h3_rt_release_kept(h3_runtime *rt);
/* Device memory an encode that keeps the text encoder's layers must leave free: the transformer's
   stored weights while it is not open, plus room for activations and the decoders. */
H3_INTERNAL uint64_t h3_rt_text_keep_reserve(h3_runtime *rt);
/* Everything the runtime holds (the model stays: it belongs to the caller). */
H3_INTERNAL void h3_rt_free(h3_runtime *rt);
H3_INTERNAL int h3_rt_progress(h3_runtime *rt, const char *phase, int done, int total);

/* Prompt cache (text_cache.c): the cached text encoder and its statistics. */
H3_INTERNAL int h3_rt_text_encode(h3_runtime *rt, const int32_t *ids, int n, float *out);
H3_INTERNAL int h3_rt_text_cache_stats(h3_runtime *rt, h3_text_cache_stats *out);
H3_INTERNAL int h3_rt_text_cache_set_budget(h3_runtime *rt, uint64_t bytes);
H3_INTERNAL void h3_rt_text_cache_clear(h3_runtime *rt);

/* The render pipeline (pipeline.c): the bodies of h3_plan / h3_prepare / h3_step / ... */
/* h3_request_default over the runtime's model (rt NULL: the release's defaults). */
H3_INTERNAL int h3_rt_request_default(h3_runtime *rt, h3_request *r);
H3_INTERNAL int h3_rt_plan(h3_runtime *rt, const h3_request *request, h3_render_info *out);
/* The schedule a request's model or LoRA files declare into name (cap bytes): 1, or 0 for none ("" written). */
H3_INTERNAL int h3_rt_schedule_declared(h3_runtime *rt, const h3_request *request, char *name, int cap);
H3_INTERNAL int h3_rt_prepare(h3_runtime *rt, const h3_request *request);
H3_INTERNAL int h3_rt_step(h3_runtime *rt);
H3_INTERNAL int h3_rt_render_info(h3_runtime *rt, h3_render_info *out);
H3_INTERNAL int h3_rt_get_latents(h3_runtime *rt, float *video, float *audio);
H3_INTERNAL int h3_rt_prompt_tokens(h3_runtime *rt, int32_t *ids, int cap);
H3_INTERNAL int h3_rt_decode(h3_runtime *rt, uint8_t *rgb, float *pixels, float *pcm);
H3_INTERNAL void h3_rt_render_free(h3_runtime *rt);
/* The canvas a keyframe of image_width x image_height implies on the model (h3_keyframe_canvas). */
H3_INTERNAL int h3_rt_keyframe_canvas(h3_runtime *rt, int image_width, int image_height, int *width, int *height);

/* Peak-memory estimate per phase as a JSON object (memory.c); the caller frees the string. */
H3_INTERNAL char *h3_rt_memory_estimate(h3_model *m, int threads, unsigned flags, int width, int height,
                                        int frames, int prompt_tokens);
/* The same for weights held at an H3_PRECISION_* (INT8: the main blocks' GEMM weights as int8 copies;
   the denoise phases then also report "block_gemm_weights": stored and resident bytes). */
H3_INTERNAL char *h3_rt_memory_estimate_ex(h3_model *m, int threads, unsigned flags, int precision, int64_t vram_bytes,
                                           int width, int height, int frames, int prompt_tokens);

#endif /* H3_RUNTIME_H */
