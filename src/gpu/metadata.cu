// The scheduler of schedule.h run on the device, from device-resident
// indptr arrays, by one CTA: no host synchronisation, so it can be captured
// in a graph together with the layers' execute calls.
#include <limits.h>

#include "kernels.h"

namespace mla {
namespace gpu {
namespace {

// Threads of the one CTA: a thread per sequence up to kMaxMetaThreads (more
// sequences a thread beyond), at least kMinMetaThreads so that a warp per
// sequence can write the items of a small batch. Sized to the batch
// because every pass ends in a CTA-wide barrier, which 32 warps wait on
// longer than 8.
constexpr int kMaxMetaThreads = 1024, kMinMetaThreads = 128;
constexpr int kMaxMetaWarps = kMaxMetaThreads / MLA_WARP_SIZE;
// Sequences whose schedule the passes keep in shared memory (the rest go
// through global memory): each pass would otherwise wait for a global load
// of what the previous one wrote, and the item pass for one per sequence.
constexpr int kCachedSeqs = 1024;

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

// Sum across the CTA, to every thread, through one slot per warp (a 64-bit
// shared atomicAdd is a compare-and-swap loop the warps contend on). One
// barrier; `slots` must not be written again before another one.
template <class T>
__device__ T cta_sum(T v, T *slots) {
    v = warp_sum(v);
    if (threadIdx.x % MLA_WARP_SIZE == 0) slots[threadIdx.x / MLA_WARP_SIZE] = v;
    __syncthreads();
    T total = 0;
    for (int w = 0; w < int(blockDim.x) / MLA_WARP_SIZE; ++w) total += slots[w];
    return total;
}

// Exclusive prefix sums of a[0, count) in shared memory, in place, by one
// warp (consecutive runs a lane); returns the total to every lane.
__device__ int warp_exclusive_scan_in_place(int *a, int count) {
    const int lane = threadIdx.x % MLA_WARP_SIZE;
    const int per = (count + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE;
    const int begin = min(count, lane * per), end = min(count, begin + per);
    int sum = 0;
    for (int i = begin; i < end; ++i) sum += a[i];
    int inclusive = sum;
    for (int off = 1; off < MLA_WARP_SIZE; off <<= 1) {
        const int x = MLA_SHFL_UP(inclusive, off);
        if (lane >= off) inclusive += x;
    }
    for (int i = begin, run = inclusive - sum; i < end; ++i) {
        const int v = a[i];
        a[i] = run;
        run += v;
    }
    return MLA_SHFL(inclusive, MLA_WARP_SIZE - 1);
}

__global__ void __launch_bounds__(kMaxMetaThreads) metadata_kernel(const MetadataParams p) {
    const ScheduleGeometry &g = p.geometry;
    const int n = p.batch_size, tid = threadIdx.x, warps = int(blockDim.x) / MLA_WARP_SIZE;
    const int lane = tid % MLA_WARP_SIZE, warp = tid / MLA_WARP_SIZE;
    __shared__ unsigned long long warp_blocks[kMaxMetaWarps];  // KV blocks of each warp's sequences
    __shared__ int warp_items[2][kMaxMetaWarps];                // items of each warp's sequences, a pass each
    // Items of each (size class, warp), class-major, then partial slots of
    // each warp: counts, then their exclusive sums.
    __shared__ int placement[(kItemClasses + 1) * kMaxMetaWarps];
    __shared__ int total_partials;
    __shared__ int first_error;  // (sequence + 1) * 8 + error of the first bad sequence
    __shared__ int max_splits;
    __shared__ int total_q;
    __shared__ SeqSchedule cached[kCachedSeqs];
    __shared__ unsigned char cached_class[kCachedSeqs];  // item_class of the cached sequences
    // A sequence's schedule is copied in and out whole (16-byte words; a
    // reference into either memory made every access a generic one, and
    // every work item's store forced the fields to be loaded again).
    auto load_seq = [&](int b) {
        SeqSchedule s;
        if (b < kCachedSeqs) s = cached[b];
        else s = p.seqs[b];
        return s;
    };
    auto store_seq = [&](int b, const SeqSchedule &s) {
        if (b < kCachedSeqs) cached[b] = s;
        else p.seqs[b] = s;
    };
    for (int i = tid; i < (kItemClasses + 1) * warps; i += blockDim.x) placement[i] = 0;
    if (tid == 0) {
        first_error = INT_MAX;
        max_splits = 0;
        total_q = 0;  // the last sequence's thread sets it
    }
    __syncthreads();
    // indptr[0] is checked by sequence 0's thread, in its loads (a check
    // of its own before the barrier above made every thread wait for it).
    auto check_first_indptr = [&](int q0, int p0) {
        if (q0 != 0) atomicMin(&first_error, int(SCHED_BAD_QO_INDPTR));  // (sequence -1)
        else if (p0 != 0) atomicMin(&first_error, int(SCHED_BAD_KV_INDPTR));
    };
    if (n == 0 && tid == 0) {
        total_q = p.qo_indptr[0];
        check_first_indptr(p.qo_indptr[0], p.kv_indptr[0]);
    }

    // Each thread owns a contiguous range of sequences.
    const int b_begin = min(n, tid * p.seqs_per_thread), b_end = min(n, b_begin + p.seqs_per_thread);
    unsigned long long blocks = 0;
    for (int b = b_begin; b < b_end; ++b) {
        const int q0 = p.qo_indptr[b], q1 = p.qo_indptr[b + 1];
        const int p0 = p.kv_indptr[b], p1 = p.kv_indptr[b + 1];
        const int last = p.kv_last_page_len ? p.kv_last_page_len[b] : g.page_size;
        const int err = check_sequence(q0, q1, p0, p1, last, g);
        if (b == 0) check_first_indptr(q0, p0);
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
        s.chunk_blocks = 0;
        store_seq(b, s);
        if (err == SCHED_OK && s.q_len > 0) blocks += seq_blocks(s.kv_len);
    }
    const unsigned long long total_blocks = cta_sum(blocks, warp_blocks);

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

    // Splits at the balanced target; in balanced mode a second pass at the
    // refined target where refined_target_blocks moves it (schedule.cpp: the
    // same steps). A pass needs only the item total.
    int target = g.mode == SPLIT_BALANCED ? balanced_target_blocks((long long)total_blocks, g) : 0;
    int total_items = 0, local_max;
    for (int pass = 0;; ++pass) {
        int items = 0;
        local_max = 0;
        for (int b = b_begin; b < b_end; ++b) {
            SeqSchedule s = load_seq(b);
            const SeqSplit split = seq_split(s.q_len, seq_blocks(s.kv_len), target, g);
            s.splits = split.splits;
            s.chunk_blocks = split.chunk_blocks;
            store_seq(b, s);
            items += s.splits * g.head_blocks;
            local_max = max(local_max, s.splits);
        }
        total_items = cta_sum(items, warp_items[pass]);
        const int refined = pass == 0 && g.mode == SPLIT_BALANCED ? refined_target_blocks(target, total_items, n, g) : target;
        if (refined == target) break;
        target = refined;
    }
    local_max = warp_max(local_max);
    if (lane == 0) atomicMax(&max_splits, local_max);
    const bool fits = total_items <= g.max_items;

    // Placement: items class by class (schedule.h), partial slots in one
    // range of their own. Each sequence takes its offset within its (class,
    // warp) counter by a shared atomic; one warp then turns the counters,
    // class-major, into exclusive sums. The order of a warp's sequences
    // inside a class follows the atomics' order, which changes no result
    // (where an item or a partial sits is only an address), and costs one
    // scan where a scan per class cost one per counter. Where a warp's
    // sequences all have the same class and splits (a uniform batch), its
    // first lane takes them all in one atomic: 32 lanes' atomics on one
    // address serialise (with one atomic a lane, the kernel measured 0.9 us
    // slower than with the scan it replaced at batch 256: performance.md v19).
    int *const partial_counts = placement + kItemClasses * warps;
    for (int i = 0; fits && i < p.seqs_per_thread; ++i) {  // the same trip count in every lane
        // A thread's sequences are consecutive, so a warp's active lanes
        // are its first ones.
        const int b = b_begin + i;
        const bool active = b < b_end;
        SeqSchedule s{};
        int cls = 0;
        if (active) {
            s = load_seq(b);
            cls = item_class({s.splits, s.chunk_blocks}, target);
            if (b < kCachedSeqs) cached_class[b] = (unsigned char)cls;
        }
        const int items = s.splits * g.head_blocks;
        const int cls0 = MLA_SHFL(cls, 0), splits0 = MLA_SHFL(s.splits, 0);
        // The active lanes (low half) and those unlike the first (high
        // half) in one reduction.
        const int counts = warp_sum(int(active) | int(active && (cls != cls0 || s.splits != splits0)) << 16);
        const int count = counts & 0xffff;
        if ((counts >> 16) == 0) {
            int first = 0, partial = 0;
            if (lane == 0 && count > 0) {
                first = atomicAdd(&placement[cls * warps + warp], count * items);
                if (s.splits > 1) partial = atomicAdd(&partial_counts[warp], count * items);
            }
            first = MLA_SHFL(first, 0);  // (every lane shuffles: the branch is warp-uniform)
            partial = MLA_SHFL(partial, 0);
            s.item_first = first + lane * items;
            s.partial_first = s.splits > 1 ? partial + lane * items : -1;
        } else if (active) {
            s.item_first = atomicAdd(&placement[cls * warps + warp], items);
            s.partial_first = s.splits > 1 ? atomicAdd(&partial_counts[warp], items) : -1;
        }
        if (active) store_seq(b, s);
    }
    __syncthreads();
    // One scan over the item counters and, after them, the partial-slot
    // counters: the latter's sums then start at the item total.
    if (warp == 0) {
        const int total = warp_exclusive_scan_in_place(placement, (kItemClasses + 1) * warps);
        if (lane == 0) total_partials = total - total_items;
    }
    __syncthreads();
    for (int b = b_begin; b < b_end; ++b) {
        SeqSchedule s = load_seq(b);
        if (fits) {
            const int cls = b < kCachedSeqs ? cached_class[b] : item_class({s.splits, s.chunk_blocks}, target);
            s.item_first += placement[cls * warps + warp];
            if (s.splits > 1) s.partial_first += partial_counts[warp] - total_items;
        }
        if (b < kCachedSeqs) cached[b] = s;
        p.seqs[b] = s;
    }
    __syncthreads();  // every sequence's schedule is final
    // The items: up to `warps` sequences a warp each, its lanes over the
    // sequence's items; more sequences a thread each (item_first follows the
    // size classes, not the sequence order, so no search over it).
    if (fits && n <= warps) {
        const int b = tid / MLA_WARP_SIZE;
        if (b < n) {
            const SeqSchedule s = load_seq(b);
            for (int j = lane; j < s.splits * g.head_blocks; j += MLA_WARP_SIZE)
                p.items[s.item_first + j] = make_item(b, s, j / s.splits, j % s.splits);
        }
    } else if (fits) {
        for (int b = b_begin; b < b_end; ++b) {
            const SeqSchedule s = load_seq(b);
            emit_items(b, s, g, p.items);
        }
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
    int threads = (p.batch_size + MLA_WARP_SIZE - 1) / MLA_WARP_SIZE * MLA_WARP_SIZE;
    threads = threads < kMinMetaThreads ? kMinMetaThreads : threads > kMaxMetaThreads ? kMaxMetaThreads : threads;
    MetadataParams launch = p;
    launch.seqs_per_thread = (p.batch_size + threads - 1) / threads;
    MLA_LAUNCH(metadata_kernel, 1, threads, 0, stream)(launch);
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
