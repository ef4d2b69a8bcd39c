/*
 * Weight-only int8 GEMM weights on the CPU (h3_options.precision = H3_PRECISION_INT8).
 *
 * Quantisation, per output channel (row n of W [N, K]): s[n] = max_k |w[n][k]| / 127 (f32
 * division), q[n][k] = w[n][k] / s[n] (f32 division) rounded to nearest, ties to even, in
 * [-127, 127]; an all-zero row has s = 0 and q = 0. Non-finite weights are refused. The weight a
 * GEMM multiplies by is the dequantised value (float)q * s, one rounded product.
 *
 * The GEMM dequantises W while packing it into the micro-kernel's panels (or, for a few rows of X,
 * into a row buffer for the dot products) and then runs ops.c's f32 kernels unchanged. So
 * h3_linear_i8 gives exactly the bits h3_linear gives over the dequantised weights, at every M,
 * for every thread count and kernel variant: a contract tests/c/test_backend_ops.c checks.
 *
 * Dequantising in the packing rather than in the micro-kernel keeps that one micro-kernel (and its
 * summation order) the only one; the weights are read once per call at 1 byte each. Activations
 * stay f32, so the multiply-adds cost what they cost with f32 weights: int8 halves the resident
 * weight bytes of bf16 (a quarter of f32) and helps speed only where weight bandwidth dominates.
 *
 * Kernels (cpu_int8.inc) are compiled per ISA like kernels.inc: cpu_int8_generic.c at the baseline
 * ISA, cpu_int8_avx2.c with AVX2; the variant follows h3_kernels_variant() (H3_NO_SIMD=1 included).
 */
#ifndef H3_CPU_INT8_H
#define H3_CPU_INT8_H

#include "backend/cpu/ops.h"

/* A quantised weight [rows, cols]: q row-major int8, one scale per row. */
typedef struct h3_i8w {
    const int8_t *q;
    const float *scale;
    int64_t rows, cols;
} h3_i8w;

/* The CPU backend's int8 weight handle (h3_bw.priv of an H3_DT_I8 weight): the codes and scales,
   the ConvRot group of the activations (0: none), and the block that owns them when they were
   quantised at load (NULL when they are views of a single file's mapping). */
typedef struct h3_i8_handle {
    h3_i8w w;
    int group;
    void *block;
} h3_i8_handle;

/*
 * Quantise src (F32, BF16 or F16, [rows, cols] row-major) into one new 64-byte aligned block that
 * holds the scales [rows] (f32) and then q [rows * cols], rows in parallel on the pool. *block is
 * freed with h3_free_aligned. Errors: a non-float dtype, a non-finite weight (its row is named),
 * out of memory.
 */
H3_INTERNAL int h3_i8_quantize(h3_pool *p, const void *src, h3_dtype dt, int64_t rows, int64_t cols, void **block);
/* The weight inside a block made by h3_i8_quantize. */
H3_INTERNAL h3_i8w h3_i8_view(const void *block, int64_t rows, int64_t cols);
/* Bytes of such a block (what stays resident for the weight). */
H3_INTERNAL size_t h3_i8_block_bytes(int64_t rows, int64_t cols);

/* Y[M, N] = X[M, K] . deq(W)^T + bias (N = W->rows, K = W->cols; bias f32 [N] or NULL), with
   h3_linear's tiling, thresholds and sums. Y must not alias X. Returns 0 or -H3_E_NOMEM. */
H3_INTERNAL int h3_linear_i8(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_i8w *W, const float *bias,
                             float *Y, int64_t ldy);

/*
 * ConvRot (ComfyUI's int8_convrot files): out[m] = X[m] with each group of `group` consecutive
 * columns multiplied by H, the orthonormal Hadamard matrix of order group (a power of 4, >= 4):
 * H = kron(H4, ..., H4) / sqrt(group), H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]] / 2.
 * H is symmetric, so a weight stored as W' = W_g H (per group, what the file's codes hold after
 * W = W' H^T) gives X W^T = (X H) W'^T. Computed as one H4 butterfly per base-4 digit (f32 sums
 * in a fixed order, then the exact power-of-two 1/sqrt(group)): the bits do not depend on threads.
 * Rows in parallel. K must be a multiple of group; out must not alias X.
 */
H3_INTERNAL void h3_i8_rotate(h3_pool *p, const float *X, int64_t M, int64_t ldx, int64_t K, int group, float *out,
                              int64_t ldo);
/* Y = (X rotated by h3_i8_rotate, group `group`; 0: not rotated) . deq(W)^T + bias. The rotated
   rows are staged h3_i8_rot_rows(K) at a time (a count that depends on K only, so the bits do not
   depend on the thread count). Returns 0 or -H3_E_NOMEM. */
H3_INTERNAL int h3_linear_i8_rot(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_i8w *W, int group,
                                 const float *bias, float *Y, int64_t ldy);
static inline int64_t h3_i8_rot_rows(int64_t K)
{
    const int64_t r = ((int64_t)4 << 20) / (K > 0 ? K : 1) / 96 * 96; /* 16 MiB of f32 rows, whole 96-row tiles */
    return r > 96 ? r : 96;
}

/* Largest W (as packed f32) that h3_linear_i8 dequantises once for all its tasks; bigger ones are
   dequantised one K block of a column tile at a time. 0 restores the default (32 MiB, h3_linear's).
   For tests of both paths; not thread-safe. */
H3_INTERNAL void h3_linear_i8_share_budget(size_t bytes);

/* ---- per-variant kernels (cpu_int8_generic.c / cpu_int8_avx2.c) ------------------------- */

typedef struct h3_i8_kernels {
    const char *name;
    /* Dequantised columns [n0, n1) of W^T for the K block [k0, k0 + kc) as [panel][kc][16] at dst
       (panels of 16 output channels, zero-padded): the B operand layout of the micro-kernel. */
    void (*pack_b)(const h3_i8w *W, int64_t n0, int64_t n1, int64_t k0, int kc, float *dst);
    /* Dequantised rows [n0, n1) of W to dst [n1 - n0][cols]. */
    void (*dequant_rows)(const h3_i8w *W, int64_t n0, int64_t n1, float *dst);
    /* Quantise one row of n f32 values (see above). Returns 0, or -1 when a value is not finite. */
    int (*quantize_row)(const float *w, int64_t n, int8_t *q, float *scale);
} h3_i8_kernels;

H3_INTERNAL extern const h3_i8_kernels h3_i8_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL extern const h3_i8_kernels h3_i8_kernels_avx2;
#endif

#endif /* H3_CPU_INT8_H */
