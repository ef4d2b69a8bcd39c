/*
 * The CPU kernels of BigVGAN's alias-free activation and output convolution (the backend's
 * snake_aa and conv1_clamp ops, backend/cpu/cpu_vae.c). Written once in avae_kern.inc and
 * compiled per ISA like kernels.inc: avae_kern_generic.c at the baseline ISA, avae_kern_avx2.c
 * with AVX2+FMA. The decoder's other convolutions are GEMMs over overlapping rows and run on the
 * shared micro-kernel (h3_linear_blocked).
 */
#ifndef H3_AVAE_KERN_H
#define H3_AVAE_KERN_H

#include "backend/backend.h"
#include "backend/cpu/ops.h"

/* One alias-free SnakeBeta over x [L, C]: 2x upsample (replicate edges), x + rb*sin^2(a x),
   low-pass 2x downsample (replicate edges). a = exp(alpha), rb = 1 / (exp(beta) + 1e-9). */
typedef struct h3_avae_act {
    const float *x;
    int64_t L;
    int C;
    const float *a, *rb;       /* [C] */
    /* The C % 8 tail channels' a and rb (all channels when C < 8) repeated to lcm(tail, 8). */
    const float *tail_a, *tail_rb;
    int tail_period;
    const float *fup, *fdown;  /* [H3_AA_TAPS] each */
    h3_bphased dst;
} h3_avae_act;

/* Largest tail period: lcm(7, 8). */
#define H3_AVAE_MAX_TAIL 56

typedef struct h3_avae_kernels {
    const char *name;
    /* Output rows [m0, m1) of an activation; `z` is 32-byte aligned scratch of
       (2 (m1 - m0) + H3_AA_TAPS) * 16 floats (channels go 16 at a time). */
    void (*act_rows)(const h3_avae_act *a, int64_t m0, int64_t m1, float *z);
    /* y[t] = clamp(sum_j X[t * ldx + j] * w[j], -1, 1) over j < n, for t in [t0, t1). */
    void (*post_rows)(const float *X, int64_t ldx, int n, const float *w, float *y, int64_t t0, int64_t t1);
    /* y[i] = sin(x[i])^2 for n values (exposed for the kernel tests). */
    void (*sin2)(const float *x, float *y, int64_t n);
} h3_avae_kernels;

H3_INTERNAL extern const h3_avae_kernels h3_avae_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL extern const h3_avae_kernels h3_avae_kernels_avx2;
#endif
/* The variant matching h3_kernels_variant() (so H3_NO_SIMD=1 selects the baseline here too). */
H3_INTERNAL const h3_avae_kernels *h3_avae_kern(void);

#endif /* H3_AVAE_KERN_H */
