/*
 * cuDNN's fused attention (SDPA) for libh3's CUDA backend: the API of cuda_sdpa.h over cuDNN 9's
 * backend (graph) API, with cuDNN loaded at run time. Plain C++17 host code: no CUDA or cuDNN
 * header is needed to build it (cudnn_api.h declares the subset used); the backend's device
 * memory and stream waits come in as callbacks (struct h3_cudnn_host).
 *
 * The graphs. Each call shape gets the operation graph that NVIDIA's cudnn-frontend 1.32 (the
 * library this file used before, built against cuDNN 9.19's headers, as libh3's GPU builds were)
 * builds for `sdpa` / `sdpa_fp8` forward with the same options, node for node: the same
 * operations in the same order, the same tensors (uids, dims, strides, data types, virtual and
 * by-value flags, 16-byte alignment), the same descriptor attributes, the same engine choice. So
 * cuDNN's heuristics see the same graph and pick the same engine, and the output is the same bits.
 * Three shapes of graph, as the frontend chooses them:
 *   - bf16 without a mask on cuDNN 9.13.1 or newer: one fused SDPA operation
 *     (OPERATION_SDPA_FWD: Q, K, V, O and the scale as a by-value scalar);
 *   - bf16 with the causal mask, or on older cuDNN: the composite graph: S = Q K^T, S *= scale,
 *     [mask: row and column indices, row + L_k - L_q >= column (bottom-right diagonal, the
 *     offsets only when L_q != L_k), masked scores = -inf], softmax as max / subtract / exp / sum
 *     / log / add (the statistics, virtual) / divide, O = P V;
 *   - fp8 (e4m3): the composite graph with the descales of Q and K after the scale, P's amax,
 *     P8 = P * scale_s, O = P8 V, descale S and V, O's amax, O8 = O * scale_o.
 * The frontend's checks of the shape against the cuDNN version and GPU (validate) are repeated
 * with the frontend's reasons.
 *
 * Engine choice (the frontend's create_execution_plans(HEUR_MODE_A), deselect NONDETERMINISTIC,
 * check_support, build_plans(HEURISTICS_CHOICE)): cuDNN's heuristics in mode A list engine
 * configurations best first; configurations whose engine carries the NONDETERMINISTIC numerical
 * note are skipped, as are those whose workspace size cannot be read (cuDNN 9.2+); the first whose
 * execution plan finalizes is used. The order is the same for the same graph, GPU and cuDNN
 * version, so the same engine runs every time.
 *
 * Loading. libcudnn.so.9 is a small dispatcher that dlopens its sub-libraries (libcudnn_graph.so.9,
 * the engines, the heuristics) by name when first called; it finds them next to itself through its
 * own RUNPATH ($ORIGIN), which glibc applies to dlopen calls made from that library, so neither
 * RTLD_GLOBAL nor an LD_LIBRARY_PATH entry is needed for that, and the library is opened
 * RTLD_LOCAL (global symbols could shadow another copy of cuDNN in the process, e.g. torch's).
 * Two things are still done by hand (open_sub_libraries), before the first cuDNN call: (1)
 * libcudnn_graph.so.9 is opened, because a dispatcher that cannot load it prints "Invalid handle.
 * Cannot load symbol ..." and aborts the process (a lone libcudnn.so.9 does that), so a missing or
 * broken one becomes a reason instead; (2) the graph-API sub-libraries are opened from the
 * dispatcher's folder by full path, because glibc searches LD_LIBRARY_PATH before a RUNPATH: with
 * another cuDNN 9 on LD_LIBRARY_PATH the dispatcher could otherwise mix in that copy's
 * sub-libraries (CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH); loaded ones are reused. Every entry
 * point is then looked up in the dispatcher (dlsym) into a table.
 *
 * Caching. One cuDNN handle per device (created on first use, kept for the life of the process),
 * one built graph per (device, L_q, L_k, heads, kv_heads, D, leading dimensions, scale, causal),
 * failures included, so a shape cuDNN cannot run costs one attempt. Graphs hold compiled kernels,
 * so the cache is bounded (least recently used entries go first, after the stream they last ran
 * on has drained). One workspace per device, allocated through the host's dev_alloc when a graph
 * needs more than the current one and kept; before it is freed, or used on another stream than
 * the last, the last stream is waited for (host->stream_sync). The handles and the workspace are
 * deliberately never destroyed: at process exit cuDNN and the driver may already be torn down,
 * and destroying them then can crash.
 *
 * Determinism. The forward kernels have no atomics or split reductions; the engine is chosen as
 * above; non-deterministic engines are excluded before support is checked.
 */
#include "backend/cuda/cuda_sdpa.h"
#include "backend/cuda/cudnn_api.h"
#include "h3.h"

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <array>
#include <exception>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

/* The cuDNN version the frontend was compiled against in libh3's GPU builds (cuDNN 9.19's
   headers): it caps the version the frontend's choices depend on (min of this and the loaded
   library's), so the graphs stay those of that build on newer cuDNN too. */
constexpr size_t FE_COMPILED = 91900;

constexpr int64_t UID_Q = 1, UID_K = 2, UID_V = 3, UID_O = 4, UID_ATTN_SCALE = 5;
/* fp8 graphs' scalars (the order of h3_cudnn_sdpa_fp8's `scales`), then its amax outputs. */
constexpr int64_t UID_SCALE0 = 10, UID_AMAX_S = 20, UID_AMAX_O = 21;
constexpr int N_SCALES = 6;
constexpr size_t CACHE_MAX = 64;

