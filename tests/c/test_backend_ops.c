/*
 * Conformance of every built backend to backend.h: each op of the table against a double-precision
 * reference computed here, on random inputs (never zeros) of odd sizes, with outputs poisoned (NaN
 * bytes) before each run and strided views where the op takes them. The CPU backend always runs;
 * the CUDA backend runs when h3_backend_cuda_open succeeds (python/h3ctl/libh3_cuda.so is used
 * when H3_CUDA_LIB is not set), otherwise the test says why it was skipped; so does the Metal
 * backend (python/h3ctl/libh3_metal.*, or H3_METAL_LIB; on Linux the build against the Metal test
 * double), held to the CPU's f32 tolerances.
 *
 * Tolerances are relative L2 errors: 1e-5 for f32 paths (the CPU backend everywhere; CUDA ops whose
 * operands and outputs are all f32), 4e-3 for CUDA's bf16 paths (the rounding of bf16 outputs alone
 * is about 1.1e-3). Euler, noise and the element-wise speed-knob ops must give the CPU's bits. On
 * CUDA, linear and attention must also give the same bits twice.
 *
 * One line per op, case and backend with the measured rel-L2; the exit status is non-zero on any
 * failure. H3_BENCH=1 adds, on a GPU backend, timings of attention and of a transformer block's
 * GEMMs at the released model's shapes (with the attention checked on sampled rows).
 */
#include "ctest.h"
#include "backend/backend.h"
#include "core/fp8.h"
#include "backend/cpu/ops.h"
#include "core/schedule.h"

#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#define TOL_F32 1e-5
#define TOL_BF16 4e-3
/* fp8 attention: e4m3 Q, K, V, probabilities and output (3-bit mantissas), per-tensor scales. */
#define TOL_FP8_ATTN 8e-2

typedef struct {
    const char *name;
    h3_backend *be;
    bool gpu; /* activations in bf16, weights held in bf16 */
} bk;

/* ---- host-side rounding --------------------------------------------------------------------- */

static float bf16r(float v) { return h3_bf16_to_f32(h3_f32_to_bf16(v)); }

/* f32 -> f16, round to nearest even (subnormals included; the test values never overflow). */
static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, man = u & 0x7FFFFFu;
    const int32_t e = (int32_t)((u >> 23) & 0xFF) - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        const uint32_t m = man | 0x800000u, shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    const uint32_t rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

/* A random value of magnitude at least 1/64 of `scale`: inputs are never zero. */
static float rnd(float scale)
{
    float v = frand();
    if (v > -1.0f / 64 && v < 1.0f / 64) v = v < 0 ? v - 1.0f / 64 : v + 1.0f / 64;
    return v * scale;
}

/* ---- backend memory ------------------------------------------------------------------------- */

static size_t esz(h3_dtype dt) { return dt == H3_DT_F32 ? 4 : 2; }

static void *dnew(bk *b, size_t bytes)
{
    void *p = b->be->mem->alloc(b->be, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "%s: alloc of %zu bytes failed: %s\n", b->name, bytes, h3_last_error());
        exit(2);
    }
    return p;
}

static void dput(bk *b, void *dst, const void *src, size_t bytes)
{
    int rc = b->be->mem->upload(b->be, dst, src, bytes);
    CHECK_MSG(rc == 0, "%s: upload: %s", b->name, h3_last_error());
}

static void dget(bk *b, void *dst, const void *src, size_t bytes)
{
    int rc = b->be->mem->download(b->be, dst, src, bytes);
    CHECK_MSG(rc == 0, "%s: download: %s", b->name, h3_last_error());
}

/* Fill with 0xFF bytes: NaN as f32 and as bf16, so an output the op does not write shows up. */
static void dpoison(bk *b, void *dst, size_t bytes)
{
    void *tmp = malloc(bytes ? bytes : 1);
    memset(tmp, 0xFF, bytes);
    dput(b, dst, tmp, bytes);
    free(tmp);
}

static void *dup_host(bk *b, const void *src, size_t bytes)
{
    void *p = dnew(b, bytes);
    dput(b, p, src, bytes);
    return p;
}

/* A matrix in backend memory plus the f32 values it holds (after rounding to its dtype). */
typedef struct {
    h3_bt t;
    float *v; /* [rows][ld] host copy of the values as stored */
} mat;

static mat mk(bk *b, h3_dtype dt, int64_t rows, int64_t cols, int64_t ld, float scale, bool fill)
{
    mat m;
    const size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)ld;
    m.v = malloc(sizeof(float) * n);
    void *dev = dnew(b, n * esz(dt));
    if (fill) {
        void *raw = malloc(n * esz(dt));
        for (size_t i = 0; i < n; i++) {
            float x = rnd(scale);
            if (dt == H3_DT_BF16) {
                ((uint16_t *)raw)[i] = h3_f32_to_bf16(x);
                x = bf16r(x);
            } else {
                ((float *)raw)[i] = x;
            }
            m.v[i] = x;
        }
        dput(b, dev, raw, n * esz(dt));
        free(raw);
    } else {
        dpoison(b, dev, n * esz(dt));
        for (size_t i = 0; i < n; i++) m.v[i] = NAN;
    }
    m.t = h3_bt_make(dev, dt, rows, cols, ld);
    return m;
}

/* The logical [rows, cols] of a matrix as f32 (compacted), and whether the padding between rows
   still holds the poison (an op must not write past cols). */
static float *mread(bk *b, const mat *m, bool *pad_ok)
{
    const size_t n = (size_t)m->t.rows * (size_t)m->t.ld, es = esz(m->t.dtype);
    unsigned char *raw = malloc(n * es + 1);
    dget(b, raw, m->t.data, n * es);
    float *out = malloc(sizeof(float) * (size_t)(m->t.rows * m->t.cols + 1));
    bool ok = true;
    for (int64_t r = 0; r < m->t.rows; r++)
        for (int64_t c = 0; c < m->t.ld; c++) {
            const size_t i = (size_t)(r * m->t.ld + c);
            float v;
            if (m->t.dtype == H3_DT_BF16) {
                uint16_t h;
                memcpy(&h, raw + i * 2, 2);
                v = h3_bf16_to_f32(h);
                if (c >= m->t.cols && h != 0xFFFF) ok = false;
            } else {
                uint32_t u;
                memcpy(&u, raw + i * 4, 4);
                memcpy(&v, &u, 4);
                if (c >= m->t.cols && u != 0xFFFFFFFFu) ok = false;
            }
            if (c < m->t.cols) out[r * m->t.cols + c] = v;
        }
    free(raw);
    if (pad_ok) *pad_ok = ok;
    return out;
}

static void mfree(bk *b, mat *m)
{
    b->be->mem->release(b->be, m->t.data);
    free(m->v);
}

static const char *dn(h3_dtype dt) { return dt == H3_DT_BF16 ? "bf16" : dt == H3_DT_F16 ? "f16" : "f32"; }

/* Report one comparison: a line, and a failure when err > tol (NaN fails too). */
static void report(bk *b, const char *op, const char *what, double err, double tol)
{
    const bool ok = err <= tol;
    printf("%-5s %-13s %-52s rel-L2 %.3g (tol %.0e)%s\n", b->name, op, what, err, tol, ok ? "" : "  FAIL");
    CHECK_MSG(ok, "%s %s %s: rel-L2 %g > %g", b->name, op, what, err, tol);
}

static void report_bits(bk *b, const char *op, const char *what, bool same, double err)
{
    printf("%-5s %-13s %-52s rel-L2 %.3g, %s\n", b->name, op, what, err, same ? "bit-identical" : "BITS DIFFER  FAIL");
    CHECK_MSG(same, "%s %s %s: not bit-identical", b->name, op, what);
}

/* ---- linear --------------------------------------------------------------------------------- */

static void t_linear(bk *b, int64_t M, int64_t N, int64_t K, h3_dtype wdt, h3_dtype xdt, h3_dtype ydt, bool bias,
                     int64_t xpad, int64_t ypad)
{
    const size_t nw = (size_t)(N * K);
    float *wv = malloc(sizeof(float) * (nw + 1));
    void *wraw = malloc(nw * 4 + 4);
    for (size_t i = 0; i < nw; i++) {
        const float x = rnd(1.0f);
        float stored = x;
        if (wdt == H3_DT_F32) {
            ((float *)wraw)[i] = x;
        } else if (wdt == H3_DT_BF16) {
            ((uint16_t *)wraw)[i] = h3_f32_to_bf16(x);
            stored = bf16r(x);
        } else {
            ((uint16_t *)wraw)[i] = f32_to_f16(x);
            h3_to_f32((uint16_t *)wraw + i, H3_DT_F16, &stored, 1);
        }
        wv[i] = b->gpu ? bf16r(stored) : stored; /* a GPU rounds every weight to bf16 once */
    }
    h3_bw W;
    int rc = b->be->weights->weight_load(b->be, wraw, wdt, N, K, &W);
    CHECK_MSG(rc == 0, "%s: weight_load: %s", b->name, h3_last_error());
    float *bh = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < N; i++) bh[i] = rnd(1.0f);
    float *bd = bias ? dup_host(b, bh, sizeof(float) * (size_t)N) : NULL;
    mat X = mk(b, xdt, M, K, K + xpad, 1.0f, true);
    mat Y = mk(b, ydt, M, N, N + ypad, 1.0f, false);
    double *ref = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bh[n] : 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)X.v[m * X.t.ld + k] * wv[n * K + k];
            ref[m * N + n] = s;
        }
    rc = b->be->ops->linear(b->be, &X.t, &W, bd, &Y.t);
    CHECK_MSG(rc == 0, "%s: linear: %s", b->name, h3_last_error());
    bool pad_ok;
    float *y = mread(b, &Y, &pad_ok);
    char what[192];
    snprintf(what, sizeof what, "%lldx%lldx%lld W %s X %s Y %s%s%s", (long long)M, (long long)N, (long long)K, dn(wdt),
             dn(xdt), dn(ydt), bias ? " +bias" : "", xpad || ypad ? " strided" : "");
    const bool rounded = b->gpu && (ydt == H3_DT_BF16 || xdt == H3_DT_F32);
    report(b, "linear", what, rel_l2(y, ref, M * N), rounded ? TOL_BF16 : TOL_F32);
    CHECK_MSG(pad_ok, "%s linear %s: wrote past the row", b->name, what);
    if (b->gpu) {
        /* Same inputs, same bits (fixed algorithm, no split-K). */
        dpoison(b, Y.t.data, (size_t)(M * Y.t.ld) * esz(ydt));
        rc = b->be->ops->linear(b->be, &X.t, &W, bd, &Y.t);
        float *y2 = mread(b, &Y, NULL);
        CHECK_MSG(rc == 0 && memcmp(y, y2, sizeof(float) * (size_t)(M * N)) == 0, "%s linear %s: not deterministic",
                  b->name, what);
        free(y2);
    }
    free(y);
    free(ref);
    mfree(b, &X);
    mfree(b, &Y);
    if (bd) b->be->mem->release(b->be, bd);
    b->be->weights->weight_free(b->be, &W);
    free(bh);
    free(wv);
    free(wraw);
}

/* ---- attention ------------------------------------------------------------------------------ */

/* fp8: the backend's fp8 attention (attn_precision = H3_PRECISION_FP8, cuDNN's fp8 SDPA on a GPU
   that has it), checked against the same double reference at TOL_FP8_ATTN. */
