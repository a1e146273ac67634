/*
 * The CPU backend against the float64 reference on a sampled matrix of
 * random configurations.
 *
 * Axes (every value of every axis appears at least once per run; the
 * combination of values is a fresh random draw each run):
 *   dtype pair   q {bf16, fp8_e4m3, fp8_e4m3_fnuz} x kv {bf16, fp8_e4m3,
 *                fp8_e4m3_fnuz, mxfp4}, less the two mixed-fp8 pairs that
 *                the library refuses (tested separately below)
 *   page size    1, 16, 64, 256          heads  1, 16, 32, 128
 *   q_len        1, 2, 4, 8              splits auto, 1, 2, 7, MLA_MAX_SPLITS
 *   page table   explicit (shuffled) / NULL (identity)
 *   logit cap    off / on                lse    NULL / non-NULL
 *   plus: deterministic flag, caller workspace, NULL kv_last_page_len (full
 *   pages), thread count, sm_scale default / explicit, ragged q_len, a second
 *   decode step on the same plan.
 * Lengths are ragged and include 0 and 1 (and L < q_len); most are below 600
 * tokens, a few configurations are long (up to ~5000) so that every forced
 * split count really splits.
 *
 * Tolerances (see README.md):
 *   out: |out - ref| <= (2^-9 + 2^-16 * smag) * max|V| + 2^-7 * |ref|
 *     The library accumulates in float32 on exactly the dequantized inputs
 *     and rounds the result to bf16 once. bf16 keeps 8 significant bits, so
 *     the rounding alone is up to 2^-8 relative: rtol 2^-7 is twice that.
 *     The output is a convex combination of V rows, so float32 errors in the
 *     scores and in the sums scale with max|V| of the visible keys (not with
 *     |out|, which can be ~0 after cancellation): atol = 2^-9 * max|V|.
 *     smag = sm_scale * |q| * max|K| bounds the magnitude of the score's
 *     float32 dot product terms; its rounding error, and so the softmax's,
 *     scales with it (2^-16 ~ 256 ulps; only the extreme fp8 codes make it
 *     large).
 *   lse: |lse - ref| <= 1e-4 + 2^-16 * smag + 1e-4 * |ref|.
 *   Rows without a visible key: out exactly 0 and lse exactly -inf.
 * Decoding is also checked bitwise (test_kv/q_decoding_exact): small decoder
 * slips hide inside any attention tolerance.
 *
 * MLA_TEST_SEED reproduces a run; MLA_TEST_CONFIGS changes the number of
 * sampled configurations (default 56, plus 4 long ones and 4 with head
 * counts 3, 20, 100, 127).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reference.h"
#include "testutil.h"

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

static const tu_tol k_tol = {0x1p-7, 0x1p-9, 1e-4, 1e-4, 0x1p-16};

/* ---- the axes ---------------------------------------------------------------- */

typedef struct pair {
    mla_dtype q, kv;
} pair;
static const pair k_pairs[] = {
    {MLA_DTYPE_BF16, MLA_DTYPE_BF16},
    {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3},
    {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3_FNUZ},
    {MLA_DTYPE_BF16, MLA_DTYPE_MXFP4},
    {MLA_DTYPE_FP8_E4M3, MLA_DTYPE_BF16},
    {MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3},
    {MLA_DTYPE_FP8_E4M3, MLA_DTYPE_MXFP4},
    {MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_BF16},
    {MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_FP8_E4M3_FNUZ},
    {MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_MXFP4},
};
static const int k_pages[] = {1, 16, 64, 256};
static const int k_heads[] = {1, 16, 32, 128};
static const int k_qlens[] = {1, 2, 4, 8};
static const int k_splits[] = {0, 1, 2, 7, MLA_MAX_SPLITS};
static const int k_bool[] = {0, 1};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { AX_PAIR, AX_PAGE, AX_HEADS, AX_QLEN, AX_SPLITS, AX_EXPLICIT, AX_CAP, AX_LSE, AX_COUNT };
static const int k_axis_size[AX_COUNT] = {N_OF(k_pairs), N_OF(k_pages), N_OF(k_heads), N_OF(k_qlens),
                                          N_OF(k_splits), 2, 2, 2};

typedef struct config {
    int index;
    uint64_t seed;
    int axis[AX_COUNT]; /* value index per axis */
    mla_dtype q_dtype, kv_dtype;
    int page_size, num_heads, q_len, num_splits, explicit_indices, use_lse;
    float logit_cap, sm_scale;
    int plan_max_q_len, max_batch_size, deterministic, caller_workspace, null_last_page_len, num_threads;
    int ragged_q, steps, long_seq, scale_stride;
    double q_stddev;
    char name[200];
} config;

