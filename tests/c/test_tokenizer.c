/* Tokenizer: a tiny byte-level BPE tokenizer.json written by the test, exact ids for known
   strings, NFC cases, decoding, and clear errors for bad files and bad input. */
#define _GNU_SOURCE
#include "h3_stages.h"
#include "core/tokenizer.h"

#include "ctest.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[] = "/tmp/h3_test_tokenizer_XXXXXX";

/* GPT-2 byte -> character (the test's own copy of the table). */
static unsigned gpt2_char(unsigned b)
{
    unsigned extra = 0;
    for (unsigned x = 0; x < 256; x++) {
        bool keep = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
        if (x == b) return keep ? x : 256 + extra;
        if (!keep) extra++;
    }
    return 0;
}

static void put_json_char(FILE *f, unsigned cp)
{
    if (cp == '"' || cp == '\\')
        fprintf(f, "\\%c", (char)cp);
    else if (cp < 0x80)
        fputc((int)cp, f);
    else
        fprintf(f, "\\u%04x", cp);
}

/*
 * Vocab: byte b has id b (spelled with its GPT-2 character), then merges building "hello" and
 * " world"; added tokens <|im_start|> 265 and <|im_end|> 266. `pairs` writes the merges as
 * [["a","b"]] instead of "a b"; `model_type` and `extra` let tests break the file.
 */
static const char *MERGES[][2] = {{"h", "e"},   {"l", "l"},   {"he", "ll"},   {"hell", "o"},   {"\xc4\xa0", "w"},
                                  {"o", "r"},   {"\xc4\xa0w", "or"}, {"l", "d"}, {"\xc4\xa0wor", "ld"}};
#define NMERGES (sizeof MERGES / sizeof MERGES[0])

static char *write_tokenizer(const char *name, bool pairs, const char *model_type, const char *added)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", g_dir, name) < 0) return NULL;
    FILE *f = fopen(path, "w");
    if (!f) return path;
    fprintf(f, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[%s],"
               "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
               "{\"type\":\"Split\",\"pattern\":{\"Regex\":"
               "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}|"
               " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
               "\"behavior\":\"Isolated\",\"invert\":false},"
               "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]},"
               "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
               "\"trim_offsets\":false,\"use_regex\":false},"
               "\"model\":{\"type\":\"%s\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":\"\","
               "\"end_of_word_suffix\":\"\",\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":false,"
               "\"vocab\":{",
            added, model_type);
    for (unsigned b = 0; b < 256; b++) {
        fputs(b ? ",\"" : "\"", f);
        put_json_char(f, gpt2_char(b));
        fprintf(f, "\":%u", b);
    }
    for (size_t m = 0; m < NMERGES; m++) fprintf(f, ",\"%s%s\":%zu", MERGES[m][0], MERGES[m][1], 256 + m);
    fputs("},\"merges\":[", f);
    for (size_t m = 0; m < NMERGES; m++) {
        if (pairs)
            fprintf(f, "%s[\"%s\",\"%s\"]", m ? "," : "", MERGES[m][0], MERGES[m][1]);
        else
            fprintf(f, "%s\"%s %s\"", m ? "," : "", MERGES[m][0], MERGES[m][1]);
    }
    fputs("]}}", f);
    fclose(f);
    return path;
}

static const char *ADDED =
    "{\"id\":265,\"content\":\"<|im_start|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":266,\"content\":\"<|im_end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}";

