/*
 * Single-file components as tensor sources (the contract is in singlefile.h). The file's header is
 * validated as any shard's (h3_store_add_file into a private store), then every tensor is either
 * presented as it is (a view under its stripped name) or given a job that writes its presented form
 * into the owned file; the jobs run once, at the first data access (h3_store_ready).
 */
#define _GNU_SOURCE
#include "core/geometry.h"
#include "core/singlefile.h"
#include "core/tuning.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SF_PREFIX "model.diffusion_model."
#define SF_ALIGN 64

enum { JOB_PERMUTE = 1, JOB_FP8, JOB_INT8, JOB_QKV3, JOB_SWAP, JOB_ROPE, JOB_ZERO, JOB_CODES, JOB_SCALES };

typedef struct {
    size_t dst;      /* index of the presented tensor */
    size_t src;      /* the raw weight */
    long scale;      /* the raw scale tensor (fp8/int8), -1 else */
    int kind;
    bool qkv;        /* reorder [q; k; v] rows to the per-head interleaving */
    bool e5m2;
    int group;       /* int8: ConvRot group size, 0 = none */
    size_t src_k, src_v; /* JOB_QKV3 (diffusers' separate to_k / to_v) */
    bool codes;      /* writes a stored-codes tensor (JOB_CODES, JOB_SCALES) into src->qs: run only when the
                        codes are used natively (h3_sf_native) */
    bool skip;       /* an int8 layer computed from its codes: its BF16 form is not written (h3_sf_native) */
    bool fp8;        /* a codes job of an fp8 layer */
} sf_job;

struct h3_sf_source {
    h3_store raw;    /* the file itself, its own names */
    sf_job *jobs;
    size_t njobs;
    int heads;
    int rope_freq;   /* diffusers names: rope.inv_freq is computed (a non-persistent buffer there) */
    double rope_theta;
    /* The quantised layers' stored codes and per-row scales under "<name>#codes" / "<name>#scale"
       (views of the file, or jobs when the QKV rows must be reordered or one scale broadcast): a
       store of its own, so that the presented one lists, counts and estimates what it did before. */
    h3_store qs;
    bool native_codes; /* h3_sf_native: the codes jobs run */
    bool native_i8, native_fp8; /* of which formats */
    int fd;          /* the owned file */
    char *tmp_path;  /* a temporary file to unlink at the end (no memfd) */
    uint64_t owned;
    /* Filled once, by whichever thread first needs a tensor's bytes; the others wait for it. */
    pthread_mutex_t mu;
    atomic_bool filled;
    int fill_rc;
};

void h3_sf_source_free(struct h3_sf_source *src)
{
    if (!src) return;
    h3_store_close(&src->raw);
    h3_store_close(&src->qs);
    if (src->fd >= 0) close(src->fd);
    if (src->tmp_path) {
        unlink(src->tmp_path);
        free(src->tmp_path);
    }
    free(src->jobs);
    pthread_mutex_destroy(&src->mu);
    free(src);
}

/* Whether job j runs in the source's mode. */
static bool job_runs(const struct h3_sf_source *src, const sf_job *j)
{
    if (j->codes) return j->fp8 ? src->native_fp8 : src->native_i8;
    return !j->skip;
}

static uint64_t job_bytes(const struct h3_sf_source *src, const h3_store *s, const sf_job *j)
{
    const h3_tensor *t = &(j->codes ? &src->qs : s)->tensors[j->dst];
    return t->end - t->begin;
}

uint64_t h3_sf_owned_bytes(const h3_store *s)
{
    if (!s || !s->source) return 0;
    uint64_t n = 0;
    for (size_t j = 0; j < s->source->njobs; j++)
        if (job_runs(s->source, &s->source->jobs[j])) n += job_bytes(s->source, s, &s->source->jobs[j]);
    return n;
}

uint64_t h3_sf_codes_bytes(const h3_store *s)
{
    if (!s || !s->source) return 0;
    const h3_store *q = &s->source->qs;
    uint64_t n = 0;
    /* a codes tensor and its scales follow each other */
    for (size_t i = 0; i + 1 < q->ntensors; i += 2) {
        const h3_dtype d = q->tensors[i].dtype;
        if (d == H3_DT_I8 ? s->source->native_i8 : s->source->native_fp8)
            n += q->tensors[i].end - q->tensors[i].begin + q->tensors[i + 1].end - q->tensors[i + 1].begin;
    }
    return n;
}

void h3_sf_native_bytes(const h3_store *s, bool (*pred)(const char *name), uint64_t *presented, uint64_t *codes)
{
    *presented = *codes = 0;
    const struct h3_sf_source *src = s ? s->source : NULL;
    if (!src || !src->native_codes) return;
    const h3_store *q = &src->qs;
    for (size_t i = 0; i + 1 < q->ntensors; i += 2) { /* a codes tensor, then its scales */
        const h3_tensor *c = &q->tensors[i];
        if (!(c->dtype == H3_DT_I8 ? src->native_i8 : src->native_fp8)) continue;
        char name[640];
        snprintf(name, sizeof name, "%s", h3_tensor_name(q, c));
        char *hash = strrchr(name, '#');
        if (hash) *hash = 0;
        const h3_tensor *p = h3_store_find(s, name);
        if (!p || (pred && !pred(name))) continue;
        *presented += p->end - p->begin;
        *codes += c->end - c->begin + q->tensors[i + 1].end - q->tensors[i + 1].begin;
    }
}

