/*
 * Frame resizing for renders made on a smaller canvas (h3_request.render_width/height): a separable
 * Lanczos-3 filter, the resampler image libraries use for quality downscaling and upscaling.
 */
#ifndef H3_RESAMPLE_H
#define H3_RESAMPLE_H

#include "core/host.h"
#include "core/internal.h"

/*
 * Resize F frames [F, h, w, 3] of values in [0, 1] to [F, H, W, 3]: pixel centres aligned, the kernel
 * widened by the ratio when shrinking, edge pixels repeated, results clamped to [0, 1] (the filter
 * rings past them near edges). `pixels` (optional) receives the floats, `rgb` (optional) their uint8
 * values rounded as the video decoder rounds (x * 255, half to even). Frames run in parallel on the
 * pool; results do not depend on the thread count.
 */
H3_INTERNAL int h3_resize_lanczos3(h3_pool *pool, const float *src, int F, int h, int w, int H, int W, float *pixels,
                                   uint8_t *rgb);

#endif /* H3_RESAMPLE_H */
