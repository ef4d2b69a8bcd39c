/*
 * libh3 — native inference engine for MiniMax-H3 (joint video + stereo-audio diffusion).
 *
 * This is the only header other programs include. Everything declared here is exported from
 * the shared library and works; nothing is declared ahead of its implementation.
 *
 * Conventions
 *  - Functions that can fail return 0 on success and a negative H3_E* code on failure (or NULL
 *    for constructors). The message of the most recent failure on the calling thread is returned
 *    by h3_last_error(); it names the file and the problem in one line.
 *  - Threads: a context (h3_ctx) is used by one thread at a time. Calls on one context from
 *    two threads at once must be serialised by the caller (the Python Engine holds a lock);
 *    different contexts may run on different threads at once. A tokenizer is read-only after
 *    h3_tokenizer_load and may be shared. h3_last_error is per thread. Progress callbacks run
 *    on the calling thread, inside the call.
 *  - Any sequence of calls on a live context is safe: a call that does not fit the context's
 *    state (a step before a prepare, a decode before the last step, a step after the public
 *    transformer entry points replaced the prepared request's transformer state) returns
 *    H3_E_INVALID with a message and leaves the context usable.
 *  - All tensors crossing the API are dense, row-major, little-endian.
 */
#ifndef H3_H
#define H3_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define H3_API __declspec(dllexport)
#else
#define H3_API __attribute__((visibility("default")))
#endif

#define H3_VERSION_MAJOR 0
#define H3_VERSION_MINOR 1
#define H3_VERSION_PATCH 0

/* Error codes (negated on return). */
enum {
    H3_OK = 0,
    H3_E_INVALID = 1,   /* bad argument or impossible request */
    H3_E_IO = 2,        /* file missing, unreadable or truncated */
    H3_E_FORMAT = 3,    /* malformed safetensors / JSON / config */
    H3_E_SCHEMA = 4,    /* tensor missing, or wrong dtype or shape */
    H3_E_NOMEM = 5,     /* allocation failed */
    H3_E_CANCELLED = 6, /* a callback asked to stop */
    H3_E_UNSUPPORTED = 7
};

/* Version string, e.g. "0.1.0". */
H3_API const char *h3_version(void);

/* Message of the last failure on this thread ("" if none). Valid until the next failing call. */
H3_API const char *h3_last_error(void);

/* CPU features the engine dispatches on at run time, e.g. "avx2 fma f16c" or "neon". */
H3_API const char *h3_cpu_features(void);

/* ------------------------------------------------------------------------------------------ */
/* Context                                                                                     */

typedef struct h3_ctx h3_ctx;