/* The entry points, looked up in the dispatcher. */
struct Api {
    cudnnGetVersion_fn GetVersion = nullptr;
    cudnnGetCudartVersion_fn GetCudartVersion = nullptr;
    cudnnGetErrorString_fn GetErrorString = nullptr;
    cudnnGetLastErrorString_fn GetLastErrorString = nullptr; /* optional */
    cudnnCreate_fn Create = nullptr;
    cudnnSetStream_fn SetStream = nullptr;
    cudnnBackendCreateDescriptor_fn CreateDescriptor = nullptr;
    cudnnBackendDestroyDescriptor_fn DestroyDescriptor = nullptr;
    cudnnBackendFinalize_fn Finalize = nullptr;
    cudnnBackendSetAttribute_fn SetAttribute = nullptr;
    cudnnBackendGetAttribute_fn GetAttribute = nullptr;
    cudnnBackendExecute_fn Execute = nullptr;
};

/* (device, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale bits, causal, fp8) */
typedef std::array<int64_t, 13> Key;

struct Entry {
    bool built = false;
    std::string fail;                        /* why, when it failed */
    std::vector<cudnnBackendDescriptor_t> descs; /* everything the graph and plan are made of */
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace = 0;
    /* the by-value scalars (host memory the variant pack points at) */
    float attn_scale = 0.0f, neg_inf = 0.0f;
    int32_t kv_len = 0, q_len = 0;
    std::vector<std::pair<int64_t, void *>> host_args; /* the by-value scalars' uids and values */
    uint64_t used = 0;           /* last use, for eviction */
    void *last_stream = nullptr; /* where it last ran */
    bool ran = false;
};

struct Device {
    bool tried = false;
    cudnnHandle_t handle = nullptr;
    std::string why; /* why no handle */
    int sm = 0;      /* compute capability, major * 10 + minor */
    void *ws = nullptr;
    size_t ws_bytes = 0;
    void *ws_stream = nullptr; /* the stream that last used ws */
    bool ws_pending = false;
};

struct State {
    std::mutex mu;
    bool load_tried = false;
    bool loaded = false;
    size_t version = 0;
    std::string load_msg; /* the description, or why loading failed */
    std::string lib_path; /* H3_CUDNN_LIB (h3_cudnn_set_lib), tried first */
    Api api;
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
   libcudnn_graph.so.9 is required: the backend API lives there, and when the dispatcher cannot
   load it, it prints "Invalid handle. Cannot load symbol ..." and aborts the process (seen with a
   lone libcudnn.so.9). It is taken from the dispatcher's folder when it is there, else through the
   loader's search. The other graph-API sub-libraries in that folder are opened too, best effort
   (the set differs between versions). Opening them by full path first makes the dispatcher's own
   dlopen calls reuse these copies (glibc matches a loaded library by soname and by file), not
   another cuDNN that comes first on LD_LIBRARY_PATH (see the file comment). The legacy-API
   libraries (ops, cnn, adv) are left to cuDNN, which loads them only for that API. The handles
   stay open for the life of the process. */
bool open_sub_libraries(const std::string &lib, std::string *err)
{
    const size_t slash = lib.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string() : lib.substr(0, slash + 1);
    void *graph = nullptr;
    const std::string local = dir + "libcudnn_graph.so.9";
    dlerror();
    if (!dir.empty() && access(local.c_str(), F_OK) == 0)
        graph = dlopen(local.c_str(), RTLD_NOW | RTLD_LOCAL);
    else
        graph = dlopen("libcudnn_graph.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!graph) {
        *err = dl_error();
        return false;
    }
    static const char *const others[] = {
        "libcudnn_heuristic.so.9",         "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9",
        "libcudnn_engines_tensor_ir.so.9", "libcudnn_ext.so.9",
    };
    for (const char *n : others) {
        const std::string p = dir + n;
        if (dir.empty() || access(p.c_str(), F_OK) != 0) continue;
        if (!dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) (void)dlerror(); /* cuDNN reports what it needs */
    }
    return true;
}

template <typename F> bool resolve(void *h, const char *name, F *out, std::string *missing)
{
    *out = reinterpret_cast<F>(dlsym(h, name));
    if (!*out && missing->empty()) *missing = name;
    return *out != nullptr;
}

/* Open libcudnn.so.9 (H3_CUDNN_LIB first, then the loader's search), check its version and look
   up the entry points. Called once, under the lock. */
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
    Api a;
    std::string missing;
    dlerror();
    if (!resolve(h, "cudnnGetVersion", &a.GetVersion, &missing)) {
        st.load_msg = where + " has no cudnnGetVersion: not a cuDNN library";
        dlclose(h);
        return;
    }
    const size_t v = a.GetVersion();
    if (v < 90000) {
        st.load_msg = "cuDNN " + version_string(v) + " (" + where + ") is older than 9.0";
        dlclose(h);
        return;
    }
    resolve(h, "cudnnGetCudartVersion", &a.GetCudartVersion, &missing);
    resolve(h, "cudnnGetErrorString", &a.GetErrorString, &missing);
    resolve(h, "cudnnCreate", &a.Create, &missing);
    resolve(h, "cudnnSetStream", &a.SetStream, &missing);
    resolve(h, "cudnnBackendCreateDescriptor", &a.CreateDescriptor, &missing);
    resolve(h, "cudnnBackendDestroyDescriptor", &a.DestroyDescriptor, &missing);
    resolve(h, "cudnnBackendFinalize", &a.Finalize, &missing);
    resolve(h, "cudnnBackendSetAttribute", &a.SetAttribute, &missing);
    resolve(h, "cudnnBackendGetAttribute", &a.GetAttribute, &missing);
    resolve(h, "cudnnBackendExecute", &a.Execute, &missing);
    if (!missing.empty()) {
        st.load_msg = "cuDNN " + version_string(v) + " (" + where + ") has no " + missing;
        dlclose(h);
        return;
    }
    std::string unused;
    resolve(h, "cudnnGetLastErrorString", &a.GetLastErrorString, &unused);
    st.api = a;
    st.version = v;
    st.loaded = true;
    char desc[512];
    const size_t rt = a.GetCudartVersion ? a.GetCudartVersion() : 0;
    snprintf(desc, sizeof desc, "cuDNN %s for CUDA %zu.%zu (%s)%s%s", version_string(v).c_str(), rt / 1000,
             rt % 1000 / 10, where.c_str(), note.empty() ? "" : "; ", note.c_str());
    st.load_msg = desc;
}

