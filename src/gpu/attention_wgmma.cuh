// The split-KV attention kernel on Hopper's warpgroup MMA (wgmma), for the
// items of 16 or 32 query rows (16 or 32 heads at q_len 1: the decode shapes
// of serving) with bf16, OCP E4M3 or MXFP4 KV.
// One consumer warpgroup computes one work item, as in attention.cuh, but
// the products are transposed (KvTile::wgmma_qk / wgmma_pv): S^T = K Q^T puts
// the tile's 64 tokens on the M = 64 of the wgmma and the rows on its N,
// so nothing is padded; Q and P are the B operands in shared memory. bf16 K
// and V^T are A operands read straight from the stage (128-byte-swizzled:
// no decode; one CTA per SM, a 74 KB tile in flight while one is computed).
// E4M3 K and V are decoded from the raw stage into A fragments in registers
// (two CTAs per SM). MXFP4 tiles are decoded by producer
// warpgroups into swizzled bf16 tiles that the consumer reads as it reads
// bf16 stages (one CTA per SM). (E4M3 and MXFP4 decoded by the consumer's
// own warps into a swizzled tile, and MXFP4 decoded into fragments, were
// correct but slower on the H200: docs/performance.md, v8 and v9.)
//
// E4M3's operands are f16, not bf16: E4M3 -> f16 is one cvt per pair (bf16
// takes four instructions) and exact. Q is staged as f16 times a power of
// two that puts the item's largest |q| in [2^14, 2^15) (exact for bf16 and
// fp8 Q; the factor is taken out of the scores again). bf16 KV takes Q and P
// as bf16. The softmax runs on the
// S^T accumulators in registers; its reference maximum moves only when a
// score exceeds it by more than kRescaleLog2, and P is stored as
// 2^(s - reference + kPOffsetLog2), at most 2^15, with f16's flush below
// 2^-24 at 2^-31 of the reference (bf16 P keeps less precision). The common
// tile costs two barriers: the KV landing and P written (with the vote on
// whether to rescale).
#pragma once

#include <math.h>

#include "kernels.h"
#include "kv_tile.cuh"
#include "tile.cuh"

