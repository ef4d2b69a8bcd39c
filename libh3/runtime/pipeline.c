/*
 * Text to video + stereo audio, as a context API: prepare (prompt -> tokens -> conditioning ->
 * packed layout, schedule, AdaLN tables, noise) -> step (one Euler transition) -> decode (audio
 * then video into caller buffers). Each phase loads what it needs and lets go of it afterwards,
 * so the text encoder, the transformer and the two decoders are never all resident at once.
 *
 * What is computed follows diffusers' MiniMaxH3ModularPipeline for t2va: the prompt verbatim
 * (no chat template, no special tokens), hidden_states[K] of the Qwen3-VL conditioner, the
 * [text | audio | video] layout, MiniMaxH3Scheduler at the model's two shifts with `steps` sigma
 * grid points (steps - 1 model evaluations unless the shift collapses points), then the decode
 * steps' de-normalisation. The initial noise is libh3's own counter-based generator (schedule.c)
 * unless the caller injects noise tensors.
 *
 * With keyframes it follows the fl2va workflow: the keyframes put onto the canvas (core/keyframe.c),
 * encoded by the video VAE's encoder into one latent frame each, noised to 0.999 z + 0.001 eps and
 * packed as conditioning rows in front of the generated video rows; the prompt presented with a
 * "<Picture k>: " label and a vision block per keyframe; the [text | keyframes | audio | video]
 * layout with the keyframe anchors. The sampler steps only the rows after the conditioning rows
 * (dit.c), so they ride through the loop unchanged. The noise streams are listed in keyframe.h.
 */
#include "models/audio_vae.h"
#include "models/dit.h"
#include "models/lora.h"
#include "models/text_encoder.h"
#include "models/video_vae.h"
#include "models/video_vae_encoder.h"
#include "core/geometry.h"
#include "core/keyframe.h"
#include "core/resample.h"
#include "core/tokenizer.h"
#include "runtime/references.h"
#include "runtime/runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The release's canvas and length limits; a model may override them in model_index.json under
   "h3ctl": {"max_pixels": N, "max_frames": N}. */
#define H3_DEFAULT_MAX_PIXELS (768 * 1344)
#define H3_DEFAULT_MAX_FRAMES 362

struct h3_render {
    int32_t *ids;         /* the prompt's token ids (NULL when the conditioning was injected) */
    int n_ids;
    int n_text;           /* text rows: the ids, or the injected conditioning's rows */
    float *text;          /* [n_text, text hidden] */
    uint8_t *text_tags;   /* [n_text] H3_TAG_TEXT / H3_TAG_VIDEO (vision blocks); NULL = all text */
    int n_cond;           /* keyframe conditions, in packed order (0 for text only) */
    int anchors[2];       /* H3_ANCHOR_* of each */
    int64_t cond_floats;  /* leading floats of vrows that are conditioning rows, never stepped */
    int64_t acond_floats; /* the same of arows: Ref2VA's audio reference rows */
    h3_dit_layout layout;
    float *vrows, *arows; /* packed latents on the transformer's backend, stepped in place */
    h3_backend *be;       /* where vrows/arows live (outlives the transformer: owned by the runtime) */
    uint64_t dit_gen;     /* the transformer's request generation this render set up */
    int64_t vrow_floats, arow_floats;
    int steps, evals, done;
    int sched;            /* h3_sched_find index of the grid; -1 = the request's own sigmas */
    /* geometry: the output's width x height; the transformer and decoders run at rw x rh */
    int width, height, frames, T, lh, lw, Ta, C, AC;
    int rw, rh;
    int olh, olw;         /* the output canvas's latent height and width (for the noise) */
    int64_t samples;
    int sample_rate;
    uint64_t seed;
    int vae_tile; /* 0 = config */
};

static void render_free(struct h3_render *r)
{
    if (!r) return;
    free(r->ids);
    free(r->text);
    free(r->text_tags);
    h3_dit_layout_free(&r->layout);
    if (r->be) {
        r->be->mem->release(r->be, r->vrows);
        r->be->mem->release(r->be, r->arows);
    }
    free(r);
}

void h3_rt_render_free(h3_runtime *rt)
{
    render_free(rt->render);
    rt->render = NULL;
}

int h3_rt_request_default(h3_runtime *rt, h3_request *r)
{
    if (!r) return h3_err(H3_E_INVALID, "NULL request");
    memset(r, 0, sizeof *r);
    r->struct_size = sizeof *r;
    r->seed = 42;
    h3_model_defaults d;
    int rc = h3_geom_model_defaults(rt ? rt->model : NULL, &d);
    r->width = d.width;
    r->height = d.height;
    r->frames = d.frames;
    r->steps = d.steps;
    return rc;
}

static int model_limit(h3_model *m, const char *key, int64_t dflt, int64_t *out)
{
    *out = dflt;
    if (!m->index_loaded) return 0;
    const h3j *h = h3j_get(&m->index, h3j_root(&m->index), "h3ctl");
    int64_t v;
    if (h && h3_cfg_int(&m->index, h, &v, key, (const char *)NULL) == 0) {
        if (v <= 0) return h3_err(H3_E_FORMAT, "%s/model_index.json: h3ctl.%s must be positive", m->partition_dir, key);
        *out = v;
    }
    return 0;
}

static int widen_request(const h3_request *q, h3_request *out, h3_parity *parity);

/* The schedule the model (model_index.json "h3ctl": {"schedule": NAME}) or its LoRA files declare
   (*decl; NULL = none; *model_decl: the model's own). Both declaring different ones fails. */
static int declared_schedule(h3_model *m, const char *lora_decl, const char **model_decl, const char **decl)
{
    *model_decl = *decl = NULL;
    const h3j *h = m->index_loaded ? h3j_get(&m->index, h3j_root(&m->index), "h3ctl") : NULL;
    const h3j *v = h ? h3j_get(&m->index, h, "schedule") : NULL;
    if (v) {
        if (v->type != H3J_STR || h3_sched_find(h3j_str(&m->index, v)) < 0)
            return h3_err(H3_E_FORMAT, "%s/model_index.json: h3ctl.schedule must name a known schedule (%s)",
                          m->partition_dir, h3_sched_names());
        *model_decl = h3j_str(&m->index, v);
    }
    if (*model_decl && lora_decl && strcmp(*model_decl, lora_decl) != 0)
        return h3_err(H3_E_INVALID, "schedule: the model declares '%s' but its LoRA declares '%s'", *model_decl,
                      lora_decl);
    *decl = *model_decl ? *model_decl : lora_decl;
    return 0;
}

int h3_rt_schedule_declared(h3_runtime *rt, const h3_request *request, char *name, int cap)
{
    h3_request q;
    h3_parity parity;
    int rc = widen_request(request, &q, &parity);
    if (rc) return rc;
    if (!name || cap < 1) return h3_err(H3_E_INVALID, "schedule: no room for the name");
    h3_model *m = rt->model;
    if (q.n_lora < 0 || q.n_lora > 64 || (q.n_lora && !q.lora_paths))
        return h3_err(H3_E_INVALID, "LoRA: %d files (0 to 64, with their paths)", q.n_lora);
    h3_lora *l = NULL;
    if (q.n_lora && (rc = h3_lora_open(m, q.lora_paths, q.lora_scales, q.n_lora, &l))) return rc;
    const char *model_decl, *decl;
    rc = declared_schedule(m, h3_lora_schedule(l), &model_decl, &decl);
    if (!rc && decl) snprintf(name, (size_t)cap, "%s", decl);
    if (!rc && !decl) name[0] = 0;
    h3_lora_free(l);
    return rc ? rc : decl != NULL;
}

/* The grid a request runs (docs/few-step.md): its own sigmas, the schedule it names, or the one the
   model (model_index.json "h3ctl": {"schedule": NAME}) or its LoRA files declare; "h3" when none
   says. A name that does not exist, or one that differs from a declaration, fails here. */
