/* The context object: open a model directory, choose the device, describe the model and the
   backends, estimate memory per phase. */
#include "api/api.h"
#include "backend/cpu/ops.h"
#include "models/dit.h"
#include "models/dit_fp8file.h"
#include "models/text_encoder.h"
#include "core/geometry.h"
#include "core/singlefile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

H3_API const char *h3_cpu_features(void)
{
#if defined(__x86_64__) || defined(__i386__)
    static char buf[64];
    if (!buf[0]) {
        unsigned f = h3_cpu_x86_features();
        snprintf(buf, sizeof buf, "x86-64%s%s%s%s", (f & H3_CPU_AVX2) ? " avx2" : "", (f & H3_CPU_FMA) ? " fma" : "",
                 (f & H3_CPU_F16C) ? " f16c" : "", (f & H3_CPU_AVX512F) ? " avx512f" : "");
    }
    return buf;
#elif defined(__aarch64__)
    return "aarch64 neon";
#else
    return "generic";
#endif
}

H3_API void h3_options_default(h3_options *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->device = H3_DEVICE_AUTO;
}

/* Resolve the device: a GPU backend opens now, so a missing GPU is reported by h3_init. AUTO
   tries Metal on a Mac (where it is built), CUDA elsewhere, and falls back to the CPU. */
static int open_device(h3_ctx *ctx, int device, int index)
{
#if defined(__APPLE__)
    const bool auto_metal = device == H3_DEVICE_AUTO && h3_backend_metal_built();
#else
    const bool auto_metal = false; /* the Linux library is the test double's: asked for by name only */
#endif
    if (device == H3_DEVICE_METAL || auto_metal) {
        int rc = h3_backend_metal_open(&ctx->rt.gpu);
        if (rc && auto_metal) {
            h3_err_clear(); /* auto falls back to the CPU; h3_backends_json says why */
            ctx->device = H3_DEVICE_CPU;
            return 0;
        }
        if (rc) return rc;
        ctx->device = H3_DEVICE_METAL;
        snprintf(ctx->device_desc, sizeof ctx->device_desc, "%s", ctx->rt.gpu->desc);
        return 0;
    }
    if (device == H3_DEVICE_CPU || (device == H3_DEVICE_AUTO && !h3_backend_cuda_built())) {
        ctx->device = H3_DEVICE_CPU;
        return 0;
    }
    int rc = h3_backend_cuda_open(index, &ctx->rt.tuning, &ctx->rt.gpu);
    if (rc && device == H3_DEVICE_AUTO) {
        h3_err_clear(); /* auto falls back to the CPU; h3_backends_json says why */
        ctx->device = H3_DEVICE_CPU;
        return 0;
    }
    if (rc) return rc;
    ctx->device = H3_DEVICE_CUDA;
    snprintf(ctx->device_desc, sizeof ctx->device_desc, "%s", ctx->rt.gpu->desc);
    return 0;
}

/* The context's device by name ("cpu", "cuda", "metal"). */
static const char *device_word(int device)
{
    return device == H3_DEVICE_CUDA ? "cuda" : device == H3_DEVICE_METAL ? "metal" : "cpu";
}

/* fp8 weights (H3_PRECISION_FP8) run on fp8 tensor cores: a GPU backend of compute capability 8.9 or
   newer. Otherwise false with the reason ("needs ..."). The one copy of the rule: h3_init and
   h3_backends_json both ask here. */
static bool fp8_weights_ok(const h3_backend *g, char *why, size_t cap)
{
    if (g->compute_capability >= 89) return true;
    snprintf(why, cap, "needs a GPU of compute capability 8.9 or newer (fp8 tensor cores); this one is %d.%d",
             g->compute_capability / 10, g->compute_capability % 10);
    return false;
}

