/*
 * safetensors reader. Headers are read with pread (so `h3ctl info` on a 465 GB model touches a
 * few MB); shards are mapped only when a stage asks for tensor data. Every header is validated
 * completely before use: a malformed file fails with one line naming the file and the problem.
 */
#include "core/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation caps headers at 100 MB; a larger one is a corrupt length field. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

static const struct {
    const char *name;
    size_t size;
} k_dtypes[H3_DT_COUNT] = {
    [H3_DT_F64] = {"F64", 8},       [H3_DT_F32] = {"F32", 4},   [H3_DT_F16] = {"F16", 2},
    [H3_DT_BF16] = {"BF16", 2},     [H3_DT_I64] = {"I64", 8},   [H3_DT_I32] = {"I32", 4},
    [H3_DT_I16] = {"I16", 2},       [H3_DT_I8] = {"I8", 1},     [H3_DT_U64] = {"U64", 8},
    [H3_DT_U32] = {"U32", 4},       [H3_DT_U16] = {"U16", 2},   [H3_DT_U8] = {"U8", 1},
    [H3_DT_BOOL] = {"BOOL", 1},     [H3_DT_F8_E4M3] = {"F8_E4M3", 1},
    [H3_DT_F8_E5M2] = {"F8_E5M2", 1},
};

const char *h3_dtype_name(h3_dtype t) { return (unsigned)t < H3_DT_COUNT ? k_dtypes[t].name : "?"; }
size_t h3_dtype_size(h3_dtype t) { return (unsigned)t < H3_DT_COUNT ? k_dtypes[t].size : 0; }

