// Reading paged KV (and Q) into shared memory for the attention kernel, and
// the two products on a staged tile, S = Q K^T (qk) and O += P V (pv). One
// specialisation per KV format; the kernel sees only this interface.
//
// On the MMA path fp8 tiles stay raw in shared memory: ldmatrix on the raw
// bytes hands each lane the codes of its MMA fragments, decoded in registers
// (no bf16 copy, no barrier between decode and math). A non-transposed load
// gives a lane 4 consecutive dims of one token, so the reduction order inside
// each MMA step of Q K^T is permuted, and the Q fragments are read to match
// (two 64-bit loads instead of an ldmatrix); a transposed load gives a lane
// two tokens of two adjacent dims, so the output columns of P V are permuted
// (pv_col). On the MMA path MXFP4 tiles, and every quantised tile of the
// portable kernels, are decoded into a bf16 tile in shared memory first:
// E2M1 decoding costs ~3 integer instructions an element, and fragments
// decode K's first 512 dims twice (once as K, once as V), which made MXFP4
// 1.5x slower there on the H200 (docs/performance.md, v6). The warpgroup
// products (below) read bf16 straight from a swizzled stage and decode E4M3
// into fragments.
#pragma once

#include <type_traits>

#include "../formats_packed.h"
#include "kernels.h"
#include "tile.cuh"

namespace mla {
namespace gpu {

constexpr int kKvLd = MLA_HEAD_DIM_QK + 8;  // bf16 row stride of Q/K tiles (odd multiple of 16 B)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Whether KV format `kv` is decoded into MMA fragments (else, when quantised,
// into a bf16 tile in shared memory).
constexpr bool decodes_into_fragments(int kv) {
#if defined(MLA_PORTABLE_KERNELS)
    return false;
#else
    return kv == MLA_DTYPE_FP8_E4M3 || kv == MLA_DTYPE_FP8_E4M3_FNUZ;
#endif
}

// Shared-memory staging of KV tiles of N tokens in format KV, STAGES tiles
// in flight, issued by the THREADS threads of a CTA. SWIZZLED stages them in
// the warpgroup MMA's 128-byte-swizzled layout (see kSwizzled), else row by row.
template <int KV, int N, int STAGES, int THREADS = kThreads, bool SWIZZLED = false>
struct KvTile {
    static constexpr bool kQuantized = KV != MLA_DTYPE_BF16;
    static constexpr int kRowBytes = KV == MLA_DTYPE_BF16 ? 1152 : KV == MLA_DTYPE_MXFP4 ? 288 : 576;
    // Staging stride (bytes) of quantised rows: fp8 rows padded by 16 bytes
    // (an odd number of 16-byte groups apart: conflict-free ldmatrix);
    // MXFP4 rows packed (18 groups: decode_mxfp4's reads are conflict-free
    // with its unit order, and three stages fit beside two decoded tiles).
    static constexpr int kRawLd = KV == MLA_DTYPE_MXFP4 ? kRowBytes : kRowBytes + 16;
    static constexpr int kScaleLd = MLA_MXFP4_SCALES_PER_ROW;  // staged MXFP4 scale bytes per row
    static constexpr int kStages = STAGES;
    // 128-byte-swizzled staging (bf16 on attention_wgmma.cuh): the tile is
    // cut into slabs of 64 dims (128 bytes a token); in slab c / 8 the 16-byte
    // chunk c of token r sits at 128 r + 16 ((c % 8) ^ (r % 8)). The warpgroup
    // products read K (K-major) and V^T (M-major) straight from it, with no
    // decode; a quarter warp copying 8 chunks of a row writes 128 contiguous
    // bytes (no bank conflicts) and reads a whole 128-byte line. Stages start
    // at 1024-byte boundaries (the swizzle is a function of the address).
    static constexpr bool kSwizzled = SWIZZLED;
    static constexpr int kSlabBytes = N * 128;
    static_assert(!SWIZZLED || (KV == MLA_DTYPE_BF16 && N % 8 == 0), "swizzled staging: bf16, 8-token atoms");
    // Bytes of the landing buffers (bf16: the bf16 tiles themselves).
    static constexpr int kLandingBytes = kSwizzled ? kStages * N * kRowBytes
                                         : kQuantized ? kStages * N * kRawLd
                                                      : kStages * N * kKvLd * 2;
    static constexpr int kLandingAlign = kSwizzled ? 1024 : 16;
    static constexpr int kScaleBytes = KV == MLA_DTYPE_MXFP4 ? (kStages * N * kScaleLd + 15) / 16 * 16 : 0;
    static constexpr bool kFragmentDecode = decodes_into_fragments(KV);
    static constexpr bool kDecodesToShared = kQuantized && !kFragmentDecode;
    // attention.cuh stores MXFP4's scales (finish_issue) only on its
    // shared-memory decode path.
    static_assert(KV != MLA_DTYPE_MXFP4 || kDecodesToShared, "MXFP4 needs finish_issue after each issue");
    static constexpr int kConvertedBytes = kDecodesToShared ? N * kKvLd * 2 : 0;
    // bf16 row stride of the Q tile: with fragment decoding a lane reads
    // 8 bytes of Q rows g and g + 8 per MMA step, conflict-free when the
    // stride is 8 words modulo the 32 banks.
    static constexpr int kQLd = kFragmentDecode ? MLA_HEAD_DIM_QK + 16 : kKvLd;
    static constexpr int kWarps = THREADS / MLA_WARP_SIZE;
    static constexpr int kRowsPerWarp = N / kWarps;
    static_assert(N % kWarps == 0 && kRowsPerWarp <= MLA_WARP_SIZE, "whole rows per warp");

