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

/* One library's entry points (cuda_driver.h's lists): each symbol's name and the function pointer it
   fills (dlsym gives a void *; POSIX makes it the size of a function pointer). */
struct Sym {
    const char *name;
    void *slot;
};
static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym's result must fit a function pointer");
#define H3_SYM(ret, name, s, params) {s, (void *)&name},
const Sym cu_syms[] = {H3_CU_FUNCS(H3_SYM)};
const Sym nvrtc_syms[] = {H3_NVRTC_FUNCS(H3_SYM)};
const Sym lt_syms[] = {H3_LT_FUNCS(H3_SYM)};
#undef H3_SYM

/* A library: its soname, the reason when it cannot be opened (absent + the loader's words + fix)
   or lacks a symbol (old + "missing symbol NAME"), and its symbols. */
struct LibSpec {
    const char *soname, *absent, *fix, *old;
    const Sym *syms;
    size_t count;
};
const LibSpec CUDA_LIB = {"libcuda.so.1", "no NVIDIA driver (libcuda.so.1 cannot be loaded: ",
                          "): install NVIDIA's driver for this GPU", "libcuda.so.1 is too old: ", cu_syms,
                          sizeof cu_syms / sizeof cu_syms[0]};
const LibSpec NVRTC_LIB = {"libnvrtc.so.13", "NVRTC missing (libnvrtc.so.13: ", "): pip install \"h3ctl[cuda]\"",
                           "libnvrtc.so.13: ", nvrtc_syms, sizeof nvrtc_syms / sizeof nvrtc_syms[0]};
const LibSpec LT_LIB = {"libcublasLt.so.13", "cuBLASLt missing (libcublasLt.so.13: ", "): pip install \"h3ctl[cuda]\"",
                        "libcublasLt.so.13: ", lt_syms, sizeof lt_syms / sizeof lt_syms[0]};

/* Opens the library and fills its function pointers in table order (those before a missing one
   stay filled); the handle, or NULL with the reason in l.why. */
void *open_resolved(const LibSpec &spec, const char *path, Lib &l)
{
    void *h = open_lib(path, spec.soname, &l.why);
    if (!h) {
        l.why = spec.absent + l.why + spec.fix;
        return NULL;
    }
    for (size_t i = 0; i < spec.count; i++) {
        void *p = dlsym(h, spec.syms[i].name);
        if (!p) {
            l.why = std::string(spec.old) + "missing symbol " + spec.syms[i].name;
            return NULL;
        }
        memcpy(spec.syms[i].slot, &p, sizeof p);
    }
    return h;
}

void say(const Lib &l, char *why, size_t cap)
{
    if (why && cap) snprintf(why, cap, "%s", l.why.c_str());
}

} /* namespace */

int load_driver(const char *path, char *why, size_t cap)
{
    std::call_once(g_cuda.once, [path] {
        if (!open_resolved(CUDA_LIB, path, g_cuda)) return;
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
        if (!open_resolved(NVRTC_LIB, path, g_nvrtc)) return;
        g_nvrtc.rc = 0;
    });
    if (g_nvrtc.rc) say(g_nvrtc, why, cap);
    return g_nvrtc.rc;
}

int load_cublaslt(const char *path, char *why, size_t cap)
{
    std::call_once(g_lt.once, [path] {
        if (!open_resolved(LT_LIB, path, g_lt)) return;
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