/* "CUDNN_STATUS_..." and cuDNN's own last message, for reasons. */
std::string status_text(const Api &a, cudnnStatus_t s)
{
    std::string t = a.GetErrorString ? a.GetErrorString(s) : "";
    if (t.empty()) t = "cuDNN status " + std::to_string((int)s);
    if (a.GetLastErrorString) {
        char m[512] = "";
        a.GetLastErrorString(m, sizeof m);
        if (m[0]) t += std::string(" (") + m + ")";
    }
    return t;
}

/* The cuDNN handle of host->device, or null with the reason in *why. Under the lock, after a
   successful load; the device's primary context is current (the caller's contract). */
Device *device(State &st, const h3_cudnn_host *host, std::string *why)
{
    Device &d = st.devices[host->device];
    if (!d.tried) {
        d.tried = true;
        d.sm = host->cc_major * 10 + host->cc_minor;
        cudnnStatus_t s = st.api.Create(&d.handle);
        if (s != CUDNN_STATUS_SUCCESS) {
            d.handle = nullptr;
            d.why = "cudnnCreate failed: " + status_text(st.api, s);
        }
    }
    if (!d.handle) {
        *why = d.why;
        return nullptr;
    }
    return &d;
}

/* ---- graph construction ------------------------------------------------------------------------
   Builds descriptors into an Entry; the first failure is kept with what was being built, and
   everything after it is skipped (each call checks `ok`). */
class Builder {
  public:
    Builder(const Api &a, Entry &en) : a_(a), en_(en) {}

    bool ok() const { return err_.empty(); }
    const std::string &error() const { return err_; }

    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char *what)
    {
        if (!ok()) return nullptr;
        cudnnBackendDescriptor_t d = nullptr;
        cudnnStatus_t s = a_.CreateDescriptor(type, &d);
        if (s != CUDNN_STATUS_SUCCESS || !d) {
            fail(what, "cudnnBackendCreateDescriptor", s);
            return nullptr;
        }
        en_.descs.push_back(d);
        return d;
    }

    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
             int64_t count, const void *v, const char *what)
    {
        if (!ok()) return;
        cudnnStatus_t s = a_.SetAttribute(d, name, type, count, v);
        if (s != CUDNN_STATUS_SUCCESS) fail(what, ("attribute " + std::to_string((int)name)).c_str(), s);
    }

    void finalize(cudnnBackendDescriptor_t d, const char *what)
    {
        if (!ok()) return;
        cudnnStatus_t s = a_.Finalize(d);
        if (s != CUDNN_STATUS_SUCCESS) fail(what, "finalize", s);
    }

    void fail(const char *what, const char *step, cudnnStatus_t s)
    {
        if (ok()) err_ = std::string(what) + ": " + step + ": " + status_text(a_, s);
    }
    void fail(const std::string &msg)
    {
        if (ok()) err_ = msg;
    }

    /* A tensor as the frontend describes one: uid, type, dims, strides, 16-byte alignment, and the
       virtual / by-value flags only when set. */
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, std::vector<int64_t> dims,
                                    std::vector<int64_t> strides, bool is_virtual = false, bool by_value = false)
    {
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
        const int64_t align = 16;
        const bool yes = true;
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor");
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor");
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)dims.size(), dims.data(), "tensor");
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)strides.size(), strides.data(), "tensor");
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor");
        if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor");
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor");
        finalize(t, "tensor");
        return t;
    }

    /* A descriptor whose first attribute is its f32 compute type (matmul, reduction). */
    cudnnBackendDescriptor_t f32_desc(cudnnBackendDescriptorType_t type, cudnnBackendAttributeName_t comp,
                                      const char *what)
    {
        cudnnBackendDescriptor_t d = make(type, what);
        const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
        set(d, comp, CUDNN_TYPE_DATA_TYPE, 1, &f32, what);
        return d;
    }

    /* An operation and its tensors and descriptors, set in the order given (null ones left out:
       the optional inputs). */
    cudnnBackendDescriptor_t operation(
        cudnnBackendDescriptorType_t type, const char *what,
        std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> in)
    {
        cudnnBackendDescriptor_t op = make(type, what);
        for (const auto &a : in)
            if (a.second) set(op, a.first, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.second, what);
        return op;
    }

    /* Finalizes an operation and appends it to the graph's list. */
    void append(cudnnBackendDescriptor_t op, const char *what)
    {
        finalize(op, what);
        ops_.push_back(op);
    }

    /* A pointwise operation y = mode(x[, b][, t]) computed in `prec`; `axis` for GEN_INDEX. */
    void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                   int64_t axis = -1)
    {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise descriptor");
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise descriptor");
        if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise descriptor");
        finalize(pw, "pointwise descriptor");
        cudnnBackendDescriptor_t op = operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation",
                                                {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                                                 {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
                                                 {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                                                 {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y},
                                                 {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t}});
        const float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise operation");
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise operation");
        append(op, "pointwise operation");
    }

    /* y = reduce(x) over the dimensions where y has extent 1, in f32. The frontend states
       "not deterministic" explicitly on cuDNN 9.11+, where the attribute exists. */
    void reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                   size_t version)
    {
        cudnnBackendDescriptor_t rd =
            f32_desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, "reduction descriptor");
        set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red, "reduction descriptor");
        if (version >= 91100) {
            const bool no = false;
            set(rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &no, "reduction descriptor");
        }
        finalize(rd, "reduction descriptor");
        append(operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation",
                         {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                          {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                          {CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd}}),
               "reduction operation");
    }

    /* c = a b (batched over the leading dimensions, broadcasting kv heads), f32 accumulation. */
    void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
    {
        cudnnBackendDescriptor_t md =
            f32_desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, "matmul descriptor");
        finalize(md, "matmul descriptor");
        append(operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation",
                         {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                          {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                          {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                          {CUDNN_ATTR_OPERATION_MATMUL_DESC, md}}),
               "matmul operation");
    }

    /* The fused SDPA operation of cuDNN 9.13.1+ (no statistics output). */
    void sdpa_fwd(cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t k, cudnnBackendDescriptor_t v,
                  cudnnBackendDescriptor_t o, cudnnBackendDescriptor_t scale)
    {
        append(operation(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA operation",
                         {{CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q},
                          {CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k},
                          {CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v},
                          {CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o},
                          {CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale}}),
               "SDPA operation");
    }

    /* The operation graph of the operations so far, in order. */
    cudnnBackendDescriptor_t graph(cudnnHandle_t handle)
    {
        cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
        set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph");
        set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops_.size(), ops_.data(),
            "operation graph");
        finalize(g, "operation graph");
        return g;
    }

  private:
    const Api &a_;
    Entry &en_;
    std::vector<cudnnBackendDescriptor_t> ops_;
    std::string err_;
};

