/*
 * The Qwen3-VL image processor (transformers' Qwen2VLImageProcessor, the torchvision backend that
 * diffusers' MiniMax-H3 pipeline runs): smart_resize to a multiple of patch_size * merge_size within
 * [min_pixels, max_pixels], a bicubic antialiased resize of the uint8 image, rescale + normalise,
 * and the patch layout the vision tower reads (each image repeated temporal_patch_size times,
 * rows in 2x2-merge-block order). Host code only; no model weights.
 */
#ifndef H3_IMAGE_PROC_H
#define H3_IMAGE_PROC_H

#include "core/internal.h"

#include <stdbool.h>
#include <stdint.h>

/* Largest input image accepted (pixels): far beyond any keyframe, far from size overflow. */
#define H3_IMAGE_MAX_PIXELS (1ll << 28)
/* Largest patch grid the processor may produce (patches of one image): a vision tower of
   64 Ki tokens per image is already ~16x the release's largest keyframe. */
#define H3_IMAGE_MAX_PATCHES (1ll << 16)

typedef struct h3_image_proc_cfg {
    int patch_size, temporal_patch_size, merge_size;
    int64_t min_pixels, max_pixels; /* size.shortest_edge / size.longest_edge (pixel counts) */
    float mean[3], std[3];          /* image_mean / image_std */
    double rescale_factor;          /* 1/255 */
    bool do_resize, do_rescale, do_normalize;
    char source[512];               /* the file the settings came from, "" for the built-in defaults */
} h3_image_proc_cfg;

/* The built-in settings: the values every Qwen3-VL release ships in preprocessor_config.json
   (patch 16, temporal patch 2, merge 2, 65536..16777216 pixels, mean = std = 0.5, bicubic). */
H3_INTERNAL void h3_image_proc_defaults(h3_image_proc_cfg *c);

/*
 * The processor settings of a model: the first of <partition>/processor/preprocessor_config.json,
 * processor/processor_config.json (its "image_processor" object), text_encoder/preprocessor_config.json
 * and tokenizer/preprocessor_config.json that exists, keys missing from it taking the built-in
 * values; none of them: the built-in settings. Only the bicubic filter (resample 3) is supported.
 */
H3_INTERNAL int h3_image_proc_cfg_load(h3_model *m, h3_image_proc_cfg *c);

/* transformers' smart_resize: (h, w) -> the processed size, multiples of `factor`. Errors: an
   empty image, an aspect ratio above 200 (as transformers refuses it). */
H3_INTERNAL int h3_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels,
                                int *out_h, int *out_w);

/* Check an input image's size against the limits; `what` names it in the message. */
H3_INTERNAL int h3_image_check(const uint8_t *rgb, int width, int height, const char *what);

/*
 * Bicubic antialiased resize of an RGB uint8 image [h][w][3] to [oh][ow][3], bit-identical to
 * torch.nn.functional.interpolate(uint8, mode="bicubic", align_corners=False, antialias=True) on
 * the CPU (what torchvision's resize runs for a uint8 tensor): Keys a = -0.5 taps widened by the
 * scale when shrinking, normalised in double, turned into int16 fixed point, one horizontal pass
 * then one vertical pass, each rounded and clamped to uint8. Same size: a copy.
 */
H3_INTERNAL int h3_resize_bicubic_u8(const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow);

/* Patch grid (t, h, w in patches) of an image of this size, and the row width C*T*P*P. */
H3_INTERNAL int h3_image_grid(const h3_image_proc_cfg *c, int width, int height, int grid_thw[3], int *patch_dim);

/*
 * pixel_values of one image as the processor returns them: grid_h * grid_w rows of patch_dim f32
 * (h3_image_grid), rows in (block row, block col, row in block, col in block) order, each row
 * [channel][time][py][px]. `out` must hold rows * patch_dim floats.
 */
H3_INTERNAL int h3_image_pixels(const h3_image_proc_cfg *c, const uint8_t *rgb, int width, int height,
                                    float *out);

/*
 * The video processor (transformers' Qwen3VLVideoProcessor, torchvision backend) for the frames a
 * Ref2VA video reference shows the conditioner. Same settings struct; its own files and defaults:
 * processor/processor_config.json's "video_processor", else processor/video_preprocessor_config.json,
 * else processor/preprocessor_config.json (transformers' fallback), keys missing taking the class
 * values (128 * 32 * 32 .. 32 * 32 * 768 pixels, mean = std = 0.5, patch 16 / 2 / 2).
 */
H3_INTERNAL void h3_video_proc_defaults(h3_image_proc_cfg *c);
H3_INTERNAL int h3_video_proc_cfg_load(h3_model *m, h3_image_proc_cfg *c);

/* The video smart_resize: the pixel bounds hold for round(n_frames / temporal_factor) *
   temporal_factor frames of the size (Python's half-to-even). */
H3_INTERNAL int h3_video_smart_resize(int n_frames, int height, int width, int factor, int temporal_factor,
                                      int64_t min_pixels, int64_t max_pixels, int *out_h, int *out_w);

/* Grid (t, h, w in patches) of n_frames frames of this size: t = ceil(n_frames / temporal patch). */
H3_INTERNAL int h3_video_grid(const h3_image_proc_cfg *c, int n_frames, int width, int height, int grid_thw[3],
                              int *patch_dim);

/* pixel_values_videos of one temporal block: block[0 .. temporal_patch_size - 1] are its frames
   (the caller repeats the last frame where the video runs out), each [height][width][3], resized
   to the video's grid (h3_video_grid of the whole n_frames) and laid out as h3_image_pixels. */
H3_INTERNAL int h3_video_block_pixels(const h3_image_proc_cfg *c, int n_frames, const uint8_t *const *block,
                                      int width, int height, float *out);

#endif /* H3_IMAGE_PROC_H */
