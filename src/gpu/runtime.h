// HIP portability shim. Kernels and host code use HIP names; on AMD they come
// from ROCm's <hip/hip_runtime.h>, on NVIDIA this header maps the few names
// the project uses onto the CUDA runtime (Debian's HIP NVIDIA headers do not
// build with CUDA 13, so the project carries its own mapping).
#pragma once

#if defined(MLA_GPU_EMULATED)
#include "emulated.h"  // the CPU emulation (tests): runtime API, device built-ins, launches
#elif defined(__HIP_PLATFORM_AMD__) || defined(MLA_GPU_AMD)
#include <hip/hip_runtime.h>
#define MLA_WARP_SIZE 64
// AMD has no opt-in above the per-block LDS limit (64 KB on gfx90a/gfx942).
#define hipDeviceAttributeMaxSharedMemoryPerBlockOptin hipDeviceAttributeMaxSharedMemoryPerBlock
#else
#include <cuda_runtime.h>
#define MLA_WARP_SIZE 32

typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaStreamCaptureStatus hipStreamCaptureStatus;
typedef cudaGraph_t hipGraph_t;
typedef cudaGraphExec_t hipGraphExec_t;

#define hipSuccess cudaSuccess
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipErrorNoDevice cudaErrorNoDevice
#define hipErrorInsufficientDriver cudaErrorInsufficientDriver
#define hipGetErrorString cudaGetErrorString
#define hipGetErrorName cudaGetErrorName
#define hipGetLastError cudaGetLastError
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDevice cudaGetDevice
#define hipSetDevice cudaSetDevice
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeMaxSharedMemoryPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define hipDeviceAttributeL2CacheSize cudaDevAttrL2CacheSize
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipHostMalloc(p, n, flags) cudaMallocHost(p, n)
#define hipHostFree cudaFreeHost
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemset cudaMemset
#define hipMemsetAsync cudaMemsetAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipStreamCreate cudaStreamCreate
#define hipStreamDestroy cudaStreamDestroy
#define hipStreamSynchronize cudaStreamSynchronize
#define hipStreamIsCapturing cudaStreamIsCapturing
#define hipStreamCaptureStatusNone cudaStreamCaptureStatusNone
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeGlobal cudaStreamCaptureModeGlobal
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipGraphInstantiate(exec, graph, a, b, c) cudaGraphInstantiate(exec, graph, 0)
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#define hipEventCreate cudaEventCreate
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#define hipEventDisableTiming cudaEventDisableTiming
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipFuncSetAttribute(f, attr, v) cudaFuncSetAttribute(f, attr, v)
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipPointerGetAttributes cudaPointerGetAttributes
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#endif

#if defined(MLA_GPU_EMULATED)
// (emulated.h defines the device-side names)
#elif defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__)
// Device-side names. Warp shuffles take a full mask on NVIDIA.
#define MLA_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define MLA_SHFL_UP(v, d) __shfl_up_sync(0xffffffffu, (v), (d))
#define MLA_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
#elif defined(__HIPCC__) || defined(__HIP__)
#define MLA_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define MLA_SHFL_UP(v, d) __shfl_up((v), (d))
#define MLA_SHFL(v, src) __shfl((v), (src))
#ifndef __syncwarp
#define __syncwarp() __builtin_amdgcn_wave_barrier()
#endif
#endif

#if !defined(MLA_GPU_EMULATED)
// kernel<<<grid, threads, smem, stream>>>, spelled so the CPU emulation can
// turn it into a call: MLA_LAUNCH(kernel, grid, threads, smem, stream)(args...).
#define MLA_LAUNCH(kernel, grid, threads, smem, stream) kernel<<<(grid), (threads), (smem), (stream)>>>
// The kernel's dynamic shared memory as `type *name`.
#define MLA_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

#include "../errors.h"