/* The shape of one call. */
struct Shape {
    int64_t Lq, Lk, h, kvh, D, ldq, ldk, ldv, ldo;
    float scale;
    bool causal, fp8;
};

/* The frontend's validation of an SDPA forward node for our options (no bias, dropout, paging,
   ragged tensors, sliding window), in its order and words. "" when it passes. */
std::string frontend_validate(const Shape &s, size_t ver, int sm)
{
    const int major = sm / 10;
    const bool bottom_right = s.causal && s.Lq != s.Lk;
    if (bottom_right && ver < 90600 && (s.Lq % 64 != 0 || s.Lk % 64 != 0))
        return "Bottom right causal mask is only supported with s_q multiple of 64, and s_kv multiple of 64, for "
               "cudnn version below 9.6.0";
    if (s.fp8) {
        if (ver < 90100)
            return "sdpa fp8 forward operation is only supported starting cudnn 9.1.0. Please consider upgrading "
                   "your current version.";
        if (ver == 91000)
            return "sdpa fp8 forward operation is not supported on cudnn 9.10.0. Please consider upgrading your "
                   "current version.";
        if (major < 9)
            return "sdpa fp8 forward operation is only supported on Hopper architecture and newer. Please consider "
                   "using a newer architecture.";
        if (major >= 10) {
            if ((s.D > 128 || s.D % 16 != 0) && !(ver >= 92600 && s.D == 256))
                return "hidden_dim d_qk should be less than or equal to 128 and hidden_dim d_qk should be multiple of "
                       "16 unless d_qk == 192 and d_v == 128 (requires cuDNN 9.19+) or d_qk == d_v == 256 (requires "
                       "cuDNN 9.26+) or both head dims are in (256, 512] and multiples of 16";
        } else if (s.D > 256 || s.D % 16 != 0) {
            return "hidden_dim shoud be less than or equal to 256 and hidden_dim should be multiple of 16";
        }
        return "";
    }
    if (ver == 91000 || ver == 91001)
        return "SDPA FP16/BF16 forward is not supported on cuDNN 9.10.0/9.10.1 due to known bugs. Please consider "
               "upgrading to 9.10.2 or newer.";
    if (s.D % 8 != 0) return "hidden_dim should be multiple of 8";
    if (major < 8) return "SDPA FP16/BF16 requires SM80 (Ampere) or newer architecture";
    if (major == 8 && ver <= 90900 && s.D > 128)
        return "head_dim should be less than or equal to 128 for backend version 9.9 or below on ampere architecture";
    if (major == 9 && ver <= 90900 && s.D > 256)
        return "head_dim should be less than or equal to 256 for backend version 9.9 or below on hopper architecture";
    if (major == 10 && ver < 90900 && s.D > 128)
        return "head_dim should be less than or equal to 128 for backend version 9.8 or below on blackwell "
               "architecture";
    return "";
}

/* Lay out one shape's operation graph (see the file comment) and return it, or null with the
   reason in the builder. */
