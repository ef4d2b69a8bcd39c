/*
 * The subset of NVIDIA's CUDA driver API (cuda.h), NVRTC (nvrtc.h) and cuBLASLt (cublasLt.h) that
 * libh3_cuda uses, declared here so the backend builds with an ordinary C++ compiler and no CUDA
 * header: names, signatures and enum values are NVIDIA's (the _v2 entry points where cuda.h maps a
 * name to one). Every function is a pointer in namespace h3cuda, filled by cuda_loader.cpp from
 * libraries opened at run time (libcuda.so.1 from the driver, libnvrtc.so.13 and libcublasLt.so.13
 * from the nvidia-cuda-nvrtc / nvidia-cublas wheels or the system), so a call reads as the C API.
 */
#ifndef H3_CUDA_DRIVER_H
#define H3_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

namespace h3cuda {

/* ---- driver API (cuda.h) ------------------------------------------------------------------- */

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_ECC_UNCORRECTABLE = 214,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;

typedef int CUdevice_attribute;
enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
};
typedef int CUfunction_attribute;
enum { CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
typedef int CUpointer_attribute;
enum { CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2 };
typedef int CUmemorytype;
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_UNIFIED = 4 };
enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DISABLE_TIMING = 2 };

typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes, srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

/* X(return type, our name, symbol in libcuda.so.1, parameters) */
#define H3_CU_FUNCS(X)                                                                                              \
    X(CUresult, cuInit, "cuInit", (unsigned int Flags))                                                             \
    X(CUresult, cuDriverGetVersion, "cuDriverGetVersion", (int *driverVersion))                                     \
    X(CUresult, cuGetErrorString, "cuGetErrorString", (CUresult error, const char **pStr))                          \
    X(CUresult, cuGetErrorName, "cuGetErrorName", (CUresult error, const char **pStr))                              \
    X(CUresult, cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                                 \
    X(CUresult, cuDeviceGet, "cuDeviceGet", (CUdevice * device, int ordinal))                                       \
    X(CUresult, cuDeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice dev))                            \
    X(CUresult, cuDeviceTotalMem, "cuDeviceTotalMem_v2", (size_t * bytes, CUdevice dev))                            \
    X(CUresult, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *pi, CUdevice_attribute attrib, CUdevice dev))  \
    X(CUresult, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * pctx, CUdevice dev))             \
    X(CUresult, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice dev))                          \
    X(CUresult, cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext ctx))                                                \
    X(CUresult, cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext * pctx))                                             \
    X(CUresult, cuCtxSynchronize, "cuCtxSynchronize", (void))                                                       \
    X(CUresult, cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * dptr, size_t bytesize))                                 \
    X(CUresult, cuMemFree, "cuMemFree_v2", (CUdeviceptr dptr))                                                      \
    X(CUresult, cuMemGetInfo, "cuMemGetInfo_v2", (size_t * free, size_t *total))                                    \
    X(CUresult, cuMemHostAlloc, "cuMemHostAlloc", (void **pp, size_t bytesize, unsigned int Flags))                 \
    X(CUresult, cuMemFreeHost, "cuMemFreeHost", (void *p))                                                          \
    X(CUresult, cuMemcpyAsync, "cuMemcpyAsync", (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpy2DAsync, "cuMemcpy2DAsync_v2", (const CUDA_MEMCPY2D *pCopy, CUstream hStream))              \
    X(CUresult, cuMemsetD8Async, "cuMemsetD8Async", (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)) \
    X(CUresult, cuMemsetD2D8Async, "cuMemsetD2D8Async",                                                             \
      (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream))    \
    X(CUresult, cuStreamCreate, "cuStreamCreate", (CUstream * phStream, unsigned int Flags))                        \
    X(CUresult, cuStreamDestroy, "cuStreamDestroy_v2", (CUstream hStream))                                          \
    X(CUresult, cuStreamSynchronize, "cuStreamSynchronize", (CUstream hStream))                                     \
    X(CUresult, cuStreamWaitEvent, "cuStreamWaitEvent", (CUstream hStream, CUevent hEvent, unsigned int Flags))     \
    X(CUresult, cuEventCreate, "cuEventCreate", (CUevent * phEvent, unsigned int Flags))                            \
    X(CUresult, cuEventRecord, "cuEventRecord", (CUevent hEvent, CUstream hStream))                                 \
    X(CUresult, cuEventSynchronize, "cuEventSynchronize", (CUevent hEvent))                                         \
    X(CUresult, cuEventDestroy, "cuEventDestroy_v2", (CUevent hEvent))                                              \
    X(CUresult, cuPointerGetAttribute, "cuPointerGetAttribute", (void *data, CUpointer_attribute attribute, CUdeviceptr ptr)) \
    X(CUresult, cuModuleLoadData, "cuModuleLoadData", (CUmodule * module, const void *image))                       \
    X(CUresult, cuModuleUnload, "cuModuleUnload", (CUmodule hmod))                                                  \
    X(CUresult, cuModuleGetFunction, "cuModuleGetFunction", (CUfunction * hfunc, CUmodule hmod, const char *name))  \
    X(CUresult, cuFuncSetAttribute, "cuFuncSetAttribute", (CUfunction hfunc, CUfunction_attribute attrib, int value)) \
    X(CUresult, cuLaunchKernel, "cuLaunchKernel",                                                                   \
      (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,   \
       unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,               \
       void **kernelParams, void **extra))

/* ---- NVRTC (nvrtc.h) ----------------------------------------------------------------------- */

typedef int nvrtcResult;
enum { NVRTC_SUCCESS = 0 };
typedef struct _nvrtcProgram *nvrtcProgram;

#define H3_NVRTC_FUNCS(X)                                                                                           \
    X(const char *, nvrtcGetErrorString, "nvrtcGetErrorString", (nvrtcResult result))                               \
    X(nvrtcResult, nvrtcVersion, "nvrtcVersion", (int *major, int *minor))                                          \
    X(nvrtcResult, nvrtcCreateProgram, "nvrtcCreateProgram",                                                        \
      (nvrtcProgram * prog, const char *src, const char *name, int numHeaders, const char *const *headers,         \
       const char *const *includeNames))                                                                            \
    X(nvrtcResult, nvrtcDestroyProgram, "nvrtcDestroyProgram", (nvrtcProgram * prog))                               \
    X(nvrtcResult, nvrtcCompileProgram, "nvrtcCompileProgram",                                                      \
      (nvrtcProgram prog, int numOptions, const char *const *options))                                              \
    X(nvrtcResult, nvrtcGetCUBINSize, "nvrtcGetCUBINSize", (nvrtcProgram prog, size_t *cubinSizeRet))               \
    X(nvrtcResult, nvrtcGetCUBIN, "nvrtcGetCUBIN", (nvrtcProgram prog, char *cubin))                                \
    X(nvrtcResult, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", (nvrtcProgram prog, size_t *logSizeRet))       \
    X(nvrtcResult, nvrtcGetProgramLog, "nvrtcGetProgramLog", (nvrtcProgram prog, char *log))                        \
    X(nvrtcResult, nvrtcAddNameExpression, "nvrtcAddNameExpression", (nvrtcProgram prog, const char *name_expression)) \
    X(nvrtcResult, nvrtcGetLoweredName, "nvrtcGetLoweredName",                                                      \
      (nvrtcProgram prog, const char *name_expression, const char **lowered_name))

/* ---- cuBLASLt (cublasLt.h, library_types.h) ------------------------------------------------ */

typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_ALLOC_FAILED = 3, CUBLAS_STATUS_NOT_SUPPORTED = 15 };
typedef int cudaDataType;
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14, CUDA_R_8F_E4M3 = 28 };
typedef int cublasComputeType_t;
enum { CUBLAS_COMPUTE_32F = 68 };
typedef int cublasOperation_t;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
typedef int cublasLtEpilogue_t;
enum { CUBLASLT_EPILOGUE_BIAS = 4 };
typedef int cublasLtMatmulDescAttributes_t;
enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
};
enum { CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3 };
typedef int cublasLtMatmulPreferenceAttributes_t;
enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};
enum { CUBLASLT_REDUCTION_SCHEME_NONE = 0 };
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_st *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_st *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_st *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

