/*
 * The streamer (streamer.h): pread of weight spans into a ring of host slots by one reader
 * thread (and, per item, its helpers), the consumer computing on item n while the reader fills
 * n + 1.
 */
#include "core/streamer.h"

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
#define ST_MAX_READERS 16
/* A piece of a parallel item read: about a quarter of an item per reader, so that the readers
   finish together, within [4 KiB, 32 MiB]. */
#define ST_PIECE_MIN (4ull << 10)
#define ST_PIECE_MAX (32ull << 20)

struct h3_streamer {
    const h3_store *s;
    int *fd;                /* per shard, -1 when the streamer reads nothing from it */
    int items;
    h3_stream_read *reads;  /* all items' reads, item i from first[i] */
    int *first, *count;
    uint64_t *item_bytes;   /* bytes item i reads */
    char what[64];
    uint8_t *slot[ST_MAX_SLOTS];
    bool ext;               /* the slots are the caller's */
    int nslots, readers;
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

/* `len` bytes of tensor t from `skip` bytes into it to dst, in 64 MiB pieces so that a close
   stops the reader soon. */
static int read_span(h3_streamer *st, const h3_tensor *t, uint64_t skip, uint64_t len, uint8_t *dst)
{
    const h3_st_file *sf = &st->s->files[t->file];
    const uint64_t pos = sf->data_off + t->begin + skip, piece = 64ull << 20;
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
    atomic_fetch_add(&st->bytes, len);
    return 0;
}

/* One item read by several threads: each takes the next piece (in read order) until none is left
   or one failed. A piece lands where the sequential read puts it, so the bytes are the same. */
typedef struct {
    h3_streamer *st;
    int item;
    uint8_t *slot;
    uint64_t piece;
    atomic_int next;        /* next piece to read */
    atomic_int failed;      /* set by the first failure: the others stop taking pieces */
    pthread_mutex_t mu;
    int err;
    char msg[512];
} st_par;

/* Piece k of the item: its read and byte range; false past the last piece. */
static bool piece_of(const st_par *p, int k, const h3_stream_read **rd, uint64_t *skip, uint64_t *len)
{
    const h3_streamer *st = p->st;
    for (int i = 0; i < st->count[p->item]; i++) {
        const h3_stream_read *r = &st->reads[st->first[p->item] + i];
        const uint64_t n = r->t->end - r->t->begin, pieces = (n + p->piece - 1) / p->piece;
        if ((uint64_t)k < pieces) {
            *rd = r;
            *skip = (uint64_t)k * p->piece;
            *len = n - *skip < p->piece ? n - *skip : p->piece;
            return true;
        }
        k -= (int)pieces;
    }
    return false;
}

static void *par_main(void *arg)
{
    st_par *p = arg;
    while (!atomic_load(&p->failed)) {
        const h3_stream_read *rd;
        uint64_t skip, len;
        if (!piece_of(p, atomic_fetch_add(&p->next, 1), &rd, &skip, &len)) break;
        int rc = read_span(p->st, rd->t, skip, len, p->slot + rd->dst + skip);
        if (rc) {
            /* h3_err's message lives in this thread's storage: keep the first one. */
            pthread_mutex_lock(&p->mu);
            if (!p->err) {
                p->err = -rc;
                snprintf(p->msg, sizeof p->msg, "%s", h3_last_error());
            }
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->failed, 1);
            break;
        }
    }
    return NULL;
}

static int read_item(h3_streamer *st, int item, uint8_t *slot)
{
    const int readers = st->readers;
    uint64_t piece = st->item_bytes[item] / (4u * (unsigned)readers) / ST_PIECE_MIN * ST_PIECE_MIN;
    piece = piece < ST_PIECE_MIN ? ST_PIECE_MIN : piece > ST_PIECE_MAX ? ST_PIECE_MAX : piece;
    if (readers <= 1 || st->item_bytes[item] <= piece) {
        for (int i = 0; i < st->count[item]; i++) {
            const h3_stream_read *rd = &st->reads[st->first[item] + i];
            int rc = read_span(st, rd->t, 0, rd->t->end - rd->t->begin, slot + rd->dst);
            if (rc) return rc;
        }
        return 0;
    }
    st_par p = {.st = st, .item = item, .slot = slot, .piece = piece};
    atomic_init(&p.next, 0);
    atomic_init(&p.failed, 0);
    pthread_mutex_init(&p.mu, NULL);
    pthread_t th[ST_MAX_READERS - 1];
    int started = 0;
    for (; started < readers - 1; started++)
        if (pthread_create(&th[started], NULL, par_main, &p) != 0) break; /* fewer helpers still finish */
    par_main(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.mu);
    return p.err ? h3_err(p.err, "%s", p.msg) : 0;
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
    if (!st->ext)
        for (int i = 0; i < st->nslots; i++) h3_free_aligned(st->slot[i]);
    free(st->fd);
    free(st->reads);
    free(st->first);
    free(st->count);
    free(st->item_bytes);
    free(st->seq);
    free(st);
}

