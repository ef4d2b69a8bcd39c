/*
 * Shared internals of the CUDA backend (libh3_cuda): the backend object, error reporting through
 * the host callbacks, and the launchers each .cpp file provides to the ops table in
 * cuda_backend.cpp. Host code only, built by the ordinary C++ compiler: the GPU is reached through
 * the driver API (cuda_driver.h), the kernels (kernels/) are compiled at run time by NVRTC
 * (cuda_kernels.h).
 *
 * The library is built apart from libh3 and loaded with dlopen, so it cannot call libh3's hidden
 * helpers (h3_err, h3_noise): errors and host noise go through the h3_backend_host callbacks the
 * loader hands to h3_backend_cuda_create.
 */
#ifndef H3_CUDA_COMMON_H
#define H3_CUDA_COMMON_H

#include "backend/backend.h"

#include "backend/cuda/cuda_sdpa.h"
#include "backend/cuda/cuda_driver.h"

#include <stddef.h>
#include <stdint.h>

struct h3_wpack_layout; /* core/wpack.h */

namespace h3cuda {

struct LtCache;   /* cuda_lt_plans.cpp */
struct DecState;  /* cuda_decoders.cpp */
struct WsPark;    /* cuda_wstream.cpp */
struct ModState;  /* cuda_kernels.cpp: a compiled kernel module and its functions */

/* A bf16 value as the host sees it (raw bits; the kernels' bf16_t, kernels/h3k.h). */
struct bf16_t {
    uint16_t x;
};
typedef uint8_t e4m3; /* fp8 e4m3 bits, as the kernels' */
/* The modules (kernels/<name>.cpp), one per launcher file. */
enum { MOD_ATTENTION, MOD_ATTN_FP8, MOD_DECODERS, MOD_FP8, MOD_GEMM, MOD_KNOBS, MOD_LAYERNORM, MOD_ROWS, MOD_WPACK,
       MOD_COUNT };

/* Scratch buffers the ops reuse across calls (stream order makes reuse safe). */
enum { SCR_XBF16 = 0, SCR_YF32 = 1, SCR_PARTIAL = 2, SCR_XF8 = 3, SCR_XSCALE = 4, SCR_ATTN8 = 5, SCR_COUNT = 6 };

/* Pinned staging for weight loads and noise: two slots so the host fills one while the copy
   engine drains the other. */
enum { STAGE_SLOTS = 2 };

enum { ATTN_AUTO = 0, ATTN_OWN = 1, ATTN_CUDNN = 2 };

struct Backend {
    h3_backend base; /* first: the h3_backend * handed to libh3 points here */
    h3_backend_host host;
    int dev;
    CUdevice cudev;
    CUcontext ctx; /* the device's primary context (shared with cuBLASLt and cuDNN) */
    int driver_version;
    int cc_major, cc_minor, sm_count;
    size_t smem_optin; /* largest dynamic shared memory a block may opt into */
    uint64_t total_mem;
    char name[256];

    /* Which attention runs (H3_CUDA_ATTENTION, read once at create): cuDNN's fused SDPA where it
       takes the call, else the own kernel (auto); always the own kernel (own); cuDNN or an error
       (cudnn). Auto never times the two against each other: the choice, hence the bits, must not
       depend on timing noise. */
    int attn_impl;
    bool rows_scalar; /* H3_CUDA_ROWS=scalar: the element-at-a-time row kernels only */
    CUstream stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    LtCache *lt_plans; /* every cuBLASLt plan of the backend (cuda_lt_plans.cpp) */

    void *scratch[SCR_COUNT];
    size_t scratch_bytes[SCR_COUNT];

    size_t stage_bytes;
    void *stage_host[STAGE_SLOTS]; /* pinned */
    void *stage_dev[STAGE_SLOTS];  /* raw f32/f16 weight bytes before conversion */
    CUevent stage_done[STAGE_SLOTS];
    bool stage_used[STAGE_SLOTS];
    int stage_next;

    DecState *dec; /* the decoders' host staging (cuda_decoders.cpp), created on first use */

    /* Peak device memory in use (cudaMemGetInfo's total - free, sampled after each dev_alloc)
       since the last mem_peak reset: the profile's per-phase high-water mark. */
    uint64_t mem_peak;

    WsPark *ws_park; /* pinned layer buffers of a closed weight stream, reused by the next (cuda_wstream.cpp) */

