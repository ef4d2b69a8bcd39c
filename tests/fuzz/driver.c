/*
 * A self-contained coverage-guided fuzzing loop for gcc builds (clang users can link the target
 * with -fsanitize=fuzzer instead). The library sources are compiled with
 * -fsanitize-coverage=trace-pc; every basic block calls __sanitizer_cov_trace_pc, which marks an
 * edge in a 64 KiB map. Inputs reaching new edges join the corpus; each execution mutates a
 * corpus entry with byte-level and safetensors-aware mutations. Runs are reproducible (fixed
 * seed) and bounded by an execution count.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAP 65536
static uint8_t cur[MAP], seen[MAP];
static uintptr_t prev_loc;

void __sanitizer_cov_trace_pc(void)
{
    uintptr_t pc = (uintptr_t)__builtin_return_address(0);
    uintptr_t loc = (pc ^ (pc >> 16)) & (MAP - 1);
    cur[(loc ^ prev_loc) & (MAP - 1)] = 1;
    prev_loc = loc >> 1;
}

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

typedef struct {
    uint8_t *p;
    size_t n;
} item;
static item *corpus;
static size_t ncorpus, capcorpus;
#define MAXLEN 4096

static void add(const uint8_t *p, size_t n)
{
    if (ncorpus == capcorpus) {
        capcorpus = capcorpus ? capcorpus * 2 : 64;
        corpus = realloc(corpus, capcorpus * sizeof *corpus);
    }
    corpus[ncorpus].p = malloc(n ? n : 1);
    memcpy(corpus[ncorpus].p, p, n);
    corpus[ncorpus].n = n;
    ncorpus++;
}

/* A well-formed file: 8-byte length, JSON header, data area. */
static size_t make_seed(uint8_t *out, const char *hdr, size_t data)
{
    size_t h = strlen(hdr);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(out + 8, hdr, h);
    memset(out + 8 + h, 0x3f, data);
    return 8 + h + data;
}

static const char *dict[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"F16\"",
    "\"I64\"", "\"F8_E4M3\"", "\"U8\"", "\"BOOL\"", "[", "]", "{", "}", ",", ":", "0", "1", "-1",
    "18446744073709551615", "9223372036854775808", "1e309", "1.5", "\"\\u0000\"", "\"\\ud800\"",
    "\"\\ud83d\\ude00\"", "null", "true", "false", "\"a\"", " ", "\"\\", "\xff", "\xc3\xa9",
};

static size_t mutate(uint8_t *b, size_t n)
{
    int rounds = 1 + (int)(rnd() % 4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd() % 10) {
        case 0: /* bit flip */
            if (n) b[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* interesting byte */
            if (n) {
                static const uint8_t v[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',', ':', '0', '9'};
                b[rnd() % n] = v[rnd() % sizeof v];
            }
            break;
        case 2: /* delete a range */
            if (n > 1) {
                size_t a = rnd() % n, l = 1 + rnd() % (n - a > 16 ? 16 : n - a);
                memmove(b + a, b + a + l, n - a - l);
                n -= l;
            }
            break;
        case 3: /* dictionary insert */
        case 4: {
            const char *t = dict[rnd() % (sizeof dict / sizeof *dict)];
            size_t l = strlen(t), a = n ? rnd() % (n + 1) : 0;
            if (n + l < MAXLEN) {
                memmove(b + a + l, b + a, n - a);
                memcpy(b + a, t, l);
                n += l;
            }
            break;
        }
        case 5: /* length prefix: keep it consistent with the JSON, or push it to an edge */
            if (n >= 8) {
                uint64_t v;
                switch (rnd() % 4) {
                case 0: {
                    size_t end = n;
                    while (end > 8 && b[end - 1] != '}') end--;
                    v = end > 8 ? end - 8 : 0;
                    break;
                }
                case 1: v = n - 8; break;
                case 2: v = rnd(); break;
                default: v = (uint64_t)(n - 8) + (rnd() % 3) - 1; break;
                }
                for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
            }
            break;
        case 6: /* duplicate a chunk */
            if (n > 2) {
                size_t a = rnd() % n, l = 1 + rnd() % (n - a > 32 ? 32 : n - a), d = rnd() % n;
                if (n + l < MAXLEN) {
                    uint8_t tmp[32];
                    memcpy(tmp, b + a, l);
                    memmove(b + d + l, b + d, n - d);
                    memcpy(b + d, tmp, l);
                    n += l;
                }
            }
            break;
        case 7: /* splice with another corpus entry */
            if (ncorpus > 1 && n) {
                item *o = &corpus[rnd() % ncorpus];
                size_t a = rnd() % n, ob = o->n ? rnd() % o->n : 0, l = o->n - ob;
                if (a + l > MAXLEN) l = MAXLEN - a;
                memcpy(b + a, o->p + ob, l);
                n = a + l;
            }
            break;
        case 8: /* truncate */
            if (n) n = rnd() % n;
            break;
        default: /* random digit run (offsets, shapes) */
            if (n) {
                size_t a = rnd() % n, l = 1 + rnd() % 6;
                for (size_t i = 0; i < l && a + i < n; i++) b[a + i] = (uint8_t)('0' + rnd() % 10);
            }
            break;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    long long runs = argc > 1 ? atoll(argv[1]) : 100000;
    if (argc > 2) rs = (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull + 1;
    uint8_t buf[MAXLEN + 64];
    static const char *seeds[][2] = {
        {"{}", "0"},
        {"{\"__metadata__\":{\"format\":\"pt\"}}", "0"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", "24"},
        {"{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"I64\",\"shape\":[],"
         "\"data_offsets\":[8,16]},\"__metadata__\":{\"k\":\"v\"}}", "16"},
        {"{\"x\":{\"dtype\":\"F8_E4M3\",\"shape\":[0,5],\"data_offsets\":[0,0]},\"y\":{\"dtype\":\"U8\",\"shape\":[3],"
         "\"data_offsets\":[0,3]}}  ", "3"},
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        size_t n = make_seed(buf, seeds[i][0], (size_t)atoi(seeds[i][1]));
        add(buf, n);
    }
    size_t edges = 0;
    clock_t t0 = clock();
    for (long long it = 0; it < runs; it++) {
        item *src = &corpus[rnd() % ncorpus];
        memcpy(buf, src->p, src->n);
        size_t n = mutate(buf, src->n);
        memset(cur, 0, sizeof cur);
        prev_loc = 0;
        LLVMFuzzerTestOneInput(buf, n);
        int fresh = 0;
        for (size_t i = 0; i < MAP; i++)
            if (cur[i] && !seen[i]) {
                seen[i] = 1;
                fresh = 1;
                edges++;
            }
        if (fresh && ncorpus < 20000) add(buf, n);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("fuzz_safetensors: %lld executions in %.1f s, %zu coverage edges, corpus %zu, no crash\n", runs, secs,
           edges, ncorpus);
    return 0;
}
