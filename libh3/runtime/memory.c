/*
 * Peak-memory estimate per phase, from configs and safetensors headers only. Weights are counted
 * at their stored size (libh3 computes from the mapped bytes, it does not widen them in memory);
 * activations follow the buffers each stage allocates for the given render shape.
 */
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "core/geometry.h"
#include "core/singlefile.h"
#include "runtime/runtime.h"
#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_vae.h" /* the CPU backend's per-thread decoder scratch */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t bytes_where(const h3_store *s, const char *prefix, const char *contains, bool exclude)
{
    uint64_t n = 0;
    size_t pl = prefix ? strlen(prefix) : 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const char *name = h3_tensor_name(s, &s->tensors[i]);
        if (prefix && strncmp(name, prefix, pl) != 0) continue;
        bool has = contains && strstr(name, contains);
        if (contains && has == exclude) continue;
        n += s->tensors[i].end - s->tensors[i].begin;
    }
    return n;
}

/* The main blocks' four GEMM weights (qkv, out, fc1, fc2: what a reduced weight precision holds in
   1 byte a value, dit.c) at their stored size, and as int8 blocks (values plus per-channel scales). */
static void block_gemm_bytes(const h3_store *s, uint64_t *stored, uint64_t *int8)
{
    static const char *const parts[] = {".attn.qkv_proj.weight", ".attn.out_proj.weight", ".mlp.fc1.weight",
                                        ".mlp.fc2.weight"};
    *stored = *int8 = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const h3_tensor *t = &s->tensors[i];
        const char *name = h3_tensor_name(s, t);
        if (strncmp(name, "blocks.", 7) != 0 || t->ndim != 2) continue;
        const size_t nl = strlen(name);
        for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
            const size_t pl = strlen(parts[k]);
            if (nl > pl && strcmp(name + nl - pl, parts[k]) == 0) {
                *stored += t->end - t->begin;
                *int8 += h3_i8_block_bytes(t->shape[0], t->shape[1]);
            }
        }
    }
}

char *h3_rt_memory_estimate(h3_model *m, int threads, unsigned flags, int width, int height, int frames,
                            int prompt_tokens)
{
    return h3_rt_memory_estimate_ex(m, threads, flags, H3_PRECISION_DEFAULT, 0, width, height, frames, prompt_tokens);
}

/* A GEMM weight's bytes as the transformer holds it: its stored span, or its codes and scales where a single
   file's codes replace it (h3_sf_native). */
static uint64_t gemm_bytes(const h3_store *s, const h3_tensor *t)
{
    const uint64_t codes = h3_sf_codes_of(s, h3_tensor_name(s, t));
    return codes ? codes : t->end - t->begin;
}

/* The transformer's GEMM weights (h3_dit_gemm_weight): all, and one main block's. */
static void dit_gemm_split(const h3_store *s, uint64_t *all, uint64_t *block0, uint64_t *blocks)
{
    *all = *block0 = *blocks = 0;
    for (size_t i = 0; i < s->ntensors; i++) {
        const h3_tensor *t = &s->tensors[i];
        const char *name = h3_tensor_name(s, t);
        if (!h3_dit_gemm_weight(name)) continue;
        const uint64_t b = gemm_bytes(s, t);
        *all += b;
        if (strncmp(name, "blocks.", 7) == 0) *blocks += b;
        if (strncmp(name, "blocks.0.", 9) == 0) *block0 += (b + 63) / 64 * 64;
    }
}

