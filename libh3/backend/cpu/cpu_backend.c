/*
 * The CPU backend: backend.h's ops over the thread pool and the kernels of backend/cpu/ (one copy
 * of each: the GEMM micro-kernel and attention in kernels.inc, the row helpers in ops.c; the text
 * encoder's and the VAEs' layernorm, copy and add_div in cpu_layernorm.c, the decoders' ops in cpu_vae.c, the speed
 * knobs' in cpu_knobs.c, the audio activation kernels in avae_kern.inc). All
 * activations are f32; this is the exact path every parity test checks. Buffers are host memory,
 * so upload/download are copies and weights are views of the mapped shards.
 *
 * Row ops split work over rows only, so results do not depend on the thread count.
 */
#include "backend/cpu/cpu_common.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_knobs.h"
#include "backend/cpu/cpu_int8.h"
#include "backend/cpu/cpu_layernorm.h"
#include "backend/cpu/cpu_vae.h"
#include "backend/cpu/cpu_conv3d.h"
#include "backend/cpu/cpu_vision.h"
#include "backend/cpu/cpu_audio_enc.h"
#include "backend/cpu/ops.h"
#include "core/schedule.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qk_norm_rope stages one head's normalised q/k on the stack. */
#define CPU_MAX_HEAD_DIM 1024

typedef struct {
    h3_backend base;
    h3_pool *pool;
} cpu_backend;

static h3_pool *pool_of(h3_backend *be) { return ((cpu_backend *)be)->pool; }

h3_pool *h3_cpu_backend_pool(h3_backend *be) { return pool_of(be); }

int h3_cpu_need_f32(const char *op, const h3_bt *t)
{
    if (t->dtype != H3_DT_F32)
        return h3_err(H3_E_UNSUPPORTED, "cpu backend: %s takes f32 tensors, got %s", op, h3_dtype_name(t->dtype));
    return 0;
}

static void cpu_destroy(h3_backend *be) { free(be); }

static void *cpu_alloc(h3_backend *be, size_t bytes)
{
    (void)be;
    return h3_alloc_aligned(bytes ? bytes : 1);
}

static void cpu_release(h3_backend *be, void *p)
{
    (void)be;
    h3_free_aligned(p);
}

static int cpu_copy(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return 0;
}