namespace mla {
namespace gpu {

// Whether the (rows, kv) specialisation runs this kernel instead of attention.cuh's.
constexpr bool uses_wgmma(int rows, int kv) {
#if defined(MLA_WGMMA_KERNELS) && !defined(MLA_PORTABLE_KERNELS)
    return (rows == 16 || rows == 32) && (kv == MLA_DTYPE_FP8_E4M3 || kv == MLA_DTYPE_BF16 || kv == MLA_DTYPE_MXFP4);
#else
    (void)rows, (void)kv;
    return false;
#endif
}

template <int ROWS, int KV>
struct WgmmaShape {
    // One warpgroup computes (two, each with half of S^T's reduction, added
    // through shared memory, and half of O^T's dims, measured 4% slower on
    // the H200: docs/performance.md, v7). MXFP4 adds producer warpgroups
    // that stage the raw tiles and decode each into a swizzled bf16 tile
    // while the consumer computes the previous one (decoding in the
    // consumer's own warps left a 4-warp CTA 2.3x slower than the mma.sync
    // kernel: v9).
    static constexpr bool kProducer = KV == MLA_DTYPE_MXFP4;
    static constexpr int kConsumerThreads = 128;
    // Three producer warpgroups decode (twelve warps: each thread decodes
    // three 32-element units a tile, where eight warps took 4.5 in five
    // passes); the first two also issue the raw tiles' copies (64 rows,
    // 8 a warp). With one producer warpgroup each scheduler had one
    // decoding warp, whose dependent decode chains left the issue slots
    // mostly idle (MXFP4 B256x8k 1,053 -> 701 us with two, on an H100:
    // docs/performance.md, v11; three: v16 and, for 32 rows, v17).
    static constexpr int kProducerThreads = kProducer ? 384 : 0;
    static constexpr int kIssueThreads = kProducer ? 256 : 0;
    static constexpr int kThreads = kConsumerThreads + kProducerThreads;
    // Registers a thread after the warpgroups' hand-over (setmaxnreg; 0:
    // as launched). 32 rows' O^T alone is 128 accumulators a consumer
    // thread (the bf16 kernel uses 240 registers), so the producers give
    // some of theirs to it (the decode fits 88 without spills). 16 rows
    // fit the launch's 128, but there ptxas builds the consumer's wgmma
    // descriptors in vector registers and moves each to a uniform one (141
    // R2UR against 20 at 168): with the cap's branch a tile, that kernel
    // was 1.3% slower at 128 and is even at 168 (docs/performance.md, v26).
    // The launch allocates kLaunchRegisters a thread.
    static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
    static constexpr int kConsumerRegisters = !kProducer ? 0 : ROWS == 32 ? 240 : 168;
    static constexpr int kProducerRegisters = !kProducer ? 0 : ROWS == 32 ? 88 : 112;
    static_assert(kConsumerThreads * kConsumerRegisters + kProducerThreads * kProducerRegisters <=
                      kThreads * kLaunchRegisters,
                  "the hand-over fits the launch's registers");
    static constexpr int kWarps = kConsumerThreads / 32;  // the consumer's
    static constexpr int N = 64;          // tokens per KV tile: the M of a wgmma
    static constexpr int kStages = 2;     // tile j + 1 loads (or decodes) while tile j is computed
    // What the products read: bf16 stages swizzled, read straight from
    // shared memory (bf16 KV, and MXFP4's decoded tiles); E4M3 stages raw
    // rows, decoded into A fragments.
    static constexpr int kOperandKv = kProducer ? MLA_DTYPE_BF16 : KV;
    using Kv = KvTile<kOperandKv, N, kStages, kConsumerThreads, kOperandKv == MLA_DTYPE_BF16>;
    // The producer's raw stages (MXFP4): three for 16 rows, so that two
    // tiles load while one is decoded; two for 32 rows, whose Q takes the
    // third's shared memory (and whose consumer, slower per tile, leaves
    // each tile's copies longer to land).
    static constexpr int kRawStages = ROWS == 16 ? 3 : 2;
    using Raw = KvTile<KV, N, kRawStages, kProducer ? kIssueThreads : kConsumerThreads, false>;
    static constexpr int kRawBytes = kProducer ? Raw::kLandingBytes + Raw::kScaleBytes : 0;
    static_assert(!uses_wgmma(ROWS, KV) || Kv::kScaleBytes == 0, "block scales only in the producer's stages");
    static constexpr int kSRegs = ROWS / 2;                  // S^T accumulators per thread
    static constexpr int kRowsPerThread = ROWS / 4;          // query rows 8i + 2t + c of a lane
    static constexpr int kOBlocks = MLA_HEAD_DIM_V / 64;     // M blocks of O^T
    // Q and P as K-major B operands: core matrices (8 rows x 8 elements) of
    // one 8-element k chunk adjacent, chunks kChunkBytes apart.
    static constexpr int kChunkBytes = ROWS / 8 * Wgmma::kCoreBytes;
    static constexpr int kStepBytes = 2 * kChunkBytes;       // one 16-element k step
    static constexpr int kQBytes = MLA_HEAD_DIM_QK / 8 * kChunkBytes;
    static constexpr int kPBytes = N / 8 * kChunkBytes;      // P^T
    static constexpr int kRedBytes = kWarps * ROWS * 4;      // per-warp row maxima / sums
    static constexpr int kStatBytes = ROWS * 4;              // the rows' LSE for the epilogue
    static constexpr int kOLd = MLA_HEAD_DIM_V + 4;          // float stride of the epilogue's O staging
    static constexpr int kSmemBytes = Kv::kLandingBytes + kRawBytes + kQBytes + kPBytes + kRedBytes + kStatBytes +
                                      Kv::kLandingAlign - 16;
    // Two CTAs per SM where they fit (one's copies and barriers overlap the
    // other's math): E4M3. bf16's two 74 KB stages fit one; its warps only
    // issue copies and wgmmas, so one tile in flight per SM streams.
    static constexpr int kMinBlocksPerSm = 2 * (kSmemBytes + 1024) <= 228 * 1024 ? 2 : 1;
    static_assert(!uses_wgmma(ROWS, KV) || ROWS == 16 || ROWS == 32, "wgmma shapes: m64n16k16, m64n32k16");
    static_assert(!uses_wgmma(ROWS, KV) || ROWS * kOLd * 4 <= Kv::kLandingBytes, "the epilogue stages O in the KV stages");
    static_assert(!uses_wgmma(ROWS, KV) || kSmemBytes + 1024 <= 228 * 1024, "fits an SM");

