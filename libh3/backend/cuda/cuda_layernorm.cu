/*
 * The text encoder's and the decoders' element-wise ops of backend.h on the GPU: layernorm, copy,
 * add_div. The decoders' layout and convolution ops (channels_last, unpatchify, vae_stitch,
 * snake_aa, conv_gemm, conv1_clamp) are in cuda_decoders.cu. not_on_gpu is the one-line answer for
 * an op this backend does not implement.
 *
 * Rounding as on the CPU (backend/cpu/ops.c h3_layernorm): mean and variance summed in double,
 * inv = (float)(1 / sqrt(var + eps)), then (x - mean) * inv [* w] [+ b], one rounding per operation.
 */
#include "backend/cuda/cuda_common.cuh"

namespace h3cuda {

int not_on_gpu(Backend *b, const char *op)
{
    return fail(b, H3_E_UNSUPPORTED, "cuda: %s is not implemented by the CUDA backend yet (run the decoders on the CPU)",
                op);
}

/* ---- layernorm ----------------------------------------------------------------------------- */

struct LnArgs {
    const void *x;
    int64_t ldx;
    const float *w, *b;
    void *y;
    int64_t ldy, n;
    float eps;
    int x_bf16, y_bf16;
};

static __device__ __forceinline__ float ln_out(float xv, float mu, float inv, const float *w, const float *b, int64_t i)
{
    float v = __fmul_rn(__fsub_rn(xv, mu), inv);
    if (w) v = __fmul_rn(v, w[i]);
    if (b) v = __fadd_rn(v, b[i]);
    return v;
}

/* One block per row, two-pass statistics in double with fixed-order block sums; up to VPT values
   per thread stay in registers (each value is read and written by the same thread, so y may
   alias x). */
template <int NT, int VPT>
__global__ void __launch_bounds__(NT) layernorm_kernel(LnArgs a)
{
    __shared__ double sh[NT / 32];
    const int64_t r = blockIdx.x, xo = r * a.ldx, yo = r * a.ldy, n = a.n;
    float v[VPT];
    double s = 0.0;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        v[j] = 0.0f;
        if (i < n) {
            v[j] = ld_elem(a.x, a.x_bf16, xo + i);
            s += v[j];
        }
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT) s += ld_elem(a.x, a.x_bf16, xo + i);
    const double mean = block_sum<NT>(s, sh) / (double)n;
    double q = 0.0;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        if (i < n) q += ((double)v[j] - mean) * ((double)v[j] - mean);
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT) {
        const double d = (double)ld_elem(a.x, a.x_bf16, xo + i) - mean;
        q += d * d;
    }
    __syncthreads(); /* sh is reused */
    const double var = block_sum<NT>(q, sh) / (double)n;
    const float inv = (float)(1.0 / sqrt(var + (double)a.eps)), mu = (float)mean;
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int64_t i = threadIdx.x + (int64_t)j * NT;
        if (i < n) st_elem(a.y, a.y_bf16, yo + i, ln_out(v[j], mu, inv, a.w, a.b, i));
    }
    for (int64_t i = threadIdx.x + (int64_t)VPT * NT; i < n; i += NT)
        st_elem(a.y, a.y_bf16, yo + i, ln_out(ld_elem(a.x, a.x_bf16, xo + i), mu, inv, a.w, a.b, i));
}

int layernorm(Backend *b, const h3_bt *x, const float *w, const float *bb, float eps, const h3_bt *y)
{
    int rc;
    if ((rc = check_view(b, "layernorm", "x", x)) || (rc = check_view(b, "layernorm", "y", y))) return rc;
    if (y->cols != x->cols || y->rows > x->rows)
        return fail(b, H3_E_INVALID, "cuda: layernorm: x %lld x %lld, y %lld x %lld", (long long)x->rows,
                    (long long)x->cols, (long long)y->rows, (long long)y->cols);
    if (y->rows == 0 || x->cols == 0) return 0;
    if (y->rows > 0x7fffffffLL) return fail(b, H3_E_UNSUPPORTED, "cuda: layernorm: too many rows");
    LnArgs a = {x->data, x->ld, w, bb, y->data, y->ld, x->cols, eps, x->dtype == H3_DT_BF16, y->dtype == H3_DT_BF16};
    if (a.n <= 1024)
        layernorm_kernel<128, 8><<<(unsigned)y->rows, 128, 0, b->stream>>>(a);
    else
        layernorm_kernel<256, 24><<<(unsigned)y->rows, 256, 0, b->stream>>>(a);
    return check_launch(b, "layernorm_kernel");
}

/* ---- copy, add_div ------------------------------------------------------------------------- */

int copy_view(Backend *b, const h3_bt *src, const h3_bt *dst)
{
    int rc;
    if ((rc = check_view(b, "copy", "src", src)) || (rc = check_view(b, "copy", "dst", dst))) return rc;
    if (src->dtype != dst->dtype || src->rows != dst->rows || src->cols != dst->cols)
        return fail(b, H3_E_INVALID, "cuda: copy of %lld x %lld %s into %lld x %lld %s", (long long)src->rows,
                    (long long)src->cols, dtname(src->dtype), (long long)dst->rows, (long long)dst->cols,
                    dtname(dst->dtype));
    if (src->rows == 0 || src->cols == 0) return 0;
    const size_t es = src->dtype == H3_DT_F32 ? 4 : 2;
    const size_t spitch = (size_t)(src->rows > 1 ? src->ld : src->cols) * es;
    const size_t dpitch = (size_t)(dst->rows > 1 ? dst->ld : dst->cols) * es;
    cudaError_t e = cudaMemcpy2DAsync(dst->data, dpitch, src->data, spitch, (size_t)src->cols * es, (size_t)src->rows,
                                      cudaMemcpyDeviceToDevice, b->stream);
    return e == cudaSuccess ? 0 : fail_cuda(b, e, "copy");
}

/* y = (y + x) / div: the sum rounded, then a true division. */
__global__ void add_div_kernel(float *y, int64_t ldy, const float *x, int64_t ldx, float div, int64_t rows, int64_t n)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
            y[r * ldy + i] = __fdiv_rn(__fadd_rn(y[r * ldy + i], x[r * ldx + i]), div);
}

int add_div(Backend *b, const h3_bt *y, const h3_bt *x, float div)
{
    int rc;
    if ((rc = check_view(b, "add_div", "y", y)) || (rc = check_view(b, "add_div", "x", x))) return rc;
    if (y->dtype != H3_DT_F32 || x->dtype != H3_DT_F32)
        return fail(b, H3_E_UNSUPPORTED, "cuda: add_div takes f32 views");
    if (x->rows < y->rows || x->cols < y->cols)
        return fail(b, H3_E_INVALID, "cuda: add_div: x %lld x %lld is smaller than y %lld x %lld", (long long)x->rows,
                    (long long)x->cols, (long long)y->rows, (long long)y->cols);
    if (y->rows == 0 || y->cols == 0) return 0;
    dim3 grid(blocks_for(y->cols, 256, 64), (unsigned)(y->rows < 65535 ? y->rows : 65535));
    add_div_kernel<<<grid, 256, 0, b->stream>>>((float *)y->data, y->ld, (const float *)x->data, x->ld, div, y->rows,
                                                y->cols);
    return check_launch(b, "add_div_kernel");
}

} /* namespace h3cuda */
