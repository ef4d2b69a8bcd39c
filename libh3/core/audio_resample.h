/*
 * Audio sample-rate conversion: band-limited windowed-sinc interpolation with torchaudio's default
 * kernel (torchaudio.functional.resample / transforms.Resample with sinc_interp_hann,
 * lowpass_filter_width 6, rolloff 0.99), the resampler diffusers runs once on a Ref2VA reference
 * soundtrack. Not the image resizer (core/resample.c).
 *
 * The definition, with the rates reduced by their gcd to `orig` -> `new` and
 * base = min(orig, new) * 0.99:
 *   y[n] = sum_i x[i] * k(i / orig - n / new),   x = 0 outside [0, samples),
 *   k(d) = sinc(pi t) * cos^2(pi t / 12) * base / orig,  t = clamp(d * base, -6, 6),
 * for n in [0, ceil(new * samples / orig)). Output sample 0 sits on input sample 0.
 */
#ifndef H3_AUDIO_RESAMPLE_H
#define H3_AUDIO_RESAMPLE_H

#include "core/internal.h"

#define H3_RESAMPLE_MIN_RATE 4000
#define H3_RESAMPLE_MAX_RATE 384000
/* Samples per channel libh3 resamples in one call (2^40, as the reference checks allow). */
#define H3_RESAMPLE_MAX_SAMPLES ((int64_t)1 << 40)

/* Refuse a rate outside [H3_RESAMPLE_MIN_RATE, H3_RESAMPLE_MAX_RATE] with a message naming
   `what` (e.g. "input"), the rate and the range. */
H3_INTERNAL int h3_audio_rate_check(int rate, const char *what);

/* Output samples per channel for `samples` input samples: ceil(new * samples / orig) on the
   gcd-reduced rates (= samples when the rates are equal). Rates and samples are checked
   (samples in [1, H3_RESAMPLE_MAX_SAMPLES]); a negative H3_E* code on failure. */
H3_INTERNAL int64_t h3_audio_resample_length(int in_rate, int out_rate, int64_t samples);

/*
 * Resample planar f32 audio in [channels][samples] to out [channels][h3_audio_resample_length],
 * each channel on its own. Equal rates copy. The kernel is evaluated in double and stored as f32
 * (as transforms.Resample keeps it); each output is a double sum rounded once to f32, in a fixed
 * order, so results are deterministic and do not depend on anything but the arguments.
 */
H3_INTERNAL int h3_audio_resample_planar(const float *in, int channels, int64_t samples, int in_rate, int out_rate,
                                         float *out);

#endif /* H3_AUDIO_RESAMPLE_H */
