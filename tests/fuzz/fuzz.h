/*
 * What a fuzz target hands tests/fuzz/driver.c besides LLVMFuzzerTestOneInput: its name, the
 * seed inputs the corpus starts from, tokens the mutator splices in, and whether inputs start
 * with a safetensors-style 8-byte length prefix the mutator should keep plausible. A libFuzzer
 * build (clang -fsanitize=fuzzer) ignores fuzz_target_info and uses its own corpus instead.
 */
#ifndef H3_FUZZ_H
#define H3_FUZZ_H

#include <stddef.h>
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

#endif