static int request_schedule(h3_model *m, const h3_request *q, const char *lora_decl, struct h3_render *r)
{
    const bool named = q->schedule && q->schedule[0];
    if (q->sigmas || q->n_sigmas) {
        if (named)
            return h3_err(H3_E_INVALID, "schedule '%s' and explicit sigmas: give one of them", q->schedule);
        if (!q->sigmas) return h3_err(H3_E_INVALID, "sigmas: %d values but no array", q->n_sigmas);
        int rc = h3_sched_check(q->sigmas, q->n_sigmas, "video");
        if (!rc) rc = h3_sched_check(q->sigmas + q->n_sigmas, q->n_sigmas, "audio");
        if (rc) return rc;
        r->sched = -1;
        r->steps = q->n_sigmas;
        return 0;
    }
    if (named && h3_sched_find(q->schedule) < 0)
        return h3_err(H3_E_INVALID, "schedule '%s' does not exist (known: %s)", q->schedule, h3_sched_names());
    const char *model_decl = NULL, *decl = NULL;
    int rc = declared_schedule(m, lora_decl, &model_decl, &decl);
    if (rc) return rc;
    if (named && decl && strcmp(q->schedule, decl) != 0)
        return h3_err(H3_E_INVALID, "schedule '%s' does not fit: the %s declares '%s'", q->schedule,
                      model_decl ? "model" : "LoRA", decl);
    r->sched = h3_sched_find(named ? q->schedule : decl ? decl : "h3");
    return 0;
}

/* `derived`: the canvas came from a keyframe by the model's canvas rule, whose rounding to the
   multiple may leave it slightly above max_pixels, as diffusers' resolve_canvas_size does. */
static int check_shape(h3_runtime *rt, const h3_request *q, const h3_dit_cfg *dc, const h3_vvae_cfg *vc, bool derived,
                       struct h3_render *r)
{
    h3_model *m = rt->model;
    int multiple = vc->spatial * (dc->patch[1] > dc->patch[2] ? dc->patch[1] : dc->patch[2]);
    if (q->width < multiple || q->height < multiple || q->width % multiple || q->height % multiple)
        return h3_err(H3_E_INVALID, "width and height must be multiples of %d and at least %d, got %dx%d", multiple,
                      multiple, q->width, q->height);
    int64_t max_pixels, max_frames;
    int rc;
    if ((rc = model_limit(m, "max_pixels", H3_DEFAULT_MAX_PIXELS, &max_pixels)) ||
        (rc = model_limit(m, "max_frames", H3_DEFAULT_MAX_FRAMES, &max_frames)))
        return rc;
    if (!derived && (int64_t)q->width * q->height > max_pixels)
        return h3_err(H3_E_INVALID, "%dx%d is %lld pixels, more than this model's limit of %lld", q->width,
                      q->height, (long long)q->width * q->height, (long long)max_pixels);
    if (q->frames < 1 || q->frames > 100000)
        return h3_err(H3_E_INVALID, "frames must be between 1 and 100000, got %d", q->frames);
    /* The smaller canvas the transformer and the decoders run at, resized to the output at the end. */
    int rw = q->width, rh = q->height;
    if (q->render_width || q->render_height) {
        rw = q->render_width;
        rh = q->render_height;
        if (rw < multiple || rh < multiple || rw % multiple || rh % multiple)
            return h3_err(H3_E_INVALID, "render size must be multiples of %d and at least %d, got %dx%d", multiple,
                          multiple, rw, rh);
        if (rw > q->width || rh > q->height)
            return h3_err(H3_E_INVALID, "render size %dx%d is larger than the output %dx%d", rw, rh, q->width,
                          q->height);
        if ((int64_t)rw * q->height != (int64_t)rh * q->width)
            return h3_err(H3_E_INVALID, "render size %dx%d has another aspect than the output %dx%d", rw, rh,
                          q->width, q->height);
    }
    h3_geom_cfg gc;
    h3_geom_cfg_of_model(m, &gc);
    h3_geom g;
    h3_geom out_g;
    h3_geom_plan(&gc, q->width, q->height, q->frames, 0, &out_g);
    r->olh = out_g.lat_h;
    r->olw = out_g.lat_w;
    h3_geom_plan(&gc, rw, rh, q->frames, 0, &g);
    const int frames = g.frames;
    if (frames > max_frames)
        return h3_err(H3_E_INVALID, "%d frames (aligned up to %d) exceed this model's limit of %lld", q->frames,
                      frames, (long long)max_frames);
    if (q->steps < 2 || q->steps > 1000)
        return h3_err(H3_E_INVALID, "steps must be between 2 and 1000, got %d", q->steps);
    r->width = q->width;
    r->height = q->height;
    r->rw = rw;
    r->rh = rh;
    r->frames = frames;
    r->T = g.lat_t;
    r->lh = g.lat_h;
    r->lw = g.lat_w;
    r->Ta = g.audio_lat;
    r->C = vc->latent_ch;
    r->AC = dc->audio_ch;
    r->steps = q->steps;
    r->seed = q->seed;
    return 0;
}

/* Area weights of one axis: output i covers input [i n/m, (i+1) n/m); w[i][j] is its overlap with
   input cell j (first[i] = the first j, count[i] cells). */
static int area_axis(int n, int m, int **first, int **count, double **w, int *taps)
{
    *taps = (n + m - 1) / m + 1;
    *first = h3_malloc(sizeof(int) * (size_t)m);
    *count = h3_malloc(sizeof(int) * (size_t)m);
    *w = h3_calloc((size_t)m * (size_t)*taps, sizeof(double));
    if (!*first || !*count || !*w) return -H3_E_NOMEM;
    for (int i = 0; i < m; i++) {
        const double a = (double)i * n / m, b = (double)(i + 1) * n / m;
        int j0 = (int)floor(a), k = 0;
        (*first)[i] = j0;
        for (int j = j0; j < n && j < b && k < *taps; j++) {
            const double lo = a > j ? a : j, hi = b < j + 1 ? b : j + 1;
            if (hi > lo) (*w)[i * *taps + k] = hi - lo;
            k++;
        }
        (*count)[i] = k;
    }
    return 0;
}

/*
 * The video noise of a smaller render canvas, made from the output canvas's noise for the same
 * seed: each latent of the small grid is the area-weighted sum of the full-size noise it covers,
 * divided by the L2 norm of its weights, so it is standard normal again. A render at a smaller
 * size then starts from a coarse view of the full-size render's noise and keeps its composition,
 * which makes drafts look like the render they stand for (and lets quality be measured against
 * it).
 */
static int canvas_noise(uint64_t seed, int C, int T, int H, int W, int h, int w, float *out)
{
    int64_t full_n = (int64_t)C * T * H * W;
    float *full = h3_alloc_aligned(sizeof(float) * (size_t)full_n);
    int *fy = NULL, *cy = NULL, *fx = NULL, *cx = NULL, ty = 0, tx = 0;
    double *wy = NULL, *wx = NULL;
    int rc = full ? 0 : -H3_E_NOMEM;
    if (!rc) rc = area_axis(H, h, &fy, &cy, &wy, &ty);
    if (!rc) rc = area_axis(W, w, &fx, &cx, &wx, &tx);
    if (!rc) {
        h3_noise(seed, 0, 0, full, full_n);
        for (int64_t ct = 0; ct < (int64_t)C * T; ct++) {
            const float *src = full + ct * H * W;
            for (int i = 0; i < h; i++)
                for (int j = 0; j < w; j++) {
                    double acc = 0, norm = 0;
                    for (int a = 0; a < cy[i]; a++)
                        for (int b = 0; b < cx[j]; b++) {
                            const double wt = wy[i * ty + a] * wx[j * tx + b];
                            acc += wt * src[(int64_t)(fy[i] + a) * W + fx[j] + b];
                            norm += wt * wt;
                        }
                    out[(ct * h + i) * w + j] = (float)(norm > 0 ? acc / sqrt(norm) : 0.0);
                }
        }
    }
    h3_free_aligned(full);
    free(fy);
    free(cy);
    free(fx);
    free(cx);
    free(wy);
    free(wx);
    return rc;
}

