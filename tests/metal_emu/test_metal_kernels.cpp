/*
 * Conformance of the Metal kernels (shaders/metal), run in the MSL emulator, to libh3's op
 * definitions (libh3/backend/backend.h): each kernel against a double-precision reference computed
 * here, on random inputs (never zeros, the generator and sizes of tests/c/test_backend_ops.c: odd
 * widths, 1-row and 333-row cases, strided views), with outputs poisoned (NaN bytes) before each
 * run and the padding between rows checked untouched.
 *
 * Tolerances are test_backend_ops.c's relative L2 errors: 1e-5 where every operand and output is
 * f32 (weights may be stored bf16 or f16: their values are exact in f32), 4e-3 where activations or
 * outputs are bf16 (as the CUDA backend's bf16 paths). Each kernel also gives the same bits twice.
 *
 * One line per case with the measured rel-L2; exit status 1 on any failure.
 */
#include "kernels_emu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (!e) e = emu_linear(X.p(), xdt, W.p(), wdt, bias ? bh.data() : nullptr, Y.p(), ydt, &a);
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
    if (!e) e = emu_attention(Q.p(), K.p(), V.p(), adt, O.p(), odt, &a);
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
    if (!e)
        e = emu_norm_mod(X.p(), xdt, gather ? idx.data() : nullptr, w ? wh.data() : nullptr, mod ? tab.data() : nullptr,
                         mod ? ent.data() : nullptr, Y.p(), ydt, rows_out, &a);
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

    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
