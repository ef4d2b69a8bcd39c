/*
 * The subset of Apple's Metal API that the Metal backend calls, declared by us from Apple's
 * documentation (developer.apple.com/documentation/metal), with Apple's names, signatures and
 * enumeration values. It is used only where Apple's framework is absent: on Linux, where the
 * backend is compiled with GNU Objective-C against GNUstep's Foundation and runs against the test
 * double of these classes (tests/metal_double/), which runs the kernels in the MSL emulator. On
 * Darwin the backend includes <Metal/Metal.h> instead (metal_internal.h), so nothing here is what
 * runs on a Mac: a name or a value spelled differently here would fail the Darwin build or differ
 * from Apple's, and the Mac script (tests/metal/run_mac.sh) is what shows it.
 *
 * Left out because GNU Objective-C cannot parse them, with no effect on the calls: the nullability
 * and __autoreleasing qualifiers; the block type of newBufferWithBytesNoCopy's deallocator is
 * spelled as a block only where the compiler has blocks (the backend always passes nil).
 */
#ifndef H3_METAL_API_H
#define H3_METAL_API_H

#import <Foundation/Foundation.h>
#include <stdint.h>

/* MTLResourceOptions: storage mode in bits 4-7 (MTLResourceStorageModeShift), CPU cache mode in
   bits 0-3, hazard tracking in bits 8-9. Shared storage: CPU and GPU see the same memory. */
typedef NSUInteger MTLResourceOptions;
enum {
    MTLResourceCPUCacheModeDefaultCache = 0,
    MTLResourceStorageModeShared = 0 << 4,
    MTLResourceStorageModePrivate = 2 << 4,
    MTLResourceHazardTrackingModeDefault = 0 << 8,
};

typedef NSInteger MTLGPUFamily;
enum {
    MTLGPUFamilyApple6 = 1006,
    MTLGPUFamilyApple7 = 1007, /* A14, M1 */
    MTLGPUFamilyApple8 = 1008, /* A15, A16, M2 */
    MTLGPUFamilyApple9 = 1009, /* A17, M3, M4 */
    MTLGPUFamilyMac2 = 2002,
    MTLGPUFamilyMetal3 = 5001,
};

typedef NSUInteger MTLLanguageVersion;
enum {
    MTLLanguageVersion3_0 = (3 << 16) + 0,
    MTLLanguageVersion3_1 = (3 << 16) + 1,
};

typedef NSInteger MTLMathMode;
enum { MTLMathModeSafe = 0, MTLMathModeRelaxed = 1, MTLMathModeFast = 2 };

typedef NSUInteger MTLCommandBufferStatus;
enum {
    MTLCommandBufferStatusNotEnqueued = 0,
    MTLCommandBufferStatusEnqueued = 1,
    MTLCommandBufferStatusCommitted = 2,
    MTLCommandBufferStatusScheduled = 3,
    MTLCommandBufferStatusCompleted = 4,
    MTLCommandBufferStatusError = 5,
};

typedef struct {
    NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth)
{
    MTLSize s = {width, height, depth};
    return s;
}

#if defined(__BLOCKS__)
#define H3_MTL_DEALLOCATOR void (^)(void *pointer, NSUInteger length)
#else
#define H3_MTL_DEALLOCATOR id
#endif

@protocol MTLDevice;
@protocol MTLBuffer;
@protocol MTLFunction;

/* The instance variables are ours (Apple's header declares none): GNU Objective-C's runtime has
   fragile instance variables, so the double's storage must be declared with the interface. */
@interface MTLCompileOptions : NSObject {
@protected
    MTLLanguageVersion h3_languageVersion;
    BOOL h3_fastMathEnabled;
    MTLMathMode h3_mathMode;
}
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
@property (readwrite, nonatomic) BOOL fastMathEnabled;
@property (readwrite, nonatomic) MTLMathMode mathMode;
@end

@protocol MTLResource <NSObject>
@property (readonly) id<MTLDevice> device;
@end

@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void *)contents;
@end

@protocol MTLFunction <NSObject>
@property (readonly) NSString *name;
@end

@protocol MTLLibrary <NSObject>
- (id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
@end

@protocol MTLComputePipelineState <NSObject>
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@end

@protocol MTLCommandEncoder <NSObject>
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLBlitCommandEncoder <MTLCommandEncoder>
- (void)copyFromBuffer:(id<MTLBuffer>)sourceBuffer
          sourceOffset:(NSUInteger)sourceOffset
              toBuffer:(id<MTLBuffer>)destinationBuffer
     destinationOffset:(NSUInteger)destinationOffset
                  size:(NSUInteger)size;
- (void)fillBuffer:(id<MTLBuffer>)buffer range:(NSRange)range value:(uint8_t)value;
@end

@protocol MTLCommandBuffer <NSObject>
@property (readonly) MTLCommandBufferStatus status;
@property (readonly) NSError *error;
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (id<MTLBlitCommandEncoder>)blitCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
@end

@protocol MTLCommandQueue <NSObject>
- (id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice <NSObject>
@property (readonly) NSString *name;
@property (readonly) BOOL hasUnifiedMemory;
@property (readonly) uint64_t recommendedMaxWorkingSetSize;
@property (readonly) NSUInteger currentAllocatedSize;
@property (readonly) NSUInteger maxBufferLength;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytes:(const void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(H3_MTL_DEALLOCATOR)deallocator;
- (id<MTLLibrary>)newLibraryWithSource:(NSString *)source options:(MTLCompileOptions *)options error:(NSError **)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError **)error;
@end

#ifdef __cplusplus
extern "C" {
#endif
id<MTLDevice> MTLCreateSystemDefaultDevice(void);
#ifdef __cplusplus
}
#endif

#endif /* H3_METAL_API_H */
