/*
 * cuDNN attention (libh3/backend/cuda/cuda_sdpa_cudnn.cpp) against a recording double of cuDNN's
 * backend API (tests/c/fake_cudnn.c, built next to this test as fake_cudnn/libcudnn.so.9). No GPU.
 *
 * The graphs: for each case in tests/c/cudnn_graphs/, the trace of the graph this code builds
 * (every operation in order, every tensor and descriptor attribute, the heuristics query, the
 * plans tried, the variant pack) must equal, line for line, the trace NVIDIA's cudnn-frontend 1.32
 * produced for the same call against the same double (tests/c/cudnn_graphs/README.md says how
 * those were made). The double checks every attribute's type and count as it is set.
 *
 * The rest: the engine choice (non-deterministic engines skipped, first plan that finalizes), the
 * per-shape cache and its eviction, the workspace, and the faults (library missing, too old, no
 * handle, a graph cuDNN refuses, no engine, no workspace memory, a failed execute, bad arguments):
 * one-line reasons, the right code, O untouched. cuDNN is loaded once per process, so every
 * scenario runs in a child process.
 */
#define _GNU_SOURCE
#include "backend/cuda/cuda_sdpa.h"
#include "h3.h"

#include "ctest.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CUDNN_GRAPHS_DIR
#define CUDNN_GRAPHS_DIR "tests/c/cudnn_graphs"
#endif

static char g_fake[4096];  /* the double's libcudnn.so.9 */
static char g_trace[4096]; /* this scenario's trace file */

/* ---- the host callbacks: host memory stands in for device memory ------------------------------ */
typedef struct {
    int allocs, frees, syncs;
    size_t last_alloc;
    void *last_sync;
    int fail_alloc; /* 0, or the code dev_alloc returns */
} Host;

static int dev_alloc(void *ctx, size_t bytes, void **out)
{
    Host *h = ctx;
    if (h->fail_alloc) return h->fail_alloc;
    h->allocs++;
    h->last_alloc = bytes;
    return posix_memalign(out, 256, bytes) == 0 ? 0 : -H3_E_NOMEM;
}
static void dev_free(void *ctx, void *p)
{
    ((Host *)ctx)->frees++;
    free(p);
}
static int stream_sync(void *ctx, void *stream)
{
    Host *h = ctx;
    h->syncs++;
    h->last_sync = stream;
    return 0;
}

static Host g_host;
static struct h3_cudnn_host host_for(int major, int minor)
{
    struct h3_cudnn_host h = {0, major, minor, &g_host, dev_alloc, dev_free, stream_sync};
    return h;
}

/* ---- buffers ------------------------------------------------------------------------------------ */
static unsigned char g_q[64] __attribute__((aligned(64))), g_k[64] __attribute__((aligned(64)));
static unsigned char g_v[64] __attribute__((aligned(64))), g_o[64] __attribute__((aligned(64)));
static float g_scales[6 * 16] __attribute__((aligned(64)));
static float g_amax[8] __attribute__((aligned(16)));

static void reset_o(void) { memset(g_o, 0x11, sizeof g_o); }
static int o_written(void) { return g_o[0] == 0x5A && g_o[15] == 0x5A; }
static int o_untouched(void)
{
    for (size_t i = 0; i < sizeof g_o; i++)
        if (g_o[i] != 0x11) return 0;
    return 1;
}

/* ---- traces ------------------------------------------------------------------------------------- */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* The trace with every pointer written as PTR and comment lines dropped. */
static char *normalized(const char *text)
{
    size_t n = strlen(text);
    char *out = malloc(n + 1), *w = out;
    const char *r = text;
    while (*r) {
        if (*r == '#' && (r == text || r[-1] == '\n')) {
            while (*r && *r != '\n') r++;
            if (*r) r++;
            continue;
        }
        if (r[0] == '0' && r[1] == 'x') {
            r += 2;
            while ((*r >= '0' && *r <= '9') || (*r >= 'a' && *r <= 'f')) r++;
            memcpy(w, "PTR", 3);
            w += 3;
            continue;
        }
        *w++ = *r++;
    }
    *w = '\0';
    return out;
}

