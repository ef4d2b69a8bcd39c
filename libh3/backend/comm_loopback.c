/*
 * The loopback communicator (backend/comm.h): the ranks of one group are threads of one process and
 * their buffers are host memory, so a collective is "post my buffers, wait for everyone, copy what
 * is mine from the others' buffers, wait again" (the second wait keeps a sender's buffers alive
 * until every reader is done). The data a rank receives is the bytes another rank's code produced,
 * as NCCL would deliver them: the sequence-parallel transformer runs its real exchange here, and CI
 * checks it bit for bit against one device at several world sizes.
 *
 * The barrier is a mutex and a condition variable (macOS has no pthread_barrier_t).
 */
#include "backend/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const h3_comm_piece *pieces;
    int n;
    const void *send;
    void *buf;
} lb_post;

typedef struct {
    int world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    uint64_t gen;
    int aborted; /* the rank that gave up + 1, or 0 */
    atomic_int refs;
    lb_post post[H3_COMM_MAX_WORLD];
} lb_group;

/* 0 once every rank arrived; -1 when a rank aborted the group before they all did. */
static int lb_wait(h3_comm *c)
{
    lb_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    const uint64_t gen = g->gen;
    if (!g->aborted && ++g->waiting == g->world) {
        g->waiting = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    }
    const int rc = g->gen == gen ? -1 : 0; /* released by the abort, not by the last arrival */
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* The error of a collective the group's abort stopped. */
static int lb_stopped(h3_comm *c)
{
    lb_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    const int ab = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return h3_err(H3_E_IO, "loopback rank %d: rank %d of %d failed, the group stopped", c->rank, ab - 1, c->world);
}

static void lb_abort(h3_comm *c)
{
    lb_group *g = c->impl;
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) g->aborted = c->rank + 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* The k-th piece of `post` that sends to rank `to` (pieces of 0 bytes are not messages). */
static const h3_comm_piece *kth_send(const lb_post *post, int to, int k)
{
    for (int i = 0; i < post->n; i++)
        if (post->pieces[i].peer == to && post->pieces[i].send_bytes && k-- == 0) return &post->pieces[i];
    return NULL;
}

static int lb_exchange(h3_comm *c, const h3_comm_piece *p, int n)
{
    lb_group *g = c->impl;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        if (p[i].peer < 0 || p[i].peer >= c->world || p[i].peer == c->rank)
            rc = h3_err(H3_E_INVALID, "loopback rank %d: all-to-all piece %d names rank %d of %d", c->rank, i,
                        p[i].peer, c->world);
    if (rc) {
        lb_abort(c); /* the others stop instead of waiting for pieces that will not come */
        return rc;
    }
    g->post[c->rank] = (lb_post){p, n, NULL, NULL};
    if (lb_wait(c)) return lb_stopped(c);
    int seen[H3_COMM_MAX_WORLD] = {0};
    for (int i = 0; i < n && !rc; i++) {
        if (!p[i].recv_bytes) continue;
        const int q = p[i].peer;
        const h3_comm_piece *s = kth_send(&g->post[q], c->rank, seen[q]++);
        if (!s || s->send_bytes != p[i].recv_bytes)
            rc = h3_err(H3_E_INVALID, "loopback rank %d: expected %zu bytes from rank %d, it sends %zu", c->rank,
                        p[i].recv_bytes, q, s ? s->send_bytes : 0);
        else
            memcpy(p[i].recv, s->send, s->send_bytes);
    }
    if (rc) lb_abort(c);
    if (lb_wait(c) && !rc) rc = lb_stopped(c);
    if (!rc) {
        c->stats.a2a_calls++;
        for (int i = 0; i < n; i++) c->stats.a2a_bytes += p[i].send_bytes;
    }
    return rc;
}

static int lb_all_gather(h3_comm *c, const void *send, void *recv, size_t bytes)
{
    lb_group *g = c->impl;
    g->post[c->rank] = (lb_post){NULL, 0, send, NULL};
    if (lb_wait(c)) return lb_stopped(c);
    for (int r = 0; r < c->world; r++) {
        char *dst = (char *)recv + (size_t)r * bytes;
        if (bytes && dst != g->post[r].send) memcpy(dst, g->post[r].send, bytes);
    }
    if (lb_wait(c)) return lb_stopped(c);
    c->stats.gather_calls++;
    c->stats.gather_bytes += (uint64_t)bytes * (uint64_t)(c->world - 1);
    return 0;
}

static int lb_broadcast(h3_comm *c, void *buf, size_t bytes, int root)
{
    lb_group *g = c->impl;
    if (root < 0 || root >= c->world) return h3_err(H3_E_INVALID, "loopback: broadcast from rank %d of %d", root, c->world);
    g->post[c->rank] = (lb_post){NULL, 0, NULL, buf};
    if (lb_wait(c)) return lb_stopped(c);
    if (c->rank != root && bytes && buf != g->post[root].buf) memcpy(buf, g->post[root].buf, bytes);
    if (lb_wait(c)) return lb_stopped(c);
    c->stats.bcast_calls++;
    if (c->rank == root) c->stats.bcast_bytes += (uint64_t)bytes * (uint64_t)(c->world - 1);
    return 0;
}

static int lb_barrier(h3_comm *c)
{
    if (lb_wait(c)) return lb_stopped(c);
    c->stats.barriers++;
    return 0;
}

static void lb_destroy(h3_comm *c)
{
    lb_group *g = c->impl;
    if (atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
    }
    free(c);
}

static const h3_comm_ops lb_ops = {lb_exchange, lb_all_gather, lb_broadcast, lb_barrier, lb_abort, lb_destroy};

int h3_comm_loopback_create(int world, h3_comm **out)
{
    if (world < 1 || world > H3_COMM_MAX_WORLD)
        return h3_err(H3_E_INVALID, "loopback: %d ranks (1 to %d)", world, H3_COMM_MAX_WORLD);
    lb_group *g = h3_calloc(1, sizeof *g);
    if (!g) return -H3_E_NOMEM;
    g->world = world;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    atomic_init(&g->refs, 0);
    for (int r = 0; r < world; r++) {
        h3_comm *c = h3_calloc(1, sizeof *c);
        if (!c) {
            for (int k = 0; k < r; k++) lb_destroy(out[k]);
            if (!r) free(g);
            return -H3_E_NOMEM;
        }
        *c = (h3_comm){&lb_ops, "loopback", r, world, {0}, g};
        atomic_fetch_add(&g->refs, 1);
        out[r] = c;
    }
    return 0;
}
