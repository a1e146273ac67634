// The attention kernel's own merge of a split (sequence, head block) with
// few splits (merged_by_attention, kernels.h): each item has written its
// partial and LSE; the last of them to finish merges them all with the
// combine kernel's arithmetic (combine.cu), in split order, so the step
// needs no second kernel and its boundary (docs/performance.md, v13-v14).
#pragma once

#include <math.h>

#include "../formats_packed.h"
#include "kernels.h"

namespace mla {
namespace gpu {

// Called by each of THREADS threads (tid 0 .. THREADS - 1) after the item's
// partial is written (a split item's; the item decides whether it merges); sync_or(predicate) is their barrier (and its OR).
// ROWS: the kernel's row tile (the LSEs sit after ROWS partial rows).
template <int ROWS, int THREADS, class SyncOr>
__device__ __forceinline__ void merge_splits_if_last(const AttentionParams &p, const WorkItem &w, int rows_valid,
                                                     int tid, SyncOr sync_or) {
    // The item's split fields, loaded again here rather than kept in
    // registers through the tile loop (the 128-register kernels spilled).
    const volatile int32_t *fields = &p.items[blockIdx.x].splits;
    const int splits = fields[0];
    if (!merged_by_attention(splits, rows_valid, p.merge_rows)) return;
    int32_t *counter = p.merge_counters + w.seq * p.head_blocks + w.head_block;
    // Release: every thread's partial is visible device-wide before the count.
    __threadfence();
    bool last = false;
    if (tid == 0) {
        last = atomicAdd(counter, 1) == splits - 1;
        if (last) *counter = 0;  // (every item of the step has counted: ready for the next execute)
    }
    if (!sync_or(last)) return;
    __threadfence();  // acquire: the other items' partials

    // A thread owns a column quad and kRows rows at a time: kRows x splits
    // partial and LSE loads go out together, one L2 latency per round (16
    // rows of a CTA in flight: 32 KB of partials at 4 splits).
    constexpr int kQuads = MLA_HEAD_DIM_V / 4, kRowGroups = THREADS / kQuads;
    constexpr int kRows = kRowGroups >= 4 ? 1 : 4 / kRowGroups;
    static_assert(kRowGroups >= 1, "a thread per column quad");
    const float *first = p.partials + int64_t(w.partial_slot - fields[1]) * p.slot_floats;
    const int h0 = w.head_block * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int c = (tid % kQuads) * 4;
    if (tid >= kRowGroups * kQuads) return;  // (after the last barrier)
    for (int r0 = (tid / kQuads) * kRows; r0 < rows_valid; r0 += kRowGroups * kRows) {
        float lse[kRows][kMaxMergedSplits];
        float4 o[kRows][kMaxMergedSplits];
#pragma unroll
        for (int i = 0; i < kRows; ++i)
#pragma unroll
            for (int k = 0; k < kMaxMergedSplits; ++k) {
                const bool load = r0 + i < rows_valid && k < splits;
                const float *slot = first + int64_t(k) * p.slot_floats;
                lse[i][k] = load ? slot[ROWS * MLA_HEAD_DIM_V + r0 + i] : -INFINITY;
                o[i][k] = load ? *reinterpret_cast<const float4 *>(slot + (r0 + i) * MLA_HEAD_DIM_V + c)
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
            const int r = r0 + i;
            if (r >= rows_valid) break;
            float m = -INFINITY;
#pragma unroll
            for (int k = 0; k < kMaxMergedSplits; ++k)
                if (k < splits) m = max_nan_wins(m, lse[i][k]);
            float sum = 0.0f;
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int k = 0; k < kMaxMergedSplits; ++k) {
                if (k >= splits) break;
                const float wk = m == -INFINITY ? 0.0f : expf(lse[i][k] - m);
                sum += wk;
                acc.x += wk * o[i][k].x;
                acc.y += wk * o[i][k].y;
                acc.z += wk * o[i][k].z;
                acc.w += wk * o[i][k].w;
            }
            const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;  // 0: every split empty; NaN stays NaN
            const int tok = w.q_begin + r / heads, h = h0 + r % heads;
            uint2 packed;
            packed.x = pack_bf16x2_rn(acc.x * inv, acc.y * inv);
            packed.y = pack_bf16x2_rn(acc.z * inv, acc.w * inv);
            *reinterpret_cast<uint2 *>(p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V + c) = packed;
            if (c == 0 && p.lse) p.lse[int64_t(tok) * p.num_heads + h] = sum != 0.0f ? m + logf(sum) : -INFINITY;
        }
    }
}

}  // namespace gpu
}  // namespace mla