cudnnBackendDescriptor_t lay_out(Builder &b, Entry &en, const Shape &s, size_t ver, cudnnHandle_t handle)
{
    const size_t eff = ver < FE_COMPILED ? ver : FE_COMPILED; /* what the frontend's choices see */
    const cudnnDataType_t io = s.fp8 ? CUDNN_DATA_FP8_E4M3 : CUDNN_DATA_BFLOAT16;
    const cudnnDataType_t F = CUDNN_DATA_FLOAT, I32 = CUDNN_DATA_INT32, B8 = CUDNN_DATA_BOOLEAN;
    const int64_t h = s.h, kvh = s.kvh, Lq = s.Lq, Lk = s.Lk, D = s.D;
    /* libh3's rows in place (Q, K, V, O): one batch, head n at element offset n*D of a row, rows ld
       apart. */
    auto rows = [&](int64_t u, int64_t heads, int64_t L, int64_t ld) {
        return b.tensor(u, io, {1, heads, L, D}, {L * ld, D, ld, 1});
    };
    cudnnBackendDescriptor_t q = rows(UID_Q, h, Lq, s.ldq);
    en.attn_scale = s.scale;
    en.host_args.emplace_back(UID_ATTN_SCALE, &en.attn_scale);

    if (!s.fp8 && !s.causal && eff >= 91301) {
        cudnnBackendDescriptor_t k = rows(UID_K, kvh, Lk, s.ldk);
        cudnnBackendDescriptor_t v = rows(UID_V, kvh, Lk, s.ldv);
        cudnnBackendDescriptor_t o = rows(UID_O, h, Lq, s.ldo);
        cudnnBackendDescriptor_t sc = b.tensor(UID_ATTN_SCALE, F, {1}, {1}, false, true);
        b.sdpa_fwd(q, k, v, o, sc);
        return b.graph(handle);
    }

    /* The composite graph. Virtual tensors get the next free uids in the order the frontend
       numbers them (user uids are skipped). */
    int64_t next_uid = 6;
    auto uid = [&]() {
        for (;;) {
            const int64_t u = next_uid++;
            const bool user = s.fp8 && ((u >= UID_SCALE0 && u < UID_SCALE0 + N_SCALES) || u == UID_AMAX_S ||
                                        u == UID_AMAX_O);
            if (!user) return u;
        }
    };
    const std::vector<int64_t> full = {1, h, Lq, Lk}, full_st = {h * Lq * Lk, Lq * Lk, Lk, 1};
    const std::vector<int64_t> row = {1, h, Lq, 1}, row_st = {h * Lq, Lq, 1, 1};
    const std::vector<int64_t> one = {1, 1, 1, 1};
    auto vfull = [&](int64_t u, cudnnDataType_t dt) { return b.tensor(u, dt, full, full_st, true); };
    auto vrow = [&](int64_t u) { return b.tensor(u, F, row, row_st, true); };
    /* A scalar: a device tensor, or a host value passed by value. */
    auto scalar = [&](int64_t u, cudnnDataType_t dt, bool by_value) {
        return b.tensor(u, dt, one, one, false, by_value);
    };
    /* out = in * by (pointwise, f32); out is made before the operation, as the frontend orders them. */
    auto mul = [&](cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t by, cudnnBackendDescriptor_t out) {
        b.pointwise(CUDNN_POINTWISE_MUL, F, in, by, out);
        return out;
    };

    const int64_t u_s = uid(), u_scaled = uid();
    cudnnBackendDescriptor_t kt = b.tensor(UID_K, io, {1, kvh, D, Lk}, {Lk * s.ldk, D, 1, s.ldk}); /* K^T */
    cudnnBackendDescriptor_t S = vfull(u_s, F);
    b.matmul(q, kt, S);
    cudnnBackendDescriptor_t scale = scalar(UID_ATTN_SCALE, F, true);
    cudnnBackendDescriptor_t x = mul(S, scale, vfull(u_scaled, F));

    cudnnBackendDescriptor_t sc[N_SCALES] = {};
    if (s.fp8) {
        for (int i = 0; i < N_SCALES; i++) sc[i] = scalar(UID_SCALE0 + i, F, false);
        const int64_t u_dq = uid(), u_dk = uid();
        cudnnBackendDescriptor_t y = mul(x, sc[0], vfull(u_dq, F)); /* descale Q */
        x = mul(y, sc[1], vfull(u_dk, F));                           /* descale K */
    }
    if (s.causal) {
        /* Keep score (i, j) where i + (Lk - Lq) >= j; the offsets are by-value int32 scalars,
           only for the bottom-right diagonal (Lq != Lk). */
        const bool offsets = Lq != Lk;
        int64_t u_lk = 0, u_lq = 0;
        if (offsets) {
            u_lk = uid();
            u_lq = uid();
        }
        const int64_t u_ninf = uid(), u_masked = uid(), u_row = uid(), u_col = uid();
        int64_t u_rowk = 0, u_rowkq = 0;
        if (offsets) {
            u_rowk = uid();
            u_rowkq = uid();
        }
        const int64_t u_mask = uid();
        cudnnBackendDescriptor_t ri = vfull(u_row, I32), ci = vfull(u_col, I32);
        b.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, x, nullptr, ri, nullptr, 2);
        b.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, x, nullptr, ci, nullptr, 3);
        cudnnBackendDescriptor_t lhs = ri;
        if (offsets) {
            en.kv_len = (int32_t)Lk;
            en.q_len = (int32_t)Lq;
            en.host_args.emplace_back(u_lk, &en.kv_len);
            en.host_args.emplace_back(u_lq, &en.q_len);
            cudnnBackendDescriptor_t lk = scalar(u_lk, I32, true);
            cudnnBackendDescriptor_t rk = vfull(u_rowk, I32);
            b.pointwise(CUDNN_POINTWISE_ADD, I32, ri, lk, rk);
            cudnnBackendDescriptor_t lq = scalar(u_lq, I32, true);
            lhs = vfull(u_rowkq, I32);
            b.pointwise(CUDNN_POINTWISE_SUB, I32, rk, lq, lhs);
        }
        cudnnBackendDescriptor_t mask = vfull(u_mask, B8);
        b.pointwise(CUDNN_POINTWISE_CMP_GE, B8, lhs, ci, mask);
        /* The frontend masks with -inf, or with the lowest float below cuDNN 9.10, which prefers it. */
        en.neg_inf = ver < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
        en.host_args.emplace_back(u_ninf, &en.neg_inf);
        cudnnBackendDescriptor_t ninf = scalar(u_ninf, F, true);
        cudnnBackendDescriptor_t masked = vfull(u_masked, F);
        b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, F, x, ninf, masked, mask);
        x = masked;
    }

    /* Softmax: P = exp(x - max) / sum, with the (unused, virtual) statistics max + log(sum). */
    const int64_t u_stats = uid(), u_p = uid(), u_max = uid(), u_sub = uid(), u_exp = uid(), u_sum = uid(),
                  u_log = uid();
    cudnnBackendDescriptor_t mx = vrow(u_max);
    b.reduction(CUDNN_REDUCE_TENSOR_MAX, x, mx, ver);
    cudnnBackendDescriptor_t sub = vfull(u_sub, F);
    b.pointwise(CUDNN_POINTWISE_SUB, F, x, mx, sub);
    cudnnBackendDescriptor_t ex = vfull(u_exp, F);
    b.pointwise(CUDNN_POINTWISE_EXP, F, sub, nullptr, ex);
    cudnnBackendDescriptor_t sum = vrow(u_sum);
    b.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum, ver);
    cudnnBackendDescriptor_t lg = vrow(u_log);
    b.pointwise(CUDNN_POINTWISE_LOG, F, sum, nullptr, lg);
    cudnnBackendDescriptor_t stats = vrow(u_stats);
    b.pointwise(CUDNN_POINTWISE_ADD, F, mx, lg, stats);
    cudnnBackendDescriptor_t P = vfull(u_p, s.fp8 ? F : io);
    b.pointwise(CUDNN_POINTWISE_DIV, F, ex, sum, P);

    cudnnBackendDescriptor_t v = rows(UID_V, kvh, Lk, s.ldv);
    cudnnBackendDescriptor_t o = rows(UID_O, h, Lq, s.ldo);
    if (!s.fp8) {
        b.matmul(P, v, o);
        return b.graph(handle);
    }
    const std::vector<int64_t> od = {1, h, Lq, D}, od_st = {h * Lq * D, Lq * D, D, 1};
    auto vout = [&](int64_t u) { return b.tensor(u, F, od, od_st, true); };
    b.reduction(CUDNN_REDUCE_TENSOR_AMAX, P, scalar(UID_AMAX_S, F, false), ver);
    const int64_t u_p8 = uid(), u_o32 = uid(), u_ods = uid(), u_odv = uid();
    cudnnBackendDescriptor_t p8 = mul(P, sc[4], vfull(u_p8, io)); /* scale S */
    cudnnBackendDescriptor_t o32 = vout(u_o32);
    b.matmul(p8, v, o32);
    cudnnBackendDescriptor_t ods = mul(o32, sc[3], vout(u_ods)); /* descale S */
    cudnnBackendDescriptor_t odv = mul(ods, sc[2], vout(u_odv)); /* descale V */
    mul(odv, sc[5], o);                                          /* scale O */
    b.reduction(CUDNN_REDUCE_TENSOR_AMAX, odv, scalar(UID_AMAX_O, F, false), ver);
    return b.graph(handle);
}

