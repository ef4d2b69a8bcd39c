/*
 * CPU versions of the speed-knob ops (backend.h: extrapolate, sub, pool_pairs, unpool_pairs,
 * abs_diff_sum). Plain C at the baseline ISA: these are memory-bound passes over the residual
 * stream or the velocities, and without -mfma the compiler cannot fuse `a + r * d`, so the
 * rounding is the contract's. Work is split over elements or rows only, so results do not depend
 * on the thread count.
 */
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_knobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EXTRA_BLOCK 4096 /* elements per task chunk and per partial sum of abs_diff_sum */

typedef struct {
    float *out;
    const float *a, *b;
    float r;
} ew_job;

static void extrapolate_task(void *arg, int64_t begin, int64_t end, int thread)
{
    const ew_job *j = arg;
    (void)thread;
    if (!j->b) {
        if (j->out != j->a) memmove(j->out + begin, j->a + begin, sizeof(float) * (size_t)(end - begin));
        return;
    }
    for (int64_t i = begin; i < end; i++) {
        const float a = j->a[i], d = a - j->b[i];
        const float p = j->r * d;
        j->out[i] = a + p;
    }
}

int h3_cpu_extrapolate(h3_backend *be, float *out, const float *a, const float *b, int64_t n, float r)
{
    if (n <= 0) return 0;
    ew_job j = {out, a, b, r};
    h3_parallel_for(h3_cpu_backend_pool(be), n, EXTRA_BLOCK, extrapolate_task, &j);
    return 0;
}

static void sub_task(void *arg, int64_t begin, int64_t end, int thread)
{
    const ew_job *j = arg;
    (void)thread;
    for (int64_t i = begin; i < end; i++) j->out[i] = j->a[i] - j->b[i];
}

int h3_cpu_sub(h3_backend *be, float *out, const float *a, const float *b, int64_t n)
{
    if (n <= 0) return 0;
    ew_job j = {out, a, b, 0.0f};
    h3_parallel_for(h3_cpu_backend_pool(be), n, EXTRA_BLOCK, sub_task, &j);
    return 0;
}

typedef struct {
    const h3_bt *src, *dst, *red, *base, *full;
    const int64_t *pairs;
} pair_job;

static void pool_task(void *arg, int64_t begin, int64_t end, int thread)
{
    const pair_job *j = arg;
    (void)thread;
    const int64_t n = j->src->cols;
    const float *src = j->src->data;
    float *dst = j->dst->data;
    for (int64_t r = begin; r < end; r++) {
        const int64_t p0 = j->pairs[2 * r], p1 = j->pairs[2 * r + 1];
        float *y = dst + r * j->dst->ld;
        const float *x0 = src + p0 * j->src->ld;
        if (p1 < 0) {
            memcpy(y, x0, sizeof(float) * (size_t)n);
            continue;
        }
        const float *x1 = src + p1 * j->src->ld;
        for (int64_t i = 0; i < n; i++) {
            const float s = x0[i] + x1[i];
            y[i] = s * 0.5f;
        }
    }
}

int h3_cpu_pool_pairs(h3_backend *be, const h3_bt *src, const int64_t *pairs, const h3_bt *dst)
{
    int rc;
    if ((rc = h3_cpu_need_f32("pool_pairs", src)) || (rc = h3_cpu_need_f32("pool_pairs", dst))) return rc;
    if (src->cols != dst->cols)
        return h3_err(H3_E_INVALID, "cpu backend: pool_pairs of %lld-wide rows into %lld-wide rows",
                      (long long)src->cols, (long long)dst->cols);
    pair_job j = {.src = src, .dst = dst, .pairs = pairs};
    h3_parallel_for(h3_cpu_backend_pool(be), dst->rows, 8, pool_task, &j);
    return 0;
}

/* Pairs name disjoint full rows (each row is in at most one pair), so chunks of pairs write
   disjoint outputs. */
static void unpool_task(void *arg, int64_t begin, int64_t end, int thread)
{
    const pair_job *j = arg;
    (void)thread;
    const int64_t n = j->red->cols;
    const float *red = j->red->data, *base = j->base->data;
    float *full = j->full->data;
    for (int64_t r = begin; r < end; r++) {
        const int64_t p0 = j->pairs[2 * r], p1 = j->pairs[2 * r + 1];
        const float *y = red + r * j->red->ld;
        float *f0 = full + p0 * j->full->ld;
        if (p1 < 0) {
            memcpy(f0, y, sizeof(float) * (size_t)n);
            continue;
        }
        const float *b = base + r * j->base->ld;
        float *f1 = full + p1 * j->full->ld;
        for (int64_t i = 0; i < n; i++) {
            const float d = y[i] - b[i];
            f0[i] = f0[i] + d;
            f1[i] = f1[i] + d;
        }
    }
}

int h3_cpu_unpool_pairs(h3_backend *be, const h3_bt *red, const h3_bt *base, const int64_t *pairs, const h3_bt *full)
{
    int rc;
    if ((rc = h3_cpu_need_f32("unpool_pairs", red)) || (rc = h3_cpu_need_f32("unpool_pairs", base)) ||
        (rc = h3_cpu_need_f32("unpool_pairs", full)))
        return rc;
    if (red->cols != full->cols || base->cols != red->cols)
        return h3_err(H3_E_INVALID, "cpu backend: unpool_pairs rows of different widths");
    pair_job j = {.red = red, .base = base, .full = full, .pairs = pairs};
    h3_parallel_for(h3_cpu_backend_pool(be), red->rows, 8, unpool_task, &j);
    return 0;
}

typedef struct {
    const float *a, *b;
    int64_t n;
    double *part; /* [blocks][2] */
} sum_job;

static void sum_task(void *arg, int64_t begin, int64_t end, int thread)
{
    const sum_job *j = arg;
    (void)thread;
    for (int64_t blk = begin; blk < end; blk++) {
        const int64_t i0 = blk * EXTRA_BLOCK, i1 = i0 + EXTRA_BLOCK < j->n ? i0 + EXTRA_BLOCK : j->n;
        double d = 0, r = 0;
        for (int64_t i = i0; i < i1; i++) {
            d += fabs((double)j->a[i] - (double)j->b[i]);
            r += fabs((double)j->b[i]);
        }
        j->part[2 * blk] = d;
        j->part[2 * blk + 1] = r;
    }
}

int h3_cpu_abs_diff_sum(h3_backend *be, const float *a, const float *b, int64_t n, double *diff, double *ref)
{
    *diff = *ref = 0;
    if (n <= 0) return 0;
    const int64_t blocks = (n + EXTRA_BLOCK - 1) / EXTRA_BLOCK;
    double *part = h3_malloc(sizeof(double) * 2 * (size_t)blocks);
    if (!part) return -H3_E_NOMEM;
    sum_job j = {a, b, n, part};
    h3_parallel_for(h3_cpu_backend_pool(be), blocks, 1, sum_task, &j);
    double d = 0, r = 0;
    for (int64_t k = 0; k < blocks; k++) {
        d += part[2 * k];
        r += part[2 * k + 1];
    }
    free(part);
    *diff = d;
    *ref = r;
    return 0;
}
