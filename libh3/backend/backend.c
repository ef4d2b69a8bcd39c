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
#include "backend/comm.h"
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
    if (h3_backend_has(be, H3_CAP_I8_WEIGHTS) && !be->weight_load_i8)
        return h3_err(H3_E_UNSUPPORTED, "backend %s: no weight_load_i8 function (its capability bits promise one)", name);
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
/* Path of a backend library: `env` if set (tests, unusual installs), else `file` in the folder
   libh3 itself was loaded from. */
static int lib_path(const char *env, const char *file, char *out, size_t cap)
{
    if (env[0]) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    Dl_info info;
    if (!dladdr((void *)&h3_backend_cuda_open, &info) || !info.dli_fname) return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    size_t dir = slash ? (size_t)(slash - info.dli_fname + 1) : 0;
    if (dir + strlen(file) + 1 > cap) return -1;
    memcpy(out, info.dli_fname, dir);
    strcpy(out + dir, file);
    return 0;
}
static int cuda_lib_path(char *out, size_t cap) { return lib_path(h3_env_cuda_lib(), H3_BACKEND_CUDA_LIB_ELF, out, cap); }
static int metal_lib_path(char *out, size_t cap) { return lib_path(h3_env_metal_lib(), H3_BACKEND_METAL_LIB, out, cap); }

/* One loadable backend library: where it is kept open, and how to name it in errors. */
typedef struct lib_slot {
    const char *tag;      /* "cuda" */
    const char *abi_sym;  /* H3_BACKEND_ABI_ENTRY */
    const char *make_sym; /* H3_BACKEND_ENTRY */
    const char *rebuild;  /* "`make cuda`" */
    void *handle;
    char path[4096];
} lib_slot;

/* Load (once per path), check the ABI, create. */
static int open_lib(lib_slot *L, const char *path, const h3_backend_host *host, int device_ordinal, h3_backend **out)
{
    /* RTLD_LOCAL: its symbols (cuBLASLt's, the CUDA runtime's) stay out of the process's global
       namespace. The handle is kept for the process's lifetime: unloading CUDA is not safe. */
    /* One library per path (H3_CUDA_LIB may name another one later in the process). */
    if (!L->handle || strcmp(L->path, path)) {
        L->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        snprintf(L->path, sizeof L->path, "%s", L->handle ? path : "");
    }
    if (!L->handle) {
        const char *why = dlerror();
        return h3_err(H3_E_UNSUPPORTED, "%s: cannot load %s: %s", L->tag, path, why ? why : "unknown reason");
    }
    /* The ABI first: a library built from other headers lays its tables out differently, and
       calling into it (even its create function, whose arguments may differ) is not safe. */
    h3_backend_abi_fn abi;
    void *sym = dlsym(L->handle, L->abi_sym);
    memcpy(&abi, &sym, sizeof abi); /* object -> function pointer without a cast warning */
    if (!abi)
        return h3_err(H3_E_UNSUPPORTED,
                      "%s: %s predates backend ABI versions (it exports no %s); this libh3 needs ABI %u: rebuild "
                      "it with %s, or reinstall h3ctl",
                      L->tag, path, L->abi_sym, (unsigned)H3_BACKEND_ABI, L->rebuild);
    const uint32_t have = abi();
    if (have != H3_BACKEND_ABI)
        return h3_err(H3_E_UNSUPPORTED,
                      "%s: %s has backend ABI %u, this libh3 needs ABI %u: rebuild it with %s, or "
                      "reinstall h3ctl",
                      L->tag, path, (unsigned)have, (unsigned)H3_BACKEND_ABI, L->rebuild);
    h3_backend_create_fn create;
    sym = dlsym(L->handle, L->make_sym);
    memcpy(&create, &sym, sizeof create);
    if (!create) return h3_err(H3_E_UNSUPPORTED, "%s: %s does not export %s", L->tag, path, L->make_sym);
    if (device_ordinal < 0) return h3_err(H3_E_INVALID, "%s: device index %d is negative", L->tag, device_ordinal);
    int rc = create(host, device_ordinal, out);
    if (rc == 0 && !*out) rc = h3_err(H3_E_UNSUPPORTED, "%s: the backend returned no device", L->tag);
    if (rc == 0 && (rc = h3_backend_check(*out)) != 0) {
        /* The destroy function is only trusted when the tables were complete enough to hold it. */
        if ((*out)->abi_version == H3_BACKEND_ABI && (*out)->destroy) (*out)->destroy(*out);
        *out = NULL;
    }
    return rc;
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

#ifndef H3_NO_DLOPEN
/* The CUDA backend library last loaded (h3_backend_cuda_open), also for its other entry points (NCCL). */
static lib_slot g_cuda_slot = {"cuda", H3_BACKEND_ABI_ENTRY, H3_BACKEND_ENTRY, "`make cuda`", NULL, ""};
#endif

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
    h3_tuning now; /* no context's knobs given: the environment as it is now */
    if (!t) {
        h3_tuning_read(&now);
        t = &now;
    }
    const h3_backend_host host = {sizeof(h3_backend_host), host_err, h3_noise, t->cuda_attention, t->cuda_rows,
                                  t->cudnn_lib, t->libcuda, t->nvrtc_lib, t->cublaslt_lib, t->kernel_cache,
                                  h3_note_line, g_cuda_warmup};
    return open_lib(&g_cuda_slot, path, &host, device_ordinal, out);
#endif
}