#define H3_LT_FUNCS(X)                                                                                              \
    X(size_t, cublasLtGetVersion, "cublasLtGetVersion", (void))                                                     \
    X(cublasStatus_t, cublasLtCreate, "cublasLtCreate", (cublasLtHandle_t * lightHandle))                           \
    X(cublasStatus_t, cublasLtDestroy, "cublasLtDestroy", (cublasLtHandle_t lightHandle))                           \
    X(const char *, cublasLtGetStatusName, "cublasLtGetStatusName", (cublasStatus_t status))                        \
    X(const char *, cublasLtGetStatusString, "cublasLtGetStatusString", (cublasStatus_t status))                    \
    X(cublasStatus_t, cublasLtMatmul, "cublasLtMatmul",                                                             \
      (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha, const void *A,           \
       cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,  \
       cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,       \
       void *workspace, size_t workspaceSizeInBytes, CUstream stream))                                              \
    X(cublasStatus_t, cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate",                                     \
      (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld))           \
    X(cublasStatus_t, cublasLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy", (cublasLtMatrixLayout_t matLayout)) \
    X(cublasStatus_t, cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate",                                         \
      (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType scaleType))                \
    X(cublasStatus_t, cublasLtMatmulDescDestroy, "cublasLtMatmulDescDestroy", (cublasLtMatmulDesc_t matmulDesc))    \
    X(cublasStatus_t, cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute",                             \
      (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void *buf, size_t sizeInBytes)) \
    X(cublasStatus_t, cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate",                             \
      (cublasLtMatmulPreference_t * pref))                                                                          \
    X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy",                           \
      (cublasLtMatmulPreference_t pref))                                                                            \
    X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute",                 \
      (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,                \
       size_t sizeInBytes))                                                                                         \
    X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic",                             \
      (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,             \
       cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,                    \
       cublasLtMatmulPreference_t preference, int requestedAlgoCount,                                               \
       cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount))

