/* Kernel dispatch and the row-wise operations every stage shares. */
#include "backend/cpu/ops.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const h3_kernels *g_k;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void pick_kernels(void)
{
    g_k = &h3_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
    if (h3_host_simd()) g_k = &h3_kernels_avx2;
#endif
}

static const h3_kernels *K(void)
{
    pthread_once(&g_once, pick_kernels);
    return g_k;
}

const char *h3_kernels_variant(void) { return K()->name; }

void h3_silu_mul(const float *gate, const float *up, float *out, int64_t n) { K()->silu_mul(gate, up, out, n); }
double h3_sumsq(const float *x, int64_t n) { return K()->sumsq(x, n); }
void h3_scale_mod(const float *x, int64_t n, float inv, const float *w, const float *scale, const float *shift, float *y)
{
    K()->scale_mod(x, n, inv, w, scale, shift, y);
}
void h3_gated_add(float *x, const float *g, const float *y, int64_t n) { K()->gated_add(x, g, y, n); }
void h3_rope_half(const float *t, const float *c, const float *s, int64_t half, float *o) { K()->rope(t, c, s, half, o); }

float h3_fma_loop(int64_t iters) { return K()->fma_loop(iters); }

float h3_gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

/* ---- linear ---------------------------------------------------------------------------- */

#define KC_ 256
#define MC_ 96
#define NT 256 /* columns per task */
#define SMALL_M 6

typedef struct {
    const h3_kernels *k;
    h3_pool *p;
    const float *X;
    int64_t ldx, M, N, mt, nt, rows_per_task;
    const h3_mat *W;
    const float *bias;
    float *Y;
    int64_t ldy;
    float *Bs;            /* W packed once for every task, or NULL */
    int64_t Npad, kblocks;
} lin_job;

/* W packed once when several row tasks share a column tile and the packed copy is small: each
   task would otherwise re-pack (and convert) the same weights. */
#define LIN_SHARE_BYTES ((size_t)32 << 20)

static void lin_pack_task(void *a, int64_t b, int64_t e, int thread)
{
    lin_job *j = a;
    (void)thread;
    const int64_t K = j->W->cols;
    for (int64_t t = b; t < e; t++) {
        int64_t kb = t / j->nt, tj = t % j->nt;
        int64_t k0 = kb * KC_, n0 = tj * NT, n1 = n0 + NT < j->N ? n0 + NT : j->N;
        int kc = K - k0 < KC_ ? (int)(K - k0) : KC_;
        j->k->linear_pack_b(j->W, n0, n1, k0, kc, j->Bs + k0 * j->Npad + n0 * kc);
    }
}

static void lin_task(void *a, int64_t b, int64_t e, int thread)
{
    lin_job *j = a;
    for (int64_t t = b; t < e; t++) {
        int64_t ti = t / j->nt, tj = t % j->nt;
        int64_t m0 = ti * j->rows_per_task, m1 = m0 + j->rows_per_task < j->M ? m0 + j->rows_per_task : j->M;
        int64_t n0 = tj * NT, n1 = n0 + NT < j->N ? n0 + NT : j->N;
        j->k->linear_tile(j->p, thread, j->X, j->ldx, j->W, j->bias, j->Y, j->ldy, m0, m1, n0, n1, j->Bs, j->Npad);
    }
}

static void lin_rows_task(void *a, int64_t b, int64_t e, int thread)
{
    lin_job *j = a;
    (void)thread;
    j->k->linear_rows(j->X, j->ldx, j->W, j->bias, j->Y, j->ldy, 0, j->M, b, e);
}

static int reserve(h3_pool *p, int slot, size_t bytes)
{
    for (int t = 0; t < h3_pool_threads(p); t++)
        if (!h3_pool_scratch(p, t, slot, bytes)) return -H3_E_NOMEM;
    return 0;
}

