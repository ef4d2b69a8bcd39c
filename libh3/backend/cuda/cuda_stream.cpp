/*
 * Weight streaming on the GPU (backend.h, "weight streaming"): pinned host copies of weights in
 * their device form, and a ring of device slots they are copied into on a stream of their own.
 *
 * Ordering. The backend computes on one stream (b->stream); each ring copies on its own
 * non-blocking stream. Two events per slot tie them together:
 *   ready[s]: recorded on the copy stream after the slot's fill; the compute stream waits on it
 *             (ring_wait) before the ops that read the slot are issued.
 *   freed[s]: recorded on the compute stream after the last op that reads the slot (ring_done);
 *             the copy stream waits on it before the next fill of that slot overwrites it.
 * So a fill never overwrites weights a queued GEMM still reads, and a GEMM never reads a slot
 * before its bytes have landed, while the fill of slot s + 1 runs during slot s's GEMMs. The
 * host never blocks in fill/wait/done: it only issues.
 *
 * Same bits as resident weights: weight_save copies the exact device bytes weight_load made
 * (bf16, or fp8 values + scales) and weight_view points the GEMMs at them; slots and every part
 * in them are 256-byte aligned, as cudaMalloc's buffers are, and the GEMM plans are chosen from
 * shapes, strides and the activations' alignment only (cuda_gemm.cu), never the weight pointer.
 */
#include "backend/cuda/cuda_kernels.h"
#include "core/wpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

namespace h3cuda {

enum { RING_MAX = 8 };

} /* namespace h3cuda */

struct h3_bring {
    int n;
    size_t slot_bytes;
    void *dev[h3cuda::RING_MAX];
    h3cuda::CUstream copy;
    h3cuda::CUevent ready[h3cuda::RING_MAX], freed[h3cuda::RING_MAX];
    bool was_read[h3cuda::RING_MAX]; /* freed[s] has been recorded at least once */
    /* A packed ring (ring_open_packed): dev[s] is slot s's staging for a whole packed image
       (slot_bytes each), `out` the one buffer of out_bytes that ring_wait decodes a slot into, on
       the compute stream. n / escapes: the image last filled into each slot. */
    bool packed;
    void *out;
    size_t out_bytes;
    uint64_t pk_n[h3cuda::RING_MAX], pk_escapes[h3cuda::RING_MAX];
};

