/* LoRA files for the transformer: key names, checks against the model, and the merge (lora.h). */
#include "models/lora.h"
#include "core/geometry.h"

#include "core/schedule.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How a LoRA's output rows land on the released weight's rows. */
typedef enum {
    MAP_IDENTITY,
    MAP_QKV_STACKED, /* [q_all; k_all; v_all] -> per-head [q k v] */
    MAP_QKV_Q,       /* diffusers to_q / to_k / to_v: one part of every head */
    MAP_QKV_K,
    MAP_QKV_V,
    MAP_SWAP_HALVES /* diffusers ff.net.0.proj [up; gate] -> fc1 [gate; up] */
} row_map;

/* What an entry does to its target. */
typedef enum {
    KIND_LOW_RANK, /* += scale * B A */
    KIND_DIFF,     /* += scale * D (a whole-parameter delta: FastVideo's .diff / .diff_b) */
    KIND_SET       /* = D (.set_weight / .set_bias), applied before any delta */
} entry_kind;

typedef struct {
    char *target;         /* released tensor name, "blocks.3.attn.qkv_proj.weight" */
    entry_kind kind;      /* KIND_DIFF / KIND_SET: b_name is the whole tensor, a_name NULL */
    bool vector;          /* a 1-D target (a bias) */
    int file;             /* index of the LoRA file */
    char *a_name, *b_name;/* tensor names inside that file */
    int64_t rank, out_rows, cols;
    float scale;
    row_map map;
} lora_entry;

/* A PDD head bank (alibaba-pai Acc LoRAs): n interval heads per modality on the grid
   shift(linspace(1, 0, n + 1)) at shift 12 (video) / 3 (audio). */
typedef struct {
    int file, n;
    char *w[2], *b[2]; /* [0] video, [1] audio: tensor names */
    int64_t rows[2], cols;
} pdd_bank;

struct h3_lora {
    h3_store *files;
    char **paths;
    int n_files;
    lora_entry *e;
    int n;
    int heads, head_dim;
    int64_t video_rows, audio_rows, hidden;
    pdd_bank pdd;
    char schedule[64]; /* a declared schedule ("" = none) */
};

/* One module of one file while the keys are gathered. */
typedef struct {
    char *module; /* key without prefix and suffix */
    bool diffusers_names, interleaved;
    char *a, *b;  /* key names of the down/up halves */
    const char *alpha; /* key of the ".alpha" scalar */
    /* whole-parameter parts: [0] .diff, [1] .diff_b, [2] .set_weight, [3] .set_bias */
    const char *whole[4];
} pending;

/* ".lora_down" / ".lora_up" without ".weight": the PDD files' own spelling. */
static const char *const SUFFIX_A[] = {".lora_A.weight", ".lora_down.weight", ".lora_A.default.weight", ".lora_down"};
static const char *const SUFFIX_B[] = {".lora_B.weight", ".lora_up.weight", ".lora_B.default.weight", ".lora_up"};
static const char *const SUFFIX_WHOLE[] = {".diff", ".diff_b", ".set_weight", ".set_bias"};
/* The PDD bank's keys (diffusers names of the two output heads). */
static const char *const PDD_KEYS[4] = {"proj_out.weight", "proj_out.bias", "audio_proj_out.weight",
                                        "audio_proj_out.bias"};

static bool ends_with(const char *s, const char *suf, size_t *cut)
{
    size_t n = strlen(s), k = strlen(suf);
    if (n <= k || strcmp(s + n - k, suf) != 0) return false;
    *cut = n - k;
    return true;
}

/* "<prefix><N>.<rest>" -> N and rest; false when `s` is not of that form. */
static bool block_of(const char *s, const char *prefix, long *idx, const char **rest)
{
    size_t k = strlen(prefix);
    if (strncmp(s, prefix, k) != 0 || s[k] < '0' || s[k] > '9') return false;
    char *end;
    errno = 0;
    long v = strtol(s + k, &end, 10);
    if (errno || *end != '.' || v < 0 || v > 100000) return false;
    *idx = v;
    *rest = end + 1;
    return true;
}