static int linear_run(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W, const float *bias,
                      float *Y, int64_t ldy, bool few_rows_ok)
{
    if (M <= 0 || W->rows <= 0) return 0;
    lin_job j = {K(), p, X, ldx, M, W->rows, 0, 0, 0, W, bias, Y, ldy, NULL, 0, 0};
    if (M <= SMALL_M && few_rows_ok) {
        /* A few rows: streaming dot products beat packing the whole weight matrix. */
        h3_parallel_for(p, W->rows, 64, lin_rows_task, &j);
        return 0;
    }
    int rc;
    if ((rc = reserve(p, 0, sizeof(float) * MC_ * KC_)) ||
        (rc = reserve(p, 1, sizeof(float) * (size_t)((NT + 15) / 16 * 16) * KC_)))
        return rc;
    j.nt = (W->rows + NT - 1) / NT;
    /* Split rows too when there are few column tiles: about 8 tasks per thread, so a thread that
       loses its core on a shared machine holds back little work at the end. A task re-packs its
       column tile of W, which costs 1/rows of its multiply-adds: keep tasks >= 48 rows. */
    int64_t want = (int64_t)h3_pool_threads(p) * 8;
    int64_t mt = (want + j.nt - 1) / j.nt;
    if (mt < 1) mt = 1;
    int64_t rows = (M + mt - 1) / mt;
    rows = (rows + 5) / 6 * 6;
    if (rows < 48) rows = 48 < M ? 48 : M;
    j.rows_per_task = rows;
    j.mt = (M + rows - 1) / rows;
    const int64_t Kd = W->cols;
    j.Npad = (W->rows + 15) / 16 * 16;
    j.kblocks = (Kd + KC_ - 1) / KC_;
    if (j.mt > 1 && Kd > 0 && sizeof(float) * (size_t)j.Npad * (size_t)Kd <= LIN_SHARE_BYTES) {
        j.Bs = h3_pool_scratch(p, 0, 3, sizeof(float) * (size_t)j.Npad * (size_t)Kd);
        if (!j.Bs) return -H3_E_NOMEM;
        h3_parallel_for(p, j.kblocks * j.nt, 1, lin_pack_task, &j);
    }
    h3_parallel_for(p, j.mt * j.nt, 1, lin_task, &j);
    return 0;
}

/* The stages' host GEMM is this one (core/host.h): registered before any context exists. */
__attribute__((constructor)) static void register_host_gemm(void) { h3_host_gemm_register(h3_linear); }

int h3_linear(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W, const float *bias, float *Y,
              int64_t ldy)
{
    return linear_run(p, X, M, ldx, W, bias, Y, ldy, true);
}

int h3_linear_blocked(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W, const float *bias,
                      float *Y, int64_t ldy)
{
    return linear_run(p, X, M, ldx, W, bias, Y, ldy, false);
}

/* ---- attention ------------------------------------------------------------------------- */

#define ABR_ 48 /* queries per block (kernels.inc ABR) */
#define ABC_ 60 /* keys per block (kernels.inc ABC) */
#define AMR_ 6  /* key panel height of the packed K (kernels.inc MR) */
/* Packed K/V of a group of heads share one buffer of about this size: bounded memory for long
   sequences, while a group still holds enough (head, query block) tasks for every thread. */
static size_t g_attn_pack_bytes = (size_t)64 << 20;

void h3_attention_pack_budget(size_t bytes) { g_attn_pack_bytes = bytes ? bytes : (size_t)64 << 20; }

typedef struct {
    const h3_kernels *k;
    h3_pool *p;
    const float *Q, *Kx, *V;
    float *Kp, *Vp; /* packed K/V of heads [g0, g0 + gn) */
    int64_t ldq, ldk, ldv, ldo, Lq, Lk, qblocks, kblocks, kstride, vstride;
    int heads, kv_heads, D, g0, gn;
    float scale;
    bool causal;
    float *O;
} attn_job;

static void attn_pack_task(void *a, int64_t b, int64_t e, int thread)
{
    attn_job *j = a;
    (void)thread;
    for (int64_t t = b; t < e; t++) {
        int g = (int)(t / j->kblocks), kvh = j->g0 + g;
        int64_t k0 = (t % j->kblocks) * ABC_, bc = j->Lk - k0 < ABC_ ? j->Lk - k0 : ABC_;
        j->k->attn_pack(j->Kx + (int64_t)kvh * j->D, j->ldk, j->V + (int64_t)kvh * j->D, j->ldv, k0, bc, j->D,
                        j->Kp + g * j->kstride, j->Vp + g * j->vstride);
    }
}

