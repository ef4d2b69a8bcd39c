/* `h3ctl quantize`: pre-quantised fp8 transformer weights written once, without a GPU
   (models/dit_fp8file.h has the file), and the e4m3 conversion they are made with. */
#include "api/api.h"
#include "core/fp8.h"
#include "models/dit_fp8file.h"

#include <stdlib.h>

H3_API int h3_quantize(const char *model_dir, uint32_t flags, int precision, int threads, const char *out_path,
                       int overwrite, h3_progress_fn progress, void *user)
{
    if (!model_dir || !out_path || !*out_path) return h3_err(H3_E_INVALID, "quantize: no model directory or output");
    if (precision != H3_PRECISION_FP8)
        return h3_err(H3_E_UNSUPPORTED, "quantize: only fp8 weights are written to a file (precision %d given; "
                      "int8 is quantised as it loads on the CPU)", precision);
    if (threads < 0 || threads > 1024)
        return h3_err(H3_E_INVALID, "threads must be between 0 (all cores) and 1024, got %d", threads);
    if (!threads) threads = h3_online_cpus();
    h3_model m;
    int rc = h3_model_open(&m, model_dir, flags);
    if (rc) return rc;
    h3_pool *pool = h3_pool_create(threads);
    rc = pool ? h3_fp8file_write(&m, pool, out_path, overwrite != 0, progress, user)
              : h3_err(H3_E_NOMEM, "quantize: cannot start %d worker threads", threads);
    h3_pool_destroy(pool);
    h3_model_close(&m);
    if (!rc) h3_err_clear();
    return rc;
}

H3_API int h3_fp8_e4m3_from_f32(const float *x, int64_t n, uint8_t *out)
{
    if (n < 0 || (n > 0 && (!x || !out))) return h3_err(H3_E_INVALID, "fp8 conversion: %lld values", (long long)n);
    for (int64_t i = 0; i < n; i++) out[i] = h3_e4m3_from_f32(x[i]);
    return 0;
}
