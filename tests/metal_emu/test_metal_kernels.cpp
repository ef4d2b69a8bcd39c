/*
 * Conformance of the Metal kernels (shaders/metal), run in the MSL emulator, to libh3's op
 * definitions (libh3/backend/backend.h): each kernel against a double-precision reference computed
 * here, on random inputs (never zeros, the generator and sizes of tests/c/test_backend_ops.c: odd
 * widths, 1-row and 333-row cases, strided views), with outputs poisoned (NaN bytes) before each
 * run and the padding between rows checked untouched.
 *
 * Tolerances are test_backend_ops.c's relative L2 errors: 1e-5 where every operand and output is
 * f32 (weights may be stored bf16 or f16: their values are exact in f32), 4e-3 where activations or
 * outputs are bf16 (as the CUDA backend's bf16 paths). linear, attention, norm_mod and conv3d also
 * run a second time with the emulator resuming threads in the opposite order, and must give the
 * same bits: a read of another thread's write without a barrier between would differ.
 *
 * One line per case with the measured rel-L2; exit status 1 on any failure.
 */
#include "kernels_emu.h"

/* libh3's own step (libh3/core/schedule.c, linked in) is what euler must reproduce bit for bit; its
   error reporter is the only other symbol it needs. */
extern "C" void h3_sched_euler(float *x, const float *v, int64_t n, float t, float sigma, float sigma_next);
extern "C" int h3_err(int code, const char *fmt, ...) { (void)fmt; return -code; }

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define TOL_F32 1e-5
#define TOL_BF16 4e-3

static int checks, failures;

/* ---- the generator and rounding of test_backend_ops.c ---- */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand()
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float rnd(float scale)
{
    float v = frand();
    if (v > -1.0f / 64 && v < 1.0f / 64) v = v < 0 ? v - 1.0f / 64 : v + 1.0f / 64;
    return v * scale;
}
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double rel_l2(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static const char *dn(int dt) { return dt == EMU_BF16 ? "bf16" : dt == EMU_F16 ? "f16" : "f32"; }
static size_t esz(int dt) { return dt == EMU_F32 ? 4 : 2; }

/* A [rows][ld] matrix in a storage dtype, and the f32 values it holds. */
struct mat {
    int dt;
    int64_t rows, cols, ld;
    std::vector<unsigned char> raw;
    std::vector<float> v;
    void *p() { return raw.data(); }
    float get(int64_t i) const
    {
        if (dt == EMU_F32) {
            float f;
            memcpy(&f, raw.data() + i * 4, 4);
            return f;
        }
        uint16_t h;
        memcpy(&h, raw.data() + i * 2, 2);
        if (dt == EMU_BF16) return from_bf16(h);
        _Float16 x;
        memcpy(&x, &h, 2);
        return (float)x;
    }
    void set(int64_t i, float f)
    {
        if (dt == EMU_F32) {
            memcpy(raw.data() + i * 4, &f, 4);
        } else if (dt == EMU_BF16) {
            const uint16_t h = to_bf16(f);
            memcpy(raw.data() + i * 2, &h, 2);
        } else {
            const _Float16 x = (_Float16)f;
            memcpy(raw.data() + i * 2, &x, 2);
        }
        v[(size_t)i] = get(i);
    }
    /* the logical [rows][cols] as f32; pad_ok: the padding still holds the poison */
    std::vector<float> read(bool *pad_ok = nullptr) const
    {
        std::vector<float> out((size_t)(rows * cols));
        bool ok = true;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < ld; c++) {
                const int64_t i = r * ld + c;
                if (c < cols) {
                    out[(size_t)(r * cols + c)] = get(i);
                } else {
                    for (size_t b = 0; b < esz(dt); b++) ok = ok && raw[(size_t)i * esz(dt) + b] == 0xFF;
                }
            }
        if (pad_ok) *pad_ok = ok;
        return out;
    }
};
static mat mk(int dt, int64_t rows, int64_t cols, int64_t ld, float scale, bool fill)
{
    mat m;
    m.dt = dt, m.rows = rows, m.cols = cols, m.ld = ld;
    const size_t n = (size_t)(rows > 0 ? rows : 1) * (size_t)ld;
    m.raw.assign(n * esz(dt), 0xFF);
    m.v.assign(n, NAN);
    if (fill)
        for (size_t i = 0; i < n; i++) m.set((int64_t)i, rnd(scale));
    return m;
}
static void poison(mat &m) { memset(m.raw.data(), 0xFF, m.raw.size()); }

static void report(const char *op, const char *what, double err, double tol, const char *emu_err, bool same = true)
{
    checks++;
    const bool ok = !emu_err && err <= tol && same;
    if (emu_err)
        printf("metal %-14s %-50s emulator: %s  FAIL\n", op, what, emu_err);
    else
        printf("metal %-14s %-50s rel-L2 %.3g (tol %.0e)%s%s\n", op, what, err, tol, same ? "" : " BITS DIFFER",
               ok ? "" : "  FAIL");
    if (!ok) failures++;
}
static void expect(bool c, const char *msg)
{
    checks++;
    if (!c) {
        failures++;
        printf("FAIL: %s\n", msg);
    }
}

/* ---- linear ---- */
static void t_linear(int64_t M, int64_t N, int64_t K, int wdt, int xdt, int ydt, bool bias, int64_t xpad, int64_t ypad)
{
    mat W = mk(wdt, N, K, K, 1.0f, true);
    std::vector<float> bh((size_t)N);
    for (auto &b : bh) b = rnd(1.0f);
    mat X = mk(xdt, M, K, K + xpad, 1.0f, true), Y = mk(ydt, M, N, N + ypad, 1.0f, false);
    std::vector<double> ref((size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bh[(size_t)n] : 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)X.v[(size_t)(m * X.ld + k)] * W.v[(size_t)(n * K + k)];
            ref[(size_t)(m * N + n)] = s;
        }
    h3m_linear_args a = {(int)M, (int)N, (int)K, (int)X.ld, (int)Y.ld, bias};
    const char *e = emu_linear(X.p(), xdt, W.p(), wdt, bias ? bh.data() : nullptr, Y.p(), ydt, &a);
    bool pad_ok;
    std::vector<float> y = Y.read(&pad_ok);
    poison(Y);
    h3emu_reverse(true);
    if (!e) e = emu_linear(X.p(), xdt, W.p(), wdt, bias ? bh.data() : nullptr, Y.p(), ydt, &a);
    h3emu_reverse(false);
    const bool same = Y.read() == y;
    char what[160];
    snprintf(what, sizeof what, "%lldx%lldx%lld W %s X %s Y %s%s%s", (long long)M, (long long)N, (long long)K, dn(wdt),
             dn(xdt), dn(ydt), bias ? " +bias" : "", xpad || ypad ? " strided" : "");
    report("linear", what, rel_l2(y.data(), ref.data(), y.size()), xdt == EMU_BF16 || ydt == EMU_BF16 ? TOL_BF16 : TOL_F32,
           e, same);
    expect(pad_ok, "linear wrote past the row");
}

/* ---- attention ---- */
static void t_attention(int64_t Lq, int64_t Lk, int H, int KVH, int D, bool causal, int64_t pad, int adt, int odt)
{
    const int64_t A = (int64_t)H * D, AK = (int64_t)KVH * D;
    mat Q = mk(adt, Lq, A, A + pad, 2.0f, true), K = mk(adt, Lk, AK, AK + pad, 2.0f, true);
    mat V = mk(adt, Lk, AK, AK + pad, 1.0f, true), O = mk(odt, Lq, A, A + pad, 1.0f, false);
    const float scale = 1.0f / sqrtf((float)D);
    std::vector<double> ref((size_t)(Lq * A)), s((size_t)Lk + 1);
    for (int h = 0; h < H; h++) {
        const int kvh = h / (H / KVH);
        for (int64_t i = 0; i < Lq; i++) {
            int64_t lim = causal ? i + (Lk - Lq) + 1 : Lk;
            if (lim > Lk) lim = Lk;
            if (lim < 0) lim = 0;
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < lim; j++) {
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += (double)Q.v[(size_t)(i * Q.ld + h * D + c)] * K.v[(size_t)(j * K.ld + kvh * D + c)];
                s[(size_t)j] = d * scale;
                if (s[(size_t)j] > mx) mx = s[(size_t)j];
            }
            for (int64_t j = 0; j < lim; j++) sum += (s[(size_t)j] = exp(s[(size_t)j] - mx));
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int64_t j = 0; j < lim; j++) o += s[(size_t)j] * V.v[(size_t)(j * V.ld + kvh * D + c)];
                ref[(size_t)(i * A + h * D + c)] = lim > 0 ? o / sum : 0.0;
            }
        }
    }
    h3m_attn_args a = {(int)Lq, (int)Lk, H, KVH, D, (int)Q.ld, (int)K.ld, (int)V.ld, (int)O.ld, causal, scale};
    const char *e = emu_attention(Q.p(), K.p(), V.p(), adt, O.p(), odt, &a);
    bool pad_ok;
    std::vector<float> o = O.read(&pad_ok);
    poison(O);
    h3emu_reverse(true);
    if (!e) e = emu_attention(Q.p(), K.p(), V.p(), adt, O.p(), odt, &a);
    h3emu_reverse(false);
    const bool same = O.read() == o;
    char what[160];
    snprintf(what, sizeof what, "Lq %lld Lk %lld heads %d/%d D %d%s%s QKV %s O %s", (long long)Lq, (long long)Lk, H, KVH,
             D, causal ? " causal" : "", pad ? " strided" : "", dn(adt), dn(odt));
    report("attention", what, rel_l2(o.data(), ref.data(), o.size()),
           adt == EMU_BF16 || odt == EMU_BF16 ? TOL_BF16 : TOL_F32, e, same);
    expect(pad_ok, "attention wrote past the row");
}

