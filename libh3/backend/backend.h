/*
 * The backend seam: where model logic (models/) meets the kernels of one kind of hardware.
 *
 * A stage is written once against these tables of operations; each backend (backend/cpu/ today,
 * backend/cuda/ built as a separate shared library and loaded at run time, a Metal folder later)
 * supplies them. The style is ggml's plain-C vtable with an opaque context, without a graph
 * compiler: our stages are a fixed sequence of large ops, and an eager table is enough to keep a
 * GPU busy when each op is big and the row kernels are fused.
 *
 * The tables. A backend is `struct h3_backend` below: what it is (name, ABI, capabilities, whether
 * its memory is host memory) and four tables of functions, split by what a caller needs:
 *   mem      memory and the stream: every backend fills it;
 *   weights  weight handles, and the streaming machinery (rings, layer streams) a GPU needs;
 *   ops      the compute ops every stage shares (GEMMs, attention, norms, element-wise steps);
 *   dec      the VAEs' (decoders' and encoders') own ops: optional, NULL for a backend that runs
 *            the diffusion transformer only (a stage that needs it is refused with the op named).
 * Why split: a new backend (Metal, a second GPU vendor) starts with mem + weights + ops and the
 * transformer runs; the decoder ops and the GPU streaming features come later, one capability at
 * a time, without stub functions. Optional entries are NULL; callers ask h3_backend_has (a
 * capability bit, for a group of functions that go together) or h3_backend_supports (one op),
 * never test a pointer themselves. h3_backend_check refuses, at creation, a backend whose tables
 * lack a required entry or a function its capability bits promise.
 *
 * The ABI. libh3_cuda is built separately and loaded at run time; H3_BACKEND_ABI names the layout
 * of everything in this header that crosses that boundary (these tables, struct h3_backend,
 * h3_backend_host, the op argument structs). The library exports it (H3_BACKEND_ABI_ENTRY) and
 * backend.c refuses a library whose number differs before calling anything else in it. Bump it
 * with any change to those structs or to an op's meaning.
 *
 * Memory. Every pointer an op takes lives on the backend that runs it: host memory on the CPU
 * (is_host), device memory on a GPU. `alloc`/`upload`/`download` move data across; uploads and ops run in
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
typedef struct h3_bring h3_bring; /* a GPU's ring of weight slots (ring_open); opaque */

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

/* The alias-free activation of BigVGAN (`snake_aa`) always resamples by 2 with 12-tap filters
   (diffusers' MiniMaxH3AudioActivation1d; the audio decoder checks the stored filters' shape). */
#define H3_AA_RATIO 2
#define H3_AA_TAPS 12

/* Where output row m of `snake_aa` goes: a phased, zero-margined buffer, the input of a dilated
   convolution run as one `conv_gemm` per phase. Phase r = m % d holds rows r, r + d, ...
   contiguously from row r * phase_rows + margin of p; the op writes zeros to every other row of
   the d * phase_rows rows. d = 1: a plain buffer with `margin` zero rows before the data and zero
   rows after it. Rows are as wide as the activation has channels. */
typedef struct h3_bphased {
    float *p;
    int d;
    int64_t phase_rows, margin;
} h3_bphased;

/* One decoded tile of the video decoder and where it lands (`vae_stitch`). The tile, the strips
   and the carried frames are backend memory; rgb and pixels are the caller's host buffers. */
typedef struct h3_bstitch {
    const float *tile;       /* [K][C][th][tw]: the window's K = keep0 + keep1 kept frames */
    float *above;            /* bottom strips kept for the tiles below: [slot][K][C][max_ovy][tw] */
    float *left;             /* right strips kept for the tiles to the right: [slot][K][C][th][max_ovx] */
    float *carry;            /* the previous window's keep1 overlap frames, whole canvas: [keep1][C][H][W] */
    int C, K, keep0, keep1;  /* channels; frames of the window: keep0 its own, keep1 shared with the next */
    int blend_t;             /* leading frames cross-faded with the previous window's carry */
    int th, tw, max_ovy, max_ovx;
    int H, W, frames;        /* canvas and output frame count (frames past it are dropped) */
    int window, windows;     /* this window, and how many */
    int y0, x0;              /* the tile's origin on the canvas */
    int own_h, own_w;        /* rows and columns it owns (the rest is the next tiles' overlap) */
    int ov_top, ov_left;     /* overlap with the tile above / to the left, blended in (0: none) */
    int ov_bottom, ov_right; /* overlap with the tile below / to the right, saved as strips (0: none) */
    int slot_above, slot_left; /* strip slots read (the neighbour's), then overwritten (this tile's) */
    bool raw;                /* pixels [C][frames][H][W] as decoded; else [frames][H][W][C] in [0, 1] */
    uint8_t *rgb;            /* [frames][H][W][C] or NULL: the processor's round(clamp(x * std + mean) * 255) */
    float *pixels;           /* or NULL */
    const float *pix_mean, *pix_std; /* [C], host: de-normalisation of rgb and non-raw pixels */
} h3_bstitch;

