/*
 * The CPU backend's versions of the speed-knob ops of backend.h (extrapolate, sub, pool_pairs,
 * unpool_pairs, abs_diff_sum). Kept in their own file so the core kernels stay untouched; the
 * contracts are the ones in backend.h.
 */
#ifndef H3_CPU_KNOBS_H
#define H3_CPU_KNOBS_H

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/ops.h"

H3_INTERNAL int h3_cpu_extrapolate(h3_backend *be, float *out, const float *a, const float *b, int64_t n, float r);
H3_INTERNAL int h3_cpu_sub(h3_backend *be, float *out, const float *a, const float *b, int64_t n);
H3_INTERNAL int h3_cpu_pool_pairs(h3_backend *be, const h3_bt *src, const int64_t *pairs, const h3_bt *dst);
H3_INTERNAL int h3_cpu_unpool_pairs(h3_backend *be, const h3_bt *red, const h3_bt *base, const int64_t *pairs,
                                    const h3_bt *full);
H3_INTERNAL int h3_cpu_abs_diff_sum(h3_backend *be, const float *a, const float *b, int64_t n, double *diff,
                                    double *ref);

#endif /* H3_CPU_KNOBS_H */
