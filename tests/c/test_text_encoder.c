/*
 * Text encoder: a tiny random checkpoint written here (mixed F32/BF16 tensors, GQA, two shards)
 * against a direct double-precision transcription of the Qwen3-VL layer; streaming with and
 * without prefetch, thread counts, cancellation, the prompt cache and input errors. Runs under
 * ASan+UBSan too (reader thread start/stop on every path).
 */
#include "ctest.h"
#include "api/api.h"
#include "models/text_encoder.h"
#include "backend/cpu/ops.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

enum { HID = 24, HEADS = 4, KVH = 2, HD = 8, INTER = 40, LAYERS = 4, COND = 3, VOCAB = 50 };
#define QD (HEADS * HD)
#define KD (KVH * HD)
#define EPS 1e-6
#define THETA 10000.0

/* ---- checkpoint writer ------------------------------------------------------------------ */

typedef struct {
    char name[96];
    bool bf16;
    int ndim;
    int64_t shape[2];
    float *val; /* values as stored (already rounded to bf16 when bf16) */
} tensor;

static tensor g_t[64];
static int g_nt;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

static float round_bf16(float x) { return h3_bf16_to_f32(h3_f32_to_bf16(x)); }

static tensor *add(const char *name, int rows, int cols, double center, double scale, bool bf16)
{
    tensor *t = &g_t[g_nt++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->bf16 = bf16;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    int64_t n = (int64_t)rows * (cols ? cols : 1);
    t->val = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(center + scale * urand());
        t->val[i] = bf16 ? round_bf16(v) : v;
    }
    return t;
}

static const tensor *find(const char *name)
{
    for (int i = 0; i < g_nt; i++)
        if (strcmp(g_t[i].name, name) == 0) return &g_t[i];
    return NULL;
}

static const float *W(int layer, const char *suffix)
{
    char n[128];
    snprintf(n, sizeof n, "model.language_model.layers.%d.%s", layer, suffix);
    return find(n)->val;
}

static int64_t numel(const tensor *t) { return t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1); }