int h3_dtype_parse(const char *name, h3_dtype *out)
{
    for (int i = 0; i < H3_DT_COUNT; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *out = (h3_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- name hash ------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

#define tname h3_tensor_name

static int hash_rebuild(h3_store *s, size_t want)
{
    size_t cap = 64;
    while (cap < want * 2) cap *= 2;
    uint32_t *h = h3_calloc(cap, sizeof *h);
    if (!h) return -H3_E_NOMEM;
    for (size_t i = 0; i < s->ntensors; i++) {
        size_t k = fnv1a(tname(s, &s->tensors[i])) & (cap - 1);
        while (h[k]) k = (k + 1) & (cap - 1);
        h[k] = (uint32_t)(i + 1);
    }
    free(s->hash);
    s->hash = h;
    s->hash_cap = cap;
    return 0;
}

static long hash_find(const h3_store *s, const char *name)
{
    if (!s->hash_cap) return -1;
    size_t k = fnv1a(name) & (s->hash_cap - 1);
    while (s->hash[k]) {
        size_t i = s->hash[k] - 1;
        if (strcmp(tname(s, &s->tensors[i]), name) == 0) return (long)i;
        k = (k + 1) & (s->hash_cap - 1);
    }
    return -1;
}

static int hash_insert(h3_store *s, size_t idx)
{
    if ((s->ntensors + 1) * 2 > s->hash_cap) {
        /* Rebuilds over [0, ntensors); idx == ntensors is inserted below. */
        int rc = hash_rebuild(s, s->ntensors + 64);
        if (rc) return rc;
    }
    size_t k = fnv1a(tname(s, &s->tensors[idx])) & (s->hash_cap - 1);
    while (s->hash[k]) k = (k + 1) & (s->hash_cap - 1);
    s->hash[k] = (uint32_t)(idx + 1);
    return 0;
}

static int store_name(h3_store *s, const char *name, size_t len, size_t *off)
{
    if (s->names_n + len + 1 > s->names_cap) {
        size_t cap = s->names_cap ? s->names_cap * 2 : 4096;
        while (cap < s->names_n + len + 1) cap *= 2;
        char *p = h3_realloc(s->names, cap);
        if (!p) return -H3_E_NOMEM;
        s->names = p;
        s->names_cap = cap;
    }
    memcpy(s->names + s->names_n, name, len);
    s->names[s->names_n + len] = 0;
    *off = s->names_n;
    s->names_n += len + 1;
    return 0;
}

/* ---- header validation ----------------------------------------------------------------- */

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

typedef struct {
    uint64_t begin, end;
    uint32_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Which of a file's tensors join the store (NULL: all of them). */
typedef bool (*keep_fn)(const char *name, void *ud);

/*
 * Validate a parsed header against a data area of `data_len` bytes and append its tensors to
 * `s` (when s != NULL) -- only those `keep` accepts when it is given: a shard shared with another
 * partition also holds tensors that this store takes from elsewhere. The whole header is validated
 * either way. `label` names the file in messages.
 */
static int parse_header(h3_store *s, int file_idx, const char *hdr, size_t hlen, uint64_t data_len,
                        const char *label, keep_fn keep, void *keep_ud)
{
    h3_json doc;
    int rc = h3_json_parse(&doc, hdr, hlen);
    if (rc) {
        h3_err_prefix("%s: malformed safetensors header", label);
        return rc;
    }
    const h3j *root = h3j_root(&doc);
    if (!root || root->type != H3J_OBJ) {
        h3_json_free(&doc);
        return h3_err(H3_E_FORMAT, "%s: safetensors header is not a JSON object", label);
    }
    size_t count = 0;
    for (const h3j *e = h3j_first(&doc, root); e; e = h3j_next(&doc, e)) count++;
    span *spans = h3_calloc(count ? count : 1, sizeof *spans);
    if (!spans) {
        h3_json_free(&doc);
        return -H3_E_NOMEM;
    }
    size_t nspan = 0;
    size_t first_new = s ? s->ntensors : 0;
    rc = 0;
    for (const h3j *e = h3j_first(&doc, root); e && !rc; e = h3j_next(&doc, e)) {
        const char *name = h3j_key(&doc, e);
        if (e->keylen == 0) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor with an empty name", label);
            break;
        }
        if (strlen(name) != e->keylen) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor name contains a NUL byte", label);
            break;
        }
        if (strcmp(name, "__metadata__") == 0) {
            if (e->type != H3J_OBJ) {
                rc = h3_err(H3_E_FORMAT, "%s: __metadata__ is not an object", label);
                break;
            }
            for (const h3j *m = h3j_first(&doc, e); m; m = h3j_next(&doc, m))
                if (m->type != H3J_STR) {
                    rc = h3_err(H3_E_FORMAT, "%s: __metadata__ value '%s' is not a string", label,
                                h3j_key(&doc, m));
                    break;
                }
            continue;
        }
        if (e->type != H3J_OBJ) {
            rc = h3_err(H3_E_FORMAT, "%s: entry '%s' is not an object", label, name);
            break;
        }
        const h3j *jd = h3j_get(&doc, e, "dtype");
        const h3j *js = h3j_get(&doc, e, "shape");
        const h3j *jo = h3j_get(&doc, e, "data_offsets");
        if (!jd || jd->type != H3J_STR) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' has no dtype string", label, name);
            break;
        }
        h3_dtype dt;
        if (h3_dtype_parse(h3j_str(&doc, jd), &dt) != 0) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", label, name,
                        h3j_str(&doc, jd));
            break;
        }
        if (!js || js->type != H3J_ARR) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' has no shape array", label, name);
            break;
        }
        if (js->len > H3_MAX_DIMS) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' has %u dimensions (at most %d supported)",
                        label, name, js->len, H3_MAX_DIMS);
            break;
        }
        h3_tensor t;
        memset(&t, 0, sizeof t);
        t.dtype = dt;
        t.ndim = (int)js->len;
        t.file = file_idx;
        uint64_t elems = 1;
        bool overflow = false;
        int d = 0;
        for (const h3j *x = h3j_first(&doc, js); x; x = h3j_next(&doc, x), d++) {
            if (x->type != H3J_NUM || !x->is_int || x->i < 0) {
                rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' shape entry %d is not a non-negative integer",
                            label, name, d);
                break;
            }
            t.shape[d] = x->i;
            if (x->i && elems > UINT64_MAX / (uint64_t)x->i) overflow = true;
            elems *= (uint64_t)x->i;
        }
        if (rc) break;
        if (overflow || (elems && elems > UINT64_MAX / h3_dtype_size(dt))) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' shape overflows", label, name);
            break;
        }
        if (!jo || jo->type != H3J_ARR || jo->len != 2) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' needs data_offsets [begin, end]", label, name);
            break;
        }
        const h3j *b = h3j_first(&doc, jo), *en = h3j_next(&doc, b);
        if (b->type != H3J_NUM || !b->is_int || b->i < 0 || en->type != H3J_NUM || !en->is_int ||
            en->i < 0) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' data_offsets are not non-negative integers",
                        label, name);
            break;
        }
        t.begin = (uint64_t)b->i;
        t.end = (uint64_t)en->i;
        if (t.end < t.begin) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' data_offsets end %llu < begin %llu", label, name,
                        (unsigned long long)t.end, (unsigned long long)t.begin);
            break;
        }
        if (t.end > data_len) {
            rc = h3_err(H3_E_FORMAT,
                        "%s: tensor '%s' span [%llu, %llu) runs past the data area (%llu bytes): "
                        "file truncated?",
                        label, name, (unsigned long long)t.begin, (unsigned long long)t.end,
                        (unsigned long long)data_len);
            break;
        }
        uint64_t want = elems * h3_dtype_size(dt);
        if (t.end - t.begin != want) {
            rc = h3_err(H3_E_FORMAT,
                        "%s: tensor '%s' is %s with %llu elements (%llu bytes) but its span holds %llu bytes",
                        label, name, h3_dtype_name(dt), (unsigned long long)elems,
                        (unsigned long long)want, (unsigned long long)(t.end - t.begin));
            break;
        }
        spans[nspan].begin = t.begin;
        spans[nspan].end = t.end;
        spans[nspan].idx = (uint32_t)nspan;
        nspan++;
        if (s && (!keep || keep(name, keep_ud))) {
            size_t off;
            long prev = hash_find(s, name);
            if (prev >= 0) {
                const h3_tensor *o = &s->tensors[prev];
                rc = (size_t)prev >= first_new
                         ? h3_err(H3_E_FORMAT, "%s: tensor '%s' appears twice", label, name)
                         : h3_err(H3_E_FORMAT, "%s: tensor '%s' is also in %s (duplicate name across shards)",
                                  label, name, s->files[o->file].path);
                break;
            }
            if (s->ntensors == s->cap) {
                size_t cap = s->cap ? s->cap * 2 : 256;
                h3_tensor *nt = h3_realloc(s->tensors, cap * sizeof *nt);
                if (!nt) {
                    rc = -H3_E_NOMEM;
                    break;
                }
                s->tensors = nt;
                if (s->copies) {
                    void **nc = h3_realloc(s->copies, cap * sizeof *nc);
                    if (!nc) {
                        rc = -H3_E_NOMEM;
                        break;
                    }
                    memset(nc + s->cap, 0, (cap - s->cap) * sizeof *nc);
                    s->copies = nc;
                }
                s->cap = cap;
            }
            if ((rc = store_name(s, name, e->keylen, &off))) break;
            t.name = off;
            s->tensors[s->ntensors] = t;
            if ((rc = hash_insert(s, s->ntensors))) break;
            s->ntensors++;
            s->bytes += t.end - t.begin;
        }
    }
    if (!rc && (!s || keep) && nspan > 1) {
        /* Without a store to look names up in (or with names it skipped), sort them to find repeats. */
        const char **keys = h3_calloc(nspan, sizeof *keys);
        if (!keys) {
            rc = -H3_E_NOMEM;
        } else {
            size_t k = 0;
            for (const h3j *e = h3j_first(&doc, root); e; e = h3j_next(&doc, e))
                if (strcmp(h3j_key(&doc, e), "__metadata__") != 0) keys[k++] = h3j_key(&doc, e);
            qsort(keys, k, sizeof *keys, cmp_cstr);
            for (size_t i = 1; i < k && !rc; i++)
                if (strcmp(keys[i - 1], keys[i]) == 0)
                    rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' appears twice", label, keys[i]);
            free(keys);
        }
    }
    if (!rc && nspan) {
        /* Spans must tile the data area exactly: no overlap (aliasing) and no holes. */
        qsort(spans, nspan, sizeof *spans, span_cmp);
        uint64_t pos = 0;
        for (size_t i = 0; i < nspan; i++) {
            if (spans[i].begin < pos) {
                rc = h3_err(H3_E_FORMAT, "%s: tensor data spans overlap at byte %llu", label,
                            (unsigned long long)spans[i].begin);
                break;
            }
            if (spans[i].begin > pos) {
                rc = h3_err(H3_E_FORMAT, "%s: %llu unindexed bytes in the data area at byte %llu",
                            label, (unsigned long long)(spans[i].begin - pos), (unsigned long long)pos);
                break;
            }
            pos = spans[i].end;
        }
        if (!rc && pos != data_len)
            rc = h3_err(H3_E_FORMAT, "%s: %llu trailing bytes after the last tensor", label,
                        (unsigned long long)(data_len - pos));
    } else if (!rc && data_len != 0) {
        rc = h3_err(H3_E_FORMAT, "%s: data area of %llu bytes but no tensors", label,
                    (unsigned long long)data_len);
    }
    free(spans);
    h3_json_free(&doc);
    if (rc && s) {
        /* Roll back this file's tensors so the store stays consistent. */
        s->ntensors = first_new;
        hash_rebuild(s, s->ntensors + 64);
    }
    return rc;
}

