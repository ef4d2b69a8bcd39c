/*
 * Video VAE decoder: geometry against values printed by diffusers 0.42.1 (`_split_tiles`, frame
 * counts), and whole decodes of a small random checkpoint written here (so they also run under
 * ASan+UBSan): thread-count invariance, single tile == untiled, the float/uint8/raw outputs agree,
 * progress and cancel, misaligned tensors, bad requests. Numerical parity with diffusers is in
 * tests/test_video_vae.py.
 */
#include "ctest.h"
#include "models/video_vae.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- geometry ---------------------------------------------------------------------------- */

static h3_vvae_cfg release_cfg(void)
{
    h3_vvae_cfg c;
    memset(&c, 0, sizeof c);
    c.latent_ch = 24, c.out_ch = 3, c.spatial = 16, c.temporal = 4;
    c.dec_layers = 1, c.dec_heads = 2, c.dec_head_dim = 16, c.dec_registers = 4, c.dec_ffn_mult = 4;
    c.dec_rope_theta = 100, c.dec_rope_ratio = 0.75, c.dec_eps = 1e-5;
    c.clip_length = 17, c.token_drop = 3, c.tile_size = 256, c.tile_overlap = 64;
    return c;
}

static void check_split(int px, int tile, int ov, int n, const int *starts, const int *ovs)
{
    h3_vvae_cfg c = release_cfg();
    h3_vvae_plan p;
    int rc = h3_vvae_plan_make(&c, 7, px / 16, 16, tile, ov, 0, &p);
    CHECK_MSG(rc == 0, "plan %d px: %s", px, h3_last_error());
    if (rc) return;
    CHECK_MSG(p.ny == n, "%d px tile %d ov %d: %d tiles, diffusers %d", px, tile, ov, p.ny, n);
    for (int i = 0; i < n && i < p.ny; i++) {
        CHECK_MSG(p.y0[i] == starts[i], "%d px: start %d is %d, diffusers %d", px, i, p.y0[i], starts[i]);
        if (i + 1 < n) CHECK_MSG(p.ovy[i] == ovs[i], "%d px: overlap %d is %d, diffusers %d", px, i, p.ovy[i], ovs[i]);
    }
    CHECK(p.tile_h == (tile < px ? tile : px));
    h3_vvae_plan_free(&p);
}

static void test_geometry(void)
{
    /* diffusers AutoencoderKLMiniMaxH3._split_tiles(length, tile, min_overlap) */
    check_split(96, 64, 32, 2, (int[]){0, 32}, (int[]){32});
    check_split(160, 64, 16, 3, (int[]){0, 48, 96}, (int[]){16, 16});
    check_split(288, 256, 64, 2, (int[]){0, 32}, (int[]){224});
    check_split(1344, 256, 64, 7, (int[]){0, 176, 352, 528, 704, 896, 1088}, (int[]){80, 80, 80, 80, 64, 64});
    check_split(768, 256, 64, 4, (int[]){0, 160, 336, 512}, (int[]){96, 80, 80});
    check_split(480, 256, 64, 3, (int[]){0, 112, 224}, (int[]){144, 144});
    check_split(864, 256, 64, 5, (int[]){0, 144, 288, 448, 608}, (int[]){112, 112, 96, 96});
    check_split(64, 256, 64, 1, (int[]){0}, NULL);
    check_split(400, 112, 16, 4, (int[]){0, 96, 192, 288}, (int[]){16, 16, 16});

    /* Frame counts of `_decode` (5n + 2 latents -> 17n + 5 frames; others padded and cut). */
    static const int T[] = {3, 7, 9, 12, 17, 32, 107}, F[] = {9, 22, 30, 39, 56, 107, 362};
    h3_vvae_cfg c = release_cfg();
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        h3_vvae_plan p;
        int rc = h3_vvae_plan_make(&c, T[i], 2, 2, 0, 0, 0, &p);
        CHECK_MSG(rc == 0 && p.frames == F[i], "T=%d: %d frames, expected %d", T[i], rc ? rc : p.frames, F[i]);
        if (!rc) {
            CHECK(p.win == 7 && p.keep0 == 17 && p.keep1 == 5 && p.blend_t == 5 && p.pre == 3);
            h3_vvae_plan_free(&p);
        }
    }
    /* Traversal order: the one keeping fewer overlap-strip bytes (landscape: by columns). */
    h3_vvae_plan p;
    CHECK(h3_vvae_plan_make(&c, 7, 6, 10, 64, 32, 0, &p) == 0 && p.col_major && p.ny == 2 && p.nx == 4);
    h3_vvae_plan_free(&p);
    CHECK(h3_vvae_plan_make(&c, 7, 10, 6, 64, 32, 0, &p) == 0 && !p.col_major && p.ny == 4 && p.nx == 2);
    h3_vvae_plan_free(&p);
    CHECK(h3_vvae_plan_make(&c, 2, 2, 2, 0, 0, 0, &p) == -H3_E_INVALID);
    CHECK(h3_vvae_plan_make(&c, 7, 2, 2, 40, 16, 0, &p) == -H3_E_INVALID);  /* not a multiple of 16 */
    CHECK(h3_vvae_plan_make(&c, 7, 2, 2, 64, 64, 0, &p) == -H3_E_INVALID);  /* overlap >= tile */
}

