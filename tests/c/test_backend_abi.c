/*
 * The backend ABI check (backend.c): a CUDA backend library built from other headers is refused
 * with one line before anything in it but its ABI function is called, the refusal reaches
 * h3_last_error and h3_backends_json, and the CPU backend keeps working. The libraries are
 * tests/c/fake_backend.c, built next to this test by the Makefile; H3_CUDA_LIB points backend.c
 * at each in turn. libh3 reads H3_CUDA_LIB once per process (core/tuning.c), so each library is
 * tried in a child process of its own, forked before anything read the variable.
 */
#include "ctest.h"
#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "h3.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[4096];

static void use_lib(const char *which, char *path, size_t cap)
{
    snprintf(path, cap, "%sfake_backend_%s.so", g_dir, which);
    setenv("H3_CUDA_LIB", path, 1);
}

/* The library is refused with one line holding every piece of `want`, and nothing is returned. */
static void expect_refused(const char *which, const char *const *want, int n)
{
    char path[4200];
    use_lib(which, path, sizeof path);
    CHECK_MSG(h3_backend_cuda_built(), "%s: %s not found (the Makefile builds it)", which, path);
    h3_backend *be = (h3_backend *)(uintptr_t)1;
    int rc = h3_backend_cuda_open(0, NULL, &be);
    const char *msg = h3_last_error();
    CHECK_MSG(rc == -H3_E_UNSUPPORTED && be == NULL, "%s: rc %d", which, rc);
    CHECK_MSG(msg && !strchr(msg, '\n') && strstr(msg, "cuda: "), "%s: %s", which, msg ? msg : "(none)");
    for (int i = 0; i < n; i++) CHECK_MSG(msg && strstr(msg, want[i]), "%s: \"%s\" not in: %s", which, want[i], msg);
    /* The same reason in the backends description, with the CPU still there. */
    const char *js = h3_backends_json();
    CHECK_MSG(js && strstr(js, "\"cpu\": {\"available\": true") && strstr(js, "\"available\": false, \"reason\": "),
              "%s: %s", which, js ? js : "(null)");
    for (int i = 0; i < n; i++) CHECK_MSG(js && strstr(js, want[i]), "%s: \"%s\" not in %s", which, want[i], js);
}

/* y = W x through the CPU backend's table, against the sums done here. */
static void check_cpu_works(void)
{
    h3_pool *pool = h3_pool_create(2);
    h3_backend *cpu = NULL;
    CHECK(pool && h3_backend_cpu_create(pool, &cpu) == 0 && cpu);
    if (!cpu) return;
    CHECK(cpu->abi_version == H3_BACKEND_ABI && cpu->is_host && h3_backend_check(cpu) == 0);
    CHECK(h3_backend_has(cpu, H3_CAP_DECODERS) && h3_backend_supports(cpu, H3_OP_vae_stitch));
    CHECK(!h3_backend_has(cpu, H3_CAP_RINGS) && !h3_backend_has(cpu, H3_CAP_FP8_WEIGHTS));
    enum { M = 3, N = 5, K = 7 };
    float W[N * K], X[M * K], Y[M * N];
    for (int i = 0; i < N * K; i++) W[i] = frand();
    for (int i = 0; i < M * K; i++) X[i] = frand();
    h3_bw w;
    CHECK(cpu->weights->weight_load(cpu, W, H3_DT_F32, N, K, &w) == 0);
    h3_bt x = h3_bt_make(X, H3_DT_F32, M, K, K), y = h3_bt_make(Y, H3_DT_F32, M, N, N);
    CHECK(cpu->ops->linear(cpu, &x, &w, NULL, &y) == 0);
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double r = 0;
            for (int k = 0; k < K; k++) r += (double)X[m * K + k] * W[n * K + k];
            worst = fmax(worst, fabs(r - Y[m * N + n]));
        }
    CHECK_MSG(worst < 1e-5, "cpu linear after a refused library: max error %g", worst);
    cpu->weights->weight_free(cpu, &w);
    h3_backend_destroy(cpu);
    h3_pool_destroy(pool);
}

/* A backend whose tables leave out something every backend needs, or one its caps promise. */
static void check_table_checks(void)
{
    h3_pool *pool = h3_pool_create(1);
    h3_backend *cpu = NULL;
    CHECK(pool && h3_backend_cpu_create(pool, &cpu) == 0 && cpu);
    if (!cpu) return;
    h3_backend fake = *cpu;
    fake.caps |= H3_CAP_RINGS | H3_CAP_PINNED;
    CHECK(h3_backend_check(&fake) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "no host_alloc function"));
    fake = *cpu;
    fake.dec = NULL;
    CHECK(h3_backend_check(&fake) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "H3_CAP_DECODERS"));
    fake.caps &= ~(uint32_t)H3_CAP_DECODERS;
    CHECK(h3_backend_check(&fake) == 0 && !h3_backend_supports(&fake, H3_OP_vae_stitch) &&
          h3_backend_supports(&fake, H3_OP_linear));
    static const h3_op need[] = {H3_OP_linear, H3_OP_snake_aa};
    CHECK(h3_backend_need(&fake, need, 2, "the audio VAE decoder") == -H3_E_UNSUPPORTED &&
          !strcmp(h3_last_error(), "the cpu backend has no snake_aa op (needed by the audio VAE decoder)"));
    h3_backend_ops ops = *cpu->ops;
    ops.noise = NULL;
    fake = *cpu;
    fake.ops = &ops;
    CHECK(h3_backend_check(&fake) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "no noise op"));
    fake = *cpu;
    fake.abi_version = H3_BACKEND_ABI - 1;
    CHECK(h3_backend_check(&fake) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "backend ABI"));
    h3_backend_destroy(cpu);
    h3_pool_destroy(pool);
}

int main(int argc, char **argv)
{
    (void)argc;
    const char *slash = strrchr(argv[0], '/');
    size_t n = slash ? (size_t)(slash - argv[0] + 1) : 0;
    if (n >= sizeof g_dir) n = 0;
    memcpy(g_dir, argv[0], n);
    g_dir[n] = 0;

    char abi[32], wrong[32];
    snprintf(abi, sizeof abi, "needs ABI %u", (unsigned)H3_BACKEND_ABI);
    snprintf(wrong, sizeof wrong, "has backend ABI %u", (unsigned)H3_BACKEND_ABI + 1000u);
    const char *noabi_want[] = {"fake_backend_noabi.so", "predates backend ABI versions", abi, "make cuda"};
    const char *wrong_want[] = {"fake_backend_wrong.so", wrong, abi, "make cuda"};
    const char *hollow_want[] = {"backend cuda", "a table (mem, weights, ops) is missing"};
    for (int c = 0; c < 4; c++) {
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            if (c == 0) expect_refused("noabi", noabi_want, 4);
            if (c == 1) expect_refused("wrong", wrong_want, 4);
            if (c == 2) expect_refused("hollow", hollow_want, 2);
            if (c == 3) { /* a path with nothing there: not built, the CPU path unaffected */
                setenv("H3_CUDA_LIB", "/nonexistent/libh3_cuda.so", 1);
                CHECK(!h3_backend_cuda_built());
            }
            check_cpu_works();
            fflush(stdout);
            _exit(ctest_failures ? 1 : 0);
        }
        int st = 0;
        CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "case %d failed in its child (status %d)", c, st);
    }
    check_table_checks();
    CTEST_END();
}