uint64_t h3_sf_codes_of(const h3_store *s, const char *name)
{
    const struct h3_sf_source *src = s ? s->source : NULL;
    if (!src || !src->native_codes) return 0;
    char n[640];
    snprintf(n, sizeof n, "%s#codes", name);
    const h3_tensor *c = h3_store_find(&src->qs, n);
    snprintf(n, sizeof n, "%s#scale", name);
    const h3_tensor *sc = h3_store_find(&src->qs, n);
    if (!c || !sc || !(c->dtype == H3_DT_I8 ? src->native_i8 : src->native_fp8)) return 0;
    return (c->end - c->begin) + (sc->end - sc->begin);
}

bool h3_sf_native_on(const h3_store *s) { return s && s->source && s->source->native_codes; }

int h3_sf_native(h3_store *s, bool i8, bool fp8, bool (*skip_i8)(const char *name))
{
    struct h3_sf_source *src = s ? s->source : NULL;
    if (!src) return 0;
    if (src->njobs && atomic_load(&src->filled))
        return h3_err(H3_E_INVALID, "%s: the single file's tensors were already written (set its mode first)",
                      src->raw.files[0].path);
    src->native_i8 = i8 && src->qs.ntensors > 0;
    src->native_fp8 = fp8 && src->qs.ntensors > 0;
    bool any = false;
    for (size_t i = 0; i < src->qs.ntensors; i++) {
        const h3_dtype d = src->qs.tensors[i].dtype;
        any |= (d == H3_DT_I8 && src->native_i8) || ((d == H3_DT_F8_E4M3 || d == H3_DT_F8_E5M2) && src->native_fp8);
    }
    src->native_codes = any;
    for (size_t j = 0; j < src->njobs; j++) {
        sf_job *job = &src->jobs[j];
        job->skip = src->native_i8 && skip_i8 && job->kind == JOB_INT8 &&
                    skip_i8(h3_tensor_name(s, &s->tensors[job->dst]));
    }
    return 0;
}

bool h3_sf_qtensor(const h3_store *s, const char *name, const h3_tensor **codes, const h3_tensor **scale, int *group)
{
    *codes = *scale = NULL;
    *group = 0;
    const struct h3_sf_source *src = s ? s->source : NULL;
    if (!src || !src->native_i8) return false;
    char n[640];
    snprintf(n, sizeof n, "%s#codes", name);
    const h3_tensor *c = h3_store_find(&src->qs, n);
    snprintf(n, sizeof n, "%s#scale", name);
    const h3_tensor *sc = h3_store_find(&src->qs, n);
    const h3_tensor *p = h3_store_find(s, name);
    if (!c || !sc || !p || c->dtype != H3_DT_I8) return false;
    const size_t pi = (size_t)(p - s->tensors);
    for (size_t j = 0; j < src->njobs; j++)
        if (!src->jobs[j].codes && src->jobs[j].dst == pi) {
            if (!src->jobs[j].skip) return false; /* widened: the consumer reads the BF16 form */
            *group = src->jobs[j].group;
        }
    *codes = c;
    *scale = sc;
    return true;
}

