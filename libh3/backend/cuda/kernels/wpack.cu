/* Kernels of cuda_wpack.cpp (compiled at run time by NVRTC; see cuda_kernels.h). */
#include "h3k.h"
#include "wpack.h"

namespace h3cuda {

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

} /* namespace h3cuda */
