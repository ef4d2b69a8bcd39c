/*
 * The kernel modules (kernels/<name>.cu, embedded at build time) compiled at run time by NVRTC
 * for the GPU found, with a disk cache of the cubins.
 *
 * Compilation. One NVRTC program per module: its source, the headers of kernels/ (the only ones it
 * may include), a static_assert per declared kernel checking the launcher's parameter types (see
 * cuda_kernels.h), and one name expression per kernel. Options: -arch=sm_XY (a real cubin for this
 * GPU, no PTX JIT at load), -std=c++17 and NVRTC's defaults otherwise, which are nvcc's for device
 * code (-O3 in ptxas, -fmad=true, IEEE division and square root, no fast math), so the machine
 * code and the bits it computes are the ones the nvcc build gave.
 *
 * Cache. <folder>/<module>-<hash>.cubin, where the hash covers the key: the module's full source
 * (headers and checks included), the options, the GPU architecture, NVRTC's version and the
 * driver's. An entry holds a magic, the key itself, the kernels' lowered names, the cubin and a
 * checksum of all of it; one whose magic, key, lengths or checksum disagree (corrupt, truncated,
 * another build's) is refused and rebuilt. Entries are written to a temporary file and renamed,
 * so a reader never sees a partial one. An unwritable folder: compile in memory, warn once.
 */
#include "backend/cuda/cuda_kernels.h"
#include "core/wpack.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <vector>

