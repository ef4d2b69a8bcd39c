/*
 * cuDNN's fused attention (SDPA) for libh3's CUDA backend: the API of cuda_sdpa.h over the cuDNN
 * frontend's graph API (cudnn_frontend::graph), with cuDNN loaded at run time.
 *
 * Built with -DH3_WITH_CUDNN (the Makefile adds it when the cuDNN and cudnn-frontend headers are
 * found) this file holds the real thing; without it, only a stub that answers "built without
 * cuDNN". The frontend is a large header-only C++17 library, so it lives in this one translation
 * unit, which has no device code: everything below is hidden from nvcc's device passes.
 *
 * Loading. The frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: it never calls
 * cuDNN directly but resolves each entry point with dlsym on cudnn_frontend::cudnn_dlhandle, which
 * this file defines and sets once (see load_cudnn) before any frontend call; libh3_cuda itself has
 * no link-time dependency on cuDNN. cuDNN 9's libcudnn.so.9 is a small dispatcher that dlopens its
 * sub-libraries (libcudnn_graph.so.9, the engines, the heuristics) by name when first called; it
 * finds them next to itself through its own RUNPATH ($ORIGIN), which glibc applies to dlopen calls
 * made from that library, so neither RTLD_GLOBAL nor an LD_LIBRARY_PATH entry is needed for that,
 * and the library is opened RTLD_LOCAL (global symbols could shadow another copy of cuDNN in the
 * process, e.g. torch's). Two things are still done by hand (open_sub_libraries), before the first
 * cuDNN call: (1) libcudnn_graph.so.9 is opened, because a dispatcher that cannot load it prints
 * "Invalid handle. Cannot load symbol ..." and aborts the process (a lone libcudnn.so.9 does that),
 * so a missing or broken one becomes a reason instead; (2) the graph-API sub-libraries are opened
 * from the dispatcher's folder by full path, because glibc searches LD_LIBRARY_PATH before a
 * RUNPATH: with another cuDNN 9 on LD_LIBRARY_PATH the dispatcher could otherwise mix in that
 * copy's sub-libraries (CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH); loaded ones are reused.
 *
 * The frontend also calls a few CUDA runtime functions through a shared libcudart it dlopens
 * itself (libh3_cuda links the runtime statically, so there is none to share). The forward SDPA
 * path avoids them: the graph is told the GPU's compute capability (no device query), CUDA-graph
 * retention is off (no capture-status query on each execute; libh3 records no CUDA graphs), and
 * the forward pass needs no workspace initialisation. The one remaining use, a best-effort check
 * that the thread has a current context, degrades to "yes" without a libcudart.
 *
 * Caching. One cuDNN handle per device (created on first use, kept for the life of the process),
 * one built graph per (device, L_q, L_k, heads, kv_heads, D, leading dimensions, scale, causal),
 * failures included, so a shape cuDNN cannot run costs one attempt. Graphs hold compiled kernels,
 * so the cache is bounded (least recently used entries go first). One workspace per device,
 * allocated with cudaMalloc when a graph needs more than the current one and kept; when calls
 * come from two streams, the second waits on an event recorded after the first's last use.
 * These objects are deliberately never destroyed: at process exit cuDNN and the CUDA runtime may
 * already be torn down, and destroying descriptors then can crash.
 *
 * Determinism. The forward kernel has no atomics or split reductions; the plan is the first that
 * builds in cuDNN's heuristics order (mode A), which is the same for the same shape, GPU and cuDNN
 * version; engine configurations that cuDNN marks NONDETERMINISTIC are excluded before support is
 * checked.
 */
#include "backend/cuda/cuda_sdpa.h"
#include "h3.h"

/* Host code only: nvcc's device passes see an empty file (and skip the frontend's headers). */
#if !defined(__CUDA_ARCH__)

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