/* One safetensors file holding tensors [from, to). */
static void write_shard(const char *path, int from, int to)
{
    char hdr[16384];
    size_t n = 0;
    uint64_t off = 0;
    n += (size_t)snprintf(hdr + n, sizeof hdr - n, "{");
    for (int i = from; i < to; i++) {
        const tensor *t = &g_t[i];
        uint64_t bytes = (uint64_t)numel(t) * (t->bf16 ? 2 : 4);
        char shape[64];
        if (t->ndim == 2)
            snprintf(shape, sizeof shape, "%lld,%lld", (long long)t->shape[0], (long long)t->shape[1]);
        else
            snprintf(shape, sizeof shape, "%lld", (long long)t->shape[0]);
        n += (size_t)snprintf(hdr + n, sizeof hdr - n,
                              "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                              i > from ? "," : "", t->name, t->bf16 ? "BF16" : "F32", shape,
                              (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    n += (size_t)snprintf(hdr + n, sizeof hdr - n, "}");
    while (n % 8) hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    uint64_t hl = n;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, n, f);
    for (int i = from; i < to; i++) {
        const tensor *t = &g_t[i];
        for (int64_t k = 0; k < numel(t); k++) {
            if (t->bf16) {
                uint16_t b = h3_f32_to_bf16(t->val[k]);
                fwrite(&b, 2, 1, f);
            } else {
                fwrite(&t->val[k], 4, 1, f);
            }
        }
    }
    fclose(f);
}

static char g_dir[256];

static void write_file(const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static void make_checkpoint(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/h3_text_test_XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    char p[512];
    snprintf(p, sizeof p, "%s/FL2VA", g_dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/FL2VA/text_encoder", g_dir);
    mkdir(p, 0755);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"qwen3_vl\", \"text_config\": {\"hidden_size\": %d, \"num_hidden_layers\": %d, "
             "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
             "\"intermediate_size\": %d, \"vocab_size\": %d, \"rms_norm_eps\": %g, \"hidden_act\": \"silu\", "
             "\"attention_bias\": false, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %g, "
             "\"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true}}, \"minimax_h3_conditioning_layer\": %d}",
             HID, LAYERS, HEADS, KVH, HD, INTER, VOCAB, EPS, THETA, COND);
    write_file("FL2VA/text_encoder/config.json", cfg);

    add("model.language_model.embed_tokens.weight", VOCAB, HID, 0, 0.8, true);
    for (int l = 0; l < LAYERS; l++) {
        char n[128];
#define T(suffix, r, c, ctr, sc, bf)                                                  \
    snprintf(n, sizeof n, "model.language_model.layers.%d.%s", l, suffix);            \
    add(n, r, c, ctr, sc, bf)
        T("input_layernorm.weight", HID, 0, 1, 0.2, false);
        T("self_attn.q_proj.weight", QD, HID, 0, 0.35, l % 2 == 0);
        T("self_attn.k_proj.weight", KD, HID, 0, 0.35, false);
        T("self_attn.v_proj.weight", KD, HID, 0, 0.35, true);
        T("self_attn.q_norm.weight", HD, 0, 1, 0.2, true);
        T("self_attn.k_norm.weight", HD, 0, 1, 0.2, false);
        T("self_attn.o_proj.weight", HID, QD, 0, 0.3, false);
        T("post_attention_layernorm.weight", HID, 0, 1, 0.2, false);
        T("mlp.gate_proj.weight", INTER, HID, 0, 0.35, true);
        T("mlp.up_proj.weight", INTER, HID, 0, 0.35, false);
        T("mlp.down_proj.weight", HID, INTER, 0, 0.27, l == 1);
#undef T
    }
    add("model.language_model.norm.weight", HID, 0, 1, 0.1, false);
    /* Two shards, split in the middle of layer 1 so a layer spans files. */
    int split = 1 + 11 + 5;
    snprintf(p, sizeof p, "%s/FL2VA/text_encoder/model-00001-of-00002.safetensors", g_dir);
    write_shard(p, 0, split);
    snprintf(p, sizeof p, "%s/FL2VA/text_encoder/model-00002-of-00002.safetensors", g_dir);
    write_shard(p, split, g_nt);
}

/* ---- reference (double) ------------------------------------------------------------------ */

static void rms(const double *x, double *y, int n, const float *w)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + EPS);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * w[i];
}

static void matvec(const float *w, int rows, int cols, const double *x, double *y)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)w[(int64_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rope(double *v, int pos)
{
    for (int j = 0; j < HD / 2; j++) {
        double inv = 1.0 / pow(THETA, 2.0 * j / HD), a = pos * inv, c = cos(a), s = sin(a);
        double x1 = v[j], x2 = v[j + HD / 2];
        v[j] = x1 * c - x2 * s;
        v[j + HD / 2] = x2 * c + x1 * s;
    }
}

static void reference(const int32_t *ids, int n, double *h /* [n, HID] */)
{
    const float *emb = find("model.language_model.embed_tokens.weight")->val;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < HID; i++) h[t * HID + i] = emb[(int64_t)ids[t] * HID + i];
    double *q = malloc(sizeof(double) * n * QD), *k = malloc(sizeof(double) * n * KD);
    double *v = malloc(sizeof(double) * n * KD), a[HID], att[QD], tmp[INTER], g[INTER], u[INTER];
    double *sc = malloc(sizeof(double) * n);
    for (int l = 0; l < COND; l++) {
        for (int t = 0; t < n; t++) {
            rms(h + t * HID, a, HID, W(l, "input_layernorm.weight"));
            matvec(W(l, "self_attn.q_proj.weight"), QD, HID, a, q + t * QD);
            matvec(W(l, "self_attn.k_proj.weight"), KD, HID, a, k + t * KD);
            matvec(W(l, "self_attn.v_proj.weight"), KD, HID, a, v + t * KD);
            for (int hh = 0; hh < HEADS; hh++) {
                rms(q + t * QD + hh * HD, q + t * QD + hh * HD, HD, W(l, "self_attn.q_norm.weight"));
                rope(q + t * QD + hh * HD, t);
            }
            for (int hh = 0; hh < KVH; hh++) {
                rms(k + t * KD + hh * HD, k + t * KD + hh * HD, HD, W(l, "self_attn.k_norm.weight"));
                rope(k + t * KD + hh * HD, t);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int hh = 0; hh < HEADS; hh++) {
                int kv = hh / (HEADS / KVH);
                double mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < HD; i++) d += q[t * QD + hh * HD + i] * k[s * KD + kv * HD + i];
                    sc[s] = d / sqrt((double)HD);
                    if (sc[s] > mx) mx = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < HD; i++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++) o += sc[s] * v[s * KD + kv * HD + i];
                    att[hh * HD + i] = o / sum;
                }
            }
            matvec(W(l, "self_attn.o_proj.weight"), HID, QD, att, tmp);
            for (int i = 0; i < HID; i++) h[t * HID + i] += tmp[i];
        }
        for (int t = 0; t < n; t++) {
            rms(h + t * HID, a, HID, W(l, "post_attention_layernorm.weight"));
            matvec(W(l, "mlp.gate_proj.weight"), INTER, HID, a, g);
            matvec(W(l, "mlp.up_proj.weight"), INTER, HID, a, u);
            for (int i = 0; i < INTER; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(W(l, "mlp.down_proj.weight"), HID, INTER, g, tmp);
            for (int i = 0; i < HID; i++) h[t * HID + i] += tmp[i];
        }
    }
    free(q);
    free(k);
    free(v);
    free(sc);
}

