/* Kernels of cuda_attention.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "attention.h"

namespace h3cuda {

extern __shared__ __align__(16) unsigned char attn_smem[];

/* ---- PTX wrappers ------------------------------------------------------------------------ */

static __device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bypassing L1; src_bytes = 0 writes zeros (rows past the end). */
static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }

static __device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a (16x16, row) * b (16x8, col), bf16 in, f32 accumulate. */
static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two f32 -> one register of two bf16, `lo` in the low half (the lower column of a fragment). */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    bf162_t v = f2bf2(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* ---- shared-memory tiles ----------------------------------------------------------------- */

/* Element offset of 16-byte chunk `c` of row `r` in a swizzled tile of DP columns. With 8 or more
   chunks per row the chunk index is XORed with r & 7; with 4 (DP = 32, two rows per 128-byte bank
   line) with (r >> 1) & 3. Either way the 8 rows an ldmatrix phase reads hit 8 distinct 16-byte
   bank groups. */
template <int DP>
static __device__ __forceinline__ int swz(int r, int c)
{
    constexpr int CH = DP / 8;
    static_assert(CH == 4 || CH % 8 == 0, "DP must be 32 or a multiple of 64");
    if constexpr (CH >= 8)
        return r * DP + ((c ^ (r & 7)) << 3);
    else
        return r * DP + ((c ^ ((r >> 1) & 3)) << 3);
}

/* The per-lane XOR of swz for the rows a lane addresses in ldmatrix (their r & 7 is lane & 7). */
template <int DP>
static __device__ __forceinline__ int lane_xor(int lane)
{
    if constexpr (DP / 8 >= 8)
        return lane & 7;
    else
        return (lane >> 1) & 3;
}

/* ldmatrix addresses as (per-lane byte offset) ^ X + Y with X, Y compile-time constants. A lane
   reads chunk 2c + hi of its row, swizzled to (2c + hi) ^ lx = (2c) ^ (hi ^ lx): the lane's part
   (hi ^ lx) sits in bits 4-6 of its byte offset (rows are multiples of 64 bytes, so the row term
   leaves those bits clear), and chunk pair c only flips or adds constant bits. The compiler then
   keeps one base register per operand instead of one address per (c, lane), which is what keeps
   the D = 128 kernel within 255 registers. */
template <int DP>
static __device__ __forceinline__ uint32_t lane_off(int row, int hi, int lx)
{
    return (uint32_t)(row * DP * 2 + ((hi ^ lx) << 4));
}

template <int DP>
static __device__ __forceinline__ uint32_t pair_off(uint32_t lane_base, int c, int row_add)
{
    constexpr int CM = (DP / 8 >= 8 ? 8 : DP / 8) - 1; /* chunk bits the swizzle touches */
    return (lane_base ^ (uint32_t)(((2 * c) & CM) << 4)) + (uint32_t)((((2 * c) & ~CM) << 4) + row_add * DP * 2);
}

/* Rows [row0, row0 + ROWS) of one head (g points at row 0, the head's first column) into the tile
   at shared address sbase, asynchronously; rows past L (and with PAD, chunks past D: dch chunks
   are real) are zero-filled. TPR threads share a row and thread b of a row copies its chunks
   b, b + TPR, b + 2 TPR, ...: adjacent lanes copy the two halves of one 32-byte sector (full
   sectors, as a row-major assignment would give), while each thread needs one source pointer,
   one predicate and one shared offset, the rest being immediates; the swizzle of chunk TPR i + b
   is (TPR i) ^ (b ^ x), a constant XOR on the thread's offset. */
template <int ROWS, int DP, int NT, bool PAD>
static __device__ __forceinline__ void tile_async(uint32_t sbase, const bf16_t *g, int64_t ld, int row0, int L,
                                                  int dch)
{
    constexpr int CH = DP / 8;
    constexpr int TPR = NT / ROWS > 2 ? NT / ROWS : 2;
    constexpr int RPP = NT / TPR, PASSES = ROWS / RPP, CPT = CH / TPR;
    constexpr int CM = (CH >= 8 ? 8 : CH) - 1;
    static_assert(TPR <= CH && PASSES * RPP == ROWS && RPP % 8 == 0, "tile loader shape");
    const int r = (int)threadIdx.x / TPR, b = (int)threadIdx.x % TPR;
    const int x = CH >= 8 ? (r & 7) : ((r >> 1) & 3);
    const uint32_t off = (uint32_t)(r * DP * 2 + ((b ^ x) << 4));
#pragma unroll
    for (int p = 0; p < PASSES; p++) {
        const int row = row0 + p * RPP + r;
        const bool okr = row < L;
        const bf16_t *src = g + (int64_t)(okr ? row : 0) * ld + b * 8;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const bool ok = okr && (!PAD || TPR * i + b < dch);
            const uint32_t dst =
                sbase + ((off ^ (uint32_t)(((TPR * i) & CM) << 4)) + (uint32_t)((((TPR * i) & ~CM) << 4) + p * RPP * DP * 2));
            cp_async16(dst, ok ? src + TPR * 8 * i : g, ok ? 16 : 0);
        }
    }
}

