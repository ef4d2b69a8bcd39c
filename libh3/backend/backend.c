/*
 * Backend registry: the CPU backend is linked in; the CUDA backend is a separate shared library
 * (libh3_cuda, built by `make cuda` where nvcc exists) found next to libh3 and loaded on demand,
 * so one install serves machines with and without a GPU and libh3 itself never links CUDA.
 */
/* dladdr (which library are we?) is a GNU/BSD extension. */
#if !defined(_GNU_SOURCE) && !defined(__APPLE__)
#define _GNU_SOURCE
#endif
#include "backend/backend.h"
#include "core/schedule.h"
#include "core/tuning.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define H3_NO_DLOPEN 1
#else
#include <dlfcn.h>
#endif

void h3_backend_destroy(h3_backend *be)
{
    if (be) be->ops->destroy(be);
}

void *h3_backend_dup(h3_backend *be, const void *host, size_t bytes)
{
    void *p = be->ops->alloc(be, bytes);
    if (!p) return NULL;
    if (bytes && be->ops->upload(be, p, host, bytes)) {
        be->ops->release(be, p);
        return NULL;
    }
    return p;
}

/* h3_err with a va_list-free signature for the loadable backend (it formats its own message). */
static int host_err(int code, const char *fmt, ...) H3_PRINTF(2, 3);
static int host_err(int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return h3_err(code, "%s", msg);
}

#ifndef H3_NO_DLOPEN
/* Path of the CUDA backend library: H3_CUDA_LIB if set (tests, unusual installs), else the
   folder libh3 itself was loaded from. */
static int cuda_lib_path(char *out, size_t cap)
{
    const char *env = h3_env_cuda_lib();
    if (env[0]) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    Dl_info info;
    if (!dladdr((void *)&h3_backend_cuda_open, &info) || !info.dli_fname) return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    size_t dir = slash ? (size_t)(slash - info.dli_fname + 1) : 0;
    if (dir + strlen(H3_BACKEND_CUDA_LIB_ELF) + 1 > cap) return -1;
    memcpy(out, info.dli_fname, dir);
    strcpy(out + dir, H3_BACKEND_CUDA_LIB_ELF);
    return 0;
}
#endif

bool h3_backend_cuda_built(void)
{
#ifdef H3_NO_DLOPEN
    return false;
#else
    char path[4096];
    return cuda_lib_path(path, sizeof path) == 0 && h3_is_file(path);
#endif
}

int h3_backend_cuda_open(int device_ordinal, const h3_tuning *t, h3_backend **out)
{
    *out = NULL;
#ifdef H3_NO_DLOPEN
    (void)device_ordinal;
    (void)t;
    return h3_err(H3_E_UNSUPPORTED, "cuda: this build of libh3 cannot load backends");
#else
    char path[4096];
    if (cuda_lib_path(path, sizeof path) || !h3_is_file(path))
        return h3_err(H3_E_UNSUPPORTED,
                      "cuda: the CUDA backend is not built in this installation (reinstall h3ctl where nvcc is "
                      "found, or run `make cuda`)");
    /* RTLD_LOCAL: its symbols (cuBLASLt's, the CUDA runtime's) stay out of the process's global
       namespace. The handle is kept for the process's lifetime: unloading CUDA is not safe. */
    static void *handle;
    if (!handle) handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *why = dlerror();
        return h3_err(H3_E_UNSUPPORTED, "cuda: cannot load %s: %s", path, why ? why : "unknown reason");
    }
    h3_backend_create_fn create;
    void *sym = dlsym(handle, H3_BACKEND_ENTRY);
    memcpy(&create, &sym, sizeof create); /* object -> function pointer without a cast warning */
    if (!create) return h3_err(H3_E_UNSUPPORTED, "cuda: %s does not export %s", path, H3_BACKEND_ENTRY);
    h3_tuning now; /* no context's knobs given: the environment as it is now */
    if (!t) {
        h3_tuning_read(&now);
        t = &now;
    }
    const h3_backend_host host = {sizeof(h3_backend_host), host_err, h3_noise, t->cuda_attention, t->cuda_rows,
                                  t->cudnn_lib};
    if (device_ordinal < 0) return h3_err(H3_E_INVALID, "cuda: device index %d is negative", device_ordinal);
    int rc = create(&host, device_ordinal, out);
    if (rc == 0 && !*out) rc = h3_err(H3_E_UNSUPPORTED, "cuda: the backend returned no device");
    return rc;
#endif
}
