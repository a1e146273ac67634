// Device memory, streams and graphs for the GPU tests, over the CUDA runtime
// (MLA_GPU_NVIDIA) or HIP (MLA_GPU_AMD). Compiled by the host C++ compiler:
// only the runtime API headers are used, no kernels. Every call throws
// dm::error on failure, naming the call and the runtime's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(MLA_GPU_EMULATED)
#define MLA_EMU_HOST_API_ONLY
#include "../src/gpu/emulated.h"  // the CPU emulation's runtime API (host memory)
#define DM_(name) hip##name
#elif defined(MLA_GPU_NVIDIA)
#include <cuda_runtime_api.h>
#define DM_(name) cuda##name
#elif defined(MLA_GPU_AMD)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#define DM_(name) hip##name
#endif

#if defined(DM_)
#define DM_HAVE_GPU 1

namespace dm {

typedef DM_(Error_t) error_t;
typedef DM_(Stream_t) stream_t;
typedef DM_(Graph_t) graph_t;
typedef DM_(GraphExec_t) graph_exec_t;

struct error : std::runtime_error {
    explicit error(const std::string &what) : std::runtime_error(what) {}
};

inline void check(error_t e, const char *call) {
    if (e != DM_(Success)) throw error(std::string(call) + ": " + DM_(GetErrorString)(e));
}
#define DM_CHECK(call) ::dm::check((call), #call)

inline int device_count() {
    int n = 0;
    if (DM_(GetDeviceCount)(&n) != DM_(Success)) return 0;
    return n;
}
inline void set_device(int d) { DM_CHECK(DM_(SetDevice)(d)); }
inline void device_sync() { DM_CHECK(DM_(DeviceSynchronize)()); }

inline void *alloc(size_t bytes) {
    void *p = nullptr;
    DM_CHECK(DM_(Malloc)(&p, bytes ? bytes : 16));
    return p;
}
inline void release(void *p) {
    if (p) (void)DM_(Free)(p);
}
// h2d and fill are finished on return. The tests run the library on
// non-blocking streams, which do not wait for the legacy default stream: a
// memset there may still be running (or not yet started) when a kernel on
// such a stream writes the same buffer, and a copy from pageable memory
// returns once the data is staged, before it has reached the device. A
// poison fill that landed after the kernel read as "rows unwritten", now
// and then, on an H100 (performance.md v21).
inline void h2d(void *dst, const void *src, size_t bytes) {
    if (bytes) DM_CHECK(DM_(Memcpy)(dst, src, bytes, DM_(MemcpyHostToDevice)));
    DM_CHECK(DM_(DeviceSynchronize)());
}
inline void d2h(void *dst, const void *src, size_t bytes) {
    if (bytes) DM_CHECK(DM_(Memcpy)(dst, src, bytes, DM_(MemcpyDeviceToHost)));
}
inline void fill(void *dst, int byte, size_t bytes) {
    if (bytes) DM_CHECK(DM_(Memset)(dst, byte, bytes));
    DM_CHECK(DM_(DeviceSynchronize)());
}

inline stream_t stream_create() {
    stream_t s;
    DM_CHECK(DM_(StreamCreateWithFlags)(&s, DM_(StreamNonBlocking)));
    return s;
}
inline void stream_destroy(stream_t s) {
    if (s) (void)DM_(StreamDestroy)(s);
}
inline void stream_sync(stream_t s) { DM_CHECK(DM_(StreamSynchronize)(s)); }

// Stream capture into a graph. ThreadLocal mode: the capturing thread may not
// make unsafe calls (allocations, synchronisation) while capturing; the
// library must not either.
inline void begin_capture(stream_t s) { DM_CHECK(DM_(StreamBeginCapture)(s, DM_(StreamCaptureModeThreadLocal))); }
inline graph_t end_capture(stream_t s) {
    graph_t g = nullptr;
    DM_CHECK(DM_(StreamEndCapture)(s, &g));
    return g;
}
inline graph_exec_t instantiate(graph_t g) {
    graph_exec_t e = nullptr;
    DM_CHECK(DM_(GraphInstantiateWithFlags)(&e, g, 0));
    return e;
}
inline void launch(graph_exec_t e, stream_t s) { DM_CHECK(DM_(GraphLaunch)(e, s)); }
inline void graph_destroy(graph_t g) {
    if (g) (void)DM_(GraphDestroy)(g);
}
inline void graph_exec_destroy(graph_exec_t e) {
    if (e) (void)DM_(GraphExecDestroy)(e);
}

// An owned device allocation.
class buffer {
public:
    buffer() = default;
    explicit buffer(size_t bytes) : p_(alloc(bytes)), n_(bytes) {}
    buffer(const void *host, size_t bytes) : buffer(bytes) { h2d(p_, host, bytes); }
    ~buffer() { release(p_); }
    buffer(const buffer &) = delete;
    buffer &operator=(const buffer &) = delete;
    buffer(buffer &&o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
    buffer &operator=(buffer &&o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        return *this;
    }
    void *get() const { return p_; }
    size_t size() const { return n_; }
    template <typename T> T *as() const { return static_cast<T *>(p_); }

private:
    void *p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace dm

#endif  // DM_
