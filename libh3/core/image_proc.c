/*
 * The Qwen3-VL image processor (image_proc.h). The oracle is transformers' Qwen2VLImageProcessor
 * with its torchvision backend, the one AutoProcessor picks when torchvision is installed (diffusers'
 * pipeline needs torchvision): a uint8 CHW tensor resized by tvF.resize(BICUBIC, antialias=True),
 * which on the CPU is torch's native uint8 interpolate; then one fused rescale + normalise in f32;
 * then patchify.
 */
#include "core/image_proc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- settings ------------------------------------------------------------------------------ */

void h3_image_proc_defaults(h3_image_proc_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->patch_size = 16;
    c->temporal_patch_size = 2;
    c->merge_size = 2;
    c->min_pixels = 65536;
    c->max_pixels = 16777216;
    for (int i = 0; i < 3; i++) c->mean[i] = c->std[i] = 0.5f;
    c->rescale_factor = 1.0 / 255.0;
    c->do_resize = c->do_rescale = c->do_normalize = true;
}

static int get_bool(const h3_json *d, const h3j *o, const char *key, const char *path, bool *out)
{
    const h3j *v = h3j_get(d, o, key);
    if (!v || v->type == H3J_NULL) return 0;
    if (v->type != H3J_TRUE && v->type != H3J_FALSE)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = v->type == H3J_TRUE;
    return 0;
}