/* Geometry of one `conv3d`: input [T][H][W][cin], kernel kt x kh x kw, strides, causal zero
   frames before the input and reflect padding of its rows and columns (the video VAE encoder's
   MiniMaxH3VideoCausalConv3d, and the downsampler's extra bottom/right pad folded in). */
typedef struct h3_bconv3d {
    int T, H, W, cin, cout;
    int kt, kh, kw;
    int st, sh, sw;
    int pad_t;                                   /* zero frames before frame 0 */
    int pad_top, pad_bottom, pad_left, pad_right; /* reflect */
} h3_bconv3d;

/* Output frames, rows and columns of a `conv3d` (0 when the kernel does not fit). */
static inline int h3_bconv3d_len(int n, int pad, int k, int s)
{
    return n + pad < k || s < 1 ? 0 : (n + pad - k) / s + 1;
}
static inline void h3_bconv3d_out(const h3_bconv3d *g, int *To, int *Ho, int *Wo)
{
    *To = h3_bconv3d_len(g->T, g->pad_t, g->kt, g->st);
    *Ho = h3_bconv3d_len(g->H, g->pad_top + g->pad_bottom, g->kh, g->sh);
    *Wo = h3_bconv3d_len(g->W, g->pad_left + g->pad_right, g->kw, g->sw);
}

/* One GEMM weight inside a streamed layer (wstream_load). */
typedef struct h3_bwspec {
    size_t offset; /* byte offset in the layer buffer */
    h3_dtype dtype;
    int64_t rows, cols;
} h3_bwspec;

/* The layout of the tables and structs below, as libh3_cuda must have been built with (see the top). */
#define H3_BACKEND_ABI 3u

/* Memory and the stream. */
typedef struct h3_backend_mem {
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
    /* dst = src, `bytes` bytes of this backend's memory (alloc'd, or what a weight views), queued in
       order with the ops: a copy of weights an op still has to read, or of a buffer the next op
       overwrites, sees the bytes in between. Ranges must not overlap. */
    int (*dcopy)(h3_backend *be, void *dst, const void *src, size_t bytes);

    /* ---- optional (H3_CAP_PINNED): page-locked host memory for the weight streaming below ---- */
    /* Page-locked host memory (the copy engine reads it while kernels run); NULL + error. */
    void *(*host_alloc)(h3_backend *be, size_t bytes);
    void (*host_free)(h3_backend *be, void *p); /* NULL is ignored */
    /* ---- optional (H3_CAP_MEM_PEAK) ---- */
    /* Peak device memory in use (bytes) since the last reset (reset: start a new interval at the
       current use). The CUDA backend samples cudaMemGetInfo's total - free after each of its own
       allocations, so the figure includes the CUDA context, library workspaces and any other
       process on the GPU. NULL on the CPU (the profile reads the process's peak RSS there). */
    int (*mem_peak)(h3_backend *be, bool reset, uint64_t *peak);
} h3_backend_mem;

