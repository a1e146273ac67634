/*
 * Numerical edges of the CPU backend, checked against the float64 reference
 * (tests/reference.c) or against exact values:
 *
 *   large logits     scores of magnitude ~1e4 (close together, spread out,
 *                    negative; with and without splits, with a logit cap):
 *                    no inf / NaN, out and lse within the suite's tolerance
 *   fp8 saturation   e4m3 +-448 and fnuz +-240 codes in Q and KV: exact
 *                    single-key decode, and attention within tolerance
 *   mxfp4 extremes   E8M0 0 (2^-127, subnormal results) and 254 (2^127, near
 *                    FLT_MAX) blocks; the documented overflow of E8M0 254
 *                    with |E2M1| >= 2 (2^128 is inf in float32)
 *   NaN scale        E8M0 255 decodes to NaN: every row whose visible keys
 *                    include it is NaN (out and lse), whatever the split
 *                    count; rows that do not see it, and other sequences,
 *                    are unaffected
 *   long sequence    one sequence of 131072 tokens (bf16 KV, 1 head), auto /
 *                    1 / 64 splits and deterministic
 *   64-bit offsets   a page whose byte offset is above 4 GiB (bf16, page 256,
 *                    a 5 GiB MAP_NORESERVE mapping) and one whose row index
 *                    is above 2^31 (mxfp4, ~620 GiB virtual); only the
 *                    touched pages become resident; skipped with a message
 *                    when the mapping is refused
 *   batch 1024       max_batch_size 1024, short ragged sequences
 *
 * MLA_TEST_SEED reproduces a run.
 */
#define _DEFAULT_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "reference.h"
#include "testutil.h"

#define DQK MLA_HEAD_DIM_QK
#define DV MLA_HEAD_DIM_V

static const tu_tol k_tol = {0x1p-7, 0x1p-9, 1e-4, 1e-4, 0x1p-16};

/* ---- plumbing ------------------------------------------------------------------ */

typedef struct shape {
    int heads, page_size, max_q_len, max_batch, num_splits;
    uint32_t flags;
    mla_dtype qd, kvd;
    float logit_cap;
} shape;

/* The data of one problem (pointers are borrowed). */
typedef struct data {
    const tu_batch *b;
    const uint8_t *kv;
    const uint8_t *scales; /* mxfp4 */
    int stride;            /* mxfp4 scale stride, 0 = 18 */
    int64_t num_pages;
    const void *q;
    float q_scale, kv_scale;
} data;

static void lib_run(const shape *s, const data *d, uint16_t *out, float *lse) {
    mla_plan_desc desc;
    mla_plan *plan = NULL;
    mla_batch batch;
    mla_tensors t;
    mla_status st;
    mla_plan_desc_init(&desc);
    desc.num_heads = s->heads;
    desc.q_dtype = s->qd;
    desc.kv_dtype = s->kvd;
    desc.page_size = s->page_size;
    desc.max_q_len = s->max_q_len;
    desc.max_batch_size = s->max_batch;
    desc.num_splits = s->num_splits;
    desc.flags = s->flags;
    desc.logit_cap = s->logit_cap;
    desc.backend = MLA_BACKEND_CPU;
    desc.num_threads = 2;
    st = mla_plan_create(&desc, &plan);
    if (st != MLA_SUCCESS) fail_msg("mla_plan_create: %s: %s", mla_status_string(st), mla_last_error_message());
    tu_batch_to_mla(d->b, 0, &batch);
    st = mla_plan_build_metadata(plan, &batch, NULL);
    if (st != MLA_SUCCESS) fail_msg("build_metadata: %s: %s", mla_status_string(st), mla_last_error_message());
    mla_tensors_init(&t);
    t.q = d->q;
    t.kv = d->kv;
    t.kv_block_scales = d->scales;
    t.kv_scale_stride = d->stride;
    t.kv_indices = d->b->kv_indices;
    t.num_pages = d->num_pages;
    t.out = out;
    t.lse = lse;
    t.q_scale = d->q_scale;
    t.kv_scale = d->kv_scale;
    st = mla_plan_execute(plan, &t, NULL);
    if (st != MLA_SUCCESS) fail_msg("execute: %s: %s", mla_status_string(st), mla_last_error_message());
    mla_plan_destroy(plan);
}

typedef struct ref_out {
    double *out, *lse, *vmax, *smag;
    size_t rows;
} ref_out;

static void ref_alloc(ref_out *r, size_t rows) {
    r->rows = rows;
    r->out = (double *)calloc((rows + 1) * DV, sizeof(double));
    r->lse = (double *)calloc(rows + 1, sizeof(double));
    r->vmax = (double *)calloc(rows + 1, sizeof(double));
    r->smag = (double *)calloc(rows + 1, sizeof(double));
    assert_true(r->out && r->lse && r->vmax && r->smag);
}

static void ref_free(ref_out *r) {
    free(r->out);
    free(r->lse);
    free(r->vmax);
    free(r->smag);
}

static void ref_problem_of(const shape *s, const data *d, ref_problem *p) {
    memset(p, 0, sizeof *p);
    p->num_heads = s->heads;
    p->q_dtype = s->qd;
    p->kv_dtype = s->kvd;
    p->page_size = s->page_size;
    p->logit_cap = s->logit_cap;
    p->batch_size = d->b->batch_size;
    p->qo_indptr = d->b->qo_indptr;
    p->kv_indptr = d->b->kv_indptr;
    p->kv_last_page_len = d->b->kv_last_page_len;
    p->kv_indices = d->b->kv_indices;
    p->q = d->q;
    p->kv = d->kv;
    p->kv_block_scales = d->scales;
    p->kv_scale_stride = d->stride;
    p->q_scale = d->q_scale;
    p->kv_scale = d->kv_scale;
}