/* Refuse a weight precision, or fp8 attention, that the context's backend cannot run, before any work. */
static int check_precision(h3_ctx *ctx, int precision)
{
    ctx->rt.precision = precision;
    if (precision == H3_PRECISION_FP8) {
        if (ctx->device != H3_DEVICE_CUDA)
            return ctx->device == H3_DEVICE_METAL
                       ? h3_err(H3_E_UNSUPPORTED, "precision fp8 runs on the CUDA backend only (this context runs on "
                                                  "metal)")
                       : h3_err(H3_E_UNSUPPORTED, "precision fp8 runs on the CUDA backend only (this context runs on "
                                                  "the CPU: use int8 there, or a GPU)");
        char why[160];
        if (!fp8_weights_ok(ctx->rt.gpu, why, sizeof why)) return h3_err(H3_E_UNSUPPORTED, "precision fp8 %s", why);
    }
    if (ctx->flags & H3_OPT_FP8_ATTENTION) {
        if (ctx->device != H3_DEVICE_CUDA)
            return h3_err(H3_E_UNSUPPORTED, "fp8 attention runs on the CUDA backend only (this context runs on %s)",
                          ctx->device == H3_DEVICE_METAL ? "metal" : "the CPU");
        if (ctx->rt.gpu->attn_fp8_why[0])
            return h3_err(H3_E_UNSUPPORTED, "fp8 attention: %s", ctx->rt.gpu->attn_fp8_why);
    }
    if (ctx->flags & H3_OPT_FP8_DECODER) {
        if (ctx->device != H3_DEVICE_CUDA)
            return h3_err(H3_E_UNSUPPORTED, "the fp8 video decoder runs on the CUDA backend only (this context runs "
                          "on %s)", ctx->device == H3_DEVICE_METAL ? "metal" : "the CPU");
        if (ctx->flags & H3_OPT_STAGES_CPU)
            return h3_err(H3_E_UNSUPPORTED, "the fp8 video decoder runs on the GPU, and H3_STAGES_CPU keeps the "
                                            "decoders on the CPU: drop one of them");
        char why[160];
        if (!fp8_weights_ok(ctx->rt.gpu, why, sizeof why))
            return h3_err(H3_E_UNSUPPORTED, "the fp8 video decoder %s", why);
    }
    if (precision == H3_PRECISION_INT8 && ctx->device != H3_DEVICE_CPU)
        return h3_err(H3_E_UNSUPPORTED, "precision int8 runs on the CPU backend only (use fp8 on a GPU, or "
                                        "--device cpu)");
    return 0;
}

int h3_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 256 ? 256 : n) : 1;
}

/* The single files of h3_options, each read (header) and checked against its config now: a wrong
   file fails h3_init, before any work. */
static int set_files(h3_model *m, const h3_options *o)
{
    const char *paths[H3_COMP_COUNT] = {[H3_COMP_TRANSFORMER] = o->transformer_path,
                                        [H3_COMP_TEXT_ENCODER] = o->text_encoder_path,
                                        [H3_COMP_VIDEO_VAE] = o->video_vae_path,
                                        [H3_COMP_AUDIO_VAE] = o->audio_vae_path};
    int rc = o->tokenizer_dir ? h3_model_set_tokenizer(m, o->tokenizer_dir) : 0;
    for (int c = 0; c < H3_COMP_COUNT && !rc; c++)
        if (paths[c]) {
            rc = h3_model_set_file(m, (h3_component)c, paths[c]);
            if (!rc) rc = h3_model_validate(m, (h3_component)c);
        }
    return rc;
}

/* Whether a single-file transformer's quantised layers compute from their stored codes (decided
   before any of its data is read, docs/single-files.md): int8 on the CPU (not under a vram budget,
   whose CPU streamer reads the stored blocks' bytes), fp8 on a GPU with fp8 GEMMs; never with
   H3_QUANT_WIDEN=1 (the widening path, which LoRA files need: they merge into widened weights). */
static int single_file_native(h3_ctx *ctx, const h3_options *o)
{
    if (ctx->rt.tuning.quant_widen) return 0;
    /* The text encoder: its layers' int8 GEMM weights on the CPU (the stages' backend there). */
    h3_comp *te = &ctx->model.comp[H3_COMP_TEXT_ENCODER];
    int rc;
    if (ctx->model.file[H3_COMP_TEXT_ENCODER] && te->headers_loaded &&
        (ctx->device == H3_DEVICE_CPU || (ctx->flags & H3_OPT_STAGES_CPU)) &&
        (rc = h3_sf_native(&te->store, true, false, h3_text_gemm_weight)))
        return rc;
    h3_comp *k = &ctx->model.comp[H3_COMP_TRANSFORMER];
    if (!ctx->model.file[H3_COMP_TRANSFORMER] || !k->headers_loaded) return 0;
    if (ctx->device == H3_DEVICE_CPU) return o->vram_bytes > 0 ? 0 : h3_sf_native(&k->store, true, false, h3_dit_gemm_weight);
    const h3_backend *g = ctx->rt.gpu;
    if (g && h3_backend_has(g, H3_CAP_FP8_WEIGHTS) && g->compute_capability >= 89)
        return h3_sf_native(&k->store, false, true, NULL);
    return 0;
}