/* ---- a small checkpoint ------------------------------------------------------------------ */

/* Geometry of the test model: 4x spatial, 4x temporal, D = 2 x 16, 2 registers, ffn 2x. */
enum { C_ = 8, HEADS = 2, DH = 16, D_ = HEADS * DH, R_ = 2, FFN = 2, I_ = D_ * FFN, PS = 4, PT = 4, LAYERS = 2 };
#define PIX (3 * PT * PS * PS)

typedef struct {
    char name[96];
    const char *dtype;
    int ndim;
    int64_t shape[5];
    size_t bytes;
} tdesc;

static int add(tdesc *t, int n, const char *name, const char *dtype, int ndim, int64_t a, int64_t b, int64_t c3)
{
    tdesc *d = &t[n];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->dtype = dtype, d->ndim = ndim;
    int64_t s[5] = {a, b, c3, 1, 1}, count = 1;
    for (int i = 0; i < ndim; i++) d->shape[i] = s[i], count *= s[i];
    d->bytes = (size_t)count * (strcmp(dtype, "U8") == 0 ? 1 : 4);
    return n + 1;
}

/* Write <dir>/FL2VA/video_vae/{config.json, source/config.json, source/model.safetensors}. A
   2-byte U8 tensor first makes every F32 tensor after it misaligned in the file; `skip` leaves
   one tensor out. */
