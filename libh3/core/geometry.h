/*
 * Render geometry, the single source of truth for how a request's pixels, frames and seconds map
 * to latents and packed rows: frame alignment to the video VAE's clip_length * n + chunk (17n + 5
 * for H3), the spatial ratio and patching, 24 fps, and the audio latent rate (sample rate / hop).
 * The pipeline, the memory estimate and (through h3_plan) Python all use it.
 */
#ifndef H3_GEOMETRY_H
#define H3_GEOMETRY_H

#include "core/internal.h"

#define H3_FPS 24

typedef struct h3_geom_cfg {
    int spatial, temporal, clip;   /* video VAE: 16, 4, 17 for the release */
    int patch_h, patch_w;          /* transformer patch (2, 2) */
    int sample_rate, hop;          /* audio VAE: 32000 Hz, 800 samples per latent */
} h3_geom_cfg;

typedef struct h3_geom {
    int frames;                    /* aligned up */
    int lat_t, lat_h, lat_w;       /* video latents */
    int audio_lat;                 /* audio latents per stereo side */
    int64_t video_tokens, seq;     /* generated video rows; text + audio + video rows */
} h3_geom;

/* The release's geometry (used for components a model lacks). */
H3_INTERNAL void h3_geom_cfg_default(h3_geom_cfg *g);
/* The model's geometry: each present, parsable component's config overrides the defaults (a
   broken config is reported later by the stage that needs it; this never fails). */
H3_INTERNAL void h3_geom_cfg_of_model(h3_model *m, h3_geom_cfg *g);
/* Frames of a clip: `frames` aligned up to clip * n + ceil(clip / temporal), n >= 1. */
H3_INTERNAL int h3_geom_align_frames(const h3_geom_cfg *g, int frames);
/* Latent and row counts of a width x height, `frames`-frame render with `prompt_tokens` tokens. */
H3_INTERNAL void h3_geom_plan(const h3_geom_cfg *g, int width, int height, int frames, int64_t prompt_tokens,
                              h3_geom *out);

/*
 * The model's default render: model_index.json "h3ctl" default_width / default_height /
 * default_frames / default_steps, each else the release's 1344 x 768, 124 frames, 20 steps. The one
 * place these defaults are decided (h3_request_default, and through it h3ctl, read them; the
 * canvas rule below derives its short edge from them). m may be NULL (the release's). A value that
 * is not a whole number in h3_geom_h3ctl_check's range (sides 1 .. 16384, frames 1 .. 100000,
 * steps 2 .. 1000) fails with H3_E_FORMAT naming it, *out then holding the release's value for it.
 */
typedef struct h3_model_defaults {
    int width, height, frames, steps;
} h3_model_defaults;
H3_INTERNAL int h3_geom_model_defaults(h3_model *m, h3_model_defaults *out);
/* model_index.json's "h3ctl" block against the ranges of every key libh3 reads (h3_init calls it once): 0, or
   H3_E_FORMAT naming the key, its range and the value found. */
H3_INTERNAL int h3_geom_h3ctl_check(const h3_model *m);

/*
 * The canvas rule of FL2VA keyframes on this model (keyframe.h): diffusers' canvas_short_edge and
 * canvas_max_pixels are the release's 768 and 768 x 1344, which are the short edge of its default
 * canvas and its pixel limit. A model states its own through model_index.json "h3ctl":
 * canvas_short_edge / canvas_max_pixels when given, else the short edge of default_width x
 * default_height and max_pixels (h3-tiny: 128 and 256 x 256), else the release's. The multiple is
 * the VAE's spatial ratio times the patch (32). Never fails: bad values keep the defaults (the
 * pipeline reports a malformed h3ctl block).
 */
struct h3_canvas_rule;
H3_INTERNAL void h3_geom_canvas_rule(h3_model *m, const h3_geom_cfg *g, struct h3_canvas_rule *out);
/* The short edge Ref2VA image references are resized to: model_index.json's h3ctl
   "reference_image_short_edge", else 2048 scaled by the canvas rule's short edge / 768. */
H3_INTERNAL int h3_geom_ref_image_edge(h3_model *m, const struct h3_canvas_rule *cr);
/* The aspect of a Ref2VA render's default canvas (references never set it): diffusers' 16:9, unless
   model_index.json's h3ctl block gives "reference_aspect_width" and "reference_aspect_height" (h3-tiny's
   Ref2VA, trained on squares only, says 1:1). */
H3_INTERNAL void h3_geom_ref_aspect(h3_model *m, int *aspect_w, int *aspect_h);

/* The fused QKV projection's row order. libh3 (and the official shards) interleave it per head: head
   h holds rows [q_h; k_h; v_h], head_dim rows each. ComfyUI's single files and the Turbo LoRAs stack
   it, [q_all; k_all; v_all]. Row j of the stacked order is this row of libh3's. */
static inline int64_t h3_qkv_interleaved_row(int64_t j, int64_t heads, int64_t head_dim)
{
    const int64_t all = heads * head_dim, part = j / all, r = j % all;
    return (r / head_dim) * 3 * head_dim + part * head_dim + r % head_dim;
}

#endif /* H3_GEOMETRY_H */
