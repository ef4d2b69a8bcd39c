/* Shared by cuda_decoders.cpp and kernels/decoders.cu: the kernels' argument structs and constants. */
#ifndef H3K_DECODERS_H
#define H3K_DECODERS_H

namespace h3cuda {


/* vae_stitch converts and downloads at most this many bytes at a time (a normal 256 px tile of
   17 frames needs 3.3 MB; an untiled 1344 x 768 window needs batches). */
#define STITCH_BATCH_BYTES ((size_t)64 << 20)

/* ---- vae_stitch ---------------------------------------------------------------------------- */

struct StitchArgs {
    const float *tile, *above, *left;
    float *carry;
    int C, K, keep0, keep1, blend_t, th, tw, max_ovy, max_ovx, H, W;
    int window, last, y0, x0, own_h, own_w, ov_top, ov_left, slot_above, slot_left;
    int k0, k1;  /* the frames of the window this launch blends */
    int kemit;   /* frames k < kemit go to the outputs (their frame index is below `frames`) */
    /* The kept frames of [k0, min(k1, kemit)) in the staging, compact over the owned rectangle:
       raw [C][nb][own_h][own_w]; rgb and pix [nb][own_h][own_w][C]. Any may be NULL. */
    float *raw;
    uint8_t *rgb;
    float *pix;
    int nb;
    float mean[3], sd[3];
};

/* ---- snake_aa ------------------------------------------------------------------------------ */

/* diffusers' resampler geometry for ratio 2 and 12 taps (see avae_kern.inc, which derives it):
   upsampled sample n sums taps j of parity (n + UP_CROP) & 1 over input rows up_src(n) - j,
   clamped to the signal; output row m sums z[2m + k - DN_LEFT], clamped. */
#define AA_UP_PAD (H3_AA_TAPS / H3_AA_RATIO - 1)
#define AA_UP_CROP (AA_UP_PAD * H3_AA_RATIO + (H3_AA_TAPS - H3_AA_RATIO) / 2)
#define AA_DN_LEFT (H3_AA_TAPS / 2 - (H3_AA_TAPS % 2 == 0))
#define AA_UP_NTAP (H3_AA_TAPS / H3_AA_RATIO)
#define AA_TM 128     /* output rows per block */
#define AA_THREADS 256

struct AaArgs {
    const float *x;
    int64_t L;
    int C, TC; /* channels; channels per block */
    const float *a, *rb, *fup, *fdown;
    float *p;
    int d;
    int64_t phase_rows, margin;
};

#define F32_T 16

} /* namespace h3cuda */

#endif
