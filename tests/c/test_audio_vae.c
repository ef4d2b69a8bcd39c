/*
 * Audio VAE decoder vs a naive double-precision reference written straight from diffusers'
 * definitions (channel-major, explicit padding, no phase tricks), on a tiny model this test
 * writes in the official layout. Also: the kernels one by one, both ISA variants, tiling and
 * thread-count invariance, progress/cancel, and schema errors. Runs under ASan+UBSan too.
 */
#include "models/audio_vae.h"
#include "backend/cpu/avae_kern.h"
#include "ctest.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int64_t clampl(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* ---- reference ops (channel-major [C][L], double) ---------------------------------------- */

/* torch Conv1d: y[o][t] = b[o] + sum_i,j w[o][i][j] x[i][t - pad + j dil], zero padding. */
static double *ref_conv(const double *x, int cin, int64_t L, const double *w, const double *b, int cout, int k,
                        int dil, int pad, int64_t *lout)
{
    int64_t Lo = L + 2 * pad - (int64_t)dil * (k - 1);
    double *y = calloc((size_t)(cout * Lo), sizeof(double));
    for (int o = 0; o < cout; o++)
        for (int64_t t = 0; t < Lo; t++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < cin; i++)
                for (int j = 0; j < k; j++) {
                    int64_t src = t - pad + (int64_t)j * dil;
                    if (src >= 0 && src < L) s += w[((int64_t)o * cin + i) * k + j] * x[i * L + src];
                }
            y[o * Lo + t] = s;
        }
    *lout = Lo;
    return y;
}

/* torch ConvTranspose1d, weight [cin][cout][k], padding p: full output cropped by p each side. */
static double *ref_tconv(const double *x, int cin, int64_t L, const double *w, const double *b, int cout, int k,
                         int u, int64_t *lout)
{
    int p = (k - u) / 2;
    int64_t full = (L - 1) * u + k, Lo = full - 2 * p;
    double *f = calloc((size_t)(cout * full), sizeof(double)), *y = malloc(sizeof(double) * cout * Lo);
    for (int i = 0; i < cin; i++)
        for (int64_t s = 0; s < L; s++)
            for (int o = 0; o < cout; o++)
                for (int j = 0; j < k; j++) f[o * full + s * u + j] += x[i * L + s] * w[((int64_t)i * cout + o) * k + j];
    for (int o = 0; o < cout; o++)
        for (int64_t t = 0; t < Lo; t++) y[o * Lo + t] = b[o] + f[o * full + t + p];
    free(f);
    *lout = Lo;
    return y;
}

/* MiniMaxH3AudioActivation1d with SnakeBeta (log-scale alpha/beta), literally. */
static void ref_act(const double *x, int C, int64_t L, const float *alpha, const float *beta, const float *fup,
                    const float *fdn, double *y)
{
    const int K = 12, pad = K / 2 - 1, crop = pad * 2 + (K - 2) / 2;
    int64_t lp = L + 2 * pad, full = (lp - 1) * 2 + K;
    double *xp = malloc(sizeof(double) * lp), *f = malloc(sizeof(double) * full), *z = malloc(sizeof(double) * 2 * L);
    double *zp = malloc(sizeof(double) * (2 * L + K - 1));
    for (int c = 0; c < C; c++) {
        for (int64_t s = 0; s < lp; s++) xp[s] = x[c * L + clampl(s - pad, 0, L - 1)];
        for (int64_t t = 0; t < full; t++) f[t] = 0;
        for (int64_t s = 0; s < lp; s++)
            for (int k = 0; k < K; k++) f[2 * s + k] += xp[s] * fup[k];
        double a = exp((double)alpha[c]), rb = 1.0 / (exp((double)beta[c]) + 1e-9);
        for (int64_t n = 0; n < 2 * L; n++) {
            double u = 2 * f[n + crop], sn = sin(a * u);
            z[n] = u + rb * sn * sn;
        }
        int left = K / 2 - 1; /* LowPassFilter1d pad_left for even K; pad_right = K / 2 */
        for (int64_t s = 0; s < 2 * L + K - 1; s++) zp[s] = z[clampl(s - left, 0, 2 * L - 1)];
        for (int64_t m = 0; m < L; m++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += fdn[k] * zp[2 * m + k];
            y[c * L + m] = s;
        }
    }
    free(xp), free(f), free(z), free(zp);
}

/* ---- kernels ------------------------------------------------------------------------------ */

static const h3_avae_kernels *variants[2];
static int nvariants;
static double worst_act, worst_dec; /* printed at the end */

