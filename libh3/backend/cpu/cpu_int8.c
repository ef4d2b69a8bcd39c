/*
 * int8 weights on the CPU: quantisation at load and the GEMM over them (cpu_int8.h). The GEMM
 * reuses ops.c's f32 kernels (h3_kernels: the packed micro-kernel and the few-rows dot products)
 * on weights this file dequantises into their packed layout, so it sums exactly as h3_linear.
 */
#include "backend/cpu/cpu_int8.h"

#include <math.h>
#include <string.h>

/* Constants of ops.c / kernels.inc this file must agree with for h3_linear's bits:
   - I8_KC: the K block of the packed B layout [K block][panel][kc][16] that linear_tile reads
     (kernels.inc KC); the blocks are also where the micro-kernel's partial sums are rounded,
   - I8_MC: rows of the A buffer linear_tile packs into pool scratch slot 0 (kernels.inc MC),
   - I8_SMALL_M: h3_linear takes its dot-product path for M <= 6 (ops.c SMALL_M).
   A mismatch fails the bit-for-bit check of tests/c/test_backend_ops.c. */
#define I8_KC 256
#define I8_MC 96
#define I8_SMALL_M 6
/* Output channels per GEMM task (h3_linear's NT): wide enough that packing A is a small share of the
   work (it is packed once per column tile and K block). A multiple of the 16-wide panels. */
#define I8_NT 256
/* Rows of the per-thread buffer T that takes a later K block's sums (I8_RC x I8_NT floats). */
#define I8_RC 192
/* Channels the few-rows path dequantises at once (per thread, I8_ROWS x K floats). */
#define I8_ROWS 16

/* Pool scratch slot of the dequantised tile: ops.c's "B tile" slot, which h3_linear's kernels do
   not touch when they are handed a packed B (as here). */
#define I8_SLOT_B 1
#define I8_SLOT_A 0
/* Slot of thread 0 that holds a small W packed once for all tasks, and the most it may take: ops.c's
   slot and limit for the same purpose (LIN_SHARE_BYTES). */
#define I8_SLOT_SHARED 3
#define I8_SHARE_BYTES ((size_t)32 << 20)
static size_t g_share_bytes = I8_SHARE_BYTES;

void h3_linear_i8_share_budget(size_t bytes) { g_share_bytes = bytes ? bytes : I8_SHARE_BYTES; }

static const h3_i8_kernels *i8k(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* Follow the f32 kernels' choice (CPUID and H3_NO_SIMD) so both tables switch together. */
    if (strcmp(h3_kernels_variant(), "avx2") == 0) return &h3_i8_kernels_avx2;
#endif
    return &h3_i8_kernels_generic;
}

static const h3_kernels *f32k(void)
{
#if defined(__x86_64__) || defined(__i386__)
    if (strcmp(h3_kernels_variant(), "avx2") == 0) return &h3_kernels_avx2;
#endif
    return &h3_kernels_generic;
}

/* ---- quantisation ------------------------------------------------------------------------ */

static size_t scales_bytes(int64_t rows) { return ((size_t)rows * sizeof(float) + 63) / 64 * 64; }

size_t h3_i8_block_bytes(int64_t rows, int64_t cols) { return scales_bytes(rows) + (size_t)rows * (size_t)cols; }

h3_i8w h3_i8_view(const void *block, int64_t rows, int64_t cols)
{
    h3_i8w w = {(const int8_t *)block + scales_bytes(rows), (const float *)block, rows, cols};
    return w;
}

typedef struct {
    const h3_i8_kernels *k;
    const void *src;
    h3_dtype dt;
    int64_t cols;
    int8_t *q;
    float *scale;
    int64_t bad_row; /* first row with a non-finite value (-1: none); rows are disjoint per task */
    bool nomem;
} quant_job;