/* The released weight a module names, and how its rows map; false for an unknown module. */
static bool resolve(const char *module, bool diffusers_names, bool interleaved, char *target, size_t cap, row_map *map)
{
    static const char *const official_standalone[] = {
        "video_patch_proj", "audio_patch_proj", "condition_proj", "time_embedder.proj_in", "time_embedder.proj_out",
        "final_layer.adaln_proj.linear", "final_layer.video_out", "final_layer.audio_out"};
    static const char *const diffusers_standalone[][2] = {
        {"proj_in", "video_patch_proj"},
        {"audio_proj_in", "audio_patch_proj"},
        {"context_embedder", "condition_proj"},
        {"time_embedder.linear_1", "time_embedder.proj_in"},
        {"time_embedder.linear_2", "time_embedder.proj_out"},
        {"norm_out.linear", "final_layer.adaln_proj.linear"},
        {"proj_out", "final_layer.video_out"},
        {"audio_proj_out", "final_layer.audio_out"}};
    *map = MAP_IDENTITY;
    long b;
    const char *rest;
    if (!diffusers_names) {
        for (size_t i = 0; i < sizeof official_standalone / sizeof *official_standalone; i++)
            if (strcmp(module, official_standalone[i]) == 0) {
                snprintf(target, cap, "%s.weight", module);
                return true;
            }
        const char *pfx = NULL;
        bool main_stack = false;
        if (block_of(module, "blocks.", &b, &rest)) {
            pfx = "blocks";
            main_stack = true;
        } else if (block_of(module, "token_refiner.blocks.", &b, &rest)) {
            pfx = "token_refiner.blocks";
        }
        if (!pfx) return false;
        if (strcmp(rest, "attn.qkv_proj") == 0) {
            *map = interleaved ? MAP_IDENTITY : MAP_QKV_STACKED;
        } else if (strcmp(rest, "attn.out_proj") != 0 && strcmp(rest, "mlp.fc1") != 0 && strcmp(rest, "mlp.fc2") != 0 &&
                   !(main_stack && strcmp(rest, "adaln_proj.linear") == 0)) {
            return false;
        }
        snprintf(target, cap, "%s.%ld.%s.weight", pfx, b, rest);
        return true;
    }
    for (size_t i = 0; i < sizeof diffusers_standalone / sizeof *diffusers_standalone; i++)
        if (strcmp(module, diffusers_standalone[i][0]) == 0) {
            snprintf(target, cap, "%s.weight", diffusers_standalone[i][1]);
            return true;
        }
    const char *pfx = NULL;
    bool main_stack = false;
    if (block_of(module, "transformer_blocks.", &b, &rest)) {
        pfx = "blocks";
        main_stack = true;
    } else if (block_of(module, "token_refiner.refiner_blocks.", &b, &rest)) {
        pfx = "token_refiner.blocks";
    }
    if (!pfx) return false;
    const char *official;
    if (strcmp(rest, "attn.to_q") == 0) {
        official = "attn.qkv_proj";
        *map = MAP_QKV_Q;
    } else if (strcmp(rest, "attn.to_k") == 0) {
        official = "attn.qkv_proj";
        *map = MAP_QKV_K;
    } else if (strcmp(rest, "attn.to_v") == 0) {
        official = "attn.qkv_proj";
        *map = MAP_QKV_V;
    } else if (strcmp(rest, "attn.to_out.0") == 0) {
        official = "attn.out_proj";
    } else if (strcmp(rest, "ff.net.0.proj") == 0) {
        official = "mlp.fc1";
        *map = MAP_SWAP_HALVES;
    } else if (strcmp(rest, "ff.net.2") == 0) {
        official = "mlp.fc2";
    } else if (main_stack && strcmp(rest, "adaln_proj.linear") == 0) {
        official = "adaln_proj.linear";
    } else {
        return false;
    }
    snprintf(target, cap, "%s.%ld.%s.weight", pfx, b, official);
    return true;
}

/* Modules that only the diffusers naming has (the two vocabularies share no module name). */
static bool diffusers_vocabulary(const char *module)
{
    static const char *const starts[] = {"transformer_blocks.", "token_refiner.refiner_blocks.", "proj_in",
                                         "audio_proj_in", "context_embedder", "time_embedder.linear_",
                                         "norm_out.", "proj_out", "audio_proj_out"};
    for (size_t i = 0; i < sizeof starts / sizeof *starts; i++)
        if (strncmp(module, starts[i], strlen(starts[i])) == 0) return true;
    return false;
}

/* __metadata__[key] of a safetensors file as a string (false when absent or not a string). The
   header was validated when the file was added to its store. */
static bool metadata_str(const char *path, const char *key, char *out, size_t cap)
{
    bool found = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    uint8_t len8[8];
    uint64_t hlen = 0;
    if (pread(fd, len8, 8, 0) == 8) {
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | len8[i];
    }
    char *hdr = hlen && hlen < (100u << 20) ? h3_malloc((size_t)hlen + 1) : NULL;
    if (hdr && pread(fd, hdr, (size_t)hlen, 8) == (ssize_t)hlen) {
        h3_json doc;
        if (h3_json_parse(&doc, hdr, (size_t)hlen) == 0) {
            const h3j *meta = h3j_get(&doc, h3j_root(&doc), "__metadata__");
            const h3j *a = meta ? h3j_get(&doc, meta, key) : NULL;
            if (a && a->type == H3J_STR && strlen(h3j_str(&doc, a)) < cap) {
                snprintf(out, cap, "%s", h3j_str(&doc, a));
                found = true;
            }
            h3_json_free(&doc);
        }
    }
    free(hdr);
    close(fd);
    return found;
}

/* __metadata__["alpha"] (the network alpha some trainers record) or, as the PDD files write it,
   "lora_alpha", if it is a positive number. */
static bool metadata_alpha(const char *path, double *alpha)
{
    char buf[64];
    const char *keys[2] = {"alpha", "lora_alpha"};
    for (int k = 0; k < 2; k++) {
        if (!metadata_str(path, keys[k], buf, sizeof buf)) continue;
        char *end;
        double v = strtod(buf, &end);
        /* diffusers ignores a non-numeric entry (with a warning); so do we */
        if (end != buf && *end == 0 && isfinite(v) && v > 0) {
            *alpha = v;
            return true;
        }
    }
    return false;
}