/* Work budget per step in (query row x key) units: the reference does about
 * 2 * 1088 flops per unit in double, the library as many in float. */
#define STEP_BUDGET 360000.0

static uint64_t g_rows_checked;
static double g_worst_ratio, g_worst_lse, g_worst_lse_ratio;

/* ---- one configuration ------------------------------------------------------------ */

typedef struct step_data {
    tu_batch b;
    tu_kv kv;
    tu_buf q, out, lse;
    float q_scale;
} step_data;

static void step_free(step_data *d) {
    tu_batch_free(&d->b);
    tu_kv_free(&d->kv);
    tu_buf_free(&d->q);
    tu_buf_free(&d->out);
    tu_buf_free(&d->lse);
}

static void make_step(const config *c, int step, tu_rng *rng, step_data *d) {
    int n, i, q_lens[32], kv_lens[32];
    memset(d, 0, sizeof *d);
    n = c->num_heads * c->q_len >= 256 ? tu_range(rng, 1, 6) : tu_range(rng, 1, 12);
    if (c->long_seq) n = tu_range(rng, 1, 3);
    if (n > c->max_batch_size && c->max_batch_size > 0) n = c->max_batch_size;
    tu_random_kv_lens(rng, n, 600, 0.0, 0, kv_lens);
    for (i = 0; i < n; ++i) q_lens[i] = c->ragged_q ? tu_range(rng, 0, c->q_len) : c->q_len;
    if (n >= 3 && step == 0) { /* make sure the edge lengths keep showing up */
        kv_lens[tu_range(rng, 0, n - 1)] = tu_chance(rng, 0.5) ? 0 : 1;
    }
    if (c->long_seq) {
        kv_lens[0] = tu_range(rng, 4100, 5200); /* >= 64 blocks of 64: 64 real splits */
        q_lens[0] = c->q_len;
    }
    if (c->null_last_page_len) /* whole pages only */
        for (i = 0; i < n; ++i) kv_lens[i] = (kv_lens[i] + c->page_size - 1) / c->page_size * c->page_size;
    tu_fit_budget(n, q_lens, kv_lens, c->num_heads, c->long_seq ? 4 * STEP_BUDGET : STEP_BUDGET);
    if (c->null_last_page_len)
        for (i = 0; i < n; ++i) kv_lens[i] = kv_lens[i] / c->page_size * c->page_size;
    assert_int_equal(tu_batch_make(&d->b, n, q_lens, kv_lens, c->page_size, c->explicit_indices,
                                   tu_range(rng, 0, 3), rng),
                     0);
    assert_int_equal(tu_kv_make(&d->kv, c->kv_dtype, &d->b, c->scale_stride, rng), 0);
    assert_int_equal(tu_q_make(&d->q, c->q_dtype, d->b.total_q, c->num_heads, c->q_stddev, rng), 0);
    d->q_scale = c->q_dtype == MLA_DTYPE_BF16 ? 0.0f : tu_rand_fp8_scale(rng);
    assert_int_equal(tu_buf_alloc(&d->out, (size_t)d->b.total_q * c->num_heads * DV * 2 + 16), 0);
    assert_int_equal(tu_buf_alloc(&d->lse, (size_t)d->b.total_q * c->num_heads * 4 + 16), 0);
}

static void print_batch(const tu_batch *b) {
    int i;
    printf("  batch %d:", b->batch_size);
    for (i = 0; i < b->batch_size; ++i) printf(" (q%d,kv%d)", b->q_lens[i], b->kv_lens[i]);
    printf("\n");
}

