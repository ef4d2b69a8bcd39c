/*
 * Single-file sources (core/singlefile.c, core/quant_formats.c).
 *
 * Without arguments: small files written here (an fp8_scaled layer, an int8 ConvRot QKV projection under the
 * model.diffusion_model. prefix, a plain [q;k;v] projection, a pruned table) are opened as a transformer and every
 * presented tensor is compared, bit for bit, with a reference computed here the naive way (the Hadamard matrix
 * built entry by entry, the BF16 rounding found by comparing the two neighbours); bad files are refused with the
 * expected line. With arguments SINGLE REF HEADS (tests/test_single_file.py): every tensor of REF must equal, byte
 * for byte, the tensor of that name SINGLE presents.
 */
#include "core/internal.h"
#include "core/singlefile.h"
#include "core/host.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_int8.h"
#include "models/dit.h"
#include "ctest.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

/* BF16 nearest to x, ties to even, found from the two candidates around it (independent of the library's). */
static uint16_t ref_bf16(double x)
{
    float f = (float)x; /* within half an f32 ulp; the two bf16 neighbours of x are the neighbours of f's */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    const double dlo = fabs(x - (double)flo), dhi = fabs(x - (double)fhi);
    if (dlo < dhi) return (uint16_t)(lo >> 16);
    if (dhi < dlo) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static int hsign(int a, int b) /* entry of kron(H4, ..., H4): -1 for each base-4 digit pair summing to 3 */
{
    int s = 1;
    for (; a || b; a /= 4, b /= 4)
        if (a % 4 + b % 4 == 3) s = -s;
    return s;
}

static char dir_[64];

static char *path_in(const char *name) { return h3_asprintf("%s/%s", dir_, name); }

static void write_file(const char *path, const h3_st_entry *e, size_t n, const void *const *data, const char *meta_json)
{
    h3_st_writer w;
    const char *const meta[1][2] = {{"_quantization_metadata", meta_json}};
    CHECK(h3_st_writer_open(&w, path, true, e, n, meta, meta_json ? 1 : 0) == 0);
    for (size_t i = 0; i < n; i++) {
        size_t bytes = h3_dtype_size(e[i].dtype);
        for (int d = 0; d < e[i].ndim; d++) bytes *= (size_t)e[i].shape[d];
        CHECK(h3_st_writer_write(&w, data[i], bytes) == 0);
    }
    CHECK(h3_st_writer_commit(&w) == 0);
}

#define HEADS 2
#define D 4
#define ROWS (3 * HEADS * D)
#define KIN 16

static void test_quantised(void)
{
    /* blocks.0.attn.qkv_proj: int8 ConvRot g=16, [q;k;v] rows, per-row scales, prefixed names */
    static int8_t q[ROWS * KIN];
    static float s[ROWS], sc8 = 0.0137f, one[8 * 8];
    static uint8_t f8[8 * 16];
    for (int i = 0; i < ROWS * KIN; i++) q[i] = (int8_t)((int)(frand() * 127.0f));
    for (int i = 0; i < ROWS; i++) s[i] = 0.001f + fabsf(frand()) * 0.01f;
    for (int i = 0; i < 8 * 16; i++) f8[i] = (uint8_t)(rand() & 0xff);
    for (int i = 0; i < 8 * 16; i++)
        if ((f8[i] & 0x7f) == 0x7f) f8[i] = 0x11; /* no NaN codes */
    for (int i = 0; i < 64; i++) one[i] = frand();
    const char *cq_int8 = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 16}";
    const char *cq_fp8 = "{\"format\": \"float8_e4m3fn\"}";
    const h3_st_entry e[] = {
        {"model.diffusion_model.blocks.0.attn.qkv_proj.weight", H3_DT_I8, 2, {ROWS, KIN}},
        {"model.diffusion_model.blocks.0.attn.qkv_proj.weight_scale", H3_DT_F32, 2, {ROWS, 1}},
        {"model.diffusion_model.blocks.0.attn.qkv_proj.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(cq_int8)}},
        {"model.diffusion_model.blocks.0.mlp.fc2.weight", H3_DT_F8_E4M3, 2, {8, 16}},
        {"model.diffusion_model.blocks.0.mlp.fc2.weight_scale", H3_DT_F32, 0, {0}},
        {"model.diffusion_model.blocks.0.mlp.fc2.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(cq_fp8)}},
        {"model.diffusion_model.condition_proj.weight", H3_DT_F32, 2, {8, 8}},
        {"model.diffusion_model.audio_patch_proj.weight", H3_DT_F32, 2, {8, 8}},
    };
    const void *data[] = {q, s, cq_int8, f8, &sc8, cq_fp8, one, one};
    char *p = path_in("q.safetensors");
    write_file(p, e, 8, data, NULL);
    h3_store st;
    char desc[256];
    CHECK_MSG(h3_sf_open(&st, p, H3_COMP_TRANSFORMER, HEADS, desc, sizeof desc) == 0, "%s", h3_last_error());
    CHECK(strstr(desc, "int8") != NULL);
    CHECK(h3_store_find(&st, "blocks.0.attn.qkv_proj.weight_scale") == NULL); /* sidecars are not presented */
    CHECK(h3_sf_owned_bytes(&st) >= (uint64_t)(ROWS * KIN + 8 * 16) * 2);
    const int64_t sq[2] = {ROWS, KIN}, sf[2] = {8, 16};
    const uint16_t *wq = h3_store_get(&st, "blocks.0.attn.qkv_proj.weight", H3_DT_BF16, 2, sq);
    const uint16_t *wf = h3_store_get(&st, "blocks.0.mlp.fc2.weight", H3_DT_BF16, 2, sf);
    CHECK_MSG(wq && wf, "%s", h3_last_error());
    int bad = 0;
    for (int r = 0; wq && r < ROWS; r++) {
        /* presented row r = head h, part p, dim d; stored row p * (HEADS*D) + h * D + d */
        const int h = r / (3 * D), part = (r / D) % 3, dd = r % D, src = part * HEADS * D + h * D + dd;
        for (int a = 0; a < KIN; a++) {
            long sum = 0;
            for (int b = 0; b < KIN; b++) sum += hsign(a, b) * q[src * KIN + b];
            bad += wq[r * KIN + a] != ref_bf16((double)sum * (double)s[src] / 4.0);
        }
    }
    for (int i = 0; wf && i < 8 * 16; i++) bad += wf[i] != ref_bf16(h3_fp8_value(f8[i], false) * (double)sc8);
    CHECK_MSG(bad == 0, "%d dequantised values differ from the reference", bad);
    /* e4m3 spot values: the format's definition, not the library's table */
    CHECK(h3_fp8_value(0x38, false) == 1.0 && h3_fp8_value(0x01, false) == ldexp(1.0, -9));
    CHECK(h3_fp8_value(0x7e, false) == 448.0 && isnan(h3_fp8_value(0x7f, false)));
    h3_store_close(&st);

    /* the same layers described in _quantization_metadata instead of comfy_quant tensors */
    const h3_st_entry e2[] = {e[0], e[1], e[3], e[4], e[6], e[7]};
    const void *d2[] = {q, s, f8, &sc8, one, one};
    char *p2 = path_in("q2.safetensors");
    write_file(p2, e2, 6, d2,
               "{\"layers\": {\"model.diffusion_model.blocks.0.attn.qkv_proj\": {\"format\": \"int8_tensorwise\", "
               "\"convrot\": true, \"convrot_groupsize\": 16}, \"model.diffusion_model.blocks.0.mlp.fc2\": "
               "{\"format\": \"float8_e4m3fn\"}}}");
    CHECK_MSG(h3_sf_open(&st, p2, H3_COMP_TRANSFORMER, HEADS, desc, sizeof desc) == 0, "%s", h3_last_error());
    const uint16_t *wq2 = h3_store_get(&st, "blocks.0.attn.qkv_proj.weight", H3_DT_BF16, 2, sq);
    CHECK(wq && wq2 && memcmp(wq, wq2, sizeof(uint16_t) * ROWS * KIN) == 0);
    h3_store_close(&st);

    /* refusals: an unknown format, nvfp4, a LoRA, another model, a truncated file */
    const char *cq_nv = "{\"format\": \"nvfp4\"}";
    const h3_st_entry e3[] = {e[3], e[4], {"model.diffusion_model.blocks.0.mlp.fc2.comfy_quant", H3_DT_U8, 1,
                                           {(int64_t)strlen(cq_nv)}}, e[6], e[7],
                              {"model.diffusion_model.blocks.0.attn.qkv_proj.weight", H3_DT_F32, 2, {8, 8}}};
    const void *d3[] = {f8, &sc8, cq_nv, one, one, one};
    char *p3 = path_in("nv.safetensors");
    write_file(p3, e3, 6, d3, NULL);
    CHECK(h3_sf_open(&st, p3, H3_COMP_TRANSFORMER, HEADS, NULL, 0) == -H3_E_UNSUPPORTED);
    CHECK(strstr(h3_last_error(), "nvfp4") != NULL);
    const h3_st_entry e4[] = {{"blocks.0.attn.qkv_proj.lora_A.weight", H3_DT_F32, 2, {8, 8}}};
    const void *d4[] = {one};
    char *p4 = path_in("lora.safetensors");
    write_file(p4, e4, 1, d4, NULL);
    CHECK(h3_sf_open(&st, p4, H3_COMP_TRANSFORMER, HEADS, NULL, 0) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "LoRA") != NULL);
    const h3_st_entry e5[] = {{"model.layers.0.self_attn.q_proj.weight", H3_DT_F32, 2, {8, 8}}};
    char *p5 = path_in("other.safetensors");
    write_file(p5, e5, 1, d4, NULL);
    CHECK(h3_sf_open(&st, p5, H3_COMP_TRANSFORMER, HEADS, NULL, 0) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "not a MiniMax-H3 transformer") != NULL);
    CHECK(truncate(p, 200) == 0);
    CHECK(h3_sf_open(&st, p, H3_COMP_TRANSFORMER, HEADS, NULL, 0) == -H3_E_FORMAT);
    CHECK(strstr(h3_last_error(), "truncated") != NULL);
    char *all[] = {p, p2, p3, p4, p5};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        unlink(all[i]);
        free(all[i]);
    }
}