/* Library vs reference over all rows; returns the worst error / tolerance. */
static double check_all(const char *what, const shape *s, const data *d) {
    const size_t rows = (size_t)d->b->total_q * (size_t)s->heads;
    uint16_t *out = (uint16_t *)malloc(rows * DV * 2 + 2);
    float *lse = (float *)malloc(rows * 4 + 4);
    ref_problem p;
    ref_out r;
    tu_cmp cmp;
    assert_true(out && lse);
    memset(out, 0xff, rows * DV * 2);
    memset(lse, 0xff, rows * 4);
    lib_run(s, d, out, lse);
    ref_alloc(&r, rows);
    ref_problem_of(s, d, &p);
    assert_int_equal(ref_attention(&p, r.out, r.lse, r.vmax, r.smag), 0);
    tu_cmp_init(&cmp);
    if (tu_count_bf16_nan(out, rows * DV) || tu_count_f32_nan(lse, rows)) {
        tu_print_seed();
        fail_msg("%s: NaN in the output", what);
    }
    {
        size_t i;
        for (i = 0; i < rows * DV; ++i)
            if (isinf(tu_bf16_to_float(out[i]))) fail_msg("%s: inf in out[%zu]", what, i);
        for (i = 0; i < rows; ++i)
            if (isinf(lse[i]) && !isinf(r.lse[i])) fail_msg("%s: lse[%zu] = %g", what, i, (double)lse[i]);
    }
    if (tu_compare(what, out, lse, r.out, r.lse, r.vmax, r.smag, rows, &k_tol, &cmp, 8)) {
        tu_print_seed();
        fail_msg("%s: %zu out / %zu lse values out of tolerance", what, cmp.bad_out, cmp.bad_lse);
    }
    printf("[ info     ] %s: %zu rows within tolerance (worst %.3f of the out tolerance, %.3f of lse's)\n", what,
           rows, cmp.worst_ratio, cmp.worst_lse_ratio);
    ref_free(&r);
    free(out);
    free(lse);
    return cmp.worst_ratio;
}

static data data_of(const tu_batch *b, const tu_kv *kv, const tu_buf *q, float q_scale) {
    data d;
    memset(&d, 0, sizeof d);
    d.b = b;
    d.kv = kv->data.data;
    d.scales = kv->dtype == MLA_DTYPE_MXFP4 ? kv->scales.data : NULL;
    d.stride = kv->dtype == MLA_DTYPE_MXFP4 ? kv->scale_stride : 0;
    d.num_pages = b->num_pages;
    d.q = q->data;
    d.q_scale = q_scale;
    d.kv_scale = kv->kv_scale;
    return d;
}

static size_t token_row(const tu_batch *b, int seq, int tok) {
    const int page = tu_batch_page(b, b->kv_indptr[seq] + tok / b->page_size);
    return (size_t)page * (size_t)b->page_size + (size_t)(tok % b->page_size);
}

static uint8_t *kv_row(tu_kv *kv, const tu_batch *b, int seq, int tok) {
    return kv->data.data + token_row(b, seq, tok) * kv->row_bytes;
}

static uint8_t *kv_scales(tu_kv *kv, const tu_batch *b, int seq, int tok) {
    return kv->scales.data + token_row(b, seq, tok) * (size_t)kv->scale_stride;
}

static uint8_t *q_row(tu_buf *q, const tu_batch *b, const shape *s, int seq, int tok, int head) {
    const size_t r = (size_t)(b->qo_indptr[seq] + tok) * (size_t)s->heads + (size_t)head;
    return q->data + r * ref_q_row_bytes(s->qd);
}

static void set_bf16(uint8_t *row, int d, float v) {
    const uint16_t h = tu_float_to_bf16(v);
    memcpy(row + 2 * d, &h, 2);
}

/* ---- large logits --------------------------------------------------------------- */

