/*
 * Shared internals of libh3. Not installed, not part of the API: stage files include it to get
 * the error helpers, the JSON reader, the safetensors store and the model-directory description.
 */
#ifndef H3_INTERNAL_H
#define H3_INTERNAL_H

#include "h3_stages.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define H3_INTERNAL __attribute__((visibility("hidden")))

#if defined(__GNUC__)
#define H3_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define H3_PRINTF(a, b)
#endif

/* ---- errors ---------------------------------------------------------------------------- */

/* Record a one-line message for h3_last_error and return -code (so `return h3_err(...)`). */
H3_INTERNAL int h3_err(int code, const char *fmt, ...) H3_PRINTF(2, 3);
/* Prefix the current message with "what: " (adds context while an error travels up). */
H3_INTERNAL void h3_err_prefix(const char *fmt, ...) H3_PRINTF(1, 2);
H3_INTERNAL void h3_err_clear(void);

/* Allocation helpers that record H3_E_NOMEM on failure. */
H3_INTERNAL void *h3_malloc(size_t n);
H3_INTERNAL void *h3_calloc(size_t count, size_t size);
H3_INTERNAL void *h3_realloc(void *p, size_t n);
H3_INTERNAL char *h3_strdup(const char *s);
/* 64-byte aligned allocation for SIMD buffers; free with h3_free_aligned. */
H3_INTERNAL void *h3_alloc_aligned(size_t n);
H3_INTERNAL void h3_free_aligned(void *p);

/* printf into a freshly allocated string. */
H3_INTERNAL char *h3_asprintf(const char *fmt, ...) H3_PRINTF(1, 2);
/* Join a directory and a relative path ("a" + "b/c" -> "a/b/c"). */
H3_INTERNAL char *h3_path_join(const char *dir, const char *rel);
H3_INTERNAL bool h3_is_dir(const char *path);
H3_INTERNAL bool h3_is_file(const char *path);
/* Read a whole (small) file; *len gets its size; the buffer is NUL-terminated. */
H3_INTERNAL int h3_read_file(const char *path, char **out, size_t *len, size_t max_len);

/* Growable byte buffer used to build JSON answers. */
typedef struct h3_buf {
    char *p;
    size_t n, cap;
    bool oom;
} h3_buf;
H3_INTERNAL void h3_buf_printf(h3_buf *b, const char *fmt, ...) H3_PRINTF(2, 3);
H3_INTERNAL void h3_buf_json_str(h3_buf *b, const char *s); /* quoted, escaped */
H3_INTERNAL void h3_buf_free(h3_buf *b);

/* ---- SHA-256 (sha256.c) ----------------------------------------------------------------- */

typedef struct h3_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t fill;
} h3_sha256;
H3_INTERNAL void h3_sha256_init(h3_sha256 *s);
H3_INTERNAL void h3_sha256_update(h3_sha256 *s, const void *data, size_t n);
/* Finish and write the digest as 64 lowercase hex digits and a NUL. */
H3_INTERNAL void h3_sha256_hex(h3_sha256 *s, char out[65]);

/* ---- JSON ------------------------------------------------------------------------------ */

typedef enum { H3J_NULL, H3J_FALSE, H3J_TRUE, H3J_NUM, H3J_STR, H3J_ARR, H3J_OBJ } h3j_type;

/*
 * A parsed document is a flat array of values. Containers point at their first child; children
 * are chained through `next`. Object members carry their key. Strings are unescaped UTF-8,
 * NUL-terminated (they may also contain NUL bytes: use `len`).
 */
typedef struct h3j {
    uint8_t type;
    bool is_int;     /* number written without fraction/exponent and fits int64 */
    uint32_t len;    /* string byte length, or number of children */
    int32_t next;    /* next sibling, -1 at the end */
    int32_t child;   /* first child, -1 if none */
    uint32_t key;    /* offset of the key in the string pool (object members) */
    uint32_t keylen;
    uint32_t str;    /* offset of the string in the pool */
    int64_t i;       /* exact value when is_int */
    double num;
} h3j;

