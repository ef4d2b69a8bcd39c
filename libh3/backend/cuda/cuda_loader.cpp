/*
 * Opens the vendor libraries the CUDA backend uses, at run time: libcuda.so.1 (the driver),
 * libnvrtc.so.13 (kernel compiler) and libcublasLt.so.13, each once per process, and fills the
 * function pointers of cuda_driver.h. A path from the host (h3_backend_host, which libh3 filled
 * from H3_LIBCUDA / H3_NVRTC_LIB / H3_CUBLASLT_LIB or Python's view of the nvidia wheels) is tried
 * first, then the soname through the loader's search. RTLD_LOCAL: nothing of theirs enters the
 * process's global namespace. The handles are never closed (unloading CUDA is not safe).
 */
#include "backend/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <mutex>
#include <stdio.h>
#include <string.h>
#include <string>

namespace h3cuda {

#define H3_DEFINE_FN(ret, name, sym, params) ret(*name) params = NULL;
H3_CU_FUNCS(H3_DEFINE_FN)
H3_NVRTC_FUNCS(H3_DEFINE_FN)
H3_LT_FUNCS(H3_DEFINE_FN)
#undef H3_DEFINE_FN

namespace {

struct Lib {
    std::once_flag once;
    int rc = -1;
    std::string why;
};

Lib g_cuda, g_nvrtc, g_lt;

void *open_lib(const char *path, const char *soname, std::string *why)
{
    if (path && *path) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        const char *e = dlerror();
        *why = e ? e : path;
        return NULL;
    }
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        *why = e ? e : soname;
    }
    return h;
}

template <class F> bool sym(void *h, const char *name, F *out, std::string *why)
{
    void *p = dlsym(h, name);
    if (!p) {
        *why = std::string("missing symbol ") + name;
        return false;
    }
    *out = reinterpret_cast<F>(p);
    return true;
}

void say(const Lib &l, char *why, size_t cap)
{
    if (why && cap) snprintf(why, cap, "%s", l.why.c_str());
}

} /* namespace */

int load_driver(const char *path, char *why, size_t cap)
{
    std::call_once(g_cuda.once, [path] {
        void *h = open_lib(path, "libcuda.so.1", &g_cuda.why);
        if (!h) {
            g_cuda.why = "no NVIDIA driver (libcuda.so.1 cannot be loaded: " + g_cuda.why +
                         "): install NVIDIA's driver for this GPU";
            return;
        }
        std::string w;
#define H3_LOAD(ret, name, s, params) \
    if (!sym(h, s, &name, &w)) {      \
        g_cuda.why = "libcuda.so.1 is too old: " + w; \
        return;                       \
    }
        H3_CU_FUNCS(H3_LOAD)
#undef H3_LOAD
        CUresult e = cuInit(0);
        if (e == CUDA_ERROR_NO_DEVICE) {
            g_cuda.why = "no CUDA-capable GPU found";
            return;
        }
        if (e != CUDA_SUCCESS) {
            g_cuda.why = std::string("cannot initialise the NVIDIA driver: ") + cu_errstr(e);
            return;
        }
        g_cuda.rc = 0;
    });
    if (g_cuda.rc) say(g_cuda, why, cap);
    return g_cuda.rc;
}

int load_nvrtc(const char *path, char *why, size_t cap)
{
    std::call_once(g_nvrtc.once, [path] {
        /* libnvrtc.so.13 dlopens libnvrtc-builtins.so.13.X by name; from a wheel's folder (no
           RUNPATH to it, no LD_LIBRARY_PATH) that fails, so the builtins next to the given path
           are opened first and then found already loaded. */
        if (path && *path) {
            std::string dir(path);
            size_t s = dir.rfind('/');
            dir = s == std::string::npos ? std::string(".") : dir.substr(0, s);
            int maj = 0, min = 0;
            (void)maj, (void)min;
            static const char *const builtins[] = {"libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.13.1",
                                                   "libnvrtc-builtins.so.13.2", "libnvrtc-builtins.so.13"};
            for (const char *b : builtins)
                if (dlopen((dir + "/" + b).c_str(), RTLD_NOW | RTLD_LOCAL)) break;
        }
        void *h = open_lib(path, "libnvrtc.so.13", &g_nvrtc.why);
        if (!h) {
            g_nvrtc.why = "NVRTC missing (libnvrtc.so.13: " + g_nvrtc.why + "): pip install \"h3ctl[cuda]\"";
            return;
        }
        std::string w;
#define H3_LOAD(ret, name, s, params) \
    if (!sym(h, s, &name, &w)) {      \
        g_nvrtc.why = "libnvrtc.so.13: " + w; \
        return;                       \
    }
        H3_NVRTC_FUNCS(H3_LOAD)
#undef H3_LOAD
        g_nvrtc.rc = 0;
    });
    if (g_nvrtc.rc) say(g_nvrtc, why, cap);
    return g_nvrtc.rc;
}

int load_cublaslt(const char *path, char *why, size_t cap)
{
    std::call_once(g_lt.once, [path] {
        void *h = open_lib(path, "libcublasLt.so.13", &g_lt.why);
        if (!h) {
            g_lt.why = "cuBLASLt missing (libcublasLt.so.13: " + g_lt.why + "): pip install \"h3ctl[cuda]\"";
            return;
        }
        std::string w;
#define H3_LOAD(ret, name, s, params) \
    if (!sym(h, s, &name, &w)) {      \
        g_lt.why = "libcublasLt.so.13: " + w; \
        return;                       \
    }
        H3_LT_FUNCS(H3_LOAD)
#undef H3_LOAD
        g_lt.rc = 0;
    });
    if (g_lt.rc) say(g_lt, why, cap);
    return g_lt.rc;
}

const char *cu_errstr(CUresult e)
{
    static thread_local char buf[160];
    const char *name = NULL, *desc = NULL;
    if (cuGetErrorName) cuGetErrorName(e, &name);
    if (cuGetErrorString) cuGetErrorString(e, &desc);
    snprintf(buf, sizeof buf, "%s (%s)", desc ? desc : "unknown error", name ? name : "CUDA error");
    return buf;
}

} /* namespace h3cuda */