static int get_int(const h3_json *d, const h3j *o, const char *path, int64_t lo, int64_t hi, int64_t *out,
                   const char *k1, const char *k2)
{
    int64_t v;
    if (h3_cfg_int(d, o, &v, k1, k2, (const char *)NULL) != 0) {
        const h3j *x = h3j_get(d, o, k1);
        if (!x && k2) x = h3j_get(d, o, k2);
        if (x && x->type != H3J_NULL) return h3_err(H3_E_FORMAT, "%s: \"%s\" must be an integer", path, k1);
        return 0;
    }
    if (v < lo || v > hi)
        return h3_err(H3_E_FORMAT, "%s: \"%s\" = %lld is out of range [%lld, %lld]", path, k1, (long long)v,
                      (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

/* image_mean / image_std: three numbers (one number means the same for every channel). */
static int get_triple(const h3_json *d, const h3j *o, const char *key, const char *path, bool positive, float *out)
{
    const h3j *v = h3j_get(d, o, key);
    if (!v || v->type == H3J_NULL) return 0;
    double x[3];
    if (v->type == H3J_NUM) {
        x[0] = x[1] = x[2] = v->num;
    } else if (v->type == H3J_ARR && v->len == 3) {
        for (uint32_t i = 0; i < 3; i++) {
            const h3j *e = h3j_at(d, v, i);
            if (!e || e->type != H3J_NUM) return h3_err(H3_E_FORMAT, "%s: \"%s\" must hold 3 numbers", path, key);
            x[i] = e->num;
        }
    } else {
        return h3_err(H3_E_FORMAT, "%s: \"%s\" must be a number or a list of 3 numbers", path, key);
    }
    for (int i = 0; i < 3; i++) {
        if (!isfinite(x[i]) || (positive && !(x[i] > 0)))
            return h3_err(H3_E_FORMAT, "%s: \"%s\"[%d] = %g is not %s", path, key, i, x[i],
                          positive ? "a positive number" : "a finite number");
        out[i] = (float)x[i];
    }
    return 0;
}

/* One processor object (preprocessor_config.json's root, or processor_config.json's
   "image_processor") over the built-in settings. */
static int parse_cfg(const h3_json *d, const h3j *o, const char *path, h3_image_proc_cfg *c)
{
    if (!o || o->type != H3J_OBJ) return h3_err(H3_E_FORMAT, "%s: expected a JSON object", path);
    int64_t ps = c->patch_size, tps = c->temporal_patch_size, ms = c->merge_size;
    int64_t lo = c->min_pixels, hi = c->max_pixels, resample = 3;
    int rc;
    const h3j *size = h3j_get(d, o, "size");
    if (size && size->type != H3J_OBJ && size->type != H3J_NULL)
        return h3_err(H3_E_FORMAT, "%s: \"size\" must be an object", path);
    /* transformers reads size.shortest_edge / longest_edge; top-level min_pixels / max_pixels
       (older files) override them, as Qwen2VLImageProcessor.__init__ does. */
    if ((rc = get_int(d, o, path, 1, 4096, &ps, "patch_size", NULL)) ||
        (rc = get_int(d, o, path, 1, 64, &tps, "temporal_patch_size", NULL)) ||
        (rc = get_int(d, o, path, 1, 64, &ms, "merge_size", NULL)) ||
        (size && size->type == H3J_OBJ &&
         ((rc = get_int(d, size, path, 0, INT64_C(1) << 40, &lo, "shortest_edge", "min_pixels")) ||
          (rc = get_int(d, size, path, 1, INT64_C(1) << 40, &hi, "longest_edge", "max_pixels")))) ||
        (rc = get_int(d, o, path, 0, INT64_C(1) << 40, &lo, "min_pixels", NULL)) ||
        (rc = get_int(d, o, path, 1, INT64_C(1) << 40, &hi, "max_pixels", NULL)) ||
        (rc = get_int(d, o, path, 0, 16, &resample, "resample", NULL)) ||
        (rc = get_triple(d, o, "image_mean", path, false, c->mean)) ||
        (rc = get_triple(d, o, "image_std", path, true, c->std)) || (rc = get_bool(d, o, "do_resize", path, &c->do_resize)) ||
        (rc = get_bool(d, o, "do_rescale", path, &c->do_rescale)) ||
        (rc = get_bool(d, o, "do_normalize", path, &c->do_normalize)))
        return rc;
    double rf = c->rescale_factor;
    if (h3_cfg_num(d, o, &rf, "rescale_factor", (const char *)NULL) == 0 && !(rf > 0 && isfinite(rf)))
        return h3_err(H3_E_FORMAT, "%s: \"rescale_factor\" = %g must be a positive number", path, rf);
    /* PIL's enum: 3 = BICUBIC, the Qwen processors' filter. Others would silently differ. */
    if (resample != 3)
        return h3_err(H3_E_UNSUPPORTED, "%s: resample %lld is not supported (only 3, bicubic)", path,
                      (long long)resample);
    const h3j *st = h3j_get(d, o, "image_processor_type");
    if (st && st->type == H3J_STR && strncmp(h3j_str(d, st), "Qwen2VLImageProcessor", 21) != 0)
        return h3_err(H3_E_UNSUPPORTED, "%s: image_processor_type '%s' is not supported (Qwen2VLImageProcessor)",
                      path, h3j_str(d, st));
    if (lo > hi)
        return h3_err(H3_E_FORMAT, "%s: min_pixels %lld exceeds max_pixels %lld", path, (long long)lo, (long long)hi);
    c->patch_size = (int)ps;
    c->temporal_patch_size = (int)tps;
    c->merge_size = (int)ms;
    c->min_pixels = lo;
    c->max_pixels = hi;
    c->rescale_factor = rf;
    snprintf(c->source, sizeof c->source, "%s", path);
    return 0;
}

/*
 * The settings of the first of `files` (under the partition, or FL2VA's folder where a shared-weight Ref2VA
 * partition has none) that holds them. processor_config.json nests each
 * processor's settings under a key: `key` is looked up in files[keyed], the other files are the settings
 * themselves. A keyed file without its object is an error when `required`, else the next file is tried.
 */
static int load_first_cfg(h3_model *m, const char *const *files, size_t n, size_t keyed, const char *key,
                          bool required, h3_image_proc_cfg *c)
{
    for (size_t i = 0; i < n; i++) {
        char *path = h3_model_path(m, files[i], NULL);
        if (!path) return -H3_E_NOMEM;
        if (!h3_is_file(path)) {
            free(path);
            continue;
        }
        h3_json doc;
        memset(&doc, 0, sizeof doc);
        int rc = h3_json_parse_file(&doc, path, 1 << 20);
        bool used = true;
        if (!rc) {
            const h3j *root = h3j_root(&doc);
            const h3j *o = i == keyed ? h3j_get(&doc, root, key) : root;
            if (o)
                rc = parse_cfg(&doc, o, path, c);
            else if (required)
                rc = h3_err(H3_E_FORMAT, "%s: no \"%s\" object", path, key);
            else
                used = false;
        }
        h3_json_free(&doc);
        free(path);
        if (rc || used) return rc;
    }
    return 0;
}

int h3_image_proc_cfg_load(h3_model *m, h3_image_proc_cfg *c)
{
    h3_image_proc_defaults(c);
    if (!m || !m->partition_dir) return 0;
    static const char *const files[] = {"processor/preprocessor_config.json", "processor/processor_config.json",
                                        "text_encoder/preprocessor_config.json", "tokenizer/preprocessor_config.json"};
    return load_first_cfg(m, files, sizeof files / sizeof *files, 1, "image_processor", true, c);
}

/* ---- smart_resize ---------------------------------------------------------------------------- */

int h3_smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels, int *out_h,
                    int *out_w)
{
    if (height < 1 || width < 1) return h3_err(H3_E_INVALID, "image processor: empty image (%dx%d)", width, height);
    if (factor < 1) return h3_err(H3_E_INVALID, "image processor: resize factor %d", factor);
    const double hi = height > width ? height : width, lo = height > width ? width : height;
    if (hi / lo > 200)
        return h3_err(H3_E_INVALID, "image processor: %dx%d has an aspect ratio of %g; transformers' Qwen3-VL "
                      "processor refuses ratios above 200", width, height, hi / lo);
    /* Python: round() halves to even on the double quotient, as nearbyint does by default. */
    double hb = nearbyint((double)height / factor) * factor, wb = nearbyint((double)width / factor) * factor;
    if (hb * wb > (double)max_pixels) {
        const double beta = sqrt((double)height * (double)width / (double)max_pixels);
        hb = floor((double)height / beta / factor) * factor;
        wb = floor((double)width / beta / factor) * factor;
        if (hb < factor) hb = factor;
        if (wb < factor) wb = factor;
    } else if (hb * wb < (double)min_pixels) {
        const double beta = sqrt((double)min_pixels / ((double)height * (double)width));
        hb = ceil((double)height * beta / factor) * factor;
        wb = ceil((double)width * beta / factor) * factor;
    }
    if (!(hb >= factor && wb >= factor) || hb * wb > (double)H3_IMAGE_MAX_PIXELS)
        return h3_err(H3_E_INVALID, "image processor: %dx%d resizes to %.0fx%.0f, outside [%d, %lld] pixels a side",
                      width, height, wb, hb, factor, (long long)H3_IMAGE_MAX_PIXELS);
    *out_h = (int)hb;
    *out_w = (int)wb;
    return 0;
}

static int check_size(int width, int height, const char *what)
{
    if (width < 1 || height < 1)
        return h3_err(H3_E_INVALID, "%s: empty image (%dx%d pixels)", what, width, height);
    if ((int64_t)width * height > H3_IMAGE_MAX_PIXELS)
        return h3_err(H3_E_INVALID, "%s: %dx%d is too many pixels (%lld; at most %lld)", what, width, height,
                      (long long)width * height, (long long)H3_IMAGE_MAX_PIXELS);
    return 0;
}

int h3_image_check(const uint8_t *rgb, int width, int height, const char *what)
{
    int rc = check_size(width, height, what);
    if (!rc && !rgb) rc = h3_err(H3_E_INVALID, "%s: NULL pixels", what);
    return rc;
}

/* ---- bicubic antialiased resize (torch's uint8 path) ---------------------------------------- */

/* Keys' cubic with a = -0.5 (Pillow's, which torch's antialiased bicubic adopts), written in the
   operation order torch's cubic_convolution1/2 use. */
static double aa_cubic(double x)
{
    const double A = -0.5;
    if (x < 0) x = -x;
    if (x < 1.0) return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    if (x < 2.0) return ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    return 0.0;
}

/* Taps of one axis: output i reads size[i] inputs from first[i], with int16 weights k[i][.] in
   fixed point of `prec` bits. */
typedef struct {
    int taps, prec;
    int *first, *size;
    int16_t *k;
} rs_axis;

static void axis_free(rs_axis *a)
{
    free(a->first);
    free(a->size);
    free(a->k);
    memset(a, 0, sizeof *a);
}

static int axis_build(int in, int out, rs_axis *a)
{
    memset(a, 0, sizeof *a);
    const double scale = (double)in / (double)out; /* area_pixel_compute_scale, align_corners=False */
    const double support = scale >= 1.0 ? (4 * 0.5) * scale : 4 * 0.5;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    a->taps = (int)ceil(support) * 2 + 1;
    double *w = h3_calloc((size_t)out * (size_t)a->taps, sizeof *w);
    a->first = h3_malloc(sizeof(int) * (size_t)out);
    a->size = h3_malloc(sizeof(int) * (size_t)out);
    a->k = h3_calloc((size_t)out * (size_t)a->taps, sizeof *a->k);
    if (!w || !a->first || !a->size || !a->k) {
        free(w);
        axis_free(a);
        return -H3_E_NOMEM;
    }
    for (int i = 0; i < out; i++) {
        const double center = scale * (i + 0.5);
        int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        const int n = (int)(hi - lo);
        double total = 0;
        double *wi = w + (size_t)i * a->taps;
        for (int j = 0; j < n; j++) {
            wi[j] = aa_cubic(((double)(j + lo) - center + 0.5) * invscale);
            total += wi[j];
        }
        if (total != 0.0)
            for (int j = 0; j < n; j++) wi[j] /= total;
        a->first[i] = (int)lo;
        a->size[i] = n;
    }
    /* The largest weight sets the precision: as many bits as keep 2 * w_max below 2^15. */
    double wmax = w[0];
    for (size_t i = 0; i < (size_t)out * a->taps; i++)
        if (w[i] > wmax) wmax = w[i];
    int p = 0;
    for (; p < 22; p++)
        if ((int)(0.5 + wmax * (double)(1 << (p + 1))) >= (1 << 15)) break;
    a->prec = p < 1 ? 1 : p;
    for (size_t i = 0; i < (size_t)out * a->taps; i++) {
        const double v = w[i] * (double)(1 << p);
        a->k[i] = (int16_t)(int)(w[i] < 0 ? -0.5 + v : 0.5 + v); /* truncation toward zero, as torch */
    }
    free(w);
    return 0;
}

static inline uint8_t fix_to_u8(int32_t s, int prec)
{
    if (s < 0) return 0;
    s >>= prec;
    return (uint8_t)(s > 255 ? 255 : s);
}

/* Along x: src [h][sw][3] -> dst [h][a->out][3]. */
static void pass_x(const uint8_t *src, int h, int sw, int dw, const rs_axis *a, uint8_t *dst)
{
    const int32_t half = 1 << (a->prec - 1);
    for (int y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * sw * 3;
        uint8_t *o = dst + (size_t)y * dw * 3;
        for (int x = 0; x < dw; x++) {
            const int16_t *k = a->k + (size_t)x * a->taps;
            const uint8_t *p = row + (size_t)a->first[x] * 3;
            int32_t s0 = half, s1 = half, s2 = half;
            for (int j = 0; j < a->size[x]; j++) {
                s0 += (int32_t)p[3 * j] * k[j];
                s1 += (int32_t)p[3 * j + 1] * k[j];
                s2 += (int32_t)p[3 * j + 2] * k[j];
            }
            o[3 * x] = fix_to_u8(s0, a->prec);
            o[3 * x + 1] = fix_to_u8(s1, a->prec);
            o[3 * x + 2] = fix_to_u8(s2, a->prec);
        }
    }
}

/* Along y: src [sh][w][3] -> dst [dh][w][3]. */
static void pass_y(const uint8_t *src, int w, int dh, const rs_axis *a, uint8_t *dst)
{
    const int32_t half = 1 << (a->prec - 1);
    const size_t stride = (size_t)w * 3;
    for (int y = 0; y < dh; y++) {
        const int16_t *k = a->k + (size_t)y * a->taps;
        const uint8_t *base = src + (size_t)a->first[y] * stride;
        uint8_t *o = dst + (size_t)y * stride;
        for (size_t x = 0; x < stride; x++) {
            int32_t s = half;
            for (int j = 0; j < a->size[y]; j++) s += (int32_t)base[(size_t)j * stride + x] * k[j];
            o[x] = fix_to_u8(s, a->prec);
        }
    }
}

int h3_resize_bicubic_u8(const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow)
{
    if (!src || !dst || h < 1 || w < 1 || oh < 1 || ow < 1)
        return h3_err(H3_E_INVALID, "image resize: bad sizes %dx%d -> %dx%d", w, h, ow, oh);
    if (h == oh && w == ow) {
        memcpy(dst, src, (size_t)h * w * 3);
        return 0;
    }
    rs_axis ax, ay;
    memset(&ax, 0, sizeof ax);
    memset(&ay, 0, sizeof ay);
    uint8_t *tmp = NULL;
    int rc = 0;
    if (w != ow && (rc = axis_build(w, ow, &ax))) goto done;
    if (h != oh && (rc = axis_build(h, oh, &ay))) goto done;
    if (w == ow) {
        pass_y(src, w, oh, &ay, dst);
    } else if (h == oh) {
        pass_x(src, h, w, ow, &ax, dst);
    } else {
        /* Horizontal first, over every input row, then vertical: torch's order. */
        if (!(tmp = h3_malloc((size_t)h * ow * 3))) {
            rc = -H3_E_NOMEM;
            goto done;
        }
        pass_x(src, h, w, ow, &ax, tmp);
        pass_y(tmp, ow, oh, &ay, dst);
    }
done:
    free(tmp);
    axis_free(&ax);
    axis_free(&ay);
    return rc;
}

/* ---- grid, rescale + normalise, patchify ---------------------------------------------------- */

static int cfg_check(const h3_image_proc_cfg *c)
{
    if (c->patch_size < 1 || c->temporal_patch_size < 1 || c->merge_size < 1)
        return h3_err(H3_E_INVALID, "image processor: bad patch settings");
    return 0;
}

/* The processed size of an image (smart_resize, or the image's own size without do_resize). */
static int processed_size(const h3_image_proc_cfg *c, int width, int height, int *oh, int *ow)
{
    const int factor = c->patch_size * c->merge_size;
    if (c->do_resize) return h3_smart_resize(height, width, factor, c->min_pixels, c->max_pixels, oh, ow);
    if (height % factor || width % factor)
        return h3_err(H3_E_INVALID, "image processor: with do_resize off, %dx%d must be a multiple of %d a side",
                      width, height, factor);
    *oh = height;
    *ow = width;
    return 0;
}

int h3_image_grid(const h3_image_proc_cfg *c, int width, int height, int grid_thw[3], int *patch_dim)
{
    int rc, oh, ow;
    if ((rc = cfg_check(c)) || (rc = check_size(width, height, "image processor")) ||
        (rc = processed_size(c, width, height, &oh, &ow)))
        return rc;
    const int64_t patches = (int64_t)(oh / c->patch_size) * (ow / c->patch_size);
    if (patches > H3_IMAGE_MAX_PATCHES)
        return h3_err(H3_E_INVALID, "image processor: %dx%d resizes to %dx%d = %lld patches, more than the %lld "
                      "this engine runs the vision tower on (lower max_pixels in the processor config)", width,
                      height, ow, oh, (long long)patches, (long long)H3_IMAGE_MAX_PATCHES);
    grid_thw[0] = 1; /* an image is one temporal patch: the frame repeated temporal_patch_size times */
    grid_thw[1] = oh / c->patch_size;
    grid_thw[2] = ow / c->patch_size;
    if (patch_dim) *patch_dim = 3 * c->temporal_patch_size * c->patch_size * c->patch_size;
    return 0;
}

/* Rescale + normalise + patchify T frames already at the processed size oh x ow (px[t]: [oh][ow][3])
   into grid_h * grid_w rows of dim floats: one temporal patch, the frames in time order. */
static void patchify(const h3_image_proc_cfg *c, const uint8_t *const *px, int oh, int ow, int dim, float *out)
{
    const int P = c->patch_size, T = c->temporal_patch_size, M = c->merge_size;
    /* The fused rescale + normalise of the torchvision backend: mean and std scaled by 1/rescale in
       f32, then (x - mean) / std in f32. */
    float mean[3], sd[3], scale = (float)c->rescale_factor;
    const float inv = (float)(1.0 / c->rescale_factor);
    for (int i = 0; i < 3; i++) {
        mean[i] = c->do_rescale ? c->mean[i] * inv : c->mean[i];
        sd[i] = c->do_rescale ? c->std[i] * inv : c->std[i];
    }
    float lut[3][256];
    for (int ch = 0; ch < 3; ch++)
        for (int v = 0; v < 256; v++)
            lut[ch][v] = c->do_normalize ? ((float)v - mean[ch]) / sd[ch] : c->do_rescale ? (float)v * scale : (float)v;
    const int bh = oh / P / M, bw = ow / P / M, PP = P * P;
    float *row = out;
    for (int by = 0; by < bh; by++)
        for (int bx = 0; bx < bw; bx++)
            for (int my = 0; my < M; my++)
                for (int mx = 0; mx < M; mx++) {
                    const int y0 = (by * M + my) * P, x0 = (bx * M + mx) * P;
                    for (int ch = 0; ch < 3; ch++)
                        for (int t = 0; t < T; t++)
                            for (int py = 0; py < P; py++) {
                                const uint8_t *src = px[t] + ((size_t)(y0 + py) * ow + x0) * 3 + ch;
                                float *dst = row + ((size_t)ch * T + t) * PP + (size_t)py * P;
                                for (int qx = 0; qx < P; qx++) dst[qx] = lut[ch][src[3 * qx]];
                            }
                    row += dim;
                }
}

int h3_image_pixels(const h3_image_proc_cfg *c, const uint8_t *rgb, int width, int height, float *out)
{
    int grid[3], dim, rc;
    if ((rc = h3_image_check(rgb, width, height, "image processor")) || (rc = h3_image_grid(c, width, height, grid, &dim)))
        return rc;
    if (!out) return h3_err(H3_E_INVALID, "image processor: NULL output");
    const int P = c->patch_size;
    const int oh = grid[1] * P, ow = grid[2] * P;
    uint8_t *img = NULL;
    const uint8_t *px = rgb;
    if (oh != height || ow != width) {
        if (!(img = h3_malloc((size_t)oh * ow * 3))) return -H3_E_NOMEM;
        if ((rc = h3_resize_bicubic_u8(rgb, height, width, img, oh, ow))) {
            free(img);
            return rc;
        }
        px = img;
    }
    /* An image is its own temporal patch: the frame repeated temporal_patch_size times. */
    const uint8_t *frames[64];
    for (int t = 0; t < c->temporal_patch_size; t++) frames[t] = px;
    patchify(c, frames, oh, ow, dim, out);
    free(img);
    return 0;
}

/* ---- the video processor (Qwen3VLVideoProcessor) ------------------------------------------- */

void h3_video_proc_defaults(h3_image_proc_cfg *c)
{
    h3_image_proc_defaults(c);
    /* Qwen3VLVideoProcessor's class values: size 128 * 32 * 32 .. 32 * 32 * 768 pixels. */
    c->min_pixels = 128 * 32 * 32;
    c->max_pixels = 32 * 32 * 768;
}

int h3_video_proc_cfg_load(h3_model *m, h3_image_proc_cfg *c)
{
    h3_video_proc_defaults(c);
    if (!m || !m->partition_dir) return 0;
    /* transformers' order: processor_config.json's "video_processor", else the first of
       video_preprocessor_config.json and preprocessor_config.json of the processor folder. */
    static const char *const files[] = {"processor/processor_config.json", "processor/video_preprocessor_config.json",
                                        "processor/preprocessor_config.json"};
    return load_first_cfg(m, files, sizeof files / sizeof *files, 0, "video_processor", false, c);
}

int h3_video_smart_resize(int n_frames, int height, int width, int factor, int temporal_factor, int64_t min_pixels,
                          int64_t max_pixels, int *out_h, int *out_w)
{
    if (height < 1 || width < 1) return h3_err(H3_E_INVALID, "video processor: empty frames (%dx%d)", width, height);
    if (factor < 1 || temporal_factor < 1) return h3_err(H3_E_INVALID, "video processor: bad patch settings");
    if (n_frames < temporal_factor)
        return h3_err(H3_E_INVALID, "video processor: %d frames, fewer than the temporal patch of %d", n_frames,
                      temporal_factor);
    double h = height, w = width;
    if (height < factor || width < factor) {
        /* Python: int(height * scale), scale = max(factor / height, factor / width) */
        const double s = fmax((double)factor / h, (double)factor / w);
        h = floor(h * s);
        w = floor(w * s);
    }
    const double hi = fmax(h, w), lo = fmin(h, w);
    if (hi / lo > 200)
        return h3_err(H3_E_INVALID, "video processor: %dx%d has an aspect ratio of %g; transformers' Qwen3-VL "
                      "processor refuses ratios above 200", width, height, hi / lo);
    double hb = nearbyint(h / factor) * factor, wb = nearbyint(w / factor) * factor;
    const double tb = nearbyint((double)n_frames / temporal_factor) * temporal_factor;
    if (tb * hb * wb > (double)max_pixels) {
        const double beta = sqrt((double)n_frames * h * w / (double)max_pixels);
        hb = fmax(factor, floor(h / beta / factor) * factor);
        wb = fmax(factor, floor(w / beta / factor) * factor);
    } else if (tb * hb * wb < (double)min_pixels) {
        const double beta = sqrt((double)min_pixels / ((double)n_frames * h * w));
        hb = ceil(h * beta / factor) * factor;
        wb = ceil(w * beta / factor) * factor;
    }
    if (!(hb >= factor && wb >= factor) || hb * wb > (double)H3_IMAGE_MAX_PIXELS)
        return h3_err(H3_E_INVALID, "video processor: %dx%d resizes to %.0fx%.0f, outside [%d, %lld] pixels a side",
                      width, height, wb, hb, factor, (long long)H3_IMAGE_MAX_PIXELS);
    *out_h = (int)hb;
    *out_w = (int)wb;
    return 0;
}

int h3_video_grid(const h3_image_proc_cfg *c, int n_frames, int width, int height, int grid_thw[3], int *patch_dim)
{
    int rc, oh = height, ow = width;
    if ((rc = cfg_check(c)) || (rc = check_size(width, height, "video processor"))) return rc;
    const int factor = c->patch_size * c->merge_size;
    if (c->do_resize) {
        if ((rc = h3_video_smart_resize(n_frames, height, width, factor, c->temporal_patch_size, c->min_pixels,
                                        c->max_pixels, &oh, &ow)))
            return rc;
    } else if (height % factor || width % factor) {
        return h3_err(H3_E_INVALID, "video processor: with do_resize off, %dx%d must be a multiple of %d a side",
                      width, height, factor);
    }
    const int64_t patches = (int64_t)(oh / c->patch_size) * (ow / c->patch_size);
    if (patches > H3_IMAGE_MAX_PATCHES)
        return h3_err(H3_E_INVALID, "video processor: %dx%d resizes to %dx%d = %lld patches a frame, more than the "
                      "%lld this engine runs the vision tower on", width, height, ow, oh, (long long)patches,
                      (long long)H3_IMAGE_MAX_PATCHES);
    /* The last frame repeated up to a whole temporal patch (Qwen3VLVideoProcessor.patchify). */
    grid_thw[0] = (n_frames + c->temporal_patch_size - 1) / c->temporal_patch_size;
    grid_thw[1] = oh / c->patch_size;
    grid_thw[2] = ow / c->patch_size;
    if (patch_dim) *patch_dim = 3 * c->temporal_patch_size * c->patch_size * c->patch_size;
    return 0;
}

int h3_video_block_pixels(const h3_image_proc_cfg *c, int n_frames, const uint8_t *const *block, int width,
                          int height, float *out)
{
    int grid[3], dim, rc;
    if ((rc = h3_video_grid(c, n_frames, width, height, grid, &dim))) return rc;
    if (!out || !block) return h3_err(H3_E_INVALID, "video processor: NULL frames or output");
    const int T = c->temporal_patch_size, oh = grid[1] * c->patch_size, ow = grid[2] * c->patch_size;
    if (T > 64) return h3_err(H3_E_UNSUPPORTED, "video processor: temporal patch %d (at most 64)", T);
    uint8_t *img = NULL;
    const uint8_t *px[64];
    const bool resize = oh != height || ow != width;
    if (resize && !(img = h3_malloc((size_t)T * oh * ow * 3))) return -H3_E_NOMEM;
    for (int t = 0; t < T && !rc; t++) {
        if (!block[t]) rc = h3_err(H3_E_INVALID, "video processor: NULL frame");
        else if (!resize) px[t] = block[t];
        else if (!(rc = h3_resize_bicubic_u8(block[t], height, width, img + (size_t)t * oh * ow * 3, oh, ow)))
            px[t] = img + (size_t)t * oh * ow * 3;
    }
    if (!rc) patchify(c, px, oh, ow, dim, out);
    free(img);
    return rc;
}
