// Merge the split partials of each (sequence, head block) in split order:
// out = sum_k exp(lse_k - M) O_k / sum_k exp(lse_k - M),  lse = M + ln(sum ...).
#include <math.h>

#include "kernels.h"

namespace mla {
namespace gpu {
namespace {

// One warp per row: blockIdx.x = (sequence, head block, group of kWarps
// rows), so even a batch of a few split sequences spreads over many SMs. The
// lanes reduce the splits' LSEs, then each lane merges 4-column slices of the
// 512 columns for every split (the slices' loads are independent, so they
// overlap), in split order: bitwise deterministic.
constexpr int kCombineWarps = kThreads / MLA_WARP_SIZE;

__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p) {
    constexpr int kSlices = MLA_HEAD_DIM_V / (MLA_WARP_SIZE * 4);
    const int row_groups = (p.rows_per_item + kCombineWarps - 1) / kCombineWarps;
    const int group = blockIdx.x % row_groups, seq_hb = blockIdx.x / row_groups;
    const int seq = seq_hb / p.head_blocks, hb = seq_hb % p.head_blocks;
    // The grid covers the plan's max_batch; sequences past this batch exit.
    if (seq >= p.summary->batch_size || p.summary->error != 0) return;
    const SeqSchedule s = p.seqs[seq];
    if (s.splits <= 1 || s.q_len == 0) return;
    const int h0 = hb * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
    const int r = group * kCombineWarps + warp;
    if (r >= s.q_len * heads) return;  // whole warps leave; no CTA-wide barrier below
    const float *first = p.partials + int64_t(s.partial_first + hb * s.splits) * p.slot_floats;
    const int lse_off = p.rows_per_item * MLA_HEAD_DIM_V;

    __shared__ float weights[kCombineWarps][MLA_MAX_SPLITS];
    float m = -INFINITY;
    for (int k = lane; k < s.splits; k += MLA_WARP_SIZE) m = fmaxf(m, first[int64_t(k) * p.slot_floats + lse_off + r]);
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) m = fmaxf(m, MLA_SHFL_XOR(m, off));
    float sum = 0.0f;
    for (int k = lane; k < s.splits; k += MLA_WARP_SIZE) {
        const float wk = m == -INFINITY ? 0.0f : expf(first[int64_t(k) * p.slot_floats + lse_off + r] - m);
        weights[warp][k] = wk;
        sum += wk;
    }
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) sum += MLA_SHFL_XOR(sum, off);
    __syncwarp();
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

    float4 acc[kSlices];
#pragma unroll
    for (int i = 0; i < kSlices; ++i) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float *src = first + r * MLA_HEAD_DIM_V + lane * 4;
#pragma unroll 2
    for (int k = 0; k < s.splits; ++k) {
        const float wk = weights[warp][k];
#pragma unroll
        for (int i = 0; i < kSlices; ++i) {
            const float4 o = *reinterpret_cast<const float4 *>(src + int64_t(k) * p.slot_floats + i * MLA_WARP_SIZE * 4);
            acc[i].x += wk * o.x;
            acc[i].y += wk * o.y;
            acc[i].z += wk * o.z;
            acc[i].w += wk * o.w;
        }
    }
    const int tok = s.q_begin + r / heads, h = h0 + r % heads;
    uint16_t *dst = p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V + lane * 4;
#pragma unroll
    for (int i = 0; i < kSlices; ++i) {
        uint2 packed;
        packed.x = uint32_t(float_to_bf16(acc[i].x * inv)) | (uint32_t(float_to_bf16(acc[i].y * inv)) << 16);
        packed.y = uint32_t(float_to_bf16(acc[i].z * inv)) | (uint32_t(float_to_bf16(acc[i].w * inv)) << 16);
        *reinterpret_cast<uint2 *>(dst + i * MLA_WARP_SIZE * 4) = packed;
    }
    if (lane == 0 && p.lse) p.lse[int64_t(tok) * p.num_heads + h] = sum > 0.0f ? m + logf(sum) : -INFINITY;
}

}  // namespace

int combine_grid(int max_batch, int head_blocks, int rows_per_item) {
    return max_batch * head_blocks * ((rows_per_item + kCombineWarps - 1) / kCombineWarps);
}

hipError_t launch_combine(const CombineParams &p, int grid, hipStream_t stream) {
    MLA_LAUNCH(combine_kernel, grid, kThreads, 0, stream)(p);
    return hipGetLastError();
}

}  // namespace gpu
}  // namespace mla