H3_API h3_ctx *h3_init(const char *model_dir, const h3_options *options)
{
    h3_options o;
    h3_options_default(&o);
    if (options) {
        /* Callers built against the first h3_options (no device fields) keep working, and so do those
           built before quantized_path (their struct_size ends before it: it stays NULL). */
        if (options->struct_size < offsetof(h3_options, flags) + sizeof o.flags ||
            options->struct_size > sizeof o) {
            h3_err(H3_E_INVALID, "h3_options.struct_size %u is not a size this library knows",
                   options->struct_size);
            return NULL;
        }
        memcpy(&o, options, options->struct_size);
    }
    if (o.threads < 0 || o.threads > 1024) {
        h3_err(H3_E_INVALID, "threads must be between 0 (all cores) and 1024, got %d", o.threads);
        return NULL;
    }
    if (o.device < H3_DEVICE_AUTO || o.device > H3_DEVICE_METAL) {
        h3_err(H3_E_INVALID, "device must be %d (auto), %d (cpu), %d (cuda) or %d (metal), got %d", H3_DEVICE_AUTO,
               H3_DEVICE_CPU, H3_DEVICE_CUDA, H3_DEVICE_METAL, o.device);
        return NULL;
    }
    if (o.device_index < 0) {
        h3_err(H3_E_INVALID, "device index must be 0 or more, got %d", o.device_index);
        return NULL;
    }
    if (o.precision < H3_PRECISION_DEFAULT || o.precision > H3_PRECISION_INT8) {
        h3_err(H3_E_INVALID, "precision must be %d (default), %d (fp8) or %d (int8), got %d", H3_PRECISION_DEFAULT,
               H3_PRECISION_FP8, H3_PRECISION_INT8, o.precision);
        return NULL;
    }
    /* 1 PiB: larger is a unit mistake, not a card. */
    if (o.vram_bytes < 0 || o.vram_bytes > ((int64_t)1 << 50)) {
        h3_err(H3_E_INVALID, "vram budget must be between 0 (auto) and 1 PiB, got %lld bytes", (long long)o.vram_bytes);
        return NULL;
    }
    h3_ctx *ctx = h3_calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->threads = o.threads ? o.threads : h3_online_cpus();
    /* The environment's knobs, read here once for the context (core/tuning.h): its overrides of the
       exact-path flags first (a variable set to 0 turns its switch off, any other value on). */
    h3_tuning_read(&ctx->rt.tuning);
    ctx->flags = (o.flags | ctx->rt.tuning.flags_on) & ~ctx->rt.tuning.flags_off;
    ctx->device_index = o.device_index;
    if (h3_model_open(&ctx->model, model_dir, ctx->flags) != 0) {
        free(ctx);
        return NULL;
    }
    if (set_files(&ctx->model, &o) != 0) {
        h3_model_close(&ctx->model);
        free(ctx);
        return NULL;
    }
    ctx->rt.model = &ctx->model;
    ctx->rt.threads = ctx->threads;
    ctx->rt.flags = ctx->flags;
    ctx->rt.vram_bytes = o.vram_bytes;
    /* The quantised weights file is checked against the model before the device opens: its reasons
       (another checkpoint, an incomplete file) hold whatever the device. */
    int rc = h3_geom_h3ctl_check(&ctx->model);
    if (!rc && o.quantized_path)
        rc = o.precision != H3_PRECISION_FP8
                 ? h3_err(H3_E_INVALID, "%s: a quantized weights file needs precision fp8 (it holds fp8 weights)",
                          o.quantized_path)
                 : h3_fp8file_open(&ctx->model, o.quantized_path, &ctx->rt.fp8file);
    if (rc || open_device(ctx, o.device, o.device_index) != 0 || check_precision(ctx, o.precision) != 0 ||
        single_file_native(ctx, &o) != 0) {
        h3_rt_free(&ctx->rt);
        h3_model_close(&ctx->model);
        free(ctx);
        return NULL;
    }
    h3_err_clear();
    return ctx;
}

