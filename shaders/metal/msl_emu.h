/*
 * The subset of the Metal Shading Language that the shaders/metal kernels use, modelled in C++17, and the
 * interface of the emulator that runs them (tests/metal_emu/msl_emu.cpp). With H3_MSL_EMU defined a
 * .metal file includes this header instead of <metal_stdlib> and compiles with g++ as C++; on Apple
 * the same source goes to the Metal compiler unchanged, so the kernels use only real MSL names and
 * syntax, and this header models exactly those (nothing more):
 *
 *  - scalar types uint/ushort/uchar/ulong, half (_Float16) and bfloat (MSL 3.1) as storage types (their
 *    arithmetic promotes to float here; the kernels convert them to float before computing, so the
 *    difference never shows), uint3 and ulong2;
 *  - address spaces device / constant / threadgroup / thread as plain macros (g++ has no address
 *    spaces; the kernels are written with MSL's qualifiers everywhere so the Metal compiler checks
 *    them on Apple);
 *  - threadgroup memory only through a [[threadgroup(0)]] kernel parameter (a threadgroup array
 *    declared inside a kernel would be per fiber here), and threadgroup_barrier / simdgroup_barrier;
 *  - SIMD-group functions over 32 lanes (simd_sum, simd_max, simd_shuffle, simd_shuffle_xor,
 *    simd_broadcast) and simdgroup_float8x8 (make_filled_simdgroup_matrix, simdgroup_load,
 *    simdgroup_store, simdgroup_multiply_accumulate);
 *  - the math functions the kernels call, in float.
 *
 * Semantics the emulator enforces (each breach is reported by the dispatch, never a hang): a barrier
 * completes when every thread of the threadgroup reached a barrier (a thread that returned first,
 * or one waiting at a SIMD-group function, is a deadlock); a SIMD-group function completes when
 * every lane of the simdgroup that has not returned called it, and lanes calling different ones
 * (simd_sum here, simd_max there) is an error; simdgroup matrix functions need all 32 lanes with the
 * same arguments. Calls are matched by count and function, not by source line: two different
 * barriers reached by all threads the same number of times pass here (the C++ compiler may
 * duplicate a call, so its return address cannot name the MSL call).
 */
#ifndef H3_MSL_EMU_H
#define H3_MSL_EMU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

