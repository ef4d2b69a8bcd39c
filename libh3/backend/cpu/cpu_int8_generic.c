/* The int8 weight kernels at the baseline ISA: the reference path (H3_NO_SIMD=1) and old CPUs. */
#include "backend/cpu/cpu_int8.h"

#define I8VARIANT h3_i8_kernels_generic
#define I8NAME "generic"
#include "cpu_int8.inc"
