// mla-bench: the GPU device. HIP names through the project's shim
// (gpu/runtime.h maps them to CUDA on NVIDIA). Device buffers, copies, a
// streaming-read kernel for the bandwidth of this run, per-call event timing
// with an L2 flush outside the events, and timing of captured graphs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_device.h"
#include "gpu/runtime.h"

#if !defined(__HIP_PLATFORM_AMD__) && !defined(MLA_GPU_AMD)
// Names the shim does not carry (yet); the CUDA runtime has them under these.
#ifndef hipMemGetInfo
#define hipMemGetInfo cudaMemGetInfo
#endif
#ifndef hipGraphInstantiate
#define hipGraphInstantiate(exec, graph, a, b, c) cudaGraphInstantiate(exec, graph, 0)
#endif
#endif

namespace bench {
namespace {

void check(hipError_t err, const char *what) {
    if (err != hipSuccess)
        throw Error(std::string(what) + " failed: " + hipGetErrorName(err) + " (" + hipGetErrorString(err) + ")");
}
#define BENCH_HIP(call) ::bench::check((call), #call)

// Plain streaming read: 16-byte loads, four in flight per thread, folded into
// one word per block so the loads cannot be dropped.
__global__ void read_kernel(const uint4 *__restrict__ data, size_t n, uint32_t *__restrict__ out) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
        acc ^= (a.x + a.y + a.z + a.w) ^ (b.x + b.y + b.z + b.w) ^ (c.x + c.y + c.z + c.w) ^ (d.x + d.y + d.z + d.w);
    }
    for (; i < n; i += stride) {
        const uint4 a = data[i];
        acc ^= a.x + a.y + a.z + a.w;
    }
    __shared__ uint32_t part[1024];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] ^= part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

// Does nothing: its event time is what a launch costs by itself.
__global__ void empty_kernel() {}

class Events {
public:
    explicit Events(size_t n) {
        ev_.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            hipEvent_t e;
            BENCH_HIP(hipEventCreate(&e));
            ev_.push_back(e);
        }
    }
    ~Events() {
        for (hipEvent_t e : ev_) (void)hipEventDestroy(e);
    }
    hipEvent_t operator[](size_t i) const { return ev_[i]; }

private:
    std::vector<hipEvent_t> ev_;
};

double elapsed_us(hipEvent_t a, hipEvent_t b) {
    float ms = 0.0f;
    BENCH_HIP(hipEventElapsedTime(&ms, a, b));
    return double(ms) * 1e3;
}

class Graphs {
public:
    ~Graphs() {
        for (hipGraphExec_t e : exec_) (void)hipGraphExecDestroy(e);
        for (hipGraph_t g : graphs_) (void)hipGraphDestroy(g);
    }
    void capture(hipStream_t stream, const std::function<void(void *)> &body) {
        BENCH_HIP(hipStreamBeginCapture(stream, hipStreamCaptureModeThreadLocal));
        hipGraph_t graph = nullptr;
        try {
            body(static_cast<void *>(stream));
        } catch (...) {
            // End the capture so the stream is usable again, then report.
            if (hipStreamEndCapture(stream, &graph) == hipSuccess && graph) (void)hipGraphDestroy(graph);
            (void)hipGetLastError();
            throw;
        }
        BENCH_HIP(hipStreamEndCapture(stream, &graph));
        graphs_.push_back(graph);
        hipGraphExec_t exec = nullptr;
        BENCH_HIP(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0));
        exec_.push_back(exec);
    }
    hipGraphExec_t operator[](size_t i) const { return exec_[i]; }
    size_t size() const { return exec_.size(); }

private:
    std::vector<hipGraph_t> graphs_;
    std::vector<hipGraphExec_t> exec_;
};