static void pending_free(pending *p, int n)
{
    for (int i = 0; i < n; i++) {
        free(p[i].module);
        free(p[i].a);
        free(p[i].b);
    }
    free(p);
}

static int find_pending(pending **list, int *n, int *cap, const char *module, size_t len)
{
    for (int i = 0; i < *n; i++)
        if (strlen((*list)[i].module) == len && strncmp((*list)[i].module, module, len) == 0) return i;
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        pending *np = h3_realloc(*list, sizeof *np * (size_t)nc);
        if (!np) return -H3_E_NOMEM;
        *list = np;
        *cap = nc;
    }
    pending *p = &(*list)[*n];
    memset(p, 0, sizeof *p);
    p->module = h3_malloc(len + 1);
    if (!p->module) return -H3_E_NOMEM;
    memcpy(p->module, module, len);
    p->module[len] = 0;
    return (*n)++;
}

static const char *shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

static int add_entry(h3_lora *l, lora_entry *e)
{
    lora_entry *ne = h3_realloc(l->e, sizeof *ne * (size_t)(l->n + 1));
    if (!ne) return -H3_E_NOMEM;
    l->e = ne;
    l->e[l->n++] = *e;
    return 0;
}

/* A PDD bank tensor: [n, rows, cols] or [n * rows, cols] (weights), [n, rows] or [n * rows] (biases). */
static int bank_count(const h3_tensor *t, bool bias, int64_t rows, int64_t cols)
{
    if (!bias && t->ndim == 3 && t->shape[1] == rows && t->shape[2] == cols) return (int)t->shape[0];
    if (!bias && t->ndim == 2 && t->shape[1] == cols && t->shape[0] % rows == 0) return (int)(t->shape[0] / rows);
    if (bias && t->ndim == 2 && t->shape[1] == rows) return (int)t->shape[0];
    if (bias && t->ndim == 1 && t->shape[0] % rows == 0) return (int)(t->shape[0] / rows);
    return -1;
}

/* The PDD bank of file fi from its four tensors (keys[k] NULL where absent). */
static int read_bank(h3_lora *l, int fi, const char *const keys[4], const char *pdd_steps)
{
    const char *path = l->paths[fi];
    h3_store *s = &l->files[fi];
    if (l->pdd.w[0])
        return h3_err(H3_E_SCHEMA, "LoRA %s: a second PDD head bank (only one set of output heads can apply)", path);
    for (int k = 0; k < 4; k++)
        if (!keys[k])
            return h3_err(H3_E_SCHEMA, "LoRA %s: PDD head bank without %s (it needs %s, %s, %s and %s)", path,
                          PDD_KEYS[k], PDD_KEYS[0], PDD_KEYS[1], PDD_KEYS[2], PDD_KEYS[3]);
    int n = -1;
    for (int k = 0; k < 4; k++) {
        const h3_tensor *t = h3_store_find(s, keys[k]);
        const int64_t rows = k < 2 ? l->video_rows : l->audio_rows;
        const int c = bank_count(t, k % 2 == 1, rows, l->hidden);
        char st[96];
        if (c < 2 || (n > 0 && c != n) || c > 4096)
            return h3_err(H3_E_SCHEMA, "LoRA %s: PDD head %s has shape %s, which is no bank of %s heads [%lld, %lld] "
                          "for this model", path, keys[k], shape_text(st, sizeof st, t->ndim, t->shape),
                          k < 2 ? "video" : "audio", (long long)rows, (long long)l->hidden);
        n = c;
    }
    if (pdd_steps) {
        char *end;
        long v = strtol(pdd_steps, &end, 10);
        if (end == pdd_steps || *end || v != n)
            return h3_err(H3_E_SCHEMA, "LoRA %s: metadata pdd_num_steps '%s' but its head bank holds %d heads", path,
                          pdd_steps, n);
    }
    l->pdd.file = fi;
    l->pdd.n = n;
    l->pdd.rows[0] = l->video_rows;
    l->pdd.rows[1] = l->audio_rows;
    l->pdd.cols = l->hidden;
    for (int k = 0; k < 2; k++) {
        l->pdd.w[k] = h3_strdup(keys[2 * k]);
        l->pdd.b[k] = h3_strdup(keys[2 * k + 1]);
        if (!l->pdd.w[k] || !l->pdd.b[k]) return -H3_E_NOMEM;
    }
    return 0;
}

static bool float_dtype(h3_dtype dt) { return dt == H3_DT_F32 || dt == H3_DT_BF16 || dt == H3_DT_F16; }

