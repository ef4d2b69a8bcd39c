/*
 * The part of cuDNN 9's C API that libh3's attention path (cuda_sdpa_cudnn.cpp) uses: the handle
 * calls and the backend (graph) API, with NVIDIA's names, signatures and enum values as cuDNN 9's
 * cudnn_graph.h defines them. Written here so that nothing of cuDNN is needed at build time: the
 * library is opened at run time and every function below is looked up by name (dlsym) into a
 * table of pointers; none of these names is ever linked.
 *
 * Only what is used is declared. The values are part of cuDNN's ABI, stable within cuDNN 9
 * (new enumerators are only ever appended).
 */
#ifndef H3_CUDNN_API_H
#define H3_CUDNN_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudnnContext *cudnnHandle_t;
typedef void *cudnnBackendDescriptor_t;
/* cudaStream_t and CUstream are the same pointer type (struct CUstream_st *). */
typedef struct CUstream_st *cudaStream_t;

typedef enum {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
} cudnnStatus_t;

typedef enum {
    CUDNN_DATA_FLOAT = 0,
    CUDNN_DATA_INT32 = 4,
    CUDNN_DATA_BFLOAT16 = 9,
    CUDNN_DATA_BOOLEAN = 11,
    CUDNN_DATA_FP8_E4M3 = 12,
} cudnnDataType_t;

typedef enum {
    CUDNN_POINTWISE_ADD = 0,
    CUDNN_POINTWISE_MUL = 1,
    CUDNN_POINTWISE_DIV = 6,
    CUDNN_POINTWISE_SUB = 9,
    CUDNN_POINTWISE_EXP = 13,
    CUDNN_POINTWISE_LOG = 15,
    CUDNN_POINTWISE_CMP_GE = 303,
    CUDNN_POINTWISE_GEN_INDEX = 501,
    CUDNN_POINTWISE_BINARY_SELECT = 601,
} cudnnPointwiseMode_t;

typedef enum {
    CUDNN_REDUCE_TENSOR_ADD = 0,
    CUDNN_REDUCE_TENSOR_MAX = 3,
    CUDNN_REDUCE_TENSOR_AMAX = 4,
} cudnnReduceTensorOp_t;

typedef enum {
    CUDNN_ATTR_POINTWISE_MODE = 0,
    CUDNN_ATTR_POINTWISE_MATH_PREC = 1,
    CUDNN_ATTR_POINTWISE_AXIS = 9,

    CUDNN_ATTR_ENGINEHEUR_MODE = 200,
    CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
    CUDNN_ATTR_ENGINEHEUR_RESULTS = 202,

    CUDNN_ATTR_ENGINECFG_ENGINE = 300,
    CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE = 303,
    CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED = 304,

    CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
    CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,

    CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR = 750,
    CUDNN_ATTR_OPERATION_POINTWISE_XDESC = 751,
    CUDNN_ATTR_OPERATION_POINTWISE_BDESC = 752,
    CUDNN_ATTR_OPERATION_POINTWISE_YDESC = 753,
    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1 = 754,
    CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2 = 755,
    CUDNN_ATTR_OPERATION_POINTWISE_TDESC = 758,

    CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800,
    CUDNN_ATTR_OPERATIONGRAPH_OPS = 801,

    CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900,
    CUDNN_ATTR_TENSOR_DATA_TYPE = 901,
    CUDNN_ATTR_TENSOR_DIMENSIONS = 902,
    CUDNN_ATTR_TENSOR_STRIDES = 903,
    CUDNN_ATTR_TENSOR_UNIQUE_ID = 906,
    CUDNN_ATTR_TENSOR_IS_VIRTUAL = 907,
    CUDNN_ATTR_TENSOR_IS_BY_VALUE = 908,

    CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000,
    CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
    CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003,

    CUDNN_ATTR_ENGINE_NUMERICAL_NOTE = 1303,
    CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE = 1305,

    CUDNN_ATTR_MATMUL_COMP_TYPE = 1500,
    CUDNN_ATTR_OPERATION_MATMUL_ADESC = 1520,
    CUDNN_ATTR_OPERATION_MATMUL_BDESC = 1521,
    CUDNN_ATTR_OPERATION_MATMUL_CDESC = 1522,
    CUDNN_ATTR_OPERATION_MATMUL_DESC = 1523,

    CUDNN_ATTR_REDUCTION_OPERATOR = 1600,
    CUDNN_ATTR_REDUCTION_COMP_TYPE = 1601,
    CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC = 1602,
    CUDNN_ATTR_OPERATION_REDUCTION_XDESC = 1610,
    CUDNN_ATTR_OPERATION_REDUCTION_YDESC = 1611,
    CUDNN_ATTR_OPERATION_REDUCTION_DESC = 1612,

    CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC = 2800,
    CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC = 2801,
    CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC = 2802,
    CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC = 2803,
    CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC = 2805,
} cudnnBackendAttributeName_t;

