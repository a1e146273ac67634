// GPU backend against the CPU backend.
//
// Exits 77 (skipped) when no GPU is usable. Otherwise runs:
//   invalid_device        desc.device = mla_gpu_device_count() is refused
//   auto_backend          MLA_BACKEND_AUTO resolves to the GPU
//   decoding_exact        one key per sequence (softmax weight 1): every code of
//                         every KV format comes out bitwise as on the CPU
//   rising_scores         running maxima that move mid-sequence (rescales)
//   mxfp4_scale_layouts   MXFP4 scale rows at every byte misalignment, strides
//                         18 / 19 / 21 / 24, behind shuffled one-token pages
//   nan_keys              the NaN rule: a NaN or inf in a visible key makes the
//                         rows that see it NaN (out and lse), split or not;
//                         every other row is clean and right
//   random_configs        >= 300 fresh random configurations (MLA_GPU_TEST_CONFIGS
//                         changes the count): every dtype pair, heads
//                         {16,32,64,128}, q_len {1,2,4}, page {1,16,64}, ragged
//                         batches up to 256 sequences with kv_len 0..20000,
//                         explicit / identity page tables, logit cap, forced /
//                         auto splits, deterministic flag, lse NULL / not, host /
//                         device metadata, default / created stream
//   device_metadata       metadata from device arrays == metadata from host arrays
//                         (bitwise)
//   graph_capture         build_metadata (device arrays) + 3 executes captured in
//                         a graph, replayed; lengths changed in the device arrays,
//                         replayed again; then the same with host-built metadata
//                         outside the graph, the second step with many more
//                         items than the captured one; every replay checked
//                         against the CPU
//   many_items            far more work items than resident CTAs, items of
//                         0 / 1 / many tiles, three executes on one metadata
//                         build (host and device): all checked, bitwise equal
//   determinism           MLA_FLAG_DETERMINISTIC: a sequence is bitwise identical
//                         alone, in other batches, and across runs
//   validate_device_inputs  MLA_FLAG_VALIDATE_DEVICE_INPUTS reports bad
//                         device-resident indptr / last_page_len / page indices
//                         (explicit and identity tables) with a status
//   long_sequence         one sequence of 1,000,000 tokens (bf16) and of
//                         1,000,007 tokens (mxfp4, q_len 2)
//   large_pool            the batch's pages past 4.5 GiB of a larger pool
//                         (64-bit offsets), bf16 / fp8 / mxfp4
// MLA_GPU_TEST_ONLY=a,b runs only the named tests. Built as test_gpu_emulated
// it runs on the CPU emulation of the GPU (src/gpu/emulated.h): 80 configs by
// default, graph_capture / long_sequence / large_pool skipped.
// Outputs are poisoned (0xff bytes = bf16 / f32 NaN) and surrounded by guard
// bytes; every row is checked, and the guards must be intact.
//
// Tolerance, GPU vs CPU (both float32-accumulating on the same dequantized
// inputs):
//     |gpu - cpu| <= (2^-7 + 2^-15 * smag) * max|V| + 2^-6 * |cpu|
//     |lse_gpu - lse_cpu| <= 5e-4 + 2^-15 * smag + 5e-4 * |lse_cpu|
// The GPU rounds the softmax weights P to bf16 before the PV product: each
// weight carries up to 2^-9 relative error, so the output moves by up to
// ~2^-9 * max|V| (its weights sum to 1); both results are then rounded to
// bf16 (2^-8 relative each). rtol 2^-6 covers the two bf16 roundings with
// margin, atol 2^-7 * max|V| covers P's rounding 4x. Both sides' scores carry
// float32 rounding error proportional to smag = sm_scale * |q| * max|K| (see
// reference.h), hence the 2^-15 * smag terms. The lse bound allows for fast
// exp2 / log2 on the GPU.
//
// The last line is a summary: configurations, rows, failures, worst error.
#include <mla.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "devmem.h"
#include "reference.h"
#include "gpu_harness.h"
#include "testutil.h"

#if !defined(DM_HAVE_GPU)

int main() {
    std::printf("test_gpu: built without a GPU runtime (define MLA_GPU_NVIDIA or MLA_GPU_AMD): skipped\n");
    return 77;
}

#else

namespace {

constexpr int kDV = MLA_HEAD_DIM_V;
// Against the CPU emulation of the GPU (libmla_emulated, CI): fewer and
// smaller configurations, no graphs, no million-token or 4 GiB cases.
#if defined(MLA_GPU_EMULATED)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif
// (row x key) work units of one random configuration, checked by the CPU backend.
constexpr double kConfigBudget = kEmulated ? 2.5e5 : 2.5e6;
constexpr size_t kGuard = 256;
const tu_tol kTol = {0x1p-6, 0x1p-7, 5e-4, 5e-4, 0x1p-15};

// ---- harness ------------------------------------------------------------------

using gpu_harness::Failure;
using gpu_harness::strf;

struct Stats {
    int configs = 0, failed = 0, pairs_seen = 0, max_batch = 0, max_kv = 0;
    size_t rows = 0;
    double worst_ratio = 0, worst_abs = 0, worst_lse_ratio = 0;
    std::string worst_where;
    void add(const tu_cmp &c, const std::string &where) {
        rows += c.rows;
        if (c.worst_ratio > worst_ratio) {
            worst_ratio = c.worst_ratio;
            worst_where = where;
        }
        worst_abs = std::max(worst_abs, c.worst_abs);
        worst_lse_ratio = std::max(worst_lse_ratio, c.worst_lse_ratio);
    }
};
Stats g_stats;

// ---- host data -------------------------------------------------------------------

struct HostBuf {
    tu_buf b{};
    HostBuf() = default;
    explicit HostBuf(size_t n) {
        if (tu_buf_alloc(&b, n)) throw Failure("host allocation failed");
    }
    ~HostBuf() { tu_buf_free(&b); }
    HostBuf(const HostBuf &) = delete;
    HostBuf &operator=(const HostBuf &) = delete;
    unsigned char *data() const { return b.data; }
    size_t size() const { return b.size; }
};

// One step's batch and one layer's data, on the host.
struct Host {
    tu_batch b{};
    tu_kv kv{};
    tu_buf q{};
    float q_scale = 0;
    size_t scale_misalign = 0;  // MXFP4: device scales start this many bytes past an aligned address
    Host() = default;
    ~Host() {
        tu_batch_free(&b);
        tu_kv_free(&kv);
        tu_buf_free(&q);
    }
    Host(const Host &) = delete;
    Host &operator=(const Host &) = delete;
    size_t rows(int heads) const { return size_t(b.total_q) * size_t(heads); }
};

struct Shape {
    mla_dtype q = MLA_DTYPE_BF16, kv = MLA_DTYPE_BF16;
    int heads = 16, max_q_len = 1, page = 16, splits = 0, max_batch = 0;
    uint32_t flags = 0;
    float sm_scale = 0, logit_cap = 0;
    std::string name() const {
        return strf("q=%s kv=%s heads=%d q_len<=%d page=%d splits=%d%s%s", tu_dtype_name(q), tu_dtype_name(kv), heads,
                    max_q_len, page, splits, logit_cap > 0 ? " cap" : "",
                    (flags & MLA_FLAG_DETERMINISTIC) ? " det" : "");
    }
};

void make_host(Host &h, const Shape &s, const std::vector<int> &q_lens, const std::vector<int> &kv_lens,
               bool explicit_pages, int spare_pages, tu_rng *rng, int extra_capacity_pages = 0) {
    const int n = int(q_lens.size());
    REQUIRE(tu_batch_make(&h.b, n, q_lens.data(), kv_lens.data(), s.page, explicit_pages ? 1 : 0,
                          spare_pages + extra_capacity_pages, rng) == 0,
            "tu_batch_make");
    // MXFP4 scales at any byte alignment: strides other than 18 and a shifted
    // base reach every misalignment of a row's first scale byte.
    static const int kStrides[] = {0, 0, 19, 21, 24};
    const int stride = s.kv == MLA_DTYPE_MXFP4 ? kStrides[tu_range(rng, 0, 4)] : 0;
    h.scale_misalign = s.kv == MLA_DTYPE_MXFP4 ? size_t(tu_range(rng, 0, 3)) : 0;
    REQUIRE(tu_kv_make(&h.kv, s.kv, &h.b, stride, rng) == 0, "tu_kv_make");
    REQUIRE(tu_q_make(&h.q, s.q, h.b.total_q, s.heads, 1.0 + 2.0 * tu_uniform(rng), rng) == 0, "tu_q_make");
    h.q_scale = s.q == MLA_DTYPE_BF16 ? 0.0f : tu_rand_fp8_scale(rng);
}

// ---- plans -------------------------------------------------------------------------

struct Plan {
    mla_plan *p = nullptr;
    Plan() = default;
    Plan(const Shape &s, mla_backend backend) {
        mla_plan_desc d;
        mla_plan_desc_init(&d);
        d.num_heads = s.heads;
        d.q_dtype = s.q;
        d.kv_dtype = s.kv;
        d.page_size = s.page;
        d.max_q_len = s.max_q_len;
        d.max_batch_size = s.max_batch;
        d.sm_scale = s.sm_scale;
        d.logit_cap = s.logit_cap;
        d.num_splits = s.splits;
        d.flags = s.flags;
        d.backend = backend;
        d.device = 0;
        d.num_threads = 0;
        MLA_CHECK(mla_plan_create(&d, &p));
    }
    ~Plan() { mla_plan_destroy(p); }
    Plan(const Plan &) = delete;
    Plan &operator=(const Plan &) = delete;
};

// ---- device copies -------------------------------------------------------------------

// Device copy of a Host (inputs and batch arrays). Sized at construction;
// update() re-uploads a Host that fits in the same buffers (graph replays).
struct Dev {
    dm::buffer q, kv, scales, indices, qo, kvp, last;
    size_t scale_misalign;
    unsigned char *scale_ptr() const { return scales.as<unsigned char>() + scale_misalign; }
    Dev(const Host &h, size_t q_cap = 0, size_t kv_cap = 0, size_t idx_cap = 0)
        : q(std::max(h.q.size, q_cap)),
          kv(std::max(h.kv.data.size, kv_cap)),
          scales(std::max<size_t>(h.kv.scales.size, 16) + 4),
          indices(std::max(size_t(h.b.num_pages) * 4, idx_cap)),
          qo(size_t(h.b.batch_size + 1) * 4),
          kvp(size_t(h.b.batch_size + 1) * 4),
          last(size_t(h.b.batch_size + 1) * 4),
          scale_misalign(h.scale_misalign) {
        update(h);
    }
    void update(const Host &h) {
        REQUIRE(h.q.size <= q.size() && h.kv.data.size <= kv.size() && size_t(h.b.num_pages) * 4 <= indices.size() &&
                    size_t(h.b.batch_size + 1) * 4 <= qo.size(),
                "device buffers too small for the update");
        dm::h2d(q.get(), h.q.data, h.q.size);
        dm::h2d(kv.get(), h.kv.data.data, h.kv.data.size);
        if (h.kv.scales.size) dm::h2d(scale_ptr(), h.kv.scales.data, h.kv.scales.size);
        if (h.b.kv_indices) dm::h2d(indices.get(), h.b.kv_indices, size_t(h.b.num_pages) * 4);
        dm::h2d(qo.get(), h.b.qo_indptr, size_t(h.b.batch_size + 1) * 4);
        dm::h2d(kvp.get(), h.b.kv_indptr, size_t(h.b.batch_size + 1) * 4);
        dm::h2d(last.get(), h.b.kv_last_page_len, size_t(h.b.batch_size) * 4 + 4);
    }
};

// A device output with guard bytes (0xa5) around poisoned data (0xff).
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
    std::vector<uint16_t> out;
    std::vector<float> lse;  // empty when lse was NULL
};

