/*
 * The Metal backend: device and command queue, the shader library compiled from the embedded
 * sources, the pipeline-state cache, memory (shared MTLBuffers), weights (no-copy views of the
 * mapped safetensors), the command-buffer batching, and the exported entry points. The ops'
 * encoders are in metal_ops.m and metal_dec.m.
 *
 * Built as its own shared library (libh3_metal) and loaded by libh3 the way libh3_cuda is
 * (backend.c): on Darwin against Apple's Metal.framework, on Linux against the test double of
 * tests/metal_double/, which runs the same kernels in the MSL emulator.
 */
#include "backend/metal/metal_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mtl_err(mtl_be *b, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return b->host.err(code, "%s", msg);
}

/* ---- pointers to buffers ---- */

static int region_find(const mtl_region *r, int n, const char *p)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (p < r[mid].base) hi = mid - 1;
        else if (p >= r[mid].base + r[mid].len) lo = mid + 1;
        else return mid;
    }
    return -1;
}

int mtl_lookup(mtl_be *b, const void *p, const char *op, const char *what, id<MTLBuffer> *buf, NSUInteger *off)
{
    const char *c = (const char *)p;
    int i = region_find(b->reg, b->nreg, c);
    if (i >= 0) {
        *buf = b->reg[i].buf;
        *off = (NSUInteger)(c - b->reg[i].base);
        return 0;
    }
    for (i = b->nwreg - 1; i >= 0; i--)
        if (c >= b->wreg[i].base && c < b->wreg[i].base + b->wreg[i].len) {
            *buf = b->wreg[i].buf;
            *off = (NSUInteger)(c - b->wreg[i].base);
            return 0;
        }
    return mtl_err(b, H3_E_INVALID, "metal: %s: the %s operand is not Metal backend memory (alloc'd or a loaded weight)",
                   op, what);
}

static int region_add(mtl_be *b, mtl_region **r, int *n, int *cap, char *base, size_t len, id<MTLBuffer> buf,
                      bool sorted)
{
    if (*n == *cap) {
        const int nc = *cap ? 2 * *cap : 256;
        mtl_region *g = realloc(*r, sizeof *g * (size_t)nc);
        if (!g) return mtl_err(b, H3_E_NOMEM, "metal: out of host memory");
        *r = g, *cap = nc;
    }
    int at = *n;
    if (sorted)
        while (at > 0 && (*r)[at - 1].base > base) at--;
    memmove(*r + at + 1, *r + at, sizeof **r * (size_t)(*n - at));
    (*r)[at] = (mtl_region){base, len, buf};
    (*n)++;
    return 0;
}

static void region_del(mtl_region *r, int *n, int i)
{
    [r[i].buf release];
    memmove(r + i, r + i + 1, sizeof *r * (size_t)(*n - i - 1));
    (*n)--;
}

/* ---- command buffers ---- */

/* The open compute encoder, created with its command buffer when there is none. */
static id<MTLComputeCommandEncoder> open_encoder(mtl_be *b)
{
    if (b->enc) return b->enc;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (!b->cb) b->cb = [[b->queue commandBuffer] retain];
    if (b->cb) b->enc = [[b->cb computeCommandEncoder] retain];
    [pool drain];
    return b->enc;
}

static void close_encoder(mtl_be *b)
{
    if (!b->enc) return;
    [b->enc endEncoding];
    [b->enc release];
    b->enc = nil;
}

/* Commit the open command buffer without waiting: the GPU starts on it while the host encodes
   the next one. */
static void commit_open(mtl_be *b)
{
    close_encoder(b);
    if (!b->cb) return;
    [b->cb commit];
    [b->inflight addObject:b->cb];
    [b->cb release];
    b->cb = nil;
    b->dispatches = 0;
}

int mtl_flush(mtl_be *b)
{
    commit_open(b);
    if (![b->inflight count]) return 0;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    /* One queue runs its command buffers in commit order: waiting for the last waits for all. */
    [(id<MTLCommandBuffer>)[b->inflight lastObject] waitUntilCompleted];
    int rc = 0;
    for (NSUInteger i = 0; i < [b->inflight count] && !rc; i++) {
        id<MTLCommandBuffer> c = [b->inflight objectAtIndex:i];
        if ([c status] == MTLCommandBufferStatusError) {
            NSError *e = [c error];
            const char *why = e ? [[e localizedDescription] UTF8String] : "no reason given";
            rc = mtl_err(b, H3_E_UNSUPPORTED, "metal: the GPU reported a failed command buffer: %s", why);
        }
    }
    [b->inflight removeAllObjects];
    [b->temps removeAllObjects];
    [pool drain];
    return rc;
}