/* Heuristics (mode A), skip non-deterministic engines and those whose workspace cannot be read,
   finalize the first plan that finalizes. Returns the plan or null with the reason. */
cudnnBackendDescriptor_t choose_plan(Builder &b, const Api &a, cudnnBackendDescriptor_t graph, size_t ver,
                                     int64_t *workspace)
{
    cudnnBackendDescriptor_t heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    b.set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristics");
    b.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
    b.finalize(heur, "heuristics");
    if (!b.ok()) return nullptr;
    int64_t n = 0;
    cudnnStatus_t st = a.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr);
    if (st != CUDNN_STATUS_SUCCESS) {
        b.fail("heuristics", "results", st);
        return nullptr;
    }
    if (n <= 0) {
        b.fail("no engine configurations from cuDNN's heuristics (mode A) for this graph");
        return nullptr;
    }
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (int64_t i = 0; i < n && b.ok(); i++) cfgs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration"));
    if (!b.ok()) return nullptr;
    int64_t got = 0;
    st = a.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfgs.data());
    if (st != CUDNN_STATUS_SUCCESS) {
        b.fail("heuristics", "results", st);
        return nullptr;
    }
    if (got < n) n = got;

    /* Every configuration's notes first (as the frontend does; a failed query fails the build). */
    std::vector<bool> nondet((size_t)n, false);
    for (int64_t i = 0; i < n; i++) {
        cudnnBackendDescriptor_t eng = b.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
        if (!b.ok()) return nullptr;
        int64_t c = 0;
        st = a.GetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, &eng);
        if (st != CUDNN_STATUS_SUCCESS) {
            b.fail("heuristics", "engine of a configuration", st);
            return nullptr;
        }
        int32_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        c = 0;
        st = a.GetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                            CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &c, notes);
        if (st != CUDNN_STATUS_SUCCESS) {
            b.fail("heuristics", "numerical notes", st);
            return nullptr;
        }
        for (int64_t j = 0; j < c && j < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; j++)
            if (notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondet[(size_t)i] = true;
        int32_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
        st = a.GetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                            CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &c, behavior);
        if (st != CUDNN_STATUS_SUCCESS) {
            b.fail("heuristics", "behavior notes", st);
            return nullptr;
        }
    }

    std::string tried;
    for (int64_t i = 0; i < n; i++) {
        char head[48];
        snprintf(head, sizeof head, "%s#%lld ", tried.empty() ? "" : "; ", (long long)i);
        if (nondet[(size_t)i]) {
            tried += std::string(head) + "non-deterministic";
            continue;
        }
        if (ver >= 90200) {
            /* The frontend filters by shared memory (never, at its limit) and workspace (unlimited)
               here; a configuration whose workspace cannot be read is passed over. */
            int64_t c = 0, ws = 0;
            st = a.GetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &c, &ws);
            if (st != CUDNN_STATUS_SUCCESS) {
                tried += std::string(head) + "workspace size: " + status_text(a, st);
                continue;
            }
        }
        cudnnBackendDescriptor_t plan = b.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        if (!b.ok()) return nullptr;
        st = a.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = a.Finalize(plan);
        if (st != CUDNN_STATUS_SUCCESS) {
            tried += std::string(head) + status_text(a, st);
            continue;
        }
        int64_t c = 0, ws = 0;
        st = a.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &c, &ws);
        if (st != CUDNN_STATUS_SUCCESS) {
            b.fail("execution plan", "workspace size", st);
            return nullptr;
        }
        *workspace = ws < 0 ? 0 : ws;
        return plan;
    }
    b.fail("no engine of " + std::to_string((long long)n) + " builds a plan: " + tried);
    return nullptr;
}

void release(const Api &a, Entry &en)
{
    for (size_t i = en.descs.size(); i-- > 0;) a.DestroyDescriptor(en.descs[i]);
    en.descs.clear();
    en.plan = nullptr;
}

