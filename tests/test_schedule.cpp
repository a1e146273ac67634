// The split-KV scheduler of src/schedule.h, on the host: the invariants every
// backend relies on, over random batches and geometries.
//   item_class   every (chunk, target) up to 400 blocks against its
//                definition (sixteenths of the target)
//   seq_split    splits >= 1, no empty split, chunk * splits covers the
//                sequence, at most kBalancedMaxSplits in balanced mode
//   refined_target  the partial-wave halving and its floor, on the cases
//                that set them
//   schedule     build_schedule_host on random batches: every (sequence,
//                head block) is covered by its items exactly once, in split
//                order; item indices and partial slots are each used once;
//                the item array runs in size class order; the summary's
//                counts agree with the items
// MLA_TEST_SEED=<n> reproduces a run.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cstdio>
#include <random>
#include <vector>

#include "schedule_host.h"
#include "seed.h"

namespace {

using namespace mla;

void test_item_class(void **) {
    for (int32_t t = 1; t < 400; ++t)
        for (int32_t chunk = 0; chunk < 3 * t; ++chunk) {
            // Class k: chunk in [(15 - k)/16, (16 - k)/16) of the target; 0
            // for anything larger, 15 for anything smaller.
            int32_t want = 0;
            for (int32_t k = 1; k < kItemClasses; ++k)
                if (int64_t(kItemClasses) * chunk < int64_t(kItemClasses - k) * t) want = k;
            const int32_t got = item_class({1, chunk}, t);
            if (got != want) {
                std::printf("item_class(chunk %d, target %d) = %d, want %d\n", chunk, t, got, want);
                fail();
            }
        }
    assert_int_equal(item_class({0, 0}, 10), 0);   // no items
    assert_int_equal(item_class({3, 1}, 0), 0);    // no target (forced / deterministic)
}

ScheduleGeometry random_geometry(std::mt19937_64 &rng, int32_t max_batch) {
    PlanConfig cfg{};
    const int32_t heads[] = {16, 32, 64, 128};
    cfg.num_heads = heads[rng() % 4];
    cfg.max_q_len = 1 + int32_t(rng() % 4);
    cfg.page_size = 1 << (rng() % 7);
    cfg.max_batch_size = max_batch;
    const int mode = int(rng() % 4);  // balanced twice as often
    if (mode == 2) cfg.num_splits = 1 + int32_t(rng() % 16);
    if (mode == 3) cfg.flags = MLA_FLAG_DETERMINISTIC;
    const int32_t workers = 1 + int32_t(rng() % 300);
    const int32_t rows[] = {16, 32, 64};
    return make_geometry(cfg, workers, 1 + int32_t(rng() % 4), rows[rng() % 3]);
}

void test_seq_split(void **) {
    std::mt19937_64 rng(tu_seed() ^ 0x73706c6974ull);
    for (int i = 0; i < 20000; ++i) {
        const ScheduleGeometry g = random_geometry(rng, 8);
        const int32_t blocks = int32_t(rng() % 3000);
        const int32_t target = 1 + int32_t(rng() % 500);
        const int32_t q_len = int32_t(rng() % 3);
        const SeqSplit s = seq_split(q_len, blocks, target, g);
        if (q_len == 0) {
            assert_int_equal(s.splits, 0);
            continue;
        }
        assert_true(s.splits >= 1);
        if (blocks == 0) continue;  // one empty item
        assert_true(s.chunk_blocks >= 1);
        assert_true(int64_t(s.chunk_blocks) * s.splits >= blocks);           // covered
        assert_true(int64_t(s.chunk_blocks) * (s.splits - 1) < blocks);      // last split not empty
        if (g.mode == SPLIT_BALANCED) assert_true(s.splits <= kBalancedMaxSplits);
    }
}

// The balanced target is halved only for a partial wave of items (more
// than one wave of workers, less than one and a half), only down to
// kMinRefinedBlocks and only where the items are already two per
// (sequence, head block): the cases that decided the rule
// (docs/performance.md v26 and v27, ragged batches at 264 workers; one
// head block, so a row is a sequence).
void test_refined_target(void **) {
    PlanConfig cfg{};
    cfg.num_heads = 16;
    cfg.max_q_len = 1;
    cfg.page_size = 1;
    cfg.max_batch_size = 256;
    const ScheduleGeometry g = make_geometry(cfg, 264, 1, 16);
    assert_int_equal(g.mode, SPLIT_BALANCED);
    assert_int_equal(refined_target_blocks(31, 300, 64, g), 16);    // B64 x 8k: halved
    assert_int_equal(refined_target_blocks(124, 380, 256, g), 124);  // B256 x 8k: most rows unsplit
    assert_int_equal(refined_target_blocks(124, 380, 190, g), 62);   // two items a row: halved
    assert_int_equal(refined_target_blocks(17, 380, 64, g), 17);     // 9-block items cost more
    assert_int_equal(refined_target_blocks(31, 264, 64, g), 31);     // one wave exactly
    assert_int_equal(refined_target_blocks(31, 396, 64, g), 31);     // 1.5 waves: the greedy order evens it
    assert_int_equal(refined_target_blocks(31, 395, 64, g), 16);
}

void test_schedule(void **) {
    std::mt19937_64 rng(tu_seed() ^ 0x7363686564ull);
    for (int iter = 0; iter < 2000; ++iter) {
        const int32_t max_batch = 1 + int32_t(rng() % 300);
        const ScheduleGeometry g = random_geometry(rng, max_batch);
        const int32_t n = int32_t(rng() % (max_batch + 1));
        // Lengths: uniform, ragged (1..2 x mean) or with empty sequences.
        const int shape = int(rng() % 3);
        const int32_t mean = 1 + int32_t(rng() % 20000);
        std::vector<int32_t> qo(size_t(n) + 1, 0), kv(size_t(n) + 1, 0), last(size_t(n), g.page_size);
        std::vector<int64_t> want_len(static_cast<size_t>(n));
        for (int32_t b = 0; b < n; ++b) {
            const int32_t q = int32_t(rng() % (g.max_q_len + 1));
            int32_t len = shape == 0 ? mean : shape == 1 ? 1 + int32_t(rng() % (2 * mean)) : int32_t(rng() % 3) * mean;
            const int32_t pages = (len + g.page_size - 1) / g.page_size;
            if (pages > 0) last[size_t(b)] = len - (pages - 1) * g.page_size;
            qo[size_t(b) + 1] = qo[size_t(b)] + q;
            kv[size_t(b) + 1] = kv[size_t(b)] + pages;
            want_len[size_t(b)] = len;
        }
        mla_batch batch{};
        batch.struct_size = sizeof batch;
        batch.batch_size = n;
        batch.qo_indptr = qo.data();
        batch.kv_indptr = kv.data();
        batch.kv_last_page_len = last.data();
        HostSchedule s;
        assert_int_equal(build_schedule_host(g, batch, s), MLA_SUCCESS);
        const ScheduleSummary &sum = s.summary;
        assert_int_equal(sum.num_items, int32_t(s.items.size()));
        assert_true(sum.num_items <= g.max_items);

        // Each (sequence, head block): its items, in split order, cover
        // [0, kv_len) with no gap and no overlap; every index used once.
        std::vector<int> item_used(s.items.size(), 0), slot_used(size_t(sum.num_partials), 0);
        int32_t max_splits = 0;
        for (int32_t b = 0; b < n; ++b) {
            const SeqSchedule &q = s.seqs[size_t(b)];
            assert_int_equal(q.kv_len, want_len[size_t(b)]);
            max_splits = q.splits > max_splits ? q.splits : max_splits;
            if (q.q_len == 0) {
                assert_int_equal(q.splits, 0);
                continue;
            }
            for (int32_t hb = 0; hb < g.head_blocks; ++hb) {
                int32_t next = 0;
                for (int32_t k = 0; k < q.splits; ++k) {
                    const int32_t idx = q.item_first + hb * q.splits + k;
                    assert_true(idx >= 0 && idx < sum.num_items);
                    ++item_used[size_t(idx)];
                    const WorkItem &w = s.items[size_t(idx)];
                    assert_int_equal(w.seq, b);
                    assert_int_equal(w.head_block, hb);
                    assert_int_equal(w.kv_begin, next);
                    assert_true(w.kv_end >= w.kv_begin);
                    assert_true(q.splits == 1 || w.kv_end > w.kv_begin);  // a split is never empty
                    next = w.kv_end;
                    if (q.splits > 1) {
                        assert_true(w.partial_slot >= 0 && w.partial_slot < sum.num_partials);
                        ++slot_used[size_t(w.partial_slot)];
                    } else {
                        assert_int_equal(w.partial_slot, -1);
                    }
                }
                assert_int_equal(next, q.kv_len);
            }
        }
        for (int u : item_used) assert_int_equal(u, 1);
        for (int u : slot_used) assert_int_equal(u, 1);
        assert_int_equal(sum.max_splits, max_splits);
        // Size classes never decrease along the item array.
        int32_t prev = 0;
        for (const WorkItem &w : s.items) {
            const SeqSchedule &q = s.seqs[size_t(w.seq)];
            const int32_t cls = item_class({q.splits, q.chunk_blocks}, sum.target_blocks);
            assert_true(cls >= prev);
            prev = cls;
        }
    }
}

}  // namespace

int main() {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_item_class),
        cmocka_unit_test(test_seq_split),
        cmocka_unit_test(test_refined_target),
        cmocka_unit_test(test_schedule),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