typedef struct h3_json {
    h3j *v;
    size_t n, cap;
    char *pool;
    size_t pool_n, pool_cap;
} h3_json;

/* Parse `len` bytes. On failure returns -H3_E_FORMAT with "line L, column C: problem". */
H3_INTERNAL int h3_json_parse(h3_json *doc, const char *text, size_t len);
/* Parse a file; errors are prefixed with its path. */
H3_INTERNAL int h3_json_parse_file(h3_json *doc, const char *path, size_t max_len);
H3_INTERNAL void h3_json_free(h3_json *doc);

static inline const h3j *h3j_root(const h3_json *d) { return d->n ? &d->v[0] : 0; }
static inline const h3j *h3j_first(const h3_json *d, const h3j *v)
{
    return (v && v->child >= 0) ? &d->v[v->child] : 0;
}
static inline const h3j *h3j_next(const h3_json *d, const h3j *v)
{
    return (v && v->next >= 0) ? &d->v[v->next] : 0;
}
static inline const char *h3j_str(const h3_json *d, const h3j *v) { return d->pool + v->str; }
static inline const char *h3j_key(const h3_json *d, const h3j *v) { return d->pool + v->key; }
/* Member of an object by key (NULL if absent or `obj` is not an object). */
H3_INTERNAL const h3j *h3j_get(const h3_json *d, const h3j *obj, const char *key);
/* Nested lookup: h3j_path(d, root, "vit_decoder_kwargs", "heads", NULL). */
H3_INTERNAL const h3j *h3j_path(const h3_json *d, const h3j *obj, ...);
H3_INTERNAL const h3j *h3j_at(const h3_json *d, const h3j *arr, uint32_t index);

/* ---- dtypes ---------------------------------------------------------------------------- */

typedef enum {
    H3_DT_F64, H3_DT_F32, H3_DT_F16, H3_DT_BF16,
    H3_DT_I64, H3_DT_I32, H3_DT_I16, H3_DT_I8,
    H3_DT_U64, H3_DT_U32, H3_DT_U16, H3_DT_U8,
    H3_DT_BOOL, H3_DT_F8_E4M3, H3_DT_F8_E5M2,
    H3_DT_COUNT
} h3_dtype;

H3_INTERNAL const char *h3_dtype_name(h3_dtype t);
H3_INTERNAL size_t h3_dtype_size(h3_dtype t);
H3_INTERNAL int h3_dtype_parse(const char *name, h3_dtype *out); /* 0 or -1 */

/* ---- safetensors ----------------------------------------------------------------------- */

#define H3_MAX_DIMS 8

typedef struct h3_tensor {
    size_t name;         /* offset into the store's name pool: use h3_tensor_name */
    h3_dtype dtype;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
    uint64_t begin, end; /* byte span inside the file's data area */
    int file;            /* index into the store's files */
} h3_tensor;

typedef struct h3_st_file {
    char *path;
    uint64_t size;      /* file size in bytes */
    uint64_t data_off;  /* 8 + header length */
    int fd;             /* -1 when closed */
    uint8_t *map;       /* whole-file mapping, or NULL while only the header is read */
} h3_st_file;

/*
 * A set of safetensors shards seen as one name space (one model component). Names are unique
 * across shards; lookups are hashed.
 */
typedef struct h3_store {
    h3_st_file *files;
    int nfiles;
    h3_tensor *tensors;
    size_t ntensors, cap;
    char *names;        /* pool of tensor names (offsets stored until finalised) */
    size_t names_n, names_cap;
    uint32_t *hash;     /* open addressing, tensor index + 1, 0 = empty */
    size_t hash_cap;
    uint64_t bytes;     /* sum of tensor spans */
    void **copies;      /* aligned copies of tensors whose file offset is misaligned */
    bool drop_page_cache; /* h3_store_release also drops the page cache (H3_OPT_DROP_PAGE_CACHE) */
    /* A single-file source (core/singlefile.c): tensors that need a transform (renamed QKV rows,
       dequantised weights) live in an owned file it fills on the first data access; NULL else. */
    struct h3_sf_source *source;
} h3_store;

