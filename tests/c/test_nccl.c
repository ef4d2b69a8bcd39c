/*
 * The NCCL communicator's loader and its error paths (backend/cuda/cuda_nccl.cpp, compiled here with
 * the host C++ compiler, no CUDA), against fake libnccl libraries built next to this test
 * (tests/c/fake_nccl.c): NCCL missing, too old, a symbol missing, ncclCommInitRank failing, a rank that
 * never joins (the init times out), a rank whose rank 0 never writes the rendezvous file, a stale
 * rendezvous file, bad options; and the working path: a one-rank group's collectives, and two ranks
 * (threads) meeting through the rendezvous file with the same unique id. Each failure is one line
 * naming what failed.
 */
#include "ctest.h"
#include "backend/comm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

H3_INTERNAL int h3_comm_nccl_create(const h3_nccl_opts *o, h3_comm **out);

static char g_dir[256];

static void fake_path(char *out, size_t cap, const char *variant)
{
    /* the fakes are built next to this binary */
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(out, cap, "%s/fake_nccl_%s.so", exe, variant);
}

static int sync_ok(void *ctx)
{
    (*(int *)ctx)++;
    return 0;
}

static h3_nccl_opts opts(const char *variant, int rank, int world, const char *rdv, double timeout)
{
    static char lib[8][4200];
    static int k;
    char *l = lib[k++ % 8];
    if (variant[0] == '/')
        snprintf(l, 4200, "%s", variant);
    else
        fake_path(l, 4200, variant);
    h3_nccl_opts o = {sizeof(h3_nccl_opts), rank, world, rdv, l, timeout, NULL, NULL, NULL, NULL, h3_err};
    return o;
}

static int create(const char *variant, int rank, int world, const char *rdv, double timeout, h3_comm **c)
{
    h3_nccl_opts o = opts(variant, rank, world, rdv, timeout);
    return h3_comm_nccl_create(&o, c);
}

static void test_faults(void)
{
    h3_comm *c = NULL;
    char rdv[512];
    CHECK(create("/nonexistent/libnccl.so.2", 0, 1, NULL, 1, &c) == -H3_E_UNSUPPORTED && !c);
    CHECK_MSG(strstr(h3_last_error(), "NCCL is not available") && strstr(h3_last_error(), "/nonexistent/libnccl.so.2"),
              "%s", h3_last_error());
    CHECK(create("old", 0, 1, NULL, 1, &c) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "version code 2600"));
    CHECK(create("nosend", 0, 1, NULL, 1, &c) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "has no ncclSend"));
    CHECK(create("initfail", 0, 1, NULL, 1, &c) == -H3_E_IO);
    CHECK_MSG(strstr(h3_last_error(), "ncclCommInitRank failed: unhandled system error (2)"), "%s", h3_last_error());
    /* rank 0 of 2 writes the id, then its init waits for a rank that never joins */
    snprintf(rdv, sizeof rdv, "%s/hang.id", g_dir);
    const time_t t0 = time(NULL);
    CHECK(create("hang", 0, 2, rdv, 0.3, &c) == -H3_E_IO && !c);
    CHECK_MSG(strstr(h3_last_error(), "ncclCommInitRank did not complete in 0.3 s (a rank did not join)"), "%s",
              h3_last_error());
    CHECK(time(NULL) - t0 < 5); /* the fake's init sleeps 30 s: the timeout, not the init, ended the wait */
    struct stat st;
    CHECK(stat(rdv, &st) == 0 && st.st_size == 128);
    /* that file is stale for the next run's rank 0 */
    CHECK(create("ok", 0, 2, rdv, 0.3, &c) == -H3_E_INVALID && strstr(h3_last_error(), "exists already"));
    /* rank 1 whose rank 0 never writes */
    snprintf(rdv, sizeof rdv, "%s/never.id", g_dir);
    CHECK(create("ok", 1, 2, rdv, 0.2, &c) == -H3_E_IO);
    CHECK_MSG(strstr(h3_last_error(), "nccl rank 1: no rendezvous file") && strstr(h3_last_error(), "rank 0 did not start"),
              "%s", h3_last_error());
    /* a truncated rendezvous file */
    snprintf(rdv, sizeof rdv, "%s/short.id", g_dir);
    FILE *f = fopen(rdv, "wb");
    fputs("short", f);
    fclose(f);
    CHECK(create("ok", 1, 2, rdv, 0.2, &c) == -H3_E_IO && strstr(h3_last_error(), "holds 5 bytes, not 128"));
    /* bad options */
    CHECK(create("ok", 2, 2, rdv, 0.2, &c) == -H3_E_INVALID && strstr(h3_last_error(), "rank 2 of 2"));
    CHECK(create("ok", 0, 2, NULL, 0.2, &c) == -H3_E_INVALID && strstr(h3_last_error(), "rendezvous"));
    h3_nccl_opts o = opts("ok", 0, 1, NULL, 1);
    o.struct_size = 8;
    CHECK(h3_comm_nccl_create(&o, &c) == -H3_E_INVALID);
    CHECK(strcmp(getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "", "0") == 0);
}

