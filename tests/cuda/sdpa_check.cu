/*
 * sdpa_check: cuDNN's fused attention (h3_cudnn_sdpa, libh3/backend/cuda/cuda_sdpa_cudnn.cu) against
 * a plain f32 reference and against the CUDA backend's own flash kernel, with timings. Needs a GPU:
 *
 *   make build/sdpa_check [CUDNN_INC=... CUDNN_FE_INC=...]
 *   build/sdpa_check [--runs N] [--quick]        (--quick skips the 37,838-token case)
 *
 * cuDNN is loaded at run time (H3_CUDNN_LIB, else libcudnn.so.9 on the loader path); without it the
 * cuDNN rows say why and only the own kernel is measured. The own kernel is reached through the
 * backend's ops table (h3_backend_cuda_create) with H3_CUDA_ATTENTION=own, so it is the own kernel
 * whatever the default dispatch is.
 *
 * Inputs: random bf16 Q, K, V (uniform, unit variance), scale 1/sqrt(D), in the layout of backend.h's
 * attention op. Checks, per case:
 *   - rel-L2 (||x - ref|| / ||ref||) and max |x - ref| of cuDNN's and the own kernel's outputs against
 *     an f32 reference kernel written here: all query rows up to 2,048, else 48 rows spread over the
 *     sequence (first and last included); pass below 1e-2;
 *   - padding columns of O (when its rows are longer than heads*D) left untouched;
 *   - two runs of the same call give the same bits (determinism);
 *   - cuDNN vs the own kernel over all rows (rel-L2, informative).
 * Timing (cases of 1,024 tokens or more): CUDA events around each call on the backend's stream,
 * median of --runs (default 20) after 3 warm-up calls; TFLOP/s = 4 Lq Lk heads D / time (the causal
 * cases do about half that work). The first cuDNN call of a shape builds its graph: its host time
 * is printed apart.
 *
 * Exit status 0 when every check passed; the last line is "N passed, N failed[, N skipped]".
 */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sdpa.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" int h3_backend_cuda_create(const h3_backend_host *host, int device_ordinal, h3_backend **out);

/* ---- host callbacks of the backend ------------------------------------------------------------ */

static char g_backend_err[1024];

static int host_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_backend_err, sizeof g_backend_err, fmt, ap);
    va_end(ap);
    return -code;
}

static void host_noise(uint64_t, uint32_t, uint64_t, float *out, int64_t n) { memset(out, 0, (size_t)n * 4); }

/* ---- results ---------------------------------------------------------------------------------- */

static int g_passed, g_failed, g_skipped;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  [%s] ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok)
        g_passed++;
    else
        g_failed++;
}

static void skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  [skip] ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    g_skipped++;
}

#define CK(x)                                                                                                         \
    do {                                                                                                              \
        cudaError_t e_ = (x);                                                                                         \
        if (e_ != cudaSuccess) {                                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                       \
            exit(2);                                                                                                  \
        }                                                                                                             \
    } while (0)

/* ---- device helpers --------------------------------------------------------------------------- */

static __device__ __forceinline__ uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* n bf16 values, uniform on [-sqrt 3, sqrt 3) (unit variance), from (seed, index). */
__global__ void fill_random(__nv_bfloat16 *p, int64_t n, uint64_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double u = (double)(mix64(seed * 0x100000001B3ull ^ (uint64_t)i) >> 11) * (1.0 / 9007199254740992.0);
        p[i] = __float2bfloat16_rn((float)((2.0 * u - 1.0) * 1.7320508075688772));
    }
}

__global__ void fill_bits(uint16_t *p, int64_t n, uint16_t v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = v;
}

static __device__ float block_reduce(float v, bool is_max, float *red)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            const float w = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    const float r = red[0];
    __syncthreads();
    return r;
}

/* The reference: one block per (listed query row, head), f32 throughout, scores kept in `scratch`
   (one row of Lk floats per block). out [nrows, heads*D] f32. Causal: query i sees keys
   j <= i + Lk - Lq; a row that sees none is zero. */