static int write_checkpoint(const char *dir, const char *skip)
{
    char p[512];
    snprintf(p, sizeof p, "%s/FL2VA", dir), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/video_vae", dir), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/video_vae/source", dir), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/video_vae/config.json", dir);
    FILE *f = fopen(p, "w");
    if (!f) return -1;
    fprintf(f, "{\"_class_name\": \"MiniMaxH3VideoVAE\", \"latent_channels\": %d, \"latents_mean\": [", C_);
    for (int i = 0; i < C_; i++) fprintf(f, "%s%g", i ? ", " : "", 0.1 * i - 0.3);
    fprintf(f, "], \"latents_std\": [");
    for (int i = 0; i < C_; i++) fprintf(f, "%s%g", i ? ", " : "", 0.5 + 0.1 * i);
    fprintf(f, "], \"source_path\": \"source\", \"source_safetensors_path\": \"model.safetensors\", "
               "\"vae_clip_length\": 17, \"vae_token_drop\": 3, \"vae_tile_size\": 16, \"vae_tile_overlap_min\": 8}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/FL2VA/video_vae/source/config.json", dir);
    if (!(f = fopen(p, "w"))) return -1;
    fprintf(f, "{\"_class_name\": \"AutoencoderKLLegacy\", \"z_channels\": %d, \"out_ch\": 3, \"space_down\": [2, 2], "
               "\"time_down\": [2, 2], \"vae_ratio\": 4, \"vae_ratio_t\": 4, \"vit_decoder_kwargs\": {\"num_layers\": %d, "
               "\"heads\": %d, \"dim_head\": %d, \"rope_theta\": 100.0, \"rope_dim_ratio\": 0.75, "
               "\"num_register_tokens\": %d, \"ffn_mult\": %d, \"eps\": 1e-05}}\n", C_, LAYERS, HEADS, DH, R_, FFN);
    fclose(f);

    tdesc t[64];
    int n = 0;
    n = add(t, n, "encoder.odd_bytes", "U8", 1, 2, 0, 0);
    n = add(t, n, "post_quant_conv.weight", "F32", 5, C_, C_, 1);
    n = add(t, n, "post_quant_conv.bias", "F32", 1, C_, 0, 0);
    n = add(t, n, "decoder.x_embedder.weight", "F32", 2, D_, C_, 0);
    n = add(t, n, "decoder.x_embedder.bias", "F32", 1, D_, 0, 0);
    n = add(t, n, "decoder.register_tokens", "F32", 3, 1, R_, D_);
    n = add(t, n, "decoder.mask_token", "F32", 3, 1, 1, D_);
    for (int l = 0; l < LAYERS; l++) {
        char b[96];
#define L(s) (snprintf(b, sizeof b, "decoder.transformer_blocks.%d.%s", l, s), b)
        n = add(t, n, L("norm1.weight"), "F32", 1, D_, 0, 0);
        n = add(t, n, L("attn.to_qkv.weight"), "F32", 2, 3 * D_, D_, 0);
        n = add(t, n, L("attn.to_qkv.bias"), "F32", 1, 3 * D_, 0, 0);
        n = add(t, n, L("attn.to_out.weight"), "F32", 2, D_, D_, 0);
        n = add(t, n, L("attn.to_out.bias"), "F32", 1, D_, 0, 0);
        n = add(t, n, L("scale1"), "F32", 1, D_, 0, 0);
        n = add(t, n, L("norm2.weight"), "F32", 1, D_, 0, 0);
        n = add(t, n, L("ff.w1.weight"), "F32", 2, 2 * I_, D_, 0);
        n = add(t, n, L("ff.w1.bias"), "F32", 1, 2 * I_, 0, 0);
        n = add(t, n, L("ff.w2.weight"), "F32", 2, D_, I_, 0);
        n = add(t, n, L("ff.w2.bias"), "F32", 1, D_, 0, 0);
        n = add(t, n, L("scale2"), "F32", 1, D_, 0, 0);
#undef L
    }
    n = add(t, n, "decoder.norm_out.weight", "F32", 1, D_, 0, 0);
    n = add(t, n, "decoder.norm_out.bias", "F32", 1, D_, 0, 0);
    n = add(t, n, "decoder.proj_out.weight", "F32", 2, PIX, D_, 0);
    n = add(t, n, "decoder.proj_out.bias", "F32", 1, PIX, 0, 0);

    char *hdr = malloc(1 << 16);
    size_t hn = 0, off = 0;
    hn += (size_t)sprintf(hdr + hn, "{");
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (skip && strcmp(t[i].name, skip) == 0) continue;
        hn += (size_t)sprintf(hdr + hn, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [", first ? "" : ", ", t[i].name,
                              t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) hn += (size_t)sprintf(hdr + hn, "%s%lld", d ? ", " : "", (long long)t[i].shape[d]);
        hn += (size_t)sprintf(hdr + hn, "], \"data_offsets\": [%zu, %zu]}", off, off + t[i].bytes);
        off += t[i].bytes;
        first = false;
    }
    hn += (size_t)sprintf(hdr + hn, "}");
    while (hn % 8) hdr[hn++] = ' ';
    snprintf(p, sizeof p, "%s/FL2VA/video_vae/source/model.safetensors", dir);
    if (!(f = fopen(p, "wb"))) return -1;
    uint64_t len = hn;
    fwrite(&len, 8, 1, f);
    fwrite(hdr, 1, hn, f);
    free(hdr);
    for (int i = 0; i < n; i++) {
        if (skip && strcmp(t[i].name, skip) == 0) continue;
        const char *nm = t[i].name;
        size_t count = t[i].bytes / 4;
        if (strcmp(t[i].dtype, "U8") == 0) {
            fwrite("\x01\x02", 1, 2, f);
            continue;
        }
        bool scale = strstr(nm, "scale") != NULL, norm = strstr(nm, "norm") && strstr(nm, "weight");
        float fan = t[i].ndim >= 2 ? (float)t[i].shape[1] : 1.0f;
        for (size_t k = 0; k < count; k++) {
            float v = frand();
            if (scale) v = 0.75f + 0.25f * v;
            else if (norm) v = 1.0f + 0.2f * v;
            else if (t[i].ndim >= 2 && !strstr(nm, "tokens")) v *= (strstr(nm, "proj_out") ? 3.0f : 1.7f) / sqrtf(fan);
            else v *= 0.2f;
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    return 0;
}

/* ---- decodes ----------------------------------------------------------------------------- */

typedef struct {
    int calls, last_done, last_total, cancel_at;
} progress_log;

static int on_progress(void *user, const char *phase, int done, int total)
{
    progress_log *l = user;
    l->calls++;
    l->last_done = done, l->last_total = total;
    if (strcmp(phase, "video_decode") != 0) return 1;
    return l->cancel_at && done == l->cancel_at;
}

static h3_ctx *open_ctx(const char *dir, int threads)
{
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    h3_ctx *ctx = h3_init(dir, &o);
    CHECK_MSG(ctx != NULL, "h3_init %s: %s", dir, h3_last_error());
    return ctx;
}

typedef struct {
    uint8_t *rgb;
    float *pix, *raw;
    size_t n;
} outputs;

static int decode_all(h3_ctx *ctx, const float *lat, int T, int h, int w, int tile, int ov, uint32_t flags, outputs *o)
{
    int F, H, W;
    int rc = h3_video_decode_shape(ctx, T, h, w, &F, &H, &W);
    if (rc) return rc;
    o->n = (size_t)F * H * W * 3;
    o->rgb = malloc(o->n), o->pix = malloc(o->n * 4), o->raw = malloc(o->n * 4);
    h3_video_decode_opts opt;
    h3_video_decode_opts_default(&opt);
    opt.tile_px = tile, opt.overlap_px = ov, opt.flags = flags;
    if ((rc = h3_video_decode(ctx, lat, C_, T, h, w, &opt, o->rgb, o->pix))) return rc;
    opt.flags |= H3_VIDEO_RAW;
    return h3_video_decode(ctx, lat, C_, T, h, w, &opt, NULL, o->raw);
}

static void free_outputs(outputs *o) { free(o->rgb), free(o->pix), free(o->raw); }

static void test_decodes(const char *dir)
{
    /* 7 x 9 latents = 28 x 36 px, 12 latents = 2 windows; 16 px tiles over 8 px: 3 x 4 tiles. */
    enum { T = 12, H = 7, W = 9 };
    size_t nl = (size_t)C_ * T * H * W;
    float *lat = malloc(nl * sizeof(float));
    for (size_t i = 0; i < nl; i++) lat[i] = 1.5f * frand();

    h3_ctx *c1 = open_ctx(dir, 1), *c3 = open_ctx(dir, 3);
    if (!c1 || !c3) return;
    int F, Hp, Wp;
    CHECK(h3_video_decode_shape(c1, T, H, W, &F, &Hp, &Wp) == 0 && F == 39 && Hp == 28 && Wp == 36);

    outputs a = {0}, b = {0};
    int rc = decode_all(c1, lat, T, H, W, 0, 0, 0, &a);
    CHECK_MSG(rc == 0, "decode: %s", h3_last_error());
    CHECK(decode_all(c3, lat, T, H, W, 0, 0, 0, &b) == 0);
    if (!rc) {
        CHECK_MSG(memcmp(a.rgb, b.rgb, a.n) == 0 && memcmp(a.pix, b.pix, a.n * 4) == 0 &&
                  memcmp(a.raw, b.raw, a.n * 4) == 0, "1 and 3 threads differ");
        /* The three outputs are one computation: uint8 = round-half-even(pixels * 255), pixels =
           clamp(raw * std + mean) with raw planar [3, F, H, W]. */
        static const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
        size_t bad = 0, clamped = 0, plane = (size_t)F * Hp * Wp;
        for (size_t i = 0; i < a.n; i++) {
            size_t px = i / 3, co = i % 3;
            float s = a.raw[co * plane + px] * sd[co];
            s = s + mean[co];
            s = s < 0 ? 0 : (s > 1 ? 1 : s);
            clamped += s == 0 || s == 1;
            float q = s * 255.0f;
            bad += a.pix[i] != s || a.rgb[i] != (uint8_t)nearbyintf(q);
        }
        CHECK_MSG(bad == 0, "%zu values disagree between the raw, float and uint8 outputs", bad);
        CHECK_MSG(clamped > 0 && clamped < a.n / 2, "clamp exercised on %zu of %zu values", clamped, a.n);
    }
    free_outputs(&b);

    /* A tile at least the canvas is one tile: identical to the untiled decode. */
    outputs u = {0}, s = {0};
    CHECK(decode_all(c3, lat, T, H, W, 64, 8, 0, &s) == 0);
    CHECK(decode_all(c3, lat, T, H, W, 0, 0, H3_VIDEO_UNTILED, &u) == 0);
    CHECK(memcmp(s.raw, u.raw, s.n * 4) == 0);
    /* ... and differs from the tiled one (tiles see less context), though not wildly. */
    double num = 0, den = 0;
    for (size_t i = 0; i < s.n; i++) num += (s.raw[i] - a.raw[i]) * (double)(s.raw[i] - a.raw[i]), den += (double)s.raw[i] * s.raw[i];
    CHECK_MSG(num > 0 && num < den, "tiled vs untiled relative energy %g", num / den);
    free_outputs(&s), free_outputs(&u), free_outputs(&a);

    /* Padded latent count (T = 9 -> 30 frames) with blending in both directions; landscape (tiles
       visited by columns) and portrait (by rows). */
    outputs pd = {0}, pt = {0};
    CHECK(decode_all(c3, lat, 9, H, W, 16, 8, 0, &pd) == 0 && pd.n == (size_t)30 * 28 * 36 * 3);
    CHECK(decode_all(c1, lat, 9, W, H, 16, 8, 0, &pt) == 0 && pt.n == (size_t)30 * 36 * 28 * 3);
    free_outputs(&pd), free_outputs(&pt);

    /* Progress: 0 first, then one call per (window, tile); a non-zero return cancels. */
    progress_log log = {0};
    h3_video_decode_opts opt;
    h3_video_decode_opts_default(&opt);
    opt.progress = on_progress, opt.user = &log;
    uint8_t *rgb = malloc((size_t)F * Hp * Wp * 3);
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, &opt, rgb, NULL) == 0);
    CHECK_MSG(log.calls == 25 && log.last_done == 24 && log.last_total == 24, "%d progress calls", log.calls);
    log = (progress_log){.cancel_at = 5};
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, &opt, rgb, NULL) == -H3_E_CANCELLED && log.calls == 6);
    /* Without a hook in the options the context's hook reports. */
    log = (progress_log){0};
    h3_set_progress(c3, on_progress, &log);
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, NULL, rgb, NULL) == 0 && log.calls == 25);
    h3_set_progress(c3, NULL, NULL);

    /* Bad requests. */
    CHECK(h3_video_decode(c3, lat, C_ + 1, T, H, W, NULL, rgb, NULL) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "channels") != NULL);
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, NULL, NULL, NULL) == -H3_E_INVALID);
    CHECK(h3_video_decode(c3, NULL, C_, T, H, W, NULL, rgb, NULL) == -H3_E_INVALID);
    opt.struct_size = 3;
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, &opt, rgb, NULL) == -H3_E_INVALID);
    h3_video_decode_opts_default(&opt);
    opt.flags = 0x80;
    CHECK(h3_video_decode(c3, lat, C_, T, H, W, &opt, rgb, NULL) == -H3_E_INVALID);
    CHECK(h3_video_decode_workspace(c3, T, H, W, NULL) > 0);
    free(rgb);
    free(lat);
    h3_free(c1);
    h3_free(c3);
}

static void test_missing_tensor(const char *dir)
{
    const char *gone = "decoder.transformer_blocks.1.attn.to_qkv.bias";
    CHECK(write_checkpoint(dir, gone) == 0);
    h3_ctx *ctx = open_ctx(dir, 2);
    if (!ctx) return;
    float lat[C_ * 7 * 2 * 2] = {0};
    uint8_t rgb[22 * 8 * 8 * 3];
    CHECK(h3_video_decode(ctx, lat, C_, 7, 2, 2, NULL, rgb, NULL) == -H3_E_SCHEMA);
    CHECK_MSG(strstr(h3_last_error(), gone) && strstr(h3_last_error(), "missing"), "message: %s", h3_last_error());
    h3_free(ctx);
}

static void rm_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    test_geometry();
    char dir[] = "/tmp/h3_test_vvae_XXXXXX", dir2[] = "/tmp/h3_test_vvae_XXXXXX";
    if (!mkdtemp(dir) || !mkdtemp(dir2)) {
        perror("mkdtemp");
        return 1;
    }
    CHECK(write_checkpoint(dir, NULL) == 0);
    test_decodes(dir);
    test_missing_tensor(dir2);
    rm_tree(dir);
    rm_tree(dir2);
    CTEST_END();
}
