/*
 * Transformer and sampler, C side (run under ASan/UBSan by `make test-asan`): sigma schedule,
 * noise, layout, patchify round trips, and forward/denoise on a tiny random checkpoint written
 * here (odd sizes everywhere) through the public API: finite outputs, identical results for 1 and
 * 3 threads, errors for bad input and bad checkpoints. Agreement with diffusers is tests/test_dit.py.
 */
#include "ctest.h"
#include "backend/cpu/ops.h" /* h3_attention: the CPU kernel this file checks */
#include "models/dit.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a tiny checkpoint ------------------------------------------------------------------ */

#include "dit_checkpoint.inc"
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_schedule(void)
{
    float sig[8], ts[8];
    /* 5 grid points = 4 evaluations; h3.c's "--steps 4" video grid 1, 36/37, 12/13, 0.8, 0. */
    CHECK(h3_sigma_schedule(5, 12.0, sig, ts) == 5);
    const double want[5] = {1.0, 36.0 / 37.0, 12.0 / 13.0, 0.8, 0.0};
    for (int i = 0; i < 5; i++) CHECK_MSG(fabs(sig[i] - want[i]) < 1e-6, "sigma %d = %.9g", i, sig[i]);
    for (int i = 0; i < 4; i++) CHECK(ts[i] == 1.0f - sig[i]);
    CHECK(h3_sigma_schedule(5, 3.0, sig, NULL) == 5 && fabs(sig[2] - 0.75) < 1e-6);
    CHECK(h3_sigma_schedule(1, 12.0, sig, ts) == -H3_E_INVALID);
    CHECK(h3_sigma_schedule(10, 0.0, sig, ts) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "shift") != NULL);
    /* Euler: t = 1 - sigma, so x0 = x + sigma v, and x -> (1 - ratio) x0 + ratio x. */
    float x[3] = {1, -2, 0.5f}, v[3] = {0.5f, 1, -1};
    h3_sched_euler(x, v, 3, 0.25f, 0.75f, 0.5f);
    CHECK(fabsf(x[0] - (1 + 0.25f * 0.5f)) < 1e-6f && fabsf(x[1] - (-2 + 0.25f)) < 1e-6f);
}

static void test_noise(void)
{
    enum { N = 100000 };
    float *a = malloc(sizeof(float) * N), b[16];
    CHECK(h3_noise_fill(42, 0, 0, a, N) == 0);
    CHECK(h3_noise_fill(42, 0, 777, b, 16) == 0);
    CHECK(memcmp(a + 777, b, sizeof b) == 0);
    double m = 0, v = 0;
    for (int i = 0; i < N; i++) m += a[i];
    m /= N;
    for (int i = 0; i < N; i++) v += (a[i] - m) * (a[i] - m);
    v /= N;
    CHECK_MSG(fabs(m) < 0.02 && fabs(v - 1) < 0.02, "mean %g var %g", m, v);
    CHECK(h3_noise_fill(42, 1, 777, b, 16) == 0 && memcmp(a + 777, b, sizeof b) != 0);
    free(a);
}

