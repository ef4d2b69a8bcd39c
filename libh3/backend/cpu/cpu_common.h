/*
 * What the CPU backend's op files share: its worker pool, the f32-only check every op makes, and
 * the row grain of the element-wise ops (one definition each, used by cpu_backend.c, cpu_knobs.c,
 * cpu_layernorm.c, cpu_vae.c, cpu_vision.c, cpu_audio_enc.c).
 */
#ifndef H3_CPU_COMMON_H
#define H3_CPU_COMMON_H

#include "backend/backend.h"

/* The worker pool of a CPU backend (cpu_backend.c). */
H3_INTERNAL h3_pool *h3_cpu_backend_pool(h3_backend *be);

/* 0 when t is f32, else H3_E_UNSUPPORTED naming the op: the CPU backend computes in f32 only. */
H3_INTERNAL int h3_cpu_need_f32(const char *op, const h3_bt *t);

/* Rows per task of an element-wise op over rows of `cols` values: about 16k values a task. */
static inline int64_t h3_cpu_row_grain(int64_t cols)
{
    return cols >= (1 << 14) ? 1 : (1 << 14) / (cols > 0 ? cols : 1);
}

#endif
