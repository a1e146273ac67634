// A CPU emulation of the HIP runtime and of the device built-ins the kernels
// use, so the portable kernels (the ones AMD runs) execute on the host: every
// CTA runs its threads as cooperative fibers that switch at barriers and
// shuffles. Built as a separate test library (-DMLA_GPU_EMULATED, see
// tests/meson.build) so CI, which has no GPU, runs tests/test_gpu against the
// CPU backend through the real GPU backend code: scheduling kernel, paged
// loads, masking, split-KV, combine, validation kernels.
//
// Emulated device: 1 GPU, 4 SMs, 64 KB of shared memory per block, 64-wide
// wavefronts (AMD's shape, so the row tile is capped at 16 rows as on AMD).
// Barrier divergence (a warp whose lanes wait at different barriers, or a
// CTA barrier that some threads never reach) aborts with a message.
// Kernel launches are serialised process-wide. Context switches are a few
// instructions on x86-64 (ucontext elsewhere); a barrier costs ~10 ns a thread.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#define MLA_WARP_SIZE 64

// ---- runtime API (host memory stands in for device memory) ---------------------

typedef int hipError_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;
typedef void *hipGraph_t;
typedef void *hipGraphExec_t;
enum : int { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorOutOfMemory = 2, hipErrorNotSupported = 801 };
enum hipMemcpyKind { hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice, hipMemcpyDefault };
enum hipDeviceAttribute_t {
    hipDeviceAttributeMultiprocessorCount,
    hipDeviceAttributeMaxSharedMemoryPerBlockOptin,
    hipDeviceAttributeMaxSharedMemoryPerBlock,
};
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize };
enum hipStreamCaptureMode { hipStreamCaptureModeGlobal, hipStreamCaptureModeThreadLocal };
constexpr unsigned hipEventDisableTiming = 2, hipStreamNonBlocking = 1;

namespace mla {
namespace emu {
constexpr int kSms = 4;
constexpr int kSharedMemoryPerBlock = 64 * 1024;
inline void *stream_token() {
    static int token;
    return &token;
}
}  // namespace emu
}  // namespace mla