typedef enum {
    CUDNN_TYPE_HANDLE = 0,
    CUDNN_TYPE_DATA_TYPE = 1,
    CUDNN_TYPE_BOOLEAN = 2,
    CUDNN_TYPE_INT64 = 3,
    CUDNN_TYPE_FLOAT = 4,
    CUDNN_TYPE_VOID_PTR = 6,
    CUDNN_TYPE_HEUR_MODE = 8,
    CUDNN_TYPE_NUMERICAL_NOTE = 11,
    CUDNN_TYPE_POINTWISE_MODE = 14,
    CUDNN_TYPE_BACKEND_DESCRIPTOR = 15,
    CUDNN_TYPE_REDUCTION_OPERATOR_TYPE = 18,
    CUDNN_TYPE_BEHAVIOR_NOTE = 19,
    CUDNN_TYPE_INT32 = 23,
} cudnnBackendAttributeType_t;

typedef enum {
    CUDNN_BACKEND_POINTWISE_DESCRIPTOR = 0,
    CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2,
    CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3,
    CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4,
    CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5,
    CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR = 13,
    CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15,
    CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16,
    CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17,
    CUDNN_BACKEND_MATMUL_DESCRIPTOR = 18,
    CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR = 19,
    CUDNN_BACKEND_REDUCTION_DESCRIPTOR = 21,
    CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR = 22,
    CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR = 41,
} cudnnBackendDescriptorType_t;

typedef enum {
    CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC = 4,
    CUDNN_NUMERICAL_NOTE_TYPE_COUNT = 10,
} cudnnBackendNumericalNote_t;

typedef enum {
    CUDNN_BEHAVIOR_NOTE_TYPE_COUNT = 5,
} cudnnBackendBehaviorNote_t;

typedef enum {
    CUDNN_HEUR_MODE_A = 3,
} cudnnBackendHeurMode_t;

/* The functions, as pointer types for the table filled by dlsym. */
typedef size_t (*cudnnGetVersion_fn)(void);
typedef size_t (*cudnnGetCudartVersion_fn)(void);
typedef const char *(*cudnnGetErrorString_fn)(cudnnStatus_t status);
typedef void (*cudnnGetLastErrorString_fn)(char *message, size_t max_size);
typedef cudnnStatus_t (*cudnnCreate_fn)(cudnnHandle_t *handle);
typedef cudnnStatus_t (*cudnnSetStream_fn)(cudnnHandle_t handle, cudaStream_t streamId);
typedef cudnnStatus_t (*cudnnBackendCreateDescriptor_fn)(cudnnBackendDescriptorType_t descriptorType,
                                                         cudnnBackendDescriptor_t *descriptor);
typedef cudnnStatus_t (*cudnnBackendDestroyDescriptor_fn)(cudnnBackendDescriptor_t descriptor);
typedef cudnnStatus_t (*cudnnBackendFinalize_fn)(cudnnBackendDescriptor_t descriptor);
typedef cudnnStatus_t (*cudnnBackendSetAttribute_fn)(cudnnBackendDescriptor_t descriptor,
                                                     cudnnBackendAttributeName_t attributeName,
                                                     cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                                     const void *arrayOfElements);
typedef cudnnStatus_t (*cudnnBackendGetAttribute_fn)(cudnnBackendDescriptor_t const descriptor,
                                                     cudnnBackendAttributeName_t attributeName,
                                                     cudnnBackendAttributeType_t attributeType,
                                                     int64_t requestedElementCount, int64_t *elementCount,
                                                     void *arrayOfElements);
typedef cudnnStatus_t (*cudnnBackendExecute_fn)(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                                cudnnBackendDescriptor_t variantPack);

#ifdef __cplusplus
}
#endif
#endif /* H3_CUDNN_API_H */