/* Parse and validate one file's header into the store (header only; nothing is mapped). */
H3_INTERNAL int h3_store_add_file(h3_store *s, const char *path);
/* Validate an in-memory file image (fuzzing); the store is left empty. */
H3_INTERNAL int h3_store_check_buffer(const uint8_t *buf, size_t len, const char *label);
/*
 * Open a component: if `dir`/model.safetensors.index.json exists, the shards it names (every
 * listed tensor must be in the shard the index says); otherwise every *.safetensors in `dir`,
 * sorted by name. Names must be unique across shards.
 * Shard names are plain file names in `dir`, with one exception for a Ref2VA partition's
 * transformer that stores only the tensors its fine-tune changed: given `shared_dir` (the sibling
 * FL2VA/transformer folder; NULL everywhere else), a name H3_SHARED_SHARD_PREFIX + <file> is
 * `shared_dir`/<file>, and only the tensors the index maps to it are taken from it.
 */
#define H3_SHARED_SHARD_PREFIX "../../FL2VA/transformer/"
H3_INTERNAL int h3_store_open_dir(h3_store *s, const char *dir, const char *shared_dir);
H3_INTERNAL void h3_store_close(h3_store *s);
H3_INTERNAL const h3_tensor *h3_store_find(const h3_store *s, const char *name);
static inline const char *h3_tensor_name(const h3_store *s, const h3_tensor *t)
{
    return s->names + t->name;
}
/*
 * Data of a tensor that must have exactly `dtype` and the given shape (ndim entries). Maps the
 * shard on first use. On mismatch or absence, records an error naming tensor, file, expected
 * and found, and returns NULL.
 */
H3_INTERNAL const void *h3_store_get(h3_store *s, const char *name, h3_dtype dtype, int ndim,
                                     const int64_t *shape);
/* Same but accepts any of the float dtypes F32/BF16/F16 (caller converts); *dtype_out set. */
H3_INTERNAL const void *h3_store_get_float(h3_store *s, const char *name, int ndim,
                                           const int64_t *shape, h3_dtype *dtype_out);
/* Drop the page cache and mappings of every shard (phase end); headers stay. */
H3_INTERNAL void h3_store_release(h3_store *s);
/* Make every tensor's bytes readable through the files (a single-file source fills its owned file
   once); the mmap path calls it, a reader that opens the files itself (runtime/streamer) first. */
H3_INTERNAL int h3_store_ready(const h3_store *s);
/* Append one tensor under `name` (t's fields but its name); a repeated name is an error. */
H3_INTERNAL int h3_store_push(h3_store *s, const char *name, const h3_tensor *t, const char *label);
struct h3_sf_source;
H3_INTERNAL void h3_sf_source_free(struct h3_sf_source *src);
/* Tell the kernel a tensor's pages are no longer needed (e.g. adaln_proj after precompute). */
H3_INTERNAL void h3_store_release_tensor(h3_store *s, const char *name);

/* A file's 8-byte length prefix checked against its size and its JSON header read (NUL-terminated,
   *header_len bytes without the prefix; free() it). Errors name the file. */
H3_INTERNAL int h3_st_read_header(const char *path, char **header, uint64_t *header_len, uint64_t *file_size);

/*
 * Writing one safetensors file (safetensors_write.c), atomically: the data goes to a temporary file
 * beside `path`, which replaces `path` only at h3_st_writer_commit (after an fsync), so a failure
 * or a crash leaves nothing behind and never a half-written `path`. Without `overwrite` an existing
 * `path` is refused at open and again at commit (link(2), which never replaces). The tensors'
 * bytes follow the header in the order of `entries`, each h3_st_writer_write call appending.
 */
