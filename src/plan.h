// The plan object behind the opaque mla_plan handle, and the interface every
// backend implements. api.cpp validates arguments and then calls a Backend;
// a Backend may assume its inputs are valid.
#pragma once

#include <memory>

#include "mla.h"
#include "plan_config.h"
#include "schedule_host.h"

namespace mla {

class Backend {
public:
    virtual ~Backend() = default;
    // Scheduling geometry chosen by the backend at creation.
    virtual const ScheduleGeometry &geometry() const = 0;
    // Host-resident (already validated) batch: `sched` holds its schedule.
    virtual mla_status upload_schedule(const HostSchedule &sched, void *stream) = 0;
    // Device-resident batch (GPU only): schedule on the device.
    virtual mla_status build_metadata_device(const mla_batch &batch, void *stream) = 0;
    virtual mla_status execute(const mla_tensors &t, void *workspace, void *stream) = 0;
    // Plan-owned workspace, or nullptr with MLA_FLAG_CALLER_WORKSPACE.
    virtual void *owned_workspace() = 0;
    size_t workspace_bytes() const {
        return size_t(geometry().max_items) * partial_slot_bytes(geometry().rows_per_item);
    }
};

std::unique_ptr<Backend> make_cpu_backend(const PlanConfig &cfg, mla_status *status);
// Defined by the GPU backend when built; otherwise reports BACKEND_UNAVAILABLE.
std::unique_ptr<Backend> make_gpu_backend(const PlanConfig &cfg, mla_status *status);
int gpu_device_count();

}  // namespace mla

struct mla_plan {
    mla::PlanConfig config;
    std::unique_ptr<mla::Backend> backend;
    mla::HostSchedule host_schedule;
    bool has_metadata = false;
    bool metadata_from_host = false;
    int32_t last_batch_size = 0;
};
