/* The one reader of libh3's environment variables (see core/tuning.h and docs/environment.md). */
#include "core/tuning.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Set and not empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static void copy(char *dst, size_t cap, const char *v) { snprintf(dst, cap, "%s", v ? v : ""); }

static bool g_no_simd;
static pthread_once_t g_no_simd_once = PTHREAD_ONCE_INIT;
static void read_no_simd(void)
{
    const char *v = env("H3_NO_SIMD");
    g_no_simd = v && strcmp(v, "0") != 0;
}
bool h3_env_no_simd(void)
{
    pthread_once(&g_no_simd_once, read_no_simd);
    return g_no_simd;
}

static char g_cuda_lib[4096];
static pthread_once_t g_cuda_lib_once = PTHREAD_ONCE_INIT;
static void read_cuda_lib(void) { copy(g_cuda_lib, sizeof g_cuda_lib, env("H3_CUDA_LIB")); }
const char *h3_env_cuda_lib(void)
{
    pthread_once(&g_cuda_lib_once, read_cuda_lib);
    return g_cuda_lib;
}

static char g_metal_lib[4096];
static pthread_once_t g_metal_lib_once = PTHREAD_ONCE_INIT;
static void read_metal_lib(void) { copy(g_metal_lib, sizeof g_metal_lib, env("H3_METAL_LIB")); }
const char *h3_env_metal_lib(void)
{
    pthread_once(&g_metal_lib_once, read_metal_lib);
    return g_metal_lib;
}

/* TMPDIR is the platform's, not a knob: read where a temporary file is made (no copy kept, so a
   caller that changes it between opens is followed, as mkstemp's other users would be). */
const char *h3_env_tmpdir(void)
{
    const char *v = env("TMPDIR");
    return v && v[0] ? v : "/tmp";
}

/* The exact-path flags: a variable set to a value other than 0 turns its switch on, set to 0 turns
   it off; `inverted`: the variable names the fast path (H3_DIT_PRECOMPUTE=0 -> per-step). */
static const struct {
    const char *name;
    unsigned flag;
    bool inverted;
} k_flag_vars[] = {{"H3_DIT_PRECOMPUTE", H3_OPT_DIT_PER_STEP, true},
                   {"H3_DIT_KEEP_ADALN", H3_OPT_KEEP_ADALN, false},
                   {"H3_TEXT_PREFETCH", H3_OPT_NO_TEXT_PREFETCH, true},
                   {"H3_DROP_PAGE_CACHE", H3_OPT_DROP_PAGE_CACHE, false},
                   {"H3_STAGES_CPU", H3_OPT_STAGES_CPU, false},
                   {"H3_FP8_ATTENTION", H3_OPT_FP8_ATTENTION, false},
                   {"H3_FP8_DECODER", H3_OPT_FP8_DECODER, false}};
#define N_FLAG_VARS (sizeof k_flag_vars / sizeof *k_flag_vars)

/* "0" -> 0, "1" -> 1, anything else (or unset) -> -1: the tri-state switches of the text encoder. */
static int tri(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0") ? 0 : v && !strcmp(v, "1") ? 1 : -1;
}

/* A whole number 0..max, or -2 when set to anything else; -1 when unset or "". */
static int whole(const char *name, int max)
{
    const char *v = env(name);
    if (!v) return -1;
    long n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9' || n > max) return -2;
        n = n * 10 + (*c - '0');
    }
    return n <= max ? (int)n : -2;
}