    // Named barriers (tile.cuh) of the consumer warpgroup alone, of the
    // producer's alone, and of the hand-over of decoded tile buffer b: full
    // (producer -> consumer) and empty (consumer -> producer).
    static constexpr int kConsumerBarrier = 1, kProducerBarrier = 2;
    static constexpr int full_barrier(int b) { return 3 + b; }
    static constexpr int empty_barrier(int b) { return 3 + kStages + b; }
    // A barrier of the consumer's threads (the whole CTA without a producer).
    __device__ static void consumer_sync() {
        if (kProducer) {
            barrier_sync(kConsumerBarrier, kConsumerThreads);
        } else {
            __syncthreads();
        }
    }
    __device__ static int consumer_sync_or(int predicate) {
        return kProducer ? barrier_sync_or(kConsumerBarrier, kConsumerThreads, predicate) : __syncthreads_or(predicate);
    }
};

// A score more than this above the reference maximum (log2 units) moves it.
constexpr float kRescaleLog2 = 8.0f;
// P = 2^(score - reference + kPOffsetLog2) <= 2^15 < 65504 (f16's largest).
constexpr float kPOffsetLog2 = 7.0f;

// Q rows into the B-operand layout of S^T (K-major core matrices), each
// 32-dim block in the reduction order of the K fragments (Kv::wgmma_q_word);
// for f16 operands as f16 times a power of two (see the top), for bf16 as
// they are. bf16 Q for bf16 operands read in dim order is a permutation of
// 16-byte chunks: copied asynchronously (the caller's next async_commit
// closes the group); otherwise synchronous. `red` holds THREADS / 32
// floats. Returns the factor's inverse, which the scores are multiplied by.
template <class Kv, int ROWS, int THREADS>
__device__ float load_q_wgmma(const AttentionParams &p, const WorkItem &w, int h0, int heads, uint8_t *qs,
                              int chunk_bytes, float *red) {
    // A thread loads one row (every kParts-th chunk or block of it), so the
    // row's index (a division by the head count) is computed once, not once
    // a chunk: the bf16 loop over (row, chunk) units was ~860 of a
    // one-tile item's ~2,600 instructions a warp (docs/performance.md, v27).
    static_assert(THREADS % ROWS == 0, "threads deal out rows evenly");
    constexpr int kBlocks = MLA_HEAD_DIM_QK / 32, kParts = THREADS / ROWS;
    constexpr int kUnits = (kBlocks + kParts - 1) / kParts;  // 32-dim blocks a thread
    const int rows_valid = w.q_len * heads;
    const int r = int(threadIdx.x) % ROWS, part = int(threadIdx.x) / ROWS;
    const int64_t row = q_row_index(p, w, h0, heads, r);
    if (Kv::kSwizzled && p.q_dtype == MLA_DTYPE_BF16) {
        // Chunk m (dims 8m..8m+7) of row r at chunk m's core-matrix column;
        // a warp's copies land in 512 contiguous bytes.
        static_assert(!Kv::kSwizzled || (!Kv::kWgmmaF16 && Kv::wgmma_q_word(1, 1, 3) == 15), "Q dims in order");
        constexpr int kChunks = MLA_HEAD_DIM_QK / 8;
        static_assert(kChunks % kParts == 0, "a row's chunks dealt evenly");
        const uint8_t *src = p.q + row * 1152 + part * 16;
        uint8_t *dst = qs + (r / 8) * Wgmma::kCoreBytes + (r % 8) * 16 + part * chunk_bytes;
#pragma unroll
        for (int i = 0; i < kChunks / kParts; ++i)  // chunk part + i kParts
            copy16_async(dst + i * kParts * chunk_bytes, src + i * kParts * 16, r < rows_valid);
        return 1.0f;
    }
    uint32_t v[kUnits][16];  // bf16 pairs: word i is dims 32c + 2i, 2i + 1
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
        const int c = part + k * kParts;
#pragma unroll
        for (int i = 0; i < 16; ++i) v[k][i] = 0u;
        if (c >= kBlocks || r >= rows_valid) continue;
        if (p.q_dtype == MLA_DTYPE_BF16) {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.q + row * 1152 + c * 64);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 x = src[i];
                v[k][4 * i] = x.x, v[k][4 * i + 1] = x.y, v[k][4 * i + 2] = x.z, v[k][4 * i + 3] = x.w;
            }
        } else {
            const uint4 *src = reinterpret_cast<const uint4 *>(p.q + row * 576 + c * 32);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const uint4 x = src[i];
                const uint32_t codes[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const Bf16x4 b = p.q_dtype == MLA_DTYPE_FP8_E4M3 ? fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3>(codes[j])
                                                                     : fp8x4_to_bf16x4<MLA_DTYPE_FP8_E4M3_FNUZ>(codes[j]);
                    v[k][8 * i + 2 * j] = b.w[0], v[k][8 * i + 2 * j + 1] = b.w[1];
                }
            }
        }
        if (Kv::kWgmmaF16)