static int progress(h3_runtime *rt, const char *phase, int done, int total)
{
    return h3_rt_progress(rt, phase, done, total);
}

/*
 * The most prompt tokens (with a keyframe's or reference's presentation, its rows) a request may
 * have: the text encoder's context, text_config.max_position_embeddings (the positions its RoPE was
 * trained for). Past it the encoder's output means nothing, and the transformer's joint attention,
 * whose cost grows with the square of the sequence, would run for minutes on a prompt that can only
 * be a mistake; such a prompt is refused before any work.
 */
static int prompt_token_limit(h3_model *m)
{
    const h3_comp *c = &m->comp[H3_COMP_TEXT_ENCODER];
    const h3j *root = h3j_root(&c->config);
    const h3j *t = root ? h3j_get(&c->config, root, "text_config") : NULL;
    if (!t || t->type != H3J_OBJ) t = root;
    int64_t v = 0;
    if (!t || h3_cfg_int(&c->config, t, &v, "max_position_embeddings", (const char *)NULL) != 0 || v < 1 ||
        v > H3_TEXT_MAX_TOKENS)
        v = H3_TEXT_MAX_TOKENS;
    return (int)v;
}

static int prompt_token_check(h3_model *m, int64_t n, const char *what)
{
    const int limit = prompt_token_limit(m);
    if (n > limit)
        return h3_err(H3_E_INVALID, "the prompt%s has %lld tokens, more than this model's limit of %d (its text "
                      "encoder's context); shorten it", what, (long long)n, limit);
    return 0;
}

static int tokenize(h3_runtime *rt, const char *prompt, struct h3_render *r)
{
    h3_model *m = rt->model;
    int rc = h3_model_require(m, H3_COMP_TOKENIZER, "tokenizing the prompt");
    if (rc) return rc;
    if (!rt->tokenizer && !(rt->tokenizer = h3_tokenizer_load(m->comp[H3_COMP_TOKENIZER].config_path)))
        return -H3_E_FORMAT;
    size_t len = strlen(prompt);
    int64_t cap = (int64_t)len + 16;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = h3_malloc(sizeof *ids * (size_t)cap);
        if (!ids) return -H3_E_NOMEM;
        int64_t n = h3_tokenize(rt->tokenizer, prompt, len, ids, cap);
        if (n < 0) {
            free(ids);
            h3_err_prefix("prompt");
            return (int)n;
        }
        if (n <= cap) {
            if (n == 0) {
                free(ids);
                return h3_err(H3_E_INVALID, "the prompt is empty");
            }
            int lrc = prompt_token_check(m, n, "");
            if (lrc) {
                free(ids);
                return lrc;
            }
            r->ids = ids;
            r->n_ids = (int)n;
            return 0;
        }
        free(ids);
        cap = n;
    }
    return h3_err(H3_E_INVALID, "prompt: token count changed between calls");
}

typedef struct {
    h3_dit_cfg dc;
    h3_vvae_cfg vc;
    h3_avae_cfg ac;
    h3_text_cfg tc;
} cfgs;

/* Configs of every component a render needs, checked to fit together, and the request's shape. */
/* The caller's request (and its parity injections) widened to this library's structs: fields an
   older caller did not know keep their defaults (zero), and nothing past either struct_size is
   read. out->parity always points at *parity afterwards (all NULL when the caller gave none). */
static int widen_request(const h3_request *q, h3_request *out, h3_parity *parity)
{
    if (!q) return h3_err(H3_E_INVALID, "NULL request");
    if (q->struct_size < offsetof(h3_request, seed) + sizeof q->seed || q->struct_size > sizeof *q)
        return h3_err(H3_E_INVALID, "h3_request.struct_size %u is not a size this library knows", q->struct_size);
    memset(out, 0, sizeof *out);
    memcpy(out, q, q->struct_size);
    memset(parity, 0, sizeof *parity);
    parity->struct_size = sizeof *parity;
    const h3_parity *p = out->parity;
    out->parity = parity;
    if (p) {
        if (p->struct_size < offsetof(h3_parity, audio_noise) + sizeof p->audio_noise || p->struct_size > sizeof *p)
            return h3_err(H3_E_INVALID, "h3_parity.struct_size %u is not a size this library knows", p->struct_size);
        memcpy(parity, p, p->struct_size);
    }
    return 0;
}

/* The request's speed knobs as the transformer takes them. */
static void request_knobs(const h3_request *q, h3_dit_knobs *k)
{
    memset(k, 0, sizeof *k);
    k->reuse = q->reuse;
    k->core_reuse = q->core_reuse;
    k->layers = q->layers;
    k->layer_policy = q->layer_policy;
    k->token_reduction = q->token_reduction;
    k->cache_threshold = q->cache_threshold;
}

/* ---- FL2VA keyframes ------------------------------------------------------------------- */

/* The keyframes of a request in packed order: the first frame, then the last. */
typedef struct {
    int n;
    int anchor[2];
    const char *name[2];
    const uint8_t *rgb[2]; /* NULL when only the latent was injected */
    int w[2], h[2];
    const float *noise[2], *posterior[2], *latent[2];
} keyframes;

static int request_keyframes(const h3_request *q, keyframes *kf)
{
    memset(kf, 0, sizeof *kf);
    const struct {
        const char *name;
        int anchor;
        const uint8_t *rgb;
        int w, h;
        const float *noise, *posterior, *latent;
    } in[2] = {{"first frame", H3_ANCHOR_FIRST, q->first_frame, q->first_width, q->first_height, q->parity->first_noise,
                q->parity->first_posterior_noise, q->parity->first_latent},
               {"last frame", H3_ANCHOR_LAST, q->last_frame, q->last_width, q->last_height, q->parity->last_noise,
                q->parity->last_posterior_noise, q->parity->last_latent}};
    for (int i = 0; i < 2; i++) {
        if (!in[i].rgb && !in[i].latent) {
            if (in[i].noise || in[i].posterior)
                return h3_err(H3_E_INVALID, "%s: noise given without the keyframe (its image or latent)", in[i].name);
            continue;
        }
        if (in[i].rgb) {
            int rc = h3_keyframe_check(in[i].w, in[i].h, in[i].name);
            if (rc) return rc;
        }
        const int k = kf->n++;
        kf->anchor[k] = in[i].anchor;
        kf->name[k] = in[i].name;
        kf->rgb[k] = in[i].rgb;
        kf->w[k] = in[i].w;
        kf->h[k] = in[i].h;
        kf->noise[k] = in[i].noise;
        kf->posterior[k] = in[i].posterior;
        kf->latent[k] = in[i].latent;
    }
    return 0;
}

/* The last frame is cover-cropped when it follows a first frame; a lone keyframe is stretched. */
static int keyframe_cover(const keyframes *kf, int k) { return kf->n == 2 && kf->anchor[k] == H3_ANCHOR_LAST; }

/*
 * The keyframe encoders: the video VAE's encoder (models/video_vae_encoder.c) and the text
 * encoder's vision side (models/vision_tower.c through the prompt cache, runtime/text_cache.c).
 */

/* Plan-time check that the video VAE can encode a keyframe of the transformer's canvas into one
   latent frame of the layout's geometry (config and headers only). */
