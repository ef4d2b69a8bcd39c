/*
 * Sequence parallelism on the CPU (models/dit_sp.c, docs/multi-gpu.md): the facts its exactness rests
 * on (the CPU GEMM gives a row the same bits at any row count above its few-rows shortcut and at any
 * offset; attention over a subset of heads gives those heads' bits), the loopback communicator
 * (exchange, all-gather, broadcast, a rank that aborts releases the others), and the transformer split
 * over 2, 4, 7 and 8 loopback ranks on a 56-head checkpoint written here (the released model's head
 * count, at a small head dim): one forward and a whole denoise bit-identical to one device, a degree
 * that does not divide the heads and a sequence too short for the ranks refused with their messages.
 */
#include "ctest.h"
#include "backend/cpu/ops.h"
#include "backend/comm.h"
#include "models/dit.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a 56-head checkpoint (tests/c/test_dit.c's writer, at the released head count) ---------- */

#define DIT_FIXTURE_HEADS 56
#include "dit_checkpoint.inc"
}

/* ---- the GEMM and attention facts ---------------------------------------------------------- */

/* Rows [r0, r0 + m) of Y = X W^T computed alone equal those rows of the whole product, for every
   m above the few-rows shortcut, f32 and bf16 weights, 1 and 3 threads. */
static void test_gemm_rows(void)
{
    enum { M = 150, K = 300, N = 270 };
    float *X = malloc(sizeof(float) * M * K), *Wf = malloc(sizeof(float) * N * K), *bias = malloc(sizeof(float) * N);
    uint16_t *Wb = malloc(2 * N * K);
    float *Y = malloc(sizeof(float) * M * N), *Ys = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) X[i] = frand();
    for (int i = 0; i < N * K; i++) Wf[i] = frand() * 0.1f, Wb[i] = h3_f32_to_bf16(Wf[i]);
    for (int i = 0; i < N; i++) bias[i] = frand();
    const int64_t ms[] = {7, 8, 13, 21, 47, 48, 49, 96, 97, 143};
    const int64_t offs[] = {0, 1, 5, 6, 7, 17, 48};
    int bad = 0, runs = 0;
    for (int th = 1; th <= 3; th += 2) {
        h3_pool *p = h3_pool_create(th);
        for (int wt = 0; wt < 2; wt++) {
            h3_mat W = {wt ? (const void *)Wb : (const void *)Wf, wt ? H3_DT_BF16 : H3_DT_F32, N, K};
            CHECK(h3_linear(p, X, M, K, &W, bias, Y, N) == 0);
            for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
                for (size_t o = 0; o < sizeof offs / sizeof *offs; o++) {
                    const int64_t m = ms[a], r0 = offs[o];
                    if (r0 + m > M) continue;
                    CHECK(h3_linear(p, X + r0 * K, m, K, &W, bias, Ys, N) == 0);
                    bad += memcmp(Ys, Y + r0 * N, sizeof(float) * (size_t)(m * N)) != 0;
                    runs++;
                }
        }
        h3_pool_destroy(p);
    }
    CHECK_MSG(bad == 0 && runs > 100, "%d of %d row slices differ from the whole product", bad, runs);
    free(X), free(Wf), free(bias), free(Wb), free(Y), free(Ys);
}

/* Attention of heads [h0, h0 + hp) on their own (contiguous [L][hp*D] operands, as a rank holds them
   after the exchange) equals those heads of the attention over all of them. */
static void test_attention_heads(void)
{
    enum { L = 90, H = 8, D = 16 };
    h3_pool *p = h3_pool_create(2);
    float *Q = malloc(sizeof(float) * L * H * D), *K = malloc(sizeof(float) * L * H * D);
    float *V = malloc(sizeof(float) * L * H * D), *O = malloc(sizeof(float) * L * H * D);
    float *q = malloc(sizeof(float) * L * H * D), *k = malloc(sizeof(float) * L * H * D);
    float *v = malloc(sizeof(float) * L * H * D), *o = malloc(sizeof(float) * L * H * D);
    for (int i = 0; i < L * H * D; i++) Q[i] = frand(), K[i] = frand(), V[i] = frand();
    CHECK(h3_attention(p, Q, H * D, K, H * D, V, H * D, L, L, H, H, D, 0.25f, false, O, H * D) == 0);
    int bad = 0;
    for (int hp = 1; hp <= H; hp *= 2)
        for (int h0 = 0; h0 < H; h0 += hp) {
            const int w = hp * D;
            for (int r = 0; r < L; r++) {
                memcpy(q + r * w, Q + r * H * D + h0 * D, sizeof(float) * w);
                memcpy(k + r * w, K + r * H * D + h0 * D, sizeof(float) * w);
                memcpy(v + r * w, V + r * H * D + h0 * D, sizeof(float) * w);
            }
            CHECK(h3_attention(p, q, w, k, w, v, w, L, L, hp, hp, D, 0.25f, false, o, w) == 0);
            for (int r = 0; r < L; r++) bad += memcmp(o + r * w, O + r * H * D + h0 * D, sizeof(float) * w) != 0;
        }
    CHECK_MSG(bad == 0, "%d head-group rows differ", bad);
    free(Q), free(K), free(V), free(O), free(q), free(k), free(v), free(o);
    h3_pool_destroy(p);
}