H3_API void h3_free(h3_ctx *ctx)
{
    if (!ctx) return;
    h3_rt_free(&ctx->rt); /* before the model: the transformer's weights are views of its shards */
    h3_model_close(&ctx->model);
    free(ctx->dit_json);
    free(ctx->info_json);
    free(ctx->mem_json);
    free(ctx);
}

H3_API int h3_threads(const h3_ctx *ctx) { return ctx ? ctx->threads : 0; }

H3_API void h3_set_progress(h3_ctx *ctx, h3_progress_fn fn, void *user)
{
    if (!ctx) return;
    ctx->rt.progress = fn;
    ctx->rt.progress_user = fn ? user : NULL;
}

H3_API const char *h3_device_name(h3_ctx *ctx)
{
    if (!ctx) {
        h3_err(H3_E_INVALID, "NULL context");
        return NULL;
    }
    return device_word(ctx->device);
}

H3_API const char *h3_stages_device(h3_ctx *ctx)
{
    if (!ctx) {
        h3_err(H3_E_INVALID, "NULL context");
        return NULL;
    }
    /* The rule of h3_rt_stage_backend. */
    return ctx->device != H3_DEVICE_CPU && !(ctx->flags & H3_OPT_STAGES_CPU) ? device_word(ctx->device) : "cpu";
}

H3_API const char *h3_device_description(h3_ctx *ctx)
{
    if (!ctx) {
        h3_err(H3_E_INVALID, "NULL context");
        return NULL;
    }
    if (ctx->device == H3_DEVICE_CPU)
        snprintf(ctx->device_desc, sizeof ctx->device_desc, "cpu (%s kernels, %d threads)", h3_kernels_variant(),
                 ctx->threads);
    return ctx->device_desc;
}

H3_API int h3_device_memory_peak(h3_ctx *ctx, int reset, uint64_t *peak_bytes)
{
    if (!ctx || !peak_bytes) return h3_err(H3_E_INVALID, "NULL context or output");
    *peak_bytes = 0;
    h3_backend *g = ctx->rt.gpu;
    if (!g || !h3_backend_has(g, H3_CAP_MEM_PEAK)) return 0;
    int rc = g->mem->mem_peak(g, reset != 0, peak_bytes);
    return rc ? rc : 1;
}