/* ---- norm_mod ---- */
static void t_norm(int64_t rows_in, int64_t rows_out, int64_t n, bool gather, bool mod, bool w, int xdt, int ydt,
                   int64_t xpad)
{
    mat X = mk(xdt, rows_in, n, n + xpad, 3.0f, true), Y = mk(ydt, rows_out, n, n, 1.0f, false);
    std::vector<float> wh((size_t)n);
    for (auto &v : wh) v = rnd(1.0f) + 1.0f;
    const int entries = 3, stride = 6, slot = 3;
    std::vector<float> tab((size_t)entries * stride * (size_t)n);
    for (auto &v : tab) v = rnd(1.0f);
    std::vector<int32_t> ent((size_t)rows_in);
    for (int64_t r = 0; r < rows_in; r++) ent[(size_t)r] = (int32_t)((r * 7 + 1) % entries);
    std::vector<int64_t> idx((size_t)rows_out);
    for (int64_t k = 0; k < rows_out; k++) idx[(size_t)k] = gather ? (k * 5 + 2) % rows_in : k;
    const float eps = 1e-6f;
    std::vector<double> ref((size_t)(rows_out * n));
    for (int64_t k = 0; k < rows_out; k++) {
        const int64_t r = idx[(size_t)k];
        const float *x = X.v.data() + r * X.ld;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
        const double inv = 1.0 / sqrt(ss / (double)n + eps);
        const float *shift = tab.data() + ((int64_t)ent[(size_t)r] * stride + slot) * n;
        for (int64_t i = 0; i < n; i++) {
            double v = x[i] * inv * (w ? wh[(size_t)i] : 1.0);
            if (mod) v = v * shift[n + i] + shift[i];
            ref[(size_t)(k * n + i)] = v;
        }
    }
    h3m_norm_args a = {(int)n, (int)X.ld, (int)Y.ld, gather, w, mod, stride, slot, eps};
    const char *e = emu_norm_mod(X.p(), xdt, gather ? idx.data() : nullptr, w ? wh.data() : nullptr,
                                 mod ? tab.data() : nullptr, mod ? ent.data() : nullptr, Y.p(), ydt, rows_out, &a);
    std::vector<float> y = Y.read();
    poison(Y);
    h3emu_reverse(true);
    if (!e)
        e = emu_norm_mod(X.p(), xdt, gather ? idx.data() : nullptr, w ? wh.data() : nullptr, mod ? tab.data() : nullptr,
                         mod ? ent.data() : nullptr, Y.p(), ydt, rows_out, &a);
    h3emu_reverse(false);
    const bool same = Y.read() == y;
    char what[160];
    snprintf(what, sizeof what, "%lld->%lld rows x %lld%s%s%s x %s y %s", (long long)rows_in, (long long)rows_out,
             (long long)n, gather ? " gather" : "", mod ? " mod" : "", w ? "" : " w=NULL", dn(xdt), dn(ydt));
    report("norm_mod", what, rel_l2(y.data(), ref.data(), y.size()), xdt == EMU_BF16 || ydt == EMU_BF16 ? TOL_BF16 : TOL_F32,
           e, same);
}

/* ---- gated_add and gated_add_norm ---- */
static void t_gated(int64_t rows, int64_t n, bool mod, int ydt, int64_t xpad)
{
    mat X = mk(EMU_F32, rows, n, n + xpad, 1.0f, true), Y = mk(ydt, rows, n, n, 1.0f, true);
    const int entries = 4, stride = 6, slot = 2;
    std::vector<float> tab((size_t)entries * stride * (size_t)n);
    for (auto &v : tab) v = rnd(1.0f);
    std::vector<int32_t> ent((size_t)rows);
    for (int64_t r = 0; r < rows; r++) ent[(size_t)r] = (int32_t)((r * 3 + 2) % entries);
    std::vector<double> ref((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double g = mod ? tab[(size_t)(((int64_t)ent[(size_t)r] * stride + slot) * n + i)] : 1.0;
            ref[(size_t)(r * n + i)] = X.v[(size_t)(r * X.ld + i)] + g * Y.v[(size_t)(r * Y.ld + i)];
        }
    h3m_gate_args a = {(int)n, (int)X.ld, (int)Y.ld, 0, mod, stride, slot, 0, 0, 0, 0.0f};
    const char *e = emu_gated_add((float *)X.p(), Y.p(), ydt, mod ? tab.data() : nullptr, mod ? ent.data() : nullptr,
                                  rows, &a);
    bool pad_ok;
    std::vector<float> x = X.read(&pad_ok);
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld%s y %s%s", (long long)rows, (long long)n, mod ? " mod" : "", dn(ydt),
             xpad ? " strided" : "");
    /* padding of X holds random values, not poison: check it did not change instead */
    bool pad_same = true;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = n; c < X.ld; c++) pad_same = pad_same && X.get(r * X.ld + c) == X.v[(size_t)(r * X.ld + c)];
    (void)pad_ok;
    report("gated_add", what, rel_l2(x.data(), ref.data(), x.size()), TOL_F32, e);
    expect(pad_same, "gated_add wrote past the row");
}

static void t_gated_norm(int64_t rows, int64_t n, bool gate, bool w, int ydt, int odt, int64_t xpad)
{
    mat X = mk(EMU_F32, rows, n, n + xpad, 2.0f, true), Y = mk(ydt, rows, n, n, 2.0f, true);
    mat O = mk(odt, rows, n, n, 1.0f, false);
    const int entries = 3, stride = 6;
    std::vector<float> tab((size_t)entries * stride * (size_t)n), wh((size_t)n);
    for (auto &v : tab) v = rnd(1.0f);
    for (auto &v : wh) v = rnd(1.0f) + 1.0f;
    std::vector<int32_t> ent((size_t)rows);
    for (int64_t r = 0; r < rows; r++) ent[(size_t)r] = (int32_t)((r * 5 + 1) % entries);
    const float eps = 1e-6f;
    std::vector<double> rx((size_t)(rows * n)), ro((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++) {
        const float *g = tab.data() + ((int64_t)ent[(size_t)r] * stride + 2) * n;
        const float *sh = tab.data() + ((int64_t)ent[(size_t)r] * stride + 3) * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) {
            const float xv = (float)(X.v[(size_t)(r * X.ld + i)] + (gate ? (double)g[i] : 1.0) * Y.v[(size_t)(r * Y.ld + i)]);
            rx[(size_t)(r * n + i)] = xv;
            ss += (double)xv * xv;
        }
        const double inv = 1.0 / sqrt(ss / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            ro[(size_t)(r * n + i)] = rx[(size_t)(r * n + i)] * inv * (w ? wh[(size_t)i] : 1.0) * sh[n + i] + sh[i];
    }
    h3m_gate_args a = {(int)n, (int)X.ld, (int)Y.ld, (int)O.ld, gate, stride, 2, w, stride, 3, eps};
    const char *e = emu_gated_add_norm((float *)X.p(), Y.p(), ydt, tab.data(), ent.data(), w ? wh.data() : nullptr,
                                       tab.data(), ent.data(), O.p(), odt, rows, &a);
    std::vector<float> x = X.read(), o = O.read();
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld%s%s y %s out %s%s", (long long)rows, (long long)n, gate ? " gate" : "",
             w ? "" : " w=NULL", dn(ydt), dn(odt), xpad ? " strided" : "");
    report("gated_add_norm", what, rel_l2(x.data(), rx.data(), x.size()), TOL_F32, e);
    report("gated_add_norm", what, rel_l2(o.data(), ro.data(), o.size()), odt == EMU_BF16 ? TOL_BF16 : TOL_F32, e);
}