__global__ void reference_attention(const __nv_bfloat16 *Q, const __nv_bfloat16 *K, const __nv_bfloat16 *V,
                                    int64_t ldq, int64_t ldk, int64_t ldv, const int *rows, int nrows, int Lq, int Lk,
                                    int heads, int group, int D, float scale, int causal, float *scratch, float *out)
{
    extern __shared__ float sh[]; /* q [D], reduction [32] */
    float *q = sh, *red = sh + D;
    const int r = blockIdx.x, h = blockIdx.y, kvh = h / group, i = rows[r];
    const __nv_bfloat16 *qr = Q + (int64_t)i * ldq + (int64_t)h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) q[d] = __bfloat162float(qr[d]);
    __syncthreads();
    float *s = scratch + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * Lk;
    const int kend = causal ? min(Lk, i + Lk - Lq + 1) : Lk;
    float *o = out + (int64_t)r * heads * D + (int64_t)h * D;
    if (kend <= 0) {
        for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < kend; j += blockDim.x) {
        const __nv_bfloat16 *kr = K + (int64_t)j * ldk + (int64_t)kvh * D;
        float acc = 0.0f;
        for (int d = 0; d < D; d++) acc = fmaf(q[d], __bfloat162float(kr[d]), acc);
        acc *= scale;
        s[j] = acc;
        mx = fmaxf(mx, acc);
    }
    mx = block_reduce(mx, true, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < kend; j += blockDim.x) {
        const float p = expf(s[j] - mx);
        s[j] = p;
        sum += p;
    }
    sum = block_reduce(sum, false, red); /* its barriers also publish s[] to the block */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        const __nv_bfloat16 *vc = V + (int64_t)kvh * D + d;
        for (int j = 0; j < kend; j++) acc = fmaf(s[j], __bfloat162float(vc[(int64_t)j * ldv]), acc);
        o[d] = acc / sum;
    }
}

/* Over rows x cols of two bf16 matrices (ld each): partial sums of (a-b)^2 and b^2 per block, and
   the count of elements whose bits differ. */
__global__ void compare_bf16(const __nv_bfloat16 *a, int64_t lda, const __nv_bfloat16 *b, int64_t ldb, int64_t rows,
                             int64_t cols, double *part, unsigned long long *diffbits)
{
    __shared__ double sd[256], sr[256];
    __shared__ unsigned long long sc[256];
    double d2 = 0.0, r2 = 0.0;
    unsigned long long c = 0;
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t rr = i / cols, cc = i % cols;
        const __nv_bfloat16 x = a[rr * lda + cc], y = b[rr * ldb + cc];
        const double dx = (double)__bfloat162float(x) - (double)__bfloat162float(y);
        d2 += dx * dx;
        r2 += (double)__bfloat162float(y) * (double)__bfloat162float(y);
        c += *reinterpret_cast<const uint16_t *>(&x) != *reinterpret_cast<const uint16_t *>(&y);
    }
    sd[threadIdx.x] = d2;
    sr[threadIdx.x] = r2;
    sc[threadIdx.x] = c;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sd[threadIdx.x] += sd[threadIdx.x + s];
            sr[threadIdx.x] += sr[threadIdx.x + s];
            sc[threadIdx.x] += sc[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[2 * blockIdx.x] = sd[0];
        part[2 * blockIdx.x + 1] = sr[0];
        diffbits[blockIdx.x] = sc[0];
    }
}

struct Compare {
    double rel_l2;
    unsigned long long diff_bits;
};

