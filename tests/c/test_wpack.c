/*
 * wpack (core/wpack.h): the lossless packing of bf16 words for the weight streaming copies. Every
 * input must come back bit for bit (all 65,536 words, zeros, subnormals, inf/NaN, escapes, short
 * chunks), Gaussian weights must pack under 80 %, the bytes must not depend on the thread count,
 * and a corrupt or truncated image must be an error of the reference decoder, never a crash.
 */
#include "ctest.h"
#include "backend/cpu/ops.h"
#include "core/internal.h"
#include "core/wpack.h"

#include <stdlib.h>

static uint16_t to_bf16(float f) /* round to nearest even on the bits (finite inputs) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float gauss(void)
{
    float u1 = 0.5f * (frand() + 1.0f), u2 = frand();
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(3.14159265f * u2);
}

/* The pool as a runner (what models/dit_stream.c hands the packer). */
static void pool_run(void *ctx, int64_t n, h3_wpack_task fn, void *arg) { h3_parallel_for(ctx, n, 1, fn, arg); }

static h3_pool *g_pool2;

/* Pack src with chunk, serially and on two threads (same bytes), unpack, compare; returns the
   packed size (0 on failure) and keeps the image in *img when asked. */
static uint64_t round_trip(const char *what, const uint16_t *src, uint64_t n, uint32_t chunk, uint8_t **img)
{
    const uint64_t size = h3_wpack_size(src, n, chunk, NULL, NULL);
    CHECK_MSG(size >= H3_WPACK_HEADER, "%s: size %llu", what, (unsigned long long)size);
    CHECK_MSG(size == h3_wpack_size(src, n, chunk, pool_run, g_pool2), "%s: size at 2 threads", what);
    uint8_t *a = malloc(size), *b = malloc(size);
    uint16_t *back = malloc(sizeof *back * (n ? n : 1));
    memset(a, 0xAB, size); /* the padding must be written, not left as it was */
    memset(b, 0xCD, size);
    int rc = h3_wpack_encode(src, n, chunk, a, size, NULL, NULL);
    CHECK_MSG(rc == 0, "%s: encode: %s", what, h3_last_error());
    rc = h3_wpack_encode(src, n, chunk, b, size, pool_run, g_pool2);
    CHECK_MSG(rc == 0, "%s: encode at 2 threads: %s", what, h3_last_error());
    CHECK_MSG(memcmp(a, b, size) == 0, "%s: 1 and 2 threads give different bytes", what);
    if (n) memset(back, 0x5A, sizeof *back * n);
    rc = h3_wpack_decode(a, size, back, n);
    CHECK_MSG(rc == 0, "%s: decode: %s", what, h3_last_error());
    CHECK_MSG(n == 0 || memcmp(back, src, sizeof *src * n) == 0, "%s: not the same words back", what);
    free(b);
    free(back);
    if (img)
        *img = a;
    else
        free(a);
    return size;
}

static void test_gaussian(void)
{
    const uint64_t n = 3 * H3_WPACK_CHUNK * 7 + 123;
    uint16_t *w = malloc(sizeof *w * n);
    static const float scales[] = {1e-3f, 0.02f, 1.0f, 300.0f};
    for (int s = 0; s < 4; s++) {
        for (uint64_t i = 0; i < n; i++) w[i] = to_bf16(scales[s] * gauss());
        char what[64];
        snprintf(what, sizeof what, "gaussian x %g", (double)scales[s]);
        const uint64_t size = round_trip(what, w, n, H3_WPACK_CHUNK, NULL);
        const double ratio = (double)size / (2.0 * (double)n);
        printf("%s: %llu values -> %.1f %% of the bf16 bytes\n", what, (unsigned long long)n, 100 * ratio);
        CHECK_MSG(ratio < 0.80, "%s: packed to %.3f of the bf16 bytes", what, ratio);
        /* other chunks too: the format takes any even chunk */
        round_trip(what, w, n, 256, NULL);
        round_trip(what, w, n, 2, NULL);
    }
    free(w);
}