static void test_large_logits(void **state) {
    /* seq 0: s ~ +1e4, close together (differences of a few units);
     * seq 1: s spread over +-1e4 (the softmax is an argmax);
     * seq 2: ordinary data; seq 3: s ~ -1e4, close together. */
    const int q_lens[4] = {1, 2, 1, 1}, kv_lens[4] = {300, 200, 150, 260};
    tu_rng rng;
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    shape s = {2, 16, 2, 4, 0, 0, MLA_DTYPE_BF16, MLA_DTYPE_BF16, 0.0f};
    int seq, j, d, i, h, variant;
    (void)state;
    tu_rng_init(&rng, tu_seed() ^ 0x1e4);
    assert_int_equal(tu_batch_make(&b, 4, q_lens, kv_lens, s.page_size, 1, 2, &rng), 0);
    assert_int_equal(tu_kv_make(&kv, MLA_DTYPE_BF16, &b, 0, &rng), 0);
    assert_int_equal(tu_q_make(&q, MLA_DTYPE_BF16, b.total_q, s.heads, 1.0, &rng), 0);
    for (seq = 0; seq < 4; ++seq) {
        if (seq == 2) continue;
        for (j = 0; j < kv_lens[seq]; ++j) {
            uint8_t *row = kv_row(&kv, &b, seq, j);
            for (d = DV; d < DQK; ++d) {
                /* the 64 rope dims carry the huge part; V stays N(0,1) */
                const float v = seq == 1 ? (float)(416.0 * tu_normal(&rng)) : 416.0f + 2.0f * tu_range(&rng, -3, 3);
                set_bf16(row, d, v);
            }
        }
        for (i = 0; i < q_lens[seq]; ++i)
            for (h = 0; h < s.heads; ++h) {
                uint8_t *qr = q_row(&q, &b, &s, seq, i, h);
                /* s = sm * 64 * c * 416: c = 9 gives 9984, c = 72 spreads +-1e4 */
                const float c = seq == 0 ? 9.0f : seq == 1 ? 72.0f : -9.0f;
                for (d = DV; d < DQK; ++d) set_bf16(qr, d, h == 0 ? c : c / 2);
            }
    }
    for (variant = 0; variant < 5; ++variant) {
        static const char *names[] = {"large logits, auto splits", "large logits, 1 split",
                                      "large logits, 4 splits", "large logits, deterministic",
                                      "large logits, logit cap 30"};
        data dd = data_of(&b, &kv, &q, 0.0f);
        shape sv = s;
        if (variant == 1) sv.num_splits = 1;
        if (variant == 2) sv.num_splits = 4;
        if (variant == 3) sv.flags = MLA_FLAG_DETERMINISTIC;
        if (variant == 4) sv.logit_cap = 30.0f;
        check_all(names[variant], &sv, &dd);
    }
    /* and the lse really is ~ +-1e4 (the scores were not rescaled away) */
    {
        const size_t rows = (size_t)b.total_q * (size_t)s.heads;
        uint16_t *out = (uint16_t *)malloc(rows * DV * 2);
        float *lse = (float *)malloc(rows * 4);
        data dd = data_of(&b, &kv, &q, 0.0f);
        assert_true(out && lse);
        lib_run(&s, &dd, out, lse);
        assert_true(lse[0] > 9000.0f && lse[0] < 11000.0f);                     /* seq 0, head 0 */
        assert_true(lse[(size_t)b.qo_indptr[3] * 2] < -9000.0f);               /* seq 3, head 0 */
        free(out);
        free(lse);
    }
    tu_batch_free(&b);
    tu_kv_free(&kv);
    tu_buf_free(&q);
}

/* ---- fp8 saturation ---------------------------------------------------------------- */

static void fp8_saturation(mla_dtype fl, uint8_t pos_max, uint8_t neg_max, double max_value) {
    const float scale = fl == MLA_DTYPE_FP8_E4M3 ? 0x1p-6f : 0x1p-5f;
    char name[96];
    tu_rng rng;
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    shape s = {4, 16, 1, 4, 0, 0, fl, fl, 0.0f};
    const int q_lens[3] = {1, 1, 1}, kv_lens[3] = {1, 200, 90};
    int seq, j, d, h;
    tu_rng_init(&rng, tu_seed() ^ pos_max);
    assert_int_equal(tu_batch_make(&b, 3, q_lens, kv_lens, s.page_size, 1, 1, &rng), 0);
    assert_int_equal(tu_kv_make(&kv, fl, &b, 0, &rng), 0);
    assert_int_equal(tu_q_make(&q, fl, b.total_q, s.heads, 1.0, &rng), 0);
    kv.kv_scale = scale;
    /* half of every KV / Q code at the saturation value, random sign */
    for (seq = 0; seq < 3; ++seq) {
        for (j = 0; j < kv_lens[seq]; ++j) {
            uint8_t *row = kv_row(&kv, &b, seq, j);
            for (d = 0; d < DQK; ++d)
                if (seq == 0 || tu_chance(&rng, 0.5)) row[d] = tu_chance(&rng, 0.5) ? pos_max : neg_max;
        }
        for (h = 0; h < s.heads; ++h) {
            uint8_t *qr = q_row(&q, &b, &s, seq, 0, h);
            for (d = 0; d < DQK; ++d)
                if (tu_chance(&rng, 0.5)) qr[d] = tu_chance(&rng, 0.5) ? pos_max : neg_max;
        }
    }
    assert_true(ref_fp8_e4m3(0x7e) == 448.0 && ref_fp8_e4m3(0xfe) == -448.0);
    assert_true(ref_fp8_e4m3_fnuz(0x7f) == 240.0 && ref_fp8_e4m3_fnuz(0xff) == -240.0);
    {
        data dd = data_of(&b, &kv, &q, scale);
        const size_t rows = (size_t)b.total_q * (size_t)s.heads;
        uint16_t *out = (uint16_t *)malloc(rows * DV * 2);
        float *lse = (float *)malloc(rows * 4);
        const uint8_t *row0 = kv_row(&kv, &b, 0, 0);
        assert_true(out && lse);
        lib_run(&s, &dd, out, lse);
        /* sequence 0 has one key: out is exactly its V row, +-max * scale */
        for (h = 0; h < s.heads; ++h)
            for (d = 0; d < DV; ++d) {
                const double want = (row0[d] == pos_max ? max_value : -max_value) * scale;
                const double got = tu_bf16_to_float(out[(size_t)h * DV + d]);
                if (got != want) fail_msg("%s: single key: out[%d][%d] = %g, want %g", tu_dtype_name(fl), h, d, got, want);
            }
        free(out);
        free(lse);
        snprintf(name, sizeof name, "%s saturated codes (+-%g)", tu_dtype_name(fl), max_value);
        check_all(name, &s, &dd);
    }
    tu_batch_free(&b);
    tu_kv_free(&kv);
    tu_buf_free(&q);
}

