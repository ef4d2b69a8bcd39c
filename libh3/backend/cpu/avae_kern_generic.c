/* Audio VAE kernels at the baseline ISA: the reference path (H3_NO_SIMD=1) and old CPUs. */
#include "backend/cpu/avae_kern.h"

#include <string.h>

#define AKVARIANT h3_avae_kernels_generic
#define AKNAME "generic"
#include "avae_kern.inc"

const h3_avae_kernels *h3_avae_kern(void)
{
#if defined(__x86_64__) || defined(__i386__)
    /* Follow the main kernels' choice (CPUID and H3_NO_SIMD) so both families switch together. */
    if (strcmp(h3_kernels_variant(), "avx2") == 0) return &h3_avae_kernels_avx2;
#endif
    return &h3_avae_kernels_generic;
}
