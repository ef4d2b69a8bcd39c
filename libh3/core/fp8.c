/* fp8 (e4m3) quantisation on the host, bit for bit the CUDA backend's (see fp8.h). */
#include "core/fp8.h"

#include <math.h>
#include <string.h>

/* e4m3: 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities, 0x7F / 0xFF are NaN.
   In f32 bits (8 exponent bits, bias 127, 23 mantissa bits), the thresholds CUDA's conversion
   tests, written as f32 bit patterns so the comparisons are exact integer ones: */
#define F32_HALF_MIN_SUB 0x3A800000u /* 2^-10, half the smallest subnormal: at or below, +-0 */
#define F32_MIN_NORMAL 0x3C800000u   /* 2^-6, the smallest normal */
#define F32_SAT 0x43E80000u          /* 464 = 448 + half an ulp: above it, +-448 (ties below round to 448) */
#define F32_INF 0x7F800000u
#define HALF_ULP 0x80000u            /* half of e4m3's last mantissa bit, in f32 mantissa position */

uint8_t h3_e4m3_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > F32_INF) return 0x7F; /* CUDA turns any NaN into the positive one before converting */
    if (a <= F32_HALF_MIN_SUB) return sign;
    if (a > F32_SAT) return (uint8_t)(0x7E | sign); /* SATFINITE: +-448, infinities included */
    const int exp = (int)(a >> 23) - 127 + 7;      /* e4m3's biased exponent */
    uint32_t mant = (a >> 20) & 7u;                 /* the three kept mantissa bits, truncated */
    uint8_t res;
    if (a >= F32_MIN_NORMAL) {
        res = (uint8_t)(((unsigned)exp << 3) | mant);
        const uint32_t round = a & (2 * HALF_ULP - 1);
        /* A carry out of the mantissa bumps the exponent: still the right neighbour. */
        if (round > HALF_ULP || (round == HALF_ULP && (mant & 1u))) res++;
    } else {
        /* Subnormal: the implicit bit joins the mantissa, shifted right by 1 - exp (1 to 4). */
        const unsigned shift = (unsigned)(1 - exp);
        mant |= 8u;
        res = (uint8_t)(mant >> shift);
        const uint32_t round = (a | 0x800000u) & ((2 * HALF_ULP << shift) - 1);
        const uint32_t half = HALF_ULP << shift;
        if (round > half || (round == half && (res & 1u))) res++;
    }
    return (uint8_t)(res | sign);
}

typedef struct {
    const void *w;
    h3_dtype dt;
    int64_t cols;
    uint8_t *q;
    float *scale;
    bool nomem;
} fp8_job;

/* The value the GPU quantises: its bf16 copy of the stored weight (cuda_backend.cu rounds f32
   and f16 to bf16, to nearest even, before fp8_rows_kernel reads it). */
static void row_as_gpu(const void *src, h3_dtype dt, float *out, int64_t n)
{
    h3_to_f32(src, dt, out, n);
    if (dt != H3_DT_BF16)
        for (int64_t i = 0; i < n; i++) out[i] = h3_bf16_to_f32(h3_f32_to_bf16(out[i]));
}

static void fp8_task(void *arg, int64_t b, int64_t e, int thread)
{
    fp8_job *j = arg;
    (void)thread;
    const size_t esz = h3_dtype_size(j->dt);
    float *row = h3_alloc_aligned(sizeof(float) * (size_t)(j->cols ? j->cols : 1));
    if (!row) {
        __atomic_store_n(&j->nomem, true, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = b; r < e; r++) {
        row_as_gpu((const char *)j->w + (size_t)r * (size_t)j->cols * esz, j->dt, row, j->cols);
        float amax = 0.0f;
        for (int64_t i = 0; i < j->cols; i++) amax = fmaxf(amax, fabsf(row[i]));
        const float s = amax > 0.0f && isfinite(amax) ? amax / H3_FP8_MAX : 1.0f;
        j->scale[r] = s;
        uint8_t *q = j->q + (size_t)r * (size_t)j->cols;
        for (int64_t i = 0; i < j->cols; i++) q[i] = h3_e4m3_from_f32(row[i] / s);
    }
    h3_free_aligned(row);
}

int h3_fp8_quantize(h3_pool *p, const void *w, h3_dtype dt, int64_t rows, int64_t cols, uint8_t *q, float *scale)
{
    if (dt != H3_DT_F32 && dt != H3_DT_BF16 && dt != H3_DT_F16)
        return h3_err(H3_E_SCHEMA, "fp8 weights: quantising takes F32, BF16 or F16 weights, got %s",
                      h3_dtype_name(dt));
    if (rows < 0 || cols < 0)
        return h3_err(H3_E_INVALID, "fp8 weights: shape %lld x %lld", (long long)rows, (long long)cols);
    fp8_job j = {w, dt, cols, q, scale, false};
    h3_parallel_for(p, rows, 16, fp8_task, &j);
    if (j.nomem) return h3_err(H3_E_NOMEM, "fp8 weights: out of memory for a row of %lld values", (long long)cols);
    return 0;
}