mla_tensors tensors_for(const Host &h, const void *q, const void *kv, const void *scales, const int32_t *indices,
                        void *out, float *lse) {
    mla_tensors t;
    mla_tensors_init(&t);
    t.q = q;
    t.kv = kv;
    t.kv_block_scales = h.kv.dtype == MLA_DTYPE_MXFP4 ? static_cast<const uint8_t *>(scales) : nullptr;
    t.kv_indices = h.b.kv_indices ? indices : nullptr;
    t.out = out;
    t.lse = lse;
    t.q_scale = h.q_scale;
    t.kv_scale = h.kv.kv_scale;
    t.kv_scale_stride = h.kv.scale_stride;
    t.num_pages = h.b.num_pages;
    return t;
}

mla_batch batch_for(const Host &h, const Dev *dev, bool null_last) {
    mla_batch b;
    tu_batch_to_mla(&h.b, null_last ? 1 : 0, &b);
    if (dev) {
        b.qo_indptr = dev->qo.as<int32_t>();
        b.kv_indptr = dev->kvp.as<int32_t>();
        b.kv_last_page_len = null_last ? nullptr : dev->last.as<int32_t>();
        b.memory = MLA_MEMORY_DEVICE;
    }
    return b;
}

// One execute with tensors t on the plan's current metadata (out / lse
// filled in here: poisoned, guarded, fetched and checked).
Result execute_checked(mla_plan *plan, const Host &h, mla_tensors t, int heads, bool use_lse, dm::stream_t stream) {
    const size_t rows = h.rows(heads);
    DevOut out(rows * kDV * 2 + 16), lse(rows * 4 + 16);
    out.poison();
    lse.poison();
    t.out = out.data();
    t.lse = use_lse ? static_cast<float *>(lse.data()) : nullptr;
    MLA_CHECK(mla_plan_execute(plan, &t, stream));
    dm::stream_sync(stream);
    dm::device_sync();
    Result r;
    const std::vector<unsigned char> o = out.fetch("out"), l = lse.fetch("lse");
    for (size_t i = rows * kDV * 2; i < o.size(); ++i) REQUIRE(o[i] == 0xff, "out written past its last row");
    r.out.resize(rows * kDV);
    std::memcpy(r.out.data(), o.data(), rows * kDV * 2);
    if (use_lse) {
        r.lse.resize(rows);
        std::memcpy(r.lse.data(), l.data(), rows * 4);
    } else {
        REQUIRE(tu_count_f32_nan(reinterpret_cast<const float *>(l.data()), rows) == rows,
                "lse was NULL but the lse buffer changed");
    }
    return r;
}

// Metadata for batch b, then one execute with tensors t.
Result run_gpu_tensors(mla_plan *plan, const Host &h, const mla_batch &b, mla_tensors t, int heads, bool use_lse,
                       dm::stream_t stream) {
    MLA_CHECK(mla_plan_build_metadata(plan, &b, stream));
    return execute_checked(plan, h, t, heads, use_lse, stream);
}

Result run_gpu(mla_plan *plan, const Host &h, const Dev &d, int heads, bool device_meta, bool null_last,
               bool use_lse, dm::stream_t stream) {
    const mla_batch b = batch_for(h, device_meta ? &d : nullptr, null_last);
    const mla_tensors t =
        tensors_for(h, d.q.get(), d.kv.get(), d.scale_ptr(), d.indices.as<int32_t>(), nullptr, nullptr);
    return run_gpu_tensors(plan, h, b, t, heads, use_lse, stream);
}

Result run_cpu(mla_plan *plan, const Host &h, int heads, bool null_last) {
    const size_t rows = h.rows(heads);
    HostBuf out(rows * kDV * 2 + 16), lse(rows * 4 + 16);
    tu_buf_poison(&out.b);
    tu_buf_poison(&lse.b);
    const mla_batch b = batch_for(h, nullptr, null_last);
    MLA_CHECK(mla_plan_build_metadata(plan, &b, nullptr));
    const mla_tensors t = tensors_for(h, h.q.data, h.kv.data.data, h.kv.scales.data, h.b.kv_indices, out.data(),
                                      reinterpret_cast<float *>(lse.data()));
    MLA_CHECK(mla_plan_execute(plan, &t, nullptr));
    REQUIRE(tu_buf_guards_ok(&out.b) && tu_buf_guards_ok(&lse.b), "CPU backend broke a guard");
    Result r;
    r.out.resize(rows * kDV);
    r.lse.resize(rows);
    std::memcpy(r.out.data(), out.data(), rows * kDV * 2);
    std::memcpy(r.lse.data(), lse.data(), rows * 4);
    return r;
}

