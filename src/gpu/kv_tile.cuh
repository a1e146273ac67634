// Reading paged KV (and Q) into shared memory for the attention kernel, and
// the in-shared-memory dequantisation of fp8 / MXFP4 tiles to bf16. One
// specialisation per KV format; the kernel sees only this interface.
#pragma once

#include "../formats_packed.h"
#include "kernels.h"
#include "tile.cuh"

namespace mla {
namespace gpu {

constexpr int kKvLd = MLA_HEAD_DIM_QK + 8;  // bf16 row stride of Q/K tiles (odd multiple of 16 B)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory staging of one KV tile of N tokens in format KV.
template <int KV, int N>
struct KvTile {
    static constexpr bool kQuantized = KV != MLA_DTYPE_BF16;
    static constexpr int kRowBytes = KV == MLA_DTYPE_BF16 ? 1152 : KV == MLA_DTYPE_MXFP4 ? 288 : 576;
    static constexpr int kRawLd = kRowBytes + 16;          // staging stride (bytes) of quantised rows
    static constexpr int kScaleLd = 24;                    // staged scale bytes per row (aligned words)
    static constexpr int kStages = 2;
    // Bytes of the landing buffers (bf16: the bf16 tiles themselves).
    static constexpr int kLandingBytes = kQuantized ? kStages * N * kRawLd : kStages * N * kKvLd * 2;
    static constexpr int kScaleBytes = KV == MLA_DTYPE_MXFP4 ? kStages * N * kScaleLd : 0;
    static constexpr int kConvertedBytes = kQuantized ? N * kKvLd * 2 : 0;
    static constexpr int kRowMetaBytes = kStages * N * 8 + kStages * N;  // row offsets + scale misalignment

    uint8_t *landing;     // [kStages][N][kRawLd] or [kStages][N][kKvLd] bf16
    uint8_t *scales;      // [kStages][N][kScaleLd]
    uint16_t *converted;  // [N][kKvLd] bf16 (quantised formats)
    int64_t *row_offset;  // [kStages][N] row index of each token (-1: past the end); per stage so
                          // issuing the next tile cannot overwrite offsets still being read
    uint8_t *scale_shift; // [kStages][N] byte offset of the row's scales inside its first staged word

    // Issue the copies of tokens [t0, t0 + N) of a work item into stage `stage`.
    // Tokens at or past `end` are zero-filled. Contains a barrier.
    __device__ void issue(const AttentionParams &p, const WorkItem &w, int t0, int stage) {
        const int tid = threadIdx.x;
        int64_t *offsets = row_offset + stage * N;
        if (tid < N) {
            const int tok = t0 + tid;
            int64_t row = -1;
            if (tok < w.kv_end) {
                const int64_t slot = int64_t(w.page_begin) + (tok >> p.page_shift);
                int64_t page = p.kv_indices ? int64_t(p.kv_indices[slot]) : slot;
                if (p.num_pages > 0) page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
                row = (page << p.page_shift) + (tok & ((1 << p.page_shift) - 1));
            }
            offsets[tid] = row;
        }
        __syncthreads();
        constexpr int kChunks = kRowBytes / 16;
        uint8_t *dst_base = landing + size_t(stage) * N * (kQuantized ? kRawLd : kKvLd * 2);
        for (int c = tid; c < N * kChunks; c += kThreads) {
            const int r = c / kChunks, ch = c - r * kChunks;
            const int64_t row = offsets[r];
            const uint8_t *src = p.kv + (row < 0 ? 0 : row) * kRowBytes + ch * 16;
            copy16_async(dst_base + r * (kQuantized ? kRawLd : kKvLd * 2) + ch * 16, src, row >= 0);
        }
        if (KV == MLA_DTYPE_MXFP4) {
            // A token's 18 scale bytes start at any byte: aligned words wholly
            // inside them go by cp.async, the partial words at either end byte
            // by byte, so nothing outside the token's scales is read.
            for (int c = tid; c < N * 6; c += kThreads) {
                const int r = c / 6, word = c - r * 6;
                const int64_t row = offsets[r];
                uint8_t *dst = scales + (stage * N + r) * kScaleLd + word * 4;
                if (row < 0) {
                    // Past the end: zero scales, so the zero-filled values decode
                    // to 0 (a stale NaN scale would turn 0 * V into NaN in P.V).
                    copy4_async(dst, p.kv_block_scales, false);
                    if (word == 0) scale_shift[stage * N + r] = 0;
                    continue;
                }
                const int64_t first = row * p.scale_stride;
                const int shift = int(first & 3);
                const int64_t lo = first - shift + word * 4;  // this word's bytes [lo, lo + 4)
                const int64_t end = first + MLA_MXFP4_SCALES_PER_ROW;
                if (lo >= first && lo + 4 <= end) {
                    copy4_async(dst, p.kv_block_scales + lo, true);
                } else {
                    for (int b = 0; b < 4; ++b)
                        if (lo + b >= first && lo + b < end) dst[b] = p.kv_block_scales[lo + b];
                }
                if (word == 0) scale_shift[stage * N + r] = uint8_t(shift);
            }
        }
    }