// Launches that may overlap the previous kernel on the stream: on NVIDIA from
// sm_90 (programmatic dependent launch) the kernel is scheduled while its
// predecessor drains, and waits in wait_for_previous_grid() before its first
// access to global memory, so the launch latency between the kernels of a
// decode step is hidden. Elsewhere (AMD, the CPU emulation, older NVIDIA
// devices) an ordinary launch; the device calls are then no-ops.
namespace mla {
namespace gpu {

struct Launch {
    int grid, threads;
    size_t smem;
    hipStream_t stream;
    bool overlap;  // the device supports overlapped launches (launches_can_overlap)
};

#if !defined(MLA_GPU_EMULATED) && defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__) && !defined(MLA_GPU_AMD)
inline bool launches_can_overlap(int device) {
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}
template <class... Params, class... Args>
hipError_t launch_kernel(void (*kernel)(Params...), const Launch &l, const Args &...args) {
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(unsigned(l.grid));
    c.blockDim = dim3(unsigned(l.threads));
    c.dynamicSmemBytes = l.smem;
    c.stream = l.stream;
    c.attrs = l.overlap ? &overlap : nullptr;
    c.numAttrs = l.overlap ? 1 : 0;
    return cudaLaunchKernelEx(&c, kernel, args...);
}
#else
inline bool launches_can_overlap(int) { return false; }
template <class... Params, class... Args>
hipError_t launch_kernel(void (*kernel)(Params...), const Launch &l, const Args &...args) {
    MLA_LAUNCH(kernel, l.grid, l.threads, l.smem, l.stream)(args...);
    return hipGetLastError();
}
#endif

// Device side of launch_kernel. Every kernel of the library keeps two
// rules: every thread calls wait_for_previous_grid() before its first global
// write, and allow_next_grid() only after its own wait; and CTA 0's threads
// (at least) wait before they exit. A grid then neither completes nor lets
// its successor start before its predecessor has completed (the successor
// starts once every CTA has called allow_next_grid() or exited, and CTA 0
// does neither before its wait). So a grid starts only once the grid two
// places before it on the stream has completed, and what the grid before
// that one waited for, the step's metadata in particular, may be read
// before the wait (the combine kernel does, and its CTAs with nothing to
// merge exit without waiting).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(MLA_GPU_EMULATED)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(MLA_GPU_EMULATED)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Makes the compiler hold v in a register at this point, so the load it
// came from is issued here, unconditionally, rather than sunk into the
// branch that uses it (NVIDIA only: elsewhere no caller depends on it).
__device__ __forceinline__ void materialize(int &v) {
#if defined(__CUDA_ARCH__) && !defined(MLA_GPU_EMULATED)
    asm volatile("" : "+r"(v));
#else
    (void)v;
#endif
}

}  // namespace gpu
}  // namespace mla

// 2^x for the softmax. NVIDIA: one ex2.approx.ftz (results below 2^-126
// flush to zero: such a probability is invisible next to the row maximum's 1
// in the bf16 P); elsewhere exp2f.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__) && !defined(MLA_GPU_EMULATED)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}

namespace mla {

// Turn a failed runtime call into a status with the call's name and error.
inline mla_status gpu_check(hipError_t err, const char *what) {
    if (err == hipSuccess) return MLA_SUCCESS;
    return fail(err == 2 /* out of memory in both runtimes */ ? MLA_ERROR_OUT_OF_MEMORY : MLA_ERROR_DEVICE_RUNTIME,
                "%s failed: %s (%s)", what, hipGetErrorName(err), hipGetErrorString(err));
}

#define MLA_GPU_TRY(call) MLA_TRY(::mla::gpu_check((call), #call))

// Makes the plan's device current for a scope and restores the caller's.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        if (hipGetDevice(&previous_) != hipSuccess) previous_ = -1;
        if (previous_ != device) status_ = gpu_check(hipSetDevice(device), "hipSetDevice");
        else previous_ = -1;
    }
    ~DeviceGuard() {
        if (previous_ >= 0) (void)hipSetDevice(previous_);
    }
    mla_status status() const { return status_; }

private:
    int previous_ = -1;
    mla_status status_ = MLA_SUCCESS;
};

}  // namespace mla