/* A whole-parameter part (.diff / .diff_b / .set_weight / .set_bias) of module p as an entry. */
static int whole_entry(h3_lora *l, h3_store *dit, int fi, const pending *p, int part, const char *target_w,
                       row_map map, float user_scale)
{
    const char *path = l->paths[fi];
    h3_store *s = &l->files[fi];
    const bool bias = part == 1 || part == 3;
    char target[512];
    snprintf(target, sizeof target, "%s", target_w);
    if (bias) {
        size_t n = strlen(target);
        if (n > 7 && strcmp(target + n - 7, ".weight") == 0) snprintf(target + n - 7, sizeof target - (n - 7), ".bias");
    }
    const h3_tensor *W = h3_store_find(dit, target);
    if (!W)
        return h3_err(H3_E_SCHEMA, "LoRA %s: '%s%s' targets %s, which this model's transformer does not have", path,
                      p->module, SUFFIX_WHOLE[part], target);
    const h3_tensor *D = h3_store_find(s, p->whole[part]);
    int64_t rows = W->shape[0];
    if (map == MAP_QKV_Q || map == MAP_QKV_K || map == MAP_QKV_V) rows /= 3;
    const bool ok = W->ndim == (bias ? 1 : 2) && D->ndim == W->ndim && D->shape[0] == rows &&
                    (bias || D->shape[1] == W->shape[1]) && float_dtype(D->dtype) &&
                    (map == MAP_IDENTITY || map == MAP_SWAP_HALVES || W->shape[0] == 3LL * l->heads * l->head_dim) &&
                    (map != MAP_SWAP_HALVES || W->shape[0] % 2 == 0);
    if (!ok) {
        char sd[96], sw[96];
        return h3_err(H3_E_SCHEMA, "LoRA %s: '%s' is %s %s, which does not fit %s %s", path, p->whole[part],
                      h3_dtype_name(D->dtype), shape_text(sd, sizeof sd, D->ndim, D->shape), target,
                      shape_text(sw, sizeof sw, W->ndim, W->shape));
    }
    lora_entry e = {0};
    e.kind = part >= 2 ? KIND_SET : KIND_DIFF;
    e.vector = bias;
    e.target = h3_strdup(target);
    e.b_name = h3_strdup(p->whole[part]);
    e.file = fi;
    e.out_rows = rows;
    e.cols = bias ? 1 : W->shape[1];
    e.scale = user_scale;
    e.map = map;
    int rc = e.target && e.b_name ? add_entry(l, &e) : -H3_E_NOMEM;
    if (rc) {
        free(e.target);
        free(e.b_name);
    }
    return rc;
}