namespace {

void say(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A one-line message into buf (nothing when buf is NULL or cap is 0): newlines and tabs of
   multi-line library messages become spaces, runs of spaces collapse. */
void say(char *buf, size_t cap, const char *fmt, ...)
{
    if (!buf || cap == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    size_t w = 0;
    for (size_t r = 0; buf[r]; r++) {
        char c = buf[r];
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
        if (c == ' ' && (w == 0 || buf[w - 1] == ' ')) continue;
        buf[w++] = c;
    }
    while (w > 0 && buf[w - 1] == ' ') w--;
    buf[w] = '\0';
}

} /* namespace */

#if !defined(H3_WITH_CUDNN)

extern "C" int h3_cudnn_sdpa_available(char *why, size_t cap)
{
    say(why, cap, "built without cuDNN");
    return 0;
}

extern "C" void h3_cudnn_set_lib(const char *) {}

extern "C" int h3_cudnn_sdpa(cudaStream_t, const void *, const void *, const void *, void *, int64_t, int64_t, int, int,
                             int, int64_t, int64_t, int64_t, int64_t, float, int, char *err, size_t cap)
{
    say(err, cap, "cudnn: built without cuDNN");
    return -H3_E_UNSUPPORTED;
}

extern "C" int h3_cudnn_sdpa_fp8(cudaStream_t, const void *, const void *, const void *, void *, const float *, float *,
                                 int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t, int64_t, float, char *err,
                                 size_t cap)
{
    say(err, cap, "cudnn: built without cuDNN");
    return -H3_E_UNSUPPORTED;
}

#else /* H3_WITH_CUDNN */

#ifndef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#error "cuda_sdpa_cudnn.cu must be built with -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (libh3_cuda never links cuDNN)"
#endif

#include <cudnn_frontend.h>

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

/* The handle the frontend resolves cuDNN's entry points through (declared extern by its shim). */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace {

namespace fe = cudnn_frontend;

constexpr int64_t UID_Q = 1, UID_K = 2, UID_V = 3, UID_O = 4;
/* fp8 graphs' scalars (the order of h3_cudnn_sdpa_fp8's `scales`), then its amax outputs. */
constexpr int64_t UID_SCALE0 = 10, UID_AMAX_S = 20, UID_AMAX_O = 21;
constexpr int N_SCALES = 6;
constexpr size_t CACHE_MAX = 64;

/* (device, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale bits, causal, fp8) */
typedef std::array<int64_t, 13> Key;

struct Entry {
    std::shared_ptr<fe::graph::Graph> graph; /* null when building failed */
    std::string fail;                        /* why, when it failed */
    int64_t workspace = 0;
    uint64_t used = 0; /* last use, for eviction */
};

struct Device {
    bool tried = false;
    cudnnHandle_t handle = nullptr;
    std::string why; /* why no handle */
    int sm = 0;      /* compute capability, major * 10 + minor */
    void *ws = nullptr;
    size_t ws_bytes = 0;
    cudaEvent_t ws_done = nullptr; /* recorded on ws_stream after each use of ws */
    cudaStream_t ws_stream = nullptr;
    bool ws_pending = false;
};

struct State {
    std::mutex mu;
    bool load_tried = false;
    bool loaded = false;
    std::string load_msg; /* the description, or why loading failed */
    std::string lib_path; /* H3_CUDNN_LIB (h3_cudnn_set_lib), tried first */
    std::map<int, Device> devices;
    std::map<Key, Entry> cache;
    uint64_t clock = 0;
};

/* Never destroyed (see the file comment). */
State &state()
{
    static State *s = new State;
    return *s;
}

std::string dl_error()
{
    const char *e = dlerror();
    return e ? e : "unknown error";
}

/* cuDNN 9 numbers versions major * 10000 + minor * 100 + patch; cuDNN 8 major * 1000 + ... */
std::string version_string(size_t v)
{
    char b[32];
    if (v >= 90000)
        snprintf(b, sizeof b, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(b, sizeof b, "%zu.%zu.%zu", v / 1000, v / 100 % 10, v % 100);
    return b;
}

/* Where a dlopen handle's file is, for messages. */
std::string path_of(void *h, const char *fallback)
{
    struct link_map *lm = nullptr;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) return lm->l_name;
    return fallback;
}

/* Open the sub-libraries of the cuDNN whose dispatcher is `lib` (a path), before any cuDNN call.
   libcudnn_graph.so.9 is required: every entry point the frontend uses lives there, and when the
   dispatcher cannot load it, it prints "Invalid handle. Cannot load symbol ..." and aborts the
   process (seen with a lone libcudnn.so.9). It is taken from the dispatcher's folder when it is
   there, else through the loader's search. The other graph-API sub-libraries in that folder are
   opened too, best effort (the set differs between versions). Opening them by full path first
   makes the dispatcher's own dlopen calls reuse these copies (glibc matches a loaded library by
   soname and by file), not another cuDNN that comes first on LD_LIBRARY_PATH (see the file
   comment). The legacy-API libraries (ops, cnn, adv) are left to cuDNN, which loads them only for
   that API. The handles stay open for the life of the process. */
bool open_sub_libraries(const std::string &lib, std::string *err)
{
    const size_t slash = lib.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string() : lib.substr(0, slash + 1);
    void *graph = nullptr;
    const std::string local = dir + "libcudnn_graph.so.9";
    if (!dir.empty() && access(local.c_str(), F_OK) == 0) {
        dlerror();
        graph = dlopen(local.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!graph) {
            *err = dl_error();
            return false;
        }
    } else {
        dlerror();
        graph = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!graph) {
            *err = dl_error();
            return false;
        }
    }
    static const char *const others[] = {
        "libcudnn_heuristic.so.9",     "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
        "libcudnn_engines_tensor_ir.so.9", "libcudnn_ext.so.9",
    };
    for (const char *n : others) {
        const std::string p = dir + n;
        if (dir.empty() || access(p.c_str(), F_OK) != 0) continue;
        if (!dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) (void)dlerror(); /* cuDNN reports what it needs */
    }
    return true;
}

/* Open libcudnn.so.9 (H3_CUDNN_LIB first, then the loader's search), check its version and hand it
   to the frontend. Called once, under the lock. */
void load_cudnn(State &st)
{
    st.load_tried = true;
    void *h = nullptr;
    std::string note; /* what happened to H3_CUDNN_LIB, when it was set but not used */
    const char *env = st.lib_path.c_str();
    if (env[0]) {
        dlerror();
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) note = std::string("H3_CUDNN_LIB=") + env + ": " + dl_error();
    }
    if (!h) {
        dlerror();
        h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            st.load_msg = (note.empty() ? "" : note + "; ") + dl_error() +
                          " (install cuDNN 9, or set H3_CUDNN_LIB to the full path of libcudnn.so.9)";
            return;
        }
    }
    const std::string where = path_of(h, "libcudnn.so.9");
    std::string sub_err;
    if (!open_sub_libraries(where, &sub_err)) {
        st.load_msg = where + ": its sub-library libcudnn_graph.so.9 cannot be loaded (" + sub_err +
                      "); a cuDNN 9 installation keeps all its libcudnn_*.so.9 in one folder";
        dlclose(h);
        return;
    }
    typedef size_t (*version_fn)(void);
    dlerror();
    version_fn get_version = reinterpret_cast<version_fn>(dlsym(h, "cudnnGetVersion"));
    version_fn get_cudart = reinterpret_cast<version_fn>(dlsym(h, "cudnnGetCudartVersion"));
    if (!get_version) {
        st.load_msg = where + " has no cudnnGetVersion: not a cuDNN library";
        dlclose(h);
        return;
    }
    const size_t v = get_version();
    if (v < 90000) {
        st.load_msg = "cuDNN " + version_string(v) + " (" + where + ") is older than 9.0";
        dlclose(h);
        return;
    }
    fe::cudnn_dlhandle = h;
    st.loaded = true;
    char desc[512];
    const size_t rt = get_cudart ? get_cudart() : 0;
    snprintf(desc, sizeof desc, "cuDNN %s for CUDA %zu.%zu (%s)%s%s", version_string(v).c_str(), rt / 1000,
             rt % 1000 / 10, where.c_str(), note.empty() ? "" : "; ", note.c_str());
    st.load_msg = desc;
}

