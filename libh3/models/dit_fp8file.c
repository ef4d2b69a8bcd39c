/*
 * Pre-quantised fp8 transformer weights on file (see dit_fp8file.h): the writer behind
 * h3_quantize and the checked reader behind h3_options.quantized_path. The file is read with the
 * safetensors store and written with the safetensors writer (core/); the quantisation is the
 * host copy of the CUDA backend's (core/fp8.h).
 */
#include "models/dit_fp8file.h"
#include "core/fp8.h"
#include "models/dit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCALE_SUFFIX ".scale"
#define IDENTITY_WINDOW 4096u /* bytes per sampled window of a weight (three per weight) */
#define CONFIG_MAX ((size_t)16 << 20)

struct h3_fp8file {
    h3_store st;
    char *path;
};

/* One weight the fp8 path quantises. */
typedef struct {
    char name[112];
    int64_t rows, cols;
} fp8_item;

/* The weights the fp8 path quantises, in file order (block by block, h3_dit_gemm_part's order). */
static int fp8_items(h3_model *m, fp8_item **out, int *n)
{
    *out = NULL;
    *n = 0;
    h3_dit_cfg c;
    int rc = h3_dit_cfg_load(m, &c);
    if (!rc) rc = h3_model_headers(m, H3_COMP_TRANSFORMER);
    if (rc) return rc;
    fp8_item *it = h3_calloc((size_t)(c.layers > 0 ? c.layers : 1) * H3_DIT_GEMMS, sizeof *it);
    if (!it) return -H3_E_NOMEM;
    int k = 0;
    for (int i = 0; i < c.layers; i++)
        for (int g = 0; g < H3_DIT_GEMMS; g++) {
            h3_dit_gemm_shape(&c, g, &it[k].rows, &it[k].cols);
            if (!h3_fp8_weight_shape_ok(it[k].rows, it[k].cols)) continue; /* stays bf16 on the GPU */
            snprintf(it[k].name, sizeof it[k].name, "blocks.%d.%s.weight", i, h3_dit_gemm_part(g));
            k++;
        }
    if (!k) {
        free(it);
        return h3_err(H3_E_UNSUPPORTED, "%s: no transformer weight of this model takes the fp8 path",
                      m->comp[H3_COMP_TRANSFORMER].config_path);
    }
    *out = it;
    *n = k;
    return 0;
}

static void hash_u64(h3_sha256 *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    h3_sha256_update(h, b, 8);
}

