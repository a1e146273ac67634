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

// Tiles in flight per format on the MMA path (AttentionShape::kStages);
// build-time overrides for tuning.
#ifndef MLA_KV_STAGES_BF16
#define MLA_KV_STAGES_BF16 2
#endif
#ifndef MLA_KV_STAGES_FP8
#define MLA_KV_STAGES_FP8 2
#endif
#ifndef MLA_KV_STAGES_MXFP4
#define MLA_KV_STAGES_MXFP4 2
#endif

// Shared-memory staging of KV tiles of N tokens in format KV, STAGES tiles
// in flight.
template <int KV, int N, int STAGES>
struct KvTile {
    static constexpr bool kQuantized = KV != MLA_DTYPE_BF16;
    static constexpr int kRowBytes = KV == MLA_DTYPE_BF16 ? 1152 : KV == MLA_DTYPE_MXFP4 ? 288 : 576;
    static constexpr int kRawLd = kRowBytes + 16;          // staging stride (bytes) of quantised rows
    static constexpr int kScaleLd = 24;                    // staged scale bytes per row (aligned words)
    static constexpr int kScaleWords = kScaleLd / 4;       // 18 bytes at any alignment span <= 6 words
    static constexpr int kStages = STAGES;
    // Bytes of the landing buffers (bf16: the bf16 tiles themselves).
    static constexpr int kLandingBytes = kQuantized ? kStages * N * kRawLd : kStages * N * kKvLd * 2;
    static constexpr int kScaleBytes = KV == MLA_DTYPE_MXFP4 ? kStages * N * kScaleLd : 0;
    static constexpr int kConvertedBytes = kQuantized ? N * kKvLd * 2 : 0;
    static constexpr int kRowMetaBytes = kStages * N;     // scale misalignment per staged row
    static constexpr int kWarps = kThreads / MLA_WARP_SIZE;
    static constexpr int kRowsPerWarp = N / kWarps;
    static_assert(N % kWarps == 0 && kRowsPerWarp <= MLA_WARP_SIZE, "whole rows per warp");

    uint8_t *landing;     // [kStages][N][kRawLd] or [kStages][N][kKvLd] bf16
    uint8_t *scales;      // [kStages][N][kScaleLd]
    uint16_t *converted;  // [N][kKvLd] bf16 (quantised formats)
    uint8_t *scale_shift; // [kStages][N] byte offset of the row's scales inside its first staged word

    // Page of token `tok` of the item, clamped into the pool; -1 past the end.
    __device__ static int32_t token_page(const AttentionParams &p, const WorkItem &w, int tok) {
        if (tok >= w.kv_end) return -1;
        const int64_t slot = int64_t(w.page_begin) + (tok >> p.page_shift);
        int64_t page = p.kv_indices ? int64_t(p.kv_indices[slot]) : slot;
        if (p.num_pages > 0) page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
        return int32_t(page);
    }

    // MXFP4: the first scale bytes of each of this warp's rows when they do not
    // start on a 4-byte boundary (lane 0 only): loaded by `issue` into
    // registers, assembled and written to shared memory by `finish_issue`, so
    // the loads' latency hides behind the tile's math instead of stalling.
    uint32_t head_lo[kRowsPerWarp];  // the byte at an odd start (shifts 1, 3)
    uint32_t head_hi[kRowsPerWarp];  // the 16-bit half word up to the next word (shifts 1, 2)
    uint32_t head_shift;             // 2 bits per row; 0: nothing pending