static void t_attention(bk *b, int64_t Lq, int64_t Lk, int H, int KVH, int D, bool causal, int64_t pad, h3_dtype odt,
                        bool fp8)
{
    const h3_dtype adt = b->gpu ? H3_DT_BF16 : H3_DT_F32;
    const int64_t A = (int64_t)H * D, AK = (int64_t)KVH * D;
    mat Q = mk(b, adt, Lq, A, A + pad, 2.0f, true);
    mat K = mk(b, adt, Lk, AK, AK + pad, 2.0f, true);
    mat V = mk(b, adt, Lk, AK, AK + pad, 1.0f, true);
    mat O = mk(b, odt, Lq, A, A + pad, 1.0f, false);
    const float scale = 1.0f / sqrtf((float)D);
    double *ref = malloc(sizeof(double) * (size_t)(Lq * A)), *s = malloc(sizeof(double) * (size_t)(Lk + 1));
    for (int h = 0; h < H; h++) {
        const int kvh = h / (H / KVH);
        for (int64_t i = 0; i < Lq; i++) {
            int64_t lim = causal ? i + (Lk - Lq) + 1 : Lk;
            if (lim > Lk) lim = Lk;
            if (lim < 0) lim = 0;
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < lim; j++) {
                double d = 0;
                for (int c = 0; c < D; c++) d += (double)Q.v[i * Q.t.ld + h * D + c] * K.v[j * K.t.ld + kvh * D + c];
                s[j] = d * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (int64_t j = 0; j < lim; j++) sum += (s[j] = exp(s[j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int64_t j = 0; j < lim; j++) o += s[j] * V.v[j * V.t.ld + kvh * D + c];
                ref[i * A + h * D + c] = lim > 0 ? o / sum : 0.0; /* no visible key: zeros */
            }
        }
    }
    b->be->attn_precision = fp8 ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
    int rc = b->be->ops->attention(b->be, &Q.t, &K.t, &V.t, H, KVH, D, scale, causal, &O.t);
    CHECK_MSG(rc == 0, "%s: attention: %s", b->name, h3_last_error());
    bool pad_ok;
    float *o = mread(b, &O, &pad_ok);
    char what[192];
    snprintf(what, sizeof what, "Lq %lld Lk %lld heads %d/%d D %d%s%s O %s%s", (long long)Lq, (long long)Lk, H, KVH, D,
             causal ? " causal" : "", pad ? " strided" : "", dn(odt), fp8 ? " fp8" : "");
    report(b, "attention", what, rel_l2(o, ref, Lq * A), fp8 ? TOL_FP8_ATTN : b->gpu ? TOL_BF16 : TOL_F32);
    CHECK_MSG(pad_ok, "%s attention %s: wrote past the row", b->name, what);
    if (b->gpu) {
        dpoison(b, O.t.data, (size_t)(Lq * O.t.ld) * esz(odt));
        rc = b->be->ops->attention(b->be, &Q.t, &K.t, &V.t, H, KVH, D, scale, causal, &O.t);
        float *o2 = mread(b, &O, NULL);
        CHECK_MSG(rc == 0 && memcmp(o, o2, sizeof(float) * (size_t)(Lq * A)) == 0, "%s attention %s: not deterministic",
                  b->name, what);
        free(o2);
    }
    b->be->attn_precision = H3_PRECISION_DEFAULT;
    free(o);
    free(ref);
    free(s);
    mfree(b, &Q);
    mfree(b, &K);
    mfree(b, &V);
    mfree(b, &O);
}

/* fp8 attention is refused, with a message and O untouched, where the backend lacks it and for
   what it does not take (a causal mask, f32 output); the next exact call still works. */
static void t_attention_fp8_refusals(bk *b)
{
    const h3_dtype adt = b->gpu ? H3_DT_BF16 : H3_DT_F32;
    mat Q = mk(b, adt, 32, 128, 128, 1.0f, true);
    mat O = mk(b, H3_DT_F32, 32, 128, 128, 1.0f, false);
    mat O2 = mk(b, adt, 32, 128, 128, 1.0f, false);
    float *before = mread(b, &O, NULL);
    b->be->attn_precision = H3_PRECISION_FP8;
    h3_err_clear();
    int rc;
    if (b->be->attn_fp8_why[0]) {
        rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 2, 2, 64, 0.125f, false, &O.t);
        CHECK_MSG(rc < 0 && h3_last_error()[0], "%s: fp8 attention ran where the backend says: %s", b->name,
                  b->be->attn_fp8_why);
    } else {
        rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 2, 2, 64, 0.125f, true, &O2.t);
        CHECK_MSG(rc < 0 && strstr(h3_last_error(), "causal"), "%s: causal fp8 attention: rc %d, '%s'", b->name, rc,
                  h3_last_error());
        rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 2, 2, 64, 0.125f, false, &O.t);
        CHECK_MSG(rc < 0 && strstr(h3_last_error(), "bf16"), "%s: fp8 attention into f32: rc %d, '%s'", b->name, rc,
                  h3_last_error());
    }
    float *after = mread(b, &O, NULL);
    CHECK_MSG(memcmp(before, after, sizeof(float) * 32 * 128) == 0, "%s: a refused fp8 attention wrote its output",
              b->name);
    b->be->attn_precision = H3_PRECISION_DEFAULT;
    rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 2, 2, 64, 0.125f, false, &O2.t);
    CHECK_MSG(rc == 0, "%s: exact attention after a refused fp8 one: %s", b->name, h3_last_error());
    free(before);
    free(after);
    mfree(b, &Q);
    mfree(b, &O);
    mfree(b, &O2);
}

/* ---- norm_mod ------------------------------------------------------------------------------- */

/* rows_in input rows; `gather`: y has `rows_out` rows read through a shuffled index; `mod`: AdaLN
   table with stride 6 and slot 3 (dit.c's second norm); `w`: a weight (NULL = 1). */
static void t_norm(bk *b, int64_t rows_in, int64_t rows_out, int64_t n, bool gather, bool mod, bool w, h3_dtype xdt,
                   h3_dtype ydt, int64_t xpad)
{
    mat X = mk(b, xdt, rows_in, n, n + xpad, 3.0f, true);
    mat Y = mk(b, ydt, rows_out, n, n, 1.0f, false);
    float *wh = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) wh[i] = rnd(1.0f) + 1.0f;
    const int entries = 3, stride = 6, slot = 3;
    const size_t ntab = (size_t)entries * stride * (size_t)n;
    float *tab = malloc(sizeof(float) * ntab);
    for (size_t i = 0; i < ntab; i++) tab[i] = rnd(1.0f);
    int32_t *ent = malloc(sizeof(int32_t) * (size_t)rows_in);
    for (int64_t r = 0; r < rows_in; r++) ent[r] = (int32_t)((r * 7 + 1) % entries);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)rows_out);
    for (int64_t k = 0; k < rows_out; k++) idx[k] = gather ? (k * 5 + 2) % rows_in : k;
    float *wd = w ? dup_host(b, wh, sizeof(float) * (size_t)n) : NULL;
    float *tabd = mod ? dup_host(b, tab, sizeof(float) * ntab) : NULL;
    int32_t *entd = mod ? dup_host(b, ent, sizeof(int32_t) * (size_t)rows_in) : NULL;
    int64_t *idxd = gather ? dup_host(b, idx, sizeof(int64_t) * (size_t)rows_out) : NULL;
    h3_bmod bm = {tabd, entd, stride, slot};
    const float eps = 1e-6f;
    double *ref = malloc(sizeof(double) * (size_t)(rows_out * n));
    for (int64_t k = 0; k < rows_out; k++) {
        const int64_t r = idx[k];
        const float *x = X.v + r * X.t.ld;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double inv = 1.0 / sqrt(ss / (double)n + eps);
        const float *shift = tab + ((int64_t)ent[r] * stride + slot) * n;
        for (int64_t i = 0; i < n; i++) {
            double v = x[i] * inv * (w ? wh[i] : 1.0);
            if (mod) v = v * shift[n + i] + shift[i];
            ref[k * n + i] = v;
        }
    }
    int rc = b->be->ops->norm_mod(b->be, &X.t, idxd, wd, mod ? &bm : NULL, eps, &Y.t);
    CHECK_MSG(rc == 0, "%s: norm_mod: %s", b->name, h3_last_error());
    float *y = mread(b, &Y, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld->%lld rows x %lld%s%s%s%s x %s y %s", (long long)rows_in, (long long)rows_out,
             (long long)n, gather ? " gather" : "", mod ? " mod" : "", w ? "" : " w=NULL", xpad ? "" : " aligned",
             dn(xdt), dn(ydt));
    report(b, "norm_mod", what, rel_l2(y, ref, rows_out * n), b->gpu && ydt == H3_DT_BF16 ? TOL_BF16 : TOL_F32);
    free(y);
    free(ref);
    mfree(b, &X);
    mfree(b, &Y);
    void *dev[] = {wd, tabd, entd, idxd};
    for (int i = 0; i < 4; i++) b->be->mem->release(b->be, dev[i]);
    free(wh);
    free(tab);
    free(ent);
    free(idx);
}

/* ---- qk_norm_rope --------------------------------------------------------------------------- */

/* `interleaved`: the transformer's per-head [q | k | v] rows (hs = 3D, kv heads = heads, v copied
   out); otherwise the text encoder's separate projections (hs = D, GQA, no v), normalised in
   place. `weights`: qn/kn given (NULL: no weight). */
