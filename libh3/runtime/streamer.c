/*
 * The block streamer (streamer.h): pread of weight spans into a ring of host slots by one reader
 * thread, the consumer computing on item n while the reader fills n + 1.
 */
#include "runtime/streamer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_SLOTS 8

struct h3_streamer {
    const h3_store *s;
    int *fd;                /* per shard, -1 when the streamer reads nothing from it */
    int items;
    h3_stream_read *reads;  /* all items' reads, item i from first[i] */
    int *first, *count;
    char what[64];
    uint8_t *slot[ST_MAX_SLOTS];
    int nslots;
    size_t slot_bytes;
    /* the pass: the reader may read position k once k < done + nslots (the slot it reuses held
       position k - nslots, which the consumer is done with) */
    int *seq, n, cap;
    int next_read;          /* positions completely read */
    int got, done;          /* positions handed to the consumer / released by it */
    bool busy;              /* the reader is inside a read (begin waits for it) */
    uint64_t gen;           /* bumped by begin: a read of an abandoned pass is discarded */
    int err;                /* H3_E_* of a failed read of this pass (0: none) */
    char msg[512];
    pthread_t th;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int stop;
    _Atomic uint64_t bytes;
};

/* `len` bytes of tensor t to dst, in 64 MiB pieces so that a close stops the reader soon. */
static int read_span(const h3_streamer *st, const h3_tensor *t, uint8_t *dst)
{
    const h3_st_file *sf = &st->s->files[t->file];
    const uint64_t len = t->end - t->begin, pos = sf->data_off + t->begin, piece = 64ull << 20;
    uint64_t done = 0;
    while (done < len) {
        if (atomic_load_explicit(&st->stop, memory_order_relaxed))
            return h3_err(H3_E_CANCELLED, "%s: read of '%s' stopped", st->what, h3_tensor_name(st->s, t));
        const size_t want = (size_t)(len - done < piece ? len - done : piece);
        const ssize_t r = pread(st->fd[t->file], dst + done, want, (off_t)(pos + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return h3_err(H3_E_IO, "%s: cannot read tensor '%s' (%llu bytes at offset %llu): %s", sf->path,
                          h3_tensor_name(st->s, t), (unsigned long long)len, (unsigned long long)(pos + done),
                          r < 0 ? strerror(errno) : "file truncated");
        done += (uint64_t)r;
    }
    return 0;
}

static int read_item(h3_streamer *st, int item, uint8_t *slot)
{
    for (int i = 0; i < st->count[item]; i++) {
        const h3_stream_read *rd = &st->reads[st->first[item] + i];
        int rc = read_span(st, rd->t, slot + rd->dst);
        if (rc) return rc;
        atomic_fetch_add(&st->bytes, rd->t->end - rd->t->begin);
    }
    return 0;
}

static void *reader_main(void *arg)
{
    h3_streamer *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (!atomic_load(&st->stop) &&
               (st->err || st->next_read >= st->n || st->next_read >= st->done + st->nslots))
            pthread_cond_wait(&st->cv, &st->mu);
        if (atomic_load(&st->stop)) break;
        const int k = st->next_read, item = st->seq[k];
        const uint64_t gen = st->gen;
        st->busy = true;
        pthread_mutex_unlock(&st->mu);
        int rc = read_item(st, item, st->slot[k % st->nslots]);
        pthread_mutex_lock(&st->mu);
        st->busy = false;
        if (gen == st->gen) {
            if (rc) {
                /* h3_err's message lives in this thread's storage: hand it to the consumer. */
                st->err = -rc;
                snprintf(st->msg, sizeof st->msg, "%s", h3_last_error());
            } else {
                st->next_read = k + 1;
            }
        }
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

void h3_streamer_close(h3_streamer *st)
{
    if (!st) return;
    if (st->running) {
        pthread_mutex_lock(&st->mu);
        atomic_store(&st->stop, 1);
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->th, NULL);
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
    }
    if (st->fd)
        for (int i = 0; i < st->s->nfiles; i++)
            if (st->fd[i] >= 0) close(st->fd[i]);
    for (int i = 0; i < st->nslots; i++) h3_free_aligned(st->slot[i]);
    free(st->fd);
    free(st->reads);
    free(st->first);
    free(st->count);
    free(st->seq);
    free(st);
}

int h3_streamer_open(const h3_store *s, int items, const h3_stream_read *const *reads, const int *n_reads,
                     size_t slot_bytes, int slots, const char *what, h3_streamer **out)
{
    *out = NULL;
    if (items < 1 || slots < 1 || slots > ST_MAX_SLOTS)
        return h3_err(H3_E_INVALID, "%s: a streamer of %d items and %d slots", what, items, slots);
    h3_streamer *st = h3_calloc(1, sizeof *st);
    if (!st) return -H3_E_NOMEM;
    st->s = s;
    st->items = items;
    st->nslots = slots;
    st->slot_bytes = slot_bytes;
    snprintf(st->what, sizeof st->what, "%s", what);
    atomic_init(&st->stop, 0);
    atomic_init(&st->bytes, 0);
    int total = 0;
    for (int i = 0; i < items; i++) total += n_reads[i];
    st->fd = h3_malloc(sizeof *st->fd * (size_t)(s->nfiles ? s->nfiles : 1));
    st->reads = h3_malloc(sizeof *st->reads * (size_t)(total ? total : 1));
    st->first = h3_malloc(sizeof *st->first * (size_t)items);
    st->count = h3_malloc(sizeof *st->count * (size_t)items);
    st->seq = h3_malloc(sizeof *st->seq * (size_t)items);
    st->cap = items;
    if (!st->fd || !st->reads || !st->first || !st->count || !st->seq) {
        free(st->fd);
        st->fd = NULL;
        h3_streamer_close(st);
        return -H3_E_NOMEM;
    }
    for (int i = 0; i < s->nfiles; i++) st->fd[i] = -1;
    int rc = 0;
    for (int i = 0, k = 0; i < items; i++) {
        st->first[i] = k;
        st->count[i] = n_reads[i];
        for (int j = 0; j < n_reads[i]; j++, k++) {
            st->reads[k] = reads[i][j];
            const h3_tensor *t = reads[i][j].t;
            if (reads[i][j].dst + (t->end - t->begin) > slot_bytes) {
                rc = h3_err(H3_E_INVALID, "%s: tensor '%s' does not fit its slot", what, h3_tensor_name(s, t));
                break;
            }
            if (st->fd[t->file] >= 0) continue;
            /* Own descriptors: the store may close its own, and the reader must not race it. */
            const h3_st_file *sf = &s->files[t->file];
            int fd = open(sf->path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                rc = h3_err(H3_E_IO, "%s: cannot open: %s", sf->path, strerror(errno));
                break;
            }
            st->fd[t->file] = fd;
            struct stat sb;
            if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != sf->size) {
                rc = h3_err(H3_E_IO, "%s: file changed size since its header was read", sf->path);
                break;
            }
        }
        if (rc) break;
    }
    for (int i = 0; !rc && i < slots; i++)
        if (!(st->slot[i] = h3_alloc_aligned(slot_bytes ? slot_bytes : 64)))
            rc = h3_err(H3_E_NOMEM, "%s: out of memory for a streaming slot of %.1f MiB", what,
                        (double)slot_bytes / (1024.0 * 1024.0));
    if (!rc && slots > 1) {
        pthread_mutex_init(&st->mu, NULL);
        pthread_cond_init(&st->cv, NULL);
        if (pthread_create(&st->th, NULL, reader_main, st) != 0) {
            pthread_mutex_destroy(&st->mu);
            pthread_cond_destroy(&st->cv);
            rc = h3_err(H3_E_NOMEM, "%s: cannot start the reader thread", what);
        } else {
            st->running = true;
        }
    }
    if (rc) {
        h3_streamer_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int h3_streamer_begin(h3_streamer *st, const int *seq, int n)
{
    if (n < 0) return h3_err(H3_E_INVALID, "%s: a pass of %d items", st->what, n);
    for (int i = 0; i < n; i++)
        if (seq[i] < 0 || seq[i] >= st->items)
            return h3_err(H3_E_INVALID, "%s: item %d of %d", st->what, seq[i], st->items);
    if (st->running) {
        pthread_mutex_lock(&st->mu);
        /* A read of the previous pass may still be writing into a slot. */
        while (st->busy) pthread_cond_wait(&st->cv, &st->mu);
    }
    if (n > st->cap) { /* under the lock: the reader reads seq only while holding it */
        int *ns = h3_realloc(st->seq, sizeof *ns * (size_t)n);
        if (!ns) {
            if (st->running) pthread_mutex_unlock(&st->mu);
            return -H3_E_NOMEM;
        }
        st->seq = ns;
        st->cap = n;
    }
    memcpy(st->seq, seq, sizeof *seq * (size_t)n);
    st->n = n;
    st->next_read = st->got = st->done = 0;
    st->err = 0;
    st->gen++;
    if (st->running) {
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
    }
    return 0;
}

int h3_streamer_get(h3_streamer *st, const uint8_t **buf)
{
    if (st->got >= st->n) return h3_err(H3_E_INVALID, "%s: every item of the pass was read", st->what);
    if (!st->running) {
        int rc = read_item(st, st->seq[st->got], st->slot[0]);
        if (rc) return rc;
        *buf = st->slot[0];
        st->got++;
        return 0;
    }
    pthread_mutex_lock(&st->mu);
    while (st->next_read <= st->got && !st->err) pthread_cond_wait(&st->cv, &st->mu);
    const int err = st->next_read <= st->got ? st->err : 0;
    if (!err) *buf = st->slot[st->got++ % st->nslots];
    pthread_mutex_unlock(&st->mu);
    return err ? h3_err(err, "%s", st->msg) : 0;
}

void h3_streamer_done(h3_streamer *st)
{
    if (!st->running) {
        st->done++;
        return;
    }
    pthread_mutex_lock(&st->mu);
    if (st->done < st->got) st->done++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

uint64_t h3_streamer_bytes(const h3_streamer *st) { return atomic_load(&((h3_streamer *)st)->bytes); }
