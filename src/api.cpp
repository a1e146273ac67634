// C entry points: argument validation, error reporting and dispatch to the
// backend. Everything a caller can get wrong is refused here, on the host,
// before any backend code runs.
#include <cmath>
#include <cstring>
#include <new>

#include "errors.h"
#include "formats.h"
#include "plan.h"

using namespace mla;

namespace {

// Copy a caller's descriptor into ours. Callers built against an older header
// pass a smaller struct (not possible yet: this is the first layout); a newer
// header's larger struct is accepted when its unknown tail is zero.
template <typename T>
mla_status read_struct(const T *in, T *out, const char *name) {
    if (!in) return fail(MLA_ERROR_NULL_POINTER, "%s is NULL", name);
    const size_t size = in->struct_size;
    if (size < sizeof(T))
        return fail(MLA_ERROR_STRUCT_SIZE, "%s->struct_size = %zu, expected %zu (call the _init function first)", name,
                    size, sizeof(T));
    const unsigned char *tail = reinterpret_cast<const unsigned char *>(in) + sizeof(T);
    for (size_t i = 0; i < size - sizeof(T); ++i)
        if (tail[i] != 0)
            return fail(MLA_ERROR_STRUCT_SIZE,
                        "%s->struct_size = %zu: the %zu bytes beyond this library's %zu are not zero", name, size,
                        size - sizeof(T), sizeof(T));
    std::memcpy(static_cast<void *>(out), in, sizeof(T));
    out->struct_size = sizeof(T);
    return MLA_SUCCESS;
}

// The enum fields of the caller's structs (dtypes, backend, memory) are read
// as the int they hold: a C caller can store any int there, and loading a
// value outside the enumerators' range through the C++ enum type is undefined
// behaviour (UBSan -fsanitize=enum reports it). Only validated values are
// converted back to the enum type.
template <typename E>
int32_t enum_int(const E &field) {
    static_assert(sizeof(E) == sizeof(int32_t), "libmla enums are int-sized");
    int32_t v;
    std::memcpy(&v, &field, sizeof v);
    return v;
}

bool is_fp8(int32_t d) { return d == MLA_DTYPE_FP8_E4M3 || d == MLA_DTYPE_FP8_E4M3_FNUZ; }

const char *dtype_name(int32_t d) {
    switch (d) {
        case MLA_DTYPE_DEFAULT: return "DEFAULT";
        case MLA_DTYPE_BF16: return "BF16";
        case MLA_DTYPE_FP8_E4M3: return "FP8_E4M3";
        case MLA_DTYPE_FP8_E4M3_FNUZ: return "FP8_E4M3_FNUZ";
        case MLA_DTYPE_MXFP4: return "MXFP4";
        case MLA_DTYPE_FLOAT32: return "FLOAT32";
        default: return "unknown";
    }
}

mla_status resolve_config(const mla_plan_desc &d, PlanConfig &c) {
    if (d.num_heads < 1 || d.num_heads > MLA_MAX_HEADS)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->num_heads = %d is outside 1..%d", d.num_heads, MLA_MAX_HEADS);
    if (d.head_dim_qk != 0 && d.head_dim_qk != MLA_HEAD_DIM_QK)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->head_dim_qk = %d; only %d is supported", d.head_dim_qk,
                    MLA_HEAD_DIM_QK);
    if (d.head_dim_v != 0 && d.head_dim_v != MLA_HEAD_DIM_V)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->head_dim_v = %d; only %d is supported", d.head_dim_v,
                    MLA_HEAD_DIM_V);
    const int32_t q_in = enum_int(d.q_dtype), kv_in = enum_int(d.kv_dtype), out_in = enum_int(d.out_dtype);
    const int32_t q_dtype = q_in == MLA_DTYPE_DEFAULT ? MLA_DTYPE_BF16 : q_in;
    const int32_t kv_dtype = kv_in == MLA_DTYPE_DEFAULT ? MLA_DTYPE_BF16 : kv_in;
    if (q_dtype != MLA_DTYPE_BF16 && !is_fp8(q_dtype))
        return fail(MLA_ERROR_UNSUPPORTED_DTYPE, "desc->q_dtype = %s (%d); Q must be BF16, FP8_E4M3 or FP8_E4M3_FNUZ",
                    dtype_name(q_dtype), int(q_in));
    if (kv_dtype != MLA_DTYPE_BF16 && !is_fp8(kv_dtype) && kv_dtype != MLA_DTYPE_MXFP4)
        return fail(MLA_ERROR_UNSUPPORTED_DTYPE,
                    "desc->kv_dtype = %s (%d); KV must be BF16, FP8_E4M3, FP8_E4M3_FNUZ or MXFP4",
                    dtype_name(kv_dtype), int(kv_in));
    if (is_fp8(q_dtype) && is_fp8(kv_dtype) && q_dtype != kv_dtype)
        return fail(MLA_ERROR_UNSUPPORTED_DTYPE, "desc->q_dtype = %s with kv_dtype = %s: the FP8 flavours must match",
                    dtype_name(q_dtype), dtype_name(kv_dtype));
    if (out_in != MLA_DTYPE_DEFAULT && out_in != MLA_DTYPE_BF16)
        return fail(MLA_ERROR_UNSUPPORTED_DTYPE, "desc->out_dtype = %s (%d); only BF16 output is supported",
                    dtype_name(out_in), int(out_in));
    c.q_dtype = mla_dtype(q_dtype);
    c.kv_dtype = mla_dtype(kv_dtype);
    c.page_size = d.page_size == 0 ? 1 : d.page_size;
    if (c.page_size < 1 || c.page_size > MLA_MAX_PAGE_SIZE || (c.page_size & (c.page_size - 1)) != 0)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->page_size = %d is not a power of two in 1..%d", d.page_size,
                    MLA_MAX_PAGE_SIZE);
    c.max_batch_size = d.max_batch_size == 0 ? 256 : d.max_batch_size;
    if (c.max_batch_size < 1 || c.max_batch_size > 65536)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->max_batch_size = %d is outside 1..65536", d.max_batch_size);
    c.max_q_len = d.max_q_len == 0 ? 1 : d.max_q_len;
    if (c.max_q_len < 1 || c.max_q_len > MLA_MAX_Q_LEN)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->max_q_len = %d is outside 1..%d", d.max_q_len, MLA_MAX_Q_LEN);
    c.sm_scale = d.sm_scale == 0.0f ? 1.0f / std::sqrt(float(MLA_HEAD_DIM_QK)) : d.sm_scale;
    if (!std::isfinite(c.sm_scale) || c.sm_scale <= 0.0f)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->sm_scale = %g must be finite and positive", double(d.sm_scale));
    c.logit_cap = d.logit_cap;
    if (!std::isfinite(c.logit_cap) || c.logit_cap < 0.0f)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->logit_cap = %g must be finite and >= 0", double(d.logit_cap));
    c.num_splits = d.num_splits;
    if (c.num_splits < 0 || c.num_splits > MLA_MAX_SPLITS)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->num_splits = %d is outside 0..%d", d.num_splits, MLA_MAX_SPLITS);
    const uint32_t known = MLA_FLAG_DETERMINISTIC | MLA_FLAG_VALIDATE_DEVICE_INPUTS | MLA_FLAG_CALLER_WORKSPACE;
    if (d.flags & ~known)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->flags = 0x%x has unknown bits 0x%x", d.flags, d.flags & ~known);
    c.flags = d.flags;
    const int32_t backend = enum_int(d.backend);
    if (backend != MLA_BACKEND_AUTO && backend != MLA_BACKEND_CPU && backend != MLA_BACKEND_GPU)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->backend = %d is not an mla_backend", int(backend));
    c.backend = mla_backend(backend);
    if (d.device < 0) return fail(MLA_ERROR_INVALID_DEVICE, "desc->device = %d is negative", d.device);
    c.device = d.device;
    if (d.num_threads < 0 || d.num_threads > 1024)
        return fail(MLA_ERROR_INVALID_VALUE, "desc->num_threads = %d is outside 0..1024", d.num_threads);
    c.num_threads = d.num_threads;
    c.num_heads = d.num_heads;
    return MLA_SUCCESS;
}