namespace h3cuda {

/* build/cuda/kernels_src.cpp, generated from kernels/ by the build (embed_kernels.c). */
struct EmbeddedFile {
    const char *name;
    const char *text;
    size_t len;
};
extern const EmbeddedFile h3_embedded_kernels[];
extern const int h3_embedded_kernels_count;

namespace {

struct KDecl {
    std::string expr, params;
};

struct ModInfo {
    const char *name; /* kernels/<name>.cu */
    std::vector<KDecl> kernels;
};

ModInfo *mod_table()
{
    static ModInfo t[MOD_COUNT] = {{"attention", {}}, {"attn_fp8", {}},  {"decoders", {}},
                                   {"fp8", {}},       {"gemm", {}},      {"knobs", {}},
                                   {"layernorm", {}}, {"rows", {}},      {"wpack", {}}};
    return t;
}

const EmbeddedFile *embedded(const std::string &name)
{
    for (int i = 0; i < h3_embedded_kernels_count; i++)
        if (name == h3_embedded_kernels[i].name) return &h3_embedded_kernels[i];
    return NULL;
}

/* Constants of libh3's headers the kernels use, passed as macros so they have one definition. */
std::vector<std::string> module_options(int arch)
{
    std::vector<std::string> o;
    o.push_back("-arch=sm_" + std::to_string(arch));
    o.push_back("-std=c++17");
    o.push_back("-DH3_WPACK_CHUNK=" + std::to_string(H3_WPACK_CHUNK));
    o.push_back("-DH3_AA_TAPS=" + std::to_string(H3_AA_TAPS));
    o.push_back("-DH3_AA_RATIO=" + std::to_string(H3_AA_RATIO));
    return o;
}

/* The module's source as NVRTC compiles it: the file, then the signature checks. */
std::string module_source(int mod)
{
    const ModInfo &m = mod_table()[mod];
    const EmbeddedFile *f = embedded(std::string(m.name) + ".cu");
    if (!f) return std::string();
    std::string s(f->text, f->len);
    s += "\n/* The launchers' declarations (cuda_kernels.h H3K), checked against the kernels. */\n"
         "namespace h3cuda {\n"
         "template <class A, class B> struct h3k_same { enum { value = 0 }; };\n"
         "template <class A> struct h3k_same<A, A> { enum { value = 1 }; };\n";
    for (const KDecl &k : m.kernels)
        s += "static_assert(h3k_same<decltype(&" + k.expr + "), void (*)(" + k.params + ")>::value, \"" + k.expr +
             ": the launcher declares (" + k.params + ")\");\n";
    s += "}\n";
    return s;
}

/* The headers of kernels/, in embedding order: every one is offered to every module's program. */
std::vector<const EmbeddedFile *> headers()
{
    std::vector<const EmbeddedFile *> h;
    for (int i = 0; i < h3_embedded_kernels_count; i++) {
        const size_t l = strlen(h3_embedded_kernels[i].name);
        if (l > 2 && !strcmp(h3_embedded_kernels[i].name + l - 2, ".h")) h.push_back(&h3_embedded_kernels[i]);
    }
    return h;
}

uint64_t fnv(const void *p, size_t n, uint64_t h = 1469598103934665603ull)
{
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

} /* namespace */

int kernel_register(int mod, const std::string &expr, const char *params)
{
    ModInfo &m = mod_table()[mod];
    m.kernels.push_back(KDecl{"h3cuda::" + expr, params});
    return (int)m.kernels.size() - 1;
}

int kernel_module_count(void) { return MOD_COUNT; }
const char *kernel_module_name(int mod) { return mod >= 0 && mod < MOD_COUNT ? mod_table()[mod].name : NULL; }

int kernel_module_compile(int mod, int arch, std::string *cubin, std::string *lowered, std::string *err)
{
    char why[400];
    if (load_nvrtc(NULL, why, sizeof why)) {
        *err = why;
        return -1;
    }
    const ModInfo &m = mod_table()[mod];
    const std::string src = module_source(mod);
    if (src.empty()) {
        *err = std::string("kernels/") + m.name + ".cu is not embedded in this build";
        return -1;
    }
    std::vector<const char *> hdr, hname;
    for (const EmbeddedFile *f : headers()) {
        hdr.push_back(f->text);
        hname.push_back(f->name);
    }
    nvrtcProgram prog = NULL;
    const std::string fname = std::string(m.name) + ".cu";
    nvrtcResult r = nvrtcCreateProgram(&prog, src.c_str(), fname.c_str(), (int)hdr.size(), hdr.data(), hname.data());
    if (r != NVRTC_SUCCESS) {
        *err = std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(r);
        return -1;
    }
    for (const KDecl &k : m.kernels) nvrtcAddNameExpression(prog, k.expr.c_str());
    const std::vector<std::string> opts = module_options(arch);
    std::vector<const char *> ov;
    for (const std::string &o : opts) ov.push_back(o.c_str());
    r = nvrtcCompileProgram(prog, (int)ov.size(), ov.data());
    if (r != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        std::string log(n, '\0');
        if (n) nvrtcGetProgramLog(prog, &log[0]);
        while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
        *err = std::string("NVRTC could not compile kernels/") + m.name + ".cu for sm_" + std::to_string(arch) +
               ": " + nvrtcGetErrorString(r) + "\n" + log;
        nvrtcDestroyProgram(&prog);
        return -1;
    }
    size_t n = 0;
    nvrtcGetCUBINSize(prog, &n);
    cubin->assign(n, '\0');
    if (n) nvrtcGetCUBIN(prog, &(*cubin)[0]);
    lowered->clear();
    for (const KDecl &k : m.kernels) {
        const char *low = NULL;
        if (nvrtcGetLoweredName(prog, k.expr.c_str(), &low) != NVRTC_SUCCESS || !low) {
            *err = "NVRTC has no lowered name for " + k.expr;
            nvrtcDestroyProgram(&prog);
            return -1;
        }
        *lowered += low;
        *lowered += '\n';
    }
    nvrtcDestroyProgram(&prog);
    if (n == 0) {
        *err = std::string("NVRTC produced no cubin for kernels/") + m.name + ".cu";
        return -1;
    }
    return 0;
}

/* ---- the cache ----------------------------------------------------------------------------- */

namespace {

const char MAGIC[8] = {'H', '3', 'K', 'C', 'U', 'B', 'N', '1'};

std::string cache_key(Backend *b, int mod, int arch)
{
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    /* The headers too, by name and text: a change to h3k.h must not load a cubin built before it. */
    std::string src = module_source(mod);
    for (const EmbeddedFile *f : headers()) {
        src += std::string("\n#header ") + f->name + "\n";
        src.append(f->text, f->len);
    }
    std::string k = "module=" + std::string(mod_table()[mod].name);
    char h[40];
    snprintf(h, sizeof h, "%016llx%016llx", (unsigned long long)fnv(src.data(), src.size()),
             (unsigned long long)fnv(src.data(), src.size(), 0x9e3779b97f4a7c15ull));
    k += " source=" + std::string(h) + " bytes=" + std::to_string(src.size());
    for (const std::string &o : module_options(arch)) k += " " + o;
    k += " nvrtc=" + std::to_string(maj) + "." + std::to_string(min);
    k += " driver=" + std::to_string(b->driver_version);
    return k;
}

std::string cache_path(Backend *b, int mod, const std::string &key)
{
    char h[24];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv(key.data(), key.size()));
    return std::string(b->cache_dir) + "/" + mod_table()[mod].name + "-" + h + ".cubin";
}

void put_u64(std::string &s, uint64_t v)
{
    for (int i = 0; i < 8; i++) s += (char)(v >> (8 * i));
}
bool get_u64(const std::string &s, size_t *at, uint64_t *v)
{
    if (*at + 8 > s.size()) return false;
    *v = 0;
    for (int i = 0; i < 8; i++) *v |= (uint64_t)(unsigned char)s[*at + i] << (8 * i);
    *at += 8;
    return true;
}

} /* namespace */

/* Entry layout: magic[8], u64 key length, key, u64 names length, names, u64 cubin length, cubin,
   u64 FNV-1a of everything before it. */
std::string cache_entry(const std::string &key, const std::string &lowered, const std::string &cubin)
{
    std::string e(MAGIC, 8);
    put_u64(e, key.size());
    e += key;
    put_u64(e, lowered.size());
    e += lowered;
    put_u64(e, cubin.size());
    e += cubin;
    put_u64(e, fnv(e.data(), e.size()));
    return e;
}

/* Parses an entry; false (and a reason) if it is not a valid entry for `key`. */
bool cache_parse(const std::string &e, const std::string &key, std::string *lowered, std::string *cubin,
                 const char **why)
{
    size_t at = 8;
    uint64_t n = 0, sum = 0;
    if (e.size() < 8 + 8 * 4 || memcmp(e.data(), MAGIC, 8)) return *why = "not a kernel cache entry", false;
    if (!get_u64(e, &at, &n) || n != key.size() || at + n > e.size() || e.compare(at, n, key))
        return *why = "built for another source, GPU or library version", false;
    at += n;
    if (!get_u64(e, &at, &n) || at + n > e.size()) return *why = "truncated", false;
    lowered->assign(e, at, n);
    at += n;
    if (!get_u64(e, &at, &n) || at + n > e.size()) return *why = "truncated", false;
    cubin->assign(e, at, n);
    at += n;
    const size_t body = at;
    if (!get_u64(e, &at, &sum) || at != e.size()) return *why = "truncated", false;
    if (sum != fnv(e.data(), body)) return *why = "checksum mismatch", false;
    return true;
}

namespace {

bool read_file(const std::string &path, std::string *out)
{
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) return false;
    out->clear();
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
    const bool ok = !ferror(f);
    fclose(f);
    return ok;
}

/* mkdir -p; 0 or errno. */
int make_dirs(const char *dir)
{
    std::string p(dir);
    for (size_t i = 1; i <= p.size(); i++) {
        if (i < p.size() && p[i] != '/') continue;
        std::string part = p.substr(0, i);
        if (mkdir(part.c_str(), 0755) && errno != EEXIST) return errno;
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return ENOTDIR;
    return 0;
}

void note(Backend *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void note(Backend *b, const char *fmt, ...)
{
    if (!b->host.note) return;
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    b->host.note(line);
}

/* Writes the entry atomically; false with errno's text in why. */
bool write_entry(const std::string &path, const std::string &e, std::string *why)
{
    const std::string tmp = path + ".tmp." + std::to_string((long)getpid());
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f) return *why = strerror(errno), false;
    bool ok = fwrite(e.data(), 1, e.size(), f) == e.size();
    ok = (fflush(f) == 0) && ok;
    const int err = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp.c_str(), path.c_str())) {
        *why = strerror(ok ? errno : err);
        unlink(tmp.c_str());
        return false;
    }
    return true;
}