/* ---- the loopback communicator -------------------------------------------------------------- */

enum { LB_WORLD = 5, LB_N = 37 };

typedef struct {
    h3_comm *c;
    int fail_at; /* abort instead of the second collective */
    int rc[4];
    int ok;
} lb_arg;

static void *lb_rank(void *a)
{
    lb_arg *x = a;
    h3_comm *c = x->c;
    const int me = c->rank, W = c->world;
    /* all-to-all: rank s sends rank g (s + 1) * 100 + g repeated (g + 1) times... as (s + g + 1) ints */
    int send[LB_WORLD][LB_WORLD + LB_WORLD], recv[LB_WORLD][LB_WORLD + LB_WORLD];
    h3_comm_piece pc[LB_WORLD] = {{0}};
    int n = 0;
    for (int g = 0; g < W; g++) {
        for (int i = 0; i < me + g + 1; i++) send[g][i] = me * 1000 + g * 10 + i;
        if (g != me)
            pc[n++] = (h3_comm_piece){g, send[g], sizeof(int) * (size_t)(me + g + 1), recv[g], sizeof(int) * (size_t)(g + me + 1)};
    }
    x->rc[0] = c->ops->exchange(c, pc, n);
    x->ok = 1;
    for (int g = 0; g < W; g++)
        for (int i = 0; g != me && i < me + g + 1; i++) x->ok &= recv[g][i] == g * 1000 + me * 10 + i;
    if (x->fail_at == 1) {
        c->ops->abort(c);
        x->rc[1] = -1;
        return NULL;
    }
    float gs[LB_N], gr[LB_WORLD * LB_N];
    for (int i = 0; i < LB_N; i++) gs[i] = (float)(me * LB_N + i);
    x->rc[1] = c->ops->all_gather(c, gs, gr, sizeof gs);
    for (int i = 0; !x->rc[1] && i < W * LB_N; i++) x->ok &= gr[i] == (float)i;
    char b[64];
    snprintf(b, sizeof b, me == 2 ? "from rank two" : "nothing");
    x->rc[2] = c->ops->broadcast(c, b, sizeof b, 2);
    if (!x->rc[2]) x->ok &= strcmp(b, "from rank two") == 0;
    x->rc[3] = c->ops->barrier(c);
    return NULL;
}

static void run_group(int fail_rank)
{
    h3_comm *cs[LB_WORLD];
    CHECK(h3_comm_loopback_create(LB_WORLD, cs) == 0);
    pthread_t th[LB_WORLD];
    lb_arg args[LB_WORLD];
    for (int r = 0; r < LB_WORLD; r++) {
        args[r] = (lb_arg){cs[r], r == fail_rank ? 1 : 0, {0}, 0};
        pthread_create(&th[r], NULL, lb_rank, &args[r]);
    }
    for (int r = 0; r < LB_WORLD; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < LB_WORLD; r++) {
        CHECK(args[r].rc[0] == 0 && args[r].ok);
        if (fail_rank < 0) {
            CHECK(args[r].rc[1] == 0 && args[r].rc[2] == 0 && args[r].rc[3] == 0);
            CHECK(cs[r]->stats.a2a_calls == 1 && cs[r]->stats.gather_bytes == sizeof(float) * LB_N * (LB_WORLD - 1));
        } else if (r != fail_rank) {
            /* every other rank returns from its next collective with an error: no hang */
            CHECK(args[r].rc[1] == -H3_E_IO && args[r].rc[2] == -H3_E_IO && args[r].rc[3] == -H3_E_IO);
        }
    }
    for (int r = 0; r < LB_WORLD; r++) h3_comm_destroy(cs[r]);
}

static void test_loopback(void)
{
    run_group(-1);
    run_group(3);
    h3_comm *cs[2];
    CHECK(h3_comm_loopback_create(0, cs) == -H3_E_INVALID && strstr(h3_last_error(), "0 ranks"));
    CHECK(h3_comm_loopback_create(H3_COMM_MAX_WORLD + 1, cs) == -H3_E_INVALID);
    /* a piece naming the caller itself or a rank outside the group is refused */
    CHECK(h3_comm_loopback_create(1, cs) == 0);
    int v = 1;
    const h3_comm_piece self = {0, &v, sizeof v, &v, sizeof v};
    CHECK(cs[0]->ops->exchange(cs[0], &self, 1) == -H3_E_INVALID && strstr(h3_last_error(), "names rank 0 of 1"));
    h3_comm_destroy(cs[0]);
}