/* ---- pipelines ---- */

static id<MTLComputePipelineState> pipeline(mtl_be *b, const char *kernel)
{
    for (int i = 0; i < b->npipes; i++)
        if (!strcmp(b->pipes[i].name, kernel)) return b->pipes[i].ps;
    if (b->npipes == MTL_MAX_PIPES) {
        mtl_err(b, H3_E_UNSUPPORTED, "metal: more than %d kernels", MTL_MAX_PIPES);
        return nil;
    }
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    id<MTLComputePipelineState> ps = nil;
    id<MTLFunction> fn = [b->lib newFunctionWithName:[NSString stringWithUTF8String:kernel]];
    if (!fn) {
        mtl_err(b, H3_E_UNSUPPORTED, "metal: the shader library has no kernel %s", kernel);
    } else {
        NSError *e = nil;
        ps = [b->dev newComputePipelineStateWithFunction:fn error:&e];
        if (!ps)
            mtl_err(b, H3_E_UNSUPPORTED, "metal: cannot make the pipeline of %s: %s", kernel,
                    e ? [[e localizedDescription] UTF8String] : "no reason given");
        [fn release];
    }
    [pool drain];
    char *name = ps ? strdup(kernel) : NULL;
    if (ps && !name) {
        [ps release];
        mtl_err(b, H3_E_NOMEM, "metal: out of host memory");
        return nil;
    }
    if (ps) {
        b->pipes[b->npipes].name = name;
        b->pipes[b->npipes].ps = ps;
        b->npipes++;
    }
    return ps;
}

/* ---- dispatch ---- */

/* Command buffers are committed every so many dispatches, so the GPU works while the host encodes. */
#define MTL_COMMIT_EVERY 256

int mtl_dispatch(mtl_be *b, const char *op, const char *kernel, const mtl_arg *args, int nargs, size_t tg_bytes,
                 MTLSize grid, MTLSize tpg)
{
    id<MTLBuffer> bufs[31];
    NSUInteger offs[31];
    if (nargs > 31) return mtl_err(b, H3_E_INVALID, "metal: %s: %d arguments", op, nargs);
    for (int i = 0; i < nargs; i++) {
        bufs[i] = nil, offs[i] = 0;
        if (args[i].host) continue;
        if (args[i].buf) {
            bufs[i] = args[i].buf, offs[i] = args[i].off;
        } else if (!args[i].p) {
            bufs[i] = b->dummy;
        } else {
            int rc = mtl_lookup(b, args[i].p, op, args[i].what, &bufs[i], &offs[i]);
            if (rc) return rc;
        }
    }
    id<MTLComputePipelineState> ps = pipeline(b, kernel);
    if (!ps) return -H3_E_UNSUPPORTED;
    const NSUInteger threads = tpg.width * tpg.height * tpg.depth;
    if (threads > [ps maxTotalThreadsPerThreadgroup])
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: %s: %s runs %lu threads per threadgroup, this GPU allows %lu", op,
                       kernel, (unsigned long)threads, (unsigned long)[ps maxTotalThreadsPerThreadgroup]);
    if (!grid.width || !grid.height || !grid.depth) return 0; /* nothing to compute */
    id<MTLComputeCommandEncoder> e = open_encoder(b);
    if (!e) return mtl_err(b, H3_E_NOMEM, "metal: %s: no command buffer (out of memory?)", op);
    [e setComputePipelineState:ps];
    for (int i = 0; i < nargs; i++) {
        if (args[i].host) [e setBytes:args[i].host length:args[i].bytes atIndex:(NSUInteger)i];
        else [e setBuffer:bufs[i] offset:offs[i] atIndex:(NSUInteger)i];
    }
    if (tg_bytes) [e setThreadgroupMemoryLength:tg_bytes atIndex:0];
    [e dispatchThreadgroups:grid threadsPerThreadgroup:tpg];
    if (++b->dispatches >= MTL_COMMIT_EVERY) commit_open(b);
    return 0;
}