/* The same with plain loads, for any D and alignment (the generic kernel's fallback). */
template <int ROWS, int DP, int NT>
static __device__ __forceinline__ void tile_sync(bf16_t *s, const bf16_t *g, int64_t ld, int row0, int L,
                                                 int D)
{
    for (int i = threadIdx.x; i < ROWS * DP; i += NT) {
        const int r = i / DP, col = i % DP;
        bf16_t v = bf16_t{0};
        if (row0 + r < L && col < D) v = g[(int64_t)(row0 + r) * ld + col];
        s[swz<DP>(r, col >> 3) + (col & 7)] = v;
    }
}

/* ---- the kernel ---------------------------------------------------------------------------- */

/* PAD: D may be smaller than DP (generic kernel): skip the k16 steps and n8 tiles of padding. */
template <int DP, int BM, int BN, int NW, bool QREG, bool CAUSAL, bool ASYNC, bool PAD, bool OBF16>
__global__ void __launch_bounds__(NW * 32, 2) flash_kernel(const AttnArgs a)
{
    constexpr int NT = NW * 32;
    constexpr int RW = BM / NW;   /* query rows per warp */
    constexpr int MT = RW / 16;   /* m16 tiles per warp */
    constexpr int NST = BN / 8;   /* n8 score tiles per warp row */
    constexpr int KS = DP / 16;   /* k16 steps over the head dim */
    constexpr int NOT = DP / 8;   /* n8 output tiles */
    static_assert(RW % 16 == 0 && BN % 16 == 0 && DP % 16 == 0, "tile shape");

    bf16_t *Qs = reinterpret_cast<bf16_t *>(attn_smem);
    bf16_t *Ks = Qs + BM * DP;
    bf16_t *Vs = Ks + BN * DP;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int q0 = blockIdx.x * BM, h = blockIdx.y, kvh = h / a.group;
    const int D = a.D, dch = D >> 3;
    const bf16_t *Qg = a.q + (int64_t)h * D;
    const bf16_t *Kg = a.k + (int64_t)kvh * D;
    const bf16_t *Vg = a.v + (int64_t)kvh * D;

    /* Keys this tile of queries can see; a causal tile stops at its last query's diagonal. */
    int kend = a.Lk;
    if (CAUSAL) kend = min(a.Lk, q0 + BM + a.off);
    const int nblk = kend > 0 ? (kend + BN - 1) / BN : 0;
    const int dsteps = PAD ? (D + 15) >> 4 : KS; /* k16 steps that hold real dims */

    float o[MT][NOT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int nt = 0; nt < NOT; nt++) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    /* Per-lane parts of the ldmatrix addresses (byte offsets within each tile). Each group of 8
       lanes addresses the 8 rows of one 8x8 matrix of an x4 load: Q as the A operand (lanes 8-15
       rows 8-15, lanes 16-31 the upper 8 dims), K as the B operand (lanes 8-15 / 24-31 the upper
       8 dims, lanes 16-31 the second n8 tile of keys), V transposed (lanes 8-15 keys 8-15, lanes
       16-31 the second n8 tile of dims). */
    const int lx = lane_xor<DP>(lane);
    const uint32_t qs_base = smem_addr(Qs), ks_base = smem_addr(Ks), vs_base = smem_addr(Vs);
    const uint32_t q_lane = lane_off<DP>(warp * RW + (lane & 15), lane >> 4, lx);
    const uint32_t k_lane = lane_off<DP>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, lx);
    const uint32_t v_lane = lane_off<DP>(lane & 15, lane >> 4, lx);

    if (nblk > 0) {
        if (ASYNC) {
            tile_async<BM, DP, NT, PAD>(qs_base, Qg, a.ldq, q0, a.Lq, dch);
            tile_async<BN, DP, NT, PAD>(ks_base, Kg, a.ldk, 0, a.Lk, dch);
        } else {
            tile_sync<BM, DP, NT>(Qs, Qg, a.ldq, q0, a.Lq, D);
            tile_sync<BN, DP, NT>(Ks, Kg, a.ldk, 0, a.Lk, D);
        }
        cp_commit();
    }

    uint32_t qf[QREG ? MT : 1][QREG ? KS : 1][4];
    if (QREG && nblk > 0) {
        cp_wait_all();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < (QREG ? MT : 0); mt++)
#pragma unroll
            for (int kk = 0; kk < (QREG ? KS : 0); kk++)
                ldsm_x4(qf[mt][kk], qs_base + pair_off<DP>(q_lane, kk, mt * 16));
    }

    for (int j = 0; j < nblk; j++) {
        const int k0 = j * BN;
        /* K of tile j has landed, and every warp is done with V of tile j - 1. */
        cp_wait_all();
        __syncthreads();
        if (ASYNC)
            tile_async<BN, DP, NT, PAD>(vs_base, Vg, a.ldv, k0, a.Lk, dch);
        else
            tile_sync<BN, DP, NT>(Vs, Vg, a.ldv, k0, a.Lk, D);
        cp_commit();

        /* S = Q K^T for this warp's rows and the tile's BN keys. */
        float s[MT][NST][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NST; nt++) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            if (PAD && kk >= dsteps) break;
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; e++) af[mt][e] = qf[QREG ? mt : 0][QREG ? kk : 0][e];
                } else {
                    ldsm_x4(af[mt], qs_base + pair_off<DP>(q_lane, kk, mt * 16));
                }
            }
