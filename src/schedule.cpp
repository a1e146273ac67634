#include "schedule_host.h"

#include "errors.h"

namespace mla {

ScheduleGeometry make_geometry(const PlanConfig &cfg, int32_t workers, int32_t min_split_blocks, int32_t max_rows) {
    ScheduleGeometry g{};
    g.num_heads = cfg.num_heads;
    g.max_q_len = cfg.max_q_len;
    g.max_batch = cfg.max_batch_size;
    g.page_size = cfg.page_size;
    const int32_t rows = cfg.num_heads * cfg.max_q_len;
    g.rows_per_item = rows <= 16 || max_rows <= 16 ? 16 : rows <= 32 || max_rows <= 32 ? 32 : 64;
    g.heads_per_block = g.rows_per_item / cfg.max_q_len;
    if (g.heads_per_block > cfg.num_heads) g.heads_per_block = cfg.num_heads;
    g.head_blocks = ceil_div(cfg.num_heads, g.heads_per_block);
    g.workers = workers > 0 ? workers : 1;
    if (cfg.num_splits > 0) {
        g.mode = SPLIT_FORCED;
        g.forced_splits = cfg.num_splits;
    } else if (cfg.flags & MLA_FLAG_DETERMINISTIC) {
        g.mode = SPLIT_DETERMINISTIC;
    } else {
        g.mode = SPLIT_BALANCED;
    }
    g.min_split_blocks = min_split_blocks > 0 ? min_split_blocks : 1;
    g.det_chunk_blocks = kDeterministicChunkBlocks;
    g.det_max_splits = kDeterministicMaxSplits;
    g.max_items = max_work_items(g);
    return g;
}

static const char *index_name(int32_t e) {
    switch (e) {
        case SCHED_BAD_QO_INDPTR: return "qo_indptr";
        case SCHED_BAD_KV_INDPTR: return "kv_indptr";
        case SCHED_BAD_LAST_PAGE_LEN: return "kv_last_page_len";
        default: return "qo_indptr";
    }
}

mla_status schedule_error_status(int32_t error, int32_t seq, int32_t value, const ScheduleGeometry &g) {
    switch (error) {
        case SCHED_OK: return MLA_SUCCESS;
        case SCHED_Q_LEN_LIMIT:
            return fail(MLA_ERROR_LIMIT_EXCEEDED, "sequence %d has q_len %d, above the plan's max_q_len %d", seq,
                        value, g.max_q_len);
        case SCHED_BAD_LAST_PAGE_LEN:
            return fail(MLA_ERROR_INVALID_LAST_PAGE_LEN, "kv_last_page_len[%d] = %d is outside 1..page_size (%d)", seq,
                        value, g.page_size);
        default:
            return fail(MLA_ERROR_INVALID_INDPTR, "%s decreases (or overflows) at sequence %d (value %d)",
                        index_name(error), seq, value);
    }
}

mla_status build_schedule_host(const ScheduleGeometry &g, const mla_batch &batch, HostSchedule &out) {
    const int32_t n = batch.batch_size;
    if (batch.qo_indptr[0] != 0)
        return fail(MLA_ERROR_INVALID_INDPTR, "qo_indptr[0] = %d, must be 0", batch.qo_indptr[0]);
    if (batch.kv_indptr[0] != 0)
        return fail(MLA_ERROR_INVALID_INDPTR, "kv_indptr[0] = %d, must be 0", batch.kv_indptr[0]);

    out.seqs.resize(size_t(n));
    int64_t total_blocks = 0;
    for (int32_t b = 0; b < n; ++b) {
        const int32_t q0 = batch.qo_indptr[b], q1 = batch.qo_indptr[b + 1];
        const int32_t p0 = batch.kv_indptr[b], p1 = batch.kv_indptr[b + 1];
        const int32_t last = batch.kv_last_page_len ? batch.kv_last_page_len[b] : g.page_size;
        const int32_t err = check_sequence(q0, q1, p0, p1, last, g);
        if (err != SCHED_OK) {
            const int32_t value = err == SCHED_BAD_QO_INDPTR   ? q1
                                  : err == SCHED_Q_LEN_LIMIT   ? q1 - q0
                                  : err == SCHED_BAD_KV_INDPTR ? p1
                                                               : last;
            return schedule_error_status(err, err == SCHED_BAD_QO_INDPTR || err == SCHED_BAD_KV_INDPTR ? b + 1 : b,
                                         value, g);
        }
        SeqSchedule &s = out.seqs[size_t(b)];
        s.q_begin = q0;
        s.q_len = q1 - q0;
        s.kv_len = int32_t(seq_kv_len(p1 - p0, last, g.page_size));
        s.page_begin = p0;
        if (s.q_len > 0) total_blocks += seq_blocks(s.kv_len);
    }

    ScheduleSummary &sum = out.summary;
    sum = ScheduleSummary{};
    sum.target_blocks = g.mode == SPLIT_BALANCED ? balanced_target_blocks(total_blocks, g) : 0;
    // Splits at the target; in balanced mode again at the refined target
    // where refined_target_blocks moves it (metadata.cu: the same steps).
    auto assign_splits = [&]() {
        int64_t items_at_target = 0;
        for (SeqSchedule &s : out.seqs) {
            const SeqSplit split = seq_split(s.q_len, seq_blocks(s.kv_len), sum.target_blocks, g);
            s.splits = split.splits;
            s.chunk_blocks = split.chunk_blocks;
            items_at_target += int64_t(s.splits) * g.head_blocks;
        }
        return items_at_target;
    };
    const int64_t items_at_target = assign_splits();
    if (g.mode == SPLIT_BALANCED) {
        const int32_t refined = refined_target_blocks(sum.target_blocks, items_at_target, n, g);
        if (refined != sum.target_blocks) {
            sum.target_blocks = refined;
            assign_splits();
        }
    }
    int32_t items = 0, partials = 0;
    int32_t class_items[kItemClasses] = {};
    for (int32_t b = 0; b < n; ++b) {
        SeqSchedule &s = out.seqs[size_t(b)];
        s.partial_first = s.splits > 1 ? partials : -1;
        class_items[item_class({s.splits, s.chunk_blocks}, sum.target_blocks)] += s.splits * g.head_blocks;
        items += s.splits * g.head_blocks;
        if (s.splits > 1) partials += s.splits * g.head_blocks;
        if (s.splits > sum.max_splits) sum.max_splits = s.splits;
    }
    int32_t cursor[kItemClasses];  // next item of each class: classes in order
    for (int c = 0, base = 0; c < kItemClasses; base += class_items[c++]) cursor[c] = base;
    for (int32_t b = 0; b < n; ++b) {
        SeqSchedule &s = out.seqs[size_t(b)];
        int32_t &next = cursor[item_class({s.splits, s.chunk_blocks}, sum.target_blocks)];
        s.item_first = next;
        next += s.splits * g.head_blocks;
    }
    if (items > g.max_items)
        return fail(MLA_ERROR_INTERNAL, "schedule produced %d work items, above its bound %d", items, g.max_items);
    out.items.resize(size_t(items));
    for (int32_t b = 0; b < n; ++b) emit_items(b, out.seqs[size_t(b)], g, out.items.data());
    sum.num_items = items;
    sum.num_partials = partials;
    sum.total_q = batch.qo_indptr[n];
    sum.batch_size = n;
    return MLA_SUCCESS;
}

}  // namespace mla
