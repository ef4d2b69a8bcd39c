/* Kernels compiled with AVX2+FMA+F16C; selected at run time only on CPUs that have them. */
#include "backend/cpu/ops.h"

#if defined(__x86_64__) || defined(__i386__)
#define KVARIANT h3_kernels_avx2
#define KNAME "avx2"
#include "kernels.inc"
#endif