#pragma unroll
            for (int i = 0; i < 16; ++i)  // fmaxf drops NaN: a NaN in Q stays NaN after scaling
                amax = fmaxf(amax, fmaxf(fabsf(bf16_to_float(uint16_t(v[k][i] & 0xffffu))),
                                         fabsf(bf16_to_float(uint16_t(v[k][i] >> 16)))));
    }
    int shift = 0;
    if (Kv::kWgmmaF16) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, MLA_SHFL_XOR(amax, off));
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
        __syncthreads();
        amax = red[0];
#pragma unroll
        for (int k = 1; k < THREADS / 32; ++k) amax = fmaxf(amax, red[k]);
        // 2^(14 - e) for amax in [2^e, 2^(e+1)), at most 2^126 (so that its
        // inverse is a normal float); 1 for zero or inf.
        const int e = int((float_to_bits(amax) >> 23) & 0xffu) - 127;
        shift = amax > 0.0f && amax <= 3.4e38f ? min(14 - e, 126) : 0;
    }
    const float scale = bits_to_float(uint32_t(127 + shift) << 23);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
        const int c = part + k * kParts;
        if (c >= kBlocks) continue;
        uint32_t h[16];
#pragma unroll
        for (int i = 0; i < 16; ++i)
            h[i] = Kv::kWgmmaF16 ? pack_f16x2_rn(bf16_to_float(uint16_t(v[k][i] & 0xffffu)) * scale,
                                                 bf16_to_float(uint16_t(v[k][i] >> 16)) * scale)
                                 : v[k][i];
        uint8_t *dst = qs + (r / 8) * Wgmma::kCoreBytes + (r % 8) * 16;
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int chunk = 0; chunk < 2; ++chunk)
                *reinterpret_cast<uint4 *>(dst + (2 * (2 * c + st) + chunk) * chunk_bytes) =
                    make_uint4(h[Kv::wgmma_q_word(st, chunk, 0)], h[Kv::wgmma_q_word(st, chunk, 1)],
                               h[Kv::wgmma_q_word(st, chunk, 2)], h[Kv::wgmma_q_word(st, chunk, 3)]);
    }
    fence_proxy_async();
    return bits_to_float(uint32_t(127 - shift) << 23);
}