static void test_one_rank(void)
{
    h3_comm *c = NULL;
    int syncs = 0;
    h3_nccl_opts o = opts("ok", 0, 1, NULL, 1);
    int scratch[1];
    o.scratch = scratch;
    o.sync = sync_ok;
    o.sync_ctx = &syncs;
    CHECK(h3_comm_nccl_create(&o, &c) == 0 && c);
    if (!c) return;
    CHECK(!strcmp(c->kind, "nccl") && c->rank == 0 && c->world == 1);
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {0};
    CHECK(c->ops->all_gather(c, a, b, sizeof a) == 0 && !memcmp(a, b, sizeof a));
    CHECK(c->ops->broadcast(c, a, sizeof a, 0) == 0);
    CHECK(c->ops->broadcast(c, a, sizeof a, 1) == -H3_E_INVALID);
    CHECK(c->ops->barrier(c) == 0 && syncs == 1);
    /* a piece naming the rank itself is refused before NCCL sees it */
    const h3_comm_piece self = {0, a, sizeof a, b, sizeof b};
    CHECK(c->ops->exchange(c, &self, 1) == -H3_E_INVALID && strstr(h3_last_error(), "names rank 0 of 1"));
    void *so = dlopen(o.lib, RTLD_NOW | RTLD_NOLOAD);
    int *destroyed = so ? dlsym(so, "fake_nccl_destroyed") : NULL;
    const int before = destroyed ? *destroyed : -1;
    h3_comm_destroy(c);
    CHECK(destroyed && *destroyed == before + 1 && syncs == 2);
    if (so) dlclose(so);
}

typedef struct {
    int rank, rc;
    h3_comm *c;
    char rdv[512];
} rank_arg;

static void *rank_main(void *a)
{
    rank_arg *r = a;
    if (r->rank == 1) usleep(50000); /* rank 1 starts first in spirit: it waits for the file */
    r->rc = create("ok", r->rank, 2, r->rdv, 5, &r->c);
    return NULL;
}

static void test_rendezvous(void)
{
    rank_arg ra[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        ra[r] = (rank_arg){r, -1, NULL, ""};
        snprintf(ra[r].rdv, sizeof ra[r].rdv, "%s/meet.id", g_dir);
    }
    pthread_create(&th[1], NULL, rank_main, &ra[1]);
    pthread_create(&th[0], NULL, rank_main, &ra[0]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    CHECK(ra[0].rc == 0 && ra[1].rc == 0 && ra[0].c && ra[1].c);
    char lib[4200];
    fake_path(lib, sizeof lib, "ok");
    void *so = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    char(*seen)[128] = so ? dlsym(so, "fake_nccl_seen") : NULL;
    CHECK(seen && memcmp(seen[0], seen[1], 128) == 0);
    int nz = 0;
    for (int i = 0; seen && i < 128; i++) nz += seen[0][i] != 0;
    CHECK(nz > 0);
    /* no temporary file left next to the rendezvous file */
    char tmp[600];
    snprintf(tmp, sizeof tmp, "ls %s | grep -c tmp > /dev/null", g_dir);
    CHECK(system(tmp) != 0);
    for (int r = 0; r < 2; r++) h3_comm_destroy(ra[r].c);
    if (so) dlclose(so);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/h3_test_nccl_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    unsetenv("NCCL_NVLS_ENABLE");
    test_faults();
    test_one_rank();
    test_rendezvous();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    printf("test_nccl: %d checks, %d failures\n", ctest_checks, ctest_failures);
    return ctest_failures != 0;
}
