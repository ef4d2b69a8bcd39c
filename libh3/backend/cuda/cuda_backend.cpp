/*
 * The CUDA backend of libh3: the ops table of backend.h, device memory, weight upload, errors,
 * the device query and the one exported symbol, h3_backend_cuda_create.
 *
 * One stream per backend: uploads, ops and downloads run in issue order on it; `download` and
 * `sync` wait for it and report any fault a queued kernel hit. Kernels live in cuda_gemm.cu
 * (cuBLASLt, its plans cached in cuda_lt_plans.cu), cuda_attention.cu (flash attention) and
 * cuda_rows.cu (the row-wise ops).
 *
 * This library links the CUDA runtime statically and cuBLASLt dynamically (libcublasLt.so.13,
 * found through the loader's normal search path: LD_LIBRARY_PATH or ld.so.conf), so the only
 * thing a machine needs besides the driver is cuBLAS of the CUDA major version it was built for.
 */
#include "backend/cuda/cuda_sdpa.h"
#include "backend/cuda/cuda_kernels.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace h3cuda {

/* ---- errors -------------------------------------------------------------------------------- */

int fail(const Backend *b, int code, const char *fmt, ...)
{
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return b->host.err(code, "%s", msg);
}

static int code_of(CUresult e)
{
    switch (e) {
    case CUDA_ERROR_OUT_OF_MEMORY: return H3_E_NOMEM;
    case CUDA_ERROR_INVALID_VALUE: return H3_E_INVALID;
    default: return H3_E_UNSUPPORTED;
    }
}

/* A sticky error (a kernel fault) leaves the CUDA context unusable: say so, since every later
   call will fail the same way. */
static bool sticky(CUresult e)
{
    switch (e) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE: return true;
    default: return false;
    }
}

int fail_cuda(const Backend *b, CUresult e, const char *what)
{
    return fail(b, code_of(e), "cuda: %s: %s%s", what, cu_errstr(e),
                sticky(e) ? " (the GPU context is lost; restart the process)" : "");
}

int fail_cublas(const Backend *b, cublasStatus_t s, const char *what)
{
    return fail(b, s == CUBLAS_STATUS_ALLOC_FAILED ? H3_E_NOMEM : H3_E_UNSUPPORTED, "cuda: %s: cuBLASLt %s (%s)", what,
                cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

/* The backend's primary context current on this thread (cheap when it already is): the driver
   API, cuBLASLt and cuDNN then all work in the one context. */
int use_device(const Backend *b)
{
    CUcontext cur = NULL;
    if (cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == b->ctx) return 0;
    CUresult e = cuCtxSetCurrent(b->ctx);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "selecting the GPU");
}

int check_view(const Backend *b, const char *op, const char *name, const h3_bt *t)
{
    if (!t) return fail(b, H3_E_INVALID, "cuda: %s: %s is missing", op, name);
    if (!is_act(t->dtype))
        return fail(b, H3_E_UNSUPPORTED, "cuda: %s: %s must be f32 or bf16, got %s", op, name, dtname(t->dtype));
    if (t->rows < 0 || t->cols < 0 || (t->rows > 1 && t->ld < t->cols))
        return fail(b, H3_E_INVALID, "cuda: %s: %s is %lld x %lld with row stride %lld", op, name, (long long)t->rows,
                    (long long)t->cols, (long long)t->ld);
    if (!t->data && t->rows > 0 && t->cols > 0) return fail(b, H3_E_INVALID, "cuda: %s: %s has no data", op, name);
    return 0;
}

/* ---- memory -------------------------------------------------------------------------------- */

static void fmt_bytes(char *out, size_t cap, uint64_t bytes)
{
    const double gib = (double)bytes / (1024.0 * 1024.0 * 1024.0);
    if (gib >= 1.0)
        snprintf(out, cap, "%.2f GiB", gib);
    else
        snprintf(out, cap, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
}

void *dev_alloc(const Backend *b, size_t bytes, const char *what)
{
    if (use_device(b)) return NULL;
    void *p = NULL;
    CUresult e = cu_malloc(&p, bytes ? bytes : 1);
    if (e == CUDA_SUCCESS) {
        /* Memory in use only grows at an allocation, so sampling here catches the peak of
           everything this backend allocates (a few microseconds next to cudaMalloc itself). */
        size_t fr = 0, tot = 0;
        if (cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS) {
            Backend *mb = const_cast<Backend *>(b);
            if ((uint64_t)(tot - fr) > mb->mem_peak) mb->mem_peak = (uint64_t)(tot - fr);
        }
        return p;
    }
    if (e == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t fr = 0, tot = 0;
        char ask[32], frs[32], tots[32];
        fmt_bytes(ask, sizeof ask, bytes);
        if (cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS) {
            fmt_bytes(frs, sizeof frs, fr);
            fmt_bytes(tots, sizeof tots, tot);
            fail(b, H3_E_NOMEM, "cuda: out of device memory allocating %s for %s (%s free of %s)", ask, what, frs,
                 tots);
        } else {
            fail(b, H3_E_NOMEM, "cuda: out of device memory allocating %s for %s", ask, what);
        }
        return NULL;
    }
    char w[96];
    snprintf(w, sizeof w, "allocating device memory for %s", what);
    fail_cuda(b, e, w);
    return NULL;
}

void *scratch(Backend *b, int slot, size_t bytes)
{
    if (b->scratch_bytes[slot] >= bytes && b->scratch[slot]) return b->scratch[slot];
    /* Grow by half again so a slowly growing sequence does not reallocate every call. */
    size_t want = bytes + bytes / 2;
    if (want < ((size_t)1 << 20)) want = (size_t)1 << 20;
    if (b->scratch[slot]) {
        /* Queued work may still read the old buffer. */
        CUresult e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) {
            fail_cuda(b, e, "waiting for queued work");
            return NULL;
        }
        cu_free(b->scratch[slot]);
        b->scratch[slot] = NULL;
        b->scratch_bytes[slot] = 0;
    }
    void *p = dev_alloc(b, want, "scratch");
    if (!p) return NULL;
    b->scratch[slot] = p;
    b->scratch_bytes[slot] = want;
    return p;
}

static void *be_alloc(h3_backend *be, size_t bytes) { return dev_alloc(B(be), bytes, "a buffer"); }

static void be_release(h3_backend *be, void *p)
{
    if (!p) return;
    Backend *b = B(be);
    if (use_device(b)) return;
    /* cudaFree waits for work queued on the device, so a buffer a kernel still reads is safe. */
    (void)cu_free(p);
}

static int be_upload(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    Backend *b = B(be);
    if (!bytes) return 0;
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cu_copy(dst, src, bytes, b->stream);
    if (e != CUDA_SUCCESS) return fail_cuda(b, e, "upload");
    /* From pageable memory the call returns once the bytes are staged, so the caller may reuse
       its buffer at once. Pinned memory (registered by someone else) is read later by the copy
       engine: wait, so the contract holds for any host pointer. */
    CUmemorytype mt = 0;
    if (cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr(src)) == CUDA_SUCCESS &&
        mt == CU_MEMORYTYPE_HOST) {
        e = cuStreamSynchronize(b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "upload");
    }
    return 0;
}

