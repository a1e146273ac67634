/*
 * Concurrency: 8 threads, each with its own CPU plans (num_threads 1 or 2,
 * so up to 16 library threads are live), build metadata and execute
 * repeatedly over a rotating set of batches of different sizes, dtypes and
 * page tables. Every result must be bitwise equal to a run of the same inputs
 * on a plan with the same descriptor made before any thread started (the
 * header's promise: different plans on different threads run concurrently
 * and independently). Along the way each thread:
 *   - destroys and re-creates its plan halfway (pool start-up / shut-down
 *     while other plans compute),
 *   - makes a deliberately bad call and checks that the message it reads is
 *     its own (mla_last_error_message is per thread) and that its next
 *     successful call clears it,
 *   - uses a caller workspace (some threads) or the plan's own.
 * The expected results are also checked once against the float64 reference.
 *
 * Also built and run under ThreadSanitizer by tests/run_sanitizers.sh.
 * MLA_CONCURRENCY_ITERS changes the iterations per thread (default 20).
 */
#define _POSIX_C_SOURCE 200809L
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

#define DV MLA_HEAD_DIM_V

#define N_THREADS 8
#define N_PAIRS 4
#define N_BATCHES 5
#define MAX_SEQS 8

typedef struct pair_cfg {
    mla_dtype q, kv;
    int heads, page_size, q_len;
    uint32_t flags;
} pair_cfg;

static const pair_cfg k_pairs[N_PAIRS] = {
    {MLA_DTYPE_BF16, MLA_DTYPE_BF16, 16, 16, 1, 0},
    {MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, 8, 1, 2, MLA_FLAG_DETERMINISTIC},
    {MLA_DTYPE_FP8_E4M3, MLA_DTYPE_MXFP4, 16, 64, 1, 0},
    {MLA_DTYPE_FP8_E4M3_FNUZ, MLA_DTYPE_FP8_E4M3_FNUZ, 4, 32, 4, MLA_FLAG_DETERMINISTIC},
};

/* Inputs of one (pair, batch): shared read-only by every thread. */
typedef struct input {
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    float q_scale;
    size_t rows; /* total_q * heads */
} input;

static input g_in[N_PAIRS][N_BATCHES];
/* Expected bits per (pair, threads-1, batch). */
static uint8_t *g_want_out[N_PAIRS][2][N_BATCHES];
static float *g_want_lse[N_PAIRS][2][N_BATCHES];

static mla_plan *make_plan(const pair_cfg *c, int threads, int caller_ws) {
    mla_plan_desc d;
    mla_plan *p = NULL;
    mla_plan_desc_init(&d);
    d.num_heads = c->heads;
    d.q_dtype = c->q;
    d.kv_dtype = c->kv;
    d.page_size = c->page_size;
    d.max_q_len = c->q_len;
    d.max_batch_size = MAX_SEQS;
    d.flags = c->flags | (caller_ws ? MLA_FLAG_CALLER_WORKSPACE : 0u);
    d.backend = MLA_BACKEND_CPU;
    d.num_threads = threads;
    return mla_plan_create(&d, &p) == MLA_SUCCESS ? p : NULL;
}

/* Build + execute one input into out / lse; returns NULL or what failed. */
static const char *run_once(mla_plan *plan, const input *in, uint8_t *out, float *lse, void *ws, size_t ws_size) {
    mla_batch batch;
    mla_tensors t;
    tu_batch_to_mla(&in->b, 0, &batch);
    if (mla_plan_build_metadata(plan, &batch, NULL) != MLA_SUCCESS) return "build_metadata failed";
    if (*mla_last_error_message()) return "successful build_metadata left a message";
    mla_tensors_init(&t);
    t.q = in->q.data;
    t.kv = in->kv.data.data;
    t.kv_block_scales = in->kv.scales.data;
    t.kv_indices = in->b.kv_indices;
    t.out = out;
    t.lse = lse;
    t.q_scale = in->q_scale;
    t.kv_scale = in->kv.kv_scale;
    t.num_pages = in->b.num_pages;
    t.workspace = ws;
    t.workspace_size = ws_size;
    if (mla_plan_execute(plan, &t, NULL) != MLA_SUCCESS) return "execute failed";
    if (*mla_last_error_message()) return "successful execute left a message";
    return NULL;
}