/* Gather one file's keys into modules, then check each against the model's weight. */
static int read_file(h3_lora *l, h3_store *dit, int fi, float user_scale)
{
    const char *path = l->paths[fi];
    h3_store *s = &l->files[fi];
    pending *mods = NULL;
    int nm = 0, cap = 0, rc = 0;
    bool any_alpha = false;
    const char *bank[4] = {NULL, NULL, NULL, NULL};
    for (size_t t = 0; t < s->ntensors && !rc; t++) {
        const char *key = h3_tensor_name(s, &s->tensors[t]);
        const char *name = key;
        bool diffusers_prefix = false;
        if (strncmp(name, "transformer.", 12) == 0) {
            name += 12;
            diffusers_prefix = true;
        } else if (strncmp(name, "model.diffusion_model.", 22) == 0) {
            name += 22;
        } else if (strncmp(name, "diffusion_model.", 16) == 0) {
            name += 16;
        }
        bool is_bank = false;
        for (int k = 0; k < 4; k++)
            if (strcmp(name, PDD_KEYS[k]) == 0) {
                bank[k] = key;
                is_bank = true;
            }
        if (is_bank) continue;
        size_t cut = 0;
        int half = -1; /* 0 = A / down, 1 = B / up, 2 = alpha, 3 = a whole-parameter part */
        int whole = -1;
        bool infix = false;
        for (int k = 0; k < 4 && half < 0; k++) {
            if (ends_with(name, SUFFIX_A[k], &cut)) half = 0;
            else if (ends_with(name, SUFFIX_B[k], &cut)) half = 1;
            if (half >= 0) infix = k == 2;
        }
        if (half < 0 && ends_with(name, ".alpha", &cut)) half = 2;
        for (int k = 0; k < 4 && half < 0; k++)
            if (ends_with(name, SUFFIX_WHOLE[k], &cut)) {
                half = 3;
                whole = k;
            }
        if (half < 0) {
            rc = h3_err(H3_E_SCHEMA,
                        "LoRA %s: key '%s' is not a LoRA weight (expected .lora_A/.lora_B/.lora_down/.lora_up[.weight], "
                        ".alpha, .diff, .diff_b, .set_weight, .set_bias or a PDD output head)",
                        path, key);
            break;
        }
        int i = find_pending(&mods, &nm, &cap, name, cut);
        if (i < 0) {
            rc = i;
            break;
        }
        pending *p = &mods[i];
        p->diffusers_names = diffusers_prefix || diffusers_vocabulary(p->module);
        if (infix) p->interleaved = true;
        if (half == 2) {
            p->alpha = key;
            any_alpha = true;
        } else if (half == 3) {
            p->whole[whole] = key;
        } else {
            char **slot = half ? &p->b : &p->a;
            free(*slot);
            if (!(*slot = h3_strdup(key))) rc = -H3_E_NOMEM;
        }
    }
    double meta_alpha = 0;
    const bool has_meta_alpha = !rc && !any_alpha && metadata_alpha(path, &meta_alpha);
    char pdd_steps[32], decl[64];
    const bool has_pdd_steps = metadata_str(path, "pdd_num_steps", pdd_steps, sizeof pdd_steps);
    int added = 0;
    /* ComfyUI's converted PDD files carry the bank as a set on the heads ([n * rows, cols]). */
    for (int i = 0; i < nm && !rc; i++) {
        pending *p = &mods[i];
        const bool video = strcmp(p->module, "final_layer.video_out") == 0 || strcmp(p->module, "proj_out") == 0;
        const bool audio = strcmp(p->module, "final_layer.audio_out") == 0 || strcmp(p->module, "audio_proj_out") == 0;
        if (!(video || audio) || !p->whole[2]) continue;
        const h3_tensor *t = h3_store_find(s, p->whole[2]);
        if (t->ndim == 3 || (t->ndim == 2 && t->shape[0] > (video ? l->video_rows : l->audio_rows))) {
            const int k = video ? 0 : 2;
            bank[k] = p->whole[2];
            bank[k + 1] = p->whole[3];
            p->whole[2] = p->whole[3] = NULL;
        }
    }
    if (!rc && (bank[0] || bank[1] || bank[2] || bank[3])) {
        rc = read_bank(l, fi, bank, has_pdd_steps ? pdd_steps : NULL);
        if (!rc) added++;
    } else if (!rc && has_pdd_steps) {
        rc = h3_err(H3_E_SCHEMA, "LoRA %s: metadata pdd_num_steps but no PDD head bank (%s, ...)", path, PDD_KEYS[0]);
    }
    /* The schedule the file was made for: its own statement, or the PDD heads' grid. */
    if (!rc && (metadata_str(path, "h3ctl_schedule", decl, sizeof decl) || (l->pdd.w[0] && l->pdd.file == fi &&
                                                                            snprintf(decl, sizeof decl, "pdd") > 0))) {
        if (h3_sched_find(decl) < 0)
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: metadata h3ctl_schedule '%s' is not a known schedule (%s)", path, decl,
                        h3_sched_names());
        else if (l->schedule[0] && strcmp(l->schedule, decl) != 0)
            rc = h3_err(H3_E_INVALID, "LoRA %s declares schedule '%s' but an earlier LoRA declares '%s'", path, decl,
                        l->schedule);
        else
            snprintf(l->schedule, sizeof l->schedule, "%s", decl);
    }
    for (int i = 0; i < nm && !rc; i++) {
        pending *p = &mods[i];
        char target[512];
        row_map map;
        const bool any_whole = p->whole[0] || p->whole[1] || p->whole[2] || p->whole[3];
        if (!resolve(p->module, p->diffusers_names, p->interleaved, target, sizeof target, &map)) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' does not name a MiniMax-H3 transformer module with weights", path,
                        p->module);
            break;
        }
        for (int k = 0; k < 4 && !rc; k++)
            if (p->whole[k]) {
                rc = whole_entry(l, dit, fi, p, k, target, map, user_scale);
                added += !rc;
            }
        if (rc) break;
        if (!p->a && !p->b && (any_whole || !p->alpha)) continue; /* whole parts only, or a bank moved out */
        if (!p->a && !p->b) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' has an alpha but no lora_A / lora_B weights", path, p->module);
            break;
        }
        if (!p->a || !p->b) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' has a %s but no %s", path, p->module,
                        p->a ? "lora_A (down)" : "lora_B (up)", p->a ? "lora_B (up)" : "lora_A (down)");
            break;
        }
        const h3_tensor *W = h3_store_find(dit, target);
        if (!W) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' targets %s, which this model's transformer does not have", path,
                        p->module, target);
            break;
        }
        const h3_tensor *A = h3_store_find(s, p->a), *B = h3_store_find(s, p->b);
        char sa[96], sb[96], sw[96];
        int64_t rows_b = W->shape[0];
        if (map == MAP_QKV_Q || map == MAP_QKV_K || map == MAP_QKV_V) rows_b = W->shape[0] / 3;
        bool ok = W->ndim == 2 && A->ndim == 2 && B->ndim == 2 && A->shape[0] >= 1 && A->shape[0] == B->shape[1] &&
                  A->shape[1] == W->shape[1] && B->shape[0] == rows_b;
        if (ok && map != MAP_IDENTITY && map != MAP_SWAP_HALVES)
            ok = W->shape[0] == 3LL * l->heads * l->head_dim;
        if (ok && map == MAP_SWAP_HALVES) ok = W->shape[0] % 2 == 0;
        char rank_text[32];
        if (ok && metadata_str(path, "lora_rank", rank_text, sizeof rank_text) && atoll(rank_text) != A->shape[0]) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' has rank %lld but the file's metadata says lora_rank %s", path,
                        p->module, (long long)A->shape[0], rank_text);
            break;
        }
        if (ok || A->ndim != 2 || B->ndim != 2 || A->shape[0] == B->shape[1]) {
        } else {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' has rank %lld in lora_A %s but %lld in lora_B %s (rank mismatch)",
                        path, p->module, (long long)A->shape[0], shape_text(sa, sizeof sa, A->ndim, A->shape),
                        (long long)B->shape[1], shape_text(sb, sizeof sb, B->ndim, B->shape));
            break;
        }
        if (!ok) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' has lora_A %s and lora_B %s, which do not fit %s %s", path,
                        p->module, shape_text(sa, sizeof sa, A->ndim, A->shape), shape_text(sb, sizeof sb, B->ndim, B->shape),
                        target, shape_text(sw, sizeof sw, W->ndim, W->shape));
            break;
        }
        const h3_dtype fl[3] = {H3_DT_F32, H3_DT_BF16, H3_DT_F16};
        bool fa = false, fb = false;
        for (int k = 0; k < 3; k++) {
            fa |= A->dtype == fl[k];
            fb |= B->dtype == fl[k];
        }
        if (!fa || !fb) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' is stored as %s / %s, expected a float type", path, p->module,
                        h3_dtype_name(A->dtype), h3_dtype_name(B->dtype));
            break;
        }
        double alpha_scale = 1.0;
        if (p->alpha) {
            int64_t one = 1;
            h3_dtype dt;
            const h3_tensor *at = h3_store_find(s, p->alpha);
            const void *av = at && at->ndim <= 1 && (at->ndim == 0 || at->shape[0] == 1)
                                 ? h3_store_get_float(s, p->alpha, at->ndim, at->ndim ? &one : NULL, &dt)
                                 : NULL;
            if (!av) {
                rc = h3_err(H3_E_SCHEMA, "LoRA %s: '%s' must be one float", path, p->alpha);
                break;
            }
            float a;
            h3_to_f32(av, dt, &a, 1);
            alpha_scale = (double)a / (double)A->shape[0];
        } else if (has_meta_alpha) {
            alpha_scale = meta_alpha / (double)A->shape[0];
        }
        lora_entry e = {0};
        e.target = h3_strdup(target);
        e.a_name = h3_strdup(p->a);
        e.b_name = h3_strdup(p->b);
        e.file = fi;
        e.rank = A->shape[0];
        e.out_rows = B->shape[0];
        e.cols = A->shape[1];
        e.scale = (float)(user_scale * alpha_scale);
        e.map = map;
        if (!e.target || !e.a_name || !e.b_name || (rc = add_entry(l, &e))) {
            free(e.target);
            free(e.a_name);
            free(e.b_name);
            if (!rc) rc = -H3_E_NOMEM;
        }
        added++;
    }
    if (!rc && added == 0) rc = h3_err(H3_E_SCHEMA, "LoRA %s: holds no LoRA weights", path);
    pending_free(mods, nm);
    return rc;
}