/* ---- tests ------------------------------------------------------------------------------- */

static h3_ctx *open_ctx(int threads)
{
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    h3_ctx *c = h3_init(g_dir, &o);
    CHECK_MSG(c != NULL, "%s", h3_last_error());
    return c;
}

static void random_ids(int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((urand() + 1.0) * 0.5 * VOCAB) % VOCAB;
}

static int g_cancel_at = -1, g_calls, g_last_done, g_last_total;
static int progress(void *user, const char *phase, int done, int total)
{
    (void)user;
    CHECK(strcmp(phase, "text_encoder") == 0);
    g_calls++;
    g_last_done = done;
    g_last_total = total;
    return done == g_cancel_at;
}

static uint64_t expected_read(int n)
{
    uint64_t b = (uint64_t)n * HID * 2; /* bf16 embedding rows */
    for (int l = 0; l < COND; l++)
        for (int i = 0; i < g_nt; i++) {
            char pre[64];
            snprintf(pre, sizeof pre, "model.language_model.layers.%d.", l);
            if (strncmp(g_t[i].name, pre, strlen(pre)) == 0)
                b += (uint64_t)numel(&g_t[i]) * (g_t[i].bf16 ? 2 : 4);
        }
    return b;
}

static void test_parity_and_streaming(void)
{
    static const int lens[] = {1, 2, 6, 7, 49, 70};
    h3_ctx *c1 = open_ctx(1), *c3 = open_ctx(3);
    if (!c1 || !c3) return;
    CHECK(h3_text_hidden_size(c1) == HID);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        int32_t ids[128];
        random_ids(ids, n);
        double *ref = malloc(sizeof(double) * n * HID);
        reference(ids, n, ref);
        float *a = malloc(sizeof(float) * n * HID), *b = malloc(sizeof(float) * n * HID);
        float *d = malloc(sizeof(float) * n * HID);
        h3_text_run run = {NULL, NULL, 1, 0};
        h3_backend *be1, *be3;
        CHECK(h3_rt_cpu_backend(&c1->rt, &be1) == 0 && h3_rt_cpu_backend(&c3->rt, &be3) == 0);
        int rc = h3_text_forward(&c1->model, be1, ids, n, a, &run);
        CHECK_MSG(rc == 0, "%s", h3_last_error());
        CHECK(run.bytes_read == expected_read(n));
        double num = 0, den = 0;
        for (int i = 0; i < n * HID; i++) {
            num += (a[i] - ref[i]) * (a[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        CHECK_MSG(sqrt(num / den) < 2e-6, "n=%d rel err %.3g", n, sqrt(num / den));
        run.prefetch = 0;
        CHECK(h3_text_forward(&c3->model, be3, ids, n, b, &run) == 0);
        CHECK_MSG(memcmp(a, b, sizeof(float) * n * HID) == 0, "n=%d: threads/prefetch change the bits", n);
        CHECK(h3_text_encode(c3, ids, n, d) == 0);
        CHECK(memcmp(a, d, sizeof(float) * n * HID) == 0);
        free(ref);
        free(a);
        free(b);
        free(d);
    }
    h3_free(c1);
    h3_free(c3);
}

static void test_cache_and_progress(void)
{
    h3_ctx *c = open_ctx(2);
    if (!c) return;
    int32_t ids[20];
    random_ids(ids, 20);
    float a[20 * HID], b[20 * HID];
    h3_text_cache_stats s = {.struct_size = sizeof s};
    h3_set_progress(c, progress, NULL);
    g_calls = 0;
    CHECK(h3_text_encode(c, ids, 20, a) == 0);
    CHECK(g_calls == COND + 1 && g_last_done == COND && g_last_total == COND);
    CHECK(h3_text_cache_stats_get(c, &s) == 0);
    CHECK(s.hits == 0 && s.misses == 1 && s.entries == 1 && s.last_bytes_read == expected_read(20));
    memset(b, 0, sizeof b);
    CHECK(h3_text_encode(c, ids, 20, b) == 0);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(h3_text_cache_stats_get(c, &s) == 0);
    CHECK(s.hits == 1 && s.misses == 1 && s.last_bytes_read == 0);
    /* A prompt that shares a prefix is a different key. */
    CHECK(h3_text_encode(c, ids, 19, b) == 0);
    CHECK(memcmp(a, b, sizeof(float) * 19 * HID) == 0); /* causal: the prefix rows agree */
    CHECK(h3_text_cache_stats_get(c, &s) == 0 && s.misses == 2 && s.entries == 2);
    /* Budget: room for one 20-token entry only -> the older entry is evicted. */
    CHECK(h3_text_cache_set_budget(c, s.bytes - 1) == 0);
    CHECK(h3_text_cache_stats_get(c, &s) == 0 && s.entries == 1 && s.evictions == 1);
    CHECK(h3_text_cache_set_budget(c, 0) == 0);
    CHECK(h3_text_cache_stats_get(c, &s) == 0 && s.entries == 0 && s.bytes == 0);
    CHECK(h3_text_encode(c, ids, 20, b) == 0); /* budget 0: not stored */
    CHECK(h3_text_cache_stats_get(c, &s) == 0 && s.entries == 0 && s.hits == 1);
    CHECK(h3_text_cache_set_budget(c, 1 << 20) == 0);
    CHECK(h3_text_encode(c, ids, 20, b) == 0);
    h3_text_cache_clear(c);
    CHECK(h3_text_cache_stats_get(c, &s) == 0 && s.entries == 0 && s.bytes == 0);
    /* Cancellation, before any layer and after one, with and without prefetch. */
    for (int pf = 0; pf < 2; pf++) {
        setenv("H3_TEXT_PREFETCH", pf ? "1" : "0", 1);
        for (int at = 0; at <= 1; at++) {
            g_cancel_at = at;
            int rc = h3_text_encode(c, ids, 7, b);
            CHECK(rc == -H3_E_CANCELLED);
            CHECK(strstr(h3_last_error(), "cancelled") != NULL);
        }
    }
    unsetenv("H3_TEXT_PREFETCH");
    g_cancel_at = -1;
    h3_set_progress(c, NULL, NULL);
    s.struct_size = 3;
    CHECK(h3_text_cache_stats_get(c, &s) == -H3_E_INVALID);
    h3_free(c);
}

static void test_errors(void)
{
    h3_ctx *c = open_ctx(1);
    if (!c) return;
    int32_t ids[3] = {1, VOCAB, 2};
    float out[3 * HID];
    CHECK(h3_text_encode(c, ids, 3, out) == -H3_E_INVALID);
    CHECK_MSG(strstr(h3_last_error(), "token id 50 at position 1") != NULL, "%s", h3_last_error());
    ids[1] = -1;
    CHECK(h3_text_encode(c, ids, 3, out) == -H3_E_INVALID);
    CHECK(h3_text_encode(c, ids, 0, out) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "empty prompt") != NULL);
    CHECK(h3_text_encode(c, NULL, 3, out) == -H3_E_INVALID);
    /* A shard that shrinks after the headers were read is caught before any compute. */
    char p[512];
    snprintf(p, sizeof p, "%s/FL2VA/text_encoder/model-00002-of-00002.safetensors", g_dir);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK(truncate(p, st.st_size - 4) == 0);
    ids[1] = 3;
    int rc = h3_text_encode(c, ids, 3, out);
    CHECK(rc == -H3_E_IO);
    CHECK_MSG(strstr(h3_last_error(), "model-00002-of-00002") != NULL, "%s", h3_last_error());
    h3_free(c);
}

static void cleanup(void)
{
    char p[512];
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/FL2VA/text_encoder/%s", g_dir, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/FL2VA/text_encoder", g_dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s/FL2VA", g_dir);
    rmdir(p);
    rmdir(g_dir);
    for (int i = 0; i < g_nt; i++) free(g_t[i].val);
}

int main(void)
{
    make_checkpoint();
    test_parity_and_streaming();
    test_cache_and_progress();
    test_errors();
    cleanup();
    CTEST_END();
}