class GpuDevice final : public Device {
public:
    explicit GpuDevice(int ordinal) {
        BENCH_HIP(hipSetDevice(ordinal));
        hipDeviceProp_t prop;
        BENCH_HIP(hipGetDeviceProperties(&prop, ordinal));
        name_ = prop.name;
        int l2 = 0, sms = 0;
        BENCH_HIP(hipDeviceGetAttribute(&l2, hipDeviceAttributeL2CacheSize, ordinal));
        BENCH_HIP(hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, ordinal));
        l2_ = l2 > 0 ? size_t(l2) : size_t(64) << 20;
        sms_ = sms > 0 ? sms : 1;
        size_t free_b = 0, total_b = 0;
        BENCH_HIP(hipMemGetInfo(&free_b, &total_b));
        free_at_start_ = free_b;
        BENCH_HIP(hipStreamCreate(&stream_));
    }
    ~GpuDevice() override {
        scratch_.reset();
        sink_.reset();
        if (stream_) {
            (void)hipStreamSynchronize(stream_);
            (void)hipStreamDestroy(stream_);
        }
    }

    bool is_gpu() const override { return true; }
    std::string name() const override { return name_; }
    size_t cache_bytes() const override { return l2_; }
    size_t rotation_budget_bytes() const override { return free_at_start_ / 3; }
    void *stream() override { return static_cast<void *>(stream_); }

    void *alloc(size_t bytes) override {
        void *p = nullptr;
        BENCH_HIP(hipMalloc(&p, std::max<size_t>(bytes, 256)));
        return p;
    }
    void release(void *p) noexcept override { (void)hipFree(p); }
    void upload(void *dst, const void *src, size_t bytes) override {
        BENCH_HIP(hipMemcpy(dst, src, bytes, hipMemcpyHostToDevice));
    }
    void download(void *dst, const void *src, size_t bytes) override {
        BENCH_HIP(hipStreamSynchronize(stream_));
        BENCH_HIP(hipMemcpy(dst, src, bytes, hipMemcpyDeviceToHost));
    }
    void copy(void *dst, const void *src, size_t bytes) override {
        BENCH_HIP(hipMemcpy(dst, src, bytes, hipMemcpyDeviceToDevice));
    }
    void fill(void *dst, int byte, size_t bytes) override {
        BENCH_HIP(hipMemsetAsync(dst, byte, bytes, stream_));
        BENCH_HIP(hipStreamSynchronize(stream_));
    }
    void synchronize() override { BENCH_HIP(hipStreamSynchronize(stream_)); }

    size_t read_bandwidth_buffer_bytes() const override {
        size_t bytes = std::max(4 * l2_, size_t(1) << 30);
        return std::min(bytes, std::max(4 * l2_, free_at_start_ / 4)) & ~size_t(255);
    }

    double read_bandwidth_gbs() override {
        if (bandwidth_ >= 0) return bandwidth_;
        const size_t bytes = read_bandwidth_buffer_bytes();
        Buffer data(*this, bytes);
        Buffer out(*this, read_sink_bytes());
        BENCH_HIP(hipMemsetAsync(data.get(), 0x5a, bytes, stream_));
        const int warmup = 3, runs = 15;
        Events ev(2 * size_t(runs));
        for (int i = 0; i < warmup; ++i) launch_read(data, out);
        for (int i = 0; i < runs; ++i) {
            BENCH_HIP(hipEventRecord(ev[2 * size_t(i)], stream_));
            launch_read(data, out);
            BENCH_HIP(hipEventRecord(ev[2 * size_t(i) + 1], stream_));
        }
        BENCH_HIP(hipEventSynchronize(ev[2 * size_t(runs) - 1]));
        std::vector<double> gbs;
        for (int i = 0; i < runs; ++i) gbs.push_back(double(bytes) / (elapsed_us(ev[2 * size_t(i)], ev[2 * size_t(i) + 1]) * 1e3));
        std::vector<uint32_t> sink(read_sink_bytes() / sizeof(uint32_t));
        download(sink.data(), out.get(), sink.size() * sizeof(uint32_t));
        bandwidth_ = median(gbs);
        return bandwidth_;
    }

    double empty_kernel_us() override {
        if (empty_kernel_us_ < 0)
            empty_kernel_us_ = median(time_each(5, 31, false, [&](int) {
                empty_kernel<<<1, 256, 0, stream_>>>();
                BENCH_HIP(hipGetLastError());
            }));
        return empty_kernel_us_;
    }

    std::vector<double> time_each(int warmup, int iters, bool flush, const std::function<void(int)> &body) override {
        for (int i = 0; i < warmup; ++i) body(i);
        Events ev(2 * size_t(iters));
        for (int i = 0; i < iters; ++i) {
            if (flush) flush_l2();
            BENCH_HIP(hipEventRecord(ev[2 * size_t(i)], stream_));
            body(warmup + i);
            BENCH_HIP(hipEventRecord(ev[2 * size_t(i) + 1], stream_));
        }
        BENCH_HIP(hipEventSynchronize(ev[2 * size_t(iters) - 1]));
        BENCH_HIP(hipGetLastError());
        std::vector<double> us;
        for (int i = 0; i < iters; ++i) us.push_back(elapsed_us(ev[2 * size_t(i)], ev[2 * size_t(i) + 1]));
        return us;
    }

    void set_dirty_flush(bool dirty) override { dirty_flush_ = dirty; }

    bool supports_graphs() const override { return true; }

    double time_graphs(int variants, int warmup, int iters, bool flush,
                       const std::function<void(int, void *)> &capture) override {
        BENCH_HIP(hipStreamSynchronize(stream_));
        Graphs graphs;
        for (int k = 0; k < variants; ++k) graphs.capture(stream_, [&](void *s) { capture(k, s); });
        const size_t nv = graphs.size();
        for (int i = 0; i < warmup; ++i) BENCH_HIP(hipGraphLaunch(graphs[size_t(i) % nv], stream_));
        std::vector<double> us;
        if (flush) {
            Events ev(2 * size_t(iters));
            for (int i = 0; i < iters; ++i) {
                flush_l2();
                BENCH_HIP(hipEventRecord(ev[2 * size_t(i)], stream_));
                BENCH_HIP(hipGraphLaunch(graphs[size_t(i) % nv], stream_));
                BENCH_HIP(hipEventRecord(ev[2 * size_t(i) + 1], stream_));
            }
            BENCH_HIP(hipEventSynchronize(ev[2 * size_t(iters) - 1]));
            for (int i = 0; i < iters; ++i) us.push_back(elapsed_us(ev[2 * size_t(i)], ev[2 * size_t(i) + 1]));
        } else {
            const int batches = 7;
            Events ev(2 * size_t(batches));
            for (int b = 0; b < batches; ++b) {
                BENCH_HIP(hipEventRecord(ev[2 * size_t(b)], stream_));
                for (int i = 0; i < iters; ++i) BENCH_HIP(hipGraphLaunch(graphs[size_t(i) % nv], stream_));
                BENCH_HIP(hipEventRecord(ev[2 * size_t(b) + 1], stream_));
            }
            BENCH_HIP(hipEventSynchronize(ev[2 * size_t(batches) - 1]));
            for (int b = 0; b < batches; ++b) us.push_back(elapsed_us(ev[2 * size_t(b)], ev[2 * size_t(b) + 1]) / iters);
        }
        BENCH_HIP(hipGetLastError());
        return median(us);
    }