typedef struct h3_options {
    uint32_t struct_size; /* sizeof(h3_options): lets older callers keep working */
    int32_t threads;      /* worker threads; 0 = number of online CPUs */
    uint32_t flags;       /* H3_OPT_* */
    int32_t device;       /* H3_DEVICE_*: where the transformer and sampler run */
    int32_t device_index; /* GPU ordinal for H3_DEVICE_CUDA / AUTO (default 0) */
    int32_t precision;    /* H3_PRECISION_*: how GEMM weights are held (default: as the backend does) */
    /*
     * Bytes the transformer's GEMM weights may hold on the device (the refiner, projections and
     * heads, the blocks that stay, and the slots the others stream through). 0 = auto: every block
     * resident when the weights fit the GPU's free memory with 8 GiB to spare (the CPU always keeps
     * them: they are page-cache backed mappings), else streamed within the free memory less that.
     * Below the transformer's size, the blocks that do not fit stay in host memory (a GPU: pinned
     * copies of their device form; the CPU: the shards, read with pread into two slots) and move
     * into a ring of two slots while the previous block computes. Results are byte-identical to
     * the resident path. A budget below the other weights plus two slots fails the call that opens
     * the transformer (h3_prepare, h3_dit_*) with the sizes; on the CPU a budget cannot be combined
     * with LoRA or int8. The text encoder streams its layers on its own (it holds two at a time).
     */
    int64_t vram_bytes;
    /*
     * Pre-quantised fp8 weights (a file h3_quantize / `h3ctl quantize` wrote from this model), or
     * NULL. With precision H3_PRECISION_FP8 the main blocks' GEMM weights are read from it instead
     * of being quantised at load; the render is byte-identical (resident or streamed under
     * vram_bytes). h3_init opens and checks it before any work and fails with the reason: a file
     * made from another checkpoint (its recorded identity differs from the model's), another format
     * or precision, a missing tensor or a wrong shape or dtype, a truncated file, precision other
     * than fp8, and (as for fp8 itself) a device that cannot run fp8. LoRA files cannot be merged
     * into it (the transformer's open says so). The path is copied: the string may go after h3_init.
     */
    const char *quantized_path;
    /*
     * Single files that replace a component's weights (ComfyUI's repackages and files like them:
     * original MiniMax names, bare or under `model.diffusion_model.`; bf16, pruned, fp8_scaled,
     * int8 / int8_convrot; see docs/single-files.md), or NULL for the model directory's own. The
     * model directory still gives every config (h3ctl passes its copy of the release's configs when
     * the user has only single files). h3_init reads each file's header and checks it against its
     * config before any work: a file of another model or component, a LoRA, a truncated file, an
     * unknown or unsupported quantisation (nvfp4) fail with one line. tokenizer_dir: a folder holding
     * tokenizer.json (the official tokenizer/), for a model directory without one. Copied by h3_init.
     */
    const char *transformer_path;
    const char *text_encoder_path;
    const char *video_vae_path;
    const char *audio_vae_path;
    const char *tokenizer_dir;
} h3_options;

/*
 * Weight precision of the transformer's block GEMMs (h3_options.precision).
 * DEFAULT is the exact path: f32 compute over the stored weights on the CPU, bf16 weights on a GPU.
 * FP8: e4m3 weights with one f32 scale per output channel and per-token e4m3 activations
 * (cuBLASLt's fp8 GEMMs; CUDA on compute capability 8.9+ only). INT8: weight-only int8 with one f32
 * scale per output channel, f32 activations (the CPU backend only). A precision the chosen backend
 * cannot run fails h3_init with the reason, before any work.
 * Both reduced precisions apply to the main transformer blocks' four GEMM weights (qkv, out, fc1, fc2),
 * quantised as they load (fp8: or read, the same bytes, from a file h3_quantize wrote: see
 * h3_options.quantized_path); every other weight, and the text encoder (its layers streamed as stored),
 * keep the exact path. INT8 on the CPU: s = max|w| / 127 per output channel, q = w / s rounded to
 * nearest even; the GEMM gives the bits of the f32 GEMM over the weights (float)q * s.
 */
#define H3_PRECISION_DEFAULT 0
#define H3_PRECISION_FP8 1
#define H3_PRECISION_INT8 2

/*
 * Use the Ref2VA partition instead of FL2VA when the directory holds both. Ref2VA/ may be the
 * shared-weight form (h3-tiny's): only transformer/ of its own, whose model.safetensors holds the
 * tensors the Ref2VA fine-tune changed and whose index maps the others to
 * "../../FL2VA/transformer/<file>" (only the mapped tensors are taken from that file; no other
 * name may leave the folder). Any of text_encoder/, tokenizer/, video_vae/, audio_vae/ that
 * Ref2VA/ lacks is FL2VA's. Ref2VA/transformer must exist.
 */
