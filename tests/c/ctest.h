/* Minimal C test harness: CHECK records a failure and continues; main returns non-zero. */
#ifndef H3_CTEST_H
#define H3_CTEST_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int ctest_failures = 0;
static int ctest_checks = 0;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        ctest_checks++;                                                                \
        if (!(cond)) {                                                                 \
            ctest_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                              \
    } while (0)

#define CHECK_MSG(cond, ...)                                                           \
    do {                                                                               \
        ctest_checks++;                                                                \
        if (!(cond)) {                                                                 \
            ctest_failures++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

/* Deterministic test data: xorshift64, uniform in [-1, 1). Tests may reseed ctest_rng. */
static uint64_t ctest_rng = 0x9E3779B97F4A7C15ull;
static inline float frand(void)
{
    ctest_rng ^= ctest_rng << 13;
    ctest_rng ^= ctest_rng >> 7;
    ctest_rng ^= ctest_rng << 17;
    return (float)((ctest_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* ||a - ref|| / ||ref|| against a double-precision reference. */
static inline double rel_l2(const float *a, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

#define CTEST_END()                                                                    \
    do {                                                                               \
        printf("%d checks, %d failures\n", ctest_checks, ctest_failures);            \
        return ctest_failures ? 1 : 0;                                                 \
    } while (0)
#endif