static int cpu_zero(h3_backend *be, void *dst, size_t bytes)
{
    (void)be;
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

static int cpu_sync(h3_backend *be)
{
    (void)be;
    return 0;
}

static int cpu_mem_info(h3_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{
    (void)be;
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
    return 0;
}

/* Weights are views of the mapping (h3_linear widens them to f32 as it packs), or, while
   be->weight_precision is H3_PRECISION_INT8, an owned int8 copy with per-channel scales
   (cpu_int8.h): dtype H3_DT_I8, data the int8 values, priv a h3_i8_handle. */
static int cpu_weight_load(h3_backend *be, const void *host, h3_dtype dt, int64_t rows, int64_t cols, h3_bw *out)
{
    memset(out, 0, sizeof *out);
    if (dt != H3_DT_F32 && dt != H3_DT_BF16 && dt != H3_DT_F16)
        return h3_err(H3_E_SCHEMA, "cpu backend: weights must be F32, BF16 or F16, got %s", h3_dtype_name(dt));
    out->data = host;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    if (be->weight_precision == H3_PRECISION_DEFAULT) return 0;
    if (be->weight_precision != H3_PRECISION_INT8) {
        memset(out, 0, sizeof *out);
        return h3_err(H3_E_UNSUPPORTED, "cpu backend: weight precision %d is not one the CPU runs (int8 is)",
                      be->weight_precision);
    }
    h3_i8_handle *h = h3_calloc(1, sizeof *h);
    if (!h) {
        memset(out, 0, sizeof *out);
        return -H3_E_NOMEM;
    }
    int rc = h3_i8_quantize(pool_of(be), host, dt, rows, cols, &h->block);
    if (rc) {
        free(h);
        memset(out, 0, sizeof *out);
        return rc;
    }
    h->w = h3_i8_view(h->block, rows, cols);
    out->data = h->w.q;
    out->dtype = H3_DT_I8;
    out->priv = h;
    return 0;
}

/* A single file's int8 codes and scales, used in place (backend.h's weight_load_i8). */
static int cpu_weight_load_i8(h3_backend *be, const int8_t *q, const float *scale, int group, int64_t rows,
                              int64_t cols, h3_bw *out)
{
    (void)be;
    memset(out, 0, sizeof *out);
    if (!q || !scale || rows < 0 || cols < 0 || group < 0 || (group && (group < 4 || cols % group)))
        return h3_err(H3_E_INVALID, "cpu backend: int8 weight %lld x %lld with rotation group %d", (long long)rows,
                      (long long)cols, group);
    for (int g = group; g > 1; g /= 4)
        if (g % 4) return h3_err(H3_E_INVALID, "cpu backend: rotation group %d is not a power of 4", group);
    h3_i8_handle *h = h3_calloc(1, sizeof *h);
    if (!h) return -H3_E_NOMEM;
    h->w = (h3_i8w){q, scale, rows, cols};
    h->group = group;
    *out = (h3_bw){q, H3_DT_I8, rows, cols, h};
    return 0;
}

static void cpu_weight_free(h3_backend *be, h3_bw *w)
{
    (void)be;
    h3_i8_handle *h = w->priv; /* NULL for views */
    if (h) {
        h3_free_aligned(h->block);
        free(h);
    }
    memset(w, 0, sizeof *w);
}

/* Streamed weights (backend.h's wstream_*). The CPU computes on views of the text encoder's read
   buffer, so the stage uses them only when H3_TEXT_STREAM=1 asks: then the "device" slot is a
   second host buffer and a load is a memcpy, which runs the GPU's protocol (slots, reader hand-
   off) where CI can check its bits. */
typedef struct {
    int slots;
    size_t bytes;
    void *host[2], *dev[2];
} cpu_wstream;

static void cpu_wstream_close(h3_backend *be, void *ws)
{
    (void)be;
    cpu_wstream *w = ws;
    if (!w) return;
    for (int s = 0; s < 2; s++) {
        h3_free_aligned(w->host[s]);
        h3_free_aligned(w->dev[s]);
    }
    free(w);
}

static int cpu_wstream_open(h3_backend *be, size_t bytes, int slots, void **host, void **out)
{
    *out = NULL;
    if (slots < 1 || slots > 2 || !bytes || !host)
        return h3_err(H3_E_INVALID, "cpu backend: weight stream of %d slots of %zu bytes (1 or 2 slots)", slots, bytes);
    cpu_wstream *w = h3_calloc(1, sizeof *w);
    if (!w) return -H3_E_NOMEM;
    w->slots = slots;
    w->bytes = bytes;
    for (int s = 0; s < slots; s++)
        if (!(w->host[s] = h3_alloc_aligned(bytes)) || !(w->dev[s] = h3_alloc_aligned(bytes))) {
            cpu_wstream_close(be, w);
            return h3_err(H3_E_NOMEM, "cpu backend: cannot allocate 2 x %d layer buffers of %zu bytes", slots, bytes);
        }
    for (int s = 0; s < slots; s++) host[s] = w->host[s];
    *out = w;
    return 0;
}

static int cpu_wstream_load(h3_backend *be, void *ws, int slot, size_t bytes, int n, const h3_bwspec *spec, h3_bw *w)
{
    cpu_wstream *st = ws;
    if (!st || slot < 0 || slot >= st->slots || bytes > st->bytes || n < 0)
        return h3_err(H3_E_INVALID, "cpu backend: weight stream load of %zu bytes into slot %d", bytes, slot);
    memcpy(st->dev[slot], st->host[slot], bytes);
    for (int i = 0; i < n; i++) {
        const size_t es = h3_dtype_size(spec[i].dtype);
        if (spec[i].offset > bytes || (size_t)(spec[i].rows * spec[i].cols) * es > bytes - spec[i].offset)
            return h3_err(H3_E_INVALID, "cpu backend: streamed weight %d outside the %zu-byte layer", i, bytes);
        int rc = cpu_weight_load(be, (const char *)st->dev[slot] + spec[i].offset, spec[i].dtype, spec[i].rows,
                                 spec[i].cols, &w[i]);
        if (rc) return rc;
    }
    return 0;
}

static int cpu_wstream_sync(h3_backend *be, void *ws, int slot)
{
    (void)be, (void)ws, (void)slot; /* the copy and the ops ran in the calls: nothing is in flight */
    return 0;
}

static int cpu_dcopy(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes && (!dst || !src)) return h3_err(H3_E_INVALID, "cpu backend: copy of %zu bytes from or to NULL", bytes);
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

static int cpu_linear(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("linear", X)) || (rc = h3_cpu_need_f32("linear", Y))) return rc;
    if (W->dtype == H3_DT_I8) {
        if (!W->priv) return h3_err(H3_E_INVALID, "cpu backend: an int8 weight without its scales");
        const h3_i8_handle *h = W->priv;
        return h3_linear_i8_rot(pool_of(be), X->data, X->rows, X->ld, &h->w, h->group, bias, Y->data, Y->ld);
    }
    h3_mat m = {W->data, W->dtype, W->rows, W->cols};
    return h3_linear(pool_of(be), X->data, X->rows, X->ld, &m, bias, Y->data, Y->ld);
}