static void run_config(void **state) {
    const config *c = (const config *)*state;
    mla_plan_desc desc;
    mla_plan *plan = NULL;
    mla_backend backend;
    tu_buf ws;
    size_t ws_bytes = 0;
    tu_rng rng;
    int step;

    tu_rng_init(&rng, c->seed);
    memset(&ws, 0, sizeof ws);
    mla_plan_desc_init(&desc);
    desc.num_heads = c->num_heads;
    desc.q_dtype = c->q_dtype;
    desc.kv_dtype = c->kv_dtype;
    desc.page_size = c->page_size;
    desc.max_batch_size = c->max_batch_size;
    desc.max_q_len = c->plan_max_q_len;
    desc.sm_scale = c->sm_scale;
    desc.logit_cap = c->logit_cap;
    desc.num_splits = c->num_splits;
    desc.flags = (c->deterministic ? MLA_FLAG_DETERMINISTIC : 0u) | (c->caller_workspace ? MLA_FLAG_CALLER_WORKSPACE : 0u);
    desc.backend = MLA_BACKEND_CPU;
    desc.num_threads = c->num_threads;
    {
        const mla_status st = mla_plan_create(&desc, &plan);
        if (st != MLA_SUCCESS) {
            tu_print_seed();
            fail_msg("%s: mla_plan_create: %s: %s", c->name, mla_status_string(st), mla_last_error_message());
        }
    }
    assert_int_equal(mla_plan_backend(plan, &backend), MLA_SUCCESS);
    assert_int_equal(backend, MLA_BACKEND_CPU);
    assert_int_equal(mla_plan_workspace_size(plan, &ws_bytes), MLA_SUCCESS);
    if (c->caller_workspace) {
        assert_int_equal(tu_buf_alloc(&ws, ws_bytes), 0);
        tu_buf_poison(&ws); /* partials must be written before they are read */
    }

    for (step = 0; step < c->steps; ++step) {
        step_data d;
        mla_batch batch;
        mla_tensors t;
        mla_schedule_info info;
        ref_problem p;
        double *ref_out, *ref_lse, *vmax, *smag;
        size_t nrows;
        tu_cmp cmp;
        mla_status st;

        make_step(c, step, &rng, &d);
        nrows = (size_t)d.b.total_q * (size_t)c->num_heads;
        tu_batch_to_mla(&d.b, c->null_last_page_len, &batch);
        st = mla_plan_build_metadata(plan, &batch, NULL);
        if (st != MLA_SUCCESS) {
            tu_print_seed();
            print_batch(&d.b);
            fail_msg("%s: build_metadata: %s: %s", c->name, mla_status_string(st), mla_last_error_message());
        }
        mla_schedule_info_init(&info);
        assert_int_equal(mla_plan_schedule_info(plan, &info), MLA_SUCCESS);
        if (c->num_splits > 0) assert_true(info.max_splits <= c->num_splits);
        if (c->num_splits == 1) assert_int_equal(info.num_split_rows, 0);

        mla_tensors_init(&t);
        t.q = d.q.data;
        t.kv = d.kv.data.data;
        t.kv_block_scales = c->kv_dtype == MLA_DTYPE_MXFP4 ? d.kv.scales.data : NULL;
        t.kv_indices = d.b.kv_indices;
        t.out = d.out.data;
        t.lse = c->use_lse ? (float *)d.lse.data : NULL;
        t.q_scale = d.q_scale;
        t.kv_scale = d.kv.kv_scale;
        t.kv_scale_stride = c->kv_dtype == MLA_DTYPE_MXFP4 ? c->scale_stride : 0;
        t.num_pages = tu_chance(&rng, 0.5) ? d.b.num_pages : 0;
        if (c->caller_workspace) {
            t.workspace = ws.data;
            t.workspace_size = ws.size;
        }
        tu_buf_poison(&d.out);
        tu_buf_poison(&d.lse);
        st = mla_plan_execute(plan, &t, NULL);
        if (st != MLA_SUCCESS) {
            tu_print_seed();
            print_batch(&d.b);
            fail_msg("%s: execute: %s: %s", c->name, mla_status_string(st), mla_last_error_message());
        }
        if (!tu_buf_guards_ok(&d.out) || !tu_buf_guards_ok(&d.lse) || (c->caller_workspace && !tu_buf_guards_ok(&ws))) {
            tu_print_seed();
            print_batch(&d.b);
            fail_msg("%s: execute wrote outside out / lse / workspace", c->name);
        }
        if (!c->use_lse && tu_count_f32_nan((const float *)d.lse.data, nrows) != nrows)
            fail_msg("%s: lse was NULL but the lse buffer changed", c->name);
        /* bytes after the last row (the +16 slack) are not the library's */
        {
            const uint8_t *tail = d.out.data + nrows * DV * 2;
            for (int i = 0; i < 16; ++i)
                if (tail[i] != 0xff) {
                    tu_print_seed();
                    print_batch(&d.b);
                    fail_msg("%s: execute wrote past the last row of out", c->name);
                }
        }

        memset(&p, 0, sizeof p);
        p.num_heads = c->num_heads;
        p.q_dtype = c->q_dtype;
        p.kv_dtype = c->kv_dtype;
        p.page_size = c->page_size;
        p.sm_scale = c->sm_scale;
        p.logit_cap = c->logit_cap;
        p.batch_size = d.b.batch_size;
        p.qo_indptr = d.b.qo_indptr;
        p.kv_indptr = d.b.kv_indptr;
        p.kv_last_page_len = c->null_last_page_len ? NULL : d.b.kv_last_page_len;
        p.kv_indices = d.b.kv_indices;
        p.q = d.q.data;
        p.kv = d.kv.data.data;
        p.kv_block_scales = d.kv.scales.data;
        p.kv_scale_stride = d.kv.scale_stride;
        p.q_scale = d.q_scale;
        p.kv_scale = d.kv.kv_scale;
        ref_out = (double *)malloc((nrows + 1) * DV * sizeof(double));
        ref_lse = (double *)malloc((nrows + 1) * sizeof(double));
        vmax = (double *)malloc((nrows + 1) * sizeof(double));
        smag = (double *)malloc((nrows + 1) * sizeof(double));
        assert_non_null(smag);
        assert_non_null(ref_out);
        assert_non_null(ref_lse);
        assert_non_null(vmax);
        assert_int_equal(ref_attention(&p, ref_out, ref_lse, vmax, smag), 0);

        tu_cmp_init(&cmp);
        if (tu_compare(c->name, (const uint16_t *)d.out.data, c->use_lse ? (const float *)d.lse.data : NULL, ref_out,
                       ref_lse, vmax, smag, nrows, &k_tol, &cmp, 8)) {
            tu_print_seed();
            print_batch(&d.b);
            fail_msg("%s step %d: %zu out / %zu lse values out of tolerance, %zu rows unwritten (worst %.3g of tol)",
                     c->name, step, cmp.bad_out, cmp.bad_lse, cmp.unwritten, cmp.worst_ratio);
        }
        g_rows_checked += cmp.rows;
        if (cmp.worst_ratio > g_worst_ratio) g_worst_ratio = cmp.worst_ratio;
        if (cmp.worst_lse > g_worst_lse) g_worst_lse = cmp.worst_lse;
        if (cmp.worst_lse_ratio > g_worst_lse_ratio) g_worst_lse_ratio = cmp.worst_lse_ratio;
        free(ref_out);
        free(ref_lse);
        free(vmax);
        free(smag);
        step_free(&d);
    }
    tu_buf_free(&ws);
    mla_plan_destroy(plan);
}