int mtl_temp_copy(mtl_be *b, const void *host, size_t bytes, const char *op, id<MTLBuffer> *buf)
{
    *buf = [b->dev newBufferWithBytes:host length:(bytes ? bytes : 4) options:MTLResourceStorageModeShared];
    if (!*buf) return mtl_err(b, H3_E_NOMEM, "metal: %s: out of memory copying %zu bytes of host data", op, bytes);
    [b->temps addObject:*buf];
    [*buf release];
    return 0;
}

int mtl_temp_wrap(mtl_be *b, void *p, size_t bytes, const char *op, id<MTLBuffer> *buf, NSUInteger *off)
{
    const uintptr_t a = (uintptr_t)p, lo = a / b->page * b->page;
    const uintptr_t hi = (a + (bytes ? bytes : 1) + b->page - 1) / b->page * b->page;
    *buf = [b->dev newBufferWithBytesNoCopy:(void *)lo length:(NSUInteger)(hi - lo)
                                    options:MTLResourceStorageModeShared deallocator:nil];
    if (!*buf)
        return mtl_err(b, H3_E_NOMEM, "metal: %s: cannot map %zu bytes of host memory for the GPU", op, bytes);
    *off = (NSUInteger)(a - lo);
    [b->temps addObject:*buf];
    [*buf release];
    return 0;
}

/* ---- memory ---- */

static void note_peak(mtl_be *b)
{
    const uint64_t now = (uint64_t)[b->dev currentAllocatedSize];
    if (now > b->peak) b->peak = now;
}

static void *m_alloc(h3_backend *be, size_t bytes)
{
    mtl_be *b = mtl_of(be);
    const size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
    id<MTLBuffer> buf = [b->dev newBufferWithLength:n options:MTLResourceStorageModeShared];
    if (!buf) {
        const uint64_t tot = [b->dev recommendedMaxWorkingSetSize], used = (uint64_t)[b->dev currentAllocatedSize];
        mtl_err(b, H3_E_NOMEM, "metal: out of GPU memory allocating %.1f MiB (%.1f of %.1f MiB in use)",
                (double)bytes / 1048576.0, (double)used / 1048576.0, (double)tot / 1048576.0);
        return NULL;
    }
    if (region_add(b, &b->reg, &b->nreg, &b->capreg, (char *)[buf contents], n, buf, true)) {
        [buf release];
        return NULL;
    }
    note_peak(b);
    return [buf contents];
}

static void m_release(h3_backend *be, void *p)
{
    mtl_be *b = mtl_of(be);
    if (!p) return;
    const int i = region_find(b->reg, b->nreg, (const char *)p);
    /* The command buffers that use it keep the MTLBuffer alive until they have run. */
    if (i >= 0 && b->reg[i].base == (char *)p) region_del(b->reg, &b->nreg, i);
}

/* The host touches shared memory only when no GPU work is pending: ops are asynchronous. */
static int m_upload(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    mtl_be *b = mtl_of(be);
    id<MTLBuffer> buf;
    NSUInteger off;
    int rc = bytes ? mtl_lookup(b, dst, "upload", "destination", &buf, &off) : 0;
    if (!rc) rc = mtl_flush(b);
    if (!rc && bytes) memcpy(dst, src, bytes);
    return rc;
}

static int m_download(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    mtl_be *b = mtl_of(be);
    id<MTLBuffer> buf;
    NSUInteger off;
    int rc = bytes ? mtl_lookup(b, src, "download", "source", &buf, &off) : 0;
    if (!rc) rc = mtl_flush(b);
    if (!rc && bytes) memcpy(dst, src, bytes);
    return rc;
}

/* A blit in the open command buffer (ending its compute encoder; the next op opens another). */
static id<MTLBlitCommandEncoder> open_blit(mtl_be *b)
{
    close_encoder(b);
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (!b->cb) b->cb = [[b->queue commandBuffer] retain];
    id<MTLBlitCommandEncoder> e = b->cb ? [[b->cb blitCommandEncoder] retain] : nil;
    [pool drain];
    return e;
}

