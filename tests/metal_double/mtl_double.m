/*
 * A test double of the Metal classes the backend calls (libh3/backend/metal/metal_api.h), for
 * Linux: Objective-C classes answering the same selectors, over host memory, whose compute
 * dispatches run the .metal kernels in the MSL fiber emulator (kernel_table.h).
 *
 * It behaves as Metal does where the backend could get it wrong, and says so instead of fixing it:
 *   - a command buffer's work runs when it is waited on (after every buffer committed before it),
 *     never at encode time: a host that reads a result before waitUntilCompleted reads stale data;
 *     setBytes copies at encode time, buffer contents are read when the work runs;
 *   - a dispatch whose kernel has a [[buffer(n)]] that was not bound, threadgroup memory that was
 *     not set or is not a multiple of 16 bytes, or more threads per threadgroup than the pipeline
 *     allows fails its command buffer (status Error, an NSError naming the kernel and the index);
 *   - no-copy buffers need a page-aligned pointer and length (nil otherwise), and blit copies
 *     offsets and a size in multiples of 4 bytes, as on macOS;
 *   - a library offers the functions whose names its source defines, nothing else; the
 *     compile options must ask for MSL 3.1 or later.
 * Its environment knobs stand in for machines we do not have (tests only):
 *   H3MD_DEVICE=none     MTLCreateSystemDefaultDevice returns nil (no Metal device);
 *   H3MD_FAMILY=n        the GPU supports the Apple families up to n (default 9, an M3);
 *   H3MD_COMPILE_ERROR=1 newLibraryWithSource fails with a compiler message;
 *   H3MD_MEMORY=bytes    recommendedMaxWorkingSetSize, and allocations past it return nil;
 *   H3MD_REVERSE=1       the emulator resumes fibers last-to-first.
 */
#import "../../libh3/backend/metal/metal_api.h"
#include "kernel_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static NSUInteger md_allocated; /* bytes of live buffers the double allocated itself */

static uint64_t md_memory(void)
{
    const char *e = getenv("H3MD_MEMORY");
    return e && *e ? strtoull(e, NULL, 10) : (uint64_t)16 << 30;
}

static NSError *md_error(NSString *what)
{
    return [NSError errorWithDomain:@"MTLDoubleDomain" code:1
                           userInfo:[NSDictionary dictionaryWithObject:what forKey:NSLocalizedDescriptionKey]];
}

@implementation MTLCompileOptions
- (id)init
{
    if ((self = [super init])) {
        h3_languageVersion = MTLLanguageVersion3_0;
        h3_fastMathEnabled = YES;
        h3_mathMode = MTLMathModeFast;
    }
    return self;
}
- (MTLLanguageVersion)languageVersion { return h3_languageVersion; }
- (void)setLanguageVersion:(MTLLanguageVersion)v { h3_languageVersion = v; }
- (BOOL)fastMathEnabled { return h3_fastMathEnabled; }
- (void)setFastMathEnabled:(BOOL)v
{
    h3_fastMathEnabled = v;
    h3_mathMode = v ? MTLMathModeFast : MTLMathModeSafe;
}
- (MTLMathMode)mathMode { return h3_mathMode; }
- (void)setMathMode:(MTLMathMode)v
{
    h3_mathMode = v;
    h3_fastMathEnabled = v == MTLMathModeFast;
}
@end

/* ---- buffers ---- */
@interface H3MDBuffer : NSObject <MTLBuffer> {
@public
    id<MTLDevice> dev;
    void *ptr;
    NSUInteger len;
    BOOL owned;
}
@end
@implementation H3MDBuffer
- (id<MTLDevice>)device { return dev; }
- (NSUInteger)length { return len; }
- (void *)contents { return ptr; }
- (void)dealloc
{
    if (owned) {
        free(ptr);
        md_allocated -= len;
    }
    [super dealloc];
}
@end