namespace metal {

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
#ifdef H3_MSL_STRICT
/* The strict check never runs: 16-bit types stand in for half (clang has no _Float16 on every
   target) and for bfloat (a class's conversions cannot be called on a device object; clang 14 has
   no __bf16 on x86), distinct types so each instantiation stays one. */
typedef __fp16 half;
typedef short bfloat;
#else
typedef _Float16 half;

/* bfloat: the upper 16 bits of an f32; float -> bfloat rounds to nearest even (NaN stays NaN). */
struct bfloat {
    uint16_t bits;
    bfloat() = default;
    bfloat(float f)
    {
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u)
            bits = (uint16_t)((u >> 16) | 0x40u);
        else
            bits = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    operator float() const
    {
        const uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};
#endif

struct uint3 {
    uint x, y, z;
};
struct ulong2 {
    ulong x, y;
    ulong2(ulong v = 0) : x(v), y(v) {}
    ulong2(ulong a, ulong b) : x(a), y(b) {}
};

/* ---- math (float) ---- */
static inline float exp(float x) { return __builtin_expf(x); }
static inline float sqrt(float x) { return __builtin_sqrtf(x); }
static inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
static inline float tanh(float x) { return __builtin_tanhf(x); }
static inline float sin(float x) { return __builtin_sinf(x); }
static inline float cos(float x) { return __builtin_cosf(x); }
static inline float fabs(float x) { return __builtin_fabsf(x); }
static inline float abs(float x) { return __builtin_fabsf(x); }
static inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
static inline float min(float a, float b) { return __builtin_fminf(a, b); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline uint max(uint a, uint b) { return a > b ? a : b; }
static inline uint min(uint a, uint b) { return a < b ? a : b; }
static inline bool isnan(float x) { return __builtin_isnan(x); }

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

template <typename T, int Cols, int Rows> struct simdgroup_matrix {
    T e[Rows][Cols]; /* every lane holds the whole matrix; the functions keep the copies equal */
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;

} // namespace metal

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep+127f
#endif

/* ---- the emulator's runtime (tests/metal_emu/msl_emu.cpp) ---- */
namespace h3emu {

using metal::uint;
using metal::uint3;

/* The position attributes of one thread, named after their MSL attributes. */
struct ids {
    uint3 threadgroup_position_in_grid;
    uint3 thread_position_in_threadgroup;
    uint3 threads_per_threadgroup;
    uint3 thread_position_in_grid;
    uint thread_index_in_threadgroup;
    uint thread_index_in_simdgroup;
    uint simdgroup_index_in_threadgroup;
    uint threads_per_simdgroup;
    uint simdgroups_per_threadgroup;
};

enum { SIMD_WIDTH = 32 };

typedef void (*thread_fn)(void *ctx, const ids &t, void *tgmem);

/* Run grid.x * grid.y * grid.z threadgroups of tpg threads each, one threadgroup at a time in grid
   order, its threads as fibers; tgmem_bytes of threadgroup memory (filled with 0xFF bytes, so a
   read before any write shows up as NaN). Returns NULL, or what went wrong (a deadlock, divergent
   SIMD-group calls, a bad size): the dispatch stops there. */
const char *run(thread_fn fn, void *ctx, uint3 grid, uint3 tpg, size_t tgmem_bytes);

/* dispatch(grid, tpg, bytes, [&](const ids &t, void *tg) { kernel(args..., t.xxx, ...); }):
   the lambda binds the kernel's [[buffer(n)]], [[threadgroup(0)]] and position arguments. */
template <class F> const char *dispatch(uint3 grid, uint3 tpg, size_t tgmem_bytes, F &&f)
{
    struct call {
        static void fn(void *c, const ids &t, void *tg) { (*(F *)c)(t, tg); }
    };
    return run(&call::fn, (void *)&f, grid, tpg, tgmem_bytes);
}

/* A thread waits at threadgroup_barrier `site` until all threads of its group arrive. */
void barrier(const void *site);

/* One lane's part in a SIMD-group function: `in` its operand(s), `out` where its result goes. */
struct lane_slot {
    const void *in;
    void *out;
};
/* Computes every active lane's result once the last of them has arrived; active: bit per lane.
   Returns NULL or a message (which fails the dispatch). */
typedef const char *(*simd_op)(lane_slot *slots, uint32_t active);
/* Wait with the other lanes of this simdgroup; every live lane must call the same op at the same
   site. need_all: every one of the 32 lanes must be live (simdgroup matrices). */
void simd_collective(simd_op op, const void *site, const void *in, void *out, bool need_all);

/* Counters of the last run (for the emulator's own tests). */
struct stats {
    uint64_t threads, barriers, collectives, switches;
};
stats last_stats();

/* Resume runnable fibers from the last thread to the first (default: first to last). Between two
   waits a thread runs alone, so a kernel that reads another thread's threadgroup or device writes
   without a barrier sees them in one order and not in the other: running a kernel both ways and
   comparing the bits exposes the missing barrier. */
void set_reverse_order(bool on);

} // namespace h3emu

/* ---- MSL functions over the runtime ---- */
namespace metal {

#define H3EMU_SITE __builtin_return_address(0)

__attribute__((noinline)) static inline void threadgroup_barrier(mem_flags)
{
    h3emu::barrier(H3EMU_SITE);
}
/* Lanes of one simdgroup wait for each other; modelled as a collective without data. */
__attribute__((noinline)) static inline void simdgroup_barrier(mem_flags)
{
    struct op {
        static const char *f(h3emu::lane_slot *, uint32_t) { return nullptr; }
    };
    h3emu::simd_collective(&op::f, H3EMU_SITE, nullptr, nullptr, false);
}

namespace h3emu_detail {
template <typename T> struct sum_op {
    static const char *f(h3emu::lane_slot *s, uint32_t active)
    {
        T acc = T(0);
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) acc += *(const T *)s[l].in;
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) *(T *)s[l].out = acc;
        return nullptr;
    }
};
template <typename T> struct max_op {
    static const char *f(h3emu::lane_slot *s, uint32_t active)
    {
        bool any = false;
        T acc = T(0);
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) {
                const T v = *(const T *)s[l].in;
                acc = any ? max(acc, v) : v;
                any = true;
            }
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) *(T *)s[l].out = acc;
        return nullptr;
    }
};
/* in: {value, source lane} pairs; a source lane that is not active gives the reader's own value
   (undefined in MSL; the kernels never do it). */
template <typename T> struct shuffle_in {
    T v;
    uint src;
};
template <typename T> struct shuffle_op {
    static const char *f(h3emu::lane_slot *s, uint32_t active)
    {
        T got[h3emu::SIMD_WIDTH];
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) {
                const uint src = ((const shuffle_in<T> *)s[l].in)->src;
                got[l] = src < 32 && (active >> src & 1) ? ((const shuffle_in<T> *)s[src].in)->v
                                                         : ((const shuffle_in<T> *)s[l].in)->v;
            }
        for (int l = 0; l < h3emu::SIMD_WIDTH; l++)
            if (active >> l & 1) *(T *)s[l].out = got[l];
        return nullptr;
    }
};
} // namespace h3emu_detail

