/*
 * Sampler arithmetic: the MiniMaxH3Scheduler sigma grid reproduced bit for bit, its Euler step,
 * and the engine's counter-based Gaussian noise.
 *
 * Bit-exactness notes (checked against torch 2.13 / diffusers 0.42.1 in tests/test_dit.py):
 *  - torch.linspace(1, 0, N, float32) on CPU evaluates element i as
 *        i <  N/2 :  start + step * i      (one fused multiply-add)
 *        i >= N/2 :  end - step * (N-1-i)  (one fused multiply-add)
 *    with step = (end - start) / (N - 1) in f32. The fusion is what torch's AVX2/AVX-512 kernels
 *    compute; its non-SIMD "default" capability (ATEN_CPU_CAPABILITY=default) rounds the product
 *    first and gives a grid that differs in the last bit for many N. libh3 follows the SIMD
 *    kernels, i.e. what diffusers computes on any x86-64 machine with AVX2.
 *  - The shift s*b / (1 + (s-1)*b) is four separate f32 tensor operations in torch (s and s-1
 *    are Python doubles rounded to f32 once), so no contraction is allowed here: GCC in ISO C
 *    mode does not contract, and clang is told so below.
 */
#include "core/schedule.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

int h3_sched_sigmas(int steps, double shift, float *sigmas)
{
    if (steps < 2 || steps > 100000)
        return h3_err(H3_E_INVALID, "schedule: steps must be between 2 and 100000 (sigma grid points, "
                      "terminal 0 included), got %d", steps);
    if (!(shift > 0) || !isfinite(shift))
        return h3_err(H3_E_INVALID, "schedule: shift must be a positive number, got %g", shift);
    const float start = 1.0f, end = 0.0f;
    const float step = (end - start) / (float)(steps - 1);
    const int half = steps / 2;
    const float s = (float)shift, s1 = (float)(shift - 1.0);
    int n = 0;
    for (int i = 0; i < steps; i++) {
        /* fmaf is exact (one rounding) whether or not the CPU has an FMA unit. */
        float b = i < half ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - 1 - i), end);
        float num = s * b;
        float den = 1.0f + s1 * b;
        float sigma = num / den;
        /* torch.unique_consecutive: the shift can map neighbouring grid points to one f32. */
        if (n == 0 || sigma != sigmas[n - 1]) sigmas[n++] = sigma;
    }
    if (n < 2)
        return h3_err(H3_E_INVALID, "schedule: %d steps with shift %g collapse to a single sigma", steps, shift);
    return n;
}

/* ---- named grids ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    double shift_video, shift_audio; /* 0 = the model's */
    bool h3c;                        /* h3.c's base 1 - i/E instead of torch's linspace */
} sched_def;

static const sched_def SCHEDS[] = {
    {"h3", 0, 0, false},
    {"turbo-544p", 12.0, 3.0, false},
    {"turbo-768p", 6.0, 3.0, false},
    {"pdd", 12.0, 3.0, false},
    {"h3c-lowstep", 12.0, 3.0, true},
};
#define N_SCHEDS ((int)(sizeof SCHEDS / sizeof *SCHEDS))

int h3_sched_find(const char *name)
{
    for (int i = 0; name && i < N_SCHEDS; i++)
        if (strcmp(name, SCHEDS[i].name) == 0) return i;
    return -1;
}

const char *h3_sched_name(int i) { return i >= 0 && i < N_SCHEDS ? SCHEDS[i].name : NULL; }

const char *h3_sched_names(void)
{
    static char buf[256];
    if (!buf[0]) {
        size_t k = 0;
        for (int i = 0; i < N_SCHEDS && k < sizeof buf; i++)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? ", " : "", SCHEDS[i].name);
    }
    return buf;
}

/* h3.c's low-step grid: f32 throughout, base 1 - i/E, the shift as four roundings. */
static int sched_h3c(int steps, double shift, float *sigmas)
{
    if (steps < 3 || steps > 100000)
        return h3_err(H3_E_INVALID, "schedule h3c-lowstep: steps must be between 3 and 100000 (sigma grid points, "
                      "terminal 0 included: 2 or more passes), got %d", steps);
    const int E = steps - 1;
    const float s = (float)shift, den = (float)E;
    for (int i = 0; i <= E; i++) {
        float q = (float)i / den;
        float base = 1.0f - q;
        float num = s * base;
        float d = 1.0f + (s - 1.0f) * base;
        sigmas[i] = num / d;
    }
    sigmas[E] = 0.0f;
    return steps;
}

int h3_sched_named(const char *name, int steps, double model_shift_video, double model_shift_audio, float *video,
                   float *audio)
{
    const int i = h3_sched_find(name && name[0] ? name : "h3");
    if (i < 0) return h3_err(H3_E_INVALID, "schedule '%s' does not exist (known: %s)", name, h3_sched_names());
    const sched_def *d = &SCHEDS[i];
    const double sv = d->shift_video > 0 ? d->shift_video : model_shift_video;
    const double sa = d->shift_audio > 0 ? d->shift_audio : model_shift_audio;
    int nv, na;
    if (d->h3c) {
        nv = sched_h3c(steps, sv, video);
        na = nv < 0 ? nv : sched_h3c(steps, sa, audio);
    } else {
        nv = h3_sched_sigmas(steps, sv, video);
        na = nv < 0 ? nv : h3_sched_sigmas(steps, sa, audio);
    }
    if (nv < 0) return nv;
    if (na < 0) return na;
    /* diffusers zips the two timestep lists: unequal lengths (a shift collapsing grid points)
       would run out of audio sigmas. Refuse instead. */
    if (nv != na)
        return h3_err(H3_E_INVALID,
                      "schedule %s: %d steps give %d video sigmas (shift %g) but %d audio sigmas (shift %g); "
                      "the two schedules must have the same length",
                      d->name, steps, nv, sv, na, sa);
    return nv;
}