static void test_sin2(void)
{
    enum { N = 20011 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *y2 = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = (float)((i - N / 2) * (6000.0 / (N / 2))) + frand() * 0.3f;
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-30f, x[3] = 7000.0f, x[4] = -123456.0f, x[5] = NAN, x[6] = INFINITY;
    x[7] = 3.14159265f, x[8] = 1.5707964f, x[9] = 6000.0f, x[10] = 1e-4f;
    for (int v = 0; v < nvariants; v++) {
        variants[v]->sin2(x, v ? y2 : y, N);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            if (!isfinite(x[i])) {
                CHECK_MSG(isnan((v ? y2 : y)[i]), "sin2(%g) should be NaN", x[i]);
                continue;
            }
            double s = sin((double)x[i]), e = fabs((v ? y2 : y)[i] - s * s);
            if (e > worst) worst = e;
        }
        CHECK_MSG(worst < 2.5e-7, "%s sin2 max abs error %g", variants[v]->name, worst);
    }
    if (nvariants == 2)
        for (int i = 0; i < N; i++)
            if (memcmp(&y[i], &y2[i], 4) != 0) {
                CHECK_MSG(0, "sin2 variants differ at x=%g", x[i]);
                break;
            }
    free(x), free(y), free(y2);
}

typedef struct {
    float alpha[64], beta[64], a[64], rb[64], ta[64], trb[64], fup[12], fdn[12];
    int tperiod;
} act_params;

static void make_act(act_params *p, int C)
{
    for (int c = 0; c < C; c++) p->alpha[c] = 0.3f * frand(), p->beta[c] = 0.3f * frand();
    for (int k = 0; k < 12; k++) p->fup[k] = 0.2f * frand() + (k == 5 || k == 6 ? 0.4f : 0.0f);
    for (int k = 0; k < 12; k++) p->fdn[k] = 0.2f * frand() + (k == 5 || k == 6 ? 0.4f : 0.0f);
    for (int c = 0; c < C; c++) {
        p->a[c] = expf(p->alpha[c]);
        p->rb[c] = 1.0f / (expf(p->beta[c]) + 1e-9f);
    }
    int R = C % 8;
    p->tperiod = 8;
    while (R && p->tperiod % R) p->tperiod += 8;
    for (int i = 0; i < p->tperiod; i++) {
        p->ta[i] = R ? p->a[C - R + i % R] : 0.0f;
        p->trb[i] = R ? p->rb[C - R + i % R] : 0.0f;
    }
}

static void test_act(int C, int64_t L, int d, int margin)
{
    act_params p;
    make_act(&p, C);
    float *x = malloc(sizeof(float) * L * C);
    double *xd = malloc(sizeof(double) * L * C), *ref = malloc(sizeof(double) * L * C);
    for (int64_t i = 0; i < L * C; i++) x[i] = 1.5f * frand();
    for (int64_t t = 0; t < L; t++)
        for (int c = 0; c < C; c++) xd[c * L + t] = x[t * C + c];
    ref_act(xd, C, L, p.alpha, p.beta, p.fup, p.fdn, ref);
    int64_t phase_rows = (L + d - 1) / d + 2 * margin, n = d * phase_rows * C;
    float *out[3], *z = aligned_alloc(64, sizeof(float) * (size_t)(2 * L + 16) * 16);
    for (int v = 0; v < 3; v++) {
        out[v] = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) out[v][i] = -7.0f; /* untouched cells stay -7 */
    }
    for (int v = 0; v < nvariants; v++) {
        h3_avae_act a = {x, L, C, p.a, p.rb, p.ta, p.trb, p.tperiod, p.fup, p.fdn, {out[v], d, phase_rows, margin}};
        variants[v]->act_rows(&a, 0, L, z);
    }
    /* The same rows in tiles of 1 and 3 must give identical bytes. */
    h3_avae_act a = {x, L, C, p.a, p.rb, p.ta, p.trb, p.tperiod, p.fup, p.fdn, {out[2], d, phase_rows, margin}};
    for (int64_t m = 0; m < L; m += (m % 2 ? 3 : 1)) {
        int64_t e = m + (m % 2 ? 3 : 1);
        variants[0]->act_rows(&a, m, e < L ? e : L, z);
    }
    float *got = malloc(sizeof(float) * L * C);
    int misplaced = 0;
    for (int64_t t = 0; t < L; t++)
        for (int c = 0; c < C; c++) got[c * L + t] = out[0][((t % d) * phase_rows + margin + t / d) * C + c];
    for (int r = 0; r < d; r++)
        for (int64_t row = 0; row < phase_rows; row++) {
            int64_t tt = (row - margin) * d + r;
            bool data = row >= margin && tt < L && tt >= 0 && (row - margin) < (L - r + d - 1) / d;
            for (int c = 0; c < C; c++) misplaced += !data && out[0][(r * phase_rows + row) * C + c] != -7.0f;
        }
    double e = rel_l2(got, ref, L * C);
    worst_act = e > worst_act ? e : worst_act;
    if (getenv("H3_TEST_VERBOSE")) printf("act C=%d L=%lld d=%d: %g\n", C, (long long)L, d, e);
    CHECK_MSG(e < 2e-6, "act C=%d L=%lld rel-L2 %g", C, (long long)L, e);
    CHECK_MSG(misplaced == 0, "act C=%d L=%lld d=%d wrote %d cells outside its rows", C, (long long)L, d, misplaced);
    CHECK_MSG(memcmp(out[0], out[2], sizeof(float) * n) == 0, "act C=%d L=%lld depends on the tiling", C, (long long)L);
    if (nvariants == 2)
        CHECK_MSG(memcmp(out[0], out[1], sizeof(float) * n) == 0, "act C=%d L=%lld: variants differ", C, (long long)L);
    free(x), free(xd), free(ref), free(z), free(got);
    for (int v = 0; v < 3; v++) free(out[v]);
}

