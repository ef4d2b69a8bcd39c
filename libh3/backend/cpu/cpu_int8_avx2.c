/* The int8 weight kernels compiled with AVX2; selected at run time only where the f32 kernels run
   their AVX2 variant (the GEMM pairs the two tables). */
#include "backend/cpu/cpu_int8.h"

#if defined(__x86_64__) || defined(__i386__)
#define I8VARIANT h3_i8_kernels_avx2
#define I8NAME "avx2"
#include "cpu_int8.inc"
#endif
