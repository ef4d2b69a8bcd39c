/*
 * What a fuzz target hands tests/fuzz/driver.c besides LLVMFuzzerTestOneInput: its name, the
 * seed inputs the corpus starts from, tokens the mutator splices in, and whether inputs start
 * with a safetensors-style 8-byte length prefix the mutator should keep plausible. A libFuzzer
 * build (clang -fsanitize=fuzzer) ignores fuzz_target_info and uses its own corpus instead.
 */
#ifndef H3_FUZZ_H
#define H3_FUZZ_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const uint8_t *data;
    size_t size;
} fuzz_input;

typedef struct {
    const char *name;          /* printed in the summary line */
    size_t max_len;            /* longest input the mutator builds */
    const fuzz_input *seeds;   /* at least one */
    size_t nseeds;
    const char *const *dict;   /* NUL-terminated tokens */
    size_t ndict;
    int length_prefix;         /* inputs begin with a u64 little-endian length (safetensors) */
} fuzz_target;

/* Defined by each target; called once, before the first execution. */
const fuzz_target *fuzz_target_info(void);

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF); NUL bytes allowed. */
static inline bool utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!k || i + k > n) return false;
        unsigned cp = k == 1 ? c : c & (0x7F >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

#endif