static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, prefix, pl) == 0) n++;
        p = strchr(p, '\n');
        if (p) p++;
    }
    return n;
}

static char *trace_now(void)
{
    char *t = slurp(g_trace);
    return t ? t : calloc(1, 1);
}

/* Compares this scenario's trace with a frontend trace; prints the first difference. */
static int same_as_frontend(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.txt", CUDNN_GRAPHS_DIR, name);
    char *want_raw = slurp(path), *got_raw = trace_now();
    if (!want_raw) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(got_raw);
        return 0;
    }
    char *want = normalized(want_raw), *got = normalized(got_raw);
    int same = strcmp(want, got) == 0;
    if (!same) {
        const char *a = want, *b = got;
        int line = 1;
        while (*a && *a == *b) {
            if (*a == '\n') line++;
            a++, b++;
        }
        fprintf(stderr, "%s: trace differs from the frontend's at line %d:\n  frontend: %.300s\n  ours:     %.300s\n",
                name, line, a, b);
    }
    free(want_raw), free(got_raw), free(want), free(got);
    return same;
}

/* ---- scenarios (each in its own process) ------------------------------------------------------ */
static void begin(const char *version)
{
    unlink(g_trace);
    setenv("FAKE_CUDNN_TRACE", g_trace, 1);
    if (version) setenv("FAKE_CUDNN_VERSION", version, 1);
    h3_cudnn_set_lib(g_fake);
    memset(&g_host, 0, sizeof g_host);
    reset_o();
}

static int no_errors_in_trace(void)
{
    char *t = trace_now();
    int ok = strstr(t, "ERROR") == NULL;
    if (!ok) fprintf(stderr, "the double refused a call:\n%s\n", t);
    free(t);
    return ok;
}

/* One graph case: the call as the frontend trace's header names it. */
typedef struct {
    const char *name, *version;
    int64_t Lq, Lk;
    int heads, kvh, D;
    int64_t ldq, ldk, ldv, ldo;
    float scale;
    int causal, fp8, sm;
    const char *shape; /* what the graph must be, checked apart from the trace comparison */
} Case;

static const Case CASES[] = {
    {"fused", "91900", 1024, 1024, 8, 8, 128, 1024, 1024, 1024, 1024, 0.088388f, 0, 0, 90, "graph 1 ops\n  op D41{"},
    {"fused_gqa", "91900", 300, 700, 8, 2, 128, 1024, 256, 512, 1024, 0.088388f, 0, 0, 80, "graph 1 ops\n  op D41{"},
    {"causal", "91900", 512, 512, 4, 4, 64, 256, 256, 256, 256, 0.125f, 1, 0, 90, "graph 14 ops\n  op D19{"},
    {"causal_br", "91900", 256, 512, 4, 4, 64, 256, 256, 256, 256, 0.125f, 1, 0, 90, "graph 16 ops\n  op D19{"},
    {"causal_br_gqa", "91900", 300, 700, 8, 2, 128, 1024, 256, 512, 1024, 0.088388f, 1, 0, 80, "graph 16 ops\n  op D19{"},
    {"fp8", "91900", 1024, 1024, 8, 8, 128, 1024, 1024, 1024, 1024, 0.088388f, 0, 1, 90, "graph 18 ops\n  op D19{"},
    {"fp8_gqa", "91900", 256, 512, 8, 2, 128, 1024, 256, 512, 1024, 0.088388f, 0, 1, 90, "graph 18 ops\n  op D19{"},
    {"composite_v9_5", "90500", 1024, 1024, 8, 8, 128, 1024, 1024, 1024, 1024, 0.088388f, 0, 0, 90, "graph 10 ops\n  op D19{"},
    {"causal_v9_5", "90500", 512, 512, 4, 4, 64, 256, 256, 256, 256, 0.125f, 1, 0, 90, "graph 14 ops\n  op D19{"},
    {"fused_v9_28", "92800", 1024, 1024, 8, 8, 128, 1024, 1024, 1024, 1024, 0.088388f, 0, 0, 90, "graph 1 ops\n  op D41{"},
};

