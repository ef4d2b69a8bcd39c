/*
 * Fake CUDA backend libraries for test_backend_abi, built by the ordinary C compiler (no CUDA):
 * what backend.c sees when libh3_cuda.so comes from another build of libh3. One source, three
 * libraries (-DFAKE_noabi, -DFAKE_wrong, -DFAKE_hollow):
 *   noabi   a library from before the ABI number: it exports the create function only;
 *   wrong   it exports an ABI number that is not this libh3's;
 *   hollow  the right number, but the backend it creates lacks its memory table.
 * A refused library must not be called past its ABI function: noabi's and wrong's create
 * functions abort the test.
 */
#include "backend/backend.h"

#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

#if defined(FAKE_wrong)
EXPORT uint32_t h3_backend_cuda_abi(void) { return H3_BACKEND_ABI + 1000u; }
#elif defined(FAKE_hollow)
EXPORT uint32_t h3_backend_cuda_abi(void) { return H3_BACKEND_ABI; }
#elif !defined(FAKE_noabi)
#error "define FAKE_noabi, FAKE_wrong or FAKE_hollow"
#endif

#if defined(FAKE_hollow)
static int hollow_linear(h3_backend *be, const h3_bt *X, const h3_bw *W, const float *bias, const h3_bt *Y)
{
    (void)be, (void)X, (void)W, (void)bias, (void)Y;
    return 0;
}
static const h3_backend_ops hollow_ops = {.linear = hollow_linear};
static const h3_backend_weights hollow_weights = {0};
static void hollow_destroy(h3_backend *be) { free(be); }

EXPORT int h3_backend_cuda_create(const h3_backend_host *host, int device_ordinal, h3_backend **out)
{
    (void)host, (void)device_ordinal;
    h3_backend *be = calloc(1, sizeof *be);
    if (!be) return -H3_E_NOMEM;
    be->name = "cuda";
    be->abi_version = H3_BACKEND_ABI;
    be->weights = &hollow_weights;
    be->ops = &hollow_ops;
    be->destroy = hollow_destroy; /* mem is missing */
    *out = be;
    return 0;
}
#else
EXPORT int h3_backend_cuda_create(const h3_backend_host *host, int device_ordinal, h3_backend **out)
{
    (void)host, (void)device_ordinal, (void)out;
    abort(); /* a library with another ABI was called */
}
#endif
