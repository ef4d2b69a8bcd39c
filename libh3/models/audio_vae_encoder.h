/*
 * Audio VAE encoder (the DAC trunk, the causal-attention pre_block and mean_proj of diffusers'
 * AutoencoderKLMiniMaxH3Audio.encode), and the Ref2VA row layout of its output. Model logic only:
 * every computation on activations is a backend op (backend.h: conv_gemm, snake, layernorm,
 * linear, attention, head_pool, gelu, mul, gated_add).
 */
#ifndef H3_AUDIO_VAE_ENCODER_H
#define H3_AUDIO_VAE_ENCODER_H

#include "h3.h"
#include "backend/backend.h"

/* The encoder's geometry: metadata.json kwargs encoder_dim, encoder_rates, latent_dim,
   num_attention_heads (default 8, the release), with latent_channels and the latent statistics
   of config.json (h3_avae_cfg). */
typedef struct h3_aenc_cfg {
    h3_avae_cfg av;
    int dim0, n_blocks, rates[16], heads;
    int64_t hop; /* product of the rates */
} h3_aenc_cfg;

H3_INTERNAL int h3_aenc_cfg_load(h3_model *m, h3_aenc_cfg *c);

/* Latent frames of an encode of `samples` samples per channel (zero-padded on the right to a
   multiple of the hop, as diffusers' encode pads), or a negative H3_E* code. */
H3_INTERNAL int64_t h3_aenc_frames(const h3_aenc_cfg *c, int64_t samples);

/*
 * Posterior mean (mean_proj's output, diffusers' latent_dist.mode()) of each of `channels`
 * waveforms pcm [channels][samples] (host), each encoded as its own batch item of the mono VAE,
 * into mean [channels][C][frames] (host; cap floats). Loads the encoder weights (weight norm
 * folded at load) and releases them before returning.
 */
H3_INTERNAL int h3_aenc_run(h3_model *m, h3_backend *be, const float *pcm, int channels, int64_t samples,
                            float *mean, int64_t cap, h3_progress_fn progress, void *user);

/* Ref2VA's rows of an audio reference: row (ch * frames + t), column c =
   (mean[ch][c][t] - latents_mean[c]) / latents_std[c] in f32 (MiniMaxH3Ref2VAEncodeStep). */
H3_INTERNAL int h3_aenc_rows(const h3_aenc_cfg *c, const float *mean, int channels, int64_t frames, float *rows,
                             int64_t cap);

#endif /* H3_AUDIO_VAE_ENCODER_H */