/* The backend's convolution GEMM (overlapping rows) vs double; 1 and 3 threads give the same bits,
   and so does a shorter run of the same rows (no few-rows shortcut sums them differently). */
static h3_pool *g_pool1, *g_pool3;

static void test_gemm(int64_t M, int N, int64_t K, int64_t ldx, bool bias)
{
    int64_t nx = (M - 1) * ldx + K;
    float *X = malloc(sizeof(float) * nx), *b = malloc(sizeof(float) * N), *Wf = malloc(sizeof(float) * N * K);
    for (int64_t i = 0; i < nx; i++) X[i] = frand();
    for (int n = 0; n < N; n++) b[n] = frand();
    for (int64_t i = 0; i < N * K; i++) Wf[i] = frand();
    int64_t ldy = N + 3;
    float *Y[3];
    for (int v = 0; v < 3; v++) {
        Y[v] = malloc(sizeof(float) * M * ldy);
        for (int64_t i = 0; i < M * ldy; i++) Y[v][i] = -7.0f;
    }
    h3_backend *be[2];
    CHECK(h3_backend_cpu_create(g_pool1, &be[0]) == 0 && h3_backend_cpu_create(g_pool3, &be[1]) == 0);
    for (int v = 0; v < 2; v++) {
        h3_bw w;
        CHECK(be[v]->weights->weight_load(be[v], Wf, H3_DT_F32, N, K, &w) == 0);
        h3_bt x = h3_bt_make(X, H3_DT_F32, M, K, ldx), y = h3_bt_make(Y[v], H3_DT_F32, M, N, ldy);
        CHECK(be[v]->ops->conv_gemm(be[v], &x, &w, bias ? b : NULL, &y) == 0);
        if (v == 0) { /* the first rows on their own: 1, then 5 */
            for (int64_t m0 = 0, step = 1; m0 < M; m0 += step, step = step == 1 ? 5 : 1) {
                int64_t rows = m0 + step < M ? step : M - m0;
                h3_bt xs = h3_bt_make(X + m0 * ldx, H3_DT_F32, rows, K, ldx),
                      ys = h3_bt_make(Y[2] + m0 * ldy, H3_DT_F32, rows, N, ldy);
                CHECK(be[v]->ops->conv_gemm(be[v], &xs, &w, bias ? b : NULL, &ys) == 0);
            }
        }
        be[v]->weights->weight_free(be[v], &w);
        h3_backend_destroy(be[v]);
    }
    double num = 0, den = 0;
    int stray = 0;
    for (int64_t m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double r = bias ? b[n] : 0;
            for (int64_t k = 0; k < K; k++) r += (double)X[m * ldx + k] * Wf[n * K + k];
            num += (Y[0][m * ldy + n] - r) * (Y[0][m * ldy + n] - r);
            den += r * r;
        }
        for (int64_t c = N; c < ldy; c++) stray += Y[0][m * ldy + c] != -7.0f || Y[2][m * ldy + c] != -7.0f;
    }
    CHECK_MSG(sqrt(num / den) < 1e-6, "gemm M=%lld N=%d K=%lld: rel-L2 %g", (long long)M, N, (long long)K,
              sqrt(num / den));
    CHECK_MSG(stray == 0, "gemm M=%lld N=%d K=%lld wrote past its columns", (long long)M, N, (long long)K);
    CHECK_MSG(memcmp(Y[0], Y[1], sizeof(float) * M * ldy) == 0, "gemm M=%lld N=%d K=%lld depends on the threads",
              (long long)M, N, (long long)K);
    CHECK_MSG(memcmp(Y[0], Y[2], sizeof(float) * M * ldy) == 0, "gemm M=%lld N=%d K=%lld depends on the rows run",
              (long long)M, N, (long long)K);
    free(X), free(b), free(Wf);
    for (int v = 0; v < 3; v++) free(Y[v]);
}

