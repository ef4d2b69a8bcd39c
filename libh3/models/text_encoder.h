/*
 * Text conditioner (internal): the Qwen3-VL language model run over a text prompt, stopped at the
 * hidden state MiniMax-H3 conditions on (hidden_states[cond_layer], before any final norm).
 *
 * Two entry points:
 *  - h3_text_forward: the raw computation from a model and a backend (no cache).
 *  - the prompt cache (runtime/text_cache.c) wraps it: cache first, then the forward.
 */
#ifndef H3_TEXT_ENCODER_H
#define H3_TEXT_ENCODER_H

#include "backend/backend.h"
#include "core/tuning.h"

/* Largest prompt accepted (keeps every size computation far from overflow). */
#define H3_TEXT_MAX_TOKENS (1 << 20)

/* The layers' GEMM weights kept on a GPU between encodes (h3_text_run.keep): made by a streamed
   encode when the device has room, used by the next ones instead of reading and copying the layers
   again. The bytes are those the streamed encode computed on, so outputs do not change. */
typedef struct h3_text_keep h3_text_keep;
H3_INTERNAL void h3_text_keep_free(h3_text_keep *k);

typedef struct h3_text_run {
    /* in */
    h3_progress_fn progress; /* may be NULL; called on the calling thread, done = layers finished */
    void *progress_user;
    int prefetch;            /* 1 = background reader, 0 = synchronous reads, -1 = H3_TEXT_PREFETCH (default on) */
    uint64_t bytes_read;     /* out: weight bytes read from the shards (embedding rows + layers) */
    /* in/out, may be NULL: the caller's kept layers. Used when *keep holds this model's layers;
       else, on the streamed path, made when H3_TEXT_KEEP says so (1 always, 0 never) or, by
       default, when the device's free memory less the layers stays >= keep_reserve (what the
       caller still needs: the transformer it has not loaded, activations, decoders). */
    h3_text_keep **keep;
    uint64_t keep_reserve;
    /* H3_TEXT_STREAM, H3_TEXT_READERS and H3_TEXT_KEEP as h3_init read them; NULL: all unset. */
    const h3_tuning *tuning;
} h3_text_run;

/*
 * out[n, hidden] (f32) = hidden_states[cond_layer] for token ids `ids[0..n)`. Validates the ids
 * against the vocabulary and every tensor the computation reads (headers) before reading data.
 * Layers >= cond_layer are never touched. On failure `out` holds unspecified values.
 */
H3_INTERNAL int h3_text_forward(h3_model *m, h3_backend *be, const int32_t *ids, int n, float *out,
                                h3_text_run *run);

/*
 * Vision rows spliced into a prompt (Qwen3-VL's image placeholders; models/vision_tower.c builds
 * them). Span s covers tokens [start[s], start[s] + grid_h[s] * grid_w[s]), its merged grid in
 * row-major order; spans are in increasing order and never touch (a text token between two).
 */
typedef struct h3_text_vision {
    int n_spans;
    const int *start;
    const int *grid_h, *grid_w;  /* merged grid of each span (patches / merge size) */
    const float *embeds;         /* [sum of span tokens][hidden]: replace the spans' embeddings */
    int n_deepstack;
    const float *deepstack;      /* [n_deepstack][sum of span tokens][hidden]: set l is added to the
                                    spans' rows after language layer l */
    int mrope_section[3];        /* text_config.rope_parameters.mrope_section */
} h3_text_vision;

/*
 * h3_text_forward with vision rows (vis may be NULL: exactly h3_text_forward). Positions follow
 * transformers' get_rope_index: a text token takes the running position p on all three axes; the
 * token at (r, c) of a span starting at position p takes (t, h, w) = (p, p + r, p + c), and the
 * next token p + max(grid_h, grid_w). Frequency slot j rotates by h when j % 3 == 1 and
 * j < 3 * mrope_section[1], by w when j % 3 == 2 and j < 3 * mrope_section[2], else by t.
 * hidden_states[K] is the output of layer K-1 before that layer's deepstack addition, as
 * transformers records it.
 */