static int m_zero(h3_backend *be, void *dst, size_t bytes)
{
    mtl_be *b = mtl_of(be);
    if (!bytes) return 0;
    id<MTLBuffer> buf;
    NSUInteger off;
    int rc = mtl_lookup(b, dst, "zero", "destination", &buf, &off);
    if (rc) return rc;
    if (off + bytes > [buf length]) return mtl_err(b, H3_E_INVALID, "metal: zero: %zu bytes past the buffer", bytes);
    id<MTLBlitCommandEncoder> e = open_blit(b);
    if (!e) return mtl_err(b, H3_E_NOMEM, "metal: zero: no command buffer");
    [e fillBuffer:buf range:NSMakeRange(off, bytes) value:0];
    [e endEncoding];
    [e release];
    return 0;
}

static int m_dcopy(h3_backend *be, void *dst, const void *src, size_t bytes)
{
    mtl_be *b = mtl_of(be);
    if (!bytes) return 0;
    id<MTLBuffer> db, sb;
    NSUInteger doff, soff;
    int rc = mtl_lookup(b, dst, "dcopy", "destination", &db, &doff);
    if (!rc) rc = mtl_lookup(b, src, "dcopy", "source", &sb, &soff);
    if (rc) return rc;
    if (doff + bytes > [db length] || soff + bytes > [sb length])
        return mtl_err(b, H3_E_INVALID, "metal: dcopy: %zu bytes past a buffer's end", bytes);
    /* Blits on macOS want offsets and sizes in multiples of 4 bytes. Other copies are done by the
       host once the queued work is over (unified memory: the same bytes, in the same order). */
    if ((doff | soff | bytes) % 4) {
        rc = mtl_flush(b);
        if (!rc) memmove(dst, src, bytes);
        return rc;
    }
    id<MTLBlitCommandEncoder> e = open_blit(b);
    if (!e) return mtl_err(b, H3_E_NOMEM, "metal: dcopy: no command buffer");
    [e copyFromBuffer:sb sourceOffset:soff toBuffer:db destinationOffset:doff size:bytes];
    [e endEncoding];
    [e release];
    return 0;
}

static int m_sync(h3_backend *be) { return mtl_flush(mtl_of(be)); }

static int m_mem_info(h3_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{
    mtl_be *b = mtl_of(be);
    const uint64_t tot = [b->dev recommendedMaxWorkingSetSize], used = (uint64_t)[b->dev currentAllocatedSize];
    *total_bytes = tot;
    *free_bytes = used < tot ? tot - used : 0;
    return 0;
}

static int m_mem_peak(h3_backend *be, bool reset, uint64_t *peak)
{
    mtl_be *b = mtl_of(be);
    note_peak(b);
    *peak = b->peak;
    if (reset) b->peak = (uint64_t)[b->dev currentAllocatedSize];
    return 0;
}

static const h3_backend_mem metal_mem = {
    .alloc = m_alloc,
    .release = m_release,
    .upload = m_upload,
    .download = m_download,
    .zero = m_zero,
    .sync = m_sync,
    .mem_info = m_mem_info,
    .dcopy = m_dcopy,
    .mem_peak = m_mem_peak,
};

/* ---- weights: views of the mapping ---- */

static size_t dtype_bytes(h3_dtype dt)
{
    return dt == H3_DT_F32 ? 4 : (dt == H3_DT_BF16 || dt == H3_DT_F16) ? 2 : 0;
}

/* A no-copy buffer over the pages that hold the weight (unified memory: the GPU reads the mapped
   file itself). Where the system refuses one, a shared copy: the same values. */
static int w_load(h3_backend *be, const void *host, h3_dtype dt, int64_t rows, int64_t cols, h3_bw *out)
{
    mtl_be *b = mtl_of(be);
    memset(out, 0, sizeof *out);
    const size_t es = dtype_bytes(dt);
    if (!es) return mtl_err(b, H3_E_SCHEMA, "metal: weights must be F32, BF16 or F16 (dtype %d)", (int)dt);
    if (be->weight_precision != H3_PRECISION_DEFAULT)
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: weight precision %d is not one the Metal backend runs",
                       be->weight_precision);
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX || (uint64_t)rows * (uint64_t)cols > SIZE_MAX / es)
        return mtl_err(b, H3_E_INVALID, "metal: weight of %lld x %lld out of range", (long long)rows, (long long)cols);
    if ((uintptr_t)host % es) return mtl_err(b, H3_E_INVALID, "metal: weight data not aligned to its dtype");
    const size_t bytes = (size_t)rows * (size_t)cols * es;
    const uintptr_t a = (uintptr_t)host, lo = a / b->page * b->page;
    const uintptr_t hi = (a + bytes + b->page - 1) / b->page * b->page;
    id<MTLBuffer> buf = [b->dev newBufferWithBytesNoCopy:(void *)lo length:(NSUInteger)(hi - lo)
                                                 options:MTLResourceStorageModeShared deallocator:nil];
    const void *data = host;
    char *base = (char *)lo;
    size_t len = hi - lo;
    if (!buf) {
        buf = [b->dev newBufferWithBytes:host length:bytes options:MTLResourceStorageModeShared];
        if (!buf) {
            return mtl_err(b, H3_E_NOMEM, "metal: out of GPU memory for a %.1f MiB weight", (double)bytes / 1048576.0);
        }
        data = [buf contents];
        base = (char *)data;
        len = bytes;
        note_peak(b);
    }
    if (region_add(b, &b->wreg, &b->nwreg, &b->capwreg, base, len, buf, false)) {
        [buf release];
        return -H3_E_NOMEM;
    }
    out->data = data;
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    out->priv = (void *)buf; /* not retained twice: the region owns it */
    return 0;
}