/* ---- library, functions, pipelines ---- */
@interface H3MDFunction : NSObject <MTLFunction> {
@public
    NSString *fname;
    const void *kernel;
}
@end
@implementation H3MDFunction
- (NSString *)name { return fname; }
- (void)dealloc
{
    [fname release];
    [super dealloc];
}
@end

@interface H3MDLibrary : NSObject <MTLLibrary> {
@public
    NSString *source;
}
@end
@implementation H3MDLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString *)functionName
{
    const char *n = [functionName UTF8String];
    const void *k = h3md_kernel_find(n);
    if (!k) return nil;
    /* the source must define it: the host name of an instantiation (the quoted name its
       instantiation macro passes to [[host_name(...)]]), or a plain kernel's name */
    NSString *hn = [NSString stringWithFormat:@"\"%@\"", functionName];
    NSString *kn = [NSString stringWithFormat:@"kernel void %@(", functionName];
    if ([source rangeOfString:hn].location == NSNotFound && [source rangeOfString:kn].location == NSNotFound)
        return nil;
    H3MDFunction *f = [[H3MDFunction alloc] init];
    f->fname = [functionName copy];
    f->kernel = k;
    return f;
}
- (void)dealloc
{
    [source release];
    [super dealloc];
}
@end

@interface H3MDPipeline : NSObject <MTLComputePipelineState> {
@public
    const void *kernel;
    char cname[64]; /* a C string: encoding must not autorelease (the host has no pool there) */
}
@end
@implementation H3MDPipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup { return 1024; }
- (NSUInteger)threadExecutionWidth { return 32; }
@end

/* ---- recorded commands ---- */
enum { MD_DISPATCH, MD_COPY, MD_FILL };
typedef struct md_cmd {
    int kind;
    const void *kernel;
    char name[64];
    void *bufs[H3MD_MAX_BUFFERS];
    void *bytes[H3MD_MAX_BUFFERS]; /* setBytes copies, owned */
    size_t grid[3], tpg[3], tg_bytes;
    /* copy / fill */
    void *dst;
    const void *src;
    size_t n;
    uint8_t value;
    struct md_cmd *next;
} md_cmd;

@class H3MDCommandBuffer;

@interface H3MDComputeEncoder : NSObject <MTLComputeCommandEncoder> {
@public
    H3MDCommandBuffer *cb;
    H3MDPipeline *pipe;
    void *bufs[H3MD_MAX_BUFFERS];
    void *bytes[H3MD_MAX_BUFFERS];
    size_t blen[H3MD_MAX_BUFFERS];
    uint32_t bound;
    size_t tg_len;
    BOOL tg_set;
}
@end
@interface H3MDBlitEncoder : NSObject <MTLBlitCommandEncoder> {
@public
    H3MDCommandBuffer *cb;
}
@end

@interface H3MDQueue : NSObject <MTLCommandQueue> {
@public
    NSMutableArray *committed; /* command buffers committed and not yet run, in order */
}
- (void)runUpTo:(H3MDCommandBuffer *)last;
@end

@interface H3MDCommandBuffer : NSObject <MTLCommandBuffer> {
@public
    H3MDQueue *queue;
    md_cmd *head, *tail;
    MTLCommandBufferStatus st;
    NSError *err;
    NSMutableArray *retained; /* the buffers its commands use, kept alive until it ran */
}
- (void)append:(md_cmd *)c;
- (void)fail:(NSString *)why;
- (void)failC:(const char *)why;
- (void)run;
@end