int h3_sched_check(const float *sigmas, int n, const char *what)
{
    if (n < 2 || n > 100000)
        return h3_err(H3_E_INVALID, "%s sigmas: %d values (2 to 100000, terminal 0 included)", what, n);
    if (!sigmas) return h3_err(H3_E_INVALID, "%s sigmas: NULL array", what);
    for (int i = 0; i < n; i++) {
        if (!isfinite(sigmas[i]) || sigmas[i] < 0 || sigmas[i] > 1)
            return h3_err(H3_E_INVALID, "%s sigma %d is %g (each must lie in [0, 1])", what, i, (double)sigmas[i]);
        if (i && !(sigmas[i] < sigmas[i - 1]))
            return h3_err(H3_E_INVALID, "%s sigmas must decrease strictly (%d: %g, %d: %g)", what, i - 1,
                          (double)sigmas[i - 1], i, (double)sigmas[i]);
    }
    /* A grid need not reach 0: a segment of one (a render continued from given latents) is valid. */
    return 0;
}

void h3_sched_timesteps(const float *sigmas, int n, float *timesteps)
{
    for (int i = 0; i + 1 < n; i++) timesteps[i] = 1.0f - sigmas[i];
}

void h3_sched_euler(float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    /* MiniMaxH3Scheduler.step: x0 uses the sigma recovered from the timestep (1 - t), the blend
       uses the grid's sigmas; every operation is its own f32 rounding, as in torch. */
    const float sft = 1.0f - t;
    const float ratio = sigma_next / sigma;
    const float keep = 1.0f - ratio;
    for (int64_t i = 0; i < n; i++) {
        float prod = sft * v[i];
        float denoised = x[i] + prod;
        float a = ratio * x[i];
        float b = keep * denoised;
        x[i] = a + b;
    }
}

/* ---- noise ----------------------------------------------------------------------------- */
/*
 * Gaussian noise (docs/architecture.md, "Noise"):
 *
 *   libh3 draws its initial noise from a counter-based generator, so every element is a pure
 *   function of (seed, stream, index): results do not depend on thread count, chunking or the
 *   order elements are produced in, and any element can be recomputed on its own.
 *
 *   Element n of stream s under seed S is computed as follows.
 *    1. Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) with
 *       key (k0, k1) = (S mod 2^32, S >> 32) and counter (c0, c1, c2, c3) =
 *       (n mod 2^32, n >> 32, s, 0). One round maps (c0, c1, c2, c3) to
 *       (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)) with
 *       M0 = 0xD2511F53, M1 = 0xCD9E8D57 (64-bit products split into 32-bit halves); the key is
 *       bumped by (0x9E3779B9, 0xBB67AE85) between rounds; ten rounds give words w0..w3.
 *    2. Two uniforms with 53 random bits each:
 *         u1 = ((w0 * 2^32 + w1) >> 11 + 1) * 2^-53    in (0, 1]
 *         u2 = ((w2 * 2^32 + w3) >> 11)     * 2^-53    in [0, 1)
 *    3. Box-Muller in double precision, cosine branch only:
 *         z = sqrt(-2 ln u1) * cos(2 pi u2), rounded to float32.
 *
 *   Streams: 0 = video noise, filled in [24, T, H, W] latent order; 1 = audio noise, filled in
 *   [2, 32, T_a] order (stereo side, channel, time). Both use the request seed.
 *
 *   Given the same seed the noise matches bit for bit across machines whose libm log/cos are
 *   correctly rounded (glibc, macOS); otherwise a rare last-bit difference is possible.
 */

static inline void philox_round(uint32_t c[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c[0] = hi1 ^ c[1] ^ k[0];
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k[1];
    c[3] = lo0;
}

static void philox4x32_10(uint64_t seed, uint64_t n, uint32_t stream, uint32_t w[4])
{
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t c[4] = {(uint32_t)n, (uint32_t)(n >> 32), stream, 0};
    for (int r = 0; r < 10; r++) {
        philox_round(c, k);
        k[0] += 0x9E3779B9u;
        k[1] += 0xBB67AE85u;
    }
    for (int i = 0; i < 4; i++) w[i] = c[i];
}

void h3_noise(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n)
{
    const double two_pi = 6.283185307179586476925286766559;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        philox4x32_10(seed, offset + (uint64_t)i, stream, w);
        uint64_t a = ((uint64_t)w[0] << 32) | w[1], b = ((uint64_t)w[2] << 32) | w[3];
        double u1 = (double)((a >> 11) + 1) * 0x1.0p-53;
        double u2 = (double)(b >> 11) * 0x1.0p-53;
        out[i] = (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}