// The producer warpgroups of an item (MXFP4): stage the raw tiles (tiles
// j + 1 .. j + kRawStages - 1 load while tile j is decoded; one commit
// group per tile, empty or not), decode tile j into decoded buffer j % 2
// once the consumer has released that buffer's tile j - 2, and hand it
// over. The scale bytes of the tile issued in an iteration are stored
// after that iteration's decode, which hides their loads' latency
// (KvTile::ScaleLoads). The first kIssueThreads producer threads issue;
// all of them decode (the others issue no tile: their commits and waits
// are empty).
template <class S>
__device__ void produce_decoded_tiles(const AttentionParams &p, const WorkItem &w, int num_tiles, uint8_t *raw_landing,
                                      uint8_t *raw_scales, uint8_t *decoded) {
    using Raw = typename S::Raw;
    constexpr int N = S::N, kRaw = S::kRawStages;
    // (Raw's threads are numbered threadIdx.x % kIssueThreads: distinct
    // over the issuing range, which follows the consumer's threads.)
    const int issued_tiles = int(threadIdx.x) < S::kConsumerThreads + S::kIssueThreads ? num_tiles : 0;
    Raw raw;
    raw.landing = raw_landing, raw.scales = raw_scales, raw.converted = nullptr;
    if (issued_tiles > 0) raw.look_up(p, w, w.kv_begin);
    typename Raw::ScaleLoads first[kRaw - 1];
#pragma unroll
    for (int t = 0; t < kRaw - 1; ++t) {
        if (t < issued_tiles) raw.issue(p, w, w.kv_begin + t * N, t, &first[t]);
        async_commit();
    }
#pragma unroll
    for (int t = 0; t < kRaw - 1; ++t)
        if (t < issued_tiles) raw.finish_issue(t, first[t]);
    for (int j = 0; j < num_tiles; ++j) {
        async_wait<kRaw - 2>();  // tile j has landed
        // ... for every producer thread (its scales too), and every one is
        // done decoding tile j - 1, whose stage tile j + kRaw - 1 reuses.
        barrier_sync(S::kProducerBarrier, S::kProducerThreads);
        const int ahead = j + kRaw - 1;
        typename Raw::ScaleLoads ahead_scales;
        if (ahead < issued_tiles) raw.issue(p, w, w.kv_begin + ahead * N, ahead % kRaw, &ahead_scales);
        async_commit();
        const int b = j % S::kStages;
        if (j >= S::kStages) barrier_sync(S::empty_barrier(b), S::kThreads);  // tile j - 2's products are done
        raw.template decode_mxfp4<true, S::kProducerThreads>(j % kRaw, decoded + b * (S::Kv::kLandingBytes / S::kStages));
        if (ahead < issued_tiles) raw.finish_issue(ahead % kRaw, ahead_scales);
        fence_proxy_async();  // the decoded tile is visible to the consumer's wgmmas ...
        barrier_arrive(S::full_barrier(b), S::kThreads);  // ... once it has passed this barrier
    }
    async_wait<0>();
}

