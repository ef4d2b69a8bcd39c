/*
 * LoRA files for the MiniMax-H3 transformer, merged into its weights when they load.
 *
 * A LoRA adds scale * (B A) to a weight W [out, in] (A [rank, in], B [out, rank]). Two key
 * families are read, as diffusers' MiniMaxH3LoraLoaderMixin reads them:
 *  - diffusers: "transformer." + the diffusers module names (transformer_blocks.N.attn.to_q, ...
 *    ff.net.0.proj, proj_in, context_embedder, norm_out.linear, ...) with lora_A / lora_B;
 *  - the original checkpoint's names (ComfyUI, ai-toolkit, the reference code): optional
 *    "diffusion_model." prefix, blocks.N.attn.qkv_proj, mlp.fc1, final_layer.video_out, ... with
 *    lora_A / lora_B or lora_down / lora_up (+ ".alpha"); peft's ".default." infix marks a
 *    DiffSynth-Studio file.
 * Row orders are the diffusers converter's: a fused qkv_proj LoRA holds [q; k; v] stacked (except
 * DiffSynth's, which is per-head interleaved like the released shards), diffusers' to_q/to_k/to_v
 * each hold one part, and diffusers' ff.net.0.proj holds fc1's halves swapped. Each is mapped onto
 * the released layout libh3 computes with (qkv_proj per-head interleaved, fc1 [gate; up]).
 * Scale of a module: the caller's scale times alpha / rank when the file has a ".alpha" for it or,
 * failing any, an "alpha" (or PDD's "lora_alpha") entry in its __metadata__; else 1 (alpha = rank).
 * The few-step formats (docs/few-step.md) add: ".lora_down" / ".lora_up" without ".weight" (the
 * PDD files); whole-parameter parts ".diff" (a weight delta, times the caller's scale), ".diff_b"
 * (a bias delta), ".set_weight" / ".set_bias" (replacements, applied before any delta), rows mapped
 * as the module's low-rank halves (FastVideo's FastH3); and a PDD bank of interval output heads
 * (proj_out / audio_proj_out [n, out, hidden], or ComfyUI's set_weight [n * out, hidden] on the
 * heads), applied per step (h3_lora_pdd_head). A file may declare its sigma grid (metadata
 * "h3ctl_schedule"; a PDD bank declares "pdd").
 */
#ifndef H3_LORA_H
#define H3_LORA_H

#include "core/host.h"
#include "core/internal.h"

typedef struct h3_lora h3_lora;

/*
 * Read n LoRA files (headers; the data is mapped when merged) and check every key against the
 * model's transformer: each must name a module the model has, in pairs whose shapes fit the
 * weight. A file with no LoRA weight, an unknown key, a missing half or a mismatched shape fails
 * with a one-line message naming the file and the key. scales may be NULL (1 each).
 */
H3_INTERNAL int h3_lora_open(h3_model *m, const char *const *paths, const float *scales, int n, h3_lora **out);
H3_INTERNAL void h3_lora_free(h3_lora *l);
/* Modules (weights) the set changes. */
H3_INTERNAL int h3_lora_targets(const h3_lora *l);

/*
 * The merged copy of weight `name` (rows x cols in dtype dt at w): *out = NULL when no LoRA
 * targets it; otherwise a new h3_alloc_aligned buffer holding W + sum of scale * (B A) mapped to
 * W's rows, computed in f32 and stored as *out_dt (BF16 for a BF16 weight, else F32).
 */
H3_INTERNAL int h3_lora_merge(h3_lora *l, h3_pool *pool, const char *name, const void *w, h3_dtype dt, int64_t rows,
                              int64_t cols, void **out, h3_dtype *out_dt);

/* The same for a 1-D weight (a bias) `name` of n floats, merged in place into v (f32): the
   whole-parameter parts (.diff_b, .set_bias) that target it. */
H3_INTERNAL int h3_lora_merge_vec(h3_lora *l, const char *name, float *v, int64_t n);

/* The schedule the files declare (metadata "h3ctl_schedule", or "pdd" for a PDD head bank), or NULL. */
H3_INTERNAL const char *h3_lora_schedule(const h3_lora *l);

/*
 * PDD output heads (alibaba-pai Acc LoRAs): the bank's interval count (0 = none), and the head of
 * one step from sigma to sigma_next of one modality (audio 0/1): the mean of the bank's interval
 * heads weighted by the sigma length each shares with the step, on the bank's grid
 * shift(linspace(1, 0, n + 1)) at shift 12 (video) or 3 (audio). W [rows, hidden] and bias [rows]
 * (rows = the head's outputs) are f32.
 */
H3_INTERNAL int h3_lora_pdd_intervals(const h3_lora *l);
H3_INTERNAL int h3_lora_pdd_head(h3_lora *l, int audio, double sigma, double sigma_next, float *W, float *bias);

#endif /* H3_LORA_H */