static int be_download(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    Backend *b = B(be);
    int rc = use_device(b);
    if (rc) return rc;
    if (bytes) {
        CUresult e = cu_copy(dst, src, bytes, b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "download");
    }
    CUresult e = cuStreamSynchronize(b->stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "download (a queued GPU operation failed)");
}

static int be_zero(h3_backend *be, void *dst, size_t bytes)
{
    Backend *b = B(be);
    if (!bytes) return 0;
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cu_memset(dst, 0, bytes, b->stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "zero");
}

static int be_sync(h3_backend *be)
{
    Backend *b = B(be);
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cuStreamSynchronize(b->stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "a queued GPU operation failed");
}

/* The device's free and total memory now (cudaMemGetInfo on the backend's device). */
static int mem_now(Backend *b, size_t *fr, size_t *tot)
{
    int rc = use_device(b);
    if (rc) return rc;
    *fr = *tot = 0;
    CUresult e = cuMemGetInfo(fr, tot);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "reading free memory");
}

static int be_mem_info(h3_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{
    size_t fr, tot;
    int rc = mem_now(B(be), &fr, &tot);
    if (rc) return rc;
    if (free_bytes) *free_bytes = fr;
    if (total_bytes) *total_bytes = tot;
    return 0;
}

static int be_mem_peak(h3_backend *be, bool reset, uint64_t *peak)
{
    Backend *b = B(be);
    size_t fr, tot;
    int rc = mem_now(b, &fr, &tot);
    if (rc) return rc;
    const uint64_t now = (uint64_t)(tot - fr);
    if (reset || now > b->mem_peak) b->mem_peak = now;
    if (peak) *peak = b->mem_peak;
    return 0;
}

/* ---- staged uploads (weights, noise) ------------------------------------------------------- */

#define STAGE_CHUNK ((size_t)64 << 20)

static int stage_ensure(Backend *b, bool need_dev)
{
    if (!b->stage_host[0]) {
        for (int s = 0; s < STAGE_SLOTS; s++) {
            CUresult e = cu_host_alloc((void **)&b->stage_host[s], STAGE_CHUNK);
            if (e != CUDA_SUCCESS) {
                b->stage_host[s] = NULL;
                return fail_cuda(b, e, "allocating pinned staging memory (2 x 64 MiB)");
            }
        }
        b->stage_bytes = STAGE_CHUNK;
    }
    if (need_dev && !b->stage_dev[0])
        for (int s = 0; s < STAGE_SLOTS; s++) {
            b->stage_dev[s] = dev_alloc(b, STAGE_CHUNK, "weight staging");
            if (!b->stage_dev[s]) return -H3_E_NOMEM;
        }
    return 0;
}

int stage_upload(Backend *b, void *dst, size_t bytes, size_t align, stage_fill_fn fill, void *ctx,
                 stage_convert_fn convert)
{
    int rc = stage_ensure(b, convert != NULL);
    if (rc) return rc;
    const size_t chunk = b->stage_bytes / align * align;
    for (size_t off = 0; off < bytes; off += chunk) {
        const size_t n = bytes - off < chunk ? bytes - off : chunk;
        const int s = b->stage_next;
        b->stage_next = (s + 1) % STAGE_SLOTS;
        if (b->stage_used[s]) {
            /* The copy (and conversion) that last used this slot must be done before refilling. */
            CUresult e = cuEventSynchronize(b->stage_done[s]);
            if (e != CUDA_SUCCESS) return fail_cuda(b, e, "staged upload");
        }
        fill(ctx, b->stage_host[s], off, n);
        CUresult e;
        if (convert) {
            e = cu_copy(b->stage_dev[s], b->stage_host[s], n, b->stream);
            if (e != CUDA_SUCCESS) return fail_cuda(b, e, "staged upload");
            if ((rc = convert(b, dst, b->stage_dev[s], n, off))) return rc;
        } else {
            e = cu_copy((char *)dst + off, b->stage_host[s], n, b->stream);
            if (e != CUDA_SUCCESS) return fail_cuda(b, e, "staged upload");
        }
        e = cuEventRecord(b->stage_done[s], b->stream);
        if (e != CUDA_SUCCESS) return fail_cuda(b, e, "staged upload");
        b->stage_used[s] = true;
    }
    return 0;
}

/* ---- weights ------------------------------------------------------------------------------- */

static void fill_copy(void *ctx, void *pinned, size_t offset, size_t bytes)
{
    memcpy(pinned, (const char *)ctx + offset, bytes);
}

static int conv_f32(Backend *b, void *dst, const void *staged, size_t bytes, size_t offset)
{
    return convert_to_bf16(b, staged, H3_DT_F32, (bf16_t *)dst + offset / 4, (int64_t)(bytes / 4));
}

static int conv_f16(Backend *b, void *dst, const void *staged, size_t bytes, size_t offset)
{
    return convert_to_bf16(b, staged, H3_DT_F16, (bf16_t *)dst + offset / 2, (int64_t)(bytes / 2));
}

/* The device copy is bf16 whatever the checkpoint stores: f32 and f16 are rounded to nearest
   even once, on the GPU, as diffusers' .to(bfloat16) does. The raw bytes cross PCIe in 64 MiB
   chunks through pinned memory, so a checkpoint loads at copy-engine speed. */
static int be_weight_load(h3_backend *be, const void *host, h3_dtype dt, int64_t rows, int64_t cols, h3_bw *out)
{
    Backend *b = B(be);
    memset(out, 0, sizeof *out);
    if (dt != H3_DT_F32 && dt != H3_DT_BF16 && dt != H3_DT_F16)
        return fail(b, H3_E_SCHEMA, "cuda: weights must be F32, BF16 or F16, got %s", dtname(dt));
    if (rows < 0 || cols < 0 || (rows * cols > 0 && !host))
        return fail(b, H3_E_INVALID, "cuda: weight of %lld x %lld", (long long)rows, (long long)cols);
    int rc = use_device(b);
    if (rc) return rc;
    const int64_t n = rows * cols;
    void *d = dev_alloc(b, (size_t)n * 2, "weights");
    if (!d) return -H3_E_NOMEM;
    if (n > 0) {
        const size_t esz = dt == H3_DT_F32 ? 4 : 2;
        rc = stage_upload(b, d, (size_t)n * esz, esz, fill_copy, (void *)host,
                          dt == H3_DT_BF16 ? NULL : dt == H3_DT_F32 ? conv_f32 : conv_f16);
        if (rc) {
            cu_free(d);
            return rc;
        }
    }
    out->data = d;
    out->dtype = H3_DT_BF16;
    out->rows = rows;
    out->cols = cols;
    out->priv = NULL;
    /* fp8 (h3_options.precision): the bf16 copy quantised per output channel, then let go. */
    if (b->base.weight_precision == H3_PRECISION_FP8 && fp8_weight_ok(b, rows, cols)) {
        rc = fp8_weight_from_bf16(b, d, rows, cols, out);
        be_release(be, d);
        return rc;
    }
    return 0;
}

/* Device-to-device bytes on the compute stream: ordered with the ops around it. */
static int be_dcopy(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    Backend *b = B(be);
    if (bytes && (!dst || !src)) return fail(b, H3_E_INVALID, "cuda: copy of %zu bytes from or to NULL", bytes);
    int rc = use_device(b);
    if (rc || !bytes) return rc;
    CUresult e = cu_copy(dst, src, bytes, b->stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "copying device memory");
}

/* A pre-quantised fp8 weight: the stored e4m3 bytes and scales uploaded as they are, into the form
   quantising at load makes (fp8_weight_alloc). */
static int be_weight_load_fp8(h3_backend *be, const uint8_t *q, const float *scale, int64_t rows, int64_t cols,
                              h3_bw *out)
{
    Backend *b = B(be);
    memset(out, 0, sizeof *out);
    if (rows <= 0 || cols <= 0 || !q || !scale)
        return fail(b, H3_E_INVALID, "cuda: fp8 weight of %lld x %lld", (long long)rows, (long long)cols);
    if (!fp8_weight_ok(b, rows, cols))
        return fail(b, H3_E_UNSUPPORTED, "cuda: an fp8 weight of %lld x %lld on this GPU (compute capability 8.9 "
                    "and a width that is a multiple of 16 are needed)", (long long)rows, (long long)cols);
    int rc = use_device(b);
    if (!rc) rc = fp8_weight_alloc(b, rows, cols, out);
    if (rc) return rc;
    rc = stage_upload(b, (void *)out->data, (size_t)(rows * cols), 1, fill_copy, (void *)q, NULL);
    if (!rc) rc = stage_upload(b, out->priv, sizeof(float) * (size_t)rows, 4, fill_copy, (void *)scale, NULL);
    if (rc) fp8_weight_release(out);
    return rc;
}

static void be_weight_free(h3_backend *be, h3_bw *w)
{
    if (!w) return;
    if (w->data) be_release(be, (void *)w->data);
    if (w->priv) be_release(be, w->priv); /* an fp8 weight's scales */
    memset(w, 0, sizeof *w);
}

/* ---- ops that only dispatch ---------------------------------------------------------------- */

static int be_linear(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : linear(b, X, W, bias, Y);
}

static int be_attention(h3_backend *be, const h3_bt *Q, const h3_bt *K, const h3_bt *V, int heads, int kv_heads, int D,
                        float scale, bool causal, const h3_bt *O)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : attention(b, Q, K, V, heads, kv_heads, D, scale, causal, O);
}

