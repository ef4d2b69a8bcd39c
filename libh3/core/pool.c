/*
 * Persistent worker pool. The caller participates as thread 0; chunks are handed out through
 * an atomic counter, so load balances itself while outputs stay independent of which thread
 * computed them (tasks write disjoint outputs and never split a reduction).
 */
#include "core/host.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct h3_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t gen;
    int active;
    bool stop;
    /* current job */
    h3_task_fn fn;
    void *arg;
    int64_t items, chunk;
    atomic_llong next;
    atomic_ullong gen_seen; /* lets idle workers spin briefly before sleeping */
    void *scratch[256][H3_SCRATCH_SLOTS];
    size_t scratch_n[256][H3_SCRATCH_SLOTS];
};

static _Thread_local int tl_in_task;

typedef struct {
    h3_pool *p;
    int idx;
} worker_arg;

static void run_chunks(h3_pool *p, int thread)
{
    tl_in_task = 1;
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->items) break;
        int64_t e = b + p->chunk < p->items ? b + p->chunk : p->items;
        p->fn(p->arg, b, e, thread);
    }
    tl_in_task = 0;
}

static void *worker_main(void *a)
{
    worker_arg *wa = a;
    h3_pool *p = wa->p;
    int idx = wa->idx;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        /* Short spin: back-to-back kernels dispatch every few tens of microseconds. */
        for (int spin = 0; spin < 2000; spin++) {
            if (atomic_load_explicit(&p->gen_seen, memory_order_acquire) != seen) break;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        pthread_mutex_lock(&p->mu);
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, idx);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

h3_pool *h3_pool_create(int threads)
{
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    h3_pool *p = h3_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (threads > 1) {
        p->th = h3_calloc((size_t)threads, sizeof *p->th);
        if (!p->th) {
            h3_pool_destroy(p);
            return NULL;
        }
        for (int i = 1; i < threads; i++) {
            worker_arg *wa = h3_malloc(sizeof *wa);
            if (!wa) {
                p->n = i;
                h3_pool_destroy(p);
                return NULL;
            }
            wa->p = p;
            wa->idx = i;
            if (pthread_create(&p->th[i], NULL, worker_main, wa) != 0) {
                free(wa);
                p->n = i;
                h3_pool_destroy(p);
                h3_err(H3_E_NOMEM, "cannot start worker thread %d", i);
                return NULL;
            }
        }
    }
    return p;
}

void h3_pool_destroy(h3_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    for (int i = 0; i < 256; i++)
        for (int s = 0; s < H3_SCRATCH_SLOTS; s++) h3_free_aligned(p->scratch[i][s]);
    free(p->th);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int h3_pool_threads(const h3_pool *p) { return p ? p->n : 1; }

void h3_parallel_for(h3_pool *p, int64_t n, int64_t grain, h3_task_fn fn, void *arg)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n == 1 || tl_in_task || n <= grain) {
        fn(arg, 0, n, 0);
        return;
    }
    /* About sixteen chunks per thread: on a shared machine a worker can lose its core for a
       scheduler slice while holding a chunk, and the others then wait for it at the end; small
       chunks bound that tail. One atomic add per chunk is noise next to any chunk's work. */
    int64_t chunk = (n + (int64_t)p->n * 16 - 1) / ((int64_t)p->n * 16);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->items = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->active = p->n - 1;
    p->gen++;
    atomic_store_explicit(&p->gen_seen, p->gen, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void *h3_pool_scratch(h3_pool *p, int thread, int slot, size_t bytes)
{
    void **ptr = &p->scratch[thread][slot];
    size_t *cap = &p->scratch_n[thread][slot];
    if (*cap >= bytes && *ptr) return *ptr;
    h3_free_aligned(*ptr);
    *ptr = h3_alloc_aligned(bytes);
    *cap = *ptr ? bytes : 0;
    return *ptr;
}
