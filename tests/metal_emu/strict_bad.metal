/* Kernels the strict check must refuse, one per H3_BAD_* case (the MSL compiler refuses them too):
   an address space handed where another is expected. Without a case defined it compiles. */
#include "msl_emu.h"
using namespace metal;

inline float h3_bad_sum(device const float *p, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}

kernel void h3_bad(device float *out [[buffer(0)]], constant int &n [[buffer(1)]],
                   threadgroup float *tg [[threadgroup(0)]], uint tid [[thread_index_in_threadgroup]])
{
    tg[tid] = (float)tid;
    threadgroup_barrier(mem_flags::mem_threadgroup);
#if defined(H3_BAD_TG_AS_DEVICE)
    out[tid] = h3_bad_sum(tg, n); /* threadgroup memory passed as device memory */
#elif defined(H3_BAD_DEVICE_AS_THREAD)
    float *p = out; /* a device pointer kept as a thread pointer */
    p[tid] = 1.0f;
#elif defined(H3_BAD_DEVICE_AS_TG)
    threadgroup float *q = out; /* device memory taken for threadgroup memory */
    q[0] = 1.0f;
#else
    out[tid] = h3_bad_sum(out, n) + tg[0];
#endif
}