/* Weights: handles, and the streaming of weights that do not stay on the device. */
typedef struct h3_backend_weights {
    /* Make the host matrix (stored dtype F32/BF16/F16, rows x cols, row-major, typically an mmap
       of the shard) usable by `linear`. The host data must stay valid while the handle lives on
       the CPU; a GPU copies it and keeps no reference. */
    int (*weight_load)(h3_backend *be, const void *host, h3_dtype dt, int64_t rows, int64_t cols, h3_bw *out);
    void (*weight_free)(h3_backend *be, h3_bw *w);

    /* ---- optional (H3_CAP_FP8_WEIGHTS) ---- */
    /* A pre-quantised fp8 weight (models/dit_fp8file.h): q [rows * cols] e4m3 bytes and scale
       [rows] f32, host memory, as weight_load under H3_PRECISION_FP8 makes them from the weight they
       were quantised from (one scale per output channel); the handle is that weight's, to the byte
       (weight_bytes / weight_save / weight_view and the GEMMs cannot tell them apart). The host
       data may go once the call returns. NULL where fp8 GEMMs do not exist (the CPU). */
    int (*weight_load_fp8)(h3_backend *be, const uint8_t *q, const float *scale, int64_t rows, int64_t cols,
                           h3_bw *out);

    /* ---- weight streaming (models/dit.c under a memory budget, h3_options.vram_bytes): a GPU
       keeps the weights that do not fit as pinned host copies of their device form and moves
       them into a ring of device slots on a copy stream of its own, while the previous slot's
       weights compute. Optional (H3_CAP_RINGS, which needs H3_CAP_PINNED): absent on the CPU,
       which streams from the page cache instead (runtime/streamer.h). ---- */
    /* Bytes of a loaded weight's device form (its values, and an fp8 weight's scales), each part
       rounded up to 256 bytes (the padding saved as zeros): what weight_save writes and
       weight_view reads. */
    size_t (*weight_bytes)(h3_backend *be, const h3_bw *w);
    /* Copy a loaded weight's device form to host memory dst (weight_bytes of it); returns when
       the copy is done. */
    int (*weight_save)(h3_backend *be, const h3_bw *w, void *dst);
    /* A handle over a device form that weight_save wrote, now at dev (256-byte aligned device
       memory); `like` is the weight it was saved from. Nothing is copied or owned: the handle is
       never passed to weight_free, and the GEMMs see the bytes, alignment and plans of `like`. */
    int (*weight_view)(h3_backend *be, const h3_bw *like, const void *dev, h3_bw *out);
    /* A ring of `slots` device slots of slot_bytes each (256-byte aligned) with its own copy
       stream. The message of a failure says what was needed and what is free. */
    int (*ring_open)(h3_backend *be, int slots, size_t slot_bytes, struct h3_bring **out);
    void (*ring_close)(h3_backend *be, struct h3_bring *r); /* waits for its copies first */
    /* Queue the copy of `bytes` of pinned host memory into slot s on the copy stream, ordered
       after the ops that last read the slot (ring_done); returns at once. */
    int (*ring_fill)(h3_backend *be, struct h3_bring *r, int s, const void *host, size_t bytes);
    /* Slot s's device address; ops issued from now on run after its last fill has landed. */
    int (*ring_wait)(h3_backend *be, struct h3_bring *r, int s, void **dev);
    /* The ops issued so far are the last to read slot s before its next fill. */
    int (*ring_done)(h3_backend *be, struct h3_bring *r, int s);
    /* ---- optional (H3_CAP_PACKED_RING, with H3_CAP_RINGS) ---- */
    /* A packed ring: `slots` staging buffers of stage_bytes, each for a whole packed image
       (core/wpack.h, chunks of H3_WPACK_CHUNK), and ONE buffer of out_bytes of words. ring_fill_packed
       queues the copy of an image of out_bytes of bf16 words (packed_bytes <= stage_bytes of pinned
       host memory: ~3/4 of the words' bytes) into slot s's staging on the copy stream, as ring_fill
       does; ring_wait then decodes the slot's image into the one buffer on the compute stream
       (after the ops issued before it: the previous block's) and returns it: exactly the words
       that were packed. ring_fill is refused on a packed ring and ring_fill_packed on a plain one.
       NULL where rings do not exist (the CPU). */
    int (*ring_open_packed)(h3_backend *be, int slots, size_t out_bytes, size_t stage_bytes, struct h3_bring **out);
    int (*ring_fill_packed)(h3_backend *be, struct h3_bring *r, int s, const void *packed, size_t packed_bytes,
                            size_t out_bytes);

    /* ---- streamed weights: a stage that reads its weights a layer at a time (the text encoder)
       hands each layer's bytes to the device while the previous layer computes. Optional (H3_CAP_WSTREAM); a backend
       that computes on host memory (the CPU takes views of the read buffer with weight_load). The
       handle owns `slots` pinned host buffers (for the stage's reader to fill), as many device
       slots of the same size and a copy stream. ---- */
    /* Open: host[0..slots) receive the host buffers (`bytes` each), *ws the handle. */
    int (*wstream_open)(h3_backend *be, size_t bytes, int slots, void **host, void **ws);
    /* Copy host[slot][0, bytes) to device slot `slot` on the copy stream, once the ops that read
       the slot last (wstream_done) are over. The n GEMM weights it holds (spec[i]: byte offset,
       stored dtype, rows, cols) become w[i] as weight_load at the default precision makes them
       (the same bits; stored bf16 is used in place, f32/f16 are rounded on the device); w[i] is
       valid until the next load into the slot and must not be handed to weight_free. Ops issued
       after this call wait for the copy; the call itself returns at once. */
    int (*wstream_load)(h3_backend *be, void *ws, int slot, size_t bytes, int n, const h3_bwspec *spec,
                        h3_bw *w);
    /* Wait until host[slot] may be refilled (the copy that last read it is over). */
    int (*wstream_wait_host)(h3_backend *be, void *ws, int slot);
    /* The ops issued so far are the last to read device slot `slot` before its next load. */
    int (*wstream_done)(h3_backend *be, void *ws, int slot);
    /* Wait for everything and free the handle (NULL is ignored). */
    void (*wstream_close)(h3_backend *be, void *ws);

} h3_backend_weights;