inline const char *hipGetErrorString(hipError_t e) {
    switch (e) {
        case hipSuccess: return "no error";
        case hipErrorInvalidValue: return "invalid argument";
        case hipErrorOutOfMemory: return "out of memory";
        case hipErrorNotSupported: return "not supported by the CPU emulation";
        default: return "unknown error";
    }
}
inline const char *hipGetErrorName(hipError_t e) {
    return e == hipSuccess ? "hipSuccess" : e == hipErrorOutOfMemory ? "hipErrorOutOfMemory" : "hipErrorInvalidValue";
}
inline hipError_t hipGetLastError() { return hipSuccess; }
inline hipError_t hipGetDeviceCount(int *n) {
    *n = 1;
    return hipSuccess;
}
inline hipError_t hipGetDevice(int *d) {
    *d = 0;
    return hipSuccess;
}
inline hipError_t hipSetDevice(int d) { return d == 0 ? hipSuccess : hipErrorInvalidValue; }
inline hipError_t hipDeviceSynchronize() { return hipSuccess; }
inline hipError_t hipDeviceGetAttribute(int *v, hipDeviceAttribute_t a, int device) {
    if (device != 0) return hipErrorInvalidValue;
    *v = a == hipDeviceAttributeMultiprocessorCount ? mla::emu::kSms : mla::emu::kSharedMemoryPerBlock;
    return hipSuccess;
}
inline hipError_t hipMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? hipSuccess : hipErrorOutOfMemory;
}
inline hipError_t hipFree(void *p) {
    free(p);
    return hipSuccess;
}
inline hipError_t hipHostMalloc(void **p, size_t n, unsigned) { return hipMalloc(p, n); }
inline hipError_t hipHostFree(void *p) { return hipFree(p); }
inline hipError_t hipMemcpy(void *dst, const void *src, size_t n, hipMemcpyKind) {
    if (n) memmove(dst, src, n);
    return hipSuccess;
}
inline hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, hipMemcpyKind k, hipStream_t) {
    return hipMemcpy(dst, src, n, k);
}
inline hipError_t hipMemset(void *p, int v, size_t n) {
    if (n) memset(p, v, n);
    return hipSuccess;
}
inline hipError_t hipMemsetAsync(void *p, int v, size_t n, hipStream_t) { return hipMemset(p, v, n); }
inline hipError_t hipStreamCreate(hipStream_t *s) {
    *s = mla::emu::stream_token();
    return hipSuccess;
}
inline hipError_t hipStreamCreateWithFlags(hipStream_t *s, unsigned) { return hipStreamCreate(s); }
inline hipError_t hipStreamDestroy(hipStream_t) { return hipSuccess; }
inline hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
inline hipError_t hipEventCreateWithFlags(hipEvent_t *e, unsigned) {
    *e = mla::emu::stream_token();
    return hipSuccess;
}
inline hipError_t hipEventRecord(hipEvent_t, hipStream_t) { return hipSuccess; }
inline hipError_t hipEventSynchronize(hipEvent_t) { return hipSuccess; }
inline hipError_t hipEventDestroy(hipEvent_t) { return hipSuccess; }
inline hipError_t hipFuncSetAttribute(const void *, hipFuncAttribute, int bytes) {
    return bytes <= mla::emu::kSharedMemoryPerBlock ? hipSuccess : hipErrorInvalidValue;
}
template <class Kernel>
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, Kernel, int, size_t) {
    *blocks = 1;
    return hipSuccess;
}
// Graphs are not emulated.
inline hipError_t hipStreamBeginCapture(hipStream_t, hipStreamCaptureMode) { return hipErrorNotSupported; }
inline hipError_t hipStreamEndCapture(hipStream_t, hipGraph_t *) { return hipErrorNotSupported; }
inline hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t *, hipGraph_t, unsigned long long) {
    return hipErrorNotSupported;
}
inline hipError_t hipGraphLaunch(hipGraphExec_t, hipStream_t) { return hipErrorNotSupported; }
inline hipError_t hipGraphDestroy(hipGraph_t) { return hipSuccess; }
inline hipError_t hipGraphExecDestroy(hipGraphExec_t) { return hipSuccess; }

#if !defined(MLA_EMU_HOST_API_ONLY)

