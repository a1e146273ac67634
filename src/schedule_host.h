// Host side of the scheduler: plan configuration -> geometry, and the host
// driver of the shared algorithm in schedule.h.
#pragma once

#include <vector>

#include "plan_config.h"
#include "schedule.h"

namespace mla {

// MLA_FLAG_DETERMINISTIC: 1024-token splits, at most 8 of them per sequence.
constexpr int32_t kDeterministicChunkBlocks = 16;
constexpr int32_t kDeterministicMaxSplits = 8;

// max_rows caps the row tile (16, 32 or 64): a backend whose largest tile
// does not fit the device asks for a smaller one (more head blocks).
ScheduleGeometry make_geometry(const PlanConfig &cfg, int32_t workers, int32_t min_split_blocks,
                               int32_t max_rows = 64);

struct HostSchedule {
    std::vector<SeqSchedule> seqs;
    std::vector<WorkItem> items;
    ScheduleSummary summary{};
};

// Validate the host-resident batch and schedule it. Arrays already checked
// for NULL by the caller.
mla_status build_schedule_host(const ScheduleGeometry &g, const mla_batch &batch, HostSchedule &out);

// Status + message for a ScheduleError (shared with the device path).
mla_status schedule_error_status(int32_t error, int32_t seq, int32_t value, const ScheduleGeometry &g);

}  // namespace mla