/* The compute ops every stage shares. Each is required unless marked optional (h3_backend_supports). */
typedef struct h3_backend_ops {
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
    /* Per row r: RMS-normalise each of the `heads` query heads of qin and the `kv_heads` key heads
       of kin over D values with qn / kn [D] (eps; NULL: no weight), rotate-half RoPE of their first
       2*half dims by row r of cos/sin [rows, half] (NULL: no rotation), and write them head-major
       to q [rows, heads*D] and k [rows, kv_heads*D] (head h at columns [h*D, (h+1)*D)); vin's
       kv_heads heads, when vin is not NULL, are copied to v [rows, kv_heads*D] the same way.
       Head h of an input row starts h * hs elements into it: hs = 3*D for the transformer's
       per-head interleaved [q | k | v] rows (qin, kin, vin then view the same rows at offsets 0,
       D and 2D), hs = D for separate projections (the text encoder, GQA; qin may be q and kin
       may be k: in place). The mean square is summed as norm_mod sums it. */
    int (*qk_norm_rope)(h3_backend *be, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs,
                        const float *qn, const float *kn, const float *cos, const float *sin, int heads,
                        int kv_heads, int D, int half, float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v);
    /* x[r] += g[r] * y[r] (g from the modulation table, or 1 when mod->tab is NULL); x, y f32. */
    int (*gated_add)(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *mod);
    /* gated_add(x, y, gate), then norm_mod(x, NULL, w, mod, eps, out) over out->rows = x->rows rows:
       the same bits as the two calls, in one pass over x where the backend fuses them (the
       transformer's residual add followed by the next norm reads the residual stream once). */
    int (*gated_add_norm)(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                          const h3_bmod *mod, float eps, const h3_bt *out);
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

    /* ---- speed knobs: the arithmetic of step reuse, core reuse, token reduction and the step
       cache (models/dit.c). All f32, element-wise or row-wise; the CPU versions are in
       backend/cpu/cpu_knobs.c. ---- */
    /* out[i] = a[i] + r * (a[i] - b[i]) over n values, rounded in that order (difference, product,
       sum; no fused multiply-add), so every backend gives the CPU's bits. b = NULL: out[i] = a[i],
       a copy inside backend memory. out may alias a or b. Step reuse extrapolates the velocity with
       it (a = v_last, b = v_prev); the caches snapshot the residual stream with it. */
    int (*extrapolate)(h3_backend *be, float *out, const float *a, const float *b, int64_t n, float r);
    /* out[i] = a[i] - b[i] over n values (out may alias a or b): core reuse's residual h_out - h_in. */
    int (*sub)(h3_backend *be, float *out, const float *a, const float *b, int64_t n);
    /* Token pooling. pairs (backend memory) holds dst->rows pairs (p0, p1) of src rows: dst row j =
       (src[p0] + src[p1]) * 0.5f (sum rounded, then halved), or a copy of src[p0] when p1 < 0.
       Rows of src->cols values; dst must not alias src. */
    int (*pool_pairs)(h3_backend *be, const h3_bt *src, const int64_t *pairs, const h3_bt *dst);
    /* Token restoring after pool_pairs, for the red->rows pairs: `full` holds the full-resolution
       snapshot taken before pooling. A pair (p1 >= 0): full[p0] += d and full[p1] += d with
       d = red[j] - base[j] (rounded first), base being the pooled rows as they entered the reduced
       blocks; a single row (p1 < 0): full[p0] = red[j], exact. full must not alias red or base. */
    int (*unpool_pairs)(h3_backend *be, const h3_bt *red, const h3_bt *base, const int64_t *pairs,
                        const h3_bt *full);
    /* *diff = sum |a[i] - b[i]| and *ref = sum |b[i]| over n values, accumulated in double in an
       order fixed for the backend (the CPU: blocks of 4096 values, each summed in index order, then
       the blocks in order), so a result never depends on the thread count. Returns with both sums
       on the host. The step cache's relative-change test. */
    int (*abs_diff_sum)(h3_backend *be, const float *a, const float *b, int64_t n, double *diff, double *ref);

    /* ---- the text encoder's and the VAEs' shared ops (models/text_encoder.c, video_vae.c,
       audio_vae.c, the encoders). ---- */
    /* y = LayerNorm(x) * w + b per row over n = x->cols: mean, then variance, each summed in double
       in index order; w, b f32 [n] (NULL: 1, 0). y may alias x. */
    int (*layernorm)(h3_backend *be, const h3_bt *x, const float *w, const float *b, float eps, const h3_bt *y);
    /* dst = src: rows x cols f32 values between two views that do not overlap. */
    int (*copy)(h3_backend *be, const h3_bt *src, const h3_bt *dst);
    /* y = (y + x) / div element-wise: the sum rounded, then a true division (diffusers divides the
       sum of the resblocks by their count; a product with 1/div rounds differently). */
    int (*add_div)(h3_backend *be, const h3_bt *y, const h3_bt *x, float div);
    /* Y[m] = bias + W x_m for m < Y->rows, x_m the W->cols floats from X->data + m * X->ld. Unlike
       `linear`, the windows may overlap (ld < cols): over a zero-margined time-major buffer
       [time, cin] with ld = cin and W's columns ordered (tap, input channel) this is a 1-D
       convolution without an im2col copy (a dilated or transposed one runs once per phase). The
       sums are `linear`'s, at every M (the CPU takes no few-rows shortcut here, so a short clip
       sums as a long one does). bias f32 [W->rows] or NULL; Y f32, not aliasing X.
       W comes from weight_load, or is an f32 matrix in backend memory ({data, H3_DT_F32, rows,
       cols, priv NULL}, row-major): what the audio decoder hands a backend whose GEMMs are not
       f32 (a GPU then sums in f32 with f32 operands, as diffusers keeps that decoder in f32 at any
       pipeline dtype; on the CPU it is the same handle weight_load makes of f32 data). */
    int (*conv_gemm)(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y);

    /* ---- optional: the vision tower's and the audio VAE encoder's element-wise ops
       (models/vision_tower.c, audio_vae_encoder.c). ---- */
    /* y = GELU(x) element-wise over rows x cols (f32; y may alias x): tanh_approx ?
       0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (transformers' gelu_pytorch_tanh) :
       0.5 x (1 + erf(x / sqrt(2))) (torch's nn.GELU()). */
    int (*gelu)(h3_backend *be, const h3_bt *x, bool tanh_approx, const h3_bt *y);
    /* Rotate-half RoPE in place, no normalisation: in row r of x, head h (columns [h*D, (h+1)*D)),
       for d < half: x[d] <- x[d] c - x[d+half] s and x[d+half] <- x[d+half] c + x[d] s with
       c = cos[r*half + d], s = sin[r*half + d], each product rounded before the sum; dims from
       2*half on are left alone. cos/sin f32 [x->rows, half]; x f32 (a strided view may pick the
       q or k columns of a fused qkv row). */
    int (*rope)(h3_backend *be, const h3_bt *x, int heads, int D, int half, const float *cos, const float *sin);
    /* y = a * b element-wise over rows x cols (y may alias a or b): GeGLU's product. */
    int (*mul)(h3_backend *be, const h3_bt *a, const h3_bt *b, const h3_bt *y);
} h3_backend_ops;