void h3_tuning_read(h3_tuning *t)
{
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < N_FLAG_VARS; i++) {
        const char *v = env(k_flag_vars[i].name);
        if (!v) continue;
        bool on = strcmp(v, "0") != 0;
        if (k_flag_vars[i].inverted) on = !on;
        if (on)
            t->flags_on |= k_flag_vars[i].flag;
        else
            t->flags_off |= k_flag_vars[i].flag;
    }
    t->text_stream = tri("H3_TEXT_STREAM");
    t->text_keep = tri("H3_TEXT_KEEP");
    const char *r = env("H3_TEXT_READERS");
    if (r) {
        int n = atoi(r);
        t->text_readers = n < 1 ? 1 : n > 16 ? 16 : n;
    }
    const char *p = getenv("H3_STREAM_PACK");
    t->stream_pack = !(p && !strcmp(p, "0"));
    const char *w = env("H3_QUANT_WIDEN");
    t->quant_widen = w && strcmp(w, "0") != 0;
    copy(t->cuda_attention, sizeof t->cuda_attention, env("H3_CUDA_ATTENTION"));
    copy(t->cuda_rows, sizeof t->cuda_rows, env("H3_CUDA_ROWS"));
    copy(t->cudnn_lib, sizeof t->cudnn_lib, env("H3_CUDNN_LIB"));
    copy(t->libcuda, sizeof t->libcuda, env("H3_LIBCUDA"));
    copy(t->nvrtc_lib, sizeof t->nvrtc_lib, env("H3_NVRTC_LIB"));
    copy(t->cublaslt_lib, sizeof t->cublaslt_lib, env("H3_CUBLASLT_LIB"));
    const char *kc = env("H3_KERNEL_CACHE"), *xdg = env("XDG_CACHE_HOME"), *home = env("HOME");
    if (kc)
        copy(t->kernel_cache, sizeof t->kernel_cache, strcmp(kc, "off") ? kc : NULL);
    else if (xdg)
        snprintf(t->kernel_cache, sizeof t->kernel_cache, "%s/h3ctl/kernels", xdg);
    else if (home)
        snprintf(t->kernel_cache, sizeof t->kernel_cache, "%s/.cache/h3ctl/kernels", home);
    else
        t->kernel_cache[0] = '\0';
    t->no_simd = h3_env_no_simd();
    copy(t->cuda_lib, sizeof t->cuda_lib, h3_env_cuda_lib());
    const int lb = whole("H3_LOOPBACK_RANKS", 64);
    t->loopback_ranks = lb == -1 || lb == 0 ? 0 : lb < 0 ? -1 : lb; /* 0: off, as unset */
    t->rank = whole("RANK", 1 << 20);
    t->world_size = whole("WORLD_SIZE", 1 << 20);
    t->local_rank = whole("LOCAL_RANK", 1 << 20);
    copy(t->rendezvous, sizeof t->rendezvous, env("H3_RENDEZVOUS"));
    copy(t->nccl_lib, sizeof t->nccl_lib, env("H3_NCCL_LIB"));
}

static void kv_str(h3_buf *b, const char *k, const char *v)
{
    h3_buf_printf(b, ", \"%s\": ", k);
    if (v && v[0])
        h3_buf_json_str(b, v);
    else
        h3_buf_printf(b, "null");
}

static void kv_tri(h3_buf *b, const char *k, int v)
{
    h3_buf_printf(b, ", \"%s\": %s", k, v < 0 ? "null" : v ? "true" : "false");
}

void h3_tuning_json(h3_buf *b, const h3_tuning *t)
{
    h3_buf_printf(b, "{\"H3_NO_SIMD\": %s", t->no_simd ? "true" : "null");
    kv_str(b, "H3_CUDA_LIB", t->cuda_lib);
    for (size_t i = 0; i < N_FLAG_VARS; i++) {
        unsigned f = k_flag_vars[i].flag;
        /* the variable's own sense: H3_DIT_PRECOMPUTE=0 turns H3_OPT_DIT_PER_STEP on */
        int v = (t->flags_on & f) ? 1 : (t->flags_off & f) ? 0 : -1;
        if (v >= 0 && k_flag_vars[i].inverted) v = !v;
        kv_tri(b, k_flag_vars[i].name, v);
    }
    kv_tri(b, "H3_TEXT_STREAM", t->text_stream);
    if (t->text_readers)
        h3_buf_printf(b, ", \"H3_TEXT_READERS\": %d", t->text_readers);
    else
        h3_buf_printf(b, ", \"H3_TEXT_READERS\": null");
    kv_tri(b, "H3_TEXT_KEEP", t->text_keep);
    h3_buf_printf(b, ", \"H3_STREAM_PACK\": %s", t->stream_pack ? "null" : "false");
    h3_buf_printf(b, ", \"H3_QUANT_WIDEN\": %s", t->quant_widen ? "true" : "null");
    kv_str(b, "H3_CUDA_ATTENTION", t->cuda_attention);
    kv_str(b, "H3_CUDA_ROWS", t->cuda_rows);
    kv_str(b, "H3_CUDNN_LIB", t->cudnn_lib);
    if (t->loopback_ranks)
        h3_buf_printf(b, ", \"H3_LOOPBACK_RANKS\": %d", t->loopback_ranks);
    else
        h3_buf_printf(b, ", \"H3_LOOPBACK_RANKS\": null");
    const char *ids[3] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
    const int vals[3] = {t->rank, t->world_size, t->local_rank};
    for (int i = 0; i < 3; i++)
        if (vals[i] == -1)
            h3_buf_printf(b, ", \"%s\": null", ids[i]);
        else if (vals[i] == -2)
            h3_buf_printf(b, ", \"%s\": \"invalid\"", ids[i]);
        else
            h3_buf_printf(b, ", \"%s\": %d", ids[i], vals[i]);
    kv_str(b, "H3_RENDEZVOUS", t->rendezvous);
    kv_str(b, "H3_NCCL_LIB", t->nccl_lib);
    h3_buf_printf(b, "}");
}
