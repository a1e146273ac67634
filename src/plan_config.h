// A plan descriptor with every default resolved, as the backends see it.
#pragma once

#include <stdint.h>

#include "mla.h"

namespace mla {

struct PlanConfig {
    int32_t num_heads;
    mla_dtype q_dtype;
    mla_dtype kv_dtype;
    int32_t page_size;
    int32_t max_batch_size;
    int32_t max_q_len;
    float sm_scale;
    float logit_cap;
    int32_t num_splits;
    uint32_t flags;
    mla_backend backend;  // CPU or GPU, never AUTO
    int32_t device;
    int32_t num_threads;
};

// Bytes of one workspace slot: rows_per_item rows of 512 floats + their LSE.
inline size_t partial_slot_bytes(int32_t rows_per_item) {
    return size_t(rows_per_item) * (MLA_HEAD_DIM_V + 1) * sizeof(float);
}

}  // namespace mla
