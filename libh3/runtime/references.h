/*
 * Ref2VA references of a render request (h3_request.references): their validation against
 * diffusers' MiniMaxH3Ref2VASetupStep limits and the image reference's normalised size. The
 * layout they produce is h3_dit_layout_ref2va (models/dit.h).
 */
#ifndef H3_RUNTIME_REFERENCES_H
#define H3_RUNTIME_REFERENCES_H

#include "core/internal.h"
#include "core/keyframe.h"
#include "models/dit.h"

#define H3_REF_MAX_IMAGES 9
#define H3_REF_MAX_VIDEOS 3
#define H3_REF_MAX_AUDIOS 3
#define H3_REF_IMAGE_SHORT_EDGE 2048 /* diffusers' reference_image_short_edge of the release */

/*
 * An image reference's encoding size (diffusers' setup step): scale = short_edge / min(w, h), each
 * side round(side * scale / multiple) * multiple with Python's half-to-even, at least one
 * multiple; upscaling included, no area cap.
 */
H3_INTERNAL int h3_ref_image_size(int width, int height, int short_edge, int multiple, int *out_width,
                                  int *out_height);

/*
 * Validate the request's references before any work: counts per kind, not audio alone, not
 * beside first/last frames, the context opened on the Ref2VA partition, each image's size, each
 * video's frames / rate / size, each audio clip's (and soundtrack's) samples / channels / rate given
 * (the rate's range is checked in h3_ref_plan_audio).
 * Returns 0 when there are none.
 */
H3_INTERNAL int h3_ref_request_check(const h3_model *m, const h3_request *q);
/* The injected draws of reference i (h3_parity.reference_noise / reference_posterior_noise), or NULL. */
H3_INTERNAL const float *h3_ref_noise(const h3_request *q, int i);
H3_INTERNAL const float *h3_ref_posterior_noise(const h3_request *q, int i);

/*
 * The visual references of a request as the render encodes them, in request order: each image's
 * encoding size (h3_ref_image_size with the model's reference edge) or each video's canvas (the
 * canvas rule at its own aspect), the latent grid, and where the normalised latent [C, lt, lh, lw]
 * lives in one condition buffer (floats).
 */
typedef struct h3_ref_plan {
    int n;
    int index[H3_REF_MAX]; /* position in h3_request.references */
    int w[H3_REF_MAX], h[H3_REF_MAX];
    int lt[H3_REF_MAX], lh[H3_REF_MAX], lw[H3_REF_MAX];
    /* Videos: frames after the 24 fps resample and the truncation to the render (what the text
       encoder samples), and the first enc_frames of them the video VAE encodes; 0 for images. */
    int frames[H3_REF_MAX], enc_frames[H3_REF_MAX];
    int64_t off[H3_REF_MAX];
    int64_t floats, max_floats;
    /* Audio references and video soundtracks (request order): samples kept per channel after the
       truncation to the render's duration at the clip's rate (a_source), those samples at the audio
       VAE's rate (a_samples), latent frames, and where their rows [2 * lat][C_a] start in one buffer. */
    int n_audio;
    int aindex[H3_REF_MAX_AUDIOS];
    int64_t a_source[H3_REF_MAX_AUDIOS];
    int64_t a_samples[H3_REF_MAX_AUDIOS];
    int a_lat[H3_REF_MAX_AUDIOS];
    int64_t a_off[H3_REF_MAX_AUDIOS], a_floats;
    /* "<Audio j>: " labels before visual reference k of the presentation; [n] after the last. */
    int audio_before[H3_REF_MAX + 1];
} h3_ref_plan;

/* The model's encoding size of an image reference (h3.h h3_reference_size). */
H3_INTERNAL int h3_ref_model_image_size(h3_model *m, int width, int height, int *out_width, int *out_height);

/* Fill `p` for a request that passed h3_ref_request_check, rendering `frames` frames. C: latent
   channels; spatial: the video VAE's pixels per latent. Videos are planned as diffusers'
   setup step and reference encoder treat them (h3_ref_video_source, the canvas of their own aspect,
   the count snapped down to 17n + 5 for the VAE) and refused when the text encoder could not read
   them. */
H3_INTERNAL int h3_ref_plan_images(h3_model *m, const h3_request *q, int frames, int C, int spatial,
                                   h3_ref_plan *p);

/*
 * A video reference onto 24 fps as diffusers' _normalize_video_condition does it: source frame i
 * is held from slot floor(i * 24 / fps + 0.5) to the next one's, the last to floor(n * 24 / fps +
 * 0.5). Returns the frame count at 24 fps; with `map`, map[j] = the source frame of frame j (j <
 * cap). Negative: an H3_E_* code.
 */
H3_INTERNAL int64_t h3_ref_video_source(int src_frames, double fps, int *map, int64_t cap);

/* Video reference k of the plan at 24 fps, each frame resized with PIL's Lanczos to p->w[k] x
   p->h[k], into out [n][h][w][3]: its first n frames (the VAE's enc_frames), or with `sampled` all
   p->frames[k] slots but only the frames the text encoder reads filled (h3_vl_video_sample; the
   others are left as they are, so a zeroed buffer stays mostly unwritten). */
H3_INTERNAL int h3_ref_video_pixels(h3_pool *pool, const h3_request *q, const h3_ref_plan *p, int k, int n,
                                    bool sampled, uint8_t *out);

/*
 * The reference rows, each condition noised as diffusers' scale_noise(z, 0.999, eps) and
 * patchified on its own grid, concatenated in request order into rows. eps: the reference's
 * injected noise, else libh3's stream H3_STREAM_COND + k under `seed`. scratch: max_floats.
 */
H3_INTERNAL void h3_ref_pack(const h3_dit_cfg *dc, const h3_request *q, const h3_ref_plan *p, uint64_t seed,
                             const float *cond, float *scratch, float *rows);

/*
 * Plan the audio references of a request that passed h3_ref_request_check (after
 * h3_ref_plan_images): each waveform (an audio reference's, or a video reference's soundtrack)
 * truncated to frames / 24 s at its own rate (diffusers' int(num_frames / fps * sample_rate)),
 * then resampled once to the audio VAE's rate (torchaudio's default kernel,
 * core/audio_resample.h) and encoded there. Rates outside 4 kHz .. 384 kHz are refused.
 */
H3_INTERNAL int h3_ref_plan_audio(h3_model *m, const h3_request *q, int frames, h3_ref_plan *p);

/*
 * Encode each audio reference (mono duplicated to stereo, resampled, posterior mode, per-channel
 * normalisation, channel-major rows) into rows (p->a_floats floats). On the CPU backend `be`.
 */
H3_INTERNAL int h3_ref_encode_audio(h3_model *m, h3_backend *be, const h3_request *q, const h3_ref_plan *p,
                                    float *rows, h3_progress_fn progress, void *user);

#endif