/* ---- qk_norm_rope ---- */
static void t_qkv(int64_t L, int H, int KVH, int D, int half, bool rope, bool interleaved, bool weights, int idt,
                  int odt, int pad)
{
    const int64_t A = (int64_t)H * D, AK = (int64_t)KVH * D;
    const int hs = interleaved ? 3 * D : D;
    mat QKV, Qm, Km, q, k, v;
    const void *qin, *kin, *vin = nullptr;
    const float *qsrc, *ksrc, *vsrc = nullptr;
    int64_t qld, kld;
    if (interleaved) {
        QKV = mk(idt, L, 3 * A, 3 * A + pad, 2.0f, true);
        qin = QKV.p(), kin = QKV.raw.data() + (size_t)D * esz(idt), vin = QKV.raw.data() + (size_t)(2 * D) * esz(idt);
        q = mk(odt, L, A, A, 1.0f, false), k = mk(odt, L, AK, AK + 5 * pad, 1.0f, false), v = mk(odt, L, AK, AK, 1.0f, false);
        qsrc = QKV.v.data(), ksrc = QKV.v.data() + D, vsrc = QKV.v.data() + 2 * D;
        qld = kld = QKV.ld;
    } else {
        Qm = mk(idt, L, A, A + 2 * pad, 2.0f, true), Km = mk(idt, L, AK, AK, 2.0f, true);
        qin = Qm.p(), kin = Km.p();
        qsrc = Qm.v.data(), ksrc = Km.v.data();
        qld = Qm.ld, kld = Km.ld;
    }
    std::vector<float> qn((size_t)D), kn((size_t)D);
    for (int i = 0; i < D; i++) qn[(size_t)i] = weights ? rnd(1.0f) + 1.0f : 1.0f, kn[(size_t)i] = weights ? rnd(1.0f) + 1.0f : 1.0f;
    const int hh = half > 0 ? half : 1;
    std::vector<float> cs((size_t)(L * hh)), sn((size_t)(L * hh));
    for (size_t i = 0; i < cs.size(); i++) {
        const float ang = rnd(3.0f);
        cs[i] = cosf(ang), sn[i] = sinf(ang);
    }
    const float eps = 1e-6f;
    std::vector<double> rq((size_t)(L * A)), rk((size_t)(L * AK)), rv((size_t)(L * AK)), t((size_t)D);
    for (int64_t r = 0; r < L; r++)
        for (int s = 0; s < 2; s++)
            for (int h = 0; h < (s ? KVH : H); h++) {
                const float *x = (s ? ksrc + r * kld : qsrc + r * qld) + (int64_t)h * hs;
                double ss = 0;
                for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
                const double inv = 1.0 / sqrt(ss / D + eps);
                for (int i = 0; i < D; i++) t[(size_t)i] = x[i] * inv * (s ? kn[(size_t)i] : qn[(size_t)i]);
                double *dst = (s ? rk.data() + r * AK : rq.data() + r * A) + (int64_t)h * D;
                for (int i = 0; i < D; i++) dst[i] = t[(size_t)i];
                if (rope)
                    for (int i = 0; i < half; i++) {
                        const double c = cs[(size_t)(r * half + i)], sv = sn[(size_t)(r * half + i)];
                        dst[i] = t[(size_t)i] * c - t[(size_t)(i + half)] * sv;
                        dst[i + half] = t[(size_t)(i + half)] * c + t[(size_t)i] * sv;
                    }
            }
    if (vsrc)
        for (int64_t r = 0; r < L; r++)
            for (int h = 0; h < KVH; h++)
                for (int i = 0; i < D; i++) rv[(size_t)(r * AK + (int64_t)h * D + i)] = vsrc[r * qld + (int64_t)h * hs + i];
    mat &qo = interleaved ? q : Qm, &ko = interleaved ? k : Km;
    h3m_qkv_args a = {H, KVH, D, half, hs, (int)qld, (int)kld, (int)qld, (int)qo.ld, (int)ko.ld,
                      interleaved ? (int)v.ld : 0, weights, weights, rope, interleaved, eps};
    const char *e = emu_qk_norm_rope(qin, kin, vin, idt, weights ? qn.data() : nullptr, weights ? kn.data() : nullptr,
                                     rope ? cs.data() : nullptr, rope ? sn.data() : nullptr, qo.p(), ko.p(),
                                     interleaved ? v.p() : nullptr, odt, L, &a);
    bool pk = true;
    std::vector<float> oq = qo.read(), ok = ko.read(interleaved ? &pk : nullptr);
    double err = rel_l2(oq.data(), rq.data(), oq.size()), e2 = rel_l2(ok.data(), rk.data(), ok.size());
    if (e2 > err) err = e2;
    if (interleaved) {
        std::vector<float> ov = v.read();
        e2 = rel_l2(ov.data(), rv.data(), ov.size());
        if (e2 > err) err = e2;
    }
    char what[160];
    snprintf(what, sizeof what, "L %lld heads %d/%d D %d rope %d %s%s in %s out %s", (long long)L, H, KVH, D,
             rope ? 2 * half : 0, interleaved ? "[q|k|v]" : "in place", weights ? "" : " qn=kn=NULL", dn(idt), dn(odt));
    report("qk_norm_rope", what, err, idt == EMU_BF16 || odt == EMU_BF16 ? TOL_BF16 : TOL_F32, e);
    expect(pk, "qk_norm_rope wrote past the row of k");
}

/* ---- rope, swiglu, gelu, mul ---- */
static void t_rope(int64_t rows, int heads, int D, int half)
{
    const int64_t C = (int64_t)heads * D, ld = 3 * C + 1;
    mat X = mk(EMU_F32, rows, 3 * C, ld, 2.0f, true);
    std::vector<float> cs((size_t)(rows * half)), sn((size_t)(rows * half));
    for (size_t i = 0; i < cs.size(); i++) {
        const double ang = rnd(3.0f);
        cs[i] = (float)cos(ang), sn[i] = (float)sin(ang);
    }
    std::vector<double> ref((size_t)(rows * 3 * C));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < 3 * C; c++) {
            const float *x = X.v.data() + r * ld;
            double v = x[c];
            const int64_t hd = c - C, d = hd % D;
            if (c >= C && c < 2 * C && d < 2 * half) {
                const double cc = cs[(size_t)(r * half + d % half)], ss = sn[(size_t)(r * half + d % half)];
                v = d < half ? x[c] * cc - x[c + half] * ss : x[c] * cc + x[c - half] * ss;
            }
            ref[(size_t)(r * 3 * C + c)] = v;
        }
    h3m_rope_args a = {heads, D, half, (int)ld};
    const char *e = emu_rope((float *)X.p() + C, cs.data(), sn.data(), rows, &a);
    std::vector<float> y = X.read();
    bool same = true;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++)
            if ((c < C || c >= 2 * C || (c - C) % D >= 2 * half) && X.get(r * ld + c) != X.v[(size_t)(r * ld + c)])
                same = false;
    char what[160];
    snprintf(what, sizeof what, "%lld rows, %d heads x %d, %d pairs, k of [q|k|v]", (long long)rows, heads, D, half);
    report("rope", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
    expect(same, "rope touched columns outside the rotated dims");
}

static void t_swiglu(int64_t rows, int64_t n, bool alias, int dt)
{
    mat GU = mk(dt, rows, 2 * n, 2 * n, 3.0f, true), O = mk(dt, rows, n, n + 1, 1.0f, false);
    std::vector<double> ref((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double g = GU.v[(size_t)(r * 2 * n + i)], u = GU.v[(size_t)(r * 2 * n + n + i)];
            ref[(size_t)(r * n + i)] = u * g / (1.0 + exp(-g));
        }
    h3m_ew_args a = {(int)n, (int)(2 * n), (int)(2 * n), alias ? (int)(2 * n) : (int)O.ld, 0};
    unsigned char *up = GU.raw.data() + (size_t)n * esz(dt);
    const char *e = emu_swiglu(GU.p(), up, alias ? GU.p() : O.p(), dt, rows, &a);
    std::vector<float> o((size_t)(rows * n));
    bool pad_ok = true;
    if (alias) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) o[(size_t)(r * n + i)] = GU.get(r * 2 * n + i);
    } else {
        o = O.read(&pad_ok);
    }
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld %s%s", (long long)rows, (long long)n, dn(dt), alias ? " out=gate" : "");
    report("swiglu", what, rel_l2(o.data(), ref.data(), o.size()), dt == EMU_BF16 ? TOL_BF16 : TOL_F32, e);
    expect(pad_ok, "swiglu wrote past the row");
}

static void t_gelu(int64_t rows, int64_t n, bool tanh_approx, bool inplace)
{
    mat X = mk(EMU_F32, rows, n, n + 1, 4.0f, true), Y = mk(EMU_F32, rows, n, n, 1.0f, false);
    std::vector<double> ref((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            const double v = X.v[(size_t)(r * X.ld + i)];
            ref[(size_t)(r * n + i)] = tanh_approx ? 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))
                                                   : 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
        }
    mat &out = inplace ? X : Y;
    h3m_ew_args a = {(int)n, (int)X.ld, 0, (int)out.ld, tanh_approx};
    const char *e = emu_gelu((const float *)X.p(), (float *)out.p(), rows, &a);
    bool pad_ok = true;
    std::vector<float> y = out.read(inplace ? nullptr : &pad_ok);
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld %s%s", (long long)rows, (long long)n, tanh_approx ? "tanh" : "erf",
             inplace ? " in place" : "");
    report("gelu", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
    expect(pad_ok, "gelu wrote past the row");
}

