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
 *  - A context (h3_ctx) is not thread-safe: use one context per thread, or serialise calls.
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
} h3_options;

/* Use the Ref2VA partition instead of FL2VA when the directory holds both. */
#define H3_OPT_REF2VA 1u

/* Fill *o with defaults (all cores, FL2VA). */
H3_API void h3_options_default(h3_options *o);

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
/* Progress and cancellation                                                                   */

/*
 * Called by long operations on the calling thread, between units of work, with the units done
 * so far and their total (the units are the operation's own; done reaches total at the end).
 * Return 0 to go on; any other value stops the operation, which then fails with
 * H3_E_CANCELLED after releasing what it allocated. `user` is passed through untouched.
 */
typedef int (*h3_progress_fn)(void *user, int64_t done, int64_t total);

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
 *  progress (may be NULL) is called between convolutions with work units done/total; non-zero
 *  cancels. The decoder weights are read for this call and released before it returns.
 */
H3_API int h3_audio_decode(h3_ctx *ctx, const float *latents, int channels, int latent_frames, float *pcm,
                           int64_t pcm_capacity, h3_progress_fn progress, void *user);

#ifdef __cplusplus
}
#endif
#endif /* H3_H */