bool h3_backend_metal_built(void)
{
#ifdef H3_NO_DLOPEN
    return false;
#else
    char path[4096];
    return metal_lib_path(path, sizeof path) == 0 && h3_is_file(path);
#endif
}

int h3_backend_metal_open(h3_backend **out)
{
    *out = NULL;
#ifdef H3_NO_DLOPEN
    return h3_err(H3_E_UNSUPPORTED, "metal: this build of libh3 cannot load backends");
#else
    char path[4096];
    if (metal_lib_path(path, sizeof path) || !h3_is_file(path))
        return h3_err(H3_E_UNSUPPORTED,
#if defined(__APPLE__)
                      "metal: the Metal backend is not built in this installation (reinstall h3ctl, or run "
                      "`make metal`)"
#else
                      "metal: the Metal backend runs on Apple silicon; this installation has no Metal library (on "
                      "Linux only the test double build, `make metal-double`, provides one)"
#endif
        );
    static lib_slot slot = {"metal", H3_BACKEND_METAL_ABI_ENTRY, H3_BACKEND_METAL_ENTRY,
#if defined(__APPLE__)
                            "`make metal`",
#else
                            "`make metal-double`",
#endif
                            NULL, ""};
    const h3_backend_host host = {sizeof(h3_backend_host), host_err, h3_noise, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                  h3_note_line, 0};
    return open_lib(&slot, path, &host, 0, out);
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

/* ---- the NCCL communicator of the CUDA backend library (backend/comm.h, docs/multi-gpu.md) ---- */

static int comm_sync(void *ctx)
{
    h3_backend *be = ctx;
    return be->mem->sync(be);
}

int h3_backend_cuda_comm(h3_backend *be, const h3_tuning *t, h3_comm **out, void **scratch)
{
    *out = NULL;
    *scratch = NULL;
#ifdef H3_NO_DLOPEN
    (void)be;
    (void)t;
    return h3_err(H3_E_UNSUPPORTED, "cuda: this build of libh3 cannot load backends");
#else
    if (!g_cuda_slot.handle || !be || strcmp(be->name, "cuda") != 0)
        return h3_err(H3_E_UNSUPPORTED, "sequence parallel over NCCL needs the cuda backend");
    h3_comm_nccl_create_fn create;
    h3_backend_cuda_stream_fn stream_of;
    void *sym = dlsym(g_cuda_slot.handle, H3_COMM_NCCL_ENTRY);
    memcpy(&create, &sym, sizeof create);
    sym = dlsym(g_cuda_slot.handle, H3_BACKEND_CUDA_STREAM_ENTRY);
    memcpy(&stream_of, &sym, sizeof stream_of);
    if (!create || !stream_of)
        return h3_err(H3_E_UNSUPPORTED,
                      "cuda: %s has no NCCL communicator (it exports no %s): this build cannot split a render over "
                      "GPUs", g_cuda_slot.path, !create ? H3_COMM_NCCL_ENTRY : H3_BACKEND_CUDA_STREAM_ENTRY);
    /* the barrier's word per rank, device memory */
    if (!(*scratch = be->mem->alloc(be, sizeof(int32_t) * (size_t)t->world_size))) return -H3_E_NOMEM;
    const h3_nccl_opts o = {sizeof(h3_nccl_opts), t->rank, t->world_size, t->rendezvous, t->nccl_lib, 0,
                            stream_of(be), *scratch, comm_sync, be, host_err};
    int rc = create(&o, out);
    if (rc) {
        be->mem->release(be, *scratch);
        *scratch = NULL;
    }
    return rc;
#endif
}
