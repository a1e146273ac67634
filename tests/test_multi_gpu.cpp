// Tensor parallelism over two GPUs: the 128 query heads of one problem split
// into two plans of 64 heads, one per device, run concurrently from two host
// threads, must give exactly the bits of one 128-head plan on GPU 0.
//
// Exits 77 (skipped) when fewer than two GPUs are usable. Otherwise, for
// q_len {1, 2} x KV {bf16, fp8_e4m3} (q bf16, page_size 64, a ragged batch of
// 32 sequences with kv_len 0..4000 and a shuffled page table, random data):
//   (a) one plan, 128 heads, device 0, MLA_FLAG_DETERMINISTIC;
//   (b) two plans, 64 heads each, desc.device = 0 and 1, MLA_FLAG_DETERMINISTIC,
//       each created and run by its own std::thread on its own stream, with
//       its own copies of the KV cache, the page table and a dense q buffer
//       [total_q, 64, 576] holding its heads' slice of q;
//   the two [total_q, 64, 512] outputs (and [total_q, 64] lse) are gathered
//   into [total_q, 128, ...] and compared with (a) BITWISE: under
//   MLA_FLAG_DETERMINISTIC a sequence's split boundaries depend only on its own
//   length, and the row tile (64 rows) and heads per work item are the same
//   for 64 and 128 heads, so every head's arithmetic is the same.
// Each thread makes the OTHER GPU its current device before touching its plan
// (the plan lives on desc.device) and checks that mla_plan_create,
// mla_plan_build_metadata, mla_plan_execute and mla_plan_destroy leave the
// calling thread's current device as they found it.
// One sequence of each case (the longest, so it is split) is cross-checked
// against the CPU backend (num_threads 0) with the GPU-vs-CPU tolerance of
// test_gpu.cpp:
//     |gpu - cpu| <= (2^-7 + 2^-15 * smag) * max|V| + 2^-6 * |cpu|
//     |lse_gpu - lse_cpu| <= 5e-4 + 2^-15 * smag + 5e-4 * |lse_cpu|
// Outputs are poisoned (0xff bytes = bf16 / f32 NaN) and surrounded by guard
// bytes: both sides must write every row (no NaN left) and no guard byte.
//
// The last line is a summary.
#include <mla.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "devmem.h"
#include "reference.h"
#include "gpu_harness.h"
#include "testutil.h"

#if !defined(DM_HAVE_GPU)

int main() {
    std::printf("test_multi_gpu: built without a GPU runtime (define MLA_GPU_NVIDIA or MLA_GPU_AMD): skipped\n");
    return 77;
}

#else

