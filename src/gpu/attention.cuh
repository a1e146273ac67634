// The split-KV attention kernel, written once for every architecture and KV
// format: one CTA per work item (sequence, head block, KV range). Per KV tile:
// S = Q K^T on the tile primitive, masked online softmax in shared memory,
// O += P V on the tile primitive. Unsplit items write out/lse directly, split
// items write a normalised partial and its LSE for the combine kernel.
#pragma once

#include <math.h>

#include "attention_wgmma.cuh"
#include "kernels.h"
#include "kv_tile.cuh"
#include "tile.cuh"

namespace mla {
namespace gpu {

template <int ROWS, int KV>
struct AttentionShape {
    // KV tiles that keep a 16-row CTA under half the shared memory of an SM,
    // so two CTAs share each SM and one's loads overlap the other's math:
    // 32 tokens, or 64 fp8 ones (staged raw and decoded into MMA fragments,
    // so there is no bf16 copy in shared memory; 64 beat 32 on every fp8
    // headline shape on the H200, docs/performance.md v6). The portable
    // kernels take 16-token tiles: a 16-row CTA then fits the 64 KB of LDS of
    // AMD GPUs (the backend picks 16-row items there).
#if defined(MLA_PORTABLE_KERNELS)
    static constexpr int N = 16;
#else
    static constexpr int N = decodes_into_fragments(KV) ? 64 : 32;
#endif
    static constexpr int kWarps = kThreads / MLA_WARP_SIZE;
    static constexpr int WM = ROWS / 16;               // warps along rows
    static constexpr int WN = kWarps / WM;             // warps along columns
    // S = Q K^T: each warp owns 16 rows x kSCols columns x (576 / kKSplit) of
    // the reduction; with more warps than column groups the reduction is
    // split and the softmax adds the kKSplit partial sums. On the MMA path a
    // warp takes at least 16 columns, so each Q fragment it reads from shared
    // memory feeds two MMAs (5% faster than 8 columns on the H200).
#if defined(MLA_PORTABLE_KERNELS)
    static constexpr int kMinSCols = 8;
#else
    static constexpr int kMinSCols = 16;
#endif
    static constexpr int kSCols = N / WN >= kMinSCols ? N / WN : kMinSCols;
    static constexpr int kColGroups = N / kSCols;
    static constexpr int kKSplit = WN / kColGroups;
    static constexpr int kKPerWarp = MLA_HEAD_DIM_QK / kKSplit;
    static constexpr int kOCols = MLA_HEAD_DIM_V / WN; // O columns per warp
    static constexpr int kSLd = N + 4;                 // float stride of S
    static constexpr int kPLd = N + 8;                 // bf16 stride of P (odd multiple of 16 B)
    // softmax threads per row (>= 2 columns each); threads past ROWS x kRowThreads sit it out
    static constexpr int kRowThreads = kThreads / ROWS < N / 2 ? kThreads / ROWS : N / 2;
    static constexpr int kRowCols = N / kRowThreads;
    // Two tiles in flight: tile j + 2 is issued into tile j's stage once that
    // is consumed (after the P V of the iteration; with KV decoded into
    // shared memory, after that decode). Three stages with the issue at the
    // top of the loop measured slower on the H200 (bf16 and fp8 then fit one CTA per SM; MXFP4, which
    // still fits two, gained nothing): docs/performance.md, v5.
    static constexpr int kStages = 2;
    using Kv = KvTile<KV, N, kStages>;

