/*
 * safetensors writer (see internal.h): the header is built from the entries, padded with spaces
 * to a multiple of 8 bytes (as the reference implementation pads, so the data area is aligned),
 * and the tensors' bytes follow in entry order. Everything lands in a temporary file in the
 * destination's folder (a rename across folders could cross filesystems) and appears at the
 * destination only when complete and synced.
 */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int exists_error(const char *path)
{
    return h3_err(H3_E_IO, "%s: already exists (pass overwrite / --force to replace it)", path);
}

static int write_all(h3_st_writer *w, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t r = write(w->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return h3_err(H3_E_IO, "%s: cannot write: %s", w->tmp, r < 0 ? strerror(errno) : "no progress");
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static char *header_json(const h3_st_entry *e, size_t n, const char *const (*meta)[2], size_t n_meta,
                         uint64_t *data_bytes)
{
    h3_buf b = {0};
    h3_buf_printf(&b, "{");
    if (n_meta) {
        h3_buf_printf(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < n_meta; i++) {
            h3_buf_printf(&b, "%s", i ? "," : "");
            h3_buf_json_str(&b, meta[i][0]);
            h3_buf_printf(&b, ":");
            h3_buf_json_str(&b, meta[i][1]);
        }
        h3_buf_printf(&b, "}");
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = h3_dtype_size(e[i].dtype);
        h3_buf_printf(&b, "%s", i || n_meta ? "," : "");
        h3_buf_json_str(&b, e[i].name);
        h3_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", h3_dtype_name(e[i].dtype));
        for (int d = 0; d < e[i].ndim; d++) {
            h3_buf_printf(&b, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
            bytes *= (uint64_t)e[i].shape[d];
        }
        h3_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                      (unsigned long long)(off + bytes));
        off += bytes;
    }
    h3_buf_printf(&b, "}");
    while (!b.oom && b.n % 8) h3_buf_printf(&b, " ");
    if (b.oom) {
        h3_buf_free(&b);
        h3_err(H3_E_NOMEM, "out of memory building a safetensors header");
        return NULL;
    }
    *data_bytes = off;
    return b.p;
}

int h3_st_writer_open(h3_st_writer *w, const char *path, bool overwrite, const h3_st_entry *entries, size_t n,
                      const char *const (*meta)[2], size_t n_meta)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    struct stat st;
    if (!path || !*path) return h3_err(H3_E_INVALID, "no output path");
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return h3_err(H3_E_IO, "%s: is a folder, not a file", path);
        if (!overwrite) return exists_error(path);
    }
    w->overwrite = overwrite;
    w->path = h3_strdup(path);
    /* The temporary file sits beside the destination, hidden, with a unique suffix. */
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (int)(slash - path + 1) : 0;
    w->tmp = h3_asprintf("%.*s.%s.tmp-XXXXXX", dir_len, path, slash ? slash + 1 : path);
    if (!w->path || !w->tmp) {
        h3_st_writer_abort(w);
        return -H3_E_NOMEM;
    }
    w->fd = mkstemp(w->tmp);
    if (w->fd < 0) {
        int rc = h3_err(H3_E_IO, "%s: cannot create a file in its folder: %s", path, strerror(errno));
        free(w->tmp); /* nothing was created: nothing to remove */
        w->tmp = NULL;
        h3_st_writer_abort(w);
        return rc;
    }
    /* mkstemp makes the file private (0600); the result is an ordinary readable file. */
    (void)fchmod(w->fd, 0644);
    char *hdr = header_json(entries, n, meta, n_meta, &w->data_bytes);
    if (!hdr) {
        h3_st_writer_abort(w);
        return -H3_E_NOMEM;
    }
    const uint64_t hlen = strlen(hdr);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen >> (8 * i));
    int rc = write_all(w, len8, 8);
    if (!rc) rc = write_all(w, hdr, (size_t)hlen);
    free(hdr);
    if (rc) h3_st_writer_abort(w);
    return rc;
}

int h3_st_writer_write(h3_st_writer *w, const void *data, size_t bytes)
{
    if (w->written + bytes > w->data_bytes)
        return h3_err(H3_E_INVALID, "%s: %llu bytes written past the %llu the header declares", w->path,
                      (unsigned long long)(w->written + bytes), (unsigned long long)w->data_bytes);
    int rc = write_all(w, data, bytes);
    if (!rc) w->written += bytes;
    return rc;
}

int h3_st_writer_commit(h3_st_writer *w)
{
    if (w->written != w->data_bytes)
        return h3_err(H3_E_INVALID, "%s: %llu of the %llu data bytes were written", w->path,
                      (unsigned long long)w->written, (unsigned long long)w->data_bytes);
    if (fsync(w->fd) != 0) return h3_err(H3_E_IO, "%s: cannot sync: %s", w->tmp, strerror(errno));
    const int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) return h3_err(H3_E_IO, "%s: cannot close: %s", w->tmp, strerror(errno));
    if (w->overwrite) {
        if (rename(w->tmp, w->path) != 0)
            return h3_err(H3_E_IO, "%s: cannot move the finished file into place: %s", w->path, strerror(errno));
    } else {
        /* link() fails rather than replace a file that appeared meanwhile. A filesystem without
           hard links (FAT, some network mounts) gets the check and a rename instead. */
        struct stat st;
        if (link(w->tmp, w->path) == 0) {
            unlink(w->tmp);
        } else {
            const int e = errno;
            const bool no_links = e == EPERM || e == EOPNOTSUPP || e == ENOSYS;
            if (e == EEXIST || (no_links && stat(w->path, &st) == 0)) return exists_error(w->path);
            if (!no_links || rename(w->tmp, w->path) != 0)
                return h3_err(H3_E_IO, "%s: cannot move the finished file into place: %s", w->path,
                              strerror(no_links ? errno : e));
        }
    }
    free(w->tmp);
    w->tmp = NULL;
    free(w->path);
    w->path = NULL;
    return 0;
}

void h3_st_writer_abort(h3_st_writer *w)
{
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp) unlink(w->tmp);
    free(w->tmp);
    w->tmp = NULL;
    free(w->path);
    w->path = NULL;
}