#define H3_OPT_REF2VA 1u
/*
 * Exact slow paths that every speed trick keeps (each has an environment override that h3_init
 * reads, and only h3_init: the variable set to 1 sets the flag, set to 0 clears it):
 *  H3_OPT_DIT_PER_STEP      AdaLN modulation computed from the adaln_proj weights at every step
 *                           instead of precomputed for the schedule (H3_DIT_PRECOMPUTE=0)
 *  H3_OPT_KEEP_ADALN        keep the adaln_proj weights after the precompute (H3_DIT_KEEP_ADALN=1)
 *  H3_OPT_NO_TEXT_PREFETCH  read text-encoder layers synchronously (H3_TEXT_PREFETCH=0)
 *  H3_OPT_DROP_PAGE_CACHE   drop the page cache when a phase releases its weights
 *                           (H3_DROP_PAGE_CACHE=1)
 *  H3_OPT_STAGES_CPU        on a GPU device, keep the text encoder and both decoders on the CPU:
 *                           their exact f32 path, as on a CPU context (H3_STAGES_CPU=1); the
 *                           transformer and the sampler stay on the GPU
 * Results are identical with and without each of the first four; H3_OPT_STAGES_CPU trades the
 * GPU's bf16 GEMMs of those stages for the CPU's f32 (it changes nothing on a CPU context).
 * H3_NO_SIMD=1 (baseline-ISA CPU kernels) is process-wide and read once, at the first kernel call.
 */
#define H3_OPT_DIT_PER_STEP 2u
#define H3_OPT_KEEP_ADALN 4u
#define H3_OPT_NO_TEXT_PREFETCH 8u
#define H3_OPT_DROP_PAGE_CACHE 16u
#define H3_OPT_STAGES_CPU 32u
/*
 * fp8 attention (a speed switch, not an exact path; environment: H3_FP8_ATTENTION=1/0): the main
 * transformer blocks' self-attention runs as cuDNN's fp8 SDPA on Hopper and newer (compute
 * capability 9.0+, cuDNN 9.1+). Q, K and V are quantised to e4m3 with one f32 scale per tensor
 * (max|x| / 448), the softmax probabilities enter the second product as e4m3 scaled by 448, and the
 * output comes back through e4m3 with V's scale before it is widened to bf16 for the out
 * projection. Independent of h3_options.precision (bf16 or fp8 weights). Deterministic like the
 * other GPU paths. Refused at h3_init, with the reason, on a context that cannot run it (the CPU, an
 * older GPU, no cuDNN). The refiner, the text encoder and the decoders keep their attention.
 */
#define H3_OPT_FP8_ATTENTION 64u

/*
 * Devices. AUTO runs on CUDA when the CUDA backend was built (libh3_cuda next to libh3) and a
 * GPU of compute capability 8.0 or newer answers, else on the CPU. CUDA fails h3_init with a
 * one-line reason when that is not so. On CUDA the text encoder of text prompts, the transformer and
 * the sampler, and both decoders run on the GPU (H3_OPT_STAGES_CPU keeps the text encoder and the
 * decoders on the CPU; keyframe prompts are encoded on the CPU).
 */
#define H3_DEVICE_AUTO 0
#define H3_DEVICE_CPU 1
#define H3_DEVICE_CUDA 2

/* Fill *o with defaults (all cores, FL2VA, device auto). */
H3_API void h3_options_default(h3_options *o);

/*
 * The backends this build of libh3 has and what they find, as a JSON object owned by the library
 * (valid until the next call of this function):
 * {"cpu": {"available": true, "kernels": "avx2", "features": "x86-64 avx2 fma f16c"},
 *  "cuda": {"built": true|false, "available": true|false, "device": "cuda (NVIDIA H200, sm_90,
 *  139.8 GiB)", "compute_capability": "9.0", "memory_bytes": N, "free_bytes": N, "fp8_attention": true|false,
 *  "fp8_attention_reason": "why not" (only when false), "reason": "why
 *  not available" (only when not available)}}. Initialises the CUDA driver when the backend is
 * built; not thread-safe (call it once, from one thread).
 */
H3_API const char *h3_backends_json(void);

/* The backend a context computes the transformer on: its name ("cpu", "cuda") and a one-line
   description (device, memory, kernels). Owned by the context. */
