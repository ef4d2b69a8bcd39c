/* Shared by cuda_fp8.cpp and kernels/fp8.cu: the kernels' argument structs and constants. */
#ifndef H3K_FP8_H
#define H3K_FP8_H

namespace h3cuda {

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* Where the scales go (see the top of the file); FP8_POST_BF16: the GEMM writes a bf16 scratch
   that the scale pass turns into Y, for an f32 Y where cuBLASLt has no f32-output fp8 kernel. */
enum { FP8_OUTER = 1, FP8_POST = 2, FP8_POST_BF16 = 3 };

} /* namespace h3cuda */

#endif