    ModState *mods[MOD_COUNT]; /* compiled on first use (cuda_kernels.cpp) */
    char cache_dir[1024];      /* the kernel cache ("" : compile in memory) */
    bool cache_warned;
    int launch_rc;       /* the last failed launch's code since check_launch (cuda_kernels.cpp) */
    h3_cudnn_host cudnn; /* what the cuDNN path gets: device, context callbacks (cuda_backend.cpp) */
};

static inline Backend *B(h3_backend *be) { return reinterpret_cast<Backend *>(be); }

/* ---- errors (cuda_backend.cpp) -------------------------------------------------------------- */

/* Record a one-line message through the host and return -code. */
int fail(const Backend *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "cuda: <what>: <CUDA's description>"; H3_E_NOMEM for allocation failures. */
int fail_cuda(const Backend *b, CUresult e, const char *what);
int fail_cublas(const Backend *b, cublasStatus_t s, const char *what);
/* After launches: the first failed one's code since the last check (its message is recorded),
   or 0; clears it, as cudaGetLastError did. */
int check_launch(Backend *b, const char *kernel);
/* The same after a launch that returned rc: its code, or an earlier failure's. */
int check_launch(Backend *b, int rc);
/* Make the backend's GPU current for this thread (cheap when it already is). */
int use_device(const Backend *b);
/* Device memory with the standard out-of-memory message; NULL after recording an error. */
void *dev_alloc(const Backend *b, size_t bytes, const char *what);
/* A grow-only scratch buffer (slot SCR_*) of at least `bytes`; NULL after recording an error. */
void *scratch(Backend *b, int slot, size_t bytes);
/* Move `bytes` to the device through the pinned slots, in chunks (multiples of `align` bytes):
   fill(ctx, pinned, offset, n) writes source bytes [offset, offset + n) into a pinned slot; with
   `convert`, they land in a device staging buffer and convert(b, dst, staged, n, offset) turns
   them into the final layout, otherwise they are copied straight to dst + offset. The host
   fills one slot while the copy engine drains the other. */
typedef void (*stage_fill_fn)(void *ctx, void *pinned, size_t offset, size_t bytes);
typedef int (*stage_convert_fn)(Backend *b, void *dst, const void *staged, size_t bytes, size_t offset);
int stage_upload(Backend *b, void *dst, size_t bytes, size_t align, stage_fill_fn fill, void *ctx,
                 stage_convert_fn convert);

/* cuda_stream.cpp: weight streaming (pinned host copies, a ring of device slots, a copy stream). */
void *host_alloc(Backend *b, size_t bytes);
void host_free(Backend *b, void *p);
size_t weight_bytes(Backend *b, const h3_bw *w);
int weight_save(Backend *b, const h3_bw *w, void *dst);
int weight_view(Backend *b, const h3_bw *like, const void *dev, h3_bw *out);
int ring_open(Backend *b, int slots, size_t slot_bytes, h3_bring **out);
void ring_close(Backend *b, h3_bring *r);
int ring_fill(Backend *b, h3_bring *r, int s, const void *host, size_t bytes);
int ring_wait(Backend *b, h3_bring *r, int s, void **dev);
int ring_done(Backend *b, h3_bring *r, int s);
/* The host waits until slot s's last fill has landed (its pinned source may be refilled). */
int ring_host_wait(Backend *b, h3_bring *r, int s);
/* A packed ring: per slot a staging buffer of stage_bytes for a whole packed image (core/wpack.h),
   and one buffer of out_bytes of words that ring_wait decodes the slot's image into. */
int ring_open_packed(Backend *b, int slots, size_t out_bytes, size_t stage_bytes, h3_bring **out);
/* Queue the copy of a packed image of out_bytes of words into slot s's staging (packed ring). */
int ring_fill_packed(Backend *b, h3_bring *r, int s, const void *packed, size_t packed_bytes, size_t out_bytes);

/* cuda_wpack.cpp: the packed image at `image` (device memory, 16-byte aligned; l: its layout, whose
   sections start on 256-byte boundaries) decoded into out[0, l.n) (16-byte aligned) on stream st. */
int wpack_decode(Backend *b, CUstream st, const uint8_t *image, const struct h3_wpack_layout &l, uint16_t *out);

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Blocks for a grid-stride loop over n items, at most cap. */
static inline unsigned blocks_for(int64_t n, int threads, unsigned cap)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > (int64_t)cap ? cap : (unsigned)b;
}

/* ---- launchers (one per .cpp file) ---------------------------------------------------------- */

/* cuda_gemm.cpp */
int linear(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);

/* cuda_lt_plans.cpp: the one cache of cuBLASLt plans. Every cuBLASLt GEMM here is the TN form
   Y^T = W X^T: A = W as K x N (op T, row stride lda), B = X as K x M (op N, ldb), D = Y as N x M
   (ldd, C = D), f32 compute and scale types. A key says the rest; lt_key_init it (zero bytes, for
   the hash and the comparison), then fill every field the GEMM uses. */
struct LtKey {
    int64_t M, N, K;
    int64_t lda, ldb, ldd;              /* in elements of the matrix's type */
    int32_t a_type, b_type, d_type;     /* cudaDataType */
    uint32_t align_a, align_b, align_d; /* alignment classes in bytes (lt_align) */
    int32_t epi_bias;                   /* an f32 bias fused in the epilogue (its pointer set per call) */
    int32_t scale_outer;                /* fp8: f32 scale vectors over A's and B's outer dims (per call) */
    int32_t unused;                     /* zero: no padding bytes, so copies of a key hash and compare alike */
};
static_assert(sizeof(LtKey) == 6 * 8 + 10 * 4, "LtKey must have no padding");
/* Descriptors and the algorithm of a key. The op descriptor's per-call pointers (bias, scales) are
   set by the caller just before its matmul. */
struct LtPlan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
};
void lt_key_init(LtKey *k);
int lt_plans_init(Backend *b);
void lt_plans_destroy(Backend *b);
/* The plan of k, made on its first use and cached; NULL when cuBLASLt has no algorithm for it, or
   a matmul turned it down (lt_plan_refuse; *refused then says so). The pointer is valid until the
   next lt_plan call. */