static int be_norm_mod(h3_backend *be, const h3_bt *x, const int64_t *rows, const float *w, const h3_bmod *mod,
                       float eps, const h3_bt *y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : norm_mod(b, x, rows, w, mod, eps, y);
}

static int be_qk_norm_rope(h3_backend *be, const h3_bt *qin, const h3_bt *kin, const h3_bt *vin, int hs,
                           const float *qn, const float *kn, const float *cos, const float *sin, int heads,
                           int kv_heads, int D, int half, float eps, const h3_bt *q, const h3_bt *k, const h3_bt *v)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : qk_norm_rope(b, qin, kin, vin, hs, qn, kn, cos, sin, heads, kv_heads, D, half, eps, q, k, v);
}

static int be_gated_add(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *mod)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : gated_add(b, x, y, mod);
}

static int be_gated_add_norm(h3_backend *be, const h3_bt *x, const h3_bt *y, const h3_bmod *gate, const float *w,
                             const h3_bmod *mod, float eps, const h3_bt *out)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : gated_add_norm(b, x, y, gate, w, mod, eps, out);
}

static int be_swiglu(h3_backend *be, const h3_bt *gate, const h3_bt *up, const h3_bt *out)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : swiglu(b, gate, up, out);
}

static int be_scatter_rows(h3_backend *be, const h3_bt *src, const int64_t *idx, const h3_bt *dst)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : scatter_rows(b, src, idx, dst);
}

