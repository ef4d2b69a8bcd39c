/*
 * The Metal backend's shared state (Objective-C, manual reference counting: it builds with Apple's
 * clang on Darwin and with GNU Objective-C on Linux, which has neither ARC nor blocks).
 *
 * Memory is Apple silicon's unified memory: every allocation is a shared-storage MTLBuffer whose
 * contents pointer is what the ops take, and weights are no-copy buffers over the mapped
 * safetensors (is_host). An op maps each pointer back to (buffer, offset) through the regions
 * below. Ops are encoded into one open command buffer (one compute encoder) and run in issue
 * order; sync, download, upload and the few ops that hand results to the host end it, commit it
 * and wait, so the host never reads or writes memory the GPU may still touch.
 */
#ifndef H3_METAL_INTERNAL_H
#define H3_METAL_INTERNAL_H

#if defined(__APPLE__)
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#else
#import "backend/metal/metal_api.h"
#endif

#include "backend/backend.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define MTL_MAX_PIPES 96

typedef struct mtl_region {
    char *base;
    size_t len;
    id<MTLBuffer> buf;
} mtl_region;

typedef struct mtl_be {
    h3_backend base;
    h3_backend_host host;
    id<MTLDevice> dev;
    id<MTLCommandQueue> queue;
    id<MTLLibrary> lib;
    id<MTLBuffer> dummy; /* bound to a kernel's unused [[buffer(n)]] (validation wants one bound) */
    struct {
        char *name;
        id<MTLComputePipelineState> ps;
    } pipes[MTL_MAX_PIPES];
    int npipes;
    /* the open command buffer and its compute encoder (nil: none), the command buffers committed
       since the last wait, and the temporary buffers their commands use */
    id<MTLCommandBuffer> cb;
    id<MTLComputeCommandEncoder> enc;
    NSMutableArray *inflight;
    NSMutableArray *temps;
    int dispatches;
    /* allocations (sorted by base, disjoint) and weight views (may overlap: two weights in a page) */
    mtl_region *reg;
    int nreg, capreg;
    mtl_region *wreg;
    int nwreg, capwreg;
    uint64_t peak;
    size_t page;
    char gpu[96];
    int family; /* the newest Apple GPU family it supports (7 = M1, 8 = M2, 9 = M3/M4) */
} mtl_be;

static inline mtl_be *mtl_of(h3_backend *be) { return (mtl_be *)be; }

/* Errors through the host's callback (the library cannot see libh3's h3_err). */
int mtl_err(mtl_be *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* (buffer, offset) of backend memory p (an allocation or a weight view); `what` names the operand
   in the error. */
int mtl_lookup(mtl_be *b, const void *p, const char *op, const char *what, id<MTLBuffer> *buf, NSUInteger *off);
/* A temporary buffer holding a copy of `bytes` of host memory, alive until the work that uses it
   has run (channels_last's latents and statistics). */
int mtl_temp_copy(mtl_be *b, const void *host, size_t bytes, const char *op, id<MTLBuffer> *buf);
/* A temporary no-copy buffer over host memory the kernel writes (vae_stitch's rgb and pixels):
   the pages around [p, p + bytes), and p's offset in them. */
int mtl_temp_wrap(mtl_be *b, void *p, size_t bytes, const char *op, id<MTLBuffer> *buf, NSUInteger *off);
/* End the open command buffer, commit it, wait for everything committed, report a failure. */
int mtl_flush(mtl_be *b);

/* One argument of a dispatch: backend memory (p, NULL for an unused one), host memory copied now
   (host, bytes: the kernels' argument blocks), or a buffer already resolved. */
typedef struct mtl_arg {
    const void *p;
    const void *host;
    size_t bytes;
    id<MTLBuffer> buf;
    NSUInteger off;
    const char *what;
} mtl_arg;
#define MTL_MEM(ptr, name) ((mtl_arg){(ptr), NULL, 0, nil, 0, (name)})
#define MTL_BYTES(ptr, n) ((mtl_arg){NULL, (ptr), (n), nil, 0, "arguments"})
#define MTL_BUF(b_, o_, name) ((mtl_arg){NULL, NULL, 0, (b_), (o_), (name)})

/* Encode kernel `kernel` with args[i] at [[buffer(i)]], tg_bytes of threadgroup memory 0 (0: none),
   over grid threadgroups of tpg threads. Nothing is encoded when an argument is not backend
   memory or the pipeline cannot be made. */
int mtl_dispatch(mtl_be *b, const char *op, const char *kernel, const mtl_arg *args, int nargs, size_t tg_bytes,
                 MTLSize grid, MTLSize tpg);

/* The ops tables (metal_ops.m, metal_dec.m). */
extern const h3_backend_ops h3_metal_ops;
extern const h3_backend_decoders h3_metal_dec;

/* The kernels' source, embedded at build time (build/metal/metal_shaders.c). */
extern const char h3_metal_shader_source[];

#endif /* H3_METAL_INTERNAL_H */
