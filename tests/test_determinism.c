/*
 * MLA_FLAG_DETERMINISTIC: a sequence's output (out and lse) is bitwise the
 * same when it runs alone, inside larger and different batches (at another
 * position, with its pages at other physical locations), on another plan
 * with the same descriptor or thread count, and across repeated runs.
 * Also: different plans used concurrently from different threads give the
 * same bits as a single-threaded run (the header's thread-safety promise).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "testutil.h"

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

typedef struct det_case {
    const char *name;
    mla_dtype q_dtype, kv_dtype;
    int heads, q_len, page_size, x_len;
} det_case;

typedef struct run {
    tu_batch b;
    tu_kv kv;
    tu_buf q, out, lse;
    float q_scale;
} run;

static void run_free(run *r) {
    tu_batch_free(&r->b);
    tu_kv_free(&r->kv);
    tu_buf_free(&r->q);
    tu_buf_free(&r->out);
    tu_buf_free(&r->lse);
}

/* A batch of n sequences with the case's sequence X at position x. */
static void make_run(const det_case *dc, int n, int x, const int *other_lens, tu_rng *rng, run *r) {
    int q_lens[16], kv_lens[16], i;
    memset(r, 0, sizeof *r);
    for (i = 0; i < n; ++i) {
        q_lens[i] = dc->q_len;
        kv_lens[i] = i == x ? dc->x_len : other_lens[i];
    }
    assert_int_equal(tu_batch_make(&r->b, n, q_lens, kv_lens, dc->page_size, 1, tu_range(rng, 0, 5), rng), 0);
    assert_int_equal(tu_kv_make(&r->kv, dc->kv_dtype, &r->b, 0, rng), 0);
    assert_int_equal(tu_q_make(&r->q, dc->q_dtype, r->b.total_q, dc->heads, 1.0, rng), 0);
    assert_int_equal(tu_buf_alloc(&r->out, (size_t)r->b.total_q * dc->heads * DV * 2), 0);
    assert_int_equal(tu_buf_alloc(&r->lse, (size_t)r->b.total_q * dc->heads * 4), 0);
}

/* Give sequence dx of dst the data (KV rows, q rows, scales) of sequence sx of src. */
static void transplant(const det_case *dc, run *dst, int dx, const run *src, int sx) {
    const size_t q_token = (size_t)dc->heads * ref_q_row_bytes(dc->q_dtype);
    int j;
    for (j = 0; j < dc->x_len; ++j) tu_kv_copy_row(&dst->kv, &dst->b, dx, &src->kv, &src->b, sx, j);
    memcpy(dst->q.data + (size_t)dst->b.qo_indptr[dx] * q_token, src->q.data + (size_t)src->b.qo_indptr[sx] * q_token,
           (size_t)dc->q_len * q_token);
    dst->kv.kv_scale = src->kv.kv_scale;
    dst->q_scale = src->q_scale;
}

static void execute(mla_plan *plan, run *r) {
    mla_batch batch;
    mla_tensors t;
    mla_status st;
    tu_batch_to_mla(&r->b, 0, &batch);
    st = mla_plan_build_metadata(plan, &batch, NULL);
    if (st != MLA_SUCCESS) fail_msg("build_metadata: %s: %s", mla_status_string(st), mla_last_error_message());
    mla_tensors_init(&t);
    t.q = r->q.data;
    t.kv = r->kv.data.data;
    t.kv_block_scales = r->kv.scales.data;
    t.kv_indices = r->b.kv_indices;
    t.out = r->out.data;
    t.lse = (float *)r->lse.data;
    t.q_scale = r->q_scale;
    t.kv_scale = r->kv.kv_scale;
    t.num_pages = r->b.num_pages;
    tu_buf_poison(&r->out);
    tu_buf_poison(&r->lse);
    st = mla_plan_execute(plan, &t, NULL);
    if (st != MLA_SUCCESS) fail_msg("execute: %s: %s", mla_status_string(st), mla_last_error_message());
    assert_true(tu_buf_guards_ok(&r->out));
    assert_true(tu_buf_guards_ok(&r->lse));
}