char *h3_rt_memory_estimate_ex(h3_model *m, int threads, unsigned flags, int precision, int64_t vram_bytes,
                               int width, int height, int frames, int prompt_tokens)
{
    const int prefetch = (flags & H3_OPT_NO_TEXT_PREFETCH) ? 0 : 1;
    if (width <= 0 || height <= 0 || frames <= 0 || prompt_tokens <= 0 || width > 16384 ||
        height > 16384 || frames > 100000 || prompt_tokens > 1000000) {
        h3_err(H3_E_INVALID, "impossible render shape %dx%d, %d frames, %d prompt tokens", width, height,
               frames, prompt_tokens);
        return NULL;
    }
    h3_err_clear();
    h3_geom_cfg g;
    h3_geom_cfg_of_model(m, &g);
    h3_geom sp;
    h3_geom_plan(&g, width, height, frames, prompt_tokens, &sp);
    bool have_dit = false;
    h3_dit_cfg dc;
    if (m->comp[H3_COMP_TRANSFORMER].present) have_dit = h3_dit_cfg_load(m, &dc) == 0;
    h3_vvae_cfg vv;
    bool have_vv = m->comp[H3_COMP_VIDEO_VAE].present && h3_vvae_cfg_load(m, &vv) == 0;
    h3_avae_cfg av;
    bool have_av = m->comp[H3_COMP_AUDIO_VAE].present && h3_avae_cfg_load(m, &av) == 0;
    h3_err_clear(); /* a broken config is reported by the stage that reads it */

    h3_buf b = {0};
    h3_buf_printf(&b, "{\"frames\": %d, \"latent_frames\": %d, \"latent_height\": %d, \"latent_width\": %d, "
                  "\"audio_latents\": %d, \"video_tokens\": %lld, \"sequence\": %lld, \"phases\": {",
                  sp.frames, sp.lat_t, sp.lat_h, sp.lat_w, sp.audio_lat, (long long)sp.video_tokens,
                  (long long)sp.seq);
    bool first = true;
    int rc = 0;

    h3_text_mem tm;
    if (m->comp[H3_COMP_TEXT_ENCODER].present && (rc = h3_text_memory(m, prompt_tokens, prefetch, &tm)) == 0) {
        /* Layer streaming (text_encoder.c): the layer in use plus the one being prefetched, and the
           f32 working set of the prompt; embedding rows are read straight into the output. */
        h3_buf_printf(&b, "\"text_encoding\": {\"weights\": %llu, \"activations\": %llu, \"total\": %llu, "
                      "\"layer_bytes\": %llu, \"layer_buffers\": %llu}",
                      (unsigned long long)tm.weights, (unsigned long long)tm.activations,
                      (unsigned long long)tm.total, (unsigned long long)tm.layer_bytes,
                      (unsigned long long)tm.layer_slots);
        first = false;
    }
    if (!rc && have_dit && (rc = h3_model_headers(m, H3_COMP_TRANSFORMER)) == 0) {
        const h3_store *s = &m->comp[H3_COMP_TRANSFORMER].store;
        uint64_t all = s->bytes, adaln = bytes_where(s, NULL, "adaln_proj", false);
        /* A single file's layers computed from their stored codes (h3_sf_native) hold the codes, not BF16. */
        uint64_t sf_presented = 0, sf_codes = 0;
        h3_sf_native_bytes(s, h3_dit_gemm_weight, &sf_presented, &sf_codes);
        all = all - sf_presented + sf_codes;
        /* int8 (CPU): the blocks' GEMM weights stay resident as int8 copies; their mapped pages are
           released as each is quantised (dit.c get_w). */
        uint64_t gemm_stored = 0, gemm_int8 = 0;
        if (precision == H3_PRECISION_INT8) {
            block_gemm_bytes(s, &gemm_stored, &gemm_int8);
            all = all - gemm_stored + gemm_int8;
        }
        uint64_t A = (uint64_t)dc.heads * dc.head_dim, F = (uint64_t)dc.ffn, H = (uint64_t)dc.hidden;
        /* dit.c's buffers per packed row: residual, normed input and output (3H), the QKV or gate/up
           projection, the attention output or the gated product, and the attention context; plus
           at most 64 MiB of packed keys/values inside attention. */
        uint64_t qkv_ff = 3 * A > 2 * F ? 3 * A : 2 * F, attn_ff = 3 * A > F ? 3 * A : F;
        uint64_t act = (uint64_t)sp.seq * (3 * H + qkv_ff + attn_ff + A) * 4;
        uint64_t kv = (uint64_t)sp.seq * 2 * A * 4;
        act += kv < (64ull << 20) ? kv : (64ull << 20);
        /* Per evaluation: (video t, video), (video t, text), (audio t, audio) rows of 6 slots per
           block, plus two final-layer rows of 2 slots, in f32. The default 20 grid points give 19
           evaluations (fewer if the shift collapses points). */
        float sig[20];
        int evals = h3_sched_sigmas(20, dc.shift_video, sig) - 1;
        if (evals < 1) evals = 19;
        int steps = evals;
        uint64_t tables = (uint64_t)steps * (3ull * 6 * H * dc.layers + 2ull * 2 * H) * 4;
        h3_buf_printf(&b,
                      "%s\"denoise_precomputed_adaln\": {\"weights\": %llu, \"adaln_tables\": %llu, "
                      "\"activations\": %llu, \"total\": %llu, \"evaluations\": %d}, "
                      "\"denoise_without_precompute\": {\"weights\": %llu, \"activations\": %llu, \"total\": %llu}, "
                      "\"adaln_weights_released\": %llu",
                      first ? "" : ", ", (unsigned long long)(all - adaln), (unsigned long long)tables,
                      (unsigned long long)act, (unsigned long long)(all - adaln + tables + act), steps,
                      (unsigned long long)all, (unsigned long long)act, (unsigned long long)(all + act),
                      (unsigned long long)adaln);
        if (precision == H3_PRECISION_INT8)
            h3_buf_printf(&b, ", \"block_gemm_weights\": {\"precision\": \"int8\", \"stored\": %llu, "
                          "\"resident\": %llu}", (unsigned long long)gemm_stored, (unsigned long long)gemm_int8);
        if (sf_presented)
            h3_buf_printf(&b, ", \"single_file_codes\": {\"presented\": %llu, \"held\": %llu}",
                          (unsigned long long)sf_presented, (unsigned long long)sf_codes);
        if (vram_bytes > 0) {
            /* Under a budget the main blocks that do not fit stream through a ring (dit_stream.c's rule,
               h3_dit_stream_keep, with the plain ring's slots): the GEMM weights held are the fixed ones,
               the kept blocks and the ring. */
            uint64_t gemm_all, B, blocks;
            dit_gemm_split(s, &gemm_all, &B, &blocks);
            const uint64_t fixed = gemm_all - blocks, L = (uint64_t)dc.layers;
            const int64_t avail = vram_bytes - (int64_t)fixed;
            const uint64_t ring = B * (uint64_t)h3_dit_stream_slots();
            int64_t keep = avail >= (int64_t)(B * L) ? (int64_t)L : h3_dit_stream_keep(avail, B, ring);
            const bool fits = keep >= 0;
            if (keep < 0) keep = 0;
            const uint64_t held = fixed + B * (uint64_t)keep + ((uint64_t)keep < L ? ring : 0);
            const uint64_t w = all - adaln - gemm_all + held;
            h3_buf_printf(&b, ", \"under_vram_budget\": {\"vram_bytes\": %lld, \"fits\": %s, \"block_bytes\": %llu, "
                          "\"fixed_gemm_bytes\": %llu, \"blocks_resident\": %lld, \"blocks_streamed\": %lld, "
                          "\"gemm_weights_held\": %llu, \"weights\": %llu, \"total\": %llu}",
                          (long long)vram_bytes, fits ? "true" : "false", (unsigned long long)B,
                          (unsigned long long)fixed, (long long)keep, (long long)(L - (uint64_t)keep),
                          (unsigned long long)held, (unsigned long long)w, (unsigned long long)(w + tables + act));
        }
        first = false;
    }
    if (!rc && have_vv && (rc = h3_model_headers(m, H3_COMP_VIDEO_VAE)) == 0) {
        const h3_store *s = &m->comp[H3_COMP_VIDEO_VAE].store;
        uint64_t w = bytes_where(s, "decoder.", NULL, false) + bytes_where(s, "post_quant_conv.", NULL, false);
        /* Exactly what the streaming decoder allocates (video_vae.c): one tile's activations and
           pixels, the overlap strips and the frames the temporal cross-fade keeps. */
        h3_vvae_plan plan;
        uint64_t act = 0;
        if (h3_vvae_plan_make(&vv, sp.lat_t, sp.lat_h > 0 ? sp.lat_h : 1, sp.lat_w > 0 ? sp.lat_w : 1, 0, 0, 0,
                              &plan) == 0) {
            act = plan.workspace_bytes;
            h3_vvae_plan_free(&plan);
        }
        h3_err_clear();
        uint64_t frames_out = (uint64_t)width * height * sp.frames * 3;
        h3_buf_printf(&b, "%s\"video_decode\": {\"weights\": %llu, \"activations\": %llu, \"frames\": %llu, "
                      "\"total\": %llu}",
                      first ? "" : ", ", (unsigned long long)w, (unsigned long long)act,
                      (unsigned long long)frames_out, (unsigned long long)(w + act + frames_out));
        first = false;
    }
    if (!rc && have_av && (rc = h3_model_headers(m, H3_COMP_AUDIO_VAE)) == 0) {
        const h3_store *s = &m->comp[H3_COMP_AUDIO_VAE].store;
        uint64_t w = bytes_where(s, "decoder.", NULL, false) + bytes_where(s, "dec_in_proj.", NULL, false);
        /* Folded weight copies (the mapping is dropped while folding) plus the decoder's own
           buffer plan; the two stereo sides are decoded one after the other. */
        int64_t work = h3_avae_work_bytes(&av, sp.audio_lat > 0 ? sp.audio_lat : 1,
                                          (int64_t)threads * h3_cpu_snake_scratch_bytes());
        uint64_t act = work > 0 ? (uint64_t)work : 0;
        int64_t samples = h3_avae_samples(&av, sp.audio_lat > 0 ? sp.audio_lat : 1);
        uint64_t pcm = samples > 0 ? 2ull * (uint64_t)samples * 4 : 0;
        h3_err_clear();
        h3_buf_printf(&b, "%s\"audio_decode\": {\"weights\": %llu, \"activations\": %llu, \"pcm\": %llu, "
                      "\"total\": %llu}",
                      first ? "" : ", ", (unsigned long long)w, (unsigned long long)act,
                      (unsigned long long)pcm, (unsigned long long)(w + act + pcm));
    }
    h3_buf_printf(&b, "}}");
    if (rc || b.oom) {
        if (!rc) h3_err(H3_E_NOMEM, "out of memory");
        h3_buf_free(&b);
        return NULL;
    }
    return b.p;
}
