// A CPU emulation of the HIP runtime and of the device built-ins the kernels
// use, so the GPU backend's kernels execute on the host: every CTA runs its
// threads as cooperative fibers that switch at barriers and warp-collective
// operations. Built as separate test libraries (-DMLA_GPU_EMULATED, see
// tests/meson.build) so CI, which has no GPU, runs tests/test_gpu against the
// CPU backend through the real GPU backend code: scheduling kernel, paged
// loads, masking, split-KV, combine, validation kernels.
//
// Two emulated devices, both 1 GPU with 4 SMs:
//   default                   AMD's shape: 64-wide wavefronts, 64 KB of shared
//                             memory per block, the portable kernels.
//   MLA_GPU_EMULATED_NVIDIA   an sm_90-like device: 32-wide warps, 227 KB of
//                             shared memory, and the NVIDIA kernels' own path:
//                             ldmatrix, mma.sync m16n8k16 bf16, wgmma
//                             m64nNk16 bf16/f16 (A in registers or shared
//                             memory, K- or M-major), cp.async
//                             (copies and wgmmas complete only when a
//                             wait_group requires them, the latest the PTX
//                             rules allow, so a read before its wait sees
//                             stale data), named barriers (bar.sync /
//                             bar.arrive id, count).
// Barrier divergence (a warp whose lanes wait at different barriers, or a
// CTA or named barrier that some threads never reach) aborts with a message.
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

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#if defined(MLA_GPU_EMULATED_NVIDIA)
#define MLA_WARP_SIZE 32
#else
#define MLA_WARP_SIZE 64
#endif

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
enum hipStreamCaptureStatus { hipStreamCaptureStatusNone, hipStreamCaptureStatusActive };
constexpr unsigned hipEventDisableTiming = 2, hipStreamNonBlocking = 1;

