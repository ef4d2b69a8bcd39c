/*
 * The GPU decoder of packed bf16 words (core/wpack.h has the format; core/wpack.c the host packer
 * and the reference decoder): a packed weight ring (cuda_stream.cu) copies a block's whole packed
 * image into the slot's staging on its copy stream, and ring_wait runs this kernel on the compute
 * stream, writing the bf16 words the block's GEMMs then read. On the compute stream because a
 * decode queued on the copy stream waits for SMs that the GEMMs hold (cuBLAS's kernels can keep
 * every SM for milliseconds), and the next copy would wait behind it; here it adds its own
 * ~0.4 ms (0.77 GB of words written at the released widths) to the block and the copy engine
 * streams without a gap.
 *
 * One thread block of 256 threads per chunk of H3_WPACK_CHUNK = 4096 values: thread t decodes the
 * 16 values from t * 16 with one 16-byte load of sign+mantissa bytes, one 8-byte load of codes and
 * two 16-byte stores. Escaped exponents are read in value order from the chunk's escape list at
 * the thread's exclusive prefix count of code-15 nibbles (a shuffle scan in each warp, then the
 * warp totals in warp order through shared memory): integer fields only, one fixed order, so the
 * words are exactly the host's and the same on every run.
 */
#include "backend/cuda/cuda_common.cuh"
#include "core/wpack.h"

namespace h3cuda {

enum { WP_THREADS = 256, WP_VPT = 16 };
static_assert(WP_THREADS * WP_VPT == H3_WPACK_CHUNK, "one thread block decodes one chunk");

static __device__ __forceinline__ uint16_t wp_word(unsigned sm, unsigned e)
{
    return (uint16_t)(((sm >> 7) << 15) | ((e & 0xFFu) << 7) | (sm & 0x7Fu));
}

/* Chunk blockIdx.x of an image of n values: e0 / escoff its tables, sm / nib / esc its sections
   (esc_len escapes in all), all on the device. */
__global__ void __launch_bounds__(WP_THREADS)
wpack_decode_kernel(const uint8_t *__restrict__ e0, const uint32_t *__restrict__ escoff, const uint8_t *__restrict__ sm,
                    const uint8_t *__restrict__ nib, const uint8_t *__restrict__ esc, uint32_t esc_len, uint64_t n,
                    uint16_t *__restrict__ out)
{
    __shared__ uint32_t warp_total[WP_THREADS / 32];
    const uint64_t c = blockIdx.x;
    const uint64_t first = c * H3_WPACK_CHUNK + (uint64_t)threadIdx.x * WP_VPT;
    const int cnt = first >= n ? 0 : (n - first >= WP_VPT ? WP_VPT : (int)(n - first));
    uint8_t s[WP_VPT], q[WP_VPT];
    if (cnt == WP_VPT) { /* sections are 256-byte aligned, chunks a multiple of 16 */
        const uint4 sv = *reinterpret_cast<const uint4 *>(sm + first);
        const uint2 qv = *reinterpret_cast<const uint2 *>(nib + first / 2);
        const uint32_t sw[4] = {sv.x, sv.y, sv.z, sv.w}, qw[2] = {qv.x, qv.y};
#pragma unroll
        for (int k = 0; k < WP_VPT; k++) {
            s[k] = (uint8_t)(sw[k / 4] >> (8 * (k % 4)));
            q[k] = (uint8_t)((qw[k / 8] >> (4 * (k % 8))) & 0xFu);
        }
    } else {
#pragma unroll
        for (int k = 0; k < WP_VPT; k++) {
            s[k] = k < cnt ? sm[first + k] : 0;
            q[k] = k < cnt ? (uint8_t)((nib[(first + k) / 2] >> (4 * ((first + k) & 1))) & 0xFu) : 0;
        }
    }
    uint32_t mine = 0;
#pragma unroll
    for (int k = 0; k < WP_VPT; k++) mine += q[k] == 15u;
    /* Exclusive prefix of the escapes before this thread's values in the chunk. */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    uint32_t before = incl - mine;
    for (int w = 0; w < warp; w++) before += warp_total[w];
    if (!cnt) return;
    const unsigned top = e0[c];
    /* The index of this thread's first escape; an index past the escapes (only a corrupt image
       gives one) reads exponent 0 instead of memory that is not the image's. */
    uint32_t ei = escoff[c] + before;
    uint16_t v[WP_VPT];
#pragma unroll
    for (int k = 0; k < WP_VPT; k++) {
        unsigned e = top - q[k];
        if (q[k] == 15u) {
            e = ei < esc_len ? esc[ei] : 0u;
            ei++;
        }
        v[k] = wp_word(s[k], e);
    }
    uint16_t *dst = out + first;
    if (cnt == WP_VPT) {
        uint4 w[2];
        uint32_t *pw = reinterpret_cast<uint32_t *>(w);
#pragma unroll
        for (int k = 0; k < WP_VPT / 2; k++) pw[k] = (uint32_t)v[2 * k] | (uint32_t)v[2 * k + 1] << 16;
        reinterpret_cast<uint4 *>(dst)[0] = w[0];
        reinterpret_cast<uint4 *>(dst)[1] = w[1];
    } else {
        for (int k = 0; k < cnt; k++) dst[k] = v[k];
    }
}

int wpack_decode(Backend *b, cudaStream_t st, const uint8_t *image, const h3_wpack_layout &l, uint16_t *out)
{
    if (l.chunks == 0) return 0;
    if (l.chunks > 0x7fffffffu) return fail(b, H3_E_UNSUPPORTED, "cuda: a packed weight image of %llu chunks",
                                            (unsigned long long)l.chunks);
    if (!aligned16(image) || !aligned16(out))
        return fail(b, H3_E_INVALID, "cuda: a packed weight image or its words at pointers not 16-byte aligned");
    wpack_decode_kernel<<<(unsigned)l.chunks, WP_THREADS, 0, st>>>(
        image + l.e0, reinterpret_cast<const uint32_t *>(image + l.escoff), image + l.sm, image + l.nib, image + l.esc,
        (uint32_t)l.escapes, l.n, out);
    return check_launch(b, "wpack_decode_kernel");
}

} /* namespace h3cuda */