/* ---- sampling the matrix ------------------------------------------------------------ */

static void describe(config *c) {
    static const char *split_names[] = {"auto", "1", "2", "7", "64"};
    snprintf(c->name, sizeof c->name,
             "cfg%02d q=%s kv=%s page=%d heads=%d q_len=%d%s splits=%s %s%s%s%s%s%s%s threads=%d steps=%d",
             c->index, tu_dtype_name(c->q_dtype), tu_dtype_name(c->kv_dtype), c->page_size, c->num_heads, c->q_len,
             c->ragged_q ? "(ragged)" : "", split_names[c->axis[AX_SPLITS]],
             c->explicit_indices ? "explicit_pages" : "identity_pages", c->logit_cap > 0 ? " cap" : "",
             c->use_lse ? " lse" : " no_lse", c->deterministic ? " det" : "", c->caller_workspace ? " caller_ws" : "",
             c->null_last_page_len ? " full_pages" : "", c->long_seq ? " LONG" : "", c->num_threads, c->steps);
}

/* Each axis cycles through a fresh random permutation of its values, so any
 * run of max(axis size) consecutive configs covers every value of every axis,
 * while the combinations differ from run to run. */
static void sample_configs(config *cfgs, int n, tu_rng *rng) {
    int perm[AX_COUNT][16], a, i, k;
    for (i = 0; i < n; ++i) {
        config *c = &cfgs[i];
        memset(c, 0, sizeof *c);
        c->index = i;
        c->seed = tu_next(rng);
        for (a = 0; a < AX_COUNT; ++a) {
            const int m = k_axis_size[a];
            if (i % m == 0) {
                for (k = 0; k < m; ++k) perm[a][k] = k;
                for (k = m - 1; k > 0; --k) {
                    const int j = tu_range(rng, 0, k), t = perm[a][k];
                    perm[a][k] = perm[a][j];
                    perm[a][j] = t;
                }
            }
            c->axis[a] = perm[a][i % m];
        }
        c->q_dtype = k_pairs[c->axis[AX_PAIR]].q;
        c->kv_dtype = k_pairs[c->axis[AX_PAIR]].kv;
        c->page_size = k_pages[c->axis[AX_PAGE]];
        c->num_heads = k_heads[c->axis[AX_HEADS]];
        c->q_len = k_qlens[c->axis[AX_QLEN]];
        c->num_splits = k_splits[c->axis[AX_SPLITS]];
        c->explicit_indices = k_bool[c->axis[AX_EXPLICIT]];
        c->logit_cap = k_bool[c->axis[AX_CAP]] ? (float)(1.5 + 10 * tu_uniform(rng)) : 0.0f;
        c->use_lse = k_bool[c->axis[AX_LSE]];
        c->sm_scale = tu_chance(rng, 0.5) ? 0.0f : (float)(0.02 + 0.06 * tu_uniform(rng));
        c->plan_max_q_len = tu_chance(rng, 0.25) ? tu_range(rng, c->q_len, MLA_MAX_Q_LEN) : c->q_len;
        c->deterministic = tu_chance(rng, 0.25);
        c->caller_workspace = tu_chance(rng, 0.25);
        c->null_last_page_len = tu_chance(rng, 0.15);
        c->num_threads = tu_range(rng, 0, 2); /* 0 = all hardware threads */
        c->ragged_q = c->q_len > 1 && tu_chance(rng, 0.3);
        c->steps = tu_chance(rng, 0.25) ? 2 : 1;
        c->scale_stride = c->kv_dtype == MLA_DTYPE_MXFP4 && tu_chance(rng, 0.4) ? tu_range(rng, 19, 32) : 0;
        c->q_stddev = tu_chance(rng, 0.3) ? 3.0 : 1.0;
        /* The default max_batch_size (256) sizes the workspace for 256
         * sequences: fine unless the split count is forced high. */
        c->max_batch_size = (c->num_splits >= 7 || tu_chance(rng, 0.5)) ? 16 : 0;
    }
}