/* The VAEs' own ops: optional as a table (be->dec NULL: h3_backend_has(be, H3_CAP_DECODERS) is false)
   and entry by entry (h3_backend_supports). */
typedef struct h3_backend_decoders {
    /* ---- the decoders' (models/video_vae.c, audio_vae.c) ---- */
    /* The decoders' input: a box of channel-first latents to channel-last rows, de-normalised.
       Column c of row (t * ny + i) * nx + j of y (y->cols = C channels) is
       x[c * cs + min(t, t_avail - 1) * ts + i * rs + j] * scale[c] + shift[c], the product rounded
       before the sum, for t < nt, i < ny, j < nx: frames from t_avail on repeat the last one (the
       video decoder's padding of a short last window). x, scale and shift are host memory (the
       caller's latents, the config's statistics); y is backend memory. */
    int (*channels_last)(h3_backend *be, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail,
                         int ny, int nx, const float *scale, const float *shift, const h3_bt *y);
    /* Un-patchify: row i of src is token tok0 + i of a (t, gh, gw) token grid in that order and
       holds [C][pt][ps][ps] values. Value (c, a, by, bx) of token (t, y, x) goes to frame
       f = fmap[t * pt + a] of dst [frames][C][gh * ps][gw * ps], at row y * ps + by and column
       x * ps + bx; f < 0 drops it. fmap: int32, backend memory. */
    int (*unpatchify)(h3_backend *be, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps,
                      const int32_t *fmap, float *dst);
    /* Blend a decoded tile into the video as diffusers' `_stitch_tiles` then `_decode` do, over the
       rows and columns it owns (see h3_bstitch): the top overlap with the tile above, then the left
       overlap with the tile to the left (weights 1 - p/n and p/n, p the distance into the overlap,
       each product rounded before the sum), then the window's first blend_t frames cross-faded with
       the previous window's carry the same way. Its own frames go to the outputs, the overlap
       frames of a window that is not the last to the carry; then the tile's original bottom and
       right strips are saved for its neighbours. */
    int (*vae_stitch)(h3_backend *be, const h3_bstitch *s);
    /* BigVGAN's alias-free SnakeBeta (diffusers' MiniMaxH3AudioActivation1d) on x [L, C],
       time-major with x->ld == C: upsampling by H3_AA_RATIO with fup (a transposed convolution,
       edges replicated), v + rb[c] * sin^2(a[c] * v), low-pass downsampling by H3_AA_RATIO with
       fdown (edges replicated). Output row m goes to dst (h3_bphased; its zeros included).
       a = exp(alpha), rb = 1 / (exp(beta) + 1e-9): f32 [C]; fup, fdown: f32 [H3_AA_TAPS]. */
    int (*snake_aa)(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const float *fup,
                    const float *fdown, const h3_bphased *dst);
    /* BigVGAN's conv_post and clamp: y[m] = clamp(w . x_m, -1, 1) for m < X->rows, x_m the X->cols
       floats from X->data + m * X->ld (overlapping windows as in conv_gemm): one output channel,
       no bias; NaN passes through. w f32 [X->cols]; y f32 [X->rows]. */
    int (*conv1_clamp)(h3_backend *be, const h3_bt *X, const float *w, float *y);

    /* ---- the video VAE encoder's ops (models/video_vae_encoder.c; the CPU versions are in
       backend/cpu/cpu_conv3d.c). Activations are channel-last video: [frames][rows][cols][C]
       f32, contiguous. ---- */
    /* Causal 3-D convolution (see h3_bconv3d): y[t][i][j][o] = bias[o] + sum over the window
       (dt, dy, dx, c) of W[o][(dt, dy, dx, c)] * x~[t*st + dt][i*sh + dy][j*sw + dx][c], x~ being
       x with g->pad_t zero frames before the first one (nothing after) and its rows and columns
       reflect-padded (pad_top rows above, pad_bottom below; pad_left, pad_right columns). W is
       [cout, kt*kh*kw*cin], its columns ordered (dt, dy, dx, c): torch's [cout][cin][kt][kh][kw]
       weight permuted. Every reflect pad must be smaller than the side it pads. y has
       h3_bconv3d_out's shape and must not alias x; bias f32 [cout] or NULL. The sums are
       `conv_gemm`'s (the same at every M), so the result never depends on the thread count. */
    int (*conv3d)(h3_backend *be, const float *x, const h3_bconv3d *g, const h3_bw *W, const float *bias, float *y);
    /* GroupNorm of every frame on its own (diffusers' MiniMaxH3VideoGroupNorm), then SiLU when
       `silu`: x, y [frames][pixels][C]; for each frame and group of C/groups consecutive channels,
       mean and variance (biased) over its pixels x C/groups values, each summed in double in a
       fixed order; y = (x - mean) / sqrt(var + eps) * w[c] + b[c] evaluated in double and
       rounded once, then y * sigmoid(y) in f32 (h3_silu). w, b f32 [C]. y may alias x. */
    int (*group_norm)(h3_backend *be, const float *x, int frames, int64_t pixels, int C, int groups, const float *w,
                      const float *b, float eps, bool silu, float *y);

    /* ---- the audio VAE encoder's ops (models/audio_vae_encoder.c; the CPU versions are in
       backend/cpu/cpu_audio_enc.c). ---- */
    /* The DAC trunk's plain Snake on x [L, C] (x->ld == C): v + rb[c] * sin(a[c] * v)^2, each step
       rounded to f32 (torch's order), output row m to dst as in snake_aa (h3_bphased, its zeros
       included). a = alpha, rb = 1 / (alpha + 1e-9): f32 [C]. */
    int (*snake)(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const h3_bphased *dst);
    /* The pre_block attention's head reduction: per row, m[i] = (sum over h < heads of
       x[h * D + i]) / heads (f32 sum in head order), then y[j] = the mean of m over
       adaptive_avg_pool1d's window [floor(j D / n), ceil((j + 1) D / n)), n = y->cols (any n >= 1;
       windows overlap when n does not divide D, and repeat values when n > D). */
    int (*head_pool)(h3_backend *be, const h3_bt *x, int heads, int D, const h3_bt *y);
} h3_backend_decoders;

