// CPU backend: the reference implementation of DESIGN §1 on the shared
// schedule. Float32 arithmetic throughout; the work items of the schedule run
// in parallel on the plan's thread pool, then split sequences are combined.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "../errors.h"
#include "../formats.h"
#include "../plan.h"
#include "thread_pool.h"

namespace mla {
namespace {

constexpr int kDim = MLA_HEAD_DIM_QK;
constexpr int kDimV = MLA_HEAD_DIM_V;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Scratch of one thread: a decoded KV block and one item's rows.
struct Scratch {
    std::vector<float> kv;     // [block_tokens][576]
    std::vector<float> q;      // [rows][576], already times sm_scale
    std::vector<float> acc;    // [rows][512]
    std::vector<float> m, l;   // running max and sum per row
    std::vector<float> s;      // one row's scores over the block
};

float dot576(const float *a, const float *b) {
    float part[16] = {0};
    for (int i = 0; i < kDim; i += 16)
        for (int k = 0; k < 16; ++k) part[k] += a[i + k] * b[i + k];
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) sum += part[k];
    return sum;
}

class CpuBackend final : public Backend {
public:
    CpuBackend(const PlanConfig &cfg, int threads)
        : cfg_(cfg), pool_(threads), geometry_(make_geometry(cfg, threads * 4, 2)) {
        scratch_.resize(size_t(pool_.size()));
        const int rows = geometry_.rows_per_item, bt = kScheduleBlockTokens;
        for (Scratch &s : scratch_) {
            s.kv.resize(size_t(bt) * kDim);
            s.q.resize(size_t(rows) * kDim);
            s.acc.resize(size_t(rows) * kDimV);
            s.m.resize(size_t(rows));
            s.l.resize(size_t(rows));
            s.s.resize(size_t(bt));
        }
        if (!(cfg.flags & MLA_FLAG_CALLER_WORKSPACE)) workspace_.reset(new float[workspace_bytes() / sizeof(float) + 1]);
    }

    const ScheduleGeometry &geometry() const override { return geometry_; }
    void *owned_workspace() override { return workspace_.get(); }

    mla_status upload_schedule(const HostSchedule &sched, void *) override {
        sched_ = &sched;
        combine_.clear();
        for (size_t b = 0; b < sched.seqs.size(); ++b)
            if (sched.seqs[b].splits > 1)
                for (int32_t hb = 0; hb < geometry_.head_blocks; ++hb) combine_.push_back({int32_t(b), hb});
        return MLA_SUCCESS;
    }

    mla_status build_metadata_device(const mla_batch &, void *) override {
        return fail(MLA_ERROR_INVALID_VALUE, "device-resident metadata needs a GPU plan");
    }

    mla_status execute(const mla_tensors &t, void *workspace, void *) override {
        float *partials = static_cast<float *>(workspace);
        const std::vector<WorkItem> &items = sched_->items;
        pool_.parallel_for(int(items.size()),
                           [&](int i, int tid) { run_item(items[size_t(i)], t, partials, scratch_[size_t(tid)]); });
        pool_.parallel_for(int(combine_.size()),
                           [&](int i, int) { combine(combine_[size_t(i)].first, combine_[size_t(i)].second, t, partials); });
        return MLA_SUCCESS;
    }

private:
    // Heads [h0, h1) of head block hb.
    void head_range(int32_t hb, int32_t *h0, int32_t *h1) const {
        *h0 = hb * geometry_.heads_per_block;
        *h1 = std::min(cfg_.num_heads, *h0 + geometry_.heads_per_block);
    }