static void test_all_words(void)
{
    const uint64_t n = 65536;
    uint16_t *w = malloc(sizeof *w * n);
    for (uint64_t i = 0; i < n; i++) w[i] = (uint16_t)i;
    round_trip("all words in order", w, n, H3_WPACK_CHUNK, NULL);
    round_trip("all words, chunk 16", w, n, 16, NULL);
    for (uint64_t i = n - 1; i > 0; i--) { /* shuffled: every chunk mixes everything */
        ctest_rng ^= ctest_rng << 13, ctest_rng ^= ctest_rng >> 7, ctest_rng ^= ctest_rng << 17;
        const uint64_t k = ctest_rng % (i + 1);
        const uint16_t t = w[i];
        w[i] = w[k];
        w[k] = t;
    }
    round_trip("all words shuffled", w, n, H3_WPACK_CHUNK, NULL);
    free(w);
}

static void test_special(void)
{
    const uint64_t n = 5 * H3_WPACK_CHUNK + 17; /* a short last chunk */
    uint16_t *w = calloc(n, sizeof *w);
    round_trip("all zeros", w, n, H3_WPACK_CHUNK, NULL);
    for (uint64_t i = 0; i < n; i++) /* runs of +-0 */
        w[i] = (i / 100) % 2 ? to_bf16(0.02f * gauss()) : (i & 1 ? 0x8000u : 0);
    round_trip("runs of zeros", w, n, H3_WPACK_CHUNK, NULL);
    static const uint16_t odd[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F};
    for (uint64_t i = 0; i < n; i++) w[i] = i % 7 == 0 ? odd[(i / 7) % 10] : to_bf16(gauss());
    round_trip("inf, NaN, subnormals among gaussians", w, n, H3_WPACK_CHUNK, NULL);
    /* every value but the chunk's largest escapes (E0 = 250, the rest 235 and below) */
    for (uint64_t i = 0; i < n; i++)
        w[i] = (uint16_t)(i % H3_WPACK_CHUNK == 5 ? 250u << 7 : ((i * 37) % 236) << 7 | (i & 0x807F));
    uint8_t *img;
    const uint64_t size = round_trip("all but the max escape", w, n, H3_WPACK_CHUNK, &img);
    h3_wpack_layout l;
    CHECK(h3_wpack_header(img, size, &l) == 0 && l.escapes == n - 6);
    free(img);
    for (uint64_t m = 0; m < 6; m++) { /* n = 0, 1, 2, 3, 4097, 8191 */
        static const uint64_t ns[] = {0, 1, 2, 3, 4097, 8191};
        char what[48];
        snprintf(what, sizeof what, "n = %llu", (unsigned long long)ns[m]);
        round_trip(what, w, ns[m], H3_WPACK_CHUNK, NULL);
    }
    free(w);
}