H3_API const char *h3_backends_json(void)
{
    /* Paths (the kernel cache folder, cuDNN's library) make it long: sized for a few of 4096. */
    static char buf[16384];
    h3_buf b = {0};
    h3_buf_printf(&b, "{\"cpu\": {\"available\": true, \"kernels\": \"%s\", \"features\": ", h3_kernels_variant());
    h3_buf_json_str(&b, h3_cpu_features());
    h3_buf_printf(&b, "}, \"cuda\": {\"built\": %s", h3_backend_cuda_built() ? "true" : "false");
    h3_backend *be = NULL;
    h3_tuning *t = h3_malloc(sizeof *t); /* no context here: the environment as it is now */
    if (t) h3_tuning_read(t);
    int rc = t ? h3_backend_cuda_open(0, t, &be) : -H3_E_NOMEM;
    if (rc == 0) {
        uint64_t fr = 0, tot = 0;
        be->mem->mem_info(be, &fr, &tot);
        h3_buf_printf(&b, ", \"available\": true, \"device\": ");
        h3_buf_json_str(&b, be->desc);
        h3_buf_printf(&b, ", \"compute_capability\": \"%d.%d\", \"memory_bytes\": %llu, \"free_bytes\": %llu",
                      be->compute_capability / 10, be->compute_capability % 10, (unsigned long long)tot,
                      (unsigned long long)fr);
        h3_buf_printf(&b, ", \"driver_cuda\": \"%d.%d\"", be->driver_version / 1000, be->driver_version % 1000 / 10);
        /* bf16 attention: cuDNN's (its version and library) or the own kernel (and why). */
        h3_buf_printf(&b, ", \"cudnn_attention\": %s, \"cudnn\": ", be->attn_cudnn ? "true" : "false");
        h3_buf_json_str(&b, be->attn_cudnn_info);
        /* fp8 weights (H3_PRECISION_FP8) and fp8 attention (H3_OPT_FP8_ATTENTION): what h3_init would say. */
        char why[160];
        const bool fp8 = fp8_weights_ok(be, why, sizeof why);
        h3_buf_printf(&b, ", \"fp8_weights\": %s", fp8 ? "true" : "false");
        if (!fp8) {
            h3_buf_printf(&b, ", \"fp8_weights_reason\": ");
            h3_buf_json_str(&b, why);
        }
        h3_buf_printf(&b, ", \"fp8_attention\": %s", be->attn_fp8_why[0] ? "false" : "true");
        if (be->attn_fp8_why[0]) {
            h3_buf_printf(&b, ", \"fp8_attention_reason\": ");
            h3_buf_json_str(&b, be->attn_fp8_why);
        }
        h3_backend_destroy(be);
    } else {
        h3_buf_printf(&b, ", \"available\": false, \"reason\": ");
        h3_buf_json_str(&b, h3_last_error());
        h3_err_clear();
    }
    /* Where compiled kernels are kept (H3_KERNEL_CACHE, else the user's cache folder); null: none. */
    h3_buf_printf(&b, ", \"kernel_cache\": ");
    if (t && t->kernel_cache[0])
        h3_buf_json_str(&b, t->kernel_cache);
    else
        h3_buf_printf(&b, "null");
    free(t);
    /* Metal: the GPU, its family and memory in the description; not yet run on Apple hardware
       (docs/metal.md), which the description and "verified_on_hardware" say until a recorded Mac
       run exists. */
    h3_buf_printf(&b, "}, \"metal\": {\"built\": %s", h3_backend_metal_built() ? "true" : "false");
    be = NULL;
    rc = h3_backend_metal_open(&be);
    if (rc == 0) {
        uint64_t fr = 0, tot = 0;
        be->mem->mem_info(be, &fr, &tot);
        h3_buf_printf(&b, ", \"available\": true, \"device\": ");
        h3_buf_json_str(&b, be->desc);
        h3_buf_printf(&b, ", \"memory_bytes\": %llu, \"verified_on_hardware\": false", (unsigned long long)tot);
        h3_backend_destroy(be);
    } else {
        h3_buf_printf(&b, ", \"available\": false, \"reason\": ");
        h3_buf_json_str(&b, h3_last_error());
        h3_err_clear();
    }
    h3_buf_printf(&b, "}}");
    if (b.oom || b.n >= sizeof buf) {
        h3_buf_free(&b);
        h3_err(H3_E_NOMEM, "backends: description too long");
        return NULL;
    }
    memcpy(buf, b.p, b.n + 1);
    h3_buf_free(&b);
    return buf;
}

H3_API const char *h3_memory_estimate_json(h3_ctx *ctx, int width, int height, int frames, int prompt_tokens)
{
    if (!ctx) {
        h3_err(H3_E_INVALID, "NULL context");
        return NULL;
    }
    char *js = h3_rt_memory_estimate_ex(&ctx->model, ctx->threads, ctx->flags, ctx->rt.precision, ctx->rt.vram_bytes,
                                        width, height,
                                        frames, prompt_tokens);
    if (!js) return NULL;
    free(ctx->mem_json);
    ctx->mem_json = js;
    return js;
}

/* ---- info ------------------------------------------------------------------------------ */

static void json_kv_str(h3_buf *b, const char *k, const char *v, bool comma)
{
    h3_buf_printf(b, "%s\"%s\": ", comma ? ", " : "", k);
    if (v)
        h3_buf_json_str(b, v);
    else
        h3_buf_printf(b, "null");
}