static void t_qkv(bk *b, int64_t L, int H, int KVH, int D, int half, bool rope, bool interleaved, bool weights,
                  h3_dtype idt, h3_dtype odt, int pad)
{
    const int64_t A = (int64_t)H * D, AK = (int64_t)KVH * D;
    const int hs = interleaved ? 3 * D : D;
    const size_t ies = esz(idt);
    mat QKV = {{0}, NULL}, Qm = {{0}, NULL}, Km = {{0}, NULL}, q = {{0}, NULL}, k = {{0}, NULL}, v = {{0}, NULL};
    h3_bt qin, kin, vin;
    const float *qsrc, *ksrc, *vsrc = NULL; /* host values of the inputs, with their row strides */
    int64_t qld, kld;
    if (interleaved) {
        QKV = mk(b, idt, L, 3 * A, 3 * A + pad, 2.0f, true);
        qin = h3_bt_make(QKV.t.data, idt, L, 3 * A, QKV.t.ld);
        kin = h3_bt_make((char *)QKV.t.data + (size_t)D * ies, idt, L, 3 * A - D, QKV.t.ld);
        vin = h3_bt_make((char *)QKV.t.data + (size_t)(2 * D) * ies, idt, L, 3 * A - 2 * D, QKV.t.ld);
        q = mk(b, odt, L, A, A, 1.0f, false);
        k = mk(b, odt, L, AK, AK + 5 * pad, 1.0f, false);
        v = mk(b, odt, L, AK, AK, 1.0f, false);
        qsrc = QKV.v, ksrc = QKV.v + D, vsrc = QKV.v + 2 * D;
        qld = kld = QKV.t.ld;
    } else {
        Qm = mk(b, idt, L, A, A + 2 * pad, 2.0f, true);
        Km = mk(b, idt, L, AK, AK, 2.0f, true);
        qin = Qm.t, kin = Km.t;
        qsrc = Qm.v, ksrc = Km.v;
        qld = Qm.t.ld, kld = Km.t.ld;
    }
    float *qn = malloc(sizeof(float) * (size_t)D), *kn = malloc(sizeof(float) * (size_t)D);
    for (int i = 0; i < D; i++) qn[i] = weights ? rnd(1.0f) + 1.0f : 1.0f, kn[i] = weights ? rnd(1.0f) + 1.0f : 1.0f;
    const int hh = half > 0 ? half : 1;
    float *cs = malloc(sizeof(float) * (size_t)(L * hh)), *sn = malloc(sizeof(float) * (size_t)(L * hh));
    for (int64_t i = 0; i < L * hh; i++) {
        const float ang = rnd(3.0f);
        cs[i] = cosf(ang);
        sn[i] = sinf(ang);
    }
    float *qnd = weights ? dup_host(b, qn, sizeof(float) * (size_t)D) : NULL;
    float *knd = weights ? dup_host(b, kn, sizeof(float) * (size_t)D) : NULL;
    float *csd = rope ? dup_host(b, cs, sizeof(float) * (size_t)(L * hh)) : NULL;
    float *snd = rope ? dup_host(b, sn, sizeof(float) * (size_t)(L * hh)) : NULL;
    const float eps = 1e-6f;
    double *rq = malloc(sizeof(double) * (size_t)(L * A)), *rk = malloc(sizeof(double) * (size_t)(L * AK)),
           *rv = malloc(sizeof(double) * (size_t)(L * AK)), *t = malloc(sizeof(double) * (size_t)D);
    for (int64_t r = 0; r < L; r++)
        for (int s = 0; s < 2; s++)
            for (int h = 0; h < (s ? KVH : H); h++) {
                const float *x = (s ? ksrc + r * kld : qsrc + r * qld) + (int64_t)h * hs;
                double ss = 0;
                for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
                const double inv = 1.0 / sqrt(ss / D + eps);
                for (int i = 0; i < D; i++) t[i] = x[i] * inv * (s ? kn[i] : qn[i]);
                double *dst = (s ? rk + r * AK : rq + r * A) + (int64_t)h * D;
                for (int i = 0; i < D; i++) dst[i] = t[i];
                if (rope)
                    for (int i = 0; i < half; i++) {
                        const double c = cs[r * half + i], sv = sn[r * half + i];
                        dst[i] = t[i] * c - t[i + half] * sv;
                        dst[i + half] = t[i + half] * c + t[i] * sv;
                    }
            }
    if (vsrc)
        for (int64_t r = 0; r < L; r++)
            for (int h = 0; h < KVH; h++)
                for (int i = 0; i < D; i++) rv[r * AK + (int64_t)h * D + i] = vsrc[r * qld + (int64_t)h * hs + i];
    const h3_bt *qo = interleaved ? &q.t : &Qm.t, *ko = interleaved ? &k.t : &Km.t;
    int rc = b->be->ops->qk_norm_rope(b->be, &qin, &kin, interleaved ? &vin : NULL, hs, qnd, knd, csd, snd, H, KVH, D,
                                      half, eps, qo, ko, interleaved ? &v.t : NULL);
    CHECK_MSG(rc == 0, "%s: qk_norm_rope: %s", b->name, h3_last_error());
    bool pk = true;
    mat qv = interleaved ? q : Qm, kv = interleaved ? k : Km;
    float *oq = mread(b, &qv, NULL), *ok = mread(b, &kv, interleaved ? &pk : NULL);
    char what[192];
    snprintf(what, sizeof what, "L %lld heads %d/%d D %d rope %d %s%s in %s out %s", (long long)L, H, KVH, D,
             rope ? 2 * half : 0, interleaved ? "[q|k|v]" : "in place", weights ? (pad ? "" : " aligned") : " qn=kn=NULL",
             dn(idt), dn(odt));
    const double tol = b->gpu && odt == H3_DT_BF16 ? TOL_BF16 : TOL_F32;
    double e = rel_l2(oq, rq, L * A), e2 = rel_l2(ok, rk, L * AK);
    if (e2 > e) e = e2;
    if (interleaved) {
        float *ov = mread(b, &v, NULL);
        e2 = rel_l2(ov, rv, L * AK);
        if (e2 > e) e = e2;
        free(ov);
    }
    report(b, "qk_norm_rope", what, e, tol);
    CHECK_MSG(pk, "%s qk_norm_rope %s: wrote past the row of k", b->name, what);
    free(oq), free(ok), free(rq), free(rk), free(rv), free(t);
    if (interleaved)
        mfree(b, &QKV), mfree(b, &q), mfree(b, &k), mfree(b, &v);
    else
        mfree(b, &Qm), mfree(b, &Km);
    void *dev[] = {qnd, knd, csd, snd};
    for (int i = 0; i < 4; i++) b->be->mem->release(b->be, dev[i]);
    free(qn), free(kn), free(cs), free(sn);
}

/* ---- layernorm, copy, add_div --------------------------------------------------------------- */

static void t_layernorm(bk *b, int64_t rows, int64_t n, bool affine, bool inplace)
{
    mat X = mk(b, H3_DT_F32, rows, n, n + 1, 3.0f, true);
    mat Y = inplace ? X : mk(b, H3_DT_F32, rows, n, n, 1.0f, false);
    float *w = malloc(sizeof(float) * (size_t)n), *bb = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) w[i] = rnd(1.0f) + 1.0f, bb[i] = rnd(1.0f);
    for (int64_t r = 0; r < rows; r++) X.v[r * X.t.ld] += 2.0f; /* a non-zero mean */
    float *xh = malloc(sizeof(float) * (size_t)(rows * X.t.ld));
    memcpy(xh, X.v, sizeof(float) * (size_t)(rows * X.t.ld));
    dput(b, X.t.data, xh, sizeof(float) * (size_t)(rows * X.t.ld));
    float *wd = affine ? dup_host(b, w, sizeof(float) * (size_t)n) : NULL;
    float *bd = affine ? dup_host(b, bb, sizeof(float) * (size_t)n) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = xh + r * X.t.ld;
        double m = 0, var = 0;
        for (int64_t i = 0; i < n; i++) m += x[i];
        m /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - m) * (x[i] - m);
        var /= (double)n;
        for (int64_t i = 0; i < n; i++)
            ref[r * n + i] = (x[i] - m) / sqrt(var + 1e-5) * (affine ? w[i] : 1.0) + (affine ? bb[i] : 0.0);
    }
    int rc = b->be->ops->layernorm(b->be, &X.t, wd, bd, 1e-5f, &Y.t);
    CHECK_MSG(rc == 0, "%s: layernorm: %s", b->name, h3_last_error());
    float *y = mread(b, &Y, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld%s%s", (long long)rows, (long long)n, affine ? " w, b" : "",
             inplace ? " in place" : "");
    report(b, "layernorm", what, rel_l2(y, ref, rows * n), TOL_F32);
    free(y), free(ref), free(w), free(bb), free(xh);
    if (wd) b->be->mem->release(b->be, wd);
    if (bd) b->be->mem->release(b->be, bd);
    mfree(b, &X);
    if (!inplace) mfree(b, &Y);
}

static void t_copy_add_div(bk *b, int64_t rows, int64_t n)
{
    mat S = mk(b, H3_DT_F32, rows, n, n + 3, 1.0f, true), Dm = mk(b, H3_DT_F32, rows, n, n + 1, 1.0f, false);
    int rc = b->be->ops->copy(b->be, &S.t, &Dm.t);
    CHECK_MSG(rc == 0, "%s: copy: %s", b->name, h3_last_error());
    bool pad_ok;
    float *d = mread(b, &Dm, &pad_ok);
    bool same = pad_ok;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) same = same && d[r * n + i] == S.v[r * S.t.ld + i];
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld strided", (long long)rows, (long long)n);
    report_bits(b, "copy", what, same, 0.0);
    free(d);
    /* y = (y + x) / 3: the sum rounded, then a true division. */
    mat X = mk(b, H3_DT_F32, rows, n, n + 2, 1.0f, true);
    float *want = malloc(sizeof(float) * (size_t)(rows * n));
    double *ref = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const float sum = S.v[r * S.t.ld + i] + X.v[r * X.t.ld + i];
            want[r * n + i] = sum / 3.0f;
            ref[r * n + i] = ((double)S.v[r * S.t.ld + i] + X.v[r * X.t.ld + i]) / 3.0;
        }
    rc = b->be->ops->add_div(b->be, &S.t, &X.t, 3.0f);
    CHECK_MSG(rc == 0, "%s: add_div: %s", b->name, h3_last_error());
    d = mread(b, &S, NULL);
    report_bits(b, "add_div", what, memcmp(d, want, sizeof(float) * (size_t)(rows * n)) == 0, rel_l2(d, ref, rows * n));
    free(d), free(want), free(ref);
    mfree(b, &S), mfree(b, &Dm), mfree(b, &X);
}

/* dcopy: bytes between two allocations, in order with the ops around it (an odd length, odd offsets
   and every byte value, NaN patterns included: nothing may be read as a number). */
static void t_dcopy(bk *b, size_t bytes)
{
    unsigned char *src = malloc(bytes + 8), *got = malloc(bytes + 8);
    for (size_t i = 0; i < bytes + 8; i++) src[i] = (unsigned char)(i * 131u + 7u);
    char *d1 = b->be->mem->alloc(b->be, bytes + 8), *d2 = b->be->mem->alloc(b->be, bytes + 8);
    int rc = d1 && d2 ? 0 : -1;
    if (!rc) rc = b->be->mem->upload(b->be, d1, src, bytes + 8);
    if (!rc) rc = b->be->mem->zero(b->be, d2, bytes + 8);
    if (!rc) rc = b->be->mem->dcopy(b->be, d2 + 3, d1 + 1, bytes);
    if (!rc) rc = b->be->mem->dcopy(b->be, d2, d1, 0); /* nothing */
    if (!rc) rc = b->be->mem->download(b->be, got, d2, bytes + 8);
    CHECK_MSG(rc == 0, "%s: dcopy: %s", b->name, h3_last_error());
    bool same = rc == 0 && memcmp(got + 3, src + 1, bytes) == 0 && got[0] == 0 && got[1] == 0 && got[2] == 0;
    for (size_t i = bytes + 3; i < bytes + 8; i++) same = same && got[i] == 0;
    char what[96];
    snprintf(what, sizeof what, "%zu bytes at odd offsets", bytes);
    report_bits(b, "dcopy", what, same, 0.0);
    h3_err_clear();
    CHECK(b->be->mem->dcopy(b->be, NULL, d1, 4) < 0 && h3_last_error()[0]);
    b->be->mem->release(b->be, d1), b->be->mem->release(b->be, d2);
    free(src), free(got);
}

/* ---- gated_add, swiglu, scatter_rows -------------------------------------------------------- */

static void t_gated(bk *b, int64_t rows, int64_t n, bool mod, h3_dtype ydt, int64_t xpad)
{
    mat X = mk(b, H3_DT_F32, rows, n, n + xpad, 1.0f, true), Y = mk(b, ydt, rows, n, n, 1.0f, true);
    const int entries = 4, stride = 6, slot = 2;
    const size_t ntab = (size_t)entries * stride * (size_t)n;
    float *tab = malloc(sizeof(float) * ntab);
    for (size_t i = 0; i < ntab; i++) tab[i] = rnd(1.0f);
    int32_t *ent = malloc(sizeof(int32_t) * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) ent[r] = (int32_t)((r * 3 + 2) % entries);
    float *tabd = mod ? dup_host(b, tab, sizeof(float) * ntab) : NULL;
    int32_t *entd = mod ? dup_host(b, ent, sizeof(int32_t) * (size_t)rows) : NULL;
    h3_bmod bm = {tabd, entd, stride, slot};
    double *ref = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double g = mod ? tab[((int64_t)ent[r] * stride + slot) * n + i] : 1.0;
            ref[r * n + i] = X.v[r * X.t.ld + i] + g * Y.v[r * Y.t.ld + i];
        }
    h3_bmod none = {NULL, NULL, 0, 0};
    int rc = b->be->ops->gated_add(b->be, &X.t, &Y.t, mod ? &bm : &none);
    CHECK_MSG(rc == 0, "%s: gated_add: %s", b->name, h3_last_error());
    float *x = mread(b, &X, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld%s y %s", (long long)rows, (long long)n, mod ? " mod" : "", dn(ydt));
    report(b, "gated_add", what, rel_l2(x, ref, rows * n), TOL_F32);
    free(x), free(ref), free(tab), free(ent);
    mfree(b, &X), mfree(b, &Y);
    if (tabd) b->be->mem->release(b->be, tabd);
    if (entd) b->be->mem->release(b->be, entd);
}