#define H3_DECLARE_FN(ret, name, sym, params) extern ret(*name) params;
H3_CU_FUNCS(H3_DECLARE_FN)
H3_NVRTC_FUNCS(H3_DECLARE_FN)
H3_LT_FUNCS(H3_DECLARE_FN)
#undef H3_DECLARE_FN

/* ---- loading (cuda_loader.cpp) ------------------------------------------------------------- */

/* Paths the host passed (h3_backend_host); NULL or "": the loader's search. */
struct LibPaths {
    const char *libcuda, *nvrtc, *cublaslt;
};
/* Opens libcuda.so.1 and calls cuInit(0), once per process; 0, or -1 with the reason in why. */
int load_driver(const char *path, char *why, size_t cap);
/* Opens libnvrtc.so.13 (and libnvrtc-builtins from the same folder first), once per process. */
int load_nvrtc(const char *path, char *why, size_t cap);
/* Opens libcublasLt.so.13, once per process. */
int load_cublaslt(const char *path, char *why, size_t cap);
/* The driver's name and description of a result: "CUDA_ERROR_OUT_OF_MEMORY: out of memory". */
const char *cu_errstr(CUresult e);

/* Device pointers are host-side void * in the backend; the driver takes integers. */
static inline CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }
static inline CUresult cu_malloc(void **p, size_t bytes)
{
    CUdeviceptr d = 0;
    CUresult e = cuMemAlloc(&d, bytes);
    *p = e == CUDA_SUCCESS ? (void *)(uintptr_t)d : NULL;
    return e;
}
static inline CUresult cu_free(void *p) { return p ? cuMemFree(dptr(p)) : CUDA_SUCCESS; }
/* Any direction (unified addressing tells host from device memory). */
static inline CUresult cu_copy(void *dst, const void *src, size_t bytes, CUstream s)
{
    return cuMemcpyAsync(dptr(dst), dptr(src), bytes, s);
}
static inline CUresult cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                                 CUstream s)
{
    CUDA_MEMCPY2D c = {};
    c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
    c.srcDevice = dptr(src);
    c.srcPitch = spitch;
    c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    c.dstDevice = dptr(dst);
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = height;
    return cuMemcpy2DAsync(&c, s);
}
static inline CUresult cu_memset(void *dst, int v, size_t bytes, CUstream s)
{
    return cuMemsetD8Async(dptr(dst), (unsigned char)v, bytes, s);
}
static inline CUresult cu_memset2d(void *dst, size_t pitch, int v, size_t width, size_t height, CUstream s)
{
    return cuMemsetD2D8Async(dptr(dst), pitch, (unsigned char)v, width, height, s);
}
static inline CUresult cu_host_alloc(void **p, size_t bytes)
{
    CUresult e = cuMemHostAlloc(p, bytes, 0);
    if (e != CUDA_SUCCESS) *p = NULL;
    return e;
}

} /* namespace h3cuda */

#endif /* H3_CUDA_DRIVER_H */
