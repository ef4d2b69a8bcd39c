/*
 * Host helpers every layer uses on the CPU, whatever backend computes the stages: the worker pool
 * (core/pool.c), the weight-matrix view h3_mat, dtype conversions (core/host.c) and the host GEMM.
 * Work is split over outputs only, never over a reduction, so results are identical for any
 * thread count.
 */
#ifndef H3_HOST_H
#define H3_HOST_H

#include "core/internal.h"

/* ---- thread pool (core/pool.c) ----------------------------------------------------------- */

typedef struct h3_pool h3_pool;

H3_INTERNAL h3_pool *h3_pool_create(int threads);
H3_INTERNAL void h3_pool_destroy(h3_pool *p);
H3_INTERNAL int h3_pool_threads(const h3_pool *p);

/*
 * Run fn(arg, begin, end, thread) over [0, n) in chunks of at least `grain` items, on all
 * threads (the caller included). `thread` is in [0, threads) and indexes per-thread scratch.
 * Chunks must write disjoint outputs. Calls from inside a task run serially.
 */
typedef void (*h3_task_fn)(void *arg, int64_t begin, int64_t end, int thread);
H3_INTERNAL void h3_parallel_for(h3_pool *p, int64_t n, int64_t grain, h3_task_fn fn, void *arg);

/* Per-thread scratch of at least `bytes` (64-byte aligned), valid until the next call for the
   same thread and slot. NULL on allocation failure. Slots: 0, 1 GEMM tiles, 2 attention, 3 of
   thread 0: the weight matrix h3_linear packs once and shares with all its tasks. */
H3_INTERNAL void *h3_pool_scratch(h3_pool *p, int thread, int slot, size_t bytes);
#define H3_SCRATCH_SLOTS 4

/* ---- weights and dtype conversions (core/host.c) ----------------------------------------- */

/* A weight matrix [rows, cols] (row = one output feature) stored as F32, BF16 or F16. */
typedef struct h3_mat {
    const void *data;
    h3_dtype dtype;
    int64_t rows, cols;
} h3_mat;

/* Convert n values of a float dtype to f32 (exact for every dtype; F16 through F16C where the
   CPU has it and H3_NO_SIMD is off, the same values either way). */
H3_INTERNAL void h3_to_f32(const void *src, h3_dtype dt, float *dst, int64_t n);
static inline float h3_bf16_to_f32(uint16_t v)
{
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)v << 16};
    return x.f;
}
/* IEEE half -> f32, exact (subnormals normalised, infinities and NaN payloads kept). */
static inline float h3_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3FF;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union {
        uint32_t u;
        float f;
    } x = {bits};
    return x.f;
}
H3_INTERNAL uint16_t h3_f32_to_bf16(float f); /* round to nearest even */
H3_INTERNAL float h3_silu(float x);

/* x86 features usable by this process (CPU and OS support), H3_CPU_* bits; 0 elsewhere. */
enum { H3_CPU_AVX2 = 1, H3_CPU_FMA = 2, H3_CPU_F16C = 4, H3_CPU_AVX512F = 8, H3_CPU_ZMM_OS = 16 };
H3_INTERNAL unsigned h3_cpu_x86_features(void);
/* Whether this process runs the AVX2+FMA+F16C code paths: the CPU has all three and H3_NO_SIMD
   is off (read once per process). The CPU kernels and h3_to_f32 choose by it. */
H3_INTERNAL bool h3_host_simd(void);

/* ---- host GEMM ------------------------------------------------------------------------------ */

/*
 * Y[M, N] = X[M, K] . W^T + bias   (W is [N, K]; bias f32 [N] or NULL).
 * ldx/ldy are row strides in elements. Y must not alias X. Returns 0 or a negative H3_E_* code.
 * The host work of the stages (the transformer's timestep embedding, LoRA merges) runs on it. The
 * kernel is the CPU kernel set's blocked GEMM (backend/cpu/ops.c, the one copy of that kernel),
 * which registers itself here when libh3 loads: core and the stages call it without depending on
 * the backend (the layering check forbids that include), and no second GEMM is written for them.
 */
typedef int (*h3_host_gemm_fn)(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W,
                               const float *bias, float *Y, int64_t ldy);
H3_INTERNAL void h3_host_gemm_register(h3_host_gemm_fn fn);
H3_INTERNAL int h3_host_linear(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W,
                               const float *bias, float *Y, int64_t ldy);

#endif /* H3_HOST_H */
