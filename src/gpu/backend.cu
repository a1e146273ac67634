// GPU backend: device buffers of a plan, metadata upload or on-device
// scheduling, and the launches of one execute. Never allocates or
// synchronises in execute (except under MLA_FLAG_VALIDATE_DEVICE_INPUTS).
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <optional>

#include "../errors.h"
#include "../plan.h"
#include "kernels.h"
#include "runtime.h"

namespace mla {
namespace gpu {
namespace {

using LaunchFn = hipError_t (*)(const AttentionParams &, int, hipStream_t, bool);
using PrepareFn = hipError_t (*)(int);
using SmemFn = int (*)();
using OccupancyFn = int (*)();
using KindFn = bool (*)();

struct Variant {
    LaunchFn launch;
    PrepareFn prepare;
    SmemFn smem;
    OccupancyFn blocks_per_sm;
    KindFn warpgroup;
};

template <int ROWS, int KV>
constexpr Variant variant() {
    return {&launch_attention<ROWS, KV>, &prepare_attention<ROWS, KV>, &attention_smem_bytes<ROWS, KV>,
            &attention_blocks_per_sm<ROWS, KV>, &attention_is_warpgroup<ROWS, KV>};
}

template <int ROWS>
bool pick_kv(mla_dtype kv, Variant *v) {
    switch (kv) {
        case MLA_DTYPE_BF16: *v = variant<ROWS, MLA_DTYPE_BF16>(); return true;
        case MLA_DTYPE_FP8_E4M3: *v = variant<ROWS, MLA_DTYPE_FP8_E4M3>(); return true;
        case MLA_DTYPE_FP8_E4M3_FNUZ: *v = variant<ROWS, MLA_DTYPE_FP8_E4M3_FNUZ>(); return true;
        case MLA_DTYPE_MXFP4: *v = variant<ROWS, MLA_DTYPE_MXFP4>(); return true;
        default: return false;
    }
}

bool pick_variant(int rows, mla_dtype kv, Variant *v) {
    switch (rows) {
        case 16: return pick_kv<16>(kv, v);
        case 32: return pick_kv<32>(kv, v);
        case 64: return pick_kv<64>(kv, v);
        default: return false;
    }
}

// Device metadata buffer: [summary][zero block][seqs: max_batch][items:
// max_items]. The zero block is zeroed at creation and never written (the
// host staging buffer's copy of it is zeroed too, since an upload copies
// the summary's whole 256-byte region).
struct MetadataLayout {
    static constexpr size_t kZerosOffset = 128;
    size_t seqs_offset, items_offset, bytes;
    explicit MetadataLayout(const ScheduleGeometry &g) {
        static_assert(sizeof(ScheduleSummary) <= kZerosOffset && kZerosOffset + kZeroBytes <= 256, "metadata head");
        seqs_offset = 256;
        items_offset = seqs_offset + ((size_t(g.max_batch) * sizeof(SeqSchedule) + 255) / 256) * 256;
        bytes = items_offset + size_t(g.max_items) * sizeof(WorkItem);
    }
};

class GpuBackend final : public Backend {
public:
    GpuBackend(const PlanConfig &cfg) : cfg_(cfg), layout_(ScheduleGeometry{}) {}

    ~GpuBackend() override {
        if (!metadata_) return;  // init failed before any device resource
        int previous = -1;
        if (hipGetDevice(&previous) == hipSuccess && previous != cfg_.device) (void)hipSetDevice(cfg_.device);
        if (upload_done_) {
            (void)hipEventSynchronize(upload_done_);
            (void)hipEventDestroy(upload_done_);
        }
        if (host_staging_) (void)hipHostFree(host_staging_);
        if (metadata_) (void)hipFree(metadata_);
        if (workspace_) (void)hipFree(workspace_);
        if (validation_) (void)hipFree(validation_);
        if (previous >= 0 && previous != cfg_.device) (void)hipSetDevice(previous);
    }

    mla_status init() {
        int count = 0;
        const hipError_t err = hipGetDeviceCount(&count);
        if (err != hipSuccess || count == 0)
            return fail(MLA_ERROR_BACKEND_UNAVAILABLE, "MLA_BACKEND_GPU requested, but no GPU is usable (%s)",
                        err != hipSuccess ? hipGetErrorString(err) : "no devices");
        if (cfg_.device >= count)
            return fail(MLA_ERROR_INVALID_DEVICE, "desc->device = %d, but only %d GPU(s) are present", cfg_.device,
                        count);
        DeviceGuard guard(cfg_.device);
        MLA_TRY(guard.status());
        int sms = 0, smem_optin = 0;
        MLA_GPU_TRY(hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, cfg_.device));
        MLA_GPU_TRY(hipDeviceGetAttribute(&smem_optin, hipDeviceAttributeMaxSharedMemoryPerBlockOptin, cfg_.device));

