/* JSON reader and safetensors validation: accepted and rejected inputs, with their messages. */
#include "ctest.h"
#include "core/internal.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int parse(const char *s)
{
    h3_json d;
    int rc = h3_json_parse(&d, s, strlen(s));
    if (rc == 0) h3_json_free(&d);
    return rc;
}

static void test_json(void)
{
    CHECK(parse("{}") == 0);
    CHECK(parse(" [1, -2.5e3, true, false, null, \"x\"] ") == 0);
    CHECK(parse("{\"a\":{\"b\":[[],{}]}}") == 0);
    CHECK(parse("\"\\ud83d\\ude00 \\u00e9\"") == 0);
    CHECK(parse("") != 0);
    CHECK(parse("{") != 0);
    CHECK(parse("[1,]") != 0);
    CHECK(parse("{\"a\" 1}") != 0);
    CHECK(parse("01") != 0);
    CHECK(parse("1.") != 0);
    CHECK(parse("\"\\ud800\"") != 0);
    CHECK(parse("\"a\nb\"") != 0);
    CHECK(parse("\"\xc3\x28\"") != 0);
    CHECK(parse("{} x") != 0);
    CHECK(strstr(h3_last_error(), "line 1, column 4") != NULL);
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    CHECK(parse((char[]){0}) != 0);
    h3_json d;
    CHECK(h3_json_parse(&d, deep, 600) != 0);
    CHECK(strstr(h3_last_error(), "nesting") != NULL);

    const char *doc = "{\"n\": 9007199254740993, \"f\": 0.5, \"s\": \"h\\u00e9\", \"k\": {\"x\": [1,2,3]}}";
    CHECK(h3_json_parse(&d, doc, strlen(doc)) == 0);
    const h3j *r = h3j_root(&d);
    const h3j *n = h3j_get(&d, r, "n");
    CHECK(n && n->is_int && n->i == 9007199254740993LL);
    CHECK(h3j_get(&d, r, "f")->num == 0.5 && !h3j_get(&d, r, "f")->is_int);
    CHECK(strcmp(h3j_str(&d, h3j_get(&d, r, "s")), "h\xc3\xa9") == 0);
    CHECK(h3j_at(&d, h3j_path(&d, r, "k", "x", NULL), 2)->i == 3);
    int64_t v;
    CHECK(h3_cfg_int(&d, r, &v, "missing", "n", (const char *)NULL) == 0 && v == 9007199254740993LL);
    h3_json_free(&d);
}

static size_t build(uint8_t *out, const char *hdr, size_t data)
{
    size_t h = strlen(hdr);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(out + 8, hdr, h);
    memset(out + 8 + h, 0, data);
    return 8 + h + data;
}

static void expect_bad(const char *hdr, size_t data, const char *needle)
{
    uint8_t buf[4096];
    size_t n = build(buf, hdr, data);
    int rc = h3_store_check_buffer(buf, n, "t.safetensors");
    CHECK_MSG(rc != 0, "accepted: %s", hdr);
    CHECK_MSG(strstr(h3_last_error(), needle) != NULL, "message '%s' lacks '%s'", h3_last_error(), needle);
    CHECK_MSG(strncmp(h3_last_error(), "t.safetensors", 13) == 0, "message does not name the file: %s",
              h3_last_error());
}

static void test_safetensors_buffers(void)
{
    uint8_t buf[4096];
    size_t n = build(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                          "\"__metadata__\":{\"format\":\"pt\"}}   ", 24);
    CHECK(h3_store_check_buffer(buf, n, "ok") == 0);
    n = build(buf, "{}", 0);
    CHECK(h3_store_check_buffer(buf, n, "empty") == 0);
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "span holds 4 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, "runs past the data area");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "end 0 < begin 4");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "unindexed bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6, "trailing bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "appears twice");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,4]}}", 4, "overflows");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets");
    expect_bad("{\"a\":[1]}", 0, "not an object");
    expect_bad("[]", 0, "not start with '{'");
    expect_bad("{\"a\":1", 0, "malformed safetensors header");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "not a string");
    /* length prefix past the end of the file */
    n = build(buf, "{}", 0);
    buf[0] = 200;
    CHECK(h3_store_check_buffer(buf, n, "t.safetensors") != 0);
    CHECK(strstr(h3_last_error(), "runs past the end") != NULL);
    CHECK(h3_store_check_buffer(buf, 5, "t.safetensors") != 0);
    CHECK(strstr(h3_last_error(), "too short") != NULL);
}