/* Build the graph and plan of one shape into `en` (the reason in en.fail when it fails). */
void build(State &st, Entry &en, const Device &d, const Shape &s)
{
    const std::string bad = frontend_validate(s, st.version, d.sm);
    if (!bad.empty()) {
        en.fail = "validate: " + bad;
        return;
    }
    Builder b(st.api, en);
    cudnnBackendDescriptor_t graph = lay_out(b, en, s, st.version, d.handle);
    int64_t ws = 0;
    cudnnBackendDescriptor_t plan = b.ok() && graph ? choose_plan(b, st.api, graph, st.version, &ws) : nullptr;
    if (!b.ok() || !plan) {
        en.fail = b.ok() ? "no plan" : b.error();
        release(st.api, en);
        return;
    }
    en.plan = plan;
    en.workspace = ws;
    en.built = true;
}

/* Drop least recently used graphs until there is room for one more. A plan's kernels may still be
   queued, and destroying the plan can unload their code: its last stream is drained first (rare:
   it takes more than CACHE_MAX shapes). */
void evict(State &st, const h3_cudnn_host *host)
{
    while (st.cache.size() >= CACHE_MAX) {
        auto oldest = st.cache.begin();
        for (auto it = st.cache.begin(); it != st.cache.end(); ++it)
            if (it->second.used < oldest->second.used) oldest = it;
        Entry &en = oldest->second;
        if (en.ran && host->stream_sync && (int)oldest->first[0] == host->device)
            (void)host->stream_sync(host->ctx, en.last_stream);
        release(st.api, en);
        st.cache.erase(oldest);
    }
}

/* A workspace of at least `bytes` on host->device, after its last use on another stream. Returns
   0, or a negative code with the reason. */