/* Bitwise comparison of sequence ax of a with sequence bx of b. */
static int same_bits(const det_case *dc, const run *a, int ax, const run *b, int bx) {
    const size_t rows = (size_t)dc->q_len * dc->heads;
    const size_t ra = (size_t)a->b.qo_indptr[ax] * dc->heads, rb = (size_t)b->b.qo_indptr[bx] * dc->heads;
    return memcmp(a->out.data + ra * DV * 2, b->out.data + rb * DV * 2, rows * DV * 2) == 0 &&
           memcmp(a->lse.data + ra * 4, b->lse.data + rb * 4, rows * 4) == 0;
}

static mla_plan *make_plan(const det_case *dc, uint32_t flags, int threads) {
    mla_plan_desc desc;
    mla_plan *plan = NULL;
    mla_plan_desc_init(&desc);
    desc.num_heads = dc->heads;
    desc.q_dtype = dc->q_dtype;
    desc.kv_dtype = dc->kv_dtype;
    desc.page_size = dc->page_size;
    desc.max_q_len = dc->q_len;
    desc.max_batch_size = 16;
    desc.flags = flags;
    desc.backend = MLA_BACKEND_CPU;
    desc.num_threads = threads;
    if (mla_plan_create(&desc, &plan) != MLA_SUCCESS) fail_msg("mla_plan_create: %s", mla_last_error_message());
    return plan;
}

static int max_splits(const mla_plan *plan) {
    mla_schedule_info info;
    mla_schedule_info_init(&info);
    assert_int_equal(mla_plan_schedule_info(plan, &info), MLA_SUCCESS);
    return info.max_splits;
}