static void t_mul(int64_t rows, int64_t n)
{
    mat X = mk(EMU_F32, rows, n, n + 2, 2.0f, true), B = mk(EMU_F32, rows, n, n, 2.0f, true);
    mat Y = mk(EMU_F32, rows, n, n + 1, 1.0f, false);
    std::vector<double> ref((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++)
            ref[(size_t)(r * n + i)] = (double)X.v[(size_t)(r * X.ld + i)] * B.v[(size_t)(r * B.ld + i)];
    h3m_ew_args a = {(int)n, (int)X.ld, (int)B.ld, (int)Y.ld, 0};
    const char *e = emu_mul((const float *)X.p(), (const float *)B.p(), (float *)Y.p(), rows, &a);
    bool pad_ok;
    std::vector<float> y = Y.read(&pad_ok);
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld strided", (long long)rows, (long long)n);
    report("mul", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
    expect(pad_ok, "mul wrote past the row");
}

/* ---- the decoders' ops ---- */

/* conv_gemm: linear over windows of k * cin floats, `ld` apart (ld = cin: overlapping). */
static void t_conv_gemm(int64_t M, int cin, int cout, int k, int64_t ld, int wdt, bool bias)
{
    const int64_t K = (int64_t)k * cin, nx = (M - 1) * ld + K;
    mat X = mk(EMU_F32, 1, nx, nx, 1.0f, true), W = mk(wdt, cout, K, K, 0.5f, true);
    std::vector<float> bh((size_t)cout);
    for (auto &b : bh) b = rnd(1.0f);
    mat Y = mk(EMU_F32, M, cout, cout + 2, 1.0f, false);
    std::vector<double> ref((size_t)(M * cout));
    for (int64_t m = 0; m < M; m++)
        for (int o = 0; o < cout; o++) {
            double s = bias ? bh[(size_t)o] : 0.0;
            for (int64_t i = 0; i < K; i++) s += (double)X.v[(size_t)(m * ld + i)] * W.v[(size_t)(o * K + i)];
            ref[(size_t)(m * cout + o)] = s;
        }
    h3m_linear_args a = {(int)M, cout, (int)K, (int)ld, (int)Y.ld, bias};
    const char *e = emu_linear(X.p(), EMU_F32, W.p(), wdt, bias ? bh.data() : nullptr, Y.p(), EMU_F32, &a);
    bool pad_ok;
    std::vector<float> y = Y.read(&pad_ok);
    char what[160];
    snprintf(what, sizeof what, "%lld rows, %d -> %d, kernel %d, row stride %lld, W %s%s", (long long)M, cin, cout, k,
             (long long)ld, dn(wdt), bias ? " +bias" : "");
    report("conv_gemm", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
    expect(pad_ok, "conv_gemm wrote past the row");
}

static int len3(int n, int pad, int k, int s) { return n + pad < k || s < 1 ? 0 : (n + pad - k) / s + 1; }
static int refl(int i, int n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; }

/* {T, H, W, cin, cout, kt, kh, kw, st, sh, sw, pad_t, pad_top, pad_bottom, pad_left, pad_right}, as in
   test_backend_ops.c */
static void t_conv3d(const int gg[16], const char *name)
{
    h3m_conv3d_args g = {gg[0], gg[1], gg[2], gg[3], gg[4], gg[5], gg[6], gg[7], gg[8], gg[9], gg[10], gg[11], gg[12],
                         gg[14], 0, 0, 0, 1};
    g.To = len3(g.T, g.pad_t, g.kt, g.st), g.Ho = len3(g.H, gg[12] + gg[13], g.kh, g.sh);
    g.Wo = len3(g.W, gg[14] + gg[15], g.kw, g.sw);
    const int64_t nx = (int64_t)g.T * g.H * g.W * g.cin, K = (int64_t)g.kt * g.kh * g.kw * g.cin;
    const int64_t M = (int64_t)g.To * g.Ho * g.Wo, ny = M * g.cout;
    std::vector<float> x((size_t)nx), w((size_t)(K * g.cout)), bias((size_t)g.cout), y((size_t)ny, NAN);
    for (auto &v : x) v = rnd(1.0f);
    for (auto &v : w) v = rnd(1.0f) / (float)sqrt((double)K);
    for (auto &v : bias) v = rnd(0.5f);
    std::vector<double> ref((size_t)ny);
    for (int64_t m = 0; m < M; m++) {
        const int to = (int)(m / ((int64_t)g.Ho * g.Wo)), yo = (int)(m / g.Wo % g.Ho), xo = (int)(m % g.Wo);
        for (int o = 0; o < g.cout; o++) {
            double s = bias[(size_t)o];
            for (int dt = 0; dt < g.kt; dt++) {
                const int ti = to * g.st + dt - g.pad_t;
                if (ti < 0) continue;
                for (int dy = 0; dy < g.kh; dy++)
                    for (int dx = 0; dx < g.kw; dx++) {
                        const int yi = refl(yo * g.sh + dy - g.pad_top, g.H), xi = refl(xo * g.sw + dx - g.pad_left, g.W);
                        const float *xp = x.data() + (((int64_t)ti * g.H + yi) * g.W + xi) * g.cin;
                        const float *wp = w.data() + (int64_t)o * K + (((int64_t)dt * g.kh + dy) * g.kw + dx) * g.cin;
                        for (int c = 0; c < g.cin; c++) s += (double)wp[c] * xp[c];
                    }
            }
            ref[(size_t)(m * g.cout + o)] = s;
        }
    }
    const char *e = emu_conv3d(x.data(), w.data(), bias.data(), y.data(), &g);
    std::vector<float> y1 = y;
    std::fill(y.begin(), y.end(), NAN);
    h3emu_reverse(true);
    if (!e) e = emu_conv3d(x.data(), w.data(), bias.data(), y.data(), &g);
    h3emu_reverse(false);
    char what[160];
    snprintf(what, sizeof what, "%s %dx%dx%dx%d->%d k%dx%dx%d s%dx%dx%d", name, g.T, g.H, g.W, g.cin, g.cout, g.kt, g.kh,
             g.kw, g.st, g.sh, g.sw);
    report("conv3d", what, rel_l2(y1.data(), ref.data(), y1.size()), TOL_F32, e, y == y1);
}

/* snake (aa = false) and snake_aa into a phased destination; the rows outside the data must be 0. */
static void t_snake(int64_t L, int C, int d, int64_t margin, bool aa)
{
    std::vector<float> a((size_t)C), rb((size_t)C), fup(12), fdn(12);
    for (int c = 0; c < C; c++) {
        if (aa)
            a[(size_t)c] = 0.5f + fabsf(rnd(2.0f)), rb[(size_t)c] = 0.2f + fabsf(rnd(1.0f));
        else
            a[(size_t)c] = 0.3f + fabsf(rnd(2.0f)), rb[(size_t)c] = 1.0f / (a[(size_t)c] + 1e-9f);
    }
    for (int k = 0; k < 12; k++) fup[(size_t)k] = rnd(0.3f), fdn[(size_t)k] = rnd(0.3f);
    mat X = mk(EMU_F32, L, C, C, 2.0f, true);
    const int64_t phase_rows = (L + d - 1) / d + margin + 2, n = (int64_t)d * phase_rows * C;
    std::vector<float> dst((size_t)n, NAN);
    std::vector<double> ref((size_t)n, 0.0);
    if (aa) {
        const int64_t NZ = 2 * L;
        std::vector<double> z((size_t)(NZ * C));
        for (int64_t t = 0; t < NZ; t++) {
            const int par = (int)((t + 15) & 1);
            const int64_t s0 = (t + 15 - par) / 2 - 5;
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int j = 0; j < 6; j++) {
                    int64_t r = s0 - j;
                    r = r < 0 ? 0 : (r > L - 1 ? L - 1 : r);
                    acc += (double)X.v[(size_t)(r * C + c)] * fup[(size_t)(par + 2 * j)];
                }
                const double u = 2.0 * acc, s = sin((double)a[(size_t)c] * u);
                z[(size_t)(t * C + c)] = u + (double)rb[(size_t)c] * s * s;
            }
        }
        for (int64_t m = 0; m < L; m++)
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int k = 0; k < 12; k++) {
                    int64_t t = 2 * m + k - 5;
                    t = t < 0 ? 0 : (t > NZ - 1 ? NZ - 1 : t);
                    acc += z[(size_t)(t * C + c)] * fdn[(size_t)k];
                }
                ref[(size_t)(((m % d) * phase_rows + margin + m / d) * C + c)] = acc;
            }
    } else {
        for (int64_t m = 0; m < L; m++)
            for (int c = 0; c < C; c++) {
                const double x = X.v[(size_t)(m * C + c)], s = sin((double)a[(size_t)c] * x);
                ref[(size_t)(((m % d) * phase_rows + margin + m / d) * C + c)] = x + (double)rb[(size_t)c] * s * s;
            }
    }
    h3m_phased_args p = {(int)L, C, d, (int)phase_rows, (int)margin, aa};
    const char *e = emu_snake((const float *)X.p(), a.data(), rb.data(), fup.data(), fdn.data(), dst.data(), &p);
    bool zeros = true;
    for (int r = 0; r < d; r++) {
        const int64_t rows = r < L ? (L - r + d - 1) / d : 0;
        for (int64_t q = 0; q < phase_rows; q++)
            if (q < margin || q >= margin + rows)
                for (int c = 0; c < C; c++) zeros = zeros && dst[(size_t)((r * phase_rows + q) * C + c)] == 0.0f;
    }
    char what[160];
    snprintf(what, sizeof what, "L %lld, C %d, %d phase%s, margin %lld", (long long)L, C, d, d == 1 ? "" : "s",
             (long long)margin);
    report(aa ? "snake_aa" : "snake", what, rel_l2(dst.data(), ref.data(), dst.size()), TOL_F32, e);
    expect(zeros, "snake: margins or phase tails are not zero");
}

static void t_conv1_clamp(int64_t M, int cin, int k)
{
    const int64_t K = (int64_t)k * cin, nx = (M - 1) * cin + K, nan_at = nx / 2;
    std::vector<float> x((size_t)nx), w((size_t)K), y((size_t)M, 12345.0f);
    for (auto &v : x) v = rnd(1.0f);
    for (auto &v : w) v = rnd(0.6f);
    x[(size_t)nan_at] = NAN;
    h3m_conv1_args a = {(int)M, (int)K, cin};
    const char *e = emu_conv1_clamp(x.data(), w.data(), y.data(), &a);
    std::vector<float> yf;
    std::vector<double> ref;
    bool nan_ok = true;
    for (int64_t m = 0; m < M; m++) {
        if (nan_at >= m * cin && nan_at < m * cin + K) {
            nan_ok = nan_ok && isnan(y[(size_t)m]);
            continue;
        }
        double s = 0;
        for (int64_t i = 0; i < K; i++) s += (double)x[(size_t)(m * cin + i)] * w[(size_t)i];
        ref.push_back(s < -1 ? -1 : (s > 1 ? 1 : s));
        yf.push_back(y[(size_t)m]);
    }
    char what[160];
    snprintf(what, sizeof what, "%lld rows, %d channels, kernel %d, one NaN", (long long)M, cin, k);
    report("conv1_clamp", what, rel_l2(yf.data(), ref.data(), yf.size()), TOL_F32, e);
    expect(nan_ok, "conv1_clamp: NaN did not pass through");
}