/* The cuDNN handle of the current device, or null with the reason in *why. Under the lock, after
   a successful load. */
Device *device(State &st, std::string *why)
{
    int dev = -1;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *why = std::string("no current CUDA device: ") + cudaGetErrorString(e);
        return nullptr;
    }
    Device &d = st.devices[dev];
    if (!d.tried) {
        d.tried = true;
        int major = 0, minor = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            d.why = "cannot read the GPU's compute capability";
        } else {
            d.sm = major * 10 + minor;
            cudnnStatus_t s = fe::detail::create_handle(&d.handle);
            if (s != CUDNN_STATUS_SUCCESS) {
                d.handle = nullptr;
                d.why = std::string("cudnnCreate failed: ") + fe::detail::get_error_string(s);
            }
        }
    }
    if (!d.handle) {
        *why = d.why;
        return nullptr;
    }
    return &d;
}

/* One step of a graph build: true when it went well, else the failure is recorded in `en`. */
bool step_ok(Entry &en, const char *step, fe::error_t r)
{
    if (r.is_good()) return true;
    en.fail = std::string(step) + ": " + r.get_message();
    return false;
}

/* Build the graph of one shape: validate, lower, query heuristics (mode A), drop non-deterministic
   engine configurations, check support, build the first plan that builds. */
