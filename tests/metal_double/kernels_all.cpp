/* The .metal kernels compiled for the emulator, with the generated trampolines that bind their
   [[buffer(n)]] / [[threadgroup(n)]] / position parameters (kernel_table.inc), and the C interface
   the Objective-C double calls. */
#include <string.h>

#include "kernel_table.h"
#include "../../shaders/metal/h3_gemm.metal"
#include "../../shaders/metal/h3_attention.metal"
#include "../../shaders/metal/h3_rows.metal"
#include "../../shaders/metal/h3_eltwise.metal"
#include "../../shaders/metal/h3_decoders.metal"
#include "../../shaders/metal/h3_knobs.metal"
#include "kernel_table.inc"

const void *h3md_kernel_find(const char *name)
{
    for (const h3md_kernel *k = h3md_kernels; k->name; k++)
        if (!strcmp(k->name, name)) return k;
    return nullptr;
}
uint32_t h3md_kernel_buffers(const void *k) { return ((const h3md_kernel *)k)->buffers; }
int h3md_kernel_threadgroup(const void *k) { return ((const h3md_kernel *)k)->tgmem; }

const char *h3md_kernel_run(const void *kp, void *const *bufs, const size_t grid[3], const size_t tpg[3],
                            size_t tg_bytes)
{
    const h3md_kernel *k = (const h3md_kernel *)kp;
    for (int i = 0; i < 3; i++)
        if (grid[i] > 0xFFFFFFFFu || tpg[i] > 1024) return "dispatch size out of range";
    const h3emu::uint3 g = {(uint)grid[0], (uint)grid[1], (uint)grid[2]};
    const h3emu::uint3 t = {(uint)tpg[0], (uint)tpg[1], (uint)tpg[2]};
    if (!g.x || !g.y || !g.z) return nullptr; /* an empty grid runs nothing */
    return h3emu::dispatch(g, t, tg_bytes, [&](const h3emu::ids &id, void *tg) { k->fn(bufs, id, tg); });
}

void h3md_reverse(int on) { h3emu::set_reverse_order(on != 0); }
