/*
 * The CPU backend's row-wise ops shared by the text encoder and the VAEs (contracts in backend.h):
 * layernorm, copy, add_div. Work is split over rows only, so results do not depend on the thread
 * count; each rounding step is a separate statement (builds pin -ffp-contract=off).
 */
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_layernorm.h"

#include <math.h>
#include <string.h>

/* ---- layernorm ------------------------------------------------------------------------- */

typedef struct {
    const float *x, *w, *b;
    float *y;
    int64_t ldx, ldy, n;
    float eps;
} ln_job;

static void ln_task(void *a, int64_t r0, int64_t r1, int thread)
{
    ln_job *j = a;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->ldx;
        float *y = j->y + r * j->ldy;
        /* Two-pass mean/variance in double: matches torch's f32 result to rounding. */
        double mean = 0, var = 0;
        for (int64_t i = 0; i < j->n; i++) mean += x[i];
        mean /= (double)j->n;
        for (int64_t i = 0; i < j->n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
        var /= (double)j->n;
        float inv = (float)(1.0 / sqrt(var + j->eps)), mu = (float)mean;
        for (int64_t i = 0; i < j->n; i++) {
            float v = (x[i] - mu) * inv;
            if (j->w) v *= j->w[i];
            if (j->b) v += j->b[i];
            y[i] = v;
        }
    }
}

int h3_cpu_layernorm(h3_backend *be, const h3_bt *x, const float *w, const float *b, float eps, const h3_bt *y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("layernorm", x)) || (rc = h3_cpu_need_f32("layernorm", y))) return rc;
    ln_job j = {x->data, w, b, y->data, x->ld, y->ld, x->cols, eps};
    h3_parallel_for(h3_cpu_backend_pool(be), x->rows, 16, ln_task, &j);
    return 0;
}

/* ---- copy, add_div --------------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;
    int64_t ldy, ldx, n;
    float div;
} ew_job;

static void copy_task(void *a, int64_t r0, int64_t r1, int thread)
{
    ew_job *j = a;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) memcpy(j->y + r * j->ldy, j->x + r * j->ldx, sizeof(float) * (size_t)j->n);
}

/* Rows per task for element-wise work: about 16K values, whatever the row width. */
int h3_cpu_copy(h3_backend *be, const h3_bt *src, const h3_bt *dst)
{
    int rc;
    if ((rc = h3_cpu_need_f32("copy", src)) || (rc = h3_cpu_need_f32("copy", dst))) return rc;
    ew_job j = {dst->data, src->data, dst->ld, src->ld, src->cols, 0};
    h3_parallel_for(h3_cpu_backend_pool(be), src->rows, h3_cpu_row_grain(src->cols), copy_task, &j);
    return 0;
}

static void add_div_task(void *a, int64_t r0, int64_t r1, int thread)
{
    ew_job *j = a;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) {
        float *y = j->y + r * j->ldy;
        const float *x = j->x + r * j->ldx;
        for (int64_t i = 0; i < j->n; i++) {
            float s = y[i] + x[i];
            y[i] = s / j->div; /* diffusers divides the sum (no reciprocal) */
        }
    }
}

int h3_cpu_add_div(h3_backend *be, const h3_bt *y, const h3_bt *x, float div)
{
    int rc;
    if ((rc = h3_cpu_need_f32("add_div", y)) || (rc = h3_cpu_need_f32("add_div", x))) return rc;
    ew_job j = {y->data, x->data, y->ld, x->ld, y->cols, div};
    h3_parallel_for(h3_cpu_backend_pool(be), y->rows, h3_cpu_row_grain(y->cols), add_div_task, &j);
    return 0;
}
