/* Public transformer / sampler entry points (h3.h "Transformer"): thin checks around dit.h. */
#include "api/api.h"
#include "backend/cpu/ops.h"
#include "models/dit.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int ctx_dit(h3_ctx *ctx, h3_dit **out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_dit(&ctx->rt, out);
}

/* The public transformer calls compute the released model: a transformer a render opened with LoRA
   files merged is reopened without them. */
static int ctx_dit_plain(h3_ctx *ctx, h3_dit **out)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    return h3_rt_dit_for(&ctx->rt, NULL, out);
}

H3_API int h3_sigma_schedule(int steps, double shift, float *sigmas, float *timesteps)
{
    if (!sigmas) return h3_err(H3_E_INVALID, "schedule: NULL sigmas buffer");
    int n = h3_sched_sigmas(steps, shift, sigmas);
    if (n > 0 && timesteps) h3_sched_timesteps(sigmas, n, timesteps);
    return n;
}

H3_API int h3_schedule_sigmas(const char *name, int steps, double shift_video, double shift_audio, float *video,
                              float *audio)
{
    if (!video || !audio) return h3_err(H3_E_INVALID, "schedule: NULL sigma buffer");
    return h3_sched_named(name, steps, shift_video, shift_audio, video, audio);
}

H3_API const char *h3_schedule_name(int i) { return h3_sched_name(i); }

H3_API int h3_noise_fill(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n)
{
    if (n < 0 || (n > 0 && !out)) return h3_err(H3_E_INVALID, "noise: bad buffer (%lld values)", (long long)n);
    h3_noise(seed, stream, offset, out, n);
    return 0;
}

H3_API int64_t h3_dit_packed_layout(h3_ctx *ctx, int64_t n_text, const uint8_t *text_tags, int latent_frames,
                             int latent_height, int latent_width, int audio_latents, const int32_t *anchors,
                             int n_anchors, double *position_ids, int64_t *token_tags, int64_t *text_indices,
                             int64_t *video_indices, int64_t *audio_indices)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_dit_cfg c;
    int rc = h3_dit_cfg_load(&ctx->model, &c);
    if (rc) return rc;
    int an[64];
    if (n_anchors < 0 || n_anchors > 64 || (n_anchors && !anchors))
        return h3_err(H3_E_INVALID, "layout: %d keyframe anchors (0 to 64)", n_anchors);
    for (int i = 0; i < n_anchors; i++) an[i] = anchors[i];
    h3_dit_layout l;
    rc = h3_dit_layout_t2va(&c, n_text, text_tags, latent_frames, latent_height, latent_width, audio_latents, an,
                            n_anchors, &l);
    if (rc) return rc;
    return h3_dit_layout_export(&l, position_ids, token_tags, text_indices, video_indices, audio_indices, NULL,
                                NULL);
}

H3_API int h3_dit_forward(h3_ctx *ctx, const float *hidden_states, int64_t num_video_rows,
                          const float *audio_hidden_states, int64_t num_audio_rows,
                          const float *encoder_hidden_states, int64_t num_text_rows, const float *timestep,
                          int32_t num_timesteps, const int64_t *timestep_indices, const int64_t *token_tags,
                          const double *position_ids, int64_t seq_len, const int64_t *video_indices,
                          const int64_t *audio_indices, const int64_t *text_indices, float *sample,
                          float *audio_sample)
{
    h3_dit *d;
    int rc = ctx_dit_plain(ctx, &d);
    if (rc) return rc;
    if (!encoder_hidden_states || !timestep || !timestep_indices || !token_tags || !position_ids ||
        !text_indices || (num_video_rows && (!hidden_states || !video_indices || !sample)) ||
        (num_audio_rows && (!audio_hidden_states || !audio_indices || !audio_sample)))
        return h3_err(H3_E_INVALID, "forward: NULL input or output buffer");
    if (num_timesteps < 1) return h3_err(H3_E_INVALID, "forward: timestep has no values");
    h3_dit_layout l;
    rc = h3_dit_layout_from_rows(seq_len, num_text_rows, num_video_rows, num_audio_rows, text_indices, video_indices,
                                 audio_indices, token_tags, position_ids, &l);
    if (rc) return rc;
    int32_t *row_t = h3_malloc(sizeof(int32_t) * (size_t)seq_len);
    if (!row_t) rc = -H3_E_NOMEM;
    for (int64_t r = 0; !rc && r < seq_len; r++) {
        if (timestep_indices[r] < 0 || timestep_indices[r] >= num_timesteps)
            rc = h3_err(H3_E_INVALID, "forward: timestep_indices[%lld] = %lld, but timestep has %d values",
                        (long long)r, (long long)timestep_indices[r], num_timesteps);
        else
            row_t[r] = (int32_t)timestep_indices[r];
    }
    if (!rc) rc = h3_dit_set_layout(d, &l);
    if (!rc) rc = h3_dit_set_text(d, encoder_hidden_states, num_text_rows);
    if (!rc)
        rc = h3_dit_forward_t(d, timestep, num_timesteps, row_t, hidden_states, audio_hidden_states, sample,
                              audio_sample);
    free(row_t);
    h3_dit_layout_free(&l);
    return rc;
}