static Compare compare_all(const void *a, int64_t lda, const void *b, int64_t ldb, int64_t rows, int64_t cols)
{
    const int blocks = 512;
    double *part;
    unsigned long long *cnt;
    CK(cudaMalloc(&part, blocks * 2 * sizeof(double)));
    CK(cudaMalloc(&cnt, blocks * sizeof(unsigned long long)));
    compare_bf16<<<blocks, 256>>>((const __nv_bfloat16 *)a, lda, (const __nv_bfloat16 *)b, ldb, rows, cols, part, cnt);
    CK(cudaGetLastError());
    std::vector<double> hp(blocks * 2);
    std::vector<unsigned long long> hc(blocks);
    CK(cudaMemcpy(hp.data(), part, hp.size() * sizeof(double), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), cnt, hc.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    cudaFree(part);
    cudaFree(cnt);
    double d2 = 0, r2 = 0;
    unsigned long long c = 0;
    for (int i = 0; i < blocks; i++) {
        d2 += hp[2 * i];
        r2 += hp[2 * i + 1];
        c += hc[i];
    }
    Compare out;
    out.rel_l2 = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    out.diff_bits = c;
    return out;
}

/* ---- one case --------------------------------------------------------------------------------- */

struct Case {
    const char *name;
    int64_t Lq, Lk;
    int heads, kv_heads, D;
    int causal;
    int packed; /* Q, K, V as column blocks of one [L, 3*heads*D] qkv buffer; O rows padded by 64 */
    int must;   /* cuDNN must take it (the transformer's kind of call); else a refusal is a skip */
};

static const uint16_t SENTINEL = 0x7FC1; /* a bf16 NaN no kernel writes */

static float bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Median of `runs` timed calls (after 3 untimed) on stream s, in milliseconds; NAN when a call
   fails. */
static double time_ms(cudaStream_t s, int runs, const std::function<int()> &call)
{
    for (int i = 0; i < 3; i++)
        if (call()) return NAN;
    std::vector<cudaEvent_t> ev(2 * runs);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    for (int i = 0; i < runs; i++) {
        CK(cudaEventRecord(ev[2 * i], s));
        if (call()) return NAN;
        CK(cudaEventRecord(ev[2 * i + 1], s));
    }
    CK(cudaStreamSynchronize(s));
    std::vector<double> t(runs);
    for (int i = 0; i < runs; i++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        t[i] = ms;
    }
    for (auto &e : ev) cudaEventDestroy(e);
    std::sort(t.begin(), t.end());
    return runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
}

struct Timing {
    const char *name;
    double cudnn_ms, own_ms, flops;
};

static std::vector<Timing> g_timings;

static void run_case(const Case &c, h3_backend *be, cudaStream_t s, bool have_cudnn, int runs)
{
    const int64_t A = (int64_t)c.heads * c.D, AK = (int64_t)c.kv_heads * c.D;
    printf("\n== %s: Lq %lld, Lk %lld, %d heads (%d kv) x %d%s%s\n", c.name, (long long)c.Lq, (long long)c.Lk, c.heads,
           c.kv_heads, c.D, c.causal ? ", causal" : "", c.packed ? ", packed qkv rows, padded O rows" : "");
    const float scale = 1.0f / sqrtf((float)c.D);

    /* Inputs. */
    int64_t ldq, ldk, ldv, ldo = c.packed ? A + 64 : A;
    __nv_bfloat16 *qbuf = NULL, *kbuf = NULL, *vbuf = NULL, *Q, *K, *V;
    if (c.packed) {
        const int64_t ld = A + 2 * AK;
        CK(cudaMalloc(&qbuf, (size_t)(c.Lq * ld) * 2));
        fill_random<<<1024, 256>>>(qbuf, c.Lq * ld, 11);
        Q = qbuf;
        K = qbuf + A;
        V = qbuf + A + AK;
        ldq = ldk = ldv = ld;
    } else {
        CK(cudaMalloc(&qbuf, (size_t)(c.Lq * A) * 2));
        CK(cudaMalloc(&kbuf, (size_t)(c.Lk * AK) * 2));
        CK(cudaMalloc(&vbuf, (size_t)(c.Lk * AK) * 2));
        fill_random<<<1024, 256>>>(qbuf, c.Lq * A, 1);
        fill_random<<<1024, 256>>>(kbuf, c.Lk * AK, 2);
        fill_random<<<1024, 256>>>(vbuf, c.Lk * AK, 3);
        Q = qbuf;
        K = kbuf;
        V = vbuf;
        ldq = A;
        ldk = ldv = AK;
    }
    CK(cudaGetLastError());
    const size_t obytes = (size_t)(c.Lq * ldo) * 2;
    void *o_cudnn[2], *o_own[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&o_cudnn[i], obytes));
        CK(cudaMalloc(&o_own[i], obytes));
        fill_bits<<<1024, 256>>>((uint16_t *)o_cudnn[i], c.Lq * ldo, SENTINEL);
        fill_bits<<<1024, 256>>>((uint16_t *)o_own[i], c.Lq * ldo, SENTINEL);
    }
    CK(cudaDeviceSynchronize());

    /* Reference rows. */
    std::vector<int> rows;
    if (c.Lq <= 2048) {
        for (int i = 0; i < (int)c.Lq; i++) rows.push_back(i);
    } else {
        const int n = 48;
        for (int k = 0; k < n; k++) rows.push_back((int)((c.Lq - 1) * k / (n - 1)));
    }
    const int nrows = (int)rows.size();
    std::vector<float> ref((size_t)nrows * A);
    {
        int *drows;
        float *dref;
        CK(cudaMalloc(&drows, nrows * sizeof(int)));
        CK(cudaMalloc(&dref, ref.size() * sizeof(float)));
        CK(cudaMemcpy(drows, rows.data(), nrows * sizeof(int), cudaMemcpyHostToDevice));
        /* Rows in chunks so the scores scratch stays near 256 MiB. */
        const int64_t per_row = (int64_t)c.heads * c.Lk * 4;
        int chunk = (int)std::max<int64_t>(1, std::min<int64_t>(nrows, ((int64_t)256 << 20) / per_row));
        float *scratch;
        CK(cudaMalloc(&scratch, (size_t)chunk * per_row));
        for (int r0 = 0; r0 < nrows; r0 += chunk) {
            const int n = std::min(chunk, nrows - r0);
            dim3 grid((unsigned)n, (unsigned)c.heads);
            reference_attention<<<grid, 256, (c.D + 32) * sizeof(float)>>>(
                Q, K, V, ldq, ldk, ldv, drows + r0, n, (int)c.Lq, (int)c.Lk, c.heads, c.heads / c.kv_heads, c.D, scale,
                c.causal, scratch, dref + (size_t)r0 * A);
            CK(cudaGetLastError());
        }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ref.data(), dref, ref.size() * sizeof(float), cudaMemcpyDeviceToHost));
        cudaFree(scratch);
        cudaFree(drows);
        cudaFree(dref);
    }

    /* The outputs at the reference rows against the reference, and the padding columns. */
    auto against_ref = [&](const char *who, const void *O) {
        std::vector<uint16_t> row((size_t)ldo);
        double d2 = 0, r2 = 0, maxabs = 0;
        long long pad_touched = 0, nonfinite = 0;
        for (int k = 0; k < nrows; k++) {
            CK(cudaMemcpy(row.data(), (const uint16_t *)O + (size_t)rows[k] * ldo, (size_t)ldo * 2,
                          cudaMemcpyDeviceToHost));
            for (int64_t j = 0; j < A; j++) {
                const double x = bf16_to_float(row[j]), y = ref[(size_t)k * A + j];
                if (!std::isfinite(x)) nonfinite++;
                d2 += (x - y) * (x - y);
                r2 += y * y;
                maxabs = std::max(maxabs, fabs(x - y));
            }
            for (int64_t j = A; j < ldo; j++) pad_touched += row[j] != SENTINEL;
        }
        const double rel = sqrt(d2 / (r2 > 0 ? r2 : 1));
        check(nonfinite == 0 && rel < 1e-2, "%-6s vs f32 reference (%d rows): rel-L2 %.2e, max abs err %.2e%s", who,
              nrows, rel, maxabs, nonfinite ? " (non-finite values)" : "");
        if (ldo > A) check(pad_touched == 0, "%-6s left O's padding columns alone (%lld touched)", who, pad_touched);
    };

    /* cuDNN. */
    char err[512] = "";
    bool cudnn_ok = false;
    double cudnn_ms = NAN, own_ms = NAN;
    auto call_cudnn = [&](void *O) {
        return h3_cudnn_sdpa(s, Q, K, V, O, c.Lq, c.Lk, c.heads, c.kv_heads, c.D, ldq, ldk, ldv, ldo, scale, c.causal,
                             err, sizeof err);
    };
    if (!have_cudnn) {
        skip("cudnn: not available");
    } else {
        const auto t0 = std::chrono::steady_clock::now();
        int rc = call_cudnn(o_cudnn[0]);
        if (rc == 0) rc = cudaStreamSynchronize(s) == cudaSuccess ? 0 : -1;
        const std::chrono::duration<double, std::milli> build_ms = std::chrono::steady_clock::now() - t0;
        if (rc && !c.must) {
            skip("cudnn refused it (the own kernel would run): %s (rc %d)", err, rc);
        } else if (rc) {
            check(false, "cudnn: %s (rc %d)", err, rc);
        } else {
            cudnn_ok = true;
            printf("  cudnn: first call (graph build + run) %.1f ms\n", build_ms.count());
            against_ref("cudnn", o_cudnn[0]);
            rc = call_cudnn(o_cudnn[1]);
            CK(cudaStreamSynchronize(s));
            const Compare d = compare_all(o_cudnn[1], ldo, o_cudnn[0], ldo, c.Lq, A);
            check(rc == 0 && d.diff_bits == 0, "cudnn  same bits on a second run (%llu of %lld differ)", d.diff_bits,
                  (long long)(c.Lq * A));
            if (c.Lq >= 1024) cudnn_ms = time_ms(s, runs, [&] { return call_cudnn(o_cudnn[1]); });
        }
    }

    /* The own kernel, through the backend's ops table. */
    if (!be) {
        skip("own: the CUDA backend could not be created: %s", g_backend_err);
    } else {
        const h3_bt qv = h3_bt_make(Q, H3_DT_BF16, c.Lq, A, ldq), kv = h3_bt_make(K, H3_DT_BF16, c.Lk, AK, ldk),
                    vv = h3_bt_make(V, H3_DT_BF16, c.Lk, AK, ldv);
        auto call_own = [&](void *O) {
            const h3_bt ov = h3_bt_make(O, H3_DT_BF16, c.Lq, A, ldo);
            return be->ops->attention(be, &qv, &kv, &vv, c.heads, c.kv_heads, c.D, scale, c.causal != 0, &ov);
        };
        int rc = call_own(o_own[0]);
        if (rc == 0) rc = be->mem->sync(be);
        if (rc) {
            check(false, "own: %s (rc %d)", g_backend_err, rc);
        } else {
            against_ref("own", o_own[0]);
            rc = call_own(o_own[1]);
            if (rc == 0) rc = be->mem->sync(be);
            const Compare d = compare_all(o_own[1], ldo, o_own[0], ldo, c.Lq, A);
            check(rc == 0 && d.diff_bits == 0, "own    same bits on a second run (%llu of %lld differ)", d.diff_bits,
                  (long long)(c.Lq * A));
            if (c.Lq >= 1024) own_ms = time_ms(s, runs, [&] { return call_own(o_own[1]); });
            if (cudnn_ok) {
                const Compare x = compare_all(o_cudnn[0], ldo, o_own[0], ldo, c.Lq, A);
                printf("  cudnn vs own, all %lld rows: rel-L2 %.2e (%llu elements differ in bits)\n", (long long)c.Lq,
                       x.rel_l2, x.diff_bits);
            }
        }
    }

    if (c.Lq >= 1024) {
        const double flops = 4.0 * (double)c.Lq * (double)c.Lk * c.heads * c.D;
        printf("  time (median of %d): cudnn %.3f ms (%.1f TFLOP/s), own %.3f ms (%.1f TFLOP/s)\n", runs, cudnn_ms,
               flops / cudnn_ms * 1e-9, own_ms, flops / own_ms * 1e-9);
        g_timings.push_back({c.name, cudnn_ms, own_ms, flops});
    }

    for (int i = 0; i < 2; i++) {
        cudaFree(o_cudnn[i]);
        cudaFree(o_own[i]);
    }
    cudaFree(qbuf);
    if (kbuf) cudaFree(kbuf);
    if (vbuf) cudaFree(vbuf);
}

