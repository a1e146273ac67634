// Merge the split partials of each (sequence, head block) in split order:
// out = sum_k exp(lse_k - M) O_k / sum_k exp(lse_k - M),  lse = M + ln(sum ...).
#include <math.h>

#include "kernels.h"

namespace mla {
namespace gpu {
namespace {

// One CTA per (sequence, head block); one warp per row at a time: the lanes
// reduce the splits' LSEs, then each lane merges a slice of the 512 columns.
__global__ void __launch_bounds__(kThreads) combine_kernel(const CombineParams p) {
    constexpr int kWarps = kThreads / MLA_WARP_SIZE;
    const int seq = blockIdx.x / p.head_blocks, hb = blockIdx.x % p.head_blocks;
    // The grid covers the plan's max_batch; sequences past this batch exit.
    if (seq >= p.summary->batch_size || p.summary->error != 0) return;
    const SeqSchedule s = p.seqs[seq];
    if (s.splits <= 1 || s.q_len == 0) return;
    const int h0 = hb * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int rows = s.q_len * heads;
    const float *first = p.partials + int64_t(s.partial_first + hb * s.splits) * p.slot_floats;
    const int lse_off = p.rows_per_item * MLA_HEAD_DIM_V;
    const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;

    __shared__ float weights[kWarps][MLA_MAX_SPLITS];
    for (int r = warp; r < rows; r += kWarps) {
        float m = -INFINITY;
        for (int k = lane; k < s.splits; k += MLA_WARP_SIZE)
            m = fmaxf(m, first[int64_t(k) * p.slot_floats + lse_off + r]);
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
        const int tok = s.q_begin + r / heads, h = h0 + r % heads;
        uint16_t *dst = p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V;
        for (int c = lane * 4; c < MLA_HEAD_DIM_V; c += MLA_WARP_SIZE * 4) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int k = 0; k < s.splits; ++k) {
                const float wk = weights[warp][k];
                const float4 o = *reinterpret_cast<const float4 *>(first + int64_t(k) * p.slot_floats + r * MLA_HEAD_DIM_V + c);
                acc.x += wk * o.x;
                acc.y += wk * o.y;
                acc.z += wk * o.z;
                acc.w += wk * o.w;
            }
            uint2 packed;
            packed.x = uint32_t(float_to_bf16(acc.x * inv)) | (uint32_t(float_to_bf16(acc.y * inv)) << 16);
            packed.y = uint32_t(float_to_bf16(acc.z * inv)) | (uint32_t(float_to_bf16(acc.w * inv)) << 16);
            *reinterpret_cast<uint2 *>(dst + c) = packed;
        }
        if (lane == 0 && p.lse) p.lse[int64_t(tok) * p.num_heads + h] = sum > 0.0f ? m + logf(sum) : -INFINITY;
        __syncwarp();
    }
}

}  // namespace

hipError_t launch_combine(const CombineParams &p, int grid, hipStream_t stream) {
    combine_kernel<<<grid, kThreads, 0, stream>>>(p);
    return hipGetLastError();
}

}  // namespace gpu
}  // namespace mla