template <int ROWS, int KV>
__global__ void __launch_bounds__((WgmmaShape<ROWS, KV>::kThreads), (WgmmaShape<ROWS, KV>::kMinBlocksPerSm))
    attention_wgmma_kernel(const AttentionParams p) {
    using S = WgmmaShape<ROWS, KV>;
    using Kv = typename S::Kv;
    constexpr int N = S::N, kSRegs = S::kSRegs, kRows = S::kRowsPerThread, kOBlocks = S::kOBlocks;
    const float kNegInf = -INFINITY;

    wait_for_previous_grid();  // metadata, Q, KV, and the previous step's readers of out / partials
    allow_next_grid();
    // items has the plan's max_items entries (zeroed at creation), at least
    // the grid, so the item's load goes out with the summary's.
    const WorkItem w = p.items[blockIdx.x];
    if (int(blockIdx.x) >= p.summary->num_items) return;

    MLA_DYNAMIC_SMEM(uint8_t, smem);
    uint8_t *cursor = smem;  // (16-byte aligned; the stages first, at their alignment)
    cursor += (Kv::kLandingAlign - Wgmma::shared_address(cursor) % Kv::kLandingAlign) % Kv::kLandingAlign;
    Kv kv;
    kv.landing = cursor; cursor += Kv::kLandingBytes;  // (with a producer: the decoded tiles)
    uint8_t *raw_landing = cursor; cursor += S::kProducer ? S::Raw::kLandingBytes : 0;
    uint8_t *raw_scales = cursor; cursor += S::kProducer ? S::Raw::kScaleBytes : 0;
    uint8_t *qs = cursor; cursor += S::kQBytes;
    kv.scales = nullptr, kv.converted = nullptr;  // (MXFP4, shared-memory decode)
    uint8_t *ps = cursor; cursor += S::kPBytes;  // P^T of the current tile
    float *red = reinterpret_cast<float *>(cursor); cursor += S::kRedBytes;  // per-warp row values
    float *row_lse = reinterpret_cast<float *>(cursor); cursor += S::kStatBytes;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int h0 = w.head_block * p.heads_per_block;
    const int heads = min(p.heads_per_block, p.num_heads - h0);
    const int rows_valid = w.q_len * heads;
    const int num_tiles = (w.kv_end - w.kv_begin + N - 1) / N;
    if constexpr (S::kProducer) {
        if (tid >= S::kConsumerThreads) {
            if constexpr (S::kProducerRegisters > 0) warpgroup_release_registers<S::kProducerRegisters>();
            produce_decoded_tiles<S>(p, w, num_tiles, raw_landing, raw_scales, kv.landing);
            return;
        }
        if constexpr (S::kConsumerRegisters > 0) warpgroup_claim_registers<S::kConsumerRegisters>();
    }

    // Tiles 0 and 1 in flight from the start (tile j + 1 is issued at the
    // top of iteration j >= 1, once every warp is done with tile j - 1's
    // stage); one commit group per tile, empty or not. (With a producer,
    // only Q's copies.)
    if (!S::kProducer) {
        kv.look_up(p, w, w.kv_begin);
        if (num_tiles > 0) kv.issue(p, w, w.kv_begin, 0);
    }
    const float q_unscale = load_q_wgmma<Kv, ROWS, S::kConsumerThreads>(p, w, h0, heads, qs, S::kChunkBytes, red);
    async_commit();  // tile 0 (and Q, when copied asynchronously)
    if (!S::kProducer && num_tiles > 1) kv.issue(p, w, w.kv_begin + N, 1);
    async_commit();

    // This lane's query rows: row(r) = 8 (r / 2) + 2t + (r & 1); the
    // accumulator element e of S^T and O^T belongs to row(2 (e / 4) + (e & 1)).
    auto row_of = [&](int r) { return 8 * (r >> 1) + 2 * t + (r & 1); };
    auto reg_row = [](int e) { return 2 * (e >> 2) + (e & 1); };
    float m_ref[kRows], l_part[kRows];
    int visible_end[kRows];  // query token i of the sequence's q_len sees keys < kv_len - q_len + i + 1
    const float inv_heads = 1.0f / float(heads);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int row = row_of(r), i = row_token(row, inv_heads);
        m_ref[r] = kNegInf;
        l_part[r] = 0.0f;
        visible_end[r] = row < rows_valid ? min(w.kv_end, w.kv_len - w.q_len + i + 1) : w.kv_begin;
    }
    float o_acc[kOBlocks][kSRegs];