/* gated_add_norm: the residual add (gate slot 2 of a 6-slot table, or none) then the modulated
   norm (slot 3), checked on both outputs: x after the add and the norm of it. xpad > 0 gives rows
   no vector access can take (the GPU's two-kernel path); 0 the fused one. */
static void t_gated_norm(bk *b, int64_t rows, int64_t n, bool gate, bool w, h3_dtype ydt, h3_dtype odt, int64_t xpad)
{
    mat X = mk(b, H3_DT_F32, rows, n, n + xpad, 2.0f, true), Y = mk(b, ydt, rows, n, n, 2.0f, true);
    mat O = mk(b, odt, rows, n, n, 1.0f, false);
    const int entries = 3, stride = 6;
    const size_t ntab = (size_t)entries * stride * (size_t)n;
    float *tab = malloc(sizeof(float) * ntab), *wh = malloc(sizeof(float) * (size_t)n);
    for (size_t i = 0; i < ntab; i++) tab[i] = rnd(1.0f);
    for (int64_t i = 0; i < n; i++) wh[i] = rnd(1.0f) + 1.0f;
    int32_t *ent = malloc(sizeof(int32_t) * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) ent[r] = (int32_t)((r * 5 + 1) % entries);
    float *tabd = dup_host(b, tab, sizeof(float) * ntab), *wd = w ? dup_host(b, wh, sizeof(float) * (size_t)n) : NULL;
    int32_t *entd = dup_host(b, ent, sizeof(int32_t) * (size_t)rows);
    const h3_bmod gm = {gate ? tabd : NULL, gate ? entd : NULL, stride, 2}, nm = {tabd, entd, stride, 3};
    const float eps = 1e-6f;
    double *rx = malloc(sizeof(double) * (size_t)(rows * n)), *ro = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++) {
        const float *g = tab + ((int64_t)ent[r] * stride + 2) * n, *sh = tab + ((int64_t)ent[r] * stride + 3) * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) {
            /* the add rounds to f32 (x is stored f32) before the norm reads it */
            const float xv = (float)(X.v[r * X.t.ld + i] + (gate ? (double)g[i] : 1.0) * Y.v[r * Y.t.ld + i]);
            rx[r * n + i] = xv;
            ss += (double)xv * xv;
        }
        const double inv = 1.0 / sqrt(ss / (double)n + eps);
        for (int64_t i = 0; i < n; i++) ro[r * n + i] = rx[r * n + i] * inv * (w ? wh[i] : 1.0) * sh[n + i] + sh[i];
    }
    int rc = b->be->ops->gated_add_norm(b->be, &X.t, &Y.t, &gm, wd, &nm, eps, &O.t);
    CHECK_MSG(rc == 0, "%s: gated_add_norm: %s", b->name, h3_last_error());
    float *x = mread(b, &X, NULL), *o = mread(b, &O, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld%s%s%s y %s out %s", (long long)rows, (long long)n, gate ? " gate" : "",
             w ? "" : " w=NULL", xpad ? "" : " aligned", dn(ydt), dn(odt));
    report(b, "gated_add_norm", what, rel_l2(x, rx, rows * n), TOL_F32);
    report(b, "gated_add_norm", what, rel_l2(o, ro, rows * n),
           b->gpu && odt == H3_DT_BF16 ? TOL_BF16 : TOL_F32);
    free(x), free(o), free(rx), free(ro), free(tab), free(wh), free(ent);
    mfree(b, &X), mfree(b, &Y), mfree(b, &O);
    b->be->mem->release(b->be, tabd);
    b->be->mem->release(b->be, entd);
    if (wd) b->be->mem->release(b->be, wd);
}

/* gate and up side by side in one [rows, 2n] buffer (dit.c's layout); with `alias`, out is gate. */
static void t_swiglu(bk *b, int64_t rows, int64_t n, bool alias, h3_dtype dt)
{
    mat GU = mk(b, dt, rows, 2 * n, 2 * n, 3.0f, true);
    mat O = mk(b, dt, rows, n, n + 1, 1.0f, false);
    const size_t es = esz(dt);
    h3_bt gate = h3_bt_make(GU.t.data, dt, rows, n, 2 * n);
    h3_bt up = h3_bt_make((char *)GU.t.data + (size_t)n * es, dt, rows, n, 2 * n);
    h3_bt out = alias ? gate : O.t;
    double *ref = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double g = GU.v[r * 2 * n + i], u = GU.v[r * 2 * n + n + i];
            ref[r * n + i] = u * g / (1.0 + exp(-g));
        }
    int rc = b->be->ops->swiglu(b->be, &gate, &up, &out);
    CHECK_MSG(rc == 0, "%s: swiglu: %s", b->name, h3_last_error());
    float *o;
    if (alias) {
        mat G = GU;
        G.t = gate;
        o = mread(b, &G, NULL);
    } else {
        o = mread(b, &O, NULL);
    }
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld %s%s", (long long)rows, (long long)n, dn(dt), alias ? " out=gate" : "");
    report(b, "swiglu", what, rel_l2(o, ref, rows * n), b->gpu && dt == H3_DT_BF16 ? TOL_BF16 : TOL_F32);
    free(o), free(ref);
    mfree(b, &GU), mfree(b, &O);
}

/* ---- the vision tower's ops: gelu (both forms) and rope without a norm -------------------- */

static void t_gelu(bk *b, int64_t rows, int64_t n, bool tanh_approx, bool inplace)
{
    mat X = mk(b, H3_DT_F32, rows, n, n + 1, 4.0f, true);
    mat Y = inplace ? X : mk(b, H3_DT_F32, rows, n, n, 1.0f, false);
    double *ref = malloc(sizeof(double) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double v = X.v[r * X.t.ld + i];
            ref[r * n + i] = tanh_approx ? 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))
                                         : 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        }
    int rc = b->be->ops->gelu(b->be, &X.t, tanh_approx, &Y.t);
    CHECK_MSG(rc == 0, "%s: gelu: %s", b->name, h3_last_error());
    bool pad_ok = true;
    float *y = mread(b, &Y, inplace ? NULL : &pad_ok);
    char what[192];
    snprintf(what, sizeof what, "%lld x %lld %s%s", (long long)rows, (long long)n, tanh_approx ? "tanh" : "erf",
             inplace ? " in place" : "");
    report(b, "gelu", what, rel_l2(y, ref, rows * n), TOL_F32);
    CHECK_MSG(pad_ok, "%s gelu %s: wrote past the row", b->name, what);
    free(y), free(ref);
    mfree(b, &X);
    if (!inplace) mfree(b, &Y);
}

/* rope on the k columns of fused [q | k | v] rows (the vision tower's qkv): k rotated, q and v
   left as they were. */
static void t_rope(bk *b, int64_t rows, int heads, int D, int half)
{
    const int64_t C = (int64_t)heads * D, ld = 3 * C + 1;
    mat X = mk(b, H3_DT_F32, rows, 3 * C, ld, 2.0f, true);
    float *cs = malloc(sizeof(float) * (size_t)(rows * half)), *sn = malloc(sizeof(float) * (size_t)(rows * half));
    for (int64_t i = 0; i < rows * half; i++) {
        const double ang = rnd(3.0f);
        cs[i] = (float)cos(ang), sn[i] = (float)sin(ang);
    }
    float *csd = dup_host(b, cs, sizeof(float) * (size_t)(rows * half));
    float *snd = dup_host(b, sn, sizeof(float) * (size_t)(rows * half));
    double *ref = malloc(sizeof(double) * (size_t)(rows * 3 * C));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < 3 * C; c++) {
            const float *x = X.v + r * ld;
            double v = x[c];
            const int64_t hd = c - C, d = hd % D;
            if (c >= C && c < 2 * C && d < 2 * half) {
                const double cc = cs[r * half + d % half], ss = sn[r * half + d % half];
                v = d < half ? x[c] * cc - x[c + half] * ss : x[c] * cc + x[c - half] * ss;
            }
            ref[r * 3 * C + c] = v;
        }
    h3_bt k = h3_bt_make((float *)X.t.data + C, H3_DT_F32, rows, C, ld);
    int rc = b->be->ops->rope(b->be, &k, heads, D, half, csd, snd);
    CHECK_MSG(rc == 0, "%s: rope: %s", b->name, h3_last_error());
    float *y = mread(b, &X, NULL); /* (X's padding column holds random values, not poison) */
    char what[192];
    snprintf(what, sizeof what, "%lld rows, %d heads x %d, %d pairs, k of [q|k|v]", (long long)rows, heads, D, half);
    report(b, "rope", what, rel_l2(y, ref, rows * 3 * C), TOL_F32);
    bool same = true;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < 3 * C; c++)
            if ((c < C || c >= 2 * C || (c - C) % D >= 2 * half) && y[r * 3 * C + c] != X.v[r * ld + c]) same = false;
    CHECK_MSG(same, "%s rope %s: touched columns outside the rotated dims", b->name, what);
    free(y), free(ref), free(cs), free(sn);
    b->be->mem->release(b->be, csd);
    b->be->mem->release(b->be, snd);
    mfree(b, &X);
}

static void t_scatter(bk *b, int64_t rows, int64_t drows, int64_t n)
{
    mat S = mk(b, H3_DT_F32, rows, n, n + 1, 1.0f, true), Dm = mk(b, H3_DT_F32, drows, n, n, 1.0f, true);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) idx[i] = (i * 7 + 3) % drows; /* distinct while rows <= drows, 7 coprime */
    int64_t *idxd = dup_host(b, idx, sizeof(int64_t) * (size_t)rows);
    double *ref = malloc(sizeof(double) * (size_t)(drows * n));
    for (int64_t r = 0; r < drows; r++)
        for (int64_t i = 0; i < n; i++) ref[r * n + i] = Dm.v[r * n + i];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) ref[idx[r] * n + i] = S.v[r * S.t.ld + i];
    int rc = b->be->ops->scatter_rows(b->be, &S.t, idxd, &Dm.t);
    CHECK_MSG(rc == 0, "%s: scatter_rows: %s", b->name, h3_last_error());
    float *d = mread(b, &Dm, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld rows of %lld into %lld", (long long)rows, (long long)n, (long long)drows);
    double e = rel_l2(d, ref, drows * n);
    bool exact = true;
    for (int64_t i = 0; i < drows * n; i++) exact = exact && (double)d[i] == ref[i];
    report_bits(b, "scatter_rows", what, exact, e);
    free(d), free(ref), free(idx);
    b->be->mem->release(b->be, idxd);
    mfree(b, &S), mfree(b, &Dm);
}

/* ---- sampler: euler, noise ------------------------------------------------------------------ */