/* The weight shapes the fp8 path quantises (the others stay bf16): cuBLASLt's fp8 kernels want K,
   hence the row stride, in multiples of 16 bytes. The CUDA backend also needs compute capability
   8.9, which h3_init checks for the whole context. */
static inline bool h3_fp8_weight_shape_ok(int64_t rows, int64_t cols)
{
    return rows > 0 && cols > 0 && cols % 16 == 0;
}


/* Capability bits (h3_backend.caps): groups of optional functions that go together. */
enum {
    H3_CAP_PINNED = 1u << 0,      /* mem: host_alloc, host_free */
    H3_CAP_MEM_PEAK = 1u << 1,    /* mem: mem_peak */
    H3_CAP_FP8_WEIGHTS = 1u << 2, /* weights: weight_load_fp8 (fp8 GEMMs) */
    H3_CAP_RINGS = 1u << 3,       /* weights: weight_bytes/save/view, ring_open/close/fill/wait/done */
    H3_CAP_PACKED_RING = 1u << 4, /* weights: ring_open_packed, ring_fill_packed */
    H3_CAP_WSTREAM = 1u << 5,     /* weights: wstream_open/load/wait_host/done/close */
    H3_CAP_DECODERS = 1u << 6,    /* the dec table is there (its entries are still asked one by one) */
    H3_CAP_SYNCHRONOUS = 1u << 7, /* every op has finished when it returns (the CPU): per-op timings are real */
    H3_CAP_I8_WEIGHTS = 1u << 8,  /* weights: weight_load_i8 (int8 codes, optionally rotated) */
};

/* Every compute op, by table and name: H3_OP_<name> for h3_backend_supports, and the table
   backend.c walks to check a backend. R: required of every backend; O: optional. */
#define H3_BACKEND_OP_LIST(X)                                                                              \
    X(ops, linear, R) X(ops, attention, R) X(ops, norm_mod, R) X(ops, qk_norm_rope, R) X(ops, gated_add, R) \
    X(ops, gated_add_norm, O) X(ops, swiglu, R) X(ops, scatter_rows, R) X(ops, euler, R) X(ops, noise, R)   \
    X(ops, extrapolate, O) X(ops, sub, O) X(ops, pool_pairs, O) X(ops, unpool_pairs, O)                     \
    X(ops, abs_diff_sum, O) X(ops, layernorm, O) X(ops, copy, O) X(ops, add_div, O) X(ops, conv_gemm, O)    \
    X(ops, gelu, O) X(ops, rope, O) X(ops, mul, O)                                                          \
    X(dec, channels_last, O) X(dec, unpatchify, O) X(dec, vae_stitch, O) X(dec, snake_aa, O)                \
    X(dec, conv1_clamp, O) X(dec, conv3d, O) X(dec, group_norm, O) X(dec, snake, O) X(dec, head_pool, O)