H3_API int h3_dit_denoise(h3_ctx *ctx, const float *prompt_embeds, int64_t n_text, const uint8_t *text_tags,
                          int latent_frames, int latent_height, int latent_width, int audio_latents, int steps,
                          float *latents, float *audio_latents_io)
{
    h3_dit *d;
    int rc = ctx_dit_plain(ctx, &d);
    if (rc) return rc;
    if (!prompt_embeds || !latents || !audio_latents_io) return h3_err(H3_E_INVALID, "denoise: NULL buffer");
    const h3_dit_cfg *c = h3_dit_config(d);
    h3_dit_layout l;
    rc = h3_dit_layout_t2va(c, n_text, text_tags, latent_frames, latent_height, latent_width, audio_latents, NULL, 0,
                            &l);
    if (rc) return rc;
    h3_backend *be = h3_dit_backend(d);
    const size_t vbytes = sizeof(float) * (size_t)(l.n_video * c->video_ch * c->patch[1] * c->patch[2]);
    const size_t abytes = sizeof(float) * (size_t)(l.n_audio * c->audio_ch);
    float *vrows = h3_alloc_aligned(vbytes + 4), *arows = h3_alloc_aligned(abytes + 4);
    /* The latents stay on the transformer's backend for the whole loop. */
    float *dv = be->mem->alloc(be, vbytes + 4), *da = be->mem->alloc(be, abytes + 4);
    if (!vrows || !arows || !dv || !da) rc = -H3_E_NOMEM;
    if (!rc) rc = h3_dit_set_layout(d, &l);
    if (!rc) rc = h3_dit_set_text(d, prompt_embeds, n_text);
    /* H3_OPT_KEEP_ADALN keeps the adaln_proj pages resident (the exact same numbers either way). */
    const bool release = !(ctx->flags & H3_OPT_KEEP_ADALN);
    int evals = 0;
    if (!rc) rc = evals = h3_dit_prepare_schedule(d, steps, c->shift_video, c->shift_audio, release);
    if (rc >= 0) {
        rc = 0;
        h3_dit_patchify_video(c, latents, latent_frames, latent_height, latent_width, vrows);
        h3_dit_pack_audio(c->audio_ch, audio_latents, audio_latents_io, arows);
        if (!(rc = be->mem->upload(be, dv, vrows, vbytes))) rc = be->mem->upload(be, da, arows, abytes);
        for (int i = 0; !rc && i < evals; i++)
            if ((rc = h3_dit_step(d, i, dv, da)) > 0) rc = 0;
        if (!rc && !(rc = be->mem->download(be, vrows, dv, vbytes))) rc = be->mem->download(be, arows, da, abytes);
    }
    if (!rc) {
        h3_dit_unpatchify_video(c, vrows, latent_frames, latent_height, latent_width, latents);
        h3_dit_unpack_audio(c->audio_ch, audio_latents, arows, audio_latents_io);
    }
    be->mem->release(be, dv);
    be->mem->release(be, da);
    h3_free_aligned(vrows);
    h3_free_aligned(arows);
    h3_dit_layout_free(&l);
    return rc ? rc : evals;
}