int h3_sf_qweight(h3_store *s, const char *name, int64_t rows, int64_t cols, h3_sf_qw *out)
{
    memset(out, 0, sizeof *out);
    struct h3_sf_source *src = s ? s->source : NULL;
    if (!src || !src->native_codes) return 0;
    char n[640];
    snprintf(n, sizeof n, "%s#codes", name);
    const h3_tensor *t = h3_store_find(&src->qs, n);
    if (!t || !(t->dtype == H3_DT_I8 ? src->native_i8 : src->native_fp8)) return 0;
    const h3_tensor *p = h3_store_find(s, name);
    const size_t pi = p ? (size_t)(p - s->tensors) : (size_t)-1;
    out->widened = true;
    for (size_t j = 0; j < src->njobs; j++)
        if (!src->jobs[j].codes && src->jobs[j].dst == pi) {
            out->group = src->jobs[j].group;
            out->widened = !src->jobs[j].skip;
        }
    int rc = h3_store_ready(s);
    if (rc) return rc;
    const int64_t shape[2] = {rows, cols};
    out->dtype = t->dtype;
    out->q = h3_store_get(&src->qs, n, t->dtype, 2, shape);
    snprintf(n, sizeof n, "%s#scale", name);
    out->scale = out->q ? h3_store_get(&src->qs, n, H3_DT_F32, 1, shape) : NULL;
    if (!out->q || !out->scale) {
        h3_err_prefix("%s", name);
        return -H3_E_SCHEMA;
    }
    return 1;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Sidecar tensors of quantised layers: read by the jobs, never presented. */
static bool is_sidecar(const char *n)
{
    return ends_with(n, ".comfy_quant") || ends_with(n, ".weight_scale") || ends_with(n, ".input_scale") ||
           ends_with(n, ".scale_weight") || ends_with(n, ".scale_input") || ends_with(n, ".weight_scale_2") ||
           strcmp(n, "scaled_fp8") == 0 || ends_with(n, ".scaled_fp8");
}

static const char *strip(const char *n, bool prefixed)
{
    return prefixed && strncmp(n, SF_PREFIX, strlen(SF_PREFIX)) == 0 ? n + strlen(SF_PREFIX) : n;
}

/* diffusers' MiniMaxH3Transformer3DModel names -> the original ones (the inverse of diffusers' converter):
   whole prefixes first, then substrings in order. */
static const char *const DF_PREFIX[][2] = {
    {"proj_in.", "video_patch_proj."}, {"audio_proj_in.", "audio_patch_proj."},
    {"proj_out.", "final_layer.video_out."}, {"audio_proj_out.", "final_layer.audio_out."},
    {"token_refiner.refiner_blocks.", "token_refiner.blocks."}, {"transformer_blocks.", "blocks."},
};
static const char *const DF_SUB[][2] = {
    {"context_embedder.", "condition_proj."}, {"time_embedder.linear_1.", "time_embedder.proj_in."},
    {"time_embedder.linear_2.", "time_embedder.proj_out."}, {"norm_out.norm.", "final_layer.norm."},
    {"norm_out.linear.", "final_layer.adaln_proj.linear."}, {".attn.norm_q.", ".attn.q_norm."},
    {".attn.norm_k.", ".attn.k_norm."}, {".attn.to_out.0.", ".attn.out_proj."}, {".attn.to_q.", ".attn.qkv_proj."},
    {".ff.net.0.proj.", ".mlp.fc1."}, {".ff.net.2.", ".mlp.fc2."},
};

static int df_name(const char *in, char *out, size_t cap)
{
    char a[640];
    snprintf(a, sizeof a, "%s", in);
    for (size_t i = 0; i < sizeof DF_PREFIX / sizeof *DF_PREFIX; i++) {
        const size_t l = strlen(DF_PREFIX[i][0]);
        if (strncmp(in, DF_PREFIX[i][0], l) == 0) {
            snprintf(a, sizeof a, "%s%s", DF_PREFIX[i][1], in + l);
            break;
        }
    }
    for (size_t i = 0; i < sizeof DF_SUB / sizeof *DF_SUB; i++) {
        const char *hit = strstr(a, DF_SUB[i][0]);
        if (!hit) continue;
        char b[640];
        snprintf(b, sizeof b, "%.*s%s%s", (int)(hit - a), a, DF_SUB[i][1], hit + strlen(DF_SUB[i][0]));
        snprintf(a, sizeof a, "%s", b);
    }
    if (strlen(a) + 1 > cap || strlen(a) + 1 >= sizeof a) return -1;
    memcpy(out, a, strlen(a) + 1);
    return 0;
}

/* diffusers' AutoencoderKLMiniMaxH3 names -> the official video VAE's (video_vae/source). */
static const char *const DV_SUB[][2] = {
    {".attn.to_q.", ".attn.to_qkv."}, {".attn.to_out.0.", ".attn.to_out."},
    {".ff.net.0.proj.", ".ff.w1."}, {".ff.net.2.", ".ff.w2."},
};

static int dv_name(const char *in, char *out, size_t cap)
{
    int level, block, used = 0;
    char a[640];
    if (sscanf(in, "encoder.down_blocks.%d.resnets.%d.%n", &level, &block, &used) == 2 && used > 0) {
        const char *rest = in + used;
        const bool sc = strncmp(rest, "conv_shortcut.", 14) == 0;
        snprintf(a, sizeof a, "encoder.down.%d.block.%d.%s%s", level, block, sc ? "nin_shortcut." : "",
                 sc ? rest + 14 : rest);
    } else if (used = 0, sscanf(in, "encoder.down_blocks.%d.downsamplers.0.%n", &level, &used) == 1 && used > 0) {
        snprintf(a, sizeof a, "encoder.down.%d.downsample.%s", level, in + used);
    } else if (strncmp(in, "decoder.proj_in.", 16) == 0) {
        snprintf(a, sizeof a, "decoder.x_embedder.%s", in + 16);
    } else {
        snprintf(a, sizeof a, "%s", in);
        for (size_t i = 0; i < sizeof DV_SUB / sizeof *DV_SUB; i++) {
            const char *hit = strstr(a, DV_SUB[i][0]);
            if (!hit) continue;
            char b[640];
            snprintf(b, sizeof b, "%.*s%s%s", (int)(hit - a), a, DV_SUB[i][1], hit + strlen(DV_SUB[i][0]));
            snprintf(a, sizeof a, "%s", b);
        }
    }
    if (strlen(a) + 1 > cap || strlen(a) + 1 >= sizeof a) return -1;
    memcpy(out, a, strlen(a) + 1);
    return 0;
}

/* The raw tensor `base` + `suffix` (base: a raw name without ".weight"). */
static long raw_find(const h3_store *raw, const char *base, const char *suffix)
{
    char n[640];
    snprintf(n, sizeof n, "%s%s", base, suffix);
    const h3_tensor *t = h3_store_find(raw, n);
    return t ? (long)(t - raw->tensors) : -1;
}

static uint64_t numel(const h3_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

/* The layer's quantisation spec: {"format": ..., "convrot": ..., "convrot_groupsize": ...} from the
   layer's comfy_quant tensor or the file's _quantization_metadata. fmt gets the format ("" if none). */
static int layer_spec(h3_store *raw, const h3_json *meta, const char *base, char *fmt, size_t cap, int *group,
                      const char *path)
{
    fmt[0] = 0;
    *group = 0;
    h3_json doc;
    bool have = false;
    long qi = raw_find(raw, base, ".comfy_quant");
    if (qi >= 0) {
        const h3_tensor *t = &raw->tensors[qi];
        const int64_t len = (int64_t)numel(t);
        const uint8_t *b = t->dtype == H3_DT_U8 && t->ndim == 1 ? h3_store_get(raw, h3_tensor_name(raw, t), H3_DT_U8, 1, &len)
                                                                  : NULL;
        if (!b) return h3_err(H3_E_FORMAT, "%s: %s.comfy_quant is not a U8 vector of JSON", path, base);
        if (h3_json_parse(&doc, (const char *)b, (size_t)len)) {
            h3_err_prefix("%s: %s.comfy_quant", path, base);
            return -H3_E_FORMAT;
        }
        have = true;
    }
    const h3j *obj = have ? h3j_root(&doc) : NULL;
    if (!have && meta) {
        const h3j *layers = h3j_get(meta, h3j_root(meta), "layers");
        obj = h3j_get(meta, layers, base);
    }
    const h3_json *d = have ? &doc : meta;
    if (obj && obj->type == H3J_OBJ) {
        const h3j *f = h3j_get(d, obj, "format");
        if (f && f->type == H3J_STR) snprintf(fmt, cap, "%s", h3j_str(d, f));
        const h3j *cr = h3j_get(d, obj, "convrot");
        const h3j *gs = h3j_get(d, obj, "convrot_groupsize");
        if (cr && cr->type == H3J_TRUE) *group = gs && gs->type == H3J_NUM && gs->is_int ? (int)gs->i : 256;
    }
    if (have) h3_json_free(&doc);
    return 0;
}

/* What a raw name says about the file, for refusing what is not a model component. */
static int identify(const h3_store *raw, h3_component comp, bool prefixed, const char *path)
{
    for (size_t i = 0; i < raw->ntensors; i++) {
        const char *n = h3_tensor_name(raw, &raw->tensors[i]);
        if (strstr(n, "lora_A.") || strstr(n, "lora_B.") || strstr(n, "lora_down.") || strstr(n, "lora_up.") ||
            strstr(n, ".lora."))
            return h3_err(H3_E_INVALID, "%s: this is a LoRA (tensor '%s'), not a model: give it with --lora", path, n);
    }
#define HAS(name) (h3_store_find(raw, prefixed ? SF_PREFIX name : name) != NULL)
    switch (comp) {
    case H3_COMP_TRANSFORMER:
        if (HAS("transformer_blocks.0.attn.to_q.weight") && HAS("context_embedder.weight") &&
            HAS("audio_proj_in.weight"))
            return 1; /* diffusers' names */
        if (HAS("transformer_blocks.0.attn.to_q.weight"))
            return h3_err(H3_E_INVALID, "%s: diffusers' transformer names but no context_embedder / audio_proj_in: "
                          "not a whole MiniMax-H3 transformer", path);
        if (!HAS("blocks.0.attn.qkv_proj.weight") || !HAS("condition_proj.weight") || !HAS("audio_patch_proj.weight"))
            break;
        return 0;
    case H3_COMP_TEXT_ENCODER:
        if (!HAS("model.language_model.embed_tokens.weight")) break;
        return 0;
    case H3_COMP_VIDEO_VAE:
        if (HAS("encoder.down_blocks.0.resnets.0.conv1.weight") || HAS("decoder.transformer_blocks.0.attn.to_q.weight"))
            return 1; /* diffusers' names */
        if (!HAS("decoder.conv_in.weight") && !HAS("decoder.proj_in.weight") && !HAS("encoder.conv_in.weight")) break;
        return 0;
    case H3_COMP_AUDIO_VAE:
        if (!HAS("decoder.model.0.weight_v") && !HAS("decoder.model.0.weight") && !HAS("encoder.block.0.weight_v") &&
            !HAS("decoder.model.0.conv.weight"))
            break;
        return 0;
    default:
        break;
    }
#undef HAS
    const char *first = raw->ntensors ? h3_tensor_name(raw, &raw->tensors[0]) : "(none)";
    static const char *const what[H3_COMP_COUNT] = {"transformer", "text encoder", "tokenizer", "video VAE",
                                                    "audio VAE"};
    return h3_err(H3_E_INVALID, "%s: not a MiniMax-H3 %s file (its first tensor is '%s')", path,
                  (unsigned)comp < H3_COMP_COUNT ? what[comp] : "model", first);
}

/* The presented form of raw tensor i: a view, or a job (appended to src->jobs). */
/* Append a job whose output is v (placed in the owned file) and present v as `name`. */
static int push_job(h3_store *s, struct h3_sf_source *src, sf_job job, h3_tensor v, const char *name, const char *path)
{
    const uint64_t bytes = numel(&v) * h3_dtype_size(v.dtype);
    v.file = 1;
    v.begin = src->owned;
    v.end = src->owned + bytes;
    src->owned += (bytes + SF_ALIGN - 1) / SF_ALIGN * SF_ALIGN;
    job.dst = s->ntensors;
    sf_job *nj = h3_realloc(src->jobs, (src->njobs + 1) * sizeof *nj);
    if (!nj) return -H3_E_NOMEM;
    src->jobs = nj;
    src->jobs[src->njobs++] = job;
    return h3_store_push(s, name, &v, path);
}

static bool is_float(h3_dtype d) { return d == H3_DT_F32 || d == H3_DT_BF16 || d == H3_DT_F16; }

/* Raw tensor i of a transformer under diffusers' names: renamed; to_q/to_k/to_v fused into the per-head
   interleaved qkv_proj; ff.net.0.proj ([value; gate]) presented as mlp.fc1 ([gate; value]). */
static int present_diffusers(h3_store *s, struct h3_sf_source *src, size_t i, bool vae, const char *path,
                             int counts[4])
{
    h3_store *raw = &src->raw;
    const h3_tensor *t = &raw->tensors[i];
    const char *rname = h3_tensor_name(raw, t);
    if (strstr(rname, ".attn.to_k.") || strstr(rname, ".attn.to_v.")) return 0; /* read by the to_q job */
    if (!is_float(t->dtype))
        return h3_err(H3_E_UNSUPPORTED, "%s: tensor '%s' is %s; libh3 reads diffusers' transformer in F32, BF16 or "
                      "F16 only", path, rname, h3_dtype_name(t->dtype));
    char name[640];
    if ((vae ? dv_name : df_name)(rname, name, sizeof name)) return h3_err(H3_E_FORMAT, "%s: tensor name too long: '%s'", path, rname);
    h3_tensor v = *t;
    v.file = 0;
    sf_job job = {.src = i, .scale = -1};
    if (strstr(rname, ".attn.to_q.")) {
        char kn[640], vn[640];
        const char *at = strstr(rname, ".attn.to_q.");
        snprintf(kn, sizeof kn, "%.*s.attn.to_k.%s", (int)(at - rname), rname, at + strlen(".attn.to_q."));
        snprintf(vn, sizeof vn, "%.*s.attn.to_v.%s", (int)(at - rname), rname, at + strlen(".attn.to_q."));
        const h3_tensor *k = h3_store_find(raw, kn), *vv = h3_store_find(raw, vn);
        if (!k || !vv || k->dtype != t->dtype || vv->dtype != t->dtype || k->ndim != t->ndim || vv->ndim != t->ndim ||
            numel(k) != numel(t) || numel(vv) != numel(t))
            return h3_err(H3_E_SCHEMA, "%s: '%s' needs '%s' and '%s' of its dtype and shape", path, rname, kn, vn);
        if (src->heads <= 0 || t->shape[0] % src->heads)
            return h3_err(H3_E_SCHEMA, "%s: '%s' has %lld rows, not %d heads x head_dim", path, rname,
                          (long long)t->shape[0], src->heads);
        job.kind = JOB_QKV3;
        job.qkv = true;
        job.src_k = (size_t)(k - raw->tensors);
        job.src_v = (size_t)(vv - raw->tensors);
        v.shape[0] = 3 * t->shape[0];
        counts[0]++;
        return push_job(s, src, job, v, name, path);
    }
    if (strstr(rname, ".ff.net.0.proj.")) {
        if (t->ndim < 1 || t->shape[0] % 2)
            return h3_err(H3_E_SCHEMA, "%s: '%s' has an odd number of rows (expected [value; gate])", path, rname);
        job.kind = JOB_SWAP;
        return push_job(s, src, job, v, name, path);
    }
    return h3_store_push(s, name, &v, path);
}

/* The stored codes of quantised layer `name` (raw tensor i, scales raw tensor sc) in src->qs:
   "<name>#codes" [N, K] (a view; the QKV rows reordered by a job) and "<name>#scale" F32 [N] (a
   view of [N] / [N, 1] scales; a job for a broadcast single scale or reordered rows). */
static int present_codes(struct h3_sf_source *src, const h3_tensor *t, size_t i, long sc, const char *name, bool qkv,
                         const char *path)
{
    h3_store *raw = &src->raw, *q = &src->qs;
    char n[640];
    snprintf(n, sizeof n, "%s#codes", name);
    h3_tensor v = *t;
    v.file = 0;
    int rc;
    const bool fp8 = t->dtype != H3_DT_I8;
    if (qkv) rc = push_job(q, src, (sf_job){.kind = JOB_CODES, .src = i, .scale = -1, .qkv = true, .codes = true, .fp8 = fp8},
                           v, n, path);
    else rc = h3_store_push(q, n, &v, path);
    if (rc) return rc;
    const h3_tensor *st = &raw->tensors[sc];
    h3_tensor w = *st;
    w.file = 0;
    w.ndim = 1;
    w.shape[0] = t->shape[0];
    w.dtype = H3_DT_F32;
    snprintf(n, sizeof n, "%s#scale", name);
    if (qkv || numel(st) != (uint64_t)t->shape[0])
        return push_job(q, src,
                        (sf_job){.kind = JOB_SCALES, .src = (size_t)sc, .scale = -1, .qkv = qkv, .codes = true, .fp8 = fp8},
                        w, n, path);
    return h3_store_push(q, n, &w, path);
}

static int present(h3_store *s, struct h3_sf_source *src, const h3_json *meta, size_t i, bool prefixed,
                   bool legacy_fp8, const char *path, int counts[4])
{
    h3_store *raw = &src->raw;
    const h3_tensor *t = &raw->tensors[i];
    const char *rname = h3_tensor_name(raw, t);
    if (is_sidecar(rname)) return 0;
    const char *name = strip(rname, prefixed);
    if (strcmp(name, "adaln_t_table") == 0) name = "time_embedder.table";
    const bool qkv = ends_with(name, ".attn.qkv_proj.weight");
    h3_tensor v = *t;
    v.file = 0;
    sf_job job = {.src = i, .scale = -1, .qkv = qkv};
    if (t->dtype == H3_DT_F8_E4M3 || t->dtype == H3_DT_F8_E5M2 || t->dtype == H3_DT_I8) {
        if (!ends_with(rname, ".weight") || t->ndim != 2)
            return h3_err(H3_E_UNSUPPORTED, "%s: tensor '%s' is %s but not a 2-D layer weight (unknown variant)",
                          path, rname, h3_dtype_name(t->dtype));
        char base[512], fmt[64];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(rname) - strlen(".weight")), rname);
        int group = 0, rc = layer_spec(raw, meta, base, fmt, sizeof fmt, &group, path);
        if (rc) return rc;
        long sc = raw_find(raw, base, ".weight_scale");
        if (sc < 0) sc = raw_find(raw, base, ".scale_weight");
        if (!fmt[0] && legacy_fp8 && t->dtype != H3_DT_I8) snprintf(fmt, sizeof fmt, "float8_e4m3fn");
        const int64_t N = t->shape[0], K = t->shape[1];
        if (strstr(fmt, "nvfp4") || strstr(fmt, "mxfp") || strstr(fmt, "w4a"))
            return h3_err(H3_E_UNSUPPORTED, "%s: layer '%s' is %s, which libh3 does not read (use the bf16 or "
                          "int8_convrot file)", path, base, fmt);
        if (sc < 0 || raw->tensors[sc].dtype != H3_DT_F32)
            return h3_err(H3_E_FORMAT, "%s: quantised layer '%s' (%s) has no F32 weight_scale", path, base,
                          h3_dtype_name(t->dtype));
        const uint64_t ns = numel(&raw->tensors[sc]);
        if (t->dtype == H3_DT_I8) {
            if (strcmp(fmt, "int8_tensorwise") != 0 && strcmp(fmt, "int8") != 0)
                return h3_err(H3_E_UNSUPPORTED, "%s: layer '%s' is I8 with format '%s' (known: int8_tensorwise, "
                              "with or without convrot)", path, base, fmt[0] ? fmt : "none given");
            if (ns != 1 && ns != (uint64_t)N)
                return h3_err(H3_E_FORMAT, "%s: layer '%s' has %llu scales for %lld rows", path, base,
                              (unsigned long long)ns, (long long)N);
            bool pow4 = group > 0;
            for (int g = group; g > 1 && pow4; g /= 4) pow4 = g % 4 == 0;
            if (group && (!pow4 || K % group))
                return h3_err(H3_E_FORMAT, "%s: layer '%s': convrot group size %d is not a power of 4 dividing %lld",
                              path, base, group, (long long)K);
            job.kind = JOB_INT8;
            job.group = group;
            counts[2]++;
            counts[3] += group > 0;
        } else {
            if (strncmp(fmt, "float8_e4m3", 11) != 0 && strncmp(fmt, "float8_e5m2", 11) != 0)
                return h3_err(H3_E_UNSUPPORTED, "%s: layer '%s' is %s with format '%s' (known: float8_e4m3fn)",
                              path, base, h3_dtype_name(t->dtype), fmt[0] ? fmt : "none given");
            if (ns != 1)
                return h3_err(H3_E_FORMAT, "%s: fp8 layer '%s' has %llu scales (one per tensor expected)", path,
                              base, (unsigned long long)ns);
            job.kind = JOB_FP8;
            job.e5m2 = t->dtype == H3_DT_F8_E5M2;
            counts[1]++;
        }
        job.scale = sc;
        v.dtype = H3_DT_BF16;
        if ((rc = present_codes(src, t, i, sc, name, qkv, path))) return rc;
    } else if (qkv) {
        job.kind = JOB_PERMUTE;
    }
    if (qkv) {
        counts[0]++;
        if (src->heads <= 0 || t->ndim != 2 || t->shape[0] % (3 * src->heads))
            return h3_err(H3_E_SCHEMA, "%s: '%s' has %lld rows, not 3 x %d heads x head_dim", path, rname,
                          (long long)t->shape[0], src->heads);
    }
    if (job.kind) return push_job(s, src, job, v, name, path);
    return h3_store_push(s, name, &v, path);
}