/* ---- a tiny model in the official layout ------------------------------------------------- */

#define LC 4    /* latent channels */
#define LD 8    /* latent_dim */
#define D0 24   /* decoder_dim: stage channels 12 and 6 exercise vector tails */
#define NUP 2
#define NRES 2
#define NDIL 2
static const int k_rates[NUP] = {3, 2}, k_kernels[NUP] = {5, 4}, k_rk[NRES] = {3, 5};
static const int k_dil[NRES][NDIL] = {{1, 2}, {1, 3}};

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    float *data;
} tensor;

typedef struct {
    tensor t[256];
    int n;
    float mean[LC], std[LC];
} model;

static float *add(model *m, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, float scale, float bias)
{
    tensor *t = &m->t[m->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    t->data = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) t->data[i] = bias + scale * frand();
    return t->data;
}

static const tensor *find(const model *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->t[i].name, name) == 0) return &m->t[i];
    fprintf(stderr, "test model lacks %s\n", name);
    abort();
}

static void add_wn(model *m, const char *base, int64_t d0, int64_t d1, int64_t k, bool bias)
{
    char n[96];
    snprintf(n, sizeof n, "%s.weight_v", base);
    add(m, n, 3, d0, d1, k, 1.0f, 0.0f);
    snprintf(n, sizeof n, "%s.weight_g", base);
    add(m, n, 3, d0, 1, 1, 0.35f, 0.65f);
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", base);
        add(m, n, 1, d0, 0, 0, 0.05f, 0.0f);
    }
}

static void add_act(model *m, const char *base, int C)
{
    char n[128];
    snprintf(n, sizeof n, "%s.act.alpha", base);
    add(m, n, 1, C, 0, 0, 0.2f, 0.0f);
    snprintf(n, sizeof n, "%s.act.beta", base);
    add(m, n, 1, C, 0, 0, 0.2f, 0.0f);
    /* Random, different filters per activation: the decoder must read each one's own. */
    snprintf(n, sizeof n, "%s.upsample.filter", base);
    float *f = add(m, n, 3, 1, 1, 12, 0.1f, 0.0f);
    f[5] += 0.45f, f[6] += 0.45f;
    snprintf(n, sizeof n, "%s.downsample.lowpass.filter", base);
    f = add(m, n, 3, 1, 1, 12, 0.1f, 0.0f);
    f[5] += 0.45f, f[6] += 0.45f;
}

static void build_model(model *m)
{
    memset(m, 0, sizeof *m);
    char b[96];
    for (int c = 0; c < LC; c++) m->mean[c] = 0.1f * frand(), m->std[c] = 0.75f + 0.25f * frand();
    add(m, "dec_in_proj.weight", 3, LD, LC, 1, 0.5f, 0.0f);
    add(m, "dec_in_proj.bias", 1, LD, 0, 0, 0.05f, 0.0f);
    add_wn(m, "decoder.conv_pre", D0, LD, 7, false);
    add(m, "decoder.conv_pre.bias", 1, D0, 0, 0, 0.05f, 0.0f);
    for (int i = 0; i < NUP; i++) {
        snprintf(b, sizeof b, "decoder.ups.%d.0", i);
        add_wn(m, b, D0 >> i, D0 >> (i + 1), k_kernels[i], false);
        snprintf(b, sizeof b, "decoder.ups.%d.0.bias", i);
        add(m, b, 1, D0 >> (i + 1), 0, 0, 0.05f, 0.0f);
        int ch = D0 >> (i + 1);
        for (int j = 0; j < NRES; j++) {
            int g = i * NRES + j;
            for (int e = 0; e < NDIL; e++) {
                snprintf(b, sizeof b, "decoder.resblocks.%d.convs1.%d", g, e);
                add_wn(m, b, ch, ch, k_rk[j], true);
                snprintf(b, sizeof b, "decoder.resblocks.%d.convs2.%d", g, e);
                add_wn(m, b, ch, ch, k_rk[j], true);
            }
            for (int a = 0; a < 2 * NDIL; a++) {
                snprintf(b, sizeof b, "decoder.resblocks.%d.activations.%d", g, a);
                add_act(m, b, ch);
            }
        }
    }
    add_act(m, "decoder.activation_post", D0 >> NUP);
    add_wn(m, "decoder.conv_post", 1, D0 >> NUP, 7, false);
}