/* Check the 8-byte length prefix against the file size; returns header length. */
static int check_prefix(const uint8_t len8[8], uint64_t fsize, const char *label, uint64_t *hlen)
{
    if (fsize < 8)
        return h3_err(H3_E_FORMAT, "%s: %llu bytes, too short for a safetensors file (truncated?)",
                      label, (unsigned long long)fsize);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
    if (n > fsize - 8)
        return h3_err(H3_E_FORMAT,
                      "%s: header length %llu runs past the end of the %llu-byte file (truncated?)",
                      label, (unsigned long long)n, (unsigned long long)fsize);
    if (n > ST_MAX_HEADER)
        return h3_err(H3_E_FORMAT, "%s: header length %llu exceeds the 100 MB limit", label,
                      (unsigned long long)n);
    if (n < 2) return h3_err(H3_E_FORMAT, "%s: header of %llu bytes is too short", label,
                             (unsigned long long)n);
    *hlen = n;
    return 0;
}

int h3_store_check_buffer(const uint8_t *buf, size_t len, const char *label)
{
    uint64_t hlen;
    int rc = check_prefix(buf, len, label, &hlen);
    if (rc) return rc;
    if (buf[8] != '{') return h3_err(H3_E_FORMAT, "%s: header does not start with '{'", label);
    return parse_header(NULL, 0, (const char *)buf + 8, (size_t)hlen, len - 8 - hlen, label, NULL, NULL);
}