typedef enum h3_op {
#define H3_OP_ENUM_(tab, name, req) H3_OP_##name,
    H3_BACKEND_OP_LIST(H3_OP_ENUM_)
#undef H3_OP_ENUM_
    H3_OP_COUNT
} h3_op;

struct h3_backend {
    const char *name;     /* "cpu", "cuda" */
    uint32_t abi_version; /* H3_BACKEND_ABI of the headers it was built with */
    uint32_t caps;        /* H3_CAP_* */
    /* Its memory is the host's (alloc'd memory can be read and written by the CPU, and weights
       can be views of mapped files instead of copies): the CPU, and later a unified-memory GPU
       (Metal maps weights rather than copying them). false on CUDA: device memory. */
    bool is_host;
    const h3_backend_mem *mem;
    const h3_backend_weights *weights;
    const h3_backend_ops *ops;
    const h3_backend_decoders *dec; /* NULL: no VAE ops */
    void (*destroy)(h3_backend *be);
    h3_dtype act_dtype; /* dtype of GEMM inputs and attention operands on this backend */
    char desc[160];     /* e.g. "cpu (avx2, 8 threads)", "cuda (NVIDIA H200, sm_90, 139.8 GiB)" */
    int compute_capability; /* GPUs: major * 10 + minor (90 for Hopper); 0 on the CPU */
    /* H3_PRECISION_* of the weights `weight_load` makes from here on (the runtime sets it once,
       after checking the backend can run it; DEFAULT keeps the exact path). */
    int weight_precision;
    /* H3_PRECISION_* of the next `attention` calls: DEFAULT (the exact path), or FP8 (cuDNN's fp8
       SDPA over per-tensor e4m3 Q, K, V; bf16 operands and output). The DiT sets it around its main
       blocks' self-attention only, when the context asked for it (H3_OPT_FP8_ATTENTION). */
    int attn_precision;
    /* Why this backend cannot run fp8 attention ("" when it can): set at creation. */
    char attn_fp8_why[200];
    /* Optional (H3_CAP_I8_WEIGHTS): a weight stored as int8 codes (a ComfyUI int8 / int8_convrot single
       file, core/singlefile.h): q [rows * cols] int8, scale [rows] f32, the weight W = ((q * scale).reshape(
       rows, cols / group, group) @ H^T).reshape(rows, cols) with H the orthonormal Hadamard matrix of order
       `group` (a power of 4; 0: no rotation, W = q * scale). `linear` over the handle computes X W^T + bias
       as (X rotated by H in groups of `group` columns) (q * scale)^T: the activations are rotated at run time,
       the codes never widened. The host data must stay valid while the handle lives (the CPU keeps views of
       the mapping); weight_free frees the handle. Here, at the end of the struct and behind its capability
       bit, rather than in the weights table: a backend built before it never sets the bit, so the field is
       never read from its shorter struct, and the tables' initialisers stay complete. */
    int (*weight_load_i8)(h3_backend *be, const int8_t *q, const float *scale, int group, int64_t rows, int64_t cols,
                          h3_bw *out);
    /* ABI 3, for h3ctl info (h3_backends_json): whether bf16 attention runs on cuDNN, and the cuDNN
       path's own line (its version and library, or why it is not used); the driver's CUDA version
       (cuDriverGetVersion, 13000 for 13.0). Zero / "" on the CPU. */
    bool attn_cudnn;
    char attn_cudnn_info[300];
    int driver_version;
};

/* Host services handed to a backend built as its own shared library (it cannot see libh3's
   hidden symbols): error recording and the host noise generator for its conformance checks. */
typedef struct h3_backend_host {
    uint32_t struct_size;
    int (*err)(int code, const char *fmt, ...);
    void (*noise)(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);
    /* The backend's knobs as the environment set them when libh3 read it (core/tuning.h; the
       backend never reads the environment itself). "" or NULL: unset. Valid during the create call
       only: the backend checks them there (its refusals name the variable) and copies what it keeps. */
    const char *cuda_attention; /* H3_CUDA_ATTENTION: auto, own or cudnn */
    const char *cuda_rows;      /* H3_CUDA_ROWS: auto or scalar */
    const char *cudnn_lib;      /* H3_CUDNN_LIB: path of libcudnn.so.9 */
    /* ABI 3: the CUDA backend loads the driver and its vendor libraries at run time and compiles
       its kernels with NVRTC (backend/cuda/cuda_loader.cpp, cuda_kernels.cpp). Paths: NULL or "":
       the loader's search. Valid during the create call only, as the knobs above. */
    const char *libcuda;      /* H3_LIBCUDA: libcuda.so.1 (tests point it at a fake driver) */
    const char *nvrtc_lib;    /* H3_NVRTC_LIB: libnvrtc.so.13 (the nvidia-cuda-nvrtc wheel's) */
    const char *cublaslt_lib; /* H3_CUBLASLT_LIB: libcublasLt.so.13 (the nvidia-cublas wheel's) */
    const char *kernel_cache; /* folder of compiled kernels (H3_KERNEL_CACHE, else the user's cache
                                 folder); "" or NULL: compile in memory only */
    /* One line of progress or a warning (the first compile of a kernel module, an unwritable
       cache); NULL: say nothing. Called during create and later ops. */
    void (*note)(const char *line);
    int warmup; /* nonzero: compile (or load) every kernel module during create */
} h3_backend_host;

