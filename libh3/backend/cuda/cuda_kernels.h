/*
 * Kernels compiled at run time. Every kernel lives in one module, kernels/<name>.cu (device code
 * only, including only kernels/h3k.h and its own kernels/<name>.h), embedded in libh3_cuda at build
 * time and compiled by NVRTC for the GPU found (a real cubin, -arch=sm_XY) on first use of the
 * module, through the disk cache of cuda_kernels.cpp.
 *
 * A launcher file declares each kernel it launches once, at namespace scope, with its parameter
 * types (H3K below), and launches it like a function: k_euler(b, grid, block, smem, stream, args...).
 * The arguments convert to the declared types as they would in a <<<...>>> launch, and the
 * declared types are checked against the kernel's own when the module compiles (a static_assert
 * NVRTC evaluates), so a host declaration that disagrees with the kernel fails the compile test
 * rather than passing garbage. Template kernels are declared once per instantiation; the name is
 * the C++ expression NVRTC instantiates (nvrtcAddNameExpression).
 */
#ifndef H3_CUDA_KERNELS_H
#define H3_CUDA_KERNELS_H

#include "backend/cuda/cuda_common.h"

#include <string>

namespace h3cuda {

/* Grid and block sizes (the <<<...>>> dim3). */
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

/* Adds a kernel to module `mod`'s list (static initialisation); returns its index there. */
int kernel_register(int mod, const std::string &expr, const char *params);
/* The function of kernel `idx` of module `mod`, compiling or loading the module first; NULL after
   recording an error. */
CUfunction kernel_function(Backend *b, int mod, int idx);
int kernel_launch(Backend *b, int mod, int idx, dim3 grid, dim3 block, size_t smem, CUstream st, void **args);
/* Raise the kernel's dynamic shared memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize). */
int kernel_max_smem(Backend *b, int mod, int idx, size_t bytes);

template <class... P> class Kernel {
  public:
    Kernel(int mod, const std::string &expr, const char *params)
        : mod_(mod), idx_(kernel_register(mod, expr, params)) {}
    int operator()(Backend *b, dim3 grid, dim3 block, size_t smem, CUstream st, P... p) const
    {
        void *args[] = {(void *)&p..., NULL};
        return kernel_launch(b, mod_, idx_, grid, block, smem, st, args);
    }
    int max_smem(Backend *b, size_t bytes) const { return kernel_max_smem(b, mod_, idx_, bytes); }

  private:
    int mod_, idx_;
};

/* H3K(k_euler, MOD_ROWS, "euler_kernel", float *, const float *, int64_t, float, float, float);
   the kernel's name without the namespace (the modules' kernels live in namespace h3cuda). */
#define H3K(var, mod, expr, ...) static const ::h3cuda::Kernel<__VA_ARGS__> var(mod, expr, #__VA_ARGS__)

/* ---- modules ------------------------------------------------------------------------------- */

/* Compiles (or loads from the cache) every module for this backend's GPU, with one progress line
   per module through the host (h3ctl warmup). */
int kernels_warmup(Backend *b);
/* Unloads the modules (backend teardown). */
void kernels_destroy(Backend *b);
/* Number of modules and their names ("attention" for kernels/attention.cu). */
int kernel_module_count(void);
const char *kernel_module_name(int mod);
/* Compiles module `mod` to a cubin for sm_<arch> with NVRTC, no GPU needed (the compile check and
   the backend share this path). 0, or -1 with NVRTC's log in err. */
int kernel_module_compile(int mod, int arch, std::string *cubin, std::string *lowered, std::string *err);

} /* namespace h3cuda */

#endif /* H3_CUDA_KERNELS_H */
