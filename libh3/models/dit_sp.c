/*
 * Sequence parallelism of the transformer (Ulysses; docs/multi-gpu.md): the packed sequence of L rows
 * is cut into `world` contiguous slices of ceil(L / world) rows (the last one shorter), and rank r
 * runs every per-row op of the block stack (norms, modulation, the four GEMMs, q/k norm and RoPE,
 * SwiGLU, the gated adds) on its slice only. Attention needs every row: around it, an all-to-all
 * hands each rank the q, k and v of the whole sequence for heads/world of the heads, the rank runs
 * attention over them, and a second all-to-all brings each slice its rows of every head back. After
 * the stack an all-gather gives every rank the whole residual stream, and the rest of the forward
 * (input projections, final norm and heads, the Euler step) runs on each rank as on one device.
 *
 * Exactness: a per-row op gives a row the same bits whatever rows surround it (the CPU GEMM sums a
 * row in the same blocked order at any row count above its few-rows shortcut, checked by
 * tests/c/test_sp.c; the other row ops are per-row by construction) and attention computes each
 * head on its own, so every rank's rows equal one device's to the bit. Modulation tables, RoPE rows
 * and per-row entries are the whole sequence's on every rank; a rank reads its rows of them.
 *
 * Two kinds of group: a process of an NCCL group attaches its communicator (h3_dit_sp_attach) and
 * is one rank; a loopback group (h3_dit_sp_loopback) runs all ranks as threads of this process, each
 * with its own CPU backend, thread pool and buffers (x included: it starts from the same inputs
 * every rank would have computed), which is how CI checks the exchange on a machine without GPUs.
 */
#include "models/dit_internal.h"
#include "backend/comm.h"

#include <pthread.h>

/* The CPU GEMM's few-rows shortcut sums differently (backend/cpu/ops.h): a slice stays above it. */
#define SP_MIN_ROWS 7

struct dit_sp_rank {
    h3_comm *comm;
    int rank;
    int64_t r0, rows;
    dit_exec e;
    /* exchange buffers, backend memory of this rank (activation dtype unless said) */
    void *send;      /* [world][q|k|v][rows][w]: the slice's q/k/v by destination's heads */
    void *qkvf;      /* [q|k|v][L][w]: this rank's heads over the whole sequence */
    void *of;        /* [L][w]: their attention output */
    void *recv;      /* [world][rows][w]: the slice's output rows by source's heads */
    int64_t *d_perm; /* [world * rows]: recv row (g, m) -> ob row m * world + g (ob as [rows * world][w]) */
    float *xg;       /* [world * chunk][H] f32: the all-gather of the residual stream */
    /* a loopback rank's own backend, pool and block buffers (an attached rank uses the handle's) */
    h3_pool *pool;
    h3_backend *be;
    void *own[7];
    /* a rank thread's result */
    int rc;
    char err[512];
    h3_dit *d;
    const dit_plan *p;
    const float *tab;
    int step;
};

struct dit_sp {
    int world;
    bool loopback;
    int n_local;               /* ranks of this process: 1 (attached) or world (loopback) */
    struct dit_sp_rank *rk;    /* [n_local] */
    h3_comm *owned[H3_COMM_MAX_WORLD]; /* the loopback group's communicators */
    int64_t built_L;           /* the sequence the buffers are for (0: none) */
    uint64_t built_gen;
    int64_t chunk;
};