// GPU result against CPU result; throws with details on mismatch.
void compare(const char *what, const Host &h, const Shape &s, const Result &gpu, const Result &cpu) {
    const int heads = s.heads;
    const size_t rows = h.rows(heads);
    std::vector<double> vmax(rows + 1), smag(rows + 1);
    REQUIRE(tu_row_bounds(&h.b, &h.kv, h.q.data, s.q, h.q_scale, heads, s.sm_scale, vmax.data(), smag.data()) == 0,
            "tu_row_bounds");
    tu_cmp c;
    tu_cmp_init(&c);
    const size_t bad = tu_compare_lib(what, gpu.out.data(), gpu.lse.empty() ? nullptr : gpu.lse.data(), cpu.out.data(),
                                      cpu.lse.data(), vmax.data(), smag.data(), rows, &kTol, &c, 6);
    g_stats.add(c, what);
    REQUIRE(bad == 0, "%s: %zu out / %zu lse values out of tolerance, %zu rows unwritten (worst %.3g of tol)", what,
            c.bad_out, c.bad_lse, c.unwritten, c.worst_ratio);
}

bool same_bits(const Result &a, size_t a_row, const Result &b, size_t b_row, size_t rows) {
    return std::memcmp(a.out.data() + a_row * kDV, b.out.data() + b_row * kDV, rows * kDV * 2) == 0 &&
           std::memcmp(a.lse.data() + a_row, b.lse.data() + b_row, rows * 4) == 0;
}

// ---- random lengths ---------------------------------------------------------------------

int log_uniform(tu_rng *rng, int max) {
    const double v = std::exp(tu_uniform(rng) * std::log(double(max) + 1.0)) - 1.0;
    return std::min(max, std::max(0, int(v)));
}

const mla_dtype kQ[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ};
const mla_dtype kKV[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_MXFP4};

std::vector<std::pair<mla_dtype, mla_dtype>> valid_pairs() {
    std::vector<std::pair<mla_dtype, mla_dtype>> v;
    for (mla_dtype q : kQ)
        for (mla_dtype kv : kKV) {
            const bool q8 = q != MLA_DTYPE_BF16, kv8 = kv == MLA_DTYPE_FP8_E4M3 || kv == MLA_DTYPE_FP8_E4M3_FNUZ;
            if (q8 && kv8 && q != kv) continue;  // refused by design
            v.push_back({q, kv});
        }
    return v;
}

// Cycles through a fresh permutation of 0..n-1: every value appears once per n draws.
struct Cycle {
    std::vector<int> perm;
    size_t pos = 0;
    int next(tu_rng *rng, int n) {
        if (pos == perm.size()) {
            perm.resize(size_t(n));
            for (int i = 0; i < n; ++i) perm[size_t(i)] = i;
            tu_shuffle(rng, perm.data(), n);
            pos = 0;
        }
        return perm[pos++];
    }
};

// ---- tests --------------------------------------------------------------------------------

void test_invalid_device() {
    mla_plan_desc d;
    mla_plan_desc_init(&d);
    d.num_heads = 16;
    d.backend = MLA_BACKEND_GPU;
    d.device = mla_gpu_device_count();
    mla_plan *p = reinterpret_cast<mla_plan *>(&d);
    const mla_status st = mla_plan_create(&d, &p);
    REQUIRE(st == MLA_ERROR_INVALID_DEVICE, "device %d: got %s, expected MLA_ERROR_INVALID_DEVICE", d.device,
            mla_status_string(st));
    REQUIRE(p == nullptr, "*plan not reset on failure");
    REQUIRE(std::strstr(mla_last_error_message(), "device") != nullptr, "message \"%s\" does not name device",
            mla_last_error_message());
}

void test_auto_backend() {
    Shape s;
    Plan p(s, MLA_BACKEND_AUTO);
    mla_backend b;
    MLA_CHECK(mla_plan_backend(p.p, &b));
    REQUIRE(b == MLA_BACKEND_GPU, "MLA_BACKEND_AUTO resolved to %d with a GPU present", int(b));
}

struct RandomConfig {
    Shape s;
    bool explicit_pages, use_lse, device_meta, null_last, own_stream;
    std::vector<int> q_lens, kv_lens;
};

RandomConfig draw_config(tu_rng *rng, int index) {
    static Cycle c_pair, c_heads, c_q, c_page, c_split, c_bool[4];
    static const int heads[] = {16, 32, 64, 128}, qlens[] = {1, 2, 4}, pages[] = {1, 16, 64};
    static const int splits[] = {0, 1, 2, 7, MLA_MAX_SPLITS};
    static const std::vector<std::pair<mla_dtype, mla_dtype>> pairs = valid_pairs();
    RandomConfig c;
    const auto &pr = pairs[size_t(c_pair.next(rng, int(pairs.size())))];
    c.s.q = pr.first;
    c.s.kv = pr.second;
    c.s.heads = heads[c_heads.next(rng, 4)];
    if (tu_chance(rng, 0.05)) c.s.heads = tu_range(rng, 1, 128);  // any count 1..128 is valid
    const int q_len = qlens[c_q.next(rng, 3)];
    c.s.max_q_len = q_len;
    c.s.page = pages[c_page.next(rng, 3)];
    c.s.splits = splits[c_split.next(rng, 5)];
    c.explicit_pages = c_bool[0].next(rng, 2);
    c.s.logit_cap = c_bool[1].next(rng, 2) ? float(1.5 + 20 * tu_uniform(rng)) : 0.0f;
    c.use_lse = c_bool[2].next(rng, 2);
    c.device_meta = c_bool[3].next(rng, 2) && tu_chance(rng, 0.5);
    c.s.flags = tu_chance(rng, 0.2) ? uint32_t(MLA_FLAG_DETERMINISTIC) : 0u;
    c.s.sm_scale = tu_chance(rng, 0.5) ? 0.0f : float(0.02 + 0.06 * tu_uniform(rng));
    c.own_stream = tu_chance(rng, 0.7);

    // batch: 1..4 long-ish, 5..32, or 33..256 mostly short
    const double u = tu_uniform(rng);
    int n = u < 0.3 ? tu_range(rng, 1, 4) : u < 0.7 ? tu_range(rng, 5, 32) : tu_range(rng, 33, 256);
    // A forced high split count sizes the workspace for max_batch x splits
    // items: keep those batches moderate.
    if (c.s.splits >= 7 && n > 32) n = tu_range(rng, 5, 32);
    const bool ragged_q = q_len > 1 && tu_chance(rng, 0.25);
    c.q_lens.resize(size_t(n));
    c.kv_lens.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
        c.q_lens[size_t(i)] = ragged_q ? tu_range(rng, 0, q_len) : q_len;
        const double v = tu_uniform(rng);
        int len;
        if (v < 0.08) len = 0;
        else if (v < 0.15) len = 1;
        else if (n <= 4 || v > 0.93) len = log_uniform(rng, 20000);
        else len = log_uniform(rng, 700);
        c.kv_lens[size_t(i)] = len;
    }
    if (index % 7 == 0) c.kv_lens[0] = tu_range(rng, 15000, 20000);  // the long end keeps showing up
    // the CPU backend checks every config: about 2.5e6 (row x key) units each
    std::vector<int> kv = c.kv_lens;
    tu_fit_budget(n, c.q_lens.data(), kv.data(), c.s.heads, kConfigBudget);
    c.kv_lens = kv;
    c.null_last = tu_chance(rng, 0.1);
    if (c.null_last)
        for (int &len : c.kv_lens) len = len / c.s.page * c.s.page;
    c.s.max_batch = c.s.splits >= 7 || tu_chance(rng, 0.5) ? n : 0;
    return c;
}