H3_API const char *h3_device_name(h3_ctx *ctx);
H3_API const char *h3_device_description(h3_ctx *ctx);

/*
 * Peak device memory in use on the context's GPU, in bytes, since the last reset (reset != 0
 * starts a new interval at the current use; the first interval starts when the GPU is opened).
 * The CUDA backend samples cudaMemGetInfo's total - free after each of its allocations, so the
 * figure counts the CUDA context, library workspaces and other processes on the same GPU.
 * Returns 1 with *peak_bytes set on a GPU context, 0 with *peak_bytes = 0 on a CPU-only one (the
 * process's peak RSS is the measure there), a negative H3_E_* code on error. Cheap enough to call
 * from a progress callback (it only reads the counter and the driver's free memory).
 */
H3_API int h3_device_memory_peak(h3_ctx *ctx, int reset, uint64_t *peak_bytes);
/* Where the text encoder (text prompts) and the two decoders run: "cuda" on a CUDA context, "cpu" on
   a CPU one or with H3_OPT_STAGES_CPU. Owned by the library. */
H3_API const char *h3_stages_device(h3_ctx *ctx);

/*
 * Open a model directory: the official MiniMaxAI/MiniMax-H3 layout (a root holding FL2VA/ and
 * optionally Ref2VA/, or one partition folder directly). Reads configs and safetensors headers
 * only; no tensor data is touched. Components that are absent are allowed: a stage that needs
 * one fails when it runs. Returns NULL on failure (see h3_last_error).
 */
H3_API h3_ctx *h3_init(const char *model_dir, const h3_options *options);
H3_API void h3_free(h3_ctx *ctx);

/* Threads the context computes with. */
H3_API int h3_threads(const h3_ctx *ctx);

/*
 * Progress and cancellation. Long stages call `fn` on the calling thread between units of work
 * (e.g. after each text-encoder layer), with `phase` naming the stage ("text_encoder") and
 * done/total counting units; done = 0 is reported before the first unit. Returning non-zero
 * cancels: the running call stops at that point and fails with H3_E_CANCELLED. fn = NULL removes
 * the hook. The hook belongs to the context and stays set until changed.
 */
typedef int (*h3_progress_fn)(void *user, const char *phase, int done, int total);
H3_API void h3_set_progress(h3_ctx *ctx, h3_progress_fn fn, void *user);

/*
 * Write the fp8 weights of a model's transformer to one safetensors file, once, on the CPU (no GPU
 * needed), for h3_options.quantized_path. The transformer is FL2VA's, or Ref2VA's with
 * H3_OPT_REF2VA in flags (other H3_OPT_* bits are ignored). precision must be H3_PRECISION_FP8.
 * threads: 0 = all cores. The file holds, for every weight the fp8 path quantises (the main
 * blocks' qkv, out, fc1, fc2 whose width is a multiple of 16), "<name>" F8_E4M3 [rows, cols] and
 * "<name>.scale" F32 [rows], the bits a GPU makes when it quantises at load: per output row,
 * s = max|w| / 448 over the weight as the GPU holds it (bf16), 1 for an all-zero or non-finite
 * amax, q = h3_fp8_e4m3_from_f32(w / s). __metadata__ gives "h3ctl.format" =
 * "fp8-e4m3-per-output-channel/1", "h3ctl.precision" = "fp8", "h3ctl.partition" and
 * "h3ctl.identity": SHA-256 over the transformer's config.json, every shard's safetensors header
 * and three 4 KiB windows (start, middle, end) of each quantised weight's stored bytes, which a
 * context recomputes (milliseconds) and compares. The file is written next to out_path and moved
 * into place when complete: on failure nothing is left; an existing out_path is refused unless
 * overwrite != 0. Progress phase "quantize", one unit per weight (returning non-zero cancels).
 * Returns 0 or a negative H3_E_* code with h3_last_error set.
 */
