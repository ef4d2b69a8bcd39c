/*
 * FL2VA keyframe preprocessing: checks on a keyframe, the canvas a keyframe implies, and putting a
 * keyframe onto the canvas, exactly as diffusers' MiniMaxH3ResizeStep does it (before_encoder.py,
 * modular_pipeline.py: resolve_canvas_size) with PIL's Lanczos resampling reproduced bit for bit
 * on uint8 RGB, fixed-point arithmetic and the uint8 intermediate between its two passes included.
 *
 * Noise of an FL2VA render (libh3's counter-based generator, schedule.h h3_noise):
 *  - stream 0: target video noise, stream 1: target audio noise (as for text-only renders);
 *  - stream H3_STREAM_COND + k: the conditioning noise eps of condition k in packed order (first
 *    frame, then last frame; a lone last frame is condition 0), mixed as 0.999 z + 0.001 eps.
 *    diffusers draws one tensor per condition from the request generator, then the target video
 *    noise, then the audio noise; independent streams give the same structure (each draw is its
 *    own sequence) without the order mattering;
 *  - the keyframe encoder's posterior noise: seed H3_KEYFRAME_ENCODE_SEED and stream
 *    H3_STREAM_POSTERIOR, the same for every request and every condition, as diffusers samples
 *    each condition's posterior under a fresh generator seeded 42.
 */
#ifndef H3_KEYFRAME_H
#define H3_KEYFRAME_H

#include "core/host.h"
#include "core/internal.h"

#define H3_STREAM_COND 2
#define H3_STREAM_POSTERIOR 16
#define H3_KEYFRAME_ENCODE_SEED 42

/* Keyframes larger than this are refused before any work (64 megapixels). */
#define H3_KEYFRAME_MAX_PIXELS 64000000LL

/* The canvas a keyframe implies (diffusers' canvas_short_edge, canvas_max_pixels, canvas_multiple). */
typedef struct h3_canvas_rule {
    int short_edge;
    int64_t max_pixels;
    int multiple;
} h3_canvas_rule;

/*
 * A keyframe's size is usable: both sides positive, at most H3_KEYFRAME_MAX_PIXELS, aspect within
 * 1:4 .. 4:1 (diffusers' MINIMAX_H3_MIN/MAX_ASPECT_RATIO). `what` names it in the message
 * ("first frame").
 */
H3_INTERNAL int h3_keyframe_check(int width, int height, const char *what);

/*
 * diffusers' resolve_canvas_size(aspect_w, aspect_h, ...): the short edge at rule->short_edge, the
 * area scaled down to rule->max_pixels if over, both sides rounded half-to-even to the multiple
 * (at least one multiple). The rounding may leave the area slightly above max_pixels, as in
 * diffusers.
 */
H3_INTERNAL int h3_canvas_resolve(const h3_canvas_rule *rule, int aspect_w, int aspect_h, int *width, int *height);

/*
 * PIL's Image.resize((W, H), Image.LANCZOS) of an RGB uint8 image [h][w][3] into dst [H][W][3]:
 * the horizontal pass first into a uint8 intermediate, then the vertical pass, each skipped when
 * its size does not change; 22-bit fixed-point coefficients. Rows run on `pool` (may be NULL);
 * the result does not depend on the thread count.
 */
H3_INTERNAL int h3_resize_lanczos_u8(h3_pool *pool, const uint8_t *src, int w, int h, int W, int H, uint8_t *dst);

/*
 * Put a keyframe [h][w][3] onto a W x H canvas (dst [H][W][3]): unchanged when the sizes match;
 * else stretched (`cover` = 0: the first keyframe, or a lone last one) or cover-cropped (`cover`
 * = 1: the last keyframe after a first one: scale = max(W/w, H/h), sides round(w * scale),
 * round(h * scale) but at least the canvas, Lanczos to that size, then the window at offset
 * ((sw - W) / 2, (sh - H) / 2)).
 */
H3_INTERNAL int h3_keyframe_place(h3_pool *pool, const uint8_t *src, int w, int h, int W, int H, int cover,
                                  uint8_t *dst);

#endif /* H3_KEYFRAME_H */
