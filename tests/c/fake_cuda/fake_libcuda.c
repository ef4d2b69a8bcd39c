/*
 * A stand-in for the NVIDIA driver's libcuda.so.1, for the CUDA backend's fault tests on machines
 * without a GPU (tests/test_cuda_faults.py builds it into a shared library and points H3_LIBCUDA
 * at it). It exports every driver entry point cuda_loader.cpp resolves (cuda_driver.h's
 * H3_CU_FUNCS), with the driver's own signatures and result codes.
 *
 * "Device" memory is host memory (malloc), so copies and memsets are memcpy / memset and a render
 * can run its allocation, upload and launch sequence; kernels launch as no-ops (their results are
 * not what these tests look at). A module image must start like a cubin (an ELF header) or like
 * the fake NVRTC's (tests/c/fake_cuda/fake_nvrtc.c); anything else is CUDA_ERROR_INVALID_IMAGE.
 *
 * What goes wrong is chosen by the environment, read at cuInit:
 *   H3_FAKE_CUDA=old_driver   cuDriverGetVersion says 12040 (CUDA 12.4)
 *   H3_FAKE_CUDA=no_device    cuInit returns CUDA_ERROR_NO_DEVICE
 *   H3_FAKE_CUDA=zero_devices cuInit succeeds, cuDeviceGetCount says 0
 *   H3_FAKE_CUDA=module_load  cuModuleLoadData returns CUDA_ERROR_NO_BINARY_FOR_GPU
 *   H3_FAKE_CUDA_CC=75        the GPU's compute capability (default 90)
 *   H3_FAKE_CUDA_MEM=bytes    the GPU's memory (default 80 GiB): cuMemAlloc past it returns
 *                             CUDA_ERROR_OUT_OF_MEMORY
 *   H3_FAKE_CUDA_LOG=file     one line appended per module load ("load <first bytes>")
 */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;

enum {
    OK = 0,
    E_INVALID_VALUE = 1,
    E_OUT_OF_MEMORY = 2,
    E_NOT_INITIALIZED = 3,
    E_NO_DEVICE = 100,
    E_INVALID_DEVICE = 101,
    E_INVALID_IMAGE = 200,
    E_NO_BINARY_FOR_GPU = 209,
    E_NOT_FOUND = 500,
};

static int g_init;
static const char *g_mode = "";
static int g_cc = 90;
static unsigned long long g_mem = 80ull << 30, g_used;

/* Each allocation remembers its size in front of the pointer handed out, for cuMemFree; 256-byte
   aligned, as cuMemAlloc's are. */
#define HDR 256

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int mode(const char *m) { return !strcmp(g_mode, m); }

API CUresult cuInit(unsigned int flags)
{
    if (flags) return E_INVALID_VALUE;
    g_mode = env_or("H3_FAKE_CUDA", "");
    g_cc = atoi(env_or("H3_FAKE_CUDA_CC", "90"));
    g_mem = strtoull(env_or("H3_FAKE_CUDA_MEM", "85899345920"), NULL, 10);
    if (mode("no_device")) return E_NO_DEVICE;
    g_init = 1;
    return OK;
}

API CUresult cuDriverGetVersion(int *v)
{
    if (!v) return E_INVALID_VALUE;
    *v = mode("old_driver") ? 12040 : 13000;
    return OK;
}

static const char *err_name(CUresult e)
{
    switch (e) {
    case OK: return "CUDA_SUCCESS";
    case E_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case E_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case E_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case E_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case E_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case E_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
    case E_NO_BINARY_FOR_GPU: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case E_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    default: return NULL;
    }
}

static const char *err_text(CUresult e)
{
    switch (e) {
    case OK: return "no error";
    case E_INVALID_VALUE: return "invalid argument";
    case E_OUT_OF_MEMORY: return "out of memory";
    case E_NOT_INITIALIZED: return "initialization error";
    case E_NO_DEVICE: return "no CUDA-capable device is detected";
    case E_INVALID_DEVICE: return "invalid device ordinal";
    case E_INVALID_IMAGE: return "device kernel image is invalid";
    case E_NO_BINARY_FOR_GPU: return "no kernel image is available for execution on the device";
    case E_NOT_FOUND: return "named symbol not found";
    default: return NULL;
    }
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s) return E_INVALID_VALUE;
    *s = err_name(e);
    return *s ? OK : E_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s) return E_INVALID_VALUE;
    *s = err_text(e);
    return *s ? OK : E_INVALID_VALUE;
}

API CUresult cuDeviceGetCount(int *n)
{
    if (!g_init) return E_NOT_INITIALIZED;
    *n = mode("zero_devices") ? 0 : 1;
    return OK;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (!g_init) return E_NOT_INITIALIZED;
    if (ordinal != 0 || mode("zero_devices")) return E_INVALID_DEVICE;
    *d = 0;
    return OK;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    if (d != 0 || !name || len <= 0) return E_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake GPU sm_%d", g_cc);
    return OK;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    if (d != 0) return E_INVALID_DEVICE;
    *bytes = (size_t)g_mem;
    return OK;
}

API CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    if (d != 0) return E_INVALID_DEVICE;
    switch (attr) {
    case 16: *v = 132; return OK;       /* multiprocessors */
    case 75: *v = g_cc / 10; return OK; /* compute capability major */
    case 76: *v = g_cc % 10; return OK; /* minor */
    case 97: *v = 232448; return OK;    /* opt-in shared memory per block */
    default: return E_INVALID_VALUE;
    }
}

static int g_ctx_obj;
static CUcontext g_current;

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    if (d != 0) return E_INVALID_DEVICE;
    *c = &g_ctx_obj;
    return OK;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? OK : E_INVALID_DEVICE; }
API CUresult cuCtxSetCurrent(CUcontext c)
{
    g_current = c;
    return OK;
}
API CUresult cuCtxGetCurrent(CUcontext *c)
{
    *c = g_current;
    return OK;
}
API CUresult cuCtxSynchronize(void) { return OK; }

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    if (!p || !n) return E_INVALID_VALUE;
    if (n > g_mem - g_used) return E_OUT_OF_MEMORY;
    void *v = NULL;
    if (posix_memalign(&v, HDR, n + HDR)) return E_OUT_OF_MEMORY;
    char *m = v;
    memcpy(m, &n, sizeof n);
    g_used += n;
    *p = (CUdeviceptr)(size_t)(m + HDR);
    return OK;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
    if (!p) return OK;
    char *m = (char *)(size_t)p - HDR;
    size_t n;
    memcpy(&n, m, sizeof n);
    g_used -= n;
    free(m);
    return OK;
}

API CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot)
{
    *fr = (size_t)(g_mem - g_used);
    *tot = (size_t)g_mem;
    return OK;
}

/* Pinned memory is page-aligned, as the driver's is. */
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    *p = NULL;
    return posix_memalign(p, 4096, n ? n : 1) ? E_OUT_OF_MEMORY : OK;
}
API CUresult cuMemFreeHost(void *p)
{
    free(p);
    return OK;
}

API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    (void)s;
    if (n) memmove((void *)(size_t)dst, (const void *)(size_t)src, n);
    return OK;
}

/* cuda.h's CUDA_MEMCPY2D, the fields the backend fills (unified addressing on both sides). */
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} Copy2D;

API CUresult cuMemcpy2DAsync_v2(const Copy2D *c, CUstream s)
{
    (void)s;
    for (size_t r = 0; r < c->Height; r++)
        memmove((char *)(size_t)c->dstDevice + r * c->dstPitch, (const char *)(size_t)c->srcDevice + r * c->srcPitch,
                c->WidthInBytes);
    return OK;
}

API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    (void)s;
    memset((void *)(size_t)d, v, n);
    return OK;
}

API CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s)
{
    (void)s;
    for (size_t r = 0; r < h; r++) memset((char *)(size_t)d + r * pitch, v, w);
    return OK;
}

static void *handle(void) { return malloc(16); }

API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    (void)flags;
    *s = handle();
    return OK;
}
API CUresult cuStreamDestroy_v2(CUstream s)
{
    free(s);
    return OK;
}
API CUresult cuStreamSynchronize(CUstream s)
{
    (void)s;
    return OK;
}
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    (void)s, (void)e, (void)flags;
    return OK;
}
API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    *e = handle();
    return OK;
}
API CUresult cuEventRecord(CUevent e, CUstream s)
{
    (void)e, (void)s;
    return OK;
}
API CUresult cuEventSynchronize(CUevent e)
{
    (void)e;
    return OK;
}
API CUresult cuEventDestroy_v2(CUevent e)
{
    free(e);
    return OK;
}

/* Pageable host memory to the backend: it then does not wait after an upload. */
API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    (void)data, (void)attr, (void)p;
    return E_INVALID_VALUE;
}

static int g_mod_obj, g_fn_obj;

API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    const unsigned char *b = image;
    const char *log = getenv("H3_FAKE_CUDA_LOG");
    if (log && *log) {
        FILE *f = fopen(log, "a");
        if (f) {
            fprintf(f, "load %.4s\n", b[0] == 0x7f ? "ELF" : (const char *)b);
            fclose(f);
        }
    }
    if (mode("module_load")) return E_NO_BINARY_FOR_GPU;
    if (memcmp(b, "\x7f" "ELF", 4) && memcmp(b, "FAKECUBIN", 9)) return E_INVALID_IMAGE;
    *m = &g_mod_obj;
    return OK;
}
API CUresult cuModuleUnload(CUmodule m)
{
    (void)m;
    return OK;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    if (m != &g_mod_obj || !name || !*name) return E_NOT_FOUND;
    *f = &g_fn_obj;
    return OK;
}
API CUresult cuFuncSetAttribute(CUfunction f, int attr, int v)
{
    (void)f, (void)attr, (void)v;
    return OK;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned smem, CUstream s, void **params, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s, (void)params, (void)extra;
    return f == &g_fn_obj ? OK : E_INVALID_VALUE;
}