namespace mla {
namespace emu {
constexpr int kSms = 4;
#if defined(MLA_GPU_EMULATED_NVIDIA)
constexpr int kSharedMemoryPerBlock = 227 * 1024;
constexpr int kSharedMemoryPerSm = 228 * 1024;
#else
constexpr int kSharedMemoryPerBlock = 64 * 1024;
constexpr int kSharedMemoryPerSm = 64 * 1024;
#endif
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
inline hipError_t hipStreamIsCapturing(hipStream_t, hipStreamCaptureStatus *status) {
    *status = hipStreamCaptureStatusNone;  // (graphs are not emulated)
    return hipSuccess;
}
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
hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, Kernel, int, size_t smem) {
    const int by_smem = int(mla::emu::kSharedMemoryPerSm / (smem + 1024));
    *blocks = by_smem < 1 ? 1 : by_smem > 2 ? 2 : by_smem;  // the kernels are sized for <= 2 per SM
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

#include "../formats.h"  // bf16_to_float, f16_to_float for the emulated MMAs

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

enum FiberState { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kAtNamedBarrier, kDone };
constexpr int kNamedBarriers = 16;
constexpr int kExchangeWords = 8;

struct Fiber {
#if defined(__x86_64__)
    void *sp;  // saved stack pointer (the callee-saved registers are on the stack)
#else
    ucontext_t ctx;
#endif
    FiberState state;
    int named_barrier;  // the barrier id it waits at (kAtNamedBarrier)
    int named_result;   // the OR of the predicates of the barrier it waited at
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
    std::vector<uint32_t> exchange;         // warp-collective operands, kExchangeWords per thread
    struct Copy {
        void *dst;
        const void *src;
        int bytes, src_bytes;  // bytes past src_bytes are zero-filled
    };
    struct AsyncCopies {
        std::vector<Copy> open;               // issued, not yet committed
        std::deque<std::vector<Copy>> groups;  // committed, oldest first
    };
    std::vector<AsyncCopies> copies;        // per thread (cp.async)
    struct Wgmma {
        float *d;       // the issuing thread's accumulators
        int n;          // N of m64nNk16
        bool f16;       // f16 elements (else bf16)
        uint64_t desc;  // B operand
        bool accumulate;
        uint32_t a[32][4];  // the warp's A fragments (A in registers)
        uint64_t a_desc;    // A in shared memory: its descriptor (a_smem)
        bool a_smem, a_trans;  // A from shared memory; M-major (else K-major)
    };
    struct AsyncWgmmas {
        std::vector<Wgmma> open;
        std::deque<std::vector<Wgmma>> groups;
    };
    std::vector<AsyncWgmmas> wgmmas;        // per thread (wgmma.mma_async)
    struct NamedBarrier {
        int arrived = 0, expected = 0, any = 0;
    };
    NamedBarrier named[kNamedBarriers];  // bar.sync / bar.arrive id, count
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
            if (live != waiting + at_block) all_at_block = false;  // (some at a named barrier or runnable)
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
        bool runnable = false;  // released by a named barrier after the sweep passed it
        for (int t = 0; t < n; ++t) runnable |= c.fibers[size_t(t)].state == kRunnable;
        if (runnable) continue;
        if (!all_at_block) deadlock("a warp or named barrier that not every thread it waits for reaches");
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
        c.exchange.assign(size_t(threads) * kExchangeWords, 0);
        c.copies.assign(threads, Cta::AsyncCopies{});
        c.wgmmas.assign(threads, Cta::AsyncWgmmas{});
        for (unsigned b = 0; b < grid; ++b) {
            c.block = b;
            c.dynamic_smem.assign(smem + 16, 0xff);  // uninitialised shared memory reads as NaN
            // Copies a previous CTA left in flight are dropped with its shared memory.
            for (Cta::AsyncCopies &q : c.copies) q = Cta::AsyncCopies{};
            for (Cta::AsyncWgmmas &q : c.wgmmas) q = Cta::AsyncWgmmas{};
            for (Cta::NamedBarrier &b : c.named) b = Cta::NamedBarrier{};
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

// ---- the NVIDIA warp-level operations (MLA_GPU_EMULATED_NVIDIA) ----

// Every lane of the warp publishes `n` words and gets the warp's words
// (lane-major, kExchangeWords apart) to read until the matching release.
inline const uint32_t *warp_publish(const uint32_t *words, int n) {
    Cta &c = cta();
    const int t = c.current, base = t - t % MLA_WARP_SIZE;
    memcpy(&c.exchange[size_t(t) * kExchangeWords], words, size_t(n) * 4);
    wait_at(kAtWarpBarrier);
    return &c.exchange[size_t(base) * kExchangeWords];
}
inline void warp_release() { wait_at(kAtWarpBarrier); }

inline uint32_t load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
inline uint32_t load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lane 8m + r gives
// the address of row r of matrix m; a lane gets two b16 of each matrix.
inline void ldmatrix(uint32_t *r, int count, const void *row_address, bool trans) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(row_address);
    const uint32_t mine[2] = {uint32_t(a), uint32_t(uint64_t(a) >> 32)};
    const uint32_t *all = warp_publish(mine, 2);
    auto row = [&](int lane) {
        const uint32_t *w = all + size_t(lane) * kExchangeWords;
        return reinterpret_cast<const uint8_t *>(uintptr_t(uint64_t(w[0]) | (uint64_t(w[1]) << 32)));
    };
    const int lane = cta().current % MLA_WARP_SIZE, g = lane / 4, t = lane % 4;
    for (int m = 0; m < count; ++m) {
        if (!trans) {
            r[m] = load_u32(row(8 * m + g) + 4 * t);
        } else {  // elements (2t, g) and (2t + 1, g) of the matrix
            r[m] = load_u16(row(8 * m + 2 * t) + 2 * g) | (load_u16(row(8 * m + 2 * t + 1) + 2 * g) << 16);
        }
    }
    warp_release();
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D = A B + C in place.
// Fragments (g = lane / 4, t = lane % 4): a0 A[g][2t..], a1 A[g+8][2t..],
// a2 A[g][2t+8..], a3 A[g+8][2t+8..]; b0 B[2t..][g], b1 B[2t+8..][g];
// c0, c1 D[g][2t, 2t+1], c2, c3 D[g+8][2t, 2t+1].
inline void mma_bf16_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const uint32_t *all = warp_publish(mine, 6);
    auto A = [&](int i, int k) {
        const int reg = (i >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), lane = (i % 8) * 4 + (k % 8) / 2;
        return bf16_to_float(uint16_t(all[size_t(lane) * kExchangeWords + reg] >> (16 * (k & 1))));
    };
    auto B = [&](int k, int j) {
        const int reg = 4 + (k >= 8 ? 1 : 0), lane = j * 4 + (k % 8) / 2;
        return bf16_to_float(uint16_t(all[size_t(lane) * kExchangeWords + reg] >> (16 * (k & 1))));
    };
    const int lane = cta().current % MLA_WARP_SIZE, g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int i = g + (e >= 2 ? 8 : 0), j = 2 * t + (e & 1);
        float d = c[e];
        for (int k = 0; k < 16; ++k) d = fmaf(A(i, k), B(k, j), d);
        c[e] = d;
    }
    warp_release();
}

// cp.async: queued per thread, landed by cp_async_wait.
inline void cp_async(void *dst, const void *src, int bytes, int src_bytes) {
    cta().copies[size_t(cta().current)].open.push_back({dst, src, bytes, src_bytes});
}
inline void cp_async_commit() {
    Cta::AsyncCopies &q = cta().copies[size_t(cta().current)];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}
inline void cp_async_wait(int pending) {
    Cta::AsyncCopies &q = cta().copies[size_t(cta().current)];
    while (int(q.groups.size()) > pending) {
        for (const Cta::Copy &k : q.groups.front()) {
            if (k.src_bytes > 0) memcpy(k.dst, k.src, size_t(k.src_bytes));
            memset(static_cast<char *>(k.dst) + k.src_bytes, 0, size_t(k.bytes - k.src_bytes));
        }
        q.groups.pop_front();
    }
}

// wgmma.mma_async m64nNk16 bf16 / f16 with A in registers or shared memory
// (src/gpu/tile.cuh, Wgmma): queued per thread with a copy of its warp's A
// fragments (or A's descriptor), computed when a wgmma.wait_group requires
// it (the latest the PTX rules allow), so reading accumulators before the
// wait sees stale values and shared-memory operands are read only then.
// Each warp's 16 rows of D depend only on its own A rows, so the warpgroup
// needs no rendezvous.
inline uint32_t smem_offset(const void *p) {
    return uint32_t(static_cast<const unsigned char *>(p) - static_cast<const unsigned char *>(dynamic_smem()));
}
inline void wgmma(float *d, int n, bool f16, const uint32_t (&a)[4], uint64_t desc, bool accumulate) {
    const uint32_t *all = warp_publish(a, 4);
    Cta::Wgmma op{};
    op.d = d, op.n = n, op.f16 = f16, op.desc = desc, op.accumulate = accumulate;
    for (int l = 0; l < 32; ++l)
        for (int r = 0; r < 4; ++r) op.a[l][r] = all[size_t(l) * kExchangeWords + r];
    warp_release();
    cta().wgmmas[size_t(cta().current)].open.push_back(op);
}
// The same with A from shared memory too, K-major or (`a_trans`) M-major,
// laid out as wgmma_operand_offset reads it.
inline void wgmma_ss(float *d, int n, bool f16, uint64_t a_desc, bool a_trans, uint64_t desc, bool accumulate) {
    Cta::Wgmma op{};
    op.d = d, op.n = n, op.f16 = f16, op.desc = desc, op.accumulate = accumulate;
    op.a_desc = a_desc, op.a_smem = true, op.a_trans = a_trans;
    cta().wgmmas[size_t(cta().current)].open.push_back(op);
}
inline void wgmma_commit() {
    Cta::AsyncWgmmas &q = cta().wgmmas[size_t(cta().current)];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}
// Byte offset of 16-bit element (row, k) of an operand described by `desc`
// (row: M or N; a core matrix's rows run along K unless `mn_major`). No
// swizzle: 16-byte core-matrix rows, LBO apart along K, SBO along M/N.
// 128-byte swizzle: 128-byte rows of 8-row atoms, atoms SBO apart along the
// strided dimension (M/N, or K when `mn_major`) and LBO apart along the
// other past 64 elements; the 16-byte chunk index of an address is XORed
// with its 128-byte row index modulo 8.
inline size_t wgmma_operand_offset(uint64_t desc, int row, int k, bool mn_major) {
    const size_t start = (desc & 0x3fffu) << 4;
    const size_t lbo = ((desc >> 16) & 0x3fffu) << 4, sbo = ((desc >> 32) & 0x3fffu) << 4;
    if ((desc >> 62) == 1) {
        const int strided = mn_major ? k : row, contiguous = mn_major ? row : k;
        const size_t a = start + size_t(strided / 8) * sbo + size_t(strided % 8) * 128 +
                         size_t(contiguous / 64) * lbo + size_t(contiguous % 64) * 2;
        return a ^ (((a >> 7) & 7u) << 4);
    }
    const size_t in_core = mn_major ? (k % 8) * 16 + (row % 8) * 2 : (row % 8) * 16 + (k % 8) * 2;
    return start + (row / 8) * sbo + (k / 8) * lbo + in_core;
}
inline void wgmma_run(const Cta::Wgmma &op) {
    const unsigned char *base = static_cast<const unsigned char *>(dynamic_smem());
    auto value = [&](uint32_t bits) { return op.f16 ? f16_to_float(uint16_t(bits)) : bf16_to_float(uint16_t(bits)); };
    auto A = [&](int i, int k) {
        if (op.a_smem) return value(load_u16(base + wgmma_operand_offset(op.a_desc, i, k, op.a_trans)));
        // the mma.sync m16n8k16 A fragment layout of the warp's 16 rows
        const int reg = (i % 16 >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), lane = (i % 8) * 4 + (k % 8) / 2;
        return value(op.a[lane][reg] >> (16 * (k & 1)));
    };
    auto B = [&](int k, int j) { return value(load_u16(base + wgmma_operand_offset(op.desc, j, k, false))); };
    const int lane = cta().current % MLA_WARP_SIZE, warp = (cta().current / MLA_WARP_SIZE) % 4;
    const int g = lane / 4, t = lane % 4;
    // Register A holds the warp's own 16 rows; shared-memory A all 64 (warp w's are 16w..16w+15).
    const int row0 = op.a_smem ? 16 * warp : 0;
    for (int i = 0; i < op.n / 8; ++i)
        for (int e = 0; e < 4; ++e) {
            const int row = row0 + g + (e >= 2 ? 8 : 0), col = 8 * i + 2 * t + (e & 1);
            float acc = op.accumulate ? op.d[4 * i + e] : 0.0f;
            for (int k = 0; k < 16; ++k) acc = fmaf(A(row, k), B(k, col), acc);
            op.d[4 * i + e] = acc;
        }
}
inline void wgmma_wait(int pending) {
    Cta::AsyncWgmmas &q = cta().wgmmas[size_t(cta().current)];
    while (int(q.groups.size()) > pending) {
        for (const Cta::Wgmma &op : q.groups.front()) wgmma_run(op);
        q.groups.pop_front();
    }
}

// __syncthreads_or: a block barrier that also returns whether any thread's
// predicate was non-zero (threads that have exited count as zero).
inline int syncthreads_or(int predicate) {
    Cta &c = cta();
    c.lanes[size_t(c.current)] = predicate != 0;
    wait_at(kAtBlockBarrier);
    int any = 0;
    for (unsigned t = 0; t < c.threads; ++t)
        if (c.fibers[t].state != kDone && c.lanes[t]) any = 1;
    wait_at(kAtBlockBarrier);  // every thread has read the predicates before any reuses its slot
    return any;
}

// bar.sync / bar.arrive / bar.red.or with a barrier id and a thread count:
// the barrier completes when `count` threads have arrived (waiting or not);
// the waiters resume then. Returns whether any arriving thread's predicate
// was non-zero (for the waiters and the completing thread). A thread that
// only arrives yields, so that threads its arrival released run before its
// next instructions: a store placed after the arrive it should precede
// then lands too late for them, as it may on the GPU.
inline int named_barrier(int id, int count, bool wait, int predicate) {
    Cta &c = cta();
    if (id <= 0 || id >= kNamedBarriers || count <= 0 || count > int(c.threads) || count % MLA_WARP_SIZE)
        deadlock("named barrier id or thread count out of range");
    Cta::NamedBarrier &b = c.named[id];
    if (b.arrived > 0 && b.expected != count) deadlock("named barrier used with two thread counts at once");
    b.expected = count;
    b.any |= predicate != 0;
    if (++b.arrived == count) {
        const int any = b.any;
        for (unsigned t = 0; t < c.threads; ++t) {
            Fiber &f = c.fibers[t];
            if (f.state == kAtNamedBarrier && f.named_barrier == id) f.state = kRunnable, f.named_result = any;
        }
        b = Cta::NamedBarrier{};
        if (!wait) wait_at(kRunnable);
        return any;
    }
    if (!wait) {
        wait_at(kRunnable);
        return 0;
    }
    Fiber &self = c.fibers[size_t(c.current)];
    self.named_barrier = id;
    wait_at(kAtNamedBarrier);
    return self.named_result;
}

}  // namespace emu
}  // namespace mla

#define threadIdx (::mla::emu::thread_idx())
#define blockIdx (::mla::emu::block_idx())
#define blockDim (::mla::emu::block_dim())
#define gridDim (::mla::emu::grid_dim())

inline void __syncthreads() { mla::emu::wait_at(mla::emu::kAtBlockBarrier); }
inline int __syncthreads_or(int predicate) { return mla::emu::syncthreads_or(predicate); }
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