static void test_fp8_saturation(void **state) {
    (void)state;
    fp8_saturation(MLA_DTYPE_FP8_E4M3, 0x7e, 0xfe, 448.0);
    fp8_saturation(MLA_DTYPE_FP8_E4M3_FNUZ, 0x7f, 0xff, 240.0);
}

/* ---- mxfp4 extremes ------------------------------------------------------------------ */

/* A batch of mxfp4 KV with bf16 Q, 2 heads, q_len up to 2. */
typedef struct mx_case {
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    shape s;
} mx_case;

static void mx_make(mx_case *c, int n, const int *q_lens, const int *kv_lens, uint64_t salt) {
    tu_rng rng;
    tu_rng_init(&rng, tu_seed() ^ salt);
    memset(c, 0, sizeof *c);
    c->s.heads = 2;
    c->s.page_size = 16;
    c->s.max_q_len = 2;
    c->s.max_batch = 8;
    c->s.qd = MLA_DTYPE_BF16;
    c->s.kvd = MLA_DTYPE_MXFP4;
    assert_int_equal(tu_batch_make(&c->b, n, q_lens, kv_lens, 16, 1, 1, &rng), 0);
    assert_int_equal(tu_kv_make(&c->kv, MLA_DTYPE_MXFP4, &c->b, 20, &rng), 0);
    assert_int_equal(tu_q_make(&c->q, MLA_DTYPE_BF16, c->b.total_q, 2, 1.0, &rng), 0);
}

static void mx_free(mx_case *c) {
    tu_batch_free(&c->b);
    tu_kv_free(&c->kv);
    tu_buf_free(&c->q);
}

static void test_mxfp4_e8m0_zero(void **state) {
    /* every block of sequence 1 scaled by 2^-127: V values 2^-128 .. 1.5*2^-125
     * (float32 subnormals and the smallest normals); bf16 keeps them */
    const int q_lens[3] = {1, 2, 1}, kv_lens[3] = {40, 120, 7};
    mx_case c;
    int j, k;
    (void)state;
    mx_make(&c, 3, q_lens, kv_lens, 0xe8);
    for (j = 0; j < kv_lens[1]; ++j)
        for (k = 0; k < MLA_MXFP4_SCALES_PER_ROW; ++k) kv_scales(&c.kv, &c.b, 1, j)[k] = 0;
    {
        data dd = data_of(&c.b, &c.kv, &c.q, 0.0f);
        const size_t rows = (size_t)c.b.total_q * 2;
        uint16_t *out = (uint16_t *)malloc(rows * DV * 2);
        float *lse = (float *)malloc(rows * 4);
        size_t nonzero = 0, i;
        assert_true(out && lse);
        check_all("mxfp4 E8M0 0 (2^-127) blocks", &c.s, &dd);
        lib_run(&c.s, &dd, out, lse);
        for (i = (size_t)c.b.qo_indptr[1] * 2 * DV; i < (size_t)c.b.qo_indptr[2] * 2 * DV; ++i) nonzero += out[i] != 0;
        /* not flushed to zero: most of the tiny outputs survive */
        assert_true(nonzero > (size_t)(q_lens[1] * 2 * DV) / 2);
        free(out);
        free(lse);
    }
    mx_free(&c);
}