static void test_layout_and_patchify(void)
{
    h3_dit_cfg c = {0};
    c.video_ch = VCH;
    c.patch[0] = 1;
    c.patch[1] = c.patch[2] = 2;
    h3_dit_layout l;
    int an[2] = {H3_ANCHOR_FIRST, H3_ANCHOR_LAST};
    CHECK(h3_dit_layout_t2va(&c, 5, NULL, 3, 4, 6, 7, an, 2, &l) == 0);
    CHECK(l.seq == 5 + 2 * 6 + 14 + 3 * 6 && l.n_video == 2 * 6 + 18 && l.n_audio == 14 && l.n_cond_video == 12);
    uint8_t *seen = calloc((size_t)l.seq, 1);
    for (int64_t i = 0; i < l.n_text; i++) seen[l.text_idx[i]]++;
    for (int64_t i = 0; i < l.n_video; i++) seen[l.video_idx[i]]++;
    for (int64_t i = 0; i < l.n_audio; i++) seen[l.audio_idx[i]]++;
    int ok = 1;
    for (int64_t r = 0; r < l.seq; r++) ok &= seen[r] == 1;
    CHECK(ok);
    free(seen);
    /* audio: t = text length + j, left side on the first width coordinate, right on the last */
    const double *ap = l.pos + l.audio_idx[0] * 3, *ap2 = l.pos + l.audio_idx[7] * 3;
    CHECK(ap[0] == 5.0 && ap[1] == 0.0 && ap2[0] == 5.0 && ap2[2] > ap[2]);
    /* generated frame 1 sits 5/3 after frame 0; frame 2 another 20/3 */
    const double *f0 = l.pos + l.video_idx[12] * 3, *f1 = l.pos + l.video_idx[18] * 3, *f2 = l.pos + l.video_idx[24] * 3;
    CHECK(fabs(f1[0] - f0[0] - 5.0 / 3.0) < 1e-12 && fabs(f2[0] - f1[0] - 20.0 / 3.0) < 1e-12);
    CHECK(l.role[l.video_idx[0]] == H3_ROLE_COND_VIDEO && l.role[l.video_idx[12]] == H3_ROLE_VIDEO);
    h3_dit_layout_free(&l);
    CHECK(h3_dit_layout_t2va(&c, 5, NULL, 3, 5, 6, 7, NULL, 0, &l) == -H3_E_INVALID);

    const int T = 3, H = 4, W = 6, Ta = 7;
    float lat[VCH * 3 * 4 * 6], rows[VCH * 3 * 4 * 6], back[VCH * 3 * 4 * 6];
    for (int i = 0; i < VCH * T * H * W; i++) lat[i] = (float)i;
    h3_dit_patchify_video(&c, lat, T, H, W, rows);
    CHECK(rows[0] == lat[0] && rows[1] == lat[1] && rows[2] == lat[W] && rows[4] == lat[T * H * W]);
    h3_dit_unpatchify_video(&c, rows, T, H, W, back);
    CHECK(memcmp(lat, back, sizeof lat) == 0);
    float a[2 * ACH * 7], ar[2 * ACH * 7], ab[2 * ACH * 7];
    for (int i = 0; i < 2 * ACH * Ta; i++) a[i] = (float)i;
    h3_dit_pack_audio(ACH, Ta, a, ar);
    CHECK(ar[1] == a[Ta] && ar[ACH * Ta] == a[ACH * Ta]);
    h3_dit_unpack_audio(ACH, Ta, ar, ab);
    CHECK(memcmp(a, ab, sizeof a) == 0);
}

typedef struct {
    int64_t seq, nv, na;
    double pos[512 * 3];
    int64_t tags[512], tix[8], vix[256], aix[64], tsi[512];
    float hs[256 * PD], ahs[64 * ACH], ehs[8 * TXT], ts[2];
} fwd_in;

static int run_forward(const char *dir, int threads, const fwd_in *in, float *out, float *aout)
{
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    h3_ctx *ctx = h3_init(dir, &o);
    if (!ctx) return -100;
    int rc = h3_dit_forward(ctx, in->hs, in->nv, in->ahs, in->na, in->ehs, 5, in->ts, 2, in->tsi, in->tags, in->pos,
                            in->seq, in->vix, in->aix, in->tix, out, aout);
    h3_free(ctx);
    return rc;
}