#pragma unroll
    for (int b = 0; b < kOBlocks; ++b)
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) o_acc[b][e] = 0.0f;
    const uint64_t q_desc = Wgmma::desc(qs, S::kChunkBytes, Wgmma::kCoreBytes);

    for (int j = 0; j < num_tiles; ++j) {
        const int stage = j % S::kStages, t0 = w.kv_begin + j * N;
        if (S::kProducer) {
            if (j == 0) {
                async_wait<0>();  // Q has landed
                fence_proxy_async();
            }
            barrier_sync(S::full_barrier(stage), S::kThreads);  // tile j is decoded (and Q visible to every thread)
        } else {
            if (j == 0) {
                async_wait<1>();  // tile 0 has landed (tile 1 may not have)
            } else {
                async_wait<0>();  // tile j has landed
            }
            if (Kv::kSwizzled) fence_proxy_async();  // ... and is visible to the wgmmas that read it
            __syncthreads();  // ... for every thread, and every warp is done with tile j - 1's stage
        }

        // S^T; tile j + 1's copies are issued while the first products run.
        float s_acc[kSRegs];
        kv.template wgmma_qk<ROWS>(s_acc, q_desc, S::kStepBytes, stage, [&]() {
            if (!S::kProducer && j > 0) {
                if (j + 1 < num_tiles) kv.issue(p, w, t0 + N, (j + 1) % S::kStages);
                async_commit();
            }
        });

        // Scores in log2 units, masked; rescale when one passes its row's reference.
        bool over = false;
#pragma unroll
        for (int e = 0; e < kSRegs; ++e)  // exact power of two first: no underflow
            s_acc[e] = score_nonfinite_to_nan(s_acc[e] * q_unscale * p.qk_scale);
        if (p.logit_cap > 0.0f)  // one branch a tile, not one a score (docs/performance.md, v25, v26)
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) s_acc[e] = capped_score(s_acc[e], p.logit_cap);
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) {
            const int r = reg_row(e), tok = t0 + 16 * warp + g + 8 * ((e >> 1) & 1);
            const float v = tok < visible_end[r] ? s_acc[e] * kLog2e : kNegInf;
            s_acc[e] = v;
            over |= v > m_ref[r] + kRescaleLog2;
        }
        // P^T (B operand of O^T: tokens along K) of this tile into ps. Its
        // last reader, tile j - 1's P V, completed in every warp (wgmma_pv
        // waits for its products) before this tile's first barrier.
        float p_val[kSRegs];
        auto write_p = [&]() {
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) {
                const int r = reg_row(e), row = row_of(r), tl = 16 * warp + g + 8 * ((e >> 1) & 1);
                const float ref = (m_ref[r] == kNegInf ? 0.0f : m_ref[r]) - kPOffsetLog2;
                p_val[e] = fast_exp2(s_acc[e] - ref);
                *reinterpret_cast<uint16_t *>(ps + (tl / 8) * S::kChunkBytes + (row / 8) * Wgmma::kCoreBytes +
                                              (row % 8) * 16 + (tl % 8) * 2) =
                    uint16_t(Kv::kWgmmaF16 ? pack_f16x2_rn(p_val[e], 0.0f) : pack_bf16x2_rn(p_val[e], 0.0f));
            }
            fence_proxy_async();
        };
        write_p();
        if (S::consumer_sync_or(over)) {
            // Some row's reference moves: this tile's row maxima, by shuffles
            // over the lanes of a row, then over the warps through shared memory.
            float mt[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) mt[r] = kNegInf;
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) mt[reg_row(e)] = fmaxf(mt[reg_row(e)], s_acc[e]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
#pragma unroll
                for (int off = 4; off < 32; off <<= 1) mt[r] = fmaxf(mt[r], MLA_SHFL_XOR(mt[r], off));
                if (g == 0) red[warp * ROWS + row_of(r)] = mt[r];
            }
            S::consumer_sync();
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                float m_new = m_ref[r];
#pragma unroll
                for (int k = 0; k < S::kWarps; ++k) m_new = fmaxf(m_new, red[k * ROWS + row_of(r)]);
                const float alpha = m_ref[r] == kNegInf ? 1.0f : fast_exp2(m_ref[r] - m_new);
                m_ref[r] = m_new;
                l_part[r] *= alpha;
#pragma unroll
                for (int e = 0; e < kSRegs; ++e)
                    if (reg_row(e) == r)