/* A corrupt or truncated image: an error with a message, never a crash (ASan run checks that). */
static void test_corrupt(void)
{
    const uint64_t n = 3 * H3_WPACK_CHUNK + 9;
    uint16_t *w = malloc(sizeof *w * n), *back = malloc(sizeof *back * n);
    for (uint64_t i = 0; i < n; i++) w[i] = i % 50 == 0 ? 0 : to_bf16(0.02f * gauss());
    uint8_t *img;
    const uint64_t size = round_trip("corruption source", w, n, H3_WPACK_CHUNK, &img);
    h3_wpack_layout l;
    CHECK(h3_wpack_header(img, size, &l) == 0 && l.escapes > 0);
    uint8_t *bad = malloc(size);
    /* truncated */
    static const uint64_t cuts[] = {0, 1, 255, 256, 300};
    for (int k = 0; k < 5; k++) {
        (void)h3_err(H3_E_INVALID, "sentinel");
        CHECK_MSG(h3_wpack_decode(img, cuts[k], back, n) == -H3_E_FORMAT && strcmp(h3_last_error(), "sentinel"),
                  "cut to %llu", (unsigned long long)cuts[k]);
    }
    CHECK(h3_wpack_decode(img, size - 1, back, n) == -H3_E_FORMAT);
    CHECK(h3_wpack_decode(NULL, size, back, n) == -H3_E_FORMAT);
    CHECK(h3_wpack_decode(img, size, back, n - 1) == -H3_E_FORMAT && strstr(h3_last_error(), "values"));
#define CORRUPT(what, stmt)                                                                                \
    do {                                                                                                   \
        memcpy(bad, img, size);                                                                            \
        stmt;                                                                                              \
        (void)h3_err(H3_E_INVALID, "sentinel");                                                            \
        CHECK_MSG(h3_wpack_decode(bad, size, back, n) == -H3_E_FORMAT && strcmp(h3_last_error(), "sentinel"), \
                  "%s", what);                                                                             \
    } while (0)
    CORRUPT("magic", bad[0] ^= 1);
    CORRUPT("version", bad[4] = 9);
    CORRUPT("n", bad[8] ^= 1);
    CORRUPT("n huge", bad[15] = 0x80);
    CORRUPT("chunk odd", bad[16] ^= 1);
    CORRUPT("chunk zero", memset(bad + 16, 0, 4));
    CORRUPT("chunks", bad[24] ^= 1);
    CORRUPT("escapes", bad[32] ^= 1);
    CORRUPT("total", bad[40] ^= 1);
    CORRUPT("escoff[0]", bad[l.escoff] = 1);
    CORRUPT("escoff last", bad[l.escoff + 4 * l.chunks] ^= 1);
    CORRUPT("escoff middle", memset(bad + l.escoff + 4, 0xFF, 4));
    CORRUPT("a code turned escape", bad[l.nib] |= 0xF0); /* value 1: not an escape */
    CORRUPT("E0 lowered", bad[l.e0] = 0);
    CORRUPT("escape byte raised", bad[l.esc] = 255);
    CORRUPT("code past the end", bad[l.nib + n / 2] |= 0x10);
#undef CORRUPT
    /* random byte flips: either an error or some words back, never a fault */
    int rejected = 0;
    for (int t = 0; t < 2000; t++) {
        memcpy(bad, img, size);
        ctest_rng ^= ctest_rng << 13, ctest_rng ^= ctest_rng >> 7, ctest_rng ^= ctest_rng << 17;
        const uint64_t at = t < 1000 ? ctest_rng % l.sm : ctest_rng % size; /* the header and tables first */
        bad[at] ^= (uint8_t)(1u << (ctest_rng >> 40) % 8);
        rejected += h3_wpack_decode(bad, size, back, n) != 0;
    }
    printf("random single-bit flips: %d of 2000 rejected (flips of sign/mantissa bytes decode)\n", rejected);
    CHECK(rejected > 0);
    /* the encoder refuses a buffer too small and a bad chunk */
    CHECK(h3_wpack_encode(w, n, H3_WPACK_CHUNK, bad, size - 1, NULL, NULL) == -H3_E_INVALID);
    CHECK(h3_wpack_encode(w, n, 3, bad, size, NULL, NULL) == -H3_E_INVALID);
    CHECK(h3_wpack_size(w, n, 0, NULL, NULL) == 0);
    free(bad);
    free(img);
    free(w);
    free(back);
}

static void test_stream_max(void)
{
    /* The largest image streaming takes: 85 % of the words' bytes, rounded down to 256 (the GPU's
       per-slot staging); a Gaussian released-width block (~76 %) fits with room. */
    const uint64_t big = 770u << 20;
    CHECK(h3_wpack_stream_max(big) % 256 == 0 && h3_wpack_stream_max(big) <= big / 20 * 17);
    CHECK(h3_wpack_stream_max(big) > big / 100 * 84);
    CHECK(h3_wpack_stream_max(100) == 0);
}

int main(void)
{
    g_pool2 = h3_pool_create(2);
    CHECK(g_pool2 != NULL);
    test_gaussian();
    test_all_words();
    test_special();
    test_corrupt();
    test_stream_max();
    h3_pool_destroy(g_pool2);
    CTEST_END();
}