static int keyframe_encoder_check(h3_model *m, int W, int H, int C, int lh, int lw)
{
    int rc = h3_model_require(m, H3_COMP_VIDEO_VAE, "encoding keyframes");
    if (!rc) rc = h3_model_headers(m, H3_COMP_VIDEO_VAE);
    if (rc) return rc;
    /* The encoder's config loads whether or not its weights are there: look for them. */
    static const char *const names[] = {"encoder.conv_in.weight", "encoder.conv_out.weight", "quant_conv.weight"};
    const h3_comp *c = &m->comp[H3_COMP_VIDEO_VAE];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!h3_store_find(&c->store, names[i]))
            return h3_err(H3_E_SCHEMA, "%s: the video VAE has no encoder weights (%s), which keyframes need",
                          c->weights_dir ? c->weights_dir : c->dir, names[i]);
    h3_venc_cfg vc;
    int ec, et, eh, ew;
    if ((rc = h3_venc_cfg_load(m, &vc)) || (rc = h3_venc_shape(&vc, 1, H, W, 0, 0, 0, &ec, &et, &eh, &ew))) return rc;
    if (ec != C || et != 1 || eh != lh || ew != lw)
        return h3_err(H3_E_FORMAT, "%s: the video VAE encodes a %dx%d keyframe into %dx%dx%dx%d latents, the "
                      "transformer expects %dx1x%dx%d", c->dir, W, H, ec, et, eh, ew, C, lh, lw);
    return 0;
}

/* A keyframe [H][W][3] on the canvas -> its normalised latent [C, 1, H/s, W/s], as diffusers'
   encode_vae_condition: the posterior sampled with `eps` (same shape), or with libh3's noise at
   seed 42, stream H3_STREAM_POSTERIOR (keyframe.h). */
static int keyframe_encode(h3_runtime *rt, const uint8_t *rgb, int W, int H, const float *eps, float *out)
{
    h3_backend *cpu;
    int rc = h3_rt_cpu_backend(rt, &cpu);
    if (rc) return rc;
    const h3_venc_cond c = {.rgb = rgb, .T = 1, .H = H, .W = W, .eps = eps, .seed = H3_KEYFRAME_ENCODE_SEED,
                            .stream = H3_STREAM_POSTERIOR, .out = out, .progress = rt->progress,
                            .user = rt->progress_user};
    return h3_venc_condition(rt->model, cpu, &c);
}

/* Plan-time check of the prompt's presentation with n images of w[i] x h[i] (tokenizer and
   configs; no pixels read): the model has a vision tower and the processor takes the sizes. */
static int keyframe_text_check(h3_runtime *rt, const char *prompt, int n, const int *w, const int *h,
                               const int *frames, const int *audio_before)
{
    h3_model *m = rt->model;
    int rc = h3_model_require(m, H3_COMP_TEXT_ENCODER, "encoding keyframes for the prompt");
    if (!rc) rc = h3_model_headers(m, H3_COMP_TEXT_ENCODER);
    if (rc) return rc;
    const h3_comp *c = &m->comp[H3_COMP_TEXT_ENCODER];
    if (!h3_store_find(&c->store, "model.visual.patch_embed.proj.weight"))
        return h3_err(H3_E_SCHEMA, "%s: the text encoder has no vision tower (model.visual.*), which keyframes need",
                      c->weights_dir ? c->weights_dir : c->dir);
    rc = h3_rt_text_refs_rows(rt, prompt ? prompt : "", n, w, h, frames, audio_before);
    if (rc > 0) rc = prompt_token_check(m, rc, " with its images");
    return rc < 0 ? rc : 0;
}

/* The render takes over a text encode's rows (ids, hidden states, tags): a prompt with images or references. */
static void take_text_rows(struct h3_render *r, const h3_text_rows *tr)
{
    r->n_ids = r->n_text = tr->n;
    r->ids = tr->ids;
    r->text = tr->rows;
    r->text_tags = tr->tags;
}

/* diffusers' fl2va presentation ("<Picture k>: ", a vision block per keyframe, then the prompt)
   through the text encoder with its vision tower, cached: sets r->ids / n_ids, n_text, text and
   text_tags. The keyframes are on the output canvas W x H, as the processor sees them. */
static int keyframe_text_encode(h3_runtime *rt, const char *prompt, const uint8_t *const *frames, int n, int W,
                                int H, struct h3_render *r)
{
    const int w[2] = {W, W}, h[2] = {H, H};
    h3_text_rows tr;
    int rc = h3_rt_text_encode_images(rt, prompt, n, frames, w, h, &tr);
    if (!rc) take_text_rows(r, &tr);
    return rc;
}

