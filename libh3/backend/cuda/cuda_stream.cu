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
#include "backend/cuda/cuda_common.cuh"

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
    cudaStream_t copy;
    cudaEvent_t ready[h3cuda::RING_MAX], freed[h3cuda::RING_MAX];
    bool was_read[h3cuda::RING_MAX]; /* freed[s] has been recorded at least once */
};

namespace h3cuda {

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

void *host_alloc(Backend *b, size_t bytes)
{
    if (use_device(b)) return NULL;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();
    const long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    fail(b, H3_E_NOMEM, "cuda: cannot pin %.2f GiB of host memory for streamed weights (%.1f GiB of RAM free): %s",
         (double)bytes / gib, pages > 0 && psz > 0 ? (double)pages * (double)psz / gib : 0.0, cudaGetErrorString(e));
    return NULL;
}

void host_free(Backend *b, void *p)
{
    if (!p || use_device(b)) return;
    if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
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
    cudaError_t e = cudaMemcpyAsync(dst, w->data, vb, cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess && w->priv)
        e = cudaMemcpyAsync((char *)dst + values_bytes(w), w->priv, sizeof(float) * (size_t)w->rows,
                            cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) return fail_cuda(b, e, "copying a weight to host memory for streaming");
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
        if (cudaStreamSynchronize(r->copy) != cudaSuccess) (void)cudaGetLastError();
        cudaStreamDestroy(r->copy);
    }
    for (int s = 0; s < r->n; s++) {
        if (r->ready[s]) cudaEventDestroy(r->ready[s]);
        if (r->freed[s]) cudaEventDestroy(r->freed[s]);
        /* cudaFree waits for the compute stream's queued reads of the slot. */
        if (r->dev[s] && cudaFree(r->dev[s]) != cudaSuccess) (void)cudaGetLastError();
    }
    free(r);
}

int ring_open(Backend *b, int slots, size_t slot_bytes, h3_bring **out)
{
    *out = NULL;
    if (slots < 1 || slots > RING_MAX) return fail(b, H3_E_INVALID, "cuda: a ring of %d weight slots", slots);
    int rc = use_device(b);
    if (rc) return rc;
    h3_bring *r = (h3_bring *)calloc(1, sizeof *r);
    if (!r) return fail(b, H3_E_NOMEM, "cuda: out of host memory for a weight ring");
    r->n = slots;
    r->slot_bytes = round256(slot_bytes);
    for (int s = 0; s < slots; s++) {
        char what[64];
        snprintf(what, sizeof what, "weight streaming slot %d of %d", s + 1, slots);
        if (!(r->dev[s] = dev_alloc(b, r->slot_bytes, what))) {
            ring_close(b, r);
            return -H3_E_NOMEM;
        }
    }
    cudaError_t e = cudaStreamCreateWithFlags(&r->copy, cudaStreamNonBlocking);
    if (e != cudaSuccess) r->copy = NULL;
    for (int s = 0; s < slots && e == cudaSuccess; s++) {
        if ((e = cudaEventCreateWithFlags(&r->ready[s], cudaEventDisableTiming)) != cudaSuccess)
            r->ready[s] = NULL;
        else if ((e = cudaEventCreateWithFlags(&r->freed[s], cudaEventDisableTiming)) != cudaSuccess)
            r->freed[s] = NULL;
    }
    if (e != cudaSuccess) {
        rc = fail_cuda(b, e, "creating the weight ring's stream and events");
        ring_close(b, r);
        return rc;
    }
    *out = r;
    return 0;
}

int ring_fill(Backend *b, h3_bring *r, int s, const void *host, size_t bytes)
{
    if (s < 0 || s >= r->n || bytes > r->slot_bytes)
        return fail(b, H3_E_INVALID, "cuda: fill of %zu bytes into weight slot %d of %d (%zu bytes)", bytes, s, r->n,
                    r->slot_bytes);
    int rc = use_device(b);
    if (rc) return rc;
    cudaError_t e = cudaSuccess;
    if (r->was_read[s]) e = cudaStreamWaitEvent(r->copy, r->freed[s], 0);
    if (e == cudaSuccess) e = cudaMemcpyAsync(r->dev[s], host, bytes, cudaMemcpyHostToDevice, r->copy);
    if (e == cudaSuccess) e = cudaEventRecord(r->ready[s], r->copy);
    return e == cudaSuccess ? 0 : fail_cuda(b, e, "queueing a streamed weight copy");
}

int ring_wait(Backend *b, h3_bring *r, int s, void **dev)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    int rc = use_device(b);
    if (rc) return rc;
    cudaError_t e = cudaStreamWaitEvent(b->stream, r->ready[s], 0);
    if (e != cudaSuccess) return fail_cuda(b, e, "waiting for a streamed weight copy");
    *dev = r->dev[s];
    return 0;
}

int ring_done(Backend *b, h3_bring *r, int s)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    int rc = use_device(b);
    if (rc) return rc;
    cudaError_t e = cudaEventRecord(r->freed[s], b->stream);
    if (e != cudaSuccess) return fail_cuda(b, e, "marking a weight slot free");
    r->was_read[s] = true;
    return 0;
}

int ring_host_wait(Backend *b, h3_bring *r, int s)
{
    if (s < 0 || s >= r->n) return fail(b, H3_E_INVALID, "cuda: weight slot %d of %d", s, r->n);
    /* An event never recorded counts as done: a slot never filled has no copy to wait for. */
    cudaError_t e = cudaEventSynchronize(r->ready[s]);
    return e == cudaSuccess ? 0 : fail_cuda(b, e, "waiting for a streamed weight copy");
}

} /* namespace h3cuda */
