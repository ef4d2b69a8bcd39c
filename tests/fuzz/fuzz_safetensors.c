/*
 * Fuzz target: any byte string handed to the safetensors header validator must either validate
 * or fail with a message, never crash, leak or trip UBSan. libFuzzer-compatible entry point; with
 * gcc it runs under tests/fuzz/driver.c, a small coverage-guided loop built on gcc's trace-pc.
 */
#include "core/internal.h"

#include <stdint.h>
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