static void free_model(model *m)
{
    for (int i = 0; i < m->n; i++) free(m->t[i].data);
}

/* Write the model; `skip` names a tensor to leave out, `bad_g` one whose shape gets an extra 2. */
static void write_model(const model *m, const char *root, const char *skip, const char *bad_g)
{
    char p[512];
    snprintf(p, sizeof p, "%s/FL2VA", root);
    mkdir(root, 0755), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/audio_vae", root);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/audio_vae/config.json", root);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"_class_name\": \"MiniMaxH3AudioVAE\", \"output_channel\": 2, \"sample_rate\": 24000, "
               "\"source_safetensors_path\": \"model.safetensors\", \"source_metadata_path\": \"metadata.json\", "
               "\"latent_channels\": %d, \"latents_mean\": [", LC);
    for (int c = 0; c < LC; c++) fprintf(f, "%s%.9g", c ? ", " : "", m->mean[c]);
    fprintf(f, "], \"latents_std\": [");
    for (int c = 0; c < LC; c++) fprintf(f, "%s%.9g", c ? ", " : "", m->std[c]);
    fprintf(f, "]}\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/FL2VA/audio_vae/metadata.json", root);
    f = fopen(p, "w");
    fprintf(f, "{\"metadata\": {\"kwargs\": {\"encoder_dim\": 4, \"encoder_rates\": [3, 2], \"latent_dim\": %d, "
               "\"vae_latent_channels\": %d, \"decoder_dim\": %d, \"decoder_rates\": [%d, %d], "
               "\"decoder_type\": \"bigvgan\", \"attn_proj\": true, \"sample_rate\": 24000, "
               "\"decoder_kernel_sizes\": [%d, %d], \"resblock_kernel_sizes\": [%d, %d], "
               "\"resblock_dilation_sizes\": [[%d, %d], [%d, %d]]}}}\n",
            LD, LC, D0, k_rates[0], k_rates[1], k_kernels[0], k_kernels[1], k_rk[0], k_rk[1], k_dil[0][0],
            k_dil[0][1], k_dil[1][0], k_dil[1][1]);
    fclose(f);
    /* safetensors: u64 header length, JSON header padded with spaces to 8 bytes, raw data. */
    size_t cap = 1 << 16, hl = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
    hl += (size_t)snprintf(h + hl, cap - hl, "{");
    for (int i = 0; i < m->n; i++) {
        const tensor *t = &m->t[i];
        if (skip && strcmp(t->name, skip) == 0) continue;
        int64_t n = t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1) * (t->ndim > 2 ? t->shape[2] : 1);
        int64_t s0 = t->shape[0] + (bad_g && strcmp(t->name, bad_g) == 0 ? 2 : 0);
        hl += (size_t)snprintf(h + hl, cap - hl, "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [%lld", hl > 1 ? ", " : "",
                               t->name, (long long)s0);
        for (int d = 1; d < t->ndim; d++) hl += (size_t)snprintf(h + hl, cap - hl, ", %lld", (long long)t->shape[d]);
        int64_t bytes = 4 * n * s0 / t->shape[0];
        hl += (size_t)snprintf(h + hl, cap - hl, "], \"data_offsets\": [%llu, %llu]}", (unsigned long long)off,
                               (unsigned long long)(off + (uint64_t)bytes));
        off += (uint64_t)bytes;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) h[hl++] = ' ';
    snprintf(p, sizeof p, "%s/FL2VA/audio_vae/model.safetensors", root);
    f = fopen(p, "wb");
    uint64_t len = hl;
    fwrite(&len, 8, 1, f);
    fwrite(h, 1, hl, f);
    for (int i = 0; i < m->n; i++) {
        const tensor *t = &m->t[i];
        if (skip && strcmp(t->name, skip) == 0) continue;
        int64_t n = t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1) * (t->ndim > 2 ? t->shape[2] : 1);
        fwrite(t->data, 4, (size_t)n, f);
        if (bad_g && strcmp(t->name, bad_g) == 0) {
            float extra[64] = {0};
            fwrite(extra, 4, (size_t)(n / t->shape[0] * 2), f);
        }
    }
    fclose(f);
    free(h);
}

