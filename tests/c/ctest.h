/* Minimal C test harness: CHECK records a failure and continues; main returns non-zero. */
#ifndef H3_CTEST_H
#define H3_CTEST_H
#include <math.h>
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

#define CTEST_END()                                                                    \
    do {                                                                               \
        printf("%d checks, %d failures\n", ctest_checks, ctest_failures);            \
        return ctest_failures ? 1 : 0;                                                 \
    } while (0)
#endif
