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
    rmdir(dir_);
    CTEST_END();
}
