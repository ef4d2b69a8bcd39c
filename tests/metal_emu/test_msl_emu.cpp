/*
 * The MSL emulator's own checks: barrier ordering, SIMD-group function results (full and partial
 * simdgroups, lanes that returned early), simdgroup 8x8 matrices against a plain product, and that
 * broken kernels (a barrier not every thread reaches, SIMD-group calls in divergent code) are
 * reported by the dispatch instead of hanging. The kernels below are written as MSL would have them.
 */
#define H3_MSL_EMU 1
#include "../../shaders/metal/msl_emu.h"

using namespace metal;

#include <initializer_list>
#include <stdio.h>
#include <string.h>

static int checks, failures;
#define EXPECT(c, ...)                                                                                  \
    do {                                                                                               \
        checks++;                                                                                      \
        if (!(c)) {                                                                                    \
            failures++;                                                                                \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                              \
            printf(__VA_ARGS__);                                                                       \
            printf("\n");                                                                              \
        }                                                                                              \
    } while (0)

/* ---- kernels ---- */

/* Each thread writes its slot, waits, reads its neighbour's; then again in the other direction.
   log records (phase) in the order threads ran: no phase-1 entry may come before the last phase-0. */
kernel void k_barrier(device int *out, device int *log, device int *nlog, threadgroup int *tg, uint tid, uint n)
{
    tg[tid] = (int)tid * 3 + 1;
    log[(*nlog)++] = 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    log[(*nlog)++] = 1;
    const int a = tg[(tid + 1) % n];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    tg[tid] = a * 2;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = tg[(tid + n - 1) % n];
}

kernel void k_simd(device float *sum, device float *mx, device float *sx, device float *sh, device float *bc,
                   uint tid, uint lane, uint n_live)
{
    if (tid >= n_live) return; /* lanes that return early take no part */
    const float v = (float)(tid + 1);
    sum[tid] = simd_sum(v);
    mx[tid] = simd_max(lane == 3 ? 1000.0f : v);
    sx[tid] = simd_shuffle_xor(v * 10.0f, (ushort)5);
    sh[tid] = simd_shuffle(v, (ushort)((lane + 7) % 32));
    bc[tid] = simd_broadcast(v, (ushort)2);
}

/* C = A B (+ C0) with A loaded transposed from At when `tr`. */
kernel void k_mma(device const float *A, device const float *At, device const float *B, device const float *C0,
                  device float *C, bool tr)
{
    simdgroup_float8x8 a, b, c;
    if (tr)
        simdgroup_load(a, At, 8, 0, true);
    else
        simdgroup_load(a, A, 8, 0, false);
    simdgroup_load(b, B, 16, ulong2(8, 8)); /* the bottom-right block of a 16-wide matrix */
    simdgroup_load(c, C0);
    simdgroup_float8x8 d = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_multiply_accumulate(d, a, b, c);
    simdgroup_store(d, C);
}

kernel void k_divergent_barrier(device int *out, uint tid)
{
    if (tid < 16) threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = 1;
}

kernel void k_early_return_barrier(device int *out, uint tid)
{
    if (tid == 5) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[tid] = 1;
}

/* odd lanes wait at a barrier, even lanes at a SIMD-group function that needs the odd ones */
kernel void k_barrier_vs_simd(device float *out, uint tid)
{
    if (tid & 1)
        threadgroup_barrier(mem_flags::mem_threadgroup);
    else
        out[tid] = simd_sum(1.0f);
}

kernel void k_divergent_simd(device float *out, uint lane)
{
    if (lane < 8)
        out[lane] = simd_sum(1.0f);
    else
        out[lane] = simd_max(2.0f);
}

kernel void k_partial_mma(device const float *A, device float *C, uint lane)
{
    if (lane >= 16) return;
    simdgroup_float8x8 a;
    simdgroup_load(a, A);
    simdgroup_store(a, C);
}

kernel void k_nonuniform_load(device const float *A, device float *C, uint lane)
{
    simdgroup_float8x8 a;
    simdgroup_load(a, A + (lane == 9 ? 1 : 0));
    simdgroup_store(a, C);
}

/* reads a neighbour's slot without a barrier: what it sees depends on the thread order */
kernel void k_missing_barrier(device int *out, threadgroup int *tg, uint tid, uint n)
{
    tg[tid] = (int)tid;
    out[tid] = tg[(tid + 1) % n];
}

/* ---- checks ---- */