static void check_case(const det_case *dc) {
    /* other sequences: a mix of long and short, different in each batch */
    int lens_b[7] = {4000, 3, 0, -1, 700, 1, 2200};
    int lens_d[3] = {-1, 5000, 64};
    tu_rng rng;
    run a, b, b2, d;
    mla_plan *p1, *p2, *p3;
    int splits_alone, splits_b;
    int i;
    tu_rng_init(&rng, tu_seed() ^ (uint64_t)dc->x_len);
    if (dc->heads * dc->q_len > 64) { /* keep the big shapes cheap */
        for (i = 0; i < 7; ++i) lens_b[i] /= 4;
        for (i = 0; i < 3; ++i) lens_d[i] /= 4;
    }

    make_run(dc, 1, 0, NULL, &rng, &a);
    make_run(dc, 7, 3, lens_b, &rng, &b);
    make_run(dc, 3, 0, lens_d, &rng, &d);
    transplant(dc, &b, 3, &a, 0);
    transplant(dc, &d, 0, &a, 0);

    p1 = make_plan(dc, MLA_FLAG_DETERMINISTIC, 2);
    p2 = make_plan(dc, MLA_FLAG_DETERMINISTIC, 2);
    execute(p1, &a);
    splits_alone = max_splits(p1);
    execute(p2, &b);
    splits_b = max_splits(p2);
    if (!same_bits(dc, &a, 0, &b, 3)) {
        tu_print_seed();
        fail_msg("%s: sequence alone and at position 3 of a 7-sequence batch differ", dc->name);
    }
    /* the whole batch again on the same plan and metadata, then rebuilt */
    memset(&b2, 0, sizeof b2);
    assert_int_equal(tu_buf_alloc(&b2.out, b.out.size), 0);
    assert_int_equal(tu_buf_alloc(&b2.lse, b.lse.size), 0);
    memcpy(b2.out.data, b.out.data, b.out.size);
    memcpy(b2.lse.data, b.lse.data, b.lse.size);
    execute(p2, &b);
    assert_memory_equal(b2.out.data, b.out.data, b.out.size);
    assert_memory_equal(b2.lse.data, b.lse.data, b.lse.size);
    execute(p2, &d);
    if (!same_bits(dc, &a, 0, &d, 0)) {
        tu_print_seed();
        fail_msg("%s: sequence alone and first of a 3-sequence batch differ", dc->name);
    }
    execute(p2, &a); /* alone again, on the plan that ran the batches */
    if (!same_bits(dc, &a, 0, &b, 3)) { /* b holds its second run, == b2 */
        tu_print_seed();
        fail_msg("%s: repeated run of the sequence alone differs", dc->name);
    }
    /* another thread count must not matter either */
    p3 = make_plan(dc, MLA_FLAG_DETERMINISTIC, 1);
    execute(p3, &b);
    assert_memory_equal(b2.out.data, b.out.data, b.out.size);
    assert_memory_equal(b2.lse.data, b.lse.data, b.lse.size);

    /* and it is right */
    {
        const size_t rows = (size_t)dc->q_len * dc->heads;
        double *ro = (double *)malloc(rows * DV * sizeof(double)), *rl = (double *)malloc(rows * sizeof(double)),
               *vm = (double *)malloc(rows * sizeof(double)), *sg = (double *)malloc(rows * sizeof(double));
        const tu_tol tol = {0x1p-7, 0x1p-9, 1e-4, 1e-4, 0x1p-16};
        ref_problem p;
        tu_cmp cmp;
        memset(&p, 0, sizeof p);
        p.num_heads = dc->heads;
        p.q_dtype = dc->q_dtype;
        p.kv_dtype = dc->kv_dtype;
        p.page_size = dc->page_size;
        p.batch_size = 1;
        p.qo_indptr = a.b.qo_indptr;
        p.kv_indptr = a.b.kv_indptr;
        p.kv_last_page_len = a.b.kv_last_page_len;
        p.kv_indices = a.b.kv_indices;
        p.q = a.q.data;
        p.kv = a.kv.data.data;
        p.kv_block_scales = a.kv.scales.data;
        p.q_scale = a.q_scale;
        p.kv_scale = a.kv.kv_scale;
        assert_int_equal(ref_attention(&p, ro, rl, vm, sg), 0);
        tu_cmp_init(&cmp);
        assert_int_equal(tu_compare(dc->name, (const uint16_t *)a.out.data, (const float *)a.lse.data, ro, rl, vm,
                                    sg, rows, &tol, &cmp, 8),
                         0);
        free(ro);
        free(rl);
        free(vm);
        free(sg);
    }
    printf("[ info     ] %s: %d splits alone, %d max in the batch; bitwise identical\n", dc->name, splits_alone,
           splits_b);
    assert_true(splits_alone > 1); /* the sequence is long enough to be split */

    /* For contrast (not a requirement): the balanced scheduler's split count
     * does depend on the batch. */
    {
        mla_plan *pb = make_plan(dc, 0, 2);
        int s_alone, s_in;
        execute(pb, &a);
        s_alone = max_splits(pb);
        execute(pb, &b);
        s_in = max_splits(pb);
        printf("[ info     ] without the flag: %d splits alone, max %d in the batch, output %s\n", s_alone, s_in,
               same_bits(dc, &a, 0, &b, 3) ? "identical" : "differs");
        mla_plan_destroy(pb);
    }
    mla_plan_destroy(p1);
    mla_plan_destroy(p2);
    mla_plan_destroy(p3);
    run_free(&a);
    run_free(&b);
    run_free(&d);
    tu_buf_free(&b2.out);
    tu_buf_free(&b2.lse);
}

static void test_bf16_q1(void **state) {
    const det_case dc = {"bf16/bf16 16 heads q_len 1 page 64", MLA_DTYPE_BF16, MLA_DTYPE_BF16, 16, 1, 64, 3000};
    (void)state;
    check_case(&dc);
}

static void test_fp8_q2(void **state) {
    const det_case dc = {"fp8/fp8 128 heads q_len 2 page 1", MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3, 128, 2, 1, 2100};
    (void)state;
    check_case(&dc);
}

static void test_mxfp4_q4(void **state) {
    const det_case dc = {"bf16/mxfp4 32 heads q_len 4 page 16", MLA_DTYPE_BF16, MLA_DTYPE_MXFP4, 32, 4, 16, 4500};
    (void)state;
    check_case(&dc);
}