static int be_euler(h3_backend *be, float *x, const float *v, int64_t n, float t, float sigma, float sigma_next)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : euler(b, x, v, n, t, sigma, sigma_next);
}

/* Noise is generated on the host by libh3's own h3_noise (through host->noise) and uploaded:
   a device Philox + Box-Muller would need the GPU's log/cos to round exactly like the host libm
   to give the same floats, so this keeps the noise bit-identical to the CPU backend by
   construction. The cost (a few hundred MB at most, once per render) is a copy. */
struct noise_ctx {
    void (*fn)(uint64_t, uint32_t, uint64_t, float *, int64_t);
    uint64_t seed, offset;
    uint32_t stream;
};

static void fill_noise(void *ctx, void *pinned, size_t offset, size_t bytes)
{
    const noise_ctx *c = (const noise_ctx *)ctx;
    c->fn(c->seed, c->stream, c->offset + offset / 4, (float *)pinned, (int64_t)(bytes / 4));
}

static int be_noise(h3_backend *be, uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n)
{
    Backend *b = B(be);
    if (n <= 0) return 0;
    if (!b->host.noise) return fail(b, H3_E_UNSUPPORTED, "cuda: noise: the host gave no noise generator");
    int rc = use_device(b);
    if (rc) return rc;
    noise_ctx c = {b->host.noise, seed, offset, stream};
    return stage_upload(b, out, (size_t)n * 4, 4, fill_noise, &c, NULL);
}

static int be_extrapolate(h3_backend *be, float *out, const float *a, const float *bb, int64_t n, float r)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : extrapolate(b, out, a, bb, n, r);
}

