/*
 * Streamed weights (backend.h's wstream_* ops): the text encoder's layers cross PCIe on a copy
 * stream while the previous layer computes on the backend's stream.
 *
 * A handle owns `slots` pinned host buffers (the stage's reader preads a layer straight into one)
 * and a ring of as many device slots (cuda_stream.cu: the transformer's weight ring, its copy
 * stream and its two events per slot). The ring orders everything:
 *
 *   a load is ring_fill + ring_wait: the copy into slot s waits for the ops that last read it
 *              (ring_done, here wstream_done), and the ops issued after the load wait for the copy,
 *              so the layer never reads a half-copied slot and a copy overlaps the previous layer's
 *              compute but never overwrites weights still in use;
 *   wstream_wait_host is ring_host_wait: the host waits for slot s's copy before the reader refills
 *              host buffer s (the copy engine reads pinned memory asynchronously).
 *
 * With two slots, layer l uses slot l % 2: copy(l + 1) runs while layer l computes, and the reader
 * fills host buffer (l + 2) % 2 once copy(l) is over. Per-layer time approaches the largest of the
 * read, the copy and the compute.
 *
 * Weights stored in bf16 (the released text encoder) are used in place in the device slot: the
 * GEMMs read the bytes that crossed PCIe. f32/f16 ones are rounded to bf16 on the device by the
 * kernel weight_load uses (the same bits), into one conversion area: the conversion runs on the
 * compute stream, after the previous layer's ops in stream order, so one area serves every slot.
 */
#include "backend/cuda/cuda_kernels.h"

#include <stdlib.h>
#include <string.h>

