/*
 * The Qwen3-VL vision side of MiniMax-H3's text conditioner (FL2VA keyframes):
 *  - the vision tower (transformers' Qwen3VLVisionModel): patch embedding, the learned position
 *    table resampled to the image's grid, 2-D rotary attention blocks, the 2x2 patch merger and
 *    the deepstack mergers;
 *  - the FL2VA presentation diffusers' MiniMaxH3FL2VATextEncoderStep tokenizes: per keyframe k,
 *    "<Picture k>: " (text rows), <|vision_start|>, one <|image_pad|> per merged patch and
 *    <|vision_end|> (rows tagged as video), then the prompt (text rows);
 *  - the language model over it (text_encoder.c) with the vision rows spliced in, Qwen3-VL's 3-D
 *    rotary positions and the deepstack features added after the first language layers.
 * The cached entry point a render uses is h3_rt_text_encode_images (text_encoder.h).
 */
#ifndef H3_VISION_TOWER_H
#define H3_VISION_TOWER_H

#include "backend/backend.h"
#include "core/image_proc.h"
#include "models/text_encoder.h"

#define H3_VISION_MAX_DEEPSTACK 16
#define H3_VL_MAX_IMAGES 64

/* The tower's and the multimodal prompt's settings (text_encoder/config.json). */
typedef struct h3_vision_cfg {
    int depth, hidden, heads, head_dim, inter, in_ch, patch, temporal_patch, merge, out_hidden;
    int num_pos, pos_side;                       /* learned table of pos_side x pos_side rows */
    int n_deepstack, deepstack[H3_VISION_MAX_DEEPSTACK]; /* deepstack_visual_indexes, as listed */
    double rope_theta;                           /* vision_config.rope_parameters.rope_theta */
    int image_token_id, video_token_id, vision_start_id, vision_end_id;
    int mrope_section[3];                        /* text_config.rope_parameters.mrope_section */
    int text_hidden;
} h3_vision_cfg;

H3_INTERNAL int h3_vision_cfg_load(h3_model *m, h3_vision_cfg *c);

/* Modality tags of diffusers' packed sequence (MINIMAX_H3_VIDEO_TAG / _TEXT_TAG). */
#define H3_TAG_VIDEO 0
#define H3_TAG_TEXT 1

/* The presentation of a prompt and its keyframes, before anything is encoded. */
typedef struct h3_vl_prompt {
    int n;                 /* tokens */
    int32_t *ids;          /* [n] */
    uint8_t *tags;         /* [n]: H3_TAG_TEXT, or H3_TAG_VIDEO for a vision block's rows */
    int n_images;          /* visual items: images, and Ref2VA videos */
    /* Vision blocks (spans): one per image, one per temporal block of a video's sampled frames. */
    int n_spans;
    int *start;            /* [n_spans] index of the block's first pad token */
    int *grid_h, *grid_w;  /* [n_spans] patch grid of the processed image / frames (grid_thw[1], [2]) */
    int *item;             /* [n_spans] the item it shows */
    int *sampled;          /* [n_spans] 0 for an image; a video's count of sampled frames */
    int *frame;            /* [n_spans][temporal patch] a video block's frame indices (last repeated) */
    int tokens;            /* placeholder tokens over all blocks */
    h3_vision_cfg vc;
    h3_image_proc_cfg pc, vpc; /* image and (with videos) video processor settings */
} h3_vl_prompt;

/*
 * Tokenize the FL2VA presentation of `prompt` (UTF-8, may be empty when images are given) with
 * `n_images` keyframes of the given sizes: no pixels are read. Errors: a size the processor
 * refuses (empty, too many pixels, aspect above 200), more than H3_VL_MAX_IMAGES images, the
 * tokenizer's vision tokens disagreeing with the config's ids, nothing to encode.
 */
H3_INTERNAL int h3_vl_prompt_build(h3_model *m, struct h3_tokenizer *tok, const char *prompt, int n_images,
                                   const int *widths, const int *heights, h3_vl_prompt *out);
/*
 * The Ref2VA presentation: as above over n_images visual items in request order, with
 * audio_before[i] "<Audio j>: " labels (j numbered from 1 over the request) before item i and
 * audio_before[n_images] after the last (NULL: none). frames (NULL: all images): frames[i] > 0
 * makes item i a video of that many frames at 24 fps (diffusers' MiniMaxH3Ref2VATextEncoderStep):
 * "<Video k>: ", then per temporal block of its frames sampled at 2 fps "<{t:.1f} seconds>" and a
 * block of <|video_pad|> rows, the frames through the video processor (h3_video_grid). A video
 * with fewer than temporal-patch sampled frames (13 frames for the release) is refused.
 */
H3_INTERNAL int h3_vl_prompt_build_refs(h3_model *m, struct h3_tokenizer *tok, const char *prompt, int n_images,
                                        const int *widths, const int *heights, const int *frames,
                                        const int *audio_before, h3_vl_prompt *out);

/* The rate the conditioner reads a reference video at (diffusers' video_sample_fps). */
#define H3_VL_VIDEO_SAMPLE_FPS 2.0
#define H3_VL_MAX_SAMPLED 4096
/* The frame indices of a video of `frames` frames at 24 fps the conditioner reads (at most cap);
   returns their count or a negative H3_E_* code. */
H3_INTERNAL int h3_vl_video_sample(int frames, int *indices, int cap);
H3_INTERNAL void h3_vl_prompt_free(h3_vl_prompt *p);

/*
 * out [p->n][hidden] = hidden_states[cond_layer] of the presentation, as diffusers'
 * get_qwen3vl_prompt_embeds computes it: each keyframe through the processor and the vision tower,
 * its merger rows in place of its placeholders, the deepstack rows added after language layers
 * 0..k-1. rgb[i]: [heights[i]][widths[i]][3] uint8 ([frames][h][w][3] for a video item). No cache (see h3_rt_text_encode_images).
 * Progress: phase "vision_encoder" per tower block, then "text_encoder" per layer.
 */
H3_INTERNAL int h3_vl_encode(h3_model *m, h3_backend *be, const h3_vl_prompt *p, const uint8_t *const *rgb,
                             const int *widths, const int *heights, float *out, h3_text_run *run);

#endif /* H3_VISION_TOWER_H */
