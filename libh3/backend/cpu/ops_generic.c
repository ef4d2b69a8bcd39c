/* Kernels at the baseline ISA: the reference path (H3_NO_SIMD=1) and the fallback on old CPUs. */
#include "backend/cpu/ops.h"

#define KVARIANT h3_kernels_generic
#define KNAME "generic"
#include "kernels.inc"
