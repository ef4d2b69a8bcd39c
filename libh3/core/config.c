/*
 * Component configs -> dimension structs. Official (sglang-native) key names come first; the
 * diffusers spellings are accepted too, so a config written either way opens. Every failure
 * names the config file and the key.
 */
#include "core/internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int need_int(const h3_json *d, const h3j *obj, const char *path, int *out, int64_t lo,
                    int64_t hi, const char *k1, const char *k2)
{
    int64_t v;
    if (h3_cfg_int(d, obj, &v, k1, k2, (const char *)NULL) != 0)
        return h3_err(H3_E_FORMAT, "%s: missing integer \"%s\"", path, k1);
    if (v < lo || v > hi)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" = %lld is out of range [%lld, %lld]", path, k1,
                      (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int opt_int(const h3_json *d, const h3j *obj, const char *path, int *out, int dflt,
                   int64_t lo, int64_t hi, const char *k1, const char *k2)
{
    int64_t v;
    if (h3_cfg_int(d, obj, &v, k1, k2, (const char *)NULL) != 0) {
        const h3j *x = h3j_get(d, obj, k1);
        if (x && x->type != H3J_NULL) return h3_err(H3_E_FORMAT, "%s: \"%s\" must be an integer", path, k1);
        *out = dflt;
        return 0;
    }
    if (v < lo || v > hi)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" = %lld is out of range [%lld, %lld]", path, k1,
                      (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int opt_num(const h3_json *d, const h3j *obj, const char *path, double *out, double dflt,
                   double lo, double hi, const char *k1, const char *k2)
{
    double v;
    if (h3_cfg_num(d, obj, &v, k1, k2, (const char *)NULL) != 0) {
        const h3j *x = h3j_get(d, obj, k1);
        if (x && x->type != H3J_NULL) return h3_err(H3_E_FORMAT, "%s: \"%s\" must be a number", path, k1);
        *out = dflt;
        return 0;
    }
    if (!(v >= lo && v <= hi))
        return h3_err(H3_E_FORMAT, "%s: \"%s\" = %g is out of range [%g, %g]", path, k1, v, lo, hi);
    *out = v;
    return 0;
}

/* Integer array of exactly `n` (or, when n < 0, up to -n) entries; returns the count. */
static int int_array(const h3_json *d, const h3j *obj, const char *path, const char *key, int *out,
                     int n, int64_t lo, int64_t hi)
{
    const h3j *a = h3j_get(d, obj, key);
    if (!a || a->type != H3J_ARR) return h3_err(H3_E_FORMAT, "%s: missing array \"%s\"", path, key);
    if ((n >= 0 && (int)a->len != n) || (n < 0 && ((int)a->len > -n || a->len == 0)))
        return h3_err(H3_E_FORMAT, "%s: \"%s\" has %u entries, expected %s%d", path, key, a->len,
                      n < 0 ? "1 to " : "", n < 0 ? -n : n);
    int i = 0;
    for (const h3j *x = h3j_first(d, a); x; x = h3j_next(d, x), i++) {
        if (x->type != H3J_NUM || !x->is_int || x->i < lo || x->i > hi)
            return h3_err(H3_E_FORMAT, "%s: \"%s\"[%d] must be an integer in [%lld, %lld]", path, key,
                          i, (long long)lo, (long long)hi);
        out[i] = (int)x->i;
    }
    return i;
}

static int float_array(const h3_json *d, const h3j *obj, const char *path, const char *key,
                       float *out, int n, bool positive)
{
    const h3j *a = h3j_get(d, obj, key);
    if (!a || a->type != H3J_ARR) return h3_err(H3_E_FORMAT, "%s: missing array \"%s\"", path, key);
    if ((int)a->len != n)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" has %u entries, expected %d (one per latent channel)",
                      path, key, a->len, n);
    int i = 0;
    for (const h3j *x = h3j_first(d, a); x; x = h3j_next(d, x), i++) {
        if (x->type != H3J_NUM || !isfinite(x->num) || (positive && !(x->num > 0)))
            return h3_err(H3_E_FORMAT, "%s: \"%s\"[%d] must be a %snumber", path, key, i,
                          positive ? "positive " : "finite ");
        out[i] = (float)x->num;
    }
    return 0;
}

#define MAXD (1 << 20)

int h3_dit_cfg_load(h3_model *m, h3_dit_cfg *c)
{
    int rc = h3_model_require(m, H3_COMP_TRANSFORMER, "the transformer");
    if (rc) return rc;
    h3_comp *k = &m->comp[H3_COMP_TRANSFORMER];
    const h3_json *d = &k->config;
    const h3j *r = h3j_root(d);
    const char *p = k->config_path;
    memset(c, 0, sizeof *c);
    if ((rc = need_int(d, r, p, &c->hidden, 1, MAXD, "hidden_size", NULL)) ||
        (rc = need_int(d, r, p, &c->layers, 0, 4096, "num_layers", NULL)) ||
        (rc = opt_int(d, r, p, &c->refiner_layers, 2, 0, 4096, "token_refiner_num_layers", "num_refiner_layers")) ||
        (rc = need_int(d, r, p, &c->heads, 1, 65536, "num_attention_heads", NULL)) ||
        (rc = need_int(d, r, p, &c->head_dim, 1, 65536, "attention_head_dim", NULL)) ||
        (rc = need_int(d, r, p, &c->ffn, 1, MAXD, "ffn_hidden_size", "ffn_dim")) ||
        (rc = opt_int(d, r, p, &c->video_ch, 24, 1, 4096, "latents_dim", "in_channels")) ||
        (rc = opt_int(d, r, p, &c->audio_ch, 32, 1, 4096, "audio_latents_dim", "audio_in_channels")) ||
        (rc = need_int(d, r, p, &c->text_dim, 1, MAXD, "text_dim", NULL)) ||
        (rc = opt_int(d, r, p, &c->freq_dim, 256, 2, MAXD, "timestep_input_dim", "freq_dim")) ||
        (rc = opt_int(d, r, p, &c->temb_hidden, c->hidden, 1, MAXD, "time_embed_hidden_size", "time_embed_hidden_dim")) ||
        (rc = need_int(d, r, p, &c->temb_dim, 1, MAXD, "time_embed_dim", NULL)) ||
        (rc = opt_int(d, r, p, &c->rope_freq, 16, 0, 65536, "rope_inv_freq_len", "rope_freq_dim")) ||
        (rc = opt_num(d, r, p, &c->rope_theta, 10000.0, 1e-6, 1e12, "rope_theta", NULL)) ||
        (rc = opt_num(d, r, p, &c->norm_eps, 1e-5, 0, 1, "norm_eps", NULL)) ||
        (rc = opt_num(d, r, p, &c->qk_eps, 1e-5, 0, 1, "qk_norm_eps", NULL)) ||
        (rc = opt_num(d, r, p, &c->final_eps, 1e-5, 0, 1, "final_norm_eps", NULL)))
        return rc;
    if (h3j_get(d, r, "patch_size")) {
        if ((rc = int_array(d, r, p, "patch_size", c->patch, 3, 1, 64)) < 0) return rc;
    } else {
        c->patch[0] = 1;
        c->patch[1] = c->patch[2] = 2;
    }
    if (c->patch[0] != 1)
        return h3_err(H3_E_UNSUPPORTED, "%s: temporal patch size %d (only 1 is supported)", p, c->patch[0]);
    if (c->freq_dim % 2)
        return h3_err(H3_E_FORMAT, "%s: timestep_input_dim must be even, got %d", p, c->freq_dim);
    if (6 * c->rope_freq > c->head_dim)
        return h3_err(H3_E_FORMAT, "%s: RoPE rotates 6 x rope_inv_freq_len = %d dims but heads have %d",
                      p, 6 * c->rope_freq, c->head_dim);
    int64_t v;
    if (h3_cfg_int(d, r, &v, "adaln_out_features", (const char *)NULL) == 0 && v != 18LL * c->hidden)
        return h3_err(H3_E_FORMAT, "%s: adaln_out_features = %lld, expected 18 x hidden_size = %lld", p,
                      (long long)v, 18LL * c->hidden);
    if (h3_cfg_int(d, r, &v, "final_adaln_out_features", (const char *)NULL) == 0 && v != 2LL * c->hidden)
        return h3_err(H3_E_FORMAT, "%s: final_adaln_out_features = %lld, expected 2 x hidden_size = %lld",
                      p, (long long)v, 2LL * c->hidden);
    c->shift_video = m->shift_video;
    c->shift_audio = m->shift_audio;
    return 0;
}

int h3_text_cfg_load(h3_model *m, h3_text_cfg *c)
{
    int rc = h3_model_require(m, H3_COMP_TEXT_ENCODER, "text encoding");
    if (rc) return rc;
    h3_comp *k = &m->comp[H3_COMP_TEXT_ENCODER];
    const h3_json *d = &k->config;
    const h3j *root = h3j_root(d);
    const char *p = k->config_path;
    /* Qwen3-VL nests the language model's settings under text_config. */
    const h3j *t = h3j_get(d, root, "text_config");
    if (!t || t->type != H3J_OBJ) t = root;
    memset(c, 0, sizeof *c);
    /* Defaults are transformers' Qwen3VLTextConfig defaults (head_dim 128, eps 1e-6), so a config that
       omits a key means what it means to the oracle. */
    if ((rc = need_int(d, t, p, &c->hidden, 1, MAXD, "hidden_size", NULL)) ||
        (rc = need_int(d, t, p, &c->layers, 1, 4096, "num_hidden_layers", NULL)) ||
        (rc = need_int(d, t, p, &c->heads, 1, 65536, "num_attention_heads", NULL)) ||
        (rc = opt_int(d, t, p, &c->kv_heads, c->heads, 1, 65536, "num_key_value_heads", NULL)) ||
        (rc = opt_int(d, t, p, &c->head_dim, 128, 1, 65536, "head_dim", NULL)) ||
        (rc = need_int(d, t, p, &c->inter, 1, MAXD, "intermediate_size", NULL)) ||
        (rc = need_int(d, t, p, &c->vocab, 1, 1 << 24, "vocab_size", NULL)) ||
        (rc = opt_num(d, t, p, &c->rms_eps, 1e-6, 0, 1, "rms_norm_eps", NULL)) ||
        (rc = opt_int(d, root, p, &c->cond_layer, 50, 1, 4096, "minimax_h3_conditioning_layer", NULL)))
        return rc;
    /* transformers 5 keeps RoPE settings in rope_parameters (older files: rope_scaling) and takes
       rope_theta from there first, then from the text config, then its default_theta 500000. */
    const h3j *rp = h3j_get(d, t, "rope_parameters");
    if (!rp || rp->type != H3J_OBJ) rp = h3j_get(d, t, "rope_scaling");
    if (rp && rp->type != H3J_OBJ) rp = NULL;
    double theta;
    if (h3_cfg_num(d, rp, &theta, "rope_theta", (const char *)NULL) == 0 ||
        h3_cfg_num(d, t, &theta, "rope_theta", (const char *)NULL) == 0)
        c->rope_theta = theta;
    else
        c->rope_theta = 500000.0;
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return h3_err(H3_E_FORMAT, "%s: rope_theta must be a positive number, got %g", p, c->rope_theta);
    /* Only plain RoPE over the whole head is implemented; the text path of Qwen3-VL's interleaved
       mRoPE reduces to it (equal t/h/w positions). Anything else would silently differ. */
    const h3j *rt = rp ? h3j_get(d, rp, "rope_type") : NULL;
    if (rp && !rt) rt = h3j_get(d, rp, "type");
    if (rt && (rt->type != H3J_STR || strcmp(h3j_str(d, rt), "default") != 0))
        return h3_err(H3_E_UNSUPPORTED, "%s: rope_type '%s' is not supported (only \"default\")", p,
                      rt->type == H3J_STR ? h3j_str(d, rt) : "?");
    double prf;
    if ((h3_cfg_num(d, rp, &prf, "partial_rotary_factor", (const char *)NULL) == 0 ||
         h3_cfg_num(d, t, &prf, "partial_rotary_factor", (const char *)NULL) == 0) && prf != 1.0)
        return h3_err(H3_E_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported (only 1)", p, prf);
    const h3j *act = h3j_get(d, t, "hidden_act");
    if (act && (act->type != H3J_STR || strcmp(h3j_str(d, act), "silu") != 0))
        return h3_err(H3_E_UNSUPPORTED, "%s: hidden_act '%s' is not supported (Qwen3-VL uses \"silu\")", p,
                      act->type == H3J_STR ? h3j_str(d, act) : "?");
    const h3j *bias = h3j_get(d, t, "attention_bias");
    if (bias && bias->type != H3J_FALSE && bias->type != H3J_NULL)
        return h3_err(H3_E_UNSUPPORTED, "%s: attention_bias must be false (Qwen3-VL has no projection biases)", p);
    if (c->heads % c->kv_heads)
        return h3_err(H3_E_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      p, c->heads, c->kv_heads);
    if (c->head_dim % 2) return h3_err(H3_E_FORMAT, "%s: head_dim must be even, got %d", p, c->head_dim);
    if ((int64_t)c->heads * c->head_dim > MAXD)
        return h3_err(H3_E_FORMAT, "%s: num_attention_heads x head_dim = %lld is out of range (at most %d)", p,
                      (long long)c->heads * c->head_dim, MAXD);
    if (c->cond_layer >= c->layers)
        return h3_err(H3_E_FORMAT,
                      "%s: MiniMax-H3 reads hidden state %d, so the text encoder needs more than %d layers "
                      "(it has %d)",
                      p, c->cond_layer, c->cond_layer, c->layers);
    return 0;
}

/* Product of positive factors, saturating at INT_MAX (hostile configs must not overflow). */
static int product(const int *v, int n)
{
    int r = 1;
    for (int i = 0; i < n; i++) r = v[i] > 0 && r > INT_MAX / v[i] ? INT_MAX : r * v[i];
    return r;
}

int h3_vvae_cfg_load(h3_model *m, h3_vvae_cfg *c)
{
    int rc = h3_model_require(m, H3_COMP_VIDEO_VAE, "video decoding");
    if (rc) return rc;
    h3_comp *k = &m->comp[H3_COMP_VIDEO_VAE];
    const h3_json *w = &k->config, *s = &k->config2;
    const h3j *wr = h3j_root(w), *sr = h3j_root(s);
    const char *wp = k->config_path;
    char sp[1024];
    snprintf(sp, sizeof sp, "%s/config.json", k->weights_dir);
    memset(c, 0, sizeof *c);
    if ((rc = need_int(w, wr, wp, &c->latent_ch, 1, 64, "latent_channels", NULL)) ||
        (rc = opt_int(w, wr, wp, &c->clip_length, 17, 1, 4096, "vae_clip_length", NULL)) ||
        (rc = opt_int(w, wr, wp, &c->token_drop, 3, 0, 4096, "vae_token_drop", NULL)) ||
        (rc = opt_int(w, wr, wp, &c->tile_size, 256, 16, 1 << 16, "vae_tile_size", NULL)) ||
        (rc = opt_int(w, wr, wp, &c->tile_overlap, 64, 0, 1 << 16, "vae_tile_overlap_min", NULL)))
        return rc;
    if ((rc = float_array(w, wr, wp, "latents_mean", c->latents_mean, c->latent_ch, false)) ||
        (rc = float_array(w, wr, wp, "latents_std", c->latents_std, c->latent_ch, true)))
        return rc;
    int z;
    if ((rc = opt_int(s, sr, sp, &z, c->latent_ch, 1, 64, "z_channels", NULL))) return rc;
    if (z != c->latent_ch)
        return h3_err(H3_E_FORMAT, "%s: z_channels %d disagrees with latent_channels %d in %s", sp, z,
                      c->latent_ch, wp);
    if ((rc = opt_int(s, sr, sp, &c->out_ch, 3, 1, 16, "out_ch", "out_channels"))) return rc;
    int f[16];
    int n;
    if (h3j_get(s, sr, "space_down")) {
        if ((n = int_array(s, sr, sp, "space_down", f, -16, 1, 16)) < 0) return n;
        c->spatial = product(f, n);
    } else if ((rc = opt_int(s, sr, sp, &c->spatial, 16, 1, 1024, "vae_ratio", NULL))) {
        return rc;
    }
    if (h3j_get(s, sr, "time_down")) {
        if ((n = int_array(s, sr, sp, "time_down", f, -16, 1, 16)) < 0) return n;
        c->temporal = product(f, n);
    } else if ((rc = opt_int(s, sr, sp, &c->temporal, 4, 1, 64, "vae_ratio_t", NULL))) {
        return rc;
    }
    int64_t v;
    if (h3_cfg_int(s, sr, &v, "vae_ratio", (const char *)NULL) == 0 && v != c->spatial)
        return h3_err(H3_E_FORMAT, "%s: vae_ratio %lld disagrees with space_down (product %d)", sp,
                      (long long)v, c->spatial);
    if (h3_cfg_int(s, sr, &v, "vae_ratio_t", (const char *)NULL) == 0 && v != c->temporal)
        return h3_err(H3_E_FORMAT, "%s: vae_ratio_t %lld disagrees with time_down (product %d)", sp,
                      (long long)v, c->temporal);
    const h3j *vk = h3j_get(s, sr, "vit_decoder_kwargs");
    if (!vk || vk->type != H3J_OBJ)
        return h3_err(H3_E_FORMAT, "%s: missing object \"vit_decoder_kwargs\"", sp);
    if ((rc = need_int(s, vk, sp, &c->dec_layers, 0, 4096, "num_layers", NULL)) ||
        (rc = need_int(s, vk, sp, &c->dec_heads, 1, 4096, "heads", NULL)) ||
        (rc = need_int(s, vk, sp, &c->dec_head_dim, 2, 4096, "dim_head", NULL)) ||
        (rc = opt_int(s, vk, sp, &c->dec_registers, 4, 0, 4096, "num_register_tokens", NULL)) ||
        (rc = opt_int(s, vk, sp, &c->dec_ffn_mult, 4, 1, 64, "ffn_mult", NULL)) ||
        (rc = opt_num(s, vk, sp, &c->dec_rope_theta, 100.0, 1e-6, 1e12, "rope_theta", NULL)) ||
        (rc = opt_num(s, vk, sp, &c->dec_rope_ratio, 0.75, 0, 1, "rope_dim_ratio", NULL)) ||
        (rc = opt_num(s, vk, sp, &c->dec_eps, 1e-5, 0, 1, "eps", NULL)))
        return rc;
    if (c->tile_size % c->spatial || c->tile_overlap % c->spatial)
        return h3_err(H3_E_FORMAT, "%s: vae_tile_size %d and vae_tile_overlap_min %d must be multiples "
                      "of the spatial ratio %d", wp, c->tile_size, c->tile_overlap, c->spatial);
    return 0;
}

int h3_avae_cfg_load(h3_model *m, h3_avae_cfg *c)
{
    int rc = h3_model_require(m, H3_COMP_AUDIO_VAE, "audio decoding");
    if (rc) return rc;
    h3_comp *k = &m->comp[H3_COMP_AUDIO_VAE];
    const h3_json *w = &k->config, *md = &k->config2;
    const h3j *wr = h3j_root(w);
    const h3j *kw = h3j_path(md, h3j_root(md), "metadata", "kwargs", NULL);
    const char *wp = k->config_path;
    char mp[1024];
    snprintf(mp, sizeof mp, "%s/metadata.json", k->dir);
    if (!kw || kw->type != H3J_OBJ) return h3_err(H3_E_FORMAT, "%s: missing object metadata.kwargs", mp);
    memset(c, 0, sizeof *c);
    if ((rc = need_int(w, wr, wp, &c->latent_ch, 1, 64, "latent_channels", NULL)) ||
        (rc = opt_int(w, wr, wp, &c->sample_rate, 32000, 1000, 384000, "sample_rate", NULL)) ||
        (rc = need_int(md, kw, mp, &c->latent_dim, 1, MAXD, "latent_dim", NULL)) ||
        (rc = need_int(md, kw, mp, &c->decoder_dim, 1, MAXD, "decoder_dim", NULL)))
        return rc;
    int lc;
    if ((rc = opt_int(md, kw, mp, &lc, c->latent_ch, 1, 64, "vae_latent_channels", NULL))) return rc;
    if (lc != c->latent_ch)
        return h3_err(H3_E_FORMAT, "%s: vae_latent_channels %d disagrees with latent_channels %d in %s",
                      mp, lc, c->latent_ch, wp);
    const h3j *dt = h3j_get(md, kw, "decoder_type");
    if (dt && (dt->type != H3J_STR || strcmp(h3j_str(md, dt), "bigvgan") != 0))
        return h3_err(H3_E_UNSUPPORTED, "%s: decoder_type must be \"bigvgan\"", mp);
    if ((rc = float_array(w, wr, wp, "latents_mean", c->latents_mean, c->latent_ch, false)) ||
        (rc = float_array(w, wr, wp, "latents_std", c->latents_std, c->latent_ch, true)))
        return rc;
    if ((c->n_up = int_array(md, kw, mp, "decoder_rates", c->rates, -16, 1, 64)) < 0) return c->n_up;
    if (h3j_get(md, kw, "decoder_kernel_sizes")) {
        if ((rc = int_array(md, kw, mp, "decoder_kernel_sizes", c->kernels, c->n_up, 1, 256)) < 0) return rc;
    } else {
        /* The release pairs rate u with kernel 2u (even u) or 2u-1 (odd u). */
        for (int i = 0; i < c->n_up; i++) c->kernels[i] = 2 * c->rates[i] - (c->rates[i] % 2);
    }
    if (h3j_get(md, kw, "resblock_kernel_sizes")) {
        if ((c->n_res = int_array(md, kw, mp, "resblock_kernel_sizes", c->res_kernels, -8, 1, 255)) < 0)
            return c->n_res;
    } else {
        c->n_res = 3;
        c->res_kernels[0] = 3;
        c->res_kernels[1] = 7;
        c->res_kernels[2] = 11;
    }
    const h3j *dl = h3j_get(md, kw, "resblock_dilation_sizes");
    if (dl) {
        if (dl->type != H3J_ARR || (int)dl->len != c->n_res)
            return h3_err(H3_E_FORMAT, "%s: resblock_dilation_sizes needs %d lists", mp, c->n_res);
        int i = 0;
        for (const h3j *x = h3j_first(md, dl); x; x = h3j_next(md, x), i++) {
            if (x->type != H3J_ARR || x->len == 0 || x->len > 8 || (i && (int)x->len != c->n_dil))
                return h3_err(H3_E_FORMAT, "%s: resblock_dilation_sizes[%d] must be a list of 1-8 "
                              "integers, equal lengths", mp, i);
            c->n_dil = (int)x->len;
            int j = 0;
            for (const h3j *y = h3j_first(md, x); y; y = h3j_next(md, y), j++) {
                if (y->type != H3J_NUM || !y->is_int || y->i < 1 || y->i > 1024)
                    return h3_err(H3_E_FORMAT, "%s: resblock_dilation_sizes[%d][%d] is not a positive integer", mp, i, j);
                c->res_dil[i][j] = (int)y->i;
            }
        }
    } else {
        c->n_dil = 3;
        for (int i = 0; i < c->n_res; i++) {
            c->res_dil[i][0] = 1;
            c->res_dil[i][1] = 3;
            c->res_dil[i][2] = 5;
        }
    }
    int hop = product(c->rates, c->n_up);
    if (hop > c->sample_rate || c->sample_rate % hop)
        return h3_err(H3_E_FORMAT, "%s: sample_rate %d is not a multiple of the decoder hop %d", wp,
                      c->sample_rate, hop);
    if ((c->decoder_dim >> c->n_up) < 1)
        return h3_err(H3_E_FORMAT, "%s: decoder_dim %d halves below 1 channel over %d stages", mp,
                      c->decoder_dim, c->n_up);
    return 0;
}