/* Fold weight norm in double: w = g v / ||v|| per slice of dim 0. */
static double *ref_wn(const model *m, const char *base, int64_t *n_out)
{
    char n[128];
    snprintf(n, sizeof n, "%s.weight_v", base);
    const tensor *v = find(m, n);
    snprintf(n, sizeof n, "%s.weight_g", base);
    const tensor *g = find(m, n);
    int64_t per = v->shape[1] * v->shape[2], tot = v->shape[0] * per;
    double *w = malloc(sizeof(double) * tot);
    for (int64_t r = 0; r < v->shape[0]; r++) {
        double ss = 0;
        for (int64_t j = 0; j < per; j++) ss += (double)v->data[r * per + j] * v->data[r * per + j];
        for (int64_t j = 0; j < per; j++) w[r * per + j] = g->data[r] * v->data[r * per + j] / sqrt(ss);
    }
    *n_out = tot;
    return w;
}

static double *dvec(const float *f, int64_t n)
{
    double *d = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}

static double *ref_wconv(const model *m, const char *base, const double *x, int cin, int64_t L, int cout, int k,
                         int dil, bool bias, int64_t *lout)
{
    int64_t nw;
    double *w = ref_wn(m, base, &nw), *b = NULL;
    char n[128];
    snprintf(n, sizeof n, "%s.bias", base);
    if (bias) b = dvec(find(m, n)->data, cout);
    double *y = ref_conv(x, cin, L, w, b, cout, k, dil, dil * (k - 1) / 2, lout);
    free(w), free(b);
    return y;
}

static double *ref_act_named(const model *m, const char *base, const double *x, int C, int64_t L)
{
    char n[4][128];
    snprintf(n[0], 128, "%s.act.alpha", base);
    snprintf(n[1], 128, "%s.act.beta", base);
    snprintf(n[2], 128, "%s.upsample.filter", base);
    snprintf(n[3], 128, "%s.downsample.lowpass.filter", base);
    double *y = malloc(sizeof(double) * C * L);
    ref_act(x, C, L, find(m, n[0])->data, find(m, n[1])->data, find(m, n[2])->data, find(m, n[3])->data, y);
    return y;
}

/* The whole decode of one side, per diffusers. Returns samples; *S gets their count. */
static double *ref_decode_side(const model *m, const float *lat, int64_t T, int64_t *S)
{
    double *x = malloc(sizeof(double) * LC * T);
    for (int c = 0; c < LC; c++)
        for (int64_t t = 0; t < T; t++) x[c * T + t] = (double)(lat[c * T + t] * m->std[c] + m->mean[c]);
    int64_t L = T, lo;
    double *w = dvec(find(m, "dec_in_proj.weight")->data, LD * LC), *b = dvec(find(m, "dec_in_proj.bias")->data, LD);
    double *h = ref_conv(x, LC, L, w, b, LD, 1, 1, 0, &lo);
    free(x), free(w), free(b);
    x = ref_wconv(m, "decoder.conv_pre", h, LD, L, D0, 7, 1, true, &lo);
    free(h);
    char base[96];
    for (int i = 0; i < NUP; i++) {
        int cin = D0 >> i, ch = D0 >> (i + 1);
        int64_t nw;
        snprintf(base, sizeof base, "decoder.ups.%d.0", i);
        double *uw = ref_wn(m, base, &nw);
        snprintf(base, sizeof base, "decoder.ups.%d.0.bias", i);
        double *ub = dvec(find(m, base)->data, ch);
        double *up = ref_tconv(x, cin, L, uw, ub, ch, k_kernels[i], k_rates[i], &lo);
        free(x), free(uw), free(ub);
        L = lo;
        double *sum = calloc((size_t)(ch * L), sizeof(double));
        for (int j = 0; j < NRES; j++) {
            int g = i * NRES + j;
            double *cur = malloc(sizeof(double) * ch * L);
            memcpy(cur, up, sizeof(double) * ch * L);
            for (int e = 0; e < NDIL; e++) {
                snprintf(base, sizeof base, "decoder.resblocks.%d.activations.%d", g, 2 * e);
                double *a1 = ref_act_named(m, base, cur, ch, L);
                snprintf(base, sizeof base, "decoder.resblocks.%d.convs1.%d", g, e);
                double *r = ref_wconv(m, base, a1, ch, L, ch, k_rk[j], k_dil[j][e], true, &lo);
                snprintf(base, sizeof base, "decoder.resblocks.%d.activations.%d", g, 2 * e + 1);
                double *a2 = ref_act_named(m, base, r, ch, L);
                snprintf(base, sizeof base, "decoder.resblocks.%d.convs2.%d", g, e);
                double *r2 = ref_wconv(m, base, a2, ch, L, ch, k_rk[j], 1, true, &lo);
                for (int64_t q = 0; q < ch * L; q++) cur[q] += r2[q];
                free(a1), free(r), free(a2), free(r2);
            }
            for (int64_t q = 0; q < ch * L; q++) sum[q] += cur[q];
            free(cur);
        }
        for (int64_t q = 0; q < ch * L; q++) sum[q] /= NRES;
        free(up);
        x = sum;
    }
    double *a = ref_act_named(m, "decoder.activation_post", x, D0 >> NUP, L);
    double *y = ref_wconv(m, "decoder.conv_post", a, D0 >> NUP, L, 1, 7, 1, false, &lo);
    for (int64_t t = 0; t < L; t++) y[t] = y[t] < -1 ? -1 : (y[t] > 1 ? 1 : y[t]);
    free(x), free(a);
    *S = L;
    return y;
}