// One key per sequence: the softmax weight is exactly 1, so out is the key's V
// row; every code of every KV format (power-of-two fp8 scales) must come out
// bitwise as on the CPU, for 16 heads at once.
void test_decoding_exact() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x646563ull);
    const mla_dtype kinds[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_MXFP4};
    for (mla_dtype kd : kinds) {
        Shape s;
        s.kv = kd;
        s.page = 1;
        Host h;
        make_host(h, s, {1, 1}, {1, 1}, true, 1, &rng);
        for (int seq = 0; seq < 2; ++seq) {
            const size_t row = size_t(tu_batch_page(&h.b, h.b.kv_indptr[seq]));
            unsigned char *p = h.kv.data.data + row * h.kv.row_bytes;
            for (int d = 0; d < 576; ++d) {
                if (kd == MLA_DTYPE_MXFP4) {
                    if (d % 2 == 0) p[d / 2] = uint8_t(((d / 2 + seq) % 16) | ((((d / 2) * 7 + 3) % 16) << 4));
                } else if (kd != MLA_DTYPE_BF16) {
                    const uint8_t code = uint8_t((d + 128 * seq) % 256);
                    p[d] = tu_fp8_is_nan(kd, code) ? 0 : code;
                }
            }
            if (kd == MLA_DTYPE_MXFP4)
                // Blocks 0-1 hold the scale edges of the decoder: E8M0 0 / 1
                // (subnormal results), 2 / 3 (the smallest all-normal scales).
                for (int k = 0; k < MLA_MXFP4_SCALES_PER_ROW; ++k)
                    h.kv.scales.data[row * size_t(h.kv.scale_stride) + size_t(k)] =
                        uint8_t(k < 2 ? 2 * k + seq : 20 + 12 * k - seq);
        }
        if (kd == MLA_DTYPE_FP8_E4M3 || kd == MLA_DTYPE_FP8_E4M3_FNUZ) h.kv.kv_scale = 0.5f;
        Dev d(h);
        Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
        const Result g = run_gpu(gpu.p, h, d, s.heads, false, false, true, nullptr);
        const Result c = run_cpu(cpu.p, h, s.heads, false);
        // Exact, except that a bf16 subnormal (|v| < 2^-126, only from E8M0
        // 0 / 1 blocks) may come out as zero if the matrix unit flushes
        // subnormal inputs: counted and reported, never a normal value.
        size_t flushed = 0;
        for (size_t i = 0; i < g.out.size(); ++i) {
            const bool same = g.out[i] == c.out[i] || ((g.out[i] | c.out[i]) & 0x7fffu) == 0;
            const bool cpu_subnormal = (c.out[i] & 0x7f80u) == 0 && (c.out[i] & 0x7fu) != 0;
            if (!same && cpu_subnormal && (g.out[i] & 0x7fffu) == 0) {
                ++flushed;
                continue;
            }
            REQUIRE(same, "kv %s: row %zu element %zu: GPU 0x%04x, CPU 0x%04x", tu_dtype_name(kd), i / kDV, i % kDV,
                    g.out[i], c.out[i]);
        }
        if (flushed)
            std::printf("decoding_exact: kv %s: %zu subnormal outputs came out as zero (subnormal flush)\n",
                        tu_dtype_name(kd), flushed);
        compare(strf("decoding kv %s", tu_dtype_name(kd)).c_str(), h, s, g, c);
    }
}

// Scores spread over ~±100 (log2 units) by a large sm_scale: the running
// maximum of a row moves by more than 2^8 several times along a sequence,
// so every kernel's rescale of its accumulators runs mid-sequence (the
// warpgroup kernel moves its reference only on such jumps), with and
// without splits.
void test_rising_scores() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x726973ull);
    const mla_dtype kinds[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_MXFP4};
    for (mla_dtype kd : kinds)
        for (int q_len : {1, 2})  // 16 rows (the warpgroup kernel for fp8) and 32
            for (int splits : {1, 0}) {
            Shape s;
            s.kv = kd;
            s.page = 16;
            s.max_q_len = q_len;
            s.sm_scale = 0.35f;
            s.splits = splits;
            Host h;
            const int len = kEmulated ? 1500 : 6000;
            make_host(h, s, {1, q_len}, {len, len / 2 + 7}, true, 1, &rng);
            Dev d(h);
            Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
            compare(strf("rising scores kv %s q_len %d splits %d", tu_dtype_name(kd), q_len, splits).c_str(), h, s,
                    run_gpu(gpu.p, h, d, s.heads, false, false, true, nullptr), run_cpu(cpu.p, h, s.heads, false));
            }
}

// MXFP4 scale rows at every byte misalignment (strides 18, 19, 21 and 24, the
// array's base shifted by 0..3 bytes) behind shuffled one-token pages, so
// that the rows of a tile have unrelated alignments: each row's partial
// first and last scale words are assembled on their own (the warpgroup
// kernel issues 16 rows a warp, whose 4-bit descriptors once overflowed a
// 32-bit word). 16 and 32 query rows, split and not.
void test_mxfp4_scale_layouts() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6d7866ull);
    for (int stride : {18, 19, 21, 24})
        for (int misalign = 0; misalign < 4; ++misalign) {
            Shape s;
            s.kv = MLA_DTYPE_MXFP4;
            s.page = 1;
            s.max_q_len = misalign % 2 + 1;
            s.splits = stride == 21 ? 3 : 0;
            const std::vector<int> q_lens = {s.max_q_len, 1}, kv_lens = {200, 131};
            Host h;
            REQUIRE(tu_batch_make(&h.b, 2, q_lens.data(), kv_lens.data(), s.page, 1, 3, &rng) == 0, "tu_batch_make");
            REQUIRE(tu_kv_make(&h.kv, s.kv, &h.b, stride, &rng) == 0, "tu_kv_make");
            REQUIRE(tu_q_make(&h.q, s.q, h.b.total_q, s.heads, 1.0, &rng) == 0, "tu_q_make");
            // Q's first byte reads as an E8M0 NaN: the rows past a sequence's
            // end (200 and 131 are not whole tiles) must take their scales
            // from a block of zeros, not from any caller buffer such as Q
            // (once their loads did, then stored 0 in place of the byte).
            h.q.data[0] = 0xff;
            h.scale_misalign = size_t(misalign);
            Dev d(h);
            Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
            compare(strf("mxfp4 scales: stride %d, misaligned by %d, q_len %d, splits %d", stride, misalign,
                         s.max_q_len, s.splits).c_str(),
                    h, s, run_gpu(gpu.p, h, d, s.heads, false, false, true, nullptr), run_cpu(cpu.p, h, s.heads, false));
        }
}