int h3_st_read_header(const char *path, char **header, uint64_t *header_len, uint64_t *file_size)
{
    *header = NULL;
    /* O_NONBLOCK: a FIFO is refused below instead of blocking the open until a writer comes */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return h3_err(H3_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return h3_err(H3_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return h3_err(H3_E_IO, "%s: not a regular file", path);
    }
    uint64_t fsize = (uint64_t)st.st_size;
    uint8_t len8[8] = {0};
    ssize_t r = fsize >= 8 ? pread(fd, len8, 8, 0) : 0;
    if (fsize >= 8 && r != 8) {
        int e = errno;
        close(fd);
        return h3_err(H3_E_IO, "%s: cannot read: %s", path, r < 0 ? strerror(e) : "short read");
    }
    uint64_t hlen;
    int rc = check_prefix(len8, fsize, path, &hlen);
    if (rc) {
        close(fd);
        return rc;
    }
    char *hdr = h3_malloc((size_t)hlen + 1);
    if (!hdr) {
        close(fd);
        return -H3_E_NOMEM;
    }
    size_t got = 0;
    while (got < hlen) {
        r = pread(fd, hdr + got, (size_t)hlen - got, (off_t)(8 + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(hdr);
            close(fd);
            return h3_err(H3_E_IO, "%s: cannot read header: %s", path, r < 0 ? strerror(e) : "short read");
        }
        got += (size_t)r;
    }
    close(fd);
    hdr[hlen] = 0;
    if (hdr[0] != '{') {
        free(hdr);
        return h3_err(H3_E_FORMAT, "%s: header does not start with '{'", path);
    }
    *header = hdr;
    *header_len = hlen;
    *file_size = fsize;
    return 0;
}

static int add_file(h3_store *s, const char *path, keep_fn keep, void *keep_ud)
{
    char *hdr;
    uint64_t hlen, fsize;
    int rc = h3_st_read_header(path, &hdr, &hlen, &fsize);
    if (rc) return rc;
    h3_st_file *files = h3_realloc(s->files, (size_t)(s->nfiles + 1) * sizeof *files);
    if (!files) {
        free(hdr);
        return -H3_E_NOMEM;
    }
    s->files = files;
    h3_st_file *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    f->path = h3_strdup(path);
    f->size = fsize;
    f->data_off = 8 + hlen;
    f->fd = -1; /* opened on first data access, so `info` on many shards holds no descriptors */
    if (!f->path) {
        free(hdr);
        return -H3_E_NOMEM;
    }
    rc = parse_header(s, s->nfiles, hdr, (size_t)hlen, fsize - 8 - hlen, path, keep, keep_ud);
    free(hdr);
    if (rc) {
        free(f->path);
        return rc;
    }
    s->nfiles++;
    return 0;
}

int h3_store_add_file(h3_store *s, const char *path) { return add_file(s, path, NULL, NULL); }

int h3_store_push(h3_store *s, const char *name, const h3_tensor *t, const char *label)
{
    if (hash_find(s, name) >= 0) return h3_err(H3_E_FORMAT, "%s: tensor '%s' appears twice", label, name);
    if (s->ntensors == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        h3_tensor *nt = h3_realloc(s->tensors, cap * sizeof *nt);
        if (!nt) return -H3_E_NOMEM;
        s->tensors = nt;
        if (s->copies) {
            void **nc = h3_realloc(s->copies, cap * sizeof *nc);
            if (!nc) return -H3_E_NOMEM;
            memset(nc + s->cap, 0, (cap - s->cap) * sizeof *nc);
            s->copies = nc;
        }
        s->cap = cap;
    }
    size_t off;
    int rc = store_name(s, name, strlen(name), &off);
    if (rc) return rc;
    s->tensors[s->ntensors] = *t;
    s->tensors[s->ntensors].name = off;
    if ((rc = hash_insert(s, s->ntensors))) return rc;
    s->ntensors++;
    s->bytes += t->end - t->begin;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A plain file name: no folder part, not "." or "..", not empty. */
static bool plain_name(const char *fn) { return fn[0] && !strchr(fn, '/') && strcmp(fn, "..") && strcmp(fn, "."); }

/* The file name after the shared-shard prefix, or NULL when `fn` is not a shared shard. */
static const char *shared_name(const char *fn, const char *shared_dir)
{
    size_t n = strlen(H3_SHARED_SHARD_PREFIX);
    if (!shared_dir || strncmp(fn, H3_SHARED_SHARD_PREFIX, n) != 0) return NULL;
    return plain_name(fn + n) ? fn + n : NULL;
}

typedef struct {
    const h3_json *idx;
    const h3j *wm;
    const char *shard; /* the weight_map value of the shard being added */
} keep_listed;

/* A shared shard contributes only the tensors the index maps to it: the rest of it (the tensors this
   partition overrides) belongs to the partition that owns the file. */
static bool keep_if_listed(const char *name, void *ud)
{
    const keep_listed *k = ud;
    const h3j *v = h3j_get(k->idx, k->wm, name);
    return v && v->type == H3J_STR && strcmp(h3j_str(k->idx, v), k->shard) == 0;
}

/* Shards named by model.safetensors.index.json, verified against their headers. */
static int open_indexed(h3_store *s, const char *dir, const char *index_path, const char *shared_dir)
{
    h3_json idx;
    int rc = h3_json_parse_file(&idx, index_path, 64u << 20);
    if (rc) return rc;
    const h3j *wm = h3j_get(&idx, h3j_root(&idx), "weight_map");
    if (!wm || wm->type != H3J_OBJ) {
        h3_json_free(&idx);
        return h3_err(H3_E_FORMAT, "%s: no \"weight_map\" object", index_path);
    }
    /* Distinct shard names, in sorted order. */
    size_t n = 0;
    char **names = h3_calloc(wm->len ? wm->len : 1, sizeof *names);
    if (!names) {
        h3_json_free(&idx);
        return -H3_E_NOMEM;
    }
    for (const h3j *e = h3j_first(&idx, wm); e; e = h3j_next(&idx, e)) {
        if (e->type != H3J_STR) {
            rc = h3_err(H3_E_FORMAT, "%s: weight_map entry '%s' is not a file name", index_path,
                        h3j_key(&idx, e));
            goto done;
        }
        const char *fn = h3j_str(&idx, e);
        if (!shared_name(fn, shared_dir) && (strchr(fn, '/') || strcmp(fn, "..") == 0 || fn[0] == 0)) {
            rc = h3_err(H3_E_FORMAT, "%s: weight_map names '%s', which is not a file in %s",
                        index_path, fn, dir);
            goto done;
        }
        names[n++] = (char *)fn;
    }
    qsort(names, n, sizeof *names, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    /* The store starts empty, so file i is names[i]: the name a tensor's file is checked against. */
    for (size_t i = 0; i < u && !rc; i++) {
        const char *shared = shared_name(names[i], shared_dir);
        char *p = shared ? h3_path_join(shared_dir, shared) : h3_path_join(dir, names[i]);
        if (!p) {
            rc = -H3_E_NOMEM;
            break;
        }
        keep_listed k = {&idx, wm, names[i]};
        if (!h3_is_file(p))
            rc = shared ? h3_err(H3_E_IO, "%s: shared shard '%s' listed in model.safetensors.index.json is "
                                 "missing (%s)", dir, names[i], p)
                        : h3_err(H3_E_IO, "%s: shard '%s' listed in model.safetensors.index.json is missing",
                                 dir, names[i]);
        else
            rc = add_file(s, p, shared ? keep_if_listed : NULL, &k);
        free(p);
    }
    /* Every listed tensor must live in the shard the index names (the whole relative name, so a
       shared shard is not confused with a local file of the same base name). */
    for (const h3j *e = h3j_first(&idx, wm); e && !rc; e = h3j_next(&idx, e)) {
        const h3_tensor *t = h3_store_find(s, h3j_key(&idx, e));
        if (!t) {
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' is listed but not in shard %s", index_path,
                        h3j_key(&idx, e), h3j_str(&idx, e));
            break;
        }
        if (strcmp(names[t->file], h3j_str(&idx, e)) != 0)
            rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' is listed in %s but stored in %s", index_path,
                        h3j_key(&idx, e), h3j_str(&idx, e), names[t->file]);
    }
    if (!rc && s->ntensors != wm->len) {
        /* A tensor in a shard but not in the map would be invisible to other loaders. */
        for (size_t i = 0; i < s->ntensors; i++)
            if (!h3j_get(&idx, wm, tname(s, &s->tensors[i]))) {
                rc = h3_err(H3_E_FORMAT, "%s: tensor '%s' in %s is not listed in the index",
                            index_path, tname(s, &s->tensors[i]), s->files[s->tensors[i].file].path);
                break;
            }
    }
done:
    free(names);
    h3_json_free(&idx);
    return rc;
}

int h3_store_open_dir(h3_store *s, const char *dir, const char *shared_dir)
{
    memset(s, 0, sizeof *s);
    if (!h3_is_dir(dir)) return h3_err(H3_E_IO, "%s: not a directory", dir);
    char *index_path = h3_path_join(dir, "model.safetensors.index.json");
    if (!index_path) return -H3_E_NOMEM;
    int rc;
    if (h3_is_file(index_path)) {
        rc = open_indexed(s, dir, index_path, shared_dir);
    } else {
        DIR *dh = opendir(dir);
        if (!dh) {
            free(index_path);
            return h3_err(H3_E_IO, "%s: cannot list: %s", dir, strerror(errno));
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        rc = 0;
        struct dirent *de;
        while ((de = readdir(dh)) != NULL) {
            size_t l = strlen(de->d_name);
            if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0) continue;
            if (de->d_name[0] == '.') continue; /* editor/partial-download leftovers */
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                char **nn = h3_realloc(names, cap * sizeof *nn);
                if (!nn) {
                    rc = -H3_E_NOMEM;
                    break;
                }
                names = nn;
            }
            if (!(names[n] = h3_strdup(de->d_name))) {
                rc = -H3_E_NOMEM;
                break;
            }
            n++;
        }
        closedir(dh);
        if (!rc && n == 0) rc = h3_err(H3_E_IO, "%s: no .safetensors files", dir);
        if (!rc) qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n && !rc; i++) {
            char *p = h3_path_join(dir, names[i]);
            rc = p ? h3_store_add_file(s, p) : -H3_E_NOMEM;
            free(p);
        }
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
    }
    free(index_path);
    if (rc) h3_store_close(s);
    return rc;
}