        // The balanced scheduler targets one work item per resident CTA. The
        // kernel variant depends only on the row tile: take the largest row
        // tile the heads need whose shared memory fits the device (AMD's
        // 64 KB fit 16 rows), then size the schedule by its occupancy. Where
        // 32 rows run the warpgroup kernel and 64 do not (bf16 and E4M3 on
        // sm_90a), wider rows take more 32-row head blocks instead: per query
        // row the 32-row warpgroup kernel costs less than the 64-row mma.sync
        // one, and the blocks of one sequence run side by side, so the
        // second reads the KV from L2 (docs/performance.md, v15).
        int max_rows = 64;
        Variant v32{}, v64{};
        if (pick_variant(32, cfg_.kv_dtype, &v32) && pick_variant(64, cfg_.kv_dtype, &v64) && v32.warpgroup() &&
            !v64.warpgroup())
            max_rows = 32;
        for (;;) {
            geometry_ = make_geometry(cfg_, sms, kMinSplitBlocks, max_rows);
            if (!pick_variant(geometry_.rows_per_item, cfg_.kv_dtype, &variant_))
                return fail(MLA_ERROR_INTERNAL, "no kernel for %d rows and kv dtype %d", geometry_.rows_per_item,
                            int(cfg_.kv_dtype));
            if (variant_.smem() <= smem_optin) break;
            if (geometry_.rows_per_item == 16)
                return fail(MLA_ERROR_BACKEND_UNAVAILABLE,
                            "the kernel needs %d bytes of shared memory per block, device %d allows %d",
                            variant_.smem(), cfg_.device, smem_optin);
            max_rows = geometry_.rows_per_item / 2;
        }
        MLA_GPU_TRY(variant_.prepare(smem_optin));
        sms_ = sms;
        overlap_launches_ = launches_can_overlap(cfg_.device);
        geometry_ = make_geometry(cfg_, sms * variant_.blocks_per_sm(), kMinSplitBlocks, max_rows);
        layout_ = MetadataLayout(geometry_);
        MLA_GPU_TRY(hipMalloc(&metadata_, layout_.bytes));
        // Finished before the plan is returned: the caller's first build or
        // execute may be on a non-blocking stream, which does not wait for
        // the default stream this memset runs on, and the zero block must
        // be zero when the kernels read it.
        MLA_GPU_TRY(hipMemsetAsync(metadata_, 0, layout_.bytes, nullptr));
        MLA_GPU_TRY(hipStreamSynchronize(nullptr));
        MLA_GPU_TRY(hipHostMalloc(&host_staging_, layout_.bytes, 0));
        std::memset(host_staging_, 0, layout_.bytes);
        MLA_GPU_TRY(hipEventCreateWithFlags(&upload_done_, hipEventDisableTiming));
        MLA_GPU_TRY(hipMalloc(&validation_, 4 * sizeof(int32_t)));
        if (!(cfg_.flags & MLA_FLAG_CALLER_WORKSPACE) && workspace_bytes() > 0)
            MLA_GPU_TRY(hipMalloc(&workspace_, workspace_bytes()));
        return MLA_SUCCESS;
    }

    const ScheduleGeometry &geometry() const override { return geometry_; }
    void *owned_workspace() override { return workspace_; }

    mla_status upload_schedule(const HostSchedule &sched, void *stream) override {
        DeviceGuard guard(cfg_.device);
        MLA_TRY(guard.status());
        // The staging buffer may still feed the previous upload.
        MLA_GPU_TRY(hipEventSynchronize(upload_done_));
        uint8_t *h = static_cast<uint8_t *>(host_staging_);
        std::memcpy(h, &sched.summary, sizeof(ScheduleSummary));
        std::memcpy(h + layout_.seqs_offset, sched.seqs.data(), sched.seqs.size() * sizeof(SeqSchedule));
        std::memcpy(h + layout_.items_offset, sched.items.data(), sched.items.size() * sizeof(WorkItem));
        const hipStream_t s = static_cast<hipStream_t>(stream);
        // Copy only what this step uses: summary + its sequences, and its items.
        MLA_GPU_TRY(hipMemcpyAsync(metadata_, h, layout_.seqs_offset + sched.seqs.size() * sizeof(SeqSchedule),
                                   hipMemcpyHostToDevice, s));
        if (!sched.items.empty())
            MLA_GPU_TRY(hipMemcpyAsync(static_cast<uint8_t *>(metadata_) + layout_.items_offset,
                                       h + layout_.items_offset, sched.items.size() * sizeof(WorkItem),
                                       hipMemcpyHostToDevice, s));
        MLA_GPU_TRY(hipEventRecord(upload_done_, s));
        host_step_ = sched.summary;
        deep_combine_ = sched.summary.max_splits > kCombineBatchSplits;
        return MLA_SUCCESS;
    }