namespace {

constexpr int kDQK = MLA_HEAD_DIM_QK;
constexpr int kDV = MLA_HEAD_DIM_V;
constexpr int kHeads = 128;
constexpr int kGpus = 2;
constexpr int kHeadsPerGpu = kHeads / kGpus;
constexpr int kPage = 64;
constexpr int kBatch = 32;
constexpr int kMaxLen = 4000;
constexpr size_t kGuard = 256;
const tu_tol kTol = {0x1p-6, 0x1p-7, 5e-4, 5e-4, 0x1p-15};

// ---- harness ------------------------------------------------------------------

using gpu_harness::Failure;
using gpu_harness::strf;

struct Stats {
    int cases = 0;
    size_t bitwise_rows = 0, cpu_rows = 0;
    std::atomic<int> device_checks{0};
    double worst_ratio = 0, worst_abs = 0, worst_lse = 0;
};
Stats g_stats;

int current_device() {
    int d = -1;
    DM_CHECK(DM_(GetDevice)(&d));
    return d;
}

// Run one libmla call and require that the calling thread's current device is
// the same afterwards.
#define MLA_CHECK_KEEPS_DEVICE(call)                                                                            \
    do {                                                                                                         \
        const int before_ = current_device();                                                                    \
        MLA_CHECK(call);                                                                                         \
        const int after_ = current_device();                                                                     \
        REQUIRE(after_ == before_, "%s changed the thread's current device from %d to %d", #call, before_, after_); \
        g_stats.device_checks++;                                                                                 \
    } while (0)

// ---- host data -------------------------------------------------------------------

struct Case {
    int q_len;
    mla_dtype kv;
    std::string name() const { return strf("q_len=%d q=bf16 kv=%s heads=%d page=%d", q_len, tu_dtype_name(kv), kHeads, kPage); }
};

// One step's batch and one layer's data (all 128 heads), on the host.
struct Host {
    tu_batch b{};
    tu_kv kv{};
    tu_buf q{};
    size_t q_bytes = 0;  // [total_q, 128, 576] bf16
    Host() = default;
    ~Host() {
        tu_batch_free(&b);
        tu_kv_free(&kv);
        tu_buf_free(&q);
    }
    Host(const Host &) = delete;
    Host &operator=(const Host &) = delete;
    size_t rows(int heads) const { return size_t(b.total_q) * size_t(heads); }
    size_t kv_bytes() const { return size_t(kv.num_pages) * size_t(kv.page_size) * kv.row_bytes; }
};

void make_host(Host &h, const Case &c, tu_rng *rng, int *longest) {
    std::vector<int> kv_lens(kBatch);
    tu_random_kv_lens(rng, kBatch, 1500, 0.25, kMaxLen, kv_lens.data());
    // The long end is always there (4 deterministic splits), at a random place.
    const int at = tu_range(rng, 0, kBatch - 1);
    kv_lens[size_t(at)] = tu_range(rng, kMaxLen - 100, kMaxLen);
    *longest = at;
    const std::vector<int> q_lens(kBatch, c.q_len);
    REQUIRE(tu_batch_make(&h.b, kBatch, q_lens.data(), kv_lens.data(), kPage, 1, 7, rng) == 0, "tu_batch_make");
    REQUIRE(tu_kv_make(&h.kv, c.kv, &h.b, 0, rng) == 0, "tu_kv_make");
    REQUIRE(tu_q_make(&h.q, MLA_DTYPE_BF16, h.b.total_q, kHeads, 1.0 + 2.0 * tu_uniform(rng), rng) == 0, "tu_q_make");
    h.q_bytes = h.rows(kHeads) * kDQK * 2;
}

// q[:, first:first+heads, :] as a dense [total_q, heads, 576] array.
std::vector<unsigned char> q_slice(const Host &h, int first, int heads) {
    const size_t row = size_t(kDQK) * 2;
    std::vector<unsigned char> s(size_t(h.b.total_q) * size_t(heads) * row);
    for (int t = 0; t < h.b.total_q; ++t)
        std::memcpy(s.data() + size_t(t) * size_t(heads) * row,
                    h.q.data + (size_t(t) * kHeads + size_t(first)) * row, size_t(heads) * row);
    return s;
}

// ---- plans -------------------------------------------------------------------------

mla_plan_desc desc_for(const Case &c, int heads, mla_backend backend, int device, int max_batch) {
    mla_plan_desc d;
    mla_plan_desc_init(&d);
    d.num_heads = heads;
    d.q_dtype = MLA_DTYPE_BF16;
    d.kv_dtype = c.kv;
    d.page_size = kPage;
    d.max_q_len = c.q_len;
    d.max_batch_size = max_batch;
    d.flags = MLA_FLAG_DETERMINISTIC;
    d.backend = backend;
    d.device = device;
    d.num_threads = 0;
    return d;
}

struct Plan {
    mla_plan *p = nullptr;
    Plan() = default;
    explicit Plan(const mla_plan_desc &d) { MLA_CHECK(mla_plan_create(&d, &p)); }
    ~Plan() { mla_plan_destroy(p); }
    Plan(const Plan &) = delete;
    Plan &operator=(const Plan &) = delete;
};

// ---- device data -------------------------------------------------------------------

// A device output with guard bytes (0xa5) around poisoned data (0xff), on the
// current device.
struct DevOut {
    dm::buffer raw;
    size_t n;
    explicit DevOut(size_t bytes) : raw(bytes + 2 * kGuard), n(bytes) {}
    void *data() const { return raw.as<unsigned char>() + kGuard; }
    void poison() {
        dm::fill(raw.get(), 0xa5, raw.size());
        dm::fill(data(), 0xff, n);
    }
    // Copy back; throws when a guard byte changed.
    std::vector<unsigned char> fetch(const char *what) const {
        std::vector<unsigned char> all(raw.size());
        dm::d2h(all.data(), raw.get(), all.size());
        for (size_t i = 0; i < kGuard; ++i)
            REQUIRE(all[i] == 0xa5 && all[kGuard + n + i] == 0xa5, "%s: a guard byte around the output changed", what);
        return std::vector<unsigned char>(all.begin() + long(kGuard), all.begin() + long(kGuard + n));
    }
};

struct Result {
    std::vector<uint16_t> out;  // [total_q, heads, 512]
    std::vector<float> lse;     // [total_q, heads]
};

mla_tensors tensors_for(const Host &h, const void *q, const void *kv, const int32_t *indices, void *out, float *lse) {
    mla_tensors t;
    mla_tensors_init(&t);
    t.q = q;
    t.kv = kv;
    t.kv_indices = indices;
    t.out = out;
    t.lse = lse;
    t.kv_scale = h.kv.kv_scale;
    t.num_pages = h.b.num_pages;
    return t;
}

// Inputs of one device: q (all heads or a slice), KV cache, page table.
struct DevInputs {
    dm::buffer q, kv, indices;
    DevInputs(const Host &h, const void *q_host, size_t q_bytes)
        : q(q_host, q_bytes), kv(h.kv.data.data, h.kv_bytes()), indices(h.b.kv_indices, size_t(h.b.num_pages) * 4) {}
};

// Outputs of one run, copied back; every row must have been written.
Result fetch_result(const DevOut &out, const DevOut &lse, size_t rows, const char *what) {
    Result r;
    const std::vector<unsigned char> o = out.fetch(what), l = lse.fetch(what);
    r.out.resize(rows * kDV);
    r.lse.resize(rows);
    std::memcpy(r.out.data(), o.data(), rows * kDV * 2);
    std::memcpy(r.lse.data(), l.data(), rows * 4);
    const size_t nan_out = tu_count_bf16_nan(r.out.data(), r.out.size()), nan_lse = tu_count_f32_nan(r.lse.data(), rows);
    REQUIRE(nan_out == 0 && nan_lse == 0, "%s: %zu out / %zu lse values unwritten (still NaN)", what, nan_out, nan_lse);
    return r;
}

// (a): one 128-head plan on GPU 0, from the calling thread.
Result run_single(const Case &c, const Host &h) {
    dm::set_device(0);
    const size_t rows = h.rows(kHeads);
    DevInputs in(h, h.q.data, h.q_bytes);
    DevOut out(rows * kDV * 2), lse(rows * 4);
    out.poison();
    lse.poison();
    dm::stream_t stream = dm::stream_create();
    Result r;
    {
        Plan plan(desc_for(c, kHeads, MLA_BACKEND_GPU, 0, kBatch));
        mla_batch b;
        tu_batch_to_mla(&h.b, 0, &b);
        MLA_CHECK(mla_plan_build_metadata(plan.p, &b, stream));
        const mla_tensors t = tensors_for(h, in.q.get(), in.kv.get(), in.indices.as<int32_t>(), out.data(),
                                          static_cast<float *>(lse.data()));
        MLA_CHECK(mla_plan_execute(plan.p, &t, stream));
        dm::stream_sync(stream);
        r = fetch_result(out, lse, rows, "128-head plan on GPU 0");
    }
    dm::stream_destroy(stream);
    return r;
}

// Both threads start their libmla calls together (and a thread that failed
// early still arrives, so the other never waits forever).
class Gate {
public:
    explicit Gate(int n) : n_(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m_);
        if (++count_ >= n_) cv_.notify_all();
        cv_.wait(lock, [this] { return count_ >= n_; });
    }
    void arrive() {
        std::lock_guard<std::mutex> lock(m_);
        if (++count_ >= n_) cv_.notify_all();
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, count_ = 0;
};

struct Half {
    Result r;
    std::string error;  // empty on success
};

// (b), one thread: plan with 64 heads on `device`, driven while the thread's
// current device is the other GPU.
void run_half(const Case &c, const Host &h, int device, Gate &gate, Half &half) {
    bool arrived = false;
    try {
        const int other = (device + 1) % kGpus;
        const size_t rows = h.rows(kHeadsPerGpu);
        dm::set_device(device);
        const std::vector<unsigned char> q = q_slice(h, device * kHeadsPerGpu, kHeadsPerGpu);
        DevInputs in(h, q.data(), q.size());
        DevOut out(rows * kDV * 2), lse(rows * 4);
        out.poison();
        lse.poison();
        dm::stream_t stream = dm::stream_create();

        dm::set_device(other);
        REQUIRE(current_device() == other, "cudaSetDevice(%d) did not take", other);
        mla_plan *plan = nullptr;
        const mla_plan_desc d = desc_for(c, kHeadsPerGpu, MLA_BACKEND_GPU, device, kBatch);
        MLA_CHECK_KEEPS_DEVICE(mla_plan_create(&d, &plan));
        arrived = true;
        gate.arrive_and_wait();
        try {
            mla_batch b;
            tu_batch_to_mla(&h.b, 0, &b);
            MLA_CHECK_KEEPS_DEVICE(mla_plan_build_metadata(plan, &b, stream));
            const mla_tensors t = tensors_for(h, in.q.get(), in.kv.get(), in.indices.as<int32_t>(), out.data(),
                                              static_cast<float *>(lse.data()));
            MLA_CHECK_KEEPS_DEVICE(mla_plan_execute(plan, &t, stream));
            REQUIRE(current_device() == other, "current device is %d after execute, was %d", current_device(), other);
            dm::stream_sync(stream);
        } catch (...) {
            dm::set_device(device);
            (void)DM_(DeviceSynchronize)();
            mla_plan_destroy(plan);
            throw;
        }
        const int before = current_device();
        mla_plan_destroy(plan);
        REQUIRE(current_device() == before, "mla_plan_destroy changed the current device from %d to %d", before,
                current_device());
        g_stats.device_checks++;

        dm::set_device(device);
        half.r = fetch_result(out, lse, rows, device == 0 ? "64-head plan on GPU 0" : "64-head plan on GPU 1");
        dm::stream_destroy(stream);
    } catch (const std::exception &e) {
        half.error = strf("thread for GPU %d: %s", device, e.what());
        if (!arrived) gate.arrive();
    }
}

// The longest sequence alone on the CPU backend (its own one-sequence batch over
// the same KV cache and page table) against the GPU result.
void check_against_cpu(const Case &c, const Host &h, int seq, const Result &gpu) {
    const int q0 = h.b.qo_indptr[seq], n = h.b.q_lens[seq];
    const int p0 = h.b.kv_indptr[seq], pages = h.b.kv_indptr[seq + 1] - p0;
    const int32_t qo[2] = {0, n}, kvp[2] = {0, pages}, last[1] = {h.b.kv_last_page_len[seq]};
    const size_t rows = size_t(n) * kHeads, first = size_t(q0) * kHeads;

    Plan cpu(desc_for(c, kHeads, MLA_BACKEND_CPU, 0, 1));
    mla_batch b;
    mla_batch_init(&b);
    b.batch_size = 1;
    b.qo_indptr = qo;
    b.kv_indptr = kvp;
    b.kv_last_page_len = last;
    std::vector<uint16_t> out(rows * kDV, 0xffff);
    std::vector<float> lse(rows, std::nanf(""));
    MLA_CHECK(mla_plan_build_metadata(cpu.p, &b, nullptr));
    const mla_tensors t =
        tensors_for(h, h.q.data + first * kDQK * 2, h.kv.data.data, h.b.kv_indices + p0, out.data(), lse.data());
    MLA_CHECK(mla_plan_execute(cpu.p, &t, nullptr));

    std::vector<double> vmax(h.rows(kHeads) + 1), smag(h.rows(kHeads) + 1);
    REQUIRE(tu_row_bounds(&h.b, &h.kv, h.q.data, MLA_DTYPE_BF16, 0.0f, kHeads, 0.0f, vmax.data(), smag.data()) == 0,
            "tu_row_bounds");
    const std::string what = strf("%s: sequence %d (kv_len %d) vs CPU", c.name().c_str(), seq, h.b.kv_lens[seq]);
    tu_cmp cmp;
    tu_cmp_init(&cmp);
    const size_t bad = tu_compare_lib(what.c_str(), gpu.out.data() + first * kDV, gpu.lse.data() + first, out.data(),
                                      lse.data(), vmax.data() + first, smag.data() + first, rows, &kTol, &cmp, 6);
    g_stats.cpu_rows += cmp.rows;
    g_stats.worst_ratio = std::max(g_stats.worst_ratio, cmp.worst_ratio);
    g_stats.worst_abs = std::max(g_stats.worst_abs, cmp.worst_abs);
    g_stats.worst_lse = std::max(g_stats.worst_lse, cmp.worst_lse);
    REQUIRE(bad == 0, "%s: %zu out / %zu lse values out of tolerance, %zu rows unwritten (worst %.3g of tol)",
            what.c_str(), cmp.bad_out, cmp.bad_lse, cmp.unwritten, cmp.worst_ratio);
}

void run_case(const Case &c, uint64_t salt) {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ salt);
    Host h;
    int longest = 0;
    make_host(h, c, &rng, &longest);

    const Result single = run_single(c, h);

    Gate gate(kGpus);
    Half halves[kGpus];
    std::vector<std::thread> threads;
    for (int d = 0; d < kGpus; ++d)
        threads.emplace_back(run_half, std::cref(c), std::cref(h), d, std::ref(gate), std::ref(halves[d]));
    for (std::thread &t : threads) t.join();
    for (const Half &half : halves) REQUIRE(half.error.empty(), "%s", half.error.c_str());

    // Gather [total_q, 64, *] x 2 into [total_q, 128, *].
    const size_t total_q = size_t(h.b.total_q);
    Result split;
    split.out.resize(h.rows(kHeads) * kDV);
    split.lse.resize(h.rows(kHeads));
    for (int d = 0; d < kGpus; ++d)
        for (size_t t = 0; t < total_q; ++t) {
            const size_t dst = t * kHeads + size_t(d) * kHeadsPerGpu, src = t * kHeadsPerGpu;
            std::memcpy(split.out.data() + dst * kDV, halves[d].r.out.data() + src * kDV,
                        size_t(kHeadsPerGpu) * kDV * 2);
            std::memcpy(split.lse.data() + dst, halves[d].r.lse.data() + src, size_t(kHeadsPerGpu) * 4);
        }

    const size_t rows = h.rows(kHeads);
    if (std::memcmp(split.out.data(), single.out.data(), rows * kDV * 2) != 0 ||
        std::memcmp(split.lse.data(), single.lse.data(), rows * 4) != 0) {
        size_t bad_rows = 0, first = rows;
        int first_elem = -1;
        for (size_t r = 0; r < rows; ++r) {
            const bool out_ne = std::memcmp(split.out.data() + r * kDV, single.out.data() + r * kDV, kDV * 2) != 0;
            const bool lse_ne = std::memcmp(&split.lse[r], &single.lse[r], 4) != 0;
            if (!out_ne && !lse_ne) continue;
            if (!bad_rows++) {
                first = r;
                for (int e = 0; e < kDV && out_ne; ++e)
                    if (split.out[r * kDV + size_t(e)] != single.out[r * kDV + size_t(e)]) {
                        first_elem = e;
                        break;
                    }
            }
        }
        const size_t tok = first / kHeads;
        int seq = 0;
        while (seq + 1 < h.b.batch_size && h.b.qo_indptr[seq + 1] <= int(tok)) ++seq;
        REQUIRE(false,
                "%s: 2 x 64 heads on 2 GPUs != 128 heads on GPU 0 in %zu of %zu rows; first: token %zu (sequence %d, "
                "kv_len %d) head %zu, %s (split 0x%04x / %.9g vs single 0x%04x / %.9g)",
                c.name().c_str(), bad_rows, rows, tok, seq, h.b.kv_lens[seq], first % kHeads,
                first_elem >= 0 ? strf("out element %d", first_elem).c_str() : "lse",
                first_elem >= 0 ? unsigned(split.out[first * kDV + size_t(first_elem)]) : 0u,
                double(split.lse[first]), first_elem >= 0 ? unsigned(single.out[first * kDV + size_t(first_elem)]) : 0u,
                double(single.lse[first]));
    }
    g_stats.bitwise_rows += rows;

    check_against_cpu(c, h, longest, single);
    g_stats.cases++;
}

}  // namespace