bool aligned(const void *p, size_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

mla_status check_scale(float v, const char *name) {
    if (!std::isfinite(v) || v < 0.0f)
        return fail(MLA_ERROR_INVALID_VALUE, "tensors->%s = %g must be finite and >= 0 (0 means 1)", name, double(v));
    return MLA_SUCCESS;
}

mla_status validate_tensors(const mla_plan &plan, const mla_tensors &t) {
    const PlanConfig &c = plan.config;
    if (!t.q) return fail(MLA_ERROR_NULL_POINTER, "tensors->q is NULL");
    if (!t.kv) return fail(MLA_ERROR_NULL_POINTER, "tensors->kv is NULL");
    if (!t.out) return fail(MLA_ERROR_NULL_POINTER, "tensors->out is NULL");
    if (c.kv_dtype == MLA_DTYPE_MXFP4 && !t.kv_block_scales)
        return fail(MLA_ERROR_NULL_POINTER, "tensors->kv_block_scales is NULL but kv_dtype is MXFP4");
    if (!aligned(t.q, 16)) return fail(MLA_ERROR_MISALIGNED, "tensors->q = %p is not 16-byte aligned", t.q);
    if (!aligned(t.kv, 16)) return fail(MLA_ERROR_MISALIGNED, "tensors->kv = %p is not 16-byte aligned", t.kv);
    if (!aligned(t.out, 16)) return fail(MLA_ERROR_MISALIGNED, "tensors->out = %p is not 16-byte aligned", t.out);
    if (t.lse && !aligned(t.lse, 4))
        return fail(MLA_ERROR_MISALIGNED, "tensors->lse = %p is not 4-byte aligned", static_cast<void *>(t.lse));
    if (t.kv_indices && !aligned(t.kv_indices, 4))
        return fail(MLA_ERROR_MISALIGNED, "tensors->kv_indices = %p is not 4-byte aligned",
                    static_cast<const void *>(t.kv_indices));
    MLA_TRY(check_scale(t.q_scale, "q_scale"));
    MLA_TRY(check_scale(t.kv_scale, "kv_scale"));
    if (t.kv_scale_stride != 0 && (t.kv_scale_stride < MLA_MXFP4_SCALES_PER_ROW || t.kv_scale_stride > 4096))
        return fail(MLA_ERROR_INVALID_VALUE, "tensors->kv_scale_stride = %d is outside %d..4096 (0 means %d)",
                    t.kv_scale_stride, MLA_MXFP4_SCALES_PER_ROW, MLA_MXFP4_SCALES_PER_ROW);
    if (t.num_pages < 0)
        return fail(MLA_ERROR_INVALID_VALUE, "tensors->num_pages = %lld is negative", (long long)t.num_pages);
    const size_t need = plan.backend->workspace_bytes();
    if (t.workspace) {
        if (!aligned(t.workspace, 16))
            return fail(MLA_ERROR_MISALIGNED, "tensors->workspace = %p is not 16-byte aligned", t.workspace);
        if (t.workspace_size < need)
            return fail(MLA_ERROR_WORKSPACE_TOO_SMALL, "tensors->workspace_size = %zu, the plan needs %zu bytes",
                        t.workspace_size, need);
    } else if (need > 0 && (c.flags & MLA_FLAG_CALLER_WORKSPACE)) {
        return fail(MLA_ERROR_WORKSPACE_TOO_SMALL,
                    "tensors->workspace is NULL but the plan was made with MLA_FLAG_CALLER_WORKSPACE (%zu bytes needed)",
                    need);
    }
    // Page indices are host memory only for CPU plans; GPU plans check them on
    // the device under MLA_FLAG_VALIDATE_DEVICE_INPUTS. The identity table is
    // checked in O(1) from the last page any sequence owns.
    if (!plan.metadata_from_host || plan.last_batch_size == 0) return MLA_SUCCESS;
    const std::vector<SeqSchedule> &seqs = plan.host_schedule.seqs;
    if (!t.kv_indices) {
        const SeqSchedule &last = seqs[size_t(plan.last_batch_size - 1)];
        const int64_t end = last.page_begin + (last.kv_len == 0 ? 0 : ceil_div(last.kv_len, c.page_size));
        if (t.num_pages > 0 && end > t.num_pages)
            return fail(MLA_ERROR_PAGE_OUT_OF_RANGE,
                        "kv_indices is NULL (identity pages) but the batch uses pages up to %lld, above num_pages = %lld",
                        (long long)end - 1, (long long)t.num_pages);
    } else if (c.backend == MLA_BACKEND_CPU) {
        for (int32_t b = 0; b < plan.last_batch_size; ++b) {
            const SeqSchedule &s = seqs[size_t(b)];
            if (s.q_len == 0) continue;
            const int32_t pages = s.kv_len == 0 ? 0 : ceil_div(s.kv_len, c.page_size);
            for (int32_t p = s.page_begin; p < s.page_begin + pages; ++p) {
                const int64_t page = t.kv_indices[p];
                if (page < 0 || (t.num_pages > 0 && page >= t.num_pages))
                    return fail(MLA_ERROR_PAGE_OUT_OF_RANGE,
                                "page %lld of sequence %d (kv_indices[%d]) is outside 0..num_pages-1 (num_pages = %lld)",
                                (long long)page, b, p, (long long)t.num_pages);
            }
        }
    }
    return MLA_SUCCESS;
}

}  // namespace