static void test_model(const char *dir)
{
    CHECK(write_checkpoint(dir, NULL, NULL) == 0);
    h3_ctx *ctx = h3_init(dir, NULL);
    CHECK(ctx != NULL);
    if (!ctx) return;
    static fwd_in in;
    in.seq = h3_dit_packed_layout(ctx, 5, NULL, 3, 4, 6, 7, NULL, 0, in.pos, in.tags, in.tix, in.vix, in.aix);
    CHECK(in.seq == 5 + 14 + 18);
    in.nv = 18;
    in.na = 14;
    for (int64_t r = 0; r < in.seq; r++) in.tsi[r] = in.tags[r] == H3_TAG_AUDIO;
    in.ts[0] = 0.3f;
    in.ts[1] = 0.8f;
    for (int i = 0; i < 18 * PD; i++) in.hs[i] = frand();
    for (int i = 0; i < 14 * ACH; i++) in.ahs[i] = frand();
    for (int i = 0; i < 5 * TXT; i++) in.ehs[i] = frand();
    h3_free(ctx);

    static float o1[256 * PD], a1[64 * ACH], o3[256 * PD], a3[64 * ACH];
    CHECK(run_forward(dir, 1, &in, o1, a1) == 0);
    CHECK(run_forward(dir, 3, &in, o3, a3) == 0);
    CHECK(memcmp(o1, o3, sizeof(float) * 18 * PD) == 0 && memcmp(a1, a3, sizeof(float) * 14 * ACH) == 0);
    int finite = 1;
    double mag = 0;
    for (int i = 0; i < 18 * PD; i++) finite &= isfinite(o1[i]), mag += fabs(o1[i]);
    CHECK(finite && mag > 0);

    /* bad inputs: an index out of range, a row addressed twice, a timestep index out of range */
    static fwd_in bad;
    bad = in;
    bad.vix[3] = in.seq;
    CHECK(run_forward(dir, 2, &bad, o3, a3) == -H3_E_INVALID && strstr(h3_last_error(), "video_indices[3]"));
    bad = in;
    bad.aix[0] = bad.vix[0];
    CHECK(run_forward(dir, 2, &bad, o3, a3) == -H3_E_INVALID && strstr(h3_last_error(), "twice"));
    bad = in;
    bad.tsi[4] = 2;
    CHECK(run_forward(dir, 2, &bad, o3, a3) == -H3_E_INVALID && strstr(h3_last_error(), "timestep_indices[4]"));
    bad = in;
    bad.tags[0] = 7;
    CHECK(run_forward(dir, 2, &bad, o3, a3) == -H3_E_INVALID && strstr(h3_last_error(), "token_tags[0]"));

    /* denoise: deterministic across thread counts; the slow per-step modulation agrees */
    float pe[5 * TXT], lat[2][VCH * 3 * 4 * 6], aud[2][2 * ACH * 7];
    for (int i = 0; i < 5 * TXT; i++) pe[i] = frand();
    for (int k = 0; k < 3; k++) {
        h3_options o;
        h3_options_default(&o);
        o.threads = k == 0 ? 1 : 3;
        if (k == 2) setenv("H3_DIT_PRECOMPUTE", "0", 1);
        ctx = h3_init(dir, &o);
        float *L = lat[k ? 1 : 0], *A = aud[k ? 1 : 0];
        static float L2[VCH * 3 * 4 * 6], A2[2 * ACH * 7];
        if (k == 2) L = L2, A = A2;
        h3_noise_fill(3, 0, 0, L, VCH * 3 * 4 * 6);
        h3_noise_fill(3, 1, 0, A, 2 * ACH * 7);
        CHECK(h3_dit_denoise(ctx, pe, 5, NULL, 3, 4, 6, 7, 6, L, A) == 5);
        const char *js = h3_dit_profile_json(ctx);
        CHECK(js && strstr(js, k == 2 ? "\"adaln_released\": false" : "\"adaln_released\": true"));
        h3_free(ctx);
        if (k == 1) CHECK(memcmp(lat[0], lat[1], sizeof lat[0]) == 0 && memcmp(aud[0], aud[1], sizeof aud[0]) == 0);
        if (k == 2) {
            unsetenv("H3_DIT_PRECOMPUTE");
            double num = 0, den = 0;
            for (int i = 0; i < VCH * 3 * 4 * 6; i++) num += (L[i] - lat[0][i]) * (L[i] - lat[0][i]), den += L[i] * L[i];
            CHECK_MSG(sqrt(num / den) < 1e-5, "per-step modulation differs by %g", sqrt(num / den));
        }
    }
    ctx = h3_init(dir, NULL);
    CHECK(h3_dit_denoise(ctx, pe, 5, NULL, 3, 4, 6, 7, 1, lat[0], aud[0]) == -H3_E_INVALID);
    h3_free(ctx);

    /* The internal API the context builds on, with FL2VA keyframe rows: they ride through every
       step unchanged while the generated rows move; stepping past the end is an error. */
    h3_model m;
    h3_pool *pool = h3_pool_create(2);
    CHECK(h3_model_open(&m, dir, 0) == 0);
    h3_dit *d = NULL;
    h3_backend *be = NULL;
    CHECK(h3_backend_cpu_create(pool, &be) == 0);
    CHECK(h3_dit_open(&m, pool, be, 0, &d) == 0);
    if (d) {
        h3_dit_layout l;
        int an[2] = {H3_ANCHOR_FIRST, H3_ANCHOR_LAST};
        uint8_t tt[5] = {1, 0, 0, 1, 1};
        CHECK(h3_dit_layout_t2va(h3_dit_config(d), 5, tt, 3, 4, 6, 7, an, 2, &l) == 0);
        CHECK(h3_dit_set_text(d, pe, 5) == -H3_E_INVALID); /* no layout yet */
        CHECK(h3_dit_set_layout(d, &l) == 0 && h3_dit_set_text(d, pe, 5) == 0);
        CHECK(h3_dit_prepare_schedule(d, 4, 12.0, 3.0, true) == 3 && h3_dit_num_steps(d) == 3);
        CHECK(h3_dit_sigmas(d, 0)[0] == 1.0f && h3_dit_sigmas(d, 1)[3] == 0.0f);
        static float vr[64 * PD], vr0[64 * PD], ar[14 * ACH];
        h3_noise_fill(5, 0, 0, vr, l.n_video * PD);
        h3_noise_fill(5, 1, 0, ar, l.n_audio * ACH);
        memcpy(vr0, vr, sizeof(float) * (size_t)(l.n_video * PD));
        int left = 0;
        for (int i = 0; i < 3; i++) CHECK((left = h3_dit_step(d, i, vr, ar)) == 2 - i);
        CHECK(memcmp(vr, vr0, sizeof(float) * (size_t)(l.n_cond_video * PD)) == 0);
        CHECK(memcmp(vr + l.n_cond_video * PD, vr0 + l.n_cond_video * PD, sizeof(float) * PD) != 0);
        CHECK(h3_dit_step(d, 3, vr, ar) == -H3_E_INVALID);
        uint64_t wb, tb;
        bool rel;
        h3_dit_adaln_bytes(d, &wb, &tb, &rel);
        /* 3 steps x (4 (t, modality) pairs: video, vision span at video t, audio, keyframes) x 6 slots
           x layers + 3 final rows (video t, audio t, keyframe t) x 2 slots */
        CHECK(rel && wb == (uint64_t)LAYERS * (18 * HID * TED + 18 * HID) * 2 + (2 * HID * TED + 2 * HID) * 2);
        CHECK_MSG(tb == 3ull * (4 * 6 * HID * LAYERS + 3 * 2 * HID) * 4, "table bytes %llu", (unsigned long long)tb);
        h3_dit_layout_free(&l);
        h3_dit_close(d);
    }
    h3_backend_destroy(be);
    h3_model_close(&m);
    h3_pool_destroy(pool);

    /* checkpoints: a missing tensor and a wrong shape fail with the tensor's name */
    char d2[600];
    snprintf(d2, sizeof d2, "%s/missing", dir);
    CHECK(write_checkpoint(d2, "blocks.1.attn.k_norm.weight", NULL) == 0);
    CHECK(run_forward(d2, 1, &in, o3, a3) == -H3_E_SCHEMA && strstr(h3_last_error(), "blocks.1.attn.k_norm.weight"));
    snprintf(d2, sizeof d2, "%s/shape", dir);
    CHECK(write_checkpoint(d2, NULL, "blocks.0.mlp.fc2.weight") == 0);
    CHECK(run_forward(d2, 1, &in, o3, a3) == -H3_E_SCHEMA && strstr(h3_last_error(), "blocks.0.mlp.fc2.weight"));
}