static void test_mxfp4_e8m0_254(void **state) {
    /* Key 0 of sequence 1: block 0 (elements 0..31) scaled by 2^127 with
     * |E2M1| <= 1.5, so the values (up to 1.5 * 2^127 = 2.55e38) are finite
     * in float32. Q is 0 on those elements, so the score stays moderate; the
     * output carries p_0 * 2^127-sized values in elements 0..31. */
    const int q_lens[3] = {1, 2, 1}, kv_lens[3] = {30, 70, 5};
    static const uint8_t small_codes[6] = {1, 2, 3, 9, 10, 11}; /* +-0.5, +-1, +-1.5 */
    mx_case c;
    tu_rng rng;
    int i, h, d;
    (void)state;
    mx_make(&c, 3, q_lens, kv_lens, 0xfe);
    tu_rng_init(&rng, tu_seed() ^ 0xfe00);
    {
        uint8_t *row = kv_row(&c.kv, &c.b, 1, 0);
        for (d = 0; d < 16; ++d) /* 2 elements per byte: elements 0..31 */
            row[d] = (uint8_t)(small_codes[tu_range(&rng, 0, 5)] | (small_codes[tu_range(&rng, 0, 5)] << 4));
        kv_scales(&c.kv, &c.b, 1, 0)[0] = 254;
    }
    for (i = 0; i < q_lens[1]; ++i)
        for (h = 0; h < 2; ++h) {
            uint8_t *qr = q_row(&c.q, &c.b, &c.s, 1, i, h);
            for (d = 0; d < 32; ++d) set_bf16(qr, d, 0.0f);
        }
    {
        data dd = data_of(&c.b, &c.kv, &c.q, 0.0f);
        const size_t rows = (size_t)c.b.total_q * 2;
        uint16_t *out = (uint16_t *)malloc(rows * DV * 2);
        float *lse = (float *)malloc(rows * 4);
        ref_problem p;
        ref_out r;
        size_t row;
        double worst = 0;
        assert_true(out && lse);
        lib_run(&c.s, &dd, out, lse);
        ref_alloc(&r, rows);
        ref_problem_of(&c.s, &dd, &p);
        assert_int_equal(ref_attention(&p, r.out, r.lse, r.vmax, r.smag), 0);
        for (row = 0; row < rows; ++row) {
            /* elements 0..31 and the rest have their own scales: compare each
             * group against the max |V| of its own elements */
            double vmax_hi = 0, vmax_lo = 0;
            const int seq = row < (size_t)c.b.qo_indptr[1] * 2 ? 0 : row < (size_t)c.b.qo_indptr[2] * 2 ? 1 : 2;
            int j;
            for (j = 0; j < kv_lens[seq]; ++j) {
                double v[DQK];
                ref_decode_kv_row(MLA_DTYPE_MXFP4, kv_row(&c.kv, &c.b, seq, j), kv_scales(&c.kv, &c.b, seq, j), 0.0f,
                                  v);
                for (d = 0; d < DV; ++d) {
                    if (d < 32) vmax_hi = fmax(vmax_hi, fabs(v[d]));
                    else vmax_lo = fmax(vmax_lo, fabs(v[d]));
                }
            }
            if (!isfinite(lse[row]) || fabs(lse[row] - r.lse[row]) > 1e-4 + 1e-4 * fabs(r.lse[row]) + 0x1p-16 * r.smag[row])
                fail_msg("row %zu: lse %g, want %g", row, (double)lse[row], r.lse[row]);
            for (d = 0; d < DV; ++d) {
                const double got = tu_bf16_to_float(out[row * DV + d]), want = r.out[row * DV + d];
                const double tol = 0x1p-9 * (d < 32 ? vmax_hi : vmax_lo) + 0x1p-7 * fabs(want);
                if (!isfinite(got) || fabs(got - want) > tol)
                    fail_msg("row %zu out[%d] = %g, want %g (tol %g)", row, d, got, want, tol);
                if (tol > 0) worst = fmax(worst, fabs(got - want) / tol);
            }
        }
        /* the big values really are in the output */
        assert_true(fabs(tu_bf16_to_float(out[(size_t)c.b.qo_indptr[1] * 2 * DV + 0])) > 1e30 ||
                    fabs(tu_bf16_to_float(out[(size_t)c.b.qo_indptr[1] * 2 * DV + 1])) > 1e30);
        printf("[ info     ] mxfp4 E8M0 254 block (|V| up to 2.55e38): finite, worst %.3f of the tolerance\n", worst);
        ref_free(&r);
        free(out);
        free(lse);
    }
    mx_free(&c);
}

/* Rows that see a non-finite key element: out all NaN and lse NaN; every
 * other row finite and right. `bad_keys[seq]` lists the poisoned tokens. */
static void check_nan_confined(const char *what, const shape *s, const data *d, const int *first_bad, uint16_t *out,
                               float *lse) {
    const tu_batch *b = d->b;
    const size_t rows = (size_t)b->total_q * (size_t)s->heads;
    ref_problem p;
    ref_out r;
    int seq, i, h, dd;
    size_t nan_rows = 0, clean_rows = 0;
    memset(out, 0xff, rows * DV * 2);
    memset(lse, 0xff, rows * 4);
    lib_run(s, d, out, lse);
    ref_alloc(&r, rows);
    for (seq = 0; seq < b->batch_size; ++seq) {
        const int n = b->q_lens[seq], L = b->kv_lens[seq];
        for (i = 0; i < n; ++i) {
            const int visible_end = L - n + i + 1; /* keys [0, visible_end) */
            const int poisoned = first_bad[seq] >= 0 && first_bad[seq] < visible_end;
            for (h = 0; h < s->heads; ++h) {
                const size_t row = (size_t)(b->qo_indptr[seq] + i) * (size_t)s->heads + (size_t)h;
                const uint16_t *o = out + row * DV;
                if (poisoned) {
                    for (dd = 0; dd < DV; ++dd)
                        if (!isnan(tu_bf16_to_float(o[dd])))
                            fail_msg("%s: seq %d token %d head %d sees the NaN key but out[%d] = %g", what, seq, i, h,
                                     dd, (double)tu_bf16_to_float(o[dd]));
                    if (!isnan(lse[row]))
                        fail_msg("%s: seq %d token %d head %d sees the NaN key but lse = %g (want NaN)", what, seq, i,
                                 h, (double)lse[row]);
                    nan_rows++;
                } else {
                    if (tu_count_bf16_nan(o, DV) || isnan(lse[row]))
                        fail_msg("%s: seq %d token %d head %d does not see the NaN key but got NaN", what, seq, i, h);
                    clean_rows++;
                }
            }
        }
    }
    /* the clean rows are right: compare the sequences without a NaN key */
    {
        tu_cmp cmp;
        ref_problem_of(s, d, &p);
        for (seq = 0; seq < b->batch_size; ++seq) {
            ref_problem one = p;
            int32_t qo[2], kvp[2];
            const size_t r0 = (size_t)b->qo_indptr[seq] * (size_t)s->heads;
            const size_t nr = (size_t)b->q_lens[seq] * (size_t)s->heads;
            if (first_bad[seq] >= 0 || nr == 0) continue;
            qo[0] = 0;
            qo[1] = b->q_lens[seq];
            kvp[0] = 0;
            kvp[1] = b->kv_indptr[seq + 1] - b->kv_indptr[seq];
            one.batch_size = 1;
            one.qo_indptr = qo;
            one.kv_indptr = kvp;
            one.kv_last_page_len = b->kv_last_page_len + seq;
            one.kv_indices = b->kv_indices ? b->kv_indices + b->kv_indptr[seq] : NULL;
            if (!b->kv_indices) fail_msg("use an explicit page table");
            one.q = (const uint8_t *)d->q + r0 * ref_q_row_bytes(s->qd);
            assert_int_equal(ref_attention(&one, r.out, r.lse, r.vmax, r.smag), 0);
            tu_cmp_init(&cmp);
            if (tu_compare(what, out + r0 * DV, lse + r0, r.out, r.lse, r.vmax, r.smag, nr, &k_tol, &cmp, 4))
                fail_msg("%s: sequence %d (no NaN key) out of tolerance", what, seq);
        }
    }
    printf("[ info     ] %s: %zu rows NaN (they see the non-finite key), %zu rows clean\n", what, nan_rows, clean_rows);
    assert_true(nan_rows > 0 && clean_rows > 0);
    ref_free(&r);
}

