// mla-bench: the host "device" for CPU-backend runs. Buffers are host memory,
// calls are timed with the wall clock and the read bandwidth is measured by a
// plain multi-threaded read loop.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "bench_device.h"

namespace bench {

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) {
                size_t b = line.find_first_not_of(" \t", colon + 1);
                return b == std::string::npos ? "cpu" : line.substr(b);
            }
        }
    }
    return "cpu";
}

class HostDevice final : public Device {
public:
    HostDevice() : threads_(std::max(1u, std::thread::hardware_concurrency())) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        size_t c = l3 > 0 ? size_t(l3) : l2 > 0 ? size_t(l2) : size_t(32) << 20;
        // Virtual machines report anything here (often the whole socket's
        // L3); one core complex sees at most a few tens of MiB, and the CPU
        // backend is compute bound, so a bounded figure keeps runs short.
        cache_ = std::min(c, size_t(32) << 20);
    }

    bool is_gpu() const override { return false; }
    std::string name() const override { return cpu_model() + " (" + std::to_string(threads_) + " threads)"; }
    size_t cache_bytes() const override { return cache_; }
    size_t rotation_budget_bytes() const override { return size_t(1) << 30; }
    void *stream() override { return nullptr; }

    void *alloc(size_t bytes) override {
        void *p = nullptr;
        if (posix_memalign(&p, 256, std::max<size_t>(bytes, 256)) != 0 || !p)
            throw Error("host allocation of " + std::to_string(bytes) + " bytes failed");
        return p;
    }
    void release(void *p) noexcept override { std::free(p); }
    void upload(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void download(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void copy(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void fill(void *dst, int byte, size_t bytes) override { std::memset(dst, byte, bytes); }
    void synchronize() override {}

    size_t read_bandwidth_buffer_bytes() const override { return std::max(4 * cache_, size_t(256) << 20); }

    double read_bandwidth_gbs() override {
        if (bandwidth_ >= 0) return bandwidth_;
        const size_t bytes = read_bandwidth_buffer_bytes();
        const size_t words = bytes / sizeof(uint64_t);
        Buffer buf(*this, words * sizeof(uint64_t));
        uint64_t *data = buf.as<uint64_t>();
        for (size_t i = 0; i < words; ++i) data[i] = i * 0x9e3779b97f4a7c15ull;
        std::vector<double> runs;
        std::atomic<uint64_t> sink{0};
        for (int rep = 0; rep < 7; ++rep) {
            const auto t0 = Clock::now();
            std::vector<std::thread> pool;
            for (int t = 0; t < threads_; ++t) {
                pool.emplace_back([&, t] {
                    const size_t begin = words * size_t(t) / size_t(threads_);
                    const size_t end = words * size_t(t + 1) / size_t(threads_);
                    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
                    size_t i = begin;
                    for (; i + 4 <= end; i += 4) {
                        a0 += data[i]; a1 ^= data[i + 1]; a2 += data[i + 2]; a3 ^= data[i + 3];
                    }
                    for (; i < end; ++i) a0 += data[i];
                    sink.fetch_add(a0 + a1 + a2 + a3, std::memory_order_relaxed);
                });
            }
            for (std::thread &th : pool) th.join();
            const double us = micros_since(t0);
            if (rep > 0) runs.push_back(double(words * sizeof(uint64_t)) / (us * 1e3));  // first run: warm-up
        }
        if (sink.load() == 0x5eed) std::fputs("", stderr);  // keep the reads observable
        bandwidth_ = median(runs);
        return bandwidth_;
    }

    std::vector<double> time_each(int warmup, int iters, bool flush, const std::function<void(int)> &body) override {
        for (int i = 0; i < warmup; ++i) body(i);
        std::vector<double> us;
        us.reserve(size_t(iters));
        for (int i = 0; i < iters; ++i) {
            if (flush) flush_cache();
            const auto t0 = Clock::now();
            body(warmup + i);
            us.push_back(micros_since(t0));
        }
        return us;
    }

    bool supports_graphs() const override { return false; }
    double time_graphs(int, int, int, bool, const std::function<void(int, void *)> &) override {
        throw Error("graphs need a GPU");
    }

private:
    void flush_cache() {
        if (!scratch_.get()) scratch_ = Buffer(*this, cache_);
        std::memset(scratch_.get(), int(++flush_count_ & 0xff), scratch_.size());
    }

    int threads_;
    size_t cache_;
    double bandwidth_ = -1.0;
    Buffer scratch_;
    unsigned flush_count_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_host_device() { return std::unique_ptr<Device>(new HostDevice()); }

#if !defined(MLA_BENCH_GPU)
std::unique_ptr<Device> make_gpu_device(int, std::string *why) {
    if (why) *why = "this mla-bench was built without GPU support (gpu_backend = none)";
    return nullptr;
}
#endif

}  // namespace bench
