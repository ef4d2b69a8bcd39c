/*
 * The CPU backend's row-wise ops shared by the text encoder and the VAEs (layernorm, copy,
 * add_div), in cpu_layernorm.c. The contracts are the ones in backend.h.
 */
#ifndef H3_CPU_LAYERNORM_H
#define H3_CPU_LAYERNORM_H

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/ops.h"

H3_INTERNAL int h3_cpu_layernorm(h3_backend *be, const h3_bt *x, const float *w, const float *b, float eps,
                                 const h3_bt *y);
H3_INTERNAL int h3_cpu_copy(h3_backend *be, const h3_bt *src, const h3_bt *dst);
H3_INTERNAL int h3_cpu_add_div(h3_backend *be, const h3_bt *y, const h3_bt *x, float div);

#endif /* H3_CPU_LAYERNORM_H */