static void test_mxfp4_nan_scale(void **state) {
    /* seq 1: its last key has E8M0 255 in block 5 -> token 1 (which sees
     * it) is NaN, token 0 (which does not) is clean.
     * seq 3: NaN scales at tokens 10 and 200 -> with forced 4 splits of 64
     * tokens, splits 0 and 3 hold a NaN key and 1, 2 do not; then (last
     * check) also at 70 and 130, so that every split holds one.
     * seqs 0, 2, 4: clean. */
    const int q_lens[5] = {1, 2, 2, 2, 1}, kv_lens[5] = {100, 150, 64, 256, 1};
    int first_bad[5] = {-1, 149, -1, 10, -1};
    mx_case c;
    int variant;
    uint16_t *out;
    float *lse;
    (void)state;
    mx_make(&c, 5, q_lens, kv_lens, 0xff);
    kv_scales(&c.kv, &c.b, 1, 149)[5] = 255;
    kv_scales(&c.kv, &c.b, 3, 10)[0] = 255;
    kv_scales(&c.kv, &c.b, 3, 200)[17] = 255; /* a rope block: the score, not V */
    out = (uint16_t *)malloc((size_t)c.b.total_q * 2 * DV * 2);
    lse = (float *)malloc((size_t)c.b.total_q * 2 * 4);
    assert_true(out && lse);
    for (variant = 0; variant < 5; ++variant) {
        static const char *names[] = {"E8M0 255, auto splits", "E8M0 255, 1 split", "E8M0 255, 4 splits",
                                      "E8M0 255, 64 splits", "E8M0 255, deterministic"};
        static const int splits[] = {0, 1, 4, 64, 0};
        data dd = data_of(&c.b, &c.kv, &c.q, 0.0f);
        shape s = c.s;
        s.num_splits = splits[variant];
        if (variant == 4) s.flags = MLA_FLAG_DETERMINISTIC;
        check_nan_confined(names[variant], &s, &dd, first_bad, out, lse);
    }
    /* every split of sequence 3 poisoned (one NaN per 64-token split): once
     * this gave out = 0, lse = -inf, indistinguishable from an empty row */
    kv_scales(&c.kv, &c.b, 3, 70)[3] = 255;
    kv_scales(&c.kv, &c.b, 3, 130)[9] = 255;
    {
        data dd = data_of(&c.b, &c.kv, &c.q, 0.0f);
        shape s = c.s;
        s.num_splits = 4;
        check_nan_confined("E8M0 255 in every split", &s, &dd, first_bad, out, lse);
    }
    free(out);
    free(lse);
    mx_free(&c);
}

static void test_mxfp4_e8m0_254_overflow(void **state) {
    /* Documented limit: E8M0 254 with |E2M1| >= 2 is 2^128 or more, which is
     * +-inf in float32 (the reference, in float64, is finite). A non-finite
     * key element makes the row's scores non-finite, so the rows that see it
     * are NaN, exactly like a NaN scale; nothing else is affected. The score
     * is +inf or -inf by the signs of q on the two infinite elements: head 0
     * of the one query token that sees the key gets -inf (a score that, left
     * alone, weighs the key 0 and leaves the row mostly finite), head 1 +inf;
     * with and without a logit cap (which would turn either into +-cap). */
    const int q_lens[3] = {1, 2, 1}, kv_lens[3] = {20, 40, 9};
    int first_bad[3] = {-1, 39, -1};
    mx_case c;
    uint16_t *out;
    float *lse;
    uint8_t *qr;
    int h, cap;
    (void)state;
    mx_make(&c, 3, q_lens, kv_lens, 0x2128);
    kv_row(&c.kv, &c.b, 1, 39)[0] = 0x47;                /* elements 0 and 1: 6 and 2 */
    memset(kv_row(&c.kv, &c.b, 1, 39) + 1, 0, 15);          /* elements 2..31 of the block: 0 */
    kv_scales(&c.kv, &c.b, 1, 39)[0] = 254;
    for (h = 0; h < 2; ++h) {
        qr = q_row(&c.q, &c.b, &c.s, 1, 1, h);
        set_bf16(qr, 0, h == 0 ? -0.25f : 0.25f);
        set_bf16(qr, 1, h == 0 ? -0.5f : 0.5f);
    }
    out = (uint16_t *)malloc((size_t)c.b.total_q * 2 * DV * 2);
    lse = (float *)malloc((size_t)c.b.total_q * 2 * 4);
    assert_true(out && lse);
    for (cap = 0; cap < 2; ++cap) {
        data dd = data_of(&c.b, &c.kv, &c.q, 0.0f);
        c.s.logit_cap = cap ? 30.0f : 0.0f;
        check_nan_confined(cap ? "E8M0 254 x 6 = inf in float32, logit cap 30" : "E8M0 254 x 6 = inf in float32",
                           &c.s, &dd, first_bad, out, lse);
    }
    free(out);
    free(lse);
    mx_free(&c);
}

