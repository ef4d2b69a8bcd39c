/*
 * The backend seam: where model logic (models/) meets the kernels of one kind of hardware.
 *
 * A stage is written once against this table of operations; each backend (backend/cpu/ today,
 * backend/cuda/ built as a separate shared library and loaded at run time, a Metal folder later)
 * supplies the table. The style is ggml's plain-C vtable with an opaque context, without a graph
 * compiler: our stages are a fixed sequence of large ops, and an eager table is enough to keep a
 * GPU busy when each op is big and the row kernels are fused.
 *
 * Memory. Every pointer an op takes lives on the backend that runs it: host memory on the CPU,
 * device memory on a GPU. `alloc`/`upload`/`download` move data across; uploads and ops run in
 * issue order on the backend's one stream, and `download` returns when the data is on the host.
 * Index and table arrays (rows to gather, AdaLN entries) are backend memory too.
 *
 * Precision. Activations are described by h3_bt views carrying their dtype. The CPU backend runs
 * everything in f32 (act_dtype = F32) and is the exact path every parity test checks. The CUDA
 * backend stores GEMM weights in bf16 (f32/f16 checkpoints are rounded once at load), feeds the
 * GEMMs and attention bf16 activations (act_dtype = BF16) and accumulates in f32; the residual
 * stream, the norms' statistics, the modulation tables and the outputs stay f32.
 *
 * Errors. Ops return 0 or a negative H3_E_* code and record the message (h3_err, or the host
 * callbacks of h3_backend_host for a backend built as its own library). After an error the
 * backend stays usable for other calls and can be destroyed.
 *
 * Determinism. Every op of every backend gives the same bits for the same inputs on every run:
 * no atomics in reductions, no split-K, fixed tile orders (the CPU kernels split work over
 * outputs only, so results are also independent of the thread count).
 */
#ifndef H3_BACKEND_H
#define H3_BACKEND_H

#include "core/internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct h3_backend h3_backend;

/* A 2-D view of backend memory: `rows` rows of `cols` elements, `ld` elements apart. */
typedef struct h3_bt {
    void *data;
    h3_dtype dtype; /* H3_DT_F32 or H3_DT_BF16 */
    int64_t rows, cols, ld;
} h3_bt;

static inline h3_bt h3_bt_make(void *data, h3_dtype dt, int64_t rows, int64_t cols, int64_t ld)
{
    h3_bt t = {data, dt, rows, cols, ld};
    return t;
}

/*
 * A weight matrix [rows, cols] (one row per output feature) as the backend holds it: on the CPU a
 * view of the mapped safetensors data in its stored dtype (nothing copied), on a GPU a device copy
 * in bf16. `priv` belongs to the backend.
 */
typedef struct h3_bw {
    const void *data;
    h3_dtype dtype;
    int64_t rows, cols;
    void *priv;
} h3_bw;

/* AdaLN modulation of a norm or a gated residual, per row:
     entry = row_entry[r] (r the row's input index), base = tab + (entry * stride + slot) * n;
     norm:  y = RMSNorm(x) * w * base[n + i] + base[i]   (base[n..2n) holds 1 + scale)
     gate:  x += base[i] * y
   tab = NULL: no modulation (y = RMSNorm(x) * w; x += y). */
typedef struct h3_bmod {
    const float *tab;
    const int32_t *row_entry;
    int stride, slot;
} h3_bmod;