static void t_euler(bk *b, int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)n), *v = malloc(sizeof(float) * (size_t)n);
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = rnd(2.0f), v[i] = rnd(2.0f);
    memcpy(want, x, sizeof(float) * (size_t)n);
    const float t = 0.3137f, sigma = 0.6863f, sigma_next = 0.5412f;
    h3_sched_euler(want, v, n, t, sigma, sigma_next);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const double r = (double)sigma_next / sigma;
        ref[i] = r * x[i] + (1 - r) * (x[i] + (1.0 - t) * v[i]);
    }
    float *xd = dup_host(b, x, sizeof(float) * (size_t)n), *vd = dup_host(b, v, sizeof(float) * (size_t)n);
    int rc = b->be->ops->euler(b->be, xd, vd, n, t, sigma, sigma_next);
    CHECK_MSG(rc == 0, "%s: euler: %s", b->name, h3_last_error());
    dget(b, got, xd, sizeof(float) * (size_t)n);
    char what[192];
    snprintf(what, sizeof what, "%lld values vs h3_sched_euler", (long long)n);
    report_bits(b, "euler", what, memcmp(got, want, sizeof(float) * (size_t)n) == 0, rel_l2(got, ref, n));
    b->be->mem->release(b->be, xd);
    b->be->mem->release(b->be, vd);
    free(x), free(v), free(want), free(got), free(ref);
}

static void t_noise(bk *b, int64_t n, uint64_t seed, uint32_t stream, uint64_t offset)
{
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    h3_noise(seed, stream, offset, want, n);
    float *d = dnew(b, sizeof(float) * (size_t)n);
    dpoison(b, d, sizeof(float) * (size_t)n);
    int rc = b->be->ops->noise(b->be, seed, stream, offset, d, n);
    CHECK_MSG(rc == 0, "%s: noise: %s", b->name, h3_last_error());
    dget(b, got, d, sizeof(float) * (size_t)n);
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; i++) m += got[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) v += (got[i] - m) * (got[i] - m);
    v /= (double)n;
    char what[192];
    snprintf(what, sizeof what, "%lld values, offset %llu (mean %.3f, var %.3f)", (long long)n,
             (unsigned long long)offset, m, v);
    report_bits(b, "noise", what, memcmp(got, want, sizeof(float) * (size_t)n) == 0, 0.0);
    CHECK(fabs(m) < 0.05 && fabs(v - 1.0) < 0.1);
    b->be->mem->release(b->be, d);
    free(want), free(got);
}

/* ---- speed knobs ---------------------------------------------------------------------------- */

static void t_knobs(bk *b, int64_t n)
{
    float *a = calloc((size_t)n, sizeof(float)), *c = calloc((size_t)n, sizeof(float));
    float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) a[i] = rnd(2.0f), c[i] = rnd(2.0f);
    float *ad = dup_host(b, a, sizeof(float) * (size_t)n), *cd = dup_host(b, c, sizeof(float) * (size_t)n);
    float *od = dnew(b, sizeof(float) * (size_t)n);
    const float r = 0.37f;
    char what[192];

    /* extrapolate: out = a + r (a - b), the CPU's rounding; then in place (out = a); then a copy. */
    for (int64_t i = 0; i < n; i++) {
        const float d = a[i] - c[i], p = r * d;
        want[i] = a[i] + p;
        ref[i] = a[i] + (double)r * ((double)a[i] - c[i]);
    }
    dpoison(b, od, sizeof(float) * (size_t)n);
    int rc = b->be->ops->extrapolate(b->be, od, ad, cd, n, r);
    CHECK_MSG(rc == 0, "%s: extrapolate: %s", b->name, h3_last_error());
    dget(b, got, od, sizeof(float) * (size_t)n);
    snprintf(what, sizeof what, "%lld values", (long long)n);
    report_bits(b, "extrapolate", what, memcmp(got, want, sizeof(float) * (size_t)n) == 0, rel_l2(got, ref, n));
    float *ad2 = dup_host(b, a, sizeof(float) * (size_t)n);
    rc = b->be->ops->extrapolate(b->be, ad2, ad2, cd, n, r);
    dget(b, got, ad2, sizeof(float) * (size_t)n);
    report_bits(b, "extrapolate", "in place (out = a)", rc == 0 && memcmp(got, want, sizeof(float) * (size_t)n) == 0,
                rel_l2(got, ref, n));
    dpoison(b, od, sizeof(float) * (size_t)n);
    rc = b->be->ops->extrapolate(b->be, od, ad, NULL, n, r);
    dget(b, got, od, sizeof(float) * (size_t)n);
    report_bits(b, "extrapolate", "b = NULL (copy)", rc == 0 && memcmp(got, a, sizeof(float) * (size_t)n) == 0, 0.0);
    b->be->mem->release(b->be, ad2);

    /* sub */
    for (int64_t i = 0; i < n; i++) want[i] = a[i] - c[i], ref[i] = (double)a[i] - c[i];
    dpoison(b, od, sizeof(float) * (size_t)n);
    rc = b->be->ops->sub(b->be, od, ad, cd, n);
    CHECK_MSG(rc == 0, "%s: sub: %s", b->name, h3_last_error());
    dget(b, got, od, sizeof(float) * (size_t)n);
    report_bits(b, "sub", what, memcmp(got, want, sizeof(float) * (size_t)n) == 0, rel_l2(got, ref, n));

    /* abs_diff_sum */
    double dd = -1, dr = -1, rd = 0, rr = 0;
    for (int64_t i = 0; i < n; i++) rd += fabs((double)a[i] - c[i]), rr += fabs((double)c[i]);
    rc = b->be->ops->abs_diff_sum(b->be, ad, cd, n, &dd, &dr);
    CHECK_MSG(rc == 0, "%s: abs_diff_sum: %s", b->name, h3_last_error());
    const double e = fmax(fabs(dd - rd) / rd, fabs(dr - rr) / rr);
    report(b, "abs_diff_sum", what, e, 1e-12);
    double dd2 = -1, dr2 = -1;
    rc = b->be->ops->abs_diff_sum(b->be, ad, cd, n, &dd2, &dr2);
    CHECK_MSG(rc == 0 && dd2 == dd && dr2 == dr, "%s abs_diff_sum: not deterministic", b->name);

    b->be->mem->release(b->be, ad);
    b->be->mem->release(b->be, cd);
    b->be->mem->release(b->be, od);
    free(a), free(c), free(want), free(got), free(ref);
}

/* pool_pairs then unpool_pairs over `rows` source rows: pairs (2i, 2i + 1), the last row single
   when rows is odd, in a shuffled order. */
static void t_pairs(bk *b, int64_t rows, int64_t n)
{
    const int64_t np = (rows + 1) / 2;
    int64_t *pairs = calloc((size_t)(2 * np), sizeof(int64_t));
    for (int64_t j = 0; j < np; j++) {
        const int64_t k = (j * 5 + 1) % np; /* a permutation when gcd(5, np) = 1 */
        pairs[2 * j] = 2 * k;
        pairs[2 * j + 1] = 2 * k + 1 < rows ? 2 * k + 1 : -1;
    }
    int64_t *pd = dup_host(b, pairs, sizeof(int64_t) * (size_t)(2 * np));
    mat S = mk(b, H3_DT_F32, rows, n, n + 1, 2.0f, true);
    mat P = mk(b, H3_DT_F32, np, n, n, 1.0f, false);
    float *want = malloc(sizeof(float) * (size_t)(np * n + rows * n));
    double *ref = malloc(sizeof(double) * (size_t)(np * n + rows * n));
    for (int64_t j = 0; j < np; j++)
        for (int64_t i = 0; i < n; i++) {
            const float x0 = S.v[pairs[2 * j] * S.t.ld + i];
            const int64_t p1 = pairs[2 * j + 1];
            const float s = p1 >= 0 ? x0 + S.v[p1 * S.t.ld + i] : x0;
            want[j * n + i] = p1 >= 0 ? s * 0.5f : x0;
            ref[j * n + i] = p1 >= 0 ? ((double)x0 + S.v[p1 * S.t.ld + i]) * 0.5 : x0;
        }
    int rc = b->be->ops->pool_pairs(b->be, &S.t, pd, &P.t);
    CHECK_MSG(rc == 0, "%s: pool_pairs: %s", b->name, h3_last_error());
    float *got = mread(b, &P, NULL);
    char what[192];
    snprintf(what, sizeof what, "%lld rows of %lld -> %lld", (long long)rows, (long long)n, (long long)np);
    report_bits(b, "pool_pairs", what, memcmp(got, want, sizeof(float) * (size_t)(np * n)) == 0, rel_l2(got, ref, np * n));
    free(got);

    /* unpool: red = base + something; full starts as the source rows. */
    mat R = mk(b, H3_DT_F32, np, n, n + 2, 1.0f, true);
    mat F = mk(b, H3_DT_F32, rows, n, n, 1.0f, false);
    float *fh = malloc(sizeof(float) * (size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) fh[r * n + i] = S.v[r * S.t.ld + i];
    dput(b, F.t.data, fh, sizeof(float) * (size_t)(rows * n));
    for (int64_t j = 0; j < np; j++) {
        const int64_t p0 = pairs[2 * j], p1 = pairs[2 * j + 1];
        for (int64_t i = 0; i < n; i++) {
            const float y = R.v[j * R.t.ld + i], bs = want[j * n + i];
            if (p1 < 0) {
                fh[p0 * n + i] = y;
                continue;
            }
            const float d = y - bs;
            fh[p0 * n + i] = fh[p0 * n + i] + d;
            fh[p1 * n + i] = fh[p1 * n + i] + d;
        }
    }
    for (int64_t i = 0; i < rows * n; i++) ref[i] = fh[i];
    rc = b->be->ops->unpool_pairs(b->be, &R.t, &P.t, pd, &F.t);
    CHECK_MSG(rc == 0, "%s: unpool_pairs: %s", b->name, h3_last_error());
    got = mread(b, &F, NULL);
    report_bits(b, "unpool_pairs", what, memcmp(got, fh, sizeof(float) * (size_t)(rows * n)) == 0,
                rel_l2(got, ref, rows * n));
    free(got), free(fh), free(want), free(ref), free(pairs);
    b->be->mem->release(b->be, pd);
    mfree(b, &S), mfree(b, &P), mfree(b, &R), mfree(b, &F);
}

/* ---- memory and errors ---------------------------------------------------------------------- */

static void t_memory(bk *b)
{
    const size_t n = 1000;
    unsigned char *h = malloc(n), *g = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 37 + 11);
    unsigned char *d = dnew(b, n);
    dput(b, d, h, n);
    dget(b, g, d, n);
    bool ok = memcmp(g, h, n) == 0;
    CHECK_MSG(b->be->mem->zero(b->be, d + 100, 333) == 0, "%s: zero: %s", b->name, h3_last_error());
    dget(b, g, d, n);
    for (size_t i = 0; i < n; i++) ok = ok && g[i] == (i >= 100 && i < 433 ? 0 : h[i]);
    CHECK_MSG(b->be->mem->sync(b->be) == 0, "%s: sync: %s", b->name, h3_last_error());
    uint64_t fr = 1, tot = 1;
    CHECK(b->be->mem->mem_info(b->be, &fr, &tot) == 0);
    if (b->gpu) CHECK_MSG(tot > 0 && fr <= tot, "%s: mem_info %llu of %llu", b->name, (unsigned long long)fr,
                          (unsigned long long)tot);
    printf("%-5s %-13s %-52s %s\n", b->name, "memory", "upload, download, zero, sync, mem_info", ok ? "ok" : "FAIL");
    CHECK_MSG(ok, "%s: memory round trip", b->name);
    b->be->mem->release(b->be, d);
    b->be->mem->release(b->be, NULL);
    free(h), free(g);
}