/* h3_attention packs K/V for a group of heads at a time: one head per group gives the same bits. */
static void attention_groups(int64_t L, int64_t Lq, int H, int KVH, int D)
{
    h3_pool *p = h3_pool_create(2);
    float *Q = malloc(sizeof(float) * Lq * H * D), *Kx = malloc(sizeof(float) * L * KVH * D);
    float *V = malloc(sizeof(float) * L * KVH * D), *O1 = malloc(sizeof(float) * Lq * H * D);
    float *O2 = malloc(sizeof(float) * Lq * H * D);
    for (int64_t i = 0; i < Lq * H * D; i++) Q[i] = frand();
    for (int64_t i = 0; i < L * KVH * D; i++) Kx[i] = frand(), V[i] = frand();
    for (int causal = 0; causal < 2; causal++) {
        h3_attention_pack_budget(0);
        CHECK(h3_attention(p, Q, H * D, Kx, KVH * D, V, KVH * D, Lq, L, H, KVH, D, 0.2f, causal, O1, H * D) == 0);
        h3_attention_pack_budget(1);
        CHECK(h3_attention(p, Q, H * D, Kx, KVH * D, V, KVH * D, Lq, L, H, KVH, D, 0.2f, causal, O2, H * D) == 0);
        CHECK(memcmp(O1, O2, sizeof(float) * Lq * H * D) == 0);
    }
    /* against a double-precision reference (causal, the last result) */
    double num = 0, den = 0;
    double *sc = malloc(sizeof(double) * (size_t)L);
    for (int h = 0; h < H; h++) {
        const int kvh = h / (H / KVH);
        for (int64_t i = 0; i < Lq; i++) {
            const int64_t lim = i + (L - Lq) + 1 < L ? i + (L - Lq) + 1 : L;
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < lim; j++) {
                double dd = 0;
                for (int c = 0; c < D; c++) dd += (double)Q[(i * H + h) * D + c] * Kx[(j * KVH + kvh) * D + c];
                sc[j] = dd * 0.2;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int64_t j = 0; j < lim; j++) sum += (sc[j] = exp(sc[j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int64_t j = 0; j < lim; j++) o += sc[j] * V[(j * KVH + kvh) * D + c];
                o /= sum;
                double dlt = O2[(i * H + h) * D + c] - o;
                num += dlt * dlt;
                den += o * o;
            }
        }
    }
    CHECK_MSG(sqrt(num / den) < 2e-6, "attention L=%lld Lq=%lld H=%d/%d D=%d rel-L2 %g", (long long)L, (long long)Lq, H,
              KVH, D, sqrt(num / den));
    free(sc);
    h3_attention_pack_budget(0);
    free(Q), free(Kx), free(V), free(O1), free(O2);
    h3_pool_destroy(p);
}

static void test_attention_head_groups(void)
{
    attention_groups(150, 70, 6, 3, 24);
    /* head dims that are not multiples of 8, single rows, blocks of one key */
    attention_groups(1, 1, 5, 5, 14);
    attention_groups(61, 61, 2, 1, 9);
    attention_groups(130, 7, 3, 3, 30);
    attention_groups(7, 7, 4, 2, 1);
}

int main(void)
{
    test_attention_head_groups();
    test_schedule();
    test_noise();
    test_layout_and_patchify();
    char dir[] = "/tmp/h3_test_dit_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_model(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    CTEST_END();
}
