/*
 * libh3 — native inference engine for MiniMax-H3 (joint video + stereo-audio diffusion).
 *
 * This is the header a program that renders videos includes: options and context, the render
 * request, plan / prepare / step / decode, progress and cancellation, errors and model
 * information. The stage and parity entry points (tokenizer, text encoder, transformer forward,
 * encoders and decoders, resampler, keyframe and reference helpers, benchmarks, injected tensors)
 * are in h3_stages.h, which includes this header. Everything declared in either is exported from
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
 * fp8 video decoder (not an exact path, and measured slower than the bf16 decoder on an H200, see
 * docs/few-step.md; environment: H3_FP8_DECODER=1/0): the video
 * VAE decoder's layer GEMM weights (qkv, out and both MLP weights of every layer) quantised to e4m3
 * with one f32 scale per output channel at load, the activations per row, as precision fp8 does for
 * the transformer; proj_in, proj_out, the norms, the attention and the blending are unchanged.
 * Independent of h3_options.precision. CUDA on compute capability 8.9+ only: refused at h3_init, with
 * the reason, elsewhere. Off (the default) the decoder is the exact bf16 one.
 */
#define H3_OPT_FP8_DECODER 128u

/*
 * Devices. AUTO runs on CUDA when the CUDA backend was built (libh3_cuda next to libh3) and a
 * GPU of compute capability 8.0 or newer answers, else on the CPU. CUDA fails h3_init with a
 * one-line reason when that is not so. On CUDA the text encoder of text prompts, the transformer and
 * the sampler, and both decoders run on the GPU (H3_OPT_STAGES_CPU keeps the text encoder and the
 * decoders on the CPU; keyframe prompts are encoded on the CPU).
 * METAL runs the same stages on an Apple GPU through the Metal backend (libh3_metal next to libh3;
 * on Linux only a test build against the Metal test double has one). On a Mac, AUTO picks it when
 * it is built and a GPU of Apple family 7 (M1) or newer answers.
 */
#define H3_DEVICE_AUTO 0
#define H3_DEVICE_CPU 1
#define H3_DEVICE_CUDA 2
#define H3_DEVICE_METAL 3

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

/* Where the CUDA backend sends one-line progress and warnings (the first compile of its kernels
   for this GPU, an unwritable kernel cache): fn(user, line), from the calling thread of the call
   that triggers it. Process-wide; NULL: nothing is said. */
H3_API void h3_set_note(void (*fn)(void *user, const char *line), void *user);

/* Compile (or load from the kernel cache) every CUDA kernel for GPU `device`, with one note per
   kernel module: what `h3ctl warmup` runs so the first render starts at once. 0, or a negative
   H3_E_* code with the reason in h3_last_error (no driver, no GPU, NVRTC missing, a compile error). */
H3_API int h3_cuda_warmup(int device);

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
} h3_reference;

/*
 * One render request. `steps` counts sigma grid points including the terminal 0, as diffusers'
 * num_inference_steps (20 gives 19 model evaluations). Frames are aligned up to the VAE's
 * 17n + 5; width and height must be multiples of the model's canvas multiple (32 for H3) within
 * its pixel limit. The initial noise is libh3's counter-based generator under `seed`.
 */
typedef struct h3_request {
    uint32_t struct_size; /* sizeof(h3_request) */
    const char *prompt;   /* UTF-8, used verbatim (no chat template) */
    int32_t width, height, frames, steps;
    uint64_t seed;
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
    /* Tensors a parity check injects (h3_stages.h's h3_parity); NULL for every other render. */
    const struct h3_parity *parity;
} h3_request;

/* h3_request.layer_policy */
#define H3_LAYERS_GATE 0
#define H3_LAYERS_UNIFORM 1

/*
 * The model's default request: width x height, frames and steps from the "h3ctl" block of the
 * partition's model_index.json ("default_width", "default_height", "default_frames",
 * "default_steps"), each else the release's (1344 x 768, 124 frames, 20 steps); seed 42, the
 * model's VAE tiles, every speed knob off, no keyframes, references or injections. ctx NULL gives
 * the release's values. This is the one place the defaults are decided: h3ctl takes its own from
 * it. Writes sizeof(h3_request) of this library's h3.h: a program built against an older, smaller
 * h3_request must fill its own struct (struct_size included) instead; h3_prepare and h3_plan read
 * no more than the caller's struct_size either way. Returns 0, or a negative H3_E* code (r NULL, a
 * default in the block that is not a positive integer) with *r holding the release's values.
 */
H3_API int h3_request_default(h3_ctx *ctx, h3_request *r);

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

/*
 * After the last step: decode audio into pcm [2, audio_samples] and video into rgb
 * [frames, height, width, 3] (either may be NULL, not both). The transformer is released first.
 * Progress phases "audio_decode" and "video_decode"; a cancelled decode can be repeated.
 */
H3_API int h3_decode(h3_ctx *ctx, uint8_t *rgb, float *pcm);

#ifdef __cplusplus
}
#endif
#endif /* H3_H */