static void make_inputs(void) {
    int p, k, i;
    for (p = 0; p < N_PAIRS; ++p) {
        const pair_cfg *c = &k_pairs[p];
        for (k = 0; k < N_BATCHES; ++k) {
            input *in = &g_in[p][k];
            tu_rng rng;
            int n, q_lens[MAX_SEQS], kv_lens[MAX_SEQS];
            tu_rng_init(&rng, tu_seed() ^ (uint64_t)(p * 131 + k * 7 + 1));
            n = 1 + (k * 3 + p) % MAX_SEQS; /* 1..8 sequences, different per batch */
            tu_random_kv_lens(&rng, n, 300, 0.15, 700, kv_lens);
            for (i = 0; i < n; ++i) q_lens[i] = tu_range(&rng, i == 0 ? 1 : 0, c->q_len);
            tu_fit_budget(n, q_lens, kv_lens, c->heads, 20000.0);
            memset(in, 0, sizeof *in);
            assert_int_equal(tu_batch_make(&in->b, n, q_lens, kv_lens, c->page_size, (k + p) % 2, 2, &rng), 0);
            assert_int_equal(tu_kv_make(&in->kv, c->kv, &in->b, 0, &rng), 0);
            assert_int_equal(tu_q_make(&in->q, c->q, in->b.total_q, c->heads, 1.0, &rng), 0);
            in->q_scale = c->q == MLA_DTYPE_BF16 ? 0.0f : tu_rand_fp8_scale(&rng);
            in->rows = (size_t)in->b.total_q * (size_t)c->heads;
        }
    }
}

static void free_inputs(void) {
    int p, k, t;
    for (p = 0; p < N_PAIRS; ++p)
        for (k = 0; k < N_BATCHES; ++k) {
            tu_batch_free(&g_in[p][k].b);
            tu_kv_free(&g_in[p][k].kv);
            tu_buf_free(&g_in[p][k].q);
            for (t = 0; t < 2; ++t) {
                free(g_want_out[p][t][k]);
                free(g_want_lse[p][t][k]);
                g_want_out[p][t][k] = NULL;
                g_want_lse[p][t][k] = NULL;
            }
        }
}

/* Single-threaded expected results, and a reference check of each. */
static void make_expected(void) {
    const tu_tol tol = {0x1p-7, 0x1p-9, 1e-4, 1e-4, 0x1p-16};
    int p, t, k;
    for (p = 0; p < N_PAIRS; ++p) {
        for (t = 0; t < 2; ++t) {
            mla_plan *plan = make_plan(&k_pairs[p], t + 1, 0);
            assert_non_null(plan);
            for (k = 0; k < N_BATCHES; ++k) {
                const input *in = &g_in[p][k];
                const char *err;
                g_want_out[p][t][k] = (uint8_t *)malloc(in->rows * DV * 2 + 1);
                g_want_lse[p][t][k] = (float *)malloc(in->rows * 4 + 4);
                assert_non_null(g_want_out[p][t][k]);
                assert_non_null(g_want_lse[p][t][k]);
                err = run_once(plan, in, g_want_out[p][t][k], g_want_lse[p][t][k], NULL, 0);
                if (err) fail_msg("pair %d threads %d batch %d: %s: %s", p, t + 1, k, err, mla_last_error_message());
                if (t == 0) { /* once per input: the bits are right */
                    const pair_cfg *c = &k_pairs[p];
                    double *ro = (double *)malloc((in->rows + 1) * DV * sizeof(double));
                    double *rl = (double *)malloc((in->rows + 1) * sizeof(double));
                    double *vm = (double *)malloc((in->rows + 1) * sizeof(double));
                    double *sg = (double *)malloc((in->rows + 1) * sizeof(double));
                    ref_problem rp;
                    tu_cmp cmp;
                    assert_true(ro && rl && vm && sg);
                    memset(&rp, 0, sizeof rp);
                    rp.num_heads = c->heads;
                    rp.q_dtype = c->q;
                    rp.kv_dtype = c->kv;
                    rp.page_size = c->page_size;
                    rp.batch_size = in->b.batch_size;
                    rp.qo_indptr = in->b.qo_indptr;
                    rp.kv_indptr = in->b.kv_indptr;
                    rp.kv_last_page_len = in->b.kv_last_page_len;
                    rp.kv_indices = in->b.kv_indices;
                    rp.q = in->q.data;
                    rp.kv = in->kv.data.data;
                    rp.kv_block_scales = in->kv.scales.data;
                    rp.q_scale = in->q_scale;
                    rp.kv_scale = in->kv.kv_scale;
                    assert_int_equal(ref_attention(&rp, ro, rl, vm, sg), 0);
                    tu_cmp_init(&cmp);
                    if (tu_compare("concurrency expected", (const uint16_t *)g_want_out[p][t][k], g_want_lse[p][t][k],
                                   ro, rl, vm, sg, in->rows, &tol, &cmp, 4)) {
                        tu_print_seed();
                        fail_msg("pair %d batch %d: the single-threaded result is wrong", p, k);
                    }
                    free(ro);
                    free(rl);
                    free(vm);
                    free(sg);
                }
            }
            mla_plan_destroy(plan);
        }
    }
}