/* A few long sequences: forced 64 splits really happen, and the auto and
 * deterministic schedulers split too. Small heads keep them cheap. */
static void add_long_configs(config *cfgs, int first, int n, tu_rng *rng) {
    static const int splits_axis[] = {4, 0, 3, 2}; /* 64, auto, 7, 2 */
    int i;
    for (i = 0; i < n; ++i) {
        config *c = &cfgs[first + i];
        *c = cfgs[i % first]; /* borrow dtypes etc. from a sampled config */
        c->index = first + i;
        c->seed = tu_next(rng);
        c->long_seq = 1;
        c->num_heads = i % 2 ? 16 : 1;
        c->axis[AX_HEADS] = i % 2 ? 1 : 0;
        c->q_len = c->plan_max_q_len = i % 3 == 2 ? 2 : 1;
        c->ragged_q = 0;
        c->axis[AX_SPLITS] = splits_axis[i % 4];
        c->num_splits = k_splits[c->axis[AX_SPLITS]];
        c->deterministic = i == 1;
        c->null_last_page_len = 0;
        c->steps = 1;
        c->max_batch_size = 16;
    }
}

/* Head counts that are not powers of two (1..128 are all valid): head blocks
 * of unequal size. Other axes borrowed from sampled configs. */
static void add_odd_heads_configs(config *cfgs, int first, int n, tu_rng *rng) {
    static const int heads[] = {3, 20, 100, 127};
    int i;
    for (i = 0; i < n; ++i) {
        config *c = &cfgs[first + i];
        *c = cfgs[(i * 7 + 3) % first];
        c->index = first + i;
        c->seed = tu_next(rng);
        c->long_seq = 0;
        c->num_heads = heads[i % 4];
    }
}

/* ---- fixed tests --------------------------------------------------------------- */

static config *g_cfgs;
static int g_ncfg;

static void test_matrix_covers_every_axis(void **state) {
    int a, v, i;
    (void)state;
    for (a = 0; a < AX_COUNT; ++a)
        for (v = 0; v < k_axis_size[a]; ++v) {
            int seen = 0;
            for (i = 0; i < g_ncfg; ++i) seen |= g_cfgs[i].axis[a] == v;
            if (!seen) fail_msg("axis %d value %d is not covered by the %d configurations", a, v, g_ncfg);
        }
}

