/*
 * Fuzz target: the tokenizer.json loader (core/tokenizer.c) and the encoder it builds. An input
 * is a tokenizer.json, optionally followed by a NUL byte and a text to encode (JSON never holds a
 * raw NUL, so the split is unambiguous). A file either loads or is refused with a message; a
 * loaded tokenizer encodes the text and a few fixed ones such that:
 *  - text that is not well-formed UTF-8 is refused with H3_E_INVALID and a message;
 *  - the id count does not depend on the buffer (a short buffer gets the same count and prefix);
 *  - every id lies in [0, vocab size) and decodes (h3_detokenize succeeds on the ids it made);
 *  - ids outside the vocabulary are refused by h3_detokenize with a message.
 * libFuzzer-compatible entry point; with gcc it runs under tests/fuzz/driver.c, and the loader is
 * reached through its in-memory entry point (h3_tokenizer_load_buffer, the code the file loader
 * runs after reading the file).
 */
#include "core/tokenizer.h"
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#define FAIL() __builtin_trap()


static void encode_checked(h3_tokenizer *t, int32_t vocab, const char *text, size_t len)
{
    h3_err_clear();
    int64_t n = h3_tokenize(t, text, len, NULL, 0);
    if (!utf8_ok((const unsigned char *)text, len)) {
        if (n != -H3_E_INVALID || !h3_last_error()[0]) FAIL();
        return;
    }
    if (n < 0) {
        /* a loaded file can still be unusable for some text (an unk_token missing from the vocab) */
        if (!h3_last_error()[0]) FAIL();
        return;
    }
    if (len == 0 && n != 0) FAIL();
    int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    if (!ids) abort();
    if (h3_tokenize(t, text, len, ids, n) != n) FAIL();
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) FAIL();
    if (n > 1) { /* a short buffer: same count, same prefix */
        int64_t half = n / 2;
        int32_t *pre = malloc(sizeof *pre * (size_t)half);
        if (!pre) abort();
        if (h3_tokenize(t, text, len, pre, half) != n || memcmp(pre, ids, sizeof *pre * (size_t)half) != 0) FAIL();
        free(pre);
    }
    /* every id the encoder emits decodes; the byte count does not depend on the buffer */
    int64_t bytes = h3_detokenize(t, ids, n, NULL, 0);
    if (bytes < 0) FAIL();
    char *out = malloc((size_t)(bytes ? bytes : 1));
    if (!out) abort();
    if (h3_detokenize(t, ids, n, out, bytes) != bytes) FAIL();
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *json = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - json) : size;
    h3_err_clear();
    h3_tokenizer *t = h3_tokenizer_load_buffer(json, jlen, "<fuzz>");
    if (!t) {
        if (!h3_last_error()[0]) FAIL();
        return 0;
    }
    int32_t vocab = h3_tokenizer_vocab_size(t);
    if (vocab < 0) FAIL();
    /* NFC work the mutated texts rarely build: out-of-order marks, a run long enough for the counting
       sort, Hangul syllables from conjoining jamo, an astral composition (U+11099 U+110BA) */
#define MARKS2 "\xcc\x81\xcc\xa3" /* U+0301 (class 230) then U+0323 (class 220): out of order */
#define MARKS8 MARKS2 MARKS2 MARKS2 MARKS2
    static const char *fixed[] = {
        "hello world", "  a\r\n\n\t<|im_start|>x<|im_end|>'S 12", "e\xcc\x81t\xc3\xa9 [W] ab",
        "\xf0\x9f\x98\x80\xce\xa9\xcc\x88 a" MARKS2 " \xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab\xed\x95\x9c\xe1\x86\xa8 "
        "\xf0\x91\x82\x99\xf0\x91\x82\xba",
        "o" MARKS8 MARKS8 MARKS8 MARKS8 MARKS8 /* 40 marks: more than the insertion sort takes */,
        ""};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) encode_checked(t, vocab, fixed[i], strlen(fixed[i]));
    if (nul) encode_checked(t, vocab, nul + 1, size - jlen - 1);
    /* ids outside the vocabulary are refused */
    int32_t bad[2] = {-1, vocab};
    char c;
    for (int i = 0; i < 2; i++) {
        h3_err_clear();
        if (h3_detokenize(t, &bad[i], 1, &c, 1) != -H3_E_INVALID || !h3_last_error()[0]) FAIL();
    }
    if (h3_token_id(t, "hello") >= vocab || h3_token_id(t, "<|im_start|>") >= vocab) FAIL();
    h3_tokenizer_free(t);
    return 0;
}

/* ---- seeds for tests/fuzz/driver.c -------------------------------------------------------- */

/* The two pre-tokenizer patterns libh3 knows, as tokenizer.json spells them. */
#define PAT_QWEN2                                                                                            \
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+" \
    "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\""
