/* The pieces of `h3ctl quantize` in C (plain and under ASan+UBSan): SHA-256 against FIPS 180-4's examples, the e4m3
   conversion's edges, the atomic safetensors writer, and h3-tiny's file written, checked and refused when altered.
   tests/test_quantize.py checks the values against torch. */
#include "ctest.h"
#include "core/fp8.h"
#include "models/dit_fp8file.h"
#include "models/dit_internal.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define TINY "python/h3ctl/models/h3-tiny"

static char g_dir[256];

static void sha(const char *msg, const char *want)
{
    h3_sha256 s;
    char hex[65];
    h3_sha256_init(&s);
    /* in two parts, so the buffering across calls is exercised too */
    const size_t n = strlen(msg);
    h3_sha256_update(&s, msg, n / 3);
    h3_sha256_update(&s, msg + n / 3, n - n / 3);
    h3_sha256_hex(&s, hex);
    CHECK_MSG(strcmp(hex, want) == 0, "sha256(\"%s\") = %s", msg, hex);
}

static void test_sha256(void)
{
    sha("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_e4m3(void)
{
    const struct {
        float x;
        uint8_t q;
    } k[] = {{0.0f, 0x00},       {-0.0f, 0x80},     {448.0f, 0x7E},   {-448.0f, 0xFE}, {464.0f, 0x7E},
             {464.01f, 0x7E},    {1e30f, 0x7E},     {-INFINITY, 0xFE}, {INFINITY, 0x7E}, {NAN, 0x7F},
             {-NAN, 0x7F},       {1.0f, 0x38},      {0x1p-9f, 0x01},   {0x1p-10f, 0x00}, {0x1.8p-10f, 0x01},
             {0x1.8p-9f, 0x02},  {0x1p-6f, 0x08},   {1.0625f, 0x38},   {1.1875f, 0x3A},  {-3.5f, 0xC6}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        CHECK_MSG(h3_e4m3_from_f32(k[i].x) == k[i].q, "e4m3(%a) = 0x%02x, want 0x%02x", (double)k[i].x,
                  h3_e4m3_from_f32(k[i].x), k[i].q);
}

static bool dir_has_only(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = true;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (!name || strcmp(e->d_name, name))) ok = false;
    closedir(d);
    return ok;
}

static void test_writer(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/w.safetensors", g_dir);
    const float v[3] = {1, 2, 3};
    const uint8_t b[4] = {1, 2, 3, 4};
    const h3_st_entry e[2] = {{"v", H3_DT_F32, 1, {3}}, {"b", H3_DT_U8, 2, {2, 2}}};
    const char *const meta[][2] = {{"k", "a \"quoted\" value"}};
    h3_st_writer w;
    CHECK(h3_st_writer_open(&w, path, false, e, 2, meta, 1) == 0);
    CHECK(h3_st_writer_write(&w, v, sizeof v) == 0);
    CHECK(!h3_is_file(path)); /* nothing at the destination before the commit */
    CHECK(h3_st_writer_commit(&w) == -H3_E_INVALID); /* refused: bytes short */
    CHECK(strstr(h3_last_error(), "12 of the 16 data bytes") != NULL);
    CHECK(h3_st_writer_write(&w, b, 4) == 0 && h3_st_writer_commit(&w) == 0);
    h3_st_writer_abort(&w);
    CHECK(h3_safetensors_check(path) == 0 && dir_has_only(g_dir, "w.safetensors"));
    h3_store s = {0};
    CHECK(h3_store_add_file(&s, path) == 0);
    const int64_t shp = 3, shp2[2] = {2, 2};
    const float *got = h3_store_get(&s, "v", H3_DT_F32, 1, &shp);
    const uint8_t *gb = h3_store_get(&s, "b", H3_DT_U8, 2, shp2);
    CHECK(got && got[2] == 3.0f && gb && gb[3] == 4);
    h3_store_close(&s);
    /* an existing file: refused without overwrite, kept; an aborted write leaves nothing */
    CHECK(h3_st_writer_open(&w, path, false, e, 2, meta, 1) == -H3_E_IO);
    CHECK(strstr(h3_last_error(), "already exists") != NULL);
    CHECK(h3_st_writer_open(&w, path, true, e, 1, NULL, 0) == 0);
    h3_st_writer_abort(&w);
    CHECK(dir_has_only(g_dir, "w.safetensors") && h3_safetensors_check(path) == 0);
    unlink(path);
}

static int quantize_tiny(const char *path, int overwrite)
{
    return h3_quantize(TINY, 0, H3_PRECISION_FP8, 2, path, overwrite, NULL, NULL);
}

/* A backend that takes pre-quantised weights as views (the CPU's table plus weight_load_fp8): how the
   transformer hands the file's weights to a backend can be watched without a GPU. */
static int g_fp8_loads;
static int view_fp8(h3_backend *be, const uint8_t *q, const float *scale, int64_t rows, int64_t cols, h3_bw *out)
{
    (void)be;
    (void)scale;
    g_fp8_loads++;
    *out = (h3_bw){q, H3_DT_F8_E4M3, rows, cols, NULL};
    return 0;
}

static void test_transformer_open(h3_model *m, h3_fp8file *f)
{
    h3_pool *pool = h3_pool_create(1);
    h3_backend *cpu = NULL;
    CHECK(h3_backend_cpu_create(pool, &cpu) == 0);
    if (!cpu) return;
    h3_dit_open_opts o = {0};
    o.precision = H3_PRECISION_FP8;
    o.fp8file = f;
    h3_dit *d = NULL;
    /* The CPU has no fp8 GEMM: the weight is named in the refusal. */
    CHECK(h3_dit_open_ex(m, pool, cpu, 0, &o, &d) == -H3_E_UNSUPPORTED && !d);
    CHECK(strstr(h3_last_error(), "blocks.0.attn.qkv_proj.weight") &&
          strstr(h3_last_error(), "cannot use pre-quantised fp8 weights"));
    /* LoRA files would change the weights the file holds. */
    const char *lora = "none.safetensors";
    o.lora_paths = &lora;
    o.n_lora = 1;
    CHECK(h3_dit_open_ex(m, pool, cpu, 0, &o, &d) == -H3_E_UNSUPPORTED && strstr(h3_last_error(), "LoRA"));
    o.lora_paths = NULL;
    o.n_lora = 0;
    /* Every main-block GEMM weight comes from the file, the file's own bytes; nothing else does. */
    h3_backend_weights wt = *cpu->weights;
    wt.weight_load_fp8 = view_fp8;
    const h3_backend_weights *keep = cpu->weights;
    const uint32_t keep_caps = cpu->caps;
    cpu->weights = &wt;
    cpu->caps |= H3_CAP_FP8_WEIGHTS;
    g_fp8_loads = 0;
    CHECK_MSG(h3_dit_open_ex(m, pool, cpu, 0, &o, &d) == 0, "%s", h3_last_error());
    if (d) {
        CHECK(g_fp8_loads == 4 * d->w.c.layers && d->w.c.layers > 0);
        for (int i = 0; i < d->w.c.layers; i++)
            for (int k = 0; k < H3_DIT_GEMMS; k++) {
                char name[112];
                snprintf(name, sizeof name, "blocks.%d.%s.weight", i, h3_dit_gemm_part(k));
                const h3_bw *w = dit_gemm(&d->w.blk[i], k);
                const uint8_t *q = NULL;
                const float *s = NULL;
                CHECK(h3_fp8file_get(f, name, w->rows, w->cols, &q, &s) == 0 && w->data == q);
                CHECK(w->dtype == H3_DT_F8_E4M3);
            }
        CHECK(d->w.ref[0].qkv.dtype == H3_DT_BF16); /* the refiner keeps the exact path */
        h3_dit_close(d);
    }
    cpu->weights = keep;
    cpu->caps = keep_caps;
    h3_backend_destroy(cpu);
    h3_pool_destroy(pool);
}

static void test_tiny_file(void)
{
    if (!h3_is_dir(TINY)) {
        printf("skip: %s is not here (run from the repository root)\n", TINY);
        return;
    }
    char path[300], bad[300];
    snprintf(path, sizeof path, "%s/tiny.safetensors", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", g_dir);
    CHECK_MSG(quantize_tiny(path, 0) == 0, "%s", h3_last_error());
    CHECK(quantize_tiny(path, 0) == -H3_E_IO && quantize_tiny(path, 1) == 0);
    CHECK(h3_quantize(TINY, 0, H3_PRECISION_INT8, 1, bad, 0, NULL, NULL) == -H3_E_UNSUPPORTED);
    h3_model m;
    CHECK(h3_model_open(&m, TINY, 0) == 0);
    h3_fp8file *f = NULL;
    CHECK_MSG(h3_fp8file_open(&m, path, &f) == 0, "%s", h3_last_error());
    /* the stored weight is the host quantisation of the stored bf16 one */
    const int64_t shape[2] = {1152, 256};
    h3_dtype dt;
    const void *w = h3_store_get_float(&m.comp[H3_COMP_TRANSFORMER].store, "blocks.1.attn.qkv_proj.weight", 2,
                                       shape, &dt);
    const uint8_t *q = NULL;
    const float *s = NULL;
    CHECK(f && h3_fp8file_get(f, "blocks.1.attn.qkv_proj.weight", 1152, 256, &q, &s) == 0);
    uint8_t *q2 = malloc(1152 * 256);
    float *s2 = malloc(1152 * sizeof(float));
    h3_pool *pool = h3_pool_create(2);
    CHECK(w && q && q2 && s2 && h3_fp8_quantize(pool, w, dt, 1152, 256, q2, s2) == 0);
    CHECK(q && q2 && memcmp(q, q2, 1152 * 256) == 0 && memcmp(s, s2, 1152 * sizeof(float)) == 0);
    h3_pool_destroy(pool);
    free(q2);
    free(s2);
    test_transformer_open(&m, f);
    h3_fp8file_close(f);
    /* one changed byte of the identity in the header, or a cut file: refused with the reason */
    char *buf;
    size_t len;
    CHECK(h3_read_file(path, &buf, &len, (size_t)64 << 20) == 0);
    char *id = strstr(buf + 8, "\"h3ctl.identity\":\"");
    CHECK(id != NULL);
    if (id) {
        char *c = id + strlen("\"h3ctl.identity\":\"");
        *c = *c == '0' ? '1' : '0';
        FILE *o = fopen(bad, "wb");
        CHECK(o && fwrite(buf, 1, len, o) == len);
        if (o) fclose(o);
        CHECK(h3_fp8file_open(&m, bad, &f) == -H3_E_INVALID && f == NULL);
        CHECK(strstr(h3_last_error(), "another checkpoint") != NULL);
        CHECK(truncate(bad, (off_t)len / 2) == 0);
        CHECK(h3_fp8file_open(&m, bad, &f) == -H3_E_FORMAT && strstr(h3_last_error(), "truncated") != NULL);
        unlink(bad);
    }
    free(buf);
    h3_model_close(&m);
    /* Ref2VA's transformer is another model: FL2VA's file is refused there */
    CHECK(h3_model_open(&m, TINY, H3_OPT_REF2VA) == 0);
    CHECK(h3_fp8file_open(&m, path, &f) == -H3_E_INVALID && strstr(h3_last_error(), "Ref2VA") != NULL);
    h3_model_close(&m);
    unlink(path);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/h3_fp8file_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    test_sha256();
    test_e4m3();
    test_writer();
    test_tiny_file();
    CHECK(dir_has_only(g_dir, NULL)); /* no temporary file left anywhere */
    rmdir(g_dir);
    printf("%d checks, %d failures\n", ctest_checks, ctest_failures);
    return ctest_failures != 0;
}