static void test_fp8_flavour_mismatch_refused(void **state) {
    static const pair bad[] = {{MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ}, {MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_FP8_E4M3}};
    int i;
    (void)state;
    for (i = 0; i < 2; ++i) {
        mla_plan_desc desc;
        mla_plan *plan = (mla_plan *)&desc; /* must be reset to NULL */
        mla_plan_desc_init(&desc);
        desc.num_heads = 16;
        desc.q_dtype = bad[i].q;
        desc.kv_dtype = bad[i].kv;
        desc.backend = MLA_BACKEND_CPU;
        assert_int_equal(mla_plan_create(&desc, &plan), MLA_ERROR_UNSUPPORTED_DTYPE);
        assert_null(plan);
        assert_true(strlen(mla_last_error_message()) > 0);
    }
}

static void test_empty_batch(void **state) {
    /* batch_size 0 and a batch whose sequences have no query tokens write nothing */
    mla_plan_desc desc;
    mla_plan *plan;
    mla_batch batch;
    mla_tensors t;
    tu_buf out, kv, q;
    const int32_t zero[3] = {0, 0, 0}, kvp[3] = {0, 1, 2}, last[2] = {5, 16};
    (void)state;
    mla_plan_desc_init(&desc);
    desc.num_heads = 16;
    desc.page_size = 16;
    desc.backend = MLA_BACKEND_CPU;
    assert_int_equal(mla_plan_create(&desc, &plan), MLA_SUCCESS);
    assert_int_equal(tu_buf_alloc(&out, 1024), 0);
    assert_int_equal(tu_buf_alloc(&kv, 2 * 16 * 1152), 0);
    assert_int_equal(tu_buf_alloc(&q, 1152), 0);
    tu_buf_poison(&out);
    mla_batch_init(&batch);
    batch.batch_size = 0;
    batch.qo_indptr = zero;
    batch.kv_indptr = zero;
    assert_int_equal(mla_plan_build_metadata(plan, &batch, NULL), MLA_SUCCESS);
    mla_tensors_init(&t);
    t.q = q.data;
    t.kv = kv.data;
    t.out = out.data;
    assert_int_equal(mla_plan_execute(plan, &t, NULL), MLA_SUCCESS);
    batch.batch_size = 2;
    batch.kv_indptr = kvp;
    batch.kv_last_page_len = last;
    assert_int_equal(mla_plan_build_metadata(plan, &batch, NULL), MLA_SUCCESS);
    assert_int_equal(mla_plan_execute(plan, &t, NULL), MLA_SUCCESS);
    assert_true(tu_buf_guards_ok(&out));
    assert_int_equal(tu_count_bf16_nan((const uint16_t *)out.data, 512), 512);
    tu_buf_free(&out);
    tu_buf_free(&kv);
    tu_buf_free(&q);
    mla_plan_destroy(plan);
}

/* Exact decoding through the public API. With one key the softmax weight is
 * exactly 1, so out = that key's V row rounded to bf16 and lse = its score:
 * every dequantized value below is exact in bf16 / float, so the comparison
 * is bitwise, which catches decoder slips (subnormals, nibble order, scale
 * placement) far below the attention tolerance. */
static void run_single_key(mla_dtype q_dtype, mla_dtype kv_dtype, float sm_scale, int batch_size, const void *q,
                           const void *kv, const uint8_t *scales, float q_scale, float kv_scale, uint16_t *out,
                           float *lse) {
    mla_plan_desc desc;
    mla_plan *plan;
    mla_batch batch;
    mla_tensors t;
    int32_t *qo = (int32_t *)malloc(sizeof(int32_t) * (size_t)(batch_size + 1));
    int i;
    assert_non_null(qo);
    for (i = 0; i <= batch_size; ++i) qo[i] = i; /* one token, one page of size 1 each */
    mla_plan_desc_init(&desc);
    desc.num_heads = 1;
    desc.q_dtype = q_dtype;
    desc.kv_dtype = kv_dtype;
    desc.sm_scale = sm_scale;
    desc.max_batch_size = batch_size;
    desc.backend = MLA_BACKEND_CPU;
    assert_int_equal(mla_plan_create(&desc, &plan), MLA_SUCCESS);
    mla_batch_init(&batch);
    batch.batch_size = batch_size;
    batch.qo_indptr = qo;
    batch.kv_indptr = qo;
    assert_int_equal(mla_plan_build_metadata(plan, &batch, NULL), MLA_SUCCESS);
    mla_tensors_init(&t);
    t.q = q;
    t.kv = kv;
    t.kv_block_scales = scales;
    t.out = out;
    t.lse = lse;
    t.q_scale = q_scale;
    t.kv_scale = kv_scale;
    assert_int_equal(mla_plan_execute(plan, &t, NULL), MLA_SUCCESS);
    mla_plan_destroy(plan);
    free(qo);
}

