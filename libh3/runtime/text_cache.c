/*
 * Prompt cache: conditioning embeddings of recently encoded prompts, so repeated renders of the
 * same prompt skip the text encoder (50 layers of ~1 GB each for the release).
 *
 * Key = (identity of the text-encoder weights, token ids). The identity hashes what decides the
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
#include "runtime/runtime.h"

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

static tc_entry *lookup(h3_text_cache *c, uint64_t model_id, uint64_t hash, const int32_t *ids, int n, int hidden)
{
    for (tc_entry *e = c->head; e; e = e->next)
        if (e->hash == hash && e->model_id == model_id && e->n == n && e->hidden == hidden &&
            memcmp(e->ids, ids, (size_t)n * sizeof *ids) == 0)
            return e;
    return NULL;
}

/* Store a copy (best effort: without memory the result is simply not cached). */
static void insert(h3_text_cache *c, uint64_t model_id, uint64_t hash, const int32_t *ids, int n, int hidden,
                   const float *emb)
{
    uint64_t bytes = sizeof(tc_entry) + (uint64_t)n * sizeof(int32_t) + (uint64_t)n * hidden * sizeof(float);
    if (bytes > c->budget) return;
    tc_entry *e = calloc(1, sizeof *e);
    if (!e) return;
    e->ids = malloc((size_t)n * sizeof(int32_t));
    e->emb = malloc((size_t)n * (size_t)hidden * sizeof(float));
    if (!e->ids || !e->emb) {
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
    tc_entry *e = c->budget ? lookup(c, model_id, hash, ids, n, cfg.hidden) : NULL;
    if (e) {
        c->hits++;
        c->last_bytes_read = 0;
        unlink_entry(c, e);
        push_front(c, e);
        memcpy(out, e->emb, (size_t)n * (size_t)cfg.hidden * sizeof(float));
        return h3_rt_progress(rt, "text_encoder", cfg.cond_layer, cfg.cond_layer);
    }
    h3_backend *be;
    if ((rc = h3_rt_cpu_backend(rt, &be))) return rc;
    c->misses++;
    h3_text_run run = {rt->progress, rt->progress_user, (rt->flags & H3_OPT_NO_TEXT_PREFETCH) ? 0 : 1, 0};
    rc = h3_text_forward(m, be, ids, n, out, &run);
    c->last_bytes_read = run.bytes_read;
    if (!rc && c->budget) insert(c, model_id, hash, ids, n, cfg.hidden, out);
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