/* ---- the transformer split over loopback ranks ----------------------------------------------- */

enum { LT = 5, LH = 8, LW = 12, LTA = 20, NTXT = 5, STEPS = 4 };
#define NV (VCH * LT * LH * LW)
#define NA (2 * ACH * LTA)

/* A whole denoise (STEPS grid points) through the public API at H3_LOOPBACK_RANKS = ranks (0: unset). */
static int denoise(const char *dir, int ranks, int threads, const float *pe, float *lat, float *aud, char *prof, size_t cap)
{
    char v[16];
    snprintf(v, sizeof v, "%d", ranks);
    if (ranks)
        setenv("H3_LOOPBACK_RANKS", v, 1);
    else
        unsetenv("H3_LOOPBACK_RANKS");
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    h3_ctx *ctx = h3_init(dir, &o);
    unsetenv("H3_LOOPBACK_RANKS");
    if (!ctx) return -100;
    h3_noise_fill(3, 0, 0, lat, NV);
    h3_noise_fill(3, 1, 0, aud, NA);
    int rc = h3_dit_denoise(ctx, pe, NTXT, NULL, LT, LH, LW, LTA, STEPS, lat, aud);
    const char *js = rc >= 0 ? h3_dit_profile_json(ctx) : NULL;
    if (prof) snprintf(prof, cap, "%s", js ? js : "");
    h3_free(ctx);
    return rc;
}

static void test_split(const char *dir)
{
    CHECK(write_checkpoint(dir, NULL, NULL) == 0);
    static float pe[NTXT * TXT], lat1[NV], aud1[NA], lat[NV], aud[NA];
    static char prof[1 << 16];
    for (int i = 0; i < NTXT * TXT; i++) pe[i] = frand();
    CHECK(denoise(dir, 0, 2, pe, lat1, aud1, prof, sizeof prof) == STEPS - 1);
    CHECK(strstr(prof, "\"sequence_parallel\": null") != NULL);
    double mag = 0;
    for (int i = 0; i < NV; i++) mag += fabs(lat1[i]);
    CHECK(isfinite(mag) && mag > 0);
    const int worlds[] = {1, 2, 4, 7, 8};
    for (size_t k = 0; k < sizeof worlds / sizeof *worlds; k++) {
        const int W = worlds[k];
        CHECK_MSG(denoise(dir, W, k % 2 ? 3 : 2, pe, lat, aud, prof, sizeof prof) == STEPS - 1, "world %d: %s", W,
                  h3_last_error());
        CHECK_MSG(memcmp(lat, lat1, sizeof lat) == 0 && memcmp(aud, aud1, sizeof aud) == 0,
                  "world %d: the denoised latents differ from one device's", W);
        char want[96];
        snprintf(want, sizeof want, "\"kind\": \"loopback\", \"world\": %d", W);
        /* world 1: the split path with one rank, its exchanges empty */
        CHECK_MSG(strstr(prof, want) != NULL, "world %d profile: %.300s", W, prof);
        if (W > 1) {
            snprintf(want, sizeof want, "\"name\": \"loopback rank %d of %d\"", W - 1, W);
            CHECK(strstr(prof, want) != NULL);
            /* STEPS - 1 forwards x LAYERS blocks x two all-to-alls, on every rank */
            snprintf(want, sizeof want, "\"all_to_all_calls\": %d,", (STEPS - 1) * LAYERS * 2);
            CHECK_MSG(strstr(prof, want) != NULL, "world %d profile: %.600s", W, prof);
        }
    }
    /* bad degrees: one line naming the ones that divide 56 heads; nothing denoised */
    memcpy(lat, lat1, sizeof lat);
    CHECK(denoise(dir, 3, 2, pe, lat, aud, NULL, 0) == -H3_E_INVALID);
    CHECK_MSG(strstr(h3_last_error(), "3 ranks do not divide the model's 56 attention heads (ranks that do: 1, 2, 4, 7, "
                                      "8, 14, 28, 56)") != NULL, "%s", h3_last_error());
    CHECK(denoise(dir, 65, 2, pe, lat, aud, NULL, 0) == -H3_E_INVALID && strstr(h3_last_error(), "H3_LOOPBACK_RANKS"));
    /* 56 ranks of a 165-row sequence: 3 rows each, under the GEMM's few-rows shortcut */
    CHECK(denoise(dir, 56, 2, pe, lat, aud, NULL, 0) == -H3_E_INVALID);
    CHECK_MSG(strstr(h3_last_error(), "over 56 ranks") && strstr(h3_last_error(), "at least 7"), "%s", h3_last_error());
}

int main(void)
{
    test_gemm_rows();
    test_attention_heads();
    test_loopback();
    char dir[] = "/tmp/h3_test_sp_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_split(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_sp: %d checks, %d failures\n", ctest_checks, ctest_failures);
    return ctest_failures != 0;
}