typedef struct h3_st_entry {
    const char *name;
    h3_dtype dtype;
    int ndim;
    int64_t shape[H3_MAX_DIMS];
} h3_st_entry;
typedef struct h3_st_writer {
    char *path, *tmp;
    int fd;
    bool overwrite;
    uint64_t data_bytes, written;
} h3_st_writer;
/* meta: n_meta key / value pairs (strings) for __metadata__. */
H3_INTERNAL int h3_st_writer_open(h3_st_writer *w, const char *path, bool overwrite, const h3_st_entry *entries,
                                  size_t n, const char *const (*meta)[2], size_t n_meta);
H3_INTERNAL int h3_st_writer_write(h3_st_writer *w, const void *data, size_t bytes);
/* Checks that every declared byte was written, then makes the file appear at its path. */
H3_INTERNAL int h3_st_writer_commit(h3_st_writer *w);
/* Remove the temporary file (after a failure; safe after commit and on a zeroed writer). */
H3_INTERNAL void h3_st_writer_abort(h3_st_writer *w);

/* ---- model directory ------------------------------------------------------------------- */

typedef enum {
    H3_COMP_TRANSFORMER,
    H3_COMP_TEXT_ENCODER,
    H3_COMP_TOKENIZER,
    H3_COMP_VIDEO_VAE,
    H3_COMP_AUDIO_VAE,
    H3_COMP_COUNT
} h3_component;

H3_INTERNAL const char *h3_component_name(h3_component c);

typedef struct h3_comp {
    bool present;
    char *dir;          /* component folder */
    char *weights_dir;  /* folder holding the shards (video_vae/source) */
    char *config_path;  /* main config (tokenizer: tokenizer.json) */
    h3_json config;     /* parsed main config (empty for the tokenizer) */
    h3_json config2;    /* video_vae/source/config.json, audio_vae/metadata.json */
    bool config_loaded, config2_loaded;
    bool headers_loaded;
    bool shared;        /* taken from FL2VA/ because a Ref2VA partition lacks the folder */
    h3_store store;
} h3_comp;

typedef struct h3_model {
    char *root;         /* directory given by the user */
    char *partition_dir;
    const char *partition; /* "FL2VA", "Ref2VA" or "partition" when given directly */
    char *shared_dir;   /* Ref2VA opened: the sibling FL2VA/, whose folders fill in what Ref2VA/ lacks */
    bool has_ref2va;
    h3_json index;      /* partition model_index.json (may be empty) */
    bool index_loaded;
    double shift_video, shift_audio;
    unsigned flags;     /* H3_OPT_* given to h3_model_open */
    h3_comp comp[H3_COMP_COUNT];
    /* Single files that replace a component's weights (h3_options' component paths; core/singlefile.c):
       the folder still gives the configs. sf_desc: what was found in each, for h3_model_info. */
    char *file[H3_COMP_COUNT];
    char sf_desc[H3_COMP_COUNT][384];
} h3_model;

/* Locate the partition and its components; read configs and headers (no tensor data). */
H3_INTERNAL int h3_model_open(h3_model *m, const char *dir, unsigned flags);
H3_INTERNAL void h3_model_close(h3_model *m);
/* Read component c's weights from the single file `path` instead of its folder's shards (NULL: no
   change); the folder must give the component's configs. */
H3_INTERNAL int h3_model_set_file(h3_model *m, h3_component c, const char *path);
/* Read the tokenizer from `dir`/tokenizer.json instead of the model directory's. */
H3_INTERNAL int h3_model_set_tokenizer(h3_model *m, const char *dir);
/*
 * A file of the partition by its relative path (e.g. "processor/preprocessor_config.json"): under
 * the partition, or, for a Ref2VA partition that lacks the first folder of `rel`, under FL2VA/
 * (*shared set; `shared` may be NULL). Caller frees; NULL when out of memory.
 */