/* Hash `len` bytes at `off` of an open file (pread; the shards are never mapped for this). */
static int hash_span(h3_sha256 *h, int fd, const char *path, uint64_t off, uint64_t len)
{
    uint8_t buf[IDENTITY_WINDOW];
    while (len) {
        const size_t want = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return h3_err(H3_E_IO, "%s: cannot read: %s", path, r < 0 ? strerror(errno) : "file truncated");
        h3_sha256_update(h, buf, (size_t)r);
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

/* The model's identity (see dit_fp8file.h) as 64 hex digits. */
static int model_identity(h3_model *m, const fp8_item *it, int n, char hex[65])
{
    h3_comp *t = &m->comp[H3_COMP_TRANSFORMER];
    h3_store *st = &t->store;
    h3_sha256 h;
    h3_sha256_init(&h);
    static const char tag[] = "h3ctl fp8 identity 1\n";
    h3_sha256_update(&h, tag, sizeof tag - 1);
    char *cfg;
    size_t len;
    int rc = h3_read_file(t->config_path, &cfg, &len, CONFIG_MAX);
    if (rc) return rc;
    hash_u64(&h, len);
    h3_sha256_update(&h, cfg, len);
    free(cfg);
    for (int f = 0; f < st->nfiles; f++) {
        char *hdr;
        uint64_t hlen, fsize;
        if ((rc = h3_st_read_header(st->files[f].path, &hdr, &hlen, &fsize))) return rc;
        hash_u64(&h, hlen);
        h3_sha256_update(&h, hdr, (size_t)hlen);
        free(hdr);
    }
    /* Windows of each quantised weight's stored bytes, one descriptor per shard at a time. */
    int fd = -1, fd_file = -1;
    for (int i = 0; i < n && !rc; i++) {
        const h3_tensor *x = h3_store_find(st, it[i].name);
        if (!x) {
            rc = h3_err(H3_E_SCHEMA, "%s: tensor '%s' is missing", t->weights_dir, it[i].name);
            break;
        }
        const h3_st_file *f = &st->files[x->file];
        if (x->file != fd_file) {
            if (fd >= 0) close(fd);
            fd_file = x->file;
            if ((fd = open(f->path, O_RDONLY | O_CLOEXEC)) < 0) {
                rc = h3_err(H3_E_IO, "%s: cannot open: %s", f->path, strerror(errno));
                break;
            }
        }
        h3_sha256_update(&h, it[i].name, strlen(it[i].name) + 1);
        const uint64_t span = x->end - x->begin, w = span < IDENTITY_WINDOW ? span : IDENTITY_WINDOW;
        const uint64_t at[3] = {0, span / 2 - w / 2, span - w};
        for (int k = 0; k < 3 && !rc; k++) rc = hash_span(&h, fd, f->path, f->data_off + x->begin + at[k], w);
    }
    if (fd >= 0) close(fd);
    if (!rc) h3_sha256_hex(&h, hex);
    return rc;
}

int h3_fp8file_write(h3_model *m, h3_pool *pool, const char *path, bool overwrite, h3_progress_fn fn, void *user)
{
    fp8_item *it;
    int n;
    int rc = fp8_items(m, &it, &n);
    if (rc) return rc;
    char identity[65];
    if ((rc = model_identity(m, it, n, identity))) {
        free(it);
        return rc;
    }
    h3_st_entry *e = h3_calloc((size_t)n * 2, sizeof *e);
    char (*scale_names)[sizeof it->name + sizeof SCALE_SUFFIX] = h3_calloc((size_t)n, sizeof *scale_names);
    int64_t max_rows = 0, max_elems = 0;
    for (int i = 0; e && scale_names && i < n; i++) {
        snprintf(scale_names[i], sizeof scale_names[i], "%s" SCALE_SUFFIX, it[i].name);
        e[2 * i] = (h3_st_entry){it[i].name, H3_DT_F8_E4M3, 2, {it[i].rows, it[i].cols}};
        e[2 * i + 1] = (h3_st_entry){scale_names[i], H3_DT_F32, 1, {it[i].rows}};
        if (it[i].rows > max_rows) max_rows = it[i].rows;
        if (it[i].rows * it[i].cols > max_elems) max_elems = it[i].rows * it[i].cols;
    }
    uint8_t *q = e && scale_names ? h3_malloc((size_t)max_elems) : NULL;
    float *s = q ? h3_malloc(sizeof(float) * (size_t)max_rows) : NULL;
    const char *const meta[][2] = {{"h3ctl.format", H3_FP8FILE_FORMAT},
                                   {"h3ctl.precision", "fp8"},
                                   {"h3ctl.identity", identity},
                                   {"h3ctl.partition", m->partition ? m->partition : ""}};
    h3_st_writer w = {.fd = -1};
    h3_store *st = &m->comp[H3_COMP_TRANSFORMER].store;
    rc = s ? h3_st_writer_open(&w, path, overwrite, e, (size_t)n * 2, meta, sizeof meta / sizeof *meta)
           : -H3_E_NOMEM;
    if (!rc) rc = h3_progress_check(fn, user, "quantize", 0, n);
    for (int i = 0; i < n && !rc; i++) {
        const int64_t shape[2] = {it[i].rows, it[i].cols};
        h3_dtype dt;
        const void *src = h3_store_get_float(st, it[i].name, 2, shape, &dt);
        rc = src ? h3_fp8_quantize(pool, src, dt, it[i].rows, it[i].cols, q, s) : -H3_E_SCHEMA;
        /* The source pages are read once: let them go, so a 42 GiB checkpoint does not fill memory. */
        h3_store_release_tensor(st, it[i].name);
        if (!rc) rc = h3_st_writer_write(&w, q, (size_t)(it[i].rows * it[i].cols));
        if (!rc) rc = h3_st_writer_write(&w, s, sizeof(float) * (size_t)it[i].rows);
        if (!rc) rc = h3_progress_check(fn, user, "quantize", i + 1, n);
    }
    if (!rc) rc = h3_st_writer_commit(&w);
    if (rc) h3_st_writer_abort(&w);
    free(q);
    free(s);
    free(scale_names);
    free(e);
    free(it);
    return rc;
}

/* The file's __metadata__ value for `key` ("" when absent); the header is parsed into doc. */
static const char *meta_str(const h3_json *doc, const char *key)
{
    const h3j *v = h3j_path(doc, h3j_root(doc), "__metadata__", key, NULL);
    return v && v->type == H3J_STR ? h3j_str(doc, v) : "";
}

static int check_tensor(h3_fp8file *f, const char *name, h3_dtype dt, int ndim, int64_t rows, int64_t cols)
{
    const h3_tensor *t = h3_store_find(&f->st, name);
    if (!t) return h3_err(H3_E_SCHEMA, "%s: tensor '%s' is missing (the file is incomplete)", f->path, name);
    if (t->dtype != dt || t->ndim != ndim || t->shape[0] != rows || (ndim == 2 && t->shape[1] != cols)) {
        char want[64];
        if (ndim == 2)
            snprintf(want, sizeof want, "%s [%lld, %lld]", h3_dtype_name(dt), (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "%s [%lld]", h3_dtype_name(dt), (long long)rows);
        return h3_err(H3_E_SCHEMA, "%s: tensor '%s' is %s with %d dimensions, the model needs %s", f->path, name,
                      h3_dtype_name(t->dtype), t->ndim, want);
    }
    return 0;
}

static int check_file(h3_model *m, h3_fp8file *f)
{
    char *hdr;
    uint64_t hlen, fsize;
    /* The store checks the whole header against the file's size first: a truncated file stops here. */
    int rc = h3_store_add_file(&f->st, f->path);
    if (!rc) rc = h3_st_read_header(f->path, &hdr, &hlen, &fsize);
    if (rc) return rc;
    h3_json doc;
    rc = h3_json_parse(&doc, hdr, (size_t)hlen);
    free(hdr);
    if (rc) return rc;
    const char *format = meta_str(&doc, "h3ctl.format"), *prec = meta_str(&doc, "h3ctl.precision");
    fp8_item *it = NULL;
    int n = 0;
    char mine[65];
    if (strcmp(format, H3_FP8FILE_FORMAT) != 0)
        rc = h3_err(H3_E_FORMAT, "%s: not an h3ctl fp8 weights file (format '%s', expected '%s'; write one with "
                    "`h3ctl quantize`)", f->path, format, H3_FP8FILE_FORMAT);
    else if (strcmp(prec, "fp8") != 0)
        rc = h3_err(H3_E_FORMAT, "%s: holds weights of precision '%s', not fp8", f->path, prec);
    else if (!(rc = fp8_items(m, &it, &n)) && !(rc = model_identity(m, it, n, mine)) &&
             strcmp(meta_str(&doc, "h3ctl.identity"), mine) != 0) {
        const char *theirs = meta_str(&doc, "h3ctl.identity"), *part = meta_str(&doc, "h3ctl.partition");
        rc = h3_err(H3_E_INVALID, "%s: quantised from another checkpoint (identity %.12s, %s) than this model's "
                    "transformer (%.12s, %s): run `h3ctl quantize` on this model again", f->path,
                    *theirs ? theirs : "none", *part ? part : "?", mine, m->partition ? m->partition : "?");
    }
    for (int i = 0; i < n && !rc; i++) {
        char sname[sizeof it->name + sizeof SCALE_SUFFIX];
        snprintf(sname, sizeof sname, "%s" SCALE_SUFFIX, it[i].name);
        if (!(rc = check_tensor(f, it[i].name, H3_DT_F8_E4M3, 2, it[i].rows, it[i].cols)))
            rc = check_tensor(f, sname, H3_DT_F32, 1, it[i].rows, 0);
    }
    if (!rc && f->st.ntensors != (size_t)n * 2)
        rc = h3_err(H3_E_SCHEMA, "%s: holds %zu tensors, the model's fp8 weights are %d (with their scales)", f->path,
                    f->st.ntensors, n * 2);
    free(it);
    h3_json_free(&doc);
    return rc;
}

int h3_fp8file_open(h3_model *m, const char *path, h3_fp8file **out)
{
    *out = NULL;
    if (!path || !*path) return h3_err(H3_E_INVALID, "no quantized weights file given");
    h3_fp8file *f = h3_calloc(1, sizeof *f);
    if (!f || !(f->path = h3_strdup(path))) {
        free(f);
        return -H3_E_NOMEM;
    }
    int rc = check_file(m, f);
    if (rc) {
        h3_fp8file_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

void h3_fp8file_close(h3_fp8file *f)
{
    if (!f) return;
    h3_store_close(&f->st);
    free(f->path);
    free(f);
}

int h3_fp8file_get(h3_fp8file *f, const char *name, int64_t rows, int64_t cols, const uint8_t **q,
                   const float **scale)
{
    char sname[160];
    snprintf(sname, sizeof sname, "%s" SCALE_SUFFIX, name);
    const int64_t shape[2] = {rows, cols};
    *q = h3_store_get(&f->st, name, H3_DT_F8_E4M3, 2, shape);
    *scale = *q ? h3_store_get(&f->st, sname, H3_DT_F32, 1, shape) : NULL;
    return *scale ? 0 : -H3_E_SCHEMA;
}

void h3_fp8file_release(h3_fp8file *f, const char *name)
{
    char sname[160];
    snprintf(sname, sizeof sname, "%s" SCALE_SUFFIX, name);
    h3_store_release_tensor(&f->st, name);
    h3_store_release_tensor(&f->st, sname);
}
