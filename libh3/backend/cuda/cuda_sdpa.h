/*
 * cuDNN's fused attention (SDPA) as a second attention implementation of libh3's CUDA backend
 * (cuda_sdpa_cudnn.cu). The own flash kernel (cuda_attention.cu) stays the fallback: every call
 * here either queues the attention on `s` or returns a negative H3_E_* code with a one-line reason
 * in `err` and O untouched, so the caller can run its own kernel instead.
 *
 * cuDNN is loaded at run time (dlopen), never linked: a libh3_cuda built with cuDNN support works
 * on machines without it, and one built without it (no cuDNN headers at build time) answers
 * "built without cuDNN". Where it looks, in order:
 *   1. H3_CUDNN_LIB, the full path of libcudnn.so.9 (e.g. the nvidia-cudnn-cu13 wheel's
 *      .../site-packages/nvidia/cudnn/lib/libcudnn.so.9);
 *   2. "libcudnn.so.9" through the loader's normal search (LD_LIBRARY_PATH, ld.so.cache), or the
 *      copy already in the process (e.g. torch's).
 * cuDNN 9.0 or newer is required.
 *
 * Layout: the one of backend.h's attention op. Q [L_q, heads*D], K and V [L_k, kv_heads*D],
 * O [L_q, heads*D], all bf16, rows ld* elements apart, head h at columns [h*D, (h+1)*D); query
 * head h reads kv head h / (heads / kv_heads). O = softmax(scale * Q K^T [+ causal mask]) V with
 * f32 softmax statistics; no padding mask. Causal uses libh3's convention (query i sees keys
 * j <= i + L_k - L_q) and is offered only where every query sees a key (L_q <= L_k).
 *
 * Requirements for the cuDNN path (else a negative code and the reason): D % 8 == 0, D <= 256,
 * every ld a multiple of 8 and every pointer 16-byte aligned, and a cuDNN engine that supports
 * the shape on this GPU. Built graphs are cached per shape, strides, scale and mask; the first call
 * of a new shape takes milliseconds to seconds (cuDNN compiles its kernel), later ones only
 * enqueue. Results are deterministic: the same engine is chosen for the same shape every run, the
 * forward pass has no atomics, and engines cuDNN marks non-deterministic are excluded.
 *
 * Thread safety: all calls are serialised by one internal lock. The device is the calling thread's
 * current CUDA device.
 */
#ifndef H3_CUDA_SDPA_H
#define H3_CUDA_SDPA_H

#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads cuDNN once and opens a handle on the current device. 1 if the cuDNN path can be tried,
   with a one-line description in `why` ("cuDNN 9.19.0 (libcudnn.so.9 ...)"); 0 with the reason
   otherwise ("built without cuDNN", "libcudnn.so.9: cannot open shared object file", "cuDNN
   8.9.7 is older than 9.0"). `why` may be NULL. The answer for a device is cached. */
int h3_cudnn_sdpa_available(char *why, size_t cap);

/* Where to try libcudnn.so.9 first (H3_CUDNN_LIB as libh3 read it; NULL or "": the loader's search
   only). cuDNN is loaded once per process, so only a path given before the first load counts. */
void h3_cudnn_set_lib(const char *path);

/* Attention on stream `s` (see above). 0 on success (queued on `s`), else a negative H3_E_* code
   (H3_E_UNSUPPORTED: cuDNN missing or no engine for this shape; H3_E_INVALID: bad arguments;
   H3_E_NOMEM: no device memory for cuDNN's workspace) with the reason in `err` (may be NULL).
   A failed call has not written O. L_q == 0 is a no-op; L_k == 0 is refused. */
int h3_cudnn_sdpa(cudaStream_t s, const void *Q, const void *K, const void *V, void *O, int64_t L_q, int64_t L_k,
                  int heads, int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo, float scale,
                  int causal, char *err, size_t cap);

/* fp8 attention (Hopper and newer, cuDNN 9.1+; a separate graph per shape, cached like the
   bf16 ones): Q, K, V, O are e4m3 in the same row layout (rows ld* elements apart, ld a multiple
   of 16, D a multiple of 16 up to 256), no mask. `scales` is device memory holding six f32
   scalars 16 floats apart (64-byte aligned): descale Q, descale K, descale V, descale S, scale S,
   scale O, where Q = descale_q * Q8 and so on, S = the softmax probabilities (P8 = e4m3(P *
   scale_s)), O8 = e4m3(O * scale_o). cuDNN writes max|S| and max|O| (before scaling) to amax[0]
   and amax[4] (device, 16-byte aligned). Returns as h3_cudnn_sdpa. */
int h3_cudnn_sdpa_fp8(cudaStream_t s, const void *Q, const void *K, const void *V, void *O, const float *scales,
                      float *amax, int64_t L_q, int64_t L_k, int heads, int kv_heads, int D, int64_t ldq, int64_t ldk,
                      int64_t ldv, int64_t ldo, float scale, char *err, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* H3_CUDA_SDPA_H */