H3_API const char *h3_dit_profile_json(h3_ctx *ctx)
{
    h3_dit *d;
    if (ctx_dit(ctx, &d)) return NULL;
    uint64_t wb, tb;
    bool released;
    h3_dit_adaln_bytes(d, &wb, &tb, &released);
    h3_dit_stats s;
    h3_dit_get_stats(d, &s);
    h3_buf b = {0};
    h3_buf_printf(&b,
                  "{\"adaln_weight_bytes\": %llu, \"adaln_table_bytes\": %llu, \"adaln_released\": %s, "
                  "\"steps\": %d, \"device\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"open_ms\": %.3f, \"refine_ms\": %.3f, "
                  "\"prepare_ms\": %.3f, \"forwards\": %d, \"forward_ms_last\": %.3f, \"forward_ms_min\": %.3f, "
                  "\"forward_ms_mean\": %.3f, \"forward_parts_ms\": {",
                  (unsigned long long)wb, (unsigned long long)tb, released ? "true" : "false", h3_dit_num_steps(d),
                  h3_device_name(ctx), h3_kernels_variant(), ctx->threads, s.open_ms, s.refine_ms, s.prepare_ms, s.forwards,
                  s.forward_ms_last, s.forward_ms_min, s.forwards ? s.forward_ms_total / s.forwards : 0.0);
    /* Per forward, averaged: where the time goes (the rest is input/output projections). */
    for (int i = 0; i < H3_DIT_PARTS; i++)
        h3_buf_printf(&b, "%s\"%s\": %.3f", i ? ", " : "", h3_dit_part_name(i),
                      s.forwards ? s.part_ms[i] / s.forwards : 0.0);
    h3_buf_printf(&b, "}, \"evaluations\": %d, \"block_runs\": %d, \"skipped_steps\": %d, \"layers_run\": %d, "
                      "\"transformer_ms\": %.3f, \"forward_ms_total\": %.3f, \"stack_ms_min\": %.3f, "
                      "\"stack_ms_mean\": %.3f, \"blocks\": [",
                  s.forwards, s.block_runs, s.skipped_steps, s.layers_run, s.transformer_ms, s.forward_ms_total,
                  s.stack_ms_min, s.block_runs ? s.stack_ms_total / s.block_runs : 0.0);
    int n_run;
    int64_t reduced;
    const int *run = h3_dit_blocks_run(d, &n_run, &reduced);
    for (int i = 0; i < n_run; i++) h3_buf_printf(&b, "%s%d", i ? ", " : "", run[i]);
    /* Weight streaming (h3_options.vram_bytes): blocks streamed, bytes the GEMM weights hold, bytes streamed
       (blocks in slot form), and the bytes the copies moved (packed blocks move fewer) with how many are packed. */
    int streamed, blocks, packed;
    uint64_t held, moved, blk, copied;
    h3_dit_stream_info(d, &streamed, &blocks, &held, &moved, &blk, &copied, &packed);
    h3_buf_printf(&b, "], \"reduced_sequence\": %lld, \"stream\": {\"streamed_blocks\": %d, \"blocks\": %d, "
                      "\"weight_bytes_held\": %llu, \"bytes_streamed\": %llu, \"block_bytes\": %llu, "
                      "\"bytes_copied\": %llu, \"packed_blocks\": %d}, \"sequence_parallel\": ",
                  (long long)reduced, streamed, blocks, (unsigned long long)held, (unsigned long long)moved,
                  (unsigned long long)blk, (unsigned long long)copied, packed);
    /* the block stack split over ranks (docs/multi-gpu.md): who ran which rows, what the exchanges moved */
    h3_dit_sp_json(d, &b);
    h3_buf_printf(&b, "}");
    if (b.oom) {
        h3_buf_free(&b);
        h3_err(H3_E_NOMEM, "out of memory");
        return NULL;
    }
    free(ctx->dit_json);
    ctx->dit_json = b.p;
    return ctx->dit_json;
}

typedef struct {
    int64_t iters;
    float sink[256];
} fma_job;

static void fma_task(void *arg, int64_t begin, int64_t end, int thread)
{
    fma_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->sink[i & 255] = h3_fma_loop(j->iters);
}

H3_API double h3_bench_fma_peak(h3_ctx *ctx, int reps)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (reps < 1) return h3_err(H3_E_INVALID, "bench: repeats %d < 1", reps);
    h3_pool *pool = h3_rt_pool(&ctx->rt);
    if (!pool) return -H3_E_NOMEM;
    const int nt = h3_pool_threads(pool);
    /* 2e7 rounds x 192 flops: ~0.1-0.2 s per thread on a current core, long enough to reach the
       sustained clock, short enough for a benchmark's preamble */
    fma_job job = {.iters = 20000000};
    double best = 0;
    for (int r = 0; r <= reps; r++) { /* run 0 wakes the threads and the clock */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        h3_parallel_for(pool, nt, 1, fma_task, &job);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        double gf = (double)nt * (double)job.iters * 12 * 16 / s / 1e9;
        if (r && gf > best) best = gf;
    }
    return best;
}

H3_API double h3_bench_gemm(h3_ctx *ctx, int64_t m, int64_t n, int64_t k, int reps)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    if (m < 1 || n < 1 || k < 1 || m * k > (1LL << 28) || n * k > (1LL << 28) || m * n > (1LL << 28) || reps < 1)
        return h3_err(H3_E_INVALID, "bench: bad GEMM size %lldx%lldx%lld or repeats %d", (long long)m, (long long)n,
                      (long long)k, reps);
    h3_pool *pool = h3_rt_pool(&ctx->rt);
    if (!pool) return -H3_E_NOMEM;
    float *x = h3_alloc_aligned(sizeof(float) * (size_t)(m * k)), *w = h3_alloc_aligned(sizeof(float) * (size_t)(n * k));
    float *y = h3_alloc_aligned(sizeof(float) * (size_t)(m * n));
    double best = 0;
    int rc = (!x || !w || !y) ? -H3_E_NOMEM : 0;
    if (!rc) {
        h3_noise(1, 0, 0, x, m * k);
        h3_noise(2, 0, 0, w, n * k);
    }
    h3_mat W = {w, H3_DT_F32, n, k};
    for (int r = 0; !rc && r <= reps; r++) { /* the first run warms caches and scratch */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        rc = h3_host_linear(pool, x, m, k, &W, NULL, y, n);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        double gf = 2.0 * m * n * k / s / 1e9;
        if (r && gf > best) best = gf;
    }
    h3_free_aligned(x);
    h3_free_aligned(w);
    h3_free_aligned(y);
    return rc ? rc : best;
}