/*
 * y = X W^T through the CPU backend's int8 weight (weight_load_i8 over the codes, the activations rotated at run
 * time) against ComfyUI's dequantise-then-compute done here in double: W = ((q * s).reshape(N, K/g, g) @ H^T), H
 * built entry by entry (hsign / sqrt(g)), y = X W^T + b. Tolerance: 2e-6 of the largest |y| (f32 sums of K
 * products; the f32 rounding of the rotated activations and of q * s is ~6e-8 relative each).
 */
static double linear_i8_err(h3_backend *be, int M, int N, int K, int g, bool one_scale, const int8_t *q_in,
                            const float *s_in, bool *ok)
{
    int8_t *q = malloc((size_t)N * K);
    float *s = malloc(sizeof(float) * N), *X = malloc(sizeof(float) * (size_t)M * K), *Y = malloc(sizeof(float) * (size_t)M * N);
    float *bias = malloc(sizeof(float) * N);
    double *W = malloc(sizeof(double) * (size_t)N * K);
    for (int i = 0; i < N * K; i++) q[i] = q_in ? q_in[i] : (int8_t)((int)(frand() * 127.0f));
    for (int n = 0; n < N; n++) s[n] = s_in ? s_in[n] : one_scale ? 0.0071f : 0.001f + fabsf(frand()) * 0.01f;
    for (int i = 0; i < M * K; i++) X[i] = frand() * 3.0f;
    for (int n = 0; n < N; n++) bias[n] = frand();
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            if (!g) {
                W[(size_t)n * K + k] = (double)q[n * K + k] * s[n];
                continue;
            }
            const int g0 = k / g * g;
            double acc = 0;
            for (int j = 0; j < g; j++) acc += (double)q[n * K + g0 + j] * s[n] * hsign(k - g0, j);
            W[(size_t)n * K + k] = acc / sqrt((double)g);
        }
    h3_bw w;
    *ok = be->weight_load_i8(be, q, s, g, N, K, &w) == 0;
    double worst = 0, big = 0;
    if (*ok) {
        const h3_bt x = h3_bt_make(X, H3_DT_F32, M, K, K), y = h3_bt_make(Y, H3_DT_F32, M, N, N);
        *ok = be->ops->linear(be, &x, &w, bias, &y) == 0;
        be->weights->weight_free(be, &w);
    }
    for (int m = 0; *ok && m < M; m++)
        for (int n = 0; n < N; n++) {
            double r = bias[n];
            for (int k = 0; k < K; k++) r += (double)X[m * K + k] * W[(size_t)n * K + k];
            worst = fmax(worst, fabs(r - Y[m * N + n]));
            big = fmax(big, fabs(r));
        }
    free(q), free(s), free(X), free(Y), free(bias), free(W);
    return big > 0 ? worst / big : worst;
}

