/*
 * wpack: a lossless packing of bf16 words for the weight streaming copies (models/dit_stream.c).
 *
 * Streamed blocks cross PCIe once per forward, and at the released widths the copy takes longer
 * than the block's compute. bf16 weights carry few distinct exponents per neighbourhood, so the
 * 8-bit exponent is replaced by a 4-bit code relative to a per-chunk maximum: about 12 bits per
 * value instead of 16, decoded on the GPU into the ring slot (backend/cuda/cuda_wpack.cu). The map
 * is a bijection on 16-bit words (integer fields only, no float arithmetic), so the GEMMs read the
 * very bytes the resident path holds.
 *
 * Per value v (a uint16): sm = (v >> 15) << 7 | (v & 0x7F) (sign and mantissa), e = (v >> 7) & 0xFF.
 * Per chunk of `chunk` values (the last may be short), E0 = the largest e in the chunk; the code is
 * c = E0 - e when c <= 14, else 15 (escape), and e itself is appended to the chunk's escape list.
 *
 * Layout (little-endian; every section starts on a 256-byte boundary so a GPU reads aligned
 * 16-byte vectors, and the padding is zeros so the same input always gives the same bytes):
 *   header   256 bytes: u32 magic, u32 version, u64 n, u32 chunk, u32 0, u64 chunks, u64 escapes,
 *            u64 total bytes, then zeros
 *   e0       chunks bytes: each chunk's E0
 *   escoff   (chunks + 1) u32: exclusive prefix of the chunks' escape counts, then the total
 *   sm       n bytes
 *   nib      ceil(n / 2) bytes: the codes, value 2i in the low nibble of byte i, 2i + 1 in the high
 *   esc      escapes bytes: the escaped exponents, chunk by chunk, in value order
 *
 * This header is shared with the CUDA backend (C++), which uses the layout helpers only.
 */
#ifndef H3_WPACK_H
#define H3_WPACK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define H3_WPACK_MAGIC 0x50573348u /* "H3WP" */
#define H3_WPACK_VERSION 1u
/* The chunk the streaming packer uses and the GPU decoder requires: 256 threads x 16 values. */
#define H3_WPACK_CHUNK 4096u
#define H3_WPACK_HEADER 256u
static inline uint64_t h3_wpack_r256(uint64_t n) { return (n + 255u) / 256u * 256u; }

/* Little-endian fields of an image, read through memcpy (no alignment assumed): the host decoder's
   and the CUDA ring's header checks read them the same way. */
static inline uint32_t h3_wpack_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t h3_wpack_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Byte offsets of a packed image's sections (from its value count, chunk and escape count). */
typedef struct h3_wpack_layout {
    uint64_t n, chunk, chunks, escapes;
    uint64_t e0, escoff, sm, nib, esc, total;
} h3_wpack_layout;

static inline h3_wpack_layout h3_wpack_layout_of(uint64_t n, uint64_t chunk, uint64_t escapes)
{
    h3_wpack_layout l;
    l.n = n;
    l.chunk = chunk;
    l.chunks = chunk ? (n + chunk - 1) / chunk : 0;
    l.escapes = escapes;
    l.e0 = H3_WPACK_HEADER;
    l.escoff = l.e0 + h3_wpack_r256(l.chunks);
    l.sm = l.escoff + h3_wpack_r256(4u * (l.chunks + 1u));
    l.nib = l.sm + h3_wpack_r256(n);
    l.esc = l.nib + h3_wpack_r256((n + 1u) / 2u);
    l.total = l.esc + h3_wpack_r256(escapes);
    return l;
}

/* The largest packed image weight streaming takes for an image of `bytes` bytes of words: 85 % of
   them (a block that packs larger is copied plain: the copy would save too little), a multiple of
   256. The GPU ring's per-slot staging is this size (dit_stream_plan budgets it). */
static inline uint64_t h3_wpack_stream_max(uint64_t bytes) { return bytes * 17u / 20u / 256u * 256u; }

#ifndef __cplusplus
#include "core/internal.h"

/* Runs fn(arg, begin, end, thread) over [0, n) (on a pool: h3_parallel_for's contract); NULL: the
   caller's thread runs it all. The bytes written do not depend on how the range is split. */
typedef void (*h3_wpack_task)(void *arg, int64_t begin, int64_t end, int thread);
typedef void (*h3_wpack_runner)(void *ctx, int64_t n, h3_wpack_task fn, void *arg);

/* The first pass over src[0, n) in chunks of `chunk` values (an even number in [2, 1 << 20]): each
   chunk's E0 and escape count, hence the image's layout (layout.total: its exact size). The plan
   refers to src, which must stay until h3_wpack_write; free it with h3_wpack_plan_free. */
typedef struct h3_wpack_plan {
    const uint16_t *src;
    uint64_t n;
    uint32_t chunk;
    h3_wpack_layout layout;
    uint8_t *e0;     /* [chunks] */
    uint32_t *count; /* [chunks]: escapes of each chunk */
} h3_wpack_plan;
H3_INTERNAL int h3_wpack_scan(const uint16_t *src, uint64_t n, uint32_t chunk, h3_wpack_runner run, void *run_ctx,
                              h3_wpack_plan *out);
/* The second pass: the packed image of the scanned words into dst (dst_bytes >= layout.total). */
H3_INTERNAL int h3_wpack_write(const h3_wpack_plan *p, void *dst, uint64_t dst_bytes, h3_wpack_runner run,
                               void *run_ctx);
H3_INTERNAL void h3_wpack_plan_free(h3_wpack_plan *p);
/* Exact packed size of src[0, n) (a scan), or 0 for a bad chunk. */
H3_INTERNAL uint64_t h3_wpack_size(const uint16_t *src, uint64_t n, uint32_t chunk, h3_wpack_runner run,
                                   void *run_ctx);
/* Pack src[0, n) into dst (dst_bytes: at least h3_wpack_size of the same input): a scan and a
   write. 0 or -H3_E_*. */
H3_INTERNAL int h3_wpack_encode(const uint16_t *src, uint64_t n, uint32_t chunk, void *dst, uint64_t dst_bytes,
                                h3_wpack_runner run, void *run_ctx);
/* Unpack a packed image of `bytes` into out[0, n): every field is checked (header, tables, codes,
   canonical form), so a corrupt or truncated image is an error (h3_err), never a wild access. */
H3_INTERNAL int h3_wpack_decode(const void *packed, uint64_t bytes, uint16_t *out, uint64_t n);
/* The header of a packed image, checked against its size: 0 and *l, or -H3_E_*. */
H3_INTERNAL int h3_wpack_header(const void *packed, uint64_t bytes, h3_wpack_layout *l);
#endif

#endif