int workspace(Device &d, const h3_cudnn_host *host, void *s, size_t bytes, void **out, std::string *why)
{
    *out = nullptr;
    if (bytes == 0) return 0;
    if (d.ws_bytes < bytes) {
        /* Work queued earlier may still read the old one. */
        if (d.ws) {
            if (d.ws_pending) (void)host->stream_sync(host->ctx, d.ws_stream);
            host->dev_free(host->ctx, d.ws);
        }
        d.ws = nullptr;
        d.ws_bytes = 0;
        d.ws_pending = false;
        const size_t want = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        void *p = nullptr;
        const int rc = host->dev_alloc(host->ctx, want, &p);
        if (rc != 0 || !p) {
            char b[160];
            snprintf(b, sizeof b, "cannot allocate %.1f MiB of workspace%s", (double)want / 1048576.0,
                     rc == -H3_E_NOMEM ? ": out of device memory" : "");
            *why = b;
            return rc == -H3_E_NOMEM ? -H3_E_NOMEM : -H3_E_UNSUPPORTED;
        }
        d.ws = p;
        d.ws_bytes = want;
    }
    if (d.ws_pending && d.ws_stream != s) {
        const int rc = host->stream_sync(host->ctx, d.ws_stream);
        if (rc != 0) {
            *why = "cannot wait for the workspace's last stream";
            return rc < 0 ? rc : -H3_E_UNSUPPORTED;
        }
        d.ws_pending = false;
    }
    *out = d.ws;
    return 0;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

bool host_ok(const h3_cudnn_host *host)
{
    return host && host->dev_alloc && host->dev_free && host->stream_sync && host->device >= 0;
}

int sdpa(const h3_cudnn_host *host, void *stream, const void *Q, const void *K, const void *V, void *O,
         const float *scales, float *amax, int64_t Lq, int64_t Lk, int heads, int kv_heads, int D, int64_t ldq,
         int64_t ldk, int64_t ldv, int64_t ldo, float scale, int causal, char *err, size_t cap)
{
    const bool fp8 = scales != nullptr;
    /* Elements per 16 bytes: bf16 rows need multiples of 8, e4m3 rows of 16. */
    const int64_t vec = fp8 ? 16 : 8;
    if (!host_ok(host)) {
        say(err, cap, "cudnn: sdpa: no device given");
        return -H3_E_INVALID;
    }
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
    /* Every element offset of the tensors as cuDNN describes them must fit its int64 strides. */
    int64_t t1, t2, t3, t4, t5;
    if (__builtin_mul_overflow(Lq, ldq, &t1) || __builtin_mul_overflow(Lk, ldk, &t2) ||
        __builtin_mul_overflow(Lk, ldv, &t3) || __builtin_mul_overflow(Lq, ldo, &t4) ||
        __builtin_mul_overflow((int64_t)heads * Lq, Lk, &t5) || t5 > (INT64_MAX >> 2)) {
        say(err, cap, "cudnn: sdpa: %lld x %lld tokens with %d heads is too large", (long long)Lq, (long long)Lk,
            heads);
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
    Device *d = device(st, host, &why);
    if (!d) {
        say(err, cap, "cudnn: %s", why.c_str());
        return -H3_E_UNSUPPORTED;
    }
    uint32_t sbits;
    memcpy(&sbits, &scale, sizeof sbits);
    const Key key = {host->device, Lq,  Lk,  heads, kv_heads,       D,          ldq,
                     ldk,          ldv, ldo, (int64_t)sbits, causal ? 1 : 0, fp8 ? 1 : 0};

    auto it = st.cache.find(key);
    if (it == st.cache.end()) {
        evict(st, host);
        it = st.cache.emplace(key, Entry()).first;
        const Shape sh = {Lq, Lk, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale, causal != 0, fp8};
        build(st, it->second, *d, sh);
    }
    Entry &en = it->second;
    en.used = ++st.clock;
    if (!en.built) {
        say(err, cap, "cudnn: sdpa%s %lld x %lld, %d heads (%d kv) of %d%s: %s", fp8 ? " fp8" : "", (long long)Lq,
            (long long)Lk, heads, kv_heads, D, causal ? ", causal" : "", en.fail.c_str());
        return -H3_E_UNSUPPORTED;
    }

    void *ws = nullptr;
    int rc = workspace(*d, host, stream, (size_t)en.workspace, &ws, &why);
    if (rc) {
        say(err, cap, "cudnn: sdpa: %s", why.c_str());
        return rc;
    }
    const Api &a = st.api;
    cudnnStatus_t cs = a.SetStream(d->handle, (cudaStream_t)stream);
    if (cs != CUDNN_STATUS_SUCCESS) {
        say(err, cap, "cudnn: cudnnSetStream failed: %s", status_text(a, cs).c_str());
        return -H3_E_UNSUPPORTED;
    }
    /* The variant pack: device pointers of the graph's tensors, host pointers of its by-value
       scalars. */
    std::vector<int64_t> uids = {UID_Q, UID_K, UID_V, UID_O};
    std::vector<void *> ptrs = {const_cast<void *>(Q), const_cast<void *>(K), const_cast<void *>(V), O};
    for (const auto &arg : en.host_args) {
        uids.push_back(arg.first);
        ptrs.push_back(arg.second);
    }
    if (fp8) {
        /* One scalar every 16 floats (64 bytes apart): each its own aligned tensor. */
        for (int i = 0; i < N_SCALES; i++) {
            uids.push_back(UID_SCALE0 + i);
            ptrs.push_back(const_cast<float *>(scales + 16 * i));
        }
        uids.push_back(UID_AMAX_S);
        ptrs.push_back(amax);
        uids.push_back(UID_AMAX_O);
        ptrs.push_back(amax + 4);
    }
    cudnnBackendDescriptor_t pack = nullptr;
    cs = a.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = a.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = a.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(),
                            ptrs.data());
    if (cs == CUDNN_STATUS_SUCCESS) cs = a.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (cs == CUDNN_STATUS_SUCCESS) cs = a.Finalize(pack);
    if (cs == CUDNN_STATUS_SUCCESS) cs = a.Execute(d->handle, en.plan, pack);
    if (pack) a.DestroyDescriptor(pack);
    if (cs != CUDNN_STATUS_SUCCESS) {
        say(err, cap, "cudnn: sdpa %lld x %lld, %d heads of %d: execute: %s", (long long)Lq, (long long)Lk, heads, D,
            status_text(a, cs).c_str());
        return -H3_E_UNSUPPORTED;
    }
    en.ran = true;
    en.last_stream = stream;
    if (ws) {
        d->ws_pending = true;
        d->ws_stream = stream;
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

extern "C" int h3_cudnn_sdpa_available(const struct h3_cudnn_host *host, char *why, size_t cap)
{
    try {
        if (!host_ok(host)) {
            say(why, cap, "no device given");
            return 0;
        }
        State &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        if (!st.load_tried) load_cudnn(st);
        if (!st.loaded) {
            say(why, cap, "%s", st.load_msg.c_str());
            return 0;
        }
        std::string w;
        if (!device(st, host, &w)) {
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

extern "C" void h3_cudnn_forget_stream(const struct h3_cudnn_host *host, void *stream)
{
    if (!host || !stream) return;
    State &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.devices.find(host->device);
    if (it != st.devices.end() && it->second.ws_stream == stream) {
        it->second.ws_pending = false;
        it->second.ws_stream = nullptr;
    }
    for (auto &kv : st.cache)
        if (kv.second.last_stream == stream) {
            kv.second.ran = false;
            kv.second.last_stream = nullptr;
        }
}

extern "C" int h3_cudnn_sdpa_fp8_available(const struct h3_cudnn_host *host, char *why, size_t cap)
{
    char base[512];
    if (!h3_cudnn_sdpa_available(host, base, sizeof base)) {
        say(why, cap, "%s", base);
        return 0;
    }
    size_t v;
    {
        State &st = state();
        std::lock_guard<std::mutex> lock(st.mu);
        v = st.version;
    }
    if (v < 90100 || v == 91000) {
        say(why, cap, "fp8 attention needs cuDNN 9.1.0 or newer (not 9.10.0); this is %s", version_string(v).c_str());
        return 0;
    }
    if (host->cc_major < 9) {
        say(why, cap, "fp8 attention needs a Hopper GPU or newer (sm_90+); this is sm_%d%d", host->cc_major,
            host->cc_minor);
        return 0;
    }
    say(why, cap, "fp8 attention: cuDNN %s on sm_%d%d", version_string(v).c_str(), host->cc_major, host->cc_minor);
    return 1;
}

extern "C" int h3_cudnn_sdpa(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K,
                             const void *V, void *O, int64_t L_q, int64_t L_k, int heads, int kv_heads, int D,
                             int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo, float scale, int causal, char *err,
                             size_t cap)
{
    /* A bad_alloc (or anything else) may not cross the C boundary. */
    try {
        return sdpa(host, stream, Q, K, V, O, nullptr, nullptr, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo,
                    scale, causal, err, cap);
    } catch (const std::exception &e) {
        say(err, cap, "cudnn: sdpa: %s", e.what());
    } catch (...) {
        say(err, cap, "cudnn: sdpa: unknown exception");
    }
    return -H3_E_UNSUPPORTED;
}

extern "C" int h3_cudnn_sdpa_fp8(const struct h3_cudnn_host *host, void *stream, const void *Q, const void *K,
                                 const void *V, void *O, const float *scales, float *amax, int64_t L_q, int64_t L_k,
                                 int heads, int kv_heads, int D, int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo,
                                 float scale, char *err, size_t cap)
{
    if (!scales) {
        say(err, cap, "cudnn: sdpa fp8: no scales");
        return -H3_E_INVALID;
    }
    try {
        return sdpa(host, stream, Q, K, V, O, scales, amax, L_q, L_k, heads, kv_heads, D, ldq, ldk, ldv, ldo, scale,
                    0, err, cap);
    } catch (const std::exception &e) {
        say(err, cap, "cudnn: sdpa fp8: %s", e.what());
    } catch (...) {
        say(err, cap, "cudnn: sdpa fp8: unknown exception");
    }
    return -H3_E_UNSUPPORTED;
}