H3_INTERNAL int h3_text_forward_vl(h3_model *m, h3_backend *be, const int32_t *ids, int n, const h3_text_vision *vis,
                                   float *out, h3_text_run *run);

/* 0 when 1 <= n <= H3_TEXT_MAX_TOKENS, else the error (an empty prompt is refused). */
H3_INTERNAL int h3_text_check_count(int n);

/*
 * Peak memory of h3_text_forward for an n-token prompt, from the config and headers: weights =
 * layer buffers in flight (2 with prefetch, 1 without) + nothing else (embedding rows are read
 * straight into the output); activations = f32 working buffers incl. the [n, hidden] output and
 * the RoPE table. `layer_bytes` is the largest layer's stored size. (On a GPU the layer buffers
 * are pinned host memory, and as many device slots of the same size come on top, on the device.)
 */
typedef struct h3_text_mem {
    uint64_t layer_bytes, layer_slots, weights, activations, total;
} h3_text_mem;
H3_INTERNAL int h3_text_memory(h3_model *m, int n, int prefetch, h3_text_mem *out);

/* Prompt cache of a context (text_cache.c). */
typedef struct h3_text_cache h3_text_cache;
H3_INTERNAL void h3_text_cache_free(h3_text_cache *c);

/*
 * The FL2VA conditioning a render hands the transformer, exactly what diffusers'
 * MiniMaxH3FL2VATextEncoderStep returns: prompt_embeds rows and text_token_tags.
 */
typedef struct h3_text_rows {
    int n, hidden;
    float *rows;    /* [n][hidden] f32 */
    int32_t *ids;   /* [n] the presentation's token ids */
    uint8_t *tags;  /* [n] 1 = text row, 0 = a vision block's row (<|vision_start|>, pads, <|vision_end|>) */
} h3_text_rows;
H3_INTERNAL void h3_text_rows_free(h3_text_rows *r);

struct h3_runtime;
/*
 * Prompt + keyframes (rgb[i]: [heights[i]][widths[i]][3] uint8, first frame then last, as diffusers
 * numbers them) -> conditioning rows and tags, through the context's prompt cache: the key is the
 * presentation's token ids plus the processor settings and every image's size and a 128-bit digest
 * of its bytes, so a different keyframe never hits an entry. n_images = 0 is the text-only
 * presentation (the same rows as h3_rt_text_encode of the prompt's ids). `out` is the caller's to
 * free with h3_text_rows_free (zeroed on failure).
 */
H3_INTERNAL int h3_rt_text_encode_images(struct h3_runtime *rt, const char *prompt, int n_images,
                                         const uint8_t *const *rgb, const int *widths, const int *heights,
                                         h3_text_rows *out);
/* Row count of that presentation (no pixels read, nothing encoded), or a negative H3_E_* code. */
H3_INTERNAL int h3_rt_text_image_rows(struct h3_runtime *rt, const char *prompt, int n_images, const int *widths,
                                      const int *heights);
/* Both for Ref2VA: video items (frames[i] > 0, rgb[i] = [frames][h][w][3]) and "<Audio j>: "
   labels (h3_vl_prompt_build_refs's frames and audio_before; NULL: none). */
H3_INTERNAL int h3_rt_text_encode_refs(struct h3_runtime *rt, const char *prompt, int n_images,
                                       const uint8_t *const *rgb, const int *widths, const int *heights,
                                       const int *frames, const int *audio_before, h3_text_rows *out);
H3_INTERNAL int h3_rt_text_refs_rows(struct h3_runtime *rt, const char *prompt, int n_images, const int *widths,
                                     const int *heights, const int *frames, const int *audio_before);

/* Whether tensor `name` is one of the language model's GEMM weights (q / k / v / o, gate / up / down of a
   layer), which the encoder hands to the backend: what a single file's stored int8 codes may replace
   (core/singlefile.h's h3_sf_native). */
H3_INTERNAL bool h3_text_gemm_weight(const char *name);

#endif /* H3_TEXT_ENCODER_H */