static int owned_file(struct h3_sf_source *src)
{
#if defined(__linux__) && defined(MFD_CLOEXEC)
    src->fd = memfd_create("h3-single-file", MFD_CLOEXEC);
    if (src->fd >= 0) return 0;
#endif
    src->tmp_path = h3_asprintf("%s/h3-single-file-XXXXXX", h3_env_tmpdir());
    if (!src->tmp_path) return -H3_E_NOMEM;
    src->fd = mkstemp(src->tmp_path);
    if (src->fd < 0) return h3_err(H3_E_IO, "%s: cannot create the owned file: %s", src->tmp_path, strerror(errno));
    return 0;
}

int h3_sf_open(h3_store *s, const char *path, h3_component comp, int heads, char *desc, size_t cap)
{
    return h3_sf_open_rope(s, path, comp, heads, 0, 0.0, desc, cap);
}

int h3_sf_open_rope(h3_store *s, const char *path, h3_component comp, int heads, int rope_freq, double rope_theta,
                    char *desc, size_t cap)
{
    memset(s, 0, sizeof *s);
    if (desc && cap) desc[0] = 0;
    struct h3_sf_source *src = h3_calloc(1, sizeof *src);
    if (!src) return -H3_E_NOMEM;
    src->fd = -1;
    src->heads = heads;
    src->rope_freq = rope_freq;
    src->rope_theta = rope_theta;
    pthread_mutex_init(&src->mu, NULL);
    int rc = h3_store_add_file(&src->raw, path);
    h3_json meta;
    bool meta_loaded = false;
    if (!rc) {
        /* The header once more for __metadata__ (the store keeps none of it). */
        char *hdr = NULL;
        uint64_t hlen = 0, fsize = 0;
        rc = h3_st_read_header(path, &hdr, &hlen, &fsize);
        h3_json doc;
        if (!rc && h3_json_parse(&doc, hdr, (size_t)hlen) == 0) {
            const h3j *m = h3j_get(&doc, h3j_root(&doc), "__metadata__");
            const h3j *q = h3j_get(&doc, m, "_quantization_metadata");
            if (q && q->type == H3J_STR) {
                const char *txt = h3j_str(&doc, q);
                if (h3_json_parse(&meta, txt, strlen(txt)) == 0) meta_loaded = true;
                else rc = h3_err(H3_E_FORMAT, "%s: __metadata__._quantization_metadata is not JSON", path);
            }
            h3_json_free(&doc);
        }
        free(hdr);
    }
    h3_store *raw = &src->raw;
    bool prefixed = false;
    for (size_t i = 0; !rc && i < raw->ntensors && !prefixed; i++)
        prefixed = strncmp(h3_tensor_name(raw, &raw->tensors[i]), SF_PREFIX, strlen(SF_PREFIX)) == 0;
    bool dif = false;
    if (!rc) {
        rc = identify(raw, comp, prefixed, path);
        dif = rc == 1;
        if (dif) rc = prefixed ? h3_err(H3_E_INVALID, "%s: diffusers' names under a model.diffusion_model. prefix "
                                        "(unknown layout)", path) : 0;
    }
    const bool legacy = !rc && (h3_store_find(raw, "scaled_fp8") || h3_store_find(raw, SF_PREFIX "scaled_fp8"));
    /* files[0]: the file itself (views); files[1]: the owned file, filled later. */
    if (!rc && !(s->files = h3_calloc(2, sizeof *s->files))) rc = -H3_E_NOMEM;
    if (!rc) {
        s->files[0] = raw->files[0];
        s->files[0].path = h3_strdup(raw->files[0].path);
        s->files[0].fd = -1;
        s->files[0].map = NULL;
        s->nfiles = 1;
        if (!s->files[0].path) rc = -H3_E_NOMEM;
    }
    int counts[4] = {0};
    for (size_t i = 0; !rc && i < raw->ntensors; i++)
        rc = dif ? present_diffusers(s, src, i, comp == H3_COMP_VIDEO_VAE, path, counts)
                 : present(s, src, meta_loaded ? &meta : NULL, i, prefixed, legacy, path, counts);
    const h3_tensor *reg = dif && comp == H3_COMP_VIDEO_VAE && !rc ? h3_store_find(s, "decoder.register_tokens") : NULL;
    if (reg && reg->ndim >= 1 && !h3_store_find(s, "decoder.mask_token")) {
        /* The official file holds a zero mask token diffusers does not keep (unused by decoding). */
        h3_tensor v = {.dtype = reg->dtype, .ndim = 3, .shape = {1, 1, reg->shape[reg->ndim - 1]}};
        rc = push_job(s, src, (sf_job){.kind = JOB_ZERO, .scale = -1}, v, "decoder.mask_token", path);
    }
    if (!rc && dif && comp == H3_COMP_TRANSFORMER && rope_freq > 0 && !h3_store_find(s, "rope.inv_freq")) {
        h3_tensor v = {.dtype = H3_DT_F32, .ndim = 1, .shape = {rope_freq}};
        rc = push_job(s, src, (sf_job){.kind = JOB_ROPE, .scale = -1}, v, "rope.inv_freq", path);
    }
    if (meta_loaded) h3_json_free(&meta);
    if (!rc && src->njobs) {
        rc = owned_file(src);
        if (!rc) {
            h3_st_file *f = &s->files[1];
            memset(f, 0, sizeof *f);
            f->path = src->tmp_path ? h3_strdup(src->tmp_path) : h3_asprintf("/proc/self/fd/%d", src->fd);
            f->size = src->owned;
            f->fd = -1;
            s->nfiles = 2;
            if (!f->path) rc = -H3_E_NOMEM;
        }
    }
    if (!rc && src->qs.ntensors) { /* the codes' store reads the same two files */
        if (!(src->qs.files = h3_calloc((size_t)s->nfiles, sizeof *src->qs.files))) rc = -H3_E_NOMEM;
        for (int f = 0; !rc && f < s->nfiles; f++) {
            src->qs.files[f] = s->files[f];
            src->qs.files[f].fd = -1;
            src->qs.files[f].map = NULL;
            if (!(src->qs.files[f].path = h3_strdup(s->files[f].path))) rc = -H3_E_NOMEM;
            src->qs.nfiles = f + 1;
        }
    }
    /* The raw store's mapping is only needed while the jobs run. */
    h3_store_release(raw);
    if (rc) {
        h3_store_close(s);
        h3_sf_source_free(src);
        return rc;
    }
    s->source = src;
    atomic_store(&src->filled, src->njobs == 0);
    if (desc && cap) {
        uint64_t by[H3_DT_COUNT] = {0};
        for (size_t i = 0; i < raw->ntensors; i++) by[raw->tensors[i].dtype] += raw->tensors[i].end - raw->tensors[i].begin;
        const h3_tensor *tab = h3_store_find(s, "time_embedder.table");
        char pruned[96] = "";
        if (tab && tab->ndim == 2)
            snprintf(pruned, sizeof pruned, ", pruned (AdaLN curve table %lld x %lld: the basis width replaces "
                     "time_embed_dim)", (long long)tab->shape[0], (long long)tab->shape[1]);
        size_t n = (size_t)snprintf(desc, cap, "single file (%s names%s); variant: %s%s%s%s",
                                    dif ? "diffusers'" : prefixed ? "model.diffusion_model." : "bare", "",
                                    counts[3] ? "int8_convrot" : counts[2] ? "int8" : counts[1] ? "fp8_scaled" : "bf16",
                                    pruned,
                                    counts[0] ? ", QKV [q;k;v]" : "", legacy ? ", legacy scaled_fp8" : "");
        for (int d = 0; d < H3_DT_COUNT && n < cap; d++)
            if (by[d]) n += (size_t)snprintf(desc + n, cap - n, "%s %s %.1f MB", d == 0 || n == 0 ? ";" : ";",
                                             h3_dtype_name((h3_dtype)d), (double)by[d] / 1e6);
        if (n < cap)
            snprintf(desc + n, cap - n, "; %d fp8 + %d int8 layers dequantised to BF16, %d QKV reordered (%.1f MB owned)",
                     counts[1], counts[2], counts[0], (double)src->owned / 1e6);
    }
    return 0;
}

