/*
 * Audio VAE decoder (BigVGAN) internals: the entry points the pipeline and the API call. The
 * decoder's activations, convolutions and element-wise steps are backend ops (backend.h:
 * snake_aa, conv_gemm, conv1_clamp, add_div, ...); the CPU kernels behind them are in
 * backend/cpu/ (cpu_vae.c, avae_kern.inc).
 *
 * Activations are time-major ([time, channels], one row per sample) so that a convolution over
 * a zero-margined buffer is a plain GEMM whose input rows overlap: row t of the im2col matrix is
 * the K consecutive rows starting at t, i.e. the same memory with a row stride of `channels`.
 */
#ifndef H3_AUDIO_VAE_H
#define H3_AUDIO_VAE_H

#include "h3.h"
#include "backend/backend.h"

/* Geometry of a decode: samples per side for `frames` latent frames (or a negative H3_E*). */
H3_INTERNAL int64_t h3_avae_samples(const h3_avae_cfg *c, int64_t frames);

/* Peak activation memory (bytes) of h3_avae_run for `frames` latent frames, buffer for buffer,
   plus `backend_scratch`: the host scratch the backend keeps for the decoder (the caller asks the
   backend; the CPU's is per worker thread). The folded weights (about the decoder's stored bytes)
   come on top. */
H3_INTERNAL int64_t h3_avae_work_bytes(const h3_avae_cfg *c, int64_t frames, int64_t backend_scratch);

/*
 * Decode normalised audio latents [2, C, frames] (side-major, as the DiT's audio rows unpack:
 * all left rows then all right rows) into PCM [2, samples] in [-1, 1] at c->sample_rate, on
 * backend `be` (latents and pcm are host memory). Loads and folds the decoder weights, decodes
 * each stereo side as an independent batch item (as diffusers does), and releases the weights
 * and the file mapping before returning. `progress` (may be NULL) is called between
 * convolutions; a non-zero return cancels with H3_E_CANCELLED. `pcm_cap` is the number of floats
 * pcm can hold (at least 2 * samples).
 */
H3_INTERNAL int h3_avae_run(h3_model *m, h3_backend *be, const float *latents, int channels, int64_t frames,
                            float *pcm, int64_t pcm_cap, h3_progress_fn progress, void *user);

/* The loaded decoder kept between calls on a backend that copies its weights (a GPU; the folded
   f32 weights then stay in device memory): h3_avae_run with `keep` takes it from *keep when it was
   loaded for `be`, else loads it and leaves it there (free it with h3_avae_keep_free). On the CPU
   it is loaded and released in the call, as h3_avae_run does. */
typedef struct h3_avae_keep h3_avae_keep;
H3_INTERNAL int h3_avae_run_keep(h3_model *m, h3_backend *be, const float *latents, int channels, int64_t frames,
                                 float *pcm, int64_t pcm_cap, h3_progress_fn progress, void *user,
                                 h3_avae_keep **keep);
H3_INTERNAL void h3_avae_keep_free(h3_avae_keep *k);

/* Refuse a decoder geometry this engine cannot run (one line naming the config). */
H3_INTERNAL int h3_avae_check_geometry(const h3_avae_cfg *c, const char *path);

#endif /* H3_AUDIO_VAE_H */