typedef struct worker {
    int id, pair, threads, caller_ws, iterations;
    int runs, splits_seen;
    char error[256]; /* empty on success; no CMocka calls off the main thread */
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    const pair_cfg *c = &k_pairs[w->pair];
    size_t max_rows = 0, ws_size = 0;
    uint8_t *out;
    float *lse;
    void *ws = NULL;
    mla_plan *plan;
    int it, k;
    for (k = 0; k < N_BATCHES; ++k)
        if (g_in[w->pair][k].rows > max_rows) max_rows = g_in[w->pair][k].rows;
    out = (uint8_t *)malloc(max_rows * DV * 2 + 1);
    lse = (float *)malloc(max_rows * 4 + 4);
    plan = make_plan(c, w->threads, w->caller_ws);
    if (!out || !lse || !plan) {
        snprintf(w->error, sizeof w->error, "setup failed");
        goto done;
    }
    if (w->caller_ws) {
        if (mla_plan_workspace_size(plan, &ws_size) != MLA_SUCCESS ||
            posix_memalign(&ws, 64, ws_size) != 0) {
            snprintf(w->error, sizeof w->error, "workspace setup failed");
            goto done;
        }
    }
    for (it = 0; it < w->iterations && !w->error[0]; ++it) {
        const int b = (it * 3 + w->id) % N_BATCHES; /* every thread walks the batches in its own order */
        const input *in = &g_in[w->pair][b];
        const char *err;
        if (it == w->iterations / 2) { /* a fresh plan while the others keep running */
            mla_plan_destroy(plan);
            plan = make_plan(c, w->threads, w->caller_ws);
            if (!plan) {
                snprintf(w->error, sizeof w->error, "re-create failed");
                break;
            }
        }
        if (it % 5 == 2) { /* a refused call: the message is this thread's own */
            mla_batch bad;
            char want[64];
            mla_batch_init(&bad);
            bad.batch_size = -(w->id + 1);
            bad.qo_indptr = in->b.qo_indptr;
            bad.kv_indptr = in->b.kv_indptr;
            if (mla_plan_build_metadata(plan, &bad, NULL) != MLA_ERROR_INVALID_VALUE) {
                snprintf(w->error, sizeof w->error, "iteration %d: negative batch_size accepted", it);
                break;
            }
            snprintf(want, sizeof want, "batch_size = %d", bad.batch_size);
            if (!strstr(mla_last_error_message(), want)) {
                snprintf(w->error, sizeof w->error, "iteration %d: message \"%s\" is not this thread's (\"%s\")", it,
                         mla_last_error_message(), want);
                break;
            }
        }
        memset(out, 0xff, in->rows * DV * 2);
        memset(lse, 0xff, in->rows * 4);
        err = run_once(plan, in, out, lse, ws, ws_size);
        if (err) {
            snprintf(w->error, sizeof w->error, "iteration %d batch %d: %s (%s)", it, b, err, mla_last_error_message());
            break;
        }
        {
            mla_schedule_info info;
            mla_schedule_info_init(&info);
            if (mla_plan_schedule_info(plan, &info) == MLA_SUCCESS && info.max_splits > 1) w->splits_seen++;
        }
        if (memcmp(out, g_want_out[w->pair][w->threads - 1][b], in->rows * DV * 2) != 0 ||
            memcmp(lse, g_want_lse[w->pair][w->threads - 1][b], in->rows * 4) != 0) {
            snprintf(w->error, sizeof w->error, "iteration %d batch %d: output differs from the single-threaded run",
                     it, b);
            break;
        }
        w->runs++;
    }
done:
    mla_plan_destroy(plan);
    free(ws);
    free(out);
    free(lse);
    return NULL;
}