static int plan(h3_runtime *rt, h3_request *q, cfgs *k, struct h3_render *r, keyframes *kf, h3_ref_plan *rp)
{
    if (!q) return h3_err(H3_E_INVALID, "NULL argument");
    if (q->vae_tile_px < 0 || q->vae_tile_px > 65536)
        return h3_err(H3_E_INVALID, "VAE tile size must be 0 (the model's) or a positive number of pixels, got %d",
                      q->vae_tile_px);
    h3_model *m = rt->model;
    int rc;
    if ((rc = h3_model_require(m, H3_COMP_TRANSFORMER, "denoising")) ||
        (rc = h3_model_require(m, H3_COMP_TEXT_ENCODER, "encoding the prompt")) ||
        (rc = h3_model_require(m, H3_COMP_TOKENIZER, "tokenizing the prompt")) ||
        (rc = h3_model_require(m, H3_COMP_VIDEO_VAE, "decoding video")) ||
        (rc = h3_model_require(m, H3_COMP_AUDIO_VAE, "decoding audio")))
        return rc;
    if ((rc = h3_dit_cfg_load(m, &k->dc)) || (rc = h3_vvae_cfg_load(m, &k->vc)) || (rc = h3_avae_cfg_load(m, &k->ac)) ||
        (rc = h3_text_cfg_load(m, &k->tc)))
        return rc;
    if (k->dc.video_ch != k->vc.latent_ch || k->dc.audio_ch != k->ac.latent_ch || k->dc.text_dim != k->tc.hidden)
        return h3_err(H3_E_FORMAT,
                      "%s: components do not fit together (transformer latents %d/%d, text %d; video VAE %d, "
                      "audio VAE %d, text encoder %d)",
                      m->partition_dir, k->dc.video_ch, k->dc.audio_ch, k->dc.text_dim, k->vc.latent_ch,
                      k->ac.latent_ch, k->tc.hidden);
    /* References (Ref2VA): checked first so a bad reference fails before any other work. */
    memset(rp, 0, sizeof *rp);
    if ((rc = h3_ref_request_check(m, q))) return rc;
    /* Keyframes: a canvas left at 0 x 0 follows the first keyframe's aspect by the model's rule. */
    if ((rc = request_keyframes(q, kf))) return rc;
    bool derived = false;
    if (q->n_references && (q->width == 0 || q->height == 0)) {
        /* References never set the canvas: diffusers' setup step resolves 16:9 by the model's rule (a
           model's h3ctl block may name another aspect: h3_geom_ref_aspect). */
        if (q->width || q->height) return h3_err(H3_E_INVALID, "give width and height together, or neither");
        h3_geom_cfg gc;
        h3_geom_cfg_of_model(m, &gc);
        h3_canvas_rule cr;
        h3_geom_canvas_rule(m, &gc, &cr);
        int aw, ah;
        h3_geom_ref_aspect(m, &aw, &ah);
        if ((rc = h3_canvas_resolve(&cr, aw, ah, &q->width, &q->height))) return rc;
        derived = true;
    }
    if (kf->n && (q->width == 0 || q->height == 0)) {
        if (q->width || q->height)
            return h3_err(H3_E_INVALID, "give width and height together, or neither (the canvas then follows the %s)",
                          kf->name[0]);
        if (!kf->rgb[0])
            return h3_err(H3_E_INVALID, "%s given as a latent: width and height are needed", kf->name[0]);
        h3_geom_cfg gc;
        h3_geom_cfg_of_model(m, &gc);
        h3_canvas_rule cr;
        h3_geom_canvas_rule(m, &gc, &cr);
        if ((rc = h3_canvas_resolve(&cr, kf->w[0], kf->h[0], &q->width, &q->height))) return rc;
        derived = true;
    }
    if ((rc = check_shape(rt, q, &k->dc, &k->vc, derived, r))) return rc;
    if (q->parity->text_states) {
        if (q->parity->text_rows < 1 || q->parity->text_rows > H3_TEXT_MAX_TOKENS)
            return h3_err(H3_E_INVALID, "text_states: %d rows (1 to %d)", q->parity->text_rows, H3_TEXT_MAX_TOKENS);
    } else if (q->parity->text_rows || q->parity->text_tags) {
        return h3_err(H3_E_INVALID, "text_rows / text_tags given without text_states");
    }
    bool encode = false;
    for (int i = 0; i < kf->n; i++) {
        if (kf->rgb[i] && !kf->latent[i]) encode = true;
        if (!kf->rgb[i] && !q->parity->text_states)
            return h3_err(H3_E_INVALID, "%s: its image is needed to present it to the text encoder", kf->name[i]);
    }
    if (encode && (rc = keyframe_encoder_check(m, r->rw, r->rh, r->C, r->lh, r->lw))) return rc;
    if (q->n_references) {
        /* Each image reference is encoded and shown to the text encoder at its own size. */
        if (q->parity->text_states) return h3_err(H3_E_INVALID, "references: text_states cannot be injected with references");
        if ((rc = h3_ref_plan_images(m, q, r->frames, r->C, k->vc.spatial, rp))) return rc;
        for (int i = 0; i < rp->n; i++)
            if ((rc = keyframe_encoder_check(m, rp->w[i], rp->h[i], r->C, rp->lh[i], rp->lw[i]))) {
                h3_err_prefix("reference %d", rp->index[i] + 1);
                return rc;
            }
        if ((rc = h3_ref_plan_audio(m, q, r->frames, rp))) return rc;
        if ((rc = keyframe_text_check(rt, q->prompt, rp->n, rp->w, rp->h, rp->frames, rp->audio_before))) return rc;
    }
    if (kf->n && !q->parity->text_states) {
        const int kw[2] = {q->width, q->width}, kh[2] = {q->height, q->height};
        if ((rc = keyframe_text_check(rt, q->prompt, kf->n, kw, kh, NULL, NULL))) return rc;
    }
    r->n_cond = kf->n;
    for (int i = 0; i < kf->n; i++) r->anchors[i] = kf->anchor[i];
    if (q->vae_tile_px && (q->vae_tile_px % k->vc.spatial || q->vae_tile_px <= k->vc.tile_overlap))
        return h3_err(H3_E_INVALID, "VAE tile size %d must be a multiple of %d and larger than the %d-pixel overlap",
                      q->vae_tile_px, k->vc.spatial, k->vc.tile_overlap);
    /* The speed knobs and the LoRA files are checked here too, so bad ones fail before any work:
       the LoRA files' keys and shapes against the transformer's headers (no tensor data read). */
    h3_dit_knobs kn;
    request_knobs(q, &kn);
    if ((rc = h3_dit_knobs_check(&k->dc, &kn))) return rc;
    if (q->n_lora < 0 || q->n_lora > 64 || (q->n_lora && !q->lora_paths))
        return h3_err(H3_E_INVALID, "LoRA: %d files (0 to 64, with their paths)", q->n_lora);
    const char *lora_decl = NULL;
    h3_lora *l = NULL;
    if (q->n_lora && (rc = h3_lora_open(m, q->lora_paths, q->lora_scales, q->n_lora, &l))) return rc;
    lora_decl = h3_lora_schedule(l);
    rc = request_schedule(m, q, lora_decl, r);
    h3_lora_free(l);
    if (rc) return rc;
    r->vae_tile = q->vae_tile_px;
    r->sample_rate = k->ac.sample_rate;
    r->samples = h3_avae_samples(&k->ac, r->Ta);
    if (r->samples < 0) return (int)r->samples;
    return 0;
}

static void fill_info(const struct h3_render *r, h3_render_info *out)
{
    out->width = r->width;
    out->height = r->height;
    out->frames = r->frames;
    out->fps = H3_FPS;
    out->audio_samples = r->samples;
    out->sample_rate = r->sample_rate;
    out->latent_frames = r->T;
    out->latent_height = r->lh;
    out->latent_width = r->lw;
    out->latent_channels = r->C;
    out->audio_latents = r->Ta;
    out->audio_latent_channels = r->AC;
    out->prompt_tokens = r->n_text;
    out->steps = r->evals;
    out->steps_done = r->done;
    out->sequence = r->layout.seq;
}

int h3_rt_plan(h3_runtime *rt, const h3_request *request, h3_render_info *out)
{
    if (!out) return h3_err(H3_E_INVALID, "NULL argument");
    if (out->struct_size != sizeof *out)
        return h3_err(H3_E_INVALID, "h3_render_info.struct_size %u, expected %zu", out->struct_size, sizeof *out);
    h3_request wide, *q = &wide;
    h3_parity wide_parity;
    int rc = widen_request(request, &wide, &wide_parity);
    if (rc) return rc;
    struct h3_render r;
    memset(&r, 0, sizeof r);
    cfgs k;
    keyframes kf;
    h3_ref_plan rp;
    rc = plan(rt, q, &k, &r, &kf, &rp);
    if (rc) return rc;
    fill_info(&r, out);
    return 0;
}

/* Step 1: the conditioning rows. Injected (text_states), the fl2va presentation of the keyframes,
   or the prompt alone (tokenized, then the cached text encoder). */
static int prepare_text(h3_runtime *rt, const h3_request *q, const keyframes *kf, const h3_ref_plan *rp, int hidden,
                        h3_pool *pool, struct h3_render *r)
{
    int rc;
    if (rp->n) {
        /* ref2va's presentation: an image reference as fl2va's keyframes ("<Picture k>: " and a
           vision block) at its own encoding size; a video reference's frames at 24 fps on its
           canvas, sampled by the text encoder ("<Video k>: " and timestamped blocks). */
        uint8_t *sized[H3_REF_MAX] = {NULL};
        rc = 0;
        for (int i = 0; i < rp->n && !rc; i++) {
            const h3_reference *f = &q->references[rp->index[i]];
            /* a video's slots are zeroed (calloc: pages untouched until written) and only the frames
               the text encoder samples are resized into them */
            const size_t frames = rp->frames[i] ? (size_t)rp->frames[i] : 1;
            if (!(sized[i] = h3_calloc((size_t)rp->w[i] * (size_t)rp->h[i] * 3, frames)))
                rc = -H3_E_NOMEM;
            else if (rp->frames[i])
                rc = h3_ref_video_pixels(pool, q, rp, i, rp->frames[i], true, sized[i]);
            else
                rc = h3_keyframe_place(pool, f->rgb, f->width, f->height, rp->w[i], rp->h[i], 0, sized[i]);
        }
        h3_text_rows tr;
        if (!rc)
            rc = h3_rt_text_encode_refs(rt, q->prompt, rp->n, (const uint8_t *const *)sized, rp->w, rp->h,
                                        rp->frames, rp->audio_before, &tr);
        for (int i = 0; i < rp->n; i++) free(sized[i]);
        if (!rc) take_text_rows(r, &tr);
        return rc;
    }
    if (q->parity->text_states) {
        r->n_text = q->parity->text_rows;
        r->text = h3_malloc(sizeof(float) * (size_t)r->n_text * (size_t)hidden);
        if (!r->text) return -H3_E_NOMEM;
        memcpy(r->text, q->parity->text_states, sizeof(float) * (size_t)r->n_text * (size_t)hidden);
        if (q->parity->text_tags) {
            if (!(r->text_tags = h3_malloc((size_t)r->n_text))) return -H3_E_NOMEM;
            memcpy(r->text_tags, q->parity->text_tags, (size_t)r->n_text);
        }
        return 0;
    }
    if (kf->n) {
        /* The processor sees the keyframes as the encoder would at the output canvas. */
        uint8_t *placed[2] = {NULL, NULL};
        const size_t px = (size_t)q->width * (size_t)q->height * 3;
        rc = 0;
        for (int i = 0; i < kf->n && !rc; i++) {
            if (!(placed[i] = h3_malloc(px)))
                rc = -H3_E_NOMEM;
            else
                rc = h3_keyframe_place(pool, kf->rgb[i], kf->w[i], kf->h[i], q->width, q->height,
                                       keyframe_cover(kf, i), placed[i]);
        }
        if (!rc)
            rc = keyframe_text_encode(rt, q->prompt, (const uint8_t *const *)placed, kf->n, q->width, q->height, r);
        free(placed[0]);
        free(placed[1]);
        return rc;
    }
    if ((rc = progress(rt, "tokenize", 0, 1)) || (rc = tokenize(rt, q->prompt, r)) ||
        (rc = progress(rt, "tokenize", 1, 1)))
        return rc;
    r->n_text = r->n_ids;
    r->text = h3_malloc(sizeof(float) * (size_t)r->n_ids * (size_t)hidden);
    if (!r->text) return -H3_E_NOMEM;
    return h3_rt_text_encode(rt, r->ids, r->n_ids, r->text);
}