static int cpu_attention(h3_backend *be, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads,
                         int D, float scale, bool causal, const h3_bt *O)
{
    int rc;
    if (be->attn_precision != H3_PRECISION_DEFAULT)
        return h3_err(H3_E_UNSUPPORTED, "cpu backend: attention runs at the exact precision only");
    if ((rc = h3_cpu_need_f32("attention", Q)) || (rc = h3_cpu_need_f32("attention", K)) || (rc = h3_cpu_need_f32("attention", V)) ||
        (rc = h3_cpu_need_f32("attention", O)))
        return rc;
    return h3_attention(pool_of(be), Q->data, Q->ld, K->data, K->ld, V->data, V->ld, Q->rows, K->rows, heads,
                        kv_heads, D, scale, causal, O->data, O->ld);
}

typedef struct {
    const float *x;
    float *y;
    const float *w;
    const int64_t *rows;
    h3_bmod mod;
    int64_t n, ldx, ldy;
    float eps;
} norm_job;

/* y = RMSNorm(x) * w [* (1 + scale) + shift]. The mean square is accumulated in double; the
   products follow torch's order: (x * rsqrt(ms + eps)) * w, then * (1 + scale) + shift. */
static void norm_task(void *a, int64_t b, int64_t e, int thread)
{
    norm_job *j = a;
    (void)thread;
    const int64_t n = j->n;
    for (int64_t k = b; k < e; k++) {
        const int64_t r = j->rows ? j->rows[k] : k;
        const float *x = j->x + r * j->ldx;
        float *y = j->y + k * j->ldy;
        const float inv = (float)(1.0 / sqrt(h3_sumsq(x, n) / (double)n + j->eps));
        if (j->mod.tab) {
            const float *shift = j->mod.tab + ((int64_t)j->mod.row_entry[r] * j->mod.stride + j->mod.slot) * n;
            h3_scale_mod(x, n, inv, j->w, shift + n, shift, y);
        } else {
            h3_scale_mod(x, n, inv, j->w, NULL, NULL, y);
        }
    }
}

static int cpu_norm_mod(h3_backend *be, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod,
                        float eps, const h3_bt *y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("norm", x)) || (rc = h3_cpu_need_f32("norm", y))) return rc;
    norm_job j = {x->data, y->data, w, rows, {0}, x->cols, x->ld, y->ld, eps};
    if (mod) j.mod = *mod;
    h3_parallel_for(pool_of(be), y->rows, 8, norm_task, &j);
    return 0;
}

typedef struct {
    const float *in[3]; /* q, k, v inputs (v may be NULL) */
    float *out[3];
    const float *w[2], *cos, *sin;
    int heads[3], hs, D, half;
    int64_t ldin[3], ldout[3];
    float eps;
} qkv_job;

/* Per row and head: RMS-normalise q and k with their weights, rotate the first 2*half dims
   (rotate-half, torch's order of operations) and write head-major Q, K (and V) rows for the
   attention kernel. A rotated head is staged on the stack, so q and k may be updated in place. */
static void qkv_task(void *a, int64_t b, int64_t e, int thread)
{
    qkv_job *j = a;
    (void)thread;
    const int D = j->D, half = j->half;
    float tmp[CPU_MAX_HEAD_DIM];
    for (int64_t r = b; r < e; r++) {
        const float *cs = j->cos ? j->cos + r * half : NULL, *sn = j->sin ? j->sin + r * half : NULL;
        for (int s = 0; s < 2; s++)
            for (int h = 0; h < j->heads[s]; h++) {
                const float *x = j->in[s] + r * j->ldin[s] + (int64_t)h * j->hs;
                float *o = j->out[s] + r * j->ldout[s] + (int64_t)h * D;
                const float inv = (float)(1.0 / sqrt(h3_sumsq(x, D) / (double)D + j->eps));
                float *t = cs ? tmp : o;
                h3_scale_mod(x, D, inv, j->w[s], NULL, NULL, t);
                if (cs) {
                    h3_rope_half(t, cs, sn, half, o);
                    memcpy(o + 2 * half, t + 2 * half, sizeof(float) * (size_t)(D - 2 * half));
                }
            }
        if (j->in[2])
            for (int h = 0; h < j->heads[2]; h++)
                memcpy(j->out[2] + r * j->ldout[2] + (int64_t)h * D, j->in[2] + r * j->ldin[2] + (int64_t)h * j->hs,
                       sizeof(float) * (size_t)D);
    }
}