/* ---- one sequence of 131072 tokens ------------------------------------------------------ */

static void test_long_sequence(void **state) {
    const int L = 131072, q_len = 1, heads = 1, ps = 64;
    tu_rng rng;
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    double qv[DQK], k[DQK], *score, mx = -INFINITY, sum = 0, vmax = 0, kmax = 0, q2 = 0, lse_ref;
    double *ref = (double *)calloc(DV, sizeof(double));
    const double sm = (double)(1.0f / sqrtf((float)DQK));
    int j, d, variant;
    (void)state;
    tu_rng_init(&rng, tu_seed() ^ 131072);
    assert_int_equal(tu_batch_make(&b, 1, &q_len, &L, ps, 1, 3, &rng), 0);
    assert_int_equal(tu_kv_make(&kv, MLA_DTYPE_BF16, &b, 0, &rng), 0);
    assert_int_equal(tu_q_make(&q, MLA_DTYPE_BF16, 1, heads, 1.0, &rng), 0);
    /* Streaming float64 reference (ref_attention would hold L x 576 doubles). */
    score = (double *)malloc((size_t)L * sizeof(double));
    assert_true(score && ref);
    ref_decode_q_row(MLA_DTYPE_BF16, q.data, 0.0f, qv);
    for (d = 0; d < DQK; ++d) q2 += qv[d] * qv[d];
    for (j = 0; j < L; ++j) {
        double dot = 0, k2 = 0;
        ref_decode_kv_row(MLA_DTYPE_BF16, kv.data.data + token_row(&b, 0, j) * kv.row_bytes, NULL, 0.0f, k);
        for (d = 0; d < DQK; ++d) {
            dot += qv[d] * k[d];
            k2 += k[d] * k[d];
        }
        for (d = 0; d < DV; ++d) vmax = fmax(vmax, fabs(k[d]));
        kmax = fmax(kmax, sqrt(k2));
        score[j] = sm * dot;
        mx = fmax(mx, score[j]);
    }
    for (j = 0; j < L; ++j) {
        const double w = exp(score[j] - mx);
        ref_decode_kv_row(MLA_DTYPE_BF16, kv.data.data + token_row(&b, 0, j) * kv.row_bytes, NULL, 0.0f, k);
        sum += w;
        for (d = 0; d < DV; ++d) ref[d] += w * k[d];
    }
    for (d = 0; d < DV; ++d) ref[d] /= sum;
    lse_ref = mx + log(sum);
    for (variant = 0; variant < 4; ++variant) {
        static const char *names[] = {"auto splits", "1 split", "64 splits", "deterministic"};
        shape s = {heads, ps, 1, 1, 0, 0, MLA_DTYPE_BF16, MLA_DTYPE_BF16, 0.0f};
        data dd = data_of(&b, &kv, &q, 0.0f);
        uint16_t out[DV];
        float lse;
        double smag = sm * sqrt(q2) * kmax, worst = 0;
        tu_cmp cmp;
        char what[64];
        if (variant == 1) s.num_splits = 1;
        if (variant == 2) s.num_splits = 64;
        if (variant == 3) s.flags = MLA_FLAG_DETERMINISTIC;
        lib_run(&s, &dd, out, &lse);
        snprintf(what, sizeof what, "131072 tokens, %s", names[variant]);
        tu_cmp_init(&cmp);
        if (tu_compare(what, out, &lse, ref, &lse_ref, &vmax, &smag, 1, &k_tol, &cmp, 8))
            fail_msg("%s: out of tolerance", what);
        worst = cmp.worst_ratio;
        printf("[ info     ] %s: within tolerance (worst %.3f of out's, lse %.6f vs %.6f)\n", what, worst,
               (double)lse, lse_ref);
    }
    free(score);
    free(ref);
    tu_batch_free(&b);
    tu_kv_free(&kv);
    tu_buf_free(&q);
}

/* ---- 64-bit offsets ---------------------------------------------------------------------- */

/* One sequence whose pages are {3, high}: its second page lies at a byte
 * offset above 4 GiB (and, for the mxfp4 case, a row index above 2^31) in a
 * sparse MAP_NORESERVE mapping. Only the pages the test writes (and the
 * library reads) become resident. */