// The NaN rule of docs/reliability.md on the GPU: a non-finite element of a
// visible key (bf16 NaN / inf, an fp8 NaN code, an E8M0 255 scale, an E8M0
// 254 block that overflows float) makes every row that sees it NaN, all of
// out and lse; rows the causal mask keeps from it, and other sequences, are
// clean and as on the CPU. Sequence 1's bad key is its last (with q_len 2
// only the second query token sees it), bad in a rope dim (>= 512): the GPU
// also multiplies a causally hidden key's V by its zero weight, so a
// non-finite V element of one of the last q_len - 1 keys would reach the
// hidden rows' same dim (docs/reliability.md). Sequence 2's bad key, its
// sixth, is bad in V. 16 and 32 rows, one split, auto and 4.
void test_nan_keys() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6e616eull);
    const mla_dtype kinds[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_MXFP4};
    const std::vector<int> kv_lens = {150, 200, 90};
    const int bad_key[3] = {-1, 199, 5};
    for (mla_dtype kd : kinds)
        for (int q_len : {1, 2})
            for (int splits : {1, 0, 4}) {
                Shape s;
                s.kv = kd;
                s.max_q_len = q_len;
                s.splits = splits;
                Host h;
                make_host(h, s, {q_len, q_len, q_len}, kv_lens, true, 1, &rng);
                auto key_row = [&](int seq) {  // KV row of sequence seq's bad key
                    const int j = bad_key[seq];
                    return size_t(tu_batch_page(&h.b, h.b.kv_indptr[seq] + j / s.page)) * size_t(s.page) +
                           size_t(j % s.page);
                };
                // Poison the two keys, remembering their bytes for the bounds of the clean rows.
                std::vector<std::vector<unsigned char>> saved;
                for (int seq = 1; seq < 3; ++seq) {
                    const size_t row = key_row(seq);
                    unsigned char *kvr = h.kv.data.data + row * h.kv.row_bytes;
                    unsigned char *sc = kd == MLA_DTYPE_MXFP4 ? h.kv.scales.data + row * size_t(h.kv.scale_stride) : nullptr;
                    saved.emplace_back(kvr, kvr + h.kv.row_bytes);
                    if (sc) saved.emplace_back(sc, sc + MLA_MXFP4_SCALES_PER_ROW);
                    if (kd == MLA_DTYPE_BF16) {
                        const uint16_t bad = seq == 1 ? 0x7fc0u : 0x7f80u;  // NaN; +inf
                        std::memcpy(kvr + 2 * (seq == 1 ? 530 : 3), &bad, 2);
                    } else if (kd == MLA_DTYPE_MXFP4) {
                        if (seq == 1) {
                            sc[17] = 255;  // NaN scale of dims 544..575
                        } else {
                            sc[0] = 254;
                            kvr[0] = 0x77;  // dims 0, 1: 6 x 2^127 = inf in float
                        }
                    } else {
                        kvr[seq == 1 ? 520 : 100] = kd == MLA_DTYPE_FP8_E4M3 ? 0x7f : 0x80;  // NaN codes
                    }
                }
                Dev d(h);
                Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
                Result g = run_gpu(gpu.p, h, d, s.heads, false, false, true, nullptr);
                Result c = run_cpu(cpu.p, h, s.heads, false);
                const std::string what = strf("nan keys: kv %s, q_len %d, splits %d", tu_dtype_name(kd), q_len, splits);
                size_t nan_rows = 0;
                for (int seq = 0; seq < 3; ++seq)
                    for (int i = 0; i < q_len; ++i) {
                        const bool sees = bad_key[seq] >= 0 && bad_key[seq] < kv_lens[size_t(seq)] - q_len + i + 1;
                        for (int hd = 0; hd < s.heads; ++hd) {
                            const size_t r = size_t(h.b.qo_indptr[seq] + i) * size_t(s.heads) + size_t(hd);
                            const size_t gn = tu_count_bf16_nan(&g.out[r * kDV], kDV), cn = tu_count_bf16_nan(&c.out[r * kDV], kDV);
                            REQUIRE(cn == (sees ? kDV : 0) && std::isnan(c.lse[r]) == sees,
                                    "%s: CPU row %zu (sequence %d, token %d) breaks the rule", what.c_str(), r, seq, i);
                            REQUIRE(gn == (sees ? kDV : 0), "%s: row %zu (sequence %d, token %d) has %zu NaN of %d, want %d",
                                    what.c_str(), r, seq, i, gn, kDV, sees ? kDV : 0);
                            REQUIRE(std::isnan(g.lse[r]) == sees, "%s: row %zu (sequence %d, token %d): lse %g", what.c_str(),
                                    r, seq, i, double(g.lse[r]));
                            if (sees) {
                                // computed NaNs, not the poison (0xff bytes) of a row never written
                                uint32_t lse_bits;
                                std::memcpy(&lse_bits, &g.lse[r], 4);
                                REQUIRE(std::count(&g.out[r * kDV], &g.out[r * kDV] + kDV, uint16_t(0xffffu)) == 0 &&
                                            lse_bits != 0xffffffffu,
                                        "%s: row %zu (sequence %d, token %d) was not written", what.c_str(), r, seq, i);
                                // equal now; compared as zeros below
                                std::fill(&g.out[r * kDV], &g.out[r * kDV] + kDV, uint16_t(0));
                                std::fill(&c.out[r * kDV], &c.out[r * kDV] + kDV, uint16_t(0));
                                g.lse[r] = c.lse[r] = 0.0f;
                                ++nan_rows;
                            }
                        }
                    }
                REQUIRE(nan_rows > 0, "%s: no row saw a bad key", what.c_str());
                // The clean rows against the CPU, with bounds from the unpoisoned keys.
                size_t k = 0;
                for (int seq = 1; seq < 3; ++seq) {
                    const size_t row = key_row(seq);
                    std::memcpy(h.kv.data.data + row * h.kv.row_bytes, saved[k].data(), saved[k].size());
                    ++k;
                    if (kd == MLA_DTYPE_MXFP4) {
                        std::memcpy(h.kv.scales.data + row * size_t(h.kv.scale_stride), saved[k].data(), saved[k].size());
                        ++k;
                    }
                }
                compare(what.c_str(), h, s, g, c);
            }
}

void test_random_configs(int count) {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6770755f72616e64ull);
    dm::stream_t stream = dm::stream_create();
    std::vector<std::string> failures;
    bool pair_seen[8][8] = {};
    for (int i = 0; i < count; ++i) {
        RandomConfig c = draw_config(&rng, i);
        const uint64_t cfg_seed = tu_next(&rng);
        tu_rng r;
        tu_rng_init(&r, cfg_seed);
        const std::string name =
            strf("config %d: %s batch=%zu%s%s%s%s%s", i, c.s.name().c_str(), c.q_lens.size(),
                 c.explicit_pages ? " explicit_pages" : " identity_pages", c.use_lse ? " lse" : " no_lse",
                 c.device_meta ? " device_meta" : "", c.null_last ? " full_pages" : "",
                 c.own_stream ? " stream" : " null_stream");
        g_stats.configs++;
        pair_seen[c.s.q][c.s.kv] = true;
        g_stats.max_batch = std::max(g_stats.max_batch, int(c.q_lens.size()));
        for (int len : c.kv_lens) g_stats.max_kv = std::max(g_stats.max_kv, len);
        try {
            Host h;
            make_host(h, c.s, c.q_lens, c.kv_lens, c.explicit_pages, tu_range(&r, 0, 4), &r);
            Dev d(h);
            Plan gpu(c.s, MLA_BACKEND_GPU), cpu(c.s, MLA_BACKEND_CPU);
            const Result g = run_gpu(gpu.p, h, d, c.s.heads, c.device_meta, c.null_last, c.use_lse,
                                     c.own_stream ? stream : nullptr);
            const Result k = run_cpu(cpu.p, h, c.s.heads, c.null_last);
            compare(name.c_str(), h, c.s, g, k);
        } catch (const std::exception &e) {
            g_stats.failed++;
            std::string lens;
            for (size_t j = 0; j < c.q_lens.size() && j < 24; ++j)
                lens += strf(" (q%d,kv%d)", c.q_lens[j], c.kv_lens[j]);
            failures.push_back(name + "\n    " + e.what() + "\n    lens:" + lens);
            std::printf("[ FAILED   ] %s\n", failures.back().c_str());
        }
    }
    dm::stream_destroy(stream);
    for (auto &row : pair_seen)
        for (bool seen : row) g_stats.pairs_seen += seen;
    REQUIRE(failures.empty(), "%zu of %d random configurations failed (first: %s)", failures.size(), count,
            failures.empty() ? "" : failures[0].c_str());
}

void test_device_metadata() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6d657461ull);
    dm::stream_t stream = dm::stream_create();
    for (int i = 0; i < (kEmulated ? 4 : 12); ++i) {
        RandomConfig c = draw_config(&rng, i);
        c.use_lse = true;
        Host h;
        make_host(h, c.s, c.q_lens, c.kv_lens, c.explicit_pages, 2, &rng);
        Dev d(h);
        Plan gpu(c.s, MLA_BACKEND_GPU), cpu(c.s, MLA_BACKEND_CPU);
        const Result from_host = run_gpu(gpu.p, h, d, c.s.heads, false, c.null_last, true, stream);
        const Result from_dev = run_gpu(gpu.p, h, d, c.s.heads, true, c.null_last, true, stream);
        const std::string name = strf("device metadata %d: %s batch=%zu", i, c.s.name().c_str(), c.q_lens.size());
        compare(name.c_str(), h, c.s, from_dev, run_cpu(cpu.p, h, c.s.heads, c.null_last));
        REQUIRE(from_host.out == from_dev.out && from_host.lse == from_dev.lse,
                "%s: output with device-built metadata differs from host-built metadata", name.c_str());
    }
    dm::stream_destroy(stream);
}

