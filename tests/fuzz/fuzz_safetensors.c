/*
 * Fuzz target: any byte string handed to the safetensors header validator must either validate
 * or fail with a message, never crash, leak or trip UBSan. libFuzzer-compatible entry point; with
 * gcc it runs under tests/fuzz/driver.c, a small coverage-guided loop built on gcc's trace-pc.
 */
#define _GNU_SOURCE
#include "core/internal.h"
#include "core/singlefile.h"
#include "fuzz.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static bool every_name(const char *name)
{
    (void)name;
    return true;
}

/* A header that validates is also read as a single-file transformer (core/singlefile.c): the name mapping,
   the comfy_quant / _quantization_metadata JSON, the refusals, and (when it opens) the dequantisation jobs. */
static void single_file(const uint8_t *data, size_t size)
{
#if defined(__linux__) && defined(MFD_CLOEXEC)
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return;
    if (write(fd, data, size) == (ssize_t)size) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        h3_store st;
        char desc[256];
        h3_err_clear();
        int rc = h3_sf_open(&st, path, H3_COMP_TRANSFORMER, 2, desc, sizeof desc);
        if (rc != 0 && h3_last_error()[0] == 0) __builtin_trap();
        if (rc == 0) {
            h3_store_ready(&st);
            h3_store_close(&st);
        }
        /* Again with the stored codes on (h3_sf_native: int8 and fp8, every int8 layer's BF16 form left out), and
           every presented 2-D tensor asked for its codes, as the transformer and the memory estimate ask. */
        if (rc == 0 && h3_sf_open(&st, path, H3_COMP_TRANSFORMER, 2, NULL, 0) == 0) {
            if (h3_sf_native(&st, true, true, every_name) == 0) {
                uint64_t a, b;
                h3_sf_native_bytes(&st, NULL, &a, &b);
                for (size_t i = 0; i < st.ntensors; i++) {
                    const h3_tensor *t = &st.tensors[i];
                    const h3_tensor *c, *sc;
                    int group;
                    h3_sf_qw q;
                    if (t->ndim != 2) continue;
                    h3_sf_codes_of(&st, h3_tensor_name(&st, t));
                    h3_sf_qtensor(&st, h3_tensor_name(&st, t), &c, &sc, &group);
                    if (h3_sf_qweight(&st, h3_tensor_name(&st, t), t->shape[0], t->shape[1], &q) < 0 &&
                        h3_last_error()[0] == 0)
                        __builtin_trap();
                }
            }
            h3_store_close(&st);
        }
    }
    close(fd);
#else
    (void)data;
    (void)size;
#endif
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    h3_err_clear();
    int rc = h3_store_check_buffer(data, size, "<fuzz>");
    /* A failure must come with a message; success with none. */
    if (rc != 0 && h3_last_error()[0] == 0) __builtin_trap();
    if (rc == 0) single_file(data, size);
    /* The same bytes as a bare JSON document exercise the reader on its own. */
    h3_json doc;
    if (h3_json_parse(&doc, (const char *)data, size) == 0) {
        const h3j *r = h3j_root(&doc);
        if (!r) __builtin_trap();
        h3_json_free(&doc);
    }
    return 0;
}

/* ---- seeds for tests/fuzz/driver.c -------------------------------------------------------- */

/* Well-formed files: 8-byte length, JSON header, data area. */
static const char *k_headers[][2] = {
    {"{}", "0"},
    {"{\"__metadata__\":{\"format\":\"pt\"}}", "0"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", "24"},
    {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"I64\",\"shape\":[],"
     "\"data_offsets\":[8,16]},\"__metadata__\":{\"k\":\"v\"}}", "16"},
    {"{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[0,5],\"data_offsets\":[0,0]},\"y\":{\"dtype\":\"U8\",\"shape\":[3],"
     "\"data_offsets\":[0,3]}}  ", "3"},
    /* single files: a transformer's identity, a [q;k;v] projection, quantised layers in both spellings */
    {"{\"blocks.0.attn.qkv_proj.weight\":{\"dtype\":\"I8\",\"shape\":[6,4],\"data_offsets\":[0,24]},"
     "\"blocks.0.attn.qkv_proj.weight_scale\":{\"dtype\":\"F32\",\"shape\":[6,1],\"data_offsets\":[24,48]},"
     "\"condition_proj.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[48,52]},"
     "\"audio_patch_proj.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[52,56]},"
     "\"__metadata__\":{\"_quantization_metadata\":\"{\\\"layers\\\":{\\\"blocks.0.attn.qkv_proj\\\":"
     "{\\\"format\\\":\\\"int8_tensorwise\\\",\\\"convrot\\\":true,\\\"convrot_groupsize\\\":4}}}\"}}", "56"},
    {"{\"model.diffusion_model.blocks.0.attn.qkv_proj.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[6,2],"
     "\"data_offsets\":[0,12]},\"model.diffusion_model.blocks.0.attn.qkv_proj.weight_scale\":{\"dtype\":\"F32\","
     "\"shape\":[],\"data_offsets\":[12,16]},\"model.diffusion_model.condition_proj.weight\":{\"dtype\":\"BF16\","
     "\"shape\":[2],\"data_offsets\":[16,20]},\"model.diffusion_model.audio_patch_proj.weight\":{\"dtype\":"
     "\"BF16\",\"shape\":[2],\"data_offsets\":[20,24]},\"scaled_fp8\":{\"dtype\":\"F8_E4M3\",\"shape\":[],"
     "\"data_offsets\":[24,25]},\"adaln_t_table\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[25,33]}}",
     "33"},
};
#define NSEEDS (sizeof k_headers / sizeof *k_headers)

static const char *const k_dict[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"F16\"",
    "\"I64\"", "\"F8_E4M3\"", "\"U8\"", "\"BOOL\"", "[", "]", "{", "}", ",", ":", "0", "1", "-1",
    "18446744073709551615", "9223372036854775808", "1e309", "1.5", "\"\\u0000\"", "\"\\ud800\"",
    "\"\\ud83d\\ude00\"", "null", "true", "false", "\"a\"", " ", "\"\\", "\xff", "\xc3\xa9",
    "\"I8\"", "\"F8_E5M2\"", "model.diffusion_model.", ".attn.qkv_proj.weight", ".weight_scale", ".comfy_quant",
    "\"scaled_fp8\"", "\"adaln_t_table\"", "lora_A.", "convrot_groupsize", "int8_tensorwise", "float8_e4m3fn",
};

const fuzz_target *fuzz_target_info(void)
{
    static uint8_t bufs[NSEEDS][1024];
    static fuzz_input seeds[NSEEDS];
    static fuzz_target t = {"fuzz_safetensors", 4096, seeds, NSEEDS, k_dict, sizeof k_dict / sizeof *k_dict, 1};
    for (size_t i = 0; i < NSEEDS; i++) {
        size_t h = strlen(k_headers[i][0]), data = (size_t)atoi(k_headers[i][1]);
        for (int b = 0; b < 8; b++) bufs[i][b] = (uint8_t)((uint64_t)h >> (8 * b));
        memcpy(bufs[i] + 8, k_headers[i][0], h);
        memset(bufs[i] + 8 + h, 0x3f, data);
        seeds[i].data = bufs[i];
        seeds[i].size = 8 + h + data;
    }
    return &t;
}