static void t_barrier()
{
    for (uint n : {1u, 32u, 40u, 1024u}) {
        static int out[1024], log[4096], nlog;
        nlog = 0;
        const char *e = h3emu::dispatch({1, 1, 1}, {n, 1, 1}, n * sizeof(int), [&](const h3emu::ids &t, void *tg) {
            k_barrier(out, log, &nlog, (int *)tg, t.thread_index_in_threadgroup, n);
        });
        EXPECT(!e, "barrier n=%u: %s", n, e ? e : "");
        bool ok = true;
        for (uint i = 0; i < n; i++) ok = ok && out[i] == ((int)i * 3 + 1) * 2;
        EXPECT(ok, "barrier n=%u: neighbour values wrong", n);
        int last0 = -1, first1 = 1 << 30;
        for (int i = 0; i < nlog; i++) {
            if (log[i] == 0) last0 = i;
            if (log[i] == 1 && i < first1) first1 = i;
        }
        EXPECT(nlog == 2 * (int)n && last0 < first1, "barrier n=%u: a thread passed the barrier early", n);
        printf("barrier        %4u threads: %llu barrier waits, %llu switches\n", n,
               (unsigned long long)h3emu::last_stats().barriers, (unsigned long long)h3emu::last_stats().switches);
    }
}

static void t_simd()
{
    for (uint n_live : {64u, 50u, 33u}) { /* 2 full simdgroups; then 18, then 1 live lane in the second */
        static float sum[64], mx[64], sx[64], sh[64], bc[64];
        for (int i = 0; i < 64; i++) sum[i] = mx[i] = sx[i] = sh[i] = bc[i] = -1.0f;
        const char *e = h3emu::dispatch({1, 1, 1}, {64, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
            k_simd(sum, mx, sx, sh, bc, t.thread_index_in_threadgroup, t.thread_index_in_simdgroup, n_live);
        });
        EXPECT(!e, "simd live %u: %s", n_live, e ? e : "");
        bool ok = true;
        for (uint i = 0; i < n_live; i++) {
            const uint sg = i / 32, lane = i % 32, base = sg * 32, live = (n_live - base) < 32 ? n_live - base : 32;
            const float want_sum = (float)(live * (2 * base + live + 1) / 2); /* (base+1) .. (base+live) */
            const bool lane3_live = live > 3;
            const float want_max = lane3_live ? 1000.0f : (float)(base + live);
            const uint xs = lane ^ 5, ss = (lane + 7) % 32;
            const float want_sx = xs < live ? (float)(base + xs + 1) * 10.0f : (float)(i + 1) * 10.0f;
            const float want_sh = ss < live ? (float)(base + ss + 1) : (float)(i + 1);
            const float want_bc = 2 < live ? (float)(base + 3) : (float)(i + 1);
            if (sum[i] != want_sum || mx[i] != want_max || (live == 32 && (sx[i] != want_sx || sh[i] != want_sh)) ||
                bc[i] != want_bc) {
                if (ok)
                    printf("  thread %u: sum %g (%g) max %g (%g) xor %g (%g) shuffle %g (%g) bcast %g (%g)\n", i,
                           sum[i], want_sum, mx[i], want_max, sx[i], want_sx, sh[i], want_sh, bc[i], want_bc);
                ok = false;
            }
        }
        for (uint i = n_live; i < 64; i++) ok = ok && sum[i] == -1.0f;
        EXPECT(ok, "simd_sum / simd_max / simd_shuffle_xor / simd_shuffle / simd_broadcast, %u live lanes", n_live);
        printf("simd functions %4u live lanes of 64: %s\n", n_live, ok ? "ok" : "WRONG");
    }
}

static void t_mma()
{
    float A[64], At[64], B[256], C0[64], C[64];
    for (int i = 0; i < 64; i++) A[i] = (float)((i * 7) % 13) - 6.0f, C0[i] = (float)(i % 5) * 0.5f;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) At[c * 8 + r] = A[r * 8 + c];
    for (int i = 0; i < 256; i++) B[i] = (float)((i * 11) % 17) - 8.0f;
    for (int tr = 0; tr < 2; tr++) {
        memset(C, 0, sizeof C);
        const char *e = h3emu::dispatch({1, 1, 1}, {32, 1, 1}, 0,
                                        [&](const h3emu::ids &, void *) { k_mma(A, At, B, C0, C, tr != 0); });
        EXPECT(!e, "mma: %s", e ? e : "");
        bool ok = true;
        for (int r = 0; r < 8; r++)
            for (int c = 0; c < 8; c++) {
                float want = C0[r * 8 + c];
                for (int k = 0; k < 8; k++) want += A[r * 8 + k] * B[(8 + k) * 16 + 8 + c];
                ok = ok && C[r * 8 + c] == want; /* small integers: exact */
            }
        EXPECT(ok, "simdgroup_multiply_accumulate%s differs from the plain product", tr ? " (transposed load)" : "");
        printf("simdgroup 8x8 multiply-accumulate%s: %s\n", tr ? ", A loaded transposed" : "", ok ? "exact" : "WRONG");
    }
}