std::mutex g_mod_lock;

} /* namespace */

struct ModState {
    CUmodule module;
    std::vector<CUfunction> fns;
};

/* Compiles or loads module `mod` for b's GPU; 0 or a recorded error. */
static int module_load(Backend *b, int mod)
{
    const int arch = b->cc_major * 10 + b->cc_minor;
    const ModInfo &m = mod_table()[mod];
    char why[400];
    if (load_nvrtc(NULL, why, sizeof why))
        return fail(b, H3_E_UNSUPPORTED, "cuda: %s", why);
    std::string key = cache_key(b, mod, arch), lowered, cubin, entry;
    std::string path;
    bool have = false;
    if (b->cache_dir[0]) {
        path = cache_path(b, mod, key);
        if (read_file(path, &entry)) {
            const char *bad = NULL;
            have = cache_parse(entry, key, &lowered, &cubin, &bad);
            if (!have) note(b, "cuda: kernel cache entry %s refused (%s); rebuilding it", path.c_str(), bad);
        }
    }
    if (!have) {
        note(b, "cuda: compiling GPU kernels for sm_%d: %s (%zu kernel%s; once per GPU and version, then cached)",
             arch, m.name, m.kernels.size(), m.kernels.size() == 1 ? "" : "s");
        std::string err;
        if (kernel_module_compile(mod, arch, &cubin, &lowered, &err))
            return fail(b, H3_E_UNSUPPORTED, "cuda: %s", err.c_str());
        if (b->cache_dir[0]) {
            std::string werr;
            const int mk = make_dirs(b->cache_dir);
            if (mk || !write_entry(path, cache_entry(key, lowered, cubin), &werr)) {
                if (!b->cache_warned)
                    note(b, "warning: cuda: the kernel cache folder %s is not writable (%s); kernels are compiled in "
                            "memory for this process only",
                         b->cache_dir, mk ? strerror(mk) : werr.c_str());
                b->cache_warned = true;
            }
        }
    }
    ModState *s = new ModState();
    CUresult e = cuModuleLoadData(&s->module, cubin.data());
    if (e != CUDA_SUCCESS) {
        delete s;
        return fail(b, e == CUDA_ERROR_OUT_OF_MEMORY ? H3_E_NOMEM : H3_E_UNSUPPORTED,
                    "cuda: loading the kernels of %s for sm_%d: %s", m.name, arch, cu_errstr(e));
    }
    size_t at = 0;
    for (size_t i = 0; i < m.kernels.size(); i++) {
        size_t nl = lowered.find('\n', at);
        if (nl == std::string::npos) break;
        CUfunction f = NULL;
        e = cuModuleGetFunction(&f, s->module, lowered.substr(at, nl - at).c_str());
        if (e != CUDA_SUCCESS) {
            cuModuleUnload(s->module);
            delete s;
            return fail(b, H3_E_UNSUPPORTED, "cuda: kernel %s: %s", m.kernels[i].expr.c_str(), cu_errstr(e));
        }
        s->fns.push_back(f);
        at = nl + 1;
    }
    if (s->fns.size() != m.kernels.size()) {
        cuModuleUnload(s->module);
        delete s;
        return fail(b, H3_E_UNSUPPORTED, "cuda: the kernels of %s do not match their cache entry", m.name);
    }
    b->mods[mod] = s;
    return 0;
}

