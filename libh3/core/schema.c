/*
 * Checkpoint schema: every tensor a render reads, with the shape its config implies. `h3ctl
 * info` and `h3ctl check` run it on headers alone, so a wrong shape or dtype is reported before
 * any stage maps a byte. Tensors the engine never reads (video encoder, vision tower, layers past
 * the conditioning layer) may be present and are not checked.
 */
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    h3_store *s;
    const char *comp;
    int rc;
} checker;

static void shape_txt(char *b, size_t cap, int nd, const int64_t *sh)
{
    size_t n = (size_t)snprintf(b, cap, "[");
    for (int i = 0; i < nd && n < cap; i++) n += (size_t)snprintf(b + n, cap - n, "%s%lld", i ? ", " : "", (long long)sh[i]);
    if (n < cap) snprintf(b + n, cap - n, "]");
}

/* Expect tensor `name` with `nd` dims given as varargs (int64_t). */
static void expect(checker *c, bool optional, const char *name, int nd, ...)
{
    if (c->rc) return;
    int64_t want[H3_MAX_DIMS];
    va_list ap;
    va_start(ap, nd);
    for (int i = 0; i < nd; i++) want[i] = va_arg(ap, int64_t);
    va_end(ap);
    const h3_tensor *t = h3_store_find(c->s, name);
    if (!t) {
        if (optional) return;
        c->rc = h3_err(H3_E_SCHEMA, "%s: tensor '%s' is missing (%d shard%s in %s)", c->comp, name,
                       c->s->nfiles, c->s->nfiles == 1 ? "" : "s",
                       c->s->nfiles ? c->s->files[0].path : "?");
        return;
    }
    const char *file = c->s->files[t->file].path;
    bool ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char a[128], b[128];
        shape_txt(a, sizeof a, t->ndim, t->shape);
        shape_txt(b, sizeof b, nd, want);
        c->rc = h3_err(H3_E_SCHEMA, "%s: tensor '%s' has shape %s, the config implies %s", file, name, a, b);
        return;
    }
    if (t->dtype != H3_DT_F32 && t->dtype != H3_DT_BF16 && t->dtype != H3_DT_F16)
        c->rc = h3_err(H3_E_SCHEMA, "%s: tensor '%s' is %s, expected a float type (F32, BF16 or F16)", file,
                       name, h3_dtype_name(t->dtype));
}

#define I(x) ((int64_t)(x))

static void check_dit_block(checker *c, const char *pre, const h3_dit_cfg *d)
{
    char n[256];
    int64_t A = I(d->heads) * d->head_dim;
#define E(suffix, nd, ...)                                          \
    do {                                                            \
        snprintf(n, sizeof n, "%s.%s", pre, suffix);                \
        expect(c, false, n, nd, __VA_ARGS__);                       \
    } while (0)
    E("norm1.weight", 1, I(d->hidden));
    E("norm2.weight", 1, I(d->hidden));
    E("attn.qkv_proj.weight", 2, 3 * A, I(d->hidden));
    E("attn.q_norm.weight", 1, I(d->head_dim));
    E("attn.k_norm.weight", 1, I(d->head_dim));
    E("attn.out_proj.weight", 2, I(d->hidden), A);
    E("mlp.fc1.weight", 2, 2 * I(d->ffn), I(d->hidden));
    E("mlp.fc2.weight", 2, I(d->hidden), I(d->ffn));
#undef E
}