static int describe_store(h3_buf *b, const h3_store *s)
{
    uint64_t bytes[H3_DT_COUNT] = {0};
    size_t count[H3_DT_COUNT] = {0};
    for (size_t i = 0; i < s->ntensors; i++) {
        bytes[s->tensors[i].dtype] += s->tensors[i].end - s->tensors[i].begin;
        count[s->tensors[i].dtype]++;
    }
    h3_buf_printf(b, ", \"files\": %d, \"tensors\": %zu, \"bytes\": %llu, \"dtypes\": {", s->nfiles,
                  s->ntensors, (unsigned long long)s->bytes);
    bool first = true;
    for (int t = 0; t < H3_DT_COUNT; t++) {
        if (!count[t]) continue;
        h3_buf_printf(b, "%s\"%s\": {\"tensors\": %zu, \"bytes\": %llu}", first ? "" : ", ",
                      h3_dtype_name((h3_dtype)t), count[t], (unsigned long long)bytes[t]);
        first = false;
    }
    h3_buf_printf(b, "}");
    return 0;
}

/* A shared-weight Ref2VA transformer: how many of its tensors are read from FL2VA's shards. */
static void describe_shared(h3_buf *b, const h3_store *s, const char *shared_dir)
{
    size_t n = 0, len = strlen(shared_dir);
    for (size_t i = 0; i < s->ntensors; i++) {
        const char *p = s->files[s->tensors[i].file].path;
        n += strncmp(p, shared_dir, len) == 0 && p[len] == '/';
    }
    if (n) h3_buf_printf(b, ", \"tensors_shared_from_FL2VA\": %zu", n);
}

static int describe_config(h3_buf *b, h3_model *m, h3_component c)
{
    int rc;
    if (c == H3_COMP_TRANSFORMER) {
        h3_dit_cfg d;
        if ((rc = h3_dit_cfg_load(m, &d))) return rc;
        h3_buf_printf(b,
                      ", \"config\": {\"hidden_size\": %d, \"num_layers\": %d, \"token_refiner_num_layers\": %d, "
                      "\"num_attention_heads\": %d, \"attention_head_dim\": %d, \"ffn_hidden_size\": %d, "
                      "\"latents_dim\": %d, \"audio_latents_dim\": %d, \"patch_size\": [%d, %d, %d], "
                      "\"text_dim\": %d, \"timestep_input_dim\": %d, \"time_embed_hidden_size\": %d, "
                      "\"time_embed_dim\": %d, \"rope_inv_freq_len\": %d, \"rope_theta\": %g, "
                      "\"shift_video\": %g, \"shift_audio\": %g}",
                      d.hidden, d.layers, d.refiner_layers, d.heads, d.head_dim, d.ffn, d.video_ch,
                      d.audio_ch, d.patch[0], d.patch[1], d.patch[2], d.text_dim, d.freq_dim,
                      d.temb_hidden, d.temb_dim, d.rope_freq, d.rope_theta, d.shift_video, d.shift_audio);
    } else if (c == H3_COMP_TEXT_ENCODER) {
        h3_text_cfg t;
        if ((rc = h3_text_cfg_load(m, &t))) return rc;
        h3_buf_printf(b,
                      ", \"config\": {\"hidden_size\": %d, \"num_hidden_layers\": %d, \"conditioning_layer\": %d, "
                      "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                      "\"intermediate_size\": %d, \"vocab_size\": %d, \"rope_theta\": %g}",
                      t.hidden, t.layers, t.cond_layer, t.heads, t.kv_heads, t.head_dim, t.inter, t.vocab,
                      t.rope_theta);
    } else if (c == H3_COMP_VIDEO_VAE) {
        h3_vvae_cfg v;
        if ((rc = h3_vvae_cfg_load(m, &v))) return rc;
        h3_buf_printf(b,
                      ", \"config\": {\"latent_channels\": %d, \"spatial_ratio\": %d, \"temporal_ratio\": %d, "
                      "\"decoder_layers\": %d, \"decoder_heads\": %d, \"decoder_head_dim\": %d, "
                      "\"clip_length\": %d, \"token_drop\": %d, \"tile_size\": %d, \"tile_overlap\": %d}",
                      v.latent_ch, v.spatial, v.temporal, v.dec_layers, v.dec_heads, v.dec_head_dim,
                      v.clip_length, v.token_drop, v.tile_size, v.tile_overlap);
    } else if (c == H3_COMP_AUDIO_VAE) {
        h3_avae_cfg a;
        if ((rc = h3_avae_cfg_load(m, &a))) return rc;
        int hop = 1;
        for (int i = 0; i < a.n_up; i++) hop *= a.rates[i];
        h3_buf_printf(b,
                      ", \"config\": {\"latent_channels\": %d, \"latent_dim\": %d, \"decoder_dim\": %d, "
                      "\"sample_rate\": %d, \"hop\": %d, \"upsample_stages\": %d}",
                      a.latent_ch, a.latent_dim, a.decoder_dim, a.sample_rate, hop, a.n_up);
    }
    return 0;
}