static int be_sub(h3_backend *be, float *out, const float *a, const float *bb, int64_t n)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : sub(b, out, a, bb, n);
}

static int be_pool_pairs(h3_backend *be, const h3_bt *src, const int64_t *pairs, const h3_bt *dst)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : pool_pairs(b, src, pairs, dst);
}

static int be_unpool_pairs(h3_backend *be, const h3_bt *red, const h3_bt *base, const int64_t *pairs,
                           const h3_bt *full)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : unpool_pairs(b, red, base, pairs, full);
}

static int be_abs_diff_sum(h3_backend *be, const float *a, const float *bb, int64_t n, double *diff, double *ref)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : abs_diff_sum(b, a, bb, n, diff, ref);
}

/* The text encoder's and the decoders' ops: layernorm, copy and add_div in cuda_layernorm.cu, the
   layout and convolution ops in cuda_decoders.cu. */
static int be_layernorm(h3_backend *be, const h3_bt *x, const float *w, const float *bb, float eps, const h3_bt *y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : layernorm(b, x, w, bb, eps, y);
}

static int be_copy(h3_backend *be, const h3_bt *src, const h3_bt *dst)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : copy_view(b, src, dst);
}

static int be_add_div(h3_backend *be, const h3_bt *y, const h3_bt *x, float div)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : add_div(b, y, x, div);
}

static int be_channels_last(h3_backend *be, const float *x, int64_t cs, int64_t ts, int64_t rs, int nt, int t_avail,
                            int ny, int nx, const float *scale, const float *shift, const h3_bt *y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : channels_last(b, x, cs, ts, rs, nt, t_avail, ny, nx, scale, shift, y);
}

static int be_unpatchify(h3_backend *be, const h3_bt *src, int64_t tok0, int gh, int gw, int C, int pt, int ps,
                         const int32_t *fmap, float *dst)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : unpatchify(b, src, tok0, gh, gw, C, pt, ps, fmap, dst);
}

static int be_vae_stitch(h3_backend *be, const h3_bstitch *s)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : vae_stitch(b, s);
}

static int be_snake_aa(h3_backend *be, const h3_bt *x, const float *a, const float *rb, const float *fup,
                       const float *fdown, const h3_bphased *dst)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : snake_aa(b, x, a, rb, fup, fdown, dst);
}

static int be_conv_gemm(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : conv_gemm(b, X, W, bias, Y);
}

static int be_conv1_clamp(h3_backend *be, const h3_bt *X, const float *w, float *y)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : conv1_clamp(b, X, w, y);
}

/* Streamed weights: cuda_wstream.cu. */
static int be_wstream_open(h3_backend *be, size_t bytes, int slots, void **host, void **ws)
{
    Backend *b = B(be);
    int rc = use_device(b);
    return rc ? rc : wstream_open(b, bytes, slots, host, ws);
}

static int be_wstream_load(h3_backend *be, void *ws, int slot, size_t bytes, int n, const h3_bwspec *spec, h3_bw *w)
{
    return wstream_load(B(be), ws, slot, bytes, n, spec, w);
}

static int be_wstream_wait_host(h3_backend *be, void *ws, int slot) { return wstream_wait_host(B(be), ws, slot); }

static int be_wstream_done(h3_backend *be, void *ws, int slot) { return wstream_done(B(be), ws, slot); }

static void be_wstream_close(h3_backend *be, void *ws) { wstream_close(B(be), ws); }

/* ---- lifetime ------------------------------------------------------------------------------ */

static void release_all(Backend *b)
{
    if (!b->ctx) { /* nothing was made on a GPU */
        free(b);
        return;
    }
    cuCtxSetCurrent(b->ctx);
    if (b->stream) cuStreamSynchronize(b->stream);
    kernels_destroy(b);
    decoders_destroy(b);
    wstream_destroy(b);
    lt_plans_destroy(b);
    if (b->lt) cublasLtDestroy(b->lt);
    if (b->lt_ws) cu_free(b->lt_ws);
    for (int i = 0; i < SCR_COUNT; i++)
        if (b->scratch[i]) cu_free(b->scratch[i]);
    for (int s = 0; s < STAGE_SLOTS; s++) {
        if (b->stage_host[s]) cuMemFreeHost(b->stage_host[s]);
        if (b->stage_dev[s]) cu_free(b->stage_dev[s]);
        if (b->stage_done[s]) cuEventDestroy(b->stage_done[s]);
    }
    if (b->stream) {
        /* Drained above or here; the shared cuDNN state must not wait on it once it is gone. */
        (void)cuStreamSynchronize(b->stream);
        h3_cudnn_forget_stream(&b->cudnn, b->stream);
        cuStreamDestroy(b->stream);
    }
    cuDevicePrimaryCtxRelease(b->cudev);
    free(b);
}

/* ---- weight streaming (cuda_stream.cu) ---------------------------------------------------- */

