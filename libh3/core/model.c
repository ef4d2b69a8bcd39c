/*
 * Model directory discovery and component configs. The official MiniMaxAI/MiniMax-H3 layout is
 * a root with FL2VA/ (and optionally Ref2VA/) partitions, each holding transformer/,
 * text_encoder/, tokenizer/, video_vae/ (weights under source/) and audio_vae/. Components may
 * be absent: a stage that needs one reports it when it runs.
 *
 * A Ref2VA partition may be the shared-weight form (h3-tiny's, to fit its package budget): only
 * transformer/ of its own, whose index takes the unchanged tensors from FL2VA/transformer, and no
 * text_encoder/, tokenizer/, video_vae/ or audio_vae/: those folders are then FL2VA's.
 */
#include "core/internal.h"
#include "core/singlefile.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *k_comp_names[H3_COMP_COUNT] = {
    [H3_COMP_TRANSFORMER] = "transformer", [H3_COMP_TEXT_ENCODER] = "text_encoder",
    [H3_COMP_TOKENIZER] = "tokenizer",     [H3_COMP_VIDEO_VAE] = "video_vae",
    [H3_COMP_AUDIO_VAE] = "audio_vae",
};

const char *h3_component_name(h3_component c) { return k_comp_names[c]; }

#define CONFIG_MAX (16u << 20)

static int load_json(h3_json *doc, bool *loaded, const char *path)
{
    if (!h3_is_file(path)) return h3_err(H3_E_IO, "%s: missing", path);
    int rc = h3_json_parse_file(doc, path, CONFIG_MAX);
    if (rc) return rc;
    if (!h3j_root(doc) || h3j_root(doc)->type != H3J_OBJ) {
        h3_json_free(doc);
        return h3_err(H3_E_FORMAT, "%s: expected a JSON object", path);
    }
    *loaded = true;
    return 0;
}

/* A relative path from a config must stay inside its component folder. */
static int safe_rel(const char *cfg_path, const char *key, const char *rel)
{
    if (!rel[0] || rel[0] == '/' || strstr(rel, ".."))
        return h3_err(H3_E_FORMAT, "%s: \"%s\" must be a relative path inside the folder, got '%s'",
                      cfg_path, key, rel);
    return 0;
}

static const char *cfg_string(const h3_json *d, const char *key, const char *dflt)
{
    const h3j *v = h3j_get(d, h3j_root(d), key);
    return (v && v->type == H3J_STR) ? h3j_str(d, v) : dflt;
}

/* Length of the first path segment of `rel` (the folder a file lives in). */
static size_t first_segment(const char *rel)
{
    const char *slash = strchr(rel, '/');
    return slash ? (size_t)(slash - rel) : strlen(rel);
}

char *h3_model_path(const h3_model *m, const char *rel, bool *shared)
{
    if (shared) *shared = false;
    char *own = h3_path_join(m->partition_dir, rel);
    if (!own || !m->shared_dir) return own;
    /* Decided by the folder, not the file: a folder Ref2VA/ has is never mixed with FL2VA's. */
    char *seg = h3_asprintf("%.*s", (int)first_segment(rel), rel);
    char *mine = seg ? h3_path_join(m->partition_dir, seg) : NULL;
    char *theirs = seg ? h3_path_join(m->shared_dir, seg) : NULL;
    char *out = own;
    if (!seg || !mine || !theirs) {
        free(own);
        out = NULL;
    } else if (!h3_is_dir(mine) && h3_is_dir(theirs)) {
        free(own);
        out = h3_path_join(m->shared_dir, rel);
        if (out && shared) *shared = true;
    }
    free(seg);
    free(mine);
    free(theirs);
    return out;
}

