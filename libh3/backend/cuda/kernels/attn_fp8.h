/* Shared by cuda_attn_fp8.cpp and kernels/attn_fp8.cu. */
#ifndef H3K_ATTN_FP8_H
#define H3K_ATTN_FP8_H
namespace h3cuda {
/* The scalars block (64-byte slots, see h3_cudnn_sdpa_fp8): [0..6) cuDNN's scales at 16-float
   spacing, then the amax outputs, then the three input maxima as unsigned bit patterns. */
constexpr int SC_FLOATS = 6 * 16;      /* descale q, k, v, descale s, scale s, scale o */
constexpr int AMAX_OUT = SC_FLOATS;    /* cuDNN's amax_s, amax_o (at +0 and +4) */
constexpr int AMAX_IN = SC_FLOATS + 8; /* max|Q|, max|K|, max|V| as uint bits */
constexpr int SCALARS = SC_FLOATS + 16;

} /* namespace h3cuda */
#endif
