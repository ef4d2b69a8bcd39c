/*
 * cuDNN's fused attention (SDPA) as a second attention implementation of libh3's CUDA backend
 * (cuda_sdpa_cudnn.cpp). The own flash kernel (cuda_attention.cu) stays the fallback: every call
 * here either queues the attention on `stream` or returns a negative H3_E_* code with a one-line
 * reason in `err` and O untouched, so the caller can run its own kernel instead.
 *
 * Nothing of CUDA or cuDNN is needed to build this: the backend hands over device memory and
 * stream synchronisation as callbacks (struct h3_cudnn_host), and cuDNN is loaded at run time
 * (dlopen) and driven through its backend (graph) API, declared in cudnn_api.h. Where it looks,
 * in order:
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
 * Thread safety: all calls are serialised by one internal lock. The device is host->device; the
 * caller makes that device's primary context current before each call (cuDNN's handle for the
 * device is created inside the first call and used with that context). Streams handed in must
 * stay valid for as long as the backend uses cuDNN (libh3's backend streams do): a later call may
 * wait for a stream an earlier call used (host->stream_sync) before it frees or reuses memory
 * that work queued there may still read.
 */
#ifndef H3_CUDA_SDPA_H
#define H3_CUDA_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the backend hands the cuDNN path: no CUDA header on either side. */
struct h3_cudnn_host {
    int device;           /* CUDA device ordinal: key of the per-device handle and graph cache */
    int cc_major, cc_minor; /* its compute capability */
    void *ctx;            /* passed back to the callbacks */
    int (*dev_alloc)(void *ctx, size_t bytes, void **out); /* device memory: 0, or a negative H3_E_* code */
    void (*dev_free)(void *ctx, void *p);
    int (*stream_sync)(void *ctx, void *stream); /* wait for everything queued on stream */
};

/* Loads cuDNN once and opens a handle for host->device. 1 if the cuDNN path can be tried, with a
   one-line description in `why` ("cuDNN 9.19.0 for CUDA 13.0 (/path/libcudnn.so.9)"); 0 with the
   reason otherwise ("libcudnn.so.9: cannot open shared object file ...", "cuDNN 8.9.7 ... is
   older than 9.0", "cudnnCreate failed: ..."). `why` may be NULL. The answer is cached per
   device. */
int h3_cudnn_sdpa_available(const struct h3_cudnn_host *host, char *why, size_t cap);

/* Whether fp8 attention (h3_cudnn_sdpa_fp8) can be tried on host's GPU: 1, or 0 with the reason
   in `why` (cuDNN missing, older than 9.1.0 or 9.10.0, a GPU older than Hopper). For h3ctl info;
   an engine for the shape is still looked for at the first call. */
int h3_cudnn_sdpa_fp8_available(const struct h3_cudnn_host *host, char *why, size_t cap);

/* The backend is about to destroy `stream` (after draining it): the cuDNN path stops remembering it as
   the workspace's or a graph's last stream, so no later call waits on a stream that no longer exists
   (several backends of one device share the workspace and the graph cache). */
void h3_cudnn_forget_stream(const struct h3_cudnn_host *host, void *stream);

/* Where to try libcudnn.so.9 first (H3_CUDNN_LIB as libh3 read it; NULL or "": the loader's search
   only). cuDNN is loaded once per process, so only a path given before the first load counts. */
void h3_cudnn_set_lib(const char *path);

/* Attention on `stream` (a CUstream; see above). 0 on success (queued), else a negative H3_E_*
   code (H3_E_UNSUPPORTED: cuDNN missing or no engine for this shape; H3_E_INVALID: bad arguments;
   H3_E_NOMEM: no device memory for cuDNN's workspace) with the reason in `err` (may be NULL).
   A failed call has not written O. L_q == 0 is a no-op; L_k == 0 is refused. */
int h3_cudnn_sdpa(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K, const void *V,
                  void *O, int64_t L_q, int64_t L_k, int heads, int kv_heads, int D, int64_t ldq, int64_t ldk,
                  int64_t ldv, int64_t ldo, float scale, int causal, char *err, size_t cap);

/* fp8 attention (Hopper and newer, cuDNN 9.1+; a separate graph per shape, cached like the
   bf16 ones): Q, K, V, O are e4m3 in the same row layout (rows ld* elements apart, ld a multiple
   of 16, D a multiple of 16 up to 256), no mask. `scales` is device memory holding six f32
   scalars 16 floats apart (64-byte aligned): descale Q, descale K, descale V, descale S, scale S,
   scale O, where Q = descale_q * Q8 and so on, S = the softmax probabilities (P8 = e4m3(P *
   scale_s)), O8 = e4m3(O * scale_o). cuDNN writes max|S| and max|O| (before scaling) to amax[0]
   and amax[4] (device, 16-byte aligned). Returns as h3_cudnn_sdpa. */
int h3_cudnn_sdpa_fp8(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K,
                      const void *V, void *O, const float *scales, float *amax, int64_t L_q, int64_t L_k, int heads,
                      int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo, float scale,
                      char *err, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* H3_CUDA_SDPA_H */