    void run_item(const WorkItem &w, const mla_tensors &t, float *partials, Scratch &sc) const {
        int32_t h0, h1;
        head_range(w.head_block, &h0, &h1);
        const int32_t nh = h1 - h0, rows = w.q_len * nh;
        const uint8_t *q = static_cast<const uint8_t *>(t.q);
        const size_t q_row = size_t(q_row_bytes(cfg_.q_dtype));
        for (int32_t r = 0; r < rows; ++r) {
            const int32_t tok = w.q_begin + r / nh, h = h0 + r % nh;
            float *dst = &sc.q[size_t(r) * kDim];
            decode_q_row(cfg_.q_dtype, q + (size_t(tok) * cfg_.num_heads + size_t(h)) * q_row, t.q_scale, dst);
            for (int i = 0; i < kDim; ++i) dst[i] *= cfg_.sm_scale;
            sc.m[size_t(r)] = kNegInf;
            sc.l[size_t(r)] = 0.0f;
        }
        std::fill(sc.acc.begin(), sc.acc.begin() + size_t(rows) * kDimV, 0.0f);

        const uint8_t *kv = static_cast<const uint8_t *>(t.kv);
        const size_t row_bytes = size_t(kv_row_bytes(cfg_.kv_dtype));
        const int32_t shift = __builtin_ctz(unsigned(cfg_.page_size)), mask = cfg_.page_size - 1;
        for (int32_t j0 = w.kv_begin; j0 < w.kv_end; j0 += kScheduleBlockTokens) {
            const int32_t nj = std::min(kScheduleBlockTokens, w.kv_end - j0);
            for (int32_t j = 0; j < nj; ++j) {
                const int32_t tokj = j0 + j;
                const int64_t slot = w.page_begin + (tokj >> shift);
                const int64_t page = t.kv_indices ? t.kv_indices[slot] : slot;
                const int64_t row = page * cfg_.page_size + (tokj & mask);
                const uint8_t *scales =
                    t.kv_block_scales ? t.kv_block_scales + size_t(row) * size_t(t.kv_scale_stride) : nullptr;
                decode_kv_row(cfg_.kv_dtype, kv + size_t(row) * row_bytes, scales, t.kv_scale, 0, kDim,
                              &sc.kv[size_t(j) * kDim]);
            }
            for (int32_t r = 0; r < rows; ++r) {
                // Causal: query token i of n sees keys j <= L - n + i.
                const int32_t visible_end = w.kv_len - w.q_len + r / nh + 1;
                const int32_t nvis = std::max(0, std::min(nj, visible_end - j0));
                if (nvis == 0) continue;
                const float *qr = &sc.q[size_t(r) * kDim];
                float block_max = kNegInf;
                for (int32_t j = 0; j < nvis; ++j) {
                    float s = score_nonfinite_to_nan(dot576(qr, &sc.kv[size_t(j) * kDim]));
                    if (cfg_.logit_cap > 0.0f) s = capped_score(s, cfg_.logit_cap);
                    sc.s[size_t(j)] = s;
                    block_max = std::max(block_max, s);
                }
                float &m = sc.m[size_t(r)], &l = sc.l[size_t(r)];
                const float m_new = std::max(m, block_max);
                const float alpha = std::exp(m - m_new);  // exp(-inf) = 0 on the first block
                float *acc = &sc.acc[size_t(r) * kDimV];
                if (alpha != 1.0f)
                    for (int d = 0; d < kDimV; ++d) acc[d] *= alpha;
                float sum = 0.0f;
                for (int32_t j = 0; j < nvis; ++j) {
                    const float p = std::exp(sc.s[size_t(j)] - m_new);
                    sum += p;
                    const float *v = &sc.kv[size_t(j) * kDim];
                    for (int d = 0; d < kDimV; ++d) acc[d] += p * v[d];
                }
                l = l * alpha + sum;
                m = m_new;
            }
        }

        uint16_t *out = static_cast<uint16_t *>(t.out);
        for (int32_t r = 0; r < rows; ++r) {
            const int32_t tok = w.q_begin + r / nh, h = h0 + r % nh;
            // l == 0 exactly when the row has no visible key. A NaN or inf in
            // a visible key (an E8M0 255 scale, an fp8 NaN code, an overflowing
            // dequant) makes l NaN: out and lse are then NaN as well, never the
            // 0 / -inf of an empty row, which would hide it.
            const float l = sc.l[size_t(r)];
            const float inv = l != 0.0f ? 1.0f / l : 0.0f;
            const float lse = l != 0.0f ? sc.m[size_t(r)] + std::log(l) : kNegInf;
            const float *acc = &sc.acc[size_t(r) * kDimV];
            if (w.partial_slot < 0) {
                uint16_t *o = out + (size_t(tok) * cfg_.num_heads + size_t(h)) * kDimV;
                for (int d = 0; d < kDimV; ++d) o[d] = float_to_bf16(acc[d] * inv);
                if (t.lse) t.lse[size_t(tok) * cfg_.num_heads + size_t(h)] = lse;
            } else {
                float *slot = partial_slot(partials, w.partial_slot);
                float *o = slot + size_t(r) * kDimV;
                for (int d = 0; d < kDimV; ++d) o[d] = acc[d] * inv;
                slot[size_t(geometry_.rows_per_item) * kDimV + size_t(r)] = lse;
            }
        }
    }

