/*
 * Stand-in for cuDNN's attention (cuda_sdpa_cudnn.cpp) while that file is not in the tree: every
 * call answers that cuDNN attention is not in this build, and the backend runs its own kernel
 * (fp8 attention is then unavailable, with this reason). Compiled only without cuda_sdpa_cudnn.cpp.
 */
#include "backend/cuda/cuda_cudnn_host.h"
#include "h3.h"

#include <stdio.h>

static const char NOT_HERE[] = "cuDNN attention is not in this build of libh3_cuda (cuda_sdpa_cudnn.cpp is missing)";

extern "C" int h3_cudnn_sdpa_available(const struct h3_cudnn_host *, char *why, size_t cap)
{
    if (why && cap) snprintf(why, cap, "%s", NOT_HERE);
    return 0;
}

extern "C" void h3_cudnn_set_lib(const char *) {}

extern "C" int h3_cudnn_sdpa(const struct h3_cudnn_host *, void *, const void *, const void *, const void *, void *,
                             int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t, int64_t, float, int, char *err,
                             size_t cap)
{
    if (err && cap) snprintf(err, cap, "%s", NOT_HERE);
    return -H3_E_UNSUPPORTED;
}

extern "C" int h3_cudnn_sdpa_fp8(const struct h3_cudnn_host *, void *, const void *, const void *, const void *,
                                 void *, const float *, float *, int64_t, int64_t, int, int, int, int64_t, int64_t,
                                 int64_t, int64_t, float, char *err, size_t cap)
{
    if (err && cap) snprintf(err, cap, "%s", NOT_HERE);
    return -H3_E_UNSUPPORTED;
}
