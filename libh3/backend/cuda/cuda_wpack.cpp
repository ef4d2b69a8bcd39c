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
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernels/wpack.h"
#include "core/wpack.h"

namespace h3cuda {

/* The kernel of kernels/wpack.cu (cuda_kernels.h). */
H3K(k_wpack_decode_kernel, MOD_WPACK, "wpack_decode_kernel", const uint8_t *, const uint32_t *, const uint8_t *, const uint8_t *, const uint8_t *, uint32_t, uint64_t, uint16_t *);

static_assert(WP_THREADS * WP_VPT == H3_WPACK_CHUNK, "one thread block decodes one chunk");

int wpack_decode(Backend *b, CUstream st, const uint8_t *image, const h3_wpack_layout &l, uint16_t *out)
{
    if (l.chunks == 0) return 0;
    if (l.chunks > 0x7fffffffu) return fail(b, H3_E_UNSUPPORTED, "cuda: a packed weight image of %llu chunks",
                                            (unsigned long long)l.chunks);
    if (!aligned16(image) || !aligned16(out))
        return fail(b, H3_E_INVALID, "cuda: a packed weight image or its words at pointers not 16-byte aligned");
    return check_launch(b, k_wpack_decode_kernel(b, (unsigned)l.chunks, WP_THREADS, 0, st, 
        image + l.e0, reinterpret_cast<const uint32_t *>(image + l.escoff), image + l.sm, image + l.nib, image + l.esc,
        (uint32_t)l.escapes, l.n, out));
}

} /* namespace h3cuda */
