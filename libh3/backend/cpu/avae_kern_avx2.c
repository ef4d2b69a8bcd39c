/* Audio VAE kernels compiled with AVX2+FMA+F16C; selected at run time only on CPUs that have them. */
#include "backend/cpu/avae_kern.h"

#if defined(__x86_64__) || defined(__i386__)
#define AKVARIANT h3_avae_kernels_avx2
#define AKNAME "avx2"
#include "avae_kern.inc"
#endif