static void t_layernorm(int64_t rows, int64_t n, bool affine, bool inplace)
{
    mat X = mk(EMU_F32, rows, n, n + 1, 3.0f, true), Y = mk(EMU_F32, rows, n, n, 1.0f, false);
    for (int64_t r = 0; r < rows; r++) X.set(r * X.ld, X.v[(size_t)(r * X.ld)] + 2.0f); /* a non-zero mean */
    std::vector<float> w((size_t)n), bb((size_t)n);
    for (int64_t i = 0; i < n; i++) w[(size_t)i] = rnd(1.0f) + 1.0f, bb[(size_t)i] = rnd(1.0f);
    std::vector<double> ref((size_t)(rows * n));
    for (int64_t r = 0; r < rows; r++) {
        const float *x = X.v.data() + r * X.ld;
        double m = 0, var = 0;
        for (int64_t i = 0; i < n; i++) m += x[i];
        m /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - m) * (x[i] - m);
        var /= (double)n;
        for (int64_t i = 0; i < n; i++)
            ref[(size_t)(r * n + i)] = (x[i] - m) / sqrt(var + 1e-5) * (affine ? w[(size_t)i] : 1.0) + (affine ? bb[(size_t)i] : 0.0);
    }
    mat &out = inplace ? X : Y;
    h3m_ln_args a = {(int)n, (int)X.ld, (int)out.ld, affine, affine, 1e-5f};
    const char *e = emu_layernorm((const float *)X.p(), affine ? w.data() : nullptr, affine ? bb.data() : nullptr,
                                  (float *)out.p(), rows, &a);
    std::vector<float> y = out.read();
    char what[160];
    snprintf(what, sizeof what, "%lld x %lld%s%s", (long long)rows, (long long)n, affine ? " w, b" : "",
             inplace ? " in place" : "");
    report("layernorm", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
}

static void t_gn(int frames, int64_t pixels, int C, int groups, bool silu, bool inplace)
{
    const int64_t n = frames * pixels * C;
    std::vector<float> x((size_t)n), w((size_t)C), bb((size_t)C), y((size_t)n, NAN);
    for (int64_t i = 0; i < n; i++) x[(size_t)i] = rnd(2.0f) + (float)(i % C % 3);
    for (int c = 0; c < C; c++) w[(size_t)c] = rnd(1.0f) + 1.0f, bb[(size_t)c] = rnd(1.0f);
    std::vector<double> ref((size_t)n);
    const int cg = C / groups;
    for (int f = 0; f < frames; f++)
        for (int g = 0; g < groups; g++) {
            double m = 0, v = 0;
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) m += x[(size_t)((f * pixels + p) * C + c)];
            m /= (double)(pixels * cg);
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    const double d = x[(size_t)((f * pixels + p) * C + c)] - m;
                    v += d * d;
                }
            v /= (double)(pixels * cg);
            for (int64_t p = 0; p < pixels; p++)
                for (int c = g * cg; c < (g + 1) * cg; c++) {
                    const int64_t i = (f * pixels + p) * C + c;
                    const double o = (x[(size_t)i] - m) / sqrt(v + 1e-6) * w[(size_t)c] + bb[(size_t)c];
                    ref[(size_t)i] = silu ? o / (1.0 + exp(-o)) : o;
                }
        }
    h3m_gn_args a = {(int)pixels, C, groups, silu, 1e-6f};
    float *out = inplace ? x.data() : y.data();
    const char *e = emu_group_norm(x.data(), w.data(), bb.data(), out, frames, &a);
    char what[160];
    snprintf(what, sizeof what, "%d frames x %lld px x %d ch / %d groups%s%s", frames, (long long)pixels, C, groups,
             silu ? " + SiLU" : "", inplace ? " in place" : "");
    report("group_norm", what, rel_l2(out, ref.data(), (size_t)n), TOL_F32, e);
}

/* ---- the step and the speed knobs: the CPU's bits (euler against libh3's function; the others against
   the CPU's statements, libh3/backend/cpu/cpu_knobs.c and cpu_vae.c, replicated here) ---- */
static void report_bits(const char *op, const char *what, bool same, const char *e)
{
    checks++;
    const bool ok = !e && same;
    if (e)
        printf("metal %-14s %-50s emulator: %s  FAIL\n", op, what, e);
    else
        printf("metal %-14s %-50s %s\n", op, what, same ? "bit-identical" : "BITS DIFFER  FAIL");
    if (!ok) failures++;
}

static void t_knobs(int64_t n)
{
    std::vector<float> x((size_t)n), v((size_t)n), b((size_t)n), want((size_t)n), got((size_t)n);
    for (int64_t i = 0; i < n; i++) x[(size_t)i] = rnd(2.0f), v[(size_t)i] = rnd(1.5f), b[(size_t)i] = rnd(2.0f);
    char what[96];
    snprintf(what, sizeof what, "%lld values", (long long)n);
    /* euler: libh3's h3_sched_euler itself */
    const float t = 0.6180339f, sigma = 0.7316f, sigma_next = 0.4129f;
    {
        want = x;
        h3_sched_euler(want.data(), v.data(), n, t, sigma, sigma_next);
        got = x;
        h3m_knob_args a = {(int)n, 0, 0.0f, t, sigma, sigma_next};
        const char *e = emu_euler(got.data(), v.data(), &a);
        report_bits("euler", what, got == want, e);
    }
    /* extrapolate out = a + r (a - b), in place over a; then without b (a copy) */
    {
        const float r = 0.37f;
        for (int64_t i = 0; i < n; i++) {
            const float d = x[(size_t)i] - b[(size_t)i], p = r * d;
            want[(size_t)i] = x[(size_t)i] + p;
        }
        got = x;
        h3m_knob_args a = {(int)n, 1, r, 0, 0, 0};
        const char *e = emu_extrapolate(got.data(), got.data(), b.data(), &a);
        report_bits("extrapolate", what, got == want, e);
        std::vector<float> cp((size_t)n, NAN);
        a.has_b = 0;
        e = emu_extrapolate(cp.data(), x.data(), nullptr, &a);
        report_bits("extrapolate", "copy (b = NULL)", cp == x, e);
        for (int64_t i = 0; i < n; i++) want[(size_t)i] = x[(size_t)i] - b[(size_t)i];
        got = b;
        e = emu_sub(got.data(), x.data(), got.data(), &a); /* out = b */
        report_bits("sub", what, got == want, e);
    }
}

static void t_rowops(int64_t rows, int64_t n)
{
    const int64_t ld = n + 3, full_rows = 2 * rows + 1;
    mat S = mk(EMU_F32, full_rows, n, ld, 1.5f, true);
    /* pairs over a permutation of the full rows: (2j, 2j+1) mostly, every fifth a single row */
    std::vector<int64_t> pairs((size_t)(2 * rows));
    std::vector<int64_t> perm((size_t)full_rows);
    for (int64_t i = 0; i < full_rows; i++) perm[(size_t)i] = (i * 7 + 3) % full_rows; /* 7 and 2 rows + 1 coprime? checked below */
    std::vector<bool> used((size_t)full_rows, false);
    for (int64_t i = 0; i < full_rows; i++) used[(size_t)perm[(size_t)i]] = true;
    bool perm_ok = true;
    for (bool u : used) perm_ok = perm_ok && u;
    if (!perm_ok)
        for (int64_t i = 0; i < full_rows; i++) perm[(size_t)i] = i;
    for (int64_t j = 0; j < rows; j++) {
        pairs[(size_t)(2 * j)] = perm[(size_t)(2 * j)];
        pairs[(size_t)(2 * j + 1)] = j % 5 == 4 ? -1 : perm[(size_t)(2 * j + 1)];
    }
    const float *sv = S.v.data();
    char what[96];
    snprintf(what, sizeof what, "%lld pairs x %lld, strided", (long long)rows, (long long)n);
    /* pool */
    std::vector<float> pooled((size_t)(rows * n)), got((size_t)(rows * (n + 1)), NAN);
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t p0 = pairs[(size_t)(2 * j)], p1 = pairs[(size_t)(2 * j + 1)];
            if (p1 < 0) {
                pooled[(size_t)(j * n + i)] = sv[p0 * ld + i];
            } else {
                const float s = sv[p0 * ld + i] + sv[p1 * ld + i];
                pooled[(size_t)(j * n + i)] = s * 0.5f;
            }
        }
    h3m_rowop_args a = {(int)n, (int)ld, 0, (int)(n + 1), 0.0f};
    const char *e = emu_pool_pairs(sv, pairs.data(), got.data(), rows, &a);
    bool same = true;
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < n; i++) same = same && got[(size_t)(j * (n + 1) + i)] == pooled[(size_t)(j * n + i)];
    for (int64_t j = 0; j < rows; j++) same = same && isnan(got[(size_t)(j * (n + 1) + n)]);
    report_bits("pool_pairs", what, same, e);
    /* unpool: red = pooled + noise, base = pooled */
    std::vector<float> red((size_t)(rows * n)), full(S.v.begin(), S.v.end()), fwant = full;
    for (size_t i = 0; i < red.size(); i++) red[i] = pooled[i] + rnd(0.1f);
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t p0 = pairs[(size_t)(2 * j)], p1 = pairs[(size_t)(2 * j + 1)];
            const float y = red[(size_t)(j * n + i)];
            if (p1 < 0) {
                fwant[(size_t)(p0 * ld + i)] = y;
            } else {
                const float d = y - pooled[(size_t)(j * n + i)];
                fwant[(size_t)(p0 * ld + i)] = fwant[(size_t)(p0 * ld + i)] + d;
                fwant[(size_t)(p1 * ld + i)] = fwant[(size_t)(p1 * ld + i)] + d;
            }
        }
    h3m_rowop_args u = {(int)n, (int)n, (int)n, (int)ld, 0.0f};
    e = emu_unpool_pairs(red.data(), pooled.data(), pairs.data(), full.data(), rows, &u);
    same = true;
    for (size_t i = 0; i < full.size(); i++) same = same && (full[i] == fwant[i] || (isnan(full[i]) && isnan(fwant[i])));
    report_bits("unpool_pairs", what, same, e);
    /* scatter_rows, copy, add_div */
    std::vector<float> dst((size_t)(full_rows * ld), NAN), dwant = dst;
    std::vector<int64_t> idx((size_t)rows);
    for (int64_t j = 0; j < rows; j++) idx[(size_t)j] = perm[(size_t)j];
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < n; i++) dwant[(size_t)(idx[(size_t)j] * ld + i)] = red[(size_t)(j * n + i)];
    h3m_rowop_args c = {(int)n, (int)n, 0, (int)ld, 0.0f};
    e = emu_scatter_rows(red.data(), idx.data(), dst.data(), rows, &c);
    same = true;
    for (size_t i = 0; i < dst.size(); i++) same = same && (dst[i] == dwant[i] || (isnan(dst[i]) && isnan(dwant[i])));
    report_bits("scatter_rows", what, same, e);
    std::vector<float> cp((size_t)(rows * ld), NAN);
    e = emu_scatter_rows(red.data(), nullptr, cp.data(), rows, &c);
    same = true;
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < ld; i++)
            same = same && (i < n ? cp[(size_t)(j * ld + i)] == red[(size_t)(j * n + i)] : isnan(cp[(size_t)(j * ld + i)]));
    report_bits("copy", what, same, e);
    std::vector<float> y = cp, ywant = cp;
    for (int64_t j = 0; j < rows; j++)
        for (int64_t i = 0; i < n; i++) {
            const float s = ywant[(size_t)(j * ld + i)] + pooled[(size_t)(j * n + i)];
            ywant[(size_t)(j * ld + i)] = s / 3.0f;
        }
    h3m_rowop_args ad = {(int)n, (int)n, 0, (int)ld, 3.0f};
    e = emu_add_div(y.data(), pooled.data(), rows, &ad);
    same = true;
    for (size_t i = 0; i < y.size(); i++) same = same && (y[i] == ywant[i] || (isnan(y[i]) && isnan(ywant[i])));
    report_bits("add_div", what, same, e);
}

