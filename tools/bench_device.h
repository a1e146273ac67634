// mla-bench: the machine a benchmark runs on. The suite (mla_bench.cpp) only
// talks to this interface; bench_device_host.cpp implements it for the CPU
// backend (host memory, wall-clock timing) and bench_gpu.cu for the GPU
// backend (device memory, events, graphs). A CPU-only build has no GPU
// implementation and make_gpu_device() says so.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

// Every failure of a runtime call or an mla_* call is thrown as this.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Device {
public:
    virtual ~Device() = default;

    virtual bool is_gpu() const = 0;
    virtual std::string name() const = 0;
    // Last-level cache that must not serve the KV between timed calls (L2 on a GPU).
    virtual size_t cache_bytes() const = 0;
    // Memory the benchmark may fill with KV copies for cache rotation.
    virtual size_t rotation_budget_bytes() const = 0;
    // The value passed as `stream` to mla_plan_* (NULL on the host).
    virtual void *stream() = 0;

    // Memory on the device (host memory for the host device), 256-byte aligned.
    virtual void *alloc(size_t bytes) = 0;
    virtual void release(void *p) noexcept = 0;
    virtual void upload(void *dst, const void *src, size_t bytes) = 0;
    virtual void download(void *dst, const void *src, size_t bytes) = 0;
    virtual void copy(void *dst, const void *src, size_t bytes) = 0;  // device to device
    virtual void fill(void *dst, int byte, size_t bytes) = 0;         // memset, finished on return
    virtual void synchronize() = 0;

    // Streaming read bandwidth in GB/s (1e9 B/s) of a plain read over a buffer
    // of at least 4x cache_bytes(), median of several runs; measured once,
    // cached; 0 when it could not be measured.
    virtual double read_bandwidth_gbs() = 0;
    // Size of the buffer that measurement read.
    virtual size_t read_bandwidth_buffer_bytes() const = 0;
    // Event time of an empty kernel of one CTA, median of several: the floor
    // under a single launch such as the metadata build (dmeta_us). Measured
    // once, cached; 0 where it does not apply (host).
    virtual double empty_kernel_us() { return 0; }

    // Time `iters` calls of body(i), each on its own (events on a GPU, the wall
    // clock on the host), after `warmup` untimed calls. With `flush`, the cache
    // is overwritten before every call, outside the timed region. Returns the
    // time of each timed call in microseconds.
    virtual std::vector<double> time_each(int warmup, int iters, bool flush, const std::function<void(int)> &body) = 0;
    // Flush by overwriting the cache (dirty lines) instead of by reading
    // another buffer through it (clean lines, the default). Host: no effect.
    virtual void set_dirty_flush(bool) {}

    // Capture `variants` graphs, graph k recording capture(k, stream), then
    // replay them round robin. Without `flush`: `iters` back-to-back replays
    // between two events, divided by iters, median of several such batches.
    // With `flush`: each replay timed on its own with a cache flush before it,
    // median. Returns microseconds per replay. Throws Error when graphs are not
    // supported (host) or capture fails.
    virtual bool supports_graphs() const = 0;
    virtual double time_graphs(int variants, int warmup, int iters, bool flush,
                               const std::function<void(int, void *)> &capture) = 0;
};

// Owning device buffer.
class Buffer {
public:
    Buffer() = default;
    Buffer(Device &dev, size_t bytes) : dev_(&dev), bytes_(bytes), p_(bytes ? dev.alloc(bytes) : nullptr) {}
    ~Buffer() { reset(); }
    Buffer(Buffer &&o) noexcept : dev_(o.dev_), bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr; o.bytes_ = 0; }
    Buffer &operator=(Buffer &&o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_; bytes_ = o.bytes_; p_ = o.p_;
            o.p_ = nullptr; o.bytes_ = 0;
        }
        return *this;
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;

    void reset() {
        if (p_) dev_->release(p_);
        p_ = nullptr;
        bytes_ = 0;
    }
    void *get() const { return p_; }
    template <typename T> T *as() const { return static_cast<T *>(p_); }
    size_t size() const { return bytes_; }

private:
    Device *dev_ = nullptr;
    size_t bytes_ = 0;
    void *p_ = nullptr;
};

std::unique_ptr<Device> make_host_device();
// The GPU of ordinal `device`; nullptr with *why set when this build has no GPU
// support or no usable device is present.
std::unique_ptr<Device> make_gpu_device(int device, std::string *why);

double median(std::vector<double> v);

}  // namespace bench