H3_API int h3_quantize(const char *model_dir, uint32_t flags, int precision, int threads, const char *out_path,
                       int overwrite, h3_progress_fn progress, void *user);

/*
 * n floats to e4m3 bytes exactly as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
 * round to nearest even, magnitudes past 464 and infinities saturate to +-448 (0x7E / 0xFE), NaN
 * becomes 0x7F whatever its sign, +-0 and magnitudes up to 2^-10 become 0x00 / 0x80. The
 * conversion h3_quantize uses; exported for tests and tools.
 */
H3_API int h3_fp8_e4m3_from_f32(const float *x, int64_t n, uint8_t *out);

/*
 * Description of the opened model as a JSON object: partition, components present, their
 * files, tensor counts, dtypes, bytes, config dimensions. The string is owned by the context
 * and valid until h3_free.
 */
H3_API const char *h3_model_info_json(h3_ctx *ctx);

/*
 * Peak-memory estimate (bytes) per phase for a render of width x height pixels, `frames` frames
 * and `prompt_tokens` text tokens, as a JSON object owned by the context (valid until the next
 * call or h3_free). Computed from configs and tensor sizes only.
 */
H3_API const char *h3_memory_estimate_json(h3_ctx *ctx, int width, int height, int frames,
                                           int prompt_tokens);

/*
 * Check the opened model: configs parse, and every tensor a render reads exists with the shape
 * its config implies and a float dtype (headers only). With `require_all`, every component of a
 * text-to-video+audio render must be present. Returns 0 or a negative H3_E* code.
 */
H3_API int h3_model_check(h3_ctx *ctx, int require_all);

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

/* Prompt cache: in-memory, per context, keyed by (text-encoder weights identity, token ids),
   evicting least-recently-used entries to stay within a byte budget (default 256 MiB). */
typedef struct h3_text_cache_stats {
    uint32_t struct_size;     /* sizeof(h3_text_cache_stats), set by the caller */
    uint32_t reserved;
    uint64_t hits, misses;    /* lookups answered / not answered from the cache */
    uint64_t entries, bytes;  /* what the cache holds now (bytes include keys) */
    uint64_t budget;          /* byte budget; 0 = caching off */
    uint64_t evictions;
    uint64_t last_bytes_read; /* weight bytes the last h3_text_encode read from disk (0 on a hit) */
} h3_text_cache_stats;