/* ---- different plans on different threads run concurrently ---------------- */

typedef struct worker {
    const det_case *dc;
    const run *r;
    tu_buf out, lse;
    const tu_buf *want_out, *want_lse;
    int iterations;
    const char *error; /* NULL on success; no CMocka calls off the main thread */
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    mla_plan_desc desc;
    mla_plan *plan = NULL;
    mla_batch batch;
    mla_tensors t;
    int i;
    mla_plan_desc_init(&desc);
    desc.num_heads = w->dc->heads;
    desc.q_dtype = w->dc->q_dtype;
    desc.kv_dtype = w->dc->kv_dtype;
    desc.page_size = w->dc->page_size;
    desc.max_q_len = w->dc->q_len;
    desc.max_batch_size = 16;
    desc.flags = MLA_FLAG_DETERMINISTIC;
    desc.backend = MLA_BACKEND_CPU;
    desc.num_threads = 2;
    if (mla_plan_create(&desc, &plan) != MLA_SUCCESS) {
        w->error = "mla_plan_create failed";
        return NULL;
    }
    tu_batch_to_mla(&w->r->b, 0, &batch);
    mla_tensors_init(&t);
    t.q = w->r->q.data;
    t.kv = w->r->kv.data.data;
    t.kv_block_scales = w->r->kv.scales.data;
    t.kv_indices = w->r->b.kv_indices;
    t.out = w->out.data;
    t.lse = (float *)w->lse.data;
    t.q_scale = w->r->q_scale;
    t.kv_scale = w->r->kv.kv_scale;
    for (i = 0; i < w->iterations && !w->error; ++i) {
        tu_buf_poison(&w->out);
        if (mla_plan_build_metadata(plan, &batch, NULL) != MLA_SUCCESS || mla_plan_execute(plan, &t, NULL) != MLA_SUCCESS)
            w->error = "build_metadata / execute failed";
        else if (*mla_last_error_message())
            w->error = "a successful call left an error message";
        else if (memcmp(w->out.data, w->want_out->data, w->out.size) || memcmp(w->lse.data, w->want_lse->data, w->lse.size))
            w->error = "output differs from the single-threaded run";
    }
    mla_plan_destroy(plan);
    return NULL;
}

static void test_concurrent_plans(void **state) {
    const det_case dc = {"concurrent", MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, 16, 2, 16, 1500};
    const int lens[5] = {300, -1, 0, 1100, 77};
    worker w[3];
    pthread_t th[3];
    tu_rng rng;
    run r;
    mla_plan *plan;
    int i;
    (void)state;
    tu_rng_init(&rng, tu_seed() ^ 0xc0ffeeull);
    make_run(&dc, 5, 1, lens, &rng, &r);
    plan = make_plan(&dc, MLA_FLAG_DETERMINISTIC, 2);
    execute(plan, &r); /* the expected bits */
    mla_plan_destroy(plan);
    for (i = 0; i < 3; ++i) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].dc = &dc;
        w[i].r = &r;
        w[i].want_out = &r.out;
        w[i].want_lse = &r.lse;
        w[i].iterations = 6;
        assert_int_equal(tu_buf_alloc(&w[i].out, r.out.size), 0);
        assert_int_equal(tu_buf_alloc(&w[i].lse, r.lse.size), 0);
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (i = 0; i < 3; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (i = 0; i < 3; ++i) {
        if (w[i].error) fail_msg("thread %d: %s", i, w[i].error);
        assert_true(tu_buf_guards_ok(&w[i].out) && tu_buf_guards_ok(&w[i].lse));
        tu_buf_free(&w[i].out);
        tu_buf_free(&w[i].lse);
    }
    run_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_q1),
        cmocka_unit_test(test_fp8_q2),
        cmocka_unit_test(test_mxfp4_q4),
        cmocka_unit_test(test_concurrent_plans),
    };
    tu_seed();
    return cmocka_run_group_tests_name("determinism", tests, NULL, NULL);
}