static void test_eight_threads(void **state) {
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    int i, iters = 20, total = 0, splits = 0;
    const char *env = getenv("MLA_CONCURRENCY_ITERS");
    (void)state;
    if (env && atoi(env) > 0) iters = atoi(env);
    make_inputs();
    make_expected();
    for (i = 0; i < N_THREADS; ++i) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        w[i].pair = (i / 2) % N_PAIRS;
        w[i].threads = 1 + (i & 1);
        w[i].caller_ws = (i % 3) == 0;
        w[i].iterations = iters;
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (i = 0; i < N_THREADS; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (i = 0; i < N_THREADS; ++i) {
        if (w[i].error[0]) {
            tu_print_seed();
            fail_msg("thread %d (pair %d, %d library threads): %s", i, w[i].pair, w[i].threads, w[i].error);
        }
        total += w[i].runs;
        splits += w[i].splits_seen;
    }
    printf("[ info     ] %d threads x %d iterations: %d executes bitwise equal to the single-threaded runs "
           "(%d of them with split sequences)\n",
           N_THREADS, iters, total, splits);
    assert_int_equal(total, N_THREADS * iters);
    assert_true(splits > 0); /* the combine step ran concurrently too */
    free_inputs();
}

/* One plan handed from thread to thread (used by one thread at a time, as
 * the header allows): the pool's threads must not care who calls. */
typedef struct relay {
    mla_plan *plan;
    const input *in;
    const uint8_t *want_out;
    const float *want_lse;
    char error[128];
} relay;

static void *relay_main(void *arg) {
    relay *r = (relay *)arg;
    uint8_t *out = (uint8_t *)malloc(r->in->rows * DV * 2 + 1);
    float *lse = (float *)malloc(r->in->rows * 4 + 4);
    const char *err = out && lse ? run_once(r->plan, r->in, out, lse, NULL, 0) : "malloc failed";
    if (err) snprintf(r->error, sizeof r->error, "%s", err);
    else if (memcmp(out, r->want_out, r->in->rows * DV * 2) || memcmp(lse, r->want_lse, r->in->rows * 4))
        snprintf(r->error, sizeof r->error, "output differs");
    free(out);
    free(lse);
    return NULL;
}

static void test_plan_handed_between_threads(void **state) {
    mla_plan *plan;
    relay r;
    int i;
    (void)state;
    make_inputs();
    make_expected();
    plan = make_plan(&k_pairs[0], 2, 0);
    assert_non_null(plan);
    for (i = 0; i < 6; ++i) {
        pthread_t th;
        const int k = i % N_BATCHES;
        memset(&r, 0, sizeof r);
        r.plan = plan;
        r.in = &g_in[0][k];
        r.want_out = g_want_out[0][1][k];
        r.want_lse = g_want_lse[0][1][k];
        assert_int_equal(pthread_create(&th, NULL, relay_main, &r), 0);
        assert_int_equal(pthread_join(th, NULL), 0);
        if (r.error[0]) fail_msg("hand-off %d: %s", i, r.error);
    }
    mla_plan_destroy(plan);
    free_inputs();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eight_threads),
        cmocka_unit_test(test_plan_handed_between_threads),
    };
    tu_seed();
    return cmocka_run_group_tests_name("concurrency", tests, NULL, NULL);
}
