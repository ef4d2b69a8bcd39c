/*
 * Video VAE encoder (internal interface). The public entry points are h3_video_encode* in h3.h;
 * the FL2VA pipeline calls h3_venc_condition directly with the context's model and CPU backend.
 *
 * What is computed is exactly diffusers 0.42.1's AutoencoderKLMiniMaxH3.encode: the causal 3-D
 * CNN (MiniMaxH3VideoEncoder3d) and quant_conv, spatially tiled and blended as `_encode_clip` /
 * `_stitch_tiles` do (tiling on by default, the config's vae_tile_size / vae_tile_overlap_min),
 * over temporal clips as `_encode` does:
 *   - one frame is one clip of one frame (no chunking, no token drop): one latent frame. Its
 *     causal convolutions see two zero frames before it, so only the last temporal tap of every
 *     3x3x3 kernel reaches it: the weights are loaded as that 2-D slice (the spatial encoder),
 *     the same sums without two thirds of the work;
 *   - more frames are cut into clip_length-frame clips (the last padded by repeating its last
 *     frame), each encoded on its own, and the last token_drop latent frames of the whole are
 *     dropped: 17n + 5 frames -> 5n + 2 latent frames for the release, a 17-frame clip -> 2.
 * The posterior: mean = moments[:C], logvar = clamp(moments[C:], -30, 20) (the mean is not
 * clamped; DiagonalGaussianDistribution clamps the log-variance only).
 *
 * Layouts: pixels [3][T][H][W] f32 (host); mean, logvar and condition latents [C][Tl][h][w] f32
 * (host), C the config's latent_channels. Weights are mapped for the call and released after it
 * (h3_store_release); a model without encoder weights fails here only, with "model has no video
 * VAE encoder weights", so text-only renders never need them.
 */
#ifndef H3_VIDEO_VAE_ENCODER_H
#define H3_VIDEO_VAE_ENCODER_H

#include "backend/backend.h"

#define H3_VENC_MAX_LEVELS 16

/* The encoder's geometry: video_vae/source/config.json (official names) plus what it shares with
   the decoder in video_vae/config.json. */
typedef struct h3_venc_cfg {
    int in_ch, latent_ch;                 /* 3, 24: conv_out gives 2 * latent_ch moments */
    int levels, res_blocks, groups;       /* 6, 2, 32 for the release */
    int ch[H3_VENC_MAX_LEVELS];           /* ch * ch_mult: (128, 256, 256, 512, 512, 1024) */
    int space[H3_VENC_MAX_LEVELS], time[H3_VENC_MAX_LEVELS]; /* per-level strides (space_down, time_down) */
    int spatial, temporal;                /* their products: 16, 4 */
    double eps;                           /* norm_eps, 1e-6 */
    int clip_length, token_drop, tile_size, tile_overlap;
    float latents_mean[64], latents_std[64];
} h3_venc_cfg;

H3_INTERNAL int h3_venc_cfg_load(h3_model *m, h3_venc_cfg *c);

/* Flags of h3_venc_request.flags (same value as the public H3_VIDEO_UNTILED). */
#define H3_VENC_UNTILED 2u /* one tile per clip (diffusers' disable_tiling()) */

/* Latent shape [C][Tl][h][w] of an encode of T frames of H x W pixels with this tiling (tile_px,
   overlap_px 0: the config's). Validates the request (sizes, tiling, a frame large enough for
   every reflect pad of the encoder). Any output may be NULL. */
H3_INTERNAL int h3_venc_shape(const h3_venc_cfg *c, int T, int H, int W, int tile_px, int overlap_px,
                              unsigned flags, int *C, int *Tl, int *h, int *w);

typedef struct h3_venc_request {
    const float *pixels;     /* [3][T][H][W], normalised as diffusers feeds vae.encode */
    int T, H, W;
    int tile_px, overlap_px; /* 0: the config's vae_tile_size / vae_tile_overlap_min */
    unsigned flags;          /* H3_VENC_* */
    float *mean, *logvar;    /* [C][Tl][h][w]; either may be NULL, not both */
    h3_progress_fn progress; /* phase "video_encode": 0, then one unit per (clip, tile) */
    void *user;
} h3_venc_request;

/* vae.encode(pixels).latent_dist's mean and (clamped) logvar, on backend `be` (which must have
   the conv3d and group_norm ops). */
H3_INTERNAL int h3_venc_run(h3_model *m, h3_backend *be, const h3_venc_request *rq);

/*
 * FOR THE FL2VA / Ref2VA PIPELINE: one visual condition exactly as diffusers'
 * `encode_vae_condition` computes it (modular_pipelines/minimax_h3/encoders.py):
 *   pixels = (rgb / 255 - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)   (f32, in that order)
 *   posterior = vae.encode(pixels)                       (tiled; 1 frame -> 1 latent frame)
 *   z = mean + exp(0.5 * logvar) * eps                   (posterior.sample)
 *   z = fp16(z)                                          (latents.to(torch.float16).float())
 *   out = (z - latents_mean[c]) / latents_std[c]         (the config's statistics)
 * rgb: uint8 [T][H][W][3] frames already at the target size (T = 1 for a keyframe or an image
 * reference); out: f32 [C][Tl][h][w] (channel-major, the DiT's latent order; for T = 1,
 * [C][1][H/16][W/16] for the release), shape from h3_venc_shape with the config's tiling.
 * eps: the posterior noise [C][Tl][h][w] (parity: the oracle's torch draw injected), or NULL:
 * libh3's standard-normal noise h3_noise(seed, stream, 0 ...) in that order (renders).
 */
typedef struct h3_venc_cond {
    const uint8_t *rgb; /* [T][H][W][3] */
    int T, H, W;
    const float *eps;   /* [C][Tl][h][w] or NULL */
    uint64_t seed;      /* used when eps is NULL */
    uint32_t stream;
    float *out;         /* [C][Tl][h][w] */
    h3_progress_fn progress;
    void *user;
} h3_venc_cond;

H3_INTERNAL int h3_venc_condition(h3_model *m, h3_backend *be, const h3_venc_cond *rq);

#endif /* H3_VIDEO_VAE_ENCODER_H */
