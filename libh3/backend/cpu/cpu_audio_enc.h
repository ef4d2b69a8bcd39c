/*
 * The CPU backend's versions of the audio VAE encoder's ops (snake, head_pool, mul), in
 * cpu_audio_enc.c. The contracts are the ones in backend.h.
 */
#ifndef H3_CPU_AUDIO_ENC_H
#define H3_CPU_AUDIO_ENC_H

#include "backend/backend.h"

H3_INTERNAL int h3_cpu_snake(h3_backend *be, const h3_bt *x, const float *a, const float *rb,
                             const h3_bphased *dst);
H3_INTERNAL int h3_cpu_head_pool(h3_backend *be, const h3_bt *x, int heads, int D, const h3_bt *y);
H3_INTERNAL int h3_cpu_mul(h3_backend *be, const h3_bt *a, const h3_bt *b, const h3_bt *y);

#endif /* H3_CPU_AUDIO_ENC_H */