void h3_lora_free(h3_lora *l)
{
    if (!l) return;
    for (int i = 0; i < l->n_files; i++) {
        h3_store_close(&l->files[i]);
        free(l->paths[i]);
    }
    for (int i = 0; i < l->n; i++) {
        free(l->e[i].target);
        free(l->e[i].a_name);
        free(l->e[i].b_name);
    }
    for (int k = 0; k < 2; k++) {
        free(l->pdd.w[k]);
        free(l->pdd.b[k]);
    }
    free(l->files);
    free(l->paths);
    free(l->e);
    free(l);
}

int h3_lora_open(h3_model *m, const char *const *paths, const float *scales, int n, h3_lora **out)
{
    *out = NULL;
    if (n < 0 || n > 64 || (n && !paths)) return h3_err(H3_E_INVALID, "LoRA: %d files (0 to 64)", n);
    h3_dit_cfg c;
    int rc = h3_dit_cfg_load(m, &c);
    if (!rc) rc = h3_model_headers(m, H3_COMP_TRANSFORMER);
    if (rc) return rc;
    h3_lora *l = h3_calloc(1, sizeof *l);
    if (!l) return -H3_E_NOMEM;
    l->heads = c.heads;
    l->head_dim = c.head_dim;
    l->video_rows = (int64_t)c.video_ch * c.patch[1] * c.patch[2];
    l->audio_rows = c.audio_ch;
    l->hidden = c.hidden;
    l->files = h3_calloc((size_t)(n ? n : 1), sizeof *l->files);
    l->paths = h3_calloc((size_t)(n ? n : 1), sizeof *l->paths);
    if (!l->files || !l->paths) rc = -H3_E_NOMEM;
    for (int i = 0; i < n && !rc; i++) {
        const float sc = scales ? scales[i] : 1.0f;
        if (!paths[i] || !paths[i][0]) {
            rc = h3_err(H3_E_INVALID, "LoRA %d: no file name", i + 1);
            break;
        }
        if (!isfinite(sc)) {
            rc = h3_err(H3_E_INVALID, "LoRA %s: scale %g is not a finite number", paths[i], (double)sc);
            break;
        }
        if (!(l->paths[i] = h3_strdup(paths[i]))) {
            rc = -H3_E_NOMEM;
            break;
        }
        l->n_files = i + 1;
        if (!h3_is_file(paths[i])) {
            rc = h3_err(H3_E_IO, "LoRA %s: no such file", paths[i]);
            break;
        }
        if ((rc = h3_store_add_file(&l->files[i], paths[i]))) break;
        rc = read_file(l, &m->comp[H3_COMP_TRANSFORMER].store, i, sc);
    }
    if (rc) {
        h3_lora_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int h3_lora_targets(const h3_lora *l)
{
    int n = 0;
    for (int i = 0; l && i < l->n; i++) {
        bool seen = false;
        for (int k = 0; k < i && !seen; k++) seen = strcmp(l->e[k].target, l->e[i].target) == 0;
        n += !seen;
    }
    return n;
}

/* The released row of LoRA output row j. */
static int64_t map_row(const h3_lora *l, const lora_entry *e, int64_t j, int64_t rows)
{
    const int64_t D = l->head_dim;
    switch (e->map) {
    case MAP_QKV_STACKED:
        return h3_qkv_interleaved_row(j, l->heads, D);
    case MAP_QKV_Q:
    case MAP_QKV_K:
    case MAP_QKV_V:
        return (j / D) * 3 * D + (int64_t)(e->map - MAP_QKV_Q) * D + j % D;
    case MAP_SWAP_HALVES:
        return j < rows / 2 ? j + rows / 2 : j - rows / 2;
    default:
        return j;
    }
}

/* A LoRA half widened to an owned f32 copy. */
static float *half_f32(h3_lora *l, const lora_entry *e, const char *name, int64_t r, int64_t c)
{
    int64_t shape[2] = {r, c};
    h3_dtype dt;
    const void *p = h3_store_get_float(&l->files[e->file], name, 2, shape, &dt);
    if (!p) return NULL;
    float *out = h3_alloc_aligned(sizeof(float) * (size_t)(r * c));
    if (out) h3_to_f32(p, dt, out, r * c);
    return out;
}

int h3_lora_merge(h3_lora *l, h3_pool *pool, const char *name, const void *w, h3_dtype dt, int64_t rows, int64_t cols,
                  void **out, h3_dtype *out_dt)
{
    *out = NULL;
    if (!l) return 0;
    bool any = false;
    for (int i = 0; i < l->n && !any; i++) any = !l->e[i].vector && strcmp(l->e[i].target, name) == 0;
    if (!any) return 0;
    float *W = h3_alloc_aligned(sizeof(float) * (size_t)(rows * cols));
    if (!W) return -H3_E_NOMEM;
    h3_to_f32(w, dt, W, rows * cols);
    int rc = 0;
    /* sets first (in file order), then every delta: a set never discards a delta */
    for (int pass = 0; pass < 2 && !rc; pass++)
    for (int i = 0; i < l->n && !rc; i++) {
        const lora_entry *e = &l->e[i];
        if (e->vector || strcmp(e->target, name) != 0 || (pass == 0) != (e->kind == KIND_SET)) continue;
        if (e->cols != cols) {
            rc = h3_err(H3_E_SCHEMA, "LoRA %s: %s changed shape since it was checked", l->paths[e->file], name);
            break;
        }
        if (e->kind != KIND_LOW_RANK) {
            float *D = half_f32(l, e, e->b_name, e->out_rows, cols);
            if (!D) {
                rc = -H3_E_SCHEMA;
                break;
            }
            for (int64_t j = 0; j < e->out_rows; j++) {
                float *dst = W + map_row(l, e, j, rows) * cols;
                const float *src = D + j * cols;
                if (e->kind == KIND_SET)
                    memcpy(dst, src, sizeof(float) * (size_t)cols);
                else
                    for (int64_t c = 0; c < cols; c++) dst[c] = dst[c] + e->scale * src[c];
            }
            h3_free_aligned(D);
            continue;
        }
        float *A = half_f32(l, e, e->a_name, e->rank, cols), *B = half_f32(l, e, e->b_name, e->out_rows, e->rank);
        float *At = h3_alloc_aligned(sizeof(float) * (size_t)(cols * e->rank));
        float *delta = h3_alloc_aligned(sizeof(float) * (size_t)(e->out_rows * cols));
        if (!A || !B || !At || !delta) rc = A && B ? -H3_E_NOMEM : -H3_E_SCHEMA;
        if (!rc) {
            /* delta = B A as one GEMM: h3_host_linear computes X W^T, so W is A transposed [cols, rank]. */
            for (int64_t k = 0; k < e->rank; k++)
                for (int64_t c = 0; c < cols; c++) At[c * e->rank + k] = A[k * cols + c];
            h3_mat Am = {At, H3_DT_F32, cols, e->rank};
            rc = h3_host_linear(pool, B, e->out_rows, e->rank, &Am, NULL, delta, cols);
        }
        for (int64_t j = 0; !rc && j < e->out_rows; j++) {
            float *dst = W + map_row(l, e, j, rows) * cols;
            const float *src = delta + j * cols;
            for (int64_t c = 0; c < cols; c++) {
                const float s = e->scale * src[c];
                dst[c] = dst[c] + s;
            }
        }
        h3_free_aligned(A);
        h3_free_aligned(B);
        h3_free_aligned(At);
        h3_free_aligned(delta);
    }
    if (rc) {
        h3_free_aligned(W);
        return rc;
    }
    if (dt == H3_DT_BF16) {
        /* a bf16 checkpoint keeps its memory budget: the merged weight is rounded back once */
        uint16_t *b = h3_alloc_aligned(sizeof(uint16_t) * (size_t)(rows * cols));
        if (!b) {
            h3_free_aligned(W);
            return -H3_E_NOMEM;
        }
        for (int64_t i = 0; i < rows * cols; i++) b[i] = h3_f32_to_bf16(W[i]);
        h3_free_aligned(W);
        *out = b;
        *out_dt = H3_DT_BF16;
        return 0;
    }
    *out = W;
    *out_dt = H3_DT_F32;
    return 0;
}

/* A 1-D tensor of the set, as its own tensor: the half_f32 of a vector. */
static float *vec_f32(h3_lora *l, int file, const char *name, int64_t n)
{
    h3_dtype dt;
    const void *p = h3_store_get_float(&l->files[file], name, 1, &n, &dt);
    if (!p) return NULL;
    float *out = h3_alloc_aligned(sizeof(float) * (size_t)n);
    if (out) h3_to_f32(p, dt, out, n);
    return out;
}

int h3_lora_merge_vec(h3_lora *l, const char *name, float *v, int64_t n)
{
    int rc = 0;
    for (int pass = 0; l && pass < 2 && !rc; pass++)
        for (int i = 0; i < l->n && !rc; i++) {
            const lora_entry *e = &l->e[i];
            if (!e->vector || strcmp(e->target, name) != 0 || (pass == 0) != (e->kind == KIND_SET)) continue;
            float *D = vec_f32(l, e->file, e->b_name, e->out_rows);
            if (!D) {
                rc = -H3_E_SCHEMA;
                break;
            }
            for (int64_t j = 0; j < e->out_rows; j++) {
                const int64_t r = map_row(l, e, j, n);
                v[r] = e->kind == KIND_SET ? D[j] : v[r] + e->scale * D[j];
            }
            h3_free_aligned(D);
        }
    return rc;
}

const char *h3_lora_schedule(const h3_lora *l) { return l && l->schedule[0] ? l->schedule : NULL; }

int h3_lora_pdd_intervals(const h3_lora *l) { return l && l->pdd.w[0] ? l->pdd.n : 0; }

/* Interval k of the bank's grid: shift(linspace(1, 0, n + 1)) in double, as the PDD loaders build it. */
static double bank_sigma(int k, int n, double shift)
{
    const double b = 1.0 - (double)k / n;
    return shift * b / (1.0 + (shift - 1.0) * b);
}

int h3_lora_pdd_head(h3_lora *l, int audio, double sigma, double sigma_next, float *W, float *bias)
{
    const pdd_bank *pb = &l->pdd;
    const int m = audio ? 1 : 0, n = pb->n;
    const int64_t rows = pb->rows[m], cols = pb->cols;
    const double shift = audio ? 3.0 : 12.0, span = sigma - sigma_next;
    if (!(span > 0))
        return h3_err(H3_E_INVALID, "PDD heads: the step %g -> %g does not decrease", sigma, sigma_next);
    int64_t wshape[3] = {n, rows, cols}, bshape[2] = {n, rows};
    const h3_tensor *tw = h3_store_find(&l->files[pb->file], pb->w[m]);
    const h3_tensor *tb = h3_store_find(&l->files[pb->file], pb->b[m]);
    if (tw->ndim == 2) {
        wshape[0] = n * rows;
        wshape[1] = cols;
    }
    if (tb->ndim == 1) bshape[0] = n * rows;
    h3_dtype dw, db;
    const void *pw = h3_store_get_float(&l->files[pb->file], pb->w[m], tw->ndim, wshape, &dw);
    const void *pbias = h3_store_get_float(&l->files[pb->file], pb->b[m], tb->ndim, bshape, &db);
    if (!pw || !pbias) return -H3_E_SCHEMA;
    double *acc = h3_calloc((size_t)(rows * cols + rows), sizeof(double));
    float *row = h3_malloc(sizeof(float) * (size_t)(cols > rows ? cols : rows)); /* a weight row or the bias */
    if (!acc || !row) {
        free(acc);
        free(row);
        return -H3_E_NOMEM;
    }
    /* The step's velocity is the sigma-length-weighted mean of the interval heads it spans. */
    double covered = 0;
    for (int k = 0; k < n; k++) {
        const double hi = bank_sigma(k, n, shift), lo = bank_sigma(k + 1, n, shift);
        const double ov = (sigma < hi ? sigma : hi) - (sigma_next > lo ? sigma_next : lo);
        if (!(ov > 0)) continue;
        covered += ov;
        const double wk = ov / span;
        const size_t esw = h3_dtype_size(dw), esb = h3_dtype_size(db);
        for (int64_t r = 0; r < rows; r++) {
            h3_to_f32((const char *)pw + ((size_t)k * rows + r) * cols * esw, dw, row, cols);
            for (int64_t c = 0; c < cols; c++) acc[r * cols + c] += wk * row[c];
        }
        h3_to_f32((const char *)pbias + (size_t)k * rows * esb, db, row, rows);
        for (int64_t r = 0; r < rows; r++) acc[rows * cols + r] += wk * row[r];
    }
    free(row);
    if (fabs(covered - span) > 1e-6 * (span > 1e-3 ? span : 1e-3)) {
        free(acc);
        return h3_err(H3_E_INVALID, "PDD heads: the step %g -> %g leaves the heads' sigma grid", sigma, sigma_next);
    }
    for (int64_t i = 0; i < rows * cols; i++) W[i] = (float)acc[i];
    for (int64_t r = 0; r < rows; r++) bias[r] = (float)acc[rows * cols + r];
    free(acc);
    return 0;
}
