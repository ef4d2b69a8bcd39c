/*
 * The CPU backend's versions of the video VAE encoder's ops (conv3d, group_norm), in
 * cpu_conv3d.c. The contracts are the ones in backend.h.
 */
#ifndef H3_CPU_CONV3D_H
#define H3_CPU_CONV3D_H

#include "backend/backend.h"

H3_INTERNAL int h3_cpu_conv3d(h3_backend *be, const float *x, const h3_bconv3d *g, const h3_bw *W,
                              const float *bias, float *y);
H3_INTERNAL int h3_cpu_group_norm(h3_backend *be, const float *x, int frames, int64_t pixels, int C, int groups,
                                  const float *w, const float *b, float eps, bool silu, float *y);

#endif /* H3_CPU_CONV3D_H */
