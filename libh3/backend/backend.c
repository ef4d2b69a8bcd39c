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
#include <stddef.h>
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
    if (be) be->destroy(be);
}

void *h3_backend_dup(h3_backend *be, const void *host, size_t bytes)
{
    void *p = be->mem->alloc(be, bytes);
    if (!p) return NULL;
    if (bytes && be->mem->upload(be, p, host, bytes)) {
        be->mem->release(be, p);
        return NULL;
    }
    return p;
}

/* ---- what a backend implements ---- */

/* An entry of a table, read as bytes: the tables hold function pointers of many types, and all we
   ask here is whether one is set. */
static bool entry_set(const void *table, size_t offset)
{
    if (!table) return false;
    void (*fn)(void);
    memcpy(&fn, (const char *)table + offset, sizeof fn);
    return fn != NULL;
}

static const struct {
    const char *name;
    bool dec;      /* in the dec table, else in ops */
    bool required; /* every backend has it */
    size_t offset;
} op_info[H3_OP_COUNT] = {
#define H3_OP_INFO_(tab, op, req) [H3_OP_##op] = {#op, #tab[0] == 'd', #req[0] == 'R', \
                                                   offsetof(struct h3_backend_##tab##_tab_, op)},
/* The op list names the tables by their h3_backend field; these name their types. */
#define h3_backend_ops_tab_ h3_backend_ops
#define h3_backend_dec_tab_ h3_backend_decoders
    H3_BACKEND_OP_LIST(H3_OP_INFO_)
#undef h3_backend_ops_tab_
#undef h3_backend_dec_tab_
#undef H3_OP_INFO_
};

const char *h3_op_name(h3_op op)
{
    return (unsigned)op < H3_OP_COUNT ? op_info[op].name : "unknown";
}

bool h3_backend_supports(const h3_backend *be, h3_op op)
{
    if (!be || (unsigned)op >= H3_OP_COUNT) return false;
    return entry_set(op_info[op].dec ? (const void *)be->dec : (const void *)be->ops, op_info[op].offset);
}

int h3_backend_need(const h3_backend *be, const h3_op *ops, int n, const char *who)
{
    if (!be) return h3_err(H3_E_INVALID, "%s: no backend", who);
    for (int i = 0; i < n; i++)
        if (!h3_backend_supports(be, ops[i]))
            return h3_err(H3_E_UNSUPPORTED, "the %s backend has no %s op (needed by %s)", be->name, h3_op_name(ops[i]),
                          who);
    return 0;
}

/* Functions a capability bit promises, by table. */
#define MEM_AT(f) offsetof(h3_backend_mem, f)
#define WT_AT(f) offsetof(h3_backend_weights, f)
static const struct {
    uint32_t cap;
    bool weights; /* in the weights table, else in mem */
    const char *name;
    size_t offset;
} cap_entries[] = {
    {0, false, "alloc", MEM_AT(alloc)},
    {0, false, "release", MEM_AT(release)},
    {0, false, "upload", MEM_AT(upload)},
    {0, false, "download", MEM_AT(download)},
    {0, false, "zero", MEM_AT(zero)},
    {0, false, "sync", MEM_AT(sync)},
    {0, false, "mem_info", MEM_AT(mem_info)},
    {0, false, "dcopy", MEM_AT(dcopy)},
    {0, true, "weight_load", WT_AT(weight_load)},
    {0, true, "weight_free", WT_AT(weight_free)},
    {H3_CAP_PINNED, false, "host_alloc", MEM_AT(host_alloc)},
    {H3_CAP_PINNED, false, "host_free", MEM_AT(host_free)},
    {H3_CAP_MEM_PEAK, false, "mem_peak", MEM_AT(mem_peak)},
    {H3_CAP_FP8_WEIGHTS, true, "weight_load_fp8", WT_AT(weight_load_fp8)},
    {H3_CAP_RINGS, true, "weight_bytes", WT_AT(weight_bytes)},
    {H3_CAP_RINGS, true, "weight_save", WT_AT(weight_save)},
    {H3_CAP_RINGS, true, "weight_view", WT_AT(weight_view)},
    {H3_CAP_RINGS, true, "ring_open", WT_AT(ring_open)},
    {H3_CAP_RINGS, true, "ring_close", WT_AT(ring_close)},
    {H3_CAP_RINGS, true, "ring_fill", WT_AT(ring_fill)},
    {H3_CAP_RINGS, true, "ring_wait", WT_AT(ring_wait)},
    {H3_CAP_RINGS, true, "ring_done", WT_AT(ring_done)},
    {H3_CAP_PACKED_RING, true, "ring_open_packed", WT_AT(ring_open_packed)},
    {H3_CAP_PACKED_RING, true, "ring_fill_packed", WT_AT(ring_fill_packed)},
    {H3_CAP_WSTREAM, true, "wstream_open", WT_AT(wstream_open)},
    {H3_CAP_WSTREAM, true, "wstream_load", WT_AT(wstream_load)},
    {H3_CAP_WSTREAM, true, "wstream_wait_host", WT_AT(wstream_wait_host)},
    {H3_CAP_WSTREAM, true, "wstream_done", WT_AT(wstream_done)},
    {H3_CAP_WSTREAM, true, "wstream_close", WT_AT(wstream_close)},
};
#undef MEM_AT
#undef WT_AT

int h3_backend_check(const h3_backend *be)
{
    if (!be) return h3_err(H3_E_INVALID, "backend: none");
    const char *name = be->name ? be->name : "unnamed";
    if (be->abi_version != H3_BACKEND_ABI)
        return h3_err(H3_E_UNSUPPORTED, "backend %s: built for backend ABI %u, this libh3 has ABI %u", name,
                      (unsigned)be->abi_version, (unsigned)H3_BACKEND_ABI);
    if (!be->name || !be->destroy || !be->mem || !be->weights || !be->ops)
        return h3_err(H3_E_UNSUPPORTED, "backend %s: its name, destroy function or a table (mem, weights, ops) is "
                                        "missing", name);
    if (!!be->dec != h3_backend_has(be, H3_CAP_DECODERS))
        return h3_err(H3_E_UNSUPPORTED, "backend %s: the decoders table and the H3_CAP_DECODERS bit disagree", name);
    /* Rings stage weights through pinned host memory; a packed ring is a ring. */
    if ((h3_backend_has(be, H3_CAP_RINGS) && !h3_backend_has(be, H3_CAP_PINNED)) ||
        (h3_backend_has(be, H3_CAP_PACKED_RING) && !h3_backend_has(be, H3_CAP_RINGS)))
        return h3_err(H3_E_UNSUPPORTED, "backend %s: rings need pinned memory, and packed rings rings", name);
    for (size_t i = 0; i < sizeof cap_entries / sizeof *cap_entries; i++) {
        if (cap_entries[i].cap && !h3_backend_has(be, cap_entries[i].cap)) continue;
        if (!entry_set(cap_entries[i].weights ? (const void *)be->weights : (const void *)be->mem,
                       cap_entries[i].offset))
            return h3_err(H3_E_UNSUPPORTED, "backend %s: no %s function%s", name, cap_entries[i].name,
                          cap_entries[i].cap ? " (its capability bits promise one)" : "");
    }
    for (int op = 0; op < H3_OP_COUNT; op++)
        if (op_info[op].required && !h3_backend_supports(be, (h3_op)op))
            return h3_err(H3_E_UNSUPPORTED, "backend %s: no %s op (every backend needs it)", name, op_info[op].name);
    return 0;
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

/* Where the CUDA backend's progress and warnings go (h3_set_note): process-wide, as the backend
   library is. */
static void (*g_note_fn)(void *user, const char *line);
static void *g_note_user;
static int g_cuda_warmup; /* set around h3_cuda_warmup's create call */

void h3_set_note(void (*fn)(void *user, const char *line), void *user)
{
    g_note_fn = fn;
    g_note_user = user;
}

static void h3_note_line(const char *line)
{
    if (g_note_fn) g_note_fn(g_note_user, line);
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
                      "cuda: the CUDA backend is not built in this installation (reinstall h3ctl on Linux with a C++ "
                      "compiler, g++ or clang++, present; or run `make cuda`)");
    /* RTLD_LOCAL: its symbols (cuBLASLt's, the CUDA runtime's) stay out of the process's global
       namespace. The handle is kept for the process's lifetime: unloading CUDA is not safe. */
    /* One library per path (H3_CUDA_LIB may name another one later in the process). */
    static void *handle;
    static char handle_path[4096];
    if (!handle || strcmp(handle_path, path)) {
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        snprintf(handle_path, sizeof handle_path, "%s", handle ? path : "");
    }
    if (!handle) {
        const char *why = dlerror();
        return h3_err(H3_E_UNSUPPORTED, "cuda: cannot load %s: %s", path, why ? why : "unknown reason");
    }
    /* The ABI first: a library built from other headers lays its tables out differently, and
       calling into it (even its create function, whose arguments may differ) is not safe. */
    h3_backend_abi_fn abi;
    void *sym = dlsym(handle, H3_BACKEND_ABI_ENTRY);
    memcpy(&abi, &sym, sizeof abi); /* object -> function pointer without a cast warning */
    if (!abi)
        return h3_err(H3_E_UNSUPPORTED,
                      "cuda: %s predates backend ABI versions (it exports no %s); this libh3 needs ABI %u: rebuild "
                      "it with `make cuda`, or reinstall h3ctl",
                      path, H3_BACKEND_ABI_ENTRY, (unsigned)H3_BACKEND_ABI);
    const uint32_t have = abi();
    if (have != H3_BACKEND_ABI)
        return h3_err(H3_E_UNSUPPORTED,
                      "cuda: %s has backend ABI %u, this libh3 needs ABI %u: rebuild it with `make cuda`, or "
                      "reinstall h3ctl",
                      path, (unsigned)have, (unsigned)H3_BACKEND_ABI);
    h3_backend_create_fn create;
    sym = dlsym(handle, H3_BACKEND_ENTRY);
    memcpy(&create, &sym, sizeof create);
    if (!create) return h3_err(H3_E_UNSUPPORTED, "cuda: %s does not export %s", path, H3_BACKEND_ENTRY);
    h3_tuning now; /* no context's knobs given: the environment as it is now */
    if (!t) {
        h3_tuning_read(&now);
        t = &now;
    }
    const h3_backend_host host = {sizeof(h3_backend_host), host_err, h3_noise, t->cuda_attention, t->cuda_rows,
                                  t->cudnn_lib, t->libcuda, t->nvrtc_lib, t->cublaslt_lib, t->kernel_cache,
                                  h3_note_line, g_cuda_warmup};
    if (device_ordinal < 0) return h3_err(H3_E_INVALID, "cuda: device index %d is negative", device_ordinal);
    int rc = create(&host, device_ordinal, out);
    if (rc == 0 && !*out) rc = h3_err(H3_E_UNSUPPORTED, "cuda: the backend returned no device");
    if (rc == 0 && (rc = h3_backend_check(*out)) != 0) {
        /* The destroy function is only trusted when the tables were complete enough to hold it. */
        if ((*out)->abi_version == H3_BACKEND_ABI && (*out)->destroy) (*out)->destroy(*out);
        *out = NULL;
    }
    return rc;
#endif
}

int h3_cuda_warmup(int device)
{
    h3_err_clear();
    h3_backend *be = NULL;
    g_cuda_warmup = 1;
    int rc = h3_backend_cuda_open(device, NULL, &be);
    g_cuda_warmup = 0;
    if (be) h3_backend_destroy(be);
    return rc;
}