void h3_store_close(h3_store *s)
{
    for (int i = 0; i < s->nfiles; i++) {
        h3_st_file *f = &s->files[i];
        if (f->map) munmap(f->map, (size_t)f->size);
        if (f->fd >= 0) close(f->fd);
        free(f->path);
    }
    if (s->copies)
        for (size_t i = 0; i < s->ntensors; i++) h3_free_aligned(s->copies[i]);
    h3_sf_source_free(s->source);
    free(s->copies);
    free(s->files);
    free(s->tensors);
    free(s->names);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

const h3_tensor *h3_store_find(const h3_store *s, const char *name)
{
    long i = hash_find(s, name);
    return i < 0 ? NULL : &s->tensors[i];
}

static int map_file(h3_st_file *f)
{
    if (f->map) return 0;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return h3_err(H3_E_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != f->size) {
        close(fd);
        return h3_err(H3_E_IO, "%s: file changed size since its header was read", f->path);
    }
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        return h3_err(H3_E_IO, "%s: cannot map: %s", f->path, strerror(e));
    }
    f->fd = fd;
    f->map = m;
    return 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static const h3_tensor *checked(h3_store *s, const char *name, int ndim, const int64_t *shape)
{
    const h3_tensor *t = h3_store_find(s, name);
    if (!t) {
        const char *where = s->nfiles ? s->files[0].path : "(no files)";
        h3_err(H3_E_SCHEMA, "tensor '%s' is missing (looked in %d shard%s starting with %s)", name,
               s->nfiles, s->nfiles == 1 ? "" : "s", where);
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char want[128], got[128];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, t->ndim, t->shape);
        h3_err(H3_E_SCHEMA, "%s: tensor '%s' has shape %s, expected %s", s->files[t->file].path, name,
               got, want);
        return NULL;
    }
    return t;
}

