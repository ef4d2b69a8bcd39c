/*
 * The CPU backend's VAE decoder ops (channels_last, unpatchify, vae_stitch, snake_aa, conv_gemm,
 * conv1_clamp), in cpu_vae.c. The contracts are the ones in backend.h.
 */
#ifndef H3_CPU_VAE_H
#define H3_CPU_VAE_H

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/ops.h"

H3_INTERNAL int h3_cpu_channels_last(h3_backend *be, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt,
                                     int t_avail, int ny, int nx, const float *scale, const float *shift,
                                     const h3_bt *y);
H3_INTERNAL int h3_cpu_unpatchify(h3_backend *be, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt,
                                  int ps, const int32_t *fmap, float *dst);
H3_INTERNAL int h3_cpu_vae_stitch(h3_backend *be, const h3_bstitch *s);
H3_INTERNAL int h3_cpu_snake_aa(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const float *fup,
                                const float *fdown, const h3_bphased *dst);
H3_INTERNAL int h3_cpu_conv_gemm(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);
H3_INTERNAL int h3_cpu_conv1_clamp(h3_backend *be, const h3_bt *X, const float *w, float *y);

/* Host scratch snake_aa keeps per worker thread (bytes), for the audio decoder's memory estimate. */
H3_INTERNAL int64_t h3_cpu_snake_scratch_bytes(void);

#endif /* H3_CPU_VAE_H */