static void test_kv_decoding_exact(void **state) {
    static const mla_dtype kinds[] = {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_MXFP4};
    static const float fp8_scales[] = {1.0f, 0.5f, 4.0f};
    tu_rng rng;
    tu_buf q, kv, sc, out;
    double v[DQK];
    int k, si, d;
    (void)state;
    tu_rng_init(&rng, tu_seed());
    assert_int_equal(tu_buf_alloc(&q, DQK * 2), 0);
    assert_int_equal(tu_buf_alloc(&kv, DQK * 2), 0);
    assert_int_equal(tu_buf_alloc(&sc, 32), 0);
    assert_int_equal(tu_buf_alloc(&out, DV * 2), 0);
    tu_fill_random(&rng, MLA_DTYPE_BF16, q.data, DQK, 0.1);
    for (k = 0; k < 4; ++k)
        for (si = 0; si < 3; ++si) {
            const mla_dtype kd = kinds[k];
            const float scale = kd == MLA_DTYPE_FP8_E4M3 || kd == MLA_DTYPE_FP8_E4M3_FNUZ ? fp8_scales[si] : 0.0f;
            if (si > 0 && scale == 0.0f) continue;
            for (d = 0; d < DQK; ++d) {
                if (kd == MLA_DTYPE_BF16) {
                    uint16_t h;
                    do h = (uint16_t)tu_next(&rng); while ((h & 0x7f80u) == 0x7f80u); /* no inf / NaN */
                    memcpy(kv.data + 2 * d, &h, 2);
                } else if (kd == MLA_DTYPE_MXFP4) {
                    if (d % 2 == 0) kv.data[d / 2] = (uint8_t)((d / 2) % 16 | ((((d / 2) * 7 + 3) % 16) << 4));
                } else {
                    const uint8_t code = (uint8_t)(d % 256);
                    kv.data[d] = tu_fp8_is_nan(kd, code) ? 0 : code; /* every other code, twice */
                }
            }
            for (d = 0; d < MLA_MXFP4_SCALES_PER_ROW; ++d) sc.data[d] = (uint8_t)(20 + 12 * d); /* 2^-107 .. 2^97 */
            tu_buf_poison(&out);
            run_single_key(MLA_DTYPE_BF16, kd, 0.0f, 1, q.data, kv.data, kd == MLA_DTYPE_MXFP4 ? sc.data : NULL, 0.0f,
                           scale, (uint16_t *)out.data, NULL);
            ref_decode_kv_row(kd, kv.data, sc.data, scale, v);
            for (d = 0; d < DV; ++d) {
                const uint16_t want = tu_float_to_bf16((float)v[d]);
                uint16_t got;
                memcpy(&got, out.data + 2 * d, 2);
                if (got != want && !(v[d] == 0.0 && (got & 0x7fffu) == 0))
                    fail_msg("kv %s scale %g: element %d (byte 0x%02x) decoded to %g, want %g", tu_dtype_name(kd),
                             (double)scale, d, kd == MLA_DTYPE_BF16 ? 0 : kv.data[kd == MLA_DTYPE_MXFP4 ? d / 2 : d],
                             (double)tu_bf16_to_float(got), v[d]);
            }
        }
    tu_buf_free(&q);
    tu_buf_free(&kv);
    tu_buf_free(&sc);
    tu_buf_free(&out);
}