template <typename T> __attribute__((noinline)) T simd_sum(T x)
{
    T r;
    h3emu::simd_collective(&h3emu_detail::sum_op<T>::f, H3EMU_SITE, &x, &r, false);
    return r;
}
template <typename T> __attribute__((noinline)) T simd_max(T x)
{
    T r;
    h3emu::simd_collective(&h3emu_detail::max_op<T>::f, H3EMU_SITE, &x, &r, false);
    return r;
}
template <typename T> __attribute__((noinline)) T simd_shuffle(T x, ushort lane)
{
    h3emu_detail::shuffle_in<T> in = {x, (uint)lane};
    T r;
    h3emu::simd_collective(&h3emu_detail::shuffle_op<T>::f, H3EMU_SITE, &in, &r, false);
    return r;
}
template <typename T> __attribute__((noinline)) T simd_broadcast(T x, ushort lane)
{
    h3emu_detail::shuffle_in<T> in = {x, (uint)lane};
    T r;
    h3emu::simd_collective(&h3emu_detail::shuffle_op<T>::f, H3EMU_SITE, &in, &r, false);
    return r;
}
/* simd_shuffle_xor needs the reader's lane: the collective passes it through `in` as src. */
template <typename T> __attribute__((noinline)) T simd_shuffle_xor(T x, ushort mask);

/* ---- simdgroup matrices ---- */
template <typename T, int C, int R> simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T v)
{
    simdgroup_matrix<T, C, R> m;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) m.e[r][c] = v;
    return m;
}

namespace h3emu_detail {
/* Every lane must pass the same source, stride and transpose; lane 0's are used. */
struct mload_in {
    const volatile float *src;
    ulong epr;
    ulong2 origin;
    bool transpose;
};
inline const char *mload_f(h3emu::lane_slot *s, uint32_t)
{
    const mload_in *a = (const mload_in *)s[0].in;
    for (int l = 1; l < h3emu::SIMD_WIDTH; l++) {
        const mload_in *b = (const mload_in *)s[l].in;
        if (b->src != a->src || b->epr != a->epr || b->origin.x != a->origin.x || b->origin.y != a->origin.y ||
            b->transpose != a->transpose)
            return "simdgroup_load/store: lanes of one simdgroup passed different arguments";
    }
    simdgroup_float8x8 m;
    /* origin (x = column, y = row) of the 8x8 block within the source matrix */
    const volatile float *p = a->src + a->origin.y * a->epr + a->origin.x;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) m.e[r][c] = a->transpose ? p[c * a->epr + r] : p[r * a->epr + c];
    for (int l = 0; l < h3emu::SIMD_WIDTH; l++) *(simdgroup_float8x8 *)s[l].out = m;
    return nullptr;
}
struct mstore_in {
    const simdgroup_float8x8 *m;
    volatile float *dst;
    ulong epr;
    ulong2 origin;
    bool transpose;
};
inline const char *mstore_f(h3emu::lane_slot *s, uint32_t)
{
    const mstore_in *a = (const mstore_in *)s[0].in;
    for (int l = 1; l < h3emu::SIMD_WIDTH; l++) {
        const mstore_in *b = (const mstore_in *)s[l].in;
        if (b->dst != a->dst || b->epr != a->epr || b->origin.x != a->origin.x || b->origin.y != a->origin.y ||
            b->transpose != a->transpose || memcmp(b->m, a->m, sizeof *a->m) != 0)
            return "simdgroup_store: lanes of one simdgroup passed different arguments or matrices";
    }
    volatile float *p = a->dst + a->origin.y * a->epr + a->origin.x;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) (a->transpose ? p[c * a->epr + r] : p[r * a->epr + c]) = a->m->e[r][c];
    return nullptr;
}
struct mma_in {
    const simdgroup_float8x8 *a, *b, *c;
};
inline const char *mma_f(h3emu::lane_slot *s, uint32_t)
{
    const mma_in *x = (const mma_in *)s[0].in;
    for (int l = 1; l < h3emu::SIMD_WIDTH; l++) {
        const mma_in *y = (const mma_in *)s[l].in;
        if (memcmp(y->a, x->a, sizeof *x->a) || memcmp(y->b, x->b, sizeof *x->b) || memcmp(y->c, x->c, sizeof *x->c))
            return "simdgroup_multiply_accumulate: lanes of one simdgroup hold different matrices";
    }
    simdgroup_float8x8 d;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) {
            float acc = x->c->e[r][c];
            for (int k = 0; k < 8; k++) acc += x->a->e[r][k] * x->b->e[k][c];
            d.e[r][c] = acc;
        }
    for (int l = 0; l < h3emu::SIMD_WIDTH; l++) *(simdgroup_float8x8 *)s[l].out = d;
    return nullptr;
}
} // namespace h3emu_detail

