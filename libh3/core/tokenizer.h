/*
 * Internals of the tokenizer (tokenizer.c) and the generated Unicode tables
 * (unicode_tables.c, from tools/gen_unicode_tables.py). Not part of the API.
 */
#ifndef H3_TOKENIZER_H
#define H3_TOKENIZER_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

/* Class bits per code point (keep in sync with the generator). */
enum {
    H3U_L = 1,     /* \p{L} (Unicode 16.0, as HF's Oniguruma) */
    H3U_N = 2,     /* \p{N} */
    H3U_M = 4,     /* \p{M} */
    H3U_WS = 8,    /* \s = White_Space */
    H3U_WORD = 16, /* \w of the Rust regex crate (single_word added tokens) */
    H3U_NFC = 32   /* may change under NFC (Unicode 9.0 data, as HF's normalizer) */
};

extern const uint32_t h3u_class_ranges[];
extern const size_t h3u_class_ranges_n;
extern const uint32_t h3u_ccc_ranges[];
extern const size_t h3u_ccc_ranges_n;
extern const uint32_t h3u_decomp_cp[];
extern const uint32_t h3u_decomp_info[];
extern const uint32_t h3u_decomp_pool[];
extern const size_t h3u_decomp_n;
extern const uint64_t h3u_comp_key[];
extern const uint32_t h3u_comp_val[];
extern const size_t h3u_comp_n;

/* Lookups over the tables (tokenizer.c). */
H3_INTERNAL unsigned h3u_class(uint32_t cp);
H3_INTERNAL unsigned h3u_ccc(uint32_t cp);

/*
 * NFC of valid UTF-8 `s` (`n` bytes) into a fresh buffer (*out, *out_n; NUL-terminated).
 * Returns 0 or a negative H3_E_* code.
 */
H3_INTERNAL int h3u_nfc(const char *s, size_t n, char **out, size_t *out_n);

/*
 * h3_tokenizer_load on a tokenizer.json held in memory (`len` bytes, no NUL needed); errors are
 * prefixed with `name` as h3_tokenizer_load prefixes them with the path. For tests and fuzzing:
 * the file loader reads the file and runs the same code.
 */
H3_INTERNAL h3_tokenizer *h3_tokenizer_load_buffer(const char *json, size_t len, const char *name);

#endif /* H3_TOKENIZER_H */