    // This thread's index among the THREADS that issue and decode (the
    // CTA's, or one warpgroup's of a CTA of several).
    __device__ static int group_thread() { return int(threadIdx.x) % THREADS; }

    uint8_t *landing;     // [kStages][N][kRawLd] or [kStages][N][kKvLd] bf16
    uint8_t *scales;      // [kStages][N][kScaleLd] (MXFP4)
    uint16_t *converted;  // [N][kKvLd] bf16 (quantised formats)

    // MXFP4: lane l < kScaleLd of a warp loads scale byte l of each row the
    // warp copies in issue() (byte loads: any alignment, nothing outside the
    // row's scales is read) into the caller's ScaleLoads, and finish_issue()
    // stores them, once a tile's math has hidden their latency. The lane
    // that looks a row up computes its scale address once and the others get
    // it by one 64-bit shuffle, as for the row itself; a zero-filled row's
    // scales come from the plan's zero block (p.zeros), so they decode to 0,
    // never to a stale or NaN scale times the zero codes. The loads are not
    // predicated (lanes l >= kScaleLd load byte 0 again): a predicated load,
    // into a zeroed register or not, merges with the register's old value,
    // and ptxas loaded into a temporary and copied it at once, waiting out
    // every load's latency in issue(), which made MXFP4 1.8x slower
    // (docs/performance.md, v11). For the same reason the caller keeps each
    // issue's ScaleLoads within one loop iteration (issue, the tile's math,
    // finish_issue): carried across iterations, ptxas again copied the
    // loaded bytes into the carried registers right after the loads (v16).
    struct ScaleLoads {
        uint32_t byte[KV == MLA_DTYPE_MXFP4 ? kRowsPerWarp : 1];
    };

    // The page-table entry of the token this lane looks up for the next
    // issue(): lane l < kRowsPerWarp of warp w takes row w + l * kWarps of
    // the tile. Loaded one issue ahead, so that its latency hides behind a
    // tile's math instead of stalling the copies; -1 past the item's end.
    int32_t next_page;

    // The page of this lane's row of tile [t0, t0 + N) (-1: none).
    __device__ int32_t page_of_row(const AttentionParams &p, const WorkItem &w, int t0) const {
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = group_thread() / MLA_WARP_SIZE;
        const int tok = t0 + warp + lane * kWarps;
        if (lane >= kRowsPerWarp || tok >= w.kv_end) return -1;
        const int64_t slot = int64_t(w.page_begin) + (tok >> p.page_shift);
        return p.kv_indices ? p.kv_indices[slot] : int32_t(slot);
    }

    // The pool row of this lane's row of tile t0 on `page` (clamped into the
    // pool when its size is known), or -1 for none.
    __device__ int64_t row_on_page(const AttentionParams &p, int64_t page, int t0) const {
        if (page < 0) return -1;
        if (p.num_pages > 0 && page >= p.num_pages) page = p.num_pages - 1;
        const int tok = t0 + group_thread() / MLA_WARP_SIZE + (threadIdx.x % MLA_WARP_SIZE) * kWarps;
        return (page << p.page_shift) + (tok & ((1 << p.page_shift) - 1));
    }

    // Look up the pages of tile [t0, t0 + N) for the next issue() (the
    // first tile; issue() looks up the one after its own).
    __device__ void look_up(const AttentionParams &p, const WorkItem &w, int t0) { next_page = page_of_row(p, w, t0); }

