/*
 * CPU compute layer: the kernels the CPU backend is made of (the pool and the conversions
 * they share with every layer are core/host.h). Kernels are deterministic: work is split over output rows/columns only, never over a
 * reduction, so results are identical for any thread count.
 *
 * SIMD: kernels.inc is compiled twice (ops_generic.c at the baseline ISA, ops_avx2.c with
 * AVX2+FMA+F16C) and the variant is picked at run time from CPUID. H3_NO_SIMD=1 forces the
 * baseline variant, the exact slow path the fast one is checked against.
 */
#ifndef H3_OPS_H
#define H3_OPS_H

#include "core/host.h" /* the pool, h3_mat, conversions, the host GEMM hook */

/* ---- kernels --------------------------------------------------------------------------- */

/* Y[M, N] = X[M, K] . W^T + bias on the pool (core/host.h's h3_host_linear is this function,
   registered when libh3 loads). */
H3_INTERNAL int h3_linear(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W, const float *bias,
                          float *Y, int64_t ldy);

/* h3_linear without its few-rows shortcut (dot products for M <= 6): every M sums in the blocked
   order of the micro-kernel, and rows of X may overlap (ldx < K). The convolutions of the audio
   decoder rely on both: a clip of a few frames sums exactly as a long one does. */
H3_INTERNAL int h3_linear_blocked(h3_pool *p, const float *X, int64_t M, int64_t ldx, const h3_mat *W,
                                  const float *bias, float *Y, int64_t ldy);

/*
 * Scaled dot-product attention, tiled with an online softmax (memory linear in tokens).
 * Q: [Lq, heads, D] with row stride ldq; K, V: [Lk, kv_heads, D] with strides ldk/ldv;
 * O: [Lq, heads, D] with stride ldo. heads must be a multiple of kv_heads (GQA). When
 * `causal`, query i sees keys 0..i (+ Lk - Lq offset).
 */
H3_INTERNAL int h3_attention(h3_pool *p, const float *Q, int64_t ldq, const float *K, int64_t ldk,
                              const float *V, int64_t ldv, int64_t Lq, int64_t Lk, int heads,
                              int kv_heads, int D, float scale, bool causal, float *O, int64_t ldo);

/* Bytes of packed K/V h3_attention holds at once (a group of heads; at least one head). 0 restores
   the default (64 MiB). For tests of the grouping; not thread-safe. */
H3_INTERNAL void h3_attention_pack_budget(size_t bytes);

/* out[i] = up[i] * SiLU(gate[i]) (SwiGLU), vectorised; in place on either input allowed. */
H3_INTERNAL void h3_silu_mul(const float *gate, const float *up, float *out, int64_t n);
/* out[r] = SiLU(gate[r]) * up[r] for `rows` rows of n values (strides in floats; out may alias gate). */
H3_INTERNAL void h3_swiglu(h3_pool *p, const float *gate, int64_t ldg, const float *up, int64_t ldu, float *out,
                           int64_t ldo, int64_t rows, int64_t n);
/* Row helpers of the transformer (vectorised, fixed evaluation order, so thread-count independent):
   sum of squares in double; y = ((x * inv) * w) [* scale + shift] (w, and scale/shift, may be NULL);
   x += g * y (g NULL: x += y); rotate-half RoPE of 2*half values (o must not alias t). */
H3_INTERNAL double h3_sumsq(const float *x, int64_t n);
H3_INTERNAL void h3_scale_mod(const float *x, int64_t n, float inv, const float *w, const float *scale,
                              const float *shift, float *y);
H3_INTERNAL void h3_gated_add(float *x, const float *g, const float *y, int64_t n);
H3_INTERNAL void h3_rope_half(const float *t, const float *c, const float *s, int64_t half, float *o);
H3_INTERNAL float h3_gelu_tanh(float x);
H3_INTERNAL float h3_fma_loop(int64_t iters);

/* Name of the kernel variant in use ("avx2" or "generic"). */
H3_INTERNAL const char *h3_kernels_variant(void);

/* ---- per-variant entry points (ops_generic.c / ops_avx2.c) ------------------------------ */

typedef struct h3_kernels {
    const char *name;
    /* One output tile: rows [m0, m1) x cols [n0, n1) of Y = X W^T (+bias), for all of K. */
    /* With Bs, W comes pre-packed for all tasks (layout [K block][panel][kc][16], Npad columns);
       otherwise the tile packs its own columns of W. */
    void (*linear_tile)(h3_pool *p, int thread, const float *X, int64_t ldx, const h3_mat *W,
                        const float *bias, float *Y, int64_t ldy, int64_t m0, int64_t m1, int64_t n0,
                        int64_t n1, const float *Bs, int64_t Npad);
    /* Columns [n0, n1) of W for K block [k0, k0+kc) as [panel][kc][16] at dst. */
    void (*linear_pack_b)(const h3_mat *W, int64_t n0, int64_t n1, int64_t k0, int kc, float *dst);
    /* Rows [m0, m1) of Y for small M: dot products, no packing. */
    void (*linear_rows)(const float *X, int64_t ldx, const h3_mat *W, const float *bias, float *Y,
                        int64_t ldy, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
    /* Pack keys [k0, k0+bc) of one head's K and V (done once per call, shared by all query
       blocks): K as [key panel][D][16] at Kp + k0*D, V as [D panel][bc][16] at Vp + k0*dpad. */
    void (*attn_pack)(const float *K, int64_t ldk, const float *V, int64_t ldv, int64_t k0, int64_t bc, int D,
                      float *Kp, float *Vp);
    /* Attention for one (head, query block) against that head's packed K and V. */
    void (*attn_block)(h3_pool *p, int thread, const float *Q, int64_t ldq, const float *Kp, const float *Vp,
                       int64_t q0, int64_t q1, int64_t Lk, int64_t Lq, int D, float scale, bool causal,
                       float *O, int64_t ldo);
    void (*silu_mul)(const float *gate, const float *up, float *out, int64_t n);
    double (*sumsq)(const float *x, int64_t n);
    void (*scale_mod)(const float *x, int64_t n, float inv, const float *w, const float *scale, const float *shift,
                      float *y);
    void (*gated_add)(float *x, const float *g, const float *y, int64_t n);
    void (*rope)(const float *t, const float *c, const float *s, int64_t half, float *o);
    /* iters x 12 x 8 multiply-adds in registers (the arithmetic peak; see h3_bench_fma_peak). */
    float (*fma_loop)(int64_t iters);
} h3_kernels;

H3_INTERNAL extern const h3_kernels h3_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL extern const h3_kernels h3_kernels_avx2;
#endif

#endif /* H3_OPS_H */
