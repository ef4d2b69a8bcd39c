/* Shared by cuda_layernorm.cpp and kernels/layernorm.cu: the kernels' argument structs and constants. */
#ifndef H3K_LAYERNORM_H
#define H3K_LAYERNORM_H

namespace h3cuda {

/* ---- layernorm ----------------------------------------------------------------------------- */

struct LnArgs {
    const void *x;
    int64_t ldx;
    const float *w, *b;
    void *y;
    int64_t ldy, n;
    float eps;
    int x_bf16, y_bf16;
};

} /* namespace h3cuda */

#endif