static void w_free(h3_backend *be, h3_bw *w)
{
    mtl_be *b = mtl_of(be);
    if (!w || !w->priv) return;
    /* The handle views the caller's memory, which may be reused once this returns (the text
       encoder's reader refills its buffer with the next layer): the queued ops that read it run
       first. A failure among them is reported by the next sync. */
    if (b->cb || [b->inflight count]) {
        NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
        commit_open(b);
        [(id<MTLCommandBuffer>)[b->inflight lastObject] waitUntilCompleted];
        [pool drain];
    }
    for (int i = b->nwreg - 1; i >= 0; i--)
        if ((void *)b->wreg[i].buf == w->priv) {
            region_del(b->wreg, &b->nwreg, i);
            break;
        }
    memset(w, 0, sizeof *w);
}

static const h3_backend_weights metal_weights = {
    .weight_load = w_load,
    .weight_free = w_free,
};

/* ---- creation ---- */

static void destroy(h3_backend *be)
{
    mtl_be *b = mtl_of(be);
    if (!b) return;
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    if (b->queue) mtl_flush(b);
    while (b->nreg) region_del(b->reg, &b->nreg, b->nreg - 1);
    while (b->nwreg) region_del(b->wreg, &b->nwreg, b->nwreg - 1);
    free(b->reg);
    free(b->wreg);
    for (int i = 0; i < b->npipes; i++) {
        [b->pipes[i].ps release];
        free(b->pipes[i].name);
    }
    [b->inflight release];
    [b->temps release];
    [b->dummy release];
    [b->lib release];
    [b->queue release];
    [b->dev release];
    [pool drain];
    free(b);
}

/* Apple GPU family 7 (M1) is the oldest the kernels run on: simdgroup matrices, and bfloat (MSL
   3.1, macOS 14). */
#define MTL_MIN_FAMILY 7