static int cpu_qk_norm_rope(h3_backend *be, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs,
                            const float *qn, const float *kn, const float *cos, const float *sin, int heads,
                            int kv_heads, int D, int half, float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v)
{
    int rc;
    if ((rc = h3_cpu_need_f32("qk_norm_rope", qin)) || (rc = h3_cpu_need_f32("qk_norm_rope", kin)) ||
        (rc = h3_cpu_need_f32("qk_norm_rope", q)) || (rc = h3_cpu_need_f32("qk_norm_rope", k)) ||
        (vin && ((rc = h3_cpu_need_f32("qk_norm_rope", vin)) || (rc = h3_cpu_need_f32("qk_norm_rope", v)))))
        return rc;
    if (D > CPU_MAX_HEAD_DIM || 2 * half > D)
        return h3_err(H3_E_UNSUPPORTED, "cpu backend: head dim %d (rope %d) is outside what qk_norm_rope supports",
                      D, 2 * half);
    qkv_job j = {{qin->data, kin->data, vin ? vin->data : NULL},
                 {q->data, k->data, vin ? v->data : NULL},
                 {qn, kn},
                 cos,
                 sin,
                 {heads, kv_heads, kv_heads},
                 hs,
                 D,
                 half,
                 {qin->ld, kin->ld, vin ? vin->ld : 0},
                 {q->ld, k->ld, vin ? v->ld : 0},
                 eps};
    h3_parallel_for(pool_of(be), q->rows, 4, qkv_task, &j);
    return 0;
}

typedef struct {
    float *x;
    const float *y;
    h3_bmod mod;
    int64_t n, ldx, ldy;
} gate_job;

static void gate_task(void *a, int64_t b, int64_t e, int thread)
{
    gate_job *j = a;
    (void)thread;
    for (int64_t r = b; r < e; r++) {
        const float *g =
            j->mod.tab ? j->mod.tab + ((int64_t)j->mod.row_entry[r] * j->mod.stride + j->mod.slot) * j->n : NULL;
        h3_gated_add(j->x + r * j->ldx, g, j->y + r * j->ldy, j->n);
    }
}

static int cpu_gated_add(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *mod)
{
    int rc;
    if ((rc = h3_cpu_need_f32("gated_add", x)) || (rc = h3_cpu_need_f32("gated_add", y))) return rc;
    gate_job j = {x->data, y->data, {0}, x->cols, x->ld, y->ld};
    if (mod) j.mod = *mod;
    h3_parallel_for(pool_of(be), x->rows, 8, gate_task, &j);
    return 0;
}

/* The CPU gains nothing from fusing the two passes (its rows stay in cache): the two ops, whose
   bits the fused GPU kernel reproduces. */
static int cpu_gated_add_norm(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                              const h3_bmod *mod, float eps, const h3_bt *out)
{
    if (out->rows != x->rows) return h3_err(H3_E_INVALID, "gated_add_norm: %lld output rows for %lld rows",
                                            (long long)out->rows, (long long)x->rows);
    int rc = cpu_gated_add(be, x, y, gate);
    return rc ? rc : cpu_norm_mod(be, x, NULL, w, mod, eps, out);
}

static int cpu_swiglu(h3_backend *be, const h3_bt *gate, const h3_bt *up, const h3_bt *out)
{
    int rc;
    if ((rc = h3_cpu_need_f32("swiglu", gate)) || (rc = h3_cpu_need_f32("swiglu", up)) || (rc = h3_cpu_need_f32("swiglu", out))) return rc;
    h3_swiglu(pool_of(be), gate->data, gate->ld, up->data, up->ld, out->data, out->ld, out->rows, out->cols);
    return 0;
}

typedef struct {
    float *dst;
    const float *src;
    const int64_t *idx;
    int64_t n, ldd, lds;
} scatter_job;

static void scatter_task(void *a, int64_t b, int64_t e, int thread)
{
    scatter_job *j = a;
    (void)thread;
    for (int64_t i = b; i < e; i++)
        memcpy(j->dst + j->idx[i] * j->ldd, j->src + i * j->lds, sizeof(float) * (size_t)j->n);
}

