/*
 * The CPU backend's versions of the vision tower's ops (gelu, rope), in cpu_vision.c. The
 * contracts are the ones in backend.h.
 */
#ifndef H3_CPU_VISION_H
#define H3_CPU_VISION_H

#include "backend/backend.h"

H3_INTERNAL int h3_cpu_gelu(h3_backend *be, const h3_bt *x, bool tanh_approx, const h3_bt *y);
H3_INTERNAL int h3_cpu_rope(h3_backend *be, const h3_bt *x, int heads, int D, int half, const float *cos,
                            const float *sin);

#endif /* H3_CPU_VISION_H */