    // Issue the copies of tokens [t0, t0 + N) of a work item into stage
    // `stage`; the pages come from the last look_up / issue. Tokens at or
    // past the item's end, and negative table entries, are zero-filled;
    // other pages are clamped into the pool when its size is known. Each
    // warp copies whole rows (warp, warp + kWarps, ...): the lane that
    // looked a row up computes its address once and passes it round by
    // shuffles, so no barrier is needed, and the per-row work is one 64-bit
    // shuffle and the copies (offsets fixed per lane and row parity).
    // (Dealing the warp's rows' chunks out across all 32 lanes, so that each
    // copy instruction moves 32 chunks, cost MXFP4 43% and fp8 3% on the
    // H200: docs/performance.md, v11.)
    // MXFP4 loads the rows' scales into *scales, which finish_issue(stage,
    // *scales) must store before the stage's async_wait barrier.
    __device__ void issue(const AttentionParams &p, const WorkItem &w, int t0, int stage,
                          ScaleLoads *scales = nullptr) {
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = group_thread() / MLA_WARP_SIZE;
        const int64_t my_row = row_on_page(p, next_page, t0);  // this lane's looked-up row
        // The row's address; bit 0 set (KV rows are 16-byte aligned) where
        // the copies zero-fill instead (one register and one shuffle a row).
        const uint64_t my_src = my_row < 0 ? reinterpret_cast<uintptr_t>(p.kv) | 1u
                                           : reinterpret_cast<uintptr_t>(p.kv + my_row * kRowBytes);
        const uint64_t my_scales = KV != MLA_DTYPE_MXFP4 ? 0
                                   : my_row < 0          ? reinterpret_cast<uintptr_t>(p.zeros)
                                                         : reinterpret_cast<uintptr_t>(p.kv_block_scales + my_row * p.scale_stride);
        const int scale_byte = lane < kScaleLd ? lane : 0;
        look_up(p, w, t0 + N);  // for the next call; not waited on here
        constexpr int kChunks = kRowBytes / 16;
        constexpr int kLd = kQuantized ? kRawLd : kKvLd * 2;
        // Row r = warp + i * kWarps. Swizzled: chunk lane + 32 k of the row
        // goes to slab (lane / 8) + 4 k at 128 r + 16 ((lane % 8) ^ (r % 8)),
        // and r % 8 repeats every kSwizzlePeriod rows of the warp.
        constexpr int kSwizzlePeriod = kWarps % 8 == 0 ? 1 : kWarps % 4 == 0 ? 2 : kWarps % 2 == 0 ? 4 : 8;
        uint8_t *const stage_base = landing + size_t(stage) * (kLandingBytes / kStages);
        uint8_t *dst_lane[kSwizzlePeriod];
#pragma unroll
        for (int q = 0; q < kSwizzlePeriod; ++q)
            dst_lane[q] = kSwizzled ? stage_base + warp * 128 + (lane >> 3) * kSlabBytes +
                                          (((lane & 7) ^ ((warp + q * kWarps) & 7)) << 4)
                                    : stage_base + warp * kLd + lane * 16;
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
            const uint64_t row_src = MLA_SHFL(my_src, i);
            const uint8_t *src = reinterpret_cast<const uint8_t *>(uintptr_t(row_src & ~uint64_t(1))) + lane * 16;
            const int bytes = row_src & 1u ? 0 : 16;
            uint8_t *dst = dst_lane[i % kSwizzlePeriod] + i * kWarps * (kSwizzled ? 128 : kLd);
#pragma unroll
            for (int k = 0; k < (kChunks + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE; ++k)
                if (kChunks % MLA_WARP_SIZE == 0 || lane + k * MLA_WARP_SIZE < kChunks)
                    copy16_async_zfill(dst + k * (kSwizzled ? 4 * kSlabBytes : MLA_WARP_SIZE * 16),
                                       src + k * MLA_WARP_SIZE * 16, bytes);
            if constexpr (KV == MLA_DTYPE_MXFP4)
                scales->byte[i] = load_u8(reinterpret_cast<const uint8_t *>(uintptr_t(MLA_SHFL(my_scales, i))) + scale_byte);
        }
    }

    // Store the scales that an issue() into `stage` loaded (MXFP4).
    __device__ void finish_issue(int stage, const ScaleLoads &loaded) {
        if (KV != MLA_DTYPE_MXFP4) return;
        const int lane = threadIdx.x % MLA_WARP_SIZE, warp = group_thread() / MLA_WARP_SIZE;
        if (lane < kScaleLd)
#pragma unroll
            for (int i = 0; i < kRowsPerWarp; ++i)
                scales[(stage * N + warp + i * kWarps) * kScaleLd + lane] = uint8_t(loaded.byte[i]);
    }