/* Bad requests fail with a message and leave the backend usable. */
static void t_errors(bk *b)
{
    mat Q = mk(b, b->gpu ? H3_DT_BF16 : H3_DT_F32, 4, 24, 24, 1.0f, true);
    mat O = mk(b, b->gpu ? H3_DT_BF16 : H3_DT_F32, 4, 24, 24, 1.0f, false);
    int rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 3, 2, 8, 0.35f, false, &O.t);
    CHECK_MSG(rc < 0 && h3_last_error()[0], "%s: attention with 3 heads over 2 kv heads was accepted", b->name);
    printf("%-5s %-13s %-52s %s\n", b->name, "errors", "3 heads over 2 kv heads", h3_last_error());
    if (b->gpu) {
        /* An impossible allocation: NULL and the one-line out-of-memory message. */
        void *p = b->be->mem->alloc(b->be, (size_t)1 << 50);
        CHECK_MSG(!p && strstr(h3_last_error(), "out of device memory"), "%s: 1 PiB alloc: %s", b->name,
                  h3_last_error());
        printf("%-5s %-13s %-52s %s\n", b->name, "errors", "1 PiB allocation", h3_last_error());
        if (p) b->be->mem->release(b->be, p);
    }
    rc = b->be->ops->attention(b->be, &Q.t, &Q.t, &Q.t, 3, 3, 8, 0.35f, false, &O.t);
    CHECK_MSG(rc == 0, "%s: attention after an error: %s", b->name, h3_last_error());
    mfree(b, &Q), mfree(b, &O);
}

/* ---- benchmark (H3_BENCH=1, GPU backends) ---------------------------------------------------- */
#ifndef UNDER_ASAN

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of `reps` timed runs of fn after one warm-up, synchronised around each. */
typedef int (*bench_fn)(bk *b, void *ctx);

static double best_time(bk *b, bench_fn fn, void *ctx, int reps)
{
    double best = 1e30;
    if (fn(b, ctx) || b->be->mem->sync(b->be)) return -1;
    for (int i = 0; i < reps; i++) {
        const double t0 = now_s();
        if (fn(b, ctx) || b->be->mem->sync(b->be)) return -1;
        const double t = now_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* A device buffer of n bf16 values from a repeated random pattern (timings do not depend on it). */
static void *bench_bf16(bk *b, int64_t n, float scale)
{
    const int64_t pat = 1 << 20;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)pat);
    for (int64_t i = 0; i < pat; i++) h[i] = h3_f32_to_bf16(rnd(scale));
    unsigned char *d = dnew(b, (size_t)n * 2);
    for (int64_t off = 0; off < n; off += pat) {
        const int64_t m = n - off < pat ? n - off : pat;
        dput(b, d + off * 2, h, (size_t)m * 2);
    }
    free(h);
    return d;
}

typedef struct {
    h3_bt Q, K, V, O;
    int heads, D;
    float scale;
} attn_ctx;

static int run_attn(bk *b, void *c)
{
    attn_ctx *a = c;
    return b->be->ops->attention(b->be, &a->Q, &a->K, &a->V, a->heads, a->heads, a->D, a->scale, false, &a->O);
}

typedef struct {
    h3_bt X, Y;
    h3_bw W;
} gemm_ctx;

static int run_gemm(bk *b, void *c)
{
    gemm_ctx *g = c;
    return b->be->ops->linear(b->be, &g->X, &g->W, NULL, &g->Y);
}

/* The released model's shapes (hidden 5376, 56 heads x 128, SwiGLU 14336) at the three anchor
   token counts of shared/gpu-anchors.md: attention and the four GEMMs of a block, in TFLOP/s,
   and the attention checked on sampled rows against a double reference. */
static void bench(bk *b)
{
    const int heads = 56, D = 128;
    const int64_t A = (int64_t)heads * D, H = 5376, F = 14336;
    const int64_t Ls[] = {1874, 7135, 37838};
    printf("== %s benchmark (best of 5; attention FLOPs 4 L^2 heads D, GEMM 2 M N K)\n", b->name);
    for (int li = 0; li < 3; li++) {
        const int64_t L = Ls[li];
        attn_ctx a;
        a.heads = heads, a.D = D, a.scale = 1.0f / sqrtf((float)D);
        a.Q = h3_bt_make(bench_bf16(b, L * A, 2.0f), H3_DT_BF16, L, A, A);
        a.K = h3_bt_make(bench_bf16(b, L * A, 2.0f), H3_DT_BF16, L, A, A);
        a.V = h3_bt_make(bench_bf16(b, L * A, 1.0f), H3_DT_BF16, L, A, A);
        a.O = h3_bt_make(dnew(b, (size_t)(L * A) * 2), H3_DT_BF16, L, A, A);
        /* bf16, then fp8 attention where the backend has it (its time includes the quantise and
           widen passes around cuDNN's fp8 SDPA). */
        for (int fp8 = 0; fp8 < (b->be->attn_fp8_why[0] ? 1 : 2); fp8++) {
            b->be->attn_precision = fp8 ? H3_PRECISION_FP8 : H3_PRECISION_DEFAULT;
            const double t = best_time(b, run_attn, &a, 5);
            b->be->attn_precision = H3_PRECISION_DEFAULT;
            const double fl = 4.0 * (double)L * (double)L * heads * D;
            printf("%-5s %-13s L %-6lld %d heads x %d            %8.3f ms  %6.1f TFLOP/s\n", b->name,
                   fp8 ? "attention fp8" : "attention", (long long)L, heads, D, t * 1e3, t > 0 ? fl / t * 1e-12 : 0.0);
            CHECK_MSG(t > 0, "%s: attention%s benchmark failed: %s", b->name, fp8 ? " fp8" : "", h3_last_error());
            /* Sampled rows of two heads against a double reference. */
            if (t > 0) {
                uint16_t *q = malloc((size_t)(L * A) * 2), *k = malloc((size_t)(L * A) * 2), *v = malloc((size_t)(L * A) * 2),
                         *o = malloc((size_t)(L * A) * 2);
                dget(b, q, a.Q.data, (size_t)(L * A) * 2);
                dget(b, k, a.K.data, (size_t)(L * A) * 2);
                dget(b, v, a.V.data, (size_t)(L * A) * 2);
                dget(b, o, a.O.data, (size_t)(L * A) * 2);
                const int samples = 24, hs[2] = {0, heads - 1};
                double num = 0, den = 0, *sc = malloc(sizeof(double) * (size_t)L);
                for (int si = 0; si < samples; si++)
                    for (int hi = 0; hi < 2; hi++) {
                        const int64_t i = (si * 7919 + 13) % L;
                        const int h = hs[hi];
                        double mx = -1e300, sum = 0;
                        for (int64_t j = 0; j < L; j++) {
                            double d = 0;
                            for (int c = 0; c < D; c++)
                                d += (double)h3_bf16_to_f32(q[i * A + h * D + c]) * h3_bf16_to_f32(k[j * A + h * D + c]);
                            sc[j] = d * a.scale;
                            if (sc[j] > mx) mx = sc[j];
                        }
                        for (int64_t j = 0; j < L; j++) sum += (sc[j] = exp(sc[j] - mx));
                        for (int c = 0; c < D; c++) {
                            double r = 0;
                            for (int64_t j = 0; j < L; j++) r += sc[j] * h3_bf16_to_f32(v[j * A + h * D + c]);
                            r /= sum;
                            const double g = h3_bf16_to_f32(o[i * A + h * D + c]);
                            num += (g - r) * (g - r);
                            den += r * r;
                        }
                    }
                const double e = sqrt(num / (den > 0 ? den : 1));
                report(b, fp8 ? "attention fp8" : "attention", "sampled rows of heads 0 and 55 at this L", e,
                       fp8 ? TOL_FP8_ATTN : TOL_BF16);
                free(q), free(k), free(v), free(o), free(sc);
            }
        }
        b->be->mem->release(b->be, a.Q.data);
        b->be->mem->release(b->be, a.K.data);
        b->be->mem->release(b->be, a.V.data);
        b->be->mem->release(b->be, a.O.data);

        /* The block's GEMMs: qkv (H -> 3A), out (A -> H), fc1 (H -> 2F), fc2 (F -> H). */
        const int64_t shapes[4][2] = {{3 * A, H}, {H, A}, {2 * F, H}, {H, F}};
        const char *names[4] = {"qkv", "attn out", "fc1", "fc2"};
        double total = 0, total_fl = 0;
        for (int gi = 0; gi < 4; gi++) {
            const int64_t N = shapes[gi][0], K = shapes[gi][1];
            uint16_t *w = malloc((size_t)(N * K) * 2);
            for (int64_t i = 0; i < N * K; i++) w[i] = h3_f32_to_bf16(rnd(0.05f));
            gemm_ctx g;
            int rc = b->be->weights->weight_load(b->be, w, H3_DT_BF16, N, K, &g.W);
            CHECK_MSG(rc == 0, "%s: weight_load: %s", b->name, h3_last_error());
            if (rc) {
                free(w);
                continue;
            }
            g.X = h3_bt_make(bench_bf16(b, L * K, 1.0f), H3_DT_BF16, L, K, K);
            g.Y = h3_bt_make(dnew(b, (size_t)(L * N) * 2), H3_DT_BF16, L, N, N);
            const double tg = best_time(b, run_gemm, &g, 5);
            const double gfl = 2.0 * (double)L * (double)N * (double)K;
            printf("%-5s %-13s L %-6lld %-8s %5lld x %-5lld       %8.3f ms  %6.1f TFLOP/s\n", b->name, "linear",
                   (long long)L, names[gi], (long long)N, (long long)K, tg * 1e3, tg > 0 ? gfl / tg * 1e-12 : 0.0);
            CHECK_MSG(tg > 0, "%s: linear benchmark failed: %s", b->name, h3_last_error());
            total += tg, total_fl += gfl;
            b->be->mem->release(b->be, g.X.data);
            b->be->mem->release(b->be, g.Y.data);
            b->be->weights->weight_free(b->be, &g.W);
            free(w); /* a host-memory backend (Metal) computes on the host data: kept until weight_free */
        }
        printf("%-5s %-13s L %-6lld the block's four GEMMs           %8.3f ms  %6.1f TFLOP/s\n", b->name, "linear",
               (long long)L, total * 1e3, total > 0 ? total_fl / total * 1e-12 : 0.0);
    }
}

#endif /* UNDER_ASAN */

/* The decoders' layout and convolution ops (channels_last ... conv1_clamp): run_decoder_ops. */
#include "backend_ops_decoders.inc"
#include "backend_ops_int8.inc"
#include "backend_ops_audio_enc.inc"
#include "backend_ops_wstream.inc"
#include "backend_ops_fp8.inc"
#include "backend_ops_wpack.inc"

/* ---- the suite ------------------------------------------------------------------------------ */

/* ---- conv3d, group_norm (the video encoder's ops) ------------------------------------------- */

static int refl(int i, int n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; }

/* conv3d against the definition in backend.h, in double: causal zero frames, reflected rows and
   columns, strides; W [cout][(dt, dy, dx, c)]. */