static int open_component(h3_model *m, h3_component c)
{
    h3_comp *k = &m->comp[c];
    bool shared = false;
    /* The transformer is what makes a Ref2VA partition: never FL2VA's. */
    char *dir = c == H3_COMP_TRANSFORMER ? h3_path_join(m->partition_dir, k_comp_names[c])
                                         : h3_model_path(m, k_comp_names[c], &shared);
    if (!dir) return -H3_E_NOMEM;
    int rc = 0;
    if (c == H3_COMP_TOKENIZER) {
        char *p = h3_path_join(dir, "tokenizer.json");
        if (!p) {
            free(dir);
            return -H3_E_NOMEM;
        }
        if (!h3_is_file(p)) {
            /* The release also carries a root copy of the tokenizer. */
            free(p);
            free(dir);
            dir = h3_path_join(m->root, "tokenizer");
            p = dir ? h3_path_join(dir, "tokenizer.json") : NULL;
            if (!p) {
                free(dir);
                return -H3_E_NOMEM;
            }
        }
        if (h3_is_file(p)) {
            k->present = true;
            k->shared = shared && strncmp(dir, m->shared_dir, strlen(m->shared_dir)) == 0;
            k->dir = dir;
            k->config_path = p;
        } else {
            free(p);
            free(dir);
        }
        return 0;
    }
    if (!h3_is_dir(dir)) {
        free(dir);
        if (c == H3_COMP_TRANSFORMER && m->shared_dir)
            return h3_err(H3_E_IO, "%s: no transformer/ folder (a Ref2VA partition needs its own "
                          "transformer; only the other components can be FL2VA's)", m->partition_dir);
        return 0;
    }
    k->present = true;
    k->shared = shared;
    k->dir = dir;
    k->config_path = h3_path_join(dir, "config.json");
    if (!k->config_path) return -H3_E_NOMEM;
    rc = load_json(&k->config, &k->config_loaded, k->config_path);
    if (rc) return rc;
    if (c == H3_COMP_VIDEO_VAE) {
        const char *src = cfg_string(&k->config, "source_path", "source");
        if ((rc = safe_rel(k->config_path, "source_path", src))) return rc;
        k->weights_dir = h3_path_join(dir, src);
        if (!k->weights_dir) return -H3_E_NOMEM;
        char *p = h3_path_join(k->weights_dir, "config.json");
        if (!p) return -H3_E_NOMEM;
        rc = load_json(&k->config2, &k->config2_loaded, p);
        free(p);
    } else if (c == H3_COMP_AUDIO_VAE) {
        k->weights_dir = h3_strdup(dir);
        const char *meta = cfg_string(&k->config, "source_metadata_path", "metadata.json");
        if ((rc = safe_rel(k->config_path, "source_metadata_path", meta))) return rc;
        char *p = h3_path_join(dir, meta);
        if (!p) return -H3_E_NOMEM;
        rc = load_json(&k->config2, &k->config2_loaded, p);
        free(p);
    } else {
        k->weights_dir = h3_strdup(dir);
    }
    if (!rc && !k->weights_dir) rc = -H3_E_NOMEM;
    return rc;
}