    // Issue the copies of tokens [t0, t0 + N) of a work item into stage `stage`.
    // Tokens at or past the item's end are zero-filled. Each warp copies whole
    // rows (warp, warp + kWarps, ...): its lanes look up the rows' pages in
    // parallel and pass them round by shuffles, so no barrier is needed.
    // MXFP4 needs finish_issue(stage) before the stage's async_wait barrier.
    __device__ void issue(const AttentionParams &p, const WorkItem &w, int t0, int stage) {
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
        const int32_t my_page = lane < kRowsPerWarp ? token_page(p, w, t0 + warp + lane * kWarps) : -1;
        constexpr int kChunks = kRowBytes / 16;
        constexpr int kLd = kQuantized ? kRawLd : kKvLd * 2;
        const int page_mask = (1 << p.page_shift) - 1;
        head_shift = 0;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + i * kWarps, tok = t0 + r;
            const int32_t page = MLA_SHFL(my_page, i);
            const int64_t row = page < 0 ? -1 : (int64_t(page) << p.page_shift) + (tok & page_mask);
            const uint8_t *src = p.kv + (row < 0 ? 0 : row) * kRowBytes;
            uint8_t *dst = landing + (size_t(stage) * N + r) * kLd;
#pragma unroll
            for (int ch = lane; ch < kChunks; ch += MLA_WARP_SIZE) copy16_async(dst + ch * 16, src + ch * 16, row >= 0);
            if (KV == MLA_DTYPE_MXFP4 && lane < kScaleWords) issue_scales(p, row, stage * N + r, lane, i);
        }
    }

    __device__ void finish_issue(int stage) {
        if (KV != MLA_DTYPE_MXFP4) return;
        const int warp = threadIdx.x / MLA_WARP_SIZE;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int shift = (head_shift >> (2 * i)) & 3;
            if (shift != 0)
                *reinterpret_cast<uint32_t *>(scales + (stage * N + warp + i * kWarps) * kScaleLd) =
                    (head_lo[i] << (8 * shift)) | (head_hi[i] << 16);
        }
    }

    // Word `word` of the 18 scale bytes of KV row `row` into staged row `slot`,
    // as aligned words of the scale array shifted by the row's misalignment:
    // whole words by cp.async, the last one by a zero-filling cp.async of
    // only its bytes of the row, the first one (when misaligned) byte by byte
    // into head_lo/head_hi[i]. Nothing outside the row's scales is read.
    __device__ void issue_scales(const AttentionParams &p, int64_t row, int slot, int word, int i) {
        uint8_t *dst = scales + slot * kScaleLd + word * 4;
        if (row < 0) {
            // Past the end: zero scales, so the zero-filled values decode to 0
            // (a stale NaN scale would turn 0 * V into NaN in P.V).
            copy4_async(dst, p.kv_block_scales, false);
            if (word == 0) scale_shift[slot] = 0;
            return;
        }
        const uint8_t *first = p.kv_block_scales + row * p.scale_stride;
        const uint8_t *end = first + MLA_MXFP4_SCALES_PER_ROW;
        const int shift = int(reinterpret_cast<uintptr_t>(first) & 3);
        const uint8_t *lo = first - shift + word * 4;  // this word's bytes [lo, lo + 4)
        if (word == 0) scale_shift[slot] = uint8_t(shift);
        if (lo >= end) return;  // past the row's scales: never read
        if (lo < first) {
            // bytes [first, lo + 4): an odd byte, then an aligned half word
            head_lo[i] = shift & 1 ? uint32_t(*first) : 0u;
            head_hi[i] = shift < 3 ? uint32_t(*reinterpret_cast<const uint16_t *>(lo + 2)) : 0u;
            head_shift |= uint32_t(shift) << (2 * i);
        } else {
            copy4_async_prefix(dst, lo, lo + 4 <= end ? 4 : int(end - lo));
        }
    }

    // bf16 view of stage `stage` after its copies landed (quantised: decode
    // into `converted`; the caller puts a barrier between this and reads).
    __device__ const uint16_t *bf16_tile(int stage) {
        if (!kQuantized) return reinterpret_cast<const uint16_t *>(landing + size_t(stage) * N * kKvLd * 2);
        const uint8_t *raw = landing + size_t(stage) * N * kRawLd;
        // Units of 8 elements (MXFP4: 4 bytes sharing one scale; fp8: 8 bytes),
        // 128-bit stores. Each warp decodes its own rows' units, lane-strided,
        // stepping (row, unit) incrementally instead of dividing.
        constexpr int kUnitBytes = KV == MLA_DTYPE_MXFP4 ? 4 : 8;
        constexpr int kUnits = kRowBytes / kUnitBytes;
        constexpr int kWarpUnits = kRowsPerWarp * kUnits;
        static_assert(MLA_WARP_SIZE <= kUnits, "a lane's next unit is at most one row further");
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
        int i = 0, c = lane;
#pragma unroll
        for (int k = 0; k < (kWarpUnits + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE; ++k) {
            if (kWarpUnits % MLA_WARP_SIZE == 0 || k * MLA_WARP_SIZE + lane < kWarpUnits) {
                const int r = warp + i * kWarps;
                const uint8_t *src = raw + r * kRawLd + c * kUnitBytes;
                uint4 *dst = reinterpret_cast<uint4 *>(converted + r * kKvLd + c * 8);
                if (KV == MLA_DTYPE_MXFP4) {
                    const int slot = stage * N + r;
                    const Bf16x8 v = e2m1x8_to_bf16x8(*reinterpret_cast<const uint32_t *>(src),
                                                      scales[slot * kScaleLd + scale_shift[slot] + (c >> 2)]);
                    *dst = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
                } else {
                    const uint2 w = *reinterpret_cast<const uint2 *>(src);
                    const Bf16x4 a = fp8x4_to_bf16x4<KV>(w.x), b = fp8x4_to_bf16x4<KV>(w.y);
                    *dst = make_uint4(a.w[0], a.w[1], b.w[0], b.w[1]);
                }
            }
            c += MLA_WARP_SIZE;
            if (c >= kUnits) {
                c -= kUnits;
                ++i;
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