static void rank_free_buffers(h3_dit *d, struct dit_sp_rank *r)
{
    h3_backend *be = r->e.be;
    void *bufs[] = {r->send, r->qkvf, r->of, r->recv, r->d_perm, r->xg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->mem->release(be, bufs[i]);
    r->send = r->qkvf = r->of = r->recv = NULL;
    r->d_perm = NULL;
    r->xg = NULL;
    for (int i = 0; i < 7; i++) {
        if (r->own[i]) be->mem->release(be, r->own[i]);
        r->own[i] = NULL;
    }
    (void)d;
}

void dit_sp_free(h3_dit *d)
{
    struct dit_sp *s = d->sp;
    if (!s) return;
    for (int i = 0; i < s->n_local; i++) {
        struct dit_sp_rank *r = &s->rk[i];
        if (r->e.be) rank_free_buffers(d, r);
        if (r->be) h3_backend_destroy(r->be);
        if (r->pool) h3_pool_destroy(r->pool);
    }
    for (int i = 0; i < s->world && s->loopback; i++) h3_comm_destroy(s->owned[i]);
    free(s->rk);
    free(s);
    d->sp = NULL;
}

/* 0 when `world` ranks can split this model's attention heads, else the refusal (bad input). */
static int check_degree(const h3_dit *d, int world)
{
    const int heads = d->w.c.heads;
    if (world >= 1 && world <= H3_COMM_MAX_WORLD && heads % world == 0) return 0;
    char ok[256] = "";
    size_t n = 0;
    for (int k = 1; k <= heads && k <= H3_COMM_MAX_WORLD && n + 16 < sizeof ok; k++)
        if (heads % k == 0) n += (size_t)snprintf(ok + n, sizeof ok - n, "%s%d", n ? ", " : "", k);
    return h3_err(H3_E_INVALID,
                  "sequence parallel: %d ranks do not divide the model's %d attention heads (ranks that do: %s)",
                  world, heads, ok);
}

static int sp_new(h3_dit *d, int world, bool loopback, int n_local)
{
    dit_sp_free(d);
    struct dit_sp *s = h3_calloc(1, sizeof *s);
    if (!s) return -H3_E_NOMEM;
    s->rk = h3_calloc((size_t)n_local, sizeof *s->rk);
    if (!s->rk) {
        free(s);
        return -H3_E_NOMEM;
    }
    s->world = world;
    s->loopback = loopback;
    s->n_local = n_local;
    d->sp = s;
    return 0;
}

int h3_dit_sp_loopback(h3_dit *d, int world, int threads)
{
    if (world < 1) {
        dit_sp_free(d);
        return 0;
    }
    int rc = check_degree(d, world);
    if (rc) return rc;
    if (!d->be->is_host || strcmp(d->be->name, "cpu") != 0)
        return h3_err(H3_E_UNSUPPORTED, "sequence parallel: loopback ranks run on the cpu backend only (this is %s)",
                      d->be->name);
    if (d->ws.n_streamed > 0)
        return h3_err(H3_E_UNSUPPORTED, "sequence parallel: loopback ranks do not run streamed transformer blocks");
    if ((rc = sp_new(d, world, true, world))) return rc;
    struct dit_sp *s = d->sp;
    if ((rc = h3_comm_loopback_create(world, s->owned))) {
        free(s->rk);
        free(s);
        d->sp = NULL;
        return rc;
    }
    const int per = threads / world > 1 ? threads / world : 1;
    for (int r = 0; r < world && !rc; r++) {
        struct dit_sp_rank *k = &s->rk[r];
        k->comm = s->owned[r];
        k->rank = r;
        if (!(k->pool = h3_pool_create(per))) rc = -H3_E_NOMEM;
        if (!rc) rc = h3_backend_cpu_create(k->pool, &k->be);
        if (!rc) k->e.be = k->be;
    }
    if (rc) dit_sp_free(d);
    return rc;
}

int h3_dit_sp_attach(h3_dit *d, h3_comm *comm)
{
    if (!comm) {
        dit_sp_free(d);
        return 0;
    }
    int rc = check_degree(d, comm->world);
    if (rc) return rc;
    if (comm->rank < 0 || comm->rank >= comm->world)
        return h3_err(H3_E_INVALID, "sequence parallel: rank %d of %d", comm->rank, comm->world);
    if ((rc = sp_new(d, comm->world, false, 1))) return rc;
    d->sp->rk[0].comm = comm;
    d->sp->rk[0].rank = comm->rank;
    d->sp->rk[0].e.be = d->be;
    return 0;
}

int h3_dit_sp_world(const h3_dit *d) { return d->sp ? d->sp->world : 1; }

/* A rank's buffers for the current layout. */
static int rank_build(h3_dit *d, struct dit_sp_rank *r, int64_t L, int64_t chunk, int world)
{
    h3_backend *be = r->e.be;
    const int64_t H = d->w.c.hidden, A = d->w.A, F = d->w.c.ffn, w = A / world;
    const size_t es = d->esz;
    rank_free_buffers(d, r);
    r->r0 = (int64_t)r->rank * chunk;
    r->rows = L - r->r0 < chunk ? L - r->r0 : chunk;
    const int64_t rows = r->rows;
    r->send = be->mem->alloc(be, es * (size_t)(3 * rows * A));
    r->qkvf = be->mem->alloc(be, es * (size_t)(3 * L * w));
    r->of = be->mem->alloc(be, es * (size_t)(L * w));
    r->recv = be->mem->alloc(be, es * (size_t)(rows * A));
    r->xg = be->mem->alloc(be, sizeof(float) * (size_t)(world * chunk * H));
    int64_t *perm = h3_malloc(sizeof *perm * (size_t)(world * rows));
    if (!r->send || !r->qkvf || !r->of || !r->recv || !r->xg || !perm) {
        free(perm);
        return -H3_E_NOMEM;
    }
    for (int g = 0; g < world; g++)
        for (int64_t m = 0; m < rows; m++) perm[g * rows + m] = m * world + g;
    r->d_perm = h3_backend_dup(be, perm, sizeof *perm * (size_t)(world * rows));
    free(perm);
    if (!r->d_perm) return -H3_E_NOMEM;
    if (r->be) {
        /* a loopback rank: its own x (the whole sequence) and block buffers sized for its slice */
        const int64_t big = 3 * A > 2 * F ? 3 * A : 2 * F, q3 = 3 * A > F ? 3 * A : F;
        const size_t bytes[6] = {sizeof(float) * (size_t)(H * L), es * (size_t)(H * rows),
                                 sizeof(float) * (size_t)(H * rows), es * (size_t)(big * rows),
                                 es * (size_t)(q3 * rows), es * (size_t)(A * rows)};
        for (int i = 0; i < 6; i++)
            if (!(r->own[i] = be->mem->alloc(be, bytes[i]))) return -H3_E_NOMEM;
        r->e.x = r->own[0], r->e.nb = r->own[1], r->e.tmp = r->own[2], r->e.big = r->own[3];
        r->e.qkv3 = r->own[4], r->e.ob = r->own[5];
    } else {
        r->e.x = d->rq.x, r->e.nb = d->rq.nb, r->e.tmp = d->rq.tmp, r->e.big = d->rq.big;
        r->e.qkv3 = d->rq.qkv3, r->e.ob = d->rq.ob;
    }
    r->e.r0 = r->r0;
    r->e.timed = r->rank == 0;
    r->e.sp = r;
    return 0;
}

static int sp_build(h3_dit *d)
{
    struct dit_sp *s = d->sp;
    const int64_t L = d->rq.lay.seq;
    if (s->built_L == L && s->built_gen == d->rq.generation) return 0;
    s->built_L = 0;
    const int64_t chunk = (L + s->world - 1) / s->world, last = L - (s->world - 1) * chunk;
    if (last < SP_MIN_ROWS)
        return h3_err(H3_E_INVALID,
                      "sequence parallel: %lld sequence rows over %d ranks leave the last rank %lld (each needs at "
                      "least %d)",
                      (long long)L, s->world, (long long)(last > 0 ? last : 0), SP_MIN_ROWS);
    for (int i = 0; i < s->n_local; i++) {
        int rc = rank_build(d, &s->rk[i], L, chunk, s->world);
        if (rc) return rc;
    }
    s->chunk = chunk;
    s->built_L = L;
    s->built_gen = d->rq.generation;
    return 0;
}

static void *at(const h3_dit *d, void *base, int64_t i) { return (char *)base + (size_t)i * d->esz; }

int dit_sp_attention(h3_dit *d, const dit_exec *e, const dit_block *b, const h3_bt *qkv, int64_t rows,
                     const float *cos, const float *sin, bool main, const h3_bt *ob)
{
    struct dit_sp_rank *r = e->sp;
    struct dit_sp *s = d->sp;
    h3_backend *be = e->be;
    const h3_backend_ops *o = be->ops;
    const h3_dit_cfg *c = &d->w.c;
    const int world = s->world, me = r->rank, hp = c->heads / world;
    const int64_t D = c->head_dim, A = d->w.A, w = hp * D, L = s->built_L, chunk = s->chunk;
    const size_t es = d->esz;
    int rc = 0;
    /* q/k norm and RoPE per destination's heads, written straight into the send blocks (our own
       heads into their place in the whole-sequence buffer) */
    for (int g = 0; g < world && !rc; g++) {
        const h3_bt qi = h3_bt_make(at(d, qkv->data, g * hp * 3 * D), qkv->dtype, rows, 3 * w, qkv->ld),
                    ki = h3_bt_make(at(d, qkv->data, g * hp * 3 * D + D), qkv->dtype, rows, 3 * w - D, qkv->ld),
                    vi = h3_bt_make(at(d, qkv->data, g * hp * 3 * D + 2 * D), qkv->dtype, rows, 3 * w - 2 * D, qkv->ld);
        void *q = g == me ? at(d, r->qkvf, r->r0 * w) : at(d, r->send, g * 3 * rows * w);
        void *k = g == me ? at(d, r->qkvf, (L + r->r0) * w) : at(d, q, rows * w);
        void *v = g == me ? at(d, r->qkvf, (2 * L + r->r0) * w) : at(d, q, 2 * rows * w);
        const h3_bt Q = act(d, q, rows, w, w), K = act(d, k, rows, w, w), V = act(d, v, rows, w, w);
        rc = o->qk_norm_rope(be, &qi, &ki, &vi, 3 * (int)D, b->qn, b->kn, cos, sin, hp, hp, (int)D,
                             cos ? d->w.F3 : 0, (float)c->qk_eps, &Q, &K, &V);
    }
    if (rc) return rc;
    h3_comm_piece pc[3 * H3_COMM_MAX_WORLD];
    int n = 0;
    for (int g = 0; g < world; g++) {
        if (g == me) continue;
        const int64_t r0g = (int64_t)g * chunk, rows_g = L - r0g < chunk ? L - r0g : chunk;
        for (int t = 0; t < 3; t++)
            pc[n++] = (h3_comm_piece){g, at(d, r->send, (g * 3 + t) * rows * w), es * (size_t)(rows * w),
                                      at(d, r->qkvf, (t * L + r0g) * w), es * (size_t)(rows_g * w)};
    }
    if ((rc = r->comm->ops->exchange(r->comm, pc, n))) return rc;
    const h3_bt Q = act(d, r->qkvf, L, w, w), K = act(d, at(d, r->qkvf, L * w), L, w, w),
                V = act(d, at(d, r->qkvf, 2 * L * w), L, w, w), O = act(d, r->of, L, w, w);
    be->attn_precision = main && (d->flags & H3_OPT_FP8_ATTENTION) ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
    rc = o->attention(be, &Q, &K, &V, hp, hp, (int)D, 1.0f / sqrtf((float)D), false, &O);
    be->attn_precision = H3_PRECISION_DEFAULT;
    if (rc) return rc;
    /* back to rows: our slice's rows of every rank's heads, then into [rows][A] head order */
    n = 0;
    for (int g = 0; g < world; g++) {
        if (g == me) continue;
        const int64_t r0g = (int64_t)g * chunk, rows_g = L - r0g < chunk ? L - r0g : chunk;
        pc[n++] = (h3_comm_piece){g, at(d, r->of, r0g * w), es * (size_t)(rows_g * w), at(d, r->recv, g * rows * w),
                                  es * (size_t)(rows * w)};
    }
    if ((rc = be->mem->dcopy(be, at(d, r->recv, me * rows * w), at(d, r->of, r->r0 * w), es * (size_t)(rows * w))) ||
        (rc = r->comm->ops->exchange(r->comm, pc, n)))
        return rc;
    /* rows of w activation values moved as f32 words (bf16 pairs on a GPU: a copy, bits unchanged) */
    const int64_t wf = w * (int64_t)es / 4;
    const h3_bt src = f32(r->recv, world * rows, wf, wf), dst = f32(ob->data, rows * world, wf, wf);
    (void)A;
    return o->scatter_rows(be, &src, r->d_perm, &dst);
}

/* One rank's stack, then the all-gather of the residual stream into its x. */
static int rank_stack(struct dit_sp_rank *r)
{
    h3_dit *d = r->d;
    struct dit_sp *s = d->sp;
    h3_backend *be = r->e.be;
    const int64_t H = d->w.c.hidden, L = s->built_L, chunk = s->chunk;
    int rc = dit_run_stack_exec(d, &r->e, r->p, r->tab, r->step, r->rows);
    if (!rc) rc = be->mem->dcopy(be, r->xg + r->r0 * H, (float *)r->e.x + r->r0 * H, sizeof(float) * (size_t)(r->rows * H));
    if (!rc) rc = r->comm->ops->all_gather(r->comm, r->xg + r->r0 * H, r->xg, sizeof(float) * (size_t)(chunk * H));
    if (!rc) rc = be->mem->dcopy(be, r->e.x, r->xg, sizeof(float) * (size_t)(L * H));
    if (rc && r->comm->ops->abort) r->comm->ops->abort(r->comm);
    return rc;
}

static void *rank_thread(void *a)
{
    struct dit_sp_rank *r = a;
    r->rc = rank_stack(r);
    if (r->rc) snprintf(r->err, sizeof r->err, "%s", h3_last_error());
    return NULL;
}

int dit_sp_run_stack(h3_dit *d, const dit_plan *p, const float *tab_blk, int step)
{
    struct dit_sp *s = d->sp;
    if (d->kn.red_rows > 0 && step >= 0)
        return h3_err(H3_E_UNSUPPORTED, "sequence parallel: token reduction does not run split over ranks");
    if (s->loopback && d->ws.n_streamed > 0)
        return h3_err(H3_E_UNSUPPORTED, "sequence parallel: loopback ranks do not run streamed transformer blocks");
    int rc = sp_build(d);
    if (rc) return rc;
    const int64_t H = d->w.c.hidden, L = d->rq.lay.seq;
    for (int i = 0; i < s->n_local; i++) {
        struct dit_sp_rank *r = &s->rk[i];
        r->d = d, r->p = p, r->tab = tab_blk, r->step = step, r->rc = 0, r->err[0] = 0;
        /* a loopback rank starts from the inputs every process would have computed */
        if (r->be) memcpy(r->e.x, d->rq.x, sizeof(float) * (size_t)(L * H));
    }
    if (!s->loopback) return rank_stack(&s->rk[0]);
    pthread_t th[H3_COMM_MAX_WORLD];
    bool started[H3_COMM_MAX_WORLD] = {0};
    for (int i = 1; i < s->n_local; i++) {
        started[i] = pthread_create(&th[i], NULL, rank_thread, &s->rk[i]) == 0;
        if (!started[i]) {
            s->rk[i].rc = h3_err(H3_E_NOMEM, "sequence parallel: cannot start loopback rank %d", i);
            snprintf(s->rk[i].err, sizeof s->rk[i].err, "%s", h3_last_error());
            s->rk[i].comm->ops->abort(s->rk[i].comm);
        }
    }
    rank_thread(&s->rk[0]);
    for (int i = 1; i < s->n_local; i++)
        if (started[i]) pthread_join(th[i], NULL);
    /* the first failure's own message (the others report the stopped group) */
    for (int i = 0; i < s->n_local; i++)
        if (s->rk[i].rc && !strstr(s->rk[i].err, "the group stopped"))
            return h3_err(-s->rk[i].rc, "%s", s->rk[i].err);
    for (int i = 0; i < s->n_local; i++)
        if (s->rk[i].rc) return h3_err(-s->rk[i].rc, "%s", s->rk[i].err);
    memcpy(d->rq.x, s->rk[0].e.x, sizeof(float) * (size_t)(L * H));
    return 0;
}

void h3_dit_sp_json(const h3_dit *d, h3_buf *b)
{
    const struct dit_sp *s = d->sp;
    if (!s) {
        h3_buf_printf(b, "null");
        return;
    }
    const int64_t L = s->built_L;
    h3_buf_printf(b, "{\"kind\": \"%s\", \"world\": %d, \"sequence\": %lld, \"ranks\": [",
                  s->loopback ? "loopback" : s->rk[0].comm->kind, s->world, (long long)L);
    for (int i = 0; i < s->n_local; i++) {
        const struct dit_sp_rank *r = &s->rk[i];
        const h3_comm_stats *st = &r->comm->stats;
        /* what one block's two all-to-alls move from this rank: its slice's q, k, v of the other
           ranks' heads, and the other ranks' rows of its heads' output */
        const int64_t w = (int64_t)d->w.A / s->world;
        const uint64_t qkv_b = (uint64_t)(3 * r->rows * w * (s->world - 1)) * d->esz,
                       out_b = (uint64_t)((L - r->rows) * w) * d->esz;
        h3_buf_printf(b,
                      "%s{\"rank\": %d, \"name\": \"%s rank %d of %d\", \"rows\": [%lld, %lld], \"all_to_all_calls\": %llu, "
                      "\"all_to_all_bytes\": %llu, \"qkv_all_to_all_bytes\": %llu, \"out_all_to_all_bytes\": %llu, "
                      "\"all_gather_bytes\": %llu}",
                      i ? ", " : "", r->rank, s->loopback ? "loopback" : r->comm->kind, r->rank, s->world,
                      (long long)r->r0, (long long)(r->r0 + r->rows), (unsigned long long)st->a2a_calls,
                      (unsigned long long)st->a2a_bytes,
                      (unsigned long long)qkv_b, (unsigned long long)out_b,
                      (unsigned long long)st->gather_bytes);
    }
    h3_buf_printf(b, "]}");
}
