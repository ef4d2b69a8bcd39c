/*
 * Dequantisation of the quantised single-file formats (fp8_scaled, int8 / int8 ConvRot) into BF16.
 * Every value is computed exactly (an fp8 or int8 code times an F32 scale fits a double; the ConvRot
 * Hadamard sums are integers and its 1/sqrt(g) a power of two) and rounded once, to nearest even, so
 * the result does not depend on summation order or threads, and a reference in any language that
 * follows the same rule gets the same bits.
 */
#include "core/singlefile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint16_t h3_bf16_from_double(double x)
{
    if (isnan(x)) return 0x7fc0;
    /* Round the double to 8 significant bits (ties to even) first, then narrow: the narrowing is exact
       for every value in the float range, so this is one rounding. */
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    const uint64_t lsb = (b >> 45) & 1;
    b += 0x0000100000000000ull - 1 + lsb; /* half of bit 45, minus one, plus the kept bit: ties to even */
    b &= ~((1ull << 45) - 1);
    double r;
    memcpy(&r, &b, sizeof r);
    float f = (float)r; /* exact unless out of the float range (then +-inf, as a bf16 cast gives) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

double h3_fp8_value(uint8_t v, bool e5m2)
{
    const int sign = v >> 7;
    double mag;
    if (e5m2) {
        const int e = (v >> 2) & 31, m = v & 3;
        if (e == 31) mag = m ? NAN : INFINITY;
        else if (e == 0) mag = ldexp((double)m, -16);
        else mag = ldexp(1.0 + m / 4.0, e - 15);
    } else {
        const int e = (v >> 3) & 15, m = v & 7;
        if (e == 15 && m == 7) mag = NAN;
        else if (e == 0) mag = ldexp((double)m, -9);
        else mag = ldexp(1.0 + m / 8.0, e - 7);
    }
    return sign ? -mag : mag;
}

void h3_deq_fp8(const uint8_t *q, bool e5m2, float scale, int64_t N, int64_t K, uint16_t *out)
{
    uint16_t lut[256];
    for (int i = 0; i < 256; i++) lut[i] = h3_bf16_from_double(h3_fp8_value((uint8_t)i, e5m2) * (double)scale);
    for (int64_t i = 0; i < N * K; i++) out[i] = lut[q[i]];
}

void h3_deq_int8(const int8_t *q, const float *s, int64_t n_scale, int group, int64_t N, int64_t K, uint16_t *out)
{
    int shift = 0; /* sqrt(g) = 2^shift */
    for (int g = group; g > 1; g /= 4) shift++;
    int32_t *acc = group ? malloc(sizeof(int32_t) * (size_t)group * 2) : NULL;
    if (group && !acc) return; /* the caller allocated far more than this; treated as unreachable */
    for (int64_t n = 0; n < N; n++) {
        const double sc = (double)s[n_scale == 1 ? 0 : n];
        const int8_t *qr = q + n * K;
        uint16_t *o = out + n * K;
        if (!group) {
            for (int64_t k = 0; k < K; k++) o[k] = h3_bf16_from_double((double)qr[k] * sc);
            continue;
        }
        for (int64_t g0 = 0; g0 < K; g0 += group) {
            int32_t *a = acc, *b = acc + group;
            for (int j = 0; j < group; j++) a[j] = qr[g0 + j];
            /* H = H4 (x) ... (x) H4: one H4 butterfly per base-4 digit. H4[x][y] = -1 where x + y = 3. */
            for (int stride = 1; stride < group; stride *= 4) {
                for (int base = 0; base < group; base++) {
                    if ((base / stride) % 4) continue;
                    const int32_t x0 = a[base], x1 = a[base + stride], x2 = a[base + 2 * stride],
                                  x3 = a[base + 3 * stride];
                    b[base] = x0 + x1 + x2 - x3;
                    b[base + stride] = x0 + x1 - x2 + x3;
                    b[base + 2 * stride] = x0 - x1 + x2 + x3;
                    b[base + 3 * stride] = -x0 + x1 + x2 + x3;
                }
                int32_t *t = a;
                a = b;
                b = t;
            }
            for (int j = 0; j < group; j++) o[g0 + j] = h3_bf16_from_double(ldexp((double)a[j] * sc, -shift));
        }
    }
    free(acc);
}