static void attn_task(void *a, int64_t b, int64_t e, int thread)
{
    attn_job *j = a;
    const int group = j->heads / j->kv_heads; /* query heads per kv head */
    for (int64_t t = b; t < e; t++) {
        int hh = (int)(t / j->qblocks); /* query head within this group of kv heads */
        int h = j->g0 * group + hh, g = hh / group;
        int64_t qb = t % j->qblocks;
        int64_t q0 = qb * ABR_, q1 = q0 + ABR_ < j->Lq ? q0 + ABR_ : j->Lq;
        j->k->attn_block(j->p, thread, j->Q + (int64_t)h * j->D, j->ldq, j->Kp + g * j->kstride,
                         j->Vp + g * j->vstride, q0, q1, j->Lk, j->Lq, j->D, j->scale, j->causal,
                         j->O + (int64_t)h * j->D, j->ldo);
    }
}

int h3_attention(h3_pool *p, const float *Q, int64_t ldq, const float *Kx, int64_t ldk, const float *V,
                 int64_t ldv, int64_t Lq, int64_t Lk, int heads, int kv_heads, int D, float scale,
                 bool causal, float *O, int64_t ldo)
{
    if (Lq <= 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads) return h3_err(H3_E_INVALID, "attention: %d heads, %d kv heads", heads, kv_heads);
    if (Lk <= 0) {
        for (int64_t r = 0; r < Lq; r++) memset(O + r * ldo, 0, sizeof(float) * (size_t)heads * D);
        return 0;
    }
    int dpad = (D + 15) / 16 * 16;
    size_t floats = (size_t)ABR_ * D + (size_t)ABC_ * ABR_ + (size_t)ABR_ * dpad + 3 * ABR_;
    int rc = reserve(p, 2, floats * sizeof(float));
    if (rc) return rc;
    attn_job j = {.k = K(), .p = p, .Q = Q, .Kx = Kx, .V = V, .ldq = ldq, .ldk = ldk, .ldv = ldv, .ldo = ldo,
                  .Lq = Lq, .Lk = Lk, .qblocks = (Lq + ABR_ - 1) / ABR_, .kblocks = (Lk + ABC_ - 1) / ABC_,
                  .heads = heads, .kv_heads = kv_heads, .D = D, .scale = scale, .causal = causal, .O = O};
    /* K panels are read by broadcasts (any alignment); the V panels after them are read as
       aligned vectors, so every head's share stays a multiple of 64 bytes. */
    j.kstride = ((Lk + AMR_ - 1) / AMR_ * AMR_ * D + 15) / 16 * 16;
    j.vstride = Lk * dpad;
    const size_t head_bytes = sizeof(float) * (size_t)(j.kstride + j.vstride);
    int gmax = (int)(g_attn_pack_bytes / head_bytes);
    if (gmax < 1) gmax = 1;
    if (gmax > kv_heads) gmax = kv_heads;
    float *buf = h3_alloc_aligned(head_bytes * (size_t)gmax);
    if (!buf) return -H3_E_NOMEM;
    j.Kp = buf;
    j.Vp = buf + (size_t)gmax * j.kstride;
    for (j.g0 = 0; j.g0 < kv_heads; j.g0 += j.gn) {
        j.gn = kv_heads - j.g0 < gmax ? kv_heads - j.g0 : gmax;
        h3_parallel_for(p, (int64_t)j.gn * j.kblocks, 1, attn_pack_task, &j);
        h3_parallel_for(p, (int64_t)j.gn * (heads / kv_heads) * j.qblocks, 1, attn_task, &j);
    }
    h3_free_aligned(buf);
    return 0;
}

/* ---- SwiGLU ---------------------------------------------------------------------------- */

typedef struct {
    const float *g, *u;
    float *o;
    int64_t ldg, ldu, ldo, n;
} swiglu_job;

static void swiglu_task(void *a, int64_t b, int64_t e, int thread)
{
    swiglu_job *j = a;
    (void)thread;
    for (int64_t r = b; r < e; r++) h3_silu_mul(j->g + r * j->ldg, j->u + r * j->ldu, j->o + r * j->ldo, j->n);
}

void h3_swiglu(h3_pool *p, const float *gate, int64_t ldg, const float *up, int64_t ldu, float *out, int64_t ldo,
               int64_t rows, int64_t n)
{
    swiglu_job j = {gate, up, out, ldg, ldu, ldo, n};
    h3_parallel_for(p, rows, 4, swiglu_task, &j);
}
