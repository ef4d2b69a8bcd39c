/* Render geometry (see geometry.h). */
#include "core/geometry.h"
#include "core/keyframe.h"

#include <math.h>
#include <stdio.h>

void h3_geom_cfg_default(h3_geom_cfg *g)
{
    g->spatial = 16;
    g->temporal = 4;
    g->clip = 17;
    g->patch_h = g->patch_w = 2;
    g->sample_rate = 32000;
    g->hop = 800;
}

void h3_geom_cfg_of_model(h3_model *m, h3_geom_cfg *g)
{
    h3_geom_cfg_default(g);
    h3_vvae_cfg vv;
    if (m->comp[H3_COMP_VIDEO_VAE].present && h3_vvae_cfg_load(m, &vv) == 0) {
        g->spatial = vv.spatial;
        g->temporal = vv.temporal;
        g->clip = vv.clip_length;
    }
    h3_avae_cfg av;
    if (m->comp[H3_COMP_AUDIO_VAE].present && h3_avae_cfg_load(m, &av) == 0) {
        int hop = 1;
        for (int i = 0; i < av.n_up; i++) hop *= av.rates[i];
        g->sample_rate = av.sample_rate;
        g->hop = hop;
    }
    h3_dit_cfg dc;
    if (m->comp[H3_COMP_TRANSFORMER].present && h3_dit_cfg_load(m, &dc) == 0) {
        g->patch_h = dc.patch[1];
        g->patch_w = dc.patch[2];
    }
    h3_err_clear();
}

static int chunk_of(const h3_geom_cfg *g) { return (g->clip + g->temporal - 1) / g->temporal; }

int h3_geom_align_frames(const h3_geom_cfg *g, int frames)
{
    const int chunk = chunk_of(g);
    /* n >= 1: a single chunk (5 frames, 2 latent frames for H3) is too short for the video
       decoder, which needs 3 latent frames. */
    if (frames < g->clip + chunk) frames = g->clip + chunk;
    while (frames % g->clip != chunk) frames++;
    return frames;
}

void h3_geom_plan(const h3_geom_cfg *g, int width, int height, int frames, int64_t prompt_tokens, h3_geom *out)
{
    const int chunk = chunk_of(g);
    out->frames = h3_geom_align_frames(g, frames);
    out->lat_t = (out->frames - chunk) / g->clip * chunk + 2;
    out->lat_h = height / g->spatial;
    out->lat_w = width / g->spatial;
    /* diffusers' audio_latent_num_frames: round(frames / fps * latent rate). */
    out->audio_lat = (int)lround((double)out->frames / H3_FPS * ((double)g->sample_rate / g->hop));
    out->video_tokens = (int64_t)out->lat_t * (out->lat_h / g->patch_h) * (out->lat_w / g->patch_w);
    out->seq = prompt_tokens + 2LL * out->audio_lat + out->video_tokens;
}

/* A positive integer of model_index.json's "h3ctl" block, or `dflt`. */
static int64_t h3ctl_int(h3_model *m, const char *key, int64_t dflt)
{
    if (!m->index_loaded) return dflt;
    const h3j *blk = h3j_get(&m->index, h3j_root(&m->index), "h3ctl");
    int64_t v;
    if (blk && h3_cfg_int(&m->index, blk, &v, key, (const char *)NULL) == 0 && v > 0 && v <= (1LL << 40)) return v;
    return dflt;
}

/*
 * model_index.json's "h3ctl" block: the one table of the keys this library reads and their ranges. h3_init checks
 * the whole block once (h3_geom_h3ctl_check), so `h3ctl check`, `info`, `render` and the session refuse the same
 * block with the same words; the readers below then take the values as checked. Other keys are left to newer
 * readers.
 */
static const struct {
    const char *key;
    int64_t lo, hi;
} H3CTL_KEYS[] = {
    {"default_width", 1, 16384}, {"default_height", 1, 16384}, {"default_frames", 1, 100000},
    {"default_steps", 2, 1000}, {"max_pixels", 1, (int64_t)1 << 40}, {"max_frames", 1, 100000},
    {"canvas_short_edge", 1, 16384}, {"canvas_max_pixels", 1, (int64_t)1 << 40},
    {"reference_image_short_edge", 1, 65536}, {"reference_aspect_width", 1, 64},
    {"reference_aspect_height", 1, 64},
};

static const h3j *h3ctl_block(const h3_model *m)
{
    return m && m->index_loaded ? h3j_get(&m->index, h3j_root(&m->index), "h3ctl") : NULL;
}