    float *partial_slot(float *partials, int32_t slot) const {
        return partials + size_t(slot) * partial_slot_bytes(geometry_.rows_per_item) / sizeof(float);
    }

    // Merge the splits of (sequence b, head block hb) in split order.
    void combine(int32_t b, int32_t hb, const mla_tensors &t, float *partials) const {
        const SeqSchedule &s = sched_->seqs[size_t(b)];
        int32_t h0, h1;
        head_range(hb, &h0, &h1);
        const int32_t nh = h1 - h0, rows = s.q_len * nh;
        const int32_t first = s.partial_first + hb * s.splits;
        const size_t lse_off = size_t(geometry_.rows_per_item) * kDimV;
        float acc[kDimV];
        for (int32_t r = 0; r < rows; ++r) {
            // Largest split LSE; a NaN one (a split that met a non-finite key)
            // wins, so the NaN reaches out and lse as it does without splits.
            float m = kNegInf;
            for (int32_t k = 0; k < s.splits; ++k)
                m = max_nan_wins(m, partial_slot(partials, first + k)[lse_off + size_t(r)]);
            const int32_t tok = s.q_begin + r / nh, h = h0 + r % nh;
            uint16_t *o = static_cast<uint16_t *>(t.out) + (size_t(tok) * cfg_.num_heads + size_t(h)) * kDimV;
            float *lse_out = t.lse ? &t.lse[size_t(tok) * cfg_.num_heads + size_t(h)] : nullptr;
            if (m == kNegInf) {
                std::memset(o, 0, kDimV * sizeof(uint16_t));
                if (lse_out) *lse_out = kNegInf;
                continue;
            }
            std::fill(acc, acc + kDimV, 0.0f);
            float wsum = 0.0f;
            for (int32_t k = 0; k < s.splits; ++k) {
                const float *slot = partial_slot(partials, first + k);
                const float wk = std::exp(slot[lse_off + size_t(r)] - m);
                wsum += wk;
                const float *p = slot + size_t(r) * kDimV;
                for (int d = 0; d < kDimV; ++d) acc[d] += wk * p[d];
            }
            const float inv = 1.0f / wsum;
            for (int d = 0; d < kDimV; ++d) o[d] = float_to_bf16(acc[d] * inv);
            if (lse_out) *lse_out = m + std::log(wsum);
        }
    }

    PlanConfig cfg_;
    ThreadPool pool_;
    ScheduleGeometry geometry_;
    std::vector<Scratch> scratch_;
    std::unique_ptr<float[]> workspace_;
    const HostSchedule *sched_ = nullptr;
    std::vector<std::pair<int32_t, int32_t>> combine_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const PlanConfig &cfg, mla_status *status) {
    int threads = cfg.num_threads;
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    try {
        std::unique_ptr<Backend> b(new CpuBackend(cfg, threads));
        *status = MLA_SUCCESS;
        return b;
    } catch (const std::bad_alloc &) {
        *status = fail(MLA_ERROR_OUT_OF_MEMORY, "could not allocate the CPU backend's buffers");
    } catch (const std::system_error &e) {
        *status = fail(MLA_ERROR_OUT_OF_MEMORY, "could not start the CPU worker threads: %s", e.what());
    }
    return nullptr;
}

}  // namespace mla