static void t_conv3d(bk *b, h3_bconv3d g, const char *what)
{
    int To, Ho, Wo;
    h3_bconv3d_out(&g, &To, &Ho, &Wo);
    const int64_t nx = (int64_t)g.T * g.H * g.W * g.cin, K = (int64_t)g.kt * g.kh * g.kw * g.cin;
    const int64_t M = (int64_t)To * Ho * Wo, ny = M * g.cout;
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)(K * g.cout));
    float *bias = malloc(sizeof(float) * (size_t)g.cout);
    for (int64_t i = 0; i < nx; i++) x[i] = rnd(1.0f);
    for (int64_t i = 0; i < K * g.cout; i++) w[i] = rnd(1.0f) / (float)sqrt((double)K);
    for (int o = 0; o < g.cout; o++) bias[o] = rnd(0.5f);
    double *ref = malloc(sizeof(double) * (size_t)ny);
    for (int64_t m = 0; m < M; m++) {
        const int to = (int)(m / ((int64_t)Ho * Wo)), yo = (int)(m / Wo % Ho), xo = (int)(m % Wo);
        for (int o = 0; o < g.cout; o++) {
            double s = bias[o];
            const float *wo = w + (int64_t)o * K;
            for (int dt = 0; dt < g.kt; dt++) {
                const int ti = to * g.st + dt - g.pad_t;
                if (ti < 0) continue;
                for (int dy = 0; dy < g.kh; dy++)
                    for (int dx = 0; dx < g.kw; dx++) {
                        const int yi = refl(yo * g.sh + dy - g.pad_top, g.H), xi = refl(xo * g.sw + dx - g.pad_left, g.W);
                        const float *xp = x + (((int64_t)ti * g.H + yi) * g.W + xi) * g.cin;
                        const float *wp = wo + (((int64_t)dt * g.kh + dy) * g.kw + dx) * g.cin;
                        for (int c = 0; c < g.cin; c++) s += (double)wp[c] * xp[c];
                    }
            }
            ref[m * g.cout + o] = s;
        }
    }
    float *xd = dup_host(b, x, sizeof(float) * (size_t)nx), *bd = dup_host(b, bias, sizeof(float) * (size_t)g.cout);
    float *yd = dnew(b, sizeof(float) * (size_t)ny);
    h3_bw W;
    int rc = b->be->weights->weight_load(b->be, w, H3_DT_F32, g.cout, K, &W);
    CHECK_MSG(rc == 0, "%s: weight_load: %s", b->name, h3_last_error());
    float *y = malloc(sizeof(float) * (size_t)ny), *y2 = malloc(sizeof(float) * (size_t)ny);
    dpoison(b, yd, sizeof(float) * (size_t)ny);
    rc = b->be->dec->conv3d(b->be, xd, &g, &W, bd, yd);
    CHECK_MSG(rc == 0, "%s: conv3d: %s", b->name, h3_last_error());
    dget(b, y, yd, sizeof(float) * (size_t)ny);
    char desc[192];
    snprintf(desc, sizeof desc, "%s %dx%dx%dx%d->%d k%dx%dx%d s%dx%dx%d", what, g.T, g.H, g.W, g.cin, g.cout, g.kt,
             g.kh, g.kw, g.st, g.sh, g.sw);
    report(b, "conv3d", desc, rel_l2(y, ref, ny), TOL_F32);
    /* The same bits again without a bias-free shortcut or state between calls. */
    dpoison(b, yd, sizeof(float) * (size_t)ny);
    rc = b->be->dec->conv3d(b->be, xd, &g, &W, bd, yd);
    dget(b, y2, yd, sizeof(float) * (size_t)ny);
    CHECK_MSG(rc == 0 && memcmp(y, y2, sizeof(float) * (size_t)ny) == 0, "%s conv3d %s: not deterministic", b->name,
              desc);
    b->be->weights->weight_free(b->be, &W);
    b->be->mem->release(b->be, xd), b->be->mem->release(b->be, bd), b->be->mem->release(b->be, yd);
    free(x), free(w), free(bias), free(ref), free(y), free(y2);
}

static void t_gn(bk *b, int frames, int64_t pixels, int C, int groups, bool silu, bool inplace)
{
    const int64_t n = frames * pixels * C;
    float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)C);
    float *bb = malloc(sizeof(float) * (size_t)C);
    for (int64_t i = 0; i < n; i++) x[i] = rnd(2.0f) + (float)(i % C % 3); /* group means away from zero */
    for (int c = 0; c < C; c++) w[c] = rnd(1.0f) + 1.0f, bb[c] = rnd(1.0f);
    double *ref = malloc(sizeof(double) * (size_t)n);
    const int cg = C / groups;
    for (int f = 0; f < frames; f++)
        for (int g = 0; g < groups; g++) {
            double m = 0, v = 0;
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) m += x[(f * pixels + p) * C + c];
            m /= (double)(pixels * cg);
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    const double d = x[(f * pixels + p) * C + c] - m;
                    v += d * d;
                }
            v /= (double)(pixels * cg);
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    const int64_t i = (f * pixels + p) * C + c;
                    const double y = (x[i] - m) / sqrt(v + 1e-6) * w[c] + bb[c];
                    ref[i] = silu ? y / (1.0 + exp(-y)) : y;
                }
        }
    float *xd = dup_host(b, x, sizeof(float) * (size_t)n), *wd = dup_host(b, w, sizeof(float) * (size_t)C);
    float *bd = dup_host(b, bb, sizeof(float) * (size_t)C), *yd = inplace ? xd : dnew(b, sizeof(float) * (size_t)n);
    if (!inplace) dpoison(b, yd, sizeof(float) * (size_t)n);
    int rc = b->be->dec->group_norm(b->be, xd, frames, pixels, C, groups, wd, bd, 1e-6f, silu, yd);
    CHECK_MSG(rc == 0, "%s: group_norm: %s", b->name, h3_last_error());
    float *y = malloc(sizeof(float) * (size_t)n);
    dget(b, y, yd, sizeof(float) * (size_t)n);
    char what[192];
    snprintf(what, sizeof what, "%d frames x %lld px x %d ch / %d groups%s%s", frames, (long long)pixels, C, groups,
             silu ? " + SiLU" : "", inplace ? " in place" : "");
    report(b, "group_norm", what, rel_l2(y, ref, n), TOL_F32);
    b->be->mem->release(b->be, xd), b->be->mem->release(b->be, wd), b->be->mem->release(b->be, bd);
    if (!inplace) b->be->mem->release(b->be, yd);
    free(x), free(w), free(bb), free(ref), free(y);
}

/* Requests the ops must refuse with a message. */
static void t_conv3d_errors(bk *b)
{
    h3_bconv3d g = {2, 1, 5, 3, 4, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 1}; /* reflect pad 1 of a 1-row frame */
    float *xd = dnew(b, sizeof(float) * 64), *yd = dnew(b, sizeof(float) * 256), w[4 * 81] = {0};
    h3_bw W;
    int rc = b->be->weights->weight_load(b->be, w, H3_DT_F32, 4, 81, &W);
    CHECK_MSG(rc == 0, "%s: weight_load: %s", b->name, h3_last_error());
    rc = b->be->dec->conv3d(b->be, xd, &g, &W, NULL, yd);
    CHECK_MSG(rc == -H3_E_INVALID && strstr(h3_last_error(), "reflect"), "%s conv3d: %d %s", b->name, rc,
              h3_last_error());
    g.H = 4, g.cin = 2; /* the weight's 81 columns are not 27 x 2 */
    rc = b->be->dec->conv3d(b->be, xd, &g, &W, NULL, yd);
    CHECK_MSG(rc == -H3_E_INVALID && strstr(h3_last_error(), "weight"), "%s conv3d: %d %s", b->name, rc,
              h3_last_error());
    rc = b->be->dec->group_norm(b->be, xd, 1, 4, 6, 4, xd, xd, 1e-6f, true, yd); /* 6 channels in 4 groups */
    CHECK_MSG(rc == -H3_E_INVALID && strstr(h3_last_error(), "groups"), "%s group_norm: %d %s", b->name, rc,
              h3_last_error());
    printf("%-5s %-13s %-52s refused with messages\n", b->name, "conv3d", "bad pads, weight shape; group count");
    b->be->weights->weight_free(b->be, &W);
    b->be->mem->release(b->be, xd), b->be->mem->release(b->be, yd);
}
/* ---- end conv3d ---- */

