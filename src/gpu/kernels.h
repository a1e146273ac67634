// Interfaces between the GPU backend's host code (backend.cu) and its
// kernels. Plain structs passed by value to the kernels.
#pragma once

#include <stdint.h>

#include "../formats.h"
#include "../schedule.h"
#include "runtime.h"

namespace mla {
namespace gpu {

constexpr int kThreads = 256;  // every attention CTA (8 warps on NVIDIA, 4 waves on AMD)
constexpr int kZeroBytes = 64;  // AttentionParams::zeros (at least a row's MXFP4 scale bytes)
static_assert(kZeroBytes >= MLA_MXFP4_SCALES_PER_ROW, "zero block covers a row's scales");

struct AttentionParams {
    const uint8_t *q;
    const uint8_t *kv;
    const uint8_t *kv_block_scales;
    const int32_t *kv_indices;
    uint16_t *out;
    float *lse;
    float *partials;
    const ScheduleSummary *summary;
    const WorkItem *items;
    const uint8_t *zeros;     // kZeroBytes zero bytes of the plan (MXFP4 scales of zero-filled rows)
    int64_t num_pages;        // 0: unknown (page indices not clamped)
    int32_t num_heads;
    int32_t heads_per_block;
    int32_t page_shift;       // log2(page_size)
    int32_t q_dtype;          // mla_dtype
    int32_t scale_stride;     // MXFP4 scale bytes per token
    int32_t slot_floats;      // floats per workspace slot
    float qk_scale;           // sm_scale * q_scale * kv_scale (fp8) — natural-log units
    float v_scale;            // kv_scale for fp8 V, else 1
    float logit_cap;          // 0: off
};

struct CombineParams {
    const ScheduleSummary *summary;
    const SeqSchedule *seqs;
    const float *partials;
    uint16_t *out;
    float *lse;
    int32_t num_heads;
    int32_t heads_per_block;
    int32_t head_blocks;
    int32_t rows_per_item;
    int32_t slot_floats;
};

struct MetadataParams {
    const int32_t *qo_indptr;
    const int32_t *kv_indptr;
    const int32_t *kv_last_page_len;  // NULL: full pages
    int32_t batch_size;
    int32_t seqs_per_thread;  // set by launch_metadata: sequences of each thread of the one CTA
    ScheduleGeometry geometry;
    ScheduleSummary *summary;
    SeqSchedule *seqs;
    WorkItem *items;
};

// Launch the attention kernel specialised for (rows_per_item, kv dtype).
// Defined once per specialisation in the generated attention_*.cu files.
template <int ROWS, int KV>
hipError_t launch_attention(const AttentionParams &p, int grid, hipStream_t stream, bool overlap);
template <int ROWS, int KV>
hipError_t prepare_attention(int max_dynamic_smem);  // raise the smem limit once
template <int ROWS, int KV>
int attention_smem_bytes();
template <int ROWS, int KV>
int attention_blocks_per_sm();  // resident CTAs per SM (after prepare_attention)
template <int ROWS, int KV>
bool attention_is_warpgroup();  // runs attention_wgmma.cuh's kernel (else attention.cuh's)

// Combine grid for `batch` sequences x head blocks x rows (a step's, or
// the plan's max_batch where the grid must serve any step).
int combine_grid(int batch, int head_blocks, int rows_per_item);
// Splits whose partials a combine warp loads at once; `deep` keeps two such
// batches in flight (for steps with more splits; see combine.cu).
constexpr int kCombineBatchSplits = 16;
hipError_t launch_combine(const CombineParams &p, int grid, bool deep, hipStream_t stream, bool overlap);
hipError_t launch_metadata(const MetadataParams &p, hipStream_t stream);
// MLA_FLAG_VALIDATE_DEVICE_INPUTS: checks every page index the items touch.
hipError_t launch_validate_pages(const ScheduleSummary *summary, const WorkItem *items, const int32_t *kv_indices,
                                 int32_t page_shift, int64_t num_pages, int32_t max_items, int32_t *bad,
                                 hipStream_t stream);

}  // namespace gpu
}  // namespace mla
