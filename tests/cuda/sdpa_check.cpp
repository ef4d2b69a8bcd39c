/*
 * sdpa_check: cuDNN's fused attention (h3_cudnn_sdpa, libh3/backend/cuda/cuda_sdpa_cudnn.cpp) against
 * a double-precision reference computed on the CPU and against the CUDA backend's own flash kernel,
 * with timings. Needs a GPU; needs no CUDA header or toolkit to build (plain C++17, the driver API
 * opened at run time):
 *
 *   make lib cuda build/sdpa_check
 *   tests/cuda/run_sdpa_check.sh [--runs N] [--quick]    (finds the nvidia wheels' libraries; --quick
 *                                                       skips the 37,838-token case)
 *
 * cuDNN is loaded at run time (H3_CUDNN_LIB, else libcudnn.so.9 on the loader path); without it the
 * cuDNN rows say why and only the own kernel is measured. The own kernel is reached through the
 * backend's ops table (libh3_cuda, H3_CUDA_LIB or python/h3ctl/libh3_cuda.so) created with
 * H3_CUDA_ATTENTION=own, so it is the own kernel whatever the default dispatch is.
 *
 * Inputs: random bf16 Q, K, V (uniform, unit variance), scale 1/sqrt(D), in the layout of backend.h's
 * attention op. Checks, per case:
 *   - rel-L2 (||x - ref|| / ||ref||) and max |x - ref| of cuDNN's and the own kernel's outputs against
 *     the double reference: all query rows up to 2,048, else 48 rows spread over the sequence (first
 *     and last included); pass below 1e-2;
 *   - padding columns of O (when its rows are longer than heads*D) left untouched;
 *   - two runs of the same call give the same bits (determinism);
 *   - cuDNN vs the own kernel over all rows (rel-L2, informative).
 * Timing (cases of 1,024 tokens or more): wall time of --runs (default 20) back-to-back calls after 3
 * warm-up calls, up to the stream's end, divided by the runs (the same for both kernels); TFLOP/s =
 * 4 Lq Lk heads D / time (the causal cases do about half that work). The first cuDNN call of a shape
 * builds its graph: its host time is printed apart.
 *
 * Exit status 0 when every check passed; the last line is "N passed, N failed[, N skipped]".
 */
#include "backend/backend.h"
#include "backend/cuda/cuda_sdpa.h"
#include "h3.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

/* ---- the driver API subset (cuda.h's names and values; opened with dlopen) ----------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
enum { CU_STREAM_NON_BLOCKING = 1 };

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*CtxSynchronize)(void);
    CUresult (*GetErrorString)(CUresult, const char **);
} cu;

static void die(const char *what, CUresult e)
{
    const char *s = "?";
    if (cu.GetErrorString) cu.GetErrorString(e, &s);
    fprintf(stderr, "sdpa_check: %s: CUDA error %d (%s)\n", what, e, s);
    exit(2);
}
#define CK(x)                                  \
    do {                                       \
        CUresult e_ = (x);                     \
        if (e_ != 0) die(#x, e_);              \
    } while (0)

static bool load_driver(std::string *why)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        *why = dlerror();
        return false;
    }
    struct {
        const char *name;
        void **slot;
    } fns[] = {
        {"cuInit", (void **)&cu.Init},
        {"cuDeviceGet", (void **)&cu.DeviceGet},
        {"cuDeviceGetAttribute", (void **)&cu.DeviceGetAttribute},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.DevicePrimaryCtxRetain},
        {"cuCtxSetCurrent", (void **)&cu.CtxSetCurrent},
        {"cuMemAlloc_v2", (void **)&cu.MemAlloc},
        {"cuMemFree_v2", (void **)&cu.MemFree},
        {"cuMemcpyHtoD_v2", (void **)&cu.MemcpyHtoD},
        {"cuMemcpyDtoH_v2", (void **)&cu.MemcpyDtoH},
        {"cuMemsetD16_v2", (void **)&cu.MemsetD16},
        {"cuStreamCreate", (void **)&cu.StreamCreate},
        {"cuStreamSynchronize", (void **)&cu.StreamSynchronize},
        {"cuCtxSynchronize", (void **)&cu.CtxSynchronize},
        {"cuGetErrorString", (void **)&cu.GetErrorString},
    };
    for (auto &f : fns) {
        *f.slot = dlsym(h, f.name);
        if (!*f.slot) {
            *why = std::string("libcuda.so.1 has no ") + f.name;
            return false;
        }
    }
    return true;
}

/* ---- the cuDNN path's host callbacks ------------------------------------------------------------ */
static int host_alloc(void *, size_t bytes, void **out)
{
    CUdeviceptr p = 0;
    if (cu.MemAlloc(&p, bytes) != 0) return -H3_E_NOMEM;
    *out = (void *)(uintptr_t)p;
    return 0;
}
static void host_free(void *, void *p) { cu.MemFree((CUdeviceptr)(uintptr_t)p); }
static int host_sync(void *, void *s) { return cu.StreamSynchronize((CUstream)s) == 0 ? 0 : -H3_E_UNSUPPORTED; }