static int check_dit(h3_model *m)
{
    h3_dit_cfg d;
    int rc = h3_dit_cfg_load(m, &d);
    if (rc) return rc;
    checker c = {&m->comp[H3_COMP_TRANSFORMER].store, "transformer", 0};
    int64_t H = d.hidden, pd = I(d.video_ch) * d.patch[0] * d.patch[1] * d.patch[2];
    char n[128];
    expect(&c, false, "condition_proj.weight", 2, H, I(d.text_dim));
    expect(&c, false, "condition_proj.bias", 1, H);
    for (int i = 0; i < d.refiner_layers; i++) {
        snprintf(n, sizeof n, "token_refiner.blocks.%d", i);
        check_dit_block(&c, n, &d);
    }
    expect(&c, false, "token_refiner.final_norm.weight", 1, H);
    /* A pruned single file holds the AdaLN curve table instead of the time embedder; the AdaLN
       projections then take the table's basis width (models/dit.c). */
    const h3_tensor *tab = h3_store_find(c.s, "time_embedder.table");
    if (tab) {
        if (tab->ndim != 2 || tab->shape[0] < 2 || tab->shape[0] > (1 << 20) || tab->shape[1] < 1 ||
            tab->shape[1] > (1 << 16))
            return h3_err(H3_E_SCHEMA, "%s: the AdaLN curve table has %d dimensions or an impossible shape",
                          c.s->files[tab->file].path, tab->ndim);
        expect(&c, false, "time_embedder.table", 2, tab->shape[0], tab->shape[1]);
        d.temb_dim = (int)tab->shape[1];
    } else {
        expect(&c, false, "time_embedder.proj_in.weight", 2, I(d.temb_hidden), I(d.freq_dim));
        expect(&c, false, "time_embedder.proj_in.bias", 1, I(d.temb_hidden));
        expect(&c, false, "time_embedder.proj_out.weight", 2, I(d.temb_dim), I(d.temb_hidden));
        expect(&c, false, "time_embedder.proj_out.bias", 1, I(d.temb_dim));
    }
    for (int i = 0; i < d.layers && !c.rc; i++) {
        snprintf(n, sizeof n, "blocks.%d", i);
        check_dit_block(&c, n, &d);
        char a[128];
        snprintf(a, sizeof a, "blocks.%d.adaln_proj.linear.weight", i);
        expect(&c, false, a, 2, 18 * H, I(d.temb_dim));
        snprintf(a, sizeof a, "blocks.%d.adaln_proj.linear.bias", i);
        expect(&c, false, a, 1, 18 * H);
    }
    expect(&c, false, "final_layer.adaln_proj.linear.weight", 2, 2 * H, I(d.temb_dim));
    expect(&c, false, "final_layer.adaln_proj.linear.bias", 1, 2 * H);
    expect(&c, false, "final_layer.norm.weight", 1, H);
    expect(&c, false, "final_layer.video_out.weight", 2, pd, H);
    expect(&c, false, "final_layer.video_out.bias", 1, pd);
    expect(&c, false, "final_layer.audio_out.weight", 2, I(d.audio_ch), H);
    expect(&c, false, "final_layer.audio_out.bias", 1, I(d.audio_ch));
    expect(&c, false, "video_patch_proj.weight", 2, H, pd);
    expect(&c, false, "video_patch_proj.bias", 1, H);
    expect(&c, false, "audio_patch_proj.weight", 2, H, I(d.audio_ch));
    expect(&c, false, "audio_patch_proj.bias", 1, H);
    /* The transformer reads the frequencies whenever it rotates (rope_inv_freq_len > 0). */
    expect(&c, d.rope_freq <= 0, "rope.inv_freq", 1, I(d.rope_freq));
    return c.rc;
}

static int check_text(h3_model *m)
{
    h3_text_cfg t;
    int rc = h3_text_cfg_load(m, &t);
    if (rc) return rc;
    checker c = {&m->comp[H3_COMP_TEXT_ENCODER].store, "text_encoder", 0};
    int64_t h = t.hidden, q = I(t.heads) * t.head_dim, kv = I(t.kv_heads) * t.head_dim;
    expect(&c, false, "model.language_model.embed_tokens.weight", 2, I(t.vocab), h);
    char n[160];
    /* Layers past the conditioning layer are never read, so they are not required. */
    for (int l = 0; l < t.cond_layer && !c.rc; l++) {
#define E(suffix, nd, ...)                                                          \
    do {                                                                            \
        snprintf(n, sizeof n, "model.language_model.layers.%d.%s", l, suffix);      \
        expect(&c, false, n, nd, __VA_ARGS__);                                      \
    } while (0)
        E("input_layernorm.weight", 1, h);
        E("self_attn.q_proj.weight", 2, q, h);
        E("self_attn.k_proj.weight", 2, kv, h);
        E("self_attn.v_proj.weight", 2, kv, h);
        E("self_attn.q_norm.weight", 1, I(t.head_dim));
        E("self_attn.k_norm.weight", 1, I(t.head_dim));
        E("self_attn.o_proj.weight", 2, h, q);
        E("post_attention_layernorm.weight", 1, h);
        E("mlp.gate_proj.weight", 2, I(t.inter), h);
        E("mlp.up_proj.weight", 2, I(t.inter), h);
        E("mlp.down_proj.weight", 2, h, I(t.inter));
#undef E
    }
    return c.rc;
}