LtPlan *lt_plan(Backend *b, const LtKey &k, bool *refused = NULL);
/* A matmul answered CUBLAS_STATUS_NOT_SUPPORTED with p: its key has no plan from now on. */
void lt_plan_refuse(Backend *b, LtPlan *p);
/* Alignment class (bytes, capped at 16) of a pointer and a row stride in bytes. */
int lt_align(const void *p, int64_t ld_bytes);
/* cuBLASLt's first heuristic algorithm for op over la x lb -> ld (C = D layout) with the fixed
   workspace and no split-K, so a shape always gets the same kernel (hence the same bits);
   alignments in bytes. False when cuBLASLt offers none. Every plan of the backend picks here. */
bool lt_pick_algo(Backend *b, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                  cublasLtMatrixLayout_t ld, uint32_t align_a, uint32_t align_b, uint32_t align_cd,
                  cublasLtMatmulAlgo_t *algo);
/* cuda_fp8.cpp: fp8 weights (per-output-channel scales) and their GEMM. */
bool fp8_weight_ok(const Backend *b, int64_t rows, int64_t cols);
/* The device buffers of an fp8 weight [rows, cols] (e4m3 values, f32 scales in priv) and its handle; the
   one allocation both ways of making one share, so quantised at load and read from a file they are the same
   form (what weight_save copies for streaming). fp8_weight_release frees them and zeroes the handle. */
int fp8_weight_alloc(Backend *b, int64_t rows, int64_t cols, h3_bw *out);
void fp8_weight_release(h3_bw *w);
/* The weight quantised from its bf16 device copy. */
int fp8_weight_from_bf16(Backend *b, const void *w_bf16, int64_t rows, int64_t cols, h3_bw *out);
int linear_fp8(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);
/* cuda_attention.cpp */
int attention(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D,
              float scale, bool causal, const h3_bt *O);

/* cuda_rows.cpp */
int norm_mod(Backend *b, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod, float eps,
             const h3_bt *y);
int qk_norm_rope(Backend *b, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs, const float *qn,
                 const float *kn, const float *cos, const float *sin, int heads, int kv_heads, int D, int half,
                 float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v);
int gated_add(Backend *b, const h3_bt *x, const h3_bt *y, const h3_bmod *mod);
int gated_add_norm(Backend *b, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                   const h3_bmod *mod, float eps, const h3_bt *out);
int swiglu(Backend *b, const h3_bt *gate, const h3_bt *up, const h3_bt *out);
int scatter_rows(Backend *b, const h3_bt *src, const int64_t *idx, const h3_bt *dst);
int euler(Backend *b, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next);
/* cuda_knobs.cpp: the speed-knob ops (step reuse, core reuse, token reduction, step cache). */
int extrapolate(Backend *b, float *out, const float *a, const float *bb, int64_t n, float r);
int sub(Backend *b, float *out, const float *a, const float *bb, int64_t n);
int pool_pairs(Backend *b, const h3_bt *src, const int64_t *pairs, const h3_bt *dst);
int unpool_pairs(Backend *b, const h3_bt *red, const h3_bt *base, const int64_t *pairs, const h3_bt *full);
int abs_diff_sum(Backend *b, const float *a, const float *bb, int64_t n, double *diff, double *ref);