/* Key i of the block: 0 when absent or in range (*v set when present), else the refusal. */
static int h3ctl_key(const h3_model *m, const h3j *blk, size_t i, int64_t *out, bool *present)
{
    const h3j *v = h3j_get(&m->index, blk, H3CTL_KEYS[i].key);
    *present = v != NULL;
    if (!v) return 0;
    if (v->type == H3J_NUM && v->is_int && v->i >= H3CTL_KEYS[i].lo && v->i <= H3CTL_KEYS[i].hi) {
        *out = v->i;
        return 0;
    }
    char got[48];
    if (v->type == H3J_NUM)
        snprintf(got, sizeof got, "%.17g", v->num);
    else if (v->type == H3J_STR)
        snprintf(got, sizeof got, "\"%.40s\"", h3j_str(&m->index, v));
    else
        snprintf(got, sizeof got, "%s", v->type == H3J_NULL ? "null" : v->type == H3J_OBJ ? "an object" :
                                         v->type == H3J_ARR ? "a list" : "a boolean");
    return h3_err(H3_E_FORMAT, "%s/model_index.json: h3ctl.%s must be a whole number between %lld and %lld, got %s",
                  m->partition_dir, H3CTL_KEYS[i].key, (long long)H3CTL_KEYS[i].lo, (long long)H3CTL_KEYS[i].hi, got);
}

int h3_geom_h3ctl_check(const h3_model *m)
{
    const h3j *blk = h3ctl_block(m);
    if (!blk) return 0;
    if (blk->type != H3J_OBJ)
        return h3_err(H3_E_FORMAT, "%s/model_index.json: \"h3ctl\" must be an object", m->partition_dir);
    for (size_t i = 0; i < sizeof H3CTL_KEYS / sizeof *H3CTL_KEYS; i++) {
        int64_t v;
        bool present;
        int rc = h3ctl_key(m, blk, i, &v, &present);
        if (rc) return rc;
    }
    return 0;
}

int h3_geom_model_defaults(h3_model *m, h3_model_defaults *out)
{
    /* the first four keys of H3CTL_KEYS, with the release's values when the block leaves them out */
    static const int dflt[4] = {1344, 768, 124, 20};
    int *dst[4] = {&out->width, &out->height, &out->frames, &out->steps};
    const h3j *blk = h3ctl_block(m);
    if (blk && blk->type != H3J_OBJ) blk = NULL;
    int rc = 0;
    for (size_t i = 0; i < 4; i++) {
        int64_t v;
        bool present = false;
        *dst[i] = dflt[i];
        const int krc = blk ? h3ctl_key(m, blk, i, &v, &present) : 0;
        if (krc && !rc) rc = krc;
        if (!krc && present) *dst[i] = (int)v;
    }
    return rc;
}

void h3_geom_canvas_rule(h3_model *m, const h3_geom_cfg *g, struct h3_canvas_rule *out)
{
    h3_model_defaults d;
    h3_geom_model_defaults(m, &d);
    const int64_t dw = d.width, dh = d.height;
    const int64_t se = h3ctl_int(m, "canvas_short_edge", dw < dh ? dw : dh);
    out->short_edge = se > (1 << 20) ? (1 << 20) : (int)se;
    out->max_pixels = h3ctl_int(m, "canvas_max_pixels", h3ctl_int(m, "max_pixels", 768 * 1344));
    out->multiple = g->spatial * (g->patch_h > g->patch_w ? g->patch_h : g->patch_w);
    h3_err_clear();
}

int h3_geom_ref_image_edge(h3_model *m, const struct h3_canvas_rule *cr)
{
    /* The release pairs a 768 canvas short edge with 2048-pixel references; a small model keeps
       that ratio unless its h3ctl block says otherwise, as its canvas rule scales the same way. */
    const int64_t dflt = cr->short_edge == 768 ? 2048 : ((int64_t)cr->short_edge * 2048 + 384) / 768;
    const int64_t v = h3ctl_int(m, "reference_image_short_edge", dflt);
    h3_err_clear();
    return v > (1 << 16) ? (1 << 16) : (int)v;
}

void h3_geom_ref_aspect(h3_model *m, int *aspect_w, int *aspect_h)
{
    /* 0 = not given (h3ctl_int takes positive values only). Both or neither: one alone, or an aspect past
       64:1, keeps the release's 16:9 (the canvas rule clamps the extremes anyway). */
    const int64_t w = h3ctl_int(m, "reference_aspect_width", 0), h = h3ctl_int(m, "reference_aspect_height", 0);
    h3_err_clear();
    const bool given = w > 0 && h > 0 && w <= 64 && h <= 64;
    *aspect_w = given ? (int)w : 16;
    *aspect_h = given ? (int)h : 9;
}