static void t_head_pool(int64_t rows, int heads, int D, int out, int64_t xpad)
{
    mat X = mk(EMU_F32, rows, (int64_t)heads * D, (int64_t)heads * D + xpad, 1.0f, true);
    mat Y = mk(EMU_F32, rows, out, out, 1.0f, false);
    std::vector<double> ref((size_t)(rows * out)), mean((size_t)D);
    for (int64_t r = 0; r < rows; r++) {
        for (int i = 0; i < D; i++) {
            double s = 0;
            for (int h = 0; h < heads; h++) s += X.v[(size_t)(r * X.ld + (int64_t)h * D + i)];
            mean[(size_t)i] = s / heads;
        }
        for (int o = 0; o < out; o++) {
            const int s0 = (int)floor((double)o * D / out), e0 = (int)ceil((double)(o + 1) * D / out);
            double s = 0;
            for (int i = s0; i < e0; i++) s += mean[(size_t)i];
            ref[(size_t)(r * out + o)] = s / (e0 - s0);
        }
    }
    h3m_head_pool_args a = {heads, D, out, (int)X.ld, (int)Y.ld};
    const char *e = emu_head_pool((const float *)X.p(), (float *)Y.p(), rows, &a);
    std::vector<float> y = Y.read();
    char what[160];
    snprintf(what, sizeof what, "%lld rows, %d heads x %d -> %d, row pad %lld", (long long)rows, heads, D, out,
             (long long)xpad);
    report("head_pool", what, rel_l2(y.data(), ref.data(), y.size()), TOL_F32, e);
}

static void t_channels_last(int C, int T, int nt, int t_avail, int ny, int nx, bool audio_layout)
{
    const int64_t rs = audio_layout ? 0 : nx + 2, ts = audio_layout ? 1 : ny * rs + 1, cs = audio_layout ? T : T * ts + 3;
    std::vector<float> x((size_t)(C * cs + 8)), sc((size_t)C), sh((size_t)C);
    for (auto &v : x) v = rnd(2.0f);
    for (int c = 0; c < C; c++) sc[(size_t)c] = 0.5f + fabsf(rnd(1.5f)), sh[(size_t)c] = rnd(0.5f);
    const int64_t rows = (int64_t)nt * ny * nx;
    mat Y = mk(EMU_F32, rows, C, C + 3, 1.0f, false);
    std::vector<float> want((size_t)(rows * C));
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = r / ((int64_t)ny * nx), i = (r / nx) % ny, j = r % nx;
        if (t > t_avail - 1) t = t_avail - 1;
        for (int c = 0; c < C; c++) {
            const float p = x[(size_t)(c * cs + t * ts + i * rs + j)] * sc[(size_t)c];
            want[(size_t)(r * C + c)] = p + sh[(size_t)c];
        }
    }
    h3m_cl_args a = {C, (int)cs, (int)ts, (int)rs, nt, t_avail, ny, nx, (int)Y.ld};
    const char *e = emu_channels_last(x.data(), sc.data(), sh.data(), (float *)Y.p(), &a);
    bool pad_ok;
    std::vector<float> y = Y.read(&pad_ok);
    char what[160];
    snprintf(what, sizeof what, "C %d, %d of %d frames, %d x %d%s", C, t_avail, nt, ny, nx,
             audio_layout ? " (audio layout)" : " strided");
    report_bits("channels_last", what, pad_ok && y == want, e);
}

static void t_unpatchify(int64_t tok0, int64_t rows, int gh, int gw, int C, int pt, int ps)
{
    const int cols = C * pt * ps * ps;
    const int nt = (int)((tok0 + rows + (int64_t)gh * gw - 1) / ((int64_t)gh * gw));
    std::vector<int32_t> fmap((size_t)(nt * pt));
    int frames = 0;
    for (int f = 0; f < nt * pt; f++) fmap[(size_t)f] = f % 3 == 1 ? -1 : frames++;
    mat S = mk(EMU_F32, rows, cols, cols + 5, 1.0f, true);
    const int64_t th = (int64_t)gh * ps, tw = (int64_t)gw * ps, nd = (int64_t)frames * C * th * tw;
    std::vector<uint32_t> dst((size_t)(nd + 1), 0xFFFFFFFFu), want = dst;
    for (int64_t i = 0; i < rows; i++) {
        const int64_t tok = tok0 + i, t = tok / ((int64_t)gh * gw), yy = (tok / gw) % gh, xx = tok % gw;
        for (int c = 0; c < C; c++)
            for (int a = 0; a < pt; a++) {
                const int f = fmap[(size_t)(t * pt + a)];
                if (f < 0) continue;
                for (int by = 0; by < ps; by++)
                    for (int bx = 0; bx < ps; bx++)
                        memcpy(&want[(size_t)((((int64_t)f * C + c) * th + yy * ps + by) * tw + xx * ps + bx)],
                               &S.v[(size_t)(i * S.ld + ((c * pt + a) * ps + by) * ps + bx)], 4);
            }
    }
    h3m_unpatch_args a = {(int)tok0, gh, gw, C, pt, ps, (int)S.ld};
    const char *e = emu_unpatchify((const float *)S.p(), fmap.data(), (float *)dst.data(), rows, &a);
    char what[160];
    snprintf(what, sizeof what, "tokens %lld+%lld of %d x %d, C %d, pt %d, ps %d", (long long)tok0, (long long)rows, gh,
             gw, C, pt, ps);
    report_bits("unpatchify", what, dst == want, e);
}

/* abs_diff_sum: to double precision (the CPU's test holds every backend to 1e-12), the same bits
   in either thread order. Values of mixed magnitudes, so f32 sums would be off by far more. */