#define PAT_QWEN35                                                                                            \
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{L}\\\\p{M}]+|\\\\p{N}|"                 \
    " ?[^\\\\s\\\\p{L}\\\\p{M}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\""
#define PRE(pat)                                                                                                 \
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" pat \
    "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"           \
    "\"trim_offsets\":false,\"use_regex\":false}]}"
#define DEC "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}"
#define ADDED(id, content, sw, ls, rs, norm, special)                                                          \
    "{\"id\":" #id ",\"content\":\"" content "\",\"single_word\":" #sw ",\"lstrip\":" #ls ",\"rstrip\":" #rs \
    ",\"normalized\":" #norm ",\"special\":" #special "}"

/* Qwen2 form: NFC, merges as pairs, added special tokens numbered after the vocab. */
#define SEED_QWEN2                                                                                               \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["                                \
    ADDED(24, "<|im_start|>", false, false, false, false, true) "," ADDED(25, "<|im_end|>", false, false, false, \
                                                                          false, true)                           \
    "],\"normalizer\":{\"type\":\"NFC\"}," PRE(PAT_QWEN2) ",\"post_processor\":null," DEC ","                     \
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","         \
    "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"            \
    "\"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"\\u0120\":4,\"w\":5,\"r\":6,\"d\":7,\"he\":8,\"ll\":9,"          \
    "\"hell\":10,\"hello\":11,\"\\u0120w\":12,\"or\":13,\"\\u0120wor\":14,\"ld\":15,\"\\u0120world\":16,\"1\":17," \
    "\"2\":18,\"3\":19,\"'\":20,\"s\":21,\"\\u00c3\":22,\"\\u00a9\":23},"                                          \
    "\"merges\":[[\"h\",\"e\"],[\"l\",\"l\"],[\"he\",\"ll\"],[\"hell\",\"o\"],[\"\\u0120\",\"w\"],[\"o\",\"r\"],"  \
    "[\"\\u0120w\",\"or\"],[\"l\",\"d\"],[\"\\u0120wor\",\"ld\"]]}}"

/* Qwen3.5 pattern, a normalizer Sequence, byte fallback, a fused unk, ignore_merges, legacy
   "a b" merges with a #version line, and added tokens with every matching option. */
#define SEED_FALLBACK                                                                                            \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":["                                \
    ADDED(0, "<unk>", false, false, false, false, true) "," ADDED(9, "[W]", true, true, true, true, false) ","   \
    ADDED(10, "\\u00e9t\\u00e9", false, false, false, true, false)                                               \
    "],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]}," PRE(PAT_QWEN35) "," DEC ","   \
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"continuing_subword_prefix\":null,"    \
    "\"end_of_word_suffix\":null,\"fuse_unk\":true,\"byte_fallback\":true,\"ignore_merges\":true,"               \
    "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"ab\":3,\"<0x61>\":4,\"<0xC3>\":5,\"<0x83>\":6,\"\\u0120\":7,"       \
    "\"\\u0120a\":8},\"merges\":[\"#version: 0.2\",\"a b\",\"\\u0120 a\"]}}"

/* The least a file may say. */
#define SEED_MINIMAL "{\"normalizer\":null," PRE(PAT_QWEN2) "," DEC ",\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}"

#define TEXT "\0hello world's 123\r\n\n  \xc3\xa9 e\xcc\x81 <|im_start|>x<|im_end|> [W]ab \xce\xa9 \xf0\x9f\x98\x80\t"

#define S(x) {(const uint8_t *)(x), sizeof(x) - 1}
static const fuzz_input k_seeds[] = {
    S(SEED_QWEN2 TEXT),          S(SEED_FALLBACK TEXT), S(SEED_MINIMAL TEXT),
    S(SEED_QWEN2),               S(SEED_FALLBACK "\0ab aab \xc3\x83"),
};

static const char *const k_dict[] = {
    "\"added_tokens\"", "\"content\"", "\"id\"", "\"special\"", "\"single_word\"", "\"lstrip\"", "\"rstrip\"",
    "\"normalized\"", "\"normalizer\"", "\"normalizers\"", "\"pre_tokenizer\"", "\"pretokenizers\"", "\"decoder\"",
    "\"model\"", "\"vocab\"", "\"merges\"", "\"unk_token\"", "\"byte_fallback\"", "\"fuse_unk\"",
    "\"ignore_merges\"", "\"dropout\"", "\"continuing_subword_prefix\"", "\"end_of_word_suffix\"", "\"type\"",
    "\"BPE\"", "\"NFC\"", "\"NFD\"", "\"Sequence\"", "\"Split\"", "\"ByteLevel\"", "\"Isolated\"", "\"invert\"",
    "\"add_prefix_space\"", "\"use_regex\"", "\"version\"", "\"1.0\"", "\"truncation\"", "\"padding\"", "true",
    "false", "null", "0", "1", "-1", "67108864", "2147483647", "\"<unk>\"", "\"<0x61>\"", "\"<0xC3>\"", "\"#version\"",
    "\"a b\"", "\"\\u0120\"", "\"\\u0120a\"", "\"\\u00e9\"", "\"e\\u0301\"", "\"\"", "[\"a\",\"b\"]", ":", ",", "{",
    "}", "[", "]", "\"", "\\u0000", " ", "\xc3\xa9", "e\xcc\x81", "\xf0\x9f\x98\x80", "\xcc\x88", "'s", "'LL", "\r\n",
    "<|im_start|>", "[W]", "\xff",
};

const fuzz_target *fuzz_target_info(void)
{
    static const fuzz_target t = {"fuzz_tokenizer", 8192, k_seeds, sizeof k_seeds / sizeof *k_seeds, k_dict,
                                  sizeof k_dict / sizeof *k_dict, 0};
    return &t;
}