static void run_all(bk *b)
{
    const h3_dtype act = b->gpu ? H3_DT_BF16 : H3_DT_F32;
    printf("== %s: %s\n", b->name, b->be->desc);
    t_memory(b);

    /* linear: rows 1, 7, 333; odd widths; every weight dtype; bias; strided views. */
    const h3_dtype wdts[] = {H3_DT_F32, H3_DT_BF16, H3_DT_F16};
    for (int w = 0; w < 3; w++) {
        t_linear(b, 1, 5, 7, wdts[w], act, H3_DT_F32, true, 0, 0);
        t_linear(b, 7, 64, 130, wdts[w], act, H3_DT_F32, false, 3, 0);
        t_linear(b, 333, 130, 64, wdts[w], act, H3_DT_F32, true, 0, 2);
    }
    t_linear(b, 17, 33, 5, H3_DT_BF16, act, H3_DT_F32, true, 0, 0);
    if (b->gpu) {
        t_linear(b, 7, 64, 130, H3_DT_BF16, H3_DT_F32, H3_DT_F32, true, 1, 0);   /* f32 X: rounded inside */
        t_linear(b, 333, 130, 64, H3_DT_BF16, H3_DT_BF16, H3_DT_BF16, true, 0, 0); /* bf16 Y, f32 bias */
        t_linear(b, 333, 130, 64, H3_DT_BF16, H3_DT_BF16, H3_DT_BF16, false, 0, 3);
        t_linear(b, 1, 5, 7, H3_DT_F32, H3_DT_BF16, H3_DT_BF16, true, 0, 0);
        t_linear(b, 64, 256, 384, H3_DT_BF16, H3_DT_BF16, H3_DT_F32, true, 0, 0);
        t_linear(b, 1, 96, 1, H3_DT_F32, H3_DT_F32, H3_DT_BF16, true, 0, 0); /* K = 1 */
    }

    /* attention: L 1, 17, 300; head dims 14, 18, 64, 80, 128 (and 256); GQA; causal; Lq != Lk. */
    t_attention(b, 1, 1, 2, 1, 14, false, 0, act, false);
    t_attention(b, 17, 17, 4, 2, 64, true, 0, act, false);
    t_attention(b, 300, 300, 2, 2, 128, false, 0, act, false);
    t_attention(b, 17, 300, 4, 1, 18, false, 0, act, false);
    t_attention(b, 300, 17, 2, 2, 64, true, 0, act, false); /* queries before the first key see nothing */
    t_attention(b, 129, 257, 3, 1, 128, true, 0, act, false);
    t_attention(b, 65, 200, 2, 2, 80, false, 8, act, false);
    t_attention(b, 33, 70, 2, 1, 128, false, 3, act, false); /* odd row stride: the unaligned path */
    if (b->gpu) {
        t_attention(b, 300, 300, 2, 1, 64, false, 0, H3_DT_BF16, false);
        t_attention(b, 100, 100, 2, 1, 256, true, 0, H3_DT_BF16, false);
        t_attention(b, 130, 190, 2, 2, 128, false, 0, H3_DT_F32, false);
        t_attention(b, 47, 47, 1, 1, 14, true, 1, H3_DT_F32, false);
    }
    /* fp8 attention where the backend has it (Hopper + cuDNN); elsewhere it must refuse. */
    if (!b->be->attn_fp8_why[0]) {
        t_attention(b, 300, 300, 2, 2, 128, false, 0, H3_DT_BF16, true);
        t_attention(b, 1000, 1000, 4, 4, 64, false, 0, H3_DT_BF16, true);
        t_attention(b, 77, 77, 56, 56, 128, false, 0, H3_DT_BF16, true);
    }
    t_attention_fp8_refusals(b);

    /* norm_mod: rows 1, 7, 333; widths 5, 64, 130, and long rows (1500, 6200). */
    t_norm(b, 1, 1, 5, false, false, true, H3_DT_F32, act, 3);
    t_norm(b, 7, 7, 64, false, true, true, H3_DT_F32, act, 3);
    t_norm(b, 333, 200, 130, true, true, true, H3_DT_F32, act, 3);
    t_norm(b, 9, 9, 1500, false, true, true, H3_DT_F32, H3_DT_F32, 3);
    t_norm(b, 3, 5, 6200, true, true, true, H3_DT_F32, H3_DT_F32, 3);
    t_norm(b, 7, 7, 130, false, false, false, H3_DT_F32, act, 3); /* w = NULL */
    t_norm(b, 7, 7, 130, false, true, false, H3_DT_F32, act, 3);  /* w = NULL, modulated */
    if (b->gpu) {
        t_norm(b, 33, 33, 64, false, true, true, H3_DT_BF16, H3_DT_F32, 3);
        t_norm(b, 33, 33, 1500, true, false, true, H3_DT_F32, H3_DT_BF16, 3);
        t_norm(b, 9, 9, 64, false, true, true, H3_DT_BF16, H3_DT_BF16, 0);
    }
    /* Rows a GPU reads 4 values at a time: the transformer's width (5376) and h3-tiny's (192). */
    t_norm(b, 37, 37, 5376, false, true, true, H3_DT_F32, act, 0);
    t_norm(b, 11, 7, 192, true, true, false, H3_DT_F32, act, 0);
    t_norm(b, 5, 5, 6200, false, false, true, H3_DT_F32, H3_DT_F32, 0);
    if (b->gpu) {
    }

    /* qk_norm_rope: head dims 14, 18, 64, 128; partial and no rotation; the transformer's
       interleaved rows and the text encoder's in-place GQA heads. */
    t_qkv(b, 1, 3, 3, 14, 6, true, true, true, H3_DT_F32, act, 1);
    t_qkv(b, 17, 3, 3, 64, 30, true, true, true, H3_DT_F32, act, 1);
    t_qkv(b, 33, 2, 2, 128, 60, true, true, true, H3_DT_F32, act, 1);
    t_qkv(b, 7, 2, 2, 64, 0, false, true, true, H3_DT_F32, act, 1);
    t_qkv(b, 5, 2, 2, 18, 9, true, true, true, H3_DT_F32, H3_DT_F32, 1);
    t_qkv(b, 17, 4, 2, 64, 32, true, false, true, H3_DT_F32, H3_DT_F32, 1);
    t_qkv(b, 33, 6, 2, 128, 64, true, false, true, act, act, 1);
    t_qkv(b, 9, 4, 1, 64, 32, true, false, false, H3_DT_F32, act, 1); /* qn = kn = NULL */
    if (b->gpu) {
        t_qkv(b, 17, 3, 3, 128, 60, true, true, true, H3_DT_BF16, H3_DT_BF16, 1);
        t_qkv(b, 9, 2, 2, 64, 30, true, true, true, H3_DT_F32, H3_DT_F32, 1);
        t_qkv(b, 19, 3, 3, 128, 48, true, true, true, H3_DT_BF16, H3_DT_BF16, 0); /* the transformer's */
    }
    /* Heads a GPU warp holds in registers (2, 4, 8 values per lane), partial and full rotation. */
    t_qkv(b, 19, 3, 3, 128, 48, true, true, true, H3_DT_F32, act, 0);
    t_qkv(b, 17, 4, 2, 64, 32, true, false, true, act, act, 0);
    t_qkv(b, 9, 2, 2, 256, 64, true, true, true, H3_DT_F32, H3_DT_F32, 0);
    t_qkv(b, 9, 2, 1, 128, 64, true, false, false, H3_DT_F32, act, 0);
    if (b->gpu) {
    }

    /* The text encoder's and decoders' ops, where this backend's table has them. */
    if (h3_backend_supports(b->be, H3_OP_layernorm) && h3_backend_supports(b->be, H3_OP_copy) &&
        h3_backend_supports(b->be, H3_OP_add_div)) {
        t_layernorm(b, 1, 5, true, false);
        t_layernorm(b, 7, 64, false, true);
        t_layernorm(b, 333, 130, true, false);
        t_layernorm(b, 3, 6200, true, true);
        t_copy_add_div(b, 7, 64);
        t_copy_add_div(b, 333, 130);
        t_dcopy(b, 1);
        t_dcopy(b, 1000003);
    } else {
        printf("%-5s %-13s %-52s skipped: not in this backend's table yet\n", b->name, "layernorm", "copy, add_div");
    }

    t_gated(b, 1, 5, true, H3_DT_F32, 2);
    t_gated(b, 7, 64, false, H3_DT_F32, 2);
    t_gated(b, 333, 130, true, H3_DT_F32, 2);
    t_gated(b, 37, 5376, true, H3_DT_F32, 0);
    t_gated(b, 9, 64, false, act, 0);
    t_gated_norm(b, 37, 5376, true, true, H3_DT_F32, act, 0);
    t_gated_norm(b, 37, 5376, true, true, H3_DT_F32, act, 2);
    t_gated_norm(b, 7, 192, false, false, H3_DT_F32, H3_DT_F32, 0);
    t_gated_norm(b, 5, 130, true, true, H3_DT_F32, act, 0); /* 130: no 4-wide access */
    if (b->gpu) t_gated_norm(b, 9, 64, true, true, H3_DT_BF16, H3_DT_F32, 0);

    t_swiglu(b, 1, 5, false, act);
    t_swiglu(b, 7, 64, true, act);
    t_swiglu(b, 333, 130, false, H3_DT_F32);
    t_swiglu(b, 9, 14336 / 8, true, act); /* rows of whole 8-value groups */
    t_swiglu(b, 5, 64, true, H3_DT_F32);
    if (b->gpu) t_swiglu(b, 33, 130, true, H3_DT_F32);

    t_scatter(b, 7, 20, 5);
    t_scatter(b, 333, 400, 130);

    t_euler(b, 1);
    t_euler(b, 100003);
    t_noise(b, 5000, 42, 0, 0);
    t_noise(b, 20001, 7, 1, 123456789);

    t_knobs(b, 5);
    t_knobs(b, 100003);
    t_pairs(b, 7, 64);
    t_pairs(b, 333, 130);

    run_decoder_ops(b);

    /* The vision tower's ops, where this backend's table has them. */
    if (h3_backend_supports(b->be, H3_OP_gelu) && h3_backend_supports(b->be, H3_OP_rope)) {
        t_gelu(b, 1, 5, true, false);
        t_gelu(b, 7, 64, false, true);
        t_gelu(b, 333, 130, true, true);
        t_gelu(b, 33, 4304, false, false);
        t_rope(b, 1, 2, 16, 8);
        t_rope(b, 17, 16, 72, 36);  /* the release's tower: 16 heads of 72 */
        t_rope(b, 9, 3, 20, 6);     /* partial rotation */
    } else {
        printf("%-5s %-13s %-52s skipped: not in this backend's table yet\n", b->name, "gelu", "rope");
    }

    /* The video encoder's ops, where this backend's table has them: conv_in-like, the downsampler
       (odd sizes, bottom/right pad, all strides 2), the one-frame encoder (kt = 1), a temporal-only
       downsampler without spatial padding, and enough windows for several im2col blocks. */
    if (h3_backend_supports(b->be, H3_OP_conv3d) && h3_backend_supports(b->be, H3_OP_group_norm)) {
        t_conv3d(b, (h3_bconv3d){3, 5, 7, 3, 5, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 1}, "causal");
        t_conv3d(b, (h3_bconv3d){5, 9, 6, 13, 17, 3, 3, 3, 2, 2, 2, 2, 0, 1, 0, 1}, "down");
        t_conv3d(b, (h3_bconv3d){1, 4, 3, 20, 7, 1, 3, 3, 1, 1, 1, 0, 1, 1, 1, 1}, "2-D");
        t_conv3d(b, (h3_bconv3d){4, 5, 5, 6, 6, 3, 3, 3, 2, 1, 1, 2, 0, 0, 0, 0}, "t-down");
        t_conv3d(b, (h3_bconv3d){2, 50, 41, 40, 24, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 1}, "blocks");
        t_gn(b, 3, 37, 12, 4, true, false);
        t_gn(b, 2, 1, 30, 3, false, true);
        t_gn(b, 1, 4096, 64, 32, true, true);
        t_conv3d_errors(b);
    } else {
        printf("%-5s %-13s %-52s skipped: not in this backend's table yet\n", b->name, "conv3d", "group_norm");
    }

    t_errors(b);
}

int main(void)
{
    ctest_rng = 0x2545F4914F6CDD1Dull;
    h3_pool *pool = h3_pool_create(2);
    h3_backend *cpu = NULL;
    int rc = h3_backend_cpu_create(pool, &cpu);
    CHECK_MSG(rc == 0 && cpu, "cpu backend: %s", h3_last_error());
    if (cpu) {
        bk b = {"cpu", cpu, false};
        CHECK(cpu->act_dtype == H3_DT_F32 && strcmp(cpu->name, "cpu") == 0);
        run_all(&b);
        run_int8(&b);
        run_audio_enc_ops(&b);
        run_wstream(&b);
        run_ring_packed(&b, pool); /* skipped: no rings on the CPU */
        t_fp8_file(&b, pool); /* skipped: no fp8 GEMMs on the CPU */
        h3_backend_destroy(cpu);
    }

#ifdef UNDER_ASAN
    printf("cuda: skipped (the CUDA runtime does not run under AddressSanitizer: its device mappings collide with "
           "ASan's shadow memory)\n");
#else
    /* The build puts the library in the package folder; the test binary is elsewhere. */
    const char *lib = "python/h3ctl/libh3_cuda.so";
    if (!getenv("H3_CUDA_LIB")) {
        FILE *f = fopen(lib, "rb");
        if (f) {
            fclose(f);
            setenv("H3_CUDA_LIB", lib, 0);
        }
    }
    h3_backend *gpu = NULL;
    rc = h3_backend_cuda_open(0, NULL, &gpu);
    if (rc == 0 && gpu) {
        bk b = {"cuda", gpu, true};
        CHECK(gpu->act_dtype == H3_DT_BF16 && strcmp(gpu->name, "cuda") == 0);
        run_all(&b);
        run_wstream(&b);
        run_ring_packed(&b, pool);
        t_fp8_file(&b, pool);
        const char *bn = getenv("H3_BENCH");
        if (bn && bn[0] && strcmp(bn, "0") != 0) bench(&b);
        h3_backend_destroy(gpu);
    } else {
        printf("cuda: skipped (%s)\n", h3_last_error());
    }
#endif
#ifdef UNDER_ASAN
    printf("metal: skipped (the Metal test double's emulator switches fiber stacks, which AddressSanitizer does "
           "not follow)\n");
#else
    /* The Metal backend: on a Mac the real GPU; on Linux the build against the Metal test double
       (`make metal-double`), whose dispatches run the kernels in the MSL emulator. Its activations
       are f32 and its weights used as stored, so it is held to the CPU's tolerances. */
    const char *mlib = "python/h3ctl/libh3_metal."
#if defined(__APPLE__)
                       "dylib";
#else
                       "so";
#endif
    if (!getenv("H3_METAL_LIB")) {
        FILE *f = fopen(mlib, "rb");
        if (f) {
            fclose(f);
            setenv("H3_METAL_LIB", mlib, 0);
        }
    }
    h3_backend *mtl = NULL;
    rc = h3_backend_metal_open(&mtl);
    if (rc == 0 && mtl) {
        bk b = {"metal", mtl, false};
        CHECK(mtl->act_dtype == H3_DT_F32 && strcmp(mtl->name, "metal") == 0 && mtl->is_host);
        run_all(&b);
        run_audio_enc_ops(&b);
        /* On a Mac (tests/metal/run_mac.sh): a released-width block's attention and GEMMs, timed. */
        const char *bn = getenv("H3_BENCH");
        if (bn && bn[0] && strcmp(bn, "0") != 0) bench(&b);
        h3_backend_destroy(mtl);
    } else {
        printf("metal: skipped (%s)\n", h3_last_error());
    }
#endif
    h3_pool_destroy(pool);
    CTEST_END();
}