extern "C" {

MLA_API int mla_version(void) { return MLA_VERSION; }

MLA_API mla_status mla_plan_desc_init(mla_plan_desc *desc) {
    clear_error();
    if (!desc) return fail(MLA_ERROR_NULL_POINTER, "desc is NULL");
    std::memset(static_cast<void *>(desc), 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_batch_init(mla_batch *batch) {
    clear_error();
    if (!batch) return fail(MLA_ERROR_NULL_POINTER, "batch is NULL");
    std::memset(static_cast<void *>(batch), 0, sizeof *batch);
    batch->struct_size = sizeof *batch;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_tensors_init(mla_tensors *tensors) {
    clear_error();
    if (!tensors) return fail(MLA_ERROR_NULL_POINTER, "tensors is NULL");
    std::memset(static_cast<void *>(tensors), 0, sizeof *tensors);
    tensors->struct_size = sizeof *tensors;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_schedule_info_init(mla_schedule_info *info) {
    clear_error();
    if (!info) return fail(MLA_ERROR_NULL_POINTER, "info is NULL");
    std::memset(static_cast<void *>(info), 0, sizeof *info);
    info->struct_size = sizeof *info;
    return MLA_SUCCESS;
}

MLA_API int mla_gpu_device_count(void) {
    clear_error();
    return gpu_device_count();
}

MLA_API mla_status mla_plan_create(const mla_plan_desc *desc_in, mla_plan **out) {
    clear_error();
    if (!out) return fail(MLA_ERROR_NULL_POINTER, "plan (the output pointer) is NULL");
    *out = nullptr;
    mla_plan_desc desc;
    MLA_TRY(read_struct(desc_in, &desc, "desc"));
    PlanConfig cfg{};
    MLA_TRY(resolve_config(desc, cfg));

    mla_status status = MLA_SUCCESS;
    std::unique_ptr<Backend> backend;
    if (cfg.backend == MLA_BACKEND_GPU) {
        backend = make_gpu_backend(cfg, &status);
    } else if (cfg.backend == MLA_BACKEND_AUTO) {
        if (gpu_device_count() > cfg.device) {
            cfg.backend = MLA_BACKEND_GPU;
            backend = make_gpu_backend(cfg, &status);
        } else {
            clear_error();
            cfg.backend = MLA_BACKEND_CPU;
            backend = make_cpu_backend(cfg, &status);
        }
    } else {
        backend = make_cpu_backend(cfg, &status);
    }
    if (!backend) return status != MLA_SUCCESS ? status : fail(MLA_ERROR_INTERNAL, "backend creation failed");

    mla_plan *plan = new (std::nothrow) mla_plan;
    if (!plan) return fail(MLA_ERROR_OUT_OF_MEMORY, "could not allocate the plan object");
    plan->config = cfg;
    plan->backend = std::move(backend);
    try {
        plan->host_schedule.seqs.reserve(size_t(cfg.max_batch_size));
        plan->host_schedule.items.reserve(size_t(plan->backend->geometry().max_items));
    } catch (const std::bad_alloc &) {
        delete plan;
        return fail(MLA_ERROR_OUT_OF_MEMORY, "could not allocate the host schedule");
    }
    *out = plan;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_plan_build_metadata(mla_plan *plan, const mla_batch *batch_in, void *stream) {
    clear_error();
    if (!plan) return fail(MLA_ERROR_NULL_POINTER, "plan is NULL");
    // Any refusal leaves the plan without metadata (also a NULL batch or a bad
    // struct_size): executing the previous step's schedule with this step's
    // tensors could read and write outside them.
    plan->has_metadata = false;
    mla_batch batch;
    MLA_TRY(read_struct(batch_in, &batch, "batch"));
    if (batch.batch_size < 0)
        return fail(MLA_ERROR_INVALID_VALUE, "batch->batch_size = %d is negative", batch.batch_size);
    if (batch.batch_size > plan->config.max_batch_size)
        return fail(MLA_ERROR_LIMIT_EXCEEDED, "batch->batch_size = %d is above the plan's max_batch_size %d",
                    batch.batch_size, plan->config.max_batch_size);
    if (!batch.qo_indptr) return fail(MLA_ERROR_NULL_POINTER, "batch->qo_indptr is NULL");
    if (!batch.kv_indptr) return fail(MLA_ERROR_NULL_POINTER, "batch->kv_indptr is NULL");
    const int32_t memory = enum_int(batch.memory);
    if (memory != MLA_MEMORY_HOST && memory != MLA_MEMORY_DEVICE)
        return fail(MLA_ERROR_INVALID_VALUE, "batch->memory = %d is not an mla_memory", int(memory));
    if (batch.memory == MLA_MEMORY_DEVICE && plan->config.backend == MLA_BACKEND_CPU)
        return fail(MLA_ERROR_INVALID_VALUE, "batch->memory = MLA_MEMORY_DEVICE, but the plan runs on the CPU");

    if (batch.memory == MLA_MEMORY_HOST) {
        try {
            MLA_TRY(build_schedule_host(plan->backend->geometry(), batch, plan->host_schedule));
        } catch (const std::bad_alloc &) {
            return fail(MLA_ERROR_OUT_OF_MEMORY, "could not allocate the host schedule");
        }
        MLA_TRY(plan->backend->upload_schedule(plan->host_schedule, stream));
        plan->metadata_from_host = true;
    } else {
        MLA_TRY(plan->backend->build_metadata_device(batch, stream));
        plan->metadata_from_host = false;
    }
    plan->last_batch_size = batch.batch_size;
    plan->has_metadata = true;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_plan_execute(mla_plan *plan, const mla_tensors *tensors_in, void *stream) {
    clear_error();
    if (!plan) return fail(MLA_ERROR_NULL_POINTER, "plan is NULL");
    mla_tensors t;
    MLA_TRY(read_struct(tensors_in, &t, "tensors"));
    if (!plan->has_metadata)
        return fail(MLA_ERROR_NO_METADATA, "execute called before a successful mla_plan_build_metadata");
    MLA_TRY(validate_tensors(*plan, t));
    if (t.q_scale == 0.0f) t.q_scale = 1.0f;
    if (t.kv_scale == 0.0f) t.kv_scale = 1.0f;
    if (t.kv_scale_stride == 0) t.kv_scale_stride = MLA_MXFP4_SCALES_PER_ROW;
    void *workspace = t.workspace ? t.workspace : plan->backend->owned_workspace();
    return plan->backend->execute(t, workspace, stream);
}

MLA_API mla_status mla_plan_workspace_size(const mla_plan *plan, size_t *bytes) {
    clear_error();
    if (!plan) return fail(MLA_ERROR_NULL_POINTER, "plan is NULL");
    if (!bytes) return fail(MLA_ERROR_NULL_POINTER, "bytes is NULL");
    *bytes = plan->backend->workspace_bytes();
    return MLA_SUCCESS;
}

MLA_API mla_status mla_plan_backend(const mla_plan *plan, mla_backend *backend) {
    clear_error();
    if (!plan) return fail(MLA_ERROR_NULL_POINTER, "plan is NULL");
    if (!backend) return fail(MLA_ERROR_NULL_POINTER, "backend is NULL");
    *backend = plan->config.backend;
    return MLA_SUCCESS;
}

MLA_API mla_status mla_plan_schedule_info(const mla_plan *plan, mla_schedule_info *info) {
    clear_error();
    if (!plan) return fail(MLA_ERROR_NULL_POINTER, "plan is NULL");
    mla_schedule_info tmp;
    MLA_TRY(read_struct(info, &tmp, "info"));
    if (!plan->has_metadata || !plan->metadata_from_host)
        return fail(MLA_ERROR_NO_METADATA, "no metadata was built from host arrays");
    const ScheduleGeometry &g = plan->backend->geometry();
    const ScheduleSummary &s = plan->host_schedule.summary;
    info->num_work_items = s.num_items;
    info->num_split_rows = s.num_partials;
    info->max_splits = s.max_splits;
    info->rows_per_item = g.rows_per_item;
    info->head_blocks = g.head_blocks;
    info->target_blocks = s.target_blocks;
    info->block_tokens = kScheduleBlockTokens;
    info->workers = g.workers;
    return MLA_SUCCESS;
}

MLA_API void mla_plan_destroy(mla_plan *plan) { delete plan; }

}  // extern "C"