    // KV decoded in shared memory (MXFP4; every quantised format of the
    // portable kernels): decode stage `stage` into `converted` (the caller
    // puts a barrier between this and the products).
    __device__ void decode_to_shared(int stage) {
        if constexpr (KV == MLA_DTYPE_MXFP4) {
            decode_mxfp4<false>(stage, reinterpret_cast<uint8_t *>(converted));
        } else if constexpr (kDecodesToShared) {
            const uint8_t *raw = landing + size_t(stage) * N * kRawLd;
            // Units of 8 fp8 elements, 128-bit stores. Each warp decodes its
            // own rows' units, lane-strided, stepping (row, unit)
            // incrementally instead of dividing.
            constexpr int kUnits = kRowBytes / 8;
            constexpr int kWarpUnits = kRowsPerWarp * kUnits;
            static_assert(MLA_WARP_SIZE <= kUnits, "a lane's next unit is at most one row further");
            const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
            int i = 0, c = lane;
#pragma unroll
            for (int k = 0; k < (kWarpUnits + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE; ++k) {
                if (kWarpUnits % MLA_WARP_SIZE == 0 || k * MLA_WARP_SIZE + lane < kWarpUnits) {
                    const int r = warp + i * kWarps;
                    const uint2 w = *reinterpret_cast<const uint2 *>(raw + r * kRawLd + c * 8);
                    const Bf16x4 a = fp8x4_to_bf16x4<KV>(w.x), b = fp8x4_to_bf16x4<KV>(w.y);
                    *reinterpret_cast<uint4 *>(converted + r * kKvLd + c * 8) = make_uint4(a.w[0], a.w[1], b.w[0], b.w[1]);
                }
                c += MLA_WARP_SIZE;
                if (c >= kUnits) {
                    c -= kUnits;
                    ++i;
                }
            }
        }
    }

    // MXFP4 in units of one scale block, (row, 16-byte chunk) = 32
    // elements, decoded as four 8-element words with one scale load, into
    // `dst`: the bf16 tile [N][kKvLd], or (SWIZZLED_OUT) a 128-byte-swizzled
    // one as kSwizzled stages bf16 (the warpgroup products read it). The
    // DECODE_THREADS threads share the tile's units (the stage is complete
    // and visible to all of them after the caller's barrier); they are a
    // contiguous range of the CTA's threads, which may be more than the
    // THREADS that issue the copies. Eight consecutive threads take rows
    // 4i..4i+3 of chunks 2k, 2k + 1: packed rows are 18 16-byte groups
    // apart, so their loads hit 8 different groups modulo 8, and so do their
    // stores in either layout (no bank conflicts). A thread keeps its row
    // and steps through chunks, so its addresses are fixed but for one
    // offset a pass.
    template <bool SWIZZLED_OUT, int DECODE_THREADS = THREADS>
    __device__ void decode_mxfp4(int stage, uint8_t *dst) {
        constexpr int kChunks = kRowBytes / 16;
        constexpr int kPairsPerPass = DECODE_THREADS / (2 * N);  // chunk pairs decoded a pass
        constexpr int kPasses = (kChunks / 2 + kPairsPerPass - 1) / kPairsPerPass;
        static_assert(kChunks == MLA_MXFP4_SCALES_PER_ROW && kChunks % 2 == 0 && DECODE_THREADS % (2 * N) == 0,
                      "unit order");
        static_assert(kRawLd == kRowBytes && (kKvLd * 2 / 16) % 8 == 1, "conflict-free row strides");
        const int t = int(threadIdx.x) % DECODE_THREADS, octet = t >> 3;
        const int r = 4 * (octet % (N / 4)) + (t & 3), c0 = 2 * (octet / (N / 4)) + ((t >> 2) & 1);
        const uint8_t *raw = landing + size_t(stage) * N * kRawLd + r * kRawLd + c0 * 16;
        const uint8_t *row_scales = scales + (stage * N + r) * kScaleLd + c0;
        // 16-byte word j of the unit at chunk c0 + 2 * kPairsPerPass * pass
        auto out = [&](int pass, int j) {
            if (SWIZZLED_OUT) {  // chunk pair = 64 dims = one slab
                const int slab = (c0 >> 1) + kPairsPerPass * pass;
                return reinterpret_cast<uint4 *>(dst + slab * kSlabBytes + r * 128 + (((4 * (c0 & 1) + j) ^ (r & 7)) << 4));
            }
            return reinterpret_cast<uint4 *>(dst + r * kKvLd * 2 + (c0 + 2 * kPairsPerPass * pass) * 64 + j * 16);
        };
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            if ((kChunks / 2) % kPairsPerPass != 0 && c0 + 2 * kPairsPerPass * pass >= kChunks) break;
            const uint4 codes = *reinterpret_cast<const uint4 *>(raw + 2 * kPairsPerPass * pass * 16);
            const uint8_t e = row_scales[2 * kPairsPerPass * pass];
            const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const Bf16x8 v = e2m1x8_to_bf16x8(words[j], e);
                *out(pass, j) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
            }
        }
    }

    // The first byte of stage `stage`.
    __device__ const uint8_t *stage_bytes(int stage) const {
        return landing + size_t(stage) * (kLandingBytes / kStages);
    }

    // The bf16 tile the products read when KV is not decoded into fragments.
    __device__ const uint16_t *bf16_tile(int stage) const {
        return kDecodesToShared ? converted : reinterpret_cast<const uint16_t *>(landing + size_t(stage) * N * kKvLd * 2);
    }