int main() {
    const int devices = mla_gpu_device_count();
    const int runtime_devices = dm::device_count();
    if (devices < kGpus || runtime_devices < kGpus) {
        std::printf("test_multi_gpu: need %d GPUs, found %d: skipping\n", kGpus, std::min(devices, runtime_devices));
        return 77;
    }
    tu_seed();
    std::printf("test_multi_gpu: %d GPU(s); 128 heads on GPU 0 vs 2 x 64 heads on GPUs 0 and 1\n", devices);

    const Case cases[] = {
        {1, MLA_DTYPE_BF16},
        {2, MLA_DTYPE_BF16},
        {1, MLA_DTYPE_FP8_E4M3},
        {2, MLA_DTYPE_FP8_E4M3},
    };
    int failed = 0, index = 0;
    for (const Case &c : cases) {
        const std::string name = c.name();
        std::printf("[ RUN      ] %s\n", name.c_str());
        std::fflush(stdout);
        try {
            run_case(c, 0x6d756c7469ull + uint64_t(index++));
            std::printf("[       OK ] %s\n", name.c_str());
        } catch (const std::exception &e) {
            ++failed;
            std::printf("[  FAILED  ] %s: %s\n", name.c_str(), e.what());
            tu_print_seed();
            // Leave both devices idle before the next case.
            for (int d = 0; d < kGpus; ++d) {
                (void)DM_(SetDevice)(d);
                (void)DM_(DeviceSynchronize)();
            }
        }
        std::fflush(stdout);
    }
    const int total = int(sizeof cases / sizeof cases[0]);
    std::printf("test_multi_gpu summary: %d/%d cases passed; %zu rows bitwise equal (2 x 64 heads on 2 GPUs vs 128 "
                "heads on GPU 0, out and lse); %d current-device checks; CPU cross-check %zu rows, worst out error "
                "%.3f of tolerance (|err| %.3g), worst |lse err| %.3g\n",
                total - failed, total, g_stats.bitwise_rows, g_stats.device_checks.load(), g_stats.cpu_rows,
                g_stats.worst_ratio, g_stats.worst_abs, g_stats.worst_lse);
    return failed ? 1 : 0;
}

#endif  // DM_HAVE_GPU
