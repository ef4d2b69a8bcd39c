/*
 * Prompt cache: conditioning embeddings of recently encoded prompts, so repeated renders of the
 * same prompt skip the text encoder (50 layers of ~1 GB each for the release).
 *
 * Key = (identity of the text-encoder weights, token ids), and for a keyframe (FL2VA) prompt also
 * the processor settings and each image's size and 128-bit digest (image_key), so an entry never
 * answers for other pixels and a text prompt never meets a keyframe entry. The identity hashes what decides the
 * result: the weights folder, every shard's path, size, inode and modification time, and the
 * conditioning layer and width. Replacing a shard on disk therefore changes the key and stale
 * entries simply age out. Thread count, prefetch and the SIMD variant are not part of it: the
 * first two do not change a bit of the result and the last is fixed for the process.
 *
 * Eviction: least recently used first, to keep the bytes held (embeddings + ids + entry header)
 * within a budget (default 256 MiB; 0 disables caching). An entry larger than the budget is not
 * stored. Lookups walk a short list (a budget of 256 MiB holds ~200 release-size 64-token
 * prompts), comparing a 64-bit hash before the ids themselves.
 */
#include "models/text_encoder.h"
#include "models/vision_tower.h"
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TC_DEFAULT_BUDGET (256ull << 20)

#if defined(__APPLE__)
#define ST_MTIME(st) (st).st_mtimespec
#else
#define ST_MTIME(st) (st).st_mtim
#endif

typedef struct tc_entry {
    struct tc_entry *prev, *next; /* most recently used first */
    uint64_t model_id, hash;
    int n, hidden;
    uint64_t bytes;
    int32_t *ids;
    float *emb;
    uint8_t *extra;   /* keyframe prompts: the images' part of the key (image_key); NULL for text */
    size_t extra_len;
} tc_entry;

struct h3_text_cache {
    tc_entry *head, *tail;
    uint64_t bytes, budget, entries;
    uint64_t hits, misses, evictions, last_bytes_read;
};

