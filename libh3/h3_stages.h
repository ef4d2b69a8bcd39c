/*
 * libh3 — the stage and parity entry points.
 *
 * h3.h is the contract of an embedder that renders videos (context, request, plan / prepare / step
 * / decode, progress and cancellation, errors, model information). This header adds what tests,
 * parity modules, benchmarks and tools call on top of it: the tokenizer, the text encoder, the
 * transformer's forward / denoise / layouts, the video and audio encoders and decoders, the
 * resampler, keyframe and reference helpers, benchmarks, the fp8 conversion, and the tensors a
 * parity check injects into a render (h3_parity). Everything declared here is exported from the
 * same shared library and follows h3.h's conventions (return codes, h3_last_error, threads, any
 * call order).
 */
#ifndef H3_STAGES_H
#define H3_STAGES_H

#include "h3.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * n floats to e4m3 bytes exactly as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
 * round to nearest even, magnitudes past 464 and infinities saturate to +-448 (0x7E / 0xFE), NaN
 * becomes 0x7F whatever its sign, +-0 and magnitudes up to 2^-10 become 0x00 / 0x80. The
 * conversion h3_quantize uses; exported for tests and tools.
 */
H3_API int h3_fp8_e4m3_from_f32(const float *x, int64_t n, uint8_t *out);

/*
 * Validate one safetensors file completely (header, dtypes, shapes, spans). Returns 0 when the
 * file is well formed, a negative H3_E* code otherwise. Used by fuzzing and `h3ctl check`.
 */
H3_API int h3_safetensors_check(const char *path);