void build(Entry &en, const Device &d, int64_t Lq, int64_t Lk, int64_t heads, int64_t kvh, int64_t D, int64_t ldq,
           int64_t ldk, int64_t ldv, int64_t ldo, float scale, bool causal, bool fp8)
{
    const fe::DataType_t io = fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::BFLOAT16;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    g->set_sm_version(d.sm);
    g->set_cuda_graph_retention(fe::CudaGraphRetention_t::NONE);

    /* Dims in (batch, heads, seq, dim) order, strides describing libh3's rows in place: one batch,
       head h at element offset h*D of a row, rows ld elements apart. */
    auto tensor = [&](const char *name, int64_t uid, int64_t h, int64_t L, int64_t ld) {
        return fe::graph::Tensor_attributes()
            .set_name(name)
            .set_uid(uid)
            .set_data_type(io)
            .set_dim({1, h, L, D})
            .set_stride({L * ld, D, ld, 1});
    };
    auto q = g->tensor(tensor("Q", UID_Q, heads, Lq, ldq));
    auto k = g->tensor(tensor("K", UID_K, kvh, Lk, ldk));
    auto v = g->tensor(tensor("V", UID_V, kvh, Lk, ldv));

    auto opt = fe::graph::SDPA_attributes().set_name("h3_sdpa").set_generate_stats(false).set_attn_scale(scale);
    if (causal) {
        /* libh3's diagonal is bottom-right (query i sees keys j <= i + Lk - Lq); for Lq == Lk that
           is the usual top-left one, which more engines support. */
        opt.set_diagonal_alignment(Lq == Lk ? fe::DiagonalAlignment_t::TOP_LEFT
                                            : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
            .set_diagonal_band_right_bound(0);
    }
    std::shared_ptr<fe::graph::Tensor_attributes> o;
    if (fp8) {
        /* Per-tensor scalars (f32 [1,1,1,1] in device memory): descale Q, K, V and S (the softmax
           probabilities' e4m3 copy), scale S, scale O; the amax outputs are required by the node. */
        std::shared_ptr<fe::graph::Tensor_attributes> sc[N_SCALES];
        static const char *const names[N_SCALES] = {"descale_q", "descale_k", "descale_v",
                                                    "descale_s", "scale_s",   "scale_o"};
        for (int i = 0; i < N_SCALES; i++)
            sc[i] = g->tensor(fe::graph::Tensor_attributes()
                                  .set_name(names[i])
                                  .set_uid(UID_SCALE0 + i)
                                  .set_data_type(fe::DataType_t::FLOAT)
                                  .set_dim({1, 1, 1, 1})
                                  .set_stride({1, 1, 1, 1}));
        auto outs = g->sdpa_fp8(q, k, v, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], opt);
        o = outs[0];
        const int64_t amax_uid[2] = {UID_AMAX_S, UID_AMAX_O};
        for (int i = 0; i < 2; i++)
            if (outs[2 + i])
                outs[2 + i]->set_output(true).set_uid(amax_uid[i]).set_data_type(fe::DataType_t::FLOAT).set_dim(
                    {1, 1, 1, 1}).set_stride({1, 1, 1, 1});
    } else {
        o = g->sdpa(q, k, v, opt)[0];
    }
    o->set_output(true).set_uid(UID_O).set_data_type(io).set_dim({1, heads, Lq, D}).set_stride({Lq * ldo, D, ldo, 1});

    int64_t ws = 0;
    if (!step_ok(en, "validate", g->validate()) ||
        !step_ok(en, "build_operation_graph", g->build_operation_graph(d.handle)) ||
        !step_ok(en, "create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A})))
        return;
    g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    if (!step_ok(en, "check_support", g->check_support()) ||
        !step_ok(en, "build_plans", g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) ||
        !step_ok(en, "get_workspace_size", g->get_workspace_size(ws)))
        return;
    en.graph = std::move(g);
    en.workspace = ws;
}

/* Drop least recently used graphs until there is room for one more. A plan's kernels may still be
   queued, and destroying the plan can unload their code: wait for the device first (rare: it takes
   more than CACHE_MAX shapes). */
void evict(State &st)
{
    if (st.cache.size() < CACHE_MAX) return;
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    while (st.cache.size() >= CACHE_MAX) {
        auto oldest = st.cache.begin();
        for (auto it = st.cache.begin(); it != st.cache.end(); ++it)
            if (it->second.used < oldest->second.used) oldest = it;
        st.cache.erase(oldest);
    }
}

/* A workspace of at least `bytes` on the current device, ordered after its last use on another
   stream. Returns 0, or a negative code with the reason. */
int workspace(Device &d, cudaStream_t s, size_t bytes, void **out, std::string *why)
{
    *out = nullptr;
    if (bytes == 0) return 0;
    cudaError_t e;
    if (d.ws_bytes < bytes) {
        /* cudaFree waits for the work queued on the device, so nothing still reads the old one. */
        if (d.ws) cudaFree(d.ws);
        d.ws = nullptr;
        d.ws_bytes = 0;
        d.ws_pending = false;
        const size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        if ((e = cudaMalloc(&d.ws, want)) != cudaSuccess) {
            (void)cudaGetLastError();
            d.ws = nullptr;
            char b[160];
            snprintf(b, sizeof b, "cannot allocate %.1f MiB of workspace: %s", (double)want / 1048576.0,
                     cudaGetErrorString(e));
            *why = b;
            return e == cudaErrorMemoryAllocation ? -H3_E_NOMEM : -H3_E_UNSUPPORTED;
        }
        d.ws_bytes = want;
    }
    if (!d.ws_done) {
        if ((e = cudaEventCreateWithFlags(&d.ws_done, cudaEventDisableTiming)) != cudaSuccess) {
            (void)cudaGetLastError();
            d.ws_done = nullptr;
            *why = std::string("cannot create an event: ") + cudaGetErrorString(e);
            return -H3_E_UNSUPPORTED;
        }
    }
    if (d.ws_pending && d.ws_stream != s) {
        if ((e = cudaStreamWaitEvent(s, d.ws_done, 0)) != cudaSuccess) {
            (void)cudaGetLastError();
            *why = std::string("cannot order the workspace between streams: ") + cudaGetErrorString(e);
            return -H3_E_UNSUPPORTED;
        }
    }
    *out = d.ws;
    return 0;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

int sdpa(cudaStream_t s, const void *Q, const void *K, const void *V, void *O, const float *scales, float *amax,
         int64_t Lq, int64_t Lk, int heads, int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo,
         float scale, int causal, char *err, size_t cap)
{
    const bool fp8 = scales != nullptr;
    /* Elements per 16 bytes: bf16 rows need multiples of 8, e4m3 rows of 16. */
    const int64_t vec = fp8 ? 16 : 8;
    /* Arguments first: what cuDNN cannot take is refused before anything is loaded. */
    if (Lq < 0 || Lk < 0 || heads <= 0 || kv_heads <= 0 || D <= 0 || heads % kv_heads) {
        say(err, cap, "cudnn: sdpa: L_q %lld, L_k %lld, %d heads, %d kv heads, head dim %d", (long long)Lq,
            (long long)Lk, heads, kv_heads, D);
        return -H3_E_INVALID;
    }
    if (Lq == 0) return 0;
    if (!Q || !K || !V || !O) {
        say(err, cap, "cudnn: sdpa: missing Q, K, V or O");
        return -H3_E_INVALID;
    }
    const int64_t A = (int64_t)heads * D, AK = (int64_t)kv_heads * D;
    if (ldq < A || ldo < A || ldk < AK || ldv < AK) {
        say(err, cap, "cudnn: sdpa: row strides q %lld, k %lld, v %lld, o %lld are shorter than a row (%lld, %lld)",
            (long long)ldq, (long long)ldk, (long long)ldv, (long long)ldo, (long long)A, (long long)AK);
        return -H3_E_INVALID;
    }
    if (Lk == 0) {
        say(err, cap, "cudnn: sdpa: no keys");
        return -H3_E_UNSUPPORTED;
    }
    if (D % vec || D > 256) {
        say(err, cap, "cudnn: sdpa: head dim %d (cuDNN takes multiples of %d up to 256)", D, (int)vec);
        return -H3_E_UNSUPPORTED;
    }
    if (fp8 && (!amax || ((uintptr_t)scales & 63) || ((uintptr_t)amax & 15))) {
        say(err, cap, "cudnn: sdpa fp8: the scales (64-byte aligned) or the amax outputs are missing or misaligned");
        return -H3_E_INVALID;
    }
    if (ldq % vec || ldk % vec || ldv % vec || ldo % vec || !aligned16(Q) || !aligned16(K) || !aligned16(V) ||
        !aligned16(O)) {
        say(err, cap, "cudnn: sdpa: rows or pointers not 16-byte aligned");
        return -H3_E_UNSUPPORTED;
    }
    if (Lq > INT32_MAX || Lk > INT32_MAX) {
        say(err, cap, "cudnn: sdpa: %lld x %lld tokens is too many", (long long)Lq, (long long)Lk);
        return -H3_E_UNSUPPORTED;
    }
    if (causal && Lq > Lk) {
        /* The first Lq - Lk queries would see no key (libh3 writes zeros there). */
        say(err, cap, "cudnn: sdpa: causal with more queries (%lld) than keys (%lld)", (long long)Lq, (long long)Lk);
        return -H3_E_UNSUPPORTED;
    }
    if (!(scale > 0.0f) || scale > 3.0e38f) {
        say(err, cap, "cudnn: sdpa: scale must be positive and finite, got %g", (double)scale);
        return -H3_E_INVALID;
    }

    State &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.load_tried) load_cudnn(st);
    if (!st.loaded) {
        say(err, cap, "cudnn: %s", st.load_msg.c_str());
        return -H3_E_UNSUPPORTED;
    }
    std::string why;
    Device *d = device(st, &why);
    if (!d) {
        say(err, cap, "cudnn: %s", why.c_str());
        return -H3_E_UNSUPPORTED;
    }
    int dev = 0;
    (void)cudaGetDevice(&dev);
    uint32_t sbits;
    memcpy(&sbits, &scale, sizeof sbits);
    const Key key = {dev, Lq, Lk, heads, kv_heads, D, ldq, ldk, ldv, ldo, (int64_t)sbits, causal ? 1 : 0, fp8 ? 1 : 0};

    auto it = st.cache.find(key);
    if (it == st.cache.end()) {
        evict(st);
        it = st.cache.emplace(key, Entry()).first;
        build(it->second, *d, Lq, Lk, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale, causal != 0, fp8);
    }
    Entry &en = it->second;
    en.used = ++st.clock;
    if (!en.graph) {
        say(err, cap, "cudnn: sdpa%s %lld x %lld, %d heads (%d kv) of %d%s: %s", fp8 ? " fp8" : "", (long long)Lq,
            (long long)Lk, heads, kv_heads, D, causal ? ", causal" : "", en.fail.c_str());
        return -H3_E_UNSUPPORTED;
    }

    void *ws = nullptr;
    int rc = workspace(*d, s, (size_t)en.workspace, &ws, &why);
    if (rc) {
        say(err, cap, "cudnn: sdpa: %s", why.c_str());
        return rc;
    }
    cudnnStatus_t cs = fe::detail::set_stream(d->handle, s);
    if (cs != CUDNN_STATUS_SUCCESS) {
        say(err, cap, "cudnn: cudnnSetStream failed: %s", fe::detail::get_error_string(cs));
        return -H3_E_UNSUPPORTED;
    }
    std::unordered_map<int64_t, void *> pack = {{UID_Q, const_cast<void *>(Q)},
                                                {UID_K, const_cast<void *>(K)},
                                                {UID_V, const_cast<void *>(V)},
                                                {UID_O, O}};
    if (fp8) {
        /* One scalar every 16 floats (64 bytes apart): each its own aligned tensor. */
        for (int i = 0; i < N_SCALES; i++) pack[UID_SCALE0 + i] = const_cast<float *>(scales + 16 * i);
        pack[UID_AMAX_S] = amax;
        pack[UID_AMAX_O] = amax + 4;
    }
    fe::error_t r = en.graph->execute(d->handle, pack, ws);
    if (r.is_bad()) {
        say(err, cap, "cudnn: sdpa %lld x %lld, %d heads of %d: execute: %s", (long long)Lq, (long long)Lk, heads, D,
            r.get_message().c_str());
        return -H3_E_UNSUPPORTED;
    }
    if (ws) {
        cudaError_t e = cudaEventRecord(d->ws_done, s);
        if (e != cudaSuccess) {
            /* The attention is queued; only the cross-stream ordering is lost: wait instead. */
            (void)cudaGetLastError();
            (void)cudaStreamSynchronize(s);
            d->ws_pending = false;
        } else {
            d->ws_pending = true;
            d->ws_stream = s;
        }
    }
    return 0;
}

} /* namespace */

extern "C" void h3_cudnn_set_lib(const char *path)
{
    try {
        State &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        if (!st.load_tried) st.lib_path = path ? path : "";
    } catch (...) {
        /* out of memory copying a path: the loader's search still runs */
    }
}

extern "C" int h3_cudnn_sdpa_available(char *why, size_t cap)
{
    try {
        State &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        if (!st.load_tried) load_cudnn(st);
        if (!st.loaded) {
            say(why, cap, "%s", st.load_msg.c_str());
            return 0;
        }
        std::string w;
        if (!device(st, &w)) {
            say(why, cap, "%s", w.c_str());
            return 0;
        }
        say(why, cap, "%s", st.load_msg.c_str());
        return 1;
    } catch (const std::exception &e) {
        say(why, cap, "cuDNN: %s", e.what());
    } catch (...) {
        say(why, cap, "cuDNN: unknown exception");
    }
    return 0;
}

extern "C" int h3_cudnn_sdpa(cudaStream_t s, const void *Q, const void *K, const void *V, void *O, int64_t L_q,
                             int64_t L_k, int heads, int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv,
                             int64_t ldo, float scale, int causal, char *err, size_t cap)
{
    /* The frontend reports most failures as values but may throw (a missing symbol, a bad_alloc):
       nothing may cross the C boundary. */
    try {
        return sdpa(s, Q, K, V, O, nullptr, nullptr, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale, causal,
                    err, cap);
    } catch (const std::exception &e) {
        say(err, cap, "cudnn: sdpa: %s", e.what());
    } catch (...) {
        say(err, cap, "cudnn: sdpa: unknown exception");
    }
    return -H3_E_UNSUPPORTED;
}

extern "C" int h3_cudnn_sdpa_fp8(cudaStream_t s, const void *Q, const void *K, const void *V, void *O,
                                 const float *scales, float *amax, int64_t L_q, int64_t L_k, int heads, int kv_heads,
                                 int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo, float scale, char *err,
                                 size_t cap)
{
    if (!scales) {
        say(err, cap, "cudnn: sdpa fp8: no scales");
        return -H3_E_INVALID;
    }
    try {
        return sdpa(s, Q, K, V, O, scales, amax, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale, 0, err, cap);
    } catch (const std::exception &e) {
        say(err, cap, "cudnn: sdpa fp8: %s", e.what());
    } catch (...) {
        say(err, cap, "cudnn: sdpa fp8: unknown exception");
    }
    return -H3_E_UNSUPPORTED;
}

#endif /* H3_WITH_CUDNN */
#endif /* !__CUDA_ARCH__ */
