/* Shared by cuda_wpack.cpp and kernels/wpack.cu: the kernels' argument structs and constants. */
#ifndef H3K_WPACK_H
#define H3K_WPACK_H

namespace h3cuda {


enum { WP_THREADS = 256, WP_VPT = 16 };

} /* namespace h3cuda */

#endif
