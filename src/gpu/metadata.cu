// The scheduler of schedule.h run on the device, from device-resident
// indptr arrays, by one CTA: no host synchronisation, so it can be captured
// in a graph together with the layers' execute calls.
#include <limits.h>

#include "kernels.h"

namespace mla {
namespace gpu {
namespace {

constexpr int kMetaThreads = 1024;

constexpr int kMetaWarps = kMetaThreads / MLA_WARP_SIZE;
// Sequences whose schedule the passes keep in shared memory (the rest go
// through global memory): each pass would otherwise wait for a global load
// of what the previous one wrote, and the item pass for one per sequence.
constexpr int kCachedSeqs = 1024;
static_assert(kMetaWarps <= MLA_WARP_SIZE, "one warp scans the warp totals");

// Inclusive prefix sums of two values across a warp.
__device__ int2 warp_inclusive_scan2(int2 v) {
    const int lane = threadIdx.x % MLA_WARP_SIZE;
    for (int off = 1; off < MLA_WARP_SIZE; off <<= 1) {
        const int x = MLA_SHFL_UP(v.x, off), y = MLA_SHFL_UP(v.y, off);
        if (lane >= off) {
            v.x += x;
            v.y += y;
        }
    }
    return v;
}

// Sum and maximum across a warp (every lane gets them).
template <class T>
__device__ T warp_sum(T v) {
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) v += MLA_SHFL_XOR(v, off);
    return v;
}
__device__ int warp_max(int v) {
    for (int off = MLA_WARP_SIZE / 2; off > 0; off >>= 1) v = max(v, MLA_SHFL_XOR(v, off));
    return v;
}

// Exclusive prefix sums over the CTA of two values per thread (warp scans,
// then a scan of the warp totals); *total gets the sums. Two barriers.
__device__ int2 block_exclusive_scan2(int2 value, int2 *warp_sums, int2 *total) {
    const int lane = threadIdx.x % MLA_WARP_SIZE, warp = threadIdx.x / MLA_WARP_SIZE;
    const int2 inclusive = warp_inclusive_scan2(value);
    if (lane == MLA_WARP_SIZE - 1) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const int2 w = warp_inclusive_scan2(lane < kMetaWarps ? warp_sums[lane] : make_int2(0, 0));
        if (lane < kMetaWarps) warp_sums[lane] = w;
    }
    __syncthreads();
    const int2 base = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
    *total = warp_sums[kMetaWarps - 1];
    return make_int2(base.x + inclusive.x - value.x, base.y + inclusive.y - value.y);
}

__global__ void __launch_bounds__(kMetaThreads) metadata_kernel(const MetadataParams p) {
    const ScheduleGeometry &g = p.geometry;
    const int n = p.batch_size, tid = threadIdx.x;
    __shared__ int2 warp_sums[kMetaWarps];
    __shared__ unsigned long long total_blocks;
    __shared__ int first_error;  // (sequence + 1) * 8 + error of the first bad sequence
    __shared__ int max_splits;
    __shared__ int total_q;
    __shared__ SeqSchedule cached[kCachedSeqs];
    auto sched = [&](int b) -> SeqSchedule & { return b < kCachedSeqs ? cached[b] : p.seqs[b]; };
    if (tid == 0) {
        total_blocks = 0;
        first_error = INT_MAX;
        max_splits = 0;
        total_q = p.qo_indptr[0];  // n == 0; else the last sequence's thread sets it
        if (p.qo_indptr[0] != 0) first_error = SCHED_BAD_QO_INDPTR;
        else if (p.kv_indptr[0] != 0) first_error = SCHED_BAD_KV_INDPTR;
    }
    __syncthreads();

    // Each thread owns a contiguous range of sequences.
    const int per = (n + kMetaThreads - 1) / kMetaThreads;
    const int b_begin = min(n, tid * per), b_end = min(n, b_begin + per);
    unsigned long long blocks = 0;
    for (int b = b_begin; b < b_end; ++b) {
        const int q0 = p.qo_indptr[b], q1 = p.qo_indptr[b + 1];
        const int p0 = p.kv_indptr[b], p1 = p.kv_indptr[b + 1];
        const int last = p.kv_last_page_len ? p.kv_last_page_len[b] : g.page_size;
        const int err = check_sequence(q0, q1, p0, p1, last, g);
        if (err != SCHED_OK) atomicMin(&first_error, (b + 1) * 8 + err);
        if (b == n - 1) total_q = q1;
        SeqSchedule s;
        s.q_begin = q0;
        s.q_len = q1 - q0;
        s.kv_len = err == SCHED_OK ? int32_t(seq_kv_len(p1 - p0, last, g.page_size)) : 0;
        s.page_begin = p0;
        s.splits = 0;
        s.item_first = 0;
        s.partial_first = -1;
        s.reserved = 0;
        sched(b) = s;
        if (err == SCHED_OK && s.q_len > 0) blocks += seq_blocks(s.kv_len, g);
    }
    const int lane = tid % MLA_WARP_SIZE;
    // One shared atomic per warp: 1024 contending ones serialise.
    blocks = warp_sum(blocks);
    if (lane == 0) atomicAdd(&total_blocks, blocks);
    __syncthreads();

    if (first_error != INT_MAX) {
        for (int b = b_begin; b < min(b_end, kCachedSeqs); ++b) p.seqs[b] = cached[b];
        if (tid == 0) {
            ScheduleSummary sum{};
            const int b = first_error / 8 - 1;
            sum.error = first_error % 8;
            sum.error_seq = b < 0 ? 0 : b;
            if (b < 0) sum.error_value = sum.error == SCHED_BAD_QO_INDPTR ? p.qo_indptr[0] : p.kv_indptr[0];
            else if (sum.error == SCHED_BAD_QO_INDPTR) sum.error_value = p.qo_indptr[b + 1];
            else if (sum.error == SCHED_Q_LEN_LIMIT) sum.error_value = p.qo_indptr[b + 1] - p.qo_indptr[b];
            else if (sum.error == SCHED_BAD_KV_INDPTR) sum.error_value = p.kv_indptr[b + 1];
            else sum.error_value = p.kv_last_page_len ? p.kv_last_page_len[b] : g.page_size;
            if (sum.error == SCHED_BAD_QO_INDPTR || sum.error == SCHED_BAD_KV_INDPTR) sum.error_seq = b + 1;
            sum.batch_size = 0;  // nothing runs on a bad batch
            *p.summary = sum;
        }
        return;
    }

    const int target = g.mode == SPLIT_BALANCED ? balanced_target_blocks((long long)total_blocks, g) : 0;
    int items = 0, partials = 0, local_max = 0;
    for (int b = b_begin; b < b_end; ++b) {
        SeqSchedule &s = sched(b);
        s.splits = seq_splits(s.q_len, seq_blocks(s.kv_len, g), target, g);
        items += s.splits * g.head_blocks;
        if (s.splits > 1) partials += s.splits * g.head_blocks;
        local_max = max(local_max, s.splits);
    }
    local_max = warp_max(local_max);
    if (lane == 0) atomicMax(&max_splits, local_max);
    int2 totals;
    const int2 cursors = block_exclusive_scan2(make_int2(items, partials), warp_sums, &totals);
    const int total_items = totals.x, total_partials = totals.y;
    const bool fits = total_items <= g.max_items;
    int item_cursor = cursors.x, partial_cursor = cursors.y;
    for (int b = b_begin; b < b_end; ++b) {
        SeqSchedule &s = sched(b);
        if (fits) {
            s.item_first = item_cursor;
            s.partial_first = s.splits > 1 ? partial_cursor : -1;
            item_cursor += s.splits * g.head_blocks;
            if (s.splits > 1) partial_cursor += s.splits * g.head_blocks;
        }
        if (b < kCachedSeqs) p.seqs[b] = s;
    }
    __syncthreads();  // every sequence's schedule is final
    // The items, a thread each. An item's sequence is the last one whose
    // item_first is <= the item (sequences without items share item_first
    // with the next, so the search never lands on one).
    for (int i = tid; fits && i < total_items; i += kMetaThreads) {
        int lo = 0, hi = n - 1;  // item_first(lo) <= i
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (sched(mid).item_first <= i) lo = mid;
            else hi = mid - 1;
        }
        const SeqSchedule s = sched(lo);
        const int j = i - s.item_first;
        p.items[i] = make_item(lo, s, g, j / s.splits, j % s.splits);
    }
    if (tid == 0) {
        ScheduleSummary sum{};
        sum.num_items = fits ? total_items : 0;
        sum.num_partials = fits ? total_partials : 0;
        sum.target_blocks = target;
        sum.max_splits = max_splits;
        sum.total_q = total_q;
        sum.batch_size = fits ? n : 0;
        sum.error = fits ? SCHED_OK : SCHED_BAD_KV_INDPTR;
        *p.summary = sum;
    }
}