#ifdef H3_MSL_STRICT
/* The strict check compiles, it never runs: declarations per address space, as MSL overloads them. */
#define H3EMU_AS(n) __attribute__((address_space(n)))
void simdgroup_load(simdgroup_float8x8 &d, const H3EMU_AS(1) float *src, ulong elements_per_row = 8,
                    ulong2 matrix_origin = 0, bool transpose_matrix = false);
void simdgroup_load(simdgroup_float8x8 &d, const H3EMU_AS(3) float *src, ulong elements_per_row = 8,
                    ulong2 matrix_origin = 0, bool transpose_matrix = false);
void simdgroup_store(simdgroup_float8x8 a, H3EMU_AS(1) float *dst, ulong elements_per_row = 8,
                     ulong2 matrix_origin = 0, bool transpose_matrix = false);
void simdgroup_store(simdgroup_float8x8 a, H3EMU_AS(3) float *dst, ulong elements_per_row = 8,
                     ulong2 matrix_origin = 0, bool transpose_matrix = false);
void simdgroup_multiply_accumulate(simdgroup_float8x8 &d, const simdgroup_float8x8 &a, const simdgroup_float8x8 &b,
                                   const simdgroup_float8x8 &c);
#else
__attribute__((noinline)) static inline void simdgroup_load(simdgroup_float8x8 &d, const volatile float *src,
                                                            ulong elements_per_row = 8, ulong2 matrix_origin = 0,
                                                            bool transpose_matrix = false)
{
    h3emu_detail::mload_in in = {src, elements_per_row, matrix_origin, transpose_matrix};
    h3emu::simd_collective(&h3emu_detail::mload_f, H3EMU_SITE, &in, &d, true);
}
__attribute__((noinline)) static inline void simdgroup_store(simdgroup_float8x8 a, volatile float *dst,
                                                             ulong elements_per_row = 8, ulong2 matrix_origin = 0,
                                                             bool transpose_matrix = false)
{
    h3emu_detail::mstore_in in = {&a, dst, elements_per_row, matrix_origin, transpose_matrix};
    h3emu::simd_collective(&h3emu_detail::mstore_f, H3EMU_SITE, &in, nullptr, true);
}
/* d = a * b + c */
__attribute__((noinline)) static inline void simdgroup_multiply_accumulate(simdgroup_float8x8 &d,
                                                                           const simdgroup_float8x8 &a,
                                                                           const simdgroup_float8x8 &b,
                                                                           const simdgroup_float8x8 &c)
{
    h3emu_detail::mma_in in = {&a, &b, &c};
    simdgroup_float8x8 r;
    h3emu::simd_collective(&h3emu_detail::mma_f, H3EMU_SITE, &in, &r, true);
    d = r;
}

#endif

} // namespace metal

namespace h3emu {
uint current_lane(); /* the calling fiber's thread_index_in_simdgroup */
}

namespace metal {
template <typename T> __attribute__((noinline)) T simd_shuffle_xor(T x, ushort mask)
{
    h3emu_detail::shuffle_in<T> in = {x, h3emu::current_lane() ^ (uint)mask};
    T r;
    h3emu::simd_collective(&h3emu_detail::shuffle_op<T>::f, H3EMU_SITE, &in, &r, false);
    return r;
}
} // namespace metal

/* Address spaces and function qualifiers: plain C++ here. `threadgroup` becomes `volatile`, not
   nothing, because the same word names the [[threadgroup(0)]] attribute of a kernel's threadgroup
   memory parameter: [[volatile(0)]] is still an attribute (unknown, ignored), where [[(0)]] would not
   parse. The fibers share that memory; volatile changes nothing else. */
#ifdef H3_MSL_STRICT
/* The strict check (clang, `make test-metal-strict`): device, constant and threadgroup are distinct
   address spaces, so handing a pointer of one to a parameter of another fails to compile as it
   does in MSL; thread is the default one. The build renames the [[threadgroup(0)]] attribute
   first (the macro would swallow it). */
#define device H3EMU_AS(1)
#define constant const H3EMU_AS(2)
#define threadgroup H3EMU_AS(3)
#else
#define device
#define constant const
#define threadgroup volatile
#endif
#define thread
#define kernel

#endif /* H3_MSL_EMU_H */