static void test_store_files(void)
{
    char dir[] = "/tmp/h3-st-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p1[256], p2[256], idx[256];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    uint8_t buf[512];
    size_t n = build(buf, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8);
    uint16_t one = 0x3F80;
    memcpy(buf + n - 8, &one, 2);
    FILE *f = fopen(p1, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    n = build(buf, "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    f = fopen(p2, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    f = fopen(idx, "w");
    fprintf(f, "{\"metadata\":{},\"weight_map\":{\"w\":\"model-00001-of-00002.safetensors\","
               "\"b\":\"model-00002-of-00002.safetensors\"}}");
    fclose(f);
    h3_store s;
    CHECK(h3_store_open_dir(&s, dir, NULL) == 0);
    CHECK(s.nfiles == 2 && s.ntensors == 2);
    const uint16_t *w = h3_store_get(&s, "w", H3_DT_BF16, 2, (int64_t[]){2, 2});
    CHECK(w && w[0] == 0x3F80);
    CHECK(h3_store_get(&s, "w", H3_DT_F32, 2, (int64_t[]){2, 2}) == NULL);
    CHECK(strstr(h3_last_error(), "is BF16, expected F32") != NULL);
    CHECK(h3_store_get(&s, "w", H3_DT_BF16, 1, (int64_t[]){4}) == NULL);
    CHECK(strstr(h3_last_error(), "has shape [2, 2], expected [4]") != NULL);
    CHECK(h3_store_get(&s, "nope", H3_DT_F32, 1, (int64_t[]){1}) == NULL);
    CHECK(strstr(h3_last_error(), "'nope' is missing") != NULL);
    h3_store_close(&s);
    /* index naming a shard that is not there */
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"w\":\"model-00001-of-00002.safetensors\",\"b\":\"gone.safetensors\"}}");
    fclose(f);
    CHECK(h3_store_open_dir(&s, dir, NULL) != 0);
    CHECK(strstr(h3_last_error(), "gone.safetensors") != NULL);
    /* index placing a tensor in the wrong shard */
    f = fopen(idx, "w");
    fprintf(f, "{\"weight_map\":{\"w\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}");
    fclose(f);
    CHECK(h3_store_open_dir(&s, dir, NULL) != 0);
    /* duplicate names across shards (no index) */
    unlink(idx);
    n = build(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    f = fopen(p2, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
    CHECK(h3_store_open_dir(&s, dir, NULL) != 0);
    CHECK(strstr(h3_last_error(), "duplicate name across shards") != NULL);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A shared-weight Ref2VA transformer: its own shard holds the fine-tuned "a", FL2VA's holds "a" and "b";
   the index takes only "b" from FL2VA's. */
static void test_shared_shards(void)
{
    char root[] = "/tmp/h3-shared-XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char fl[300], ref[300], p[400];
    snprintf(p, sizeof p, "%s/FL2VA", root), mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/Ref2VA", root), mkdir(p, 0755);
    snprintf(fl, sizeof fl, "%s/FL2VA/transformer", root), mkdir(fl, 0755);
    snprintf(ref, sizeof ref, "%s/Ref2VA/transformer", root), mkdir(ref, 0755);
    uint8_t buf[512];
    const float fl_data[2] = {1.0f, 2.0f}, ref_data[1] = {5.0f};
    size_t n = build(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    memcpy(buf + n - 8, fl_data, 8);
    snprintf(p, sizeof p, "%s/model.safetensors", fl), write_file(p, buf, n);
    n = build(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    memcpy(buf + n - 4, ref_data, 4);
    snprintf(p, sizeof p, "%s/model.safetensors", ref), write_file(p, buf, n);
    char idx[400];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", ref);
    const char *good = "{\"weight_map\":{\"a\":\"model.safetensors\",\"b\":\"../../FL2VA/transformer/model.safetensors\"}}";
    write_file(idx, good, strlen(good));
    h3_store s;
    CHECK(h3_store_open_dir(&s, ref, fl) == 0);
    CHECK(s.nfiles == 2 && s.ntensors == 2 && s.bytes == 8);
    const float *a = h3_store_get(&s, "a", H3_DT_F32, 1, (int64_t[]){1});
    const float *b = h3_store_get(&s, "b", H3_DT_F32, 1, (int64_t[]){1});
    CHECK(a && b && a[0] == 5.0f && b[0] == 2.0f);
    h3_store_close(&s);
    /* the same index without the permission: today's refusal */
    CHECK(h3_store_open_dir(&s, ref, NULL) != 0);
    CHECK(strstr(h3_last_error(), "weight_map names '../../FL2VA/transformer/model.safetensors'") != NULL);
    /* other relative names stay refused with the permission */
    static const char *bad[] = {"../x.safetensors", "../../Ref2VA/transformer/model.safetensors", "/abs/x",
                                "../../FL2VA/transformer/../../x", "../../FL2VA/transformer/", "../../FL2VA/transformer/.."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[300];
        snprintf(text, sizeof text, "{\"weight_map\":{\"a\":\"model.safetensors\",\"b\":\"%s\"}}", bad[i]);
        write_file(idx, text, strlen(text));
        CHECK(h3_store_open_dir(&s, ref, fl) != 0);
        CHECK(strstr(h3_last_error(), "which is not a file in") != NULL);
    }
    /* a missing shared shard */
    const char *gone = "{\"weight_map\":{\"a\":\"model.safetensors\",\"b\":\"../../FL2VA/transformer/gone.safetensors\"}}";
    write_file(idx, gone, strlen(gone));
    CHECK(h3_store_open_dir(&s, ref, fl) != 0);
    CHECK(strstr(h3_last_error(), "shared shard '../../FL2VA/transformer/gone.safetensors'") != NULL);
    /* a tensor listed for the shared shard but absent there */
    const char *absent = "{\"weight_map\":{\"a\":\"model.safetensors\",\"b\":\"../../FL2VA/transformer/model.safetensors\","
                         "\"c\":\"../../FL2VA/transformer/model.safetensors\"}}";
    write_file(idx, absent, strlen(absent));
    CHECK(h3_store_open_dir(&s, ref, fl) != 0);
    CHECK(strstr(h3_last_error(), "'c' is listed but not in shard ../../FL2VA/transformer/model.safetensors") != NULL);
    /* a local file with the shared shard's base name does not stand in for it: "b" is in FL2VA's file only */
    const char *local = "{\"weight_map\":{\"a\":\"../../FL2VA/transformer/model.safetensors\",\"b\":\"model.safetensors\"}}";
    write_file(idx, local, strlen(local));
    CHECK(h3_store_open_dir(&s, ref, fl) != 0);
    snprintf(p, sizeof p, "%s/model.safetensors", ref), unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", fl), unlink(p);
    unlink(idx), rmdir(ref), rmdir(fl);
    snprintf(p, sizeof p, "%s/FL2VA", root), rmdir(p);
    snprintf(p, sizeof p, "%s/Ref2VA", root), rmdir(p);
    rmdir(root);
}

int main(void)
{
    test_json();
    test_safetensors_buffers();
    test_store_files();
    test_shared_shards();
    CTEST_END();
}