/* ---- the backend's host callbacks --------------------------------------------------------------- */
static char g_backend_err[1024];
static int backend_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_backend_err, sizeof g_backend_err, fmt, ap);
    va_end(ap);
    return -code;
}
static void backend_noise(uint64_t, uint32_t, uint64_t, float *out, int64_t n) { memset(out, 0, (size_t)n * 4); }

/* The library paths of ABI 3's host struct, where this tree's backend.h has them (compiles with
   either layout). */
template <typename T> auto set_paths(T &h, int) -> decltype(h.nvrtc_lib = nullptr, void())
{
    h.libcuda = getenv("H3_LIBCUDA");
    h.nvrtc_lib = getenv("H3_NVRTC_LIB");
    h.cublaslt_lib = getenv("H3_CUBLASLT_LIB");
    h.kernel_cache = getenv("H3_KERNEL_CACHE");
}
template <typename T> void set_paths(T &, long) {}

/* ---- results ------------------------------------------------------------------------------------ */
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
    (ok ? g_passed : g_failed)++;
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

/* ---- host data ---------------------------------------------------------------------------------- */
static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even (no NaN here) */
    return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n bf16 values, uniform on [-sqrt 3, sqrt 3) (unit variance), from (seed, index). */
static void fill_random(std::vector<uint16_t> &v, uint64_t seed)
{
    for (size_t i = 0; i < v.size(); i++) {
        const double u = (double)(mix64(seed * 0x100000001B3ull ^ (uint64_t)i) >> 11) * (1.0 / 9007199254740992.0);
        v[i] = to_bf16((float)((2.0 * u - 1.0) * 1.7320508075688772));
    }
}

static const uint16_t SENTINEL = 0x7FC1; /* a bf16 NaN no kernel writes */

/* Runs fn(i) for i in [0, n) on all cores. */
static void parallel_for(int n, const std::function<void(int)> &fn)
{
    const int t = std::max(1, std::min(n, (int)std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int w = 0; w < t; w++)
        th.emplace_back([&, w] {
            for (int i = w; i < n; i += t) fn(i);
        });
    for (auto &x : th) x.join();
}

struct Case {
    const char *name;
    int64_t Lq, Lk;
    int heads, kv_heads, D;
    int causal;
    int packed; /* Q, K, V as column blocks of one [L, 3*heads*D] qkv buffer; O rows padded by 64 */
    int must;   /* cuDNN must take it (the transformer's kind of call); else a refusal is a skip */
};

struct Timing {
    const char *name;
    double cudnn_ms, own_ms, flops;
};
static std::vector<Timing> g_timings;

static double batch_ms(int runs, const std::function<int()> &call, const std::function<int()> &drain)
{
    for (int i = 0; i < 3; i++)
        if (call()) return NAN;
    if (drain()) return NAN;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < runs; i++)
        if (call()) return NAN;
    if (drain()) return NAN;
    const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0;
    return t.count() / runs;
}