static void t_faults()
{
    static int out[64];
    static float fo[64];
    struct {
        const char *name, *want;
        const char *e;
    } cases[6];
    cases[0] = {"barrier under if (tid < 16)", "deadlock",
                h3emu::dispatch({2, 1, 1}, {64, 1, 1}, 0,
                                [&](const h3emu::ids &t, void *) { k_divergent_barrier(out, t.thread_index_in_threadgroup); })};
    cases[1] = {"a thread returns before a barrier", "deadlock",
                h3emu::dispatch({1, 1, 1}, {64, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
                    k_early_return_barrier(out, t.thread_index_in_threadgroup);
                })};
    cases[2] = {"a barrier for odd lanes, simd_sum for even ones", "deadlock",
                h3emu::dispatch({1, 1, 1}, {64, 1, 1}, 0,
                                [&](const h3emu::ids &t, void *) { k_barrier_vs_simd(fo, t.thread_index_in_threadgroup); })};
    cases[3] = {"simd_sum / simd_max in divergent branches", "different SIMD-group functions",
                h3emu::dispatch({1, 1, 1}, {32, 1, 1}, 0,
                                [&](const h3emu::ids &t, void *) { k_divergent_simd(fo, t.thread_index_in_simdgroup); })};
    static float A[72];
    cases[4] = {"simdgroup_load with half the lanes", "needs the whole simdgroup",
                h3emu::dispatch({1, 1, 1}, {32, 1, 1}, 0,
                                [&](const h3emu::ids &t, void *) { k_partial_mma(A, fo, t.thread_index_in_simdgroup); })};
    cases[5] = {"simdgroup_load with per-lane sources", "different arguments",
                h3emu::dispatch({1, 1, 1}, {32, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
                    k_nonuniform_load(A, fo, t.thread_index_in_simdgroup);
                })};
    for (auto &c : cases) {
        EXPECT(c.e && strstr(c.e, c.want), "%s: expected an error with '%s', got %s", c.name, c.want,
               c.e ? c.e : "success");
        printf("reported: %-42s -> %s\n", c.name, c.e ? c.e : "(nothing)");
    }
    /* the emulator runs a good kernel after the failed ones */
    static float sum[64], mx[64], sx[64], sh[64], bc[64];
    const char *e = h3emu::dispatch({1, 1, 1}, {64, 1, 1}, 0, [&](const h3emu::ids &t, void *) {
        k_simd(sum, mx, sx, sh, bc, t.thread_index_in_threadgroup, t.thread_index_in_simdgroup, 64);
    });
    EXPECT(!e && sum[0] == 528.0f, "a good dispatch after the faults: %s", e ? e : "wrong sum");
    e = h3emu::dispatch({1, 1, 1}, {1025, 1, 1}, 0, [&](const h3emu::ids &, void *) {});
    EXPECT(e && strstr(e, "1024"), "1025 threads per threadgroup must be refused");
}

static void t_order()
{
    static int fwd[64], rev[64];
    for (int pass = 0; pass < 2; pass++) {
        h3emu::set_reverse_order(pass == 1);
        int *out = pass ? rev : fwd;
        const char *e = h3emu::dispatch({1, 1, 1}, {64, 1, 1}, 64 * sizeof(int), [&](const h3emu::ids &t, void *tg) {
            k_missing_barrier(out, (int *)tg, t.thread_index_in_threadgroup, 64);
        });
        EXPECT(!e, "missing barrier: %s", e ? e : "");
    }
    h3emu::set_reverse_order(false);
    /* first to last: thread 0 reads slot 1 before thread 1 wrote it (the 0xFF fill); last to first:
       it reads 1 */
    EXPECT(fwd[0] == -1 && rev[0] == 1, "a missing barrier must show as different results (%d, %d)", fwd[0], rev[0]);
    printf("missing barrier: thread 0 reads %d first to last, %d last to first\n", fwd[0], rev[0]);
}

int main()
{
    t_barrier();
    t_simd();
    t_mma();
    t_faults();
    t_order();
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
