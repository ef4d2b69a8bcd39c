/*
 * Audio VAE decoder (BigVGAN) internals: the entry point the pipeline code calls, and the
 * per-ISA kernels (avae_kern.inc, compiled by avae_kern_generic.c and avae_kern_avx2.c) that
 * audio_vae.c drives.
 *
 * Activations are time-major ([time, channels], one row per sample) so that a convolution over
 * a zero-margined buffer is a plain GEMM whose input rows overlap: row t of the im2col matrix is
 * the K consecutive rows starting at t, i.e. the same memory with a row stride of `channels`.
 */
#ifndef H3_AUDIO_VAE_H
#define H3_AUDIO_VAE_H

#include "h3.h"
#include "backend/cpu/ops.h"

/* The alias-free activation of diffusers (MiniMaxH3AudioActivation1d) always resamples by 2
   with 12-tap Kaiser-sinc filters; the stored filter tensors are checked to be [1, 1, 12]. */
#define H3_AA_RATIO 2
#define H3_AA_TAPS 12

/*
 * Where activation output row m (of L) goes: phase-split, zero-margined layout used as the input
 * of a dilated convolution. Phase r = m % d holds rows m = r, r + d, ... contiguously, starting
 * at row r * phase_rows + margin. d = 1 gives a plain buffer with `margin` zero rows on each side.
 */
typedef struct h3_avae_dst {
    float *p;
    int d;
    int64_t phase_rows, margin;
} h3_avae_dst;

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
    h3_avae_dst dst;
} h3_avae_act;

/*
 * A convolution weight packed once at load for the convolution kernel: output channels in panels
 * of 16, each panel [K][16] (zero past N), 32-byte aligned. Column k of the im2col row is tap
 * k / cin of input channel k % cin.
 */
#define H3_AVAE_NR 16
typedef struct h3_avae_pw {
    float *p;
    int64_t K;
    int N;
} h3_avae_pw;

static inline float *h3_avae_pw_at(const h3_avae_pw *w, int n, int64_t k)
{
    return w->p + ((int64_t)(n / H3_AVAE_NR) * w->K + k) * H3_AVAE_NR + n % H3_AVAE_NR;
}

/* Y[m][n] = bias[n] + sum_k X[m ldx + k] W[n][k]: im2col-free, row m of X is the K floats at
   x + m ldx, so consecutive rows overlap when ldx < K (a convolution over time-major rows). */
typedef struct h3_avae_gemm {
    const float *x;
    int64_t ldx;
    const h3_avae_pw *w;
    const float *bias; /* [N] or NULL */
    float *y;
    int64_t ldy;
} h3_avae_gemm;

typedef struct h3_avae_kernels {
    const char *name;
    /* Output rows [m0, m1) of an activation; `z` is 32-byte aligned scratch of
       (2 (m1 - m0) + H3_AA_TAPS) * 16 floats (channels go 16 at a time). */
    void (*act_rows)(const h3_avae_act *a, int64_t m0, int64_t m1, float *z);
    /* pcm[t] = clamp(sum_j P[t * C + j] * w[j], -1, 1) over j < K * C, for t in [t0, t1). */
    void (*post_rows)(const float *P, int C, int K, const float *w, float *pcm, int64_t t0, int64_t t1);
    /* Rows [m0, m1) and panels [p0, p1) of a convolution GEMM. The sum over k runs in the same
       blocks and order for every output, so any split gives the same bits. */
    void (*gemm_tile)(const h3_avae_gemm *g, int64_t m0, int64_t m1, int p0, int p1);
    /* y[i] = sin(x[i])^2 for n values (exposed for the kernel tests). */
    void (*sin2)(const float *x, float *y, int64_t n);
} h3_avae_kernels;

H3_INTERNAL extern const h3_avae_kernels h3_avae_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
H3_INTERNAL extern const h3_avae_kernels h3_avae_kernels_avx2;
#endif
/* The variant matching h3_kernels_variant() (so H3_NO_SIMD=1 selects the baseline here too). */
H3_INTERNAL const h3_avae_kernels *h3_avae_kern(void);

/* ---- pipeline entry points ------------------------------------------------------------- */

/* Geometry of a decode: samples per side for `frames` latent frames (or a negative H3_E*). */
H3_INTERNAL int64_t h3_avae_samples(const h3_avae_cfg *c, int64_t frames);

/* Peak activation memory (bytes) of h3_avae_decode for `frames` latent frames on `threads`
   threads, buffer for buffer; the folded weights (about the decoder's stored bytes) come on top. */
H3_INTERNAL int64_t h3_avae_work_bytes(const h3_avae_cfg *c, int64_t frames, int threads);

/*
 * Decode normalised audio latents [2, C, frames] (side-major, as the DiT's audio rows unpack:
 * all left rows then all right rows) into PCM [2, samples] in [-1, 1] at c->sample_rate. Loads
 * and folds the decoder weights, decodes each stereo side as an independent batch item (as
 * diffusers does), and releases the weights and the file mapping before returning. `progress`
 * (may be NULL) is called between convolutions; a non-zero return cancels with H3_E_CANCELLED.
 * `pcm_cap` is the number of floats pcm can hold (at least 2 * samples).
 */
H3_INTERNAL int h3_avae_decode(h3_model *m, h3_pool *pool, const float *latents, int channels,
                               int64_t frames, float *pcm, int64_t pcm_cap, h3_progress_fn progress,
                               void *user);

/* Refuse a decoder geometry this engine cannot run (one line naming the config). */
H3_INTERNAL int h3_avae_check_geometry(const h3_avae_cfg *c, const char *path);

#endif /* H3_AUDIO_VAE_H */
