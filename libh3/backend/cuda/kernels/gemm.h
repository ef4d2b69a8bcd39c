/* Shared by cuda_gemm.cpp and kernels/gemm.cu: the kernels' argument structs and constants. */
#ifndef H3K_GEMM_H
#define H3K_GEMM_H

namespace h3cuda {


/* Bias classes of a call: none, fused in the epilogue, added by bias_store. */
enum { BIAS_NONE = 0, BIAS_EPILOGUE = 1, BIAS_KERNEL = 2 };

/* ---- the fallback: a plain tiled GEMM ------------------------------------------------------ */

#define FB_T 16

} /* namespace h3cuda */

#endif
