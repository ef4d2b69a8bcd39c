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

/* Largest prompt accepted (keeps every size computation far from overflow). */
#define H3_TEXT_MAX_TOKENS (1 << 20)

typedef struct h3_text_run {
    /* in */
    h3_progress_fn progress; /* may be NULL; called on the calling thread, done = layers finished */
    void *progress_user;
    int prefetch;            /* 1 = background reader, 0 = synchronous reads, -1 = H3_TEXT_PREFETCH (default on) */
    /* out */
    uint64_t bytes_read;     /* weight bytes read from the shards (embedding rows + layers) */
} h3_text_run;

/*
 * out[n, hidden] (f32) = hidden_states[cond_layer] for token ids `ids[0..n)`. Validates the ids
 * against the vocabulary and every tensor the computation reads (headers) before reading data.
 * Layers >= cond_layer are never touched. On failure `out` holds unspecified values.
 */
H3_INTERNAL int h3_text_forward(h3_model *m, h3_backend *be, const int32_t *ids, int n, float *out,
                                h3_text_run *run);

/* 0 when 1 <= n <= H3_TEXT_MAX_TOKENS, else the error (an empty prompt is refused). */
H3_INTERNAL int h3_text_check_count(int n);

/*
 * Peak memory of h3_text_forward for an n-token prompt, from the config and headers: weights =
 * layer buffers in flight (2 with prefetch, 1 without) + nothing else (embedding rows are read
 * straight into the output); activations = f32 working buffers incl. the [n, hidden] output and
 * the RoPE table. `layer_bytes` is the largest layer's stored size.
 */
typedef struct h3_text_mem {
    uint64_t layer_bytes, layer_slots, weights, activations, total;
} h3_text_mem;
H3_INTERNAL int h3_text_memory(h3_model *m, int n, int prefetch, h3_text_mem *out);

/* Prompt cache of a context (text_cache.c). */
typedef struct h3_text_cache h3_text_cache;
H3_INTERNAL void h3_text_cache_free(h3_text_cache *c);

#endif /* H3_TEXT_ENCODER_H */
