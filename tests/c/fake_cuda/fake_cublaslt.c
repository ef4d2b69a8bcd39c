/*
 * A stand-in for libcublasLt.so.13 (tests/test_cuda_faults.py, through H3_CUBLASLT_LIB): the entry
 * points cuda_driver.h's H3_LT_FUNCS lists, with cuBLASLt's signatures. Handles, descriptors and
 * layouts are small heap objects, a matmul does nothing, and the heuristic always offers one
 * algorithm, so the backend's create and its GEMM plans go through as on a GPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int cublasStatus_t;
enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7 };

typedef struct {
    uint64_t data[8];
} Algo;
typedef struct {
    Algo algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} Heuristic;

static cublasStatus_t make(void **out)
{
    if (!out) return INVALID_VALUE;
    *out = malloc(16);
    return *out ? OK : 3;
}
static cublasStatus_t drop(void *p)
{
    free(p);
    return OK;
}

API size_t cublasLtGetVersion(void) { return 130100; }
API cublasStatus_t cublasLtCreate(void **h) { return make(h); }
API cublasStatus_t cublasLtDestroy(void *h) { return drop(h); }
API const char *cublasLtGetStatusName(cublasStatus_t s) { return s ? "CUBLAS_STATUS_INVALID_VALUE" : "CUBLAS_STATUS_SUCCESS"; }
API const char *cublasLtGetStatusString(cublasStatus_t s) { return s ? "an invalid value was used as an argument" : "success"; }

API cublasStatus_t cublasLtMatmul(void *h, void *desc, const void *alpha, const void *A, void *Ad, const void *B,
                                  void *Bd, const void *beta, const void *C, void *Cd, void *D, void *Dd,
                                  const Algo *algo, void *ws, size_t wsb, void *stream)
{
    (void)desc, (void)alpha, (void)A, (void)Ad, (void)B, (void)Bd, (void)beta, (void)C, (void)Cd, (void)D, (void)Dd;
    (void)algo, (void)ws, (void)wsb, (void)stream;
    return h ? OK : NOT_INITIALIZED;
}

API cublasStatus_t cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld)
{
    (void)type, (void)rows, (void)cols, (void)ld;
    return make(l);
}
API cublasStatus_t cublasLtMatrixLayoutDestroy(void *l) { return drop(l); }
API cublasStatus_t cublasLtMatmulDescCreate(void **d, int compute, int scale)
{
    (void)compute, (void)scale;
    return make(d);
}
API cublasStatus_t cublasLtMatmulDescDestroy(void *d) { return drop(d); }
API cublasStatus_t cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t n)
{
    (void)attr;
    return d && buf && n ? OK : INVALID_VALUE;
}
API cublasStatus_t cublasLtMatmulPreferenceCreate(void **p) { return make(p); }
API cublasStatus_t cublasLtMatmulPreferenceDestroy(void *p) { return drop(p); }
API cublasStatus_t cublasLtMatmulPreferenceSetAttribute(void *p, int attr, const void *buf, size_t n)
{
    (void)attr;
    return p && buf && n ? OK : INVALID_VALUE;
}
API cublasStatus_t cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *a, void *b, void *c, void *d, void *pref,
                                                  int requested, Heuristic *out, int *returned)
{
    (void)op, (void)a, (void)b, (void)c, (void)d, (void)pref;
    if (!h || requested < 1 || !out || !returned) return INVALID_VALUE;
    memset(out, 0, sizeof *out);
    *returned = 1;
    return OK;
}