/* Run every job into the owned file. */
/* Run the jobs of the source's mode into the owned file, or (skipped) only the int8 layers h3_sf_native left out. */
static int fill_jobs(h3_store *s, bool skipped)
{
    struct h3_sf_source *src = s->source;
    h3_store *raw = &src->raw;
    if (!skipped && ftruncate(src->fd, (off_t)src->owned) != 0)
        return h3_err(H3_E_NOMEM, "%s: cannot size the owned file for its transformed tensors (%llu bytes): %s",
                      raw->files[0].path, (unsigned long long)src->owned, strerror(errno));
    uint8_t *out = mmap(NULL, (size_t)src->owned, PROT_READ | PROT_WRITE, MAP_SHARED, src->fd, 0);
    if (out == MAP_FAILED)
        return h3_err(H3_E_NOMEM, "%s: cannot map the owned file (%llu bytes): %s", raw->files[0].path,
                      (unsigned long long)src->owned, strerror(errno));
    int rc = 0;
    uint8_t *tmp = NULL;
    size_t tmp_cap = 0;
    for (size_t j = 0; !rc && j < src->njobs; j++) {
        const sf_job *job = &src->jobs[j];
        const h3_tensor *rt = &raw->tensors[job->src], *dt = &(job->codes ? &src->qs : s)->tensors[job->dst];
        if (job->kind == JOB_ZERO || (skipped ? !job->skip : !job_runs(src, job)))
            continue; /* the owned file starts zeroed (ftruncate) */
        if (job->kind == JOB_ROPE) {
            /* diffusers' buffer: 1 / theta ** (arange(0, 2F, 2) / 2F), each step a float32 operation. */
            float *f = (float *)(out + dt->begin);
            const int F = (int)dt->shape[0];
            for (int i = 0; i < F; i++) f[i] = 1.0f / powf((float)src->rope_theta, (float)(2 * i) / (float)(2 * F));
            continue;
        }
        const void *in = h3_store_get(raw, h3_tensor_name(raw, rt), rt->dtype, rt->ndim, rt->shape);
        const float *sc = NULL;
        if (in && job->scale >= 0) {
            const h3_tensor *st = &raw->tensors[job->scale];
            sc = h3_store_get(raw, h3_tensor_name(raw, st), H3_DT_F32, st->ndim, st->shape);
        }
        if (!in || (job->scale >= 0 && !sc)) {
            rc = -H3_E_IO;
            break;
        }
        const int64_t N = dt->shape[0], K = dt->ndim > 1 ? (int64_t)(numel(dt) / (uint64_t)N) : 1;
        const size_t es = h3_dtype_size(dt->dtype), bytes = (size_t)(dt->end - dt->begin);
        uint8_t *dst = out + dt->begin, *stage = dst;
        if (job->qkv && job->kind != JOB_PERMUTE && job->kind != JOB_CODES) { /* dequantise into a scratch, then reorder */
            if (bytes > tmp_cap) {
                free(tmp);
                tmp_cap = bytes;
                if (!(tmp = h3_malloc(tmp_cap))) {
                    rc = -H3_E_NOMEM;
                    break;
                }
            }
            stage = tmp;
        }
        if (job->kind == JOB_QKV3) { /* [q; k; v] from the three tensors, then the reorder below */
            const size_t part = bytes / 3;
            const h3_tensor *kt = &raw->tensors[job->src_k], *vt = &raw->tensors[job->src_v];
            const void *kin = h3_store_get(raw, h3_tensor_name(raw, kt), kt->dtype, kt->ndim, kt->shape);
            const void *vin = h3_store_get(raw, h3_tensor_name(raw, vt), vt->dtype, vt->ndim, vt->shape);
            if (!kin || !vin) {
                rc = -H3_E_IO;
                break;
            }
            memcpy(stage, in, part);
            memcpy(stage + part, kin, part);
            memcpy(stage + 2 * part, vin, part);
        } else if (job->kind == JOB_SWAP) { /* [value; gate] -> [gate; value] */
            memcpy(dst, (const uint8_t *)in + bytes / 2, bytes / 2);
            memcpy(dst + bytes / 2, in, bytes / 2);
        } else if (job->kind == JOB_FP8)
            h3_deq_fp8(in, job->e5m2, sc[0], N, K, (uint16_t *)stage);
        else if (job->kind == JOB_INT8)
            h3_deq_int8(in, sc, (int64_t)numel(&raw->tensors[job->scale]), job->group, N, K, (uint16_t *)stage);
        else if (job->kind == JOB_SCALES) { /* one scale per row: broadcast, or copied to be reordered */
            const float *f = in;
            const bool one = numel(rt) == 1;
            for (int64_t r = 0; r < N; r++) ((float *)stage)[r] = f[one ? 0 : r];
        } else
            stage = (uint8_t *)in;
        if (job->qkv) {
            /* [q_all; k_all; v_all] -> libh3's per-head order, D contiguous rows at a time. */
            const int64_t A = N / 3, D = A / src->heads;
            const size_t row = (size_t)K * es;
            for (int64_t r0 = 0; r0 < N; r0 += D)
                memcpy(dst + (size_t)h3_qkv_interleaved_row(r0, src->heads, D) * row, stage + (size_t)r0 * row,
                       (size_t)D * row);
        }
    }
    free(tmp);
    if (munmap(out, (size_t)src->owned) != 0 && !rc) rc = h3_err(H3_E_IO, "cannot unmap the owned file");
    h3_store_release(raw);
    return rc;
}

