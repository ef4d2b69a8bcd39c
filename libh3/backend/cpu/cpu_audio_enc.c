/*
 * The CPU backend's audio-VAE-encoder ops (contracts in backend.h): the plain Snake of the DAC
 * trunk written into a phased convolution input, the pre_block's head mean + adaptive average
 * pooling, and an element-wise product (GeGLU's gate). Work is split over rows only, so results
 * do not depend on the thread count.
 */
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_audio_enc.h"
#include "backend/cpu/ops.h"

#include <math.h>
#include <string.h>

/* ---- snake ----------------------------------------------------------------------------------- */

typedef struct {
    const float *x, *a, *rb;
    h3_bphased d;
    int64_t C;
} snake_job;

/* torch's x + rb * sin(a * x).pow(2) in f32, one rounding per step (the build pins
   -ffp-contract=off); the sine is evaluated in double and rounded, within an ulp of torch's. */
static void snake_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    snake_job *j = arg;
    (void)thread;
    for (int64_t m = r0; m < r1; m++) {
        const float *x = j->x + m * j->C;
        float *y = j->d.p + ((m % j->d.d) * j->d.phase_rows + j->d.margin + m / j->d.d) * j->C;
        for (int64_t c = 0; c < j->C; c++) {
            const float ax = j->a[c] * x[c];
            const float s = (float)sin((double)ax);
            const float s2 = s * s;
            const float p = j->rb[c] * s2;
            y[c] = x[c] + p;
        }
    }
}

int h3_cpu_snake(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const h3_bphased *dst)
{
    int rc = h3_cpu_need_f32("snake", x);
    if (rc) return rc;
    const int64_t C = x->cols, L = x->rows;
    if (x->ld != C || C < 1 || !a || !rb || !dst || !dst->p || dst->d < 1 || dst->margin < 0 ||
        dst->phase_rows < (L + dst->d - 1) / dst->d + dst->margin)
        return h3_err(H3_E_INVALID, "cpu backend: snake of %lld x %lld (row stride %lld) into %d phases of %lld rows",
                      (long long)L, (long long)C, (long long)x->ld, dst ? dst->d : 0,
                      (long long)(dst ? dst->phase_rows : 0));
    /* Margins and phase tails are zeros: the convolution that reads this buffer pads with them. */
    for (int r = 0; r < dst->d; r++) {
        const int64_t rows = r < L ? (L - r + dst->d - 1) / dst->d : 0, tail = dst->margin + rows;
        float *ph = dst->p + (int64_t)r * dst->phase_rows * C;
        memset(ph, 0, sizeof(float) * (size_t)(dst->margin * C));
        memset(ph + tail * C, 0, sizeof(float) * (size_t)((dst->phase_rows - tail) * C));
    }
    snake_job j = {x->data, a, rb, *dst, C};
    h3_parallel_for(h3_cpu_backend_pool(be), L, h3_cpu_row_grain(C), snake_task, &j);
    return 0;
}

/* ---- head_pool ------------------------------------------------------------------------------- */

typedef struct {
    const float *x;
    float *y;
    int64_t ldx, ldy;
    int heads, D, out;
} pool_job;

/* torch.mean over the heads (an f32 sum in head order, then a true division), then
   adaptive_avg_pool1d's windows [floor(j D / out), ceil((j + 1) D / out)) summed in f32 in index
   order and divided by their length. */
static void pool_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    pool_job *j = arg;
    (void)thread;
    float mean[4096];
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->ldx;
        for (int i = 0; i < j->D; i++) {
            float s = 0.0f;
            for (int h = 0; h < j->heads; h++) s += x[(int64_t)h * j->D + i];
            mean[i] = s / (float)j->heads;
        }
        float *y = j->y + r * j->ldy;
        for (int o = 0; o < j->out; o++) {
            const int b = (int)((int64_t)o * j->D / j->out), e = (int)(((int64_t)(o + 1) * j->D + j->out - 1) / j->out);
            float s = 0.0f;
            for (int i = b; i < e; i++) s += mean[i];
            y[o] = s / (float)(e - b);
        }
    }
}

int h3_cpu_head_pool(h3_backend *be, const h3_bt *x, int heads, int D, const h3_bt *y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("head_pool", x)) || (rc = h3_cpu_need_f32("head_pool", y))) return rc;
    if (heads < 1 || D < 1 || D > 4096 || (int64_t)heads * D > x->cols || y->cols < 1 || y->cols > 65536 ||
        y->rows != x->rows)
        return h3_err(H3_E_INVALID, "cpu backend: head_pool of %d heads x %d over %lld x %lld into %lld x %lld", heads,
                      D, (long long)x->rows, (long long)x->cols, (long long)y->rows, (long long)y->cols);
    pool_job j = {x->data, y->data, x->ld, y->ld, heads, D, (int)y->cols};
    h3_parallel_for(h3_cpu_backend_pool(be), x->rows, h3_cpu_row_grain((int64_t)heads * D), pool_task, &j);
    return 0;
}

/* ---- mul ------------------------------------------------------------------------------------- */

typedef struct {
    const float *a, *b;
    float *y;
    int64_t lda, ldb, ldy, n;
} mul_job;

static void mul_task(void *arg, int64_t r0, int64_t r1, int thread)
{
    mul_job *j = arg;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) {
        const float *a = j->a + r * j->lda, *b = j->b + r * j->ldb;
        float *y = j->y + r * j->ldy;
        for (int64_t i = 0; i < j->n; i++) y[i] = a[i] * b[i];
    }
}

int h3_cpu_mul(h3_backend *be, const h3_bt *a, const h3_bt *b, const h3_bt *y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("mul", a)) || (rc = h3_cpu_need_f32("mul", b)) || (rc = h3_cpu_need_f32("mul", y))) return rc;
    if (a->rows != y->rows || b->rows != y->rows || a->cols != y->cols || b->cols != y->cols)
        return h3_err(H3_E_INVALID, "cpu backend: mul of %lldx%lld by %lldx%lld into %lldx%lld", (long long)a->rows,
                      (long long)a->cols, (long long)b->rows, (long long)b->cols, (long long)y->rows,
                      (long long)y->cols);
    mul_job j = {a->data, b->data, y->data, a->ld, b->ld, y->ld, y->cols};
    h3_parallel_for(h3_cpu_backend_pool(be), y->rows, h3_cpu_row_grain(y->cols), mul_task, &j);
    return 0;
}