static int create(mtl_be *b)
{
    b->dev = MTLCreateSystemDefaultDevice();
    if (!b->dev) return mtl_err(b, H3_E_UNSUPPORTED, "metal: no Metal device (MTLCreateSystemDefaultDevice found none)");
    snprintf(b->gpu, sizeof b->gpu, "%s", [[b->dev name] UTF8String]);
    for (int f = 12; f >= 1 && !b->family; f--)
        if ([b->dev supportsFamily:(MTLGPUFamily)(1000 + f)]) b->family = f;
    if (b->family < MTL_MIN_FAMILY)
        return mtl_err(b, H3_E_UNSUPPORTED,
                       "metal: %s is Apple GPU family %d; the kernels need family %d or newer (M1 and later: "
                       "simdgroup matrices, bfloat)",
                       b->gpu, b->family, MTL_MIN_FAMILY);
    if (![b->dev hasUnifiedMemory])
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: %s has no unified memory (the backend maps weights in place)",
                       b->gpu);
    b->queue = [b->dev newCommandQueue];
    if (!b->queue) return mtl_err(b, H3_E_NOMEM, "metal: cannot create a command queue on %s", b->gpu);
    MTLCompileOptions *opt = [[MTLCompileOptions alloc] init];
    [opt setLanguageVersion:MTLLanguageVersion3_1];
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
#endif
    /* Safe math: the ops' tolerances assume IEEE exp, sqrt and division, and the bit-exact ops no
       contraction (fastMathEnabled = NO is mathMode safe from macOS 15 on, and works before). */
    [opt setFastMathEnabled:NO];
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
    NSError *e = nil;
    NSString *src = [NSString stringWithUTF8String:h3_metal_shader_source];
    b->lib = src ? [b->dev newLibraryWithSource:src options:opt error:&e] : nil;
    [opt release];
    if (!b->lib) {
        const char *why = e ? [[e localizedDescription] UTF8String] : "no reason given";
        /* the compiler's first line says enough */
        char first[300];
        snprintf(first, sizeof first, "%s", why);
        char *nl = strchr(first, '\n');
        if (nl) *nl = 0;
        return mtl_err(b, H3_E_UNSUPPORTED, "metal: the shaders do not compile on %s: %s", b->gpu, first);
    }
    b->dummy = [b->dev newBufferWithLength:256 options:MTLResourceStorageModeShared];
    b->inflight = [[NSMutableArray alloc] init];
    b->temps = [[NSMutableArray alloc] init];
    if (!b->dummy || !b->inflight || !b->temps) return mtl_err(b, H3_E_NOMEM, "metal: out of memory creating the backend");
    /* Every kernel's pipeline now, so a kernel the compiler or the GPU refuses fails here, at
       creation, rather than in the middle of a render. */
    static const char *const first_use[] = {"h3m_linear_f32_f32_f32", "h3m_attention_f32_f32", "h3m_norm_mod_f32_f32"};
    for (size_t i = 0; i < sizeof first_use / sizeof *first_use; i++)
        if (!pipeline(b, first_use[i])) return -H3_E_UNSUPPORTED;
    const uint64_t tot = [b->dev recommendedMaxWorkingSetSize];
    snprintf(b->base.desc, sizeof b->base.desc, "metal (%s, apple%d, %.1f GiB unified; not yet verified on hardware)",
             b->gpu, b->family, (double)tot / 1073741824.0);
    return 0;
}

/* The ABI this library was built for: libh3 reads it before calling anything else here. */
__attribute__((visibility("default"))) uint32_t h3_backend_metal_abi(void) { return H3_BACKEND_ABI; }

__attribute__((visibility("default"))) int h3_backend_metal_create(const h3_backend_host *host, int device_ordinal,
                                                                   h3_backend **out)
{
    if (out) *out = NULL;
    if (!host || !out || host->struct_size < offsetof(h3_backend_host, noise) + sizeof host->noise || !host->err ||
        !host->noise)
        return -H3_E_INVALID;
    if (device_ordinal != 0) return host->err(H3_E_INVALID, "metal: device index %d: a Mac has one GPU (0)", device_ordinal);
    mtl_be *b = calloc(1, sizeof *b);
    if (!b) return host->err(H3_E_NOMEM, "metal: out of host memory creating the backend");
    memcpy(&b->host, host, sizeof b->host);
    b->host.struct_size = sizeof b->host;
    b->host.cuda_attention = b->host.cuda_rows = b->host.cudnn_lib = NULL;
    b->page = (size_t)sysconf(_SC_PAGESIZE);
    b->base.name = "metal";
    b->base.abi_version = H3_BACKEND_ABI;
    b->base.caps = H3_CAP_MEM_PEAK | H3_CAP_DECODERS;
    b->base.is_host = true; /* unified memory: weights are views of the mapping, buffers host-visible */
    b->base.mem = &metal_mem;
    b->base.weights = &metal_weights;
    b->base.ops = &h3_metal_ops;
    b->base.dec = &h3_metal_dec;
    b->base.destroy = destroy;
    b->base.act_dtype = H3_DT_F32; /* the CPU's exact path; the bf16 kernels are there for speed */
    b->base.compute_capability = 0;
    b->base.weight_precision = H3_PRECISION_DEFAULT;
    b->base.attn_precision = H3_PRECISION_DEFAULT;
    snprintf(b->base.attn_fp8_why, sizeof b->base.attn_fp8_why, "the Metal backend has no fp8 attention");
    NSAutoreleasePool *pool = [[NSAutoreleasePool alloc] init];
    int rc = create(b);
    [pool drain];
    if (rc) {
        destroy(&b->base);
        return rc;
    }
    *out = &b->base;
    return 0;
}