static const void *data_of(h3_store *s, const h3_tensor *t)
{
    h3_st_file *f = &s->files[t->file];
    if (h3_store_ready(s) || map_file(f)) return NULL;
    const uint8_t *p = f->map + f->data_off + t->begin;
    size_t align = h3_dtype_size(t->dtype);
    if (((uintptr_t)p & (align - 1)) == 0) return p;
    /* Writers pad headers to 8 bytes, but a file that did not would make every load an unaligned
       access (undefined behaviour in C): serve such tensors from an aligned copy. */
    size_t idx = (size_t)(t - s->tensors);
    if (!s->copies && !(s->copies = h3_calloc(s->cap, sizeof *s->copies))) return NULL;
    if (!s->copies[idx]) {
        void *c = h3_alloc_aligned(t->end - t->begin);
        if (!c) return NULL;
        memcpy(c, p, t->end - t->begin);
        s->copies[idx] = c;
    }
    return s->copies[idx];
}

const void *h3_store_get(h3_store *s, const char *name, h3_dtype dtype, int ndim, const int64_t *shape)
{
    const h3_tensor *t = checked(s, name, ndim, shape);
    if (!t) return NULL;
    if (t->dtype != dtype) {
        h3_err(H3_E_SCHEMA, "%s: tensor '%s' is %s, expected %s", s->files[t->file].path, name,
               h3_dtype_name(t->dtype), h3_dtype_name(dtype));
        return NULL;
    }
    return data_of(s, t);
}