// host_metadata: metadata built from host arrays before the capture and
// again before the second replay, for a step with many more items than the
// captured one (an uncaptured execute launches only its step's items; a
// captured one must launch the plan's bound).
void graph_capture_case(bool host_metadata) {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6772617068ull ^ uint64_t(host_metadata));
    Shape s;
    s.q = MLA_DTYPE_BF16;
    s.kv = MLA_DTYPE_FP8_E4M3;
    s.heads = 32;
    s.max_q_len = 2;
    s.page = 16;
    s.max_batch = 8;
    const int n = 6, max_len = 6000, layers = 3;
    const int cap_pages = n * ((max_len + s.page - 1) / s.page) + 4;
    const std::vector<int> q_lens(size_t(n), 2);

    auto lengths = [&](bool second) {
        std::vector<int> kv(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i)
            kv[size_t(i)] = second          ? tu_range(&rng, 0, max_len)
                            : host_metadata ? tu_range(&rng, 1, 64)  // one item a head block
                                            : log_uniform(&rng, 3000);
        if (second) kv[1] = 1;
        return kv;
    };
    const std::vector<int> lens[2] = {lengths(false), lengths(true)};

    // Fixed device buffers, sized for the larger phase; each layer its own data.
    std::unique_ptr<Host> host[2][layers];
    for (int ph = 0; ph < 2; ++ph)
        for (int l = 0; l < layers; ++l) {
            host[ph][l].reset(new Host);
            Host &h = *host[ph][l];
            int total_pages = 0;
            for (int len : lens[ph]) total_pages += (len + s.page - 1) / s.page;
            make_host(h, s, q_lens, lens[ph], true, cap_pages - total_pages, &rng);
            if (ph == 1) {  // the scales are kernel arguments baked into the graph
                h.kv.kv_scale = host[0][l]->kv.kv_scale;
                h.q_scale = host[0][l]->q_scale;
            }
        }
    const size_t q_cap = host[0][0]->q.size;
    const size_t kv_cap = size_t(cap_pages) * size_t(s.page) * ref_kv_row_bytes(s.kv);
    std::vector<std::unique_ptr<Dev>> dev;
    std::vector<std::unique_ptr<DevOut>> out, lse;
    for (int l = 0; l < layers; ++l) {
        dev.emplace_back(new Dev(*host[0][l], q_cap, kv_cap, size_t(cap_pages) * 4));
        out.emplace_back(new DevOut(size_t(n) * 2 * s.heads * kDV * 2));
        lse.emplace_back(new DevOut(size_t(n) * 2 * s.heads * 4));
    }
    // Metadata arrays of layer 0's Dev serve all layers (one step, three layers);
    // the other layers' page tables live in their own Dev.
    Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
    dm::stream_t stream = dm::stream_create();
    for (int l = 0; l < layers; ++l) {
        out[size_t(l)]->poison();
        lse[size_t(l)]->poison();
    }

    const mla_batch host_batch[2] = {batch_for(*host[0][0], nullptr, false), batch_for(*host[1][0], nullptr, false)};
    if (host_metadata) MLA_CHECK(mla_plan_build_metadata(gpu.p, &host_batch[0], stream));
    dm::begin_capture(stream);
    mla_status st_meta = MLA_SUCCESS, st_exec[layers];
    {
        const mla_batch b = batch_for(*host[0][0], dev[0].get(), false);
        if (!host_metadata) st_meta = mla_plan_build_metadata(gpu.p, &b, stream);
        for (int l = 0; l < layers; ++l) {
            const Dev &d = *dev[size_t(l)];
            const mla_tensors t = tensors_for(*host[0][l], d.q.get(), d.kv.get(), d.scale_ptr(),
                                              d.indices.as<int32_t>(), out[size_t(l)]->data(),
                                              static_cast<float *>(lse[size_t(l)]->data()));
            st_exec[l] = mla_plan_execute(gpu.p, &t, stream);
        }
    }
    std::string capture_error = mla_last_error_message();
    dm::graph_t graph = dm::end_capture(stream);
    REQUIRE(st_meta == MLA_SUCCESS, "build_metadata during capture: %s: %s", mla_status_string(st_meta),
            capture_error.c_str());
    for (int l = 0; l < layers; ++l)
        REQUIRE(st_exec[l] == MLA_SUCCESS, "execute %d during capture: %s: %s", l, mla_status_string(st_exec[l]),
                capture_error.c_str());
    dm::graph_exec_t exec = dm::instantiate(graph);

    for (int ph = 0; ph < 2; ++ph) {
        if (ph == 1) {
            // Same batch size, new lengths and page tables, same device pointers.
            for (int l = 0; l < layers; ++l) dev[size_t(l)]->update(*host[1][l]);
            if (host_metadata) MLA_CHECK(mla_plan_build_metadata(gpu.p, &host_batch[1], stream));
        }
        for (int l = 0; l < layers; ++l) {
            out[size_t(l)]->poison();
            lse[size_t(l)]->poison();
        }
        dm::launch(exec, stream);
        dm::stream_sync(stream);
        for (int l = 0; l < layers; ++l) {
            const Host &h = *host[ph][l];
            const size_t rows = h.rows(s.heads);
            Result g;
            const std::vector<unsigned char> o = out[size_t(l)]->fetch("graph out"),
                                             ls = lse[size_t(l)]->fetch("graph lse");
            g.out.resize(rows * kDV);
            g.lse.resize(rows);
            std::memcpy(g.out.data(), o.data(), rows * kDV * 2);
            std::memcpy(g.lse.data(), ls.data(), rows * 4);
            const std::string name =
                strf("graph replay %d layer %d (%s metadata)", ph, l, host_metadata ? "host" : "device");
            compare(name.c_str(), h, s, g, run_cpu(cpu.p, h, s.heads, false));
        }
    }
    dm::graph_exec_destroy(exec);
    dm::graph_destroy(graph);
    dm::stream_destroy(stream);
}

void test_graph_capture() {
    graph_capture_case(false);
    graph_capture_case(true);
}

void transplant(const Shape &s, Host &dst, int dx, const Host &src, int sx, int len) {
    const size_t q_token = size_t(s.heads) * ref_q_row_bytes(s.q);
    for (int j = 0; j < len; ++j) tu_kv_copy_row(&dst.kv, &dst.b, dx, &src.kv, &src.b, sx, j);
    std::memcpy(dst.q.data + size_t(dst.b.qo_indptr[dx]) * q_token, src.q.data + size_t(src.b.qo_indptr[sx]) * q_token,
                size_t(src.b.q_lens[sx]) * q_token);
    dst.kv.kv_scale = src.kv.kv_scale;
    dst.q_scale = src.q_scale;
}

