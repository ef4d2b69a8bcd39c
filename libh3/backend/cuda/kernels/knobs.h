/* Shared by cuda_knobs.cpp and kernels/knobs.cu: the kernels' argument structs and constants. */
#ifndef H3K_KNOBS_H
#define H3K_KNOBS_H

namespace h3cuda {

#define SUM_BLOCK 4096 /* values per partial sum, as on the CPU */
#define SUM_NT 256
#define FIN_NT 1024

} /* namespace h3cuda */

#endif
