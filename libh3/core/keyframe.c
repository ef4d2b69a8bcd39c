/* FL2VA keyframe preprocessing (keyframe.h). */
#include "core/keyframe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int h3_keyframe_check(int width, int height, const char *what)
{
    if (width <= 0 || height <= 0)
        return h3_err(H3_E_INVALID, "%s: the image is empty (%dx%d)", what, width, height);
    if ((int64_t)width * height > H3_KEYFRAME_MAX_PIXELS)
        return h3_err(H3_E_INVALID, "%s: %dx%d is more than %lld megapixels", what, width, height,
                      H3_KEYFRAME_MAX_PIXELS / 1000000);
    /* The aspect ratios the model was trained over (1:4 .. 4:1), compared exactly in integers. */
    if ((int64_t)width > 4LL * height || (int64_t)height > 4LL * width)
        return h3_err(H3_E_INVALID, "%s: %dx%d is outside the aspect ratios 1:4 to 4:1", what, width, height);
    return 0;
}

int h3_canvas_resolve(const h3_canvas_rule *rule, int aspect_w, int aspect_h, int *width, int *height)
{
    if (!rule || rule->short_edge < 1 || rule->max_pixels < 1 || rule->multiple < 1)
        return h3_err(H3_E_INVALID, "canvas: bad canvas rule");
    int rc = h3_keyframe_check(aspect_w, aspect_h, "canvas");
    if (rc) return rc;
    /* The same double operations in the same order as the Python: a ratio of two ints is a
       correctly rounded division; `** 0.5` is pow(); round() is half-to-even (rint in the
       default rounding mode). */
    const double ratio = (double)aspect_w / (double)aspect_h;
    double w, h;
    if (ratio >= 1.0) {
        w = rule->short_edge * ratio;
        h = (double)rule->short_edge;
    } else {
        w = (double)rule->short_edge;
        h = rule->short_edge / ratio;
    }
    const double area = w * h;
    if (area > (double)rule->max_pixels) {
        const double scale = pow((double)rule->max_pixels / area, 0.5);
        w = w * scale;
        h = h * scale;
    }
    const int m = rule->multiple;
    const double rh = rint(h / m) * m, rw = rint(w / m) * m;
    *height = rh < m ? m : (int)rh;
    *width = rw < m ? m : (int)rw;
    return 0;
}

/* ---- PIL's Lanczos (Resample.c semantics, written from its documented behaviour) ----------- */

#define PIL_PRECISION_BITS (32 - 8 - 2)
#define LANCZOS_SUPPORT 3.0

static double sinc(double x)
{
    if (x == 0.0) return 1.0;
    x = x * M_PI;
    return sin(x) / x;
}

static double lanczos(double x)
{
    if (-LANCZOS_SUPPORT <= x && x < LANCZOS_SUPPORT) return sinc(x) * sinc(x / 3.0);
    return 0.0;
}

/* One axis of in_size -> out_size: output i reads count[i] inputs from first[i] with fixed-point
   weights k[i * ksize ..]. */
typedef struct {
    int ksize;
    int *first, *count;
    int32_t *k;
} pil_axis;

static void pil_axis_free(pil_axis *a)
{
    free(a->first);
    free(a->count);
    free(a->k);
    memset(a, 0, sizeof *a);
}