H3_INTERNAL char *h3_model_path(const h3_model *m, const char *rel, bool *shared);
/* Error (naming the folder) if a component a stage needs is absent. */
H3_INTERNAL int h3_model_require(h3_model *m, h3_component c, const char *stage);

/* Integer / float config value by any of several alias names (NULL-terminated); -1 if absent. */
H3_INTERNAL int h3_cfg_int(const h3_json *d, const h3j *obj, int64_t *out, ...);
H3_INTERNAL int h3_cfg_num(const h3_json *d, const h3j *obj, double *out, ...);

/* ---- component configs ----------------------------------------------------------------- */
/*
 * Dimensions of each component, read from its config (official names, with the diffusers names
 * accepted as aliases). Nothing in libh3 hard-codes a model size: the same code serves h3-tiny
 * and the 33B release.
 */
typedef struct h3_dit_cfg {
    int hidden, layers, refiner_layers, heads, head_dim, ffn;
    int video_ch, audio_ch, patch[3], text_dim;
    int freq_dim, temb_hidden, temb_dim, rope_freq;
    double rope_theta, norm_eps, qk_eps, final_eps;
    double shift_video, shift_audio; /* from model_index.json (12 and 3 by default) */
} h3_dit_cfg;

typedef struct h3_text_cfg {
    int hidden, layers, heads, kv_heads, head_dim, inter, vocab;
    int cond_layer;     /* hidden_states index handed to the DiT (50 for the release) */
    double rms_eps, rope_theta;
} h3_text_cfg;

typedef struct h3_vvae_cfg {
    int latent_ch, out_ch, spatial, temporal;      /* 24, 3, 16, 4 */
    int dec_layers, dec_heads, dec_head_dim, dec_registers, dec_ffn_mult;
    double dec_rope_theta, dec_rope_ratio, dec_eps;
    int clip_length, token_drop, tile_size, tile_overlap;
    float latents_mean[64], latents_std[64];
} h3_vvae_cfg;

typedef struct h3_avae_cfg {
    int latent_ch, latent_dim, decoder_dim, sample_rate;
    int n_up, rates[16], kernels[16];
    int n_res, res_kernels[8], res_dil[8][8], n_dil;
    float latents_mean[64], latents_std[64];
} h3_avae_cfg;

H3_INTERNAL int h3_dit_cfg_load(h3_model *m, h3_dit_cfg *c);
H3_INTERNAL int h3_text_cfg_load(h3_model *m, h3_text_cfg *c);
H3_INTERNAL int h3_vvae_cfg_load(h3_model *m, h3_vvae_cfg *c);
H3_INTERNAL int h3_avae_cfg_load(h3_model *m, h3_avae_cfg *c);
/* Check every tensor a render reads against the shapes its config implies (headers only). */
H3_INTERNAL int h3_model_validate(h3_model *m, h3_component c);
/* Load the safetensors headers of a component (once). */
H3_INTERNAL int h3_model_headers(h3_model *m, h3_component c);

/* ---- progress ------------------------------------------------------------------------ */

/*
 * The progress/cancel hook a stage receives from its caller (the runtime passes the context's, or
 * a request's): fn may be NULL. Stages report through h3_hook_check / h3_progress_check (util.c)
 * and never reach the runtime themselves.
 */
typedef struct h3_hook {
    h3_progress_fn fn;
    void *user;
} h3_hook;

/* Ask a progress hook (may be NULL); returns -H3_E_CANCELLED (with a message) when it says stop. */
H3_INTERNAL int h3_progress_check(h3_progress_fn fn, void *user, const char *phase, int done, int total);
static inline int h3_hook_check(h3_hook h, const char *phase, int done, int total)
{
    return h3_progress_check(h.fn, h.user, phase, done, total);
}

#endif /* H3_INTERNAL_H */