typedef struct {
    int calls, cancel_at;
    int64_t last_done, total;
    bool monotonic;
} prog;

static int on_progress(void *user, const char *phase, int done, int total)
{
    prog *p = user;
    /* Permille of the work: non-decreasing, may repeat between fine-grained units. */
    p->monotonic &= strcmp(phase, "audio_decode") == 0 && done >= p->last_done && done <= total &&
                    (p->calls == 0 || total == p->total);
    p->last_done = done, p->total = total;
    return ++p->calls == p->cancel_at;
}

static h3_ctx *open_ctx(const char *root, int threads)
{
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    h3_ctx *ctx = h3_init(root, &o);
    CHECK_MSG(ctx != NULL, "h3_init(%s): %s", root, h3_last_error());
    return ctx;
}

static void test_decoder(const char *tmp)
{
    model m;
    build_model(&m);
    char root[512], bad[512];
    snprintf(root, sizeof root, "%s/ok", tmp);
    write_model(&m, root, NULL, NULL);
    h3_ctx *c1 = open_ctx(root, 1), *c3 = open_ctx(root, 3);
    if (!c1 || !c3) return;
    int ch = 0, sr = 0, hop = 0;
    CHECK(h3_audio_info(c1, &ch, &sr, &hop) == 0 && ch == LC && sr == 24000 && hop == 6);
    const int64_t frames[] = {1, 2, 9};
    for (size_t fi = 0; fi < sizeof frames / sizeof *frames; fi++) {
        int64_t T = frames[fi], S = h3_audio_samples(c1, (int)T);
        CHECK_MSG(S == 6 * T, "samples(%lld) = %lld", (long long)T, (long long)S);
        float *lat = malloc(sizeof(float) * 2 * LC * T), *pcm1 = malloc(sizeof(float) * 2 * S),
              *pcm3 = malloc(sizeof(float) * 2 * S);
        for (int64_t i = 0; i < 2 * LC * T; i++) lat[i] = frand();
        prog p = {0, 0, 0, 0, true};
        int rc = h3_audio_decode(c1, lat, LC, (int)T, pcm1, 2 * S, on_progress, &p);
        CHECK_MSG(rc == 0, "decode T=%lld: %s", (long long)T, h3_last_error());
        CHECK_MSG(p.calls > 0 && p.monotonic && p.last_done == p.total, "progress: %d calls, %lld of %lld",
                  p.calls, (long long)p.last_done, (long long)p.total);
        CHECK(h3_audio_decode(c3, lat, LC, (int)T, pcm3, 2 * S, NULL, NULL) == 0);
        CHECK_MSG(memcmp(pcm1, pcm3, sizeof(float) * 2 * S) == 0, "T=%lld: 1 and 3 threads differ", (long long)T);
        for (int side = 0; side < 2; side++) {
            int64_t rs;
            double *ref = ref_decode_side(&m, lat + side * LC * T, T, &rs);
            double e = rel_l2(pcm1 + side * S, ref, S);
            worst_dec = e > worst_dec ? e : worst_dec;
            CHECK_MSG(rs == S && e < 1e-5, "T=%lld side %d: rel-L2 %g vs the reference", (long long)T, side, e);
            free(ref);
        }
        free(lat), free(pcm1), free(pcm3);
    }
    /* Argument and cancellation errors. */
    float lat[2 * LC * 4], pcm[2 * 24];
    for (int i = 0; i < 2 * LC * 4; i++) lat[i] = frand();
    CHECK(h3_audio_decode(c1, lat, LC + 1, 4, pcm, 48, NULL, NULL) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "channels") != NULL);
    CHECK(h3_audio_decode(c1, lat, LC, 4, pcm, 47, NULL, NULL) == -H3_E_INVALID);
    CHECK(h3_audio_decode(c1, lat, LC, 0, pcm, 48, NULL, NULL) == -H3_E_INVALID);
    prog p = {0, 3, 0, 0, true};
    CHECK(h3_audio_decode(c1, lat, LC, 4, pcm, 48, on_progress, &p) == -H3_E_CANCELLED && p.calls == 3);
    CHECK(h3_audio_decode(c1, lat, LC, 4, pcm, 48, NULL, NULL) == 0); /* usable after a cancel */
    h3_free(c1), h3_free(c3);

    /* Schema errors name the tensor. */
    snprintf(bad, sizeof bad, "%s/missing", tmp);
    write_model(&m, bad, "decoder.resblocks.3.activations.2.downsample.lowpass.filter", NULL);
    h3_ctx *cb = open_ctx(bad, 1);
    if (cb) {
        CHECK(h3_audio_decode(cb, lat, LC, 4, pcm, 48, NULL, NULL) == -H3_E_SCHEMA);
        CHECK_MSG(strstr(h3_last_error(), "resblocks.3.activations.2.downsample") != NULL, "%s", h3_last_error());
        h3_free(cb);
    }
    snprintf(bad, sizeof bad, "%s/badg", tmp);
    write_model(&m, bad, NULL, "decoder.ups.1.0.weight_g");
    cb = open_ctx(bad, 1);
    if (cb) {
        CHECK(h3_audio_decode(cb, lat, LC, 4, pcm, 48, NULL, NULL) == -H3_E_SCHEMA);
        CHECK_MSG(strstr(h3_last_error(), "decoder.ups.1.0.weight_g") != NULL, "%s", h3_last_error());
        h3_free(cb);
    }
    free_model(&m);
}