H3_API int h3_text_cache_stats_get(h3_ctx *ctx, h3_text_cache_stats *out);
/* Set the budget in bytes (0 disables caching); entries beyond it are evicted now. */
H3_API int h3_text_cache_set_budget(h3_ctx *ctx, uint64_t bytes);
/* Drop every entry (the counters stay). */
H3_API void h3_text_cache_clear(h3_ctx *ctx);

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
 * MiniMaxH3Scheduler and the modular pipeline's t2va layout). Computation is f32; BF16/F16
 * weights are widened on the fly. Latents are f32: video [C, T, H, W] (C = latents_dim, H/W in
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
 * stream `stream` under `seed` (Philox4x32-10 + Box-Muller, documented in libh3/schedule.c).
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
/* Text to video + stereo audio                                                                */

/*
 * One reference of a Ref2VA request (h3_request.references), in the order the model reads them:
 *  H3_REFERENCE_IMAGE: uint8 RGB rgb [height][width][3], aspect 1:4 .. 4:1, at most 64 megapixels
 *    (diffusers resizes it to a 2048-pixel short edge, sides rounded to 32, with Lanczos).
 *  H3_REFERENCE_VIDEO: rgb [frames][height][width][3] uint8 at fps (aspect 1:4 .. 4:1), with an
 *    optional soundtrack in pcm / samples / channels / sample_rate (as an audio reference; NULL:
 *    a silent video). As diffusers' ref2va: resampled onto 24 fps by dropping / repeating whole
 *    frames, truncated to the render's frames, resized with PIL's Lanczos to the canvas of its own
 *    aspect (the render's canvas rule); the text encoder reads it at 2 fps in pairs ("<Video k>: "
 *    and "<t seconds>" + a vision block per pair, "<Audio j>: " before it when it has sound), so it
 *    needs at least 13 frames at 24 fps; the video VAE encodes its first 17n + 5 frames (snapped
 *    down, n >= 1) in independent 17-frame chunks; its soundtrack is encoded like an audio
 *    reference (any rate libh3 resamples) and packed before its video rows. At most 3.
 *  H3_REFERENCE_AUDIO: pcm [channels][samples] float32 planar (1 or 2 channels) at sample_rate
 *    (an integer rate, 4000 .. 384000 Hz). Truncated to frames / 24 s at that rate, mono duplicated
 *    to stereo, resampled once to the audio VAE's rate (h3_audio_info; 32000 for H3) as
 *    h3_audio_resample does (a clip at that rate is used as is), encoded to the posterior mode,
 *    normalised; never noised (its rows run at t = 1.0). At most 3,
 *    and never without an image (or video) reference. The text side gets "<Audio j>: " only.
 */
#define H3_REFERENCE_IMAGE 0
#define H3_REFERENCE_VIDEO 1
#define H3_REFERENCE_AUDIO 2
typedef struct h3_reference {
    int32_t kind;
    const uint8_t *rgb;
    int32_t width, height, frames;
    double fps; /* a video's frame rate (diffusers resamples with it in doubles) */
    const float *pcm;
    int64_t samples;
    int32_t channels, sample_rate;
    /* Optional injected draws of an image or video reference (parity checks), both [C, t, h, w]
       at its encoding size (h3_reference_size / h3_reference_video_size; t = 1 for an image):
       the conditioning noise eps (else libh3's stream 2 + k of the request's seed, k = its index
       among the visual references) and the encoder's posterior noise (else seed 42, stream 16,
       as for keyframes). */
    const float *noise;
    const float *posterior_noise;
} h3_reference;

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

/*
 * One render request. `steps` counts sigma grid points including the terminal 0, as diffusers'
 * num_inference_steps (20 gives 19 model evaluations). Frames are aligned up to the VAE's
 * 17n + 5; width and height must be multiples of the model's canvas multiple (32 for H3) within
 * its pixel limit. The initial noise is libh3's counter-based generator under `seed` unless
 * video_noise ([C, T, H/16, W/16], latent order) and/or audio_noise ([2, C_a, T_a]) are given.
 */
typedef struct h3_request {
    uint32_t struct_size; /* sizeof(h3_request) */
    const char *prompt;   /* UTF-8, used verbatim (no chat template) */
    int32_t width, height, frames, steps;
    uint64_t seed;
    const float *video_noise; /* optional */
    const float *audio_noise; /* optional */
    int32_t vae_tile_px;      /* video decoder tile size in pixels, 0 = the model's (256 for H3) */
    /*
     * Speed knobs. Zero (the default) turns each off, and a render with every knob off is bit for
     * bit the render without them. They trade quality for transformer time; the h3ctl presets
     * combine them with measured costs. Conflicting or out-of-range values fail h3_plan and
     * h3_prepare with H3_E_INVALID before any work.
     *  reuse R >= 2: run the transformer at step s only when s = 0, s = the last step or
     *    s mod R = 0; other steps extrapolate each modality's velocity from the last two
     *    evaluations, v = v1 + r (v1 - v0), r = (sigma_s - sigma_1) / (sigma_1 - sigma_0) clamped
     *    to [-2, 2] (after a single evaluation, v = v1).
     *  core_reuse K >= 2: the block stack runs on the first transformer call, every K-th call and
     *    the last step; other calls add the residual h_out - h_in of the last full run to their
     *    input (patch projections, text rows, final norm and heads are still computed). Exclusive
     *    with reuse.
     *  layers M: run M of the model's blocks (0 = all): the first two, the last, and the others
     *    ranked by layer_policy. The dropped blocks' weights and modulation tables are never loaded.
     *    At least 3 (or the model's block count when smaller).
     *  layer_policy: H3_LAYERS_GATE keeps the blocks whose AdaLN gates (the two gate slots, mean
     *    |value| over the request's modalities and steps) are largest; H3_LAYERS_UNIFORM spaces
     *    them evenly.
     *  token_reduction 1: in the middle blocks (4 to 30 of 50, to 40 during the first 10 steps,
     *    scaled to the model's depth) horizontally adjacent target-video tokens are averaged into
     *    one (RoPE at the pair's mean position) and restored afterwards as the entry state plus the
     *    pair's change; text, audio and conditioning rows are never pooled.
     *  render_width x render_height: the canvas the transformer and the decoders run at (0 = the
     *    output size). Same aspect as width x height, not larger, and valid on its own; decoded
     *    frames are resized to width x height with a Lanczos-3 filter.
     *  cache_threshold X > 0: skip the transformer at a step while the relative change of the first
     *    block's modulated input, accumulated since the last evaluation, stays below X, reusing the
     *    last velocity (the first and last steps always run). Exclusive with reuse.
     *  lora_paths / lora_scales / n_lora: LoRA files (safetensors, diffusers or ComfyUI / original
     *    key names) merged into the transformer's weights when it loads, each delta scaled by its
     *    scale (NULL = 1 each) and by the file's alpha / rank where it records one. The few-step
     *    formats too (docs/few-step.md): Turbo's fused qkv, FastH3's .diff / .diff_b / .set_weight,
     *    and a PDD file's interval output heads, applied per step.
     */
    int32_t reuse;
    int32_t core_reuse;
    int32_t layers;
    int32_t layer_policy;
    int32_t token_reduction;
    int32_t render_width, render_height;
    float cache_threshold;
    const char *const *lora_paths;
    const float *lora_scales;
    int32_t n_lora;
    /*
     * First / last frame conditioning (FL2VA), as diffusers' fl2va workflow: uint8 RGB keyframes
     * [height][width][3] of any size within 1:4 .. 4:1 and 64 megapixels. The first frame is
     * stretched onto the canvas, the last one cover-cropped when a first frame is given (stretched
     * when alone), both with PIL's Lanczos (h3_keyframe_resize). With a keyframe, width = height = 0
     * takes the canvas from the first given keyframe's aspect (h3_keyframe_canvas). Each keyframe
     * is encoded by the video VAE's encoder into one latent frame of conditioning rows (after the
     * prompt rows, first then last) that the sampler holds at t = 0.999 and never updates, and is
     * shown to the text encoder's vision tower as "<Picture k>: " + a vision block before the
     * prompt. With render_width/height the keyframes are put onto that smaller canvas.
     */
    const uint8_t *first_frame;
    int32_t first_width, first_height;
    const uint8_t *last_frame;
    int32_t last_width, last_height;
    /*
     * Injected tensors for parity checks (all optional; shapes in latent units of the canvas,
     * [C, 1, H/16, W/16]):
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
     *    (diffusers' prompt_embeds and text_token_tags); `prompt` is then ignored.
     */
    const float *first_noise, *last_noise;
    const float *first_posterior_noise, *last_posterior_noise;
    const float *first_latent, *last_latent;
    const float *text_states;
    const uint8_t *text_tags;
    int32_t text_rows;
    /*
     * References (Ref2VA): n_references entries in request order, at most 9 images, 3 videos, 3
     * audio clips and 12 in all, not audio alone, not together with first/last frames. They need
     * a context opened on the Ref2VA partition (H3_OPT_REF2VA).
     */
    const h3_reference *references;
    int32_t n_references;
    /*
     * Sigma schedule (docs/few-step.md). `schedule` names a grid of h3_schedule_sigmas; NULL or ""
     * takes the one the model (model_index.json "h3ctl": {"schedule": NAME}) or a LoRA file (its
     * metadata "h3ctl_schedule", or a PDD file's head grid: "pdd") declares, else "h3". Naming one
     * that differs from a declared one fails with H3_E_INVALID. Or `sigmas` gives the grids
     * themselves: 2 * n_sigmas floats, video then audio, each in [0, 1] and strictly decreasing (a
     * full render ends at 0; a segment may stop before, continuing from injected latents):
     * n_sigmas - 1 evaluations, `steps` is then ignored; not with `schedule`.
     */
    const char *schedule;
    const float *sigmas;
    int32_t n_sigmas;
} h3_request;

/* h3_request.layer_policy */
#define H3_LAYERS_GATE 0
#define H3_LAYERS_UNIFORM 1

/* Defaults: 128x128, 22 frames, 20 steps, seed 42 (h3-tiny's render), the model's VAE tiles, every speed
   knob off. Writes sizeof(h3_request) of this library's h3.h: a program built against an older, smaller
   h3_request must fill its own struct (struct_size included) instead; h3_prepare and h3_plan read no more
   than the caller's struct_size either way. */
H3_API void h3_request_default(h3_request *r);

/*
 * Validate the request, tokenize and encode the prompt (cached), build the packed layout, refine
 * the text once, precompute the AdaLN modulation of every step (the adaln_proj weights are then
 * released) and draw the noise. Progress phases: "tokenize", "text_encoder", "prepare".
 */
H3_API int h3_prepare(h3_ctx *ctx, const h3_request *request);

/* One Euler transition (one transformer forward, or none when a speed knob skips the step).
   Returns the steps left (0 when done) or a negative H3_E* code. Progress phase "denoise" (done
   of total steps). */
H3_API int h3_step(h3_ctx *ctx);

/* Shapes of the prepared request: output buffers for h3_decode are rgb [frames, height, width, 3]
   uint8 and pcm [2, audio_samples] float32. */
typedef struct h3_render_info {
    uint32_t struct_size; /* sizeof(h3_render_info), set by the caller */
    int32_t width, height, frames, fps;
    int64_t audio_samples;
    int32_t sample_rate;
    int32_t latent_frames, latent_height, latent_width, latent_channels;
    int32_t audio_latents, audio_latent_channels;
    int32_t prompt_tokens, steps, steps_done;
    int64_t sequence; /* packed tokens per transformer forward */
} h3_render_info;
H3_API int h3_render_info_get(h3_ctx *ctx, h3_render_info *out);

/* Validate a request and give its shapes without computing anything (prompt_tokens, steps and
   sequence are 0): lets a caller size buffers or noise and refuse bad input before any work. */
H3_API int h3_plan(h3_ctx *ctx, const h3_request *request, h3_render_info *out);

/* The schedule a request's model (model_index.json "h3ctl".schedule) or LoRA files (metadata
   "h3ctl_schedule", a PDD head bank: "pdd") declare, into name (cap bytes): returns 1, 0 when none
   declares one ("" written), or a negative H3_E* code (a LoRA file that does not fit, two that
   declare different ones). Reads headers only. */
H3_API int h3_schedule_declared(h3_ctx *ctx, const h3_request *request, char *name, int cap);

/* Current latents: video [C, T, h, w] and audio [2, C_a, T_a] (either may be NULL). */
H3_API int h3_get_latents(h3_ctx *ctx, float *video, float *audio);

/* The prompt's token ids (copies up to cap); returns their count. */
H3_API int h3_prompt_tokens(h3_ctx *ctx, int32_t *ids, int cap);

/*
 * After the last step: decode audio into pcm [2, audio_samples] and video into rgb
 * [frames, height, width, 3] (either may be NULL, not both). The transformer is released first.
 * Progress phases "audio_decode" and "video_decode"; a cancelled decode can be repeated.
 */
H3_API int h3_decode(h3_ctx *ctx, uint8_t *rgb, float *pcm);

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
#endif /* H3_H */
