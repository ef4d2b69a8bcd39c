/*
 * Single-file components (ComfyUI's repackages of MiniMax-H3 and files like them): one safetensors
 * file that holds a component's weights under the original MiniMax names, read as if it were the
 * official shards. The source presents the tensors under the names the loaders already use:
 *   - a `model.diffusion_model.` prefix (ComfyUI's own saver) is stripped;
 *   - the fused attention projection `attn.qkv_proj.weight`, stored [q_all; k_all; v_all], is
 *     reordered to the official per-head interleaving [h0: q k v, h1: q k v, ...];
 *   - fp8_scaled layers (F8 weight, one F32 `weight_scale`) and int8 layers (I8 weight, F32 per-row
 *     `weight_scale`, optionally ConvRot-rotated) are dequantised to BF16, the value rounded once to
 *     nearest-even from the exact product (see quant_formats.c);
 *   - the pruned ("curve form") table `adaln_t_table` is presented as `time_embedder.table`.
 *   - a transformer or video VAE saved by diffusers (its names: `transformer_blocks.N.attn.to_q`,
 *     `encoder.down_blocks`, ...) is presented under the original names (see h3_sf_open_rope and
 *     docs/single-files.md).
 * Tensors that need no transform are views of the file (mapped, as the shards are); the others are
 * written once, on the first data access, into an owned file (a memfd on Linux, an unlinked temporary
 * file elsewhere) that the mmap and pread readers use like any shard. Its size is h3_sf_owned_bytes.
 */
#ifndef H3_CORE_SINGLEFILE_H
#define H3_CORE_SINGLEFILE_H

#include "core/internal.h"

/*
 * Open `path` as component `comp` into `s` (zeroed by the call): header read and checked, the file
 * identified (a file of another model, a LoRA, an unknown or unsupported quantisation is refused with
 * one line), the presented names built. Nothing is dequantised yet. `heads`: the transformer's
 * attention heads (the QKV reorder), 0 for other components. `desc` (cap bytes) gets one line:
 * format, variant, dtypes, what is transformed.
 */
H3_INTERNAL int h3_sf_open(h3_store *s, const char *path, h3_component comp, int heads, char *desc, size_t cap);
/*
 * As h3_sf_open, for a transformer that may be under diffusers' MiniMaxH3Transformer3DModel names
 * (`transformer_blocks.N.attn.to_q`, ...; see docs/single-files.md): those are presented under the
 * original names, to_q/to_k/to_v fused into the per-head interleaved `attn.qkv_proj`, `ff.net.0.proj`
 * ([value; gate]) as `mlp.fc1` ([gate; value]), and `rope.inv_freq` (not stored by diffusers)
 * computed from `rope_freq` frequencies and `rope_theta` as diffusers computes it.
 */
H3_INTERNAL int h3_sf_open_rope(h3_store *s, const char *path, h3_component comp, int heads, int rope_freq,
                                double rope_theta, char *desc, size_t cap);
/* Bytes of the owned file (transformed tensors) a store from h3_sf_open fills in its mode (h3_sf_native); 0 for other stores. */
H3_INTERNAL uint64_t h3_sf_owned_bytes(const h3_store *s);

/*
 * The stored codes of the quantised layers, for a backend that computes on them (int8 on the CPU,
 * fp8 on a GPU with fp8 GEMMs): h3_sf_native, before any data of the store is read, says whether
 * they are used, per format (`i8`, `fp8`: the jobs that lay them out run) and which int8 layers' BF16 forms are
 * then left unwritten (those `skip_i8` says yes to, by presented name: the ones the consumer loads
 * from their codes; their owned memory is never touched; NULL: none). Without the call the store
 * widens every quantised layer, as before. Error once the store's data was read.
 */
H3_INTERNAL int h3_sf_native(h3_store *s, bool i8, bool fp8, bool (*skip_i8)(const char *name));
typedef struct h3_sf_qw {
    h3_dtype dtype;     /* H3_DT_I8, H3_DT_F8_E4M3 or H3_DT_F8_E5M2 */
    const void *q;      /* [rows, cols] codes in libh3's row order (QKV rows reordered) */
    const float *scale; /* [rows]: W[n] = q[n] * scale[n] (then the rotation, for int8 ConvRot) */
    int group;          /* int8 ConvRot group size, 0 = none (fp8: 0) */
    bool widened;       /* the BF16 form of `name` is also there (false when h3_sf_native left it out) */
} h3_sf_qw;
/* Layer `name` [rows, cols] as stored codes: 1 and *out set, 0 when the store has no codes for it
   (not a single file, not quantised, or h3_sf_native not asked), or an error. */
H3_INTERNAL int h3_sf_qweight(h3_store *s, const char *name, int64_t rows, int64_t cols, h3_sf_qw *out);
/* The same without reading data: the int8 codes and scales tensors of `name` (in the files of `s`, for a
   reader such as core/streamer) and its ConvRot group. true only for int8 codes turned on by h3_sf_native. */
H3_INTERNAL bool h3_sf_qtensor(const h3_store *s, const char *name, const h3_tensor **codes, const h3_tensor **scale,
                               int *group);
/* Of the layers whose codes are on and that `pred` accepts (by presented name; NULL: all): their presented
   (BF16) bytes and the bytes of their codes and scales: what the memory estimate swaps. */
H3_INTERNAL void h3_sf_native_bytes(const h3_store *s, bool (*pred)(const char *name), uint64_t *presented,
                                    uint64_t *codes);
/* Bytes of layer `name`'s codes and scales when its codes are on (h3_sf_native), else 0. */
H3_INTERNAL uint64_t h3_sf_codes_of(const h3_store *s, const char *name);
/* Write the BF16 forms h3_sf_native left out (a consumer that needs them after all: a LoRA merges into widened
   weights); the codes stay available. Once; then every layer is presented widened as without the call. */
H3_INTERNAL int h3_sf_widen(h3_store *s);
/* Whether h3_sf_native turned the codes on. */
H3_INTERNAL bool h3_sf_native_on(const h3_store *s);
/* Bytes of the stored codes and scales presented by h3_sf_qweight (views of the file and their reordered copies). */
H3_INTERNAL uint64_t h3_sf_codes_bytes(const h3_store *s);

/* ---- quantised formats (quant_formats.c) ------------------------------------------------------ */

/* The BF16 bits nearest (ties to even) to x, rounded once (x finite or not). */
H3_INTERNAL uint16_t h3_bf16_from_double(double x);
/* Value of an fp8 byte: e4m3 (fn: no infinities, 0x7f/0xff NaN) or e5m2 (IEEE-like). */
H3_INTERNAL double h3_fp8_value(uint8_t b, bool e5m2);
/* W[n][k] = bf16(float(q[n][k]) * scale), scale one F32 for the whole tensor. */
H3_INTERNAL void h3_deq_fp8(const uint8_t *q, bool e5m2, float scale, int64_t N, int64_t K, uint16_t *out);
/*
 * int8 with per-row scales s[N] (n_scale == N) or one (n_scale == 1). group == 0: W = q * s. group g (a
 * power of 4 dividing K): ConvRot, W = ((q * s).reshape(N, K/g, g) @ H^T).reshape(N, K) with
 * H = kron(H4, ..., H4) / sqrt(g), computed exactly (integer Hadamard sums, a power-of-two divide) and
 * rounded once to BF16.
 */
H3_INTERNAL void h3_deq_int8(const int8_t *q, const float *s, int64_t n_scale, int group, int64_t N, int64_t K,
                             uint16_t *out);

#endif