static uint64_t fnv(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

#define FNV0 1469598103934665603ull

static void entry_free(tc_entry *e)
{
    free(e->extra);
    free(e->ids);
    free(e->emb);
    free(e);
}

static void unlink_entry(h3_text_cache *c, tc_entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(h3_text_cache *c, tc_entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e;
    c->head = e;
    if (!c->tail) c->tail = e;
}

static void evict_to(h3_text_cache *c, uint64_t budget)
{
    while (c->tail && c->bytes > budget) {
        tc_entry *e = c->tail;
        unlink_entry(c, e);
        c->bytes -= e->bytes;
        c->entries--;
        c->evictions++;
        entry_free(e);
    }
}

void h3_text_cache_free(h3_text_cache *c)
{
    if (!c) return;
    evict_to(c, 0);
    free(c);
}

static h3_text_cache *cache_of(h3_runtime *rt)
{
    if (!rt->text_cache) {
        rt->text_cache = h3_calloc(1, sizeof *rt->text_cache);
        if (rt->text_cache) rt->text_cache->budget = TC_DEFAULT_BUDGET;
    }
    return rt->text_cache;
}

/* Identity of the text-encoder weights as they are on disk now. */
static int model_identity(h3_model *m, const h3_text_cfg *cfg, uint64_t *id)
{
    int rc = h3_model_headers(m, H3_COMP_TEXT_ENCODER);
    if (rc) return rc;
    const h3_comp *k = &m->comp[H3_COMP_TEXT_ENCODER];
    uint64_t h = fnv(FNV0, k->weights_dir, strlen(k->weights_dir) + 1);
    h = fnv(h, &cfg->cond_layer, sizeof cfg->cond_layer);
    h = fnv(h, &cfg->hidden, sizeof cfg->hidden);
    for (int i = 0; i < k->store.nfiles; i++) {
        const char *path = k->store.files[i].path;
        struct stat st;
        if (stat(path, &st) != 0) return h3_err(H3_E_IO, "%s: cannot stat (removed since the model was opened?)", path);
        int64_t v[5] = {(int64_t)st.st_size, (int64_t)st.st_ino, (int64_t)st.st_dev, (int64_t)ST_MTIME(st).tv_sec,
                        (int64_t)ST_MTIME(st).tv_nsec};
        h = fnv(h, path, strlen(path) + 1);
        h = fnv(h, v, sizeof v);
    }
    *id = h;
    return 0;
}

/* A text prompt (extra_len 0) only ever matches a text entry, a keyframe prompt only an entry of
   the same images. */
static tc_entry *lookup(h3_text_cache *c, uint64_t model_id, uint64_t hash, const int32_t *ids, int n, int hidden,
                        const uint8_t *extra, size_t extra_len)
{
    for (tc_entry *e = c->head; e; e = e->next)
        if (e->hash == hash && e->model_id == model_id && e->n == n && e->hidden == hidden &&
            e->extra_len == extra_len && memcmp(e->ids, ids, (size_t)n * sizeof *ids) == 0 &&
            (!extra_len || memcmp(e->extra, extra, extra_len) == 0))
            return e;
    return NULL;
}

/* Store a copy (best effort: without memory the result is simply not cached). */
static void insert(h3_text_cache *c, uint64_t model_id, uint64_t hash, const int32_t *ids, int n, int hidden,
                   const float *emb, const uint8_t *extra, size_t extra_len)
{
    uint64_t bytes = sizeof(tc_entry) + (uint64_t)n * sizeof(int32_t) + (uint64_t)n * hidden * sizeof(float) +
                     extra_len;
    if (bytes > c->budget) return;
    tc_entry *e = calloc(1, sizeof *e);
    if (!e) return;
    e->ids = malloc((size_t)n * sizeof(int32_t));
    e->emb = malloc((size_t)n * (size_t)hidden * sizeof(float));
    if (extra_len && (e->extra = malloc(extra_len))) {
        memcpy(e->extra, extra, extra_len);
        e->extra_len = extra_len;
    }
    if (!e->ids || !e->emb || e->extra_len != extra_len) {
        entry_free(e);
        return;
    }
    memcpy(e->ids, ids, (size_t)n * sizeof(int32_t));
    memcpy(e->emb, emb, (size_t)n * (size_t)hidden * sizeof(float));
    e->model_id = model_id;
    e->hash = hash;
    e->n = n;
    e->hidden = hidden;
    e->bytes = bytes;
    evict_to(c, c->budget - bytes);
    push_front(c, e);
    c->bytes += bytes;
    c->entries++;
}

int h3_rt_text_encode(h3_runtime *rt, const int32_t *ids, int n, float *out)
{
    if (!ids || !out) return h3_err(H3_E_INVALID, "text encoder: NULL ids or output");
    int rc = h3_text_check_count(n);
    if (rc) return rc;
    h3_model *m = rt->model;
    h3_text_cfg cfg;
    uint64_t model_id = 0;
    if ((rc = h3_text_cfg_load(m, &cfg)) || (rc = model_identity(m, &cfg, &model_id))) return rc;
    h3_text_cache *c = cache_of(rt);
    if (!c) return -H3_E_NOMEM;
    uint64_t hash = fnv(fnv(FNV0, &n, sizeof n), ids, (size_t)n * sizeof *ids);
    tc_entry *e = c->budget ? lookup(c, model_id, hash, ids, n, cfg.hidden, NULL, 0) : NULL;
    if (e) {
        c->hits++;
        c->last_bytes_read = 0;
        unlink_entry(c, e);
        push_front(c, e);
        memcpy(out, e->emb, (size_t)n * (size_t)cfg.hidden * sizeof(float));
        return h3_rt_progress(rt, "text_encoder", cfg.cond_layer, cfg.cond_layer);
    }
    h3_backend *be;
    if ((rc = h3_rt_stage_backend(rt, &be))) return rc;
    c->misses++;
    h3_text_run run = {rt->progress, rt->progress_user, (rt->flags & H3_OPT_NO_TEXT_PREFETCH) ? 0 : 1, 0,
                       &rt->text_keep, h3_rt_text_keep_reserve(rt), &rt->tuning};
    rc = h3_text_forward(m, be, ids, n, out, &run);
    c->last_bytes_read = run.bytes_read;
    if (!rc && c->budget) insert(c, model_id, hash, ids, n, cfg.hidden, out, NULL, 0);
    return rc;
}

int h3_rt_text_cache_stats(h3_runtime *rt, h3_text_cache_stats *out)
{
    if (!out) return h3_err(H3_E_INVALID, "NULL stats");
    if (out->struct_size < offsetof(h3_text_cache_stats, misses) || out->struct_size > sizeof *out)
        return h3_err(H3_E_INVALID, "h3_text_cache_stats.struct_size %u is not a size this library knows",
                      out->struct_size);
    h3_text_cache *c = cache_of(rt);
    if (!c) return -H3_E_NOMEM;
    h3_text_cache_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = out->struct_size;
    s.hits = c->hits;
    s.misses = c->misses;
    s.entries = c->entries;
    s.bytes = c->bytes;
    s.budget = c->budget;
    s.evictions = c->evictions;
    s.last_bytes_read = c->last_bytes_read;
    memcpy(out, &s, out->struct_size);
    return 0;
}

int h3_rt_text_cache_set_budget(h3_runtime *rt, uint64_t bytes)
{
    h3_text_cache *c = cache_of(rt);
    if (!c) return -H3_E_NOMEM;
    c->budget = bytes;
    evict_to(c, bytes);
    return 0;
}

void h3_rt_text_cache_clear(h3_runtime *rt)
{
    if (!rt->text_cache) return;
    h3_text_cache *c = rt->text_cache;
    uint64_t ev = c->evictions;
    evict_to(c, 0);
    c->evictions = ev; /* clearing is not eviction */
}

/* ---- keyframe prompts (FL2VA) ------------------------------------------------------------------ */

static int rt_tokenizer(h3_runtime *rt, h3_tokenizer **out)
{
    h3_model *m = rt->model;
    int rc = h3_model_require(m, H3_COMP_TOKENIZER, "tokenizing the prompt");
    if (rc) return rc;
    if (!rt->tokenizer && !(rt->tokenizer = h3_tokenizer_load(m->comp[H3_COMP_TOKENIZER].config_path)))
        return -H3_E_FORMAT;
    *out = rt->tokenizer;
    return 0;
}

/* 128 bits over an image's bytes: FNV-1a and a word-wise multiply-xorshift, two unrelated 64-bit
   lanes, so two different keyframes of the same size share a key only by a ~2^-128 accident. */
static void digest128(const uint8_t *p, size_t n, uint64_t out[2])
{
    uint64_t a = fnv(FNV0, p, n), b = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        b = (b ^ w) * 0xFF51AFD7ED558CCDull;
        b ^= b >> 32;
    }
    for (; i < n; i++) b = (b ^ p[i]) * 0xC4CEB9FE1A85EC53ull;
    b ^= b >> 29;
    out[0] = a;
    out[1] = b;
}

/* The images' part of a cache key: the processor settings (what turns pixels into patches), then
   each image's width, height and digest. Written field by field: no struct padding in it. */
static uint8_t *image_key(const h3_vl_prompt *p, const uint8_t *const *rgb, const int *widths, const int *heights,
                          const int *frames, size_t *len)
{
    const size_t per_cfg = 3 * sizeof(int) + 2 * sizeof(int64_t) + 6 * sizeof(float) + sizeof(double) + 3;
    const size_t n = 2 * per_cfg + (size_t)p->n_images * (3 * sizeof(int) + 2 * sizeof(uint64_t));
    uint8_t *k = h3_malloc(n), *w = k;
    if (!k) return NULL;
#define PUT(x) (memcpy(w, &(x), sizeof(x)), w += sizeof(x))
    /* both processors' settings (the video one is zeros without videos) */
    for (int j = 0; j < 2; j++) {
        const h3_image_proc_cfg *c = j ? &p->vpc : &p->pc;
        PUT(c->patch_size), PUT(c->temporal_patch_size), PUT(c->merge_size), PUT(c->min_pixels), PUT(c->max_pixels);
        PUT(c->mean), PUT(c->std), PUT(c->rescale_factor);
        *w++ = c->do_resize, *w++ = c->do_rescale, *w++ = c->do_normalize;
    }
    for (int i = 0; i < p->n_images; i++) {
        uint64_t d[2];
        const int f = frames && frames[i] > 0 ? frames[i] : 0; /* 0: an image */
        digest128(rgb[i], (size_t)widths[i] * (size_t)heights[i] * 3 * (size_t)(f ? f : 1), d);
        PUT(widths[i]), PUT(heights[i]), PUT(f), PUT(d);
    }
#undef PUT
    *len = n;
    return k;
}

void h3_text_rows_free(h3_text_rows *r)
{
    if (!r) return;
    free(r->rows);
    free(r->ids);
    free(r->tags);
    memset(r, 0, sizeof *r);
}

int h3_rt_text_image_rows(h3_runtime *rt, const char *prompt, int n_images, const int *widths, const int *heights)
{
    return h3_rt_text_refs_rows(rt, prompt, n_images, widths, heights, NULL, NULL);
}

int h3_rt_text_refs_rows(h3_runtime *rt, const char *prompt, int n_images, const int *widths, const int *heights,
                         const int *frames, const int *audio_before)
{
    h3_tokenizer *tok;
    h3_vl_prompt p;
    int rc = rt_tokenizer(rt, &tok);
    if (rc || (rc = h3_vl_prompt_build_refs(rt->model, tok, prompt, n_images, widths, heights, frames, audio_before, &p)))
        return rc;
    const int n = p.n;
    h3_vl_prompt_free(&p);
    return n;
}

int h3_rt_text_encode_images(h3_runtime *rt, const char *prompt, int n_images, const uint8_t *const *rgb,
                             const int *widths, const int *heights, h3_text_rows *out)
{
    return h3_rt_text_encode_refs(rt, prompt, n_images, rgb, widths, heights, NULL, NULL, out);
}

int h3_rt_text_encode_refs(h3_runtime *rt, const char *prompt, int n_images, const uint8_t *const *rgb,
                           const int *widths, const int *heights, const int *frames, const int *audio_before,
                           h3_text_rows *out)
{
    if (!out) return h3_err(H3_E_INVALID, "text encoder: NULL output");
    memset(out, 0, sizeof *out);
    if (n_images > 0 && !rgb) return h3_err(H3_E_INVALID, "text encoder: NULL keyframes");
    h3_tokenizer *tok;
    h3_vl_prompt p;
    int rc = rt_tokenizer(rt, &tok);
    if (rc || (rc = h3_vl_prompt_build_refs(rt->model, tok, prompt, n_images, widths, heights, frames, audio_before, &p)))
        return rc;
    for (int i = 0; i < n_images && !rc; i++) {
        char what[32];
        snprintf(what, sizeof what, "keyframe %d", i + 1);
        rc = h3_image_check(rgb[i], widths[i], heights[i], what);
    }
    h3_model *m = rt->model;
    h3_text_cfg cfg;
    uint64_t model_id = 0;
    uint8_t *extra = NULL;
    size_t extra_len = 0;
    float *rows = NULL;
    h3_text_cache *c = NULL;
    if (rc || (rc = h3_text_cfg_load(m, &cfg)) || (rc = model_identity(m, &cfg, &model_id))) goto done;
    if (!(c = cache_of(rt)) || !(rows = h3_malloc(sizeof(float) * (size_t)p.n * (size_t)cfg.hidden)) ||
        (n_images > 0 && !(extra = image_key(&p, rgb, widths, heights, frames, &extra_len)))) {
        rc = -H3_E_NOMEM;
        goto done;
    }
    /* No keyframes: the plain prompt's key, so it shares entries with h3_rt_text_encode. */
    const uint64_t hash = fnv(fnv(FNV0, &p.n, sizeof p.n), p.ids, (size_t)p.n * sizeof *p.ids);
    tc_entry *e = c->budget ? lookup(c, model_id, hash, p.ids, p.n, cfg.hidden, extra, extra_len) : NULL;
    if (e) {
        c->hits++;
        c->last_bytes_read = 0;
        unlink_entry(c, e);
        push_front(c, e);
        memcpy(rows, e->emb, sizeof(float) * (size_t)p.n * (size_t)cfg.hidden);
        rc = h3_rt_progress(rt, "text_encoder", cfg.cond_layer, cfg.cond_layer);
    } else {
        h3_backend *be;
        if ((rc = h3_rt_cpu_backend(rt, &be))) goto done;
        c->misses++;
        /* the CPU backend computes on the mapping: no kept layers */
        h3_text_run run = {rt->progress, rt->progress_user, (rt->flags & H3_OPT_NO_TEXT_PREFETCH) ? 0 : 1, 0, NULL, 0,
                           &rt->tuning};
        rc = h3_vl_encode(m, be, &p, rgb, widths, heights, rows, &run);
        c->last_bytes_read = run.bytes_read;
        if (!rc && c->budget) insert(c, model_id, hash, p.ids, p.n, cfg.hidden, rows, extra, extra_len);
    }
    if (!rc) {
        out->n = p.n;
        out->hidden = cfg.hidden;
        out->rows = rows;
        out->ids = p.ids;
        out->tags = p.tags;
        rows = NULL;
        p.ids = NULL;
        p.tags = NULL;
    }
done:
    free(rows);
    free(extra);
    h3_vl_prompt_free(&p);
    return rc;
}