const void *h3_store_get_float(h3_store *s, const char *name, int ndim, const int64_t *shape,
                               h3_dtype *dtype_out)
{
    const h3_tensor *t = checked(s, name, ndim, shape);
    if (!t) return NULL;
    if (t->dtype != H3_DT_F32 && t->dtype != H3_DT_BF16 && t->dtype != H3_DT_F16) {
        h3_err(H3_E_SCHEMA, "%s: tensor '%s' is %s, expected a float type (F32, BF16 or F16)",
               s->files[t->file].path, name, h3_dtype_name(t->dtype));
        return NULL;
    }
    *dtype_out = t->dtype;
    return data_of(s, t);
}

void h3_store_release(h3_store *s)
{
    for (int i = 0; i < s->nfiles; i++) {
        h3_st_file *f = &s->files[i];
        if (f->map) {
            /* Dropping the mapping lets the kernel reclaim the pages a finished phase touched. */
            madvise(f->map, (size_t)f->size, MADV_DONTNEED);
            munmap(f->map, (size_t)f->size);
            f->map = NULL;
        }
        if (f->fd >= 0) {
#if defined(POSIX_FADV_DONTNEED)
            /* The page cache is clean and the kernel reclaims it under pressure, so it is kept by
               default: the next render maps the same weights without touching the disk.
               H3_OPT_DROP_PAGE_CACHE drops it (for memory-tight machines that page in huge models). */
            if (s->drop_page_cache) posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
            close(f->fd);
            f->fd = -1;
        }
    }
}

void h3_store_release_tensor(h3_store *s, const char *name)
{
    const h3_tensor *t = h3_store_find(s, name);
    if (!t) return;
    h3_st_file *f = &s->files[t->file];
    if (!f->map) return;
    /* Only whole pages inside the span can go; neighbours may still be in use. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = (uintptr_t)(f->map + f->data_off + t->begin), e = (uintptr_t)(f->map + f->data_off + t->end);
    b = (b + page - 1) & ~(page - 1);
    e &= ~(page - 1);
    if (e > b) madvise((void *)b, e - b, MADV_DONTNEED);
}

H3_API int h3_safetensors_check(const char *path)
{
    h3_store s;
    memset(&s, 0, sizeof s);
    int rc = h3_store_add_file(&s, path);
    h3_store_close(&s);
    return rc;
}

H3_API int h3_safetensors_check_buffer(const void *buf, size_t len)
{
    if (!buf && len) return h3_err(H3_E_INVALID, "NULL buffer");
    return h3_store_check_buffer(buf, len, "<buffer>");
}
