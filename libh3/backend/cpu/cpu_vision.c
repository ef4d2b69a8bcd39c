/*
 * The CPU backend's vision-tower ops (contracts in backend.h): GELU in its two forms and a plain
 * rotate-half rotary embedding. Work is split over rows only, so results do not depend on the
 * thread count.
 */
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_vision.h"
#include "backend/cpu/ops.h"

#include <math.h>

/* ---- gelu ------------------------------------------------------------------------------------ */

typedef struct {
    const float *x;
    float *y;
    int64_t ldx, ldy, n;
    bool tanh_approx;
} gelu_job;

/* Evaluated in double and rounded once: within an ulp of torch's f32 kernels (which take their
   erf / tanh from SLEEF), and the same bits on every machine with a correctly behaved libm. */
static void gelu_task(void *a, int64_t r0, int64_t r1, int thread)
{
    gelu_job *j = a;
    (void)thread;
    const double beta = M_SQRT2 * M_2_SQRTPI * 0.5, kappa = 0.044715;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->ldx;
        float *y = j->y + r * j->ldy;
        if (j->tanh_approx) {
            for (int64_t i = 0; i < j->n; i++) {
                const double v = x[i];
                y[i] = (float)(0.5 * v * (1.0 + tanh(beta * (v + kappa * v * v * v))));
            }
        } else {
            for (int64_t i = 0; i < j->n; i++) {
                const double v = x[i];
                y[i] = (float)(0.5 * v * (1.0 + erf(v * M_SQRT1_2)));
            }
        }
    }
}

int h3_cpu_gelu(h3_backend *be, const h3_bt *x, bool tanh_approx, const h3_bt *y)
{
    int rc;
    if ((rc = h3_cpu_need_f32("gelu", x)) || (rc = h3_cpu_need_f32("gelu", y))) return rc;
    if (x->rows != y->rows || x->cols != y->cols)
        return h3_err(H3_E_INVALID, "gelu: %lldx%lld input, %lldx%lld output", (long long)x->rows,
                      (long long)x->cols, (long long)y->rows, (long long)y->cols);
    gelu_job j = {x->data, y->data, x->ld, y->ld, x->cols, tanh_approx};
    h3_parallel_for(h3_cpu_backend_pool(be), x->rows, h3_cpu_row_grain(x->cols), gelu_task, &j);
    return 0;
}

/* ---- rope ------------------------------------------------------------------------------------ */

typedef struct {
    float *x;
    const float *cos, *sin;
    int64_t ld;
    int heads, D, half;
} rope_job;

/* torch's q * cos + rotate_half(q) * sin: each product rounded, then the sum (no fused
   multiply-add: the build pins -ffp-contract=off). */
static void rope_task(void *a, int64_t r0, int64_t r1, int thread)
{
    rope_job *j = a;
    (void)thread;
    for (int64_t r = r0; r < r1; r++) {
        const float *c = j->cos + r * j->half, *s = j->sin + r * j->half;
        for (int h = 0; h < j->heads; h++) {
            float *x = j->x + r * j->ld + (int64_t)h * j->D;
            for (int d = 0; d < j->half; d++) {
                const float lo = x[d], hi = x[d + j->half];
                const float lc = lo * c[d], hs = hi * s[d], hc = hi * c[d], ls = lo * s[d];
                x[d] = lc - hs;
                x[d + j->half] = hc + ls;
            }
        }
    }
}

int h3_cpu_rope(h3_backend *be, const h3_bt *x, int heads, int D, int half, const float *cos, const float *sin)
{
    int rc = h3_cpu_need_f32("rope", x);
    if (rc) return rc;
    if (heads < 1 || D < 1 || half < 0 || 2 * half > D || (int64_t)heads * D > x->cols || !cos || !sin)
        return h3_err(H3_E_INVALID, "rope: %d heads of %d dims, %d rotated pairs, over %lld columns", heads, D, half,
                      (long long)x->cols);
    rope_job j = {x->data, cos, sin, x->ld, heads, D, half};
    h3_parallel_for(h3_cpu_backend_pool(be), x->rows, h3_cpu_row_grain((int64_t)heads * D), rope_task, &j);
    return 0;
}