#pragma unroll
                        for (int b = 0; b < kOBlocks; ++b) o_acc[b][e] *= alpha;
            }
            write_p();
            S::consumer_sync();
        }
#pragma unroll
        for (int e = 0; e < kSRegs; ++e) l_part[reg_row(e)] += p_val[e];

        kv.template wgmma_pv<ROWS>(o_acc, Wgmma::desc(ps, S::kChunkBytes, Wgmma::kCoreBytes), S::kStepBytes, stage);
        // The producer may decode tile j + 2 into this buffer (if it waits for it).
        if (S::kProducer && j + S::kStages < num_tiles) barrier_arrive(S::empty_barrier(stage), S::kThreads);
    }
    async_wait<0>();

    // Row sums over the lanes of a row, then over the warps (in warp order:
    // deterministic).
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) l_part[r] += MLA_SHFL_XOR(l_part[r], off);
    }
    S::consumer_sync();  // every warp is done with the stages (O is staged there) and with red
    if (g == 0)
#pragma unroll
        for (int r = 0; r < kRows; ++r) red[warp * ROWS + row_of(r)] = l_part[r];
    S::consumer_sync();
    float *os = reinterpret_cast<float *>(kv.landing);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        float l = 0.0f;
#pragma unroll
        for (int k = 0; k < S::kWarps; ++k) l += red[k * ROWS + row_of(r)];
        // l == 0 only for a row without visible keys; a NaN l (a non-finite
        // key) makes out and lse NaN, never the 0 / -inf of an empty row.
        const float inv = l != 0.0f ? p.v_scale / l : 0.0f;
        if (tid < 4) row_lse[row_of(r)] = l != 0.0f ? (m_ref[r] - kPOffsetLog2 + log2f(l)) * kLn2 : kNegInf;
#pragma unroll
        for (int e = 0; e < kSRegs; ++e)
            if (reg_row(e) == r)
#pragma unroll
                for (int b = 0; b < kOBlocks; ++b)
                    os[row_of(r) * S::kOLd + Kv::wgmma_pv_dim(b, warp, lane, e)] = o_acc[b][e] * inv;
    }
    S::consumer_sync();

    // Epilogue: bf16 out + lse, or the float partial + lse. Thread tid
    // writes dims 4 tid..4 tid + 3 of every row, so the loop over the rows
    // has constant offsets and no division (a loop over (row, dims)
    // units took ~250 instructions a warp: docs/performance.md, v27).
    static_assert(MLA_HEAD_DIM_V / 4 == S::kConsumerThreads, "a thread's 4 dims of every row");
    float *slot = w.partial_slot >= 0 ? p.partials + int64_t(w.partial_slot) * p.slot_floats : nullptr;
    const int c = 4 * tid;
    if (slot) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            if (r < rows_valid)
                *reinterpret_cast<float4 *>(slot + r * MLA_HEAD_DIM_V + c) =
                    *reinterpret_cast<const float4 *>(os + r * S::kOLd + c);
    } else {
        int tok = w.q_begin, h = h0;  // of row r
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r >= rows_valid) break;
            const float4 v = *reinterpret_cast<const float4 *>(os + r * S::kOLd + c);
            uint16_t *o = p.out + (int64_t(tok) * p.num_heads + h) * MLA_HEAD_DIM_V + c;
            *reinterpret_cast<uint2 *>(o) = make_uint2(pack_bf16x2_rn(v.x, v.y), pack_bf16x2_rn(v.z, v.w));
            if (++h == h0 + heads) h = h0, ++tok;
        }
    }
    if (tid < rows_valid) {
        const float lse = row_lse[tid];
        if (slot) {
            slot[ROWS * MLA_HEAD_DIM_V + tid] = lse;
        } else if (p.lse) {
            const int qt = row_token(tid, inv_heads), tok = w.q_begin + qt, h = h0 + tid - qt * heads;
            p.lse[int64_t(tok) * p.num_heads + h] = lse;
        }
    }
}

}  // namespace gpu
}  // namespace mla