static void test_native_int8(void)
{
    h3_pool *pool = h3_pool_create(2);
    h3_backend *be = NULL;
    CHECK_MSG(pool && h3_backend_cpu_create(pool, &be) == 0, "%s", h3_last_error());
    if (!be) return;
    CHECK(h3_backend_has(be, H3_CAP_I8_WEIGHTS));
    /* the released group sizes (64, 256), plain int8, a scalar scale, the few-rows path (M <= 6) and M over one
       staging chunk of rotated rows (h3_i8_rot_rows) */
    const struct { int M, N, K, g; bool one; } cases[] = {
        {37, 40, 512, 64, false}, {5, 33, 768, 256, false}, {130, 17, 256, 256, true}, {9, 24, 320, 0, false},
        {3, 8, 64, 4, false}, {(int)h3_i8_rot_rows(16384) + 7, 3, 16384, 256, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        bool ok;
        const double e = linear_i8_err(be, cases[c].M, cases[c].N, cases[c].K, cases[c].g, cases[c].one, NULL, NULL, &ok);
        printf("native int8 linear M=%d N=%d K=%d group %d%s: max |err| / max |y| = %.3g\n", cases[c].M, cases[c].N,
               cases[c].K, cases[c].g, cases[c].one ? " (one scale)" : "", e);
        CHECK_MSG(ok, "%s", h3_last_error());
        CHECK_MSG(e < 2e-6, "native int8 linear: relative error %g", e);
    }
    /* same bits whatever the thread count (the rotation and the GEMM split rows only) */
    h3_pool *pool1 = h3_pool_create(1);
    h3_backend *one = NULL;
    CHECK(pool1 && h3_backend_cpu_create(pool1, &one) == 0);
    {
        enum { M = 50, N = 20, K = 256 };
        static int8_t q[N * K];
        static float s[N], X[M * K], Y1[M * N], Y2[M * N];
        for (int i = 0; i < N * K; i++) q[i] = (int8_t)((int)(frand() * 127.0f));
        for (int i = 0; i < N; i++) s[i] = 0.01f;
        for (int i = 0; i < M * K; i++) X[i] = frand();
        h3_bw w1, w2;
        const h3_bt x = h3_bt_make(X, H3_DT_F32, M, K, K), y1 = h3_bt_make(Y1, H3_DT_F32, M, N, N),
                    y2 = h3_bt_make(Y2, H3_DT_F32, M, N, N);
        CHECK(be->weight_load_i8(be, q, s, 64, N, K, &w1) == 0 &&
              one->weight_load_i8(one, q, s, 64, N, K, &w2) == 0);
        CHECK(be->ops->linear(be, &x, &w1, NULL, &y1) == 0 && one->ops->linear(one, &x, &w2, NULL, &y2) == 0);
        CHECK_MSG(memcmp(Y1, Y2, sizeof Y1) == 0, "native int8 linear: 1 and 2 threads differ");
        be->weights->weight_free(be, &w1);
        one->weights->weight_free(one, &w2);
        /* refused: a group that is not a power of 4, or does not divide K */
        CHECK(be->weight_load_i8(be, q, s, 32, N, K, &w1) == -H3_E_INVALID);
        CHECK(be->weight_load_i8(be, q, s, 64, N, 200, &w1) == -H3_E_INVALID);
    }
    h3_backend_destroy(one);
    h3_pool_destroy(pool1);

    /* A file's codes presented for the backend: the [q;k;v] ConvRot QKV and a plain int8 fc1 with one scale (both
       reordered / broadcast by jobs), an fp8 fc2 (its one scale broadcast), an int8 AdaLN projection that stays
       widened (the predicate says no) */
    static int8_t qq[ROWS * KIN], q1[16 * 8], qa[8 * 8];
    static uint8_t f8[8 * 16];
    static float sq[ROWS], s1 = 0.02f, s8 = 0.5f, sa[8], one8[64];
    for (int i = 0; i < ROWS * KIN; i++) qq[i] = (int8_t)((int)(frand() * 127.0f));
    for (int i = 0; i < 16 * 8; i++) q1[i] = (int8_t)((int)(frand() * 127.0f));
    for (int i = 0; i < 64; i++) qa[i] = (int8_t)((int)(frand() * 127.0f)), one8[i] = frand();
    for (int i = 0; i < 8 * 16; i++) f8[i] = (uint8_t)(rand() & 0x77);
    for (int i = 0; i < ROWS; i++) sq[i] = 0.001f * (float)(i + 1);
    for (int i = 0; i < 8; i++) sa[i] = 0.003f;
    const char *cq = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 16}";
    const char *c1 = "{\"format\": \"int8_tensorwise\"}", *c8 = "{\"format\": \"float8_e4m3fn\"}";
    const h3_st_entry e[] = {
        {"blocks.0.attn.qkv_proj.weight", H3_DT_I8, 2, {ROWS, KIN}},
        {"blocks.0.attn.qkv_proj.weight_scale", H3_DT_F32, 1, {ROWS}},
        {"blocks.0.attn.qkv_proj.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(cq)}},
        {"blocks.0.mlp.fc1.weight", H3_DT_I8, 2, {16, 8}},
        {"blocks.0.mlp.fc1.weight_scale", H3_DT_F32, 0, {0}},
        {"blocks.0.mlp.fc1.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(c1)}},
        {"blocks.0.mlp.fc2.weight", H3_DT_F8_E4M3, 2, {8, 16}},
        {"blocks.0.mlp.fc2.weight_scale", H3_DT_F32, 0, {0}},
        {"blocks.0.mlp.fc2.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(c8)}},
        {"blocks.0.adaln_proj.linear.weight", H3_DT_I8, 2, {8, 8}},
        {"blocks.0.adaln_proj.linear.weight_scale", H3_DT_F32, 2, {8, 1}},
        {"blocks.0.adaln_proj.linear.comfy_quant", H3_DT_U8, 1, {(int64_t)strlen(c1)}},
        {"condition_proj.weight", H3_DT_F32, 2, {8, 8}},
        {"audio_patch_proj.weight", H3_DT_F32, 2, {8, 8}},
    };
    const void *data[] = {qq, sq, cq, q1, &s1, c1, f8, &s8, c8, qa, sa, c1, one8, one8};
    char *p = path_in("native.safetensors");
    write_file(p, e, sizeof e / sizeof *e, data, NULL);
    h3_store st;
    CHECK_MSG(h3_sf_open(&st, p, H3_COMP_TRANSFORMER, HEADS, NULL, 0) == 0, "%s", h3_last_error());
    const uint64_t widened = h3_sf_owned_bytes(&st);
    h3_sf_qw w;
    CHECK(h3_sf_qweight(&st, "blocks.0.mlp.fc1.weight", 16, 8, &w) == 0); /* not asked for: no codes */
    CHECK(h3_sf_native(&st, true, true, h3_dit_gemm_weight) == 0);
    const uint64_t native = h3_sf_owned_bytes(&st);
    /* what the native mode writes: the reordered QKV codes and scales, fc1's and fc2's broadcast scales, the AdaLN
       projection widened (the predicate keeps it); fp8 stays widened as well (no CPU fp8 arithmetic) */
    const uint64_t expect = ROWS * KIN + ROWS * 4 + 16 * 4 + 8 * 4 + 8 * 8 * 2 + 8 * 16 * 2;
    printf("native: owned %llu bytes (widening: %llu)\n", (unsigned long long)native, (unsigned long long)widened);
    CHECK_MSG(native >= expect && native < expect + 6 * 64 && widened > ROWS * KIN * 2 + 16 * 8 * 2,
              "owned bytes %llu (expected about %llu), widened %llu", (unsigned long long)native,
              (unsigned long long)expect, (unsigned long long)widened);
    CHECK_MSG(h3_sf_qweight(&st, "blocks.0.attn.qkv_proj.weight", ROWS, KIN, &w) == 1, "%s", h3_last_error());
    CHECK(w.dtype == H3_DT_I8 && w.group == 16 && !w.widened);
    int bad = 0;
    for (int r = 0; w.q && r < ROWS; r++) {
        const int h = r / (3 * D), part = (r / D) % 3, dd = r % D, src = part * HEADS * D + h * D + dd;
        bad += memcmp((const int8_t *)w.q + r * KIN, qq + src * KIN, KIN) != 0 || w.scale[r] != sq[src];
    }
    CHECK_MSG(bad == 0, "%d QKV code rows or scales are not the file's in libh3's row order", bad);
    {
        bool ok;
        const double err = linear_i8_err(be, 11, ROWS, KIN, 16, false, w.q, w.scale, &ok);
        CHECK_MSG(ok && err < 2e-6, "the file's QKV codes through the backend: error %g", err);
    }
    CHECK(h3_sf_qweight(&st, "blocks.0.mlp.fc1.weight", 16, 8, &w) == 1);
    CHECK(w.dtype == H3_DT_I8 && w.group == 0 && !w.widened && memcmp(w.q, q1, sizeof q1) == 0);
    for (int r = 0; r < 16; r++) bad += w.scale[r] != s1;
    CHECK(h3_sf_qweight(&st, "blocks.0.mlp.fc2.weight", 8, 16, &w) == 1);
    CHECK(w.dtype == H3_DT_F8_E4M3 && w.widened && memcmp(w.q, f8, sizeof f8) == 0);
    for (int r = 0; r < 8; r++) bad += w.scale[r] != s8;
    CHECK_MSG(bad == 0, "%d broadcast scales differ", bad);
    CHECK(h3_sf_qweight(&st, "blocks.0.adaln_proj.linear.weight", 8, 8, &w) == 1 && w.widened);
    const int64_t sh[2] = {8, 8};
    const uint16_t *ada = h3_store_get(&st, "blocks.0.adaln_proj.linear.weight", H3_DT_BF16, 2, sh);
    CHECK(ada && ada[9] == ref_bf16((double)qa[9] * 0.003f));
    CHECK(h3_sf_native(&st, false, false, NULL) == -H3_E_INVALID); /* too late: the data was read */
    /* h3_sf_widen (a LoRA after all): the left-out BF16 forms written now, equal to the widening path's */
    CHECK(h3_sf_widen(&st) == 0);
    const int64_t shq[2] = {ROWS, KIN};
    const uint16_t *wq = h3_store_get(&st, "blocks.0.attn.qkv_proj.weight", H3_DT_BF16, 2, shq);
    CHECK(wq != NULL);
    for (int r = 0; wq && r < ROWS; r++) {
        const int h = r / (3 * D), part = (r / D) % 3, dd = r % D, src = part * HEADS * D + h * D + dd;
        for (int a = 0; a < KIN; a++) {
            long sum = 0;
            for (int b2 = 0; b2 < KIN; b2++) sum += hsign(a, b2) * qq[src * KIN + b2];
            bad += wq[r * KIN + a] != ref_bf16((double)sum * (double)sq[src] / 4.0);
        }
    }
    CHECK_MSG(bad == 0, "%d widened values differ after h3_sf_widen", bad);
    CHECK(h3_sf_qweight(&st, "blocks.0.attn.qkv_proj.weight", ROWS, KIN, &w) == 1 && w.widened);
    h3_store_close(&st);
    unlink(p);
    free(p);
    h3_backend_destroy(be);
    h3_pool_destroy(pool);
}

static void test_bf16_rounding(void)
{
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        double x = ldexp((double)frand(), (int)(frand() * 60.0f));
        bad += h3_bf16_from_double(x) != ref_bf16(x);
    }
    /* ties: exactly halfway between two bf16 values goes to the even one */
    bad += h3_bf16_from_double(1.0 + ldexp(1.0, -8)) != 0x3f80;
    bad += h3_bf16_from_double(1.0 + 3 * ldexp(1.0, -8)) != 0x3f82;
    CHECK_MSG(bad == 0, "%d roundings differ", bad);
}

/* SINGLE REF HEADS [ROPE_FREQ THETA | video_vae]: REF's tensors equal SINGLE's presented ones byte for byte. */
static int compare(const char *single, const char *ref, h3_component comp, int heads, int rope_freq, double theta)
{
    h3_store a, b;
    memset(&b, 0, sizeof b);
    char desc[256];
    if (h3_sf_open_rope(&a, single, comp, heads, rope_freq, theta, desc, sizeof desc) ||
        h3_store_add_file(&b, ref)) {
        fprintf(stderr, "%s\n", h3_last_error());
        return 2;
    }
    size_t same = 0, differ = 0;
    for (size_t i = 0; i < b.ntensors; i++) {
        const h3_tensor *t = &b.tensors[i];
        const char *n = h3_tensor_name(&b, t);
        const void *x = h3_store_get(&a, n, t->dtype, t->ndim, t->shape);
        const void *y = h3_store_get(&b, n, t->dtype, t->ndim, t->shape);
        if (x && y && memcmp(x, y, (size_t)(t->end - t->begin)) == 0) {
            same++;
        } else {
            differ++;
            fprintf(stderr, "differs: %s (%s)\n", n, x ? "values" : h3_last_error());
        }
    }
    printf("compare: %zu tensors equal, %zu differ; %s\n", same, differ, desc);
    h3_store_close(&a);
    h3_store_close(&b);
    return differ ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[4], "video_vae") == 0)
        return compare(argv[1], argv[2], H3_COMP_VIDEO_VAE, atoi(argv[3]), 0, 0.0);
    if (argc == 4 || argc == 6)
        return compare(argv[1], argv[2], H3_COMP_TRANSFORMER, atoi(argv[3]), argc == 6 ? atoi(argv[4]) : 0,
                       argc == 6 ? atof(argv[5]) : 0.0);
    const char *tmp = getenv("TMPDIR");
    snprintf(dir_, sizeof dir_, "%s/h3sf-XXXXXX", tmp && tmp[0] && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(dir_)) return 2;
    test_bf16_rounding();
    test_quantised();
    test_native_int8();
    rmdir(dir_);
    CTEST_END();
}