int h3_streamer_open(const h3_store *s, int items, const h3_stream_read *const *reads, const int *n_reads,
                     size_t slot_bytes, int slots, void *const *ext, int readers, const char *what,
                     h3_streamer **out)
{
    *out = NULL;
    if (items < 1 || slots < 1 || slots > ST_MAX_SLOTS || readers < 1 || readers > ST_MAX_READERS)
        return h3_err(H3_E_INVALID, "%s: a streamer of %d items, %d slots and %d readers (1-%d slots, 1-%d readers)",
                      what, items, slots, readers, ST_MAX_SLOTS, ST_MAX_READERS);
    if (ext)
        for (int i = 0; i < slots; i++)
            if (!ext[i] || ((uintptr_t)ext[i] & 63u))
                return h3_err(H3_E_INVALID, "%s: caller slot %d is NULL or not 64-byte aligned", what, i);
    h3_streamer *st = h3_calloc(1, sizeof *st);
    if (!st) return -H3_E_NOMEM;
    st->s = s;
    st->items = items;
    st->nslots = slots;
    st->readers = readers;
    st->ext = ext != NULL;
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
    st->item_bytes = h3_calloc((size_t)items, sizeof *st->item_bytes);
    st->seq = h3_malloc(sizeof *st->seq * (size_t)items);
    st->cap = items;
    if (!st->fd || !st->reads || !st->first || !st->count || !st->item_bytes || !st->seq) {
        free(st->fd);
        st->fd = NULL;
        h3_streamer_close(st);
        return -H3_E_NOMEM;
    }
    for (int i = 0; i < s->nfiles; i++) st->fd[i] = -1;
    int rc = h3_store_ready(s); /* a single-file source writes its transformed tensors first */
    for (int i = 0, k = 0; !rc && i < items; i++) {
        st->first[i] = k;
        st->count[i] = n_reads[i];
        for (int j = 0; j < n_reads[i]; j++, k++) {
            st->reads[k] = reads[i][j];
            const h3_tensor *t = reads[i][j].t;
            st->item_bytes[i] += t->end - t->begin;
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
        if (!(st->slot[i] = ext ? ext[i] : h3_alloc_aligned(slot_bytes ? slot_bytes : 64)))
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

int h3_streamer_slots(const h3_streamer *st) { return st->nslots; }

int h3_streamer_read(h3_streamer *st, const h3_tensor *t, uint64_t skip, uint64_t len, void *dst)
{
    if (t->file < 0 || t->file >= st->s->nfiles || skip > t->end - t->begin || len > t->end - t->begin - skip)
        return h3_err(H3_E_INVALID, "%s: a read of %llu bytes from %llu outside tensor '%s'", st->what,
                      (unsigned long long)len, (unsigned long long)skip, h3_tensor_name(st->s, t));
    if (st->fd[t->file] < 0) {
        int rr = h3_store_ready(st->s);
        if (rr) return rr;
        /* A shard no item reads: opened here, by the consumer. The reader only uses the
           descriptors opened by h3_streamer_open, so this entry is never shared with it. */
        const h3_st_file *sf = &st->s->files[t->file];
        int fd = open(sf->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return h3_err(H3_E_IO, "%s: cannot open: %s", sf->path, strerror(errno));
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != sf->size) {
            close(fd);
            return h3_err(H3_E_IO, "%s: file changed size since its header was read", sf->path);
        }
        st->fd[t->file] = fd;
    }
    return read_span(st, t, skip, len, dst);
}

uint64_t h3_streamer_bytes(const h3_streamer *st) { return atomic_load(&((h3_streamer *)st)->bytes); }