void determinism_case(const Shape &s, int x_len) {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ uint64_t(x_len));
    const int q_len = s.max_q_len;
    Host alone, big, other;
    make_host(alone, s, {q_len}, {x_len}, true, 3, &rng);
    std::vector<int> ql(40, q_len), kl(40);
    // (a tenth of the lengths on the CPU emulation: still several deterministic splits)
    const int scale = kEmulated ? 10 : 1;
    for (int &len : kl) len = log_uniform(&rng, 8000 / scale);
    kl[17] = x_len;
    make_host(big, s, ql, kl, true, 5, &rng);
    transplant(s, big, 17, alone, 0, x_len);
    std::vector<int> ql2(200, q_len), kl2(200);
    for (int &len : kl2) len = log_uniform(&rng, 300 / scale);
    kl2[0] = x_len;
    make_host(other, s, ql2, kl2, true, 0, &rng);
    transplant(s, other, 0, alone, 0, x_len);

    Plan p1(s, MLA_BACKEND_GPU), p2(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
    Dev da(alone), db(big), dother(other);
    dm::stream_t stream = dm::stream_create();
    const size_t rows = size_t(q_len) * size_t(s.heads);
    const Result a = run_gpu(p1.p, alone, da, s.heads, false, false, true, stream);
    compare("determinism: alone vs CPU", alone, s, a, run_cpu(cpu.p, alone, s.heads, false));
    const Result b1 = run_gpu(p2.p, big, db, s.heads, false, false, true, stream);
    const Result b2 = run_gpu(p2.p, big, db, s.heads, false, false, true, stream);
    const Result b3 = run_gpu(p1.p, big, db, s.heads, true, false, true, nullptr);
    const Result o = run_gpu(p2.p, other, dother, s.heads, true, false, true, stream);
    const Result a2 = run_gpu(p2.p, alone, da, s.heads, false, false, true, nullptr);
    dm::stream_destroy(stream);
    const size_t xrow = size_t(big.b.qo_indptr[17]) * size_t(s.heads);
    REQUIRE(b1.out == b2.out && b1.lse == b2.lse, "%s: repeated runs of a batch differ", s.name().c_str());
    REQUIRE(b1.out == b3.out && b1.lse == b3.lse, "%s: another plan with device metadata gives other bits",
            s.name().c_str());
    REQUIRE(same_bits(a, 0, b1, xrow, rows), "%s: sequence alone != inside a 40-sequence batch", s.name().c_str());
    REQUIRE(same_bits(a, 0, o, 0, rows), "%s: sequence alone != first of a 200-sequence batch", s.name().c_str());
    REQUIRE(same_bits(a, 0, a2, 0, rows), "%s: sequence alone differs between runs", s.name().c_str());
}

// A step with far more work items than resident CTAs (eight forced
// splits), whose items have no tile, one tile or several, run as three
// layers on one metadata build (host-built, then device-built): each execute
// checked against the CPU and bitwise equal to the first, so nothing an
// execute leaves behind in the plan changes the next layer's result.
void test_many_items() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x70657273ull);
    dm::stream_t stream = dm::stream_create();
    const int n = kEmulated ? 16 : 96;
    for (mla_dtype kv : {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3})
        for (int heads : {16, 32}) {
            Shape s;
            s.kv = kv;
            s.heads = heads;
            s.splits = 8;
            s.max_batch = n;
            std::vector<int> q_lens(static_cast<size_t>(n), 1), kv_lens(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i)
                kv_lens[size_t(i)] = i % 4 == 0 ? 0 : i % 4 == 1 ? tu_range(&rng, 1, 64)
                                                                 : tu_range(&rng, 65, kEmulated ? 1500 : 6000);
            Host h;
            make_host(h, s, q_lens, kv_lens, true, 2, &rng);
            Dev d(h);
            Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
            const Result want = run_cpu(cpu.p, h, heads, false);
            const mla_tensors t =
                tensors_for(h, d.q.get(), d.kv.get(), d.scale_ptr(), d.indices.as<int32_t>(), nullptr, nullptr);
            for (bool device_meta : {false, true}) {
                const mla_batch b = batch_for(h, device_meta ? &d : nullptr, false);
                MLA_CHECK(mla_plan_build_metadata(gpu.p, &b, stream));
                Result first;
                for (int layer = 0; layer < 3; ++layer) {
                    const std::string name = strf("many items: %s batch=%d %s metadata, layer %d",
                                                  s.name().c_str(), n, device_meta ? "device" : "host", layer);
                    const Result got = execute_checked(gpu.p, h, t, heads, true, stream);
                    compare(name.c_str(), h, s, got, want);
                    if (layer == 0) first = got;
                    REQUIRE(got.out == first.out && got.lse == first.lse, "%s: differs from layer 0", name.c_str());
                }
            }
        }
    dm::stream_destroy(stream);
}

void test_determinism() {
    Shape s1;
    s1.flags = MLA_FLAG_DETERMINISTIC;
    s1.heads = 16;
    s1.page = 64;
    s1.max_q_len = 1;
    determinism_case(s1, 9000 / (kEmulated ? 4 : 1));
    Shape s2 = s1;
    s2.q = MLA_DTYPE_FP8_E4M3;
    s2.kv = MLA_DTYPE_MXFP4;
    s2.heads = kEmulated ? 24 : 128;  // (emulation: still several head blocks)
    s2.page = 1;
    s2.max_q_len = 2;
    determinism_case(s2, 5000 / (kEmulated ? 4 : 1));
    Shape s3 = s1;
    s3.q = MLA_DTYPE_FP8_E4M3_FNUZ;
    s3.kv = MLA_DTYPE_FP8_E4M3_FNUZ;
    s3.heads = kEmulated ? 8 : 64;
    s3.page = 16;
    s3.max_q_len = 4;
    s3.logit_cap = 10.0f;
    determinism_case(s3, 3000 / (kEmulated ? 4 : 1));
}

void test_validate_device_inputs() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x76616cull);
    Shape s;
    s.flags = MLA_FLAG_VALIDATE_DEVICE_INPUTS;
    s.max_q_len = 2;
    s.max_batch = 8;
    Host h;
    make_host(h, s, {1, 2, 1}, {40, 3, 17}, true, 2, &rng);
    Dev d(h);
    Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
    compare("validated run", h, s, run_gpu(gpu.p, h, d, s.heads, true, false, true, nullptr),
            run_cpu(cpu.p, h, s.heads, false));

    // bad last_page_len in device memory
    const int32_t bad_last = s.page + 1;
    dm::h2d(d.last.as<int32_t>() + 1, &bad_last, 4);
    mla_batch b = batch_for(h, &d, false);
    mla_status st = mla_plan_build_metadata(gpu.p, &b, nullptr);
    REQUIRE(st == MLA_ERROR_DEVICE_VALIDATION_FAILED, "bad device last_page_len: got %s", mla_status_string(st));
    REQUIRE(*mla_last_error_message(), "empty message");
    dm::h2d(d.last.get(), h.b.kv_last_page_len, size_t(h.b.batch_size) * 4);

    // a page index beyond num_pages
    MLA_CHECK(mla_plan_build_metadata(gpu.p, &b, nullptr));
    const int32_t bad_page = h.b.num_pages;
    dm::h2d(d.indices.as<int32_t>() + 2, &bad_page, 4);
    DevOut out(h.rows(s.heads) * kDV * 2);
    out.poison();
    const mla_tensors t = tensors_for(h, d.q.get(), d.kv.get(), d.scale_ptr(), d.indices.as<int32_t>(), out.data(),
                                      nullptr);
    st = mla_plan_execute(gpu.p, &t, nullptr);
    REQUIRE(st == MLA_ERROR_DEVICE_VALIDATION_FAILED, "bad device page index: got %s", mla_status_string(st));
    dm::h2d(d.indices.get(), h.b.kv_indices, size_t(h.b.num_pages) * 4);

    // Inconsistent device-resident indptr arrays: each is refused by
    // build_metadata, and the plan keeps working once they are repaired.
    struct Corruption {
        const char *what;
        dm::buffer *array;
        int index;
        int32_t value;
    };
    const Corruption corrupt[] = {
        {"kv_indptr decreasing", &d.kvp, 2, h.b.kv_indptr[1] - 1},
        {"qo_indptr decreasing", &d.qo, 2, h.b.qo_indptr[1] - 1},
        {"qo_indptr step above max_q_len", &d.qo, 3, h.b.qo_indptr[2] + s.max_q_len + 1},
        {"kv_indptr[0] negative", &d.kvp, 0, -5},
    };
    for (const Corruption &c : corrupt) {
        int32_t saved;
        dm::d2h(&saved, c.array->as<int32_t>() + c.index, 4);
        dm::h2d(c.array->as<int32_t>() + c.index, &c.value, 4);
        st = mla_plan_build_metadata(gpu.p, &b, nullptr);
        REQUIRE(st == MLA_ERROR_DEVICE_VALIDATION_FAILED, "%s: got %s (%s)", c.what, mla_status_string(st),
                mla_last_error_message());
        dm::h2d(c.array->as<int32_t>() + c.index, &saved, 4);
    }
    compare("validated run after repairs", h, s, run_gpu(gpu.p, h, d, s.heads, true, false, true, nullptr),
            run_cpu(cpu.p, h, s.heads, false));

    // Identity page table whose device kv_indptr runs past num_pages: the
    // pages-in-range check of execute catches it.
    Shape si = s;
    Host hi;
    make_host(hi, si, {1, 1}, {100, 70}, false, 0, &rng);
    Dev di(hi);
    Plan gi(si, MLA_BACKEND_GPU);
    const int32_t past_end = hi.b.kv_indptr[2] + 3;
    dm::h2d(di.kvp.as<int32_t>() + 2, &past_end, 4);
    const mla_batch bi = batch_for(hi, &di, false);
    MLA_CHECK(mla_plan_build_metadata(gi.p, &bi, nullptr));
    DevOut oi(hi.rows(si.heads) * kDV * 2);
    oi.poison();
    const mla_tensors ti = tensors_for(hi, di.q.get(), di.kv.get(), di.scale_ptr(), nullptr, oi.data(), nullptr);
    st = mla_plan_execute(gi.p, &ti, nullptr);
    REQUIRE(st == MLA_ERROR_DEVICE_VALIDATION_FAILED, "identity table past num_pages: got %s", mla_status_string(st));
    dm::device_sync();
}