static int pil_axis_build(int in_size, int out_size, pil_axis *a)
{
    memset(a, 0, sizeof *a);
    const double scale = (double)in_size / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = LANCZOS_SUPPORT * filterscale;
    a->ksize = (int)ceil(support) * 2 + 1;
    a->first = h3_malloc(sizeof(int) * (size_t)out_size);
    a->count = h3_malloc(sizeof(int) * (size_t)out_size);
    a->k = h3_calloc((size_t)out_size * (size_t)a->ksize, sizeof(int32_t));
    double *w = h3_malloc(sizeof(double) * (size_t)a->ksize);
    if (!a->first || !a->count || !a->k || !w) {
        free(w);
        pil_axis_free(a);
        return -H3_E_NOMEM;
    }
    const double ss = 1.0 / filterscale;
    for (int i = 0; i < out_size; i++) {
        const double center = (i + 0.5) * scale;
        /* the window [center - support, center + support], rounded by truncating x + 0.5 */
        int lo = (int)(center - support + 0.5);
        if (lo < 0) lo = 0;
        int hi = (int)(center + support + 0.5);
        if (hi > in_size) hi = in_size;
        const int n = hi - lo;
        double sum = 0.0;
        for (int x = 0; x < n; x++) {
            w[x] = lanczos((x + lo - center + 0.5) * ss);
            sum += w[x];
        }
        for (int x = 0; x < n; x++) {
            const double v = sum != 0.0 ? w[x] / sum : w[x];
            /* rounded half away from zero to 22 fractional bits */
            a->k[(int64_t)i * a->ksize + x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PIL_PRECISION_BITS))
                                                    : (int32_t)(0.5 + v * (1 << PIL_PRECISION_BITS));
        }
        a->first[i] = lo;
        a->count[i] = n;
    }
    free(w);
    return 0;
}

