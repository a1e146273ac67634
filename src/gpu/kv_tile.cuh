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

    // MXFP4: a row's scales start at any byte, so its first and last staged
    // words may hold only part of it. A lane owning such a word loads just
    // the row's bytes (at most one byte and one aligned half word) into
    // registers in `issue`; `finish_issue` assembles and stores the word. The
    // loads' latency hides behind the tile's math instead of stalling the
    // warp, and nothing outside the row's scales is read.
    uint32_t part8[kRowsPerWarp];   // the byte
    uint32_t part16[kRowsPerWarp];  // the half word
    uint32_t part_desc;             // 4 bits per row: pending, half word at byte 2, byte position (2 bits)

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
        part_desc = 0;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const int r = warp + i * kWarps, tok = t0 + r;
            const int32_t page = MLA_SHFL(my_page, i);
            const int64_t row = page < 0 ? -1 : (int64_t(page) << p.page_shift) + (tok & page_mask);
            const uint8_t *src = p.kv + (row < 0 ? 0 : row) * kRowBytes;
            uint8_t *dst = landing + (size_t(stage) * N + r) * kLd;
#pragma unroll
            for (int k = 0; k < (kChunks + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE; ++k) {
                const int ch = lane + k * MLA_WARP_SIZE;
                if (kChunks % MLA_WARP_SIZE == 0 || ch < kChunks) copy16_async(dst + ch * 16, src + ch * 16, row >= 0);
            }
            if (KV == MLA_DTYPE_MXFP4 && lane < kScaleWords) issue_scales(p, row, stage * N + r, lane, i);
        }
    }

    __device__ void finish_issue(int stage) {
        if (KV != MLA_DTYPE_MXFP4) return;
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const uint32_t d = part_desc >> (4 * i);
            if (d & 1u)
                *reinterpret_cast<uint32_t *>(scales + (stage * N + warp + i * kWarps) * kScaleLd + lane * 4) =
                    (part16[i] << (d & 2u ? 16 : 0)) | (part8[i] << (8 * ((d >> 2) & 3u)));
        }
    }

    // Word `word` (the lane) of the 18 scale bytes of KV row `row` into staged
    // row `slot`, as aligned words of the scale array starting at the one that
    // holds the row's first byte: whole words by cp.async, partial ones by
    // byte and half-word loads deferred to finish_issue (part8/part16[i]).
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
        bool has8, has16;
        int at8, at16;
        if (lo < first) {  // the first word: bytes [shift, 4)
            has16 = shift <= 2, at16 = 2, has8 = shift & 1, at8 = shift;
        } else if (lo + 4 > end) {  // the last word: bytes [0, n)
            const int n = int(end - lo);
            has16 = n >= 2, at16 = 0, has8 = n & 1, at8 = n - 1;
        } else {
            copy4_async(dst, lo, true);
            return;
        }
        part16[i] = has16 ? uint32_t(*reinterpret_cast<const uint16_t *>(lo + at16)) : 0u;
        part8[i] = has8 ? uint32_t(lo[at8]) : 0u;
        part_desc |= (1u | (at16 == 2 ? 2u : 0u) | (uint32_t(at8 & 3) << 2)) << (4 * i);
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