static int call_case(const Case *c, void *stream, char *err, size_t cap)
{
    struct h3_cudnn_host h = host_for(c->sm / 10, c->sm % 10);
    if (c->fp8)
        return h3_cudnn_sdpa_fp8(&h, stream, g_q, g_k, g_v, g_o, g_scales, g_amax, c->Lq, c->Lk, c->heads, c->kvh,
                                 c->D, c->ldq, c->ldk, c->ldv, c->ldo, c->scale, err, cap);
    return h3_cudnn_sdpa(&h, stream, g_q, g_k, g_v, g_o, c->Lq, c->Lk, c->heads, c->kvh, c->D, c->ldq, c->ldk, c->ldv,
                         c->ldo, c->scale, c->causal, err, cap);
}

static void scenario_graph(const Case *c)
{
    begin(c->version);
    char err[512] = "";
    void *stream = (void *)(uintptr_t)0x1234;
    int rc = call_case(c, stream, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: rc %d: %s", c->name, rc, err);
    CHECK(o_written());
    CHECK(no_errors_in_trace());
    CHECK_MSG(same_as_frontend(c->name), "%s", c->name);
    /* The shape of the graph in plain words: the fused operation (type 41) or a composite graph
       that starts with the Q K^T matmul (type 19); no non-deterministic engine tried (the double's
       first, 7n, never reaches a plan); the frontend's mask offsets and value. */
    char *t = trace_now(), want[128];
    CHECK_MSG(strstr(t, c->shape) != NULL, "%s: no \"%s\"", c->name, c->shape);
    CHECK(strstr(t, "plan engine 7") == NULL && strstr(t, "plan engine 3 fails\nplan engine 5\n") != NULL);
    if (c->causal && c->Lq != c->Lk) {
        snprintf(want, sizeof want, "=int32:%lld ", (long long)c->Lk);
        CHECK(strstr(t, want) != NULL);
        snprintf(want, sizeof want, "=int32:%lld ", (long long)c->Lq);
        CHECK(strstr(t, want) != NULL);
    }
    if (c->causal) CHECK(strstr(t, strcmp(c->version, "91000") < 0 ? "=float:-3.40282347e+38" : "=float:-inf") != NULL);
    snprintf(want, sizeof want, "5=float:%.9g", (double)c->scale);
    CHECK_MSG(strstr(t, want) != NULL, "%s: %s", c->name, want);
    /* The variant pack hands over the caller's pointers under the graph's uids. */
    const void *ptrs[4] = {g_q, g_k, g_v, g_o};
    for (int u = 0; u < 4; u++) {
        snprintf(want, sizeof want, " %d=%p", u + 1, ptrs[u]);
        CHECK_MSG(strstr(t, want) != NULL, "%s: %s", c->name, want);
    }
    if (c->fp8) {
        for (int i = 0; i < 6; i++) {
            snprintf(want, sizeof want, " %d=%p", 10 + i, (void *)(g_scales + 16 * i));
            CHECK_MSG(strstr(t, want) != NULL, "%s: %s", c->name, want);
        }
        snprintf(want, sizeof want, " 20=%p", (void *)g_amax);
        CHECK(strstr(t, want) != NULL);
        snprintf(want, sizeof want, " 21=%p", (void *)(g_amax + 4));
        CHECK(strstr(t, want) != NULL);
    }
    snprintf(want, sizeof want, "execute stream %p", stream);
    CHECK(strstr(t, want) != NULL);
    free(t);
    /* The same call again: the cached plan, no second graph. */
    reset_o();
    rc = call_case(c, stream, err, sizeof err);
    CHECK(rc == 0 && o_written());
    t = trace_now();
    CHECK(count_lines(t, "graph ") == 1 && count_lines(t, "execute ") == 2);
    free(t);
}

static const Case *find_case(const char *name)
{
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
        if (!strcmp(CASES[i].name, name)) return &CASES[i];
    return NULL;
}

static void scenario_available(void)
{
    begin("91900");
    struct h3_cudnn_host h = host_for(9, 0);
    char why[512];
    CHECK(h3_cudnn_sdpa_available(&h, why, sizeof why) == 1);
    CHECK_MSG(strncmp(why, "cuDNN 9.19.0 for CUDA 13.0 (", 28) == 0 && strstr(why, "libcudnn.so.9)"), "%s", why);
    CHECK(h3_cudnn_sdpa_fp8_available(&h, why, sizeof why) == 1);
    CHECK_MSG(strstr(why, "cuDNN 9.19.0 on sm_90") != NULL, "%s", why);
    struct h3_cudnn_host a = host_for(8, 9);
    a.device = 1;
    CHECK(h3_cudnn_sdpa_fp8_available(&a, why, sizeof why) == 0);
    CHECK_MSG(strstr(why, "needs a Hopper GPU") && strstr(why, "sm_89"), "%s", why);
    CHECK(h3_cudnn_sdpa_available(NULL, why, sizeof why) == 0);
    CHECK(!strcmp(why, "no device given"));
    /* one handle per device */
    char *t = trace_now();
    CHECK(count_lines(t, "create handle") == 2);
    free(t);
}

static void scenario_missing(void)
{
    unlink(g_trace);
    setenv("FAKE_CUDNN_TRACE", g_trace, 1);
    h3_cudnn_set_lib("/nonexistent/libcudnn.so.9");
    reset_o();
    struct h3_cudnn_host h = host_for(9, 0);
    char why[1024], err[1024];
    CHECK(h3_cudnn_sdpa_available(&h, why, sizeof why) == 0);
    CHECK_MSG(strstr(why, "H3_CUDNN_LIB=/nonexistent/libcudnn.so.9: ") != NULL, "%s", why);
    CHECK(strchr(why, '\n') == NULL);
    const Case *c = find_case("fused");
    CHECK(call_case(c, NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(strncmp(err, "cudnn: H3_CUDNN_LIB=/nonexistent", 32) == 0, "%s", err);
    CHECK(o_untouched());
    CHECK(h3_cudnn_sdpa_fp8_available(&h, why, sizeof why) == 0);
}

static void scenario_too_old(void)
{
    begin("8907");
    struct h3_cudnn_host h = host_for(9, 0);
    char why[1024], err[1024];
    CHECK(h3_cudnn_sdpa_available(&h, why, sizeof why) == 0);
    CHECK_MSG(strncmp(why, "cuDNN 8.9.7 (", 13) == 0 && strstr(why, ") is older than 9.0"), "%s", why);
    CHECK(call_case(find_case("fused"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED && o_untouched());
    char *t = trace_now();
    CHECK(t[0] == '\0'); /* nothing was called beyond the version */
    free(t);
}

static void scenario_no_handle(void)
{
    begin("91900");
    setenv("FAKE_CUDNN_FAIL", "create", 1);
    struct h3_cudnn_host h = host_for(9, 0);
    char why[1024], err[1024];
    CHECK(h3_cudnn_sdpa_available(&h, why, sizeof why) == 0);
    CHECK_MSG(strncmp(why, "cudnnCreate failed: CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH", 60) == 0, "%s", why);
    CHECK(call_case(find_case("fused"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(strncmp(err, "cudnn: cudnnCreate failed", 25) == 0, "%s", err);
    CHECK(o_untouched());
}

static void scenario_graph_refused(void)
{
    begin("91900");
    setenv("FAKE_CUDNN_FAIL", "graph", 1);
    char err[1024];
    const Case *c = find_case("causal");
    CHECK(call_case(c, NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(!strcmp(err, "cudnn: sdpa 512 x 512, 4 heads (4 kv) of 64, causal: operation graph: finalize: "
                           "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN (fake cuDNN: no detail)"),
              "%s", err);
    CHECK(o_untouched());
    /* the failure is cached: one attempt per shape */
    char err2[1024];
    CHECK(call_case(c, NULL, err2, sizeof err2) == -H3_E_UNSUPPORTED && !strcmp(err, err2));
    char *t = trace_now();
    CHECK(count_lines(t, "graph ") == 1 && count_lines(t, "heuristics") == 0);
    free(t);
}

static void scenario_engines(void)
{
    char err[1024];
    /* all non-deterministic: none is used */
    begin("91900");
    setenv("FAKE_CUDNN_ENGINES", "4n,6n", 1);
    CHECK(call_case(find_case("fused"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(strstr(err, "no engine of 2 builds a plan: #0 non-deterministic; #1 non-deterministic") != NULL, "%s",
              err);
    CHECK(o_untouched());
    char *t = trace_now();
    CHECK(count_lines(t, "plan ") == 0 && count_lines(t, "execute") == 0);
    free(t);
    /* the first that finalizes, in the heuristics' order */
    const Case *c = find_case("fp8");
    setenv("FAKE_CUDNN_ENGINES", "2f,11n,8,1", 1);
    CHECK(call_case(c, NULL, err, sizeof err) == 0 && o_written());
    t = trace_now();
    CHECK_MSG(strstr(t, "plan engine 2 fails\nplan engine 8\nexecute") != NULL, "%s", t);
    free(t);
    /* no configurations at all */
    setenv("FAKE_CUDNN_FAIL", "heur", 1);
    reset_o();
    CHECK(call_case(find_case("causal"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED && o_untouched());
    CHECK_MSG(strstr(err, ": no engine configurations from cuDNN's heuristics (mode A) for this graph") != NULL, "%s",
              err);
    CHECK(no_errors_in_trace());
}

static void scenario_workspace(void)
{
    begin("91900");
    setenv("FAKE_CUDNN_WORKSPACE", "3000000", 1);
    char err[1024];
    void *s1 = (void *)(uintptr_t)0x1111, *s2 = (void *)(uintptr_t)0x2222;
    const Case *c = find_case("causal");
    CHECK(call_case(c, s1, err, sizeof err) == 0 && o_written());
    CHECK(g_host.allocs == 1 && g_host.last_alloc == 3u << 20); /* whole MiB */
    char *t = trace_now();
    CHECK(strstr(t, "workspace yes") != NULL);
    free(t);
    /* kept: a second shape of the same size allocates nothing; another stream waits for the first */
    CHECK(call_case(find_case("causal_br"), s2, err, sizeof err) == 0);
    CHECK(g_host.allocs == 1 && g_host.frees == 0);
    CHECK(g_host.syncs == 1 && g_host.last_sync == s1);
    /* grows: the old one is freed after its stream has drained */
    setenv("FAKE_CUDNN_WORKSPACE", "5000000", 1);
    CHECK(call_case(find_case("fused"), s2, err, sizeof err) == 0);
    CHECK(g_host.allocs == 2 && g_host.frees == 1 && g_host.last_alloc == 5u << 20);
    CHECK(g_host.syncs == 2 && g_host.last_sync == s2);
    /* out of memory: the reason, -H3_E_NOMEM, O untouched */
    setenv("FAKE_CUDNN_WORKSPACE", "9000000", 1);
    g_host.fail_alloc = -H3_E_NOMEM;
    reset_o();
    CHECK(call_case(find_case("fp8"), s2, err, sizeof err) == -H3_E_NOMEM);
    CHECK_MSG(!strcmp(err, "cudnn: sdpa: cannot allocate 9.0 MiB of workspace: out of device memory"), "%s", err);
    CHECK(o_untouched());
    CHECK(no_errors_in_trace());
}

static void scenario_execute_fails(void)
{
    begin("91900");
    setenv("FAKE_CUDNN_FAIL", "exec", 1);
    char err[1024];
    CHECK(call_case(find_case("fused_gqa"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(!strcmp(err, "cudnn: sdpa 300 x 700, 8 heads of 128: execute: CUDNN_STATUS_EXECUTION_FAILED (fake "
                           "cuDNN: no detail)"),
              "%s", err);
    CHECK(o_untouched());
    setenv("FAKE_CUDNN_FAIL", "setstream", 1);
    CHECK(call_case(find_case("fused_gqa"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED);
    CHECK_MSG(strncmp(err, "cudnn: cudnnSetStream failed: CUDNN_STATUS_BAD_PARAM", 52) == 0, "%s", err);
    CHECK(o_untouched());
}

static void scenario_validate(void)
{
    char err[1024];
    begin("91000"); /* the frontend refuses bf16 on 9.10.0 */
    CHECK(call_case(find_case("fused"), NULL, err, sizeof err) == -H3_E_UNSUPPORTED && o_untouched());
    CHECK_MSG(strstr(err, ": validate: SDPA FP16/BF16 forward is not supported on cuDNN 9.10.0/9.10.1") != NULL, "%s",
              err);
    Case c = *find_case("fp8");
    c.sm = 80;
    CHECK(call_case(&c, NULL, err, sizeof err) == -H3_E_UNSUPPORTED && o_untouched());
    CHECK_MSG(strstr(err, "sdpa fp8 forward operation is not supported on cudnn 9.10.0") != NULL, "%s", err);
    char *t = trace_now();
    CHECK(count_lines(t, "graph ") == 0);
    free(t);
}

static void scenario_fp8_arch(void)
{
    begin("91900");
    char err[1024];
    Case c = *find_case("fp8");
    c.sm = 89;
    CHECK(call_case(&c, NULL, err, sizeof err) == -H3_E_UNSUPPORTED && o_untouched());
    CHECK_MSG(strstr(err, "cudnn: sdpa fp8 1024 x 1024, 8 heads (8 kv) of 128: validate: sdpa fp8 forward operation "
                          "is only supported on Hopper") != NULL,
              "%s", err);
}

static void scenario_arguments(void)
{
    begin("91900");
    struct h3_cudnn_host h = host_for(9, 0);
    char err[512];
    int rc;
#define BAD(code, msg, call)                                                                          \
    do {                                                                                              \
        err[0] = '\0';                                                                                \
        rc = (call);                                                                                  \
        CHECK_MSG(rc == (code) && !strcmp(err, msg), "rc %d, \"%s\", expected \"%s\"", rc, err, msg); \
    } while (0)
    BAD(-H3_E_INVALID, "cudnn: sdpa: L_q 4, L_k 4, 6 heads, 4 kv heads, head dim 64",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 6, 4, 64, 384, 256, 256, 384, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: head dim 100 (cuDNN takes multiples of 8 up to 256)",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 100, 100, 100, 100, 100, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: rows or pointers not 16-byte aligned",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 64, 68, 64, 64, 64, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: rows or pointers not 16-byte aligned",
        h3_cudnn_sdpa(&h, NULL, g_q + 2, g_k, g_v, g_o, 4, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: causal with more queries (8) than keys (4)",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 8, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 1, err, sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa: scale must be positive and finite, got nan",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 64, 64, 64, 64, 64, NAN, 0, err, sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa: row strides q 32, k 64, v 64, o 64 are shorter than a row (64, 64)",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 64, 32, 64, 64, 64, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa: missing Q, K, V or O",
        h3_cudnn_sdpa(&h, NULL, g_q, NULL, g_v, g_o, 4, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: no keys",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 0, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: 2147483648 x 4 tokens is too many",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 2147483648LL, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, err,
                      sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: 2147483647 x 2147483647 tokens with 4096 heads is too large",
        h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 2147483647LL, 2147483647LL, 4096, 1, 64, 262144, 64, 64, 262144,
                      0.1f, 0, err, sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa fp8: no scales",
        h3_cudnn_sdpa_fp8(&h, NULL, g_q, g_k, g_v, g_o, NULL, g_amax, 4, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, err,
                          sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa fp8: the scales (64-byte aligned) or the amax outputs are missing or misaligned",
        h3_cudnn_sdpa_fp8(&h, NULL, g_q, g_k, g_v, g_o, g_scales + 1, g_amax, 4, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f,
                          err, sizeof err));
    BAD(-H3_E_UNSUPPORTED, "cudnn: sdpa: head dim 72 (cuDNN takes multiples of 16 up to 256)",
        h3_cudnn_sdpa_fp8(&h, NULL, g_q, g_k, g_v, g_o, g_scales, g_amax, 4, 4, 1, 1, 72, 80, 80, 80, 80, 0.1f, err,
                          sizeof err));
    BAD(-H3_E_INVALID, "cudnn: sdpa: no device given",
        h3_cudnn_sdpa(NULL, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, err, sizeof err));
    /* L_q == 0 is a no-op; a NULL err is allowed */
    CHECK(h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 0, 4, 1, 1, 64, 64, 64, 64, 64, 0.1f, 0, NULL, 0) == 0);
    CHECK(h3_cudnn_sdpa(&h, NULL, g_q, g_k, g_v, g_o, 4, 4, 1, 1, 100, 100, 100, 100, 100, 0.1f, 0, NULL, 0) ==
          -H3_E_UNSUPPORTED);
    CHECK(o_untouched());
    /* none of these reached cuDNN */
    CHECK(access(g_trace, F_OK) != 0);
#undef BAD
}

static void scenario_eviction(void)
{
    begin("91900");
    char err[512];
    struct h3_cudnn_host h = host_for(9, 0);
    void *first = (void *)(uintptr_t)0xABC0;
    /* 64 shapes fill the cache; the 65th evicts the least recently used, after draining its stream */
    for (int i = 0; i < 65; i++) {
        void *s = i == 0 ? first : (void *)(uintptr_t)0xD000;
        int rc = h3_cudnn_sdpa(&h, s, g_q, g_k, g_v, g_o, 16 + i, 64, 1, 1, 64, 64, 64, 64, 64, 0.125f, 0, err,
                               sizeof err);
        CHECK_MSG(rc == 0, "shape %d: %s", i, err);
    }
    CHECK(g_host.syncs == 1 && g_host.last_sync == first);
    /* the evicted shape is built again */
    CHECK(h3_cudnn_sdpa(&h, first, g_q, g_k, g_v, g_o, 16, 64, 1, 1, 64, 64, 64, 64, 64, 0.125f, 0, err, sizeof err) ==
          0);
    char *t = trace_now();
    CHECK(count_lines(t, "graph ") == 66);
    free(t);
    CHECK(no_errors_in_trace());
}

static void run(const char *name, void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ctest_failures = ctest_checks = 0;
        fn();
        printf("  %-16s %d checks, %d failures\n", name, ctest_checks, ctest_failures);
        fflush(NULL);
        exit(ctest_failures ? 1 : 0); /* exit, not _exit: LeakSanitizer checks the child too */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "scenario %s (status %d)", name, status);
}

static const Case *g_case;
static void graph_case(void) { scenario_graph(g_case); }

int main(void)
{
    char exe[2048];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 1;
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(g_fake, sizeof g_fake, "%s/fake_cudnn/libcudnn.so.9", exe);
    snprintf(g_trace, sizeof g_trace, "%s/fake_cudnn/trace.%d.txt", exe, (int)getpid());
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        g_case = &CASES[i];
        run(CASES[i].name, graph_case);
    }
    run("available", scenario_available);
    run("missing", scenario_missing);
    run("too_old", scenario_too_old);
    run("no_handle", scenario_no_handle);
    run("graph_refused", scenario_graph_refused);
    run("engines", scenario_engines);
    run("workspace", scenario_workspace);
    run("execute_fails", scenario_execute_fails);
    run("validate", scenario_validate);
    run("fp8_arch", scenario_fp8_arch);
    run("arguments", scenario_arguments);
    run("eviction", scenario_eviction);
    unlink(g_trace);
    CTEST_END();
}