// ---- device side -------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // one CTA runs at a time
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
};
struct uint2 {
    uint32_t x, y;
};
struct uint4 {
    uint32_t x, y, z, w;
};
struct int2 {
    int x, y;
};
struct float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace mla {
namespace emu {

enum FiberState { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
#if defined(__x86_64__)
    void *sp;  // saved stack pointer (the callee-saved registers are on the stack)
#else
    ucontext_t ctx;
#endif
    FiberState state;
    std::vector<char> stack;
};

#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer
// in *save_sp, switches to next_sp and restores its registers: a context
// switch without ucontext's signal-mask system calls (most of the cost).
__attribute__((naked, noinline)) static void switch_stack(void ** /*save_sp*/, void * /*next_sp*/) {
    asm("pushq %rbp\n\tpushq %rbx\n\tpushq %r12\n\tpushq %r13\n\tpushq %r14\n\tpushq %r15\n\t"
        "movq %rsp, (%rdi)\n\tmovq %rsi, %rsp\n\t"
        "popq %r15\n\tpopq %r14\n\tpopq %r13\n\tpopq %r12\n\tpopq %rbx\n\tpopq %rbp\n\tret\n\t");
}
#endif

// The CTA being run.
struct Cta {
    unsigned block = 0, grid = 1, threads = 1;
    int current = 0;
#if defined(__x86_64__)
    void *scheduler_sp = nullptr;
#else
    ucontext_t scheduler;
#endif
    std::vector<Fiber> fibers;
    std::vector<uint64_t> lanes;            // shuffle exchange, one slot per thread
    std::vector<unsigned char> dynamic_smem;
    const std::function<void()> *body = nullptr;
};

inline Cta &cta() {
    static Cta c;
    return c;
}

inline void fiber_entry() {
    Cta &c = cta();
    (*c.body)();
    c.fibers[size_t(c.current)].state = kDone;
#if defined(__x86_64__)
    void *unused;
    switch_stack(&unused, c.scheduler_sp);  // never resumed
#endif  // (ucontext: uc_link returns to the scheduler)
}

// The current fiber waits (state s) and the scheduler runs.
inline void wait_at(FiberState s) {
    Cta &c = cta();
    Fiber &f = c.fibers[size_t(c.current)];
    f.state = s;
#if defined(__x86_64__)
    switch_stack(&f.sp, c.scheduler_sp);
#else
    swapcontext(&f.ctx, &c.scheduler);
#endif
}

inline void start_fiber(Fiber &f, size_t stack_bytes) {
#if defined(__x86_64__)
    // Initial frame: six zero registers for switch_stack to pop, then its
    // return address (fiber_entry), aligned as after a call.
    uintptr_t top = reinterpret_cast<uintptr_t>(f.stack.data() + stack_bytes) & ~uintptr_t(15);
    void **sp = reinterpret_cast<void **>(top);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void *>(&fiber_entry);
    for (int i = 0; i < 6; ++i) *--sp = nullptr;
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = stack_bytes;
    f.ctx.uc_link = &cta().scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
#endif
}

inline void resume_fiber(Fiber &f) {
#if defined(__x86_64__)
    switch_stack(&cta().scheduler_sp, f.sp);
#else
    swapcontext(&cta().scheduler, &f.ctx);
#endif
}

[[noreturn]] inline void deadlock(const char *why) {
    fprintf(stderr, "mla GPU emulation: block %u: %s\n", cta().block, why);
    abort();
}

// Runs every thread of the current CTA until all are done.
inline void run_cta() {
    Cta &c = cta();
    const int n = int(c.threads), warps = (n + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE;
    constexpr size_t kStack = 64 * 1024;
    if (c.fibers.size() < size_t(n)) c.fibers.resize(size_t(n));
    for (int t = 0; t < n; ++t) {
        Fiber &f = c.fibers[size_t(t)];
        if (f.stack.empty()) f.stack.resize(kStack);
        start_fiber(f, kStack);
        f.state = kRunnable;
    }
    for (;;) {
        for (int t = 0; t < n; ++t) {
            if (c.fibers[size_t(t)].state != kRunnable) continue;
            c.current = t;
            resume_fiber(c.fibers[size_t(t)]);
        }
        // Everyone waits or is done: release whole warps at a warp barrier
        // first, else the CTA at a block barrier (exited threads count as arrived).
        bool released = false, all_done = true, all_at_block = true;
        for (int w = 0; w < warps; ++w) {
            int waiting = 0, at_block = 0, live = 0;
            for (int t = w * MLA_WARP_SIZE; t < n && t < (w + 1) * MLA_WARP_SIZE; ++t) {
                const FiberState s = c.fibers[size_t(t)].state;
                if (s == kDone) continue;
                ++live;
                waiting += s == kAtWarpBarrier;
                at_block += s == kAtBlockBarrier;
            }
            if (live) all_done = false;
            if (waiting && at_block) deadlock("lanes of one warp wait at different barriers");
            if (waiting) all_at_block = false;
            if (waiting && waiting == live) {
                for (int t = w * MLA_WARP_SIZE; t < n && t < (w + 1) * MLA_WARP_SIZE; ++t)
                    if (c.fibers[size_t(t)].state == kAtWarpBarrier) c.fibers[size_t(t)].state = kRunnable;
                released = true;
            }
        }
        if (all_done) return;
        if (released) continue;
        if (!all_at_block) deadlock("a warp barrier that not every live lane reaches");
        for (int t = 0; t < n; ++t)
            if (c.fibers[size_t(t)].state == kAtBlockBarrier) c.fibers[size_t(t)].state = kRunnable;
    }
}

inline std::mutex &launch_mutex() {
    static std::mutex m;
    return m;
}

// kernel<<<grid, threads, smem>>>(args...) as a call: CTAs one after another.
template <class Kernel>
struct Launch {
    Kernel kernel;
    unsigned grid, threads;
    size_t smem;
    template <class... Args>
    void operator()(Args... args) const {
        std::lock_guard<std::mutex> lock(launch_mutex());
        Cta &c = cta();
        const std::function<void()> body = [&] { kernel(args...); };
        c.body = &body;
        c.grid = grid;
        c.threads = threads;
        c.lanes.assign(threads, 0);
        for (unsigned b = 0; b < grid; ++b) {
            c.block = b;
            c.dynamic_smem.assign(smem + 16, 0xff);  // uninitialised shared memory reads as NaN
            run_cta();
        }
        c.body = nullptr;
    }
};
template <class Kernel>
Launch<Kernel> launch(Kernel k, unsigned grid, unsigned threads, size_t smem) {
    return Launch<Kernel>{k, grid, threads, smem};
}

inline dim3 thread_idx() { return {unsigned(cta().current), 0, 0}; }
inline dim3 block_idx() { return {cta().block, 0, 0}; }
inline dim3 block_dim() { return {cta().threads, 1, 1}; }
inline dim3 grid_dim() { return {cta().grid, 1, 1}; }
inline void *dynamic_smem() {
    void *p = cta().dynamic_smem.data();
    size_t space = cta().dynamic_smem.size();
    return std::align(16, 1, p, space);
}

template <class T>
T shuffle_from(T v, int (*source)(int lane, int arg), int arg) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a register-sized value");
    Cta &c = cta();
    const int t = c.current, lane = t % MLA_WARP_SIZE, base = t - lane;
    memcpy(&c.lanes[size_t(t)], &v, sizeof v);
    wait_at(kAtWarpBarrier);
    const int src = source(lane, arg);
    T r = v;
    if (src >= 0 && src < MLA_WARP_SIZE) memcpy(&r, &c.lanes[size_t(base + src)], sizeof r);
    wait_at(kAtWarpBarrier);
    return r;
}
template <class T>
T shfl_xor(T v, int mask) {
    return shuffle_from(v, [](int lane, int m) { return lane ^ m; }, mask);
}
template <class T>
T shfl(T v, int src) {
    return shuffle_from(v, [](int, int s) { return s; }, src);
}
template <class T>
T shfl_up(T v, int delta) {
    return shuffle_from(v, [](int lane, int d) { return lane >= d ? lane - d : -1; }, delta);
}

}  // namespace emu
}  // namespace mla