/* What is in a directory, for the "not a model directory" message. */
static void list_entries(const char *dir, char *buf, size_t cap)
{
    buf[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t n = 0;
    int shown = 0;
    struct dirent *de;
    while ((de = readdir(d)) && shown < 8) {
        if (de->d_name[0] == '.') continue;
        int k = snprintf(buf + n, cap - n, "%s%s", shown ? ", " : "", de->d_name);
        if (k < 0 || (size_t)k >= cap - n) break;
        n += (size_t)k;
        shown++;
    }
    closedir(d);
    if (!shown) snprintf(buf, cap, "nothing");
}

static bool looks_like_partition(const char *dir)
{
    static const char *names[] = {"transformer", "text_encoder", "video_vae", "audio_vae"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *p = h3_path_join(dir, names[i]);
        bool yes = p && h3_is_dir(p);
        free(p);
        if (yes) return true;
    }
    return false;
}

/* diffusers-format MiniMax-H3 folders name the video VAE `vae/` and split QKV into to_q/to_k/to_v. */
static bool looks_like_diffusers(const char *dir)
{
    char *vae = h3_path_join(dir, "vae"), *mi = h3_path_join(dir, "model_index.json");
    char *mmi = h3_path_join(dir, "modular_model_index.json");
    bool yes = (vae && h3_is_dir(vae)) || (mmi && h3_is_file(mmi));
    if (!yes && mi && h3_is_file(mi)) {
        h3_json d;
        bool loaded = false;
        if (h3_json_parse_file(&d, mi, CONFIG_MAX) == 0) {
            loaded = true;
            yes = h3j_get(&d, h3j_root(&d), "_minimax_h3") == NULL &&
                  h3j_get(&d, h3j_root(&d), "vae") != NULL;
        }
        if (loaded) h3_json_free(&d);
        h3_err_clear();
    }
    free(vae);
    free(mi);
    free(mmi);
    return yes;
}

int h3_model_open(h3_model *m, const char *dir, unsigned flags)
{
    memset(m, 0, sizeof *m);
    m->flags = flags;
    m->shift_video = 12.0;
    m->shift_audio = 3.0;
    if (!dir || !dir[0]) return h3_err(H3_E_INVALID, "no model directory given");
    if (!h3_is_dir(dir)) {
        if (h3_is_file(dir))
            return h3_err(H3_E_INVALID, "%s: is a file, expected a model directory", dir);
        return h3_err(H3_E_IO, "%s: no such directory", dir);
    }
    m->root = h3_strdup(dir);
    if (!m->root) return -H3_E_NOMEM;
    char *fl = h3_path_join(dir, "FL2VA"), *ref = h3_path_join(dir, "Ref2VA");
    if (!fl || !ref) {
        free(fl);
        free(ref);
        return -H3_E_NOMEM;
    }
    int rc = 0;
    bool has_fl = h3_is_dir(fl);
    m->has_ref2va = h3_is_dir(ref);
    if (has_fl || m->has_ref2va) {
        bool want_ref = (flags & H3_OPT_REF2VA) != 0;
        if (want_ref && !m->has_ref2va)
            rc = h3_err(H3_E_IO, "%s: no Ref2VA/ partition", dir);
        else if (!want_ref && !has_fl)
            rc = h3_err(H3_E_IO, "%s: no FL2VA/ partition (only Ref2VA/; open it with the Ref2VA option)", dir);
        m->partition_dir = want_ref ? ref : fl;
        m->partition = want_ref ? "Ref2VA" : "FL2VA";
        if (want_ref && has_fl)
            m->shared_dir = fl; /* where the components Ref2VA/ lacks come from */
        else
            free(want_ref ? fl : ref);
    } else {
        free(fl);
        free(ref);
        if (looks_like_diffusers(dir)) {
            rc = h3_err(H3_E_UNSUPPORTED,
                        "%s: this is a diffusers-format MiniMax-H3 folder (model_index.json with vae/, "
                        "split to_q/to_k/to_v weights); libh3 reads the official MiniMaxAI/MiniMax-H3 "
                        "layout (FL2VA/transformer, FL2VA/video_vae/source, ...)",
                        dir);
        } else if (looks_like_partition(dir)) {
            m->partition_dir = h3_strdup(dir);
            m->partition = "partition";
        } else {
            char seen[512];
            list_entries(dir, seen, sizeof seen);
            rc = h3_err(H3_E_INVALID,
                        "%s: not a MiniMax-H3 model directory (expected FL2VA/ or a partition with "
                        "transformer/, text_encoder/, tokenizer/, video_vae/, audio_vae/); found: %s",
                        dir, seen);
        }
    }
    if (!rc && !m->partition_dir) rc = -H3_E_NOMEM;
    if (rc) {
        h3_model_close(m);
        return rc;
    }
    char *mi = h3_path_join(m->partition_dir, "model_index.json");
    if (!mi) rc = -H3_E_NOMEM;
    if (!rc && h3_is_file(mi)) {
        rc = load_json(&m->index, &m->index_loaded, mi);
        if (!rc) {
            const h3j *sc = h3j_path(&m->index, h3j_root(&m->index), "_minimax_h3", "sigma_shift_scales", NULL);
            double v;
            if (h3_cfg_num(&m->index, sc, &v, "video", NULL) == 0) m->shift_video = v;
            if (h3_cfg_num(&m->index, sc, &v, "audio", NULL) == 0) m->shift_audio = v;
            if (!(m->shift_video > 0) || !(m->shift_audio > 0))
                rc = h3_err(H3_E_FORMAT, "%s: sigma_shift_scales must be positive", mi);
        }
    }
    free(mi);
    for (int c = 0; c < H3_COMP_COUNT && !rc; c++) rc = open_component(m, (h3_component)c);
    bool any = false;
    for (int c = 0; c < H3_COMP_COUNT; c++) any |= m->comp[c].present;
    if (!rc && !any)
        rc = h3_err(H3_E_INVALID, "%s: no MiniMax-H3 component found (transformer/, text_encoder/, "
                    "tokenizer/, video_vae/, audio_vae/)", m->partition_dir);
    if (rc) h3_model_close(m);
    return rc;
}

void h3_model_close(h3_model *m)
{
    for (int c = 0; c < H3_COMP_COUNT; c++) {
        h3_comp *k = &m->comp[c];
        free(k->dir);
        free(k->weights_dir);
        free(k->config_path);
        if (k->config_loaded) h3_json_free(&k->config);
        if (k->config2_loaded) h3_json_free(&k->config2);
        h3_store_close(&k->store);
    }
    for (int c = 0; c < H3_COMP_COUNT; c++) free(m->file[c]);
    if (m->index_loaded) h3_json_free(&m->index);
    free(m->root);
    free(m->partition_dir);
    free(m->shared_dir);
    memset(m, 0, sizeof *m);
}

int h3_model_require(h3_model *m, h3_component c, const char *stage)
{
    if (m->comp[c].present) return 0;
    return h3_err(H3_E_IO, "%s: component '%s' is missing (needed for %s)", m->partition_dir,
                  k_comp_names[c], stage);
}

int h3_model_set_file(h3_model *m, h3_component c, const char *path)
{
    if (!path) return 0;
    h3_comp *k = &m->comp[c];
    if (!path[0]) return h3_err(H3_E_INVALID, "an empty %s file name", h3_component_name(c));
    if (!h3_is_file(path))
        return h3_err(h3_is_dir(path) ? H3_E_INVALID : H3_E_IO, "%s: %s", path,
                      h3_is_dir(path) ? "is a directory, expected a safetensors file" : "no such file");
    /* A single file holds weights only: the configs come from the folder (h3ctl ships the release's). */
    if (!k->present || !k->config_loaded)
        return h3_err(H3_E_INVALID, "%s: no %s/config.json in %s to read the %s single file %s with", m->partition_dir,
                      h3_component_name(c), m->partition_dir, h3_component_name(c), path);
    free(m->file[c]);
    if (!(m->file[c] = h3_strdup(path))) return -H3_E_NOMEM;
    h3_store_close(&k->store);
    k->headers_loaded = false;
    return 0;
}

int h3_model_set_tokenizer(h3_model *m, const char *dir)
{
    h3_comp *k = &m->comp[H3_COMP_TOKENIZER];
    char *p = dir && dir[0] ? h3_path_join(dir, "tokenizer.json") : NULL;
    if (!p) return dir && dir[0] ? -H3_E_NOMEM : h3_err(H3_E_INVALID, "an empty tokenizer folder name");
    if (!h3_is_file(p)) {
        int rc = h3_err(H3_E_IO, "%s: no tokenizer.json in the tokenizer folder %s", p, dir);
        free(p);
        return rc;
    }
    free(k->dir);
    free(k->config_path);
    k->dir = h3_strdup(dir);
    k->config_path = p;
    k->present = true;
    k->shared = false;
    return k->dir ? 0 : -H3_E_NOMEM;
}

int h3_model_headers(h3_model *m, h3_component c)
{
    h3_comp *k = &m->comp[c];
    if (!k->present) return h3_model_require(m, c, "reading weights");
    if (k->headers_loaded || c == H3_COMP_TOKENIZER) return 0;
    int rc;
    if (m->file[c]) {
        int64_t heads = 0;
        int64_t rope_freq = 0;
        double theta = 10000.0; /* the released config omits it; its inv_freq table solves to 10000 */
        if (c == H3_COMP_TRANSFORMER) {
            h3_cfg_int(&k->config, h3j_root(&k->config), &heads, "num_attention_heads", NULL);
            h3_cfg_int(&k->config, h3j_root(&k->config), &rope_freq, "rope_inv_freq_len", NULL);
            h3_cfg_num(&k->config, h3j_root(&k->config), &theta, "rope_theta", NULL);
        }
        h3_vvae_cfg vc;
        if (c == H3_COMP_VIDEO_VAE && h3_vvae_cfg_load(m, &vc) == 0) heads = vc.dec_heads; /* diffusers' to_q/k/v */
        rc = h3_sf_open_rope(&k->store, m->file[c], c, (int)heads, rope_freq > 0 && rope_freq <= 4096 ? (int)rope_freq : 0,
                             theta, m->sf_desc[c], sizeof m->sf_desc[c]);
    } else if (c == H3_COMP_VIDEO_VAE || c == H3_COMP_AUDIO_VAE) {
        /* VAEs are single files named by their config. */
        const char *fn = cfg_string(&k->config, "source_safetensors_path", "model.safetensors");
        if ((rc = safe_rel(k->config_path, "source_safetensors_path", fn))) return rc;
        char *p = h3_path_join(k->weights_dir, fn);
        if (!p) return -H3_E_NOMEM;
        memset(&k->store, 0, sizeof k->store);
        struct stat st;
        rc = stat(p, &st) == 0 ? h3_store_add_file(&k->store, p)
                               : h3_err(H3_E_IO, "%s: missing (named by %s)", p, k->config_path);
        free(p);
        if (rc) h3_store_close(&k->store);
    } else {
        /* Only a Ref2VA transformer may name FL2VA's shards in its index. */
        char *shared = NULL;
        if (c == H3_COMP_TRANSFORMER && m->shared_dir && !k->shared &&
            !(shared = h3_path_join(m->shared_dir, "transformer")))
            return -H3_E_NOMEM;
        rc = h3_store_open_dir(&k->store, k->weights_dir, shared);
        free(shared);
    }
    if (!rc) k->headers_loaded = true;
    k->store.drop_page_cache = (m->flags & H3_OPT_DROP_PAGE_CACHE) != 0;
    return rc;
}