    // acc[16 x 8NT] += Q[16 x K] K[col0 .. col0 + 8NT, k0 .. k0 + K]^T on stage
    // `stage`; q points at dim k0 of the warp's 16 Q rows (stride kQLd).
    template <int NT, int K>
    __device__ void qk(float (&acc)[NT][Tile::kElems], const uint16_t *q, int stage, int col0, int k0) const {
        if constexpr (kFragmentDecode) {
            qk_fragments<NT, K>(acc, q, stage, col0, k0);
        } else {
            Tile::abt<NT, K>(acc, q, kQLd, bf16_tile(stage) + col0 * kKvLd + k0, kKvLd);
        }
    }

    // acc[16 x 8NT] += P[16 x K] V[0 .. K, col0 .. col0 + 8NT] on stage `stage`;
    // element e of tile nt of acc is column col0 + pv_col(nt, lane, e).
    template <int NT, int K>
    __device__ void pv(float (&acc)[NT][Tile::kElems], const uint16_t *p, int pld, int stage, int col0) const {
        if constexpr (kFragmentDecode) {
            pv_fragments<NT, K>(acc, p, pld, stage, col0);
        } else {
            Tile::ab<NT, K>(acc, p, pld, bf16_tile(stage) + col0, kKvLd);
        }
    }

    __device__ static int pv_col(int nt, int lane, int e) {
        const int j = Tile::col(lane, e);
        if (!kFragmentDecode) return nt * 8 + j;
        return (nt >> 1) * 16 + 2 * j + (nt & 1);  // tile pairs: even, odd dims of 16
    }
    // With fragment decoding, column pv_col(nt, ..) + 1 is in tile nt + 1
    // (same element); otherwise it is element e + 1 of tile nt.
    static constexpr bool kPvPairsAcrossTiles = kFragmentDecode;

    // ---- The products on the warpgroup MMA (attention_wgmma.cuh) ----------
    // Transposed: S^T = K Q^T and O^T += V^T P^T, so the tile's 64 tokens and
    // V's dims are the M = 64 of each wgmma and the item's ROWS query rows
    // its N. Warp w supplies A rows 16w..16w+15. bf16 A operands are read
    // straight from the swizzled stage. E4M3 ones are decoded from the raw
    // stage into fragments by ldmatrix tricks: in S^T the reduction order
    // inside each 16-dim step is permuted (Q is staged to match,
    // wgmma_q_word), in O^T the dims of the rows are permuted (wgmma_pv_dim);
    // the codes become f16 (one cvt a pair; Q and P are f16 too).

    // Operand type of the warpgroup products: f16 (else bf16). They read K
    // and V^T from the swizzled stage (kSwizzled: bf16), else from A
    // fragments decoded in registers (E4M3).
    static constexpr bool kWgmmaF16 = KV == MLA_DTYPE_FP8_E4M3;

    // The bf16 pair (word) of a 32-dim block of Q, 0..15, that goes to word i
    // (0..3) of k chunk `chunk` (k 0..7 | 8..15) of the block's 16-dim step s,
    // in the reduction order of the K fragments of wgmma_qk.
    static constexpr int wgmma_q_word(int s, int chunk, int i) {
        // K from shared memory: dims in order. E4M3: a lane's 4 dims 4t..4t+3
        // of a step are k 2t, 2t + 1, 2t + 8, 2t + 9.
        return kSwizzled ? 8 * s + 4 * chunk + i : 8 * s + 2 * i + chunk;
    }