static void run_case(const Case &c, h3_backend *be, CUstream s, const h3_cudnn_host *ch, bool have_cudnn, int runs)
{
    const int64_t A = (int64_t)c.heads * c.D, AK = (int64_t)c.kv_heads * c.D;
    printf("\n== %s: Lq %lld, Lk %lld, %d heads (%d kv) x %d%s%s\n", c.name, (long long)c.Lq, (long long)c.Lk, c.heads,
           c.kv_heads, c.D, c.causal ? ", causal" : "", c.packed ? ", packed qkv rows, padded O rows" : "");
    const float scale = 1.0f / sqrtf((float)c.D);

    /* Inputs, on the host (for the reference) and on the device. */
    const int64_t ldo = c.packed ? A + 64 : A;
    int64_t ldq, ldk, ldv;
    std::vector<uint16_t> hq, hk, hv;
    CUdeviceptr dq = 0, dk = 0, dv = 0;
    const uint16_t *Qh, *Kh, *Vh;
    void *Q, *K, *V;
    if (c.packed) {
        const int64_t ld = A + 2 * AK;
        hq.resize((size_t)(c.Lq * ld));
        fill_random(hq, 11);
        CK(cu.MemAlloc(&dq, hq.size() * 2));
        CK(cu.MemcpyHtoD(dq, hq.data(), hq.size() * 2));
        Qh = hq.data(), Kh = hq.data() + A, Vh = hq.data() + A + AK;
        Q = (void *)(uintptr_t)dq, K = (char *)Q + A * 2, V = (char *)Q + (A + AK) * 2;
        ldq = ldk = ldv = ld;
    } else {
        hq.resize((size_t)(c.Lq * A));
        hk.resize((size_t)(c.Lk * AK));
        hv.resize((size_t)(c.Lk * AK));
        fill_random(hq, 1), fill_random(hk, 2), fill_random(hv, 3);
        CK(cu.MemAlloc(&dq, hq.size() * 2));
        CK(cu.MemAlloc(&dk, hk.size() * 2));
        CK(cu.MemAlloc(&dv, hv.size() * 2));
        CK(cu.MemcpyHtoD(dq, hq.data(), hq.size() * 2));
        CK(cu.MemcpyHtoD(dk, hk.data(), hk.size() * 2));
        CK(cu.MemcpyHtoD(dv, hv.data(), hv.size() * 2));
        Qh = hq.data(), Kh = hk.data(), Vh = hv.data();
        Q = (void *)(uintptr_t)dq, K = (void *)(uintptr_t)dk, V = (void *)(uintptr_t)dv;
        ldq = A, ldk = ldv = AK;
    }
    const size_t oelems = (size_t)(c.Lq * ldo);
    CUdeviceptr o_cudnn[2], o_own[2];
    for (int i = 0; i < 2; i++) {
        CK(cu.MemAlloc(&o_cudnn[i], oelems * 2));
        CK(cu.MemAlloc(&o_own[i], oelems * 2));
        CK(cu.MemsetD16(o_cudnn[i], SENTINEL, oelems));
        CK(cu.MemsetD16(o_own[i], SENTINEL, oelems));
    }
    CK(cu.CtxSynchronize());

    /* The reference rows, in double. Causal: query i sees keys j <= i + Lk - Lq; a row that sees
       none is zero. */
    std::vector<int> rows;
    if (c.Lq <= 2048) {
        for (int i = 0; i < (int)c.Lq; i++) rows.push_back(i);
    } else {
        const int n = 48;
        for (int k = 0; k < n; k++) rows.push_back((int)((c.Lq - 1) * k / (n - 1)));
    }
    const int nrows = (int)rows.size();
    std::vector<double> ref((size_t)nrows * A, 0.0);
    parallel_for(nrows * c.heads, [&](int t) {
        const int r = t / c.heads, h = t % c.heads, kvh = h / (c.heads / c.kv_heads), i = rows[r];
        const int64_t kend = c.causal ? std::min<int64_t>(c.Lk, i + c.Lk - c.Lq + 1) : c.Lk;
        double *o = &ref[(size_t)r * A + (size_t)h * c.D];
        if (kend <= 0) return;
        std::vector<double> q(c.D), sc((size_t)kend);
        for (int d = 0; d < c.D; d++) q[d] = bf16_to_float(Qh[(size_t)(i * ldq + h * c.D + d)]);
        double mx = -INFINITY;
        for (int64_t j = 0; j < kend; j++) {
            const uint16_t *kr = Kh + (size_t)(j * ldk + kvh * c.D);
            double acc = 0;
            for (int d = 0; d < c.D; d++) acc += q[d] * bf16_to_float(kr[d]);
            sc[(size_t)j] = acc * scale;
            mx = std::max(mx, sc[(size_t)j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < kend; j++) sum += (sc[(size_t)j] = exp(sc[(size_t)j] - mx));
        for (int64_t j = 0; j < kend; j++) {
            const uint16_t *vr = Vh + (size_t)(j * ldv + kvh * c.D);
            const double p = sc[(size_t)j] / sum;
            for (int d = 0; d < c.D; d++) o[d] += p * bf16_to_float(vr[d]);
        }
    });

    auto download = [&](CUdeviceptr O) {
        std::vector<uint16_t> v(oelems);
        CK(cu.MemcpyDtoH(v.data(), O, oelems * 2));
        return v;
    };
    auto against_ref = [&](const char *who, const std::vector<uint16_t> &O) {
        double d2 = 0, r2 = 0, maxabs = 0;
        long long pad_touched = 0, nonfinite = 0;
        for (int k = 0; k < nrows; k++) {
            const uint16_t *row = &O[(size_t)rows[k] * ldo];
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
        check(nonfinite == 0 && rel < 1e-2, "%-6s vs double reference (%d rows): rel-L2 %.2e, max abs err %.2e%s",
              who, nrows, rel, maxabs, nonfinite ? " (non-finite values)" : "");
        if (ldo > A) check(pad_touched == 0, "%-6s left O's padding columns alone (%lld touched)", who, pad_touched);
    };
    auto compare = [&](const std::vector<uint16_t> &a, const std::vector<uint16_t> &b, double *rel) {
        double d2 = 0, r2 = 0;
        unsigned long long diff = 0;
        for (int64_t i = 0; i < c.Lq; i++)
            for (int64_t j = 0; j < A; j++) {
                const uint16_t x = a[(size_t)(i * ldo + j)], y = b[(size_t)(i * ldo + j)];
                const double dx = (double)bf16_to_float(x) - bf16_to_float(y);
                d2 += dx * dx;
                r2 += (double)bf16_to_float(y) * bf16_to_float(y);
                diff += x != y;
            }
        if (rel) *rel = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
        return diff;
    };

    /* cuDNN. */
    char err[512] = "";
    bool cudnn_ok = false;
    double cudnn_ms = NAN, own_ms = NAN;
    std::vector<uint16_t> first_cudnn;
    auto call_cudnn = [&](CUdeviceptr O) {
        return h3_cudnn_sdpa(ch, s, Q, K, V, (void *)(uintptr_t)O, c.Lq, c.Lk, c.heads, c.kv_heads, c.D, ldq, ldk, ldv,
                             ldo, scale, c.causal, err, sizeof err);
    };
    if (!have_cudnn) {
        skip("cudnn: not available");
    } else {
        const auto t0 = std::chrono::steady_clock::now();
        int rc = call_cudnn(o_cudnn[0]);
        if (rc == 0) rc = cu.StreamSynchronize(s) == 0 ? 0 : -1;
        const std::chrono::duration<double, std::milli> build_ms = std::chrono::steady_clock::now() - t0;
        if (rc && !c.must) {
            skip("cudnn refused it (the own kernel would run): %s (rc %d)", err, rc);
        } else if (rc) {
            check(false, "cudnn: %s (rc %d)", err, rc);
        } else {
            cudnn_ok = true;
            printf("  cudnn: first call (graph build + run) %.1f ms\n", build_ms.count());
            first_cudnn = download(o_cudnn[0]);
            against_ref("cudnn", first_cudnn);
            rc = call_cudnn(o_cudnn[1]);
            CK(cu.StreamSynchronize(s));
            const unsigned long long d = compare(download(o_cudnn[1]), first_cudnn, nullptr);
            check(rc == 0 && d == 0, "cudnn  same bits on a second run (%llu of %lld differ)", d, (long long)(c.Lq * A));
            if (c.Lq >= 1024)
                cudnn_ms = batch_ms(runs, [&] { return call_cudnn(o_cudnn[1]); },
                                    [&] { return cu.StreamSynchronize(s) == 0 ? 0 : -1; });
        }
    }

    /* The own kernel, through the backend's ops table. */
    if (!be) {
        skip("own: the CUDA backend could not be created: %s", g_backend_err);
    } else {
        const h3_bt qv = h3_bt_make(Q, H3_DT_BF16, c.Lq, A, ldq), kv = h3_bt_make(K, H3_DT_BF16, c.Lk, AK, ldk),
                    vv = h3_bt_make(V, H3_DT_BF16, c.Lk, AK, ldv);
        auto call_own = [&](CUdeviceptr O) {
            const h3_bt ov = h3_bt_make((void *)(uintptr_t)O, H3_DT_BF16, c.Lq, A, ldo);
            return be->ops->attention(be, &qv, &kv, &vv, c.heads, c.kv_heads, c.D, scale, c.causal != 0, &ov);
        };
        int rc = call_own(o_own[0]);
        if (rc == 0) rc = be->mem->sync(be);
        if (rc) {
            check(false, "own: %s (rc %d)", g_backend_err, rc);
        } else {
            const std::vector<uint16_t> first_own = download(o_own[0]);
            against_ref("own", first_own);
            rc = call_own(o_own[1]);
            if (rc == 0) rc = be->mem->sync(be);
            const unsigned long long d = compare(download(o_own[1]), first_own, nullptr);
            check(rc == 0 && d == 0, "own    same bits on a second run (%llu of %lld differ)", d, (long long)(c.Lq * A));
            if (c.Lq >= 1024)
                own_ms = batch_ms(runs, [&] { return call_own(o_own[1]); }, [&] { return be->mem->sync(be); });
            if (cudnn_ok) {
                double rel = 0;
                const unsigned long long x = compare(first_cudnn, first_own, &rel);
                printf("  cudnn vs own, all %lld rows: rel-L2 %.2e (%llu elements differ in bits)\n", (long long)c.Lq,
                       rel, x);
            }
        }
    }

    if (c.Lq >= 1024) {
        const double flops = 4.0 * (double)c.Lq * (double)c.Lk * c.heads * c.D;
        printf("  time (mean of %d): cudnn %.3f ms (%.1f TFLOP/s), own %.3f ms (%.1f TFLOP/s)\n", runs, cudnn_ms,
               flops / cudnn_ms * 1e-9, own_ms, flops / own_ms * 1e-9);
        g_timings.push_back({c.name, cudnn_ms, own_ms, flops});
    }
    CK(cu.CtxSynchronize());
    for (int i = 0; i < 2; i++) {
        cu.MemFree(o_cudnn[i]);
        cu.MemFree(o_own[i]);
    }
    cu.MemFree(dq);
    if (dk) cu.MemFree(dk);
    if (dv) cu.MemFree(dv);
}

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

    std::string why_driver;
    if (!load_driver(&why_driver)) {
        fprintf(stderr, "sdpa_check: no CUDA driver: %s\n", why_driver.c_str());
        return 2;
    }
    CK(cu.Init(0));
    CUdevice dev;
    CK(cu.DeviceGet(&dev, 0));
    int major = 0, minor = 0;
    CK(cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CUcontext ctx;
    CK(cu.DevicePrimaryCtxRetain(&ctx, dev));
    CK(cu.CtxSetCurrent(ctx));
    CUstream s;
    CK(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    printf("GPU: sm_%d%d\n", major, minor);

    /* The own kernel, whatever the backend's default attention is. */
    const char *lib = getenv("H3_CUDA_LIB");
    if (!lib || !*lib) lib = "python/h3ctl/libh3_cuda.so";
    h3_backend *be = NULL;
    void *bl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    h3_backend_create_fn create = bl ? (h3_backend_create_fn)dlsym(bl, H3_BACKEND_ENTRY) : NULL;
    if (!create) {
        snprintf(g_backend_err, sizeof g_backend_err, "%s: %s", lib, bl ? "no " H3_BACKEND_ENTRY : dlerror());
    } else {
        h3_backend_host host;
        memset(&host, 0, sizeof host);
        host.struct_size = sizeof host;
        host.err = backend_err;
        host.noise = backend_noise;
        host.cuda_attention = "own";
        host.cudnn_lib = getenv("H3_CUDNN_LIB");
        set_paths(host, 0);
        if (create(&host, 0, &be) != 0) be = NULL;
    }
    printf("backend: %s\n", be ? be->desc : g_backend_err);
    CK(cu.CtxSetCurrent(ctx));

    const h3_cudnn_host ch = {0, major, minor, NULL, host_alloc, host_free, host_sync};
    char why[512];
    h3_cudnn_set_lib(getenv("H3_CUDNN_LIB")); /* libh3 passes it at create; this check calls cuDNN directly */
    const bool have_cudnn = h3_cudnn_sdpa_available(&ch, why, sizeof why) != 0;
    printf("cudnn: %s%s\n", have_cudnn ? "" : "not available: ", why);
    char why8[512];
    const int fp8 = h3_cudnn_sdpa_fp8_available(&ch, why8, sizeof why8);
    printf("cudnn fp8: %s%s\n", fp8 ? "" : "no: ", why8);

    /* Refusals the caller falls back on: a negative code and a reason, nothing run. */
    {
        char err[256];
        void *p = (void *)256; /* never dereferenced: both calls are refused up front */
        int rc = h3_cudnn_sdpa(&ch, s, p, p, p, p, 8, 8, 2, 2, 36, 72, 72, 72, 72, 0.1f, 0, err, sizeof err);
        check(rc < 0 && err[0], "refuses head dim 36: rc %d, \"%s\"", rc, err);
        rc = h3_cudnn_sdpa(&ch, s, p, p, p, p, 16, 8, 2, 2, 64, 128, 128, 128, 128, 0.1f, 1, err, sizeof err);
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
        run_case(c, be, s, &ch, have_cudnn, runs);
    }

    printf("\n%-30s %12s %10s %12s %10s %8s\n", "attention (56 x 128)", "cudnn ms", "TFLOP/s", "own ms", "TFLOP/s",
           "speedup");
    for (const Timing &t : g_timings)
        printf("%-30s %12.3f %10.1f %12.3f %10.1f %7.2fx\n", t.name, t.cudnn_ms, t.flops / t.cudnn_ms * 1e-9, t.own_ms,
               t.flops / t.own_ms * 1e-9, t.own_ms / t.cudnn_ms);

    if (be) be->destroy(be);
    printf("\n%d passed, %d failed, %d skipped\n", g_passed, g_failed, g_skipped);
    return g_failed ? 1 : 0;
}
