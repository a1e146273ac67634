// Split-KV work partitioning: one algorithm, run by the host (CPU plans and
// GPU plans fed host arrays) and by the metadata kernel (GPU plans fed device
// arrays). Everything here is plain arithmetic on lengths so both compilers
// build the same code.
//
// Vocabulary
//   sequence   one entry of the batch: q_len query tokens, kv_len cached tokens.
//   head block the query heads are cut into head_blocks groups of
//              heads_per_block so one work item's rows (q_len x heads) fit in
//              rows_per_item, the kernel's row tile.
//   block      kScheduleBlockTokens consecutive KV tokens: the unit of splitting.
//   work item  (sequence, head block, KV token range). Items of a sequence
//              that is split write normalised partial outputs + LSE into a
//              workspace slot; the combine step merges them in split order.
#pragma once

#include <stdint.h>

#include "hd.h"
#include "mla.h"

namespace mla {

enum SplitMode : int32_t {
    SPLIT_BALANCED = 0,       // split count from the batch's total work (default)
    SPLIT_DETERMINISTIC = 1,  // split count from the sequence's own length only
    SPLIT_FORCED = 2,         // split count given by the caller
};

// Static scheduling parameters of a plan (fixed at mla_plan_create).
struct ScheduleGeometry {
    int32_t num_heads;
    int32_t max_q_len;
    int32_t max_batch;
    int32_t page_size;
    int32_t rows_per_item;    // kernel row tile: 16, 32 or 64
    int32_t heads_per_block;  // heads of one item
    int32_t head_blocks;      // ceil(num_heads / heads_per_block)
    int32_t workers;          // parallel workers to balance for (GPU: CTAs in flight)
    int32_t mode;             // SplitMode
    int32_t forced_splits;    // SPLIT_FORCED: splits per sequence
    int32_t min_split_blocks; // SPLIT_BALANCED: no split smaller than this
    int32_t det_chunk_blocks; // SPLIT_DETERMINISTIC: blocks per split ...
    int32_t det_max_splits;   // ... but at most this many splits
    int32_t max_items;        // bound on work items of any batch (sizes buffers)
};

// Per-sequence result of scheduling. (16-byte aligned, as WorkItem: the
// device scheduler and the kernels move both in 16-byte words.)
struct alignas(16) SeqSchedule {
    int32_t q_begin;        // first query token (row of q / out)
    int32_t q_len;
    int32_t kv_len;
    int32_t page_begin;     // kv_indptr[b]
    int32_t splits;         // KV splits (same for every head block); 0 if q_len == 0
    int32_t item_first;     // first work item; items are [head_block][split], sequences by item_class
    int32_t partial_first;  // first workspace slot, -1 when not split
    int32_t chunk_blocks;   // blocks of each split (the last may have fewer); 0 if q_len == 0
};

// One unit of kernel work.
struct alignas(16) WorkItem {
    int32_t seq;
    int32_t head_block;
    int32_t kv_begin;       // first KV token of this item
    int32_t kv_end;         // one past the last
    int32_t partial_slot;   // workspace slot, -1: write out/lse directly
    int32_t q_begin;
    int32_t q_len;
    int32_t kv_len;         // the sequence's whole length (for the causal mask)
    int32_t page_begin;
    int32_t reserved[3];
};

// Totals of one schedule (first element of the device metadata buffer).
struct ScheduleSummary {
    int32_t num_items;
    int32_t num_partials;
    int32_t target_blocks;
    int32_t max_splits;
    int32_t total_q;
    int32_t error;        // ScheduleError of the first bad sequence (device path)
    int32_t error_seq;
    int32_t error_value;
    int32_t batch_size;
    int32_t reserved[3];
};

enum ScheduleError : int32_t {
    SCHED_OK = 0,
    SCHED_BAD_QO_INDPTR = 1,
    SCHED_BAD_KV_INDPTR = 2,
    SCHED_BAD_LAST_PAGE_LEN = 3,
    SCHED_Q_LEN_LIMIT = 4,
};

// Tokens of a sequence with `pages` pages whose last page holds `last_len`.
MLA_HD int64_t seq_kv_len(int32_t pages, int32_t last_len, int32_t page_size) {
    return pages == 0 ? 0 : int64_t(pages - 1) * page_size + last_len;
}

// Check one sequence's lengths; the same predicate on host and device.
MLA_HD int32_t check_sequence(int32_t q_begin, int32_t q_end, int32_t page_begin, int32_t page_end,
                              int32_t last_len, const ScheduleGeometry &g) {
    if (q_end < q_begin) return SCHED_BAD_QO_INDPTR;
    if (q_end - q_begin > g.max_q_len) return SCHED_Q_LEN_LIMIT;
    if (page_end < page_begin) return SCHED_BAD_KV_INDPTR;
    if (page_end > page_begin && (last_len < 1 || last_len > g.page_size)) return SCHED_BAD_LAST_PAGE_LEN;
    if (seq_kv_len(page_end - page_begin, last_len, g.page_size) > INT32_MAX) return SCHED_BAD_KV_INDPTR;
    return SCHED_OK;
}

MLA_HD int32_t ceil_div(int64_t a, int64_t b) { return int32_t((a + b - 1) / b); }
// The same for 32-bit operands (b > 0) without a 64-bit division, which the
// GPU runs as a long subroutine (the device scheduler does several per item).
MLA_HD int32_t ceil_div(int32_t a, int32_t b) {
    return a > 0 ? (a - 1) / b + 1 : ceil_div(int64_t(a), int64_t(b));
}

// KV tokens per scheduling block; equal to the GPU kernel's KV tile so split
// boundaries always fall on tile boundaries. A power of two: the device
// scheduler divides by it with a shift.
constexpr int32_t kBlockTokensLog2 = 6;
constexpr int32_t kScheduleBlockTokens = 1 << kBlockTokensLog2;

MLA_HD int32_t seq_blocks(int32_t kv_len) { return kv_len > 0 ? ((kv_len - 1) >> kBlockTokensLog2) + 1 : 0; }

// Balanced mode: KV blocks per item so the whole batch fills `workers`.
MLA_HD int32_t balanced_target_blocks(int64_t total_blocks, const ScheduleGeometry &g) {
    const int64_t per_worker = (total_blocks * g.head_blocks + g.workers - 1) / g.workers;
    return per_worker > g.min_split_blocks ? int32_t(per_worker) : g.min_split_blocks;
}

// Balanced mode, once the items at `target` are counted: between one and
// one and a half waves of workers (a ragged batch, whose short sequences
// add items), the short last wave of target-sized items sets the time;
// items of half the size, issued largest class first, even it out. From
// 1.5 waves on the greedy order already does, and items under
// kMinRefinedBlocks (1024 tokens) cost more in their fixed prologue,
// epilogue, partial and combine than the balance gains: halving to 9
// blocks made ragged fp8 B256 x 1k 5-10% slower, while halving to 16 or
// 32 makes the 8k batches of 64 5-22% faster (docs/performance.md, v10
// and v26). Halving also splits the sequences that ran whole at the
// target, each then paying a partial and a combine row: only where the
// items are already at least two a sequence row (a row: one of the
// `sequences` x head blocks) are most of them split anyway. Ragged fp8 B256 x 8k (1.5 items
// a row) runs 2% faster unhalved (v27); the batches of 64 at 8k (2.5-4.6
// a row) stay 5-22% faster halved (v26).
constexpr int32_t kMinRefinedBlocks = 16;
MLA_HD int32_t refined_target_blocks(int32_t target, int64_t items, int32_t sequences, const ScheduleGeometry &g) {
    const int32_t half = (target + 1) / 2;  // target / half <= 2: max_work_items' bound
    const bool partial_wave = items > g.workers && 2 * items < 3 * int64_t(g.workers);
    const bool mostly_split = items >= 2 * int64_t(sequences) * g.head_blocks;
    return partial_wave && mostly_split && half >= kMinRefinedBlocks && half >= g.min_split_blocks ? half : target;
}

// Balanced mode splits a sequence at most this often: at batch 4 x 8k, 32
// splits were faster than 64 in bf16 (26.4 against 33.7 us) and E4M3 (24.1
// against 26.4) on an H100, though 64 fill more of the resident CTAs: an
// item of 2 blocks is mostly fixed cost, and 64 partials a row deepen the
// combine (docs/performance.md, v13 and v23).
constexpr int32_t kBalancedMaxSplits = 32;
static_assert(kBalancedMaxSplits <= MLA_MAX_SPLITS, "the combine holds MLA_MAX_SPLITS weights a row");

// How a sequence of `blocks` blocks is split: `splits` items of
// `chunk_blocks` blocks each (the last may have fewer); never an empty split.
struct SeqSplit {
    int32_t splits, chunk_blocks;
};
MLA_HD SeqSplit seq_split(int32_t q_len, int32_t blocks, int32_t target_blocks, const ScheduleGeometry &g) {
    if (q_len == 0) return {0, 0};
    if (blocks <= 1) return {1, blocks};
    int32_t s;
    if (g.mode == SPLIT_FORCED) {
        s = g.forced_splits;
    } else if (g.mode == SPLIT_DETERMINISTIC) {
        s = ceil_div(blocks, g.det_chunk_blocks);
        if (s > g.det_max_splits) s = g.det_max_splits;
    } else {
        // An item may take up to a tenth more than the target before the
        // sequence is split once more: a split costs a partial write and the
        // combine (e.g. 128 blocks at a target of 125 stay one item).
        s = ceil_div(blocks - target_blocks / 10, target_blocks);
        if (s > kBalancedMaxSplits) s = kBalancedMaxSplits;
    }
    if (s > blocks) s = blocks;
    if (s < 1) s = 1;
    const int32_t chunk = ceil_div(blocks, s);
    return {ceil_div(blocks, chunk), chunk};  // drop splits that chunking left empty
}

// Token range of split k of a sequence whose splits have chunk_blocks blocks.
MLA_HD void split_range(int32_t k, int32_t chunk_blocks, int32_t kv_len, int32_t *begin, int32_t *end) {
    const int64_t b = int64_t(k) * chunk_blocks * kScheduleBlockTokens;
    const int64_t e = b + int64_t(chunk_blocks) * kScheduleBlockTokens;
    *begin = int32_t(b < kv_len ? b : kv_len);
    *end = int32_t(e < kv_len ? e : kv_len);
}

// Size class of a sequence's items (balanced mode; 0 otherwise): k for
// items of (15 - k)/16 to (16 - k)/16 of the target (0 also for larger
// ones, 15 for any smaller). Items are laid out class by class, so the CTAs
// start them longest first (the hardware starts CTAs in index order as
// others finish: a greedy longest-first schedule), the long items of a
// ragged batch in the first wave and the short ones filling the gaps. Four
// classes (quarters) left a quarter of the items in sequence order at the
// end, where one of them finishing last set the step's time
// (docs/performance.md v19). Where items sit does not change any result:
// the combine merges a sequence's splits in split order.
constexpr int kItemClasses = 16;
MLA_HD int32_t item_class(const SeqSplit &split, int32_t target_blocks) {
    if (target_blocks <= 0 || split.splits <= 0) return 0;
    const int64_t chunk16 = int64_t(split.chunk_blocks) * kItemClasses, t = target_blocks;
    int32_t k = 0;  // the largest k in [0, 15] with chunk < (16 - k)/16 of the target (binary search)
    for (int32_t step = kItemClasses / 2; step > 0; step >>= 1)
        if (chunk16 < (kItemClasses - k - step) * t) k += step;
    return k;
}

// Work item (head block hb, split k) of a sequence; its index is
// s.item_first + hb * s.splits + k.
MLA_HD WorkItem make_item(int32_t seq, const SeqSchedule &s, int32_t hb, int32_t k) {
    WorkItem w;
    w.seq = seq;
    w.head_block = hb;
    split_range(k, s.chunk_blocks, s.kv_len, &w.kv_begin, &w.kv_end);
    w.partial_slot = s.splits > 1 ? s.partial_first + hb * s.splits + k : -1;
    w.q_begin = s.q_begin;
    w.q_len = s.q_len;
    w.kv_len = s.kv_len;
    w.page_begin = s.page_begin;
    w.reserved[0] = w.reserved[1] = w.reserved[2] = 0;
    return w;
}

// Work items of one sequence, written at items[s.item_first ...].
MLA_HD void emit_items(int32_t seq, const SeqSchedule &s, const ScheduleGeometry &g, WorkItem *items) {
    for (int32_t hb = 0; hb < g.head_blocks; ++hb)
        for (int32_t k = 0; k < s.splits; ++k) items[s.item_first + hb * s.splits + k] = make_item(seq, s, hb, k);
}

// Upper bound of work items for any batch of this plan.
MLA_HD int32_t max_work_items(const ScheduleGeometry &g) {
    const int64_t seq_items = int64_t(g.max_batch) * g.head_blocks;
    int64_t n;
    if (g.mode == SPLIT_FORCED) n = seq_items * g.forced_splits;
    else if (g.mode == SPLIT_DETERMINISTIC) n = seq_items * g.det_max_splits;
    else {
        // The sum of ceil(blocks / target) is at most 2 workers + sequences,
        // and no sequence splits more often than the cap: a plan for a few
        // sequences then launches fewer idle CTAs where its grid is the
        // bound (graphs, device-built steps).
        n = seq_items + 2 * int64_t(g.workers);
        if (n > seq_items * kBalancedMaxSplits) n = seq_items * kBalancedMaxSplits;
    }
    return int32_t(n < INT32_MAX ? n : INT32_MAX);
}

}  // namespace mla