/* Step 2: each keyframe's normalised latent [C, 1, lh, lw] on the transformer's canvas, into
   cond[k * C * lh * lw]: injected, or the keyframe put onto that canvas and encoded with its
   posterior noise (injected, or libh3's, see keyframe.h). */
static int prepare_keyframe_latents(h3_runtime *rt, const keyframes *kf, const struct h3_render *r, h3_pool *pool,
                                    float *cond)
{
    const int64_t n = (int64_t)r->C * r->lh * r->lw;
    uint8_t *placed = NULL;
    int rc = 0;
    for (int i = 0; i < kf->n && !rc; i++) {
        float *out = cond + i * n;
        if (kf->latent[i]) {
            memcpy(out, kf->latent[i], sizeof(float) * (size_t)n);
            continue;
        }
        if (!placed && !(placed = h3_malloc((size_t)r->rw * (size_t)r->rh * 3))) {
            rc = -H3_E_NOMEM;
            break;
        }
        rc = h3_keyframe_place(pool, kf->rgb[i], kf->w[i], kf->h[i], r->rw, r->rh, keyframe_cover(kf, i), placed);
        if (!rc) rc = keyframe_encode(rt, placed, r->rw, r->rh, kf->posterior[i], out);
        if (rc) h3_err_prefix("%s", kf->name[i]);
    }
    free(placed);
    return rc;
}

/* Step 4: the conditioning rows, noised as diffusers' scale_noise(z, 0.999, eps) in f32
   (t z + (1 - t) eps, each product rounded), then patchified one condition at a time. */
static void pack_conditions(const h3_dit_cfg *dc, const keyframes *kf, const struct h3_render *r, const float *cond,
                            float *scratch, float *rows)
{
    const int64_t n = (int64_t)r->C * r->lh * r->lw;
    const int64_t per = (int64_t)(r->lh / dc->patch[1]) * (r->lw / dc->patch[2]) * dc->video_ch * dc->patch[1] *
                        dc->patch[2];
    const float t = (float)H3_KEYFRAME_NOISE_AUG, u = 1.0f - t;
    for (int i = 0; i < kf->n; i++) {
        if (kf->noise[i])
            memcpy(scratch, kf->noise[i], sizeof(float) * (size_t)n);
        else
            h3_noise(r->seed, H3_STREAM_COND + (uint32_t)i, 0, scratch, n);
        const float *z = cond + i * n;
        for (int64_t j = 0; j < n; j++) {
            const float a = t * z[j], b = u * scratch[j];
            scratch[j] = a + b;
        }
        h3_dit_patchify_video(dc, scratch, 1, r->lh, r->lw, rows + i * per);
    }
}

/* Step 2 for Ref2VA: each image reference resized (PIL's Lanczos) to its encoding size and
   encoded like a keyframe into one condition buffer (*out, request order, h3_ref_plan offsets). */
static int prepare_reference_latents(h3_runtime *rt, const h3_request *q, const h3_ref_plan *rp, h3_pool *pool,
                                     float **out)
{
    if (!(*out = h3_alloc_aligned(sizeof(float) * (size_t)rp->floats))) return -H3_E_NOMEM;
    int rc = 0;
    for (int i = 0; i < rp->n && !rc; i++) {
        const h3_reference *f = &q->references[rp->index[i]];
        const size_t frames = rp->frames[i] ? (size_t)rp->enc_frames[i] : 1;
        uint8_t *sized = h3_malloc((size_t)rp->w[i] * (size_t)rp->h[i] * 3 * frames);
        if (!sized) return -H3_E_NOMEM;
        if (rp->frames[i]) {
            /* a video: its first enc_frames frames, in independent VAE chunks (h3_venc_condition) */
            h3_backend *cpu;
            rc = h3_ref_video_pixels(pool, q, rp, i, rp->enc_frames[i], false, sized);
            if (!rc) rc = h3_rt_cpu_backend(rt, &cpu);
            if (!rc) {
                const h3_venc_cond c = {.rgb = sized, .T = rp->enc_frames[i], .H = rp->h[i], .W = rp->w[i],
                                        .eps = h3_ref_posterior_noise(q, rp->index[i]), .seed = H3_KEYFRAME_ENCODE_SEED,
                                        .stream = H3_STREAM_POSTERIOR, .out = *out + rp->off[i],
                                        .progress = rt->progress, .user = rt->progress_user};
                rc = h3_venc_condition(rt->model, cpu, &c);
            }
        } else {
            rc = h3_keyframe_place(pool, f->rgb, f->width, f->height, rp->w[i], rp->h[i], 0, sized);
            if (!rc) rc = keyframe_encode(rt, sized, rp->w[i], rp->h[i], h3_ref_posterior_noise(q, rp->index[i]), *out + rp->off[i]);
        }
        free(sized);
        if (rc) h3_err_prefix("reference %d", rp->index[i] + 1);
    }
    return rc;
}

