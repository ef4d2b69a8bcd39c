/* Errors, allocation, paths and small string helpers shared by every stage. */
#define _GNU_SOURCE
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One message per thread: a ctypes caller reads it right after the failing call returns. */
static _Thread_local char g_err[1024];

H3_API const char *h3_last_error(void) { return g_err; }

H3_API const char *h3_version(void) { return "0.1.0"; }

int h3_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    /* A message is one line: callers print it verbatim after "error: ". */
    for (char *p = g_err; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return -code;
}

void h3_err_prefix(const char *fmt, ...)
{
    char head[512], old[sizeof g_err];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, g_err, sizeof old);
    /* Truncation is acceptable: the head names the file, the tail keeps the cause. */
    size_t hl = strlen(head);
    if (hl > sizeof g_err - 3) hl = sizeof g_err - 3;
    memcpy(g_err, head, hl);
    g_err[hl] = ':';
    g_err[hl + 1] = ' ';
    size_t room = sizeof g_err - hl - 3;
    size_t ol = strlen(old);
    if (ol > room) ol = room;
    memcpy(g_err + hl + 2, old, ol);
    g_err[hl + 2 + ol] = 0;
}

void h3_err_clear(void) { g_err[0] = 0; }

void *h3_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) h3_err(H3_E_NOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *h3_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) h3_err(H3_E_NOMEM, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *h3_realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) h3_err(H3_E_NOMEM, "out of memory growing a buffer to %zu bytes", n);
    return q;
}

char *h3_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = h3_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void *h3_alloc_aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0) {
        h3_err(H3_E_NOMEM, "out of memory allocating %zu bytes", n);
        return NULL;
    }
    return p;
}

void h3_free_aligned(void *p) { free(p); }

char *h3_asprintf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        h3_err(H3_E_INVALID, "bad format");
        return NULL;
    }
    char *p = h3_malloc((size_t)n + 1);
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

char *h3_path_join(const char *dir, const char *rel)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return h3_asprintf("%.*s/%s", (int)n, dir, rel);
}

bool h3_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool h3_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int h3_read_file(const char *path, char **out, size_t *len, size_t max_len)
{
    *out = NULL;
    /* O_NONBLOCK: a FIFO is refused below instead of blocking the open until a writer comes */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return h3_err(H3_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return h3_err(H3_E_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_len) {
        close(fd);
        return h3_err(H3_E_FORMAT, "%s: file is %lld bytes, more than the %zu allowed", path,
                      (long long)st.st_size, max_len);
    }
    size_t n = (size_t)st.st_size;
    char *buf = h3_malloc(n + 1);
    if (!buf) {
        close(fd);
        return -H3_E_NOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return h3_err(H3_E_IO, "%s: read failed: %s", path, r < 0 ? strerror(e) : "short read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

void h3_buf_printf(h3_buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if ((size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap - b->n <= (size_t)k) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

void h3_buf_json_str(h3_buf *b, const char *s)
{
    h3_buf_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            h3_buf_printf(b, "\\%c", *p);
        else if (*p < 0x20)
            h3_buf_printf(b, "\\u%04x", *p);
        else
            h3_buf_printf(b, "%c", *p);
    }
    h3_buf_printf(b, "\"");
}

void h3_buf_free(h3_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int h3_progress_check(h3_progress_fn fn, void *user, const char *phase, int done, int total)
{
    if (!fn || fn(user, phase, done, total) == 0) return 0;
    return h3_err(H3_E_CANCELLED, "%s: cancelled by the progress callback after %d of %d steps", phase, done,
                  total);
}
