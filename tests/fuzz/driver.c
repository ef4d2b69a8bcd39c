/*
 * A self-contained coverage-guided fuzzing loop for gcc builds (clang users can link a target
 * with -fsanitize=fuzzer instead). The library sources are compiled with
 * -fsanitize-coverage=trace-pc; every basic block calls __sanitizer_cov_trace_pc, which marks an
 * edge in a 64 KiB map. Inputs reaching new edges join the corpus; each execution mutates a
 * corpus entry with byte-level mutations, splices from the target's dictionary and from other
 * corpus entries (and, for safetensors-style inputs, length-prefix edits). The target supplies
 * its seeds and dictionary through fuzz_target_info (fuzz.h). Runs are reproducible (fixed seed)
 * and bounded by an execution count:
 *
 *   fuzz_TARGET [RUNS [SEED]]      (FUZZ_CORPUS_DIR=dir also writes the final corpus there)
 */
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAP 65536
/* Words so that the per-execution scan skips untouched stretches 8 edges at a time. */
static union {
    uint8_t b[MAP];
    uint64_t w[MAP / 8];
} cur_u, seen_u;
#define cur cur_u.b
#define seen seen_u.b
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
static const fuzz_target *T;

static void add(const uint8_t *p, size_t n)
{
    if (ncorpus == capcorpus) {
        capcorpus = capcorpus ? capcorpus * 2 : 64;
        corpus = realloc(corpus, capcorpus * sizeof *corpus);
        if (!corpus) abort();
    }
    corpus[ncorpus].p = malloc(n ? n : 1);
    if (!corpus[ncorpus].p) abort();
    memcpy(corpus[ncorpus].p, p, n);
    corpus[ncorpus].n = n;
    ncorpus++;
}

/* Insert `l` bytes at `a` if they fit under max_len. */
static size_t insert(uint8_t *b, size_t n, size_t a, const uint8_t *t, size_t l)
{
    if (n + l > T->max_len) return n;
    memmove(b + a + l, b + a, n - a);
    memcpy(b + a, t, l);
    return n + l;
}

static size_t mutate(uint8_t *b, size_t n)
{
    const size_t maxlen = T->max_len;
    int rounds = 1 + (int)(rnd() % 4);
    for (int r = 0; r < rounds; r++) {
        switch (rnd() % 12) {
        case 0: /* bit flip */
            if (n) b[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: /* interesting byte */
            if (n) {
                static const uint8_t v[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']',
                                            ',', ':', '0', '9', ' ', '\n', 0xc3, 0xcc, 0xe2, 0xf0};
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
        case 4:
            if (T->ndict) {
                const char *t = T->dict[rnd() % T->ndict];
                n = insert(b, n, n ? rnd() % (n + 1) : 0, (const uint8_t *)t, strlen(t));
            }
            break;
        case 5: /* dictionary overwrite: replace a range by a token (a key, a value, a word) */
            if (T->ndict && n) {
                const char *t = T->dict[rnd() % T->ndict];
                size_t a = rnd() % n, l = 1 + rnd() % (n - a > 12 ? 12 : n - a);
                memmove(b + a, b + a + l, n - a - l);
                n = insert(b, n - l, a, (const uint8_t *)t, strlen(t));
            }
            break;
        case 6: /* length prefix: keep it consistent with the JSON, or push it to an edge */
            if (T->length_prefix && n >= 8) {
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
            } else if (n > 2) { /* otherwise: swap two bytes (reorders brackets, quotes) */
                size_t x = rnd() % n, y = rnd() % n;
                uint8_t t = b[x];
                b[x] = b[y];
                b[y] = t;
            }
            break;
        case 7: /* duplicate a chunk */
            if (n > 2) {
                size_t a = rnd() % n, l = 1 + rnd() % (n - a > 32 ? 32 : n - a), d = rnd() % n;
                uint8_t tmp[32];
                memcpy(tmp, b + a, l);
                n = insert(b, n, d, tmp, l);
            }
            break;
        case 8: /* splice: our head, another entry's tail */
            if (ncorpus > 1 && n) {
                item *o = &corpus[rnd() % ncorpus];
                size_t a = rnd() % n, ob = o->n ? rnd() % o->n : 0, l = o->n - ob;
                if (a + l > maxlen) l = maxlen - a;
                memcpy(b + a, o->p + ob, l);
                n = a + l;
            }
            break;
        case 9: /* crossover: insert a chunk of another entry */
            if (ncorpus > 1) {
                item *o = &corpus[rnd() % ncorpus];
                if (o->n) {
                    size_t ob = rnd() % o->n, l = 1 + rnd() % (o->n - ob > 64 ? 64 : o->n - ob);
                    n = insert(b, n, n ? rnd() % (n + 1) : 0, o->p + ob, l);
                }
            }
            break;
        case 10: /* truncate */
            if (n) n = rnd() % n;
            break;
        default: /* random digit run (offsets, shapes, ids) */
            if (n) {
                size_t a = rnd() % n, l = 1 + rnd() % 6;
                for (size_t i = 0; i < l && a + i < n; i++) b[a + i] = (uint8_t)('0' + rnd() % 10);
            }
            break;
        }
    }
    return n;
}

/* Run one input; returns 1 when it reached an edge no earlier input did. */
static int run(const uint8_t *p, size_t n, size_t *edges)
{
    memset(cur, 0, sizeof cur);
    prev_loc = 0;
    LLVMFuzzerTestOneInput(p, n);
    int fresh = 0;
    for (size_t w = 0; w < MAP / 8; w++) {
        if (!(cur_u.w[w] & ~seen_u.w[w])) continue;
        for (size_t i = 8 * w; i < 8 * w + 8; i++)
            if (cur[i] && !seen[i]) {
                seen[i] = 1;
                fresh = 1;
                (*edges)++;
            }
    }
    return fresh;
}

int main(int argc, char **argv)
{
    long long runs = argc > 1 ? atoll(argv[1]) : 100000;
    if (argc > 2) rs = (uint64_t)atoll(argv[2]) * 0x9E3779B97F4A7C15ull + 1;
    T = fuzz_target_info();
    uint8_t *buf = malloc(T->max_len + 64);
    if (!buf || !T->nseeds) return 2;
    size_t edges = 0;
    clock_t t0 = clock();
    /* Seeds join the corpus whatever they cover: each is a different well-formed shape. */
    for (size_t i = 0; i < T->nseeds; i++) {
        add(T->seeds[i].data, T->seeds[i].size);
        run(T->seeds[i].data, T->seeds[i].size, &edges);
    }
    for (long long it = 0; it < runs; it++) {
        item *src = &corpus[rnd() % ncorpus];
        memcpy(buf, src->p, src->n);
        size_t n = mutate(buf, src->n);
        if (run(buf, n, &edges) && ncorpus < 20000) add(buf, n);
    }
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("%s: %lld executions in %.1f s, %zu coverage edges, corpus %zu, no crash\n", T->name, runs, secs, edges,
           ncorpus);
    /* FUZZ_CORPUS_DIR=dir keeps the corpus (one file per input), e.g. to replay it in a coverage build. */
    const char *dir = getenv("FUZZ_CORPUS_DIR");
    for (size_t i = 0; dir && i < ncorpus; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s-%05zu", dir, T->name, i);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(corpus[i].p, 1, corpus[i].n, f);
            fclose(f);
        }
    }
    for (size_t i = 0; i < ncorpus; i++) free(corpus[i].p);
    free(corpus);
    free(buf);
    return 0;
}
