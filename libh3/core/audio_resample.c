/*
 * Audio sample-rate conversion (audio_resample.h): polyphase windowed-sinc with torchaudio's
 * default kernel, written from its documented definition.
 *
 * torchaudio evaluates the kernel as a [new][2 * width + orig] table and runs it as a strided
 * convolution over the input padded with width zeros before and width + orig after, so output
 * n = j * new + p reads input samples j * orig + k - width, k in [0, 2 * width + orig). Of the
 * 2 * width + orig taps of phase p only those with |t| < 6 are non-zero (the window is cos^2 of
 * pi / 2 at the clamp, which leaves values far below f32's smallest subnormal), and they form one
 * run of at most 2 * width + 1 taps around k = width + orig * p / new. This file keeps, per phase,
 * a run of 2 * width + 3 taps starting at floor(orig * p / new) - 1 that covers it, evaluated with
 * the same formula and operation order, so the table holds the same f32 values at a fraction of
 * the size (new * (2 * width + 3) floats: at most a few million for rates in 4 kHz .. 384 kHz).
 */
#include "core/audio_resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* torchaudio's defaults (sinc_interp_hann). */
#define LOWPASS_WIDTH 6
#define ROLLOFF 0.99
#define MAX_CHANNELS 64

int h3_audio_rate_check(int rate, const char *what)
{
    if (rate < H3_RESAMPLE_MIN_RATE || rate > H3_RESAMPLE_MAX_RATE)
        return h3_err(H3_E_INVALID, "audio resample: %s rate %d Hz is outside %d .. %d Hz", what, rate,
                      H3_RESAMPLE_MIN_RATE, H3_RESAMPLE_MAX_RATE);
    return 0;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        const int64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

int64_t h3_audio_resample_length(int in_rate, int out_rate, int64_t samples)
{
    int rc;
    if ((rc = h3_audio_rate_check(in_rate, "input")) || (rc = h3_audio_rate_check(out_rate, "output"))) return rc;
    if (samples < 1 || samples > H3_RESAMPLE_MAX_SAMPLES)
        return h3_err(H3_E_INVALID, "audio resample: %lld samples per channel (1 .. 2^40)", (long long)samples);
    const int64_t g = gcd64(in_rate, out_rate), orig = in_rate / g, nw = out_rate / g;
    /* Python's ceil(new * length / orig) in doubles is exact here (new * length < 2^52 and a
       non-integer quotient stays at least 1 / orig away from the next integer), so integers give
       the same count. */
    return (nw * samples + orig - 1) / orig;
}

/* One tap of torchaudio's kernel: phase p of new, tap k (0 .. 2 * width + orig - 1). The phase
   offset -p / new is an f32 division in torchaudio (a default-dtype arange divided by an int) and
   the rest doubles; the order of operations follows its definition. */
static float tap(int64_t p, int64_t k, int64_t orig, int64_t nw, int64_t width, double base)
{
    const float phase = (float)(-p) / (float)nw;
    double t = (double)phase + (double)(k - width) / (double)orig;
    t *= base;
    if (t < -LOWPASS_WIDTH) t = -LOWPASS_WIDTH;
    if (t > LOWPASS_WIDTH) t = LOWPASS_WIDTH;
    double window = cos(t * M_PI / LOWPASS_WIDTH / 2);
    window = window * window;
    const double tp = t * M_PI, scale = base / (double)orig;
    double v = tp == 0 ? 1.0 : sin(tp) / tp;
    v *= window * scale;
    return (float)v;
}

int h3_audio_resample_planar(const float *in, int channels, int64_t samples, int in_rate, int out_rate, float *out)
{
    if (!in || !out) return h3_err(H3_E_INVALID, "audio resample: NULL input or output");
    if (channels < 1 || channels > MAX_CHANNELS)
        return h3_err(H3_E_INVALID, "audio resample: %d channels (1 .. %d)", channels, MAX_CHANNELS);
    const int64_t n_out = h3_audio_resample_length(in_rate, out_rate, samples);
    if (n_out < 0) return (int)n_out;
    if (in_rate == out_rate) {
        /* torchaudio returns the waveform itself: no filtering at all. */
        memcpy(out, in, sizeof(float) * (size_t)(samples * channels));
        return 0;
    }
    const int64_t g = gcd64(in_rate, out_rate), orig = in_rate / g, nw = out_rate / g;
    const double base = (double)(orig < nw ? orig : nw) * ROLLOFF;
    const int64_t width = (int64_t)ceil((double)(LOWPASS_WIDTH * orig) / base);
    const int64_t L = 2 * width + 3, span = 2 * width + orig;
    /* Only the phases the output reaches (a clip shorter than one period uses fewer). */
    const int64_t P = n_out < nw ? n_out : nw;
    float *tab = h3_malloc(sizeof(float) * (size_t)(P * L));
    int64_t *lo = h3_malloc(sizeof(int64_t) * (size_t)P);
    if (!tab || !lo) {
        free(tab);
        free(lo);
        return -H3_E_NOMEM;
    }
    for (int64_t p = 0; p < P; p++) {
        lo[p] = orig * p / nw - 1;
        for (int64_t m = 0; m < L; m++) {
            const int64_t k = lo[p] + m;
            tab[p * L + m] = (k < 0 || k >= span) ? 0.0f : tap(p, k, orig, nw, width, base);
        }
    }
    for (int c = 0; c < channels; c++) {
        const float *x = in + (int64_t)c * samples;
        float *y = out + (int64_t)c * n_out;
        for (int64_t n = 0; n < n_out; n++) {
            const int64_t j = n / nw, p = n % nw;
            const int64_t first = j * orig + lo[p] - width; /* input index of tap 0 */
            const float *w = tab + p * L;
            /* Taps past either end of the input read the zero padding: skip them. */
            const int64_t m0 = first < 0 ? -first : 0;
            const int64_t m1 = first + L > samples ? samples - first : L;
            double acc = 0.0;
            for (int64_t m = m0; m < m1; m++) acc += (double)w[m] * (double)x[first + m];
            y[n] = (float)acc;
        }
    }
    free(tab);
    free(lo);
    return 0;
}

H3_API int h3_audio_resample(const float *pcm, int channels, int64_t samples, int in_rate, int out_rate, float *out,
                             int64_t out_capacity, int64_t *out_samples)
{
    if (channels < 1 || channels > MAX_CHANNELS)
        return h3_err(H3_E_INVALID, "audio resample: %d channels (1 .. %d)", channels, MAX_CHANNELS);
    const int64_t n_out = h3_audio_resample_length(in_rate, out_rate, samples);
    if (n_out < 0) return (int)n_out;
    if (out_samples) *out_samples = n_out;
    if (!out) {
        /* A size query. */
        h3_err_clear();
        return 0;
    }
    if (!pcm) return h3_err(H3_E_INVALID, "audio resample: NULL input");
    if (out_capacity < n_out * channels)
        return h3_err(H3_E_INVALID, "audio resample: output holds %lld floats, %d x %lld needed",
                      (long long)out_capacity, channels, (long long)n_out);
    int rc = h3_audio_resample_planar(pcm, channels, samples, in_rate, out_rate, out);
    if (!rc) h3_err_clear();
    return rc;
}