CUfunction kernel_function(Backend *b, int mod, int idx)
{
    if (!b->mods[mod]) {
        std::lock_guard<std::mutex> g(g_mod_lock);
        if (!b->mods[mod] && module_load(b, mod)) return NULL;
    }
    return b->mods[mod]->fns[(size_t)idx];
}

int kernel_launch(Backend *b, int mod, int idx, dim3 grid, dim3 block, size_t smem, CUstream st, void **args)
{
    CUfunction f = kernel_function(b, mod, idx);
    int rc = -H3_E_UNSUPPORTED;
    if (f) {
        CUresult e = cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)smem, st, args, NULL);
        if (e == CUDA_SUCCESS) return 0;
        char what[300];
        snprintf(what, sizeof what, "launching %s", mod_table()[mod].kernels[(size_t)idx].expr.c_str());
        rc = fail_cuda(b, e, what);
    }
    if (!b->launch_rc) b->launch_rc = rc;
    return rc;
}

int check_launch(Backend *b, const char *)
{
    const int rc = b->launch_rc;
    b->launch_rc = 0;
    return rc;
}

int check_launch(Backend *b, int rc)
{
    const int first = b->launch_rc;
    b->launch_rc = 0;
    return first ? first : rc;
}

int kernel_max_smem(Backend *b, int mod, int idx, size_t bytes)
{
    CUfunction f = kernel_function(b, mod, idx);
    if (!f) return -H3_E_UNSUPPORTED;
    CUresult e = cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes);
    return e == CUDA_SUCCESS ? 0 : fail_cuda(b, e, "raising a kernel's shared-memory limit");
}

int kernels_warmup(Backend *b)
{
    for (int m = 0; m < MOD_COUNT; m++) {
        if (b->mods[m]) continue;
        note(b, "cuda: kernels %d/%d: %s", m + 1, (int)MOD_COUNT, mod_table()[m].name);
        std::lock_guard<std::mutex> g(g_mod_lock);
        int rc = module_load(b, m);
        if (rc) return rc;
    }
    return 0;
}

void kernels_destroy(Backend *b)
{
    for (int m = 0; m < MOD_COUNT; m++)
        if (b->mods[m]) {
            cuModuleUnload(b->mods[m]->module);
            delete b->mods[m];
            b->mods[m] = NULL;
        }
}

} /* namespace h3cuda */

/* ---- the compile check (tests/test_cuda_nvrtc.py): no GPU, no driver ------------------------- */

/* Compiles every module for sm_<arch> with the NVRTC at nvrtc_path (NULL: the loader's search).
   0, or -1 with the first failure (module and NVRTC's log) in err. */
extern "C" __attribute__((visibility("default"))) int h3_cuda_compile_check(const char *nvrtc_path, int arch,
                                                                            char *err, size_t cap)
{
    using namespace h3cuda;
    char why[400];
    if (load_nvrtc(nvrtc_path, why, sizeof why)) {
        if (err && cap) snprintf(err, cap, "%s", why);
        return -1;
    }
    for (int m = 0; m < MOD_COUNT; m++) {
        std::string cubin, lowered, e;
        if (kernel_module_compile(m, arch, &cubin, &lowered, &e)) {
            if (err && cap) snprintf(err, cap, "%s", e.c_str());
            return -1;
        }
    }
    if (err && cap) snprintf(err, cap, "%d modules compiled for sm_%d", (int)MOD_COUNT, arch);
    return 0;
}
