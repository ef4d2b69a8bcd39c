/*
 * Fuzz target: any byte string handed to the safetensors header validator must either validate
 * or fail with a message, never crash, leak or trip UBSan. libFuzzer-compatible entry point; with
 * gcc it runs under tests/fuzz/driver.c, a small coverage-guided loop built on gcc's trace-pc.
 */
#include "core/internal.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    h3_err_clear();
    int rc = h3_store_check_buffer(data, size, "<fuzz>");
    /* A failure must come with a message; success with none. */
    if (rc != 0 && h3_last_error()[0] == 0) __builtin_trap();
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
};
#define NSEEDS (sizeof k_headers / sizeof *k_headers)

static const char *const k_dict[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"F16\"",
    "\"I64\"", "\"F8_E4M3\"", "\"U8\"", "\"BOOL\"", "[", "]", "{", "}", ",", ":", "0", "1", "-1",
    "18446744073709551615", "9223372036854775808", "1e309", "1.5", "\"\\u0000\"", "\"\\ud800\"",
    "\"\\ud83d\\ude00\"", "null", "true", "false", "\"a\"", " ", "\"\\", "\xff", "\xc3\xa9",
};

const fuzz_target *fuzz_target_info(void)
{
    static uint8_t bufs[NSEEDS][512];
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