static inline uint8_t clip8(int64_t v)
{
    if (v >= ((int64_t)1 << PIL_PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PIL_PRECISION_BITS);
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    int src_w, dst_w; /* pixels per row */
    int row0;         /* horizontal pass: first source row read */
    const pil_axis *ax;
} pass_job;

static void horizontal_rows(void *arg, int64_t begin, int64_t end, int thread)
{
    const pass_job *j = arg;
    (void)thread;
    for (int64_t y = begin; y < end; y++) {
        const uint8_t *in = j->src + (int64_t)(y + j->row0) * j->src_w * 3;
        uint8_t *out = j->dst + y * (int64_t)j->dst_w * 3;
        for (int x = 0; x < j->dst_w; x++) {
            const int32_t *k = j->ax->k + (int64_t)x * j->ax->ksize;
            const uint8_t *p = in + (int64_t)j->ax->first[x] * 3;
            int64_t s0 = 1 << (PIL_PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int t = 0; t < j->ax->count[x]; t++) {
                s0 += (int64_t)p[t * 3 + 0] * k[t];
                s1 += (int64_t)p[t * 3 + 1] * k[t];
                s2 += (int64_t)p[t * 3 + 2] * k[t];
            }
            out[x * 3 + 0] = clip8(s0);
            out[x * 3 + 1] = clip8(s1);
            out[x * 3 + 2] = clip8(s2);
        }
    }
}

static void vertical_rows(void *arg, int64_t begin, int64_t end, int thread)
{
    const pass_job *j = arg;
    (void)thread;
    const int64_t stride = (int64_t)j->src_w * 3;
    for (int64_t y = begin; y < end; y++) {
        const int32_t *k = j->ax->k + y * j->ax->ksize;
        const uint8_t *in = j->src + (int64_t)(j->ax->first[y] - j->row0) * stride;
        uint8_t *out = j->dst + y * stride;
        for (int64_t x = 0; x < stride; x++) {
            int64_t s = 1 << (PIL_PRECISION_BITS - 1);
            for (int t = 0; t < j->ax->count[y]; t++) s += (int64_t)in[t * stride + x] * k[t];
            out[x] = clip8(s);
        }
    }
}

static void run_rows(h3_pool *pool, int64_t n, h3_task_fn fn, pass_job *j)
{
    if (pool)
        h3_parallel_for(pool, n, 8, fn, j);
    else
        fn(j, 0, n, 0);
}

int h3_resize_lanczos_u8(h3_pool *pool, const uint8_t *src, int w, int h, int W, int H, uint8_t *dst)
{
    if (!src || !dst || w < 1 || h < 1 || W < 1 || H < 1 || (int64_t)W * H > H3_KEYFRAME_MAX_PIXELS * 4)
        return h3_err(H3_E_INVALID, "resize: %dx%d to %dx%d", w, h, W, H);
    if (w == W && h == H) {
        memcpy(dst, src, (size_t)w * (size_t)h * 3);
        return 0;
    }
    pil_axis ax = {0}, ay = {0};
    int rc = 0;
    uint8_t *tmp = NULL;
    if ((w != W && (rc = pil_axis_build(w, W, &ax))) || (h != H && (rc = pil_axis_build(h, H, &ay)))) goto done;
    /* The order of the two passes changes the result (the intermediate is uint8). Pillow runs the
       horizontal pass first, except when the height shrinks by more than twice as many pixels as
       the width does: then the vertical pass goes first (measured against Pillow 13 on every
       size pair; see tests/test_fl2va.py). */
    const bool vertical_first = w != W && h != H && H < h && 2LL * (w - W) < (int64_t)(h - H);
    if (w != W && h != H) {
        /* The first pass produces only the lines the second one reads. */
        if (!vertical_first) {
            const int row0 = ay.first[0], rows = ay.first[H - 1] + ay.count[H - 1] - row0;
            if (!(tmp = h3_malloc((size_t)W * (size_t)rows * 3))) {
                rc = -H3_E_NOMEM;
                goto done;
            }
            pass_job j1 = {src, tmp, w, W, row0, &ax};
            run_rows(pool, rows, horizontal_rows, &j1);
            pass_job j2 = {tmp, dst, W, W, row0, &ay};
            run_rows(pool, H, vertical_rows, &j2);
        } else {
            if (!(tmp = h3_malloc((size_t)w * (size_t)H * 3))) {
                rc = -H3_E_NOMEM;
                goto done;
            }
            pass_job j1 = {src, tmp, w, w, 0, &ay};
            run_rows(pool, H, vertical_rows, &j1);
            pass_job j2 = {tmp, dst, w, W, 0, &ax};
            run_rows(pool, H, horizontal_rows, &j2);
        }
    } else if (w != W) {
        pass_job j = {src, dst, w, W, 0, &ax};
        run_rows(pool, h, horizontal_rows, &j);
    } else {
        pass_job j = {src, dst, w, w, 0, &ay};
        run_rows(pool, H, vertical_rows, &j);
    }
done:
    free(tmp);
    pil_axis_free(&ax);
    pil_axis_free(&ay);
    return rc;
}

int h3_keyframe_place(h3_pool *pool, const uint8_t *src, int w, int h, int W, int H, int cover, uint8_t *dst)
{
    if (!src || !dst || W < 1 || H < 1) return h3_err(H3_E_INVALID, "keyframe: NULL image or empty canvas");
    if (w == W && h == H) {
        memcpy(dst, src, (size_t)w * (size_t)h * 3);
        return 0;
    }
    if (!cover) return h3_resize_lanczos_u8(pool, src, w, h, W, H, dst);
    /* Cover-crop as the released model's preprocessing: round() the scaled sides (never below the
       canvas) and centre with (resized - canvas) // 2. */
    const double sx = (double)W / w, sy = (double)H / h, scale = sx > sy ? sx : sy;
    const double rw = rint(w * scale), rh = rint(h * scale);
    if (rw > 1e6 || rh > 1e6) return h3_err(H3_E_INVALID, "keyframe: %dx%d cannot cover %dx%d", w, h, W, H);
    const int cw = rw < W ? W : (int)rw, ch = rh < H ? H : (int)rh;
    const int left = (cw - W) / 2, top = (ch - H) / 2;
    uint8_t *big = h3_malloc((size_t)cw * (size_t)ch * 3);
    if (!big) return -H3_E_NOMEM;
    int rc = h3_resize_lanczos_u8(pool, src, w, h, cw, ch, big);
    if (!rc)
        for (int y = 0; y < H; y++)
            memcpy(dst + (size_t)y * W * 3, big + ((size_t)(y + top) * cw + left) * 3, (size_t)W * 3);
    free(big);
    return rc;
}
