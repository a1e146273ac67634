// Merge the split partials of each (sequence, head block) in split order:
// out = sum_k exp(lse_k - M) O_k / sum_k exp(lse_k - M),  lse = M + ln(sum ...).
#include <math.h>

#include "../formats_packed.h"
#include "kernels.h"

namespace mla {
namespace gpu {
namespace {

// One warp per (row, block of kWarpCols columns): blockIdx.x = (sequence,
// head block, group of kRowsPerCta rows), so a batch of a few split
// sequences still spreads over many SMs. Each warp reduces the splits' LSEs
// itself (the few redundant loads are cheaper than a CTA barrier), then
// merges its column block for kBatch splits at a time: their loads are
// issued together (the first batch's with the LSEs'), so the L2 latency is
// paid once per batch. The deep kernel (steps where some sequence has more
// than kBatch splits) also keeps the next batch's loads in flight while one
// is summed, up to 2 kBatch splits a latency; its registers allow one CTA
// per SM, which cost batch 32 and 64 1-2 us on an H100 (docs/performance.md,
// v13), so the backend picks it per step. The sums run in split order
// (bitwise deterministic for a given split count) in both. The kernel is a
// chain of dependent loads (schedule, then partials), so each step issues
// everything it can at once.
constexpr int kCombineWarps = kThreads / MLA_WARP_SIZE;
constexpr int kWarpCols = MLA_WARP_SIZE * 4;                   // a float4 per lane
constexpr int kColBlocks = MLA_HEAD_DIM_V / kWarpCols;         // warps per row
constexpr int kRowsPerCta = kCombineWarps / kColBlocks;
constexpr int kBatch = kCombineBatchSplits;
constexpr int kReverseMinSeqs = 32;
static_assert(MLA_HEAD_DIM_V % kWarpCols == 0 && kCombineWarps % kColBlocks == 0, "combine warp tiling");

template <bool kDeep>
__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p) {
    // Sequence order. A grid that covers max_batch (captured steps, device
    // metadata) has idle CTAs past the step's sequences. In index order the
    // step's own CTAs start first and wait for the attention grid in the few
    // slots it leaves free, and the idle ones start and leave only after it;
    // numbered from the last sequence down, the idle ones leave during the
    // attention grid. That is faster from 32 sequences (B32 and B64 graph
    // replays 4-10%) but was slower at 4 and at 16 (1k tokens: the step's own
    // CTAs queue behind the idle ones; docs/performance.md, v24, v25). The
    // step's batch is known only on the device, so both orders' schedule
    // entries are loaded with the summary's batch and error (seqs has an
    // entry for each sequence of the grid), all held in registers before
    // anything branches on them: the compiler otherwise sinks loads behind
    // the batch test (the error's was one more dependent L2 round trip for
    // every CTA with work, 1-5% of small graph replays). The kernel stays at
    // 104 registers: at 107 the B4 to B16 graph replays were 5-9% slower
    // (fewer of its CTAs fit beside the attention grid's). The schedule is
    // read before the wait: the attention kernel before this one waited for
    // it (runtime.h), so only the partials' loads follow it.
    const int row_groups = (p.rows_per_item + kRowsPerCta - 1) / kRowsPerCta;
    const int ctas_per_seq = p.head_blocks * row_groups;
    const int seq_fwd = int(blockIdx.x) / ctas_per_seq, within = int(blockIdx.x) - seq_fwd * ctas_per_seq;
    const int seq_rev = int(gridDim.x) / ctas_per_seq - 1 - seq_fwd;
    SeqSchedule s_fwd = p.seqs[seq_fwd], s_rev = p.seqs[seq_rev];
    int batch = p.summary->batch_size, error = p.summary->error;
    for (int *v : {&batch, &error, &s_fwd.q_len, &s_fwd.splits, &s_rev.q_len, &s_rev.splits}) materialize(*v);
    const bool reversed = batch >= kReverseMinSeqs;
    const int seq = reversed ? seq_rev : seq_fwd;
    const SeqSchedule s = reversed ? s_rev : s_fwd;
    const int hb = within / row_groups, group = within - hb * row_groups;
    // Sequences past this step's batch exit.
    const bool idle = seq >= batch || error != 0 || s.splits <= 1 || s.q_len == 0;
    // An idle CTA other than CTA 0 leaves before the wait (runtime.h), so
    // it need not find an SM after the attention grid: at max_batch 256 the
    // grid is ~8 waves of CTAs, all idle in a captured step without splits
    // (docs/performance.md, v22, plan item 10).
    if (idle && blockIdx.x != 0) return;
    wait_for_previous_grid();  // the attention kernel's partials
    allow_next_grid();
    if (idle) return;
    const int h0 = hb * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
    const int r = group * kRowsPerCta + warp / kColBlocks, col0 = (warp % kColBlocks) * kWarpCols + lane * 4;
    if (r >= s.q_len * heads) return;  // whole warps leave; no CTA-wide barrier below
    const float *first = p.partials + int64_t(s.partial_first + hb * s.splits) * p.slot_floats;
    const float *lses = first + p.rows_per_item * MLA_HEAD_DIM_V + r;

    const float *src = first + r * MLA_HEAD_DIM_V + col0;
    auto load_batch = [&](float4(&o)[kBatch], int k0) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
            o[i] = k0 + i < s.splits ? *reinterpret_cast<const float4 *>(src + int64_t(k0 + i) * p.slot_floats)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    float4 even[kBatch], odd[kBatch];  // batches 2i and 2i + 1 (odd: deep only)
    load_batch(even, 0);  // in flight with the LSE loads below
    if (kDeep && s.splits > kBatch) load_batch(odd, kBatch);

    __shared__ float weights[kCombineWarps][MLA_MAX_SPLITS];
    float m = -INFINITY;
    for (int k = lane; k < s.splits; k += MLA_WARP_SIZE) m = max_nan_wins(m, lses[int64_t(k) * p.slot_floats]);
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) m = max_nan_wins(m, MLA_SHFL_XOR(m, off));
    float sum = 0.0f;
    for (int k = lane; k < s.splits; k += MLA_WARP_SIZE) {
        const float wk = m == -INFINITY ? 0.0f : expf(lses[int64_t(k) * p.slot_floats] - m);
        weights[warp][k] = wk;
        sum += wk;
    }
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) sum += MLA_SHFL_XOR(sum, off);
    __syncwarp();
    const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;  // 0: every split empty; NaN stays NaN

    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    auto accumulate = [&](const float4(&o)[kBatch], int k0) {
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
            if (k0 + i >= s.splits) break;
            const float wk = weights[warp][k0 + i];
            acc.x += wk * o[i].x;
            acc.y += wk * o[i].y;
            acc.z += wk * o[i].z;
            acc.w += wk * o[i].w;
        }
    };
    if constexpr (kDeep) {
        for (int k0 = 0; k0 < s.splits; k0 += 2 * kBatch) {
            // (even's loads were issued in the previous pass)
            if (k0 > 0 && k0 + kBatch < s.splits) load_batch(odd, k0 + kBatch);
            accumulate(even, k0);
            if (k0 + kBatch >= s.splits) break;
            if (k0 + 2 * kBatch < s.splits) load_batch(even, k0 + 2 * kBatch);
            accumulate(odd, k0 + kBatch);
        }
    } else {
        for (int k0 = 0; k0 < s.splits; k0 += kBatch) {
            if (k0 > 0) load_batch(even, k0);
            accumulate(even, k0);
        }
    }
    const int tok = s.q_begin + r / heads, h = h0 + r % heads;
    uint2 packed;
    packed.x = pack_bf16x2_rn(acc.x * inv, acc.y * inv);
    packed.y = pack_bf16x2_rn(acc.z * inv, acc.w * inv);
    *reinterpret_cast<uint2 *>(p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V + col0) = packed;
    if (lane == 0 && col0 == 0 && p.lse) p.lse[int64_t(tok) * p.num_heads + h] = sum != 0.0f ? m + logf(sum) : -INFINITY;
}

}  // namespace

int combine_grid(int batch, int head_blocks, int rows_per_item) {
    return batch * head_blocks * ((rows_per_item + kRowsPerCta - 1) / kRowsPerCta);
}

hipError_t launch_combine(const CombineParams &p, int grid, bool deep, hipStream_t stream, bool overlap) {
    return deep ? launch_kernel(combine_kernel<true>, Launch{grid, kThreads, 0, stream, overlap}, p)
                : launch_kernel(combine_kernel<false>, Launch{grid, kThreads, 0, stream, overlap}, p);
}

}  // namespace gpu
}  // namespace mla