static void t_abs_diff_sum(int64_t n)
{
    std::vector<float> x((size_t)n), b((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const float m = i % 3 == 0 ? 1000.0f : (i % 3 == 1 ? 1.0f : 1e-3f);
        b[(size_t)i] = rnd(m), x[(size_t)i] = b[(size_t)i] + rnd(m * 1e-3f);
    }
    long double rd = 0, rr = 0;
    for (int64_t i = 0; i < n; i++) {
        rd += fabsl((long double)x[(size_t)i] - (long double)b[(size_t)i]);
        rr += fabsl((long double)b[(size_t)i]);
    }
    double d1, r1, d2, r2;
    const char *e = emu_abs_diff_sum(x.data(), b.data(), n, &d1, &r1);
    h3emu_reverse(true);
    if (!e) e = emu_abs_diff_sum(x.data(), b.data(), n, &d2, &r2);
    h3emu_reverse(false);
    const double ed = fabs((double)((d1 - rd) / rd)), er = fabs((double)((r1 - rr) / rr));
    char what[96];
    snprintf(what, sizeof what, "%lld values (diff and ref sums)", (long long)n);
    report("abs_diff_sum", what, ed > er ? ed : er, 1e-12, e, !e && d1 == d2 && r1 == r2);
    /* what a plain f32 sum would give, to show the bound is not met by accident */
    float fd = 0;
    for (int64_t i = 0; i < n; i++) fd += fabsf(x[(size_t)i] - b[(size_t)i]);
    printf("      (a plain f32 sum of the differences is off by %.3g)\n", fabs((double)((fd - rd) / rd)));
}

/* vae_stitch: test_backend_ops.c's case - a 13 x 17 canvas in 2 x 2 tiles of 9 x 11 (overlaps 5)
   over three windows of keep0 = 5 own frames and keep1 = 3 shared (blend_t = 2), 16 frames kept:
   every path of the blend. The reference re-derives the blend on the host with the same rounding;
   pixels and rgb are compared byte for byte. */
enum { VS_C = 3, VS_TH = 9, VS_TW = 11, VS_H = 13, VS_W = 17, VS_K0 = 5, VS_K1 = 3, VS_BT = 2, VS_WIN = 3,
       VS_F = VS_WIN * VS_K0 + VS_K1 - 2, VS_OV = 5, VS_K = VS_K0 + VS_K1 };
static const float vs_mean[3] = {0.485f, 0.456f, 0.406f}, vs_std[3] = {0.229f, 0.224f, 0.225f};
static float vs_fade(float a, float v, float p)
{
    const float wa = 1.0f - p;
    const float s = a * wa;
    const float t = v * p;
    return s + t;
}
static void vs_reference(std::vector<float> (&tiles)[VS_WIN][2][2], std::vector<float> &out)
{
    const int y0[2] = {0, VS_TH - VS_OV}, x0[2] = {0, VS_TW - VS_OV};
    std::vector<float> carry((size_t)VS_K1 * VS_C * VS_H * VS_W);
    for (int w = 0; w < VS_WIN; w++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                const float *t = tiles[w][i][j].data();
                const int own_h = i == 0 ? VS_TH - VS_OV : VS_TH, own_w = j == 0 ? VS_TW - VS_OV : VS_TW;
                for (int k = 0; k < VS_K; k++)
                    for (int c = 0; c < VS_C; c++)
                        for (int ry = 0; ry < own_h; ry++)
                            for (int x = 0; x < own_w; x++) {
                                float v = t[((k * VS_C + c) * VS_TH + ry) * VS_TW + x];
                                if (i > 0 && ry < VS_OV)
                                    v = vs_fade(tiles[w][0][j][(size_t)(((k * VS_C + c) * VS_TH + VS_TH - VS_OV + ry) * VS_TW + x)],
                                                v, (float)ry / (float)VS_OV);
                                if (j > 0 && x < VS_OV)
                                    v = vs_fade(tiles[w][i][0][(size_t)(((k * VS_C + c) * VS_TH + ry) * VS_TW + VS_TW - VS_OV + x)],
                                                v, (float)x / (float)VS_OV);
                                const int64_t pix = (int64_t)(y0[i] + ry) * VS_W + x0[j] + x;
                                float *cv = carry.data() + (int64_t)c * VS_H * VS_W + pix;
                                if (k < VS_K0) {
                                    if (w > 0 && k < VS_BT)
                                        v = vs_fade(cv[(int64_t)(VS_K1 - VS_BT + k) * VS_C * VS_H * VS_W], v,
                                                    (float)k / (float)VS_BT);
                                } else if (w < VS_WIN - 1) {
                                    cv[(int64_t)(k - VS_K0) * VS_C * VS_H * VS_W] = v;
                                    continue;
                                }
                                const int g = w * VS_K0 + k;
                                if (g < VS_F) out[(size_t)(((int64_t)g * VS_C + c) * VS_H * VS_W + pix)] = v;
                            }
            }
}

static void t_vae_stitch(bool raw)
{
    const int y0[2] = {0, VS_TH - VS_OV}, x0[2] = {0, VS_TW - VS_OV};
    const size_t tile_n = (size_t)VS_K * VS_C * VS_TH * VS_TW;
    std::vector<float> tiles[VS_WIN][2][2];
    for (int w = 0; w < VS_WIN; w++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                tiles[w][i][j].resize(tile_n);
                for (auto &v : tiles[w][i][j]) v = rnd(3.0f); /* some pixels clamp */
            }
    const int64_t canvas = (int64_t)VS_F * VS_C * VS_H * VS_W;
    std::vector<float> blend((size_t)canvas), want_px((size_t)canvas);
    std::vector<uint8_t> want_rgb((size_t)canvas);
    vs_reference(tiles, blend);
    for (int g = 0; g < VS_F; g++)
        for (int c = 0; c < VS_C; c++)
            for (int64_t p = 0; p < VS_H * VS_W; p++) {
                const float v = blend[(size_t)(((int64_t)g * VS_C + c) * VS_H * VS_W + p)];
                float f = v * vs_std[c];
                f = f + vs_mean[c];
                f = f < 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f);
                const int64_t hwc = ((int64_t)g * VS_H * VS_W + p) * VS_C + c;
                if (raw)
                    want_px[(size_t)(((int64_t)c * VS_F + g) * VS_H * VS_W + p)] = v;
                else
                    want_px[(size_t)hwc] = f;
                want_rgb[(size_t)hwc] = (uint8_t)lrintf(f * 255.0f); /* round half to even, as numpy */
            }
    std::vector<float> above((size_t)2 * VS_K * VS_C * VS_OV * VS_TW, NAN), left((size_t)VS_K * VS_C * VS_TH * VS_OV, NAN);
    std::vector<float> carry((size_t)VS_K1 * VS_C * VS_H * VS_W, NAN), px((size_t)canvas);
    std::vector<uint8_t> rgb((size_t)canvas, 0xAB);
    memset(px.data(), 0xFF, sizeof(float) * px.size());
    const char *e = nullptr;
    for (int w = 0; w < VS_WIN && !e; w++)
        for (int i = 0; i < 2 && !e; i++)
            for (int j = 0; j < 2 && !e; j++) {
                h3m_stitch_args s = {VS_C, VS_K, VS_K0, VS_K1, VS_BT, VS_TH, VS_TW, VS_OV, VS_OV, VS_H, VS_W, VS_F,
                                     w, VS_WIN, y0[i], x0[j], 0, 0, i ? VS_OV : 0, j ? VS_OV : 0, i ? 0 : VS_OV,
                                     j ? 0 : VS_OV, j, 0, raw, 1, 1};
                s.own_h = s.th - s.ov_bottom, s.own_w = s.tw - s.ov_right;
                h3emu_reverse(((w + i + j) & 1) != 0); /* half the tiles in the other thread order */
                e = emu_vae_stitch(tiles[w][i][j].data(), above.data(), left.data(), carry.data(), rgb.data(),
                                   px.data(), vs_mean, vs_std, &s);
            }
    h3emu_reverse(false);
    char what[160];
    snprintf(what, sizeof what, "2 x 2 tiles, 3 windows, %s pixels + rgb", raw ? "raw" : "[0, 1]");
    report_bits("vae_stitch", what,
                memcmp(px.data(), want_px.data(), sizeof(float) * px.size()) == 0 && rgb == want_rgb, e);
}

/* linear over int8 weights, quantised here as tests/c/backend_ops_int8.inc specifies (per row
   s = max|w| / 127, q = w / s to nearest even): against a double reference over the dequantised
   weights (float)q * s, and the same bits as the f32 linear over those weights (the contract). */
static void t_linear_q8(int64_t M, int64_t N, int64_t K, int xdt, int ydt, bool bias)
{
    std::vector<float> w((size_t)(N * K)), s((size_t)N), deq((size_t)(N * K)), bh((size_t)N);
    std::vector<int8_t> q((size_t)(N * K));
    for (int64_t r = 0; r < N; r++) {
        const float mag = ldexpf(1.0f, (int)(r % 7) - 3); /* row magnitudes 2^-3 .. 2^3 */
        for (int64_t k = 0; k < K; k++) w[(size_t)(r * K + k)] = rnd(mag);
    }
    for (int64_t r = 0; r < N; r++) {
        float m = 0.0f;
        for (int64_t k = 0; k < K; k++) m = fmaxf(m, fabsf(w[(size_t)(r * K + k)]));
        s[(size_t)r] = m / 127.0f;
        for (int64_t k = 0; k < K; k++) {
            float t = s[(size_t)r] > 0.0f ? w[(size_t)(r * K + k)] / s[(size_t)r] : 0.0f;
            t = nearbyintf(t);
            q[(size_t)(r * K + k)] = (int8_t)(t < -127.0f ? -127.0f : t > 127.0f ? 127.0f : t);
            deq[(size_t)(r * K + k)] = (float)q[(size_t)(r * K + k)] * s[(size_t)r];
        }
    }
    for (auto &b : bh) b = rnd(1.0f);
    mat X = mk(xdt, M, K, K + 1, 1.0f, true), Y = mk(ydt, M, N, N, 1.0f, false), Y2 = mk(ydt, M, N, N, 1.0f, false);
    std::vector<double> ref((size_t)(M * N));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = bias ? bh[(size_t)n] : 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)X.v[(size_t)(m * X.ld + k)] * deq[(size_t)(n * K + k)];
            ref[(size_t)(m * N + n)] = acc;
        }
    h3m_linear_args a = {(int)M, (int)N, (int)K, (int)X.ld, (int)Y.ld, bias};
    const char *e = emu_linear_q8(X.p(), xdt, q.data(), s.data(), bias ? bh.data() : nullptr, Y.p(), ydt, &a);
    if (!e) e = emu_linear(X.p(), xdt, deq.data(), EMU_F32, bias ? bh.data() : nullptr, Y2.p(), ydt, &a);
    std::vector<float> y = Y.read();
    char what[160];
    snprintf(what, sizeof what, "%lldx%lldx%lld W int8 X %s Y %s%s", (long long)M, (long long)N, (long long)K, dn(xdt),
             dn(ydt), bias ? " +bias" : "");
    report("linear_q8", what, rel_l2(y.data(), ref.data(), y.size()),
           xdt == EMU_BF16 || ydt == EMU_BF16 ? TOL_BF16 : TOL_F32, e, Y.raw == Y2.raw);
}