static int check_vvae(h3_model *m)
{
    h3_vvae_cfg v;
    int rc = h3_vvae_cfg_load(m, &v);
    if (rc) return rc;
    checker c = {&m->comp[H3_COMP_VIDEO_VAE].store, "video_vae", 0};
    int64_t C = v.latent_ch, dim = I(v.dec_heads) * v.dec_head_dim, ffn = dim * v.dec_ffn_mult;
    expect(&c, false, "post_quant_conv.weight", 5, C, C, I(1), I(1), I(1));
    expect(&c, false, "post_quant_conv.bias", 1, C);
    expect(&c, false, "decoder.x_embedder.weight", 2, dim, C);
    expect(&c, false, "decoder.x_embedder.bias", 1, dim);
    expect(&c, false, "decoder.register_tokens", 3, I(1), I(v.dec_registers), dim);
    char n[160];
    for (int i = 0; i < v.dec_layers && !c.rc; i++) {
#define E(suffix, nd, ...)                                                      \
    do {                                                                        \
        snprintf(n, sizeof n, "decoder.transformer_blocks.%d.%s", i, suffix);   \
        expect(&c, false, n, nd, __VA_ARGS__);                                  \
    } while (0)
        E("norm1.weight", 1, dim);
        E("norm2.weight", 1, dim);
        E("scale1", 1, dim);
        E("scale2", 1, dim);
        E("attn.to_qkv.weight", 2, 3 * dim, dim);
        E("attn.to_qkv.bias", 1, 3 * dim);
        E("attn.to_out.weight", 2, dim, dim);
        E("attn.to_out.bias", 1, dim);
        E("ff.w1.weight", 2, 2 * ffn, dim);
        E("ff.w1.bias", 1, 2 * ffn);
        E("ff.w2.weight", 2, dim, ffn);
        E("ff.w2.bias", 1, dim);
#undef E
    }
    int64_t po = I(v.out_ch) * v.temporal * v.spatial * v.spatial;
    expect(&c, false, "decoder.norm_out.weight", 1, dim);
    expect(&c, false, "decoder.norm_out.bias", 1, dim);
    expect(&c, false, "decoder.proj_out.weight", 2, po, dim);
    expect(&c, false, "decoder.proj_out.bias", 1, po);
    return c.rc;
}

static void wn_conv(checker *c, const char *pre, int64_t out, int64_t in, int64_t k, bool bias, bool transpose)
{
    char n[192];
    /* torch weight_norm keeps one gain per slice of dim 0: out channels, or in for ConvTranspose. */
    snprintf(n, sizeof n, "%s.weight_v", pre);
    if (transpose)
        expect(c, false, n, 3, in, out, k);
    else
        expect(c, false, n, 3, out, in, k);
    snprintf(n, sizeof n, "%s.weight_g", pre);
    expect(c, false, n, 3, transpose ? in : out, I(1), I(1));
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", pre);
        expect(c, false, n, 1, out);
    }
}

static void snake(checker *c, const char *pre, int64_t ch)
{
    char n[192];
    snprintf(n, sizeof n, "%s.act.alpha", pre);
    expect(c, false, n, 1, ch);
    snprintf(n, sizeof n, "%s.act.beta", pre);
    expect(c, false, n, 1, ch);
    snprintf(n, sizeof n, "%s.upsample.filter", pre);
    expect(c, false, n, 3, I(1), I(1), I(12));
    snprintf(n, sizeof n, "%s.downsample.lowpass.filter", pre);
    expect(c, false, n, 3, I(1), I(1), I(12));
}

static int check_avae(h3_model *m)
{
    h3_avae_cfg a;
    int rc = h3_avae_cfg_load(m, &a);
    if (rc) return rc;
    checker c = {&m->comp[H3_COMP_AUDIO_VAE].store, "audio_vae", 0};
    expect(&c, false, "dec_in_proj.weight", 3, I(a.latent_dim), I(a.latent_ch), I(1));
    expect(&c, false, "dec_in_proj.bias", 1, I(a.latent_dim));
    wn_conv(&c, "decoder.conv_pre", a.decoder_dim, a.latent_dim, 7, true, false);
    char n[160];
    int64_t ch = a.decoder_dim;
    for (int i = 0; i < a.n_up && !c.rc; i++) {
        snprintf(n, sizeof n, "decoder.ups.%d.0", i);
        wn_conv(&c, n, ch / 2, ch, a.kernels[i], true, true);
        ch /= 2;
        for (int j = 0; j < a.n_res && !c.rc; j++) {
            int g = i * a.n_res + j;
            for (int d = 0; d < a.n_dil; d++) {
                snprintf(n, sizeof n, "decoder.resblocks.%d.convs1.%d", g, d);
                wn_conv(&c, n, ch, ch, a.res_kernels[j], true, false);
                snprintf(n, sizeof n, "decoder.resblocks.%d.convs2.%d", g, d);
                wn_conv(&c, n, ch, ch, a.res_kernels[j], true, false);
            }
            for (int k = 0; k < 2 * a.n_dil; k++) {
                snprintf(n, sizeof n, "decoder.resblocks.%d.activations.%d", g, k);
                snake(&c, n, ch);
            }
        }
    }
    snake(&c, "decoder.activation_post", ch);
    wn_conv(&c, "decoder.conv_post", 1, ch, 7, false, false);
    return c.rc;
}

int h3_model_validate(h3_model *m, h3_component comp)
{
    if (!m->comp[comp].present) return h3_model_require(m, comp, "validation");
    int rc = h3_model_headers(m, comp);
    if (rc) return rc;
    switch (comp) {
    case H3_COMP_TRANSFORMER: return check_dit(m);
    case H3_COMP_TEXT_ENCODER: return check_text(m);
    case H3_COMP_VIDEO_VAE: return check_vvae(m);
    case H3_COMP_AUDIO_VAE: return check_avae(m);
    default: return 0;
    }
}