static void *be_host_alloc(h3_backend *be, size_t bytes) { return host_alloc(B(be), bytes); }
static void be_host_free(h3_backend *be, void *p) { host_free(B(be), p); }
static size_t be_weight_bytes(h3_backend *be, const h3_bw *w) { return weight_bytes(B(be), w); }
static int be_weight_save(h3_backend *be, const h3_bw *w, void *dst) { return weight_save(B(be), w, dst); }
static int be_weight_view(h3_backend *be, const h3_bw *like, const void *dev, h3_bw *out)
{
    return weight_view(B(be), like, dev, out);
}
static int be_ring_open(h3_backend *be, int slots, size_t slot_bytes, h3_bring **out)
{
    return ring_open(B(be), slots, slot_bytes, out);
}
static void be_ring_close(h3_backend *be, h3_bring *r) { ring_close(B(be), r); }
static int be_ring_fill(h3_backend *be, h3_bring *r, int s, const void *host, size_t bytes)
{
    return ring_fill(B(be), r, s, host, bytes);
}
static int be_ring_wait(h3_backend *be, h3_bring *r, int s, void **dev) { return ring_wait(B(be), r, s, dev); }
static int be_ring_done(h3_backend *be, h3_bring *r, int s) { return ring_done(B(be), r, s); }
static int be_ring_open_packed(h3_backend *be, int slots, size_t out_bytes, size_t stage_bytes, h3_bring **out)
{
    return ring_open_packed(B(be), slots, out_bytes, stage_bytes, out);
}
static int be_ring_fill_packed(h3_backend *be, h3_bring *r, int s, const void *packed, size_t packed_bytes,
                               size_t out_bytes)
{
    return ring_fill_packed(B(be), r, s, packed, packed_bytes, out_bytes);
}

static void be_destroy(h3_backend *be)
{
    if (!be) return;
    release_all(B(be));
}

/* Positional, in backend.h's order (C++17 has no designated initializers): an entry added to
   backend.h and missing here is a -Wmissing-field-initializers warning, and a misplaced one a
   type error. */
static const h3_backend_mem cuda_mem = {
    be_alloc,      be_release,  be_upload,  be_download, be_zero, be_sync, be_mem_info, be_dcopy,
    be_host_alloc, be_host_free, be_mem_peak,
};

static const h3_backend_weights cuda_weights = {
    be_weight_load,  be_weight_free,      be_weight_load_fp8,
    be_weight_bytes, be_weight_save,      be_weight_view,
    be_ring_open,    be_ring_close,       be_ring_fill,      be_ring_wait,    be_ring_done,
    be_ring_open_packed, be_ring_fill_packed,
    be_wstream_open, be_wstream_load,     be_wstream_wait_host, be_wstream_done, be_wstream_close,
};

static const h3_backend_ops cuda_ops = {
    be_linear,      be_attention,    be_norm_mod,   be_qk_norm_rope, be_gated_add,    be_gated_add_norm,
    be_swiglu,      be_scatter_rows, be_euler,      be_noise,        be_extrapolate,  be_sub,
    be_pool_pairs,  be_unpool_pairs, be_abs_diff_sum, be_layernorm,  be_copy,         be_add_div,
    be_conv_gemm,
    /* The vision tower's gelu / rope and the audio VAE encoder's mul have no CUDA kernels yet:
       NULL, and those stages run on the CPU backend (h3_backend_need names the op otherwise). */
    NULL,           NULL,            NULL,
};

static const h3_backend_decoders cuda_dec = {
    be_channels_last, be_unpatchify, be_vae_stitch, be_snake_aa, be_conv1_clamp,
    /* The video VAE encoder's conv3d / group_norm and the audio VAE encoder's snake / head_pool:
       CPU only for now. */
    NULL,             NULL,          NULL,          NULL,
};

/* The oldest driver the cubins of this NVRTC load on: CUDA 13.0's (cuDriverGetVersion 13000). */
#define DRIVER_MIN 13000

/* The cuDNN path's view of the backend (struct h3_cudnn_host): device memory and stream waits in
   the backend's context. */
static int cudnn_alloc(void *ctx, size_t bytes, void **out)
{
    Backend *b = (Backend *)ctx;
    *out = dev_alloc(b, bytes, "cuDNN's workspace");
    return *out ? 0 : -H3_E_NOMEM;
}

static void cudnn_free(void *ctx, void *p)
{
    Backend *b = (Backend *)ctx;
    if (p && !use_device(b)) cu_free(p);
}

static int cudnn_sync(void *ctx, void *stream)
{
    Backend *b = (Backend *)ctx;
    int rc = use_device(b);
    if (rc) return rc;
    CUresult e = cuStreamSynchronize((CUstream)stream);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "waiting for the GPU");
}