#define threadIdx (::mla::emu::thread_idx())
#define blockIdx (::mla::emu::block_idx())
#define blockDim (::mla::emu::block_dim())
#define gridDim (::mla::emu::grid_dim())

inline void __syncthreads() { mla::emu::wait_at(mla::emu::kAtBlockBarrier); }
inline void __syncwarp(unsigned = 0xffffffffu) { mla::emu::wait_at(mla::emu::kAtWarpBarrier); }
inline uint32_t __byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
    const uint64_t bytes = (uint64_t(hi) << 32) | lo;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= uint32_t((bytes >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}
// Atomics: fibers of the one running CTA never interleave inside a call.
template <class T>
T atomicAdd(T *a, T v) {
    const T old = *a;
    *a = old + v;
    return old;
}
template <class T>
T atomicMin(T *a, T v) {
    const T old = *a;
    if (v < old) *a = v;
    return old;
}
template <class T>
T atomicMax(T *a, T v) {
    const T old = *a;
    if (v > old) *a = v;
    return old;
}
inline int atomicCAS(int *a, int compare, int value) {
    const int old = *a;
    if (old == compare) *a = value;
    return old;
}

#define MLA_SHFL_XOR(v, m) ::mla::emu::shfl_xor((v), (m))
#define MLA_SHFL_UP(v, d) ::mla::emu::shfl_up((v), (d))
#define MLA_SHFL(v, src) ::mla::emu::shfl((v), (src))
#define MLA_LAUNCH(kernel, grid, threads, smem, stream) ((void)(stream), ::mla::emu::launch((kernel), (grid), (threads), (smem)))
#define MLA_DYNAMIC_SMEM(type, name) type *name = static_cast<type *>(::mla::emu::dynamic_smem())

#endif  // !MLA_EMU_HOST_API_ONLY
