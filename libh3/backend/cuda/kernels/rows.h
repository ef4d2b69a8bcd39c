/* Shared by cuda_rows.cpp and kernels/rows.cu: the kernels' argument structs and constants. */
#ifndef H3K_ROWS_H
#define H3K_ROWS_H

namespace h3cuda {


/* ---- norm_mod ------------------------------------------------------------------------------ */

struct NormArgs {
    const void *x;
    int64_t ldx;
    const int64_t *rows;
    const float *w, *tab;
    const int32_t *entry;
    int64_t stride, slot;
    void *y;
    int64_t ldy, n;
    float eps;
    int x_bf16, y_bf16;
};

/* The residual add folded into the norm (gated_add_norm): x[r] += g * y[r] first. */
struct AddArgs {
    const void *y;
    int64_t ldy;
    int y_bf16;
    const float *tab;
    const int32_t *entry;
    int64_t stride, slot;
};

/* ---- qk_norm_rope -------------------------------------------------------------------------- */

struct QkvArgs {
    const void *qin, *kin, *vin;
    int64_t ldqi, ldki, ldvi;
    void *q, *k, *v;
    int64_t ldq, ldk, ldv;
    const float *qn, *kn, *cos, *sin;
    int heads, kv_heads, hs, D, half;
    float eps;
    int qi_bf16, ki_bf16, vi_bf16, q_bf16, k_bf16, v_bf16;
};

#define QKV_WARPS 4

} /* namespace h3cuda */

#endif