static int create(Backend *b, int ord)
{
    char why[400];
    /* The driver, NVRTC and cuBLASLt, each loaded once per process; a missing one is the whole reason. */
    if (load_driver(b->host.libcuda, why, sizeof why)) return fail(b, H3_E_UNSUPPORTED, "cuda: %s", why);
    int drv = 0;
    cuDriverGetVersion(&drv);
    b->driver_version = drv;
    if (drv < DRIVER_MIN)
        return fail(b, H3_E_UNSUPPORTED,
                    "cuda: the NVIDIA driver is too old (it supports CUDA %d.%d; the kernels need CUDA %d.%d or newer: "
                    "update the driver)",
                    drv / 1000, drv % 1000 / 10, DRIVER_MIN / 1000, DRIVER_MIN % 1000 / 10);
    int count = 0;
    CUresult e = cuDeviceGetCount(&count);
    if (e != CUDA_SUCCESS || count == 0) return fail(b, H3_E_UNSUPPORTED, "cuda: no CUDA-capable GPU found");
    if (ord < 0 || ord >= count)
        return fail(b, H3_E_INVALID, "cuda: GPU %d requested but %d %s found", ord, count, count == 1 ? "is" : "are");
    CUdevice dev = 0;
    if ((e = cuDeviceGet(&dev, ord)) != CUDA_SUCCESS) return fail_cuda(b, e, "opening the GPU");
    int major = 0, minor = 0, sms = 0, optin = 0;
    size_t total = 0;
    if ((e = cuDeviceGetName(b->name, (int)sizeof b->name, dev)) != CUDA_SUCCESS ||
        (e = cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) != CUDA_SUCCESS ||
        (e = cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) != CUDA_SUCCESS ||
        (e = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) != CUDA_SUCCESS ||
        (e = cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)) != CUDA_SUCCESS ||
        (e = cuDeviceTotalMem(&total, dev)) != CUDA_SUCCESS)
        return fail_cuda(b, e, "reading device properties");
    if (major < 8)
        return fail(b, H3_E_UNSUPPORTED, "cuda: GPU %d (%s) has compute capability %d.%d; libh3 needs 8.0 or newer", ord,
                    b->name, major, minor);
    if (load_nvrtc(b->host.nvrtc_lib, why, sizeof why)) return fail(b, H3_E_UNSUPPORTED, "cuda: %s", why);
    if (load_cublaslt(b->host.cublaslt_lib, why, sizeof why)) return fail(b, H3_E_UNSUPPORTED, "cuda: %s", why);
    b->dev = ord;
    b->cudev = dev;
    b->cc_major = major;
    b->cc_minor = minor;
    b->sm_count = sms;
    b->smem_optin = (size_t)optin;
    b->total_mem = total;
    /* The primary context, the one the CUDA runtime inside cuBLASLt and cuDNN uses: retained now,
       so a busy or unavailable GPU is reported here, not at first use. */
    CUcontext ctx = NULL;
    if ((e = cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) return fail_cuda(b, e, "creating a context on the GPU");
    b->ctx = ctx;
    if ((e = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) return fail_cuda(b, e, "selecting the GPU");
    b->cudnn.device = ord;
    b->cudnn.cc_major = major;
    b->cudnn.cc_minor = minor;
    b->cudnn.ctx = b;
    b->cudnn.dev_alloc = cudnn_alloc;
    b->cudnn.dev_free = cudnn_free;
    b->cudnn.stream_sync = cudnn_sync;
    if (b->host.kernel_cache) snprintf(b->cache_dir, sizeof b->cache_dir, "%s", b->host.kernel_cache);
    if ((e = cuStreamCreate(&b->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
        b->stream = NULL;
        return fail_cuda(b, e, "creating a stream");
    }
    for (int s = 0; s < STAGE_SLOTS; s++)
        if ((e = cuEventCreate(&b->stage_done[s], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
            b->stage_done[s] = NULL;
            return fail_cuda(b, e, "creating an event");
        }
    cublasStatus_t st = cublasLtCreate(&b->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        b->lt = NULL;
        return fail_cublas(b, st, "creating the cuBLASLt handle");
    }
    /* A fixed workspace: cuBLASLt picks the same algorithm (hence the same bits) every run. */
    b->lt_ws_bytes = (size_t)32 << 20;
    if (!(b->lt_ws = dev_alloc(b, b->lt_ws_bytes, "the cuBLASLt workspace"))) return -H3_E_NOMEM;
    int rc = lt_plans_init(b);
    if (rc) return rc;
    /* The knobs come from libh3 (h3_backend_host, read once by h3_init), never from getenv here. */
    const char *impl = b->host.cuda_attention;
    h3_cudnn_set_lib(b->host.cudnn_lib);
    if (!impl || !*impl || !strcmp(impl, "auto"))
        b->attn_impl = ATTN_AUTO;
    else if (!strcmp(impl, "own"))
        b->attn_impl = ATTN_OWN;
    else if (!strcmp(impl, "cudnn"))
        b->attn_impl = ATTN_CUDNN;
    else
        return fail(b, H3_E_INVALID, "cuda: H3_CUDA_ATTENTION=%s (expected auto, own or cudnn)", impl);
    /* H3_CUDA_ROWS=scalar keeps the row kernels on their element-at-a-time versions and the
       transformer's residual add apart from the next norm (the path before vectorisation). */
    const char *rows = b->host.cuda_rows;
    if (rows && *rows && strcmp(rows, "scalar") && strcmp(rows, "auto"))
        return fail(b, H3_E_INVALID, "cuda: H3_CUDA_ROWS=%s (expected auto or scalar)", rows);
    b->rows_scalar = rows && !strcmp(rows, "scalar");
    why[0] = '\0';
    const bool cudnn = b->attn_impl != ATTN_OWN && h3_cudnn_sdpa_available(&b->cudnn, why, sizeof why);
    if (b->attn_impl == ATTN_CUDNN && !cudnn)
        return fail(b, H3_E_UNSUPPORTED, "cuda: H3_CUDA_ATTENTION=cudnn, but %s", why);
    /* fp8 attention is cuDNN's fp8 SDPA (Hopper and newer), whatever H3_CUDA_ATTENTION picks for bf16. */
    char why8[300] = "";
    if (major < 9)
        snprintf(b->base.attn_fp8_why, sizeof b->base.attn_fp8_why,
                 "cuDNN's fp8 attention needs compute capability 9.0 or newer; this GPU is %d.%d", major,
                 minor);
    else if (!(cudnn || h3_cudnn_sdpa_available(&b->cudnn, why8, sizeof why8)))
        snprintf(b->base.attn_fp8_why, sizeof b->base.attn_fp8_why, "it runs on cuDNN, and %.170s",
                 why[0] ? why : why8);
    b->base.attn_cudnn = cudnn;
    snprintf(b->base.attn_cudnn_info, sizeof b->base.attn_cudnn_info, "%s",
             why[0] ? why : why8[0] ? why8 : "not asked (H3_CUDA_ATTENTION=own)");
    b->base.driver_version = drv;
    snprintf(b->base.desc, sizeof b->base.desc, "cuda (%.60s, sm_%d%d, %.1f GiB, %s attention)", b->name, major,
             minor, (double)total / (1024.0 * 1024.0 * 1024.0), cudnn ? "cuDNN" : "own");
    b->base.name = "cuda";
    b->base.abi_version = H3_BACKEND_ABI;
    /* weight_load_fp8 is there on every GPU and refuses, naming the need, below compute capability 8.9. */
    b->base.caps = H3_CAP_PINNED | H3_CAP_MEM_PEAK | H3_CAP_FP8_WEIGHTS | H3_CAP_RINGS | H3_CAP_PACKED_RING |
                   H3_CAP_WSTREAM | H3_CAP_DECODERS;
    b->base.is_host = false;
    b->base.mem = &cuda_mem;
    b->base.weights = &cuda_weights;
    b->base.ops = &cuda_ops;
    b->base.dec = &cuda_dec;
    b->base.destroy = be_destroy;
    b->base.act_dtype = H3_DT_BF16;
    b->base.compute_capability = major * 10 + minor;
    /* h3ctl warmup: every module now, with progress; otherwise each compiles at its first use. */
    if (b->host.warmup && (rc = kernels_warmup(b))) return rc;
    return 0;
}

} /* namespace h3cuda */

/* The compute stream every op and dcopy of this backend runs on (a CUstream): the NCCL communicator
   (cuda_nccl.cpp, through libh3's backend.c) queues its collectives there, so they are ordered with the ops. */
extern "C" __attribute__((visibility("default"))) void *h3_backend_cuda_stream(h3_backend *be)
{
    return be ? (void *)h3cuda::B(be)->stream : NULL;
}

/* The ABI this library was built for: libh3 reads it before calling anything else here. */
extern "C" __attribute__((visibility("default"))) uint32_t h3_backend_cuda_abi(void) { return H3_BACKEND_ABI; }

extern "C" __attribute__((visibility("default"))) int h3_backend_cuda_create(const h3_backend_host *host,
                                                                             int device_ordinal, h3_backend **out)
{
    using namespace h3cuda;
    if (out) *out = NULL;
    /* Without the host's error callback there is no way to say what went wrong. */
    if (!host || !out || host->struct_size < sizeof(h3_backend_host) || !host->err)
        return -H3_E_INVALID;
    Backend *b = (Backend *)calloc(1, sizeof(Backend));
    if (!b) return host->err(H3_E_NOMEM, "cuda: out of host memory creating the backend");
    memcpy(&b->host, host, sizeof(h3_backend_host));
    b->host.struct_size = sizeof(h3_backend_host);
    /* The ABI check has made sure the host's struct is this one. */
    int rc = create(b, device_ordinal);
    /* The knob strings are the host's, valid during this call only. */
    b->host.cuda_attention = b->host.cuda_rows = b->host.cudnn_lib = NULL;
    b->host.libcuda = b->host.nvrtc_lib = b->host.cublaslt_lib = b->host.kernel_cache = NULL;
    if (rc) {
        release_all(b);
        return rc;
    }
    *out = &b->base;
    return 0;
}