#pragma unroll
            for (int np = 0; np < NST / 2; np++) {
                uint32_t bf[4];
                ldsm_x4(bf, ks_base + pair_off<DP>(k_lane, kk, np * 16));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * np], af[mt], bf[0], bf[1]);
                    mma_bf16(s[mt][2 * np + 1], af[mt], bf[2], bf[3]);
                }
            }
        }

        /* Keys past the end, and (causal) past each row's diagonal, get probability 0. */
        const bool tail = k0 + BN > a.Lk;
        const bool diag = CAUSAL && k0 + BN - 1 > q0 + a.off;
        if (tail || diag) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NST; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = k0 + nt * 8 + 2 * tq + (e & 1);
                        const int row = q0 + warp * RW + mt * 16 + g + (e >> 1) * 8;
                        if (key >= a.Lk || (CAUSAL && key > row + a.off)) s[mt][nt][e] = -INFINITY;
                    }
        }

        /* Online softmax: new running max, rescale of what was accumulated, probabilities. */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < NST; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[mt][hh], mx * a.sl2);
                /* A row that has seen no visible key yet keeps m = -inf; exponents use 0 then,
                   so its probabilities are exp2(-inf) = 0 and nothing becomes NaN. */
                const float muse = mnew == -INFINITY ? 0.0f : mnew;
                const float corr = ex2(m[mt][hh] - muse);
                m[mt][hh] = mnew;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NST; nt++) {
                    const float p0 = ex2(fmaf(s[mt][nt][2 * hh], a.sl2, -muse));
                    const float p1 = ex2(fmaf(s[mt][nt][2 * hh + 1], a.sl2, -muse));
                    s[mt][nt][2 * hh] = p0;
                    s[mt][nt][2 * hh + 1] = p1;
                    sum += p0 + p1;
                }
                l[mt][hh] = l[mt][hh] * corr + sum;
#pragma unroll
                for (int nt = 0; nt < NOT; nt++) {
                    o[mt][nt][2 * hh] *= corr;
                    o[mt][nt][2 * hh + 1] *= corr;
                }
            }

        /* V of tile j has landed, and every warp is done reading K of tile j. */
        cp_wait_all();
        __syncthreads();
        if (j + 1 < nblk) {
            if (ASYNC)
                tile_async<BN, DP, NT, PAD>(ks_base, Kg, a.ldk, k0 + BN, a.Lk, dch);
            else
                tile_sync<BN, DP, NT>(Ks, Kg, a.ldk, k0 + BN, a.Lk, D);
        }
        cp_commit();

        /* O += P V: score tiles 2kk and 2kk+1 are the A fragment of key slice kk. */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pf[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pf[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pf[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pf[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pf[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < NOT / 2; dp++) {
                if (PAD && dp >= dsteps) break;
                uint32_t vf[4];
                ldsm_x4_t(vf, vs_base + pair_off<DP>(v_lane, dp, kk * 16));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(o[mt][2 * dp], pf[mt], vf[0], vf[1]);
                    mma_bf16(o[mt][2 * dp + 1], pf[mt], vf[2], vf[3]);
                }
            }
        }
    }

    /* O = acc / l; rows that saw no key (l = 0) are written as zeros. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float lt = l[mt][hh];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
            const int row = q0 + warp * RW + mt * 16 + g + hh * 8;
            if (row >= a.Lq) continue;
            const int64_t ro = (int64_t)row * a.ldo + (int64_t)h * D;
#pragma unroll
            for (int nt = 0; nt < NOT; nt++) {
                const int col = nt * 8 + 2 * tq;
                if (col >= D) continue;
                const float v0 = o[mt][nt][2 * hh] * inv, v1 = o[mt][nt][2 * hh + 1] * inv;
                if (OBF16) {
                    bf16_t *dst = static_cast<bf16_t *>(a.o) + ro + col;
                    if (a.o_pairs)
                        *reinterpret_cast<bf162_t *>(dst) = f2bf2(v0, v1);
                    else {
                        dst[0] = f2bf(v0);
                        if (col + 1 < D) dst[1] = f2bf(v1);
                    }
                } else {
                    float *dst = static_cast<float *>(a.o) + ro + col;
                    if (a.o_pairs)
                        *reinterpret_cast<float2 *>(dst) = make_float2(v0, v1);
                    else {
                        dst[0] = v0;
                        if (col + 1 < D) dst[1] = v1;
                    }
                }
            }
        }
}

} /* namespace h3cuda */