    mla_status build_metadata_device(const mla_batch &batch, void *stream) override {
        DeviceGuard guard(cfg_.device);
        MLA_TRY(guard.status());
        MetadataParams p{};
        p.qo_indptr = batch.qo_indptr;
        p.kv_indptr = batch.kv_indptr;
        p.kv_last_page_len = batch.kv_last_page_len;
        p.batch_size = batch.batch_size;
        p.geometry = geometry_;
        p.summary = summary();
        p.seqs = seqs();
        p.items = items();
        const hipStream_t s = static_cast<hipStream_t>(stream);
        MLA_GPU_TRY(launch_metadata(p, s));
        host_step_.reset();  // (its items and splits are decided on the device)
        // Splits are decided on the device too: more than a combine batch
        // is likely only where the batch's head blocks are few per SM.
        deep_combine_ = int64_t(batch.batch_size) * geometry_.head_blocks * kCombineBatchSplits <= sms_;
        if (cfg_.flags & MLA_FLAG_VALIDATE_DEVICE_INPUTS) {
            ScheduleSummary host{};
            MLA_GPU_TRY(hipMemcpyAsync(&host, p.summary, sizeof host, hipMemcpyDeviceToHost, s));
            MLA_GPU_TRY(hipStreamSynchronize(s));
            if (host.error != SCHED_OK) {
                schedule_error_status(host.error, host.error_seq, host.error_value, geometry_);
                return fail(MLA_ERROR_DEVICE_VALIDATION_FAILED, "device-side check: %s", mla_last_error_message());
            }
        }
        return MLA_SUCCESS;
    }