/* Same, for a header held in memory: `buf` holds the whole file image of `len` bytes. */
H3_API int h3_safetensors_check_buffer(const void *buf, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                   */

/*
 * Byte-level BPE tokenizer read from a HF tokenizer.json of the Qwen2 family (NFC normalizer,
 * the Qwen2 split pattern, ByteLevel pre-tokenizer and decoder, added/special tokens). Other
 * configurations are refused with H3_E_UNSUPPORTED. A loaded tokenizer is read-only: any
 * number of threads may encode and decode with it at once.
 */
typedef struct h3_tokenizer h3_tokenizer;

/* Load tokenizer.json (HF format). NULL on failure (h3_last_error names the file and problem). */
H3_API h3_tokenizer *h3_tokenizer_load(const char *path);
H3_API void h3_tokenizer_free(h3_tokenizer *tok);

/*
 * Encode `len` bytes of UTF-8 as HF tokenizers does with add_special_tokens=False: the same ids
 * as Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids. Added and special
 * tokens written in the text are recognised. Writes up to `cap` ids; returns the total number
 * of ids (may exceed cap: call again with a larger buffer) or a negative H3_E_* code. Empty
 * input gives 0. Text that is not well-formed UTF-8 (overlong forms, surrogates, truncated
 * sequences) is refused with H3_E_INVALID and a message naming the first bad byte offset.
 */
H3_API int64_t h3_tokenize(h3_tokenizer *tok, const char *text, size_t len, int32_t *ids, int64_t cap);

/* Token id of an exact token string (added/special content, or a vocab entry in its
   byte-level spelling such as "\xc4\xa0the" for " the"), or -1. */
H3_API int32_t h3_token_id(h3_tokenizer *tok, const char *token);

/* Largest id + 1 over the vocab and the added tokens (151669 for Qwen3). */
H3_API int32_t h3_tokenizer_vocab_size(h3_tokenizer *tok);

/*
 * Decode ids back to bytes with the byte-level decoder; special tokens are included (like HF
 * decode(ids, skip_special_tokens=False)). The bytes are not NUL-terminated and may be invalid
 * UTF-8 when the ids cut a character (HF then shows U+FFFD). Returns the byte count (may exceed
 * cap) or a negative H3_E_* code (an id outside the vocabulary is H3_E_INVALID).
 */
H3_API int64_t h3_detokenize(h3_tokenizer *tok, const int32_t *ids, int64_t n, char *out, int64_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Text encoder                                                                                */
/*
 * MiniMax-H3 conditions on hidden_states[K] of its Qwen3-VL language model (K = config key
 * "minimax_h3_conditioning_layer", 50 for the release): the residual stream after decoder layer
 * K-1, before any final norm, exactly what transformers' Qwen3VLForConditionalGeneration returns
 * for a text-only prompt. Token ids are the tokenizer's ids without special tokens and without a
 * chat template. Layers are streamed from the shards one at a time (layers >= K are never read);
 * H3_TEXT_PREFETCH=0 in the environment turns the background prefetch of the next layer off
 * (results are bit-identical either way).
 */

/* Hidden size of the text encoder (the width of each output row), or a negative H3_E* code. */
H3_API int h3_text_hidden_size(h3_ctx *ctx);

/*
 * out[n * hidden] (f32, row-major [n, hidden]) = the conditioning hidden state for the n token
 * ids. n must be >= 1 (an empty prompt is refused, as transformers cannot encode one either) and
 * every id must lie in [0, vocab_size). Results are served from the context's prompt cache when
 * the same ids were encoded before with the same weights. Reports progress per layer through the
 * context's progress hook (phase "text_encoder"). Returns 0 or a negative H3_E* code; on failure
 * `out` holds unspecified values.
 */
H3_API int h3_text_encode(h3_ctx *ctx, const int32_t *ids, int n, float *out);

/*
 * Keyframe conditioning (FL2VA), as diffusers' MiniMaxH3FL2VATextEncoderStep builds it: for keyframe
 * k = 1..n_images (first frame, then last frame) the text "<Picture k>: ", then <|vision_start|>,
 * one <|image_pad|> per merged patch and <|vision_end|>; then the prompt (UTF-8, may be empty when
 * images are given). Each image rgb[i] is [heights[i]][widths[i]][3] uint8 RGB, row-major, already
 * on the render canvas; it goes through the Qwen3-VL image processor (smart_resize, bicubic
 * antialiased resize, normalisation; settings from the model's processor/preprocessor_config.json,
 * else Qwen3-VL's published values) and the vision tower, whose rows replace the placeholders;
 * the deepstack rows are added after the first language layers; positions are Qwen3-VL's 3-D
 * rotary ones. Progress phases "vision_encoder" (per tower block) and "text_encoder" (per layer).
 */

/* Rows the presentation has (its token count) for these image sizes, without reading pixels or
   running anything; or a negative H3_E* code (a size the processor refuses, an unusable prompt). */
H3_API int h3_text_image_rows(h3_ctx *ctx, const char *prompt, int n_images, const int *widths, const int *heights);

/*
 * out[n * hidden] (f32, [n, hidden]) = hidden_states[K] of the presentation, ids_out[n] its token
 * ids and tags_out[n] diffusers' per-row tags (1 text, 0 a vision block's row); ids_out and
 * tags_out may be NULL. Returns n (>= 1), or a negative H3_E* code: cap_rows < n is H3_E_INVALID
 * naming n (h3_text_image_rows tells it beforehand); an empty or oversized image is H3_E_INVALID.
 * Served from the prompt cache when the same ids, processor settings and image bytes were encoded
 * before. n_images = 0 encodes the prompt alone (the rows h3_text_encode gives for its ids).
 */
H3_API int h3_text_encode_images(h3_ctx *ctx, const char *prompt, int n_images, const uint8_t *const *rgb,
                                 const int *widths, const int *heights, float *out, int cap_rows, int32_t *ids_out,
                                 uint8_t *tags_out);

/*
 * The image processor alone (parity): pixel_values of one image, grid_h * grid_w rows of
 * patch_dim floats ([channel][time][py][px], rows in 2x2-merge-block order), exactly as
 * transformers' Qwen2VLImageProcessor returns them. grid_thw (may be NULL) gets (1, grid_h,
 * grid_w), patch_dim (may be NULL) the row width. Returns the number of floats, writing them only
 * when out is not NULL and cap (floats) holds them all (rgb may be NULL when out is NULL); or a
 * negative H3_E* code.
 */
H3_API int64_t h3_image_preprocess(h3_ctx *ctx, const uint8_t *rgb, int width, int height, float *out, int64_t cap,
                                   int32_t *grid_thw, int32_t *patch_dim);

/* ------------------------------------------------------------------------------------------ */
/* Transformer                                                                                 */
/*
 * The MiniMax-H3 DiT and its sampler, matching diffusers 0.42.1 (MiniMaxH3Transformer3DModel,
 * MiniMaxH3Scheduler and the modular pipeline's t2va layout). On the CPU the computation is f32
 * (BF16/F16 weights widened on the fly), the exact path; on CUDA the GEMMs and attention take bf16
 * weights and activations with f32 accumulation (fp8 with h3_options.precision), the residual
 * stream and the outputs staying f32. Latents are f32: video [C, T, H, W] (C = latents_dim, H/W in
 * latent pixels), audio [2, C_a, T_a] (stereo side, channel, time).
 */

/*
 * Sigma schedule of MiniMaxH3Scheduler.set_timesteps(steps) with the given shift, bit for bit.
 * `steps` counts sigma grid points including the terminal 0 (diffusers' num_inference_steps), so
 * a schedule drives (returned count - 1) model evaluations. sigmas needs room for `steps`
 * values, timesteps (t = 1 - sigma, may be NULL) for `steps - 1`. Returns the number of sigmas
 * (>= 2; fewer than `steps` only when the f32 shift collapses neighbouring points).
 */
H3_API int h3_sigma_schedule(int steps, double shift, float *sigmas, float *timesteps);

/*
 * A named sigma grid (h3_request.schedule): `steps` grid points (terminal 0 included) of video and
 * audio sigmas into video / audio (room for `steps` each), "h3" using the given shifts (the
 * model's), the others their own. Returns the count, or H3_E_INVALID for an unknown name.
 * h3_schedule_name(i) is the i-th known name, NULL past the last.
 */
H3_API int h3_schedule_sigmas(const char *name, int steps, double shift_video, double shift_audio, float *video,
                              float *audio);
H3_API const char *h3_schedule_name(int i);

/*
 * Standard-normal noise from libh3's counter-based generator: out[i] = element offset + i of
 * stream `stream` under `seed` (Philox4x32-10 + Box-Muller, documented in libh3/core/schedule.c).
 * Any element is reproducible on its own. The engine uses stream 0 for video noise in
 * [C, T, H, W] order and stream 1 for audio noise in [2, C_a, T_a] order.
 */
H3_API int h3_noise_fill(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);

/*
 * The packed t2va layout [text | keyframe rows | audio | video] of a request, as diffusers'
 * build_packed_sequence builds it: n_text prompt rows (text_tags: 1 text / 0 vision span per
 * row, or NULL for all text), the generated latent geometry, and optional FL2VA keyframe anchors
 * (0 = first frame, 1 = last frame). Returns the sequence length L (negative on error). Output
 * buffers may be NULL: position_ids [L, 3] (float64), token_tags [L], text_indices [n_text],
 * video_indices [anchors*rows_per_frame + frames*rows_per_frame], audio_indices [2 * T_a].
 */
H3_API int64_t h3_dit_packed_layout(h3_ctx *ctx, int64_t n_text, const uint8_t *text_tags, int latent_frames,
                             int latent_height, int latent_width, int audio_latents, const int32_t *anchors,
                             int n_anchors, double *position_ids, int64_t *token_tags, int64_t *text_indices,
                             int64_t *video_indices, int64_t *audio_indices);

/*
 * The packed ref2va layout [text | reference blocks | target audio | target video], as diffusers'
 * build_ref2va_packed_sequence builds it. refs: n_refs (1 to 12) rows of 5 int32 in request order:
 * kind (0 image, 1 video, 2 audio), latent frames, latent height, latent width (0 for audio), audio
 * latents per side (an audio clip, a video's soundtrack, 0 for none). Outputs as
 * h3_dit_packed_layout (video/audio_indices: reference rows first), plus roles [L] (0 generated
 * video and text, 1 generated audio, 2 visual reference: t = max(t_video, 0.999), 3 reference
 * audio: t = 1.0) and n_condition [2] (reference video rows, reference audio rows). Returns L.
 */
H3_API int64_t h3_dit_ref2va_layout(h3_ctx *ctx, int64_t n_text, const uint8_t *text_tags, const int32_t *refs,
                                    int n_refs, int latent_frames, int latent_height, int latent_width,
                                    int audio_latents, double *position_ids, int64_t *token_tags,
                                    int64_t *text_indices, int64_t *video_indices, int64_t *audio_indices,
                                    uint8_t *roles, int64_t *n_condition);

/*
 * One transformer forward with diffusers' arguments (batch 1): hidden_states [num_video_rows,
 * latents_dim * patch_h * patch_w] (conditioning rows first), audio_hidden_states
 * [num_audio_rows, audio_latents_dim], encoder_hidden_states [num_text_rows, text_dim], timestep
 * [num_timesteps] (distinct values in [0, 1]), timestep_indices / token_tags [seq_len],
 * position_ids [seq_len, 3] (float64), video/audio/text_indices. Writes the velocities sample
 * [num_video_rows, patch] and audio_sample [num_audio_rows, audio_latents_dim].
 */
H3_API int h3_dit_forward(h3_ctx *ctx, const float *hidden_states, int64_t num_video_rows,
                          const float *audio_hidden_states, int64_t num_audio_rows,
                          const float *encoder_hidden_states, int64_t num_text_rows, const float *timestep,
                          int32_t num_timesteps, const int64_t *timestep_indices, const int64_t *token_tags,
                          const double *position_ids, int64_t seq_len, const int64_t *video_indices,
                          const int64_t *audio_indices, const int64_t *text_indices, float *sample,
                          float *audio_sample);

/*
 * The t2va denoising loop as the engine runs it: the prompt is refined once, the AdaLN
 * modulation of every step is precomputed (then the adaln_proj weights are released), and each
 * step is one forward plus the Euler update of both modalities with their own schedules (video
 * and audio shift from model_index.json, default 12 and 3). `steps` = sigma grid points as in
 * h3_sigma_schedule. latents [C, T, H, W] and audio_latents [2, C_a, T_a] hold the initial noise
 * on entry and the denoised latents on return (audio_latents_io). Returns the number of model
 * evaluations.
 */
H3_API int h3_dit_denoise(h3_ctx *ctx, const float *prompt_embeds, int64_t n_text, const uint8_t *text_tags,
                          int latent_frames, int latent_height, int latent_width, int audio_latents, int steps,
                          float *latents, float *audio_latents_io);

/*
 * Transformer profile as a JSON object owned by the context (valid until the next call):
 * adaln_weight_bytes (bytes of the adaln_proj tensors, released after the precompute),
 * adaln_table_bytes (the precomputed tables that replace them), adaln_released, steps, kernels,
 * threads and timings in milliseconds (open, refine, prepare, forward last/min/mean), and the
 * transformer's work since the last prepared schedule: "evaluations" (forwards run by steps),
 * "block_runs" (forwards that ran the block stack; fewer with core reuse), "skipped_steps" (steps
 * that ran no forward), "layers_run" (blocks per forward) and "transformer_ms" (time in the steps,
 * cache tests included).
 */
H3_API const char *h3_dit_profile_json(h3_ctx *ctx);

/*
 * Throughput of libh3's f32 GEMM (the kernel every projection runs on) for Y[m,n] = X[m,k] W^T
 * on the context's threads: best GFLOP/s over `reps` timed runs (negative H3_E_* on error). For
 * benchmarks and profiles: the machine's achievable peak next to a stage's achieved rate.
 */
H3_API double h3_bench_gemm(h3_ctx *ctx, int64_t m, int64_t n, int64_t k, int reps);

/*
 * The arithmetic peak of the active kernel variant on the context's threads: every thread runs
 * register-only multiply-adds (12 independent chains of 8 lanes) for about 0.2 s; best GFLOP/s
 * over `reps` runs (negative H3_E_* on error). No GEMM can beat it; benchmarks report a stage's
 * rate as a share of it.
 */
H3_API double h3_bench_fma_peak(h3_ctx *ctx, int reps);

/* ------------------------------------------------------------------------------------------ */
/* Video decoder                                                                               */
/*
 * Decodes video latents [C, T, h, w] (normalised, as the DiT produces them) into frames, exactly
 * as diffusers' MiniMaxH3VideoDecodeStep does: latents * latents_std + latents_mean, the video
 * VAE's decode() (temporal windows of 7 latents cross-faded over 5 frames, each window in spatial
 * tiles blended over their overlaps), ImageNet de-normalisation, clamp to [0, 1] and uint8
 * rounding round(x * 255) (half to even).
 *
 * Output: F x H x W frames with H = h * s, W = w * s (s the spatial ratio, 16 for the release) and,
 * for the release's clip geometry, F = 17n + 5 for T = 5n + 2 (other T are padded and cut as
 * diffusers does; T >= 3). h3_video_decode_shape gives the shape for any model. Memory stays
 * bounded by one tile and one window: tiles are decoded one at a time and blended straight into
 * the caller's buffers (h3_video_decode_workspace tells how much).
 */

/* Flags of h3_video_decode_opts.flags. */
#define H3_VIDEO_RAW 1u     /* `pixels` receives vae.decode()'s sample: [3, F, H, W], ImageNet-
                               normalised, unclamped (the rgb output is unaffected) */
#define H3_VIDEO_UNTILED 2u /* decode each window as a single tile (diffusers' disable_tiling();
                               memory then grows with the canvas) */

typedef struct h3_video_decode_opts {
    uint32_t struct_size;    /* sizeof(h3_video_decode_opts) */
    int32_t tile_px;         /* spatial tile size in pixels, a multiple of 16; 0 = the config's
                                vae_tile_size (256). A canvas side not larger is one tile. */
    int32_t overlap_px;      /* minimum tile overlap in pixels, a multiple of 16 and smaller than
                                the tile; 0 = the config's vae_tile_overlap_min (64) */
    uint32_t flags;          /* H3_VIDEO_* */
    h3_progress_fn progress; /* optional; NULL = the context's hook (h3_set_progress). Phase
                                "video_decode": 0, then one unit per (window, tile). */
    void *user;              /* passed to progress */
} h3_video_decode_opts;

/* Fill *o with defaults (config tiling, no callback). */
H3_API void h3_video_decode_opts_default(h3_video_decode_opts *o);

/* Output shape for T latent frames of h x w: frames, height and width in pixels. */
H3_API int h3_video_decode_shape(h3_ctx *ctx, int T, int h, int w, int *frames, int *height, int *width);

/*
 * Bytes of working memory h3_video_decode allocates for this request, weights and the caller's
 * buffers excluded (the mapped weights are reported by h3_memory_estimate_json). Negative H3_E*
 * on an invalid request. `opts` may be NULL (defaults).
 */
H3_API int64_t h3_video_decode_workspace(h3_ctx *ctx, int T, int h, int w, const h3_video_decode_opts *opts);

/*
 * Decode latents [C, T, h, w]; C must be the model's latent channel count (checked). `rgb`
 * (optional) receives uint8 frames [F, H, W, 3]. `pixels` (optional) receives float frames
 * [F, H, W, 3] in [0, 1] (the decode step's output_type="np" values), or with H3_VIDEO_RAW the
 * float sample of vae.decode() as [3, F, H, W]. At least one of them must be given. On the CPU
 * the weights are mapped for the call and released after it; on a GPU they are uploaded (bf16) at
 * the first decode and kept on the device until h3_free (or until the transformer needs the
 * memory), so later decodes and renders read no weights. Results do not depend on the thread
 * count. `opts` may be NULL.
 */
H3_API int h3_video_decode(h3_ctx *ctx, const float *latents, int C, int T, int h, int w,
                           const h3_video_decode_opts *opts, uint8_t *rgb, float *pixels);

/* ------------------------------------------------------------------------------------------ */
/* Video encoder                                                                               */
/*
 * The video VAE's encoder, exactly as diffusers' AutoencoderKLMiniMaxH3.encode: the causal 3-D
 * CNN and quant_conv, in spatial tiles blended over their overlaps (tiling on, the config's
 * vae_tile_size / vae_tile_overlap_min, 256 / 64 px, as diffusers ships it) and temporal clips:
 * one frame -> one latent frame (the clip is that frame alone); more frames are encoded in
 * clip_length-frame clips (17; the last padded by repeating its last frame) and the last
 * token_drop (3) latent frames of the whole are dropped: 17n + 5 frames -> 5n + 2 latent frames,
 * one 17-frame clip -> 2. Needs the encoder weights (encoder.*, quant_conv.*) in
 * video_vae/source; a model without them fails here with "model has no video VAE encoder
 * weights" (rendering from text never reads them). Results do not depend on the thread count.
 */

/* Latent shape [C, latent_frames, h, w] of an encode of T frames of H x W pixels with this tiling
   (tile_px / overlap_px as in h3_video_decode_opts, 0 = the config's; flags 0 or
   H3_VIDEO_UNTILED). Any output may be NULL. Validates the request. */
H3_API int h3_video_encode_shape(h3_ctx *ctx, int T, int H, int W, int tile_px, int overlap_px, uint32_t flags,
                                 int *C, int *latent_frames, int *h, int *w);

/*
 * Encode pixels [3, T, H, W] f32, normalised as diffusers feeds vae.encode (ImageNet: (rgb / 255
 * - mean) / std), into the posterior's mean and log-variance [C, latent_frames, h, w] (the
 * log-variance clamped to [-30, 20]); either output may be NULL, not both. Progress phase
 * "video_encode" through the context's hook: one unit per (clip, tile).
 */
H3_API int h3_video_encode(h3_ctx *ctx, const float *pixels, int T, int H, int W, int tile_px, int overlap_px,
                           uint32_t flags, float *mean, float *logvar);

/*
 * A visual condition as diffusers' encode_vae_condition computes it (the FL2VA keyframe latent):
 * rgb uint8 [T, H, W, 3] at the target size -> ImageNet normalisation -> encode (config tiling)
 * -> posterior sample mean + exp(logvar / 2) * eps -> rounded through float16 -> (z -
 * latents_mean) / latents_std, into out [C, latent_frames, h, w]. eps [C, latent_frames, h, w]
 * is the posterior noise (diffusers draws it from a CPU generator seeded 42); NULL draws libh3's
 * noise (h3_noise_fill) under `seed`, stream 16, from offset 0.
 */
H3_API int h3_video_encode_condition(h3_ctx *ctx, const uint8_t *rgb, int T, int H, int W, const float *eps,
                                     uint64_t seed, float *out);

/* ------------------------------------------------------------------------------------------ */
/* Audio encoder                                                                               */
/*
 * The audio VAE's encoder, exactly as diffusers' AutoencoderKLMiniMaxH3Audio.encode(...)
 * .latent_dist.mode(): the waveform right-padded with zeros to a multiple of the hop (the
 * product of encoder_rates, 800), the DAC trunk, the causal-attention pre_block and mean_proj.
 * The autoencoder is mono: each channel is encoded as its own batch item (a stereo reference is
 * batch 2). Needs the encoder weights (encoder.*, pre_block.*, mean_proj.*) in audio_vae/; a
 * model without them fails here with "model has no audio VAE encoder weights". CPU backend;
 * results do not depend on the thread count. Progress phase "audio_encode", one unit per
 * (channel, encoder block).
 */

/* Latent shape of an encode of `samples` samples per channel: C latent channels, `frames`
   latent frames. Either output may be NULL. Validates samples (>= 1). */
H3_API int h3_audio_encode_shape(h3_ctx *ctx, int64_t samples, int *C, int64_t *frames);

/* Encode pcm [channels][samples] f32 (channels 1 or 2, at the config's sample rate) into the
   posterior mean [channels][C][frames]; cap = floats mean holds. */
H3_API int h3_audio_encode(h3_ctx *ctx, const float *pcm, int channels, int64_t samples, float *mean,
                           int64_t cap);

/* Ref2VA's conditioning rows of an encoded audio reference (MiniMaxH3Ref2VAEncodeStep): row
   (ch * frames + t) = (mean[ch][:, t] - latents_mean) / latents_std, channel-major (all left rows,
   then all right rows); rows [channels * frames][C], cap floats. */
H3_API int h3_audio_latent_rows(h3_ctx *ctx, const float *mean, int channels, int64_t frames, float *rows,
                                int64_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Audio decoder                                                                               */

/*
 * Audio VAE geometry from the model's audio_vae/ configs: latent channels per stereo side,
 * output sample rate, and the decoder hop (product of the upsampling rates: samples per latent
 * frame). Any output pointer may be NULL. Returns 0 or a negative H3_E* code.
 */
H3_API int h3_audio_info(h3_ctx *ctx, int *latent_channels, int *sample_rate, int *hop);

/* PCM samples per stereo side that `latent_frames` latent frames decode to (negative H3_E* on
   failure). For the released configuration this is latent_frames * hop. */
H3_API int64_t h3_audio_samples(h3_ctx *ctx, int latent_frames);

/*
 * Decode audio latents into stereo PCM, as diffusers' MiniMaxH3AudioDecodeStep does.
 *  latents: f32 [2, channels, latent_frames], normalised (as the DiT produces them), left side
 *           first; `channels` must equal the VAE's latent channels.
 *  pcm:     f32 [2, samples] (samples = h3_audio_samples), left then right, clipped to [-1, 1],
 *           at the sample rate h3_audio_info reports; `pcm_capacity` is its size in floats.
 *  progress (may be NULL) is called between convolutions with phase "audio_decode" and the
 *  permille of work done (total 1000); non-zero cancels. On the CPU the decoder weights are read
 *  for this call and released before it returns; on a GPU they are kept on the device after the
 *  first call, as h3_video_decode keeps its own.
 */
H3_API int h3_audio_decode(h3_ctx *ctx, const float *latents, int channels, int latent_frames, float *pcm,
                           int64_t pcm_capacity, h3_progress_fn progress, void *user);

/* ------------------------------------------------------------------------------------------ */
/* Audio resampling                                                                            */

/*
 * Resample planar f32 audio pcm [channels][samples] from in_rate to out_rate (integers, 4000 ..
 * 384000 Hz; channels 1 .. 64; samples >= 1) into out [channels][*out_samples], as
 * torchaudio.functional.resample does with its defaults (sinc_interp_hann, lowpass_filter_width 6,
 * rolloff 0.99, rates reduced by their gcd): *out_samples = ceil(out_rate * samples / in_rate),
 * output sample 0 on input sample 0, zeros beyond both ends; equal rates copy. Deterministic (one
 * thread, a fixed summation order). out NULL: a size query that only sets *out_samples.
 * out_capacity: floats out holds. Needs no context; this is the resampler Ref2VA runs on an audio
 * reference at another rate than the audio VAE's.
 */
H3_API int h3_audio_resample(const float *pcm, int channels, int64_t samples, int in_rate, int out_rate, float *out,
                             int64_t out_capacity, int64_t *out_samples);

/* ------------------------------------------------------------------------------------------ */
/* Render helpers and parity injections                                                        */

/*
 * Tensors a parity check injects into a render instead of libh3's own computation (all optional,
 * NULL = libh3's). A request carries them through h3_request.parity, NULL for every render an
 * embedder makes. They ride on the request rather than on a call of their own so that h3_plan and
 * h3_prepare see the same request and no injection outlives it: a separate call would leave state
 * on the context between calls, which the any-order rule would then have to police. struct_size
 * versions this struct as h3_request's versions that one: fields past it keep their defaults.
 * Shapes in latent units of the canvas, [C, 1, H/16, W/16] unless said otherwise:
 *  video_noise [C, T, H/16, W/16] (latent order) and audio_noise [2, C_a, T_a]: the initial noise
 *    (default: libh3's counter-based generator under the request's seed, streams 0 and 1);
 *  first_noise / last_noise: the conditioning noise eps of each keyframe, mixed as
 *    0.999 z + 0.001 eps (default: libh3's generator, stream 2 + k for condition k in packed
 *    order, under `seed`);
 *  first_posterior_noise / last_posterior_noise: the noise the encoder samples its posterior
 *    with (default: seed 42, stream 16, the same for every request, as diffusers samples each
 *    keyframe under a fresh generator seeded 42);
 *  first_latent / last_latent: normalised conditioning latents used instead of encoding the
 *    keyframe (then the keyframe image is needed only by the text side); a keyframe is present
 *    when its image or its latent is given, and width/height must then be given;
 *  text_states [text_rows, text hidden] with text_tags [text_rows] (1 text, 0 vision rows;
 *    NULL = all text): the conditioning used instead of tokenizing and encoding the prompt
 *    (diffusers' prompt_embeds and text_token_tags); `prompt` is then ignored;
 *  reference_noise / reference_posterior_noise: NULL, or n_references pointers (NULL entries
 *    allowed; audio references are never noised and must have NULL) to an image or video
 *    reference's draws, both [C, t, h, w] at its encoding size (h3_reference_size /
 *    h3_reference_video_size; t = 1 for an image): the conditioning noise eps (else libh3's
 *    stream 2 + k of the request's seed, k = its index among the visual references) and the
 *    encoder's posterior noise (else seed 42, stream 16, as for keyframes).
 */
typedef struct h3_parity {
    uint32_t struct_size; /* sizeof(h3_parity) */
    const float *video_noise, *audio_noise;
    const float *first_noise, *last_noise;
    const float *first_posterior_noise, *last_posterior_noise;
    const float *first_latent, *last_latent;
    const float *text_states;
    const uint8_t *text_tags;
    int32_t text_rows;
    const float *const *reference_noise;
    const float *const *reference_posterior_noise;
} h3_parity;

/*
 * The size an image reference of image_width x image_height is encoded and shown to the text
 * encoder at (diffusers' MiniMaxH3Ref2VASetupStep): its short edge scaled to the model's
 * reference edge (2048 for the release; a model_index.json "h3ctl" block may give
 * "reference_image_short_edge", else 2048 scaled by canvas_short_edge / 768), sides rounded
 * half-to-even to the canvas multiple; upscaling included, no area cap.
 */
H3_API int h3_reference_size(h3_ctx *ctx, int image_width, int image_height, int *width, int *height);

/*
 * A video reference of `frames` frames of video_width x video_height at fps in a render of
 * render_frames frames (the count h3_plan reports): its canvas (width x height), its frames at
 * 24 fps after the truncation (what the text encoder reads) and its latent frames (the VAE's
 * encoding of its first 17n + 5 of them). Any output may be NULL. Errors as a render with it.
 */
H3_API int h3_reference_video_size(h3_ctx *ctx, int video_width, int video_height, int frames, double fps,
                                   int render_frames, int *width, int *height, int *frames_24,
                                   int *latent_frames);

/* The prompt's token ids (copies up to cap); returns their count. */
H3_API int h3_prompt_tokens(h3_ctx *ctx, int32_t *ids, int cap);

/* The video as floats [frames, height, width, 3] in [0, 1] before the uint8 rounding (what
   diffusers' decode step returns with output_type="np"); for parity checks. */
H3_API int h3_decode_video_f32(h3_ctx *ctx, float *pixels);

/*
 * FL2VA keyframe preprocessing, as diffusers' MiniMaxH3ResizeStep (what h3_prepare does with
 * h3_request.first_frame / last_frame):
 * h3_keyframe_canvas: the canvas (multiples of 32 for H3) a keyframe of image_width x
 *   image_height implies on this model: diffusers' resolve_canvas_size with the model's canvas
 *   rule (the release: short edge 768, area at most 768 x 1344 before rounding; a model's
 *   model_index.json "h3ctl" block may set canvas_short_edge / canvas_max_pixels, else the short
 *   edge of its default canvas and its max_pixels apply). Refuses empty images, more than 64
 *   megapixels and aspects outside 1:4 .. 4:1.
 * h3_keyframe_resize: uint8 RGB [height][width][3] onto out [out_height][out_width][3] with PIL's
 *   Image.resize(LANCZOS) arithmetic, bit for bit: stretched (cover = 0) or cover-cropped
 *   (cover = 1: scaled by max(out_w / w, out_h / h) with round()ed sides, centred window).
 */
H3_API int h3_keyframe_canvas(h3_ctx *ctx, int image_width, int image_height, int *width, int *height);
H3_API int h3_keyframe_resize(const uint8_t *rgb, int width, int height, int out_width, int out_height, int cover,
                              uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif /* H3_STAGES_H */