H3_API int h3_model_check(h3_ctx *ctx, int require_all)
{
    if (!ctx) return h3_err(H3_E_INVALID, "NULL context");
    h3_model *m = &ctx->model;
    for (int c = 0; c < H3_COMP_COUNT; c++) {
        if (!m->comp[c].present) {
            if (require_all) return h3_model_require(m, (h3_component)c, "a text-to-video+audio render");
            continue;
        }
        int rc = c == H3_COMP_TOKENIZER ? 0 : h3_model_validate(m, (h3_component)c);
        if (rc) return rc;
    }
    return 0;
}

H3_API const char *h3_model_info_json(h3_ctx *ctx)
{
    if (!ctx) {
        h3_err(H3_E_INVALID, "NULL context");
        return NULL;
    }
    h3_model *m = &ctx->model;
    h3_buf b = {0};
    h3_buf_printf(&b, "{");
    json_kv_str(&b, "root", m->root, false);
    json_kv_str(&b, "partition", m->partition, true);
    json_kv_str(&b, "partition_dir", m->partition_dir, true);
    h3_buf_printf(&b, ", \"ref2va_present\": %s, \"components\": {", m->has_ref2va ? "true" : "false");
    int rc = 0;
    for (int c = 0; c < H3_COMP_COUNT && !rc; c++) {
        h3_comp *k = &m->comp[c];
        h3_buf_printf(&b, "%s\"%s\": {\"present\": %s", c ? ", " : "", h3_component_name((h3_component)c),
                      k->present ? "true" : "false");
        if (k->present) {
            json_kv_str(&b, "dir", k->dir, true);
            if (m->file[c]) {
                /* A single file: what h3_sf_open found (after the headers below are read). */
                rc = h3_model_headers(m, (h3_component)c);
                if (rc) break;
                json_kv_str(&b, "single_file", m->file[c], true);
                json_kv_str(&b, "single_file_format", m->sf_desc[c], true);
                h3_buf_printf(&b, ", \"single_file_owned_bytes\": %llu",
                              (unsigned long long)h3_sf_owned_bytes(&k->store));
                /* Bytes of the stored codes the transformer computes from (h3_sf_native; 0: every quantised layer widened). */
                h3_buf_printf(&b, ", \"single_file_native_codes\": %llu",
                              (unsigned long long)(h3_sf_native_on(&k->store) ? h3_sf_codes_bytes(&k->store) : 0));
            }
            /* A shared-weight Ref2VA partition: this component is FL2VA's folder. */
            if (k->shared) h3_buf_printf(&b, ", \"shared_from\": \"FL2VA\"");
            if (c == H3_COMP_TOKENIZER) {
                struct stat st;
                json_kv_str(&b, "path", k->config_path, true);
                if (stat(k->config_path, &st) == 0) h3_buf_printf(&b, ", \"bytes\": %lld", (long long)st.st_size);
            } else {
                if ((rc = h3_model_headers(m, (h3_component)c))) break;
                describe_store(&b, &k->store);
                if (c == H3_COMP_TRANSFORMER && m->shared_dir) describe_shared(&b, &k->store, m->shared_dir);
                if ((rc = describe_config(&b, m, (h3_component)c))) break;
                if ((rc = h3_model_validate(m, (h3_component)c))) break;
            }
        }
        h3_buf_printf(&b, "}");
    }
    /* The environment's knobs this context runs with (docs/environment.md); null: unset. */
    h3_buf_printf(&b, "}, \"tuning\": ");
    h3_tuning_json(&b, &ctx->rt.tuning);
    h3_buf_printf(&b, "}");
    if (rc) {
        h3_buf_free(&b);
        return NULL;
    }
    if (b.oom) {
        h3_buf_free(&b);
        h3_err(H3_E_NOMEM, "out of memory describing the model");
        return NULL;
    }
    free(ctx->info_json);
    ctx->info_json = b.p;
    return ctx->info_json;
}