static int cpu_scatter_rows(h3_backend *be, const h3_bt *src, const int64_t *idx, const h3_bt *dst)
{
    int rc;
    if ((rc = h3_cpu_need_f32("scatter_rows", src)) || (rc = h3_cpu_need_f32("scatter_rows", dst))) return rc;
    scatter_job j = {dst->data, src->data, idx, src->cols, dst->ld, src->ld};
    h3_parallel_for(pool_of(be), src->rows, 16, scatter_task, &j);
    return 0;
}

static int cpu_euler(h3_backend *be, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    (void)be;
    h3_sched_euler(x, v, n, t, sigma, sigma_next);
    return 0;
}

static int cpu_noise(h3_backend *be, uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n)
{
    (void)be;
    h3_noise(seed, stream, offset, out, n);
    return 0;
}

static const h3_backend_mem cpu_mem = {
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .mem_info = cpu_mem_info,
    .dcopy = cpu_dcopy,
};

/* No rings: the CPU streams weights from the page cache (runtime/streamer.h). Its layer streams
   are views of the read buffers. */
static const h3_backend_weights cpu_weights = {
    .weight_load = cpu_weight_load,
    .weight_free = cpu_weight_free,
    .wstream_open = cpu_wstream_open,
    .wstream_load = cpu_wstream_load,
    .wstream_wait_host = cpu_wstream_sync,
    .wstream_done = cpu_wstream_sync,
    .wstream_close = cpu_wstream_close,
};

static const h3_backend_ops cpu_ops = {
    .linear = cpu_linear,
    .attention = cpu_attention,
    .norm_mod = cpu_norm_mod,
    .qk_norm_rope = cpu_qk_norm_rope,
    .gated_add = cpu_gated_add,
    .gated_add_norm = cpu_gated_add_norm,
    .swiglu = cpu_swiglu,
    .scatter_rows = cpu_scatter_rows,
    .euler = cpu_euler,
    .noise = cpu_noise,
    .extrapolate = h3_cpu_extrapolate,
    .sub = h3_cpu_sub,
    .pool_pairs = h3_cpu_pool_pairs,
    .unpool_pairs = h3_cpu_unpool_pairs,
    .abs_diff_sum = h3_cpu_abs_diff_sum,
    .layernorm = h3_cpu_layernorm,
    .copy = h3_cpu_copy,
    .add_div = h3_cpu_add_div,
    .conv_gemm = h3_cpu_conv_gemm,
    .gelu = h3_cpu_gelu,
    .rope = h3_cpu_rope,
    .mul = h3_cpu_mul,
};

static const h3_backend_decoders cpu_dec = {
    .channels_last = h3_cpu_channels_last,
    .unpatchify = h3_cpu_unpatchify,
    .vae_stitch = h3_cpu_vae_stitch,
    .snake_aa = h3_cpu_snake_aa,
    .conv1_clamp = h3_cpu_conv1_clamp,
    .conv3d = h3_cpu_conv3d,
    .group_norm = h3_cpu_group_norm,
    .snake = h3_cpu_snake,
    .head_pool = h3_cpu_head_pool,
};

int h3_backend_cpu_create(h3_pool *pool, h3_backend **out)
{
    *out = NULL;
    if (!pool) return h3_err(H3_E_INVALID, "cpu backend: no worker pool");
    cpu_backend *b = h3_calloc(1, sizeof *b);
    if (!b) return -H3_E_NOMEM;
    b->base.name = "cpu";
    b->base.abi_version = H3_BACKEND_ABI;
    b->base.caps = H3_CAP_WSTREAM | H3_CAP_DECODERS | H3_CAP_SYNCHRONOUS | H3_CAP_I8_WEIGHTS;
    b->base.weight_load_i8 = cpu_weight_load_i8;
    b->base.is_host = true;
    b->base.mem = &cpu_mem;
    b->base.weights = &cpu_weights;
    b->base.ops = &cpu_ops;
    b->base.dec = &cpu_dec;
    b->base.destroy = cpu_destroy;
    b->base.act_dtype = H3_DT_F32;
    snprintf(b->base.attn_fp8_why, sizeof b->base.attn_fp8_why, "the CPU backend has no fp8 attention");
    b->pool = pool;
    snprintf(b->base.desc, sizeof b->base.desc, "cpu (%s kernels, %d threads)", h3_kernels_variant(),
             h3_pool_threads(pool));
    int rc = h3_backend_check(&b->base);
    if (rc) {
        cpu_destroy(&b->base);
        return rc;
    }
    *out = &b->base;
    return 0;
}
