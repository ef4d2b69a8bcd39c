/* Kernels vs straightforward double-precision references; thread-count and variant checks. */
#include "ctest.h"
#include "backend/cpu/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_linear(h3_pool *p1, h3_pool *p3, int64_t M, int64_t N, int64_t Kd, h3_dtype dt)
{
    float *X = malloc(sizeof(float) * M * Kd), *Wf = malloc(sizeof(float) * N * Kd);
    float *b = malloc(sizeof(float) * N), *Y1 = malloc(sizeof(float) * M * N), *Y3 = malloc(sizeof(float) * M * N);
    uint16_t *Wh = malloc(2 * N * Kd);
    double *ref = malloc(sizeof(double) * M * N);
    for (int64_t i = 0; i < M * Kd; i++) X[i] = frand();
    for (int64_t i = 0; i < N * Kd; i++) {
        Wf[i] = frand();
        if (dt == H3_DT_BF16) {
            Wh[i] = h3_f32_to_bf16(Wf[i]);
            Wf[i] = h3_bf16_to_f32(Wh[i]);
        }
    }
    for (int64_t i = 0; i < N; i++) b[i] = frand();
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = b[n];
            for (int64_t k = 0; k < Kd; k++) s += (double)X[m * Kd + k] * Wf[n * Kd + k];
            ref[m * N + n] = s;
        }
    h3_mat W = {dt == H3_DT_BF16 ? (void *)Wh : (void *)Wf, dt, N, Kd};
    CHECK(h3_linear(p1, X, M, Kd, &W, b, Y1, N) == 0);
    CHECK(h3_linear(p3, X, M, Kd, &W, b, Y3, N) == 0);
    double e = rel_l2(Y1, ref, M * N);
    CHECK_MSG(e < 1e-6, "linear %lldx%lldx%lld %s rel-L2 %g", (long long)M, (long long)N, (long long)Kd,
              h3_dtype_name(dt), e);
    CHECK_MSG(memcmp(Y1, Y3, sizeof(float) * M * N) == 0, "linear not identical across thread counts");
    free(X), free(Wf), free(b), free(Y1), free(Y3), free(Wh), free(ref);
}

static void test_attention(h3_pool *p1, h3_pool *p3, int64_t Lq, int64_t Lk, int H, int KVH, int D, bool causal)
{
    int64_t ldq = (int64_t)H * D, ldk = (int64_t)KVH * D;
    float *Q = malloc(sizeof(float) * Lq * ldq), *Kx = malloc(sizeof(float) * Lk * ldk), *V = malloc(sizeof(float) * Lk * ldk);
    float *O1 = malloc(sizeof(float) * Lq * ldq), *O3 = malloc(sizeof(float) * Lq * ldq);
    double *ref = malloc(sizeof(double) * Lq * ldq), *s = malloc(sizeof(double) * Lk);
    for (int64_t i = 0; i < Lq * ldq; i++) Q[i] = frand() * 2;
    for (int64_t i = 0; i < Lk * ldk; i++) Kx[i] = frand() * 2, V[i] = frand();
    float scale = 1.0f / sqrtf((float)D);
    for (int h = 0; h < H; h++) {
        int kvh = h / (H / KVH);
        for (int64_t i = 0; i < Lq; i++) {
            double mx = -1e300, sum = 0;
            int64_t lim = causal ? i + (Lk - Lq) + 1 : Lk;
            for (int64_t j = 0; j < lim; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)Q[i * ldq + h * D + c] * Kx[j * ldk + kvh * D + c];
                s[j] = d * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = 0; j < lim; j++) sum += (s[j] = exp(s[j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int64_t j = 0; j < lim; j++) o += s[j] * V[j * ldk + kvh * D + c];
                ref[i * ldq + h * D + c] = o / sum;
            }
        }
    }
    CHECK(h3_attention(p1, Q, ldq, Kx, ldk, V, ldk, Lq, Lk, H, KVH, D, scale, causal, O1, ldq) == 0);
    CHECK(h3_attention(p3, Q, ldq, Kx, ldk, V, ldk, Lq, Lk, H, KVH, D, scale, causal, O3, ldq) == 0);
    double e = rel_l2(O1, ref, Lq * ldq);
    CHECK_MSG(e < 2e-6, "attention Lq=%lld Lk=%lld H=%d KV=%d D=%d causal=%d rel-L2 %g", (long long)Lq,
              (long long)Lk, H, KVH, D, causal, e);
    CHECK_MSG(memcmp(O1, O3, sizeof(float) * Lq * ldq) == 0, "attention not identical across thread counts");
    free(Q), free(Kx), free(V), free(O1), free(O3), free(ref), free(s);
}

