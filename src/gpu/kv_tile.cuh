// Reading paged KV (and Q) into shared memory for the attention kernel, and
// the in-shared-memory dequantisation of fp8 / MXFP4 tiles to bf16. One
// specialisation per KV format; the kernel sees only this interface.
#pragma once

#include "../formats.h"
#include "kernels.h"
#include "tile.cuh"

namespace mla {
namespace gpu {

constexpr int kKvLd = MLA_HEAD_DIM_QK + 8;  // bf16 row stride of Q/K tiles (odd multiple of 16 B)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// fp8 byte -> float, bit-exact: the magnitude bits are placed in a float whose
// exponent is then rebased by an exact power-of-two multiply.
template <int KV>
__device__ __forceinline__ float fp8_to_float(uint32_t v) {
    const float mag = __uint_as_float((v & 0x7fu) << 20) *
                      (KV == MLA_DTYPE_FP8_E4M3 ? 1.329227995784916e36f /* 2^120 */ : 6.646139978924579e35f /* 2^119 */);
    const bool nan = KV == MLA_DTYPE_FP8_E4M3 ? (v & 0x7fu) == 0x7fu : v == 0x80u;
    const float r = (v & 0x80u) ? -mag : mag;
    return nan ? __uint_as_float(0x7fc00000u) : r;
}

// Four fp8 bytes -> four bf16 (exact: every fp8 value is a bf16 value).
template <int KV>
__device__ __forceinline__ uint2 fp8x4_to_bf16x4(uint32_t w) {
    uint2 r;
    r.x = (float_to_bits(fp8_to_float<KV>(w & 0xffu)) >> 16) | (float_to_bits(fp8_to_float<KV>((w >> 8) & 0xffu)) & 0xffff0000u);
    r.y = (float_to_bits(fp8_to_float<KV>((w >> 16) & 0xffu)) >> 16) | (float_to_bits(fp8_to_float<KV>(w >> 24)) & 0xffff0000u);
    return r;
}

// Eight E2M1 nibbles times one E8M0 scale -> eight bf16, exact unless the
// product leaves the bf16 range (as in float). The nibble's exponent and
// mantissa bits are placed at the top of a float's exponent/mantissa fields,
// which is the value times 2^-126 (subnormal for exponent 0 included); the
// exact multiply by 2^126 rebases it, the second applies the block scale.
__device__ __forceinline__ float e2m1_bits_to_float(uint32_t nibble) {
    return __uint_as_float(((nibble & 0x7u) << 22) | ((nibble & 0x8u) << 28)) * 8.507059173023462e37f /* 2^126 */;
}

__device__ __forceinline__ uint4 e2m1x8_to_bf16x8(uint32_t w, float scale) {
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float lo = e2m1_bits_to_float(w >> (8 * i)) * scale;
        const float hi = e2m1_bits_to_float(w >> (8 * i + 4)) * scale;
        out[i] = (float_to_bits(lo) >> 16) | (float_to_bits(hi) & 0xffff0000u);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

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
                *reinterpret_cast<uint4 *>(converted + r * kKvLd + c * 8) = e2m1x8_to_bf16x8(w, e8m0_to_float(e));
            }
        } else {
            constexpr int kUnits = kRowBytes / 4;  // 4 elements each
            for (int u = threadIdx.x; u < N * kUnits; u += kThreads) {
                const int r = u / kUnits, c = u - r * kUnits;
                const uint32_t w = *reinterpret_cast<const uint32_t *>(raw + r * kRawLd + c * 4);
                *reinterpret_cast<uint2 *>(converted + r * kKvLd + c * 4) = fp8x4_to_bf16x4<KV>(w);
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
            *reinterpret_cast<uint2 *>(qs + r * kKvLd + c * 4) = p.q_dtype == MLA_DTYPE_FP8_E4M3
                                                                    ? fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3>(v)
                                                                    : fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3_FNUZ>(v);
        }
    }
}

}  // namespace gpu
}  // namespace mla