int h3_rt_prepare(h3_runtime *rt, const h3_request *request)
{
    if (!request) return h3_err(H3_E_INVALID, "NULL request");
    h3_request wide, *q = &wide;
    h3_parity wide_parity;
    int rc = widen_request(request, &wide, &wide_parity);
    if (rc) return rc;
    if (!q->prompt && !q->parity->text_states) return h3_err(H3_E_INVALID, "no prompt");
    h3_rt_render_free(rt);
    struct h3_render *r = h3_calloc(1, sizeof *r);
    if (!r) return -H3_E_NOMEM;
    float *cond = NULL, *aref = NULL;
    cfgs k;
    keyframes kf;
    h3_ref_plan rp;
    if ((rc = plan(rt, q, &k, r, &kf, &rp))) goto fail;
    h3_dit_cfg dc = k.dc;
    h3_text_cfg tc = k.tc;
    h3_pool *pool = h3_rt_pool(rt);
    if (!pool) {
        rc = -H3_E_NOMEM;
        goto fail;
    }

    /* 1. conditioning rows (the text encoder streams its layers and caches); 2. keyframe latents,
       before the transformer maps its weights. */
    if ((rc = prepare_text(rt, q, &kf, &rp, tc.hidden, pool, r))) goto fail;
    int64_t clat = (int64_t)r->C * r->lh * r->lw;
    if (rp.n) {
        if ((rc = prepare_reference_latents(rt, q, &rp, pool, &cond))) goto fail;
        clat = rp.max_floats;
    }
    if (rp.n_audio) {
        /* Audio references: encoded once, never noised (their rows run at t = 1.0). */
        h3_backend *cpu;
        if (!(aref = h3_alloc_aligned(sizeof(float) * (size_t)rp.a_floats))) {
            rc = -H3_E_NOMEM;
            goto fail;
        }
        if ((rc = h3_rt_cpu_backend(rt, &cpu)) ||
            (rc = h3_ref_encode_audio(rt->model, cpu, q, &rp, aref, rt->progress, rt->progress_user)))
            goto fail;
    }
    if (kf.n) {
        if (!(cond = h3_alloc_aligned(sizeof(float) * (size_t)(kf.n * clat)))) {
            rc = -H3_E_NOMEM;
            goto fail;
        }
        if ((rc = prepare_keyframe_latents(rt, &kf, r, pool, cond))) goto fail;
    }

    /* 3. transformer: layout, refined text, schedule with AdaLN tables. */
    if ((rc = progress(rt, "prepare", 0, 2))) goto fail;
    /* The transformer with this request's LoRA files merged (reopened when they differ from the open
       one's); with layer dropping, a fresh open leaves the blocks to load until they are chosen. */
    h3_dit_open_opts oo = {.lazy_blocks = q->layers > 0, .lora_paths = q->lora_paths,
                           .lora_scales = q->lora_scales, .n_lora = q->n_lora};
    h3_dit_knobs kn;
    request_knobs(q, &kn);
    h3_dit *d;
    if ((rc = h3_rt_dit_for(rt, &oo, &d))) goto fail;
    if (rp.n) {
        /* Request order: the layout's rotary clock runs over every reference in turn. */
        h3_dit_ref rf[H3_REF_MAX];
        int nr = 0, ki = 0, ka = 0;
        for (int i = 0; i < q->n_references; i++) {
            /* a video's soundtrack rides on its own block (audio_lat), as diffusers packs it */
            const int alat = ka < rp.n_audio && rp.aindex[ka] == i ? rp.a_lat[ka++] : 0;
            if (ki < rp.n && rp.index[ki] == i) {
                const bool video = rp.frames[ki] > 0;
                rf[nr++] = (h3_dit_ref){.kind = video ? H3_REF_VIDEO : H3_REF_IMAGE, .lat_t = rp.lt[ki],
                                        .lat_h = rp.lh[ki], .lat_w = rp.lw[ki], .audio_lat = video ? alat : 0};
                ki++;
            } else if (alat) {
                rf[nr++] = (h3_dit_ref){.kind = H3_REF_AUDIO, .audio_lat = alat};
            }
        }
        rc = h3_dit_layout_ref2va(&dc, r->n_text, r->text_tags, rf, nr, r->T, r->lh, r->lw, r->Ta, &r->layout);
    } else {
        rc = h3_dit_layout_t2va(&dc, r->n_text, r->text_tags, r->T, r->lh, r->lw, r->Ta, r->anchors, r->n_cond,
                                &r->layout);
    }
    if (rc) goto fail;
    if ((rc = h3_dit_set_layout(d, &r->layout)) || (rc = h3_dit_set_text(d, r->text, r->n_text)) ||
        (rc = h3_dit_set_knobs(d, &kn)))
        goto fail;
    if ((rc = progress(rt, "prepare", 1, 2))) goto fail;
    const bool release = !(rt->flags & H3_OPT_KEEP_ADALN);
    if (r->sched < 0) {
        rc = h3_dit_prepare_sigmas(d, q->sigmas, q->sigmas + q->n_sigmas, q->n_sigmas, release);
    } else {
        float *sv = h3_malloc(sizeof(float) * (size_t)r->steps), *sa = h3_malloc(sizeof(float) * (size_t)r->steps);
        rc = sv && sa ? h3_sched_named(h3_sched_name(r->sched), r->steps, dc.shift_video, dc.shift_audio, sv, sa)
                      : -H3_E_NOMEM;
        if (rc > 0) rc = h3_dit_prepare_sigmas(d, sv, sa, rc, release);
        free(sv);
        free(sa);
    }
    if (rc < 0) goto fail;
    r->evals = rc;
    rc = 0;

    /* 4. initial noise: injected, or drawn from (seed, stream) in latent order; the conditioning
       rows first, then the generated video rows. */
    int64_t vlat = (int64_t)r->C * r->T * r->lh * r->lw, alat = 2LL * r->AC * r->Ta;
    int64_t pd = (int64_t)dc.video_ch * dc.patch[1] * dc.patch[2];
    r->vrow_floats = r->layout.n_video * pd;
    r->arow_floats = r->layout.n_audio * dc.audio_ch;
    r->cond_floats = r->layout.n_cond_video * pd;
    r->acond_floats = r->layout.n_cond_audio * dc.audio_ch;
    if (r->acond_floats != rp.a_floats) {
        rc = h3_err(H3_E_FORMAT, "references: %lld audio reference floats planned, %lld laid out",
                    (long long)rp.a_floats, (long long)r->acond_floats);
        goto fail;
    }
    float *vlatents = h3_alloc_aligned(sizeof(float) * (size_t)(vlat > clat ? vlat : clat));
    float *alatents = h3_alloc_aligned(sizeof(float) * (size_t)alat);
    float *vrows = h3_alloc_aligned(sizeof(float) * (size_t)r->vrow_floats);
    float *arows = h3_alloc_aligned(sizeof(float) * (size_t)r->arow_floats);
    /* The latents live where the transformer runs, for the whole denoise loop. */
    r->be = h3_dit_backend(d);
    r->vrows = r->be->mem->alloc(r->be, sizeof(float) * (size_t)(r->vrow_floats + 1));
    r->arows = r->be->mem->alloc(r->be, sizeof(float) * (size_t)(r->arow_floats + 1));
    if (!vlatents || !alatents || !vrows || !arows || !r->vrows || !r->arows) {
        h3_free_aligned(vlatents);
        h3_free_aligned(alatents);
        h3_free_aligned(vrows);
        h3_free_aligned(arows);
        rc = -H3_E_NOMEM;
        goto fail;
    }
    if (kf.n) pack_conditions(&dc, &kf, r, cond, vlatents, vrows);
    if (rp.n) h3_ref_pack(&dc, q, &rp, q->seed, cond, vlatents, vrows);
    if (q->parity->video_noise)
        memcpy(vlatents, q->parity->video_noise, sizeof(float) * (size_t)vlat);
    else if (r->lh != r->olh || r->lw != r->olw)
        rc = canvas_noise(q->seed, r->C, r->T, r->olh, r->olw, r->lh, r->lw, vlatents);
    else
        h3_noise(q->seed, 0, 0, vlatents, vlat);
    if (q->parity->audio_noise)
        memcpy(alatents, q->parity->audio_noise, sizeof(float) * (size_t)alat);
    else
        h3_noise(q->seed, 1, 0, alatents, alat);
    h3_dit_patchify_video(&dc, vlatents, r->T, r->lh, r->lw, vrows + r->cond_floats);
    if (rp.n_audio) memcpy(arows, aref, sizeof(float) * (size_t)rp.a_floats);
    h3_dit_pack_audio(dc.audio_ch, r->Ta, alatents, arows + r->acond_floats);
    if (!rc) rc = r->be->mem->upload(r->be, r->vrows, vrows, sizeof(float) * (size_t)r->vrow_floats);
    if (!rc) rc = r->be->mem->upload(r->be, r->arows, arows, sizeof(float) * (size_t)r->arow_floats);
    if (!rc) rc = r->be->mem->sync(r->be);
    h3_free_aligned(vlatents);
    h3_free_aligned(alatents);
    h3_free_aligned(vrows);
    h3_free_aligned(arows);
    if (rc || (rc = progress(rt, "prepare", 2, 2))) goto fail;
    h3_free_aligned(cond);
    h3_free_aligned(aref);
    r->dit_gen = h3_dit_generation(d);
    rt->render = r;
    return 0;
fail:
    h3_free_aligned(cond);
    h3_free_aligned(aref);
    render_free(r);
    return rc;
}