/* h3_to_f32 (core/host.c: F16C where h3_host_simd, else the baseline loop; test_c.py runs this file
   both ways) against values computed from the definitions: every f16 and bf16 bit pattern, from an
   odd start so the 8-wide loops and their tails both run. */
static void test_to_f32(void)
{
    const int64_t n = 65536 + 5;
    uint16_t *h = malloc(2 * (size_t)(n + 1));
    float *f = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) h[i + 1] = (uint16_t)i;
    for (int dt = 0; dt < 2; dt++) {
        h3_to_f32(h + 1, dt ? H3_DT_BF16 : H3_DT_F16, f, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t v = (uint16_t)i;
            const int sign = v >> 15;
            float want;
            if (dt) { /* bf16: the upper half of an f32 */
                uint32_t u = (uint32_t)v << 16;
                memcpy(&want, &u, 4);
            } else {
                const int e = (v >> 10) & 31, m = v & 1023;
                want = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(1024 + m), e - 25);
                if (sign) want = -want;
            }
            const bool ok = isnan(want) ? isnan(f[i]) && (signbit(f[i]) != 0) == sign
                                        : memcmp(&want, &f[i], 4) == 0;
            bad += !ok;
        }
        CHECK_MSG(bad == 0, "h3_to_f32 %s: %d of %lld values differ", dt ? "bf16" : "f16", bad, (long long)n);
    }
    float x[9] = {1, -2, 3.5f, NAN, INFINITY, -0.0f, 1e-40f, 7, 8}, y[9];
    h3_to_f32(x, H3_DT_F32, y, 9);
    CHECK(memcmp(x, y, sizeof x) == 0);
    free(h);
    free(f);
}

int main(void)
{
    ctest_rng = 88172645463325252ull;
    printf("kernels: %s\n", h3_kernels_variant());
    h3_pool *p1 = h3_pool_create(1), *p3 = h3_pool_create(3);
    int64_t shapes[][3] = {{1, 7, 5}, {3, 33, 17}, {7, 100, 300}, {37, 61, 29}, {130, 300, 520}, {6, 16, 256}, {97, 257, 257}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        test_linear(p1, p3, shapes[i][0], shapes[i][1], shapes[i][2], H3_DT_F32);
        test_linear(p1, p3, shapes[i][0], shapes[i][1], shapes[i][2], H3_DT_BF16);
    }
    test_attention(p1, p3, 1, 1, 1, 1, 8, false);
    test_attention(p1, p3, 50, 50, 2, 2, 32, false);
    test_attention(p1, p3, 131, 131, 3, 3, 64, false);
    test_attention(p1, p3, 70, 200, 4, 2, 24, false);
    test_attention(p1, p3, 100, 100, 4, 1, 16, true);
    test_attention(p1, p3, 7, 7, 2, 2, 128, true);
    test_to_f32();
    /* bf16 round trip and rounding */
    CHECK(h3_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(h3_bf16_to_f32(h3_f32_to_bf16(3.140625f)) == 3.140625f);
    h3_pool_destroy(p1);
    h3_pool_destroy(p3);
    CTEST_END();
}