private:
    // read_kernel over all of `data` (a multiple of 16 bytes); `out` takes
    // read_sink_bytes() of per-CTA results.
    int read_blocks() const { return sms_ * 4; }
    size_t read_sink_bytes() const { return size_t(read_blocks()) * sizeof(uint32_t); }
    void launch_read(const Buffer &data, const Buffer &out) {
        read_kernel<<<read_blocks(), 512, 0, stream_>>>(data.as<const uint4>(), data.size() / sizeof(uint4),
                                                        out.as<uint32_t>());
        BENCH_HIP(hipGetLastError());
    }

    // Evict the previous call's data from the L2 by reading a buffer twice
    // its size: the lines left behind are clean, as in the read-bandwidth
    // measurement, so the timed call pays for no write-back of the flush's
    // own data. A memset flush (dirty_flush_) leaves the L2 full of dirty
    // lines, whose write-back cost the flushed shapes ~10 us on an H100
    // (docs/performance.md, v15).
    void flush_l2() {
        if (!scratch_.get()) scratch_ = Buffer(*this, 2 * l2_);
        if (dirty_flush_) {
            BENCH_HIP(hipMemsetAsync(scratch_.get(), int(++flush_count_ & 0xff), scratch_.size(), stream_));
            return;
        }
        if (!sink_.get()) {
            BENCH_HIP(hipMemsetAsync(scratch_.get(), 0x5a, scratch_.size(), stream_));
            sink_ = Buffer(*this, read_sink_bytes());
        }
        launch_read(scratch_, sink_);
    }
    Buffer sink_;  // read_kernel's per-CTA results of the flush
    bool dirty_flush_ = false;

    std::string name_;
    size_t l2_ = 0;
    int sms_ = 1;
    size_t free_at_start_ = 0;
    hipStream_t stream_ = nullptr;
    double bandwidth_ = -1.0;
    double empty_kernel_us_ = -1.0;
    Buffer scratch_;
    unsigned flush_count_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_gpu_device(int device, std::string *why) {
    int count = 0;
    const hipError_t err = hipGetDeviceCount(&count);
    if (err != hipSuccess || count <= 0) {
        if (why)
            *why = err != hipSuccess ? std::string("no usable GPU: hipGetDeviceCount failed: ") + hipGetErrorString(err)
                                     : std::string("no GPU present");
        (void)hipGetLastError();
        return nullptr;
    }
    if (device >= count) {
        if (why) *why = "GPU " + std::to_string(device) + " does not exist (" + std::to_string(count) + " present)";
        return nullptr;
    }
    try {
        return std::unique_ptr<Device>(new GpuDevice(device));
    } catch (const Error &e) {
        if (why) *why = e.what();
        return nullptr;
    }
}

}  // namespace bench