/* ---- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    int runs = 20;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = std::max(1, atoi(argv[++i]));
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else {
            fprintf(stderr, "usage: %s [--runs N] [--quick]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* The own kernel, whatever the backend's default attention is. */
    setenv("H3_CUDA_ATTENTION", "own", 1);
    h3_backend_host host;
    memset(&host, 0, sizeof host);
    host.struct_size = sizeof host;
    host.err = host_err;
    host.noise = host_noise;
    h3_backend *be = NULL;
    if (h3_backend_cuda_create(&host, 0, &be) != 0) be = NULL;
    cudaStream_t s;
    if (be) {
        s = h3cuda::B(be)->stream;
        printf("backend: %s\n", be->desc);
    } else {
        printf("backend: not created: %s\n", g_backend_err);
        CK(cudaSetDevice(0));
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }

    char why[512];
    h3_cudnn_set_lib(getenv("H3_CUDNN_LIB")); /* libh3 passes it at create; this check calls cuDNN directly */
    const bool have_cudnn = h3_cudnn_sdpa_available(why, sizeof why) != 0;
    printf("cudnn: %s%s\n", have_cudnn ? "" : "not available: ", why);

    /* Refusals the caller falls back on: a negative code and a reason, nothing run. */
    {
        char err[256];
        void *p = (void *)256; /* never dereferenced: both calls are refused up front */
        int rc = h3_cudnn_sdpa(s, p, p, p, p, 8, 8, 2, 2, 36, 72, 72, 72, 72, 0.1f, 0, err, sizeof err);
        check(rc < 0 && err[0], "refuses head dim 36: rc %d, \"%s\"", rc, err);
        rc = h3_cudnn_sdpa(s, p, p, p, p, 16, 8, 2, 2, 64, 128, 128, 128, 128, 0.1f, 1, err, sizeof err);
        check(rc < 0 && err[0], "refuses causal with more queries than keys: rc %d, \"%s\"", rc, err);
    }

    const Case cases[] = {
        {"small, D=64", 17, 17, 3, 3, 64, 0, 0, 1},
        {"small, D=128", 17, 17, 3, 3, 128, 0, 0, 1},
        {"L=300, D=64", 300, 300, 3, 3, 64, 0, 0, 1},
        {"L=300, D=128", 300, 300, 3, 3, 128, 0, 0, 1},
        {"L=300, D=128, causal", 300, 300, 3, 3, 128, 1, 0, 0},
        {"L=300, D=128, GQA 6/2", 300, 300, 6, 2, 128, 0, 0, 0},
        {"Lq=17, Lk=300, D=64", 17, 300, 3, 3, 64, 0, 0, 0},
        {"Lq=17, Lk=300, D=128, causal", 17, 300, 3, 3, 128, 1, 0, 0},
        {"L=300, D=128, strided", 300, 300, 3, 3, 128, 0, 1, 0},
        {"512x512x22 (1,874 tokens)", 1874, 1874, 56, 56, 128, 0, 0, 1},
        {"864x480x56 (7,135 tokens)", 7135, 7135, 56, 56, 128, 0, 0, 1},
        {"1344x768x124 (37,838 tokens)", 37838, 37838, 56, 56, 128, 0, 0, 1},
    };
    for (const Case &c : cases) {
        if (quick && c.Lq > 10000) continue;
        run_case(c, be, s, have_cudnn, runs);
    }

    printf("\n%-30s %12s %10s %12s %10s %8s\n", "attention (56 x 128)", "cudnn ms", "TFLOP/s", "own ms", "TFLOP/s",
           "speedup");
    for (const Timing &t : g_timings) {
        printf("%-30s %12.3f %10.1f %12.3f %10.1f %7.2fx\n", t.name, t.cudnn_ms, t.flops / t.cudnn_ms * 1e-9, t.own_ms,
               t.flops / t.own_ms * 1e-9, t.own_ms / t.cudnn_ms);
    }

    if (be) be->destroy(be);
    printf("\n%d passed, %d failed, %d skipped\n", g_passed, g_failed, g_skipped);
    return g_failed ? 1 : 0;
}
