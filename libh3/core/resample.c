/* Lanczos-3 resizing of decoded frames (resample.h). */
#include "core/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LANCZOS_A 3.0

/* Taps of one axis: output i reads n[i] source indices from first[i] on (clamped at the edges). */
typedef struct {
    int taps;          /* per output */
    int *index;        /* [out][taps] source index */
    float *weight;     /* [out][taps], summing to 1 */
} axis_taps;

static double lanczos(double x)
{
    x = fabs(x);
    if (x < 1e-12) return 1.0;
    if (x >= LANCZOS_A) return 0.0;
    const double px = M_PI * x;
    return LANCZOS_A * sin(px) * sin(px / LANCZOS_A) / (px * px);
}

static int axis_build(int in, int out, axis_taps *a)
{
    const double ratio = (double)in / out, scale = ratio > 1 ? ratio : 1; /* shrinking widens the kernel */
    const double support = LANCZOS_A * scale;
    a->taps = (int)ceil(support) * 2 + 1;
    a->index = h3_malloc(sizeof(int) * (size_t)out * (size_t)a->taps);
    a->weight = h3_malloc(sizeof(float) * (size_t)out * (size_t)a->taps);
    if (!a->index || !a->weight) return -H3_E_NOMEM;
    double *w = h3_malloc(sizeof(double) * (size_t)a->taps);
    if (!w) return -H3_E_NOMEM;
    for (int i = 0; i < out; i++) {
        const double centre = (i + 0.5) * ratio - 0.5;
        const int first = (int)floor(centre) - a->taps / 2;
        double sum = 0;
        for (int k = 0; k < a->taps; k++) {
            w[k] = lanczos((first + k - centre) / scale);
            sum += w[k];
        }
        for (int k = 0; k < a->taps; k++) {
            int s = first + k;
            s = s < 0 ? 0 : s >= in ? in - 1 : s;
            a->index[i * a->taps + k] = s;
            a->weight[i * a->taps + k] = (float)(w[k] / sum);
        }
    }
    free(w);
    return 0;
}

static void axis_free(axis_taps *a)
{
    free(a->index);
    free(a->weight);
}

typedef struct {
    const float *src;
    int h, w, H, W;
    const axis_taps *ax, *ay;
    float *pixels;
    uint8_t *rgb;
    int failed;
} resize_job;

static void resize_task(void *arg, int64_t begin, int64_t end, int thread)
{
    resize_job *j = arg;
    (void)thread;
    float *tmp = h3_malloc(sizeof(float) * (size_t)j->h * (size_t)j->W * 3);
    if (!tmp) {
        j->failed = 1;
        return;
    }
    for (int64_t f = begin; f < end; f++) {
        const float *src = j->src + f * (int64_t)j->h * j->w * 3;
        /* rows first: [h, w, 3] -> [h, W, 3] */
        for (int y = 0; y < j->h; y++)
            for (int x = 0; x < j->W; x++)
                for (int c = 0; c < 3; c++) {
                    float acc = 0;
                    for (int k = 0; k < j->ax->taps; k++)
                        acc += j->ax->weight[x * j->ax->taps + k] * src[((int64_t)y * j->w + j->ax->index[x * j->ax->taps + k]) * 3 + c];
                    tmp[((int64_t)y * j->W + x) * 3 + c] = acc;
                }
        /* then columns: [h, W, 3] -> [H, W, 3] */
        const int64_t o0 = f * (int64_t)j->H * j->W * 3;
        for (int y = 0; y < j->H; y++)
            for (int x = 0; x < j->W; x++)
                for (int c = 0; c < 3; c++) {
                    float acc = 0;
                    for (int k = 0; k < j->ay->taps; k++)
                        acc += j->ay->weight[y * j->ay->taps + k] * tmp[((int64_t)j->ay->index[y * j->ay->taps + k] * j->W + x) * 3 + c];
                    acc = acc < 0.0f ? 0.0f : acc > 1.0f ? 1.0f : acc;
                    const int64_t o = o0 + ((int64_t)y * j->W + x) * 3 + c;
                    if (j->pixels) j->pixels[o] = acc;
                    if (j->rgb) {
                        /* the decoder's rounding: x * 255, half to even (adding and removing 2^23) */
                        float q = acc * 255.0f;
                        q = q + 8388608.0f;
                        q = q - 8388608.0f;
                        j->rgb[o] = q >= 0.0f ? (uint8_t)q : 0;
                    }
                }
    }
    free(tmp);
}

int h3_resize_lanczos3(h3_pool *pool, const float *src, int F, int h, int w, int H, int W, float *pixels, uint8_t *rgb)
{
    if (F < 0 || h < 1 || w < 1 || H < 1 || W < 1)
        return h3_err(H3_E_INVALID, "resize: %d frames of %dx%d to %dx%d", F, w, h, W, H);
    axis_taps ax = {0}, ay = {0};
    int rc = axis_build(w, W, &ax);
    if (!rc) rc = axis_build(h, H, &ay);
    if (!rc) {
        resize_job j = {src, h, w, H, W, &ax, &ay, pixels, rgb, 0};
        h3_parallel_for(pool, F, 1, resize_task, &j);
        if (j.failed) rc = -H3_E_NOMEM;
    }
    axis_free(&ax);
    axis_free(&ay);
    return rc;
}