namespace h3cuda {

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

void *host_alloc(Backend *b, size_t bytes)
{
    if (use_device(b)) return NULL;
    void *p = NULL;
    CUresult e = cu_host_alloc((void **)&p, bytes ? bytes : 1);
    if (e == CUDA_SUCCESS) return p;
    const long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    fail(b, H3_E_NOMEM, "cuda: cannot pin %.2f GiB of host memory for streamed weights (%.1f GiB of RAM free): %s",
         (double)bytes / gib, pages > 0 && psz > 0 ? (double)pages * (double)psz / gib : 0.0, cu_errstr(e));
    return NULL;
}

void host_free(Backend *b, void *p)
{
    if (!p || use_device(b)) return;
    (void)cuMemFreeHost(p);
}

/* Values, then (fp8) one f32 scale per row: the two parts of a weight's device form. */
static size_t values_bytes(const h3_bw *w)
{
    const size_t esz = w->dtype == H3_DT_F8_E4M3 ? 1 : 2;
    return round256((size_t)(w->rows * w->cols) * esz);
}

size_t weight_bytes(Backend *b, const h3_bw *w)
{
    (void)b;
    return values_bytes(w) + (w->priv ? round256(sizeof(float) * (size_t)w->rows) : 0);
}

int weight_save(Backend *b, const h3_bw *w, void *dst)
{
    if (w->dtype != H3_DT_BF16 && w->dtype != H3_DT_F8_E4M3)
        return fail(b, H3_E_INVALID, "cuda: weight_save of a %s weight", dtname(w->dtype));
    int rc = use_device(b);
    if (rc) return rc;
    const size_t esz = w->dtype == H3_DT_F8_E4M3 ? 1 : 2, vb = (size_t)(w->rows * w->cols) * esz;
    /* On the compute stream: the weight's upload and conversion were queued there. */
    CUresult e = cu_copy(dst, w->data, vb, b->stream);
    if (e == CUDA_SUCCESS && w->priv)
        e = cu_copy((char *)dst + values_bytes(w), w->priv, sizeof(float) * (size_t)w->rows, b->stream);
    if (e == CUDA_SUCCESS) e = cuStreamSynchronize(b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "copying a weight to host memory for streaming");
    /* The padding up to each part's 256-byte boundary is zeros, so the saved form is fully defined
       (two saves of the same weight are the same bytes, and nothing of the heap leaks into it). */
    memset((char *)dst + vb, 0, values_bytes(w) - vb);
    if (w->priv) {
        const size_t sb = sizeof(float) * (size_t)w->rows;
        memset((char *)dst + values_bytes(w) + sb, 0, round256(sb) - sb);
    }
    return 0;
}

int weight_view(Backend *b, const h3_bw *like, const void *dev, h3_bw *out)
{
    if ((uintptr_t)dev & 255) return fail(b, H3_E_INVALID, "cuda: a streamed weight at a pointer not 256-byte aligned");
    *out = *like;
    out->data = dev;
    out->priv = like->priv ? (void *)((char *)dev + values_bytes(like)) : NULL;
    return 0;
}

void ring_close(Backend *b, h3_bring *r)
{
    if (!r) return;
    (void)use_device(b);
    if (r->copy) {
        (void)cuStreamSynchronize(r->copy);
        cuStreamDestroy(r->copy);
    }
    for (int s = 0; s < r->n; s++) {
        if (r->ready[s]) cuEventDestroy(r->ready[s]);
        if (r->freed[s]) cuEventDestroy(r->freed[s]);
        /* cudaFree waits for the compute stream's queued reads of the slot. */
        if (r->dev[s]) (void)cu_free(r->dev[s]);
    }
    if (r->out) (void)cu_free(r->out);
    free(r);
}

/* A ring of `slots` device buffers of slot_bytes, its copy stream and events; packed: also the one
   output buffer of out_bytes that ring_wait decodes into. */
static int ring_make(Backend *b, int slots, size_t slot_bytes, bool packed, size_t out_bytes, h3_bring **out)
{
    *out = NULL;
    if (slots < 1 || slots > RING_MAX) return fail(b, H3_E_INVALID, "cuda: a ring of %d weight slots", slots);
    int rc = use_device(b);
    if (rc) return rc;
    h3_bring *r = (h3_bring *)calloc(1, sizeof *r);
    if (!r) return fail(b, H3_E_NOMEM, "cuda: out of host memory for a weight ring");
    r->n = slots;
    r->slot_bytes = round256(slot_bytes);
    r->packed = packed;
    r->out_bytes = round256(out_bytes);
    for (int s = 0; s < slots; s++) {
        char what[80];
        snprintf(what, sizeof what, "weight streaming %s %d of %d", packed ? "packed staging" : "slot", s + 1, slots);
        if (!(r->dev[s] = dev_alloc(b, r->slot_bytes, what))) {
            ring_close(b, r);
            return -H3_E_NOMEM;
        }
    }
    if (packed && !(r->out = dev_alloc(b, r->out_bytes, "weight streaming slot (decoded from packed copies)"))) {
        ring_close(b, r);
        return -H3_E_NOMEM;
    }
    CUresult e = cuStreamCreate(&r->copy, CU_STREAM_NON_BLOCKING);
    if (e != CUDA_SUCCESS) r->copy = NULL;
    for (int s = 0; s < slots && e == CUDA_SUCCESS; s++) {
        if ((e = cuEventCreate(&r->ready[s], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
            r->ready[s] = NULL;
        else if ((e = cuEventCreate(&r->freed[s], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
            r->freed[s] = NULL;
    }
    if (e != CUDA_SUCCESS) {
        rc = fail_cuda(b, e, "creating the weight ring's stream and events");
        ring_close(b, r);
        return rc;
    }
    *out = r;
    return 0;
}

int ring_open(Backend *b, int slots, size_t slot_bytes, h3_bring **out)
{
    return ring_make(b, slots, slot_bytes, false, 0, out);
}

int ring_open_packed(Backend *b, int slots, size_t out_bytes, size_t stage_bytes, h3_bring **out)
{
    if (!out_bytes || !stage_bytes)
        return fail(b, H3_E_INVALID, "cuda: a packed weight ring of %zu-byte slots staged in %zu bytes", out_bytes,
                    stage_bytes);
    return ring_make(b, slots, stage_bytes, true, out_bytes, out);
}

int ring_fill(Backend *b, h3_bring *r, int s, const void *host, size_t bytes)
{
    if (r->packed) return fail(b, H3_E_INVALID, "cuda: a plain fill of a packed weight ring");
    if (s < 0 || s >= r->n || bytes > r->slot_bytes)
        return fail(b, H3_E_INVALID, "cuda: fill of %zu bytes into weight slot %d of %d (%zu bytes)", bytes, s, r->n,
                    r->slot_bytes);
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = CUDA_SUCCESS;
    if (r->was_read[s]) e = cuStreamWaitEvent(r->copy, r->freed[s], 0);
    if (e == CUDA_SUCCESS) e = cu_copy(r->dev[s], host, bytes, r->copy);
    if (e == CUDA_SUCCESS) e = cuEventRecord(r->ready[s], r->copy);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "queueing a streamed weight copy");
}

int ring_fill_packed(Backend *b, h3_bring *r, int s, const void *packed, size_t packed_bytes, size_t out_bytes)
{
    if (!r->packed) return fail(b, H3_E_INVALID, "cuda: a packed fill of a plain weight ring");
    if (s < 0 || s >= r->n || out_bytes > r->out_bytes || out_bytes % 2 || packed_bytes > r->slot_bytes)
        return fail(b, H3_E_INVALID, "cuda: packed fill of %zu bytes (%zu of words) into weight slot %d of %d (%zu "
                    "bytes of staging, %zu of words)", packed_bytes, out_bytes, s, r->n, r->slot_bytes, r->out_bytes);
    /* The header and the escape table's ends are read here, on the host (the image is host
       memory): what they say is checked before the copy is sized by it. The decoder bounds every
       escape it reads by the count checked here, so a corrupt table cannot send it out of the image. */
    const uint8_t *p = static_cast<const uint8_t *>(packed);
    if (packed_bytes < H3_WPACK_HEADER || h3_wpack_get32(p) != H3_WPACK_MAGIC ||
        h3_wpack_get32(p + 4) != H3_WPACK_VERSION)
        return fail(b, H3_E_INVALID, "cuda: a packed weight image that is not wpack version %u", H3_WPACK_VERSION);
    const uint64_t n = h3_wpack_get64(p + 8), escapes = h3_wpack_get64(p + 32);
    const h3_wpack_layout l = h3_wpack_layout_of(n, H3_WPACK_CHUNK, escapes <= n ? escapes : 0);
    if (h3_wpack_get32(p + 16) != H3_WPACK_CHUNK || n * 2 != out_bytes || escapes > n || escapes > 0xffffffffu ||
        h3_wpack_get64(p + 24) != l.chunks || h3_wpack_get64(p + 40) != l.total || l.total > packed_bytes ||
        h3_wpack_get32(p + l.escoff) != 0 || h3_wpack_get32(p + l.escoff + 4 * l.chunks) != escapes)
        return fail(b, H3_E_INVALID, "cuda: a packed weight image (%zu bytes) that does not hold %zu bytes of words in "
                    "chunks of %u", packed_bytes, out_bytes, H3_WPACK_CHUNK);
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = CUDA_SUCCESS;
    if (r->was_read[s]) e = cuStreamWaitEvent(r->copy, r->freed[s], 0);
    /* One copy of the whole image: the copy engine never waits for a decode (that runs on the
       compute stream when the block is used, ring_wait). */
    if (e == CUDA_SUCCESS) e = cu_copy(r->dev[s], p, (size_t)l.total, r->copy);
    if (e == CUDA_SUCCESS) e = cuEventRecord(r->ready[s], r->copy);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "queueing a packed streamed weight copy");
    r->pk_n[s] = n;
    r->pk_escapes[s] = escapes;
    return 0;
}

int ring_wait(Backend *b, h3_bring *r, int s, void **dev)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cuStreamWaitEvent(b->stream, r->ready[s], 0);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "waiting for a streamed weight copy");
    if (!r->packed) {
        *dev = r->dev[s];
        return 0;
    }
    /* Packed: decode slot s's image into the one output buffer, on the compute stream, so after
       the ops of the block that used it before and before the ops of this one. */
    const h3_wpack_layout l = h3_wpack_layout_of(r->pk_n[s], H3_WPACK_CHUNK, r->pk_escapes[s]);
    rc = wpack_decode(b, b->stream, static_cast<const uint8_t *>(r->dev[s]), l, static_cast<uint16_t *>(r->out));
    if (rc) return rc;
    *dev = r->out;
    return 0;
}

int ring_done(Backend *b, h3_bring *r, int s)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cuEventRecord(r->freed[s], b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "marking a weight slot free");
    r->was_read[s] = true;
    return 0;
}

int ring_host_wait(Backend *b, h3_bring *r, int s)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    /* An event never recorded counts as done: a slot never filled has no copy to wait for. */
    CUresult e = cuEventSynchronize(r->ready[s]);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "waiting for a streamed weight copy");
}

} /* namespace h3cuda */
