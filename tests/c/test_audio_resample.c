/*
 * The audio resampler (core/audio_resample.c) at its edges, for the plain and the ASan+UBSan runs: every pair of
 * rates from 4 kHz to 384 kHz (coprime pairs included: one phase per output sample) on clips of 1 sample up to a
 * few periods, shorter than one phase period included, into buffers of exactly the announced length; the length
 * rule, the identity copy, and the one-line errors. Content and the kernel are held to torchaudio's definition
 * in tests/test_audio_resample.py.
 */
#include "core/audio_resample.h"

#include "ctest.h"

#include <stdlib.h>

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }

int main(void)
{
    static const int rates[] = {4000, 4001, 8000, 11025, 22050, 32000, 44100, 48000, 96000, 383999, 384000};
    static const int64_t lens[] = {1, 5, 441, 1201};
    const int nr = (int)(sizeof rates / sizeof *rates), nl = (int)(sizeof lens / sizeof *lens);
    for (int a = 0; a < nr; a++)
        for (int b = 0; b < nr; b++)
            for (int l = 0; l < nl; l++) {
                const int64_t n = lens[l], g = gcd(rates[a], rates[b]);
                const int64_t m = h3_audio_resample_length(rates[a], rates[b], n);
                CHECK_MSG(m == ceil_div(rates[b] / g * n, rates[a] / g), "%d -> %d, %lld: %lld", rates[a], rates[b],
                          (long long)n, (long long)m);
                if (m < 1) continue;
                float *x = malloc(sizeof(float) * (size_t)(2 * n)), *y = malloc(sizeof(float) * (size_t)(2 * m));
                for (int64_t i = 0; i < 2 * n; i++) x[i] = frand();
                CHECK(h3_audio_resample(x, 2, n, rates[a], rates[b], y, 2 * m, NULL) == 0);
                int finite = 1;
                for (int64_t i = 0; i < 2 * m; i++) finite &= isfinite(y[i]) && fabsf(y[i]) < 4.0f;
                CHECK_MSG(finite, "%d -> %d, %lld samples", rates[a], rates[b], (long long)n);
                if (rates[a] == rates[b]) CHECK(memcmp(x, y, sizeof(float) * (size_t)(2 * n)) == 0);
                free(x);
                free(y);
            }

    /* A size query, then one-line errors that leave the outputs alone. */
    int64_t m = -1;
    CHECK(h3_audio_resample(NULL, 1, 441, 44100, 32000, NULL, 0, &m) == 0 && m == 320);
    float x[8] = {0}, y[32];
    for (int i = 0; i < 32; i++) y[i] = 7;
    m = -1;
    CHECK(h3_audio_resample(x, 1, 8, 3999, 32000, y, 32, &m) == -H3_E_INVALID && m == -1);
    CHECK(strstr(h3_last_error(), "input rate 3999 Hz is outside 4000 .. 384000 Hz") != NULL);
    CHECK(h3_audio_resample(x, 1, 8, 32000, 384001, y, 32, &m) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "output rate 384001 Hz") != NULL);
    CHECK(h3_audio_resample(x, 1, 0, 44100, 32000, y, 32, &m) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "0 samples per channel") != NULL);
    CHECK(h3_audio_resample(x, 0, 8, 44100, 32000, y, 32, &m) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "0 channels") != NULL);
    CHECK(h3_audio_resample(x, 1, 8, 8000, 32000, y, 31, &m) == -H3_E_INVALID && m == 32);
    CHECK(strstr(h3_last_error(), "output holds 31 floats, 1 x 32 needed") != NULL);
    CHECK(h3_audio_resample(NULL, 1, 8, 8000, 32000, y, 32, &m) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "NULL input") != NULL && strchr(h3_last_error(), '\n') == NULL);
    CHECK(y[0] == 7 && y[31] == 7);
    CTEST_END();
}
