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
/* Progress                                                                                    */

/*
 * Progress and cancel hook of long-running calls: called after each unit of work of `phase`
 * ("video VAE decode": one (temporal window, spatial tile)) with `done` of `total` units
 * finished. A non-zero return cancels the call, which then fails with H3_E_CANCELLED.
 */
typedef int (*h3_progress_fn)(void *user, const char *phase, int done, int total);

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
 * diffusers does; T >= 3). h3_video_decode_shape gives the shape for any model. Memory stays bounded by one tile
 * and one window: tiles are decoded one at a time and blended straight into the caller's buffers.
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
    h3_progress_fn progress; /* optional */
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
 * float sample of vae.decode() as [3, F, H, W]. At least one of them must be given. Weights are mapped for the call and released after it. Results do not depend on the
 * thread count. `opts` may be NULL.
 */
H3_API int h3_video_decode(h3_ctx *ctx, const float *latents, int C, int T, int h, int w,
                           const h3_video_decode_opts *opts, uint8_t *rgb, float *pixels);

#ifdef __cplusplus
}
#endif
#endif /* H3_H */