namespace h3cuda {

enum { WS_MAX_SLOTS = 2 };

struct WStream {
    int slots;
    size_t bytes;
    size_t host_bytes;           /* size of each pinned buffer (a reused one may be larger than bytes) */
    void *host[WS_MAX_SLOTS];    /* pinned */
    h3_bring *ring;              /* device slots (raw layer bytes as stored), copy stream, events */
    void *conv;                  /* bf16 copies of the f32/f16 weights of the current layer */
    size_t conv_bytes;
};

/*
 * Pinning ~1 GB of host memory (cudaHostAlloc) costs a few hundred ms, as much as several layers'
 * copies, so a closed stream parks its host buffers in the backend and the next stream of the same
 * or a smaller size takes them (the text encoder opens one per encode). Device slots are freed at
 * close: cudaMalloc is cheap, and the transformer may need that memory between encodes. The parked
 * buffers (2 x the largest layer: ~1.9 GB for the release) stay until the backend is destroyed.
 */
struct WsPark {
    void *host[WS_MAX_SLOTS];
    size_t bytes;
};

void wstream_destroy(Backend *b)
{
    if (!b->ws_park) return;
    for (int s = 0; s < WS_MAX_SLOTS; s++)
        if (b->ws_park->host[s]) cuMemFreeHost(b->ws_park->host[s]);
    free(b->ws_park);
    b->ws_park = NULL;
}

/* The parked buffers when they fit (slots of at least `bytes`), else none; whatever is left
   parked (a stale size, a spare buffer) is freed, so at most one set of buffers is ever pinned. */
static bool take_parked(Backend *b, int slots, size_t bytes, void **host, size_t *host_bytes)
{
    WsPark *p = b->ws_park;
    if (!p) return false;
    const bool fits = p->bytes >= bytes && p->host[0] && (slots == 1 || p->host[1]);
    if (fits) {
        for (int s = 0; s < slots; s++) {
            host[s] = p->host[s];
            p->host[s] = NULL;
        }
        *host_bytes = p->bytes;
    }
    for (int s = 0; s < WS_MAX_SLOTS; s++)
        if (p->host[s]) {
            cuMemFreeHost(p->host[s]);
            p->host[s] = NULL;
        }
    return fits;
}

/* A closing stream's pinned buffers: parked when the park is empty, else freed. */
static void park_or_free(Backend *b, WStream *w)
{
    if (!b->ws_park) b->ws_park = (WsPark *)calloc(1, sizeof(WsPark));
    WsPark *p = b->ws_park;
    const bool park = p && !p->host[0] && !p->host[1];
    for (int s = 0; s < WS_MAX_SLOTS; s++) {
        if (!w->host[s]) continue;
        if (park)
            p->host[s] = w->host[s];
        else
            cuMemFreeHost(w->host[s]);
        w->host[s] = NULL;
    }
    if (park) p->bytes = w->host_bytes;
}

static void ws_free(Backend *b, WStream *w)
{
    if (!w) return;
    if (b->stream) cuStreamSynchronize(b->stream); /* ops may still read a slot or the conversion area */
    ring_close(b, w->ring);                          /* waits for its copies: the host buffers are free */
    park_or_free(b, w);
    if (w->conv) cu_free(w->conv);
    free(w);
}

int wstream_open(Backend *b, size_t bytes, int slots, void **host, void **out)
{
    *out = NULL;
    if (slots < 1 || slots > WS_MAX_SLOTS || !bytes || !host)
        return fail(b, H3_E_INVALID, "cuda: weight stream of %d slots of %zu bytes (1 or 2 slots)", slots, bytes);
    WStream *w = (WStream *)calloc(1, sizeof(WStream));
    if (!w) return fail(b, H3_E_NOMEM, "cuda: out of host memory opening a weight stream");
    w->slots = slots;
    w->bytes = bytes;
    int rc = ring_open(b, slots, bytes, &w->ring);
    if (rc) {
        ws_free(b, w);
        return rc;
    }
    CUresult e;
    for (int s = 0; s < slots; s++) {
        if (s == 0 && !take_parked(b, slots, bytes, w->host, &w->host_bytes)) w->host_bytes = bytes;
        if (!w->host[s] && (e = cu_host_alloc((void **)&w->host[s], bytes)) != CUDA_SUCCESS) {
            w->host[s] = NULL;
            ws_free(b, w);
            char what[96];
            snprintf(what, sizeof what, "allocating %d pinned layer buffers of %.1f MiB", slots,
                     (double)bytes / (1024.0 * 1024.0));
            return fail_cuda(b, e, what);
        }
        host[s] = w->host[s];
    }
    *out = w;
    return 0;
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

int wstream_load(Backend *b, void *handle, int slot, size_t bytes, int n, const h3_bwspec *spec, h3_bw *out)
{
    WStream *w = (WStream *)handle;
    if (!w || slot < 0 || slot >= w->slots || bytes > w->bytes || n < 0 || (n && (!spec || !out)))
        return fail(b, H3_E_INVALID, "cuda: weight stream load of %zu bytes into slot %d", bytes, slot);
    /* Every view must lie inside the bytes copied; the conversion area is sized from the specs. */
    size_t conv = 0;
    for (int i = 0; i < n; i++) {
        const h3_bwspec *p = &spec[i];
        const h3_dtype dt = p->dtype;
        if (dt != H3_DT_F32 && dt != H3_DT_BF16 && dt != H3_DT_F16)
            return fail(b, H3_E_SCHEMA, "cuda: weights must be F32, BF16 or F16, got %s", dtname(dt));
        const size_t es = dt == H3_DT_F32 ? 4 : 2;
        const size_t len = (size_t)p->rows * (size_t)p->cols * es;
        if (p->rows < 0 || p->cols < 0 || p->offset > bytes || len > bytes - p->offset || p->offset % 16)
            return fail(b, H3_E_INVALID, "cuda: streamed weight %d (%lld x %lld at byte %zu) outside the %zu-byte "
                        "layer or misaligned", i, (long long)p->rows, (long long)p->cols, p->offset, bytes);
        if (dt != H3_DT_BF16) conv += align256((size_t)p->rows * (size_t)p->cols * 2);
    }
    int rc = use_device(b);
    if (rc) return rc;
    if (conv > w->conv_bytes) {
        /* Ops already queued may read the old area (the previous layer's views). */
        CUresult e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "waiting for queued work");
        if (w->conv) cu_free(w->conv);
        w->conv = NULL;
        w->conv_bytes = 0;
        if (!(w->conv = dev_alloc(b, conv, "streamed weights rounded to bf16"))) return -H3_E_NOMEM;
        w->conv_bytes = conv;
    }
    void *dev = NULL;
    if ((rc = ring_fill(b, w->ring, slot, w->host[slot], bytes)) || (rc = ring_wait(b, w->ring, slot, &dev)))
        return rc;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const h3_bwspec *p = &spec[i];
        const char *src = (const char *)dev + p->offset;
        memset(&out[i], 0, sizeof out[i]);
        out[i].dtype = H3_DT_BF16;
        out[i].rows = p->rows;
        out[i].cols = p->cols;
        if (p->dtype == H3_DT_BF16) {
            out[i].data = src;
            continue;
        }
        bf16_t *dst = (bf16_t *)((char *)w->conv + at);
        at += align256((size_t)p->rows * (size_t)p->cols * 2);
        if ((rc = convert_to_bf16(b, src, p->dtype, dst, p->rows * p->cols))) return rc;
        out[i].data = dst;
    }
    return 0;
}

int wstream_wait_host(Backend *b, void *handle, int slot)
{
    WStream *w = (WStream *)handle;
    if (!w || slot < 0 || slot >= w->slots) return fail(b, H3_E_INVALID, "cuda: weight stream slot %d", slot);
    return ring_host_wait(b, w->ring, slot);
}

int wstream_done(Backend *b, void *handle, int slot)
{
    WStream *w = (WStream *)handle;
    if (!w || slot < 0 || slot >= w->slots) return fail(b, H3_E_INVALID, "cuda: weight stream slot %d", slot);
    return ring_done(b, w->ring, slot);
}

void wstream_close(Backend *b, void *handle)
{
    if (!handle || use_device(b)) return;
    ws_free(b, (WStream *)handle);
}

} /* namespace h3cuda */