static char *write_file(const char *name, const char *text)
{
    char *path = NULL;
    if (asprintf(&path, "%s/%s", g_dir, name) < 0) return NULL;
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

/* Encode and compare with the expected ids (n of them). */
static bool ids_are(h3_tokenizer *t, const char *text, size_t len, const int32_t *want, int64_t n)
{
    int32_t got[64];
    int64_t k = h3_tokenize(t, text, len, got, 64);
    bool ok = k == n;
    for (int64_t i = 0; ok && i < n; i++) ok = got[i] == want[i];
    if (!ok) {
        fprintf(stderr, "  \"%.*s\": got", (int)len, text);
        for (int64_t i = 0; i < k && i < 64; i++) fprintf(stderr, " %d", got[i]);
        fprintf(stderr, " (%lld ids; %s)\n", (long long)k, k < 0 ? h3_last_error() : "");
    }
    return ok;
}
#define IDS(t, s, ...)                                                                       \
    do {                                                                                     \
        const int32_t want_[] = {__VA_ARGS__};                                               \
        CHECK(ids_are(t, s, sizeof(s) - 1, want_, (int64_t)(sizeof want_ / sizeof *want_))); \
    } while (0)

static void test_encode(h3_tokenizer *t)
{
    IDS(t, "hello world", 259, 264);
    IDS(t, "hello", 259);
    IDS(t, "Hello", 'H', 'e', 257, 'o');
    IDS(t, "<|im_start|>hello<|im_end|>", 265, 259, 266);
    IDS(t, "x<|im_start|><|im_start|>", 'x', 265, 265);
    IDS(t, "<|im_start", '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't');
    /* "\s+(?!\S)" leaves one space to start the next word. */
    IDS(t, "  x", ' ', ' ', 'x');
    IDS(t, "x  ", 'x', ' ', ' ');
    IDS(t, "123", '1', '2', '3');
    IDS(t, "a\r\n\r\nb", 'a', '\r', '\n', '\r', '\n', 'b');
    /* NFC composes e + U+0301 into U+00E9 (bytes C3 A9) before BPE. */
    IDS(t, "e\xcc\x81", 0xC3, 0xA9);
    IDS(t, "\xc3\xa9", 0xC3, 0xA9);
    IDS(t, "don't", 'd', 'o', 'n', '\'', 't');
    CHECK(h3_tokenize(t, "", 0, NULL, 0) == 0);
    CHECK(h3_tokenize(t, NULL, 0, NULL, 0) == 0);
    /* A short buffer still reports the full count and fills what fits. */
    int32_t one[1] = {-7};
    CHECK(h3_tokenize(t, "hello world", 11, one, 1) == 2 && one[0] == 259);
    /* NUL is an ordinary character when the length is given. */
    IDS(t, "a\0b", 'a', 0, 'b');
}

static void test_lookup_decode(h3_tokenizer *t)
{
    CHECK(h3_tokenizer_vocab_size(t) == 267);
    CHECK(h3_token_id(t, "<|im_end|>") == 266);
    CHECK(h3_token_id(t, "hello") == 259);
    CHECK(h3_token_id(t, "\xc4\xa0world") == 264);
    CHECK(h3_token_id(t, "nope") == -1);
    const char *text = "<|im_start|>hello world e\xcc\x81 \t\n";
    int32_t ids[64];
    int64_t n = h3_tokenize(t, text, strlen(text), ids, 64);
    CHECK(n > 0 && n <= 64);
    char out[128];
    int64_t m = h3_detokenize(t, ids, n, out, sizeof out);
    /* Decoding gives the NFC form. */
    const char *want = "<|im_start|>hello world \xc3\xa9 \t\n";
    CHECK(m == (int64_t)strlen(want) && memcmp(out, want, (size_t)m) == 0);
    CHECK(h3_detokenize(t, ids, n, NULL, 0) == m);
    int32_t bad[2] = {259, 999};
    CHECK(h3_detokenize(t, bad, 2, out, sizeof out) == -H3_E_INVALID);
    CHECK(strstr(h3_last_error(), "999") != NULL);
}

static void test_bad_input(h3_tokenizer *t)
{
    int32_t ids[8];
    /* Lone continuation byte, overlong '/', surrogate U+D800, truncated 3-byte sequence. */
    const char *bad[] = {"ab\x80", "ab\xc0\xaf", "ab\xed\xa0\x80", "ab\xe2\x82"};
    for (int i = 0; i < 4; i++) {
        CHECK(h3_tokenize(t, bad[i], strlen(bad[i]), ids, 8) == -H3_E_INVALID);
        CHECK_MSG(strstr(h3_last_error(), "invalid UTF-8 at byte offset 2") != NULL, "%s", h3_last_error());
    }
    CHECK(h3_tokenize(NULL, "a", 1, ids, 8) == -H3_E_INVALID);
    CHECK(h3_tokenize(t, "a", 1, NULL, 8) == -H3_E_INVALID);
    CHECK(h3_tokenize(t, "a", 1, ids, -1) == -H3_E_INVALID);
}

static void test_nfc(void)
{
    struct {
        const char *in, *out;
    } cases[] = {
        {"e\xcc\x81", "\xc3\xa9"},
        /* a + acute (230) + grave-below (220): reordered, then a+acute composes. */
        {"a\xcc\x81\xcc\x96", "\xc3\xa1\xcc\x96"},
        /* Hangul jamo L V T -> one syllable U+AC01. */
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"},
        /* Angstrom sign (singleton) -> A with ring. */
        {"\xe2\x84\xab", "\xc3\x85"},
        /* Vietnamese: e + circumflex + dot below -> U+1EC7. */
        {"e\xcc\x82\xcc\xa3", "\xe1\xbb\x87"},
        {"plain ascii", "plain ascii"},
        /* U+0D3B (Unicode 10) is unknown to HF's Unicode 9 tables: no reordering. */
        {"a\xe0\xb4\xbb\xcc\x81", "a\xe0\xb4\xbb\xcc\x81"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *o;
        size_t n;
        CHECK(h3u_nfc(cases[i].in, strlen(cases[i].in), &o, &n) == 0);
        CHECK_MSG(n == strlen(cases[i].out) && memcmp(o, cases[i].out, n) == 0, "case %zu", i);
        free(o);
    }
    /* A long run of marks (counting-sort path): 300 x (acute 230, grave-below 220). */
    char in[2 + 300 * 4];
    size_t k = 0;
    in[k++] = 'x';
    for (int i = 0; i < 300; i++) {
        memcpy(in + k, "\xcc\x81\xcc\x96", 4);
        k += 4;
    }
    char *o;
    size_t n;
    CHECK(h3u_nfc(in, k, &o, &n) == 0);
    bool sorted = n == k && o[0] == 'x';
    for (int i = 0; sorted && i < 300; i++) sorted = memcmp(o + 1 + 2 * i, "\xcc\x96", 2) == 0;
    for (int i = 0; sorted && i < 300; i++) sorted = memcmp(o + 601 + 2 * i, "\xcc\x81", 2) == 0;
    CHECK(sorted);
    free(o);
    CHECK(h3u_class('a') == (H3U_L | H3U_WORD) && (h3u_class(0x4E00) & H3U_L) && (h3u_class(0x3000) & H3U_WS));
    CHECK((h3u_class(0x0301) & H3U_M) && (h3u_class(0x0661) & H3U_N) && h3u_class('!') == 0);
    CHECK(h3u_ccc(0x0301) == 230 && h3u_ccc(0x0316) == 220 && h3u_ccc('a') == 0);
}

/* unk / fuse_unk / byte_fallback / ignore_merges on a vocab missing most bytes; the expected
   ids are HF tokenizers' for the same file. */
static void test_model_options(void)
{
    static const char *fmt =
        "{\"added_tokens\":[],\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\","
        "\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}|"
        " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
        "\"use_regex\":false}]},\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
        "\"unk_token\":\"<unk>\",\"fuse_unk\":%s,\"byte_fallback\":%s,\"ignore_merges\":%s,"
        "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"<unk>\":3,\"<0x43>\":4,\"abc\":5,\"c\":6,"
        "\"\\u0120a\":7,\"<0xC4>\":8,\"<0xA0>\":9},\"merges\":[\"a b\"]}}";
    char json[2048];
    snprintf(json, sizeof json, fmt, "false", "false", "false");
    char *p = write_file("opt1.json", json);
    h3_tokenizer *t = h3_tokenizer_load(p);
    CHECK_MSG(t != NULL, "%s", h3_last_error());
    if (t) {
        IDS(t, "abCxyab", 2, 3, 3, 3, 2);
        IDS(t, "abc a", 2, 6, 3, 0);
    }
    h3_tokenizer_free(t);
    unlink(p);
    free(p);
    snprintf(json, sizeof json, fmt, "true", "true", "false");
    p = write_file("opt2.json", json);
    t = h3_tokenizer_load(p);
    CHECK_MSG(t != NULL, "%s", h3_last_error());
    if (t) {
        IDS(t, "abCxyab", 2, 4, 3, 2);
        IDS(t, "abc a", 2, 6, 8, 9, 0);
        IDS(t, "xyz", 3);
    }
    h3_tokenizer_free(t);
    unlink(p);
    free(p);
    snprintf(json, sizeof json, fmt, "false", "false", "true");
    p = write_file("opt3.json", json);
    t = h3_tokenizer_load(p);
    CHECK_MSG(t != NULL, "%s", h3_last_error());
    if (t) {
        IDS(t, "abc a", 5, 7);
        IDS(t, "abc", 5);
    }
    h3_tokenizer_free(t);
    unlink(p);
    free(p);
}

/* Added-token options (checked against HF in tests/test_tokenizer.py on a trained file). */
static void test_added_options(void)
{
    const char *added =
        "{\"id\":265,\"content\":\"[M]\",\"single_word\":true,\"lstrip\":true,\"rstrip\":true,"
        "\"normalized\":false,\"special\":false},"
        "{\"id\":266,\"content\":\"<s>\",\"lstrip\":true,\"normalized\":false,\"special\":true},"
        "{\"id\":267,\"content\":\"<e>\",\"rstrip\":true,\"normalized\":false,\"special\":true},"
        "{\"id\":268,\"content\":\"e\\u0301\",\"normalized\":true,\"special\":false}";
    char *p = write_tokenizer("added.json", false, "BPE", added);
    h3_tokenizer *t = h3_tokenizer_load(p);
    CHECK_MSG(t != NULL, "%s", h3_last_error());
    if (t) {
        IDS(t, "a [M] b", 'a', 265, 'b');
        IDS(t, "a[M]b", 'a', '[', 'M', ']', 'b');
        IDS(t, "x  <s>y", 'x', 266, 'y');
        IDS(t, "x<e>  y", 'x', 267, 'y');
        IDS(t, "cafe\xcc\x81", 'c', 'a', 'f', 268);
        IDS(t, "\xc3\xa9", 268);
        /* A long word and a long run of marks go through the heap and the counting sort. */
        char big[3000];
        memset(big, 'l', sizeof big);
        int32_t ids[2000];
        CHECK(h3_tokenize(t, big, sizeof big, ids, 2000) == 1500);
        for (int i = 0; i < 1500; i++) CHECK(ids[i] == 257);
        char marks[1 + 2 * 1000];
        marks[0] = 'x';
        for (int i = 0; i < 1000; i++) memcpy(marks + 1 + 2 * i, i % 2 ? "\xcc\x81" : "\xcc\x96", 2);
        CHECK(h3_tokenize(t, marks, sizeof marks, NULL, 0) == 2001);
    }
    h3_tokenizer_free(t);
    unlink(p);
    free(p);
}

/* A loaded tokenizer is read-only: several threads encode with it at once. */
typedef struct {
    h3_tokenizer *t;
    int ok;
} thread_arg;

static void *encode_many(void *p)
{
    thread_arg *a = p;
    const char *text = "<|im_start|>hello world e\xcc\x81 Hello  123\r\n";
    int32_t want[64], got[64];
    int64_t n = h3_tokenize(a->t, text, strlen(text), want, 64);
    a->ok = n > 0;
    for (int i = 0; i < 300 && a->ok; i++)
        a->ok = h3_tokenize(a->t, text, strlen(text), got, 64) == n && !memcmp(got, want, (size_t)n * sizeof *got);
    return NULL;
}

static void test_threads(h3_tokenizer *t)
{
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, 0};
        CHECK(pthread_create(&th[i], NULL, encode_many, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok);
    }
}

static void expect_load_error(const char *path, const char *needle)
{
    h3_tokenizer *t = h3_tokenizer_load(path);
    CHECK_MSG(t == NULL, "%s loaded", path);
    h3_tokenizer_free(t);
    CHECK_MSG(strstr(h3_last_error(), needle) != NULL, "error \"%s\" lacks \"%s\"", h3_last_error(), needle);
    CHECK_MSG(strstr(h3_last_error(), path) != NULL, "error \"%s\" lacks the path", h3_last_error());
}

static void test_load_errors(void)
{
    char *missing = NULL;
    if (asprintf(&missing, "%s/missing.json", g_dir) < 0) return;
    expect_load_error(missing, "cannot open");
    free(missing);
    char *p = write_file("broken.json", "{\"model\": {\"vocab\": {\"a\": 0,}}}");
    expect_load_error(p, "malformed JSON");
    free(p);
    p = write_tokenizer("wordpiece.json", false, "WordPiece", ADDED);
    expect_load_error(p, "model type 'WordPiece' is not supported");
    free(p);
    p = write_file("nomodel.json", "{\"version\":\"1.0\",\"normalizer\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
                                   "\"pre_tokenizer\":{\"type\":\"Whitespace\"}}");
    expect_load_error(p, "pre_tokenizer 'Whitespace' is not supported");
    free(p);
    p = write_tokenizer("badid.json", false, "BPE",
                        "{\"id\":300,\"content\":\"<|x|>\",\"special\":true,\"normalized\":false}");
    expect_load_error(p, "has id 300 in the file but HF tokenizers would give it id 265");
    free(p);
    CHECK(h3_tokenizer_load(NULL) == NULL);
}

int main(void)
{
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_nfc();
    char *paths[2] = {write_tokenizer("strings.json", false, "BPE", ADDED),
                      write_tokenizer("pairs.json", true, "BPE", ADDED)};
    for (int k = 0; k < 2; k++) {
        h3_tokenizer *t = h3_tokenizer_load(paths[k]);
        CHECK_MSG(t != NULL, "%s", h3_last_error());
        if (t) {
            test_encode(t);
            test_lookup_decode(t);
            test_bad_input(t);
            test_threads(t);
        }
        h3_tokenizer_free(t);
    }
    test_load_errors();
    test_model_options();
    test_added_options();
    for (int k = 0; k < 2; k++) {
        unlink(paths[k]);
        free(paths[k]);
    }
    const char *names[] = {"broken.json", "wordpiece.json", "nomodel.json", "badid.json"};
    for (size_t i = 0; i < 4; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s/%s", g_dir, names[i]);
        unlink(buf);
    }
    rmdir(g_dir);
    CTEST_END();
}