typedef struct h3_backend_ops {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(h3_backend *be);

    /* ---- memory ---- */
    /* `bytes` of backend memory (64-byte aligned on the host, 256 on a GPU); NULL + error when out
       of memory (the message says how much was asked and how much is free). */
    void *(*alloc)(h3_backend *be, size_t bytes);
    void (*release)(h3_backend *be, void *p); /* NULL is ignored */
    int (*upload)(h3_backend *be, void *dst, const void *src, size_t bytes);
    int (*download)(h3_backend *be, void *dst, const void *src, size_t bytes);
    int (*zero)(h3_backend *be, void *dst, size_t bytes);
    int (*sync)(h3_backend *be); /* wait for all issued work; reports a deferred fault */
    /* Device memory free/total in bytes (the CPU answers 0/0). */
    int (*mem_info)(h3_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);

    /* ---- weights ---- */
    /* Make the host matrix (stored dtype F32/BF16/F16, rows x cols, row-major, typically an mmap
       of the shard) usable by `linear`. The host data must stay valid while the handle lives on
       the CPU; a GPU copies it and keeps no reference. */
    int (*weight_load)(h3_backend *be, const void *host, h3_dtype dt, int64_t rows, int64_t cols, h3_bw *out);
    void (*weight_free)(h3_backend *be, h3_bw *w);

    /* ---- ops ---- */
    /* Y[M, N] = X[M, K] W^T (+ bias f32 [N], may be NULL). X: act dtype or f32; Y: f32 or act
       dtype. Y must not alias X. */
    int (*linear)(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);
    /* Scaled dot-product attention, no mask unless `causal`. Q [Lq, heads*D], K/V [Lk, kv_heads*D],
       O [Lq, heads*D], head h at columns [h*D, (h+1)*D). Memory linear in tokens. */
    int (*attention)(h3_backend *be, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads,
                     int D, float scale, bool causal, const h3_bt *O);
    /* y[k] = RMSNorm(x[rows ? rows[k] : k]) * w, modulated (see h3_bmod; the entry is looked up by
       the input row index). Mean square in double over n = x->cols; w f32 [n] (NULL = 1).
       y->rows rows are written. */
    int (*norm_mod)(h3_backend *be, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod,
                    float eps, const h3_bt *y);
    /* Per row and head of qkv [L, heads * 3D] (per head [q | k | v]): RMS-normalise q and k with
       qn/kn [D] (eps), rotate-half RoPE over the first 2*half dims with cos/sin [L, half] (NULL:
       no rotation), and write q, k, v [L, heads*D]. */
    int (*qk_norm_rope)(h3_backend *be, const h3_bt *qkv, const float *qn, const float *kn, const float *cos,
                        const float *sin, int heads, int D, int half, float eps, const h3_bt *q, const h3_bt *k,
                        const h3_bt *v);
    /* x[r] += g[r] * y[r] (g from the modulation table, or 1 when mod->tab is NULL); x, y f32. */
    int (*gated_add)(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *mod);
    /* out = SiLU(gate) * up, element-wise over rows x cols (out may alias gate). */
    int (*swiglu)(h3_backend *be, const h3_bt *gate, const h3_bt *up, const h3_bt *out);
    /* dst[idx[i]] = src[i] for i < src->rows (f32 rows of equal width). */
    int (*scatter_rows)(h3_backend *be, const h3_bt *src, const int64_t *idx, const h3_bt *dst);
    /* The flow-matching Euler step of MiniMaxH3Scheduler on n f32 values in place:
       x <- r*x + (1-r)*(x + (1-t)*v), r = sigma_next / sigma, computed as schedule.c does. */
    int (*euler)(h3_backend *be, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next);
    /* out[i] = libh3's standard normal noise, element offset + i of stream (seed, stream), bit
       identical to h3_noise on the host. */
    int (*noise)(h3_backend *be, uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);
} h3_backend_ops;

struct h3_backend {
    const h3_backend_ops *ops;
    h3_dtype act_dtype; /* dtype of GEMM inputs and attention operands on this backend */
    char desc[160];     /* e.g. "cpu (avx2, 8 threads)", "cuda (NVIDIA H200, sm_90, 139.8 GiB)" */
};

/* Host services handed to a backend built as its own shared library (it cannot see libh3's
   hidden symbols): error recording and the host noise generator for its conformance checks. */
typedef struct h3_backend_host {
    uint32_t struct_size;
    int (*err)(int code, const char *fmt, ...);
    void (*noise)(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);
} h3_backend_host;

/* Entry point every loadable backend library exports (symbol name H3_BACKEND_ENTRY). */
typedef int (*h3_backend_create_fn)(const h3_backend_host *host, int device_ordinal, h3_backend **out);
#define H3_BACKEND_ENTRY "h3_backend_cuda_create"
#define H3_BACKEND_CUDA_LIB_ELF "libh3_cuda.so"

/* ---- host side (backend.c) ---- */

struct h3_pool;
/* The CPU backend over a worker pool (the pool stays owned by the caller). */
H3_INTERNAL int h3_backend_cpu_create(struct h3_pool *pool, h3_backend **out);
/* Load and create the CUDA backend (libh3_cuda next to libh3). Errors: not built, no driver, no
   GPU, compute capability below 8.0. */
H3_INTERNAL int h3_backend_cuda_open(int device_ordinal, h3_backend **out);
/* Whether the CUDA backend library is present next to libh3 (does not touch the GPU). */
H3_INTERNAL bool h3_backend_cuda_built(void);
H3_INTERNAL void h3_backend_destroy(h3_backend *be);

/* Allocate and upload a host array in one go (NULL + error on failure). */
H3_INTERNAL void *h3_backend_dup(h3_backend *be, const void *host, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* H3_BACKEND_H */