    // s[64 x ROWS] = K Q^T on stage `stage`: warp w has rows = tokens
    // 16w..16w+15; q_desc points at dims 0..15 of Q, each 16-dim step
    // `q_step` bytes further. Calls in_flight() once the first products are
    // issued (work that overlaps them: the next tile's copies), and returns
    // with the products complete.
    template <int ROWS, class InFlight>
    __device__ void wgmma_qk(float (&s)[ROWS / 2], uint64_t q_desc, int q_step, int stage, InFlight &&in_flight) const {
#if defined(MLA_TILE_WGMMA)
        static_assert((KV == MLA_DTYPE_FP8_E4M3 || kSwizzled) && N == 64,
                      "the warpgroup path: 64-token tiles, bf16 from shared memory or E4M3 fragments");
        if constexpr (kSwizzled) {
            // K-major A: a 16-dim step is 32 bytes into a slab's rows (four a slab).
            const uint64_t k_desc = Wgmma::desc_swizzled(stage_bytes(stage), kSlabBytes);
            Wgmma::fence();
#pragma unroll
            for (int step = 0; step < MLA_HEAD_DIM_QK / 16; ++step)
                Wgmma::mma_ss<ROWS, kWgmmaF16, false>(s, Wgmma::advance(k_desc, (step >> 2) * kSlabBytes + (step & 3) * 32),
                                                      Wgmma::advance(q_desc, step * q_step), step > 0);
            Wgmma::commit();
            in_flight();
            Wgmma::wait<0>();
            Wgmma::hold(s);
            return;
        }
        const uint8_t *src = qk_source(stage);
        // Commit groups of four 16-dim steps, two in flight (finer groups
        // measured slower on the H200: more fences and waits per tile).
        constexpr int kGroups = MLA_HEAD_DIM_QK / 64;
        uint32_t a[2][4][4];  // two groups' A fragments in flight
#pragma unroll
        for (int gr = 0; gr < kGroups; ++gr) {
            uint32_t(&f)[4][4] = a[gr & 1];
            if (gr >= 2) Wgmma::wait<1>();  // group gr - 2, which read f, is done
            qk_group_fragments(f, src, gr);
            Wgmma::fence();
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int step = 4 * gr + i;
                Wgmma::mma<ROWS, kWgmmaF16>(s, f[i], Wgmma::advance(q_desc, step * q_step), step > 0);
            }
            Wgmma::commit();
            if (gr == 0) in_flight();
        }
        Wgmma::wait<0>();
        Wgmma::hold(s);
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int i = 0; i < 4; ++i) Wgmma::hold(a[b][i]);
#endif
    }

    // o[b][64 x ROWS] += V^T P^T for dims wgmma_pv_dim(b, ..) on stage
    // `stage`; p_desc points at tokens 0..15 of P, each 16-token step
    // `p_step` bytes further. Returns with the products complete.
    template <int ROWS>
    __device__ void wgmma_pv(float (&o)[MLA_HEAD_DIM_V / 64][ROWS / 2], uint64_t p_desc, int p_step, int stage) const {
#if defined(MLA_TILE_WGMMA)
        if constexpr (kSwizzled) {
            // M-major A (V^T): M block b is slab b, a 16-token k step 16 rows on.
            const uint64_t v_desc = Wgmma::desc_swizzled(stage_bytes(stage), kSlabBytes);
            Wgmma::fence();
#pragma unroll
            for (int b = 0; b < MLA_HEAD_DIM_V / 64; ++b)
#pragma unroll
                for (int k = 0; k < N / 16; ++k)
                    Wgmma::mma_ss<ROWS, kWgmmaF16, true>(o[b], Wgmma::advance(v_desc, b * kSlabBytes + k * 16 * 128),
                                                         Wgmma::advance(p_desc, k * p_step), true);
            Wgmma::commit();
            Wgmma::wait<0>();
#pragma unroll
            for (int b = 0; b < MLA_HEAD_DIM_V / 64; ++b) Wgmma::hold(o[b]);
            return;
        }
        const uint8_t *src = pv_source(stage);
        // A commit group per M block (64 dims), two groups in flight.
        constexpr int kGroups = MLA_HEAD_DIM_V / 64;
        uint32_t a[2][4][4];  // [group & 1][k step][reg]
#pragma unroll
        for (int gr = 0; gr < kGroups; ++gr) {
            uint32_t(&f)[4][4] = a[gr & 1];
            if (gr >= 2) Wgmma::wait<1>();
            pv_group_fragments(f, src, gr);
            Wgmma::fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) Wgmma::mma<ROWS, kWgmmaF16>(o[gr], f[k], Wgmma::advance(p_desc, k * p_step), true);
            Wgmma::commit();
        }
        Wgmma::wait<0>();
#pragma unroll
        for (int b = 0; b < MLA_HEAD_DIM_V / 64; ++b) Wgmma::hold(o[b]);
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int k = 0; k < 4; ++k) Wgmma::hold(a[b][k]);
#endif
    }

    // The dim of accumulator element e of o[b] in wgmma_pv (its column is
    // query row 8 (e / 4) + 2t + (e & 1)).
    __device__ static int wgmma_pv_dim(int b, int warp, int lane, int e) {
        if (kSwizzled)  // dims in order: A row 16w + g (+ 8)
            return 64 * b + 16 * warp + (lane >> 2) + 8 * ((e >> 1) & 1);
        return 64 * b + 16 * warp + 2 * (lane >> 2) + ((e >> 1) & 1);
    }

  private:
#if defined(MLA_TILE_WGMMA)
    // A lane's ldmatrix row address for the A fragments of S^T on one stage:
    // tokens 16w + (0..7 | 8..15) at bytes +0 | +16 of 32 bytes.
    __device__ const uint8_t *qk_source(int stage) const {
        const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        return landing + size_t(stage * N + 16 * warp + (lane & 15)) * kRawLd + (lane >> 4) * 16;
    }

    // The A fragments of commit group gr of S^T: 16-dim steps 4gr..4gr+3.
    // Two 32-byte loads, each two steps: matrices 0, 1 are step 2q's A rows
    // g, g + 8 and 2, 3 step 2q + 1's; a lane gets dims 4t..4t+3.
    __device__ void qk_group_fragments(uint32_t (&f)[4][4], const uint8_t *src, int gr) const {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            uint32_t r[4];
            Tile::ldsm_x4(r, src + (2 * gr + q) * 32);
            const F16x4 v0 = e4m3x4_to_f16x4(r[0]), v1 = e4m3x4_to_f16x4(r[1]);
            const F16x4 v2 = e4m3x4_to_f16x4(r[2]), v3 = e4m3x4_to_f16x4(r[3]);
            f[2 * q][0] = v0.w[0], f[2 * q][1] = v1.w[0], f[2 * q][2] = v0.w[1], f[2 * q][3] = v1.w[1];
            f[2 * q + 1][0] = v2.w[0], f[2 * q + 1][1] = v3.w[0], f[2 * q + 1][2] = v2.w[1], f[2 * q + 1][3] = v3.w[1];
        }
    }

    // A lane's ldmatrix.x4.trans row address for the A fragments of O^T on
    // one stage: tokens 32h + lane.
    __device__ const uint8_t *pv_source(int stage) const {
        return landing + size_t(stage * N + (threadIdx.x & 31)) * kRawLd;
    }

    // The A fragments of commit group gr of O^T: M block gr, 4 k steps of 16
    // tokens. Matrix m of an ldmatrix.x4.trans at tokens 32h is tokens
    // 32h + 8m..8m+7 at dims 64 gr + 16w..+15, and a lane gets one 16-bit
    // column of them (dims 2g, 2g + 1) for tokens 32h + 8m + 2t, 2t + 1: k 2t,
    // 2t + 1 of k step 2h + m / 2 (+ 8 for odd m), regrouped by dim into A
    // rows g (dim 2g) and g + 8 (2g + 1).
    __device__ void pv_group_fragments(uint32_t (&f)[4][4], const uint8_t *src, int gr) const {
        const int warp = (threadIdx.x >> 5) & 3;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t r[4];
            Tile::ldsm_x4_trans(r, src + h * 32 * kRawLd + 64 * gr + 16 * warp);
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const F16x4 v = e4m3x4_to_f16x4(byte_perm(r[m], 0, 0x3120u));
                f[2 * h + m / 2][2 * (m & 1)] = v.w[0];
                f[2 * h + m / 2][2 * (m & 1) + 1] = v.w[1];
            }
        }
    }
#endif

    template <int NT, int K>
    __device__ void qk_fragments(float (&acc)[NT][Tile::kElems], const uint16_t *q, int stage, int col0,
                                 int k0) const {
#if defined(MLA_TILE_MMA_SYNC)
        static_assert(NT % 2 == 0 && K % 16 == 0, "a warp takes 16-token groups and whole MMA steps");
        const int lane = threadIdx.x & 31;
        // ldmatrix.x4 rows: tokens col0 + 16 np + (0..7 | 8..15) at bytes +0 |
        // +16, so matrix i is token tile i & 1 of MMA step i >> 1 (16 dims), and
        // a lane gets codes of dims 4t..4t+3 of token col0 + 16 np + lane / 4 (+ 8).
        // In that reduction order (k 2t, 2t + 1, 2t + 8, 2t + 9 = dims 4t..4t+3)
        // the A fragment of a step is dims 4t..4t+3 of Q rows g and g + 8.
        const uint16_t *qa = q + (lane >> 2) * kQLd + 4 * (lane & 3);
        auto load_q_fragment = [&](uint32_t(&a)[4], int k) {
            const uint2 lo = *reinterpret_cast<const uint2 *>(qa + k), hi = *reinterpret_cast<const uint2 *>(qa + 8 * kQLd + k);
            a[0] = lo.x, a[1] = hi.x, a[2] = lo.y, a[3] = hi.y;
        };
        const uint8_t *src = landing + (size_t(stage) * N + col0 + (lane & 15)) * kRawLd + (lane >> 4) * 16 + k0;
        float part[2][NT][4];  // even and odd MMA steps: two accumulation chains
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) part[c][nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < K; kk += 32) {
            const bool two = kk + 16 < K;  // a last single step takes ldmatrix.x2
            uint32_t a[2][4];
            load_q_fragment(a[0], kk);
            if (two) load_q_fragment(a[1], kk + 16);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t r[4];
                if (two) {
                    Tile::ldsm_x4(r, src + np * 16 * kRawLd + kk);
                } else {
                    Tile::ldsm_x2(reinterpret_cast<uint32_t(&)[2]>(r), src + np * 16 * kRawLd + kk);
                }
#pragma unroll
                for (int i = 0; i < (two ? 4 : 2); ++i) {
                    const Bf16x4 v = fp8x4_to_bf16x4<KV>(r[i]);
                    Tile::mma(part[i >> 1][2 * np + (i & 1)], a[i >> 1], v.w[0], v.w[1]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[nt][e] += part[0][nt][e] + part[1][nt][e];
#endif
    }

    template <int NT, int K>
    __device__ void pv_fragments(float (&acc)[NT][Tile::kElems], const uint16_t *p, int pld, int stage,
                                 int col0) const {
#if defined(MLA_TILE_MMA_SYNC)
        static_assert(NT % 4 == 0, "whole 32-dim groups");
        const int lane = threadIdx.x & 31;
        // ldmatrix.x4.trans rows: tokens k + (0..7 | 8..15) at bytes +0 | +16, so
        // matrix i is token half i & 1 of 16 dims i >> 1, and a lane gets dims
        // 2g, 2g + 1 (g = lane / 4) of tokens k + 2t, 2t + 1 (+ 8): regrouped by
        // dim, the B fragments of an even-dims and an odd-dims tile.
        const uint8_t *src = landing + (size_t(stage) * N + (lane & 15)) * kRawLd + (lane >> 4) * 16 + col0;
#pragma unroll
        for (int k = 0; k < K; k += 16) {
            uint32_t a[4];
            Tile::load_a(a, p, pld, k, lane);
#pragma unroll
            for (int cp = 0; cp < NT / 4; ++cp) {
                uint32_t r[4];
                Tile::ldsm_x4_trans(r, src + k * kRawLd + cp * 32);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const Bf16x4 lo = fp8x4_to_bf16x4<KV>(byte_perm(r[2 * h], 0, 0x3120u));
                    const Bf16x4 hi = fp8x4_to_bf16x4<KV>(byte_perm(r[2 * h + 1], 0, 0x3120u));
                    Tile::mma(acc[4 * cp + 2 * h], a, lo.w[0], hi.w[0]);
                    Tile::mma(acc[4 * cp + 2 * h + 1], a, lo.w[1], hi.w[1]);
                }
            }
        }
#endif
    }
};