    // bf16 view of stage `stage` after its copies landed (quantised: decode
    // into `converted`; the caller puts a barrier between this and reads).
    __device__ const uint16_t *bf16_tile(int stage) {
        if (!kQuantized) return reinterpret_cast<const uint16_t *>(landing + size_t(stage) * N * kKvLd * 2);
        const uint8_t *raw = landing + size_t(stage) * N * kRawLd;
        if (KV == MLA_DTYPE_MXFP4) {
            constexpr int kUnits = kRowBytes / 4;  // 8 elements each
            for (int u = threadIdx.x; u < N * kUnits; u += kThreads) {
                const int r = u / kUnits, c = u - r * kUnits;
                const uint32_t w = *reinterpret_cast<const uint32_t *>(raw + r * kRawLd + c * 4);
                const uint8_t e = scales[(stage * N + r) * kScaleLd + scale_shift[stage * N + r] + (c >> 2)];
                const Bf16x8 v = e2m1x8_to_bf16x8(w, e);
                *reinterpret_cast<uint4 *>(converted + r * kKvLd + c * 8) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
            }
        } else {
            constexpr int kUnits = kRowBytes / 4;  // 4 elements each
            for (int u = threadIdx.x; u < N * kUnits; u += kThreads) {
                const int r = u / kUnits, c = u - r * kUnits;
                const uint32_t w = *reinterpret_cast<const uint32_t *>(raw + r * kRawLd + c * 4);
                const Bf16x4 v = fp8x4_to_bf16x4<KV>(w);
                *reinterpret_cast<uint2 *>(converted + r * kKvLd + c * 4) = make_uint2(v.w[0], v.w[1]);
            }
        }
        return converted;
    }
};

// Load the item's query rows (token-major, heads of the head block) as bf16
// into Qs[ROWS][kKvLd]; padding rows are zero. bf16 rows are copied
// asynchronously (part of the first commit group).
template <int ROWS>
__device__ void load_q(const AttentionParams &p, const WorkItem &w, int h0, int heads, uint16_t *qs) {
    const int rows_valid = w.q_len * heads;
    if (p.q_dtype == MLA_DTYPE_BF16) {
        constexpr int kChunks = 1152 / 16;
        for (int c = threadIdx.x; c < ROWS * kChunks; c += kThreads) {
            const int r = c / kChunks, ch = c - r * kChunks;
            const bool valid = r < rows_valid;
            const int tok = w.q_begin + (valid ? r / heads : 0), h = h0 + (valid ? r % heads : 0);
            const uint8_t *src = p.q + (int64_t(tok) * p.num_heads + h) * 1152 + ch * 16;
            copy16_async(qs + r * kKvLd + ch * 8, src, valid);
        }
    } else {
        constexpr int kUnits = 576 / 4;
        for (int u = threadIdx.x; u < ROWS * kUnits; u += kThreads) {
            const int r = u / kUnits, c = u - r * kUnits;
            uint32_t v = 0;
            if (r < rows_valid) {
                const int tok = w.q_begin + r / heads, h = h0 + r % heads;
                v = *reinterpret_cast<const uint32_t *>(p.q + (int64_t(tok) * p.num_heads + h) * 576 + c * 4);
            }
            const Bf16x4 b = p.q_dtype == MLA_DTYPE_FP8_E4M3 ? fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3>(v)
                                                             : fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3_FNUZ>(v);
            *reinterpret_cast<uint2 *>(qs + r * kKvLd + c * 4) = make_uint2(b.w[0], b.w[1]);
        }
    }
}

}  // namespace gpu
}  // namespace mla