int h3_rt_step(h3_runtime *rt)
{
    struct h3_render *r = rt->render;
    if (!r) return h3_err(H3_E_INVALID, "step: no prepared request (call h3_prepare first)");
    if (r->done >= r->evals) return 0;
    if (!rt->dit) return h3_err(H3_E_INVALID, "step: the transformer was released; prepare the request again");
    /* The public transformer calls (h3_dit_forward, h3_dit_denoise) share the transformer: once
       they have laid out another request, this one's tables and buffers are gone. */
    if (h3_dit_generation(rt->dit) != r->dit_gen)
        return h3_err(H3_E_INVALID, "step: the transformer was used by another call since h3_prepare (h3_dit_forward "
                                    "or h3_dit_denoise); prepare the request again");
    int rc = r->done == 0 ? progress(rt, "denoise", 0, r->evals) : 0;
    if (rc) return rc;
    rc = h3_dit_step(rt->dit, r->done, r->vrows, r->arows);
    if (rc < 0) return rc;
    r->done++;
    /* The last step waits for the device, so the denoise phase's wall time (a profile reads it
       at the next phase's first callback) holds the queued work and the decode's does not. */
    if (r->done == r->evals && (rc = r->be->mem->sync(r->be))) return rc;
    if ((rc = progress(rt, "denoise", r->done, r->evals))) return rc;
    return r->evals - r->done;
}

int h3_rt_render_info(h3_runtime *rt, h3_render_info *out)
{
    if (!out) return h3_err(H3_E_INVALID, "NULL argument");
    if (out->struct_size != sizeof *out)
        return h3_err(H3_E_INVALID, "h3_render_info.struct_size %u, expected %zu", out->struct_size, sizeof *out);
    struct h3_render *r = rt->render;
    if (!r) return h3_err(H3_E_INVALID, "no prepared request");
    fill_info(r, out);
    return 0;
}

/* A host copy of packed rows that live on the transformer's backend (freed by the caller). */
static int download_rows(const struct h3_render *r, const float *rows, int64_t n, float **out)
{
    *out = h3_alloc_aligned(sizeof(float) * (size_t)(n + 1));
    if (!*out) return -H3_E_NOMEM;
    return r->be->mem->download(r->be, *out, rows, sizeof(float) * (size_t)n);
}

int h3_rt_get_latents(h3_runtime *rt, float *video, float *audio)
{
    struct h3_render *r = rt->render;
    if (!r) return h3_err(H3_E_INVALID, "no prepared request");
    h3_dit_cfg dc;
    int rc = h3_dit_cfg_load(rt->model, &dc);
    float *rows = NULL;
    if (!rc && video) rc = download_rows(r, r->vrows, r->vrow_floats, &rows);
    if (!rc && video) h3_dit_unpatchify_video(&dc, rows + r->cond_floats, r->T, r->lh, r->lw, video);
    h3_free_aligned(rows);
    rows = NULL;
    if (!rc && audio) rc = download_rows(r, r->arows, r->arow_floats, &rows);
    if (!rc && audio) h3_dit_unpack_audio(r->AC, r->Ta, rows + r->acond_floats, audio);
    h3_free_aligned(rows);
    return rc;
}

int h3_rt_prompt_tokens(h3_runtime *rt, int32_t *ids, int cap)
{
    struct h3_render *r = rt->render;
    if (!r) return h3_err(H3_E_INVALID, "no prepared request");
    if (ids && r->ids) memcpy(ids, r->ids, sizeof *ids * (size_t)(cap < r->n_ids ? cap : r->n_ids));
    return r->n_ids;
}

int h3_rt_decode(h3_runtime *rt, uint8_t *rgb, float *pixels, float *pcm)
{
    struct h3_render *r = rt->render;
    if (!r) return h3_err(H3_E_INVALID, "decode: no prepared request");
    if (r->done < r->evals)
        return h3_err(H3_E_INVALID, "decode: %d of %d denoising steps are still to run", r->evals - r->done, r->evals);
    if (!rgb && !pixels && !pcm) return h3_err(H3_E_INVALID, "decode: no output buffer");
    h3_pool *pool = h3_rt_pool(rt);
    if (!pool) return -H3_E_NOMEM;
    /* The transformer is done once the loop has run: let its pages (and GPU memory) go before the
       decoders load theirs. The decoders run on the stage backend (the GPU unless
       H3_OPT_STAGES_CPU). */
    h3_rt_release_dit(rt);
    h3_dit_cfg dc;
    h3_backend *be;
    int rc = h3_dit_cfg_load(rt->model, &dc);
    if (rc || (rc = h3_rt_stage_backend(rt, &be))) return rc;
    if (pcm) {
        float *alat = h3_alloc_aligned(sizeof(float) * 2 * (size_t)r->AC * (size_t)r->Ta), *rows = NULL;
        rc = alat ? download_rows(r, r->arows, r->arow_floats, &rows) : -H3_E_NOMEM;
        if (!rc) {
            h3_dit_unpack_audio(r->AC, r->Ta, rows + r->acond_floats, alat);
            rc = h3_avae_run_keep(rt->model, be, alat, r->AC, r->Ta, pcm, 2 * r->samples, rt->progress,
                                  rt->progress_user, &rt->avae_keep);
        }
        h3_free_aligned(rows);
        h3_free_aligned(alat);
        if (rc) return rc;
    }
    if (rgb || pixels) {
        float *vlat = h3_alloc_aligned(sizeof(float) * (size_t)r->C * r->T * r->lh * r->lw), *rows = NULL;
        rc = vlat ? download_rows(r, r->vrows, r->vrow_floats, &rows) : -H3_E_NOMEM;
        if (rc) {
            h3_free_aligned(vlat);
            return rc;
        }
        h3_dit_unpatchify_video(&dc, rows + r->cond_floats, r->T, r->lh, r->lw, vlat);
        h3_free_aligned(rows);
        /* On a smaller render canvas the decoder's frames (in [0, 1]) are resized to the output. */
        const bool resize = r->rw != r->width || r->rh != r->height;
        float *small = resize ? h3_alloc_aligned(sizeof(float) * 3 * (size_t)r->frames * (size_t)r->rw * (size_t)r->rh)
                              : NULL;
        if (resize && !small) {
            h3_free_aligned(vlat);
            return -H3_E_NOMEM;
        }
        h3_vvae_request vq = {0};
        vq.latents = vlat;
        vq.C = r->C;
        vq.T = r->T;
        vq.h = r->lh;
        vq.w = r->lw;
        vq.rgb = resize ? NULL : rgb;
        vq.pixels = resize ? small : pixels;
        vq.progress = rt->progress;
        vq.user = rt->progress_user;
        vq.tile_px = r->vae_tile; /* smaller tiles bound memory tighter; the blend is diffusers' */
        vq.keep = &rt->vvae_keep;  /* on a GPU the weights stay for the next render */
        vq.precision = h3_rt_video_decoder_precision(rt);
        rc = h3_vvae_run(rt->model, be, &vq);
        h3_free_aligned(vlat);
        if (!rc && resize)
            rc = h3_resize_lanczos3(pool, small, r->frames, r->rh, r->rw, r->height, r->width, pixels, rgb);
        h3_free_aligned(small);
        if (rc) return rc;
    }
    return 0;
}

int h3_rt_keyframe_canvas(h3_runtime *rt, int image_width, int image_height, int *width, int *height)
{
    h3_geom_cfg gc;
    h3_geom_cfg_of_model(rt->model, &gc);
    h3_canvas_rule cr;
    h3_geom_canvas_rule(rt->model, &gc, &cr);
    return h3_canvas_resolve(&cr, image_width, image_height, width, height);
}