    mla_status execute(const mla_tensors &t, void *workspace, void *stream) override {
        DeviceGuard guard(cfg_.device);
        MLA_TRY(guard.status());
        const hipStream_t s = static_cast<hipStream_t>(stream);
        const ScheduleGeometry &g = geometry_;
        const bool fp8_q = cfg_.q_dtype != MLA_DTYPE_BF16;
        const bool fp8_kv = cfg_.kv_dtype == MLA_DTYPE_FP8_E4M3 || cfg_.kv_dtype == MLA_DTYPE_FP8_E4M3_FNUZ;
        int page_shift = 0;
        while ((1 << page_shift) < cfg_.page_size) ++page_shift;

        if (cfg_.flags & MLA_FLAG_VALIDATE_DEVICE_INPUTS) {
            MLA_GPU_TRY(hipMemsetAsync(validation_, 0, 4 * sizeof(int32_t), s));
            MLA_GPU_TRY(launch_validate_pages(summary(), items(), t.kv_indices, page_shift, t.num_pages, g.max_items,
                                              static_cast<int32_t *>(validation_), s));
            int32_t bad[4] = {0, 0, 0, 0};
            MLA_GPU_TRY(hipMemcpyAsync(bad, validation_, sizeof bad, hipMemcpyDeviceToHost, s));
            MLA_GPU_TRY(hipStreamSynchronize(s));
            if (bad[0])
                return fail(MLA_ERROR_DEVICE_VALIDATION_FAILED,
                            "device-side check: page %d of sequence %d (kv_indices[%d]) is outside 0..num_pages-1 "
                            "(num_pages = %lld)",
                            bad[1], bad[2], bad[3], (long long)t.num_pages);
        }

        AttentionParams p{};
        p.q = static_cast<const uint8_t *>(t.q);
        p.kv = static_cast<const uint8_t *>(t.kv);
        p.kv_block_scales = t.kv_block_scales;
        p.kv_indices = t.kv_indices;
        p.out = static_cast<uint16_t *>(t.out);
        p.lse = t.lse;
        p.partials = static_cast<float *>(workspace);
        p.summary = summary();
        p.items = items();
        p.zeros = static_cast<const uint8_t *>(metadata_) + MetadataLayout::kZerosOffset;
        p.num_pages = t.num_pages;
        p.num_heads = cfg_.num_heads;
        p.heads_per_block = g.heads_per_block;
        p.page_shift = page_shift;
        p.q_dtype = cfg_.q_dtype;
        p.scale_stride = t.kv_scale_stride;
        p.slot_floats = int32_t(partial_slot_bytes(g.rows_per_item) / sizeof(float));
        p.qk_scale = cfg_.sm_scale * (fp8_q ? t.q_scale : 1.0f) * (fp8_kv ? t.kv_scale : 1.0f);
        p.v_scale = fp8_kv ? t.kv_scale : 1.0f;
        p.logit_cap = cfg_.logit_cap;
        // What a graph captures must stay valid for any later step, so the
        // grids are the plan's bounds unless this step's host-built schedule
        // is known and nothing is being captured. Then the CTAs past its
        // items and sequences are not launched: most of them would start
        // only as the step's own CTAs finish, and each still loads the
        // schedule, waits and exits before the grid completes (about 1 us
        // of a small step: docs/performance.md, v22).
        hipStreamCaptureStatus capture = hipStreamCaptureStatusNone;
        if (host_step_) {
            MLA_GPU_TRY(hipStreamIsCapturing(s, &capture));
        }
        const ScheduleSummary *step = host_step_ && capture == hipStreamCaptureStatusNone ? &*host_step_ : nullptr;
        MLA_GPU_TRY(variant_.launch(p, step ? std::max(step->num_items, 1) : g.max_items, s, overlap_launches_));

        // The combine kernel has nothing to do for a step whose host-built
        // schedule has no split; a graph being captured keeps it, as a
        // replay may follow a step that splits.
        const bool combine = (g.mode != SPLIT_FORCED || g.forced_splits > 1) && (!step || step->max_splits > 1);
        if (combine) {
            CombineParams c{};
            c.summary = summary();
            c.seqs = seqs();
            c.partials = p.partials;
            c.out = p.out;
            c.lse = t.lse;
            c.num_heads = cfg_.num_heads;
            c.heads_per_block = g.heads_per_block;
            c.head_blocks = g.head_blocks;
            c.rows_per_item = g.rows_per_item;
            c.slot_floats = p.slot_floats;
            const int batch = step ? std::max(step->batch_size, 1) : g.max_batch;
            MLA_GPU_TRY(launch_combine(c, combine_grid(batch, g.head_blocks, g.rows_per_item), deep_combine_, s,
                                       overlap_launches_));
        }
        return MLA_SUCCESS;
    }

private:
    static constexpr int32_t kMinSplitBlocks = 1;

    ScheduleSummary *summary() { return static_cast<ScheduleSummary *>(metadata_); }
    SeqSchedule *seqs() { return reinterpret_cast<SeqSchedule *>(static_cast<uint8_t *>(metadata_) + layout_.seqs_offset); }
    WorkItem *items() { return reinterpret_cast<WorkItem *>(static_cast<uint8_t *>(metadata_) + layout_.items_offset); }

    PlanConfig cfg_;
    ScheduleGeometry geometry_{};
    Variant variant_{};
    MetadataLayout layout_;
    void *metadata_ = nullptr;
    void *host_staging_ = nullptr;
    void *workspace_ = nullptr;
    void *validation_ = nullptr;
    hipEvent_t upload_done_ = nullptr;
    bool overlap_launches_ = false;  // execute's kernels start while their predecessor drains (runtime.h)
    std::optional<ScheduleSummary> host_step_;  // the last host-built schedule's; none after a device build
    int sms_ = 1;                    // multiprocessors (the device path's guess at deep_combine_)
    bool deep_combine_ = true;       // the step may have more than kCombineBatchSplits splits
};

}  // namespace
}  // namespace gpu

std::unique_ptr<Backend> make_gpu_backend(const PlanConfig &cfg, mla_status *status) {
    std::unique_ptr<gpu::GpuBackend> b(new (std::nothrow) gpu::GpuBackend(cfg));
    if (!b) {
        *status = fail(MLA_ERROR_OUT_OF_MEMORY, "could not allocate the GPU backend");
        return nullptr;
    }
    *status = b->init();
    if (*status != MLA_SUCCESS) return nullptr;
    return std::unique_ptr<Backend>(b.release());
}

int gpu_device_count() {
    int count = 0;
    if (hipGetDeviceCount(&count) != hipSuccess) return 0;
    return count;
}

}  // namespace mla