// A single sequence of a million tokens (DESIGN: no length limit beyond
// int32), in two formats: bf16 in 64-token pages, and mxfp4 in 1-token pages
// with q_len 2 and a partial last tile.
void test_long_sequence() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x6c6f6e67ull);
    struct Case {
        mla_dtype kv;
        int page, q_len, kv_len;
    };
    const Case cases[] = {{MLA_DTYPE_BF16, 64, 1, 1000000}, {MLA_DTYPE_MXFP4, 1, 2, 1000007}};
    for (const Case &c : cases) {
        Shape s;
        s.kv = c.kv;
        s.page = c.page;
        s.max_q_len = c.q_len;
        Host h;
        make_host(h, s, {c.q_len}, {c.kv_len}, true, 1, &rng);
        Dev d(h);
        Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
        const std::string name = strf("long sequence: %s kv_len=%d", s.name().c_str(), c.kv_len);
        compare(name.c_str(), h, s, run_gpu(gpu.p, h, d, s.heads, false, false, true, nullptr),
                run_cpu(cpu.p, h, s.heads, false));
        g_stats.max_kv = std::max(g_stats.max_kv, c.kv_len);
    }
}

// Total KV above 4 GiB: the batch's pages are placed past the 4.5 GiB mark of
// a larger pool (only they are written), so every page and scale offset needs
// 64 bits. The CPU backend computes the same batch from the compact host copy.
void test_large_pool() {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ 0x706f6f6cull);
    const mla_dtype kinds[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_MXFP4};
    for (mla_dtype kd : kinds) {
        Shape s;
        s.kv = kd;
        s.page = 64;
        s.max_q_len = 2;
        Host h;
        make_host(h, s, {1, 2, 1, 2}, {3000, 517, 1, 4100}, true, 2, &rng);
        const size_t page_bytes = size_t(s.page) * h.kv.row_bytes;
        const int64_t offset_pages = int64_t((size_t(9) << 29) / page_bytes) + 1;  // 4.5 GiB
        const int64_t pool_pages = offset_pages + h.b.num_pages;
        REQUIRE(pool_pages <= INT32_MAX, "pool of %lld pages", (long long)pool_pages);
        dm::buffer pool(size_t(pool_pages) * page_bytes);
        dm::h2d(pool.as<unsigned char>() + size_t(offset_pages) * page_bytes, h.kv.data.data, h.kv.data.size);
        const size_t page_scale_bytes = size_t(s.page) * size_t(h.kv.scale_stride);
        dm::buffer scales(kd == MLA_DTYPE_MXFP4 ? size_t(pool_pages) * page_scale_bytes : 16);
        if (kd == MLA_DTYPE_MXFP4)
            dm::h2d(scales.as<unsigned char>() + size_t(offset_pages) * page_scale_bytes, h.kv.scales.data,
                    h.kv.scales.size);
        std::vector<int32_t> moved(h.b.kv_indices, h.b.kv_indices + h.b.total_pages);
        for (int32_t &page : moved) page += int32_t(offset_pages);
        dm::buffer indices(moved.data(), moved.size() * 4);
        Dev d(h);  // q and the batch arrays
        mla_tensors t = tensors_for(h, d.q.get(), pool.get(), scales.get(), indices.as<int32_t>(), nullptr, nullptr);
        t.num_pages = pool_pages;
        Plan gpu(s, MLA_BACKEND_GPU), cpu(s, MLA_BACKEND_CPU);
        const std::string name =
            strf("large pool: %s, pages at byte %.2f GiB", s.name().c_str(),
                 double(offset_pages) * double(page_bytes) / double(size_t(1) << 30));
        compare(name.c_str(), h, s, run_gpu_tensors(gpu.p, h, batch_for(h, &d, false), t, s.heads, true, nullptr),
                run_cpu(cpu.p, h, s.heads, false));
    }
}

}  // namespace

int main() {
    const int devices = mla_gpu_device_count();
    if (devices == 0 || dm::device_count() == 0) {
        std::printf("test_gpu: no GPU present (mla_gpu_device_count() = %d): skipped\n", devices);
        return 77;
    }
    tu_seed();
    const char *env = std::getenv("MLA_GPU_TEST_CONFIGS");
    const int count = env && std::atoi(env) > 0 ? std::atoi(env) : kEmulated ? 80 : 300;
    std::printf("test_gpu: %d GPU(s), %d random configurations\n", devices, count);

    const std::vector<std::pair<const char *, std::function<void()>>> tests = {
        {"invalid_device", test_invalid_device},
        {"auto_backend", test_auto_backend},
        {"decoding_exact", test_decoding_exact},
        {"rising_scores", test_rising_scores},
        {"mxfp4_scale_layouts", test_mxfp4_scale_layouts},
        {"nan_keys", test_nan_keys},
        {"random_configs", [count] { test_random_configs(count); }},
        {"device_metadata", test_device_metadata},
        {"graph_capture", test_graph_capture},
        {"many_items", test_many_items},
        {"determinism", test_determinism},
        {"validate_device_inputs", test_validate_device_inputs},
        {"long_sequence", test_long_sequence},
        {"large_pool", test_large_pool},
    };
    // MLA_GPU_TEST_ONLY=name,name runs a subset (e.g. under compute-sanitizer).
    const char *only = std::getenv("MLA_GPU_TEST_ONLY");
    auto selected = [only](const char *name) {
        if (!only || !*only) return true;
        const std::string list = std::string(",") + only + ",";
        return list.find(std::string(",") + name + ",") != std::string::npos;
    };
    int failed = 0, ran = 0;
    for (const auto &t : tests) {
        if (!selected(t.first)) continue;
        const std::string name = t.first;
        if (kEmulated && (name == "graph_capture" || name == "long_sequence" || name == "large_pool")) {
            std::printf("[ SKIPPED  ] %s: not run on the CPU emulation\n", t.first);
            continue;
        }
        ++ran;
        std::printf("[ RUN      ] %s\n", t.first);
        std::fflush(stdout);
        try {
            t.second();
            std::printf("[       OK ] %s\n", t.first);
        } catch (const std::exception &e) {
            ++failed;
            std::printf("[  FAILED  ] %s: %s\n", t.first, e.what());
            tu_print_seed();
        }
        std::fflush(stdout);
    }
    std::printf("test_gpu summary: %d/%d tests passed; %d random configs (%d failed, %d dtype pairs, batch <= %d, "
                "kv_len <= %d), %zu rows checked; worst out error %.3f of tolerance (|err| %.3g, %s), worst lse error "
                "%.3f of tolerance\n",
                ran - failed, ran, g_stats.configs, g_stats.failed, g_stats.pairs_seen,
                g_stats.max_batch, g_stats.max_kv, g_stats.rows, g_stats.worst_ratio, g_stats.worst_abs,
                g_stats.worst_where.empty() ? "-" : g_stats.worst_where.c_str(), g_stats.worst_lse_ratio);
    if (ran == 0) {
        std::printf("test_gpu: MLA_GPU_TEST_ONLY=%s names no test\n", only);
        return 1;
    }
    return failed ? 1 : 0;
}

#endif  // DM_HAVE_GPU
