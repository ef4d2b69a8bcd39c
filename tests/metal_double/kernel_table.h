/* The Metal test double's kernels: every kernel of the .metal files, compiled as C++ against
   msl_emu.h, by its host name (the generated table, gen_kernels.py), and the call that runs one in
   the fiber emulator. Only kernels_all.cpp sees the MSL model's macros; the Objective-C double sees
   the C interface at the end. */
#ifndef H3MD_KERNEL_TABLE_H
#define H3MD_KERNEL_TABLE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define H3_MSL_EMU 1
#include "../../shaders/metal/msl_emu.h"
using namespace metal;
#include "../../shaders/metal/h3_metal.h"
typedef void (*h3md_tramp)(void *const *b, const h3emu::ids &t, void *tg);
struct h3md_kernel {
    const char *name;
    h3md_tramp fn;
    uint32_t buffers; /* bit n: the kernel has a [[buffer(n)]] parameter */
    int tgmem;        /* it has a [[threadgroup(0)]] parameter */
};
extern const h3md_kernel h3md_kernels[];
extern "C" {
#endif

#define H3MD_MAX_BUFFERS 31 /* Metal's buffer argument table */

/* The kernel of that host name, or NULL. */
const void *h3md_kernel_find(const char *name);
/* Buffer indices it reads (bit n: [[buffer(n)]]), and whether it takes threadgroup memory 0. */
uint32_t h3md_kernel_buffers(const void *k);
int h3md_kernel_threadgroup(const void *k);
/* Run it over grid x tpg threadgroups with the bound pointers and threadgroup memory length;
   NULL or the emulator's message. */
const char *h3md_kernel_run(const void *k, void *const *bufs, const size_t grid[3], const size_t tpg[3],
                            size_t tg_bytes);
/* Whether the kernels were compiled for the emulator's reverse fiber order (a test switch). */
void h3md_reverse(int on);

#ifdef __cplusplus
}
#endif
#endif