int main()
{
    const int F = EMU_F32, B = EMU_BF16;
    /* linear: rows 1, 7, 333; odd widths; every weight dtype; bias; strided views; bf16 activations
       and outputs as a GPU backend feeds them. */
    for (int wdt : {EMU_F32, EMU_BF16, EMU_F16}) {
        t_linear(1, 5, 7, wdt, F, F, true, 0, 0);
        t_linear(7, 64, 130, wdt, F, F, false, 3, 0);
        t_linear(333, 130, 64, wdt, F, F, true, 0, 2);
        t_linear(7, 64, 130, wdt, B, F, true, 0, 0);
    }
    t_linear(17, 33, 5, EMU_BF16, F, F, true, 0, 0);
    t_linear(333, 130, 64, EMU_BF16, B, B, true, 0, 0);
    t_linear(333, 130, 64, EMU_BF16, B, B, false, 0, 3);
    t_linear(1, 5, 7, EMU_F32, B, B, true, 0, 0);
    t_linear(64, 256, 384, EMU_BF16, B, F, true, 0, 0);
    t_linear(1, 96, 1, EMU_F32, F, B, true, 0, 0); /* K = 1 */
    t_linear_q8(1, 5, 7, F, F, true);
    t_linear_q8(7, 64, 130, F, F, false);
    t_linear_q8(333, 130, 300, F, F, true);
    t_linear_q8(17, 33, 5, B, B, true);

    /* attention: L 1, 17, 300; head dims 14, 18, 64, 80, 128, 256; GQA; causal; Lq != Lk. */
    for (int adt : {F, B}) {
        t_attention(1, 1, 2, 1, 14, false, 0, adt, adt);
        t_attention(17, 17, 4, 2, 64, true, 0, adt, adt);
        t_attention(300, 300, 2, 2, 128, false, 0, adt, adt);
        t_attention(17, 300, 4, 1, 18, false, 0, adt, adt);
        t_attention(300, 17, 2, 2, 64, true, 0, adt, adt); /* queries before the first key see nothing */
        t_attention(129, 257, 3, 1, 128, true, 0, adt, adt);
        t_attention(65, 200, 2, 2, 80, false, 8, adt, adt);
        t_attention(33, 70, 2, 1, 128, false, 3, adt, adt);
    }
    t_attention(100, 100, 2, 1, 256, true, 0, B, B);
    t_attention(130, 190, 2, 2, 128, false, 0, B, F);
    t_attention(47, 47, 1, 1, 14, true, 1, F, F);

    /* norm_mod: rows 1, 7, 333; widths 5, 64, 130, 192, 1500, 5376, 6200. */
    for (int ydt : {F, B}) {
        t_norm(1, 1, 5, false, false, true, F, ydt, 3);
        t_norm(7, 7, 64, false, true, true, F, ydt, 3);
        t_norm(333, 200, 130, true, true, true, F, ydt, 3);
        t_norm(7, 7, 130, false, false, false, F, ydt, 3);
        t_norm(7, 7, 130, false, true, false, F, ydt, 3);
        t_norm(37, 37, 5376, false, true, true, F, ydt, 0);
        t_norm(11, 7, 192, true, true, false, F, ydt, 0);
    }
    t_norm(9, 9, 1500, false, true, true, F, F, 3);
    t_norm(3, 5, 6200, true, true, true, F, F, 3);
    t_norm(5, 5, 6200, false, false, true, F, F, 0);
    t_norm(33, 33, 64, false, true, true, B, F, 3);
    t_norm(9, 9, 64, false, true, true, B, B, 0);

    /* qk_norm_rope: head dims 14, 18, 64, 128, 256; partial and no rotation; interleaved and in place. */
    for (int odt : {F, B}) {
        t_qkv(1, 3, 3, 14, 6, true, true, true, F, odt, 1);
        t_qkv(17, 3, 3, 64, 30, true, true, true, F, odt, 1);
        t_qkv(33, 2, 2, 128, 60, true, true, true, F, odt, 1);
        t_qkv(7, 2, 2, 64, 0, false, true, true, F, odt, 1);
        t_qkv(9, 4, 1, 64, 32, true, false, false, F, F, 1);
        t_qkv(19, 3, 3, 128, 48, true, true, true, F, odt, 0);
        t_qkv(9, 2, 1, 128, 64, true, false, false, F, F, 0);
    }
    t_qkv(5, 2, 2, 18, 9, true, true, true, F, F, 1);
    t_qkv(17, 4, 2, 64, 32, true, false, true, F, F, 1);
    t_qkv(33, 6, 2, 128, 64, true, false, true, B, B, 1);
    t_qkv(17, 3, 3, 128, 60, true, true, true, B, B, 1);
    t_qkv(9, 2, 2, 256, 64, true, true, true, F, F, 0);

    t_gated(1, 5, true, F, 2);
    t_gated(7, 64, false, F, 2);
    t_gated(333, 130, true, F, 2);
    t_gated(37, 5376, true, F, 0);
    t_gated(9, 64, false, B, 0);
    t_gated_norm(37, 5376, true, true, F, F, 0);
    t_gated_norm(37, 5376, true, true, F, B, 2);
    t_gated_norm(7, 192, false, false, F, F, 0);
    t_gated_norm(5, 130, true, true, F, F, 0);
    t_gated_norm(9, 64, true, true, B, F, 0);

    t_swiglu(1, 5, false, F);
    t_swiglu(7, 64, true, F);
    t_swiglu(333, 130, false, F);
    t_swiglu(9, 14336 / 8, true, F);
    t_swiglu(7, 64, true, B);
    t_swiglu(33, 130, false, B);

    t_gelu(1, 5, true, false);
    t_gelu(7, 64, false, true);
    t_gelu(333, 130, true, true);
    t_gelu(33, 4304, false, false);
    t_mul(7, 64);
    t_mul(333, 130);
    t_rope(1, 2, 16, 8);
    t_rope(17, 16, 72, 36);
    t_rope(9, 3, 20, 6);

    /* the decoders' ops: conv_gemm's windows (overlapping, 1x1, rows apart, past a tile), conv3d's
       geometries (causal, strided down, 2-D, temporal-only, several tiles), the activations into
       phased buffers, conv_post, the norms */
    for (int wdt : {EMU_F32, EMU_BF16}) {
        t_conv_gemm(1, 4, 5, 3, 4, wdt, true);
        t_conv_gemm(37, 8, 16, 7, 8, wdt, true);
        t_conv_gemm(333, 13, 6, 5, 13, wdt, false);
        t_conv_gemm(129, 32, 64, 1, 32, wdt, true);
        t_conv_gemm(50, 12, 9, 3, 40, wdt, true);
        t_conv_gemm(700, 64, 32, 9, 64, wdt, true);
    }
    {
        const int g1[16] = {3, 5, 7, 3, 5, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 1}, g2[16] = {5, 9, 6, 13, 17, 3, 3, 3, 2, 2, 2, 2, 0, 1, 0, 1};
        const int g3[16] = {1, 4, 3, 20, 7, 1, 3, 3, 1, 1, 1, 0, 1, 1, 1, 1}, g4[16] = {4, 5, 5, 6, 6, 3, 3, 3, 2, 1, 1, 2, 0, 0, 0, 0};
        const int g5[16] = {2, 50, 41, 40, 24, 3, 3, 3, 1, 1, 1, 2, 1, 1, 1, 1};
        t_conv3d(g1, "causal");
        t_conv3d(g2, "down");
        t_conv3d(g3, "2-D");
        t_conv3d(g4, "t-down");
        t_conv3d(g5, "blocks");
    }
    t_snake(1, 3, 1, 3, true);
    t_snake(5, 8, 2, 1, true);
    t_snake(300, 13, 3, 5, true);
    t_snake(257, 40, 1, 0, true);
    t_snake(1000, 64, 5, 2, true);
    t_snake(1, 1, 1, 3, false);
    t_snake(37, 13, 1, 0, false);
    t_snake(101, 11, 3, 9, false);
    t_snake(29, 8, 9, 3, false);
    t_conv1_clamp(1, 8, 7);
    t_conv1_clamp(500, 8, 7);
    t_conv1_clamp(77, 3, 5);
    t_layernorm(1, 5, true, false);
    t_layernorm(7, 64, false, true);
    t_layernorm(333, 130, true, false);
    t_layernorm(3, 6200, true, true);
    t_gn(3, 37, 12, 4, true, false);
    t_gn(2, 1, 30, 3, false, true);
    t_gn(1, 4096, 64, 32, true, true);

    t_knobs(1);
    t_knobs(100003);
    t_abs_diff_sum(5);
    t_abs_diff_sum(100003);
    t_rowops(7, 64);
    t_rowops(333, 130);
    t_head_pool(1, 1, 5, 5, 0);
    t_head_pool(13, 8, 64, 32, 3); /* the release's runs of 8 (256 -> 32) at a smaller width */
    t_head_pool(7, 3, 7, 3, 0);    /* windows overlap: 7 -> 3 */
    t_head_pool(5, 2, 5, 7, 1);    /* more outputs than inputs */
    t_head_pool(33, 3, 40, 7, 1);
    t_channels_last(5, 4, 6, 4, 3, 7, false);
    t_channels_last(24, 3, 3, 3, 16, 16, false);
    t_channels_last(32, 41, 41, 41, 1, 1, true);
    t_unpatchify(0, 24, 2, 3, 3, 4, 2);
    t_unpatchify(5, 37, 3, 5, 3, 2, 4);
    t_unpatchify(0, 12, 4, 3, 5, 1, 3);
    t_vae_stitch(false);
    t_vae_stitch(true);

    /* long sequences: 20,000 query rows are 5,000 query blocks of one dispatch */
    t_attention(20000, 33, 1, 1, 16, false, 0, F, F);

    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
