/*
 * The cuDNN attention interface the backend calls (cuda_sdpa.h of the cuDNN path, which builds with
 * the ordinary C++ compiler too and takes the device, context and stream through struct
 * h3_cudnn_host). Until that path is in the tree (libh3/backend/cuda/cuda_sdpa_cudnn.cpp), the same
 * declarations are made here and cudnn_absent/cudnn_absent.cpp answers "not in this build"; the
 * Makefile compiles that stand-in only while cuda_sdpa_cudnn.cpp is missing.
 */
#ifndef H3_CUDA_CUDNN_HOST_H
#define H3_CUDA_CUDNN_HOST_H

#if __has_include("cuda_sdpa_cudnn.cpp")
#include "backend/cuda/cuda_sdpa.h"
#else
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
struct h3_cudnn_host {
    int device;
    int cc_major, cc_minor;
    void *ctx;
    int (*dev_alloc)(void *ctx, size_t bytes, void **out);
    void (*dev_free)(void *ctx, void *p);
    int (*stream_sync)(void *ctx, void *stream);
};
int h3_cudnn_sdpa_available(const struct h3_cudnn_host *host, char *why, size_t cap);
void h3_cudnn_set_lib(const char *path);
int h3_cudnn_sdpa(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K, const void *V, void *O,
                  int64_t L_q, int64_t L_k, int heads, int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv,
                  int64_t ldo, float scale, int causal, char *err, size_t cap);
int h3_cudnn_sdpa_fp8(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K, const void *V,
                      void *O, const float *scales, float *amax, int64_t L_q, int64_t L_k, int heads, int kv_heads,
                      int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo, float scale, char *err, size_t cap);
#ifdef __cplusplus
}
#endif
#endif

#endif /* H3_CUDA_CUDNN_HOST_H */