    static constexpr int kQBytes = ROWS * Kv::kQLd * 2;
    static constexpr int kSBytes = kKSplit * ROWS * kSLd * 4;
    static constexpr int kPBytes = ROWS * kPLd * 2;
    static constexpr int kStatBytes = 3 * ROWS * 4;
    static constexpr int kSmemBytes = kQBytes + Kv::kLandingBytes + Kv::kScaleBytes + Kv::kConvertedBytes + kSBytes +
                                      kPBytes + kStatBytes;
    // Two CTAs per SM when their shared memory fits (one's copies and
    // barriers then overlap the other's math).
    static constexpr int kMinBlocksPerSm = ROWS <= 16 && 2 * (kSmemBytes + 1024) <= 228 * 1024 ? 2 : 1;
    static_assert(kSCols % 8 == 0 && kOCols % 16 == 0 && kKPerWarp % 16 == 0, "warp tiling");
    static_assert(kRowCols % 2 == 0, "softmax writes column pairs");
    static_assert((ROWS * kRowThreads) % MLA_WARP_SIZE == 0, "softmax leaves whole warps idle");
    static_assert(64 % N == 0, "tiles must not straddle schedule blocks");
#if defined(MLA_PORTABLE_KERNELS)
    static_assert(ROWS > 16 || kSmemBytes <= 64 * 1024, "16-row portable tiles must fit 64 KB of LDS");
#endif
};

template <int ROWS, int KV>
__global__ void __launch_bounds__(kThreads, (AttentionShape<ROWS, KV>::kMinBlocksPerSm))
    attention_kernel(const AttentionParams p) {
    using S = AttentionShape<ROWS, KV>;
    constexpr int N = S::N;
    constexpr int kSNt = S::kSCols / 8, kONt = S::kOCols / 8;
    static_assert(kThreads % ROWS == 0, "softmax thread mapping");
    constexpr int E = Tile::kElems;
    const float kNegInf = -INFINITY;

    wait_for_previous_grid();  // metadata, Q, KV, and the previous step's readers of out / partials
    allow_next_grid();
    // items has the plan's max_items entries (zeroed at creation), at least
    // the grid, so the item's load goes out with the summary's.
    const WorkItem w = p.items[blockIdx.x];
    if (int(blockIdx.x) >= p.summary->num_items) return;

    MLA_DYNAMIC_SMEM(uint8_t, smem);
    uint8_t *cursor = smem;
    uint16_t *qs = reinterpret_cast<uint16_t *>(cursor); cursor += S::kQBytes;
    typename S::Kv kv;
    kv.landing = cursor; cursor += S::Kv::kLandingBytes;
    kv.scales = cursor; cursor += S::Kv::kScaleBytes;
    kv.converted = reinterpret_cast<uint16_t *>(cursor); cursor += S::Kv::kConvertedBytes;
    float *ss = reinterpret_cast<float *>(cursor); cursor += S::kSBytes;
    uint16_t *ps = reinterpret_cast<uint16_t *>(cursor); cursor += S::kPBytes;
    float *row_m = reinterpret_cast<float *>(cursor);  // running max, log2 units
    float *row_l = row_m + ROWS;                       // running sum
    float *row_alpha = row_l + ROWS;                   // rescale of this tile
    cursor += S::kStatBytes;

    const int tid = threadIdx.x, lane = tid % MLA_WARP_SIZE, warp = tid / MLA_WARP_SIZE;
    const int wm = warp % S::WM, wn = warp / S::WM;
    const int qk_group = wn % S::kColGroups, qk_split = wn / S::kColGroups;
    const int h0 = w.head_block * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int rows_valid = w.q_len * heads;
    const int num_tiles = (w.kv_end - w.kv_begin + N - 1) / N;

    if (tid < ROWS) {
        row_m[tid] = kNegInf;
        row_l[tid] = 0.0f;
    }
    kv.look_up(p, w, w.kv_begin);
    load_q<ROWS, typename S::Kv>(p, w, h0, heads, qs);
#pragma unroll
    for (int t = 0; t < S::kStages; ++t) {
        if (t < num_tiles) {
            typename S::Kv::ScaleLoads scales;
            kv.issue(p, w, w.kv_begin + t * N, t, &scales);
            kv.finish_issue(t, scales);
        }
        async_commit();  // one group per tile, empty or not: the waits count groups
    }

    float o_acc[kONt][E];
#pragma unroll
    for (int i = 0; i < kONt; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) o_acc[i][e] = 0.0f;

    // Softmax thread mapping and the row's causal limit: query token t of the
    // sequence's q_len sees keys < kv_len - q_len + t + 1.
    const bool softmax_thread = tid < ROWS * S::kRowThreads;
    const int sm_row = tid / S::kRowThreads, sm_col = (tid % S::kRowThreads) * S::kRowCols;
    const float inv_heads = 1.0f / float(heads);
    const int visible_end =
        sm_row < rows_valid ? min(w.kv_end, w.kv_len - w.q_len + row_token(sm_row, inv_heads) + 1) : w.kv_begin;

    for (int j = 0; j < num_tiles; ++j) {
        const int stage = j % S::kStages, t0 = w.kv_begin + j * N, next = j + S::kStages;
        async_wait<S::kStages - 1>();  // tile j has landed
        __syncthreads();
        typename S::Kv::ScaleLoads next_scales;  // (MXFP4) stored once this tile's math is done
        if (S::Kv::kDecodesToShared) {
            kv.decode_to_shared(stage);
            __syncthreads();  // the whole tile is decoded: its raw stage is free
            if (next < num_tiles) kv.issue(p, w, w.kv_begin + next * N, stage, &next_scales);
            async_commit();
        }

        // Raw dot products for this warp's 16 rows x kSCols columns x K slice.
        float s_acc[kSNt][E];
#pragma unroll
        for (int i = 0; i < kSNt; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) s_acc[i][e] = 0.0f;
        kv.template qk<kSNt, S::kKPerWarp>(s_acc, qs + wm * 16 * S::Kv::kQLd + qk_split * S::kKPerWarp, stage,
                                           qk_group * S::kSCols, qk_split * S::kKPerWarp);
        float *ss_part = ss + qk_split * ROWS * S::kSLd;
#pragma unroll
        for (int i = 0; i < kSNt; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e)
                ss_part[(wm * 16 + Tile::row(lane, e)) * S::kSLd + qk_group * S::kSCols + i * 8 + Tile::col(lane, e)] =
                    s_acc[i][e];
        __syncthreads();

        // Online softmax: kRowThreads threads per row, kRowCols columns each.
        if (softmax_thread) {
            const int r = sm_row, c0 = sm_col;
            float sv[S::kRowCols];
#pragma unroll
            for (int c = 0; c < S::kRowCols; ++c) {
                float v = 0.0f;
#pragma unroll
                for (int k = 0; k < S::kKSplit; ++k) v += ss[(k * ROWS + r) * S::kSLd + c0 + c];
                sv[c] = score_nonfinite_to_nan(v * p.qk_scale);
            }
            if (p.logit_cap > 0.0f)  // one branch a tile, not one a score (as in attention_wgmma.cuh)
#pragma unroll
                for (int c = 0; c < S::kRowCols; ++c) sv[c] = capped_score(sv[c], p.logit_cap);
            float mt = kNegInf;
#pragma unroll
            for (int c = 0; c < S::kRowCols; ++c) {
                sv[c] = t0 + c0 + c < visible_end ? sv[c] * kLog2e : kNegInf;
                mt = fmaxf(mt, sv[c]);
            }
#pragma unroll
            for (int off = S::kRowThreads / 2; off > 0; off >>= 1) mt = fmaxf(mt, MLA_SHFL_XOR(mt, off));
            const float m_old = row_m[r];
            const float m_new = fmaxf(m_old, mt);
            const bool empty = m_new == kNegInf;
            const float alpha = empty ? 1.0f : fast_exp2(m_old - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < S::kRowCols; c += 2) {
                const float p0 = empty ? 0.0f : fast_exp2(sv[c] - m_new);
                const float p1 = empty ? 0.0f : fast_exp2(sv[c + 1] - m_new);
                sum += p0 + p1;
                *reinterpret_cast<uint32_t *>(ps + r * S::kPLd + c0 + c) = pack_bf16x2_rn(p0, p1);
            }
#pragma unroll
            for (int off = S::kRowThreads / 2; off > 0; off >>= 1) sum += MLA_SHFL_XOR(sum, off);
            __syncwarp();  // every lane of the row has read row_m before lane 0 rewrites it
            if (tid % S::kRowThreads == 0) {
                row_m[r] = m_new;
                row_l[r] = row_l[r] * alpha + sum;
                row_alpha[r] = alpha;
            }
        }
        __syncthreads();

        // O = alpha * O + P V for this warp's 16 rows x kOCols columns.
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const float a = row_alpha[wm * 16 + Tile::row(lane, e)];
#pragma unroll
            for (int i = 0; i < kONt; ++i) o_acc[i][e] *= a;
        }
        kv.template pv<kONt, N>(o_acc, ps + wm * 16 * S::kPLd, S::kPLd, stage, wn * S::kOCols);
        if (S::Kv::kDecodesToShared) {
            if (next < num_tiles) kv.finish_issue(stage, next_scales);
            // No barrier: the next iteration's first one orders this tile's
            // reads of S, P and the decoded tile before their next writes.
        } else {
            __syncthreads();  // every warp's P V read of the stage is done
            if (next < num_tiles) kv.issue(p, w, w.kv_begin + next * N, stage);
            async_commit();
        }
    }
    async_wait<0>();
    __syncthreads();