static int high_page_case(mla_dtype kvd, int64_t high_page, const char *what) {
    const int ps = 256, L = ps + 100, q_len = 1, heads = 2;
    const size_t row_bytes = ref_kv_row_bytes(kvd), stride = MLA_MXFP4_SCALES_PER_ROW;
    const size_t kv_bytes = (size_t)(high_page + 1) * ps * row_bytes;
    const size_t sc_bytes = kvd == MLA_DTYPE_MXFP4 ? (size_t)(high_page + 1) * ps * stride : 0;
    uint8_t *kvm, *scm = NULL;
    tu_rng rng;
    tu_batch b;
    tu_buf q;
    int j;
    kvm = (uint8_t *)mmap(NULL, kv_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (kvm == MAP_FAILED) {
        printf("[ skipped  ] %s: mmap of %.1f GiB with MAP_NORESERVE refused\n", what, kv_bytes / 1073741824.0);
        return 0;
    }
    if (sc_bytes) {
        scm = (uint8_t *)mmap(NULL, sc_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                              0);
        if (scm == MAP_FAILED) {
            munmap(kvm, kv_bytes);
            printf("[ skipped  ] %s: mmap of %.1f GiB of scales refused\n", what, sc_bytes / 1073741824.0);
            return 0;
        }
    }
    tu_rng_init(&rng, tu_seed() ^ (uint64_t)high_page);
    assert_int_equal(tu_batch_make(&b, 1, &q_len, &L, ps, 1, 0, &rng), 0);
    b.kv_indices[0] = 3;
    b.kv_indices[1] = (int32_t)high_page;
    b.num_pages = (int)(high_page + 1);
    for (j = 0; j < L; ++j) {
        const size_t row = (size_t)b.kv_indices[j / ps] * ps + (size_t)(j % ps);
        uint8_t *r = kvm + row * row_bytes;
        if (kvd == MLA_DTYPE_MXFP4) {
            size_t k;
            for (k = 0; k < row_bytes; ++k) r[k] = (uint8_t)tu_next(&rng);
            for (k = 0; k < stride; ++k) scm[row * stride + k] = (uint8_t)tu_range(&rng, 123, 127);
        } else {
            tu_fill_random(&rng, kvd, r, DQK, 1.0);
        }
    }
    assert_int_equal(tu_q_make(&q, MLA_DTYPE_BF16, 1, heads, 1.0, &rng), 0);
    {
        shape s = {heads, ps, 1, 1, 0, 0, MLA_DTYPE_BF16, kvd, 0.0f};
        data d;
        char name[160];
        memset(&d, 0, sizeof d);
        d.b = &b;
        d.kv = kvm;
        d.scales = scm;
        d.num_pages = high_page + 1;
        d.q = q.data;
        snprintf(name, sizeof name, "%s: page %lld at byte %.1f GiB, row %lld", what, (long long)high_page,
                 (double)high_page * ps * row_bytes / 1073741824.0, (long long)high_page * ps);
        check_all(name, &s, &d);
    }
    tu_batch_free(&b);
    tu_buf_free(&q);
    munmap(kvm, kv_bytes);
    if (scm) munmap(scm, sc_bytes);
    return 1;
}

static void test_64bit_offsets(void **state) {
    const int64_t page_5gib = (5ll << 30) / (256 * 1152) + 1;        /* byte offset > 4 GiB, bf16 */
    const int64_t page_row31 = (1ll << 31) / 256 + 1;               /* row index > 2^31 */
    int ran = 0;
    (void)state;
    ran += high_page_case(MLA_DTYPE_BF16, page_5gib, "bf16 KV above 4 GiB");
    ran += high_page_case(MLA_DTYPE_MXFP4, page_row31, "mxfp4 KV row above 2^31");
    if (!ran) skip();
}

/* ---- batch 1024 ----------------------------------------------------------------------------- */

static void test_batch_1024(void **state) {
    enum { N = 1024 };
    int q_lens[N], kv_lens[N], i;
    tu_rng rng;
    tu_batch b;
    tu_kv kv;
    tu_buf q;
    shape s = {4, 16, 2, N, 0, 0, MLA_DTYPE_BF16, MLA_DTYPE_FP8_E4M3, 0.0f};
    (void)state;
    tu_rng_init(&rng, tu_seed() ^ 1024);
    for (i = 0; i < N; ++i) {
        q_lens[i] = tu_range(&rng, 0, 2);
        kv_lens[i] = tu_chance(&rng, 0.1) ? 0 : tu_range(&rng, 1, 40);
    }
    assert_int_equal(tu_batch_make(&b, N, q_lens, kv_lens, s.page_size, 1, 5, &rng), 0);
    assert_int_equal(tu_kv_make(&kv, s.kvd, &b, 0, &rng), 0);
    assert_int_equal(tu_q_make(&q, s.qd, b.total_q, s.heads, 1.0, &rng), 0);
    {
        data d = data_of(&b, &kv, &q, 0.0f);
        check_all("batch 1024, short ragged sequences", &s, &d);
        s.flags = MLA_FLAG_DETERMINISTIC;
        check_all("batch 1024, deterministic", &s, &d);
    }
    tu_batch_free(&b);
    tu_kv_free(&kv);
    tu_buf_free(&q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_logits),
        cmocka_unit_test(test_fp8_saturation),
        cmocka_unit_test(test_mxfp4_e8m0_zero),
        cmocka_unit_test(test_mxfp4_e8m0_254),
        cmocka_unit_test(test_mxfp4_nan_scale),
        cmocka_unit_test(test_mxfp4_e8m0_254_overflow),
        cmocka_unit_test(test_long_sequence),
        cmocka_unit_test(test_64bit_offsets),
        cmocka_unit_test(test_batch_1024),
    };
    tu_seed();
    return cmocka_run_group_tests_name("numerics", tests, NULL, NULL);
}