static void rm_tree(const char *tmp)
{
    const char *subs[] = {"ok", "missing", "badg"};
    const char *files[] = {"config.json", "metadata.json", "model.safetensors"};
    char p[600];
    for (int s = 0; s < 3; s++) {
        for (int f = 0; f < 3; f++) {
            snprintf(p, sizeof p, "%s/%s/FL2VA/audio_vae/%s", tmp, subs[s], files[f]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%s/FL2VA/audio_vae", tmp, subs[s]);
        rmdir(p);
        snprintf(p, sizeof p, "%s/%s/FL2VA", tmp, subs[s]);
        rmdir(p);
        snprintf(p, sizeof p, "%s/%s", tmp, subs[s]);
        rmdir(p);
    }
    rmdir(tmp);
}

int main(void)
{
    variants[nvariants++] = &h3_avae_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) variants[nvariants++] = &h3_avae_kernels_avx2;
#endif
    printf("audio kernels: %s (of %d variants)\n", h3_avae_kern()->name, nvariants);
    test_sin2();
    const int Cs[] = {1, 3, 8, 12, 16, 43};
    const int64_t Ls[] = {1, 2, 7, 40};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) test_act(Cs[i], Ls[j], 1 + (i + j) % 3, (i + 2 * j) % 3);
    const int64_t gshapes[][4] = {{1, 1, 3, 3}, {5, 8, 7, 2}, {7, 16, 256, 256}, {13, 20, 300, 60},
                                  {100, 70, 700, 100}, {37, 33, 11, 1}, {6, 48, 515, 512}};
    g_pool1 = h3_pool_create(1), g_pool3 = h3_pool_create(3);
    for (size_t i = 0; i < sizeof gshapes / sizeof *gshapes; i++)
        test_gemm(gshapes[i][0], (int)gshapes[i][1], gshapes[i][2], gshapes[i][3], i % 2 == 0);
    h3_pool_destroy(g_pool1), h3_pool_destroy(g_pool3);
    char tmp[] = "/tmp/h3_avae_test_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_decoder(tmp);
    if (!getenv("H3_TEST_KEEP")) rm_tree(tmp);
    printf("worst rel-L2 vs the double reference: activation %.3g, decoder %.3g\n", worst_act, worst_dec);
    CTEST_END();
}