/* cuda_layernorm.cpp: layernorm, and the copy / add_div the text encoder and the VAEs share. */
int layernorm(Backend *b, const h3_bt *x, const float *w, const float *bb, float eps, const h3_bt *y);
int copy_view(Backend *b, const h3_bt *src, const h3_bt *dst);
int add_div(Backend *b, const h3_bt *y, const h3_bt *x, float div);
int not_on_gpu(Backend *b, const char *op);

/* cuda_decoders.cpp: the decoders' layout and convolution ops, and attention over f32 operands. */
int channels_last(Backend *b, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail, int ny, int nx,
                  const float *scale, const float *shift, const h3_bt *y);
int unpatchify(Backend *b, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps, const int32_t *fmap,
               float *dst);
int vae_stitch(Backend *b, const h3_bstitch *s);
int snake_aa(Backend *b, const h3_bt *x, const float *a, const float *rb, const float *fup, const float *fdown,
             const h3_bphased *dst);
int conv_gemm(Backend *b, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);
int conv1_clamp(Backend *b, const h3_bt *X, const float *w, float *y);
/* attention() with f32 Q, K or V: each rounded once to bf16 in scratch, then attention() again. */
int attention_round_operands(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads,
                             int D, float scale, bool causal, const h3_bt *O);
void decoders_destroy(Backend *b);

/* cuda_attn_fp8.cpp: attention() under attn_precision FP8 (cuDNN's fp8 SDPA between e4m3 quantise
   and widen passes). */
int attention_fp8(Backend *b, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D,
                  float scale, bool causal, const h3_bt *O);

/* cuda_wstream.cpp: streamed weights (backend.h's wstream_* ops). */
int wstream_open(Backend *b, size_t bytes, int slots, void **host, void **out);
int wstream_load(Backend *b, void *ws, int slot, size_t bytes, int n, const h3_bwspec *spec, h3_bw *out);
int wstream_wait_host(Backend *b, void *ws, int slot);
int wstream_done(Backend *b, void *ws, int slot);
void wstream_close(Backend *b, void *ws);
void wstream_destroy(Backend *b); /* frees the parked pinned buffers (backend teardown) */

/* dst bf16 [rows, cols] (ld elements) <- src f32 [rows, cols] (lds elements). */
int convert_f32_bf16_2d(Backend *b, const float *src, int64_t lds, bf16_t *dst, int64_t ldd, int64_t rows,
                        int64_t cols);
/* dst <- src (+ bias[col]) over rows x cols, src f32 (contiguous, ld = cols), dst f32 or bf16. */
int bias_store(Backend *b, const float *src, const float *bias, void *dst, int dst_bf16, int64_t ldd, int64_t rows,
               int64_t cols);
/* n values of f32 or f16 to bf16, round to nearest even (weights). */
int convert_to_bf16(Backend *b, const void *src, h3_dtype dt, bf16_t *dst, int64_t n);
/* Y[M, N] = X[M, K] W^T (+ bias): a plain tiled kernel, used only where cuBLASLt has no algorithm. */
int gemm_fallback(Backend *b, const bf16_t *X, int64_t ldx, const bf16_t *W, const float *bias,
                  void *Y, int y_bf16, int64_t ldy, int64_t M, int64_t N, int64_t K);

/* ---- small helpers ------------------------------------------------------------------------- */

static inline const char *dtname(h3_dtype t)
{
    switch (t) {
    case H3_DT_F32: return "f32";
    case H3_DT_BF16: return "bf16";
    case H3_DT_F16: return "f16";
    default: return "an unsupported dtype";
    }
}

static inline bool is_act(h3_dtype t) { return t == H3_DT_F32 || t == H3_DT_BF16; }

/* Checks a view's dtype is f32 or bf16 and its shape is sane (ld >= cols, no negative sizes). */
int check_view(const Backend *b, const char *op, const char *name, const h3_bt *t);

} /* namespace h3cuda */

#endif /* H3_CUDA_COMMON_H */