@implementation H3MDCommandBuffer
- (MTLCommandBufferStatus)status { return st; }
- (NSError *)error { return err; }
- (void)append:(md_cmd *)c
{
    if (tail) tail->next = c;
    else head = c;
    tail = c;
}
- (void)fail:(NSString *)why
{
    if (err) return;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    err = [md_error(why) retain];
    [pool drain];
}
- (void)failC:(const char *)why
{
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    [self fail:[NSString stringWithUTF8String:why]];
    [pool drain];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoder
{
    H3MDComputeEncoder *e = [[[H3MDComputeEncoder alloc] init] autorelease];
    e->cb = self;
    return e;
}
- (id<MTLBlitCommandEncoder>)blitCommandEncoder
{
    H3MDBlitEncoder *e = [[[H3MDBlitEncoder alloc] init] autorelease];
    e->cb = self;
    return e;
}
- (void)commit
{
    st = MTLCommandBufferStatusCommitted;
    [queue->committed addObject:self];
}
- (void)run
{
    for (md_cmd *c = head; c && !err; c = c->next) {
        if (c->kind == MD_COPY) {
            memmove(c->dst, c->src, c->n);
        } else if (c->kind == MD_FILL) {
            memset(c->dst, c->value, c->n);
        } else {
            const char *e = h3md_kernel_run(c->kernel, c->bufs, c->grid, c->tpg, c->tg_bytes);
            if (e) {
                char m[512];
                snprintf(m, sizeof m, "%s: %s", c->name, e);
                [self failC:m];
            }
        }
    }
    st = err ? MTLCommandBufferStatusError : MTLCommandBufferStatusCompleted;
    [retained removeAllObjects];
}
- (void)waitUntilCompleted
{
    if (st == MTLCommandBufferStatusCommitted) [queue runUpTo:self];
}
- (void)dealloc
{
    for (md_cmd *c = head, *n; c; c = n) {
        n = c->next;
        for (int i = 0; i < H3MD_MAX_BUFFERS; i++) free(c->bytes[i]);
        free(c);
    }
    [err release];
    [retained release];
    [queue release];
    [super dealloc];
}
@end

@implementation H3MDQueue
- (id<MTLCommandBuffer>)commandBuffer
{
    H3MDCommandBuffer *b = [[[H3MDCommandBuffer alloc] init] autorelease];
    b->queue = [self retain];
    b->retained = [[NSMutableArray alloc] init];
    b->st = MTLCommandBufferStatusNotEnqueued;
    return b;
}
- (void)runUpTo:(H3MDCommandBuffer *)last
{
    while ([committed count]) {
        H3MDCommandBuffer *b = [[committed objectAtIndex:0] retain];
        [committed removeObjectAtIndex:0];
        [b run];
        [b release];
        if (b == last) break;
    }
}
- (void)dealloc
{
    [self runUpTo:nil];
    [committed release];
    [super dealloc];
}
@end

static void *md_at(id<MTLBuffer> b, NSUInteger offset) { return (char *)[b contents] + offset; }

@implementation H3MDComputeEncoder
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state { pipe = (H3MDPipeline *)state; }
- (void)setBytes:(const void *)p length:(NSUInteger)length atIndex:(NSUInteger)index
{
    if (index >= H3MD_MAX_BUFFERS || length > 4096) {
        [cb fail:@"setBytes: index past the argument table or more than 4 KiB"];
        return;
    }
    free(bytes[index]);
    bytes[index] = malloc(length ? length : 1);
    memcpy(bytes[index], p, length);
    blen[index] = length;
    bufs[index] = bytes[index];
    bound |= 1u << index;
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index
{
    if (index >= H3MD_MAX_BUFFERS) {
        [cb fail:@"setBuffer: index past the argument table"];
        return;
    }
    if (buffer && offset > [buffer length]) [cb fail:@"setBuffer: offset past the buffer's end"];
    free(bytes[index]);
    bytes[index] = NULL;
    bufs[index] = buffer ? md_at(buffer, offset) : NULL;
    if (buffer) {
        [cb->retained addObject:buffer];
        bound |= 1u << index;
    } else {
        bound &= ~(1u << index);
    }
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index
{
    if (index != 0) [cb fail:@"setThreadgroupMemoryLength: the kernels use index 0 only"];
    if (length % 16) [cb fail:@"setThreadgroupMemoryLength: the length must be a multiple of 16 bytes"];
    if (length > 32768) [cb fail:@"setThreadgroupMemoryLength: more than 32 KiB"];
    tg_len = length;
    tg_set = YES;
}
- (void)dispatchThreadgroups:(MTLSize)g threadsPerThreadgroup:(MTLSize)t
{
    if (!pipe) {
        [cb fail:@"dispatch without a pipeline state"];
        return;
    }
    const char *name = pipe->cname;
    const uint32_t need = h3md_kernel_buffers(pipe->kernel);
    if ((need & bound) != need) {
        int i = 0;
        while (!((need & ~bound) >> i & 1)) i++;
        char m[128];
        snprintf(m, sizeof m, "%s: buffer index %d is not bound", name, i);
        [cb failC:m];
        return;
    }
    if (h3md_kernel_threadgroup(pipe->kernel) && !tg_set) {
        char m[128];
        snprintf(m, sizeof m, "%s: threadgroup memory 0 was not set", name);
        [cb failC:m];
        return;
    }
    if (t.width * t.height * t.depth > [pipe maxTotalThreadsPerThreadgroup] || !t.width || !t.height || !t.depth) {
        char m[128];
        snprintf(m, sizeof m, "%s: %lu threads per threadgroup", name, (unsigned long)(t.width * t.height * t.depth));
        [cb failC:m];
        return;
    }
    md_cmd *c = calloc(1, sizeof *c);
    c->kind = MD_DISPATCH;
    c->kernel = pipe->kernel;
    snprintf(c->name, sizeof c->name, "%s", name);
    for (int i = 0; i < H3MD_MAX_BUFFERS; i++) {
        if (bytes[i]) { /* each dispatch keeps its own copy: setBytes is encode-time data */
            c->bytes[i] = malloc(blen[i] ? blen[i] : 1);
            memcpy(c->bytes[i], bytes[i], blen[i]);
            c->bufs[i] = c->bytes[i];
        } else {
            c->bufs[i] = bufs[i];
        }
    }
    c->grid[0] = g.width, c->grid[1] = g.height, c->grid[2] = g.depth;
    c->tpg[0] = t.width, c->tpg[1] = t.height, c->tpg[2] = t.depth;
    c->tg_bytes = tg_set ? tg_len : 0;
    [cb append:c];
}
- (void)endEncoding
{
    for (int i = 0; i < H3MD_MAX_BUFFERS; i++) {
        free(bytes[i]);
        bytes[i] = NULL;
    }
}
- (void)dealloc
{
    for (int i = 0; i < H3MD_MAX_BUFFERS; i++) free(bytes[i]);
    [super dealloc];
}
@end

@implementation H3MDBlitEncoder
- (void)copyFromBuffer:(id<MTLBuffer>)s
          sourceOffset:(NSUInteger)so
              toBuffer:(id<MTLBuffer>)d
     destinationOffset:(NSUInteger)dof
                  size:(NSUInteger)size
{
    if (so + size > [s length] || dof + size > [d length]) {
        [cb fail:@"copyFromBuffer: range past a buffer's end"];
        return;
    }
    if ((so | dof | size) % 4) { /* Apple's rule on macOS */
        [cb fail:@"copyFromBuffer: offsets and size must be multiples of 4 bytes on macOS"];
        return;
    }
    md_cmd *c = calloc(1, sizeof *c);
    c->kind = MD_COPY;
    c->src = md_at(s, so);
    c->dst = md_at(d, dof);
    c->n = size;
    [cb->retained addObject:s];
    [cb->retained addObject:d];
    [cb append:c];
}
- (void)fillBuffer:(id<MTLBuffer>)b range:(NSRange)r value:(uint8_t)v
{
    if (r.location + r.length > [b length]) {
        [cb fail:@"fillBuffer: range past the buffer's end"];
        return;
    }
    md_cmd *c = calloc(1, sizeof *c);
    c->kind = MD_FILL;
    c->dst = md_at(b, r.location);
    c->n = r.length;
    c->value = v;
    [cb->retained addObject:b];
    [cb append:c];
}
- (void)endEncoding {}
@end

/* ---- the device ---- */
@interface H3MDDevice : NSObject <MTLDevice>
@end
@implementation H3MDDevice
- (NSString *)name { return @"Metal test double (MSL emulator)"; }
- (BOOL)hasUnifiedMemory { return YES; }
- (uint64_t)recommendedMaxWorkingSetSize { return md_memory(); }
- (NSUInteger)currentAllocatedSize { return md_allocated; }
- (NSUInteger)maxBufferLength { return (NSUInteger)md_memory(); }
- (BOOL)supportsFamily:(MTLGPUFamily)f
{
    const char *e = getenv("H3MD_FAMILY");
    const long apple = e && *e ? strtol(e, NULL, 10) : 9;
    if (f >= MTLGPUFamilyApple6 && f <= MTLGPUFamilyApple6 + 10) return f - 1000 <= apple;
    if (f == MTLGPUFamilyMetal3) return apple >= 7;
    return NO;
}
- (id<MTLCommandQueue>)newCommandQueue
{
    H3MDQueue *q = [[H3MDQueue alloc] init];
    q->committed = [[NSMutableArray alloc] init];
    if (getenv("H3MD_REVERSE") && !strcmp(getenv("H3MD_REVERSE"), "1")) h3md_reverse(1);
    return q;
}
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options
{
    (void)options;
    if (md_allocated + length > md_memory()) return nil;
    H3MDBuffer *b = [[H3MDBuffer alloc] init];
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (posix_memalign(&b->ptr, page, length ? length : 1)) {
        [b release];
        return nil;
    }
    memset(b->ptr, 0, length); /* Metal's new buffers are zeroed */
    b->dev = self;
    b->len = length;
    b->owned = YES;
    md_allocated += length;
    return b;
}
- (id<MTLBuffer>)newBufferWithBytes:(const void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options
{
    H3MDBuffer *b = (H3MDBuffer *)[self newBufferWithLength:length options:options];
    if (b) memcpy(b->ptr, pointer, length);
    return b;
}
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(H3_MTL_DEALLOCATOR)deallocator
{
    (void)options;
    (void)deallocator;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if ((uintptr_t)pointer % page || length % page || !length) return nil;
    H3MDBuffer *b = [[H3MDBuffer alloc] init];
    b->dev = self;
    b->ptr = pointer;
    b->len = length;
    b->owned = NO;
    return b;
}
- (id<MTLLibrary>)newLibraryWithSource:(NSString *)source options:(MTLCompileOptions *)options error:(NSError **)error
{
    if (getenv("H3MD_COMPILE_ERROR") && !strcmp(getenv("H3MD_COMPILE_ERROR"), "1")) {
        if (error) *error = md_error(@"program_source:1:1: error: unknown type name 'bfloat' (H3MD_COMPILE_ERROR)");
        return nil;
    }
    if (!options || [options languageVersion] < MTLLanguageVersion3_1) {
        if (error) *error = md_error(@"program_source: error: 'bfloat' needs Metal 3.1 (languageVersion)");
        return nil;
    }
    H3MDLibrary *l = [[H3MDLibrary alloc] init];
    l->source = [source copy];
    return l;
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)fn error:(NSError **)error
{
    if (!fn) {
        if (error) *error = md_error(@"no function");
        return nil;
    }
    H3MDPipeline *p = [[H3MDPipeline alloc] init];
    p->kernel = ((H3MDFunction *)fn)->kernel;
    snprintf(p->cname, sizeof p->cname, "%s", [[fn name] UTF8String]);
    return p;
}
@end

id<MTLDevice> MTLCreateSystemDefaultDevice(void)
{
    const char *e = getenv("H3MD_DEVICE");
    if (e && !strcmp(e, "none")) return nil;
    return [[H3MDDevice alloc] init];
}