/* Entry point every loadable backend library exports (symbol name H3_BACKEND_ENTRY). */
typedef int (*h3_backend_create_fn)(const h3_backend_host *host, int device_ordinal, h3_backend **out);
#define H3_BACKEND_ENTRY "h3_backend_cuda_create"
/* The library's H3_BACKEND_ABI, read before anything else is called (a library without it predates
   the versioned ABI and is refused). */
typedef uint32_t (*h3_backend_abi_fn)(void);
#define H3_BACKEND_ABI_ENTRY "h3_backend_cuda_abi"
#define H3_BACKEND_CUDA_LIB_ELF "libh3_cuda.so"
/* The Metal backend library (libh3/backend/metal/): the same protocol under its own names. */
#define H3_BACKEND_METAL_ENTRY "h3_backend_metal_create"
#define H3_BACKEND_METAL_ABI_ENTRY "h3_backend_metal_abi"
#if defined(__APPLE__)
#define H3_BACKEND_METAL_LIB "libh3_metal.dylib"
#else
#define H3_BACKEND_METAL_LIB "libh3_metal.so" /* Linux: built against the Metal test double */
#endif

/* ---- host side (backend.c) ---- */

typedef struct h3_pool h3_pool; /* the host worker pool (core/host.h) */
/* The CPU backend over a worker pool (the pool stays owned by the caller). */
H3_INTERNAL int h3_backend_cpu_create(struct h3_pool *pool, h3_backend **out);
/* Load and create the CUDA backend (libh3_cuda next to libh3, or H3_CUDA_LIB) with the knobs of
   `t` (its H3_CUDA_* strings; NULL: read now). Errors: not built, no driver, no GPU, compute capability below 8.0,
   a knob the backend refuses. */
struct h3_tuning;
H3_INTERNAL int h3_backend_cuda_open(int device_ordinal, const struct h3_tuning *t, h3_backend **out);
/* The NCCL communicator of the loaded CUDA backend library for rank t->rank of t->world_size (RANK,
   WORLD_SIZE, H3_RENDEZVOUS, H3_NCCL_LIB; docs/multi-gpu.md), on be's compute stream: the library
   exports H3_COMM_NCCL_ENTRY (backend/cuda/cuda_nccl.cpp) and H3_BACKEND_CUDA_STREAM_ENTRY. *scratch: the
   device words of its barrier, released by the caller after destroying the communicator. */
struct h3_comm;
H3_INTERNAL int h3_backend_cuda_comm(h3_backend *be, const struct h3_tuning *t, struct h3_comm **out, void **scratch);
/* The compute stream of a cuda backend (cudaStream_t as void *), exported by libh3_cuda. */
typedef void *(*h3_backend_cuda_stream_fn)(h3_backend *be);
#define H3_BACKEND_CUDA_STREAM_ENTRY "h3_backend_cuda_stream"
/* Whether the CUDA backend library is present next to libh3 (does not touch the GPU). */
H3_INTERNAL bool h3_backend_cuda_built(void);
/* Load and create the Metal backend (libh3_metal next to libh3, or H3_METAL_LIB). Errors: not
   built, no Metal device, a GPU family older than the kernels need, a shader compile failure. */
H3_INTERNAL int h3_backend_metal_open(h3_backend **out);
/* Whether the Metal backend library is present next to libh3 (does not touch the GPU). */
H3_INTERNAL bool h3_backend_metal_built(void);
H3_INTERNAL void h3_backend_destroy(h3_backend *be);

/* Allocate and upload a host array in one go (NULL + error on failure). */
H3_INTERNAL void *h3_backend_dup(h3_backend *be, const void *host, size_t bytes);

/* Whether the backend has every capability in `caps` (H3_CAP_* or'ed). */
static inline bool h3_backend_has(const h3_backend *be, uint32_t caps)
{
    return be && (be->caps & caps) == caps;
}
/* Whether the backend implements op `op` (its table is there and the entry filled). */
H3_INTERNAL bool h3_backend_supports(const h3_backend *be, h3_op op);
/* The op's name ("vae_stitch"). */
H3_INTERNAL const char *h3_op_name(h3_op op);
/* 0 when the backend implements all n ops, else H3_E_UNSUPPORTED with one line naming the first
   missing op and `who` (the stage that needs it): "the cuda backend has no conv3d op (needed by
   the video VAE encoder)". */
H3_INTERNAL int h3_backend_need(const h3_backend *be, const h3_op *ops, int n, const char *who);
/* 0 when the backend's tables are complete for its ABI and capability bits, else
   H3_E_UNSUPPORTED with one line saying what is missing. Run on every backend at creation. */
H3_INTERNAL int h3_backend_check(const h3_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* H3_BACKEND_H */