static int fill(h3_store *s) { return fill_jobs(s, false); }

int h3_sf_widen(h3_store *s)
{
    struct h3_sf_source *src = s ? s->source : NULL;
    if (!src) return 0;
    int rc = h3_store_ready(s);
    if (rc) return rc;
    pthread_mutex_lock(&src->mu);
    bool any = false;
    for (size_t j = 0; j < src->njobs; j++) any |= src->jobs[j].skip;
    if (any && !(rc = fill_jobs(s, true)))
        for (size_t j = 0; j < src->njobs; j++) src->jobs[j].skip = false;
    pthread_mutex_unlock(&src->mu);
    return rc;
}

int h3_store_ready(const h3_store *cs)
{
    struct h3_sf_source *src = cs->source;
    if (!src) return 0;
    if (atomic_load_explicit(&src->filled, memory_order_acquire))
        return src->fill_rc ? h3_err(-src->fill_rc, "%s: its transformed tensors could not be written (see the first "
                                     "error)", src->raw.files[0].path)
                            : 0;
    pthread_mutex_lock(&src->mu);
    int rc = 0;
    if (!atomic_load_explicit(&src->filled, memory_order_relaxed)) {
        rc = src->fill_rc = fill((h3_store *)cs);
        atomic_store_explicit(&src->filled, true, memory_order_release);
    } else {
        rc = src->fill_rc;
    }
    pthread_mutex_unlock(&src->mu);
    return rc;
}