static void test_q_decoding_exact(void **state) {
    /* Sequence b: q = code(b) at element b, 0 elsewhere; its one key is the
     * unit vector e_b; sm_scale 1. Then lse_b = dequant(code(b)) exactly. */
    static const mla_dtype kinds[] = {MLA_DTYPE_FP8_E4M3, MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_BF16};
    static const float q_scales[] = {1.0f, 0.25f};
    const int n = DQK;
    tu_buf q, kv, out, lse;
    tu_rng rng;
    double v[DQK];
    int k, si, b;
    (void)state;
    tu_rng_init(&rng, tu_seed());
    assert_int_equal(tu_buf_alloc(&q, (size_t)n * DQK * 2), 0);
    assert_int_equal(tu_buf_alloc(&kv, (size_t)n * DQK * 2), 0);
    assert_int_equal(tu_buf_alloc(&out, (size_t)n * DV * 2), 0);
    assert_int_equal(tu_buf_alloc(&lse, (size_t)n * 4), 0);
    for (b = 0; b < n; ++b) { /* K_b = e_b in bf16 */
        const uint16_t one = 0x3f80;
        memcpy(kv.data + ((size_t)b * DQK + (size_t)b) * 2, &one, 2);
    }
    for (k = 0; k < 3; ++k)
        for (si = 0; si < 2; ++si) {
            const mla_dtype qd = kinds[k];
            const size_t esz = qd == MLA_DTYPE_BF16 ? 2 : 1;
            const float scale = qd == MLA_DTYPE_BF16 ? 0.0f : q_scales[si];
            if (qd == MLA_DTYPE_BF16 && si > 0) continue;
            memset(q.data, 0, q.size);
            for (b = 0; b < n; ++b) {
                uint8_t *row = q.data + (size_t)b * DQK * esz;
                if (qd == MLA_DTYPE_BF16) {
                    uint16_t h;
                    do h = (uint16_t)tu_next(&rng); while ((h & 0x7f80u) == 0x7f80u || (h & 0x7fffu) > 0x4800u);
                    memcpy(row + 2 * b, &h, 2);
                } else {
                    const uint8_t code = (uint8_t)((b * 5) % 256);
                    row[b] = tu_fp8_is_nan(qd, code) ? 0 : code;
                }
            }
            tu_buf_poison(&lse);
            run_single_key(qd, MLA_DTYPE_BF16, 1.0f, n, q.data, kv.data, NULL, scale, 0.0f, (uint16_t *)out.data,
                           (float *)lse.data);
            for (b = 0; b < n; ++b) {
                float got;
                ref_decode_q_row(qd, q.data + (size_t)b * DQK * esz, scale, v);
                memcpy(&got, lse.data + 4 * (size_t)b, 4);
                if ((double)got != v[b])
                    fail_msg("q %s scale %g: element %d (code 0x%02x) gave score %.9g, want %.9g", tu_dtype_name(qd),
                             (double)scale, b, qd == MLA_DTYPE_BF16 ? 0 : q.data[(size_t)b * DQK + (size_t)b],
                             (double)got, v[b]);
            }
        }
    tu_buf_free(&q);
    tu_buf_free(&kv);
    tu_buf_free(&out);
    tu_buf_free(&lse);
}

static int summary_teardown(void **state) {
    (void)state;
    printf("[ summary  ] %d configurations, %llu rows checked; worst out error %.3f of tolerance; "
           "worst lse error %.3g (%.3f of tolerance)\n",
           g_ncfg, (unsigned long long)g_rows_checked, g_worst_ratio, g_worst_lse, g_worst_lse_ratio);
    return 0;
}

int main(void) {
    const char *env = getenv("MLA_TEST_CONFIGS");
    const int n_sampled = env && atoi(env) > 0 ? atoi(env) : 56;
    const int n_long = 4, n_odd = 4;
    struct CMUnitTest *tests;
    tu_rng rng;
    int i, failed;
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_matrix_covers_every_axis),
        cmocka_unit_test(test_fp8_flavour_mismatch_refused),
        cmocka_unit_test(test_empty_batch),
        cmocka_unit_test(test_kv_decoding_exact),
        cmocka_unit_test(test_q_decoding_exact),
    };

    tu_rng_init(&rng, tu_seed());
    g_ncfg = (n_sampled < 10 ? 10 : n_sampled) + n_long + n_odd;
    g_cfgs = (config *)calloc((size_t)g_ncfg, sizeof *g_cfgs);
    tests = (struct CMUnitTest *)calloc((size_t)g_ncfg, sizeof *tests);
    if (!g_cfgs || !tests) return 1;
    sample_configs(g_cfgs, g_ncfg - n_long - n_odd, &rng);
    add_long_configs(g_cfgs, g_ncfg - n_long - n_odd, n_long, &rng);
    add_odd_heads_configs(g_cfgs, g_ncfg - n_odd, n_odd, &rng);
    for (i = 0; i < g_ncfg; ++i) {
        describe(&g_cfgs[i]);
        tests[i].name = g_cfgs[i].name;
        tests[i].test_func = run_config;
        tests[i].initial_state = &g_cfgs[i];
    }
    failed = cmocka_run_group_tests_name("cpu_fixed", fixed, NULL, NULL);
    failed += _cmocka_run_group_tests("cpu_matrix", tests, (size_t)g_ncfg, NULL, summary_teardown);
    free(tests);
    free(g_cfgs);
    return failed ? 1 : 0;
}