__global__ void validate_pages_kernel(const ScheduleSummary *summary, const WorkItem *items, const int32_t *kv_indices,
                                      int32_t page_shift, int64_t num_pages, int32_t *bad) {
    if (int(blockIdx.x) >= summary->num_items) return;
    const WorkItem w = items[blockIdx.x];
    if (w.kv_end <= w.kv_begin) return;
    const int first = w.page_begin + (w.kv_begin >> page_shift);
    const int last = w.page_begin + ((w.kv_end - 1) >> page_shift);
    for (int slot = first + int(threadIdx.x); slot <= last; slot += blockDim.x) {
        const int64_t page = kv_indices ? kv_indices[slot] : slot;
        if (page < 0 || (num_pages > 0 && page >= num_pages)) {
            if (atomicCAS(&bad[0], 0, 1) == 0) {
                bad[1] = int32_t(page);
                bad[2] = w.seq;
                bad[3] = slot;
            }
        }
    }
}

}  // namespace

hipError_t launch_metadata(const MetadataParams &p, hipStream_t stream) {
    MLA_LAUNCH(metadata_kernel, 1, kMetaThreads, 0, stream)(p);
    return hipGetLastError();
}

hipError_t launch_validate_pages(const ScheduleSummary *summary, const WorkItem *items, const int32_t *kv_indices,
                                 int32_t page_shift, int64_t num_pages, int32_t max_items, int32_t *bad,
                                 hipStream_t stream) {
    MLA_LAUNCH(validate_pages_kernel, max_items, 128, 0, stream)(summary, items, kv_indices, page_shift, num_pages, bad);
    return hipGetLastError();
}

}  // namespace gpu
}  // namespace mla