    // Epilogue: normalise; write bf16 out + lse, or the float partial + lse.
    float *slot = w.partial_slot >= 0 ? p.partials + int64_t(w.partial_slot) * p.slot_floats : nullptr;
    // Pairs of adjacent columns: elements e, e + 1 of a tile, or element e
    // of tiles i, i + 1 (fragment-decoded V, see KvTile::pv_col).
    constexpr bool kAcross = S::Kv::kPvPairsAcrossTiles;
#pragma unroll
    for (int e = 0; e < E; e += kAcross ? 1 : 2) {
        const int r = wm * 16 + Tile::row(lane, e);
        if (r >= rows_valid) continue;
        const float l = row_l[r];
        // l == 0 only for a row without visible keys; a NaN l (a non-finite
        // key) makes out and lse NaN, never the 0 / -inf of an empty row.
        const float inv = l != 0.0f ? p.v_scale / l : 0.0f;
        const int qt = row_token(r, inv_heads), tok = w.q_begin + qt, h = h0 + r - qt * heads;
#pragma unroll
        for (int i = 0; i < kONt; i += kAcross ? 2 : 1) {
            const int c = wn * S::kOCols + S::Kv::pv_col(i, lane, e);
            const float v0 = o_acc[i][e] * inv, v1 = o_acc[kAcross ? i + 1 : i][kAcross ? e : e + 1] * inv;
            if (slot) {
                *reinterpret_cast<float2 *>(slot + r * MLA_HEAD_DIM_V + c) = make_float2(v0, v1);
            } else {
                uint16_t *o = p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V + c;
                *reinterpret_cast<uint32_t *>(o) = pack_bf16x2_rn(v0, v1);
            }
        }
    }
    if (tid < rows_valid) {
        const float l = row_l[tid];
        const float lse = l != 0.0f ? (row_m[tid] + log2f(l)) * kLn2 : kNegInf;
        if (slot) {
            slot[ROWS * MLA_HEAD_DIM_V + tid] = lse;
        } else if (p.lse) {
            const int qt = row_token(tid, inv_heads), tok = w.q_begin + qt, h = h0 + tid - qt * heads;
            p.lse[int64_t(tok) * p.num_heads + h] = lse;
        }
    }
}

// The kernel a (rows, kv) specialisation runs: the warpgroup-MMA one
// (attention_wgmma.cuh) where it exists, else attention_kernel.
template <int ROWS, int KV>
struct AttentionKernel {
    static constexpr bool kWgmma = uses_wgmma(ROWS, KV);
    static constexpr int kThreads = kWgmma ? WgmmaShape<ROWS, KV>::kThreads : gpu::kThreads;
    static constexpr int kSmemBytes = kWgmma ? WgmmaShape<ROWS, KV>::kSmemBytes : AttentionShape<ROWS, KV>::kSmemBytes;
    static constexpr auto function() {
        if constexpr (kWgmma) {
            return &attention_wgmma_kernel<ROWS, KV>;
        } else {
            return &attention_kernel<ROWS, KV>;
        }
    }
};

template <int ROWS, int KV>
int attention_smem_bytes() {
    return AttentionKernel<ROWS, KV>::kSmemBytes;
}

template <int ROWS, int KV>
hipError_t prepare_attention(int max_dynamic_smem) {
    using K = AttentionKernel<ROWS, KV>;
    if (K::kSmemBytes > max_dynamic_smem) return hipErrorInvalidValue;
    return hipFuncSetAttribute(reinterpret_cast<const void *>(K::function()), hipFuncAttributeMaxDynamicSharedMemorySize,
                               K::kSmemBytes);
}

template <int ROWS, int KV>
int attention_blocks_per_sm() {
    using K = AttentionKernel<ROWS, KV>;
    int blocks = 0;
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, K::function(), K::kThreads, K::kSmemBytes) != hipSuccess)
        return 1;
    return blocks > 0 ? blocks : 1;
}

template <int ROWS, int KV>
bool attention_is_warpgroup() {
    return AttentionKernel<ROWS, KV>::kWgmma;
}

template <int ROWS, int KV>
hipError_t launch_attention(const AttentionParams &p, int grid, hipStream_t stream, bool overlap) {
    using K = AttentionKernel<ROWS, KV>;
    return launch_kernel(K::function(), Launch{grid, K::kThreads, size_t(K::kSmemBytes), stream, overlap}, p);
}

}  // namespace gpu
}  // namespace mla

// One specialisation per translation unit (see attention_instance.cu.in).
#define MLA_INSTANTIATE_ATTENTION(ROWS, KV)                                                      \
    template hipError_t mla::gpu::launch_attention<ROWS, KV>(const mla::gpu::AttentionParams &, int, hipStream_t, bool); \
    template hipError_t mla::gpu::prepare_attention<ROWS, KV>(int);                             \
    template int mla::gpu::attention_smem_bytes<ROWS, KV>();                          \
    template int mla::gpu::attention_blocks_per_sm<ROWS, KV>();                       \
    template bool mla::gpu::attention_is_warpgroup<ROWS, KV>();