// The query token (0 .. q_len - 1) of an item's row: row / heads, as a
// float product with inv_heads = 1 / heads (an integer division is ~25
// instructions): exact, since (row + 0.5) / heads is at least 0.5 / heads
// from an integer and the product errs by less than 2^-22 of it for rows
// under 2^20.
__device__ inline int row_token(int row, float inv_heads) { return int((float(row) + 0.5f) * inv_heads); }

// Global index of the item's Q row r (token-major, heads of the head
// block); padding rows read row 0.
__device__ inline int64_t q_row_index(const AttentionParams &p, const WorkItem &w, int h0, int heads, int r) {
    const bool valid = r < w.q_len * heads;
    const int i = valid ? row_token(r, 1.0f / float(heads)) : 0;
    return int64_t(w.q_begin + i) * p.num_heads + h0 + (valid ? r - i * heads : 0);
}

// Load the item's query rows (token-major, heads of the head block) as bf16
// into Qs[ROWS][Kv::kQLd]; padding rows are zero. bf16 rows are copied
// asynchronously (part of the first commit group). A thread loads pieces
// of one row, so the row's index (a division by the head count) is
// computed once, not once a piece (in the warpgroup kernels that loop was
// ~860 of a one-tile item's ~2,600 instructions a warp:
// docs/performance.md, v27).
template <int ROWS, class Kv>
__device__ void load_q(const AttentionParams &p, const WorkItem &w, int h0, int heads, uint16_t *qs) {
    static_assert(kThreads % ROWS == 0, "threads deal out rows evenly");
    constexpr int kParts = kThreads / ROWS;  // threads a row
    const int r = int(threadIdx.x) % ROWS, part = int(threadIdx.x) / ROWS;
    const bool valid = r < w.q_len * heads;
    const int64_t row = q_row_index(p, w, h0, heads, r);
    uint16_t *dst = qs + r * Kv::kQLd;
    if (p.q_dtype == MLA_DTYPE_BF16) {
        constexpr int kChunks = 1152 / 16;
#pragma unroll
        for (int i = 0; i < (kChunks + kParts - 1) / kParts; ++i) {
            const int ch = part + i * kParts;
            if (ch < kChunks) copy16_async(dst + ch * 8, p.q + row * 1152 + ch * 16, valid);
        }
    } else {
        constexpr int kUnits = 576 / 4;
#pragma unroll
        for (int i = 0; i < (kUnits + kParts - 1) / kParts; ++i) {
            const int c = part + i * kParts;
            if (c >= kUnits) break;
            uint32_t v = 0;
            if (valid) v = *reinterpret_cast<const uint32_t *>(p.q + row * 576 + c * 4);
            const Bf16x4 b = p.q_dtype == MLA_DTYPE_FP8_E4M3 ? fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3>(v)
                                                             : fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3_FNUZ>(v);
            *reinterpret_cast<uint2 *>(dst + c * 4) = make_uint2(b.w[0], b.w[1]);
        }
    }
}

}  // namespace gpu
}  // namespace mla