static void quant_task(void *a, int64_t b, int64_t e, int thread)
{
    quant_job *j = a;
    (void)thread;
    const size_t esz = h3_dtype_size(j->dt);
    float *row = NULL;
    if (j->dt != H3_DT_F32 && !(row = h3_alloc_aligned(sizeof(float) * (size_t)(j->cols ? j->cols : 1)))) {
        __atomic_store_n(&j->nomem, true, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = b; r < e; r++) {
        const void *src = (const char *)j->src + (size_t)r * (size_t)j->cols * esz;
        const float *w = src;
        if (row) {
            h3_to_f32(src, j->dt, row, j->cols);
            w = row;
        }
        if (j->k->quantize_row(w, j->cols, j->q + r * j->cols, j->scale + r) != 0) {
            /* Tasks may finish in any order: keep the lowest bad row, so the message is the same
               for every thread count. */
            int64_t seen = __atomic_load_n(&j->bad_row, __ATOMIC_RELAXED);
            while (r < seen && !__atomic_compare_exchange_n(&j->bad_row, &seen, r, false, __ATOMIC_RELAXED,
                                                            __ATOMIC_RELAXED)) {
            }
            break;
        }
    }
    h3_free_aligned(row);
}

int h3_i8_quantize(h3_pool *p, const void *src, h3_dtype dt, int64_t rows, int64_t cols, void **block)
{
    *block = NULL;
    if (dt != H3_DT_F32 && dt != H3_DT_BF16 && dt != H3_DT_F16)
        return h3_err(H3_E_SCHEMA, "int8 weights: quantising takes F32, BF16 or F16 weights, got %s",
                      h3_dtype_name(dt));
    if (rows < 0 || cols < 0) return h3_err(H3_E_INVALID, "int8 weights: shape %lld x %lld", (long long)rows,
                                            (long long)cols);
    void *blk = h3_alloc_aligned(h3_i8_block_bytes(rows, cols) ? h3_i8_block_bytes(rows, cols) : 1);
    if (!blk) return h3_err(H3_E_NOMEM, "int8 weights: out of memory for %lld x %lld", (long long)rows,
                            (long long)cols);
    h3_i8w v = h3_i8_view(blk, rows, cols);
    quant_job j = {i8k(), src, dt, cols, (int8_t *)v.q, (float *)v.scale, INT64_MAX, false};
    h3_parallel_for(p, rows, 16, quant_task, &j);
    /* h3_parallel_for has joined every task: plain reads from here on. */
    if (j.nomem || j.bad_row != INT64_MAX) {
        h3_free_aligned(blk);
        if (j.nomem)
            return h3_err(H3_E_NOMEM, "int8 weights: out of memory for a row of %lld values", (long long)cols);
        return h3_err(H3_E_SCHEMA, "int8 weights: row %lld holds a non-finite value (inf or NaN); only finite "
                                   "weights can be quantised", (long long)j.bad_row);
    }
    *block = blk;
    return 0;
}

/* ---- GEMM --------------------------------------------------------------------------------- */

typedef struct {
    const h3_kernels *kf;
    const h3_i8_kernels *ki;
    h3_pool *p;
    const float *X;
    int64_t ldx, M, rows_per_task, nt;
    const h3_i8w *W;
    const float *bias;
    float *Y;
    int64_t ldy;
    float *Bs;    /* all of W dequantised and packed once for every task, or NULL */
    int64_t Npad; /* its columns (N rounded up to whole panels) */
} i8_job;

/* Tile tj of K block kb of the shared packed W ([K block][panel][kc][16], as h3_linear packs it). */
static void i8_pack_task(void *a, int64_t b, int64_t e, int thread)
{
    i8_job *j = a;
    (void)thread;
    const int64_t K = j->W->cols, N = j->W->rows;
    for (int64_t t = b; t < e; t++) {
        const int64_t kb = t / j->nt, tj = t % j->nt;
        const int64_t k0 = kb * I8_KC, n0 = tj * I8_NT, n1 = n0 + I8_NT < N ? n0 + I8_NT : N;
        const int kc = K - k0 < I8_KC ? (int)(K - k0) : I8_KC;
        j->ki->pack_b(j->W, n0, n1, k0, kc, j->Bs + k0 * j->Npad + n0 * kc);
    }
}

/* One (row range, column tile) over the shared packed W: h3_linear's own task. */
static void i8_shared_task(void *a, int64_t b, int64_t e, int thread)
{
    i8_job *j = a;
    const int64_t N = j->W->rows;
    const h3_mat w = {NULL, H3_DT_F32, N, j->W->cols}; /* only the column count is read */
    for (int64_t t = b; t < e; t++) {
        const int64_t ti = t / j->nt, tj = t % j->nt;
        const int64_t m0 = ti * j->rows_per_task, m1 = m0 + j->rows_per_task < j->M ? m0 + j->rows_per_task : j->M;
        const int64_t n0 = tj * I8_NT, n1 = n0 + I8_NT < N ? n0 + I8_NT : N;
        j->kf->linear_tile(j->p, thread, j->X, j->ldx, &w, j->bias, j->Y, j->ldy, m0, m1, n0, n1, j->Bs, j->Npad);
    }
}

/*
 * One (row range, column tile) of Y, one K block at a time: the block's weights are dequantised into
 * the packed layout linear_tile reads, and linear_tile runs on that block alone (K = kc). The first
 * block writes bias + its sum into Y, as h3_linear's first block does; each later block's sum goes
 * to T (written, not accumulated: exactly the micro-kernel's register sum) and is then added to Y,
 * the one rounding h3_linear's kernel makes when it accumulates a later block (C += sum). So the
 * bits are h3_linear's, while only one K block of the tile (I8_NT x I8_KC floats) is held.
 */
static void i8_tile_task(void *a, int64_t b, int64_t e, int thread)
{
    i8_job *j = a;
    const int64_t K = j->W->cols, N = j->W->rows;
    float *Bp = h3_pool_scratch(j->p, thread, I8_SLOT_B, 0);
    float *T = Bp + (size_t)I8_NT * I8_KC;
    for (int64_t t = b; t < e; t++) {
        const int64_t ti = t / j->nt, tj = t % j->nt;
        const int64_t m0 = ti * j->rows_per_task, m1 = m0 + j->rows_per_task < j->M ? m0 + j->rows_per_task : j->M;
        const int64_t n0 = tj * I8_NT, n1 = n0 + I8_NT < N ? n0 + I8_NT : N, nc = n1 - n0;
        const int64_t npad = (nc + 15) / 16 * 16;
        const float *bias = j->bias ? j->bias + n0 : NULL;
        float *Y = j->Y + n0;
        if (K <= 0) { /* Y = bias (or 0), as linear_tile writes it for an empty K */
            const h3_mat none = {NULL, H3_DT_F32, nc, 0};
            j->kf->linear_tile(j->p, thread, j->X, j->ldx, &none, bias, Y, j->ldy, m0, m1, 0, nc, Bp, npad);
            continue;
        }
        for (int64_t k0 = 0; k0 < K; k0 += I8_KC) {
            const int kc = K - k0 < I8_KC ? (int)(K - k0) : I8_KC;
            j->ki->pack_b(j->W, n0, n1, k0, kc, Bp);
            /* Only the column count of the weight is read when B comes packed. */
            const h3_mat blk = {NULL, H3_DT_F32, nc, kc};
            if (k0 == 0) {
                j->kf->linear_tile(j->p, thread, j->X, j->ldx, &blk, bias, Y, j->ldy, m0, m1, 0, nc, Bp, npad);
                continue;
            }
            for (int64_t r0 = m0; r0 < m1; r0 += I8_RC) {
                const int64_t r1 = r0 + I8_RC < m1 ? r0 + I8_RC : m1;
                j->kf->linear_tile(j->p, thread, j->X + r0 * j->ldx + k0, j->ldx, &blk, NULL, T, nc, 0, r1 - r0, 0,
                                   nc, Bp, npad);
                for (int64_t r = 0; r < r1 - r0; r++) {
                    float *y = Y + (r0 + r) * j->ldy;
                    const float *s = T + r * nc;
                    for (int64_t c = 0; c < nc; c++) y[c] += s[c];
                }
            }
        }
    }
}

/* A few rows of X: h3_linear's dot products over dequantised channels, I8_ROWS at a time. */
static void i8_rows_task(void *a, int64_t b, int64_t e, int thread)
{
    i8_job *j = a;
    const int64_t K = j->W->cols;
    float *buf = h3_pool_scratch(j->p, thread, I8_SLOT_B, 0);
    for (int64_t n0 = b; n0 < e; n0 += I8_ROWS) {
        const int64_t n1 = n0 + I8_ROWS < e ? n0 + I8_ROWS : e;
        j->ki->dequant_rows(j->W, n0, n1, buf);
        const h3_mat rows = {buf, H3_DT_F32, n1 - n0, K};
        j->kf->linear_rows(j->X, j->ldx, &rows, j->bias ? j->bias + n0 : NULL, j->Y + n0, j->ldy, 0, j->M, 0,
                           n1 - n0);
    }
}

static int reserve(h3_pool *p, int slot, size_t bytes)
{
    for (int t = 0; t < h3_pool_threads(p); t++)
        if (!h3_pool_scratch(p, t, slot, bytes ? bytes : 1))
            return h3_err(H3_E_NOMEM, "int8 linear: out of memory for %zu bytes of scratch", bytes);
    return 0;
}

int h3_linear_i8(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_i8w *W, const float *bias, float *Y,
                 int64_t ldy)
{
    const int64_t N = W->rows, K = W->cols;
    if (M <= 0 || N <= 0) return 0;
    i8_job j = {f32k(), i8k(), p, X, ldx, M, 0, 0, W, bias, Y, ldy, NULL, 0};
    int rc;
    if (M <= I8_SMALL_M) {
        if ((rc = reserve(p, I8_SLOT_B, sizeof(float) * (size_t)I8_ROWS * (size_t)(K > 0 ? K : 1)))) return rc;
        /* grain 64 as h3_linear's, rounded to whole I8_ROWS groups by the task */
        h3_parallel_for(p, N, 64, i8_rows_task, &j);
        return 0;
    }
    if ((rc = reserve(p, I8_SLOT_A, sizeof(float) * I8_MC * I8_KC)) ||
        (rc = reserve(p, I8_SLOT_B, sizeof(float) * ((size_t)I8_NT * I8_KC + (size_t)I8_RC * I8_NT))))
        return rc;
    j.nt = (N + I8_NT - 1) / I8_NT;
    /* Split rows too when there are few column tiles, as h3_linear does (about 8 tasks per thread,
       so a thread that loses its core on a shared machine holds back little work); each row task
       dequantises its tile again, 1/rows of its multiply-adds, so rows stay >= 48. */
    const int64_t want = (int64_t)h3_pool_threads(p) * 8;
    int64_t mt = (want + j.nt - 1) / j.nt;
    if (mt < 1) mt = 1;
    int64_t rows = (M + mt - 1) / mt;
    rows = (rows + 5) / 6 * 6;
    if (rows < 48) rows = 48 < M ? 48 : M;
    j.rows_per_task = rows;
    const int64_t row_tasks = (M + rows - 1) / rows;
    j.Npad = (N + 15) / 16 * 16;
    if (row_tasks > 1 && K > 0 && sizeof(float) * (size_t)j.Npad * (size_t)K <= g_share_bytes) {
        /* Several row tasks share each column tile and all of W packed is small: dequantise it once
           (as h3_linear packs a small W once) instead of once per row task. */
        if (!(j.Bs = h3_pool_scratch(p, 0, I8_SLOT_SHARED, sizeof(float) * (size_t)j.Npad * (size_t)K)))
            return h3_err(H3_E_NOMEM, "int8 linear: out of memory for %lld x %lld packed weights", (long long)N,
                          (long long)K);
        h3_parallel_for(p, (K + I8_KC - 1) / I8_KC * j.nt, 1, i8_pack_task, &j);
        h3_parallel_for(p, row_tasks * j.nt, 1, i8_shared_task, &j);
        return 0;
    }
    h3_parallel_for(p, row_tasks * j.nt, 1, i8_tile_task, &j);
    return 0;
}

/* ---- ConvRot: activations rotated at run time ------------------------------------------------ */

typedef struct {
    const float *X;
    int64_t ldx, K, ldo;
    int group;
    float *out;
} rot_job;

static void rot_task(void *a, int64_t b, int64_t e, int thread)
{
    rot_job *j = a;
    (void)thread;
    const int g = j->group;
    int shift = 0;
    for (int t = g; t > 1; t /= 4) shift++;
    const float inv = ldexpf(1.0f, -shift); /* 1 / sqrt(g), exact */
    for (int64_t m = b; m < e; m++) {
        const float *x = j->X + m * j->ldx;
        float *o = j->out + m * j->ldo;
        for (int64_t g0 = 0; g0 < j->K; g0 += g) {
            float *v = o + g0;
            memcpy(v, x + g0, sizeof(float) * (size_t)g);
            /* One H4 butterfly per base-4 digit, in place (each quadruple is read before it is written). */
            for (int stride = 1; stride < g; stride *= 4)
                for (int base = 0; base < g; base += 4 * stride)
                    for (int i = base; i < base + stride; i++) {
                        const float x0 = v[i], x1 = v[i + stride], x2 = v[i + 2 * stride], x3 = v[i + 3 * stride];
                        v[i] = ((x0 + x1) + x2) - x3;
                        v[i + stride] = ((x0 + x1) - x2) + x3;
                        v[i + 2 * stride] = ((x0 - x1) + x2) + x3;
                        v[i + 3 * stride] = ((x1 - x0) + x2) + x3;
                    }
            for (int i = 0; i < g; i++) v[i] *= inv;
        }
    }
}

void h3_i8_rotate(h3_pool *p, const float *X, int64_t M, int64_t ldx, int64_t K, int group, float *out, int64_t ldo)
{
    rot_job j = {X, ldx, K, ldo, group, out};
    h3_parallel_for(p, M, 8, rot_task, &j);
}

int h3_linear_i8_rot(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_i8w *W, int group, const float *bias,
                     float *Y, int64_t ldy)
{
    if (!group) return h3_linear_i8(p, X, M, ldx, W, bias, Y, ldy);
    const int64_t K = W->cols, rows = h3_i8_rot_rows(K);
    if (group < 4 || K % group)
        return h3_err(H3_E_INVALID, "int8 linear: rotation group %d does not divide %lld columns", group, (long long)K);
    if (M <= 0 || W->rows <= 0) return 0;
    const int64_t chunk = M < rows ? M : rows;
    float *R = h3_alloc_aligned(sizeof(float) * (size_t)chunk * (size_t)K);
    if (!R) return h3_err(H3_E_NOMEM, "int8 linear: out of memory for %lld rotated rows of %lld values", (long long)chunk,
                          (long long)K);
    int rc = 0;
    for (int64_t m0 = 0; m0 < M && !rc; m0 += chunk) {
        const int64_t mc = M - m0 < chunk ? M - m0 : chunk;
        h3_i8_rotate(p, X + m0 * ldx, mc, ldx, K, group, R, K);
        rc = h3_linear_i8(p, R, mc, K, W, bias, Y + m0 * ldy, ldy);
    }
    h3_free_aligned(R);
    return rc;
}
