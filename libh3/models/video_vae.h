/*
 * Video VAE decoder (internal interface). The public entry points are h3_video_decode* in h3.h;
 * the pipeline calls h3_vvae_run directly with the context's model and CPU backend.
 *
 * What is computed is exactly diffusers 0.42.1's MiniMaxH3VideoDecodeStep: latents * std + mean,
 * AutoencoderKLMiniMaxH3.decode (temporal windows cross-faded as `_decode` does, each window
 * spatially tiled and blended as `_decode_clip`/`_stitch_tiles` do, every tile through
 * post_quant_conv and the ViT decoder), then ImageNet de-normalisation, clamp to [0, 1] and the
 * VideoProcessor's uint8 rounding.
 *
 * Memory: the decoder streams. It decodes one (window, tile) at a time and blends it straight into
 * the caller's output. Besides the mapped weights and the caller's buffers it holds one tile's
 * activations and pixels, the strips of the neighbouring tiles that blending still needs (the bottom
 * overlap of the previous tile row and the right overlap of the previous tile), and the trailing
 * frames of the previous window that the temporal cross-fade needs (5 frames for the release). The
 * exact byte count is h3_vvae_plan.workspace_bytes; nothing else proportional to the video is
 * allocated.
 */
#ifndef H3_VIDEO_VAE_H
#define H3_VIDEO_VAE_H

#include "backend/backend.h"

/* Geometry of one decode: temporal windows, spatial tiles, output shape, workspace. */
typedef struct h3_vvae_plan {
    int T, h, w;                 /* latent frames and latent grid */
    int frames, height, width;   /* output */
    int ps, pt;                  /* spatial / temporal compression (patch sizes) */
    /* Temporal chunking (diffusers `_decode`). */
    int chunk;                   /* tokens_chunk_size = ceil(clip_length / pt) */
    int win;                     /* latents per window = chunk + token_overlap */
    int windows, pad_tokens, pad_frames;
    int pre;                     /* frame_pre_padding: leading decoded frames dropped per chunk */
    int keep0, keep1;            /* frames kept from the window's first chunk and its overlap chunk */
    int blend_t;                 /* frames cross-faded between windows */
    /* Spatial tiles (diffusers `_split_tiles`, in pixels). */
    int ny, nx;                  /* tile rows / columns */
    int tile_h, tile_w;          /* tile size in pixels (every tile of an axis has the same size) */
    int *y0, *x0, *ovy, *ovx;    /* starts and overlaps (overlap i lies between tile i and i+1) */
    int max_ovy, max_ovx;
    bool col_major;              /* visit tiles column by column (fewer strip bytes to keep) */
    /* Per-tile token counts. */
    int grid;                    /* win * (tile_h/ps) * (tile_w/ps) */
    int tokens;                  /* grid + registers + 1 */
    int rows_block;              /* rows per FFN / proj_out block */
    size_t workspace_bytes;      /* everything h3_vvae_run allocates, weights excluded */
} h3_vvae_plan;

/* Flags (same values as the public H3_VIDEO_* flags). */
#define H3_VVAE_RAW 1u     /* float output is vae.decode()'s sample [3,F,H,W] */
#define H3_VVAE_UNTILED 2u /* one tile per window (diffusers disable_tiling) */

/* Plan a decode of latents [C, T, h, w] with tiles of tile_px pixels overlapping by at least
   overlap_px (0 = the config's values). Validates the request; on success free with
   h3_vvae_plan_free. */
H3_INTERNAL int h3_vvae_plan_make(const h3_vvae_cfg *c, int T, int h, int w, int tile_px, int overlap_px,
                                  unsigned flags, h3_vvae_plan *p);
H3_INTERNAL void h3_vvae_plan_free(h3_vvae_plan *p);
/* Adapt a plan to the backend that runs it: a backend whose GEMMs are not f32 (a GPU) runs the FFN
   and proj_out over the whole tile at once (rows_block = tokens); workspace_bytes follows. The CPU's
   plan is unchanged. */
H3_INTERNAL void h3_vvae_plan_for_backend(const h3_vvae_cfg *c, const h3_backend *be, h3_vvae_plan *p);

typedef struct h3_vvae_request {
    const float *latents;   /* [C, T, h, w], normalised as the DiT produces them */
    int C, T, h, w;         /* C must be the config's latent_channels */
    int tile_px;            /* 0 = vae_tile_size from the config */
    int overlap_px;         /* 0 = vae_tile_overlap_min from the config */
    unsigned flags;         /* H3_VVAE_* */
    uint8_t *rgb;           /* optional [F, H, W, 3] */
    float *pixels;          /* optional: [F, H, W, 3] in [0, 1], or [3, F, H, W] with H3_VVAE_RAW */
    h3_progress_fn progress; /* "video_decode": 0, then after each (window, tile); non-zero cancels */
    void *user;
    /* Optional: the decoder's weights kept between calls on a backend that copies them (a GPU):
       taken from *keep when it holds them for `be`, else loaded and left there (the caller frees
       it with h3_vvae_keep_free). NULL, or a backend that computes on the mapping (the CPU): loaded
       and released in the call. */
    struct h3_vvae_keep **keep;
    /* H3_PRECISION_DEFAULT (the exact decoder: bf16 GEMM weights on a GPU, f32 on the CPU) or
       H3_PRECISION_FP8: the decoder layers' four GEMM weights (qkv, out, w1, w2) quantised to e4m3 per
       output channel at load, as the transformer's fp8 weights are (the caller checked the backend
       can; H3_OPT_FP8_DECODER). A kept decoder of the other precision is reloaded. */
    int precision;
} h3_vvae_request;

/* Device copies of the video decoder's weights (h3_vvae_request.keep). NULL is ignored. */
typedef struct h3_vvae_keep h3_vvae_keep;
H3_INTERNAL void h3_vvae_keep_free(h3_vvae_keep *k);
/* Bytes of backend memory it holds (0 for NULL). */
H3_INTERNAL uint64_t h3_vvae_keep_bytes(const h3_vvae_keep *k);

/* Map the video VAE decoder weights, decode on backend `be`, release the weights (h3_store_release)
   unless the request keeps them (see h3_vvae_request.keep).
   The request's latents and outputs are host memory (see the backend's channels_last and
   vae_stitch). */
H3_INTERNAL int h3_vvae_run(h3_model *m, h3_backend *be, const h3_vvae_request *req);

#endif /* H3_VIDEO_VAE_H */
